//! Checkpoint files, memory-mapped so weights are never copied to be read.

pub mod ggml;
pub mod gguf;
pub mod gguf_writer;
pub mod hf_config;
pub mod quant;
pub mod safetensors;
pub mod synth;

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

/// Every error names the file; tensor-level ones also name the tensor.
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
