//! RMSNorm of a 61 x 1028 bf16 matrix followed by fp8 (e4m3) quantization with one scale per
//! token, in one fused kernel (vLLM's `rms_norm_dynamic_per_token_quant`), run on the detected
//! device and on the CPU backend, and checked against plain Rust in f64.
//!
//! Run it with `cargo run --example fp8_quantize`. It exits with status 1 if the results
//! disagree.

use std::process::ExitCode;

use fuse_runtime::{bf16, fuse, Device, Error, F8E4M3};

fuse! {
    /// `y = x * rsqrt(mean(x²) + eps) * w` over `h`, token by token, then fp8 quantization of
    /// `y` with one scale per token: `scale = max(|y|) / 448` (e4m3's largest value) and
    /// `q = y * (1 / scale)` rounded to e4m3 (to nearest even, saturating), as vLLM computes it,
    /// so that `q * scale` gives `y` back to within half a step of e4m3 (1/16 of the value).
    ///
    /// The sum of squares and the absolute maximum both reduce over `h`, the second using the
    /// first, so this is one launch; the launch writes one byte per element and one `f32` per
    /// token. (Multiplying by the inverse also keeps rows of 2048 in registers without spills;
    /// a division an element there spilled.)
    pub fn rmsnorm_fp8(x: [bf16; t, h], w: [bf16; h], eps: f32) -> ([f8e4m3; t, h], [f32; t]) {
        let xf = x as f32;
        let y = xf * rsqrt(mean(xf * xf, h) + eps) * (w as f32);
        let scale = max(y.abs(), h) / 448.0;
        ((y * (1.0 / scale)) as f8e4m3, scale)
    }
}

const T: usize = 61;
const H: usize = 1028;
const EPS: f32 = 1e-6;

/// One implementation's results: `q` token by token, and a scale per token.
struct Quantized {
    q: Vec<F8E4M3>,
    scale: Vec<f32>,
}

fn quantize_on(dev: &Device, x: &[bf16], w: &[bf16]) -> Result<Quantized, Error> {
    let xb = dev.upload(x)?.reshape(&[T, H])?;
    let (q, scale) = rmsnorm_fp8(dev, &xb, &dev.upload(w)?, EPS)?;
    Ok(Quantized {
        q: q.to_vec()?,
        scale: scale.to_vec()?,
    })
}

/// RMSNorm in plain Rust, in f64: `y`, token by token.
fn rmsnorm_f64(x: &[bf16], w: &[bf16]) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(H) {
        let ms = row.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / H as f64;
        let rstd = 1.0 / (ms + f64::from(EPS)).sqrt();
        y.extend(
            row.iter()
                .zip(w)
                .map(|(v, g)| v.to_f64() * rstd * g.to_f64()),
        );
    }
    y
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
    // Tokens of different magnitudes (0.1 to 10), which the per-token scale takes out.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut x = Vec::with_capacity(T * H);
    for _ in 0..T {
        let spread = 10f32.powf(rng.uniform(-1.0, 1.0));
        x.extend((0..H).map(|_| bf16::from_f32(spread * rng.uniform(-1.0, 1.0))));
    }
    let w: Vec<bf16> = (0..H)
        .map(|_| bf16::from_f32(rng.uniform(0.5, 1.5)))
        .collect();
    let y = rmsnorm_f64(&x, &w);

    let dev = Device::detect();
    println!("RMSNorm + fp8 e4m3 quantization of a {T} x {H} bf16 matrix, on {dev}");
    let got = quantize_on(&dev, &x, &w)?;
    let mut ok = check(&format!("{dev} vs f64"), &got, &y);
    if dev.is_cuda() {
        let cpu = quantize_on(&Device::cpu(), &x, &w)?;
        ok &= check("CPU vs f64", &cpu, &y);
        // The same f32 values round to the same codes; `rsqrtf` and the sums' order may move a
        // value across a rounding boundary, by one code.
        let apart = got
            .q
            .iter()
            .zip(&cpu.q)
            .filter(|(g, c)| g.to_bits() != c.to_bits())
            .count();
        let far = got.q.iter().zip(&cpu.q).any(|(g, c)| {
            let (g, c) = (g.to_bits(), c.to_bits());
            g & 0x80 != c & 0x80 || (g & 0x7f).abs_diff(c & 0x7f) > 1
        });
        println!(
            "  {dev} vs CPU: {apart} codes differ, none by more than one: {}",
            !far
        );
        ok &= !far;
    }
    println!("scale of tokens 0 to 3: {:?}", &got.scale[..4]);
    let first: Vec<f32> = got.q[..8].iter().map(|q| q.to_f32()).collect();
    println!("q of token 0 starts {first:?}");
    Ok(ok)
}

/// Checks `got` against the f64 `y`: each scale within 1e-5 of `max(|y|) / 448`, each `q * scale`
/// within half a step of e4m3 of `y` (1/16 relative, or half the least subnormal step), and
/// each token reaching ±448. Prints the result; `true` when it holds.
fn check(what: &str, got: &Quantized, y: &[f64]) -> bool {
    let (mut worst_scale, mut worst_steps, mut full) = (0.0f64, 0.0f64, true);
    for (r, row) in y.chunks(H).enumerate() {
        let want = row.iter().fold(0.0f64, |m, v| m.max(v.abs())) / 448.0;
        let scale = f64::from(got.scale[r]);
        worst_scale = worst_scale.max((scale - want).abs() / want);
        let q = &got.q[r * H..(r + 1) * H];
        full &= q.iter().any(|v| v.to_f32().abs() == 448.0);
        for (v, &y) in q.iter().zip(row) {
            let exact = y / scale;
            let half_step = (exact.abs() / 16.0).max(2f64.powi(-10));
            worst_steps = worst_steps.max((f64::from(v.to_f32()) - exact).abs() / half_step);
        }
    }
    // f32 rounding of `y` and of the scale moves `y / scale` by far less than the slack here.
    let ok = worst_scale <= 1e-5 && worst_steps <= 1.01 && full;
    let verdict = if ok { "ok" } else { "MISMATCH" };
    println!(
        "  {what}: scale relative difference {worst_scale:.2e}; largest rounding error \
         {worst_steps:.3} of half a step; every token reaches 448: {full}  {verdict}"
    );
    ok
}

/// A small deterministic random number generator (xorshift64*), so the example needs no
/// dependencies and prints the same numbers on every run.
struct Rng(u64);

impl Rng {
    /// A number drawn uniformly from `[lo, hi)`.
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        lo + (hi - lo) * (bits as f32 / (1u32 << 24) as f32)
    }
}
