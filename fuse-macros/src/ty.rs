//! Element types and the types of expressions while they are checked.

use std::fmt;

/// An element type of the language.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Elem {
    F32,
    F64,
    I32,
    U32,
    I64,
    U64,
    Bool,
}

impl Elem {
    pub const ALL: [Elem; 7] = [
        Elem::F32,
        Elem::F64,
        Elem::I32,
        Elem::U32,
        Elem::I64,
        Elem::U64,
        Elem::Bool,
    ];

    pub fn from_name(name: &str) -> Option<Elem> {
        Elem::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The Rust name, which is also the language's.
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F64 => "f64",
            Elem::I32 => "i32",
            Elem::U32 => "u32",
            Elem::I64 => "i64",
            Elem::U64 => "u64",
            Elem::Bool => "bool",
        }
    }

    /// The CUDA C type.
    pub fn c_name(self) -> &'static str {
        match self {
            Elem::F32 => "float",
            Elem::F64 => "double",
            Elem::I32 => "int",
            Elem::U32 => "unsigned int",
            Elem::I64 => "long long",
            Elem::U64 => "unsigned long long",
            Elem::Bool => "bool",
        }
    }

    /// The unsigned CUDA C type of the same width, in which wrapping arithmetic is defined.
    pub fn c_unsigned(self) -> &'static str {
        match self {
            Elem::I32 | Elem::U32 => "unsigned int",
            _ => "unsigned long long",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(self, Elem::I32 | Elem::U32 | Elem::I64 | Elem::U64)
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, Elem::I32 | Elem::I64)
    }

    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }

    pub fn bits(self) -> u32 {
        match self {
            Elem::I32 | Elem::U32 | Elem::F32 => 32,
            Elem::Bool => 8,
            _ => 64,
        }
    }

    /// The values of an integer type, as a Rust range.
    pub fn range_text(self) -> String {
        match self {
            Elem::I32 => format!("{}..={}", i32::MIN, i32::MAX),
            Elem::U32 => format!("0..={}", u32::MAX),
            Elem::I64 => format!("{}..={}", i64::MIN, i64::MAX),
            Elem::U64 => format!("0..={}", u64::MAX),
            _ => String::new(),
        }
    }

    /// Whether `value` (an integer literal) fits this integer type.
    pub fn int_fits(self, value: i128) -> bool {
        match self {
            Elem::I32 => i32::try_from(value).is_ok(),
            Elem::U32 => u32::try_from(value).is_ok(),
            Elem::I64 => i64::try_from(value).is_ok(),
            Elem::U64 => u64::try_from(value).is_ok(),
            _ => true,
        }
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
