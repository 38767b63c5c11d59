//! C1: the first call of a kernel in a new process, with a cold and with a warm on-disk cache,
//! with the CUBIN embedded at build time (when this binary was built with `FUSE_CUBIN_ARCHS`
//! naming the device's architecture), and NVRTC's time per kernel.
//!
//! The benchmark runs itself again as a child (with [`CHILD_ENV`] set and `FUSE_CACHE_DIR`
//! pointing at a fresh directory, then at the same one again, both with embedded CUBINs turned
//! off; then at a fresh one with them on). The child clocks itself from the top of `main` to the
//! first result and prints one line, which the parent reads.

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

use fuse_runtime::cache::{self, Origin};
use fuse_runtime::{nvrtc, Device};

use crate::kernels::w1_softplus;
use crate::measure::{self, Timing};
use crate::report::{Row, Status};
use crate::runner::Runner;

/// Set in the child's environment; its value names what the child does: `c1` loads W1 the way a
/// build without embedded CUBINs does, `c1-embedded` lets it load its embedded CUBIN.
pub const CHILD_ENV: &str = "FUSE_BENCH_CHILD";
/// The first word of the child's report line.
const REPORT: &str = "fuse-bench-c1";
/// The fused kernels whose NVRTC time gets a row of its own; the rest are summed up.
const NAMED: [&str; 7] = [
    "w1_softplus",
    "w2_add_gelu",
    "w4_sum_exp",
    "w5_softmax",
    "w6_layernorm_gelu",
    "w8_rmsnorm",
    "w10_tangent",
];

/// The child: opens the device, calls W1 once on 4096 elements, reads the result back, and
/// prints the times since `start` (taken at the top of `main`).
pub fn child(start: Instant) -> ExitCode {
    match first_call(start) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("C1 child: {why}");
            ExitCode::FAILURE
        }
    }
}

fn first_call(start: Instant) -> Result<String, String> {
    let embedded = std::env::var(CHILD_ENV).is_ok_and(|v| v == "c1-embedded");
    cache::set_embedded_cubins(embedded);
    let dev = match crate::cpu_mode() {
        true => Device::cpu(),
        false => Device::cuda(0).map_err(|e| e.to_string())?,
    };
    let opened = start.elapsed();
    let x = dev
        .upload(&measure::normal(4096, 1))
        .map_err(|e| e.to_string())?;
    let called = Instant::now();
    let y = w1_softplus(&dev, &x).and_then(|y| y.to_vec());
    let y = y.map_err(|e| e.to_string())?;
    let (call, total) = (called.elapsed(), start.elapsed());
    if let Some(bad) = y.iter().position(|v| !v.is_finite()) {
        return Err(format!("element {bad} of the result is {}", y[bad]));
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let origin = w1_kernel().and_then(|k| dev.kernel_origin(k));
    Ok(format!(
        "{REPORT} total_ms={} open_ms={} call_ms={} origin={origin:?}",
        ms(total),
        ms(opened),
        ms(call)
    ))
}

/// W1's entry in the runtime's list of kernels.
fn w1_kernel() -> Option<&'static fuse_runtime::KernelInfo> {
    fuse_runtime::kernels().find(|k| k.name == "w1_softplus")
}

/// The three child runs: (row name, what the child does, where its CUBIN must come from).
const RUNS: [(&str, &str, Origin); 3] = [
    ("first call, cold cache", "c1", Origin::Nvrtc),
    ("first call, warm cache", "c1", Origin::Disk),
    (
        "first call, embedded CUBIN",
        "c1-embedded",
        Origin::Embedded,
    ),
];

/// The parent: runs the child twice on one fresh cache directory, then times NVRTC.
pub fn first_calls(runner: &mut Runner) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("fuse-bench-c1-{}-{nanos}", std::process::id()));
    let arch = runner
        .dev
        .compute_capability()
        .map(|(major, minor)| major * 10 + minor);
    for (name, child, origin) in RUNS {
        let mut row = Row::new("C1", name);
        row.formula = "-".to_string();
        let embedded = w1_kernel().zip(arch).and_then(|(k, arch)| k.cubin(arch));
        if origin == Origin::Embedded && embedded.is_none() && !crate::cpu_mode() {
            let arch = arch.map_or("the device's architecture".to_string(), |a| {
                format!("sm_{a}")
            });
            (row.status, row.note) = (
                Status::Skipped,
                format!("no CUBIN embedded for {arch}: build with FUSE_CUBIN_ARCHS={arch}"),
            );
            runner.push(row);
            continue;
        }
        // The embedded run gets a cache directory of its own, which it must never touch.
        let cache = match origin {
            Origin::Embedded => dir.join("embedded"),
            _ => dir.clone(),
        };
        match run_child(&cache, child, origin) {
            Ok((timing, note)) => (row.timing, row.note) = (Some(timing), note),
            Err(why) => (row.status, row.note) = (Status::Error, why),
        }
        runner.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);
    nvrtc_times(runner);
}

/// One child run: its time from the top of `main` to the result, and a note breaking it down.
/// On a GPU, W1's CUBIN must have come from `origin`.
fn run_child(cache: &Path, child: &str, origin: Origin) -> Result<(Timing, String), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let spawned = Instant::now();
    let output = Command::new(exe)
        .env(CHILD_ENV, child)
        .env("FUSE_CACHE_DIR", cache)
        .output()
        .map_err(|e| format!("cannot run the child: {e}"))?;
    let wall = spawned.elapsed().as_secs_f64() * 1e3;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().find(|l| l.starts_with(REPORT));
    let Some(line) = line.filter(|_| output.status.success()) else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "child failed ({}): {}",
            output.status,
            stderr.trim()
        ));
    };
    let field = |key: &str| -> Result<f64, String> {
        let value = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix(key)?.strip_prefix('='));
        value
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {key} in the child's line {line:?}"))
    };
    let (total, open, call) = (field("total_ms")?, field("open_ms")?, field("call_ms")?);
    let found = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("origin="));
    let wanted = match crate::cpu_mode() {
        true => "None".to_string(),
        false => format!("{:?}", Some(origin)),
    };
    if found != Some(wanted.as_str()) {
        return Err(format!(
            "W1's CUBIN should come from {wanted}, not {found:?}"
        ));
    }
    let note = format!(
        "start of main to result; device open {open:.1} ms, first call {call:.1} ms; \
         process wall {wall:.1} ms"
    );
    Ok((Timing::of(vec![total]), note))
}

/// NVRTC's time to compile each kernel of this program to a CUBIN for the device's
/// architecture (sm_90 on the CPU), after one untimed compile that loads the library.
fn nvrtc_times(runner: &mut Runner) {
    let arch = runner
        .dev
        .compute_capability()
        .map_or(90, |(major, minor)| major * 10 + minor);
    let mut summary = Row::new("C1", "NVRTC per entry point, all kernels");
    summary.formula = "-".to_string();
    if !nvrtc::is_available() {
        (summary.status, summary.note) = (Status::Skipped, "NVRTC not found".to_string());
        return runner.push(summary);
    }
    let mut kernels: Vec<_> = fuse_runtime::__private::programs()
        .flat_map(|p| p.entries.iter().map(|e| e.kernel))
        .collect();
    kernels.sort_by_key(|k| k.symbol);
    let compile = |k: &fuse_runtime::KernelInfo| {
        let started = Instant::now();
        nvrtc::compile(k.source, &format!("{}.cu", k.name), arch, &[])
            .map(|_| started.elapsed().as_secs_f64() * 1e3)
    };
    let mut all = Vec::new();
    let mut named = Vec::new();
    for (k, kernel) in kernels.iter().enumerate() {
        let timed = match k {
            0 => compile(kernel).and_then(|_| compile(kernel)),
            _ => compile(kernel),
        };
        let mut row = Row::new("C1", &format!("NVRTC {}", kernel.symbol));
        row.formula = "-".to_string();
        match timed {
            Ok(ms) => {
                all.push(ms);
                row.timing = Some(Timing::of(vec![ms]));
                row.note = format!("sm_{arch}, {} bytes of CUDA C", kernel.source.len());
            }
            Err(e) => (row.status, row.note) = (Status::Error, e.to_string()),
        }
        if let Some(rank) = NAMED.iter().position(|&name| name == kernel.name) {
            named.push((rank, row));
        } else if row.failed() {
            named.push((NAMED.len(), row));
        }
    }
    named.sort_by_key(|(rank, _)| *rank);
    for (_, row) in named {
        runner.push(row);
    }
    let timing = Timing::of(all);
    summary.note = format!(
        "median of {} kernels; min {:.1} ms, max {:.1} ms",
        timing.reps, timing.min, timing.max
    );
    summary.timing = Some(timing);
    runner.push(summary);
}
