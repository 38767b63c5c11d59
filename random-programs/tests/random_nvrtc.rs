//! The random programs' kernels compiled by NVRTC to CUBIN for sm_80 and sm_90, failing on a
//! compile error or a ptxas spill, as `fuse-runtime/tests/nvrtc_kernels.rs` does for the written
//! kernels. Every entry point of every eighth program by default (CI has two cores and the whole
//! batch takes ten minutes there); `FUSE_RANDOM_NVRTC=all` compiles every entry of every program.
//! `FUSE_DUMP_DIR=DIR` also writes each compiled entry's CUDA C to `DIR/<symbol>.cu`, to read
//! or to run on the emulated GPU what a GPU run found (with `FUSE_RANDOM_ONLY`).
//!
//! NVRTC is loaded at run time: without it this test says why and passes, except under `CI=true`,
//! where CI installs it and its absence is a failure.

use fuse_runtime::nvrtc;

/// Spills of the default batch that are known and being fixed: reported, not failed, so that CI
/// still catches new ones. Empty: none spills since `fuse-macros/src/plan/tuning.rs` bounds the
/// registers of the kernels that did (`map_min_blocks`, `short_min_blocks`, `min_blocks`,
/// `register_min_blocks`; 34 entries of 11 programs before, and p144's and p170's after
/// gathers joined the generator). A change to the generator renames programs; a spill it finds
/// goes here, by `symbol sm_NN`, only until the bound is fixed.
const KNOWN_SPILLS: &[&str] = &[];

#[test]
fn random_kernels_compile_for_sm80_and_sm90_without_spills() {
    if !nvrtc::is_available() {
        let why = format!("NVRTC not found (searched {:?})", nvrtc::candidates());
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must have NVRTC: {why}"
        );
        eprintln!("skipping: {why}");
        return;
    }
    let all = std::env::var("FUSE_RANDOM_NVRTC").as_deref() == Ok("all");
    // `FUSE_RANDOM_ONLY=p12,p40` compiles those programs' entries alone.
    let only: Vec<&str> = random_programs::run::selected()
        .iter()
        .map(|p| p.name)
        .collect();
    let listed = std::env::var("FUSE_RANDOM_ONLY").is_ok_and(|o| !o.trim().is_empty());
    let sampled = |name: &str| match listed {
        true => only.contains(&name),
        false => {
            all || name
                .strip_prefix('p')
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n % 8 == 0)
        }
    };
    // Naming the table links the programs in: `programs()` lists only what the binary holds.
    assert!(!random_programs::PROGRAMS.is_empty());
    let kernels: Vec<_> = fuse_runtime::__private::programs()
        .flat_map(|p| p.entries.iter().map(|e| e.kernel))
        .filter(|k| sampled(k.name))
        .collect();
    assert!(!kernels.is_empty(), "no random kernel is registered");
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let results: Vec<(String, Result<(), String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = kernels
            .chunks(kernels.len().div_ceil(threads))
            .map(|chunk| s.spawn(move || chunk.iter().flat_map(compile).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a compile thread"))
            .collect()
    });
    let mut failures = vec![];
    let mut known = 0;
    for (what, result) in results {
        match result {
            Ok(()) => {}
            Err(e) if KNOWN_SPILLS.contains(&what.as_str()) && e.contains("spill") => {
                eprintln!("known: {e}");
                known += 1;
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} kernels failed (each program's text is in random_programs::PROGRAMS):\n{}",
        failures.len(),
        kernels.len(),
        failures.join("\n\n")
    );
    eprintln!(
        "{} kernels compiled for sm_80 and sm_90; {known} known spills",
        kernels.len()
    );
}

/// Compiles one entry point for both architectures: `("symbol sm_NN", result)` for each.
fn compile(k: &&fuse_runtime::KernelInfo) -> Vec<(String, Result<(), String>)> {
    if let Some(dir) = std::env::var_os("FUSE_DUMP_DIR") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("FUSE_DUMP_DIR is a writable folder");
        std::fs::write(dir.join(format!("{}.cu", k.symbol)), k.source)
            .expect("FUSE_DUMP_DIR is a writable folder");
    }
    [80, 90]
        .iter()
        .map(|&arch| {
            let what = format!("{} sm_{arch}", k.symbol);
            let result = match nvrtc::compile(k.source, k.symbol, arch, &["--ptxas-options=-v"]) {
                Ok(c) => match nvrtc::spills(&c.log) {
                    Some(line) => Err(format!("{} ({what}) spills: {line}", k.name)),
                    None => Ok(()),
                },
                Err(e) => Err(format!("{} ({what}): {e}", k.name)),
            };
            (what, result)
        })
        .collect()
}
