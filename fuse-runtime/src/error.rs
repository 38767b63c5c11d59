//! The one error type of the runtime, with messages written as full sentences.

use std::fmt;
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::result::DriverError;

/// Everything that can go wrong when binding, compiling or launching a kernel, or when moving
/// data between the host and a device.
///
/// Every variant carries the facts needed to explain itself; `Display` writes a full sentence
/// that names the kernel, parameter, dimension and sizes involved.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A tensor argument has a different number of axes than the kernel signature declares.
    Rank {
        /// The kernel's Rust name.
        kernel: String,
        /// The parameter's name.
        param: String,
        /// The rank the signature declares.
        expected: usize,
        /// The rank of the buffer that was passed.
        found: usize,
    },
    /// A tensor argument disagrees with the size a dimension already has.
    Shape {
        /// The kernel's Rust name.
        kernel: String,
        /// The parameter whose size is wrong.
        param: String,
        /// The dimension: a named dim such as `cols`, or `axis 1 (fixed size 4)` for a
        /// literal size in the signature.
        dim: String,
        /// The size the dimension must have.
        expected: usize,
        /// The size the parameter has.
        found: usize,
        /// The parameter that fixed the size of a named dim, or `None` for a literal size.
        bound_by: Option<String>,
    },
    /// [`Buffer::reshape`](crate::Buffer::reshape) was asked for a shape with a different
    /// number of elements.
    Reshape {
        /// The buffer's shape.
        from: Vec<usize>,
        /// The requested shape.
        to: Vec<usize>,
    },
    /// Host data given to a buffer has a different length than the buffer.
    Length {
        /// The operation, such as `Buffer::copy_from`.
        op: &'static str,
        /// The buffer's number of elements.
        expected: usize,
        /// The length of the data that was given.
        found: usize,
    },
    /// A shape whose number of elements, or number of bytes, does not fit in `usize`.
    TooLarge {
        /// The requested shape.
        shape: Vec<usize>,
        /// The element type's Rust name.
        element: &'static str,
    },
    /// A buffer lives on another device than the one the kernel runs on.
    DeviceMismatch {
        /// The kernel's Rust name.
        kernel: String,
        /// The parameter (or argument position) holding the buffer.
        param: String,
        /// The device the kernel runs on.
        expected: String,
        /// The device the buffer lives on.
        found: String,
    },
    /// A kernel launch was requested on the CPU device; the generated code runs CPU kernels
    /// itself, so this means the runtime was called directly with the wrong device.
    NotCuda {
        /// The kernel's Rust name.
        kernel: String,
    },
    /// The CUDA driver library (`libcuda`) could not be loaded.
    NoDriver {
        /// The library names that were tried.
        searched: Vec<String>,
    },
    /// The CUDA driver is older than fuse needs.
    DriverTooOld {
        /// The CUDA version the driver supports, as (major, minor).
        found: (u32, u32),
        /// The oldest CUDA version whose driver fuse runs on.
        needed: (u32, u32),
    },
    /// There is no CUDA device with this ordinal.
    NoDevice {
        /// The requested ordinal.
        ordinal: usize,
        /// How many CUDA devices the driver reports.
        count: usize,
    },
    /// The NVRTC library (`libnvrtc`) could not be loaded.
    NoNvrtc {
        /// The library names that were tried.
        searched: Vec<String>,
    },
    /// The NVRTC library that was loaded is older than fuse needs.
    NvrtcTooOld {
        /// Its version, as (major, minor).
        found: (u32, u32),
        /// The oldest version fuse compiles with.
        needed: (u32, u32),
    },
    /// NVRTC rejected a kernel's source.
    Compile {
        /// The kernel (or program) name.
        kernel: String,
        /// NVRTC's full log.
        log: String,
        /// The source lines the log reports errors on, as (1-based line number, text).
        line: Vec<(usize, String)>,
    },
    /// A device allocation failed for lack of memory.
    OutOfMemory {
        /// The size of the allocation that failed.
        bytes: usize,
        /// The device, as its [`Device::name`](crate::Device::name) writes it.
        device: String,
    },
    /// Any other error reported by the CUDA driver or NVRTC.
    Cuda {
        /// The operation that failed, such as `cuModuleLoadData`.
        op: &'static str,
        /// The driver's name and description of the error.
        detail: String,
    },
    /// Memory or a stream from outside fuse (cudarc, a raw pointer, a raw stream) does not fit
    /// where it was given: another GPU or context, another element type, too few elements, a
    /// misaligned pointer, or storage other handles still share.
    Interop {
        /// The function that was given it, such as `BufferView::new`.
        op: &'static str,
        /// The parameter that does not fit.
        param: &'static str,
        /// What it should be.
        expected: String,
        /// What it is.
        found: String,
    },
    /// An output of a call shares memory with an input or another output (a handle made by
    /// `reshape`, or overlapping views): the kernel would read what it is writing.
    Alias {
        /// The kernel's Rust name.
        kernel: String,
        /// The output.
        output: String,
        /// The input or output it overlaps.
        other: String,
    },
    /// Something that would break a CUDA graph capture on the device's stream: a kernel's first
    /// use (compiling or loading its module), or scratch memory that must grow.
    Capture {
        /// What was asked, and how to do it before the capture.
        detail: String,
    },
    /// A broken invariant between generated code and the runtime: a bug in fuse.
    Internal {
        /// What was wrong.
        detail: String,
    },
}

impl std::error::Error for Error {}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Rank {
                kernel,
                param,
                expected,
                found,
            } => write!(
                f,
                "kernel `{kernel}`: parameter `{param}` has rank {found}, but the signature \
                 declares rank {expected}"
            ),
            Error::Shape {
                kernel,
                param,
                dim,
                expected,
                found,
                bound_by,
            } => write_shape(
                f,
                kernel,
                param,
                dim,
                *expected,
                *found,
                bound_by.as_deref(),
            ),
            Error::Reshape { from, to } => write!(
                f,
                "cannot reshape a buffer of shape {from:?} ({} elements) to {to:?} ({} elements)",
                count(from),
                count(to)
            ),
            Error::Length {
                op,
                expected,
                found,
            } => write!(
                f,
                "{op}: the buffer holds {expected} elements, but the data has {found}"
            ),
            Error::TooLarge { shape, element } => write!(
                f,
                "a buffer of shape {shape:?} of `{element}` has more bytes than this machine \
                 can address"
            ),
            Error::DeviceMismatch {
                kernel,
                param,
                expected,
                found,
            } => write!(
                f,
                "kernel `{kernel}`: parameter `{param}` lives on {found}, but the kernel runs \
                 on {expected}; move it with `device.upload(&buffer.to_vec()?)` first"
            ),
            Error::NotCuda { kernel } => write!(
                f,
                "kernel `{kernel}` was launched on the CPU device, but only CUDA devices run \
                 compiled kernels"
            ),
            Error::NoDriver { searched } => write!(
                f,
                "no CUDA driver: could not load the `cuda` library (searched for {}); install \
                 the NVIDIA driver, or use `Device::cpu()`",
                searched.join(", ")
            ),
            Error::DriverTooOld { found, needed } => write!(
                f,
                "the CUDA driver is too old: it supports CUDA {}.{}, and fuse needs CUDA {}.{} or \
                 newer; install a newer NVIDIA driver (CUDA 12.0 came with R525), or use \
                 `Device::cpu()`",
                found.0, found.1, needed.0, needed.1
            ),
            Error::NoDevice { ordinal, count } => write_no_device(f, *ordinal, *count),
            Error::NoNvrtc { searched } => write_no_nvrtc(f, searched),
            Error::NvrtcTooOld { found, needed } => write!(
                f,
                "NVRTC is too old: the `nvrtc` library loaded is version {}.{}, and fuse needs \
                 {}.{} or newer. Put a newer one's directory first on LD_LIBRARY_PATH, such as \
                 that of the `nvidia-cuda-nvrtc` wheel (with a link `libnvrtc.so` to its \
                 `libnvrtc.so.13`)",
                found.0, found.1, needed.0, needed.1
            ),
            Error::Compile { kernel, log, line } => write_compile(f, kernel, log, line),
            Error::OutOfMemory { bytes, device } => write!(
                f,
                "out of memory on {device}: could not allocate {bytes} bytes"
            ),
            Error::Cuda { op, detail } => write!(f, "CUDA error in `{op}`: {detail}"),
            Error::Interop {
                op,
                param,
                expected,
                found,
            } => write!(f, "`{op}`: `{param}` is {found}, but it must be {expected}"),
            Error::Alias {
                kernel,
                output,
                other,
            } => write!(
                f,
                "kernel `{kernel}`: output `{output}` shares memory with `{other}`; write the \
                 output into a buffer of its own"
            ),
            Error::Capture { detail } => write!(
                f,
                "not possible while the stream captures a CUDA graph: {detail}"
            ),
            Error::Internal { detail } => {
                write!(f, "internal error in fuse (please report it): {detail}")
            }
        }
    }
}

/// The number of elements of a shape, saturating instead of overflowing.
fn count(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
}

fn write_shape(
    f: &mut fmt::Formatter<'_>,
    kernel: &str,
    param: &str,
    dim: &str,
    expected: usize,
    found: usize,
    bound_by: Option<&str>,
) -> fmt::Result {
    match bound_by {
        Some(by) => write!(
            f,
            "kernel `{kernel}`: parameter `{param}` has `{dim}` = {found}, but `{by}` bound \
             `{dim}` = {expected}"
        ),
        None => write!(
            f,
            "kernel `{kernel}`: parameter `{param}` has size {found} on {dim}, but the \
             signature requires {expected}"
        ),
    }
}

fn write_no_device(f: &mut fmt::Formatter<'_>, ordinal: usize, count: usize) -> fmt::Result {
    match count {
        0 => write!(
            f,
            "no CUDA device {ordinal}: the driver is loaded but reports no CUDA devices"
        ),
        1 => write!(
            f,
            "no CUDA device {ordinal}: the driver reports 1 device (ordinal 0)"
        ),
        n => write!(
            f,
            "no CUDA device {ordinal}: the driver reports {n} devices (ordinals 0 to {})",
            n - 1
        ),
    }
}

fn write_no_nvrtc(f: &mut fmt::Formatter<'_>, searched: &[String]) -> fmt::Result {
    write!(
        f,
        "no NVRTC: could not load the `nvrtc` library (searched for {}). Put its directory on \
         LD_LIBRARY_PATH. A CUDA 13 NVRTC, such as the one in the `nvidia-cuda-nvrtc` wheel, \
         ships only `libnvrtc.so.13`: link `libnvrtc.so` to it in the same directory",
        searched.join(", ")
    )
}

fn write_compile(
    f: &mut fmt::Formatter<'_>,
    kernel: &str,
    log: &str,
    lines: &[(usize, String)],
) -> fmt::Result {
    write!(f, "NVRTC could not compile kernel `{kernel}`")?;
    if !lines.is_empty() {
        let width = lines
            .iter()
            .map(|(n, _)| n.to_string().len())
            .max()
            .unwrap_or(1);
        f.write_str("; the offending source:")?;
        for (number, text) in lines {
            write!(f, "\n{number:>width$} | {text}")?;
        }
    }
    let log = log.trim_end();
    if !log.is_empty() {
        write!(f, "\nNVRTC log:\n{log}")?;
    }
    Ok(())
}

/// Turns a driver error into an [`Error::Cuda`] naming the failed operation.
pub(crate) fn driver_error(op: &'static str, e: DriverError) -> Error {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
    let detail = match (name, text) {
        (Ok(name), Ok(text)) => format!("{name}: {text}"),
        _ => format!("driver error code {}", e.0 as u32),
    };
    Error::Cuda { op, detail }
}

/// Locks `mutex`, recovering the data if another thread panicked while holding it: every
/// structure behind our locks is valid between statements, so poisoning carries no meaning.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_message_names_everything() {
        let e = Error::Shape {
            kernel: "layernorm".into(),
            param: "gamma".into(),
            dim: "cols".into(),
            expected: 32,
            found: 31,
            bound_by: Some("x".into()),
        };
        assert_eq!(
            e.to_string(),
            "kernel `layernorm`: parameter `gamma` has `cols` = 31, but `x` bound `cols` = 32"
        );
    }

    #[test]
    fn compile_message_shows_source_lines_and_log() {
        let e = Error::Compile {
            kernel: "add".into(),
            log: "add.cu(9): error: identifier \"q\" is undefined\n".into(),
            line: vec![(9, "  out[i] = q;".into()), (12, "}".into())],
        };
        let text = e.to_string();
        assert!(text.contains(" 9 |   out[i] = q;"), "{text}");
        assert!(text.contains("12 | }"), "{text}");
        assert!(text.contains("identifier \"q\" is undefined"), "{text}");
    }

    #[test]
    fn too_old_names_both_versions_and_the_fix() {
        let driver = Error::DriverTooOld {
            found: (11, 8),
            needed: (12, 0),
        };
        assert_eq!(
            driver.to_string(),
            "the CUDA driver is too old: it supports CUDA 11.8, and fuse needs CUDA 12.0 or \
             newer; install a newer NVIDIA driver (CUDA 12.0 came with R525), or use \
             `Device::cpu()`"
        );
        let nvrtc = Error::NvrtcTooOld {
            found: (11, 2),
            needed: (12, 0),
        }
        .to_string();
        assert!(
            nvrtc.starts_with("NVRTC is too old: the `nvrtc` library loaded is version 11.2, and fuse needs 12.0 or newer."),
            "{nvrtc}"
        );
        assert!(nvrtc.contains("LD_LIBRARY_PATH"), "{nvrtc}");
    }

    #[test]
    fn no_device_counts() {
        let e = Error::NoDevice {
            ordinal: 3,
            count: 2,
        };
        assert_eq!(
            e.to_string(),
            "no CUDA device 3: the driver reports 2 devices (ordinals 0 to 1)"
        );
    }
}
