//! The language on the CPU backend: every kernel of `common/kernels.rs` run on `Device::cpu()`
//! against float64 (or exact integer) references computed here, on fresh random inputs of many
//! sizes, empty ones included. Also the generated API: the write-into form, scalar outputs of
//! shape `[]`, and shape errors at launch.
//!
//! Tolerances: basic float arithmetic is correctly rounded, so it must equal the f64 result
//! rounded to the element type; transcendental chains are within `Float::math_tol` (1e-5
//! relative for f32); sums within `1e-5 * sum(|x|)` (f32) or `1e-12 * sum(|x|)` (f64); integer
//! and `bool` results exactly.

mod common;

use common::kernels;
use common::*;
use fuse_runtime::{Buffer, Device, Error};

fn map1(x: &[f64], f: impl Fn(f64) -> f64) -> Vec<f64> {
    x.iter().map(|&a| f(a)).collect()
}

fn map2(x: &[f64], y: &[f64], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    x.iter().zip(y).map(|(&a, &b)| f(a, b)).collect()
}

/// The language's `clamp`: never panics, keeps NaN.
fn clamp<T: PartialOrd>(x: T, lo: T, hi: T) -> T {
    if x < lo {
        lo
    } else if x > hi {
        hi
    } else {
        x
    }
}

/// Tolerance of `ulps` roundings of a result whose terms have magnitude `scale`.
fn ulps<T: Float>(scale: &[f64], ulps: f64) -> Tol {
    Tol::Bounds(
        scale
            .iter()
            .map(|s| ulps * T::EPSILON * s + T::TINY)
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// Float kernels, once per float type.

fn float_arith<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let a = rng.floats_special::<T>(n, -100.0, 100.0);
        let b = rng.floats_special::<T>(n, -100.0, 100.0);
        let got = kernel(&dev, &put(&dev, &a, &[n]), &put(&dev, &b, &[n])).unwrap();
        let (a, b) = (f64s(&a), f64s(&b));
        // Each operation is correctly rounded: the f64 result rounded to T, exactly.
        let each = |name, f: fn(f64, f64) -> f64| {
            float(name, &[n], rounded::<T>(&map2(&a, &b, f)), Tol::EXACT)
        };
        let want = [
            each("a + b", |a, b| a + b),
            each("a - b", |a, b| a - b),
            each("a * b", |a, b| a * b),
            each("a / b", |a, b| a / b),
            each("a % b", |a, b| a % b),
            each("-a", |a, _| -a),
        ];
        assert_outputs(&format!("{} arith, n = {n}", T::NAME), &got, &want);
    }
}

fn float_compare<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let a = rng.floats_special::<T>(n, -4.0, 4.0);
        let mut b = rng.floats_special::<T>(n, -4.0, 4.0);
        // Every third pair is equal (unless NaN), so `==` and `<=` see both answers.
        for i in (0..n).step_by(3) {
            b[i] = a[i];
        }
        let got = kernel(&dev, &put(&dev, &a, &[n]), &put(&dev, &b, &[n])).unwrap();
        let (a, b) = (f64s(&a), f64s(&b));
        let each = |name, f: fn(&f64, &f64) -> bool| {
            let v: Vec<bool> = a.iter().zip(&b).map(|(a, b)| f(a, b)).collect();
            exact(name, &[n], &v)
        };
        let want = [
            each("a == b", f64::eq),
            each("a != b", f64::ne),
            each("a < b", f64::lt),
            each("a <= b", f64::le),
            each("a > b", f64::gt),
            each("a >= b", f64::ge),
        ];
        assert_outputs(&format!("{} compare, n = {n}", T::NAME), &got, &want);
    }
}

fn float_literals<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, T) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        // Positive, so that no output cancels to near zero.
        let x = rng.floats::<T>(n, 1.0, 2.0);
        let s = T::from_f64(rng.uniform(2.0, 3.0));
        let got = kernel(&dev, &put(&dev, &x, &[n]), s).unwrap();
        let (x, s) = (f64s(&x), s.into());
        let tol = Tol::close(4.0 * T::EPSILON, 0.0);
        let want = [
            float(
                "x * s + 1 - 0.25 * x",
                &[n],
                map1(&x, |x| x * s + 1.0 - 0.25 * x),
                tol.clone(),
            ),
            // `7 / 2` is an integer division, `7.0 / 2.0` is not.
            float("x * 3 + 3.5", &[n], map1(&x, |x| x * 3.0 + 3.5), tol),
        ];
        assert_outputs(&format!("{} literals, n = {n}", T::NAME), &got, &want);
    }
}

fn float_exp_log<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<T>(n, -3.0, 3.0);
        let p = rng.floats::<T>(n, 0.01, 100.0);
        let got = kernel(&dev, &put(&dev, &x, &[n]), &put(&dev, &p, &[n])).unwrap();
        let (x, p) = (f64s(&x), f64s(&p));
        let f = |name: &str, v: Vec<f64>| float(name, &[n], v, T::math_tol());
        let want = [
            f("exp(x)", map1(&x, f64::exp)),
            f("x.exp2()", map1(&x, f64::exp2)),
            f("exp_m1(x)", map1(&x, f64::exp_m1)),
            f("p.ln()", map1(&p, f64::ln)),
            f("log2(p)", map1(&p, f64::log2)),
            f("p.log10()", map1(&p, f64::log10)),
            f("ln_1p(p)", map1(&p, f64::ln_1p)),
            f("p.sqrt()", map1(&p, f64::sqrt)),
        ];
        assert_outputs(&format!("{} exp_log, n = {n}", T::NAME), &got, &want);
    }
}

fn float_trig<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<T>(n, -3.0, 3.0);
        let u = rng.floats::<T>(n, -0.99, 0.99);
        let y = rng.floats::<T>(n, -3.0, 3.0);
        let (bx, bu, by) = (
            put(&dev, &x, &[n]),
            put(&dev, &u, &[n]),
            put(&dev, &y, &[n]),
        );
        let got = kernel(&dev, &bx, &bu, &by).unwrap();
        let (x, u, y) = (f64s(&x), f64s(&u), f64s(&y));
        let f = |name: &str, v: Vec<f64>| float(name, &[n], v, T::math_tol());
        let want = [
            f("sin(x)", map1(&x, f64::sin)),
            f("x.cos()", map1(&x, f64::cos)),
            f("tan(x)", map1(&x, f64::tan)),
            f("u.asin()", map1(&u, f64::asin)),
            f("acos(u)", map1(&u, f64::acos)),
            f("x.atan()", map1(&x, f64::atan)),
            f("x.atan2(y)", map2(&x, &y, f64::atan2)),
        ];
        assert_outputs(&format!("{} trig, n = {n}", T::NAME), &got, &want);
    }
}

fn float_hyperbolic<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<T>(n, -3.0, 3.0);
        let u = rng.floats::<T>(n, -0.99, 0.99);
        let p = rng.floats::<T>(n, 0.01, 100.0);
        let (bx, bu, bp) = (
            put(&dev, &x, &[n]),
            put(&dev, &u, &[n]),
            put(&dev, &p, &[n]),
        );
        let got = kernel(&dev, &bx, &bu, &bp).unwrap();
        let (x, u) = (f64s(&x), f64s(&u));
        // `p + 1` is rounded to T before `acosh`, as in the kernel.
        let q = rounded::<T>(&map1(&f64s(&p), |p| p + 1.0));
        let f = |name: &str, v: Vec<f64>| float(name, &[n], v, T::math_tol());
        let want = [
            f("x.sinh()", map1(&x, f64::sinh)),
            f("cosh(x)", map1(&x, f64::cosh)),
            f("x.tanh()", map1(&x, f64::tanh)),
            f("asinh(x)", map1(&x, f64::asinh)),
            f("(p + 1).acosh()", map1(&q, f64::acosh)),
            f("atanh(u)", map1(&u, f64::atanh)),
            f("x.cbrt()", map1(&x, f64::cbrt)),
            f("recip(x)", map1(&x, f64::recip)),
        ];
        assert_outputs(&format!("{} hyperbolic, n = {n}", T::NAME), &got, &want);
    }
}

fn float_rounding<T: Float, R: Outputs>(kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let mut x = rng.floats_special::<T>(n, -50.0, 50.0);
        // Every third value is a multiple of 0.5, so that `round` meets ties.
        for i in (0..n).step_by(3) {
            x[i] = T::from_f64((rng.below(200) as f64 - 100.0) / 2.0);
        }
        let got = kernel(&dev, &put(&dev, &x, &[n])).unwrap();
        let x = f64s(&x);
        // The first seven are exact in T; the angle conversions round twice.
        let e = |name, f: fn(f64) -> f64| float(name, &[n], rounded::<T>(&map1(&x, f)), Tol::EXACT);
        let angle = Tol::close(2.0 * T::EPSILON, T::TINY);
        let want = [
            e("x.floor()", f64::floor),
            e("ceil(x)", f64::ceil),
            // `f64::round` rounds half away from zero, as the language's `round`.
            e("round(x)", f64::round),
            e("x.trunc()", f64::trunc),
            e("fract(x)", |x| x - x.trunc()),
            e("x.abs()", f64::abs),
            // Rust's: 1 or -1 by the sign bit, zeros included; NaN stays NaN.
            e(
                "signum(x)",
                |x| if x.is_nan() { x } else { 1f64.copysign(x) },
            ),
            float(
                "x.to_degrees()",
                &[n],
                rounded::<T>(&map1(&x, |x| x * (180.0 / std::f64::consts::PI))),
                angle.clone(),
            ),
            float(
                "to_radians(x)",
                &[n],
                rounded::<T>(&map1(&x, |x| x * (std::f64::consts::PI / 180.0))),
                angle,
            ),
        ];
        assert_outputs(&format!("{} rounding, n = {n}", T::NAME), &got, &want);
    }
}

/// The two-argument float methods; `lo` and `hi` are passed in both orders, since `clamp`
/// must not panic when `lo > hi`.
fn float_binary<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>, &Buffer<T>, i32, T, T) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats_special::<T>(n, -3.0, 3.0);
        let y = rng.floats_special::<T>(n, -3.0, 3.0);
        let p = rng.floats::<T>(n, 0.01, 100.0);
        let k = rng.below(17) as i32 - 8;
        let (lo, hi) = (rng.uniform(-2.0, 0.0), rng.uniform(0.0, 2.0));
        let (bx, by, bp) = (
            put(&dev, &x, &[n]),
            put(&dev, &y, &[n]),
            put(&dev, &p, &[n]),
        );
        let (x, y, p) = (f64s(&x), f64s(&y), f64s(&p));
        for (lo, hi) in [(lo, hi), (hi, lo)] {
            let (lo, hi) = (T::from_f64(lo), T::from_f64(hi));
            let got = kernel(&dev, &bx, &by, &bp, k, lo, hi).unwrap();
            let (lo, hi): (f64, f64) = (lo.into(), hi.into());
            let f = |name: &str, v: Vec<f64>| float(name, &[n], rounded::<T>(&v), T::math_tol());
            let fma: Vec<f64> = (0..n).map(|i| x[i].mul_add(y[i], p[i])).collect();
            let want = [
                f("p.powf(y)", map2(&p, &y, f64::powf)),
                f("x.powi(k)", map1(&x, |x| x.powi(k))),
                f("x.hypot(y)", map2(&x, &y, f64::hypot)),
                f("x.copysign(y)", map2(&x, &y, f64::copysign)),
                // NaN is ignored.
                f("x.max(y)", map2(&x, &y, f64::max)),
                f("x.min(y)", map2(&x, &y, f64::min)),
                f("x.clamp(lo, hi)", map1(&x, |x| clamp(x, lo, hi))),
                f("x.mul_add(y, p)", fma),
            ];
            let what = format!("{} binary, n = {n}, k = {k}, lo = {lo}, hi = {hi}", T::NAME);
            assert_outputs(&what, &got, &want);
        }
    }
}

fn float_powi_each<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<i32>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats_away::<T>(n, 0.5, 2.0);
        let k = rng.ints_in::<i32>(n, -20, 20);
        let got = kernel(&dev, &put(&dev, &x, &[n]), &put(&dev, &k, &[n])).unwrap();
        let want: Vec<f64> = f64s(&x).iter().zip(&k).map(|(x, &k)| x.powi(k)).collect();
        let want = [float("x.powi(k)", &[n], want, T::math_tol())];
        assert_outputs(&format!("{} powi_each, n = {n}", T::NAME), &got, &want);
    }
}

fn float_tests<T: Float, R: Outputs>(kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats_special::<T>(n, -2.0, 2.0);
        let got = kernel(&dev, &put(&dev, &x, &[n])).unwrap();
        let x = f64s(&x);
        let each = |name, f: fn(f64) -> bool| {
            exact(name, &[n], &x.iter().map(|&x| f(x)).collect::<Vec<bool>>())
        };
        let want = [
            each("is_nan(x)", f64::is_nan),
            each("x.is_finite()", f64::is_finite),
            each("x.is_infinite()", f64::is_infinite),
            each("is_sign_negative(x)", f64::is_sign_negative),
            each("x.is_sign_positive()", f64::is_sign_positive),
        ];
        assert_outputs(&format!("{} tests, n = {n}", T::NAME), &got, &want);
    }
}

fn float_ml<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats_special::<T>(n, -6.0, 6.0);
        let p = rng.floats::<T>(n, 0.01, 100.0);
        let got = kernel(&dev, &put(&dev, &x, &[n]), &put(&dev, &p, &[n])).unwrap();
        let (x, p) = (f64s(&x), f64s(&p));
        let f = |name: &str, v: Vec<f64>| float(name, &[n], rounded::<T>(&v), T::math_tol());
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let want = [
            f("sigmoid(x)", map1(&x, |x| 1.0 / (1.0 + (-x).exp()))),
            f("relu(x)", map1(&x, |x| if x < 0.0 { 0.0 } else { x })),
            f(
                "gelu(x)",
                map1(&x, |x| 0.5 * x * (1.0 + libm::erf(x / 2f64.sqrt()))),
            ),
            f(
                "gelu_tanh(x)",
                map1(&x, |x| {
                    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
                }),
            ),
            f("silu(x)", map1(&x, |x| x / (1.0 + (-x).exp()))),
            f(
                "softplus(x)",
                map1(&x, |x| x.max(0.0) + (-x.abs()).exp().ln_1p()),
            ),
            f("erf(x)", map1(&x, libm::erf)),
            f("rsqrt(p)", map1(&p, |p| 1.0 / p.sqrt())),
        ];
        assert_outputs(&format!("{} ml, n = {n}", T::NAME), &got, &want);
    }
}

/// Float to integer: truncation toward zero, saturation at the bounds, NaN to 0.
fn saturate<I: Int>(x: f64) -> i128 {
    if x.is_nan() {
        return 0;
    }
    // Floats beyond i128 saturate there first, then at the bounds of I.
    (x.trunc() as i128).clamp(I::MIN.to_i128(), I::MAX.to_i128())
}

/// Values at and around the bounds of the integer types.
const CAST_EDGES: [f64; 14] = [
    2147483647.5,
    2147483648.0,
    -2147483648.5,
    -2147483649.0,
    4294967295.5,
    4294967296.0,
    9.2233720368547e18,
    9.3e18,
    -9.2233720368547e18,
    -9.3e18,
    1.8446744073709e19,
    1.9e19,
    -0.99,
    -1.5,
];

fn float_casts<T: Float, R: Outputs>(kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let mut x = rng.floats_wide::<T>(n, -4.0, 70.0);
        for v in x.iter_mut() {
            match rng.below(8) {
                0 => *v = T::from_f64(CAST_EDGES[rng.below(14) as usize]),
                1 => *v = T::SPECIALS[rng.below(T::SPECIALS.len() as u64) as usize],
                _ => {}
            }
        }
        let got = kernel(&dev, &put(&dev, &x, &[n])).unwrap();
        let x = f64s(&x);
        let to = |f: fn(f64) -> i128| x.iter().map(|&x| f(x)).collect::<Vec<i128>>();
        let want = [
            exact128("x as i32", &[n], to(saturate::<i32>)),
            exact128("x as u32", &[n], to(saturate::<u32>)),
            exact128("x as i64", &[n], to(saturate::<i64>)),
            exact128("x as u64", &[n], to(saturate::<u64>)),
            float("x as f32", &[n], rounded::<f32>(&x), Tol::EXACT),
            float("x as f64", &[n], x.clone(), Tol::EXACT),
        ];
        assert_outputs(&format!("{} casts, n = {n}", T::NAME), &got, &want);
    }
}

fn float_select<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>, T) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats_special::<T>(n, -3.0, 3.0);
        let y = rng.floats_special::<T>(n, -3.0, 3.0);
        let t = T::from_f64(rng.uniform(0.5, 1.5));
        let got = kernel(&dev, &put(&dev, &x, &[n]), &put(&dev, &y, &[n]), t).unwrap();
        let t: f64 = t.into();
        let pick = |x: f64, y: f64| {
            if x > t {
                x * y
            } else if x < -t {
                y
            } else {
                0.5 * x
            }
        };
        let want = rounded::<T>(&map2(&f64s(&x), &f64s(&y), pick));
        let want = [float(
            "if x > t {..} else if x < -t {..} else {..}",
            &[n],
            want,
            Tol::EXACT,
        )];
        assert_outputs(&format!("{} select, n = {n}", T::NAME), &got, &want);
    }
}

/// The wanted float reductions over `axis` of `x` (sum, max, min, mean) and `y` (prod), of
/// `shape`, each output with the shape `out`.
fn float_folds<T: Float>(
    x: &[T],
    y: &[T],
    shape: &[usize],
    axis: usize,
    out: &[usize],
) -> Vec<Expect> {
    let r = FloatFolds::new(&f64s(x), &f64s(y), shape, axis);
    vec![
        float("sum", out, r.sum, sum_tol::<T>(&r.abs_sum)),
        float("prod", out, r.prod, prod_tol::<T>(shape[axis])),
        float("max", out, r.max, Tol::EXACT),
        float("min", out, r.min, Tol::EXACT),
        float("mean", out, r.mean, mean_tol::<T>(&r.abs_sum, shape[axis])),
    ]
}

fn float_reduce_all<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<T>(n, -10.0, 10.0);
        let y = rng.factors::<T>(n);
        let got = kernel(&dev, &put(&dev, &x, &[n]), &put(&dev, &y, &[n])).unwrap();
        let mut want = float_folds(&x, &y, &[n], 0, &[]);
        let (max, min) = (
            f64s(&x).iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b)),
            f64s(&x).iter().fold(f64::INFINITY, |a, &b| a.min(b)),
        );
        want.push(float(
            "max(x) - min(x)",
            &[],
            rounded::<T>(&[max - min]),
            Tol::EXACT,
        ));
        let xy = rounded::<T>(&map2(&f64s(&x), &f64s(&y), |a, b| a * b));
        want.push(float("x * y", &[n], xy, Tol::EXACT));
        assert_outputs(&format!("{} reduce_all, n = {n}", T::NAME), &got, &want);
    }
}

/// NaN: sums and means become NaN, max and min skip it (all NaN gives their identity).
fn float_reduce_nan<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (n, nans) in [(1, 1), (3, 3), (33, 2), (4097, 40)] {
        let mut x = rng.floats::<T>(n, -10.0, 10.0);
        for _ in 0..nans {
            x[rng.below(n as u64) as usize] = T::SPECIALS[0];
        }
        let y = rng.factors::<T>(n);
        let got = kernel(&dev, &put(&dev, &x, &[n]), &put(&dev, &y, &[n])).unwrap();
        let finite: Vec<f64> = f64s(&x).into_iter().filter(|v| !v.is_nan()).collect();
        let max = finite.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        let min = finite.iter().fold(f64::INFINITY, |a, &b| a.min(b));
        let out = got.read();
        let scalar = |j: usize| match &out[j].values {
            Values::Float(v) => v[0],
            Values::Exact(_) => unreachable!("a float output"),
        };
        let what = format!("{} reduce_all with NaN, n = {n}", T::NAME);
        assert!(
            scalar(0).is_nan(),
            "{what}: sum(x) = {}, want NaN",
            scalar(0)
        );
        assert_eq!((scalar(2), scalar(3)), (max, min), "{what}: max(x), min(x)");
        assert!(
            scalar(4).is_nan(),
            "{what}: mean(x) = {}, want NaN",
            scalar(4)
        );
    }
}

/// The 2-D reductions over `cols` (`rows_kernel`) and over `rows` (`cols_kernel`).
fn float_reduce_2d<T: Float, R: Outputs, C: Outputs>(
    rows_kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
    cols_kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<C, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let s = [rows, cols];
        let x = rng.floats::<T>(rows * cols, -10.0, 10.0);
        let y = rng.factors::<T>(rows * cols);
        let (bx, by) = (put(&dev, &x, &s), put(&dev, &y, &s));
        let got = rows_kernel(&dev, &bx, &by).unwrap();
        let what = format!("{} reduce over cols, {rows} x {cols}", T::NAME);
        assert_outputs(&what, &got, &float_folds(&x, &y, &s, 1, &[rows]));
        let got = cols_kernel(&dev, &bx, &by).unwrap();
        let what = format!("{} reduce over rows, {rows} x {cols}", T::NAME);
        assert_outputs(&what, &got, &float_folds(&x, &y, &s, 0, &[cols]));
    }
}

/// The 3-D reductions over the middle dim `t` and the last dim `c`.
fn float_reduce_3d<T: Float, M: Outputs, L: Outputs>(
    mid_kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<M, Error>,
    last_kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<L, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (b, t, c) in SHAPES_3D {
        let s = [b, t, c];
        let x = rng.floats::<T>(b * t * c, -10.0, 10.0);
        let y = rng.factors::<T>(b * t * c);
        let (bx, by) = (put(&dev, &x, &s), put(&dev, &y, &s));
        let got = mid_kernel(&dev, &bx, &by).unwrap();
        let what = format!("{} reduce over t, {b} x {t} x {c}", T::NAME);
        assert_outputs(&what, &got, &float_folds(&x, &y, &s, 1, &[b, c]));
        let got = last_kernel(&dev, &bx, &by).unwrap();
        let what = format!("{} reduce over c, {b} x {t} x {c}", T::NAME);
        assert_outputs(&what, &got, &float_folds(&x, &y, &s, 2, &[b, t]));
    }
}

macro_rules! float_tests {
    ($module:ident) => {
        mod $module {
            use super::*;
            use kernels::$module;

            #[test]
            fn arith() {
                float_arith($module::arith);
            }

            #[test]
            fn compare() {
                float_compare($module::compare);
            }

            #[test]
            fn literals() {
                float_literals($module::literals);
            }

            #[test]
            fn exp_log() {
                float_exp_log($module::exp_log);
            }

            #[test]
            fn trig() {
                float_trig($module::trig);
            }

            #[test]
            fn hyperbolic() {
                float_hyperbolic($module::hyperbolic);
            }

            #[test]
            fn rounding() {
                float_rounding($module::rounding);
            }

            #[test]
            fn binary() {
                float_binary($module::binary);
            }

            #[test]
            fn powi_each() {
                float_powi_each($module::powi_each);
            }

            #[test]
            fn tests() {
                float_tests($module::tests);
            }

            #[test]
            fn ml() {
                float_ml($module::ml);
            }

            #[test]
            fn casts() {
                float_casts($module::casts);
            }

            #[test]
            fn select() {
                float_select($module::select);
            }

            #[test]
            fn reduce_all() {
                float_reduce_all($module::reduce_all);
            }

            #[test]
            fn reduce_nan() {
                float_reduce_nan($module::reduce_all);
            }

            #[test]
            fn reduce_2d() {
                float_reduce_2d($module::reduce_rows, $module::reduce_cols);
            }

            #[test]
            fn reduce_3d() {
                float_reduce_3d($module::reduce_mid, $module::reduce_last);
            }
        }
    };
}

float_tests!(f32s);
float_tests!(f64s);

// ---------------------------------------------------------------------------------------------
// Integer kernels, once per integer type, against exact references in i128.

fn i128s<T: Int>(v: &[T]) -> Vec<i128> {
    v.iter().map(|&x| x.to_i128()).collect()
}

/// `v` wrapped to `T`, as two's complement arithmetic does.
fn wrap<T: Int>(v: i128) -> i128 {
    T::from_i128(v).to_i128()
}

/// A shift amount as the language takes it: its low bits, masked to the bit width of `T`.
fn amount<T: Int>(s: i128) -> u32 {
    (s as u32) & (T::BITS - 1)
}

/// The bits of `v` as an unsigned number of `T::BITS` bits.
fn bits<T: Int>(v: i128) -> u128 {
    (v as u128) & (u128::MAX >> (128 - T::BITS))
}

fn zip_wrap<T: Int>(a: &[i128], b: &[i128], f: impl Fn(i128, i128) -> i128) -> Vec<i128> {
    a.iter().zip(b).map(|(&a, &b)| wrap::<T>(f(a, b))).collect()
}

fn int_arith<T: Int, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (mut a, mut b) = (rng.ints::<T>(n), rng.ints::<T>(n));
        if n >= 33 {
            // The edges of division: `MIN / -1`, and division by zero.
            let (min, zero, minus_one) = (T::MIN, T::from_i128(0), T::from_i128(-1));
            (a[0], b[0], a[1], b[1], b[2]) = (min, minus_one, min, zero, zero);
        }
        let got = kernel(&dev, &put(&dev, &a, &[n]), &put(&dev, &b, &[n])).unwrap();
        let (a, b) = (i128s(&a), i128s(&b));
        let each = |name, f: fn(i128, i128) -> i128| exact128(name, &[n], zip_wrap::<T>(&a, &b, f));
        let want = [
            each("a + b", |a, b| a + b),
            each("a - b", |a, b| a - b),
            each("a * b", i128::wrapping_mul),
            // Total: `x / 0 == 0`, `x % 0 == x`; `MIN / -1` wraps to MIN, `MIN % -1 == 0`.
            each("a / b", |a, b| if b == 0 { 0 } else { a / b }),
            each("a % b", |a, b| if b == 0 { a } else { a % b }),
        ];
        assert_outputs(&format!("{} arith, n = {n}", T::NAME), &got, &want);
    }
}

fn int_bits<T: Int, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>, &Buffer<u32>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (a, b, s) = (rng.ints::<T>(n), rng.ints::<T>(n), rng.ints::<u32>(n));
        let (ba, bb, bs) = (
            put(&dev, &a, &[n]),
            put(&dev, &b, &[n]),
            put(&dev, &s, &[n]),
        );
        let got = kernel(&dev, &ba, &bb, &bs).unwrap();
        let (a, b, s) = (i128s(&a), i128s(&b), i128s(&s));
        let each = |name, y: &[i128], f: fn(i128, i128) -> i128| {
            exact128(name, &[n], zip_wrap::<T>(&a, y, f))
        };
        let want = [
            each("a & b", &b, |a, b| a & b),
            each("a | b", &b, |a, b| a | b),
            each("a ^ b", &b, |a, b| a ^ b),
            each("!a", &b, |a, _| !a),
            each("a << s", &s, |a, s| a.wrapping_shl(amount::<T>(s))),
            // Arithmetic for signed types: `a` is sign-extended in i128.
            each("a >> s", &s, |a, s| a >> amount::<T>(s)),
            each("a << b", &b, |a, b| a.wrapping_shl(amount::<T>(b))),
            each("a >> b", &b, |a, b| a >> amount::<T>(b)),
        ];
        assert_outputs(&format!("{} bits, n = {n}", T::NAME), &got, &want);
    }
}

fn int_compare<T: Int, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let a = rng.ints::<T>(n);
        let mut b = rng.ints::<T>(n);
        for i in (0..n).step_by(3) {
            b[i] = a[i];
        }
        let got = kernel(&dev, &put(&dev, &a, &[n]), &put(&dev, &b, &[n])).unwrap();
        let each = |name, f: fn(&T, &T) -> bool| {
            exact(
                name,
                &[n],
                &a.iter().zip(&b).map(|(a, b)| f(a, b)).collect::<Vec<_>>(),
            )
        };
        let want = [
            each("a == b", T::eq),
            each("a != b", T::ne),
            each("a < b", T::lt),
            each("a <= b", T::le),
            each("a > b", T::gt),
            each("a >= b", T::ge),
        ];
        assert_outputs(&format!("{} compare, n = {n}", T::NAME), &got, &want);
    }
}

fn int_literals<T: Int, R: Outputs>(kernel: impl Fn(&Device, &Buffer<T>, T) -> Result<R, Error>) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let a = rng.ints::<T>(n);
        let k = rng.ints::<T>(1)[0];
        let got = kernel(&dev, &put(&dev, &a, &[n]), k).unwrap();
        let (a, k) = (i128s(&a), k.to_i128());
        let want = [
            exact128(
                "a * 3 + 1 - k",
                &[n],
                a.iter().map(|&a| wrap::<T>(a * 3 + 1 - k)).collect(),
            ),
            exact128(
                "(a >> 1u32) ^ 5",
                &[n],
                a.iter().map(|&a| wrap::<T>((a >> 1) ^ 5)).collect(),
            ),
        ];
        assert_outputs(&format!("{} literals, n = {n}", T::NAME), &got, &want);
    }
}

/// `a.pow(e)`, wrapping at every step.
fn pow<T: Int>(a: i128, e: i128) -> i128 {
    (0..e).fold(1, |acc, _| wrap::<T>(acc.wrapping_mul(a)))
}

fn int_funcs<T: Int, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>, &Buffer<u32>, T, T) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (a, b) = (rng.ints::<T>(n), rng.ints::<T>(n));
        let e = rng.ints_in::<u32>(n, 0, 70);
        let (ba, bb, be) = (
            put(&dev, &a, &[n]),
            put(&dev, &b, &[n]),
            put(&dev, &e, &[n]),
        );
        let (lo, hi) = {
            let v = rng.ints::<T>(2);
            (v[0].min(v[1]), v[0].max(v[1]))
        };
        let (a, b, e) = (i128s(&a), i128s(&b), i128s(&e));
        for (lo, hi) in [(lo, hi), (hi, lo)] {
            let got = kernel(&dev, &ba, &bb, &be, lo, hi).unwrap();
            let (lo, hi) = (lo.to_i128(), hi.to_i128());
            let each = |name, y: &[i128], f: &dyn Fn(i128, i128) -> i128| {
                exact128(
                    name,
                    &[n],
                    a.iter().zip(y).map(|(&a, &y)| f(a, y)).collect(),
                )
            };
            let width = i128::from(T::BITS);
            let want = [
                each("a.max(b)", &b, &i128::max),
                each("a.min(b)", &b, &i128::min),
                each("a.clamp(lo, hi)", &b, &|a, _| clamp(a, lo, hi)),
                each("a.pow(e)", &e, &pow::<T>),
                each("count_ones(a)", &b, &|a, _| {
                    bits::<T>(a).count_ones().into()
                }),
                each("a.leading_zeros()", &b, &|a, _| {
                    i128::from(bits::<T>(a).leading_zeros()) - (128 - width)
                }),
                each("trailing_zeros(a)", &b, &|a, _| {
                    i128::from(bits::<T>(a).trailing_zeros()).min(width)
                }),
            ];
            let what = format!("{} funcs, n = {n}, lo = {lo}, hi = {hi}", T::NAME);
            assert_outputs(&what, &got, &want);
        }
    }
}

fn int_casts<T: Int, R: Outputs>(kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let a = rng.ints::<T>(n);
        let got = kernel(&dev, &put(&dev, &a, &[n])).unwrap();
        let a = i128s(&a);
        let to = |f: fn(i128) -> i128| a.iter().map(|&a| f(a)).collect::<Vec<_>>();
        // Integer to float rounds to nearest, ties to even (as Rust's `as` from i128).
        let want = [
            exact128("a as i32", &[n], to(wrap::<i32>)),
            exact128("a as u32", &[n], to(wrap::<u32>)),
            exact128("a as i64", &[n], to(wrap::<i64>)),
            exact128("a as u64", &[n], to(wrap::<u64>)),
            float(
                "a as f32",
                &[n],
                a.iter().map(|&a| f64::from(a as f32)).collect(),
                Tol::EXACT,
            ),
            float(
                "a as f64",
                &[n],
                a.iter().map(|&a| a as f64).collect(),
                Tol::EXACT,
            ),
        ];
        assert_outputs(&format!("{} casts, n = {n}", T::NAME), &got, &want);
    }
}

fn int_select<T: Int, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<bool>, &Buffer<T>, &Buffer<T>, T) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (c, a, b, k) = (
            rng.bools(n),
            rng.ints::<T>(n),
            rng.ints::<T>(n),
            rng.ints::<T>(1)[0],
        );
        let (bc, ba, bb) = (
            put(&dev, &c, &[n]),
            put(&dev, &a, &[n]),
            put(&dev, &b, &[n]),
        );
        let got = kernel(&dev, &bc, &ba, &bb, k).unwrap();
        let pick = |i: usize| {
            if c[i] {
                a[i]
            } else if a[i] > b[i] {
                b[i]
            } else {
                k
            }
        };
        let want = [exact(
            "if c {a} else if a > b {b} else {k}",
            &[n],
            &(0..n).map(pick).collect::<Vec<T>>(),
        )];
        assert_outputs(&format!("{} select, n = {n}", T::NAME), &got, &want);
    }
}

/// Integers for reductions: the full range, or all odd (so that products do not collapse to 0).
fn reduce_inputs<T: Int>(rng: &mut Rng, n: usize, odd: bool) -> Vec<T> {
    let v = rng.ints::<T>(n);
    if odd {
        v.into_iter()
            .map(|x| T::from_i128(x.to_i128() | 1))
            .collect()
    } else {
        v
    }
}

/// The wanted integer reductions over `axis` (sum, prod, max, min, wrapping), each of shape `out`.
fn int_folds<T: Int>(x: &[T], shape: &[usize], axis: usize, out: &[usize]) -> Vec<Expect> {
    let x = i128s(x);
    let fold = |init: i128, f: fn(i128, i128) -> i128| {
        fold_axis(&x, shape, axis, init, |a, v| wrap::<T>(f(a, v)))
    };
    vec![
        exact128("sum", out, fold(0, |a, v| a + v)),
        exact128("prod", out, fold(1, i128::wrapping_mul)),
        exact128("max", out, fold(T::MIN.to_i128(), i128::max)),
        exact128("min", out, fold(T::MAX.to_i128(), i128::min)),
    ]
}

fn int_reduce_all<T: Int, R: Outputs>(kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (n, odd) in SIZES.into_iter().flat_map(|n| [(n, false), (n, true)]) {
        let x = reduce_inputs::<T>(&mut rng, n, odd);
        let got = kernel(&dev, &put(&dev, &x, &[n])).unwrap();
        let mut want = int_folds(&x, &[n], 0, &[]);
        let spread = match (&want[2].values, &want[3].values) {
            (Expected::Exact(max), Expected::Exact(min)) => wrap::<T>(max[0] - min[0]),
            _ => unreachable!("integer folds"),
        };
        want.push(exact128("max(x) - min(x)", &[], vec![spread]));
        want.push(exact128(
            "x * 2",
            &[n],
            i128s(&x).iter().map(|&x| wrap::<T>(x * 2)).collect(),
        ));
        assert_outputs(
            &format!("{} reduce_all, n = {n}, odd = {odd}", T::NAME),
            &got,
            &want,
        );
    }
}

fn int_reduce_2d<T: Int, R: Outputs, C: Outputs>(
    rows_kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>,
    cols_kernel: impl Fn(&Device, &Buffer<T>) -> Result<C, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for ((rows, cols), odd) in SHAPES_2D.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let s = [rows, cols];
        let x = reduce_inputs::<T>(&mut rng, rows * cols, odd);
        let bx = put(&dev, &x, &s);
        let what = format!("{} reduce over cols, {rows} x {cols}, odd = {odd}", T::NAME);
        assert_outputs(
            &what,
            &rows_kernel(&dev, &bx).unwrap(),
            &int_folds(&x, &s, 1, &[rows]),
        );
        let what = format!("{} reduce over rows, {rows} x {cols}, odd = {odd}", T::NAME);
        assert_outputs(
            &what,
            &cols_kernel(&dev, &bx).unwrap(),
            &int_folds(&x, &s, 0, &[cols]),
        );
    }
}

fn int_reduce_3d<T: Int, M: Outputs, L: Outputs>(
    mid_kernel: impl Fn(&Device, &Buffer<T>) -> Result<M, Error>,
    last_kernel: impl Fn(&Device, &Buffer<T>) -> Result<L, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for ((b, t, c), odd) in SHAPES_3D.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let s = [b, t, c];
        let x = reduce_inputs::<T>(&mut rng, b * t * c, odd);
        let bx = put(&dev, &x, &s);
        let what = format!("{} reduce over t, {b} x {t} x {c}, odd = {odd}", T::NAME);
        assert_outputs(
            &what,
            &mid_kernel(&dev, &bx).unwrap(),
            &int_folds(&x, &s, 1, &[b, c]),
        );
        let what = format!("{} reduce over c, {b} x {t} x {c}, odd = {odd}", T::NAME);
        assert_outputs(
            &what,
            &last_kernel(&dev, &bx).unwrap(),
            &int_folds(&x, &s, 2, &[b, t]),
        );
    }
}

/// `-a`, `a.abs()` and `signum(a)` of the signed types, wrapping (`MIN.abs() == MIN`).
fn int_signed<T: Int, R: Outputs>(kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let a = rng.ints::<T>(n);
        let got = kernel(&dev, &put(&dev, &a, &[n])).unwrap();
        let a = i128s(&a);
        let each = |name, f: fn(i128) -> i128| {
            exact128(name, &[n], a.iter().map(|&a| wrap::<T>(f(a))).collect())
        };
        let want = [
            each("-a", |a| -a),
            each("a.abs()", i128::abs),
            each("signum(a)", i128::signum),
        ];
        assert_outputs(&format!("{} signed, n = {n}", T::NAME), &got, &want);
    }
}

macro_rules! int_tests {
    ($module:ident $(, $signed:ident)?) => {
        mod $module {
            use super::*;
            use kernels::$module;

            #[test]
            fn arith() {
                int_arith($module::arith);
            }

            #[test]
            fn bits() {
                int_bits($module::bits);
            }

            #[test]
            fn compare() {
                int_compare($module::compare);
            }

            #[test]
            fn literals() {
                int_literals($module::literals);
            }

            #[test]
            fn funcs() {
                int_funcs($module::funcs);
            }

            #[test]
            fn casts() {
                int_casts($module::casts);
            }

            #[test]
            fn select() {
                int_select($module::select);
            }

            #[test]
            fn reduce_all() {
                int_reduce_all($module::reduce_all);
            }

            #[test]
            fn reduce_2d() {
                int_reduce_2d($module::reduce_rows, $module::reduce_cols);
            }

            #[test]
            fn reduce_3d() {
                int_reduce_3d($module::reduce_mid, $module::reduce_last);
            }

            $(
                #[test]
                fn $signed() {
                    int_signed($module::$signed);
                }
            )?
        }
    };
}

int_tests!(i32s, signed);
int_tests!(u32s);
int_tests!(i64s, signed);
int_tests!(u64s);
int_tests!(i8s, signed);
int_tests!(u8s);
int_tests!(i16s, signed);
int_tests!(u16s);

/// Floats around and past the bounds of the narrow integer types, with halves and specials.
fn narrow_castable<T: Float>(rng: &mut Rng, n: usize) -> Vec<T> {
    let mut v = rng.floats_special::<T>(n, -70000.0, 70000.0);
    for (i, x) in v.iter_mut().enumerate() {
        *x = T::from_f64(match i % 4 {
            0 => rng.uniform(-300.0, 300.0),
            1 => (rng.below(1200) as f64 - 600.0) / 2.0,
            _ => (*x).into(),
        });
    }
    v
}

#[test]
fn floats_cast_to_narrow_integers_saturate() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (x, d) = (
            narrow_castable::<f32>(&mut rng, n),
            narrow_castable::<f64>(&mut rng, n),
        );
        let got = kernels::float_to_narrow(&dev, &put(&dev, &x, &[n]), &put(&dev, &d, &[n]));
        // Saturating, toward zero, NaN to 0, computed in f64 and clamped to each type's bounds.
        let to = |v: &[f64], lo: f64, hi: f64| -> Vec<i128> {
            v.iter()
                .map(|&v| {
                    if v.is_nan() {
                        0
                    } else {
                        v.trunc().clamp(lo, hi) as i128
                    }
                })
                .collect()
        };
        let (x, d) = (f64s(&x), f64s(&d));
        let want = [
            exact128("x as i8", &[n], to(&x, -128.0, 127.0)),
            exact128("x as u8", &[n], to(&x, 0.0, 255.0)),
            exact128("x as i16", &[n], to(&x, -32768.0, 32767.0)),
            exact128("x as u16", &[n], to(&x, 0.0, 65535.0)),
            exact128("d as i8", &[n], to(&d, -128.0, 127.0)),
            exact128("d as u8", &[n], to(&d, 0.0, 255.0)),
            exact128("d as i16", &[n], to(&d, -32768.0, 32767.0)),
            exact128("d as u16", &[n], to(&d, 0.0, 65535.0)),
        ];
        assert_outputs(&format!("float_to_narrow, n = {n}"), &got.unwrap(), &want);
    }
}

#[test]
fn integers_cast_to_narrow_integers_wrap() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (i, u) = (rng.ints::<i64>(n), rng.ints::<u32>(n));
        let got = kernels::int_to_narrow(&dev, &put(&dev, &i, &[n]), &put(&dev, &u, &[n]));
        let (i, u) = (i128s(&i), i128s(&u));
        let to = |v: &[i128], f: fn(i128) -> i128| v.iter().map(|&v| f(v)).collect::<Vec<_>>();
        let want = [
            exact128("i as i8", &[n], to(&i, wrap::<i8>)),
            exact128("i as u8", &[n], to(&i, wrap::<u8>)),
            exact128("i as i16", &[n], to(&i, wrap::<i16>)),
            exact128("i as u16", &[n], to(&i, wrap::<u16>)),
            exact128("u as i8", &[n], to(&u, wrap::<i8>)),
            exact128("u as u8", &[n], to(&u, wrap::<u8>)),
            exact128("u as i16", &[n], to(&u, wrap::<i16>)),
            exact128("u as u16", &[n], to(&u, wrap::<u16>)),
        ];
        assert_outputs(&format!("int_to_narrow, n = {n}"), &got.unwrap(), &want);
    }
}

// ---------------------------------------------------------------------------------------------
// `bool` and scalars.

#[test]
fn bool_logic() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (a, b) = (rng.bools(n), rng.bools(n));
        let got = kernels::logic(&dev, &put(&dev, &a, &[n]), &put(&dev, &b, &[n])).unwrap();
        let each = |name, f: fn(bool, bool) -> bool| {
            exact(
                name,
                &[n],
                &a.iter().zip(&b).map(|(&a, &b)| f(a, b)).collect::<Vec<_>>(),
            )
        };
        let want = [
            each("a && b", |a, b| a && b),
            each("a || b", |a, b| a || b),
            each("!a", |a, _| !a),
            each("a & b", |a, b| a & b),
            each("a | b", |a, b| a | b),
            each("a ^ b", |a, b| a ^ b),
            each("a == b", |a, b| a == b),
            each("a != b", |a, b| a != b),
        ];
        assert_outputs(&format!("logic, n = {n}"), &got, &want);
    }
}

#[test]
fn bool_casts_are_zero_or_one() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let a = rng.bools(n);
        let got = kernels::bool_casts(&dev, &put(&dev, &a, &[n])).unwrap();
        let ones: Vec<i128> = a.iter().map(|&a| i128::from(a)).collect();
        let want = ["a as i32", "a as u32", "a as i64", "a as u64"]
            .map(|name| exact128(name, &[n], ones.clone()));
        assert_outputs(&format!("bool_casts, n = {n}"), &got, &want);
    }
}

#[test]
fn bool_scalar_picks_a_tensor() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let (a, b) = (
        rng.floats::<f32>(33, -1.0, 1.0),
        rng.floats::<f32>(33, -1.0, 1.0),
    );
    let (ba, bb) = (put(&dev, &a, &[33]), put(&dev, &b, &[33]));
    assert_eq!(host(&kernels::pick(&dev, true, &ba, &bb).unwrap()), a);
    assert_eq!(host(&kernels::pick(&dev, false, &ba, &bb).unwrap()), b);
}

#[test]
fn bool_counted_per_row() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let a = rng.bools(rows * cols);
        let got = kernels::count_true(&dev, &put(&dev, &a, &[rows, cols])).unwrap();
        let want = fold_axis(&a, &[rows, cols], 1, 0u32, |n, b| n + u32::from(b));
        assert_outputs(
            &format!("count_true, {rows} x {cols}"),
            &got,
            &[exact("sum(a as u32, cols)", &[rows], &want)],
        );
    }
}

#[test]
fn scalar_outputs_have_shape_empty() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let a = rng.floats::<f32>(1, -100.0, 100.0)[0];
    let b = rng.ints::<i64>(1)[0];
    let (x, y, z) = kernels::scalars(&dev, a, b, true).unwrap();
    assert_eq!(
        (x.shape(), y.shape(), z.shape()),
        (&[][..], &[][..], &[][..])
    );
    assert_eq!((x.len(), y.len(), z.len()), (1, 1, 1));
    assert_eq!(host(&x), [a * 2.0 + 1.0]);
    assert_eq!(host(&y), [b.wrapping_mul(3).wrapping_sub(1)]);
    assert_eq!(host(&z), [false]);
    let sum = kernels::sum_exp(&dev, &put(&dev, &[0.0f32, 0.0], &[2])).unwrap();
    assert_eq!((sum.shape(), host(&sum)), (&[][..], vec![2.0]));
}

// ---------------------------------------------------------------------------------------------
// Broadcasting and fixed dims.

/// `x * r + c - s` rounds three times; each term bounds its error.
#[test]
fn broadcast_rows_and_cols() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let x = rng.floats::<f32>(rows * cols, -3.0, 3.0);
        let (r, c) = (
            rng.floats::<f32>(rows, -3.0, 3.0),
            rng.floats::<f32>(cols, -3.0, 3.0),
        );
        let s = rng.uniform(-3.0, 3.0) as f32;
        let (bx, br, bc) = (
            put(&dev, &x, &[rows, cols]),
            put(&dev, &r, &[rows]),
            put(&dev, &c, &[cols]),
        );
        let got = kernels::bcast(&dev, &bx, &br, &bc, s).unwrap();
        let (x, r, c, s) = (f64s(&x), f64s(&r), f64s(&c), f64::from(s));
        let at = |i: usize| (x[i] * r[i / cols], c[i % cols]);
        let want: Vec<f64> = (0..rows * cols).map(|i| at(i).0 + at(i).1 - s).collect();
        let scale: Vec<f64> = (0..rows * cols)
            .map(|i| at(i).0.abs() + at(i).1.abs() + s.abs())
            .collect();
        let want = [float(
            "x * r + c - s",
            &[rows, cols],
            want,
            ulps::<f32>(&scale, 3.0),
        )];
        assert_outputs(&format!("bcast, {rows} x {cols}"), &got, &want);
    }
}

#[test]
fn broadcast_integers() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let x = rng.ints::<i64>(rows * cols);
        let (r, c) = (rng.ints::<i64>(rows), rng.ints::<u32>(cols));
        let (bx, br, bc) = (
            put(&dev, &x, &[rows, cols]),
            put(&dev, &r, &[rows]),
            put(&dev, &c, &[cols]),
        );
        let got = kernels::bcast_int(&dev, &bx, &br, &bc).unwrap();
        let want: Vec<i64> = (0..rows * cols)
            .map(|i| (x[i] ^ r[i / cols]).wrapping_shl(c[i % cols]))
            .collect();
        assert_outputs(
            &format!("bcast_int, {rows} x {cols}"),
            &got,
            &[exact("(x ^ r) << c", &[rows, cols], &want)],
        );
    }
}

#[test]
fn fixed_dims() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<f32>(4 * n, -3.0, 3.0);
        let (w, v) = (
            rng.floats::<f32>(4, -3.0, 3.0),
            rng.floats::<f32>(n, -3.0, 3.0),
        );
        let bx = put(&dev, &x, &[4, n]);
        let got = kernels::fixed(&dev, &bx, &put(&dev, &w, &[4]), &put(&dev, &v, &[n])).unwrap();
        let (x64, w64, v64) = (f64s(&x), f64s(&w), f64s(&v));
        let terms = |i: usize| (x64[i] * w64[i / n], v64[i % n]);
        let want = (0..4 * n).map(|i| terms(i).0 + terms(i).1).collect();
        let scale: Vec<f64> = (0..4 * n)
            .map(|i| terms(i).0.abs() + terms(i).1.abs())
            .collect();
        let want = float("x * w + v", &[4, n], want, ulps::<f32>(&scale, 2.0));
        assert_outputs(&format!("fixed, 4 x {n}"), &got, &[want]);

        let got = kernels::fixed_rows(&dev, &bx).unwrap();
        let abs = fold_axis(&x64, &[4, n], 1, 0.0, |a, v| a + v.abs());
        let want = float(
            "sum(x, n)",
            &[4],
            fold_axis(&x64, &[4, n], 1, 0.0, |a, v| a + v),
            sum_tol::<f32>(&abs),
        );
        assert_outputs(&format!("fixed_rows, 4 x {n}"), &got, &[want]);

        let y = rng.floats::<f64>(n * 3, -3.0, 3.0);
        let w = rng.floats::<f64>(3, -3.0, 3.0);
        let got = kernels::fixed_last(&dev, &put(&dev, &y, &[n, 3]), &put(&dev, &w, &[3])).unwrap();
        let want: Vec<f64> = (0..n * 3).map(|i| y[i] * w[i % 3] - 1.0).collect();
        assert_outputs(
            &format!("fixed_last, {n} x 3"),
            &got,
            &[float("x * w - 1", &[n, 3], want, Tol::EXACT)],
        );
    }
}

#[test]
fn broadcast_3d() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (b, t, c) in SHAPES_3D {
        let x = rng.floats::<f32>(b * t * c, -3.0, 3.0);
        let (bc, tt) = (
            rng.floats::<f32>(b * c, -3.0, 3.0),
            rng.floats::<f32>(t, -3.0, 3.0),
        );
        let (px, pbc, ptt) = (
            put(&dev, &x, &[b, t, c]),
            put(&dev, &bc, &[b, c]),
            put(&dev, &tt, &[t]),
        );
        let got = kernels::bcast3(&dev, &px, &pbc, &ptt).unwrap();
        let bc_of = row_of(&[b, t, c], 1);
        let (x, bc, tt) = (f64s(&x), f64s(&bc), f64s(&tt));
        let terms = |i: usize| (x[i] * bc[bc_of[i]], tt[(i / c) % t]);
        let want = (0..b * t * c).map(|i| terms(i).0 + terms(i).1).collect();
        let scale: Vec<f64> = (0..b * t * c)
            .map(|i| terms(i).0.abs() + terms(i).1.abs())
            .collect();
        let want = float("x * bc + tt", &[b, t, c], want, ulps::<f32>(&scale, 2.0));
        assert_outputs(&format!("bcast3, {b} x {t} x {c}"), &got, &[want]);
    }
}

// ---------------------------------------------------------------------------------------------
// The issue's examples and other reductions whose results broadcast back.

/// Softmax of each row (axis 1) or column (axis 0) of `x`, in f64.
fn softmax_ref(x: &[f64], shape: &[usize], axis: usize) -> Vec<f64> {
    let row = row_of(shape, axis);
    let max = fold_axis(x, shape, axis, f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x
        .iter()
        .zip(&row)
        .map(|(&v, &r)| (v - max[r]).exp())
        .collect();
    let sum = fold_axis(&e, shape, axis, 0.0, |a, v| a + v);
    e.iter().zip(&row).map(|(&v, &r)| v / sum[r]).collect()
}

/// Log-sum-exp of each row over `axis`, in f64.
fn logsumexp_ref(x: &[f64], shape: &[usize], axis: usize) -> Vec<f64> {
    let max = fold_axis(x, shape, axis, f64::NEG_INFINITY, f64::max);
    let row = row_of(shape, axis);
    let e: Vec<f64> = x
        .iter()
        .zip(&row)
        .map(|(&v, &r)| (v - max[r]).exp())
        .collect();
    let sum = fold_axis(&e, shape, axis, 0.0, |a, v| a + v);
    max.iter().zip(&sum).map(|(m, s)| m + s.ln()).collect()
}

/// Rows x cols shapes with odd and prime sizes, for the positional kernels.
const POSITION_SHAPES: [(usize, usize); 5] = [(1, 1), (37, 33), (3, 4097), (31, 1), (2, 0)];

#[test]
fn index_gives_positions() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in POSITION_SHAPES {
        let x = rng.floats::<f32>(rows * cols, -5.0, 5.0);
        let got = kernels::coords(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        let want: Vec<u32> = (0..rows * cols)
            .map(|i| (i / cols * 1000 + i % cols) as u32)
            .collect();
        assert_outputs(
            &format!("coords, {rows} x {cols}"),
            &got,
            &[exact("index", &[rows, cols], &want)],
        );
    }
    for n in SIZES {
        let x = rng.floats::<f32>(n, -5.0, 5.0);
        let got = kernels::index_sum(&dev, &put(&dev, &x, &[n])).unwrap();
        let want = [(n as u64) * (n as u64).saturating_sub(1) / 2];
        assert_outputs(
            &format!("index_sum, n = {n}"),
            &got,
            &[exact("sum(index(n))", &[], &want)],
        );
    }
}

#[test]
fn len_gives_sizes() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in POSITION_SHAPES {
        let x = rng.floats::<f32>(rows * cols, -5.0, 5.0);
        let got = kernels::with_len(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        let want: Vec<f32> = x
            .iter()
            .map(|&v| v / cols as f32 + (rows as u32 * 1000) as f32)
            .collect();
        assert_exact(&format!("with_len {rows} x {cols}"), &host(&got), &want);
        let got = kernels::centered(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        let want: Vec<f64> = x
            .chunks(cols.max(1))
            .flat_map(|row| {
                let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / row.len() as f64;
                row.iter().map(move |&v| f64::from(v) - mean)
            })
            .collect();
        assert_close(
            &format!("centered {rows} x {cols}"),
            &host(&got),
            &want,
            &Tol::close(1e-5, 1e-5),
        );
    }
}

/// `logsumexp(x, cols) - x[row, label]`, in f64, the stable way.
fn cross_entropy_reference(x: &[f64], label: &[i64], cols: usize) -> Vec<f64> {
    x.chunks(cols.max(1))
        .zip(label)
        .map(|(row, &l)| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            lse - row[l as usize]
        })
        .collect()
}

#[test]
fn cross_entropy_with_index_and_logsumexp() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in [(1, 1), (37, 33), (3, 4097), (101, 2)] {
        let x = rng.floats::<f32>(rows * cols, -20.0, 20.0);
        let label: Vec<i64> = (0..rows).map(|_| rng.below(cols as u64) as i64).collect();
        let got = kernels::cross_entropy(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &label, &[rows]),
        )
        .unwrap();
        let want = cross_entropy_reference(&f64s(&x), &label, cols);
        assert_outputs(
            &format!("cross_entropy, {rows} x {cols}"),
            &got,
            &[float("loss", &[rows], want, Tol::close(1e-5, 1e-5))],
        );
    }
}

#[test]
fn logsumexp_is_stable_and_handles_infinities() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let (rows, cols) = (33, 7);
    let mut x: Vec<f64> = rng.floats::<f64>(rows * cols, -700.0, 700.0);
    for r in 0..rows {
        x[r * cols] = 1e300 + r as f64;
    }
    x[cols + 3] = f64::NEG_INFINITY;
    let got = kernels::logsumexp_rows(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
    let want: Vec<f64> = (0..cols)
        .map(|c| {
            let col: Vec<f64> = (0..rows).map(|r| x[r * cols + c]).collect();
            let m = col.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            m + col.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
        })
        .collect();
    assert_outputs(
        "logsumexp over rows",
        &got,
        &[float("lse", &[cols], want, Tol::close(1e-12, 0.0))],
    );
    let inf = kernels::logsumexp_rows(
        &dev,
        &put(
            &dev,
            &[f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY, 1.0],
            &[2, 2],
        ),
    )
    .unwrap();
    assert_eq!(host(&inf), [f64::NEG_INFINITY, f64::INFINITY]);
}

/// The first position of the greatest (`max`) or least element, NaN ignored; `u32::MAX` if none.
fn arg_reference(v: impl Iterator<Item = f64>, max: bool) -> u32 {
    let mut best: Option<(f64, u32)> = None;
    for (i, x) in v.enumerate() {
        let better = |b: f64| if max { x > b } else { x < b };
        if !x.is_nan() && best.is_none_or(|(b, _)| better(b)) {
            best = Some((x, i as u32));
        }
    }
    best.map_or(u32::MAX, |(_, i)| i)
}

#[test]
fn argmax_and_argmin_take_the_first_extreme() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in POSITION_SHAPES {
        let mut x: Vec<f32> = rng
            .ints_in::<i32>(rows * cols, -3, 3)
            .iter()
            .map(|&v| v as f32)
            .collect();
        for i in (0..x.len()).step_by(7) {
            x[i] = f32::NAN;
        }
        let k: Vec<i32> = rng.ints_in::<i32>(rows * cols, -4, 4);
        let got = kernels::arg_rows(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &k, &[rows, cols]),
        )
        .unwrap();
        let row = |r: usize| r * cols..(r + 1) * cols;
        let want = |f: &dyn Fn(usize) -> u32| (0..rows).map(f).collect::<Vec<u32>>();
        let amax = want(&|r| arg_reference(row(r).map(|i| f64::from(x[i])), true));
        let amin = want(&|r| arg_reference(row(r).map(|i| f64::from(x[i])), false));
        let kmin = want(&|r| arg_reference(row(r).map(|i| f64::from(k[i])), false));
        let what = format!("arg_rows, {rows} x {cols}");
        assert_outputs(
            &what,
            &got,
            &[
                exact("argmax", &[rows], &amax),
                exact("argmin", &[rows], &amin),
                exact("argmin k", &[rows], &kmin),
            ],
        );
        let got = kernels::arg_cols(&dev, &put(&dev, &k, &[rows, cols])).unwrap();
        let want: Vec<u32> = (0..cols)
            .map(|c| arg_reference((0..rows).map(|r| f64::from(k[r * cols + c])), true))
            .collect();
        assert_outputs(
            &format!("arg_cols, {rows} x {cols}"),
            &got,
            &[exact("argmax", &[cols], &want)],
        );
    }
}

#[test]
fn outer_product_broadcasts_by_name() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (m, n) in POSITION_SHAPES {
        let (a, b) = (
            rng.floats::<f32>(m, -3.0, 3.0),
            rng.floats::<f32>(n, -3.0, 3.0),
        );
        let got = kernels::outer(&dev, &put(&dev, &a, &[m]), &put(&dev, &b, &[n])).unwrap();
        let want: Vec<f64> = (0..m * n).map(|i| f64::from(a[i / n] * b[i % n])).collect();
        assert_outputs(
            &format!("outer, {m} x {n}"),
            &got,
            &[float("a * b", &[m, n], want, Tol::EXACT)],
        );
    }
}

#[test]
fn log_in_a_base() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<f32>(n, 0.01, 100.0);
        let b = rng.floats::<f32>(n, 1.5, 10.0);
        let got = kernels::log_base(&dev, &put(&dev, &x, &[n]), &put(&dev, &b, &[n])).unwrap();
        let want = map2(&f64s(&x), &f64s(&b), |x, b| x.ln() / b.ln());
        assert_outputs(
            &format!("x.log(b), n = {n}"),
            &got,
            &[float("x.log(b)", &[n], want, f32::math_tol())],
        );
    }
}

#[test]
fn issue_softplus() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<f32>(n, -10.0, 10.0);
        let got = kernels::softplus(&dev, &put(&dev, &x, &[n])).unwrap();
        let want = map1(&f64s(&x), |x| x.exp().ln_1p());
        assert_outputs(
            &format!("softplus, n = {n}"),
            &got,
            &[float("(x.exp() + 1.0).ln()", &[n], want, f32::math_tol())],
        );
    }
}

#[test]
fn issue_sum_exp() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<f32>(n, -5.0, 5.0);
        let got = kernels::sum_exp(&dev, &put(&dev, &x, &[n])).unwrap();
        let e = map1(&f64s(&x), f64::exp);
        let sum: f64 = e.iter().sum();
        assert_outputs(
            &format!("sum_exp, n = {n}"),
            &got,
            &[float(
                "sum(x.exp())",
                &[],
                vec![sum],
                sum_tol::<f32>(&[sum]),
            )],
        );
    }
}

#[test]
fn issue_softmax() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let s = [rows, cols];
        let x = rng.floats::<f32>(rows * cols, -10.0, 10.0);
        let got = kernels::softmax(&dev, &put(&dev, &x, &s)).unwrap();
        let want = float(
            "softmax over cols",
            &s,
            softmax_ref(&f64s(&x), &s, 1),
            f32::math_tol(),
        );
        assert_outputs(&format!("softmax, {rows} x {cols}"), &got, &[want]);

        let got = kernels::col_softmax(&dev, &put(&dev, &x, &s)).unwrap();
        let want = float(
            "softmax over rows",
            &s,
            softmax_ref(&f64s(&x), &s, 0),
            f32::math_tol(),
        );
        assert_outputs(&format!("col_softmax, {rows} x {cols}"), &got, &[want]);

        let got = kernels::softmax_stats(&dev, &put(&dev, &x, &s)).unwrap();
        let x64 = f64s(&x);
        let want = [
            float("softmax", &s, softmax_ref(&x64, &s, 1), f32::math_tol()),
            float(
                "max",
                &[rows],
                fold_axis(&x64, &s, 1, f64::NEG_INFINITY, f64::max),
                Tol::EXACT,
            ),
            float(
                "logsumexp",
                &[rows],
                logsumexp_ref(&x64, &s, 1),
                f32::math_tol(),
            ),
        ];
        assert_outputs(&format!("softmax_stats, {rows} x {cols}"), &got, &want);

        let x = rng.floats::<f64>(rows * cols, -10.0, 10.0);
        let got = kernels::softmax_f64(&dev, &put(&dev, &x, &s)).unwrap();
        let want = float(
            "softmax over cols",
            &s,
            softmax_ref(&x, &s, 1),
            f64::math_tol(),
        );
        assert_outputs(&format!("softmax_f64, {rows} x {cols}"), &got, &[want]);
    }
}

#[test]
fn softmax_3d_middle_and_last() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (b, t, c) in SHAPES_3D {
        let s = [b, t, c];
        let x = rng.floats::<f32>(b * t * c, -10.0, 10.0);
        let x64 = f64s(&x);
        let got = kernels::softmax_mid(&dev, &put(&dev, &x, &s)).unwrap();
        let want = float(
            "softmax over t",
            &s,
            softmax_ref(&x64, &s, 1),
            f32::math_tol(),
        );
        assert_outputs(&format!("softmax_mid, {b} x {t} x {c}"), &got, &[want]);
        let got = kernels::softmax_last(&dev, &put(&dev, &x, &s)).unwrap();
        let want = [
            float(
                "softmax over c",
                &s,
                softmax_ref(&x64, &s, 2),
                f32::math_tol(),
            ),
            float(
                "logsumexp over c",
                &[b, t],
                logsumexp_ref(&x64, &s, 2),
                f32::math_tol(),
            ),
        ];
        assert_outputs(&format!("softmax_last, {b} x {t} x {c}"), &got, &want);
    }
}

/// Per-row mean and `rsqrt(variance + eps)`, in f64.
fn moments(x: &[f64], rows: usize, cols: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let s = [rows, cols];
    let mean: Vec<f64> = fold_axis(x, &s, 1, 0.0, |a, v| a + v)
        .iter()
        .map(|v| v / cols as f64)
        .collect();
    let d2: Vec<f64> = (0..rows * cols)
        .map(|i| (x[i] - mean[i / cols]).powi(2))
        .collect();
    let var = fold_axis(&d2, &s, 1, 0.0, |a, v| a + v);
    (
        mean,
        var.iter()
            .map(|v| 1.0 / (v / cols as f64 + eps).sqrt())
            .collect(),
    )
}

#[test]
fn issue_layernorm() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let s = [rows, cols];
        // Rows with offsets, so that centring matters.
        let offsets: Vec<f64> = (0..rows).map(|_| rng.uniform(-5.0, 5.0)).collect();
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| (rng.uniform(-3.0, 3.0) + offsets[i / cols]) as f32)
            .collect();
        let (g, b) = (
            rng.floats::<f32>(cols, -2.0, 2.0),
            rng.floats::<f32>(cols, -2.0, 2.0),
        );
        let eps = 1e-5f32;
        let (bx, bg, bb) = (
            put(&dev, &x, &s),
            put(&dev, &g, &[cols]),
            put(&dev, &b, &[cols]),
        );
        let got = kernels::layernorm(&dev, &bx, &bg, &bb, eps).unwrap();
        let (x, g, b) = (f64s(&x), f64s(&g), f64s(&b));
        let (mean, rstd) = moments(&x, rows, cols, f64::from(eps));
        let y = (0..rows * cols)
            .map(|i| (x[i] - mean[i / cols]) * rstd[i / cols] * g[i % cols] + b[i % cols]);
        let want = [
            float("y", &s, y.collect(), Tol::close(1e-5, 1e-5)),
            float("rstd", &[rows], rstd, Tol::close(1e-5, 0.0)),
        ];
        assert_outputs(&format!("layernorm, {rows} x {cols}"), &got, &want);
    }
}

/// `(rows, cols)` of the quantize tests: prime numbers of rows; rows of 1, 3 and 33 values, of
/// 4096 (the longest row the GPU caches in registers) and of 4097 (just past it); empty dims.
const QUANTIZE_SHAPES: [(usize, usize); 8] = [
    (37, 33),
    (31, 1),
    (13, 3),
    (7, 4096),
    (5, 4097),
    (1, 4097),
    (0, 5),
    (5, 0),
];

/// Inputs of `layernorm_quantize`: rows with offsets, so that centring matters, and row 1 (when
/// there is one) all one random value, so that its `y` is `beta`.
fn quantize_inputs(rng: &mut Rng, rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let offsets: Vec<f64> = (0..rows).map(|_| rng.uniform(-5.0, 5.0)).collect();
    let constant = rng.uniform(-5.0, 5.0) as f32;
    let x = (0..rows * cols)
        .map(|i| match i / cols {
            1 => constant,
            r => (rng.uniform(-3.0, 3.0) + offsets[r]) as f32,
        })
        .collect();
    let g = rng.floats::<f32>(cols, -2.0, 2.0);
    (x, g, rng.floats::<f32>(cols, -2.0, 2.0))
}

/// Asserts that every `q` lies in [-127, 127], and that each row whose scale is positive
/// reaches ±127 exactly: its largest `|y|` divided by the scale is 127, to an ulp.
#[track_caller]
fn assert_saturated(what: &str, q: &[i8], scale: &[f32], cols: usize) {
    if let Some(i) = q.iter().position(|&v| v == i8::MIN) {
        panic!("{what}: q[{i}] is -128, outside [-127, 127]");
    }
    for (r, row) in q.chunks(cols.max(1)).enumerate() {
        assert!(
            scale[r] <= 0.0 || row.iter().any(|v| v.unsigned_abs() == 127),
            "{what}: row {r} (scale {:e}) never reaches ±127: {row:?}",
            scale[r]
        );
    }
}

/// Asserts that `got` equals `want`, except that an off-by-one is allowed at element `i` where
/// `r[i]` (the value that was rounded) is within `r_tol[i]` of a half-integer: there a
/// difference in `y` as small as the rounding error of f32 can move it across the boundary.
#[track_caller]
fn assert_quantized(what: &str, got: &[i8], want: &[i8], r: &[f64], r_tol: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: number of values");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let to_half = (r[i].abs().fract() - 0.5).abs();
        let near_half = to_half <= r_tol[i] && (i16::from(g) - i16::from(w)).abs() == 1;
        assert!(
            g == w || near_half,
            "{what}: element {i} of {}: got {g}, want {w}; y / scale = {:.9} is {to_half:e} \
             from a half-integer, tolerance {:e}",
            got.len(),
            r[i],
            r_tol[i]
        );
    }
}

/// `round(r)` (halves away from zero, as `f64::round`), clamped to [-127, 127]; NaN is 0.
fn quantize_ref(r: f64) -> i8 {
    if r.is_nan() {
        0
    } else {
        r.round().clamp(-127.0, 127.0) as i8
    }
}

/// W7: layernorm, then int8 quantization per row, against f64.
///
/// `scale` is checked against `max(|y|) / 127` in f64. `q` is checked exactly against
/// `round(y / scale)` with `y` in f64 and `scale` the kernel's own, so that an error in the scale
/// is not counted twice. The kernel's `y` is f32: the CPU rounds the f64 mean once to f32, which
/// shifts `y` by `|mean as f32 - mean| * rstd * |gamma|`, and the rest of the chain rounds a few
/// times (8 ulp of its terms is generous). Where that error, divided by the scale, can carry
/// `y / scale` across a half-integer, `q` may be off by one.
#[test]
fn layernorm_quantize_against_f64() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let eps = 1e-5f32;
    let u = f64::from(f32::EPSILON);
    for (rows, cols) in QUANTIZE_SHAPES {
        let s = [rows, cols];
        let (x, g, b) = quantize_inputs(&mut rng, rows, cols);
        let (bx, bg, bb) = (
            put(&dev, &x, &s),
            put(&dev, &g, &[cols]),
            put(&dev, &b, &[cols]),
        );
        let (q, scale) = kernels::layernorm_quantize(&dev, &bx, &bg, &bb, eps).unwrap();
        let what = format!("layernorm_quantize, {rows} x {cols}");
        assert_eq!((q.shape(), scale.shape()), (&s[..], &[rows][..]), "{what}");
        let (q, scale) = (host(&q), host(&scale));

        let (x, g, b) = (f64s(&x), f64s(&g), f64s(&b));
        let (mean, rstd) = moments(&x, rows, cols, f64::from(eps));
        let (mut y, mut y_err) = (vec![0.0; rows * cols], vec![0.0; rows * cols]);
        for i in 0..rows * cols {
            let (r, c) = (i / cols, i % cols);
            let term = (x[i] - mean[r]) * rstd[r] * g[c];
            let centring = (f64::from(mean[r] as f32) - mean[r]).abs();
            y[i] = term + b[c];
            y_err[i] = centring * rstd[r] * g[c].abs() + 8.0 * u * (term.abs() + b[c].abs());
        }
        let max_abs = fold_axis(&y, &s, 1, f64::NEG_INFINITY, |a, v| a.max(v.abs()));
        let max_err = fold_axis(&y_err, &s, 1, 0.0, f64::max);
        let want_scale: Vec<f64> = max_abs.iter().map(|m| m / 127.0).collect();
        let scale_tol = (0..rows).map(|r| max_err[r] / 127.0 + u * want_scale[r].abs());
        let scale_tol = Tol::Bounds(scale_tol.collect());
        assert_close(&format!("{what}: `scale`"), &scale, &want_scale, &scale_tol);

        let ratio: Vec<f64> = (0..rows * cols)
            .map(|i| y[i] / f64::from(scale[i / cols]))
            .collect();
        let r_tol: Vec<f64> = (0..rows * cols)
            .map(|i| y_err[i] / f64::from(scale[i / cols]) + u * ratio[i].abs() + 1e-6)
            .collect();
        let want: Vec<i8> = ratio.iter().map(|&r| quantize_ref(r)).collect();
        assert_quantized(&format!("{what}: `q`"), &q, &want, &ratio, &r_tol);
        assert_saturated(&what, &q, &scale, cols);
    }
}

/// `beta` values whose quantized values are known exactly: with `gamma` zero, `y` is `beta`,
/// the largest `|beta|` is 127/8, so the scale is 1/8 and `y / scale` is `8 * beta`, exact
/// in f32. Halves round away from zero (`0.5 -> 1`, `2.5 -> 3`, `-126.5 -> -127`), where
/// rounding half to even or truncating would not.
const QUANTIZE_EXACT: [(f32, i8); 14] = [
    (127.0 / 8.0, 127),
    (-127.0 / 8.0, -127),
    (0.5 / 8.0, 1),
    (-0.5 / 8.0, -1),
    (1.5 / 8.0, 2),
    (-1.5 / 8.0, -2),
    (2.5 / 8.0, 3),
    (-2.5 / 8.0, -3),
    (63.5 / 8.0, 64),
    (126.5 / 8.0, 127),
    (-126.5 / 8.0, -127),
    (100.25 / 8.0, 100),
    (-100.75 / 8.0, -101),
    (0.0, 0),
];

#[test]
fn quantize_rounds_halves_away_from_zero() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let (rows, cols) = (3, QUANTIZE_EXACT.len());
    let x = rng.floats::<f32>(rows * cols, -3.0, 3.0);
    let b: Vec<f32> = QUANTIZE_EXACT.iter().map(|&(b, _)| b).collect();
    let got = kernels::layernorm_quantize(
        &dev,
        &put(&dev, &x, &[rows, cols]),
        &put(&dev, &vec![0.0f32; cols], &[cols]),
        &put(&dev, &b, &[cols]),
        1e-5,
    )
    .unwrap();
    let q: Vec<i8> = (0..rows * cols)
        .map(|i| QUANTIZE_EXACT[i % cols].1)
        .collect();
    let want = [
        exact("q", &[rows, cols], &q),
        float("scale", &[rows], vec![0.125; rows], Tol::EXACT),
    ];
    assert_outputs("layernorm_quantize, gamma = 0", &got, &want);
}

#[test]
fn issue_rmsnorm() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let s = [rows, cols];
        let (x, w) = (
            rng.floats::<f32>(rows * cols, -3.0, 3.0),
            rng.floats::<f32>(cols, -2.0, 2.0),
        );
        let eps = 1e-6f32;
        let got = kernels::rmsnorm(&dev, &put(&dev, &x, &s), &put(&dev, &w, &[cols]), eps).unwrap();
        let (x, w) = (f64s(&x), f64s(&w));
        let ms = fold_axis(&x, &s, 1, 0.0, |a, v| a + v * v);
        let r: Vec<f64> = ms
            .iter()
            .map(|m| 1.0 / (m / cols as f64 + f64::from(eps)).sqrt())
            .collect();
        let y = (0..rows * cols)
            .map(|i| x[i] * r[i / cols] * w[i % cols])
            .collect();
        assert_outputs(
            &format!("rmsnorm, {rows} x {cols}"),
            &got,
            &[float("y", &s, y, Tol::close(1e-5, 1e-6))],
        );
    }
}

#[test]
fn issue_bias_grad() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let s = [rows, cols];
        let g = rng.floats::<f32>(rows * cols, -3.0, 3.0);
        let got = kernels::bias_grad(&dev, &put(&dev, &g, &s)).unwrap();
        let g = f64s(&g);
        let abs = fold_axis(&g, &s, 0, 0.0, |a, v| a + v.abs());
        let want = float(
            "sum(g, rows)",
            &[cols],
            fold_axis(&g, &s, 0, 0.0, |a, v| a + v),
            sum_tol::<f32>(&abs),
        );
        assert_outputs(&format!("bias_grad, {rows} x {cols}"), &got, &[want]);
    }
}

#[test]
fn products_summed_per_row_and_column() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let s = [rows, cols];
        let (a, v) = (
            rng.floats::<f32>(rows * cols, -3.0, 3.0),
            rng.floats::<f32>(cols, -3.0, 3.0),
        );
        let got = kernels::matvec(&dev, &put(&dev, &a, &s), &put(&dev, &v, &[cols])).unwrap();
        let av: Vec<f64> = (0..rows * cols)
            .map(|i| f64::from(a[i]) * f64::from(v[i % cols]))
            .collect();
        let abs = fold_axis(&av, &s, 1, 0.0, |a, v| a + v.abs());
        let want = float(
            "sum(a * v, cols)",
            &[rows],
            fold_axis(&av, &s, 1, 0.0, |a, v| a + v),
            sum_tol::<f32>(&abs),
        );
        assert_outputs(&format!("matvec, {rows} x {cols}"), &got, &[want]);

        let (a, u) = (
            rng.floats::<f64>(rows * cols, -3.0, 3.0),
            rng.floats::<f64>(rows, -3.0, 3.0),
        );
        let got = kernels::vecmat(&dev, &put(&dev, &a, &s), &put(&dev, &u, &[rows])).unwrap();
        let au: Vec<f64> = (0..rows * cols).map(|i| a[i] * u[i / cols]).collect();
        let abs = fold_axis(&au, &s, 0, 0.0, |a, v| a + v.abs());
        let want = float(
            "sum(a * u, rows)",
            &[cols],
            fold_axis(&au, &s, 0, 0.0, |a, v| a + v),
            sum_tol::<f64>(&abs),
        );
        assert_outputs(&format!("vecmat, {rows} x {cols}"), &got, &[want]);
    }
}

#[test]
fn column_means_broadcast_back() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let s = [rows, cols];
        let x = rng.floats::<f32>(rows * cols, -3.0, 3.0);
        let got = kernels::center_cols(&dev, &put(&dev, &x, &s)).unwrap();
        let x = f64s(&x);
        let mean: Vec<f64> = fold_axis(&x, &s, 0, 0.0, |a, v| a + v)
            .iter()
            .map(|v| v / rows as f64)
            .collect();
        let centred = (0..rows * cols).map(|i| x[i] - mean[i % cols]).collect();
        let want = [
            float("x - mean(x, rows)", &s, centred, Tol::close(0.0, 4e-6)),
            float("mean(x, rows)", &[cols], mean, Tol::close(0.0, 1e-6)),
        ];
        assert_outputs(&format!("center_cols, {rows} x {cols}"), &got, &want);
    }
}

#[test]
fn comparisons_counted_per_row() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let x = rng.ints::<i32>(rows * cols);
        let got = kernels::count_positive(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        let want = fold_axis(&x, &[rows, cols], 1, 0u32, |n, v| n + u32::from(v > 0));
        let want = [exact("sum((x > 0) as u32, cols)", &[rows], &want)];
        assert_outputs(&format!("count_positive, {rows} x {cols}"), &got, &want);
    }
}

#[test]
fn full_reductions_combined_into_scalars() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let s = rng.uniform(-2.0, 2.0) as f32;
        let got = kernels::norms(&dev, &put(&dev, &x, &[n]), s).unwrap();
        let x64 = f64s(&x);
        let l1: f64 = x64.iter().map(|v| v.abs()).sum();
        let l2: f64 = x64.iter().map(|v| v * v).sum();
        let max = x.iter().fold(f32::NEG_INFINITY, |a, v| a.max(v.abs()));
        let want = [
            float("sum(x.abs())", &[], vec![l1], sum_tol::<f32>(&[l1])),
            float(
                "sum(x * x).sqrt()",
                &[],
                vec![l2.sqrt()],
                Tol::close(1e-5, 0.0),
            ),
            float(
                "max(x.abs()) * s",
                &[],
                vec![f64::from(max * s)],
                Tol::EXACT,
            ),
            float(
                "x * s",
                &[n],
                f64s(&x.iter().map(|v| v * s).collect::<Vec<f32>>()),
                Tol::EXACT,
            ),
        ];
        assert_outputs(&format!("norms, n = {n}"), &got, &want);
    }
    for (rows, cols) in SHAPES_2D {
        let x = rng.floats::<f64>(rows * cols, -3.0, 3.0);
        let got = kernels::total(&dev, &put(&dev, &x, &[rows, cols])).unwrap();
        let (sum, abs): (f64, f64) = (x.iter().sum(), x.iter().map(|v| v.abs()).sum());
        let sq: f64 = x.iter().map(|v| v * v).sum();
        let want = [
            float("sum(x)", &[], vec![sum], sum_tol::<f64>(&[abs])),
            float(
                "min(x)",
                &[],
                vec![x.iter().fold(f64::INFINITY, |a, &b| a.min(b))],
                Tol::EXACT,
            ),
            float(
                "mean(x * x)",
                &[],
                vec![sq / (rows * cols) as f64],
                Tol::close(1e-12, 0.0),
            ),
        ];
        assert_outputs(&format!("total, {rows} x {cols}"), &got, &want);
    }
}

// ---------------------------------------------------------------------------------------------
// The generated API: the write-into form and shape errors.

#[test]
fn into_writes_preallocated_outputs() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let (rows, cols) = (37, 33);
    let s = [rows, cols];
    let x = rng.floats::<f32>(rows * cols, -10.0, 10.0);
    let bx = put(&dev, &x, &s);
    // Outputs start out holding other values, which must all be overwritten.
    let mut out = put(&dev, &vec![f32::NAN; rows * cols], &s);
    kernels::softmax::into(&dev, &bx, &mut out).unwrap();
    assert_eq!(host(&out), host(&kernels::softmax(&dev, &bx).unwrap()));
    assert_close(
        "softmax::into",
        &host(&out),
        &softmax_ref(&f64s(&x), &s, 1),
        &f32::math_tol(),
    );

    let (g, b) = (
        rng.floats::<f32>(cols, -2.0, 2.0),
        rng.floats::<f32>(cols, -2.0, 2.0),
    );
    let (bg, bb) = (put(&dev, &g, &[cols]), put(&dev, &b, &[cols]));
    let mut out0 = put(&dev, &vec![7.0f32; rows * cols], &s);
    let mut out1 = put(&dev, &vec![7.0f32; rows], &[rows]);
    kernels::layernorm::into(&dev, &bx, &bg, &bb, 1e-5, &mut out0, &mut out1).unwrap();
    let (y, rstd) = kernels::layernorm(&dev, &bx, &bg, &bb, 1e-5).unwrap();
    assert_eq!((host(&out0), host(&out1)), (host(&y), host(&rstd)));
    let (_, want_rstd) = moments(&f64s(&x), rows, cols, 1e-5);
    assert_close(
        "layernorm::into rstd",
        &host(&out1),
        &want_rstd,
        &Tol::close(1e-5, 0.0),
    );

    // A scalar output is written into a buffer of shape [].
    let mut total = put(&dev, &[0.0f32], &[]);
    kernels::sum_exp::into(&dev, &put(&dev, &[0.0f32, 0.0, 0.0], &[3]), &mut total).unwrap();
    assert_eq!(host(&total), [3.0]);
}

/// A launch-time error, which must be returned rather than panicking, and its message.
#[track_caller]
fn launch_error<R>(result: Result<R, Error>) -> (Error, String) {
    match result {
        Ok(_) => panic!("the call succeeded, but its shapes are wrong"),
        Err(e) => {
            let text = e.to_string();
            (e, text)
        }
    }
}

/// A shape error's kernel, parameter, dim, expected and found sizes, and binding parameter.
#[track_caller]
fn shape_fields(e: &Error) -> (&str, &str, &str, usize, usize, Option<&str>) {
    match e {
        Error::Shape {
            kernel,
            param,
            dim,
            expected,
            found,
            bound_by,
        } => (kernel, param, dim, *expected, *found, bound_by.as_deref()),
        other => panic!("not a shape error: {other:?}"),
    }
}

/// A rank error's kernel, parameter, and expected and found ranks.
#[track_caller]
fn rank_fields(e: &Error) -> (&str, &str, usize, usize) {
    match e {
        Error::Rank {
            kernel,
            param,
            expected,
            found,
        } => (kernel, param, *expected, *found),
        other => panic!("not a rank error: {other:?}"),
    }
}

/// Asserts that `text` names every one of `parts`.
#[track_caller]
fn assert_names(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{text:?} does not name {part}");
    }
}

#[test]
fn wrong_dims_are_errors_naming_kernel_parameter_and_dim() {
    let dev = Device::cpu();
    let x = put(&dev, &[1.0f32; 6 * 5], &[6, 5]);
    let (g, b) = (put(&dev, &[1.0f32; 5], &[5]), put(&dev, &[0.0f32; 4], &[4]));
    let (e, text) = launch_error(kernels::layernorm(&dev, &x, &g, &b, 1e-5));
    let want = ("layernorm", "beta", "cols", 5, 4, Some("x"));
    assert_eq!(shape_fields(&e), want);
    assert_names(&text, &["`layernorm`", "`beta`", "`cols`", "4", "5", "`x`"]);

    // A wrong rank.
    let (e, text) = launch_error(kernels::softmax(&dev, &g));
    assert_eq!(rank_fields(&e), ("softmax", "x", 2, 1));
    assert_names(&text, &["`softmax`", "`x`", "rank 1", "rank 2"]);

    // A fixed dim of the wrong size.
    let (w5, v) = (put(&dev, &[1.0f32; 5], &[5]), put(&dev, &[1.0f32; 3], &[3]));
    let x43 = put(&dev, &[0.0f32; 12], &[4, 3]);
    let (e, text) = launch_error(kernels::fixed(&dev, &x43, &w5, &v));
    let want = ("fixed", "w", "axis 0 (fixed size 4)", 4, 5, None);
    assert_eq!(shape_fields(&e), want);
    assert_names(&text, &["`fixed`", "`w`", "axis 0", "5", "4"]);

    // Integer kernels and 3-D shapes are checked the same way.
    let a = put(&dev, &[1i64; 24], &[2, 3, 4]);
    let (e, text) = launch_error(kernels::i64s::arith(&dev, &a, &a));
    assert_eq!(rank_fields(&e), ("arith", "a", 1, 3));
    assert_names(&text, &["`arith`", "`a`"]);
    let (x3, bc) = (
        put(&dev, &[0.0f32; 24], &[2, 3, 4]),
        put(&dev, &[0.0f32; 8], &[4, 2]),
    );
    let tt = put(&dev, &[0.0f32; 3], &[3]);
    let (e, text) = launch_error(kernels::bcast3(&dev, &x3, &bc, &tt));
    assert_eq!(shape_fields(&e), ("bcast3", "bc", "b", 2, 4, Some("x")));
    assert_names(&text, &["`bcast3`", "`bc`", "`b`"]);
}

#[test]
fn wrong_output_shapes_in_into_are_errors() {
    let dev = Device::cpu();
    let x = put(&dev, &[1.0f32; 6 * 5], &[6, 5]);
    let mut out = put(&dev, &[0.0f32; 30], &[5, 6]);
    let (e, text) = launch_error(kernels::softmax::into(&dev, &x, &mut out));
    assert_eq!(
        shape_fields(&e),
        ("softmax", "out", "rows", 6, 5, Some("x"))
    );
    assert_names(&text, &["`softmax`", "`out`", "`rows`"]);
    assert_eq!(
        host(&out),
        vec![0.0; 30],
        "a failed call leaves its outputs alone"
    );

    let (g, b) = (put(&dev, &[1.0f32; 5], &[5]), put(&dev, &[0.0f32; 5], &[5]));
    let mut out0 = put(&dev, &[0.0f32; 30], &[6, 5]);
    let mut out1 = put(&dev, &[0.0f32; 5], &[5]);
    let result = kernels::layernorm::into(&dev, &x, &g, &b, 1e-5, &mut out0, &mut out1);
    let (e, text) = launch_error(result);
    assert_eq!(
        shape_fields(&e),
        ("layernorm", "out1", "rows", 6, 5, Some("x"))
    );
    assert_names(&text, &["`layernorm`", "`out1`", "`rows`"]);

    // A scalar output must have shape [], not [1].
    let mut one = put(&dev, &[0.0f32], &[1]);
    let x3 = put(&dev, &[0.0f32; 3], &[3]);
    let (e, text) = launch_error(kernels::sum_exp::into(&dev, &x3, &mut one));
    assert_eq!(rank_fields(&e), ("sum_exp", "out", 0, 1));
    assert_names(&text, &["`sum_exp`", "`out`"]);
}

/// A tensor parameter that no output uses may have dims the launch does not iterate: it is bound
/// and checked, and left out of the loops (the CPU code once named coordinates along its dims).
#[test]
fn unused_parameters_over_other_dims() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (n, m) in [(1usize, 1usize), (7, 3), (1000, 33)] {
        let x = rng.floats::<f32>(n, -4.0, 4.0);
        let spare = rng.floats::<f32>(m, -1.0, 1.0);
        let (xb, sb) = (put(&dev, &x, &[n]), put(&dev, &spare, &[m]));
        let doubled = kernels::unused_map(&dev, &xb, &sb)
            .unwrap()
            .to_vec()
            .unwrap();
        let want: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
        assert_eq!(doubled, want);
        let total = kernels::unused_full(&dev, &sb, &xb)
            .unwrap()
            .to_vec()
            .unwrap();
        let want: f64 = x.iter().map(|&v| v as f64).sum();
        assert!(
            (total[0] as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "{total:?} {want}"
        );
        let (rows, cols) = (n % 5 + 1, m + 2);
        let x = rng.floats::<f32>(rows * cols, -4.0, 4.0);
        let spare = rng.floats::<f32>(3 * m, -1.0, 1.0);
        let sums = kernels::unused_rows(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &spare, &[3, m]),
        )
        .unwrap()
        .to_vec()
        .unwrap();
        for (r, got) in sums.iter().enumerate() {
            let want: f32 = x[r * cols..(r + 1) * cols].iter().sum();
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{got} {want}"
            );
        }
    }
}

#[test]
fn every_kernel_of_the_suite_is_registered() {
    let names: Vec<&str> = fuse_runtime::kernels().map(|k| k.name).collect();
    for name in [
        "softplus",
        "sum_exp",
        "softmax",
        "layernorm",
        "layernorm_quantize",
        "bias_grad",
        "rmsnorm",
        "col_softmax",
        "arith",
        "reduce_mid",
    ] {
        assert!(
            names.contains(&name),
            "`{name}` is not in fuse_runtime::kernels()"
        );
    }
    assert!(
        kernels::layernorm::CUDA_SOURCE.contains("fuse_layernorm"),
        "{}",
        kernels::layernorm::CUDA_SOURCE
    );
}

// ---------------------------------------------------------------------------------------------
// 16-bit floats, once per type: computed in f32 and rounded where stored, so each result is
// the f64 reference rounded to the type, within an ulp where f32 rounded first.

/// One ulp of `T` relative, with a floor at its smallest subnormal.
fn ulp<T: Float>() -> Tol {
    T::math_tol()
}

fn half_arith<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let a = rng.floats_special::<T>(n, -100.0, 100.0);
        let b = rng.floats_special::<T>(n, -100.0, 100.0);
        let got = kernel(&dev, &put(&dev, &a, &[n]), &put(&dev, &b, &[n])).unwrap();
        let (a, b) = (f64s(&a), f64s(&b));
        // f32 has more than twice the bits of f16 and bf16, so rounding an operation to f32 and
        // then to the 16-bit type gives the correctly rounded result.
        let each = |name, f: fn(f64, f64) -> f64| {
            float(name, &[n], rounded::<T>(&map2(&a, &b, f)), Tol::EXACT)
        };
        let want = [
            each("a + b", |a, b| a + b),
            each("a - b", |a, b| a - b),
            each("a * b", |a, b| a * b),
            each("a / b", |a, b| a / b),
            each("a % b", |a, b| a % b),
            each("-a", |a, _| -a),
        ];
        assert_outputs(&format!("{} arith, n = {n}", T::NAME), &got, &want);
    }
}

fn half_chain<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>, T) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (x, b) = (rng.floats::<T>(n, -8.0, 8.0), rng.floats::<T>(n, -8.0, 8.0));
        let s = rng.floats::<T>(1, 0.5, 4.0)[0];
        let got = kernel(&dev, &put(&dev, &x, &[n]), &put(&dev, &b, &[n]), s).unwrap();
        let (x, b, s) = (f64s(&x), f64s(&b), s.into());
        // Rounded once: within an ulp of the exact result (f32 may round `x * s + b` first).
        let squares = rounded::<T>(&map1(&x, |x| x * x));
        let want = [
            float(
                "x * s + b",
                &[n],
                map2(&x, &b, |x, b| x * s + b),
                ulp::<T>(),
            ),
            float(
                "(x * 3 - b) / 2",
                &[n],
                map2(&x, &b, |x, b| (x * 3.0 - b) * 0.5),
                ulp::<T>(),
            ),
            float(
                "((x * x) as T) * 3",
                &[n],
                rounded::<T>(&map1(&squares, |q| q * 3.0)),
                Tol::EXACT,
            ),
        ];
        assert_outputs(&format!("{} chain, n = {n}", T::NAME), &got, &want);
    }
}

fn half_compare<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let a = rng.floats_special::<T>(n, -4.0, 4.0);
        let mut b = rng.floats_special::<T>(n, -4.0, 4.0);
        for i in (0..n).step_by(3) {
            b[i] = a[i];
        }
        let got = kernel(&dev, &put(&dev, &a, &[n]), &put(&dev, &b, &[n])).unwrap();
        let (a, b) = (f64s(&a), f64s(&b));
        let each = |name, f: fn(&f64, &f64) -> bool| {
            let v: Vec<bool> = a.iter().zip(&b).map(|(a, b)| f(a, b)).collect();
            exact(name, &[n], &v)
        };
        let want = [
            each("a == b", f64::eq),
            each("a != b", f64::ne),
            each("a < b", f64::lt),
            each("a <= b", f64::le),
            each("a > b", f64::gt),
            each("a >= b", f64::ge),
        ];
        assert_outputs(&format!("{} compare, n = {n}", T::NAME), &got, &want);
    }
}

fn half_math<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (x, p) = (
            rng.floats::<T>(n, -6.0, 6.0),
            rng.floats::<T>(n, 0.01, 100.0),
        );
        let got = kernel(&dev, &put(&dev, &x, &[n]), &put(&dev, &p, &[n])).unwrap();
        let (x, p) = (f64s(&x), f64s(&p));
        // An ulp, or 1e-6 where f32 cancels (`gelu(-5.5)` is `0.5 * x * (1 + erf)`, near 1e-7).
        let tol = Tol::close(<T as Float>::EPSILON, 1e-6);
        let each = |name, v: &[f64], f: fn(f64) -> f64| float(name, &[n], map1(v, f), tol.clone());
        let want = [
            each("x.exp()", &x, f64::exp),
            each("p.ln()", &p, f64::ln),
            each("sqrt(p)", &p, f64::sqrt),
            each("x.tanh()", &x, f64::tanh),
            each("sigmoid(x)", &x, |x| 1.0 / (1.0 + (-x).exp())),
            each("gelu(x)", &x, |x| {
                0.5 * x * (1.0 + libm::erf(x / 2f64.sqrt()))
            }),
            each("x.sin()", &x, f64::sin),
            each("x.powi(3)", &x, |x| x * x * x),
        ];
        assert_outputs(&format!("{} math, n = {n}", T::NAME), &got, &want);
    }
}

fn half_casts<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>, &Buffer<f32>, &Buffer<i32>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats_special::<T>(n, -300.0, 300.0);
        let f = rng.floats_special::<f32>(n, -70000.0, 70000.0);
        let i = rng.ints::<i32>(n);
        let got = kernel(
            &dev,
            &put(&dev, &x, &[n]),
            &put(&dev, &f, &[n]),
            &put(&dev, &i, &[n]),
        );
        let x = f64s(&x);
        let int = |lo: f64, hi: f64| -> Vec<i128> {
            x.iter()
                .map(|&v| {
                    if v.is_nan() {
                        0
                    } else {
                        v.trunc().clamp(lo, hi) as i128
                    }
                })
                .collect()
        };
        // `as T` rounds the f32 value: integers reach it through f32.
        let through_f32: Vec<f64> = i.iter().map(|&i| f64::from(i as f32)).collect();
        let want = [
            float("x as f32", &[n], x.clone(), Tol::EXACT),
            float("x as f64", &[n], x.clone(), Tol::EXACT),
            exact128("x as i32", &[n], int(i32::MIN.into(), i32::MAX.into())),
            exact128("x as u8", &[n], int(0.0, 255.0)),
            float("f as T", &[n], rounded::<T>(&f64s(&f)), Tol::EXACT),
            float("i as T", &[n], rounded::<T>(&through_f32), Tol::EXACT),
            float("(f as f64) as T", &[n], rounded::<T>(&f64s(&f)), Tol::EXACT),
        ];
        assert_outputs(&format!("{} casts, n = {n}", T::NAME), &got.unwrap(), &want);
    }
}

/// A sum of `T` values: accumulated in f64 on the CPU, rounded once to `T`.
fn half_sum_tol<T: Float>(sum: &[f64], abs_sum: &[f64]) -> Tol {
    let bound = |(s, a): (&f64, &f64)| <T as Float>::EPSILON * s.abs() + 1e-12 * a + T::TINY;
    Tol::Bounds(sum.iter().zip(abs_sum).map(bound).collect())
}

fn half_reduce_all<T: Float, R: Outputs>(kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<T>(n, -10.0, 10.0);
        let got = kernel(&dev, &put(&dev, &x, &[n])).unwrap();
        let folds = FloatFolds::new(&f64s(&x), &f64s(&x), &[n], 0);
        let want = [
            float(
                "sum(x)",
                &[],
                folds.sum.clone(),
                half_sum_tol::<T>(&folds.sum, &folds.abs_sum),
            ),
            float("max(x)", &[], folds.max.clone(), Tol::EXACT),
            float("min(x)", &[], folds.min.clone(), Tol::EXACT),
            float(
                "mean(x)",
                &[],
                folds.mean.clone(),
                half_sum_tol::<T>(&folds.mean, &[0.0]),
            ),
            float(
                "sum(x as f32)",
                &[],
                folds.sum.clone(),
                sum_tol::<f32>(&folds.abs_sum),
            ),
        ];
        assert_outputs(&format!("{} reduce_all, n = {n}", T::NAME), &got, &want);
    }
}

fn half_reduce_2d<T: Float, R: Outputs, C: Outputs>(
    rows_kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>,
    cols_kernel: impl Fn(&Device, &Buffer<T>) -> Result<C, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D {
        let s = [rows, cols];
        let x = rng.floats::<T>(rows * cols, -10.0, 10.0);
        let bx = put(&dev, &x, &s);
        let x = f64s(&x);
        let r = FloatFolds::new(&x, &x, &s, 1);
        let lse: Vec<f64> = fold_axis(&x, &s, 1, 0.0, |a, v| a + v.exp())
            .iter()
            .map(|v| v.ln())
            .collect();
        let want = [
            float(
                "sum(x, cols)",
                &[rows],
                r.sum.clone(),
                half_sum_tol::<T>(&r.sum, &r.abs_sum),
            ),
            float("max(x, cols)", &[rows], r.max.clone(), Tol::EXACT),
            float(
                "mean(x, cols)",
                &[rows],
                r.mean.clone(),
                half_sum_tol::<T>(&r.mean, &r.abs_sum),
            ),
            float("logsumexp(x, cols)", &[rows], lse, ulp::<T>()),
        ];
        let what = format!("{} reduce over cols, {rows} x {cols}", T::NAME);
        assert_outputs(&what, &rows_kernel(&dev, &bx).unwrap(), &want);
        let c = FloatFolds::new(&x, &x, &s, 0);
        let argmax = fold_axis(
            &x,
            &s,
            0,
            (0u32, f64::NEG_INFINITY, u32::MAX),
            |(k, best, at), v| {
                if v > best {
                    (k + 1, v, k)
                } else {
                    (k + 1, best, at)
                }
            },
        );
        let want = [
            float(
                "sum(x, rows)",
                &[cols],
                c.sum.clone(),
                half_sum_tol::<T>(&c.sum, &c.abs_sum),
            ),
            float("min(x, rows)", &[cols], c.min.clone(), Tol::EXACT),
            exact(
                "argmax(x, rows)",
                &[cols],
                &argmax.iter().map(|a| a.2).collect::<Vec<u32>>(),
            ),
        ];
        let what = format!("{} reduce over rows, {rows} x {cols}", T::NAME);
        assert_outputs(&what, &cols_kernel(&dev, &bx).unwrap(), &want);
    }
}

fn half_rows<T: Float, S: Outputs, L: Outputs>(
    softmax: impl Fn(&Device, &Buffer<T>) -> Result<S, Error>,
    layernorm: impl Fn(&Device, &Buffer<T>, &Buffer<T>, T) -> Result<L, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in SHAPES_2D.into_iter().chain([(3, 64), (2, 1000)]) {
        let s = [rows, cols];
        let (x, g) = (
            rng.floats::<T>(rows * cols, -4.0, 4.0),
            rng.floats::<T>(cols, 0.5, 2.0),
        );
        let eps = T::from_f64(1e-3);
        let (bx, bg) = (put(&dev, &x, &s), put(&dev, &g, &[cols]));
        let (x, g, eps) = (f64s(&x), f64s(&g), eps.into());
        let row = row_of(&s, 1);
        let max = fold_axis(&x, &s, 1, f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x
            .iter()
            .zip(&row)
            .map(|(v, &r)| (v - max[r]).exp())
            .collect();
        let total = fold_axis(&e, &s, 1, 0.0, |a, v| a + v);
        let want = e.iter().zip(&row).map(|(e, &r)| e / total[r]).collect();
        let what = format!("{} softmax, {rows} x {cols}", T::NAME);
        assert_outputs(
            &what,
            &softmax(&dev, &bx).unwrap(),
            &[float("softmax", &s, want, ulp::<T>())],
        );
        let mean: Vec<f64> = fold_axis(&x, &s, 1, 0.0, |a, v| a + v)
            .iter()
            .map(|v| v / cols as f64)
            .collect();
        let d: Vec<f64> = x.iter().zip(&row).map(|(v, &r)| v - mean[r]).collect();
        let var = fold_axis(&d, &s, 1, 0.0, |a, v| a + v * v);
        let rstd: Vec<f64> = var
            .iter()
            .map(|v| 1.0 / (v / cols as f64 + eps).sqrt())
            .collect();
        let y = d
            .iter()
            .enumerate()
            .map(|(i, d)| d * rstd[row[i]] * g[i % cols.max(1)])
            .collect();
        // An ulp of the result, and f32's own error on the normalized values (about 1e-6).
        let tol = Tol::close(<T as Float>::EPSILON, 1e-5);
        let want = [
            float("y", &s, y, tol),
            float("rstd", &[rows], rstd, Tol::close(1e-5, 0.0)),
        ];
        let what = format!("{} layernorm, {rows} x {cols}", T::NAME);
        assert_outputs(
            &what,
            &layernorm(&dev, &bx, &bg, T::from_f64(1e-3)).unwrap(),
            &want,
        );
    }
}

macro_rules! half_tests {
    ($module:ident) => {
        mod $module {
            use super::*;
            use kernels::$module;

            #[test]
            fn arith() {
                half_arith($module::arith);
            }

            #[test]
            fn chain() {
                half_chain($module::chain);
            }

            #[test]
            fn compare() {
                half_compare($module::compare);
            }

            #[test]
            fn math() {
                half_math($module::math);
            }

            #[test]
            fn casts() {
                half_casts($module::casts);
            }

            #[test]
            fn reduce_all() {
                half_reduce_all($module::reduce_all);
            }

            #[test]
            fn reduce_2d() {
                half_reduce_2d($module::reduce_rows, $module::reduce_cols);
            }

            #[test]
            fn rows() {
                half_rows($module::softmax, $module::layernorm);
            }
        }
    };
}

half_tests!(f16s);
half_tests!(bf16s);

#[test]
fn halfs_convert_through_f32() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let h = rng.floats_special::<fuse_runtime::f16>(n, -1000.0, 1000.0);
        let b = rng.floats_special::<fuse_runtime::bf16>(n, -1000.0, 1000.0);
        let got = kernels::halfs(&dev, &put(&dev, &h, &[n]), &put(&dev, &b, &[n])).unwrap();
        let want = [
            float(
                "h as bf16",
                &[n],
                rounded::<fuse_runtime::bf16>(&f64s(&h)),
                Tol::EXACT,
            ),
            float(
                "b as f16",
                &[n],
                rounded::<fuse_runtime::f16>(&f64s(&b)),
                Tol::EXACT,
            ),
        ];
        assert_outputs(&format!("halfs, n = {n}"), &got, &want);
    }
}

// ---------------------------------------------------------------------------------------------
// Random numbers: each element's draw is `fuse_runtime::random` at its position and stream,
// bit for bit.

use fuse_runtime::random::{normal, uniform};

/// `dropout` of one f64 element, whose uniform draw is `u`.
fn dropped(x: f64, u: f32, p: f64) -> f64 {
    if f64::from(u) < p {
        0.0
    } else {
        x * (1.0 / (1.0 - p))
    }
}

/// `dropout` of one f32 element, in f32 as the kernel computes it.
fn dropped32(x: f32, u: f32, p: f32) -> f32 {
    if u < p {
        0.0
    } else {
        x * (1.0 / (1.0 - p))
    }
}

#[test]
fn random_values_are_drawn_at_their_positions() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in POSITION_SHAPES {
        let seed = rng.next_u64();
        let n = rows * cols;
        let x = rng.floats::<f32>(n, -3.0, 3.0);
        let got = kernels::noise(&dev, &put(&dev, &x, &[rows, cols]), seed).unwrap();
        let at = |i: usize| i as u64;
        let u: Vec<f32> = (0..n).map(|i| uniform(seed, at(i), 0)).collect();
        let z: Vec<f32> = (0..n).map(|i| x[i] + normal(seed, at(i), 1)).collect();
        let d: Vec<f32> = (0..n)
            .map(|i| dropped32(x[i], uniform(seed, at(i), 2), 0.25))
            .collect();
        assert_outputs(
            &format!("noise, {rows} x {cols}"),
            &got,
            &[
                float("rand", &[rows, cols], f64s(&u), Tol::EXACT),
                float("x + randn", &[rows, cols], f64s(&z), Tol::EXACT),
                float("dropout", &[rows, cols], f64s(&d), Tol::EXACT),
            ],
        );
        let b = rng.floats::<f32>(rows, -3.0, 3.0);
        let got = kernels::row_noise(
            &dev,
            &put(&dev, &x, &[rows, cols]),
            &put(&dev, &b, &[rows]),
            seed,
        )
        .unwrap();
        let want: Vec<f32> = (0..n)
            .map(|i| x[i] + b[i / cols] * uniform(seed, (i / cols) as u64, 0))
            .collect();
        assert_outputs(
            &format!("row_noise, {rows} x {cols}"),
            &got,
            &[float(
                "x + b * rand",
                &[rows, cols],
                f64s(&want),
                Tol::EXACT,
            )],
        );
    }
}

#[test]
fn random_values_in_reductions() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (rows, cols) in POSITION_SHAPES {
        if cols == 0 {
            continue;
        }
        let seed = rng.next_u64();
        let x = rng.floats::<f32>(rows * cols, -5.0, 5.0);
        let got = kernels::softmax_dropout(&dev, &put(&dev, &x, &[rows, cols]), 0.3, seed).unwrap();
        let (mut y, mut m) = (vec![], vec![]);
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
            for (c, &v) in row.iter().enumerate() {
                let i = (r * cols + c) as u64;
                let soft = f64::from(v - max).exp() / sum;
                y.push(dropped(soft, uniform(seed, i, 0), f64::from(0.3f32)));
            }
            m.push(f64::from(max) + f64::from(normal(seed, r as u64, 1)));
        }
        assert_outputs(
            &format!("softmax_dropout, {rows} x {cols}"),
            &got,
            &[
                float("dropout(softmax)", &[rows, cols], y, Tol::close(1e-5, 1e-6)),
                float("max + randn", &[rows], m, Tol::close(1e-6, 1e-6)),
            ],
        );
    }
    for n in SIZES {
        let seed = rng.next_u64();
        let x = rng.floats::<f64>(n, -3.0, 3.0);
        let p = rng.floats::<f64>(n, 0.0, 1.0);
        let got =
            kernels::noisy_sum(&dev, &put(&dev, &x, &[n]), &put(&dev, &p, &[n]), seed).unwrap();
        let d: Vec<f64> = (0..n)
            .map(|i| dropped(x[i], uniform(seed, i as u64, 0), p[i]))
            .collect();
        let terms: Vec<f64> = (0..n)
            .map(|i| x[i] * f64::from(normal(seed, i as u64, 1)))
            .collect();
        let abs: f64 = terms.iter().map(|t| t.abs()).sum();
        assert_outputs(
            &format!("noisy_sum, {n}"),
            &got,
            &[
                float("dropout", &[n], d, Tol::EXACT),
                float("sum", &[], vec![terms.iter().sum()], sum_tol::<f64>(&[abs])),
            ],
        );
    }
}

#[test]
fn dropout_keeps_about_one_minus_p() {
    let dev = Device::cpu();
    let (rows, cols) = (256, 1024);
    let x = vec![1.0f32; rows * cols];
    let got = kernels::noise(&dev, &put(&dev, &x, &[rows, cols]), 7).unwrap();
    let kept = host(&got.2).iter().filter(|&&v| v != 0.0).count();
    let frac = kept as f64 / (rows * cols) as f64;
    assert!((frac - 0.75).abs() < 0.005, "kept {frac}");
    assert!(host(&got.2).iter().all(|&v| v == 0.0 || v == 1.0 / 0.75f32));
    let again = kernels::noise(&dev, &put(&dev, &x, &[rows, cols]), 7).unwrap();
    assert_eq!(
        host(&got.0),
        host(&again.0),
        "the same seed draws the same numbers"
    );
    let other = kernels::noise(&dev, &put(&dev, &x, &[rows, cols]), 8).unwrap();
    assert_ne!(host(&got.0), host(&other.0));
}

/// `#[fast_math]` changes only the GPU: the CPU backend computes the accurate functions.
#[test]
fn fast_math_kernels_are_accurate_on_the_cpu() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<f32>(n, -3.1, 3.1);
        let y = rng.floats::<f32>(n, 0.5, 2.0);
        let got =
            kernels::fast_functions(&dev, &put(&dev, &x, &[n]), &put(&dev, &y, &[n])).unwrap();
        let (x, y) = (f64s(&x), f64s(&y));
        let f = |name: &str, v: Vec<f64>| float(name, &[n], v, f32::math_tol());
        assert_outputs(
            &format!("fast_functions, {n}"),
            &got,
            &[
                f("exp", map1(&x, f64::exp)),
                f("ln", map1(&y, f64::ln)),
                f("log2", map1(&y, f64::log2)),
                f("sin", map1(&x, f64::sin)),
                f("cos", map1(&x, f64::cos)),
                f("sigmoid", map1(&x, |a| 1.0 / (1.0 + (-a).exp()))),
                f("powf", map2(&y, &x, f64::powf)),
                float(
                    "sqrt",
                    &[n],
                    rounded::<f32>(&map1(&y, f64::sqrt)),
                    Tol::EXACT,
                ),
            ],
        );
    }
}

/// `logsumexp(e)` over every element, against f64 `m + ln(sum(exp(x - m)))`, with the special
/// values: empty and all `-inf` give `-inf`, any `inf` gives `inf`, NaN gives NaN.
#[test]
fn logsumexp_over_every_element() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let reference = |x: &[f64]| {
        let m = x.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        if m.is_infinite() {
            return m;
        }
        m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
    };
    for n in SIZES {
        let x = rng.floats::<f32>(n, -30.0, 30.0);
        let shifted: Vec<f32> = x.iter().map(|v| v + 500.0).collect();
        for x in [x, shifted] {
            let got = kernels::logsumexp_all(&dev, &put(&dev, &x, &[n])).unwrap();
            let xs = f64s(&x);
            let want = reference(&xs);
            let abs: f64 = xs.iter().map(|v| v.abs()).sum();
            assert_outputs(
                &format!("logsumexp_all, {n}"),
                &got,
                &[
                    float("logsumexp", &[], vec![want], Tol::close(1e-6, 0.0)),
                    float("sum", &[], vec![xs.iter().sum()], sum_tol::<f32>(&[abs])),
                ],
            );
        }
    }
    let x = rng.floats::<f64>(37 * 33, -300.0, 300.0);
    let got = kernels::logsumexp_all_f64(&dev, &put(&dev, &x, &[37, 33])).unwrap();
    let doubled: Vec<f64> = x.iter().map(|v| v * 2.0).collect();
    assert_outputs(
        "logsumexp_all_f64",
        &got,
        &[float(
            "logsumexp",
            &[],
            vec![reference(&doubled)],
            Tol::close(1e-14, 0.0),
        )],
    );
    let inf = f32::INFINITY;
    for (x, want) in [
        (vec![-inf, -inf], f32::NEG_INFINITY),
        (vec![1.0, inf, 2.0], inf),
        (vec![inf, -inf, inf], inf),
        (vec![1.0, f32::NAN, -inf], f32::NAN),
    ] {
        let got = kernels::logsumexp_all(&dev, &put(&dev, &x, &[x.len()])).unwrap();
        let v = host(&got.0)[0];
        assert!(v == want || (v.is_nan() && want.is_nan()), "{x:?}: {v}");
    }
}

// ---------------------------------------------------------------------------------------------
// Issue 22: `round_ties_even`, the constants of the element types, constant indexing (`w[0]`),
// and parameters that nothing uses.

/// `round_ties_even` as method and function: to nearest, halves to even, exactly std's, on
/// values of which every other one is a multiple of 0.5.
fn extras_ties_even<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let mut x = rng.floats_special::<T>(n, -50.0, 50.0);
        for i in (0..n).step_by(2) {
            x[i] = T::from_f64((rng.below(201) as f64 - 100.0) / 2.0);
        }
        // At least one tie the two roundings send different ways (about one draw in a hundred
        // of 31 values had none).
        if let Some(v) = x.first_mut() {
            *v = T::from_f64(-2.5);
        }
        let got = kernel(&dev, &put(&dev, &x, &[n])).unwrap();
        let x = f64s(&x);
        // Ties that the two roundings send different ways are there (so this tests the rule).
        let ties = x
            .iter()
            .filter(|v| v.round() != v.round_ties_even())
            .count();
        assert!(n < 31 || ties > 0, "no ties among {n} values");
        let want = rounded::<T>(&map1(&x, f64::round_ties_even));
        let e = |name| float(name, &[n], want.clone(), Tol::EXACT);
        let what = format!("{} round_ties_even, n = {n}", T::NAME);
        assert_outputs(
            &what,
            &got,
            &[e("x.round_ties_even()"), e("round_ties_even(x)")],
        );
    }
}

/// Every float constant as a scalar output, exactly: `[MAX, MIN_POSITIVE, EPSILON]` of `T`
/// from std or `half`, and NaN and the infinities.
fn extras_constants<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>,
    [max, min_positive, epsilon]: [f64; 3],
) {
    let dev = Device::cpu();
    let x = Rng::new().floats::<T>(5, -1.0, 1.0);
    let got = kernel(&dev, &put(&dev, &x, &[5])).unwrap();
    let c = |name, v: f64| float(name, &[], vec![v], Tol::EXACT);
    let want = [
        c("NAN", f64::NAN),
        c("INFINITY", f64::INFINITY),
        c("NEG_INFINITY", f64::NEG_INFINITY),
        c("MAX", max),
        c("MIN", -max),
        c("MIN_POSITIVE", min_positive),
        c("EPSILON", epsilon),
    ];
    assert_outputs(&format!("{} constants", T::NAME), &got, &want);
}

/// The constants in values over the elements: a clamp to the finite range, a product (exact:
/// EPSILON is a power of two) with NaN replaced by -inf, and a test for subnormals.
fn extras_constant_uses<T: Float, R: Outputs>(
    kernel: impl Fn(&Device, &Buffer<T>) -> Result<R, Error>,
    min_positive: f64,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats_special::<T>(n, -1e3, 1e3);
        let got = kernel(&dev, &put(&dev, &x, &[n])).unwrap();
        let x = f64s(&x);
        let clamped = map1(&x, |v| clamp(v, -T::MAX, T::MAX));
        let scaled = map1(&x, |v| {
            if v.is_nan() {
                f64::NEG_INFINITY
            } else {
                v * T::EPSILON
            }
        });
        let tiny: Vec<bool> = x.iter().map(|v| v.abs() < min_positive).collect();
        let want = [
            float("x.clamp(MIN, MAX)", &[n], clamped, Tol::EXACT),
            float("x * EPSILON", &[n], rounded::<T>(&scaled), Tol::EXACT),
            exact("x.abs() < MIN_POSITIVE", &[n], &tiny),
        ];
        assert_outputs(&format!("{} constant uses, n = {n}", T::NAME), &got, &want);
    }
}

/// Two roundings of `T` (or of f32 then `T`) of terms of magnitude `scale`.
fn two_roundings<T: Float>(scale: &[f64]) -> Tol {
    Tol::Bounds(
        scale
            .iter()
            .map(|s| 2.0 * T::EPSILON * s + T::TINY)
            .collect(),
    )
}

/// `w[0]`, `w[1][2]` and kin of small weights, elementwise, in a row kernel and in a full
/// reduction, against f64 with the weights' elements picked by hand.
fn extras_indexed<T: Float, A: Outputs, B: Outputs, C: Outputs>(
    map: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<A, Error>,
    rows_kernel: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<B, Error>,
    full: impl Fn(&Device, &Buffer<T>, &Buffer<T>) -> Result<C, Error>,
) {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let x = rng.floats::<T>(n, -4.0, 4.0);
        let w = rng.floats_away::<T>(3, 0.5, 2.0);
        let (xb, wb) = (put(&dev, &x, &[n]), put(&dev, &w, &[3]));
        let (x, w) = (f64s(&x), f64s(&w));
        let got = map(&dev, &xb, &wb).unwrap();
        let want = map1(&x, |v| v * w[0] + w[2]);
        let scale = map1(&x, |v| (v * w[0]).abs() + w[2].abs());
        let what = format!("{} indexed, n = {n}", T::NAME);
        assert_outputs(
            &what,
            &got,
            &[float(
                "x * w[0] + w[2]",
                &[n],
                want,
                two_roundings::<T>(&scale),
            )],
        );
        let got = full(&dev, &xb, &wb).unwrap();
        let top = x.iter().map(|v| v * w[1]).fold(f64::NEG_INFINITY, f64::max);
        let want = [
            float(
                "max(x * w[1]) + w[0]",
                &[],
                vec![top + w[0]],
                two_roundings::<T>(&[top.abs() + w[0].abs()]),
            ),
            float(
                "x - w[2]",
                &[n],
                map1(&x, |v| v - w[2]),
                two_roundings::<T>(&map1(&x, |v| v.abs() + w[2].abs())),
            ),
        ];
        assert_outputs(&format!("{} indexed_full, n = {n}", T::NAME), &got, &want);
    }
    for (rows, cols) in SHAPES_2D {
        let x = rng.floats::<T>(rows * cols, -4.0, 4.0);
        let w = rng.floats_away::<T>(6, 0.5, 2.0);
        let got =
            rows_kernel(&dev, &put(&dev, &x, &[rows, cols]), &put(&dev, &w, &[2, 3])).unwrap();
        let (x, w) = (f64s(&x), f64s(&w));
        // w[1][2] is element 5 and w[0][1] element 1, row-major.
        let y = map1(&x, |v| v * w[5] - w[1]);
        let scale = map1(&x, |v| (v * w[5]).abs() + w[1].abs());
        let (top, top_scale): (Vec<f64>, Vec<f64>) = (0..rows)
            .map(|r| {
                let row = &y[r * cols..(r + 1) * cols];
                let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (
                    m,
                    row.iter().map(|v| v.abs()).fold(0.0, f64::max) + w[1].abs(),
                )
            })
            .unzip();
        let want = [
            float(
                "x * w[1][2] - w[0][1]",
                &[rows, cols],
                y,
                two_roundings::<T>(&scale),
            ),
            float("max(y, cols)", &[rows], top, two_roundings::<T>(&top_scale)),
        ];
        assert_outputs(
            &format!("{} indexed_rows, {rows} x {cols}", T::NAME),
            &got,
            &want,
        );
    }
}

macro_rules! extras_tests {
    ($module:ident, $t:ident) => {
        mod $module {
            use super::*;
            use kernels::$module as k;

            #[test]
            fn ties_even() {
                extras_ties_even(k::ties_even);
            }

            #[test]
            fn constants() {
                let v = |x: $t| f64::from(x);
                let consts = [v($t::MAX), v($t::MIN_POSITIVE), v($t::EPSILON)];
                assert_eq!(v($t::MIN), -consts[0]);
                extras_constants(k::constants, consts);
            }

            #[test]
            fn constant_uses() {
                extras_constant_uses(k::constant_uses, f64::from($t::MIN_POSITIVE));
            }

            #[test]
            fn indexed() {
                extras_indexed(k::indexed, k::indexed_rows, k::indexed_full);
            }
        }
    };
}

mod extras {
    use super::*;
    use fuse_runtime::{bf16, f16};

    extras_tests!(f32_extras, f32);
    extras_tests!(f64_extras, f64);
    extras_tests!(f16_extras, f16);
    extras_tests!(bf16_extras, bf16);
}

/// `i8::MIN`, `u64::MAX` and `i32::MIN`/`MAX` in values over the elements, exactly.
#[test]
fn integer_constants() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for n in SIZES {
        let (a, b, c) = (rng.ints::<i8>(n), rng.ints::<u64>(n), rng.ints::<i32>(n));
        let got = kernels::int_constants(
            &dev,
            &put(&dev, &a, &[n]),
            &put(&dev, &b, &[n]),
            &put(&dev, &c, &[n]),
        )
        .unwrap();
        let want = [
            exact(
                "a.max(i8::MIN + 1)",
                &[n],
                &a.iter().map(|v| (*v).max(-127)).collect::<Vec<i8>>(),
            ),
            exact(
                "b.min(u64::MAX - 1)",
                &[n],
                &b.iter()
                    .map(|v| (*v).min(u64::MAX - 1))
                    .collect::<Vec<u64>>(),
            ),
            exact(
                "a == i8::MIN",
                &[n],
                &a.iter().map(|v| *v == i8::MIN).collect::<Vec<bool>>(),
            ),
            exact(
                "c.clamp(i32::MIN, i32::MAX - 5)",
                &[n],
                &c.iter()
                    .map(|v| (*v).min(i32::MAX - 5))
                    .collect::<Vec<i32>>(),
            ),
        ];
        assert_outputs(&format!("int_constants, n = {n}"), &got, &want);
    }
}

/// Issue 22's `fn f(x: [f32; t, e], k_dim: [u8; k]) -> [f32; t, e] { x }`: a parameter that
/// nothing uses, over a dim that appears nowhere else, builds and runs; its buffer binds `k`,
/// and two such buffers must agree on it.
#[test]
fn unused_parameters_bind_their_dims() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, e, k) in [(1usize, 1usize, 1usize), (3, 7, 5), (33, 31, 129)] {
        let x = rng.floats::<f32>(t * e, -4.0, 4.0);
        let k_dim = rng.ints::<u8>(k);
        let got =
            kernels::unused_dim(&dev, &put(&dev, &x, &[t, e]), &put(&dev, &k_dim, &[k])).unwrap();
        assert_eq!(got.shape(), [t, e]);
        assert_eq!(host(&got), x);
        let (a, b) = (rng.ints::<u8>(k), rng.ints::<i32>(k));
        let xs = put(&dev, &x, &[t * e]);
        let got = kernels::unused_shared_dim(&dev, &xs, &put(&dev, &a, &[k]), &put(&dev, &b, &[k]))
            .unwrap();
        assert_eq!(host(&got), x.iter().map(|v| v * 3.0).collect::<Vec<f32>>());
        let wrong = put(&dev, &rng.ints::<i32>(k + 1), &[k + 1]);
        let err = kernels::unused_shared_dim(&dev, &xs, &put(&dev, &a, &[k]), &wrong).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        assert!(err.to_string().contains("`k`"), "{err}");
    }
}

/// The fp8 types: conversions bit for bit against CUDA's `__NV_SATFINITE` conversions (as the
/// `float8` crate ports them), arithmetic rounded once, reductions, and the quantization
/// kernels against f32 references.
mod fp8s {
    use super::*;
    use common::fp8::{self, assert_bits, Format, E4M3, E5M2};
    use fuse_runtime::{bf16, f16, F8E4M3, F8E5M2};
    use kernels::fp8s;

    fn e4m3s(codes: &[u8]) -> Vec<F8E4M3> {
        codes.iter().map(|&c| F8E4M3::from_bits(c)).collect()
    }

    fn e5m2s(codes: &[u8]) -> Vec<F8E5M2> {
        codes.iter().map(|&c| F8E5M2::from_bits(c)).collect()
    }

    fn codes_of<T: Copy>(v: &[T], bits: fn(&T) -> u8) -> Vec<u8> {
        v.iter().map(bits).collect()
    }

    /// A value's bits, every NaN as 0x7fffffff (the fp8 types' NaN in f32).
    fn f32_bits(x: f32) -> u32 {
        if x.is_nan() {
            0x7fff_ffff
        } else {
            x.to_bits()
        }
    }

    #[test]
    fn every_code_converts_exactly() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        let extra = 2 * rng.below(40) as usize + 1;
        let (a, b) = (fp8::codes(&mut rng, extra), fp8::codes(&mut rng, extra));
        let n = a.len();
        let (ab, bb) = (put(&dev, &e4m3s(&a), &[n]), put(&dev, &e5m2s(&b), &[n]));
        let (af, bf, a2, b2, abf, bh) = fp8s::decode(&dev, &ab, &bb).unwrap();
        let check = |f: Format, codes: &[u8], values: Vec<f32>, back: Vec<u8>| {
            let want: Vec<u32> = codes.iter().map(|&c| f32_bits((f.value)(c))).collect();
            let got: Vec<u32> = values.iter().map(|&x| x.to_bits()).collect();
            assert_bits(&format!("{} as f32", f.name), &got, &want);
            let max = (f.code)(f.max);
            let again: Vec<u8> = codes
                .iter()
                .map(|&c| match (f.value)(c) {
                    x if x.is_nan() => 0x7f,
                    x if x.is_infinite() => max | (c & 0x80),
                    _ => c,
                })
                .collect();
            assert_bits(&format!("{} as f32 as {0}", f.name), &back, &again);
            let nans = codes.iter().filter(|&&c| (f.value)(c).is_nan()).count();
            assert!(nans >= 2, "{}: the NaN codes are among the inputs", f.name);
        };
        check(E4M3, &a, host(&af), codes_of(&host(&a2), F8E4M3::to_bits));
        check(E5M2, &b, host(&bf), codes_of(&host(&b2), F8E5M2::to_bits));
        // Into the 16-bit floats exactly: e4m3 fits bf16, e5m2 is f16's high byte.
        let want: Vec<u16> = a
            .iter()
            .map(|&c| bf16::from_f32((E4M3.value)(c)).to_bits())
            .collect();
        let got: Vec<u16> = host(&abf).iter().map(|x| x.to_bits()).collect();
        let nan_free = |w: &[u16], g: &[u16], nan: fn(u16) -> bool| -> (Vec<u16>, Vec<u16>) {
            w.iter()
                .zip(g)
                .map(|(&w, &g)| if nan(w) && nan(g) { (0, 0) } else { (w, g) })
                .unzip()
        };
        let (w, g) = nan_free(&want, &got, |h| bf16::from_bits(h).is_nan());
        assert_bits("f8e4m3 as bf16", &g, &w);
        let want: Vec<u16> = b.iter().map(|&c| u16::from(c) << 8).collect();
        let got: Vec<u16> = host(&bh).iter().map(|x| x.to_bits()).collect();
        let (w, g) = nan_free(&want, &got, |h| f16::from_bits(h).is_nan());
        assert_bits("f8e5m2 as f16", &g, &w);
    }

    #[test]
    fn f32s_round_to_nearest_even_and_saturate() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        let extra = 2 * rng.below(500) as usize + 1;
        let x = fp8::edges(&mut rng, extra);
        let n = x.len();
        let (e4, e5, e4f, e5f) = fp8s::encode(&dev, &put(&dev, &x, &[n])).unwrap();
        let outputs = [
            (E4M3, codes_of(&host(&e4), F8E4M3::to_bits), host(&e4f)),
            (E5M2, codes_of(&host(&e5), F8E5M2::to_bits), host(&e5f)),
        ];
        for (f, codes, held) in outputs {
            let want: Vec<u8> = x.iter().map(|&v| (f.code)(v)).collect();
            assert_bits(&format!("f32 as {}", f.name), &codes, &want);
            let want: Vec<u32> = want.iter().map(|&c| f32_bits((f.value)(c))).collect();
            let got: Vec<u32> = held.iter().map(|v| v.to_bits()).collect();
            assert_bits(&format!("(f32 as {}) as f32", f.name), &got, &want);
            // Each midpoint is among the inputs, and rounded to the even code of its two.
            let mut seen = 0;
            for (mid, lo, hi) in fp8::midpoints(f) {
                let i = x.iter().position(|v| v.to_bits() == mid.to_bits()).unwrap();
                let even = if lo % 2 == 0 { lo } else { hi };
                assert_eq!(
                    codes[i], even,
                    "{}: {mid} between {lo:#x} and {hi:#x}",
                    f.name
                );
                seen += 1;
            }
            assert!(seen > 200, "{}: {seen} midpoints", f.name);
            // Past the largest value: saturated, with the sign.
            let max = (f.code)(f.max);
            for (i, v) in x.iter().enumerate() {
                if v.abs() >= f.max * 1.25 {
                    assert_eq!(codes[i], max | ((v.to_bits() >> 24) as u8 & 0x80), "{v}");
                }
            }
        }
    }

    #[test]
    fn halves_round_once_through_f32() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        for n in SIZES {
            let h: Vec<f16> = match n {
                0 => vec![],
                _ => rng.floats_special::<f16>(n, -600.0, 600.0),
            };
            let b: Vec<bf16> = rng.floats_wide::<bf16>(n, -20.0, 20.0);
            let out = fp8s::from_halves(&dev, &put(&dev, &h, &[n]), &put(&dev, &b, &[n])).unwrap();
            let (hf, bf): (Vec<f32>, Vec<f32>) = (
                h.iter().map(|v| v.to_f32()).collect(),
                b.iter().map(|v| v.to_f32()).collect(),
            );
            let want = |f: Format, v: &[f32]| v.iter().map(|&x| (f.code)(x)).collect::<Vec<u8>>();
            assert_bits(
                "f16 as f8e4m3",
                &codes_of(&host(&out.0), F8E4M3::to_bits),
                &want(E4M3, &hf),
            );
            assert_bits(
                "f16 as f8e5m2",
                &codes_of(&host(&out.1), F8E5M2::to_bits),
                &want(E5M2, &hf),
            );
            assert_bits(
                "bf16 as f8e4m3",
                &codes_of(&host(&out.2), F8E4M3::to_bits),
                &want(E4M3, &bf),
            );
            assert_bits(
                "bf16 as f8e5m2",
                &codes_of(&host(&out.3), F8E5M2::to_bits),
                &want(E5M2, &bf),
            );
        }
    }

    #[test]
    fn arithmetic_rounds_once() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        let extra = 2 * rng.below(200) as usize + 1;
        let (a, b) = (fp8::codes(&mut rng, extra), fp8::codes(&mut rng, extra));
        let n = a.len();
        let s = F8E4M3::from_bits(rng.below(0x7f) as u8);
        let out = fp8s::arith(
            &dev,
            &put(&dev, &e4m3s(&a), &[n]),
            &put(&dev, &e4m3s(&b), &[n]),
            s,
        )
        .unwrap();
        let (av, bv): (Vec<f32>, Vec<f32>) = (
            a.iter().map(|&c| (E4M3.value)(c)).collect(),
            b.iter().map(|&c| (E4M3.value)(c)).collect(),
        );
        let sv = s.to_f32();
        let zip = |f: &dyn Fn(f32, f32) -> f32| -> Vec<f32> {
            av.iter().zip(&bv).map(|(&a, &b)| f(a, b)).collect()
        };
        let codes = |f: Format, v: Vec<f32>| v.into_iter().map(f.code).collect::<Vec<u8>>();
        // Products and differences of fp8 values are exact in f32; `0.3` is 0.3125 in e4m3.
        let want = codes(E4M3, zip(&|a, b| a * sv + b));
        assert_bits(
            "a * s + b",
            &codes_of(&host(&out.0), F8E4M3::to_bits),
            &want,
        );
        let want = codes(E4M3, zip(&|a, b| (a - b) * 0.3125));
        assert_bits(
            "(a - b) * 0.3",
            &codes_of(&host(&out.1), F8E4M3::to_bits),
            &want,
        );
        let want: Vec<u32> = zip(&|a, b| a * b).into_iter().map(f32_bits).collect();
        let got: Vec<u32> = host(&out.2).iter().map(|v| f32_bits(*v)).collect();
        assert_bits("a * b as f32", &got, &want);
        let want = codes(E5M2, zip(&|a, _| a * sv));
        assert_bits(
            "a * s as f8e5m2",
            &codes_of(&host(&out.3), F8E5M2::to_bits),
            &want,
        );
    }

    #[test]
    fn integers_convert_through_f32() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        let extra = 2 * rng.below(200) as usize + 1;
        let a = fp8::codes(&mut rng, extra);
        let n = a.len();
        let i: Vec<i32> = (0..n)
            .map(|_| match rng.below(3) {
                0 => rng.next_u64() as i32,
                _ => rng.below(140_000) as i32 - 70_000,
            })
            .collect();
        let (ai, au, i5, i4) =
            fp8s::ints(&dev, &put(&dev, &e5m2s(&a), &[n]), &put(&dev, &i, &[n])).unwrap();
        let av: Vec<f32> = a.iter().map(|&c| (E5M2.value)(c)).collect();
        assert_exact(
            "f8e5m2 as i32",
            &host(&ai),
            &av.iter().map(|&v| v as i32).collect::<Vec<_>>(),
        );
        assert_exact(
            "f8e5m2 as u8",
            &host(&au),
            &av.iter().map(|&v| v as u8).collect::<Vec<_>>(),
        );
        let want: Vec<u8> = i.iter().map(|&v| (E5M2.code)(v as f32)).collect();
        assert_bits(
            "i32 as f8e5m2",
            &codes_of(&host(&i5), F8E5M2::to_bits),
            &want,
        );
        let want: Vec<u8> = i.iter().map(|&v| (E4M3.code)(v as f32)).collect();
        assert_bits(
            "i32 as f8e4m3",
            &codes_of(&host(&i4), F8E4M3::to_bits),
            &want,
        );
    }

    /// Codes of random finite nonzero e4m3 values (no NaN, no zeros, whose sign a `max` could
    /// take from either).
    fn e4m3_values(rng: &mut Rng, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                let c = 1 + rng.below(0x7e) as u8;
                c | if rng.below(2) == 0 { 0x80 } else { 0 }
            })
            .collect()
    }

    #[test]
    fn reductions_round_where_they_store() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        for (rows, cols) in SHAPES_2D {
            let x = e4m3_values(&mut rng, rows * cols);
            let (mx, mn, sm, am) =
                fp8s::reduce_rows(&dev, &put(&dev, &e4m3s(&x), &[rows, cols])).unwrap();
            let v: Vec<f32> = x.iter().map(|&c| (E4M3.value)(c)).collect();
            let row = |r: usize| &v[r * cols..(r + 1) * cols];
            let code = |x: f32| (E4M3.code)(x);
            let want: Vec<u8> = (0..rows)
                .map(|r| code(row(r).iter().copied().fold(f32::NEG_INFINITY, f32::max)))
                .collect();
            assert_bits("max", &codes_of(&host(&mx), F8E4M3::to_bits), &want);
            let want: Vec<u8> = (0..rows)
                .map(|r| code(row(r).iter().copied().fold(f32::INFINITY, f32::min)))
                .collect();
            assert_bits("min", &codes_of(&host(&mn), F8E4M3::to_bits), &want);
            let want: Vec<u32> = (0..rows)
                .map(|r| {
                    let m = row(r).iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    row(r)
                        .iter()
                        .position(|&y| y == m)
                        .map_or(u32::MAX, |i| i as u32)
                })
                .collect();
            assert_exact("argmax", &host(&am), &want);
            let sums: Vec<f64> = (0..rows)
                .map(|r| row(r).iter().map(|&y| f64::from(y)).sum())
                .collect();
            let abs: Vec<f64> = (0..rows)
                .map(|r| row(r).iter().map(|&y| f64::from(y).abs()).sum())
                .collect();
            assert_close("sum", &host(&sm), &sums, &sum_tol::<f32>(&abs));
        }
    }

    /// Codes that are the f32 values `want` rounded, each within one step of the type.
    #[track_caller]
    fn assert_within_a_step(what: &str, f: Format, got: &[u8], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let c = (f.code)(w);
            let near = g == c || (g & 0x80 == c & 0x80 && (g & 0x7f).abs_diff(c & 0x7f) <= 1);
            assert!(
                near,
                "{what}: element {i}: got {g:#04x} ({}), want {c:#04x} ({w})",
                (f.value)(g)
            );
        }
    }

    #[test]
    fn softmax_of_fp8_rows() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        for (rows, cols) in SHAPES_2D.into_iter().chain([(3, 64), (2, 1000)]) {
            let x: Vec<u8> = (0..rows * cols)
                .map(|_| (E5M2.code)(rng.uniform(-8.0, 8.0) as f32))
                .collect();
            let y = fp8s::softmax(&dev, &put(&dev, &e5m2s(&x), &[rows, cols])).unwrap();
            let v: Vec<f64> = x.iter().map(|&c| f64::from((E5M2.value)(c))).collect();
            let mut want = vec![];
            for r in 0..rows {
                let row = &v[r * cols..(r + 1) * cols];
                let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = row.iter().map(|y| (y - m).exp()).sum();
                want.extend(row.iter().map(|y| ((y - m).exp() / total) as f32));
            }
            assert_within_a_step(
                &format!("softmax {rows}x{cols}"),
                E4M3,
                &codes_of(&host(&y), F8E4M3::to_bits),
                &want,
            );
        }
    }

    #[test]
    fn per_token_quantization() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        for (t, h) in [(1, 1), (7, 33), (5, 4096), (3, 5000)] {
            let x: Vec<bf16> = rng.floats_special::<bf16>(t * h, -10.0, 10.0);
            let scale: Vec<f32> = rng.floats_away::<f32>(t, 0.001, 0.1);
            let q = fp8s::quant(&dev, &put(&dev, &x, &[t, h]), &put(&dev, &scale, &[t])).unwrap();
            let want: Vec<u8> = x
                .iter()
                .enumerate()
                .map(|(i, v)| (E4M3.code)(v.to_f32() / scale[i / h]))
                .collect();
            assert_bits(
                &format!("quant {t}x{h}"),
                &codes_of(&host(&q), F8E4M3::to_bits),
                &want,
            );
        }
    }

    #[test]
    fn rmsnorm_then_per_token_quantization() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        for (t, h) in [(1, 1), (7, 33), (5, 4096), (3, 5000)] {
            let x: Vec<bf16> = rng.floats::<bf16>(t * h, -4.0, 4.0);
            let w: Vec<bf16> = rng.floats::<bf16>(h, 0.5, 2.0);
            let eps = 1e-6f32;
            let (q, s) =
                fp8s::rmsnorm_quant(&dev, &put(&dev, &x, &[t, h]), &put(&dev, &w, &[h]), eps)
                    .unwrap();
            let (q, s) = (codes_of(&host(&q), F8E4M3::to_bits), host(&s));
            let mut want_q = vec![];
            let mut want_s = vec![];
            for r in 0..t {
                let row: Vec<f64> = x[r * h..(r + 1) * h].iter().map(|v| v.to_f64()).collect();
                let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
                let rstd = 1.0 / (ms + f64::from(eps)).sqrt();
                let y: Vec<f64> = row
                    .iter()
                    .zip(&w)
                    .map(|(v, g)| v * rstd * g.to_f64())
                    .collect();
                let scale = (y.iter().fold(0.0f64, |m, v| m.max(v.abs())) / 448.0)
                    .max(1.0 / (448.0 * 512.0));
                want_s.push(scale);
                // With the kernel's own scale, so that only the rounding of `y` is compared.
                want_q.extend(y.iter().map(|v| (v * (1.0 / f64::from(s[r]))) as f32));
            }
            assert_close(
                &format!("scale {t}x{h}"),
                &s,
                &want_s,
                &Tol::close(1e-5, 0.0),
            );
            assert_within_a_step(&format!("rmsnorm_quant {t}x{h}"), E4M3, &q, &want_q);
            // Each row's largest magnitude is e4m3's largest value, or within a step of it.
            for r in 0..t {
                let top = q[r * h..(r + 1) * h]
                    .iter()
                    .map(|&c| c & 0x7f)
                    .max()
                    .unwrap();
                assert!(top >= 0x7d, "row {r}: largest code {top:#x}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Slices along a named dim (issue 22, item 1).

/// `(t, d)` of the slice tests: odd sizes, a single token, one element a half, empty dims.
const SLICE_SHAPES: [(usize, usize); 7] =
    [(37, 33), (1, 4097), (5, 1), (3, 8), (1, 1), (0, 5), (4, 0)];

/// Rows `t` of `parts` parts of `d` each, laid out as `f(row, part, i)` says where element `i`
/// of part `part` lies in the row; returns each part as a `[t, d]` matrix.
fn parts_of(
    x: &[f32],
    t: usize,
    d: usize,
    parts: usize,
    at: impl Fn(usize, usize) -> usize,
) -> Vec<Vec<f32>> {
    (0..parts)
        .map(|part| {
            (0..t * d)
                .map(|k| x[(k / d) * parts * d + at(part, k % d)])
                .collect()
        })
        .collect()
}

#[test]
fn halves_keep_every_bit() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, d) in SLICE_SHAPES {
        let mut x = rng.floats_special::<f32>(t * 2 * d, -10.0, 10.0);
        // Both halves of some rows hold -0.0 and NaNs with payloads and signs.
        for (i, v) in x.iter_mut().enumerate().filter(|(i, _)| i % 7 == 3) {
            *v = [
                -0.0,
                f32::from_bits(0x7fc0_1234),
                f32::from_bits(0xffc0_0001),
            ][i % 3];
        }
        let (lo, hi) = kernels::slices::halves(&dev, &put(&dev, &x, &[t, 2 * d])).unwrap();
        let want = parts_of(&x, t, d, 2, |part, i| part * d + i);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!(lo.shape(), &[t, d]);
        assert_exact(
            &format!("lower half, {t} x {d}"),
            &bits(&host(&lo)),
            &bits(&want[0]),
        );
        assert_exact(
            &format!("upper half, {t} x {d}"),
            &bits(&host(&hi)),
            &bits(&want[1]),
        );
    }
}

#[test]
fn silu_and_gelu_and_mul_read_the_halves() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, d) in SLICE_SHAPES {
        let x = rng.floats::<f32>(t * 2 * d, -6.0, 6.0);
        let b = put(&dev, &x, &[t, 2 * d]);
        let [g, u] = &parts_of(&x, t, d, 2, |part, i| part * d + i)[..] else {
            unreachable!()
        };
        let (g, u) = (f64s(g), f64s(u));
        let silu = map2(&g, &u, |g, u| g / (1.0 + (-g).exp()) * u);
        let got = kernels::slices::silu_and_mul(&dev, &b).unwrap();
        assert_close(
            &format!("silu_and_mul {t} x {d}"),
            &host(&got),
            &silu,
            &f32::math_tol(),
        );
        let gelu = map2(&g, &u, |g, u| {
            0.5 * g * (1.0 + libm::erf(g / 2f64.sqrt())) * u
        });
        let got = kernels::slices::gelu_and_mul(&dev, &b).unwrap();
        assert_close(
            &format!("gelu_and_mul {t} x {d}"),
            &host(&got),
            &gelu,
            &f32::math_tol(),
        );
    }
}

#[test]
fn silu_and_mul_in_bf16_rounds_once() {
    use fuse_runtime::bf16;
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, d) in SLICE_SHAPES {
        let x = rng.floats::<bf16>(t * 2 * d, -6.0, 6.0);
        let got = kernels::slices::silu_and_mul_bf16(&dev, &put(&dev, &x, &[t, 2 * d])).unwrap();
        let want: Vec<f64> = (0..t * d)
            .map(|k| {
                let (row, i) = (k / d, k % d);
                let (g, u) = (x[row * 2 * d + i].to_f32(), x[row * 2 * d + d + i].to_f32());
                f64::from(bf16::from_f32(g / (1.0 + (-g).exp()) * u).to_f32())
            })
            .collect();
        // The f32 chain within a few of its ulps, then one bf16 rounding: one bf16 ulp.
        assert_close(
            &format!("silu_and_mul bf16 {t} x {d}"),
            &host(&got),
            &want,
            &Tol::close(2f64.powi(-7), 1e-30),
        );
    }
}

#[test]
fn interleaved_picks_are_the_even_and_odd_elements() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, d) in SLICE_SHAPES {
        let mut x = rng.floats_special::<f32>(t * 2 * d, -10.0, 10.0);
        if let Some(v) = x.get_mut(1) {
            *v = -0.0;
        }
        let b = put(&dev, &x, &[t, d * 2]);
        let (even, odd) = kernels::slices::evens_odds(&dev, &b).unwrap();
        let want = parts_of(&x, t, d, 2, |part, i| 2 * i + part);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_exact(
            &format!("evens, {t} x {d}"),
            &bits(&host(&even)),
            &bits(&want[0]),
        );
        assert_exact(
            &format!("odds, {t} x {d}"),
            &bits(&host(&odd)),
            &bits(&want[1]),
        );
        let (alpha, limit) = (1.702f32, 7.0f32);
        let got = kernels::slices::swigluoai_and_mul(&dev, &b, alpha, limit).unwrap();
        let want: Vec<f64> = (0..t * d)
            .map(|k| {
                let (g, u) = (f64::from(want[0][k]), f64::from(want[1][k]));
                // `min` ignores a NaN operand, `clamp` keeps it, as in the language.
                let g = g.min(limit.into());
                let u = clamp(u, -f64::from(limit), limit.into());
                g / (1.0 + (-g * f64::from(alpha)).exp()) * (u + 1.0)
            })
            .collect();
        assert_close(
            &format!("swigluoai_and_mul {t} x {d}"),
            &host(&got),
            &want,
            &f32::math_tol(),
        );
    }
}

/// `(t, h, half, p)`: the rotary part of each head `2 * half`, the rest `p`.
const ROTARY_SHAPES: [(usize, usize, usize, usize); 5] = [
    (7, 3, 16, 5),
    (1, 2, 1, 0),
    (5, 1, 33, 64),
    (3, 4, 8, 1),
    (0, 2, 4, 4),
];

#[test]
fn neox_rotary_turns_the_first_rot_dim_of_each_head() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, h, half, p) in ROTARY_SHAPES {
        let head = 2 * half + p;
        let x = rng.floats::<f32>(t * h * head, -3.0, 3.0);
        let cos = rng.floats::<f32>(t * half, -1.0, 1.0);
        let sin = rng.floats::<f32>(t * half, -1.0, 1.0);
        let (bx, bc, bs) = (
            put(&dev, &x, &[t, h, head]),
            put(&dev, &cos, &[t, half]),
            put(&dev, &sin, &[t, half]),
        );
        let (o1, o2) = kernels::slices::rotary_neox(&dev, &bx, &bc, &bs).unwrap();
        let pass = kernels::slices::rotary_pass(&dev, &bx, &bc).unwrap();
        assert_eq!(pass.shape(), &[t, h, p]);
        let (mut w1, mut w2, mut wp) = (vec![], vec![], vec![]);
        for (th, row) in x.chunks(head.max(1)).take(t * h).enumerate() {
            let (c, s) = (&cos[th / h * half..][..half], &sin[th / h * half..][..half]);
            for i in 0..half {
                let (a, b) = (f64::from(row[i]), f64::from(row[half + i]));
                w1.push(a * f64::from(c[i]) - b * f64::from(s[i]));
                w2.push(b * f64::from(c[i]) + a * f64::from(s[i]));
            }
            wp.extend_from_slice(&row[2 * half..]);
        }
        let what = format!("rotary {t} x {h} x ({half} * 2 + {p})");
        let tol = Tol::close(1e-6, 1e-6);
        assert_close(&format!("{what}, first half"), &host(&o1), &w1, &tol);
        assert_close(&format!("{what}, second half"), &host(&o2), &w2, &tol);
        assert_exact(&format!("{what}, passed through"), &host(&pass), &wp);
    }
}

#[test]
fn gptj_rotary_turns_interleaved_pairs() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, h, d, _) in ROTARY_SHAPES {
        let x = rng.floats::<f32>(t * h * 2 * d, -3.0, 3.0);
        let cos = rng.floats::<f32>(t * d, -1.0, 1.0);
        let sin = rng.floats::<f32>(t * d, -1.0, 1.0);
        let (bx, bc, bs) = (
            put(&dev, &x, &[t, h, d * 2]),
            put(&dev, &cos, &[t, d]),
            put(&dev, &sin, &[t, d]),
        );
        let (o1, o2) = kernels::slices::rotary_gptj(&dev, &bx, &bc, &bs).unwrap();
        let (mut w1, mut w2) = (vec![], vec![]);
        for k in 0..t * h * d {
            let (th, i) = (k / d, k % d);
            let (a, b) = (
                f64::from(x[th * 2 * d + 2 * i]),
                f64::from(x[th * 2 * d + 2 * i + 1]),
            );
            let (c, s) = (
                f64::from(cos[th / h * d + i]),
                f64::from(sin[th / h * d + i]),
            );
            w1.push(a * c - b * s);
            w2.push(b * c + a * s);
        }
        let tol = Tol::close(1e-6, 1e-6);
        assert_close(
            &format!("gptj {t} x {h} x {d}, first"),
            &host(&o1),
            &w1,
            &tol,
        );
        assert_close(
            &format!("gptj {t} x {h} x {d}, second"),
            &host(&o2),
            &w2,
            &tol,
        );
    }
}

#[test]
fn slices_in_reductions_over_rows_columns_and_everything() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, d) in SLICE_SHAPES {
        let x = rng.floats::<f32>(t * 2 * d, -4.0, 4.0);
        let b = put(&dev, &x, &[t, 2 * d]);
        let [lo, hi] = &parts_of(&x, t, d, 2, |part, i| part * d + i)[..] else {
            unreachable!()
        };
        let cols = kernels::slices::upper_column_sums(&dev, &b).unwrap();
        let want: Vec<f64> = (0..d)
            .map(|i| (0..t).map(|r| f64::from(hi[r * d + i])).sum())
            .collect();
        let abs: Vec<f64> = (0..d)
            .map(|i| (0..t).map(|r| f64::from(hi[r * d + i].abs())).sum())
            .collect();
        assert_close(
            &format!("column sums {t} x {d}"),
            &host(&cols),
            &want,
            &sum_tol::<f32>(&abs),
        );
        let (total, twice) = kernels::slices::lower_total(&dev, &b).unwrap();
        let abs: f64 = lo.iter().map(|v| f64::from(v.abs())).sum();
        let want: f64 = lo.iter().map(|&v| f64::from(v)).sum();
        assert_close(
            &format!("total {t} x {d}"),
            &host(&total),
            &[want],
            &sum_tol::<f32>(&[abs]),
        );
        assert_close(
            &format!("twice {t} x {d}"),
            &host(&twice),
            &map1(&f64s(lo), |v| 2.0 * v),
            &Tol::EXACT,
        );
    }
}

#[test]
fn silu_and_mul_quantizes_each_token() {
    use fuse_runtime::{bf16, F8E4M3};
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, d) in SLICE_SHAPES {
        let x = rng.floats::<bf16>(t * 2 * d, -6.0, 6.0);
        let (q, s) = kernels::slices::silu_and_mul_fp8(&dev, &put(&dev, &x, &[t, 2 * d])).unwrap();
        let (q, s) = (host(&q), host(&s));
        for row in 0..t {
            let y: Vec<f32> = (0..d)
                .map(|i| {
                    let (g, u) = (x[row * 2 * d + i].to_f32(), x[row * 2 * d + d + i].to_f32());
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            let want_s = y.iter().fold(f32::NEG_INFINITY, |m, v| m.max(v.abs())) / 448.0;
            assert_close(
                &format!("scale of row {row}, {t} x {d}"),
                &s[row..=row],
                &[want_s.into()],
                &Tol::close(1e-6, 0.0),
            );
            for i in 0..d {
                let want = F8E4M3::from_f32(y[i] / s[row]);
                let got = q[row * d + i];
                // One code apart at most, where the f32 chain lands near a rounding midpoint.
                let apart =
                    (i32::from(got.to_bits() & 0x7f) - i32::from(want.to_bits() & 0x7f)).abs();
                assert!(
                    got.to_bits() == want.to_bits() || apart <= 1,
                    "row {row} element {i}: got {got:?}, want {want:?}"
                );
            }
        }
    }
}

#[test]
fn a_dim_made_of_parts_is_checked_and_bound_at_the_call() {
    let dev = Device::cpu();
    let odd = put(&dev, &[1.0f32; 6], &[2, 3]);
    let e = kernels::slices::silu_and_mul(&dev, &odd).unwrap_err();
    assert!(
        matches!(&e, Error::Shape { dim, found: 3, expected: 2, .. } if dim.contains("2 * d")),
        "{e}"
    );
    let x = put(&dev, &[1.0f32; 2 * 3 * 10], &[2, 3, 10]);
    let short = put(&dev, &[1.0f32; 2 * 6], &[2, 6]);
    let e = kernels::slices::rotary_pass(&dev, &x, &short).unwrap_err();
    assert!(
        matches!(&e, Error::Shape { dim, found: 10, expected: 12, .. } if dim.contains("2 * half + p")),
        "{e}"
    );
    let fits = put(&dev, &[1.0f32; 2 * 4], &[2, 4]);
    assert_eq!(
        kernels::slices::rotary_pass(&dev, &x, &fits)
            .unwrap()
            .shape(),
        &[2, 3, 2]
    );
}

/// The element of a table at `i` of a dim of `len` (`at` the offset for a valid `i`), or zero.
fn picked<T: Copy + Default>(table: &[T], i: i64, len: usize, at: impl Fn(usize) -> usize) -> T {
    match usize::try_from(i) {
        Ok(i) if i < len => table[at(i)],
        _ => T::default(),
    }
}

#[test]
fn embeddings_gather_rows_by_token() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (vocab, e, b, s) in [
        (50, 33, 3, 7),
        (1, 1, 1, 1),
        (7, 300, 2, 5),
        (13, 4, 0, 3),
        (1000, 8, 1, 129),
    ] {
        let emb = rng.floats_special::<f32>(vocab * e, -3.0, 3.0);
        let tokens: Vec<u32> = rng
            .indices(b * s, vocab)
            .iter()
            .map(|&i| i as u32)
            .collect();
        let got = kernels::gathers::embedding(
            &dev,
            &put(&dev, &emb, &[vocab, e]),
            &put(&dev, &tokens, &[b, s]),
        )
        .unwrap();
        assert_eq!(got.shape(), &[b, s, e]);
        let want: Vec<u32> = tokens
            .iter()
            .flat_map(|&tok| (0..e).map(move |j| (tok, j)))
            .map(|(tok, j)| picked(&emb, i64::from(tok), vocab, |i| i * e + j).to_bits())
            .collect();
        let bits: Vec<u32> = host(&got).iter().map(|v| v.to_bits()).collect();
        assert_exact(&format!("embedding {vocab}x{e} by {b}x{s}"), &bits, &want);

        let emb16: Vec<fuse_runtime::bf16> = rng.floats(vocab * e, -3.0, 3.0);
        let tokens = rng.indices(b * s, vocab);
        let got = kernels::gathers::embedding_bf16(
            &dev,
            &put(&dev, &emb16, &[vocab, e]),
            &put(&dev, &tokens, &[b * s]),
        )
        .unwrap();
        let want: Vec<u16> = tokens
            .iter()
            .flat_map(|&tok| (0..e).map(move |j| (tok, j)))
            .map(|(tok, j)| picked(&emb16, tok, vocab, |i| i * e + j).to_bits())
            .collect();
        let bits: Vec<u16> = host(&got).iter().map(|v| v.to_bits()).collect();
        assert_exact(
            &format!("bf16 embedding {vocab}x{e} by {}", b * s),
            &bits,
            &want,
        );
    }
}

#[test]
fn a_labels_logit_is_gathered_along_the_row() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (n, v) in [(9, 33), (1, 1), (4, 5000), (300, 7), (0, 3)] {
        let x = rng.floats::<f32>(n * v, -8.0, 8.0);
        let mut labels = rng.indices(n, v);
        for l in labels.iter_mut().step_by(5) {
            *l = -100;
        }
        let (picked_got, loss) =
            kernels::gathers::label_loss(&dev, &put(&dev, &x, &[n, v]), &put(&dev, &labels, &[n]))
                .unwrap();
        let mut want_pick = vec![];
        let mut want_loss = vec![];
        for (row, &l) in x.chunks(v).take(n).zip(&labels) {
            let p = picked(row, l, v, |i| i);
            want_pick.push(p.to_bits());
            let m = row
                .iter()
                .fold(f64::NEG_INFINITY, |m, &a| m.max(f64::from(a)));
            let lse = m + row
                .iter()
                .map(|&a| (f64::from(a) - m).exp())
                .sum::<f64>()
                .ln();
            want_loss.push(if l == -100 { 0.0 } else { lse - f64::from(p) });
        }
        let bits: Vec<u32> = host(&picked_got).iter().map(|v| v.to_bits()).collect();
        assert_exact(&format!("labels' logits {n}x{v}"), &bits, &want_pick);
        assert_close(
            &format!("loss {n}x{v}"),
            &host(&loss),
            &want_loss,
            &Tol::close(1e-5, 1e-5),
        );
    }
}

#[test]
fn rotary_reads_cos_and_sin_from_the_cache_row_of_each_position() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, h, half, p, max_pos) in [
        (7, 3, 16, 5, 40),
        (1, 2, 1, 0, 1),
        (5, 1, 33, 64, 9),
        (0, 2, 4, 4, 3),
    ] {
        let head = 2 * half + p;
        let q = rng.floats::<f32>(t * h * head, -3.0, 3.0);
        let cache = rng.floats::<f32>(max_pos * 2 * half, -1.0, 1.0);
        let pos = rng.indices(t, max_pos);
        let (o1, o2) = kernels::gathers::rotary_cached(
            &dev,
            &put(&dev, &pos, &[t]),
            &put(&dev, &cache, &[max_pos, 2 * half]),
            &put(&dev, &q, &[t, h, head]),
        )
        .unwrap();
        let (mut w1, mut w2) = (vec![], vec![]);
        for (th, row) in q.chunks(head).take(t * h).enumerate() {
            let at = pos[th / h];
            for i in 0..half {
                let c = f64::from(picked(&cache, at, max_pos, |r| r * 2 * half + i));
                let s = f64::from(picked(&cache, at, max_pos, |r| r * 2 * half + half + i));
                let (a, b) = (f64::from(row[i]), f64::from(row[half + i]));
                w1.push(a * c - b * s);
                w2.push(b * c + a * s);
            }
        }
        let what = format!("rotary from a cache, {t}x{h}x{head}, {max_pos} positions");
        assert_close(&what, &host(&o1), &w1, &Tol::close(1e-6, 1e-6));
        assert_close(&what, &host(&o2), &w2, &Tol::close(1e-6, 1e-6));
    }
}

#[test]
fn gathers_work_along_a_middle_dim_and_in_reductions() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (a, m, c) in [(3, 5, 7), (1, 1, 1), (2, 40, 300)] {
        let x = rng.floats_special::<f64>(a * m * c, -5.0, 5.0);
        let idx: Vec<i32> = rng
            .indices(a * c, m)
            .iter()
            .map(|&i| i as i32 - 1)
            .collect();
        let got =
            kernels::gathers::middle(&dev, &put(&dev, &x, &[a, m, c]), &put(&dev, &idx, &[a, c]))
                .unwrap();
        let want: Vec<u64> = (0..a * c)
            .map(|ac| {
                picked(&x, i64::from(idx[ac]) + 1, m, |i| {
                    (ac / c * m + i) * c + ac % c
                })
                .to_bits()
            })
            .collect();
        let bits: Vec<u64> = host(&got).iter().map(|v| v.to_bits()).collect();
        assert_exact(&format!("middle gather {a}x{m}x{c}"), &bits, &want);
    }
    for (k, c, r) in [(20, 33, 100), (1, 1, 1), (255, 8, 3000), (3, 500, 2)] {
        let table: Vec<fuse_runtime::f16> = rng.floats(k * c, -2.0, 2.0);
        let idx: Vec<u8> = rng.indices(r, k).iter().map(|&i| i as u8).collect();
        let (bt, bi) = (put(&dev, &table, &[k, c]), put(&dev, &idx, &[r]));
        let rows: Vec<Vec<f64>> = idx
            .iter()
            .map(|&i| {
                (0..c)
                    .map(|j| picked(&table, i64::from(i), k, |r| r * c + j).to_f64())
                    .collect()
            })
            .collect();
        let cols: Vec<f64> = (0..c)
            .map(|j| rows.iter().map(|row| row[j]).sum())
            .collect();
        let abs: Vec<f64> = (0..c)
            .map(|j| rows.iter().map(|row| row[j].abs()).sum())
            .collect();
        let got = kernels::gathers::gathered_columns(&dev, &bt, &bi).unwrap();
        assert_close(
            &format!("gathered columns {k}x{c} by {r}"),
            &host(&got),
            &cols,
            &sum_tol::<f32>(&abs),
        );
        let total = kernels::gathers::gathered_total(&dev, &bt, &bi).unwrap();
        let all: f64 = cols.iter().sum();
        let abs_all: f64 = abs.iter().sum();
        assert_close(
            &format!("gathered total {k}x{c} by {r}"),
            &host(&total),
            &[all],
            &sum_tol::<f32>(&[abs_all]),
        );
    }
}

#[test]
fn a_softmax_runs_over_gathered_rows() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (n, c, r) in [(10, 33, 17), (1, 1, 1), (4, 5000, 3), (50, 8, 200)] {
        let x = rng.floats::<f32>(n * c, -6.0, 6.0);
        let idx: Vec<u32> = rng.indices(r, n).iter().map(|&i| i as u32).collect();
        let got = kernels::gathers::softmax_of_rows(
            &dev,
            &put(&dev, &x, &[n, c]),
            &put(&dev, &idx, &[r]),
        )
        .unwrap();
        let mut want = vec![];
        for &i in &idx {
            let row: Vec<f64> = (0..c)
                .map(|j| f64::from(picked(&x, i64::from(i), n, |r| r * c + j)))
                .collect();
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &a| m.max(a));
            let e: Vec<f64> = row.iter().map(|&a| (a - m).exp()).collect();
            let s: f64 = e.iter().sum();
            want.extend(e.iter().map(|v| v / s));
        }
        assert_close(
            &format!("softmax of gathered rows {n}x{c} by {r}"),
            &host(&got),
            &want,
            &Tol::close(1e-5, 1e-7),
        );
    }
}

#[test]
fn one_dim_tables_of_every_kind_are_looked_up_by_computed_indices() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (m, n) in [(10, 100), (1, 3), (300, 1000)] {
        let codes: Vec<i16> = rng.ints(m);
        let flags = rng.bools(m);
        let w: Vec<fuse_runtime::F8E4M3> = rng
            .floats::<f32>(m, -400.0, 400.0)
            .iter()
            .map(|&v| fuse_runtime::F8E4M3::from_f32(v))
            .collect();
        // Quarter steps from below the table to past it, and NaN (which casts to 0).
        let mut x = rng.floats::<f32>(n, -1.0, m as f64 / 4.0 + 1.0);
        x[0] = f32::NAN;
        let (c, f, v) = kernels::gathers::lookups(
            &dev,
            &put(&dev, &codes, &[m]),
            &put(&dev, &flags, &[m]),
            &put(&dev, &w, &[m]),
            &put(&dev, &x, &[n]),
        )
        .unwrap();
        let at: Vec<i64> = x.iter().map(|&v| i64::from((v * 4.0) as i32)).collect();
        let what = format!("lookups in {m} by {n}");
        let want_c: Vec<i16> = at.iter().map(|&i| picked(&codes, i, m, |i| i)).collect();
        assert_exact(&what, &host(&c), &want_c);
        let want_f: Vec<bool> = at.iter().map(|&i| picked(&flags, i, m, |i| i)).collect();
        assert_exact(&what, &host(&f), &want_f);
        let want_v: Vec<u32> = at
            .iter()
            .map(|&i| picked(&w, i, m, |i| i).to_f32().to_bits())
            .collect();
        let bits: Vec<u32> = host(&v).iter().map(|v| v.to_bits()).collect();
        assert_exact(&what, &bits, &want_v);
    }
}

#[test]
fn constant_picks_along_named_dims_read_zero_past_the_end() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (r, c) in [(5, 7), (3, 1), (1, 4), (0, 2)] {
        let x = rng.floats_special::<f64>(r * c, -3.0, 3.0);
        let (first, fourth) = kernels::gathers::picks(&dev, &put(&dev, &x, &[r, c])).unwrap();
        let want = |j: i64| -> Vec<u64> {
            (0..r)
                .map(|i| picked(&x, j, c, |j| i * c + j).to_bits())
                .collect()
        };
        let bits = |v: Vec<f64>| v.iter().map(|v| v.to_bits()).collect::<Vec<u64>>();
        assert_exact(
            &format!("x[.., 0] of {r}x{c}"),
            &bits(host(&first)),
            &want(0),
        );
        assert_exact(
            &format!("x[.., 3] of {r}x{c}"),
            &bits(host(&fourth)),
            &want(3),
        );
    }
}

#[test]
fn rows_are_scattered_to_their_slots_and_the_rest_is_kept() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, h, d, slots) in [
        (7, 3, 16, 40),
        (1, 1, 1, 1),
        (5, 2, 33, 5),
        (0, 2, 4, 3),
        (64, 8, 8, 256),
    ] {
        let key: Vec<fuse_runtime::bf16> = rng.floats(t * h * d, -3.0, 3.0);
        // Distinct slots (as vLLM's are), some negative (padding) or past the cache.
        let mut order: Vec<i64> = (0..slots as i64).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let slot: Vec<i64> = (0..t)
            .map(|i| match rng.below(8) {
                0 => -1,
                1 => slots as i64 + rng.below(3) as i64,
                _ => order[i % slots],
            })
            .collect();
        let before: Vec<fuse_runtime::bf16> = rng.floats(slots * h * d, -9.0, 9.0);
        let mut cache = put(&dev, &before, &[slots, h, d]);
        kernels::writes::cache_rows(
            &dev,
            &put(&dev, &key, &[t, h, d]),
            &put(&dev, &slot, &[t]),
            &mut cache,
        )
        .unwrap();
        let mut want = before.clone();
        for (i, &s) in slot.iter().enumerate() {
            if (0..slots as i64).contains(&s) {
                let row = h * d;
                want[s as usize * row..][..row].copy_from_slice(&key[i * row..][..row]);
            }
        }
        let bits = |v: &[fuse_runtime::bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
        assert_exact(
            &format!("cache_rows {t}x{h}x{d} into {slots}"),
            &bits(&host(&cache)),
            &bits(&want),
        );
    }
}

/// A `&mut` buffer read through a slice as it is written: updated in place, and rows copied
/// within it (sources that are not destinations, some indices out of range).
#[test]
fn a_written_buffer_is_read_through_a_slice() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (m, c) in [(5, 33), (1, 1), (64, 256)] {
        let x0 = rng.floats_special::<f32>(m * c, -3.0, 3.0);
        let y = rng.floats::<f32>(m * c, -3.0, 3.0);
        let mut x = put(&dev, &x0, &[m, c]);
        kernels::writes::scale_in_place(&dev, &mut x, &put(&dev, &y, &[m, c]), 1.5).unwrap();
        let want: Vec<f32> = x0.iter().zip(&y).map(|(&a, &b)| a * 1.5 + b).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_exact(
            &format!("scale_in_place {m}x{c}"),
            &bits(&host(&x)),
            &bits(&want),
        );
    }
    for (nb, e, m) in [(10, 24, 4), (2, 1, 1), (50, 1000, 20)] {
        let mut order: Vec<i64> = (0..nb as i64).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let src: Vec<i64> = (0..m)
            .map(|i| if i % 3 == 2 { -1 } else { order[i] })
            .collect();
        let dst: Vec<i64> = (0..m)
            .map(|i| {
                if i % 5 == 4 {
                    nb as i64 + 1
                } else {
                    order[m + i]
                }
            })
            .collect();
        let before: Vec<fuse_runtime::bf16> = rng.floats(nb * e, -9.0, 9.0);
        let mut cache = put(&dev, &before, &[nb, e]);
        let (bs, bd) = (put(&dev, &src, &[m]), put(&dev, &dst, &[m]));
        kernels::writes::copy_rows(&dev, &mut cache, &bs, &bd).unwrap();
        let mut want = before.clone();
        for (&s, &d) in src.iter().zip(&dst) {
            if !(0..nb as i64).contains(&d) {
                continue;
            }
            for i in 0..e {
                // An index out of range reads zero.
                want[d as usize * e + i] = match usize::try_from(s) {
                    Ok(s) if s < nb => before[s * e + i],
                    _ => fuse_runtime::bf16::ZERO,
                };
            }
        }
        let bits = |v: &[fuse_runtime::bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
        assert_exact(
            &format!("copy_rows {m} of {nb}x{e}"),
            &bits(&host(&cache)),
            &bits(&want),
        );
    }
}

/// Two indices in one write (`reshape_and_cache`'s key layout) and in one read: against the
/// loops of vLLM's kernel and a lookup element by element.
#[test]
fn gathers_and_writes_along_two_dims() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, h, dx, x, nb, bs) in [(7, 3, 2, 8, 4, 4), (1, 1, 1, 1, 1, 1), (30, 2, 3, 5, 3, 7)] {
        let key: Vec<fuse_runtime::bf16> = rng.floats(t * h * dx * x, -3.0, 3.0);
        // Distinct slots, some negative (their place in a block is negative) or past the end.
        let mut order: Vec<i64> = (0..(nb * bs) as i64).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let slot: Vec<i64> = (0..t)
            .map(|i| match rng.below(8) {
                0 => -1 - rng.below(20) as i64,
                1 => (nb * bs) as i64 + rng.below(3) as i64,
                _ if i < order.len() => order[i],
                _ => -1,
            })
            .collect();
        let before: Vec<fuse_runtime::bf16> = rng.floats(nb * h * dx * bs * x, -9.0, 9.0);
        let mut cache = put(&dev, &before, &[nb, h, dx, bs, x]);
        kernels::writes::paged_cache(
            &dev,
            &put(&dev, &key, &[t, h, dx, x]),
            &put(&dev, &slot, &[t]),
            bs as i64,
            &mut cache,
        )
        .unwrap();
        let mut want = before.clone();
        for (ti, &s) in slot.iter().enumerate() {
            let (block, at) = (s / bs as i64, s % bs as i64);
            if !(0..nb as i64).contains(&block) || !(0..bs as i64).contains(&at) {
                continue;
            }
            let (block, at) = (block as usize, at as usize);
            for ((head, g), e) in (0..h)
                .flat_map(|a| (0..dx).map(move |b| (a, b)))
                .flat_map(|p| (0..x).map(move |e| (p, e)))
            {
                let src = ((ti * h + head) * dx + g) * x + e;
                want[(((block * h + head) * dx + g) * bs + at) * x + e] = key[src];
            }
        }
        let bits = |v: &[fuse_runtime::bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
        assert_exact(
            &format!("paged_cache {t}x{h}x{dx}x{x} into {nb}x{bs}"),
            &bits(&host(&cache)),
            &bits(&want),
        );
    }
    for (r, c, n) in [(9, 13, 40), (1, 1, 1), (64, 300, 7)] {
        let table = rng.floats::<f32>(r * c, -3.0, 3.0);
        let i: Vec<u32> = rng.indices(n, r).iter().map(|&v| v as u32).collect();
        let j = rng.indices(n, c);
        let got = kernels::gathers::pick(
            &dev,
            &put(&dev, &table, &[r, c]),
            &put(&dev, &i, &[n]),
            &put(&dev, &j, &[n]),
        )
        .unwrap();
        let want: Vec<f32> = i
            .iter()
            .zip(&j)
            .map(|(&a, &b)| match (a as usize, usize::try_from(b)) {
                (a, Ok(b)) if a < r && b < c => table[a * c + b] * 2.0,
                _ => 0.0,
            })
            .collect();
        assert_exact(&format!("pick {r}x{c} by {n}"), &host(&got), &want);
    }
}

#[test]
fn the_key_and_value_caches_are_written_in_one_call() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    let (t, h, d, slots) = (9, 2, 5, 13);
    let key = rng.floats::<f32>(t * h * d, -3.0, 3.0);
    let value = rng.floats::<f32>(t * h * d, -3.0, 3.0);
    let slot: Vec<i64> = (0..t as i64).map(|i| (i * 5 + 3) % slots as i64).collect();
    let (k0, v0) = (
        rng.floats::<f32>(slots * h * d, -9.0, 9.0),
        rng.floats::<f32>(slots * h * d, -9.0, 9.0),
    );
    let (mut kc, mut vc) = (
        put(&dev, &k0, &[slots, h, d]),
        put(&dev, &v0, &[slots, h, d]),
    );
    kernels::writes::kv_cache(
        &dev,
        &put(&dev, &key, &[t, h, d]),
        &put(&dev, &value, &[t, h, d]),
        &put(&dev, &slot, &[t]),
        &mut kc,
        &mut vc,
    )
    .unwrap();
    let (mut wk, mut wv) = (k0.clone(), v0.clone());
    for (i, &s) in slot.iter().enumerate() {
        let row = h * d;
        wk[s as usize * row..][..row].copy_from_slice(&key[i * row..][..row]);
        wv[s as usize * row..][..row].copy_from_slice(&value[i * row..][..row]);
    }
    assert_exact("key cache", &host(&kc), &wk);
    assert_exact("value cache", &host(&vc), &wv);
    // One cache for both is an alias: an error, and nothing written.
    let mut alias = kc.reshape(&[slots, h, d]).unwrap();
    let e = kernels::writes::kv_cache(
        &dev,
        &put(&dev, &key, &[t, h, d]),
        &put(&dev, &value, &[t, h, d]),
        &put(&dev, &slot, &[t]),
        &mut kc,
        &mut alias,
    );
    assert!(matches!(e, Err(Error::Alias { .. })), "{e:?}");
    assert_exact("key cache after the alias", &host(&kc), &wk);
}

#[test]
fn halves_and_pairs_of_one_buffer_concatenate() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (t, d) in [(5, 33), (1, 1), (3, 8), (0, 4)] {
        let a = rng.floats_special::<f32>(t * d, -3.0, 3.0);
        let b = rng.floats::<f32>(t * d, -3.0, 3.0);
        let mut out = put(&dev, &rng.floats::<f32>(t * 2 * d, -1.0, 1.0), &[t, 2 * d]);
        kernels::writes::concat(
            &dev,
            &put(&dev, &a, &[t, d]),
            &put(&dev, &b, &[t, d]),
            &mut out,
        )
        .unwrap();
        let want: Vec<u32> = (0..t)
            .flat_map(|r| {
                let (a, b) = (&a[r * d..][..d], &b[r * d..][..d]);
                a.iter()
                    .copied()
                    .chain(b.iter().map(|v| v * 2.0))
                    .collect::<Vec<f32>>()
            })
            .map(f32::to_bits)
            .collect();
        let got: Vec<u32> = host(&out).iter().map(|v| v.to_bits()).collect();
        assert_exact(&format!("concat {t}x{d}"), &got, &want);

        let a16: Vec<fuse_runtime::f16> = rng.floats(t * d, -3.0, 3.0);
        let b16: Vec<fuse_runtime::f16> = rng.floats(t * d, -3.0, 3.0);
        let mut out = put(
            &dev,
            &rng.floats::<fuse_runtime::f16>(t * d * 2, -1.0, 1.0),
            &[t, d * 2],
        );
        kernels::writes::interleave(
            &dev,
            &put(&dev, &a16, &[t, d]),
            &put(&dev, &b16, &[t, d]),
            &mut out,
        )
        .unwrap();
        let want: Vec<u16> = a16
            .iter()
            .zip(&b16)
            .flat_map(|(a, b)| [a.to_bits(), b.to_bits()])
            .collect();
        let got: Vec<u16> = host(&out).iter().map(|v| v.to_bits()).collect();
        assert_exact(&format!("interleave {t}x{d}"), &got, &want);
    }
}

#[test]
fn a_scatter_runs_beside_a_returned_output_and_fills_rows() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (n, c, m) in [(6, 7, 10), (1, 1, 1), (40, 33, 3)] {
        let x = rng.floats::<f32>(n * c, -3.0, 3.0);
        let bias = rng.floats::<f32>(c, -1.0, 1.0);
        // Distinct rows, some out of range.
        let idx: Vec<u32> = (0..n as u32)
            .map(|i| if i % 4 == 3 { m as u32 + i } else { i })
            .collect();
        let before = rng.floats::<f32>(m * c, -9.0, 9.0);
        let mut table = put(&dev, &before, &[m, c]);
        let twice = kernels::writes::scatter_and_return(
            &dev,
            &put(&dev, &x, &[n, c]),
            &put(&dev, &idx, &[n]),
            &put(&dev, &bias, &[c]),
            &mut table,
        )
        .unwrap();
        let want_twice: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
        assert_exact(&format!("returned {n}x{c}"), &host(&twice), &want_twice);
        let mut want = before.clone();
        for (i, &r) in idx.iter().enumerate() {
            if (r as usize) < m {
                for j in 0..c {
                    want[r as usize * c + j] = x[i * c + j] + bias[j];
                }
            }
        }
        assert_exact(&format!("scattered {n}x{c} into {m}"), &host(&table), &want);

        let rows: Vec<i32> = rng.indices(3, m).iter().map(|&i| i as i32).collect();
        let mut table = put(&dev, &before, &[m, c]);
        kernels::writes::fill_rows(&dev, &put(&dev, &rows, &[3]), 0.5, &mut table).unwrap();
        let mut want = before.clone();
        for &r in &rows {
            if (0..m as i32).contains(&r) {
                want[r as usize * c..][..c].fill(0.5);
            }
        }
        assert_exact(&format!("filled rows of {m}x{c}"), &host(&table), &want);
    }
}

/// Reductions over several dims at once (`mean(x, (c, s))`), against sums written here.
mod merged {
    use super::*;
    use fuse_runtime::bf16;
    use kernels::merged;

    /// The sum (or max, min) over the dims `reduced` of a row-major tensor of `shape`, in f64:
    /// the result's elements in row-major order of the dims kept.
    fn reduce(
        x: &[f64],
        shape: &[usize],
        reduced: &[usize],
        init: f64,
        f: impl Fn(f64, f64) -> f64,
    ) -> Vec<f64> {
        let kept: Vec<usize> = (0..shape.len()).filter(|d| !reduced.contains(d)).collect();
        let n: usize = kept.iter().map(|&d| shape[d]).product();
        let mut out = vec![init; n];
        for (i, &v) in x.iter().enumerate() {
            let (mut rest, mut coords) = (i, vec![0; shape.len()]);
            for d in (0..shape.len()).rev() {
                coords[d] = rest % shape[d];
                rest /= shape[d];
            }
            let at = kept.iter().fold(0, |a, &d| a * shape[d] + coords[d]);
            out[at] = f(out[at], v);
        }
        out
    }

    fn f64s(v: &[f32]) -> Vec<f64> {
        v.iter().map(|&x| x as f64).collect()
    }

    #[test]
    fn group_norm_matches_its_definition() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        for (b, g, c, s) in [(1, 1, 1, 1), (2, 3, 5, 7), (3, 2, 4, 33), (1, 4, 3, 1000)] {
            let x = rng.floats::<f32>(b * g * c * s, -3.0, 3.0);
            let w = rng.floats::<f32>(g * c, 0.5, 1.5);
            let bias = rng.floats::<f32>(g * c, -1.0, 1.0);
            let y = merged::group_norm(
                &dev,
                &put(&dev, &x, &[b, g, c, s]),
                &put(&dev, &w, &[g, c]),
                &put(&dev, &bias, &[g, c]),
                1e-5,
            )
            .unwrap();
            let n = (c * s) as f64;
            let xs = f64s(&x);
            let shape = [b, g, c, s];
            let mean: Vec<f64> = reduce(&xs, &shape, &[2, 3], 0.0, |a, v| a + v)
                .iter()
                .map(|v| v / n)
                .collect();
            let sq: Vec<f64> = xs
                .iter()
                .enumerate()
                .map(|(i, &v)| (v - mean[i / (c * s)]).powi(2))
                .collect();
            let var: Vec<f64> = reduce(&sq, &shape, &[2, 3], 0.0, |a, v| a + v)
                .iter()
                .map(|v| v / n)
                .collect();
            let want: Vec<f64> = xs
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let (row, ch) = (i / (c * s), (i / s) % (g * c));
                    (v - mean[row]) / (var[row] + 1e-5).sqrt() * w[ch] as f64 + bias[ch] as f64
                })
                .collect();
            assert_close(
                &format!("group_norm {b}x{g}x{c}x{s}"),
                &host(&y),
                &want,
                &Tol::close(1e-4, 1e-4),
            );
        }
    }

    #[test]
    fn bf16_group_norm_returns_its_statistics() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        let (b, g, c, s) = (3, 2, 5, 17);
        let x: Vec<bf16> = rng
            .floats::<f32>(b * g * c * s, -2.0, 2.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let w: Vec<bf16> = rng
            .floats::<f32>(g * c, 0.5, 1.5)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let (y, mu, rstd) =
            merged::group_norm_bf16(&dev, &put(&dev, &x, &[b, g, c, s]), &put(&dev, &w, &[g, c]))
                .unwrap();
        let xs: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        let n = (c * s) as f64;
        let want_mu: Vec<f64> = reduce(&xs, &[b, g, c, s], &[2, 3], 0.0, |a, v| a + v)
            .iter()
            .map(|v| v / n)
            .collect();
        assert_close(
            "bf16 group_norm mean",
            &host(&mu),
            &want_mu,
            &Tol::close(1e-5, 1e-6),
        );
        let sq: Vec<f64> = xs
            .iter()
            .enumerate()
            .map(|(i, &v)| (v - want_mu[i / (c * s)]).powi(2))
            .collect();
        let want_rstd: Vec<f64> = reduce(&sq, &[b, g, c, s], &[2, 3], 0.0, |a, v| a + v)
            .iter()
            .map(|v| 1.0 / (v / n + 1e-5).sqrt())
            .collect();
        assert_close(
            "bf16 group_norm rstd",
            &host(&rstd),
            &want_rstd,
            &Tol::close(1e-5, 1e-6),
        );
        let want_y: Vec<f64> = xs
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let row = i / (c * s);
                (v - want_mu[row]) * want_rstd[row] * w[(i / s) % (g * c)].to_f64()
            })
            .collect();
        let got: Vec<f64> = host(&y).iter().map(|v| v.to_f64()).collect();
        assert_close(
            "bf16 group_norm",
            &got,
            &want_y,
            &Tol::close(1.0 / 128.0, 1e-2),
        );
    }

    #[test]
    fn every_reduction_over_two_dims_and_their_indices() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        for (a, c, s) in [(1, 1, 1), (3, 5, 7), (2, 1, 300), (4, 33, 2)] {
            let x = rng.floats::<f32>(a * c * s, -3.0, 3.0);
            let (sum, max, min, lse, weighted) =
                merged::reductions(&dev, &put(&dev, &x, &[a, c, s])).unwrap();
            let xs = f64s(&x);
            let shape = [a, c, s];
            let tol = Tol::close(1e-5, 1e-4);
            let want_sum = reduce(&xs, &shape, &[1, 2], 0.0, |p, v| p + v);
            assert_close("sum over (c, s)", &host(&sum), &want_sum, &tol);
            let want_max = reduce(&xs, &shape, &[1, 2], f64::NEG_INFINITY, f64::max);
            assert_close(
                "max over (c, s)",
                &host(&max),
                &want_max,
                &Tol::close(0.0, 0.0),
            );
            let want_min = reduce(&xs, &shape, &[1, 2], f64::INFINITY, f64::min);
            assert_close(
                "min over (c, s)",
                &host(&min),
                &want_min,
                &Tol::close(0.0, 0.0),
            );
            let exps: Vec<f64> = xs
                .iter()
                .enumerate()
                .map(|(i, &v)| (v - want_max[i / (c * s)]).exp())
                .collect();
            let want_lse: Vec<f64> = reduce(&exps, &shape, &[1, 2], 0.0, |p, v| p + v)
                .iter()
                .zip(&want_max)
                .map(|(e, m)| e.ln() + m)
                .collect();
            assert_close("logsumexp over (c, s)", &host(&lse), &want_lse, &tol);
            let w: Vec<f64> = xs
                .iter()
                .enumerate()
                .map(|(i, &v)| v * ((i / s) % c) as f64 - (i % s) as f64)
                .collect();
            let want_w = reduce(&w, &shape, &[1, 2], 0.0, |p, v| p + v);
            let scale = (c * s * (c + s)) as f64 * 3.0;
            assert_close(
                "index(c) and index(s)",
                &host(&weighted),
                &want_w,
                &Tol::close(1e-5, scale * 1e-6),
            );
        }
    }

    #[test]
    fn leading_middle_and_three_dims() {
        let (dev, mut rng) = (Device::cpu(), Rng::new());
        for (c, s, n) in [(1, 1, 1), (3, 7, 5), (17, 4, 129)] {
            let x = rng.floats::<f32>(c * s * n, -3.0, 3.0);
            let got = merged::leading(&dev, &put(&dev, &x, &[c, s, n])).unwrap();
            let want = reduce(&f64s(&x), &[c, s, n], &[0, 1], 0.0, |p, v| p + v);
            assert_close(
                "sum over leading (c, s)",
                &host(&got),
                &want,
                &Tol::close(1e-5, 1e-4),
            );
        }
        for (a, c, s, n) in [(2, 3, 5, 7), (1, 2, 2, 130), (3, 1, 9, 1)] {
            let x = rng.floats::<f32>(a * c * s * n, -3.0, 3.0);
            let (m, d) = merged::middle(&dev, &put(&dev, &x, &[a, c, s, n])).unwrap();
            let xs = f64s(&x);
            let want: Vec<f64> = reduce(&xs, &[a, c, s, n], &[1, 2], 0.0, |p, v| p + v)
                .iter()
                .map(|v| v / (c * s) as f64)
                .collect();
            assert_close(
                "mean over middle (c, s)",
                &host(&m),
                &want,
                &Tol::close(1e-5, 1e-5),
            );
            let want_d: Vec<f64> = xs
                .iter()
                .enumerate()
                .map(|(i, &v)| v - want[(i / (c * s * n)) * n + i % n])
                .collect();
            assert_close("x - mean", &host(&d), &want_d, &Tol::close(1e-5, 1e-5));
        }
        let (a, b, c, d) = (3, 2, 5, 7);
        let x = rng.floats::<f64>(a * b * c * d, -3.0, 3.0);
        let got = merged::three(&dev, &put(&dev, &x, &[a, b, c, d])).unwrap();
        let want = reduce(&x, &[a, b, c, d], &[1, 2, 3], 0.0, |p, v| p + v);
        assert_close(
            "sum over (b, c, d)",
            &host(&got),
            &want,
            &Tol::close(1e-12, 1e-12),
        );
    }
}

/// `mixed_width_extrema`: f32 and f64 maxima and minima of rows in one loop, NaN ignored.
#[test]
fn mixed_width_extrema_ignore_nan() {
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (r, c) in [(1, 1), (3, 7), (5, 130)] {
        let mut x = rng.floats::<f32>(r * c, -5.0, 5.0);
        let mut y = rng.floats::<f64>(r * c, -5.0, 5.0);
        x[0] = f32::NAN;
        y[r * c - 1] = f64::NAN;
        let (lx, ly, mx, my) =
            kernels::mixed_width_extrema(&dev, &put(&dev, &x, &[r, c]), &put(&dev, &y, &[r, c]))
                .unwrap();
        let rows =
            |v: &[f64], f: &dyn Fn(&[f64]) -> f64| -> Vec<f64> { v.chunks(c).map(f).collect() };
        let (xs, ys): (Vec<f64>, Vec<f64>) = (x.iter().map(|&v| v as f64).collect(), y.clone());
        let numbers = |row: &[f64]| {
            row.iter()
                .copied()
                .filter(|v| !v.is_nan())
                .collect::<Vec<f64>>()
        };
        let lse = |row: &[f64]| {
            if row.iter().any(|v| v.is_nan()) {
                return f64::NAN;
            }
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
        };
        let least = |row: &[f64]| numbers(row).into_iter().fold(f64::INFINITY, f64::min);
        let most = |row: &[f64]| numbers(row).into_iter().fold(f64::NEG_INFINITY, f64::max);
        let (want_lx, want_ly) = (rows(&xs, &lse), rows(&ys, &lse));
        for (what, got, want) in [
            (
                "f32 logsumexp",
                host(&lx).iter().map(|&v| v as f64).collect::<Vec<_>>(),
                want_lx,
            ),
            ("f64 logsumexp", host(&ly), want_ly),
        ] {
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    g.is_nan() == w.is_nan()
                        && (w.is_nan() || (g - w).abs() <= 1e-5 * w.abs().max(1.0)),
                    "{what} {r}x{c}: {g} against {w}"
                );
            }
        }
        let got_mx: Vec<f64> = host(&mx).iter().map(|&v| v as f64).collect();
        assert_eq!(got_mx, rows(&xs, &least), "f32 min {r}x{c}");
        assert_eq!(host(&my), rows(&ys, &most), "f64 max {r}x{c}");
    }
}

/// `nonnegative_against_constants` on the CPU: the meaning the GPU test holds it to.
#[test]
fn nan_fails_comparisons_with_constants_below_zero() {
    let dev = Device::cpu();
    let (x, y, lo) = (
        vec![0.0f32, 1.0, -6.0],
        vec![0.0f32, 4.0, 2.0],
        vec![-3.0f32, 0.5, -9.0],
    );
    let (c, a, s, w) = kernels::nonnegative_against_constants(
        &dev,
        &put(&dev, &x, &[3]),
        &put(&dev, &y, &[3]),
        &put(&dev, &lo, &[3]),
    )
    .unwrap();
    let (c, w) = (host(&c), host(&w));
    // 0 / 0 is NaN through both clamps; 0.25 is below `lo` = 0.5; 3 is above -2 (and -1).
    assert!(c[0].is_nan() && w[0].is_nan());
    assert_eq!((c[1], c[2]), (0.5, -2.0));
    assert_eq!((w[1], w[2]), (0.5, -1.0));
    assert_eq!(host(&a), [false, true, true]);
    assert_eq!(host(&s), [false, true, true]);
}

/// `permute` reads each element where the parameter's own layout has it: a transpose, LSEs
/// `[h, t]` beside `[t, h, d]`, a softmax and a sum along the dim whose stride is not one.
#[test]
fn permuted_views_read_each_element_where_it_is() {
    use kernels::permuted;
    let (dev, mut rng) = (Device::cpu(), Rng::new());
    for (r, c) in [(1, 1), (3, 5), (17, 64), (2, 1031)] {
        let x = rng.floats::<f32>(r * c, -3.0, 3.0);
        let y = rng.floats::<f32>(c * r, -3.0, 3.0);
        let yt = |i: usize, j: usize| y[j * r + i] as f64;
        let got = permuted::transposed_add(&dev, &put(&dev, &x, &[r, c]), &put(&dev, &y, &[c, r]));
        let want: Vec<f64> = (0..r * c).map(|e| x[e] as f64 + yt(e / c, e % c)).collect();
        assert_close(
            "transposed_add",
            &got.unwrap().to_vec().unwrap(),
            &want,
            &Tol::close(1e-6, 1e-6),
        );
        let got = permuted::softmax_of_transpose(&dev, &put(&dev, &y, &[c, r])).unwrap();
        let want: Vec<f64> = (0..r * c)
            .map(|e| {
                let (i, j) = (e / c, e % c);
                let max = (0..c).map(|k| yt(i, k)).fold(f64::MIN, f64::max);
                let total: f64 = (0..c).map(|k| (yt(i, k) - max).exp()).sum();
                (yt(i, j) - max).exp() / total
            })
            .collect();
        assert_close(
            "softmax_of_transpose",
            &got.to_vec().unwrap(),
            &want,
            &Tol::close(1e-5, 1e-6),
        );
        let got =
            permuted::sums_of_products(&dev, &put(&dev, &x, &[r, c]), &put(&dev, &y, &[c, r]));
        let want: Vec<f64> = (0..r)
            .map(|i| (0..c).map(|j| x[i * c + j] as f64 * yt(i, j)).sum())
            .collect();
        assert_close(
            "sums_of_products",
            &got.unwrap().to_vec().unwrap(),
            &want,
            &Tol::close(1e-5, 1e-4),
        );
    }
    for (a, c, s) in [(1, 1, 1), (3, 5, 7), (2, 17, 64)] {
        let x = rng.floats::<f32>(a * c * s, -3.0, 3.0);
        let y = rng.floats::<f32>(s * c * a, -3.0, 3.0);
        let got =
            permuted::merged_sums(&dev, &put(&dev, &x, &[a, c, s]), &put(&dev, &y, &[s, c, a]));
        let want: Vec<f64> = (0..a)
            .map(|i| {
                let at =
                    |j: usize, k: usize| (x[(i * c + j) * s + k] * y[(k * c + j) * a + i]) as f64;
                (0..c)
                    .flat_map(|j| (0..s).map(move |k| (j, k)))
                    .map(|(j, k)| at(j, k))
                    .sum()
            })
            .collect();
        assert_close(
            "merged_sums",
            &got.unwrap().to_vec().unwrap(),
            &want,
            &Tol::close(1e-5, 1e-4),
        );
    }
    for (t, h, d) in [(1, 1, 1), (5, 3, 8), (7, 4, 33)] {
        let q = rng.floats::<f32>(t * h * d, -3.0, 3.0);
        let qh: Vec<fuse_runtime::bf16> =
            q.iter().map(|&v| fuse_runtime::bf16::from_f32(v)).collect();
        let lse = rng.floats::<f32>(h * t, -2.0, 2.0);
        let got =
            permuted::scaled_heads(&dev, &put(&dev, &qh, &[t, h, d]), &put(&dev, &lse, &[h, t]));
        let want: Vec<f64> = (0..t * h * d)
            .map(|e| {
                let (token, head) = (e / (h * d), e / d % h);
                qh[e].to_f32() as f64 * (lse[head * t + token] as f64).exp()
            })
            .collect();
        assert_close(
            "scaled_heads",
            &got.unwrap().to_vec().unwrap(),
            &want,
            &Tol::close(1.0 / 128.0, 1e-6),
        );
    }
}
