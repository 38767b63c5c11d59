//! Which cache directories and entries may be trusted: on Unix, only those that this user (or
//! root) owns and that no one else can write.
//!
//! An entry becomes code on the GPU, in this process's context, next to its data. Its checksum
//! finds damage, not intent: anyone who can write the directory can put a well-formed entry there
//! under the name of a kernel we will load (or rename one entry over another), and anyone who can
//! write an entry can change it. So a directory or an entry that someone else could have written
//! is neither read nor written: the kernel is compiled afresh, as with the cache off.
//!
//! The rule is the one OpenSSH applies to `~/.ssh`: the owner must be us or root (root can change
//! this program anyway), and the group and other write bits must be clear. A group-writable
//! directory is refused even under user-private groups, where the group is only us: telling that
//! apart needs the group database, and a refusal costs only a compile. A sticky directory such as
//! `/tmp` is refused too: the sticky bit stops others deleting our entries, not adding their own.
//! The directories above the cache directory are not checked. fuse creates the directories it
//! needs with mode `0o700` and its entries with `0o644`, whatever the umask, so its own cache
//! always passes. Elsewhere than Unix there are no such checks.

use std::fs::Metadata;
use std::io::Write;
use std::path::Path;

/// Whether `dir` is a directory that can be trusted (see the module docs).
pub(super) fn directory(dir: &Path) -> bool {
    std::fs::metadata(dir).is_ok_and(|meta| meta.is_dir() && trusted(&meta))
}

/// Whether the file or directory of `meta` is owned by us or root, and writable by no one else.
#[cfg(unix)]
pub(super) fn trusted(meta: &Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let owner = meta.uid();
    (owner == effective_uid() || owner == 0) && meta.mode() & 0o022 == 0
}

/// Everything can be trusted where there are no Unix owners and modes to ask.
#[cfg(not(unix))]
pub(super) fn trusted(_meta: &Metadata) -> bool {
    true
}

#[cfg(unix)]
fn effective_uid() -> u32 {
    extern "C" {
        fn geteuid() -> u32;
    }
    // SAFETY: `geteuid` takes no arguments, cannot fail and touches no memory of ours; the C
    // library std links on every Unix has it, and `uid_t` is a 32-bit unsigned integer there.
    unsafe { geteuid() }
}

/// Creates `dir` and any missing parents, each new one readable and writable by us alone.
pub(super) fn create_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Writes `bytes` to a new file at `path` (failing if something is there already), writable by
/// us alone.
pub(super) fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o644);
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    // A mode given at creation is masked by the umask, which may clear bits but never set them;
    // set it exactly anyway, so that a umask such as 0o077 still leaves entries others can read.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fuse-trust-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn our_own_directories_and_files_are_trusted() {
        let dir = temp_dir("own");
        create_dir(&dir.join("a/b")).unwrap();
        for d in [dir.join("a"), dir.join("a/b")] {
            let mode = std::fs::metadata(&d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
            assert!(directory(&d), "{}", d.display());
        }
        let file = dir.join("a/b/entry");
        write_new(&file, b"bytes").unwrap();
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert!(trusted(&meta));
        assert!(write_new(&file, b"again").is_err(), "create_new");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writable_by_others_is_not_trusted() {
        let dir = temp_dir("others");
        create_dir(&dir).unwrap();
        for (mode, trust) in [
            (0o700, true),
            (0o755, true),
            (0o775, false),
            (0o757, false),
            (0o777, false),
            (0o1777, false),
        ] {
            chmod(&dir, mode);
            assert_eq!(directory(&dir), trust, "mode {mode:o}");
        }
        chmod(&dir, 0o700);
        let file = dir.join("entry");
        write_new(&file, b"bytes").unwrap();
        for (mode, trust) in [(0o600, true), (0o644, true), (0o664, false), (0o666, false)] {
            chmod(&file, mode);
            assert_eq!(
                trusted(&std::fs::metadata(&file).unwrap()),
                trust,
                "mode {mode:o}"
            );
        }
        assert!(!directory(&file), "a file is not a directory");
        assert!(!directory(&dir.join("missing")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn owned_by_another_user_is_not_trusted() {
        if effective_uid() != 0 {
            eprintln!("skipping: only root can give a file to another user");
            return;
        }
        let dir = temp_dir("owner");
        create_dir(&dir).unwrap();
        assert!(directory(&dir));
        // 65534 is `nobody` on Linux and the BSDs.
        std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
        assert!(
            !directory(&dir),
            "owned by nobody, though writable by its owner alone"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An entry of the cache, and the CUBIN it holds.
    fn entry() -> (super::super::Key<'static>, Vec<u8>) {
        let key = super::super::Key {
            source: "extern \"C\" __global__ void k() {}",
            arch: 90,
            nvrtc: "13.0".to_string(),
        };
        (key, b"\x7fELF and the rest of a CUBIN".to_vec())
    }

    /// The names in `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn world_writable_directory_is_neither_read_nor_written() {
        use super::super::{read_entry, write_entry};
        let dir = temp_dir("world-dir");
        let (key, cubin) = entry();
        write_entry(&dir, &key, &cubin);
        assert_eq!(read_entry(&dir, &key), Some(cubin.clone()), "trusted first");
        chmod(&dir, 0o777);
        assert_eq!(
            read_entry(&dir, &key),
            None,
            "a whole entry, in a directory anyone can write"
        );
        std::fs::remove_file(dir.join(key.file_name())).unwrap();
        write_entry(&dir, &key, &cubin);
        assert_eq!(listing(&dir), Vec::<String>::new(), "nothing written");
        chmod(&dir, 0o700);
        write_entry(&dir, &key, &cubin);
        assert_eq!(read_entry(&dir, &key), Some(cubin));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn world_writable_entry_is_not_read() {
        use super::super::{read_entry, write_entry};
        let dir = temp_dir("world-entry");
        let (key, cubin) = entry();
        write_entry(&dir, &key, &cubin);
        let path = dir.join(key.file_name());
        chmod(&path, 0o666);
        assert_eq!(read_entry(&dir, &key), None, "an entry anyone can write");
        chmod(&path, 0o644);
        assert_eq!(
            read_entry(&dir, &key),
            Some(cubin.clone()),
            "the same bytes"
        );
        // A fresh write replaces the entry with one of our own.
        chmod(&path, 0o666);
        write_entry(&dir, &key, &cubin);
        assert_eq!(read_entry(&dir, &key), Some(cubin));
        assert_eq!(listing(&dir), [key.file_name()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
