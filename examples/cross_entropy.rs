//! Softmax cross-entropy and the predicted class of each row of a 257 x 1000 matrix of logits,
//! in one fused kernel, run on the detected device and on the CPU backend, and checked against
//! plain Rust in f64.
//!
//! Run it with `cargo run --example cross_entropy`. It exits with status 1 if the results
//! disagree.

use std::process::ExitCode;

use fuse_runtime::{fuse, Device, Error};

fuse! {
    /// The loss `logsumexp(x) - x[label]` of each row, and the row's predicted class.
    ///
    /// `x[.., label]` gathers each row's logit at its label. A label outside `0..cols` reads
    /// 0.0, so its loss is the bare `logsumexp`, not a panic. `logsumexp` subtracts the row's
    /// max before `exp`, so large logits do not overflow. Both reductions run over `cols` and
    /// both outputs are `[rows]`, so this is one launch: a block per row. (The same pick as a
    /// one-hot sum, `sum(if index(cols) as i64 == label { x } else { 0.0 }, cols)`, computes
    /// the same values but tests the label in every element.)
    pub fn cross_entropy(x: [f32; rows, cols], label: [i64; rows]) -> ([f32; rows], [u32; rows]) {
        (logsumexp(x, cols) - x[.., label], argmax(x, cols))
    }
}

const ROWS: usize = 257;
const COLS: usize = 1000;

/// Agreement expected for the losses. Each is the difference of two f32 numbers as large as the
/// logits (up to 58 here, where one unit in the last place is 3.8e-6), after a 1000-term sum of
/// `exp` (in another order on the GPU) and its logarithm: a few such units, below this.
const TOLERANCE: f64 = 2e-5;

/// Runs `cross_entropy` on `dev` and copies `(loss, predicted class)` back.
fn cross_entropy_on(dev: &Device, x: &[f32], label: &[i64]) -> Result<(Vec<f32>, Vec<u32>), Error> {
    let x = dev.upload(x)?.reshape(&[ROWS, COLS])?;
    let label = dev.upload(label)?;
    let (loss, class) = cross_entropy(dev, &x, &label)?;
    Ok((loss.to_vec()?, class.to_vec()?))
}

/// The loss in f64 and the first position of the largest logit, per row, in plain Rust.
fn cross_entropy_f64(x: &[f32], label: &[i64]) -> (Vec<f64>, Vec<u32>) {
    let (mut losses, mut classes) = (Vec::with_capacity(ROWS), Vec::with_capacity(ROWS));
    for (row, &label) in x.chunks(COLS).zip(label) {
        let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        losses.push(lse - row[label as usize]);
        // Ties go to the lowest index, as in the kernel: only a strictly larger value moves it.
        let best = (0..COLS).fold(0, |best, j| if row[j] > row[best] { j } else { best });
        classes.push(best as u32);
    }
    (losses, classes)
}

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
    // Logits in [-4, 4), offset by up to ±50 per row (the loss does not change, `exp` would
    // overflow without the max), and the label's logit raised by 0 to 8: a model that is
    // sometimes right.
    let mut rng = Rng::new(5);
    let mut x = Vec::with_capacity(ROWS * COLS);
    let mut label = Vec::with_capacity(ROWS);
    for r in 0..ROWS {
        let offset = rng.uniform(-50.0, 50.0);
        x.extend((0..COLS).map(|_| offset + rng.uniform(-4.0, 4.0)));
        let class = (rng.uniform(0.0, 1.0) * COLS as f32) as usize;
        x[r * COLS + class] += rng.uniform(0.0, 8.0);
        label.push(class as i64);
    }
    let want = cross_entropy_f64(&x, &label);

    let dev = Device::detect();
    println!("cross-entropy of {ROWS} rows of {COLS} logits, on {dev}");
    if dev.is_cpu() {
        println!("(no CUDA GPU found: running on the CPU only)");
    }
    let got = cross_entropy_on(&dev, &x, &label)?;
    let mut ok = compare(&format!("{dev} vs f64"), &got, &want);
    if dev.is_cuda() {
        let cpu = cross_entropy_on(&Device::cpu(), &x, &label)?;
        ok &= compare("CPU vs f64", &cpu, &want);
        let cpu = (cpu.0.iter().map(|&v| f64::from(v)).collect(), cpu.1);
        ok &= compare(&format!("{dev} vs CPU"), &got, &cpu);
    }

    let (loss, class) = got;
    let mean_loss = loss.iter().map(|&v| f64::from(v)).sum::<f64>() / ROWS as f64;
    let right = (0..ROWS)
        .filter(|&r| i64::from(class[r]) == label[r])
        .count();
    let accuracy = right as f64 / ROWS as f64;
    println!("mean loss {mean_loss:.4}, accuracy {right}/{ROWS} = {accuracy:.3}");
    Ok(ok)
}

/// Compares the losses within [`TOLERANCE`] and the classes exactly (argmax of the same f32
/// values has one answer); prints the outcome and returns `true` when both hold.
fn compare(what: &str, got: &(Vec<f32>, Vec<u32>), want: &(Vec<f64>, Vec<u32>)) -> bool {
    let mut err = 0.0f64;
    for (&g, &w) in got.0.iter().zip(&want.0) {
        // A NaN is kept, so that it fails the check below.
        let diff = (f64::from(g) - w).abs();
        if diff.is_nan() || diff > err {
            err = diff;
        }
    }
    let wrong_class = (0..ROWS).filter(|&r| got.1[r] != want.1[r]).count();
    let ok = err <= TOLERANCE && wrong_class == 0;
    let verdict = if ok { "ok" } else { "MISMATCH" };
    println!(
        "  {what}: loss max abs difference {err:.3e} (tolerance {TOLERANCE:.0e}), \
         argmax differs in {wrong_class} rows  {verdict}"
    );
    ok
}

/// A small deterministic random number generator (xorshift64*), so the example needs no
/// dependencies and prints the same numbers on every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // The state must never be zero.
        Rng(seed | 1)
    }

    /// A number drawn uniformly from `[lo, hi)`.
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        // The top 24 bits of the scrambled state: exactly representable in an f32.
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        lo + (hi - lo) * (bits as f32 / (1u32 << 24) as f32)
    }
}
