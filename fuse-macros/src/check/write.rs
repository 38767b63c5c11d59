//! Writes through a `&mut` parameter: `cache[slot, ..] = k;` stores each element of the value
//! where the slice of the parameter puts it (a scatter where the slice gathers, a part of the
//! buffer where it picks a part), and leaves every other element of the buffer as it was.

use crate::check::Checker;
use crate::ir::{is_subsequence, Op, OutputInfo, Place};
use crate::parse::{ExprKind, SliceItem, Write};
use crate::ty::Ty;

impl Checker<'_> {
    /// The output that `w` writes, or `None` after an error.
    pub(super) fn write(&mut self, w: &Write) -> Option<OutputInfo> {
        let target = &w.target;
        // `c[0] = v`: the gather by the literal, as `c[0]` reads.
        let literal: Vec<SliceItem>;
        let (base, items) = match &target.kind {
            ExprKind::Slice(base, items) => (base, &items[..]),
            ExprKind::Index(base, indices) if indices.len() == 1 => {
                literal = vec![indices[0].as_gather()];
                (base, &literal[..])
            }
            _ => {
                self.cx.spanned(&target.tokens, "only a `&mut` tensor parameter is written, through a slice of it, as in `cache[slot, ..] = k;` with `cache: &mut [f32; slots, d]`; values never change: bind a new name with `let`");
                return None;
            }
        };
        let value = self.expr(&w.value);
        let p = self.written_param(base)?;
        let (view, shape) = self.view_of(p, items, &target.tokens)?;
        let value = value?;
        let elem = self.params[p].elem;
        let name = crate::ir::plain_name(&self.params[p].name);
        if self.nodes[value].ty.is_literal() {
            if !self.coerce_or_report(value, elem) {
                return None;
            }
        } else if self.nodes[value].ty != Ty::Elem(elem) {
            let found = self.nodes[value].elem();
            self.cx.spanned(&w.value.tokens, format!("mismatched types: `{name}` holds `{elem}`, and this value is `{found}`; convert it with `as {elem}`"));
            return None;
        }
        let have = self.nodes[value].shape.clone();
        if !is_subsequence(&have, &shape) {
            self.cx.spanned(&w.value.tokens, format!("this value has the shape `{}`, which does not fit the slice it is written to, `{}`: a written value has the slice's dims or some of them, in its order", self.shape_text(&have), self.shape_text(&shape)));
            return None;
        }
        let stored = self.params[p]
            .shape
            .clone()
            .expect("a written parameter is a tensor");
        Some(OutputInfo {
            elem,
            shape: shape.clone(),
            node: value,
            tokens: w.tokens.clone(),
            partial: None,
            total: false,
            place: Some(Place {
                param: p,
                shape: stored,
                view,
            }),
            packed: false,
        })
    }

    /// The `&mut` parameter that `base` names.
    fn written_param(&mut self, base: &crate::parse::Expr) -> Option<usize> {
        let found = self.named(base);
        match found.map(|id| (id, self.nodes.get(id).map(|n| &n.op))) {
            Some((_, Some(&Op::Load(p)))) if self.params[p].written => Some(p),
            Some((crate::check::POISONED, _)) => None,
            _ => {
                let what = crate::check::typing::operand(&base.tokens);
                self.cx.spanned(&base.tokens, format!("`{what}` is not a `&mut` parameter: a kernel writes only through those, as in `cache[slot, ..] = k;` with `cache: &mut [f32; slots, d]`, and returns its other outputs"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::Op;
    use crate::testing::{assert_error, errors, kernel};
    use quote::quote;

    /// A kernel that only writes gives its other literals Rust's default types, as one that
    /// returns does (found by the random programs: `w[..] = x >> 3;` was an internal error).
    #[test]
    fn literals_of_a_kernel_without_outputs_take_their_default() {
        let k = kernel(quote! { fn f(x: [i16; n], w: &mut [i16; n]) { w[..] = (x >> 3) + x; } });
        assert!(k.nodes.iter().all(|n| !n.ty.is_literal()));
        let k =
            kernel(quote! { fn f(x: [f32; n], w: &mut [f64; n]) { w[..] = (x * 2.0) as f64; } });
        let two = k
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::Float(_)))
            .unwrap();
        assert_eq!(two.elem(), crate::ty::Elem::F32);
    }

    /// A scatter is an output over the written values' shape, stored in the `&mut` parameter's
    /// shape at the gather's rows; its index is one of the values the launch computes.
    #[test]
    fn a_scatter_is_an_output_stored_through_a_gather() {
        let k = kernel(quote! {
            fn f(key: [f32; t, d], slot: [i64; t], cache: &mut [f32; slots, d]) {
                cache[slot, ..] = key;
            }
        });
        let (t, d, slots) = (0, 1, 2);
        assert_eq!(k.outputs.len(), 1);
        let o = &k.outputs[0];
        assert_eq!(o.shape, vec![t, d]);
        assert_eq!(o.stored_shape(), vec![slots, d]);
        let place = o.place.as_ref().unwrap();
        assert_eq!(place.param, 2);
        let index = place.view.gathers[0].index;
        assert!(matches!(k.nodes[index].op, Op::Load(1)));
        assert_eq!(o.roots(), vec![o.node, index]);
        assert!(k.params[2].written);
        assert_eq!(k.tensor_params().count(), 2);
        assert_eq!(k.output_buffer(0), 0);
    }

    /// Returned outputs first, then each `&mut` parameter once, however often it is written.
    #[test]
    fn writes_share_their_parameters_buffer() {
        let k = kernel(quote! {
            fn f(a: [f32; t, d], out: &mut [f32; t, 2 * d], w: &mut [f32; t, d]) -> [f32; t, d] {
                out[.., ..d] = a;
                w[.., ..] = a + 1.0;
                out[.., d..] = a * 2.0;
                a
            }
        });
        let buffers: Vec<usize> = (0..k.outputs.len()).map(|j| k.output_buffer(j)).collect();
        assert_eq!(buffers, [0, 1, 2, 1]);
    }

    /// Odd writes end in errors, never in a panic.
    #[test]
    fn odd_writes_are_errors() {
        for tokens in [
            quote! { fn f(c: &mut [f32; n]) { c[..] = c; } },
            quote! { fn f(c: &mut [f32; n], x: [f32; n]) { c = x; } },
            quote! { fn f(c: &mut [f32; n]) -> [f32; n] { c } },
            quote! { fn f(c: &mut [f32; n], x: [f32; n]) { c[0][0] = x; } },
            quote! { fn f(c: &mut [f32; n], x: [f32; n]) { (c * 2.0)[..] = x; } },
            quote! { fn f(c: &mut [f32; n], x: [f32; n]) { c[x] = x; } },
            quote! { fn f(c: &mut [f32; n], x: [f32; n]) { c[..] = x; c } },
            quote! { fn f(c: &mut [f32; n], c: &mut [f32; n], x: [f32; n]) { c[..] = x; } },
            quote! { fn f(c: &mut [f32; 2 * d], x: [f32; d]) { c[..] = x; } },
            quote! { fn f(c: &mut [f32; n], x: [f32; n]) { let c = x; c[..] = x; } },
            quote! { fn f(c: &mut [u8; n], x: [f32; n]) { c[..] = 300; } },
        ] {
            assert!(!errors(tokens.clone()).is_empty(), "{tokens}");
        }
        assert_error(
            quote! { fn f(c: &mut [f32; n], x: [f32; n]) { c[..] = 1.5f64; } },
            "mismatched types: `c` holds `f32`, and this value is `f64`",
        );
        // What does compile: a literal row, a broadcast fill, an integer literal as a float.
        kernel(quote! { fn f(c: &mut [f32; n], x: f32) { c[0] = x; } });
        kernel(quote! { fn f(c: &mut [f32; m, k], i: [u32; r]) { c[i, ..] = 1; } });
    }
}
