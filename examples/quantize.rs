//! Layer normalisation of a 61 x 1028 matrix followed by int8 quantization with one scale per
//! row, in one fused kernel, run on the detected device and on the CPU backend, and checked
//! against plain Rust in f64.
//!
//! Run it with `cargo run --example quantize`. It exits with status 1 if the results disagree.

use std::process::ExitCode;

use fuse_runtime::{fuse, Device, Error};

fuse! {
    /// `y = (x - mean) * rstd * gamma + beta` over `cols`, row by row, then symmetric int8
    /// quantization of `y` with one scale per row: `scale = max(|y|) / 127` and
    /// `q = round(y / scale)`, so that `q * scale` gives `y` back to within half a step.
    ///
    /// The mean, the variance and the absolute maximum all reduce over `cols`, each using the
    /// one before, so this is one launch. A row that fits in registers (a length that is a
    /// multiple of 4, up to 4096) is read from memory once, and the passes over it run there;
    /// the launch writes one byte per element and one `f32` per row, a quarter of what `y`
    /// would take. `round` takes halves away from zero, and `clamp` keeps `q` in [-127, 127],
    /// so that the range is symmetric: the largest `|y|` of each row becomes exactly ±127.
    pub fn layernorm_quantize(x: [f32; rows, cols], gamma: [f32; cols], beta: [f32; cols], eps: f32)
        -> ([i8; rows, cols], [f32; rows])
    {
        let mu = mean(x, cols);
        let d = x - mu;
        let y = d * rsqrt(mean(d * d, cols) + eps) * gamma + beta;
        let scale = max(y.abs(), cols) / 127.0;
        ((y / scale).round().clamp(-127.0, 127.0) as i8, scale)
    }
}

const ROWS: usize = 61;
const COLS: usize = 1028;
const EPS: f32 = 1e-5;

/// Agreement expected for `scale`, relative: the f32 `y` is within about 1e-6 of the f64 one,
/// far below this.
const SCALE_TOLERANCE: f64 = 1e-5;

/// How close to a half-integer `y / scale` must be for two implementations to round it to
/// neighbouring integers: f32 rounding moves `y / scale` (up to 127) by about 1e-4 at most.
const BOUNDARY: f64 = 1e-3;

/// The kernel's inputs on the host.
struct Inputs {
    x: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

/// One implementation's results: `q` row by row, and a scale per row.
struct Quantized {
    q: Vec<i8>,
    scale: Vec<f64>,
}

/// Runs `layernorm_quantize` on `dev` and copies `(q, scale)` back.
fn quantize_on(dev: &Device, input: &Inputs) -> Result<Quantized, Error> {
    let x = dev.upload(&input.x)?.reshape(&[ROWS, COLS])?;
    let gamma = dev.upload(&input.gamma)?;
    let beta = dev.upload(&input.beta)?;
    let (q, scale) = layernorm_quantize(dev, &x, &gamma, &beta, EPS)?;
    let scale = scale.to_vec()?.iter().map(|&s| f64::from(s)).collect();
    Ok(Quantized {
        q: q.to_vec()?,
        scale,
    })
}

/// Layer normalisation in plain Rust, in f64: `y`, row by row.
fn layernorm_f64(input: &Inputs) -> Vec<f64> {
    let mut y = Vec::with_capacity(input.x.len());
    for row in input.x.chunks(COLS) {
        let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        let mean = row.iter().sum::<f64>() / COLS as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / COLS as f64;
        let rstd = 1.0 / (var + f64::from(EPS)).sqrt();
        for (j, v) in row.iter().enumerate() {
            let (g, b) = (f64::from(input.gamma[j]), f64::from(input.beta[j]));
            y.push((v - mean) * rstd * g + b);
        }
    }
    y
}

/// The quantization in plain Rust, in f64. `f64::round` also takes halves away from zero.
fn quantize_f64(y: &[f64]) -> Quantized {
    let mut out = Quantized {
        q: Vec::with_capacity(y.len()),
        scale: Vec::with_capacity(ROWS),
    };
    for row in y.chunks(COLS) {
        let scale = row.iter().fold(0.0, |m: f64, v| m.max(v.abs())) / 127.0;
        out.q.extend(
            row.iter()
                .map(|v| (v / scale).round().clamp(-127.0, 127.0) as i8),
        );
        out.scale.push(scale);
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
    // Each row has its own offset (up to ±10) and spread (0.5 to 4.5), which layernorm removes.
    let mut rng = Rng::new(17);
    let mut x = Vec::with_capacity(ROWS * COLS);
    for _ in 0..ROWS {
        let (offset, spread) = (rng.uniform(-10.0, 10.0), rng.uniform(0.5, 4.5));
        x.extend((0..COLS).map(|_| offset + spread * rng.uniform(-1.0, 1.0)));
    }
    let gamma = (0..COLS).map(|_| rng.uniform(0.5, 1.5)).collect();
    let beta = (0..COLS).map(|_| rng.uniform(-0.5, 0.5)).collect();
    let input = Inputs { x, gamma, beta };
    let y = layernorm_f64(&input);
    let want = quantize_f64(&y);

    let dev = Device::detect();
    println!("layernorm + int8 quantization of a {ROWS} x {COLS} matrix, on {dev}");
    if dev.is_cpu() {
        println!("(no CUDA GPU found: running on the CPU only)");
    }
    let got = quantize_on(&dev, &input)?;
    let mut ok = compare(&format!("{dev} vs f64"), &got, &want, &y);
    if dev.is_cuda() {
        let cpu = quantize_on(&Device::cpu(), &input)?;
        ok &= compare("CPU vs f64", &cpu, &want, &y);
        ok &= compare(&format!("{dev} vs CPU"), &got, &cpu, &y);
    }
    ok &= check_range(&got) & check_dequantized(&got, &y);
    // What the launch writes: a byte per element and four per row, against four per element
    // for `y` itself in f32.
    let (written, as_f32) = (got.q.len() + 4 * got.scale.len(), 4 * got.q.len());
    println!("wrote {written} bytes (q and the scales); y in f32 would be {as_f32}");
    let scales: Vec<f32> = got.scale[..4].iter().map(|&s| s as f32).collect();
    println!("scale of rows 0 to 3: {scales:?}");
    println!("q of row 0 starts {:?}", &got.q[..8]);
    Ok(ok)
}

/// Compares `got` with `want`: the scales within [`SCALE_TOLERANCE`], and `q` equal except an
/// off-by-one where `y / scale` lies within [`BOUNDARY`] of a half-integer, where the two
/// may round to different sides. Prints the result; `true` when they agree.
fn compare(what: &str, got: &Quantized, want: &Quantized, y: &[f64]) -> bool {
    let scale_err = got
        .scale
        .iter()
        .zip(&want.scale)
        .map(|(g, w)| (g - w).abs() / w)
        .fold(0.0, |worst, d| {
            if d.is_nan() {
                f64::INFINITY
            } else {
                worst.max(d)
            }
        });
    let (mut near_half, mut wrong) = (0, 0);
    for (i, (&g, &w)) in got.q.iter().zip(&want.q).enumerate() {
        let ratio = y[i] / want.scale[i / COLS];
        let at_boundary = ((ratio.abs().fract() - 0.5).abs()) < BOUNDARY;
        match (i16::from(g) - i16::from(w)).abs() {
            0 => {}
            1 if at_boundary => near_half += 1,
            _ => wrong += 1,
        }
    }
    let ok = scale_err <= SCALE_TOLERANCE && wrong == 0 && got.q.len() == want.q.len();
    let verdict = if ok { "ok" } else { "MISMATCH" };
    println!(
        "  {what}: scale relative difference {scale_err:.3e}; q differs at {wrong} elements, \
         and by one at {near_half} on a rounding boundary  {verdict}"
    );
    ok
}

/// Checks that every `q` lies in [-127, 127] and that each row reaches ±127 at its largest
/// `|y|`: the clamp and the per-row scale together use the whole symmetric range.
fn check_range(got: &Quantized) -> bool {
    let in_range = got.q.iter().all(|&v| v != i8::MIN);
    let saturated = got
        .q
        .chunks(COLS)
        .all(|row| row.iter().any(|v| v.unsigned_abs() == 127));
    println!("  q in [-127, 127]: {in_range}; every row reaches ±127: {saturated}");
    in_range && saturated
}

/// Prints the largest dequantization error `|q * scale - y|`, which rounding to nearest keeps
/// within half a step (`scale / 2`) of each row, plus f32 rounding; `true` when it does.
fn check_dequantized(got: &Quantized, y: &[f64]) -> bool {
    let (mut worst, mut worst_steps) = (0.0f64, 0.0f64);
    for (i, (&q, &y)) in got.q.iter().zip(y).enumerate() {
        let scale = got.scale[i / COLS];
        let err = (f64::from(q) * scale - y).abs();
        worst = worst.max(err);
        worst_steps = worst_steps.max(err / scale);
    }
    let ok = worst_steps <= 0.5 + BOUNDARY;
    let verdict = if ok { "ok" } else { "TOO LARGE" };
    println!(
        "  max dequantization error |q * scale - y| = {worst:.3e} ({worst_steps:.4} of a \
         step; at most 0.5)  {verdict}"
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
