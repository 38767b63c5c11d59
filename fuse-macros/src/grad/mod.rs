//! Derivatives (`#[vjp(..)]` and `#[jvp(..)]`): a transformation of the checked kernel into new
//! kernels that go through the same planning and the same two backends.
//!
//! - [`Graph::reverse`] builds, beside the kernel's values, the adjoint of each value from the
//!   cotangents of the float outputs, back to the listed parameters (reverse mode); a value used
//!   over more dims than it has (a broadcast) gets the sum of its uses over those dims.
//! - [`Graph::forward`] builds the tangent of each value from the tangents of the listed
//!   parameters (forward mode).
//! - `plan` and `merge` split the values wanted into launches: as few as fusion allows, each a
//!   [`Kernel`] of its own. A reduction that another one over a different dim (or a value over
//!   elements, for a reduction over every element) needs is computed in an earlier launch into
//!   a temporary, in f32 (f64 in kernels of f64 values), and read from there.
//!
//! Adjoints and tangents are computed in f32 for every float type narrower than 64 bits (f64
//! where the kernel has f64 values), and each gradient is cast to its parameter's type at the
//! end.

use crate::func::Func;
use crate::ir::{Dim, DimId, Kernel, Launch, Node, NodeId, Op, OutputInfo, ParamInfo, Reduce};
use crate::parse::{BinOp, UnOp};
use crate::ty::Elem;
use proc_macro2::{Ident, Span, TokenStream};

pub mod items;

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
                })
                .collect(),
            nodes: k.nodes.iter().map(copy_node).collect(),
            order,
            ct: if wide { Elem::F64 } else { Elem::F32 },
            temps: vec![],
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
            return self.reduce(Reduce::Sum, a, None);
        }
        extra
            .into_iter()
            .fold(a, |a, d| self.reduce(Reduce::Sum, a, Some(d)))
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

    /// The partial derivatives of value `n` with respect to its operands, for the elementwise
    /// ops; `None` for an operand that carries none.
    fn partials(&mut self, n: NodeId) -> Vec<(NodeId, Option<D>)> {
        let op = self.nodes[n].op.clone();
        if !self.float(n) {
            return vec![];
        }
        let floats = |g: &Self, ops: &[NodeId]| ops.iter().all(|&o| g.float(o));
        match op {
            Op::Unary(UnOp::Neg, x) => vec![(x, Some(D::MinusOne))],
            Op::Binary(op, x, y) if floats(self, &[x, y]) => {
                let (px, py) = (self.p(x), self.p(y));
                let (dx, dy) = match op {
                    BinOp::Add => (D::One, D::One),
                    BinOp::Sub => (D::One, D::MinusOne),
                    BinOp::Mul => (D::Of(py), D::Of(px)),
                    BinOp::Div => {
                        let one = self.lit(1.0);
                        let r = self.div(one, py);
                        let pn = self.p(n);
                        let q = self.div(pn, py);
                        (D::Of(r), D::Of(self.neg(q)))
                    }
                    BinOp::Rem => {
                        let q = self.div(px, py);
                        let t = self.call(Func::Trunc, &[q]);
                        (D::One, D::Of(self.neg(t)))
                    }
                    _ => return vec![],
                };
                vec![(x, Some(dx)), (y, Some(dy))]
            }
            Op::Cast(x) if self.float(x) => vec![(x, Some(D::One))],
            Op::Select(c, x, y) => {
                let (one, zero) = (self.lit(1.0), self.lit(0.0));
                let dx = self.select(c, one, zero);
                let dy = self.select(c, zero, one);
                vec![(x, Some(D::Of(dx))), (y, Some(D::Of(dy)))]
            }
            Op::Call(f, args) if self.float(args[0]) => self.call_partials(f, &args, n),
            _ => vec![],
        }
    }

    /// The partials of function `f` at `args`, its value `n`.
    fn call_partials(&mut self, f: Func, args: &[NodeId], n: NodeId) -> Vec<(NodeId, Option<D>)> {
        use std::f64::consts::{FRAC_2_SQRT_PI, LN_10, LN_2, PI};
        let x = self.p(args[0]);
        let pn = self.p(n);
        let one = self.lit(1.0);
        let one_over = |g: &mut Self, a: NodeId| g.div(one, a);
        let d = match f {
            Func::Exp => pn,
            Func::Exp2 => self.scale(pn, LN_2),
            Func::Ln => one_over(self, x),
            Func::Log2 => {
                let s = self.scale(x, LN_2);
                one_over(self, s)
            }
            Func::Log10 => {
                let s = self.scale(x, LN_10);
                one_over(self, s)
            }
            Func::Sqrt => {
                let s = self.scale(pn, 2.0);
                one_over(self, s)
            }
            Func::Cbrt => {
                let s = self.mul(pn, pn);
                let s = self.scale(s, 3.0);
                one_over(self, s)
            }
            Func::Recip => {
                let s = self.mul(pn, pn);
                self.neg(s)
            }
            Func::Sin => self.call(Func::Cos, &[x]),
            Func::Cos => {
                let s = self.call(Func::Sin, &[x]);
                self.neg(s)
            }
            Func::Tan => {
                let s = self.mul(pn, pn);
                self.add(one, s)
            }
            Func::Sinh => self.call(Func::Cosh, &[x]),
            Func::Cosh => self.call(Func::Sinh, &[x]),
            Func::Tanh => {
                let s = self.mul(pn, pn);
                self.sub(one, s)
            }
            Func::Asin | Func::Acos => {
                let s = self.mul(x, x);
                let s = self.sub(one, s);
                let r = self.call(Func::Rsqrt, &[s]);
                if f == Func::Acos {
                    self.neg(r)
                } else {
                    r
                }
            }
            Func::Atan => {
                let s = self.mul(x, x);
                let s = self.add(one, s);
                one_over(self, s)
            }
            Func::Asinh => {
                let s = self.mul(x, x);
                let s = self.add(s, one);
                self.call(Func::Rsqrt, &[s])
            }
            Func::Acosh => {
                let s = self.mul(x, x);
                let s = self.sub(s, one);
                self.call(Func::Rsqrt, &[s])
            }
            Func::Atanh => {
                let s = self.mul(x, x);
                let s = self.sub(one, s);
                one_over(self, s)
            }
            Func::ExpM1 => self.add(pn, one),
            Func::Ln1p => {
                let s = self.add(one, x);
                one_over(self, s)
            }
            Func::Floor | Func::Ceil | Func::Round | Func::Trunc | Func::Signum | Func::Detach => {
                return vec![]
            }
            Func::Fract => return vec![(args[0], Some(D::One))],
            Func::ToDegrees => self.lit(180.0 / PI),
            Func::ToRadians => self.lit(PI / 180.0),
            Func::Abs => {
                // The sign of `x`, 0 at 0 (as torch's `abs`).
                let zero = self.lit(0.0);
                let pos = self.bin(BinOp::Gt, x, zero);
                let neg = self.bin(BinOp::Lt, x, zero);
                let p = self.indicator(pos);
                let m = self.indicator(neg);
                self.sub(p, m)
            }
            Func::Relu => {
                let zero = self.lit(0.0);
                let pos = self.bin(BinOp::Gt, x, zero);
                self.indicator(pos)
            }
            Func::Sigmoid => {
                let s = self.sub(one, pn);
                self.mul(pn, s)
            }
            Func::Silu => {
                // s (1 + x (1 - s)), s = sigmoid(x)
                let s = self.call(Func::Sigmoid, &[x]);
                let t = self.sub(one, s);
                let t = self.mul(x, t);
                let t = self.add(one, t);
                self.mul(s, t)
            }
            Func::Softplus => self.call(Func::Sigmoid, &[x]),
            Func::Erf => {
                let s = self.mul(x, x);
                let s = self.neg(s);
                let e = self.call(Func::Exp, &[s]);
                self.scale(e, FRAC_2_SQRT_PI)
            }
            Func::Gelu => {
                // Φ(x) + x φ(x): Φ(x) = gelu(x) / x is unsafe at 0, so from erf.
                let h = self.scale(x, std::f64::consts::FRAC_1_SQRT_2);
                let e = self.call(Func::Erf, &[h]);
                let e = self.add(one, e);
                let cdf = self.scale(e, 0.5);
                let s = self.mul(x, x);
                let s = self.scale(s, -0.5);
                let pdf = self.call(Func::Exp, &[s]);
                let pdf = self.scale(pdf, 1.0 / (2.0 * PI).sqrt());
                let t = self.mul(x, pdf);
                self.add(cdf, t)
            }
            Func::GeluTanh => {
                // u = c (x + 0.044715 x^3), t = tanh(u):
                // 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)
                let c = (2.0 / PI).sqrt();
                let x2 = self.mul(x, x);
                let x3 = self.mul(x2, x);
                let k = self.scale(x3, 0.044715);
                let u = self.add(x, k);
                let u = self.scale(u, c);
                let t = self.call(Func::Tanh, &[u]);
                let a = self.add(one, t);
                let a = self.scale(a, 0.5);
                let t2 = self.mul(t, t);
                let b = self.sub(one, t2);
                let q = self.scale(x2, 3.0 * 0.044715);
                let q = self.add(one, q);
                let b = self.mul(b, q);
                let b = self.mul(b, x);
                let b = self.scale(b, 0.5 * c);
                self.add(a, b)
            }
            Func::Rsqrt => {
                let s = self.mul(pn, pn);
                let s = self.mul(s, pn);
                self.scale(s, -0.5)
            }
            Func::Atan2 => {
                // atan2(y, x): d/dy = x / (x^2 + y^2), d/dx = -y / (x^2 + y^2)
                let (y, xx) = (x, self.p(args[1]));
                let a = self.mul(y, y);
                let b = self.mul(xx, xx);
                let r = self.add(a, b);
                let dy = self.div(xx, r);
                let dx = self.div(y, r);
                let dx = self.neg(dx);
                return vec![(args[0], Some(D::Of(dy))), (args[1], Some(D::Of(dx)))];
            }
            Func::Powf => {
                // x^y: d/dx = y x^(y - 1), d/dy = x^y ln x (0 where x^y is 0)
                let y = self.p(args[1]);
                let ym1 = self.sub(y, one);
                let pw = self.call(Func::Powf, &[x, ym1]);
                let dx = self.mul(y, pw);
                let ln = self.call(Func::Ln, &[x]);
                let dy = self.mul(pn, ln);
                let zero = self.lit(0.0);
                let nz = self.bin(BinOp::Eq, pn, zero);
                let dy = self.select(nz, zero, dy);
                return vec![(args[0], Some(D::Of(dx))), (args[1], Some(D::Of(dy)))];
            }
            Func::Powi => {
                // x^k: k x^(k - 1)
                let k = args[1];
                let ke = self.elem(k);
                let one_k = self.push(Op::Int(1), ke, vec![]);
                let km1 = self.bin(BinOp::Sub, k, one_k);
                let pw = self.call(Func::Powi, &[x, km1]);
                let kf = self.cast(k, self.ct);
                self.mul(kf, pw)
            }
            Func::Hypot => {
                let y = self.p(args[1]);
                let dx = self.div(x, pn);
                let dy = self.div(y, pn);
                return vec![(args[0], Some(D::Of(dx))), (args[1], Some(D::Of(dy)))];
            }
            Func::Copysign => {
                // |x| with y's sign: sign(x) * sign(y), as +1 or -1 from the sign bits.
                let y = self.p(args[1]);
                let sx = self.call(Func::Copysign, &[one, x]);
                let sy = self.call(Func::Copysign, &[one, y]);
                self.mul(sx, sy)
            }
            Func::Log => {
                // ln x / ln b: d/dx = 1 / (x ln b), d/db = -ln x / (b ln^2 b)
                let b = self.p(args[1]);
                let lb = self.call(Func::Ln, &[b]);
                let xl = self.mul(x, lb);
                let dx = one_over(self, xl);
                let q = self.div(pn, b);
                let q = self.div(q, lb);
                let db = self.neg(q);
                return vec![(args[0], Some(D::Of(dx))), (args[1], Some(D::Of(db)))];
            }
            Func::Max | Func::Min => {
                // To the larger (smaller) argument; half to each where they are equal, as
                // torch's `maximum` and `minimum`.
                let y = self.p(args[1]);
                let cmp = if f == Func::Max { BinOp::Gt } else { BinOp::Lt };
                let wins = self.bin(cmp, x, y);
                let ties = self.bin(BinOp::Eq, x, y);
                let w = self.indicator(wins);
                let t = self.indicator(ties);
                let half = self.scale(t, 0.5);
                let dx = self.add(w, half);
                let dy = self.sub(one, dx);
                return vec![(args[0], Some(D::Of(dx))), (args[1], Some(D::Of(dy)))];
            }
            Func::Clamp => {
                // To `x` where lo <= x <= hi (as torch's `clamp`), else to the bound it took.
                let (lo, hi) = (self.p(args[1]), self.p(args[2]));
                let below = self.bin(BinOp::Lt, x, lo);
                let above = self.bin(BinOp::Gt, x, hi);
                let dlo = self.indicator(below);
                let dhi = self.indicator(above);
                let out = self.add(dlo, dhi);
                let dx = self.sub(one, out);
                return vec![
                    (args[0], Some(D::Of(dx))),
                    (args[1], Some(D::Of(dlo))),
                    (args[2], Some(D::Of(dhi))),
                ];
            }
            Func::MulAdd => {
                let (y, z) = (self.p(args[1]), args[2]);
                return vec![
                    (args[0], Some(D::Of(y))),
                    (args[1], Some(D::Of(x))),
                    (z, Some(D::One)),
                ];
            }
            Func::IsNan
            | Func::IsFinite
            | Func::IsInfinite
            | Func::IsSignNegative
            | Func::IsSignPositive
            | Func::Pow
            | Func::CountOnes
            | Func::LeadingZeros
            | Func::TrailingZeros => return vec![],
        };
        vec![(args[0], Some(D::Of(d)))]
    }

    /// `a` times a partial.
    fn times(&mut self, a: NodeId, d: D) -> NodeId {
        match d {
            D::One => a,
            D::MinusOne => self.neg(a),
            D::Of(p) => self.mul(a, p),
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
    ) -> Vec<NodeId> {
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
        for i in (0..n).rev() {
            let Some(a) = adj[i] else { continue };
            let at = self.shape(i);
            match self.nodes[i].op.clone() {
                Op::Load(p) | Op::Scalar(p) => {
                    grads[p] = Some(match grads[p] {
                        Some(g) => self.add(g, a),
                        None => a,
                    });
                }
                Op::Reduce(r, x, dim) if self.float(x) => {
                    let over = self.shape(x);
                    let c = self.reduce_adjoint(r, x, dim, i, a);
                    self.give(&mut adj, x, c, &over);
                }
                _ => {
                    for (target, d) in self.partials(i) {
                        let Some(d) = d else { continue };
                        let c = self.times(a, d);
                        self.give(&mut adj, target, c, &at);
                    }
                }
            }
        }
        wrt.iter()
            .map(|&p| {
                let shape = self.params[p].shape.clone().unwrap_or_default();
                let g = match grads[p] {
                    Some(g) => g,
                    None => self.lit(0.0),
                };
                let g = self.sum_to(g, &shape);
                let g = self.broadcast_to(g, &shape);
                self.cast(g, self.params[p].elem)
            })
            .collect()
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
    let names = output_names(k, "d_");
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
            let name = unique(&name, k);
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

/// A name for each output's cotangent (`d_out`, or `d_out0`, `d_out1`, ..), clear of the
/// kernel's parameter names.
pub fn output_names(k: &Kernel, prefix: &str) -> Vec<String> {
    (0..k.outputs.len())
        .map(|j| {
            let name = match k.tuple {
                true => format!("{prefix}out{j}"),
                false => format!("{prefix}out"),
            };
            unique(&name, k)
        })
        .collect()
}

/// `name`, with underscores added until no parameter of `k` has it.
fn unique(name: &str, k: &Kernel) -> String {
    let mut name = name.to_string();
    while k
        .params
        .iter()
        .any(|p| crate::ir::plain_name(&p.name) == name)
        || name == crate::check::DEVICE_ARG
    {
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
