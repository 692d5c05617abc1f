//! Model front-ends: each architecture traces its forward pass from a
//! checkpoint's metadata and tensor table, one file per family
//! ([`llama`], [`gemma3`]). This module holds what they share: how a GGUF
//! tensor becomes a graph param ([`Weight`]), the [`GgufParams`] that feeds
//! the same bytes to the reference interpreter, and the head reshapes of
//! multi-head attention.
//!
//! Weights follow the **Keep** policy: a quantized tensor is declared as its
//! raw ggml blocks, `tensor<NBYTESxi8>`, and the graph dequantizes it
//! ([`crate::trace::dequant`]), so IREE can read every param straight from
//! the GGUF file (`--parameters=model=FILE.gguf`) with nothing converted
//! ahead of time.

pub mod gemma3;
pub mod llama;

use crate::graph::{DType, TensorType};
use crate::interp::{InterpError, ParamSource, Value};
use crate::trace::{dequant, Tensor, TraceError, Tracer};
use crate::weights::ggml::GgmlType;
use crate::weights::gguf::{Gguf, GgufTensor};
use crate::weights::WeightsError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("unknown general.architecture \"{0}\" (supported: llama, gemma3)")]
    UnknownArchitecture(String),
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

/// How a GGUF tensor is declared in a graph: f32/f16/bf16 as themselves,
/// quantized types as `tensor<NBYTESxi8>` of raw blocks. The one place that
/// decides it, for [`Weight::load`] and [`GgufParams`] alike.
pub fn param_type(tensor: &GgufTensor<'_>) -> Result<TensorType> {
    let dense = |dtype| Ok(TensorType::new(tensor.shape(), dtype));
    match tensor.ggml_type {
        GgmlType::F32 => dense(DType::F32),
        GgmlType::F16 => dense(DType::F16),
        GgmlType::BF16 => dense(DType::BF16),
        ty if dequant::supported(ty) => Ok(TensorType::new([tensor.data.len()], DType::I8)),
        ty => Err(ModelError::UnsupportedType { name: tensor.name.to_string(), ty }),
    }
}

/// A checkpoint tensor declared as a param: the raw value as stored, with
/// what it takes to read it as f32.
#[derive(Clone, Debug)]
pub struct Weight<'t> {
    pub name: String,
    pub raw: Tensor<'t>,
    pub ggml_type: GgmlType,
    /// Row-major logical shape (`[out, in]` for a matrix).
    pub shape: Vec<usize>,
}

impl<'t> Weight<'t> {
    /// Declares the GGUF tensor `name`, checking it has `expected` shape.
    pub fn load<D: AsRef<[u8]>>(tracer: &'t Tracer, gguf: &Gguf<D>, name: &str, expected: &[usize]) -> Result<Self> {
        let tensor = gguf.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let shape = tensor.shape();
        if shape != expected {
            return Err(ModelError::TensorShape { name: name.to_string(), expected: expected.to_vec(), found: shape });
        }
        let raw = tracer.param(name, param_type(&tensor)?)?;
        Ok(Weight { name: name.to_string(), raw, ggml_type: tensor.ggml_type, shape })
    }

    /// The whole tensor as f32.
    pub fn f32(&self) -> Result<Tensor<'t>> {
        Ok(match self.ggml_type {
            GgmlType::F32 => self.raw.clone(),
            GgmlType::F16 | GgmlType::BF16 => self.raw.convert(DType::F32)?,
            ty => dequant::dequantize(&self.raw, ty, &self.shape)?,
        })
    }

    /// Rows `ids` (`[n]` integer) of a matrix, as f32 `[n, cols]`: an
    /// embedding lookup that dequantizes only the rows it picks (a row of a
    /// quantized matrix is a whole number of blocks).
    pub fn rows(&self, ids: &Tensor<'t>) -> Result<Tensor<'t>> {
        let [rows, cols] = self.shape[..] else {
            return Err(ModelError::Config(format!(
                "{}: rows() needs a matrix, found shape {:?}",
                self.name, self.shape
            )));
        };
        match self.ggml_type {
            GgmlType::F32 => Ok(self.raw.gather(ids)?),
            GgmlType::F16 | GgmlType::BF16 => Ok(self.raw.gather(ids)?.convert(DType::F32)?),
            ty => {
                let row_bytes = self.raw.ty.shape[0] / rows;
                let n = ids.ty.num_elements();
                let picked = self.raw.reshape(&[rows, row_bytes])?.gather(ids)?.reshape(&[n * row_bytes])?;
                Ok(dequant::dequantize(&picked, ty, &[n, cols])?)
            }
        }
    }
}

/// `x [seq, n·hd] -> [n, seq, hd]`
fn split_heads<'t>(x: &Tensor<'t>, heads: usize, head_dim: usize) -> Result<Tensor<'t>> {
    let seq = x.ty.shape[0];
    Ok(x.reshape(&[seq, heads, head_dim])?.transpose(&[1, 0, 2])?)
}

/// `x [n, seq, hd] -> [seq, n·hd]`
fn merge_heads<'t>(x: &Tensor<'t>) -> Result<Tensor<'t>> {
    let (heads, seq, head_dim) = (x.ty.shape[0], x.ty.shape[1], x.ty.shape[2]);
    Ok(x.transpose(&[1, 0, 2])?.reshape(&[seq, heads * head_dim])?)
}

/// The interpreter's view of a GGUF file: every tensor as [`param_type`]
/// declares it (raw block bytes as `i8` for quantized types), i.e. exactly
/// what IREE reads with `--parameters=model=FILE.gguf`.
pub struct GgufParams<'a, D: AsRef<[u8]>>(pub &'a Gguf<D>);

impl<D: AsRef<[u8]>> ParamSource for GgufParams<'_, D> {
    fn param(&self, name: &str, ty: &TensorType) -> std::result::Result<Value, InterpError> {
        let tensor = self.0.tensor(name).ok_or_else(|| InterpError::MissingParam { name: name.to_string() })?;
        let stored =
            param_type(&tensor).map_err(|e| InterpError::Param { name: name.to_string(), message: e.to_string() })?;
        if stored != *ty {
            return Err(InterpError::ParamType {
                name: name.to_string(),
                expected: ty.clone(),
                found: stored.to_string(),
            });
        }
        Value::from_le_bytes(ty, tensor.data)
    }
}

/// Synthetic GGUF files for the model front-ends' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use crate::graph::{DType, TensorType};
    use crate::interp::Value;

    /// A GGUF v3 file in memory: `(key, value)` metadata (u32, f32 or
    /// string) and `(name, row-major shape, ggml type, bytes)` tensors.
    pub enum Meta {
        U32(u32),
        F32(f32),
        Str(&'static str),
    }

    pub fn gguf_bytes(meta: &[(&str, Meta)], tensors: &[(String, Vec<usize>, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = Vec::new();
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend((meta.len() as u64).to_le_bytes());
        for (key, value) in meta {
            string(&mut b, key);
            match value {
                Meta::U32(v) => b.extend(4u32.to_le_bytes().into_iter().chain(v.to_le_bytes())),
                Meta::F32(v) => b.extend(6u32.to_le_bytes().into_iter().chain(v.to_le_bytes())),
                Meta::Str(v) => {
                    b.extend(8u32.to_le_bytes());
                    string(&mut b, v);
                }
            }
        }
        let align = |n: usize| n.div_ceil(32) * 32;
        let mut offset = 0;
        for (name, shape, ty, data) in tensors {
            string(&mut b, name);
            b.extend((shape.len() as u32).to_le_bytes());
            shape.iter().rev().for_each(|&d| b.extend((d as u64).to_le_bytes()));
            b.extend(ty.to_le_bytes());
            b.extend((offset as u64).to_le_bytes());
            offset = align(offset + data.len());
        }
        b.resize(align(b.len()), 0);
        for (_, _, _, data) in tensors {
            b.extend(data);
            b.resize(align(b.len()), 0);
        }
        b
    }

    /// Seeded tensor bytes, each call with the next seed: `f32s(n, around)`
    /// is F32 in `around ± 0.5`, `q8_0(n)` Q8_0 blocks of scale 0.01.
    pub struct Fill(std::cell::Cell<u64>);

    impl Fill {
        pub fn new(seed: u64) -> Fill {
            Fill(std::cell::Cell::new(seed))
        }

        fn next_seed(&self) -> u64 {
            self.0.replace(self.0.get() + 1)
        }

        pub fn f32s(&self, n: usize, around: f32) -> Vec<u8> {
            let v = Value::random(&TensorType::new([n], DType::F32), self.next_seed(), 0..1);
            v.to_f64_vec().iter().flat_map(|x| (around + 0.5 * *x as f32).to_le_bytes()).collect()
        }

        pub fn q8_0(&self, n: usize) -> Vec<u8> {
            let q = Value::random(&TensorType::new([n], DType::I8), self.next_seed(), -127..128).to_le_bytes();
            q.chunks(32)
                .flat_map(|c| half::f16::from_f32(0.01).to_le_bytes().into_iter().chain(c.iter().copied()))
                .collect()
        }
    }
}
