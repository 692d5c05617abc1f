//! kiln exports ML models to StableHLO for the IREE compiler.
//!
//! The pipeline, one module per stage:
//! [`weights`] (mmap checkpoints) → [`trace`] (shape-only DSL) → [`graph`]
//! (the IR) → [`lower`] (typed StableHLO through MLIR's C API) →
//! `.mlir` + parameters; [`interp`] runs a graph on the CPU as the
//! reference, and [`iree`] drives `iree-compile` and `iree-run-module`.

// Every public item is documented; keep it so.
#![warn(missing_docs)]

pub mod check;
pub mod export;
pub mod graph;
pub mod inspect;
pub mod interp;
pub mod iree;
pub mod lower;
pub mod models;
pub mod npy;
pub mod params;
pub mod tokenizer;
pub mod trace;
pub mod weights;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The process's peak resident memory in bytes (`VmHWM` in
/// `/proc/self/status`), where the OS reports it.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Writes `bytes` to `path` through a temporary file in the same directory
/// and a rename, so readers never see a partial file and a failed write
/// leaves nothing behind.
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

/// A file that appears at its path complete and synced, or not at all: it is
/// written as a temporary file in the destination's directory (so the final
/// rename stays on one filesystem) and renamed over the path by
/// [`AtomicFile::commit`]. Dropping it uncommitted deletes the temporary
/// file, so an error anywhere in a long streaming write leaves nothing.
pub struct AtomicFile {
    tmp: tempfile::NamedTempFile,
    path: PathBuf,
}

impl AtomicFile {
    /// Starts a file that [`AtomicFile::commit`] will put at `path`.
    pub fn create(path: &Path) -> std::io::Result<AtomicFile> {
        let mut builder = tempfile::Builder::new();
        builder.prefix(".kiln-");
        // Temporary files are private (0600); the result should get the
        // umask's usual mode, as a file created in place would.
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        let tmp = builder.tempfile_in(Self::dir(path))?;
        Ok(AtomicFile { tmp, path: path.to_path_buf() })
    }

    fn dir(path: &Path) -> &Path {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        }
    }

    /// Where the temporary file is, for a tool that writes it by name.
    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// The temporary file, to write, seek and size freely before committing.
    pub fn file(&mut self) -> &mut File {
        self.tmp.as_file_mut()
    }

    /// Syncs the data, renames the file over the destination and syncs the
    /// directory (best effort: the file is complete either way).
    pub fn commit(self) -> std::io::Result<()> {
        self.tmp.as_file().sync_all()?;
        self.tmp.persist(&self.path).map_err(|e| e.error)?;
        if let Ok(dir) = File::open(Self::dir(&self.path)) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}
