//! Short rows, tiled: rows of up to [`SHORT`] elements, contiguous in memory, move through
//! shared memory a tile of whole rows at a time, so that every load and store of the tensors
//! over the whole domain is a 16-byte vector and a block has a whole tile's loads in flight.
//!
//! One thread per row with scalar loads (the row path's short case) keeps about eight bytes in
//! flight per thread and runs a row's bookkeeping for every two elements; S1's softmax at two
//! columns reached 47% of copy bandwidth that way. Here a block copies the tile of each tensor
//! over the whole domain into shared memory (all of its loads issued before the first store),
//! runs the row passes there with segments of `width` threads, and stores each output's tile.
//! The path is a function template, `fz_short_rows<width>`, instantiated for the five widths a
//! short row can take, so the shuffle reductions and lane arithmetic are specialized. (NVRTC
//! compiles no lambda in device code without flags that every kernel would then carry.)

use super::super::{Cuda, Scope, BLOCK, SYNTAX};
use crate::ir::DimId;
use crate::plan::{Pass, Plan};

/// The longest row the tiled path takes.
const SHORT: u32 = 32;

/// Shared memory for one block's tiles, in bytes: four blocks of a kernel bounded to four per SM
/// fit in sm_80's 164 KB, and a block has 32 KB of loads in flight while it fills its tile.
const TILE_BYTES: u32 = 32 * 1024;

/// The 16-byte loads a thread has in flight while it copies a tile in: 16 KB a block, and
/// 16 registers, so the copy does not raise the kernel's register count.
const IN_FLIGHT: usize = 4;

/// The fewest elements a tile may hold: 16 rows of the longest short row.
const MIN_TILE: u32 = 16 * SHORT;

/// Elements per tile are a multiple of this, so that each tensor's part of the tile is a whole
/// number of 16-byte vectors per thread step for any element size.
const TILE_STEP: u32 = 256;

/// A tensor over the whole domain that moves through the tile: an input the passes read or an
/// output they write.
struct Tiled {
    /// Its name in the kernel's parameters: `p_<name>` or `out<o>`.
    global: String,
    /// Its element type as memory holds it.
    storage: &'static str,
    /// Bytes per element.
    size: u32,
    input: bool,
}

impl Tiled {
    /// The name of its part of the tile (a pointer to elements of shared memory).
    fn shared(&self) -> String {
        format!("ts_{}", self.global)
    }
}

impl Cuda<'_> {
    /// Where the rows are contiguous (the reduced dim is the domain's last) and their tiles fit,
    /// emits the tiled path for rows of 1 to [`SHORT`] elements, which returns when done; other
    /// lengths continue to the code after it. Rows of length 0 take the general path.
    pub(super) fn short_rows(&mut self, domain: &[DimId], axis: DimId, plan: &Plan) {
        if domain.last() != Some(&axis) {
            return;
        }
        let tiled = self.tiled_tensors(domain, plan);
        let bytes: u32 = tiled.iter().map(|t| t.size).sum();
        if bytes == 0 {
            return;
        }
        let tile = TILE_BYTES / bytes / TILE_STEP * TILE_STEP;
        if tile < MIN_TILE {
            return;
        }
        self.helpers.insert("fz_vec");
        let args: Vec<String> = self.param_names();
        self.short_rows_function(domain, axis, plan, &tiled, tile);
        self.line(format!(
            "// Rows of up to {SHORT} elements: tiles of whole rows through shared memory."
        ));
        self.open(format!("if (len >= 1 && len <= {SHORT})"));
        self.line(format!(
            "__shared__ fz_vec<unsigned int, 4> fz_tile[{}];",
            tile * bytes / 16
        ));
        // Threads per row: the fewest that take at most two elements each. With two, a warp's
        // accesses to a tile's rows meet at most two to a shared-memory bank.
        let args = args.join(", ");
        self.line(format!("if (len <= 2) fz_short_rows<1>({args}, fz_tile);"));
        for w in [2, 4, 8] {
            self.line(format!(
                "else if (len <= {}) fz_short_rows<{w}>({args}, fz_tile);",
                2 * w
            ));
        }
        self.line(format!("else fz_short_rows<16>({args}, fz_tile);"));
        self.line("return;");
        self.close();
    }

    /// The names of the kernel's parameters, in order.
    fn param_names(&self) -> Vec<String> {
        self.params()
            .lines()
            .filter_map(|l| l.trim().trim_end_matches(',').rsplit(' ').next())
            .map(str::to_string)
            .collect()
    }

    /// Writes `fz_short_rows<width>`, the tiled path for `width` threads a row, into the
    /// kernel's functions: it takes the kernel's parameters and the block's tile.
    fn short_rows_function(
        &mut self,
        domain: &[DimId],
        axis: DimId,
        plan: &Plan,
        tiled: &[Tiled],
        tile: u32,
    ) {
        let (kernel_body, kernel_indent) = (std::mem::take(&mut self.out), self.indent);
        self.indent = 1;
        let rows: Vec<DimId> = domain.iter().copied().filter(|&d| d != axis).collect();
        self.line(format!(
            "const long long groups = {};",
            self.layout.product(&rows)
        ));
        self.line(format!("const long long len = {};", self.layout.size(axis)));
        self.divisors(&rows);
        self.reciprocals(plan, "len");
        self.tile_memory(tiled, tile);
        self.shared_reduction_buffers(plan);
        self.line(format!("const int per_block = {BLOCK} / width;"));
        self.line("const int lane = threadIdx.x & (width - 1);");
        // Whole segments of rows per tile, at least 16 rows, so every tile starts 16-byte
        // aligned in every tensor whatever its element size.
        self.line(format!(
            "const int fz_tile_rows = ({tile} / (int)len) / per_block * per_block;"
        ));
        self.open("for (long long fz_t0 = (long long)blockIdx.x * fz_tile_rows; fz_t0 < groups; fz_t0 += (long long)gridDim.x * fz_tile_rows)");
        self.line("const int fz_rows_here = groups - fz_t0 < fz_tile_rows ? (int)(groups - fz_t0) : fz_tile_rows;");
        self.line("const int fz_n = fz_rows_here * (int)len;");
        self.line("const long long fz_e0 = fz_t0 * len;");
        self.copy_in(tiled, tile);
        self.line("__syncthreads();");
        self.tile_row_passes(domain, axis, plan, tiled);
        self.line("__syncthreads();");
        self.copy_out(tiled, tile);
        self.close();
        let body = std::mem::replace(&mut self.out, kernel_body);
        self.indent = kernel_indent;
        let params: Vec<String> = self
            .params()
            .lines()
            .map(|l| l.trim().trim_end_matches(',').to_string())
            .collect();
        // The parameters on one line: the emulator reads the kernel's from the first
        // function whose parameters start on a line of their own.
        self.functions.push_str(&format!(
            "template <int width>\nstatic __device__ __forceinline__ void fz_short_rows({}, fz_vec<unsigned int, 4>* __restrict__ fz_tile) {{\n{body}}}\n",
            params.join(", ")
        ));
    }

    /// The tensors over the whole domain that the tile carries: inputs that some pass reads,
    /// then outputs.
    fn tiled_tensors(&self, domain: &[DimId], plan: &Plan) -> Vec<Tiled> {
        let read = |p: usize| {
            plan.passes
                .iter()
                .flat_map(|pass| &pass.elems)
                .any(|&id| matches!(self.k.nodes[id].op, crate::ir::Op::Load(q) if q == p))
        };
        let inputs = self
            .k
            .tensor_params()
            .filter(|&(i, _, s)| s.as_slice() == domain && read(i))
            .map(|(_, p, _)| Tiled {
                global: format!("p_{}", crate::expand::plain_name(&p.name)),
                storage: p.elem.c_storage(),
                size: p.elem.bits() / 8,
                input: true,
            });
        let outputs = self
            .k
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| o.shape.as_slice() == domain)
            .map(|(i, o)| Tiled {
                global: format!("out{i}"),
                storage: o.elem.c_storage(),
                size: o.elem.bits() / 8,
                input: false,
            });
        inputs.chain(outputs).collect()
    }

    /// Each tensor's part of the block's tile (`tile` elements, one part after another), and
    /// whether every tensor starts 16-byte aligned, as the vector copies need.
    fn tile_memory(&mut self, tiled: &[Tiled], tile: u32) {
        let mut at = 0;
        for t in tiled {
            self.line(format!(
                "{}* const {} = reinterpret_cast<{}*>(fz_tile + {});",
                t.storage,
                t.shared(),
                t.storage,
                at / 16
            ));
            at += t.size * tile;
        }
        let addresses: Vec<String> = tiled
            .iter()
            .map(|t| format!("(unsigned long long){}", t.global))
            .collect();
        self.line(format!(
            "const bool fz_aligned = (({}) & 15) == 0;",
            addresses.join(" | ")
        ));
    }

    /// Copies this tile of each input into shared memory: the whole 16-byte vectors (none when
    /// a tensor is misaligned), [`IN_FLIGHT`] loads a thread issued before their stores, then
    /// the elements after the last whole vector one by one.
    fn copy_in(&mut self, tiled: &[Tiled], tile: u32) {
        let mut steps = vec![];
        for (k, t) in tiled.iter().enumerate().filter(|(_, t)| t.input) {
            self.line(format!(
                "const int fz_nv{k} = fz_aligned ? (fz_n * {}) >> 4 : 0;",
                t.size
            ));
            let count = (tile * t.size / 16).div_ceil(BLOCK);
            steps.extend((0..count).map(|i| (k, t, i * BLOCK)));
        }
        for round in steps.chunks(IN_FLIGHT) {
            self.open("");
            self.line(format!("fz_vec<unsigned int, 4> fz_ld[{}];", round.len()));
            for (j, &(k, t, at)) in round.iter().enumerate() {
                self.line(format!("if (threadIdx.x + {at} < fz_nv{k}) fz_ld[{j}] = reinterpret_cast<const fz_vec<unsigned int, 4>*>({} + fz_e0)[threadIdx.x + {at}];", t.global));
            }
            for (j, &(k, t, at)) in round.iter().enumerate() {
                self.line(format!("if (threadIdx.x + {at} < fz_nv{k}) reinterpret_cast<fz_vec<unsigned int, 4>*>({})[threadIdx.x + {at}] = fz_ld[{j}];", t.shared()));
            }
            self.close();
        }
        for (k, t) in tiled.iter().enumerate().filter(|(_, t)| t.input) {
            self.scalar_tail(
                k,
                t,
                &format!("{}[e] = {}[fz_e0 + e];", t.shared(), t.global),
            );
        }
    }

    /// Stores this tile of each output from shared memory: whole 16-byte vectors, then the
    /// elements after the last one.
    fn copy_out(&mut self, tiled: &[Tiled], tile: u32) {
        for (k, t) in tiled.iter().enumerate().filter(|(_, t)| !t.input) {
            let steps = (tile * t.size / 16).div_ceil(BLOCK);
            self.line(format!(
                "const int fz_nv{k} = fz_aligned ? (fz_n * {}) >> 4 : 0;",
                t.size
            ));
            self.line("#pragma unroll");
            self.open(format!("for (int i = 0; i < {steps}; ++i)"));
            self.line(format!("const int v = threadIdx.x + i * {BLOCK};"));
            self.line(format!("if (v < fz_nv{k}) reinterpret_cast<fz_vec<unsigned int, 4>*>({} + fz_e0)[v] = reinterpret_cast<const fz_vec<unsigned int, 4>*>({})[v];", t.global, t.shared()));
            self.close();
            self.scalar_tail(
                k,
                t,
                &format!("{}[fz_e0 + e] = {}[e];", t.global, t.shared()),
            );
        }
    }

    /// The elements of tensor `k` after its last whole 16-byte vector (all of them when a
    /// tensor is misaligned), one by one: at most 15 when aligned, so the loop is not unrolled
    /// (ptxas spilled around the unrolled copies).
    fn scalar_tail(&mut self, k: usize, t: &Tiled, copy: &str) {
        self.line("#pragma unroll 1");
        self.open(format!(
            "for (int e = fz_nv{k} * {} + threadIdx.x; e < fz_n; e += {BLOCK})",
            16 / t.size
        ));
        self.line(copy);
        self.close();
    }

    /// The passes over the tile's rows, `per_block` rows at a time. Inside, each tiled tensor's
    /// name stands for its row in shared memory, so the row steps read and write the tile; a
    /// segment past the tile's last row computes on that row and writes nothing.
    fn tile_row_passes(&mut self, domain: &[DimId], axis: DimId, plan: &Plan, tiled: &[Tiled]) {
        self.open("for (int fz_l0 = 0; fz_l0 < fz_rows_here; fz_l0 += per_block)");
        // On a tile's last row step, a segment past its rows computes on the tile's unused
        // rows of shared memory (whose contents are stale) and writes only there, so the
        // element steps need no guard; its global accesses are those of the tile's last row.
        self.line("const int fz_row = fz_l0 + (int)threadIdx.x / width;");
        self.line("const bool live = fz_row < fz_rows_here;");
        self.line("const long long g = fz_t0 + (live ? fz_row : fz_rows_here - 1);");
        let rows: Vec<DimId> = domain.iter().copied().filter(|&d| d != axis).collect();
        for l in self.layout.split("g", &rows, &SYNTAX) {
            self.line(l);
        }
        let shapes = self.layout.shapes();
        for (s, shape) in shapes.iter().enumerate() {
            let offset = if shape.as_slice() == domain {
                "0".to_string()
            } else {
                self.layout.offset(shape, Some(axis))
            };
            self.line(format!("const long long b{s} = {offset};"));
        }
        for t in tiled {
            let constness = if t.input { "const " } else { "" };
            self.line(format!(
                "{constness}{}* __restrict__ {} = {} + fz_row * (int)len;",
                t.storage,
                t.global,
                t.shared()
            ));
        }
        // Each thread takes elements `lane` and, where the row is longer than `width`,
        // `lane + width` (`width <= len` always).
        self.line("const bool fz_second = lane + width < len;");
        self.values(&plan.prologue, Scope::Row);
        for pass in &plan.passes {
            self.init_accumulators(&pass.reduces);
            self.tile_step(pass, axis, &shapes, "lane", None);
            self.tile_step(
                pass,
                axis,
                &shapes,
                "fz_second ? lane + width : lane",
                Some("fz_second"),
            );
            self.block_reduce(&pass.reduces, true);
            self.finish_reductions(&pass.reduces, "len");
            self.values(&pass.after, Scope::Row);
        }
        if !plan.group_writes.is_empty() {
            self.open("if (live && lane == 0)");
            self.writes(&plan.group_writes, Scope::Row);
            self.close();
        }
        self.close();
    }

    /// One element of a pass at row position `r`. Its values are computed whether or not the
    /// element exists (a missing one is element `lane` again), so the loads and values of an
    /// element in successive passes are the same expressions, which the compiler computes once;
    /// only the accumulation depends on `valid`. A missing element's writes store the values of
    /// element `lane` again, where this thread has just stored them.
    fn tile_step(
        &mut self,
        pass: &Pass,
        axis: DimId,
        shapes: &[Vec<DimId>],
        r: &str,
        valid: Option<&str>,
    ) {
        self.open("");
        self.line(format!("const int r = {r};"));
        for s in self.used_shapes(&pass.elems, &pass.writes) {
            let offset = self.layout.row_offset(s, &shapes[s], axis);
            self.line(format!("const long long o{s} = {offset};"));
        }
        self.values(&pass.elems, Scope::Element);
        if !pass.reduces.is_empty() {
            if let Some(valid) = valid {
                self.open(format!("if ({valid})"));
            }
            self.accumulate(&pass.reduces);
            if valid.is_some() {
                self.close();
            }
        }
        self.writes(&pass.writes, Scope::Element);
        self.close();
    }
}
