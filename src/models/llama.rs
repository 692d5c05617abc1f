//! Llama: a pre-norm decoder-only transformer with RMS norm, rotary
//! position embeddings, grouped-query attention and a SwiGLU feed-forward.
//!
//! - Paper: Touvron et al., "LLaMA: Open and Efficient Foundation Language
//!   Models" (<https://arxiv.org/abs/2302.13971>); "Llama 2"
//!   (<https://arxiv.org/abs/2307.09288>) for grouped-query attention.
//! - References: llama.cpp `src/models/llama.cpp` (`llm_build_llama`), the
//!   GGUF names and metadata used here; HF transformers
//!   `models/llama/modeling_llama.py`.
//!
//! Covers what GGUF files with `general.architecture = llama` hold
//! (Llama 1/2/3 without rope scaling, Mistral, SmolLM2...). RoPE rotates
//! adjacent pairs ([`RopeStyle::Interleaved`]): llama.cpp uses
//! `LLAMA_ROPE_TYPE_NORM` for `LLM_ARCH_LLAMA`, its HF converter having
//! permuted the Q/K rows of HF's `rotate_half` layout into that order.
//! Hugging Face checkpoints (`model_type` llama or mistral, read through
//! [`super::hf`]) keep that layout and rotate halves ([`RopeStyle::NeoX`]).

use super::blocks::{
    add_bias, split_heads, Activation, Attention, AttentionConfig, BlockConfig, LayerCache, Positional, Stack,
};
use super::config::{self, Dims, GgufKeys, HfKeys, RopeConfig};
use super::decoder::DecoderConfig;
use super::hf::{Fused, HfNames, HfStack};
use super::moe::MoeConfig;
use super::{linear_each, Checkpoint, Decoder, KvCache, ModelError, Result, Span};
use crate::trace::nn::{Rope, RopeStyle};
use crate::trace::{Tensor, Tracer};
use crate::weights::gguf::Gguf;
use crate::weights::hf_config::HfConfig;

/// Llama 3.1 GGUFs' rope scaling: one divisor per rotary frequency, written
/// by llama.cpp's converter from HF's `rope_scaling` (`rope_type: llama3`).
const ROPE_FREQS: &str = "rope_freqs.weight";

/// Hyper-parameters, from GGUF metadata under llama.cpp's key names (or
/// from HF's `config.json`: [`Config::from_hf`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The sizes.
    pub dims: Dims,
    /// `llama.feed_forward_length`
    pub feed_forward_length: usize,
    /// The base frequency, `llama.rope.freq_base` (defaults to 10000), and
    /// the frequency scaling: GGUF `*.rope.scaling.*` (linear, yarn), or HF
    /// `rope_parameters` / `rope_scaling` (linear, llama3, yarn).
    pub rope: RopeConfig,
    /// Which features RoPE pairs: adjacent ones in GGUF llama (llama.cpp's
    /// converter permuted Q/K rows for it), `(i, i + d/2)` in HF checkpoints
    /// and in GGUF qwen2/qwen3 (llama.cpp's `LLAMA_ROPE_TYPE_NEOX`).
    pub rope_style: RopeStyle,
    /// Sliding-window attention span, in tokens, on every layer (Mistral's
    /// `sliding_window`; Qwen2/3 with `use_sliding_window` on every layer).
    pub sliding_window: Option<usize>,
    /// Qwen2: the q, k and v projections have biases.
    pub qkv_bias: bool,
    /// Qwen3: each query and key head is RMS-normed before RoPE.
    pub qk_norm: bool,
    /// Qwen3-MoE: the feed-forward of the layers not in `dense_layers` is
    /// a mixture of experts.
    pub experts: Option<MoeConfig>,
    /// The layers whose feed-forward stays dense (`feed_forward_length`
    /// wide) in a mixture-of-experts model: HF's `mlp_only_layers`, and
    /// those off `decoder_sparse_step`.
    pub dense_layers: Vec<usize>,
    /// `general.architecture` or `model_type`: llama, mistral, qwen2,
    /// qwen3, qwen3moe (qwen3_moe).
    pub architecture: String,
}

impl Config {
    /// Reads the `{arch}.*` keys, each one used, listed as not changing
    /// the forward pass, or refused ([`GgufKeys::finish`]).
    pub fn from_gguf<D: AsRef<[u8]> + ?Sized>(gguf: &Gguf<D>) -> Result<Config> {
        let keys = GgufKeys::new(gguf)?;
        let arch = keys.arch.clone();
        let rope_style = match arch.as_str() {
            "llama" => RopeStyle::Interleaved,
            "qwen2" | "qwen3" | "qwen3moe" => RopeStyle::NeoX,
            _ => return Err(ModelError::UnknownArchitecture(arch)),
        };
        keys.ignore(&["context_length"]);
        let experts = match arch.as_str() {
            "qwen3moe" => Some(experts_from_gguf(&keys, None)?),
            // Mixtral: llama with experts as wide as its feed-forward.
            "llama" if keys.int_or("expert_count", 0)? > 0 => {
                Some(experts_from_gguf(&keys, Some(keys.count("feed_forward_length")?))?)
            }
            _ => {
                config::refuse_experts(&keys)?;
                None
            }
        };
        let embedding_length = keys.count("embedding_length")?;
        let head_count = keys.count("attention.head_count")?;
        let head_count_kv = keys.int_or("attention.head_count_kv", head_count)?;
        let head_dim = match keys.get("attention.key_length") {
            Some(_) => keys.count("attention.key_length")?,
            None if embedding_length.is_multiple_of(head_count) => embedding_length / head_count,
            None => {
                return Err(keys.error(
                    "embedding_length",
                    embedding_length,
                    format!(
                        "is not a multiple of {arch}.attention.head_count {head_count} (and no key_length is given)"
                    ),
                ))
            }
        };
        config::head_dim_only(
            &keys,
            "attention.value_length",
            head_dim,
            &format!("kiln needs the key length {head_dim}"),
        )?;
        let vocab_size = config::vocab_size(&keys)?;
        config::full_rotary(&keys, head_dim)?;
        let config = Config {
            dims: Dims {
                block_count: keys.count("block_count")?,
                embedding_length,
                head_count,
                head_count_kv,
                head_dim,
                vocab_size,
                rms_norm_eps: keys.positive_f64("attention.layer_norm_rms_epsilon", None)?,
            },
            feed_forward_length: keys.count("feed_forward_length")?,
            rope: RopeConfig {
                theta: keys.positive_f64("rope.freq_base", Some(10000.0))?,
                scaling: config::rope_from_gguf(&keys)?,
            },
            rope_style,
            sliding_window: None,
            qkv_bias: arch == "qwen2",
            qk_norm: matches!(arch.as_str(), "qwen3" | "qwen3moe"),
            experts,
            dense_layers: vec![],
            architecture: arch,
        };
        keys.finish()?;
        config.check(|key, value, message| keys.error(key, value, message))
    }

    /// From a Hugging Face `config.json` with `model_type` llama, mistral,
    /// qwen2 or qwen3. Every key is read ([`HfKeys`]): what this front-end
    /// does not compute (partial rotary embeddings, MLP biases, another
    /// activation, ...) is refused, never ignored.
    pub fn from_hf(hf: &HfConfig) -> Result<Config> {
        let model_type = hf.model_type.as_str();
        if !matches!(model_type, "llama" | "mistral" | "mixtral" | "qwen2" | "qwen3" | "qwen3_moe") {
            return Err(ModelError::UnknownModelType { model_type: model_type.into(), architecture: String::new() });
        }
        let keys = HfKeys::new("config.json", model_type, &hf.keys);
        let hidden = keys.count("hidden_size")?;
        let heads = keys.count("num_attention_heads")?;
        let head_dim = match keys.get::<usize>("head_dim")? {
            Some(d) => keys.positive("head_dim", d)?,
            None if hidden.is_multiple_of(heads) => hidden / heads,
            None => {
                return Err(keys.error(
                    "hidden_size",
                    &hidden.into(),
                    format!("is not a multiple of num_attention_heads {heads} (and no head_dim is given)"),
                ))
            }
        };
        let kv_heads = match keys.get::<usize>("num_key_value_heads")? {
            Some(n) => keys.positive("num_key_value_heads", n)?,
            None => heads,
        };
        // transformers 5.24's default thetas.
        let rope = config::rope_of(&keys, if model_type == "mixtral" { 1e6 } else { 10_000.0 })?;
        keys.fixed("hidden_act", "\"silu\"", "llama's SwiGLU")?;
        keys.fixed("mlp_bias", "false", "feed-forward projections without biases")?;
        keys.fixed("pretraining_tp", "1", "a tensor-parallel split of the projections at training")?;
        // Llama's and Qwen3's attention_bias puts biases on all four
        // projections; Qwen2's q/k/v have biases whatever the config says.
        keys.fixed("attention_bias", "false", "attention projections without biases (Qwen2's q/k/v biases aside)")?;
        keys.ignore(&["max_position_embeddings"]);
        // SmolLM2's nanotron leftovers, which transformers does not read.
        keys.ignore(&["is_llama_config"]);
        keys.fixed("rope_interleaved", "false", "transformers rotates halves whatever this says")?;
        let sliding_window = match model_type {
            "mistral" | "mixtral" => keys.get("sliding_window")?,
            "qwen2" | "qwen3" | "qwen3_moe" => qwen_sliding_window(&keys)?,
            _ => None,
        };
        let block_count = keys.count("num_hidden_layers")?;
        let (experts, dense_layers) = match model_type {
            "qwen3_moe" => experts_from_hf(&keys, block_count)?,
            "mixtral" => (Some(mixtral_experts(&keys)?), vec![]),
            _ => (None, vec![]),
        };
        let config = Config {
            dims: Dims {
                block_count,
                embedding_length: hidden,
                head_count: heads,
                head_count_kv: kv_heads,
                head_dim,
                vocab_size: keys.count("vocab_size")?,
                rms_norm_eps: keys.positive_f64("rms_norm_eps", Some(1e-6))?,
            },
            feed_forward_length: keys.count("intermediate_size")?,
            rope,
            rope_style: RopeStyle::NeoX,
            sliding_window,
            qkv_bias: model_type == "qwen2",
            qk_norm: matches!(model_type, "qwen3" | "qwen3_moe"),
            experts,
            dense_layers,
            architecture: model_type.to_string(),
        };
        // Read by SafetensorsWeights, through HfConfig::tie_word_embeddings.
        keys.get::<bool>("tie_word_embeddings")?;
        keys.finish()?;
        config.check(|key, value: usize, message| keys.error(config::hf_name(key), &value.into(), message))
    }

    /// What both sources must satisfy: kv heads dividing the heads, an even
    /// head, a window of at least one token. `error(key, value, message)`
    /// names the key in the source's own spelling.
    fn check(self, error: impl Fn(&str, usize, String) -> ModelError) -> Result<Config> {
        config::check_heads(&self.dims, "rope.dimension_count", &error)?;
        if self.sliding_window == Some(0) {
            return Err(error("sliding_window", 0, "must be positive".into()));
        }
        Ok(self)
    }
}

/// The GGUF expert keys of Qwen3-MoE and Mixtral (`llama` with experts,
/// whose expert width defaults to `feed_forward_length`: llama.cpp's
/// converter writes no `expert_feed_forward_length` for it). llama.cpp's
/// graphs of both divide the chosen experts' probabilities by their sum
/// (`norm_w`; whatever Qwen3's `norm_topk_prob` was) and have no shared
/// expert.
fn experts_from_gguf<D: AsRef<[u8]> + ?Sized>(keys: &GgufKeys<'_, D>, width: Option<usize>) -> Result<MoeConfig> {
    let (experts, used) = config::expert_counts_gguf(keys)?;
    let shared = keys.int_or("expert_shared_count", 0)?;
    if shared > 0 {
        return Err(keys.error("expert_shared_count", shared, format!("kiln's {} has no shared experts", keys.arch)));
    }
    keys.fixed("expert_gating_func", 1.0, "softmax over the router's logits")?;
    keys.fixed("expert_weights_scale", 1.0, "the chosen experts' weights unscaled")?;
    let feed_forward_length = match width {
        Some(width) => keys.int_or("expert_feed_forward_length", width)?,
        None => keys.count("expert_feed_forward_length")?,
    };
    Ok(MoeConfig::swiglu(experts, used, feed_forward_length, true))
}

/// Qwen3-MoE's `config.json` expert keys: the experts, and the layers
/// whose MLP stays dense (in `mlp_only_layers`, or off every
/// `decoder_sparse_step`-th layer; transformers' `Qwen3MoeDecoderLayer`).
fn experts_from_hf(keys: &HfKeys<'_>, block_count: usize) -> Result<(Option<MoeConfig>, Vec<usize>)> {
    let (experts, used) = config::expert_counts_hf(keys)?;
    let step = keys.count_or("decoder_sparse_step", 1)?;
    let mlp_only: Vec<usize> = keys.or("mlp_only_layers", vec![])?;
    if let Some(&i) = mlp_only.iter().find(|&&i| i >= block_count) {
        return Err(keys.error("mlp_only_layers", &i.into(), format!("is not a layer of {block_count}")));
    }
    let dense_layers = (0..block_count).filter(|i| mlp_only.contains(i) || !(i + 1).is_multiple_of(step)).collect();
    let c = MoeConfig::swiglu(experts, used, keys.count("moe_intermediate_size")?, keys.or("norm_topk_prob", false)?);
    // Training only: the router's auxiliary loss.
    keys.ignore(&["output_router_logits", "router_aux_loss_coef"]);
    Ok((Some(c), dense_layers))
}

/// Mixtral's `config.json` expert keys: every layer a mixture of experts
/// `intermediate_size` wide, the chosen experts' probabilities divided by
/// their sum (transformers' `MixtralTopKRouter`).
fn mixtral_experts(keys: &HfKeys<'_>) -> Result<MoeConfig> {
    let (experts, used) = config::expert_counts_hf(keys)?;
    // Training only: the router's auxiliary loss and its input noise.
    keys.ignore(&["output_router_logits", "router_aux_loss_coef", "router_jitter_noise"]);
    Ok(MoeConfig::swiglu(experts, used, keys.count("intermediate_size")?, true))
}

/// Qwen2/Qwen3's window: `sliding_window` only with `use_sliding_window`,
/// on the layers `layer_types` says (5.x), or from `max_window_layers` on
/// (4.x). kiln slides every layer or none.
fn qwen_sliding_window(keys: &HfKeys<'_>) -> Result<Option<usize>> {
    let window: Option<usize> = keys.get("sliding_window")?;
    let max_window_layers: Option<usize> = keys.get("max_window_layers")?;
    let layer_types: Option<Vec<String>> = keys.get("layer_types")?;
    if !keys.or("use_sliding_window", false)? || window.is_none() {
        return Ok(None);
    }
    let layers: usize = keys.required("num_hidden_layers")?;
    let sliding: Vec<bool> = match layer_types {
        Some(types) => types.iter().map(|t| t == "sliding_attention").collect(),
        None => (0..layers).map(|i| i >= max_window_layers.unwrap_or(28)).collect(),
    };
    match (sliding.iter().all(|&s| s), sliding.iter().any(|&s| s)) {
        (true, _) => Ok(window),
        (false, false) => Ok(None),
        (false, true) => Err(keys.error(
            "layer_types",
            &serde_json::json!(sliding
                .iter()
                .map(|&s| if s { "sliding_attention" } else { "full_attention" })
                .collect::<Vec<_>>()),
            "kiln slides every layer of a qwen model or none",
        )),
    }
}

impl Config {
    /// Every block: pre-norm, SwiGLU, attention scaled by `1/√head_dim`
    /// with Qwen2's biases and Qwen3's per-head norms where the
    /// architecture has them. Block `i`'s feed-forward is Qwen3-MoE's mixture of experts unless
    /// it is one of the dense layers.
    fn block(&self, i: usize) -> BlockConfig {
        let attention =
            AttentionConfig { qkv_bias: self.qkv_bias, qk_norm: self.qk_norm, ..AttentionConfig::of(&self.dims) };
        let feed_forward_length = self.feed_forward_length;
        let experts = self.experts.filter(|_| !self.dense_layers.contains(&i));
        BlockConfig {
            attention,
            feed_forward_length,
            activation: Activation::Silu,
            post_norms: false,
            experts,
            ffn_norm: "ffn_norm",
        }
    }
}

/// Llama's attention, the three projections first, as llama.cpp's
/// `llm_build_llama` computes them:
/// `attn(x) = W_o · softmax(rope(norm(W_q x + b_q)) · rope(norm(W_k x + b_k))ᵀ / √hd + mask) · (W_v x + b_v)`,
/// the biases Qwen2's, the per-head norms Qwen3's.
fn attention<'t>(
    a: &Attention<'t>,
    x: &Tensor<'t>,
    at: &Positional<'t>,
    cache: LayerCache<'_, 't>,
) -> Result<Tensor<'t>> {
    let c = &a.c;
    let mut q = a.attn_q.linear(x)?;
    let [mut k, mut v]: [Tensor<'t>; 2] = linear_each(&[&a.attn_k, &a.attn_v], x)?.try_into().expect("two products");
    if let Some([bq, bk, bv]) = &a.bias {
        (q, k, v) = (add_bias(&q, bq)?, add_bias(&k, bk)?, add_bias(&v, bv)?);
    }
    let (mut q, mut k) = (split_heads(&q, c.head_count, c.head_dim)?, split_heads(&k, c.head_count_kv, c.head_dim)?);
    if let Some([q_norm, k_norm]) = &a.qk_norm {
        (q, k) = (q.rms_norm(Some(q_norm), c.eps)?, k.rms_norm(Some(k_norm), c.eps)?);
    }
    let (q, k) = (at.rotation.apply(&q)?, at.rotation.apply(&k)?);
    a.attend(&q, k, split_heads(&v, c.head_count_kv, c.head_dim)?, &at.visible, cache)
}

/// The whole model: embedding, blocks, final norm and the output head
/// (`output.weight`, or `token_embd.weight` when tied: then one param).
pub struct Llama<'t> {
    /// The hyper-parameters the model was loaded with.
    pub config: Config,
    stack: Stack<'t>,
    /// `rope_freqs.weight`: per-frequency divisors (Llama 3.1 GGUFs).
    rope_freqs: Option<Tensor<'t>>,
}

impl<'t> Llama<'t> {
    /// Declares every weight in `t`, checking each shape against `c`.
    pub fn load(t: &'t Tracer, c: &Config, weights: &dyn Checkpoint) -> Result<Self> {
        let stack = Stack::load(t, weights, &c.dims, &|i| c.block(i), attention, false)?;
        let rope_freqs = match weights.contains(ROPE_FREQS) {
            true => Some(weights.load(t, ROPE_FREQS, &[c.dims.head_dim / 2])?.f32()?),
            false => None,
        };
        Ok(Llama { config: c.clone(), stack, rope_freqs })
    }
}

/// Where an HF checkpoint (`LlamaForCausalLM` and its kin) keeps the
/// tensors ([`super::registry`]'s row).
pub const HF_NAMES: HfNames = HfNames { family: "llama", block_names: &[&HF_BLOCK_NAMES], ..HfNames::DECODER };

/// Mixtral's as stored (`block_sparse_moe`, experts' `w1`, `w3`, `w2`: gate,
/// up, down) or in transformers 5's fused form, whose router is `mlp.gate`.
pub fn mixtral_hf_names(has: &dyn Fn(&str) -> bool) -> HfNames {
    HfNames {
        family: "mixtral",
        block_names: match has("model.layers.0.mlp.gate.weight") {
            true => &[&HF_BLOCK_NAMES, &[("ffn_gate_inp.weight", "mlp.gate.weight")]],
            false => &[&HF_BLOCK_NAMES, &[("ffn_gate_inp.weight", "block_sparse_moe.gate.weight")]],
        },
        stacks: &MIXTRAL_STACKS,
        ..HfNames::DECODER
    }
}

const MIXTRAL_STACKS: [HfStack; 3] = [
    HfStack {
        gguf: "ffn_gate_exps.weight",
        per_expert: Some("block_sparse_moe.experts.{e}.w1.weight"),
        fused: Fused::rows("mlp.experts.gate_up_proj", 0, 2),
    },
    HfStack {
        gguf: "ffn_up_exps.weight",
        per_expert: Some("block_sparse_moe.experts.{e}.w3.weight"),
        fused: Fused::rows("mlp.experts.gate_up_proj", 1, 2),
    },
    HfStack {
        gguf: "ffn_down_exps.weight",
        per_expert: Some("block_sparse_moe.experts.{e}.w2.weight"),
        fused: Fused::rows("mlp.experts.down_proj", 0, 1),
    },
];

/// Qwen3-MoE's: llama's, the router, and the experts' stacks, one tensor
/// per expert or transformers 5's fused `gate_up_proj` (gate rows first)
/// and `down_proj`.
pub const QWEN3MOE_HF_NAMES: HfNames = HfNames {
    family: "qwen3moe",
    block_names: &[&HF_BLOCK_NAMES, &[("ffn_gate_inp.weight", "mlp.gate.weight")]],
    stacks: &[
        HfStack {
            gguf: "ffn_gate_exps.weight",
            per_expert: Some("mlp.experts.{e}.gate_proj.weight"),
            fused: Fused::rows("mlp.experts.gate_up_proj", 0, 2),
        },
        HfStack {
            gguf: "ffn_up_exps.weight",
            per_expert: Some("mlp.experts.{e}.up_proj.weight"),
            fused: Fused::rows("mlp.experts.gate_up_proj", 1, 2),
        },
        HfStack {
            gguf: "ffn_down_exps.weight",
            per_expert: Some("mlp.experts.{e}.down_proj.weight"),
            fused: Fused::rows("mlp.experts.down_proj", 0, 1),
        },
    ],
    ..HfNames::DECODER
};

/// The per-block tensors of an HF checkpoint: `blk.{i}.` + GGUF suffix is
/// `model.layers.{i}.` + HF suffix.
const HF_BLOCK_NAMES: [(&str, &str); 14] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    // Qwen2's projection biases, Qwen3's per-head query and key norms.
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
];

impl DecoderConfig for Config {
    fn name(&self) -> &str {
        &self.architecture
    }

    fn load<'t>(&self, t: &'t Tracer, weights: &dyn Checkpoint) -> Result<Box<dyn Decoder<'t> + 't>> {
        Ok(Box::new(Llama::load(t, self, weights)?))
    }

    fn experts(&self) -> Option<MoeConfig> {
        self.experts
    }
}

impl<'t> Decoder<'t> for Llama<'t> {
    fn dims(&self) -> &Dims {
        &self.config.dims
    }

    /// Masked causally, and within the window if the model slides one.
    fn hidden(&self, tokens: &Tensor<'t>, at: Span<'_, 't>, cache: Option<&mut KvCache<'t>>) -> Result<Tensor<'t>> {
        let c = &self.config;
        let rope = Rope::new(c.dims.head_dim, c.rope.theta, c.rope_style).with_scaling(c.rope.scaling);
        let rotation = match &self.rope_freqs {
            Some(factors) => rope.at_with_freq_factors(at.positions, factors)?,
            None => rope.at(at.positions)?,
        };
        let logits = at.logits;
        let at = Positional::new(rotation, &at, c.sliding_window)?;
        self.stack.hidden(self.stack.embed(tokens)?, |_| &at, cache, logits)
    }

    fn logits(&self, hidden: &Tensor<'t>) -> Result<Tensor<'t>> {
        self.stack.logits(hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{DType, Graph, DYNAMIC};
    use crate::interp::{self, Value};
    use crate::lower::{lower_to_string, LowerOptions};
    use crate::max_abs_diff;
    use crate::models::testing::{block_matrices, gguf_bytes, smollm2_path, Fill, Meta};
    use crate::models::{scalar_i32, token_ids, Family, GgufWeights, PackedPolicy};
    use crate::trace::nn::RopeScaling;
    use crate::weights::ggml::GgmlType;
    use std::time::Instant;

    fn keep<D: AsRef<[u8]>>(gguf: &Gguf<D>) -> GgufWeights<'_, D> {
        GgufWeights::new(gguf, PackedPolicy::Keep).unwrap()
    }

    /// [`crate::models::prefill`] configured from the GGUF's metadata.
    fn prefill<D: AsRef<[u8]>>(weights: &GgufWeights<'_, D>, seq_len: usize) -> Result<Graph> {
        crate::models::prefill(&Family::from_gguf(weights.gguf)?, weights, seq_len)
    }

    /// [`crate::models::prefill`] of `config`.
    fn prefill_of(config: &Config, weights: &dyn Checkpoint, seq_len: usize) -> Result<Graph> {
        crate::models::prefill(&Family::new(config.clone()), weights, seq_len)
    }

    fn entry_points<D: AsRef<[u8]>>(weights: &GgufWeights<'_, D>, max_context: usize, n: usize) -> Result<Vec<Graph>> {
        crate::models::entry_points(&Family::from_gguf(weights.gguf)?, weights, max_context, n)
    }

    fn smollm2() -> Gguf {
        Gguf::open(&smollm2_path()).unwrap_or_else(|e| panic!("{e} (run `make setup`)"))
    }

    #[test]
    fn smollm2_lowers_and_verifies() {
        let gguf = smollm2();
        let graph = prefill(&keep(&gguf), DYNAMIC).unwrap();
        let start = Instant::now();
        let text = lower_to_string(&graph, &LowerOptions::default()).unwrap();
        let ops = text.lines().filter(|l| l.contains(" = \"stablehlo.") || l.contains(" = \"chlo.")).count();
        eprintln!("lower: {:.2?}, {ops} ops, {} bytes", start.elapsed(), text.len());
        assert!(text.contains("\"model\"::\"token_embd.weight\""), "weights are named params");
        assert!(!text.contains("\"model\"::\"output.weight\""));
        assert_eq!(text.matches("\"util.global\"()").count(), 272);
        assert!(
            text.contains("func.func @main(%arg0: tensor<1x?xi32>) -> tensor<1x?x49152xf32>"),
            "one module for every prompt length"
        );
    }

    /// A 2-block llama (hidden 32, 4 heads over 2 kv heads, ffn 64, vocab
    /// 16) with seeded weights: norms F32, matrices Q8_0 (the Keep path),
    /// `output.weight` F32 unless tied.
    fn tiny(arch: &'static str, tied: bool, skip: &[&str]) -> Vec<u8> {
        tiny_with(arch, tied, skip, vec![], vec![])
    }

    /// [`tiny`] with `extra` tensors, and `meta` keys replacing or added to its own.
    fn tiny_with(
        arch: &'static str,
        tied: bool,
        skip: &[&str],
        extra: Vec<(String, Vec<usize>, u32, Vec<u8>)>,
        meta: Vec<(&'static str, Meta)>,
    ) -> Vec<u8> {
        let extra_meta = meta;
        const Q8_0: u32 = 8;
        let (hidden, ff, vocab, heads, kv_heads, blocks) = (32, 64, 16, 4, 2, 2);
        let hd = hidden / heads;
        let fill = Fill::new(1);
        let (f32s, q8_0) = (|n, around| fill.f32s(n, around), |n| fill.q8_0(n));
        let mut tensors = vec![("token_embd.weight".to_string(), vec![vocab, hidden], Q8_0, q8_0(vocab * hidden))];
        for i in 0..blocks {
            let w = |n: &str| format!("blk.{i}.{n}.weight");
            tensors.push((w("attn_norm"), vec![hidden], 0, f32s(hidden, 1.0)));
            for (n, rows, cols) in block_matrices(hidden, heads, kv_heads, hd, ff) {
                tensors.push((w(n), vec![rows, cols], Q8_0, q8_0(rows * cols)));
            }
            tensors.push((w("ffn_norm"), vec![hidden], 0, f32s(hidden, 1.0)));
            if arch == "qwen2" {
                for (n, len) in [("attn_q", heads * hd), ("attn_k", kv_heads * hd), ("attn_v", kv_heads * hd)] {
                    tensors.push((format!("blk.{i}.{n}.bias"), vec![len], 0, f32s(len, 0.0)));
                }
            }
            if arch == "qwen3" {
                for n in ["attn_q_norm", "attn_k_norm"] {
                    tensors.push((w(n), vec![hd], 0, f32s(hd, 1.0)));
                }
            }
        }
        tensors.push(("output_norm.weight".into(), vec![hidden], 0, f32s(hidden, 1.0)));
        if !tied {
            tensors.push(("output.weight".into(), vec![vocab, hidden], 0, f32s(vocab * hidden, 0.0)));
        }
        tensors.extend(extra);
        tensors.retain(|t| !skip.contains(&t.0.as_str()));
        // Keys under the architecture's prefix (`qwen2.block_count`).
        let prefix = if arch == "gpt2" { "llama" } else { arch };
        let keys: Vec<String> = [
            "block_count",
            "embedding_length",
            "feed_forward_length",
            "attention.head_count",
            "attention.head_count_kv",
            "rope.freq_base",
            "attention.layer_norm_rms_epsilon",
            "rope.dimension_count",
        ]
        .iter()
        .map(|k| format!("{prefix}.{k}"))
        .collect();
        let values = [
            Meta::U32(blocks as u32),
            Meta::U32(hidden as u32),
            Meta::U32(ff as u32),
            Meta::U32(heads as u32),
            Meta::U32(kv_heads as u32),
            Meta::F32(10000.0),
            Meta::F32(1e-5),
            Meta::U32(hd as u32),
        ];
        let mut meta = vec![("general.architecture", Meta::Str(arch))];
        meta.extend(keys.iter().map(String::as_str).zip(values));
        meta.retain(|(k, _)| !extra_meta.iter().any(|(e, _)| e == k));
        meta.extend(extra_meta);
        gguf_bytes(&meta, &tensors)
    }

    fn tokens(ids: &[i32]) -> Value {
        token_ids(&ids.iter().map(|&i| i as u32).collect::<Vec<_>>())
    }

    #[test]
    fn tiny_llama_is_causal_and_ties_one_param() {
        let untied = Gguf::parse(tiny("llama", false, &[])).unwrap();
        let weights = keep(&untied);
        let graph = prefill(&weights, 4).unwrap();
        assert_eq!(graph.params().count(), untied.tensors().len());
        assert_eq!(graph.params().count(), 2 * 9 + 3);
        let tied = Gguf::parse(tiny("llama", true, &[])).unwrap();
        assert_eq!(prefill(&keep(&tied), 4).unwrap().params().count(), 2 * 9 + 2);

        // Changing a later token leaves earlier positions' logits alone.
        let run = |ids: &[i32]| interp::run(&graph, &[tokens(ids)], &weights).unwrap().remove(0).to_f64_vec();
        let (a, b) = (run(&[1, 5, 9, 3]), run(&[1, 5, 2, 7]));
        assert_eq!(a.len(), 4 * 16);
        assert_eq!(a[..2 * 16], b[..2 * 16]);
        assert_ne!(a[2 * 16..], b[2 * 16..]);
        assert!(a.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn tiny_llama_errors_name_the_culprit() {
        let err = |bytes: Vec<u8>| prefill(&keep(&Gguf::parse(bytes).unwrap()), 4).expect_err("an error").to_string();
        let e = err(tiny("gpt2", false, &[]));
        assert!(e.contains("gpt2"), "{e}");
        let e = err(tiny("llama", false, &["blk.1.ffn_up.weight"]));
        assert!(e.contains("\"blk.1.ffn_up.weight\" is missing"), "{e}");

        // Quantized types the graph cannot dequantize: the host can.
        let (q8_1, iq1_s, i32) = (GgmlType::Q8_1.id(), GgmlType::IQ1_S.id(), GgmlType::I32.id());
        let odd = Gguf::parse(gguf_bytes(
            &[],
            &[
                ("blk.0.attn_q.weight".into(), vec![32], q8_1, vec![0; 36]),
                ("blk.0.attn_k.weight".into(), vec![256], iq1_s, vec![0; 50]),
                ("rope_freqs".into(), vec![4], i32, vec![0; 16]),
            ],
        ))
        .unwrap();
        let declare = |policy, name| GgufWeights::new(&odd, policy).unwrap().declare(&odd.tensor(name).unwrap());
        let e = declare(PackedPolicy::Keep, "blk.0.attn_q.weight").unwrap_err().to_string();
        assert!(e.contains("\"blk.0.attn_q.weight\" has ggml type Q8_1"), "{e}");
        assert!(e.contains("use `--packed dequantize`") && e.contains("(it takes Q4_0 Q4_1 "), "{e}");
        let e = declare(PackedPolicy::Keep, "blk.0.attn_k.weight").unwrap_err().to_string();
        assert!(e.contains("has ggml type IQ1_S") && e.contains("use `--packed dequantize`"), "{e}");
        assert!(declare(PackedPolicy::Dequantize(DType::F32), "blk.0.attn_k.weight").is_ok());
        // A plain integer tensor is no param under any policy: no way out to name.
        let e = declare(PackedPolicy::Keep, "rope_freqs").unwrap_err().to_string();
        assert!(e.contains("has ggml type I32, which graphs cannot load") && !e.contains("--packed"), "{e}");
    }

    #[test]
    fn prefill_then_decode_matches_one_prefill() {
        let gguf = Gguf::parse(tiny("llama", false, &[])).unwrap();
        let weights = keep(&gguf);
        let ids = [1, 5, 9, 3, 7, 2];
        let full = interp::run(&prefill(&weights, ids.len()).unwrap(), &[tokens(&ids)], &weights).unwrap();
        let full = full[0].to_f64_vec();
        let vocab = full.len() / ids.len();

        let graphs = entry_points(&weights, 8, 1).unwrap();
        let (prefill_fn, decode_fn) = (&graphs[0], &graphs[1]);
        assert_eq!(graphs.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["prefill", "decode"]);
        let mut out = interp::run(prefill_fn, &[tokens(&ids[..3])], &weights).unwrap();
        // Prefill's logits are its last position's.
        assert!(max_abs_diff(&out[0].to_f64_vec(), &full[2 * vocab..3 * vocab]) <= 1e-5);
        for (pos, &id) in ids.iter().enumerate().skip(3) {
            let (keys, values) = (out.remove(1), out.remove(1));
            out = interp::run(decode_fn, &[tokens(&[id]), scalar_i32(pos as i32), keys, values], &weights).unwrap();
            let diff = max_abs_diff(&out[0].to_f64_vec(), &full[pos * vocab..(pos + 1) * vocab]);
            assert!(diff <= 1e-5, "position {pos}: {diff}");
        }
        // Both functions in one module share one global per weight.
        let session = crate::lower::Session::new();
        let inits = crate::lower::ParamInits::default();
        let module = session.lower_functions(&[prefill_fn, decode_fn], &LowerOptions::default(), &inits).unwrap();
        let text = crate::lower::print(&module).unwrap();
        assert_eq!(text.matches("\"util.global\"() {initial_value").count(), gguf.tensors().len());
        assert!(text.contains("func.func @prefill(%arg0: tensor<1x?xi32>) -> (tensor<1x1x16xf32>, tensor<2x2x8x8xf32>, tensor<2x2x8x8xf32>)"), "{text}");
        assert!(text.contains("func.func @decode(%arg0: tensor<1x1xi32>, %arg1: tensor<i32>, %arg2: tensor<2x2x8x8xf32>, %arg3: tensor<2x2x8x8xf32>)"));
    }

    #[test]
    fn packed_policies_fail_by_default_and_agree() {
        let gguf = Gguf::parse(tiny("llama", false, &[])).unwrap();
        let e = prefill(&GgufWeights::new(&gguf, PackedPolicy::default()).unwrap(), 4).unwrap_err().to_string();
        assert!(e.contains("tensor \"token_embd.weight\" is packed as Q8_0"), "{e}");
        assert!(e.contains("--packed dequantize") && e.contains("--packed keep"), "{e}");
        assert!(GgufWeights::new(&gguf, PackedPolicy::Dequantize(DType::I32)).is_err());

        // Dequantized on the host or in the graph: the same f32 weights.
        let ids = tokens(&[1, 5, 9, 3]);
        let logits = |weights: &GgufWeights<'_, Vec<u8>>, seq: usize| {
            let graph = prefill(weights, seq).unwrap();
            interp::run(&graph, std::slice::from_ref(&ids), weights).unwrap().remove(0).to_f64_vec()
        };
        let kept = logits(&keep(&gguf), 4);
        let dense = logits(&GgufWeights::new(&gguf, PackedPolicy::Dequantize(DType::F32)).unwrap(), 4);
        assert_eq!(kept, dense);
        // And one dynamic-length graph gives the static graph's logits.
        assert_eq!(logits(&keep(&gguf), DYNAMIC), kept);
        let bf16 = logits(&GgufWeights::new(&gguf, PackedPolicy::Dequantize(DType::BF16)).unwrap(), 4);
        let max_diff = max_abs_diff(&kept, &bf16);
        assert!(max_diff > 0.0 && max_diff < 0.1, "bf16 weights round: {max_diff}");
    }

    /// `generate` (prefill, then a `stablehlo.while` of decodes) compiled by
    /// IREE continues a prompt with the interpreter's greedy tokens; it
    /// stops where the cache is full.
    #[test]
    fn tiny_llama_generates_through_iree() {
        let bytes = tiny("llama", false, &[]);
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("tiny.gguf"), &bytes).unwrap();
        let gguf = Gguf::parse(bytes).unwrap();
        let weights = keep(&gguf);
        let serving = crate::models::Serving::new(&Family::from_gguf(&gguf).unwrap(), &weights, 8).unwrap();
        let session = crate::lower::Session::new();
        let inits = crate::lower::ParamInits::default();
        let module = session.lower_serving(&serving.greedy_loop(), &LowerOptions::default(), &inits).unwrap();
        let text = crate::lower::print(&module).unwrap();
        assert!(
            text.contains("func.func @generate(%arg0: tensor<1x?xi32>, %arg1: tensor<i32>) -> tensor<1x8xi32>"),
            "{text}"
        );
        assert!(text.contains("\"stablehlo.while\""));
        std::fs::write(path("m.mlir"), text).unwrap();
        let iree = crate::iree::Iree::for_tests();
        iree.compile(&path("m.mlir"), &path("m.vmfb")).unwrap();
        for (prompt, n_new) in [(&[1u32, 5, 9][..], 4), (&[1, 5, 9, 3, 7, 2][..], 10)] {
            let want = serving.generate_reference(&weights, prompt, n_new).unwrap();
            crate::npy::write(&path("prompt.npy"), &token_ids(prompt)).unwrap();
            crate::npy::write(&path("n.npy"), &scalar_i32(n_new as i32)).unwrap();
            let inputs = [path("prompt.npy"), path("n.npy")];
            iree.run(
                &path("m.vmfb"),
                "generate",
                &inputs,
                &[("model", path("tiny.gguf").as_path())],
                &[path("out.npy")],
            )
            .unwrap();
            let out = crate::npy::read(&path("out.npy")).unwrap().to_f64_vec();
            let got: Vec<u32> = out.iter().take_while(|&&t| t >= 0.0).map(|&t| t as u32).collect();
            assert_eq!(got, want, "prompt {prompt:?}");
            assert_eq!(want.len(), n_new.min(8 + 1 - prompt.len()));
        }
    }

    /// Qwen3-MoE's expert keys from `config.json` (transformers 5.24's own,
    /// committed with the test checkpoint, and variants of it): which
    /// layers stay dense, and what is refused by name.
    #[test]
    fn qwen3_moe_config_from_hf() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("test/models/transformers/qwen3moe/config.json");
        let base: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let read = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut c = base.clone();
            edit(&mut c);
            Config::from_hf(&HfConfig::parse(&c.to_string()).unwrap()).map_err(|e| e.to_string())
        };
        let c = read(&|_| {}).unwrap();
        let want = MoeConfig::swiglu(8, 2, 32, true);
        assert_eq!((c.experts, c.dense_layers.as_slice(), c.qk_norm), (Some(want), &[][..], true));
        // A checkpoint's spelling (`num_experts`), dense layers both ways.
        let c = read(&|c| {
            let n = c.as_object_mut().unwrap().remove("num_local_experts").unwrap();
            c["num_experts"] = n;
            c["num_hidden_layers"] = 4.into();
            c["decoder_sparse_step"] = 2.into();
            c["mlp_only_layers"] = serde_json::json!([3]);
            c["norm_topk_prob"] = false.into();
        })
        .unwrap();
        assert_eq!((c.experts.unwrap().norm_topk, c.dense_layers), (false, vec![0, 2, 3]));
        let refused = [
            ("num_experts_per_tok", serde_json::json!(9), "num_experts_per_tok = 9: is more than the 8 experts"),
            ("mlp_only_layers", serde_json::json!([2]), "mlp_only_layers = 2: is not a layer of 2"),
            ("moe_intermediate_size", serde_json::json!(0), "moe_intermediate_size = 0: must be positive"),
        ];
        for (key, value, needle) in refused {
            let e = read(&|c| c[key] = value.clone()).expect_err("refused");
            assert!(e.contains(needle), "'{e}' should contain '{needle}'");
        }
    }

    /// Qwen3-MoE's and Mixtral's (llama's) GGUF expert keys: read, and
    /// what kiln does not compute refused by name; other architectures
    /// refuse them all.
    #[test]
    fn qwen3moe_config_from_gguf() {
        let read_with = |arch: &'static str, extra: Vec<(&'static str, Meta)>, without: &str| {
            let mut meta = vec![
                ("general.architecture", Meta::Str(arch)),
                ("block_count", Meta::U32(2)),
                ("embedding_length", Meta::U32(32)),
                ("feed_forward_length", Meta::U32(64)),
                ("attention.head_count", Meta::U32(4)),
                ("attention.layer_norm_rms_epsilon", Meta::F32(1e-6)),
                ("vocab_size", Meta::U32(16)),
                ("expert_count", Meta::U32(8)),
                ("expert_used_count", Meta::U32(2)),
                ("expert_feed_forward_length", Meta::U32(32)),
            ];
            meta.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k) && *k != without);
            meta.extend(extra);
            let keys: Vec<String> = meta
                .iter()
                .map(|(k, _)| if k.starts_with("general.") { k.to_string() } else { format!("{arch}.{k}") })
                .collect();
            let meta: Vec<(&str, Meta)> =
                keys.iter().map(String::as_str).zip(meta.into_iter().map(|(_, v)| v)).collect();
            Config::from_gguf(&Gguf::parse(gguf_bytes(&meta, &[])).unwrap()).map_err(|e| e.to_string())
        };
        let read = |arch, extra| read_with(arch, extra, "");
        let read_without = |arch, key| read_with(arch, vec![], key);
        let c = read("qwen3moe", vec![]).unwrap();
        let want = MoeConfig::swiglu(8, 2, 32, true);
        assert_eq!((c.experts, c.qk_norm, c.rope_style), (Some(want), true, RopeStyle::NeoX));
        // Mixtral: llama with experts, as wide as the feed-forward unless
        // the file says otherwise.
        let c = read("llama", vec![]).unwrap();
        assert_eq!((c.experts, c.rope_style), (Some(want), RopeStyle::Interleaved));
        let c = read_without("llama", "expert_feed_forward_length").unwrap();
        assert_eq!(c.experts.map(|e| e.feed_forward_length), Some(64));
        assert!(read_without("qwen3moe", "expert_feed_forward_length").is_err());
        let refused = [
            (
                "qwen3moe",
                vec![("expert_used_count", Meta::U32(9))],
                "qwen3moe.expert_used_count = 9: is more than expert_count 8",
            ),
            (
                "qwen3moe",
                vec![("expert_shared_count", Meta::U32(1))],
                "qwen3moe.expert_shared_count = 1: kiln's qwen3moe has no shared experts",
            ),
            ("qwen3moe", vec![("expert_gating_func", Meta::U32(2))], "qwen3moe.expert_gating_func = 2"),
            ("qwen3moe", vec![("expert_weights_scale", Meta::F32(2.5))], "qwen3moe.expert_weights_scale = 2.5"),
            (
                "llama",
                vec![("expert_used_count", Meta::U32(9))],
                "llama.expert_used_count = 9: is more than expert_count 8",
            ),
            ("qwen2", vec![], "qwen2.expert_count = 8: mixture-of-experts models are not supported yet"),
        ];
        for (arch, extra, needle) in refused {
            let e = read(arch, extra).expect_err("refused");
            assert!(e.contains(needle), "'{e}' should contain '{needle}'");
        }
    }

    #[test]
    fn config_from_hf() {
        use serde_json::{json, Value as Json};
        let hf = |extra: Json| {
            let mut c = json!({
                "model_type": "llama", "vocab_size": 16, "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            });
            for (key, value) in extra.as_object().expect("an object") {
                c[key] = value.clone();
            }
            let config = crate::weights::hf_config::HfConfig::parse(&c.to_string()).unwrap();
            Family::from_hf(&config).map(|f| f.config::<Config>().cloned()).map_err(|e| e.to_string())
        };
        let Ok(Some(c)) = hf(json!({"rope_scaling": null, "torch_dtype": "bfloat16", "use_cache": true})) else {
            panic!("a llama config")
        };
        assert_eq!((c.dims.head_dim, c.dims.head_count_kv, c.rope_style), (8, 2, RopeStyle::NeoX));
        assert_eq!((c.rope.theta, c.dims.rms_norm_eps), (10000.0, 1e-6), "HF's defaults");
        assert!(hf(json!({"model_type": "mistral", "sliding_window": null})).is_ok());
        let Ok(Some(c)) = hf(json!({"model_type": "mistral", "sliding_window": 4096})) else { panic!() };
        assert_eq!(c.sliding_window, Some(4096));
        let Ok(Some(c)) = hf(json!({"head_dim": 16})) else { panic!("a llama config") };
        assert_eq!(c.dims.head_dim, 16);

        // transformers 4.x and 5.x spellings of the same rope.
        let llama3 = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192});
        let want = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let Ok(Some(c)) = hf(json!({"rope_scaling": llama3, "rope_theta": 500000.0})) else { panic!() };
        assert_eq!((c.rope.scaling, c.rope.theta), (want, 500000.0));
        let mut v5 = llama3.clone();
        v5["rope_theta"] = json!(500000.0);
        let Ok(Some(c)) = hf(json!({"rope_parameters": v5})) else { panic!("5.x rope_parameters") };
        assert_eq!((c.rope.scaling, c.rope.theta), (want, 500000.0), "the issue's wrong export");
        let Ok(Some(c)) = hf(json!({"rope_scaling": {"type": "linear", "factor": 2.0}})) else { panic!() };
        assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 2.0 });
        let Ok(Some(c)) = hf(json!({"model_type": "qwen2", "max_position_embeddings": 4096,
            "rope_scaling": {"type": "yarn", "factor": 4.0}}))
        else {
            panic!("Qwen2.5's yarn")
        };
        let yarn = yarn_defaults_4x_of_4096();
        assert_eq!((c.architecture.as_str(), c.rope.scaling, c.qkv_bias), ("qwen2", yarn, true));

        let refused = [
            (json!({"model_type": "gpt2"}), "model_type \"gpt2\" (no architectures) is not supported; kiln exports llama"),
            (
                json!({"model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "intermediate_size": [8, 8]}),
                "model_type \"gemma4_text\" (architectures[0] \"Gemma4ForCausalLM\") is not supported",
            ),
            (json!({"architectures": ["LlamaForSequenceClassification"]}), "(architectures[0] \"LlamaForSequenceClassification\")"),
            (json!({"rope_scaling": {"rope_type": "dynamic", "factor": 8.0}}), "rope_scaling.rope_type = \"dynamic\": kiln implements the rope types default, linear, llama3, yarn"),
            (json!({"rope_parameters": {"rope_type": "longrope"}}), "rope_parameters.rope_type = \"longrope\""),
            (json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}), "rope_scaling.low_freq_factor is missing"),
            (json!({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 3}}), "rope_scaling.beta_fast = 3: not a parameter of rope_type linear"),
            (json!({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}), "rope_scaling.factor = -2.0: must be positive"),
            (json!({"partial_rotary_factor": 0.5}), "partial_rotary_factor = 0.5: kiln rotates whole heads only"),
            (json!({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}}), "rope_parameters.partial_rotary_factor = 0.25"),
            (json!({"mlp_bias": true}), "mlp_bias = true: kiln supports only false"),
            (json!({"attention_bias": true}), "attention_bias = true"),
            (json!({"hidden_act": "gelu"}), "hidden_act = \"gelu\": kiln supports only \"silu\""),
            (json!({"hidden_size": 30}), "hidden_size = 30: is not a multiple of num_attention_heads 4"),
            (json!({"num_attention_heads": 0}), "num_attention_heads = 0: must be positive"),
            (json!({"num_key_value_heads": 3}), "num_key_value_heads = 3: must divide the 4 query heads"),
            (json!({"rms_norm_eps": -1.0}), "rms_norm_eps = -1.0: must be positive and finite"),
            (json!({"rms_norm_eps": 0}), "rms_norm_eps = 0.0: must be positive"),
            (json!({"rope_theta": 0.5}), "rope_theta = 0.5: must be greater than 1"),
            (json!({"vocab_size": "many"}), "vocab_size = \"many\": invalid type: string \"many\", expected usize"),
            (json!({"rope_interleaved": true}), "rope_interleaved = true"),
            (json!({"is_encoder_decoder": true}), "is_encoder_decoder = true"),
            (json!({"num_experts": 8}), "num_experts = 8: kiln does not know this key for model_type llama"),
            (json!({"quantization_config": {"quant_method": "gptq"}}), "quantization_config = {\"quant_method\":\"gptq\"}: kiln does not know"),
            (json!({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1}),
             "layer_types = [\"full_attention\",\"sliding_attention\"]: kiln slides every layer of a qwen model or none"),
        ];
        for (extra, needle) in refused {
            let e = hf(extra.clone()).expect_err("refused");
            assert!(e.contains(needle), "{extra}: '{e}' should contain '{needle}'");
        }
        // Unknown keys are fine when null; known no-effect keys whatever their value.
        assert!(hf(json!({"num_experts": null, "initializer_range": 0.5, "max_length": 20})).is_ok());
        // SmolLM2-135M-Instruct's own config.json.
        let smollm2 = json!({
            "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
            "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576,
            "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": true,
            "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
            "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1,
            "rms_norm_eps": 1e-05, "rope_interleaved": false, "rope_scaling": null, "rope_theta": 100000,
            "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
            "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}},
            "use_cache": true, "vocab_size": 49152
        });
        let Ok(Some(c)) = hf(smollm2) else { panic!("SmolLM2's config") };
        assert_eq!((c.dims.head_count, c.dims.head_count_kv, c.dims.head_dim, c.rope.theta), (9, 3, 64, 100000.0));
        // Qwen with a window on every layer, or with the window off.
        let Ok(Some(c)) =
            hf(json!({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 0}))
        else {
            panic!()
        };
        assert_eq!(c.sliding_window, Some(8));
        let Ok(Some(c)) = hf(
            json!({"model_type": "qwen3", "sliding_window": 8, "layer_types": ["sliding_attention", "sliding_attention"]}),
        ) else {
            panic!()
        };
        assert_eq!((c.sliding_window, c.qk_norm), (None, true), "use_sliding_window is false");
    }

    /// A tensor the front-end does not read (llama.cpp's optional output
    /// bias) stops the export rather than being left out.
    #[test]
    fn unused_tensors_are_refused() {
        let bias = vec![("blk.1.attn_output.bias".to_string(), vec![32], 0, vec![0; 4 * 32])];
        let gguf = Gguf::parse(tiny_with("llama", false, &[], bias, vec![])).unwrap();
        let family = Family::from_gguf(&gguf).unwrap();
        let e = crate::models::Serving::new(&family, &keep(&gguf), 8).err().expect("refused").to_string();
        assert!(
            e.contains(
                "tensor \"blk.1.attn_output.bias\" is in the checkpoint but kiln's llama front-end does not use it"
            ),
            "{e}"
        );
        let plain = Gguf::parse(tiny("llama", false, &[])).unwrap();
        assert!(crate::models::Serving::new(&Family::from_gguf(&plain).unwrap(), &keep(&plain), 8).is_ok());
    }

    /// The GGUF cases of issue 15: keys kiln does not compute are refused.
    /// YaRN 4x over 4096 positions with transformers' (and llama.cpp's) defaults.
    fn yarn_defaults_4x_of_4096() -> RopeScaling {
        RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            attention_factor: 0.1 * 4f64.ln() + 1.0,
        }
    }

    #[test]
    fn gguf_keys_are_read_or_refused() {
        let with = |meta: Vec<(&'static str, Meta)>| {
            let bytes = tiny_with("llama", true, &[], vec![], meta);
            Config::from_gguf(&Gguf::parse(bytes).unwrap()).map_err(|e| e.to_string())
        };
        assert!(with(vec![("llama.context_length", Meta::U32(8192))]).is_ok());
        let refused = [
            (
                vec![("llama.expert_count", Meta::U32(8)), ("llama.expert_used_count", Meta::U32(9))],
                "GGUF metadata: llama.expert_used_count = 9: is more than expert_count 8",
            ),
            (
                vec![("llama.attention.layer_norm_rms_epsilon", Meta::F32(-1.0))],
                "llama.attention.layer_norm_rms_epsilon = -1: must be positive and finite",
            ),
            (vec![("llama.attention.layer_norm_rms_epsilon", Meta::F32(f32::NAN))], "= NaN: must be positive"),
            (vec![("llama.attention.head_count", Meta::U32(0))], "llama.attention.head_count = 0: must be positive"),
            (vec![("llama.attention.head_count_kv", Meta::U32(3))], "head_count_kv = 3: must divide the 4 query heads"),
            (vec![("llama.rope.dimension_count", Meta::U32(4))], "llama.rope.dimension_count = 4: partial rotary"),
            (vec![("llama.rope.scaling.type", Meta::Str("longrope"))], "llama.rope.scaling.type = \"longrope\""),
            (vec![("llama.logit_scale", Meta::F32(0.5))], "llama.logit_scale = 0.5: kiln does not know this key"),
        ];
        for (extra, needle) in refused {
            let e = with(extra).expect_err("refused");
            assert!(e.contains(needle), "'{e}' should contain '{needle}'");
        }
        // GGUF yarn (llama.cpp's keys) is HF's yarn with its defaults.
        let c = with(vec![
            ("llama.rope.scaling.type", Meta::Str("yarn")),
            ("llama.rope.scaling.factor", Meta::F32(4.0)),
            ("llama.rope.scaling.original_context_length", Meta::U32(4096)),
        ])
        .unwrap();
        let yarn = yarn_defaults_4x_of_4096();
        assert_eq!(c.rope.scaling, yarn);
    }

    /// Qwen2's projection biases and Qwen3's per-head q/k norms are params
    /// that change the logits; both architectures use NeoX RoPE.
    #[test]
    fn tiny_qwen_variants_load_their_extra_tensors() {
        let logits = |gguf: &Gguf<Vec<u8>>| {
            let graph = prefill(&keep(gguf), 4).unwrap();
            assert_eq!(graph.params().count(), gguf.tensors().len(), "every tensor is a param");
            interp::run(&graph, &[tokens(&[1, 5, 9, 3])], &keep(gguf)).unwrap().remove(0).to_f64_vec()
        };
        for (arch, extra) in [("qwen2", "blk.1.attn_k.bias"), ("qwen3", "blk.1.attn_k_norm.weight")] {
            let with = Gguf::parse(tiny(arch, true, &[])).unwrap();
            let config = Config::from_gguf(&with).unwrap();
            assert_eq!((config.architecture.as_str(), config.rope_style), (arch, RopeStyle::NeoX));
            assert_eq!(with.tensors().len(), 2 * 9 + 2 + 2 * if arch == "qwen2" { 3 } else { 2 });
            let full = logits(&with);
            assert!(full.iter().all(|x| x.is_finite()));
            // Without one of the extra tensors the block loads as plain llama's.
            let e = prefill(&keep(&Gguf::parse(tiny(arch, true, &[extra])).unwrap()), 4).unwrap_err().to_string();
            assert!(e.contains(extra), "a half-present pair names what is missing: {e}");
        }
        let qwen2 = Gguf::parse(tiny("qwen2", true, &[])).unwrap();
        let biases: Vec<String> =
            (0..2).flat_map(|i| ["attn_q", "attn_k", "attn_v"].map(|n| format!("blk.{i}.{n}.bias"))).collect();
        let biases: Vec<&str> = biases.iter().map(String::as_str).collect();
        // The same blocks without biases: qwen2 always has them, so as llama.
        let no_bias = Gguf::parse(tiny("qwen2", true, &biases)).unwrap();
        let mut config = Config::from_gguf(&no_bias).unwrap();
        config.qkv_bias = false;
        let graph = prefill_of(&config, &keep(&no_bias), 4).unwrap();
        let plain = interp::run(&graph, &[tokens(&[1, 5, 9, 3])], &keep(&no_bias)).unwrap().remove(0).to_f64_vec();
        assert_ne!(logits(&qwen2), plain, "the biases count");
    }

    /// A Llama 3.1 GGUF's `rope_freqs.weight` (llama.cpp's converter writes
    /// HF's `rope_scaling: llama3` as one divisor per frequency) rotates as
    /// the llama3 scaling computed in the graph does.
    #[test]
    fn rope_freqs_divide_frequencies_as_llama3_scaling_does() {
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let hd = 8;
        let divisors = crate::models::synth::freq_divisors(RopeConfig { theta: 10000.0, scaling: llama3 }, hd).unwrap();
        assert!(divisors[0] == 1.0 && divisors[3] == 8.0 && divisors[1] > 1.0, "{divisors:?}: every branch is taken");
        let bytes = divisors.iter().flat_map(|d| d.to_le_bytes()).collect();
        let with =
            Gguf::parse(tiny_with("llama", true, &[], vec![(ROPE_FREQS.into(), vec![hd / 2], 0, bytes)], vec![]))
                .unwrap();
        let plain = Gguf::parse(tiny("llama", true, &[])).unwrap();
        let ids = [1, 5, 9, 3, 7, 2, 11, 4, 6, 0, 13, 8];
        let logits = |config: &Config, gguf: &Gguf<Vec<u8>>| {
            let graph = prefill_of(config, &keep(gguf), ids.len()).unwrap();
            interp::run(&graph, &[tokens(&ids)], &keep(gguf)).unwrap().remove(0).to_f64_vec()
        };
        let mut scaled = Config::from_gguf(&plain).unwrap();
        scaled.rope.scaling = llama3;
        let from_tensor = logits(&Config::from_gguf(&with).unwrap(), &with);
        let unscaled = logits(&Config::from_gguf(&plain).unwrap(), &plain);
        let diff = max_abs_diff(&from_tensor, &logits(&scaled, &plain));
        let effect = max_abs_diff(&from_tensor, &unscaled);
        eprintln!("rope_freqs vs llama3 scaling: {diff:e}; vs none: {effect:e}");
        assert!(diff < 1e-4 && effect > 1e4 * diff, "{diff:e} {effect:e}");

        let wrong = vec![(ROPE_FREQS.into(), vec![hd], 0, vec![0; 4 * hd])];
        let wrong = Gguf::parse(tiny_with("llama", true, &[], wrong, vec![])).unwrap();
        let e = prefill(&keep(&wrong), 4).unwrap_err().to_string();
        assert!(e.contains(ROPE_FREQS), "{e}");
    }
}
