//! Bias add, GELU and dropout (p = 0.1) over a 61 x 1003 matrix, in one fused kernel, run on the
//! detected device and on the CPU backend, and checked against plain Rust in f64.
//!
//! The dropout mask is never stored: plain Rust draws it again from the seed with
//! `fuse_runtime::random`, as a backward pass would, and it must match the kernel's exactly.
//!
//! Run it with `cargo run --example dropout`. It exits with status 1 if the results disagree.

use std::process::ExitCode;

use fuse_runtime::{fuse, random, Device, Error};

fuse! {
    /// `dropout(gelu(x + bias), 0.1, seed)`: the bias broadcasts over the rows, GELU is the erf
    /// form, and each element is zeroed with probability 0.1, or else scaled by 1 / 0.9.
    ///
    /// The mask comes from a counter-based generator (Philox): element `i` is dropped exactly
    /// when `random::uniform(seed, i, 0) < 0.1`, where `i` is its row-major position and 0 the
    /// stream (this is the kernel's first random call). It depends on (seed, position, stream)
    /// only, not on the thread or the device that draws it, so the GPU and the CPU backend draw
    /// the same mask, bit for bit. With no reduction, this is a map: one launch, one thread per
    /// element.
    pub fn bias_gelu_dropout(x: [f32; rows, cols], bias: [f32; cols], seed: u64)
        -> [f32; rows, cols]
    {
        dropout(gelu(x + bias), 0.1, seed)
    }
}

const ROWS: usize = 61;
const COLS: usize = 1003;
const P: f32 = 0.1;
/// Any seed will do: another one draws another mask, and the checks below still hold.
const SEED: u64 = 0x5eed_2024;

/// Agreement expected for the kept values (up to about 4.4): f32 rounding of `x + bias`, of
/// `erf` and of the scaling by 1 / 0.9 is a few units in the last place, far below this.
const TOLERANCE: f64 = 1e-5;

/// Runs `bias_gelu_dropout` on `dev` and copies the result back.
fn forward_on(dev: &Device, x: &[f32], bias: &[f32]) -> Result<Vec<f32>, Error> {
    let x = dev.upload(x)?.reshape(&[ROWS, COLS])?;
    let bias = dev.upload(bias)?;
    bias_gelu_dropout(dev, &x, &bias, SEED)?.to_vec()
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
    let mut rng = Rng::new(3);
    let x: Vec<f32> = (0..ROWS * COLS).map(|_| rng.uniform(-3.0, 3.0)).collect();
    let bias: Vec<f32> = (0..COLS).map(|_| rng.uniform(-1.0, 1.0)).collect();

    // The mask rebuilt on the host from the seed and each position alone: what a backward pass
    // does instead of storing it. `P` is an f32, as `0.1` is in the kernel next to `x: f32`.
    let dropped: Vec<bool> = (0..ROWS * COLS)
        .map(|i| random::uniform(SEED, i as u64, 0) < P)
        .collect();
    // The kept values in f64: gelu(x + b) * (1 / (1 - p)).
    let want: Vec<f64> = (0..ROWS * COLS)
        .map(|i| gelu(f64::from(x[i]) + f64::from(bias[i % COLS])) / (1.0 - f64::from(P)))
        .collect();

    let dev = Device::detect();
    println!("dropout(gelu(x + bias), {P}, seed) over a {ROWS} x {COLS} matrix, on {dev}");
    if dev.is_cpu() {
        println!("(no CUDA GPU found: running on the CPU only)");
    }
    let got = forward_on(&dev, &x, &bias)?;
    let mut ok = check(&format!("{dev} vs f64"), &got, &dropped, &want);
    if dev.is_cuda() {
        let cpu = forward_on(&Device::cpu(), &x, &bias)?;
        ok &= check("CPU vs f64", &cpu, &dropped, &want);
        // Both match the host mask already; compare the two devices directly as well.
        let same = got
            .iter()
            .zip(&cpu)
            .all(|(g, c)| (*g == 0.0) == (*c == 0.0));
        println!("  {dev} and CPU zero the same positions: {same}");
        ok &= same;
    }

    // About 1 - p of the elements survive; the exact fraction depends on the seed.
    let kept = got.iter().filter(|&&y| y != 0.0).count();
    let (n, fraction) = (ROWS * COLS, kept as f64 / (ROWS * COLS) as f64);
    println!("kept {kept} of {n} elements: {fraction:.4} (1 - p = 0.9)");
    Ok(ok)
}

/// Checks one result: the zero positions against the host mask exactly, and the kept values
/// against `want` within [`TOLERANCE`]. Prints the outcome; `true` when both hold.
fn check(what: &str, got: &[f32], dropped: &[bool], want: &[f64]) -> bool {
    let (mut wrong_mask, mut err) = (0, 0.0f64);
    for ((&y, &d), &w) in got.iter().zip(dropped).zip(want) {
        // No kept value here is exactly 0 (that would need `x + b == 0`), so zero means dropped.
        wrong_mask += usize::from((y == 0.0) != d);
        if !d {
            // A NaN is kept, so that it fails the check below.
            let diff = (f64::from(y) - w).abs();
            if diff.is_nan() || diff > err {
                err = diff;
            }
        }
    }
    let ok = got.len() == want.len() && wrong_mask == 0 && err <= TOLERANCE;
    let verdict = if ok { "ok" } else { "MISMATCH" };
    println!(
        "  {what}: mask differs at {wrong_mask} positions; kept values: max abs difference \
         {err:.3e} (tolerance {TOLERANCE:.0e})  {verdict}"
    );
    ok
}

/// GELU in its erf form, in f64: `0.5 x (1 + erf(x / √2))`.
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// erf in f64 (std has none), from the series `2/√π e^(-z²) Σ 2^n z^(2n+1) / (1·3·…·(2n+1))`:
/// its terms share one sign, so nothing cancels. Past |z| = 6, erf is ±1 to within 1e-17.
fn erf(z: f64) -> f64 {
    if z.abs() > 6.0 {
        return z.signum();
    }
    let (mut term, mut total, mut n) = (z, z, 0.0);
    while term.abs() > 1e-17 * total.abs() {
        n += 1.0;
        term *= 2.0 * z * z / (2.0 * n + 1.0);
        total += term;
    }
    std::f64::consts::FRAC_2_SQRT_PI * (-z * z).exp() * total
}

/// A small deterministic random number generator (xorshift64*) for the inputs, so the example
/// needs no dependencies and prints the same numbers on every run.
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
