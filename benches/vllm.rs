//! V2, V3 and V4 (`shared/WORKLOADS.md`): RMSNorm with vLLM's dynamic per-token fp8
//! quantization, vLLM's NEOX rotary embedding with its cos/sin cache gathered by position, and
//! its KV-cache write (rows scattered to slots), in bf16 at WORKLOADS.md's shapes (`t = 8192`
//! tokens, `h = 4096`, 32 heads of 128, a cache of 8192 positions and of `4 t` slots). Each is
//! checked on a few tokens against the same kernel on the CPU backend (bit for bit for the
//! write, one step of the output type for the others, whose f32 math may round differently),
//! then timed over the fewest bytes it must move.

use fuse_runtime::{bf16, Buffer, Device, Error, F8E4M3};

use crate::kernels::*;
use crate::measure;
use crate::report::{Row, Status};
use crate::runner::Runner;

const HEADS: usize = 32;
const HEAD: usize = 128;
const POSITIONS: usize = 8192;
const TOKENS: usize = 8192;

/// The tokens of a check: a few, odd, so that a partial last block runs.
const CHECK_TOKENS: usize = 37;

/// `n` positions of a cache of `len`, spread over it (the slot map of V4 is distinct).
fn positions(n: usize, len: usize, seed: u64) -> Vec<i64> {
    let mut state = seed | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % len as u64) as i64
        })
        .collect()
}

fn bf16s(n: usize, seed: u64) -> Vec<bf16> {
    measure::normal(n, seed)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

fn put<T: fuse_runtime::Element>(
    dev: &Device,
    data: &[T],
    shape: &[usize],
) -> Result<Buffer<T>, Error> {
    dev.upload(data)?.reshape(shape)
}

/// The first element where `got` and `want` differ by more than `ulps` bf16 ulps and `abs`.
fn differ(got: &[bf16], want: &[bf16], ulps: f32, abs: f32) -> Option<String> {
    let bad = got.iter().zip(want).position(|(g, w)| {
        let (g, w) = (g.to_f32(), w.to_f32());
        !((g - w).abs() <= ulps * (bf16::EPSILON.to_f32() * w.abs() + 1e-38) + abs || g == w)
    });
    bad.map(|i| format!("index {i}: got {}, CPU {}", got[i], want[i]))
}

/// V0: the copy at the V rows' size, `4 t 4096` bytes (64 MiB each way at `t = 8192`), as
/// `cuMemcpyDtoD` and as `fuse! y = x`. The copy ceiling is measured over 2 GB; a kernel of
/// 40 us also pays its launch, its first loads' latency and its last wave, and this row says
/// how much of the ceiling a copy of that size reaches, the measure of V2-V4.
pub fn v0(runner: &mut Runner) {
    let t = TOKENS.min(runner.sizes.sweep_total / (HEADS * HEAD)).max(1);
    // f32 elements of `t * 4096` bf16 ones' bytes.
    let n = (t * HEADS * HEAD / 2).max(1);
    let seed = runner.seeds.next();
    let dev = runner.dev.clone();
    let data = measure::normal(n, seed);
    for variant in ["cuMemcpyDtoD (Buffer::copy_to)", "fuse! y = x"] {
        let mut row = Row::new(
            "V0",
            &format!("copy, {variant}, {n} f32 (V3's and V4's bytes)"),
        );
        row.bytes = Some(8 * n as u64);
        row.formula = "4 t 4096".into();
        row.definition = "y = x at the V rows' size".into();
        let fused = variant.starts_with("fuse!");
        let copy = |x: &Buffer<f32>, y: &mut Buffer<f32>| match fused {
            true => identity::into(&dev, x, y),
            false => x.copy_to(y),
        };
        // Checked once, then timed.
        let checked = (|| {
            let (x, mut y) = (put(&dev, &data, &[n])?, dev.zeros::<f32>(&[n])?);
            copy(&x, &mut y)?;
            Ok::<_, Error>((y.to_vec()? == data, x, y))
        })();
        match checked {
            Ok((false, _, _)) => {
                (row.status, row.note) = (Status::Failed, "the copy differs from its input".into())
            }
            Ok((true, x, mut y)) => match runner.time_runs(|_| copy(&x, &mut y)) {
                Ok(timing) => row.timing = Some(timing),
                Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
            },
            Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
        }
        runner.push(row);
    }
}

/// V2's hidden size.
const HIDDEN: usize = 4096;

/// V2: `x: [t, 4096]` normed, then quantized to e4m3 by a scale a token.
pub fn v2(runner: &mut Runner) {
    let t = TOKENS.min(runner.sizes.sweep_total / HIDDEN).max(1);
    let mut row = Row::new(
        "V2",
        &format!("rmsnorm + per-token fp8 quantize, bf16 {t}x{HIDDEN}"),
    );
    row.bytes = Some((3 * t * HIDDEN + 4 * t) as u64);
    row.formula = "3 t h + 4 t".into();
    row.definition =
        "y = rmsnorm(x) * w; s = max_row(|y|) / 448; q = e4m3(y / s); outputs q, s".into();
    let seed = runner.seeds.next();
    let w = bf16s(HIDDEN, seed ^ 1);
    let run = |dev: &Device, t: usize| -> Result<(Vec<F8E4M3>, Vec<f32>), Error> {
        let x = put(dev, &bf16s(t * HIDDEN, seed), &[t, HIDDEN])?;
        let (q, s) = v2_rmsnorm_fp8(dev, &x, &put(dev, &w, &[HIDDEN])?)?;
        Ok((q.to_vec()?, s.to_vec()?))
    };
    let checked = run(&Device::cpu(), CHECK_TOKENS)
        .and_then(|want| Ok((run(&runner.dev, CHECK_TOKENS)?, want)));
    let close = |g: f32, w: f32, rel: f32| (g - w).abs() <= rel * w.abs() || g == w;
    match checked {
        Ok(((q, s), (want_q, want_s))) => {
            // A value on a rounding boundary may round either way (the backends' `y / s` differ
            // in their last bits): one e4m3 step, 1/8 of a normal value, 2^-9 among the
            // subnormals (3 against 4 steps failed one run in several on an H200).
            let step = |g: f32, w: f32| close(g, w, 0.125) || (g - w).abs() <= 2f32.powi(-9);
            let bad_q = q
                .iter()
                .zip(&want_q)
                .position(|(g, w)| !step(g.to_f32(), w.to_f32()));
            let bad_s = s
                .iter()
                .zip(&want_s)
                .position(|(&g, &w)| !close(g, w, 1e-5));
            if let Some(i) = bad_q {
                (row.status, row.note) = (
                    Status::Failed,
                    format!("q index {i}: got {}, CPU {}", q[i], want_q[i]),
                );
            } else if let Some(i) = bad_s {
                (row.status, row.note) = (
                    Status::Failed,
                    format!("s index {i}: got {}, CPU {}", s[i], want_s[i]),
                );
            } else {
                let dev = runner.dev.clone();
                let inputs = (|| {
                    let x = put(&dev, &bf16s(t * HIDDEN, seed), &[t, HIDDEN])?;
                    let w = put(&dev, &w, &[HIDDEN])?;
                    let q = dev.zeros::<F8E4M3>(&[t, HIDDEN])?;
                    let s = dev.zeros::<f32>(&[t])?;
                    Ok::<_, Error>((x, w, q, s))
                })();
                let timing = inputs.and_then(|(x, w, mut q, mut s)| {
                    runner.time_runs(|_| v2_rmsnorm_fp8::into(&dev, &x, &w, &mut q, &mut s))
                });
                match timing {
                    Ok(timing) => row.timing = Some(timing),
                    Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
                }
            }
        }
        Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
    }
    runner.push(row);
}

/// V3: the rotation of `q: [t, 32, 128]` by the cache rows of `pos`, into one output.
pub fn v3(runner: &mut Runner) {
    let t = TOKENS.min(runner.sizes.sweep_total / (HEADS * HEAD)).max(1);
    let mut row = Row::new(
        "V3",
        &format!("rotary neox, cache gathered by position, bf16 {t}x{HEADS}x{HEAD}"),
    );
    row.bytes = Some((4 * t * HEADS * HEAD + 4 * t * HEAD + 8 * t) as u64);
    row.formula = "4 t 4096 + 4 t 128 + 8 t".into();
    row.definition = "y = rotate(q, cache[pos]): halves x1, x2 of each head; x1 cos - x2 sin, x2 cos + x1 sin, in f32".into();
    let seed = runner.seeds.next();
    let run = |dev: &Device, t: usize| -> Result<Vec<bf16>, Error> {
        let pos = put(dev, &positions(t, POSITIONS, seed), &[t])?;
        let cache = measure::normal(POSITIONS * HEAD, seed ^ 1);
        let cache = put(dev, &cache, &[POSITIONS, HEAD])?;
        let q = put(dev, &bf16s(t * HEADS * HEAD, seed ^ 2), &[t, HEADS, HEAD])?;
        let mut out = put(dev, &vec![bf16::NAN; t * HEADS * HEAD], &[t, HEADS, HEAD])?;
        v3_rotary(dev, &pos, &cache, &q, &mut out)?;
        out.to_vec()
    };
    let checked = run(&Device::cpu(), CHECK_TOKENS)
        .and_then(|want| Ok((run(&runner.dev, CHECK_TOKENS)?, want)));
    match checked {
        // `x1 * cos - x2 * sin` cancels, and the GPU contracts it into one FMA: the two
        // backends' f32 values differ by a rounding of a product (|q|, |cache| up to about 5
        // here: 25 * 2^-24), which bf16 can round to two steps apart (seen on an H200).
        Ok((got, want)) => match differ(&got, &want, 1.0, 4e-6) {
            Some(why) => (row.status, row.note) = (Status::Failed, why),
            None => {
                let dev = runner.dev.clone();
                let inputs = (|| {
                    let pos = put(&dev, &positions(t, POSITIONS, seed), &[t])?;
                    let cache = put(
                        &dev,
                        &measure::normal(POSITIONS * HEAD, seed ^ 1),
                        &[POSITIONS, HEAD],
                    )?;
                    let q = put(&dev, &bf16s(t * HEADS * HEAD, seed ^ 2), &[t, HEADS, HEAD])?;
                    let out = dev.zeros::<bf16>(&[t, HEADS, HEAD])?;
                    Ok::<_, Error>((pos, cache, q, out))
                })();
                let timing = inputs.and_then(|(pos, cache, q, mut out)| {
                    runner.time_runs(|_| v3_rotary(&dev, &pos, &cache, &q, &mut out))
                });
                match timing {
                    Ok(timing) => row.timing = Some(timing),
                    Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
                }
            }
        },
        Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
    }
    runner.push(row);
}

/// V4: `k: [t, 32, 128]` written to the distinct slots of a cache of `4 t` slots.
pub fn v4(runner: &mut Runner) {
    let t = TOKENS.min(runner.sizes.sweep_total / (HEADS * HEAD)).max(1);
    let mut row = Row::new(
        "V4",
        &format!(
            "kv-cache write to slots, bf16 {t}x{HEADS}x{HEAD} into {}",
            4 * t
        ),
    );
    row.bytes = Some((4 * t * HEADS * HEAD + 8 * t) as u64);
    row.formula = "4 t 4096 + 8 t".into();
    row.definition = "cache[slot[i]] = k[i]; distinct slots".into();
    let seed = runner.seeds.next();
    // Distinct slots: token `i` to slot `(i * 7 + seed) mod 4t` (7 is prime to `4t` when `t`
    // is a power of two).
    let slots = |t: usize| -> Vec<i64> {
        (0..t)
            .map(|i| ((i as u64 * 7 + seed % 4) % (4 * t) as u64) as i64)
            .collect()
    };
    let run = |dev: &Device, t: usize| -> Result<Vec<bf16>, Error> {
        let k = put(dev, &bf16s(t * HEADS * HEAD, seed), &[t, HEADS, HEAD])?;
        let slot = put(dev, &slots(t), &[t])?;
        let mut cache = put(
            dev,
            &bf16s(4 * t * HEADS * HEAD, seed ^ 1),
            &[4 * t, HEADS, HEAD],
        )?;
        v4_cache_write(dev, &k, &slot, &mut cache)?;
        cache.to_vec()
    };
    let checked = run(&Device::cpu(), CHECK_TOKENS)
        .and_then(|want| Ok((run(&runner.dev, CHECK_TOKENS)?, want)));
    match checked {
        Ok((got, want)) => match differ(&got, &want, 0.0, 0.0) {
            Some(why) => (row.status, row.note) = (Status::Failed, why),
            None => {
                let dev = runner.dev.clone();
                let inputs = (|| {
                    let k = put(&dev, &bf16s(t * HEADS * HEAD, seed), &[t, HEADS, HEAD])?;
                    let slot = put(&dev, &slots(t), &[t])?;
                    let cache = dev.zeros::<bf16>(&[4 * t, HEADS, HEAD])?;
                    Ok::<_, Error>((k, slot, cache))
                })();
                let timing = inputs.and_then(|(k, slot, mut cache)| {
                    runner.time_runs(|_| v4_cache_write(&dev, &k, &slot, &mut cache))
                });
                match timing {
                    Ok(timing) => row.timing = Some(timing),
                    Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
                }
            }
        },
        Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
    }
    runner.push(row);
}
