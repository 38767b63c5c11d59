//! vLLM's kernels against references that follow their CUDA sources.

// `x.min(hi).max(lo)` is `fmaxf(lo, fminf(x, hi))`, which maps NaN to a bound, as vLLM's
// conversions do; `clamp` would keep the NaN.
#![allow(clippy::manual_clamp)]

use super::kernels::vllm as k;
use super::support::*;
use fuse_runtime::{bf16, Device, F8E4M3};

/// `(tokens, d)`: one element, primes, sizes past a vector of 8, and a row past 128.
const SHAPES: [(usize, usize); 4] = [(1, 1), (3, 7), (4, 33), (2, 130)];

/// One bf16 ulp, relative, for results rounded once more than the reference may be.
const BF16_ULP: f64 = 1.0 / 128.0;

type Gated = fn(
    &Device,
    &fuse_runtime::Buffer<bf16>,
) -> Result<fuse_runtime::Buffer<bf16>, fuse_runtime::Error>;

/// A gated activation of `[t, 2 * d]` against `want(gate, up)`.
/// `f` against `want` over the gate and up halves of random rows, within a bf16 ulp and `abs`.
fn gated(
    dev: &Device,
    rng: &mut Rng,
    name: &str,
    f: Gated,
    want: fn(f32, f32) -> f32,
    (rel, abs): (f64, f64),
) -> Vec<Out> {
    let mut outs = vec![];
    for (t, d) in SHAPES {
        let x = to_bf16(&rng.f32s_special(t * 2 * d, -6.0, 6.0, &SPECIALS));
        let got = read(&f(dev, &put(dev, &x, &[t, 2 * d])).unwrap());
        let want = (0..t * d)
            .map(|i| {
                let (r, c) = (i / d, i % d);
                want(x[r * 2 * d + c].to_f32(), x[r * 2 * d + d + c].to_f32()) as f64
            })
            .collect();
        outs.push(out(format!("{name} [{t}, {d}]"), got, want, rel, abs));
    }
    outs
}

/// A gated product rounded once: one bf16 ulp.
const GATED: (f64, f64) = (BF16_ULP, 0.0);

/// A gated product of an activation rounded to bf16 first (`silu(g) as bf16`): the GPU's and the
/// reference's f32 activations, a few f32 ulps apart, may round to neighbouring bf16 values, a
/// whole ulp of the activation (up to 2^-7 relative), and the products then round apart: two
/// bf16 ulps. (A GPU run: `gelu_and_mul` at `[4, 33]`, 1.1e-2 relative.)
const ROUNDED_TWICE: (f64, f64) = (2.0 * BF16_ULP, 0.0);

/// For `x < 0` GELU's `1 + erf` (or `1 + tanh`) cancels, so two f32 `erff`s a few ulps apart
/// differ by `0.5 |x|` times a few epsilons, not relatively (doc/language.md): at `|x|, |u| <= 6`,
/// `0.5 * 6 * 4 eps * 6`; besides, the activation is rounded twice (`ROUNDED_TWICE`).
const GELU: (f64, f64) = (ROUNDED_TWICE.0, 1e-5);

pub fn silu_and_mul(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    gated(
        dev,
        rng,
        "silu_and_mul",
        k::silu_and_mul,
        |g, u| rb(rb(silu(g)) * u),
        ROUNDED_TWICE,
    )
}

pub fn mul_and_silu(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    gated(
        dev,
        rng,
        "mul_and_silu",
        k::mul_and_silu,
        |g, u| rb(g * rb(silu(u))),
        ROUNDED_TWICE,
    )
}

pub fn gelu_and_mul(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    gated(
        dev,
        rng,
        "gelu_and_mul",
        k::gelu_and_mul,
        |g, u| rb(rb(gelu(g)) * u),
        GELU,
    )
}

pub fn gelu_tanh_and_mul(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    gated(
        dev,
        rng,
        "gelu_tanh_and_mul",
        k::gelu_tanh_and_mul,
        |g, u| rb(rb(gelu_tanh(g)) * u),
        GELU,
    )
}

pub fn fatrelu_and_mul(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let f = |dev: &Device, x: &fuse_runtime::Buffer<bf16>| k::fatrelu_and_mul(dev, x, 0.5);
    gated(
        dev,
        rng,
        "fatrelu_and_mul",
        f,
        |g, u| rb(if g > 0.5 { g } else { 0.0 } * u),
        GATED,
    )
}

pub fn silu_and_mul_clamp(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let f = |dev: &Device, x: &fuse_runtime::Buffer<bf16>| {
        k::silu_and_mul_clamp(dev, x, 3.0, 1.702, 1.0)
    };
    gated(
        dev,
        rng,
        "silu_and_mul_clamp",
        f,
        |g, u| {
            let (limit, alpha, beta) = (3.0f32, 1.702f32, 1.0f32);
            let g = rb(g.min(limit));
            let u = rb(u.min(limit).max(-limit));
            rb(rb(g / (1.0 + (-g * alpha).exp())) * (u + beta))
        },
        ROUNDED_TWICE,
    )
}

pub fn swigluoai_and_mul(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (alpha, limit) = (1.702f32, 7.0f32);
    let mut outs = vec![];
    for (t, d) in SHAPES {
        let x = to_bf16(&rng.f32s_special(t * 2 * d, -9.0, 9.0, &SPECIALS));
        let got =
            read(&k::swigluoai_and_mul(dev, &put(dev, &x, &[t, 2 * d]), alpha, limit).unwrap());
        let want = (0..t * d)
            .map(|i| {
                let g = x[2 * i].to_f32().min(limit);
                let u = x[2 * i + 1].to_f32().min(limit).max(-limit);
                rb((u + 1.0) * g / (1.0 + (-g * alpha).exp())) as f64
            })
            .collect();
        outs.push(out(
            format!("swigluoai_and_mul [{t}, {d}]"),
            got,
            want,
            BF16_ULP,
            0.0,
        ));
    }
    outs
}

pub fn batched_silu_and_mul(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (b, m, d) = (3, 5, 9);
    let x = rng.bf16s(b * m * 2 * d, -5.0, 5.0);
    let valid: Vec<i32> = (0..b).map(|_| rng.below(m as u64 + 1) as i32).collect();
    let got = read(
        &k::batched_silu_and_mul(dev, &put(dev, &x, &[b, m, 2 * d]), &put(dev, &valid, &[b]))
            .unwrap(),
    );
    let want = (0..b * m * d)
        .map(|i| {
            let (row, c) = (i / d, i % d);
            if (row % m) as i32 >= valid[row / m] {
                return 0.0;
            }
            let (g, u) = (x[row * 2 * d + c].to_f32(), x[row * 2 * d + d + c].to_f32());
            rb(rb(silu(g)) * u) as f64
        })
        .collect();
    vec![out("batched_silu_and_mul", got, want, BF16_ULP, 0.0)]
}

pub fn gelu_new(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (t, h) = (5, 37);
    let x = rng.bf16s(t * h, -5.0, 5.0);
    let got = read(&k::gelu_new(dev, &put(dev, &x, &[t, h])).unwrap());
    let want = x
        .iter()
        .map(|x| {
            let x = x.to_f32();
            let x3 = rb(rb(x * x) * x);
            let inner = rb(x + rb(0.044715 * x3));
            let t = rb(rb(0.797_884_6 * inner).tanh());
            rb(rb(0.5 * x) * rb(1.0 + t)) as f64
        })
        .collect();
    vec![out("gelu_new", got, want, BF16_ULP, 0.0)]
}

pub fn gelu_fast(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (t, h) = (3, 41);
    let x = rng.f32s(t * h, -6.0, 6.0);
    let got = read(&k::gelu_fast(dev, &put(dev, &x, &[t, h])).unwrap());
    let want = x
        .iter()
        .map(|&x| {
            let t = (x * 0.797_884_6 * (1.0 + 0.044715 * x * x)).tanh();
            (0.5 * x * (1.0 + t)) as f64
        })
        .collect();
    vec![out("gelu_fast", got, want, 1e-5, 1e-6)]
}

pub fn gelu_quick(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (t, h) = (3, 41);
    let x = rng.f32s(t * h, -6.0, 6.0);
    let got = read(&k::gelu_quick(dev, &put(dev, &x, &[t, h])).unwrap());
    let want = x
        .iter()
        .map(|&x| (x / (1.0 + (-1.702 * x).exp())) as f64)
        .collect();
    vec![out("gelu_quick", got, want, 1e-5, 1e-6)]
}

/// `(tokens, hidden)` for the norms: one element, a prime, a long row.
const NORM_SHAPES: [(usize, usize); 3] = [(1, 1), (5, 37), (3, 1031)];

pub fn rms_norm(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in NORM_SHAPES {
        let (x, w) = (rng.bf16s(t * h, -3.0, 3.0), rng.bf16s(h, 0.5, 1.5));
        let got =
            read(&k::rms_norm(dev, &put(dev, &x, &[t, h]), &put(dev, &w, &[h]), 1e-6).unwrap());
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let rstd = rstd_rows(&xf, h, 1e-6);
        let want = (0..t * h)
            .map(|i| rb(rb(xf[i] * rstd[i / h]) * w[i % h].to_f32()) as f64)
            .collect();
        outs.push(out(
            format!("rms_norm [{t}, {h}]"),
            got,
            want,
            2.0 * BF16_ULP,
            0.0,
        ));
    }
    outs
}

pub fn fused_add_rms_norm(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in NORM_SHAPES {
        let (x, r, w) = (
            rng.bf16s(t * h, -3.0, 3.0),
            rng.bf16s(t * h, -3.0, 3.0),
            rng.bf16s(h, 0.5, 1.5),
        );
        let (y, res) = k::fused_add_rms_norm(
            dev,
            &put(dev, &x, &[t, h]),
            &put(dev, &r, &[t, h]),
            &put(dev, &w, &[h]),
            1e-6,
        )
        .unwrap();
        let z: Vec<f32> = (0..t * h)
            .map(|i| rb(x[i].to_f32() + r[i].to_f32()))
            .collect();
        let rstd = rstd_rows(&z, h, 1e-6);
        let want = (0..t * h)
            .map(|i| rb(rb(z[i] * rstd[i / h]) * w[i % h].to_f32()) as f64)
            .collect();
        outs.push(out(
            format!("fused_add_rms_norm out [{t}, {h}]"),
            read(&y),
            want,
            2.0 * BF16_ULP,
            0.0,
        ));
        outs.push(out(
            format!("fused_add_rms_norm residual [{t}, {h}]"),
            read(&res),
            f64s(&z),
            0.0,
            0.0,
        ));
    }
    outs
}

pub fn poly_norm(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in NORM_SHAPES {
        let (x, w, b) = (
            rng.f32s(t * h, -2.0, 2.0),
            rng.f32s(3, -1.0, 1.0),
            rng.f32s(1, -1.0, 1.0),
        );
        let got = read(
            &k::poly_norm(
                dev,
                &put(dev, &x, &[t, h]),
                &put(dev, &w, &[3]),
                &put(dev, &b, &[1]),
                1e-6,
            )
            .unwrap(),
        );
        let pow = |p: i32| x.iter().map(|&v| v.powi(p)).collect::<Vec<f32>>();
        let (x2, x3) = (pow(2), pow(3));
        let (r1, r2, r3) = (
            rstd_rows(&x, h, 1e-6),
            rstd_rows(&x2, h, 1e-6),
            rstd_rows(&x3, h, 1e-6),
        );
        let want = (0..t * h)
            .map(|i| {
                let row = i / h;
                (x3[i] * r3[row] * w[0] + x2[i] * r2[row] * w[1] + x[i] * r1[row] * w[2] + b[0])
                    as f64
            })
            .collect();
        outs.push(out(format!("poly_norm [{t}, {h}]"), got, want, 1e-4, 1e-5));
    }
    outs
}

/// `cvt.rni.sat.s8.f32`: halves to even, saturated, NaN to 0.
fn rni_s8(x: f32) -> f64 {
    x.round_ties_even().clamp(-128.0, 127.0) as i8 as f64
}

/// Inputs for the quantizations: specials, and values at halves of the scale.
fn quant_input(rng: &mut Rng, n: usize, scale: f32) -> Vec<bf16> {
    let mut v = rng.f32s_special(n, -200.0 * scale, 200.0 * scale, &SPECIALS);
    for x in v.iter_mut().step_by(5) {
        *x = (rng.below(400) as f32 - 200.0 + 0.5) * scale;
    }
    to_bf16(&v)
}

pub fn static_scaled_int8_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in SHAPES {
        let scale = 0.5f32;
        let x = quant_input(rng, t * h, scale);
        let got = read(
            &k::static_scaled_int8_quant(dev, &put(dev, &x, &[t, h]), &scalar(dev, scale)).unwrap(),
        );
        let want = x.iter().map(|v| rni_s8(v.to_f32() / scale)).collect();
        outs.push(out(
            format!("static_scaled_int8_quant [{t}, {h}]"),
            got,
            want,
            0.0,
            0.0,
        ));
    }
    outs
}

pub fn static_scaled_int8_azp_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in SHAPES {
        let (scale, azp) = (0.25f32, rng.below(60) as i32 - 30);
        let x = quant_input(rng, t * h, scale);
        let got = read(
            &k::static_scaled_int8_azp_quant(
                dev,
                &put(dev, &x, &[t, h]),
                &scalar(dev, scale),
                &put(dev, &[azp], &[]),
            )
            .unwrap(),
        );
        let want = x
            .iter()
            .map(|v| {
                let q = (v.to_f32() * (1.0 / scale)).round_ties_even() as i32;
                q.wrapping_add(azp).clamp(-128, 127) as f64
            })
            .collect();
        outs.push(out(
            format!("static_scaled_int8_azp_quant [{t}, {h}]"),
            got,
            want,
            0.0,
            0.0,
        ));
    }
    outs
}

pub fn dynamic_scaled_int8_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in SHAPES {
        let mut xf = rng.f32s(t * h, -4.0, 4.0);
        xf[0] = -0.0; // a row of one -0.0 has absmax 0: the codes are 0
        let x = to_bf16(&xf);
        let (q, s) = k::dynamic_scaled_int8_quant(dev, &put(dev, &x, &[t, h])).unwrap();
        let absmax: Vec<f32> = x
            .chunks(h)
            .map(|r| r.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs())))
            .collect();
        let want_q = (0..t * h)
            .map(|i| {
                let a = absmax[i / h];
                rni_s8(x[i].to_f32() * if a == 0.0 { 0.0 } else { 127.0 / a })
            })
            .collect();
        let want_s = absmax.iter().map(|a| (a / 127.0) as f64).collect();
        outs.push(out(
            format!("dynamic_scaled_int8_quant q [{t}, {h}]"),
            read(&q),
            want_q,
            0.0,
            0.0,
        ));
        outs.push(out(
            format!("dynamic_scaled_int8_quant scale [{t}, {h}]"),
            read(&s),
            want_s,
            0.0,
            0.0,
        ));
    }
    outs
}

pub fn dynamic_scaled_int8_azp_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    // Rows of at least two distinct values: a constant row has scale 0 and an undefined
    // zero point in vLLM (a float-to-int cast of an infinity).
    for (t, h) in [(1, 2), (3, 7), (4, 33), (2, 130)] {
        let mut xf = rng.f32s(t * h, -3.0, 5.0);
        for row in xf.chunks_mut(h) {
            row[0] = -3.5;
            row[h - 1] = 5.5;
        }
        let x = to_bf16(&xf);
        let (q, s, z) = k::dynamic_scaled_int8_azp_quant(dev, &put(dev, &x, &[t, h])).unwrap();
        let (mut wq, mut ws, mut wz) = (vec![], vec![], vec![]);
        for row in x.chunks(h) {
            let lo = row.iter().fold(f32::MAX, |m, v| m.min(v.to_f32()));
            let hi = row.iter().fold(f32::MIN, |m, v| m.max(v.to_f32()));
            let s = (hi - lo) / 255.0;
            let azp = (-128.0 - lo / s).round_ties_even() as i32;
            ws.push(s as f64);
            wz.push(azp as f64);
            let inv_s = 1.0 / s;
            wq.extend(row.iter().map(|v| {
                ((v.to_f32() * inv_s).round_ties_even() as i32)
                    .wrapping_add(azp)
                    .clamp(-128, 127) as f64
            }));
        }
        outs.push(out(
            format!("dynamic_scaled_int8_azp_quant q [{t}, {h}]"),
            read(&q),
            wq,
            0.0,
            0.0,
        ));
        outs.push(out(
            format!("dynamic_scaled_int8_azp_quant scale [{t}, {h}]"),
            read(&s),
            ws,
            0.0,
            0.0,
        ));
        outs.push(out(
            format!("dynamic_scaled_int8_azp_quant azp [{t}, {h}]"),
            read(&z),
            wz,
            0.0,
            0.0,
        ));
    }
    outs
}

/// `(float)((scalar_t)(x * rms) * w)`: the bf16 normed value of the fused quantizations.
fn normed(x: f32, rms: f32, w: bf16) -> f32 {
    rb(rb(x * rms) * w.to_f32())
}

pub fn rms_norm_dynamic_per_token_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in NORM_SHAPES {
        let (x, r, w) = (
            rng.bf16s(t * h, -3.0, 3.0),
            rng.bf16s(t * h, -3.0, 3.0),
            rng.bf16s(h, 0.5, 1.5),
        );
        let scale_ub = 2.5f32; // below some rows' absmax: those scales are capped
        let (q, s, res) = k::rms_norm_dynamic_per_token_quant_int8(
            dev,
            &put(dev, &x, &[t, h]),
            &put(dev, &r, &[t, h]),
            &put(dev, &w, &[h]),
            1e-6,
            scale_ub,
        )
        .unwrap();
        let xf: Vec<f32> = (0..t * h).map(|i| x[i].to_f32() + r[i].to_f32()).collect();
        let rms = rstd_rows(&xf, h, 1e-6);
        let y: Vec<f32> = (0..t * h)
            .map(|i| normed(xf[i], rms[i / h], w[i % h]))
            .collect();
        let scales: Vec<f32> = y
            .chunks(h)
            .map(|row| {
                (row.iter().fold(0.0f32, |m, v| m.max(v.abs())).min(scale_ub) / 127.0)
                    .max(f32::EPSILON)
            })
            .collect();
        let wq = (0..t * h).map(|i| rni_s8(y[i] / scales[i / h])).collect();
        outs.push(out(
            format!("rms_norm_dynamic_per_token_quant int8 q [{t}, {h}]"),
            read(&q),
            wq,
            0.0,
            1.0,
        ));
        outs.push(out(
            format!("rms_norm_dynamic_per_token_quant int8 scale [{t}, {h}]"),
            read(&s),
            f64s(&scales),
            2.0 * BF16_ULP,
            0.0,
        ));
        let wres = xf.iter().map(|&v| rb(v) as f64).collect();
        outs.push(out(
            format!("rms_norm_dynamic_per_token_quant residual [{t}, {h}]"),
            read(&res),
            wres,
            0.0,
            0.0,
        ));

        let (q8, s8) = k::rms_norm_dynamic_per_token_quant_fp8(
            dev,
            &put(dev, &x, &[t, h]),
            &put(dev, &w, &[h]),
            1e-6,
            f32::INFINITY,
        )
        .unwrap();
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let rms = rstd_rows(&xf, h, 1e-6);
        let y: Vec<f32> = (0..t * h)
            .map(|i| normed(xf[i], rms[i / h], w[i % h]))
            .collect();
        let scales: Vec<f32> = y
            .chunks(h)
            .map(|row| {
                (row.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 448.0).max(1.0 / (448.0 * 512.0))
            })
            .collect();
        let wq = (0..t * h)
            .map(|i| e4m3((y[i] / scales[i / h]).min(448.0).max(-448.0)) as f64)
            .collect();
        outs.push(out(
            format!("rms_norm_dynamic_per_token_quant fp8 q [{t}, {h}]"),
            read_e4m3(&q8),
            wq,
            0.13,
            1.0 / 512.0,
        ));
        outs.push(out(
            format!("rms_norm_dynamic_per_token_quant fp8 scale [{t}, {h}]"),
            read(&s8),
            f64s(&scales),
            2.0 * BF16_ULP,
            0.0,
        ));
    }
    outs
}

/// `scaled_fp8_conversion`: `fminf` then `fmaxf` against ±448 (NaN becomes 448), RNE.
fn fp8_conv(x: f32) -> f64 {
    e4m3(x.min(448.0).max(-448.0)) as f64
}

pub fn rms_norm_static_fp8_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in NORM_SHAPES {
        let (x, w, scale) = (rng.bf16s(t * h, -3.0, 3.0), rng.bf16s(h, 0.5, 1.5), 0.01f32);
        let got = read_e4m3(
            &k::rms_norm_static_fp8_quant(
                dev,
                &put(dev, &x, &[t, h]),
                &put(dev, &w, &[h]),
                &scalar(dev, scale),
                1e-6,
            )
            .unwrap(),
        );
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let rms = rstd_rows(&xf, h, 1e-6);
        let want = (0..t * h)
            .map(|i| fp8_conv(normed(xf[i], rms[i / h], w[i % h]) * (1.0 / scale)))
            .collect();
        outs.push(out(
            format!("rms_norm_static_fp8_quant [{t}, {h}]"),
            got,
            want,
            0.13,
            1.0 / 512.0,
        ));
    }
    outs
}

pub fn fused_add_rms_norm_static_fp8_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in NORM_SHAPES {
        let (x, r, w, scale) = (
            rng.bf16s(t * h, -3.0, 3.0),
            rng.bf16s(t * h, -3.0, 3.0),
            rng.bf16s(h, 0.5, 1.5),
            0.02f32,
        );
        let (q, res) = k::fused_add_rms_norm_static_fp8_quant(
            dev,
            &put(dev, &x, &[t, h]),
            &put(dev, &r, &[t, h]),
            &put(dev, &w, &[h]),
            &scalar(dev, scale),
            1e-6,
        )
        .unwrap();
        let z: Vec<f32> = (0..t * h)
            .map(|i| rb(x[i].to_f32() + r[i].to_f32()))
            .collect();
        let rms = rstd_rows(&z, h, 1e-6);
        let want = (0..t * h)
            .map(|i| fp8_conv(normed(z[i], rms[i / h], w[i % h]) * (1.0 / scale)))
            .collect();
        outs.push(out(
            format!("fused_add_rms_norm_static_fp8_quant [{t}, {h}]"),
            read_e4m3(&q),
            want,
            0.13,
            1.0 / 512.0,
        ));
        outs.push(out(
            format!("fused_add_rms_norm_static_fp8_quant residual [{t}, {h}]"),
            read(&res),
            f64s(&z),
            0.0,
            0.0,
        ));
    }
    outs
}

pub fn scaled_fp8_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in SHAPES {
        let x = to_bf16(&rng.f32s_special(t * h, -600.0, 600.0, &SPECIALS));
        let xb = put(dev, &x, &[t, h]);
        // Static: the scale's reciprocal, NaN to 448, past 448 saturated.
        let scale = 1.5f32;
        let got = read_e4m3(&k::static_scaled_fp8_quant(dev, &xb, &scalar(dev, scale)).unwrap());
        let want = x
            .iter()
            .map(|v| fp8_conv(v.to_f32() * (1.0 / scale)))
            .collect();
        outs.push(out(
            format!("static_scaled_fp8_quant [{t}, {h}]"),
            got,
            want,
            0.0,
            0.0,
        ));

        // Per token, with `scale_ub` capping the rows that hold an infinity.
        let (q, s) = k::dynamic_per_token_scaled_fp8_quant(dev, &xb, 1000.0).unwrap();
        let scales: Vec<f32> = x
            .chunks(h)
            .map(|r| {
                (r.iter()
                    .fold(0.0f32, |m, v| m.max(v.to_f32().abs()))
                    .min(1000.0)
                    / 448.0)
                    .max(1.0 / (448.0 * 512.0))
            })
            .collect();
        let want = (0..t * h)
            .map(|i| fp8_conv(x[i].to_f32() / scales[i / h]))
            .collect();
        outs.push(out(
            format!("dynamic_per_token_scaled_fp8_quant q [{t}, {h}]"),
            read_e4m3(&q),
            want,
            0.0,
            0.0,
        ));
        outs.push(out(
            format!("dynamic_per_token_scaled_fp8_quant scale [{t}, {h}]"),
            read(&s),
            f64s(&scales),
            0.0,
            0.0,
        ));

        // Per tensor: two launches, the scale staying on the device.
        let finite = rng.bf16s(t * h, -600.0, 600.0);
        let fb = put(dev, &finite, &[t, h]);
        let s = k::fp8_tensor_scale(dev, &fb).unwrap();
        let q = k::static_scaled_fp8_quant(dev, &fb, &s).unwrap();
        let want_s = finite.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs())) / 448.0;
        let want = finite
            .iter()
            .map(|v| fp8_conv(v.to_f32() * (1.0 / want_s)))
            .collect();
        outs.push(out(
            format!("dynamic_scaled_fp8_quant scale [{t}, {h}]"),
            read(&s),
            vec![want_s as f64],
            0.0,
            0.0,
        ));
        outs.push(out(
            format!("dynamic_scaled_fp8_quant q [{t}, {h}]"),
            read_e4m3(&q),
            want,
            0.0,
            0.0,
        ));
    }
    outs
}

pub fn per_token_group_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    let eps = 1e-10f32;
    for (t, g, gs) in [(1, 1, 1), (3, 2, 16), (2, 5, 128)] {
        let x = to_bf16(&rng.f32s_special(t * g * gs, -8.0, 8.0, &[f32::NAN, -0.0, 0.0]));
        let xb = put(dev, &x, &[t, g, gs]);
        let absmax: Vec<f32> = x
            .chunks(gs)
            .map(|r| r.iter().fold(eps, |m, v| m.max(v.to_f32().abs())))
            .collect();
        for ue8m0 in [false, true] {
            let (q, s) = match ue8m0 {
                false => k::per_token_group_quant_int8(dev, &xb, eps, -128.0, 127.0),
                true => k::per_token_group_quant_int8_ue8m0(dev, &xb, eps, -128.0, 127.0),
            }
            .unwrap();
            let ys: Vec<f32> = absmax
                .iter()
                .map(|a| {
                    let ys = a / 127.0;
                    if ue8m0 {
                        ys.abs().max(1e-10).log2().ceil().exp2()
                    } else {
                        ys
                    }
                })
                .collect();
            // A C++ cast: truncated toward zero; NaN became -128 through `fmaxf`.
            let want = (0..x.len())
                .map(|i| (x[i].to_f32() / ys[i / gs]).max(-128.0).min(127.0) as i8 as f64)
                .collect();
            outs.push(out(
                format!("per_token_group_quant int8 ue8m0={ue8m0} [{t}, {g}, {gs}]"),
                read(&q),
                want,
                0.0,
                0.0,
            ));
            outs.push(out(
                format!("per_token_group_quant int8 scale ue8m0={ue8m0} [{t}, {g}, {gs}]"),
                read(&s),
                f64s(&ys),
                0.0,
                0.0,
            ));
        }
        let (q, s) = k::per_token_group_quant_fp8(dev, &xb, eps).unwrap();
        let ys: Vec<f32> = absmax.iter().map(|a| a / 448.0).collect();
        let want = (0..x.len())
            .map(|i| e4m3((x[i].to_f32() / ys[i / gs]).max(-448.0).min(448.0)) as f64)
            .collect();
        outs.push(out(
            format!("per_token_group_quant fp8 [{t}, {g}, {gs}]"),
            read_e4m3(&q),
            want,
            0.0,
            0.0,
        ));
        outs.push(out(
            format!("per_token_group_quant fp8 scale [{t}, {g}, {gs}]"),
            read(&s),
            f64s(&ys),
            0.0,
            0.0,
        ));
    }
    outs
}

pub fn silu_and_mul_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, d) in SHAPES {
        let x = to_bf16(&rng.f32s_special(t * 2 * d, -30.0, 30.0, &SPECIALS));
        let scale = 0.125f32;
        let got = read_e4m3(
            &k::silu_and_mul_quant(dev, &put(dev, &x, &[t, 2 * d]), &scalar(dev, scale)).unwrap(),
        );
        let want = (0..t * d)
            .map(|i| {
                let (r, c) = (i / d, i % d);
                let (g, u) = (x[r * 2 * d + c].to_f32(), x[r * 2 * d + d + c].to_f32());
                fp8_conv(rb(rb(silu(g)) * u) * (1.0 / scale))
            })
            .collect();
        outs.push(out(
            format!("silu_and_mul_quant [{t}, {d}]"),
            got,
            want,
            0.13,
            1.0 / 512.0,
        ));
    }
    outs
}

pub fn silu_mul_fp8_quant(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    let eps = 1e-10f32;
    for (t, g, gs) in [(1, 1, 1), (3, 2, 7), (2, 3, 128)] {
        let x = rng.bf16s(t * 2 * g * gs, -6.0, 6.0);
        let (q, s) = k::silu_mul_fp8_quant(dev, &put(dev, &x, &[t, 2, g, gs]), eps).unwrap();
        let h = g * gs;
        let y: Vec<f32> = (0..t * h)
            .map(|i| {
                let (r, c) = (i / h, i % h);
                let (gate, up) = (x[r * 2 * h + c].to_f32(), x[r * 2 * h + h + c].to_f32());
                gate / (1.0 + (-gate).exp()) * up
            })
            .collect();
        let ys: Vec<f32> = y
            .chunks(gs)
            .map(|r| r.iter().fold(eps, |m, v| m.max(v.abs())) / 448.0)
            .collect();
        let want = (0..t * h)
            .map(|i| e4m3((y[i] / ys[i / gs]).max(-448.0).min(448.0)) as f64)
            .collect();
        outs.push(out(
            format!("silu_mul_fp8_quant [{t}, {g}, {gs}]"),
            read_e4m3(&q),
            want,
            0.13,
            1.0 / 512.0,
        ));
        outs.push(out(
            format!("silu_mul_fp8_quant scale [{t}, {g}, {gs}]"),
            read(&s),
            f64s(&ys),
            1e-5,
            0.0,
        ));
    }
    outs
}

pub fn convert_fp8(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let codes: Vec<F8E4M3> = (0..=255u8).map(F8E4M3::from_bits).collect();
    let scale = 1.0 + rng.below(8) as f32 / 8.0;
    let got = read(&k::convert_fp8_to_bf16(dev, &put(dev, &codes, &[256]), scale).unwrap());
    let want = codes
        .iter()
        .map(|c| rb(c.to_f32() * scale) as f64)
        .collect();
    let mut outs = vec![out("convert_fp8 e4m3 -> bf16", got, want, 0.0, 0.0)];
    let x = to_bf16(&rng.f32s_special(301, -1000.0, 1000.0, &SPECIALS));
    let got = read_e4m3(&k::convert_bf16_to_fp8(dev, &put(dev, &x, &[301]), scale).unwrap());
    let want = x.iter().map(|v| e4m3(v.to_f32() / scale) as f64).collect();
    outs.push(out("convert_fp8 bf16 -> e4m3", got, want, 0.0, 0.0));
    outs
}

/// The NEOX or GPT-J rotary of `x: [t, h, 2 * half]` by cache rows `rows[t]` (zero past the
/// cache), as the two halves of the result.
fn rotary_want(
    x: &[f32],
    cache: &[f32],
    rows: &[i64],
    (t, h, half): (usize, usize, usize),
    neox: bool,
) -> (Vec<f64>, Vec<f64>) {
    let max_pos = cache.len() / (2 * half);
    let (mut o1, mut o2) = (vec![], vec![]);
    for i in 0..t * h * half {
        let (tok, j, head) = (i / (h * half), i % half, i / half);
        let row = rows[tok];
        let inside = (0..max_pos as i64).contains(&row);
        let (cos, sin) = match inside {
            true => (
                cache[row as usize * 2 * half + j],
                cache[row as usize * 2 * half + half + j],
            ),
            false => (0.0, 0.0),
        };
        let base = head * 2 * half;
        let (x1, x2) = match neox {
            true => (x[base + j], x[base + half + j]),
            false => (x[base + 2 * j], x[base + 2 * j + 1]),
        };
        o1.push((x1 * cos - x2 * sin) as f64);
        o2.push((x2 * cos + x1 * sin) as f64);
    }
    (o1, o2)
}

/// Positions into a cache of `max_pos` rows: mostly inside, some past it (read as zero).
fn positions(rng: &mut Rng, t: usize, max_pos: usize) -> Vec<i64> {
    (0..t)
        .map(|_| rng.below(max_pos as u64 + 2) as i64)
        .collect()
}

pub fn rotary_embedding(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h, half, max_pos) in [(1, 1, 1, 1), (5, 3, 16, 9), (3, 2, 33, 17)] {
        let x = rng.f32s(t * h * 2 * half, -2.0, 2.0);
        let cache = rng.f32s(max_pos * 2 * half, -1.0, 1.0);
        let pos = positions(rng, t, max_pos);
        let (pb, cb, xb) = (
            put(dev, &pos, &[t]),
            put(dev, &cache, &[max_pos, 2 * half]),
            put(dev, &x, &[t, h, 2 * half]),
        );
        for neox in [true, false] {
            let (a, b) = match neox {
                true => k::rotary_neox(dev, &pb, &cb, &xb),
                false => k::rotary_gptj(dev, &pb, &cb, &xb),
            }
            .unwrap();
            let (w1, w2) = rotary_want(&x, &cache, &pos, (t, h, half), neox);
            outs.push(out(
                format!("rotary neox={neox} first [{t}, {h}, {half}]"),
                read(&a),
                w1,
                1e-6,
                1e-6,
            ));
            outs.push(out(
                format!("rotary neox={neox} second [{t}, {h}, {half}]"),
                read(&b),
                w2,
                1e-6,
                1e-6,
            ));
        }
    }
    outs
}

pub fn batched_rotary_embedding(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (t, h, half, max_pos) = (7, 3, 8, 20);
    let x = rng.f32s(t * h * 2 * half, -2.0, 2.0);
    let cache = rng.f32s(max_pos * 2 * half, -1.0, 1.0);
    let pos = positions(rng, t, 10);
    let offsets: Vec<i64> = (0..t).map(|_| 10 * rng.below(2) as i64).collect();
    let (a, b) = k::batched_rotary_neox(
        dev,
        &put(dev, &pos, &[t]),
        &put(dev, &offsets, &[t]),
        &put(dev, &cache, &[max_pos, 2 * half]),
        &put(dev, &x, &[t, h, 2 * half]),
    )
    .unwrap();
    let rows: Vec<i64> = pos.iter().zip(&offsets).map(|(p, o)| p + o).collect();
    let (w1, w2) = rotary_want(&x, &cache, &rows, (t, h, half), true);
    vec![
        out("batched_rotary first", read(&a), w1, 1e-6, 1e-6),
        out("batched_rotary second", read(&b), w2, 1e-6, 1e-6),
    ]
}

pub fn fused_qk_norm_rope(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (t, h, half, max_pos) = (5, 4, 32, 11);
    let x = rng.f32s(t * h * 2 * half, -2.0, 2.0);
    let w = rng.f32s(2 * half, 0.5, 1.5);
    let cache = rng.f32s(max_pos * 2 * half, -1.0, 1.0);
    let pos = positions(rng, t, max_pos);
    let (a, b) = k::fused_qk_norm_rope(
        dev,
        &put(dev, &pos, &[t]),
        &put(dev, &cache, &[max_pos, 2 * half]),
        &put(dev, &x, &[t, h, 2 * half]),
        &put(dev, &w, &[2 * half]),
        1e-6,
    )
    .unwrap();
    let rstd = rstd_rows(&x, 2 * half, 1e-6);
    let normed: Vec<f32> = (0..x.len())
        .map(|i| x[i] * rstd[i / (2 * half)] * w[i % (2 * half)])
        .collect();
    let (w1, w2) = rotary_want(&normed, &cache, &pos, (t, h, half), true);
    vec![
        out("fused_qk_norm_rope first", read(&a), w1, 1e-5, 1e-5),
        out("fused_qk_norm_rope second", read(&b), w2, 1e-5, 1e-5),
    ]
}

pub fn topk_softmax(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, e) in [(1, 2), (5, 8), (3, 61)] {
        let mut x = rng.f32s(t * e, -4.0, 4.0);
        if e > 2 {
            x[1] = x[0].max(x[1]) + 1.0; // a tie between experts 1 and 2: the lower wins
            x[2] = x[1];
        }
        for renormalize in [false, true] {
            let (w0, w1, i0, i1) =
                k::topk2_softmax(dev, &put(dev, &x, &[t, e]), renormalize).unwrap();
            let (mut ww0, mut ww1, mut wi0, mut wi1) = (vec![], vec![], vec![], vec![]);
            for row in x.chunks(e) {
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let s: f64 = row.iter().map(|&v| f64::from(v - m).exp()).sum();
                let p: Vec<f64> = row.iter().map(|&v| f64::from(v - m).exp() / s).collect();
                let first = (0..e).fold(0, |b, j| if p[j] > p[b] { j } else { b });
                let second =
                    (0..e)
                        .filter(|&j| j != first)
                        .fold(None, |b: Option<usize>, j| match b {
                            Some(b) if p[b] >= p[j] => Some(b),
                            _ => Some(j),
                        });
                let second = second.unwrap();
                let total = if renormalize {
                    p[first] + p[second]
                } else {
                    1.0
                };
                ww0.push(p[first] / total);
                ww1.push(p[second] / total);
                wi0.push(first as f64);
                wi1.push(second as f64);
            }
            let what = format!("topk_softmax k=2 renormalize={renormalize} [{t}, {e}]");
            outs.push(out(format!("{what} w0"), read(&w0), ww0, 1e-5, 1e-7));
            outs.push(out(format!("{what} w1"), read(&w1), ww1, 1e-5, 1e-7));
            outs.push(out(format!("{what} i0"), read(&i0), wi0, 0.0, 0.0));
            outs.push(out(format!("{what} i1"), read(&i1), wi1, 0.0, 0.0));
        }
    }
    outs
}

pub fn moe_sum(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, topk, h) in [(1, 1, 1), (3, 2, 37), (5, 6, 130)] {
        let x = rng.f32s(t * topk * h, -3.0, 3.0);
        let got = read(&k::moe_sum(dev, &put(dev, &x, &[t, topk, h])).unwrap());
        let want = (0..t * h)
            .map(|i| {
                (0..topk)
                    .map(|j| f64::from(x[(i / h * topk + j) * h + i % h]))
                    .sum()
            })
            .collect();
        outs.push(out(
            format!("moe_sum [{t}, {topk}, {h}]"),
            got,
            want,
            1e-6,
            1e-6,
        ));
    }
    outs
}

pub fn apply_repetition_penalties(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (s, v) = (3, 257);
    let logits = rng.f32s_special(s * v, -5.0, 5.0, &[0.0, -0.0, f32::NAN]);
    let prompt: Vec<bool> = (0..s * v).map(|_| rng.below(3) == 0).collect();
    let output: Vec<bool> = (0..s * v).map(|_| rng.below(3) == 0).collect();
    let pen = rng.f32s(s, 1.0, 2.0);
    let got = read(
        &k::apply_repetition_penalties(
            dev,
            &put(dev, &logits, &[s, v]),
            &put(dev, &prompt, &[s, v]),
            &put(dev, &output, &[s, v]),
            &put(dev, &pen, &[s]),
        )
        .unwrap(),
    );
    let want: Vec<f64> = (0..s * v)
        .map(|i| {
            let (l, p) = (logits[i], pen[i / v]);
            (if prompt[i] || output[i] {
                if l > 0.0 {
                    l / p
                } else {
                    l * p
                }
            } else {
                l
            }) as f64
        })
        .collect();
    // -0.0 stays -0.0 (`-0.0 * p`): compare the signs of zeros too.
    let signs = |v: &[f64]| {
        v.iter()
            .map(|x| match (x.is_nan(), x.is_sign_negative()) {
                (true, _) => 0.0,
                (_, true) => -1.0,
                _ => 1.0,
            })
            .collect::<Vec<f64>>()
    };
    let (gs, ws) = (signs(&got), signs(&want));
    vec![
        out("apply_repetition_penalties", got, want, 0.0, 0.0),
        out("apply_repetition_penalties signs", gs, ws, 0.0, 0.0),
    ]
}

/// `n` distinct slots of `slots`, every fifth token a padding one (`-1`).
fn slot_mapping(rng: &mut Rng, n: usize, slots: usize) -> Vec<i64> {
    let mut free: Vec<i64> = (0..slots as i64).collect();
    (0..n)
        .map(|i| {
            if i % 5 == 4 || free.is_empty() {
                return -1;
            }
            let at = rng.below(free.len() as u64) as usize;
            free.swap_remove(at)
        })
        .collect()
}

/// The cache after vLLM's write: row `slot[i]` of `cache` (rows of `row` elements, `width`
/// apart, starting at `offset`) is `src`'s row `i`; other rows as they were.
fn cached(
    cache: &[bf16],
    src: &[bf16],
    slot: &[i64],
    row: usize,
    width: usize,
    offset: usize,
) -> Vec<f64> {
    let mut want = cache.to_vec();
    for (i, &s) in slot.iter().enumerate().filter(|(_, s)| **s >= 0) {
        let at = s as usize * width + offset;
        want[at..at + row].copy_from_slice(&src[i * row..][..row]);
    }
    want.iter().map(|v| v.to_f64()).collect()
}

pub fn reshape_and_cache_flash(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h, d, blocks, block) in [(1, 1, 1, 1, 1), (7, 3, 16, 4, 4), (37, 8, 128, 3, 16)] {
        let slots = blocks * block;
        let key = to_bf16(&rng.f32s(t * h * d, -3.0, 3.0));
        let value = to_bf16(&rng.f32s(t * h * d, -3.0, 3.0));
        let slot = slot_mapping(rng, t, slots);
        let k0 = to_bf16(&rng.f32s(slots * h * d, -9.0, 9.0));
        let v0 = to_bf16(&rng.f32s(slots * h * d, -9.0, 9.0));
        let (mut kc, mut vc) = (put(dev, &k0, &[slots, h, d]), put(dev, &v0, &[slots, h, d]));
        k::reshape_and_cache_flash(
            dev,
            &put(dev, &key, &[t, h, d]),
            &put(dev, &value, &[t, h, d]),
            &put(dev, &slot, &[t]),
            &mut kc,
            &mut vc,
        )
        .unwrap();
        let what = format!("reshape_and_cache_flash {t}x{h}x{d} into {blocks}x{block}");
        let want = cached(&k0, &key, &slot, h * d, h * d, 0);
        outs.push(out(format!("{what}: keys"), read(&kc), want, 0.0, 0.0));
        let want = cached(&v0, &value, &slot, h * d, h * d, 0);
        outs.push(out(format!("{what}: values"), read(&vc), want, 0.0, 0.0));
    }
    outs
}

/// vLLM's `reshape_and_cache` (x = 8, 16 bytes of bf16), against its kernel's loop: element
/// `i` of token `t`'s `h * d` goes to `key_cache[block][head][off / x][block_offset][off % x]`
/// and `value_cache[block][head][off][block_offset]`.
pub fn reshape_and_cache(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    let x = 8;
    for (t, h, d, nb, bs) in [(1, 1, 8, 1, 1), (7, 3, 16, 4, 4), (37, 8, 128, 3, 16)] {
        let slots = nb * bs;
        let key = to_bf16(&rng.f32s(t * h * d, -3.0, 3.0));
        let value = to_bf16(&rng.f32s(t * h * d, -3.0, 3.0));
        let slot = slot_mapping(rng, t, slots);
        let k0 = to_bf16(&rng.f32s(slots * h * d, -9.0, 9.0));
        let v0 = to_bf16(&rng.f32s(slots * h * d, -9.0, 9.0));
        let mut kc = put(dev, &k0, &[nb, h, d / x, bs, x]);
        let mut vc = put(dev, &v0, &[nb, h, d, bs]);
        let bslot = put(dev, &slot, &[t]);
        let (bs64, bkey) = (bs as i64, put(dev, &key, &[t, h, d / x, x]));
        k::reshape_and_cache_key(dev, &bkey, &bslot, bs64, &mut kc).unwrap();
        let bvalue = put(dev, &value, &[t, h, d]);
        k::reshape_and_cache_value(dev, &bvalue, &bslot, bs64, &mut vc).unwrap();
        let (mut want_k, mut want_v): (Vec<f64>, Vec<f64>) = (
            k0.iter().map(|v| v.to_f64()).collect(),
            v0.iter().map(|v| v.to_f64()).collect(),
        );
        for (ti, &s) in slot.iter().enumerate() {
            if s < 0 {
                continue;
            }
            let (block, at) = (s as usize / bs, s as usize % bs);
            for i in 0..h * d {
                let (head, off) = (i / d, i % d);
                let src = ti * h * d + i;
                let ki = (((block * h + head) * (d / x) + off / x) * bs + at) * x + off % x;
                want_k[ki] = key[src].to_f64();
                want_v[((block * h + head) * d + off) * bs + at] = value[src].to_f64();
            }
        }
        let what = format!("reshape_and_cache {t}x{h}x{d} into {nb}x{bs}");
        outs.push(out(format!("{what}: keys"), read(&kc), want_k, 0.0, 0.0));
        outs.push(out(format!("{what}: values"), read(&vc), want_v, 0.0, 0.0));
    }
    outs
}

/// vLLM's `copy_blocks` against its kernel's loop: each pair's source block of both caches
/// copied to its destination block, in blocks of `block_size * h * d`; sources and destinations
/// distinct, as vLLM's copy-on-write forks make them.
pub fn copy_blocks(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (nb, e, m) in [(2, 1, 1), (9, 40, 3), (64, 16 * 8 * 128, 20)] {
        // A shuffle of the blocks: the first m sources, the next m destinations.
        let mut order: Vec<i64> = (0..nb as i64).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mapping: Vec<i64> = (0..m).flat_map(|i| [order[i], order[m + i]]).collect();
        let k0 = to_bf16(&rng.f32s(nb * e, -9.0, 9.0));
        let v0 = to_bf16(&rng.f32s(nb * e, -9.0, 9.0));
        let (mut kc, mut vc) = (put(dev, &k0, &[nb, e]), put(dev, &v0, &[nb, e]));
        k::copy_blocks(dev, &put(dev, &mapping, &[m, 2]), &mut kc, &mut vc).unwrap();
        let copied = |before: &[bf16]| {
            let mut after: Vec<f64> = before.iter().map(|v| v.to_f64()).collect();
            for pair in mapping.chunks(2) {
                let (src, dst) = (pair[0] as usize, pair[1] as usize);
                for i in 0..e {
                    after[dst * e + i] = before[src * e + i].to_f64();
                }
            }
            after
        };
        let what = format!("copy_blocks {m} of {nb}x{e}");
        outs.push(out(
            format!("{what}: keys"),
            read(&kc),
            copied(&k0),
            0.0,
            0.0,
        ));
        outs.push(out(
            format!("{what}: values"),
            read(&vc),
            copied(&v0),
            0.0,
            0.0,
        ));
    }
    outs
}

pub fn concat_and_cache_mla(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, r, p, slots) in [(1, 1, 1, 1), (9, 16, 8, 12), (33, 512, 64, 48)] {
        let kv_c = to_bf16(&rng.f32s(t * r, -3.0, 3.0));
        let k_pe = to_bf16(&rng.f32s(t * p, -3.0, 3.0));
        let slot = slot_mapping(rng, t, slots);
        let before = to_bf16(&rng.f32s(slots * (r + p), -9.0, 9.0));
        let mut cache = put(dev, &before, &[slots, r + p]);
        let (bc, bp, bs) = (
            put(dev, &kv_c, &[t, r]),
            put(dev, &k_pe, &[t, p]),
            put(dev, &slot, &[t]),
        );
        k::concat_and_cache_mla(dev, &bc, &bp, &bs, &mut cache).unwrap();
        k::concat_and_cache_mla_pe(dev, &bc, &bp, &bs, &mut cache).unwrap();
        let with_c: Vec<bf16> = cached(&before, &kv_c, &slot, r, r + p, 0)
            .iter()
            .map(|&v| bf16::from_f64(v))
            .collect();
        let want = cached(&with_c, &k_pe, &slot, p, r + p, r);
        let what = format!("concat_and_cache_mla {t}x({r}+{p}) into {slots}");
        outs.push(out(what, read(&cache), want, 0.0, 0.0));
    }
    outs
}

/// The two results' LSEs `[h, t]` with infinities of both signs (an empty sequence's), and
/// `-inf` in both at some positions, where vLLM's merge is NaN too.
pub fn merge_attn_states(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h, d) in [(1, 1, 8), (5, 3, 64), (37, 4, 136)] {
        let specials = [f32::INFINITY, f32::NEG_INFINITY];
        let p_lse = rng.f32s_special(h * t, -5.0, 5.0, &specials);
        let mut s_lse = rng.f32s_special(h * t, -5.0, 5.0, &specials);
        s_lse[0] = f32::NEG_INFINITY;
        let (p_out, s_out) = (
            rng.bf16s(t * h * d, -3.0, 3.0),
            rng.bf16s(t * h * d, -3.0, 3.0),
        );
        let (bp, bs) = (put(dev, &p_lse, &[h, t]), put(dev, &s_lse, &[h, t]));
        let got = read(
            &k::merge_attn_states(
                dev,
                &put(dev, &p_out, &[t, h, d]),
                &bp,
                &put(dev, &s_out, &[t, h, d]),
                &bs,
            )
            .unwrap(),
        );
        let got_lse = read(&k::merge_attn_states_lse(dev, &bp, &bs).unwrap());
        // One head of one token: its LSE at `[head, token]`, as the kernel reads it.
        let merged = |i: usize| {
            let finite = |v: f32| {
                if v.is_infinite() {
                    f32::NEG_INFINITY
                } else {
                    v
                }
            };
            let (pl, sl) = (finite(p_lse[i]), finite(s_lse[i]));
            let max = pl.max(sl);
            let (pe, se) = ((pl - max).exp(), (sl - max).exp());
            (pe / (pe + se), se / (pe + se), (pe + se).ln() + max)
        };
        let want = (0..t * h * d)
            .map(|e| {
                let (token, head) = (e / (h * d), e / d % h);
                let (ps, ss, _) = merged(head * t + token);
                rb(p_out[e].to_f32() * ps + s_out[e].to_f32() * ss) as f64
            })
            .collect();
        let want_lse = (0..h * t).map(|i| merged(i).2 as f64).collect();
        outs.push(out(
            format!("merge_attn_states [{t}, {h}, {d}]"),
            got,
            want,
            BF16_ULP,
            1e-6,
        ));
        outs.push(out(
            format!("merge_attn_states lse [{h}, {t}]"),
            got_lse,
            want_lse,
            1e-5,
            1e-5,
        ));
    }
    outs
}
