//! The row passes of the tiled short rows, over each tile's rows in shared memory: a vector of
//! two, four or eight elements a thread where the length allows, else two elements a thread.

use super::super::text::identity;
use super::super::{Cuda, Scope, SYNTAX};
use crate::ir::{DimId, NodeId, Reduce};
use crate::plan::rows::Tiled;
use crate::plan::{Pass, Plan};

impl Cuda<'_> {
    /// The passes over the tile's rows, `per_block` rows at a time. Inside, each tiled tensor's
    /// name stands for its row in shared memory, so the row steps read and write the tile; a
    /// segment past the tile's last row computes on that row and writes nothing. `rows` are the
    /// dims of `domain` besides `axis`.
    pub(super) fn tile_row_passes(
        &mut self,
        domain: &[DimId],
        rows: &[DimId],
        axis: DimId,
        plan: &Plan,
        tiled: &[Tiled],
        lanes: &[u32],
    ) {
        // Not unrolled: ptxas interleaved rows where the register bound allowed, raising row
        // kernels bounded at 128 registers (a sum over rows: 46 to 56) and so lowering the
        // occupancy of their other paths; 32 warps an SM have latency enough to hide.
        self.line("#pragma unroll 1");
        self.open("for (int fz_l0 = 0; fz_l0 < fz_rows_here; fz_l0 += per_block)");
        // On a tile's last row step, a segment past its rows computes on the tile's unused
        // rows of shared memory (whose contents are stale) and writes only there, so the
        // element steps need no guard; its global accesses are those of the tile's last row.
        self.line("const int fz_row = fz_l0 + (int)threadIdx.x / width;");
        self.line("const bool live = fz_row < fz_rows_here;");
        self.line("const long long g = fz_t0 + (live ? fz_row : fz_rows_here - 1);");
        for l in self.layout.split("g", rows, &SYNTAX) {
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
            let constness = if t.input() { "const " } else { "" };
            self.line(format!(
                "{constness}{}* __restrict__ {} = {} + fz_row * (int)len;",
                t.storage,
                t.global,
                t.shared()
            ));
        }
        self.values(&plan.prologue, Scope::Row);
        // Each branch ends with the row's writes, of the values its passes declared.
        // The vectors of other than four elements (`fz_short_rows`' `lanes`), then four.
        for (i, &l) in lanes.iter().enumerate() {
            let branch = if i == 0 { "if" } else { "else if" };
            self.open(format!("{branch} constexpr (fours && lanes == {l})"));
            self.vector_passes(axis, plan, tiled, &shapes, l);
            self.group_writes(plan);
            self.close();
        }
        match lanes.is_empty() {
            true => self.open("if constexpr (fours)"),
            false => self.open("else if constexpr (fours)"),
        }
        self.vector_passes(axis, plan, tiled, &shapes, 4);
        self.group_writes(plan);
        self.close();
        self.open("else");
        self.pair_passes(axis, plan, &shapes);
        self.group_writes(plan);
        self.close();
        self.close();
    }

    /// The writes of values per row, by the first thread of each live segment.
    fn group_writes(&mut self, plan: &Plan) {
        if !plan.group_writes.is_empty() {
            self.open("if (live && lane == 0)");
            self.writes(&plan.group_writes, Scope::Row);
            self.close();
        }
    }

    /// The passes over a row whose length is a multiple of `lanes` (four, eight where
    /// `tile_eights`, or two for a row of two), `width * lanes` or (unless `full`) less: each
    /// thread takes vector `c = lane` of the row, `lanes` elements, from each tiled input's row
    /// in shared memory (`rc_<name>[0]`, as the register cache names them), and writes its
    /// outputs' vectors there, or, for vectors of four or eight where the tensors are aligned,
    /// straight to global memory. The vectors are read once, before the passes, so that the
    /// values a pass shares with an earlier one (softmax's `exp`) are computed once: read again
    /// in each pass, across the shuffles, they were not.
    fn vector_passes(
        &mut self,
        axis: DimId,
        plan: &Plan,
        tiled: &[Tiled],
        shapes: &[Vec<DimId>],
        lanes: u32,
    ) {
        // A lane past the row's end takes vector 0 again, and its step runs like the others
        // (no branch, so the values stay shared between passes): its writes store lane 0's
        // values where lane 0 stores them, and its accumulators are set back to the identity.
        self.line(format!(
            "const bool fz_in = full || lane * {lanes} < (int)len;"
        ));
        self.line("const int c = fz_in ? lane : 0;");
        self.line("const int q = 0;");
        // Vectors of four or eight: each live lane stores its vectors straight to the row in
        // global memory, where a warp's stores cover consecutive rows, whole and aligned
        // (`fz_aligned`); the tile's outputs are then not copied out (`copy_out`). A lane past
        // its row's end or its tile's rows stores into the tile, which nothing reads.
        if lanes != 2 {
            for t in tiled.iter().filter(|t| !t.input()) {
                self.line(format!(
                    "{}* __restrict__ {} = fz_aligned && live && fz_in ? {} + g * len : {} + fz_row * (int)len;",
                    t.storage,
                    t.global,
                    t.direct(),
                    t.shared()
                ));
            }
        }
        let cached: Vec<usize> = tiled.iter().filter_map(|t| t.param).collect();
        // Divisions by a row's value are checked four at a time (`tiled`), except beside
        // Philox's rounds: `softmax_dropout` spilled at 64 registers with both.
        let random = self.k.draws_random();
        for &p in &cached {
            let (t, name) = self.param_text(p);
            self.line(format!("const fz_vec<{t}, {lanes}> rc_{name}[1] = {{reinterpret_cast<const fz_vec<{t}, {lanes}>*>(p_{name})[c]}};"));
        }
        for pass in &plan.passes {
            self.init_accumulators(&pass.reduces);
            // A scope of its own for the step's names (`lv_<name>`, `s<o>`, `fz_bad`): a block
            // without control flow, which keeps the values shared between passes.
            self.open("");
            self.defers_division = !random;
            self.step_lanes = lanes;
            self.rows_at_q = true;
            self.vector_row_step(pass, axis, &cached, shapes, false);
            self.rows_at_q = false;
            self.step_lanes = 4;
            self.defers_division = false;
            self.close();
            if !pass.reduces.is_empty() {
                self.open("if (!fz_in)");
                self.reset_accumulators(&pass.reduces);
                self.close();
            }
            self.block_reduce(&pass.reduces, true);
            self.finish_reductions(&pass.reduces, "len");
            self.values(&pass.after, Scope::Row);
        }
    }

    /// Sets the accumulators of `reduces` back to their identities, as `init_accumulators`
    /// declares them.
    fn reset_accumulators(&mut self, reduces: &[NodeId]) {
        for &r in reduces {
            let (op, e) = self.reduction(r);
            self.line(format!("acc{r} = {};", identity(op, e)));
            if op == Reduce::LogSumExp {
                self.line(format!("acs{r} = 0;"));
            }
        }
    }

    /// The passes over a row of any length: each thread takes elements `lane` and, where the
    /// row is longer than `width`, `lane + width` (`width <= len` always).
    fn pair_passes(&mut self, axis: DimId, plan: &Plan, shapes: &[Vec<DimId>]) {
        self.line("const bool fz_second = lane + width < len;");
        for pass in &plan.passes {
            self.init_accumulators(&pass.reduces);
            self.tile_step(pass, axis, shapes, "lane", None);
            self.tile_step(
                pass,
                axis,
                shapes,
                "fz_second ? lane + width : lane",
                Some("fz_second"),
            );
            self.block_reduce(&pass.reduces, true);
            self.finish_reductions(&pass.reduces, "len");
            self.values(&pass.after, Scope::Row);
        }
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
