//! Every mismatch the random programs have found, kept by text: the program as generated (its
//! `fn` item, its description for the oracle and its glue), the seed and the instance that failed.
//! Each runs on the CPU backend against the oracle; a new mismatch goes here with a line that
//! says what it was. (So far each was the oracle's mistake, not the macro's: see each case.)
//!
//! What the GPU run found goes where the GPU runs it: p23 (seed of program 23 of the default
//! batch; two `f64` tensors and an `f16` one, rows of 28) hung the GPU in a short-row tile that
//! held no block's step of rows. Its kernel, reduced, is `wide_rows_f64` of the GPU tests
//! (`fuse-runtime/tests/gpu_language.rs`, `short_rows_of_wide_tensors`, every short length),
//! beside a unit test of the tiles (`fuse-macros/src/cuda/tile.rs`) and the emulated GPU. The
//! first 10,000-program run (2026-11-28, `benches/NOTES.md` item 100) found three ptxas
//! miscompiles and a fused product in `powi`, kept as `integer_negations_and_narrow_conversions_
//! as_ptxas_miscompiled_them` and `powers_under_a_logsumexp_round_alike_in_every_pass` there;
//! its p3238 is a harness case (`harness::gpu_against_cpu`), and p6329 the FMA at the top of
//! the range that doc/language.md's accuracy section explains and the oracle now allows. p11659
//! (2026-12-02, the 2,500 programs from p10000) was a fourth: `(s << 95).min(..)` on `i64`
//! written through `&mut`, which ptxas computed again in an unrolled loop as `s * -2^31`; kept as
//! `products_by_two_to_the_31_as_ptxas_miscompiled_them` there (item 102). p21199 (the 2,500
//! from p20000) was a fifth: `|q| > -2.0` folded to true, NaN included, in a `clamp`; kept as
//! `nan_survives_comparisons_with_constants_below_zero` there (item 107). Before it, p20915 of
//! the same batch crashed rustc 1.95 in release (LLVM, on `f32::max` and `f64::max` reduced in
//! one loop of the CPU backend); `mixed_width_extrema` of the CPU tests keeps it. p26365 (the
//! 2,500 from p25000) was a sixth: `logsumexp` over columns of `x.to_degrees()`, `-inf` where a
//! column held `1e30`, its last product fused into one pass's subtraction of the maximum; kept as
//! `functions_ending_in_products_under_a_logsumexp` there (item 111).

use fuse_runtime::{bf16, f16, fuse, Device, Error};
use random_programs::harness::{Args, Out};
use random_programs::oracle::Desc;
use random_programs::run::{check_cpu, instance, Config};
use random_programs::Program;

fuse! {
    // `powi` with a negative exponent is `1 / x^|n|` (compiler-rt's order): where `x^|n|`
    // overflows `f32` the result is 0, not the tiny exact power. An oracle mistake: it now
    // follows the documented algorithm.
    fn p3(x0: [u64; d0, d1], x1: [i64; d0, d1], x2: [u16; d0], x3: [i32; d0]) -> [bf16; d0, d1] {
        let v8 = (x2 as bf16).powi(x3);
        let v9 = v8.exp();
        (if ((x1 + x1) == 5) { v9 } else { gelu_tanh(v8) })
    }
    // `acosh(-44416.0)`: libm's f64 `acosh` (which the oracle used) returns -3.72 for
    // arguments below -1 instead of NaN; the CPU backend already tests the sign (fuse-
    // runtime/src/ops.rs). An oracle mistake.
    fn p7(x0: [bf16; d0, d1, d2], x1: [bool; d1, d2], x2: [i16; d0, d1, d2], x3: [f16; d0, d1, d2], x4: [u32; d1, d2], x5: [i64; d0, d1, d2], x6: [f64; d0]) -> ([f16; d0, d1, d2], [f16; d0, d1, d2], [i64; d0, d1, d2]) {
        let v8 = acosh(x3);
        let v11 = (x3 % 1.5);
        let v19 = ((x5 + x5) % (v11 as i64));
        let v23 = (if (x4 < (x0 as u32)) { v19 } else { (x6 as i64).signum() });
        (((if x1 { x2 } else { 0 }).abs() as f16), ((-v8) / v11), v23)
    }
    // `cos((x5 as f16))` where the cast rounds a `u16` by up to 16: the oracle's error at
    // the corners of the interval missed the extrema inside it; sin and cos are now bounded
    // by their Lipschitz constant. An oracle mistake.
    fn p264(x0: [u8; d0, d1], x1: [bf16; d1], x2: [u16; d1], x3: [u16; d0, d1], s4: f16, x5: [u16; d0, d1]) -> ([u16; d0, d1], [f16; d0, d1]) {
        let v3 = x1.powi(2);
        ((((v3 as u16) % x2) - x3), ((s4 - 4.0) - s4).atan2(cos((x5 as f16))))
    }
    // `sigmoid(x)` for `x` near -97: `exp(-x)` overflows `f32`, so the documented `1 / (1 +
    // exp(-x))` is 0 where the exact value is 4.9e-43. An oracle mistake: it now follows the
    // formula.
    fn p80(x0: [f32; d0], x1: [f32; d0], x2: [f32; d0], x3: [bf16; d0]) -> ([f32; d0], [bf16; d0]) {
        let v8 = sigmoid((if (x0 >= 1.0) { (x0 / x1) } else { (x2 + x1) }));
        (v8, (acos(x3).powi(1) % 1.5))
    }
    // `x6.powi(x7)` with `|x7|` in the hundreds, written through `&mut` (input seed 3): by
    // repeated squaring each square doubles the relative error before it, so `x^n` is within
    // about `|n|` ulps, not the `2 log2 |n| + 2` the oracle allowed (200 ulps off, 55 allowed).
    // An oracle mistake.
    fn p263(x0: [f32; d0, d1, d2], x1: [f16; d1], x2: [f16; d0, d1], x3: [bf16; d1, d2], x4: [u32; d2], w5: &mut [f32; d0, d1 * 3, d3], x6: [f32; d0, d1, d2], x7: [i32; d0], s8: u64) -> [f16; d0, d1, d2] {
        let v13 = x6.powi(x7);
        let v16 = dropout(v13, 0.25, s8);
        w5[.., (0..).step_by(3), (x4 as i64)] = (v16 - 3.0);
        ((-erf(x1)).max(x2) - (x3 as f16))
    }
}

pub fn run_p3(dev: &Device, a: &Args) -> Result<Vec<Out>, Error> {
    let x0 = a.tensor::<u64>(dev, 0)?;
    let x1 = a.tensor::<i64>(dev, 1)?;
    let x2 = a.tensor::<u16>(dev, 2)?;
    let x3 = a.tensor::<i32>(dev, 3)?;
    let r = p3(dev, &x0, &x1, &x2, &x3)?;
    Ok(vec![Out::of(&r)?])
}

pub fn run_p7(dev: &Device, a: &Args) -> Result<Vec<Out>, Error> {
    let x0 = a.tensor::<bf16>(dev, 0)?;
    let x1 = a.tensor::<bool>(dev, 1)?;
    let x2 = a.tensor::<i16>(dev, 2)?;
    let x3 = a.tensor::<f16>(dev, 3)?;
    let x4 = a.tensor::<u32>(dev, 4)?;
    let x5 = a.tensor::<i64>(dev, 5)?;
    let x6 = a.tensor::<f64>(dev, 6)?;
    let r = p7(dev, &x0, &x1, &x2, &x3, &x4, &x5, &x6)?;
    Ok(vec![Out::of(&r.0)?, Out::of(&r.1)?, Out::of(&r.2)?])
}

pub fn run_p264(dev: &Device, a: &Args) -> Result<Vec<Out>, Error> {
    let x0 = a.tensor::<u8>(dev, 0)?;
    let x1 = a.tensor::<bf16>(dev, 1)?;
    let x2 = a.tensor::<u16>(dev, 2)?;
    let x3 = a.tensor::<u16>(dev, 3)?;
    let x5 = a.tensor::<u16>(dev, 5)?;
    let r = p264(dev, &x0, &x1, &x2, &x3, a.scalar::<f16>(4), &x5)?;
    Ok(vec![Out::of(&r.0)?, Out::of(&r.1)?])
}

pub fn run_p80(dev: &Device, a: &Args) -> Result<Vec<Out>, Error> {
    let x0 = a.tensor::<f32>(dev, 0)?;
    let x1 = a.tensor::<f32>(dev, 1)?;
    let x2 = a.tensor::<f32>(dev, 2)?;
    let x3 = a.tensor::<bf16>(dev, 3)?;
    let r = p80(dev, &x0, &x1, &x2, &x3)?;
    Ok(vec![Out::of(&r.0)?, Out::of(&r.1)?])
}

pub fn run_p263(dev: &Device, a: &Args) -> Result<Vec<Out>, Error> {
    let x0 = a.tensor::<f32>(dev, 0)?;
    let x1 = a.tensor::<f16>(dev, 1)?;
    let x2 = a.tensor::<f16>(dev, 2)?;
    let x3 = a.tensor::<bf16>(dev, 3)?;
    let x4 = a.tensor::<u32>(dev, 4)?;
    let mut w5 = a.tensor::<f32>(dev, 5)?;
    let x6 = a.tensor::<f32>(dev, 6)?;
    let x7 = a.tensor::<i32>(dev, 7)?;
    let r = p263(
        dev,
        &x0,
        &x1,
        &x2,
        &x3,
        &x4,
        &mut w5,
        &x6,
        &x7,
        a.scalar::<u64>(8),
    )?;
    Ok(vec![Out::of(&r)?, Out::of(&w5)?])
}

/// A case: the program, the instance that failed (with `FUSE_RANDOM_INPUT_SEED=input_seed`) and
/// its dim sizes (which the instance's seed gives again as long as the harness draws inputs the
/// same way).
struct Case {
    program: Program,
    input_seed: u64,
    instance: usize,
    sizes: &'static [usize],
}

const CASES: &[Case] = &[
    Case {
        program: Program {
            name: "p3",
            seed: 0x844b6d2c7ddf743f,
            text: "fn p3(x0: [u64; d0, d1], x1: [i64; d0, d1], x2: [u16; d0], x3: [i32; d0]) -> [bf16; d0, d1] {\n    let v8 = (x2 as bf16).powi(x3);\n    let v9 = v8.exp();\n    (if ((x1 + x1) == 5) { v9 } else { gelu_tanh(v8) })\n}\n",
            desc: "dims 2\nparam u64 tensor 0 1\nparam i64 tensor 0 1\nparam u16 tensor 0\nparam i32 tensor 0\nnode 0 u64 3 in 0\nnode 1 i64 3 in 1\nnode 2 i64 3 add 1 1\nnode 3 i64 0 lit 5\nnode 4 bool 3 eq 2 3\nnode 5 u16 1 in 2\nnode 6 bf16 1 cast 5\nnode 7 i32 1 in 3\nnode 8 bf16 1 fn powi 6 7\nnode 9 bf16 1 fn exp 8\nnode 10 bf16 1 fn gelu_tanh 8\nnode 11 bf16 3 sel 4 9 10\nout 11 3\n",
            run: run_p3,
            derive: None,
        },
        input_seed: 0,
        instance: 4,
        sizes: &[32, 13],
    },
    Case {
        program: Program {
            name: "p7",
            seed: 0xd6954127b096493,
            text: "fn p7(x0: [bf16; d0, d1, d2], x1: [bool; d1, d2], x2: [i16; d0, d1, d2], x3: [f16; d0, d1, d2], x4: [u32; d1, d2], x5: [i64; d0, d1, d2], x6: [f64; d0]) -> ([f16; d0, d1, d2], [f16; d0, d1, d2], [i64; d0, d1, d2]) {\n    let v8 = acosh(x3);\n    let v11 = (x3 % 1.5);\n    let v19 = ((x5 + x5) % (v11 as i64));\n    let v23 = (if (x4 < (x0 as u32)) { v19 } else { (x6 as i64).signum() });\n    (((if x1 { x2 } else { 0 }).abs() as f16), ((-v8) / v11), v23)\n}\n",
            desc: "dims 3\nparam bf16 tensor 0 1 2\nparam bool tensor 1 2\nparam i16 tensor 0 1 2\nparam f16 tensor 0 1 2\nparam u32 tensor 1 2\nparam i64 tensor 0 1 2\nparam f64 tensor 0\nnode 0 bf16 7 in 0\nnode 1 bool 6 in 1\nnode 2 i16 7 in 2\nnode 3 i16 0 lit 0\nnode 4 i16 7 sel 1 2 3\nnode 5 i16 7 fn abs 4\nnode 6 f16 7 cast 5\nnode 7 f16 7 in 3\nnode 8 f16 7 fn acosh 7\nnode 9 f16 7 neg 8\nnode 10 f16 0 lit 1.5\nnode 11 f16 7 rem 7 10\nnode 12 f16 7 div 9 11\nnode 13 u32 6 in 4\nnode 14 u32 7 cast 0\nnode 15 bool 7 lt 13 14\nnode 16 i64 7 in 5\nnode 17 i64 7 add 16 16\nnode 18 i64 7 cast 11\nnode 19 i64 7 rem 17 18\nnode 20 f64 1 in 6\nnode 21 i64 1 cast 20\nnode 22 i64 1 fn signum 21\nnode 23 i64 7 sel 15 19 22\nout 6 7\nout 12 7\nout 23 7\n",
            run: run_p7,
            derive: None,
        },
        input_seed: 0,
        instance: 0,
        sizes: &[31, 61, 3],
    },
    Case {
        program: Program {
            name: "p264",
            seed: 0x77d8874b44cff5a8,
            text: "fn p264(x0: [u8; d0, d1], x1: [bf16; d1], x2: [u16; d1], x3: [u16; d0, d1], s4: f16, x5: [u16; d0, d1]) -> ([u16; d0, d1], [f16; d0, d1]) {\n    let v3 = x1.powi(2);\n    ((((v3 as u16) % x2) - x3), ((s4 - 4.0) - s4).atan2(cos((x5 as f16))))\n}\n",
            desc: "dims 2\nparam u8 tensor 0 1\nparam bf16 tensor 1\nparam u16 tensor 1\nparam u16 tensor 0 1\nparam f16 scalar\nparam u16 tensor 0 1\nnode 0 u8 3 in 0\nnode 1 bf16 2 in 1\nnode 2 i32 0 lit 2\nnode 3 bf16 2 fn powi 1 2\nnode 4 u16 2 cast 3\nnode 5 u16 2 in 2\nnode 6 u16 2 rem 4 5\nnode 7 u16 3 in 3\nnode 8 u16 3 sub 6 7\nnode 9 f16 0 in 4\nnode 10 f16 0 lit 4.0\nnode 11 f16 0 sub 9 10\nnode 12 f16 0 sub 11 9\nnode 13 u16 3 in 5\nnode 14 f16 3 cast 13\nnode 15 f16 3 fn cos 14\nnode 16 f16 3 fn atan2 12 15\nout 8 3\nout 16 3\n",
            run: run_p264,
            derive: None,
        },
        input_seed: 0,
        instance: 0,
        sizes: &[31, 255],
    },
    Case {
        program: Program {
            name: "p80",
            seed: 0x2fbb09f7c746c690,
            text: "fn p80(x0: [f32; d0], x1: [f32; d0], x2: [f32; d0], x3: [bf16; d0]) -> ([f32; d0], [bf16; d0]) {\n    let v8 = sigmoid((if (x0 >= 1.0) { (x0 / x1) } else { (x2 + x1) }));\n    (v8, (acos(x3).powi(1) % 1.5))\n}\n",
            desc: "dims 1\nparam f32 tensor 0\nparam f32 tensor 0\nparam f32 tensor 0\nparam bf16 tensor 0\nnode 0 f32 1 in 0\nnode 1 f32 0 lit 1.0\nnode 2 bool 1 ge 0 1\nnode 3 f32 1 in 1\nnode 4 f32 1 div 0 3\nnode 5 f32 1 in 2\nnode 6 f32 1 add 5 3\nnode 7 f32 1 sel 2 4 6\nnode 8 f32 1 fn sigmoid 7\nnode 9 bf16 1 in 3\nnode 10 bf16 1 fn acos 9\nnode 11 i32 0 lit 1\nnode 12 bf16 1 fn powi 10 11\nnode 13 bf16 0 lit 1.5\nnode 14 bf16 1 rem 12 13\nout 8 1\nout 14 1\n",
            run: run_p80,
            derive: None,
        },
        input_seed: 0,
        instance: 9,
        sizes: &[2048],
    },
    Case {
        program: Program {
            name: "p263",
            seed: 0xd4130d91c5857993,
            text: "fn p263(x0: [f32; d0, d1, d2], x1: [f16; d1], x2: [f16; d0, d1], x3: [bf16; d1, d2], x4: [u32; d2], w5: &mut [f32; d0, d1 * 3, d3], x6: [f32; d0, d1, d2], x7: [i32; d0], s8: u64) -> [f16; d0, d1, d2] {\n    let v13 = x6.powi(x7);\n    let v16 = dropout(v13, 0.25, s8);\n    w5[.., (0..).step_by(3), (x4 as i64)] = (v16 - 3.0);\n    ((-erf(x1)).max(x2) - (x3 as f16))\n}\n",
            desc: "dims 3\nextra slots 4\nparam f32 tensor 0 1 2\nparam f16 tensor 1\nparam f16 tensor 0 1\nparam bf16 tensor 1 2\nparam u32 tensor 2 index 3 distinct\nparam f32 buffer 0 g:1:3 3\nparam f32 tensor 0 1 2\nparam i32 tensor 0\nparam u64 scalar\nnode 0 f32 7 in 0\nnode 1 f16 2 in 1\nnode 2 f16 2 fn erf 1\nnode 3 f16 2 neg 2\nnode 4 f16 3 in 2\nnode 5 f16 3 fn max 3 4\nnode 6 bf16 6 in 3\nnode 7 f16 6 cast 6\nnode 8 f16 7 sub 5 7\nnode 9 u32 4 in 4\nnode 10 i64 4 cast 9\nnode 11 f32 7 in 6\nnode 12 i32 1 in 7\nnode 13 f32 7 fn powi 11 12\nnode 14 f32 0 lit 0.25\nnode 15 u64 0 in 8\nnode 16 f32 7 dropout 0 13 14 15\nnode 17 f32 0 lit 3.0\nnode 18 f32 7 sub 16 17\nout 8 7\nwrite 5 18 all pick:0 at:10\n",
            run: run_p263,
            derive: None,
        },
        input_seed: 3,
        instance: 6,
        sizes: &[32, 7, 17, 34],
    },
];

#[test]
fn every_kept_mismatch_matches_the_oracle_now() {
    for case in CASES {
        let cfg = Config {
            shapes: 1,
            budget: 1 << 15,
            base_seed: case.input_seed,
        };
        let p = &case.program;
        let desc = Desc::parse(p.desc);
        let inst = instance(p, &desc, case.instance, &cfg);
        assert_eq!(
            inst.sizes, case.sizes,
            "{}: the harness draws other inputs now",
            p.name
        );
        if let Err(e) = check_cpu(p, &desc, case.instance, &cfg) {
            panic!("{e}");
        }
    }
}
