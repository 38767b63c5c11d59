//! Fitting the parameters of a LayerNorm followed by GELU to a target by gradient descent:
//! the squared error's gradients with respect to `gamma` and `beta` come from `#[vjp]`, one
//! call a step. The gradients are first checked against central finite differences; the loop
//! then runs until the error has fallen a hundredfold.
//!
//! Run it with `cargo run --example fit_layernorm`. It exits with status 1 if the gradients
//! disagree with finite differences or the fit does not converge.

use std::process::ExitCode;

use fuse_runtime::{fuse, Device, Error};

fuse! {
    /// The squared error of `gelu(layernorm(x) * gamma + beta)` against `target`, one sum a
    /// row. Its gradients with respect to `gamma` and `beta` are sums over the rows.
    #[vjp(gamma, beta)]
    pub fn error(x: [f32; rows, cols], gamma: [f32; cols], beta: [f32; cols], target: [f32; rows, cols])
        -> [f32; rows]
    {
        let d = x - mean(x, cols);
        let y = gelu(d * rsqrt(mean(d * d, cols) + 1e-5) * gamma + beta);
        sum((y - target) * (y - target), cols)
    }

    /// One step of gradient descent: `p - lr * g`.
    pub fn step(p: [f32; cols], g: [f32; cols], lr: f32) -> [f32; cols] {
        p - lr * g
    }
}

const ROWS: usize = 64;
const COLS: usize = 24;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, Error> {
    let mut seed = 3u64;
    let mut uniform = |lo: f32, hi: f32| -> f32 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lo + (hi - lo) * ((seed >> 40) as f32 / (1u32 << 24) as f32)
    };
    let x: Vec<f32> = (0..ROWS * COLS).map(|_| uniform(-3.0, 3.0)).collect();
    let true_gamma: Vec<f32> = (0..COLS).map(|_| uniform(0.5, 2.0)).collect();
    let true_beta: Vec<f32> = (0..COLS).map(|_| uniform(-1.0, 1.0)).collect();

    let dev = Device::detect();
    println!("fitting LayerNorm + GELU's gamma and beta ({COLS} each) to {ROWS} rows, on {dev}");
    let xs = dev.upload(&x)?.reshape(&[ROWS, COLS])?;
    // The target: the model at the true parameters (computed on the host, in f64).
    let target = model(&x, &true_gamma, &true_beta);
    let target_buf = dev.upload(&target)?.reshape(&[ROWS, COLS])?;
    // The cotangent of each row's error: the mean over rows.
    let ones = dev.upload(&[1.0 / ROWS as f32; ROWS])?;

    let mut gamma = dev.upload(&[1.0f32; COLS])?;
    let mut beta = dev.upload(&[0.0f32; COLS])?;
    let total = |e: &[f32]| e.iter().map(|&v| f64::from(v)).sum::<f64>() / ROWS as f64;

    // The gradients against central differences of the total error, at the start.
    let grads = error::vjp(&dev, &xs, &gamma, &beta, &target_buf, &ones)?;
    let (g0, b0) = (gamma.to_vec()?, beta.to_vec()?);
    let loss_at = |g: &[f32], b: &[f32]| -> Result<f64, Error> {
        let e = error(&dev, &xs, &dev.upload(g)?, &dev.upload(b)?, &target_buf)?;
        Ok(total(&e.to_vec()?))
    };
    let mut worst = 0.0f64;
    for (which, got) in [(0, grads.gamma.to_vec()?), (1, grads.beta.to_vec()?)] {
        for j in 0..COLS {
            let h = 1e-2f32;
            let (mut up, mut down) = if which == 0 {
                (g0.clone(), g0.clone())
            } else {
                (b0.clone(), b0.clone())
            };
            up[j] += h;
            down[j] -= h;
            let (lu, ld) = if which == 0 {
                (loss_at(&up, &b0)?, loss_at(&down, &b0)?)
            } else {
                (loss_at(&g0, &up)?, loss_at(&g0, &down)?)
            };
            let numeric = (lu - ld) / (2.0 * f64::from(h));
            worst = worst.max((f64::from(got[j]) - numeric).abs() / numeric.abs().max(1.0));
        }
    }
    println!("gradients against finite differences: largest relative difference {worst:.2e}");
    if worst > 2e-2 {
        eprintln!("FAILED: the gradients disagree with finite differences");
        return Ok(false);
    }

    let first = loss_at(&g0, &b0)?;
    let mut last = first;
    for i in 0..2000 {
        let (e, grads) = error::value_and_vjp(&dev, &xs, &gamma, &beta, &target_buf, &ones)?;
        last = total(&e.to_vec()?);
        if i % 200 == 0 {
            println!("  step {i:4}: squared error {last:.6}");
        }
        if last < first / 100.0 {
            println!("  step {i:4}: squared error {last:.6}, a hundredth of the first");
            break;
        }
        gamma = step(&dev, &gamma, &grads.gamma, 0.2)?;
        beta = step(&dev, &beta, &grads.beta, 0.2)?;
    }
    if last >= first / 100.0 {
        eprintln!("FAILED: the error went from {first} to {last} only");
        return Ok(false);
    }
    Ok(true)
}

/// The model in plain Rust: `gelu(layernorm(x) * gamma + beta)`, f64 inside.
fn model(x: &[f32], gamma: &[f32], beta: &[f32]) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(COLS) {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / COLS as f64;
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / COLS as f64;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        for (j, &v) in row.iter().enumerate() {
            let z = (f64::from(v) - mean) * rstd * f64::from(gamma[j]) + f64::from(beta[j]);
            y.push((0.5 * z * (1.0 + erf(z / std::f64::consts::SQRT_2))) as f32);
        }
    }
    y
}

/// The error function (Abramowitz and Stegun 7.1.26, within 1.5e-7).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let p = t
        * (0.254829592
            + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    (1.0 - p * (-x * x).exp()).copysign(x)
}
