//! The language's functions that are not elementwise functions of their values: `index(dim)`,
//! the position along a dim, and `logsumexp(e, dim)`, `argmax(e, dim)` and `argmin(e, dim)`,
//! reductions built from the others.

use crate::check::Checker;
use crate::func::Func;
use crate::ir::{Op, Reduce};
use crate::parse::{BinOp, Expr, ExprKind};
use crate::ty::{Elem, Ty};
use proc_macro2::TokenStream;

impl Checker<'_> {
    /// `index(dim)`: the current element's position along `dim`, as `u32`.
    pub fn index(&mut self, args: &[Expr], t: &TokenStream) -> Option<usize> {
        let [arg] = args else {
            self.cx
                .spanned(t, "`index` takes one dim, as in `index(cols)`");
            return None;
        };
        let ExprKind::Var(ident) = &arg.kind else {
            self.cx.spanned(
                &arg.tokens,
                "the argument of `index` is a dim name, such as `cols`",
            );
            return None;
        };
        let dim = self.named_dim(ident, None)?;
        Some(self.push(Op::Index(dim), Ty::Elem(Elem::U32), vec![dim], t))
    }

    /// `logsumexp(e, dim)`: `ln(sum(exp(e), dim))` computed stably, as
    /// `m + ln(sum(exp(e - m), dim))` with `m` the maximum over `dim` (0 where that is infinite,
    /// so that all-`-inf` rows give `-inf` and rows with `inf` give `inf`).
    pub fn logsumexp(&mut self, args: &[Expr], t: &TokenStream) -> Option<usize> {
        let [e, d] = args else {
            let message = if args.len() == 1 {
                "`logsumexp` over every element needs the maximum before the sum, a second pass over every element: reduce over a dim, as in `logsumexp(x, cols)`, or split it into two `fn`s (`max(x)`, then the sum)"
            } else {
                "`logsumexp` takes a tensor and a dim, as in `logsumexp(x, cols)`"
            };
            self.cx.spanned(t, message);
            return None;
        };
        let operand = self.expr(e);
        let dim = self.reduce_dim(Reduce::Sum, "logsumexp", e, d)?;
        let operand = operand?;
        let shape = self.nodes[operand].shape.clone();
        if !shape.contains(&dim) {
            self.missing_dim(dim, &shape, &d.tokens);
            return None;
        }
        let ty = self.reduce_type(Reduce::Mean, "logsumexp", operand, e)?;
        let row: Vec<_> = shape.iter().copied().filter(|&s| s != dim).collect();
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
        let diff = self.push(Op::Binary(BinOp::Sub, operand, shift), ty, shape.clone(), t);
        let exp = self.push(Op::Call(Func::Exp, vec![diff]), ty, shape, t);
        let sum = self.push(Op::Reduce(Reduce::Sum, exp, Some(dim)), ty, row.clone(), t);
        let ln = self.push(Op::Call(Func::Ln, vec![sum]), ty, row.clone(), t);
        Some(self.push(Op::Binary(BinOp::Add, ln, shift), ty, row, t))
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
}
