//! Short rows, tiled: rows of 1 to [`SHORT`] elements, contiguous in memory, move through
//! shared memory a tile of whole rows at a time, so that every load and store of the tensors
//! over the whole domain is a 16-byte vector and a block has a whole tile's loads in flight.
//!
//! The row kernel's short case (a segment of one to eight threads a row, scalar loads, row
//! after row) keeps about eight bytes in flight per thread and runs a row's bookkeeping for
//! every two elements; S1's softmax at two columns reached 47% of copy bandwidth that way.
//! Here a block copies its tile of each tensor over the whole domain into shared memory (all
//! of a thread's loads issued before its first store), runs the row passes there with a
//! segment of `width` threads a row, and stores each output's tile. A row whose length is a
//! multiple of four gives each thread four consecutive elements, one vector of shared memory,
//! so that a row's reductions, shuffles and bookkeeping are shared by four elements a thread
//! (eight, 16 bytes, for 16-bit rows a multiple of eight long where `tile_eights` allows; a
//! row of two is one vector of two); other rows two elements a thread, `lane` and `lane +
//! width`. Where every tensor is 16-byte aligned, a thread's vectors of four or eight go
//! straight from its registers to the row in global memory (a warp's stores cover consecutive
//! whole rows) and the tile's outputs are not copied out. Where the tile is one input and one
//! output, each block asks L2 for its next tile of the input once this one is in shared
//! memory, so that the next loads wait on L2 (`prefetch_next`).
//!
//! It is a second entry point of the kernel's module, `fuse_<name>_short_rows`, which the
//! launch picks for those lengths (`expand.rs`); the row kernel itself is unchanged. Its body
//! is a function template, `fz_short_rows<width, fours, full, exact>` (and `lanes`, 4 or 8,
//! where `tile_eights`), instantiated for each width a short row can take, with two elements a
//! thread or a vector of four or eight (`fours`; `full` where every lane of the segment has
//! one), and for the entry's longest length as a constant (`exact`, 0 for a parameter) where
//! that is a power of two, so the shuffle reductions, lane arithmetic and row offsets are
//! specialized. (NVRTC compiles no lambda in device code without
//! flags that every kernel would then carry.)

use super::{Cuda, BLOCK};
use crate::ir::{DimId, Launch};
use crate::plan::rows::{row_vector_params, tile_eights, tiling, Tiled};
use crate::plan::{Entry, Plan};

mod passes;

impl Cuda<'_> {
    /// The text of the kernel's entry point for rows of 1 to [`SHORT`] elements and of the
    /// function template it calls; empty when the kernel has none. A kernel of its own rather
    /// than a branch of the row kernel: in one function ptxas allocated the other paths'
    /// registers differently (W6's row kernel spilled on sm_80, and row kernels bounded at 128
    /// registers took up to 15 more), and every launch, long rows included, would reserve the
    /// tile's static shared memory.
    pub(super) fn short_rows_kernel(&mut self, plan: &Plan, entry: &Entry) -> String {
        let (Some((tiled, tile)), Launch::Rows { domain, axis }) =
            (tiling(self.k, plan), &self.k.launch)
        else {
            unreachable!("the program has a short-row entry where the rows tile")
        };
        self.helpers.insert("fz_vec");
        // Vectors of eight where the entry takes some length they do.
        let (min, max) = (entry.when.min_len, entry.when.max_len);
        let eights = tile_eights(self.k, plan) && (min..=max).any(|l| l % 8 == 0);
        // Rows of two take a vector of two a thread, where no random value asks for blocks of
        // four lanes (`draw_lane_randoms`).
        let twos = (min..=max).contains(&2) && !self.k.draws_random();
        let lanes: Vec<u32> = [(eights, 8), (twos, 2)]
            .into_iter()
            .filter_map(|(on, l)| on.then_some(l))
            .collect();
        let function = self.short_rows_function(domain, *axis, plan, &tiled, tile, &lanes);
        let (kernel_body, kernel_indent) = (std::mem::take(&mut self.out), self.indent);
        self.indent = 1;
        let bytes: u32 = tiled.iter().map(|t| t.size).sum();
        // On a 128-byte line, as every buffer rows are copied into (`rows::prefetch_buffers`),
        // which also aligns the vectors of four 8-byte elements that the row passes read: after
        // the name, where g++ (the emulation's `__shared__` is `static`) takes it too.
        self.line(format!(
            "__shared__ fz_vec<unsigned int, 4> fz_tile alignas(128) [{}];",
            tile * bytes / 16
        ));
        self.line(format!(
            "const long long len = {};",
            self.layout.size(*axis)
        ));
        self.dispatch(plan, (min, max), eights, twos);
        let body = std::mem::replace(&mut self.out, kernel_body);
        self.indent = kernel_indent;
        format!("{function}{}", self.global(entry, &body))
    }

    /// Calls the instantiation of `fz_short_rows` for the row length `len`. Threads per row:
    /// for a multiple of four, a vector of four elements each (a warp reads consecutive vectors
    /// of shared memory, without bank conflicts), rounded up to a power of two; else the fewest
    /// that take at most two elements each (a warp's accesses then meet at most two to a bank).
    /// `eights`: the entry's multiples of eight take a vector of eight a thread; `twos`: a row
    /// of two takes a vector of two.
    fn dispatch(&mut self, plan: &Plan, lens: (u64, u64), eights: bool, twos: bool) {
        let args = self.param_names().join(", ");
        // `lanes`: 8, 4 or 2 for a vector a thread, 0 for two elements a thread.
        let call = |w: u32, lanes: u32, full: bool, exact: u64| {
            let fours = lanes > 0;
            let vector = match lanes {
                8 | 2 => format!(", {lanes}"),
                _ => String::new(),
            };
            format!("fz_short_rows<{w}, {fours}, {full}, {exact}{vector}>({args}, fz_tile);")
        };
        // The lengths a kind of instantiation takes: multiples of eight for vectors of eight,
        // the other multiples of four for vectors of four, any for two elements a thread (a
        // multiple of four whose tensors are misaligned comes there too).
        let mine = move |l: u64, lanes: u32| match lanes {
            8 => l.is_multiple_of(8),
            4 => l.is_multiple_of(4) && !(eights && l.is_multiple_of(8)),
            _ => true,
        };
        // The instantiation for the lengths `range` (a vector of four a thread when `fours`):
        // the entry's lengths among them as a constant where there is one, and the entry's
        // longest as a constant of its own where it is a power of two, the lengths rows most
        // often have. A constant length folds the row's offsets, the tile's row count and the
        // second element's test: S1's softmax at two columns ran 2% slower with `len` a
        // parameter than in the kernel of every path, where ptxas had registers to spare. (A
        // multiple of four takes the vectors unless a tensor is misaligned: no constant there.)
        let case = |range: std::ops::RangeInclusive<u64>, w: u32, lanes: u32, full: bool| {
            let taken: Vec<u64> = range
                .clone()
                .filter(|&l| l >= lens.0 && l <= lens.1 && mine(l, lanes))
                .collect();
            let text = match taken[..] {
                [only] => call(w, lanes, full, only),
                _ if taken.contains(&lens.1)
                    && lens.1.is_power_of_two()
                    && (lanes > 0 || !lens.1.is_multiple_of(4)) =>
                {
                    format!(
                        "{{ if (len == {}) {} else {} }}",
                        lens.1,
                        call(w, lanes, full, lens.1),
                        call(w, lanes, full, 0)
                    )
                }
                _ => call(w, lanes, full, 0),
            };
            (range, text, lanes)
        };
        // Each instantiation with the lengths it takes, for a multiple of four (a vector of
        // four a thread) and otherwise (two elements a thread); the entry takes the lengths
        // `lens` only, so it instantiates only theirs.
        // Rows of 16-bit elements a multiple of eight long take a vector of eight a thread (16
        // bytes), where the kernel allows (`tile_eights`).
        let eight = [
            case(8..=8, 1, 8, true),
            case(16..=16, 2, 8, true),
            case(24..=24, 4, 8, false),
            case(32..=32, 4, 8, true),
        ];
        let fours = [
            case(4..=4, 1, 4, true),
            case(8..=8, 2, 4, true),
            case(12..=12, 4, 4, false),
            case(16..=16, 4, 4, true),
            case(20..=28, 8, 4, false),
            case(32..=32, 8, 4, true),
        ];
        let others = [
            case(1..=2, 1, 0, false),
            case(3..=4, 2, 0, false),
            case(5..=8, 4, 0, false),
            case(9..=16, 8, 0, false),
            case(17..=32, 16, 0, false),
        ];
        // A case is instantiated where the entry has lengths it takes.
        let taken = |(r, _, lanes): &(std::ops::RangeInclusive<u64>, String, u32)| {
            let (from, to) = (lens.0.max(*r.start()), lens.1.min(*r.end()));
            (from..=to).any(|l| mine(l, *lanes))
        };
        let chain = |cases: Vec<(std::ops::RangeInclusive<u64>, String, u32)>| -> Vec<String> {
            let last = cases.len().saturating_sub(1);
            cases
                .into_iter()
                .enumerate()
                .map(|(i, (r, call, _))| match (i, i == last) {
                    (_, true) if i == 0 => call,
                    (_, true) => format!("else {call}"),
                    (0, _) => format!("if (len <= {}) {call}", r.end()),
                    _ => format!("else if (len <= {}) {call}", r.end()),
                })
                .collect()
        };
        let eight: Vec<_> = match eights {
            true => eight.into_iter().filter(taken).collect(),
            false => vec![],
        };
        let fours: Vec<_> = fours.into_iter().filter(taken).collect();
        let others: Vec<_> = others.into_iter().filter(taken).collect();
        let aligned: String = row_vector_params(self.k, plan)
            .into_iter()
            .map(|p| {
                let (t, name) = self.param_text(p);
                format!(" && ((unsigned long long)p_{name} & (4 * sizeof({t}) - 1)) == 0")
            })
            .collect();
        if twos {
            // A thread a row of two, its two elements one vector: no second element's test, the
            // divisions by the row's sum checked once, and the pair rounded and stored at once.
            // (S2's bf16 softmax at two columns issued 49 instructions an element as two
            // elements a thread, `pair_passes`.)
            self.line(format!("if (len == 2{aligned}) {}", call(1, 2, true, 2)));
            self.open("else");
        }
        if !fours.is_empty() || !eight.is_empty() {
            self.open(format!("if ((len & 3) == 0{aligned})"));
            let both = !eight.is_empty() && !fours.is_empty();
            if both {
                self.open("if ((len & 7) == 0)");
            }
            for line in chain(eight) {
                self.line(line);
            }
            if both {
                self.close();
                self.open("else");
            }
            for line in chain(fours) {
                self.line(line);
            }
            if both {
                self.close();
            }
            self.close();
            self.open("else");
        } else {
            self.open("");
        }
        for line in chain(others) {
            self.line(line);
        }
        self.close();
        if twos {
            self.close();
        }
    }

    /// The names of the kernel's parameters, in order.
    fn param_names(&self) -> Vec<String> {
        self.param_list()
            .into_iter()
            .map(|(_, name)| name)
            .collect()
    }

    /// The text of `fz_short_rows<width>`, the tiled path for `width` threads a row: it takes
    /// the kernel's parameters and the block's tile.
    fn short_rows_function(
        &mut self,
        domain: &[DimId],
        axis: DimId,
        plan: &Plan,
        tiled: &[Tiled],
        tile: u32,
        lanes: &[u32],
    ) -> String {
        let (kernel_body, kernel_indent) = (std::mem::take(&mut self.out), self.indent);
        self.indent = 1;
        let rows = self.row_counts(domain, axis, plan);
        self.tile_memory(tiled, tile);
        self.shared_reduction_buffers(plan);
        self.line(format!("const int per_block = {BLOCK} / width;"));
        self.line("const int lane = threadIdx.x & (width - 1);");
        // Rows per tile: whole segments (at least 16 rows, so every tile starts 16-byte aligned
        // in every tensor whatever its element size), up to `tile` elements, and no more than
        // it takes to give every block of the grid a tile. A tile holds at least a block's
        // step of the entry's longest rows (`plan::rows::MIN_TILE`), so `fz_most` is never 0.
        self.line(format!(
            "const int fz_most = ({tile} / (int)len) / per_block * per_block;"
        ));
        self.line("const long long fz_spread = (groups + gridDim.x - 1) / gridDim.x;");
        self.line("const int fz_tile_rows = fz_spread < fz_most ? (int)(fz_spread + per_block - 1) / per_block * per_block : fz_most;");
        self.open("for (long long fz_t0 = (long long)blockIdx.x * fz_tile_rows; fz_t0 < groups; fz_t0 += (long long)gridDim.x * fz_tile_rows)");
        self.line("const int fz_rows_here = groups - fz_t0 < fz_tile_rows ? (int)(groups - fz_t0) : fz_tile_rows;");
        self.line("const int fz_n = fz_rows_here * (int)len;");
        self.line("const long long fz_e0 = fz_t0 * len;");
        self.copy_in(tiled, tile);
        self.prefetch_next(tiled);
        self.line("__syncthreads();");
        self.tile_row_passes(domain, &rows, axis, plan, tiled, lanes);
        self.line("__syncthreads();");
        self.copy_out(tiled, tile, lanes);
        self.close();
        let body = std::mem::replace(&mut self.out, kernel_body);
        self.indent = kernel_indent;
        let lanes = if lanes.is_empty() {
            ""
        } else {
            ", int lanes = 4"
        };
        format!(
            "template <int width, bool fours, bool full, int exact{lanes}>\nstatic __device__ __forceinline__ void fz_short_rows(\n{},\n    fz_vec<unsigned int, 4>* __restrict__ fz_tile\n) {{\n{body}}}\n",
            self.params().trim_end()
        )
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
            if !t.input() {
                self.line(format!(
                    "{}* const {} = {};",
                    t.storage,
                    t.direct(),
                    t.global
                ));
            }
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
    /// a tensor is misaligned), every load issued before the first store, then the elements
    /// after the last whole vector one by one.
    fn copy_in(&mut self, tiled: &[Tiled], tile: u32) {
        let mut steps = vec![];
        for (k, t) in tiled.iter().enumerate().filter(|(_, t)| t.input()) {
            self.line(format!(
                "const int fz_nv{k} = fz_aligned ? (fz_n * {}) >> 4 : 0;",
                t.size
            ));
            let count = (tile * t.size / 16).div_ceil(BLOCK);
            steps.extend((0..count).map(|i| (k, t, i * BLOCK)));
        }
        if !steps.is_empty() {
            self.open("");
            self.line(format!("fz_vec<unsigned int, 4> fz_ld[{}];", steps.len()));
            for (j, &(k, t, at)) in steps.iter().enumerate() {
                self.line(format!("if (threadIdx.x + {at} < fz_nv{k}) fz_ld[{j}] = reinterpret_cast<const fz_vec<unsigned int, 4>*>({} + fz_e0)[threadIdx.x + {at}];", t.global));
            }
            for (j, &(k, t, at)) in steps.iter().enumerate() {
                self.line(format!("if (threadIdx.x + {at} < fz_nv{k}) reinterpret_cast<fz_vec<unsigned int, 4>*>({})[threadIdx.x + {at}] = fz_ld[{j}];", t.shared()));
            }
            self.close();
        }
        for (k, t) in tiled.iter().enumerate().filter(|(_, t)| t.input()) {
            self.scalar_tail(
                k,
                t,
                &format!("{}[e] = {}[fz_e0 + e];", t.shared(), t.global),
            );
        }
    }

    /// Asks L2 for the block's next tile of each input while this one's rows are computed and
    /// stored, so that its loads wait for L2 rather than for memory: a block's loads and its
    /// passes alternate, each tile's loads in flight only between two barriers. Only where the
    /// tile holds an output: S2's 16-bit softmax at 2 columns ran 7% faster with it (78% of
    /// copy speed), at 32 2-3%, but the row sums at 32 columns, which only read, 5% slower
    /// (benches/NOTES.md item 111). And only for a tile of two tensors, an input and an output,
    /// as those measured: in kernels of more the prefetch's registers made ptxas spill 16 to 36
    /// bytes (random programs p26736 and p27384, short rows of 24, sm_80 and sm_90). And only
    /// for inputs narrower than 32 bits (16-bit ones measured): on an H100, S1's f32 softmax at
    /// 2 and 32 columns ran 3.2% and 0.7% slower with it (96 and 98% of copy speed against 99
    /// and 99%; item 134).
    fn prefetch_next(&mut self, tiled: &[Tiled]) {
        let inputs = tiled.iter().filter(|t| t.input()).count();
        if tiled.len() > 2 || inputs == 0 || inputs == tiled.len() {
            return;
        }
        if tiled.iter().any(|t| t.input() && t.size > 2) {
            return;
        }
        self.helpers.insert("fz_l2_prefetch");
        self.open("");
        self.line("const long long fz_next = fz_t0 + (long long)gridDim.x * fz_tile_rows;");
        self.line("const long long fz_next_rows = groups - fz_next < fz_tile_rows ? groups - fz_next : fz_tile_rows;");
        self.open("if (fz_next_rows > 0)");
        for t in tiled.iter().filter(|t| t.input()) {
            self.line(format!(
                "fz_prefetch_l2({} + fz_next * len, fz_next_rows * len * (long long)sizeof({}));",
                t.global, t.storage
            ));
        }
        self.close();
        self.close();
    }

    /// Stores this tile of each output from shared memory: whole 16-byte vectors, then the
    /// elements after the last one. Not where the row passes took vectors of four or eight
    /// and stored them straight to global memory (`vector_passes`): S2's bf16 softmax at 32
    /// columns ran at 84-86% of copy speed through the tile, 87-91% without (benches/NOTES.md
    /// item 116).
    fn copy_out(&mut self, tiled: &[Tiled], tile: u32, lanes: &[u32]) {
        if tiled.iter().all(|t| t.input()) {
            return;
        }
        match lanes.is_empty() {
            true => self.open("if (!(fours && fz_aligned))"),
            false => self.open("if (!(fours && lanes != 2 && fz_aligned))"),
        }
        for (k, t) in tiled.iter().enumerate().filter(|(_, t)| !t.input()) {
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
        self.close();
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
}

#[cfg(test)]
mod tests {
    use crate::testing::kernel;
    use quote::quote;

    fn source(tokens: proc_macro2::TokenStream) -> String {
        let k = kernel(tokens);
        crate::cuda::text(&k)
    }

    /// The tiled entries' text of a kernel's `text` (each entry's source starts with its
    /// `// Kernel` line and names its path), without the other entries'.
    fn tiled(text: &str) -> String {
        text.split("// Kernel `")
            .filter(|entry| entry.contains("// Path `short_rows`"))
            .collect()
    }

    /// The number of 16-byte vectors of the block's tile, when the kernel has the tiled entry.
    fn tile_vectors(text: &str) -> Option<usize> {
        let decl = "__shared__ fz_vec<unsigned int, 4> fz_tile alignas(128) [";
        let rest = &text[text.find(decl)? + decl.len()..];
        rest[..rest.find(']')?].parse().ok()
    }

    #[test]
    fn contiguous_rows_get_an_entry_with_tiles_of_32_kb() {
        let tokens = quote! { fn f(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) } };
        let k = kernel(tokens.clone());
        let program = crate::plan::program(&k);
        let sources = crate::cuda::sources(&k, &program);
        let short = program
            .entries
            .iter()
            .position(|e| e.path == crate::plan::Path::ShortRows)
            .expect("a short-row entry");
        assert_eq!(program.entries[short].symbol, "fuse_f_short_rows_2");
        let text = &sources[short];
        let function = text
            .find("template <int width, bool fours, bool full, int exact, int lanes = 4>")
            .expect("the tiled path");
        let entry = text
            .find("void __launch_bounds__(256, 4) fuse_f_short_rows_2(")
            .expect("the entry");
        assert!(function < entry, "{text}");
        let general = sources.last().unwrap();
        assert!(
            general.contains("fuse_f(") && !general.contains("fz_tile"),
            "the general entry has no tile: {general}"
        );
        let text = source(tokens);
        assert_eq!(tile_vectors(&text), Some(2048), "{text}");
        let call = |w, fours, full| format!("fz_short_rows<{w}, {fours}, {full}, ");
        // Every instantiation is in exactly one of the short-row entries, each entry holding
        // those of its lengths: two elements a thread for any length, a vector of four a
        // thread (every lane with one at 4, 8, 16 and 32) for multiples of four.
        let shorts: Vec<(&crate::plan::Entry, &String)> = program
            .entries
            .iter()
            .zip(&sources)
            .filter(|(e, _)| e.path == crate::plan::Path::ShortRows)
            .collect();
        assert_eq!(shorts.len(), 8);
        // Rows of two also take a vector of two a thread where every row vector is aligned.
        let twos = "fz_short_rows<1, true, true, 2, 2>";
        for (entry, text) in &shorts {
            let instances = text.replace(twos, "").matches("fz_short_rows<").count();
            assert!((1..=2).contains(&instances), "{}: {text}", entry.symbol);
            assert_eq!(
                text.contains(twos),
                entry.when.min_len <= 2 && entry.when.max_len >= 2,
                "{}",
                entry.symbol
            );
        }
        // Each instantiation with the lengths it takes.
        let wanted = [
            (1, false, false, 1..=2),
            (2, false, false, 3..=4),
            (4, false, false, 5..=8),
            (8, false, false, 9..=16),
            (16, false, false, 17..=32),
            (1, true, true, 4..=4),
            (2, true, true, 8..=8),
            (4, true, false, 12..=12),
            (4, true, true, 16..=16),
            (8, true, false, 20..=28),
            (8, true, true, 32..=32),
        ];
        for (w, fours, full, lens) in wanted {
            let lens: Vec<u64> = lens.filter(|l| !fours || l % 4 == 0).collect();
            for (entry, text) in &shorts {
                let range = entry.when.min_len..=entry.when.max_len;
                assert_eq!(
                    text.replace(twos, "").contains(&call(w, fours, full)),
                    lens.iter().any(|l| range.contains(l)),
                    "<{w}, {fours}, {full}> in {}",
                    entry.symbol
                );
            }
        }
        // The longest length of an entry, where a power of two, and the only length of a case
        // are constants.
        let exact = |text: &str, w, fours, full, len| {
            text.contains(&format!(
                "fz_short_rows<{w}, {fours}, {full}, {len}>(p_x, out0, d_r, d_c, fz_tile);"
            ))
        };
        let entry = |max: u64| {
            &shorts
                .iter()
                .find(|(e, _)| e.when.max_len == max)
                .unwrap()
                .1
        };
        assert!(exact(entry(2), 1, false, false, 2) && exact(entry(2), 1, false, false, 0));
        assert!(exact(entry(4), 1, true, true, 4) && exact(entry(4), 2, false, false, 0));
        assert!(exact(entry(28), 8, true, false, 28) && exact(entry(24), 8, true, false, 0));
        assert!(entry(2).contains("if (len == 2) fz_short_rows<1, false, false, 2>"));
        assert!(entry(2).contains(
            "if (len == 2) fz_short_rows<1, true, true, 2, 2>(p_x, out0, d_r, d_c, fz_tile);"
        ));
        assert!(text.contains("if ((len & 3) == 0) {"), "{text}");
        assert!(
            text.contains("(4096 / (int)len)"),
            "4096 elements of x and of the output"
        );
        let text = source(
            quote! { fn f(x: [f64; r, c]) -> [f64; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) } },
        );
        assert_eq!(tile_vectors(&text), Some(2048));
        assert!(text.contains("(2048 / (int)len)"), "{text}");
        // A row reduction's tile holds 16 KB of input, what a block loads at once.
        let text = source(quote! { fn f(x: [f32; r, c]) -> [f32; r] { sum(x, c) } });
        assert_eq!(tile_vectors(&text), Some(1024), "{text}");
        // A tile of 16-bit rows with an output asks L2 for the block's next tile of each input;
        // one that only reads does not, nor one of 32-bit rows.
        assert!(!tiled(&text).contains("fz_next"), "{text}");
        let text = source(quote! { fn f(x: [bf16; r, c]) -> [bf16; r, c] { x / sum(x, c) } });
        assert!(
            text.contains("fz_prefetch_l2(p_x + fz_next * len, fz_next_rows * len * (long long)sizeof(unsigned short));"),
            "{text}"
        );
        let text = source(quote! { fn f(x: [f32; r, c]) -> [f32; r, c] { x / sum(x, c) } });
        assert!(!tiled(&text).contains("fz_next"), "{text}");
        // Nor does one of more than two tensors, whose registers are scarcer (the peeled
        // segments' entries of the same kernel ask for their next rows: `rows::peels_cache`).
        let text = source(
            quote! { fn f(x: [bf16; r, c], y: [bf16; r, c]) -> [bf16; r, c] { x / sum(y, c) } },
        );
        assert!(!tiled(&text).contains("fz_next"), "{text}");
    }

    /// The vector passes read each tiled input's row once and load the other tensors along the
    /// row (gamma, beta) as vectors from global memory, which their addresses must allow.
    #[test]
    fn vector_passes_read_rows_once_and_need_aligned_row_vectors() {
        let text = source(quote! {
            fn f(x: [f32; r, c], g: [f16; c], b: [f32; r]) -> [f32; r, c] {
                let e = (x - max(x * (g as f32), c)).exp() + b;
                e / sum(e, c)
            }
        });
        assert!(
            text.contains("if ((len & 3) == 0 && ((unsigned long long)p_g & (4 * sizeof(unsigned short) - 1)) == 0) {"),
            "{text}"
        );
        let function = &text[text.find("if constexpr (fours) {").expect("vector passes")..];
        let vectors = &function[..function.find("else {").expect("pair passes")];
        let read =
            "const fz_vec<float, 4> rc_x[1] = {reinterpret_cast<const fz_vec<float, 4>*>(p_x)[c]};";
        assert_eq!(vectors.matches(read).count(), 1, "{vectors}");
        assert!(
            vectors.contains("const int c = fz_in ? lane : 0;"),
            "{vectors}"
        );
        assert!(
            vectors.contains("*(reinterpret_cast<const fz_vec<unsigned short, 4>*>(p_g + b1) + c)"),
            "{vectors}"
        );
        // A lane past the row adds nothing; the division by the sum is checked four at a time.
        assert_eq!(vectors.matches("if (!fz_in) {").count(), 2, "{vectors}");
        assert!(
            vectors.contains("fz_div_fast(") && vectors.contains("if (fz_bad) {"),
            "{vectors}"
        );
    }

    #[test]
    fn only_tensors_over_the_whole_domain_move_through_the_tile() {
        let text = source(quote! {
            fn f(x: [f32; r, c], unused: [f32; r, c], g: [f32; c], b: [f32; r]) -> ([f32; r, c], [f32; r]) {
                (x * g + b, sum(x, c))
            }
        });
        assert!(
            text.contains("ts_p_x") && text.contains("ts_out0"),
            "{text}"
        );
        for name in ["ts_p_unused", "ts_p_g", "ts_p_b", "ts_out1"] {
            assert!(!text.contains(name), "{name}: {text}");
        }
    }

    #[test]
    fn other_reductions_have_no_tiled_entry() {
        for tokens in [
            quote! { fn f(x: [f32; r, c]) -> [f32; c] { sum(x, r) } },
            quote! { fn f(x: [f32; b, t, c]) -> [f32; b, c] { sum(x, t) } },
            quote! { fn f(x: [f32; n]) -> f32 { sum(x) } },
            quote! { fn f(x: [f32; n]) -> [f32; n] { x * 2.0 } },
            // 72 bytes an element: a tile of 40 KB would hold less than a block's step.
            quote! {
                fn f(a: [f64; r, c], b: [f64; r, c], d: [f64; r, c], e: [f64; r, c], g: [f64; r, c])
                    -> ([f64; r, c], [f64; r, c], [f64; r, c], [f64; r, c])
                {
                    let m = sum(a + b + d + e + g, c);
                    (a - m, b - m, d - m, e - m)
                }
            },
        ] {
            let k = kernel(tokens.clone());
            let program = crate::plan::program(&k);
            assert!(program
                .entries
                .iter()
                .all(|e| e.path != crate::plan::Path::ShortRows));
            let text = source(tokens);
            assert_eq!(tile_vectors(&text), None, "{text}");
            assert!(!text.contains("fz_short_rows"));
        }
    }

    /// 16-bit rows a multiple of eight long take a vector of eight a thread, in the entries
    /// that take such lengths; f32 rows, and 16-bit ones beside a 4-byte tensor along the row,
    /// keep vectors of four.
    #[test]
    fn sixteen_bit_rows_of_eights_take_vectors_of_eight() {
        let softmax = quote! {
            fn f(x: [bf16; r, c]) -> [bf16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        };
        let text = source(softmax);
        assert!(
            text.contains("fz_short_rows<4, true, true, 32, 8>(p_x, out0, d_r, d_c, fz_tile);"),
            "{text}"
        );
        assert!(
            text.contains("fz_short_rows<4, true, false, 24, 8>")
                && text.contains("fz_short_rows<8, true, false, 20>"),
            "{text}"
        );
        assert!(
            text.contains("if constexpr (fours && lanes == 8)"),
            "{text}"
        );
        assert!(
            text.contains("const bool fz_in = full || lane * 8 < (int)len;"),
            "{text}"
        );
        // Rows of 1 or 2 take no vectors of eight: their entry has no such branch.
        let short = &text[..text.find("fuse_f_short_rows_2(").expect("the entry for 2")];
        let short = &short[short.rfind("fz_short_rows(").expect("its function")..];
        assert!(!short.contains("lanes == 8"), "{short}");
        let text = source(quote! {
            fn f(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        assert!(!text.contains("lanes == 8"), "{text}");
        // Rows of two take a vector of two in every element type, but beside random values,
        // whose Philox blocks serve four lanes.
        assert!(
            text.contains("if constexpr (fours && lanes == 2)"),
            "{text}"
        );
        let text = source(quote! {
            fn f(x: [f32; r, c], seed: u64) -> [f32; r, c] { dropout(x / sum(x, c), 0.1, seed) }
        });
        assert!(
            text.contains("fz_short_rows<") && !text.contains("lanes == 2"),
            "{text}"
        );
        let text = source(quote! {
            fn f(x: [bf16; r, c], g: [f32; c]) -> [bf16; r, c] { (x * (g as bf16)) / sum(x, c) }
        });
        assert!(text.contains("fz_short_rows<8, true, true, 32>"), "{text}");
        assert!(!text.contains("lanes == 8"), "{text}");
        // Nor where the tile carries three tensors (softmax's backward spilled on sm_80).
        let text = source(quote! {
            fn f(y: [bf16; r, c], dy: [bf16; r, c]) -> [bf16; r, c] {
                y * (dy - sum(y * dy, c))
            }
        });
        assert!(text.contains("fz_short_rows<8, true, true, 32>"), "{text}");
        assert!(!text.contains("lanes == 8"), "{text}");
    }

    /// Every tile holds a block's step over the rows of each instantiation: the threads a row
    /// (`width`) times the rows a block (`256 / width`) times their length, or the kernel's tile
    /// loop takes no rows and never ends (`fz_most` is 0). Three `f64` tensors and an `f16` one
    /// had a tile of 768 elements, and rows of 28 (eight threads a row, 32 rows) hung the GPU.
    #[test]
    fn every_tile_holds_a_blocks_step_of_its_longest_rows() {
        for tokens in [
            quote! {
                fn p23(x0: [f64; d0], x1: [f64; d0], x2: [f16; d0]) -> ([f64; d0], [f16; d0]) {
                    let v1 = sum(x0, d0);
                    ((gelu_tanh(ln(v1)) + x1), x2)
                }
            },
            quote! {
                fn f(a: [f32; r, c], b: [f32; r, c], d: [f32; r, c], e: [f32; r, c], g: [f32; r, c]) -> [f32; r, c] {
                    let m = sum(a + b + d + e + g, c);
                    a - m
                }
            },
            quote! { fn f(x: [f32; r, c]) -> [f32; r, c] { x / sum(x, c) } },
        ] {
            let k = kernel(tokens.clone());
            let program = crate::plan::program(&k);
            let Some((_, tile)) = crate::plan::rows::tiling(&k, &program.plan) else {
                panic!("a tiled entry: {tokens}");
            };
            // Rows of four, one vector a thread: 256 rows a step (1024 elements); of 32, eight
            // threads a row, 32 rows (1024 again).
            assert!(tile >= 1024, "{tile}");
            let text = source(tokens);
            let most = format!("const int fz_most = ({tile} / (int)len) / per_block * per_block;");
            assert!(text.contains(&most), "{text}");
        }
    }
}
