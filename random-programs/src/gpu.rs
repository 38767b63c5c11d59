//! The GPU run (`tests/random_gpu.rs`): every program on a device against the CPU backend and
//! the oracle, on many instances each, one thread a core, within a time budget, with a line of
//! progress every few seconds.
//!
//! Environment, besides [`crate::run`]'s:
//! - `FUSE_RANDOM_SECONDS=S`: start no program after `S` seconds (240 by default); the programs
//!   under way finish their instances, and the summary says how many ran;
//! - `FUSE_RANDOM_PATHS=N`: the entries a row program's instances take ([`Paths::PER_PROGRAM`]
//!   by default; a large number takes every entry of every program, as random shapes would);
//! - `FUSE_RANDOM_STALL=S`: when no instance has finished for `S` seconds (120 by default),
//!   name the instances under way and end the process with a failure: a kernel that never
//!   returns holds every later call to the device (a short-row tile that held no rows hung the
//!   GPU so, and the run printed the same progress line until the call's time ran out).

use crate::oracle::Desc;
use crate::paths::{warm, Paths};
use crate::run::{check_gpu, instance_with, Config};
use crate::Program;
use fuse_runtime::Device;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What one GPU run does.
pub struct Settings {
    pub cfg: Config,
    /// Start no program after this.
    pub budget: Duration,
    /// Entries a row program's instances take.
    pub per_program: usize,
    /// Worker threads, each with its own stream.
    pub threads: usize,
    /// How often a line of progress goes to stderr.
    pub every: Duration,
    /// How long without a finished instance counts as a hang.
    pub stall: Duration,
}

impl Settings {
    /// From the environment, with `shapes` instances a program of at most `budget` elements.
    pub fn from_env(shapes: usize, budget: usize) -> Settings {
        let num = |name: &str, default: f64| {
            std::env::var(name).map_or(default, |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{name}={v}: {e}"))
            })
        };
        Settings {
            cfg: Config::from_env(shapes, budget),
            budget: Duration::from_secs_f64(num("FUSE_RANDOM_SECONDS", 240.0)),
            per_program: num("FUSE_RANDOM_PATHS", Paths::PER_PROGRAM as f64) as usize,
            threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
            every: Duration::from_secs(10),
            stall: Duration::from_secs_f64(num("FUSE_RANDOM_STALL", 120.0)),
        }
    }
}

/// What a run did.
#[derive(Default)]
pub struct Summary {
    /// Programs started (each ran its instances to the end or to its first failure).
    pub programs: usize,
    /// Program-instances run.
    pub instances: usize,
    /// Entry points the instances took.
    pub entries: usize,
    /// Of those, the ones NVRTC compiled (the rest came from the disk cache).
    pub compiled: usize,
    /// Instances by the path they took (`short_rows`, `cached_rows`, `map`...).
    pub paths: BTreeMap<&'static str, usize>,
    /// Of the instances, those of programs that write through `&mut` parameters, and the
    /// elements of those parameters that the oracle knew and so checked.
    pub write_instances: usize,
    pub buffer_checked: usize,
    /// Whether the time budget left programs unstarted.
    pub stopped: bool,
    pub elapsed: Duration,
    /// One report a failing program, sorted.
    pub failures: Vec<String>,
}

/// The counts the workers share, which the progress line reads.
#[derive(Default)]
struct Shared {
    next: AtomicUsize,
    programs: AtomicUsize,
    instances: AtomicUsize,
    entries: AtomicUsize,
    compiled: AtomicUsize,
    failures: AtomicUsize,
    write_instances: AtomicUsize,
    buffer_checked: AtomicUsize,
    stopped: AtomicBool,
    done: AtomicBool,
    paths: Mutex<BTreeMap<&'static str, usize>>,
    /// The instances under way, one a worker: program, instance and dim sizes.
    running: Mutex<BTreeMap<usize, String>>,
    /// Instances finished, against which the progress line measures a stall.
    finished: AtomicUsize,
}

/// Runs `programs` on `gpu`, a device of compute capability `arch` (major * 10 + minor).
pub fn run(gpu: &Device, arch: u32, programs: &[&'static Program], s: &Settings) -> Summary {
    let started = Instant::now();
    let shared = Shared::default();
    let mut failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..s.threads)
            .map(|w| {
                let dev = gpu.new_stream().expect("a stream of the GPU");
                let shared = &shared;
                scope.spawn(move || worker(w, &dev, arch, programs, s, shared, started))
            })
            .collect();
        scope.spawn(|| progress(programs.len(), s, &shared, started));
        let failures = workers
            .into_iter()
            .flat_map(|h| h.join().expect("a test thread"))
            .collect();
        shared.done.store(true, Ordering::Relaxed);
        failures
    });
    failures.sort();
    Summary {
        programs: shared.programs.into_inner(),
        instances: shared.instances.into_inner(),
        entries: shared.entries.into_inner(),
        compiled: shared.compiled.into_inner(),
        paths: shared.paths.into_inner().expect("no thread panicked"),
        write_instances: shared.write_instances.into_inner(),
        buffer_checked: shared.buffer_checked.into_inner(),
        stopped: shared.stopped.into_inner(),
        elapsed: started.elapsed(),
        failures,
    }
}

/// One thread (worker `w`): takes the next program until none is left or the budget is spent.
fn worker(
    w: usize,
    dev: &Device,
    arch: u32,
    programs: &[&'static Program],
    s: &Settings,
    shared: &Shared,
    started: Instant,
) -> Vec<String> {
    let mut failures = vec![];
    loop {
        if started.elapsed() >= s.budget {
            shared.stopped.store(true, Ordering::Relaxed);
            break;
        }
        let Some(&p) = programs.get(shared.next.fetch_add(1, Ordering::Relaxed)) else {
            break;
        };
        shared.programs.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = run_program(w, p, dev, arch, s, shared) {
            shared.failures.fetch_add(1, Ordering::Relaxed);
            failures.push(e);
        }
    }
    failures
}

/// Every instance of `p`, up to the first failure, on worker `w`.
fn run_program(
    w: usize,
    p: &'static Program,
    dev: &Device,
    arch: u32,
    s: &Settings,
    shared: &Shared,
) -> Result<(), String> {
    // The place in the whole batch, not among the selected programs: `FUSE_RANDOM_ONLY` then
    // replays a failure with the same entries.
    let index = crate::PROGRAMS.iter().position(|q| std::ptr::eq(q, p));
    let paths = index
        .and_then(|i| Paths::new(p.name, i, arch, s.cfg.budget, s.per_program))
        .ok_or_else(|| format!("program {}: not registered with the runtime", p.name))?;
    let desc = Desc::parse(p.desc);
    let mut warmed = vec![];
    for k in 0..s.cfg.shapes {
        let fixed = paths.length(k, p.seed ^ s.cfg.base_seed);
        let inst = instance_with(p, &desc, k, &s.cfg, fixed);
        let entries = paths.entries(&inst.sizes, arch);
        for &e in &entries {
            if !warmed.iter().any(|w| std::ptr::eq(*w, e)) {
                warmed.push(e);
                shared.entries.fetch_add(1, Ordering::Relaxed);
                let compiled = warm(e, arch).map_err(|e| format!("program {}: {e}", p.name))?;
                shared
                    .compiled
                    .fetch_add(compiled as usize, Ordering::Relaxed);
            }
        }
        let path = entries.first().map_or("none", |e| path_of(&paths, e));
        *shared
            .paths
            .lock()
            .expect("no thread panicked")
            .entry(path)
            .or_default() += 1;
        shared.instances.fetch_add(1, Ordering::Relaxed);
        let symbols: Vec<&str> = entries.iter().map(|e| e.symbol).collect();
        let under_way = format!(
            "{} instance {k} (dims {:?}, entries {symbols:?}; FUSE_RANDOM_ONLY={} replays it)",
            p.name, inst.sizes, p.name
        );
        shared
            .running
            .lock()
            .expect("no thread panicked")
            .insert(w, under_way);
        let checked = check_gpu(p, &desc, dev, k, &inst);
        shared
            .running
            .lock()
            .expect("no thread panicked")
            .remove(&w);
        shared.finished.fetch_add(1, Ordering::Relaxed);
        let (counts, _) = checked.map_err(|e| {
            let symbols: Vec<&str> = entries.iter().map(|e| e.symbol).collect();
            let per_program = s.per_program;
            format!("{e}entry points: {symbols:?} (FUSE_RANDOM_PATHS={per_program})")
        })?;
        if !desc.writes.is_empty() {
            shared.write_instances.fetch_add(1, Ordering::Relaxed);
            shared
                .buffer_checked
                .fetch_add(counts.buffer_checked, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The path name of `kernel`, one of `paths`' program's entries.
fn path_of(paths: &Paths, kernel: &fuse_runtime::KernelInfo) -> &'static str {
    let entries = paths.program.entries.iter();
    entries
        .filter(|e| std::ptr::eq(e.kernel, kernel))
        .map(|e| e.path)
        .next()
        .unwrap_or("?")
}

/// Writes `line` and a newline to stderr itself, not through `eprintln!`, which the test harness
/// captures unless given `--nocapture`: progress, the summary and a skip show either way.
pub fn say(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// A line on stderr ([`say`]) every `s.every` until the workers are done; after `s.stall`
/// without a finished instance, the instances under way, and the end of the process.
fn progress(total: usize, s: &Settings, shared: &Shared, started: Instant) {
    let mut last = Instant::now();
    let (mut finished, mut moved) = (0, Instant::now());
    while !shared.done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(200));
        let now = shared.finished.load(Ordering::Relaxed);
        if now != finished {
            (finished, moved) = (now, Instant::now());
        }
        if moved.elapsed() >= s.stall {
            let running = shared.running.lock().expect("no thread panicked");
            say(&format!(
                "random_gpu: no instance finished in {:.0?} (FUSE_RANDOM_STALL): a kernel that \
                 does not return, or a host step that takes that long; under way:",
                s.stall
            ));
            for line in running.values() {
                say(&format!("  {line}"));
            }
            // The workers wait on the device and cannot be joined.
            std::process::exit(101);
        }
        if last.elapsed() < s.every {
            continue;
        }
        last = Instant::now();
        let line = format!(
            "random_gpu: {} of {total} programs started, {} instances, {} entries compiled, \
             {} failures, {:.0} s of {:.0} s",
            shared.programs.load(Ordering::Relaxed),
            shared.instances.load(Ordering::Relaxed),
            shared.compiled.load(Ordering::Relaxed),
            shared.failures.load(Ordering::Relaxed),
            started.elapsed().as_secs_f64(),
            s.budget.as_secs_f64(),
        );
        say(&line);
    }
}
