//! kiln exports ML models to StableHLO for the IREE compiler.
//!
//! The pipeline, one module per stage:
//! [`weights`] (mmap checkpoints) → [`trace`] (shape-only DSL) → [`graph`]
//! (the IR) → [`lower`] (typed StableHLO through MLIR's C API) →
//! `.mlir` + parameters; [`interp`] runs a graph on the CPU as the
//! reference, and [`iree`] drives `iree-compile` and `iree-run-module`.

pub mod check;
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

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same directory
/// and a rename, so readers never see a partial file and a failed write
/// leaves nothing behind.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
