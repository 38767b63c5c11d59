//! Reductions: accumulators, their combination across a warp and a block, and the full
//! reduction's per-block partials, which the last block finishes in a fixed order.

use super::text::{combine, identity, suffixed};
use super::{Cuda, Scope, BLOCK};
use crate::ir::{DimId, Launch, NodeId, Op, Reduce};
use crate::plan::rows::slot_count;
use crate::plan::{Layout, Path, Plan};
use crate::ty::Elem;

impl Cuda<'_> {
    pub(super) fn full_body(&mut self, domain: &[DimId], plan: &Plan) {
        self.line(format!(
            "const long long n = {};",
            self.layout.product(domain)
        ));
        self.reciprocals(plan, "n");
        self.shared_reduction_buffers(plan);
        self.values(&plan.prologue, Scope::Row);
        let pass = &plan.passes[0];
        self.init_accumulators(&pass.reduces);
        self.element_loop(
            domain,
            pass,
            "(long long)blockIdx.x * blockDim.x + threadIdx.x",
            "(long long)gridDim.x * blockDim.x",
        );
        self.block_reduce(&pass.reduces, false);
        // One block (small inputs) has the whole result now: no partials, atomics or second
        // round, which is the same value (each reduction's identity combined with it).
        self.open("if (gridDim.x == 1)");
        self.finish_reductions(&pass.reduces, "n");
        self.values(&pass.after, Scope::Row);
        self.open("if (threadIdx.x == 0)");
        self.writes(&plan.group_writes, Scope::Row);
        self.close();
        self.line("return;");
        self.close();
        self.open("if (threadIdx.x == 0)");
        let slots = self.slots(&pass.reduces);
        for (&r, &slot) in pass.reduces.iter().zip(&slots) {
            let t = self.k.nodes[r].elem().c_name();
            self.line(format!(
                "(({t}*)(fz_scratch + {slot} * (long long)gridDim.x))[blockIdx.x] = acc{r};"
            ));
            if self.reduction(r).0 == Reduce::LogSumExp {
                self.line(format!(
                    "(({t}*)(fz_scratch + {} * (long long)gridDim.x))[blockIdx.x] = acs{r};",
                    slot + 1
                ));
            }
        }
        self.line("__threadfence();");
        self.line("fz_last = atomicAdd(fz_counter, 1u) == gridDim.x - 1;");
        self.close();
        self.line("__syncthreads();");
        self.open("if (fz_last)");
        self.line("__threadfence();");
        for (&r, &slot) in pass.reduces.iter().zip(&slots) {
            let (op, e) = self.reduction(r);
            let t = e.c_name();
            self.line(format!("acc{r} = {};", identity(op, e)));
            if op == Reduce::LogSumExp {
                self.line(format!("acs{r} = 0;"));
            }
            let part = |slot: usize| {
                format!("((volatile {t}*)(fz_scratch + {slot} * (long long)gridDim.x))[b]")
            };
            self.open("for (unsigned int b = threadIdx.x; b < gridDim.x; b += blockDim.x)");
            if op == Reduce::LogSumExp {
                self.line(format!(
                    "fz_lse_merge(acc{r}, acs{r}, {}, {});",
                    part(slot),
                    part(slot + 1)
                ));
            } else {
                self.line(format!("const {t} part = {};", part(slot)));
                self.line(format!(
                    "acc{r} = {};",
                    combine(op, e, &format!("acc{r}"), "part")
                ));
            }
            self.close();
        }
        self.block_reduce(&pass.reduces, false);
        self.finish_reductions(&pass.reduces, "n");
        self.values(&pass.after, Scope::Row);
        self.open("if (threadIdx.x == 0)");
        self.writes(&plan.group_writes, Scope::Row);
        self.line("*fz_counter = 0u;");
        self.close();
        self.close();
    }

    /// The first scratch slot of each reduction of a full launch: one per block for each
    /// accumulator, so two for `logsumexp`'s pair.
    pub(super) fn slots(&self, reduces: &[NodeId]) -> Vec<usize> {
        let mut next = 0;
        reduces
            .iter()
            .map(|&r| {
                let slot = next;
                next += slot_count(self.reduction(r).0);
                slot
            })
            .collect()
    }

    /// A reduction's operation and the type it accumulates in (f32 for the 16-bit floats).
    pub(super) fn reduction(&self, id: NodeId) -> (Reduce, Elem) {
        match self.k.nodes[id].op {
            Op::Reduce(op, _, _) => (op, self.k.nodes[id].elem().compute()),
            _ => unreachable!("the plan lists reductions"),
        }
    }

    /// Declares the reciprocal `dv<d>` of each dim `split` will divide `dims` by.
    pub(super) fn divisors(&mut self, dims: &[DimId]) {
        for &d in Layout::divisors(dims) {
            let divisor = self.divisor(&[d], 1);
            self.line(format!("const fz_divisor dv{d} = {divisor};"));
        }
    }

    /// Declares `inv_<count>_<type>` for the means of `plan`: `1 / count` in each mean's type.
    pub(super) fn reciprocals(&mut self, plan: &Plan, count: &str) {
        let mut types: Vec<Elem> = vec![];
        for &r in plan.passes.iter().flat_map(|p| &p.reduces) {
            let (op, e) = self.reduction(r);
            if op == Reduce::Mean && !types.contains(&e) {
                types.push(e);
                let one = if e == Elem::F32 { "1.0f" } else { "1.0" };
                self.line(format!(
                    "const {t} inv_{count}_{e} = {one} / ({t}){count};",
                    t = e.c_name()
                ));
            }
        }
    }

    pub(super) fn shared_reduction_buffers(&mut self, plan: &Plan) {
        for pass in &plan.passes {
            for &r in &pass.reduces {
                let t = self.k.nodes[r].elem().c_name();
                self.line(format!("__shared__ {t} red{r}[{}];", BLOCK / 32));
                if self.reduction(r).0 == Reduce::LogSumExp {
                    self.line(format!("__shared__ {t} rds{r}[{}];", BLOCK / 32));
                }
            }
        }
        if matches!(self.k.launch, Launch::Full { .. }) {
            self.line("__shared__ bool fz_last;");
        }
    }

    pub(super) fn init_accumulators(&mut self, reduces: &[NodeId]) {
        for &r in reduces {
            let (op, e) = self.reduction(r);
            self.line(format!("{} acc{r} = {};", e.c_name(), identity(op, e)));
            if op == Reduce::LogSumExp {
                self.helpers.insert("fz_lse");
                self.line(format!("{} acs{r} = 0;", e.c_name()));
            }
        }
    }

    pub(super) fn accumulate(&mut self, reduces: &[NodeId]) {
        for &r in reduces {
            let (op, e) = self.reduction(r);
            let Op::Reduce(_, operand, _) = self.k.nodes[r].op else {
                unreachable!()
            };
            if op == Reduce::LogSumExp {
                self.line(format!("fz_lse_add(acc{r}, acs{r}, v{operand});"));
                continue;
            }
            self.line(format!(
                "acc{r} = {};",
                combine(op, e, &format!("acc{r}"), &format!("v{operand}"))
            ));
        }
    }

    /// Reduces each accumulator across the block, or with `segmented` across each row's segment of
    /// `width` threads; every thread ends with its row's result, combined in a fixed order.
    pub(super) fn block_reduce(&mut self, reduces: &[NodeId], segmented: bool) {
        if reduces.is_empty() {
            return;
        }
        // A row a block (`width == BLOCK`): the whole block's reduction, in the same order as
        // the segmented one (every shuffle, then warps 0 to 7), without its run-time tests.
        let whole = segmented && self.whole_rows;
        let segmented = segmented && !self.whole_rows;
        // Constant trip counts, so the loops unroll: a loop bounded by `width` made ptxas spill.
        for &r in reduces {
            let (op, e) = self.reduction(r);
            let t = e.c_name();
            self.line("#pragma unroll");
            self.open("for (int off = 16; off > 0; off >>= 1)");
            if segmented {
                // `width` is uniform across the block, so every lane of a warp takes the branch.
                self.open("if (off < width)");
            }
            self.line(format!(
                "const {t} other = __shfl_xor_sync(0xffffffffu, acc{r}, off);"
            ));
            if op == Reduce::LogSumExp {
                self.line(format!(
                    "const {t} other_s = __shfl_xor_sync(0xffffffffu, acs{r}, off);"
                ));
                self.line(format!("fz_lse_merge(acc{r}, acs{r}, other, other_s);"));
            } else {
                self.line(format!(
                    "acc{r} = {};",
                    combine(op, e, &format!("acc{r}"), "other")
                ));
            }
            if segmented {
                self.close();
            }
            self.close();
        }
        if segmented {
            // Uniform across the block: `width` depends only on the row length.
            self.open("if (width > 32)");
        }
        // A segment's warps write and read only their own slots of `red`, so where its row is
        // in registers they wait for each other alone (`fz_row_sync`, a named barrier a
        // segment): a row no longer waits for the block's slowest row at each reduction. The
        // streamed rows keep the block's barrier (see the helper, and NOTES item 123).
        let in_registers = matches!(self.path, Path::RowsCached | Path::RowsCachedWide);
        let barrier = match segmented && in_registers {
            true => {
                self.helpers.insert("fz_row_sync");
                "fz_row_sync(threadIdx.x / width, width);"
            }
            false => "__syncthreads();",
        };
        // The leading barrier keeps a warp from overwriting `red` while another still reads the
        // same reduction of the previous row. A row kernel with two or more reducing passes
        // already has another pass's barriers between those two uses, so it leaves it out.
        if !(segmented || whole) || self.plan.reducing_passes() < 2 {
            self.line(barrier);
        }
        self.open("if ((threadIdx.x & 31) == 0)");
        for &r in reduces {
            self.line(format!("red{r}[threadIdx.x >> 5] = acc{r};"));
            if self.reduction(r).0 == Reduce::LogSumExp {
                self.line(format!("rds{r}[threadIdx.x >> 5] = acs{r};"));
            }
        }
        self.close();
        self.line(barrier);
        // The warps of this thread's row: all of them for a whole block, else its segment's.
        let (first, count) = if segmented {
            ("(threadIdx.x / width) * (width >> 5)", "(width >> 5)")
        } else {
            ("0", "8")
        };
        for &r in reduces {
            let (op, e) = self.reduction(r);
            self.line(format!("acc{r} = red{r}[{first}];"));
            if op == Reduce::LogSumExp {
                self.line(format!("acs{r} = rds{r}[{first}];"));
            }
            self.line("#pragma unroll");
            self.open(format!("for (int w = 1; w < {}; ++w)", BLOCK / 32));
            let other = format!("red{r}[{first} + w]");
            if segmented {
                self.open(format!("if (w < {count})"));
            }
            if op == Reduce::LogSumExp {
                self.line(format!(
                    "fz_lse_merge(acc{r}, acs{r}, {other}, rds{r}[{first} + w]);"
                ));
            } else {
                self.line(format!(
                    "acc{r} = {};",
                    combine(op, e, &format!("acc{r}"), &other)
                ));
            }
            if segmented {
                self.close();
            }
            self.close();
        }
        if segmented {
            self.close();
        }
    }

    pub(super) fn finish_reductions(&mut self, reduces: &[NodeId], count: &str) {
        for &r in reduces {
            let (op, e) = self.reduction(r);
            // `inv_<count>` is computed once per kernel: a division here, while a cached row is
            // live, would spill around the IEEE division's slow-path call.
            let value = match op {
                Reduce::Mean => format!("acc{r} * inv_{count}_{}", e.name()),
                Reduce::LogSumExp => format!("acc{r} + {}(acs{r})", suffixed("log", e)),
                _ => format!("acc{r}"),
            };
            self.line(format!("const {} v{r} = {value};", e.c_name()));
            self.divider(r);
            self.key(r);
        }
    }
}
