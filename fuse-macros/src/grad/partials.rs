//! The partial derivatives of each elementwise operator and function, which reverse and forward
//! mode share.

use super::{Graph, D};
use crate::func::Func;
use crate::ir::{NodeId, Op};
use crate::parse::{BinOp, UnOp};

impl Graph {
    /// The partial derivatives of value `n` with respect to its operands, for the elementwise
    /// ops; `None` for an operand that carries none.
    pub(super) fn partials(&mut self, n: NodeId) -> Vec<(NodeId, Option<D>)> {
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
            Func::Floor
            | Func::Ceil
            | Func::Round
            | Func::RoundTiesEven
            | Func::Trunc
            | Func::Signum
            | Func::Detach => return vec![],
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
            Func::Gelu => self.call(Func::GeluGrad, &[x]),
            Func::GeluGrad => {
                // φ(x) (2 - x^2)
                let s = self.mul(x, x);
                let h = self.scale(s, -0.5);
                let pdf = self.call(Func::Exp, &[h]);
                let pdf = self.scale(pdf, 1.0 / (2.0 * PI).sqrt());
                let two = self.lit(2.0);
                let t = self.sub(two, s);
                self.mul(pdf, t)
            }
            Func::GeluTanh => {
                // u = c (x + 0.044715 x^3), t = tanh(u):
                // 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)
                // `u` is rounded step by step as the function's own `tanh` argument
                // (`0.044715 * x * x * x`, left to right), so that where a kernel also
                // computes `gelu_tanh(x)` (GeGLU's `db`) NVVM computes `tanh` once: G4's
                // backward took 75 instructions an element with two.
                let c = (2.0 / PI).sqrt();
                let x2 = self.mul(x, x);
                let k = self.scale(x, 0.044715);
                let k = self.mul(k, x);
                let k = self.mul(k, x);
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
}
