//! The workloads of `shared/WORKLOADS.md` as the benchmark runs them: their inputs, outputs and
//! byte counts, and each variant (fused, unfused, copy) as a closure that owns its
//! intermediate buffers, so that nothing is allocated while it is timed.

use fuse_runtime::{Buffer, Device, Error};

use crate::kernels::*;

/// The sizes of one run of a workload: `n` for one-dimensional workloads, `rows x cols` for
/// row workloads (whose `n` is `rows * cols`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub n: usize,
    pub rows: usize,
    pub cols: usize,
}

impl Dims {
    /// A one-dimensional problem of `n` elements.
    pub fn flat(n: usize) -> Dims {
        Dims {
            n,
            rows: 1,
            cols: n,
        }
    }

    /// A `rows x cols` problem.
    pub fn grid(rows: usize, cols: usize) -> Dims {
        Dims {
            n: rows * cols,
            rows,
            cols,
        }
    }
}

/// One variant, set up for one device and size: called with the inputs and the outputs, it
/// queues its kernels.
pub type Run = Box<dyn FnMut(&[Buffer<f32>], &mut [Buffer<f32>]) -> Result<(), Error>>;

/// A way to compute a workload.
pub struct Variant {
    /// What the table calls it, such as `unfused (3 kernels)`.
    pub name: &'static str,
    /// Sets it up on a device for a size, allocating its intermediates.
    pub build: fn(&Device, Dims) -> Result<Run, Error>,
}

/// One workload: its shapes, its byte count, and its variants. The first variant is the
/// reference that the CPU backend computes for the correctness check.
pub struct Workload {
    pub id: &'static str,
    /// The definition, as WORKLOADS.md writes it.
    pub what: &'static str,
    /// The fewest bytes it must move, as a formula (WORKLOADS.md's column).
    pub formula: &'static str,
    pub bytes: fn(Dims) -> u64,
    /// Whether its sizes are `rows x cols` (else `n`).
    pub rows: bool,
    /// The shape of each input and each output.
    pub inputs: fn(Dims) -> Vec<Vec<usize>>,
    pub outputs: fn(Dims) -> Vec<Vec<usize>>,
    pub variants: Vec<Variant>,
}

/// Workloads the language cannot express yet, with the feature each waits for.
pub const NOT_YET: [(&str, &str); 2] = [
    ("W3", "bias + GELU + dropout: needs randomness"),
    ("W7", "layernorm + int8 quantize: needs i8"),
];

const F32: u64 = 4;

fn flat(d: Dims) -> Vec<usize> {
    vec![d.n]
}

fn grid(d: Dims) -> Vec<usize> {
    vec![d.rows, d.cols]
}

/// The device-to-device copy (the ceiling) and fuse's own copy kernel.
pub fn copy() -> Workload {
    Workload {
        id: "copy",
        what: "y = x (bytes read + bytes written)",
        formula: "8n",
        bytes: |d| 2 * F32 * d.n as u64,
        rows: false,
        inputs: |d| vec![flat(d)],
        outputs: |d| vec![flat(d)],
        variants: vec![
            Variant {
                name: "cuMemcpyDtoD (Buffer::copy_to)",
                build: |_, _| Ok(Box::new(|i, o| i[0].copy_to(&mut o[0]))),
            },
            Variant {
                name: "fuse! y = x",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| identity::into(&dev, &i[0], &mut o[0])))
                },
            },
        ],
    }
}

/// Every workload the language expresses today, in WORKLOADS.md's order.
pub fn all() -> Vec<Workload> {
    vec![w1(), w2(), w3(), w4(), w5(), w6(), w7(), w8(), w9(), w10()]
}

/// A buffer for an intermediate result.
fn scratch(dev: &Device, shape: &[usize]) -> Result<Buffer<f32>, Error> {
    dev.zeros(shape)
}

/// Another handle to `b`'s elements, one-dimensional.
fn flat_view(b: &Buffer<f32>) -> Result<Buffer<f32>, Error> {
    b.reshape(&[b.len()])
}

pub fn w1() -> Workload {
    Workload {
        id: "W1",
        what: "y = ln(exp(x) + 1)",
        formula: "8n",
        bytes: |d| 2 * F32 * d.n as u64,
        rows: false,
        inputs: |d| vec![flat(d)],
        outputs: |d| vec![flat(d)],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| {
                        w1_softplus::into(&dev, &i[0], &mut o[0])
                    }))
                },
            },
            Variant {
                name: "unfused (3 kernels)",
                build: |dev, d| {
                    let dev = dev.clone();
                    let (mut e, mut t) = (scratch(&dev, &[d.n])?, scratch(&dev, &[d.n])?);
                    Ok(Box::new(move |i, o| {
                        op_exp::into(&dev, &i[0], &mut e)?;
                        op_add_scalar::into(&dev, &e, 1.0, &mut t)?;
                        op_ln::into(&dev, &t, &mut o[0])
                    }))
                },
            },
        ],
    }
}

pub fn w2() -> Workload {
    Workload {
        id: "W2",
        what: "y = gelu_tanh(a + b)",
        formula: "12n",
        bytes: |d| 3 * F32 * d.n as u64,
        rows: false,
        inputs: |d| vec![flat(d), flat(d)],
        outputs: |d| vec![flat(d)],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| {
                        w2_add_gelu::into(&dev, &i[0], &i[1], &mut o[0])
                    }))
                },
            },
            Variant {
                name: "unfused (2 kernels)",
                build: |dev, d| {
                    let dev = dev.clone();
                    let mut v = scratch(&dev, &[d.n])?;
                    Ok(Box::new(move |i, o| {
                        op_add::into(&dev, &i[0], &i[1], &mut v)?;
                        op_gelu_tanh::into(&dev, &v, &mut o[0])
                    }))
                },
            },
        ],
    }
}

/// W3's dropout seed: fixed, so every run (and the CPU check) draws the same mask.
const W3_SEED: u64 = 0x5eed_0003;

pub fn w3() -> Workload {
    Workload {
        id: "W3",
        what: "y = dropout(gelu(x + bias[col]), 0.1), Philox mask",
        formula: "8n + 4 cols",
        bytes: |d| 2 * F32 * d.n as u64 + F32 * d.cols as u64,
        rows: true,
        inputs: |d| vec![grid(d), vec![d.cols]],
        outputs: |d| vec![grid(d)],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| {
                        w3_bias_gelu_dropout::into(&dev, &i[0], &i[1], W3_SEED, &mut o[0])
                    }))
                },
            },
            Variant {
                name: "unfused (3 kernels)",
                build: |dev, d| {
                    let dev = dev.clone();
                    let mut biased = scratch(&dev, &[d.rows, d.cols])?;
                    let biased_flat = flat_view(&biased)?;
                    let mut act = scratch(&dev, &[d.n])?;
                    Ok(Box::new(move |i, o| {
                        op_add_bias::into(&dev, &i[0], &i[1], &mut biased)?;
                        op_gelu::into(&dev, &biased_flat, &mut act)?;
                        let mut out = flat_view(&o[0])?;
                        op_dropout::into(&dev, &act, W3_SEED, &mut out)
                    }))
                },
            },
        ],
    }
}

pub fn w4() -> Workload {
    Workload {
        id: "W4",
        what: "s = sum(exp(x))",
        formula: "4n",
        bytes: |d| F32 * d.n as u64,
        rows: false,
        inputs: |d| vec![flat(d)],
        outputs: |_| vec![vec![]],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| {
                        w4_sum_exp::into(&dev, &i[0], &mut o[0])
                    }))
                },
            },
            Variant {
                name: "unfused (2 kernels)",
                build: |dev, d| {
                    let dev = dev.clone();
                    let mut e = scratch(&dev, &[d.n])?;
                    Ok(Box::new(move |i, o| {
                        op_exp::into(&dev, &i[0], &mut e)?;
                        op_sum::into(&dev, &e, &mut o[0])
                    }))
                },
            },
        ],
    }
}

pub fn w5() -> Workload {
    Workload {
        id: "W5",
        what: "e = exp(x - max_row(x)); y = e / sum_row(e)",
        formula: "8n",
        bytes: |d| 2 * F32 * d.n as u64,
        rows: true,
        inputs: |d| vec![grid(d)],
        outputs: |d| vec![grid(d)],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| {
                        w5_softmax::into(&dev, &i[0], &mut o[0])
                    }))
                },
            },
            Variant {
                name: "unfused (5 kernels)",
                build: w5_unfused,
            },
        ],
    }
}

fn w5_unfused(dev: &Device, d: Dims) -> Result<Run, Error> {
    let dev = dev.clone();
    let (mut m, mut s) = (scratch(&dev, &[d.rows])?, scratch(&dev, &[d.rows])?);
    let mut x_minus_m = scratch(&dev, &[d.rows, d.cols])?;
    let x_minus_m_flat = flat_view(&x_minus_m)?;
    let mut e_flat = scratch(&dev, &[d.n])?;
    let e = e_flat.reshape(&[d.rows, d.cols])?;
    Ok(Box::new(move |i, o| {
        op_row_max::into(&dev, &i[0], &mut m)?;
        op_sub_row::into(&dev, &i[0], &m, &mut x_minus_m)?;
        op_exp::into(&dev, &x_minus_m_flat, &mut e_flat)?;
        op_row_sum::into(&dev, &e, &mut s)?;
        op_div_row::into(&dev, &e, &s, &mut o[0])
    }))
}

pub fn w6() -> Workload {
    Workload {
        id: "W6",
        what: "y = gelu((x - mean_row) * rsqrt(var_row + 1e-5) * gamma + beta)",
        formula: "8n + 8 cols",
        bytes: |d| 2 * F32 * d.n as u64 + 2 * F32 * d.cols as u64,
        rows: true,
        inputs: |d| vec![grid(d), vec![d.cols], vec![d.cols]],
        outputs: |d| vec![grid(d)],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| {
                        w6_layernorm_gelu::into(&dev, &i[0], &i[1], &i[2], &mut o[0])
                    }))
                },
            },
            Variant {
                name: "unfused (10 kernels)",
                build: w6_unfused,
            },
        ],
    }
}

fn w6_unfused(dev: &Device, d: Dims) -> Result<Run, Error> {
    let dev = dev.clone();
    let row = || scratch(&dev, &[d.rows]);
    let (mut mu, mut var, mut var_eps, mut rstd) = (row()?, row()?, row()?, row()?);
    let whole = || scratch(&dev, &[d.rows, d.cols]);
    let (mut centred, mut normed, mut scaled, mut shifted) =
        (whole()?, whole()?, whole()?, whole()?);
    let centred_flat = flat_view(&centred)?;
    let shifted_flat = flat_view(&shifted)?;
    let mut squares_flat = scratch(&dev, &[d.n])?;
    let squares = squares_flat.reshape(&[d.rows, d.cols])?;
    Ok(Box::new(move |i, o| {
        let (x, gamma, beta) = (&i[0], &i[1], &i[2]);
        op_row_mean::into(&dev, x, &mut mu)?;
        op_sub_row::into(&dev, x, &mu, &mut centred)?;
        op_square::into(&dev, &centred_flat, &mut squares_flat)?;
        op_row_mean::into(&dev, &squares, &mut var)?;
        op_add_scalar::into(&dev, &var, 1e-5, &mut var_eps)?;
        op_rsqrt::into(&dev, &var_eps, &mut rstd)?;
        op_mul_row::into(&dev, &centred, &rstd, &mut normed)?;
        op_mul_col::into(&dev, &normed, gamma, &mut scaled)?;
        op_add_col::into(&dev, &scaled, beta, &mut shifted)?;
        op_gelu::into(&dev, &shifted_flat, &mut flat_view(&o[0])?)
    }))
}

/// W7's output is the int8 tensor and a scale per row. The harness checks `f32` outputs, so the
/// variants keep `q` in a buffer of their own and return the scales, which depend on the whole
/// layernorm; the GPU tests check `q` itself (`layernorm_quantize`).
pub fn w7() -> Workload {
    Workload {
        id: "W7",
        what: "y = layernorm(x); scale = max_row(|y|) / 127; q = i8(round(y / scale))",
        formula: "5n + 4 rows + 8 cols",
        bytes: |d| 5 * d.n as u64 + F32 * d.rows as u64 + 2 * F32 * d.cols as u64,
        rows: true,
        inputs: |d| vec![grid(d), vec![d.cols], vec![d.cols]],
        outputs: |d| vec![vec![d.rows]],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, d| {
                    let dev = dev.clone();
                    let mut q = dev.zeros::<i8>(&[d.rows, d.cols])?;
                    Ok(Box::new(move |i, o| {
                        w7_layernorm_quantize::into(&dev, &i[0], &i[1], &i[2], &mut q, &mut o[0])
                    }))
                },
            },
            Variant {
                name: "unfused (13 kernels)",
                build: w7_unfused,
            },
        ],
    }
}

fn w7_unfused(dev: &Device, d: Dims) -> Result<Run, Error> {
    let dev = dev.clone();
    let row = || scratch(&dev, &[d.rows]);
    let (mut mu, mut var, mut var_eps, mut rstd, mut absmax) =
        (row()?, row()?, row()?, row()?, row()?);
    let whole = || scratch(&dev, &[d.rows, d.cols]);
    let (mut centred, mut normed, mut scaled, mut y) = (whole()?, whole()?, whole()?, whole()?);
    let centred_flat = flat_view(&centred)?;
    let y_flat = flat_view(&y)?;
    let mut squares_flat = scratch(&dev, &[d.n])?;
    let squares = squares_flat.reshape(&[d.rows, d.cols])?;
    let mut abs_flat = scratch(&dev, &[d.n])?;
    let abs = abs_flat.reshape(&[d.rows, d.cols])?;
    let mut q = dev.zeros::<i8>(&[d.rows, d.cols])?;
    Ok(Box::new(move |i, o| {
        let (x, gamma, beta) = (&i[0], &i[1], &i[2]);
        op_row_mean::into(&dev, x, &mut mu)?;
        op_sub_row::into(&dev, x, &mu, &mut centred)?;
        op_square::into(&dev, &centred_flat, &mut squares_flat)?;
        op_row_mean::into(&dev, &squares, &mut var)?;
        op_add_scalar::into(&dev, &var, 1e-5, &mut var_eps)?;
        op_rsqrt::into(&dev, &var_eps, &mut rstd)?;
        op_mul_row::into(&dev, &centred, &rstd, &mut normed)?;
        op_mul_col::into(&dev, &normed, gamma, &mut scaled)?;
        op_add_col::into(&dev, &scaled, beta, &mut y)?;
        op_abs::into(&dev, &y_flat, &mut abs_flat)?;
        op_row_max::into(&dev, &abs, &mut absmax)?;
        op_div_127::into(&dev, &absmax, &mut o[0])?;
        op_quantize::into(&dev, &y, &o[0], &mut q)
    }))
}

pub fn w8() -> Workload {
    Workload {
        id: "W8",
        what: "y = x * rsqrt(mean_row(x^2) + 1e-6) * w",
        formula: "8n + 4 cols",
        bytes: |d| 2 * F32 * d.n as u64 + F32 * d.cols as u64,
        rows: true,
        inputs: |d| vec![grid(d), vec![d.cols]],
        outputs: |d| vec![grid(d)],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| {
                        w8_rmsnorm::into(&dev, &i[0], &i[1], &mut o[0])
                    }))
                },
            },
            Variant {
                name: "unfused (6 kernels)",
                build: w8_unfused,
            },
        ],
    }
}

fn w8_unfused(dev: &Device, d: Dims) -> Result<Run, Error> {
    let dev = dev.clone();
    let row = || scratch(&dev, &[d.rows]);
    let (mut mean_sq, mut mean_eps, mut rms) = (row()?, row()?, row()?);
    let mut squares_flat = scratch(&dev, &[d.n])?;
    let squares = squares_flat.reshape(&[d.rows, d.cols])?;
    let mut normed = scratch(&dev, &[d.rows, d.cols])?;
    Ok(Box::new(move |i, o| {
        let (x, w) = (&i[0], &i[1]);
        op_square::into(&dev, &flat_view(x)?, &mut squares_flat)?;
        op_row_mean::into(&dev, &squares, &mut mean_sq)?;
        op_add_scalar::into(&dev, &mean_sq, 1e-6, &mut mean_eps)?;
        op_rsqrt::into(&dev, &mean_eps, &mut rms)?;
        op_mul_row::into(&dev, x, &rms, &mut normed)?;
        op_mul_col::into(&dev, &normed, w, &mut o[0])
    }))
}

/// W9's labels: pseudo-random from the row index, the same on every device (the harness's
/// inputs are f32, so the labels are made with the variant), uploaded once.
fn labels(dev: &Device, d: Dims) -> Result<Buffer<i64>, Error> {
    let cols = d.cols.max(1) as u64;
    let label: Vec<i64> = (0..d.rows as u64)
        .map(|r| (r.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) % cols) as i64)
        .collect();
    dev.upload(&label)
}

pub fn w9() -> Workload {
    Workload {
        id: "W9",
        what: "loss = logsumexp_row(x) - x[row, label[row]], labels i64",
        formula: "4n + 12 rows",
        bytes: |d| F32 * d.n as u64 + 12 * d.rows as u64,
        rows: true,
        inputs: |d| vec![grid(d)],
        outputs: |d| vec![vec![d.rows]],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, d| {
                    let (dev, label) = (dev.clone(), labels(dev, d)?);
                    Ok(Box::new(move |i, o| {
                        w9_cross_entropy::into(&dev, &i[0], &label, &mut o[0])
                    }))
                },
            },
            Variant {
                name: "unfused (3 kernels)",
                build: w9_unfused,
            },
        ],
    }
}

fn w9_unfused(dev: &Device, d: Dims) -> Result<Run, Error> {
    let (dev, label) = (dev.clone(), labels(dev, d)?);
    let (mut lse, mut picked) = (scratch(&dev, &[d.rows])?, scratch(&dev, &[d.rows])?);
    Ok(Box::new(move |i, o| {
        op_row_logsumexp::into(&dev, &i[0], &mut lse)?;
        op_row_pick::into(&dev, &i[0], &label, &mut picked)?;
        op_sub_rows::into(&dev, &lse, &picked, &mut o[0])
    }))
}

pub fn w10() -> Workload {
    Workload {
        id: "W10",
        what: "z = x * y; dz = dx * y + x * dy",
        formula: "24n",
        bytes: |d| 6 * F32 * d.n as u64,
        rows: false,
        inputs: |d| vec![flat(d), flat(d), flat(d), flat(d)],
        outputs: |d| vec![flat(d), flat(d)],
        variants: vec![
            Variant {
                name: "fused (1 kernel)",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| {
                        let (z, dz) = o.split_at_mut(1);
                        w10_tangent::into(&dev, &i[0], &i[1], &i[2], &i[3], &mut z[0], &mut dz[0])
                    }))
                },
            },
            Variant {
                name: "derived by #[jvp] (1 kernel)",
                build: |dev, _| {
                    let dev = dev.clone();
                    Ok(Box::new(move |i, o| {
                        let (z, dz) = o.split_at_mut(1);
                        // `w10_product::jvp`'s one launch, written into the outputs.
                        w10_product::__w10_product_j0::into(
                            &dev, &i[0], &i[1], &i[2], &i[3], &mut z[0], &mut dz[0],
                        )
                    }))
                },
            },
            Variant {
                name: "unfused (4 kernels)",
                build: |dev, d| {
                    let dev = dev.clone();
                    let (mut p, mut q) = (scratch(&dev, &[d.n])?, scratch(&dev, &[d.n])?);
                    Ok(Box::new(move |i, o| {
                        let (x, y, dx, dy) = (&i[0], &i[1], &i[2], &i[3]);
                        let (z, dz) = o.split_at_mut(1);
                        op_mul::into(&dev, x, y, &mut z[0])?;
                        op_mul::into(&dev, dx, y, &mut p)?;
                        op_mul::into(&dev, x, dy, &mut q)?;
                        op_add::into(&dev, &p, &q, &mut dz[0])
                    }))
                },
            },
        ],
    }
}
