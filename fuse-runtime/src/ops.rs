//! CPU helper functions called by generated code: the language's functions that std does not have
//! with the same meaning (the ML vocabulary, `erf`, a panic-free `clamp`, integer division that
//! does not trap), or has only as formulas that overflow or lose accuracy where the GPU's do not
//! (`asinh`, `acosh`, `atanh`). Each matches the CUDA helper or function of the same name in the
//! generated source.

pub use crate::fp8::{f8e4m3_from_f32, f8e4m3_to_f32, f8e5m2_from_f32, f8e5m2_to_f32};
pub use crate::random::{normal as randn, uniform as rand};

/// One element `x` into `logsumexp`'s pair: the running maximum `m` and the sum `s` of
/// `exp(x - m)`, rescaled when `m` grows. The CUDA helper `fz_lse_add` does the same.
pub fn lse_add(m: &mut f64, s: &mut f64, x: f64) {
    if x > *m {
        *s = *s * (*m - x).exp() + 1.0;
        *m = x;
    } else {
        *s += if x == *m { 1.0 } else { (x - *m).exp() };
    }
}

/// Float operations of the CPU backend, for `f32` and `f64`.
pub trait Real: Copy + PartialOrd + core::ops::Neg<Output = Self> {
    fn erf(self) -> Self;
    fn asinh(self) -> Self;
    fn acosh(self) -> Self;
    fn atanh(self) -> Self;
    fn sigmoid(self) -> Self;
    fn silu(self) -> Self;
    fn gelu(self) -> Self;
    fn gelu_tanh(self) -> Self;
    fn gelu_grad(self) -> Self;
    fn softplus(self) -> Self;
    fn rsqrt(self) -> Self;
    fn zero() -> Self;
    fn powi(self, n: i32) -> Self;
}

// The inverse hyperbolic functions are libm's (musl's), not std's, whose formulas fail where
// the GPU's functions do not: `asinh` and `acosh` overflow to infinity near the type's largest
// value (where the answer is about 89.4 for f32), `acosh` takes `ln` of a value near 1 for `x`
// near 1 (54,000 ulps off in f64 at 1 + 4e-13), and `atanh`, `0.5 * ln_1p(2x / (1 - x))`,
// takes `ln_1p` near -1 for `x` near -1 (363,000 ulps off in f32 at -0.99999994).
macro_rules! real {
    ($t:ident, $sqrt_half:expr, $sqrt_2_over_pi:expr) => {
        impl Real for $t {
            fn erf(self) -> Self {
                libm::Libm::<$t>::erf(self)
            }
            fn asinh(self) -> Self {
                libm::Libm::<$t>::asinh(self)
            }
            /// NaN below 1 by a test of its own: libm's `acosh` does not check the sign on its
            /// path for `2 <= |x| < 2^12` (f32) or `2^26` (f64), and returns finite values for
            /// many `x <= -2`.
            fn acosh(self) -> Self {
                if self < 1.0 {
                    <$t>::NAN
                } else {
                    libm::Libm::<$t>::acosh(self)
                }
            }
            fn atanh(self) -> Self {
                libm::Libm::<$t>::atanh(self)
            }
            fn sigmoid(self) -> Self {
                1.0 / (1.0 + (-self).exp())
            }
            fn silu(self) -> Self {
                self / (1.0 + (-self).exp())
            }
            fn gelu(self) -> Self {
                0.5 * self * (1.0 + libm::Libm::<$t>::erf(self * $sqrt_half))
            }
            fn gelu_tanh(self) -> Self {
                0.5 * self
                    * (1.0 + ($sqrt_2_over_pi * (self + 0.044715 * self * self * self)).tanh())
            }
            /// `gelu`'s derivative, computed in f64 and rounded once.
            fn gelu_grad(self) -> Self {
                gelu_grad_f64(self as f64) as $t
            }
            fn softplus(self) -> Self {
                self.max(0.0) + (-self.abs()).exp().ln_1p()
            }
            /// Computed in f64 and rounded once: the correctly rounded value the GPU's
            /// `__frsqrt_rn` gives for f32.
            fn rsqrt(self) -> Self {
                (1.0 / (self as f64).sqrt()) as $t
            }
            fn zero() -> Self {
                0.0
            }
            /// Exponentiation by squaring in compiler-rt's order (`__powisf2`), as the CUDA helper.
            fn powi(self, n: i32) -> Self {
                let (mut a, mut b, mut r) = (self, n, 1.0 as $t);
                loop {
                    if b & 1 != 0 {
                        r *= a;
                    }
                    b /= 2;
                    if b == 0 {
                        break;
                    }
                    a *= a;
                }
                if n < 0 {
                    1.0 / r
                } else {
                    r
                }
            }
        }
    };
}

/// `gelu`'s derivative `Φ(x) + x φ(x)`, with `Φ` from `erfc`, which keeps its relative accuracy
/// where `Φ` is small (`0.5 * (1 + erf(..))` does not), as the CUDA helper `fz_gelu_grad` in f64.
/// Infinities give NaN (`x φ(x)` is `inf * 0`), as the derivative written out did.
#[allow(clippy::excessive_precision)]
fn gelu_grad_f64(x: f64) -> f64 {
    let pdf = (-0.5 * x * x).exp() * 0.398942280401432678;
    0.5 * libm::erfc(-x * core::f64::consts::FRAC_1_SQRT_2) + x * pdf
}

// The same decimal constants as the CUDA helpers, so both round them to the same value.
#[allow(clippy::excessive_precision)]
mod constants {
    pub const SQRT_HALF_F32: f32 = core::f32::consts::FRAC_1_SQRT_2;
    pub const SQRT_HALF_F64: f64 = core::f64::consts::FRAC_1_SQRT_2;
    pub const SQRT_2_OVER_PI_F32: f32 = 0.797884560802865356;
    pub const SQRT_2_OVER_PI_F64: f64 = 0.797884560802865356;
}

real!(f32, constants::SQRT_HALF_F32, constants::SQRT_2_OVER_PI_F32);
real!(f64, constants::SQRT_HALF_F64, constants::SQRT_2_OVER_PI_F64);

pub fn erf<T: Real>(x: T) -> T {
    x.erf()
}
pub fn asinh<T: Real>(x: T) -> T {
    x.asinh()
}
pub fn acosh<T: Real>(x: T) -> T {
    x.acosh()
}
pub fn atanh<T: Real>(x: T) -> T {
    x.atanh()
}
pub fn sigmoid<T: Real>(x: T) -> T {
    x.sigmoid()
}
pub fn silu<T: Real>(x: T) -> T {
    x.silu()
}
pub fn gelu<T: Real>(x: T) -> T {
    x.gelu()
}
pub fn gelu_tanh<T: Real>(x: T) -> T {
    x.gelu_tanh()
}
pub fn gelu_grad<T: Real>(x: T) -> T {
    x.gelu_grad()
}
pub fn softplus<T: Real>(x: T) -> T {
    x.softplus()
}
pub fn rsqrt<T: Real>(x: T) -> T {
    x.rsqrt()
}
pub fn powi<T: Real>(x: T, n: i32) -> T {
    x.powi(n)
}

/// `max(x, 0)` that keeps NaN, as `torch.relu`.
pub fn relu<T: Real>(x: T) -> T {
    if x < T::zero() {
        T::zero()
    } else {
        x
    }
}

/// Rust's `clamp` without its panic on `lo > hi` or NaN bounds: NaN `x` stays NaN.
pub fn clamp<T: PartialOrd>(x: T, lo: T, hi: T) -> T {
    if x < lo {
        lo
    } else if x > hi {
        hi
    } else {
        x
    }
}

/// Integer division and remainder of the language: wrapping, and defined at zero (`x / 0 == 0`,
/// `x % 0 == x`) where Rust panics, identically on every backend.
pub trait Int: Copy {
    fn div(self, b: Self) -> Self;
    fn rem(self, b: Self) -> Self;
}

macro_rules! int {
    ($($t:ty),*) => {$(
        impl Int for $t {
            fn div(self, b: Self) -> Self {
                if b == 0 { 0 } else { self.wrapping_div(b) }
            }
            fn rem(self, b: Self) -> Self {
                if b == 0 { self } else { self.wrapping_rem(b) }
            }
        }
    )*};
}

int!(i8, u8, i16, u16, i32, u32, i64, u64);

pub fn div<T: Int>(a: T, b: T) -> T {
    a.div(b)
}
pub fn rem<T: Int>(a: T, b: T) -> T {
    a.rem(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_division_is_total() {
        assert_eq!(div(7i32, 0), 0);
        assert_eq!(rem(7i32, 0), 7);
        assert_eq!(div(i32::MIN, -1), i32::MIN);
        assert_eq!(rem(i32::MIN, -1), 0);
        assert_eq!(div(-7i64, 2), -3);
        assert_eq!(rem(-7i64, 2), -1);
        assert_eq!(div(i8::MIN, -1), i8::MIN);
        assert_eq!(rem(u16::MAX, 0), u16::MAX);
    }

    #[test]
    fn powi_matches_repeated_multiplication() {
        assert_eq!(powi(1.5f64, 3), 1.5 * 1.5 * 1.5);
        assert_eq!(powi(2.0f32, -2), 0.25);
        assert_eq!(powi(3.0f32, 0), 1.0);
    }

    #[test]
    fn ml_functions_match_their_definitions() {
        let x = 0.7311f64;
        assert!((gelu(x) - 0.5 * x * (1.0 + libm::erf(x / 2f64.sqrt()))).abs() < 1e-15);
        assert!((softplus(x) - (x.exp() + 1.0).ln()).abs() < 1e-15);
        assert!((softplus(-40.0f64) - (-40.0f64).exp()).abs() < 1e-25);
        assert!((sigmoid(x) * (1.0 + (-x).exp()) - 1.0).abs() < 1e-15);
        assert!(relu(f32::NAN).is_nan());
        assert_eq!(relu(-2.0f32), 0.0);
        assert!(clamp(f32::NAN, 0.0, 1.0).is_nan());
        assert_eq!(clamp(5, 0, 3), 3);
    }

    /// `gelu`'s derivative against central differences of `gelu` in f64, its known values, and
    /// in f32 the f64 value rounded once.
    #[test]
    fn gelu_grad_is_gelus_derivative() {
        for x in [-7.3f64, -3.1, -0.75, -0.2, 0.0, 0.4, 1.0, 2.9, 9.0] {
            let h = 1e-5;
            let fd = (gelu(x + h) - gelu(x - h)) / (2.0 * h);
            assert!(
                (gelu_grad(x) - fd).abs() < 1e-9,
                "{x}: {} {fd}",
                gelu_grad(x)
            );
            assert_eq!(gelu_grad(x as f32), gelu_grad(x as f32 as f64) as f32);
        }
        assert_eq!(gelu_grad(0.0f64), 0.5);
        assert!((gelu_grad(1.0f64) - 1.0833154705876864).abs() < 1e-15);
        // -8, where `0.5 * (1 + erf(..))` would round Φ (6.2e-16) to a multiple of 2^-53:
        // `φ(8) (R(8) - 8)`, Mills' ratio `R(8)` by its asymptotic series.
        let pdf = (-32.0f64).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let mills = 1.0 / 8.0 - 1.0 / 512.0 + 3.0 / 32768.0 - 15.0 / 2097152.0;
        assert!((gelu_grad(-8.0f64) / (pdf * (mills - 8.0)) - 1.0).abs() < 1e-6);
        assert_eq!(gelu_grad(40.0f32), 1.0);
        assert!(gelu_grad(f64::INFINITY).is_nan() && gelu_grad(f32::NAN).is_nan());
    }
}
