//! The derivatives of the random programs that have them (`#[vjp]` and `#[jvp]` of every float
//! parameter, about two in five of the programs without writes), on the CPU backend: forward
//! and reverse mode agree, `<J v, u> == <v, J^T u>` for drawn tangents `v` and cotangents `u`,
//! within the rounding of the values' types. Both modes share each operator's partial
//! derivatives but nothing else: the graph walked forwards against backwards, broadcasts
//! summed, reductions, gathers and permuted views differentiated each way, and every derived
//! launch planned and emitted for the CPU.

use fuse_runtime::Device;
use random_programs::oracle::Desc;
use random_programs::run::{instance, report, selected, Config};

#[test]
fn random_programs_derivatives_agree_in_both_modes() {
    both_modes_agree(&Device::cpu(), Config::from_env(2, 1 << 12));
}

/// The same on a GPU, on larger shapes: the derived launches' CUDA text, each mode's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn random_programs_derivatives_agree_on_the_gpu() {
    let gpu = match Device::cuda(0) {
        Ok(dev) => dev,
        Err(e) if std::env::var("FUSE_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("FUSE_REQUIRE_GPU=1, but there is no GPU: {e}")
        }
        Err(e) => return eprintln!("skipping: no GPU: {e}"),
    };
    both_modes_agree(&gpu, Config::from_env(4, 1 << 18));
}

fn both_modes_agree(dev: &Device, cfg: Config) {
    let (mut programs, mut runs, mut compared) = (0, 0, 0);
    let mut failures = vec![];
    for p in selected() {
        let Some(derive) = p.derive else { continue };
        programs += 1;
        let desc = Desc::parse(p.desc);
        for k in 0..cfg.shapes {
            let inst = instance(p, &desc, k, &cfg);
            runs += 1;
            match derive(dev, &inst.args) {
                Err(e) => failures.push(report(p, &inst, k, &format!("derivatives: {e}"))),
                Ok(adj) if !adj.finite() => {}
                Ok(adj) if adj.agrees() => compared += 1,
                Ok(adj) => failures.push(report(
                    p,
                    &inst,
                    k,
                    &format!("<J v, u> and <v, J^T u> differ: {adj:?}"),
                )),
            }
        }
    }
    eprintln!(
        "{programs} programs with derivatives on {dev}, {runs} runs, {compared} compared (the \
         others had values that are not finite), {} failures",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    // Not vacuous: most runs compare, unless `FUSE_RANDOM_ONLY` picked few programs.
    if programs >= 20 {
        assert!(
            compared * 2 >= runs,
            "only {compared} of {runs} runs compared"
        );
    }
}
