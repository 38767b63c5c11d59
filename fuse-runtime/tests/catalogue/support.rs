//! The catalogue's test support: a seeded generator, uploads, and results checked against a
//! reference with a tolerance, kept so that the GPU test can compare two devices' results.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use fuse_runtime::{bf16, Buffer, Device, Element, F8E4M3};

/// A splitmix64 generator. [`Rng::fresh`] seeds it from the clock, or from `FUSE_SEED`, and
/// prints the seed (shown when the test fails).
pub struct Rng(u64);

impl Rng {
    pub fn fresh() -> Rng {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let seed = match std::env::var("FUSE_SEED") {
            Ok(text) => {
                let text = text.trim();
                let parsed = match text.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => text.parse(),
                };
                parsed.unwrap_or_else(|e| panic!("FUSE_SEED={text:?} is not a u64: {e}"))
            }
            Err(_) => {
                let nanos = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                nanos
                    ^ COUNT
                        .fetch_add(1, Ordering::Relaxed)
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            }
        };
        eprintln!("random inputs from seed {seed:#x}; replay with FUSE_SEED={seed:#x}");
        Rng(seed)
    }

    pub fn seeded(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// `n` floats uniform in `[lo, hi)`, never all zero.
    pub fn f32s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n).map(|_| self.uniform(lo, hi)).collect();
        if v.iter().all(|&x| x == 0.0) && n > 0 {
            v[0] = 1.0;
        }
        v
    }

    /// Like [`Rng::f32s`], with about one value in `every` replaced by one of `specials`.
    pub fn f32s_special(&mut self, n: usize, lo: f32, hi: f32, specials: &[f32]) -> Vec<f32> {
        let mut v = self.f32s(n, lo, hi);
        for x in &mut v {
            if self.below(6) == 0 {
                *x = specials[self.below(specials.len() as u64) as usize];
            }
        }
        v
    }

    /// `n` bf16 values uniform in `[lo, hi)`.
    pub fn bf16s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<bf16> {
        to_bf16(&self.f32s(n, lo, hi))
    }
}

/// The values NaN, infinities and signed zeros, which many originals treat on purpose.
pub const SPECIALS: [f32; 6] = [
    f32::NAN,
    -f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
];

/// Each value rounded to bf16 (to nearest, ties to even).
pub fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// `x` rounded to bf16 and back: what storing it to a `bf16` does.
pub fn rb(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// `x` in e4m3 by CUDA's `__NV_SATFINITE` conversion (every NaN to `0x7f`), as an f32.
pub fn e4m3(x: f32) -> f32 {
    match x.is_nan() {
        true => f32::NAN,
        false => F8E4M3::from_f32(x).to_f32(),
    }
}

/// `x / (1 + e^-x)` in f32, as vLLM's `silu_kernel`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `0.5 x (1 + erf(x / sqrt 2))` in f32, as vLLM's `gelu_kernel`.
pub fn gelu(x: f32) -> f32 {
    x * 0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// PyTorch's tanh GELU in f32.
pub fn gelu_tanh(x: f32) -> f32 {
    let beta = (2.0f32 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + (beta * (x + 0.044715 * x * x * x)).tanh())
}

/// `rsqrt(mean(v²) + eps)` of each row of `h` values, in f64 then f32.
pub fn rstd_rows(v: &[f32], h: usize, eps: f32) -> Vec<f32> {
    v.chunks(h.max(1))
        .map(|row| {
            let ms = row
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>()
                / h as f64;
            (1.0 / (ms + f64::from(eps)).sqrt()) as f32
        })
        .collect()
}

/// A buffer of `shape` on `dev` holding `data`.
#[track_caller]
pub fn put<T: Element>(dev: &Device, data: &[T], shape: &[usize]) -> Buffer<T> {
    dev.upload(data)
        .and_then(|b| b.reshape(shape))
        .expect("upload a buffer")
}

/// A scalar on the device (a buffer of shape `[]`).
#[track_caller]
pub fn scalar(dev: &Device, x: f32) -> Buffer<f32> {
    put(dev, &[x], &[])
}

/// A buffer's elements as f64.
#[track_caller]
pub fn read<T: Element + Into<f64>>(b: &Buffer<T>) -> Vec<f64> {
    b.to_vec()
        .expect("read a buffer back")
        .into_iter()
        .map(Into::into)
        .collect()
}

/// A buffer of fp8 e4m3 as the values of its codes.
#[track_caller]
pub fn read_e4m3(b: &Buffer<F8E4M3>) -> Vec<f64> {
    b.to_vec()
        .expect("read a buffer back")
        .iter()
        .map(|x| x.to_f64())
        .collect()
}

/// One output of one call: its values, the reference's, and how far they may be apart
/// (`|got - want| <= abs + rel |want|`; NaN matches NaN, an infinity only itself).
pub struct Out {
    pub what: String,
    pub got: Vec<f64>,
    pub want: Vec<f64>,
    pub rel: f64,
    pub abs: f64,
}

/// An output `what` whose values `got` must be `want` within `rel` and `abs`.
pub fn out(what: impl Into<String>, got: Vec<f64>, want: Vec<f64>, rel: f64, abs: f64) -> Out {
    Out {
        what: what.into(),
        got,
        want,
        rel,
        abs,
    }
}

/// The reference as f64s.
pub fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Asserts that `got` matches `want` element by element, naming the first that does not.
#[track_caller]
pub fn assert_near(what: &str, got: &[f64], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: got {} values, want {}",
        got.len(),
        want.len()
    );
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let same = g == w || (g.is_nan() && w.is_nan());
        let near = g.is_finite() && w.is_finite() && (g - w).abs() <= abs + rel * w.abs();
        assert!(
            same || near,
            "{what}: element {i} of {}: got {g:e}, want {w:e} (rel {rel:e}, abs {abs:e})",
            got.len()
        );
    }
}

/// Asserts every output against its reference.
#[track_caller]
pub fn check(outs: &[Out]) {
    assert!(!outs.is_empty(), "a case checks something");
    for o in outs {
        assert!(!o.want.is_empty(), "{}: no values", o.what);
        assert_near(&o.what, &o.got, &o.want, o.rel, o.abs);
    }
}
