//! Hugging Face `config.json` for the decoder-only families kiln exports
//! (llama, mistral, qwen2, qwen3, gemma3). Keys are HF's own; keys kiln
//! does not use are kept in `extra`, never an error.

use super::WeightsError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

fn default_rope_theta() -> f64 {
    10_000.0
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}

/// The keys of a Hugging Face `config.json` that kiln reads, by HF's names.
#[derive(Clone, Debug, Deserialize)]
pub struct HfConfig {
    /// Model classes: `["LlamaForCausalLM"]`.
    #[serde(default)]
    pub architectures: Vec<String>,
    /// The family: `llama`, `qwen2`, `gemma3_text`.
    pub model_type: String,
    /// Number of tokens.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` (no grouped-query attention).
    pub num_key_value_heads: Option<usize>,
    /// Defaults to `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    /// The RMS norms' epsilon; 1e-6 if absent.
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// Rotary base frequency; 10000 if absent.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// `{"rope_type": "llama3", "factor": 8.0, ...}` or `{"type": "linear", ...}`.
    pub rope_scaling: Option<serde_json::Value>,
    /// The context length the model was trained for.
    pub max_position_embeddings: Option<usize>,
    /// Whether the output projection is the token embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Qwen2: q/k/v projections carry biases.
    pub attention_bias: Option<bool>,
    /// Sliding-window attention span, in tokens.
    pub sliding_window: Option<usize>,
    /// Gemma 3: every N-th layer is global, the others slide.
    pub sliding_window_pattern: Option<usize>,
    /// Per layer, `sliding_attention` or `full_attention` (newer Gemma 3 configs).
    pub layer_types: Option<Vec<String>>,
    /// Gemma 3: rotary base of the sliding layers.
    pub rope_local_base_freq: Option<f64>,
    /// Gemma 3: attention scores are scaled by `1/√query_pre_attn_scalar`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma: the logits are soft-capped at this.
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 2: the attention scores are soft-capped at this.
    pub attn_logit_softcapping: Option<f64>,
    /// Gemma's name for the activation: `gelu_pytorch_tanh`.
    pub hidden_activation: Option<String>,
    /// The activation: `silu`, `gelu_pytorch_tanh`.
    pub hidden_act: Option<String>,
    /// Beginning-of-sequence token id(s), as written.
    pub bos_token_id: Option<serde_json::Value>,
    /// End-of-sequence token id(s), as written: one id or a list.
    pub eos_token_id: Option<serde_json::Value>,
    /// Every other key, as written.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl HfConfig {
    /// Reads and parses a `config.json`.
    pub fn open(path: &Path) -> Result<HfConfig, WeightsError> {
        let text = std::fs::read_to_string(path).map_err(|error| WeightsError::Io { path: path.into(), error })?;
        Self::parse(&text).map_err(|message| WeightsError::Format { path: path.into(), message })
    }

    /// Parses `config.json` text; the error says what is missing or mistyped.
    pub fn parse(text: &str) -> Result<HfConfig, String> {
        serde_json::from_str(text).map_err(|e| format!("not a usable config.json: {e}"))
    }

    /// Key/value heads per layer: `num_key_value_heads`, else one per query head.
    pub fn num_key_value_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Features per head: `head_dim`, else `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_llama_config_and_keeps_unknown_keys() {
        let c = HfConfig::parse(
            r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
                "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5,
                "rope_theta": 100000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
                "rope_scaling": null}"#,
        )
        .unwrap();
        assert_eq!(c.head_dim(), 64);
        assert_eq!(c.num_key_value_heads(), 3);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.extra["torch_dtype"], "bfloat16");
    }

    #[test]
    fn missing_required_key_names_it() {
        let e = HfConfig::parse(r#"{"model_type": "llama"}"#).unwrap_err();
        assert!(e.contains("vocab_size"), "{e}");
    }
}
