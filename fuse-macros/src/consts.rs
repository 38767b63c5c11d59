//! The associated constants of the element types that a kernel may name, as in Rust:
//! `f32::INFINITY`, `f64::EPSILON`, `u32::MAX`. Each is a literal of its type with an exact value.

use crate::ty::Elem;

/// The constants of every float type, in the order messages list them.
pub const FLOAT_NAMES: [&str; 7] = [
    "NAN",
    "INFINITY",
    "NEG_INFINITY",
    "MAX",
    "MIN",
    "MIN_POSITIVE",
    "EPSILON",
];

/// The constants of every integer type.
pub const INT_NAMES: [&str; 2] = ["MIN", "MAX"];

/// The value of a constant.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A float, as text that Rust's `str::parse` reads back exactly in the constant's type:
    /// the shortest digits that round-trip, or `NaN`, `inf`, `-inf`. A 16-bit float's is the
    /// f32 that holds it exactly.
    Float(String),
    Int(i128),
}

/// The names of the constants of `elem`.
pub fn names(elem: Elem) -> &'static [&'static str] {
    if has_float_constants(elem) {
        &FLOAT_NAMES
    } else if elem.is_int() {
        &INT_NAMES
    } else {
        &[]
    }
}

/// Whether `elem` is one of the float types whose constants std (or `half`) defines: every
/// one of them has NaN and the infinities.
fn has_float_constants(elem: Elem) -> bool {
    matches!(elem, Elem::F32 | Elem::F64 | Elem::F16 | Elem::BF16)
}

/// The constant `elem::name`, if the language has it.
pub fn lookup(elem: Elem, name: &str) -> Option<Value> {
    if elem.is_int() {
        let (lo, hi) = elem.int_bounds();
        return match name {
            "MIN" => Some(Value::Int(lo)),
            "MAX" => Some(Value::Int(hi)),
            _ => None,
        };
    }
    if !has_float_constants(elem) {
        return None;
    }
    let text = match name {
        "NAN" => "NaN".to_string(),
        "INFINITY" => "inf".to_string(),
        "NEG_INFINITY" => "-inf".to_string(),
        _ => finite(elem, name)?,
    };
    Some(Value::Float(text))
}

/// The finite float constants, as the shortest text that reads back exactly.
fn finite(elem: Elem, name: &str) -> Option<String> {
    if elem == Elem::F64 {
        let v = match name {
            "MAX" => f64::MAX,
            "MIN" => f64::MIN,
            "MIN_POSITIVE" => f64::MIN_POSITIVE,
            "EPSILON" => f64::EPSILON,
            _ => return None,
        };
        return Some(format!("{v:?}"));
    }
    // The largest finite value, the least positive normal one, and the gap above 1, of each
    // float type computed in f32 (`half`'s constants for the 16-bit ones).
    let (max, min_positive, epsilon): (f32, f32, f32) = match elem {
        Elem::F32 => (f32::MAX, f32::MIN_POSITIVE, f32::EPSILON),
        Elem::F16 => (65504.0, 6.103_515_6e-5, 9.765_625e-4),
        Elem::BF16 => (f32::from_bits(0x7f7f_0000), f32::MIN_POSITIVE, 7.812_5e-3),
        _ => return None,
    };
    let v = match name {
        "MAX" => max,
        "MIN" => -max,
        "MIN_POSITIVE" => min_positive,
        "EPSILON" => epsilon,
        _ => return None,
    };
    Some(format!("{v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_of(elem: Elem, name: &str) -> f32 {
        match lookup(elem, name) {
            Some(Value::Float(t)) => t.parse().unwrap(),
            other => panic!("{other:?}"),
        }
    }

    /// Each constant reads back as exactly std's (or `half`'s) value.
    #[test]
    fn constants_are_exact() {
        for (name, v) in [
            ("MAX", f32::MAX),
            ("MIN", f32::MIN),
            ("MIN_POSITIVE", f32::MIN_POSITIVE),
            ("EPSILON", f32::EPSILON),
            ("INFINITY", f32::INFINITY),
            ("NEG_INFINITY", f32::NEG_INFINITY),
        ] {
            assert_eq!(f32_of(Elem::F32, name).to_bits(), v.to_bits(), "{name}");
        }
        assert!(f32_of(Elem::F32, "NAN").is_nan());
        for (name, v) in [
            ("MAX", f64::MAX),
            ("MIN", f64::MIN),
            ("MIN_POSITIVE", f64::MIN_POSITIVE),
            ("EPSILON", f64::EPSILON),
        ] {
            let Some(Value::Float(t)) = lookup(Elem::F64, name) else {
                panic!("{name}")
            };
            assert_eq!(t.parse::<f64>().unwrap().to_bits(), v.to_bits(), "{name}");
        }
        // f16: 65504, 2^-14, 2^-10; bf16: 0x7f7f, 2^-126, 2^-7; each a value of its type.
        assert_eq!(f32_of(Elem::F16, "MAX"), 65504.0);
        assert_eq!(f32_of(Elem::F16, "MIN_POSITIVE"), 2f32.powi(-14));
        assert_eq!(f32_of(Elem::F16, "EPSILON"), 2f32.powi(-10));
        assert_eq!(f32_of(Elem::BF16, "MAX").to_bits(), 0x7f7f_0000);
        assert_eq!(f32_of(Elem::BF16, "MIN").to_bits(), 0xff7f_0000);
        assert_eq!(f32_of(Elem::BF16, "MIN_POSITIVE"), 2f32.powi(-126));
        assert_eq!(f32_of(Elem::BF16, "EPSILON"), 2f32.powi(-7));
        for e in [Elem::F16, Elem::BF16] {
            for name in FLOAT_NAMES {
                let v = f32_of(e, name);
                assert!(v.is_nan() || e.round(v) == v, "{e}::{name}");
            }
        }
        assert_eq!(lookup(Elem::U32, "MAX"), Some(Value::Int(u32::MAX.into())));
        assert_eq!(lookup(Elem::I8, "MIN"), Some(Value::Int(-128)));
        assert_eq!(lookup(Elem::I32, "EPSILON"), None);
        assert_eq!(lookup(Elem::Bool, "MAX"), None);
    }
}
