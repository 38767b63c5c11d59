//! Cross-entropy's loss and its gradient in one pass over the logits: the mean over rows of
//! `logsumexp(z) - z[label]`, whose cotangent `1 / rows` a row is known before the forward
//! runs, so `value_and_vjp` (from `#[vjp(z)]`) reads the logits once and writes `dz` once, in
//! one launch. Checked against `softmax(z) - onehot(label)` in plain Rust, in f64.
//!
//! Run it with `cargo run --example cross_entropy_grad`. It exits with status 1 if the results
//! disagree.

use std::process::ExitCode;

use fuse_runtime::{bf16, fuse, Device, Error};

fuse! {
    /// The loss of each row: `logsumexp(z) - z[label]`, computed in f32 from bf16 logits. The
    /// label's logit is gathered; its gradient goes back to the label's column.
    #[vjp(z)]
    pub fn cross_entropy(z: [bf16; rows, vocab], label: [i64; rows]) -> [f32; rows] {
        logsumexp(z as f32, vocab) - (z[.., label] as f32)
    }
}

const ROWS: usize = 13;
const VOCAB: usize = 5003;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("FAILED: the results disagree");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, Error> {
    let mut seed = 11u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 11
    };
    let z: Vec<bf16> = (0..ROWS * VOCAB)
        .map(|_| bf16::from_f64(8.0 * ((next() as f64 / (1u64 << 53) as f64) - 0.5)))
        .collect();
    let labels: Vec<i64> = (0..ROWS).map(|_| (next() % VOCAB as u64) as i64).collect();

    let dev = Device::detect();
    println!("cross-entropy over {ROWS} rows of {VOCAB} logits (bf16), on {dev}");
    let zs = dev.upload(&z)?.reshape(&[ROWS, VOCAB])?;
    let ls = dev.upload(&labels)?;
    // The mean over rows: each row's loss weighs 1 / rows.
    let d = dev.upload(&[1.0 / ROWS as f32; ROWS])?;
    let (loss, grads) = cross_entropy::value_and_vjp(&dev, &zs, &ls, &d)?;
    println!("launches: {}", cross_entropy::VALUE_AND_VJP_LAUNCHES);
    let mean = loss.to_vec()?.iter().map(|&v| f64::from(v)).sum::<f64>() / ROWS as f64;

    // In f64: loss = lse - z[label], dz = (softmax(z) - onehot(label)) / rows.
    let (mut want_mean, mut want_dz) = (0.0, vec![0.0f64; ROWS * VOCAB]);
    for r in 0..ROWS {
        let row: Vec<f64> = z[r * VOCAB..(r + 1) * VOCAB]
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        let lse = m + s.ln();
        want_mean += (lse - row[labels[r] as usize]) / ROWS as f64;
        for (j, v) in row.iter().enumerate() {
            let onehot = if j as i64 == labels[r] { 1.0 } else { 0.0 };
            want_dz[r * VOCAB + j] = ((v - lse).exp() - onehot) / ROWS as f64;
        }
    }
    let dz: Vec<f64> = grads.z.to_vec()?.iter().map(|v| v.to_f64()).collect();
    let loss_ok = (mean - want_mean).abs() <= 1e-5 * want_mean.abs().max(1.0);
    let scale = want_dz.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let worst = dz
        .iter()
        .zip(&want_dz)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0f64, f64::max);
    // bf16 keeps 8 bits: two roundings' worth of the largest gradient.
    let dz_ok = worst <= 2.0 * 2f64.powi(-8) * scale;
    println!(
        "  mean loss {mean:.6} (f64 {want_mean:.6})  {}",
        if loss_ok { "ok" } else { "MISMATCH" }
    );
    println!(
        "  dz: largest difference {worst:.2e} of {scale:.2e}  {}",
        if dz_ok { "ok" } else { "MISMATCH" }
    );
    Ok(loss_ok && dz_ok)
}
