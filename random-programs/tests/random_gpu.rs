//! Every random program on the GPU, against the CPU backend and the oracle, on many shapes each:
//! `FUSE_RANDOM_SHAPES` instances a program (34 by default: with the 300 programs of the default
//! batch, 10,200 program-instances), with domains of up to 2^21 elements and rows up to a million.
//! The run itself is `random_programs::gpu`; the entries each instance takes,
//! `random_programs::paths`.
//!
//! Needs a GPU: `FUSE_REQUIRE_GPU=1 cargo test --release -p random-programs --test random_gpu --
//! --ignored` (or, from the GPU pack, `FUSE_REQUIRE_GPU=1 .gpu/tests/random_gpu --ignored`).
//! Without `FUSE_REQUIRE_GPU=1`, a machine without a GPU prints why and passes.
//!
//! It prints a line of progress to stderr every 10 s (with or without `--nocapture`), starts no
//! program after `FUSE_RANDOM_SECONDS` (240 by default), and ends with how many programs and
//! instances ran, how many entry points NVRTC compiled and the instances by path; any mismatch
//! fails the test.
//!
//! Run time. Two costs, measured on this repository's two-core build machine (no GPU: the same
//! run with the CPU backend in the GPU's place) and scaled to the GPU machine's 16 cores:
//! - NVRTC: an entry point takes 0.1 to 1 s to compile (0.3 s on average here, for sm_90), and
//!   the runtime compiles under its device's lock, one at a time. Drawn at random, the 34 shapes
//!   of the default batch's programs took nearly all of its 1256 entries: about 1250 compiles one
//!   after the other, 6 to 10 minutes, which is why the run went past 500 s printing nothing.
//!   Now each row program's instances take three of its entries (`random_programs::paths`), 475
//!   entries in all, every path among them (each short-row split about 20 times, `block_rows`,
//!   `exact_rows` and `long_rows` 13 to 17), and each worker compiles its next program's entries
//!   into the disk cache before launching (`paths::warm`), so the 16 threads compile side by side:
//!   about 475 x 0.3 s / 16, 10 to 30 s.
//! - The CPU backend and the oracle, on domains of 280 elements (median) to 2^21 (mean 59,000):
//!   2040 instances of 60 programs (every fifth) took 42 s on two threads here, 41 ms an
//!   instance with the compiles, so 10,200 instances take about 420 s of one thread, 30 s on 16.
//!
//! So the default run should take about one minute on an H100 machine, and the 240 s budget
//! leaves room for `FUSE_RANDOM_SHAPES=100` (30,000 instances, about three minutes).

use fuse_runtime::Device;
use random_programs::gpu::{run, say, Settings};
use random_programs::run::selected;

fn gpu() -> Option<Device> {
    match Device::cuda(0) {
        Ok(dev) => Some(dev),
        Err(e) if std::env::var("FUSE_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("FUSE_REQUIRE_GPU=1, but there is no GPU: {e}")
        }
        Err(e) => {
            say(&format!("skipping: no GPU: {e}"));
            None
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn random_programs_match_on_the_gpu() {
    let Some(gpu) = gpu() else {
        return;
    };
    let (major, minor) = gpu.compute_capability().expect("a CUDA device");
    let settings = Settings::from_env(34, 1 << 21);
    let programs = selected();
    let summary = run(&gpu, major * 10 + minor, &programs, &settings);
    say(&format!(
        "random_gpu: {} of {} programs, {} program-instances on {gpu} in {:.0?}{}; {} entry points \
         ({} compiled by NVRTC); instances by path: {:?}; {} instances of programs that write \
         through `&mut` parameters ({} elements of the buffers checked); {} failures",
        summary.programs,
        programs.len(),
        summary.instances,
        summary.elapsed,
        if summary.stopped {
            " (the time budget, FUSE_RANDOM_SECONDS, left the rest unstarted)"
        } else {
            ""
        },
        summary.entries,
        summary.compiled,
        summary.paths,
        summary.write_instances,
        summary.buffer_checked,
        summary.failures.len()
    ));
    assert!(summary.instances > 0, "no instance ran");
    // Not vacuous: where the programs run include some that write, their buffers were checked.
    let writers = programs
        .iter()
        .filter(|p| {
            !random_programs::oracle::Desc::parse(p.desc)
                .writes
                .is_empty()
        })
        .count();
    if writers > 0 && !summary.stopped && summary.failures.is_empty() {
        assert!(
            summary.write_instances > 0 && summary.buffer_checked > 0,
            "{writers} programs write, and no written buffer was checked"
        );
    }
    assert!(
        summary.failures.is_empty(),
        "{} failures:\n\n{}",
        summary.failures.len(),
        summary.failures.join("\n\n")
    );
}
