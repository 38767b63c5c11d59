//! Running programs: the instances (shapes and inputs) of each, the checks, and the reports.
//!
//! Environment (read by the tests):
//! - `FUSE_RANDOM_SHAPES=N`: instances (dim sizes and inputs) per program (tests choose a default);
//! - `FUSE_RANDOM_ONLY=p12,p40`: run only these programs;
//! - `FUSE_RANDOM_INPUT_SEED=S`: the base of every instance's seed (default 0), to draw new inputs;
//! - `FUSE_RANDOM_BUDGET=N`: the most elements of a domain (tests choose a default: 2^15 on the
//!   CPU, 2^21 on the GPU), so that the CPU run draws a GPU failure's dim sizes again.

use crate::harness::{self, Counts, Out};
use crate::oracle::{Desc, WriteStats};
use crate::ty::Rng;
use crate::Program;
use fuse_runtime::Device;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What one run of many programs does.
pub struct Config {
    /// Instances per program.
    pub shapes: usize,
    /// The most elements of a domain.
    pub budget: usize,
    pub base_seed: u64,
}

impl Config {
    /// From the environment, with `shapes` instances per program by default.
    pub fn from_env(shapes: usize, budget: usize) -> Config {
        let num = |name: &str| {
            std::env::var(name).ok().map(|v| {
                let v = v.trim();
                match v.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16),
                    None => v.parse(),
                }
                .unwrap_or_else(|e| panic!("{name}={v}: {e}"))
            })
        };
        Config {
            shapes: num("FUSE_RANDOM_SHAPES").map_or(shapes, |n| n as usize),
            budget: num("FUSE_RANDOM_BUDGET").map_or(budget, |n| n as usize),
            base_seed: num("FUSE_RANDOM_INPUT_SEED").unwrap_or(0),
        }
    }
}

/// The programs selected by `FUSE_RANDOM_ONLY`, else all of them.
pub fn selected() -> Vec<&'static Program> {
    let only = std::env::var("FUSE_RANDOM_ONLY").unwrap_or_default();
    let names: Vec<&str> = only
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    crate::PROGRAMS
        .iter()
        .filter(|p| names.is_empty() || names.contains(&p.name))
        .collect()
}

/// One instance of a program: its seed, dim sizes and arguments.
pub struct Instance {
    pub seed: u64,
    pub sizes: Vec<usize>,
    pub args: harness::Args,
}

pub fn instance(p: &Program, desc: &Desc, k: usize, cfg: &Config) -> Instance {
    instance_with(p, desc, k, cfg, None)
}

/// [`instance`], with dim `fixed.0` of size `fixed.1` where given.
pub fn instance_with(
    p: &Program,
    desc: &Desc,
    k: usize,
    cfg: &Config,
    fixed: Option<(usize, usize)>,
) -> Instance {
    let seed = p.seed ^ cfg.base_seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (k as u64 + 1) << 48;
    let mut rng = Rng(seed);
    let sizes = harness::sizes_with(desc, &mut rng, cfg.budget, fixed);
    let special = rng.percent(25);
    let args = harness::args(desc, &sizes, &mut rng, special);
    Instance { seed, sizes, args }
}

/// Calls the program on `dev`, turning a panic into an error.
pub fn call(p: &Program, dev: &Device, inst: &Instance) -> Result<Vec<Out>, String> {
    match catch_unwind(AssertUnwindSafe(|| (p.run)(dev, &inst.args))) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("the call failed: {e}")),
        Err(panic) => Err(format!(
            "the call panicked: {}",
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("?")
        )),
    }
}

/// The CPU backend against the oracle on instance `k`: the elements checked, and what the
/// writes through `&mut` parameters did.
pub fn check_cpu(
    p: &Program,
    desc: &Desc,
    k: usize,
    cfg: &Config,
) -> Result<(Counts, WriteStats), String> {
    let inst = instance(p, desc, k, cfg);
    let got = call(p, &Device::cpu(), &inst).map_err(|e| report(p, &inst, k, &e))?;
    let (want, stats) = harness::oracle_with_stats(desc, &inst.sizes, &inst.args);
    let counts = harness::against_oracle(desc, &got, &want, &inst.sizes)
        .map_err(|e| report(p, &inst, k, &format!("CPU against the oracle: {e}")))?;
    Ok((counts, stats))
}

/// The GPU against the CPU backend and the oracle on `inst`, instance `k` of `p`.
pub fn check_gpu(
    p: &Program,
    desc: &Desc,
    gpu: &Device,
    k: usize,
    inst: &Instance,
) -> Result<(Counts, WriteStats), String> {
    let fail = |what: String| report(p, inst, k, &what);
    let on_gpu = call(p, gpu, inst).map_err(|e| fail(format!("GPU: {e}")))?;
    let on_cpu = call(p, &Device::cpu(), inst).map_err(|e| fail(format!("CPU: {e}")))?;
    let (want, stats) = harness::oracle_with_stats(desc, &inst.sizes, &inst.args);
    let counts = harness::against_oracle(desc, &on_gpu, &want, &inst.sizes)
        .map_err(|e| fail(format!("GPU against the oracle: {e}")))?;
    harness::gpu_against_cpu(desc, &on_gpu, &on_cpu, &want, &inst.sizes)
        .map_err(|e| fail(format!("GPU against CPU: {e}")))?;
    Ok((counts, stats))
}

/// A failure, with what it takes to run it again.
pub fn report(p: &Program, inst: &Instance, k: usize, what: &str) -> String {
    format!(
        "program {} (seed {:#x}), instance {k} (input seed {:#x}, dim sizes {:?}): {what}\n\
         replay: FUSE_RANDOM_ONLY={} FUSE_RANDOM_SHAPES={} (and the same FUSE_RANDOM_INPUT_SEED)\n{}",
        p.name,
        p.seed,
        inst.seed,
        inst.sizes,
        p.name,
        k + 1,
        p.text
    )
}
