//! The derivative's launches: the values wanted, split into as few kernels as fusion allows,
//! with temporaries for the reductions nested in others, and merged where they fuse.

use super::Graph;
use crate::ir::{DimId, Kernel, Launch, Node, NodeId, Op, OutputInfo, ParamInfo};
use crate::ty::Elem;
use proc_macro2::{Ident, Span, TokenStream};

/// A value a launch writes: a result of the derived function (its place among them) or a
/// temporary (its parameter).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dest {
    Result(usize),
    Temp(usize),
}

/// One launch of a derived function: its kernel, whose parameters are the graph's first
/// `inputs` parameters followed by the temporaries `temps` (graph parameters), and where each
/// output goes.
pub struct Step {
    pub kernel: Kernel,
    pub temps: Vec<usize>,
    pub dests: Vec<Dest>,
}

/// A value wanted from a derived function.
#[derive(Clone)]
struct Root {
    node: NodeId,
    elem: Elem,
    shape: Vec<DimId>,
    dest: Dest,
}

/// What a derived function computes: the graph and its launches.
pub struct Derived {
    /// The parameters of the function: the kernel's, then the cotangents or tangents.
    pub inputs: usize,
    pub steps: Vec<Step>,
}

/// The reverse-mode function: the kernel's parameters and a cotangent a float output; results
/// `forward` outputs first where asked (`value_and_vjp`), then a gradient each of `vjp`.
pub fn vjp(k: &Kernel, with_values: bool, mode: &str) -> Result<Derived, String> {
    let wrt = k.vjp.clone().unwrap_or_default();
    let mut g = Graph::new(k);
    let names = output_names(&param_names(k), k.outputs.len(), k.tuple, "d_");
    let cotangents: Vec<Option<usize>> = k
        .outputs
        .iter()
        .zip(&names)
        .map(|(o, name)| {
            o.elem
                .is_float()
                .then(|| g.param(name, o.elem, Some(o.shape.clone())))
        })
        .collect();
    let inputs = g.params.len();
    let grads = g.reverse(&k.outputs, &cotangents, &wrt);
    let mut roots = vec![];
    if with_values {
        roots.extend(k.outputs.iter().map(|o| (o.node, o.elem, o.shape.clone())));
    }
    for (&p, &node) in wrt.iter().zip(&grads) {
        let shape = g.params[p].shape.clone().unwrap_or_default();
        roots.push((node, g.params[p].elem, shape));
    }
    finish(k, g, inputs, roots, mode)
}

/// The forward-mode function: the kernel's parameters and a tangent each of `jvp`; results the
/// outputs, then a tangent each float output.
pub fn jvp(k: &Kernel, mode: &str) -> Result<Derived, String> {
    let wrt = k.jvp.clone().unwrap_or_default();
    let mut g = Graph::new(k);
    let tangents: Vec<usize> = wrt
        .iter()
        .map(|&p| {
            let name = format!("t_{}", crate::ir::plain_name(&k.params[p].name));
            let name = unique(&name, &param_names(k));
            g.param(&name, k.params[p].elem, k.params[p].shape.clone())
        })
        .collect();
    let inputs = g.params.len();
    let outs = g.forward(&k.outputs, &wrt, &tangents);
    let mut roots: Vec<(NodeId, Elem, Vec<DimId>)> = k
        .outputs
        .iter()
        .map(|o| (o.node, o.elem, o.shape.clone()))
        .collect();
    for (o, t) in k.outputs.iter().zip(outs) {
        if let Some(t) = t {
            roots.push((t, o.elem, o.shape.clone()));
        }
    }
    finish(k, g, inputs, roots, mode)
}

fn finish(
    k: &Kernel,
    mut g: Graph,
    inputs: usize,
    roots: Vec<(NodeId, Elem, Vec<DimId>)>,
    mode: &str,
) -> Result<Derived, String> {
    let roots = roots
        .into_iter()
        .enumerate()
        .map(|(j, (node, elem, shape))| Root {
            node,
            elem,
            shape,
            dest: Dest::Result(j),
        })
        .collect();
    let mut planned = vec![];
    plan(k, &mut g, inputs, roots, &[], &mut planned)?;
    let planned = merge(k, &g, inputs, planned);
    let name = crate::ir::plain_name(&k.name);
    let steps = planned
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let temps = p.temps_read(&g);
            let kernel = build(k, &g, inputs, &p, &temps, &format!("__{name}_{mode}{i}"))
                .expect("a merged launch is legal");
            Step {
                kernel,
                temps,
                dests: p.roots.iter().map(|r| r.dest).collect(),
            }
        })
        .collect();
    Ok(Derived { inputs, steps })
}

/// The plain names of `k`'s parameters.
fn param_names(k: &Kernel) -> Vec<String> {
    k.params
        .iter()
        .map(|p| crate::ir::plain_name(&p.name))
        .collect()
}

/// A name for each output's cotangent or tangent (`{prefix}out`, or `{prefix}out0`, ..), clear
/// of the parameters' names; the generated functions (`items.rs`) name theirs with it too.
pub fn output_names(params: &[String], outputs: usize, tuple: bool, prefix: &str) -> Vec<String> {
    (0..outputs)
        .map(|j| match tuple {
            true => unique(&format!("{prefix}out{j}"), params),
            false => unique(&format!("{prefix}out"), params),
        })
        .collect()
}

/// `name`, with underscores added until it is neither a parameter's nor the device argument's.
pub fn unique(name: &str, params: &[String]) -> String {
    let mut name = name.to_string();
    while params.contains(&name) || name == crate::check::DEVICE_ARG {
        name.push('_');
    }
    name
}

/// A launch being planned: the values it computes, and the reductions it reads from the
/// temporaries earlier launches write (each with its temporary) rather than computing them.
#[derive(Clone)]
struct Planned {
    roots: Vec<Root>,
    using: Vec<(NodeId, usize)>,
}

impl Planned {
    /// The temporary `id` is read from, unless the launch computes it.
    fn replacement(&self, id: NodeId) -> Option<usize> {
        if self.roots.iter().any(|r| r.node == id) {
            return None;
        }
        self.using.iter().find(|(n, _)| *n == id).map(|&(_, t)| t)
    }

    /// The values the roots need, stopping at those read from temporaries.
    fn live(&self, g: &Graph) -> Vec<bool> {
        let mut live = vec![false; g.nodes.len()];
        for r in &self.roots {
            live[r.node] = true;
        }
        for i in (0..g.nodes.len()).rev() {
            if live[i] && self.replacement(i).is_none() {
                for o in g.nodes[i].op.operands() {
                    live[o] = true;
                }
            }
        }
        live
    }

    fn temps_read(&self, g: &Graph) -> Vec<usize> {
        let live = self.live(g);
        let mut temps: Vec<usize> = (0..g.nodes.len())
            .filter(|&i| live[i])
            .filter_map(|i| self.replacement(i))
            .collect();
        temps.sort_unstable();
        temps.dedup();
        temps
    }

    /// The temporaries the launch writes.
    fn writes(&self) -> impl Iterator<Item = usize> + '_ {
        self.roots.iter().filter_map(|r| match r.dest {
            Dest::Temp(t) => Some(t),
            Dest::Result(_) => None,
        })
    }

    /// The reductions to compute in an earlier launch: each that a reduction over another dim
    /// needs, and each over every element that a value over elements needs.
    fn inner_reductions(&self, g: &Graph) -> Vec<NodeId> {
        let live = self.live(g);
        let n = g.nodes.len();
        let computed = |i: usize| live[i] && self.replacement(i).is_none();
        let is_reduce = |i: usize| computed(i) && matches!(g.nodes[i].op, Op::Reduce(..));
        let mut found = vec![];
        for r in (0..n).filter(|&i| is_reduce(i)) {
            let Op::Reduce(_, _, axis) = g.nodes[r].op else {
                unreachable!("`is_reduce` holds reductions")
            };
            // The values computed from `r`.
            let mut after = vec![false; n];
            after[r] = true;
            for i in r + 1..n {
                after[i] = computed(i) && g.nodes[i].op.operands().iter().any(|&o| after[o]);
            }
            let needed = (r + 1..n).any(|i| {
                after[i]
                    && match g.nodes[i].op {
                        Op::Reduce(_, _, other) => other != axis,
                        _ => axis.is_none() && !g.nodes[i].shape.is_empty(),
                    }
            });
            let root_needs = axis.is_none()
                && self
                    .roots
                    .iter()
                    .any(|root| after[root.node] && !root.shape.is_empty());
            if needed || root_needs {
                found.push(r);
            }
        }
        found
    }
}

/// Plans the launches of `roots`, reading the temporaries of `using`, appended to `planned`
/// in an order that writes each temporary before a launch reads it. All in one launch where
/// that fuses, else each root on its own; a root that fuses with nothing reads the reductions
/// nested in others from temporaries (one each, shared by every root that needs it).
fn plan(
    k: &Kernel,
    g: &mut Graph,
    inputs: usize,
    roots: Vec<Root>,
    using: &[(NodeId, usize)],
    planned: &mut Vec<Planned>,
) -> Result<(), String> {
    let mut p = Planned {
        roots,
        using: using.to_vec(),
    };
    if build(k, g, inputs, &p, &p.temps_read(g), "__derived").is_some_and(|b| fair(&p, &b)) {
        planned.push(p);
        return Ok(());
    }
    if p.roots.len() > 1 {
        for r in p.roots {
            plan(k, g, inputs, vec![r], using, planned)?;
        }
        return Ok(());
    }
    loop {
        let inner = p.inner_reductions(g);
        if inner.is_empty() {
            return Err(format!(
                "the derivative of `{}` does not split into launches: this is a bug of fuse, please report it",
                crate::ir::plain_name(&k.name)
            ));
        }
        let mut temp_roots = vec![];
        for r in inner {
            if let Some(&(_, t)) = g.temps.iter().find(|(n, _)| *n == r) {
                // Written already, for another root.
                p.using.push((r, t));
                continue;
            }
            // In the reduction's own type, which its readers expect.
            let (shape, elem) = (g.shape(r), g.elem(r));
            let t = g.param(&format!("__t{}", g.temps.len()), elem, Some(shape.clone()));
            g.temps.push((r, t));
            p.using.push((r, t));
            temp_roots.push(Root {
                node: r,
                elem,
                shape,
                dest: Dest::Temp(t),
            });
        }
        if !temp_roots.is_empty() {
            plan(k, g, inputs, temp_roots, using, planned)?;
        }
        if build(k, g, inputs, &p, &p.temps_read(g), "__derived").is_some() {
            planned.push(p);
            return Ok(());
        }
    }
}

/// The kernel computing `roots`, its parameters the graph's first `inputs` and then `temps`,
/// or `None` where they do not fuse into one launch.
fn build(
    k: &Kernel,
    g: &Graph,
    inputs: usize,
    p: &Planned,
    temps: &[usize],
    name: &str,
) -> Option<Kernel> {
    let (roots, live) = (&p.roots, p.live(g));
    let param_index = |p: usize| -> usize {
        match p < inputs {
            true => p,
            false => {
                inputs
                    + temps
                        .iter()
                        .position(|&t| t == p)
                        .expect("a temporary read")
            }
        }
    };
    let mut map: Vec<usize> = vec![usize::MAX; g.nodes.len()];
    let mut nodes: Vec<Node> = vec![];
    for i in (0..g.nodes.len()).filter(|&i| live[i]) {
        let node = &g.nodes[i];
        let op = match p.replacement(i) {
            Some(t) => Op::Load(param_index(t)),
            None => remap(&node.op, &map, &param_index),
        };
        let ty = match p.replacement(i) {
            Some(t) => crate::ty::Ty::Elem(g.params[t].elem),
            None => node.ty,
        };
        nodes.push(Node {
            op,
            ty,
            shape: node.shape.clone(),
            tokens: node.tokens.clone(),
        });
        map[i] = nodes.len() - 1;
    }
    // Each result in its type: a cast where the value is of another.
    let mut outputs = vec![];
    for r in roots {
        let mut id = map[r.node];
        if nodes[id].elem() != r.elem {
            let shape = nodes[id].shape.clone();
            nodes.push(Node::derived(Op::Cast(id), r.elem, shape));
            id = nodes.len() - 1;
        }
        outputs.push(OutputInfo {
            elem: r.elem,
            shape: r.shape.clone(),
            node: id,
            tokens: TokenStream::new(),
        });
    }
    let params: Vec<ParamInfo> = (0..inputs)
        .chain(temps.iter().copied())
        .map(|p| ParamInfo {
            name: g.params[p].name.clone(),
            elem: g.params[p].elem,
            shape: g.params[p].shape.clone(),
        })
        .collect();
    let body = crate::ir::Body {
        dims: &g.dims,
        nodes: &nodes,
        outputs: &outputs,
    };
    let mut cx = crate::error::Errors::default();
    let launch = crate::fusion::launch(&body, &mut cx)?;
    let doc = "Hidden: a launch of a derived function.";
    let tuple = outputs.len() > 1;
    Some(Kernel {
        attrs: vec![
            syn::parse_quote!(#[doc = #doc]),
            syn::parse_quote!(#[doc(hidden)]),
        ],
        fast_math: k.fast_math,
        vjp: None,
        jvp: None,
        vis: syn::parse_quote!(pub),
        name: Ident::new(name, Span::call_site()),
        dims: g.dims.clone(),
        params,
        outputs,
        tuple,
        nodes,
        launch,
    })
}

fn remap(op: &Op, map: &[usize], param: &dyn Fn(usize) -> usize) -> Op {
    let m = |i: &NodeId| map[*i];
    match op {
        Op::Load(p) => Op::Load(param(*p)),
        Op::Scalar(p) => Op::Scalar(param(*p)),
        Op::Unary(u, a) => Op::Unary(*u, m(a)),
        Op::Binary(b, x, y) => Op::Binary(*b, m(x), m(y)),
        Op::Cast(a) => Op::Cast(m(a)),
        Op::Select(c, a, b) => Op::Select(m(c), m(a), m(b)),
        Op::Call(f, args) => Op::Call(*f, args.iter().map(m).collect()),
        Op::Reduce(r, a, d) => Op::Reduce(*r, m(a), *d),
        Op::Random(r, s, n) => Op::Random(*r, m(s), *n),
        other => other.clone(),
    }
}

/// Whether launch `b` of several results is as fast as they are apart: not where it writes
/// values over elements from a reduction over a leading dim (the column path), which takes each
/// tile of 32 columns whole in one block. Merged so, G8's `dx` and `dbias` ran at 7% of copy
/// speed on an H100 (a grid of 128 blocks), where apart they read the inputs twice at full
/// speed.
fn fair(p: &Planned, b: &Kernel) -> bool {
    let Launch::Rows { domain, .. } = &b.launch else {
        return true;
    };
    p.roots.len() == 1 || !crate::plan::columns(b) || b.outputs.iter().all(|o| &o.shape != domain)
}

/// Merges each launch into the earliest one before it after which everything it reads is
/// written, where the two fuse: the temporaries of a reduction over rows, say, into the launch
/// that writes a gradient over elements row by row.
fn merge(k: &Kernel, g: &Graph, inputs: usize, planned: Vec<Planned>) -> Vec<Planned> {
    let mut merged: Vec<Planned> = vec![];
    for p in planned {
        let reads = p.temps_read(g);
        let mut placed = false;
        for at in 0..merged.len() {
            let before: Vec<usize> = merged[..at].iter().flat_map(Planned::writes).collect();
            if !reads.iter().all(|t| before.contains(t)) {
                continue;
            }
            let mut both = merged[at].clone();
            both.roots.extend(p.roots.iter().cloned());
            for &u in &p.using {
                if !both.using.contains(&u) {
                    both.using.push(u);
                }
            }
            // Reading its own writes would need another launch.
            let writes: Vec<usize> = both.writes().collect();
            let temps = both.temps_read(g);
            if temps.iter().any(|t| writes.contains(t)) {
                continue;
            }
            if build(k, g, inputs, &both, &temps, "__derived").is_some_and(|b| fair(&both, &b)) {
                merged[at] = both;
                placed = true;
                break;
            }
        }
        if !placed {
            merged.push(p);
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::kernel;
    use quote::quote;

    fn describe(d: &Derived) -> Vec<String> {
        d.steps
            .iter()
            .map(|s| {
                format!(
                    "{:?} -> {:?} (temps {:?})",
                    s.kernel.launch, s.dests, s.temps
                )
            })
            .collect()
    }

    /// LayerNorm's gradients: `dx` and the temporaries of `dg` (the row's mean and rstd) in
    /// one launch over rows, `dg` and `db` in one over columns; `value_and_vjp` adds the
    /// outputs to the first.
    #[test]
    fn layernorm_backward_is_two_launches() {
        let k = kernel(quote! {
            #[vjp(x, g, b)]
            fn layernorm(x: [f64; rows, cols], g: [f64; cols], b: [f64; cols]) -> ([f64; rows, cols], [f64; rows]) {
                let d = x - mean(x, cols);
                let rstd = rsqrt(mean(d * d, cols) + 1e-5);
                (d * rstd * g + b, rstd)
            }
        });
        let rows = "Rows { domain: [0, 1], axis: 1 }";
        let cols = "Rows { domain: [0, 1], axis: 0 }";
        assert_eq!(
            describe(&vjp(&k, false, "d").unwrap()),
            [
                format!("{rows} -> [Result(0), Temp(5), Temp(6)] (temps [])"),
                format!("{cols} -> [Result(1), Result(2)] (temps [5, 6])"),
            ]
        );
        assert_eq!(
            describe(&vjp(&k, true, "v").unwrap()),
            [
                format!("{rows} -> [Result(0), Result(1), Result(2), Temp(5), Temp(6)] (temps [])"),
                format!("{cols} -> [Result(3), Result(4)] (temps [5, 6])"),
            ]
        );
    }
}
