//! `kiln export`: a checkpoint to a directory that `kiln compile` and
//! `kiln run` (or iree-compile and iree-run-module directly) use.
//!
//! The directory holds the module (`model.mlir` or `model.mlirbc`) with
//! `prefill`, `decode` and `generate`; `params.irpa` when some params had
//! to be derived (dequantized, re-typed); and `manifest.json`, which says
//! what the functions take and which parameter file binds which scope.
//! The manifest is written last: a directory with one is complete.
//!
//! Params ([`ParamsMode`]):
//! - `reference`: params stored as the graph declares them point at the
//!   checkpoint (`#flow.parameter.named<"model"::NAME>`, run with
//!   `--parameters=model=CHECKPOINT`); only derived ones are written, into
//!   `params.irpa` under the scope `archive`.
//! - `archive`: every param is written into `params.irpa` (scope `archive`),
//!   dense ones as `--dtype`.
//! - `inline`: every param is a `dense_resource` blob in the module, which
//!   aliases the mapped checkpoint until it is written (bytecode by default).
//!
//! What becomes of each param, what is written where, the bindings, the
//! module's form and its compile flags are decided once per export, by
//! `plan.rs`; the manifest's signatures are those of the lowered module.

mod plan;

use plan::Plan;

use crate::graph::{DType, Op, TensorType};
use crate::iree::{Iree, IreeError, Target, TargetError, ToolStats};
use crate::lower::{self, Emit, LowerError, LowerOptions, RowLoop, Session, Signature};
use crate::models::bert::{self, EmbedChoice, Pooling};
use crate::models::hf::{HfCheckpoint, SafetensorsWeights};
use crate::models::{
    registry, scalar_i32, token_ids, CacheSpec, Checkpoint, Family, GgufWeights, ModelError, PackedPolicy, Serving,
};
use crate::npy;
use crate::tokenizer::{Tokenizer, TokenizerError, WordPiece};
use crate::weights::archive;
use crate::weights::gguf::Gguf;
use crate::weights::WeightsError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;
use thiserror::Error;

/// Why an export, compile or run failed; the wrapped errors name their file.
#[derive(Debug, Error)]
pub enum ExportError {
    /// The checkpoint could not be read, or `params.irpa` written.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// Tracing the model failed, or the checkpoint does not fit its family.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Lowering the graphs or writing the module failed.
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// The checkpoint's tokenizer could not be read.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// `iree-compile` or `iree-run-module` failed.
    #[error(transparent)]
    Iree(#[from] IreeError),
    /// An `.npy` file exchanged with `iree-run-module` could not be written or read.
    #[error(transparent)]
    Npy(#[from] npy::NpyError),
    /// The checkpoint (or the prompt for it) is not one kiln can use.
    #[error("{path}: {message}")]
    Source {
        /// The checkpoint, or the file in it at fault.
        path: PathBuf,
        /// What is wrong, and what to do instead.
        message: String,
    },
    /// A file or directory could not be created, written or read.
    #[error("{path}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The directory is not a complete export.
    #[error("{path}: not a kiln export ({message}); run `kiln export MODEL -o DIR` first")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The export cannot do this yet: not compiled, or not compilable.
    #[error("{path}: {message}")]
    NotReady {
        /// The module, or the `model.vmfb` not yet compiled.
        path: PathBuf,
        /// What is missing and what to run.
        message: String,
    },
}

/// This module's result type.
pub type Result<T> = std::result::Result<T, ExportError>;

/// Where params' values come from at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamsMode {
    /// The checkpoint itself; only derived params are written.
    #[default]
    Reference,
    /// Every param in `params.irpa`.
    Archive,
    /// Every param inside the module.
    Inline,
}

impl ParamsMode {
    /// Every mode, in `--params` order.
    pub const ALL: [ParamsMode; 3] = [ParamsMode::Reference, ParamsMode::Archive, ParamsMode::Inline];

    /// `reference`, `archive` or `inline`: the `--params` value and the
    /// manifest's.
    pub fn name(self) -> &'static str {
        match self {
            ParamsMode::Reference => "reference",
            ParamsMode::Archive => "archive",
            ParamsMode::Inline => "inline",
        }
    }
}

impl std::str::FromStr for ParamsMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<ParamsMode, String> {
        ParamsMode::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            let names: Vec<&str> = ParamsMode::ALL.iter().map(|m| m.name()).collect();
            format!("no params mode \"{s}\"; try one of: {}", names.join(", "))
        })
    }
}

/// How [`export`] stores params and which module form it writes.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// Where params' values come from at run time.
    pub params: ParamsMode,
    /// What quantized checkpoint tensors become (a dequantize dtype included).
    pub packed: PackedPolicy,
    /// In archive mode, every dense param's dtype (the CLI's `--dtype` sets
    /// this and the dequantize dtype).
    pub dtype: DType,
    /// Positions of the KV cache: prompt plus generated tokens. By default
    /// ([`None`]) the model's own context length, capped so that the caches
    /// fit in [`DEFAULT_CACHE_BUDGET`] ([`default_max_context`]).
    pub max_context: Option<usize>,
    /// The KV cache's element type: f32, f16 or bf16 ([`CacheSpec::DTYPES`]).
    /// f16 by default, as llama.cpp's: decode runs as fast as with f32 (the
    /// conversions fuse into attention's products), the caches take half
    /// the memory, and logits stay within 2e-2 of transformers' on the
    /// fixtures (f32: 2e-5). README's "KV cache dtype" has the figures.
    pub kv_dtype: DType,
    /// `prefill` runs prompts of at most this many tokens as `decode` steps
    /// ([`crate::lower::GreedyLoop::stepped_prefill`]); 0: never; the
    /// capacity or more: every prompt, and the module has no prompt graph.
    /// `None`: the family's [`crate::models::default_stepped_prefill`].
    pub stepped_prefill: Option<usize>,
    /// The module's form; by default bytecode for inline params, else text.
    pub emit: Option<Emit>,
    /// Encoders (BERT): sentences per chunk of `embed`'s loop, and the
    /// pooling and normalization where the checkpoint does not say.
    pub embed: EmbedOptions,
}

/// How an encoder's `embed` is exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbedOptions {
    /// Sentences per chunk: `embed` takes any number of sentences and runs
    /// them `chunk` at a time, then one at a time for what is left
    /// ([`crate::lower::RowLoop`]); kiln's graphs have one run-time size,
    /// which the sentence length takes.
    pub chunk: usize,
    /// Pooling and normalization for checkpoints that do not say.
    pub choice: EmbedChoice,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions { chunk: 8, choice: EmbedChoice::default() }
    }
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            params: ParamsMode::Reference,
            packed: PackedPolicy::Fail,
            dtype: DType::F32,
            max_context: None,
            kv_dtype: DType::F16,
            stepped_prefill: None,
            emit: None,
            embed: EmbedOptions::default(),
        }
    }
}

/// The most bytes the two KV caches take at the default capacity: about
/// the packed weights of the 1B-class models people serve (Llama-3.2-1B
/// Q4_K_M is 0.8 GB), so the default at most about doubles what a served
/// model holds in memory. With f16 caches Llama-3.2-1B gets 32768 of its
/// 131072 positions, Llama-3-8B 8192; SmolLM2 (8192) and Gemma-3-270M
/// (32768) get their whole context.
pub const DEFAULT_CACHE_BUDGET: u64 = 1 << 30;

/// A checkpoint that does not say its context length gets this many
/// positions by default (as llama.cpp's `llama-cli` does).
pub const FALLBACK_CONTEXT: usize = 4096;

/// The default capacity: the model's own context length (`context`, else
/// [`FALLBACK_CONTEXT`]), or, where caches of `position_bytes` per position
/// would pass [`DEFAULT_CACHE_BUDGET`] at that length, the largest power of
/// two that fits.
pub fn default_max_context(context: Option<usize>, position_bytes: u64) -> usize {
    let own = context.unwrap_or(FALLBACK_CONTEXT).max(1);
    let fits = (DEFAULT_CACHE_BUDGET / position_bytes.max(1)).max(1) as usize;
    if own <= fits {
        own
    } else {
        1 << fits.ilog2()
    }
}

impl ExportOptions {
    /// The dtype dense checkpoint tensors are declared as instead of their
    /// own: archive mode writes every param in one dtype.
    pub fn cast(&self) -> Option<DType> {
        (self.params == ParamsMode::Archive).then_some(self.dtype)
    }
}

/// Hooks for a progress display; every method defaults to nothing.
pub trait Progress {
    /// A new stage starts (`tracing`, `lowering`, ...).
    fn stage(&mut self, _name: &str) {}
    /// `total` bytes of params are about to be written.
    fn start_bytes(&mut self, _total: u64) {}
    /// `n` more of them were written.
    fn advance(&mut self, _n: u64) {}
}

impl Progress for () {}

/// A checkpoint opened for export: the mapped files and what they hold.
pub enum Source {
    /// A `.gguf` file.
    Gguf(Gguf),
    /// An HF directory: `config.json` and safetensors.
    Hf {
        /// The directory.
        dir: PathBuf,
        /// Its config and mapped safetensors.
        checkpoint: Box<HfCheckpoint>,
    },
}

impl Source {
    /// A `.gguf` file, or an HF checkpoint directory.
    pub fn open(path: &Path) -> Result<Source> {
        if path.is_dir() {
            return Ok(Source::Hf { dir: path.to_path_buf(), checkpoint: Box::new(HfCheckpoint::open(path)?) });
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("gguf") => Ok(Source::Gguf(Gguf::open(path)?)),
            _ => Err(ExportError::Source {
                path: path.to_path_buf(),
                message: "kiln exports a .gguf file or an HF directory (config.json + safetensors)".into(),
            }),
        }
    }

    /// What `kiln export` was given.
    pub fn path(&self) -> &Path {
        match self {
            Source::Gguf(gguf) => gguf.path(),
            Source::Hf { dir, .. } => dir,
        }
    }

    /// The files that hold the tensors: `--parameters=model=FILE` for each.
    pub fn tensor_files(&self) -> Vec<&Path> {
        match self {
            Source::Gguf(gguf) => vec![gguf.path()],
            Source::Hf { checkpoint, .. } => checkpoint.files(),
        }
    }

    /// `gguf` or `safetensors`, as the manifest records it.
    pub fn format(&self) -> &'static str {
        match self {
            Source::Gguf(_) => "gguf",
            Source::Hf { .. } => "safetensors",
        }
    }

    /// Why IREE cannot read the checkpoint's tensor files as parameter
    /// files, if it cannot: a GGUF tensor of a type IREE 3.13's GGUF reader
    /// does not size. IREE's safetensors reader takes offsets only,
    /// whatever the dtype.
    pub fn unreadable_by_iree(&self) -> Option<String> {
        match self {
            Source::Gguf(gguf) => plan::unreadable_gguf(gguf.tensors().map(|t| (t.name, t.ggml_type))),
            Source::Hf { .. } => None,
        }
    }

    /// The positions the model was trained for: GGUF
    /// `{arch}.context_length`, HF `max_position_embeddings`.
    pub fn context_length(&self) -> Option<usize> {
        match self {
            Source::Gguf(gguf) => {
                let arch = gguf.get_str("general.architecture").ok()?;
                gguf.get_u64(&format!("{arch}.context_length")).ok().map(|n| n as usize)
            }
            Source::Hf { checkpoint, .. } => {
                let keys = checkpoint.config.text_keys()?;
                keys.get("max_position_embeddings")?.as_u64().map(|n| n as usize)
            }
        }
    }

    /// The model family and its hyper-parameters, from the checkpoint's metadata.
    pub fn family(&self) -> Result<Family> {
        Ok(match self {
            Source::Gguf(gguf) => Family::from_gguf(gguf)?,
            Source::Hf { checkpoint, .. } => Family::from_hf(&checkpoint.config)?,
        })
    }

    /// The checkpoint's tensors under `packed`, dense ones cast to `cast`.
    pub fn weights(&self, packed: PackedPolicy, cast: Option<DType>) -> Result<Box<dyn Checkpoint + '_>> {
        Ok(match self {
            Source::Gguf(gguf) => Box::new(GgufWeights::new(gguf, packed)?.with_cast(cast)?),
            // Safetensors' packed tensors: gpt-oss's MXFP4 experts.
            Source::Hf { checkpoint, .. } => {
                Box::new(SafetensorsWeights::new(checkpoint)?.with_packed(packed).with_cast(cast)?)
            }
        })
    }

    /// Drops `bytes` (read by a streaming writer) from resident memory.
    pub fn release(&self, bytes: &[u8]) {
        match self {
            Source::Gguf(gguf) => gguf.release(bytes),
            Source::Hf { checkpoint, .. } => checkpoint.release(bytes),
        }
    }

    /// The encoder's config, if the checkpoint is one (its family's
    /// [`registry`] row says), `choice` filling in what it does not say.
    pub fn encoder(&self, choice: EmbedChoice) -> Result<Option<bert::Config>> {
        Ok(match self {
            Source::Gguf(gguf) => registry::gguf_encoder(gguf, choice)?,
            Source::Hf { dir, checkpoint } => registry::hf_encoder(&checkpoint.config, dir, choice)?,
        })
    }

    /// An encoder checkpoint's WordPiece tokenizer.
    pub fn wordpiece(&self) -> Result<WordPiece> {
        match self {
            Source::Gguf(gguf) => Ok(WordPiece::from_gguf(gguf)?),
            Source::Hf { dir, .. } => Ok(WordPiece::from_hf_dir(dir)?),
        }
    }

    /// The checkpoint's own tokenizer.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            Source::Gguf(gguf) => Ok(Tokenizer::from_gguf(gguf)?),
            Source::Hf { dir, .. } => Ok(Tokenizer::from_hf_dir(dir)?),
        }
    }
}

/// `manifest.json`: what an export holds and how to run it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// The kiln version that wrote the export.
    pub kiln_version: String,
    /// The checkpoint (a file or an HF directory), absolute: `kiln run`
    /// reads its tokenizer.
    pub source: PathBuf,
    /// The checkpoint's format: `gguf` or `safetensors` ([`Source::format`]).
    pub format: String,
    /// The model family, as in `general.architecture` ([`Family::name`]).
    pub architecture: String,
    /// The module file, relative to the directory.
    pub module: String,
    /// Where params' values come from at run time.
    pub params: ParamsMode,
    /// The packed policy the export used, as [`PackedPolicy`] displays it.
    pub packed: String,
    /// Positions of the KV cache: the most prompt plus generated tokens;
    /// for an encoder, the most tokens of a sentence.
    pub max_context: usize,
    /// The KV caches' element type (`f32`, `f16`, `bf16`): `prefill`
    /// returns them, `decode` takes and returns them in it. Absent for an
    /// encoder, which has no cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_dtype: Option<String>,
    /// `prefill` runs prompts of at most this many tokens as `decode` steps
    /// (reading keys and values back from the cache, in `kv_dtype`), longer
    /// ones through the prompt's graph; `max_context`: every prompt (no
    /// prompt graph). Absent for an encoder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stepped_prefill: Option<usize>,
    /// `--parameters=SCOPE=FILE` bindings; relative files are in the directory.
    pub parameters: Vec<ParameterFile>,
    /// Inline weights were elided from the text (`--emit mlir` without
    /// `--full-resources`): readable, not compilable.
    #[serde(default)]
    pub elided_resources: bool,
    /// iree-compile flags this module needs besides the target's
    /// ([`crate::iree::COMPILE_FLAGS`]).
    #[serde(default)]
    pub compile_flags: Vec<String>,
    /// The module's public functions, as lowered: `prefill`, `decode` and
    /// `generate`; an encoder's `embed`.
    pub functions: Vec<Signature>,
    /// What `model.vmfb` was compiled for ([`crate::iree::Target`]), set by
    /// [`compile`]; absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled_for: Option<String>,
    /// What an encoder's `embed` computes; absent for decoders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Embedding>,
}

/// An encoder export's `embed(ids: tensor<?x?xi32>, mask: tensor<?x?xi32>)
/// -> tensor<?xDIMxf32>`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Embedding {
    /// Sentences per chunk of `embed`'s loop ([`EmbedOptions::chunk`]).
    pub chunk: usize,
    /// Features of a sentence vector.
    pub dim: usize,
    /// How the token states are pooled.
    pub pooling: Pooling,
    /// Whether the vectors are L2-normalized.
    pub normalize: bool,
    /// Tokens a sentence is truncated to, `[CLS]` and `[SEP]` included.
    pub max_length: usize,
}

/// One `--parameters=SCOPE=FILE` binding.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ParameterFile {
    /// The scope of `#flow.parameter.named<"SCOPE"::NAME>`: the lowering's
    /// ([`lower::DEFAULT_PARAM_SCOPE`]) for the checkpoint, [`ARCHIVE_SCOPE`].
    pub scope: String,
    /// The file: absolute, or relative to the export directory.
    pub file: PathBuf,
}

impl Manifest {
    /// The manifest's file name in an export directory.
    pub const FILE: &'static str = "manifest.json";
    /// What `kiln compile` writes next to the module.
    pub const VMFB: &'static str = "model.vmfb";

    /// Reads `dir`'s manifest; [`ExportError::Manifest`] if it is missing or malformed.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(Self::FILE);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ExportError::Manifest { path: path.clone(), message: e.to_string() })?;
        serde_json::from_str(&text).map_err(|e| ExportError::Manifest { path, message: e.to_string() })
    }

    /// Writes `dir`'s manifest atomically; returns its path.
    fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(Self::FILE);
        let json = serde_json::to_string_pretty(self).expect("a manifest always serializes") + "\n";
        crate::write_atomically(&path, json.as_bytes())
            .map_err(|error| ExportError::Io { path: path.clone(), error })?;
        Ok(path)
    }

    /// Parameter bindings with files resolved against `dir`.
    pub fn parameter_paths(&self, dir: &Path) -> Vec<(String, PathBuf)> {
        self.parameters.iter().map(|p| (p.scope.clone(), dir.join(&p.file))).collect()
    }
}

/// What an export did, for the summary line.
#[derive(Clone, Debug)]
pub struct ExportSummary {
    /// The manifest as written.
    pub manifest: Manifest,
    /// Graph ops over every function (params and inputs excluded).
    pub ops: usize,
    /// Distinct params over every function.
    pub params: usize,
    /// Elements over every param.
    pub param_elements: u64,
    /// Bytes of the two KV caches at capacity.
    pub cache_bytes: u64,
    /// Bytes of the packed weights that the module tiles by rows at load
    /// for decode's products (`tile_rows`), held next to the checkpoint's.
    pub tiled_bytes: u64,
    /// Params written into the archive or the module, and their bytes.
    pub params_written: usize,
    /// Every file's bytes: module, archive and manifest.
    pub bytes_written: u64,
    /// Temporary files that killed kiln processes had left in the
    /// directory, removed before writing: how many, and their bytes.
    pub stale_temps: (usize, u64),
    /// The archive's bytes and the seconds its writing took (with fsync).
    pub archive: Option<(u64, f64)>,
    /// Where params come from and what became of quantized ones, and why
    /// not `reference` where that was asked for but IREE cannot read the
    /// checkpoint.
    pub params_description: String,
    /// Wall time of the whole export.
    pub seconds: f64,
    /// Peak resident memory of the process in bytes (VmHWM), if the OS says.
    pub peak_rss: Option<u64>,
}

/// Scope of params in the export's `params.irpa`.
pub const ARCHIVE_SCOPE: &str = "archive";
const ARCHIVE_FILE: &str = "params.irpa";

/// Exports `model` into `dir` (created if needed).
pub fn export(model: &Path, dir: &Path, options: &ExportOptions, progress: &mut dyn Progress) -> Result<ExportSummary> {
    let start = Instant::now();
    let source = Source::open(model)?;
    let program = match source.encoder(options.embed.choice)? {
        Some(config) => Program::Encoder(config),
        None => Program::Decoder(Box::new(source.family()?)),
    };
    let weights = source.weights(options.packed, options.cast())?;

    progress.stage("tracing");
    let (traced, max_context, cache_bytes, stepped_prefill) = match &program {
        Program::Decoder(family) => {
            let bytes = |(keys, values): (TensorType, TensorType)| {
                [keys, values].iter().map(|ty| (ty.num_elements() * ty.dtype.size_in_bytes()) as u64).sum::<u64>()
            };
            let max_context = match options.max_context {
                Some(n) => n,
                None => {
                    let one = crate::models::cache_types(family, &*weights, CacheSpec::new(1, options.kv_dtype)?)?;
                    default_max_context(source.context_length(), bytes(one))
                }
            };
            let cache = CacheSpec::new(max_context, options.kv_dtype)?;
            let cache_bytes = bytes(crate::models::cache_types(family, &*weights, cache)?);
            let stepped =
                options.stepped_prefill.unwrap_or_else(|| crate::models::default_stepped_prefill(family, max_context));
            let serving = Serving::stepped(family, &*weights, cache, stepped)?;
            let stepped = serving.stepped_prefill;
            (Traced::Serving(Box::new(serving)), max_context, cache_bytes, Some(stepped))
        }
        // No cache: the capacity is the longest sentence.
        Program::Encoder(config) => (Traced::embed(config, &*weights, options)?, config.max_length, 0, None),
    };
    let graphs = traced.graphs();
    let names: BTreeSet<&str> = graphs.iter().flat_map(|g| g.params().map(|(_, name, _)| name)).collect();
    // What the summary says about the graphs, taken now: the graphs are
    // dropped once lowered, before the module is written.
    let ops = graphs.iter().flat_map(|g| g.nodes()).filter(|n| !matches!(n.op, Op::Param { .. } | Op::Input)).count();
    let param_elements = graphs
        .iter()
        .flat_map(|g| g.params())
        .map(|(_, name, ty)| (name, ty.num_elements() as u64))
        .collect::<std::collections::BTreeMap<_, _>>()
        .values()
        .sum();
    let tiled_bytes = graphs
        .iter()
        .flat_map(|g| g.tiled_param_bytes())
        .map(|((name, op, ty), bytes)| ((name, format!("{op:?} {ty}")), bytes))
        .collect::<std::collections::BTreeMap<_, _>>()
        .values()
        .sum();
    let stored = names.iter().map(|name| weights.stored(name)).collect::<std::result::Result<_, _>>()?;
    let plan = Plan::new(options, stored, source.unreadable_by_iree())?;

    progress.stage("lowering");
    let session = Session::new();
    let lowering = LowerOptions::default();
    let module = match &traced {
        Traced::Serving(serving) => session.lower_serving(&serving.greedy_loop(), &lowering, &plan.inits())?,
        Traced::Embed(graphs) => {
            session.lower_rows(&RowLoop { name: "embed", graphs: graphs.iter().collect() }, &lowering, &plan.inits())?
        }
    };
    drop(traced);

    let mut written = Output::create(dir)?;
    let tensor_files = source.tensor_files().into_iter().map(absolute).collect::<Result<_>>()?;
    let parameters = plan.parameters(&lowering.param_scope, tensor_files);
    let archived = plan.archived();
    let mut archive_figures = None;
    if !archived.is_empty() {
        progress.stage("writing params");
        let total = archived.iter().map(archive::derived_len).sum::<std::result::Result<u64, _>>()?;
        progress.start_bytes(total);
        let path = dir.join(ARCHIVE_FILE);
        let start = Instant::now();
        let summary = archive::write_derived_with(&path, &archived, &mut |read, written| {
            source.release(read);
            progress.advance(written);
        })?;
        archive_figures = Some((summary.bytes_written, start.elapsed().as_secs_f64()));
        written.add(path)?;
    }

    progress.stage("writing module");
    let module_path = dir.join(plan.module_file());
    // Inline blobs alias the mapped checkpoint: drop its pages as they go out.
    lower::write_module_to_path_with(&module, plan.emit, &module_path, &mut |chunk| source.release(chunk))?;
    written.add(module_path)?;

    let manifest = Manifest {
        kiln_version: env!("CARGO_PKG_VERSION").into(),
        source: absolute(source.path())?,
        format: source.format().into(),
        architecture: program.name().into(),
        module: plan.module_file().into(),
        params: plan.mode,
        packed: plan.packed.to_string(),
        max_context,
        kv_dtype: match &program {
            Program::Decoder(_) => Some(options.kv_dtype.as_str().into()),
            Program::Encoder(_) => None,
        },
        stepped_prefill,
        parameters,
        elided_resources: plan.elided_resources(),
        compile_flags: plan.compile_flags.clone(),
        functions: lower::signatures(&module),
        compiled_for: None,
        embedding: match &program {
            Program::Decoder(_) => None,
            Program::Encoder(c) => Some(Embedding {
                chunk: options.embed.chunk,
                dim: c.hidden,
                pooling: c.pooling,
                normalize: c.normalize,
                max_length: c.max_length,
            }),
        },
    };
    written.add(manifest.write(dir)?)?;
    let (bytes_written, stale_temps) = written.keep();

    Ok(ExportSummary {
        manifest,
        ops,
        params: plan.params.len(),
        param_elements,
        cache_bytes,
        tiled_bytes,
        params_written: plan.written(),
        bytes_written,
        stale_temps,
        archive: archive_figures,
        params_description: plan.description(),
        seconds: start.elapsed().as_secs_f64(),
        peak_rss: crate::peak_rss(),
    })
}

/// What a checkpoint is exported as.
enum Program {
    /// A decoder's serving functions.
    Decoder(Box<Family>),
    /// An encoder's `embed`.
    Encoder(bert::Config),
}

impl Program {
    fn name(&self) -> &str {
        match self {
            Program::Decoder(family) => family.name(),
            Program::Encoder(_) => "bert",
        }
    }
}

/// The traced graphs of a [`Program`].
enum Traced {
    Serving(Box<Serving>),
    /// `embed`'s row graphs, a chunk's first ([`RowLoop`]).
    Embed(Vec<crate::graph::Graph>),
}

impl Traced {
    /// The encoder's `embed` graphs, a chunk's and one sentence's, every
    /// tensor of the model used ([`Checkpoint::unused`]).
    fn embed(config: &bert::Config, weights: &dyn Checkpoint, options: &ExportOptions) -> Result<Traced> {
        let chunk = options.embed.chunk;
        if chunk == 0 {
            return Err(ExportError::Source {
                path: weights.path().to_path_buf(),
                message: "a chunk of 0 sentences; export with `--chunk N`, N >= 1".into(),
            });
        }
        let rows = if chunk == 1 { vec![1] } else { vec![chunk, 1] };
        let graphs =
            rows.into_iter().map(|r| bert::embed(config, weights, r)).collect::<std::result::Result<Vec<_>, _>>()?;
        let used: BTreeSet<&str> = graphs[0].params().map(|(_, name, _)| name).collect();
        if let Some(name) = weights.unused(&used, &[]) {
            return Err(ModelError::UnusedTensor { name, family: "bert".into() }.into());
        }
        Ok(Traced::Embed(graphs))
    }

    fn graphs(&self) -> Vec<&crate::graph::Graph> {
        match self {
            Traced::Serving(serving) => serving.greedy_loop().graphs().to_vec(),
            Traced::Embed(graphs) => graphs.iter().collect(),
        }
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|error| ExportError::Io { path: path.to_path_buf(), error })
}

/// The directory an export writes into and what it wrote there. Dropped
/// before [`Output::keep`] (an error or a panic on the way), it removes the
/// files and every directory level it created, so a failed export leaves
/// nothing behind.
struct Output {
    /// The levels of the directory that did not exist, deepest first.
    created: Vec<PathBuf>,
    files: Vec<PathBuf>,
    bytes: u64,
    /// Temporary files of killed kiln processes removed from the directory.
    stale: (usize, u64),
    kept: bool,
}

impl Output {
    fn create(dir: &Path) -> Result<Output> {
        let created = dir.ancestors().take_while(|d| !d.as_os_str().is_empty() && !d.exists()).map(PathBuf::from);
        let mut output = Output { created: created.collect(), files: vec![], bytes: 0, stale: (0, 0), kept: false };
        let io = |error| ExportError::Io { path: dir.to_path_buf(), error };
        std::fs::create_dir_all(dir).map_err(io)?;
        let (removed, bytes) = crate::atomic::remove_stale_temps(dir).map_err(io)?;
        output.stale = (removed.len(), bytes);
        Ok(output)
    }

    fn add(&mut self, path: PathBuf) -> Result<()> {
        let len = std::fs::metadata(&path).map_err(|error| ExportError::Io { path: path.clone(), error })?.len();
        self.files.push(path);
        self.bytes += len;
        Ok(())
    }

    fn keep(mut self) -> (u64, (usize, u64)) {
        self.kept = true;
        (self.bytes, self.stale)
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
        // remove_dir, not remove_dir_all: a level that holds anything else stays.
        for dir in &self.created {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// What [`compile`] wrote, and what iree-compile took.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The compiled module: `model.vmfb` in the export's directory.
    pub vmfb: PathBuf,
    /// iree-compile's wall time and peak memory.
    pub iree_compile: ToolStats,
}

/// Compiles an export's module for `target` into `model.vmfb` next to it,
/// and records the target in the manifest (`compiled_for`).
pub fn compile(dir: &Path, iree: &Iree, target: &Target) -> Result<Compiled> {
    let mut manifest = Manifest::read(dir)?;
    // A killed `kiln compile` leaves its named temporary `model.vmfb`.
    crate::atomic::remove_stale_temps(dir).map_err(|error| ExportError::Io { path: dir.to_path_buf(), error })?;
    if manifest.elided_resources {
        return Err(ExportError::NotReady {
            path: dir.join(&manifest.module),
            message: "its inline weights are elided for reading; export with `--emit mlirbc` (the default for \
                      inline params) or `--emit mlir --full-resources` to compile"
                .into(),
        });
    }
    let vmfb = dir.join(Manifest::VMFB);
    let iree_compile = iree.compile_for(target, &dir.join(&manifest.module), &vmfb, &manifest.compile_flags)?;
    manifest.compiled_for = Some(target.to_string());
    manifest.write(dir)?;
    Ok(Compiled { vmfb, iree_compile })
}

/// What [`generate`] produced.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The prompt's token ids, as the checkpoint's tokenizer encoded it.
    pub prompt_tokens: Vec<u32>,
    /// The new tokens, up to and including an end-of-generation token.
    pub tokens: Vec<u32>,
    /// `tokens` decoded.
    pub text: String,
    /// Wall time of the `iree-run-module` call (module load, prefill, decode).
    pub seconds: f64,
}

/// Runs a compiled export's `generate` on `prompt` (tokenized with the
/// checkpoint's own tokenizer) for up to `max_new_tokens` tokens.
pub fn generate(dir: &Path, prompt: &str, max_new_tokens: usize, iree: &Iree) -> Result<Generation> {
    let manifest = Manifest::read(dir)?;
    if manifest.embedding.is_some() {
        return Err(ExportError::NotReady {
            path: dir.to_path_buf(),
            message: "an encoder export has `embed`, no `generate`: run `kiln embed DIR --text ...`".into(),
        });
    }
    let vmfb = dir.join(Manifest::VMFB);
    if !vmfb.is_file() {
        return Err(ExportError::NotReady {
            path: vmfb,
            message: "the module is not compiled; run `kiln compile DIR`".into(),
        });
    }
    let tokenizer = Source::open(&manifest.source)?.tokenizer()?;
    let prompt_tokens = tokenizer.encode(prompt, tokenizer.add_bos_token());
    if prompt_tokens.is_empty() || prompt_tokens.len() > manifest.max_context {
        return Err(ExportError::Source {
            path: manifest.source.clone(),
            message: format!(
                "the prompt is {} tokens; the export holds 1 to {} (`kiln export --max-context`)",
                prompt_tokens.len(),
                manifest.max_context
            ),
        });
    }
    let work = tempfile::tempdir().map_err(|error| ExportError::Io { path: std::env::temp_dir(), error })?;
    let (tokens_npy, n_npy, out_npy) =
        (work.path().join("prompt.npy"), work.path().join("n.npy"), work.path().join("out.npy"));
    npy::write(&tokens_npy, &token_ids(&prompt_tokens))?;
    npy::write(&n_npy, &scalar_i32(max_new_tokens as i32))?;
    let parameters = manifest.parameter_paths(dir);
    let bindings: Vec<(&str, &Path)> = parameters.iter().map(|(s, p)| (s.as_str(), p.as_path())).collect();
    let start = Instant::now();
    let target: Target = manifest.compiled_for.as_deref().unwrap_or("host").parse().map_err(|e: TargetError| {
        ExportError::Manifest { path: dir.join(Manifest::FILE), message: format!("compiled_for: {e}") }
    })?;
    iree.run_on(target.device(), &vmfb, "generate", &[tokens_npy, n_npy], &bindings, std::slice::from_ref(&out_npy))?;
    let seconds = start.elapsed().as_secs_f64();
    let out = npy::read(&out_npy)?.to_f64_vec();
    let mut tokens = Vec::new();
    for &t in out.iter().take(max_new_tokens).take_while(|&&t| t >= 0.0) {
        tokens.push(t as u32);
        if tokenizer.is_eog(t as u32) {
            break;
        }
    }
    let text = tokenizer.decode(&tokens);
    Ok(Generation { prompt_tokens, tokens, text, seconds })
}

/// What [`embed`] produced.
#[derive(Clone, Debug)]
pub struct Embeddings {
    /// Each sentence's ids, `[CLS]` and `[SEP]` included.
    pub tokens: Vec<Vec<u32>>,
    /// Each sentence's vector.
    pub vectors: Vec<Vec<f32>>,
    /// Wall time of the `iree-run-module` call (the module's load included).
    pub seconds: f64,
}

impl Embeddings {
    /// `cos(vᵢ, vⱼ)` for every pair of sentences.
    pub fn cosine_similarities(&self) -> Vec<Vec<f32>> {
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let v = &self.vectors;
        v.iter().map(|a| v.iter().map(|b| dot(a, b) / (norm(a) * norm(b))).collect()).collect()
    }
}

/// Embeds `texts` with a compiled encoder export's `embed`: each sentence
/// tokenized by the checkpoint's WordPiece (truncated to the export's
/// `max_length`), then [`embed_ids`].
pub fn embed(dir: &Path, texts: &[&str], iree: &Iree) -> Result<Embeddings> {
    let (manifest, embedding) = encoder_manifest(dir)?;
    let tokenizer = Source::open(&manifest.source)?.wordpiece()?;
    let ids: Vec<Vec<u32>> = texts.iter().map(|t| tokenizer.encode(t, embedding.max_length)).collect();
    embed_ids(dir, &ids, tokenizer.pad(), iree)
}

/// Runs a compiled encoder export's `embed` on sentences given as ids, in
/// one call, right-padded with `pad` to the longest.
pub fn embed_ids(dir: &Path, ids: &[Vec<u32>], pad: u32, iree: &Iree) -> Result<Embeddings> {
    let (manifest, embedding) = encoder_manifest(dir)?;
    let vmfb = dir.join(Manifest::VMFB);
    if !vmfb.is_file() {
        return Err(ExportError::NotReady {
            path: vmfb,
            message: "the module is not compiled; run `kiln compile DIR`".into(),
        });
    }
    if let Some(long) = ids.iter().find(|s| s.is_empty() || s.len() > embedding.max_length) {
        return Err(ExportError::Source {
            path: manifest.source.clone(),
            message: format!("a sentence of {} tokens; the export takes 1 to {}", long.len(), embedding.max_length),
        });
    }
    let work = tempfile::tempdir().map_err(|error| ExportError::Io { path: std::env::temp_dir(), error })?;
    let npy_path = |name: &str| work.path().join(name);
    let parameters = manifest.parameter_paths(dir);
    let bindings: Vec<(&str, &Path)> = parameters.iter().map(|(s, p)| (s.as_str(), p.as_path())).collect();
    let start = Instant::now();
    if ids.is_empty() {
        return Ok(Embeddings { tokens: vec![], vectors: vec![], seconds: 0.0 });
    }
    let (rows, len) = (ids.len(), ids.iter().map(Vec::len).max().unwrap_or(1));
    let ty = crate::graph::TensorType::new([rows, len], crate::graph::DType::I32);
    let (mut tokens, mut mask) = (vec![pad as i32; rows * len], vec![0; rows * len]);
    for (row, sentence) in ids.iter().enumerate() {
        for (i, &id) in sentence.iter().enumerate() {
            (tokens[row * len + i], mask[row * len + i]) = (id as i32, 1);
        }
    }
    let value =
        |data| crate::interp::Value::new(ty.clone(), crate::interp::Buffer::I32(data)).expect("one i32 per position");
    npy::write(&npy_path("ids.npy"), &value(tokens))?;
    npy::write(&npy_path("mask.npy"), &value(mask))?;
    let out = npy_path("out.npy");
    iree.run(&vmfb, "embed", &[npy_path("ids.npy"), npy_path("mask.npy")], &bindings, std::slice::from_ref(&out))?;
    let vectors =
        npy::read(&out)?.to_f64_vec().chunks(embedding.dim).map(|v| v.iter().map(|&x| x as f32).collect()).collect();
    Ok(Embeddings { tokens: ids.to_vec(), vectors, seconds: start.elapsed().as_secs_f64() })
}

/// `dir`'s manifest, which must be an encoder's.
fn encoder_manifest(dir: &Path) -> Result<(Manifest, Embedding)> {
    let manifest = Manifest::read(dir)?;
    let embedding = manifest.embedding.clone().ok_or_else(|| ExportError::Manifest {
        path: dir.join(Manifest::FILE),
        message: format!(
            "a {} export has no `embed`; `kiln embed` takes an encoder (BERT) export",
            manifest.architecture
        ),
    })?;
    Ok((manifest, embedding))
}

#[cfg(test)]
mod bert_tests;
#[cfg(test)]
mod target_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod transformers_tests;
