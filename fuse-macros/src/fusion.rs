//! Fusion legality: whether a kernel's outputs and reductions can share one launch, and if so how
//! that launch iterates. Every rule here is a user error with the reason and the split that fixes it.

use crate::error::Errors;
use crate::ir::is_subsequence;
use crate::ir::{Body, DimId, Launch, Op};

const SPLIT: &str =
    "split it into two `fn`s, each one launch, and pass the first one's result to the second";

/// How the launch of the kernel of `k` iterates, or the fusion errors that keep it from one launch.
pub fn launch(k: &Body, cx: &mut Errors) -> Option<Launch> {
    let live = live_nodes(k);
    let reduces: Vec<(usize, Option<DimId>)> = (0..k.nodes.len())
        .filter(|&i| live[i])
        .filter_map(|i| match k.nodes[i].op {
            Op::Reduce(_, _, dim) => Some((i, dim)),
            _ => None,
        })
        .collect();
    let Some(&(first, first_dim)) = reduces.first() else {
        return map_launch(k, cx);
    };
    for &(id, dim) in &reduces[1..] {
        if dim != first_dim {
            let message = match (first_dim, dim) {
                (Some(a), Some(b)) => format!(
                    "this reduces over `{}`, but this kernel already reduces over `{}`: one launch reduces over one dim (each block owns a run of that dim), so reductions over two different dims, or a reduction of a reduction over another dim, need two launches; {SPLIT}",
                    k.dims[b].text(k.dims),
                    k.dims[a].text(k.dims)
                ),
                _ => format!(
                    "this kernel has both a reduction over every element and a reduction over one dim; one launch does only one of the two; {SPLIT}"
                ),
            };
            cx.spanned(&k.nodes[id].tokens, message);
            return None;
        }
    }
    match first_dim {
        None => full_launch(k, &live, first, cx),
        Some(axis) => rows_launch(k, &reduces, axis, cx),
    }
}

/// Which nodes the outputs depend on; the others are never computed.
pub fn live_nodes(k: &Body) -> Vec<bool> {
    let mut live = vec![false; k.nodes.len()];
    for o in k.outputs {
        for root in o.roots() {
            live[root] = true;
        }
    }
    for i in (0..k.nodes.len()).rev() {
        if live[i] {
            for o in k.nodes[i].op.operands() {
                live[o] = true;
            }
        }
    }
    live
}

fn map_launch(k: &Body, cx: &mut Errors) -> Option<Launch> {
    let domain = k
        .outputs
        .iter()
        .map(|o| o.shape.clone())
        .max_by_key(Vec::len)
        .unwrap_or_default();
    for o in k.outputs {
        if o.shape != domain {
            let message = format!(
                "this output has shape `{}` but another has `{}`: an elementwise kernel writes every output at each element of one domain, so outputs of different shapes need two launches; {SPLIT}",
                k.shape_text(&o.shape),
                k.shape_text(&domain)
            );
            cx.spanned(&o.tokens, message);
            return None;
        }
    }
    Some(Launch::Map { domain })
}

fn full_launch(k: &Body, live: &[bool], first: usize, cx: &mut Errors) -> Option<Launch> {
    let Op::Reduce(_, operand, _) = k.nodes[first].op else {
        unreachable!("`first` is a reduction")
    };
    let domain = k.nodes[operand].shape.clone();
    // A value over elements that depends on a full reduction needs the whole reduction first.
    let mut after_full = vec![false; k.nodes.len()];
    for (i, node) in k.nodes.iter().enumerate() {
        after_full[i] =
            matches!(node.op, Op::Reduce(..)) || node.op.operands().iter().any(|&o| after_full[o]);
        if live[i] && after_full[i] && !node.shape.is_empty() {
            cx.spanned(
                &node.tokens,
                reduction_used_elementwise(k, first, &domain, &node.shape),
            );
            return None;
        }
        if let Op::Reduce(_, a, None) = node.op {
            if live[i] && k.nodes[a].shape != domain {
                let message = format!(
                    "this reduces a tensor of shape `{}`, but this kernel also reduces one of shape `{}`: full reductions in one launch iterate over one domain; {SPLIT}",
                    k.shape_text(&k.nodes[a].shape),
                    k.shape_text(&domain)
                );
                cx.spanned(&node.tokens, message);
                return None;
            }
        }
    }
    for o in k.outputs {
        if !o.shape.is_empty() && o.shape != domain {
            domain_error(k, o, &domain, "a scalar", cx);
            return None;
        }
    }
    Some(Launch::Full { domain })
}

/// The error for a value over `shape` that uses the full reduction `first` over `domain`: over
/// the elements it reduced (`x / sum(x)`), or over others (`x + sum(y)`); each needs the whole
/// reduction before any element, a second launch.
fn reduction_used_elementwise(k: &Body, first: usize, domain: &[DimId], shape: &[DimId]) -> String {
    let t = k.nodes[first].elem();
    let dims = |s: &[DimId]| {
        let text = k.shape_text(s);
        text.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string()
    };
    let (reduced, over) = (dims(domain), dims(shape));
    let head = if is_subsequence(shape, domain) {
        "this uses the result of a reduction over every element again elementwise, over the elements it reduced: every element would have to wait for the whole reduction, which takes a second launch".to_string()
    } else {
        format!("this uses the result of a reduction over every element of `[{reduced}]` elementwise over `[{over}]`: a launch with a full reduction iterates over the elements it reduces, and every element would have to wait for the whole reduction, which takes a second launch")
    };
    format!("{head}; {SPLIT}, as in `fn total(x: [{t}; {reduced}]) -> {t} {{ sum(x) }}` and `fn scale(x: [{t}; {over}], s: [{t};]) -> [{t}; {over}] {{ x / s }}` (a `[{t};]` parameter takes the first one's one-element output without leaving the device)")
}

fn rows_launch(
    k: &Body,
    reduces: &[(usize, Option<DimId>)],
    axis: DimId,
    cx: &mut Errors,
) -> Option<Launch> {
    let mut shapes: Vec<(usize, &Vec<DimId>)> = reduces
        .iter()
        .map(|&(id, _)| match k.nodes[id].op {
            Op::Reduce(_, a, _) => (id, &k.nodes[a].shape),
            _ => unreachable!("`reduces` holds reductions"),
        })
        .collect();
    shapes.extend(k.outputs.iter().map(|o| (o.node, &o.shape)));
    // The domain is the largest shape along the reduced dim: a reduction's operand, or an output
    // over more dims. Among equals the first, a reduction's operand, so that an output beside it
    // (`x - sum(y, c)` with `x: [a, b]`, `y: [a, c]`) is the one told it does not fit.
    let domain = shapes
        .iter()
        .filter(|(_, s)| s.contains(&axis))
        .map(|(_, s)| (*s).clone())
        .rev()
        .max_by_key(Vec::len)
        .unwrap_or_default();
    for &(id, shape) in &shapes[..reduces.len()] {
        if !is_subsequence(shape, &domain) {
            let message = format!(
                "this reduces a tensor of shape `{}`, which does not fit in `{}`, the domain of the rest of this kernel: a row kernel iterates over one domain, the largest shape along the reduced dim, and every reduction's operand must broadcast into it; {SPLIT}",
                k.shape_text(shape),
                k.shape_text(&domain)
            );
            cx.spanned(&k.nodes[id].tokens, message);
            return None;
        }
    }
    let rows: Vec<DimId> = domain.iter().copied().filter(|&d| d != axis).collect();
    for o in k.outputs {
        if o.shape != domain && o.shape != rows {
            let per_row = format!("`{}` (one value per row)", k.shape_text(&rows));
            domain_error(k, o, &domain, &per_row, cx);
            return None;
        }
    }
    Some(Launch::Rows { domain, axis })
}

fn domain_error(
    k: &Body,
    o: &crate::ir::OutputInfo,
    domain: &[DimId],
    other: &str,
    cx: &mut Errors,
) {
    let message = format!(
        "this output has shape `{}`, but this kernel iterates over `{}`: each output of one launch is over `{}` or is {other}; {SPLIT}",
        k.shape_text(&o.shape),
        k.shape_text(domain),
        k.shape_text(domain)
    );
    cx.spanned(&o.tokens, message);
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_error, kernel};
    use quote::quote;

    #[test]
    fn row_patterns_are_one_launch() {
        kernel(
            quote! { fn softmax(x: [f32; r, c]) -> [f32; r, c] { let e = (x - max(x, c)).exp(); e / sum(e, c) } },
        );
        kernel(quote! { fn colsum(g: [f32; r, c]) -> [f32; c] { sum(g, r) } });
        kernel(quote! {
            fn ln(x: [f32; r, c], g: [f32; c], eps: f32) -> ([f32; r, c], [f32; r]) {
                let d = x - mean(x, c);
                let s = rsqrt(mean(d * d, c) + eps);
                (d * s * g, s)
            }
        });
    }

    /// A row reduction's result broadcast into another domain, `x[a, b] - sum(y[a, c], c)`: the
    /// rows are `y`'s, over `[a, c]`, and the output over `[a, b]` is neither that domain nor
    /// one value a row. Only a launch over `[a, b, c]`, a shape no value has, would hold both,
    /// and its rows would redo each sum once for every `b`: the language does not invent that
    /// domain (doc/language.md, "Rows"), whichever of the two comes first.
    #[test]
    fn a_row_result_broadcast_into_another_domain_is_two_launches() {
        let message = "this output has shape `[a, b]`, but this kernel iterates over `[a, c]`: each output of one launch is over `[a, c]` or is `[a]` (one value per row)";
        assert_error(
            quote! { fn f(x: [f32; a, b], y: [f32; a, c]) -> [f32; a, b] { x - sum(y, c) } },
            message,
        );
        assert_error(
            quote! { fn f(y: [f32; a, c], x: [f32; a, b]) -> [f32; a, b] { sum(y, c) + x } },
            message,
        );
        // Within the domain of the rows it is one launch: the output spans the reduced dim.
        let k = kernel(quote! {
            fn f(x: [f32; a, b, c], y: [f32; a, c]) -> [f32; a, b, c] { x - sum(y, c) }
        });
        assert!(matches!(&k.launch, crate::ir::Launch::Rows { domain, .. } if domain.len() == 3));
    }

    #[test]
    fn illegal_fusions_say_why_and_how_to_split() {
        assert_error(
            quote! { fn f(x: [f32; n]) -> [f32; n] { x / sum(x) } },
            "this uses the result of a reduction over every element again elementwise",
        );
        assert_error(
            quote! { fn f(x: [f32; n], y: [f32; m]) -> [f32; n] { x + sum(y) } },
            "this uses the result of a reduction over every element of `[m]` elementwise over `[n]`: a launch with a full reduction iterates over the elements it reduces",
        );
        assert_error(
            quote! { fn f(x: [f32; r, c]) -> [f32; r] { sum(x, c) + max(max(x, r), c) } },
            "this reduces over `r`, but this kernel already reduces over `c`",
        );
        assert_error(
            quote! { fn f(x: [f32; r, c]) -> f32 { sum(max(x, c)) } },
            "this kernel has both a reduction over every element and a reduction over one dim",
        );
        assert_error(
            quote! { fn f(x: [f32; r, c], y: [f32; r]) -> ([f32; r, c], [f32; r]) { (x, y) } },
            "this output has shape `[r]` but another has `[r, c]`",
        );
        assert_error(
            quote! { fn f(x: [f32; r, c], g: [f32; c]) -> ([f32; r, c], [f32; c]) { (x - max(x, c), g) } },
            "this output has shape `[c]`, but this kernel iterates over `[r, c]`",
        );
        assert_error(
            quote! { fn f(x: [f32; r, c], y: [f32; k, c]) -> ([f32; r], [f32; k]) { (sum(x, c), sum(y, c)) } },
            "this reduces a tensor of shape `[k, c]`, which does not fit in `[r, c]`",
        );
        assert_error(
            quote! { fn f(x: [f32; n], y: [f32; m]) -> f32 { sum(x) + sum(y) } },
            "this reduces a tensor of shape `[m]`, but this kernel also reduces one of shape `[n]`",
        );
    }
}
