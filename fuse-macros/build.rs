//! Tells Cargo to rebuild this crate, and so re-expand every `fuse!`, when `FUSE_CUBIN_ARCHS`
//! changes: the macro reads it to embed build-time CUBINs, and a proc macro on stable cannot
//! tell Cargo which environment variables it read.

fn main() {
    println!("cargo:rerun-if-env-changed=FUSE_CUBIN_ARCHS");
}
