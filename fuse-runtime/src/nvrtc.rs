//! NVRTC: compiles CUDA C straight to CUBIN, so the driver has nothing left to JIT.
//!
//! Kernels are compiled with `--gpu-architecture=sm_XY --std=c++17 --ptxas-options=-v` and
//! NVRTC's IEEE defaults (no fast math). ptxas's report is read: an entry point that spills
//! registers under its `__launch_bounds__` is compiled again with a lower bound
//! ([`compile_entry`]). This module is public so tests can compile every kernel for several
//! architectures and read the report:
//!
//! ```no_run
//! # fn main() -> Result<(), fuse_runtime::Error> {
//! use fuse_runtime::nvrtc;
//! let source = r#"extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }"#;
//! let compiled = nvrtc::compile(source, "k.cu", 90, &[])?;
//! assert!(compiled.cubin.starts_with(b"\x7fELF"));
//! assert_eq!(nvrtc::spills(&compiled.log), None);
//! # Ok(())
//! # }
//! ```

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use cudarc::nvrtc::result::{self, NvrtcError};
use cudarc::nvrtc::sys;

use crate::error::Error;

/// The output of a successful [`compile`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// The CUBIN: an ELF image the driver loads without further compilation.
    pub cubin: Vec<u8>,
    /// NVRTC's log: warnings, and `ptxas`'s report of each entry's registers and spills.
    pub log: String,
    /// The blocks an SM that [`compile_entry`] took off the entry's declared
    /// `__launch_bounds__` minimum, where ptxas spilled under it; 0 from [`compile`].
    pub lowered: u32,
}

/// Whether the NVRTC library can be loaded, asked once per process.
pub fn is_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| crate::libs::present(&candidates()))
}

/// The library names searched for NVRTC, in order.
pub fn candidates() -> Vec<String> {
    crate::libs::candidates("nvrtc")
}

/// Which NVRTC build this process would load, without loading it: the resolved path, size and
/// modification time of the first candidate file in `LD_LIBRARY_PATH` or the usual CUDA and
/// system library directories. `None` if no candidate is found there (the loader may still find
/// one, through its cache). Loading NVRTC costs tens of milliseconds (it is over 100 MB), which a
/// process whose kernels are all in the disk cache should not pay.
pub(crate) fn identity() -> Option<String> {
    static IDENTITY: OnceLock<Option<String>> = OnceLock::new();
    IDENTITY
        .get_or_init(|| {
            let from_env = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
            let dirs = from_env.split(':').filter(|d| !d.is_empty()).chain([
                "/usr/local/cuda/lib64",
                "/usr/local/cuda/targets/x86_64-linux/lib",
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
                "/usr/lib",
            ]);
            let names = candidates();
            let found = dirs
                .flat_map(|d| names.iter().map(move |n| std::path::Path::new(d).join(n)))
                .find_map(|path| {
                    let real = std::fs::canonicalize(&path).ok()?;
                    let meta = std::fs::metadata(&real).ok()?;
                    let modified = meta
                        .modified()
                        .ok()?
                        .duration_since(std::time::UNIX_EPOCH)
                        .ok()?;
                    Some(format!(
                        "{} {} {}",
                        real.display(),
                        meta.len(),
                        modified.as_secs()
                    ))
                });
            found
        })
        .clone()
}

/// NVRTC's version as (major, minor), such as `(13, 0)`.
pub fn version() -> Result<(i32, i32), Error> {
    static VERSION: OnceLock<(i32, i32)> = OnceLock::new();
    if let Some(version) = VERSION.get() {
        return Ok(*version);
    }
    ensure_available()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above), and both pointers are to live local integers.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    status
        .result()
        .map_err(|e| nvrtc_error("nvrtcVersion", e))?;
    Ok(*VERSION.get_or_init(|| (major, minor)))
}

/// The options every kernel is compiled with, `{arch}` standing for the architecture number. The
/// list is the `fuse!` macro's, which compiles with it when it embeds CUBINs at build time
/// (`FUSE_CUBIN_ARCHS`), so both paths give the same CUBIN.
const OPTIONS: &[&str] = &fuse_macros::__nvrtc_options!();

/// The options every kernel is compiled with for `sm_{arch}`, then `extra`.
pub(crate) fn options(arch: u32, extra: &[&str]) -> Vec<String> {
    let arch = arch.to_string();
    OPTIONS
        .iter()
        .map(|o| o.replace("{arch}", &arch))
        .chain(extra.iter().map(|o| o.to_string()))
        .collect()
}

/// Compiles `source` (its log naming it `program_name`) to a CUBIN for `sm_{arch}`, with
/// `extra_options` after the standard ones.
///
/// On failure the error carries NVRTC's log and the source lines it complains about.
pub fn compile(
    source: &str,
    program_name: &str,
    arch: u32,
    extra_options: &[&str],
) -> Result<Compiled, Error> {
    ensure_usable()?;
    let options = options(arch, extra_options);
    let c_options = options
        .iter()
        .map(|o| c_string(o, program_name, "a compiler option"))
        .collect::<Result<Vec<_>, _>>()?;
    let program = Program::create(source, program_name)?;
    let compiled = program.compile(&c_options);
    let log = program.log();
    match compiled {
        Ok(()) => Ok(Compiled {
            cubin: program.cubin()?,
            log,
            lowered: 0,
        }),
        Err(_) => Err(Error::Compile {
            kernel: program_name.to_string(),
            line: error_lines(&log, source),
            log,
        }),
    }
}

/// The spill check and the steps that lower a spilling entry's register bound, written once in
/// the macro's `bounds.rs` (the macro compiles its build-time CUBINs through them too).
mod steps {
    fuse_macros::__compile_steps!();
}

pub use steps::spills;

/// Compiles the CUDA C of one `fuse!` entry point (`program_name` naming it in the log) for
/// `sm_{arch}` as the runtime loads it: as [`compile`] does, then, while ptxas reports a spill,
/// again with the entry's `__launch_bounds__` minimum of blocks per SM one lower (one, the most
/// registers, for an entry that declares none), down to one block. [`Compiled::lowered`] says by
/// how many blocks; [`Compiled::log`] is the last compile's.
pub fn compile_entry(source: &str, program_name: &str, arch: u32) -> Result<Compiled, Error> {
    let compile = |text: &str| compile(text, program_name, arch, &[]).map(|c| (c.cubin, c.log));
    let (cubin, log, lowered) = steps::compile_relaxed(source, compile)?;
    Ok(Compiled {
        cubin,
        log,
        lowered,
    })
}

/// The source lines that NVRTC's `name(LINE): error ...` log lines point at, in log order,
/// each once, as (line number, text).
pub(crate) fn error_lines(log: &str, source: &str) -> Vec<(usize, String)> {
    let source: Vec<&str> = source.lines().collect();
    let mut lines: Vec<(usize, String)> = Vec::new();
    for number in log.lines().filter_map(error_line_number) {
        let text = number.checked_sub(1).and_then(|i| source.get(i));
        if let Some(text) = text {
            if !lines.iter().any(|(n, _)| *n == number) {
                lines.push((number, text.to_string()));
            }
        }
    }
    lines
}

/// The line number of a log line such as `add.cu(12): error: ...`.
fn error_line_number(log_line: &str) -> Option<usize> {
    let (head, tail) = log_line.split_once("): ")?;
    if !(tail.starts_with("error") || tail.starts_with("catastrophic error")) {
        return None;
    }
    let open = head.rfind('(')?;
    head[open + 1..].parse().ok()
}

fn ensure_available() -> Result<(), Error> {
    if is_available() {
        Ok(())
    } else {
        Err(Error::NoNvrtc {
            searched: candidates(),
        })
    }
}

/// Fails unless NVRTC loads and is at least [`MIN_NVRTC`](crate::libs::MIN_NVRTC): cudarc
/// panics on the first call of a function the library lacks.
fn ensure_usable() -> Result<(), Error> {
    let (major, minor) = version()?;
    let number = |v: i32| u32::try_from(v).unwrap_or(0);
    crate::libs::check_nvrtc((number(major), number(minor)))
}

fn nvrtc_error(op: &'static str, e: NvrtcError) -> Error {
    Error::Cuda {
        op,
        detail: format!("{:?}", e.0),
    }
}

/// `text` as a C string; NVRTC cannot take text with a NUL byte in it.
fn c_string(text: &str, program_name: &str, what: &str) -> Result<CString, Error> {
    CString::new(text).map_err(|e| Error::Compile {
        kernel: program_name.to_string(),
        log: format!("{what} contains a NUL byte at offset {}", e.nul_position()),
        line: Vec::new(),
    })
}

/// An NVRTC program, destroyed on drop. It owns the C strings NVRTC may point into.
struct Program {
    raw: sys::nvrtcProgram,
    _source: CString,
    _name: CString,
}

impl Program {
    fn create(source: &str, name: &str) -> Result<Program, Error> {
        let c_source = c_string(source, name, "the source")?;
        let c_name = c_string(name, name, "the program name")?;
        let raw = result::create_program(&c_source, Some(&c_name))
            .map_err(|e| nvrtc_error("nvrtcCreateProgram", e))?;
        Ok(Program {
            raw,
            _source: c_source,
            _name: c_name,
        })
    }

    fn compile(&self, options: &[CString]) -> Result<(), NvrtcError> {
        // SAFETY: `self.raw` was created by `create_program` and is destroyed only on drop.
        unsafe { result::compile_program(self.raw, options) }
    }

    /// The program log, empty if NVRTC cannot give it.
    fn log(&self) -> String {
        // SAFETY: as in `compile`.
        let raw = unsafe { result::get_program_log(self.raw) }.unwrap_or_default();
        let bytes: Vec<u8> = raw
            .into_iter()
            .take_while(|&c| c != 0)
            .map(|c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn cubin(&self) -> Result<Vec<u8>, Error> {
        let mut size = 0usize;
        // SAFETY: `self.raw` is a live, successfully compiled program; `size` is a live local.
        let status = unsafe { sys::nvrtcGetCUBINSize(self.raw, &mut size) };
        status
            .result()
            .map_err(|e| nvrtc_error("nvrtcGetCUBINSize", e))?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds exactly the `size` bytes NVRTC just asked for.
        let status = unsafe { sys::nvrtcGetCUBIN(self.raw, cubin.as_mut_ptr().cast::<c_char>()) };
        status
            .result()
            .map_err(|e| nvrtc_error("nvrtcGetCUBIN", e))?;
        Ok(cubin)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.raw` was created by `create_program` and this is its only destroy.
        // A failure here would leak the program, which is all we could do about it anyway.
        let _ = unsafe { result::destroy_program(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nonzero_spills() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas info    : Function properties for k\n    \
                   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 12 registers\n\
                   ptxas info    : Function properties for big\n    \
                   40 bytes stack frame, 0 bytes spill stores, 36 bytes spill loads\n";
        assert_eq!(
            spills(log).as_deref(),
            Some("big: 40 bytes stack frame, 0 bytes spill stores, 36 bytes spill loads")
        );
        let clean = "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
        assert_eq!(spills(clean), None);
        assert_eq!(
            spills("    8 bytes spill stores, 0 bytes spill loads").as_deref(),
            Some("8 bytes spill stores, 0 bytes spill loads")
        );
        assert_eq!(spills(""), None);
    }

    #[test]
    fn extracts_error_lines() {
        let source = "line one\nline two\n  out[i] = q;\nline four\n";
        let log = "add.cu(3): error: identifier \"q\" is undefined\n\
                   add.cu(1): warning: something harmless\n\
                   add.cu(3): error: again\n\
                   add.cu(4): catastrophic error: cannot go on\n\
                   add.cu(99): error: past the end\n\
                   2 errors detected in the compilation of \"add.cu\".\n";
        assert_eq!(
            error_lines(log, source),
            [
                (3, "  out[i] = q;".to_string()),
                (4, "line four".to_string())
            ]
        );
        assert_eq!(error_lines("add.cu(0): error: x", source), []);
    }

    #[test]
    fn options_keep_ieee_defaults() {
        let options = options(80, &["--maxrregcount=64"]);
        assert_eq!(
            options,
            [
                "--gpu-architecture=sm_80",
                "--std=c++17",
                "--ptxas-options=-v",
                "--maxrregcount=64"
            ]
        );
        assert!(!options.iter().any(|o| o.contains("fast-math")));
    }

    #[test]
    fn nul_in_source_is_a_compile_error() {
        if !is_available() {
            return;
        }
        let error = compile("int x;\0", "nul.cu", 90, &[]).unwrap_err();
        assert!(matches!(error, Error::Compile { .. }), "{error}");
        assert!(
            error.to_string().contains("NUL byte at offset 6"),
            "{error}"
        );
    }

    #[test]
    fn compile_error_shows_the_line() {
        if !is_available() {
            return;
        }
        let source = "extern \"C\" __global__ void k(float* x) {\n  x[0] = undefined_name;\n}\n";
        let error = compile(source, "broken.cu", 90, &[]).unwrap_err();
        let Error::Compile { kernel, line, .. } = &error else {
            panic!("expected a compile error, got {error}");
        };
        assert_eq!(kernel, "broken.cu");
        assert_eq!(line, &[(2, "  x[0] = undefined_name;".to_string())]);
        assert!(
            error.to_string().contains("2 |   x[0] = undefined_name;"),
            "{error}"
        );
    }
}
