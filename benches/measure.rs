//! Inputs, correctness checks and timing.

use std::time::Instant;

use fuse_runtime::{Buffer, Device, Error};

use crate::kernels::flush;

/// The relative tolerance of the check against the CPU backend.
pub const RTOL: f64 = 1e-4;
/// The absolute tolerance, as a fraction of the largest reference value: it covers results
/// near zero that come from cancellation (such as `dx * y + x * dy`), where a rounding of an
/// operand of the size of the largest values is expected.
pub const ATOL_OF_MAX: f64 = 1e-6;

/// Seeds for fresh inputs: a base drawn from the clock (or `FUSE_BENCH_SEED`), then a new seed
/// for every buffer.
pub struct Seeds {
    pub base: u64,
    state: u64,
}

impl Seeds {
    pub fn new() -> Seeds {
        let from_env = std::env::var("FUSE_BENCH_SEED").ok();
        let base = from_env.and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            now.map_or(1, |d| d.as_nanos() as u64) ^ u64::from(std::process::id())
        });
        Seeds { base, state: base }
    }

    pub fn next(&mut self) -> u64 {
        splitmix(&mut self.state)
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` samples of a standard normal distribution (as `torch.randn`), drawn on every core.
pub fn normal(len: usize, seed: u64) -> Vec<f32> {
    let mut out = vec![0.0f32; len];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = len.div_ceil(threads).max(1 << 16);
    std::thread::scope(|scope| {
        for (k, part) in out.chunks_mut(chunk).enumerate() {
            scope.spawn(move || fill_normal(part, seed ^ (k as u64).wrapping_mul(0xa076_1d64)));
        }
    });
    out
}

/// Box-Muller over a splitmix stream.
fn fill_normal(part: &mut [f32], seed: u64) {
    let mut state = seed;
    // In (0, 1]: never zero, so the logarithm is finite.
    let mut uniform = || ((splitmix(&mut state) >> 11) + 1) as f64 / (1u64 << 53) as f64;
    for pair in part.chunks_mut(2) {
        let radius = (-2.0 * uniform().ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * uniform()).sin_cos();
        pair[0] = (radius * cos) as f32;
        if let Some(second) = pair.get_mut(1) {
            *second = (radius * sin) as f32;
        }
    }
}

/// Fresh random buffers of `shapes` on `dev`, uploaded one at a time.
pub fn random_inputs(
    dev: &Device,
    shapes: &[Vec<usize>],
    seeds: &mut Seeds,
) -> Result<Vec<Buffer<f32>>, Error> {
    shapes
        .iter()
        .map(|shape| {
            let len = shape.iter().product();
            dev.upload(&normal(len, seeds.next()))?.reshape(shape)
        })
        .collect()
}

/// Buffers of `shapes` filled with NaN, so that an element a kernel fails to write fails the
/// check.
pub fn poisoned(dev: &Device, shapes: &[Vec<usize>]) -> Result<Vec<Buffer<f32>>, Error> {
    shapes
        .iter()
        .map(|shape| {
            let len = shape.iter().product();
            dev.upload(&vec![f32::NAN; len])?.reshape(shape)
        })
        .collect()
}

/// Why `got` is not `want` within the tolerance: the first bad index and both values. NaN
/// never passes.
pub fn compare(got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, want {}", got.len(), want.len()));
    }
    let largest = want.iter().fold(0.0f64, |m, &w| m.max(f64::from(w).abs()));
    for (index, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = RTOL * f64::from(w).abs() + ATOL_OF_MAX * largest;
        let ok = (f64::from(g) - f64::from(w)).abs() <= tol; // false for NaN
        if !ok {
            return Err(format!(
                "index {index}: got {g:e}, CPU {w:e} (tolerance {tol:.1e})"
            ));
        }
    }
    Ok(())
}

/// Median, minimum and maximum of repeated timings, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub reps: usize,
}

impl Timing {
    pub fn of(mut ms: Vec<f64>) -> Timing {
        ms.sort_by(f64::total_cmp);
        let reps = ms.len();
        let median = match reps {
            0 => f64::NAN,
            _ if reps % 2 == 1 => ms[reps / 2],
            _ => (ms[reps / 2 - 1] + ms[reps / 2]) / 2.0,
        };
        let min = ms.first().copied().unwrap_or(f64::NAN);
        let max = ms.last().copied().unwrap_or(f64::NAN);
        Timing {
            median,
            min,
            max,
            reps,
        }
    }
}

/// Reads a buffer larger than the L2 cache before each timed run, as `triton.testing.do_bench`
/// clears the cache; it is read-only, so it leaves no dirty lines to write back during the
/// next run, and while it runs the host queues that run, so the timer never waits for the host.
pub struct Flush {
    big: Buffer<f32>,
    out: Buffer<f32>,
}

impl Flush {
    /// 256 MiB: five times the 50 MB L2 of an H100.
    pub const ELEMENTS: usize = 1 << 26;

    pub fn new(dev: &Device, seeds: &mut Seeds) -> Result<Flush, Error> {
        let big = random_inputs(dev, &[vec![Self::ELEMENTS]], seeds)?.remove(0);
        let out = dev.zeros(&[])?;
        Ok(Flush { big, out })
    }

    fn run(&mut self) -> Result<(), Error> {
        let dev = self.big.device().clone();
        flush::into(&dev, &self.big, &mut self.out)
    }
}

/// Device time of `run(i)`: `warmup` untimed calls, then `reps` timed ones, each after a
/// flush when one is given, all queued before any is read back.
pub fn time_runs(
    dev: &Device,
    mut flush: Option<&mut Flush>,
    warmup: usize,
    reps: usize,
    mut run: impl FnMut(usize) -> Result<(), Error>,
) -> Result<Timing, Error> {
    for i in 0..warmup {
        run(i)?;
    }
    dev.synchronize()?;
    let mut timers = Vec::with_capacity(reps);
    for i in 0..reps {
        if let Some(flush) = flush.as_deref_mut() {
            flush.run()?;
        }
        let mut timer = dev.timer()?;
        run(warmup + i)?;
        timer.stop()?;
        timers.push(timer);
    }
    let ms = timers.iter_mut().map(|t| t.elapsed_ms().map(f64::from));
    Ok(Timing::of(ms.collect::<Result<_, _>>()?))
}

/// Host times per call of a loop of calls, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct CallTimes {
    /// Until the last call returned: the time to queue them.
    pub queued: f64,
    /// Until the device had run them all.
    pub done: f64,
}

/// Host time per call of `call(i)` over `calls` calls back to back, after `warmup` calls: until
/// the last returned, and until the device finished them (what a loop in a program sees).
pub fn time_calls(
    dev: &Device,
    warmup: usize,
    calls: usize,
    mut call: impl FnMut(usize) -> Result<(), Error>,
) -> Result<CallTimes, Error> {
    for i in 0..warmup {
        call(i)?;
    }
    dev.synchronize()?;
    let start = Instant::now();
    for i in 0..calls {
        call(i)?;
    }
    let queued = start.elapsed();
    dev.synchronize()?;
    let done = start.elapsed();
    let per_call = |t: std::time::Duration| t.as_secs_f64() * 1e3 / calls.max(1) as f64;
    Ok(CallTimes {
        queued: per_call(queued),
        done: per_call(done),
    })
}
