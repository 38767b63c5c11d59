//! Build-time CUBINs, opt-in: with `FUSE_CUBIN_ARCHS` set (`sm_90`, `sm_80,sm_90`, or `90`), each
//! kernel is compiled by NVRTC while the macro expands, once for each named architecture, and the
//! CUBINs are embedded beside the CUDA C. The runtime then loads the CUBIN of the device's
//! architecture directly: the first call costs a module load, not an NVRTC compile. Devices of
//! other architectures still compile the CUDA C at run time.
//!
//! NVRTC is loaded with `libloading` (already in every build through `cudarc`), and called
//! through the handful of functions below, declared by hand, so the macro needs no CUDA crate.
//! Cargo reruns `build.rs`, and so rebuilds this crate and every crate that uses it, when
//! `FUSE_CUBIN_ARCHS` changes: a proc macro on stable cannot tell Cargo which variables it read.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

use proc_macro2::{Ident, Literal, TokenStream};
use quote::quote;

use crate::error;

/// The environment variable that names the architectures to compile for at build time.
pub const ARCHS_VAR: &str = "FUSE_CUBIN_ARCHS";

/// The NVRTC options of every kernel, `{arch}` standing for the architecture number (`90` for
/// `sm_90`). The runtime reads this same list through `__nvrtc_options!`, so a CUBIN embedded now
/// and one compiled at run time come from the same compile. ptxas's report (`-v`) is read for
/// spills (`bounds.rs`).
pub const OPTIONS: [&str; 3] = [
    "--gpu-architecture=sm_{arch}",
    "--std=c++17",
    "--ptxas-options=-v",
];

/// [`OPTIONS`] for `sm_{arch}`.
pub fn options(arch: u32) -> Vec<String> {
    let arch = arch.to_string();
    OPTIONS.iter().map(|o| o.replace("{arch}", &arch)).collect()
}

/// The architectures `FUSE_CUBIN_ARCHS` asks for, empty when it is unset or empty. When it names
/// some, NVRTC must be there and support each; otherwise, the message to show. These are the
/// mistakes of the whole build, which a macro invocation reports once, not once per kernel.
pub fn requested() -> Result<Vec<u32>, String> {
    let archs = match std::env::var(ARCHS_VAR) {
        Ok(text) => parse_archs(&text)?,
        Err(std::env::VarError::NotPresent) => Vec::new(),
        Err(std::env::VarError::NotUnicode(text)) => {
            return Err(error::cubin_arch(&text.to_string_lossy()))
        }
    };
    if !archs.is_empty() {
        Nvrtc::get()
            .map_err(error::cubin_no_nvrtc)?
            .check_supported(&archs)?;
    }
    Ok(archs)
}

/// [`requested`], for a `fuse!` whose first kernel is named `first`: the architectures, and
/// the error of a bad setting at that name (then there are none). Reported once, and with the
/// items still emitted in full, a bad setting gives no other error.
pub fn requested_at(first: Option<&Ident>) -> (Vec<u32>, TokenStream) {
    match (requested(), first) {
        (Ok(archs), _) => (archs, TokenStream::new()),
        (Err(message), Some(name)) => (
            vec![],
            syn::Error::new(name.span(), message).to_compile_error(),
        ),
        (Err(_), None) => (vec![], TokenStream::new()),
    }
}

/// The `&[(arch, CUBIN)]` expression of the CUBINs of kernel `name` for each of `archs`, and, if
/// NVRTC failed, the error at the kernel's name (the list is then empty).
pub fn embed(name: &Ident, source: &str, archs: &[u32]) -> (TokenStream, TokenStream) {
    match compile_all(source, &crate::ir::plain_name(name), archs) {
        Ok(cubins) => {
            let entries = cubins.iter().map(|(arch, bytes)| {
                let bytes = Literal::byte_string(bytes);
                quote!((#arch, #bytes))
            });
            (quote!(&[#(#entries),*]), TokenStream::new())
        }
        Err(message) => (
            quote!(&[]),
            syn::Error::new(name.span(), message).to_compile_error(),
        ),
    }
}

/// The architecture numbers of a list such as `sm_80,sm_90` or `80 90`, sorted, each once.
pub fn parse_archs(text: &str) -> Result<Vec<u32>, String> {
    let mut archs = Vec::new();
    for entry in text.split(|c: char| c == ',' || c.is_whitespace()) {
        if entry.is_empty() {
            continue;
        }
        let digits = entry.strip_prefix("sm_").unwrap_or(entry);
        let arch = match digits.parse::<u32>() {
            Ok(arch)
                if digits.bytes().all(|b| b.is_ascii_digit()) && (10..1000).contains(&arch) =>
            {
                arch
            }
            _ => return Err(error::cubin_arch(entry)),
        };
        archs.push(arch);
    }
    archs.sort_unstable();
    archs.dedup();
    Ok(archs)
}

/// The CUBIN of `source` for each of `archs`, in order; `kernel` names the program in NVRTC's log.
/// On failure, the message to show at the kernel's name.
pub fn compile_all(
    source: &str,
    kernel: &str,
    archs: &[u32],
) -> Result<Vec<(u32, Vec<u8>)>, String> {
    if archs.is_empty() {
        return Ok(Vec::new());
    }
    let nvrtc = Nvrtc::get().map_err(error::cubin_no_nvrtc)?;
    archs
        .iter()
        .map(|&arch| Ok((arch, nvrtc.compile(source, kernel, arch)?)))
        .collect()
}

/// The library names NVRTC is looked for under, in order: the plain name first, as the runtime
/// (cudarc) looks for it, then the CUDA 13 and 12 sonames, which a wheel or toolkit may ship alone.
fn candidates() -> Vec<String> {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    let plain = format!("{DLL_PREFIX}nvrtc{DLL_SUFFIX}");
    if cfg!(windows) {
        let versions = ["64_130_0", "64_120_0"];
        return [plain]
            .into_iter()
            .chain(versions.map(|v| format!("nvrtc{v}{DLL_SUFFIX}")))
            .collect();
    }
    [plain.clone(), format!("{plain}.13"), format!("{plain}.12")].into()
}

/// `nvrtcResult`: 0 is success.
type Status = c_int;
/// `nvrtcProgram`, an opaque handle.
type Program = *mut std::ffi::c_void;

/// The NVRTC functions the macro calls. The library stays loaded for the rest of the compiler's
/// run (it is in a `static`), so the function pointers never dangle.
struct Nvrtc {
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    num_archs: unsafe extern "C" fn(*mut c_int) -> Status,
    archs: unsafe extern "C" fn(*mut c_int) -> Status,
    _library: libloading::Library,
}

impl Nvrtc {
    /// NVRTC, loaded on first use; on failure, the names that were searched.
    fn get() -> Result<&'static Nvrtc, &'static [String]> {
        static NVRTC: OnceLock<Result<Nvrtc, Vec<String>>> = OnceLock::new();
        NVRTC
            .get_or_init(|| {
                let names = candidates();
                names.iter().find_map(|name| Nvrtc::load(name)).ok_or(names)
            })
            .as_ref()
            .map_err(Vec::as_slice)
    }

    /// NVRTC from the library file `name`, if it loads and has every function.
    fn load(name: &str) -> Option<Nvrtc> {
        // SAFETY: loading NVRTC runs only its own initialisers, which touch no state of ours.
        let library = unsafe { libloading::Library::new(name) }.ok()?;
        // SAFETY: each symbol is NVRTC's C function of that name, whose signature (from
        // `nvrtc.h`, unchanged since CUDA 11.1) is the type it is read as. The pointers are used
        // only while `library`, stored beside them, keeps the library loaded.
        unsafe {
            Some(Nvrtc {
                create: *library.get(b"nvrtcCreateProgram\0").ok()?,
                compile: *library.get(b"nvrtcCompileProgram\0").ok()?,
                cubin_size: *library.get(b"nvrtcGetCUBINSize\0").ok()?,
                cubin: *library.get(b"nvrtcGetCUBIN\0").ok()?,
                log_size: *library.get(b"nvrtcGetProgramLogSize\0").ok()?,
                log: *library.get(b"nvrtcGetProgramLog\0").ok()?,
                destroy: *library.get(b"nvrtcDestroyProgram\0").ok()?,
                error_string: *library.get(b"nvrtcGetErrorString\0").ok()?,
                version: *library.get(b"nvrtcVersion\0").ok()?,
                num_archs: *library.get(b"nvrtcGetNumSupportedArchs\0").ok()?,
                archs: *library.get(b"nvrtcGetSupportedArchs\0").ok()?,
                _library: library,
            })
        }
    }

    /// Fails, naming the first of `archs` that this NVRTC cannot compile for, and those it can.
    fn check_supported(&self, archs: &[u32]) -> Result<(), String> {
        let supported = self
            .supported()
            .map_err(|(function, status)| self.call_error(function, status, None))?;
        match archs.iter().find(|arch| !supported.contains(arch)) {
            None => Ok(()),
            Some(&arch) => {
                let (mut major, mut minor) = (0, 0);
                // SAFETY: both pointers are to live local integers.
                unsafe { (self.version)(&mut major, &mut minor) };
                Err(error::cubin_unsupported(arch, (major, minor), &supported))
            }
        }
    }

    /// The architectures this NVRTC compiles for, or the failed function and its status.
    fn supported(&self) -> Result<Vec<u32>, (&'static str, Status)> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a live local.
        match unsafe { (self.num_archs)(&mut count) } {
            0 => {}
            status => return Err(("nvrtcGetNumSupportedArchs", status)),
        }
        let mut archs: Vec<c_int> = vec![0; usize::try_from(count).unwrap_or(0)];
        // SAFETY: `archs` holds the `count` integers NVRTC just said it would write.
        match unsafe { (self.archs)(archs.as_mut_ptr()) } {
            0 => Ok(archs
                .into_iter()
                .filter_map(|a| u32::try_from(a).ok())
                .collect()),
            status => Err(("nvrtcGetSupportedArchs", status)),
        }
    }

    /// The CUBIN of `source` for `sm_{arch}`, its register bound lowered where ptxas spills
    /// under it (`bounds.rs`, as the runtime compiles it), or the message to show.
    fn compile(&self, source: &str, kernel: &str, arch: u32) -> Result<Vec<u8>, String> {
        let compile = |text: &str| self.compile_once(text, kernel, arch);
        crate::bounds::compile_relaxed(source, compile).map(|(cubin, _, _)| cubin)
    }

    /// The CUBIN of `source` for `sm_{arch}` and NVRTC's log, or the message to show.
    fn compile_once(
        &self,
        source: &str,
        kernel: &str,
        arch: u32,
    ) -> Result<(Vec<u8>, String), String> {
        let options = options(arch);
        let program = self.program(source, kernel)?;
        let c_options: Vec<CString> = options
            .iter()
            .map(|o| c_text(o, kernel))
            .collect::<Result<_, _>>()?;
        let pointers: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `program.raw` is live; `pointers` holds `pointers.len()` NUL-terminated
        // strings, owned by `c_options`, which outlives the call.
        let status =
            unsafe { (self.compile)(program.raw, pointers.len() as c_int, pointers.as_ptr()) };
        let log = self
            .read(program.raw, self.log_size, self.log)
            .unwrap_or_default();
        let log = String::from_utf8_lossy(log.strip_suffix(b"\0").unwrap_or(&log)).into_owned();
        if status != 0 {
            return Err(error::cubin_compile(
                kernel,
                arch,
                &options.join(" "),
                log.trim_end(),
            ));
        }
        self.read(program.raw, self.cubin_size, self.cubin)
            .map(|cubin| (cubin, log))
            .map_err(|status| self.call_error("nvrtcGetCUBIN", status, Some(kernel)))
    }

    /// A new program of `source`, named `{kernel}.cu` as the runtime names it.
    fn program(&self, source: &str, kernel: &str) -> Result<Owned<'_>, String> {
        let c_source = c_text(source, kernel)?;
        let c_name = c_text(&format!("{kernel}.cu"), kernel)?;
        let mut raw: Program = std::ptr::null_mut();
        // SAFETY: `raw` is a live local for NVRTC to write; the source and name are NUL-terminated
        // and NVRTC copies them; no headers are passed (a count of 0 and null arrays).
        let status = unsafe {
            (self.create)(
                &mut raw,
                c_source.as_ptr(),
                c_name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        match status {
            0 => Ok(Owned { nvrtc: self, raw }),
            status => Err(self.call_error("nvrtcCreateProgram", status, Some(kernel))),
        }
    }

    /// The bytes of a program's log or CUBIN, through the pair of functions that give their size
    /// and their content.
    fn read(
        &self,
        program: Program,
        size: unsafe extern "C" fn(Program, *mut usize) -> Status,
        content: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    ) -> Result<Vec<u8>, Status> {
        let mut len = 0usize;
        // SAFETY: `program` is live and `len` is a live local.
        let status = unsafe { size(program, &mut len) };
        if status != 0 {
            return Err(status);
        }
        let mut bytes = vec![0u8; len];
        // SAFETY: `bytes` holds exactly the `len` bytes NVRTC just asked for.
        match unsafe { content(program, bytes.as_mut_ptr().cast()) } {
            0 => Ok(bytes),
            status => Err(status),
        }
    }

    /// The message of a failed NVRTC call other than the compile itself.
    fn call_error(&self, function: &str, status: Status, kernel: Option<&str>) -> String {
        // SAFETY: `nvrtcGetErrorString` takes any status and returns a static C string, or null.
        let text = unsafe { (self.error_string)(status) };
        let text = match text.is_null() {
            // SAFETY: a non-null result points at a NUL-terminated string that NVRTC never frees.
            false => unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
            true => format!("status {status}"),
        };
        error::cubin_nvrtc_call(function, kernel, &text)
    }
}

/// An NVRTC program, destroyed on drop.
struct Owned<'a> {
    nvrtc: &'a Nvrtc,
    raw: Program,
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `nvrtcCreateProgram` and this is its only destroy. A failure
        // would leak the program, which is all that could be done about it.
        let _ = unsafe { (self.nvrtc.destroy)(&mut self.raw) };
    }
}

/// `text` as a C string. Generated CUDA C and kernel names never hold a NUL byte.
fn c_text(text: &str, kernel: &str) -> Result<CString, String> {
    CString::new(text).map_err(|e| {
        error::cubin_nvrtc_call(
            "nvrtcCreateProgram",
            Some(kernel),
            &format!("a NUL byte at offset {}", e.nul_position()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_lists() {
        assert_eq!(parse_archs("sm_90"), Ok(vec![90]));
        assert_eq!(parse_archs("90"), Ok(vec![90]));
        assert_eq!(parse_archs("sm_90,sm_80"), Ok(vec![80, 90]));
        assert_eq!(
            parse_archs(" sm_80, 90 sm_120,,sm_80 "),
            Ok(vec![80, 90, 120])
        );
        assert_eq!(parse_archs(""), Ok(vec![]));
        assert_eq!(parse_archs(" , "), Ok(vec![]));
    }

    #[test]
    fn unknown_arch_text_is_an_error_naming_it() {
        for bad in [
            "sm_90a",
            "compute_90",
            "sm_",
            "sm_9",
            "+90",
            "1000",
            "sm90",
            "sm_8x",
            "volta",
        ] {
            let e = parse_archs(&format!("sm_80,{bad}")).unwrap_err();
            assert!(
                e.starts_with(&format!("`{ARCHS_VAR}` names `{bad}`")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn options_name_the_arch() {
        assert_eq!(
            options(90),
            [
                "--gpu-architecture=sm_90",
                "--std=c++17",
                "--ptxas-options=-v"
            ]
        );
        assert_eq!(options(120)[0], "--gpu-architecture=sm_120");
        assert!(
            !OPTIONS.iter().any(|o| o.contains("fast-math")),
            "IEEE defaults"
        );
    }

    #[test]
    fn no_archs_needs_no_nvrtc() {
        assert_eq!(compile_all("not even C", "k", &[]), Ok(vec![]));
    }

    /// NVRTC, or `None` with a note; in CI (`CI=true`) its absence is a failure.
    fn nvrtc() -> Option<&'static Nvrtc> {
        match Nvrtc::get() {
            Ok(nvrtc) => Some(nvrtc),
            Err(searched) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("CI must have NVRTC (searched for {searched:?})")
            }
            Err(searched) => {
                eprintln!("skipping: no NVRTC (searched for {searched:?})");
                None
            }
        }
    }

    const DOUBLE: &str = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n";

    #[test]
    fn compiles_a_cubin_per_arch() {
        if nvrtc().is_none() {
            return;
        }
        let cubins = compile_all(DOUBLE, "double", &[80, 90]).unwrap();
        assert_eq!(cubins.iter().map(|c| c.0).collect::<Vec<_>>(), [80, 90]);
        for (arch, cubin) in &cubins {
            assert!(cubin.starts_with(b"\x7fELF"), "sm_{arch}");
            // e_machine, at offset 18 of the ELF header: 190 is EM_CUDA.
            assert_eq!(cubin[18..20], 190u16.to_le_bytes(), "sm_{arch}");
        }
        assert_ne!(cubins[0].1, cubins[1].1);
    }

    #[test]
    fn compile_error_carries_the_log() {
        let Some(nvrtc) = nvrtc() else { return };
        let broken = DOUBLE.replace("2.0f", "undefined_name");
        let e = nvrtc.compile(&broken, "double", 90).unwrap_err();
        assert!(
            e.starts_with("NVRTC could not compile kernel `double` for `sm_90`"),
            "{e}"
        );
        assert!(
            e.contains("double.cu(1): error: identifier \"undefined_name\" is undefined"),
            "{e}"
        );
    }

    #[test]
    fn supported_archs_are_checked_up_front() {
        let Some(nvrtc) = nvrtc() else { return };
        assert!(nvrtc.supported().unwrap().contains(&90));
        assert_eq!(nvrtc.check_supported(&[80, 90]), Ok(()));
        let e = nvrtc.check_supported(&[90, 11]).unwrap_err();
        assert!(e.starts_with("NVRTC "), "{e}");
        assert!(
            e.contains("does not compile for `sm_11`; it compiles for `sm_"),
            "{e}"
        );
    }

    #[test]
    fn unsupported_arch_is_a_compile_error() {
        let Some(nvrtc) = nvrtc() else { return };
        let e = nvrtc.compile(DOUBLE, "double", 11).unwrap_err();
        assert!(
            e.starts_with("NVRTC could not compile kernel `double` for `sm_11`"),
            "{e}"
        );
        assert!(e.contains("--gpu-architecture"), "{e}");
    }
}
