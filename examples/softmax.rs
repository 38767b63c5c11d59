//! Softmax over the rows of a 37 x 1031 matrix, in one fused kernel, run on the detected device
//! and on the CPU backend, and checked against plain Rust in f64.
//!
//! Run it with `cargo run --example softmax`. It exits with status 1 if the results disagree.

use std::process::ExitCode;

use fuse_runtime::{fuse, Device, Error};

fuse! {
    /// Softmax over `cols`, row by row: `exp(x - max) / sum(exp(x - max))`.
    ///
    /// Subtracting the row's max keeps `exp` from overflowing, and does not change the result.
    /// Both reductions run over the same dim, `cols`, and their `[rows]` results broadcast back
    /// over each row, so the whole function is one launch: a block per row, reading the row
    /// from memory and writing it once.
    pub fn softmax(x: [f32; rows, cols]) -> [f32; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }
}

const ROWS: usize = 37;
const COLS: usize = 1031;

/// Agreement expected between two implementations: outputs lie in [0, 1], and f32 rounding of
/// `exp` and of a 1031-term sum (in a different order on the GPU) stays far below this.
const TOLERANCE: f64 = 1e-6;

/// Runs `softmax` on `dev` and copies the result back.
fn softmax_on(dev: &Device, x: &[f32]) -> Result<Vec<f32>, Error> {
    let x = dev.upload(x)?.reshape(&[ROWS, COLS])?;
    // `softmax::into` writes into a buffer you allocated: in a loop, allocate once and reuse it.
    // `softmax(dev, &x)` would allocate the output itself.
    let mut y = dev.zeros::<f32>(&[ROWS, COLS])?;
    softmax::into(dev, &x, &mut y)?;
    y.to_vec()
}

/// Softmax in plain Rust, in f64.
fn softmax_f64(x: &[f32]) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(COLS) {
        let max = row
            .iter()
            .map(|&v| f64::from(v))
            .fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|&v| (f64::from(v) - max).exp()).collect();
        let total: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| v / total));
    }
    out
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
    // Logits in [-8, 8), each row shifted by up to ±540: without subtracting the max, `exp`
    // of those would overflow an f32.
    let mut rng = Rng::new(7);
    let x: Vec<f32> = (0..ROWS * COLS)
        .map(|i| rng.uniform(-8.0, 8.0) + ((i / COLS) as f32 - 18.0) * 30.0)
        .collect();
    let want = softmax_f64(&x);

    let dev = Device::detect();
    println!("softmax over the rows of a {ROWS} x {COLS} matrix, on {dev}");
    if dev.is_cpu() {
        println!("(no CUDA GPU found: running on the CPU only)");
    }
    let got = softmax_on(&dev, &x)?;
    let mut ok = report(&format!("{dev} vs f64"), max_abs_diff(&got, &want));
    if dev.is_cuda() {
        let cpu = softmax_on(&Device::cpu(), &x)?;
        ok &= report("CPU vs f64", max_abs_diff(&cpu, &want));
        let cpu: Vec<f64> = cpu.iter().map(|&v| f64::from(v)).collect();
        ok &= report(&format!("{dev} vs CPU"), max_abs_diff(&got, &cpu));
    }

    // Every row of a softmax sums to 1.
    let worst_row = got
        .chunks(COLS)
        .map(|row| (row.iter().map(|&v| f64::from(v)).sum::<f64>() - 1.0).abs())
        .fold(0.0, f64::max);
    println!("row sums differ from 1 by at most {worst_row:.2e}");
    println!("row 0 starts {:?}", &got[..4]);
    Ok(ok && worst_row < 1e-5)
}

/// The largest `|got - want|`; a NaN anywhere, or a length mismatch, counts as infinite.
fn max_abs_diff(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .fold(0.0, |worst, d| {
            if d.is_nan() {
                f64::INFINITY
            } else {
                worst.max(d)
            }
        })
}

/// Prints one comparison; `true` when it is within [`TOLERANCE`].
fn report(what: &str, err: f64) -> bool {
    let ok = err <= TOLERANCE;
    let verdict = if ok { "ok" } else { "MISMATCH" };
    println!("  {what}: max abs difference {err:.3e} (tolerance {TOLERANCE:.0e})  {verdict}");
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
