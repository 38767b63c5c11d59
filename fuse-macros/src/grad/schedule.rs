//! The derivative's launches: the values wanted, split into as few kernels as fusion allows,
//! with temporaries for the reductions nested in others, and merged where they fuse.

use super::{Grad, Graph};
use crate::ir::{
    DimId, Kernel, Launch, Node, NodeId, Op, OutputInfo, ParamInfo, Place, Reduce, View,
};
use crate::ty::Elem;
use proc_macro2::{Ident, Span, TokenStream};

mod train;
pub use train::{train, Train};

/// A value a launch writes: a result of the derived function (its place among them) or a
/// temporary (its parameter).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dest {
    Result(usize),
    Temp(usize),
}

/// One launch of a derived function: its kernel, whose parameters are the graph's first
/// `inputs` parameters followed by the temporaries `temps` (graph parameters) and the results
/// it writes in parts (`written`), and where each output goes.
pub struct Step {
    pub kernel: Kernel,
    pub temps: Vec<usize>,
    pub dests: Vec<Dest>,
    /// The results the launch stores in parts, in the order of its `&mut` parameters: each
    /// result's place among the function's, the parameter whose shape it has, and whether
    /// the parts cover it (else the function zeroes it first).
    pub written: Vec<Written>,
}

/// A result stored through the views of its parts ([`Grad::Parts`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Written {
    pub result: usize,
    pub param: usize,
    pub covered: bool,
}

/// A value wanted from a derived function.
#[derive(Clone)]
struct Root {
    node: NodeId,
    elem: Elem,
    shape: Vec<DimId>,
    dest: Dest,
    /// Summed over rows in the launch that computes it (`OutputInfo::partial`): its value is
    /// over `[rows, len]`, summed in `elem`, and stored as `[len]` (`[]`, a `total`) of this
    /// type.
    partial: Option<Elem>,
    /// A partial sum over everything, rows and columns (`OutputInfo::total`).
    total: bool,
    /// Stored through a view of its result's buffer, which has the shape of a parameter:
    /// one part of a gradient ([`Grad::Parts`]).
    place: Option<(Written, View)>,
}

/// A value a derived function returns: its node, type and shape, and the view of its result's
/// buffer it is stored through where it is one part of the result.
type Wanted = (NodeId, Elem, Vec<DimId>, Option<(Written, View)>);

/// The roots of a gradient, result `j` of the function, of parameter `p`.
fn grad_roots(g: &Graph, j: usize, p: usize, grad: &Grad) -> Vec<Wanted> {
    let elem = g.params[p].elem;
    match grad {
        Grad::Whole(node) => {
            let shape = g.params[p].shape.clone().unwrap_or_default();
            vec![(*node, elem, shape, None)]
        }
        Grad::Parts { parts, covered } => parts
            .iter()
            .map(|(view, node)| {
                let written = Written {
                    result: j,
                    param: p,
                    covered: *covered,
                };
                let shape = g.nodes[*node].shape.clone();
                (*node, elem, shape, Some((written, view.clone())))
            })
            .collect(),
    }
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
    let (g, inputs, grads) = reverse(k);
    let wrt = k.vjp.clone().unwrap_or_default();
    let mut roots: Vec<Wanted> = vec![];
    if with_values {
        roots.extend(
            k.outputs
                .iter()
                .map(|o| (o.node, o.elem, o.shape.clone(), None)),
        );
    }
    for (i, (&p, grad)) in wrt.iter().zip(&grads).enumerate() {
        let j = i + if with_values { k.outputs.len() } else { 0 };
        roots.extend(grad_roots(&g, j, p, grad));
    }
    finish(k, g, inputs, roots, vec![], mode)
}

/// The graph of `k`'s gradients (of `#[vjp]`'s list), given a cotangent parameter for each
/// float output: the graph, its first parameters that are the function's inputs (the kernel's
/// and the cotangents), and the gradient of each listed parameter.
fn reverse(k: &Kernel) -> (Graph, usize, Vec<Grad>) {
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
    (g, inputs, grads)
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
    let mut roots: Vec<Wanted> = k
        .outputs
        .iter()
        .map(|o| (o.node, o.elem, o.shape.clone(), None))
        .collect();
    for (o, t) in k.outputs.iter().zip(outs) {
        if let Some(t) = t {
            roots.push((t, o.elem, o.shape.clone(), None));
        }
    }
    finish(k, g, inputs, roots, vec![], mode)
}

/// The launches computing `roots`, reading the values of `using` from the temporaries beside
/// them (the training pair's saved values) rather than computing them. Each root is a result
/// of its own, in order, except the parts of one result, which are that result.
fn finish(
    k: &Kernel,
    mut g: Graph,
    inputs: usize,
    roots: Vec<Wanted>,
    using: Vec<(NodeId, usize)>,
    mode: &str,
) -> Result<Derived, String> {
    let mut results = 0;
    // The values later launches read through views of their temporaries, planned first.
    let early: Vec<Root> = g
        .early
        .clone()
        .into_iter()
        .map(|(node, t)| Root {
            node,
            elem: g.params[t].elem,
            shape: g.nodes[node].shape.clone(),
            dest: Dest::Temp(t),
            partial: None,
            total: false,
            place: None,
        })
        .collect();
    g.temps.extend(g.early.iter().copied());
    let roots = early
        .into_iter()
        .chain(roots.into_iter().map(|(node, elem, shape, place)| {
            let j = match &place {
                Some((w, _)) => w.result,
                None => results,
            };
            results = results.max(j + 1);
            Root {
                node,
                elem,
                shape,
                dest: Dest::Result(j),
                partial: None,
                total: false,
                place,
            }
        }))
        .collect();
    let mut planned = vec![];
    plan(k, &mut g, inputs, roots, &using, &mut planned)?;
    let planned = merge(k, &g, inputs, planned);
    let planned = partial_sums(k, &mut g, inputs, planned);
    let saved: Vec<usize> = using.iter().map(|&(_, t)| t).collect();
    let planned = merge_later(k, &g, inputs, planned, &saved);
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
                dests: p.ordered().iter().map(|r| r.dest).collect(),
                written: p.written(),
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
        let is_temp = |p: usize| g.temps.iter().any(|&(_, t)| t == p);
        let mut temps: Vec<usize> = (0..g.nodes.len())
            .filter(|&i| live[i])
            .filter_map(|i| match (self.replacement(i), &g.nodes[i].op) {
                (Some(t), _) => Some(t),
                // A temporary read through a view (`Graph::early`).
                (None, Op::View(p, _)) if is_temp(*p) => Some(*p),
                _ => None,
            })
            .collect();
        temps.sort_unstable();
        temps.dedup();
        temps
    }

    /// The roots in the order of the launch's outputs: those it returns, then the parts it
    /// stores through views (as a kernel's returned outputs come before its `&mut` writes).
    fn ordered(&self) -> Vec<&Root> {
        let (returned, placed): (Vec<&Root>, Vec<&Root>) =
            self.roots.iter().partition(|r| r.place.is_none());
        returned.into_iter().chain(placed).collect()
    }

    /// The results stored in parts, each once, in the order of their first part: the order
    /// of the launch's `&mut` parameters.
    fn written(&self) -> Vec<Written> {
        let mut out: Vec<Written> = vec![];
        for (w, _) in self.roots.iter().filter_map(|r| r.place.as_ref()) {
            if !out.iter().any(|o| o.result == w.result) {
                out.push(*w);
            }
        }
        out
    }

    /// The temporaries the launch writes.
    fn writes(&self) -> impl Iterator<Item = usize> + '_ {
        self.roots.iter().filter_map(|r| match r.dest {
            Dest::Temp(t) => Some(t),
            Dest::Result(_) => None,
        })
    }

    /// The reductions to compute in an earlier launch: each that a reduction over another dim
    /// needs, and each over every element that a value over elements needs; where there are
    /// none, a reduction whose result meets values its operand's dims do not cover, else those
    /// of every dim but one where reductions of several remain.
    fn inner_reductions(&self, g: &Graph) -> Vec<NodeId> {
        let live = self.live(g);
        let n = g.nodes.len();
        let computed = |i: usize| live[i] && self.replacement(i).is_none();
        let is_reduce = |i: usize| computed(i) && matches!(g.nodes[i].op, Op::Reduce(..));
        let axis = |i: usize| match g.nodes[i].op {
            Op::Reduce(_, x, axis) => (x, axis),
            _ => unreachable!("`is_reduce` holds reductions"),
        };
        // The values computed from `r`.
        let after = |r: usize| {
            let mut after = vec![false; n];
            after[r] = true;
            for i in r + 1..n {
                after[i] = computed(i) && g.nodes[i].op.operands().iter().any(|&o| after[o]);
            }
            after
        };
        let reductions: Vec<NodeId> = (0..n).filter(|&i| is_reduce(i)).collect();
        let mut found = vec![];
        for &r in &reductions {
            let (_, axis) = axis(r);
            let after = after(r);
            let needed = (r + 1..n).any(|i| {
                after[i]
                    && match g.nodes[i].op {
                        Op::Reduce(_, _, other) => other != axis,
                        _ => axis.is_none() && !g.nodes[i].shape.is_empty(),
                    }
            });
            let root_needs = self.roots.iter().any(|root| {
                after[root.node]
                    && ((axis.is_none() && !root.shape.is_empty()) || root.place.is_some())
            });
            if needed || root_needs {
                found.push(r);
            }
        }
        // Full reductions iterate over one domain a launch: those over another than the widest
        // one's go first (DyT-like scalars with a term a row and a term an element).
        let full_over = |i: usize| match g.nodes[i].op {
            Op::Reduce(_, x, None) if is_reduce(i) => Some(g.nodes[x].shape.clone()),
            _ => None,
        };
        let widest = (0..n).filter_map(full_over).max_by_key(Vec::len);
        for r in 0..n {
            if !found.contains(&r) && full_over(r).is_some_and(|s| Some(&s) != widest.as_ref()) {
                found.push(r);
            }
        }
        if !found.is_empty() {
            return found;
        }
        // A launch iterates over its reductions' operands: a reduction over a dim whose result
        // meets values over a dim its operand lacks (a sum over `d1` of `[d1, d2]` scaling a
        // `[d0, d2]` tangent) goes first.
        for &r in &reductions {
            let (x, axis) = axis(r);
            let domain = &g.nodes[x].shape;
            let outside = |shape: &[DimId]| shape.iter().any(|d| !domain.contains(d));
            let after = after(r);
            let escapes = (r..n).any(|i| after[i] && outside(&g.nodes[i].shape))
                || (self.roots.iter()).any(|root| after[root.node] && outside(&root.shape));
            if axis.is_some() && escapes {
                found.push(r);
            }
        }
        if !found.is_empty() {
            return found;
        }
        // A launch reduces over one dim, or over every element. Where reductions of several
        // remain and none reads another (results that only meet elementwise: a scalar of
        // `sum(x, d0)` over a one-dim domain beside a full sum, a weight's gradient as sums
        // over `d0` and over `d1` of two temporaries), those of the most common one stay (the
        // full ones on a tie) and the others go first.
        let count = |a: Option<DimId>| reductions.iter().filter(|&&i| axis(i).1 == a).count();
        let kept = (reductions.iter())
            .map(|&i| axis(i).1)
            .max_by_key(|&a| (count(a), a.is_none()));
        reductions
            .into_iter()
            .filter(|&i| Some(axis(i).1) != kept)
            .collect()
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
    // A temporary read through a view is written by an earlier launch.
    let reads_own = |p: &Planned| {
        let writes: Vec<usize> = p.writes().collect();
        p.temps_read(g).iter().any(|t| writes.contains(t))
    };
    if !reads_own(&p)
        && build(k, g, inputs, &p, &p.temps_read(g), "__derived").is_some_and(|b| fair(&p, &b))
    {
        planned.push(p);
        return Ok(());
    }
    if p.roots.len() > 1 {
        for r in p.roots {
            plan(k, g, inputs, vec![r], using, planned)?;
        }
        return Ok(());
    }
    let stuck = || {
        format!(
            "the derivative of `{}` does not split into launches: this is a bug of fuse, please report it",
            crate::ir::plain_name(&k.name)
        )
    };
    loop {
        let inner = p.inner_reductions(g);
        if inner.is_empty()
            && transpose(k, g, inputs, &mut p, using, planned)?
            && build(k, g, inputs, &p, &p.temps_read(g), "__derived").is_some()
        {
            planned.push(p);
            return Ok(());
        }
        if inner.is_empty() {
            return Err(stuck());
        }
        // Each turn reads another reduction from a temporary, or fails: a turn that changed
        // nothing would find the same reductions again, forever.
        let mut moved = false;
        let mut temp_roots = vec![];
        for r in inner {
            let t = match g.temps.iter().find(|(n, _)| *n == r) {
                // Written already, for another root.
                Some(&(_, t)) => t,
                None => {
                    // In the type the reduction is computed in, which its readers take it in:
                    // a 16-bit float's is held in f32 and rounded only where it is stored or
                    // cast, so a temporary of its own type would hand later launches a value
                    // rounded where the launch that wrote it compared the unrounded one (a
                    // `min`'s ties, which random program p833's `vjp` lost).
                    let (shape, elem) = (g.shape(r), g.elem(r).compute());
                    let t = g.param(&format!("__t{}", g.temps.len()), elem, Some(shape.clone()));
                    g.temps.push((r, t));
                    temp_roots.push(Root {
                        node: r,
                        elem,
                        shape,
                        dest: Dest::Temp(t),
                        partial: None,
                        total: false,
                        place: None,
                    });
                    t
                }
            };
            if !p.using.contains(&(r, t)) {
                p.using.push((r, t));
                moved = true;
            }
            // A part that is the reduction itself (a part's gradient, stored through a view,
            // which only an elementwise launch does) reads it back through a view of its
            // temporary: a launch computes its own roots, so `using` alone would not, and
            // the planner would find the same reduction again, forever.
            let parts = p.roots.iter_mut();
            for root in parts.filter(|root| root.node == r && root.place.is_some()) {
                let (shape, elem) = (g.shape(r), g.elem(r).compute());
                let view = crate::ir::View::of_layout(&shape, &root.shape);
                root.node = g.push(Op::View(t, Box::new(view)), elem, root.shape.clone());
                moved = true;
            }
        }
        if !moved {
            return Err(stuck());
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

/// Where the one root of `p` is over its value's dims in another order (the gradient of a
/// permuted parameter, in the parameter's order, of a value computed in the order it is read)
/// and no launch computes it so: the value goes to a temporary in its own order, planned
/// first, and the root reads it through a permuted view, an elementwise launch. Whether it
/// did.
fn transpose(
    k: &Kernel,
    g: &mut Graph,
    inputs: usize,
    p: &mut Planned,
    using: &[(NodeId, usize)],
    planned: &mut Vec<Planned>,
) -> Result<bool, String> {
    let [root] = &p.roots[..] else {
        return Ok(false);
    };
    let (node, shape) = (root.node, g.shape(root.node));
    let permuted = shape != root.shape
        && shape.len() == root.shape.len()
        && shape.iter().all(|d| root.shape.contains(d));
    if !permuted || root.place.is_some() || root.partial.is_some() {
        return Ok(false);
    }
    let elem = g.elem(node);
    let t = g.param(&format!("__t{}", g.temps.len()), elem, Some(shape.clone()));
    g.temps.push((node, t));
    let temp = Root {
        node,
        elem,
        shape: shape.clone(),
        dest: Dest::Temp(t),
        partial: None,
        total: false,
        place: None,
    };
    plan(k, g, inputs, vec![temp], using, planned)?;
    let view = crate::ir::View::of_layout(&shape, &root.shape);
    let read = g.push(Op::View(t, Box::new(view)), elem, root.shape.clone());
    p.roots[0].node = read;
    Ok(true)
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
    let (roots, live) = (p.ordered(), p.live(g));
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
    for r in &roots {
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
            partial: r.partial,
            total: r.total,
            place: None,
            packed: false,
        });
    }
    let mut params: Vec<ParamInfo> = (0..inputs)
        .chain(temps.iter().copied())
        .map(|p| ParamInfo {
            name: g.params[p].name.clone(),
            elem: g.params[p].elem,
            shape: g.params[p].shape.clone(),
            written: false,
            packed: g.params[p].packed,
        })
        .collect();
    // The results stored in parts: a `&mut` parameter each, after the temporaries, and each
    // part's output stored through its view of it.
    for w in p.written() {
        let name = format!("__w{}", w.result);
        params.push(ParamInfo {
            name: Ident::new(&name, Span::call_site()),
            elem: g.params[w.param].elem,
            shape: g.params[w.param].shape.clone(),
            written: true,
            packed: false,
        });
        let param = params.len() - 1;
        for (r, o) in roots.iter().zip(&mut outputs) {
            if let Some((_, view)) = r.place.as_ref().filter(|(x, _)| x.result == w.result) {
                o.place = Some(Place {
                    param,
                    shape: params[param].shape.clone().unwrap_or_default(),
                    view: view.clone(),
                });
            }
        }
    }
    let body = crate::ir::Body {
        dims: &g.dims,
        nodes: &nodes,
        outputs: &outputs,
    };
    let mut cx = crate::error::Errors::default();
    let launch = match crate::fusion::launch(&body, &mut cx)? {
        // Partial sums over rows need rows: an elementwise launch takes its domain's last dim
        // as theirs.
        Launch::Map { domain } if outputs.iter().any(|o| o.partial.is_some()) => Launch::Rows {
            axis: *domain.last()?,
            domain,
        },
        launch => launch,
    };
    // A store through a view is an elementwise launch's (check's rule for `&mut` writes).
    if outputs.iter().any(|o| o.place.is_some()) && !matches!(launch, Launch::Map { .. }) {
        return None;
    }
    // Partial sums are a block's rows' sums: a launch over their value's rows, not one that
    // sums everything (random program p1381's `value_and_vjp` merged them into one).
    let over_rows = |o: &OutputInfo| match &launch {
        Launch::Rows { domain, axis } => *domain == o.shape && o.shape.last() == Some(axis),
        _ => false,
    };
    if outputs.iter().any(|o| o.partial.is_some() && !over_rows(o)) {
        return None;
    }
    let doc = "Hidden: a launch of a derived function.";
    let tuple = outputs.iter().filter(|o| o.place.is_none()).count() > 1;
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
    match op {
        Op::Load(p) => Op::Load(param(*p)),
        Op::Scalar(p) => Op::Scalar(param(*p)),
        Op::View(p, _) => match op.map_operands(|i| map[i]) {
            Op::View(_, view) => Op::View(param(*p), view),
            other => other,
        },
        op => op.map_operands(|i| map[i]),
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

/// Moves each launch into a later one it fuses with, where no launch between them reads what
/// it writes (what it reads is written before it, so before the later one too): GroupNorm's
/// bias's sums over `b`, which read only the inputs and so were planned first, join the
/// weight's, which wait on the rows' statistics: one launch and one pass over `dy` fewer. A
/// launch that reads the temporary the moved one writes then computes the value itself (a
/// full sum and the scalar made of it in one launch), and the temporary is dropped.
fn merge_later(
    k: &Kernel,
    g: &Graph,
    inputs: usize,
    mut planned: Vec<Planned>,
    saved: &[usize],
) -> Vec<Planned> {
    let mut i = 0;
    while i < planned.len() {
        let writes: Vec<usize> = planned[i].writes().collect();
        let mut moved = false;
        for j in i + 1..planned.len() {
            let between = &planned[i + 1..j];
            if between
                .iter()
                .any(|p| p.temps_read(g).iter().any(|t| writes.contains(t)))
            {
                break;
            }
            let mut both = planned[j].clone();
            both.roots.extend(planned[i].roots.iter().cloned());
            for &u in &planned[i].using {
                if !both.using.contains(&u) {
                    both.using.push(u);
                }
            }
            let temps = both.temps_read(g);
            if both.writes().any(|w| temps.contains(&w)) {
                continue;
            }
            // Each temporary it reads is written before it (or saved by the training pair's
            // forward): a `using` entry can outlive its launch, which `partial_sums` drops
            // where the one launch that read the temporary computes the value itself; a root
            // moved in beside it would read it unwritten (a random program's `vjp` did).
            let earlier = planned[..i].iter().chain(between).flat_map(Planned::writes);
            let written: Vec<usize> = earlier.chain(saved.iter().copied()).collect();
            if temps.iter().any(|t| !written.contains(t)) {
                continue;
            }
            if build(k, g, inputs, &both, &temps, "__derived").is_some_and(|b| fair(&both, &b)) {
                planned[j] = both;
                planned.remove(i);
                moved = true;
                break;
            }
        }
        if !moved {
            i += 1;
        }
    }
    // A temporary now computed in the launch that read it is read by none: that launch
    // computes the value without writing it.
    let read: Vec<usize> = planned.iter().flat_map(|p| p.temps_read(g)).collect();
    for p in &mut planned {
        let unread: Vec<(NodeId, usize)> = p
            .roots
            .iter()
            .filter_map(|r| match r.dest {
                Dest::Temp(t) if !read.contains(&t) => Some((r.node, t)),
                _ => None,
            })
            .collect();
        p.roots
            .retain(|r| !matches!(r.dest, Dest::Temp(t) if !read.contains(&t)));
        p.using.retain(|u| !unread.contains(u));
    }
    planned.retain(|p| !p.roots.is_empty());
    planned
}

/// Moves the sums over rows of a launch over columns (a weight's gradient, `sum(dy * x *
/// rstd, rows)`) into the launch over those rows before it, where that launch can compute
/// the summed value (`OutputInfo::partial`): each block sums the rows it takes, and after a
/// barrier of the grid the blocks sum those rows of partials, column by column. RMSNorm's
/// backward moved 10 bytes an element with a launch over columns (`x` and `dy` read twice),
/// against 6 with the partial sums; a second launch that summed the partials took 7 to 9% of
/// G1, G2 and G7's time on an H100 (NOTES item 139). An elementwise launch becomes one over
/// rows for them; a sum over everything in it (DyT's `dalpha`) is a total of that launch
/// (`OutputInfo::total`), added element by element.
fn partial_sums(
    k: &Kernel,
    g: &mut Graph,
    inputs: usize,
    mut planned: Vec<Planned>,
) -> Vec<Planned> {
    let mut next = 0;
    while next < planned.len() {
        let c = next;
        next += 1;
        let Some(cols) = build(
            k,
            g,
            inputs,
            &planned[c],
            &planned[c].temps_read(g),
            "__derived",
        ) else {
            continue;
        };
        let Launch::Rows { domain, axis } = &cols.launch else {
            continue;
        };
        let &[rows, len] = &domain[..] else {
            continue;
        };
        if *axis != rows {
            continue;
        }
        let (mut moved, mut values, mut kept) = (vec![], vec![], vec![]);
        for r in &planned[c].roots {
            if let Some(e) = summed(g, r, Some(rows), &[rows, len]).filter(|_| r.place.is_none()) {
                moved.push(r.clone());
                values.push((e, r.elem));
            } else {
                kept.push(r.clone());
            }
        }
        if moved.is_empty() {
            continue;
        }
        let Some((at, with)) =
            (0..c).find_map(|at| with_partials(k, g, inputs, &planned, at, &values, [rows, len]))
        else {
            continue;
        };
        planned[at] = with;
        // The partial sums store their sums' results.
        let mut dests = moved.iter().map(|r| r.dest);
        for root in &mut planned[at].roots {
            if root.partial.is_some() && root.dest == Dest::Temp(PARTIAL) {
                root.dest = dests.next().expect("a moved sum for each partial");
            }
        }
        match kept.is_empty() {
            true => {
                planned.remove(c);
                next -= 1;
            }
            false => planned[c].roots = kept,
        }
    }
    // The temporaries that only the moved sums read (a row's rstd) are no longer written.
    let read: Vec<usize> = planned.iter().flat_map(|p| p.temps_read(g)).collect();
    for p in &mut planned {
        p.roots
            .retain(|r| !matches!(r.dest, Dest::Temp(t) if !read.contains(&t)));
    }
    planned.retain(|p| !p.roots.is_empty());
    planned
}

/// The destination of a partial sum's root until it takes its sum's.
const PARTIAL: usize = usize::MAX;

/// The value `r` sums over `dim` (`None`: over everything), perhaps cast to its parameter's
/// type afterwards, where that value is over `shape`.
fn summed(g: &Graph, r: &Root, dim: Option<DimId>, shape: &[DimId]) -> Option<NodeId> {
    let sum = match g.nodes[r.node].op {
        Op::Cast(s) => s,
        _ => r.node,
    };
    match g.nodes[sum].op {
        Op::Reduce(Reduce::Sum, e, d) if d == dim && g.nodes[e].shape == shape => Some(e),
        _ => None,
    }
}

/// Launch `at` with the partial sums of `values` (over `[rows, len]`, each stored as its
/// type's column sums) added, if it then runs
/// over those rows and reads only what launches before it write; its sums over everything
/// become totals (`OutputInfo::total`), added element by element.
fn with_partials(
    k: &Kernel,
    g: &mut Graph,
    inputs: usize,
    planned: &[Planned],
    at: usize,
    values: &[(NodeId, Elem)],
    [rows, len]: [DimId; 2],
) -> Option<(usize, Planned)> {
    let mut with = planned[at].clone();
    for root in &mut with.roots {
        let Some(e) = summed(g, root, None, &[rows, len]) else {
            continue;
        };
        if root.place.is_some() {
            continue;
        }
        // Sums of 16-bit floats add in f32 and round once, at the end (random program p2981's
        // `value_and_vjp` stored a bf16 sum's partials as bf16). Each thread adds its elements
        // as it goes: no row's sum, which took DyT's backward a pass over the row of its own
        // and a reduction across the block (and cluster) a row.
        *root = Root {
            node: e,
            elem: g.elem(e).compute(),
            shape: vec![rows, len],
            dest: root.dest,
            partial: Some(root.elem),
            total: true,
            place: None,
        };
    }
    with.roots.extend(values.iter().map(|&(e, stored)| Root {
        node: e,
        elem: g.elem(e).compute(),
        shape: vec![rows, len],
        dest: Dest::Temp(PARTIAL),
        partial: Some(stored),
        total: false,
        place: None,
    }));
    let before: Vec<usize> = planned[..at]
        .iter()
        .flat_map(Planned::writes)
        .chain(g.saved.iter().copied())
        .collect();
    let reads = with.temps_read(g);
    let writes: Vec<usize> = with.writes().collect();
    let over_rows = Launch::Rows {
        domain: vec![rows, len],
        axis: len,
    };
    let fits = reads
        .iter()
        .all(|t| before.contains(t) && !writes.contains(t))
        && build(k, g, inputs, &with, &reads, "__derived").is_some_and(|b| b.launch == over_rows);
    fits.then_some((at, with))
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
            let before: Vec<usize> = merged[..at]
                .iter()
                .flat_map(Planned::writes)
                .chain(g.saved.iter().copied())
                .collect();
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

    pub(super) fn describe(d: &Derived) -> Vec<String> {
        d.steps
            .iter()
            .map(|s| {
                let partial: Vec<bool> = s
                    .kernel
                    .outputs
                    .iter()
                    .map(|o| o.partial.is_some())
                    .collect();
                format!(
                    "{:?} -> {:?} partial {:?} (temps {:?})",
                    s.kernel.launch, s.dests, partial, s.temps
                )
            })
            .collect()
    }

    /// RMSNorm in f32 with a bf16 weight, and its `vjp` (its first step is the launch over
    /// rows with `dg`'s partial sums).
    fn rmsnorm_vjp() -> (Kernel, Derived) {
        let k = kernel(quote! {
            #[vjp(x, g)]
            fn rmsnorm(x: [f32; rows, cols], g: [bf16; cols]) -> [f32; rows, cols] {
                x * rsqrt(mean(x * x, cols) + 1e-6) * (g as f32)
            }
        });
        let d = vjp(&k, false, "d").unwrap();
        (k, d)
    }

    /// RMSNorm's launch over rows with `dg`'s partial sums: its rows in registers (a block's
    /// segments sum theirs once), long rows in clusters (each block's part of the sums in
    /// shared memory beside its part of the row: `x` and `dy`, then the sums, in the bytes an
    /// element takes), each entry's partial rows 4 bytes a column (`sum_bytes`); never tiles
    /// of short rows.
    #[test]
    fn partial_sums_keep_the_cached_and_long_rows() {
        use crate::plan::program::{program, Grid, Path};
        let (_, d) = rmsnorm_vjp();
        let rows = &d.steps[0].kernel;
        assert!(rows.has_partials());
        let entries = program(rows).entries;
        let paths: Vec<Path> = entries.iter().map(|e| e.path).collect();
        assert!(paths.contains(&Path::RowsCached) && !paths.contains(&Path::ShortRows));
        let long = entries
            .iter()
            .find(|e| e.path == Path::LongRows)
            .map(|e| e.grid);
        assert_eq!(
            long,
            Some(Grid::LongRows {
                cache_bytes: 4 + 4 + 4,
                sums: 4
            })
        );
        for e in &entries {
            let sums = match e.grid {
                Grid::Parts { sums, .. } | Grid::LongRows { sums, .. } => sums,
                _ => 0,
            };
            assert_eq!(sums, 4, "{e:?}: a row of f32 partial sums");
        }
        // Segments of a constant width where the length fixes it, 16 threads a row of 129 to
        // 256 ... 128 of 1025 to 2048; the run-time width for the rest.
        let cached: Vec<_> = entries
            .iter()
            .filter(|e| e.path == Path::RowsCached)
            .collect();
        let ranges: Vec<(u64, u64)> = cached
            .iter()
            .map(|e| (e.when.min_len, e.when.max_len))
            .collect();
        assert_eq!(
            ranges,
            [(129, 256), (257, 512), (513, 1024), (1025, 2048), (1, 4096)]
        );
        let text = crate::cuda::text(rows);
        let fixed = &text[text.find("_cached_rows_256(").expect("the entry of 256")..];
        assert!(fixed.contains("const int width = 16;"));
        let general = &text[text.find("_cached_rows(").expect("the general entry")..];
        assert!(general.contains("while (width * 16 < len) width <<= 1;"));
        // 16-bit rows: the long rows copy and step through eight elements at once, the sums in
        // shared memory not counting as a tensor along the row.
        let bf16 = kernel(quote! {
            #[vjp(x, g)]
            fn rmsnorm(x: [bf16; rows, cols], g: [bf16; cols]) -> [bf16; rows, cols] {
                (x as f32 * rsqrt(mean(x as f32 * x as f32, cols) + 1e-6) * (g as f32)) as bf16
            }
        });
        let d = vjp(&bf16, false, "d").unwrap();
        let text = crate::cuda::text(&d.steps[0].kernel);
        let long = &text[text.find("_long_rows(").expect("a long-row entry")..];
        assert!(long.contains("fz_copy_async<8 * sizeof(unsigned short)>"));
    }

    /// LayerNorm's long rows (a grid that loops over rows, the partial sums keeping it
    /// resident; three passes a row) copy the first row before the row loop, and each later row
    /// in the steps of the last pass: once a step has read its slots, the cluster's next row
    /// into them (vectors of four and single elements of f32), none between a row's start and
    /// its wait. RMSNorm's (two passes: the prefetch of the next row, asked at the row's start,
    /// would have one pass to arrive) and a forward launch's long rows (a cluster a row) copy
    /// theirs at the row's start.
    #[test]
    fn long_rows_with_partial_sums_copy_the_next_row_in_their_last_pass() {
        let k = kernel(quote! {
            #[vjp(x, g, b)]
            fn layernorm(x: [f32; rows, cols], g: [bf16; cols], b: [f32; cols]) -> [f32; rows, cols] {
                let d = x - mean(x, cols);
                d * rsqrt(mean(d * d, cols) + 1e-5) * (g as f32) + b
            }
        });
        let d = vjp(&k, false, "d").unwrap();
        let text = crate::cuda::text(&d.steps[0].kernel);
        let long = &text[text.find("_long_rows(").expect("a long-row entry")..];
        let at = |s: &str| long.find(s).unwrap_or_else(|| panic!("{s} in {long}"));
        let (first, row_loop, wait) = (
            at("p_x + fz_next + c * 4);"),
            at("for (long long g = "),
            at("fz_copy_wait();"),
        );
        assert!(first < row_loop && row_loop < wait, "{long}");
        assert!(!long[row_loop..wait].contains("fz_copy_async"), "{long}");
        // In the last pass: after the block reductions of the two before.
        let copies = at("if (fz_more)");
        assert!(
            long[wait..copies].matches("__syncthreads()").count() >= 2,
            "{long}"
        );
        assert_eq!(long.matches("if (fz_more)").count(), 2, "{long}");
        assert!(long[wait..].contains("const bool fz_more = g + clusters < groups;"));
        assert!(
            long.contains("fz_copy_async<sizeof(float)>(sc_x + (r - begin), p_x + fz_next + r);"),
            "{long}"
        );
        let forward = crate::cuda::text(&k);
        assert!(forward.contains("_long_rows("), "{forward}");
        assert!(!forward.contains("fz_more"), "{forward}");
        let (_, d) = rmsnorm_vjp();
        let text = crate::cuda::text(&d.steps[0].kernel);
        let long = &text[text.find("_long_rows(").expect("a long-row entry")..];
        assert!(!long.contains("fz_more"), "{long}");
        let (row_loop, copy, wait) = (
            long.find("for (long long g = ").expect("the row loop"),
            long.find("fz_copy_async").expect("a copy"),
            long.find("fz_copy_wait();").expect("a wait"),
        );
        assert!(row_loop < copy && copy < wait, "{long}");
    }

    /// A bias's gradient beside an elementwise one (G8's), whose rows need no value of the
    /// whole row: rows past a block's registers in chunks of them, a block a chunk of every
    /// row it takes, before the long rows in shared memory; RMSNorm's, which reduce their
    /// rows, have no such entry.
    #[test]
    fn rows_without_row_values_take_chunks() {
        use crate::plan::program::{program, Grid, Path};
        let k = kernel(quote! {
            #[vjp(x, bias)]
            fn g(x: [bf16; t, h], bias: [bf16; h], seed: u64) -> [bf16; t, h] {
                dropout(gelu(x + bias), 0.1, seed)
            }
        });
        let d = vjp(&k, false, "d").unwrap();
        let rows = &d.steps[0].kernel;
        assert!(rows.has_partials());
        let entries = program(rows).entries;
        let at = |path| entries.iter().position(|e| e.path == path);
        let chunks: Vec<_> = entries
            .iter()
            .filter(|e| e.path == Path::RowChunks)
            .collect();
        assert!(at(Path::RowChunks) < at(Path::LongRows));
        let register_row = u64::from(crate::abi::CACHE * crate::abi::BLOCK);
        let whens: Vec<_> = chunks
            .iter()
            .map(|e| {
                (
                    e.label(),
                    e.when.min_len,
                    e.when.max_len,
                    e.when.multiple_of,
                )
            })
            .collect();
        let longest = 64 * register_row;
        assert_eq!(
            whens,
            [
                (
                    "chunked_rows_exact".into(),
                    2 * register_row,
                    longest,
                    register_row
                ),
                ("chunked_rows".into(), register_row + 1, longest, 4),
            ]
        );
        for e in &chunks {
            assert_eq!(e.when.min_arch, 90);
            assert!(matches!(e.grid, Grid::Chunks { sums: 4, .. }));
        }
        let text = crate::cuda::text(rows);
        let chunked = &text[text.find("_chunked_rows(").expect("the chunked entry")..];
        assert!(chunked.contains("const long long b0 = c0 * d_h + fz_co;"));
        assert!(chunked.contains("out1 + fz_cp * fz_len + fz_co"));
        assert!(chunked.contains("if ((q < 2 || c * 4 < (int)len))"));
        let exact = &text[text.find("_chunked_rows_exact(").expect("the exact entry")..];
        let exact = &exact[..exact.find("_chunked_rows(").unwrap_or(exact.len())];
        assert!(exact.contains("const long long len = 4096;"));
        assert!(!exact.contains("q < 2 ||"));
        let rms = kernel(quote! {
            #[vjp(x, g)]
            fn rmsnorm(x: [bf16; rows, cols], g: [bf16; cols]) -> [bf16; rows, cols] {
                (x as f32 * rsqrt(mean(x as f32 * x as f32, cols) + 1e-6) * (g as f32)) as bf16
            }
        });
        let d = vjp(&rms, false, "d").unwrap();
        let paths: Vec<Path> = program(&d.steps[0].kernel)
            .entries
            .iter()
            .map(|e| e.path)
            .collect();
        assert!(paths.contains(&Path::LongRows) && !paths.contains(&Path::RowChunks));
    }

    /// LayerNorm's gradients in one launch over rows: `dx`, and `dg` and `db`, which each
    /// block sums over the rows it takes and the grid then over its blocks (sums over rows,
    /// stored as `[cols]` of the parameters' type). The row's mean and rstd, which a launch over
    /// the rows' columns read before, are no longer written. `value_and_vjp` adds the outputs
    /// to the first.
    #[test]
    fn layernorm_backward_is_one_launch() {
        let k = kernel(quote! {
            #[vjp(x, g, b)]
            fn layernorm(x: [f64; rows, cols], g: [bf16; cols], b: [f32; cols]) -> ([f64; rows, cols], [f64; rows]) {
                let d = x - mean(x, cols);
                let rstd = rsqrt(mean(d * d, cols) + 1e-5);
                (d * rstd * g as f64 + b as f64, rstd)
            }
        });
        let rows = "Rows { domain: [0, 1], axis: 1 }";
        let d = vjp(&k, false, "d").unwrap();
        assert_eq!(
            describe(&d),
            [format!("{rows} -> [Result(0), Result(1), Result(2)] partial [false, true, true] (temps [])")]
        );
        let launch = &d.steps[0].kernel;
        assert_eq!(launch.dims.len(), 2, "no dim of partials");
        let sums: Vec<_> = launch.outputs[1..]
            .iter()
            .map(|o| (o.elem, o.stored_elem(), o.stored_shape()))
            .collect();
        assert_eq!(
            sums,
            [
                (Elem::F64, Elem::BF16, vec![1]),
                (Elem::F64, Elem::F32, vec![1])
            ],
            "summed in f64, stored as the parameters' types"
        );
        assert_eq!(crate::plan::program::sum_bytes(launch), 2 * 8);
        assert_eq!(
            describe(&vjp(&k, true, "v").unwrap()),
            [format!("{rows} -> [Result(0), Result(1), Result(2), Result(3), Result(4)] partial [false, false, false, true, true] (temps [])")]
        );
    }

    /// DyT's gradients in one launch too: its scalar `alpha`'s, a sum over everything, is a
    /// total (`OutputInfo::total`): each thread adds its elements as it goes, the blocks their
    /// threads' and then the grid the blocks', stored as one value. No row's sum: the launch is
    /// one pass over each row, without a reduction along it.
    #[test]
    fn a_scalar_gradient_is_a_total_of_the_launch_over_rows() {
        let k = kernel(quote! {
            #[vjp(x, alpha, g, b)]
            fn dyt(x: [bf16; t, h], alpha: f32, g: [bf16; h], b: [bf16; h]) -> [bf16; t, h] {
                ((alpha * (x as f32)).tanh() as bf16) * g + b
            }
        });
        let d = vjp(&k, false, "d").unwrap();
        assert_eq!(
            describe(&d),
            ["Rows { domain: [0, 1], axis: 1 } -> [Result(0), Result(1), Result(2), Result(3)] partial [false, true, true, true] (temps [])"]
        );
        let launch = &d.steps[0].kernel;
        let outputs: Vec<_> = launch
            .outputs
            .iter()
            .map(|o| (o.total, o.stored_elem(), o.stored_shape()))
            .collect();
        assert_eq!(
            outputs,
            [
                (false, Elem::BF16, vec![0, 1]),
                (true, Elem::F32, vec![]),
                (false, Elem::BF16, vec![1]),
                (false, Elem::BF16, vec![1]),
            ]
        );
        let plan = crate::plan::plan(launch);
        assert_eq!((plan.passes.len(), plan.reducing_passes()), (1, 0));
        assert_eq!(plan.passes[0].writes, [0, 1, 2, 3]);
        assert!(plan.group_writes.is_empty());
        let text = crate::cuda::text(launch);
        assert!(
            text.contains("fz_tot1 += v17;") && !text.contains("__shfl_xor_sync(0xffffffffu, acc"),
            "each element added by its thread, no row's sum:\n{text}"
        );
        assert!(text.contains("if (threadIdx.x == 0) fz_sum1[0] = fz_b;"));
        assert!(text.contains("fz_sum2[c] = fz_f32_to_bf16(fz_t2);"));
    }
}
