//! Errors of the params layer: parameter archives on disk.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ParamsError {
    #[error("cannot {op} {path}: {source}")]
    Io { path: PathBuf, op: &'static str, source: std::io::Error },

    /// A declared entry cannot be laid out; raised before any file is touched.
    #[error("parameter entry \"{entry}\": {message}")]
    Spec { entry: String, message: String },

    #[error("{path}: writing entry \"{entry}\" failed: {source}; nothing was written to {path}")]
    Fill { path: PathBuf, entry: String, source: std::io::Error },

    #[error(
        "{path}: entry \"{entry}\" was declared as {declared} bytes but its fill wrote {written}{more}; \
         declare the exact byte length (nothing was written to {path})",
        more = if *.overflow { " or more" } else { "" }
    )]
    Length { path: PathBuf, entry: String, declared: u64, written: u64, overflow: bool },

    #[error("{path}: {len} bytes is too short for an IRPA archive (the header alone is {need}); the file is empty or truncated, re-export it")]
    TooShort { path: PathBuf, len: u64, need: u64 },

    #[error("{path}: not an IRPA archive (magic {found:#010x} at byte 0, expected 0x41505249 \"IRPA\"); pass an .irpa file written by kiln or IREE")]
    BadMagic { path: PathBuf, found: u32 },

    #[error("{path}: {message}; repack it with `iree-convert-parameters` or re-export it with kiln")]
    Unsupported { path: PathBuf, message: String },

    #[error("{path}: corrupt IRPA archive at byte {offset}: {message}; re-export the file")]
    Corrupt { path: PathBuf, offset: u64, message: String },

    #[error("{path}: parameter \"{name}\" appears twice (entries {first} and {second}); names must be unique, re-export the file")]
    DuplicateName { path: PathBuf, name: String, first: u64, second: u64 },
}
