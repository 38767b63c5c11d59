//! The CPU backend's `asinh`, `acosh`, `atanh` and `gelu` at the edges of their domains, in f32
//! and f64: signed zeros, subnormals, ±1e-38, ±1 and the values just inside it (`atanh`), 1
//! and just above it (`acosh`), the largest finite values, infinities and NaN, and a few
//! thousand fresh random inputs of every magnitude. Each result must be within the bound that
//! doc/language.md states ("Error bounds of the functions") of a reference that does not come
//! from the code under test:
//!
//! - f32: libm's f64 functions of the same input, whose own error is far below an f32 ulp;
//! - f64: values computed by mpmath with 300 bits at chosen points ([`KNOWN`]), and on random
//!   inputs formulas arranged so that nothing cancels or overflows, built from std's `ln`,
//!   `ln_1p`, `sqrt` and `exp` (the C library's, not libm's), whose own error is added to the
//!   bound ([`F64_REFERENCE_ULPS`]).
//!
//! A zero result must have the reference's sign, and NaN and the infinities match only
//! themselves. `gelu(-inf)` is NaN, as its formula gives (`-inf * 0`). The special values also
//! run on a GPU (ignored without one) against the same references.

mod common;

use common::*;
use fuse_runtime::{bf16, fuse, Buffer, Device, Error};

fuse! {
    pub fn edges_f32(x: [f32; n]) -> ([f32; n], [f32; n], [f32; n], [f32; n]) {
        (asinh(x), x.acosh(), atanh(x), gelu(x))
    }

    pub fn edges_f64(x: [f64; n]) -> ([f64; n], [f64; n], [f64; n], [f64; n]) {
        (x.asinh(), acosh(x), x.atanh(), gelu(x))
    }

    /// bf16 has f32's range: its largest values meet the f32 functions' overflow.
    pub fn edges_bf16(x: [bf16; n]) -> ([bf16; n], [bf16; n], [bf16; n], [bf16; n]) {
        (asinh(x), acosh(x), atanh(x), gelu(x))
    }
}

/// The functions under test, in the order of the kernels' outputs.
#[derive(Clone, Copy, Debug)]
enum Func {
    Asinh,
    Acosh,
    Atanh,
    Gelu,
}

const FUNCS: [Func; 4] = [Func::Asinh, Func::Acosh, Func::Atanh, Func::Gelu];

impl Func {
    /// The bound of doc/language.md for `T`, in ulps: NVIDIA's for the GPU's function, and for
    /// `gelu` a margin over `erf`'s, which its formula calls.
    fn doc_ulps<T: Float>(self) -> f64 {
        let (f32_ulps, f64_ulps) = match self {
            Func::Asinh => (3.0, 3.0),
            Func::Acosh => (4.0, 3.0),
            Func::Atanh => (3.0, 2.0),
            Func::Gelu => (4.0, 5.0),
        };
        if T::EPSILON > 1e-10 {
            f32_ulps
        } else {
            f64_ulps
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bounds.

/// The spacing of `T`'s values at the magnitude of `w`: the gap above the largest power of two
/// at or below `|w|`, and `T`'s smallest subnormal below its normal range.
fn ulp<T: Float>(w: f64) -> f64 {
    if !w.is_finite() || w == 0.0 {
        return T::TINY;
    }
    let exponent = ((w.abs().to_bits() >> 52) as i32) - 1023;
    (2f64.powi(exponent) * T::EPSILON).max(T::TINY)
}

/// The bound of `gelu(x)` in `T` around the exact `want`, computed as `0.5 * x * (1 + erf(x *
/// FRAC_1_SQRT_2))` with each step rounded: relative to `want` where `x >= 0`, and for `x < 0`
/// also absolute, `0.5 |x|` times the error of `1 + erf` (a few epsilons of 1), which cancels
/// there: the tail's relative accuracy is lost (the documented cost of the form the GPU
/// computes fastest; `erfc` slowed W3 from 93 to 71% of the copy on an H200).
fn gelu_bound<T: Float>(x: f64, want: f64, reference_eps: f64) -> f64 {
    let rel = Func::Gelu.doc_ulps::<T>() + 2.5;
    let floor = 64.0 * T::TINY;
    let cancel = if x < 0.0 {
        0.5 * x.abs() * (rel + 1.0) * T::EPSILON
    } else {
        0.0
    };
    if want == 0.0 || !want.is_finite() {
        return floor + cancel;
    }
    T::EPSILON * rel * want.abs() + reference_eps * want.abs() + floor + cancel
}

/// The bound of `f(x)` in `T` around the reference `want`, whose own error is at most
/// `reference_ulps` ulps of `T`.
fn bound<T: Float>(f: Func, x: f64, want: f64, reference_ulps: f64) -> f64 {
    match f {
        Func::Gelu => gelu_bound::<T>(x, want, reference_ulps * T::EPSILON),
        _ => (f.doc_ulps::<T>() + reference_ulps) * ulp::<T>(want),
    }
}

/// Asserts that `got[i]` is within `bound(i)` of `want[i]`; on failure names `what`, the input,
/// both values and the bound. NaN matches only NaN, an infinity only itself,
/// and a zero result of a zero reference must have its sign.
#[track_caller]
fn assert_within(what: &str, x: &[f64], got: &[f64], want: &[f64], bound: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: number of results");
    for i in 0..got.len() {
        let (g, w, b) = (got[i], want[i], bound(i));
        let same_sign = g.is_sign_negative() == w.is_sign_negative();
        let ok = if w.is_nan() || g.is_nan() || w.is_infinite() || g.is_infinite() {
            g == w || (g.is_nan() && w.is_nan())
        } else if w == 0.0 && g == 0.0 {
            same_sign
        } else {
            (g - w).abs() <= b
        };
        assert!(
            ok,
            "{what}({:e}), element {i}: got {g:e}, want {w:e} within {b:e} (NaN, infinities \
             and the sign of a zero exactly)",
            x[i]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// References.

/// The f32 reference: libm's f64 functions, whose error is far below an f32 ulp, and `gelu`'s
/// formula in f64. libm's `acosh` is defined by a test of its own below 1: for some `x <= -2`
/// it returns finite values.
fn f32_reference(f: Func, x: f64) -> f64 {
    match f {
        Func::Asinh => libm::asinh(x),
        Func::Acosh if x < 1.0 => f64::NAN,
        Func::Acosh => libm::acosh(x),
        Func::Atanh => libm::atanh(x),
        Func::Gelu => 0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2),
    }
}

/// The error of [`f64_reference`], in ulps: each formula adds a few roundings, which `ln_1p`
/// does not amplify (its condition number is at most 1 for a positive argument); for `gelu`,
/// relative, in epsilons. Measured against mpmath: at most 1.7 and 3.
const F64_REFERENCE_ULPS: f64 = 4.0;

/// The f64 reference, from std's (the C library's) `ln`, `ln_1p`, `sqrt` and `exp`.
fn f64_reference(f: Func, x: f64) -> f64 {
    match f {
        Func::Asinh => asinh_reference(x),
        Func::Acosh => acosh_reference(x),
        Func::Atanh => atanh_reference(x),
        Func::Gelu => gelu_reference(x),
    }
}

/// Above 2^28, asinh(|x|) is ln(2|x|) within 2^-58 relative.
const LARGE: f64 = 268_435_456.0;

/// `asinh(|x|) = ln_1p(|x| + x² / (1 + sqrt(1 + x²)))`, whose terms are all positive; past
/// [`LARGE`], `ln|x| + ln 2`, as `x²` would overflow.
fn asinh_reference(x: f64) -> f64 {
    let a = x.abs();
    let r = if a >= LARGE {
        a.ln() + std::f64::consts::LN_2
    } else {
        (a + a * a / (1.0 + (1.0 + a * a).sqrt())).ln_1p()
    };
    r.copysign(x)
}

/// `acosh(x) = ln_1p(t + sqrt(t (t + 2)))` with `t = x - 1` (exact below 2^53); past
/// [`LARGE`], `ln x + ln 2`; NaN below 1.
fn acosh_reference(x: f64) -> f64 {
    if x.is_nan() || x < 1.0 {
        return f64::NAN;
    }
    if x >= LARGE {
        return x.ln() + std::f64::consts::LN_2;
    }
    let t = x - 1.0;
    (t + (t * (t + 2.0)).sqrt()).ln_1p()
}

/// `atanh(|x|) = ln_1p(2|x| / (1 - |x|)) / 2`, whose argument is positive: std's `atanh` takes
/// `ln_1p` near -1 for `x` near -1 instead, where it is ill-conditioned.
fn atanh_reference(x: f64) -> f64 {
    let a = x.abs();
    (0.5 * (2.0 * a / (1.0 - a)).ln_1p()).copysign(x)
}

/// `gelu(x) = x Φ(x)` without `erf` or `erfc`: the tail `Φ(-|x|)` from the normal density and
/// a series (`|x| < 1`) or the Mills ratio (`|x| >= 1`).
fn gelu_reference(x: f64) -> f64 {
    if x.is_infinite() {
        // The formula's values: `inf * 1`, and `-inf * 0`.
        return if x > 0.0 { x } else { f64::NAN };
    }
    let u = x.abs();
    // Past 40 the tail, below 4e-350, is 0 in f64 (and `u²` may overflow).
    let tail = if u > 40.0 {
        0.0
    } else if u < 1.0 {
        0.5 - normal_density(u) * density_series(u)
    } else {
        normal_density(u) * mills_ratio(u)
    };
    if x < 0.0 {
        x * tail
    } else {
        x * (1.0 - tail)
    }
}

/// `exp(-u² / 2) / sqrt(2 pi)`, with `u²` split exactly into a rounded part and the rest, so
/// that its rounding is not amplified by `exp` for large `u`.
fn normal_density(u: f64) -> f64 {
    let square = u * u;
    let rest = u.mul_add(u, -square);
    (-0.5 * square).exp() * (1.0 - 0.5 * rest) * 0.398_942_280_401_432_7
}

/// `Φ(u) - 1/2 = density(u) * (u + u³/3 + u⁵/(3·5) + ...)`; every term is positive.
fn density_series(u: f64) -> f64 {
    let (mut term, mut sum) = (u, u);
    for n in 1..40 {
        term *= u * u / (2 * n + 1) as f64;
        sum += term;
    }
    sum
}

/// `Φ(-u) / density(u) = 1 / (u + 1 / (u + 2 / (u + 3 / (u + ...))))`, the Laplace continued
/// fraction, evaluated from its 2000th term back; converged to f64 for `u >= 1`.
fn mills_ratio(u: f64) -> f64 {
    let mut t = u;
    for k in (1..=2000).rev() {
        t = u + k as f64 / t;
    }
    1.0 / t
}

// Values of the functions in f64 at chosen points, each the correctly rounded value of mpmath's
// with 300 bits (`mpmath.asinh`, `acosh`, `atanh`, and `x * mpmath.ncdf(x)` for `gelu`).

const KNOWN_ASINH: [(f64, f64); 15] = [
    (5e-324, 5e-324),
    (1e-300, 1e-300),
    (1e-08, 1e-08),
    (0.5, 0.48121182505960347),
    (1.0, 0.881373587019543),
    (2.0, 1.4436354751788103),
    (10.0, 2.99822295029797),
    (1e5, 12.206072645555174),
    (1e10, 23.7189981105004),
    (1e150, 346.0809111296668),
    (1.7e308, 710.4199840737882),
    (f64::MAX, 710.475860073944),
    (-3.0, -1.8184464592320668),
    (-1e20, -46.74484904044086),
    (-1.7e308, -710.4199840737882),
];
const KNOWN_ACOSH: [(f64, f64); 11] = [
    (1.0, 0.0),
    (1.0000000000000002, 2.1073424255447014e-08),
    (1.0000001, 0.0004472135919037347),
    (1.5, 0.9624236501192069),
    (2.0, 1.3169578969248168),
    (10.0, 2.993222846126381),
    (1e5, 12.206072645505174),
    (1e10, 23.7189981105004),
    (1e150, 346.0809111296668),
    (1.7e308, 710.4199840737882),
    (f64::MAX, 710.475860073944),
];
const KNOWN_ATANH: [(f64, f64); 11] = [
    (5e-324, 5e-324),
    (1e-300, 1e-300),
    (1e-08, 1e-08),
    (0.25, 0.25541281188299536),
    (0.5, 0.5493061443340549),
    (0.9, 1.4722194895832204),
    (0.99990124, 4.957957846414128),
    (0.9999999999999999, 18.714973875118524),
    (-0.5, -0.5493061443340549),
    (-0.99990124, -4.957957846414128),
    (-0.9999999999999999, -18.714973875118524),
];
/// Negative points included: where `1 + erf` cancels.
const KNOWN_GELU: [(f64, f64); 15] = [
    (1e-300, 5e-301),
    (0.5, 0.34573123063700656),
    (1.0, 0.8413447460685429),
    (3.0, 2.99595030590511),
    (10.0, 10.0),
    (1e10, 1e10),
    (-1e-300, -5e-301),
    (-0.5, -0.15426876936299344),
    (-1.0, -0.15865525393145705),
    (-2.0, -0.04550026389635842),
    (-5.7, -3.414511698606211e-08),
    (-6.0, -5.9195258702261885e-09),
    (-10.0, -7.619853024160526e-23),
    (-20.0, -5.507248237212468e-88),
    (-37.0, -2.1184613523340935e-298),
];

/// Every table of known values, with its function.
const KNOWN: [(Func, &[(f64, f64)]); 4] = [
    (Func::Asinh, &KNOWN_ASINH),
    (Func::Acosh, &KNOWN_ACOSH),
    (Func::Atanh, &KNOWN_ATANH),
    (Func::Gelu, &KNOWN_GELU),
];

// ---------------------------------------------------------------------------------------------
// Inputs.

/// Special points of every type, each taken with both signs: zero, ±1e-38 (subnormal in f32),
/// a point near -1 where std's `atanh` was off by 581 ulps in f32, and points from where
/// `gelu`'s `1 + erf` cancels (-5.7 on) to where it underflows.
const POINTS: [f64; 10] = [0.0, 1e-38, 0.99990124, 0.5, 2.0, 5.7, 6.0, 10.0, 13.0, 30.0];

/// The special values of `T`, each with both signs: [`POINTS`], `extra`, the smallest and a
/// middle subnormal, 1 and its neighbours, the largest finite value and infinity; and NaN.
fn specials<T: Float>(extra: &[f64]) -> Vec<T> {
    let (eps, tiny) = (T::EPSILON, T::TINY);
    let ones = [1.0, 1.0 - eps / 2.0, 1.0 - eps, 1.0 + eps];
    let ends = [tiny, tiny * 12345.0, T::MAX, f64::INFINITY];
    let points = POINTS.iter().chain(extra).chain(&ones).chain(&ends);
    let mut all: Vec<T> = points.flat_map(|&x| [x, -x]).map(T::from_f64).collect();
    all.extend([T::from_f64(f64::NAN), T::from_f64(-f64::NAN)]);
    all
}

/// `n` random inputs of `T` for every function: every magnitude with either sign; near ±1 from
/// inside (`atanh`) and above 1 (`acosh`); and `gelu`'s range from its linear part to where its
/// tail underflows (`x² / 2 = ln(1 / TINY)`).
fn random_inputs<T: Float>(rng: &mut Rng, n: usize) -> Vec<T> {
    let bits = -T::EPSILON.log2();
    let mut v: Vec<T> = rng.floats_wide(n / 4, T::TINY.log2(), T::MAX.log2());
    for _ in 0..n / 4 {
        let below_one = 1.0 - rng.uniform(-bits, -1.0).exp2();
        let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
        v.push(T::from_f64(sign * below_one));
        v.push(T::from_f64(1.0 + rng.uniform(-bits, 8.0).exp2()));
    }
    let underflow = (-2.0 * T::TINY.ln()).sqrt();
    v.extend(rng.floats::<T>(n - v.len(), -underflow - 1.0, 8.0));
    v
}

// ---------------------------------------------------------------------------------------------
// Checks.

/// Runs a kernel of `T` on `dev` and reads each output back as f64.
fn run<T: Float, R: Outputs>(
    dev: &Device,
    kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>,
    x: &[T],
) -> Vec<Vec<f64>> {
    let out = kernel(dev, &put(dev, x, &[x.len()])).expect("run the kernel");
    let read = out.read().into_iter().map(|o| match o.values {
        Values::Float(v) => v,
        Values::Exact(_) => unreachable!("the kernels return floats"),
    });
    read.collect()
}

/// Checks every function of `kernel` on `x` against `reference`, whose own error is at most
/// `reference_ulps`.
fn check<T: Float, R: Outputs>(
    what: &str,
    dev: &Device,
    kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>,
    x: &[T],
    reference: fn(Func, f64) -> f64,
    reference_ulps: f64,
) {
    let got = run(dev, kernel, x);
    let x = f64s(x);
    for (f, got) in FUNCS.iter().zip(&got) {
        let want: Vec<f64> = x.iter().map(|&x| reference(*f, x)).collect();
        let what = format!("{what}: {} {f:?}", T::NAME);
        let bound = |i: usize| bound::<T>(*f, x[i], want[i], reference_ulps);
        assert_within(&what, &x, got, &want, bound);
    }
}

/// Checks the f64 kernel at the points of [`KNOWN`]: within the documented bound and the half
/// ulp of the correctly rounded reference.
fn check_known(dev: &Device) {
    for (f, table) in KNOWN {
        let (x, want): (Vec<f64>, Vec<f64>) = table.iter().copied().unzip();
        let got = &run(dev, edges_f64, &x)[f as usize];
        let bound = |i: usize| bound::<f64>(f, x[i], want[i], 0.5);
        assert_within(&format!("mpmath: f64 {f:?}"), &x, got, &want, bound);
    }
}

#[test]
fn f32_special_values() {
    let x = specials::<f32>(&[3.4e38]);
    check("special", &Device::cpu(), edges_f32, &x, f32_reference, 0.0);
}

#[test]
fn f32_random_inputs() {
    let x = random_inputs::<f32>(&mut Rng::new(), 4000);
    check("random", &Device::cpu(), edges_f32, &x, f32_reference, 0.0);
}

#[test]
fn f64_special_values() {
    let x = specials::<f64>(&[1.7e308]);
    let r = F64_REFERENCE_ULPS;
    check("special", &Device::cpu(), edges_f64, &x, f64_reference, r);
}

#[test]
fn f64_random_inputs() {
    let x = random_inputs::<f64>(&mut Rng::new(), 4000);
    let r = F64_REFERENCE_ULPS;
    check("random", &Device::cpu(), edges_f64, &x, f64_reference, r);
}

#[test]
fn f64_known_values() {
    check_known(&Device::cpu());
}

/// bf16 computes in f32 and rounds once: within about an ulp of bf16 of the f64 value.
#[test]
fn bf16_special_and_random_values() {
    let mut x = specials::<bf16>(&[3.38e38]);
    x.extend(random_inputs::<bf16>(&mut Rng::new(), 1000));
    let got = run(&Device::cpu(), edges_bf16, &x);
    let x = f64s(&x);
    for (f, got) in FUNCS.iter().zip(&got) {
        let want: Vec<f64> = x.iter().map(|&x| f32_reference(*f, x)).collect();
        // gelu's `1 + erf` cancels for x < 0 in the f32 it computes in (see `gelu_bound`).
        let cancel = |i: usize| match f {
            Func::Gelu if x[i] < 0.0 => 4.0 * x[i].abs() * f64::from(f32::EPSILON),
            _ => 0.0,
        };
        let bound = |i: usize| {
            <bf16 as Float>::EPSILON * want[i].abs() + 2.0 * <bf16 as Float>::TINY + cancel(i)
        };
        assert_within(&format!("bf16 {f:?}"), &x, got, &want, bound);
    }
}

/// The special values and the known points on a GPU, against the same references.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_special_values() {
    let Some(gpu) = gpu() else {
        return;
    };
    let x = specials::<f32>(&[3.4e38]);
    check("GPU special", &gpu, edges_f32, &x, f32_reference, 0.0);
    let x = specials::<f64>(&[1.7e308]);
    let r = F64_REFERENCE_ULPS;
    check("GPU special", &gpu, edges_f64, &x, f64_reference, r);
    check_known(&gpu);
}
