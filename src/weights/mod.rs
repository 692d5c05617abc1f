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
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}: {message}", path.display())]
    Format { path: PathBuf, message: String },
    #[error("{}: tensor \"{tensor}\": {message}", path.display())]
    Tensor { path: PathBuf, tensor: String, message: String },
}
