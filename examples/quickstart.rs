//! Quickstart: three fused kernels, run on the GPU if there is one and on the CPU otherwise,
//! checked against plain Rust.
//!
//! Run it with `cargo run --example quickstart`. To start your own kernels, copy this file and
//! change the `fuse!` block; the language is described in `doc/language.md`.

use std::process::ExitCode;

use fuse_runtime::{fuse, Device, Error};

// Each `fn` in `fuse!` becomes one GPU kernel (one launch), plus the same function as Rust for
// the CPU. A type `[f32; rows, cols]` is a tensor of `f32` whose dims are named; the names are
// bound to sizes when the kernel is called, and tensors combine by dim name. The body is written
// for one element, like ordinary Rust on `f32`.
fuse! {
    /// softplus(x) = ln(1 + e^x), in the form that does not overflow for large `x`.
    /// (The language also has it built in, as `softplus(x)`.)
    pub fn softplus(x: [f32; n]) -> [f32; n] {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }

    /// Softmax over each row. `max(x, cols)` and `sum(e, cols)` reduce over `cols`; their
    /// results (one per row) broadcast back over the row. Still one launch: a block per row.
    pub fn softmax(x: [f32; rows, cols]) -> [f32; rows, cols] {
        let e = (x - max(x, cols)).exp();
        e / sum(e, cols)
    }

    /// The sum of squares and the largest magnitude of a whole vector: two reductions over
    /// every element, in one launch. Each scalar output is a one-element buffer.
    pub fn norms(x: [f32; n]) -> (f32, f32) {
        (sum(x * x), max(x.abs()))
    }
}

/// What the three kernels computed, copied back to the host.
struct Results {
    softplus: Vec<f32>,
    softmax: Vec<f32>,
    sum_sq: f32,
    max_abs: f32,
}

/// Uploads the inputs to `dev`, runs the three kernels there and copies the results back.
fn run_kernels(dev: &Device, v: &[f32], m: &[f32], rows: usize) -> Result<Results, Error> {
    // `upload` copies host data to the device as a 1-D buffer; `reshape` gives it a shape.
    let v = dev.upload(v)?;
    let m = dev.upload(m)?.reshape(&[rows, m.len() / rows])?;
    // A kernel takes the device, then its inputs; it allocates its outputs on that device. The
    // dims (`n`, `rows`, `cols`) are read from the buffers' shapes; buffers whose shapes
    // disagree with the signature give an `Error`, not a panic.
    let y = softplus(dev, &v)?;
    let p = softmax(dev, &m)?;
    let (sum_sq, max_abs) = norms(dev, &v)?;
    // `to_vec` copies to the host; on a GPU it first waits for the kernels to finish.
    Ok(Results {
        softplus: y.to_vec()?,
        softmax: p.to_vec()?,
        sum_sq: sum_sq.to_vec()?[0],
        max_abs: max_abs.to_vec()?[0],
    })
}

/// The same functions in plain Rust, in `f64`, to check the kernels against.
struct Reference {
    softplus: Vec<f64>,
    softmax: Vec<f64>,
    sum_sq: f64,
    max_abs: f64,
}

fn reference(v: &[f32], m: &[f32], cols: usize) -> Reference {
    let v: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
    let softplus = v
        .iter()
        .map(|&x| x.max(0.0) + (-x.abs()).exp().ln_1p())
        .collect();
    let mut softmax = Vec::with_capacity(m.len());
    for row in m.chunks(cols) {
        let row: Vec<f64> = row.iter().map(|&x| f64::from(x)).collect();
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = row.iter().map(|&x| (x - max).exp()).sum();
        softmax.extend(row.iter().map(|&x| (x - max).exp() / total));
    }
    Reference {
        softplus,
        softmax,
        sum_sq: v.iter().map(|x| x * x).sum(),
        max_abs: v.iter().map(|x| x.abs()).fold(0.0, f64::max),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("FAILED: a result is outside its tolerance");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs everything; `Ok(false)` when a check fails.
fn run() -> Result<bool, Error> {
    // The first CUDA GPU if a driver and a GPU are there, else the CPU. Kernels are compiled
    // for the GPU by NVRTC on first use, and cached on disk for the next run.
    let dev = Device::detect();
    if dev.is_cuda() {
        println!("Running on {dev}");
    } else {
        println!("No CUDA GPU found: running on the CPU (the Rust code `fuse!` generated)");
    }

    // Odd sizes on purpose: nothing needs to be a multiple of a block size.
    let (n, rows, cols) = (10_007, 7, 1_001);
    let mut rng = Rng::new(2024);
    let v: Vec<f32> = (0..n).map(|_| rng.uniform(-12.0, 12.0)).collect();
    let m: Vec<f32> = (0..rows * cols).map(|_| rng.uniform(-5.0, 5.0)).collect();

    let got = run_kernels(&dev, &v, &m, rows)?;
    println!("\nsoftplus, the first 4 of {n} elements:");
    println!("  x = {:?}", &v[..4]);
    println!("  y = {:?}", &got.softplus[..4]);
    let row0: f32 = got.softmax[..cols].iter().sum();
    println!(
        "softmax of a {rows} x {cols} matrix: row 0 starts {:?}",
        &got.softmax[..3]
    );
    println!("  and sums to {row0}");
    println!(
        "norms: sum(x * x) = {}, max(|x|) = {}",
        got.sum_sq, got.max_abs
    );

    // Tolerances: f32 elementwise math is within a few units in the last place; reductions
    // are within about `1e-5 * sum(|terms|)` (the GPU sums in f32, in a different order).
    let want = reference(&v, &m, cols);
    println!("\nChecked against plain Rust in f64:");
    let mut ok = report(
        "softplus",
        max_abs_diff(&got.softplus, &want.softplus),
        1e-5,
    );
    ok &= report("softmax", max_abs_diff(&got.softmax, &want.softmax), 1e-6);
    let sum_tol = 1e-5 * want.sum_sq;
    ok &= report(
        "sum(x * x)",
        max_abs_diff(&[got.sum_sq], &[want.sum_sq]),
        sum_tol,
    );
    ok &= report(
        "max(|x|)",
        max_abs_diff(&[got.max_abs], &[want.max_abs]),
        0.0,
    );

    // On a GPU, run the same kernels on the CPU backend too: both must agree.
    if dev.is_cuda() {
        let cpu = run_kernels(&Device::cpu(), &v, &m, rows)?;
        println!("\n{dev} and the CPU backend:");
        ok &= report(
            "softplus",
            max_abs_diff(&got.softplus, &widen(&cpu.softplus)),
            1e-5,
        );
        ok &= report(
            "softmax",
            max_abs_diff(&got.softmax, &widen(&cpu.softmax)),
            1e-6,
        );
        let sum_cpu = f64::from(cpu.sum_sq);
        ok &= report(
            "sum(x * x)",
            max_abs_diff(&[got.sum_sq], &[sum_cpu]),
            sum_tol,
        );
        let max_cpu = f64::from(cpu.max_abs);
        ok &= report("max(|x|)", max_abs_diff(&[got.max_abs], &[max_cpu]), 0.0);
        if ok {
            println!("GPU and CPU agree.");
        }
    }

    // The CUDA C that `fuse!` generated at compile time, embedded in this binary.
    println!("\nThe generated CUDA C of `softplus` (softplus::CUDA_SOURCE):\n");
    println!("{}", softplus::CUDA_SOURCE);
    let mut names: Vec<&str> = fuse_runtime::kernels().map(|k| k.name).collect();
    names.sort_unstable();
    println!("Kernels in this binary: {}", names.join(", "));
    Ok(ok)
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

/// Prints one check's result; `true` when `err` is within `tol`.
fn report(what: &str, err: f64, tol: f64) -> bool {
    let ok = err <= tol;
    let verdict = if ok { "ok" } else { "MISMATCH" };
    println!("  {what:<11} max abs difference {err:.3e} (tolerance {tol:.1e})  {verdict}");
    ok
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
