//! BERT: a post-norm encoder with learned positions and token types,
//! read as a sentence-embedding model (all-MiniLM-L6-v2, BGE, ...).
//!
//! - Paper: Devlin et al., "BERT: Pre-training of Deep Bidirectional
//!   Transformers for Language Understanding" (<https://arxiv.org/abs/1810.04805>);
//!   Reimers and Gurevych, "Sentence-BERT" (<https://arxiv.org/abs/1908.10084>)
//!   for the pooled, normalized sentence vector.
//! - References: HF transformers `models/bert/modeling_bert.py` (`BertModel`);
//!   sentence-transformers' `Pooling` and `Normalize` modules; llama.cpp
//!   `src/models/bert.cpp` and `conversion/bert.py` for the GGUF names and
//!   `bert.pooling_type`.
//!
//! Unlike the decoders, an encoder has no cache and no decoding loop: one
//! graph over a fixed number of padded sentences ([`embed`]),
//! `embed_B(ids: tensor<Bx?xi32>, mask: tensor<Bx?xi32>) -> tensor<BxDxf32>`.
//! kiln's graphs have one run-time size `?` per function, which the
//! sentence length takes; the export's `embed` over `?` sentences loops
//! over such graphs.
//!
//! Numerics: both sources get HF's: exact (erf) GELU, the mask applied as
//! a select of `f32::MIN` (HF adds `finfo.min`), masked mean pooling as
//! `Σ h·m / max(Σ m, 1e-9)` and L2 normalization as `x / max(‖x‖, 1e-12)`
//! (sentence-transformers). llama.cpp's own BERT graph uses the tanh GELU
//! (`LLM_FFN_GELU`), about 1e-3 away; kiln computes what the weights were
//! trained with.

use super::config::{GgufKeys, HfKeys};
use super::hf::HfNames;
use super::{Checkpoint, ModelError, Result, Weight};
use crate::graph::{ComparisonDirection as Cmp, DType, DotDimensions, Graph, ReduceKind, TensorType, DYNAMIC};
use crate::trace::{Tensor, Tracer};
use crate::weights::gguf::Gguf;
use crate::weights::hf_config::HfConfig;
use serde_json::Value as Json;
use std::path::Path;

/// How the per-token states become one vector per sentence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The mean over the sentence's tokens (padding excluded).
    Mean,
    /// The first token's state (`[CLS]`).
    Cls,
    /// The last token's state (the last one the mask keeps).
    Last,
}

impl Pooling {
    /// Every pooling, in `--pooling` order.
    pub const ALL: [Pooling; 3] = [Pooling::Mean, Pooling::Cls, Pooling::Last];

    /// `mean`, `cls` or `last`.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Pooling, String> {
        Pooling::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("no pooling \"{s}\"; try mean, cls or last"))
    }
}

/// What a checkpoint without sentence-transformers' files (or a GGUF,
/// which records the pooling but not the normalization) is embedded with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbedChoice {
    /// The pooling; required where the checkpoint does not say.
    pub pooling: Option<Pooling>,
    /// L2-normalize the vectors; where the checkpoint does not say, on.
    pub normalize: Option<bool>,
}

/// Hyper-parameters, from `config.json` (+ sentence-transformers' files) or
/// from GGUF metadata under llama.cpp's `bert.*` keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Encoder blocks.
    pub block_count: usize,
    /// Width of the residual stream, and of the embeddings.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Width of the feed-forward layer.
    pub feed_forward_length: usize,
    /// Rows of the token embedding.
    pub vocab_size: usize,
    /// Rows of the position embedding: the longest sentence.
    pub max_positions: usize,
    /// Rows of the token-type embedding (row 0 is every token's).
    pub type_vocab_size: usize,
    /// The layer norms' epsilon.
    pub eps: f64,
    /// How the sentence vector is pooled.
    pub pooling: Pooling,
    /// Whether it is L2-normalized.
    pub normalize: bool,
    /// Tokens a sentence is truncated to: sentence-transformers'
    /// `max_seq_length`, else the positions.
    pub max_length: usize,
}

impl Config {
    /// From the HF checkpoint directory `dir`: `config.json` (`hf`, read
    /// already), then sentence-transformers' `modules.json`,
    /// `1_Pooling/config.json` (or wherever modules.json puts it) and
    /// `sentence_bert_config.json`, where present; `choice` for what they
    /// do not say. Every `config.json` key is read or refused; the
    /// `model_type` and class are checked by the registry
    /// ([`super::registry::by_hf`]).
    pub fn from_hf(hf: &HfConfig, dir: &Path, choice: EmbedChoice) -> Result<Config> {
        let keys = HfKeys::new("config.json", "bert", &hf.keys);
        keys.fixed("hidden_act", "\"gelu\"", "BERT's exact GELU")?;
        keys.fixed("position_embedding_type", "\"absolute\"", "learned absolute positions")?;
        keys.ignore(&[
            "attention_probs_dropout_prob",
            "hidden_dropout_prob",
            "classifier_dropout",
            "gradient_checkpointing",
            "layer_norm_eps",
        ]);
        keys.get::<bool>("tie_word_embeddings")?;
        let hidden = keys.count("hidden_size")?;
        let heads = keys.count("num_attention_heads")?;
        if !hidden.is_multiple_of(heads) {
            return Err(keys.error(
                "hidden_size",
                &hidden.into(),
                format!("is not a multiple of num_attention_heads {heads}"),
            ));
        }
        let max_positions = keys.count_or("max_position_embeddings", 512)?;
        let st = SentenceTransformers::read(dir)?;
        let pooling = match (st.pooling, choice.pooling) {
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => {
                return Err(ModelError::Config(format!(
                    "{}: no sentence-transformers modules.json says how to pool; choose `--pooling mean|cls|last` \
                     (all-MiniLM-L6-v2 and most sentence models: mean, BGE: cls)",
                    dir.display()
                )))
            }
        };
        let config = Config {
            block_count: keys.count("num_hidden_layers")?,
            hidden,
            heads,
            feed_forward_length: keys.count("intermediate_size")?,
            vocab_size: keys.count("vocab_size")?,
            max_positions,
            type_vocab_size: keys.count_or("type_vocab_size", 2)?,
            eps: keys.positive_f64("layer_norm_eps", Some(1e-12))?,
            pooling,
            normalize: st.normalize.or(choice.normalize).unwrap_or(true),
            max_length: st.max_seq_length.unwrap_or(max_positions).min(max_positions),
        };
        keys.finish()?;
        Ok(config)
    }

    /// From a GGUF of `general.architecture = bert`, as llama.cpp's
    /// converter writes it: the pooling from `bert.pooling_type` (mean,
    /// CLS or last), the normalization from `choice` (on by default, as
    /// llama.cpp's embedding example does).
    pub fn from_gguf<D: AsRef<[u8]> + ?Sized>(gguf: &Gguf<D>, choice: EmbedChoice) -> Result<Config> {
        let keys = GgufKeys::new(gguf)?;
        if keys.arch != "bert" {
            return Err(ModelError::UnknownArchitecture(keys.arch.clone()));
        }
        if keys.get("attention.causal").and_then(|v| v.as_bool()) == Some(true) {
            return Err(keys.error("attention.causal", true, "kiln's BERT attends both ways"));
        }
        let pooling = match keys.int_or("pooling_type", 0)? {
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            0 => choice.pooling.ok_or_else(|| {
                keys.error("pooling_type", 0, "no pooling is recorded; choose `--pooling mean|cls|last`")
            })?,
            n => return Err(keys.error("pooling_type", n, "kiln pools mean (1), CLS (2) or last (3)")),
        };
        let hidden = keys.count("embedding_length")?;
        let heads = keys.count("attention.head_count")?;
        if !hidden.is_multiple_of(heads) {
            return Err(keys.error("embedding_length", hidden, format!("is not a multiple of the {heads} heads")));
        }
        let max_positions = keys.count("context_length")?;
        let rows = |name: &str| gguf.tensor(name).map(|t| t.shape()[0]);
        let vocab_size =
            rows("token_embd.weight").ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let type_vocab_size =
            rows("token_types.weight").ok_or_else(|| ModelError::MissingTensor("token_types.weight".into()))?;
        let config = Config {
            block_count: keys.count("block_count")?,
            hidden,
            heads,
            feed_forward_length: keys.count("feed_forward_length")?,
            vocab_size: keys.int_or("vocab_size", vocab_size)?,
            max_positions,
            type_vocab_size,
            eps: keys.positive_f64("attention.layer_norm_epsilon", None)?,
            pooling,
            normalize: choice.normalize.unwrap_or(true),
            max_length: max_positions,
        };
        keys.finish()?;
        Ok(config)
    }

    /// Features per head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// What sentence-transformers' files in a checkpoint directory say.
#[derive(Default)]
struct SentenceTransformers {
    pooling: Option<Pooling>,
    normalize: Option<bool>,
    max_seq_length: Option<usize>,
}

impl SentenceTransformers {
    /// `dir/modules.json` and what it points to; all `None` without it.
    fn read(dir: &Path) -> Result<SentenceTransformers> {
        let Some(modules) = read_json(&dir.join("modules.json"))? else {
            return Ok(SentenceTransformers::default());
        };
        let fail = |file: &str, message: String| ModelError::Config(format!("{}: {message}", dir.join(file).display()));
        let modules = modules.as_array().ok_or_else(|| fail("modules.json", "is not a list of modules".into()))?;
        let of_type = |suffix: &str| {
            modules.iter().find(|m| m["type"].as_str().is_some_and(|t| t.rsplit('.').next() == Some(suffix)))
        };
        for m in modules {
            let ty = m["type"].as_str().unwrap_or_default();
            let known = ["Transformer", "Pooling", "Normalize"].iter().any(|k| ty.rsplit('.').next() == Some(k));
            if !known {
                return Err(fail(
                    "modules.json",
                    format!("module {ty:?}: kiln embeds Transformer, Pooling and Normalize modules only"),
                ));
            }
        }
        let pooling = match of_type("Pooling") {
            None => None,
            Some(m) => {
                let file = format!("{}/config.json", m["path"].as_str().unwrap_or("1_Pooling"));
                let config = read_json(&dir.join(&file))?.ok_or_else(|| fail(&file, "is missing".into()))?;
                Some(pooling_mode(&config).map_err(|message| fail(&file, message))?)
            }
        };
        let max_seq_length = read_json(&dir.join("sentence_bert_config.json"))?
            .and_then(|c| c["max_seq_length"].as_u64())
            .map(|n| n as usize);
        Ok(SentenceTransformers { pooling, normalize: Some(of_type("Normalize").is_some()), max_seq_length })
    }
}

/// The one pooling mode `config` (a sentence-transformers Pooling config)
/// turns on.
fn pooling_mode(config: &Json) -> std::result::Result<Pooling, String> {
    const MODES: [(&str, Option<Pooling>); 6] = [
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_lasttoken", Some(Pooling::Last)),
        ("pooling_mode_max_tokens", None),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ];
    let on: Vec<_> = MODES.iter().filter(|(key, _)| config[key].as_bool() == Some(true)).collect();
    match on[..] {
        [(_, Some(p))] => Ok(*p),
        [(key, None)] => Err(format!("{key} is true; kiln pools mean, CLS or last token")),
        _ => Err(format!("turns on {} pooling modes; kiln computes exactly one of mean, CLS and last token", on.len())),
    }
}

fn read_json(path: &Path) -> Result<Option<Json>> {
    let fail = |message: String| ModelError::Config(format!("{}: {message}", path.display()));
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| fail(format!("not valid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fail(e.to_string())),
    }
}

/// A layer norm's weight and bias, `{name}.weight` and `{name}.bias`.
struct Norm<'t>(Tensor<'t>, Tensor<'t>);

impl<'t> Norm<'t> {
    fn load(t: &'t Tracer, weights: &dyn Checkpoint, name: &str, len: usize) -> Result<Self> {
        let part = |p: &str| weights.load(t, &format!("{name}.{p}"), &[len])?.f32();
        Ok(Norm(part("weight")?, part("bias")?))
    }

    fn forward(&self, x: &Tensor<'t>, eps: f64) -> Result<Tensor<'t>> {
        Ok(x.layer_norm(Some(&self.0), Some(&self.1), eps)?)
    }
}

/// A projection with its bias: `x · Wᵀ + b`.
struct Linear<'t>(Weight<'t>, Tensor<'t>);

impl<'t> Linear<'t> {
    fn load(t: &'t Tracer, weights: &dyn Checkpoint, name: &str, out: usize, inp: usize) -> Result<Self> {
        let w = weights.load(t, &format!("{name}.weight"), &[out, inp])?;
        Ok(Linear(w, weights.load(t, &format!("{name}.bias"), &[out])?.f32()?))
    }

    fn forward(&self, x: &Tensor<'t>) -> Result<Tensor<'t>> {
        let y = self.0.linear(x)?;
        Ok(y.add(&self.1.broadcast_in_dim(&y.ty.shape, &[y.ty.rank() - 1])?)?)
    }
}

/// One post-norm encoder block (HF `BertLayer`, llama.cpp's names):
/// ```text
/// x = attn_output_norm(x + W_o · attention(W_q x, W_k x, W_v x, mask))
/// x = layer_output_norm(x + ffn_down(gelu(ffn_up(x))))
/// ```
struct Block<'t> {
    q: Linear<'t>,
    k: Linear<'t>,
    v: Linear<'t>,
    output: Linear<'t>,
    attn_output_norm: Norm<'t>,
    up: Linear<'t>,
    down: Linear<'t>,
    layer_output_norm: Norm<'t>,
}

impl<'t> Block<'t> {
    fn load(t: &'t Tracer, weights: &dyn Checkpoint, c: &Config, i: usize) -> Result<Self> {
        let (h, ff) = (c.hidden, c.feed_forward_length);
        let linear = |name: &str, out, inp| Linear::load(t, weights, &format!("blk.{i}.{name}"), out, inp);
        let norm = |name: &str| Norm::load(t, weights, &format!("blk.{i}.{name}"), h);
        Ok(Block {
            q: linear("attn_q", h, h)?,
            k: linear("attn_k", h, h)?,
            v: linear("attn_v", h, h)?,
            output: linear("attn_output", h, h)?,
            attn_output_norm: norm("attn_output_norm")?,
            up: linear("ffn_up", ff, h)?,
            down: linear("ffn_down", h, ff)?,
            layer_output_norm: norm("layer_output_norm")?,
        })
    }

    /// `x [B, T, hidden]`, `keys [B, T]` i1 (the tokens that are not
    /// padding) -> `[B, T, hidden]`.
    fn forward(&self, x: &Tensor<'t>, keys: &Tensor<'t>, c: &Config) -> Result<Tensor<'t>> {
        let (b, t) = (x.ty.shape[0], x.ty.shape[1]);
        let heads = |y: Tensor<'t>| -> Result<Tensor<'t>> {
            Ok(y.reshape(&[b, t, c.heads, c.head_dim()])?.transpose(&[0, 2, 1, 3])?)
        };
        let (q, k, v) = (heads(self.q.forward(x)?)?, heads(self.k.forward(x)?)?, heads(self.v.forward(x)?)?);
        let a = padded_attention(&q, &k, &v, keys, 1.0 / (c.head_dim() as f64).sqrt())?;
        let a = a.transpose(&[0, 2, 1, 3])?.reshape(&[b, t, c.hidden])?;
        let x = self.attn_output_norm.forward(&x.add(&self.output.forward(&a)?)?, c.eps)?;
        let ffn = self.down.forward(&self.up.forward(&x)?.gelu_erf()?)?;
        self.layer_output_norm.forward(&x.add(&ffn)?, c.eps)
    }
}

/// Attention of `q`, `k`, `v` `[B, heads, T, hd]` over the keys `keys [B,
/// T]` (i1) keeps, every query seeing every kept key of its sentence:
/// `softmax(q·kᵀ·scale, masked) · v`. Masked scores are `f32::MIN` rather
/// than `-inf`, so a padding query's row stays finite (it is pooled away).
/// Not [`crate::trace::nn::attention`]: its masks are shared by the batch
/// (`[seq, kv_seq]`), and a per-sentence one would go through its
/// grouped-heads reshape with two `?` dims, which kiln's lowering cannot
/// size.
fn padded_attention<'t>(
    q: &Tensor<'t>,
    k: &Tensor<'t>,
    v: &Tensor<'t>,
    keys: &Tensor<'t>,
    scale: f64,
) -> Result<Tensor<'t>> {
    let batch = |lhs: usize, rhs: usize| DotDimensions {
        lhs_batching_dimensions: vec![0, 1],
        rhs_batching_dimensions: vec![0, 1],
        lhs_contracting_dimensions: vec![lhs],
        rhs_contracting_dimensions: vec![rhs],
    };
    let scores = q.dot_general(k, batch(3, 3))?;
    let scores = scores.multiply(&scores.tracer().constant(scale, scores.ty.clone())?)?;
    let visible = keys.broadcast_in_dim(&scores.ty.shape, &[0, 3])?;
    let scores = visible.select(&scores, &scores.tracer().constant(f32::MIN as f64, scores.ty.clone())?)?;
    Ok(scores.softmax(3)?.dot_general(v, batch(3, 2))?)
}

/// The whole encoder: embeddings, blocks, pooling, normalization.
pub struct Bert<'t> {
    /// The hyper-parameters the model was loaded with.
    pub config: Config,
    token_embd: Weight<'t>,
    position_embd: Weight<'t>,
    token_types: Weight<'t>,
    token_embd_norm: Norm<'t>,
    blocks: Vec<Block<'t>>,
}

impl<'t> Bert<'t> {
    /// Declares every weight in `t` by its GGUF name, checking each shape
    /// against `c`.
    pub fn load(t: &'t Tracer, c: &Config, weights: &dyn Checkpoint) -> Result<Self> {
        let h = c.hidden;
        Ok(Bert {
            config: c.clone(),
            token_embd: weights.load(t, "token_embd.weight", &[c.vocab_size, h])?,
            position_embd: weights.load(t, "position_embd.weight", &[c.max_positions, h])?,
            token_types: weights.load(t, "token_types.weight", &[c.type_vocab_size, h])?,
            token_embd_norm: Norm::load(t, weights, "token_embd_norm", h)?,
            blocks: (0..c.block_count).map(|i| Block::load(t, weights, c, i)).collect::<Result<_>>()?,
        })
    }

    /// `ids`, `mask` `[B, T]` i32 (1 for a token, 0 for padding) -> the
    /// sentence vectors `[B, hidden]` f32. Every token has type 0 (one
    /// sentence per row), as sentence-transformers and llama.cpp encode.
    pub fn embed(&self, ids: &Tensor<'t>, mask: &Tensor<'t>) -> Result<Tensor<'t>> {
        let c = &self.config;
        let t = ids.tracer();
        let (b, len) = (ids.ty.shape[0], ids.ty.shape[1]);
        let shape = [b, len, c.hidden];
        let positions = t.iota(0, TensorType::new([len], DType::I32))?;
        let position = self.position_embd.rows(&positions)?.broadcast_in_dim(&shape, &[1, 2])?;
        let zero = t.constant(0.0, TensorType::new([1], DType::I32))?;
        let token_type = self.token_types.rows(&zero)?.reshape(&[c.hidden])?.broadcast_in_dim(&shape, &[2])?;
        let x = self.token_embd.rows(ids)?.add(&position)?.add(&token_type)?;
        let mut x = self.token_embd_norm.forward(&x, c.eps)?;
        let keys = mask.compare(Cmp::Ne, &t.constant(0.0, mask.ty.clone())?)?;
        for block in &self.blocks {
            x = block.forward(&x, &keys, c)?;
        }
        let pooled = self.pool(&x, mask)?;
        if !c.normalize {
            return Ok(pooled);
        }
        // sentence-transformers' Normalize: F.normalize, x / max(‖x‖, 1e-12).
        let norm = pooled.multiply(&pooled)?.reduce(ReduceKind::Sum, &[1])?.sqrt()?;
        let norm = norm.maximum(&t.constant(1e-12, norm.ty.clone())?)?;
        Ok(pooled.divide(&norm.broadcast_in_dim(&pooled.ty.shape, &[0])?)?)
    }

    /// `x [B, T, hidden]` pooled over the tokens of `mask [B, T]` (i32, 1
    /// on a token), as sentence-transformers' Pooling: `Σₜ m[b,t]·x[b,t] /
    /// max(Σₜ m, 1e-9)` with `m` the mask for the mean, the first token for
    /// CLS, the last masked-in one for last.
    ///
    /// The sum is a reduction of the chosen rows (a `select`), not a
    /// product: iree-compile 3.13 data-tiles a product contracting the `?`
    /// tokens with the last layer norm fused into its packing, and refuses
    /// that ("large vector sizes"). The choice is f32 up to the select,
    /// compared there, and read from the i32 mask rather than attention's
    /// `i1` keys: an `i1` tensor between dispatches is one Vulkan cannot
    /// store ("failed to emulate bit width").
    fn pool(&self, x: &Tensor<'t>, mask: &Tensor<'t>) -> Result<Tensor<'t>> {
        let t = x.tracer();
        let (b, len, h) = (x.ty.shape[0], x.ty.shape[1], x.ty.shape[2]);
        let rows = TensorType::new([b, len], DType::F32);
        let (one, zero) = (t.constant(1.0, rows.clone())?, t.constant(0.0, rows.clone())?);
        let index = t.iota(1, rows.with_dtype(DType::I32))?;
        let kept = mask.convert(DType::F32)?;
        let chosen = match self.config.pooling {
            Pooling::Mean => kept,
            Pooling::Cls => index.compare(Cmp::Eq, &t.constant(0.0, index.ty.clone())?)?.select(&one, &zero)?,
            Pooling::Last => {
                let last = kept.reduce(ReduceKind::Sum, &[1])?;
                let last = last.subtract(&t.constant(1.0, last.ty.clone())?)?.convert(DType::I32)?;
                index.compare(Cmp::Eq, &last.broadcast_in_dim(&rows.shape, &[0])?)?.select(&one, &zero)?
            }
        };
        let count = chosen.reduce(ReduceKind::Sum, &[1])?;
        let count = count.maximum(&t.constant(1e-9, count.ty.clone())?)?;
        let chosen = chosen.broadcast_in_dim(&[b, len, h], &[0, 1])?;
        let chosen = chosen.compare(Cmp::Gt, &t.constant(0.5, chosen.ty.clone())?)?;
        let sum = chosen.select(x, &t.constant(0.0, x.ty.clone())?)?.reduce(ReduceKind::Sum, &[1])?;
        Ok(sum.divide(&count.broadcast_in_dim(&sum.ty.shape, &[0])?)?)
    }
}

/// `embed_ROWS(ids: tensor<ROWSx?xi32>, mask: tensor<ROWSx?xi32>) ->
/// tensor<ROWSxHIDDENxf32>`: the sentence vectors of `rows` sentences
/// padded to one length (right-padded, mask 0 on padding; a sentence's
/// vector does not depend on the padding). An export's `embed` loops over
/// these for any number of sentences ([`crate::lower::RowLoop`]).
pub fn embed(config: &Config, weights: &dyn Checkpoint, rows: usize) -> Result<Graph> {
    let t = Tracer::new(&format!("embed_{rows}"));
    let model = Bert::load(&t, config, weights)?;
    let ty = TensorType::new([rows, DYNAMIC], DType::I32);
    let (ids, mask) = (t.input("ids", ty.clone())?, t.input("mask", ty)?);
    let vectors = model.embed(&ids, &mask)?;
    Ok(t.finish(&[&vectors])?)
}

/// BERT's whole-model tensors (`BertModel`'s names; `bert.` before them in
/// a `BertForMaskedLM`).
const HF_NAMES: [(&str, &str); 5] = [
    ("token_embd.weight", "embeddings.word_embeddings.weight"),
    ("position_embd.weight", "embeddings.position_embeddings.weight"),
    ("token_types.weight", "embeddings.token_type_embeddings.weight"),
    ("token_embd_norm.weight", "embeddings.LayerNorm.weight"),
    ("token_embd_norm.bias", "embeddings.LayerNorm.bias"),
];

/// BERT's per-block tensors, under `encoder.layer.{i}.`.
const HF_BLOCK_NAMES: [(&str, &str); 16] = [
    ("attn_q.weight", "attention.self.query.weight"),
    ("attn_q.bias", "attention.self.query.bias"),
    ("attn_k.weight", "attention.self.key.weight"),
    ("attn_k.bias", "attention.self.key.bias"),
    ("attn_v.weight", "attention.self.value.weight"),
    ("attn_v.bias", "attention.self.value.bias"),
    ("attn_output.weight", "attention.output.dense.weight"),
    ("attn_output.bias", "attention.output.dense.bias"),
    ("attn_output_norm.weight", "attention.output.LayerNorm.weight"),
    ("attn_output_norm.bias", "attention.output.LayerNorm.bias"),
    ("ffn_up.weight", "intermediate.dense.weight"),
    ("ffn_up.bias", "intermediate.dense.bias"),
    ("ffn_down.weight", "output.dense.weight"),
    ("ffn_down.bias", "output.dense.bias"),
    ("layer_output_norm.weight", "output.LayerNorm.weight"),
    ("layer_output_norm.bias", "output.LayerNorm.bias"),
];

/// Where an HF checkpoint keeps the tensors ([`super::registry`]'s row): a
/// `BertModel` at the top level, a `BertForMaskedLM` under `bert.` (its
/// `cls.` head not read); `has` says which names the checkpoint stores.
pub fn hf_names(_: &HfConfig, has: &dyn Fn(&str) -> bool) -> HfNames {
    HfNames {
        family: "bert",
        names: &HF_NAMES,
        block_names: &[&HF_BLOCK_NAMES],
        body: if has("bert.embeddings.word_embeddings.weight") { "bert." } else { "" },
        head: "cls.predictions.decoder.weight",
        layers: "encoder.layer.",
        ignored: &["pooler.", "embeddings.position_ids", "cls."],
        stacks: &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_json(extra: &str) -> HfConfig {
        HfConfig::parse(&format!(
            r#"{{"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 16,
                "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 24,
                "vocab_size": 16{extra}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn what_kiln_does_not_compute_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let choice = EmbedChoice { pooling: Some(Pooling::Mean), normalize: None };
        let config = Config::from_hf(&config_json(""), dir.path(), choice).unwrap();
        assert_eq!(
            (config.pooling, config.normalize, config.max_length, config.eps),
            (Pooling::Mean, true, 512, 1e-12)
        );
        for (extra, named) in [
            (r#", "position_embedding_type": "relative_key""#, "position_embedding_type = \"relative_key\""),
            (r#", "hidden_act": "gelu_new""#, "hidden_act = \"gelu_new\""),
            (r#", "is_decoder": true"#, "is_decoder = true"),
            (r#", "rotary_value": 1"#, "rotary_value = 1"),
        ] {
            let err = Config::from_hf(&config_json(extra), dir.path(), choice).unwrap_err().to_string();
            assert!(err.contains(named), "{extra}: {err}");
        }
        let err = Config::from_hf(&config_json(""), dir.path(), EmbedChoice::default()).unwrap_err().to_string();
        assert!(err.contains("--pooling"), "no sentence-transformers files and no choice: {err}");
        std::fs::write(
            dir.path().join("modules.json"),
            r#"[{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}]"#,
        )
        .unwrap();
        let err = Config::from_hf(&config_json(""), dir.path(), choice).unwrap_err().to_string();
        assert!(err.contains("Dense"), "{err}");
    }

    #[test]
    fn pooling_modes_are_read_or_refused_by_name() {
        let mean = serde_json::json!({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": false});
        assert_eq!(pooling_mode(&mean), Ok(Pooling::Mean));
        assert_eq!(pooling_mode(&serde_json::json!({"pooling_mode_cls_token": true})), Ok(Pooling::Cls));
        let max = pooling_mode(&serde_json::json!({"pooling_mode_max_tokens": true})).unwrap_err();
        assert!(max.contains("pooling_mode_max_tokens"), "{max}");
        let two = serde_json::json!({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true});
        assert!(pooling_mode(&two).unwrap_err().contains("2 pooling modes"));
    }
}
