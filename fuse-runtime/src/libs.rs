//! Finding the CUDA libraries without cudarc's loader functions.
//!
//! cudarc has `is_culib_present` and `get_lib_name_candidates` only when it loads the libraries
//! at run time (`dynamic-loading`). A crate graph that also holds candle-core's CUDA feature asks
//! cudarc to link them instead (`dynamic-linking`), and those functions are gone: fuse asks with
//! these, which exist either way. The names are cudarc's, for the CUDA version cudarc was built
//! for, so a library found here is one cudarc's loader finds too.

use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};

use cudarc::driver::sys::CUDA_VERSION;

use crate::error::Error;

/// The oldest CUDA driver fuse runs on, as the CUDA version it supports: 12.0 brought the
/// cluster launches of long rows (`cuLaunchKernelEx`); nothing else fuse calls is newer. cudarc
/// loads each driver function on its first call and panics when the library lacks it, so an
/// older driver must be refused before.
pub(crate) const MIN_DRIVER: (u32, u32) = (12, 0);

/// The oldest NVRTC fuse compiles with: the long-row kernels use thread block clusters, which
/// came with CUDA 12.0.
pub(crate) const MIN_NVRTC: (u32, u32) = (12, 0);

/// A CUDA version as the driver reports it (`1000 * major + 10 * minor`, such as 12080) as
/// (major, minor).
pub(crate) fn cuda_version(encoded: i32) -> (u32, u32) {
    let encoded = u32::try_from(encoded).unwrap_or(0);
    (encoded / 1000, encoded % 1000 / 10)
}

/// Whether version `found` is `needed` or newer.
pub(crate) fn at_least(found: (u32, u32), needed: (u32, u32)) -> bool {
    found >= needed
}

/// `Ok` for a driver that supports CUDA `found` or newer than [`MIN_DRIVER`], else
/// [`Error::DriverTooOld`].
pub(crate) fn check_driver(found: (u32, u32)) -> Result<(), Error> {
    match at_least(found, MIN_DRIVER) {
        true => Ok(()),
        false => Err(Error::DriverTooOld {
            found,
            needed: MIN_DRIVER,
        }),
    }
}

/// `Ok` for NVRTC version `found` from [`MIN_NVRTC`] on, else [`Error::NvrtcTooOld`].
pub(crate) fn check_nvrtc(found: (u32, u32)) -> Result<(), Error> {
    match at_least(found, MIN_NVRTC) {
        true => Ok(()),
        false => Err(Error::NvrtcTooOld {
            found,
            needed: MIN_NVRTC,
        }),
    }
}

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

    #[test]
    fn versions_decode_and_compare() {
        assert_eq!(cuda_version(12080), (12, 8));
        assert_eq!(cuda_version(13000), (13, 0));
        assert_eq!(cuda_version(11040), (11, 4));
        assert_eq!(cuda_version(12100), (12, 10));
        assert_eq!(cuda_version(-1), (0, 0));
        assert!(at_least((12, 0), (12, 0)));
        assert!(at_least((13, 0), (12, 9)));
        assert!(
            at_least((12, 10), (12, 9)),
            "minor versions compare as numbers"
        );
        assert!(!at_least((11, 8), (12, 0)));
        assert!(!at_least((12, 1), (12, 2)));
        assert!(at_least(MIN_DRIVER, MIN_NVRTC) && at_least(MIN_NVRTC, MIN_DRIVER));
        // cudarc's bindings are never older than what fuse asks of the driver.
        assert!(at_least(cuda_version(CUDA_VERSION as i32), MIN_DRIVER));
    }

    #[test]
    fn old_libraries_are_errors_that_name_both_versions() {
        assert_eq!(check_driver((12, 0)), Ok(()));
        assert_eq!(check_driver((13, 0)), Ok(()));
        let driver = check_driver(cuda_version(11080)).unwrap_err();
        assert_eq!(
            driver,
            Error::DriverTooOld {
                found: (11, 8),
                needed: (12, 0)
            }
        );
        assert!(driver.to_string().contains("CUDA 11.8"), "{driver}");
        assert_eq!(check_nvrtc((12, 9)), Ok(()));
        let nvrtc = check_nvrtc((11, 2)).unwrap_err();
        assert_eq!(
            nvrtc,
            Error::NvrtcTooOld {
                found: (11, 2),
                needed: (12, 0)
            }
        );
        assert!(nvrtc.to_string().contains("version 11.2"), "{nvrtc}");
    }
}
