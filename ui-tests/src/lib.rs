//! Compile-fail (trybuild) tests of the `fuse!` macro; this crate has no code of its own.
//!
//! Each case under `tests/ui/<stage>/` is one illegal kernel, named after its error, with the
//! expected compiler output beside it in a `.stderr` file. Run them with `cargo test -p ui-tests`.
