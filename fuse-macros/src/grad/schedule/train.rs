//! The training pair, `forward_train` and `backward`: what the forward launch saves beside its
//! outputs for the backward to read instead of recomputing it, chosen by the bytes it moves.
//!
//! - A row's statistics (a value over fewer dims than the domain, computed from the kernel's
//!   own reductions: LayerNorm's mean and rstd, softmax's max and sum) are saved where the
//!   backward reads them, in f32: a few bytes a row, and a reduction pass less.
//! - A predicate over the domain (ReLU's `x > 0`) is saved where computing it again would read
//!   more bytes of inputs than that, which the backward needs for nothing else:
//!   `relu(x1 + x2 + x3 + x4)`'s gradient of `x1` reads the mask and `dy` instead of four inputs
//!   and `dy`. It is saved as packed bits, one an element in 32-bit words, where the forward
//!   and every backward launch that reads it are elementwise over it (the bit of an element is
//!   at its position in the domain); under a row launch as a `bool`, a byte an element. One a
//!   random draw decides (dropout's) reads nothing: recomputed.
//! - Every other value is recomputed.

use super::{build, finish, param_names, reverse, Derived, Planned, Root};
use crate::grad::Graph;
use crate::ir::{Dim, Kernel, Launch, NodeId, Op};
use crate::ty::Elem;

/// What `forward_train` saves and `backward` reads.
pub struct Train {
    /// The forward launch: the kernel's outputs, then a saved value each of `saved`.
    pub forward: Kernel,
    pub saved: Vec<Kept>,
    /// The backward's launches, which read the saved values as the temporaries `Kept::temp`.
    pub backward: Derived,
    /// The bits an element of the kernel's domain that `vjp`'s launches and the pair's move
    /// (inputs read and results written over the whole domain; a row's values left out): bits,
    /// since a packed mask moves one an element each way.
    pub vjp_bits: u32,
    pub pair_bits: u32,
}

/// A saved value.
pub struct Kept {
    /// The backward's temporary parameter that holds it.
    pub temp: usize,
    pub elem: Elem,
    /// Its shape, as text (`[rows]`).
    pub shape: String,
    /// What it is, as the docs say it: `` `rsqrt(mean(x * x, cols) + eps)` ``.
    pub what: String,
    /// Whether it is over the whole domain (a predicate) rather than a row's value.
    pub per_element: bool,
    /// Whether it is held as packed bits, one an element (`ParamInfo::packed`), rather than a
    /// `bool` a byte.
    pub packed: bool,
}

/// The training pair of `k` (`#[vjp]`), its hidden launches named `__<name>_t` (the forward)
/// and `__<name>_b<i>`; `vjp` is `k`'s `vjp`, whose bytes the docs compare with the pair's.
pub fn train(k: &Kernel, vjp: &Derived) -> Result<Train, String> {
    let wrt = k.vjp.clone().unwrap_or_default();
    let (mut g, inputs, grads) = reverse(k);
    let roots: Vec<Root> = wrt
        .iter()
        .zip(&grads)
        .enumerate()
        .flat_map(|(j, (&p, grad))| {
            let roots = super::grad_roots(&g, j, p, grad);
            roots.into_iter().map(move |root| (j, root))
        })
        .map(|(j, (node, elem, shape, place))| Root {
            dest: super::Dest::Result(j),
            node,
            elem,
            shape,
            partial: None,
            total: false,
            place,
        })
        .collect();
    let domain = match &k.launch {
        Launch::Map { domain } | Launch::Rows { domain, .. } | Launch::Full { domain } => {
            domain.clone()
        }
    };
    let plain = |using: &[(NodeId, usize)]| Planned {
        roots: roots.clone(),
        using: using.to_vec(),
    };
    let computable = forward_computable(k, &g);
    let originals = k.nodes.len();
    let over_rows = |g: &Graph, n: NodeId| {
        let shape = &g.nodes[n].shape;
        computable[n]
            && g.nodes[n].elem().is_float()
            && shape.len() < domain.len()
            && shape.iter().all(|d| domain.contains(d))
            && reductions(g, n).is_some_and(|own| own.iter().all(|&r| r < originals))
    };
    // The kernel's own values over a row that the backward reads where it goes on over
    // elements, or into a value it derived (whose values over a row, `rstd³`, it computes
    // from the saved ones: a few operations a row).
    let live = plain(&[]).live(&g);
    let mut stats: Vec<NodeId> = (0..originals)
        .filter(|&n| live[n] && over_rows(&g, n))
        .filter(|&n| {
            (0..g.nodes.len()).any(|m| {
                live[m]
                    && (m >= originals || !over_rows(&g, m))
                    && g.nodes[m].op.operands().contains(&n)
            })
        })
        .collect();
    // Of those, the ones still read where the others are saved (not `logsumexp`'s max, which
    // only its saved shift needs).
    let standing: Vec<(NodeId, usize)> = stats.iter().map(|&n| (n, usize::MAX)).collect();
    let still = plain(&standing).live(&g);
    stats.retain(|&n| still[n]);
    // Predicates over the domain, where saving one reads fewer bytes.
    let mut masks: Vec<NodeId> = vec![];
    for (n, node) in g.nodes.iter().enumerate() {
        if !(computable[n] && node.elem() == Elem::Bool && same_dims(&node.shape, &domain)) {
            continue;
        }
        // Stand-ins: which temporary holds a value does not change what is live.
        let standing = |extra: Option<NodeId>| -> Vec<(NodeId, usize)> {
            stats
                .iter()
                .chain(&masks)
                .copied()
                .chain(extra)
                .map(|n| (n, usize::MAX))
                .collect()
        };
        let (before, after) = (standing(None), standing(Some(n)));
        if !plain(&before).live(&g)[n] {
            continue;
        }
        let read = |using: &[(NodeId, usize)]| input_bytes(k, &g, &plain(using).live(&g), &domain);
        if read(&before) > read(&after) + 1 {
            masks.push(n);
        }
    }
    // The forward launch with them, as long as it stays the kernel's launch; else with the
    // statistics alone, else with nothing.
    let name = crate::ir::plain_name(&k.name);
    let kernel_inputs = k.params.len();
    let outputs: Vec<Root> = k
        .outputs
        .iter()
        .enumerate()
        .map(|(j, o)| Root {
            node: o.node,
            elem: o.elem,
            shape: o.shape.clone(),
            dest: super::Dest::Result(j),
            partial: None,
            total: false,
            place: None,
        })
        .collect();
    let forward_with = |g: &Graph, saved: &[NodeId]| {
        let mut roots = outputs.clone();
        roots.extend(saved.iter().enumerate().map(|(i, &n)| Root {
            node: n,
            elem: saved_elem(g, n),
            shape: g.nodes[n].shape.clone(),
            dest: super::Dest::Result(k.outputs.len() + i),
            partial: None,
            total: false,
            place: None,
        }));
        let p = Planned {
            roots,
            using: vec![],
        };
        build(k, g, kernel_inputs, &p, &[], &format!("__{name}_t")).filter(|f| f.launch == k.launch)
    };
    let all: Vec<NodeId> = stats.iter().chain(&masks).copied().collect();
    let (forward, saved) = [all, stats.clone(), vec![]]
        .into_iter()
        .find_map(|saved| Some((forward_with(&g, &saved)?, saved)))
        .ok_or_else(|| bug(k))?;
    masks.retain(|n| saved.contains(n));
    let mut kept = vec![];
    let mut using = vec![];
    for (i, &n) in saved.iter().enumerate() {
        // A value inside one expression of the source (`logsumexp`'s shift and sum) has its
        // text: it says which step it is.
        let mut what = describe(&g, n);
        let text = g.nodes[n].tokens.to_string();
        let inside = g.nodes.iter().any(|m| {
            m.op.operands().contains(&n) && !text.is_empty() && m.tokens.to_string() == text
        });
        if inside {
            what = format!("{what}'s {}", step(&g, n));
        }
        let elem = saved_elem(&g, n);
        let shape = g.nodes[n].shape.clone();
        let name = super::unique(&format!("__saved{i}"), &param_names(k));
        let temp = g.param(&name, elem, Some(shape.clone()));
        using.push((n, temp));
        g.saved.push(temp);
        kept.push(Kept {
            temp,
            elem,
            shape: k.shape_text(&shape),
            what,
            per_element: masks.contains(&n),
            packed: false,
        });
    }
    let vjp_bytes = bytes_of(vjp, &domain, &[]);
    let mut forward = forward;
    let mut backward = finish(k, g, inputs, roots_of(&roots), using, "b")?;
    for (i, s) in kept.iter_mut().enumerate() {
        if s.per_element && packs(&forward, &backward, k.outputs.len() + i, s.temp) {
            pack(&mut forward, &mut backward, k.outputs.len() + i, s.temp);
            s.packed = true;
        }
    }
    // A mask is written once and read once: a bit an element each way, or a `bool`'s byte.
    let mask_bits: u32 = kept
        .iter()
        .filter(|s| s.per_element)
        .map(|s| if s.packed { 2 } else { 16 })
        .sum();
    let masks: Vec<usize> = kept
        .iter()
        .filter(|s| s.per_element)
        .map(|s| s.temp)
        .collect();
    let pair_bits = 8 * bytes_of(&backward, &domain, &masks) + mask_bits;
    Ok(Train {
        forward,
        saved: kept,
        backward,
        vjp_bits: 8 * vjp_bytes,
        pair_bits,
    })
}

/// Whether the predicate that the forward writes as output `o` and the backward reads as
/// temporary `temp` can be held as packed bits: where every launch that touches it is
/// elementwise over it (its shape the launch's domain, dims in the same order), so that an
/// element's bit is at its position in the domain. Row launches keep a byte an element.
fn packs(forward: &Kernel, backward: &Derived, o: usize, temp: usize) -> bool {
    let over = |k: &Kernel, shape: &[crate::ir::DimId]| matches!(&k.launch, Launch::Map { domain } if domain.as_slice() == shape);
    over(forward, &forward.outputs[o].shape)
        && backward.steps.iter().all(|step| {
            step.temps.iter().position(|&t| t == temp).is_none_or(|i| {
                let p = &step.kernel.params[backward.inputs + i];
                p.shape.as_deref().is_some_and(|s| over(&step.kernel, s))
            })
        })
}

/// Marks the predicate of [`packs`] as packed bits in the launches that write and read it.
fn pack(forward: &mut Kernel, backward: &mut Derived, o: usize, temp: usize) {
    forward.outputs[o].packed = true;
    for step in &mut backward.steps {
        if let Some(i) = step.temps.iter().position(|&t| t == temp) {
            step.kernel.params[backward.inputs + i].packed = true;
        }
    }
}

fn roots_of(roots: &[Root]) -> Vec<super::Wanted> {
    roots
        .iter()
        .map(|r| (r.node, r.elem, r.shape.clone(), r.place.clone()))
        .collect()
}

fn bug(k: &Kernel) -> String {
    format!(
        "the training pair of `{}` does not plan: this is a bug of fuse, please report it",
        crate::ir::plain_name(&k.name)
    )
}

/// The type a value is saved in: a float's in f32 (f64 where it is f64), `bool` as itself.
fn saved_elem(g: &Graph, n: NodeId) -> Elem {
    match g.nodes[n].elem() {
        Elem::Bool => Elem::Bool,
        Elem::F64 => Elem::F64,
        _ => Elem::F32,
    }
}

/// Which values the forward launch can compute: those of the kernel's parameters alone (no
/// cotangent).
fn forward_computable(k: &Kernel, g: &Graph) -> Vec<bool> {
    let mut ok = vec![false; g.nodes.len()];
    for n in 0..g.nodes.len() {
        ok[n] = match g.nodes[n].op {
            Op::Load(p) | Op::Scalar(p) => p < k.params.len(),
            ref op => op.operands().iter().all(|&o| ok[o]),
        };
    }
    ok
}

/// The reductions `n` is computed from, or `None` if none.
fn reductions(g: &Graph, n: NodeId) -> Option<Vec<NodeId>> {
    let (mut seen, mut stack, mut found) = (vec![], vec![n], vec![]);
    while let Some(m) = stack.pop() {
        if seen.contains(&m) {
            continue;
        }
        seen.push(m);
        if matches!(g.nodes[m].op, Op::Reduce(..)) {
            found.push(m);
        }
        stack.extend(g.nodes[m].op.operands());
    }
    (!found.is_empty()).then_some(found)
}

fn same_dims(a: &[crate::ir::DimId], b: &[crate::ir::DimId]) -> bool {
    a.len() == b.len() && a.iter().all(|d| b.contains(d))
}

/// The bytes an element of `domain` of the kernel's tensor inputs over all of it that the
/// `live` values read.
fn input_bytes(k: &Kernel, g: &Graph, live: &[bool], domain: &[crate::ir::DimId]) -> u32 {
    (0..k.params.len())
        .filter(|&p| {
            g.params[p]
                .shape
                .as_ref()
                .is_some_and(|s| same_dims(s, domain))
        })
        .filter(|&p| {
            (0..live.len()).any(|n| live[n] && matches!(g.nodes[n].op, Op::Load(q) if q == p))
        })
        .map(|p| g.params[p].elem.bits() / 8)
        .sum()
}

/// The bytes an element of `domain` that launches `d` move: each tensor over all of it read by
/// a launch, and each result over all of it written; the temporaries `saved` (what the forward
/// saved) left to the caller, which counts a mask's bits.
fn bytes_of(d: &Derived, domain: &[crate::ir::DimId], saved: &[usize]) -> u32 {
    d.steps
        .iter()
        .map(|s| {
            let dims = &s.kernel.dims;
            let reads: u32 = s
                .kernel
                .params
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.written)
                .filter(|(i, _)| *i < d.inputs || !saved.contains(&s.temps[*i - d.inputs]))
                .filter(|(i, _)| {
                    s.kernel
                        .nodes
                        .iter()
                        .any(|n| matches!(n.op, Op::Load(q) | Op::View(q, _) if q == *i))
                })
                .filter_map(|(_, p)| {
                    let each = per_element(dims, p.shape.as_deref()?, domain)?;
                    Some(each * p.elem.bits() / 8)
                })
                .sum();
            let writes: u32 = s
                .kernel
                .outputs
                .iter()
                .filter(|o| o.partial.is_none())
                .filter_map(|o| Some(per_element(dims, &o.shape, domain)? * o.elem.bits() / 8))
                .sum();
            reads + writes
        })
        .sum()
}

/// How many elements of a tensor of `shape` there are an element of `domain`, where its dims
/// are `domain`'s, some as a composite dim of parts of one of them (`x: [t, 2 * d]` against
/// `[t, d]`: two); `None` for a tensor over other dims.
fn per_element(
    dims: &[Dim],
    shape: &[crate::ir::DimId],
    domain: &[crate::ir::DimId],
) -> Option<u32> {
    let mut each = 1u32;
    let mut covered = vec![];
    for &d in shape {
        let (of, count) = match &dims[d] {
            _ if domain.contains(&d) => (d, 1),
            Dim::Composite(c) => {
                let terms = c.terms();
                let of = terms.first()?.1;
                if !terms.iter().all(|&(_, x)| x == of) {
                    return None;
                }
                (of, terms.iter().map(|&(k, _)| k).sum::<u64>())
            }
            _ => return None,
        };
        covered.push(of);
        each = each.saturating_mul(u32::try_from(count).ok()?);
    }
    same_dims(&covered, domain).then_some(each)
}

/// A saved value as the docs name it: the source text of the kernel's own values, the
/// comparisons of those the macro derived.
fn describe(g: &Graph, n: NodeId) -> String {
    fn text(g: &Graph, n: NodeId, depth: usize) -> String {
        let node = &g.nodes[n];
        if !node.tokens.is_empty() {
            return tidy(&node.tokens.to_string());
        }
        match &node.op {
            Op::Load(p) | Op::Scalar(p) => crate::ir::plain_name(&g.params[*p].name),
            Op::Float(v) => v.clone(),
            Op::Int(v) => v.to_string(),
            Op::Cast(a) => text(g, *a, depth),
            Op::Binary(b, x, y) if depth < 3 => format!(
                "{} {} {}",
                text(g, *x, depth + 1),
                b.symbol(),
                text(g, *y, depth + 1)
            ),
            _ => "…".to_string(),
        }
    }
    format!("`{}`", text(g, n, 0))
}

/// What operation `n` is, for [`describe`]'s text of a step inside an expression.
fn step(g: &Graph, n: NodeId) -> String {
    match &g.nodes[n].op {
        Op::Reduce(r, ..) => format!("{r:?}").to_lowercase(),
        Op::Call(crate::func::Func::Detach, _) => "shift".to_string(),
        Op::Call(crate::func::Func::GeluGrad, _) => "gelu's derivative".to_string(),
        Op::Call(f, _) => format!("{f:?}").to_lowercase(),
        Op::Binary(b, ..) => format!("`{}`", b.symbol()),
        Op::Select(..) => "selection".to_string(),
        _ => "value".to_string(),
    }
}

/// Token text with the spaces `TokenStream`'s printing puts before parentheses and commas
/// taken out: `rsqrt(mean(x * x, cols) + eps)`.
fn tidy(s: &str) -> String {
    s.replace(" (", "(")
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(" ,", ",")
        .replace(" . ", ".")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::kernel;
    use quote::quote;

    fn pair(k: &Kernel) -> Train {
        train(k, &super::super::vjp(k, false, "d").unwrap()).unwrap()
    }

    fn saved(t: &Train) -> Vec<String> {
        t.saved
            .iter()
            .map(|s| format!("{} {} {}", s.what, s.shape, s.elem))
            .collect()
    }

    /// A row's statistics are saved in f32 (RMSNorm's rstd, LayerNorm's mean and rstd), and
    /// the backward reads them instead of reducing the row for them.
    #[test]
    fn norms_save_their_row_statistics() {
        let k = kernel(quote! {
            #[vjp(x, w)]
            fn rmsnorm(x: [bf16; rows, cols], w: [bf16; cols]) -> [bf16; rows, cols] {
                x * rsqrt(mean(x * x, cols) + 1e-6) * w
            }
        });
        let t = pair(&k);
        assert_eq!(saved(&t), ["`rsqrt(mean(x * x, cols) + 1e-6)` [rows] f32"]);
        assert_eq!((t.vjp_bits, t.pair_bits), (48, 48));
        let k = kernel(quote! {
            #[vjp(x, g, b)]
            fn layernorm(x: [f32; rows, cols], g: [f32; cols], b: [f32; cols]) -> [f32; rows, cols] {
                let d = x - mean(x, cols);
                d * rsqrt(mean(d * d, cols) + 1e-5) * g + b
            }
        });
        let t = pair(&k);
        assert_eq!(
            saved(&t),
            [
                "`mean(x, cols)` [rows] f32",
                "`rsqrt(mean(d * d, cols) + 1e-5)` [rows] f32"
            ]
        );
    }

    /// ReLU's mask is saved where it spares reading the inputs it is computed from; dropout's
    /// is drawn again from the seed.
    #[test]
    fn masks_are_saved_where_they_spare_reading_inputs() {
        let k = kernel(quote! {
            #[vjp(x1)]
            fn relu4(x1: [f32; n], x2: [f32; n], x3: [f32; n], x4: [f32; n]) -> [f32; n] {
                relu(x1 + x2 + x3 + x4)
            }
        });
        let t = pair(&k);
        assert_eq!(saved(&t), ["`x1 + x2 + x3 + x4 > 0.0` [n] bool"]);
        // Packed: a bit written and a bit read an element, beside `dy` read and `dx1` written.
        assert!(t.saved[0].packed);
        assert!(t.forward.outputs[1].packed);
        let [step] = &t.backward.steps[..] else {
            panic!("one backward launch")
        };
        assert!(step.kernel.params.iter().filter(|p| p.packed).count() == 1);
        assert_eq!((t.vjp_bits, t.pair_bits), (192, 66));
        let (forward, backward) = (
            crate::cuda::text(&t.forward),
            crate::cuda::text(&step.kernel),
        );
        assert!(
            forward.contains("unsigned int* __restrict__ out1"),
            "{forward}"
        );
        assert!(forward.contains("fz_or_bits(out1, (long long)j * 4, (s1.v[0] ? 1u : 0u) |"));
        assert!(forward.contains("fz_or_bits(out1, o0, v"), "{forward}");
        assert!(
            backward.contains("const unsigned int* __restrict__ p___saved0"),
            "{backward}"
        );
        assert!(
            backward.contains("fz_bit(p___saved0, (long long)j * 4, l)"),
            "{backward}"
        );
        assert!(backward.contains("fz_bit(p___saved0, o0)"), "{backward}");
        // Inside a row kernel: a `bool` a byte an element.
        let k = kernel(quote! {
            #[vjp(x)]
            fn centred(x: [f32; rows, cols]) -> [f32; rows, cols] {
                relu(x - mean(x, cols))
            }
        });
        let t = pair(&k);
        assert_eq!(
            saved(&t),
            [
                "`mean(x, cols)` [rows] f32",
                "`x - mean(x, cols) > 0.0` [rows, cols] bool"
            ]
        );
        assert!(!t.saved[1].packed && !t.forward.outputs[2].packed);
        assert_eq!(t.pair_bits % 8, 0);
        let k = kernel(quote! {
            #[vjp(x)]
            fn drop(x: [f32; n], seed: u64) -> [f32; n] {
                dropout(x * 2.0, 0.1, seed)
            }
        });
        assert_eq!(saved(&pair(&k)), Vec::<String>::new());
    }
}
