//! Long rows cached in shared memory. A row too long for registers is read from memory once, into
//! the dynamic shared memory its launch provides, and every pass over it runs from there: on
//! sm_90 the row is split over the blocks of a thread-block cluster, each block caching a part of
//! it, and the blocks combine each pass's partial reductions through distributed shared memory.
//!
//! The path is an entry point of its own, `fuse_<name>_long_rows`, which the runtime launches for
//! rows longer than the register cache when the device has the shared memory for them; it decides
//! that, and the cluster size, from the row length and `plan::rows::cached_bytes`, and otherwise
//! launches the general row entry, which streams such rows.

use super::super::{Cuda, Scope, BLOCK};
use crate::ir::{DimId, Launch, NodeId};
use crate::plan::rows::{
    bytes, cached_bytes, pass_reductions, pass_stashes, shared_params, MAX_CLUSTER,
};
use crate::plan::{Entry, Pass, Plan};

impl Cuda<'_> {
    /// The text of the kernel's entry point for long rows; empty when it has none. An entry of
    /// its own rather than a branch of the row kernel, because a kernel's static shared memory
    /// is reserved for every block it launches: the row kernel's prefetch buffers (32 KiB,
    /// `rows::prefetches`) left long-row blocks, whose rows lie in dynamic shared memory, room
    /// for one block an SM fewer.
    pub(in crate::cuda) fn long_rows_kernel(&mut self, plan: &Plan, entry: &Entry) -> String {
        let Launch::Rows { domain, axis } = &self.k.launch else {
            unreachable!("the long-row path is a row kernel's")
        };
        let rows = self.row_counts(domain, *axis, plan);
        self.shared_reduction_buffers(plan);
        self.long_rows(&rows, *axis, plan);
        let body = std::mem::take(&mut self.out);
        self.global(entry, &body)
    }

    /// The body of the long-row entry after its row counts (`rows` are the dims besides `axis`):
    /// every row from the dynamic shared memory the launch gave.
    fn long_rows(&mut self, rows: &[DimId], axis: DimId, plan: &Plan) {
        let cached = shared_params(self.k, plan);
        self.helpers.insert("fz_long_rows");
        self.helpers.insert("fz_l2_prefetch");
        self.helpers.insert("fz_vec");
        self.line("// Long rows: read once into the dynamic shared memory the launch gave, split over the");
        self.line("// blocks of a cluster (`blocks`, each caching `part` elements), every pass from there.");
        // The runtime launches this entry only with the memory a part needs, else the row
        // kernel; a launch with less does nothing, the same in every block of a cluster (so
        // none waits at a cluster barrier for one that left). Indices within a row are 32-bit,
        // as in the register cache (64-bit ones spilled): rows of 2^30 elements or more fit no
        // shared memory anyway.
        self.line("if (len >= 0x40000000ll) return;");
        self.line("const unsigned int blocks = fz_cluster_size();");
        self.line("const unsigned int rank = blockIdx.x % blocks;");
        self.line("int begin, end;");
        self.line("const int part = fz_part(len, blocks, rank, begin, end);");
        self.line(format!(
            "if (blocks > {MAX_CLUSTER} || fz_smem_bytes() < (long long)part * {}) return;",
            cached_bytes(self.k, plan)
        ));
        self.shared_layout(&cached);
        self.exchange_start(plan);
        // The runtime launches a cluster per row, or (`FUSE_LONG_ROWS_WAVES`, and kernels with
        // partial sums over rows) as many as can be resident, each taking every `clusters`-th
        // row.
        self.line("const long long clusters = (long long)(gridDim.x / blocks);");
        self.row_ahead(&cached);
        self.partials_in_shared = self.k.has_partials();
        let peel = self.long_peel(plan, axis, &cached);
        let ahead = self.copies_ahead(plan, &cached, peel);
        if ahead {
            self.open("if (blockIdx.x / blocks < groups)");
            self.line("const long long fz_next = (long long)(blockIdx.x / blocks) * len;");
            self.shared_load(&cached, None, "fz_next");
            self.close();
        }
        self.open("for (long long g = blockIdx.x / blocks; g < groups; g += clusters)");
        self.row_start(rows, axis, plan);
        if let Some(v) = peel {
            self.peel_bounds(v, &cached);
            // Where the length is no multiple of `v`, which thread takes which element of shared
            // memory moves from row to row with `fz_hh`: the copies of this row wait for every
            // thread to have read the last (emulated, a 4 x 37 softmax in clusters of 4 read an
            // element the next row's copy had overwritten).
            self.line(format!("if ((len & {}) != 0) __syncthreads();", v - 1));
        }
        if !ahead {
            let s = self.shape_index(self.k.params[cached[0]].shape.as_ref().expect("a tensor"));
            self.shared_load(&cached, peel, &format!("b{s}"));
        }
        self.next_row_prefetch(&cached);
        self.line("fz_copy_wait();");
        self.shared_passes(plan, axis, &cached, peel, ahead);
        self.close();
        if self.partials_in_shared {
            self.write_shared_parts();
            self.finish_parts("clusters");
        }
        self.partials_in_shared = false;
        // No block may leave while another can still read its slots.
        self.line("if (blocks > 1) fz_cluster_exit();");
    }

    /// Where things lie in the dynamic shared memory: this block's part of each cached tensor
    /// (`sc_<name>`), one after another, then of each partial sum over rows (`sp<o>`, zeroed:
    /// the cluster's sums of its rows at this block's elements, `r - begin`).
    fn shared_layout(&mut self, cached: &[usize]) {
        let mut offset = 0;
        let at = |offset| match offset {
            0 => "fz_shared()".to_string(),
            bytes => format!("(fz_shared() + part * {bytes})"),
        };
        for &p in cached {
            let (t, name) = self.param_text(p);
            self.line(format!("{t}* const sc_{name} = ({t}*){};", at(offset)));
            offset += self.k.params[p].elem.bits() / 8;
        }
        for (o, out) in self.k.outputs.iter().enumerate() {
            if out.partial.is_some() && !out.total {
                let t = out.elem.c_name();
                self.line(format!("{t}* const sp{o} = ({t}*){};", at(offset)));
                self.line(format!(
                    "for (int r = threadIdx.x; r < part; r += {BLOCK}) sp{o}[r] = 0;"
                ));
                offset += out.elem.bits() / 8;
            }
        }
        if self.k.has_partials() {
            // The zeros are other threads' than the sums that add to them.
            self.line("__syncthreads();");
        }
    }

    /// After the row loop, this block's part of its cluster's row of each partial sum over
    /// rows (`OutputInfo::partial`; the launch has a row of them a cluster). The sums were
    /// added by the threads of each element's loop, vector or element (the same for every row
    /// of a launch): the barrier hands them to the threads that store them.
    fn write_shared_parts(&mut self) {
        self.line("__syncthreads();");
        for (o, out) in self.k.outputs.iter().enumerate() {
            if out.partial.is_some() && !out.total {
                self.line(format!(
                    "for (int r = begin + threadIdx.x; r < end; r += {BLOCK}) out{o}[(long long)(blockIdx.x / blocks) * len + r] = sp{o}[r - begin];"
                ));
            }
        }
    }

    /// The widest vector (`long_lanes`) where this block's part of every row is taken from its
    /// first whole vector in memory on (`peel_bounds`), whatever the row's length: where every
    /// pass peels as a streamed one would (`rows::Cuda::peels`: every tensor along the row of
    /// the domain, no random draw, no partial sums). Else `None`: vectors where the length is a
    /// multiple of their lanes, elements otherwise. At 12289 columns on an H200, element by
    /// element, a bf16 softmax ran at 30% of copy speed and an f32 one at 78% (NOTES item 127).
    fn long_peel(&self, plan: &Plan, axis: DimId, cached: &[usize]) -> Option<u32> {
        let peels = plan.passes.iter().all(|pass| self.peels(pass, axis));
        peels.then(|| self.long_lanes(cached)[0])
    }

    /// This block's part of row `g` (elements `begin` to `end`) as a peeled row: the first
    /// `fz_hh` elements (fewer than `v`) up to the first whole vector in memory, which is
    /// element `fz_h` of the row, then `fz_nv` vectors, then the rest (fewer than `v`). In
    /// shared memory the vectors lie first, so that each is whole there too, then the elements
    /// before and after them (`fz_nv * v + k` for the `k`th: `fz_rest` in all).
    fn peel_bounds(&mut self, v: u32, cached: &[usize]) {
        let s = self.shape_index(self.k.params[cached[0]].shape.as_ref().expect("a tensor"));
        self.line(format!(
            "const int fz_to = (int)((-(b{s} + begin)) & {});",
            v - 1
        ));
        self.line("const int fz_hh = fz_to < end - begin ? fz_to : end - begin;");
        self.line("const int fz_h = begin + fz_hh;");
        self.line(format!("const int fz_nv = (end - fz_h) / {v};"));
        self.line(format!("const int fz_rest = end - begin - fz_nv * {v};"));
    }

    /// Starts copying this block's part of the row into shared memory, each thread the elements
    /// it will read in every pass (so no barrier is needed, before the copies or after them: a
    /// thread overwrites only elements it read itself in the previous row's passes): 16-byte
    /// copies (four elements) when the length allows, else one element a copy; all in flight at
    /// once (`cp.async` on sm_80+) until `fz_copy_wait`. A `peel`ed part (`peel_bounds`) copies
    /// its vectors and then its elements before and after them, at every length.
    fn shared_load(&mut self, cached: &[usize], peel: Option<u32>, row: &str) {
        if let Some(v) = peel {
            self.line("#pragma unroll 2");
            self.open(format!(
                "for (int c = threadIdx.x; c < fz_nv; c += {BLOCK})"
            ));
            self.copies(
                cached,
                v,
                &format!("c * {v}"),
                row,
                &format!("fz_h + c * {v}"),
            );
            self.close();
            self.open(format!(
                "for (int k = threadIdx.x; k < fz_rest; k += {BLOCK})"
            ));
            self.peeled_position(v);
            self.copies(cached, 1, &format!("fz_nv * {v} + k"), row, "r");
            self.close();
            return;
        }
        for (i, v) in self.long_lanes(cached).into_iter().enumerate() {
            let test = format!("if ((len & {}) == 0)", v - 1);
            self.open(if i == 0 { test } else { format!("else {test}") });
            // Two copies a step, not four: with four, the next row's prefetch after them tipped
            // layernorm_quantize on sm_90 into spills (the copies wait on nothing either way).
            self.line("#pragma unroll 2");
            self.open(format!(
                "for (int c = begin / {v} + threadIdx.x; c < end / {v}; c += {BLOCK})"
            ));
            self.copies(
                cached,
                v,
                &format!("(c * {v} - begin)"),
                row,
                &format!("c * {v}"),
            );
            self.close();
            self.close();
        }
        self.open("else");
        self.line("#pragma unroll 2");
        self.open(format!(
            "for (int r = begin + threadIdx.x; r < end; r += {BLOCK})"
        ));
        self.copies(cached, 1, "(r - begin)", row, "r");
        self.close();
        self.close();
    }

    /// The copies of `v` elements of each cached tensor, from element `from` of the row that
    /// starts at element `row` (every cached tensor is dense over the domain, the row's dim
    /// last: `b<s>` of row `g` is `g * len`) to `to` of its shared part.
    fn copies(&mut self, cached: &[usize], v: u32, to: &str, row: &str, from: &str) {
        for &p in cached {
            let (t, name) = self.param_text(p);
            let bytes = match v {
                1 => format!("sizeof({t})"),
                _ => format!("{v} * sizeof({t})"),
            };
            self.line(format!(
                "fz_copy_async<{bytes}>(sc_{name} + {to}, p_{name} + {row} + {from});"
            ));
        }
    }

    /// Whether each step of the last pass over a row copies this block's part of the next row
    /// of its cluster into the slots the step has just read (`copies_next_row`), rather than
    /// the next row being copied in after the passes: where the grid loops over rows (partial
    /// sums over rows keep it resident), the copies are then in flight while the last pass and
    /// its reductions run, not waited for at the next row's start. A thread copies into only
    /// the slots it reads, as the copies before the passes do; a peeled part (no partial sums,
    /// `long_peel`) and a last pass that stashes keep the copies before the passes.
    ///
    /// Only where two passes or more come before the last: the next row's L2 prefetch, asked
    /// at this row's start (`next_row_prefetch`), then has them to arrive before its copies
    /// read it. After one pass, the copies mostly wait on memory beside the last pass's
    /// writes: on an H100, RMSNorm's backward (two passes) at 16384 and 32768 columns ran 3
    /// and 7% slower with the copies in its last pass, LayerNorm's (three) 4-9% faster; both
    /// 3-20% slower without the prefetch (benches/NOTES.md item 142).
    fn copies_ahead(&self, plan: &Plan, cached: &[usize], peel: Option<u32>) -> bool {
        let (_, stashes) = pass_stashes(self.k, plan, cached, false);
        let last_stashes = stashes.last().is_none_or(|(_, stash)| stash.is_some());
        self.partials_in_shared && peel.is_none() && !last_stashes && plan.passes.len() >= 3
    }

    /// In a peeled part's loop over the elements around its vectors (`peel_bounds`), the row
    /// position `r` of the `k`th: the first `fz_hh` before the vectors, the rest after them.
    fn peeled_position(&mut self, v: u32) {
        self.line(format!(
            "const int r = k < fz_hh ? begin + k : fz_h + fz_nv * {v} + (k - fz_hh);"
        ));
    }

    /// Declares `fz_ahead`: `next_row_prefetch` asks L2 for row `g + fz_ahead`. With a cluster
    /// per row, that is the row about 8 MiB of rows on (64 rows of 32768 floats, 8 of 262144),
    /// which a cluster launched later copies; with a grid that loops over rows, this cluster's
    /// own next row. On an H200, S1's softmax at 32768 columns went from 3793 to 3826
    /// GB/s with it, at 262144 from 3264 to 3373; 24 MiB ahead lost a fifth (2959 and 2868):
    /// the prefetched rows pushed each other out of L2 (benches/NOTES.md item 47).
    fn row_ahead(&mut self, cached: &[usize]) {
        let bytes = bytes(self.k, cached);
        self.line("long long fz_ahead = clusters;");
        self.open("if (clusters >= groups)");
        self.line(format!("fz_ahead = (8ll << 20) / (len * {bytes});"));
        self.line("if (fz_ahead < 1) fz_ahead = 1;");
        self.close();
    }

    /// Asks L2 for this block's part of row `g + fz_ahead` once this row's copies are under
    /// way: while the passes run from shared memory, memory streams that row into L2, and its
    /// copies read it from there. Every cached tensor is over the whole domain with the reduced
    /// dim last, and dense, so row `n` starts at `n * len` (`b<s>` for row `g`).
    fn next_row_prefetch(&mut self, cached: &[usize]) {
        self.open("if (g + fz_ahead < groups)");
        for &p in cached {
            let (_, name) = self.param_text(p);
            self.line(format!(
                "fz_prefetch_part_l2(p_{name} + (g + fz_ahead) * len, begin, end);"
            ));
        }
        self.close();
    }

    /// The passes over this block's part of the row, from shared memory: each pass's block
    /// reduction is combined across the cluster, and rank 0 writes the per-row outputs.
    fn shared_passes(
        &mut self,
        plan: &Plan,
        axis: DimId,
        cached: &[usize],
        peel: Option<u32>,
        ahead: bool,
    ) {
        let shapes = self.layout.shapes();
        let (_, stashes) = pass_stashes(self.k, plan, cached, false);
        let last = plan.passes.len().saturating_sub(1);
        for (i, (pass, (reuse, stash))) in plan.passes.iter().zip(stashes).enumerate() {
            self.init_accumulators(&pass.reduces);
            (self.reuse, self.stash) = (reuse, stash);
            self.defers_division = !self.k.draws_random();
            if ahead && i == last {
                self.line("const bool fz_more = g + clusters < groups;");
                self.line("const long long fz_next = (g + clusters) * len;");
                self.copies_next_row = cached.to_vec();
            }
            match peel {
                Some(v) => self.peeled_vector_loop(pass, axis, cached, &shapes, v),
                None => self.shared_vector_loop(pass, axis, cached, &shapes),
            }
            self.defers_division = false;
            self.shared_element_loop(pass, axis, cached, &shapes, peel);
            self.copies_next_row.clear();
            (self.reuse, self.stash) = (None, None);
            self.block_reduce(&pass.reduces, false);
            self.cluster_reduce(&pass.reduces);
            self.finish_reductions(&pass.reduces, "len");
            self.values(&pass.after, Scope::Row);
        }
        if !plan.group_writes.is_empty() {
            self.open("if (rank == 0 && threadIdx.x == 0)");
            self.writes(&plan.group_writes, Scope::Row);
            self.close();
        }
    }

    /// The elements of a vector step (and of a copy into shared memory), widest first: eight
    /// (16 bytes) and then four where every tensor along the row is of at most 2-byte elements
    /// (`stored_row_elems`: the partial sums over rows add up in shared memory), the cached
    /// ones of 2, else four. With four, S2's bf16 softmax at 32768 and 262144 columns ran at 65
    /// and 52% of copy speed on an H100 (f16 80 and 63%), f32 at 92 and 95% (NOTES item 76).
    /// A block's part of the row is a multiple of 32 elements (`fz_part`), so every width
    /// starts it on a whole vector.
    fn long_lanes(&self, cached: &[usize]) -> Vec<u32> {
        let narrow = crate::plan::rows::stored_row_elems(self.k).all(|e| e.bits() <= 16);
        match narrow && cached.iter().all(|&p| self.k.params[p].elem.bits() == 16) {
            true => vec![8, 4],
            false => vec![4],
        }
    }

    /// A vector's elements a step (`shared_vector_step`), `c` the vector's index in the row,
    /// where the row's length is a multiple of its lanes.
    fn shared_vector_loop(
        &mut self,
        pass: &Pass,
        axis: DimId,
        cached: &[usize],
        shapes: &[Vec<DimId>],
    ) {
        for (i, v) in self.long_lanes(cached).into_iter().enumerate() {
            let test = format!("if ((len & {}) == 0)", v - 1);
            self.open(if i == 0 { test } else { format!("else {test}") });
            // Not unrolled: unrolled steps spilled (softmax at 64 registers on sm_90), and
            // shared memory's latency is short.
            self.line("#pragma unroll 1");
            self.open(format!(
                "for (int c = begin / {v} + threadIdx.x; c < end / {v}; c += {BLOCK})"
            ));
            self.shared_vector_step(pass, axis, cached, shapes, v, &format!("c - begin / {v}"));
            self.copy_next_row(v, &format!("(c * {v} - begin)"), &format!("c * {v}"));
            self.close();
            self.close();
        }
    }

    /// A peeled part's vectors (`peel_bounds`), `c` the vector's index from element `fz_h` of
    /// the row (`rows::Cuda::peeled`) and its place in shared memory.
    fn peeled_vector_loop(
        &mut self,
        pass: &Pass,
        axis: DimId,
        cached: &[usize],
        shapes: &[Vec<DimId>],
        v: u32,
    ) {
        self.line("#pragma unroll 1");
        self.open(format!(
            "for (int c = threadIdx.x; c < fz_nv; c += {BLOCK})"
        ));
        self.peeled = true;
        self.shared_vector_step(pass, axis, cached, shapes, v, "c");
        self.peeled = false;
        self.close();
    }

    /// A vector step from shared memory: the cached tensors' vectors of `v` at `slot` of this
    /// block's part (`rc_<name>[0]`, as the register cache names them), and a stashing pass's
    /// values stored back there.
    fn shared_vector_step(
        &mut self,
        pass: &Pass,
        axis: DimId,
        cached: &[usize],
        shapes: &[Vec<DimId>],
        v: u32,
        slot: &str,
    ) {
        self.line("const int q = 0;");
        for &p in cached {
            let (t, name) = self.param_text(p);
            self.line(format!("const fz_vec<{t}, {v}> rc_{name}[1] = {{reinterpret_cast<const fz_vec<{t}, {v}>*>(sc_{name})[{slot}]}};"));
        }
        let stash = self.stash.map(|_| self.param_text(cached[0]));
        if let Some((t, _)) = &stash {
            self.line(format!("fz_vec<{t}, {v}> fz_st;"));
        }
        // `rc_<name>[q]` is the vector, as in a tiled short row: a pass that only takes a
        // 16-bit row's maximum takes it two elements an instruction (`packed_reduction`).
        self.step_lanes = v;
        self.rows_at_q = true;
        self.vector_row_step(pass, axis, cached, shapes, false);
        self.rows_at_q = false;
        self.step_lanes = 4;
        if let Some((t, name)) = &stash {
            self.line(format!(
                "reinterpret_cast<fz_vec<{t}, {v}>*>(sc_{name})[{slot}] = fz_st;"
            ));
        }
    }

    /// One element a step, for lengths that are not a multiple of four: the cached tensors read
    /// through `rc_<name>[q].v[j]`, which here points into shared memory, a vector of one element
    /// (`j` is 0): each thread reads only the elements it copied, before any barrier. Read as
    /// vectors of four, around its own, racecheck found every 16-bit odd-length row reading what
    /// other threads' copies were writing (the values unused, but a race).
    fn shared_element_loop(
        &mut self,
        pass: &Pass,
        axis: DimId,
        cached: &[usize],
        shapes: &[Vec<DimId>],
        peel: Option<u32>,
    ) {
        match peel {
            Some(v) => {
                self.open("");
                self.line("#pragma unroll 1");
                self.open(format!(
                    "for (int k = threadIdx.x; k < fz_rest; k += {BLOCK})"
                ));
                self.peeled_position(v);
                self.line(format!("const int q = fz_nv * {v} + k;"));
            }
            None => {
                self.open("else");
                self.line("#pragma unroll 1");
                self.open(format!(
                    "for (int r = begin + threadIdx.x; r < end; r += {BLOCK})"
                ));
                self.line("const int q = r - begin;");
            }
        }
        self.line("const int j = 0;");
        for &p in cached {
            let (t, name) = self.param_text(p);
            self.line(format!("const fz_vec<{t}, 1>* const rc_{name} = reinterpret_cast<const fz_vec<{t}, 1>*>(sc_{name});"));
        }
        self.row_step(pass, axis, cached, shapes, false);
        if let Some(n) = self.stash {
            let (_, name) = self.param_text(cached[0]);
            self.line(format!("sc_{name}[q] = v{n};"));
        }
        if peel.is_none() {
            self.copy_next_row(1, "(r - begin)", "r");
        }
        self.close();
        self.close();
    }

    /// In a step of the last pass over a row (`copies_ahead`), once the step has read its
    /// slots: the copies of the same `v` elements of the cluster's next row into them, as
    /// `shared_load` maps them (`to` in the part, `from` in the row, which starts at
    /// `fz_next`).
    fn copy_next_row(&mut self, v: u32, to: &str, from: &str) {
        if self.copies_next_row.is_empty() {
            return;
        }
        let cached = std::mem::take(&mut self.copies_next_row);
        self.open("if (fz_more)");
        self.copies(&cached, v, to, "fz_next", from);
        self.close();
        self.copies_next_row = cached;
    }

    /// The exchange's buffers and state, before the row loop: each block's slots for every
    /// block's results of a pass (`fz_xs`, two phases of [`MAX_CLUSTER`] slots a reduction), and
    /// a transaction barrier a phase (`fz_mbar`), initialized and made known to the cluster.
    fn exchange_start(&mut self, plan: &Plan) {
        let most = pass_reductions(plan);
        self.line("unsigned int phase = 0;");
        if most == 0 {
            return;
        }
        self.line(format!(
            "__shared__ unsigned long long fz_xs[2][{}];",
            most * MAX_CLUSTER
        ));
        self.line("__shared__ unsigned long long fz_mbar[2];");
        self.line("unsigned int fz_parity = 0;");
        self.line("if (blocks > 1) fz_exchange_init(fz_mbar, fz_xs[0]);");
    }

    /// Combines the blocks' results of `reduces` across the cluster: the first `blocks` threads
    /// of each block send its results into slot `rank` of every block's current phase
    /// (`fz_send`), each block waits until all of them have landed in its own slots (its
    /// phase's transaction barrier counts the bytes), and every thread combines them in rank
    /// order, so every block gets the same value. A cluster barrier would order the same, but
    /// its release waits for every earlier store of the block to reach memory: two a row cost
    /// S1's softmax at 32768 and 262144 columns 8 and 10 points of copy bandwidth on an H200
    /// (benches/NOTES.md item 49). Two phases alternate: a block sends into a phase again only
    /// after the next exchange, which no block completes before every block has read this one.
    fn cluster_reduce(&mut self, reduces: &[NodeId]) {
        if reduces.is_empty() {
            return;
        }
        let slot = |s: usize| match s {
            0 => "fz_x".to_string(),
            s => format!("fz_x + {}", s * MAX_CLUSTER),
        };
        self.open("if (blocks > 1)");
        self.line("unsigned long long* const fz_x = fz_xs[phase];");
        self.line(format!(
            "if (threadIdx.x == 0) fz_expect(&fz_mbar[phase], blocks * {}u);",
            8 * reduces.len()
        ));
        self.open("if (threadIdx.x < blocks)");
        for (s, &r) in reduces.iter().enumerate() {
            self.line(format!(
                "fz_send({} + rank, acc{r}, &fz_mbar[phase], threadIdx.x);",
                slot(s)
            ));
        }
        self.close();
        self.line("fz_wait(&fz_mbar[phase], fz_parity, phase);");
        for (s, &r) in reduces.iter().enumerate() {
            let (op, e) = self.reduction(r);
            let t = e.c_name();
            self.line(format!("acc{r} = fz_take<{t}>({});", slot(s)));
            self.open("for (unsigned int b = 1; b < blocks; ++b)");
            self.line(format!("const {t} other = fz_take<{t}>({} + b);", slot(s)));
            let combined = super::super::text::combine(op, e, &format!("acc{r}"), "other");
            self.line(format!("acc{r} = {combined};"));
            self.close();
        }
        self.line("phase ^= 1u;");
        self.close();
    }
}

/// The row-a-block loop's bulk copies of its next row, on the transaction barriers of
/// [`HELPERS`] (which come first, `fz_long_rows` sorting before `fz_row_copy`).
pub const ROW_COPY_HELPERS: &str = concat!(
    "#ifdef __CUDA_ARCH__\n",
    "#if __CUDA_ARCH__ >= 900\n",
    // The row-a-block loop's copies of the next row (`rows::Cuda::copy_row_in_bulk`): one bulk
    // copy by one thread, counted by the transaction barrier of the buffer it fills, its lines
    // evicted last in L2. Against four `cp.async` a thread on an H200: W5 and W8 96% -> 98% of
    // copy speed, W6 94 -> 95-96%, W7 94 -> 96%, W9 98 -> 101% (NOTES item 54).
    "static __device__ __forceinline__ void fz_row_barriers(unsigned long long* mbar) {\n",
    "    fz_barriers_init(mbar);\n",
    "    __syncthreads();\n",
    "}\n",
    "static __device__ __forceinline__ void fz_copy_bulk(void* dst, const void* src, unsigned int bytes, unsigned long long* mbar) {\n",
    "    unsigned long long k;\n",
    "    asm volatile(\"createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\" : \"=l\"(k));\n",
    "    asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\" :: \"r\"((unsigned int)__cvta_generic_to_shared(dst)), \"l\"(src), \"r\"(bytes), \"r\"((unsigned int)__cvta_generic_to_shared(mbar)), \"l\"(k) : \"memory\");\n",
    "}\n",
    "static __device__ __forceinline__ void fz_copy_row(void* dst, const void* src, unsigned int bytes, unsigned long long* mbar) {\n",
    "    fz_expect(mbar, bytes);\n",
    "    fz_copy_bulk(dst, src, bytes, mbar);\n",
    "}\n",
    "static __device__ __forceinline__ void fz_row_wait(unsigned long long* mbar, unsigned int& parity, unsigned int phase) { fz_wait(mbar, parity, phase); }\n",
    "#else\n",
    // Unused: the row-a-block loop is compiled for sm_90 and later only.
    "static __device__ __forceinline__ void fz_row_barriers(unsigned long long*) {}\n",
    "static __device__ __forceinline__ void fz_copy_bulk(void*, const void*, unsigned int, unsigned long long*) {}\n",
    "static __device__ __forceinline__ void fz_copy_row(void*, const void*, unsigned int, unsigned long long*) {}\n",
    "static __device__ __forceinline__ void fz_row_wait(unsigned long long*, unsigned int&, unsigned int) {}\n",
    "#endif\n",
    "#endif\n",
);

/// `fz_prefetch_l2`, for the GPU only (the emulation of `fuse-runtime/tests/emulate` supplies
/// its own): the long rows' copies and the tiled short rows take it.
pub const L2_PREFETCH: &str = concat!(
    "#ifdef __CUDA_ARCH__\n",
    // A hint that L2 should hold `bytes` from `from` soon; nothing waits for it. On sm_90 one
    // bulk prefetch by thread 0, of the 16-byte-aligned bytes within the range (the instruction
    // asks that alignment); before, each thread a line of 128 bytes in turn.
    "static __device__ __forceinline__ void fz_prefetch_l2(const void* from, long long bytes) {\n",
    "    const unsigned long long start = (unsigned long long)__cvta_generic_to_global(from);\n",
    "#if __CUDA_ARCH__ >= 900\n",
    "    const unsigned long long first = (start + 15) & ~15ull, last = (start + bytes) & ~15ull;\n",
    "    if (threadIdx.x == 0 && last > first) asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: \"l\"(first), \"r\"((unsigned int)(last - first)));\n",
    "#else\n",
    "    if (bytes > 0) for (unsigned long long line = (start & ~127ull) + 128ull * threadIdx.x; line < start + bytes; line += 128ull * blockDim.x) asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"(line));\n",
    "#endif\n",
    "}\n",
    "#endif\n",
);

/// The helper functions of the shared-memory path: those within `__CUDA_ARCH__` for the GPU
/// only (the emulation of `fuse-runtime/tests/emulate` supplies its own), then the arithmetic
/// both share.
pub const HELPERS: &str = concat!(
    "#ifdef __CUDA_ARCH__\n",
    // The dynamic shared memory starts on a 128-byte line, after the static (the reductions'
    // buffers and the exchange's slots): 32-byte alignment put it 96 bytes off one, which cost
    // S1's softmax at 262144 columns three points of copy bandwidth on an H200; at 32768 the
    // aligned start measured a point slower (benches/NOTES.md item 50).
    "static __device__ __forceinline__ unsigned char* fz_shared() { extern __shared__ __align__(128) unsigned char fz_row[]; return fz_row; }\n",
    "static __device__ __forceinline__ unsigned int fz_smem_bytes() { unsigned int r; asm(\"mov.u32 %0, %%dynamic_smem_size;\" : \"=r\"(r)); return r; }\n",
    // Copies that stay in flight until `fz_copy_wait`, without registers (sm_80+); 16 bytes
    // bypass L1 (the row is read once), asking L2 for the whole 128-byte line (on an H200 every
    // row kernel of the benchmark a fraction of a point faster, 256 bytes slower; NOTES item 34).
    "template <int N> static __device__ __forceinline__ void fz_copy_async(void* dst, const void* src) {\n",
    "#if __CUDA_ARCH__ >= 800\n",
    "    const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);\n",
    "    if constexpr (N >= 16) {\n",
    "        for (int k = 0; k < N; k += 16) asm volatile(\"cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\" :: \"r\"(d + k), \"l\"((const unsigned char*)src + k) : \"memory\");\n",
    "    } else if constexpr (N >= 4) {\n",
    "        asm volatile(\"cp.async.ca.shared.global [%0], [%1], %2;\" :: \"r\"(d), \"l\"(src), \"n\"(N) : \"memory\");\n",
    "    } else {\n",
    "        for (int k = 0; k < N; ++k) ((unsigned char*)dst)[k] = ((const unsigned char*)src)[k];\n",
    "    }\n",
    "#else\n",
    "    for (int k = 0; k < N; ++k) ((unsigned char*)dst)[k] = ((const unsigned char*)src)[k];\n",
    "#endif\n",
    "}\n",
    "static __device__ __forceinline__ void fz_copy_wait() {\n",
    "#if __CUDA_ARCH__ >= 800\n",
    "    asm volatile(\"cp.async.wait_all;\" ::: \"memory\");\n",
    "#endif\n",
    "}\n",
    "#if __CUDA_ARCH__ >= 900\n",
    "static __device__ __forceinline__ unsigned int fz_cluster_size() { unsigned int r; asm(\"mov.u32 %0, %%cluster_nctarank;\" : \"=r\"(r)); return r; }\n",
    // The last barrier orders nothing (every slot read has been used): a relaxed arrival, so
    // that a block need not wait for its global stores to complete before the others go on.
    "static __device__ __forceinline__ void fz_cluster_exit() { asm volatile(\"barrier.cluster.arrive.relaxed.aligned;\\n\\tbarrier.cluster.wait.aligned;\" ::: \"memory\"); }\n",
    // Two transaction barriers, each completing a phase when its block has arrived once
    // (`fz_expect`) and the bytes it expects have landed, initialized by thread 0; the
    // initialization is made known to the cluster by the one fence that needs no round trip to
    // memory. The caller then waits at a barrier before any use.
    "static __device__ __forceinline__ void fz_barriers_init(unsigned long long* mbar) {\n",
    "    if (threadIdx.x == 0) {\n",
    "        asm volatile(\"mbarrier.init.shared::cta.b64 [%0], 1;\" :: \"r\"((unsigned int)__cvta_generic_to_shared(mbar)) : \"memory\");\n",
    "        asm volatile(\"mbarrier.init.shared::cta.b64 [%0], 1;\" :: \"r\"((unsigned int)__cvta_generic_to_shared(mbar + 1)) : \"memory\");\n",
    "        asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n",
    "    }\n",
    "}\n",
    // The exchange's barriers, a phase each, then a relaxed cluster barrier, after which any
    // block may send. The second argument, the block's slots, is the emulation's
    // (`tests/emulate`), which writes into other blocks' slots at their offsets.
    "static __device__ __forceinline__ void fz_exchange_init(unsigned long long* mbar, unsigned long long*) {\n",
    "    fz_barriers_init(mbar);\n",
    "    asm volatile(\"barrier.cluster.arrive.relaxed.aligned;\\n\\tbarrier.cluster.wait.aligned;\" ::: \"memory\");\n",
    "}\n",
    "static __device__ __forceinline__ void fz_expect(unsigned long long* mbar, unsigned int bytes) { asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\" :: \"r\"((unsigned int)__cvta_generic_to_shared(mbar)), \"r\"(bytes) : \"memory\"); }\n",
    // `value` into `slot` of block `to` of the cluster, counted by that block's `mbar`.
    "template <typename T> static __device__ __forceinline__ void fz_send(unsigned long long* slot, T value, unsigned long long* mbar, unsigned int to) {\n",
    "    union { unsigned long long u; T t; } v;\n",
    "    v.u = 0ull;\n",
    "    v.t = value;\n",
    "    unsigned int at, bar;\n",
    "    asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\" : \"=r\"(at) : \"r\"((unsigned int)__cvta_generic_to_shared(slot)), \"r\"(to));\n",
    "    asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\" : \"=r\"(bar) : \"r\"((unsigned int)__cvta_generic_to_shared(mbar)), \"r\"(to));\n",
    "    asm volatile(\"st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];\" :: \"r\"(at), \"l\"(v.u), \"r\"(bar) : \"memory\");\n",
    "}\n",
    // Waits for the phase of `mbar` (`phase`'s bit of `parity`) to complete, then flips the bit.
    "static __device__ __forceinline__ void fz_wait(unsigned long long* mbar, unsigned int& parity, unsigned int phase) {\n",
    "    const unsigned int at = (unsigned int)__cvta_generic_to_shared(mbar), bit = (parity >> phase) & 1u;\n",
    "    unsigned int done;\n",
    "    do {\n",
    "        asm volatile(\"{\\n\\t.reg .pred p;\\n\\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n\\tselp.u32 %0, 1, 0, p;\\n\\t}\" : \"=r\"(done) : \"r\"(at), \"r\"(bit) : \"memory\");\n",
    "    } while (!done);\n",
    "    parity ^= 1u << phase;\n",
    "}\n",
    "#else\n",
    // Without clusters a block is its own cluster: nothing is exchanged.
    "static __device__ __forceinline__ unsigned int fz_cluster_size() { return 1u; }\n",
    "static __device__ __forceinline__ void fz_cluster_exit() { __syncthreads(); }\n",
    "static __device__ __forceinline__ void fz_exchange_init(unsigned long long*, unsigned long long*) {}\n",
    "static __device__ __forceinline__ void fz_expect(unsigned long long*, unsigned int) {}\n",
    "template <typename T> static __device__ __forceinline__ void fz_send(unsigned long long*, T, unsigned long long*, unsigned int) {}\n",
    "static __device__ __forceinline__ void fz_wait(unsigned long long*, unsigned int&, unsigned int) {}\n",
    "#endif\n",
    "template <typename T> static __device__ __forceinline__ T fz_take(const unsigned long long* slot) { union { unsigned long long u; T t; } v; v.u = *slot; return v.t; }\n",
    "#endif\n",
    // This block's share of a row of `len` elements split over the `blocks` of its cluster:
    // `part` elements, `[begin, end)` within the row: a multiple of 32, so that every part of an
    // aligned row starts on a 128-byte line (of 4-byte elements) and its 16-byte copies take no
    // more sectors than the bytes need. (Multiples of four put S1's parts of 32768-float rows 48
    // bytes off their lines: 15% more sectors read, 27% more shared-memory wavefronts.)
    "static __device__ __forceinline__ int fz_part(long long len, unsigned int blocks, unsigned int rank, int& begin, int& end) {\n",
    "    const int part = (int)((((unsigned int)len + blocks - 1) / blocks + 31) & ~31u);\n",
    "    begin = part * rank < len ? (int)(part * rank) : (int)len;\n",
    "    end = len - begin < part ? (int)len : begin + part;\n",
    "    return part;\n",
    "}\n",
    // An L2 prefetch of this block's part `[begin, end)` of the row at `row`; on sm_90 by thread
    // 0 alone (`fz_prefetch_l2`'s bulk prefetch), so the other threads skip its arithmetic.
    "template <typename T> static __device__ __forceinline__ void fz_prefetch_part_l2(const T* row, int begin, int end) {\n",
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n",
    "    if (threadIdx.x != 0) return;\n",
    "#endif\n",
    "    fz_prefetch_l2(row + begin, (end - begin) * (long long)sizeof(T));\n",
    "}\n",
);

#[cfg(test)]
mod tests {
    use crate::ir::Kernel;
    use crate::plan::rows::{cached_bytes, stashes};
    use crate::testing::kernel;
    use quote::quote;

    /// What each pass stores in the slot of tensor 0, as text: the node's operation.
    fn stashed(k: &Kernel) -> Vec<Option<String>> {
        stashes(k, &crate::plan::plan(k), 0, false)
            .into_iter()
            .map(|n| n.map(|n| format!("{:?}", k.nodes[n].op)))
            .collect()
    }

    #[test]
    fn later_passes_read_what_an_earlier_one_stored() {
        // Softmax: the sum's pass stores exp(x - max), which the write pass divides.
        let softmax = kernel(quote! {
            fn f(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        let found = stashed(&softmax);
        assert_eq!(found.len(), 3);
        assert!(found[0].is_none() && found[2].is_none(), "{found:?}");
        assert!(
            found[1].as_deref().is_some_and(|op| op.starts_with("Call")),
            "{found:?}"
        );
        // W7's layernorm and quantization: x - mean, then the normalized value.
        let quantize = kernel(quote! {
            fn f(x: [f32; r, c], g: [f32; c], b: [f32; c]) -> ([i8; r, c], [f32; r]) {
                let d = x - mean(x, c);
                let y = d * rsqrt(mean(d * d, c) + 1e-5) * g + b;
                let scale = max(y.abs(), c) / 127.0;
                ((y / scale).round().clamp(-127.0, 127.0) as i8, scale)
            }
        });
        let found = stashed(&quantize);
        assert_eq!(found.len(), 4);
        assert!(
            found[1]
                .as_deref()
                .is_some_and(|op| op.starts_with("Binary(Sub")),
            "{found:?}"
        );
        assert!(
            found[2]
                .as_deref()
                .is_some_and(|op| op.starts_with("Binary(Add")),
            "{found:?}"
        );
        assert!(found[3].is_none(), "{found:?}");
    }

    #[test]
    fn nothing_is_stored_over_an_element_a_later_pass_reads() {
        // The write pass reads x itself as well as exp(x - max): the slot must keep x.
        let k = kernel(quote! {
            fn f(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); x * e / sum(e, c) }
        });
        assert_eq!(stashed(&k), vec![None, None, None]);
        // 16-bit floats round where they store, so their values stay computed.
        let h = kernel(quote! {
            fn f(x: [f16; r, c]) -> [f16; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) }
        });
        assert_eq!(stashed(&h), vec![None, None, None]);
    }

    fn source(tokens: proc_macro2::TokenStream) -> String {
        let k = kernel(tokens);
        crate::cuda::text(&k)
    }

    #[test]
    fn multi_pass_rows_cache_their_whole_domain_tensors() {
        let k = kernel(quote! {
            fn f(x: [f32; r, c], w: [f64; r, c], m: [u8; r, c], g: [f32; c]) -> [f64; r, c] {
                (x as f64 - sum(x as f64 * w, c)) * w + m as f64 + g as f64
            }
        });
        assert_eq!(
            cached_bytes(&k, &crate::plan::plan(&k)),
            4 + 8 + 1,
            "g is along the row only"
        );
        let text = source(quote! {
            fn f(x: [f32; r, c], w: [f64; r, c], m: [u8; r, c], g: [f32; c]) -> [f64; r, c] {
                (x as f64 - sum(x as f64 * w, c)) * w + m as f64 + g as f64
            }
        });
        assert!(
            text.contains("if (blocks > 16 || fz_smem_bytes() < (long long)part * 13) return;"),
            "{text}"
        );
        // The path is the long-row entry's, after the row kernel, which has none of it.
        let entry = text
            .find("void __launch_bounds__(256, 2) fuse_f_long_rows(")
            .expect("the entry");
        assert!(
            !text[..entry].contains("fz_smem_bytes() <") && text[entry..].contains("sc_w"),
            "{text}"
        );
        // Widest first, so that each part stays aligned for vectors of four.
        let (w, x, m) = (
            text.find("double* const sc_w = (double*)fz_shared();"),
            text.find("float* const sc_x = (float*)(fz_shared() + part * 8);"),
            text.find("unsigned char* const sc_m = (unsigned char*)(fz_shared() + part * 12);"),
        );
        assert!(w.is_some() && x.is_some() && m.is_some(), "{text}");
        assert!(text.contains(
            "fz_copy_async<4 * sizeof(double)>(sc_w + (c * 4 - begin), p_w + b0 + c * 4);"
        ));
        assert!(text.contains(
            "const fz_vec<float, 4> lv_g = *(reinterpret_cast<const fz_vec<float, 4>*>(p_g + b1) + c);"
        ));
        // The next row's part of each cached tensor, once this row's copies are issued and
        // before they are waited for; `g` is along the row only, so it has no prefetch.
        let (copied, prefetched, waited) = (
            text.find("fz_copy_async<sizeof(unsigned char)>(sc_m"),
            text.find("fz_prefetch_part_l2(p_m + (g + fz_ahead) * len, begin, end);"),
            text.find("fz_copy_wait();"),
        );
        assert!(
            copied.is_some() && copied < prefetched && prefetched < waited,
            "{text}"
        );
        assert!(text.contains("if (g + fz_ahead < groups)"), "{text}");
        assert!(text.contains("fz_prefetch_part_l2(p_w + (g + fz_ahead) * len,"));
        // About 8 MiB of rows ahead with a cluster per row: here f64, f32 and u8 are cached,
        // 13 bytes an element.
        assert!(
            text.contains("fz_ahead = (8ll << 20) / (len * 13);"),
            "{text}"
        );
        assert!(!text.contains("fz_prefetch_part_l2(p_g"), "{text}");
    }

    #[test]
    fn reductions_combine_across_the_cluster_in_rank_order() {
        let text = source(quote! {
            fn f(x: [f32; r, c]) -> ([f32; r, c], [f32; r]) {
                let m = max(x, c);
                (x - m, m + sum(x, c))
            }
        });
        // Both reductions of the first pass: each block sends its results into slot `rank` of
        // every block (a row of 16 slots a reduction, in two phases), waits for all of them,
        // and reads them in rank order.
        assert!(
            text.contains("__shared__ unsigned long long fz_xs[2][32];"),
            "{text}"
        );
        assert!(
            text.contains("if (threadIdx.x == 0) fz_expect(&fz_mbar[phase], blocks * 16u);"),
            "{text}"
        );
        assert!(text.contains("fz_send(fz_x + 16 + rank, acc"), "{text}");
        let (waited, read) = (
            text.find("fz_wait(&fz_mbar[phase], fz_parity, phase);"),
            text.find("const float other = fz_take<float>(fz_x + 16 + b);"),
        );
        assert!(waited.is_some() && waited < read, "{text}");
        assert!(
            text.contains("for (unsigned int b = 1; b < blocks; ++b)"),
            "{text}"
        );
        // The per-row output from rank 0 only; no block leaves before the others.
        assert!(
            text.contains("if (rank == 0 && threadIdx.x == 0)"),
            "{text}"
        );
        assert!(
            text.contains("if (blocks > 1) fz_cluster_exit();\n"),
            "{text}"
        );
    }

    #[test]
    fn single_passes_and_other_axes_have_no_shared_path() {
        let single = kernel(quote! { fn f(x: [f32; r, c]) -> [f32; r] { sum(x, c) } });
        let columns = kernel(quote! {
            fn f(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, r)).exp(); e / sum(e, r) }
        });
        let map = kernel(quote! { fn f(x: [f32; n]) -> [f32; n] { x * 2.0 } });
        for k in [single, columns, map] {
            assert_eq!(cached_bytes(&k, &crate::plan::plan(&k)), 0);
            assert!(!crate::cuda::text(&k).contains("fz_smem_bytes"));
        }
    }

    #[test]
    fn more_reductions_than_slots_have_no_shared_path() {
        let k = kernel(quote! {
            fn f(x: [f32; r, c]) -> [f32; r, c] {
                let a = sum(x, c) + sum(x * 2.0, c) + sum(x * 3.0, c) + sum(x * 4.0, c);
                let b = sum(x * 5.0, c) + sum(x * 6.0, c) + sum(x * 7.0, c) + sum(x * 8.0, c);
                let d = sum(x * 9.0, c) + sum(x * 10.0, c) + sum(x * 11.0, c) + sum(x * 12.0, c);
                let e = sum(x * 13.0, c) + sum(x * 14.0, c) + sum(x * 15.0, c) + sum(x * 16.0, c);
                x - a - b - d - e - sum(x * 17.0, c)
            }
        });
        assert_eq!(
            cached_bytes(&k, &crate::plan::plan(&k)),
            0,
            "17 slots in one pass"
        );
    }
}
