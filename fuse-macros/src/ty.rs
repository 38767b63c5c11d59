//! Element types and the types of expressions while they are checked.

use std::fmt;

/// An element type of the language.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Elem {
    F32,
    F64,
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
    pub const ALL: [Elem; 11] = [
        Elem::F32,
        Elem::F64,
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

    /// The Rust name, which is also the language's.
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F64 => "f64",
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

    /// The CUDA C type.
    pub fn c_name(self) -> &'static str {
        match self {
            Elem::F32 => "float",
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
        matches!(self, Elem::F32 | Elem::F64)
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
            Elem::I8 | Elem::U8 | Elem::Bool => 8,
            Elem::I16 | Elem::U16 => 16,
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
