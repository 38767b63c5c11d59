//! Derivatives (`#[vjp(..)]` and `#[jvp(..)]`): a transformation of the checked kernel into new
//! kernels that go through the same planning and the same two backends.
//!
//! - [`Graph::reverse`] builds, beside the kernel's values, the adjoint of each value from the
//!   cotangents of the float outputs, back to the listed parameters (reverse mode); a value used
//!   over more dims than it has (a broadcast) gets the sum of its uses over those dims.
//! - [`Graph::forward`] builds the tangent of each value from the tangents of the listed
//!   parameters (forward mode).
//! - The partial derivatives of each operator and function (`partials.rs`) serve both modes.
//! - `schedule.rs` splits the values wanted into launches: as few as fusion allows, each a
//!   [`Kernel`] of its own. A reduction that another one over a different dim (or a value over
//!   elements, for a reduction over every element) needs is computed in an earlier launch into
//!   a temporary, in the reduction's own type, and read from there; `items.rs` writes the
//!   functions that run the launches.
//!
//! Adjoints and tangents are computed in f32 for every float type narrower than 64 bits (f64
//! where the kernel has f64 values), and each gradient is cast to its parameter's type at the
//! end.

use crate::func::Func;
use crate::ir::{
    Dim, DimId, Kernel, Launch, Node, NodeId, Op, OutputInfo, ParamInfo, Reduce, View,
};
use crate::parse::{BinOp, UnOp};
use crate::ty::Elem;
use proc_macro2::{Ident, Span};

pub mod items;
mod partials;
mod schedule;

pub use schedule::{jvp, train, vjp, Derived, Dest, Train};

/// A kernel's values with the derived ones beside them, and the parameters they read.
pub struct Graph {
    pub dims: Vec<Dim>,
    /// The kernel's parameters, then the cotangents or tangents, then temporaries.
    pub params: Vec<ParamInfo>,
    pub nodes: Vec<Node>,
    /// Every dim in the order shapes list them (the kernel's domain first).
    order: Vec<DimId>,
    /// The type adjoints and tangents are computed in.
    pub ct: Elem,
    /// Reductions computed in an earlier launch, and the temporary parameter holding each.
    temps: Vec<(NodeId, usize)>,
    /// The temporaries written before the derived function runs: the values the training
    /// pair's forward saves.
    saved: Vec<usize>,
    /// Values the derived function writes into temporaries first, for later launches to read
    /// through views (`Graph::merged_adjoint`): each value and its temporary.
    early: Vec<(NodeId, usize)>,
}

/// A listed parameter's gradient, in its type.
pub enum Grad {
    /// A value over the parameter's shape.
    Whole(NodeId),
    /// The gradient of a parameter read only in parts (slices of its composite dims,
    /// `x[.., ..d]`): each part's, over the part's shape, to be stored where the part's view
    /// reads; `covered` where the parts read cover the parameter (the other elements'
    /// gradient is zero).
    Parts {
        parts: Vec<(View, NodeId)>,
        covered: bool,
    },
}

/// An adjoint or tangent's partial derivative: one, minus one, or a value.
#[derive(Clone, Copy)]
enum D {
    One,
    MinusOne,
    Of(NodeId),
}

impl Graph {
    fn new(k: &Kernel) -> Graph {
        let domain = match &k.launch {
            Launch::Map { domain } | Launch::Rows { domain, .. } | Launch::Full { domain } => {
                domain.clone()
            }
        };
        let mut order = domain.clone();
        order.extend((0..k.dims.len()).filter(|d| !domain.contains(d)));
        let wide = k.nodes.iter().any(|n| n.ty.elem() == Some(Elem::F64))
            || k.params.iter().any(|p| p.elem == Elem::F64);
        Graph {
            dims: k.dims.clone(),
            params: k
                .params
                .iter()
                .map(|p| ParamInfo {
                    name: p.name.clone(),
                    elem: p.elem,
                    shape: p.shape.clone(),
                    written: false,
                    packed: false,
                })
                .collect(),
            nodes: k.nodes.iter().map(copy_node).collect(),
            order,
            ct: if wide { Elem::F64 } else { Elem::F32 },
            temps: vec![],
            saved: vec![],
            early: vec![],
        }
    }

    fn push(&mut self, op: Op, elem: Elem, shape: Vec<DimId>) -> NodeId {
        self.nodes.push(Node::derived(op, elem, shape));
        self.nodes.len() - 1
    }

    fn shape(&self, id: NodeId) -> Vec<DimId> {
        self.nodes[id].shape.clone()
    }

    fn elem(&self, id: NodeId) -> Elem {
        self.nodes[id].elem()
    }

    /// The dims of both shapes, in order.
    fn union(&self, a: &[DimId], b: &[DimId]) -> Vec<DimId> {
        self.order
            .iter()
            .copied()
            .filter(|d| a.contains(d) || b.contains(d))
            .collect()
    }

    fn lit(&mut self, v: f64) -> NodeId {
        let ct = self.ct;
        self.push(Op::Float(format!("{v:?}")), ct, vec![])
    }

    /// A value in the compute type: itself, or cast.
    fn p(&mut self, id: NodeId) -> NodeId {
        let ct = self.ct;
        match self.elem(id) {
            e if e == ct => id,
            _ => {
                let shape = self.shape(id);
                self.push(Op::Cast(id), ct, shape)
            }
        }
    }

    fn cast(&mut self, id: NodeId, elem: Elem) -> NodeId {
        if self.elem(id) == elem {
            return id;
        }
        let shape = self.shape(id);
        self.push(Op::Cast(id), elem, shape)
    }

    fn bin(&mut self, op: BinOp, a: NodeId, b: NodeId) -> NodeId {
        let shape = self.union(&self.shape(a), &self.shape(b));
        let elem = if op.is_comparison() {
            Elem::Bool
        } else {
            self.elem(a)
        };
        self.push(Op::Binary(op, a, b), elem, shape)
    }

    fn add(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.bin(BinOp::Add, a, b)
    }

    fn sub(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.bin(BinOp::Sub, a, b)
    }

    fn mul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.bin(BinOp::Mul, a, b)
    }

    fn div(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.bin(BinOp::Div, a, b)
    }

    fn neg(&mut self, a: NodeId) -> NodeId {
        let (e, shape) = (self.elem(a), self.shape(a));
        self.push(Op::Unary(UnOp::Neg, a), e, shape)
    }

    fn scale(&mut self, a: NodeId, v: f64) -> NodeId {
        let c = self.lit(v);
        self.mul(a, c)
    }

    fn call(&mut self, f: Func, args: &[NodeId]) -> NodeId {
        let shape = args
            .iter()
            .fold(vec![], |s, &a| self.union(&s, &self.shape(a)));
        let e = self.elem(args[0]);
        self.push(Op::Call(f, args.to_vec()), e, shape)
    }

    fn select(&mut self, c: NodeId, a: NodeId, b: NodeId) -> NodeId {
        let shape = self.union(&self.shape(c), &self.union(&self.shape(a), &self.shape(b)));
        let e = self.elem(a);
        self.push(Op::Select(c, a, b), e, shape)
    }

    /// 1 where `c`, else 0.
    fn indicator(&mut self, c: NodeId) -> NodeId {
        let (one, zero) = (self.lit(1.0), self.lit(0.0));
        self.select(c, one, zero)
    }

    fn reduce(&mut self, r: Reduce, a: NodeId, dim: Option<DimId>) -> NodeId {
        let shape: Vec<DimId> = match dim {
            Some(d) => self.shape(a).into_iter().filter(|&x| x != d).collect(),
            None => vec![],
        };
        let e = self.elem(a);
        self.push(Op::Reduce(r, a, dim), e, shape)
    }

    fn len(&mut self, d: DimId) -> NodeId {
        let ct = self.ct;
        self.push(Op::Len(d), ct, vec![])
    }

    /// `a` times the sizes of `dims`.
    fn times_lens(&mut self, mut a: NodeId, dims: &[DimId]) -> NodeId {
        for &d in dims {
            let n = self.len(d);
            a = self.mul(a, n);
        }
        a
    }

    /// `a` summed over the dims of its shape not in `shape`: over every dim at once where
    /// `shape` is a scalar's, else one dim at a time.
    fn sum_to(&mut self, a: NodeId, shape: &[DimId]) -> NodeId {
        let extra: Vec<DimId> = self
            .shape(a)
            .into_iter()
            .filter(|d| !shape.contains(d))
            .collect();
        if extra.is_empty() {
            return a;
        }
        if shape.is_empty() {
            return self.sum_factored(a, &extra, None);
        }
        extra
            .into_iter()
            .fold(a, |a, d| self.sum_factored(a, &[d], Some(d)))
    }

    /// The sum of `a` over `dims` (`dim`, or every dim where `None`), with the factors of `a`
    /// that do not vary along them taken out of the sum where that saves a division an
    /// element: a derivative's `sum(dy * (e / s) / s)` (softmax's, `s` a row's sum) is
    /// `sum(dy * e) / s / s`, a multiply-add an element in place of two divisions. Elsewhere
    /// the sum is left as written, so a launch that computes the summand for another use
    /// (a bias gradient's partial sums beside `dx`) still shares it.
    fn sum_factored(&mut self, a: NodeId, dims: &[DimId], dim: Option<DimId>) -> NodeId {
        if let Some(s) = self.sum_split(a, dims, dim) {
            return s;
        }
        let (mut neg, mut factors) = (false, vec![]);
        self.factors(a, dims, (false, false), &mut neg, &mut factors);
        if !factors
            .iter()
            .any(|&(f, den, divides)| den && divides && !self.varies(f, dims))
        {
            return self.reduce(Reduce::Sum, a, dim);
        }
        let (inner, outer): (Vec<_>, Vec<_>) = factors
            .into_iter()
            .partition(|&(f, _, _)| self.varies(f, dims));
        let mut s = self.product(&inner);
        s = self.reduce(Reduce::Sum, s, dim);
        for (f, den, _) in outer {
            let f = self.p(f);
            s = if den { self.div(s, f) } else { self.mul(s, f) };
        }
        if neg {
            s = self.neg(s);
        }
        s
    }

    /// The sum of `a` over `dims` taken term by term, each term's factors that do not vary
    /// along `dims` outside its sum, where that leaves no term's sum waiting on as many
    /// reductions as `a`'s: a launch over rows then takes it in an earlier pass. LayerNorm's
    /// mean has the adjoint `-sum(dy * g * rstd + 2 * dvar * (x - mean))`, which needs `rstd`
    /// and `dvar`, themselves sums over the row of values that need the mean: three passes.
    /// Taken as `-(rstd * sum(dy * g) + 2 * dvar * sum(x - mean))`, its sums join the mean's
    /// and the variance's passes: two. Terms with the same summand share one sum.
    fn sum_split(&mut self, a: NodeId, dims: &[DimId], dim: Option<DimId>) -> Option<NodeId> {
        let mut terms = vec![];
        self.terms(a, false, &mut terms);
        if terms.len() < 2 {
            return None;
        }
        let depth = crate::plan::depths(&self.nodes);
        let mut split = vec![];
        for (t, mut neg) in terms {
            let mut factors = vec![];
            self.factors(t, dims, (false, false), &mut neg, &mut factors);
            let (inner, outer): (Vec<_>, Vec<_>) = factors
                .into_iter()
                .partition(|&(f, _, _)| self.varies(f, dims));
            split.push((neg, inner, outer));
        }
        let deepest = split
            .iter()
            .flat_map(|(_, inner, _)| inner.iter().map(|&(f, _, _)| depth[f]))
            .max()
            .unwrap_or(0);
        if deepest >= depth[a] {
            return None;
        }
        let mut sums: Vec<(Vec<(NodeId, bool)>, NodeId)> = vec![];
        let mut total: Option<NodeId> = None;
        for (neg, inner, outer) in split {
            let key: Vec<(NodeId, bool)> = inner.iter().map(|&(f, den, _)| (f, den)).collect();
            let mut t = match sums.iter().find(|(k, _)| *k == key) {
                Some(&(_, s)) => s,
                None => {
                    let p = self.product(&inner);
                    let s = self.sum_over(p, dims, dim);
                    sums.push((key, s));
                    s
                }
            };
            for (f, den, _) in outer {
                let f = self.p(f);
                t = if den { self.div(t, f) } else { self.mul(t, f) };
            }
            total = Some(match (total, neg) {
                (None, false) => t,
                (None, true) => self.neg(t),
                (Some(s), false) => self.add(s, t),
                (Some(s), true) => self.sub(s, t),
            });
        }
        total
    }

    /// `a` as a signed sum: its terms, each with whether it is subtracted, looking through the
    /// sums, differences, negations and copies (casts to the same type) in the compute type.
    fn terms(&self, a: NodeId, neg: bool, out: &mut Vec<(NodeId, bool)>) {
        if self.elem(a) == self.ct {
            match self.nodes[a].op {
                Op::Binary(BinOp::Add, x, y) => {
                    self.terms(x, neg, out);
                    return self.terms(y, neg, out);
                }
                Op::Binary(BinOp::Sub, x, y) => {
                    self.terms(x, neg, out);
                    return self.terms(y, !neg, out);
                }
                Op::Unary(UnOp::Neg, x) => return self.terms(x, !neg, out),
                Op::Cast(x) if self.elem(x) == self.ct => return self.terms(x, neg, out),
                _ => {}
            }
        }
        out.push((a, neg));
    }

    /// Whether value `f` varies along any of `dims`.
    fn varies(&self, f: NodeId, dims: &[DimId]) -> bool {
        self.shape(f).iter().any(|d| dims.contains(d))
    }

    /// The sum of `p` over `dims` (`dim`, or every dim where `None`), where `p` may lack some
    /// of them: the same along those, so its sum is `p` times their sizes.
    fn sum_over(&mut self, p: NodeId, dims: &[DimId], dim: Option<DimId>) -> NodeId {
        let have = self.shape(p);
        let missing: Vec<DimId> = dims.iter().copied().filter(|d| !have.contains(d)).collect();
        let s = if missing.len() == dims.len() {
            p
        } else {
            self.reduce(Reduce::Sum, p, dim)
        };
        self.times_lens(s, &missing)
    }

    /// `a` as a signed product: its factors, each with whether it divides (`den`) and whether
    /// it is reached through a quotient that varies along `dims` (`divides`: each element of
    /// the sum would divide by it), looking through the products, quotients, negations and
    /// widening casts computed in the compute type (`f16` and `bf16` values are held in `f32`)
    /// that vary along `dims`; one that does not is a factor whole.
    fn factors(
        &self,
        a: NodeId,
        dims: &[DimId],
        (den, divides): (bool, bool),
        neg: &mut bool,
        out: &mut Vec<(NodeId, bool, bool)>,
    ) {
        let held =
            |e: Elem| e == self.ct || (self.ct == Elem::F32 && matches!(e, Elem::F16 | Elem::BF16));
        let varies = self.varies(a, dims);
        if varies && held(self.elem(a)) {
            match self.nodes[a].op {
                Op::Binary(BinOp::Mul, x, y) => {
                    self.factors(x, dims, (den, divides), neg, out);
                    return self.factors(y, dims, (den, divides), neg, out);
                }
                Op::Binary(BinOp::Div, x, y) => {
                    self.factors(x, dims, (den, divides), neg, out);
                    return self.factors(y, dims, (!den, divides || varies), neg, out);
                }
                Op::Unary(UnOp::Neg, x) => {
                    *neg = !*neg;
                    return self.factors(x, dims, (den, divides), neg, out);
                }
                // Only a widening cast, which changes no value; `as bf16` rounds.
                Op::Cast(x) if self.elem(a) == self.ct && held(self.elem(x)) => {
                    return self.factors(x, dims, (den, divides), neg, out)
                }
                _ => {}
            }
        }
        out.push((a, den, divides));
    }

    /// The product of `factors` in the compute type: the numerators', divided by each
    /// denominator (1 where there are none).
    fn product(&mut self, factors: &[(NodeId, bool, bool)]) -> NodeId {
        let mut p = None;
        for &(f, _, _) in factors.iter().filter(|&&(_, den, _)| !den) {
            let f = self.p(f);
            p = Some(match p {
                Some(p) => self.mul(p, f),
                None => f,
            });
        }
        let mut p = match p {
            Some(p) => p,
            None => self.lit(1.0),
        };
        for &(f, _, _) in factors.iter().filter(|&&(_, den, _)| den) {
            let f = self.p(f);
            p = self.div(p, f);
        }
        p
    }

    /// `a` over exactly `shape` (which holds `a`'s dims): a zero of each missing dim added.
    fn broadcast_to(&mut self, a: NodeId, shape: &[DimId]) -> NodeId {
        let have = self.shape(a);
        let mut a = a;
        for &d in shape.iter().filter(|d| !have.contains(d)) {
            let i = self.push(Op::Index(d), Elem::U32, vec![d]);
            let zero = self.push(Op::Int(0), Elem::U32, vec![]);
            let z = self.bin(BinOp::Mul, i, zero);
            let ct = self.ct;
            let z = self.cast(z, ct);
            a = self.add(a, z);
        }
        a
    }

    /// Whether a value is a float (has derivatives).
    fn float(&self, id: NodeId) -> bool {
        self.elem(id).is_float()
    }

    /// `a` times a partial.
    fn times(&mut self, a: NodeId, d: D) -> NodeId {
        match d {
            D::One => a,
            D::MinusOne => self.neg(a),
            D::Of(p) => self.mul(a, p),
        }
    }

    /// A partial as a value in the compute type.
    fn partial_value(&mut self, d: D) -> NodeId {
        match d {
            D::One => self.lit(1.0),
            D::MinusOne => self.lit(-1.0),
            D::Of(p) => p,
        }
    }

    /// Whether two partials are the same value: the same node, or casts of the same value
    /// (`p` casts a 16-bit operand anew at each use).
    fn same_partial(&self, d: D, e: D) -> bool {
        match (d, e) {
            (D::One, D::One) | (D::MinusOne, D::MinusOne) => true,
            (D::Of(p), D::Of(q)) => {
                p == q
                    || matches!(
                        (&self.nodes[p].op, &self.nodes[q].op),
                        (Op::Cast(x), Op::Cast(y)) if x == y && self.elem(p) == self.elem(q)
                    )
            }
            _ => false,
        }
    }

    /// Adds `contribution`, an adjoint at a value of shape `at`, to the adjoint of `target`:
    /// summed over the dims `target` lacks, and times the size of each dim of `at` that
    /// neither has (the contribution is the same along it).
    fn give(
        &mut self,
        adj: &mut [Option<NodeId>],
        target: NodeId,
        contribution: NodeId,
        at: &[DimId],
    ) {
        let to = self.shape(target);
        let have = self.shape(contribution);
        let missing: Vec<DimId> = at
            .iter()
            .copied()
            .filter(|d| !have.contains(d) && !to.contains(d))
            .collect();
        let c = self.sum_to(contribution, &to);
        let c = self.times_lens(c, &missing);
        adj[target] = Some(match adj[target] {
            Some(a) => self.add(a, c),
            None => c,
        });
    }

    /// Reverse mode: the gradient of each of `wrt` (parameters) from the cotangents of the
    /// float outputs, which are the parameters `cotangents` (one per output, `None` for an
    /// integer or bool one). Each gradient is in its parameter's type and shape.
    pub fn reverse(
        &mut self,
        outputs: &[OutputInfo],
        cotangents: &[Option<usize>],
        wrt: &[usize],
    ) -> Vec<Grad> {
        let n = self.nodes.len();
        let mut adj: Vec<Option<NodeId>> = vec![None; n];
        for (o, c) in outputs.iter().zip(cotangents) {
            let Some(c) = *c else { continue };
            let load = self.push(Op::Load(c), self.params[c].elem, o.shape.clone());
            let seed = self.p(load);
            let at = o.shape.clone();
            self.give(&mut adj, o.node, seed, &at);
        }
        let mut grads: Vec<Option<NodeId>> = vec![None; self.params.len()];
        // The adjoints of the parts read (views without gathers that `picks` does not take).
        let mut parts: Vec<Vec<(View, NodeId, Vec<DimId>)>> = vec![vec![]; self.params.len()];
        for i in (0..n).rev() {
            let Some(a) = adj[i] else { continue };
            let at = self.shape(i);
            match self.nodes[i].op.clone() {
                Op::Load(p) | Op::Scalar(p) => {
                    self.accumulate(&mut grads[p], a);
                }
                Op::View(p, view) => {
                    let storage = self.params[p].shape.clone().unwrap_or_default();
                    // Check refuses a listed parameter's other views: gathers that may read
                    // an element twice.
                    let merged = view.merged_read(&storage, &at, &self.dims);
                    if let Some((m, parts)) = merged {
                        // A temporary and launches of its own: only for a listed parameter.
                        if !wrt.contains(&p) {
                            continue;
                        }
                        let c = self.merged_adjoint(a, &at, m, &parts, &storage);
                        self.accumulate(&mut grads[p], c);
                    } else if let Some(picks) = view.picks(&storage, &at) {
                        let c = self.picked(a, &picks);
                        self.accumulate(&mut grads[p], c);
                    } else if view.gathers.is_empty() {
                        match parts[p].iter_mut().find(|(v, _, _)| *v == *view) {
                            Some((_, sum, _)) => *sum = self.add(*sum, a),
                            None => parts[p].push((*view, a, at)),
                        }
                    }
                }
                Op::Element(p, offset) => {
                    if let Some(c) = self.element_adjoint(p, offset, a) {
                        self.accumulate(&mut grads[p], c);
                    }
                }
                Op::Reduce(r, x, dim) if self.float(x) => {
                    let over = self.shape(x);
                    let c = self.reduce_adjoint(r, x, dim, i, a);
                    self.give(&mut adj, x, c, &over);
                }
                _ => {
                    let partials: Vec<(NodeId, D)> = self
                        .partials(i)
                        .into_iter()
                        .filter_map(|(target, d)| Some((target, d?)))
                        .collect();
                    for (k, &(target, d)) in partials.iter().enumerate() {
                        let same: Vec<D> = partials
                            .iter()
                            .filter(|&&(t, _)| t == target)
                            .map(|&(_, d)| d)
                            .collect();
                        let c = if same.iter().all(|&e| self.same_partial(e, d)) {
                            self.times(a, d)
                        } else if partials[..k].iter().any(|&(t, _)| t == target) {
                            continue;
                        } else {
                            // An operand read twice with partials that differ (`x.atan2(x)`,
                            // `x - x`, `x / x`): the partials summed first, as forward mode
                            // sums their products with one tangent. Each product given in
                            // turn would add the large opposite terms to the operand's
                            // adjoint one after the other, rounding away what else it holds.
                            let mut sum = self.partial_value(d);
                            for &e in &same[1..] {
                                let e = self.partial_value(e);
                                sum = self.add(sum, e);
                            }
                            self.mul(a, sum)
                        };
                        self.give(&mut adj, target, c, &at);
                    }
                }
            }
        }
        wrt.iter()
            .map(|&p| {
                let shape = self.params[p].shape.clone().unwrap_or_default();
                if !parts[p].is_empty() {
                    return self.parts_grad(p, std::mem::take(&mut parts[p]));
                }
                let g = match grads[p] {
                    Some(g) => g,
                    None => self.lit(0.0),
                };
                let g = self.sum_to(g, &shape);
                let g = self.broadcast_to(g, &shape);
                Grad::Whole(self.cast(g, self.params[p].elem))
            })
            .collect()
    }

    /// Adds `c` to a gradient being summed (`None` before its first term).
    fn accumulate(&mut self, sum: &mut Option<NodeId>, c: NodeId) {
        *sum = Some(match *sum {
            Some(g) => self.add(g, c),
            None => c,
        });
    }

    /// The gradient of parameter `p`, read only through the parts of `parts` (each distinct
    /// view with the sum of its reads' adjoints, and its shape): each part's over its view's
    /// shape, in `p`'s type. The parts cover `p` where there are as many as its composite dims
    /// have parts together, each dim's parts being disjoint.
    fn parts_grad(&mut self, p: usize, parts: Vec<(View, NodeId, Vec<DimId>)>) -> Grad {
        let storage = self.params[p].shape.clone().unwrap_or_default();
        let combinations: u64 = storage
            .iter()
            .map(|&d| match &self.dims[d] {
                Dim::Composite(c) => c.terms().iter().map(|&(k, _)| k).sum(),
                _ => 1,
            })
            .product();
        let covered = parts.len() as u64 == combinations;
        let elem = self.params[p].elem;
        let parts = parts
            .into_iter()
            .map(|(view, a, shape)| {
                let a = self.broadcast_to(a, &shape);
                (view, self.cast(a, elem))
            })
            .collect();
        Grad::Parts { parts, covered }
    }

    /// The adjoint `a` of a view that [`View::picks`] dims of its parameter by `picks`, at the
    /// parameter: each element of the view is the parameter's element at the same coordinates
    /// along the view's dims and at the index along each picked dim, so the parameter's
    /// element gets `a` where every index equals its coordinate, and nothing elsewhere (nor
    /// where an index is out of range, which reads zero).
    fn picked(&mut self, a: NodeId, picks: &[(DimId, NodeId)]) -> NodeId {
        let mut c = a;
        for &(d, index) in picks {
            let at = self.push(Op::Index(d), Elem::U32, vec![d]);
            let at = self.cast(at, Elem::I64);
            let index = self.cast(index, Elem::I64);
            let hit = self.bin(BinOp::Eq, at, index);
            let zero = self.lit(0.0);
            c = self.select(hit, c, zero);
        }
        c
    }

    /// The adjoint `a` of a parameter of dims `storage` read with only some of `parts`, a
    /// merged dim's (`View::merged_read`; the read's shape `at`, the merged dim in their place),
    /// at the parameter: the sum of `a` over the parts it lacks (GroupNorm's `dw[g, c]`, the
    /// sum over `s` of `a[g, (c, s)]`). A value over `m` cannot be summed over part of it, so
    /// `a` goes to a temporary first (`early`), which the sum reads through a view over the
    /// parts: `T[g, c * len(s) + s]` at `[g, c, s]`, the parameter's dims first.
    fn merged_adjoint(
        &mut self,
        a: NodeId,
        at: &[DimId],
        m: DimId,
        parts: &[DimId],
        storage: &[DimId],
    ) -> NodeId {
        let ct = self.ct;
        let a = self.broadcast_to(a, at);
        let a = self.p(a);
        let t = self.param(&format!("__m{}", self.params.len()), ct, Some(at.to_vec()));
        self.early.push((a, t));
        // The parameter's dims in its order, then the parts it lacks: the sums over those
        // (last, as a row kernel's axis) leave a value in the parameter's own order.
        let lacks: Vec<DimId> = parts
            .iter()
            .copied()
            .filter(|q| !storage.contains(q))
            .collect();
        let shape: Vec<DimId> = storage.iter().chain(&lacks).copied().collect();
        let after = |dims: &[DimId], d: DimId| -> Vec<DimId> {
            let at = dims
                .iter()
                .position(|&x| x == d)
                .map_or(dims.len(), |i| i + 1);
            dims[at..].to_vec()
        };
        // A part's stride: the parts after it, times the dims after `m` in `at` (the
        // temporary's `[(d0, d1), d2]` read at `[d0, d2, d1]`: `d1` steps by `d2`).
        let strides = shape
            .iter()
            .map(|&d| match parts.contains(&d) {
                true => vec![(1, [after(parts, d), after(at, m)].concat())],
                false => vec![(1, after(at, d))],
            })
            .collect();
        let view = View {
            offset: vec![],
            strides,
            gathers: vec![],
        };
        let mut d = self.push(Op::View(t, Box::new(view)), ct, shape);
        for q in lacks {
            d = self.reduce(Reduce::Sum, d, Some(q));
        }
        d
    }

    /// The adjoint `a` of element `offset` of parameter `p` (`w[1]`, every dim of `w` of fixed
    /// size), at the parameter: `a` at that element, zero at the others.
    fn element_adjoint(&mut self, p: usize, offset: u64, a: NodeId) -> Option<NodeId> {
        let storage = self.params[p].shape.clone()?;
        let mut flat: Option<NodeId> = None;
        let mut stride = 1u64;
        for &d in storage.iter().rev() {
            let Dim::Fixed(size) = self.dims[d] else {
                return None;
            };
            let i = self.push(Op::Index(d), Elem::U32, vec![d]);
            let i = self.cast(i, Elem::I64);
            let s = self.push(Op::Int(stride.into()), Elem::I64, vec![]);
            let term = self.mul(i, s);
            flat = Some(match flat {
                Some(f) => self.add(f, term),
                None => term,
            });
            stride = stride.saturating_mul(size);
        }
        let offset = self.push(Op::Int(offset.into()), Elem::I64, vec![]);
        let hit = match flat {
            Some(f) => self.bin(BinOp::Eq, f, offset),
            None => self.push(Op::Bool(true), Elem::Bool, vec![]),
        };
        let zero = self.lit(0.0);
        Some(self.select(hit, a, zero))
    }

    /// The adjoint of reduction `n` (of `x` over `dim`) given its adjoint `a`, at `x`.
    fn reduce_adjoint(
        &mut self,
        r: Reduce,
        x: NodeId,
        dim: Option<DimId>,
        n: NodeId,
        a: NodeId,
    ) -> NodeId {
        let (px, pn) = (self.p(x), self.p(n));
        match r {
            Reduce::Sum => a,
            Reduce::Mean => {
                let dims = match dim {
                    Some(d) => vec![d],
                    None => self.shape(x),
                };
                let count = dims.iter().fold(None, |c: Option<NodeId>, &d| {
                    let l = self.len(d);
                    Some(match c {
                        Some(c) => self.mul(c, l),
                        None => l,
                    })
                });
                match count {
                    Some(c) => self.div(a, c),
                    None => a,
                }
            }
            Reduce::Max | Reduce::Min => {
                // Split evenly among the elements equal to the result (torch's `amax` rule).
                let ties = self.bin(BinOp::Eq, px, pn);
                let m = self.indicator(ties);
                let count = self.reduce(Reduce::Sum, m, dim);
                let share = self.div(a, count);
                let zero = self.lit(0.0);
                self.select(ties, share, zero)
            }
            Reduce::Prod => {
                let q = self.div(pn, px);
                self.mul(a, q)
            }
            Reduce::LogSumExp => {
                let s = self.sub(px, pn);
                let e = self.call(Func::Exp, &[s]);
                self.mul(a, e)
            }
        }
    }

    /// Forward mode: the tangent of each float output (in its type and shape; `None` for an
    /// integer or bool output) from the tangents of `wrt`, the parameters `tangents`.
    pub fn forward(
        &mut self,
        outputs: &[OutputInfo],
        wrt: &[usize],
        tangents: &[usize],
    ) -> Vec<Option<NodeId>> {
        let n = self.nodes.len();
        let mut tan: Vec<Option<NodeId>> = vec![None; n];
        for i in 0..n {
            match self.nodes[i].op.clone() {
                Op::Load(p) | Op::Scalar(p) => {
                    if let Some(j) = wrt.iter().position(|&w| w == p) {
                        let t = tangents[j];
                        let shape = self.params[t].shape.clone().unwrap_or_default();
                        let op = match self.params[t].shape {
                            Some(_) => Op::Load(t),
                            None => Op::Scalar(t),
                        };
                        let load = self.push(op, self.params[t].elem, shape);
                        tan[i] = Some(self.p(load));
                    }
                }
                // The same view, or element, of the tangent.
                Op::View(p, view) => {
                    if let Some(j) = wrt.iter().position(|&w| w == p) {
                        let t = tangents[j];
                        tan[i] = Some(self.read_like(i, t, Op::View(t, view)));
                    }
                }
                Op::Element(p, offset) => {
                    if let Some(j) = wrt.iter().position(|&w| w == p) {
                        let t = tangents[j];
                        tan[i] = Some(self.read_like(i, t, Op::Element(t, offset)));
                    }
                }
                Op::Reduce(r, x, dim) if self.float(x) => {
                    if let Some(t) = tan[x] {
                        tan[i] = Some(self.reduce_tangent(r, x, dim, i, t));
                    }
                }
                _ => {
                    let mut sum: Option<NodeId> = None;
                    for (operand, d) in self.partials(i) {
                        let (Some(d), Some(t)) = (d, tan[operand]) else {
                            continue;
                        };
                        let c = self.times(t, d);
                        sum = Some(match sum {
                            Some(s) => self.add(s, c),
                            None => c,
                        });
                    }
                    tan[i] = sum;
                }
            }
        }
        outputs
            .iter()
            .map(|o| {
                if !o.elem.is_float() {
                    return None;
                }
                let t = match tan[o.node] {
                    Some(t) => t,
                    None => self.lit(0.0),
                };
                let t = self.broadcast_to(t, &o.shape);
                Some(self.cast(t, o.elem))
            })
            .collect()
    }

    /// `read`, a read of parameter `t`, over the shape of value `like`, in the compute type.
    fn read_like(&mut self, like: NodeId, t: usize, read: Op) -> NodeId {
        let shape = self.shape(like);
        let read = self.push(read, self.params[t].elem, shape);
        self.p(read)
    }

    /// The tangent of reduction `n` (of `x` over `dim`) given `x`'s tangent `t`.
    fn reduce_tangent(
        &mut self,
        r: Reduce,
        x: NodeId,
        dim: Option<DimId>,
        n: NodeId,
        t: NodeId,
    ) -> NodeId {
        let have = self.shape(t);
        // The dims reduced that the tangent has, and those it is constant along.
        let dims = match dim {
            Some(d) => vec![d],
            None => self.shape(x),
        };
        let (along, constant): (Vec<DimId>, Vec<DimId>) =
            dims.into_iter().partition(|d| have.contains(d));
        let (px, pn) = (self.p(x), self.p(n));
        let sum = |g: &mut Self, v: NodeId| {
            let s = match (dim, along.is_empty()) {
                (_, true) => v,
                (Some(d), false) => g.reduce(Reduce::Sum, v, Some(d)),
                (None, false) => g.reduce(Reduce::Sum, v, None),
            };
            g.times_lens(s, &constant)
        };
        match r {
            Reduce::Sum => sum(self, t),
            Reduce::Mean => match (dim, along.is_empty()) {
                (_, true) => t,
                (Some(d), false) => self.reduce(Reduce::Mean, t, Some(d)),
                (None, false) => self.reduce(Reduce::Mean, t, None),
            },
            Reduce::Max | Reduce::Min => {
                let ties = self.bin(BinOp::Eq, px, pn);
                let m = self.indicator(ties);
                let count = self.reduce(Reduce::Sum, m, dim);
                let zero = self.lit(0.0);
                let picked = self.select(ties, t, zero);
                let total = self.reduce(Reduce::Sum, picked, dim);
                self.div(total, count)
            }
            Reduce::Prod => {
                let q = self.div(t, px);
                let s = self.reduce(Reduce::Sum, q, dim);
                self.mul(pn, s)
            }
            Reduce::LogSumExp => {
                let s = self.sub(px, pn);
                let e = self.call(Func::Exp, &[s]);
                let w = self.mul(t, e);
                self.reduce(Reduce::Sum, w, dim)
            }
        }
    }

    /// Adds a parameter (a cotangent, tangent or temporary).
    fn param(&mut self, name: &str, elem: Elem, shape: Option<Vec<DimId>>) -> usize {
        self.params.push(ParamInfo {
            name: Ident::new(name, Span::call_site()),
            elem,
            shape,
            written: false,
            packed: false,
        });
        self.params.len() - 1
    }
}

fn copy_node(n: &Node) -> Node {
    Node {
        op: n.op.clone(),
        ty: n.ty,
        shape: n.shape.clone(),
        tokens: n.tokens.clone(),
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::Op;
    use crate::parse::BinOp;
    use crate::testing::kernel;
    use quote::quote;

    /// Softmax's gradient divides by the row's sum once a row, not twice an element: the
    /// sum along the row of `dy * (e / s) / s` is taken as `sum(dy * e) / s / s`, beside the
    /// sum of `e` in the same pass.
    #[test]
    fn sums_take_out_the_divisors_that_do_not_vary_along_them() {
        let k = kernel(quote! {
            #[vjp(x)]
            fn softmax(x: [bf16; rows, cols]) -> [bf16; rows, cols] {
                let e = (x - detach(max(x, cols))).exp();
                e / sum(e, cols)
            }
        });
        for (with_values, divisions) in [(false, 0), (true, 1)] {
            let d = super::vjp(&k, with_values, "d").unwrap();
            assert_eq!(d.steps.len(), 1);
            let k = &d.steps[0].kernel;
            let per_element = k
                .nodes
                .iter()
                .filter(|n| matches!(n.op, Op::Binary(BinOp::Div, ..)) && n.shape.contains(&1))
                .count();
            assert_eq!(per_element, divisions, "with values: {with_values}");
        }
    }

    /// A parameter read in parts: each part's gradient is stored through its view, both
    /// halves in one launch over their shape; the gradient's buffer is zeroed first only where
    /// the parts read leave elements out.
    #[test]
    fn parts_are_stored_through_their_views() {
        use super::schedule::Written;
        let k = kernel(quote! {
            #[vjp(x)]
            fn f(x: [f32; t, 2 * d]) -> [f32; t, d] { x[.., ..d] * x[.., d..] }
        });
        let d = super::vjp(&k, false, "d").unwrap();
        assert_eq!(d.steps.len(), 1);
        let step = &d.steps[0];
        let covered = Written {
            result: 0,
            param: 0,
            covered: true,
        };
        assert_eq!(step.written, [covered]);
        assert_eq!(step.kernel.outputs.len(), 2);
        assert!(step.kernel.outputs.iter().all(|o| o.place.is_some()));
        assert!(matches!(step.kernel.launch, crate::ir::Launch::Map { .. }));
        let k = kernel(quote! {
            #[vjp(x)]
            fn f(x: [f32; t, 2 * d]) -> [f32; t, d] { x[.., d..].exp() }
        });
        let d = super::vjp(&k, false, "d").unwrap();
        let written: Vec<bool> = d.steps[0].written.iter().map(|w| w.covered).collect();
        assert_eq!(written, [false]);
    }

    /// GroupNorm's affine weight, unlisted, costs nothing: `x`'s gradient is the one launch
    /// it was before the weight's own gradient (summed over part of the merged dim, in
    /// launches of its own) was derived.
    #[test]
    fn an_unlisted_partially_merged_parameter_adds_no_launch() {
        let k = kernel(quote! {
            #[vjp(x)]
            fn f(x: [f32; b, g, c, s], w: [f32; g, c]) -> [f32; b, g, c, s] {
                let d = x - mean(x, (c, s));
                d * rsqrt(mean(d * d, (c, s)) + 1e-5) * w
            }
        });
        assert_eq!(super::vjp(&k, false, "d").unwrap().steps.len(), 1);
    }

    /// The values a kernel reduces along dim 1 (`cols`), one for each reduction.
    fn summands(k: &crate::ir::Kernel) -> Vec<usize> {
        k.nodes
            .iter()
            .filter_map(|n| match n.op {
                Op::Reduce(_, a, Some(1)) => Some(a),
                _ => None,
            })
            .collect()
    }

    /// LayerNorm's `dx` takes two passes over each row, not three: the mean's adjoint,
    /// `-sum(dy * g * rstd + 2 * dvar * (x - mean))`, is taken term by term with `rstd` and
    /// `dvar` (each a sum over the row of values that need the mean) outside the sums, so no
    /// sum along the row waits on more than one other, and `x - mean`, which two terms share,
    /// is summed once.
    #[test]
    fn sums_split_over_terms_whose_factors_wait_on_other_sums() {
        let k = kernel(quote! {
            #[vjp(x)]
            fn layernorm(x: [f32; rows, cols], g: [f32; cols]) -> [f32; rows, cols] {
                let d = x - mean(x, cols);
                d * rsqrt(mean(d * d, cols) + 1e-5) * g
            }
        });
        let d = super::vjp(&k, false, "d").unwrap();
        assert_eq!(d.steps.len(), 1);
        let k = &d.steps[0].kernel;
        let mut depth = vec![0; k.nodes.len()];
        for (i, n) in k.nodes.iter().enumerate() {
            let under = n.op.operands().iter().map(|&o| depth[o]).max().unwrap_or(0);
            depth[i] = under + usize::from(matches!(n.op, Op::Reduce(_, _, Some(1))));
        }
        assert_eq!(
            depth.iter().max(),
            Some(&2),
            "sums along the row, one after another"
        );
        let mut summed = summands(k);
        let all = summed.len();
        summed.sort();
        summed.dedup();
        assert_eq!(summed.len(), all, "a summand summed twice");
    }

    /// A rounding cast stays inside the sum: the divisor comes out, `as bf16` is not looked
    /// through (only widening casts are).
    #[test]
    fn sums_keep_the_roundings_of_their_summands() {
        let k = kernel(quote! {
            #[vjp(w)]
            fn f(x: [f32; rows, cols], w: [f32; rows]) -> [f32; rows, cols] {
                ((x.exp() as bf16) as f32) / w
            }
        });
        let d = super::vjp(&k, false, "d").unwrap();
        let k = &d.steps[0].kernel;
        let reduced = summands(k);
        assert_eq!(reduced.len(), 1);
        let mut stack = reduced;
        let (mut rounds, mut divides) = (false, false);
        while let Some(i) = stack.pop() {
            let n = &k.nodes[i];
            rounds |= matches!(n.op, Op::Cast(_)) && n.elem() == crate::ty::Elem::BF16;
            divides |= matches!(n.op, Op::Binary(BinOp::Div, ..));
            stack.extend(n.op.operands());
        }
        assert!(
            rounds && !divides,
            "the summand keeps its rounding and divides by nothing"
        );
    }
}
