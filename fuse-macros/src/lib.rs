//! The `fuse!` macro. Documentation and the language reference live in `fuse-runtime`, which
//! re-exports this macro; depend on that crate, not on this one.
//!
//! The pipeline, one file a stage: `parse` (syntax tree, spans kept) → `check`, `typing`,
//! `special` and `fusion` (types, dims and fusion legality; every user error ends here) → `plan` (the launch schedule) → `cuda`
//! and `cpu` (the two backends) → `expand` (the generated Rust items). Nothing below this file
//! touches `proc_macro`, so every stage is an ordinary function with unit tests.

mod check;
mod cpu;
mod cuda;
mod error;
mod expand;
mod func;
mod fusion;
mod ir;
mod parse;
mod plan;
mod special;
#[cfg(test)]
mod testing;
mod ty;
mod typing;

/// Defines fused kernels; see the `fuse_runtime` crate documentation for the language.
#[proc_macro]
pub fn fuse(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    expand::fuse(input.into()).into()
}
