//! The conversions of the fp8 element types, `f8e4m3` (OCP E4M3, "e4m3fn") and `f8e5m2` (OCP
//! E5M2), as the CPU backend computes them: bit for bit the GPU's (`fz_f8e4m3` and `fz_f8e5m2`
//! in the generated CUDA C), which are CUDA's `__NV_SATFINITE` conversions of `cuda_fp8.h`.
//!
//! From f32: to nearest, ties to even; a value that would round past the largest finite value
//! (448 and 57344), an infinity included, saturates to it; every NaN becomes `0x7f`, as CUDA
//! makes it (`float8`'s own `from_f32` keeps a NaN's sign instead). To f32: exact, a NaN as
//! `0x7fffffff`.

use float8::{F8E4M3, F8E5M2};

/// An fp8 format: its mantissa bits, exponent bias and largest finite value.
struct Format {
    mantissa: u32,
    bias: u32,
    max: f32,
}

const E4M3: Format = Format {
    mantissa: 3,
    bias: 7,
    max: 448.0,
};

const E5M2: Format = Format {
    mantissa: 2,
    bias: 15,
    max: 57344.0,
};

impl Format {
    /// The bits of an f32 whose magnitude is the least normal value of this format.
    fn min_normal_bits(&self) -> u32 {
        (127 + 1 - self.bias) << 23
    }

    /// The least subnormal value's reciprocal, a power of two.
    fn subnormal_scale(&self) -> f32 {
        f32::from_bits((127 + self.bias - 1 + self.mantissa) << 23)
    }

    /// The power of two whose last place in f32 is the least subnormal value.
    fn subnormal_magic(&self) -> f32 {
        f32::from_bits((127 + 23 - (self.bias - 1 + self.mantissa)) << 23)
    }

    /// `x` rounded to this format's code, as the CUDA C computes it: the magnitude clamped to
    /// the largest value (all above it rounds or saturates to it), then rounded.
    fn encode(&self, x: f32) -> u8 {
        let u = x.to_bits();
        let a = u & 0x7fff_ffff;
        if a > 0x7f80_0000 {
            return 0x7f;
        }
        let m = a.min(self.max.to_bits());
        let code = if m < self.min_normal_bits() {
            // A multiple of the least subnormal: the f32 addition rounds it in its last place.
            let magic = self.subnormal_magic();
            (f32::from_bits(m) + magic).to_bits() - magic.to_bits()
        } else {
            // The f32's bits rounded at this format's last mantissa bit, the exponent rebiased.
            let drop = 23 - self.mantissa;
            let rounded = (m + (1 << (drop - 1)) - 1 + ((m >> drop) & 1)) >> drop;
            rounded - ((127 - self.bias) << self.mantissa)
        };
        ((u >> 24) & 0x80) as u8 | code as u8
    }

    /// The magnitude of a finite code whose low 7 bits are `a`.
    fn magnitude(&self, a: u32) -> f32 {
        if a < 1 << self.mantissa {
            a as f32 / self.subnormal_scale()
        } else {
            f32::from_bits((a << (23 - self.mantissa)) + ((127 - self.bias) << 23))
        }
    }

    fn signed(code: u8, magnitude: f32) -> f32 {
        f32::from_bits(magnitude.to_bits() | (u32::from(code & 0x80) << 24))
    }
}

/// An f32 rounded to `f8e4m3`, as the GPU rounds it.
pub fn f8e4m3_from_f32(x: f32) -> F8E4M3 {
    F8E4M3::from_bits(E4M3.encode(x))
}

/// The value of an `f8e4m3`, exactly; its NaNs (`0x7f`, `0xff`) are `0x7fffffff`.
pub fn f8e4m3_to_f32(x: F8E4M3) -> f32 {
    let a = u32::from(x.to_bits() & 0x7f);
    match a {
        0x7f => f32::from_bits(0x7fff_ffff),
        _ => Format::signed(x.to_bits(), E4M3.magnitude(a)),
    }
}

/// An f32 rounded to `f8e5m2`, as the GPU rounds it.
pub fn f8e5m2_from_f32(x: f32) -> F8E5M2 {
    F8E5M2::from_bits(E5M2.encode(x))
}

/// The value of an `f8e5m2`, exactly: `0x7c` and `0xfc` are the infinities, the codes above
/// them NaN (`0x7fffffff`).
pub fn f8e5m2_to_f32(x: F8E5M2) -> f32 {
    let a = u32::from(x.to_bits() & 0x7f);
    match a {
        0x7c => Format::signed(x.to_bits(), f32::INFINITY),
        0x7d.. => f32::from_bits(0x7fff_ffff),
        _ => Format::signed(x.to_bits(), E5M2.magnitude(a)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 256 codes of a format as f32 (by this module), and its conversion back to bits.
    struct Case {
        name: &'static str,
        to_f32: fn(u8) -> f32,
        from_f32: fn(f32) -> u8,
        /// The reference: `float8`'s conversion of the value (a port of `cuda_fp8.hpp`'s),
        /// which keeps a NaN's sign where CUDA's f32 conversion does not.
        reference: fn(u8) -> f32,
        max: f32,
    }

    fn cases() -> [Case; 2] {
        [
            Case {
                name: "f8e4m3",
                to_f32: |c| f8e4m3_to_f32(F8E4M3::from_bits(c)),
                from_f32: |x| f8e4m3_from_f32(x).to_bits(),
                reference: |c| F8E4M3::from_bits(c).to_f32(),
                max: 448.0,
            },
            Case {
                name: "f8e5m2",
                to_f32: |c| f8e5m2_to_f32(F8E5M2::from_bits(c)),
                from_f32: |x| f8e5m2_from_f32(x).to_bits(),
                reference: |c| F8E5M2::from_bits(c).to_f32(),
                max: 57344.0,
            },
        ]
    }

    /// Every code's value is `float8`'s, and converts back to the code, except NaN (to 0x7f)
    /// and e5m2's infinities (saturated).
    #[test]
    fn every_code_converts_to_f32_and_back_exactly() {
        for case in cases() {
            let (mut nans, mut infinities) = (0, 0);
            for code in 0..=255u8 {
                let x = (case.to_f32)(code);
                let want = (case.reference)(code);
                if want.is_nan() {
                    assert_eq!(x.to_bits(), 0x7fff_ffff, "{} {code:#04x}", case.name);
                    assert_eq!((case.from_f32)(x), 0x7f, "{} {code:#04x}", case.name);
                    nans += 1;
                    continue;
                }
                assert_eq!(x.to_bits(), want.to_bits(), "{} {code:#04x}", case.name);
                let back = (case.from_f32)(x);
                if x.is_infinite() {
                    // e5m2's infinities: the conversion saturates them to the largest value.
                    let max = (case.from_f32)(case.max);
                    assert_eq!(back, max | (code & 0x80), "{} {code:#04x}", case.name);
                    infinities += 1;
                    continue;
                }
                assert_eq!(back, code, "{} {code:#04x} is {x}", case.name);
            }
            // e4m3fn: NaN 0x7f and 0xff, no infinities; e5m2: NaN 0x7d..=0x7f and their
            // negatives, infinities 0x7c and 0xfc.
            let e4m3 = case.name == "f8e4m3";
            assert_eq!((nans, infinities), if e4m3 { (2, 0) } else { (6, 2) });
        }
    }

    /// The codes of the finite non-negative values, in increasing order.
    fn finite(case: &Case) -> Vec<(u8, f32)> {
        (0..0x80u8)
            .map(|c| (c, (case.to_f32)(c)))
            .filter(|(_, x)| x.is_finite())
            .collect()
    }

    #[test]
    fn midpoints_round_to_even_and_their_neighbours_to_nearest() {
        for case in cases() {
            let values = finite(&case);
            assert!(values.windows(2).all(|w| w[0].1 < w[1].1), "{}", case.name);
            for pair in values.windows(2) {
                let ((lo, a), (hi, b)) = (pair[0], pair[1]);
                // Exact in f32: fp8 values have at most 4 significant bits.
                let mid = (a + b) / 2.0;
                assert_eq!(f64::from(mid), (f64::from(a) + f64::from(b)) / 2.0);
                let even = if lo % 2 == 0 { lo } else { hi };
                let below = f32::from_bits(mid.to_bits() - 1);
                let above = f32::from_bits(mid.to_bits() + 1);
                for (sign, s) in [(1.0f32, 0u8), (-1.0, 0x80)] {
                    let at = |x: f32| (case.from_f32)(sign * x);
                    assert_eq!(at(mid), even | s, "{} {}", case.name, sign * mid);
                    assert_eq!(at(below), lo | s, "{} {}", case.name, sign * below);
                    assert_eq!(at(above), hi | s, "{} {}", case.name, sign * above);
                }
            }
        }
    }

    #[test]
    fn past_the_largest_saturates_and_nan_is_0x7f() {
        for case in cases() {
            let max_code = (case.from_f32)(case.max);
            assert_eq!((case.to_f32)(max_code), case.max);
            let step = case.max - (case.to_f32)(max_code - 1);
            for x in [
                case.max + step / 2.0,
                case.max + step,
                case.max * 2.0,
                f32::MAX,
                f32::INFINITY,
            ] {
                assert_eq!((case.from_f32)(x), max_code, "{} {x}", case.name);
                assert_eq!((case.from_f32)(-x), max_code | 0x80, "{} {}", case.name, -x);
            }
            for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7f80_0001)] {
                assert_eq!((case.from_f32)(nan), 0x7f, "{}", case.name);
            }
        }
    }

    #[test]
    fn zeros_keep_their_sign() {
        for case in cases() {
            let least = (case.to_f32)(1);
            for x in [0.0, least / 2.0, 1e-30, f32::from_bits(1)] {
                assert_eq!((case.from_f32)(x), 0, "{} {x}", case.name);
                assert_eq!((case.from_f32)(-x), 0x80, "{} {}", case.name, -x);
            }
            assert_eq!((case.to_f32)(0x80).to_bits(), (-0.0f32).to_bits());
        }
    }

    /// Against `float8`'s port of CUDA's conversion, on a sweep of every 4099th f32 bit
    /// pattern: the same code for every value but NaN.
    #[test]
    fn agrees_with_the_cuda_reference() {
        type Conversion = fn(f32) -> u8;
        let checks: [(Conversion, Conversion); 2] = [
            (
                |x| f8e4m3_from_f32(x).to_bits(),
                |x| F8E4M3::from_f32(x).to_bits(),
            ),
            (
                |x| f8e5m2_from_f32(x).to_bits(),
                |x| F8E5M2::from_f32(x).to_bits(),
            ),
        ];
        for (ours, reference) in checks {
            for bits in (0..=u32::MAX).step_by(4099) {
                let x = f32::from_bits(bits);
                if !x.is_nan() {
                    assert_eq!(ours(x), reference(x), "{x:e} ({bits:#010x})");
                }
            }
        }
    }
}
