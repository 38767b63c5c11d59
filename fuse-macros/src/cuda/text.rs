//! Fragments of CUDA C text: math function names, literals, conversions, reduction identities
//! and combinations, and the helper functions a kernel may need.

use crate::func::Func;
use crate::ir::Reduce;
use crate::ty::Elem;

pub(super) fn c_math_name(f: Func) -> &'static str {
    use Func::*;
    match f {
        Exp => "exp",
        Exp2 => "exp2",
        Log2 => "log2",
        Log10 => "log10",
        Sqrt => "sqrt",
        Cbrt => "cbrt",
        Sin => "sin",
        Cos => "cos",
        Tan => "tan",
        Sinh => "sinh",
        Cosh => "cosh",
        Tanh => "tanh",
        Asin => "asin",
        Acos => "acos",
        Atan => "atan",
        Asinh => "asinh",
        Acosh => "acosh",
        Atanh => "atanh",
        Floor => "floor",
        Ceil => "ceil",
        Round => "round",
        // Round to nearest, ties to even: the default rounding mode, which `rint` uses.
        RoundTiesEven => "rint",
        Trunc => "trunc",
        Erf => "erf",
        Atan2 => "atan2",
        Powf => "pow",
        Hypot => "hypot",
        Copysign => "copysign",
        _ => unreachable!("not a plain C math function"),
    }
}

/// The C math function for `e`: `expf` for f32, `exp` for f64.
pub(super) fn suffixed(name: &str, e: Elem) -> String {
    if e == Elem::F32 {
        format!("{name}f")
    } else {
        name.to_string()
    }
}

pub(super) fn int_literal(value: i128, e: Elem) -> String {
    match e {
        Elem::F32 => format!("{value}.0f"),
        Elem::F64 => format!("{value}.0"),
        Elem::F16 | Elem::BF16 | Elem::F8E4M3 | Elem::F8E5M2 => {
            float_literal(&value.to_string(), e)
        }
        Elem::I32 if value == i32::MIN as i128 => "(-2147483647 - 1)".into(),
        Elem::I64 if value == i64::MIN as i128 => "(-9223372036854775807ll - 1)".into(),
        Elem::I32 if value < 0 => format!("({value})"),
        Elem::I32 => value.to_string(),
        Elem::I64 => format!("({value}ll)"),
        Elem::U32 => format!("{value}u"),
        Elem::U64 => format!("{value}ull"),
        // Narrower than `int`: every value is an `int` literal, converted.
        Elem::I8 | Elem::U8 | Elem::I16 | Elem::U16 => format!("(({})({value}))", e.c_name()),
        Elem::Bool => unreachable!("integer literals are never bool"),
    }
}

/// A float literal of type `e`; a narrow float's is the f32 of its rounded value. A value that
/// has no decimal literal (NaN, an infinity: `f32::NAN`, `-inf` from `f32::NEG_INFINITY`) is
/// written as its bits, which NVRTC reads back exactly.
pub(super) fn float_literal(digits: &str, e: Elem) -> String {
    let text = if e.compute() == Elem::F32 {
        let v = e.round(digits.parse().unwrap_or(f32::NAN));
        if v == f32::INFINITY {
            "__int_as_float(0x7f800000)".to_string()
        } else if !v.is_finite() {
            format!("__uint_as_float({:#010x}u)", v.to_bits())
        } else {
            format!("{v:?}f")
        }
    } else {
        let v: f64 = digits.parse().unwrap_or(f64::NAN);
        if v == f64::INFINITY {
            "__longlong_as_double(0x7ff0000000000000ll)".to_string()
        } else if !v.is_finite() {
            format!("__longlong_as_double((long long){:#018x}ull)", v.to_bits())
        } else {
            format!("{v:?}")
        }
    };
    text
}

/// The conversion of `a` from `from` to `to`; narrow floats are converted as the f32 values
/// they are held in (rounding to them is [`narrow_helpers`]').
pub(super) fn cast(from: Elem, to: Elem, a: &str) -> String {
    let (from, to) = (from.compute(), to.compute());
    if from == to {
        return a.to_string();
    }
    if from.is_float() && to.is_int() {
        let src = if from == Elem::F32 { "float" } else { "double" };
        // Round toward zero and saturate, NaN to 0: Rust's `as`. Some conversions give NaN the
        // bits of the lowest value (0x80000000...), so NaN is tested first.
        let nan = format!("isnan({a}) ? ({})0", to.c_name());
        let dst = match to {
            Elem::I32 => "int",
            Elem::U32 => "uint",
            Elem::I64 => "ll",
            Elem::U64 => "ull",
            // Types narrower than `int`: clamp to their bounds, then convert (exactly).
            _ => {
                let (lo, hi) = to.int_bounds();
                let (fmax, fmin) = (suffixed("fmax", from), suffixed("fmin", from));
                let (lo, hi) = (
                    float_literal(&lo.to_string(), from),
                    float_literal(&hi.to_string(), from),
                );
                return format!(
                    "({nan} : ({})__{src}2int_rz({fmin}({fmax}({a}, {lo}), {hi})))",
                    to.c_name()
                );
            }
        };
        return format!("({nan} : __{src}2{dst}_rz({a}))");
    }
    format!("(({}){a})", to.c_name())
}

/// For a narrow float `e`: the [`helper`] that defines its conversions, the function in it that
/// converts the bits of `e` to f32, and the one that rounds an f32 to those bits.
pub(super) fn narrow_helpers(e: Elem) -> (&'static str, &'static str, &'static str) {
    match e {
        Elem::F16 => ("fz_f16", "fz_f16_to_f32", "fz_f32_to_f16"),
        Elem::BF16 => ("fz_bf16", "fz_bf16_to_f32", "fz_f32_to_bf16"),
        Elem::F8E4M3 => ("fz_f8e4m3", "fz_f8e4m3_to_f32", "fz_f32_to_f8e4m3"),
        Elem::F8E5M2 => ("fz_f8e5m2", "fz_f8e5m2_to_f32", "fz_f32_to_f8e5m2"),
        _ => unreachable!("only the narrow floats are stored as bits"),
    }
}

pub(super) fn identity(op: Reduce, e: Elem) -> String {
    let inf = if e == Elem::F32 {
        "__int_as_float(0x7f800000)"
    } else {
        "__longlong_as_double(0x7ff0000000000000ll)"
    };
    match (op, e) {
        (Reduce::Sum | Reduce::Mean, _) => format!("({})0", e.c_name()),
        // The running maximum; the sum of the pair starts at 0 (see `Cuda::init_accumulators`).
        (Reduce::LogSumExp, _) => format!("(-{inf})"),
        (Reduce::Prod, _) => format!("({})1", e.c_name()),
        (Reduce::Max, _) if e.is_float() => format!("(-{inf})"),
        (Reduce::Min, _) if e.is_float() => inf.to_string(),
        (Reduce::Max, Elem::I32) => "(-2147483647 - 1)".into(),
        (Reduce::Max, Elem::I64) => "(-9223372036854775807ll - 1)".into(),
        (Reduce::Max, Elem::U32 | Elem::U64) => "0u".into(),
        (Reduce::Min, Elem::I32) => "2147483647".into(),
        (Reduce::Min, Elem::I64) => "9223372036854775807ll".into(),
        (Reduce::Min, Elem::U32) => "4294967295u".into(),
        (Reduce::Min, Elem::U64) => "18446744073709551615ull".into(),
        (Reduce::Max, _) => int_literal(e.int_bounds().0, e),
        (Reduce::Min, _) => int_literal(e.int_bounds().1, e),
    }
}

/// Whether a max or min of `e` goes through `fz_smax` / `fz_smin`: the signed integers of at
/// most 32 bits. ptxas 13.0 for sm_90 fuses a chain of signed 32-bit max (min) into the
/// three-input `VIMNMX3` and drops the negation of one input: `max(max(x, -y), z)` became
/// `max(x, y, z)`, whether the negation was written (`-y`) or made by the compiler (`y / -4`);
/// sm_80 has no such instruction, and the unsigned forms keep their negations. Found by the
/// random programs (p3116 and p1806 of the 10,000-program run).
pub(super) fn through_unsigned(e: Elem) -> bool {
    e.is_signed_int() && e.bits() <= 32
}

pub(super) fn combine(op: Reduce, e: Elem, a: &str, b: &str) -> String {
    let (t, u) = (e.c_name(), e.c_unsigned());
    match op {
        Reduce::Sum | Reduce::Mean if e.wraps_via_unsigned() => {
            format!("({t})(({u}){a} + ({u}){b})")
        }
        Reduce::Prod if e.wraps_via_unsigned() => format!("({t})(({u}){a} * ({u}){b})"),
        Reduce::Sum | Reduce::Mean => format!("{a} + {b}"),
        Reduce::Prod => format!("{a} * {b}"),
        Reduce::Max if e.is_float() => format!("{}({a}, {b})", suffixed("fmax", e)),
        Reduce::Min if e.is_float() => format!("{}({a}, {b})", suffixed("fmin", e)),
        Reduce::Max if through_unsigned(e) => format!("fz_smax({a}, {b})"),
        Reduce::Min if through_unsigned(e) => format!("fz_smin({a}, {b})"),
        Reduce::Max => format!("({a} > {b} ? {a} : {b})"),
        Reduce::Min => format!("({a} < {b} ? {a} : {b})"),
        Reduce::LogSumExp => unreachable!("pairs combine with fz_lse_merge"),
    }
}

/// The text of `fz_round_<ty>` (`round`), `fz_pack_<ty>` (`pack`) or both (`both`): a vector of
/// f32 values of a vector store (`Cuda::vector_bits`) rounded to a narrow type as
/// `fz_f32_to_<ty>` rounds each, two to a conversion instruction `$cvt` (its result a `$word`,
/// asm constraint `$reg`, field `$field` of the union) on `__CUDA_ARCH__ >= $arch`, each
/// vector's elements `$elem`s. `fz_round_<ty>` converts in pairs where no value is NaN (tested
/// first), else one by one; `fz_pack_<ty>` converts in pairs with no test, for values whose NaNs
/// are canonical (`Cuda::canonical_nans`), which the pair conversion must round as
/// `fz_f32_to_<ty>` does. The bf16 helpers and the fp8 ones (`fz_vec_bf16`, `fz_vec_f8e4m3`, ...)
/// are these.
macro_rules! vector_rounding {
    (round, $ty:literal, $elem:literal, $word:literal, $field:literal, $arch:literal, $cvt:literal, $reg:literal) => {
        concat!(
            "template <int N> static __device__ __forceinline__ fz_vec<", $elem, ", N> fz_round_", $ty,
            "(const fz_vec<float, N>& f) {\n",
            "    union { fz_vec<", $elem, ", N> s; ", $word, " ", $field, "[(N + 1) / 2]; } u;\n",
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= ", $arch, "\n",
            "    if constexpr (N % 2 == 0) {\n",
            "        bool nan = false;\n",
            "        #pragma unroll\n",
            "        for (int j = 0; j < N; ++j) nan |= f.v[j] != f.v[j];\n",
            "        if (!nan) {\n",
            "            #pragma unroll\n",
            "            for (int i = 0; i < N / 2; ++i) asm(\"", $cvt, " %0, %1, %2;\" : \"", $reg, "\"(u.", $field,
            "[i]) : \"f\"(f.v[2 * i + 1]), \"f\"(f.v[2 * i]));\n",
            "            return u.s;\n",
            "        }\n",
            "    }\n",
            "#endif\n",
            "    #pragma unroll\n",
            "    for (int j = 0; j < N; ++j) u.s.v[j] = fz_f32_to_", $ty, "(f.v[j]);\n",
            "    return u.s;\n",
            "}\n",
        )
    };
    (pack, $ty:literal, $elem:literal, $word:literal, $field:literal, $arch:literal, $cvt:literal, $reg:literal) => {
        concat!(
            "template <int N> static __device__ __forceinline__ fz_vec<", $elem, ", N> fz_pack_", $ty,
            "(const fz_vec<float, N>& f) {\n",
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= ", $arch, "\n",
            "    if constexpr (N % 2 == 0) {\n",
            "        union { fz_vec<", $elem, ", N> s; ", $word, " ", $field, "[N / 2]; } u;\n",
            "        #pragma unroll\n",
            "        for (int i = 0; i < N / 2; ++i) asm(\"", $cvt, " %0, %1, %2;\" : \"", $reg, "\"(u.", $field,
            "[i]) : \"f\"(f.v[2 * i + 1]), \"f\"(f.v[2 * i]));\n",
            "        return u.s;\n",
            "    }\n",
            "#endif\n",
            "    return fz_round_", $ty, "(f);\n",
            "}\n",
        )
    };
    (both, $($args:literal),*) => {
        concat!(vector_rounding!(round, $($args),*), vector_rounding!(pack, $($args),*))
    };
}

/// The text of helper `fz_vec_minmax_<ty>` (`fz_max_<ty>`, `fz_min_<ty>`): `lo` and `hi` are
/// the f32 values of the low and high halves of the packed word `m`.
macro_rules! packed_minmax {
    ($ty:literal, $lo:literal, $hi:literal) => {
        concat!(
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n",
            "#define FZ_PACKED(name, op, ptx) template <int N> static __device__ __forceinline__ float name(float acc, const fz_vec<unsigned short, N>& v) { \\\n",
            "    if constexpr (N % 2 == 0) { \\\n",
            "        const union { fz_vec<unsigned short, N> s; unsigned int w[N / 2]; } u = {v}; \\\n",
            "        unsigned int m = u.w[0]; \\\n",
            "        _Pragma(\"unroll\") for (int i = 1; i < N / 2; ++i) asm(ptx \" %0, %0, %1;\" : \"+r\"(m) : \"r\"(u.w[i])); \\\n",
            "        return op(acc, op(", $lo, ", ", $hi, ")); \\\n",
            "    } \\\n",
            "    _Pragma(\"unroll\") for (int j = 0; j < N; ++j) acc = op(acc, fz_", $ty, "_to_f32(v.v[j])); \\\n",
            "    return acc; \\\n",
            "}\n",
            "#else\n",
            "#define FZ_PACKED(name, op, ptx) template <int N> static __device__ __forceinline__ float name(float acc, const fz_vec<unsigned short, N>& v) { \\\n",
            "    for (int j = 0; j < N; ++j) acc = op(acc, fz_", $ty, "_to_f32(v.v[j])); \\\n",
            "    return acc; \\\n",
            "}\n",
            "#endif\n",
            "FZ_PACKED(fz_max_", $ty, ", fmaxf, \"max.", $ty, "x2\")\n",
            "FZ_PACKED(fz_min_", $ty, ", fminf, \"min.", $ty, "x2\")\n",
            "#undef FZ_PACKED\n",
        )
    };
}

/// The text of a helper function, overloaded for every type it applies to.
pub(super) fn helper(name: &str) -> &'static str {
    match name {
        // a / b for many a and one b, correctly rounded, as the fast path of CUDA's `div.rn.f32`
        // computes it (the same instructions: an approximate reciprocal refined by one Newton
        // step, then a quotient corrected by its exact remainder), with the reciprocal taken
        // once. The fast path runs where no step can leave the normal numbers (a and b between
        // 2^-60 and 2^60 in magnitude, so zeros, infinities and NaN excluded); elsewhere `a / b`.
        // The divider holds the largest dividend it takes, -inf when b is out of range, so that
        // each division tests its dividend only (with a flag for b besides, NVVM tested it at
        // every division of W7's write pass).
        "fz_div_by" => concat!(
            "struct fz_divider { float r, hi; };\n",
            "static __device__ __forceinline__ fz_divider fz_divider_of(float b) {\n",
            "    float r;\n",
            "#ifdef __CUDA_ARCH__\n",
            "    asm(\"rcp.approx.ftz.f32 %0, %1;\" : \"=f\"(r) : \"f\"(b));\n",
            "#else\n",
            "    r = 1.0f / b;\n",
            "#endif\n",
            "    r = __fmaf_rn(r, __fmaf_rn(r, -b, 1.0f), r);\n",
            "    const float m = fabsf(b);\n",
            "    return {r, m >= 0x1p-60f && m <= 0x1p60f ? 0x1p60f : -__int_as_float(0x7f800000)};\n",
            "}\n",
            "static __device__ __forceinline__ float fz_div_by(float a, float b, fz_divider d) {\n",
            "    const float m = fabsf(a);\n",
            "    if (m >= 0x1p-60f && m <= d.hi) {\n",
            "        const float q = __fmul_rn(a, d.r);\n",
            "        return __fmaf_rn(d.r, __fmaf_rn(q, -b, a), q);\n",
            "    }\n",
            "    return a / b;\n",
            "}\n",
        ),
        // `fz_div_by`'s fast path without its branch: `bad` is set where its result may not be
        // a / b correctly rounded, and the caller then divides again with `fz_div_by`.
        "fz_div_fast" => concat!(
            "static __device__ __forceinline__ float fz_div_fast(float a, float b, fz_divider d, bool &bad) {\n",
            "    const float m = fabsf(a);\n",
            "    bad |= !(m >= 0x1p-60f && m <= d.hi);\n",
            "    const float q = __fmul_rn(a, d.r);\n",
            "    return __fmaf_rn(d.r, __fmaf_rn(q, -b, a), q);\n",
            "}\n",
        ),
        // Signed max and min as unsigned ones of the values with their sign bit flipped, an
        // order-preserving map (see `through_unsigned`): `VIMNMX3.U32` keeps its negations.
        "fz_smax" => concat!(
            "template <typename T> static __device__ __forceinline__ T fz_smax(T a, T b) {\n",
            "    const unsigned int x = (unsigned int)(int)a ^ 0x80000000u, y = (unsigned int)(int)b ^ 0x80000000u;\n",
            "    return (T)(int)((x > y ? x : y) ^ 0x80000000u);\n",
            "}\n",
            "template <typename T> static __device__ __forceinline__ T fz_smin(T a, T b) {\n",
            "    const unsigned int x = (unsigned int)(int)a ^ 0x80000000u, y = (unsigned int)(int)b ^ 0x80000000u;\n",
            "    return (T)(int)((x < y ? x : y) ^ 0x80000000u);\n",
            "}\n",
        ),
        // A zero that neither NVVM nor ptxas can fold: a `__constant__` the host could write
        // (it never does), so not `static`. See the 64-bit products in `expr.rs`.
        "fz_zero" => "__constant__ unsigned int fz_zero = 0u;\n",
        // Packed bits, what the training pair saves of a predicate (`ParamInfo::packed`): bit
        // `i % 32` of word `i / 32`; `fz_bit(w, i, l)` is element `i + l` of a vector from `i`
        // (the same word, loaded once for the vector's lanes). `fz_or_bits` sets `bits`, those of the elements from `i` on
        // (`i` a multiple of their count, which divides 32), in words that start as zeros: the
        // threads of a warp that share a word OR their bits together and the lowest of them ORs
        // the word in memory, one atomic a word and warp instead of one an element.
        "fz_bits" => concat!(
            "static __device__ __forceinline__ bool fz_bit(const unsigned int* __restrict__ w, long long i, int l = 0) {\n",
            "    return ((w[i >> 5] >> ((i & 31) + l)) & 1u) != 0u;\n",
            "}\n",
            "static __device__ __forceinline__ void fz_or_bits(unsigned int* __restrict__ w, long long i, unsigned int bits) {\n",
            "    bits <<= (i & 31);\n",
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n",
            "    const unsigned int peers = __match_any_sync(__activemask(), (unsigned long long)(i >> 5));\n",
            "    bits = __reduce_or_sync(peers, bits);\n",
            "    if (bits != 0u && (threadIdx.x & 31u) == (unsigned int)(__ffs(peers) - 1)) atomicOr(w + (i >> 5), bits);\n",
            "#else\n",
            "    if (bits != 0u) atomicOr(w + (i >> 5), bits);\n",
            "#endif\n",
            "}\n",
        ),
        // The negation of an 8- or 16-bit signed integer, in 32 bits: ptxas 13.0 lowers PTX's
        // `neg.s16` to a 32-bit negation of the sign-extended value and does not wrap it, so
        // `-(-32768i16) >= 29912` was true (p2625 of the 10,000-program run). `not` and `add`
        // in inline PTX are not a negation to either compiler; the caller's cast then wraps.
        "fz_neg_narrow" => concat!(
            "static __device__ __forceinline__ int fz_neg_narrow(int a) {\n",
            "#ifdef __CUDA_ARCH__\n",
            "    int r; asm(\"{\\n\\t.reg .b32 t;\\n\\tnot.b32 t, %1;\\n\\tadd.s32 %0, t, 1;\\n\\t}\" : \"=r\"(r) : \"r\"(a)); return r;\n",
            "#else\n",
            "    return (int)(0u - (unsigned int)a);\n",
            "#endif\n",
            "}\n",
        ),
        // f32 to an integer of at most 32 bits as Rust's `as` converts (saturated, NaN to 0), after
        // a rounding: `rz` toward zero (`as` itself), `rm` floor, `rp` ceil, `ra` round (half
        // away from zero). One PTX cvt each, which saturates to the destination's range and
        // gives 0 for NaN when the source is f32 and the destination at most 32 bits (PTX ISA,
        // cvt); `ra` adds 0.5 with the sign of a, rounded toward zero, first: for |a| < 2^23
        // trunc(a +rz 0.5) is floor(a + 0.5), as no integer lies between the rounded and the
        // exact sum; larger a are integers, which the addition leaves as they are (tested over
        // every f32 by `round_half_away_by_rz_add`). Elsewhere (the emulator) the C functions. The
        // result is an int (unsigned int for u32), which integer clamps take in one instruction.
        // The 8- and 16-bit types convert into a 16-bit register (`"=h"`, as nvcc compiles
        // `(short)f`), which the return extends: a narrow cvt into a 32-bit register was
        // miscompiled by ptxas 13.0, which took the result for already extended and, where it
        // computed it again inside a loop, wrote the low half into a register whose high half
        // held a float, then compared all 32 bits (p4646 of the 10,000-program run). A cvt to
        // s32 and a clamp instead cost W7 two integer instructions an element (98 -> 94% of
        // copy speed on an H200), a saturation the narrow cvt does itself. `LO` and `HI` are the
        // host version's (the emulator's) saturation.
        "fz_f2i" => concat!(
            "template <typename T> static __device__ __forceinline__ T fz_imax(T x, T lo) { return x < lo ? lo : x; }\n",
            "template <typename T> static __device__ __forceinline__ T fz_imin(T x, T hi) { return x > hi ? hi : x; }\n",
            "template <typename T> static __device__ __forceinline__ T fz_iclamp(T x, T lo, T hi) { return fz_imin(fz_imax(x, lo), hi); }\n",
            "#ifdef __CUDA_ARCH__\n",
            "#define FZ_F2I(P, T, K, R, LO, HI) \\\n",
            "    static __device__ __forceinline__ T fz_f2i_rz_##P(float a) { R r; asm(\"cvt.rzi.\" #P \".f32 %0, %1;\" : \"=\" #K(r) : \"f\"(a)); return (T)r; } \\\n",
            "    static __device__ __forceinline__ T fz_f2i_rm_##P(float a) { R r; asm(\"cvt.rmi.\" #P \".f32 %0, %1;\" : \"=\" #K(r) : \"f\"(a)); return (T)r; } \\\n",
            "    static __device__ __forceinline__ T fz_f2i_rp_##P(float a) { R r; asm(\"cvt.rpi.\" #P \".f32 %0, %1;\" : \"=\" #K(r) : \"f\"(a)); return (T)r; } \\\n",
            "    static __device__ __forceinline__ T fz_f2i_ra_##P(float a) { return fz_f2i_rz_##P(__fadd_rz(a, copysignf(0.5f, a))); }\n",
            "#else\n",
            "#define FZ_F2I(P, T, K, R, LO, HI) \\\n",
            "    static __device__ __forceinline__ T fz_f2i_##P(float t) { return isnan(t) ? (T)0 : t <= (float)(LO) ? (T)(LO) : t >= (float)(HI) ? (T)(HI) : (T)t; } \\\n",
            "    static __device__ __forceinline__ T fz_f2i_rz_##P(float a) { return fz_f2i_##P(truncf(a)); } \\\n",
            "    static __device__ __forceinline__ T fz_f2i_rm_##P(float a) { return fz_f2i_##P(floorf(a)); } \\\n",
            "    static __device__ __forceinline__ T fz_f2i_rp_##P(float a) { return fz_f2i_##P(ceilf(a)); } \\\n",
            "    static __device__ __forceinline__ T fz_f2i_ra_##P(float a) { return fz_f2i_##P(roundf(a)); }\n",
            "#endif\n",
            "FZ_F2I(s8, int, h, short, -128, 127) FZ_F2I(u8, int, h, unsigned short, 0, 255)\n",
            "FZ_F2I(s16, int, h, short, -32768, 32767) FZ_F2I(u16, int, h, unsigned short, 0, 65535)\n",
            "FZ_F2I(s32, int, r, int, -2147483647 - 1, 2147483647) FZ_F2I(u32, unsigned int, r, unsigned int, 0u, 4294967295u)\n",
            "#undef FZ_F2I\n",
        ),
        // Aligned to its size up to 16 bytes, the alignment the runtime gives every buffer
        // (`abi::ALIGN`): a wider vector (8 f32 lanes of a broadcast, 4 of f64) loads as 16-byte
        // halves, never as one 32-byte access of the GPUs that have them, which would fault on
        // memory 16-byte aligned.
        "fz_vec" => "template <typename T, int N> struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) fz_vec { T v[N]; };\n",
        // A vector of bf16 from f32 values that arithmetic computed (`Cuda::canonical_nans`),
        // two to a conversion instruction on sm_80 and later, without `fz_round_bf16`'s NaN
        // test: the GPU's f32 arithmetic makes only the canonical NaN (0x7fffffff), which the
        // conversion and `fz_f32_to_bf16` both round to 0x7fff; only in row steps that load
        // nothing (`Cuda::vector_bits`). The test and its fallback cost S2's bf16 softmax 4-7%
        // of copy speed on an H200 (benches/NOTES.md item 99).
        "fz_vec_bf16_pack" => vector_rounding!(pack, "bf16", "unsigned short", "unsigned int", "w", "800", "cvt.rn.bf16x2.f32", "=r"),
        // The largest (smallest) of `acc` and a vector of 16-bit floats, as `fmaxf` (`fminf`)
        // over its elements in f32 gives it (a NaN ignored, `acc` where all are NaN): on sm_80
        // and later two elements an instruction in their own type (`max.bf16x2`), then the
        // last pair in f32 (`Cuda::packed_reduction`). A bf16 softmax's max pass converted
        // each element first.
        "fz_vec_minmax_bf16" => packed_minmax!(
            "bf16",
            "__uint_as_float(m << 16)",
            "__uint_as_float(m & 0xffff0000u)"
        ),
        // Vectors of fp8 (sm_89 and later), rounded as bf16's are. The pair conversion made every
        // NaN `0x7f` on an H100, the canonical one (0x7fffffff) with the rest, as `fz_f32_to_<ty>`
        // makes every NaN (`benches/micro/f8nan.py`, NOTES item 145), so the pack is exact
        // there; PTX's manual names no NaN, so `fz_round_<ty>` keeps its test where a NaN may be
        // another. Element by element, each value took a conversion, a NaN test and a select, and
        // its byte a permute: V2 (RMSNorm + fp8 quantization) ran 4.9% faster rounded in pairs.
        "fz_vec_f8e4m3" => vector_rounding!(both, "f8e4m3", "unsigned char", "unsigned short", "h", "890", "cvt.rn.satfinite.e4m3x2.f32", "=h"),
        "fz_vec_f8e5m2" => vector_rounding!(both, "f8e5m2", "unsigned char", "unsigned short", "h", "890", "cvt.rn.satfinite.e5m2x2.f32", "=h"),
        "fz_vec_minmax_f16" => packed_minmax!(
            "f16",
            "fz_f16_to_f32((unsigned short)m)",
            "fz_f16_to_f32((unsigned short)(m >> 16))"
        ),
        // A vector of bf16 from the f32 values of a vector store (`Cuda::vector_bits`), each
        // rounded as `fz_f32_to_bf16` rounds it: on sm_80 and later, where no value is NaN
        // (tested two at a time), two to a conversion instruction; else one by one, a NaN
        // keeping its payload. Rounded one by one, a bf16 value took six instructions, its NaN
        // test five of them (S2's bf16 softmax took 36 an element: NOTES item 96).
        "fz_vec_bf16" => concat!(
            vector_rounding!(round, "bf16", "unsigned short", "unsigned int", "w", "800", "cvt.rn.bf16x2.f32", "=r"),
            // Element `j` (a constant) of a vector of bf16, from the 32-bit word that holds it
            // (`Cuda::row_element`).
            "template <int N> static __device__ __forceinline__ float fz_bf16_at(const fz_vec<unsigned short, N>& v, int j) {\n",
            "    if constexpr (N % 2 != 0) return fz_bf16_to_f32(v.v[j]);\n",
            "    else {\n",
            "        const union { fz_vec<unsigned short, N> s; unsigned int w[N / 2]; } u = {v};\n",
            "        const unsigned int w = u.w[j >> 1];\n",
            "        return __uint_as_float(j & 1 ? w & 0xffff0000u : w << 16);\n",
            "    }\n",
            "}\n",
        ),
        // A 16-byte vector load or store of global memory whose L2 lines are evicted last
        // (`createpolicy` and `.L2::cache_hint`, sm_80 and later; elsewhere, and for other
        // sizes, a plain access, as those spilled in a union). The policy is made at each use
        // (`volatile`): NVVM kept one register pair for it across whole kernels, which spilled
        // at their register bounds. Not for the row kernels' `cp.async` copies: that form
        // stopped the H200 with an illegal instruction (the row-a-block loop's bulk copies take
        // the hint, `fz_copy_row`). Measured: `benches/NOTES.md` items 53 and 54.
        "fz_keep" => concat!(
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n",
            "static __device__ __forceinline__ unsigned long long fz_keep_policy() { unsigned long long k; asm volatile(\"createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\" : \"=l\"(k)); return k; }\n",
            "template <typename V> static __device__ __forceinline__ V fz_ld_keep(const V* p) {\n",
            "    if constexpr (sizeof(V) != 16) return *p;\n",
            "    else {\n",
            "        union { V v; unsigned int w[4]; } u;\n",
            "        asm(\"ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\" : \"=r\"(u.w[0]), \"=r\"(u.w[1]), \"=r\"(u.w[2]), \"=r\"(u.w[3]) : \"l\"(p), \"l\"(fz_keep_policy()));\n",
            "        return u.v;\n",
            "    }\n",
            "}\n",
            "template <typename V> static __device__ __forceinline__ void fz_st_keep(V* p, const V& v) {\n",
            "    if constexpr (sizeof(V) != 16) *p = v;\n",
            "    else {\n",
            "        const union { V v; unsigned int w[4]; } u = {v};\n",
            "        asm volatile(\"st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;\" :: \"l\"(p), \"r\"(u.w[0]), \"r\"(u.w[1]), \"r\"(u.w[2]), \"r\"(u.w[3]), \"l\"(fz_keep_policy()) : \"memory\");\n",
            "    }\n",
            "}\n",
            "#else\n",
            "template <typename V> static __device__ __forceinline__ V fz_ld_keep(const V* p) { return *p; }\n",
            "template <typename V> static __device__ __forceinline__ void fz_st_keep(V* p, const V& v) { *p = v; }\n",
            "#endif\n",
        ),
        // Division by a reciprocal taken once per launch: q = hi64(t * m) is t / d or one less
        // (m = floor((2^64 - 1) / d)), and one comparison corrects it; exact for every 64-bit t.
        "fz_quot" => concat!(
            "struct fz_divisor { unsigned long long d, m; };\n",
            "static __device__ __forceinline__ fz_divisor fz_divisor_of(unsigned long long d) { return {d, d ? 0xffffffffffffffffull / d : 0ull}; }\n",
            "static __device__ __forceinline__ unsigned long long fz_quot(unsigned long long t, fz_divisor v) {\n",
            "    unsigned long long q = __umul64hi(t, v.m);\n",
            "    return t - q * v.d >= v.d ? q + 1 : q;\n",
            "}\n",
            // The quotient and remainder. Where the caller knows t and d are below 2^32 (`small`),
            // in 32 bits: the high half of m is floor((2^32 - 1) / d), for which the argument
            // above holds, and both take 4 instructions instead of about 25.
            "struct fz_qr { unsigned long long q, r; };\n",
            "static __device__ __forceinline__ fz_qr fz_divmod(unsigned long long t, fz_divisor v, bool small) {\n",
            "    if (!small) { const unsigned long long q = fz_quot(t, v); return {q, t - q * v.d}; }\n",
            "    const unsigned int t32 = (unsigned int)t, d32 = (unsigned int)v.d;\n",
            "    const unsigned int q = __umulhi(t32, (unsigned int)(v.m >> 32)), r = t32 - q * d32;\n",
            "    return r >= d32 ? fz_qr{q + 1u, r - d32} : fz_qr{q, r};\n",
            "}\n",
        ),
        // A grid-stride loop's place in a run (the quotient and remainder of its index by the
        // run's size d), carried from step to step rather than divided again: with the
        // step's own place and rest = d - step.r, the remainder wraps exactly when r >= rest,
        // and neither sum can overflow I (r and step.r are below d). I is the loop's index
        // type, unsigned.
        "fz_run" => concat!(
            "template <typename I> struct fz_run { I q, r; };\n",
            "template <typename I> static __device__ __forceinline__ fz_run<I> fz_run_of(unsigned long long t, fz_divisor v, bool small) { const fz_qr x = fz_divmod(t, v, small); return {(I)x.q, (I)x.r}; }\n",
            "template <typename I> static __device__ __forceinline__ fz_run<I> fz_run_next(fz_run<I> at, fz_run<I> step, I rest) {\n",
            "    return at.r >= rest ? fz_run<I>{at.q + step.q + 1, at.r - rest} : fz_run<I>{at.q + step.q, at.r + step.r};\n",
            "}\n",
        ),
        // CUDA's f64 hypot overflows at f64::MAX; scaling by a power of two is exact.
        "fz_hypot" => concat!(
            "static __device__ __forceinline__ double fz_hypot(double a, double b) {\n",
            "    a = fabs(a); b = fabs(b);\n",
            "    if (isinf(a) || isinf(b)) return __longlong_as_double(0x7ff0000000000000ll);\n",
            "    if (isnan(a) || isnan(b)) return a + b;\n",
            "    const double m = fmax(a, b);\n",
            "    if (m == 0.0) return 0.0;\n",
            "    const int e = ilogb(m);\n",
            "    const double x = ldexp(a, -e), y = ldexp(b, -e);\n",
            "    return ldexp(sqrt(x * x + y * y), e);\n",
            "}\n",
        ),
        // f16 conversions in PTX, which every architecture has (cuda_fp16.h is not needed).
        "fz_f16" => concat!(
            "static __device__ __forceinline__ float fz_f16_to_f32(unsigned short h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n",
            "static __device__ __forceinline__ unsigned short fz_f32_to_f16(float f) { unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n",
        ),
        // bf16 is the high half of an f32; rounding to nearest even on the bits, as the `half`
        // crate does, works on every architecture (PTX's cvt.rn.bf16.f32 needs sm_80).
        "fz_bf16" => concat!(
            "static __device__ __forceinline__ float fz_bf16_to_f32(unsigned short h) { return __uint_as_float((unsigned int)h << 16); }\n",
            // Round to nearest even, a NaN quieted with its payload kept (as the CPU backend
            // rounds): one conversion instruction on sm_80 and later, about seven without.
            "static __device__ __forceinline__ unsigned short fz_f32_to_bf16(float f) {\n",
            "    const unsigned int u = __float_as_uint(f);\n",
            "    const unsigned short quiet = (unsigned short)((u >> 16) | 0x40u);\n",
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n",
            "    unsigned short h;\n",
            "    asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n",
            "    return (u & 0x7fffffffu) > 0x7f800000u ? quiet : h;\n",
            "#else\n",
            "    if ((u & 0x7fffffffu) > 0x7f800000u) return quiet;\n",
            "    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n",
            "#endif\n",
            "}\n",
        ),
        // The value a cast to bf16 leaves, for arithmetic and comparisons alone
        // (`Cuda::arithmetic_only`), which make or compare no NaN by its payload: a conversion
        // and a shift, without `fz_f32_to_bf16`'s NaN test (five instructions). After `fz_bf16`,
        // which its name sorts after.
        "fz_bf16_value" => concat!(
            "static __device__ __forceinline__ float fz_bf16_value(float f) {\n",
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n",
            "    unsigned short h;\n",
            "    asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n",
            "    return fz_bf16_to_f32(h);\n",
            "#else\n",
            "    return fz_bf16_to_f32(fz_f32_to_bf16(f));\n",
            "#endif\n",
            "}\n",
        ),
        // The fp8 types: `cuda_fp8.h`'s `__NV_SATFINITE` conversions (cuda_fp8.h itself is not
        // needed), which `fuse_runtime::__private::ops` computes the same way on the CPU. To
        // nearest, ties to even; a value that would round past the largest finite value (also
        // an infinity) saturates to it; every NaN becomes 0x7f. From sm_89 on, one
        // `cvt.rn.satfinite.e4m3x2.f32` (`e5m2x2`) converts, its NaN replaced by 0x7f (PTX
        // leaves which NaN unsaid); the integer code below took 13 instructions an element,
        // which V2 (RMSNorm + fp8 quantization) is bound by. Before sm_89, in bits on the
        // integer units, the same function: the magnitude is first clamped to
        // the largest value (everything above it rounds or saturates to it), then below the
        // least normal value rounded to a multiple of the least subnormal by an f32 addition
        // whose last place that is (f32 subnormals, flushed or not, round to zero), above it
        // rounded on the f32's bits at the fp8's last mantissa bit. Back: exact; a NaN is
        // 0x7fffffff. (Computing both roundings and taking the smaller code, ptxas spilled in
        // a row kernel that also divides: RMSNorm + quantization at 2048 bf16 a row.)
        "fz_f8e4m3" => concat!(
            "static __device__ __forceinline__ float fz_f8e4m3_to_f32(unsigned char h) {\n",
            "    const unsigned int a = h & 0x7fu, s = (unsigned int)(h & 0x80u) << 24;\n",
            "    const float m = a < 8u ? (float)a * 0x1p-9f : __uint_as_float((a << 20) + (120u << 23));\n",
            "    return __uint_as_float(a == 0x7fu ? 0x7fffffffu : __float_as_uint(m) | s);\n",
            "}\n",
            "static __device__ __forceinline__ unsigned char fz_f32_to_f8e4m3(float f) {\n",
            "#if __CUDA_ARCH__ >= 890\n",
            "    unsigned short r; asm(\"cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\" : \"=h\"(r) : \"f\"(0.0f), \"f\"(f));\n",
            "    return isnan(f) ? (unsigned char)0x7fu : (unsigned char)r;\n",
            "#else\n",
            "    const unsigned int u = __float_as_uint(f), a = u & 0x7fffffffu, m = a < 0x43e00000u ? a : 0x43e00000u;\n",
            "    const unsigned int c = m < 0x3c800000u ? __float_as_uint(__uint_as_float(m) + 16384.0f) - 0x46800000u\n",
            "        : ((m + 0x7ffffu + ((m >> 20) & 1u)) >> 20) - (120u << 3);\n",
            "    return (unsigned char)(a > 0x7f800000u ? 0x7fu : ((u >> 24) & 0x80u) | c);\n",
            "#endif\n",
            "}\n",
        ),
        "fz_f8e5m2" => concat!(
            "static __device__ __forceinline__ float fz_f8e5m2_to_f32(unsigned char h) {\n",
            "    const unsigned int a = h & 0x7fu, s = (unsigned int)(h & 0x80u) << 24;\n",
            "    const float m = a < 4u ? (float)a * 0x1p-16f : __uint_as_float((a << 21) + (112u << 23));\n",
            "    const unsigned int b = a == 0x7cu ? 0x7f800000u : __float_as_uint(m);\n",
            "    return __uint_as_float(a > 0x7cu ? 0x7fffffffu : b | s);\n",
            "}\n",
            "static __device__ __forceinline__ unsigned char fz_f32_to_f8e5m2(float f) {\n",
            "#if __CUDA_ARCH__ >= 890\n",
            "    unsigned short r; asm(\"cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;\" : \"=h\"(r) : \"f\"(0.0f), \"f\"(f));\n",
            "    return isnan(f) ? (unsigned char)0x7fu : (unsigned char)r;\n",
            "#else\n",
            "    const unsigned int u = __float_as_uint(f), a = u & 0x7fffffffu, m = a < 0x47600000u ? a : 0x47600000u;\n",
            "    const unsigned int c = m < 0x38800000u ? __float_as_uint(__uint_as_float(m) + 128.0f) - 0x43000000u\n",
            "        : ((m + 0xfffffu + ((m >> 21) & 1u)) >> 21) - (112u << 2);\n",
            "    return (unsigned char)(a > 0x7f800000u ? 0x7fu : ((u >> 24) & 0x80u) | c);\n",
            "#endif\n",
            "}\n",
        ),
        "fz_div" => concat!(
            "static __device__ __forceinline__ int fz_div(int a, int b) { return b == 0 ? 0 : b == -1 ? (int)(0u - (unsigned int)a) : a / b; }\n",
            "static __device__ __forceinline__ long long fz_div(long long a, long long b) { return b == 0 ? 0 : b == -1 ? (long long)(0ull - (unsigned long long)a) : a / b; }\n",
            "static __device__ __forceinline__ unsigned int fz_div(unsigned int a, unsigned int b) { return b == 0 ? 0u : a / b; }\n",
            "static __device__ __forceinline__ unsigned long long fz_div(unsigned long long a, unsigned long long b) { return b == 0 ? 0ull : a / b; }\n",
        ),
        "fz_rem" => concat!(
            "static __device__ __forceinline__ int fz_rem(int a, int b) { return b == 0 ? a : b == -1 ? 0 : a % b; }\n",
            "static __device__ __forceinline__ long long fz_rem(long long a, long long b) { return b == 0 ? a : b == -1 ? 0 : a % b; }\n",
            "static __device__ __forceinline__ unsigned int fz_rem(unsigned int a, unsigned int b) { return b == 0 ? a : a % b; }\n",
            "static __device__ __forceinline__ unsigned long long fz_rem(unsigned long long a, unsigned long long b) { return b == 0 ? a : a % b; }\n",
        ),
        "fz_abs" => concat!(
            "static __device__ __forceinline__ int fz_abs(int a) { return a < 0 ? (int)(0u - (unsigned int)a) : a; }\n",
            "static __device__ __forceinline__ long long fz_abs(long long a) { return a < 0 ? (long long)(0ull - (unsigned long long)a) : a; }\n",
        ),
        "fz_signum" => concat!(
            "static __device__ __forceinline__ float fz_signum(float a) { return isnan(a) ? a : copysignf(1.0f, a); }\n",
            "static __device__ __forceinline__ double fz_signum(double a) { return isnan(a) ? a : copysign(1.0, a); }\n",
            "static __device__ __forceinline__ int fz_signum(int a) { return (a > 0) - (a < 0); }\n",
            "static __device__ __forceinline__ long long fz_signum(long long a) { return (long long)((a > 0) - (a < 0)); }\n",
        ),
        // Exponentiation by squaring in the order of compiler-rt's __powisf2, which Rust's powi calls.
        // The result leaves through a multiply by 1 that is never fused (`__fmul_rn`), so that
        // it is rounded as the CPU rounds it: inlined, the last product was fused into the
        // caller's subtraction, so that a row's `logsumexp` of `x.powi(7)` near 2.7e32 in f64
        // found `x^7 - max` of 1e16 in one pass and 0 in the other, and returned infinity
        // (p3039 of the 10,000-program run; item 90 of benches/NOTES.md is the same for a plain
        // product). The products inside feed only products, which no FMA fuses; rounding each
        // with `__fmul_rn` too made `fuse_math` spill.
        "fz_powi" => concat!(
            "static __device__ __forceinline__ float fz_mul_rn(float a, float b) { return __fmul_rn(a, b); }\n",
            "static __device__ __forceinline__ double fz_mul_rn(double a, double b) { return __dmul_rn(a, b); }\n",
            "template <typename T> static __device__ __forceinline__ T fz_powi(T a, int b) {\n",
            "    const bool recip = b < 0; T r = 1;\n",
            "    while (true) { if (b & 1) r *= a; b /= 2; if (b == 0) break; a *= a; }\n",
            "    return recip ? T(1) / r : fz_mul_rn(r, T(1));\n",
            "}\n",
        ),
        "fz_pow" => concat!(
            "template <typename T> static __device__ __forceinline__ T fz_pow(T a, unsigned int e) {\n",
            "    unsigned long long base = (unsigned long long)a, r = 1;\n",
            "    while (e) { if (e & 1u) r *= base; base *= base; e >>= 1; }\n",
            "    return (T)r;\n",
            "}\n",
        ),
        "fz_sigmoid" => concat!(
            "static __device__ __forceinline__ float fz_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }\n",
            "static __device__ __forceinline__ double fz_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }\n",
        ),
        "fz_silu" => concat!(
            "static __device__ __forceinline__ float fz_silu(float x) { return x / (1.0f + expf(-x)); }\n",
            "static __device__ __forceinline__ double fz_silu(double x) { return x / (1.0 + exp(-x)); }\n",
        ),
        "fz_gelu" => concat!(
            "static __device__ __forceinline__ float fz_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.707106781186547524f)); }\n",
            "static __device__ __forceinline__ double fz_gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.707106781186547524)); }\n",
        ),
        // The same, the last product rounded on its own where a row's maximum reads the
        // value (`exact_products`).
        "fz_gelu_rn" => concat!(
            "static __device__ __forceinline__ float fz_gelu_rn(float x) { return __fmul_rn(0.5f * x, 1.0f + erff(x * 0.707106781186547524f)); }\n",
            "static __device__ __forceinline__ double fz_gelu_rn(double x) { return __dmul_rn(0.5 * x, 1.0 + erf(x * 0.707106781186547524)); }\n",
        ),
        "fz_gelu_tanh_rn" => concat!(
            "static __device__ __forceinline__ float fz_gelu_tanh_rn(float x) { return __fmul_rn(0.5f * x, 1.0f + tanhf(0.797884560802865356f * (x + 0.044715f * x * x * x))); }\n",
            "static __device__ __forceinline__ double fz_gelu_tanh_rn(double x) { return __dmul_rn(0.5 * x, 1.0 + tanh(0.797884560802865356 * (x + 0.044715 * x * x * x))); }\n",
        ),
        "fz_gelu_tanh" => concat!(
            "static __device__ __forceinline__ float fz_gelu_tanh(float x) { return 0.5f * x * (1.0f + tanhf(0.797884560802865356f * (x + 0.044715f * x * x * x))); }\n",
            "static __device__ __forceinline__ double fz_gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(0.797884560802865356 * (x + 0.044715 * x * x * x))); }\n",
        ),
        // `gelu`'s derivative `Φ(x) + x φ(x)` (`Func::GeluGrad`), in f32 without `erff` and
        // `expf` (19 and 8 instructions, the most of G8's backward): `1 + φ(x) (x - R(|x|))`
        // for `x > 0`, `φ(x) (x + R(|x|))` otherwise, with `R(a) = Φ(-a) / φ(a)` (Mills'
        // ratio) as `t Q(t)`, `t = 1 / (1 + a / 4)`, `Q` of degree 9 (fitted to a relative
        // error of 4e-8; `Q(0) = 1 / 4` makes `R(a)` tend to `1 / a`), and `φ(x) = h * h`,
        // `h = 2^(-x^2 log2(e) / 4 - log2(2 pi) / 4)`, squared so that `φ` keeps its subnormal
        // values (`ex2.approx.ftz` flushes them). `benches/micro/gelu_grad_fit.py` fits `Q` and
        // models the steps against f64 on [-15, 15]: at most 2.6e-7 absolute (the rounding of
        // `1 + a / 4` the most of it), and in ulps of the value, away from its zero near -0.75,
        // 24 from -2 up, 30 on [-6, -2), up to 157 below (the exponent's rounding, as in
        // `expf(-0.5f * x * x)`); the derivative written out is within 1.5e-7 but cancels in
        // `1 + erff(..)` below -2 (5e5 ulps). About 21 instructions an element where the
        // routines and their arithmetic took 33 (G8's backward: 71 -> 55). f64: the formula of
        // the CPU backend (`fuse_runtime::ops`).
        "fz_gelu_grad" => concat!(
            "static __device__ __forceinline__ float fz_gelu_grad(float x) {\n",
            "    const float d = fmaf(0.25f, fabsf(x), 1.0f), p = fmaf(x * x, -0x1.715476p-2f, -0x1.53643ap-1f);\n",
            "#if defined(__CUDA_ARCH__)\n",
            "    float t, h;\n",
            "    asm(\"rcp.approx.ftz.f32 %0, %1;\" : \"=f\"(t) : \"f\"(d));\n",
            "    asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(h) : \"f\"(p));\n",
            "#else\n",
            "    const float t = 1.0f / d, h = exp2f(p);\n",
            "#endif\n",
            "    float q = fmaf(0x1.94003ep-5f, t, -0x1.9d2bf8p-3f);\n",
            "    q = fmaf(q, t, 0x1.e7e5a8p-3f);\n",
            "    q = fmaf(q, t, -0x1.41d74ap-4f);\n",
            "    q = fmaf(q, t, 0x1.467ca6p-3f);\n",
            "    q = fmaf(q, t, 0x1.2eb86ap-3f);\n",
            "    q = fmaf(q, t, 0x1.a2f5f0p-3f);\n",
            "    q = fmaf(q, t, 0x1.dfcf42p-3f);\n",
            "    q = fmaf(q, t, 0x1.000096p-2f);\n",
            "    q = fmaf(q, t, 0.25f);\n",
            "    const float r = t * q, e = h * h;\n",
            "    const bool pos = x > 0.0f;\n",
            "    return fmaf(e, x + (pos ? -r : r), pos ? 1.0f : 0.0f);\n",
            "}\n",
            "static __device__ __forceinline__ double fz_gelu_grad(double x) { return 0.5 * erfc(-x * 0.707106781186547524) + x * (exp(-0.5 * x * x) * 0.398942280401432678); }\n",
        ),
        // CUDA's `logf` (CUDA 13's, as ptxas 13.0 writes it for sm_80 and sm_90) for an argument
        // known to be at least `f32::MIN_POSITIVE`, NaN or +inf (`Cuda::ln_of_normal`): the
        // same steps and constants, the same result bit for bit, without the tests and the
        // rescaling of subnormal arguments and of zero, five of its 24 instructions. `m` is the
        // argument scaled by a power of two `e` into [2/3, 4/3); `ln(m)` is `f + f^2 p(f)`
        // for `f = m - 1`. Two more go: `logf` scales `e` by 2^-23 and then multiplies by
        // `ln 2`, where the scale folds into the constant (both products exact, so the fused
        // sum rounds the same number); and +inf and NaN take `y * inf` (+inf, the canonical
        // NaN), which needs no register for the infinity as `logf`'s `fmaf(y, inf, inf)` does
        // (and would give NaN for a negative argument, which `least` rules out).
        "fz_log_normal" => concat!(
            "static __device__ __forceinline__ float fz_log_normal(float y) {\n",
            "    const int e = (__float_as_int(y) - 0x3f2aaaab) & (int)0xff800000u;\n",
            "    const float f = __int_as_float(__float_as_int(y) - e) - 1.0f;\n",
            "    float p = fmaf(f, -0x1.0aa04ep-3f, 0x1.2073ecp-3f);\n",
            "    p = fmaf(f, p, -0x1.f19b98p-4f);\n",
            "    p = fmaf(f, p, 0x1.1e52aap-3f);\n",
            "    p = fmaf(f, p, -0x1.55b172p-3f);\n",
            "    p = fmaf(f, p, 0x1.99da16p-3f);\n",
            "    p = fmaf(f, p, -0x1.fffe44p-3f);\n",
            "    p = fmaf(f, p, 0x1.5554f0p-2f);\n",
            "    p = fmaf(f, p, -0.5f);\n",
            "    p = fmaf(f, f * p, f);\n",
            "    const float r = fmaf((float)e, 0x1.62e430p-24f, p);\n",
            "    return (unsigned int)__float_as_int(y) >= 0x7f800000u ? y * __int_as_float(0x7f800000) : r;\n",
            "}\n",
        ),
        "fz_softplus" => concat!(
            "static __device__ __forceinline__ float fz_softplus(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }\n",
            "static __device__ __forceinline__ double fz_softplus(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }\n",
        ),
        // The generator of `fuse_runtime::random`, step for step: the float steps use the
        // correctly rounded intrinsics, so no flag can contract or approximate them.
        // `fz_u01(w) < p` for a launch-wide p, without the conversion: fz_u01(w) is (w >> 8)
        // scaled by 2^-24 exactly, and so is p * 2^24 by 2^24 (p < 1), so for the integer k =
        // w >> 8, k * 2^-24 < p exactly when k < ceil(p * 2^24). NaN and p <= 0 keep nothing
        // below; p >= 1 keeps every k (at most 2^24 - 1) below. ptxas hoists it out of the loop.
        // `fz_u01_below` compares the whole word, w < bound * 2^8 (w's low byte is below 2^8):
        // one instruction an element fewer than w >> 8 < bound, where bound is below 2^24.
        "fz_u01_bound" => concat!(
            "static __device__ __forceinline__ unsigned int fz_u01_bound(float p) {\n",
            "    if (!(p > 0.0f)) return 0u;\n",
            "    if (p >= 1.0f) return 1u << 24;\n",
            "    return (unsigned int)ceilf(p * 16777216.0f);\n",
            "}\n",
            "static __device__ __forceinline__ bool fz_u01_below(unsigned int w, unsigned int bound) { return bound >> 24 != 0u || w < bound << 8; }\n",
            // The same through a rounding to a 16-bit float whose last bit is `ulp` in f32's
            // bits (1 << 16 for bf16, 1 << 13 for f16's normal values): the draws whose rounding
            // is below p are those below q, p rounded up to the type (its values below p are
            // those below q), so those below the midpoint m of q and the value under it, and
            // m itself where q is odd (a tie rounds to even). For 0 < q <= 1, m in f32's bits
            // is q's less half an ulp, and m * 2^24 exact, as above.
            "static __device__ __forceinline__ unsigned int fz_u01_bound_narrow(float p, unsigned int ulp) {\n",
            "    if (!(p > 0.0f)) return 0u;\n",
            "    if (p > 1.0f) return 1u << 24;\n",
            "    const unsigned int q = (__float_as_uint(p) + (ulp - 1u)) & ~(ulp - 1u);\n",
            "    const float m = __uint_as_float(q - ulp / 2u) * 16777216.0f;\n",
            "    const float c = ceilf(m);\n",
            "    return (unsigned int)c + ((q & ulp) != 0u && c == m ? 1u : 0u);\n",
            "}\n",
            "static __device__ __forceinline__ unsigned int fz_u01_bound_bf16(float p) { return fz_u01_bound_narrow(p, 1u << 16); }\n",
            // Below 2^-14 f16's values are subnormal, multiples of 2^-24 as the draws are, and
            // the draws there round to themselves: p's bound is the f32 one.
            "static __device__ __forceinline__ unsigned int fz_u01_bound_f16(float p) { return p <= 0x1p-14f ? fz_u01_bound(p) : fz_u01_bound_narrow(p, 1u << 13); }\n",
        ),
        "fz_random" => concat!(
            "struct fz_u4 { unsigned int v[4]; };\n",
            // Philox's round keys, round i's (k0 + i * 0x9E3779B9, k1 + i * 0xBB67AE85) as the
            // low and high word of k[i]. A seed that is a parameter has them from the host, as
            // parameters (`fz_key<j>_<i>`, round 0's the seed itself), which the rounds read from
            // the constant bank; computed here, ptxas made them again at every draw (18 adds).
            "struct fz_key { unsigned long long k[10]; };\n",
            "static __device__ __forceinline__ fz_key fz_key_of(unsigned long long seed) {\n",
            "    fz_key r;\n",
            "    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);\n",
            "    #pragma unroll\n",
            "    for (int i = 0; i < 10; ++i) { r.k[i] = (unsigned long long)k1 << 32 | k0; k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }\n",
            "    return r;\n",
            "}\n",
            // One `mul.wide` gives both halves of a product (IMAD.WIDE.U32). From C (`__umulhi`
            // and `*`, or a 64-bit product) ptxas made the halves apart, or copied each high half
            // with an add of zero: 60 instructions a block against 40.
            "static __device__ __forceinline__ void fz_mul_wide(unsigned int a, unsigned int b, unsigned int &lo, unsigned int &hi) {\n",
            "#ifdef __CUDA_ARCH__\n",
            "    asm(\"{ .reg .u64 t; mul.wide.u32 t, %2, %3; mov.b64 {%0, %1}, t; }\" : \"=r\"(lo), \"=r\"(hi) : \"r\"(a), \"r\"(b));\n",
            "#else\n",
            "    const unsigned long long t = (unsigned long long)a * b; lo = (unsigned int)t; hi = (unsigned int)(t >> 32);\n",
            "#endif\n",
            "}\n",
            "static __device__ __forceinline__ fz_u4 fz_philox(const fz_key &key, unsigned long long counter, unsigned int stream) {\n",
            "    unsigned int c0 = (unsigned int)counter, c1 = (unsigned int)(counter >> 32), c2 = stream, c3 = 0u;\n",
            "    #pragma unroll\n",
            "    for (int i = 0; i < 10; ++i) {\n",
            "        unsigned int hi0, lo0, hi1, lo1;\n",
            "        fz_mul_wide(c0, 0xD2511F53u, lo0, hi0);\n",
            "        fz_mul_wide(c2, 0xCD9E8D57u, lo1, hi1);\n",
            "        c0 = hi1 ^ c1 ^ (unsigned int)key.k[i]; c1 = lo1; c2 = hi0 ^ c3 ^ (unsigned int)(key.k[i] >> 32); c3 = lo0;\n",
            "    }\n",
            "    return {{c0, c1, c2, c3}};\n",
            "}\n",
            "static __device__ __forceinline__ float fz_u01(unsigned int w) { return __fmul_rn(__uint2float_rn(w >> 8), 5.9604644775390625e-8f); }\n",
            "static __device__ __forceinline__ float fz_ln01(float u) {\n",
            "    const unsigned int b = __float_as_uint(u);\n",
            "    int e = (int)(b >> 23) - 127;\n",
            "    unsigned int mb = (b & 0x7fffffu) | 0x3f800000u;\n",
            "    if (mb > 0x3fb504f3u) { mb -= 0x00800000u; e += 1; }\n",
            "    const float m = __uint_as_float(mb);\n",
            "    const float s = __fdiv_rn(__fsub_rn(m, 1.0f), __fadd_rn(m, 1.0f));\n",
            "    const float z = __fmul_rn(s, s);\n",
            "    float p = __uint_as_float(0x3e3a2e8cu);\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0x3e638e39u));\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0x3e924925u));\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0x3ecccccdu));\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0x3f2aaaabu));\n",
            "    const float lm = __fmaf_rn(__fmul_rn(s, z), p, __fmul_rn(2.0f, s));\n",
            "    return __fmaf_rn(__int2float_rn(e), __uint_as_float(0x3f317218u), lm);\n",
            "}\n",
            "static __device__ __forceinline__ float fz_sin_quarter(float f) {\n",
            "    const float z = __fmul_rn(f, f);\n",
            "    float p = __uint_as_float(0x39283c1au);\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0xbb996966u));\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0x3da335e3u));\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0xbf255de7u));\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0x3fc90fdbu));\n",
            "    return __fmul_rn(f, p);\n",
            "}\n",
            "static __device__ __forceinline__ float fz_cos_quarter(float f) {\n",
            "    const float z = __fmul_rn(f, f);\n",
            "    float p = __uint_as_float(0xb7d368f9u);\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0x3a70fa83u));\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0xbcaae9e4u));\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0x3e81e0f8u));\n",
            "    p = __fmaf_rn(z, p, __uint_as_float(0xbf9de9e6u));\n",
            "    return __fmaf_rn(z, p, 1.0f);\n",
            "}\n",
            "static __device__ __forceinline__ float fz_box_muller(unsigned int a, unsigned int b, bool sine) {\n",
            "    const float u = __fmul_rn(__uint2float_rn((a >> 8) + 1u), 5.9604644775390625e-8f);\n",
            "    const float r = __fsqrt_rn(__fmul_rn(-2.0f, fz_ln01(u)));\n",
            "    const unsigned int q = ((b >> 30) + (sine ? 3u : 0u)) & 3u;\n",
            "    const float f = __fmul_rn(__uint2float_rn((b >> 8) & 0x3fffffu), 2.384185791015625e-7f);\n",
            "    const bool swap = f > 0.5f;\n",
            "    const float g = swap ? __fsub_rn(1.0f, f) : f;\n",
            "    const float cq = fz_cos_quarter(g), sq = fz_sin_quarter(g);\n",
            "    const float c = swap ? sq : cq, s = swap ? cq : sq;\n",
            "    const float v = q == 0u ? c : q == 1u ? -s : q == 2u ? -c : s;\n",
            "    return __fmul_rn(r, v);\n",
            "}\n",
            // Selects rather than `.v[i & 3]`: a variable index would put the words in local memory.
            "static __device__ __forceinline__ unsigned int fz_word(const fz_u4 &w, unsigned int k) { return k == 0u ? w.v[0] : k == 1u ? w.v[1] : k == 2u ? w.v[2] : w.v[3]; }\n",
            "static __device__ __forceinline__ float fz_rand(const fz_key &key, unsigned long long i, unsigned int stream) {\n",
            "    return fz_u01(fz_word(fz_philox(key, i >> 2, stream), (unsigned int)i & 3u));\n",
            "}\n",
            "static __device__ __forceinline__ float fz_randn(const fz_key &key, unsigned long long i, unsigned int stream) {\n",
            "    const fz_u4 w = fz_philox(key, i >> 2, stream);\n",
            "    const unsigned int k = (unsigned int)i & 2u;\n",
            "    return fz_box_muller(fz_word(w, k), fz_word(w, k | 1u), (i & 1) != 0);\n",
            "}\n",
        ),
        // logsumexp's pair (m, s): s = sum of exp(x - m) over the elements so far. A term whose
        // value equals m counts 1 without `exp`, so -inf and +inf elements give -inf and +inf
        // rather than NaN; NaN never becomes m (`>` and fmax skip it) but poisons s.
        "fz_lse" => concat!(
            "static __device__ __forceinline__ void fz_lse_add(float &m, float &s, float x) { if (x > m) { s = s * expf(m - x) + 1.0f; m = x; } else { s += x == m ? 1.0f : expf(x - m); } }\n",
            "static __device__ __forceinline__ void fz_lse_add(double &m, double &s, double x) { if (x > m) { s = s * exp(m - x) + 1.0; m = x; } else { s += x == m ? 1.0 : exp(x - m); } }\n",
            "static __device__ __forceinline__ void fz_lse_merge(float &m, float &s, float m2, float s2) { const float t = fmaxf(m, m2); s = s * (m == t ? 1.0f : expf(m - t)) + s2 * (m2 == t ? 1.0f : expf(m2 - t)); m = t; }\n",
            "static __device__ __forceinline__ void fz_lse_merge(double &m, double &s, double m2, double s2) { const double t = fmax(m, m2); s = s * (m == t ? 1.0 : exp(m - t)) + s2 * (m2 == t ? 1.0 : exp(m2 - t)); m = t; }\n",
        ),
        // The barrier of segment `s` of a row loop's block, its `n` threads (a multiple of 32)
        // alone: named barrier `s + 1`, as `__syncthreads` is barrier 0. The id is in a
        // register, so ptxas reserves all 16 barriers for the block, which can bound the
        // blocks an SM: the S2 f16 row sums (streamed rows, 32 registers) ran 15-28% slower
        // with it, where no cached-rows row of the benchmark (40 registers and more) lost
        // time. Written as constants (a `switch`, or a predicated `bar.sync` each), the ids
        // cost the wide softmaxes 24 bytes of spills at their 80 registers (NOTES item 123).
        // The emulator has its own.
        "fz_row_sync" => concat!(
            "#ifdef __CUDA_ARCH__\n",
            "static __device__ __forceinline__ void fz_row_sync(unsigned int s, int n) { asm volatile(\"bar.sync %0, %1;\" :: \"r\"(s + 1u), \"r\"(n) : \"memory\"); }\n",
            "#endif\n",
        ),
        // A barrier of the whole grid, which a cooperative launch keeps resident: every
        // block's writes before it are seen by every block after it. Counter 0 counts the
        // blocks that arrived, counter 1 those past it, the last of which puts both back to
        // zero for the next launch (the runtime gives them zeroed). The emulator has its own.
        "fz_grid_sync" => concat!(
            "#ifdef __CUDA_ARCH__\n",
            "static __device__ __forceinline__ void fz_grid_sync(unsigned int* counter) {\n",
            "    __syncthreads();\n",
            "    if (threadIdx.x == 0) {\n",
            "        __threadfence();\n",
            "        atomicAdd(counter, 1u);\n",
            "#if __CUDA_ARCH__ >= 700\n",
            "        while (*(volatile unsigned int*)counter < gridDim.x) __nanosleep(32);\n",
            "#else\n",
            "        while (*(volatile unsigned int*)counter < gridDim.x) {}\n",
            "#endif\n",
            "        __threadfence();\n",
            "        if (atomicAdd(counter + 1, 1u) == gridDim.x - 1u) { counter[0] = 0u; counter[1] = 0u; }\n",
            "    }\n",
            "    __syncthreads();\n",
            "}\n",
            "#endif\n",
        ),
        "fz_l2_prefetch" => super::rows::long_rows::L2_PREFETCH,
        "fz_long_rows" => super::rows::long_rows::HELPERS,
        "fz_row_copy" => super::rows::long_rows::ROW_COPY_HELPERS,
        _ => unreachable!("unknown helper {name}"),
    }
}

/// The integer arithmetic of two helpers, mirrored in Rust line for line and checked against
/// the plain operations they replace.
#[cfg(test)]
mod tests {
    /// xorshift64*: reproducible, with every bit exercised.
    fn words(seed: u64) -> impl Iterator<Item = u64> {
        let mut s = seed | 1;
        std::iter::repeat_with(move || {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            s.wrapping_mul(0x2545_f491_4f6c_dd1d)
        })
    }

    /// Values with no decimal literal are written as their bits; finite ones as the shortest
    /// digits that read back exactly (`f32::MAX`), as before.
    #[test]
    fn float_constants_are_printed_exactly() {
        use super::float_literal;
        use crate::ty::Elem;
        let cases = [
            ("inf", Elem::F32, "__int_as_float(0x7f800000)"),
            ("-inf", Elem::F32, "__uint_as_float(0xff800000u)"),
            ("NaN", Elem::F32, "__uint_as_float(0x7fc00000u)"),
            ("NaN", Elem::BF16, "__uint_as_float(0x7fc00000u)"),
            ("-inf", Elem::F16, "__uint_as_float(0xff800000u)"),
            (
                "inf",
                Elem::F64,
                "__longlong_as_double(0x7ff0000000000000ll)",
            ),
            (
                "-inf",
                Elem::F64,
                "__longlong_as_double((long long)0xfff0000000000000ull)",
            ),
            (
                "NaN",
                Elem::F64,
                "__longlong_as_double((long long)0x7ff8000000000000ull)",
            ),
            ("3.4028235e38", Elem::F32, "3.4028235e38f"),
            ("1.1754944e-38", Elem::F32, "1.1754944e-38f"),
            ("65504.0", Elem::F16, "65504.0f"),
            ("2.220446049250313e-16", Elem::F64, "2.220446049250313e-16"),
        ];
        for (digits, e, want) in cases {
            assert_eq!(float_literal(digits, e), want, "{digits} as {e}");
        }
    }

    /// `fz_divmod` with `small`: the high half of the host's 64-bit reciprocal divides in 32 bits.
    #[test]
    fn divmod_in_32_bits_is_exact() {
        let divmod = |t: u32, d: u32| {
            let m = u64::MAX / u64::from(d);
            let q = ((u64::from(t) * (m >> 32)) >> 32) as u32;
            let r = t.wrapping_sub(q.wrapping_mul(d));
            if r >= d {
                (q + 1, r - d)
            } else {
                (q, r)
            }
        };
        let edges = [
            1,
            2,
            3,
            4,
            5,
            7,
            255,
            256,
            4095,
            4096,
            65535,
            1 << 31,
            u32::MAX - 1,
            u32::MAX,
        ];
        let mut w = words(0x5eed);
        let mut cases: Vec<(u32, u32)> = vec![];
        for &d in &edges {
            for &t in &edges {
                cases.push((t, d));
            }
            cases.extend([(0, d), (d - 1, d), (d.saturating_mul(3), d)]);
        }
        for _ in 0..200_000 {
            let (t, d) = (
                w.next().unwrap() as u32,
                w.next().unwrap() >> (32 + w.next().unwrap() % 32),
            );
            cases.push((t, (d as u32).max(1)));
        }
        for (t, d) in cases {
            assert_eq!(divmod(t, d), (t / d, t % d), "{t} / {d}");
        }
    }

    /// `fz_u01_bound`, step for step.
    fn u01_bound(p: f32) -> u32 {
        if p.is_nan() || p <= 0.0 {
            0
        } else if p >= 1.0 {
            1 << 24
        } else {
            (p * 16_777_216.0).ceil() as u32
        }
    }

    /// `fz_u01_bound` and `fz_u01_below`: `below(w, bound(p))` exactly when `fz_u01(w) < p`.
    #[test]
    fn uniform_draws_compare_as_integers() {
        let u01 = |w: u32| (w >> 8) as f32 * 5.960_464_5e-8;
        let bound = u01_bound;
        let below = |w: u32, bound: u32| bound >> 24 != 0 || w < bound << 8;
        let mut ps = vec![
            0.1,
            0.5,
            1.0,
            1.5,
            0.0,
            -0.0,
            -0.3,
            f32::NAN,
            f32::INFINITY,
            f32::MIN_POSITIVE,
            1e-45,
            5.960_464_5e-8,
            0.999_999_94,
        ];
        let mut w = words(7);
        ps.extend((0..20_000).map(|_| f32::from_bits(w.next().unwrap() as u32)));
        ps.extend((0..20_000).map(|_| u01((w.next().unwrap() >> 32) as u32)));
        for p in ps {
            let b = bound(p);
            let edge = u64::from(b) << 8;
            let near = [
                0,
                1,
                edge.saturating_sub(257),
                edge.saturating_sub(1),
                edge,
                edge + 255,
            ];
            let near = near.into_iter().chain([u64::from(u32::MAX)]);
            for w in near.filter_map(|w| u32::try_from(w).ok()) {
                assert_eq!(below(w, b), u01(w) < p, "w = {w:#x}, p = {p:e}");
            }
        }
    }

    /// `fz_u01_bound_bf16` and `fz_u01_bound_f16`, step for step: the draws `k * 2^-24` below
    /// their bound are exactly those whose rounding to the type is below `p`, for every bf16
    /// and f16 value from 0 to 2 and for random `p`; the largest draw below, found by bisection
    /// on the rounded draws, sits just under the bound.
    #[test]
    fn uniform_draws_rounded_to_16_bits_compare_as_integers() {
        let bound = u01_bound;
        let narrow = |p: f32, ulp: u32| -> u32 {
            if p.is_nan() || p <= 0.0 {
                return 0;
            }
            if p > 1.0 {
                return 1 << 24;
            }
            let q = (p.to_bits() + (ulp - 1)) & !(ulp - 1);
            let m = f32::from_bits(q - ulp / 2) * 16_777_216.0;
            let c = m.ceil();
            c as u32 + u32::from(q & ulp != 0 && c == m)
        };
        let bf16 = |p: f32| narrow(p, 1 << 16);
        let f16 = |p: f32| match p <= 2f32.powi(-14) {
            true => bound(p),
            false => narrow(p, 1 << 13),
        };
        // Round to nearest, ties to even, dropping the low `bits` of an f32 in [0, 1]; the
        // draws below 2^-14 are f16 values themselves (subnormal, multiples of 2^-24).
        let round = |u: f32, bits: u32| -> f32 {
            let b = u.to_bits();
            let half = 1u32 << (bits - 1);
            let low = b & ((1 << bits) - 1);
            let up = low > half || (low == half && b & (1 << bits) != 0);
            f32::from_bits((b >> bits << bits) + if up { 1 << bits } else { 0 })
        };
        let to_bf16 = |u: f32| round(u, 16);
        let to_f16 = |u: f32| match u < 2f32.powi(-14) {
            true => u,
            false => round(u, 13),
        };
        type Case<'a> = (&'a dyn Fn(f32) -> u32, &'a dyn Fn(f32) -> f32, u32);
        let cases: [Case; 2] = [(&bf16, &to_bf16, 16), (&f16, &to_f16, 13)];
        let mut w = words(11);
        for (bound, to, bits) in cases {
            // Every value of the type up to 2, in f32's bits, and random f32s.
            let mut ps: Vec<f32> = (0..=2f32.to_bits() >> bits)
                .map(|i| f32::from_bits(i << bits))
                .collect();
            ps.extend([-0.0, -0.5, f32::NAN, f32::INFINITY, f32::MAX, 1e-45, 0.1]);
            ps.extend((0..20_000).map(|_| f32::from_bits(w.next().unwrap() as u32 >> 2)));
            ps.extend((0..20_000).map(|_| (w.next().unwrap() >> 40) as f32 * 2f32.powi(-24)));
            for p in ps {
                let below = |k: u32| to(k as f32 * 2f32.powi(-24)) < p;
                // The draws below p, counted by bisection (the rounding is monotone).
                let (mut lo, mut hi) = (0u32, 1u32 << 24);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    match below(mid) {
                        true => lo = mid + 1,
                        false => hi = mid,
                    }
                }
                assert_eq!(bound(p), lo, "p = {p:e} ({:#x}), {bits}", p.to_bits());
            }
        }
    }
}
