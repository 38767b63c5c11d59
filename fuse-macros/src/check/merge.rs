//! Dims reduced together (`mean(x, (c, s))`, GroupNorm's statistics) taken as one: each
//! [`Dim::Merged`] that typing made replaces its parts wherever they stand, so that the kernel
//! has one dim to reduce over and the planner, both backends and the derivatives see an
//! ordinary reduction over one dim.
//!
//! A tensor with all the parts, next to each other in the order written, is the same memory
//! with one dim fewer (`[b, g, c, s]` is `[b, g, (c, s)]`). A tensor with only some of them
//! (GroupNorm's weight `w: [g, c]` beside `x: [b, g, c, s]`) is read through a gather whose
//! index is the part's coordinate, computed from the merged one (`index((c, s)) / len(s)`);
//! so is `index(c)`. Slices of the parts are not taken apart: an error.

use super::Checker;
use crate::ir::{Dim, DimId, Gather, Linear, Node, NodeId, Op, OutputInfo, View};
use crate::parse::BinOp;
use crate::ty::{Elem, Ty};
use proc_macro2::TokenStream;

impl Checker<'_> {
    /// Rewrites the kernel's shapes and values for each merged dim; `None` after an error.
    pub(super) fn merge_reduced_dims(&mut self, outputs: &mut [OutputInfo]) -> Option<()> {
        let merged: Vec<(DimId, Vec<DimId>)> = self
            .dims
            .iter()
            .enumerate()
            .filter_map(|(m, d)| match d {
                Dim::Merged(parts) => Some((m, parts.clone())),
                _ => None,
            })
            .collect();
        for (m, parts) in merged {
            self.merge(m, &parts, outputs)?;
        }
        Some(())
    }

    fn merge(&mut self, m: DimId, parts: &[DimId], outputs: &mut [OutputInfo]) -> Option<()> {
        let names: Vec<String> = parts.iter().map(|&p| self.dims[p].to_string()).collect();
        let together = format!("`({})`", names.join(", "));
        // Each parameter: all the parts, in order (one dim fewer), or some (read by gathers).
        let mut partial = vec![false; self.params.len()];
        for (i, p) in self.params.iter_mut().enumerate() {
            let Some(shape) = &mut p.shape else { continue };
            match merged_shape(shape, parts, m) {
                Some(s) => *shape = s,
                None if p.written => {
                    let name = crate::ir::plain_name(&p.name);
                    self.cx.spanned(&p.name, format!("`{name}` is written through `&mut` and has some of the dims {together} that a reduction takes together; write the reduced values in a kernel of their own"));
                    return None;
                }
                None => partial[i] = true,
            }
        }
        let mut nodes: Vec<Node> = vec![];
        let mut map: Vec<NodeId> = vec![];
        // Each part's coordinate, computed once for every tensor and `index` that needs it.
        let mut coords: Vec<Option<NodeId>> = vec![None; parts.len()];
        let old = std::mem::take(&mut self.nodes);
        for node in old {
            // A value over some of the parts (`w * 2` of a `w: [g, c]`), or over all of them
            // in another arrangement: over `m`, as the values it is computed from.
            let shape =
                merged_shape(&node.shape, parts, m).unwrap_or_else(|| widen(&node.shape, parts, m));
            let op = match &node.op {
                Op::Load(p) if partial[*p] => {
                    let param_shape = self.params[*p].shape.clone().expect("a tensor");
                    // The parameter's own layout, each part then gathered by its coordinate.
                    let own = View::of_layout(&param_shape, &param_shape);
                    let (old, new) = (&param_shape, &shape);
                    let view =
                        through_coordinates(&mut nodes, &mut coords, &own, old, new, parts, m);
                    Op::View(*p, Box::new(view))
                }
                // A slice or a permuted view over parts: each part's coordinate moves the load
                // by that part's stride in the view, as a gather's index does.
                Op::View(p, view)
                    if view.gathers.is_empty() && parts.iter().any(|d| node.shape.contains(d)) =>
                {
                    let view = through_coordinates(
                        &mut nodes,
                        &mut coords,
                        view,
                        &node.shape,
                        &shape,
                        parts,
                        m,
                    );
                    Op::View(*p, Box::new(view))
                }
                Op::View(..) if parts.iter().any(|p| node.shape.contains(p)) => {
                    self.cx.spanned(&node.tokens, format!("this gather has some of the dims {together} that a reduction takes together: gathers over dims reduced together are not supported yet; reduce over one dim at a time in `fn`s of their own"));
                    return None;
                }
                // A random value's position is its place in its own shape: over `m` it would
                // be another number.
                Op::Random(..) if merged_shape(&node.shape, parts, m).is_none() => {
                    self.cx.spanned(&node.tokens, format!("this random value is over some of the dims {together} that a reduction takes together, and not all: draw it over all of them or none (its numbers follow its shape)"));
                    return None;
                }
                Op::Index(d) if parts.contains(d) => {
                    let at = parts.iter().position(|p| p == d).expect("a part");
                    let index = coordinate(&mut nodes, &mut coords, parts, at, m);
                    nodes.push(Node {
                        op: Op::Cast(index),
                        ty: node.ty,
                        shape: vec![m],
                        tokens: node.tokens.clone(),
                    });
                    map.push(nodes.len() - 1);
                    continue;
                }
                op => op.map_operands(|i| map[i]),
            };
            nodes.push(Node {
                op,
                ty: node.ty,
                shape,
                tokens: node.tokens,
            });
            map.push(nodes.len() - 1);
        }
        self.nodes = nodes;
        for o in outputs.iter_mut() {
            o.node = map[o.node];
            o.shape = match merged_shape(&o.shape, parts, m) {
                Some(s) => s,
                None => {
                    self.cx.spanned(&o.tokens, format!("this output has some of the dims {together} that a reduction takes together, and not all: an output has all of them or none"));
                    return None;
                }
            };
        }
        Some(())
    }
}

/// A view without gathers (a slice, a permuted view) of shape `old`, at the coordinates of
/// `shape` (over the merged dim `m` in place of the parts it has): the same strides for the
/// other dims, and each part it has gathered by its coordinate, computed from `m`'s, with the
/// part's stride in the view; or, where the parts lie in memory as in `m`, `m` with a stride.
fn through_coordinates(
    nodes: &mut Vec<Node>,
    coords: &mut [Option<NodeId>],
    view: &View,
    old: &[DimId],
    shape: &[DimId],
    parts: &[DimId],
    m: DimId,
) -> View {
    let stride = |d: DimId| {
        let at = old.iter().position(|&x| x == d).expect("a dim of the view");
        view.strides[at].clone()
    };
    // All the parts, one after another in memory as in `m` (a permuted view of a tensor that
    // has them together, `y: [c, s, a]` read as `[a, c, s]`): `m`'s coordinate moves the load
    // by the last part's stride, and no part is gathered.
    let together = parts.iter().all(|d| old.contains(d))
        && parts
            .windows(2)
            .all(|w| same(&stride(w[0]), &times(&stride(w[1]), w[1])));
    let strides = shape
        .iter()
        .map(|&d| match d == m {
            true if together => stride(*parts.last().expect("parts")),
            true => vec![],
            false => stride(d),
        })
        .collect();
    let mut gathers = vec![];
    for (at, &d) in parts.iter().enumerate() {
        if old.contains(&d) && !together {
            gathers.push(Gather {
                index: coordinate(nodes, coords, parts, at, m),
                stride: stride(d),
                len: vec![(1, vec![d])],
            });
        }
    }
    View {
        offset: view.offset.clone(),
        strides,
        gathers,
    }
}

/// `stride` times the size of `d`, as index arithmetic.
fn times(stride: &Linear, d: DimId) -> Linear {
    stride
        .iter()
        .map(|(c, dims)| (*c, [&dims[..], &[d]].concat()))
        .collect()
}

/// Whether two sums of products of sizes are the same, whatever the order of terms and factors.
fn same(a: &Linear, b: &Linear) -> bool {
    let sorted = |l: &Linear| {
        let mut terms: Vec<(u64, Vec<DimId>)> = l
            .iter()
            .map(|(c, dims)| {
                let mut dims = dims.clone();
                dims.sort_unstable();
                (*c, dims)
            })
            .collect();
        terms.sort_unstable();
        terms
    };
    sorted(a) == sorted(b)
}

/// `shape` with `parts`, standing together in that order, replaced by `m`; `shape` itself where
/// it has none of them; `None` where it has some, or all in another arrangement.
fn merged_shape(shape: &[DimId], parts: &[DimId], m: DimId) -> Option<Vec<DimId>> {
    if !parts.iter().any(|p| shape.contains(p)) {
        return Some(shape.to_vec());
    }
    let start = shape.iter().position(|&s| s == parts[0])?;
    if shape.get(start..start + parts.len()) != Some(parts) {
        return None;
    }
    let mut out = shape[..start].to_vec();
    out.push(m);
    out.extend(&shape[start + parts.len()..]);
    Some(out)
}

/// `shape`, which has some of `parts`, with `m` in place of the first of them and the others
/// left out: the shape of a value over a part once that part is read through `m`.
fn widen(shape: &[DimId], parts: &[DimId], m: DimId) -> Vec<DimId> {
    let mut out = vec![];
    for &d in shape {
        if !parts.contains(&d) {
            out.push(d);
        } else if !out.contains(&m) {
            out.push(m);
        }
    }
    out
}

/// The coordinate along `parts[at]` of the current element, from its coordinate along `m`
/// (row-major over the parts): `index(m) / (product of the later parts) % len(part)`, as
/// `u32`; pushed the first time (into `coords`).
fn coordinate(
    nodes: &mut Vec<Node>,
    coords: &mut [Option<NodeId>],
    parts: &[DimId],
    at: usize,
    m: DimId,
) -> NodeId {
    if let Some(id) = coords[at] {
        return id;
    }
    let u32_ty = Ty::Elem(Elem::U32);
    let mut push = |op: Op, shape: Vec<DimId>| {
        nodes.push(Node {
            op,
            ty: u32_ty,
            shape,
            tokens: TokenStream::new(),
        });
        nodes.len() - 1
    };
    let mut value = push(Op::Index(m), vec![m]);
    for &later in &parts[at + 1..] {
        let len = push(Op::Len(later), vec![]);
        value = push(Op::Binary(BinOp::Div, value, len), vec![m]);
    }
    if at > 0 {
        let len = push(Op::Len(parts[at]), vec![]);
        value = push(Op::Binary(BinOp::Rem, value, len), vec![m]);
    }
    coords[at] = Some(value);
    value
}

#[cfg(test)]
mod tests {
    use crate::testing::{errors, kernel};
    use quote::quote;

    /// The one view of parameter 1 (`y`) over `shape`.
    fn view_of_y<'k>(k: &'k crate::ir::Kernel, shape: &[usize]) -> &'k crate::ir::View {
        let views: Vec<_> = k
            .nodes
            .iter()
            .filter_map(|n| match &n.op {
                crate::ir::Op::View(1, v) if n.shape == shape => Some(&**v),
                _ => None,
            })
            .collect();
        let [view] = views.as_slice() else {
            panic!("one view of `y` over {shape:?}: {views:?}");
        };
        view
    }

    /// A permuted view over the parts (`y: [s, c, a]` read as `[a, c, s]`) reads each part
    /// through its coordinate, with the part's stride in `y`'s own layout.
    #[test]
    fn a_permuted_view_over_dims_reduced_together_reads_by_coordinates() {
        let k = kernel(quote! {
            fn f(x: [f32; a, c, s], y: [f32; s, c, a]) -> [f32; a] {
                sum(x * permute(y, (a, c, s)), (c, s))
            }
        });
        let (a, c) = (0, 1);
        let m = k.params[0].shape.as_ref().unwrap()[1];
        // The view read (`[a, (c, s)]`); `y`'s own load, unused, is another.
        let view = view_of_y(&k, &[a, m]);
        assert_eq!(view.strides, vec![vec![(1, vec![])], vec![]]);
        let strides: Vec<_> = view.gathers.iter().map(|g| g.stride.clone()).collect();
        assert_eq!(strides, [vec![(1, vec![a])], vec![(1, vec![c, a])]]);
    }

    /// A permuted view of a tensor with the parts together (`y: [c, s, a]` read as
    /// `[a, c, s]`) reads `(c, s)` as `y`'s own dim, with the stride of `s`: no gathers, so
    /// `#[vjp]` of `y` is a permuted view's (seed 8763 of the random programs).
    #[test]
    fn a_permuted_view_of_parts_kept_together_reads_the_merged_dim_by_its_stride() {
        let k = kernel(quote! {
            #[vjp(y)]
            fn f(x: [f32; a, c, s], y: [f32; c, s, a]) -> [f32; a] {
                max(x * permute(y, (a, c, s)), (c, s))
            }
        });
        let a = 0;
        let m = k.params[0].shape.as_ref().unwrap()[1];
        assert_eq!(k.params[1].shape.as_deref(), Some(&[m, a][..]));
        let view = view_of_y(&k, &[a, m]);
        assert!(view.gathers.is_empty(), "{view:?}");
        assert_eq!(view.strides, vec![vec![(1, vec![])], vec![(1, vec![a])]]);
    }

    /// `x: [b, g, c, s]` becomes `[b, g, (c, s)]`, the reduction one over that dim, and `w`
    /// with only `c` a gather by `index((c, s)) / len(s)`.
    #[test]
    fn dims_reduced_together_become_one() {
        let k = kernel(quote! {
            fn group_norm(x: [f32; b, g, c, s], w: [f32; g, c]) -> [f32; b, g, c, s] {
                let d = x - mean(x, (c, s));
                d * rsqrt(mean(d * d, (c, s)) + 1e-5) * w
            }
        });
        let m = k
            .dims
            .iter()
            .position(|d| matches!(d, crate::ir::Dim::Merged(_)))
            .unwrap();
        assert_eq!(k.dims[m].text(&k.dims), "(c, s)");
        assert_eq!(k.params[0].shape.as_deref(), Some(&[0, 1, m][..]));
        assert_eq!(k.declared(&[0, 1, m]), [0, 1, 2, 3]);
        assert_eq!(k.params[1].shape.as_deref(), Some(&[1, 2][..]));
        assert!(matches!(k.launch, crate::ir::Launch::Rows { axis, .. } if axis == m));
        let views = k
            .nodes
            .iter()
            .filter(|n| matches!(&n.op, crate::ir::Op::View(1, v) if v.gathers.len() == 1))
            .count();
        assert_eq!(views, 1);
        assert!(k.outputs[0].shape == [0, 1, m]);
        // Differentiable where every tensor has all the dims or none.
        let k = kernel(quote! {
            #[vjp(x)]
            fn norm(x: [f32; b, g, c, s]) -> [f32; b, g, c, s] {
                let d = x - mean(x, (c, s));
                d * rsqrt(mean(d * d, (c, s)) + 1e-5)
            }
        });
        assert!(crate::grad::vjp(&k, false, "d").is_ok());
    }

    #[test]
    fn what_does_not_merge_says_why() {
        let cases = [
            (
                quote! { fn f(x: [f32; n, c, s]) -> [f32; n] { sum(x, (s, c)) } },
                "list the dims in the order the operand has them, `(c, s)`",
            ),
            (
                quote! { fn f(x: [f32; c, n, s]) -> [f32; n] { sum(x, (c, s)) } },
                "dims reduced together must stand next to each other in the operand",
            ),
            (
                quote! { fn f(x: [f32; n, c, s]) -> [f32; n] { sum(x, (c, c)) } },
                "`c` is listed twice in `sum`'s dims",
            ),
            (
                quote! { fn f(x: [f32; n, c, s]) -> [f32; n] { sum(x, (c, t)) } },
                "cannot find dim `t`",
            ),
            (
                quote! { fn f(x: [f32; n, c, s]) -> [u32; n] { argmax(x, (c, s)) } },
                "`argmax` gives a position along one dim",
            ),
            (
                quote! { fn f(x: [f32; n, c, s]) -> ([f32; n], [f32; n, c]) { (sum(x, (c, s)), sum(x, s)) } },
                "has some of the dims `(c, s)`",
            ),
            (
                quote! { fn f(x: [f32; n, c, s]) -> [f32; n, c, s] { x - sum(x, (c, s)) - max(x, n) } },
                "this reduces over `n`, but this kernel already reduces over `(c, s)`",
            ),
            (
                quote! { fn f(x: [f32; n, c, s], w: [f32; c], seed: u64) -> [f32; n] { sum(x * (w + rand(seed)), (c, s)) } },
                "this random value is over some of the dims `(c, s)`",
            ),
            (
                quote! {
                    #[vjp(x, w)]
                    fn f(x: [f32; n, c, s], w: [f32; c, 2 * e]) -> [f32; n, c, s, e] { (x - mean(x, (c, s))) * w[.., ..e] }
                },
                "`#[vjp]` does not yet differentiate a kernel with respect to `w`, which has some of the dims `(c, s)`",
            ),
        ];
        for (tokens, want) in cases {
            let e = errors(tokens.clone());
            assert!(e.iter().any(|m| m.contains(want)), "{tokens}: {e:?}");
        }
    }
}
