//! Random-program differential testing of `fuse!` (issue 23, item 1).
//!
//! `build.rs` generates a batch of random, well-typed `fuse!` functions from fixed seeds
//! (`gen/`), each with a data description of the same program. The tests run each program on
//! the CPU backend and compare it with [`oracle`], a float64 interpreter of the description that
//! shares nothing with the macro, within the tolerances of `doc/language.md`'s accuracy section;
//! the GPU test (`tests/random_gpu.rs`, [`gpu`]) also compares the GPU with both. See the
//! repository's `README.md`, "Random programs".

#[path = "../gen/ty.rs"]
pub mod ty;

pub mod gpu;
pub mod harness;
pub mod ops;
pub mod oracle;
pub mod paths;
pub mod reduce;
pub mod run;

/// One generated program.
pub struct Program {
    pub name: &'static str,
    pub seed: u64,
    /// The `fn` item, as compiled.
    pub text: &'static str,
    /// The description the oracle evaluates.
    pub desc: &'static str,
    /// Uploads the arguments to a device, calls the kernel, reads the outputs back.
    pub run:
        fn(&fuse_runtime::Device, &harness::Args) -> Result<Vec<harness::Out>, fuse_runtime::Error>,
    /// For a program with `#[vjp]` and `#[jvp]` of every float parameter: gathers `<J v, u>`
    /// and `<v, J^T u>` for the harness's tangents `v` and cotangents `u`.
    pub derive: Option<Derive>,
}

/// The glue that checks a program's derivatives (`Program::derive`).
pub type Derive =
    fn(&fuse_runtime::Device, &harness::Args) -> Result<harness::Adjoint, fuse_runtime::Error>;

include!(concat!(env!("OUT_DIR"), "/programs.rs"));
