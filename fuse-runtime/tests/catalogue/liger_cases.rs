//! Liger-Kernel's forward ops against references that follow their Triton sources.

use super::kernels::liger as k;
use super::support::*;
use fuse_runtime::Device;

const NORM_SHAPES: [(usize, usize); 3] = [(1, 1), (5, 37), (3, 1031)];

/// GroupNorm: `[batch, groups, channels a group, positions]`, a group's rows of 1 to 6000.
pub fn group_norm(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (b, g, c, s) in [(1, 1, 1, 1), (2, 4, 3, 37), (3, 2, 8, 750), (1, 3, 2, 1)] {
        let n = c * s;
        let (x, w, bias) = (
            rng.f32s(b * g * n, -2.0, 2.0),
            rng.f32s(g * c, 0.5, 1.5),
            rng.f32s(g * c, -1.0, 1.0),
        );
        let (y, m, rstd) = k::group_norm(
            dev,
            &put(dev, &x, &[b, g, c, s]),
            &put(dev, &w, &[g, c]),
            &put(dev, &bias, &[g, c]),
            1e-5,
        )
        .unwrap();
        let (mut wy, mut wm, mut wr) = (vec![], vec![], vec![]);
        // Liger's variance, `mean(x²) - mean²`, cancels where a group's values are close:
        // the f32 rounding of the two means, about `4 ε (mean(x²) + mean²)`, over the variance
        // plus eps is the relative error of `rstd` (halved), and so of `y - bias`, beyond the
        // case's own tolerance: a group of two close values was off by 1.4e-4 (the catalogue
        // under synccheck, 2026-12-03). The widest bound of the case's groups.
        let (mut rstd_rel, mut y_abs) = (0.0f64, 0.0f64);
        for (group, row) in x.chunks(n).enumerate() {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let square = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
            let r = 1.0 / (square - mean * mean + 1e-5).sqrt();
            let cancel = 4.0 * f64::from(f32::EPSILON) * (square + mean * mean) * r * r / 2.0;
            rstd_rel = rstd_rel.max(cancel);
            wy.extend(row.iter().enumerate().map(|(j, &v)| {
                let ch = (group % g) * c + j / s;
                let centred = (f64::from(v) - mean) * r * f64::from(w[ch]);
                y_abs = y_abs.max(centred.abs() * cancel);
                centred + f64::from(bias[ch])
            }));
            wm.push(mean);
            wr.push(r);
        }
        let shape = format!("[{b}, {g}, {c}, {s}]");
        outs.push(out(
            format!("group_norm Y {shape}"),
            read(&y),
            wy,
            1e-4,
            1e-4 + y_abs,
        ));
        outs.push(out(
            format!("group_norm Mean {shape}"),
            read(&m),
            wm,
            1e-5,
            1e-6,
        ));
        outs.push(out(
            format!("group_norm RSTD {shape}"),
            read(&rstd),
            wr,
            1e-4 + rstd_rel,
            0.0,
        ));
    }
    outs
}

pub fn rms_norm(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in NORM_SHAPES {
        let (x, w) = (rng.f32s(t * h, -3.0, 3.0), rng.f32s(h, -0.5, 0.5));
        let (y, rstd) =
            k::rms_norm(dev, &put(dev, &x, &[t, h]), &put(dev, &w, &[h]), 1e-6, 1.0).unwrap();
        let r = rstd_rows(&x, h, 1e-6);
        let want = (0..t * h)
            .map(|i| (x[i] * r[i / h] * (1.0 + w[i % h])) as f64)
            .collect();
        outs.push(out(
            format!("rms_norm Y [{t}, {h}]"),
            read(&y),
            want,
            1e-5,
            1e-6,
        ));
        outs.push(out(
            format!("rms_norm RSTD [{t}, {h}]"),
            read(&rstd),
            f64s(&r),
            1e-5,
            0.0,
        ));
    }
    outs
}

pub fn layer_norm(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in NORM_SHAPES {
        let (x, w, b) = (
            rng.f32s(t * h, 1.0, 3.0),
            rng.f32s(h, 0.5, 1.5),
            rng.f32s(h, -1.0, 1.0),
        );
        let (y, m, rstd) = k::layer_norm(
            dev,
            &put(dev, &x, &[t, h]),
            &put(dev, &w, &[h]),
            &put(dev, &b, &[h]),
            1e-5,
        )
        .unwrap();
        let (mut wy, mut wm, mut wr) = (vec![], vec![], vec![]);
        for row in x.chunks(h) {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / h as f64;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / h as f64;
            let r = 1.0 / (var + 1e-5).sqrt();
            wy.extend(
                row.iter()
                    .enumerate()
                    .map(|(j, &v)| (f64::from(v) - mean) * r * f64::from(w[j]) + f64::from(b[j])),
            );
            wm.push(mean);
            wr.push(r);
        }
        outs.push(out(
            format!("layer_norm Y [{t}, {h}]"),
            read(&y),
            wy,
            1e-4,
            1e-5,
        ));
        outs.push(out(
            format!("layer_norm Mean [{t}, {h}]"),
            read(&m),
            wm,
            1e-5,
            0.0,
        ));
        outs.push(out(
            format!("layer_norm RSTD [{t}, {h}]"),
            read(&rstd),
            wr,
            1e-4,
            0.0,
        ));
    }
    outs
}

pub fn swiglu_geglu(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in [(1, 1), (3, 37), (2, 260)] {
        let (a, b) = (
            to_bf16(&rng.f32s_special(t * h, -6.0, 6.0, &SPECIALS)),
            rng.bf16s(t * h, -2.0, 2.0),
        );
        let (ab, bb) = (put(dev, &a, &[t, h]), put(dev, &b, &[t, h]));
        let want = |f: fn(f32) -> f32| {
            (0..t * h)
                .map(|i| rb(rb(f(a[i].to_f32())) * b[i].to_f32()) as f64)
                .collect()
        };
        outs.push(out(
            format!("swiglu [{t}, {h}]"),
            read(&k::swiglu(dev, &ab, &bb).unwrap()),
            want(silu),
            1.0 / 128.0,
            0.0,
        ));
        outs.push(out(
            format!("geglu [{t}, {h}]"),
            read(&k::geglu(dev, &ab, &bb).unwrap()),
            want(gelu_tanh),
            1.0 / 128.0,
            0.0,
        ));
    }
    outs
}

pub fn relu_squared(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let x = rng.f32s_special(131, -4.0, 4.0, &SPECIALS);
    let got = read(&k::relu_squared(dev, &put(dev, &x, &[131])).unwrap());
    let want = x
        .iter()
        .map(|&v| {
            let r = if v < 0.0 { 0.0 } else { v };
            (r * r) as f64
        })
        .collect();
    vec![out("relu_squared", got, want, 0.0, 0.0)]
}

pub fn rope(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (b, s, h, half) = (2, 5, 3, 8);
    let x = rng.f32s(b * s * h * 2 * half, -2.0, 2.0);
    let (cos, sin) = (
        rng.f32s(b * s * 2 * half, -1.0, 1.0),
        rng.f32s(b * s * 2 * half, -1.0, 1.0),
    );
    let (o1, o2) = k::rope(
        dev,
        &put(dev, &x, &[b, s, h, 2 * half]),
        &put(dev, &cos, &[b, s, 2 * half]),
        &put(dev, &sin, &[b, s, 2 * half]),
    )
    .unwrap();
    let (mut w1, mut w2) = (vec![], vec![]);
    for i in 0..b * s * h * half {
        let (j, head, bs) = (i % half, i / half, i / (h * half));
        let (x1, x2) = (x[head * 2 * half + j], x[head * 2 * half + half + j]);
        let (c, sn) = (cos[bs * 2 * half + j], sin[bs * 2 * half + j]);
        w1.push((x1 * c - x2 * sn) as f64);
        w2.push((x2 * c + x1 * sn) as f64);
    }
    vec![
        out("rope first", read(&o1), w1, 1e-6, 1e-6),
        out("rope second", read(&o2), w2, 1e-6, 1e-6),
    ]
}

pub fn cross_entropy(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    let (ls, z_scale, softcap, ignore) = (0.1f32, 1e-4f32, 30.0f32, -100i64);
    for (n, v) in [(1, 1), (7, 33), (3, 1031)] {
        let x = rng.f32s(n * v, -40.0, 40.0);
        let y: Vec<i64> = (0..n)
            .map(|i| {
                if i % 3 == 1 {
                    ignore
                } else {
                    rng.below(v as u64) as i64
                }
            })
            .collect();
        let eps = ls / v as f32;
        let (loss, z_loss, pred) = k::cross_entropy(
            dev,
            &put(dev, &x, &[n, v]),
            &put(dev, &y, &[n]),
            ignore,
            ls,
            eps,
            z_scale,
            softcap,
        )
        .unwrap();
        let (mut wl, mut wz, mut wp) = (vec![], vec![], vec![]);
        for (r, row) in x.chunks(v).enumerate() {
            let z: Vec<f64> = row
                .iter()
                .map(|&a| f64::from(softcap) * (f64::from(a) / f64::from(softcap)).tanh())
                .collect();
            let m = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let lse = m + z.iter().map(|&a| (a - m).exp()).sum::<f64>().ln();
            wp.push((0..v).fold(0, |b, j| if z[j] > z[b] { j } else { b }) as f64);
            if y[r] == ignore {
                wl.push(0.0);
                wz.push(0.0);
                continue;
            }
            let smooth = z.iter().map(|&a| -f64::from(eps) * a).sum::<f64>() + f64::from(ls) * lse;
            let zl = f64::from(z_scale) * lse * lse;
            wl.push((lse - z[y[r] as usize]) * (1.0 - f64::from(ls)) + smooth + zl);
            wz.push(zl);
        }
        outs.push(out(
            format!("cross_entropy loss [{n}, {v}]"),
            read(&loss),
            wl,
            1e-4,
            1e-4,
        ));
        outs.push(out(
            format!("cross_entropy z_loss [{n}, {v}]"),
            read(&z_loss),
            wz,
            1e-4,
            1e-7,
        ));
        outs.push(out(
            format!("cross_entropy predicted [{n}, {v}]"),
            read(&pred),
            wp,
            0.0,
            0.0,
        ));
    }
    outs
}

/// `n` rows of log-probabilities over `v`.
fn log_probs(rng: &mut Rng, n: usize, v: usize) -> Vec<f32> {
    let x = rng.f32s(n * v, -3.0, 3.0);
    x.chunks(v)
        .flat_map(|row| {
            let lse = row.iter().map(|&a| f64::from(a).exp()).sum::<f64>().ln();
            row.iter().map(move |&a| (f64::from(a) - lse) as f32)
        })
        .collect()
}

pub fn kl_div(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (n, v) = (5, 67);
    let x = log_probs(rng, n, v);
    let mut y: Vec<f32> = log_probs(rng, n, v).iter().map(|a| a.exp()).collect();
    y[3] = 0.0; // a zero target: `ln(max(y, eps))` keeps it finite, and the term is 0
    let eps = 1e-10f32;
    let got = read(&k::kl_div(dev, &put(dev, &x, &[n, v]), &put(dev, &y, &[n, v]), eps).unwrap());
    let want = (0..n * v)
        .map(|i| (y[i] * (y[i].max(eps).ln() - x[i])) as f64)
        .collect();
    let yl = log_probs(rng, n, v);
    let rows = read(
        &k::kl_div_log_target_rows(dev, &put(dev, &x, &[n, v]), &put(dev, &yl, &[n, v])).unwrap(),
    );
    let want_rows = yl
        .chunks(v)
        .zip(x.chunks(v))
        .map(|(yr, xr)| {
            yr.iter()
                .zip(xr)
                .map(|(&b, &a)| f64::from(b).exp() * f64::from(b - a))
                .sum()
        })
        .collect();
    vec![
        out("kl_div none", got, want, 1e-5, 1e-7),
        out("kl_div log_target row sums", rows, want_rows, 1e-5, 1e-6),
    ]
}

pub fn jsd(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (n, v, beta) = (6, 45, 0.3f32);
    let (x, y) = (log_probs(rng, n, v), log_probs(rng, n, v));
    let label: Vec<i64> = (0..n).map(|i| if i % 4 == 2 { -100 } else { 1 }).collect();
    let kept = label.iter().filter(|&&l| l != -100).count() as f32;
    let got = read(
        &k::jsd(
            dev,
            &put(dev, &x, &[n, v]),
            &put(dev, &y, &[n, v]),
            &put(dev, &label, &[n]),
            beta,
            kept,
        )
        .unwrap(),
    );
    let b = f64::from(beta);
    let want = (0..n)
        .map(|r| {
            if label[r] == -100 {
                return 0.0;
            }
            let s: f64 = (0..v)
                .map(|j| {
                    let (a, c) = (f64::from(x[r * v + j]), f64::from(y[r * v + j]));
                    let (q, p) = (a.exp(), c.exp());
                    let m = b * p + (1.0 - b) * q;
                    b * p * c + (1.0 - b) * q * a - m * m.ln()
                })
                .sum();
            s / f64::from(kept)
        })
        .collect();
    vec![out("jsd", got, want, 1e-4, 1e-6)]
}

pub fn tvd(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (n, v) = (4, 29);
    let (p, q) = (rng.f32s(n * v, 0.0, 1.0), rng.f32s(n * v, 0.0, 1.0));
    let label: Vec<i64> = (0..n as i64)
        .map(|i| if i == 2 { -100 } else { i })
        .collect();
    let (loss, grad) = k::tvd(
        dev,
        &put(dev, &p, &[n, v]),
        &put(dev, &q, &[n, v]),
        &put(dev, &label, &[n]),
        -100,
    )
    .unwrap();
    let ignored = |i: usize| label[i / v] == -100;
    let wl = (0..n * v)
        .map(|i| {
            if ignored(i) {
                0.0
            } else {
                (0.5 * (p[i] - q[i]).abs()) as f64
            }
        })
        .collect();
    let wg = (0..n * v)
        .map(|i| {
            if ignored(i) {
                0.0
            } else if p[i] > q[i] {
                0.5
            } else {
                -0.5
            }
        })
        .collect();
    vec![
        out("tvd loss", read(&loss), wl, 0.0, 0.0),
        out("tvd grad", read(&grad), wg, 0.0, 0.0),
    ]
}

pub fn dyt(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let (t, h) = (3, 77);
    let (x, g, b) = (
        rng.f32s(t * h, -4.0, 4.0),
        rng.f32s(h, 0.5, 1.5),
        rng.f32s(h, -1.0, 1.0),
    );
    let alpha = 0.7f32;
    let got = read(
        &k::dyt(
            dev,
            &put(dev, &x, &[t, h]),
            &scalar(dev, alpha),
            &put(dev, &g, &[h]),
            &put(dev, &b, &[h]),
        )
        .unwrap(),
    );
    let want = (0..t * h)
        .map(|i| (g[i % h] * (alpha * x[i]).tanh() + b[i % h]) as f64)
        .collect();
    vec![out("dyt", got, want, 1e-5, 1e-6)]
}

pub fn softmax(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, v) in [(1, 1), (4, 33), (2, 4099)] {
        let x = rng.f32s(t * v, -20.0, 20.0);
        let got = read(&k::softmax(dev, &put(dev, &x, &[t, v])).unwrap());
        let want = x
            .chunks(v)
            .flat_map(|row| {
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let s: f64 = row.iter().map(|&a| f64::from(a - m).exp()).sum();
                row.iter().map(move |&a| f64::from(a - m).exp() / s)
            })
            .collect();
        outs.push(out(format!("softmax [{t}, {v}]"), got, want, 1e-5, 1e-9));
    }
    outs
}

pub fn fused_add_rms_norm(dev: &Device, rng: &mut Rng) -> Vec<Out> {
    let mut outs = vec![];
    for (t, h) in NORM_SHAPES {
        let (x, r, w) = (
            rng.f32s(t * h, -2.0, 2.0),
            rng.f32s(t * h, -2.0, 2.0),
            rng.f32s(h, 0.5, 1.5),
        );
        let (y, s, rstd) = k::fused_add_rms_norm(
            dev,
            &put(dev, &x, &[t, h]),
            &put(dev, &r, &[t, h]),
            &put(dev, &w, &[h]),
            1e-6,
            0.0,
        )
        .unwrap();
        let sum: Vec<f32> = (0..t * h).map(|i| x[i] + r[i]).collect();
        let rs = rstd_rows(&sum, h, 1e-6);
        let want = (0..t * h)
            .map(|i| (sum[i] * rs[i / h] * w[i % h]) as f64)
            .collect();
        outs.push(out(
            format!("fused_add_rms_norm Y [{t}, {h}]"),
            read(&y),
            want,
            1e-5,
            1e-6,
        ));
        outs.push(out(
            format!("fused_add_rms_norm S [{t}, {h}]"),
            read(&s),
            f64s(&sum),
            0.0,
            0.0,
        ));
        outs.push(out(
            format!("fused_add_rms_norm RSTD [{t}, {h}]"),
            read(&rstd),
            f64s(&rs),
            1e-5,
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
        let (y, r3, r2, r1) = k::poly_norm(
            dev,
            &put(dev, &x, &[t, h]),
            &put(dev, &w, &[3]),
            &put(dev, &b, &[1]),
            1e-6,
        )
        .unwrap();
        let x2: Vec<f32> = x.iter().map(|v| v * v).collect();
        let x3: Vec<f32> = x.iter().map(|v| v * v * v).collect();
        let (w1, w2, w3) = (
            rstd_rows(&x, h, 1e-6),
            rstd_rows(&x2, h, 1e-6),
            rstd_rows(&x3, h, 1e-6),
        );
        let want = (0..t * h)
            .map(|i| {
                (w[0] * x3[i] * w3[i / h]
                    + w[1] * x2[i] * w2[i / h]
                    + w[2] * x[i] * w1[i / h]
                    + b[0]) as f64
            })
            .collect();
        outs.push(out(
            format!("poly_norm Y [{t}, {h}]"),
            read(&y),
            want,
            1e-4,
            1e-5,
        ));
        outs.push(out(
            format!("poly_norm RSTD x^3 [{t}, {h}]"),
            read(&r3),
            f64s(&w3),
            1e-5,
            0.0,
        ));
        outs.push(out(
            format!("poly_norm RSTD x^2 [{t}, {h}]"),
            read(&r2),
            f64s(&w2),
            1e-5,
            0.0,
        ));
        outs.push(out(
            format!("poly_norm RSTD x [{t}, {h}]"),
            read(&r1),
            f64s(&w1),
            1e-5,
            0.0,
        ));
    }
    outs
}
