//! Errors of the params layer: parameter archives on disk.

use std::path::PathBuf;

/// Why a parameter archive could not be written or read; each names the file
/// or the entry.
#[derive(Debug, thiserror::Error)]
pub enum ParamsError {
    /// A file operation failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done: `open`, `memory-map`, ...
        op: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A declared entry cannot be laid out; raised before any file is touched.
    #[error("parameter entry \"{entry}\": {message}")]
    Spec {
        /// The entry's name.
        entry: String,
        /// What is wrong with it.
        message: String,
    },

    /// An entry's fill failed; the archive was not written.
    #[error("{path}: writing entry \"{entry}\" failed: {source}; nothing was written to {path}")]
    Fill {
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
    Length {
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
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The header's length.
        need: u64,
    },

    /// The file does not start with the IRPA magic.
    #[error("{path}: not an IRPA archive (magic {found:#010x} at byte 0, expected 0x41505249 \"IRPA\"); pass an .irpa file written by kiln or IREE")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// Its first four bytes, little-endian.
        found: u32,
    },

    /// The archive uses what kiln does not read: another version, linked archives,
    /// external entries.
    #[error("{path}: {message}; repack it with `iree-convert-parameters` or re-export it with kiln")]
    Unsupported {
        /// The archive.
        path: PathBuf,
        /// What it uses.
        message: String,
    },

    /// The archive's structure is inconsistent.
    #[error("{path}: corrupt IRPA archive at byte {offset}: {message}; re-export the file")]
    Corrupt {
        /// The archive.
        path: PathBuf,
        /// Where in the file.
        offset: u64,
        /// What is wrong.
        message: String,
    },

    /// Two entries have one name.
    #[error("{path}: parameter \"{name}\" appears twice (entries {first} and {second}); names must be unique, re-export the file")]
    DuplicateName {
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
