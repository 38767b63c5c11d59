//! Row kernels: reductions over one dim, a row per block or per segment of a warp, the row
//! cached in registers when it fits.

use super::text::narrow_helpers;
use super::{Cuda, Scope, BLOCK, CACHE, SYNTAX};
use crate::ir::{DimId, Launch, NodeId, Op, Reduce};
use crate::parse::BinOp;
use crate::plan::rows::{
    block_copies_ahead, cached_params, direct_row_cost, f32_slots, narrow_slots, needed,
    next_row_to_l2, pass_stashes, prefetches, segments_ask_l2, wide_copies_ahead,
};
use crate::plan::{Pass, Path, Plan};
use crate::ty::Elem;

pub(super) mod long_rows;

impl Cuda<'_> {
    pub(super) fn rows_body(&mut self, domain: &[DimId], axis: DimId, plan: &Plan) {
        let rows = self.row_counts(domain, axis, plan);
        let cached = cached_params(self.k, self.plan);
        let block = matches!(
            self.path,
            Path::RowBlock | Path::RowBlockExact | Path::RowBlockWide | Path::RowChunks
        );
        if block {
            // A cached row a block (rows of `CACHE * BLOCK / 2` to `CACHE * BLOCK` elements,
            // twice as many 2-byte ones on the wide entry):
            // `width`, `lane` and `per_block` are constants, so the block reductions lose their
            // run-time segment tests, every thread is live, and the passes skip the bounds tests
            // that such a row always passes.
            self.line(format!("const int width = {BLOCK};"));
            self.line("const int per_block = 1;");
            self.line("const int lane = threadIdx.x;");
        } else {
            // Threads per row: a power of two up to a warp for short rows (several rows per
            // block, reduced by shuffles within each segment), else the whole block. Rows cached
            // in registers take four elements per thread step, so they need a quarter of the
            // threads. Streamed rows with partial sums over rows take a block a row, whose
            // rows are its own.
            let partials = self.k.has_partials();
            let fixed = self.fixed_width();
            match fixed {
                // A constant width (`plan::rows::segment_width`): `lane` and `per_block` are
                // constants too, and so are the reductions' segment tests.
                Some(width) => self.line(format!("const int width = {width};")),
                None => self.line(format!("int width = {BLOCK};")),
            }
            if fixed.is_none() && matches!(self.path, Path::RowsCached | Path::RowsCachedWide) {
                // Cached rows: the fewest threads that hold the row in `CACHE` registers each
                // (`CACHE` 4-byte elements, or twice as many 2-byte ones on the wide path).
                // With partial sums over rows too: a thread's columns are the same in every
                // row its segment takes, and the block's segments add theirs up once, after
                // the row loop (`write_parts`). A block a row of 256 left G2's backward one
                // element a thread and three block reductions a row: 7% of copy speed on an
                // H200 (benches/NOTES.md item 119).
                self.line("width = 1;");
                self.line(format!(
                    "while (width * {} < len) width <<= 1;",
                    self.cache_elems()
                ));
            } else if fixed.is_none() && !partials {
                // Short rows: up to four elements a thread, so that each has several loads in
                // flight. Rows shorter than a block's four vectors a thread: a segment of up to
                // a warp each, of the fewest threads that take four vectors each, reduced by
                // shuffles alone, as long as the rows keep every thread of the grid busy (else
                // wider segments). A block a row of 256 f32 left each thread one element and
                // two barriers a row: S2's row sums ran at 26% of copy speed there; a warp a
                // row of 256 bf16, one 16-byte vector a thread, 70% (NOTES item 97).
                let l = self.lanes;
                self.open("if (len <= 32)");
                self.line("width = 1;");
                self.line("while (width * 4 < len) width <<= 1;");
                self.close();
                self.open(format!("else if (len < {})", 4 * l * BLOCK));
                self.line("width = 1;");
                self.line(format!(
                    "while (width < 32 && width * {} < len) width <<= 1;",
                    4 * l
                ));
                self.line(format!(
                    "while (width < {BLOCK} && groups * width < (long long)gridDim.x * {BLOCK}) width <<= 1;"
                ));
                self.close();
            }
            self.line(format!("const int per_block = {BLOCK} / width;"));
            self.line("const int lane = threadIdx.x & (width - 1);");
        }
        self.shared_reduction_buffers(plan);
        // The wide entry's 16-bit rows are copied ahead but the lightest (`wide_copies_ahead`),
        // a 16-byte vector of eight elements a `cp.async`, into registers at the start of their
        // row (`row_loop`). Other light rows are loaded straight into registers in every row
        // loop (`direct_row_cost`); the rest are copied ahead where `prefetches` allows.
        let cached = match self.path {
            Path::Rows => vec![],
            _ => cached,
        };
        let wide = self.path == Path::RowsCachedWide && cached.len() == 1;
        let wide_copy = wide && wide_copies_ahead(self.k, self.plan);
        self.direct_rows = direct_row_cost(self.k, self.plan).is_some() && !wide_copy;
        let exact = self.path == Path::RowBlockExact;
        // A peeled row's vectors start where its first whole one does: copies ahead, a vector
        // a thread into its place in the buffer, count on them starting at the row's start.
        let prefetch = !cached.is_empty()
            && !self.peels_cache()
            && match block {
                true => block_copies_ahead(self.k, self.plan, &cached, exact),
                false => !self.direct_rows && (prefetches(self.k, &cached) || wide_copy),
            };
        if prefetch {
            self.prefetch_buffers(&cached);
        }
        // A thread's elements of a row in registers are the same `q`s and lanes of every row
        // it takes: its partial sums add up in registers. Added in memory, a block's row of
        // partials read back before each add, G1 ran at 73% of copy speed on an H100.
        self.partials_in_registers = self.k.has_partials() && !cached.is_empty();
        let chunked = self.chunked();
        if chunked {
            // The chunks' loop opens before the partial sums' registers, which start at zero
            // in each chunk.
            self.line("#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900");
            self.open_chunks();
        }
        if self.partials_in_registers {
            let l = self.cache_lanes;
            for (o, out) in self.k.outputs.iter().enumerate() {
                if out.partial.is_some() && !out.total {
                    let t = out.elem.c_name();
                    self.line(format!("fz_vec<{t}, {l}> pa{o}[{}];", CACHE / 4));
                    self.line("#pragma unroll");
                    self.line(format!(
                        "for (int q = 0; q < {}; ++q) for (int j = 0; j < {l}; ++j) pa{o}[q].v[j] = 0;",
                        CACHE / 4
                    ));
                }
            }
        }
        if block {
            // Compiled for sm_90 and later (and the emulator), which the host picks it for:
            // ptxas for sm_80 spilled this loop of `w7_layernorm_quantize` around the
            // division's slow-path calls at 64 registers.
            if !chunked {
                self.line("#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900");
            }
            if prefetch {
                self.first_row_copy(&cached);
                // The transaction barriers of the two buffers' bulk copies, and their phases.
                self.line("__shared__ unsigned long long fz_rb[2];");
                self.line("unsigned int fz_rp = 0u;");
                self.line("fz_row_barriers(fz_rb);");
                self.helpers.insert("fz_row_copy");
            }
            // Rows of exactly `CACHE * BLOCK` elements (4096 f32) have an entry of their own
            // without bounds tests: every vector is in the row. W7 went from 88% to 91% of copy
            // speed on an H200; the others moved by half a point at most.
            self.whole_rows = true;
            self.full_rows = self.path == Path::RowBlockExact
                || (chunked && crate::plan::program::exact_chunks(&self.when));
            self.row_loop(domain, axis, plan, &rows, &cached, prefetch);
            self.full_rows = false;
            self.whole_rows = false;
            self.write_parts(false, None);
            if chunked {
                self.close();
            }
            if self.k.has_partials() {
                self.finish_parts(if chunked { "fz_cs" } else { "gridDim.x" });
            }
            self.line("#endif");
        } else {
            if prefetch {
                self.first_row_copy(&cached);
            }
            // The wide entry's rows defer their divisions by a row's value, as a row a
            // block's do (`vector_row_step`), and so do the general entry's rows that keep
            // f32 slots (`narrow_slots`).
            self.defers_division =
                (wide || self.narrow_slots(plan, &cached)) && !self.k.draws_random();
            self.row_loop(domain, axis, plan, &rows, &cached, prefetch);
            self.defers_division = false;
            // The segments' partial sums meet in shared memory: in the buffers the rows were
            // copied ahead into, which the row loop is done with, where there are some.
            let parts = match prefetch {
                true => Some(format!("&pf_{}[0][0]", self.param_text(cached[0]).1)),
                false => None,
            };
            self.write_parts(true, parts);
            if self.k.has_partials() {
                self.finish_parts("gridDim.x");
            }
        }
        if prefetch {
            // No copy may land in shared memory after the block has exited.
            self.line("fz_copy_wait();");
        }
        self.direct_rows = false;
        self.partials_in_registers = false;
    }

    /// Whether the general cached entry's segmented loop (`Path::RowsCached`, peeled or not)
    /// keeps the values its passes store for later ones in f32 slots beside its rows
    /// (`plan::rows::narrow_slots`). Other segmented loops store nothing (`treats_rows_whole`),
    /// and so SO's bf16 softmax at 100 columns, which takes this entry, computed `exp(x - max)`
    /// again in its write pass: 62% of copy speed on an H100 (NOTES item 135).
    fn narrow_slots(&self, plan: &Plan, cached: &[usize]) -> bool {
        self.path == Path::RowsCached
            && !self.treats_rows_whole()
            && narrow_slots(self.k, plan, cached)
    }

    /// Whether the entry being written is the chunked one (`Path::RowChunks`).
    fn chunked(&self) -> bool {
        self.path == Path::RowChunks
    }

    /// The first term of a position along the row: its chunk's first column in the chunked
    /// entry (`fz_co + `), nothing elsewhere.
    fn chunk_start(&self) -> &'static str {
        match self.chunked() {
            true => "fz_co + ",
            false => "",
        }
    }

    /// The chunked entry's loop over its chunks (`Path::RowChunks`). A row of `len` splits
    /// into the fewest chunks of at most `CACHE * BLOCK` columns, `fz_cn`, chunk `k` from
    /// column `k * len / fz_cn` rounded down to a multiple of four: each a multiple of four
    /// over `len / fz_cn - 4` long, so at least 2048 (`len` is over `CACHE * BLOCK * (fz_cn -
    /// 1)`), as a row a block's is. Block `b` takes chunk `b % fz_cn` of rows `b / fz_cn` on,
    /// `fz_cs` apart, its partial sums in row `fz_cp` of theirs (the blocks past a whole
    /// number of chunks take none); a grid of fewer blocks than chunks takes them in turn,
    /// each a block's in every row, in row 0 of the partial sums. Inside, `len` is the
    /// chunk's, `fz_co` its first column, and `fz_len` the row's.
    fn open_chunks(&mut self) {
        let width = CACHE * BLOCK;
        self.line("const long long fz_len = len;");
        if crate::plan::program::exact_chunks(&self.when) {
            // Rows a multiple of the chunk: every chunk a constant `CACHE * BLOCK` long.
            self.line(format!("const long long fz_cn = len / {width};"));
            self.chunk_loop();
            self.line(format!("const long long fz_co = fz_ck * {width};"));
            self.line(format!("const long long len = {width};"));
            return;
        }
        self.line(format!(
            "const long long fz_cn = (len + {}) / {width};",
            width - 1
        ));
        self.chunk_loop();
        self.line("const long long fz_co = (fz_ck * fz_len / fz_cn) & ~3ll;");
        self.line("const long long len = ((fz_ck + 1) * fz_len / fz_cn & ~3ll) - fz_co;");
    }

    /// The loop over a block's chunks (`open_chunks`), opened, from `fz_cn`.
    fn chunk_loop(&mut self) {
        self.line("const bool fz_all = gridDim.x >= fz_cn;");
        self.line("const long long fz_cs = fz_all ? gridDim.x / fz_cn : 1;");
        self.line("const long long fz_cp = fz_all ? blockIdx.x / fz_cn : 0;");
        self.open("for (long long fz_ck = fz_all ? blockIdx.x % fz_cn : blockIdx.x; fz_cp < fz_cs && fz_ck < fz_cn; fz_ck += fz_all ? fz_cn : gridDim.x)");
    }

    /// After the row loop, each partial sum's rows (`OutputInfo::partial`): the block's own,
    /// from its registers where they add up there (`finish_parts` then sums them). With
    /// `segments` (a loop of `per_block` rows a step), each segment's sums go to shared memory
    /// (`fz_parts`, at `buffer`, else an array of its own), and the block's row is their sum
    /// in the segments' order.
    fn write_parts(&mut self, segments: bool, buffer: Option<String>) {
        let segments = segments && self.partials_in_registers;
        if segments {
            let (ce, l) = (self.cache_elems(), self.cache_lanes);
            let bytes = self
                .k
                .outputs
                .iter()
                .filter(|o| o.partial.is_some() && !o.total);
            let bytes = bytes.map(|o| o.elem.bits() / 8).max().unwrap_or(4);
            match buffer {
                Some(buffer) => {
                    // The row loop's last copies have landed before the buffer is reused.
                    self.line("fz_copy_wait();");
                    self.line(format!(
                        "unsigned char* const fz_parts = reinterpret_cast<unsigned char*>({buffer});"
                    ));
                }
                None => self.line(format!(
                    "__shared__ unsigned char fz_parts alignas(16) [{}];",
                    BLOCK * ce * bytes
                )),
            }
            for (o, out) in self.k.outputs.iter().enumerate() {
                if out.partial.is_none() || out.total {
                    continue;
                }
                let t = out.elem.c_name();
                // Every thread is past its last read of the buffer (or of the previous
                // output's sums) before it is written.
                self.line("__syncthreads();");
                self.open("");
                self.line(format!(
                    "fz_vec<{t}, {l}>* const fz_ps = reinterpret_cast<fz_vec<{t}, {l}>*>(fz_parts) + (threadIdx.x / width) * width * {};",
                    CACHE / 4
                ));
                self.line("#pragma unroll");
                self.line(format!(
                    "for (int q = 0; q < {}; ++q) fz_ps[lane + q * width] = pa{o}[q];",
                    CACHE / 4
                ));
                self.close();
                self.line("__syncthreads();");
                self.open(format!(
                    "for (int r = threadIdx.x; r < (int)len; r += {BLOCK})"
                ));
                self.line(format!(
                    "const {t}* const fz_pr = reinterpret_cast<const {t}*>(fz_parts) + r;"
                ));
                self.line(format!("{t} fz_pt = fz_pr[0];"));
                self.line(format!(
                    "for (int s = 1; s < per_block; ++s) fz_pt += fz_pr[s * width * {ce}];"
                ));
                self.line(format!("out{o}[(long long)blockIdx.x * len + r] = fz_pt;"));
                self.close();
            }
        }
        for (o, out) in self.k.outputs.iter().enumerate() {
            if out.partial.is_none() || out.total {
                continue;
            }
            match self.partials_in_registers {
                true if segments => {}
                true => {
                    let (t, l) = (out.elem.c_name(), self.cache_lanes);
                    // A chunk's sums go to its columns of the block's row of partial sums.
                    let row = match self.chunked() {
                        true => "fz_cp * fz_len + fz_co",
                        false => "(long long)blockIdx.x * len",
                    };
                    self.line("#pragma unroll");
                    self.open(format!("for (int q = 0; q < {}; ++q)", CACHE / 4));
                    self.line("const int c = lane + q * width;");
                    self.line(format!(
                        "if (c * {l} < (int)len) *(reinterpret_cast<fz_vec<{t}, {l}>*>(out{o} + {row}) + c) = pa{o}[q];"
                    ));
                    self.close();
                }
                // Streamed rows add to the block's row in memory as they go: a block that took
                // no row (a launch over none) zeroes its own.
                false => self.line(format!(
                    "if (blockIdx.x >= groups) for (long long r = threadIdx.x; r < len; r += {BLOCK}) out{o}[(long long)blockIdx.x * len + r] = 0;"
                )),
            }
        }
    }

    /// The scratch rows of partial sums (`OutputInfo::partial`), `out<o>` as the row loops
    /// write them: a row a block (or a cluster) of the row's length, each output's rows after
    /// the previous one's at the stride `plan::program::sum_bytes` gives the runtime.
    pub(super) fn partial_rows(&self) -> String {
        let Launch::Rows { axis, .. } = &self.k.launch else {
            return String::new();
        };
        let sums: Vec<usize> = (0..self.k.outputs.len())
            .filter(|&o| self.k.outputs[o].partial.is_some())
            .collect();
        if sums.is_empty() {
            return String::new();
        }
        let widest = crate::plan::program::sum_bytes(self.k) / sums.len() as u32;
        let len = self.layout.size(*axis);
        let mut text = String::new();
        for (i, &o) in sums.iter().enumerate() {
            let t = self.k.outputs[o].elem.c_name();
            // A total's region holds a slot a block, at least a row's length of them apart.
            text += &format!(
                "    {t}* const out{o} = reinterpret_cast<{t}*>(reinterpret_cast<unsigned char*>(fz_scratch) + {i}ll * gridDim.x * ({len} > 0 ? {len} : 1) * {widest});\n"
            );
            if self.k.outputs[o].total {
                text += &format!("    {t} fz_tot{o} = 0;\n");
            }
        }
        text
    }

    /// After every block's row of partial sums (`write_parts`): a barrier of the grid, then
    /// each block sums a share of the columns over the `rows` rows of partials, in their order
    /// (the same for every launch of a grid: deterministic), and stores the sums. A tile of 8
    /// adjacent columns (a 32-byte sector of f32) a block at a time, 32 threads down its rows:
    /// four in a warp, added by shuffles, and the eight warps' sums in shared memory. A total
    /// (`OutputInfo::total`): each block's sum of its threads' in its slot before the barrier,
    /// then the first warp of the first block sums the blocks'.
    pub(super) fn finish_parts(&mut self, rows: &str) {
        let totals: Vec<usize> = (0..self.k.outputs.len())
            .filter(|&o| self.k.outputs[o].total)
            .collect();
        for &o in &totals {
            let t = self.k.outputs[o].elem.c_name();
            self.open("");
            self.line(format!("__shared__ {t} fz_wt{o}[{}];", BLOCK / 32));
            for step in [16, 8, 4, 2, 1] {
                self.line(format!(
                    "fz_tot{o} += __shfl_xor_sync(0xffffffffu, fz_tot{o}, {step});"
                ));
            }
            self.line(format!(
                "if ((threadIdx.x & 31) == 0) fz_wt{o}[threadIdx.x >> 5] = fz_tot{o};"
            ));
            self.line("__syncthreads();");
            self.open("if (threadIdx.x == 0)");
            self.line(format!("{t} fz_b = fz_wt{o}[0];"));
            self.line(format!(
                "for (int w = 1; w < {}; ++w) fz_b += fz_wt{o}[w];",
                BLOCK / 32
            ));
            self.line(format!("out{o}[blockIdx.x] = fz_b;"));
            self.close();
            self.close();
        }
        self.helpers.insert("fz_grid_sync");
        self.line("fz_grid_sync(fz_counter);");
        for &o in &totals {
            let out = &self.k.outputs[o];
            let (t, stored) = (out.elem.c_name(), out.stored_elem());
            self.open("if (blockIdx.x == 0 && threadIdx.x < 32)");
            self.line(format!("{t} fz_b = 0;"));
            self.line(format!(
                "for (unsigned int p = threadIdx.x; p < gridDim.x; p += 32) fz_b += __ldcg(out{o} + p);"
            ));
            for step in [16, 8, 4, 2, 1] {
                self.line(format!(
                    "fz_b += __shfl_xor_sync(0xffffffffu, fz_b, {step});"
                ));
            }
            let value = match (out.elem, stored.is_narrow_float()) {
                (Elem::F64, true) => "(float)fz_b",
                _ => "fz_b",
            };
            let value = self.stored(stored, value);
            self.line(format!("if (threadIdx.x == 0) fz_sum{o}[0] = {value};"));
            self.close();
        }
        let sums: Vec<usize> = (0..self.k.outputs.len())
            .filter(|&o| self.k.outputs[o].partial.is_some() && !self.k.outputs[o].total)
            .collect();
        if sums.is_empty() {
            return;
        }
        self.open("");
        self.line(format!("const long long fz_rows = {rows};"));
        for &o in &sums {
            let t = self.k.outputs[o].elem.c_name();
            self.line(format!("__shared__ {t} fz_ws{o}[{}][8];", BLOCK / 32));
        }
        self.line("const int fz_fc = threadIdx.x & 7;");
        self.line("const int fz_fr = threadIdx.x >> 3;");
        self.open("for (long long fz_c0 = (long long)blockIdx.x * 8; fz_c0 < len; fz_c0 += (long long)gridDim.x * 8)");
        self.line("const long long c = fz_c0 + fz_fc;");
        for &o in &sums {
            let t = self.k.outputs[o].elem.c_name();
            self.line(format!("{t} fz_s{o} = 0;"));
        }
        self.open("if (c < len)");
        self.line("#pragma unroll 4");
        self.open(format!(
            "for (long long p = fz_fr; p < fz_rows; p += {})",
            BLOCK / 8
        ));
        for &o in &sums {
            self.line(format!("fz_s{o} += __ldcg(out{o} + p * len + c);"));
        }
        self.close();
        self.close();
        for &o in &sums {
            self.line(format!(
                "fz_s{o} += __shfl_xor_sync(0xffffffffu, fz_s{o}, 8);"
            ));
            self.line(format!(
                "fz_s{o} += __shfl_xor_sync(0xffffffffu, fz_s{o}, 16);"
            ));
            self.line(format!(
                "if ((threadIdx.x & 31) < 8) fz_ws{o}[threadIdx.x >> 5][fz_fc] = fz_s{o};"
            ));
        }
        self.line("__syncthreads();");
        self.open("if (threadIdx.x < 8 && c < len)");
        for &o in &sums {
            let out = &self.k.outputs[o];
            let (t, stored) = (out.elem.c_name(), out.stored_elem());
            self.line(format!("{t} fz_t{o} = fz_ws{o}[0][threadIdx.x];"));
            self.line(format!(
                "for (int w = 1; w < {}; ++w) fz_t{o} += fz_ws{o}[w][threadIdx.x];",
                BLOCK / 32
            ));
            let value = match (out.elem, stored.is_narrow_float()) {
                (Elem::F64, true) => format!("(float)fz_t{o}"),
                _ => format!("fz_t{o}"),
            };
            let value = self.stored(stored, &value);
            self.line(format!("fz_sum{o}[c] = {value};"));
        }
        self.close();
        self.line("__syncthreads();");
        self.close();
        self.close();
    }

    /// Whether the row loop being written treats its cached row as a row a block's loop does:
    /// its passes store values for later ones (`long_rows::stashes`), defer their divisions by a
    /// row's value, and ask L2 to keep what they read (`fz_keep`). The row-a-block
    /// loop, and every row loop of a kernel whose rows are light (`direct_row_cost`): in the
    /// segmented loop of heavier kernels they spilled (see `row_passes`).
    fn treats_rows_whole(&self) -> bool {
        self.whole_rows || self.direct_rows
    }

    /// The grid-stride loop over rows (`g0`, the block's first row), `per_block` rows a step;
    /// with `whole_rows` one row a block.
    fn row_loop(
        &mut self,
        domain: &[DimId],
        axis: DimId,
        plan: &Plan,
        rows: &[DimId],
        cached: &[usize],
        prefetch: bool,
    ) {
        // A row a block that holds its row in registers, where a value needs its element's
        // position along the row (`index`, a random draw): the thread's sixteen positions (32
        // at eight lanes), made once and kept (see `hoist_positions`); a peeled row's start
        // moves from row to row.
        self.hoisted_positions = self.whole_rows
            && !cached.is_empty()
            && !self.peels_cache()
            && self.uses_positions(axis);
        if self.hoisted_positions {
            self.hoist_positions();
        }
        if self.chunked() {
            self.open("for (long long g0 = fz_cp; g0 < groups; g0 += fz_cs)");
            self.line("const bool live = true;");
            self.line("const long long g = g0;");
        } else if self.whole_rows {
            self.open("for (long long g0 = blockIdx.x; g0 < groups; g0 += gridDim.x)");
            self.line("const bool live = true;");
            self.line("const long long g = g0;");
        } else {
            self.open("for (long long g0 = (long long)blockIdx.x * per_block; g0 < groups; g0 += (long long)gridDim.x * per_block)");
            // A segment past the last row computes on the last row (valid memory) and writes
            // nothing.
            self.line("const long long gl = g0 + threadIdx.x / width;");
            self.line("const bool live = gl < groups;");
            self.line("const long long g = live ? gl : groups - 1;");
        }
        self.row_start(rows, axis, plan);
        if self.peels_cache() && !cached.is_empty() {
            self.peel_cache_bounds();
        }
        let has_cache = !cached_params(self.k, self.plan).is_empty();
        let stream = self.streams_vectors(domain, axis, has_cache);
        if cached.is_empty() {
            self.row_passes(plan, axis, &[], stream);
        } else {
            // Rows that fit in registers are read from memory once, whatever the number of
            // passes: 16-byte vectors, `CACHE / 4` of them per thread, from global memory or
            // from the shared buffer the row was copied into ahead. In a row a block's loop
            // the passes run on registers loaded from that buffer once: reading it in every
            // pass, with the values stored back in it for later passes, W7 reached 70% of copy
            // speed on an H200 against 88%. In the segmented loop the row stays in its buffer
            // and each pass reads it from there: in registers, seven kernels spilled on sm_90
            // at their 64 registers (`w7_layernorm_quantize`, cross-entropies, `softmax_last`).
            let whole = self.whole_rows;
            // A row a block, and the wide entry's rows (which fit in registers beside the next
            // row's copy), are read from their buffer into registers once.
            let registers = whole || self.path == Path::RowsCachedWide;
            if prefetch {
                // A row a block's first row was copied before the loop, as the segments' are.
                self.line(match whole {
                    true => "if (g0 == blockIdx.x) fz_copy_wait(); else fz_row_wait(&fz_rb[buf], fz_rp, buf);",
                    false => "fz_copy_wait();",
                });
                if registers {
                    self.load_cached_rows(cached, true);
                }
                // The next row's copies go to the other buffer, read last by the previous row.
                let next = "g0 + (long long)gridDim.x * per_block";
                self.open(format!("if ({next} < groups)"));
                match whole {
                    true => self.copy_row_in_bulk(cached, next, "buf ^ 1"),
                    false => self.copy_rows_by_thread(cached, next, "buf ^ 1"),
                }
                self.close();
                self.in_shared = !registers;
                self.row_passes(plan, axis, cached, false);
                self.in_shared = false;
                self.line("buf ^= 1;");
            } else {
                self.load_cached_rows(cached, false);
                if whole && next_row_to_l2(self.k, cached) {
                    self.ask_l2_for_next_row(cached);
                } else if (self.partials_in_registers && segments_ask_l2(self.k, plan, cached))
                    || (self.peels_cache() && next_row_to_l2(self.k, cached))
                {
                    self.ask_l2_for_next_rows(cached);
                }
                self.row_passes(plan, axis, cached, false);
            }
        }
        self.hoisted_positions = false;
        self.close();
    }

    /// The coordinates of row `g`, its start `b<s>` in each shape, and its prologue values: the
    /// start of every row loop but the tiled short rows' (whose whole-domain tensors start at 0).
    pub(super) fn row_start(&mut self, rows: &[DimId], axis: DimId, plan: &Plan) {
        for l in self.layout.split("g", rows, &SYNTAX) {
            self.line(l);
        }
        // A chunk's elements start `fz_co` on in each shape along the row, which is its last
        // dim there (`plan::rows::chunks_rows`).
        for (s, shape) in self.layout.shapes().iter().enumerate() {
            let chunk = match self.chunked() && shape.contains(&axis) {
                true => " + fz_co",
                false => "",
            };
            self.line(format!(
                "const long long b{s} = {}{chunk};",
                self.layout.offset(shape, Some(axis))
            ));
        }
        self.values(&plan.prologue, Scope::Row);
    }

    /// Whether some value of the passes needs its element's position along `axis` (`r`):
    /// `index` of the axis, a slice along it (read at its position), or a random draw (drawn at
    /// its position).
    fn uses_positions(&self, axis: DimId) -> bool {
        self.plan.passes.iter().flat_map(|p| &p.elems).any(|&n| {
            matches!(self.k.nodes[n].op, Op::Index(d) if d == axis)
                || matches!(self.k.nodes[n].op, Op::Random(..))
                || matches!(self.k.nodes[n].op, Op::View(..) if self.k.nodes[n].shape.contains(&axis))
        })
    }

    /// Before a row a block's loop, this thread's positions in a row, `fz_pos[q * 4 + j]`, each
    /// hidden from the compiler so that it keeps them rather than computing them again in every
    /// row. On its own (an entry per path) ptxas recomputed W9's sixteen label positions in
    /// every row, 429 instructions a row against the 404 of the kernel that held every path,
    /// which kept them: 418 with them kept (benches/NOTES.md item 70).
    fn hoist_positions(&mut self) {
        let l = self.cache_lanes;
        self.line(format!("unsigned int fz_pos[{}];", self.cache_elems()));
        self.line("#pragma unroll");
        self.open(format!("for (int q = 0; q < {}; ++q)", CACHE / 4));
        self.line("#pragma unroll");
        self.open(format!("for (int j = 0; j < {l}; ++j)"));
        let chunk = self.chunk_start();
        self.line(format!(
            "fz_pos[q * {l} + j] = (unsigned int)({chunk}(lane + q * width) * {l} + j);"
        ));
        self.line(format!("asm volatile(\"\" : \"+r\"(fz_pos[q * {l} + j]));"));
        self.close();
        self.close();
    }

    /// In a row a block's loop that reads its row straight into registers, asks L2 for the
    /// block's next row of each `cached` tensor once this row's loads are issued (one bulk
    /// prefetch a tensor on sm_90), so that memory keeps fetching while the block's passes run,
    /// and the next row's loads find it there; where `plan::rows::next_row_to_l2` says. Each
    /// cached tensor is over the whole domain, its reduced dim last (`cached_params`): row `n`
    /// starts at `n * len`, the block's next at `b<s> + gridDim.x * len`. (The loops that copy
    /// their next row into shared memory ahead, `prefetches`, have it on its way already.)
    fn ask_l2_for_next_row(&mut self, cached: &[usize]) {
        self.helpers.insert("fz_l2_prefetch");
        // A chunk's next is the same chunk `fz_cs` rows on.
        let (next, step, stride) = match self.chunked() {
            true => ("fz_cs", "fz_cs", "fz_len"),
            false => ("gridDim.x", "(long long)gridDim.x", "len"),
        };
        self.open(format!("if (g0 + {next} < groups)"));
        for &p in cached {
            let (t, name) = self.param_text(p);
            let s = self.shape_index(self.k.params[p].shape.as_ref().expect("a tensor"));
            self.line(format!(
                "fz_prefetch_l2(p_{name} + b{s} + {step} * {stride}, len * (long long)sizeof({t}));"
            ));
        }
        self.close();
    }

    /// In a segmented loop with partial sums over rows, whose blocks each go through many steps
    /// of `per_block` rows, or of peeled rows (`peels_cache`) where [`next_row_to_l2`] allows,
    /// asks L2 for the block's next step's rows of each `cached` tensor (contiguous: row `n`
    /// starts at `n * len`, as in `ask_l2_for_next_row`) once this step's loads are issued.
    /// The peeled segments load their rows straight into registers and waited for them row
    /// after row: asked ahead, SO's bf16 softmax at 1027 columns went from 57 to 61% of copy
    /// speed on an H200, its bf16 RMSNorm from 92 to 96% (benches/NOTES.md item 133).
    fn ask_l2_for_next_rows(&mut self, cached: &[usize]) {
        self.helpers.insert("fz_l2_prefetch");
        self.line("const long long fz_next = g0 + (long long)gridDim.x * per_block;");
        self.open("if (fz_next < groups)");
        self.line("const long long fz_rows = groups - fz_next < per_block ? groups - fz_next : per_block;");
        for &p in cached {
            let (t, name) = self.param_text(p);
            self.line(format!(
                "fz_prefetch_l2(p_{name} + fz_next * len, fz_rows * len * (long long)sizeof({t}));"
            ));
        }
        self.close();
    }

    /// Declares the registers of each `cached` tensor's row, `rc_<name>[q]`, and loads this
    /// thread's vectors of the row into them: from the shared buffer the row was copied into
    /// (`from_buffer`), else from global memory.
    fn load_cached_rows(&mut self, cached: &[usize], from_buffer: bool) {
        for &p in cached {
            let (t, name) = self.param_text(p);
            let s = self.shape_index(self.k.params[p].shape.as_ref().expect("a tensor"));
            let l = self.cache_lanes;
            self.line(format!("fz_vec<{t}, {l}> rc_{name}[{}];", CACHE / 4));
            self.line("#pragma unroll");
            self.open(format!("for (int q = 0; q < {}; ++q)", CACHE / 4));
            self.line("const int c = lane + q * width;");
            // A row a block, or a light row, asks L2 to keep what it reads, as it does its other
            // loads along the row (`vector_row_step`).
            let peel = if self.peels_cache() { " + fz_h" } else { "" };
            let from = match (from_buffer, self.treats_rows_whole()) {
                (true, _) => format!("pf_{name}[buf][q * {BLOCK} + threadIdx.x]"),
                (false, false) => format!(
                    "reinterpret_cast<const fz_vec<{t}, {l}>*>(p_{name} + b{s}{peel})[c]"
                ),
                (false, true) => format!(
                    "fz_ld_keep(reinterpret_cast<const fz_vec<{t}, {l}>*>(p_{name} + b{s}{peel}) + c)"
                ),
            };
            if self.treats_rows_whole() && !from_buffer {
                self.helpers.insert("fz_keep");
            }
            self.line(format!("{}rc_{name}[q] = {from};", self.if_in_cached_row()));
            self.close();
            if self.peels_cache() {
                // This thread's element around the row's whole vectors, where it has one.
                self.line(format!("{t} rx_{name} = 0;"));
                self.line(format!(
                    "if (lane < fz_nx) rx_{name} = p_{name}[b{s} + fz_rx];"
                ));
            }
        }
    }

    /// The two shared buffers of each `cached` tensor that the next row is copied into while
    /// the block works on the current one (`pf_<name>[buf][q * BLOCK + threadIdx.x]`: each
    /// thread its own vectors), and the index of the current one. Each starts on a 128-byte
    /// line: placed after the reductions' buffers, off their lines, they cost W6 and W7 two
    /// points of copy bandwidth on an H200, W9 one (benches/NOTES.md item 50).
    fn prefetch_buffers(&mut self, cached: &[usize]) {
        // `fz_copy_async` and `fz_copy_wait`, which the long-row path uses too.
        self.helpers.insert("fz_long_rows");
        self.helpers.insert("fz_l2_prefetch");
        self.helpers.insert("fz_vec");
        for &p in cached {
            let ((t, name), l) = (self.param_text(p), self.cache_lanes);
            self.line(format!(
                "__shared__ fz_vec<{t}, {l}> pf_{name} alignas(128) [2][{}];",
                CACHE / 4 * BLOCK
            ));
        }
        self.line("int buf = 0;");
    }

    /// Starts copying the block's first row (rows, in segments) of the `cached` tensors into
    /// buffer 0, thread by thread, before its row loop (`row_loop` with `prefetch`) waits for it.
    fn first_row_copy(&mut self, cached: &[usize]) {
        self.open(format!(
            "if ((len & {}) == 0 && len <= {} * width && (long long)blockIdx.x * per_block < groups)",
            self.cache_lanes - 1,
            self.cache_elems()
        ));
        self.copy_rows_by_thread(cached, "(long long)blockIdx.x * per_block", "0");
        self.close();
    }

    /// Starts copying the row from `first` of the one tensor `prefetches` allows into buffer
    /// `buf`, in one bulk copy (`fz_copy_row`) for the row-a-block loop: the buffer holds it in
    /// order, vector `c` at `c`, as the per-thread copies place it (`c = lane + q * BLOCK`).
    fn copy_row_in_bulk(&mut self, cached: &[usize], first: &str, buf: &str) {
        self.line(format!("const long long gp = {first};"));
        if let &[p] = cached {
            let (t, name) = self.param_text(p);
            self.line(format!("if (threadIdx.x == 0) fz_copy_row(&pf_{name}[{buf}][0], p_{name} + gp * len, (unsigned int)len * sizeof({t}), &fz_rb[{buf}]);"));
            return;
        }
        // Several tensors: the buffer's barrier expects all their bytes, then a copy each.
        let sizes: Vec<String> = cached
            .iter()
            .map(|&p| format!("sizeof({})", self.param_text(p).0))
            .collect();
        self.open("if (threadIdx.x == 0)");
        self.line(format!(
            "fz_expect(&fz_rb[{buf}], (unsigned int)len * ({}));",
            sizes.join(" + ")
        ));
        for &p in cached {
            let (t, name) = self.param_text(p);
            self.line(format!("fz_copy_bulk(&pf_{name}[{buf}][0], p_{name} + gp * len, (unsigned int)len * sizeof({t}), &fz_rb[{buf}]);"));
        }
        self.close();
    }

    /// Starts copying the `cached` tensors' elements of this thread's row among those from
    /// `first` into buffer `buf`, a `cp.async` a vector. A tensor over the whole domain with the
    /// reduced dim last holds row `g` at `g * len`; a segment past the last row copies the last
    /// row, as it computes on it. Outside the row-a-block loop (`whole_rows`), whose rows come
    /// in bulk but for the first (`first_row_copy`, written before that loop).
    fn copy_rows_by_thread(&mut self, cached: &[usize], first: &str, buf: &str) {
        self.line(format!(
            "const long long gp = {first} + threadIdx.x / width < groups ? {first} + threadIdx.x / width : groups - 1;"
        ));
        let inside = self.if_in_cached_row();
        let l = self.cache_lanes;
        for &p in cached {
            let (t, name) = self.param_text(p);
            let bytes = l * self.k.params[p].elem.bits() / 8;
            // The row's address once (64-bit), then 32-bit steps: the address was recomputed
            // from `gp * len` for each vector.
            self.line(format!(
                "const {t}* const pr_{name} = p_{name} + gp * len + lane * {l};"
            ));
            self.line("#pragma unroll");
            self.open(format!("for (int q = 0; q < {}; ++q)", CACHE / 4));
            self.line("const int c = lane + q * width;");
            self.line(format!(
                "{inside}fz_copy_async<{bytes}>(&pf_{name}[{buf}][q * {BLOCK} + threadIdx.x], pr_{name} + q * width * {l});"
            ));
            self.close();
        }
    }

    /// Whether this entry holds rows in registers at lengths that are no multiple of its
    /// vectors (`plan::peels_cache`): each row's vectors from its first whole one in memory,
    /// `fz_h` elements on; the elements before it and after its last whole one (fewer than a
    /// vector each) one a thread beside them (`peeled_elements`).
    fn peels_cache(&self) -> bool {
        crate::plan::peels_cache(self.path, &self.when)
    }

    /// A peeled row's bounds (`peels_cache`), as the streamed rows' (`peeled_row_loop`): `fz_h`
    /// elements to its first whole vector in memory (all of a row shorter than that), its
    /// `fz_nv` whole vectors from there, and the `fz_nx` elements around them, fewer than two
    /// vectors' worth, of which this thread's is at `fz_rx` where `lane < fz_nx`. The row's
    /// tensors are of the domain, so one offset serves them all.
    fn peel_cache_bounds(&mut self) {
        let Launch::Rows { domain, .. } = &self.k.launch else {
            return;
        };
        let l = self.cache_lanes;
        let shift = l.trailing_zeros();
        self.first_whole_vector(domain, l);
        self.line(format!("const int fz_nv = (int)((len - fz_h) >> {shift});"));
        self.line(format!("const int fz_nx = (int)len - (fz_nv << {shift});"));
        self.line(format!(
            "const long long fz_rx = lane < fz_h ? (long long)lane : lane + ((long long)fz_nv << {shift});"
        ));
    }

    /// `fz_h`, the elements from the start of the row (of `domain`'s tensors) to its first whole
    /// vector of `v` in memory: at most the row, a row shorter than its way there all of it.
    fn first_whole_vector(&mut self, domain: &[DimId], v: u32) {
        let s = self.shape_index(domain);
        self.line(format!("const long long fz_to = (-b{s}) & {};", v - 1));
        self.line("const long long fz_h = fz_to < len ? fz_to : len;");
    }

    /// A pass's element of a peeled row outside its whole vectors (`peels_cache`), where this
    /// thread has one: of the cached tensors, the one loaded beside the vectors (`rx_<name>`),
    /// computed as a streamed row computes it, without the values earlier passes stored in
    /// the slots. Loaded from memory in every pass instead, SO's f32 softmax at 1027 columns
    /// ran at 70% of copy speed on an H200 (77% streamed), its bf16 softmax at 31% (44%): each
    /// pass waited for its loads.
    fn peeled_elements(
        &mut self,
        pass: &Pass,
        axis: DimId,
        cached: &[usize],
        shapes: &[Vec<DimId>],
        guard: &str,
    ) {
        self.open(format!("if ({guard}lane < fz_nx)"));
        self.line("const long long r = fz_rx;");
        self.peeled_extras = true;
        self.row_step(pass, axis, cached, shapes, false);
        self.peeled_extras = false;
        self.close();
    }

    /// Whether vector `c = lane + q * width` of a cached row is in the row (of a peeled row,
    /// among its whole vectors: `c < fz_nv`), `None` where it always is (`full_rows`). A cached row has at most `CACHE * BLOCK` elements, so the test
    /// is 32-bit; a row a block is longer than `CACHE * BLOCK / 2` (else `width` would be
    /// smaller), and so is a row of segments of a constant width than half of what they hold,
    /// so its first half always is.
    fn in_cached_row(&self) -> Option<String> {
        let l = self.cache_lanes;
        if self.peels_cache() {
            Some("c < fz_nv".into())
        } else if self.full_rows {
            None
        } else if self.whole_rows || self.fixed_width().is_some() {
            Some(format!("(q < {} || c * {l} < (int)len)", CACHE / 8))
        } else {
            Some(format!("c * {l} < (int)len"))
        }
    }

    /// The constant width of the segments being written (`plan::rows::segment_width`), whose
    /// rows are longer than half of what they hold; `None` where it is set at run time.
    fn fixed_width(&self) -> Option<u32> {
        self.segment_width
    }

    /// The elements of a cached row a thread holds: `CACHE / 4` vectors of `cache_lanes`.
    fn cache_elems(&self) -> u32 {
        CACHE / 4 * self.cache_lanes
    }

    /// `in_cached_row` as the start of a one-line `if`, or nothing.
    fn if_in_cached_row(&self) -> String {
        self.in_cached_row()
            .map(|inside| format!("if ({inside}) "))
            .unwrap_or_default()
    }

    /// Declares a row kernel's `groups` (rows) and `len` (their length), the divisors that split
    /// a row index into the other dims and the reciprocals of `len` for means; returns those dims.
    pub(super) fn row_counts(&mut self, domain: &[DimId], axis: DimId, plan: &Plan) -> Vec<DimId> {
        let rows: Vec<DimId> = domain.iter().copied().filter(|&d| d != axis).collect();
        self.line(format!(
            "const long long groups = {};",
            self.layout.product(&rows)
        ));
        let len = self.layout.size(axis);
        match self.path {
            // The tiled template's `exact`: the row length where the entry fixes it.
            Path::ShortRows => {
                self.line(format!("const long long len = exact > 0 ? exact : {len};"))
            }
            _ => self.line(format!("const long long len = {len};")),
        }
        self.length_guard();
        self.divisors(&rows);
        self.reciprocals(plan, "len");
        rows
    }

    /// For an entry that holds its rows in registers, a return unless the rows have the lengths
    /// the host takes it for (the entry's `When`): what the entry's loops assume, so that ptxas
    /// folds it (`len` a constant 4096 in `exact_rows`: W9 lost 3% of copy speed without it, the
    /// row's offsets multiplied out), and a launch the host would not make does nothing.
    fn length_guard(&mut self) {
        if !matches!(
            self.path,
            Path::RowBlock
                | Path::RowBlockExact
                | Path::RowBlockWide
                | Path::RowChunks
                | Path::RowsCached
                | Path::RowsCachedWide
        ) {
            return;
        }
        let when = self.when;
        let mut wrong = vec![];
        if when.min_len == when.max_len {
            wrong.push(format!("len != {}", when.min_len));
        } else {
            if when.min_len > 1 {
                wrong.push(format!("len < {}", when.min_len));
            }
            wrong.push(format!("len > {}", when.max_len));
        }
        match when.multiple_of {
            _ if when.min_len == when.max_len => {}
            m if m > 1 && m.is_power_of_two() => wrong.push(format!("(len & {}) != 0", m - 1)),
            m if m > 1 => wrong.push(format!("len % {m} != 0")),
            _ => {}
        }
        self.line(format!("if ({}) return;", wrong.join(" || ")));
    }

    /// The passes over a row: streaming (`cached` empty: `r` strides through the row, four
    /// elements a step when `stream` and the length allows), or over the registers holding the
    /// `cached` tensors (`r = lane + k * width` for `k < CACHE`).
    fn row_passes(&mut self, plan: &Plan, axis: DimId, cached: &[usize], stream: bool) {
        let shapes = self.layout.shapes();
        // A cached row's passes store values in place of its elements for later passes to
        // read, as long rows do (`long_rows::stashes`): in the row-a-block copy of the loop,
        // the usual one, in light rows' segmented loop, and in the wide entry's (in f32 slots,
        // at one block an SM fewer: `tuning::wide_min_blocks`); in every segmented loop,
        // `w7_layernorm_quantize` spilled 4 bytes on sm_90 at its 64 registers. Not in the wide
        // entry's peeled copies: with their f32 slots, 16-bit softmaxes spilled 4-20 bytes at
        // their 80 registers.
        let wide_slots = self.path == Path::RowsCachedWide && !self.peels_cache();
        let stashing = if self.treats_rows_whole() || wide_slots || self.narrow_slots(plan, cached)
        {
            cached
        } else {
            &[]
        };
        let (slot, stashes) = pass_stashes(self.k, plan, stashing, true);
        // A row of narrow floats (16-bit or fp8) stores f32 values (softmax's `exp(x - max)`) in an array of
        // its own, `rs_<name>`: rounded into the row's registers they would lose their
        // precision. Computed again instead, S2's bf16 softmax took two `expf` an element.
        if let (Some(p), true) = (slot, f32_slots(self.k, plan, stashing)) {
            let (_, name) = self.param_text(p);
            let l = self.cache_lanes;
            self.line(format!("fz_vec<float, {l}> rs_{name}[{}];", CACHE / 4));
        }
        for (pass, (reuse, stash)) in plan.passes.iter().zip(stashes) {
            self.init_accumulators(&pass.reduces);
            let guard = if pass.writes.is_empty() {
                ""
            } else {
                "live && "
            };
            if cached.is_empty() {
                // Rows contiguous in memory whose length is a multiple of four stream as 16-byte
                // vectors (four times the bytes in flight per load); others element by element.
                // 16 bytes a load: eight elements where every tensor is of 2-byte ones
                // (`plan::rows::lanes`), then four. At four bf16 lanes (8-byte loads) S2's
                // bf16 row sums ran at 69-80% of copy speed on an H100, f32 at 94-99%.
                let widths: &[u32] = match (stream, self.lanes >= 8) {
                    (false, _) => &[],
                    (true, true) => &[8, 4],
                    (true, false) => &[4],
                };
                let peel = widths.first().filter(|_| self.peels(pass, axis)).copied();
                match peel {
                    // Rows of 2-byte elements peel at every length (NOTES item 127): one vector
                    // loop in the kernel, not one a length. With a loop of their own for the
                    // rows whose length is a multiple of four beside the peeled one, SO's bf16
                    // RMSNorm ran at 74% of copy speed at 1027 columns, 85% without; but the
                    // f32 row sum 3.5-4% slower at 100 and 5120 columns without it.
                    Some(v) if self.narrow_rows() => {
                        self.open("");
                        self.peeled_row_loop(pass, axis, &shapes, v, guard);
                        self.close();
                    }
                    _ => self.row_loops(pass, axis, &shapes, widths, guard, peel),
                }
            } else {
                self.line("#pragma unroll");
                self.open(format!("for (int q = 0; q < {}; ++q)", CACHE / 4));
                self.line("const int c = lane + q * width;");
                // In a pass that also loads other tensors along the row (gamma, beta), the
                // unconditional loads of the first half were hoisted and spilled
                // (`w7_layernorm_quantize` at 64 registers): the test stays there.
                let l = self.cache_lanes;
                let inside = if self.full_rows
                    || self.peels_cache()
                    || self.row_vectors(pass, axis, cached).is_empty()
                {
                    self.in_cached_row()
                } else {
                    Some(format!("c * {l} < (int)len"))
                };
                match inside {
                    Some(inside) => self.open(format!("if ({guard}{inside})")),
                    None => self.open(""),
                }
                (self.reuse, self.stash) = (reuse, stash);
                let p = slot.unwrap_or(cached[0]);
                let (t, name) = self.param_text(p);
                let (t, slots) = match self.k.params[p].elem.is_narrow_float() {
                    true => ("float", "rs"),
                    false => (t, "rc"),
                };
                if stash.is_some() {
                    self.line(format!("fz_vec<{t}, {l}> fz_st;"));
                }
                self.step_lanes = l;
                self.row_randoms = true;
                self.peeled = self.peels_cache();
                self.vector_row_step(pass, axis, cached, &shapes, true);
                self.peeled = false;
                self.row_randoms = false;
                self.step_lanes = 4;
                if stash.is_some() {
                    // Only loops whose rows are in registers stash (`treats_rows_whole`).
                    self.line(format!("{slots}_{name}[q] = fz_st;"));
                }
                (self.reuse, self.stash) = (None, None);
                self.close();
                self.close();
                if self.peels_cache() {
                    self.peeled_elements(pass, axis, cached, &shapes, guard);
                }
            }
            self.block_reduce(&pass.reduces, true);
            self.finish_reductions(&pass.reduces, "len");
            self.values(&pass.after, Scope::Row);
        }
        if !plan.group_writes.is_empty() {
            self.open("if (live && lane == 0)");
            self.writes(&plan.group_writes, Scope::Row);
            self.close();
        }
    }

    /// A streamed pass: rows whose length is a multiple of a width in `widths` (widest first)
    /// as vectors of it, the others as vectors of `peel` from their first whole one where the
    /// pass peels (`peeled_row_loop`), else element by element.
    fn row_loops(
        &mut self,
        pass: &Pass,
        axis: DimId,
        shapes: &[Vec<DimId>],
        widths: &[u32],
        guard: &str,
        peel: Option<u32>,
    ) {
        // The vector loop runs to a count of vectors, not while `c * v < len`: from
        // that test ptxas could not count the steps, and unrolled the loop with an exit
        // test after each load, one 16-byte load in flight a thread (S2's f32 row sums
        // at 88-95% of copy speed where torch.compile's ran at 97-102%). A pass that
        // writes counts none where its row is not `live`.
        for &v in widths {
            self.open(format!("if ((len & {}) == 0)", v - 1));
            let shift = v.trailing_zeros();
            let steps = match guard {
                "" => format!("(len >> {shift})"),
                _ => {
                    self.line(format!(
                        "const long long steps = live ? len >> {shift} : 0;"
                    ));
                    "steps".to_string()
                }
            };
            self.step_lanes = v;
            self.row_randoms = true;
            self.row_vector_loop(&steps, None, |p| {
                p.vector_row_step(pass, axis, &[], shapes, false)
            });
            self.row_randoms = false;
            self.step_lanes = 4;
            self.close();
            self.open("else");
        }
        match peel {
            Some(v) => self.peeled_row_loop(pass, axis, shapes, v, guard),
            None => {
                self.line("#pragma unroll 4");
                self.open(format!(
                    "for (long long r = lane; {guard}r < len; r += width)"
                ));
                self.row_step(pass, axis, &[], shapes, false);
                self.close();
            }
        }
        for _ in widths {
            self.close();
        }
    }

    /// Whether every tensor along the rows (inputs and outputs) is of 2-byte elements or
    /// narrower: such rows take one peeled loop at every length (`row_passes`).
    fn narrow_rows(&self) -> bool {
        let Launch::Rows { axis, .. } = &self.k.launch else {
            return false;
        };
        let along = |shape: &[DimId]| shape.last() == Some(axis);
        self.k
            .tensor_params()
            .filter(|(_, _, s)| along(s))
            .map(|(_, p, _)| p.elem)
            .chain(
                self.k
                    .outputs
                    .iter()
                    .filter(|o| along(&o.shape))
                    .map(|o| o.elem),
            )
            .all(|e| e.bits() <= 16)
    }

    /// Whether a streamed pass takes its rows as vectors from the first whole vector of memory
    /// on (`peeled_row_loop`; a long row's part too, `long_rows::long_peel`): where every tensor
    /// it loads or writes along the row is of the kernel's domain (one row offset, so that one
    /// element starts a whole vector in all of them), and nothing in it counts on a vector
    /// starting at a multiple of its lanes (random values, drawn four lanes a Philox block;
    /// quotients of a position, computed once a vector; partial sums, stored a vector at a
    /// time).
    pub(super) fn peels(&self, pass: &Pass, axis: DimId) -> bool {
        let Launch::Rows { domain, .. } = &self.k.launch else {
            return false;
        };
        let along = |shape: &[DimId]| shape.last() == Some(&axis);
        let loads = self.row_vectors(pass, axis, &[]);
        let mut writes = pass.writes.iter().map(|&o| &self.k.outputs[o]);
        let random = self.pass_elems(pass).iter().any(|&id| {
            let node = &self.k.nodes[id];
            matches!(node.op, Op::Random(..)) && along(&node.shape)
        });
        !random
            && !self.k.has_partials()
            && self.lane_invariants(pass, axis).1.is_empty()
            && (!loads.is_empty() || !pass.writes.is_empty())
            && loads
                .iter()
                .all(|&p| self.k.params[p].shape.as_deref() == Some(domain))
            && writes.all(|o| o.shape == *domain)
    }

    /// A streamed pass over a row (`peels`): the elements before the row's first whole vector
    /// of `v` (`fz_h`, fewer than `v`) and after its last (fewer than `v`) element by element,
    /// the rest as vectors (`row_vector_loop`). At odd lengths the rows took 2-byte loads an
    /// element otherwise (bf16 softmax at 4095 columns: three passes of them). Rows of 2-byte
    /// elements take it at every length, the others where the length is no multiple of four
    /// (`row_passes`).
    fn peeled_row_loop(
        &mut self,
        pass: &Pass,
        axis: DimId,
        shapes: &[Vec<DimId>],
        v: u32,
        guard: &str,
    ) {
        let Launch::Rows { domain, .. } = &self.k.launch else {
            return;
        };
        let shift = v.trailing_zeros();
        self.first_whole_vector(domain, v);
        self.line(format!("const long long fz_nv = (len - fz_h) >> {shift};"));
        let steps = match guard {
            "" => "fz_nv".to_string(),
            _ => {
                self.line("const long long steps = live ? fz_nv : 0;");
                "steps".to_string()
            }
        };
        self.step_lanes = v;
        self.peeled = true;
        // Beside a loop of its own for the rows whose length is a multiple of four (not
        // `narrow_rows`), two vectors a step: ptxas's loop unrolled four times left the f32
        // row sum over its 48 registers (it spilled), and once, SO's f32 softmax at 1027
        // columns ran at 65% of copy speed, at 77% with two.
        let batch = (!self.narrow_rows()).then_some(2);
        self.row_vector_loop(&steps, batch, |p| {
            p.vector_row_step(pass, axis, &[], shapes, false)
        });
        self.peeled = false;
        self.step_lanes = 4;
        self.line("#pragma unroll 1");
        self.open(format!(
            "for (long long k = lane; {guard}k < len - (fz_nv << {shift}); k += width)"
        ));
        self.line(format!(
            "const long long r = k < fz_h ? k : k + (fz_nv << {shift});"
        ));
        self.row_step(pass, axis, &[], shapes, false);
        self.close();
    }

    /// A streamed row's loop over its vectors `c` from `lane` below `steps`, `width` apart. In a
    /// kernel of 2-byte tensors (eight lanes a vector): four at a time, each `step` in turn with
    /// nothing between their loads; then the last one to three, their loads together too, at
    /// `fz_cl` (the first of them where `c` is past the row), each step under its test
    /// (`tail`). Left to ptxas to unroll, a loop of f16 row sums took an exit test after each
    /// load, one 16-byte load in flight a thread, and ran 4-19% slower at 40 registers than at
    /// 32 (S2's f16 row sums at 256-262144 columns, on an H200), where bf16's had its four loads
    /// in flight at 64; with the last ones a step at a time, SO's bf16 row sums at 3000 columns
    /// ran 16% slower. Batched, 16-bit row sums ran 1-6% faster at 256-262144 columns and 19%
    /// at 100 and 1000 (benches/NOTES.md item 125).
    ///
    /// Other kernels' loops (four lanes) are ptxas's to unroll four times, or `batch` vectors
    /// a step as above: four, f32 row sums took 72 registers where they had 56 (three blocks
    /// an SM, not four) and ran 4-19% slower at 100-5120 columns.
    fn row_vector_loop(
        &mut self,
        steps: &str,
        batch: Option<u32>,
        mut step: impl FnMut(&mut Self),
    ) {
        let n = match (self.lanes >= 8, batch) {
            (true, _) => 4,
            (false, Some(n)) => n,
            (false, None) => {
                self.line("#pragma unroll 4");
                self.open(format!("for (long long c = lane; c < {steps}; c += width)"));
                step(self);
                self.close();
                return;
            }
        };
        self.line("long long fz_c = lane;");
        self.line("#pragma unroll 1");
        self.open(format!(
            "for (; fz_c + {} * width < {steps}; fz_c += {n} * width)",
            n - 1
        ));
        self.line("#pragma unroll");
        self.open(format!("for (int u = 0; u < {n}; ++u)"));
        self.line("const long long c = fz_c + u * width;");
        step(self);
        self.close();
        self.close();
        self.open(format!("if (fz_c < {steps})"));
        self.line("#pragma unroll");
        self.open(format!("for (int u = 0; u < {}; ++u)", n - 1));
        self.line("const long long c = fz_c + u * width;");
        self.line(format!("const long long fz_cl = c < {steps} ? c : fz_c;"));
        self.tail = Some(format!("c < {steps}"));
        step(self);
        self.tail = None;
        self.close();
        self.close();
    }

    /// Whether rows stream as vectors (when their length allows): rows contiguous in memory, in
    /// a kernel without a register cache or with one tensor along the row. The vector step of a
    /// wider kernel beside its cached one spilled (`w6_layernorm_gelu` on sm_80: x, gamma and
    /// beta at four blocks per SM).
    fn streams_vectors(&self, domain: &[DimId], axis: DimId, has_cache: bool) -> bool {
        let along = self
            .k
            .tensor_params()
            .filter(|(_, _, s)| s.last() == Some(&axis))
            .count();
        domain.last() == Some(&axis) && (!has_cache || along <= 1)
    }

    /// Four elements of a row pass, at `r = c * 4 + j` for `j < 4`: the `cached` tensors from
    /// registers, the others contiguous along the row loaded as vectors, and the writes
    /// gathered into vectors; with `at_q`, vector `c` is `lane + q * width`. The tiled short
    /// rows (`tile`) call it too, their tensors' rows in shared memory.
    pub(super) fn vector_row_step(
        &mut self,
        pass: &Pass,
        axis: DimId,
        cached: &[usize],
        shapes: &[Vec<DimId>],
        at_q: bool,
    ) {
        self.helpers.insert("fz_vec");
        // A total (`OutputInfo::total`) adds each lane to the thread's sum, in no vector.
        let stored: Vec<usize> = (pass.writes.iter().copied())
            .filter(|&o| !self.k.outputs[o].total)
            .collect();
        for &o in &stored {
            let (t, l) = (self.vector_type(o), self.step_lanes);
            self.line(format!("fz_vec<{t}, {l}> s{o};"));
        }
        // Vector `c`: with `at_q` (a cached pass) `c = lane + q * width`, added so that the
        // unrolled `q`s share one address plus constant offsets where `width` is a constant.
        let at = match (at_q, &self.tail) {
            (true, _) => " + lane + q * width",
            (false, None) => " + c",
            (false, Some(_)) => " + fz_cl",
        };
        let peel = if self.peeled { " + fz_h" } else { "" };
        // Other tensors contiguous along the row (gamma, beta) load four at a time too. In the
        // row-a-block loop and light rows' loops, these loads ask L2 to evict their lines last
        // (`fz_keep`), as the row's own loads or bulk copies do; so do the writes of rows
        // copied ahead: W5 and W8 a point faster on the H200, W6 half a point, before the bulk
        // copies. Rows of 1024 copied ahead lost a point with it, and long rows at 32768 ten,
        // whose copies are asked into L2 ahead (NOTES item 53). Light rows, whose own loads
        // ask it, write plainly: W5 and W8 0.8% faster than with their writes kept too, and
        // 0.6% faster than with them evicted first (item 59).
        let vectors = self.row_vectors(pass, axis, cached);
        let keep = self.treats_rows_whole();
        let keep_writes = self.whole_rows && !self.direct_rows;
        if (keep && !vectors.is_empty()) || (keep_writes && !pass.writes.is_empty()) {
            self.helpers.insert("fz_keep");
        }
        for &p in &vectors {
            let param = &self.k.params[p];
            let (t, name) = self.param_text(p);
            let s = self.shape_index(param.shape.as_ref().expect("a tensor"));
            let v = self.step_lanes;
            let from =
                format!("reinterpret_cast<const fz_vec<{t}, {v}>*>(p_{name} + b{s}{peel}){at}");
            self.line(match keep {
                true => format!("const fz_vec<{t}, {v}> lv_{name} = fz_ld_keep({from});"),
                false => format!("const fz_vec<{t}, {v}> lv_{name} = *({from});"),
            });
        }
        if self.in_shared {
            for &p in cached {
                let (t, name) = self.param_text(p);
                self.line(format!(
                    "const fz_vec<{t}, 4> rc_{name} = pf_{name}[buf][q * {BLOCK} + threadIdx.x];"
                ));
            }
        }
        if let Some(test) = self.tail.clone() {
            self.open(format!("if ({test})"));
        }
        let mut in_registers = cached.to_vec();
        in_registers.extend(&vectors);
        // In a row a block's pass that only writes (and a light row's, a tiled short row's or a
        // long row's), a division by a row's value takes the fast path alone, noting whether
        // any of the four dividends left its range; then, rarely, the four lanes again with the
        // checked division (`fz_div_by`), over the same `s<o>`. This saves the branch and its
        // reconvergence around every division. (In the segmented loop of heavier rows ptxas
        // spilled one kernel or another at their register bounds.)
        let deferred = (self.treats_rows_whole() || self.defers_division)
            && pass.reduces.is_empty()
            && pass.elems.iter().any(|&id| {
                matches!(self.k.nodes[id].op, Op::Binary(BinOp::Div, _, b) if self.uniform_divisors.contains(&b))
            });
        if deferred {
            self.helpers.insert("fz_div_fast");
            self.line("bool fz_bad = false;");
        }
        if self.row_randoms {
            self.draw_lane_randoms(pass, axis);
        }
        self.fast_division = deferred;
        let packable = (at_q || self.rows_at_q) && vectors.is_empty();
        match self.packed_reduction(pass, cached, packable) {
            Some(line) => self.line(line),
            None => {
                let packed = packable.then_some(cached);
                self.four_lanes(pass, axis, &in_registers, shapes, &vectors, packed);
            }
        }
        self.fast_division = false;
        if deferred {
            self.open("if (fz_bad)");
            self.four_lanes(pass, axis, &in_registers, shapes, &vectors, None);
            self.close();
        }
        self.lane_randoms.clear();
        for &o in &stored {
            let out = &self.k.outputs[o];
            let (t, s) = (out.elem.c_storage(), self.shape_index(&out.shape));
            let l = self.step_lanes;
            if out.partial.is_some() && self.partials_in_shared {
                // A long row's block, its part's sums in shared memory (`c` the vector's place
                // in the row, the part starting on a whole vector).
                self.line(format!(
                    "fz_vec<{t}, {l}>& fz_pp{o} = reinterpret_cast<fz_vec<{t}, {l}>*>(sp{o})[c - begin / {l}];"
                ));
                self.line("#pragma unroll");
                self.line(format!(
                    "for (int j = 0; j < {l}; ++j) fz_pp{o}.v[j] += s{o}.v[j];"
                ));
                continue;
            }
            if out.partial.is_some() && self.partials_in_registers {
                self.line("#pragma unroll");
                self.line(format!(
                    "for (int j = 0; j < {l}; ++j) pa{o}[q].v[j] += s{o}.v[j];"
                ));
                continue;
            }
            if out.partial.is_some() {
                // The block's partial sums at these elements (`OutputInfo::partial`): its first
                // row stores, later ones add.
                self.open("");
                self.line(format!(
                    "fz_vec<{t}, {l}>* const fz_pp = reinterpret_cast<fz_vec<{t}, {l}>*>(out{o} + (long long)blockIdx.x * len){at};"
                ));
                self.open("if (g0 != blockIdx.x)");
                self.line(format!("const fz_vec<{t}, {l}> fz_po = *fz_pp;"));
                self.line("#pragma unroll");
                self.line(format!(
                    "for (int j = 0; j < {l}; ++j) s{o}.v[j] += fz_po.v[j];"
                ));
                self.close();
                self.line(format!("*fz_pp = s{o};"));
                self.close();
                continue;
            }
            let to = format!(
                "reinterpret_cast<fz_vec<{t}, {}>*>(out{o} + b{s}{peel}){at}",
                self.step_lanes
            );
            let bits = self.vector_bits(o, !cached.is_empty() && vectors.is_empty());
            self.line(match keep_writes {
                true => format!("fz_st_keep({to}, {bits});"),
                false => format!("*({to}) = {bits};"),
            });
        }
        if self.tail.is_some() {
            self.close();
        }
    }

    /// Before the lanes of a row's vector step (vector `c` of a row whose length is a multiple
    /// of the lanes): for each random value along the row, the Philox blocks of its lanes, four
    /// lanes a block as the elementwise loops draw them (`fz_rand` of each lane drew a block
    /// for one word: G8's backward ran at 36% of copy speed on an H100).
    fn draw_lane_randoms(&mut self, pass: &Pass, axis: DimId) {
        let l = self.step_lanes;
        for id in self.pass_elems(pass) {
            let Op::Random(_, seed, site) = self.k.nodes[id].op else {
                continue;
            };
            if self.k.nodes[id].shape.last() != Some(&axis) {
                continue;
            }
            self.line(format!("fz_u4 rq{id}[{}];", l / 4));
            for b in 0..l / 4 {
                self.open("");
                let chunk = self.chunk_start();
                self.line(format!("const long long r = {chunk}c * {l} + {};", 4 * b));
                let at = self.position(id, Scope::Element);
                self.line(format!(
                    "rq{id}[{b}] = fz_philox(rk{seed}, ({at}) >> 2, {site}u);"
                ));
                self.close();
            }
            self.lane_randoms.push(id);
        }
    }

    /// The lanes of a vector step, written out: a `#pragma unroll`ed lane loop made ptxas
    /// spill. `vectors` are the step's `lv_<name>`.
    ///
    /// A test of an element's position against a row's value (`index(v) as i64 == label`, a
    /// one-hot pick) holds in at most one lane: where the value is outside the vector's
    /// positions, which is nearly every step, the lanes take it as settled (`settled_tests`),
    /// on a path of their own, and the selects it makes fold away. In a bf16 cross-entropy's
    /// forward and backward that test and its select were three instructions an element in
    /// the passes that take the label (benches/NOTES.md item 131). There, with `packed` (the
    /// cached tensors, in registers), the reductions `packed_in_lanes` finds take their vector
    /// at once, before the lanes: the settled select left a bf16 cross-entropy's first pass
    /// converting each element for its max alone.
    fn four_lanes(
        &mut self,
        pass: &Pass,
        axis: DimId,
        in_registers: &[usize],
        shapes: &[Vec<DimId>],
        vectors: &[usize],
        packed: Option<&[usize]>,
    ) {
        // Not in the wide cached rows' steps, whose twice-written lanes spilled (the derived
        // cross-entropies' gradients, 4 bytes on sm_80 and sm_90).
        let tests = match self.path {
            Path::RowsCachedWide => vec![],
            _ => self.position_tests(pass, axis),
        };
        if tests.is_empty() {
            return self.vector_lanes(pass, axis, in_registers, shapes, vectors);
        }
        let (v, first) = (self.step_lanes, self.lane_position("0"));
        let outside: Vec<String> = tests
            .iter()
            .map(|&(_, value, _)| {
                format!(
                    "((unsigned long long)v{value} >> 32 != 0ull || (unsigned int)v{value} - (unsigned int)({first}) >= {v}u)"
                )
            })
            .collect();
        self.open(format!("if ({})", outside.join(" && ")));
        self.settled_tests = tests
            .iter()
            .map(|&(test, _, missed)| (test, missed))
            .collect();
        for (r, line) in packed.map_or(vec![], |cached| self.packed_in_lanes(pass, cached)) {
            self.line(line);
            self.packed_reductions.push(r);
        }
        self.vector_lanes(pass, axis, in_registers, shapes, vectors);
        self.packed_reductions.clear();
        self.settled_tests.clear();
        self.close();
        self.open("else");
        self.vector_lanes(pass, axis, in_registers, shapes, vectors);
        self.close();
    }

    /// The tests of `pass` that compare an element's position along `axis` (`index(axis)`,
    /// through casts that keep its value) with a row's integer value, each with that value and
    /// what the test gives where the value is none of the vector's positions: `==` false, `!=`
    /// true. The value is one of the row's (`Scope::Row`), in scope before the step.
    fn position_tests(&self, pass: &Pass, axis: DimId) -> Vec<(NodeId, NodeId, bool)> {
        let k = self.k;
        let plan = self.plan;
        // Positions are `u32`s: any cast among these keeps them.
        let keeps = |e: Elem| matches!(e, Elem::U32 | Elem::U64 | Elem::I64);
        let position = |mut n: NodeId| loop {
            if !keeps(k.nodes[n].elem()) {
                return false;
            }
            match k.nodes[n].op {
                Op::Index(d) => return d == axis,
                Op::Cast(a) => n = a,
                _ => return false,
            }
        };
        let of_row = |n: NodeId| {
            keeps(k.nodes[n].elem())
                && (plan.prologue.contains(&n) || plan.passes.iter().any(|p| p.after.contains(&n)))
        };
        let mut found = vec![];
        for id in self.pass_elems(pass) {
            let Op::Binary(op @ (BinOp::Eq | BinOp::Ne), a, b) = k.nodes[id].op else {
                continue;
            };
            let value = match (position(a), position(b)) {
                (true, false) if of_row(b) => b,
                (false, true) if of_row(a) => a,
                _ => continue,
            };
            found.push((id, value, op == BinOp::Ne));
        }
        found
    }

    /// The lanes of a vector step (`four_lanes`), with the tests settled there if any. Values
    /// the lanes share where their row's divisors allow (`lane_invariants`) come first, once,
    /// on a path of their own.
    fn vector_lanes(
        &mut self,
        pass: &Pass,
        axis: DimId,
        in_registers: &[usize],
        shapes: &[Vec<DimId>],
        vectors: &[usize],
    ) {
        let v = self.step_lanes;
        let (invariant, quotients) = self.lane_invariants(pass, axis);
        if !quotients.is_empty() {
            // Where every divisor is a multiple of the lanes, the quotients of the vector's
            // positions, and what they pick, are the same in each lane: computed once.
            let tests: Vec<String> = quotients
                .iter()
                .map(|&(_, b)| format!("v{b} % {v} == 0"))
                .collect();
            self.open(format!("if ({})", tests.join(" && ")));
            for &id in &invariant {
                match quotients.iter().find(|&&(q, _)| q == id) {
                    Some(&(_, b)) => {
                        let e = self.k.nodes[id].elem();
                        let first = match self.hoisted_positions {
                            true => format!("(({})fz_pos[q * {v}])", e.c_name()),
                            false => format!("(({})(c * {v}))", e.c_name()),
                        };
                        let quotient = self.binary(BinOp::Div, e, &first, &format!("v{b}"));
                        self.line(format!("const {} v{id} = {quotient};", e.c_name()));
                    }
                    None => self.values(&[id], Scope::Element),
                }
            }
            self.lane_invariant = invariant;
            self.lanes(pass, axis, in_registers, shapes, vectors);
            self.lane_invariant.clear();
            self.close();
            self.open("else");
        }
        self.lanes(pass, axis, in_registers, shapes, vectors);
        if !quotients.is_empty() {
            self.close();
        }
    }

    /// The values of `pass` that are the same in each lane of a vector (of `step_lanes`
    /// consecutive positions from a multiple of them) wherever the divisors found are multiples
    /// of the lanes, in the order computed, and those quotients of a position by a row's
    /// unsigned value, each with its divisor: `index((c, s)) / len(s)`, the channel of a
    /// GroupNorm's element, and the weight gathered by it, each read once a vector rather than
    /// once an element (the division, a bounds test and a load each). None without such a
    /// quotient. (A row a block's positions `fz_pos[q * 4 + j]` are consecutive too.)
    fn lane_invariants(&self, pass: &Pass, axis: DimId) -> (Vec<NodeId>, Vec<(NodeId, NodeId)>) {
        let k = self.k;
        let elems = self.pass_elems(pass);
        let mut invariant: Vec<NodeId> = vec![];
        let mut quotients = vec![];
        for &id in &elems {
            let node = &k.nodes[id];
            // A value read from where an earlier pass stored it is read lane by lane.
            if self.reuse.is_some_and(|(reused, _)| reused == id) {
                continue;
            }
            let known = |n: NodeId| !elems.contains(&n) || invariant.contains(&n);
            let same = match &node.op {
                Op::Binary(BinOp::Div, a, b)
                    if matches!(k.nodes[*a].op, Op::Index(d) if d == axis)
                        && node.elem().is_int()
                        && !node.elem().is_signed_int()
                        && !elems.contains(b) =>
                {
                    quotients.push((id, *b));
                    true
                }
                // Moved along the axis by its gathered indices alone.
                Op::View(_, view) => {
                    let along = node.shape.iter().position(|&d| d == axis);
                    along.is_none_or(|i| view.strides[i].is_empty())
                        && view.gathers.iter().all(|g| known(g.index))
                }
                Op::Unary(..) | Op::Binary(..) | Op::Cast(_) | Op::Select(..) => {
                    node.op.operands().into_iter().all(known)
                }
                _ => false,
            };
            if same {
                invariant.push(id);
            }
        }
        if quotients.is_empty() {
            invariant.clear();
        }
        (invariant, quotients)
    }

    /// The position along the row of lane `j` of the current vector step, `r` in its block.
    fn lane_position(&self, j: &str) -> String {
        let v = self.step_lanes;
        match (self.hoisted_positions, self.peeled) {
            (true, _) => format!("fz_pos[q * {v} + {j}]"),
            (false, true) => format!("fz_h + c * {v} + {j}"),
            (false, false) => format!("c * {v} + {j}"),
        }
    }

    /// A vector step's lanes, one block each.
    fn lanes(
        &mut self,
        pass: &Pass,
        axis: DimId,
        in_registers: &[usize],
        shapes: &[Vec<DimId>],
        vectors: &[usize],
    ) {
        let v = self.step_lanes;
        for j in 0..v {
            self.open("");
            self.line(format!("const int j = {j};"));
            self.line(format!("const long long r = {};", self.lane_position("j")));
            self.row_vectors_now = vectors.to_vec();
            self.row_step(pass, axis, in_registers, shapes, true);
            self.row_vectors_now.clear();
            if let Some(n) = self.stash {
                self.line(format!("fz_st.v[j] = v{n};"));
            }
            self.close();
        }
    }

    /// A cached pass that only takes the largest (smallest) element of a 16-bit row, as a
    /// softmax's first pass does, over vector `rc_<name>[q]` at once (`fz_max_bf16`: two
    /// elements an instruction in their own type, where `four_lanes` converts each to f32
    /// first); `None` for any other pass. With it and the NaN test left out of softmax's stores
    /// (`canonical_nans`), S2's bf16 softmax ran 3-5% of copy speed faster on an H200
    /// (benches/NOTES.md item 99).
    fn packed_reduction(
        &mut self,
        pass: &Pass,
        cached: &[usize],
        in_registers: bool,
    ) -> Option<String> {
        let &[r] = pass.reduces.as_slice() else {
            return None;
        };
        let (load, operand, line) = self.packed_line(r, cached, in_registers)?;
        let elems = self.pass_elems(pass);
        let alone = elems.contains(&operand)
            && elems.iter().all(|n| [load, operand].contains(n))
            && pass.writes.is_empty();
        alone.then_some(line)
    }

    /// The reductions of `pass` (of several) that `packed_line` can take a vector at once,
    /// with their lines, for the lanes of `four_lanes` whose position tests are settled.
    fn packed_in_lanes(&mut self, pass: &Pass, cached: &[usize]) -> Vec<(NodeId, String)> {
        if pass.reduces.len() < 2 {
            return vec![];
        }
        pass.reduces
            .iter()
            .filter_map(|&r| Some((r, self.packed_line(r, cached, true)?.2)))
            .collect()
    }

    /// Reduction `r` over vector `rc_<name>[q]` at once where it takes the largest (smallest)
    /// element of a cached 16-bit row, or of its exact conversion to f32, into an f32
    /// accumulator: the row's load, the operand, and the line; `None` otherwise.
    fn packed_line(
        &mut self,
        r: NodeId,
        cached: &[usize],
        in_registers: bool,
    ) -> Option<(NodeId, NodeId, String)> {
        let (op, e) = self.reduction(r);
        let Op::Reduce(_, operand, _) = self.k.nodes[r].op else {
            return None;
        };
        // The row itself, or its exact conversion to f32 (cross-entropy's `z as f32`).
        let load = match self.k.nodes[operand].op {
            Op::Cast(a) if self.k.nodes[operand].elem() == Elem::F32 => a,
            _ => operand,
        };
        let Op::Load(p) = self.k.nodes[load].op else {
            return None;
        };
        let elem = self.k.params[p].elem;
        let (ty, packed) = match elem {
            Elem::BF16 => ("bf16", "fz_vec_minmax_bf16"),
            Elem::F16 => ("f16", "fz_vec_minmax_f16"),
            _ => return None,
        };
        let name = match op {
            Reduce::Max => "max",
            Reduce::Min => "min",
            _ => return None,
        };
        let plain = self.stash.is_none() && self.reuse.is_none() && !self.in_shared;
        if !(in_registers && plain && e == Elem::F32 && cached.contains(&p)) {
            return None;
        }
        if !self.step_lanes.is_multiple_of(2) || self.k.draws_random() {
            return None;
        }
        self.helpers.insert(narrow_helpers(elem).0);
        self.helpers.insert(packed);
        let (_, param) = self.param_text(p);
        let line = format!("acc{r} = fz_{name}_{ty}(acc{r}, rc_{param}[q]);");
        Some((load, operand, line))
    }

    /// The tensors of `pass` besides the `cached` ones that are contiguous along the row (the
    /// reduced dim is their last): in a cached pass they load as vectors `lv_<name>`.
    pub(super) fn row_vectors(&self, pass: &Pass, axis: DimId, cached: &[usize]) -> Vec<usize> {
        let mut found = vec![];
        for id in self.pass_elems(pass) {
            if let Op::Load(p) = self.k.nodes[id].op {
                let shape = self.k.params[p].shape.as_ref().expect("a tensor");
                if shape.last() == Some(&axis) && !cached.contains(&p) && !found.contains(&p) {
                    found.push(p);
                }
            }
        }
        found
    }

    /// The values a step of `pass` computes: all of them, or with a value read from where an
    /// earlier pass stored it (`reuse`), those its reductions and writes need besides.
    fn pass_elems(&self, pass: &Pass) -> Vec<NodeId> {
        match self.reuse {
            Some((reused, _)) => needed(self.k, pass, reused),
            None => pass.elems.clone(),
        }
    }

    /// One element of a row pass at `r`: offsets, values, accumulation and writes; with `cached`
    /// tensors in registers (`rc_<name>[q].v[j]` or `lv_<name>.v[j]`), and with `gather` the
    /// writes into vectors `s<o>`.
    pub(super) fn row_step(
        &mut self,
        pass: &Pass,
        axis: DimId,
        cached: &[usize],
        shapes: &[Vec<DimId>],
        gather: bool,
    ) {
        let elems = self.pass_elems(pass);
        let loads: Vec<NodeId> = elems
            .iter()
            .copied()
            .filter(|&id| !matches!(self.k.nodes[id].op, Op::Load(p) if cached.contains(&p)))
            .collect();
        let writes: &[usize] = if gather { &[] } else { &pass.writes };
        for s in self.used_shapes(&loads, writes) {
            let offset = self.layout.row_offset(s, &shapes[s], axis);
            self.line(format!("const long long o{s} = {offset};"));
        }
        self.cached = cached.to_vec();
        let lanes: Vec<NodeId> = elems
            .iter()
            .copied()
            .filter(|id| !self.lane_invariant.contains(id))
            .collect();
        self.values(&lanes, Scope::Element);
        self.cached.clear();
        let reduces: Vec<NodeId> = pass
            .reduces
            .iter()
            .copied()
            .filter(|r| !self.packed_reductions.contains(r))
            .collect();
        self.accumulate(&reduces);
        if !gather {
            self.writes(&pass.writes, Scope::Element);
        } else {
            for &o in &pass.writes {
                if self.k.outputs[o].total {
                    self.writes(&[o], Scope::Element);
                    continue;
                }
                let v = self.vector_element(o);
                self.line(format!("s{o}.v[j] = {v};"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::plan::rows::{cached_params, direct_row_cost, element_cost};
    use crate::plan::Path;
    use crate::testing::{entry_source, kernel};
    use quote::quote;

    /// The text of `tokens`' row-a-block entry for rows of exactly 4096.
    fn exact_rows(tokens: proc_macro2::TokenStream) -> String {
        entry_source(tokens, Path::RowBlockExact)
    }

    /// The streamed rows peel where every tensor along the row is of the domain: a bf16
    /// softmax's vectors of four from each row's first whole one, its stores too; not a
    /// layernorm's, whose gamma along the row starts on a whole vector where the row may not,
    /// nor a pass that draws random values. Rows of 2-byte elements peel at every length, f32
    /// rows only where the length is no multiple of four.
    #[test]
    fn rows_peel_where_every_tensor_along_them_is_of_the_domain() {
        let general = |tokens| entry_source(tokens, Path::Rows);
        let softmax = general(quote! {
            fn s(x: [bf16; r, c]) -> [bf16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        assert_eq!(
            softmax
                .matches("const long long fz_to = (-b0) & 3;")
                .count(),
            3,
            "{softmax}"
        );
        assert!(
            softmax.contains("const long long r = fz_h + c * 4 + j;"),
            "{softmax}"
        );
        assert!(
            softmax.contains("reinterpret_cast<fz_vec<unsigned short, 4>*>(out0 + b0 + fz_h) + c"),
            "{softmax}"
        );
        // Rows of 2-byte elements peel at every length: no loop for the others.
        assert!(!softmax.contains("if ((len & 3) == 0)"), "{softmax}");
        let sum = |elem| general(quote! { fn r(x: [#elem; r, c]) -> [#elem; r] { sum(x, c) } });
        let narrow = sum(quote!(bf16));
        assert!(!narrow.contains("(len & 7) == 0"), "{narrow}");
        assert!(narrow.contains("fz_c += 4 * width"), "{narrow}");
        // f32 rows keep their loop for lengths of whole vectors, ptxas's to unroll, beside the
        // peeled one two vectors a step.
        let wide = sum(quote!(f32));
        assert!(wide.contains("if ((len & 3) == 0)"), "{wide}");
        assert!(wide.contains("for (long long c = lane; c < (len >> 2); c += width)"));
        assert!(wide.contains("for (; fz_c + 1 * width < fz_nv; fz_c += 2 * width)"));
        let layernorm = general(quote! {
            fn l(x: [bf16; r, c], g: [bf16; c]) -> [bf16; r, c] {
                let d = x - mean(x, c);
                d * rsqrt(mean(d * d, c) + 1e-5) * g
            }
        });
        assert!(!layernorm.contains("fz_h"), "{layernorm}");
        let dropout = general(quote! {
            fn d(x: [f32; r, c], seed: u64) -> [f32; r, c] { dropout(x - max(x, c), 0.5, seed) }
        });
        // The maximum's pass peels; the pass that draws does not.
        assert_eq!(dropout.matches("fz_to = ").count(), 1, "{dropout}");
        assert!(dropout.contains("for (long long r = lane; live && r < len; r += width)"));
    }

    /// A one-hot pick's test of a position against a row's label is settled where the label is
    /// none of the vector's positions, in every row path's vector step; tests that can hold in
    /// more than one lane, or of a position cast to fewer bits, are not.
    #[test]
    fn position_tests_settle_outside_the_vector() {
        let settled = |text: &str, value: &str| {
            text.lines()
                .map(str::trim)
                .any(|l| l.starts_with("const bool v") && l.ends_with(&format!(" = {value};")))
        };
        for path in [
            Path::RowsCached,
            Path::RowBlockExact,
            Path::RowBlock,
            Path::Rows,
            Path::LongRows,
        ] {
            let text = entry_source(
                quote! {
                    fn ce(x: [bf16; r, c], label: [i64; r]) -> [f32; r] {
                        let x = x as f32;
                        logsumexp(x, c) - sum(if index(c) as i64 == label { x } else { 0.0 }, c)
                    }
                },
                path,
            );
            assert!(
                text.contains("(unsigned long long)v1 >> 32 != 0ull ||"),
                "{text}"
            );
            assert!(settled(&text, "false"), "{text}");
            let text = entry_source(
                quote! {
                    fn ne(x: [f32; r, c], label: [u32; r]) -> [f32; r, c] {
                        (if index(c) != label { x } else { 0.0 }) / sum(x, c)
                    }
                },
                path,
            );
            assert!(settled(&text, "true"), "{path:?}: {text}");
        }
        for unsettled in [
            quote! {
                fn lt(x: [f32; r, c], label: [i64; r]) -> [f32; r, c] {
                    x / sum(if (index(c) as i64) < label { x } else { 0.0 }, c)
                }
            },
            quote! {
                fn narrow(x: [f32; r, c], label: [i32; r]) -> [f32; r, c] {
                    x / sum(if index(c) as i32 == label { x } else { 0.0 }, c)
                }
            },
            quote! {
                fn each(x: [f32; r, c], label: [i64; r, c]) -> [f32; r, c] {
                    x / sum(if index(c) as i64 == label { x } else { 0.0 }, c)
                }
            },
        ] {
            let text = entry_source(unsettled, Path::RowsCached);
            assert!(!settled(&text, "false"), "{text}");
        }
    }

    /// Where a one-hot pick's test is settled, a 16-bit cross-entropy's first pass takes its
    /// row's max two elements an instruction before the lanes (`packed_in_lanes`), which no
    /// longer take it; where the label may be in the vector, the lanes take it as before.
    #[test]
    fn settled_lanes_take_the_max_packed() {
        for (ty, f) in [(quote!(bf16), "fz_max_bf16"), (quote!(f16), "fz_max_f16")] {
            for path in [
                Path::RowsCached,
                Path::RowBlockExact,
                Path::RowBlock,
                Path::LongRows,
            ] {
                let text = entry_source(
                    quote! {
                        fn ce(x: [#ty; r, c], label: [i64; r]) -> [f32; r] {
                            let x = x as f32;
                            logsumexp(x, c) - sum(if index(c) as i64 == label { x } else { 0.0 }, c)
                        }
                    },
                    path,
                );
                let lines: Vec<&str> = text.lines().map(str::trim).collect();
                let packed = lines
                    .iter()
                    .position(|l| l.starts_with(&format!("acc3 = {f}(acc3, rc_x[q]);")))
                    .unwrap_or_else(|| panic!("{path:?}: {text}"));
                assert!(lines[packed - 1].contains(">> 32 != 0ull ||"), "{text}");
                // The settled lanes leave the max out; the others keep it, each lane.
                let settled = &lines[packed..];
                let settled = &settled[..settled.iter().position(|l| *l == "else {").unwrap()];
                let unpacked = |l: &[&str]| {
                    l.iter()
                        .filter(|l| l.starts_with("acc3 = fmaxf(acc3, v"))
                        .count()
                };
                assert_eq!(unpacked(settled), 0, "{path:?}: {text}");
                assert!(
                    unpacked(&lines[packed + settled.len()..]) >= 4,
                    "{path:?}: {text}"
                );
            }
        }
    }

    /// Rows of 65 to 128 and 129 to 256 elements that keep f32 slots (a 16-bit softmax's) take
    /// segments of a constant eight and sixteen threads (`plan::rows::SHORT_SEGMENT_WIDTHS`),
    /// whose reductions lose their tests of the width; the general entry, after them, sets its
    /// width when it runs. An f32 softmax's rows and a bf16 RMSNorm's, which keep no slots,
    /// have no such entries.
    #[test]
    fn short_cached_rows_with_slots_take_segments_of_a_constant_width() {
        let labels = |tokens| {
            let k = kernel(tokens);
            let program = crate::plan::program(&k);
            let sources = crate::cuda::sources(&k, &program);
            let entries = program.entries.into_iter().zip(sources);
            entries
                .map(|(e, text)| (e.label(), e.when, text))
                .collect::<Vec<_>>()
        };
        let bf16 = labels(quote! {
            fn s(x: [bf16; r, c]) -> [bf16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        let at = |label: &str| bf16.iter().position(|(l, _, _)| l == label);
        for (label, width, lens) in [
            ("cached_rows_128", 8, (65, 128)),
            ("cached_rows_256", 16, (129, 256)),
        ] {
            let (_, when, text) = &bf16[at(label).unwrap_or_else(|| panic!("no {label}"))];
            assert_eq!((when.min_len, when.max_len), lens, "{label}");
            assert!(
                text.contains(&format!("const int width = {width};")),
                "{text}"
            );
            assert!(text.contains("rs_x[q] = fz_st;"), "{text}");
            assert!(!text.contains("while (width"), "{text}");
            assert!(at(label) < at("cached_rows"), "{label}");
        }
        let (_, when, general) = &bf16[at("cached_rows").unwrap()];
        assert_eq!(when.min_len, 1);
        assert!(
            general.contains("while (width * 16 < len) width <<= 1;"),
            "{general}"
        );
        for other in [
            quote! {
                fn s(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
            },
            quote! {
                fn n(x: [bf16; r, c], w: [bf16; c]) -> [bf16; r, c] {
                    x * rsqrt(mean(x * x, c) + 1e-6) * w
                }
            },
        ] {
            let labels: Vec<String> = labels(other).into_iter().map(|(l, _, _)| l).collect();
            assert!(labels.contains(&"cached_rows".to_string()), "{labels:?}");
            assert!(
                !labels
                    .iter()
                    .any(|l| ["cached_rows_128", "cached_rows_256"].contains(&&**l)),
                "{labels:?}"
            );
        }
    }

    /// The general cached entry's segmented loop keeps a bf16 or f16 softmax's `exp(x - max)`
    /// in f32 slots for its write pass (`narrow_slots`), which divides four lanes by the fast
    /// path and checks them after; not an f32 row's (its slots would be the row's registers),
    /// an fp8 row's, or rows of two tensors.
    #[test]
    fn cached_rows_of_narrow_floats_keep_values_in_f32_slots() {
        let cached = |tokens| entry_source(tokens, Path::RowsCached);
        for elem in [quote!(bf16), quote!(f16)] {
            let softmax = cached(quote! {
                fn s(x: [#elem; r, c]) -> [#elem; r, c] {
                    let e = (x - max(x, c)).exp();
                    e / sum(e, c)
                }
            });
            assert!(softmax.contains("fz_vec<float, 4> rs_x[4];"), "{softmax}");
            assert!(softmax.contains("rs_x[q] = fz_st;"), "{softmax}");
            assert_eq!(softmax.matches("expf(").count(), 4, "{softmax}");
            assert!(
                softmax.contains("fz_div_fast(v3, v4, dv_4, fz_bad)"),
                "{softmax}"
            );
            assert!(softmax.contains("if (fz_bad) {"), "{softmax}");
        }
        for tokens in [
            quote! {
                fn s(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
            },
            quote! {
                fn s(x: [f8e4m3; r, c]) -> [f8e4m3; r, c] {
                    let e = (x - max(x, c)).exp();
                    e / sum(e, c)
                }
            },
            quote! {
                fn d(y: [bf16; r, c], dy: [bf16; r, c]) -> [bf16; r, c] {
                    let p = y * dy;
                    p - y * sum(p, c)
                }
            },
        ] {
            let text = cached(tokens);
            assert!(!text.contains("rs_"), "{text}");
        }
    }

    /// A row a block that loads its rows straight into registers asks L2 for the block's next
    /// row where that was measured faster: rows of 2-byte elements, or of two cached tensors;
    /// not one f32 row, nor beside Philox's rounds.
    #[test]
    fn the_next_row_is_asked_of_l2_where_it_pays() {
        let asks =
            |text: &str| text.contains("fz_prefetch_l2(p_x + b0 + (long long)gridDim.x * len");
        let bf16 = exact_rows(quote! {
            fn s(x: [bf16; r, c]) -> [bf16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        assert!(asks(&bf16), "{bf16}");
        let two = exact_rows(quote! {
            fn d(x: [f32; r, c], dy: [f32; r, c]) -> [f32; r, c] { dy * x - x * sum(dy * x, c) }
        });
        assert!(asks(&two), "{two}");
        assert!(two.contains("fz_prefetch_l2(p_dy + b0"), "{two}");
        let f32 = exact_rows(quote! {
            fn s(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        assert!(!asks(&f32), "{f32}");
        let random = exact_rows(quote! {
            fn s(x: [bf16; r, c], dy: [bf16; r, c], seed: u64) -> [bf16; r, c] {
                dropout(dy * (x - mean(x, c)), 0.1, seed)
            }
        });
        assert!(!asks(&random), "{random}");
    }

    /// The benchmark's row kernels (benches/kernels.rs): their cost an element, and whether a
    /// row a block loads their rows directly.
    #[test]
    fn light_rows_are_loaded_directly_and_heavy_ones_copied_ahead() {
        let cases = [
            (
                "w5",
                kernel(quote! {
                    fn f(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
                }),
            ),
            (
                "w6",
                kernel(quote! {
                    fn f(x: [f32; r, c], g: [f32; c], b: [f32; c]) -> [f32; r, c] {
                        let mu = mean(x, c);
                        let d = x - mu;
                        let rstd = rsqrt(mean(d * d, c) + 1e-5);
                        gelu(d * rstd * g + b)
                    }
                }),
            ),
            (
                "w7",
                kernel(quote! {
                    fn f(x: [f32; r, c], g: [f32; c], b: [f32; c]) -> ([i8; r, c], [f32; r]) {
                        let d = x - mean(x, c);
                        let y = d * rsqrt(mean(d * d, c) + 1e-5) * g + b;
                        let scale = max(y.abs(), c) / 127.0;
                        ((y / scale).round().clamp(-127.0, 127.0) as i8, scale)
                    }
                }),
            ),
            (
                "w8",
                kernel(quote! {
                    fn f(x: [f32; r, c], w: [f32; c]) -> [f32; r, c] { x * rsqrt(mean(x * x, c) + 1e-6) * w }
                }),
            ),
            (
                "w9",
                kernel(quote! {
                    fn f(x: [f32; r, c], label: [i64; r]) -> [f32; r] {
                        logsumexp(x, c) - sum(if index(c) as i64 == label { x } else { 0.0 }, c)
                    }
                }),
            ),
        ];
        let found: Vec<(&str, u32, bool)> = cases
            .iter()
            .map(|(name, k)| {
                let plan = crate::plan::plan(k);
                let cost = element_cost(k, &plan, &cached_params(k, &plan));
                (*name, cost, direct_row_cost(k, &plan).is_some())
            })
            .collect();
        // W5's `exp` is computed once: its write pass divides the value its sum's pass stored.
        // W7 costs less than W6 but reduces in three passes; W9 writes no rows.
        assert_eq!(
            found,
            [
                ("w5", 15, true),
                ("w6", 29, false),
                ("w7", 18, false),
                ("w8", 5, true),
                ("w9", 16, false),
            ]
        );
    }
}
