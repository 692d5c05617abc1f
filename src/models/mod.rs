//! Model front-ends: each architecture traces its forward pass from a
//! checkpoint's metadata and tensor table, one file per family
//! ([`llama`]). This module holds what they share: [`GgufWeights`], which
//! decides how each GGUF tensor becomes a graph param under the caller's
//! [`PackedPolicy`] and feeds the same values to the reference interpreter,
//! and [`Weight`], a declared param with what it takes to read it as f32.

pub mod llama;

use crate::graph::{DType, TensorType};
use crate::interp::{Buffer, InterpError, ParamSource, Value};
use crate::trace::nn::to_f32;
use crate::trace::{dequant, Tensor, TraceError, Tracer};
use crate::weights::ggml::GgmlType;
use crate::weights::gguf::{Gguf, GgufTensor};
use crate::weights::quant;
use crate::weights::WeightsError;
use thiserror::Error;

/// What a quantized (packed) checkpoint tensor becomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PackedPolicy {
    /// Refuse: the error names the tensor, its encoding and the other two
    /// policies. The default, so that nothing is dequantized by surprise.
    #[default]
    Fail,
    /// A dense param of this dtype (f32, f16 or bf16), dequantized on the
    /// host: its bytes differ from the checkpoint's, so export writes them
    /// into an archive.
    Dequantize(DType),
    /// The raw ggml blocks as a `tensor<NBYTESxi8>` param that can point
    /// straight into the GGUF file; the graph dequantizes them
    /// ([`crate::trace::dequant`]).
    Keep,
}

impl std::fmt::Display for PackedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PackedPolicy::Fail => f.write_str("fail"),
            PackedPolicy::Dequantize(dtype) => write!(f, "dequantize to {dtype}"),
            PackedPolicy::Keep => f.write_str("keep"),
        }
    }
}

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("unknown general.architecture \"{0}\" (supported: llama)")]
    UnknownArchitecture(String),
    #[error("tensor \"{name}\" is packed as {ty}: choose `--packed dequantize` (dense f32/f16/bf16 params, written to an archive at export) or `--packed keep` (the checkpoint's raw blocks, dequantized inside the graph)")]
    Packed { name: String, ty: GgmlType },
    #[error("--packed dequantize needs f32, f16 or bf16, not {0}")]
    DequantizeDType(DType),
    #[error("tensor \"{0}\" is missing from the checkpoint")]
    MissingTensor(String),
    #[error("tensor \"{name}\" has ggml type {ty}, which graphs cannot load (F32, F16, BF16 and the types trace::dequant supports)")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("tensor \"{name}\" has shape {found:?}, the config needs {expected:?}")]
    TensorShape { name: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("config: {0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// A GGUF file read under a [`PackedPolicy`]: how each tensor is declared
/// as a param ([`GgufWeights::param_type`], [`GgufWeights::load`]), and the
/// same values for the interpreter ([`ParamSource`]).
pub struct GgufWeights<'g, D: AsRef<[u8]>> {
    pub gguf: &'g Gguf<D>,
    pub packed: PackedPolicy,
}

impl<'g, D: AsRef<[u8]>> GgufWeights<'g, D> {
    pub fn new(gguf: &'g Gguf<D>, packed: PackedPolicy) -> Result<Self> {
        if let PackedPolicy::Dequantize(dtype) = packed {
            if !dtype.is_float() {
                return Err(ModelError::DequantizeDType(dtype));
            }
        }
        Ok(GgufWeights { gguf, packed })
    }

    /// The param type of `tensor`: f32/f16/bf16 as themselves; a quantized
    /// type as the policy says. The one place that decides it, for
    /// [`GgufWeights::load`] and the interpreter alike.
    pub fn param_type(&self, tensor: &GgufTensor<'_>) -> Result<TensorType> {
        let dense = |dtype| Ok(TensorType::new(tensor.shape(), dtype));
        let name = || tensor.name.to_string();
        match (tensor.ggml_type, self.packed) {
            (GgmlType::F32, _) => dense(DType::F32),
            (GgmlType::F16, _) => dense(DType::F16),
            (GgmlType::BF16, _) => dense(DType::BF16),
            (ty, _) if !ty.is_quantized() => Err(ModelError::UnsupportedType { name: name(), ty }),
            (ty, PackedPolicy::Fail) => Err(ModelError::Packed { name: name(), ty }),
            (_, PackedPolicy::Dequantize(dtype)) => dense(dtype),
            (ty, PackedPolicy::Keep) if dequant::supported(ty) => Ok(TensorType::new([tensor.data.len()], DType::I8)),
            (ty, PackedPolicy::Keep) => Err(ModelError::UnsupportedType { name: name(), ty }),
        }
    }

    /// Declares the tensor `name` as a param, checking it has `expected` shape.
    pub fn load<'t>(&self, tracer: &'t Tracer, name: &str, expected: &[usize]) -> Result<Weight<'t>> {
        let tensor = self.gguf.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let shape = tensor.shape();
        if shape != expected {
            return Err(ModelError::TensorShape { name: name.to_string(), expected: expected.to_vec(), found: shape });
        }
        let ty = self.param_type(&tensor)?;
        let packed = (ty.dtype == DType::I8 && tensor.ggml_type.is_quantized()).then_some(tensor.ggml_type);
        let raw = tracer.param(name, ty)?;
        Ok(Weight { name: name.to_string(), raw, packed, shape })
    }
}

/// A checkpoint tensor declared as a param: the raw value as declared, with
/// what it takes to read it as f32.
#[derive(Clone, Debug)]
pub struct Weight<'t> {
    pub name: String,
    pub raw: Tensor<'t>,
    /// The ggml type of `raw`'s blocks when the param is kept packed.
    pub packed: Option<GgmlType>,
    /// Row-major logical shape (`[out, in]` for a matrix).
    pub shape: Vec<usize>,
}

impl<'t> Weight<'t> {
    /// The whole tensor as f32.
    pub fn f32(&self) -> Result<Tensor<'t>> {
        Ok(match self.packed {
            Some(ty) => dequant::dequantize(&self.raw, ty, &self.shape)?,
            None => to_f32(&self.raw)?,
        })
    }

    /// Rows `ids` (`[n]` integer) of a matrix, as f32 `[n, cols]`: an
    /// embedding lookup. A packed table dequantizes only the rows it picks
    /// (a row is a whole number of blocks) when `n` is static; with `n = ?`
    /// the picked bytes cannot be regrouped into blocks (a `?` dim is never
    /// merged), so the whole table is dequantized and gathered from.
    pub fn rows(&self, ids: &Tensor<'t>) -> Result<Tensor<'t>> {
        let [rows, cols] = self.shape[..] else {
            return Err(ModelError::Config(format!(
                "{}: rows() needs a matrix, found shape {:?}",
                self.name, self.shape
            )));
        };
        match self.packed {
            Some(ty) if !ids.ty.is_dynamic() => {
                let row_bytes = self.raw.ty.shape[0] / rows;
                let n = ids.ty.num_elements();
                let picked = self.raw.reshape(&[rows, row_bytes])?.gather(ids)?.reshape(&[n * row_bytes])?;
                Ok(dequant::dequantize(&picked, ty, &[n, cols])?)
            }
            Some(_) => Ok(self.f32()?.gather(ids)?),
            None => Ok(to_f32(&self.raw.gather(ids)?)?),
        }
    }
}

impl<D: AsRef<[u8]>> ParamSource for GgufWeights<'_, D> {
    /// The tensor as [`GgufWeights::param_type`] declares it: raw block bytes
    /// (what IREE reads with `--parameters=model=FILE.gguf`), or values
    /// dequantized on the host by the CPU dequantizers.
    fn param(&self, name: &str, ty: &TensorType) -> std::result::Result<Value, InterpError> {
        let tensor = self.gguf.tensor(name).ok_or_else(|| InterpError::MissingParam { name: name.to_string() })?;
        let fail = |message: String| InterpError::Param { name: name.to_string(), message };
        let stored = self.param_type(&tensor).map_err(|e| fail(e.to_string()))?;
        if stored != *ty {
            return Err(InterpError::ParamType {
                name: name.to_string(),
                expected: ty.clone(),
                found: stored.to_string(),
            });
        }
        if !tensor.ggml_type.is_quantized() || ty.dtype == DType::I8 {
            return Value::from_le_bytes(ty, tensor.data);
        }
        let values = quant::dequantize_to_vec(tensor.ggml_type, tensor.data).map_err(|e| fail(e.to_string()))?;
        let f32s = Value::new(ty.with_dtype(DType::F32), Buffer::F32(values))?;
        Ok(f32s.convert(ty.dtype))
    }
}
