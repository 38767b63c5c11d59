//! Element types and the types of expressions while they are checked.

use std::fmt;

/// An element type of the language.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Elem {
    F32,
    F64,
    /// IEEE half precision (`half::f16` on the host), stored as 16 bits and computed in f32.
    F16,
    /// bfloat16 (`half::bf16` on the host), stored as 16 bits and computed in f32.
    BF16,
    /// OCP fp8 E4M3 ("e4m3fn": no infinities, 448 at most; `float8::F8E4M3` on the host),
    /// stored as 8 bits and computed in f32.
    F8E4M3,
    /// OCP fp8 E5M2 (f16's exponent, 2 bits of mantissa; `float8::F8E5M2` on the host), stored
    /// as 8 bits and computed in f32.
    F8E5M2,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    Bool,
}

impl Elem {
    pub const ALL: [Elem; 15] = [
        Elem::F32,
        Elem::F64,
        Elem::F16,
        Elem::BF16,
        Elem::F8E4M3,
        Elem::F8E5M2,
        Elem::I8,
        Elem::U8,
        Elem::I16,
        Elem::U16,
        Elem::I32,
        Elem::U32,
        Elem::I64,
        Elem::U64,
        Elem::Bool,
    ];

    pub fn from_name(name: &str) -> Option<Elem> {
        Elem::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The names of the element types that `keep`, for messages: `f32, f64, .. and bool`.
    pub fn list_text(keep: impl Fn(Elem) -> bool) -> String {
        let names: Vec<&str> = Elem::ALL
            .into_iter()
            .filter(|&e| keep(e))
            .map(Elem::name)
            .collect();
        let (last, rest) = names.split_last().expect("there are element types");
        format!("{} and {last}", rest.join(", "))
    }

    /// The language's name, which is also the Rust name of the primitive types and of `half`'s
    /// (see [`Elem::host_name`]).
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F64 => "f64",
            Elem::F16 => "f16",
            Elem::BF16 => "bf16",
            Elem::F8E4M3 => "f8e4m3",
            Elem::F8E5M2 => "f8e5m2",
            Elem::I8 => "i8",
            Elem::U8 => "u8",
            Elem::I16 => "i16",
            Elem::U16 => "u16",
            Elem::I32 => "i32",
            Elem::U32 => "u32",
            Elem::I64 => "i64",
            Elem::U64 => "u64",
            Elem::Bool => "bool",
        }
    }

    /// The name of the Rust type of the elements, under the runtime's root for the narrow floats:
    /// `f16` and `bf16` (`half`'s), `F8E4M3` and `F8E5M2` (`float8`'s, as candle names them).
    pub fn host_name(self) -> &'static str {
        match self {
            Elem::F8E4M3 => "F8E4M3",
            Elem::F8E5M2 => "F8E5M2",
            _ => self.name(),
        }
    }

    /// The CUDA C type of values: `float` for the narrow floats, which are computed in f32.
    pub fn c_name(self) -> &'static str {
        match self {
            Elem::F32 | Elem::F16 | Elem::BF16 | Elem::F8E4M3 | Elem::F8E5M2 => "float",
            Elem::F64 => "double",
            Elem::I8 => "signed char",
            Elem::U8 => "unsigned char",
            Elem::I16 => "short",
            Elem::U16 => "unsigned short",
            Elem::I32 => "int",
            Elem::U32 => "unsigned int",
            Elem::I64 => "long long",
            Elem::U64 => "unsigned long long",
            Elem::Bool => "bool",
        }
    }

    /// The CUDA C type of elements in memory: the bits (`unsigned short`, `unsigned char`) for
    /// the narrow floats.
    pub fn c_storage(self) -> &'static str {
        match self {
            Elem::F16 | Elem::BF16 => "unsigned short",
            Elem::F8E4M3 | Elem::F8E5M2 => "unsigned char",
            _ => self.c_name(),
        }
    }

    /// The type whose arithmetic computes this type's values: f32 for the narrow floats.
    pub fn compute(self) -> Elem {
        if self.is_narrow_float() {
            Elem::F32
        } else {
            self
        }
    }

    /// Whether this is a float narrower than f32 (f16, bf16 and the fp8 types): stored as its
    /// bits, held in f32, and rounded where it is stored or cast.
    pub fn is_narrow_float(self) -> bool {
        matches!(self, Elem::F16 | Elem::BF16 | Elem::F8E4M3 | Elem::F8E5M2)
    }

    /// `x` rounded to this float type (to nearest, ties to even), as the f32 that holds it
    /// exactly; `x` itself for f32 and f64. A value past the type's largest rounds to infinity
    /// here, also for the fp8 types, whose conversions saturate: this is the rounding of
    /// literals, for which that is an error ([`Elem::float_overflows`]).
    pub fn round(self, x: f32) -> f32 {
        match self {
            Elem::BF16 if !x.is_nan() => {
                let u = x.to_bits();
                f32::from_bits(u.wrapping_add(0x7fff + ((u >> 16) & 1)) & 0xffff_0000)
            }
            Elem::F16 if x.is_finite() => round_f16(x),
            Elem::F8E4M3 if x.is_finite() => round_small(x, 3, -6, 448.0),
            Elem::F8E5M2 if x.is_finite() => round_small(x, 2, -14, 57344.0),
            _ => x,
        }
    }

    /// Whether the float literal `digits` rounds to infinity in this type.
    pub fn float_overflows(self, digits: &str) -> bool {
        self != Elem::F64
            && self
                .round(digits.parse::<f32>().unwrap_or(0.0))
                .is_infinite()
    }

    /// The unsigned CUDA C type in which wrapping arithmetic is defined: of the same width, or
    /// `unsigned int` for types narrower than C's `int`, which C would promote to `int` (where
    /// `u16 * u16` could overflow); the result is converted back, keeping the low bits.
    pub fn c_unsigned(self) -> &'static str {
        match self.bits() {
            64 => "unsigned long long",
            _ => "unsigned int",
        }
    }

    /// The unsigned CUDA C type of exactly this integer type's width, to read its bits.
    pub fn c_bits(self) -> &'static str {
        match self.bits() {
            8 => "unsigned char",
            16 => "unsigned short",
            32 => "unsigned int",
            _ => "unsigned long long",
        }
    }

    /// Whether C arithmetic on this integer type must go through [`Elem::c_unsigned`] to wrap:
    /// signed types (whose overflow C leaves undefined) and types narrower than `int`.
    pub fn wraps_via_unsigned(self) -> bool {
        self.is_signed_int() || (self.is_int() && self.bits() < 32)
    }

    pub fn is_float(self) -> bool {
        self == Elem::F32 || self == Elem::F64 || self.is_narrow_float()
    }

    pub fn is_int(self) -> bool {
        matches!(
            self,
            Elem::I8
                | Elem::U8
                | Elem::I16
                | Elem::U16
                | Elem::I32
                | Elem::U32
                | Elem::I64
                | Elem::U64
        )
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, Elem::I8 | Elem::I16 | Elem::I32 | Elem::I64)
    }

    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }

    /// The width in bits of a value in memory.
    pub fn bits(self) -> u32 {
        match self {
            Elem::I8 | Elem::U8 | Elem::Bool | Elem::F8E4M3 | Elem::F8E5M2 => 8,
            Elem::I16 | Elem::U16 | Elem::F16 | Elem::BF16 => 16,
            Elem::I32 | Elem::U32 | Elem::F32 => 32,
            Elem::I64 | Elem::U64 | Elem::F64 => 64,
        }
    }

    /// The least and greatest values of an integer type.
    pub fn int_bounds(self) -> (i128, i128) {
        match self {
            Elem::I8 => (i8::MIN.into(), i8::MAX.into()),
            Elem::U8 => (0, u8::MAX.into()),
            Elem::I16 => (i16::MIN.into(), i16::MAX.into()),
            Elem::U16 => (0, u16::MAX.into()),
            Elem::I32 => (i32::MIN.into(), i32::MAX.into()),
            Elem::U32 => (0, u32::MAX.into()),
            Elem::I64 => (i64::MIN.into(), i64::MAX.into()),
            Elem::U64 => (0, u64::MAX.into()),
            _ => unreachable!("only integer types have integer bounds"),
        }
    }

    /// The values of an integer type, as a Rust range.
    pub fn range_text(self) -> String {
        if !self.is_int() {
            return String::new();
        }
        let (lo, hi) = self.int_bounds();
        format!("{lo}..={hi}")
    }

    /// Whether `value` (an integer literal) fits this integer type.
    pub fn int_fits(self, value: i128) -> bool {
        if !self.is_int() {
            return true;
        }
        let (lo, hi) = self.int_bounds();
        (lo..=hi).contains(&value)
    }
}

/// A finite f32 rounded to f16 (to nearest, ties to even): to 11 significant bits where f16 is
/// normal, to a multiple of 2^-24 (its subnormal spacing) below, and to infinity past f16::MAX.
fn round_f16(x: f32) -> f32 {
    const MIN_NORMAL: f32 = 1.0 / 16384.0;
    const SUBNORMAL_STEP: f32 = 16_777_216.0;
    if x.abs() < MIN_NORMAL {
        return (x * SUBNORMAL_STEP).round_ties_even() / SUBNORMAL_STEP;
    }
    let u = x.to_bits();
    let r = f32::from_bits(u.wrapping_add(0xfff + ((u >> 13) & 1)) & !0x1fff);
    if r.abs() > 65504.0 {
        f32::INFINITY.copysign(x)
    } else {
        r
    }
}

/// A finite f32 rounded (to nearest, ties to even) to a float of `mantissa` bits after the
/// point whose least normal exponent is `min_exp`: to a multiple of the spacing at `x`'s
/// exponent, or at `min_exp` below it (the subnormals), and to infinity past `max`. Scaling by a
/// power of two is exact, so one rounding is made.
fn round_small(x: f32, mantissa: i32, min_exp: i32, max: f32) -> f32 {
    let exp = ((x.to_bits() >> 23) & 0xff) as i32 - 127;
    let step = 2f32.powi(exp.max(min_exp) - mantissa);
    let r = (x / step).round_ties_even() * step;
    if r.abs() > max {
        f32::INFINITY.copysign(x)
    } else {
        r
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type of an expression being checked: an element type, or a literal whose type the context
/// has not fixed yet (Rust's `{integer}` and `{float}`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ty {
    Elem(Elem),
    IntLit,
    FloatLit,
}

impl Ty {
    pub fn elem(self) -> Option<Elem> {
        match self {
            Ty::Elem(e) => Some(e),
            _ => None,
        }
    }

    pub fn is_literal(self) -> bool {
        !matches!(self, Ty::Elem(_))
    }

    /// The type a literal takes when nothing fixes it, as in Rust.
    pub fn defaulted(self) -> Elem {
        match self {
            Ty::Elem(e) => e,
            Ty::IntLit => Elem::I32,
            Ty::FloatLit => Elem::F64,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Ty::FloatLit) || self.elem().is_some_and(Elem::is_float)
    }

    pub fn is_int(self) -> bool {
        matches!(self, Ty::IntLit) || self.elem().is_some_and(Elem::is_int)
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, Ty::IntLit) || self.elem().is_some_and(Elem::is_signed_int)
    }

    pub fn is_bool(self) -> bool {
        self == Ty::Elem(Elem::Bool)
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Ty::Elem(e) => write!(f, "{e}"),
            Ty::IntLit => f.write_str("{integer}"),
            Ty::FloatLit => f.write_str("{float}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Elem;

    #[test]
    fn halfs_round_to_nearest_even() {
        assert_eq!(Elem::F16.round(0.1), 0.099975586);
        assert_eq!(Elem::F16.round(2049.0), 2048.0, "a tie goes to even");
        assert_eq!(Elem::F16.round(2051.0), 2052.0);
        assert_eq!(Elem::F16.round(65519.0), 65504.0);
        assert_eq!(Elem::F16.round(65520.0), f32::INFINITY);
        assert_eq!(
            Elem::F16.round(-1e-7),
            -1.1920929e-7,
            "subnormal: 2 * 2^-24"
        );
        assert_eq!(Elem::F16.round(2.9e-8), 0.0);
        assert_eq!(Elem::BF16.round(0.1), f32::from_bits(0x3dcd_0000));
        assert_eq!(Elem::BF16.round(257.0), 256.0, "a tie goes to even");
        assert_eq!(Elem::BF16.round(f32::MAX), f32::INFINITY);
        assert!(Elem::BF16.round(f32::NAN).is_nan());
        assert!(Elem::F16.float_overflows("70000") && !Elem::F16.float_overflows("60000"));
        assert!(Elem::F32.float_overflows("1e40") && !Elem::F64.float_overflows("1e40"));
    }

    #[test]
    fn fp8s_round_to_nearest_even() {
        let e4m3 = |x: f32| Elem::F8E4M3.round(x);
        assert_eq!(e4m3(0.1), 0.1015625, "13 * 2^-7");
        assert_eq!(e4m3(1.0625), 1.0, "a tie goes to even");
        assert_eq!(e4m3(1.1875), 1.25);
        assert_eq!(e4m3(464.0), 448.0, "the tie above the largest goes to it");
        assert_eq!(e4m3(464.1), f32::INFINITY);
        assert_eq!(
            e4m3(-0.0029296875),
            -0.00390625,
            "subnormal: a tie 1.5 * 2^-9 to 2^-8"
        );
        assert_eq!(
            e4m3(0.0009765625),
            0.0,
            "half the least subnormal ties to 0"
        );
        assert_eq!(e4m3(-1e-30).to_bits(), (-0.0f32).to_bits());
        let e5m2 = |x: f32| Elem::F8E5M2.round(x);
        assert_eq!(e5m2(0.1), 0.09375, "3 * 2^-5");
        assert_eq!(e5m2(1.125), 1.0, "a tie goes to even");
        assert_eq!(e5m2(61439.0), 57344.0);
        assert_eq!(
            e5m2(61440.0),
            f32::INFINITY,
            "the tie above the largest is odd's"
        );
        assert_eq!(
            e5m2(3.0 * 2f32.powi(-17)),
            2f32.powi(-15),
            "a subnormal tie"
        );
        assert!(Elem::F8E4M3.float_overflows("500") && !Elem::F8E4M3.float_overflows("460"));
        assert!(Elem::F8E5M2.round(f32::NAN).is_nan());
    }
}
