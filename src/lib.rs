//! kiln exports ML models to StableHLO for the IREE compiler.
//!
//! The pipeline, one module per stage:
//! [`weights`] (mmap checkpoints) → [`trace`] (shape-only DSL) → [`graph`]
//! (the IR) → [`lower`] (typed StableHLO through MLIR's C API) →
//! `.mlir` + parameters; [`interp`] runs a graph on the CPU as the
//! reference, and [`iree`] drives `iree-compile` and `iree-run-module`.

pub mod graph;
pub mod trace;
pub mod interp;
pub mod weights;
pub mod npy;
pub mod lower;
pub mod params;
pub mod iree;
pub mod check;
pub mod inspect;
pub mod tokenizer;
pub mod models;

use std::io::Write;
use std::path::Path;

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
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Dropping the temporary file on an early return deletes it.
    let mut out = std::io::BufWriter::with_capacity(1 << 20, tempfile::NamedTempFile::new_in(dir)?);
    write(&mut out)?;
    let tmp = out.into_inner().map_err(|e| e.into_error())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
