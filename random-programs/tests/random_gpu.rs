//! Every random program on the GPU, against the CPU backend and the oracle, on many shapes each:
//! `FUSE_RANDOM_SHAPES` instances a program (34 by default: with the 300 programs of the default
//! batch, 10,200 program-instances), with domains of up to 2^21 elements and rows up to a million.
//!
//! Needs a GPU: `FUSE_REQUIRE_GPU=1 cargo test --release -p random-programs --test random_gpu --
//! --ignored` (or, from the GPU pack, `FUSE_REQUIRE_GPU=1 .gpu/tests/random_gpu --ignored`).
//! Without `FUSE_REQUIRE_GPU=1`, a machine without a GPU prints why and passes.

use fuse_runtime::Device;
use random_programs::oracle::Desc;
use random_programs::run::{check_gpu, selected, Config};
use std::sync::atomic::{AtomicUsize, Ordering};

fn gpu() -> Option<Device> {
    match Device::cuda(0) {
        Ok(dev) => Some(dev),
        Err(e) if std::env::var("FUSE_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("FUSE_REQUIRE_GPU=1, but there is no GPU: {e}")
        }
        Err(e) => {
            eprintln!("skipping: no GPU: {e}");
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
    let cfg = Config::from_env(34, 1 << 21);
    let programs = selected();
    let started = std::time::Instant::now();
    let runs = AtomicUsize::new(0);
    // The CPU backend and the oracle take most of the time: one thread a core, each running
    // every n-th program on its own stream.
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let mut failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (programs, cfg, runs) = (&programs, &cfg, &runs);
                let dev = gpu.new_stream().expect("a stream of the GPU");
                s.spawn(move || {
                    let mut failures = vec![];
                    for p in programs.iter().skip(t).step_by(threads) {
                        let desc = Desc::parse(p.desc);
                        for k in 0..cfg.shapes {
                            runs.fetch_add(1, Ordering::Relaxed);
                            if let Err(e) = check_gpu(p, &desc, &dev, k, cfg) {
                                failures.push(e);
                                break;
                            }
                        }
                    }
                    failures
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a test thread"))
            .collect()
    });
    failures.sort();
    eprintln!(
        "{} programs, {} program-instances on {gpu} in {:.0?}, {} failures",
        programs.len(),
        runs.into_inner(),
        started.elapsed(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
