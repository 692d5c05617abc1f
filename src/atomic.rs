//! Files that appear at their path complete and synced, or not at all, and
//! that a killed process does not leave behind.
//!
//! A file is written unnamed (`O_TMPFILE`) in the destination's directory
//! where the filesystem allows, so a crash or `kill -9` while writing leaves
//! nothing on disk; it gets a name only for the instant of the final
//! rename. Where a name is needed all along (a tool that writes the file by
//! path, a filesystem without `O_TMPFILE`), the temporary file is
//! `.kiln-<pid>-<random>`, and [`remove_stale_temps`] deletes those whose
//! process no longer runs.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Prefix of every temporary file kiln names.
const TEMP_PREFIX: &str = ".kiln-";

/// Writes `bytes` to `path` atomically ([`AtomicFile`]).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomically_with(path, |out| out.write_all(bytes))
}

/// [`write_atomically`] for content streamed by `write` (through a 1 MiB
/// buffer), so a module or archive larger than memory never has to be held
/// whole. The file appears at `path` complete and synced, or not at all.
pub fn write_atomically_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut file = AtomicFile::create(path)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file.file());
    write(&mut out)?;
    out.flush()?;
    drop(out);
    file.commit()
}

/// A file that [`AtomicFile::commit`] puts at its path, synced; dropping it
/// uncommitted (an error anywhere in a long streaming write) deletes it.
pub struct AtomicFile {
    file: File,
    /// `None` while the file is unnamed.
    named: Option<tempfile::TempPath>,
    path: PathBuf,
}

impl AtomicFile {
    /// Starts a file for `path`: unnamed where the filesystem allows, else
    /// a `.kiln-<pid>-*` file beside it.
    pub fn create(path: &Path) -> std::io::Result<AtomicFile> {
        match unnamed_in(dir_of(path)) {
            Ok(file) => Ok(AtomicFile { file, named: None, path: path.to_path_buf() }),
            Err(_) => Self::create_named(path),
        }
    }

    /// Starts a file for `path` that has a name from the start, for a tool
    /// that writes it by path ([`AtomicFile::temp_path`]).
    pub fn create_named(path: &Path) -> std::io::Result<AtomicFile> {
        let tmp = named_temp_in(dir_of(path))?;
        let (file, named) = tmp.into_parts();
        Ok(AtomicFile { file, named: Some(named), path: path.to_path_buf() })
    }

    /// Where the temporary file is, if it has a name ([`AtomicFile::create_named`]).
    pub fn temp_path(&self) -> Option<&Path> {
        self.named.as_deref()
    }

    /// The temporary file, to write, seek and size freely before committing.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Syncs the data, renames the file over the destination and syncs the
    /// directory (best effort: the file is complete either way).
    pub fn commit(self) -> std::io::Result<()> {
        self.file.sync_all()?;
        let dir = dir_of(&self.path);
        let named = match self.named {
            Some(named) => named,
            // The name exists only between the link and the rename.
            None => link_unnamed(&self.file, dir)?,
        };
        named.persist(&self.path).map_err(|e| e.error)?;
        if let Ok(dir) = File::open(dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

/// Removes the `.kiln-<pid>-*` temporary files in `dir` whose process is
/// gone (killed mid-write); returns what it removed and their bytes. Files
/// of running processes, and every other file, are left alone.
pub fn remove_stale_temps(dir: &Path) -> std::io::Result<(Vec<PathBuf>, u64)> {
    let mut removed = (Vec::new(), 0);
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(temp_pid) else { continue };
        let meta = entry.metadata()?;
        if !meta.is_file() || process_runs(pid) {
            continue;
        }
        std::fs::remove_file(entry.path())?;
        removed.0.push(entry.path());
        removed.1 += meta.len();
    }
    Ok(removed)
}

/// The pid in a `.kiln-<pid>-<random>` name.
fn temp_pid(name: &str) -> Option<u32> {
    let (pid, rest) = name.strip_prefix(TEMP_PREFIX)?.split_once('-')?;
    (!rest.is_empty()).then_some(())?;
    pid.parse().ok()
}

fn process_runs(pid: u32) -> bool {
    // Signal 0 checks that the process exists; EPERM means it does, as
    // another user's.
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    let signalled = unsafe { libc::kill(pid, 0) };
    signalled == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A new `.kiln-<pid>-<random>` file in `dir`.
fn named_temp_in(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let prefix = format!("{TEMP_PREFIX}{}-", std::process::id());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    // Temporary files are private (0600); the result should get the umask's
    // usual mode, as a file created in place would.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    builder.tempfile_in(dir)
}

fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(target_os = "linux")]
fn unnamed_in(dir: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).write(true).mode(0o666).custom_flags(libc::O_TMPFILE).open(dir)
}

#[cfg(not(target_os = "linux"))]
fn unnamed_in(_dir: &Path) -> std::io::Result<File> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Gives an `O_TMPFILE` file a `.kiln-<pid>-*` name in `dir`.
#[cfg(target_os = "linux")]
fn link_unnamed(file: &File, dir: &Path) -> std::io::Result<tempfile::TempPath> {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let source = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("no NUL in a /proc path");
    loop {
        // A fresh unused name: tempfile makes one and we free it for linkat.
        let name = named_temp_in(dir)?.into_temp_path();
        let target = name.to_path_buf();
        name.close()?;
        let target_c = CString::new(target.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL in the path"))?;
        let linked = unsafe {
            libc::linkat(libc::AT_FDCWD, source.as_ptr(), libc::AT_FDCWD, target_c.as_ptr(), libc::AT_SYMLINK_FOLLOW)
        };
        if linked == 0 {
            return tempfile::TempPath::try_from_path(target);
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(error);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn link_unnamed(_file: &File, _dir: &Path) -> std::io::Result<tempfile::TempPath> {
    unreachable!("files are unnamed only on Linux")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn an_unnamed_file_is_invisible_until_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        let mut file = AtomicFile::create(&path).unwrap();
        assert!(file.temp_path().is_none(), "tmpfs and ext4 take O_TMPFILE");
        file.file().write_all(b"complete").unwrap();
        assert!(names(dir.path()).is_empty());
        file.commit().unwrap();
        assert_eq!(names(dir.path()), ["out.bin"]);
        assert_eq!(std::fs::read(&path).unwrap(), b"complete");
    }

    #[test]
    fn commit_replaces_and_drop_discards() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        write_atomically(&path, b"old").unwrap();
        drop(AtomicFile::create(&path).unwrap());
        let named = AtomicFile::create_named(&path).unwrap();
        let temp = named.temp_path().unwrap().to_path_buf();
        assert!(temp.file_name().unwrap().to_str().unwrap().starts_with(&format!(".kiln-{}-", std::process::id())));
        drop(named);
        assert!(!temp.exists());
        write_atomically(&path, b"new").unwrap();
        assert_eq!(names(dir.path()), ["out.bin"]);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
    }

    #[test]
    fn stale_temps_of_dead_processes_are_removed_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        // A pid that no process has: above the kernel's pid_max limit.
        let dead = dir.path().join(".kiln-2147483647-aBcDeF");
        let live = dir.path().join(format!(".kiln-{}-xYz", std::process::id()));
        let other = dir.path().join(".kiln-notes");
        for f in [&dead, &live, &other] {
            std::fs::write(f, b"12345").unwrap();
        }
        let (removed, bytes) = remove_stale_temps(dir.path()).unwrap();
        assert_eq!((removed, bytes), (vec![dead], 5));
        assert_eq!(names(dir.path()), [format!(".kiln-{}-xYz", std::process::id()), ".kiln-notes".to_string()]);
        assert_eq!(remove_stale_temps(&dir.path().join("missing")).unwrap().0, Vec::<PathBuf>::new());
    }
}
