//! Build-time CUBINs: with `FUSE_CUBIN_ARCHS` set when this test is built, every kernel carries
//! a valid CUBIN for each architecture named, byte for byte what NVRTC gives at run time, and a
//! GPU of one of those architectures loads it on the first call without NVRTC.
//!
//! `FUSE_CUBIN_ARCHS=sm_90 cargo test -p fuse-runtime --test cubin` (CI runs this). Built without
//! the variable, it checks that nothing is embedded. The GPU test is ignored by default; run it
//! with `FUSE_REQUIRE_GPU=1 FUSE_CUBIN_ARCHS=sm_90 cargo test -p fuse-runtime --test cubin --
//! --ignored` on an sm_90 device.

use fuse_runtime::cache::{self, Origin};
use fuse_runtime::{fuse, nvrtc, Device, KernelInfo};

fuse! {
    /// An elementwise kernel.
    fn affine(x: [f32; n], a: f32) -> [f32; n] {
        x * a + 1.0
    }

    /// A row reduction.
    fn row_sum(x: [f32; rows, cols]) -> [f32; rows] {
        sum(x, cols)
    }

    /// A full reduction.
    fn total(x: [i64; n]) -> i64 {
        sum(x)
    }
}

/// The architectures this test was built for, as the `fuse!` macro read them.
fn requested() -> Vec<u32> {
    let text = option_env!("FUSE_CUBIN_ARCHS").unwrap_or("");
    let mut archs: Vec<u32> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|entry| !entry.is_empty())
        .map(|entry| entry.trim_start_matches("sm_").parse().unwrap())
        .collect();
    archs.sort_unstable();
    archs.dedup();
    archs
}

/// This file's kernels, as the runtime sees them.
fn kernels() -> Vec<&'static KernelInfo> {
    let names = ["affine", "row_sum", "total"];
    let found: Vec<_> = fuse_runtime::kernels()
        .filter(|k| names.contains(&k.name))
        .collect();
    assert_eq!(found.len(), names.len());
    found
}

#[test]
fn embeds_a_valid_cubin_per_requested_arch() {
    let archs = requested();
    if archs.is_empty() {
        eprintln!("built without FUSE_CUBIN_ARCHS: checking that nothing is embedded");
    }
    for kernel in kernels() {
        let embedded: Vec<u32> = kernel.cubins.iter().map(|(arch, _)| *arch).collect();
        assert_eq!(embedded, archs, "{}", kernel.name);
        for &(arch, cubin) in kernel.cubins {
            assert!(cubin.starts_with(b"\x7fELF"), "{} sm_{arch}", kernel.name);
            // e_machine, at offset 18 of the ELF header: 190 is EM_CUDA.
            assert_eq!(cubin[18..20], 190u16.to_le_bytes(), "{}", kernel.name);
            assert_eq!(kernel.cubin(arch), Some(cubin));
        }
    }
}

/// The embedded CUBIN is the one the runtime would compile: the same NVRTC options, one list,
/// and the same steps where ptxas spills (`nvrtc::compile_entry`).
#[test]
fn embedded_cubin_is_what_nvrtc_gives_at_run_time() {
    if !nvrtc::is_available() {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI must have NVRTC"
        );
        return eprintln!("skipping: no NVRTC");
    }
    for kernel in kernels() {
        for &(arch, cubin) in kernel.cubins {
            let program = format!("{}.cu", kernel.name);
            let compiled = nvrtc::compile_entry(kernel.source, &program, arch).unwrap();
            assert!(compiled.cubin == cubin, "{} sm_{arch} differs", kernel.name);
        }
    }
}

/// CUDA device 0, or `None` (with the reason printed) when there is none.
fn gpu() -> Option<Device> {
    match Device::cuda(0) {
        Ok(dev) => Some(dev),
        Err(e) if std::env::var("FUSE_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("FUSE_REQUIRE_GPU=1, but there is no usable GPU: {e}")
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

fn kernel(name: &str) -> &'static KernelInfo {
    kernels().into_iter().find(|k| k.name == name).unwrap()
}

/// The first call loads the embedded CUBIN when there is one for the device, and gives the
/// right answer; with embedded CUBINs turned off, a kernel goes through NVRTC again.
///
/// One test, because `set_embedded_cubins` is process-wide.
#[test]
#[ignore = "needs a CUDA GPU"]
fn first_call_loads_the_embedded_cubin() {
    let Some(dev) = gpu() else { return };
    // An empty cache directory: a kernel not embedded must be compiled now.
    let dir = std::env::temp_dir().join(format!("fuse-cubin-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    fuse_runtime::set_cache_dir(Some(dir.clone()));
    let (major, minor) = dev.compute_capability().unwrap();
    let arch = major * 10 + minor;
    let affine_kernel = kernel("affine");
    let expected = match affine_kernel.cubin(arch) {
        Some(_) => Origin::Embedded,
        None => {
            eprintln!("note: no CUBIN embedded for sm_{arch}; checking the NVRTC path only");
            Origin::Nvrtc
        }
    };

    assert_eq!(dev.kernel_origin(affine_kernel), None);
    let x = dev.upload(&[1.0f32, -2.0, 0.5, 3.0]).unwrap();
    let y = affine(&dev, &x, 2.0).unwrap();
    assert_eq!(y.to_vec().unwrap(), [3.0, -3.0, 2.0, 7.0]);
    assert_eq!(dev.kernel_origin(affine_kernel), Some(expected));

    let rows = dev.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let sums = row_sum(&dev, &rows.reshape(&[2, 3]).unwrap()).unwrap();
    assert_eq!(sums.to_vec().unwrap(), [6.0, 15.0]);
    assert_eq!(dev.kernel_origin(kernel("row_sum")), Some(expected));

    cache::set_embedded_cubins(false);
    let values: Vec<i64> = (1..=1000).collect();
    let sum = total(&dev, &dev.upload(&values).unwrap());
    cache::set_embedded_cubins(true);
    assert_eq!(sum.unwrap().to_vec().unwrap(), [500_500]);
    assert_eq!(dev.kernel_origin(kernel("total")), Some(Origin::Nvrtc));
    let _ = std::fs::remove_dir_all(&dir);
}
