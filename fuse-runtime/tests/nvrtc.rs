//! NVRTC compiles a hand-written kernel to CUBIN for the architectures we ship for.
//!
//! Runs without a GPU. When NVRTC cannot be loaded the tests pass with a note, except in CI
//! (`CI=true`), which must have NVRTC.

use fuse_runtime::{nvrtc, Error};

const SAXPY: &str = r#"
extern "C" __global__ void fuse_saxpy(const float* x, const float* y, float* out, float a,
                                      unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = a * x[i] + y[i];
    }
}
"#;

/// Whether NVRTC is there; panics in CI when it is not.
fn nvrtc_present() -> bool {
    if nvrtc::is_available() {
        return true;
    }
    let reason = Error::NoNvrtc {
        searched: nvrtc::candidates(),
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI must have NVRTC: {reason}");
    }
    eprintln!("skipping: {reason}");
    false
}

#[test]
fn compiles_to_cubin_for_sm80_and_sm90() {
    if !nvrtc_present() {
        return;
    }
    let (major, minor) = nvrtc::version().unwrap();
    assert!(major >= 11, "NVRTC {major}.{minor}");
    for arch in [80, 90] {
        let compiled = nvrtc::compile(SAXPY, "saxpy.cu", arch, &["--ptxas-options=-v"]).unwrap();
        assert!(
            compiled.cubin.len() > 64,
            "sm_{arch}: {} bytes",
            compiled.cubin.len()
        );
        assert_eq!(&compiled.cubin[..4], b"\x7fELF", "sm_{arch}");
        assert!(
            compiled.log.contains("fuse_saxpy"),
            "sm_{arch} log: {}",
            compiled.log
        );
        assert_eq!(
            nvrtc::spills(&compiled.log),
            None,
            "sm_{arch} log: {}",
            compiled.log
        );
    }
}

#[test]
fn compile_errors_point_at_the_source_line() {
    if !nvrtc_present() {
        return;
    }
    let broken = SAXPY.replace("a * x[i]", "a * x[i] * missing_name");
    let err = nvrtc::compile(&broken, "saxpy.cu", 90, &[]).unwrap_err();
    let Error::Compile { kernel, log, line } = &err else {
        panic!("expected a compile error, got {err}");
    };
    assert_eq!(kernel, "saxpy.cu");
    assert!(log.contains("missing_name"), "{log}");
    assert_eq!(line.len(), 1, "{line:?}");
    assert!(
        line[0]
            .1
            .contains("out[i] = a * x[i] * missing_name + y[i];"),
        "{line:?}"
    );
    let text = err.to_string();
    assert!(text.contains(&format!("{} | ", line[0].0)), "{text}");
}

#[test]
fn bad_option_is_a_compile_error() {
    if !nvrtc_present() {
        return;
    }
    let err = nvrtc::compile(SAXPY, "saxpy.cu", 90, &["--no-such-option"]).unwrap_err();
    assert!(matches!(err, Error::Compile { .. }), "{err}");
}

#[test]
fn disk_cache_reuses_a_compiled_kernel() {
    if !nvrtc_present() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("fuse-nvrtc-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    fuse_runtime::set_cache_dir(Some(dir.clone()));
    let source = format!("{SAXPY}\n// cache test {}\n", std::process::id());
    let first = fuse_runtime::cache::cubin(&source, "saxpy.cu", 90).unwrap();
    assert!(!first.from_disk);
    let path = fuse_runtime::cache::entry_path(&source, 90)
        .unwrap()
        .unwrap();
    assert!(
        path.starts_with(&dir) && path.exists(),
        "{}",
        path.display()
    );
    let second = fuse_runtime::cache::cubin(&source, "saxpy.cu", 90).unwrap();
    assert!(second.from_disk);
    assert_eq!(first.bytes, second.bytes);

    // A corrupt entry is recompiled and overwritten, never an error.
    std::fs::write(&path, b"garbage").unwrap();
    let third = fuse_runtime::cache::cubin(&source, "saxpy.cu", 90).unwrap();
    assert!(!third.from_disk);
    assert!(
        fuse_runtime::cache::cubin(&source, "saxpy.cu", 90)
            .unwrap()
            .from_disk
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
