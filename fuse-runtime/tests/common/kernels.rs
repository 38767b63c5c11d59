//! Every kernel of the language test suite, in `fuse!` blocks.
//!
//! `cpu_language.rs` and `gpu_language.rs` reach this file as `common::kernels`; a test that
//! only compiles the kernels (NVRTC) can include it on its own with `#[path]`. Every kernel is
//! `pub` so that the tests can call it.
//!
//! The families of one element type each (`f32s`, `f64s`, `i32s`, ..) are written once as a
//! `macro_rules!` template and stamped out per type, so the f32 and f64 kernels are the same
//! text by construction; kernels of one type only (the examples, broadcasting, `bool`)
//! follow at the top level.

use fuse_runtime::fuse;

/// The float kernels of element type `$t`, in module `$module`: every operator, every float
/// function (one-argument functions in free and method form), casts, selects, and every
/// reduction over every element, over the last dim, over the first, and over the middle dim of
/// a 3-D tensor.
macro_rules! float_kernels {
    ($module:ident, $t:ident) => {
        #[doc = concat!("Float kernels over `", stringify!($t), "`.")]
        pub mod $module {
            use super::fuse;

            fuse! {
                pub fn arith(a: [$t; n], b: [$t; n])
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    (a + b, a - b, a * b, a / b, a % b, -a)
                }

                pub fn compare(a: [$t; n], b: [$t; n])
                    -> ([bool; n], [bool; n], [bool; n], [bool; n], [bool; n], [bool; n])
                {
                    (a == b, a != b, a < b, a <= b, a > b, a >= b)
                }

                /// Literals: `7 / 2` is an `i32` division (3), `7.0 / 2.0` an `f64` one (3.5);
                /// `1` and `0.25` next to a float take its type.
                pub fn literals(x: [$t; n], s: $t) -> ([$t; n], [$t; n]) {
                    let k = 7 / 2;
                    let h = 7.0 / 2.0;
                    let y = x * s + 1;
                    (y - 0.25 * x, x * (k as $t) + (h as $t))
                }

                pub fn exp_log(x: [$t; n], p: [$t; n])
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    (exp(x), x.exp2(), exp_m1(x), p.ln(), log2(p), p.log10(), ln_1p(p), p.sqrt())
                }

                pub fn trig(x: [$t; n], u: [$t; n], y: [$t; n])
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    (sin(x), x.cos(), tan(x), u.asin(), acos(u), x.atan(), x.atan2(y))
                }

                pub fn hyperbolic(x: [$t; n], u: [$t; n], p: [$t; n])
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    let q = p + 1;
                    (x.sinh(), cosh(x), x.tanh(), asinh(x), q.acosh(), atanh(u), x.cbrt(), recip(x))
                }

                pub fn rounding(x: [$t; n])
                    -> (
                        [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n],
                        [$t; n],
                    )
                {
                    (
                        x.floor(), ceil(x), round(x), x.trunc(), fract(x), x.abs(), signum(x),
                        x.to_degrees(), to_radians(x),
                    )
                }

                pub fn binary(x: [$t; n], y: [$t; n], p: [$t; n], k: i32, lo: $t, hi: $t)
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    (
                        p.powf(y), x.powi(k), x.hypot(y), x.copysign(y), x.max(y), x.min(y),
                        x.clamp(lo, hi), x.mul_add(y, p),
                    )
                }

                /// `powi` with a per-element exponent.
                pub fn powi_each(x: [$t; n], k: [i32; n]) -> [$t; n] {
                    x.powi(k)
                }

                pub fn tests(x: [$t; n])
                    -> ([bool; n], [bool; n], [bool; n], [bool; n], [bool; n])
                {
                    (
                        is_nan(x), x.is_finite(), x.is_infinite(), is_sign_negative(x),
                        x.is_sign_positive(),
                    )
                }

                pub fn ml(x: [$t; n], p: [$t; n])
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    (
                        sigmoid(x), relu(x), gelu(x), gelu_tanh(x), silu(x), softplus(x), erf(x),
                        rsqrt(p),
                    )
                }

                pub fn casts(x: [$t; n])
                    -> ([i32; n], [u32; n], [i64; n], [u64; n], [f32; n], [f64; n])
                {
                    (x as i32, x as u32, x as i64, x as u64, x as f32, x as f64)
                }

                pub fn select(x: [$t; n], y: [$t; n], t: $t) -> [$t; n] {
                    if x > t { x * y } else if x < -t { y } else { 0.5 * x }
                }

                pub fn reduce_all(x: [$t; n], y: [$t; n])
                    -> ($t, $t, $t, $t, $t, $t, [$t; n])
                {
                    (sum(x), prod(y), max(x), min(x), mean(x), max(x) - min(x), x * y)
                }

                pub fn reduce_rows(x: [$t; rows, cols], y: [$t; rows, cols])
                    -> ([$t; rows], [$t; rows], [$t; rows], [$t; rows], [$t; rows])
                {
                    (sum(x, cols), prod(y, cols), max(x, cols), min(x, cols), mean(x, cols))
                }

                pub fn reduce_cols(x: [$t; rows, cols], y: [$t; rows, cols])
                    -> ([$t; cols], [$t; cols], [$t; cols], [$t; cols], [$t; cols])
                {
                    (sum(x, rows), prod(y, rows), max(x, rows), min(x, rows), mean(x, rows))
                }

                pub fn reduce_mid(x: [$t; b, t, c], y: [$t; b, t, c])
                    -> ([$t; b, c], [$t; b, c], [$t; b, c], [$t; b, c], [$t; b, c])
                {
                    (sum(x, t), prod(y, t), max(x, t), min(x, t), mean(x, t))
                }

                pub fn reduce_last(x: [$t; b, t, c], y: [$t; b, t, c])
                    -> ([$t; b, t], [$t; b, t], [$t; b, t], [$t; b, t], [$t; b, t])
                {
                    (sum(x, c), prod(y, c), max(x, c), min(x, c), mean(x, c))
                }
            }
        }
    };
}

/// The integer kernels of element type `$t`, in module `$module`: every operator (wrapping,
/// total division), the integer functions, casts, selects and every integer reduction. With a
/// third argument, also a kernel of that name with the signed-only operations.
macro_rules! int_kernels {
    ($module:ident, $t:ident $(, $signed:ident)?) => {
        #[doc = concat!("Integer kernels over `", stringify!($t), "`.")]
        pub mod $module {
            use super::fuse;

            fuse! {
                pub fn arith(a: [$t; n], b: [$t; n])
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    (a + b, a - b, a * b, a / b, a % b)
                }

                pub fn bits(a: [$t; n], b: [$t; n], s: [u32; n])
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    (a & b, a | b, a ^ b, !a, a << s, a >> s, a << b, a >> b)
                }

                pub fn compare(a: [$t; n], b: [$t; n])
                    -> ([bool; n], [bool; n], [bool; n], [bool; n], [bool; n], [bool; n])
                {
                    (a == b, a != b, a < b, a <= b, a > b, a >= b)
                }

                /// Untyped literals take the tensor's type; `1u32` is a typed shift amount.
                pub fn literals(a: [$t; n], k: $t) -> ([$t; n], [$t; n]) {
                    (a * 3 + 1 - k, (a >> 1u32) ^ 5)
                }

                pub fn funcs(a: [$t; n], b: [$t; n], e: [u32; n], lo: $t, hi: $t)
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [u32; n], [u32; n], [u32; n])
                {
                    (
                        a.max(b), a.min(b), a.clamp(lo, hi), a.pow(e), count_ones(a),
                        a.leading_zeros(), trailing_zeros(a),
                    )
                }

                pub fn casts(a: [$t; n])
                    -> ([i32; n], [u32; n], [i64; n], [u64; n], [f32; n], [f64; n])
                {
                    (a as i32, a as u32, a as i64, a as u64, a as f32, a as f64)
                }

                pub fn select(c: [bool; n], a: [$t; n], b: [$t; n], k: $t) -> [$t; n] {
                    if c { a } else if a > b { b } else { k }
                }

                pub fn reduce_all(x: [$t; n]) -> ($t, $t, $t, $t, $t, [$t; n]) {
                    (sum(x), prod(x), max(x), min(x), max(x) - min(x), x * 2)
                }

                pub fn reduce_rows(x: [$t; rows, cols])
                    -> ([$t; rows], [$t; rows], [$t; rows], [$t; rows])
                {
                    (sum(x, cols), prod(x, cols), max(x, cols), min(x, cols))
                }

                pub fn reduce_cols(x: [$t; rows, cols])
                    -> ([$t; cols], [$t; cols], [$t; cols], [$t; cols])
                {
                    (sum(x, rows), prod(x, rows), max(x, rows), min(x, rows))
                }

                pub fn reduce_mid(x: [$t; b, t, c])
                    -> ([$t; b, c], [$t; b, c], [$t; b, c], [$t; b, c])
                {
                    (sum(x, t), prod(x, t), max(x, t), min(x, t))
                }

                pub fn reduce_last(x: [$t; b, t, c])
                    -> ([$t; b, t], [$t; b, t], [$t; b, t], [$t; b, t])
                {
                    (sum(x, c), prod(x, c), max(x, c), min(x, c))
                }
            }

            $(
                fuse! {
                    /// Negation, `abs` and `signum`, which unsigned integers do not have.
                    pub fn $signed(a: [$t; n]) -> ([$t; n], [$t; n], [$t; n]) {
                        (-a, a.abs(), signum(a))
                    }
                }
            )?
        }
    };
}

float_kernels!(f32s, f32);
float_kernels!(f64s, f64);
int_kernels!(i32s, i32, signed);
int_kernels!(u32s, u32);
int_kernels!(i64s, i64, signed);
int_kernels!(u64s, u64);
int_kernels!(i8s, i8, signed);
int_kernels!(u8s, u8);
int_kernels!(i16s, i16, signed);
int_kernels!(u16s, u16);

/// The 16-bit float kernels of element type `$t` (`f16` or `bf16`), which compute in f32 and
/// round where they store: arithmetic, a chain rounded once, comparisons, math functions, casts,
/// and reductions over every element, each dim, and rows cached in registers.
macro_rules! half_kernels {
    ($module:ident, $t:ident) => {
        #[doc = concat!("Kernels over `", stringify!($t), "`.")]
        pub mod $module {
            use super::fuse;

            fuse! {
                pub fn arith(a: [$t; n], b: [$t; n])
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    (a + b, a - b, a * b, a / b, a % b, -a)
                }

                /// In f32, rounded once at the store; `as` rounds where it is written.
                pub fn chain(x: [$t; n], b: [$t; n], s: $t) -> ([$t; n], [$t; n], [$t; n]) {
                    (x * s + b, (x * 3.0 - b) * 0.5, ((x * x) as $t) * 3)
                }

                pub fn compare(a: [$t; n], b: [$t; n])
                    -> ([bool; n], [bool; n], [bool; n], [bool; n], [bool; n], [bool; n])
                {
                    (a == b, a != b, a < b, a <= b, a > b, a >= b)
                }

                pub fn math(x: [$t; n], p: [$t; n])
                    -> ([$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n], [$t; n])
                {
                    (x.exp(), p.ln(), sqrt(p), x.tanh(), sigmoid(x), gelu(x), x.sin(), x.powi(3))
                }

                pub fn casts(x: [$t; n], f: [f32; n], i: [i32; n])
                    -> ([f32; n], [f64; n], [i32; n], [u8; n], [$t; n], [$t; n], [$t; n])
                {
                    (x as f32, x as f64, x as i32, x as u8, f as $t, i as $t, (f as f64) as $t)
                }

                pub fn reduce_all(x: [$t; n]) -> ($t, $t, $t, $t, f32) {
                    (sum(x), max(x), min(x), mean(x), sum(x as f32))
                }

                pub fn reduce_rows(x: [$t; rows, cols])
                    -> ([$t; rows], [$t; rows], [$t; rows], [$t; rows])
                {
                    (sum(x, cols), max(x, cols), mean(x, cols), logsumexp(x, cols))
                }

                pub fn reduce_cols(x: [$t; rows, cols]) -> ([$t; cols], [$t; cols], [u32; cols]) {
                    (sum(x, rows), min(x, rows), argmax(x, rows))
                }

                /// Rows cached in registers: three passes, one read of each row.
                pub fn softmax(x: [$t; rows, cols]) -> [$t; rows, cols] {
                    let e = (x - max(x, cols)).exp();
                    e / sum(e, cols)
                }

                pub fn layernorm(x: [$t; rows, cols], gamma: [$t; cols], eps: $t)
                    -> ([$t; rows, cols], [f32; rows])
                {
                    let d = x - mean(x, cols);
                    let rstd = rsqrt(mean(d * d, cols) + eps);
                    (d * rstd * gamma, rstd as f32)
                }
            }
        }
    };
}

half_kernels!(f16s, f16);
half_kernels!(bf16s, bf16);

// Conversions between the two 16-bit floats, through f32.
fuse! {
    pub fn halfs(h: [f16; n], b: [bf16; n]) -> ([bf16; n], [f16; n]) {
        (h as bf16, b as f16)
    }
}

/// The fp8 types, `f8e4m3` and `f8e5m2`: computed in f32 and rounded (to nearest even,
/// saturating) where stored or cast.
pub mod fp8s {
    use super::fuse;

    fuse! {
        /// Each code's value, stored again: the identity on codes but NaN's and e5m2's
        /// infinities (which saturate).
        pub fn decode(a: [f8e4m3; n], b: [f8e5m2; n])
            -> ([f32; n], [f32; n], [f8e4m3; n], [f8e5m2; n], [bf16; n], [f16; n])
        {
            (a as f32, b as f32, (a as f32) as f8e4m3, (b as f32) as f8e5m2, a as bf16, b as f16)
        }

        /// f32 rounded to each type, and a cast's value held in f32 again.
        pub fn encode(x: [f32; n]) -> ([f8e4m3; n], [f8e5m2; n], [f32; n], [f32; n]) {
            (x as f8e4m3, x as f8e5m2, (x as f8e4m3) as f32, (x as f8e5m2) as f32)
        }

        /// From the 16-bit floats through their (exact) f32 values: one rounding.
        pub fn from_halves(h: [f16; n], b: [bf16; n])
            -> ([f8e4m3; n], [f8e5m2; n], [f8e4m3; n], [f8e5m2; n])
        {
            (h as f8e4m3, h as f8e5m2, b as f8e4m3, b as f8e5m2)
        }

        /// In f32, rounded once at the store; a literal takes the type (`0.3` is 0.3125).
        pub fn arith(a: [f8e4m3; n], b: [f8e4m3; n], s: f8e4m3)
            -> ([f8e4m3; n], [f8e4m3; n], [f32; n], [f8e5m2; n])
        {
            (a * s + b, (a - b) * 0.3, (a * b) as f32, (a * s) as f8e5m2)
        }

        /// To and from integers: `as i32` saturates as from f32, an integer rounds once.
        pub fn ints(a: [f8e5m2; n], i: [i32; n]) -> ([i32; n], [u8; n], [f8e5m2; n], [f8e4m3; n]) {
            (a as i32, a as u8, i as f8e5m2, i as f8e4m3)
        }

        /// Reductions accumulate in f32 (f64 on the CPU) and round where they store.
        pub fn reduce_rows(x: [f8e4m3; rows, cols])
            -> ([f8e4m3; rows], [f8e4m3; rows], [f32; rows], [u32; rows])
        {
            (max(x, cols), min(x, cols), sum(x as f32, cols), argmax(x, cols))
        }

        /// Rows of 1-byte floats cached in registers: three passes, one read of each row.
        pub fn softmax(x: [f8e5m2; rows, cols]) -> [f8e4m3; rows, cols] {
            let e = (x - max(x, cols)).exp();
            (e / sum(e, cols)) as f8e4m3
        }

        /// Per-token quantization with a scale a row.
        pub fn quant(x: [bf16; t, h], scale: [f32; t]) -> [f8e4m3; t, h] {
            (x as f32 / scale) as f8e4m3
        }

        /// RMSNorm, then fp8 quantization with a scale a token, as vLLM's
        /// `rms_norm_dynamic_per_token_quant` computes it: the row's largest magnitude over
        /// e4m3's largest value, at least `1 / (448 * 512)`, and `y` times its inverse.
        pub fn rmsnorm_quant(x: [bf16; t, h], w: [bf16; h], eps: f32)
            -> ([f8e4m3; t, h], [f32; t])
        {
            let xf = x as f32;
            let y = xf * rsqrt(mean(xf * xf, h) + eps) * (w as f32);
            let scale = (max(y.abs(), h) / 448.0).max(1.0 / (448.0 * 512.0));
            ((y * (1.0 / scale)) as f8e4m3, scale)
        }
    }
}

// Casts into the integer types narrower than 32 bits: floats saturate at the type's bounds
// (NaN to 0), integers keep their low bits.
fuse! {
    pub fn float_to_narrow(x: [f32; n], d: [f64; n])
        -> ([i8; n], [u8; n], [i16; n], [u16; n], [i8; n], [u8; n], [i16; n], [u16; n])
    {
        (x as i8, x as u8, x as i16, x as u16, d as i8, d as u8, d as i16, d as u16)
    }

    pub fn int_to_narrow(i: [i64; n], u: [u32; n])
        -> ([i8; n], [u8; n], [i16; n], [u16; n], [i8; n], [u8; n], [i16; n], [u16; n])
    {
        (i as i8, i as u8, i as i16, i as u16, u as i8, u as u8, u as i16, u as u16)
    }
}

// `bool`, scalars, and shapes: broadcasting, fixed dims, 3-D tensors.
fuse! {
    pub fn logic(a: [bool; n], b: [bool; n])
        -> ([bool; n], [bool; n], [bool; n], [bool; n], [bool; n], [bool; n], [bool; n], [bool; n])
    {
        (a && b, a || b, !a, a & b, a | b, a ^ b, a == b, a != b)
    }

    pub fn bool_casts(a: [bool; n]) -> ([i32; n], [u32; n], [i64; n], [u64; n]) {
        (a as i32, a as u32, a as i64, a as u64)
    }

    /// A `bool` scalar parameter choosing between two tensors.
    pub fn pick(c: bool, a: [f32; n], b: [f32; n]) -> [f32; n] {
        if c { a } else { b }
    }

    pub fn count_true(a: [bool; rows, cols]) -> [u32; rows] {
        sum(a as u32, cols)
    }

    /// Only scalars in and out: every output has shape `[]`.
    pub fn scalars(a: f32, b: i64, c: bool) -> (f32, i64, bool) {
        (a * 2 + 1, b * 3 - 1, !c)
    }

    pub fn bcast(x: [f32; rows, cols], r: [f32; rows], c: [f32; cols], s: f32)
        -> [f32; rows, cols]
    {
        x * r + c - s
    }

    pub fn bcast_int(x: [i64; rows, cols], r: [i64; rows], c: [u32; cols]) -> [i64; rows, cols] {
        (x ^ r) << c
    }

    /// A fixed leading dim, broadcast against a `[4]` vector and an `[n]` one.
    pub fn fixed(x: [f32; 4, n], w: [f32; 4], v: [f32; n]) -> [f32; 4, n] {
        x * w + v
    }

    pub fn fixed_last(x: [f64; n, 3], w: [f64; 3]) -> [f64; n, 3] {
        x * w - 1
    }

    /// A reduction over a named dim, leaving a fixed one.
    pub fn fixed_rows(x: [f32; 4, n]) -> [f32; 4] {
        sum(x, n)
    }

    pub fn bcast3(x: [f32; b, t, c], bc: [f32; b, c], tt: [f32; t]) -> [f32; b, t, c] {
        x * bc + tt
    }

    /// A per-token vector over heads: `c` broadcast over the middle dim, in vectors.
    pub fn per_token(q: [f32; t, h, d], c: [f32; t, d]) -> [f32; t, h, d] {
        q * c
    }

    /// The same in bf16, with the product rounded once.
    pub fn per_token_bf16(q: [bf16; t, h, d], c: [f32; t, d]) -> [bf16; t, h, d] {
        ((q as f32) * c) as bf16
    }
}

// The examples, and more reductions whose results broadcast back.
fuse! {
    /// The softplus, as written there (not the stable builtin `softplus`).
    pub fn softplus(x: [f32; n]) -> [f32; n] {
        (x.exp() + 1.0).ln()
    }

    pub fn sum_exp(x: [f32; n]) -> f32 {
        sum(x.exp())
    }

    /// `ln` as CUDA's `logf` takes it, of any argument.
    pub fn ln_any(x: [f32; n]) -> [f32; n] {
        x.ln()
    }

    /// `ln` of an argument never below the least normal f32: `logf` without its subnormal and
    /// zero cases (`fz_log_normal`), the same bits for the same argument.
    pub fn ln_of_normal(x: [f32; n]) -> [f32; n] {
        x.max(1.17549435e-38).ln()
    }

    pub fn softmax(x: [f32; rows, cols]) -> [f32; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }

    /// Positions: `index` over both dims of an elementwise kernel.
    pub fn coords(x: [f32; rows, cols]) -> [u32; rows, cols] {
        index(rows) * 1000 + index(cols) + (x > 1e30) as u32
    }

    /// `len`: each dim's size as a value, in a map and beside a row's sum.
    pub fn with_len(x: [f32; rows, cols]) -> [f32; rows, cols] {
        x / len(cols) as f32 + (len(rows) * 1000) as f32
    }

    /// A row's mean as its sum over `len(cols)`, subtracted.
    pub fn centered(x: [f32; rows, cols]) -> [f32; rows, cols] {
        x - sum(x, cols) / len(cols) as f32
    }

    /// `index` over every element of a full reduction.
    pub fn index_sum(x: [f32; n]) -> u64 {
        sum(index(n) as u64 + (x > 1e30) as u64)
    }

    /// W9: softmax cross-entropy per row, the issue's own spelling.
    pub fn cross_entropy(x: [f32; rows, cols], label: [i64; rows]) -> [f32; rows] {
        logsumexp(x, cols) - sum(if index(cols) as i64 == label { x } else { 0.0 }, cols)
    }

    /// `logsumexp` over every element, beside another full reduction of the same launch.
    pub fn logsumexp_all(x: [f32; n]) -> (f32, f32) {
        (logsumexp(x), sum(x))
    }

    /// `logsumexp` over every element of an expression, in f64.
    pub fn logsumexp_all_f64(x: [f64; r, c]) -> f64 {
        logsumexp(x * 2.0)
    }

    /// `logsumexp` over the first dim, in f64.
    pub fn logsumexp_rows(x: [f64; rows, cols]) -> [f64; cols] {
        logsumexp(x, rows)
    }

    /// `argmax` and `argmin` along each row.
    pub fn arg_rows(x: [f32; rows, cols], k: [i32; rows, cols]) -> ([u32; rows], [u32; rows], [u32; rows]) {
        (argmax(x, cols), argmin(x, cols), argmin(k, cols))
    }

    /// `argmax` down each column.
    pub fn arg_cols(k: [i32; rows, cols]) -> [u32; cols] {
        argmax(k, rows)
    }

    /// Random numbers over an elementwise kernel's domain: streams 0, 1 and 2.
    pub fn noise(x: [f32; rows, cols], seed: u64)
        -> ([f32; rows, cols], [f32; rows, cols], [f32; rows, cols])
    {
        (rand(seed), x + randn(seed), dropout(x, 0.25, seed))
    }

    /// A random value over the rows only, repeated along each row: `rand` takes the shape of
    /// `b * rand(seed)`, which is `[rows]`.
    pub fn row_noise(x: [f32; rows, cols], b: [f32; rows], seed: u64) -> [f32; rows, cols] {
        x + b * rand(seed)
    }

    /// Dropout after a softmax: random values inside a row kernel's element passes, and one
    /// per row after the reduction.
    pub fn softmax_dropout(x: [f32; rows, cols], p: f32, seed: u64) -> ([f32; rows, cols], [f32; rows]) {
        let e = (x - max(x, cols)).exp();
        (dropout(e / sum(e, cols), p, seed), max(x, cols) + randn(seed))
    }

    /// 16-bit dropout by probabilities of the values' types, parameters: each draw rounded to
    /// the type compares with them as an integer (`fz_u01_bound_bf16`, `_f16`).
    pub fn dropout_16(x: [bf16; n], y: [f16; n], p: bf16, q: f16, seed: u64) -> ([bf16; n], [f16; n]) {
        (dropout(x, p, seed), dropout(y, q, seed))
    }

    /// The same in a row kernel's vector steps, beside the row's sum.
    pub fn dropout_rows_16(x: [f16; rows, cols], q: f16, seed: u64) -> ([f16; rows, cols], [f32; rows]) {
        (dropout(x, q, seed), sum(x as f32, cols))
    }

    /// Random values in a full reduction, through a cast, and dropout of f64 by a tensor of
    /// probabilities.
    pub fn noisy_sum(x: [f64; n], p: [f64; n], seed: u64) -> ([f64; n], f64) {
        (dropout(x, p, seed), sum(x * randn(seed) as f64))
    }

    /// The functions `#[fast_math]` changes, on `x` in [-π, π] and `y` in [0.5, 2] (where the
    /// intrinsics' absolute bounds hold), and one it leaves alone (`sqrt`).
    #[fast_math]
    pub fn fast_functions(x: [f32; n], y: [f32; n])
        -> ([f32; n], [f32; n], [f32; n], [f32; n], [f32; n], [f32; n], [f32; n], [f32; n])
    {
        (x.exp(), y.ln(), y.log2(), x.sin(), x.cos(), sigmoid(x), y.powf(x), y.sqrt())
    }

    /// An outer product: `[m]` against `[n]`.
    pub fn outer(a: [f32; m], b: [f32; n]) -> [f32; m, n] {
        a * b
    }

    /// std's `log(self, base)`.
    pub fn log_base(x: [f32; n], b: [f32; n]) -> [f32; n] {
        x.log(b)
    }

    /// Two `f64` tensors and an `f16` one over the rows, and an output of each type: tiles of
    /// 1024 elements, the fewest that hold a block's step over rows of four. With 768 (what
    /// 32 KB gave them) a random program of these tensors hung the GPU at rows of 28.
    pub fn wide_rows_f64(x: [f64; rows, cols], y: [f64; rows, cols], h: [f16; rows, cols]) -> ([f64; rows, cols], [f16; rows, cols]) {
        let s = sum(x, cols);
        (s * y + x, h * 2.0)
    }

    /// Column reductions of 16-bit tensors, which take two adjacent columns a lane where the
    /// columns are even (`column_pairs`): sums, a mean, a maximum and a minimum beside a tensor
    /// without the columns (`s`), over the leading dim and over a middle one.
    pub fn pairs_bf16(x: [bf16; rows, cols], s: [f32; rows]) -> ([bf16; cols], [f32; cols], [bf16; cols], [f32; cols]) {
        let y = (x as f32) * s;
        (sum(x, rows), mean(y, rows), max(x, rows), min(y, rows))
    }

    /// A 16-bit row shifted by its largest (smallest) element, a pass of its own over the row
    /// in registers: two elements an instruction in their own type (`max.bf16x2`) on sm_80 and
    /// later, which must skip NaN as `fmaxf` does.
    pub fn shift_max_bf16(x: [bf16; rows, cols]) -> [bf16; rows, cols] {
        x - max(x, cols)
    }

    pub fn shift_min_f16(x: [f16; rows, cols]) -> [f16; rows, cols] {
        x - min(x, cols)
    }

    pub fn pairs_f16_mid(x: [f16; b, t, c]) -> ([f16; b, c], [f32; b, c], [f16; b, c]) {
        (sum(x, t), mean(x as f32, t), min(x, t))
    }

    /// `logsumexp` of products over a middle dim (the column path) and over rows, and a softmax
    /// of products: every pass must round `x * y` alike, or near 1e30 `exp(x * y - max)` at the
    /// maximum is `exp(±1e22)` (a random program found it, issue 23).
    pub fn lse_products(x: [f32; a, r, c], y: [f32; a, r, c]) -> [f32; a, c] {
        logsumexp(x * y, r)
    }

    pub fn softmax_products(x: [f32; rows, cols], y: [f32; rows, cols]) -> [f32; rows, cols] {
        let e = (x * y - max(x * y, cols)).exp();
        e / sum(e, cols)
    }

    pub fn softmax_f64(x: [f64; rows, cols]) -> [f64; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }

    /// Softmax with its per-row statistics: per-element and per-row outputs of one launch.
    pub fn softmax_stats(x: [f32; rows, cols]) -> ([f32; rows, cols], [f32; rows], [f32; rows]) {
        let m = max(x, cols);
        let s = sum((x - m).exp(), cols);
        ((x - m).exp() / s, m, m + s.ln())
    }

    /// Softmax over each column.
    pub fn col_softmax(x: [f32; rows, cols]) -> [f32; rows, cols] {
        let e = (x - max(x, rows)).exp();
        e / sum(e, rows)
    }

    pub fn layernorm(x: [f32; rows, cols], gamma: [f32; cols], beta: [f32; cols], eps: f32)
        -> ([f32; rows, cols], [f32; rows])
    {
        let mu = mean(x, cols);
        let d = x - mu;
        let rstd = rsqrt(mean(d * d, cols) + eps);
        (d * rstd * gamma + beta, rstd)
    }

    /// Each element over its row's largest value: f32 elements divided by a value computed
    /// once per row, which the GPU divides by through that value's reciprocal.
    pub fn div_by_row_max(x: [f32; rows, cols], y: [f32; rows, cols]) -> [f32; rows, cols] {
        x / max(y, cols)
    }

    /// W7: layernorm, then int8 quantization with a scale per row (its absolute maximum over
    /// 127), rounding halves away from zero and saturating to [-127, 127].
    pub fn layernorm_quantize(x: [f32; rows, cols], gamma: [f32; cols], beta: [f32; cols], eps: f32)
        -> ([i8; rows, cols], [f32; rows])
    {
        let mu = mean(x, cols);
        let d = x - mu;
        let y = d * rsqrt(mean(d * d, cols) + eps) * gamma + beta;
        let scale = max(y.abs(), cols) / 127.0;
        ((y / scale).round().clamp(-127.0, 127.0) as i8, scale)
    }

    pub fn rmsnorm(x: [f32; rows, cols], w: [f32; cols], eps: f32) -> [f32; rows, cols] {
        x * rsqrt(mean(x * x, cols) + eps) * w
    }

    pub fn bias_grad(g: [f32; rows, cols]) -> [f32; cols] {
        sum(g, rows)
    }

    /// Softmax over the middle dim of a 3-D tensor.
    pub fn softmax_mid(x: [f32; b, t, c]) -> [f32; b, t, c] {
        let e = (x - max(x, t)).exp();
        e / sum(e, t)
    }

    /// Softmax over the last dim of a 3-D tensor, with its log-sum-exp per row.
    pub fn softmax_last(x: [f32; b, t, c]) -> ([f32; b, t, c], [f32; b, t]) {
        let m = max(x, c);
        let s = sum((x - m).exp(), c);
        ((x - m).exp() / s, m + s.ln())
    }

    /// Three tensors over the whole domain, of three widths, which long rows cache beside each
    /// other: an f64 sum and a max per row, then a pass that reads all three again.
    pub fn mixed_rows(x: [f32; rows, cols], w: [f64; rows, cols], m: [u8; rows, cols])
        -> ([f64; rows, cols], [f32; rows])
    {
        let s = sum(x as f64 * w, cols);
        ((x as f64 - s * 0.001) * w + m as f64, max(x + m as f32, cols))
    }

    pub fn matvec(a: [f32; rows, cols], v: [f32; cols]) -> [f32; rows] {
        sum(a * v, cols)
    }

    pub fn vecmat(a: [f64; rows, cols], u: [f64; rows]) -> [f64; cols] {
        sum(a * u, rows)
    }

    /// Per-column means, subtracted: a reduction over `rows` broadcast back.
    pub fn center_cols(x: [f32; rows, cols]) -> ([f32; rows, cols], [f32; cols]) {
        let m = mean(x, rows);
        (x - m, m)
    }

    pub fn count_positive(x: [i32; rows, cols]) -> [u32; rows] {
        sum((x > 0) as u32, cols)
    }

    /// Full reductions combined into scalar outputs, next to an elementwise output.
    pub fn norms(x: [f32; n], s: f32) -> (f32, f32, f32, [f32; n]) {
        (sum(x.abs()), sum(x * x).sqrt(), max(x.abs()) * s, x * s)
    }

    /// Full reductions of a 2-D tensor.
    pub fn total(x: [f64; rows, cols]) -> (f64, f64, f64) {
        (sum(x), min(x), mean(x * x))
    }

    /// A parameter no output uses, over a dim of its own: the launch has no coordinates along
    /// it, elementwise, per row or over everything.
    pub fn unused_map(x: [f32; n], spare: [f32; m]) -> [f32; n] {
        x * 2.0
    }

    pub fn unused_rows(x: [f32; rows, cols], spare: [f32; k, m]) -> [f32; rows] {
        sum(x, cols)
    }

    pub fn unused_full(spare: [f32; m], x: [f32; n]) -> f32 {
        sum(x)
    }
}

/// `round_ties_even`, the constants of the float types, and constant indexing (`w[0]`), over the
/// float type `$t` (issue 22).
macro_rules! float_extra_kernels {
    ($module:ident, $t:ident) => {
        #[doc = concat!("`round_ties_even`, constants and indexing over `", stringify!($t), "`.")]
        pub mod $module {
            use super::fuse;

            fuse! {
                pub fn ties_even(x: [$t; n]) -> ([$t; n], [$t; n]) {
                    (x.round_ties_even(), round_ties_even(x))
                }

                /// Every float constant, as a scalar output.
                pub fn constants(x: [$t; n]) -> ($t, $t, $t, $t, $t, $t, $t) {
                    (
                        $t::NAN, $t::INFINITY, $t::NEG_INFINITY, $t::MAX, $t::MIN,
                        $t::MIN_POSITIVE, $t::EPSILON,
                    )
                }

                /// The constants in values over the elements.
                pub fn constant_uses(x: [$t; n]) -> ([$t; n], [$t; n], [bool; n]) {
                    (
                        x.clamp($t::MIN, $t::MAX),
                        if x.is_nan() { $t::NEG_INFINITY } else { x * $t::EPSILON },
                        x.abs() < $t::MIN_POSITIVE,
                    )
                }

                /// An element of a `[3]` weight, the same at every element.
                pub fn indexed(x: [$t; n], w: [$t; 3]) -> [$t; n] {
                    x * w[0] + w[2]
                }

                /// Elements of a `[2, 3]` weight in a row kernel.
                pub fn indexed_rows(x: [$t; rows, cols], w: [$t; 2, 3])
                    -> ([$t; rows, cols], [$t; rows])
                {
                    let y = x * w[1][2] - w[0][1];
                    (y, max(y, cols))
                }

                /// Elements of a weight in a full reduction and beside it.
                pub fn indexed_full(x: [$t; n], w: [$t; 3]) -> ($t, [$t; n]) {
                    (max(x * w[1]) + w[0], x - w[2])
                }
            }
        }
    };
}

float_extra_kernels!(f32_extras, f32);
float_extra_kernels!(f64_extras, f64);
float_extra_kernels!(f16_extras, f16);
float_extra_kernels!(bf16_extras, bf16);

fuse! {
    /// The bounds of integer types as constants: `i8::MIN + 1`, `u64::MAX - 1`, and a test.
    pub fn int_constants(a: [i8; n], b: [u64; n], c: [i32; n])
        -> ([i8; n], [u64; n], [bool; n], [i32; n])
    {
        (a.max(i8::MIN + 1), b.min(u64::MAX - 1), a == i8::MIN, c.clamp(i32::MIN, i32::MAX - 5))
    }

    /// Issue 22's unused parameter, whose dim appears nowhere else: it binds `k` and is
    /// otherwise ignored.
    pub fn unused_dim(x: [f32; t, e], k_dim: [u8; k]) -> [f32; t, e] {
        x
    }

    /// Two unused parameters that share a dim: the call checks that they agree on it.
    pub fn unused_shared_dim(x: [f32; n], a: [u8; k], b: [i32; k]) -> [f32; n] {
        x * 3.0
    }
}

/// Slices along a named dim (issue 22, item 1): halves of `[t, 2 * d]`, interleaved pairs of
/// `[t, d * 2]`, the rotary part of each head of `[t, h, 2 * half + p]`, and a slice in each
/// kind of launch (rows, columns, everything).
pub mod slices {
    use fuse_runtime::fuse;

    fuse! {
        /// The halves as they are: a slice does no arithmetic, so `-0.0` and NaN keep their bits.
        pub fn halves(x: [f32; t, 2 * d]) -> ([f32; t, d], [f32; t, d]) {
            (x[.., ..d], x[.., d..])
        }

        /// vLLM's `silu_and_mul`: the gate is the first half of each row, the up projection
        /// the second.
        pub fn silu_and_mul(x: [f32; t, 2 * d]) -> [f32; t, d] {
            silu(x[.., ..d]) * x[.., d..]
        }

        pub fn silu_and_mul_bf16(x: [bf16; t, 2 * d]) -> [bf16; t, d] {
            silu(x[.., ..d]) * x[.., d..]
        }

        pub fn gelu_and_mul(x: [f32; t, 2 * d]) -> [f32; t, d] {
            gelu(x[.., ..d]) * x[.., d..]
        }

        pub fn gelu_tanh_and_mul_bf16(x: [bf16; t, 2 * d]) -> [bf16; t, d] {
            gelu_tanh(x[.., ..d]) * x[.., d..]
        }

        /// The even and odd elements of each row (`x[..., ::2]`, `x[..., 1::2]`), unchanged.
        pub fn evens_odds(x: [f32; t, d * 2]) -> ([f32; t, d], [f32; t, d]) {
            (x[.., (0..).step_by(2)], x[.., (1..).step_by(2)])
        }

        /// vLLM's `swigluoai_and_mul`: gate and up interleaved, each clamped, then
        /// `gate * sigmoid(alpha * gate) * (up + 1)`.
        pub fn swigluoai_and_mul(x: [f32; t, d * 2], alpha: f32, limit: f32) -> [f32; t, d] {
            let gate = x[.., (0..).step_by(2)].min(limit);
            let up = x[.., (1..).step_by(2)].clamp(-limit, limit);
            gate * sigmoid(gate * alpha) * (up + 1.0)
        }

        /// NEOX rotary on the first `2 * half` elements of each head (`rot_dim < head_size`):
        /// the two rotated halves, with cos and sin given per token.
        pub fn rotary_neox(x: [f32; t, h, 2 * half + p], cos: [f32; t, half], sin: [f32; t, half])
            -> ([f32; t, h, half], [f32; t, h, half])
        {
            let x1 = x[.., .., ..half];
            let x2 = x[.., .., half..2 * half];
            (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        }

        /// The part of each head that rotary leaves as it is.
        pub fn rotary_pass(x: [f32; t, h, 2 * half + p], cos: [f32; t, half]) -> [f32; t, h, p] {
            x[.., .., 2 * half..]
        }

        /// GPT-J rotary: the pairs `(x[2i], x[2i + 1])` of each head rotate together.
        pub fn rotary_gptj(x: [f32; t, h, d * 2], cos: [f32; t, d], sin: [f32; t, d])
            -> ([f32; t, h, d], [f32; t, h, d])
        {
            let a = x[.., .., (0..).step_by(2)];
            let b = x[.., .., (1..).step_by(2)];
            (a * cos - b * sin, b * cos + a * sin)
        }

        /// `silu_and_mul`, then a dynamic per-token fp8 quantization: a reduction over `d`
        /// of a value read through slices (a launch over rows).
        pub fn silu_and_mul_fp8(x: [bf16; t, 2 * d]) -> ([f8e4m3; t, d], [f32; t]) {
            let y = silu(x[.., ..d] as f32) * (x[.., d..] as f32);
            let s = max(y.abs(), d) / 448.0;
            ((y / s) as f8e4m3, s)
        }

        /// A sum over the leading dim of a slice (a launch over columns).
        pub fn upper_column_sums(x: [f32; t, 2 * d]) -> [f32; d] {
            sum(x[.., d..], t)
        }

        /// A sum of every element of a slice, beside the slice itself.
        pub fn lower_total(x: [f32; t, 2 * d]) -> (f32, [f32; t, d]) {
            let lo = x[.., ..d];
            (sum(lo), lo * 2.0)
        }
    }
}

/// Gathers by an index tensor (issue 22, item 2): an embedding row by token id, a label's
/// logit, a rotary cache row by position, along a middle dim, in reductions, and indices out of
/// range (which read zero).
pub mod gathers {
    use fuse_runtime::fuse;

    fuse! {
        /// One element of the table for each pair of indices, gathered along both its dims.
        pub fn pick(x: [f32; r, c], i: [u32; n], j: [i64; n]) -> [f32; n] {
            x[i, j] * 2.0
        }

        /// An embedding lookup: row `tokens[b, s]` of the table for each token.
        pub fn embedding(emb: [f32; vocab, e], tokens: [u32; b, s]) -> [f32; b, s, e] {
            emb[tokens, ..]
        }

        pub fn embedding_bf16(emb: [bf16; vocab, e], tokens: [i64; t]) -> [bf16; t, e] {
            emb[tokens, ..]
        }

        /// Each row's logit at its label, and the cross-entropy loss with the label -100
        /// ignored (zero); a label out of range picks zero.
        pub fn label_loss(x: [f32; n, v], labels: [i64; n]) -> ([f32; n], [f32; n]) {
            let picked = x[.., labels];
            (picked, if labels == -100 { 0.0 } else { logsumexp(x, v) - picked })
        }

        /// vLLM's `rotary_embedding` (NEOX): each token's cos and sin are the halves of the
        /// cache's row at its position.
        pub fn rotary_cached(pos: [i64; t], cache: [f32; max_pos, 2 * half], q: [f32; t, h, 2 * half + p])
            -> ([f32; t, h, half], [f32; t, h, half])
        {
            let cos = cache[pos, ..half];
            let sin = cache[pos, half..];
            let x1 = q[.., .., ..half];
            let x2 = q[.., .., half..2 * half];
            (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        }

        /// Along a middle dim, by a computed index.
        pub fn middle(x: [f64; a, m, c], idx: [i32; a, c]) -> [f64; a, c] {
            x[.., idx + 1, ..]
        }

        /// Gathered rows summed over the tokens (a launch over columns), and over everything.
        pub fn gathered_columns(table: [f16; k, c], idx: [u8; r]) -> [f32; c] {
            sum(table[idx, ..] as f32, r)
        }

        pub fn gathered_total(table: [f16; k, c], idx: [u8; r]) -> f32 {
            sum(table[idx, ..] as f32)
        }

        /// A softmax over each gathered row (element values of a launch over rows).
        pub fn softmax_of_rows(x: [f32; n, c], idx: [u32; r]) -> [f32; r, c] {
            let g = x[idx, ..];
            let e = (g - max(g, c)).exp();
            e / sum(e, c)
        }

        /// One-dim tables by a computed index, of every kind of element: a quantized code
        /// book, flags, and fp8 values.
        pub fn lookups(codes: [i16; m], flags: [bool; m], w: [f8e4m3; m], x: [f32; n])
            -> ([i16; n], [bool; n], [f32; n])
        {
            let i = (x * 4.0) as i32;
            (codes[i], flags[i], w[i] as f32)
        }

        /// Constant picks along named dims: each row's first and fourth element.
        pub fn picks(x: [f64; r, c]) -> ([f64; r], [f64; r]) {
            (x[.., 0], x[.., 3])
        }
    }
}

/// Writes through `&mut` parameters (issue 22, items 1 and 6): rows scattered to slots (vLLM's
/// KV-cache write), halves and interleaved pairs of one buffer (concatenation), a write beside
/// a returned output, and a fill.
pub mod writes {
    use fuse_runtime::fuse;

    fuse! {
        /// vLLM's `reshape_and_cache_flash`, one cache: each token's row goes to its slot; a
        /// negative slot (a padding token) writes nothing, as in vLLM.
        pub fn cache_rows(key: [bf16; t, h, d], slot: [i64; t], cache: &mut [bf16; slots, h, d]) {
            cache[slot, .., ..] = key;
        }

        /// A bf16 copy, as the cache write stores its rows: the bits as loaded, a NaN quieted.
        pub fn copy_bf16(x: [bf16; n, c]) -> [bf16; n, c] {
            x
        }

        /// The key and the value cache in one launch.
        pub fn kv_cache(
            key: [f32; t, h, d],
            value: [f32; t, h, d],
            slot: [i64; t],
            k_cache: &mut [f32; slots, h, d],
            v_cache: &mut [f32; slots, h, d],
        ) {
            k_cache[slot, .., ..] = key;
            v_cache[slot, .., ..] = value;
        }

        /// vLLM's `reshape_and_cache` key layout: each slot picks two dims of the cache, the
        /// block and the place in it; a negative slot's place is negative, so nothing is written.
        pub fn paged_cache(
            key: [bf16; t, h, dx, x],
            slot: [i64; t],
            block: i64,
            cache: &mut [bf16; nb, h, dx, bs, x],
        ) {
            cache[slot / block, .., .., slot % block, ..] = key;
        }

        /// An update in place: `x` read through a slice as it is written.
        pub fn scale_in_place(x: &mut [f32; m, c], y: [f32; m, c], a: f32) {
            x[.., ..] = x[.., ..] * a + y;
        }

        /// vLLM's `copy_blocks`, one cache: row `src[i]` copied to row `dst[i]` of the same
        /// buffer (the sources are not destinations).
        pub fn copy_rows(cache: &mut [bf16; nb, e], src: [i64; m], dst: [i64; m]) {
            cache[dst, ..] = cache[src, ..];
        }

        /// Concatenation along the last dim: two halves of one buffer.
        pub fn concat(a: [f32; t, d], b: [f32; t, d], out: &mut [f32; t, 2 * d]) {
            out[.., ..d] = a;
            out[.., d..] = b * 2.0;
        }

        /// Two values interleaved, `a` at the even places and `b` at the odd.
        pub fn interleave(a: [f16; t, d], b: [f16; t, d], out: &mut [f16; t, d * 2]) {
            out[.., (0..).step_by(2)] = a;
            out[.., (1..).step_by(2)] = b;
        }

        /// A scatter of rows plus a broadcast bias, beside a returned output.
        pub fn scatter_and_return(x: [f32; n, c], idx: [u32; n], bias: [f32; c], table: &mut [f32; m, c])
            -> [f32; n, c]
        {
            table[idx, ..] = x + bias;
            x * 2.0
        }

        /// Rows of a table set to a value.
        pub fn fill_rows(idx: [i32; r], v: f32, table: &mut [f32; m, c]) {
            table[idx, ..] = v;
        }
    }
}

fuse! {
    /// What ptxas 13.0 miscompiled for sm_90, found by the 10,000-program random run: a row's
    /// maximum of negated `i32` (a chain of signed max fused into `VIMNMX3`, one negation
    /// dropped; p3116), the same with a negation the compiler makes from `/ -4` (p1806).
    pub fn neg_max_rows_i32(x: [i32; rows, cols]) -> [i32; rows] {
        max(-x, cols)
    }

    pub fn neg_max_by_quarter(x: [i32; n], y: [i32; n], z: [i32; n]) -> ([i32; n], [i32; n]) {
        (x.max(y / (-4)).max(-z), x.min(-y).min(z).clamp(-z, 77))
    }

    /// 64-bit shifts and products by 2^31 beside a write through `&mut` (p11659 of the random
    /// programs, as it was generated: ptxas 13.0 computed `s << 31` again inside the unrolled
    /// loop as `s * -2^31`, its high word negated), the same by a literal, and by two literals
    /// that NVVM folds into one.
    pub fn shl31_written(x0: [f32; a, b, c], x1: [u32; a, b, c], at: [i16; a, c], w: &mut [i64; a, b, m], s: i64, x5: [u16; a, b, c]) -> ([f32; a, b, c], [u32; a, b, c]) {
        w[.., .., at] = (s << 95).min(x5 as i64);
        (x0, index(c).min(x1))
    }

    pub fn mul31_written(x0: [f32; a, b, c], x1: [u32; a, b, c], at: [i16; a, c], w: &mut [i64; a, b, m], s: i64, x5: [u16; a, b, c]) -> ([f32; a, b, c], [u32; a, b, c]) {
        w[.., .., at] = (s * 2147483648).min(x5 as i64);
        (x0, index(c).min(x1))
    }

    pub fn mul31_folded_written(x0: [f32; a, b, c], x1: [u32; a, b, c], at: [i16; a, c], w: &mut [i64; a, b, m], s: i64, x5: [u16; a, b, c]) -> ([f32; a, b, c], [u32; a, b, c]) {
        w[.., .., at] = (s * 65536 * 32768).min(x5 as i64);
        (x0, index(c).min(x1))
    }

    /// `-i16::MIN` wraps to itself (p2625: compared as +32768), then is compared and shifted.
    pub fn neg_i16_compared(x: [i16; n], y: [i16; n]) -> ([bool; n], [i16; n], [i16; n]) {
        ((-x) >= y, (-x) >> 3, (-x).max(y))
    }

    /// An `f16` scalar to `i16` beside float math in the loop (p4646: the conversion computed
    /// again inside the loop into a register whose high half held a float).
    pub fn f16_to_i16_min(x: [f16; n], s: f16, y: [i16; n]) -> ([i16; n], [f16; n]) {
        ((s as i16).min(y), x.cbrt().sin())
    }

    /// `x.powi(7)` under a `logsumexp` over the leading dim, in f64 near 1e28 (p3039: the
    /// power's last product fused into the pass's subtraction of the maximum, infinity).
    pub fn lse_of_powi_f64(x: [f64; r, c]) -> [f64; c] {
        logsumexp(x.powi(7), r)
    }

    /// Functions whose last step is a product under a `logsumexp` over the leading dim (p26365:
    /// `to_degrees` of `1e30` fused into the pass's subtraction of the maximum, `-inf`). GELU's
    /// input is kept finite: `gelu(-inf)` is `-inf * 0`, NaN.
    pub fn lse_of_products_f64(x: [f64; r, c]) -> ([f64; c], [f64; c], [f64; c]) {
        let g = gelu(x.max(-1e30));
        (logsumexp(x.to_degrees(), r), logsumexp(x.to_radians(), r), logsumexp(g, r))
    }
}

/// Tensor parameters read in another order than their own (`permute`): a transpose, vLLM's
/// attention LSEs `[h, t]` beside `[t, h, d]`, row kernels along a dim whose stride is not one.
pub mod permuted {
    use fuse_runtime::fuse;

    fuse! {
        pub fn transposed_add(x: [f32; r, c], y: [f32; c, r]) -> [f32; r, c] {
            x + permute(y, (r, c))
        }

        pub fn scaled_heads(q: [bf16; t, h, d], lse: [f32; h, t]) -> [bf16; t, h, d] {
            ((q as f32) * permute(lse, (t, h)).exp()) as bf16
        }

        /// Only `y`: its own order is the signature's, the view's is another.
        pub fn softmax_of_transpose(y: [f32; c, r]) -> [f32; r, c] {
            let v = permute(y, (r, c));
            let e = (v - max(v, c)).exp();
            e / sum(e, c)
        }

        pub fn sums_of_products(x: [f32; r, c], y: [f32; c, r]) -> [f32; r] {
            sum(x * permute(y, (r, c)), c)
        }

        /// Over two dims at once: `y`'s parts read through their coordinates.
        pub fn merged_sums(x: [f32; a, c, s], y: [f32; s, c, a]) -> [f32; a] {
            sum(x * permute(y, (a, c, s)), (c, s))
        }
    }
}

/// Reductions over several dims at once (`mean(x, (c, s))`): GroupNorm, and the dims taken
/// together wherever they stand.
pub mod merged {
    use super::fuse;

    fuse! {
        /// GroupNorm over `[batch, groups, channels, positions]`: a group's statistics over its
        /// channels and positions, the affine weight and bias per channel.
        pub fn group_norm(x: [f32; b, g, c, s], w: [f32; g, c], bias: [f32; g, c], eps: f32) -> [f32; b, g, c, s] {
            let d = x - mean(x, (c, s));
            d * rsqrt(mean(d * d, (c, s)) + eps) * w + bias
        }

        /// In bf16, with the statistics returned in f32.
        pub fn group_norm_bf16(x: [bf16; b, g, c, s], w: [bf16; g, c]) -> ([bf16; b, g, c, s], [f32; b, g], [f32; b, g]) {
            let xf = x as f32;
            let mu = mean(xf, (c, s));
            let rstd = rsqrt(mean((xf - mu) * (xf - mu), (c, s)) + 1e-5);
            (((xf - mu) * rstd * (w as f32)) as bf16, mu, rstd)
        }

        /// Every reduction over two trailing dims, over two leading ones and over two in the
        /// middle; `index` of the parts and a three-dim group.
        pub fn reductions(x: [f32; a, c, s]) -> ([f32; a], [f32; a], [f32; a], [f32; a], [f32; a]) {
            (sum(x, (c, s)), max(x, (c, s)), min(x, (c, s)), logsumexp(x, (c, s)), sum(x * (index(c) as f32) - (index(s) as f32), (c, s)))
        }

        pub fn leading(x: [f32; c, s, n]) -> [f32; n] {
            sum(x, (c, s))
        }

        pub fn middle(x: [f32; a, c, s, n]) -> ([f32; a, n], [f32; a, c, s, n]) {
            let m = mean(x, (c, s));
            (m, x - m)
        }

        pub fn three(x: [f64; a, b, c, d]) -> [f64; a] {
            sum(x, (b, c, d))
        }
    }
}

fuse! {
    /// Maxima and minima of an f32 and an f64 row in one loop: rustc 1.95's LLVM crashed
    /// (SIGSEGV) compiling the CPU backend's `f32::max` and `f64::max` side by side in release
    /// (p20915 of the random programs), which now reduce by a select.
    pub fn mixed_width_extrema(x: [f32; r, c], y: [f64; r, c]) -> ([f32; r], [f64; r], [f32; r], [f64; r]) {
        (logsumexp(x, c), logsumexp(y, c), min(x, c), max(y, c))
    }
}

fuse! {
    /// Values ptxas knows are not negative, compared with constants: ptxas 13.0 folded
    /// `|q| > -2.0` to true and lost NaN (p21199 of the random programs: `(x2 / x0).copysign(
    /// 0.25).clamp(x4, -2.0)` was -2 for `0 / 0`).
    pub fn nonnegative_against_constants(x: [f32; n], y: [f32; n], lo: [f32; n]) -> ([f32; n], [bool; n], [bool; n], [f64; n]) {
        let q = (x / y).copysign(0.25);
        (q.clamp(lo, -2.0), q.abs() > -2.0, q >= 0.0, ((x as f64) / (y as f64)).abs().clamp(lo as f64, -1.0))
    }
}
