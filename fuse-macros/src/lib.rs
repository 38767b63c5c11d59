//! The `fuse!` macro. Documentation and the language reference live in `fuse-runtime`, which
//! re-exports this macro; depend on that crate, not on this one.
//!
//! The pipeline, one module a stage: `parse` (syntax tree, spans kept) → `check` (with `typing`
//! and `special`) and `fusion` (types, dims and fusion legality; every user error ends here) →
//! `plan` (the launch schedule as one value, a `Program`) → `cuda` and `cpu` (the two backends,
//! printers of that value) → `expand` (the generated Rust items). See doc/ARCHITECTURE.md. Nothing below this file
//! touches `proc_macro`, so every stage is an ordinary function with unit tests. With
//! `FUSE_CUBIN_ARCHS` set, `expand` also embeds CUBINs that `cubin` compiles with NVRTC.

mod abi;
mod bounds;
mod check;
mod consts;
mod cpu;
mod cubin;
mod cuda;
mod error;
mod expand;
mod func;
mod fusion;
#[cfg(test)]
mod fuzz;
mod grad;
mod ir;
mod limits;
mod parse;
mod plan;
mod rust;
#[cfg(test)]
mod testing;
mod ty;

/// Defines fused kernels; see the `fuse_runtime` crate documentation for the language.
#[proc_macro]
pub fn fuse(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    expand::fuse(input.into()).into()
}

/// A number the generated code and the runtime agree on (`BLOCK`, `CACHE`, `PORTABLE_CLUSTER`,
/// `MAX_CLUSTER`, `PART`, `PHILOX_W0`, `PHILOX_W1`, `ROUNDS`, `ALIGN`), as a `u32` literal: the
/// runtime defines its constants with it, so each is written once, in the macro's `abi.rs`.
#[doc(hidden)]
#[proc_macro]
pub fn __abi(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    let name = input.to_string();
    match abi::value(name.trim()) {
        Some(value) => quote::quote!(#value).into(),
        None => {
            let message = format!("no ABI constant named `{}`", name.trim());
            quote::quote!(::core::compile_error!(#message)).into()
        }
    }
}

/// The NVRTC options of every kernel, `{arch}` standing for the architecture number, as an array
/// of string literals: the runtime compiles with the same list the macro embeds CUBINs with.
#[doc(hidden)]
#[proc_macro]
pub fn __nvrtc_options(_input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    let options = cubin::OPTIONS;
    quote::quote!([#(#options),*]).into()
}

/// The items of the macro's `bounds.rs` (`spills`, `relax_bound`, `compile_relaxed`): the
/// runtime compiles each entry through them, as the macro does its build-time CUBINs, so the two
/// paths lower a spilling entry's register bound the same way, written once.
#[doc(hidden)]
#[proc_macro]
pub fn __compile_steps(_input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    compile_steps().parse().expect("bounds.rs is Rust")
}

/// `bounds.rs` as `__compile_steps!` gives it: without the module's own docs (`//!`), inner
/// attributes, which an item list cannot hold, nor its tests, which call the macro crate.
fn compile_steps() -> String {
    include_str!("bounds.rs")
        .lines()
        .take_while(|line| *line != "#[cfg(test)]")
        .filter(|line| !line.starts_with("//!"))
        .map(|line| format!("{line}\n"))
        .collect()
}
