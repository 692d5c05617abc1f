//! Checkpoint files, memory-mapped so weights are never copied to be read.

pub mod ggml;
pub mod gguf;
pub mod gguf_writer;
pub mod hf_config;
pub mod quant;
pub mod safetensors;
pub mod synth;

use std::path::PathBuf;
use thiserror::Error;

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
