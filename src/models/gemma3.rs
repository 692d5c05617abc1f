//! Gemma 3 (text): a decoder-only transformer that interleaves
//! sliding-window (local) and global attention layers, with RMS-normed
//! queries and keys, norms both before and after each sub-layer, a GeGLU
//! feed-forward and an embedding scaled by `√hidden`.
//!
//! - Paper: Gemma Team, "Gemma 3 Technical Report"
//!   (<https://arxiv.org/abs/2503.19786>).
//! - References: llama.cpp `src/models/gemma3.cpp` (`llm_build_gemma3`,
//!   the iswa variant) and the `LLM_ARCH_GEMMA3` case of
//!   `llama_model::load_hparams`, the GGUF names and metadata used here;
//!   HF transformers `models/gemma3/modeling_gemma3.py`.
//!
//! GGUF specifics, as llama.cpp's converter writes them:
//! - Norm weights already hold HF's `1 + w` (`Gemma3Model.norm_shift`), so
//!   every norm here is a plain [`Tensor::rms_norm`], not
//!   [`Tensor::gemma_rms_norm`].
//! - Q/K rows are stored in HF order, so RoPE pairs `(i, i + d/2)`
//!   ([`RopeStyle::NeoX`](crate::trace::nn::RopeStyle::NeoX), llama.cpp's `LLAMA_ROPE_TYPE_NEOX` for gemma3).
//! - What the metadata leaves out, llama.cpp hard-codes and so do we: five
//!   local layers then one global ([`SLIDING_WINDOW_PATTERN`]), local
//!   layers' rope base 10000 without scaling, and the attention scale.
//!
//! HF checkpoints ([`Config::from_hf`], names mapped by [`super::hf`])
//! store the norms' `w`, so their weights become `1 + w` at load
//! ([`Config::norm_adds_one`]); `config.json` says the rest
//! (`query_pre_attn_scalar`, `layer_types`, each layer type's rope).

use super::blocks::{Activation, Attention, AttentionConfig, BlockConfig, Positional, Stack};
use super::config::{self, Dims, GgufKeys, RopeConfig};
use super::decoder::DecoderConfig;
use super::hf::HfNames;
use super::{Checkpoint, Decoder, KvCache, ModelError, Result, Span};
use crate::trace::nn::RopeScaling;
use crate::trace::{Tensor, Tracer};
use crate::weights::gguf::Gguf;
use crate::weights::hf_config::HfConfig;

/// Every `SLIDING_WINDOW_PATTERN`-th layer is global, the others slide:
/// layer `i` is global iff `(i + 1) % 6 == 0` (llama.cpp
/// `hparams.set_swa_pattern(6)`, HF `sliding_window_pattern = 6`), unless
/// the checkpoint says otherwise.
pub const SLIDING_WINDOW_PATTERN: usize = 6;

/// Rope base of the local layers (llama.cpp `rope_freq_base_train_swa`,
/// HF `rope_local_base_freq`); GGUF has no key for it.
pub const LOCAL_ROPE_FREQ_BASE: f64 = 10000.0;

/// Hyper-parameters, from GGUF metadata under llama.cpp's key names, or
/// from HF's `config.json` ([`Config::from_hf`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The sizes; the head is 256 wide in every Gemma 3, whatever the width.
    pub dims: Dims,
    /// `gemma3.feed_forward_length`
    pub feed_forward_length: usize,
    /// `gemma3.attention.value_length` (defaults to `head_dim`)
    pub value_length: usize,
    /// The global layers' rope: `gemma3.rope.freq_base` (defaults to
    /// 10000) and `gemma3.rope.scaling.factor` (or the older
    /// `gemma3.rope.scale_linear`), linear.
    pub rope: RopeConfig,
    /// The local layers' rope: [`LOCAL_ROPE_FREQ_BASE`] without scaling in
    /// GGUF, HF `rope_local_base_freq` or `rope_parameters.sliding_attention`.
    pub local_rope: RopeConfig,
    /// `gemma3.attention.sliding_window`; absent when every layer is global
    pub sliding_window: Option<usize>,
    /// Per layer, whether it attends within the window: every layer but
    /// each [`SLIDING_WINDOW_PATTERN`]-th, or as `layer_types` says.
    pub sliding: Vec<bool>,
    /// Query scale, HF's `query_pre_attn_scalar^-0.5`: GGUF has no key for
    /// it, so llama.cpp's rule: `head_dim^-0.5`, except 27B (62 layers)
    /// where it is `(embedding_length / head_count)^-0.5`.
    pub attention_scale: f64,
    /// `gemma3.final_logit_softcapping` (Gemma 3 checkpoints have none)
    pub final_logit_softcapping: Option<f64>,
    /// Norm weights are stored as `w` and scale by `1 + w` (HF's
    /// `Gemma3RMSNorm`); llama.cpp's converter stores `1 + w` in GGUF.
    pub norm_adds_one: bool,
}

impl Config {
    /// Reads the `gemma3.*` keys, each one used, listed as not changing the
    /// forward pass, or refused ([`GgufKeys::finish`]).
    pub fn from_gguf<D: AsRef<[u8]> + ?Sized>(gguf: &Gguf<D>) -> Result<Config> {
        let keys = GgufKeys::of_arch(gguf, "gemma3")?;
        let embedding_length = keys.count("embedding_length")?;
        let head_count = keys.count("attention.head_count")?;
        if !embedding_length.is_multiple_of(head_count) {
            return Err(keys.error(
                "embedding_length",
                embedding_length,
                format!("is not a multiple of gemma3.attention.head_count {head_count}"),
            ));
        }
        let head_dim = keys.int_or("attention.key_length", embedding_length / head_count)?;
        let vocab_size = config::vocab_size(&keys)?;
        config::full_rotary(&keys, head_dim)?;
        let block_count = keys.count("block_count")?;
        let sliding_window = match keys.get("attention.sliding_window") {
            Some(_) => Some(keys.count("attention.sliding_window")?),
            None => None,
        };
        let sliding = config::sliding_pattern(&keys, block_count, SLIDING_WINDOW_PATTERN)?;
        let rope_scaling = config::rope_from_gguf(&keys)?;
        if let RopeScaling::Yarn { .. } = rope_scaling {
            return Err(keys.error(
                "rope.scaling.type",
                "\"yarn\"",
                "only linear rope scaling is supported for gemma3",
            ));
        }
        if let Some(cap) = keys.float("attn_logit_softcapping")? {
            return Err(keys.error("attn_logit_softcapping", cap, ATTN_SOFTCAP_REFUSED));
        }
        let config = Config {
            dims: Dims {
                block_count,
                embedding_length,
                head_count,
                head_count_kv: keys.int_or("attention.head_count_kv", head_count)?,
                head_dim,
                vocab_size,
                rms_norm_eps: keys.positive_f64("attention.layer_norm_rms_epsilon", None)?,
            },
            feed_forward_length: keys.count("feed_forward_length")?,
            value_length: keys.int_or("attention.value_length", head_dim)?,
            rope: RopeConfig { theta: keys.positive_f64("rope.freq_base", Some(10000.0))?, scaling: rope_scaling },
            local_rope: RopeConfig { theta: LOCAL_ROPE_FREQ_BASE, scaling: RopeScaling::None },
            sliding_window,
            sliding,
            attention_scale: match block_count {
                62 => 1.0 / ((embedding_length / head_count) as f64).sqrt(),
                _ => 1.0 / (head_dim as f64).sqrt(),
            },
            final_logit_softcapping: match keys.float("final_logit_softcapping")? {
                Some(_) => Some(keys.positive_f64("final_logit_softcapping", None)?),
                None => None,
            },
            norm_adds_one: false,
        };
        keys.finish()?;
        config.check(|key, value, message| keys.error(key, value, message))
    }

    /// From a Hugging Face `config.json`: `model_type` gemma3_text
    /// (`Gemma3ForCausalLM`), or gemma3 (`Gemma3ForConditionalGeneration`,
    /// whose `text_config` is read and whose vision tower is not exported).
    /// Defaults are `Gemma3TextConfig`'s; every key is read or refused.
    pub fn from_hf(hf: &HfConfig) -> Result<Config> {
        let (keys, wrapper) = config::text_config(hf, "gemma3_text", "gemma3")?;
        // Gemma 3's own config.json files leave out what the class defaults
        // to (Gemma-3-4B's text_config has no vocab_size or head counts).
        let hidden = keys.count_or("hidden_size", 2304)?;
        let heads = keys.count_or("num_attention_heads", 8)?;
        let kv_heads = keys.count_or("num_key_value_heads", 4)?;
        let head_dim = keys.count_or("head_dim", 256)?;
        let block_count = keys.count_or("num_hidden_layers", 26)?;
        keys.fixed("hidden_activation", "\"gelu_pytorch_tanh\"", "Gemma's GeGLU")?;
        keys.fixed("hidden_act", "\"gelu_pytorch_tanh\"", "Gemma's GeGLU")?;
        keys.fixed("attention_bias", "false", "attention projections without biases")?;
        keys.fixed("use_bidirectional_attention", "false", "causal attention")?;
        keys.ignore(&["max_position_embeddings", "cache_implementation"]);
        if let Some(cap) = keys.get::<f64>("attn_logit_softcapping")? {
            return Err(keys.error("attn_logit_softcapping", &serde_json::json!(cap), ATTN_SOFTCAP_REFUSED));
        }
        let final_logit_softcapping = match keys.get::<f64>("final_logit_softcapping")? {
            // transformers 5.24's Gemma3ForConditionalGeneration does not cap its logits.
            Some(cap) if wrapper.is_some() => {
                return Err(keys.error(
                    "final_logit_softcapping",
                    &serde_json::json!(cap),
                    "Gemma3ForConditionalGeneration does not apply it in transformers 5.24 (Gemma3ForCausalLM does); set it to null",
                ))
            }
            Some(_) => Some(keys.positive_f64("final_logit_softcapping", None)?),
            None => None,
        };
        // Sliding layers: `layer_types` (5.x), else every layer but each
        // `sliding_window_pattern`-th (4.x; 5.x also writes `_sliding_window_pattern`).
        // Absent: the class default; null: no window.
        let sliding_window = match keys.has("sliding_window") {
            false => Some(4096),
            true => keys.get::<usize>("sliding_window")?.map(|w| keys.positive("sliding_window", w)).transpose()?,
        };
        let pattern_key = ["sliding_window_pattern", "_sliding_window_pattern"];
        let every = match pattern_key.iter().find_map(|k| keys.get::<usize>(k).transpose()) {
            Some(n) => n?,
            None => SLIDING_WINDOW_PATTERN,
        };
        let sliding = match config::layer_types(&keys, block_count)? {
            Some(sliding) => sliding,
            None => config::every_nth_global(block_count, keys.positive("sliding_window_pattern", every)?),
        };
        if sliding_window.is_none() && sliding.contains(&true) {
            // HF would give those layers the local rope over the whole
            // context; kiln's local layers always slide.
            return Err(keys.error(
                "sliding_window",
                &serde_json::Value::Null,
                "kiln needs a window for the sliding_attention layers",
            ));
        }
        let (global, local) = config::layer_type_ropes(&keys, 1_000_000.0, LOCAL_ROPE_FREQ_BASE)?;
        let config = Config {
            dims: Dims {
                block_count,
                embedding_length: hidden,
                head_count: heads,
                head_count_kv: kv_heads,
                head_dim,
                vocab_size: keys.count_or("vocab_size", 262_208)?,
                rms_norm_eps: keys.positive_f64("rms_norm_eps", Some(1e-6))?,
            },
            feed_forward_length: keys.count_or("intermediate_size", 9216)?,
            value_length: head_dim,
            rope: global,
            local_rope: local,
            sliding_window,
            sliding,
            attention_scale: 1.0 / keys.positive_f64("query_pre_attn_scalar", Some(256.0))?.sqrt(),
            final_logit_softcapping,
            norm_adds_one: true,
        };
        // Read by SafetensorsWeights, through HfConfig::tie_word_embeddings.
        keys.get::<bool>("tie_word_embeddings")?;
        keys.finish()?;
        if let Some(w) = &wrapper {
            // The wrapper's own keys: the vision tower and its image tokens,
            // which text-only prompts never use.
            w.ignore(&[
                "vision_config",
                "mm_tokens_per_image",
                "boi_token_index",
                "eoi_token_index",
                "image_token_index",
                "boi_token_id",
                "eoi_token_id",
                "image_token_id",
            ]);
            w.get::<bool>("tie_word_embeddings")?;
            w.finish()?;
        }
        config.check(|key, value: usize, message| keys.error(config::hf_name(key), &value.into(), message))
    }

    /// Whether layer `i` attends within the sliding window (local) rather
    /// than to the whole sequence (global).
    pub fn is_sliding(&self, i: usize) -> bool {
        self.sliding_window.is_some() && self.sliding.get(i).copied().unwrap_or(false)
    }

    /// What both sources must satisfy: kv heads dividing the heads, even
    /// heads, one `sliding` entry per block.
    fn check(self, error: impl Fn(&str, usize, String) -> ModelError) -> Result<Config> {
        config::check_heads(&self.dims, "attention.key_length", &error)?;
        assert_eq!(self.sliding.len(), self.dims.block_count, "both readers give one entry per block");
        Ok(self)
    }
}

/// Why kiln refuses an attention soft-cap for Gemma 3.
const ATTN_SOFTCAP_REFUSED: &str = "transformers 5.24 and llama.cpp do not apply it to Gemma 3 (Gemma 2 did), \
    so kiln cannot tell what is meant; set it to null";

impl Config {
    /// Every block: sandwich norms, GeGLU, attention with per-head q and k
    /// norms, the value heads `value_length` wide, the queries scaled by
    /// `attention_scale`.
    fn block(&self) -> BlockConfig {
        let (value_length, scale) = (self.value_length, self.attention_scale);
        let attention = AttentionConfig { value_length, scale, qk_norm: true, ..AttentionConfig::of(&self.dims) };
        let feed_forward_length = self.feed_forward_length;
        BlockConfig {
            attention,
            feed_forward_length,
            activation: Activation::GeluTanh,
            post_norms: true,
            experts: None,
            ffn_norm: "ffn_norm",
        }
    }
}

/// The whole model: scaled embedding, blocks, final norm and the output
/// head (`output.weight`, or `token_embd.weight` when tied: then one param).
pub struct Gemma3<'t> {
    /// The hyper-parameters the model was loaded with.
    pub config: Config,
    stack: Stack<'t>,
}

impl<'t> Gemma3<'t> {
    /// Declares every weight in `t`, checking each shape against `c`.
    pub fn load(t: &'t Tracer, c: &Config, weights: &dyn Checkpoint) -> Result<Self> {
        let stack = Stack::load(t, weights, &c.dims, &|_| c.block(), Attention::forward, c.norm_adds_one)?;
        Ok(Gemma3 { config: c.clone(), stack })
    }
}

/// Gemma 3's per-block tensors. Its `post_attention_layernorm` norms the
/// attention's output (GGUF `post_attention_norm`), not the feed-forward's
/// input as llama's does; its whole-model tensors are llama's.
pub const HF_BLOCK_NAMES: [(&str, &str); 13] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("post_attention_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
    ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

/// Where an HF checkpoint keeps the tensors ([`super::registry`]'s row):
/// a `Gemma3ForCausalLM` as llama does, a `Gemma3ForConditionalGeneration`
/// its text model under `language_model.model.` (as transformers saves it)
/// or `model.language_model.` (its module tree), its vision tower left
/// alone; `has` says which names the checkpoint stores.
pub fn hf_names(config: &HfConfig, has: &dyn Fn(&str) -> bool) -> HfNames {
    let names = HfNames { family: "gemma3", block_names: &[&HF_BLOCK_NAMES], ..HfNames::DECODER };
    if config.model_type != "gemma3" {
        return names;
    }
    let body = ["language_model.model.", "model.language_model."]
        .into_iter()
        .find(|p| has(&format!("{p}embed_tokens.weight")))
        .unwrap_or("language_model.model.");
    let head =
        ["language_model.lm_head.weight", "lm_head.weight"].into_iter().find(|h| has(h)).unwrap_or("lm_head.weight");
    HfNames { body, head, ..names }
}

impl DecoderConfig for Config {
    fn name(&self) -> &str {
        "gemma3"
    }

    fn load<'t>(&self, t: &'t Tracer, weights: &dyn Checkpoint) -> Result<Box<dyn Decoder<'t> + 't>> {
        Ok(Box::new(Gemma3::load(t, self, weights)?))
    }
}

impl<'t> Decoder<'t> for Gemma3<'t> {
    fn dims(&self) -> &Dims {
        &self.config.dims
    }

    fn value_length(&self) -> usize {
        self.config.value_length
    }

    /// Masked causally, and within the window on local layers.
    fn hidden(&self, tokens: &Tensor<'t>, at: Span<'_, 't>, cache: Option<&mut KvCache<'t>>) -> Result<Tensor<'t>> {
        let (c, t, logits) = (&self.config, tokens.tracer(), at.logits);
        let global = Positional::neox(c.rope, c.dims.head_dim, &at, None)?;
        let local =
            c.sliding_window.map(|w| Positional::neox(c.local_rope, c.dims.head_dim, &at, Some(w))).transpose()?;
        // The embedding is scaled in f32, as llama.cpp does (HF rounds √hidden
        // to the weights' dtype first).
        let x = self.stack.embed(tokens)?;
        let x = x.multiply(&t.constant((c.dims.embedding_length as f64).sqrt(), x.ty.clone())?)?;
        let at = |i| match &local {
            Some(local) if c.is_sliding(i) => local,
            _ => &global,
        };
        self.stack.hidden(x, at, cache, logits)
    }

    fn logits(&self, hidden: &Tensor<'t>) -> Result<Tensor<'t>> {
        let logits = self.stack.logits(hidden)?;
        Ok(match self.config.final_logit_softcapping {
            Some(cap) => logits.soft_cap(cap)?,
            None => logits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{DType, Graph, Op, TensorType};
    use crate::interp::{self, Value};
    use crate::lower::{lower_to_string, LowerOptions};
    use crate::models::testing::{block_matrices, gemma3_path, gguf_bytes, Fill, Meta};
    use crate::models::{Family, GgufWeights, PackedPolicy};
    use crate::tokenizer::Tokenizer;
    use std::process::Command;
    use std::time::Instant;

    fn keep<D: AsRef<[u8]>>(gguf: &Gguf<D>) -> GgufWeights<'_, D> {
        GgufWeights::new(gguf, PackedPolicy::Keep).unwrap()
    }

    /// [`crate::models::prefill`] configured from the GGUF's metadata, packed weights kept.
    fn prefill<D: AsRef<[u8]>>(gguf: &Gguf<D>, seq_len: usize) -> Result<Graph> {
        crate::models::prefill(&Family::new(Config::from_gguf(gguf)?), &keep(gguf), seq_len)
    }

    fn gemma3() -> Gguf {
        let path = gemma3_path();
        Gguf::open(&path).unwrap_or_else(|e| panic!("{e} (run `make setup`)"))
    }

    fn tokens(ids: &[i32]) -> Value {
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        Value::from_le_bytes(&TensorType::new([1, ids.len()], DType::I32), &bytes).unwrap()
    }

    fn argmax(row: &[f64]) -> usize {
        (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
    }

    #[test]
    fn gemma3_config_from_metadata() {
        let c = Config::from_gguf(&gemma3()).unwrap();
        assert_eq!((c.dims.block_count, c.dims.embedding_length, c.feed_forward_length), (18, 640, 2048));
        assert_eq!((c.dims.head_count, c.dims.head_count_kv, c.dims.head_dim, c.value_length), (4, 1, 256, 256));
        assert_eq!((c.rope, c.sliding_window), (RopeConfig { theta: 1e6, scaling: RopeScaling::None }, Some(512)));
        assert_eq!((c.dims.vocab_size, c.attention_scale, c.final_logit_softcapping), (262144, 1.0 / 16.0, None));
        let global: Vec<usize> = (0..c.dims.block_count).filter(|&i| !c.is_sliding(i)).collect();
        assert_eq!(global, [5, 11, 17]);
    }

    #[test]
    fn gemma3_lowers_and_verifies() {
        let graph = prefill(&gemma3(), 6).unwrap();
        let start = Instant::now();
        let text = lower_to_string(&graph, &LowerOptions::default()).unwrap();
        eprintln!("lower: {:.2?}, {} bytes", start.elapsed(), text.len());
        assert!(text.contains("\"model\"::\"blk.17.post_ffw_norm.weight\""), "weights are named params");
        assert!(!text.contains("\"model\"::\"output.weight\""));
        // One global per tensor; 6 rows stream the packed ones, each tiled
        // by rows into a global of its own at load.
        assert_eq!(text.matches("\"util.global\"() {initial_value = #flow.parameter.named").count(), 236);
    }

    /// "The capital of France is" through the interpreter, checked against
    /// numpy (test/models/gemma3_reference.py, float64 from gguf-py's
    /// dequantizers) and against the same graph compiled by IREE.
    ///
    /// This 270M checkpoint ranks " the" (19.09), " a" (18.55), then
    /// " Paris" (18.27): llama.cpp 0.3.36 (llama-cpp-python) ranks the same
    /// five tokens in the same order from this file, its logits within 0.12
    /// on average of ours at the last position (it rounds activations to
    /// 8 bits for quantized matmuls), and greedy decoding goes on "the
    /// capital of the country of France."
    #[test]
    fn gemma3_says_paris_third() {
        let gguf = gemma3();
        let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
        let ids = tokenizer.encode("The capital of France is", tokenizer.add_bos_token());
        assert_eq!(ids[0], 2, "Gemma expects <bos> first");
        let seq = ids.len();
        let graph = prefill(&gguf, seq).unwrap();
        let input = tokens(&ids.iter().map(|&id| id as i32).collect::<Vec<_>>());
        let start = Instant::now();
        let logits = interp::run(&graph, std::slice::from_ref(&input), &keep(&gguf)).unwrap().remove(0);
        let logits = logits.to_f64_vec();
        eprintln!("interpreter: {:.2?} for {seq} tokens", start.elapsed());
        let vocab = logits.len() / seq;
        let row = |l: &[f64], pos: usize| l[pos * vocab..(pos + 1) * vocab].to_vec();
        let last = row(&logits, seq - 1);
        let mut top: Vec<usize> = (0..vocab).collect();
        top.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
        for &id in &top[..5] {
            eprintln!("  {id:>6} {:>12?} {:.4}", tokenizer.decode(&[id as u32]), last[id]);
        }
        let words: Vec<String> = top[..3].iter().map(|&id| tokenizer.decode(&[id as u32])).collect();
        assert_eq!(words, [" the", " a", " Paris"]);

        // numpy, from the same GGUF.
        let dir = tempfile::tempdir().unwrap();
        let reference = dir.path().join("reference.f32");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/test/models/gemma3_reference.py");
        let python = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
        let out = Command::new(python)
            .arg(script)
            .arg(gemma3_path())
            .arg(&reference)
            .args(ids.iter().map(|id| id.to_string()))
            .output()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}; run `make setup`"));
        assert!(out.status.success(), "{script} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let bytes = std::fs::read(&reference).unwrap();
        let numpy: Vec<f64> =
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect();
        let diff = crate::max_abs_diff;
        assert_eq!(numpy.len(), logits.len());
        let numpy_diff = diff(&logits, &numpy);
        eprintln!("max |interpreter - numpy| over all positions: {numpy_diff:e}");
        assert!(numpy_diff <= 1e-3, "logits differ from numpy by {numpy_diff}");

        // IREE, its params read from the GGUF itself.
        let (mlir, vmfb) = (dir.path().join("prefill.mlir"), dir.path().join("prefill.vmfb"));
        std::fs::write(&mlir, lower_to_string(&graph, &LowerOptions::default()).unwrap()).unwrap();
        let iree = crate::iree::Iree::for_tests();
        let start = Instant::now();
        iree.compile(&mlir, &vmfb).unwrap();
        eprintln!("iree-compile: {:.2?}", start.elapsed());
        let (input_npy, output_npy) = (dir.path().join("tokens.npy"), dir.path().join("logits.npy"));
        crate::npy::write(&input_npy, &input).unwrap();
        let start = Instant::now();
        iree.run(&vmfb, "main", &[input_npy], &[("model", gemma3_path().as_path())], std::slice::from_ref(&output_npy))
            .unwrap();
        eprintln!("iree-run-module: {:.2?}", start.elapsed());
        let iree_logits = crate::npy::read(&output_npy).unwrap().to_f64_vec();
        let iree_diff = diff(&logits, &iree_logits);
        eprintln!("max |interpreter - IREE| over all positions: {iree_diff:e}");
        assert!(iree_diff <= 1e-3, "logits differ from IREE by {iree_diff}");
        for pos in 0..seq {
            let want = argmax(&row(&logits, pos));
            assert_eq!(want, argmax(&row(&iree_logits, pos)), "IREE argmax differs at position {pos}");
            assert_eq!(want, argmax(&row(&numpy, pos)), "numpy argmax differs at position {pos}");
        }
    }

    /// A tiny gemma3 (hidden 32, 4 heads over 2 kv heads of 16, ffn 64,
    /// vocab 16, sliding window 2) with seeded weights: norms F32 around 1,
    /// matrices Q8_0, tied head. `blocks` 6 makes the last layer global.
    fn tiny(arch: &'static str, blocks: usize, skip: Option<&str>, extra: Vec<(&'static str, Meta)>) -> Vec<u8> {
        const Q8_0: u32 = 8;
        let (hidden, ff, vocab, heads, kv_heads, hd) = (32, 64, 16, 4, 2, 16);
        let fill = Fill::new(1);
        let mut tensors = vec![("token_embd.weight".to_string(), vec![vocab, hidden], Q8_0, fill.q8_0(vocab * hidden))];
        for i in 0..blocks {
            let w = |n: &str| format!("blk.{i}.{n}.weight");
            for n in ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"] {
                tensors.push((w(n), vec![hidden], 0, fill.f32s(hidden, 1.0)));
            }
            for n in ["attn_q_norm", "attn_k_norm"] {
                tensors.push((w(n), vec![hd], 0, fill.f32s(hd, 1.0)));
            }
            for (n, rows, cols) in block_matrices(hidden, heads, kv_heads, hd, ff) {
                tensors.push((w(n), vec![rows, cols], Q8_0, fill.q8_0(rows * cols)));
            }
        }
        tensors.push(("output_norm.weight".into(), vec![hidden], 0, fill.f32s(hidden, 1.0)));
        tensors.retain(|t| Some(t.0.as_str()) != skip);
        let mut meta = vec![
            ("general.architecture", Meta::Str(arch)),
            ("gemma3.block_count", Meta::U32(blocks as u32)),
            ("gemma3.embedding_length", Meta::U32(hidden as u32)),
            ("gemma3.feed_forward_length", Meta::U32(ff as u32)),
            ("gemma3.attention.head_count", Meta::U32(heads as u32)),
            ("gemma3.attention.head_count_kv", Meta::U32(kv_heads as u32)),
            ("gemma3.attention.key_length", Meta::U32(hd as u32)),
            ("gemma3.attention.value_length", Meta::U32(hd as u32)),
            ("gemma3.rope.freq_base", Meta::F32(1e6)),
            ("gemma3.attention.sliding_window", Meta::U32(2)),
            ("gemma3.attention.layer_norm_rms_epsilon", Meta::F32(1e-6)),
        ];
        meta.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
        meta.extend(extra);
        gguf_bytes(&meta, &tensors)
    }

    /// With only local layers and a window of 2, position `p` of block `L`
    /// sees tokens `p-L-1..=p`: two blocks leave positions 3 and 4 blind to
    /// token 0. A sixth, global, block lets every position see it.
    #[test]
    fn tiny_gemma3_slides_its_window() {
        let run = |blocks: usize, ids: &[i32]| {
            let gguf = Gguf::parse(tiny("gemma3", blocks, None, vec![])).unwrap();
            let graph = prefill(&gguf, ids.len()).unwrap();
            assert_eq!(graph.params().count(), gguf.tensors().len(), "one param per tensor, head tied");
            assert_eq!(graph.params().count(), 13 * blocks + 2);
            interp::run(&graph, &[tokens(ids)], &keep(&gguf)).unwrap().remove(0).to_f64_vec()
        };
        let (a, b) = (run(2, &[1, 5, 9, 3, 7]), run(2, &[4, 5, 9, 3, 7]));
        assert!(a.iter().all(|x| x.is_finite()));
        assert_ne!(a[..3 * 16], b[..3 * 16]);
        assert_eq!(a[3 * 16..], b[3 * 16..], "token 0 is out of positions 3 and 4's reach");
        let (a, b) = (run(6, &[1, 5, 9, 3, 7]), run(6, &[4, 5, 9, 3, 7]));
        assert_ne!(a[4 * 16..], b[4 * 16..], "the global layer sees token 0");
    }

    /// Decode steps after a 2-token prefill give the whole prefill's
    /// logits at a capacity of 8: past a window of 2 (the five local layers
    /// read a static window, masked until it fills; the global sixth reads
    /// the filled positions) and within a window of 16 (every layer reads
    /// the filled positions). No product or reduction spans the capacity.
    #[test]
    fn tiny_gemma3_decodes_over_the_filled_cache() {
        let ids = [1, 5, 9, 3, 7, 2];
        for (window, filled_slices) in [(2, 2), (16, 12)] {
            let extra = vec![("gemma3.attention.sliding_window", Meta::U32(window))];
            let gguf = Gguf::parse(tiny("gemma3", 6, None, extra)).unwrap();
            let weights = keep(&gguf);
            let full = interp::run(&prefill(&gguf, ids.len()).unwrap(), &[tokens(&ids)], &weights).unwrap();
            let full = full[0].to_f64_vec();
            let vocab = full.len() / ids.len();
            let family = Family::new(Config::from_gguf(&gguf).unwrap());
            let [prefill_fn, decode_fn]: [Graph; 2] =
                crate::models::entry_points(&family, &weights, 8, 1).unwrap().try_into().map_err(|_| ()).unwrap();
            let nodes = decode_fn.nodes();
            let sliced = nodes.iter().filter(|n| matches!(n.op, Op::RealDynamicSlice)).count();
            assert_eq!(sliced, filled_slices, "keys and values of each layer reading the filled positions");
            let spans_capacity = nodes
                .iter()
                .filter(|n| matches!(n.op, Op::DotGeneral(_) | Op::Reduce { .. }) && n.ty.shape.contains(&8));
            assert_eq!(spans_capacity.count(), 0);

            let mut out = interp::run(&prefill_fn, &[tokens(&ids[..2])], &weights).unwrap();
            for (pos, &id) in ids.iter().enumerate().skip(2) {
                let (keys, values) = (out.remove(1), out.remove(1));
                let inputs = [tokens(&[id]), crate::models::scalar_i32(pos as i32), keys, values];
                out = interp::run(&decode_fn, &inputs, &weights).unwrap();
                let want = &full[pos * vocab..(pos + 1) * vocab];
                let diff = crate::max_abs_diff(&out[0].to_f64_vec(), want);
                assert!(diff <= 1e-5, "window {window}, position {pos}: {diff}");
            }
        }
    }

    #[test]
    fn tiny_gemma3_errors_name_the_culprit() {
        let err = |bytes: Vec<u8>| prefill(&Gguf::parse(bytes).unwrap(), 4).expect_err("an error").to_string();
        let e = err(tiny("llama", 2, None, vec![]));
        assert!(e.contains("unknown general.architecture \"llama\""), "{e}");
        assert!(e.contains("gemma3"), "the message lists gemma3 as supported: {e}");
        let e = err(tiny("gemma3", 2, Some("blk.1.post_ffw_norm.weight"), vec![]));
        assert!(e.contains("\"blk.1.post_ffw_norm.weight\" is missing"), "{e}");
        let e = err(tiny("gemma3", 2, Some("blk.0.attn_k_norm.weight"), vec![]));
        assert!(e.contains("\"blk.0.attn_k_norm.weight\" is missing"), "{e}");
        let refused = [
            (vec![("gemma3.rope.scaling.type", Meta::Str("dynamic"))], "gemma3.rope.scaling.type = \"dynamic\""),
            (
                vec![
                    ("gemma3.rope.scaling.type", Meta::Str("yarn")),
                    ("gemma3.rope.scaling.factor", Meta::F32(4.0)),
                    ("gemma3.rope.scaling.original_context_length", Meta::U32(64)),
                ],
                "gemma3.rope.scaling.type = \"yarn\": only linear",
            ),
            (vec![("gemma3.expert_count", Meta::U32(4))], "gemma3.expert_count = 4: mixture-of-experts"),
            (vec![("gemma3.attn_logit_softcapping", Meta::F32(50.0))], "gemma3.attn_logit_softcapping = 50"),
            (
                vec![("gemma3.attention.layer_norm_rms_epsilon", Meta::F32(0.0))],
                "layer_norm_rms_epsilon = 0: must be positive",
            ),
            (
                vec![("gemma3.attention.head_count_kv", Meta::U32(3))],
                "head_count_kv = 3: must divide the 4 query heads",
            ),
            (
                vec![("gemma3.embedding_scale", Meta::F32(2.0))],
                "gemma3.embedding_scale = 2: kiln does not know this key",
            ),
        ];
        for (extra, needle) in refused {
            let e = err(tiny("gemma3", 2, None, extra));
            assert!(e.contains(needle), "'{e}' should contain '{needle}'");
        }
    }

    /// HF configs as Google ships them (4.x keys, class defaults left
    /// out) and as transformers 5 writes them read to the same model.
    #[test]
    fn config_from_hf() {
        use serde_json::json;
        let read = |config: serde_json::Value| {
            Config::from_hf(&HfConfig::parse(&config.to_string()).unwrap()).map_err(|e| e.to_string())
        };
        // google/gemma-3-4b-it's config.json, vision_config shortened.
        let gemma3_4b = json!({
            "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
            "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
            "model_type": "gemma3",
            "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                            "sliding_window": 1024},
            "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
            "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}
        });
        let c = read(gemma3_4b.clone()).unwrap();
        assert_eq!(
            (c.dims.block_count, c.dims.embedding_length, c.feed_forward_length, c.dims.vocab_size),
            (34, 2560, 10240, 262208)
        );
        assert_eq!(
            (c.dims.head_count, c.dims.head_count_kv, c.dims.head_dim, c.attention_scale),
            (8, 4, 256, 1.0 / 16.0)
        );
        assert_eq!(c.rope, RopeConfig { theta: 1e6, scaling: RopeScaling::Linear { factor: 8.0 } });
        assert_eq!(c.local_rope, RopeConfig { theta: 1e4, scaling: RopeScaling::None });
        assert_eq!(c.sliding_window, Some(1024));
        let global: Vec<usize> = (0..c.dims.block_count).filter(|&i| !c.is_sliding(i)).collect();
        assert_eq!(global, [5, 11, 17, 23, 29]);
        assert!(c.norm_adds_one);

        // The same text model as transformers 5 writes it.
        let layer_types: Vec<&str> =
            (0..34).map(|i| if (i + 1) % 6 == 0 { "full_attention" } else { "sliding_attention" }).collect();
        let v5 = json!({
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 2560,
            "intermediate_size": 10240, "num_hidden_layers": 34, "sliding_window": 1024, "layer_types": layer_types,
            "_sliding_window_pattern": 6, "use_bidirectional_attention": false, "attn_logit_softcapping": null,
            "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        });
        assert_eq!(read(v5.clone()), Ok(c));

        let edit = |mut config: serde_json::Value, key: &str, value: serde_json::Value| {
            config[key] = value;
            read(config).unwrap_err()
        };
        let refused = [
            (
                edit(v5.clone(), "layer_types", json!(["full_attention"])),
                "layer_types = [\"full_attention\"]: must name 34 layers",
            ),
            (
                edit(v5.clone(), "rope_parameters", json!({"rope_type": "default"})),
                "rope_parameters.rope_type = \"default\": rope_parameters has one entry per layer type",
            ),
            (
                edit(v5.clone(), "hidden_activation", json!("gelu")),
                "hidden_activation = \"gelu\": kiln supports only \"gelu_pytorch_tanh\"",
            ),
            (edit(v5.clone(), "use_bidirectional_attention", json!(true)), "use_bidirectional_attention = true"),
            (edit(v5.clone(), "sliding_window", json!(null)), "sliding_window = null: kiln needs a window"),
            (
                edit(v5.clone(), "num_key_value_heads", json!(3)),
                "num_key_value_heads = 3: must divide the 8 query heads",
            ),
            (edit(v5.clone(), "query_pre_attn_scalar", json!(0)), "query_pre_attn_scalar = 0.0: must be positive"),
            (
                edit(v5.clone(), "altup_num_inputs", json!(4)),
                "altup_num_inputs = 4: kiln does not know this key for model_type gemma3_text",
            ),
            (
                edit(gemma3_4b.clone(), "vision_soft_tokens", json!(4)),
                "config.json: vision_soft_tokens = 4: kiln does not know this key for model_type gemma3",
            ),
        ];
        for (e, needle) in refused {
            assert!(e.contains(needle), "'{e}' should contain '{needle}'");
        }
    }

    #[test]
    fn tiny_gemma3_optional_metadata() {
        let config = |extra| Config::from_gguf(&Gguf::parse(tiny("gemma3", 2, None, extra)).unwrap()).unwrap();
        let c = config(vec![
            ("gemma3.rope.scaling.type", Meta::Str("linear")),
            ("gemma3.rope.scaling.factor", Meta::F32(8.0)),
        ]);
        assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 8.0 });
        let c = config(vec![("gemma3.final_logit_softcapping", Meta::F32(30.0))]);
        assert_eq!(c.final_logit_softcapping, Some(30.0));
        // The cap applies to the logits last: capped = 0.5 · tanh(logits / 0.5).
        let run = |extra| {
            let gguf = Gguf::parse(tiny("gemma3", 2, None, extra)).unwrap();
            let graph = prefill(&gguf, 3).unwrap();
            interp::run(&graph, &[tokens(&[1, 2, 3])], &keep(&gguf)).unwrap().remove(0).to_f64_vec()
        };
        let (plain, capped) = (run(vec![]), run(vec![("gemma3.final_logit_softcapping", Meta::F32(0.5))]));
        assert!(plain.iter().any(|x| x.abs() > 2.0), "uncapped logits exceed the cap: {plain:?}");
        for (x, y) in plain.iter().zip(&capped) {
            assert!((0.5 * (x / 0.5).tanh() - y).abs() < 1e-6, "{y} is not {x} capped");
        }
    }
}
