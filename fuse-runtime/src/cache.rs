//! Where a kernel's CUBIN comes from: embedded at build time, the on-disk cache, or NVRTC.
//!
//! A crate built with `FUSE_CUBIN_ARCHS` (such as `FUSE_CUBIN_ARCHS=sm_90 cargo build --release`)
//! carries each kernel's CUBIN for the architectures named, compiled by NVRTC as the `fuse!` macro
//! expanded: on a device of one of those, the first use loads it and neither NVRTC nor the disk
//! cache is touched. [`set_embedded_cubins`] turns that off, and [`Device::kernel_origin`] tells
//! which way a kernel was loaded.
//!
//! Otherwise the on-disk cache means a kernel is compiled once per machine rather than once per run.
//!
//! Each entry is one file per (source, GPU architecture, NVRTC version, crate version). The file
//! starts with a header holding that whole key, the full source text included, so two keys that
//! hash alike can never be mistaken for each other; then comes the CUBIN and a checksum. Files
//! are written to a temporary name and renamed into place, so readers never see half a file.
//!
//! The cache is an optimisation only: a missing, unreadable, corrupt or stale file means
//! "compile again and overwrite", and a cache directory that cannot be written is ignored.
//!
//! Entries become GPU code, so on Unix a directory or entry that another user could have written
//! is not trusted: a cache directory not owned by this user (or root), or writable by its group or
//! by others, is neither read nor written, and an entry file like that is not read; the kernel is
//! compiled instead. fuse creates its directories with mode `0o700`, so only a directory made or
//! changed by hand meets this; `chmod go-w` on it (or another `FUSE_CACHE_DIR`) puts it back to
//! use. The reasons are in the source, `cache/trust.rs`.
//!
//! The directory is, in order: the one given to [`set_cache_dir`]; the `FUSE_CACHE_DIR`
//! environment variable (`off`, `0` or an empty value turn the cache off);
//! `$XDG_CACHE_HOME/fuse`; `$HOME/.cache/fuse`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::lock;
use crate::error::Error;
use crate::nvrtc;
#[cfg(doc)]
use crate::Device;

mod trust;

/// What [`set_cache_dir`] chose: `None` while it has not been called.
static SETTING: Mutex<Option<Option<PathBuf>>> = Mutex::new(None);

/// The first bytes of every cache file.
const MAGIC: &[u8; 11] = b"FUSE-CUBIN\n";

/// Whether kernels load the CUBINs embedded at build time; see [`set_embedded_cubins`].
static EMBEDDED: AtomicBool = AtomicBool::new(true);

/// Where the CUBIN of a loaded kernel came from, as [`Device::kernel_origin`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Embedded in the program when it was built (`FUSE_CUBIN_ARCHS`): no NVRTC, no cache file.
    Embedded,
    /// Read from the on-disk cache.
    Disk,
    /// Compiled by NVRTC in this process (and written to the disk cache).
    Nvrtc,
}

/// Whether kernels load the CUBINs embedded at build time (the default), or go through the disk
/// cache and NVRTC as in a build without `FUSE_CUBIN_ARCHS`: to time one against the other, or
/// to rule out an embedded CUBIN. It applies to kernels not yet loaded on a device.
///
/// ```
/// fuse_runtime::cache::set_embedded_cubins(false);
/// assert!(!fuse_runtime::cache::embedded_cubins());
/// # fuse_runtime::cache::set_embedded_cubins(true);
/// ```
pub fn set_embedded_cubins(enabled: bool) {
    EMBEDDED.store(enabled, Ordering::Relaxed);
}

/// Whether kernels load the CUBINs embedded at build time; see [`set_embedded_cubins`].
pub fn embedded_cubins() -> bool {
    EMBEDDED.load(Ordering::Relaxed)
}

/// Whether `bytes` is a whole ELF64 image as far as its headers tell: every table and section
/// they point at lies inside it. `cuModuleLoadData` takes no length and trusts those headers, so
/// an embedded CUBIN is checked before it reaches the driver (one from the disk cache has its
/// checksum instead).
pub(crate) fn whole_elf(bytes: &[u8]) -> bool {
    elf_fits(bytes) == Some(true)
}

/// [`whole_elf`], with `None` for a field that lies past the end.
fn elf_fits(bytes: &[u8]) -> Option<bool> {
    // A little-endian field of `len` bytes at `at`.
    let field = |at: usize, len: usize| -> Option<u64> {
        let field = bytes.get(at..at.checked_add(len)?)?;
        Some(field.iter().rev().fold(0, |v, &b| v << 8 | u64::from(b)))
    };
    let fits = |offset: u64, size: u64| {
        offset
            .checked_add(size)
            .is_some_and(|end| end <= bytes.len() as u64)
    };
    if !bytes.starts_with(b"\x7fELF\x02\x01") {
        return Some(false);
    }
    let (phoff, phsize, phnum) = (field(0x20, 8)?, field(0x36, 2)?, field(0x38, 2)?);
    let (shoff, shsize, shnum) = (field(0x28, 8)?, field(0x3a, 2)?, field(0x3c, 2)?);
    if !(fits(phoff, phsize * phnum) && fits(shoff, shsize * shnum) && shsize >= 0x28) {
        return Some(false);
    }
    for i in 0..shnum {
        let at = usize::try_from(shoff + i * shsize).ok()?;
        // SHT_NOBITS (8) sections, such as `.bss`, take no room in the file.
        if field(at + 4, 4)? != 8 && !fits(field(at + 0x18, 8)?, field(at + 0x20, 8)?) {
            return Some(false);
        }
    }
    Some(true)
}

/// A CUBIN and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cubin {
    /// The ELF image NVRTC produced.
    pub bytes: Vec<u8>,
    /// Whether it was read from the disk cache rather than compiled now.
    pub from_disk: bool,
}

/// Moves the cache to `dir`, or turns it off with `None`, for the rest of the process. This
/// overrides the `FUSE_CACHE_DIR` environment variable.
///
/// ```
/// fuse_runtime::set_cache_dir(None); // never read or write cache files
/// assert_eq!(fuse_runtime::cache_dir(), None);
/// ```
pub fn set_cache_dir(dir: Option<PathBuf>) {
    *lock(&SETTING) = Some(dir);
}

/// The directory cache files go to, or `None` when the cache is off.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(setting) = lock(&SETTING).clone() {
        return setting;
    }
    dir_from_env(|name| std::env::var_os(name))
}

/// The cache directory the environment asks for, reading variables through `var`.
fn dir_from_env(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let non_empty = |name| var(name).filter(|v| !v.is_empty());
    match var("FUSE_CACHE_DIR") {
        Some(v) if v.is_empty() || v == "off" || v == "0" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => non_empty("XDG_CACHE_HOME")
            .map(|d| PathBuf::from(d).join("fuse"))
            .or_else(|| non_empty("HOME").map(|d| PathBuf::from(d).join(".cache").join("fuse"))),
    }
}

/// The CUBIN of `source` for `sm_{arch}`: from the cache when a valid entry is there, else
/// compiled by NVRTC (the log naming `program`) and stored.
pub fn cubin(source: &str, program: &str, arch: u32) -> Result<Cubin, Error> {
    let key = Key::new(source, arch)?;
    let dir = cache_dir();
    if let Some(bytes) = dir.as_deref().and_then(|d| read_entry(d, &key)) {
        return Ok(Cubin {
            bytes,
            from_disk: true,
        });
    }
    compile_and_store(&key, program, dir.as_deref())
}

/// Compiles `source` for `sm_{arch}` even if the cache has it, and overwrites the entry. The
/// runtime calls this when the driver rejects a cached CUBIN.
pub fn recompile(source: &str, program: &str, arch: u32) -> Result<Cubin, Error> {
    let key = Key::new(source, arch)?;
    compile_and_store(&key, program, cache_dir().as_deref())
}

/// The file that holds (or would hold) the entry of `source` for `sm_{arch}`, or `None` when
/// the cache is off.
pub fn entry_path(source: &str, arch: u32) -> Result<Option<PathBuf>, Error> {
    let key = Key::new(source, arch)?;
    Ok(cache_dir().map(|d| d.join(key.file_name())))
}

fn compile_and_store(key: &Key, program: &str, dir: Option<&Path>) -> Result<Cubin, Error> {
    let compiled = nvrtc::compile_entry(key.source, program, key.arch)?;
    if let Some(dir) = dir {
        write_entry(dir, key, &compiled.cubin);
    }
    Ok(Cubin {
        bytes: compiled.cubin,
        from_disk: false,
    })
}

/// Everything a CUBIN depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key<'a> {
    source: &'a str,
    arch: u32,
    /// The NVRTC build: its library file's identity when it can be found without loading it
    /// (see [`nvrtc::identity`]), else its version, which loads it.
    nvrtc: String,
}

impl<'a> Key<'a> {
    fn new(source: &'a str, arch: u32) -> Result<Key<'a>, Error> {
        let nvrtc = match nvrtc::identity() {
            Some(file) => file,
            None => {
                let (major, minor) = nvrtc::version()?;
                format!("{major}.{minor}")
            }
        };
        Ok(Key {
            source,
            arch,
            nvrtc,
        })
    }

    /// The header text: every part of the key, the source last.
    fn header(&self) -> String {
        format!(
            "fuse-runtime {}\nnvrtc {}\noptions {}\nsource {}\n{}",
            env!("CARGO_PKG_VERSION"),
            self.nvrtc,
            nvrtc::options(self.arch, &[]).join(" "),
            self.source.len(),
            self.source
        )
    }

    /// The file name: a hash of the header, and the architecture for people reading the
    /// directory.
    fn file_name(&self) -> String {
        format!(
            "{:016x}-sm_{}.cubin",
            fnv1a(self.header().as_bytes()),
            self.arch
        )
    }
}

/// FNV-1a, 64 bits: stable across Rust versions (unlike `DefaultHasher`), and collisions only
/// cost a recompile because the header holds the full key.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The bytes of a cache file: magic, header length and header, CUBIN length and CUBIN, and a
/// checksum of everything before it.
fn encode(key: &Key, cubin: &[u8]) -> Vec<u8> {
    let header = key.header();
    let mut out = Vec::with_capacity(MAGIC.len() + header.len() + cubin.len() + 24);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    out.extend_from_slice(cubin);
    let checksum = fnv1a(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

/// The CUBIN of a cache file, if the file is whole and was written for exactly `key`.
///
/// The checksum matters beyond tidiness: `cuModuleLoadData` takes no length and trusts the
/// ELF headers it finds, so a truncated or damaged image must never reach the driver.
fn decode(key: &Key, bytes: &[u8]) -> Option<Vec<u8>> {
    let (body, checksum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    if fnv1a(body).to_le_bytes() != checksum {
        return None;
    }
    let rest = body.strip_prefix(MAGIC.as_slice())?;
    let (header, rest) = take_block(rest)?;
    let (cubin, rest) = take_block(rest)?;
    let valid =
        rest.is_empty() && header == key.header().as_bytes() && cubin.starts_with(b"\x7fELF");
    valid.then(|| cubin.to_vec())
}

/// Splits a little-endian `u64` length and that many bytes off the front of `bytes`.
fn take_block(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = bytes.split_at_checked(8)?;
    let len = usize::try_from(u64::from_le_bytes(len.try_into().ok()?)).ok()?;
    rest.split_at_checked(len)
}

/// Reads the entry of `key` from `dir`; any failure, or a directory or entry file that someone
/// else could have written, reads as "not cached".
fn read_entry(dir: &Path, key: &Key) -> Option<Vec<u8>> {
    if !trust::directory(dir) {
        return None;
    }
    // The entry is checked through the open file, so that what is read is what was checked.
    let mut file = std::fs::File::open(dir.join(key.file_name())).ok()?;
    if !trust::trusted(&file.metadata().ok()?) {
        return None;
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes).ok()?;
    decode(key, &bytes)
}

/// Writes the entry of `key` to `dir` through a temporary file and a rename, so a reader sees
/// either the old file or the whole new one. The temporary name is unique to this process and
/// call, so that processes writing the same entry at once never write into one file. Nothing is
/// written to a directory that someone else could write. Failures are ignored: the cache is
/// optional.
fn write_entry(dir: &Path, key: &Key, cubin: &[u8]) {
    static UNIQUE: AtomicU64 = AtomicU64::new(0);
    if trust::create_dir(dir).is_err() || !trust::directory(dir) {
        return;
    }
    let name = key.file_name();
    let unique = UNIQUE.fetch_add(1, Ordering::Relaxed);
    let temp = dir.join(format!(".{name}.{}.{unique}.tmp", std::process::id()));
    let written = trust::write_new(&temp, &encode(key, cubin))
        .and_then(|()| std::fs::rename(&temp, dir.join(&name)));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(source: &str) -> Key<'_> {
        Key {
            source,
            arch: 90,
            nvrtc: "13.0".to_string(),
        }
    }

    fn fake_cubin() -> Vec<u8> {
        let mut cubin = b"\x7fELF".to_vec();
        cubin.extend((0u8..=200).map(|b| b.wrapping_mul(37)));
        cubin
    }

    /// A fresh, empty directory under the system temp directory.
    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fuse-cache-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn round_trip_through_a_file() {
        let dir = temp_dir("round-trip");
        let k = key("extern \"C\" __global__ void k() {}");
        assert_eq!(read_entry(&dir, &k), None);
        write_entry(&dir, &k, &fake_cubin());
        assert_eq!(read_entry(&dir, &k), Some(fake_cubin()));
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(leftovers.len(), 1, "the temporary file was renamed away");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn any_corruption_reads_as_missing() {
        let k = key("source text");
        let good = encode(&k, &fake_cubin());
        assert_eq!(decode(&k, &good), Some(fake_cubin()));
        for cut in [0, 1, 7, 11, 20, good.len() - 9, good.len() - 1] {
            assert_eq!(decode(&k, &good[..cut]), None, "truncated to {cut} bytes");
        }
        for flip in [0, 12, 30, good.len() / 2, good.len() - 12, good.len() - 1] {
            let mut bad = good.clone();
            bad[flip] ^= 0x40;
            assert_eq!(decode(&k, &bad), None, "byte {flip} flipped");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(decode(&k, &longer), None);
    }

    #[test]
    fn a_different_key_never_matches() {
        let k = key("source text");
        let good = encode(&k, &fake_cubin());
        let others = [
            key("source text "),
            Key {
                arch: 80,
                ..k.clone()
            },
            Key {
                nvrtc: "12.8".to_string(),
                ..k.clone()
            },
        ];
        for other in &others {
            assert_eq!(decode(other, &good), None, "{other:?}");
        }
        assert_ne!(key("a").file_name(), key("b").file_name());
    }

    #[test]
    fn corrupt_file_falls_back_and_is_overwritten() {
        let dir = temp_dir("corrupt");
        let k = key("corrupt me");
        trust::create_dir(&dir).unwrap();
        std::fs::write(dir.join(k.file_name()), b"FUSE-CUBIN\n garbage").unwrap();
        assert_eq!(read_entry(&dir, &k), None);
        write_entry(&dir, &k, &fake_cubin());
        assert_eq!(read_entry(&dir, &k), Some(fake_cubin()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unwritable_directory_is_ignored() {
        let dir = temp_dir("not-a-dir");
        std::fs::write(&dir, b"a file where the directory should be").unwrap();
        write_entry(&dir, &key("x"), &fake_cubin());
        assert_eq!(read_entry(&dir, &key("x")), None);
        std::fs::remove_file(&dir).unwrap();
    }

    /// An environment holding exactly `pairs`.
    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn directory_from_environment() {
        let dir = |pairs: &[(&str, &str)]| dir_from_env(env(pairs));
        let home = PathBuf::from("/home/u/.cache/fuse");
        assert_eq!(dir(&[("HOME", "/home/u")]), Some(home));
        assert_eq!(
            dir(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]),
            Some("/x/fuse".into())
        );
        assert_eq!(
            dir(&[("XDG_CACHE_HOME", "/x"), ("FUSE_CACHE_DIR", "/c")]),
            Some("/c".into())
        );
        for off in ["off", "0", ""] {
            assert_eq!(
                dir(&[("HOME", "/h"), ("FUSE_CACHE_DIR", off)]),
                None,
                "{off:?}"
            );
        }
        assert_eq!(dir(&[("XDG_CACHE_HOME", "")]), None);
        assert_eq!(dir(&[]), None);
    }

    /// A minimal ELF64 image: the header, then one section header for the 8 bytes after it.
    fn tiny_elf() -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 64 + 8];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x28..0x30].copy_from_slice(&64u64.to_le_bytes()); // e_shoff
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        elf[0x3c..0x3e].copy_from_slice(&1u16.to_le_bytes()); // e_shnum
        elf[64 + 0x18..64 + 0x20].copy_from_slice(&128u64.to_le_bytes()); // sh_offset
        elf[64 + 0x20..64 + 0x28].copy_from_slice(&8u64.to_le_bytes()); // sh_size
        elf
    }

    #[test]
    fn elf_headers_must_fit_the_image() {
        let elf = tiny_elf();
        assert!(whole_elf(&elf));
        for cut in [0, 4, 63, 64, 127, elf.len() - 1] {
            assert!(!whole_elf(&elf[..cut]), "truncated to {cut} bytes");
        }
        let mut far = elf.clone();
        far[64 + 0x18..64 + 0x20].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(!whole_elf(&far), "a section offset that overflows");
        let mut bss = far.clone();
        bss[64 + 4] = 8; // SHT_NOBITS: its offset and size are not in the file
        assert!(whole_elf(&bss));
        let mut many = elf.clone();
        many[0x3c] = 200;
        assert!(!whole_elf(&many), "more section headers than fit");
        assert!(!whole_elf(
            b"not an elf at all, but long enough to hold a header......................."
        ));
    }

    #[test]
    fn nvrtc_cubins_are_whole() {
        let source = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }";
        let Ok(compiled) = nvrtc::compile(source, "k.cu", 90, &[]) else {
            return; // no NVRTC here; `tests/nvrtc.rs` insists on it in CI
        };
        assert!(whole_elf(&compiled.cubin));
        assert!(!whole_elf(&compiled.cubin[..compiled.cubin.len() - 1]));
    }

    #[test]
    fn non_elf_payload_is_rejected() {
        let k = key("source");
        assert_eq!(decode(&k, &encode(&k, b"not an elf")), None);
    }
}
