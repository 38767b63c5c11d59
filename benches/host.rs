//! The host's share of one launch, in nanoseconds, timed against the stub CUDA driver
//! (`stub/libcuda.c`), whose calls do no GPU work and return at once: what is left is fuse's own
//! host code and cudarc's. Run it on any machine, with or without a GPU, by
//!
//! ```text
//! bash benches/stub/run
//! ```
//!
//! Each row times a loop of calls of a softplus over 4096 elements (T1's kernel), the median of
//! several rounds. Against a real driver it prints why it is skipped: the T1 rows of the
//! `workloads` bench time the same calls there.
//!
//! Options (after `--`): `--calls N` per round (200000), `--rounds N` (9), `--only NAME` for
//! one row. To count instructions rather than time them, where the clock
//! is too noisy: run one row under `valgrind --tool=callgrind` with N and with 2N calls and one
//! round; the difference over N is the instructions per call.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use fuse_runtime::__private::floors::{self, Prebuilt};
use fuse_runtime::__private::{bind, Arg, Geometry};
use fuse_runtime::{fuse, Device, Error};

fuse! {
    /// T1's kernel, W1: softplus written as a chain.
    fn softplus(x: [f32; n]) -> [f32; n] {
        (x.exp() + 1.0).ln()
    }
}

/// The name the stub driver gives its one device.
const STUB: &str = "fuse stub driver";
/// Elements, as in T1.
const N: usize = 4096;
/// What to run: calls per round, rounds, and the one row named `only` (every row when empty).
struct Config {
    calls: usize,
    rounds: usize,
    only: String,
}

impl Config {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Config, String> {
        let mut config = Config {
            calls: 200_000,
            rounds: 9,
            only: String::new(),
        };
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            let count = |text: String| text.parse().map_err(|_| format!("not a count: {text}"));
            match arg.as_str() {
                "--calls" => config.calls = count(value()?)?,
                "--rounds" => config.rounds = count(value()?)?.max(1),
                "--only" => config.only = value()?,
                _ => {} // `--bench`, from cargo
            }
        }
        Ok(config)
    }
}

fn main() -> ExitCode {
    let config = match Config::parse(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("host: {message}");
            return ExitCode::from(2);
        }
    };
    let dev = match Device::cuda(0) {
        Ok(dev) if dev.name().contains(STUB) => dev,
        Ok(dev) => {
            println!("host: skipped on {dev}: it times the host against the stub driver only");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!("host: skipped, no stub driver ({e}); run it with `bash benches/stub/run`");
            return ExitCode::SUCCESS;
        }
    };
    println!(
        "{:<40} {:>9} {:>9}",
        "host time of one call", "median", "min"
    );
    match rows(&dev, &config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("host: {e}");
            ExitCode::FAILURE
        }
    }
}

fn rows(dev: &Device, config: &Config) -> Result<(), Error> {
    let x = dev.upload(&vec![0.5f32; N])?;
    let mut out = dev.zeros::<f32>(&[N])?;
    let (signature, kernel) = (&softplus::__fuse::SIGNATURE, &softplus::__fuse::ENTRY_0);
    let geometry = Geometry::Map {
        elems: N as u64,
        vectors: 1,
    };
    row(config, "bind (the wrapper's checks)", || {
        bind(signature, dev, &[&x, &out]).map(drop)
    })?;
    row(config, "launch, no driver call", || {
        let args = [Arg::Buffer(&x), Arg::Buffer(&out), Arg::Dim(N)];
        floors::host_only(dev, kernel, geometry, &args)
    })?;
    row(config, "into, no driver call", || {
        floors::host_only_into(dev, &softplus::__fuse::PROGRAM, &x, &out)
    })?;
    row(config, "into", || softplus::into(dev, &x, &mut out))?;
    row(config, "allocating its output", || {
        softplus(dev, &x).map(drop)
    })?;
    let args = [Arg::Buffer(&x), Arg::Buffer(&out), Arg::Dim(N)];
    let mut prebuilt = Prebuilt::new(dev, kernel, geometry, &args)?;
    row(config, "cudarc builder, prebuilt args", || {
        prebuilt.launch_builder()
    })?;
    row(config, "cuLaunchKernel, prebuilt params", || {
        prebuilt.launch_raw()
    })
}

/// Times `call`: the median and the least over the rounds of nanoseconds per call.
fn row(
    config: &Config,
    name: &str,
    mut call: impl FnMut() -> Result<(), Error>,
) -> Result<(), Error> {
    if !config.only.is_empty() && name != config.only {
        return Ok(());
    }
    for _ in 0..config.calls / 10 {
        call()?;
    }
    let mut ns = Vec::with_capacity(config.rounds);
    for _ in 0..config.rounds {
        let start = Instant::now();
        for _ in 0..config.calls {
            black_box(call()?);
        }
        ns.push(start.elapsed().as_secs_f64() * 1e9 / config.calls.max(1) as f64);
    }
    ns.sort_by(f64::total_cmp);
    println!("{name:<40} {:>6.1} ns {:>6.1} ns", ns[ns.len() / 2], ns[0]);
    Ok(())
}
