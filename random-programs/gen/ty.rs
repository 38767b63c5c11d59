//! The element types of the language, as the generator sees them, and a small seeded generator.

/// An element type of the language.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ty {
    F32,
    F64,
    F16,
    Bf16,
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

pub const ALL: [Ty; 13] = [
    Ty::F32,
    Ty::F64,
    Ty::F16,
    Ty::Bf16,
    Ty::I8,
    Ty::U8,
    Ty::I16,
    Ty::U16,
    Ty::I32,
    Ty::U32,
    Ty::I64,
    Ty::U64,
    Ty::Bool,
];

pub const FLOATS: [Ty; 4] = [Ty::F32, Ty::F64, Ty::F16, Ty::Bf16];
pub const INTS: [Ty; 8] = [
    Ty::I8,
    Ty::U8,
    Ty::I16,
    Ty::U16,
    Ty::I32,
    Ty::U32,
    Ty::I64,
    Ty::U64,
];

impl Ty {
    pub fn name(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::F64 => "f64",
            Ty::F16 => "f16",
            Ty::Bf16 => "bf16",
            Ty::I8 => "i8",
            Ty::U8 => "u8",
            Ty::I16 => "i16",
            Ty::U16 => "u16",
            Ty::I32 => "i32",
            Ty::U32 => "u32",
            Ty::I64 => "i64",
            Ty::U64 => "u64",
            Ty::Bool => "bool",
        }
    }

    pub fn is_float(self) -> bool {
        FLOATS.contains(&self)
    }

    #[allow(dead_code)]
    pub fn is_int(self) -> bool {
        INTS.contains(&self)
    }

    pub fn is_signed(self) -> bool {
        matches!(self, Ty::I8 | Ty::I16 | Ty::I32 | Ty::I64)
    }

    /// The largest value an integer literal of this type may take here (kept small for the
    /// narrow types so that literals fit).
    pub fn int_max(self) -> u64 {
        match self {
            Ty::I8 => 127,
            Ty::U8 => 255,
            Ty::I16 => 32767,
            Ty::U16 => 65535,
            _ => 1 << 31,
        }
    }
}

/// splitmix64: the program's and the inputs' randomness, from one seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// True with probability `p` percent.
    pub fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }

    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }

    /// An index into `weights`, drawn in proportion to them.
    pub fn weighted(&mut self, weights: &[usize]) -> usize {
        let mut r = self.below(weights.iter().sum());
        for (i, &w) in weights.iter().enumerate() {
            if r < w {
                return i;
            }
            r -= w;
        }
        unreachable!("r is below the sum of the weights")
    }
}
