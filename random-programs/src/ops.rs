//! The oracle's elementwise operations, each with its error bound (see `oracle.rs`).

use crate::oracle::{Node, V};
use crate::ty::Ty;

/// The relative size of one ulp of the type a float of `ty` computes in: `f16` and `bf16`
/// compute in `f32`. For `f64` it is doubled: the oracle's own f64 rounds as much as the
/// implementation.
pub fn eps(ty: Ty) -> f64 {
    match ty {
        Ty::F64 => 2.0 * f64::EPSILON,
        _ => f32::EPSILON as f64,
    }
}

/// The smallest subnormal of the compute type: the absolute error of an underflow.
pub fn tiny(ty: Ty) -> f64 {
    match ty {
        Ty::F64 => 1e-323,
        _ => 1.4e-45,
    }
}

/// The magnitude from which rounding to the compute type gives infinity.
fn overflow(ty: Ty) -> f64 {
    match ty {
        Ty::F64 => f64::MAX,
        _ => 2f64.powi(128) * (1.0 - 2f64.powi(-25)),
    }
}

/// The magnitude from which rounding to the storage type `ty` gives infinity.
pub fn store_overflow(ty: Ty) -> f64 {
    match ty {
        Ty::F16 => 65520.0,
        Ty::Bf16 => 2f64.powi(128) * (1.0 - 2f64.powi(-9)),
        _ => overflow(ty),
    }
}

/// One ulp of the storage type `ty` at magnitude `x`.
pub fn ulp(ty: Ty, x: f64) -> f64 {
    let (bits, min_exp) = match ty {
        Ty::F16 => (10, -14),
        Ty::Bf16 => (7, -126),
        Ty::F32 => (23, -126),
        _ => (52, -1022),
    };
    let e = if x == 0.0 || !x.is_finite() {
        min_exp
    } else {
        (x.abs().log2().floor() as i32).max(min_exp)
    };
    2f64.powi(e - bits)
}

/// A float result `f` with error `err` of type `ty`: unknown where the error could carry it
/// past the largest finite value, infinite (exactly) where it certainly does.
pub fn finish(f: f64, err: f64, ty: Ty) -> V {
    if !f.is_finite() {
        return if err == 0.0 { V::float(f) } else { V::UNKNOWN };
    }
    if !err.is_finite() {
        return V::UNKNOWN;
    }
    let t = overflow(ty);
    if f.abs() - err >= t && ty != Ty::F64 {
        return V::float(f64::INFINITY.copysign(f));
    }
    if f.abs() + err >= t {
        return V::UNKNOWN;
    }
    V { f, i: 0, err }
}

/// Wraps an exact integer to `ty`'s width, as two's complement.
pub fn wrap(v: i128, ty: Ty) -> i128 {
    let (bits, signed) = match ty {
        Ty::I8 => (8, true),
        Ty::U8 => (8, false),
        Ty::I16 => (16, true),
        Ty::U16 => (16, false),
        Ty::I32 => (32, true),
        Ty::U32 => (32, false),
        Ty::I64 => (64, true),
        Ty::U64 => (64, false),
        Ty::Bool => return v & 1,
        _ => unreachable!("wrap of a float"),
    };
    let m = v & ((1i128 << bits) - 1);
    if signed && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

pub fn bits(ty: Ty) -> u32 {
    match ty {
        Ty::I8 | Ty::U8 => 8,
        Ty::I16 | Ty::U16 => 16,
        Ty::I32 | Ty::U32 => 32,
        _ => 64,
    }
}

pub fn int_range(ty: Ty) -> (i128, i128) {
    let b = bits(ty);
    if ty.is_signed() {
        (-(1i128 << (b - 1)), (1i128 << (b - 1)) - 1)
    } else {
        (0, (1i128 << b) - 1)
    }
}

/// `f` of float arguments: its value at the arguments, and its error from the arguments' errors
/// (the largest change of `f` over the corners of their intervals, with a margin for curvature)
/// plus `ulps` roundings of the result and `abs` of absolute error.
pub fn smooth(f: &dyn Fn(&[f64]) -> f64, xs: &[V], ty: Ty, ulps: f64, abs: f64) -> V {
    if xs.iter().any(|x| !x.known()) {
        return V::UNKNOWN;
    }
    let at: Vec<f64> = xs.iter().map(|x| x.f).collect();
    let center = f(&at);
    let mut dev = 0.0f64;
    if xs.iter().any(|x| x.err > 0.0) {
        for corner in 0..(1 << xs.len()) {
            let p: Vec<f64> = xs
                .iter()
                .enumerate()
                .map(|(k, x)| x.f + if corner >> k & 1 == 1 { x.err } else { -x.err })
                .collect();
            let v = f(&p);
            if v.is_nan() != center.is_nan() || (!v.is_finite() && v != center) {
                return V::UNKNOWN;
            }
            if v.is_finite() {
                dev = dev.max((v - center).abs());
            }
        }
        if !center.is_finite() {
            return V::UNKNOWN;
        }
    }
    if !center.is_finite() {
        return finish(center, 0.0, ty);
    }
    let round = (ulps + 1.0) * eps(ty) * center.abs() + abs * eps(ty) + tiny(ty);
    finish(center, 1.5 * dev + round, ty)
}

/// Whether `x`'s interval holds a point where `g` changes (for discontinuous functions).
fn straddles(x: V, g: impl Fn(f64) -> f64) -> bool {
    x.err > 0.0 && g(x.f - x.err) != g(x.f + x.err)
}

pub fn apply(node: &Node, ty: Ty, tys: &[Ty], xs: &[V]) -> V {
    if xs.iter().any(|x| !x.known()) {
        return V::UNKNOWN;
    }
    let from = tys.first().copied().unwrap_or(ty);
    match node.op.as_str() {
        "cast" => cast(xs[0], from, ty),
        "sel" => {
            if xs[0].i != 0 {
                xs[1]
            } else {
                xs[2]
            }
        }
        "fn" => function(&node.args[0], ty, from, xs),
        op if from.is_float() => float_op(op, ty, from, xs),
        op => int_op(op, ty, from, xs),
    }
}

fn cast(x: V, from: Ty, to: Ty) -> V {
    match (from.is_float(), to.is_float()) {
        (true, true) => match to {
            Ty::F64 => x,
            Ty::F32 if from == Ty::F64 => {
                finish(x.f, x.err + x.f.abs() * eps(to) / 2.0 + tiny(to), to)
            }
            Ty::F32 => x,
            _ => {
                if !x.f.is_finite() {
                    return x;
                }
                let t = store_overflow(to);
                if x.f.abs() - x.err >= t {
                    return V::float(f64::INFINITY.copysign(x.f));
                }
                if x.f.abs() + x.err >= t {
                    return V::UNKNOWN;
                }
                let e = x.err + ulp(to, x.f.abs() + x.err) + x.f.abs() * eps(Ty::F32);
                V {
                    f: x.f,
                    i: 0,
                    err: e,
                }
            }
        },
        (true, false) => {
            let (lo, hi) = int_range(to);
            let conv = |f: f64| -> i128 {
                if f.is_nan() {
                    0
                } else {
                    (f.trunc().clamp(lo as f64, hi as f64) as i128).clamp(lo, hi)
                }
            };
            if straddles(x, |f| conv(f) as f64) {
                V::UNKNOWN
            } else {
                V::int(conv(x.f))
            }
        }
        (false, true) => {
            let f = x.i as f64;
            let exact = match to {
                Ty::F64 => x.i.abs() <= 1 << 53,
                _ => x.i.abs() <= 1 << 24,
            };
            let err = if exact { 0.0 } else { f.abs() * eps(to) };
            let v = finish(f, err, if to == Ty::F64 { to } else { Ty::F32 });
            if to == Ty::F16 || to == Ty::Bf16 {
                cast(v, Ty::F32, to)
            } else {
                v
            }
        }
        (false, false) => V::int(wrap(x.i, to)),
    }
}

fn float_op(op: &str, ty: Ty, from: Ty, xs: &[V]) -> V {
    let (a, b) = (xs[0], xs.get(1).copied().unwrap_or(V::float(0.0)));
    let cmp = |want: fn(f64, f64) -> bool| -> V {
        let (lo_a, hi_a, lo_b, hi_b) = (a.f - a.err, a.f + a.err, b.f - b.err, b.f + b.err);
        let c = want(a.f, b.f);
        // Certain only where the two intervals are apart.
        let uncertain = (a.err > 0.0 || b.err > 0.0) && hi_a >= lo_b && hi_b >= lo_a;
        if uncertain {
            V::UNKNOWN
        } else {
            V::int(c as i128)
        }
    };
    match op {
        "add" => smooth(&|p| p[0] + p[1], xs, ty, 0.0, 0.0),
        "sub" => smooth(&|p| p[0] - p[1], xs, ty, 0.0, 0.0),
        "mul" => smooth(&|p| p[0] * p[1], xs, ty, 0.0, 0.0),
        "div" => {
            if b.err > 0.0 && b.f.abs() <= b.err {
                return V::UNKNOWN;
            }
            smooth(&|p| p[0] / p[1], xs, ty, 0.0, 0.0)
        }
        "rem" => {
            let q = |x: f64, y: f64| (x / y).trunc();
            let jumps = b.f.abs() <= b.err
                || q(a.f - a.err, b.f) != q(a.f + a.err, b.f)
                || q(a.f, b.f - b.err) != q(a.f, b.f + b.err);
            if (a.err > 0.0 || b.err > 0.0) && jumps {
                return V::UNKNOWN;
            }
            smooth(&|p| p[0] % p[1], xs, ty, 0.0, 0.0)
        }
        "neg" => V { f: -a.f, ..a },
        "eq" => cmp(|x, y| x == y),
        "ne" => cmp(|x, y| x != y),
        "lt" => cmp(|x, y| x < y),
        "le" => cmp(|x, y| x <= y),
        "gt" => cmp(|x, y| x > y),
        "ge" => cmp(|x, y| x >= y),
        _ => unreachable!("float operator {op} on {from:?}"),
    }
}

fn int_op(op: &str, ty: Ty, from: Ty, xs: &[V]) -> V {
    let (a, b) = (xs[0].i, xs.get(1).map_or(0, |x| x.i));
    let (lo, _) = if from == Ty::Bool {
        (0, 1)
    } else {
        int_range(from)
    };
    let v = match op {
        "add" => a + b,
        "sub" => a - b,
        "mul" => a.wrapping_mul(b),
        "div" if b == 0 => 0,
        "div" if a == lo && b == -1 => a,
        "div" => a / b,
        "rem" if b == 0 => a,
        "rem" if b == -1 => 0,
        "rem" => a % b,
        "and" => a & b,
        "or" => a | b,
        "xor" => a ^ b,
        "shl" => a << (b & (bits(from) as i128 - 1)),
        "shr" => a >> (b & (bits(from) as i128 - 1)),
        "neg" => -a,
        "not" if from == Ty::Bool => 1 - a,
        "not" => !a,
        "eq" => (a == b) as i128,
        "ne" => (a != b) as i128,
        "lt" => (a < b) as i128,
        "le" => (a <= b) as i128,
        "gt" => (a > b) as i128,
        "ge" => (a >= b) as i128,
        "land" => a & b,
        "lor" => a | b,
        _ => unreachable!("integer operator {op}"),
    };
    V::int(wrap(v, ty))
}

/// The float functions: the f64 reference and the ulps of `doc/language.md`'s table (one more
/// for the CPU's own libraries).
/// A function's float64 reference.
type Reference = fn(&[f64]) -> f64;

fn float_fn(name: &str) -> Option<(Reference, f64)> {
    Some(match name {
        "exp" => (|p| p[0].exp(), 3.0),
        "exp2" => (|p| p[0].exp2(), 3.0),
        "exp_m1" => (|p| p[0].exp_m1(), 2.0),
        "ln" => (|p| p[0].ln(), 2.0),
        "log2" => (|p| p[0].log2(), 2.0),
        "log10" => (|p| p[0].log10(), 3.0),
        "ln_1p" => (|p| p[0].ln_1p(), 2.0),
        "sqrt" => (|p| p[0].sqrt(), 1.0),
        "cbrt" => (|p| p[0].cbrt(), 2.0),
        "recip" => (|p| 1.0 / p[0], 1.0),
        "sin" => (|p| p[0].sin(), 3.0),
        "cos" => (|p| p[0].cos(), 3.0),
        "tan" => (|p| p[0].tan(), 5.0),
        "asin" => (|p| p[0].asin(), 3.0),
        "acos" => (|p| p[0].acos(), 3.0),
        "atan" => (|p| p[0].atan(), 3.0),
        "sinh" => (|p| p[0].sinh(), 4.0),
        "cosh" => (|p| p[0].cosh(), 3.0),
        "tanh" => (|p| p[0].tanh(), 3.0),
        "asinh" => (|p| libm::asinh(p[0]), 4.0),
        // libm's acosh does not test the sign: finite nonsense below -1.
        "acosh" => (
            |p| {
                if p[0] < 1.0 {
                    f64::NAN
                } else {
                    libm::acosh(p[0])
                }
            },
            5.0,
        ),
        "atanh" => (|p| libm::atanh(p[0]), 4.0),
        "to_degrees" => (|p| p[0].to_degrees(), 2.0),
        "to_radians" => (|p| p[0].to_radians(), 2.0),
        "abs" => (|p| p[0].abs(), 0.0),
        "erf" => (|p| libm::erf(p[0]), 3.0),
        "rsqrt" => (|p| 1.0 / p[0].sqrt(), 3.0),
        "sigmoid" => (|p| 1.0 / (1.0 + (-p[0]).exp()), 6.0),
        "silu" => (|p| p[0] / (1.0 + (-p[0]).exp()), 6.0),
        "relu" => (|p| if p[0] < 0.0 { 0.0 } else { p[0] }, 0.0),
        "softplus" => (|p| p[0].max(0.0) + (-p[0].abs()).exp().ln_1p(), 6.0),
        "max" => (|p| p[0].max(p[1]), 0.0),
        "min" => (|p| p[0].min(p[1]), 0.0),
        "powf" => (|p| p[0].powf(p[1]), 5.0),
        "atan2" => (|p| p[0].atan2(p[1]), 4.0),
        "hypot" => (|p| p[0].hypot(p[1]), 4.0),
        "mul_add" => (|p| p[0].mul_add(p[1], p[2]), 0.0),
        _ => return None,
    })
}

fn function(name: &str, ty: Ty, from: Ty, xs: &[V]) -> V {
    if from.is_float() {
        float_function(name, ty, xs)
    } else {
        int_function(name, ty, from, xs)
    }
}

fn float_function(name: &str, ty: Ty, xs: &[V]) -> V {
    let x = xs[0];
    // Poles and jumps inside an argument's interval make the value unknown.
    let near_zero = |v: V| v.err > 0.0 && v.f.abs() <= v.err;
    let pole = match name {
        "recip" | "rsqrt" | "ln" | "log2" | "log10" => near_zero(x),
        "tan" => straddles(x, |f| (f / std::f64::consts::PI - 0.5).floor()),
        "powf" => near_zero(x),
        "log" => {
            near_zero(x)
                || near_zero(V {
                    f: xs[1].f - 1.0,
                    ..xs[1]
                })
        }
        "atan2" => near_zero(xs[0]) && (xs[1].f - xs[1].err <= 0.0),
        // A NaN's sign is the hardware's choice: arithmetic on the GPU makes the canonical NaN.
        "copysign" => near_zero(xs[1]) || xs[1].f.is_nan(),
        "powi" => near_zero(x) && xs[1].i < 0,
        "clamp" => {
            let (lo, hi) = (xs[1], xs[2]);
            (x.err + lo.err + hi.err > 0.0) && lo.f + lo.err >= hi.f - hi.err
        }
        _ => false,
    };
    if pole {
        return V::UNKNOWN;
    }
    // `sigmoid` and `silu` divide by `1 + exp(-x)`, each step rounded: where `exp(-x)`
    // overflows the compute type they are 0 (a signed zero for `silu`).
    if (name == "sigmoid" || name == "silu") && x.f.is_finite() {
        let t = if ty == Ty::F64 {
            f64::MAX
        } else {
            f32::MAX as f64
        }
        .ln();
        let (lo, hi) = (-x.f - x.err, -x.f + x.err);
        if lo > t + 1e-3 {
            return V::float(if name == "silu" { x.f * 0.0 } else { 0.0 });
        }
        if hi > t - 1e-3 {
            return V::UNKNOWN;
        }
    }
    if let Some((f, ulps)) = float_fn(name) {
        let mut v = smooth(&f, xs, ty, ulps, 0.0);
        // Where an interval may hold an extremum the corners miss it: bound the change by the
        // function's Lipschitz constant instead.
        let lipschitz = match name {
            "sin" | "cos" => 1.0,
            "silu" => 1.1,
            _ => 0.0,
        };
        if v.known() && v.f.is_finite() {
            v.err += (lipschitz * x.err).min(2.0 * lipschitz);
        }
        return v;
    }
    let jump = |g: fn(f64) -> f64| -> V {
        if straddles(x, g) || (x.err > 0.0 && x.f.abs() <= x.err && name == "signum") {
            V::UNKNOWN
        } else {
            finish(g(x.f), 0.0, ty)
        }
    };
    match name {
        "floor" => jump(f64::floor),
        "ceil" => jump(f64::ceil),
        "trunc" => jump(f64::trunc),
        "round" => jump(f64::round),
        "signum" => jump(f64::signum),
        "fract" => {
            if straddles(x, f64::trunc) || (x.err > 0.0 && x.f.abs() <= x.err) {
                V::UNKNOWN
            } else {
                smooth(&|p| p[0].fract(), xs, ty, 1.0, 0.0)
            }
        }
        "gelu" => {
            let g =
                |p: &[f64]| 0.5 * p[0] * (1.0 + libm::erf(p[0] * std::f64::consts::FRAC_1_SQRT_2));
            lipschitz(smooth(&g, xs, ty, 4.0, 4.0 * x.f.abs()), 1.13 * x.err)
        }
        "gelu_tanh" => {
            let g = |p: &[f64]| {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * p[0] * (1.0 + (k * (p[0] + 0.044715 * p[0] * p[0] * p[0])).tanh())
            };
            lipschitz(smooth(&g, xs, ty, 6.0, 8.0 * x.f.abs()), 1.13 * x.err)
        }
        "log" => smooth(&|p| p[0].ln() / p[1].ln(), xs, ty, 5.0, 0.0),
        "copysign" => V {
            f: x.f.copysign(xs[1].f),
            ..x
        },
        "clamp" => {
            let (lo, hi) = (xs[1], xs[2]);
            let r = if x.f < lo.f {
                lo
            } else if x.f > hi.f {
                hi
            } else {
                x
            };
            // Which of the three is taken must not depend on the errors.
            let which = |a: f64, l: f64, h: f64| {
                if a < l {
                    0
                } else if a > h {
                    1
                } else {
                    2
                }
            };
            let w = which(x.f, lo.f, hi.f);
            let e = x.err + lo.err + hi.err;
            if e > 0.0
                && [(-1.0, 1.0, -1.0), (1.0, -1.0, 1.0)]
                    .iter()
                    .any(|&(sx, sl, sh)| {
                        which(x.f + sx * x.err, lo.f + sl * lo.err, hi.f + sh * hi.err) != w
                    })
            {
                // Near a bound the result is continuous: the bound's and `x`'s errors.
                if x.f.is_nan() {
                    return V::UNKNOWN;
                }
                let f = r.f;
                return finish(f, x.err.max(lo.err).max(hi.err) * 1.5, ty);
            }
            r
        }
        "powi" => {
            let n = xs[1].i;
            // Repeated squaring: each square doubles the relative error of the one before, so
            // `x^n` carries up to `|n| - 1` roundings' worth, and each step one more.
            let bits = (64 - (n.unsigned_abs() as u64).leading_zeros()) as f64;
            let steps = n.unsigned_abs() as f64 + 2.0 * bits + 2.0;
            // A negative power is `1 / x^|n|` (compiler-rt's `__powisf2`): where `x^|n|`
            // overflows the compute type the result is 0, and where it is subnormal the
            // reciprocal has lost bits.
            if n < 0 && x.f.is_finite() {
                let (hi, lo) = match ty {
                    Ty::F64 => (f64::MAX, f64::MIN_POSITIVE),
                    _ => (f32::MAX as f64, f32::MIN_POSITIVE as f64),
                };
                let lo_mag = (x.f.abs() - x.err).max(0.0).powf(-(n as f64));
                let hi_mag = (x.f.abs() + x.err).powf(-(n as f64));
                if lo_mag > hi {
                    return V::float(x.f.powi(n as i32).signum() * 0.0);
                }
                if hi_mag > hi || lo_mag < lo * 2.0 {
                    return V::UNKNOWN;
                }
            }
            let g = move |p: &[f64]| p[0].powi(n as i32);
            let mut v = smooth(&g, &xs[..1], ty, steps, 0.0);
            if v.known() && v.f.is_finite() {
                // Underflowed intermediate squares lose bits, each at most a subnormal's ulp.
                v.err += steps * tiny(ty);
            }
            v
        }
        "is_nan" => V::int(x.f.is_nan() as i128),
        "is_finite" => V::int(x.f.is_finite() as i128),
        "is_infinite" => V::int(x.f.is_infinite() as i128),
        "is_sign_negative" | "is_sign_positive" => {
            // A NaN's sign is the hardware's choice.
            if x.f.is_nan() || (x.err > 0.0 && x.f.abs() <= x.err) {
                V::UNKNOWN
            } else {
                V::int((x.f.is_sign_negative() == (name == "is_sign_negative")) as i128)
            }
        }
        _ => unreachable!("float function {name}"),
    }
}

/// `v` with `extra` more error, where it is a known finite value.
fn lipschitz(mut v: V, extra: f64) -> V {
    if v.known() && v.f.is_finite() {
        v.err += extra;
    }
    v
}

fn int_function(name: &str, ty: Ty, from: Ty, xs: &[V]) -> V {
    let a = xs[0].i;
    let b = bits(from) as i128;
    let unsigned = a & ((1i128 << b) - 1);
    let v = match name {
        "abs" => a.abs(),
        "signum" => a.signum(),
        "max" => a.max(xs[1].i),
        "min" => a.min(xs[1].i),
        "clamp" => {
            if a < xs[1].i {
                xs[1].i
            } else if a > xs[2].i {
                xs[2].i
            } else {
                a
            }
        }
        "pow" => {
            let mut r: i128 = 1;
            let (mut base, mut n) = (wrap(a, from), xs[1].i as u32);
            while n > 0 {
                if n & 1 == 1 {
                    r = wrap(r.wrapping_mul(base), from);
                }
                base = wrap(base.wrapping_mul(base), from);
                n >>= 1;
            }
            r
        }
        "count_ones" => unsigned.count_ones() as i128,
        "leading_zeros" => {
            if unsigned == 0 {
                b
            } else {
                b - (128 - unsigned.leading_zeros() as i128)
            }
        }
        "trailing_zeros" => {
            if unsigned == 0 {
                b
            } else {
                unsigned.trailing_zeros() as i128
            }
        }
        _ => unreachable!("integer function {name}"),
    };
    V::int(wrap(v, ty))
}
