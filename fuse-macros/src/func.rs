//! The elementwise functions of the language: their names, how they are called, and their types.

/// An elementwise function.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Func {
    Exp,
    Exp2,
    Ln,
    Log2,
    Log10,
    Sqrt,
    Cbrt,
    Recip,
    Sin,
    Cos,
    Tan,
    Sinh,
    Cosh,
    Tanh,
    Asin,
    Acos,
    Atan,
    Asinh,
    Acosh,
    Atanh,
    ExpM1,
    Ln1p,
    Floor,
    Ceil,
    Round,
    /// `round_ties_even`: to nearest, halves to even (CUDA's `rint`, the default rounding mode).
    RoundTiesEven,
    Trunc,
    Fract,
    ToDegrees,
    ToRadians,
    Abs,
    Signum,
    Atan2,
    Powf,
    Powi,
    Hypot,
    Copysign,
    Log,
    Max,
    Min,
    Clamp,
    MulAdd,
    IsNan,
    IsFinite,
    IsInfinite,
    IsSignNegative,
    IsSignPositive,
    Sigmoid,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Softplus,
    Erf,
    Rsqrt,
    /// `detach(x)`: `x`, through which no derivative flows (`#[vjp]`, `#[jvp]`).
    Detach,
    /// The derivative of `gelu`, `Φ(x) + x φ(x)`: written by `#[vjp]` and `#[jvp]` (a function
    /// of its own so that the GPU computes `Φ` and `φ` from one exponential), not callable.
    GeluGrad,
    Pow,
    CountOnes,
    LeadingZeros,
    TrailingZeros,
}

impl Func {
    /// Whether `#[fast_math]` computes the f32 function with CUDA's intrinsics (`__expf`,
    /// `__sinf`, ...; `cuda/expr.rs`), a few instructions, rather than a routine.
    pub fn has_fast_intrinsic(self) -> bool {
        use Func::*;
        matches!(
            self,
            Exp | Ln | Log2 | Log10 | Sin | Cos | Tan | Powf | Log | Sigmoid | Silu
        )
    }

    /// Whether the function is a math library routine of many instructions (`expf`, `logf`,
    /// `tanhf`, ...) rather than a few (a comparison, a rounding, a bit count, `sqrt` and `rsqrt`,
    /// which are one special-function instruction and a correction); the elementwise grid gives
    /// kernels that call one more work per thread (`expand.rs`, `map_vectors`).
    pub fn is_routine(self) -> bool {
        use Func::*;
        !matches!(
            self,
            Sqrt | Recip
                | Floor
                | Ceil
                | Round
                | RoundTiesEven
                | Trunc
                | Fract
                | ToDegrees
                | ToRadians
                | Abs
                | Signum
                | Copysign
                | Max
                | Min
                | Clamp
                | MulAdd
                | IsNan
                | IsFinite
                | IsInfinite
                | IsSignNegative
                | IsSignPositive
                | Relu
                | Rsqrt
                | Detach
                | Pow
                | CountOnes
                | LeadingZeros
                | TrailingZeros
        )
    }
}
/// How a function's arguments and result are typed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Sig {
    /// `(float) -> same`.
    Float,
    /// `(float or signed integer) -> same`.
    Signed,
    /// `(float, same) -> same`.
    Float2,
    /// `(number, same) -> same`.
    Num2,
    /// `(number, same, same) -> same`.
    Num3,
    /// `(float, same, same) -> same`.
    Float3,
    /// `(float, i32) -> same`.
    Powi,
    /// `(integer, u32) -> same`.
    Pow,
    /// `(float) -> bool`.
    FloatTest,
    /// `(integer) -> u32`.
    Bits,
}

impl Sig {
    /// The number of arguments, the receiver included.
    pub fn arity(self) -> usize {
        match self {
            Sig::Float | Sig::Signed | Sig::FloatTest | Sig::Bits => 1,
            Sig::Float2 | Sig::Num2 | Sig::Powi | Sig::Pow => 2,
            Sig::Num3 | Sig::Float3 => 3,
        }
    }
}

pub struct FuncInfo {
    pub func: Func,
    pub name: &'static str,
    pub sig: Sig,
    /// Callable as `x.name(..)` (the element type's std method).
    pub method: bool,
    /// Callable as `name(x)`.
    pub free: bool,
}

const fn both(func: Func, name: &'static str, sig: Sig) -> FuncInfo {
    FuncInfo {
        func,
        name,
        sig,
        method: true,
        free: true,
    }
}

const fn method(func: Func, name: &'static str, sig: Sig) -> FuncInfo {
    FuncInfo {
        func,
        name,
        sig,
        method: true,
        free: false,
    }
}

const fn free(func: Func, name: &'static str) -> FuncInfo {
    FuncInfo {
        func,
        name,
        sig: Sig::Float,
        method: false,
        free: true,
    }
}

/// Every function. One-argument std methods are also free functions; the ML vocabulary is free
/// functions only; methods of several arguments are methods only, as in std.
pub const FUNCS: &[FuncInfo] = &[
    both(Func::Exp, "exp", Sig::Float),
    both(Func::Exp2, "exp2", Sig::Float),
    both(Func::Ln, "ln", Sig::Float),
    both(Func::Log2, "log2", Sig::Float),
    both(Func::Log10, "log10", Sig::Float),
    both(Func::Sqrt, "sqrt", Sig::Float),
    both(Func::Cbrt, "cbrt", Sig::Float),
    both(Func::Recip, "recip", Sig::Float),
    both(Func::Sin, "sin", Sig::Float),
    both(Func::Cos, "cos", Sig::Float),
    both(Func::Tan, "tan", Sig::Float),
    both(Func::Sinh, "sinh", Sig::Float),
    both(Func::Cosh, "cosh", Sig::Float),
    both(Func::Tanh, "tanh", Sig::Float),
    both(Func::Asin, "asin", Sig::Float),
    both(Func::Acos, "acos", Sig::Float),
    both(Func::Atan, "atan", Sig::Float),
    both(Func::Asinh, "asinh", Sig::Float),
    both(Func::Acosh, "acosh", Sig::Float),
    both(Func::Atanh, "atanh", Sig::Float),
    both(Func::ExpM1, "exp_m1", Sig::Float),
    both(Func::Ln1p, "ln_1p", Sig::Float),
    both(Func::Floor, "floor", Sig::Float),
    both(Func::Ceil, "ceil", Sig::Float),
    both(Func::Round, "round", Sig::Float),
    both(Func::RoundTiesEven, "round_ties_even", Sig::Float),
    both(Func::Trunc, "trunc", Sig::Float),
    both(Func::Fract, "fract", Sig::Float),
    both(Func::ToDegrees, "to_degrees", Sig::Float),
    both(Func::ToRadians, "to_radians", Sig::Float),
    both(Func::Abs, "abs", Sig::Signed),
    both(Func::Signum, "signum", Sig::Signed),
    method(Func::Atan2, "atan2", Sig::Float2),
    method(Func::Powf, "powf", Sig::Float2),
    method(Func::Powi, "powi", Sig::Powi),
    method(Func::Hypot, "hypot", Sig::Float2),
    method(Func::Copysign, "copysign", Sig::Float2),
    method(Func::Log, "log", Sig::Float2),
    method(Func::Max, "max", Sig::Num2),
    method(Func::Min, "min", Sig::Num2),
    method(Func::Clamp, "clamp", Sig::Num3),
    method(Func::MulAdd, "mul_add", Sig::Float3),
    both(Func::IsNan, "is_nan", Sig::FloatTest),
    both(Func::IsFinite, "is_finite", Sig::FloatTest),
    both(Func::IsInfinite, "is_infinite", Sig::FloatTest),
    both(Func::IsSignNegative, "is_sign_negative", Sig::FloatTest),
    both(Func::IsSignPositive, "is_sign_positive", Sig::FloatTest),
    free(Func::Sigmoid, "sigmoid"),
    free(Func::Relu, "relu"),
    free(Func::Gelu, "gelu"),
    free(Func::GeluTanh, "gelu_tanh"),
    free(Func::Silu, "silu"),
    free(Func::Softplus, "softplus"),
    free(Func::Erf, "erf"),
    free(Func::Rsqrt, "rsqrt"),
    free(Func::Detach, "detach"),
    method(Func::Pow, "pow", Sig::Pow),
    both(Func::CountOnes, "count_ones", Sig::Bits),
    both(Func::LeadingZeros, "leading_zeros", Sig::Bits),
    both(Func::TrailingZeros, "trailing_zeros", Sig::Bits),
];

pub fn lookup(name: &str) -> Option<&'static FuncInfo> {
    FUNCS.iter().find(|f| f.name == name)
}
