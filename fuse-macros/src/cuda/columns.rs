//! Reductions over a leading or middle dim (`sum(g, rows)`, the shape of every bias and weight
//! gradient): the reduced dim is strided in memory and the rows (here columns) are adjacent.
//! A block owns a tile of [`COLUMN_TILE`] adjacent columns, a lane of each warp one column, and
//! its eight warps take every eighth element of the reduced dim, so that each warp's load is
//! 32 neighbours (128 bytes of f32) and each thread has several in flight. The warps' results
//! meet in shared memory in a fixed order.
//!
//! Where the tiles are too few to fill the GPU (`65536 x 4096` has 128 of them), a kernel of
//! one reducing pass splits each tile's reduced dim into `splits` parts across blocks: each part
//! stores its columns' partials in the scratch, and the tile's last block (by a counter per
//! tile, which it resets) combines them in the parts' order, so the result does not depend on
//! which block finishes last. The host picks the split from the grid (`grid.rs`), the kernel
//! reads it back from `gridDim.x`.

use super::text::{combine, identity};
use super::{Cuda, Scope, BLOCK};
use crate::abi::COLUMN_TILE;
use crate::ir::{DimId, NodeId, Op, Reduce};
use crate::plan::Plan;

impl Cuda<'_> {
    pub(super) fn columns_body(&mut self, domain: &[DimId], axis: DimId, plan: &Plan, split: bool) {
        let rows = self.row_counts(domain, axis, plan);
        for &r in plan.passes.iter().flat_map(|p| &p.reduces) {
            let t = self.k.nodes[r].elem().c_name();
            self.line(format!("__shared__ {t} red{r}[{BLOCK}];"));
            if self.reduction(r).0 == Reduce::LogSumExp {
                self.line(format!("__shared__ {t} rds{r}[{BLOCK}];"));
            }
        }
        let warps = BLOCK / 32;
        self.line(format!(
            "const int lane = threadIdx.x & {};",
            COLUMN_TILE - 1
        ));
        self.line("const int slice = threadIdx.x >> 5;");
        self.line(format!(
            "const long long tiles = (groups + {}) / {COLUMN_TILE};",
            COLUMN_TILE - 1
        ));
        self.split_lines(split);
        self.open("for (long long fz_b = blockIdx.x; fz_b < tiles * splits; fz_b += gridDim.x)");
        self.line("const long long tile = fz_b / splits;");
        self.line("const long long part = fz_b - tile * splits;");
        self.line(format!("const long long gl = tile * {COLUMN_TILE} + lane;"));
        // A lane past the last column computes on the last one (valid memory) and writes
        // nothing.
        self.line("const bool live = gl < groups;");
        self.line("const long long g = live ? gl : groups - 1;");
        self.row_start(&rows, axis, plan);
        let shapes = self.layout.shapes();
        self.line("const long long r0 = part * per_split;");
        self.line("const long long r1 = r0 + per_split < len ? r0 + per_split : len;");
        let unroll = self.column_unroll(plan);
        for pass in &plan.passes {
            self.init_accumulators(&pass.reduces);
            let guard = if pass.writes.is_empty() {
                ""
            } else {
                "live && "
            };
            self.line(format!("#pragma unroll {unroll}"));
            self.open(format!(
                "for (long long r = r0 + slice; {guard}r < r1; r += {warps})"
            ));
            self.row_step(pass, axis, &[], &shapes, false);
            self.close();
            self.combine_slices(&pass.reduces);
            if split {
                self.combine_parts(&pass.reduces, 1);
            }
            self.finish_reductions(&pass.reduces, "len");
            self.values(&pass.after, Scope::Row);
        }
        if !plan.group_writes.is_empty() {
            self.open("if (live && slice == 0)");
            self.writes(&plan.group_writes, Scope::Row);
            self.close();
        }
        self.close();
    }

    /// Rows' loads in flight: eight for a kernel of one tensor of at most 4-byte elements (a
    /// bias gradient), four for others, two where the accumulators take over 24 bytes:
    /// `reduce_mid` of the tests (five f64 reductions over two tensors) spilled at 128 registers
    /// with four, its warps' combination unrolled beside them.
    fn column_unroll(&self, plan: &Plan) -> u32 {
        let light = self.k.tensor_params().count() == 1
            && self.k.tensor_params().all(|(_, p, _)| p.elem.bits() <= 32);
        let accumulators: u32 = plan
            .passes
            .iter()
            .flat_map(|p| &p.reduces)
            .map(|&r| {
                let (op, e) = self.reduction(r);
                e.bits() / 8 * crate::plan::rows::slot_count(op) as u32
            })
            .sum();
        match (light, accumulators) {
            (true, _) => 8,
            (false, 0..=24) => 4,
            _ => 2,
        }
    }

    /// The column reduction of `Path::ColumnPairs` (`n` = 2) and `Path::ColumnQuads` (4): as
    /// [`Cuda::columns_body`], with `n` adjacent columns a lane, `g` to `g + n - 1`, so that a
    /// tile is `n * COLUMN_TILE` columns and a warp's load of a row one vector of `n` a lane (a
    /// 128- or 256-byte stretch of 16-bit elements). Each column keeps its accumulators in
    /// `fz_acc<r>[j]`; the loop, the warps' combination, the parts' and the writes take one
    /// column at a time through `acc<r>`, a reference to the column's. One pass, no element
    /// writes, and nothing per column before the loop but what reads no tensor
    /// ([`crate::plan::column_pairs`]), so the lane's columns share it.
    pub(super) fn column_vectors_body(
        &mut self,
        domain: &[DimId],
        axis: DimId,
        plan: &Plan,
        split: bool,
        n: usize,
    ) {
        let rows = self.row_counts(domain, axis, plan);
        let pass = &plan.passes[0];
        let inner = *domain.last().expect("a column reduction has columns");
        // A slot of each column of each thread: the warps' combination takes the lane's columns
        // together, two barriers a tile.
        for &r in &pass.reduces {
            let t = self.k.nodes[r].elem().c_name();
            self.line(format!("__shared__ {t} red{r}[{}];", n as u32 * BLOCK));
            if self.reduction(r).0 == Reduce::LogSumExp {
                self.line(format!("__shared__ {t} rds{r}[{}];", n as u32 * BLOCK));
            }
        }
        let (warps, width) = (BLOCK / 32, n as u32 * COLUMN_TILE);
        self.line(format!(
            "const int lane = threadIdx.x & {};",
            COLUMN_TILE - 1
        ));
        self.line("const int slice = threadIdx.x >> 5;");
        self.line(format!(
            "const long long tiles = (groups + {}) / {width};",
            width - 1
        ));
        self.split_lines(split);
        self.open("for (long long fz_b = blockIdx.x; fz_b < tiles * splits; fz_b += gridDim.x)");
        self.line("const long long tile = fz_b / splits;");
        self.line("const long long part = fz_b - tile * splits;");
        self.line(format!("const long long gl = tile * {width} + lane * {n};"));
        // The innermost dim is a multiple of `n`, so a lane's columns are live or not as a
        // whole; a lane past the last computes on the last `n` (valid memory) and writes nothing.
        self.line("const bool live = gl < groups;");
        self.line(format!("const long long g = live ? gl : groups - {n};"));
        self.row_start(&rows, axis, plan);
        let shapes = self.layout.shapes();
        self.line("const long long r0 = part * per_split;");
        self.line("const long long r1 = r0 + per_split < len ? r0 + per_split : len;");
        for &r in &pass.reduces {
            let (op, e) = self.reduction(r);
            let (t, id) = (e.c_name(), identity(op, e));
            let ids = vec![id; n].join(", ");
            self.line(format!("{t} fz_acc{r}[{n}] = {{{ids}}};"));
            if op == Reduce::LogSumExp {
                self.helpers.insert("fz_lse");
                let zeros = vec!["0"; n].join(", ");
                self.line(format!("{t} fz_acs{r}[{n}] = {{{zeros}}};"));
            }
        }
        let mut vectors: Vec<usize> = vec![];
        for &id in &pass.elems {
            if let Op::Load(p) = self.k.nodes[id].op {
                let along =
                    self.k.params[p].shape.as_deref().and_then(|s| s.last()) == Some(&inner);
                if along && !vectors.contains(&p) {
                    vectors.push(p);
                }
            }
        }
        self.helpers.insert("fz_vec");
        self.line(format!("#pragma unroll {}", self.column_unroll(plan)));
        self.open(format!(
            "for (long long r = r0 + slice; r < r1; r += {warps})"
        ));
        for s in self.used_shapes(&pass.elems, &[]) {
            let offset = self.layout.row_offset(s, &shapes[s], axis);
            self.line(format!("const long long o{s} = {offset};"));
        }
        for &p in &vectors {
            let (t, name) = self.param_text(p);
            let s = self.shape_index(self.k.params[p].shape.as_ref().expect("a tensor"));
            self.line(format!(
                "const fz_vec<{t}, {n}> lv_{name} = *reinterpret_cast<const fz_vec<{t}, {n}>*>(p_{name} + o{s});"
            ));
        }
        for j in 0..n {
            self.open("");
            self.line(format!("const int j = {j};"));
            self.column_of_pair(&pass.reduces, j);
            self.row_vectors_now = vectors.clone();
            self.values(&pass.elems, Scope::Element);
            self.row_vectors_now.clear();
            self.accumulate(&pass.reduces);
            self.close();
        }
        self.close();
        self.line("const long long fz_g = g;");
        for s in 0..shapes.len() {
            self.line(format!("const long long fz_b{s} = b{s};"));
        }
        self.combine_vector_slices(&pass.reduces, n);
        if split {
            self.combine_parts(&pass.reduces, n);
        }
        for j in 0..n {
            self.open("");
            self.column_of_pair(&pass.reduces, j);
            self.line(format!("const long long g = fz_g + {j};"));
            for (s, shape) in shapes.iter().enumerate() {
                let step = if shape.last() == Some(&inner) { j } else { 0 };
                self.line(format!("const long long b{s} = fz_b{s} + {step};"));
            }
            self.finish_reductions(&pass.reduces, "len");
            self.values(&pass.after, Scope::Row);
            if !plan.group_writes.is_empty() {
                self.open("if (live && slice == 0)");
                self.writes(&plan.group_writes, Scope::Row);
                self.close();
            }
            self.close();
        }
        self.close();
    }

    /// In a scope of column `j` of a lane's pair (or four): `acc<r>` (and `acs<r>`) name that
    /// column's accumulators.
    fn column_of_pair(&mut self, reduces: &[NodeId], j: usize) {
        for &r in reduces {
            let (op, e) = self.reduction(r);
            let t = e.c_name();
            self.line(format!("{t}& acc{r} = fz_acc{r}[{j}];"));
            if op == Reduce::LogSumExp {
                self.line(format!("{t}& acs{r} = fz_acs{r}[{j}];"));
            }
        }
    }

    /// The split of each tile's reduced dim across blocks: `splits` parts of `per_split`
    /// elements, read back from the grid (or one part).
    fn split_lines(&mut self, split: bool) {
        if split {
            self.line("__shared__ bool fz_last;");
            // The host launches `tiles * splits` blocks, or fewer than `tiles` for one part.
            self.line("const long long splits = gridDim.x >= tiles ? gridDim.x / tiles : 1;");
            self.line("const long long per_split = (len + splits - 1) / splits;");
        } else {
            self.line("const long long splits = 1;");
            self.line("const long long per_split = len;");
        }
    }

    /// The tile's last block's combination of the parts' partials for the `n` columns of each
    /// lane of `column_vectors_body` (`slots` as `combine_parts`): each warp's loop over its
    /// parts loads all of the lane's columns' partials of a part before it combines any, so
    /// that a part costs one trip to L2, not `n`; then the warps, as `combine_vector_slices`.
    /// Each column's partials are combined in the same order as one column's alone.
    fn combine_vector_parts(&mut self, reduces: &[NodeId], slots: &[usize], n: usize) {
        for j in 0..n {
            for &r in reduces {
                let (op, e) = self.reduction(r);
                self.line(format!("fz_acc{r}[{j}] = {};", identity(op, e)));
                if op == Reduce::LogSumExp {
                    self.line(format!("fz_acs{r}[{j}] = 0;"));
                }
            }
        }
        self.open(format!(
            "for (long long s = slice; s < splits; s += {})",
            BLOCK / 32
        ));
        for j in 0..n {
            for (&r, &slot) in reduces.iter().zip(slots) {
                let (op, e) = self.reduction(r);
                let t = e.c_name();
                let partial = |slot: usize| format!("{}[s * groups + g + {j}]", volatile(t, slot));
                self.line(format!("const {t} pm{r}_{j} = {};", partial(slot)));
                if op == Reduce::LogSumExp {
                    self.line(format!("const {t} ps{r}_{j} = {};", partial(slot + 1)));
                }
            }
        }
        for j in 0..n {
            for &r in reduces {
                let (op, e) = self.reduction(r);
                if op == Reduce::LogSumExp {
                    self.line(format!(
                        "fz_lse_merge(fz_acc{r}[{j}], fz_acs{r}[{j}], pm{r}_{j}, ps{r}_{j});"
                    ));
                } else {
                    let (acc, other) = (format!("fz_acc{r}[{j}]"), format!("pm{r}_{j}"));
                    self.line(format!("{acc} = {};", combine(op, e, &acc, &other)));
                }
            }
        }
        self.close();
        self.combine_vector_slices(reduces, n);
    }

    /// As [`Cuda::combine_slices`] for the `n` columns of each lane of `column_vectors_body`,
    /// all at once: column `j`'s slots are `red<r>[j * BLOCK ..]`, and each column is combined
    /// in the same order as one column alone.
    fn combine_vector_slices(&mut self, reduces: &[NodeId], n: usize) {
        if reduces.is_empty() {
            return;
        }
        self.line("__syncthreads();");
        for j in 0..n {
            let at = format!("[{} + threadIdx.x]", j as u32 * BLOCK);
            for &r in reduces {
                self.line(format!("red{r}{at} = fz_acc{r}[{j}];"));
                if self.reduction(r).0 == Reduce::LogSumExp {
                    self.line(format!("rds{r}{at} = fz_acs{r}[{j}];"));
                }
            }
        }
        self.line("__syncthreads();");
        for j in 0..n {
            self.open("");
            self.column_of_pair(reduces, j);
            for &r in reduces {
                self.fold_warps(r, &format!("{} + ", j as u32 * BLOCK));
            }
            self.close();
        }
    }

    /// Combines each column's accumulators across the block's warps, warp 0's first: every
    /// thread ends with its column's value.
    fn combine_slices(&mut self, reduces: &[NodeId]) {
        if reduces.is_empty() {
            return;
        }
        // No warp may overwrite `red` while another still reads the previous pass's or tile's.
        self.line("__syncthreads();");
        for &r in reduces {
            self.line(format!("red{r}[threadIdx.x] = acc{r};"));
            if self.reduction(r).0 == Reduce::LogSumExp {
                self.line(format!("rds{r}[threadIdx.x] = acs{r};"));
            }
        }
        self.line("__syncthreads();");
        for &r in reduces {
            self.fold_warps(r, "");
        }
    }

    /// `acc<r>` (and `acs<r>`) from the warps' slots of the lane's column at `red<r>[base ..]`
    /// (`base` empty or ending in ` + `), warp 0's first.
    fn fold_warps(&mut self, r: NodeId, base: &str) {
        let (op, e) = self.reduction(r);
        self.line(format!("acc{r} = red{r}[{base}lane];"));
        if op == Reduce::LogSumExp {
            self.line(format!("acs{r} = rds{r}[{base}lane];"));
        }
        self.line("#pragma unroll");
        self.open(format!("for (int w = 1; w < {}; ++w)", BLOCK / 32));
        let at = format!("{base}w * {COLUMN_TILE} + lane");
        if op == Reduce::LogSumExp {
            self.line(format!(
                "fz_lse_merge(acc{r}, acs{r}, red{r}[{at}], rds{r}[{at}]);"
            ));
        } else {
            let other = format!("red{r}[{at}]");
            self.line(format!(
                "acc{r} = {};",
                combine(op, e, &format!("acc{r}"), &other)
            ));
        }
        self.close();
    }

    /// With the reduced dim split across blocks: stores this part's partials of the lane's
    /// `columns` columns (one, `acc<r>`, or a vector's two or four, `fz_acc<r>[j]`), and in the
    /// tile's last block combines every part's, each warp every eighth part in order, then the
    /// warps in order (a vector's columns together, [`Cuda::combine_vector_parts`]). Other
    /// blocks go on to their next tile.
    fn combine_parts(&mut self, reduces: &[NodeId], columns: usize) {
        self.open("if (splits > 1)");
        let slots = self.slots(reduces);
        let region = |slot: usize| format!("fz_scratch + {slot} * splits * groups");
        let column = |j: usize| match columns {
            1 => "g".to_string(),
            _ => format!("g + {j}"),
        };
        let held = |name: &str, r: NodeId, j: usize| match columns {
            1 => format!("{name}{r}"),
            _ => format!("fz_{name}{r}[{j}]"),
        };
        self.open("if (slice == 0 && live)");
        for j in 0..columns {
            for (&r, &slot) in reduces.iter().zip(&slots) {
                let t = self.k.nodes[r].elem().compute().c_name();
                let at = format!("[part * groups + {}]", column(j));
                self.line(format!(
                    "(({t}*)({})){at} = {};",
                    region(slot),
                    held("acc", r, j)
                ));
                if self.reduction(r).0 == Reduce::LogSumExp {
                    self.line(format!(
                        "(({t}*)({})){at} = {};",
                        region(slot + 1),
                        held("acs", r, j)
                    ));
                }
            }
        }
        self.close();
        self.line("__threadfence();");
        self.line("__syncthreads();");
        self.open("if (threadIdx.x == 0)");
        self.line("fz_last = atomicAdd(fz_counter + tile, 1u) == (unsigned int)(splits - 1);");
        self.close();
        self.line("__syncthreads();");
        self.line("if (!fz_last) continue;");
        self.line("__threadfence();");
        if columns > 1 {
            self.combine_vector_parts(reduces, &slots, columns);
        } else {
            for (&r, &slot) in reduces.iter().zip(&slots) {
                let (op, e) = self.reduction(r);
                let t = e.c_name();
                self.line(format!("acc{r} = {};", identity(op, e)));
                if op == Reduce::LogSumExp {
                    self.line(format!("acs{r} = 0;"));
                }
                let partial = |slot: usize| format!("{}[s * groups + g]", volatile(t, slot));
                self.open(format!(
                    "for (long long s = slice; s < splits; s += {})",
                    BLOCK / 32
                ));
                if op == Reduce::LogSumExp {
                    self.line(format!(
                        "fz_lse_merge(acc{r}, acs{r}, {}, {});",
                        partial(slot),
                        partial(slot + 1)
                    ));
                } else {
                    self.line(format!("const {t} other = {};", partial(slot)));
                    self.line(format!(
                        "acc{r} = {};",
                        combine(op, e, &format!("acc{r}"), "other")
                    ));
                }
                self.close();
            }
            self.combine_slices(reduces);
        }
        self.line("if (threadIdx.x == 0) fz_counter[tile] = 0u;");
        self.close();
    }
}

/// The scratch region of reduction slot `slot` as `volatile t*`: the parts' partials, which other
/// blocks wrote (seen here after their fence and the tile's counter).
fn volatile(t: &str, slot: usize) -> String {
    format!("((volatile {t}*)(fz_scratch + {slot} * splits * groups))")
}
