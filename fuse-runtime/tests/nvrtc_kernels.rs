//! Every kernel of the tests, examples and benches, compiled by NVRTC to CUBIN for sm_80 and
//! sm_90, failing on any ptxas spill at the register bound the planner declared: the runtime
//! would lower a spilling entry's bound (`nvrtc::compile_entry`), and these kernels, which the
//! bounds are tuned on, must not need it. The kernels reach this binary by including their files as
//! modules; each registers itself with `fuse_runtime::kernels()`.
//!
//! NVRTC is loaded at run time: without it this test says why and passes, except under `CI=true`,
//! where CI installs it and its absence is a failure.

#[allow(dead_code)]
#[path = "common/kernels.rs"]
mod kernels;

#[allow(dead_code)]
#[path = "common/grad_kernels.rs"]
mod grad_kernels;

#[allow(dead_code)]
#[path = "../../benches/kernels.rs"]
mod bench_kernels;

#[allow(dead_code)]
#[path = "catalogue/kernels.rs"]
mod catalogue_kernels;

#[allow(dead_code)]
#[path = "../../examples/quickstart.rs"]
mod quickstart;

#[allow(dead_code)]
#[path = "../../examples/softmax.rs"]
mod softmax;

#[allow(dead_code)]
#[path = "../../examples/layernorm.rs"]
mod layernorm;

#[allow(dead_code)]
#[path = "../../examples/dropout.rs"]
mod dropout;

#[allow(dead_code)]
#[path = "../../examples/cross_entropy.rs"]
mod cross_entropy;

#[allow(dead_code)]
#[path = "../../examples/quantize.rs"]
mod quantize;

#[allow(dead_code)]
#[path = "../../examples/fp8_quantize.rs"]
mod fp8_quantize;

#[allow(dead_code)]
#[path = "../../examples/rmsnorm_backward.rs"]
mod rmsnorm_backward;

#[allow(dead_code)]
#[path = "../../examples/cross_entropy_grad.rs"]
mod cross_entropy_grad;

#[allow(dead_code)]
#[path = "../../examples/fit_layernorm.rs"]
mod fit_layernorm;

use fuse_runtime::nvrtc;

#[test]
fn every_kernel_compiles_for_sm80_and_sm90_without_spills() {
    if !nvrtc::is_available() {
        let why = format!("NVRTC not found (searched {:?})", nvrtc::candidates());
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must have NVRTC: {why}"
        );
        eprintln!("skipping: {why}");
        return;
    }
    // Every entry point of every kernel: each path is a module of its own. `FUSE_NVRTC_ONLY=a,b`
    // takes only the kernels whose names are listed, to check a few in seconds;
    // `FUSE_NVRTC_SUFFIX=s` only the entry points whose symbols end with `s` (`_peeled`).
    let only = std::env::var("FUSE_NVRTC_ONLY").ok();
    let listed = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    let suffix = std::env::var("FUSE_NVRTC_SUFFIX").unwrap_or_default();
    let kernels: Vec<_> = fuse_runtime::__private::programs()
        .filter(|p| listed(p.name()))
        .flat_map(|p| p.entries.iter().map(|e| e.kernel))
        .filter(|k| k.symbol.ends_with(&suffix))
        .collect();
    assert!(
        kernels.len() >= 5 || only.is_some() || !suffix.is_empty(),
        "only {} entry points registered",
        kernels.len()
    );
    // `FUSE_DUMP_DIR=DIR` also writes each entry's CUDA C to `DIR/<symbol>.cu`, and its sm_90
    // CUBIN and ptxas report to `<symbol>.sm_90.cubin` and `.log`, to read its SASS (`cuobjdump
    // -sass` where a toolkit is) or to time variants of it by hand; with `FUSE_DUMP_ONLY=1`,
    // the CUDA C alone.
    let dump = std::env::var_os("FUSE_DUMP_DIR").map(std::path::PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir).expect("FUSE_DUMP_DIR is a writable folder");
    }
    // Kernels of one name in different modules (a test's `f32` and `f16` copies) dump as
    // `<name>`, `<name>.2`, ...
    let mut seen = std::collections::HashMap::new();
    let files: Vec<String> = kernels
        .iter()
        .map(|k| {
            let n = seen.entry(k.symbol).or_insert(0);
            *n += 1;
            match *n {
                1 => k.symbol.to_string(),
                n => format!("{}.{n}", k.symbol),
            }
        })
        .collect();
    if let Some(dir) = &dump {
        for (k, file) in kernels.iter().zip(&files) {
            let path = dir.join(format!("{file}.cu"));
            std::fs::write(&path, k.source).expect("FUSE_DUMP_DIR is a writable folder");
        }
        // `FUSE_DUMP_ONLY=1`: the CUDA C alone, to compare every entry's text before and after
        // a change in seconds.
        if std::env::var("FUSE_DUMP_ONLY").as_deref() == Ok("1") {
            return;
        }
    }
    let mut failures = vec![];
    for (k, file) in kernels.iter().zip(&files) {
        for arch in [80, 90] {
            match nvrtc::compile(k.source, k.symbol, arch, &[]) {
                Ok(c) => {
                    assert!(
                        c.cubin.starts_with(b"\x7fELF"),
                        "{} sm_{arch}: not a CUBIN",
                        k.name
                    );
                    if let (Some(dir), 90) = (&dump, arch) {
                        let path = |ext| dir.join(format!("{file}.sm_90.{ext}"));
                        std::fs::write(path("cubin"), &c.cubin)
                            .and_then(|()| std::fs::write(path("log"), &c.log))
                            .expect("FUSE_DUMP_DIR is a writable folder");
                    }
                    if let Some(line) = nvrtc::spills(&c.log) {
                        failures.push(format!("{file} sm_{arch} spills: {line}"));
                    }
                }
                Err(e) => failures.push(format!("{file} sm_{arch}: {e}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} kernels failed:\n{}",
        failures.len(),
        kernels.len(),
        failures.join("\n\n")
    );
    eprintln!(
        "{} kernels compiled for sm_80 and sm_90 without spills",
        kernels.len()
    );
}
