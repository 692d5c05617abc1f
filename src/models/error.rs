//! The front-ends' one error type.

use super::registry;
use crate::graph::DType;
use crate::trace::{dequant, TraceError};
use crate::weights::ggml::GgmlType;
use crate::weights::safetensors::StDType;
use crate::weights::WeightsError;
use thiserror::Error;

/// Why a checkpoint cannot be traced: an unsupported family or tensor, or
/// one that does not match the config.
#[derive(Debug, Error)]
pub enum ModelError {
    /// Tracing the forward pass failed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The checkpoint's metadata or tensors could not be read.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// The GGUF's `general.architecture` is not a supported family.
    #[error("unknown general.architecture \"{}\" (supported: {})", .0, registry::gguf_architectures())]
    UnknownArchitecture(String),
    /// The HF `config.json`'s `model_type` or `architectures[0]` is not a
    /// supported family or model class.
    #[error(
        "config.json: model_type \"{model_type}\" ({architecture}) is not supported; kiln exports {}",
        registry::hf_models()
    )]
    UnknownModelType {
        /// `model_type`.
        model_type: String,
        /// `architectures[0]`, or a note that there is none.
        architecture: String,
    },
    /// A config key (config.json or GGUF metadata) with a value kiln does
    /// not compute, out of range, or unknown.
    #[error("{file}: {key} = {value}: {message}")]
    ConfigKey {
        /// `config.json` or `GGUF metadata`.
        file: String,
        /// The key, dotted into nested objects (`rope_parameters.rope_type`).
        key: String,
        /// Its value as written.
        value: String,
        /// What is wrong, and what kiln supports.
        message: String,
    },
    /// A config key that kiln needs is absent.
    #[error("{file}: {key} is missing")]
    MissingConfigKey {
        /// `config.json` or `GGUF metadata`.
        file: String,
        /// The key.
        key: String,
    },
    /// A quantized tensor under [`super::PackedPolicy::Fail`].
    #[error("tensor \"{name}\" is packed as {ty}: choose `--packed dequantize` (dense f32/f16/bf16 params, written to an archive at export) or `--packed keep` (the checkpoint's raw blocks, dequantized inside the graph)")]
    Packed {
        /// The tensor's name.
        name: String,
        /// Its ggml type.
        ty: GgmlType,
    },
    /// A dequantize or cast dtype that is not f32, f16 or bf16.
    #[error("--packed dequantize needs f32, f16 or bf16, not {0}")]
    DequantizeDType(DType),
    /// The front-end asked for a tensor the checkpoint lacks.
    #[error("tensor \"{0}\" is missing from the checkpoint")]
    MissingTensor(String),
    /// A tensor missing from an HF checkpoint, under both its names.
    #[error("tensor \"{hf}\" (GGUF \"{gguf}\") is missing from the checkpoint")]
    MissingHfTensor {
        /// The GGUF name the front-end asked for.
        gguf: String,
        /// The HF name it maps to.
        hf: String,
    },
    /// A GGUF tensor name with no HF counterpart in the mapping table.
    #[error("tensor \"{name}\" has no Hugging Face name in the {family} family's table")]
    NoHfName {
        /// The GGUF name asked for.
        name: String,
        /// The family whose table was searched.
        family: &'static str,
    },
    /// A safetensors tensor whose dtype cannot be a param.
    #[error("tensor \"{name}\" is stored as {dtype}; safetensors params must be F32, F16 or BF16")]
    UnsupportedDType {
        /// The tensor's (HF) name.
        name: String,
        /// Its stored dtype.
        dtype: StDType,
    },
    /// A GGUF tensor whose ggml type graphs cannot load.
    #[error("tensor \"{name}\" has ggml type {ty}, which graphs cannot load (F32, F16, BF16 and the types trace::dequant supports)")]
    UnsupportedType {
        /// The tensor's name.
        name: String,
        /// Its ggml type.
        ty: GgmlType,
    },
    /// A quantized tensor under [`super::PackedPolicy::Keep`] whose type the graph
    /// cannot dequantize; the host can, so `--packed dequantize` is the way out.
    #[error("tensor \"{name}\" has ggml type {ty}, which `--packed keep` cannot dequantize inside the graph (it takes {}): use `--packed dequantize` (dense f32/f16/bf16 params, dequantized on the host and written to an archive at export)", keep_types())]
    KeepUnsupported {
        /// The tensor's name.
        name: String,
        /// Its ggml type.
        ty: GgmlType,
    },
    /// A checkpoint tensor the front-end has no use for.
    #[error("tensor \"{name}\" is in the checkpoint but kiln's {family} front-end does not use it: the model has a part kiln does not compute")]
    UnusedTensor {
        /// The tensor's name in the file.
        name: String,
        /// The family read.
        family: String,
    },
    /// A tensor's shape differs from the one the config implies.
    #[error("tensor \"{name}\" has shape {found:?}, the config needs {expected:?}")]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// The shape the config implies (row-major, `[out, in]` for a matrix).
        expected: Vec<usize>,
        /// The shape stored.
        found: Vec<usize>,
    },
    /// Metadata that is inconsistent or asks for an unsupported feature.
    #[error("config: {0}")]
    Config(String),
}

/// This module's result type.
pub type Result<T> = std::result::Result<T, ModelError>;

/// The ggml types [`super::PackedPolicy::Keep`] takes, for its error: `Q8_0 Q4_0 ...`.
fn keep_types() -> String {
    let names: Vec<&str> = GgmlType::ALL.iter().filter(|&&t| dequant::supported(t)).map(|t| t.name()).collect();
    names.join(" ")
}
