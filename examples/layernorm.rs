//! Layer normalisation of a 53 x 769 matrix with learned `gamma` and `beta`, in one fused
//! kernel that also returns `rstd` per row; run on the detected device and on the CPU backend,
//! and checked against plain Rust in f64.
//!
//! Run it with `cargo run --example layernorm`. It exits with status 1 if the results disagree.

use std::process::ExitCode;

use fuse_runtime::{fuse, Device, Error};

fuse! {
    /// `y = (x - mean) * rstd * gamma + beta` over `cols`, row by row, where
    /// `rstd = 1 / sqrt(var + eps)`; also returns `rstd`, one per row, for a backward pass.
    ///
    /// `gamma` and `beta` are `[cols]`: they broadcast over the rows by dim name. The variance
    /// reduces `d * d`, which depends on the mean: reductions may nest when they run over the
    /// same dim. The outputs are over `[rows, cols]` and over `[rows]` (one value per row), so
    /// this is one launch.
    pub fn layernorm(x: [f32; rows, cols], gamma: [f32; cols], beta: [f32; cols], eps: f32)
        -> ([f32; rows, cols], [f32; rows])
    {
        let d = x - mean(x, cols);
        let rstd = rsqrt(mean(d * d, cols) + eps);
        (d * rstd * gamma + beta, rstd)
    }
}

const ROWS: usize = 53;
const COLS: usize = 769;
const EPS: f32 = 1e-5;

/// Agreement expected between two implementations, for `y` (values up to about 10) and for
/// `rstd` (about 0.1 to 1): f32 rounding of two 769-term means stays far below these.
const Y_TOLERANCE: f64 = 1e-4;
const RSTD_TOLERANCE: f64 = 1e-5;

/// The kernel's inputs on the host.
struct Inputs {
    x: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

/// Runs `layernorm` on `dev` and copies `(y, rstd)` back.
fn layernorm_on(dev: &Device, input: &Inputs) -> Result<(Vec<f32>, Vec<f32>), Error> {
    let x = dev.upload(&input.x)?.reshape(&[ROWS, COLS])?;
    let gamma = dev.upload(&input.gamma)?;
    let beta = dev.upload(&input.beta)?;
    // Scalars are passed as plain Rust values; a tuple of outputs comes back as a tuple.
    let (y, rstd) = layernorm(dev, &x, &gamma, &beta, EPS)?;
    Ok((y.to_vec()?, rstd.to_vec()?))
}

/// Layer normalisation in plain Rust, in f64.
fn layernorm_f64(input: &Inputs) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut rstds) = (Vec::with_capacity(input.x.len()), Vec::with_capacity(ROWS));
    for row in input.x.chunks(COLS) {
        let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        let mean = row.iter().sum::<f64>() / COLS as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / COLS as f64;
        let rstd = 1.0 / (var + f64::from(EPS)).sqrt();
        for (j, v) in row.iter().enumerate() {
            let (g, b) = (f64::from(input.gamma[j]), f64::from(input.beta[j]));
            y.push((v - mean) * rstd * g + b);
        }
        rstds.push(rstd);
    }
    (y, rstds)
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
    // Each row has its own offset (up to ±10) and spread (0.5 to 4.5), which layernorm removes.
    let mut rng = Rng::new(11);
    let mut x = Vec::with_capacity(ROWS * COLS);
    for _ in 0..ROWS {
        let (offset, spread) = (rng.uniform(-10.0, 10.0), rng.uniform(0.5, 4.5));
        x.extend((0..COLS).map(|_| offset + spread * rng.uniform(-1.0, 1.0)));
    }
    let gamma = (0..COLS).map(|_| rng.uniform(0.5, 1.5)).collect();
    let beta = (0..COLS).map(|_| rng.uniform(-0.5, 0.5)).collect();
    let input = Inputs { x, gamma, beta };
    let (want_y, want_rstd) = layernorm_f64(&input);

    let dev = Device::detect();
    println!("layernorm over the rows of a {ROWS} x {COLS} matrix, eps = {EPS}, on {dev}");
    if dev.is_cpu() {
        println!("(no CUDA GPU found: running on the CPU only)");
    }
    let (y, rstd) = layernorm_on(&dev, &input)?;
    let mut ok = compare(&format!("{dev} vs f64"), (&y, &rstd), (&want_y, &want_rstd));
    if dev.is_cuda() {
        let (cpu_y, cpu_rstd) = layernorm_on(&Device::cpu(), &input)?;
        ok &= compare("CPU vs f64", (&cpu_y, &cpu_rstd), (&want_y, &want_rstd));
        let (cpu_y, cpu_rstd) = (widen(&cpu_y), widen(&cpu_rstd));
        ok &= compare(&format!("{dev} vs CPU"), (&y, &rstd), (&cpu_y, &cpu_rstd));
    }
    println!("rstd of rows 0 to 3: {:?}", &rstd[..4]);
    println!("y of row 0 starts {:?}", &y[..4]);
    Ok(ok)
}

/// Prints the largest differences of `y` and of `rstd`; `true` when both are within tolerance.
fn compare(what: &str, got: (&[f32], &[f32]), want: (&[f64], &[f64])) -> bool {
    let (dy, dr) = (max_abs_diff(got.0, want.0), max_abs_diff(got.1, want.1));
    let ok = dy <= Y_TOLERANCE && dr <= RSTD_TOLERANCE;
    let verdict = if ok { "ok" } else { "MISMATCH" };
    println!("  {what}: max abs difference y {dy:.3e}, rstd {dr:.3e}  {verdict}");
    ok
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

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
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
