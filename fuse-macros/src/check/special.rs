//! The language's functions that are not elementwise functions of their values: `index(dim)`,
//! the position along a dim, and `len(dim)`, its size; `logsumexp(e, dim)`, `argmax(e, dim)` and `argmin(e, dim)`,
//! reductions built from the others; and the random numbers `rand(seed)`, `randn(seed)` and
//! `dropout(x, p, seed)`.

use crate::check::Checker;
use crate::func::Func;
use crate::ir::{DimId, Op, Random, Reduce};
use crate::parse::{BinOp, Expr, ExprKind};
use crate::ty::{Elem, Ty};
use proc_macro2::TokenStream;

/// The names of this module's functions, and of `permute` (`slice.rs`), for "did you mean"
/// hints.
pub const NAMES: [&str; 9] = [
    "index",
    "len",
    "logsumexp",
    "argmax",
    "argmin",
    "rand",
    "randn",
    "dropout",
    "permute",
];

impl Checker<'_> {
    /// `index(dim)`: the current element's position along `dim`, as `u32`.
    pub fn index(&mut self, args: &[Expr], t: &TokenStream) -> Option<usize> {
        let dim = self.dim_argument("index", args, t)?;
        Some(self.push(Op::Index(dim), Ty::Elem(Elem::U32), vec![dim], t))
    }

    /// `len(dim)`: the dim's size, as a `u32` value of shape `[]`.
    pub fn len(&mut self, args: &[Expr], t: &TokenStream) -> Option<usize> {
        let dim = self.dim_argument("len", args, t)?;
        Some(self.push(Op::Len(dim), Ty::Elem(Elem::U32), vec![], t))
    }

    /// The one dim that function `name` takes, as in `index(cols)`.
    fn dim_argument(&mut self, name: &str, args: &[Expr], t: &TokenStream) -> Option<DimId> {
        let [arg] = args else {
            self.cx
                .spanned(t, format!("`{name}` takes one dim, as in `{name}(cols)`"));
            return None;
        };
        let ExprKind::Var(ident) = &arg.kind else {
            self.cx.spanned(
                &arg.tokens,
                format!("the argument of `{name}` is a dim name, such as `cols`"),
            );
            return None;
        };
        self.named_dim(ident, None)
    }

    /// `logsumexp(e, dim)`: `ln(sum(exp(e), dim))` computed stably, as
    /// `m + ln(sum(exp(e - m), dim))` with `m` the maximum over `dim` (0 where that is infinite,
    /// so that all-`-inf` rows give `-inf` and rows with `inf` give `inf`), `m` detached.
    pub fn logsumexp(&mut self, args: &[Expr], t: &TokenStream) -> Option<usize> {
        if let [e] = args {
            return self.logsumexp_all(e, t);
        }
        let [e, d] = args else {
            self.cx.spanned(
                t,
                "`logsumexp` takes a tensor and optionally a dim: `logsumexp(e)` over every element or `logsumexp(e, dim)` over one dim",
            );
            return None;
        };
        let operand = self.expr(e);
        let dim = self.reduce_dim(Reduce::Sum, "logsumexp", e, d)?;
        let operand = operand?;
        let shape = self.nodes[operand].shape.clone();
        let row = self.reduced_shape(dim, &shape, &d.tokens)?;
        let ty = self.reduce_type(Reduce::Mean, "logsumexp", operand, e)?;
        let max = self.push(
            Op::Reduce(Reduce::Max, operand, Some(dim)),
            ty,
            row.clone(),
            t,
        );
        let finite = self.push(
            Op::Call(Func::IsFinite, vec![max]),
            Ty::Elem(Elem::Bool),
            row.clone(),
            t,
        );
        let zero = self.push(Op::Float("0".into()), ty, vec![], t);
        let shift = self.push(Op::Select(finite, max, zero), ty, row.clone(), t);
        // The shift cancels in the value, so no derivative flows through it: the derivative
        // of `logsumexp` is then the softmax alone, without the maximum's (whose ties would
        // take a pass of their own).
        let shift = self.push(Op::Call(Func::Detach, vec![shift]), ty, row.clone(), t);
        let diff = self.push(Op::Binary(BinOp::Sub, operand, shift), ty, shape.clone(), t);
        let exp = self.push(Op::Call(Func::Exp, vec![diff]), ty, shape, t);
        let sum = self.push(Op::Reduce(Reduce::Sum, exp, Some(dim)), ty, row.clone(), t);
        let ln = self.push(Op::Call(Func::Ln, vec![sum]), ty, row.clone(), t);
        Some(self.push(Op::Binary(BinOp::Add, ln, shift), ty, row, t))
    }

    /// `logsumexp(e)` over every element: one pass, with the running maximum and the rescaled
    /// sum as the accumulator (`Reduce::LogSumExp`), so no second pass waits for the maximum.
    fn logsumexp_all(&mut self, e: &Expr, t: &TokenStream) -> Option<usize> {
        let operand = self.expr(e)?;
        if self.nodes[operand].shape.is_empty() {
            let message = if self.shapeless_randoms()[operand] {
                "`logsumexp` reduces a random value that has no shape of its own: combine it with a tensor first, as in `logsumexp(x + rand(seed))`".to_string()
            } else {
                format!(
                    "`logsumexp` reduces a tensor, but `{}` is a scalar here",
                    e.tokens
                )
            };
            self.cx.spanned(&e.tokens, message);
            return None;
        }
        let ty = self.reduce_type(Reduce::Mean, "logsumexp", operand, e)?;
        Some(self.push(Op::Reduce(Reduce::LogSumExp, operand, None), ty, vec![], t))
    }

    /// `argmax(e, dim)` (with `Reduce::Max`) or `argmin(e, dim)`: the smallest position along
    /// `dim` whose element equals the row's maximum (minimum), as `u32`. Ties go to the lowest
    /// index; NaN is ignored, as by `max`; a row with no number (empty, or all NaN) gives
    /// `u32::MAX`.
    pub fn arg_extreme(
        &mut self,
        op: Reduce,
        text: &str,
        args: &[Expr],
        t: &TokenStream,
    ) -> Option<usize> {
        let [e, d] = args else {
            let message = if args.len() == 1 {
                format!("`{text}` over every element needs the whole reduction before the positions, a second pass over every element: reduce over a dim, as in `{text}(x, cols)`")
            } else {
                format!("`{text}` takes a tensor and a dim, as in `{text}(x, cols)`")
            };
            self.cx.spanned(t, message);
            return None;
        };
        let operand = self.expr(e);
        let dim = self.reduce_dim(Reduce::Sum, text, e, d)?;
        let operand = operand?;
        let shape = self.nodes[operand].shape.clone();
        if !shape.contains(&dim) {
            self.missing_dim(dim, &shape, &d.tokens);
            return None;
        }
        let ty = self.reduce_type(op, text, operand, e)?;
        let row: Vec<_> = shape.iter().copied().filter(|&s| s != dim).collect();
        let u32_ty = Ty::Elem(Elem::U32);
        let best = self.push(Op::Reduce(op, operand, Some(dim)), ty, row.clone(), t);
        let hit = self.push(
            Op::Binary(BinOp::Eq, operand, best),
            Ty::Elem(Elem::Bool),
            shape.clone(),
            t,
        );
        let position = self.push(Op::Index(dim), u32_ty, vec![dim], t);
        let none = self.push(Op::Int(i128::from(u32::MAX)), u32_ty, vec![], t);
        let pick = self.push(Op::Select(hit, position, none), u32_ty, shape, t);
        Some(self.push(Op::Reduce(Reduce::Min, pick, Some(dim)), u32_ty, row, t))
    }

    /// `rand(seed)` or `randn(seed)`: an f32 drawn at each element of the shape the value takes
    /// where it is used (see `shape_randoms` in `check`).
    pub fn random(
        &mut self,
        kind: Random,
        text: &str,
        args: &[Expr],
        t: &TokenStream,
    ) -> Option<usize> {
        let [seed] = args else {
            self.cx.spanned(
                t,
                format!("`{text}` takes one argument, the seed, as in `{text}(seed)` with a parameter `seed: u64`"),
            );
            return None;
        };
        let seed = self.seed(text, seed)?;
        let site = self.next_random_site();
        Some(self.push(Op::Random(kind, seed, site), Ty::Elem(Elem::F32), vec![], t))
    }

    /// `dropout(x, p, seed)`: `0` where `rand(seed) < p`, else `x * (1 / (1 - p))`, drawn over the
    /// shape of `x` (and `p`, if it is a tensor).
    pub fn dropout(&mut self, args: &[Expr], t: &TokenStream) -> Option<usize> {
        let [x, p, seed] = args else {
            self.cx.spanned(
                t,
                "`dropout` takes a tensor, a probability and a seed, as in `dropout(x, 0.1, seed)` with a parameter `seed: u64`",
            );
            return None;
        };
        let (x_id, p_id, seed_id) = (self.expr(x), self.expr(p), self.seed("dropout", seed));
        let (x_id, p_id, seed_id) = (x_id?, p_id?, seed_id?);
        if !self.nodes[x_id].ty.is_float() {
            let found = self.nodes[x_id].ty;
            self.cx.spanned(
                &x.tokens,
                format!("`dropout` scales the values it keeps by `1 / (1 - p)`, which needs floats, found `{found}`; convert with `as f32`"),
            );
            return None;
        }
        let ty = self.unify(x_id, p_id, p, t)?;
        if ty.is_literal() && !self.coerce_or_report(x_id, ty.defaulted()) {
            return None;
        }
        let ty = self.nodes[x_id].ty;
        let shape = self.broadcast(&[x_id, p_id], t)?;
        let site = self.next_random_site();
        let f32_ty = Ty::Elem(Elem::F32);
        let mut u = self.push(
            Op::Random(Random::Uniform, seed_id, site),
            f32_ty,
            shape.clone(),
            t,
        );
        if ty != f32_ty {
            u = self.push(Op::Cast(u), ty, shape.clone(), t);
        }
        let bool_ty = Ty::Elem(Elem::Bool);
        let dropped = self.push(Op::Binary(BinOp::Lt, u, p_id), bool_ty, shape.clone(), t);
        let one = self.push(Op::Float("1".into()), ty, vec![], t);
        // The scale is rounded once and multiplies, as in PyTorch: a division per element costs
        // more than the rest of a bias-GELU-dropout kernel's arithmetic.
        let p_shape = self.nodes[p_id].shape.clone();
        let keep = self.push(Op::Binary(BinOp::Sub, one, p_id), ty, p_shape.clone(), t);
        let scale = self.push(Op::Binary(BinOp::Div, one, keep), ty, p_shape, t);
        let scaled = self.push(Op::Binary(BinOp::Mul, x_id, scale), ty, shape.clone(), t);
        let zero = self.push(Op::Float("0".into()), ty, vec![], t);
        Some(self.push(Op::Select(dropped, zero, scaled), ty, shape, t))
    }

    /// The seed of a random call: one `u64` for the whole launch.
    fn seed(&mut self, text: &str, seed: &Expr) -> Option<usize> {
        let id = self.expr(seed)?;
        if !self.nodes[id].shape.is_empty() {
            let shape = self.shape_text(&self.nodes[id].shape.clone());
            self.cx.spanned(
                &seed.tokens,
                format!("the seed of `{text}` is one `u64` for the whole launch, but this is a tensor of shape `{shape}`; pass a scalar parameter such as `seed: u64`"),
            );
            return None;
        }
        if let Err(message) = self.coerce(id, Elem::U64) {
            let found = self.nodes[id].ty;
            let message = if found.is_literal() {
                message
            } else {
                format!("the seed of `{text}` is a `u64`, found `{found}`; declare the parameter as `seed: u64`, or convert with `as u64`")
            };
            self.cx.spanned(&seed.tokens, message);
            return None;
        }
        Some(id)
    }

    /// Which values of shape `[]` are random: they take their shape from where they are used.
    pub fn shapeless_randoms(&self) -> Vec<bool> {
        let mut random = vec![false; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            random[i] = node.shape.is_empty()
                && (matches!(node.op, Op::Random(..))
                    || node.op.operands().iter().any(|&o| random[o]));
        }
        random
    }

    fn next_random_site(&mut self) -> u32 {
        self.random_sites += 1;
        self.random_sites - 1
    }
}
