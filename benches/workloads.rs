//! The fuse benchmark: every workload of `shared/WORKLOADS.md` as one fused `fuse!` fn and
//! unfused (one `fuse!` fn per operation), against a device-to-device copy, in one process; the
//! sum over the leading dim (W11, fused only); then a shape sweep (S1), reductions in every
//! direction over f32, bf16 and f16 (S2), the row kernels at lengths that are no power of two
//! (SO), 16-bit elementwise kernels and a broadcast over heads (S3), vLLM's silu_and_mul on the
//! halves of `[t, 2 * d]` (V1), a copy of the V rows' size (V0), vLLM's kernels (V2-V4), the
//! backwards (G), the launch overhead (T1) and the first call in a new process (C1).
//!
//! ```text
//! cargo bench -p fuse-benches                          all of it, full sizes (needs a GPU)
//! cargo bench -p fuse-benches -- --small               small sizes, seconds
//! cargo bench -p fuse-benches -- --only W1,W5,T1       some rows (the copy always runs)
//! cargo bench -p fuse-benches -- --only S2,S3,W11      the typed rows, with the peers' shapes
//! cargo bench -p fuse-benches -- --json PATH           also write the rows as JSON
//! ```
//!
//! Every variant is first checked against the CPU backend on a small problem of the same shape,
//! then timed with CUDA events; see `NOTES.md` for the method. S2, S3 and W11 (`typed.rs`) run
//! over `sweep_total` elements (W11 over `rows x cols`) with the shapes, element types and byte
//! counts of `shared/bench/peers.py`, f16 beside every bf16. Without a GPU it prints why and
//! exits 0, unless `FUSE_REQUIRE_GPU=1`. `FUSE_BENCH_CPU=1` runs everything on the CPU backend
//! at tiny sizes, to test the harness itself; `FUSE_BENCH_SEED` fixes the inputs.

mod cases;
mod firstcall;
mod grad;
mod kernels;
mod measure;
mod overhead;
mod report;
mod runner;
mod typed;
mod vllm;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use fuse_runtime::Device;

use runner::Runner;

/// The sizes of one run.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Elements of the one-dimensional workloads and of the copy.
    pub n: usize,
    /// The shape of the row workloads.
    pub rows: usize,
    pub cols: usize,
    /// The largest check against the CPU: elements, and rows (of the same width).
    pub check_n: usize,
    pub check_rows: usize,
    /// S1: softmax over `sweep_total` elements in rows of `sweep_cols`; `sum(exp)` over 2^k.
    /// S2 and S3 run over `sweep_total` elements too.
    pub sweep_total: usize,
    pub sweep_cols: &'static [usize],
    pub sum_logs: &'static [u32],
    /// Untimed and timed runs of each variant.
    pub warmup: usize,
    pub reps: usize,
    /// T1: elements, calls per round, rounds.
    pub t1_n: usize,
    pub t1_calls: usize,
    pub t1_rounds: usize,
}

const SWEEP_COLS: &[usize] = &[2, 32, 1024, 4096, 32768, 262144];

/// WORKLOADS.md's sizes.
const FULL: Sizes = Sizes {
    n: 1 << 28,
    rows: 65536,
    cols: 4096,
    check_n: 1 << 20,
    check_rows: 64,
    sweep_total: 1 << 28,
    sweep_cols: SWEEP_COLS,
    sum_logs: &[10, 16, 22, 28],
    warmup: 3,
    reps: 30,
    t1_n: 4096,
    t1_calls: 2000,
    t1_rounds: 7,
};

/// `--small` on a GPU: the same shapes, 64 times fewer elements.
const SMALL: Sizes = Sizes {
    n: 1 << 22,
    rows: 1024,
    cols: 4096,
    check_n: 1 << 16,
    check_rows: 16,
    sweep_total: 1 << 22,
    sum_logs: &[10, 16, 22],
    reps: 10,
    t1_calls: 500,
    t1_rounds: 3,
    ..FULL
};

/// `FUSE_BENCH_CPU=1`: tiny, for the CPU backend.
const CPU: Sizes = Sizes {
    n: 1 << 16,
    rows: 64,
    cols: 1024,
    check_n: 1 << 12,
    check_rows: 4,
    sweep_total: 1 << 18,
    sum_logs: &[10, 16],
    warmup: 1,
    reps: 3,
    t1_calls: 50,
    t1_rounds: 3,
    ..FULL
};

/// The rows, in the order they run; `copy` always runs, since `%copy` needs it.
const IDS: [&str; 37] = [
    "W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W10", "W11", "S1", "S2", "SW", "SO",
    "S3", "V1", "V0", "V2", "V3", "V4", "G1", "G2", "G3", "G4", "G5", "G5G", "G5F", "G6", "G7",
    "G8", "G1T", "G2T", "G6T", "GW", "T1", "C1",
];

/// What the command line asked for.
struct Config {
    small: bool,
    only: Option<Vec<String>>,
    json: Option<PathBuf>,
}

impl Config {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Config, String> {
        let mut config = Config {
            small: false,
            only: None,
            json: std::env::var_os("OUT").map(|out| PathBuf::from(out).join("fuse_bench.json")),
        };
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) => (flag.to_string(), Some(value.to_string())),
                None => (arg.clone(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or(format!("{flag} needs a value"))
            };
            match flag.as_str() {
                "--bench" => {}
                "--small" => config.small = true,
                "--json" => config.json = Some(PathBuf::from(value()?)),
                "--only" => config.only = Some(ids(&value()?)?),
                "--help" | "-h" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                _ => eprintln!("ignoring the argument {arg:?}"),
            }
        }
        Ok(config)
    }

    fn wants(&self, id: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == id))
    }
}

const USAGE: &str = "usage: workloads [--bench] [--small] [--only ID,...] [--json PATH]\n\
    IDs: W1 W2 W3 W4 W5 W6 W7 W8 W9 W10 W11 S1 S2 SW SO S3 V1 V0 V2 V3 V4 G1-G8 G1T G2T G6T GW T1 C1 (the copy always runs)\n\
    env: FUSE_REQUIRE_GPU=1 fails without a GPU; FUSE_BENCH_CPU=1 runs on the CPU backend;\n\
    FUSE_BENCH_SEED=N fixes the inputs; OUT=DIR writes DIR/fuse_bench.json";

/// `W1,w5, T1` as `["W1", "W5", "T1"]`, each a known id.
fn ids(list: &str) -> Result<Vec<String>, String> {
    let ids = list.split(',').map(|id| id.trim().to_uppercase());
    let ids: Vec<String> = ids.filter(|id| !id.is_empty()).collect();
    match ids.iter().find(|id| !IDS.contains(&id.as_str())) {
        Some(bad) => Err(format!("unknown id {bad}; known: {}", IDS.join(" "))),
        None => Ok(ids),
    }
}

fn env_is_one(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

/// Whether to run on the CPU backend (`FUSE_BENCH_CPU=1`), to test the harness without a GPU.
pub fn cpu_mode() -> bool {
    env_is_one("FUSE_BENCH_CPU")
}

fn main() -> ExitCode {
    let start = Instant::now();
    if std::env::var_os(firstcall::CHILD_ENV).is_some() {
        return firstcall::child(start);
    }
    let config = match Config::parse(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let dev = match cpu_mode() {
        true => Device::cpu(),
        false => match Device::cuda(0) {
            Ok(dev) => dev,
            Err(e) => {
                println!("no GPU: benchmark skipped ({e})");
                let required = env_is_one("FUSE_REQUIRE_GPU");
                return if required {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                };
            }
        },
    };
    let sizes = match (cpu_mode(), config.small) {
        (true, _) => CPU,
        (false, true) => SMALL,
        (false, false) => FULL,
    };
    match Runner::new(dev, sizes) {
        Ok(runner) => run(runner, &config),
        Err(e) => {
            eprintln!("cannot start the benchmark: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(mut runner: Runner, config: &Config) -> ExitCode {
    let header = header(&runner, config);
    for (key, value) in &header {
        eprintln!("{key}: {value}");
    }
    runner.copy();
    let workloads = cases::all();
    // The typed rows' f32 inputs, drawn once and shared by W11, S2 and S3.
    let mut pool = typed::Pool::default();
    for id in IDS.into_iter().filter(|id| config.wants(id)) {
        match id {
            "W11" => typed::w11(&mut runner, &mut pool),
            "S1" => runner.sweep(),
            "S2" => typed::s2(&mut runner, &mut pool),
            "SW" => typed::sw(&mut runner, &mut pool),
            "SO" => typed::so(&mut runner, &mut pool),
            "S3" => typed::s3(&mut runner, &mut pool),
            "V1" => typed::v1(&mut runner, &mut pool),
            "V0" => vllm::v0(&mut runner),
            "V2" => vllm::v2(&mut runner),
            "V3" => vllm::v3(&mut runner),
            "V4" => vllm::v4(&mut runner),
            g if g.starts_with('G') => grad::g(&mut runner, &mut pool, g),
            "T1" => overhead::launch_overhead(&mut runner),
            "C1" => firstcall::first_calls(&mut runner),
            _ => match workloads.iter().find(|w| w.id == id) {
                Some(w) => runner.full(w),
                None => runner.not_yet(id),
            },
        }
    }
    let copy = runner.copy_gbs;
    println!();
    println!(
        "{}",
        header
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("  ")
    );
    print!("{}", report::table(&runner.rows, copy));
    if let Some(path) = &config.json {
        match std::fs::write(path, report::json(&runner.rows, copy, &header)) {
            Ok(()) => println!("wrote {}", path.display()),
            Err(e) => eprintln!("cannot write {}: {e}", path.display()),
        }
    }
    let failed = runner.rows.iter().filter(|r| r.failed()).count();
    if failed == 0 {
        return ExitCode::SUCCESS;
    }
    println!("{failed} rows FAILED or ERROR");
    ExitCode::FAILURE
}

/// What this run is, for the table's first line and the JSON.
fn header(runner: &Runner, config: &Config) -> Vec<(&'static str, String)> {
    let s = runner.sizes;
    let mode = match (cpu_mode(), config.small) {
        (true, _) => "cpu (FUSE_BENCH_CPU=1, tiny sizes)",
        (false, true) => "small",
        (false, false) => "full",
    };
    vec![
        ("device", runner.dev.name()),
        ("mode", mode.to_string()),
        ("n", s.n.to_string()),
        ("rows x cols", format!("{} x {}", s.rows, s.cols)),
        (
            "reps",
            format!(
                "median of {} after {} warm-up ({} under {} ms)",
                s.reps,
                s.warmup,
                s.reps * runner::SHORT_REPS,
                runner::SHORT_MS
            ),
        ),
        ("seed", runner.seeds.base.to_string()),
    ]
}
