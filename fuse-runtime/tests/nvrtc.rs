//! NVRTC compiles a hand-written kernel to CUBIN for the architectures we ship for.
//!
//! Runs without a GPU. When NVRTC cannot be loaded the tests pass with a note, except in CI
//! (`CI=true`), which must have NVRTC. Two tests run this binary again as child processes:
//! several sharing one disk cache at once, and one without NVRTC on its loader path.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
        let compiled = nvrtc::compile(SAXPY, "saxpy.cu", arch, &[]).unwrap();
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

/// A kernel that holds 48 values a thread, declared at eight blocks an SM (32 registers).
const HELD: &str = r#"
extern "C" __global__ void __launch_bounds__(256, 8) fuse_held(const float* __restrict__ x,
                                                               float* __restrict__ out) {
    const unsigned long long base = (blockIdx.x * 256ull + threadIdx.x) * 48ull;
    float v[48];
    float s = 0.0f;
    #pragma unroll
    for (int j = 0; j < 48; ++j) { v[j] = x[base + j]; s += v[j] * v[j]; }
    const float r = 1.0f / s;
    #pragma unroll
    for (int j = 0; j < 48; ++j) out[base + j] = v[j] * r;
}
"#;

#[test]
fn an_entry_that_spills_under_its_bound_is_compiled_under_a_lower_one() {
    if !nvrtc_present() {
        return;
    }
    for arch in [80, 90] {
        let declared = nvrtc::compile(HELD, "held.cu", arch, &[]).unwrap();
        assert!(nvrtc::spills(&declared.log).is_some(), "{}", declared.log);
        let entry = nvrtc::compile_entry(HELD, "held.cu", arch).unwrap();
        assert_eq!(nvrtc::spills(&entry.log), None, "sm_{arch}: {}", entry.log);
        assert!(
            (1..8).contains(&entry.lowered),
            "sm_{arch}: {}",
            entry.lowered
        );
        assert!(entry.log.contains("fuse_held") && entry.cubin.starts_with(b"\x7fELF"));
        let saxpy = nvrtc::compile_entry(SAXPY, "saxpy.cu", arch).unwrap();
        assert_eq!(saxpy.lowered, 0, "no spill, nothing lowered");
        assert_eq!(
            saxpy.cubin,
            nvrtc::compile(SAXPY, "saxpy.cu", arch, &[]).unwrap().cubin
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

// ---------------------------------------------------------------------------------------------
// Several processes: the tests below run this binary again as children, each running one test
// alone with `CHILD` saying what to do.

/// Makes this test binary a child of one of the tests below: `cache <dir>` or `no-nvrtc`.
const CHILD: &str = "FUSE_NVRTC_TEST_CHILD";

/// This binary, to run test `name` alone as a child with `CHILD` set to `role`.
fn child(name: &str, role: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary's own path");
    let mut command = Command::new(exe);
    command
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, role)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The child's output, after checking that it exited successfully.
fn finished(name: &str, output: std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "child of {name} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The lines of a child's output from `key` on: with `--nocapture` the harness's own
/// `test name ... ` may start the line of the child's first print.
fn reported(stdout: &str, key: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|line| line.find(key).map(|at| line[at..].to_string()))
        .collect()
}

/// FNV-1a, to compare files between processes by a short line.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The processes that share the cache, the kernels they compile, and how often.
const PROCESSES: usize = 4;
const SOURCES: usize = 3;
const ROUNDS: usize = 6;

/// Distinct sources, so that each is an entry of its own.
fn cache_sources() -> Vec<String> {
    (0..SOURCES)
        .map(|i| SAXPY.replace("a * x[i]", &format!("a * x[i] * {}.0f", i + 2)))
        .collect()
}

#[test]
fn processes_compiling_at_once_share_one_cache() {
    const NAME: &str = "processes_compiling_at_once_share_one_cache";
    if let Some(dir) = std::env::var_os(CHILD).and_then(|role| {
        let role = role.to_string_lossy().into_owned();
        role.strip_prefix("cache ").map(PathBuf::from)
    }) {
        return share_the_cache(&dir);
    }
    if !nvrtc_present() {
        return;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir =
        std::env::temp_dir().join(format!("fuse-shared-cache-{}-{nanos}", std::process::id()));
    // Every child starts before any waits, so that they compile and write at once.
    let role = format!("cache {}", dir.display());
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| child(NAME, &role).spawn().expect("spawn a child"))
        .collect();
    let reports: Vec<Vec<String>> = children
        .into_iter()
        .map(|c| finished(NAME, c.wait_with_output().expect("the child's output")))
        .map(|out| reported(&out, "entry "))
        .collect();
    // Every process saw the same entry files, byte for byte, and so does the directory now.
    assert_eq!(reports[0].len(), SOURCES, "{reports:?}");
    assert!(reports.iter().all(|r| *r == reports[0]), "{reports:?}");
    let mut names = Vec::new();
    for line in &reports[0] {
        let [_, _, name, hash] = line.split(' ').collect::<Vec<_>>()[..] else {
            panic!("a child's line: {line}")
        };
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(format!("{:016x}", fnv(&bytes)), hash, "{name}");
        names.push(name.to_string());
    }
    let mut listed: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    listed.sort();
    names.sort();
    assert_eq!(listed, names, "no temporary file is left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A child of `processes_compiling_at_once_share_one_cache`: compiles every source through the
/// cache in `dir` and compiles it again (which rewrites the entry), `ROUNDS` times, while other
/// processes do the same. Each CUBIN must be the one NVRTC gives directly; after the first
/// round each must come from the disk, whole (a torn file would fail its checksum and be
/// compiled again); and every read of an entry file must give the same bytes.
fn share_the_cache(dir: &Path) {
    fuse_runtime::set_cache_dir(Some(dir.to_path_buf()));
    let sources = cache_sources();
    let direct: Vec<Vec<u8>> = sources
        .iter()
        .map(|s| nvrtc::compile(s, "saxpy.cu", 90, &[]).unwrap().cubin)
        .collect();
    let mut seen: Vec<Option<Vec<u8>>> = vec![None; SOURCES];
    for round in 0..ROUNDS {
        for (i, source) in sources.iter().enumerate() {
            let cached = fuse_runtime::cache::cubin(source, "saxpy.cu", 90).unwrap();
            assert_eq!(cached.bytes, direct[i], "round {round}, source {i}");
            assert!(cached.from_disk || round == 0, "round {round}, source {i}");
            let again = fuse_runtime::cache::recompile(source, "saxpy.cu", 90).unwrap();
            assert_eq!(again.bytes, direct[i], "round {round}, source {i}");
            let path = fuse_runtime::cache::entry_path(source, 90)
                .unwrap()
                .unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let first = seen[i].get_or_insert_with(|| bytes.clone());
            assert!(
                *first == bytes,
                "round {round}, source {i}: the file changed"
            );
        }
    }
    for (i, source) in sources.iter().enumerate() {
        let path = fuse_runtime::cache::entry_path(source, 90)
            .unwrap()
            .unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        let bytes = seen[i].as_deref().unwrap();
        println!("entry {i} {name} {:016x}", fnv(bytes));
    }
}

#[test]
fn missing_nvrtc_is_an_error_not_a_panic() {
    const NAME: &str = "missing_nvrtc_is_an_error_not_a_panic";
    if std::env::var_os(CHILD).is_some_and(|role| role == "no-nvrtc") {
        return without_nvrtc();
    }
    // A child whose loader path lacks the directory NVRTC may come from.
    let mut command = child(NAME, "no-nvrtc");
    command.env_remove("LD_LIBRARY_PATH");
    let stdout = finished(NAME, command.output().expect("run a child"));
    if stdout.contains("NVRTC found without LD_LIBRARY_PATH") {
        eprintln!("skipping: this machine's loader finds NVRTC without LD_LIBRARY_PATH");
        return;
    }
    assert!(stdout.contains("no NVRTC: checked"), "{stdout}");
}

/// A child of `missing_nvrtc_is_an_error_not_a_panic`: without NVRTC, compiling directly or
/// through the cache is `Error::NoNvrtc`, whose message says what was searched and what to do.
fn without_nvrtc() {
    if nvrtc::is_available() {
        println!("NVRTC found without LD_LIBRARY_PATH");
        return;
    }
    let expected = Error::NoNvrtc {
        searched: nvrtc::candidates(),
    };
    assert_eq!(nvrtc::version(), Err(expected.clone()));
    assert_eq!(
        nvrtc::compile(SAXPY, "saxpy.cu", 90, &[]),
        Err(expected.clone())
    );
    fuse_runtime::set_cache_dir(None);
    let cached = fuse_runtime::cache::cubin(SAXPY, "saxpy.cu", 90);
    assert_eq!(cached, Err(expected.clone()));
    let text = expected.to_string();
    assert!(
        text.contains("libnvrtc.so") && text.contains("LD_LIBRARY_PATH"),
        "{text}"
    );
    println!("no NVRTC: checked");
}
