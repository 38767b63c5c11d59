//! Compile-fail tests of `fuse!`: every illegal kernel must be one precise error at the offending
//! tokens; `pass/` holds legal kernels that once failed to build. One folder a checking stage;
//! trybuild's glob does not recurse, so one call a folder.
//! Regenerate the expected output with `TRYBUILD=overwrite cargo test -p ui-tests` and read every
//! changed `.stderr` before keeping it.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    for stage in [
        "parse", "limits", "names", "types", "shapes", "index", "slice", "outputs", "fusion",
        "random", "grad", "write",
    ] {
        t.compile_fail(format!("tests/ui/{stage}/*.rs"));
    }
    // Kernels that once failed inside the expansion: they compile and run.
    t.pass("tests/ui/pass/*.rs");
}
