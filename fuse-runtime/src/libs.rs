//! Finding the CUDA libraries without cudarc's loader functions.
//!
//! cudarc has `is_culib_present` and `get_lib_name_candidates` only when it loads the libraries
//! at run time (`dynamic-loading`). A crate graph that also holds candle-core's CUDA feature asks
//! cudarc to link them instead (`dynamic-linking`), and those functions are gone: fuse asks with
//! these, which exist either way. The names are cudarc's, for the CUDA version cudarc was built
//! for, so a library found here is one cudarc's loader finds too.

use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};

use cudarc::driver::sys::CUDA_VERSION;

/// The file names cudarc tries for the library `name` (`"cuda"`, `"nvrtc"`), in its order.
///
/// ```
/// let names = fuse_runtime::nvrtc::candidates();
/// assert!(names.iter().any(|n| n == "libnvrtc.so" || n == "nvrtc.dll"));
/// ```
pub(crate) fn candidates(name: &str) -> Vec<String> {
    let (major, minor) = (CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
    let (pre, suf, bits) = (DLL_PREFIX, DLL_SUFFIX, usize::BITS);
    let names = [
        format!("{pre}{name}{suf}"),
        format!("{pre}{name}{bits}{suf}"),
        format!("{pre}{name}{bits}_{major}{suf}"),
        format!("{pre}{name}{bits}_{major}{minor}{suf}"),
        format!("{pre}{name}{bits}_{major}{minor}_0{suf}"),
        format!("{pre}{name}{bits}_{major}0_{minor}{suf}"),
        format!("{pre}{name}{bits}_10{suf}"),
        format!("{pre}{name}{bits}_11{suf}"),
        format!("{pre}{name}{bits}_12{suf}"),
        format!("{pre}{name}{bits}_{major}0_0{suf}"),
        format!("{pre}{name}{bits}_9{suf}"),
        format!("{pre}{name}{suf}.{major}"),
        format!("{pre}{name}{suf}.12"),
        format!("{pre}{name}{suf}.11"),
        format!("{pre}{name}{suf}.10"),
        format!("{pre}{name}{suf}.9"),
        format!("{pre}{name}{suf}.1"),
    ];
    unique(names.into())
}

/// Whether one of `names` can be loaded.
pub(crate) fn present(names: &[String]) -> bool {
    // SAFETY: loading a CUDA library (the driver or NVRTC) runs no initialisation that could
    // break this process; the handle is closed again when it drops here.
    names
        .iter()
        .any(|name| unsafe { libloading::Library::new(name) }.is_ok())
}

/// `names` without repeats, in first-seen order.
pub(crate) fn unique(names: Vec<String>) -> Vec<String> {
    let mut seen = Vec::with_capacity(names.len());
    for name in names {
        if !seen.contains(&name) {
            seen.push(name);
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_cudarcs_cuda_version() {
        let names = candidates("nvrtc");
        let major = CUDA_VERSION / 1000;
        assert!(major >= 12, "cudarc built for CUDA {CUDA_VERSION}");
        if cfg!(target_os = "linux") {
            assert_eq!(names[0], "libnvrtc.so");
            assert!(names.contains(&format!("libnvrtc.so.{major}")));
            assert!(names.contains(&"libnvrtc.so.12".to_string()));
        }
        assert_eq!(names.len(), unique(names.clone()).len());
        assert!(!present(&["surely-no-such-library.so.7".to_string()]));
    }
}
