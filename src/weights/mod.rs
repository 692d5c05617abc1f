//! Checkpoint files, memory-mapped so weights are never copied to be read,
//! and the `.irpa` parameter archives an export writes ([`archive`],
//! [`irpa`]): the data floor, which every other layer stands on.

pub mod archive;
pub mod ggml;
pub mod gguf;
pub mod gguf_writer;
pub mod hf_config;
pub mod irpa;
pub mod quant;
pub mod safetensors;
mod types;

pub use types::{DType, TensorType, DYNAMIC};

use memmap2::Mmap;
use std::path::PathBuf;
use thiserror::Error;

/// How far before a released view [`release_pages`] also releases. Linux
/// maps the cached pages around each fault (`fault_around_bytes`, 64 KiB by
/// default), so reading a chunk maps the tail of the chunk released before
/// it again; a sequential reader that released only its own chunks kept
/// about a third of a multi-GB checkpoint resident.
const FAULT_AROUND_SLACK: usize = 1 << 20;

/// Tells the OS that a sequential reader is done with `bytes`, a view of
/// `map`, and with the [`FAULT_AROUND_SLACK`] bytes before it: their pages
/// leave the process's resident memory and are read from the file again if
/// touched, so reading a whole multi-GB checkpoint costs no more memory
/// than a chunk. Bytes outside the map are ignored.
pub(crate) fn release_pages(map: &Mmap, bytes: &[u8]) {
    let base = map.as_ptr() as usize;
    let start = bytes.as_ptr() as usize;
    if start < base || start + bytes.len() > base + map.len() || bytes.is_empty() {
        return;
    }
    let from = (start - base).saturating_sub(FAULT_AROUND_SLACK);
    let len = start - base + bytes.len() - from;
    // SAFETY: the map is a read-only file mapping, so dropped pages are
    // read back from the file, never zero-filled: no view changes.
    // memmap2 aligns the range to pages. Failure only leaves them resident.
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, len) };
}

/// Every error names the file; tensor-level ones also name the tensor,
/// archive-level ones the entry.
#[derive(Debug, Error)]
pub enum WeightsError {
    /// The file could not be opened, mapped or read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The file is malformed or not the format expected.
    #[error("{}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        message: String,
    },
    /// One tensor is malformed or missing.
    #[error("{}: tensor \"{tensor}\": {message}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        message: String,
    },

    // Parameter archives (`.irpa`): each names the file or the entry.
    /// An archive could not be created, opened, mapped, read or written.
    #[error("cannot {op} {path}: {source}")]
    ArchiveIo {
        /// The file.
        path: PathBuf,
        /// What was being done: `open`, `memory-map`, ...
        op: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A declared entry cannot be laid out; raised before any file is touched.
    #[error("parameter entry \"{entry}\": {message}")]
    ArchiveEntry {
        /// The entry's name.
        entry: String,
        /// What is wrong with it.
        message: String,
    },

    /// An entry's fill failed; the archive was not written.
    #[error("{path}: writing entry \"{entry}\" failed: {source}; nothing was written to {path}")]
    ArchiveFill {
        /// The archive.
        path: PathBuf,
        /// The entry.
        entry: String,
        /// The fill's error.
        source: std::io::Error,
    },

    /// An entry's fill wrote another length than declared; the archive was not written.
    #[error(
        "{path}: entry \"{entry}\" was declared as {declared} bytes but its fill wrote {written}{more}; \
         declare the exact byte length (nothing was written to {path})",
        more = if *.overflow { " or more" } else { "" }
    )]
    ArchiveLength {
        /// The archive.
        path: PathBuf,
        /// The entry.
        entry: String,
        /// Its declared length.
        declared: u64,
        /// What the fill wrote (at least, with `overflow`).
        written: u64,
        /// Whether the fill wrote past the declared length and was stopped.
        overflow: bool,
    },

    /// The file is shorter than an archive header.
    #[error("{path}: {len} bytes is too short for an IRPA archive (the header alone is {need}); the file is empty or truncated, re-export it")]
    ArchiveTooShort {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The header's length.
        need: u64,
    },

    /// The file does not start with the IRPA magic.
    #[error("{path}: not an IRPA archive (magic {found:#010x} at byte 0, expected 0x41505249 \"IRPA\"); pass an .irpa file written by kiln or IREE")]
    ArchiveMagic {
        /// The file.
        path: PathBuf,
        /// Its first four bytes, little-endian.
        found: u32,
    },

    /// The archive uses what kiln does not read: another version, linked archives,
    /// external entries.
    #[error("{path}: {message}; repack it with `iree-convert-parameters` or re-export it with kiln")]
    ArchiveUnsupported {
        /// The archive.
        path: PathBuf,
        /// What it uses.
        message: String,
    },

    /// The archive's structure is inconsistent.
    #[error("{path}: corrupt IRPA archive at byte {offset}: {message}; re-export the file")]
    ArchiveCorrupt {
        /// The archive.
        path: PathBuf,
        /// Where in the file.
        offset: u64,
        /// What is wrong.
        message: String,
    },

    /// Two entries have one name.
    #[error("{path}: parameter \"{name}\" appears twice (entries {first} and {second}); names must be unique, re-export the file")]
    ArchiveDuplicateName {
        /// The archive.
        path: PathBuf,
        /// The name.
        name: String,
        /// The first entry's index.
        first: u64,
        /// The second entry's index.
        second: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Released pages are read back from the file, never zero-filled; views
    /// outside the map are left alone.
    #[test]
    fn released_pages_read_back_unchanged() {
        let bytes: Vec<u8> = (0..5 * 4096u32).map(|i| (i % 251) as u8 + 1).collect();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &bytes).unwrap();
        // SAFETY: the temporary file is not modified while mapped.
        let map = unsafe { Mmap::map(file.as_file()) }.unwrap();
        assert_eq!(&map[..], &bytes[..]);
        release_pages(&map, &map[100..3 * 4096 + 7]);
        release_pages(&map, &bytes[..4096]);
        release_pages(&map, &map[..0]);
        assert_eq!(&map[..], &bytes[..]);
    }
}
