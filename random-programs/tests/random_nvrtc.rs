//! The random programs' kernels compiled by NVRTC to CUBIN for sm_80 and sm_90 as the runtime
//! compiles them (`nvrtc::compile_entry`: an entry that spills under its declared register bound
//! is compiled again with a lower one), failing on a compile error or a spill left, and listing
//! the entries whose bound was lowered: the planner's bounds (`fuse-macros/src/plan/tuning.rs`)
//! should fit most, where `fuse-runtime/tests/nvrtc_kernels.rs` holds the written kernels to
//! their declared bounds. Every entry point of every eighth program by default, its derived
//! launches' too (CI has two cores and the whole batch takes ten minutes there);
//! `FUSE_RANDOM_NVRTC=all` compiles every entry of every program.
//! `FUSE_DUMP_DIR=DIR` also writes each compiled entry's CUDA C to `DIR/<symbol>.cu`, to read
//! or to run on the emulated GPU what a GPU run found (with `FUSE_RANDOM_ONLY`).
//!
//! NVRTC is loaded at run time: without it this test says why and passes, except under `CI=true`,
//! where CI installs it and its absence is a failure.

use fuse_runtime::nvrtc;

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
    // A derived launch (`__p8_d0`, `__p8_t`) counts as its program's.
    let program = |name: &str| -> String {
        let base = name.strip_prefix("__").unwrap_or(name);
        base.split('_').next().unwrap_or(base).to_string()
    };
    let sampled = |name: &str| {
        let name = program(name);
        match listed {
            true => only.contains(&name.as_str()),
            false => {
                all || name
                    .strip_prefix('p')
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_some_and(|n| n % 8 == 0)
            }
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
    let results: Vec<(String, Result<u32, String>)> = std::thread::scope(|s| {
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
    let mut lowered = vec![];
    for (what, result) in results {
        match result {
            Ok(0) => {}
            Ok(blocks) => lowered.push(format!("{what} (-{blocks})")),
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
        "{} kernels compiled for sm_80 and sm_90 without spills; {} with their bound \
         lowered by ptxas's spills, by blocks an SM: {lowered:?}",
        kernels.len(),
        lowered.len()
    );
}

/// Compiles one entry point for both architectures: `("symbol sm_NN", result)` for each, the
/// result the blocks an SM its bound was lowered by.
fn compile(k: &&fuse_runtime::KernelInfo) -> Vec<(String, Result<u32, String>)> {
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
            let result = match nvrtc::compile_entry(k.source, k.symbol, arch) {
                Ok(c) => match nvrtc::spills(&c.log) {
                    Some(line) => Err(format!("{} ({what}) spills: {line}", k.name)),
                    None => Ok(c.lowered),
                },
                Err(e) => Err(format!("{} ({what}): {e}", k.name)),
            };
            (what, result)
        })
        .collect()
}
