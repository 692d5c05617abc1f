//! gpt-oss: a pre-norm decoder whose attention has biases on all four
//! projections and a learned per-head sink logit, alternating sliding-window
//! and full layers, YaRN-scaled RoPE, and a mixture-of-experts feed-forward
//! on every layer with biased router and experts and a clamped SwiGLU.
//!
//! - Model card: OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card"
//!   (<https://arxiv.org/abs/2508.10925>).
//! - References: llama.cpp `src/models/openai-moe-iswa.cpp` (arch
//!   `gpt-oss`, `LLM_ARCH_OPENAI_MOE`), whose GGUF names and keys are read
//!   here; transformers `models/gpt_oss/modeling_gpt_oss.py`
//!   (`GptOssForCausalLM`, whose `config.json` and dense checkpoints are
//!   read too: [`Config::from_hf`], [`HF_NAMES`]).
//!
//! ```text
//! x += W_o · attn(rms(x) · attn_norm) + b_o        sinks[h] in each head's softmax
//! x += moe(rms(x) · post_attention_norm)           (GGUF's name for the FFN's input norm)
//! ```
//! Layer `i` slides a window when `i` is even (llama.cpp's
//! `set_swa_pattern(2)`, transformers' default `layer_types`). The routing
//! is a softmax over the `k` largest router logits, which is the softmax
//! over all `E` renormalized over the chosen ([`MoeConfig::norm_topk`]).
//! The SwiGLU's α = 1.702 and limit 7 are in no GGUF key: llama.cpp and
//! transformers hard-code them for every gpt-oss.
//!
//! RoPE rotates halves (NeoX) over the whole head; YaRN's correction range
//! is rounded to whole dims as llama.cpp does for GGUF input
//! ([`config::rope_from_gguf`]) and as `rope_parameters.truncate` says for
//! HF's (false in OpenAI's checkpoints).
//!
//! transformers keeps the experts transposed (`gate_up_proj` `[E, H, 2F]`,
//! gate the even columns; `down_proj` `[E, F, H]`) and their biases
//! interleaved likewise: the stacks kiln computes with are assembled from
//! them into `params.irpa` at export ([`HfStack`], `Fused::transposed`).
//! OpenAI's own checkpoints (`quantization_config.quant_method = mxfp4`)
//! keep them as MXFP4 `*_blocks` and `*_scales`, gate and up interleaved by
//! rows: repacked into ggml's MXFP4 blocks (the same numbers) at export,
//! then kept packed or dequantized as `--packed` says.

use super::blocks::{Activation, Attention, AttentionConfig, BlockConfig, Positional, Stack};
use super::config::{self, Dims, GgufKeys, HfKeys, RopeConfig};
use super::decoder::DecoderConfig;
use super::hf::{Fused, HfNames, HfStack};
use super::moe::{ExpertGate, MoeConfig};
use super::{Checkpoint, Decoder, KvCache, ModelError, Result, Span};
use crate::trace::{Tensor, Tracer};
use crate::weights::gguf::Gguf;
use crate::weights::hf_config::HfConfig;

/// The clamped SwiGLU of every gpt-oss (llama.cpp `swiglu_oai`).
const GATE: ExpertGate = ExpertGate::ClampedSwiglu { alpha: 1.702, limit: 7.0 };

/// Hyper-parameters, from GGUF metadata under llama.cpp's `gpt-oss.*` keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The sizes.
    pub dims: Dims,
    /// The base frequency and YaRN's scaling, on every layer.
    pub rope: RopeConfig,
    /// `attention.sliding_window`, in tokens.
    pub sliding_window: usize,
    /// Whether block `i` slides the window (else it attends to every
    /// position before it).
    pub sliding: Vec<bool>,
    /// Every block's mixture of experts.
    pub experts: MoeConfig,
}

impl Config {
    /// Reads the `gpt-oss.*` keys, each one used, listed as not changing the
    /// forward pass, or refused ([`GgufKeys::finish`]).
    pub fn from_gguf<D: AsRef<[u8]> + ?Sized>(gguf: &Gguf<D>) -> Result<Config> {
        let keys = GgufKeys::new(gguf)?;
        if keys.arch != "gpt-oss" {
            return Err(ModelError::UnknownArchitecture(keys.arch.clone()));
        }
        // The trained context, and the dense width llama.cpp's converter
        // writes (the experts' width is `expert_feed_forward_length`).
        keys.ignore(&["context_length", "feed_forward_length"]);
        let embedding_length = keys.count("embedding_length")?;
        let head_count = keys.count("attention.head_count")?;
        let head_dim = keys.count("attention.key_length")?;
        config::head_dim_only(
            &keys,
            "attention.value_length",
            head_dim,
            &format!("kiln needs the key length {head_dim}"),
        )?;
        config::full_rotary(&keys, head_dim)?;
        let theta = keys.positive_f64("rope.freq_base", None)?;
        if let Some(swa) = keys.float("rope.freq_base_swa")? {
            if swa != theta {
                return Err(keys.error(
                    "rope.freq_base_swa",
                    swa,
                    format!("kiln rotates every layer by rope.freq_base {theta}"),
                ));
            }
        }
        let (experts, used) = config::expert_counts_gguf(&keys)?;
        let block_count = keys.count("block_count")?;
        let config = Config {
            dims: Dims {
                block_count,
                embedding_length,
                head_count,
                head_count_kv: keys.int_or("attention.head_count_kv", head_count)?,
                head_dim,
                vocab_size: config::vocab_size(&keys)?,
                rms_norm_eps: keys.positive_f64("attention.layer_norm_rms_epsilon", None)?,
            },
            rope: RopeConfig { theta, scaling: config::rope_from_gguf(&keys)? },
            sliding_window: keys.count("attention.sliding_window")?,
            sliding: config::sliding_pattern(&keys, block_count, 2)?,
            experts: MoeConfig {
                experts,
                used,
                feed_forward_length: keys.count("expert_feed_forward_length")?,
                norm_topk: true,
                biases: true,
                gate: GATE,
            },
        };
        keys.finish()?;
        config::check_heads(&config.dims, "attention.key_length", &|key, value, message| {
            keys.error(key, value, message)
        })?;
        Ok(config)
    }

    /// From a `GptOssForCausalLM`'s `config.json`, every key read or
    /// refused.
    pub fn from_hf(hf: &HfConfig) -> Result<Config> {
        let keys = HfKeys::new("config.json", &hf.model_type, &hf.keys);
        // OpenAI's MXFP4 experts (which modules stay dense is what the
        // tensors' names say).
        if let Some(q) = keys.raw("quantization_config") {
            if q.get("quant_method").and_then(|m| m.as_str()) != Some("mxfp4") {
                return Err(keys.error(
                    "quantization_config",
                    q,
                    "kiln reads dense or MXFP4 (quant_method mxfp4) experts",
                ));
            }
            keys.ignore(&["quantization_config"]);
        }
        keys.fixed("attention_bias", "true", "gpt-oss's biased attention projections")?;
        // Unused by gpt-oss's modeling (its SwiGLU is its own), and what
        // OpenAI's checkpoints add: the training context, a copy of
        // `num_experts_per_tok` (checked below), the router's training loss.
        keys.ignore(&["hidden_act", "max_position_embeddings", "initial_context_length"]);
        keys.ignore(&["output_router_logits", "router_aux_loss_coef"]);
        let block_count = keys.count("num_hidden_layers")?;
        let (experts, used) = config::expert_counts_hf(&keys)?;
        if let Some(copy) = keys.get::<usize>("experts_per_token")? {
            if copy != used {
                return Err(keys.error(
                    "experts_per_token",
                    &copy.into(),
                    format!("differs from num_experts_per_tok {used}"),
                ));
            }
        }
        let heads = keys.count("num_attention_heads")?;
        let sliding = match config::layer_types(&keys, block_count)? {
            Some(sliding) => sliding,
            None => (0..block_count).map(|i| i % 2 == 0).collect(),
        };
        let config = Config {
            dims: Dims {
                block_count,
                embedding_length: keys.count("hidden_size")?,
                head_count: heads,
                head_count_kv: keys.count_or("num_key_value_heads", heads)?,
                head_dim: keys.count("head_dim")?,
                vocab_size: keys.count("vocab_size")?,
                rms_norm_eps: keys.positive_f64("rms_norm_eps", Some(1e-5))?,
            },
            rope: config::rope_of(&keys, 150_000.0)?,
            sliding_window: keys.count("sliding_window")?,
            sliding,
            experts: MoeConfig {
                experts,
                used,
                feed_forward_length: keys.count("intermediate_size")?,
                norm_topk: true,
                biases: true,
                gate: ExpertGate::ClampedSwiglu {
                    alpha: keys.positive_f64("swiglu_alpha", Some(1.702))?,
                    limit: keys.positive_f64("swiglu_limit", Some(7.0))?,
                },
            },
        };
        // Read by SafetensorsWeights, through HfConfig::tie_word_embeddings.
        keys.get::<bool>("tie_word_embeddings")?;
        keys.finish()?;
        config::check_heads(&config.dims, "head_dim", &|key, value, message| {
            keys.error(config::hf_name(key), &value.into(), message)
        })?;
        Ok(config)
    }

    /// Every block: attention with q/k/v/o biases and sinks, then the
    /// experts, normed by `post_attention_norm`.
    fn block(&self) -> BlockConfig {
        let attention =
            AttentionConfig { qkv_bias: true, output_bias: true, sinks: true, ..AttentionConfig::of(&self.dims) };
        BlockConfig {
            attention,
            feed_forward_length: self.experts.feed_forward_length,
            activation: Activation::Silu,
            post_norms: false,
            experts: Some(self.experts),
            ffn_norm: "post_attention_norm",
        }
    }
}

/// Where a `GptOssForCausalLM` checkpoint keeps the tensors
/// ([`super::registry`]'s row): llama's whole-model names, its blocks'
/// below, and the experts' stacks transposed in `gate_up_proj` (gate and up
/// interleaved) and `down_proj`, their biases likewise.
pub const HF_NAMES: HfNames =
    HfNames { family: "gpt-oss", block_names: &[&HF_BLOCK_NAMES], stacks: &HF_STACKS, ..HfNames::DECODER };

const HF_BLOCK_NAMES: [(&str, &str); 14] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    ("attn_sinks.weight", "self_attn.sinks"),
    // The feed-forward's input norm.
    ("post_attention_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate_inp.weight", "mlp.router.weight"),
    ("ffn_gate_inp.bias", "mlp.router.bias"),
    ("ffn_down_exps.bias", "mlp.experts.down_proj_bias"),
];

const fn transposed(gguf: &'static str, name: &'static str, part: usize, parts: usize) -> HfStack {
    HfStack { gguf, per_expert: None, fused: Fused { name, part, parts, transposed: true } }
}

const HF_STACKS: [HfStack; 5] = [
    transposed("ffn_gate_exps.weight", "mlp.experts.gate_up_proj", 0, 2),
    transposed("ffn_up_exps.weight", "mlp.experts.gate_up_proj", 1, 2),
    transposed("ffn_down_exps.weight", "mlp.experts.down_proj", 0, 1),
    transposed("ffn_gate_exps.bias", "mlp.experts.gate_up_proj_bias", 0, 2),
    transposed("ffn_up_exps.bias", "mlp.experts.gate_up_proj_bias", 1, 2),
];

/// The whole model: embedding, blocks, final norm and the untied head.
pub struct GptOss<'t> {
    /// The hyper-parameters the model was loaded with.
    pub config: Config,
    stack: Stack<'t>,
}

impl DecoderConfig for Config {
    fn name(&self) -> &str {
        "gpt-oss"
    }

    fn load<'t>(&self, t: &'t Tracer, weights: &dyn Checkpoint) -> Result<Box<dyn Decoder<'t> + 't>> {
        let stack = Stack::load(t, weights, &self.dims, &|_| self.block(), Attention::forward, false)?;
        Ok(Box::new(GptOss { config: self.clone(), stack }))
    }

    fn experts(&self) -> Option<MoeConfig> {
        Some(self.experts)
    }
}

impl<'t> Decoder<'t> for GptOss<'t> {
    fn dims(&self) -> &Dims {
        &self.config.dims
    }

    /// Masked causally, and within the window on the sliding layers.
    fn hidden(&self, tokens: &Tensor<'t>, at: Span<'_, 't>, cache: Option<&mut KvCache<'t>>) -> Result<Tensor<'t>> {
        let (c, logits) = (&self.config, at.logits);
        let full = Positional::neox(c.rope, c.dims.head_dim, &at, None)?;
        let sliding = Positional::neox(c.rope, c.dims.head_dim, &at, Some(c.sliding_window))?;
        let at = |i: usize| if c.sliding[i] { &sliding } else { &full };
        self.stack.hidden(self.stack.embed(tokens)?, at, cache, logits)
    }

    fn logits(&self, hidden: &Tensor<'t>) -> Result<Tensor<'t>> {
        self.stack.logits(hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::testing::{gguf_bytes, Meta};
    use crate::trace::nn::RopeScaling;

    /// `gpt-oss.*` keys of a tiny model, with `changed` replacing or added
    /// to them.
    fn config_with(changed: Vec<(&'static str, Meta)>) -> Result<Config> {
        let mut meta = vec![
            ("general.architecture", Meta::Str("gpt-oss")),
            ("gpt-oss.block_count", Meta::U32(4)),
            ("gpt-oss.context_length", Meta::U32(64)),
            ("gpt-oss.embedding_length", Meta::U32(32)),
            ("gpt-oss.feed_forward_length", Meta::U32(32)),
            ("gpt-oss.attention.head_count", Meta::U32(4)),
            ("gpt-oss.attention.head_count_kv", Meta::U32(2)),
            ("gpt-oss.attention.key_length", Meta::U32(16)),
            ("gpt-oss.attention.value_length", Meta::U32(16)),
            ("gpt-oss.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
            ("gpt-oss.attention.sliding_window", Meta::U32(4)),
            ("gpt-oss.rope.freq_base", Meta::F32(150000.0)),
            ("gpt-oss.rope.scaling.type", Meta::Str("yarn")),
            ("gpt-oss.rope.scaling.factor", Meta::F32(32.0)),
            ("gpt-oss.rope.scaling.original_context_length", Meta::U32(16)),
            ("gpt-oss.expert_count", Meta::U32(8)),
            ("gpt-oss.expert_used_count", Meta::U32(2)),
            ("gpt-oss.expert_feed_forward_length", Meta::U32(32)),
            ("gpt-oss.vocab_size", Meta::U32(16)),
        ];
        meta.retain(|(k, _)| !changed.iter().any(|(c, _)| c == k));
        meta.extend(changed);
        Config::from_gguf(&Gguf::parse(gguf_bytes(&meta, &[])).unwrap())
    }

    /// Heads wider than the residual stream (64 × 64 over 2880 in the
    /// real ones), every other layer sliding from the first, yarn with
    /// llama.cpp's whole-dim correction range, the experts' biases and
    /// clamped SwiGLU.
    #[test]
    fn config_from_metadata() {
        let c = config_with(vec![]).unwrap();
        assert_eq!((c.dims.head_count * c.dims.head_dim, c.dims.embedding_length), (64, 32));
        assert_eq!((c.sliding.as_slice(), c.sliding_window), (&[true, false, true, false][..], 4));
        let RopeScaling::Yarn { factor, original_max_position_embeddings, truncate, .. } = c.rope.scaling else {
            panic!("{:?}", c.rope)
        };
        assert_eq!((c.rope.theta, factor, original_max_position_embeddings, truncate), (150000.0, 32.0, 16, true));
        assert_eq!(
            c.experts,
            MoeConfig { experts: 8, used: 2, feed_forward_length: 32, norm_topk: true, biases: true, gate: GATE }
        );
    }

    /// Keys kiln would compute differently are refused by name.
    #[test]
    fn keys_are_read_or_refused() {
        let refused = |changed| config_with(changed).unwrap_err().to_string();
        let e = refused(vec![("gpt-oss.rope.freq_base_swa", Meta::F32(10000.0))]);
        assert!(
            e.contains("gpt-oss.rope.freq_base_swa = 10000: kiln rotates every layer by rope.freq_base 150000"),
            "{e}"
        );
        let e = refused(vec![("gpt-oss.expert_used_count", Meta::U32(9))]);
        assert!(e.contains("gpt-oss.expert_used_count = 9: is more than expert_count 8"), "{e}");
        let e = refused(vec![("gpt-oss.expert_shared_count", Meta::U32(1))]);
        assert!(e.contains("gpt-oss.expert_shared_count"), "{e}");
        let e = refused(vec![("gpt-oss.some_new_key", Meta::U32(1))]);
        assert!(e.contains("gpt-oss.some_new_key = 1: kiln does not know this key"), "{e}");
        // What llama.cpp reads besides: another period of global layers, the
        // sliding layers' base frequency where it is the others'.
        let c = config_with(vec![("gpt-oss.attention.sliding_window_pattern", Meta::U32(3))]).unwrap();
        assert_eq!(c.sliding, [true, true, false, true]);
        assert!(config_with(vec![("gpt-oss.rope.freq_base_swa", Meta::F32(150000.0))]).is_ok());
    }
}
