//! Gemma 3n (text): a Gemma decoder whose residual stream is four AltUp
//! streams (one computed, three predicted and corrected from it), with a
//! per-layer embedding of every token added to the predicted ones, a
//! low-rank LAuReL branch beside attention, Gaussian top-k sparsity in the
//! first feed-forward layers, and the last layers reading the keys and
//! values of an earlier one instead of computing their own.
//!
//! - Papers: Gemma Team, "Gemma 3n" (<https://ai.google.dev/gemma/docs/gemma-3n>);
//!   Baykal et al., "Alternating Updates for Efficient Transformers"
//!   (<https://arxiv.org/abs/2301.13310>); Menghani et al., "LAuReL:
//!   Learned Augmented Residual Layer" (<https://arxiv.org/abs/2411.07501>).
//! - References: HF transformers 5.24 `models/gemma3n/modeling_gemma3n.py`
//!   (the numerics followed here); llama.cpp `src/models/gemma3n.cpp` and
//!   `conversion/gemma.py` (`Gemma3NModel`), the GGUF names and keys.
//!
//! Per token, with `D` the width, `P` the per-layer input width and
//! `norm(x, w) = x / √(mean(x²) + ε) · w` (the weight as stored, not
//! Gemma 3's `1 + w`):
//! ```text
//! e      = E[tok] · √D
//! pli    = (norm(W_plm · e / √D, w_pln) + E_pl[tok] · √P) / √2      [L, P], per layer
//! h      = [e, rescale(W_altup[0..3] · e, to e)]                     4 AltUp streams
//! layer l:
//!   route(x) = tanh(W_router · norm(x, w_rn) / D)
//!   p_j  = h_j + Σ_k C[j,k] h_k,  C = W_pred · route(h_0) as [4, 4]
//!   x    = norm(p_0, attn_norm)
//!   r    = (p_0 + norm(attn(x), post_attention_norm) + x + norm(W_lr · W_ll · x, laurel_post_norm)) / √2
//!   o    = r + norm(W_down · (gelu(topk(W_gate · f)) ⊙ W_up · f), post_ffw_norm),   f = norm(r, ffn_norm)
//!   q_j  = p_j + (W_corr · route(o) + 1)_j · (o − p_0)
//!   h    = [q_0, q_j + norm(W_proj · (gelu(W_gate_pl · (q_0 ⊙ s)) ⊙ pli[l]), post_norm)]
//! logits = cap(E · norm(mean(h_0, rescale(W_unembd[0..3] · h_1..3, to h_0)), output_norm))
//! ```
//! `rescale(y, to x) = y · rms(x) / max(rms(y), √1e-5)`; `topk(g) = relu(g −
//! mean(g) − k · std(g))` with `k = Φ⁻¹(p)`; attention has RMS-normed query
//! and key heads, value heads normed without a weight, NeoX RoPE (each
//! layer type its own) and no `1/√d` scale.
//!
//! Where llama.cpp and transformers differ, kiln computes transformers'
//! numbers from either source: the population standard deviation in
//! `topk` (llama.cpp divides by `n − 1`) and the floor under AltUp's
//! magnitudes (llama.cpp has none). GGUF files lack what llama.cpp
//! hard-codes, and their defaults are its: 20 layers with their own keys
//! and values, sparsity 0.95 on the first 10, every 5th layer global, a
//! local rope base of 10000.

use super::blocks::{
    last_row, merge_heads, split_heads, Activation, GatedFfn, Head, Layer, LayerCache, LayerKv, Positional,
};
use super::config::{self, Dims, GgufKeys, RopeConfig};
use super::decoder::DecoderConfig;
use super::hf::HfNames;
use super::{linear_each, CacheSpec, Checkpoint, Decoder, KvCache, Logits, ModelError, Result, Span, Weight};
use crate::graph::{ComparisonDirection, ReduceKind, TensorType};
use crate::trace::nn::{attention, RopeScaling};
use crate::trace::{Tensor, Tracer};
use crate::weights::gguf::{Gguf, MetadataValue};
use crate::weights::hf_config::HfConfig;
use serde::Deserialize;
use std::f64::consts::FRAC_1_SQRT_2;

/// AltUp's streams: the one the layers compute on and three predicted from
/// it. llama.cpp's converter supports only 4, and so does kiln.
pub const ALTUP_INPUTS: usize = 4;

/// llama.cpp's `n_layer_kv_from_start`: GGUF files without
/// `attention.shared_kv_layers` share keys and values from layer 20 on.
const KV_LAYERS_FROM_START: usize = 20;

/// llama.cpp's `n_layer_sparsity` and `f_sparsity_std_mul` (its constant
/// for `Φ⁻¹(0.95)`), for GGUF files without `activation_sparsity_scale`.
const SPARSE_LAYERS: usize = 10;
const SPARSITY_STD_MUL: f64 = 1.6448533535003662;

/// Every 5th layer is global unless the checkpoint says otherwise.
const SLIDING_WINDOW_PATTERN: usize = 5;

/// transformers' floor under the mean square of an AltUp projection before
/// its magnitude is matched.
const MAGNITUDE_FLOOR: f64 = 1e-5;

/// Hyper-parameters, from GGUF metadata under llama.cpp's key names, or
/// from HF's `config.json` ([`Config::from_hf`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The sizes (`D` is `embedding_length`, `L` `block_count`).
    pub dims: Dims,
    /// `gemma3n.feed_forward_length`, per layer
    pub feed_forward_length: Vec<usize>,
    /// Rows of `per_layer_token_embd.weight`: the vocabulary in GGUF, HF's
    /// `vocab_size_per_layer_input`; tokens past it read row 0, as in
    /// transformers.
    pub per_layer_vocab_size: usize,
    /// `gemma3n.embedding_length_per_layer_input`: `P`
    pub per_layer_input: usize,
    /// Rank of the LAuReL branch (GGUF: the rows of `blk.0.laurel_l.weight`)
    pub laurel_rank: usize,
    /// `gemma3n.attention.sliding_window`
    pub sliding_window: usize,
    /// Per layer, whether it attends within the window.
    pub sliding: Vec<bool>,
    /// `gemma3n.attention.shared_kv_layers`: the last layers, which read
    /// the keys and values of the last earlier layer of their type.
    pub shared_kv_layers: usize,
    /// `gemma3n.activation_sparsity_scale`: per layer, `k` of the
    /// feed-forward's Gaussian top-k, or `None` for a dense layer.
    pub sparsity: Vec<Option<f64>>,
    /// The global layers' rope: `rope.freq_base` and `rope.scaling.*`.
    pub rope: RopeConfig,
    /// The local layers' rope: `rope.freq_base_swa` (10000 when absent).
    pub local_rope: RopeConfig,
    /// `gemma3n.final_logit_softcapping`
    pub final_logit_softcapping: Option<f64>,
    /// GGUF stacks each kind of AltUp projection into one `[3, D, D]`
    /// tensor (`altup_proj.weight`); HF keeps three (`altup_proj.{i}.weight`
    /// in the names the front-end asks for).
    pub altup_stacked: bool,
}

/// HF's `intermediate_size` or `activation_sparsity_pattern`: one value for
/// every layer, or one per layer.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrEach<T> {
    // First: a value of any JSON type would take an array as `One`.
    Each(Vec<T>),
    One(T),
}

impl Config {
    /// From a Hugging Face `config.json`: `model_type` gemma3n_text
    /// (`Gemma3nForCausalLM`), or gemma3n (`Gemma3nForConditionalGeneration`,
    /// whose `text_config` is read and whose vision and audio towers are not
    /// exported: their tokens, from the towers' `vocab_offset` on, never
    /// come from text). Defaults are `Gemma3nTextConfig`'s.
    pub fn from_hf(hf: &HfConfig) -> Result<Config> {
        let (keys, wrapper) = config::text_config(hf, "gemma3n_text", "gemma3n")?;
        let block_count = keys.count_or("num_hidden_layers", 35)?;
        keys.fixed("hidden_activation", "\"gelu_pytorch_tanh\"", "Gemma's GeGLU")?;
        keys.fixed("attention_bias", "false", "attention projections without biases")?;
        keys.fixed("altup_num_inputs", "4", "4 AltUp streams, as llama.cpp's converter writes")?;
        keys.fixed("altup_active_idx", "0", "transformers corrects the streams after the first")?;
        keys.fixed("altup_correct_scale", "true", "llama.cpp always scales the corrected stream")?;
        // A training-time clamp, a learning rate, and a key transformers'
        // Gemma 3n does not read (its attention is unscaled).
        keys.ignore(&["max_position_embeddings", "altup_coef_clip", "altup_lr_multiplier", "query_pre_attn_scalar"]);
        let per_layer = |key: &str, value: OneOrEach<serde_json::Value>| -> Result<Vec<serde_json::Value>> {
            match value {
                OneOrEach::One(v) => Ok(vec![v; block_count]),
                OneOrEach::Each(v) if v.len() == block_count => Ok(v),
                OneOrEach::Each(v) => Err(keys.error(
                    key,
                    &serde_json::json!(v),
                    format!("must have {block_count} entries, one per layer"),
                )),
            }
        };
        let widths = match keys.get("intermediate_size")? {
            None => vec![serde_json::json!(16_384); block_count],
            Some(v) => per_layer("intermediate_size", v)?,
        };
        let feed_forward_length = widths
            .iter()
            .map(|w| w.as_u64().filter(|&n| n > 0).map(|n| n as usize))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| keys.error("intermediate_size", &serde_json::json!(widths), "must be positive integers"))?;
        let pattern = match keys.get("activation_sparsity_pattern")? {
            // transformers' default: the first 10 of more than 10 layers.
            None => (0..block_count)
                .map(|i| serde_json::json!(if block_count > 10 && i < 10 { 0.95 } else { 0.0 }))
                .collect(),
            Some(v) => per_layer("activation_sparsity_pattern", v)?,
        };
        let sparsity = pattern
            .iter()
            .map(|p| match p.as_f64() {
                Some(0.0) => Ok(None),
                Some(p) if p > 0.0 && p < 1.0 => Ok(Some(normal_quantile(p))),
                _ => Err(keys.error(
                    "activation_sparsity_pattern",
                    p,
                    "each entry must be in [0, 1): 0 for a dense layer",
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        let sliding_window = match keys.has("sliding_window") {
            false => 512,
            true => match keys.get::<usize>("sliding_window")? {
                Some(w) => keys.positive("sliding_window", w)?,
                None => {
                    return Err(keys.error(
                        "sliding_window",
                        &serde_json::Value::Null,
                        "kiln needs a window for the sliding_attention layers",
                    ))
                }
            },
        };
        let final_logit_softcapping = match keys.has("final_logit_softcapping") {
            false => Some(30.0),
            true => keys
                .get::<f64>("final_logit_softcapping")?
                .map(|_| keys.positive_f64("final_logit_softcapping", None))
                .transpose()?,
        };
        let (rope, local_rope) = config::layer_type_ropes(&keys, 1_000_000.0, 10_000.0)?;
        let config = Config {
            dims: Dims {
                block_count,
                embedding_length: keys.count_or("hidden_size", 2048)?,
                head_count: keys.count_or("num_attention_heads", 8)?,
                head_count_kv: keys.count_or("num_key_value_heads", 2)?,
                head_dim: keys.count_or("head_dim", 256)?,
                vocab_size: keys.count_or("vocab_size", 262_400)?,
                rms_norm_eps: keys.positive_f64("rms_norm_eps", Some(1e-6))?,
            },
            feed_forward_length,
            per_layer_vocab_size: keys.count_or("vocab_size_per_layer_input", 262_144)?,
            per_layer_input: keys.count_or("hidden_size_per_layer_input", 256)?,
            laurel_rank: keys.count_or("laurel_rank", 64)?,
            shared_kv_layers: keys.or("num_kv_shared_layers", 15)?,
            sparsity,
            rope,
            local_rope,
            sliding_window,
            sliding: config::layer_types(&keys, block_count)?
                .unwrap_or_else(|| config::every_nth_global(block_count, SLIDING_WINDOW_PATTERN)),
            final_logit_softcapping,
            altup_stacked: false,
        };
        // Read by SafetensorsWeights, through HfConfig::tie_word_embeddings.
        keys.get::<bool>("tie_word_embeddings")?;
        keys.finish()?;
        if let Some(w) = &wrapper {
            // The towers and their soft tokens, which text prompts never reach.
            w.ignore(&["vision_config", "audio_config", "audio_soft_tokens_per_image", "vision_soft_tokens_per_image"]);
            w.ignore(&[
                "boi_token_id",
                "eoi_token_id",
                "image_token_id",
                "boa_token_id",
                "eoa_token_id",
                "audio_token_id",
            ]);
            w.get::<bool>("tie_word_embeddings")?;
            w.finish()?;
        }
        fn hf_key(key: &str) -> &str {
            match key {
                "attention.shared_kv_layers" => "num_kv_shared_layers",
                key => config::hf_name(key),
            }
        }
        config.check(|key, value: usize, message| keys.error(hf_key(key), &value.into(), message))
    }

    /// Reads the `gemma3n.*` keys, each one used, listed as not changing the
    /// forward pass, or refused ([`GgufKeys::finish`]).
    pub fn from_gguf<D: AsRef<[u8]> + ?Sized>(gguf: &Gguf<D>) -> Result<Config> {
        let keys = GgufKeys::of_arch(gguf, "gemma3n")?;
        keys.fixed("altup.num_inputs", ALTUP_INPUTS as f64, "4 AltUp streams, as llama.cpp's converter writes")?;
        keys.fixed("altup.active_idx", 0.0, "transformers corrects the streams after the first")?;
        let (block_count, width, heads) =
            (keys.count("block_count")?, keys.count("embedding_length")?, keys.count("attention.head_count")?);
        let head_dim = keys.int_or("attention.key_length", width / heads)?;
        config::head_dim_only(&keys, "attention.value_length", head_dim, "kiln needs values as wide as keys")?;
        config::full_rotary(&keys, head_dim)?;
        let positive = |v: &MetadataValue<'_>| v.as_u64().filter(|&n| n > 0).map(|n| n as usize);
        let feed_forward_length =
            config::per_block(&keys, "feed_forward_length", block_count, "widths", positive)?.ok_or_else(|| {
                ModelError::MissingConfigKey { file: "GGUF metadata".into(), key: keys.key("feed_forward_length") }
            })?;
        // -inf where a layer is dense (the converter's Φ⁻¹(0)); +inf or NaN would zero it.
        let scale = |v: &MetadataValue<'_>| v.as_f64().filter(|k| *k < f64::INFINITY);
        let sparsity = match config::per_block(&keys, "activation_sparsity_scale", block_count, "numbers", scale)? {
            Some(scales) => scales.into_iter().map(|k| k.is_finite().then_some(k)).collect(),
            None => (0..block_count).map(|i| (i < SPARSE_LAYERS).then_some(SPARSITY_STD_MUL)).collect(),
        };
        let scaling = match config::rope_from_gguf(&keys)? {
            RopeScaling::Yarn { .. } => {
                return Err(keys.error(
                    "rope.scaling.type",
                    "\"yarn\"",
                    "only linear rope scaling is supported for gemma3n",
                ))
            }
            scaling => scaling,
        };
        let laurel_l = gguf
            .tensor("blk.0.laurel_l.weight")
            .ok_or_else(|| ModelError::MissingTensor("blk.0.laurel_l.weight".into()))?;
        let vocab_size = config::vocab_size(&keys)?;
        let config = Config {
            dims: Dims {
                block_count,
                embedding_length: width,
                head_count: heads,
                head_count_kv: keys.int_or("attention.head_count_kv", heads)?,
                head_dim,
                vocab_size,
                rms_norm_eps: keys.positive_f64("attention.layer_norm_rms_epsilon", None)?,
            },
            feed_forward_length,
            per_layer_vocab_size: vocab_size,
            per_layer_input: keys.count("embedding_length_per_layer_input")?,
            laurel_rank: laurel_l.shape()[0],
            shared_kv_layers: keys
                .int_or("attention.shared_kv_layers", block_count.saturating_sub(KV_LAYERS_FROM_START))?,
            sparsity,
            rope: RopeConfig { theta: keys.positive_f64("rope.freq_base", Some(10_000.0))?, scaling },
            local_rope: RopeConfig {
                theta: keys.positive_f64("rope.freq_base_swa", Some(10_000.0))?,
                scaling: RopeScaling::None,
            },
            sliding_window: keys.count("attention.sliding_window")?,
            sliding: config::sliding_pattern(&keys, block_count, SLIDING_WINDOW_PATTERN)?,
            final_logit_softcapping: Some(keys.positive_f64("final_logit_softcapping", Some(30.0))?),
            altup_stacked: true,
        };
        keys.finish()?;
        config.check(|key, value, message| keys.error(key, value, message))
    }

    /// What both sources must satisfy: kv heads dividing the heads, even
    /// heads, and a layer of its own type before the shared ones for each
    /// shared layer to read. `error(key, value, message)` names the GGUF key
    /// in the source's own spelling.
    fn check(self, error: impl Fn(&str, usize, String) -> ModelError) -> Result<Config> {
        config::check_heads(&self.dims, "attention.key_length", &error)?;
        let shared = self.shared_kv_layers;
        if shared >= self.dims.block_count {
            return Err(error(
                "attention.shared_kv_layers",
                shared,
                format!("leaves none of the {} layers computing keys and values", self.dims.block_count),
            ));
        }
        if let Some(i) = (self.kv_layers()..self.dims.block_count).find(|&i| self.kv_source(i).is_none()) {
            let kind = if self.sliding[i] { "sliding" } else { "global" };
            return Err(error(
                "attention.shared_kv_layers",
                shared,
                format!("layer {i} ({kind}) has no {kind} layer before the shared ones to read keys and values from"),
            ));
        }
        Ok(self)
    }

    /// The layers that compute keys and values: the first ones, each with
    /// its own slice of the KV cache.
    pub fn kv_layers(&self) -> usize {
        self.dims.block_count - self.shared_kv_layers
    }

    /// The layer whose keys and values layer `i` attends to: itself, or for
    /// a shared layer the last layer of its type that computes its own.
    pub fn kv_source(&self, i: usize) -> Option<usize> {
        match i < self.kv_layers() {
            true => Some(i),
            false => (0..self.kv_layers()).rev().find(|&j| self.sliding[j] == self.sliding[i]),
        }
    }
}

/// `Φ⁻¹(p)`, the standard normal quantile, to about 1e-9 (Acklam's
/// rational approximation): transformers' `Normal(0, 1).icdf(p)`, which
/// rounds to f32.
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.38357751867269e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] =
        [-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
    let poly = |c: &[f64], x: f64| c.iter().fold(0.0, |acc, &k| acc * x + k);
    let tail = |q: f64| poly(&C, q) / (poly(&D, q) * q + 1.0);
    match p {
        p if p < 0.02425 => tail((-2.0 * p.ln()).sqrt()),
        p if p > 1.0 - 0.02425 => -tail((-2.0 * (1.0 - p).ln()).sqrt()),
        p => {
            let (q, r) = (p - 0.5, (p - 0.5) * (p - 0.5));
            poly(&A, r) * q / (poly(&B, r) * r + 1.0)
        }
    }
}

/// `x · value` for a constant `value`.
fn scale<'t>(x: &Tensor<'t>, value: f64) -> Result<Tensor<'t>> {
    Ok(x.multiply(&x.tracer().constant(value, x.ty.clone())?)?)
}

/// `rms(x) = √mean(x²)` over the last dim (the mean square at least
/// `floor`): `x [seq, D]` -> `[seq]`.
fn magnitude<'t>(x: &Tensor<'t>, floor: Option<f64>) -> Result<Tensor<'t>> {
    let last = x.ty.rank() - 1;
    let mean_square = scale(&x.multiply(x)?.reduce(ReduceKind::Sum, &[last])?, 1.0 / x.ty.shape[last] as f64)?;
    let mean_square = match floor {
        Some(floor) => mean_square.maximum(&mean_square.tracer().constant(floor, mean_square.ty.clone())?)?,
        None => mean_square,
    };
    Ok(mean_square.sqrt()?)
}

/// The AltUp streams, `[seq, D]` each. They stay four tensors rather than
/// one `[seq, 4, D]`: iree-compile 3.13 exceeds its stack allocation limit
/// on a matrix product whose input is a strided slice of `?` rows.
type Streams<'t> = Vec<Tensor<'t>>;

/// Column `j` of `c [seq, n]`, broadcast over the `[seq, D]` of `like`.
fn column<'t>(c: &Tensor<'t>, j: usize, like: &Tensor<'t>) -> Result<Tensor<'t>> {
    let seq = c.ty.shape[0];
    let col = c.slice(&[0, j], &[seq, j + 1], &[1, 1])?.reshape(&[seq])?;
    Ok(col.broadcast_in_dim(&like.ty.shape, &[0])?)
}

/// The three AltUp projections of one kind (into the streams, or back
/// out): GGUF's one `[3, D, D]` tensor, or HF's three `[D, D]` ones.
fn projections<'t>(t: &'t Tracer, weights: &dyn Checkpoint, name: &str, c: &Config) -> Result<Vec<Weight<'t>>> {
    let (n, d) = (ALTUP_INPUTS - 1, c.dims.embedding_length);
    match c.altup_stacked {
        true => weights.load(t, &format!("{name}.weight"), &[n, d, d])?.row_blocks(n),
        false => (0..n).map(|i| weights.load(t, &format!("{name}.{i}.weight"), &[d, d])).collect(),
    }
}

/// The per-layer table `[V, L · P]` viewed as `[V · L, P]` (the same bytes):
/// row `tok · L + l` is token `tok`'s slice for layer `l`, so that each layer
/// gathers its own rows. Packed, a slice must be a whole number of blocks.
fn per_layer_view<'t>(table: Weight<'t>, c: &Config) -> Result<Weight<'t>> {
    let (rows, width) = (table.shape[0] * c.dims.block_count, c.per_layer_input);
    let raw = match table.packed {
        Some(ty) if !width.is_multiple_of(ty.block_size()) => {
            return Err(ModelError::Config(format!(
                "{}: {ty} blocks of {} values do not divide a layer's {width}",
                table.name,
                ty.block_size()
            )))
        }
        Some(_) => table.raw,
        None => table.raw.reshape(&[rows, width])?,
    };
    Ok(Weight { raw, shape: vec![rows, width], tiles: None, ..table })
}

/// `y [seq, D]` rescaled to `target [seq]`, the magnitude of the stream it
/// was projected from.
fn rescaled<'t>(y: &Tensor<'t>, target: &Tensor<'t>) -> Result<Tensor<'t>> {
    let per_token = |m: &Tensor<'t>| m.broadcast_in_dim(&y.ty.shape, &[0]);
    Ok(y.multiply(&per_token(target)?)?.divide(&per_token(&magnitude(y, Some(MAGNITUDE_FLOOR))?)?)?)
}

/// The AltUp stack's weights of one layer: its router, and the
/// coefficients that predict the streams before the layer and correct them
/// after it.
struct AltUp<'t> {
    altup_router_norm: Tensor<'t>,
    altup_router: Weight<'t>,
    /// The router norm's epsilon.
    eps: f64,
    /// `W_pred [16, 4]`.
    altup_predict_coef: Weight<'t>,
    /// `W_corr [4, 4]`.
    altup_correct_coef: Weight<'t>,
    /// `s [D]`, which scales the corrected first stream before the
    /// per-layer input's gate.
    altup_correct_scale: Tensor<'t>,
}

impl<'t> AltUp<'t> {
    /// `tanh(W_router · norm(x, w_rn) / D)`: `[seq, 4]` mixing weights.
    fn route(&self, x: &Tensor<'t>) -> Result<Tensor<'t>> {
        let normed = x.rms_norm(Some(&self.altup_router_norm), self.eps)?;
        Ok(self.altup_router.linear(&scale(&normed, 1.0 / x.ty.shape[1] as f64)?)?.tanh()?)
    }

    /// `p_j = h_j + Σ_k C[j, k] · h_k`, `C = W_pred · route(h_0)`: per
    /// token, element-wise.
    fn predict(&self, h: &Streams<'t>) -> Result<Streams<'t>> {
        let coefs = self.altup_predict_coef.linear(&self.route(&h[0])?)?;
        (0..ALTUP_INPUTS)
            .map(|j| {
                h.iter().enumerate().try_fold(h[j].clone(), |p, (k, h_k)| {
                    Ok(p.add(&column(&coefs, j * ALTUP_INPUTS + k, h_k)?.multiply(h_k)?)?)
                })
            })
            .collect()
    }

    /// `q_j = p_j + (W_corr · route(o) + 1)_j · (o − p_0)`: the layer's
    /// output `o` carried into every stream.
    fn correct(&self, p: &Streams<'t>, o: &Tensor<'t>) -> Result<Streams<'t>> {
        let coefs = self.altup_correct_coef.linear(&self.route(o)?)?;
        let coefs = coefs.add(&coefs.tracer().constant(1.0, coefs.ty.clone())?)?;
        let innovation = o.subtract(&p[0])?;
        p.iter().enumerate().map(|(j, p_j)| Ok(p_j.add(&column(&coefs, j, o)?.multiply(&innovation)?)?)).collect()
    }
}

/// Self-attention with normed heads and no `1/√d`: `W_o · softmax(rope(norm(W_q x)) ·
/// rope(norm(W_k x))ᵀ + mask) · norm(W_v x)`; a shared layer has no keys
/// and values of its own.
struct Attention<'t> {
    attn_q: Weight<'t>,
    attn_q_norm: Tensor<'t>,
    own: Option<KeyValue<'t>>,
    attn_output: Weight<'t>,
    head_count: usize,
    head_count_kv: usize,
    head_dim: usize,
    eps: f64,
}

/// A layer's key and value projections, and the norm of its key heads.
struct KeyValue<'t> {
    attn_k: Weight<'t>,
    attn_k_norm: Tensor<'t>,
    attn_v: Weight<'t>,
}

impl<'t> Attention<'t> {
    /// `x [seq, D]` -> `[seq, D]`, and the keys and values it attended to
    /// if it computed them (written into the cache first, if any); a shared
    /// layer attends to `shared`.
    fn forward(
        &self,
        x: &Tensor<'t>,
        at: &Positional<'t>,
        shared: Option<&LayerKv<'t>>,
        cache: LayerCache<'_, 't>,
    ) -> Result<(Tensor<'t>, Option<LayerKv<'t>>)> {
        let heads = |y: &Tensor<'t>, n: usize, norm: Option<&Tensor<'t>>| {
            split_heads(y, n, self.head_dim)?.rms_norm(norm, self.eps).map_err(ModelError::from)
        };
        let q = at.rotation.apply(&heads(&self.attn_q.linear(x)?, self.head_count, Some(&self.attn_q_norm))?)?;
        let computed = match &self.own {
            Some(kv) => {
                let [k, v]: [Tensor<'t>; 2] =
                    linear_each(&[&kv.attn_k, &kv.attn_v], x)?.try_into().expect("two products");
                let k = at.rotation.apply(&heads(&k, self.head_count_kv, Some(&kv.attn_k_norm))?)?;
                let v = heads(&v, self.head_count_kv, None)?;
                Some(at.visible.keys(k, v, cache)?)
            }
            None => None,
        };
        let kv = computed.as_ref().or(shared).ok_or_else(|| {
            ModelError::Config("a layer shares keys and values, but no layer before it computes them".into())
        })?;
        let a = attention(&q, &kv.keys, &kv.values, kv.mask.as_ref(), 1.0, None, None)?;
        Ok((self.attn_output.linear(&merge_heads(&a)?)?, computed))
    }
}

/// One layer's weights: attention, LAuReL, the sparse GeGLU feed-forward,
/// their norms, the per-layer input's gate and projection, and AltUp's.
struct Block<'t> {
    attn_norm: Tensor<'t>,
    attn: Attention<'t>,
    post_attention_norm: Tensor<'t>,
    laurel_l: Weight<'t>,
    laurel_r: Weight<'t>,
    laurel_post_norm: Tensor<'t>,
    ffn_norm: Tensor<'t>,
    ffn: GatedFfn<'t>,
    post_ffw_norm: Tensor<'t>,
    inp_gate: Weight<'t>,
    proj: Weight<'t>,
    post_norm: Tensor<'t>,
    altup: AltUp<'t>,
    eps: f64,
}

impl<'t> Block<'t> {
    fn load(l: &Layer<'_, 't>, i: usize, c: &Config) -> Result<Self> {
        let (d, ff, hd) = (c.dims.embedding_length, c.feed_forward_length[i], c.dims.head_dim);
        let (q_dim, kv_dim) = (c.dims.head_count * hd, c.dims.head_count_kv * hd);
        let (m, v) = (|name: &str, shape: &[usize]| l.weight(name, shape), |name: &str, len: usize| l.norm(name, len));
        let own = match c.kv_source(i) == Some(i) {
            true => Some(KeyValue {
                attn_k: m("attn_k", &[kv_dim, d])?,
                attn_k_norm: v("attn_k_norm", hd)?,
                attn_v: m("attn_v", &[kv_dim, d])?,
            }),
            false => None,
        };
        let eps = c.dims.rms_norm_eps;
        Ok(Block {
            attn_norm: v("attn_norm", d)?,
            attn: Attention {
                attn_q: m("attn_q", &[q_dim, d])?,
                attn_q_norm: v("attn_q_norm", hd)?,
                own,
                attn_output: m("attn_output", &[d, q_dim])?,
                head_count: c.dims.head_count,
                head_count_kv: c.dims.head_count_kv,
                head_dim: hd,
                eps,
            },
            post_attention_norm: v("post_attention_norm", d)?,
            laurel_l: m("laurel_l", &[c.laurel_rank, d])?,
            laurel_r: m("laurel_r", &[d, c.laurel_rank])?,
            laurel_post_norm: v("laurel_post_norm", d)?,
            ffn_norm: v("ffn_norm", d)?,
            ffn: GatedFfn::load(l, d, ff, Activation::GeluTanh)?.sparse(c.sparsity[i]),
            post_ffw_norm: v("post_ffw_norm", d)?,
            inp_gate: m("inp_gate", &[c.per_layer_input, d])?,
            proj: m("proj", &[d, c.per_layer_input])?,
            post_norm: v("post_norm", d)?,
            altup: AltUp {
                altup_router_norm: v("altup_router_norm", d)?,
                altup_router: m("altup_router", &[ALTUP_INPUTS, d])?,
                eps,
                altup_predict_coef: m("altup_predict_coef", &[ALTUP_INPUTS * ALTUP_INPUTS, ALTUP_INPUTS])?,
                altup_correct_coef: m("altup_correct_coef", &[ALTUP_INPUTS, ALTUP_INPUTS])?,
                altup_correct_scale: v("altup_correct_scale", d)?,
            },
            eps,
        })
    }

    /// The streams through the layer, with this layer's per-layer input
    /// `pli [seq, P]`; also the keys and values it computed.
    fn forward(
        &self,
        h: &Streams<'t>,
        pli: &Tensor<'t>,
        at: &Positional<'t>,
        shared: Option<&LayerKv<'t>>,
        cache: LayerCache<'_, 't>,
    ) -> Result<(Streams<'t>, Option<LayerKv<'t>>)> {
        let norm = |y: &Tensor<'t>, w: &Tensor<'t>| y.rms_norm(Some(w), self.eps).map_err(ModelError::from);
        let p = self.altup.predict(h)?;
        let x = norm(&p[0], &self.attn_norm)?;
        let laurel = x.add(&norm(&self.laurel_r.linear(&self.laurel_l.linear(&x)?)?, &self.laurel_post_norm)?)?;
        let (attn, kv) = self.attn.forward(&x, at, shared, cache)?;
        let r = scale(&p[0].add(&norm(&attn, &self.post_attention_norm)?)?.add(&laurel)?, FRAC_1_SQRT_2)?;
        let o = r.add(&norm(&self.ffn.forward(&norm(&r, &self.ffn_norm)?)?, &self.post_ffw_norm)?)?;
        let mut q = self.altup.correct(&p, &o)?;
        // The per-layer input, gated by the corrected first stream, goes to
        // the other three.
        let correct_scale = self.altup.altup_correct_scale.broadcast_in_dim(&o.ty.shape, &[1])?;
        let gated = self.inp_gate.linear(&q[0].multiply(&correct_scale)?)?;
        let z = norm(&self.proj.linear(&gated.gelu_tanh()?.multiply(pli)?)?, &self.post_norm)?;
        for q_j in &mut q[1..] {
            *q_j = q_j.add(&z)?;
        }
        Ok((q, kv))
    }
}

/// The whole model: embeddings (the token's and its per-layer ones), the
/// AltUp projections in and out, the layers, and the tied head.
pub struct Gemma3n<'t> {
    tracer: &'t Tracer,
    /// The hyper-parameters the model was loaded with.
    pub config: Config,
    token_embd: Weight<'t>,
    head: Head<'t>,
    /// `[V · L, P]`: row `tok · L + l` is token `tok`'s input to layer `l`.
    per_layer_token_embd: Weight<'t>,
    /// Per layer, its `[P, D]` rows of `W_plm`.
    per_layer_model_proj: Vec<Weight<'t>>,
    per_layer_proj_norm: Tensor<'t>,
    altup_proj: Vec<Weight<'t>>,
    altup_unembd_proj: Vec<Weight<'t>>,
    blocks: Vec<Block<'t>>,
}

impl<'t> Gemma3n<'t> {
    /// Declares every weight in `t`, checking each shape against `config`.
    pub fn load(t: &'t Tracer, config: &Config, weights: &dyn Checkpoint) -> Result<Self> {
        let (d, per_layer) = (config.dims.embedding_length, config.dims.block_count * config.per_layer_input);
        let token_embd = weights.load(t, "token_embd.weight", &[config.dims.vocab_size, d])?;
        let per_layer_rows = [config.per_layer_vocab_size, per_layer];
        Ok(Gemma3n {
            tracer: t,
            head: Head::load(t, weights, &token_embd, config.dims.rms_norm_eps, false)?,
            per_layer_token_embd: per_layer_view(
                weights.load(t, "per_layer_token_embd.weight", &per_layer_rows)?,
                config,
            )?,
            per_layer_model_proj: weights
                .load(t, "per_layer_model_proj.weight", &[per_layer, d])?
                .row_blocks(config.dims.block_count)?,
            per_layer_proj_norm: weights.load(t, "per_layer_proj_norm.weight", &[config.per_layer_input])?.f32()?,
            altup_proj: projections(t, weights, "altup_proj", config)?,
            altup_unembd_proj: projections(t, weights, "altup_unembd_proj", config)?,
            blocks: (0..config.dims.block_count)
                .map(|i| Block::load(&Layer::new(t, weights, i, false), i, config))
                .collect::<Result<_>>()?,
            token_embd,
            config: config.clone(),
        })
    }

    /// Layer `l`'s input `(norm(W_plm[l] · e / √D, w_pln) + E_pl[tok][l] · √P)
    /// / √2` `[seq, P]`, from the tokens and their scaled embeddings `e [seq,
    /// D]`. Each layer gathers its own rows of the table and projects with its
    /// own rows of `W_plm`: with one `[seq, L, P]` result sliced per layer
    /// instead, iree-compile 3.13 fails on the strided slice in the gate's
    /// product ("large vector sizes") once `P` is 256. A packed table
    /// dequantizes only the gathered rows ([`Weight::rows`]).
    fn per_layer_input(&self, l: usize, tokens: &Tensor<'t>, e: &Tensor<'t>) -> Result<Tensor<'t>> {
        let c = &self.config;
        let constant = |v: usize| self.tracer.constant(v as f64, tokens.ty.clone());
        // transformers reads row 0 for tokens past the table (E2B's 256 soft tokens).
        let ids = match c.per_layer_vocab_size < c.dims.vocab_size {
            true => {
                let in_table = tokens.compare(ComparisonDirection::Lt, &constant(c.per_layer_vocab_size)?)?;
                in_table.select(tokens, &constant(0)?)?
            }
            false => tokens.clone(),
        };
        let row = ids.multiply(&constant(c.dims.block_count)?)?.add(&constant(l)?)?;
        let table = scale(&self.per_layer_token_embd.rows(&row)?, (c.per_layer_input as f64).sqrt())?;
        let projected = scale(&self.per_layer_model_proj[l].linear(e)?, 1.0 / (c.dims.embedding_length as f64).sqrt())?;
        let projected = projected.rms_norm(Some(&self.per_layer_proj_norm), c.dims.rms_norm_eps)?;
        scale(&projected.add(&table)?, FRAC_1_SQRT_2)
    }

    /// The four streams: `e`, and its three projections at `e`'s magnitude.
    fn streams(&self, e: &Tensor<'t>) -> Result<Streams<'t>> {
        let target = magnitude(e, None)?;
        let projected = self.altup_proj.iter().map(|w| rescaled(&w.linear(e)?, &target));
        std::iter::once(Ok(e.clone())).chain(projected).collect()
    }

    /// The streams' mean, the last three projected back at the first's
    /// magnitude: `[seq, D]`.
    fn merge(&self, h: &Streams<'t>) -> Result<Tensor<'t>> {
        let target = magnitude(&h[0], None)?;
        let sum = self.altup_unembd_proj.iter().zip(&h[1..]).try_fold(h[0].clone(), |sum, (w, h_i)| {
            Ok::<_, ModelError>(sum.add(&rescaled(&w.linear(h_i)?, &target)?)?)
        })?;
        scale(&sum, 1.0 / ALTUP_INPUTS as f64)
    }
}

/// The whole-model tensors of an HF checkpoint besides llama's. GGUF stacks the three
/// AltUp projections of each kind into one `[3, D, D]` tensor; HF keeps
/// three, which the front-end asks for as `altup_proj.{i}.weight`.
const HF_NAMES_EXTRA: [(&str, &str); 9] = [
    ("per_layer_token_embd.weight", "embed_tokens_per_layer.weight"),
    ("per_layer_model_proj.weight", "per_layer_model_projection.weight"),
    ("per_layer_proj_norm.weight", "per_layer_projection_norm.weight"),
    ("altup_proj.0.weight", "altup_projections.0.weight"),
    ("altup_proj.1.weight", "altup_projections.1.weight"),
    ("altup_proj.2.weight", "altup_projections.2.weight"),
    ("altup_unembd_proj.0.weight", "altup_unembed_projections.0.weight"),
    ("altup_unembd_proj.1.weight", "altup_unembed_projections.1.weight"),
    ("altup_unembd_proj.2.weight", "altup_unembed_projections.2.weight"),
];

/// The per-block tensors of an HF checkpoint besides Gemma 3's: the per-layer input,
/// AltUp and LAuReL.
const HF_BLOCK_NAMES: [(&str, &str); 11] = [
    ("inp_gate.weight", "per_layer_input_gate.weight"),
    ("proj.weight", "per_layer_projection.weight"),
    ("post_norm.weight", "post_per_layer_input_norm.weight"),
    ("altup_correct_coef.weight", "altup.correction_coefs.weight"),
    ("altup_correct_scale.weight", "altup.correct_output_scale"),
    ("altup_predict_coef.weight", "altup.prediction_coefs.weight"),
    ("altup_router.weight", "altup.modality_router.weight"),
    ("altup_router_norm.weight", "altup.router_norm.weight"),
    ("laurel_l.weight", "laurel.linear_left.weight"),
    ("laurel_r.weight", "laurel.linear_right.weight"),
    ("laurel_post_norm.weight", "laurel.post_laurel_norm.weight"),
];

/// Where an HF checkpoint keeps the tensors ([`super::registry`]'s row):
/// a `Gemma3nForCausalLM` as llama does, a `Gemma3nForConditionalGeneration`
/// under `model.language_model.`, next to its vision and audio towers.
pub fn hf_names(config: &HfConfig, _: &dyn Fn(&str) -> bool) -> HfNames {
    let names = HfNames {
        family: "gemma3n",
        names: &HF_NAMES_EXTRA,
        block_names: &[&super::gemma3::HF_BLOCK_NAMES, &HF_BLOCK_NAMES],
        ..HfNames::DECODER
    };
    match config.model_type.as_str() {
        "gemma3n" => HfNames { body: "model.language_model.", ..names },
        _ => names,
    }
}

impl DecoderConfig for Config {
    fn name(&self) -> &str {
        "gemma3n"
    }

    /// The shared layers' key and value tensors, which llama.cpp's loader
    /// requires and older checkpoints hold, though nothing reads them.
    fn unread_tensors(&self) -> Vec<String> {
        let names = ["attn_k.weight", "attn_v.weight", "attn_k_norm.weight"];
        (self.kv_layers()..self.dims.block_count).flat_map(|i| names.map(|n| format!("blk.{i}.{n}"))).collect()
    }

    fn load<'t>(&self, t: &'t Tracer, weights: &dyn Checkpoint) -> Result<Box<dyn Decoder<'t> + 't>> {
        Ok(Box::new(Gemma3n::load(t, self, weights)?))
    }
}

impl<'t> Decoder<'t> for Gemma3n<'t> {
    fn dims(&self) -> &Dims {
        &self.config.dims
    }

    /// Only the layers that compute keys and values have a slice.
    fn cache_types(&self, cache: CacheSpec) -> (TensorType, TensorType) {
        let d = &self.config.dims;
        let ty =
            TensorType::new([self.config.kv_layers(), d.head_count_kv, cache.max_context, d.head_dim], cache.dtype);
        (ty.clone(), ty)
    }

    fn hidden(&self, tokens: &Tensor<'t>, at: Span<'_, 't>, mut cache: Option<&mut KvCache<'t>>) -> Result<Tensor<'t>> {
        let c = &self.config;
        let global = Positional::neox(c.rope, c.dims.head_dim, &at, None)?;
        let local = Positional::neox(c.local_rope, c.dims.head_dim, &at, Some(c.sliding_window))?;
        // The embedding is scaled in f32, as llama.cpp does (HF rounds √D
        // to the weights' dtype first).
        let e = scale(&self.token_embd.rows(tokens)?, (c.dims.embedding_length as f64).sqrt())?;
        let mut h = self.streams(&e)?;
        // The keys and values the shared layers read: the last computed by
        // a global layer and by a local one.
        let mut last_kv: [Option<LayerKv<'t>>; 2] = [None, None];
        for (i, block) in self.blocks.iter().enumerate() {
            let sliding = c.sliding[i];
            let pli = self.per_layer_input(i, tokens, &e)?;
            let layer_cache = cache.as_deref_mut().map(|cache| (cache, i));
            let at = if sliding { &local } else { &global };
            let (next, kv) = block.forward(&h, &pli, at, last_kv[sliding as usize].as_ref(), layer_cache)?;
            if kv.is_some() {
                last_kv[sliding as usize] = kv;
            }
            h = next;
        }
        // The last position's rows of the streams before they merge: the
        // merge reduces over each row, and a slice after it fuses into that
        // reduction as a 256 KiB stack buffer per dispatch, past IREE's limit.
        let h = match at.logits {
            Logits::Every => h,
            Logits::Last => h.iter().map(last_row).collect::<Result<Streams<'t>>>()?,
        };
        self.merge(&h)
    }

    fn logits(&self, hidden: &Tensor<'t>) -> Result<Tensor<'t>> {
        let logits = self.head.forward(hidden)?;
        Ok(match self.config.final_logit_softcapping {
            Some(cap) => logits.soft_cap(cap)?,
            None => logits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{DType, Graph, Node, Op, ValueId, DYNAMIC};
    use crate::interp;
    use crate::max_abs_diff;
    use crate::models::hf::{HfCheckpoint, SafetensorsWeights};
    use crate::models::synth::{self, Preset, SynthData};
    use crate::models::{token_ids, Family, GgufWeights, PackedPolicy, Serving};
    use crate::weights::gguf_writer::{GgufWriter, TensorData, Value};
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};

    /// The fixtures of test/models/transformers_reference.py.
    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("test/models/transformers").join(name)
    }

    const PROMPT: [u32; 12] = [1, 7, 3, 12, 5, 9, 2, 14, 6, 11, 4, 13];

    /// The interpreter's logits at every position of the checkpoint (the
    /// no-cache prefill), against transformers'.
    fn interpreter_diff(family: &Family, weights: &dyn Checkpoint, reference: &Path) -> f64 {
        let graph = crate::models::prefill(family, weights, PROMPT.len()).unwrap();
        let got = interp::run(&graph, &[token_ids(&PROMPT)], weights).unwrap().remove(0).to_f64_vec();
        max_abs_diff(&got, &crate::npy::read(reference).unwrap().to_f64_vec())
    }

    /// Metadata keys to set, or to remove (`None`).
    type MetaEdits<'a> = [(&'a str, Option<Value>)];

    /// The tiny GGUF of test/models/gemma3n_to_gguf.py with `meta` keys set
    /// (or removed) and the tensor `drop` left out.
    fn edited(meta: &MetaEdits, drop: Option<&str>) -> Gguf<Vec<u8>> {
        let source = Gguf::open(&fixture("gemma3n/gemma3n.gguf")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edited.gguf");
        let mut w = GgufWriter::new(&path);
        for (key, value) in source.metadata().filter(|(k, _)| !meta.iter().any(|(m, _)| m == k)) {
            w.add(key, value).unwrap();
        }
        for (key, value) in meta {
            if let Some(value) = value {
                w.add(key, value.clone()).unwrap();
            }
        }
        let kept: Vec<_> = source.tensors().filter(|t| Some(t.name) != drop).collect();
        for t in &kept {
            w.add_tensor(t.name, &t.shape(), t.ggml_type).unwrap();
        }
        w.write_data(|i| TensorData::Bytes(kept[i].data)).unwrap();
        Gguf::parse(std::fs::read(&path).unwrap()).unwrap()
    }

    fn gguf_error(meta: &MetaEdits, drop: Option<&str>) -> String {
        let gguf = edited(meta, drop);
        let weights = GgufWeights::new(&gguf, PackedPolicy::Fail).unwrap();
        let refused = Family::from_gguf(&gguf).and_then(|family| Serving::new(&family, &weights, 16).map(|_| ()));
        refused.expect_err("refused").to_string()
    }

    /// What kiln does not compute is refused, naming the key or tensor.
    #[test]
    fn gguf_gemma3n_refusals_name_the_culprit() {
        let refused: [(&MetaEdits, Option<&str>, &str); 8] = [
            (
                &[("gemma3n.altup.num_inputs", Some(Value::U32(3)))],
                None,
                "gemma3n.altup.num_inputs = 3: kiln supports only 4",
            ),
            (
                &[("gemma3n.altup.active_idx", Some(Value::U32(1)))],
                None,
                "gemma3n.altup.active_idx = 1: kiln supports only 0",
            ),
            (&[], Some("blk.1.inp_gate.weight"), "tensor \"blk.1.inp_gate.weight\" is missing"),
            (&[], Some("altup_unembd_proj.weight"), "tensor \"altup_unembd_proj.weight\" is missing"),
            (
                &[("gemma3n.embedding_length_per_layer_input", Some(Value::U32(4)))],
                None,
                "tensor \"per_layer_token_embd.weight\" has shape [16, 48], the config needs [16, 24]",
            ),
            (
                &[("gemma3n.activation_sparsity_scale", Some(Value::f32s([1.6; 5])))],
                None,
                "gemma3n.activation_sparsity_scale = [5 values]: must be 6 numbers, one per block",
            ),
            (
                &[("gemma3n.attention.shared_kv_layers", Some(Value::U32(5)))],
                None,
                "gemma3n.attention.shared_kv_layers = 5: layer 1 (global) has no global layer before the shared ones",
            ),
            (&[("gemma3n.expert_count", Some(Value::U32(4)))], None, "gemma3n.expert_count = 4: mixture-of-experts"),
        ];
        for (meta, drop, needle) in refused {
            let e = gguf_error(meta, drop);
            assert!(e.contains(needle), "'{e}' should contain '{needle}'");
        }
    }

    /// Older converters' files: without the keys llama.cpp hard-codes, its
    /// defaults apply.
    #[test]
    fn gguf_gemma3n_defaults_are_llama_cpp_s() {
        let keys = [
            "activation_sparsity_scale",
            "attention.sliding_window_pattern",
            "rope.freq_base_swa",
            "attention.shared_kv_layers",
        ];
        let meta: Vec<(String, Option<Value>)> = keys.iter().map(|k| (format!("gemma3n.{k}"), None)).collect();
        let meta: Vec<(&str, Option<Value>)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let c = Config::from_gguf(&edited(&meta, None)).unwrap();
        assert_eq!(c.sparsity, vec![Some(SPARSITY_STD_MUL); 6], "the first 10 layers sparse");
        assert_eq!(c.sliding, [true, true, true, true, false, true], "every 5th layer global");
        assert_eq!(
            (c.local_rope.theta, c.shared_kv_layers),
            (10_000.0, 0),
            "20 layers from the start compute their KV"
        );
    }

    /// GGUF (converted by llama.cpp's rules) and HF read to the same model.
    #[test]
    fn gguf_and_hf_configs_agree() {
        let gguf = Config::from_gguf(&Gguf::open(&fixture("gemma3n/gemma3n.gguf")).unwrap()).unwrap();
        let hf = Config::from_hf(&HfConfig::open(&fixture("gemma3n/config.json")).unwrap()).unwrap();
        // Φ⁻¹(0.95) and ε are f32 in the GGUF, f64 from config.json; the
        // GGUF stacks the AltUp projections.
        let k = |c: &Config| c.sparsity.iter().map(|k| k.map(|k| (k * 1e6).round())).collect::<Vec<_>>();
        assert_eq!((k(&gguf), gguf.dims.rms_norm_eps as f32), (k(&hf), hf.dims.rms_norm_eps as f32));
        let same = Config {
            sparsity: hf.sparsity.clone(),
            dims: Dims { rms_norm_eps: hf.dims.rms_norm_eps, ..gguf.dims },
            altup_stacked: false,
            ..gguf
        };
        assert_eq!(same, hf);
        assert_eq!((hf.feed_forward_length.as_slice(), hf.kv_layers()), (&[64, 64, 48, 48, 64, 64][..], 4));
        assert_eq!((hf.kv_source(4), hf.kv_source(5)), (Some(2), Some(3)), "each shared layer reads its type's last");
        assert_eq!(hf.unread_tensors()[0], "blk.4.attn_k.weight");
        assert!((normal_quantile(0.95) - 1.6448536269514722).abs() < 1e-8);
        assert!((normal_quantile(0.01) + 2.3263478740408408).abs() < 1e-8);
    }

    /// Whether node `id` reads `target`, directly or through its operands.
    fn reads(graph: &Graph, id: ValueId, target: ValueId, seen: &mut HashSet<ValueId>) -> bool {
        id == target || (seen.insert(id) && graph.node(id).operands.iter().any(|&o| reads(graph, o, target, seen)))
    }

    /// E2B's shapes (`kiln dev synth gemma3n-e2b`) with packed weights kept:
    /// the 262144 x 7680 per-layer table is gathered as raw Q6_K rows (each
    /// layer its 256 values of each token) and only those are dequantized
    /// ([`Weight::rows`]), in prefill and decode; no f32 value anywhere is
    /// table-sized.
    #[test]
    fn e2b_keep_dequantizes_only_the_gathered_per_layer_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e2b.gguf");
        synth::write(&Preset::Gemma3nE2b.config(), &path, SynthData::Zeros).unwrap();
        let gguf = Gguf::open(&path).unwrap();
        let c = Config::from_gguf(&gguf).unwrap();
        assert_eq!((c.dims.block_count, c.kv_layers(), c.kv_source(28), c.kv_source(29)), (30, 20, Some(18), Some(19)));
        assert_eq!((c.per_layer_input, c.laurel_rank, c.sparsity.iter().flatten().count()), (256, 64, 10));
        let weights = GgufWeights::new(&gguf, PackedPolicy::Keep).unwrap();
        // Every tensor is read but the shared layers' keys and values.
        let serving = Serving::new(&Family::new(c), &weights, 64).unwrap();
        let prefill = serving.prefill.as_ref().expect("a prompt graph");
        assert_eq!(prefill.params().count(), gguf.tensors().len() - 10 * 3);
        for (graph, rows) in [(prefill, DYNAMIC), (&serving.fill, 1)] {
            let table = graph.params().find(|(_, name, _)| *name == "per_layer_token_embd.weight").unwrap().0;
            let dequantized: Vec<&Node> = graph
                .nodes()
                .iter()
                .filter(|n| {
                    matches!(n.op, Op::Dequantize { .. }) && reads(graph, n.operands[0], table, &mut HashSet::new())
                })
                .collect();
            assert_eq!(dequantized.len(), 30, "each layer dequantizes its rows of the table");
            for node in dequantized {
                assert_eq!(node.ty, TensorType::new([rows, 256], DType::F32));
                assert!(matches!(graph.node(node.operands[0]).op, Op::Gather), "of the gathered rows");
            }
            let f32s = graph.nodes().iter().filter(|n| n.ty.dtype == DType::F32);
            let largest = f32s.filter_map(|n| n.ty.static_num_elements()).max().unwrap();
            // Prefill's largest is the tied head, dequantized for the product.
            assert!(largest <= 262_144 * 2048, "{largest} elements");
        }
        let keys = &serving.fill.node(serving.fill.outputs()[1]).ty;
        assert_eq!(keys, &TensorType::new([20, 2, 64, 256], DType::F32), "a cache for the layers that compute KV");
    }

    #[test]
    fn tiny_gemma3n_interpreter_matches_transformers() {
        let gguf = Gguf::open(&fixture("gemma3n/gemma3n.gguf")).unwrap();
        let weights = GgufWeights::new(&gguf, PackedPolicy::Fail).unwrap();
        let diff = interpreter_diff(&Family::from_gguf(&gguf).unwrap(), &weights, &fixture("gemma3n/reference.npy"));
        eprintln!("GGUF: {diff:e}");
        for case in ["gemma3n", "gemma3n_multimodal"] {
            let checkpoint = HfCheckpoint::open(&fixture(case)).unwrap();
            let weights = SafetensorsWeights::new(&checkpoint).unwrap();
            let family = Family::from_hf(&checkpoint.config).unwrap();
            let diff = interpreter_diff(&family, &weights, &fixture(&format!("{case}/reference.npy")));
            eprintln!("{case}: {diff:e}");
        }
    }
}
