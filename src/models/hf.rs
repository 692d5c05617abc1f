//! Hugging Face checkpoints: a directory with `config.json` and the weights
//! in `model.safetensors`, or in shards listed by
//! `model.safetensors.index.json` ([`HfCheckpoint`]).
//!
//! The front-ends ask for tensors by llama.cpp's GGUF names;
//! [`SafetensorsWeights`] maps them to HF's through the family's tables
//! ([`HfNames`], which each family's file defines and its
//! [`super::registry`] row names, with where a multimodal wrapper keeps its
//! text model) and declares each param
//! under its HF name, so `#flow.parameter.named<"model"::"model.layers.0.self_attn.q_proj.weight">`
//! reads the safetensors file itself. Unlike GGUF, HF keeps Q/K rows in the
//! `rotate_half` order, which [`crate::models::llama::Config::from_hf`]
//! answers with [`crate::trace::nn::RopeStyle::NeoX`]; the weights are used
//! as stored. The exception is a mixture of experts' `[E, rows, cols]`
//! stacks, which HF keeps one tensor per expert (or gate and up in one
//! fused tensor): those are joined from the stored bytes ([`HfStack`],
//! [`Source::Joined`]) into an archive param at export.

use super::checkpoint::{float_cast, param_value};
use super::{registry, Checkpoint, ModelError, PackedPolicy, Result, Weight};
use crate::graph::{DType, TensorType};
use crate::interp::{InterpError, ParamSource, Value};
use crate::trace::Tracer;
use crate::weights::archive::{Assembled, DerivedParam, Encoding, Source};
use crate::weights::ggml::GgmlType;
use crate::weights::hf_config::HfConfig;
use crate::weights::safetensors::{SafeTensors, ShardedSafeTensors, StDType, TensorView};
use crate::weights::WeightsError;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A decoder's whole-model tensors, as llama names them and the other
/// families keep them: GGUF name, HF name.
const LLAMA_NAMES: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The HF name of the llama-family tensor that GGUF calls `gguf`, if the
/// tables have one.
pub fn llama_hf_name(gguf: &str) -> Option<String> {
    super::llama::HF_NAMES.hf_name(gguf)
}

/// Where a family's tensors are in an HF checkpoint: its name tables, and
/// the prefixes of the decoder and of the head (`model.` and `lm_head.weight`,
/// or under `language_model.` in a multimodal wrapper).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HfNames {
    /// The family, for messages.
    pub family: &'static str,
    /// Whole-model tensors besides llama's, under the body: GGUF name, HF name.
    pub names: &'static [(&'static str, &'static str)],
    /// Per-block tensors: `blk.{i}.` + GGUF suffix is the body, `layers`,
    /// `{i}.` + HF suffix.
    pub block_names: &'static [&'static [(&'static str, &'static str)]],
    /// Before `embed_tokens.weight`, `norm.weight` and `layers.{i}.`.
    pub body: &'static str,
    /// The output head.
    pub head: &'static str,
    /// Before block `i`'s names, after the body: `layers.` (BERT: `encoder.layer.`).
    pub layers: &'static str,
    /// Prefixes (after the body) of stored tensors the model does not
    /// compute with: BERT's pooler and its position-id buffer.
    pub ignored: &'static [&'static str],
    /// Per-block stacks of experts' matrices, which HF keeps apart.
    pub stacks: &'static [HfStack],
}

/// A GGUF stack of experts' matrices (`blk.{i}.ffn_gate_exps.weight`, `[E,
/// rows, cols]`) and the ways an HF checkpoint keeps it: one tensor per
/// expert, as checkpoints on disk and transformers' `save_pretrained` do,
/// or fused ([`Fused`]). Every form but a whole fused tensor as the stack
/// is made into an archive param at export ([`Source::Joined`],
/// [`Source::Assembled`]): no file holds the stack.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HfStack {
    /// The GGUF suffix after `blk.{i}.`.
    pub gguf: &'static str,
    /// The suffix after the block's prefix of expert `e`'s tensor, `{e}`
    /// standing for `e`: `mlp.experts.{e}.gate_proj.weight`; `None` where
    /// the family's experts are only ever fused.
    pub per_expert: Option<&'static str>,
    /// The fused form.
    pub fused: Fused,
}

/// A fused tensor `[E, parts · rows, cols]` of which the stack is one of
/// `parts` equal blocks of rows (transformers 5's `gate_up_proj`: gate and
/// up); or, `transposed`, `[E, cols, parts · rows]`, the stack's transpose
/// with the parts interleaved in its last dim (gpt-oss's `gate_up_proj`,
/// gate the even columns), a 2-D one `[E, parts · rows]` being a stack of
/// bias rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fused {
    /// The fused tensor's suffix after the block's prefix.
    pub name: &'static str,
    /// Which part the stack is, of how many.
    pub part: usize,
    /// How many parts the tensor holds.
    pub parts: usize,
    /// Stored transposed, the parts interleaved.
    pub transposed: bool,
}

impl Fused {
    /// Part `part` of `parts` of the tensor `name`, blocks of rows.
    pub const fn rows(name: &'static str, part: usize, parts: usize) -> Fused {
        Fused { name, part, parts, transposed: false }
    }

    /// Whether the stack is the stored tensor itself.
    fn whole(&self) -> bool {
        self.parts == 1 && !self.transposed
    }
}

impl HfNames {
    /// A decoder's prefixes (`model.`, `lm_head.weight`, `layers.`), with
    /// no tables of its own: what a family's names start from.
    pub const DECODER: HfNames = HfNames {
        family: "",
        names: &[],
        block_names: &[],
        body: "model.",
        head: "lm_head.weight",
        layers: "layers.",
        ignored: &[],
        stacks: &[],
    };

    /// Where `config`'s family ([`registry::by_model_type`]) keeps its
    /// tensors in `has`'s checkpoint. A `model_type` no family reads is
    /// refused when the family is read ([`registry::by_hf`]); until then
    /// it has a decoder's prefixes.
    fn of(config: &HfConfig, has: impl Fn(&str) -> bool) -> HfNames {
        match registry::by_model_type(&config.model_type) {
            Some((row, _)) => (row.hf_names)(config, &has),
            None => HfNames::DECODER,
        }
    }

    /// The HF name of the tensor GGUF calls `gguf`, if the table has one.
    pub fn hf_name(&self, gguf: &str) -> Option<String> {
        if gguf == "output.weight" {
            return Some(self.head.to_string());
        }
        if let Some((_, hf)) = self.names.iter().find(|(g, _)| *g == gguf) {
            return Some(format!("{}{hf}", self.body));
        }
        if let Some((_, hf)) = LLAMA_NAMES.iter().find(|(g, _)| *g == gguf) {
            return Some(format!("{}{}", self.body, hf.strip_prefix("model.").expect("the body's names start so")));
        }
        let (block, suffix) = gguf.strip_prefix("blk.")?.split_once('.')?;
        if block.is_empty() || !block.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let hf = match self.block_names.iter().flat_map(|t| t.iter()).find(|(g, _)| *g == suffix) {
            Some((_, hf)) => hf,
            // A whole fused stack is a stored tensor like any other.
            None => self.stacks.iter().find(|s| s.gguf == suffix && s.fused.whole()).map(|s| s.fused.name)?,
        };
        Some(format!("{}{}{block}.{hf}", self.body, self.layers))
    }

    /// Block `i` and the rest of `hf`, a name under a block's prefix.
    fn in_block<'n>(&self, hf: &'n str) -> Option<(usize, &'n str)> {
        let rest = hf.strip_prefix(self.body)?.strip_prefix(self.layers)?;
        let (block, rest) = rest.split_once('.')?;
        Some((block.parse().ok()?, rest))
    }
}

/// A stack of experts' matrices that no file holds as one tensor, and the
/// stored bytes it is made of.
#[derive(Debug)]
struct Joined<'c> {
    /// The param's name: the per-expert name with `*` for the expert, or
    /// the fused tensor's with the block of rows (`…gate_up_proj[0 of 2]`),
    /// or its interleaved part (`…gate_up_proj[0 of 2, transposed]`).
    name: String,
    /// `[E, rows, cols]`.
    shape: Vec<usize>,
    dtype: StDType,
    bytes: StackBytes<'c>,
    /// The stored tensors it reads.
    members: Vec<&'c str>,
}

/// Where a [`Joined`] stack's bytes are.
#[derive(Debug)]
enum StackBytes<'c> {
    /// Runs of stored bytes, end to end.
    Runs(Vec<&'c [u8]>),
    /// A transposed fused tensor's part.
    Transposed(Transposed<'c>),
    /// HF's MXFP4 blocks of a fused tensor's part, as ggml's.
    Mxfp4(Mxfp4Part<'c>),
}

/// Part `part` of a fused `[E, a, b · parts]` tensor (`data`, elements of
/// `elem` bytes), its parts interleaved in the last dim, transposed:
/// `out[e][j][i] = in[e][i][j · parts + part]`, `[E, b, a]`.
#[derive(Debug)]
struct Transposed<'c> {
    data: &'c [u8],
    elem: usize,
    experts: usize,
    a: usize,
    b: usize,
    parts: usize,
    part: usize,
}

impl Assembled for Transposed<'_> {
    fn byte_len(&self) -> usize {
        self.experts * self.a * self.b * self.elem
    }

    fn read_into(&self, start: usize, len: usize, out: &mut Vec<u8>) {
        let (a, b, elem) = (self.a, self.b, self.elem);
        for n in start / elem..(start + len) / elem {
            let (e, j, i) = (n / (a * b), n / a % b, n % a);
            let at = ((e * a + i) * b * self.parts + j * self.parts + self.part) * elem;
            out.extend_from_slice(&self.data[at..at + elem]);
        }
    }

    fn stored(&self) -> &[u8] {
        self.data
    }
}

/// Rows `r · parts + part` of HF's MXFP4 `blocks [E, R, K/32, 16]` and
/// `scales [E, R, K/32]` as ggml's MXFP4 rows of `[E, R/parts, K]`: the same
/// numbers in ggml's block (transformers' `integrations/mxfp4.py`, llama.cpp's
/// `GptOssModel.transform_nibble_layout`). HF's FP4 value is the level times
/// `2^(e − 127)`, ggml's the doubled level times `2^(e − 128)`: the scale
/// byte is the same; HF packs elements `2i` and `2i + 1` into byte `i`, ggml
/// elements `i` and `i + 16`.
#[derive(Debug)]
struct Mxfp4Part<'c> {
    blocks: &'c [u8],
    scales: &'c [u8],
    /// `R`, and the 32-element blocks of a row, `K/32`.
    rows: usize,
    row_blocks: usize,
    parts: usize,
    part: usize,
}

impl Mxfp4Part<'_> {
    /// ggml's block `n` (row-major over `[E, R/parts, K/32]`).
    fn block(&self, n: usize) -> [u8; MXFP4_BLOCK] {
        let (out_rows, b) = (self.rows / self.parts, n % self.row_blocks);
        let (e, r) = (n / self.row_blocks / out_rows, n / self.row_blocks % out_rows);
        let at = (e * self.rows + r * self.parts + self.part) * self.row_blocks + b;
        let hf = &self.blocks[at * 16..][..16];
        let nibble = |i: usize| (hf[i / 2] >> (4 * (i % 2))) & 0x0F;
        let mut out = [0; MXFP4_BLOCK];
        out[0] = self.scales[at];
        for j in 0..16 {
            out[1 + j] = nibble(j) | nibble(j + 16) << 4;
        }
        out
    }
}

/// Bytes of a ggml MXFP4 block: the scale byte and 16 bytes of nibbles.
const MXFP4_BLOCK: usize = 17;

impl Assembled for Mxfp4Part<'_> {
    fn byte_len(&self) -> usize {
        self.scales.len() / self.parts * MXFP4_BLOCK
    }

    fn read_into(&self, start: usize, len: usize, out: &mut Vec<u8>) {
        let end = start + len;
        for n in start / MXFP4_BLOCK..end.div_ceil(MXFP4_BLOCK) {
            let (from, to) = (n * MXFP4_BLOCK, (n + 1) * MXFP4_BLOCK);
            out.extend_from_slice(&self.block(n)[start.max(from) - from..end.min(to) - from]);
        }
    }

    fn stored(&self) -> &[u8] {
        self.blocks
    }
}

/// Part `part` of `parts` (interleaved rows) of an MXFP4 stack kept as
/// HF's `blocks` and `scales`: `[E, R/parts, K]` of ggml MXFP4.
fn mxfp4_part<'c>(blocks: TensorView<'c>, scales: TensorView<'c>, part: usize, parts: usize) -> Result<Joined<'c>> {
    let fits = matches!(blocks.shape[..], [e, r, b, 16] if e > 0 && r % parts == 0 && scales.shape == [e, r, b])
        && blocks.dtype == StDType::U8
        && scales.dtype == StDType::U8;
    if !fits {
        return Err(ModelError::Config(format!(
            "{} {:?} {:?} and {} {:?} {:?}: MXFP4 experts are u8 blocks [experts, rows, blocks, 16] and u8 scales \
             [experts, rows, blocks], rows that split into {parts} interleaved parts",
            blocks.name, blocks.dtype, blocks.shape, scales.name, scales.dtype, scales.shape
        )));
    }
    let (e, rows, row_blocks) = (blocks.shape[0], blocks.shape[1], blocks.shape[2]);
    let name = blocks.name.strip_suffix("_blocks").expect("matched");
    Ok(Joined {
        name: format!("{name}[{part} of {parts}, mxfp4]"),
        shape: vec![e, rows / parts, row_blocks * 32],
        dtype: StDType::U8,
        bytes: StackBytes::Mxfp4(Mxfp4Part { blocks: blocks.data, scales: scales.data, rows, row_blocks, parts, part }),
        members: vec![blocks.name, scales.name],
    })
}

/// The stacks of `checkpoint` that [`HfNames::stacks`] says must be
/// joined, by GGUF name. Experts are numbered from 0 with none missing,
/// each of one shape and dtype.
fn joined_stacks(checkpoint: &HfCheckpoint) -> Result<BTreeMap<String, Joined<'_>>> {
    let names = &checkpoint.names;
    // (block, stack) -> each expert's tensor, by expert.
    let mut per_expert: BTreeMap<(usize, usize), BTreeMap<usize, TensorView<'_>>> = BTreeMap::new();
    let mut joined = BTreeMap::new();
    for tensor in checkpoint.shards().iter().flat_map(|file| file.tensors()) {
        let Some((block, rest)) = names.in_block(tensor.name) else { continue };
        for (k, stack) in names.stacks.iter().enumerate() {
            if let Some(per) = stack.per_expert {
                let (before, after) = per.split_once("{e}").expect("a per-expert name has {e}");
                let expert = rest.strip_prefix(before).and_then(|r| r.strip_suffix(after)).and_then(|e| e.parse().ok());
                if let Some(e) = expert {
                    per_expert.entry((block, k)).or_default().insert(e, tensor);
                }
            }
            let Fused { name: fused, part, parts, transposed } = stack.fused;
            // HF's MXFP4 form of a transposed stack: `{name}_blocks`, `_scales`.
            if transposed && rest.strip_prefix(fused) == Some("_blocks") {
                let scales = format!("{}_scales", tensor.name.strip_suffix("_blocks").expect("matched"));
                let scales = checkpoint.get(&scales).ok_or_else(|| ModelError::MissingTensor(scales.clone()))?;
                joined.insert(format!("blk.{block}.{}", stack.gguf), mxfp4_part(tensor, scales, part, parts)?);
                continue;
            }
            if rest != fused || stack.fused.whole() {
                continue;
            }
            if transposed {
                joined.insert(format!("blk.{block}.{}", stack.gguf), transposed_part(tensor, part, parts)?);
                continue;
            }
            let [e, rows, cols] = tensor.shape[..] else {
                return Err(ModelError::Config(format!(
                    "{}: a fused stack of experts needs [experts, rows, cols], found {:?}",
                    tensor.name, tensor.shape
                )));
            };
            if e == 0 || !rows.is_multiple_of(parts) {
                return Err(ModelError::Config(format!(
                    "{}: shape {:?}: a fused stack needs experts, and rows that split into {parts} equal blocks",
                    tensor.name, tensor.shape
                )));
            }
            let run = tensor.data.len() / (e * parts);
            joined.insert(
                format!("blk.{block}.{}", stack.gguf),
                Joined {
                    name: format!("{}[{part} of {parts}]", tensor.name),
                    shape: vec![e, rows / parts, cols],
                    dtype: tensor.dtype,
                    bytes: StackBytes::Runs((0..e).map(|i| &tensor.data[(i * parts + part) * run..][..run]).collect()),
                    members: vec![tensor.name],
                },
            );
        }
    }
    for ((block, k), experts) in per_expert {
        let stack = &names.stacks[k];
        let per = stack.per_expert.expect("only stacks kept per expert are collected so");
        let hf = |e: &dyn std::fmt::Display| {
            format!("{}{}{block}.{}", names.body, names.layers, per.replace("{e}", &e.to_string()))
        };
        let first = experts.values().next().expect("an entry has an expert");
        for (i, (&e, t)) in experts.iter().enumerate() {
            if e != i {
                return Err(ModelError::MissingTensor(hf(&i)));
            }
            if t.shape != first.shape || t.dtype != first.dtype {
                return Err(ModelError::Config(format!(
                    "{}: {:?} {:?}, where expert 0 is {:?} {:?}: the experts of a stack share a shape and dtype",
                    t.name, t.dtype, t.shape, first.dtype, first.shape
                )));
            }
        }
        joined.insert(
            format!("blk.{block}.{}", stack.gguf),
            Joined {
                name: hf(&"*"),
                shape: [&[experts.len()][..], first.shape].concat(),
                dtype: first.dtype,
                bytes: StackBytes::Runs(experts.values().map(|t| t.data).collect()),
                members: experts.values().map(|t| t.name).collect(),
            },
        );
    }
    Ok(joined)
}

/// Part `part` of `parts` of `tensor`, a transposed fused stack `[E, a, b ·
/// parts]` (or of bias rows, `[E, b · parts]`): `[E, b, a]` (`[E, b]`).
fn transposed_part<'c>(tensor: TensorView<'c>, part: usize, parts: usize) -> Result<Joined<'c>> {
    let (e, a, cols) = match tensor.shape[..] {
        [e, a, cols] => (e, a, cols),
        [e, cols] => (e, 1, cols),
        _ => {
            return Err(ModelError::Config(format!(
                "{}: a transposed stack of experts needs [experts, rows, cols] or [experts, cols], found {:?}",
                tensor.name, tensor.shape
            )))
        }
    };
    if e == 0 || !cols.is_multiple_of(parts) {
        return Err(ModelError::Config(format!(
            "{}: shape {:?}: a fused stack needs experts, and columns that split into {parts} interleaved parts",
            tensor.name, tensor.shape
        )));
    }
    let b = cols / parts;
    let elem = tensor
        .dtype
        .size_in_bytes()
        .ok_or_else(|| ModelError::UnsupportedDType { name: tensor.name.to_string(), dtype: tensor.dtype })?;
    let shape = if tensor.shape.len() == 3 { vec![e, b, a] } else { vec![e, b] };
    Ok(Joined {
        name: format!("{}[{part} of {parts}, transposed]", tensor.name),
        shape,
        dtype: tensor.dtype,
        bytes: StackBytes::Transposed(Transposed { data: tensor.data, elem, experts: e, a, b, parts, part }),
        members: vec![tensor.name],
    })
}

/// The safetensors files of a checkpoint.
#[derive(Debug)]
enum Files {
    Single(SafeTensors),
    Sharded { index: PathBuf, shards: ShardedSafeTensors },
}

/// An HF checkpoint directory, opened: its `config.json` and its
/// memory-mapped safetensors. [`SafetensorsWeights`] borrows it.
#[derive(Debug)]
pub struct HfCheckpoint {
    /// The parsed `config.json`.
    pub config: HfConfig,
    /// Where the family's tensors are.
    pub names: HfNames,
    files: Files,
}

impl HfCheckpoint {
    /// Opens `dir/config.json` and `dir/model.safetensors`, or, when that is
    /// absent, `dir/model.safetensors.index.json` and its shards.
    pub fn open(dir: &Path) -> Result<HfCheckpoint> {
        let config = HfConfig::open(&dir.join("config.json"))?;
        let (single, index) = (dir.join("model.safetensors"), dir.join("model.safetensors.index.json"));
        let files = if single.exists() {
            Files::Single(SafeTensors::open(&single)?)
        } else if index.exists() {
            Files::Sharded { shards: ShardedSafeTensors::open(&index)?, index }
        } else {
            return Err(WeightsError::Format {
                path: dir.to_path_buf(),
                message: "holds neither model.safetensors nor model.safetensors.index.json".into(),
            }
            .into());
        };
        let has = |name: &str| match &files {
            Files::Single(file) => file.get(name).is_some(),
            Files::Sharded { shards, .. } => shards.get(name).is_some(),
        };
        let names = HfNames::of(&config, has);
        Ok(HfCheckpoint { config, names, files })
    }

    /// The tensor stored as `name` (an HF name).
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        match &self.files {
            Files::Single(file) => file.get(name),
            Files::Sharded { shards, .. } => shards.get(name),
        }
    }

    /// `model.safetensors`, or the index of a sharded checkpoint.
    pub fn path(&self) -> &Path {
        match &self.files {
            Files::Single(file) => file.path(),
            Files::Sharded { index, .. } => index,
        }
    }

    /// Every safetensors file: IREE reads params from each given with
    /// `--parameters=model=FILE`.
    pub fn files(&self) -> Vec<&Path> {
        self.shards().iter().map(|file| file.path()).collect()
    }

    /// Drops `bytes` (tensor data a streaming reader is done with) from
    /// resident memory, whichever file they are in.
    pub fn release(&self, bytes: &[u8]) {
        self.shards().iter().for_each(|file| file.release(bytes));
    }

    fn shards(&self) -> &[SafeTensors] {
        match &self.files {
            Files::Single(file) => std::slice::from_ref(file),
            Files::Sharded { shards, .. } => shards.shards(),
        }
    }
}

/// An [`HfCheckpoint`] as the llama family's front-end reads it: GGUF names
/// mapped to HF names, each dense f32/f16/bf16 tensor declared as its own
/// dtype (or [`SafetensorsWeights::with_cast`]'s), and the same values for
/// the interpreter ([`ParamSource`]).
pub struct SafetensorsWeights<'c> {
    /// The checkpoint read.
    pub checkpoint: &'c HfCheckpoint,
    /// Every tensor is declared as this dtype instead of its own (an
    /// archive of one dtype); `None` keeps them as stored, read in place.
    pub cast: Option<DType>,
    /// What packed (MXFP4) expert stacks become.
    pub packed: PackedPolicy,
    /// The stacks of experts joined from several tensors, by GGUF name.
    joined: BTreeMap<String, Joined<'c>>,
}

impl<'c> SafetensorsWeights<'c> {
    /// Checks that an untied checkpoint has its head: the front-end would
    /// otherwise fall back to the embedding, which only tied models mean.
    pub fn new(checkpoint: &'c HfCheckpoint) -> Result<Self> {
        let weights = SafetensorsWeights {
            checkpoint,
            cast: None,
            packed: PackedPolicy::Fail,
            joined: joined_stacks(checkpoint)?,
        };
        if !checkpoint.config.tie_word_embeddings() {
            weights.view("output.weight")?;
        }
        Ok(weights)
    }

    /// Declares every tensor as `cast` (f32, f16 or bf16), or as stored
    /// with `None`.
    pub fn with_cast(mut self, cast: Option<DType>) -> Result<Self> {
        self.cast = float_cast(cast)?;
        Ok(self)
    }

    /// Packed stacks (HF's MXFP4 experts) become what `packed` says, as a
    /// GGUF's packed tensors do.
    pub fn with_packed(mut self, packed: PackedPolicy) -> Self {
        self.packed = packed;
        self
    }

    /// A joined stack's param type and, kept packed, its blocks' type; and
    /// how its stored bytes are encoded.
    fn joined_type(&self, j: &Joined<'_>) -> Result<(TensorType, Option<GgmlType>, Encoding)> {
        let StackBytes::Mxfp4(blocks) = &j.bytes else {
            let dtype = j.dtype.to_graph_dtype().expect("joined stacks of floats only but MXFP4");
            return Ok((self.declared(&j.name, &j.shape, j.dtype)?, None, Encoding::Dense(dtype)));
        };
        let ty = GgmlType::MXFP4;
        match self.packed {
            PackedPolicy::Fail => Err(ModelError::Packed { name: j.name.clone(), ty }),
            PackedPolicy::Dequantize(dtype) => Ok((TensorType::new(&j.shape[..], dtype), None, Encoding::Ggml(ty))),
            PackedPolicy::Keep => {
                Ok((TensorType::new([blocks.byte_len()], DType::I8), Some(ty), Encoding::Dense(DType::I8)))
            }
        }
    }

    /// The param type of `tensor`: f32/f16/bf16 as themselves (or the
    /// cast). The one place that decides it, for [`Checkpoint::load`] and
    /// the interpreter alike.
    pub fn param_type(&self, tensor: &TensorView<'_>) -> Result<TensorType> {
        self.declared(tensor.name, tensor.shape, tensor.dtype)
    }

    /// The param type of the tensor `name` of `shape`, stored as `dtype`.
    fn declared(&self, name: &str, shape: &[usize], dtype: StDType) -> Result<TensorType> {
        match dtype {
            StDType::F32 | StDType::F16 | StDType::BF16 => {
                let stored = dtype.to_graph_dtype().expect("F32, F16 and BF16 are graph dtypes");
                Ok(TensorType::new(shape, self.cast.unwrap_or(stored)))
            }
            dtype => Err(ModelError::UnsupportedDType { name: name.to_string(), dtype }),
        }
    }

    /// The stored tensor for the GGUF name `gguf`.
    fn view(&self, gguf: &str) -> Result<TensorView<'c>> {
        let names = &self.checkpoint.names;
        let hf =
            names.hf_name(gguf).ok_or_else(|| ModelError::NoHfName { name: gguf.to_string(), family: names.family })?;
        self.checkpoint.get(&hf).ok_or_else(|| ModelError::MissingHfTensor { gguf: gguf.to_string(), hf })
    }
}

impl Checkpoint for SafetensorsWeights<'_> {
    fn load<'t>(&self, tracer: &'t Tracer, name: &str, expected: &[usize]) -> Result<Weight<'t>> {
        if let Some(j) = self.joined.get(name) {
            if j.shape != expected {
                return Err(ModelError::TensorShape {
                    name: j.name.clone(),
                    expected: expected.to_vec(),
                    found: j.shape.clone(),
                });
            }
            let (ty, packed, _) = self.joined_type(j)?;
            let raw = tracer.param(&j.name, ty)?;
            return Ok(Weight { name: j.name.clone(), raw, packed, shape: j.shape.clone(), tiles: None });
        }
        let tensor = self.view(name)?;
        if tensor.shape != expected {
            return Err(ModelError::TensorShape {
                name: tensor.name.to_string(),
                expected: expected.to_vec(),
                found: tensor.shape.to_vec(),
            });
        }
        let raw = tracer.param(tensor.name, self.param_type(&tensor)?)?;
        Ok(Weight { name: tensor.name.to_string(), raw, packed: None, shape: tensor.shape.to_vec(), tiles: None })
    }

    /// A tied checkpoint has no head of its own even when it stores
    /// `lm_head.weight`: transformers replaces it by the embedding.
    fn contains(&self, name: &str) -> bool {
        if name == "output.weight" && self.checkpoint.config.tie_word_embeddings() {
            return false;
        }
        self.joined.contains_key(name) || self.view(name).is_ok()
    }

    fn stored(&self, param: &str) -> Result<DerivedParam<'_>> {
        if let Some(j) = self.joined.values().find(|j| j.name == param) {
            let (ty, _, encoding) = self.joined_type(j)?;
            return Ok(DerivedParam {
                name: &j.name,
                source: match &j.bytes {
                    StackBytes::Runs(runs) => Source::Joined(runs),
                    StackBytes::Transposed(t) => Source::Assembled(t),
                    StackBytes::Mxfp4(blocks) => Source::Assembled(blocks),
                },
                encoding,
                target: ty.dtype,
            });
        }
        let tensor = self.checkpoint.get(param).ok_or_else(|| ModelError::MissingTensor(param.to_string()))?;
        let target = self.param_type(&tensor)?.dtype;
        let dtype = tensor.dtype.to_graph_dtype().expect("param_type accepted a float dtype");
        Ok(DerivedParam {
            name: tensor.name,
            source: Source::Tensor(tensor.data),
            encoding: Encoding::Dense(dtype),
            target,
        })
    }

    /// `model.safetensors`; a sharded checkpoint's params live in several
    /// files ([`HfCheckpoint::files`]), and this is their index.
    fn path(&self) -> &Path {
        self.checkpoint.path()
    }

    /// Only the decoder's tensors and the head count: a wrapper's vision
    /// tower is not exported; a tied checkpoint's stored `lm_head.weight`,
    /// old checkpoints' `rotary_emb.inv_freq` buffers and `unread` are
    /// ignored by transformers too.
    fn unused(&self, used: &BTreeSet<&str>, unread: &[String]) -> Option<String> {
        let names = &self.checkpoint.names;
        let unread: BTreeSet<String> = unread.iter().filter_map(|g| names.hf_name(g)).collect();
        let model = |name: &str| name.starts_with(names.body) || name == names.head;
        let ignored = |name: &str| {
            (name == names.head && self.checkpoint.config.tie_word_embeddings())
                || name.ends_with(".rotary_emb.inv_freq")
                || unread.contains(name)
                || names.ignored.iter().any(|p| name.strip_prefix(names.body).unwrap_or(name).starts_with(p))
        };
        // The tensors joined into a used stack are used.
        let joined: BTreeSet<&str> = self
            .joined
            .values()
            .filter(|j| used.contains(j.name.as_str()))
            .flat_map(|j| j.members.iter().copied())
            .collect();
        let tensors = self.checkpoint.shards().iter().flat_map(|file| file.tensors());
        tensors
            .map(|t| t.name)
            .find(|&n| model(n) && !ignored(n) && !used.contains(n) && !joined.contains(n))
            .map(str::to_string)
    }
}

impl ParamSource for SafetensorsWeights<'_> {
    fn param(&self, name: &str, ty: &TensorType) -> std::result::Result<Value, InterpError> {
        param_value(self, name, ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Graph;
    use crate::interp;
    use crate::lower::{lower_to_string, LowerOptions};
    use crate::max_abs_diff;
    use crate::models::testing::{block_matrices, smollm2_path, Fill};
    use crate::models::{Family, GgufWeights, PackedPolicy};
    use crate::tokenizer::Tokenizer;
    use crate::weights::gguf::Gguf;
    use std::collections::BTreeMap;
    use std::process::Command;
    use std::time::Instant;

    #[test]
    fn llama_names_map_to_hf() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
            ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
            ("blk.12.attn_k.weight", "model.layers.12.self_attn.k_proj.weight"),
            ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"),
            ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
            ("blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"),
            ("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"),
            ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"),
            ("blk.29.attn_norm.weight", "model.layers.29.input_layernorm.weight"),
            ("blk.29.ffn_norm.weight", "model.layers.29.post_attention_layernorm.weight"),
        ];
        for (gguf, hf) in cases {
            assert_eq!(llama_hf_name(gguf).as_deref(), Some(hf), "{gguf}");
        }
        assert_eq!(llama_hf_name("blk.3.attn_q.bias").as_deref(), Some("model.layers.3.self_attn.q_proj.bias"));
        assert_eq!(
            llama_hf_name("blk.3.attn_k_norm.weight").as_deref(),
            Some("model.layers.3.self_attn.k_norm.weight")
        );
        for gguf in ["blk.0.ffn_up.bias", "blk.x.attn_q.weight", "blk..attn_q.weight", "rope_freqs.weight"] {
            assert_eq!(llama_hf_name(gguf), None, "{gguf}");
        }
    }

    /// A 2-block llama in HF form (hidden 32, 4 heads over 2 kv heads, ffn
    /// 64, vocab 16), seeded: matrices F32, norms BF16 (read as stored).
    /// `config` is merged over the base `config.json`; `skip` leaves a
    /// tensor out, `lm_head` adds one.
    struct Tiny {
        config: serde_json::Value,
        skip: Option<&'static str>,
        lm_head: bool,
        odd: Option<(&'static str, StDType)>,
    }

    impl Default for Tiny {
        fn default() -> Self {
            Tiny { config: serde_json::json!({}), skip: None, lm_head: false, odd: None }
        }
    }

    impl Tiny {
        fn write(&self) -> tempfile::TempDir {
            let (hidden, ff, vocab, heads, kv_heads, blocks) = (32, 64, 16, 4, 2, 2);
            let hd = hidden / heads;
            let fill = Fill::new(1);
            let bf16 = |n, around| -> Vec<u8> {
                let f32s = fill.f32s(n, around);
                let f = f32s.chunks(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")));
                f.flat_map(|x| half::bf16::from_f32(x).to_le_bytes()).collect()
            };
            let mut tensors = vec![(
                "model.embed_tokens.weight".to_string(),
                StDType::F32,
                vec![vocab, hidden],
                fill.f32s(vocab * hidden, 0.0),
            )];
            for i in 0..blocks {
                let w = |n: &str| format!("model.layers.{i}.{n}.weight");
                tensors.push((w("input_layernorm"), StDType::BF16, vec![hidden], bf16(hidden, 1.0)));
                for (n, rows, cols) in block_matrices(hidden, heads, kv_heads, hd, ff) {
                    let name = llama_hf_name(&format!("blk.{i}.{n}.weight")).expect("a llama tensor");
                    tensors.push((name, StDType::F32, vec![rows, cols], fill.f32s(rows * cols, 0.0)));
                }
                tensors.push((w("post_attention_layernorm"), StDType::BF16, vec![hidden], bf16(hidden, 1.0)));
            }
            tensors.push(("model.norm.weight".into(), StDType::BF16, vec![hidden], bf16(hidden, 1.0)));
            if self.lm_head {
                tensors.push((
                    "lm_head.weight".into(),
                    StDType::F32,
                    vec![vocab, hidden],
                    fill.f32s(vocab * hidden, 0.0),
                ));
            }
            tensors.retain(|t| Some(t.0.as_str()) != self.skip);
            if let Some((name, dtype)) = self.odd {
                let t = tensors.iter_mut().find(|t| t.0 == name).expect("the odd tensor is one of the tiny model's");
                let n: usize = t.2.iter().product();
                t.1 = dtype;
                t.3 = vec![0; dtype.byte_len(&[n]).expect("a whole number of bytes") as usize];
            }

            let mut config = serde_json::json!({
                "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": ff,
                "num_hidden_layers": blocks, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": null, "tie_word_embeddings": true,
                "hidden_act": "silu",
            });
            for (key, value) in self.config.as_object().expect("an object") {
                config[key] = value.clone();
            }
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
            let views: Vec<(&str, StDType, &[usize], &[u8])> =
                tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice())).collect();
            let path = dir.path().join("model.safetensors");
            crate::weights::safetensors::write(&path, &views, &BTreeMap::new()).unwrap();
            dir
        }
    }

    fn prefill(weights: &SafetensorsWeights<'_>, seq_len: usize) -> Result<Graph> {
        crate::models::prefill(&Family::from_hf(&weights.checkpoint.config)?, weights, seq_len)
    }

    fn tokens(ids: &[u32]) -> Value {
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| (id as i32).to_le_bytes()).collect();
        Value::from_le_bytes(&TensorType::new([1, ids.len()], DType::I32), &bytes).unwrap()
    }

    fn argmax_rows(logits: &[f64], vocab: usize) -> Vec<usize> {
        logits.chunks(vocab).map(|r| (0..vocab).fold(0, |b, i| if r[i] > r[b] { i } else { b })).collect()
    }

    /// `graph` compiled by IREE and run on `input`, its params read from
    /// the checkpoint's safetensors files (every shard under one scope).
    fn through_iree(graph: &Graph, checkpoint: &HfCheckpoint, input: &Value) -> Vec<f64> {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("m.mlir"), lower_to_string(graph, &LowerOptions::default()).unwrap()).unwrap();
        let iree = crate::iree::Iree::for_tests();
        iree.compile(&path("m.mlir"), &path("m.vmfb")).unwrap();
        crate::npy::write(&path("tokens.npy"), input).unwrap();
        let parameters: Vec<(&str, &Path)> = checkpoint.files().into_iter().map(|file| ("model", file)).collect();
        let outputs = [path("logits.npy")];
        iree.run(&path("m.vmfb"), "main", &[path("tokens.npy")], &parameters, &outputs).unwrap();
        crate::npy::read(&outputs[0]).unwrap().to_f64_vec()
    }

    /// Params are named as in the file and read from it by IREE as they are
    /// stored (f32 and bf16), giving the interpreter's logits.
    #[test]
    fn tiny_hf_llama_reads_the_safetensors_in_place() {
        let dir = Tiny::default().write();
        let checkpoint = HfCheckpoint::open(dir.path()).unwrap();
        let weights = SafetensorsWeights::new(&checkpoint).unwrap();
        let graph = prefill(&weights, 4).unwrap();
        let params: Vec<String> = graph.params().map(|(_, name, ty)| format!("{name}: {ty}")).collect();
        assert_eq!(params.len(), 2 * 9 + 2, "tied: no lm_head");
        assert!(params.contains(&"model.layers.1.self_attn.q_proj.weight: tensor<32x32xf32>".into()), "{params:?}");
        assert!(params.contains(&"model.norm.weight: tensor<32xbf16>".into()), "{params:?}");
        for (_, name, _) in graph.params() {
            assert!(weights.stored(name).unwrap().is_copy(), "{name} is read as stored");
        }

        let text = lower_to_string(&graph, &LowerOptions::default()).unwrap();
        assert!(text.contains("#flow.parameter.named<\"model\"::\"model.layers.0.self_attn.q_proj.weight\">"));

        let input = tokens(&[1, 5, 9, 3]);
        let logits = interp::run(&graph, std::slice::from_ref(&input), &weights).unwrap().remove(0).to_f64_vec();
        assert!(logits.iter().all(|x| x.is_finite()));
        assert_eq!(checkpoint.files(), [dir.path().join("model.safetensors")]);
        let diff = max_abs_diff(&logits, &through_iree(&graph, &checkpoint, &input));
        eprintln!("tiny HF llama: max |interpreter - IREE| {diff:e}");
        assert!(diff <= 1e-4, "{diff}");
    }

    #[test]
    fn cast_declares_one_dtype_and_converts() {
        let dir = Tiny::default().write();
        let checkpoint = HfCheckpoint::open(dir.path()).unwrap();
        let weights = SafetensorsWeights::new(&checkpoint).unwrap().with_cast(Some(DType::F16)).unwrap();
        let graph = prefill(&weights, 4).unwrap();
        assert!(graph.params().all(|(_, _, ty)| ty.dtype == DType::F16));
        let q = weights.stored("model.layers.0.self_attn.q_proj.weight").unwrap();
        assert_eq!((q.encoding, q.target, q.is_copy()), (Encoding::Dense(DType::F32), DType::F16, false));
        let input = tokens(&[1, 5, 9, 3]);
        let cast = interp::run(&graph, std::slice::from_ref(&input), &weights).unwrap().remove(0).to_f64_vec();

        let stored = SafetensorsWeights::new(&checkpoint).unwrap();
        let exact = interp::run(&prefill(&stored, 4).unwrap(), &[input], &stored).unwrap().remove(0).to_f64_vec();
        let diff = max_abs_diff(&cast, &exact);
        assert!(diff > 0.0 && diff < 0.05, "f16 weights round: {diff}");
        assert!(SafetensorsWeights::new(&checkpoint).unwrap().with_cast(Some(DType::I8)).is_err());
    }

    #[test]
    fn tied_and_untied_heads() {
        let head = |tiny: Tiny| {
            let dir = tiny.write();
            let checkpoint = HfCheckpoint::open(dir.path()).unwrap();
            let weights = SafetensorsWeights::new(&checkpoint).map_err(|e| e.to_string())?;
            let graph = prefill(&weights, 2).unwrap();
            let has_head = graph.params().any(|(_, name, _)| name == "lm_head.weight");
            Ok::<_, String>(has_head)
        };
        let untied = serde_json::json!({"tie_word_embeddings": false});
        assert_eq!(head(Tiny { config: untied.clone(), lm_head: true, ..Tiny::default() }), Ok(true));
        // Tied wins over a stored head, as in transformers.
        assert_eq!(head(Tiny { lm_head: true, ..Tiny::default() }), Ok(false));
        let e = head(Tiny { config: untied, ..Tiny::default() }).unwrap_err();
        assert_eq!(e, "tensor \"lm_head.weight\" (GGUF \"output.weight\") is missing from the checkpoint");
    }

    #[test]
    fn errors_name_the_tensor() {
        let err = |tiny: Tiny| {
            let dir = tiny.write();
            let checkpoint = HfCheckpoint::open(dir.path()).unwrap();
            prefill(&SafetensorsWeights::new(&checkpoint).unwrap(), 4).unwrap_err().to_string()
        };
        let e = err(Tiny { skip: Some("model.layers.1.mlp.up_proj.weight"), ..Tiny::default() });
        assert_eq!(e, "tensor \"model.layers.1.mlp.up_proj.weight\" (GGUF \"blk.1.ffn_up.weight\") is missing from the checkpoint");
        let e = err(Tiny { odd: Some(("model.layers.0.self_attn.k_proj.weight", StDType::F64)), ..Tiny::default() });
        assert!(e.starts_with("tensor \"model.layers.0.self_attn.k_proj.weight\" is stored as F64"), "{e}");
        let e = err(Tiny { odd: Some(("model.norm.weight", StDType::I32)), ..Tiny::default() });
        assert!(e.starts_with("tensor \"model.norm.weight\" is stored as I32"), "{e}");
        let e = err(Tiny { config: serde_json::json!({"intermediate_size": 48}), ..Tiny::default() });
        assert!(
            e.contains("\"model.layers.0.mlp.gate_proj.weight\" has shape [64, 32], the config needs [48, 32]"),
            "{e}"
        );

        let dir = Tiny::default().write();
        let checkpoint = HfCheckpoint::open(dir.path()).unwrap();
        let weights = SafetensorsWeights::new(&checkpoint).unwrap();
        let t = Tracer::new("t");
        let e = weights.load(&t, "blk.0.ffn_up.bias", &[8]).unwrap_err().to_string();
        assert_eq!(e, "tensor \"blk.0.ffn_up.bias\" has no Hugging Face name in the llama family's table");
        assert!(!weights.contains("blk.0.ffn_up.bias"));
        assert!(!weights.contains("blk.0.attn_q_norm.weight"), "a llama checkpoint has no q norm");
        let e = weights.param("nope", &TensorType::new([1], DType::F32)).unwrap_err().to_string();
        assert_eq!(e, "param \"nope\" is missing from the weights");

        std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
        let e = HfCheckpoint::open(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("holds neither model.safetensors nor model.safetensors.index.json"), "{e}");
        std::fs::remove_file(dir.path().join("config.json")).unwrap();
        let e = HfCheckpoint::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("config.json"), "{e}");
    }

    #[test]
    fn sharded_checkpoint_reads_every_shard() {
        let dir = Tiny::default().write();
        let d = dir.path();
        // Split the tiny model into two shards: embedding and norm, the rest.
        let all = SafeTensors::open(&d.join("model.safetensors")).unwrap();
        let first = ["model.embed_tokens.weight", "model.norm.weight"];
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut weight_map = serde_json::Map::new();
        for t in all.tensors() {
            let (shard, file) =
                if first.contains(&t.name) { (&mut a, "a.safetensors") } else { (&mut b, "b.safetensors") };
            shard.push((t.name, t.dtype, t.shape, t.data));
            weight_map.insert(t.name.to_string(), file.into());
        }
        let none = BTreeMap::new();
        crate::weights::safetensors::write(&d.join("a.safetensors"), &a, &none).unwrap();
        crate::weights::safetensors::write(&d.join("b.safetensors"), &b, &none).unwrap();
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();

        let single = HfCheckpoint::open(d).unwrap();
        let input = tokens(&[3, 1, 4]);
        let weights = SafetensorsWeights::new(&single).unwrap();
        let graph = prefill(&weights, 3).unwrap();
        let want = interp::run(&graph, std::slice::from_ref(&input), &weights).unwrap().remove(0).to_f64_vec();
        drop((single, all));
        std::fs::remove_file(d.join("model.safetensors")).unwrap();
        let sharded = HfCheckpoint::open(d).unwrap();
        assert_eq!(sharded.path(), d.join("model.safetensors.index.json"));
        assert_eq!(sharded.files(), [d.join("a.safetensors"), d.join("b.safetensors")]);
        let weights = SafetensorsWeights::new(&sharded).unwrap();
        let got = interp::run(&prefill(&weights, 3).unwrap(), std::slice::from_ref(&input), &weights).unwrap();
        assert_eq!(got[0].to_f64_vec(), want);
        // IREE finds each param in its shard, every shard under one scope.
        let diff = max_abs_diff(&want, &through_iree(&graph, &sharded, &input));
        eprintln!("sharded tiny HF llama: max |interpreter - IREE| {diff:e}");
        assert!(diff <= 1e-4, "{diff}");
    }

    /// SmolLM2's GGUF, dequantized and un-permuted into an HF checkpoint by
    /// test/models/gguf_to_hf.py: the HF path (NeoX RoPE over HF-ordered
    /// Q/K rows) gives the GGUF path's logits (interleaved RoPE over
    /// llama.cpp's permuted rows).
    #[test]
    fn smollm2_hf_matches_gguf() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let gguf = Gguf::open(&smollm2_path()).unwrap_or_else(|e| panic!("{e} (run `make setup`)"));
        let ids = Tokenizer::from_gguf(&gguf).unwrap().encode("The capital of France is Paris", false);
        assert_eq!(ids.len(), 6, "{ids:?}");
        let input = tokens(&ids);

        let dir = tempfile::tempdir().unwrap();
        let (python, script) = (root.join(".venv/bin/python"), root.join("test/models/gguf_to_hf.py"));
        let start = Instant::now();
        let out = Command::new(&python)
            .arg(&script)
            .arg(smollm2_path())
            .arg(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}; run `make setup`", python.display()));
        assert!(out.status.success(), "{} failed:\n{}", script.display(), String::from_utf8_lossy(&out.stderr));
        eprintln!("gguf_to_hf.py: {:.2?}", start.elapsed());

        let gguf_weights = GgufWeights::new(&gguf, PackedPolicy::Dequantize(DType::F32)).unwrap();
        let gguf_graph = crate::models::prefill(&Family::from_gguf(&gguf).unwrap(), &gguf_weights, ids.len()).unwrap();
        let start = Instant::now();
        let want = interp::run(&gguf_graph, std::slice::from_ref(&input), &gguf_weights).unwrap().remove(0);
        eprintln!("interpreter, GGUF: {:.2?}", start.elapsed());

        let checkpoint = HfCheckpoint::open(dir.path()).unwrap();
        let hf_weights = SafetensorsWeights::new(&checkpoint).unwrap();
        let hf_graph = prefill(&hf_weights, ids.len()).unwrap();
        assert_eq!(hf_graph.params().count(), gguf_graph.params().count());
        let start = Instant::now();
        let got = interp::run(&hf_graph, &[input], &hf_weights).unwrap().remove(0);
        eprintln!("interpreter, HF: {:.2?}", start.elapsed());

        let (want, got) = (want.to_f64_vec(), got.to_f64_vec());
        let diff = max_abs_diff(&want, &got);
        eprintln!("max |GGUF - HF| logits over {} positions: {diff:e}", ids.len());
        assert!(diff <= 1e-4, "logits differ by {diff}");
        let vocab = want.len() / ids.len();
        assert_eq!(argmax_rows(&want, vocab), argmax_rows(&got, vocab), "argmax differs");
    }

    /// A checkpoint's tensors, owned: name, dtype, shape, bytes.
    type Tensors = Vec<(String, StDType, Vec<usize>, Vec<u8>)>;

    /// The tiny Qwen3-MoE's tensors (one per expert) with `edit` applied,
    /// written with its config.json into a directory.
    fn edited_qwen3moe(edit: impl Fn(&mut Tensors)) -> tempfile::TempDir {
        let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("test/models/transformers/qwen3moe");
        let file = SafeTensors::open(&case.join("model.safetensors")).unwrap();
        let mut tensors: Vec<_> =
            file.tensors().map(|t| (t.name.to_string(), t.dtype, t.shape.to_vec(), t.data.to_vec())).collect();
        edit(&mut tensors);
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(case.join("config.json"), dir.path().join("config.json")).unwrap();
        let views: Vec<(&str, StDType, &[usize], &[u8])> =
            tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice())).collect();
        crate::weights::safetensors::write(&dir.path().join("model.safetensors"), &views, &BTreeMap::new()).unwrap();
        dir
    }

    /// HF's MXFP4 rows `1, 3` of one expert repacked as ggml's blocks: the
    /// same numbers, in any pieces.
    #[test]
    fn mxfp4_parts_are_ggml_blocks_of_the_same_numbers() {
        // 1 expert, 4 rows of one block: scale byte 127 + r, codes (r + i) % 16.
        let codes = |r: usize| (0..32).map(move |i| ((r + i) % 16) as u8);
        let blocks: Vec<u8> = (0..4)
            .flat_map(|r| codes(r).collect::<Vec<_>>().chunks(2).map(|p| p[0] | p[1] << 4).collect::<Vec<_>>())
            .collect();
        let scales: Vec<u8> = (0..4).map(|r| 127 + r as u8).collect();
        let odd = Mxfp4Part { blocks: &blocks, scales: &scales, rows: 4, row_blocks: 1, parts: 2, part: 1 };
        let whole = Source::Assembled(&odd).to_vec();
        let values = crate::weights::quant::dequantize_to_vec(GgmlType::MXFP4, &whole).unwrap();
        const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        let want: Vec<f32> =
            [1, 3].iter().flat_map(|&r| codes(r).map(move |c| E2M1[c as usize] * 2f32.powi(r as i32))).collect();
        assert_eq!(values, want);
        let mut pieces = Vec::new();
        for start in (0..whole.len()).step_by(5) {
            odd.read_into(start, 5.min(whole.len() - start), &mut pieces);
        }
        assert_eq!(pieces, whole);
    }

    /// A transposed part reads `out[e][j][i] = in[e][i][j · parts + part]`,
    /// the same in any pieces.
    #[test]
    fn transposed_parts_read_in_any_pieces() {
        // [2 experts, 3 rows, 2 · 2 columns] of one-byte elements.
        let data: Vec<u8> = (0..24).collect();
        let up = Transposed { data: &data, elem: 1, experts: 2, a: 3, b: 2, parts: 2, part: 1 };
        let whole = Source::Assembled(&up).to_vec();
        assert_eq!(whole, [1, 5, 9, 3, 7, 11, 13, 17, 21, 15, 19, 23]);
        let mut pieces = Vec::new();
        for start in (0..12).step_by(5) {
            up.read_into(start, 5.min(12 - start), &mut pieces);
        }
        assert_eq!(pieces, whole);
    }

    /// Experts kept one tensor each are joined into `[E, rows, cols]`
    /// params that are never read in place, their bytes the experts' in
    /// order; a missing expert, a stray one, or one of another shape is
    /// refused by name.
    #[test]
    fn expert_stacks_are_joined_or_refused_by_name() {
        let dir = edited_qwen3moe(|_| {});
        let checkpoint = HfCheckpoint::open(dir.path()).unwrap();
        let weights = SafetensorsWeights::new(&checkpoint).unwrap();
        let t = Tracer::new("main");
        let down = weights.load(&t, "blk.1.ffn_down_exps.weight", &[8, 32, 32]).unwrap();
        assert_eq!(
            (down.name.as_str(), down.raw.ty.to_string()),
            ("model.layers.1.mlp.experts.*.down_proj.weight", "tensor<8x32x32xbf16>".into())
        );
        let stored = weights.stored(&down.name).unwrap();
        assert!(!stored.is_copy());
        let experts: Vec<u8> = (0..8)
            .flat_map(|e| {
                checkpoint.get(&format!("model.layers.1.mlp.experts.{e}.down_proj.weight")).unwrap().data.to_vec()
            })
            .collect();
        assert_eq!(stored.source.to_vec(), experts);
        let e = weights.load(&t, "blk.1.ffn_down_exps.weight", &[4, 32, 32]).unwrap_err();
        assert!(
            e.to_string().contains("\"model.layers.1.mlp.experts.*.down_proj.weight\" has shape [8, 32, 32]"),
            "{e}"
        );

        let refused = |edit: &dyn Fn(&mut Tensors)| {
            let dir = edited_qwen3moe(edit);
            let checkpoint = HfCheckpoint::open(dir.path()).unwrap();
            let family = Family::from_hf(&checkpoint.config).unwrap();
            let e = SafetensorsWeights::new(&checkpoint)
                .and_then(|weights| crate::models::prefill(&family, &weights, 2).map(|_| ()))
                .unwrap_err();
            e.to_string()
        };
        let gate3 = "model.layers.0.mlp.experts.3.gate_proj.weight";
        let e = refused(&|ts| ts.retain(|t| t.0 != gate3));
        assert_eq!(e, format!("tensor \"{gate3}\" is missing from the checkpoint"));
        let e = refused(&|ts| {
            let t = ts.iter_mut().find(|t| t.0 == gate3).unwrap();
            (t.2, t.3) = (vec![16, 32], t.3[..1024].to_vec());
        });
        assert!(e.contains(gate3) && e.contains("the experts of a stack share a shape and dtype"), "{e}");
        let e = refused(&|ts| {
            let extra = ts.iter().find(|t| t.0 == gate3).unwrap().clone();
            ts.push(("model.layers.0.mlp.experts.8.gate_proj.weight".into(), extra.1, extra.2, extra.3));
        });
        assert!(e.contains("\"model.layers.0.mlp.experts.*.gate_proj.weight\" has shape [9, 32, 32]"), "{e}");
    }
}
