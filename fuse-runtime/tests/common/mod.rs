//! Helpers shared by the language tests: a seeded random generator, float64 and exact-integer
//! reference helpers, comparisons that name the failing element, and the GPU gate.
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod kernels;

use std::cell::Cell;
use std::fmt::{Debug, Display};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use fuse_runtime::{bf16, f16, Buffer, Device, Element, Error, F8E4M3, F8E5M2};

/// The sizes of one-dimensional tests: one element, around a warp (31, 33), just past a
/// 4096-element block multiple, and empty.
pub const SIZES: [usize; 5] = [0, 1, 31, 33, 4097];

/// `(rows, cols)` for two-dimensional tests: a prime number of rows, one long row, one column,
/// and empty dims on either side.
pub const SHAPES_2D: [(usize, usize); 7] = [
    (37, 33),
    (1, 4097),
    (31, 1),
    (1, 1),
    (5, 257),
    (0, 5),
    (5, 0),
];

/// `(b, t, c)` for three-dimensional tests, each dim empty in one of them.
pub const SHAPES_3D: [(usize, usize, usize); 6] = [
    (3, 37, 33),
    (2, 1, 31),
    (1, 33, 1),
    (0, 3, 4),
    (2, 0, 3),
    (3, 5, 0),
];

// ---------------------------------------------------------------------------------------------
// Random inputs.

/// A small splitmix64 generator, seeded from the clock (or from `FUSE_SEED`) so that every run
/// tests fresh inputs.
///
/// The first generator a test makes draws the test's seed and prints it (the harness shows
/// the print only when the test fails); further generators of the same test derive their
/// seeds from it, in order. Each test runs on a thread of its own, so `FUSE_SEED=<seed>`
/// replays every generator of that test.
pub struct Rng {
    state: u64,
}

thread_local! {
    /// This thread's (test's) seed and how many generators it has made.
    static TEST_SEED: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

impl Rng {
    /// The test's next generator; the first one draws the test's seed.
    pub fn new() -> Rng {
        let (seed, made) = TEST_SEED.get().unwrap_or_else(|| {
            let seed = fresh_seed();
            eprintln!("random inputs from seed {seed:#x}; replay with FUSE_SEED={seed:#x}");
            (seed, 0)
        });
        TEST_SEED.set(Some((seed, made + 1)));
        let mut rng = Rng { state: seed };
        for _ in 0..made {
            rng.state = rng.next_u64();
        }
        rng
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// `n` floats uniform in `[lo, hi)`, never all zero.
    pub fn floats<T: Float>(&mut self, n: usize, lo: f64, hi: f64) -> Vec<T> {
        let v = (0..n).map(|_| T::from_f64(self.uniform(lo, hi))).collect();
        not_all_zero(v, T::from_f64(1.0))
    }

    /// `n` floats with `min_abs <= |x| < max_abs` and a random sign.
    pub fn floats_away<T: Float>(&mut self, n: usize, min_abs: f64, max_abs: f64) -> Vec<T> {
        (0..n)
            .map(|_| T::from_f64(self.uniform(min_abs, max_abs) * self.sign()))
            .collect()
    }

    /// `n` factors of random sign whose magnitudes are near 1, closer for larger `n`, so that
    /// their product stays far from overflow and underflow.
    pub fn factors<T: Float>(&mut self, n: usize) -> Vec<T> {
        let spread = (2.0 / (n.max(1) as f64).sqrt()).min(0.1);
        self.floats_away(n, 1.0 - spread, 1.0 + spread)
    }

    /// `n` floats of random sign whose magnitudes spread over `2^lo ..= 2^hi`.
    pub fn floats_wide<T: Float>(&mut self, n: usize, lo: f64, hi: f64) -> Vec<T> {
        (0..n)
            .map(|_| T::from_f64(self.uniform(lo, hi).exp2() * self.sign()))
            .collect()
    }

    /// Like [`Rng::floats`], with about one value in six replaced by a special one: NaN
    /// (either sign), infinities, signed zeros, halves, the largest and smallest magnitudes,
    /// subnormals.
    pub fn floats_special<T: Float>(&mut self, n: usize, lo: f64, hi: f64) -> Vec<T> {
        let mut v = self.floats::<T>(n, lo, hi);
        for x in &mut v {
            if self.below(6) == 0 {
                *x = T::SPECIALS[self.below(T::SPECIALS.len() as u64) as usize];
            }
        }
        not_all_zero(v, T::from_f64(1.0))
    }

    /// `n` integers over the full range of `T`, about one in six a special value (0, 1, -1,
    /// MIN, MAX, a small number), never all zero.
    pub fn ints<T: Int>(&mut self, n: usize) -> Vec<T> {
        let v = (0..n)
            .map(|_| match self.below(12) {
                0 => T::from_i128(0),
                1 => T::from_i128(1),
                2 => T::from_i128(-1),
                3 => T::MIN,
                4 => T::MAX,
                5 => T::from_i128(self.below(64) as i128 - 32),
                _ => T::from_i128(i128::from(self.next_u64())),
            })
            .collect();
        not_all_zero(v, T::from_i128(1))
    }

    /// `n` integers uniform in `lo..=hi`, which must fit `T`.
    pub fn ints_in<T: Int>(&mut self, n: usize, lo: i128, hi: i128) -> Vec<T> {
        let span = (hi - lo + 1) as u64;
        (0..n)
            .map(|_| T::from_i128(lo + i128::from(self.below(span))))
            .collect()
    }

    /// `n` indices into a dim of `len` for a gather: mostly inside it, about one in eight
    /// outside (negative, or `len` and past), where a gather reads zero.
    pub fn indices(&mut self, n: usize, len: usize) -> Vec<i64> {
        (0..n)
            .map(|_| match self.below(8) {
                0 => -1 - self.below(3) as i64,
                1 => len as i64 + self.below(3) as i64,
                _ => self.below(len.max(1) as u64) as i64,
            })
            .collect()
    }

    /// `n` random bools, with both values once `n >= 2`.
    pub fn bools(&mut self, n: usize) -> Vec<bool> {
        let mut v: Vec<bool> = (0..n).map(|_| self.next_u64() & 1 == 1).collect();
        if n >= 2 {
            v[0] = true;
            v[1] = false;
        }
        v
    }

    /// 1 or -1, each half the time.
    pub fn sign(&mut self) -> f64 {
        if self.next_u64() & 1 == 1 {
            -1.0
        } else {
            1.0
        }
    }
}

impl Default for Rng {
    fn default() -> Rng {
        Rng::new()
    }
}

/// The seed in `FUSE_SEED`, or one from the clock.
fn fresh_seed() -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    if let Ok(text) = std::env::var("FUSE_SEED") {
        return parse_seed(&text);
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Tests start in parallel within a clock tick; the counter tells them apart.
    nanos
        ^ COUNT
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn parse_seed(text: &str) -> u64 {
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|e| panic!("FUSE_SEED={text:?} is not a u64: {e}"))
}

/// `v` with its first element replaced by `one` when every element is zero.
fn not_all_zero<T: Element>(mut v: Vec<T>, one: T) -> Vec<T> {
    if !v.is_empty() && v.iter().all(|x| *x == T::default()) {
        v[0] = one;
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Element types.

/// `f32` and `f64`, seen through f64.
pub trait Float: Element + Into<f64> + Display {
    /// The machine epsilon, as an f64.
    const EPSILON: f64;
    /// The smallest positive (subnormal) value, as an f64.
    const TINY: f64;
    /// The largest finite value, as an f64.
    const MAX: f64;
    /// Values that inputs mix in to reach the edge cases.
    const SPECIALS: &'static [Self];
    /// The value nearest to `v` (rounding as `as` does).
    fn from_f64(v: f64) -> Self;

    /// The tolerance of an elementwise chain of a few correctly rounded operations and
    /// transcendental functions: `1e-5` relative for f32, `1e-12` for f64, with an absolute
    /// floor for results that cancel to near zero.
    fn math_tol() -> Tol {
        if Self::EPSILON > 1e-10 {
            Tol::close(1e-5, 1e-6)
        } else {
            Tol::close(1e-12, 1e-14)
        }
    }

    /// The relative tolerance of a sum, as a fraction of the sum of magnitudes.
    fn sum_rel() -> f64 {
        if Self::EPSILON > 1e-10 {
            1e-5
        } else {
            1e-12
        }
    }
}

impl Float for f32 {
    const EPSILON: f64 = f32::EPSILON as f64;
    const TINY: f64 = 1.5e-45;
    const MAX: f64 = f32::MAX as f64;
    const SPECIALS: &'static [f32] = &[
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        0.5,
        -2.5,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        -1.0e-40,
    ];
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
}

impl Float for f64 {
    const EPSILON: f64 = f64::EPSILON;
    const TINY: f64 = 5.0e-324;
    const MAX: f64 = f64::MAX;
    const SPECIALS: &'static [f64] = &[
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        0.5,
        -2.5,
        f64::MAX,
        f64::MIN,
        f64::MIN_POSITIVE,
        -1.0e-310,
    ];
    fn from_f64(v: f64) -> f64 {
        v
    }
}

/// Implements [`Float`] for a 16-bit float: an ulp relative for elementwise results (one
/// rounding of an f32 computation), and f32's accumulation for sums.
macro_rules! half_float {
    ($t:ident, $tiny:expr) => {
        impl Float for $t {
            const EPSILON: f64 = $t::EPSILON.to_f64_const();
            const TINY: f64 = $tiny;
            const MAX: f64 = $t::MAX.to_f64_const();
            const SPECIALS: &'static [$t] = &[
                $t::NAN,
                $t::from_bits($t::NAN.to_bits() | 0x8000),
                $t::INFINITY,
                $t::NEG_INFINITY,
                $t::ZERO,
                $t::NEG_ZERO,
                $t::from_f64_const(0.5),
                $t::from_f64_const(-2.5),
                $t::MAX,
                $t::MIN,
                $t::MIN_POSITIVE,
                $t::from_bits(0x8003),
            ];
            /// Correctly rounded: `half`'s own `from_f64` drops low bits before it rounds.
            fn from_f64(v: f64) -> $t {
                $t::from_f32(f32_rounded_to_odd(v))
            }
            fn math_tol() -> Tol {
                Tol::close(<Self as Float>::EPSILON, 2.0 * <Self as Float>::TINY)
            }
            fn sum_rel() -> f64 {
                1e-5
            }
        }
    };
}

/// `v` rounded to f32 toward zero, with the last bit set if that was inexact ("round to odd"):
/// rounding this to a type of at most 22 significant bits gives the correctly rounded `v`.
fn f32_rounded_to_odd(v: f64) -> f32 {
    let f = v as f32;
    if !f.is_finite() || f64::from(f) == v {
        return f;
    }
    let toward_zero = if f64::from(f).abs() > v.abs() {
        f32::from_bits(f.to_bits() - 1)
    } else {
        f
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

half_float!(f16, 5.960464477539063e-8);
half_float!(bf16, 9.183549615799121e-41);

/// The integer element types, with exact reference arithmetic done in i128 and wrapped back.
pub trait Int: Exact + Eq + Ord + Display {
    const BITS: u32;
    const SIGNED: bool;
    const MIN: Self;
    const MAX: Self;
    /// The value as an i128 (exact).
    fn to_i128(self) -> i128;
    /// `v` modulo 2^BITS, as `as` converts.
    fn from_i128(v: i128) -> Self;
}

macro_rules! int {
    ($t:ident, $signed:expr) => {
        impl Int for $t {
            const BITS: u32 = $t::BITS;
            const SIGNED: bool = $signed;
            const MIN: $t = $t::MIN;
            const MAX: $t = $t::MAX;
            fn to_i128(self) -> i128 {
                self as i128
            }
            fn from_i128(v: i128) -> $t {
                v as $t
            }
        }
    };
}

int!(i32, true);
int!(u32, false);
int!(i64, true);
int!(u64, false);
int!(i8, true);
int!(u8, false);
int!(i16, true);
int!(u16, false);

// ---------------------------------------------------------------------------------------------
// Reference helpers: floats in f64, integers exact in i128 and wrapped to the element type.

/// Each value as an f64.
pub fn f64s<T: Float>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

/// Each value rounded to `T` and back, as an elementwise result of type `T` is.
pub fn rounded<T: Float>(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| T::from_f64(x).into()).collect()
}

/// Folds a row-major tensor of `shape` over `axis`, giving one value per position of the
/// other axes, in row-major order.
pub fn fold_axis<T: Copy, A: Copy>(
    x: &[T],
    shape: &[usize],
    axis: usize,
    init: A,
    f: impl Fn(A, T) -> A,
) -> Vec<A> {
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = vec![init; outer * inner];
    for o in 0..outer {
        for k in 0..len {
            for i in 0..inner {
                let slot = &mut out[o * inner + i];
                *slot = f(*slot, x[(o * len + k) * inner + i]);
            }
        }
    }
    out
}

/// For each element of a row-major tensor of `shape`, the index of its position with `axis`
/// removed: how a per-row result broadcasts back.
pub fn row_of(shape: &[usize], axis: usize) -> Vec<usize> {
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let total: usize = shape.iter().product();
    (0..total)
        .map(|e| (e / (len * inner)) * inner + e % inner)
        .collect()
}

/// The float reductions over `axis`: sum, product, max, min and mean, each in f64. Max and
/// min ignore NaN; over nothing they are -inf and +inf, and the mean is NaN.
pub struct FloatFolds {
    pub sum: Vec<f64>,
    pub prod: Vec<f64>,
    pub max: Vec<f64>,
    pub min: Vec<f64>,
    pub mean: Vec<f64>,
    /// The sum of magnitudes, which scales the tolerance of `sum` and `mean`.
    pub abs_sum: Vec<f64>,
}

impl FloatFolds {
    pub fn new(x: &[f64], y: &[f64], shape: &[usize], axis: usize) -> FloatFolds {
        let len = shape[axis] as f64;
        let sum = fold_axis(x, shape, axis, 0.0, |a, v| a + v);
        FloatFolds {
            prod: fold_axis(y, shape, axis, 1.0, |a, v| a * v),
            max: fold_axis(x, shape, axis, f64::NEG_INFINITY, f64::max),
            min: fold_axis(x, shape, axis, f64::INFINITY, f64::min),
            mean: sum.iter().map(|s| s / len).collect(),
            abs_sum: fold_axis(x, shape, axis, 0.0, |a, v| a + v.abs()),
            sum,
        }
    }
}

/// The tolerance of a sum over `len` values whose magnitudes add up to `abs_sum`, for `T`.
pub fn sum_tol<T: Float>(abs_sum: &[f64]) -> Tol {
    Tol::Bounds(
        abs_sum
            .iter()
            .map(|s| T::sum_rel() * s + f64::MIN_POSITIVE)
            .collect(),
    )
}

/// The tolerance of a mean over `len` values whose magnitudes add up to `abs_sum`.
pub fn mean_tol<T: Float>(abs_sum: &[f64], len: usize) -> Tol {
    let bounds = abs_sum.iter().map(|s| T::sum_rel() * s / len.max(1) as f64);
    Tol::Bounds(bounds.map(|b| b + f64::MIN_POSITIVE).collect())
}

/// The tolerance of a product of `len` factors in `T`: each rounding adds at most one epsilon
/// of relative error, in any order of evaluation.
pub fn prod_tol<T: Float>(len: usize) -> Tol {
    Tol::close((len as f64 + 2.0) * T::EPSILON, 0.0)
}

// ---------------------------------------------------------------------------------------------
// Comparisons.

/// How far a float result may be from the wanted one. NaN matches only NaN, and infinities
/// only themselves, whatever the tolerance.
#[derive(Clone, Debug)]
pub enum Tol {
    /// `|got - want| <= abs + rel * |want|`.
    Close { rel: f64, abs: f64 },
    /// `|got - want| <= bounds[i]` for element `i`.
    Bounds(Vec<f64>),
}

impl Tol {
    pub const EXACT: Tol = Tol::Close { rel: 0.0, abs: 0.0 };

    pub fn close(rel: f64, abs: f64) -> Tol {
        Tol::Close { rel, abs }
    }

    /// The largest difference allowed at element `i`, whose wanted value is `want`.
    fn bound(&self, i: usize, want: f64) -> f64 {
        match self {
            Tol::Close { rel, abs } => abs + rel * want.abs(),
            Tol::Bounds(b) => b[i],
        }
    }
}

/// Asserts that `got` matches the f64 reference `want` within `tol`; on failure names `what`,
/// the index, both values and the tolerance.
#[track_caller]
pub fn assert_close<T: Copy + Into<f64>>(what: &str, got: &[T], want: &[f64], tol: &Tol) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: got {} values, want {}",
        got.len(),
        want.len()
    );
    if let Tol::Bounds(b) = tol {
        assert_eq!(b.len(), want.len(), "{what}: one bound per value");
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g: f64 = g.into();
        let bound = tol.bound(i, w);
        let same = g == w || (g.is_nan() && w.is_nan());
        let near = g.is_finite() && w.is_finite() && (g - w).abs() <= bound;
        assert!(
            same || near,
            "{what}: element {i} of {}: got {g:e}, want {w:e}, difference {:e} > tolerance \
             {bound:e} ({tol:?})",
            got.len(),
            (g - w).abs()
        );
    }
}

/// Asserts that `got` equals `want` exactly (integers, bools); on failure names `what`, the
/// index and both values.
#[track_caller]
pub fn assert_exact<T: PartialEq + Debug>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: got {} values, want {}",
        got.len(),
        want.len()
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g == w,
            "{what}: element {i} of {}: got {g:?}, want {w:?}",
            got.len()
        );
    }
}

/// A buffer's elements (the test fails if they cannot be read).
#[track_caller]
pub fn host<T: Element>(b: &Buffer<T>) -> Vec<T> {
    b.to_vec().expect("read a buffer back")
}

/// A buffer of `shape` on `dev` holding `data`.
#[track_caller]
pub fn put<T: Element>(dev: &Device, data: &[T], shape: &[usize]) -> Buffer<T> {
    dev.upload(data)
        .and_then(|b| b.reshape(shape))
        .expect("upload a buffer")
}

// ---------------------------------------------------------------------------------------------
// GPU against CPU.

/// CUDA device 0, or `None` (with the reason printed) when there is none. With
/// `FUSE_REQUIRE_GPU=1` a missing GPU fails the test instead.
pub fn gpu() -> Option<Device> {
    match Device::cuda(0) {
        Ok(dev) => Some(dev),
        Err(e) if std::env::var("FUSE_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("FUSE_REQUIRE_GPU=1, but there is no GPU: {e}")
        }
        Err(e) => {
            eprintln!("skipping: no GPU: {e}");
            None
        }
    }
}

/// Whether the tests run under a compute-sanitizer (`gpu/sanitize` sets `FUSE_SANITIZE=1`),
/// where a test may leave out sizes that only its run time grows with: racecheck traces every
/// shared-memory access, and the short rows' 2^24-element shapes alone ran past 60 s.
pub fn sanitized() -> bool {
    std::env::var("FUSE_SANITIZE").as_deref() == Ok("1")
}

/// One output read back from a device, for comparing two devices without naming its type.
pub struct Output {
    pub shape: Vec<usize>,
    pub values: Values,
}

/// An output's elements: floats compared within a tolerance, everything else exactly.
pub enum Values {
    Float(Vec<f64>),
    Exact(Vec<i128>),
}

/// An element type's values as [`Values`].
pub trait ToValues: Element {
    fn values(v: Vec<Self>) -> Values;
}

impl ToValues for f32 {
    fn values(v: Vec<f32>) -> Values {
        Values::Float(f64s(&v))
    }
}

impl ToValues for f16 {
    fn values(v: Vec<f16>) -> Values {
        Values::Float(f64s(&v))
    }
}

impl ToValues for bf16 {
    fn values(v: Vec<bf16>) -> Values {
        Values::Float(f64s(&v))
    }
}

impl ToValues for f64 {
    fn values(v: Vec<f64>) -> Values {
        Values::Float(v)
    }
}

/// The fp8 types as their values, so that results computed through `exp` or a sum compare
/// within a tolerance; conversions compare their bits ([`fp8`]).
impl ToValues for F8E4M3 {
    fn values(v: Vec<F8E4M3>) -> Values {
        Values::Float(v.iter().map(F8E4M3::to_f64).collect())
    }
}

impl ToValues for F8E5M2 {
    fn values(v: Vec<F8E5M2>) -> Values {
        Values::Float(v.iter().map(F8E5M2::to_f64).collect())
    }
}

/// The integer and `bool` element types, compared exactly.
pub trait Exact: ToValues {
    /// The value as an i128; `bool` as 0 or 1.
    fn exact(self) -> i128;
}

macro_rules! exact {
    ($($t:ty),*) => {$(
        impl Exact for $t {
            fn exact(self) -> i128 {
                self as i128
            }
        }
        impl ToValues for $t {
            fn values(v: Vec<$t>) -> Values {
                Values::Exact(v.into_iter().map(Exact::exact).collect())
            }
        }
    )*};
}

exact!(i8, u8, i16, u16, i32, u32, i64, u64, bool);

/// What a kernel returns: one buffer or a tuple of them, read back as [`Output`]s.
pub trait Outputs {
    fn read(&self) -> Vec<Output>;
}

impl<T: ToValues> Outputs for Buffer<T> {
    fn read(&self) -> Vec<Output> {
        vec![Output {
            shape: self.shape().to_vec(),
            values: T::values(host(self)),
        }]
    }
}

macro_rules! tuple_outputs {
    ($($name:ident : $index:tt),*) => {
        impl<$($name: ToValues),*> Outputs for ($(Buffer<$name>,)*) {
            fn read(&self) -> Vec<Output> {
                let mut all = Vec::new();
                $(all.extend(self.$index.read());)*
                all
            }
        }
    };
}

tuple_outputs!(A: 0, B: 1);
tuple_outputs!(A: 0, B: 1, C: 2);
tuple_outputs!(A: 0, B: 1, C: 2, D: 3);
tuple_outputs!(A: 0, B: 1, C: 2, D: 3, E: 4);
tuple_outputs!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5);
tuple_outputs!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6);
tuple_outputs!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7);
tuple_outputs!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8);

/// Asserts that every output of a GPU run matches the CPU run of the same kernel on the same
/// inputs: shapes equal, integers and bools bit for bit, float output `j` within `tols[j]` (or
/// within `tols[0]` for every output when one tolerance is given).
#[track_caller]
pub fn assert_same_outputs(what: &str, gpu: &impl Outputs, cpu: &impl Outputs, tols: &[Tol]) {
    let (gpu, cpu) = (gpu.read(), cpu.read());
    assert_eq!(gpu.len(), cpu.len(), "{what}: number of outputs");
    for (j, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        let what = format!("{what}, output {j} (GPU against CPU)");
        assert_eq!(g.shape, c.shape, "{what}: shape");
        match (&g.values, &c.values) {
            (Values::Float(g), Values::Float(c)) => {
                let tol = if tols.len() == 1 { &tols[0] } else { &tols[j] };
                assert_close(&what, g, c, tol);
            }
            (Values::Exact(g), Values::Exact(c)) => assert_exact(&what, g, c),
            _ => unreachable!("{what}: both devices return the same types"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel outputs against references.

/// What one output of a kernel must be.
pub struct Expect {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Expected,
}

pub enum Expected {
    Float(Vec<f64>, Tol),
    Exact(Vec<i128>),
}

/// A float output `name` of `shape`: `values` within `tol`.
pub fn float(name: &str, shape: &[usize], values: Vec<f64>, tol: Tol) -> Expect {
    Expect {
        name: name.to_string(),
        shape: shape.to_vec(),
        values: Expected::Float(values, tol),
    }
}

/// An integer or `bool` output `name` of `shape`, equal to `values`.
pub fn exact<T: Exact>(name: &str, shape: &[usize], values: &[T]) -> Expect {
    exact128(name, shape, values.iter().map(|&v| v.exact()).collect())
}

/// An integer output `name` of `shape`, equal to `values` (given as i128).
pub fn exact128(name: &str, shape: &[usize], values: Vec<i128>) -> Expect {
    Expect {
        name: name.to_string(),
        shape: shape.to_vec(),
        values: Expected::Exact(values),
    }
}

/// Asserts that the outputs of one kernel call match `want`, in order: their number, each
/// shape, and each value (floats within the tolerance, the rest exactly).
#[track_caller]
pub fn assert_outputs(what: &str, got: &impl Outputs, want: &[Expect]) {
    let got = got.read();
    assert_eq!(got.len(), want.len(), "{what}: number of outputs");
    for (g, w) in got.iter().zip(want) {
        let what = format!("{what}: `{}`", w.name);
        assert_eq!(g.shape, w.shape, "{what}: shape");
        match (&g.values, &w.values) {
            (Values::Float(g), Expected::Float(w, tol)) => assert_close(&what, g, w, tol),
            (Values::Exact(g), Expected::Exact(w)) => assert_exact(&what, g, w),
            _ => panic!("{what}: the output's type is not the expected kind"),
        }
    }
}

/// Runs `run` (which uploads its inputs to the device it is given and calls a kernel) on the
/// GPU and on the CPU, and asserts that the outputs match (see [`assert_same_outputs`]).
#[track_caller]
pub fn assert_gpu_matches_cpu<R: Outputs>(
    gpu: &Device,
    what: &str,
    run: impl Fn(&Device) -> Result<R, Error>,
    tols: &[Tol],
) {
    let on_gpu = run(gpu).unwrap_or_else(|e| panic!("{what}: on the GPU: {e}"));
    let on_cpu = run(&Device::cpu()).unwrap_or_else(|e| panic!("{what}: on the CPU: {e}"));
    assert_same_outputs(what, &on_gpu, &on_cpu, tols);
}

/// Inputs and references for the fp8 types' conversions.
pub mod fp8 {
    use super::Rng;
    use fuse_runtime::{F8E4M3, F8E5M2};

    /// One fp8 type: its values and CUDA's `__NV_SATFINITE` conversion to it, by `float8` (a
    /// port of `cuda_fp8.hpp`), with every NaN to `0x7f` as CUDA's conversion of an f32 makes it.
    #[derive(Clone, Copy, Debug)]
    pub struct Format {
        pub name: &'static str,
        pub value: fn(u8) -> f32,
        pub code: fn(f32) -> u8,
        pub max: f32,
    }

    pub const E4M3: Format = Format {
        name: "f8e4m3",
        value: |c| F8E4M3::from_bits(c).to_f32(),
        code: |x| match x.is_nan() {
            true => 0x7f,
            false => F8E4M3::from_f32(x).to_bits(),
        },
        max: 448.0,
    };

    pub const E5M2: Format = Format {
        name: "f8e5m2",
        value: |c| F8E5M2::from_bits(c).to_f32(),
        code: |x| match x.is_nan() {
            true => 0x7f,
            false => F8E5M2::from_f32(x).to_bits(),
        },
        max: 57344.0,
    };

    /// Every code, then `extra` random ones, the whole turned by a random amount.
    pub fn codes(rng: &mut Rng, extra: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (0..=255).collect();
        v.extend((0..extra).map(|_| rng.below(256) as u8));
        let turn = rng.below(v.len() as u64) as usize;
        v.rotate_left(turn);
        v
    }

    /// The midpoint between each two neighbouring finite values of `f`, of either sign, with the
    /// two codes: the midpoint rounds to the even one of them.
    pub fn midpoints(f: Format) -> Vec<(f32, u8, u8)> {
        let finite: Vec<(u8, f32)> = (0..0x80u8)
            .map(|c| (c, (f.value)(c)))
            .filter(|(_, x)| x.is_finite())
            .collect();
        let mut out = vec![];
        for pair in finite.windows(2) {
            let ((lo, a), (hi, b)) = (pair[0], pair[1]);
            assert!(a < b, "{}: values in order", f.name);
            // Exact in f32: the values have at most 4 significant bits, 2^-9 apart at least.
            let mid = (a + b) / 2.0;
            out.push((mid, lo, hi));
            out.push((-mid, lo | 0x80, hi | 0x80));
        }
        out
    }

    /// f32 inputs for the conversions to both types: each value, each midpoint and the f32s
    /// just beside it, values at and past the largest, infinities, NaN, zeros, f32 subnormals,
    /// and `extra` random ones over the types' ranges and beyond; shuffled.
    pub fn edges(rng: &mut Rng, extra: usize) -> Vec<f32> {
        let mut v = vec![
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            -1.0e-40,
            464.0,
            -464.0,
            61440.0,
            -61440.0,
        ];
        for f in [E4M3, E5M2] {
            for code in 0..=255u8 {
                v.push((f.value)(code));
            }
            for (mid, _, _) in midpoints(f) {
                v.extend([
                    mid,
                    f32::from_bits(mid.to_bits() - 1),
                    f32::from_bits(mid.to_bits() + 1),
                ]);
            }
            v.extend([f.max * 1.5, -f.max * 2.0]);
        }
        for _ in 0..extra {
            let x = match rng.below(3) {
                0 => f32::from_bits(rng.next_u64() as u32),
                1 => (rng.uniform(-20.0, 17.0).exp2() * rng.sign()) as f32,
                _ => rng.uniform(-500.0, 500.0) as f32,
            };
            v.push(x);
        }
        for i in (1..v.len()).rev() {
            v.swap(i, rng.below(i as u64 + 1) as usize);
        }
        v
    }

    /// Asserts that `got` and `want` are the same bits, naming the first element that is not.
    #[track_caller]
    pub fn assert_bits<T: Copy + PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "{what}: element {i} of {}: got {:?}, want {:?}",
                got.len(),
                got[i],
                want[i]
            );
        }
    }
}
