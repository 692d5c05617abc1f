//! Synthetic checkpoints: GGUF files with the tensor names, shapes, types
//! and metadata of real llama.cpp checkpoints, but made-up data, so that
//! exporting a multi-billion-parameter model can be tested and measured
//! without downloading one. With [`SynthData::Zeros`] the file is sparse
//! (gigabytes apparent, kilobytes on disk); [`SynthData::Seeded`] writes
//! deterministic valid blocks instead, for numerics and I/O timing.
//!
//! Names and keys are llama.cpp's (`gguf-py/gguf/constants.py`,
//! `src/llama-arch.cpp`); the metadata is what kiln's front-ends read
//! ([`super::llama::Config::from_gguf`]). Quantized presets follow
//! llama.cpp's Q4_K_M recipe (`llama_tensor_get_type` in
//! `src/llama-quant.cpp`): Q4_K by default; `attn_v` and `ffn_down` Q6_K on
//! the layers [`use_more_bits`] picks; the output head Q6_K (the token
//! embedding too when it doubles as the head); norms F32. The `tiny-llama`
//! preset exports in milliseconds and compiles in about 20 CPU-seconds, for
//! end-to-end tests: llama.cpp's Q8_0 mix (every matrix Q8_0, norms F32) and
//! a byte-level GPT-2 vocabulary, so `kiln run` can tokenize a prompt for it.

use super::config::{Dims, RopeConfig};
use super::Result;
use crate::interp;
use crate::trace::nn::{Rope, RopeScaling, RopeStyle};
use crate::trace::Tracer;
use crate::weights::ggml::GgmlType;
use crate::weights::gguf::ValueType;
use crate::weights::gguf_writer::{GgufWriter, TensorData, Value, WriteSummary};
use crate::weights::WeightsError;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// llama.cpp's `LLAMA_FTYPE_MOSTLY_Q4_K_M`, for `general.file_type`.
const FTYPE_MOSTLY_Q4_K_M: u32 = 15;
/// llama.cpp's `LLAMA_FTYPE_MOSTLY_Q8_0`.
const FTYPE_MOSTLY_Q8_0: u32 = 7;
/// llama.cpp's `LLAMA_FTYPE_MOSTLY_MXFP4_MOE`.
const FTYPE_MOSTLY_MXFP4_MOE: u32 = 38;
/// `LLAMA_TOKEN_TYPE_NORMAL` and `_CONTROL`, for `tokenizer.ggml.token_type`.
const TOKEN_TYPE_NORMAL: i32 = 1;
const TOKEN_TYPE_CONTROL: i32 = 3;
/// llama.cpp's `LLAMA_FTYPE_GUESSED`: the file does not say its mix.
const FTYPE_GUESSED: u32 = 1024;
/// `GGML_QNT_VERSION`, for `general.quantization_version`.
const QNT_VERSION: u32 = 2;

/// The llama.cpp architecture a synthetic model imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `llm_build_llama`: pre-norm blocks, SwiGLU, GQA.
    Llama,
    /// `llm_build_gemma3`: adds Q/K norms, post-attention and post-FFN
    /// norms, and sliding-window layers; the embedding is tied.
    Gemma3,
    /// `llama_model_gemma3n`: Gemma 3's blocks with per-layer token
    /// embeddings, AltUp, LAuReL, shared KV and sparse FFNs; every 5th layer
    /// global.
    Gemma3n {
        /// `embedding_length_per_layer_input`.
        per_layer_input: usize,
        /// Rank of the LAuReL matrices.
        laurel_rank: usize,
        /// `attention.shared_kv_layers`: the last layers.
        shared_kv_layers: usize,
        /// The first layers, whose FFN is sparse (`Φ⁻¹(0.95)`).
        sparse_layers: usize,
    },
    /// `llm_build_qwen3moe`: Qwen3's attention (Q/K norms), every layer's
    /// feed-forward a mixture of SwiGLU experts, stacked `[E, F, H]`.
    Qwen3Moe {
        /// `expert_count`, `E`.
        experts: usize,
        /// `expert_used_count`, `k`.
        used: usize,
        /// `expert_feed_forward_length`, `F`.
        expert_feed_forward_length: usize,
    },
    /// `llama_model_openai_moe` (`gpt-oss`): biased attention with sinks,
    /// alternating sliding and full layers, YaRN; every layer's
    /// feed-forward biased experts, always MXFP4 (as every gpt-oss GGUF
    /// keeps them).
    GptOss {
        /// `expert_count`, `E`.
        experts: usize,
        /// `expert_used_count`, `k`.
        used: usize,
        /// `expert_feed_forward_length`, `F`.
        expert_feed_forward_length: usize,
    },
}

impl Arch {
    /// `general.architecture`, and the prefix of the model's keys.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
            Arch::Gemma3n { .. } => "gemma3n",
            Arch::Qwen3Moe { .. } => "qwen3moe",
            Arch::GptOss { .. } => "gpt-oss",
        }
    }

    /// This mixture of experts with `experts` experts per layer instead,
    /// each token still using as many: how decode's cost follows `E`.
    pub fn with_experts(self, experts: usize) -> std::result::Result<Arch, String> {
        match self {
            Arch::Qwen3Moe { used, .. } | Arch::GptOss { used, .. } if experts < used => {
                Err(format!("{experts} experts are fewer than the {used} each token uses"))
            }
            Arch::Qwen3Moe { used, expert_feed_forward_length, .. } => {
                Ok(Arch::Qwen3Moe { experts, used, expert_feed_forward_length })
            }
            Arch::GptOss { used, expert_feed_forward_length, .. } => {
                Ok(Arch::GptOss { experts, used, expert_feed_forward_length })
            }
            other => Err(format!("{} has no experts", other.name())),
        }
    }

    /// Per-head Q/K norms (Gemma's and Qwen3's).
    fn qk_norms(self) -> bool {
        self.gemma_block() || matches!(self, Arch::Qwen3Moe { .. })
    }

    /// Gemma's block: Q/K norms, and norms after attention and the FFN.
    fn gemma_block(self) -> bool {
        matches!(self, Arch::Gemma3 | Arch::Gemma3n { .. })
    }
}

/// How the matrices are quantized: one of llama.cpp's `--ftype` mixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// `Q4_K_M`: Q4_K, with Q6_K where [`use_more_bits`] says and for the head.
    Q4KM,
    /// `Q8_0`: every matrix Q8_0.
    Q8_0,
    /// Every matrix of one type, the head and the embedding included: one
    /// checkpoint per ggml type, for tests.
    Uniform(GgmlType),
}

impl Quant {
    /// `general.file_type`.
    pub fn file_type(self) -> u32 {
        match self {
            Quant::Q4KM => FTYPE_MOSTLY_Q4_K_M,
            Quant::Q8_0 => FTYPE_MOSTLY_Q8_0,
            Quant::Uniform(_) => FTYPE_GUESSED,
        }
    }

    /// The type of a matrix; `more_bits` for those the `_M` mixes favour
    /// (some `attn_v` and `ffn_down`, the output head).
    pub fn matrix(self, more_bits: bool) -> GgmlType {
        match (self, more_bits) {
            (Quant::Q4KM, false) => GgmlType::Q4_K,
            (Quant::Q4KM, true) => GgmlType::Q6_K,
            (Quant::Q8_0, _) => GgmlType::Q8_0,
            (Quant::Uniform(ty), _) => ty,
        }
    }
}

/// The shape of a synthetic model, in llama.cpp's hyper-parameter terms.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthConfig {
    /// The architecture.
    pub arch: Arch,
    /// `general.name`
    pub name: String,
    /// The sizes, as the front-ends read them back.
    pub dims: Dims,
    /// Width of the feed-forward layer.
    pub feed_forward_length: usize,
    /// The context length the model claims.
    pub context_length: usize,
    /// The rotary base frequency and scaling; a scaling is written as
    /// llama.cpp's converter writes Llama 3.1's, a `rope_freqs.weight`
    /// tensor of per-frequency divisors.
    pub rope: RopeConfig,
    /// Gemma 3's local-attention window.
    pub sliding_window: Option<usize>,
    /// No `output.weight`: the head reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    /// Overrides the mix's choice for `token_embd.weight`.
    pub token_embd_type: Option<GgmlType>,
    /// The quantization mix.
    pub quant: Quant,
    /// Writes a byte-level BPE vocabulary (`tokenizer.ggml.model` `gpt2`,
    /// no merges): token `b` is byte `b` in GPT-2's alphabet, and tokens
    /// past 255 are control tokens `<|reserved_N|>`. Needs a vocabulary of
    /// at least 256 tokens.
    pub byte_tokenizer: bool,
}

impl SynthConfig {
    /// The model's first `n` layers only (`1..=` its layers). Gemma 3n's
    /// layers that share keys and values are its last ones: a cut keeps
    /// those of them it reaches, so that some layer still computes them.
    pub fn first_layers(&mut self, n: usize) -> std::result::Result<(), String> {
        let layers = self.dims.block_count;
        if n == 0 || n > layers {
            return Err(format!("{} has {layers} layers", self.name));
        }
        if let Arch::Gemma3n { shared_kv_layers, .. } = &mut self.arch {
            *shared_kv_layers = shared_kv_layers.saturating_sub(layers - n);
        }
        self.dims.block_count = n;
        Ok(())
    }
}

/// The built-in sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Llama 3 8B (Meta-Llama-3-8B) as Q4_K_M: 8.03B parameters.
    Llama3_8b,
    /// A Gemma 3 of 4.5B parameters (Gemma-3n-E2B-sized) whose token
    /// embedding is one F32 tensor of 262144 × 2048, 2^31 bytes: one more
    /// than the largest i32, to find 32-bit byte offsets and sizes.
    Gemma3_4_5b,
    /// Llama 3.2 1B as Q4_K_M, tied embeddings: 1.24B parameters.
    Llama1b,
    /// A llama of 2 blocks, width 64 and 256 byte tokens as Q8_0 (106,816
    /// parameters), with a tokenizer: quick to export and compile.
    TinyLlama,
    /// Gemma-3n-E2B as Q4_K_M (the model kiln was started for): 30 layers
    /// of width 2048, a 262144 x 7680 per-layer token table, 4.46B
    /// parameters.
    Gemma3nE2b,
    /// Qwen3-30B-A3B as Q4_K_M: 48 layers of 128 experts, 8 used per
    /// token, each 768 wide; 30.5B parameters, 3.3B of them active.
    Qwen3_30bA3b,
    /// gpt-oss-20b as llama.cpp's MXFP4 GGUF: 24 layers of 32 MXFP4
    /// experts, 4 used per token, each 2880 wide; the other matrices Q8_0;
    /// 20.9B parameters.
    GptOss20b,
}

impl Preset {
    /// Every preset.
    pub const ALL: [Preset; 7] = [
        Preset::Llama3_8b,
        Preset::Gemma3_4_5b,
        Preset::Llama1b,
        Preset::TinyLlama,
        Preset::Gemma3nE2b,
        Preset::Qwen3_30bA3b,
        Preset::GptOss20b,
    ];

    /// The preset's command-line name: `llama3-8b`.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Llama3_8b => "llama3-8b",
            Preset::Gemma3_4_5b => "gemma3-4.5b",
            Preset::Llama1b => "llama-1b",
            Preset::TinyLlama => "tiny-llama",
            Preset::Gemma3nE2b => "gemma3n-e2b",
            Preset::Qwen3_30bA3b => "qwen3-30b-a3b",
            Preset::GptOss20b => "gpt-oss-20b",
        }
    }

    /// The preset's hyper-parameters.
    pub fn config(self) -> SynthConfig {
        let name = format!("kiln synthetic {}", self.name());
        match self {
            // Meta-Llama-3-8B config.json.
            Preset::Llama3_8b => SynthConfig {
                arch: Arch::Llama,
                name,
                dims: Dims {
                    block_count: 32,
                    embedding_length: 4096,
                    head_count: 32,
                    head_count_kv: 8,
                    head_dim: 128,
                    vocab_size: 128256,
                    rms_norm_eps: 1e-5,
                },
                feed_forward_length: 14336,
                context_length: 8192,
                rope: RopeConfig { theta: 500000.0, scaling: RopeScaling::None },
                sliding_window: None,
                tied_embeddings: false,
                token_embd_type: None,
                quant: Quant::Q4KM,
                byte_tokenizer: false,
            },
            // Gemma 3 shapes (head_dim 256, 262144 vocabulary) at Gemma-3n-E2B's
            // width; 35 layers make 4,500,794,880 parameters.
            Preset::Gemma3_4_5b => SynthConfig {
                arch: Arch::Gemma3,
                name,
                dims: Dims {
                    block_count: 35,
                    embedding_length: 2048,
                    head_count: 8,
                    head_count_kv: 4,
                    head_dim: 256,
                    vocab_size: 262144,
                    rms_norm_eps: 1e-6,
                },
                feed_forward_length: 16384,
                context_length: 131072,
                rope: RopeConfig { theta: 1_000_000.0, scaling: RopeScaling::None },
                sliding_window: Some(1024),
                tied_embeddings: true,
                token_embd_type: Some(GgmlType::F32),
                quant: Quant::Q4KM,
                byte_tokenizer: false,
            },
            // Llama-3.2-1B config.json.
            Preset::Llama1b => SynthConfig {
                arch: Arch::Llama,
                name,
                dims: Dims {
                    block_count: 16,
                    embedding_length: 2048,
                    head_count: 32,
                    head_count_kv: 8,
                    head_dim: 64,
                    vocab_size: 128256,
                    rms_norm_eps: 1e-5,
                },
                feed_forward_length: 8192,
                context_length: 131072,
                rope: RopeConfig {
                    theta: 500000.0,
                    scaling: RopeScaling::Llama3 {
                        factor: 32.0,
                        low_freq_factor: 1.0,
                        high_freq_factor: 4.0,
                        original_max_position_embeddings: 8192,
                    },
                },
                sliding_window: None,
                tied_embeddings: true,
                token_embd_type: None,
                quant: Quant::Q4KM,
                byte_tokenizer: false,
            },
            // Llama-shaped (GQA, SwiGLU, untied head) but tiny; every row
            // is a whole number of Q8_0 blocks (32 elements).
            Preset::TinyLlama => SynthConfig {
                arch: Arch::Llama,
                name,
                dims: Dims {
                    block_count: 2,
                    embedding_length: 64,
                    head_count: 4,
                    head_count_kv: 2,
                    head_dim: 16,
                    vocab_size: 256,
                    rms_norm_eps: 1e-5,
                },
                feed_forward_length: 128,
                context_length: 2048,
                rope: RopeConfig { theta: 10000.0, scaling: RopeScaling::None },
                sliding_window: None,
                tied_embeddings: false,
                token_embd_type: None,
                quant: Quant::Q8_0,
                byte_tokenizer: true,
            },
            // google/gemma-3n-E2B's text_config, with the 262144 tokens of
            // llama.cpp's older converter (262400 in HF).
            Preset::Gemma3nE2b => SynthConfig {
                arch: Arch::Gemma3n { per_layer_input: 256, laurel_rank: 64, shared_kv_layers: 10, sparse_layers: 10 },
                name,
                dims: Dims {
                    block_count: 30,
                    embedding_length: 2048,
                    head_count: 8,
                    head_count_kv: 2,
                    head_dim: 256,
                    vocab_size: 262144,
                    rms_norm_eps: 1e-6,
                },
                feed_forward_length: 8192,
                context_length: 32768,
                rope: RopeConfig { theta: 1_000_000.0, scaling: RopeScaling::None },
                sliding_window: Some(512),
                tied_embeddings: true,
                token_embd_type: None,
                quant: Quant::Q4KM,
                byte_tokenizer: false,
            },
            // Qwen/Qwen3-30B-A3B config.json (the dense intermediate_size,
            // which no layer uses, as feed_forward_length).
            Preset::Qwen3_30bA3b => SynthConfig {
                arch: Arch::Qwen3Moe { experts: 128, used: 8, expert_feed_forward_length: 768 },
                name,
                dims: Dims {
                    block_count: 48,
                    embedding_length: 2048,
                    head_count: 32,
                    head_count_kv: 4,
                    head_dim: 128,
                    vocab_size: 151936,
                    rms_norm_eps: 1e-6,
                },
                feed_forward_length: 6144,
                context_length: 40960,
                rope: RopeConfig { theta: 1_000_000.0, scaling: RopeScaling::None },
                sliding_window: None,
                tied_embeddings: false,
                token_embd_type: None,
                quant: Quant::Q4KM,
                byte_tokenizer: false,
            },
            // openai/gpt-oss-20b config.json; the mix of ggml-org's
            // gpt-oss-20b-mxfp4.gguf (experts MXFP4, other matrices Q8_0).
            Preset::GptOss20b => SynthConfig {
                arch: Arch::GptOss { experts: 32, used: 4, expert_feed_forward_length: 2880 },
                name,
                dims: Dims {
                    block_count: 24,
                    embedding_length: 2880,
                    head_count: 64,
                    head_count_kv: 8,
                    head_dim: 64,
                    vocab_size: 201088,
                    rms_norm_eps: 1e-5,
                },
                feed_forward_length: 2880,
                context_length: 131072,
                rope: RopeConfig {
                    theta: 150_000.0,
                    scaling: RopeScaling::Yarn {
                        factor: 32.0,
                        original_max_position_embeddings: 4096,
                        beta_fast: 32.0,
                        beta_slow: 1.0,
                        truncate: true,
                        attention_factor: 0.1 * 32f64.ln() + 1.0,
                    },
                },
                sliding_window: Some(128),
                tied_embeddings: false,
                token_embd_type: None,
                quant: Quant::Q8_0,
                byte_tokenizer: false,
            },
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Preset, String> {
        Preset::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
            format!("no synthetic preset named \"{s}\"; try one of: {}", names.join(", "))
        })
    }
}

/// What the tensors hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthData {
    /// All zeros, not written: a sparse file.
    Zeros,
    /// [`TensorData::Seeded`] blocks, each tensor from this seed and its index.
    Seeded(u64),
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and
/// every third one between get more bits in the `_M` mixes.
pub fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

const ROPE_FREQS: &str = "rope_freqs.weight";

/// Whether the rope scaling is written as `rope_freqs.weight` (Llama 3.1's);
/// YaRN's is written as keys.
fn has_rope_freqs(c: &SynthConfig) -> bool {
    !matches!(c.rope.scaling, RopeScaling::None | RopeScaling::Yarn { .. })
}

/// One tensor of a synthetic model: name, row-major shape, type.
pub type SynthTensor = (String, Vec<usize>, GgmlType);

/// Every tensor, in the order llama.cpp's converters write them.
pub fn tensors(c: &SynthConfig) -> Vec<SynthTensor> {
    let d = &c.dims;
    let (hidden, ff, vocab) = (d.embedding_length, c.feed_forward_length, d.vocab_size);
    let (q_dim, kv_dim) = (d.head_count * d.head_dim, d.head_count_kv * d.head_dim);
    let n = d.block_count;
    let q = |more_bits: bool| c.quant.matrix(more_bits);
    let mut out: Vec<SynthTensor> = Vec::new();
    let mut add = |name: String, shape: &[usize], ty| out.push((name, shape.to_vec(), ty));

    if has_rope_freqs(c) {
        add(ROPE_FREQS.into(), &[d.head_dim / 2], GgmlType::F32);
    }
    // Tied, the embedding is quantized as the output head would be.
    let embd_type = c.token_embd_type.unwrap_or(q(c.tied_embeddings));
    add("token_embd.weight".into(), &[vocab, hidden], embd_type);
    if let Arch::Gemma3n { per_layer_input, .. } = c.arch {
        // The per-layer table as llama.cpp quantizes token embeddings.
        add("per_layer_token_embd.weight".into(), &[vocab, n * per_layer_input], q(true));
        add("per_layer_model_proj.weight".into(), &[n * per_layer_input, hidden], q(false));
        add("per_layer_proj_norm.weight".into(), &[per_layer_input], GgmlType::F32);
        add("altup_proj.weight".into(), &[3, hidden, hidden], q(false));
        add("altup_unembd_proj.weight".into(), &[3, hidden, hidden], q(false));
    }
    for i in 0..n {
        let blk = |t: &str| format!("blk.{i}.{t}.weight");
        let more = use_more_bits(i, n);
        add(blk("attn_norm"), &[hidden], GgmlType::F32);
        add(blk("attn_q"), &[q_dim, hidden], q(false));
        add(blk("attn_k"), &[kv_dim, hidden], q(false));
        add(blk("attn_v"), &[kv_dim, hidden], q(more));
        add(blk("attn_output"), &[hidden, q_dim], q(false));
        if let Arch::GptOss { .. } = c.arch {
            for (name, len) in [("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim), ("attn_output", hidden)] {
                add(format!("blk.{i}.{name}.bias"), &[len], GgmlType::F32);
            }
            add(blk("attn_sinks"), &[d.head_count], GgmlType::F32);
        }
        if c.arch.qk_norms() {
            add(blk("attn_q_norm"), &[d.head_dim], GgmlType::F32);
            add(blk("attn_k_norm"), &[d.head_dim], GgmlType::F32);
        }
        if c.arch.gemma_block() {
            add(blk("post_attention_norm"), &[hidden], GgmlType::F32);
        }
        // gpt-oss's pre-FFN norm has llama.cpp's name for a post-attention one.
        let ffn_norm = if let Arch::GptOss { .. } = c.arch { "post_attention_norm" } else { "ffn_norm" };
        add(blk(ffn_norm), &[hidden], GgmlType::F32);
        match c.arch {
            Arch::Qwen3Moe { experts, expert_feed_forward_length: f, .. } => {
                // llama.cpp's quantizer leaves the router as converted.
                add(blk("ffn_gate_inp"), &[experts, hidden], GgmlType::F32);
                add(blk("ffn_gate_exps"), &[experts, f, hidden], q(false));
                add(blk("ffn_up_exps"), &[experts, f, hidden], q(false));
                add(blk("ffn_down_exps"), &[experts, hidden, f], q(more));
            }
            Arch::GptOss { experts, expert_feed_forward_length: f, .. } => {
                let bias = |t: &str| format!("blk.{i}.{t}.bias");
                add(blk("ffn_gate_inp"), &[experts, hidden], GgmlType::F32);
                add(bias("ffn_gate_inp"), &[experts], GgmlType::F32);
                for (name, rows, cols) in
                    [("ffn_gate_exps", f, hidden), ("ffn_up_exps", f, hidden), ("ffn_down_exps", hidden, f)]
                {
                    add(blk(name), &[experts, rows, cols], GgmlType::MXFP4);
                    add(bias(name), &[experts, rows], GgmlType::F32);
                }
            }
            _ => {
                add(blk("ffn_gate"), &[ff, hidden], q(false));
                add(blk("ffn_up"), &[ff, hidden], q(false));
                add(blk("ffn_down"), &[hidden, ff], q(more));
            }
        }
        if c.arch.gemma_block() {
            add(blk("post_ffw_norm"), &[hidden], GgmlType::F32);
        }
        if let Arch::Gemma3n { per_layer_input, laurel_rank, .. } = c.arch {
            add(blk("inp_gate"), &[per_layer_input, hidden], q(false));
            add(blk("proj"), &[hidden, per_layer_input], q(false));
            add(blk("post_norm"), &[hidden], GgmlType::F32);
            // AltUp's 4 x 4 coefficients and router are too narrow for a
            // block: kept F32.
            add(blk("altup_correct_coef"), &[4, 4], GgmlType::F32);
            add(blk("altup_correct_scale"), &[hidden], GgmlType::F32);
            add(blk("altup_predict_coef"), &[16, 4], GgmlType::F32);
            add(blk("altup_router"), &[4, hidden], GgmlType::F32);
            add(blk("altup_router_norm"), &[hidden], GgmlType::F32);
            add(blk("laurel_l"), &[laurel_rank, hidden], q(false));
            // Rows of 64, not a whole K-quant block: llama.cpp falls back to Q5_0.
            let narrow = if c.quant == Quant::Q4KM && laurel_rank % 256 != 0 { GgmlType::Q5_0 } else { q(false) };
            add(blk("laurel_r"), &[hidden, laurel_rank], narrow);
            add(blk("laurel_post_norm"), &[hidden], GgmlType::F32);
        }
    }
    add("output_norm.weight".into(), &[hidden], GgmlType::F32);
    if !c.tied_embeddings {
        add("output.weight".into(), &[vocab, hidden], q(true));
    }
    out
}

/// A writer with the model's metadata and tensors declared.
pub fn writer(c: &SynthConfig, path: &Path) -> Result<GgufWriter> {
    let (d, mut w) = (&c.dims, GgufWriter::new(path));
    let arch = c.arch.name();
    // UINT32 as llama.cpp writes them, unless a made-up config needs more.
    let int = |v: usize| u32::try_from(v).map(Value::U32).unwrap_or(Value::U64(v as u64));
    w.add("general.architecture", arch)?;
    w.add("general.name", c.name.as_str())?;
    // gpt-oss's converter writes its own `MOSTLY_MXFP4_MOE`.
    let file_type = if let Arch::GptOss { .. } = c.arch { FTYPE_MOSTLY_MXFP4_MOE } else { c.quant.file_type() };
    w.add("general.file_type", file_type)?;
    w.add("general.quantization_version", QNT_VERSION)?;
    let mut keys = vec![
        ("context_length", int(c.context_length)),
        ("embedding_length", int(d.embedding_length)),
        ("block_count", int(d.block_count)),
        ("feed_forward_length", int(c.feed_forward_length)),
        ("attention.head_count", int(d.head_count)),
        ("attention.head_count_kv", int(d.head_count_kv)),
        ("rope.freq_base", Value::F32(c.rope.theta as f32)),
        ("attention.layer_norm_rms_epsilon", Value::F32(d.rms_norm_eps as f32)),
        ("rope.dimension_count", int(d.head_dim)),
        ("vocab_size", int(d.vocab_size)),
    ];
    if c.arch.gemma_block() || d.head_dim * d.head_count != d.embedding_length {
        keys.push(("attention.key_length", int(d.head_dim)));
        keys.push(("attention.value_length", int(d.head_dim)));
    }
    if let Some(window) = c.sliding_window {
        keys.push(("attention.sliding_window", int(window)));
    }
    if let Arch::Qwen3Moe { experts, used, expert_feed_forward_length }
    | Arch::GptOss { experts, used, expert_feed_forward_length } = c.arch
    {
        keys.extend([
            ("expert_count", int(experts)),
            ("expert_used_count", int(used)),
            ("expert_feed_forward_length", int(expert_feed_forward_length)),
        ]);
    }
    if let RopeScaling::Yarn { factor, original_max_position_embeddings, .. } = c.rope.scaling {
        keys.extend([
            ("rope.scaling.type", Value::from("yarn")),
            ("rope.scaling.factor", Value::F32(factor as f32)),
            ("rope.scaling.original_context_length", int(original_max_position_embeddings)),
        ]);
    }
    if let Arch::Gemma3n { per_layer_input, shared_kv_layers, sparse_layers, .. } = c.arch {
        // As conversion/gemma.py's Gemma3NModel writes them: per-layer
        // arrays, and neither rope.dimension_count nor vocab_size.
        keys.retain(|(k, _)| !["feed_forward_length", "rope.dimension_count", "vocab_size"].contains(k));
        let layers = 0..d.block_count;
        // Φ⁻¹(0.95) as torch computes it in f32, -inf for the dense layers.
        let sparsity = layers.clone().map(|i| if i < sparse_layers { 1.644_853_6 } else { f32::NEG_INFINITY });
        let sliding = layers.clone().map(|i| Value::Bool(!(i + 1).is_multiple_of(5)));
        keys.extend([
            ("feed_forward_length", Value::i32s(layers.map(|_| c.feed_forward_length as i32))),
            ("rope.freq_base_swa", Value::F32(10_000.0)),
            ("final_logit_softcapping", Value::F32(30.0)),
            ("altup.active_idx", int(0)),
            ("altup.num_inputs", int(4)),
            ("embedding_length_per_layer_input", int(per_layer_input)),
            ("attention.shared_kv_layers", int(shared_kv_layers)),
            ("activation_sparsity_scale", Value::f32s(sparsity)),
            ("attention.sliding_window_pattern", Value::array(ValueType::Bool, sliding.collect())),
        ]);
    }
    for (key, value) in keys {
        w.add(&format!("{arch}.{key}"), value)?;
    }
    if c.byte_tokenizer {
        add_byte_tokenizer(&mut w, d.vocab_size, path)?;
    }
    for (name, shape, ty) in tensors(c) {
        w.add_tensor(&name, &shape, ty)?;
    }
    Ok(w)
}

/// `tokenizer.ggml.*` of a byte-level BPE vocabulary without merges, as
/// llama.cpp's `gpt2` tokenizer reads it: a text becomes one token per byte.
fn add_byte_tokenizer(w: &mut GgufWriter, vocab_size: usize, path: &Path) -> Result<()> {
    if vocab_size < 256 {
        return Err(WeightsError::Format {
            path: path.to_path_buf(),
            message: format!("a byte-level vocabulary needs 256 tokens or more, not {vocab_size}"),
        }
        .into());
    }
    let alphabet = crate::tokenizer::gpt2_alphabet();
    let tokens = (0..vocab_size).map(|i| match alphabet.get(i) {
        Some(c) => c.to_string(),
        None => format!("<|reserved_{}|>", i - 256),
    });
    let types = (0..vocab_size).map(|i| if i < 256 { TOKEN_TYPE_NORMAL } else { TOKEN_TYPE_CONTROL });
    w.add("tokenizer.ggml.model", "gpt2")?;
    w.add("tokenizer.ggml.pre", "gpt-2")?;
    w.add("tokenizer.ggml.tokens", Value::strings(tokens))?;
    w.add("tokenizer.ggml.token_type", Value::i32s(types))?;
    w.add("tokenizer.ggml.merges", Value::strings(Vec::<String>::new()))?;
    w.add("tokenizer.ggml.add_bos_token", false)?;
    Ok(())
}

/// Writes the synthetic checkpoint to `path` (atomically, in bounded
/// memory). `rope_freqs.weight` holds its real values whatever `data` says.
pub fn write(c: &SynthConfig, path: &Path, data: SynthData) -> Result<WriteSummary> {
    let rope_freqs: Vec<u8> = match has_rope_freqs(c) {
        false => vec![],
        true => freq_divisors(c.rope, c.dims.head_dim)?.iter().flat_map(|f| f.to_le_bytes()).collect(),
    };
    let w = writer(c, path)?;
    let rope_freqs_at = w.tensors().iter().position(|t| t.name == ROPE_FREQS);
    Ok(w.write_data(|i| match data {
        _ if Some(i) == rope_freqs_at => TensorData::Bytes(&rope_freqs),
        SynthData::Zeros => TensorData::Zeros,
        // Distinct per tensor, and the same whatever else the file holds.
        SynthData::Seeded(seed) => TensorData::Seeded(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
    })?)
}

/// What each of the `head_dim / 2` rotary frequencies is divided by under
/// `rope.scaling`: llama.cpp's `rope_freqs.weight`, as its converter writes
/// it for Llama 3.1 (`LlamaModel.generate_extra_tensors`). They are
/// [`Rope::inv_freq`]'s own frequencies, unscaled over scaled, run by the
/// interpreter, so that the file and the in-graph scaling agree.
pub(crate) fn freq_divisors(rope: RopeConfig, head_dim: usize) -> Result<Vec<f32>> {
    let t = Tracer::new("freq_divisors");
    let inv_freq = |scaling| Rope::new(head_dim, rope.theta, RopeStyle::NeoX).with_scaling(scaling).inv_freq(&t);
    let divisors = inv_freq(RopeScaling::None)?.divide(&inv_freq(rope.scaling)?)?;
    let graph = t.finish(&[&divisors])?;
    let values =
        interp::run(&graph, &[], &HashMap::new()).expect("the interpreter runs a graph without inputs or params");
    Ok(values[0].to_f64_vec().into_iter().map(|d| d as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::llama::Config;
    use crate::weights::gguf::Gguf;
    use crate::weights::quant;
    use std::os::unix::fs::MetadataExt;

    fn params(p: Preset) -> u64 {
        tensors(&p.config()).iter().map(|(_, shape, _)| shape.iter().product::<usize>() as u64).sum()
    }

    fn count(p: Preset, suffix: &str, ty: GgmlType) -> usize {
        tensors(&p.config()).iter().filter(|(n, _, t)| n.ends_with(suffix) && *t == ty).count()
    }

    #[test]
    fn preset_sizes() {
        assert_eq!(params(Preset::Llama3_8b), 8_030_261_248);
        assert_eq!(params(Preset::Llama1b), 1_235_814_400 + 32, "and rope_freqs.weight");
        assert_eq!(params(Preset::Gemma3_4_5b), 4_500_794_880);
        assert_eq!(params(Preset::TinyLlama), 106_816);
        // E2B's 4.46B, 2.01B of them the per-layer table; 24 tensors a block.
        assert_eq!(params(Preset::Gemma3nE2b), 4_455_632_480);
        // Qwen3-30B-A3B's 30.5B, 0.6B of them experts per layer.
        assert_eq!(params(Preset::Qwen3_30bA3b), 30_532_122_624);
        assert_eq!(tensors(&Preset::Qwen3_30bA3b.config()).len(), 1 + 48 * 12 + 2);
        // gpt-oss-20b's 20.9B, 19.1B of them experts; 19 tensors a block.
        assert_eq!(params(Preset::GptOss20b), 20_914_757_184);
        assert_eq!(tensors(&Preset::GptOss20b.config()).len(), 1 + 24 * 19 + 2);
        assert_eq!(tensors(&Preset::Gemma3nE2b.config()).len(), 6 + 30 * 24 + 1);
        assert_eq!(tensors(&Preset::Llama3_8b.config()).len(), 2 + 32 * 9 + 1);
        assert_eq!(tensors(&Preset::Gemma3_4_5b.config()).len(), 1 + 35 * 13 + 1);
        let w = writer(&Preset::Gemma3_4_5b.config(), Path::new("g.gguf")).unwrap();
        let embd = &w.tensors()[0];
        assert_eq!((embd.name.as_str(), embd.ggml_type, embd.byte_len), ("token_embd.weight", GgmlType::F32, 1 << 31));
        assert_eq!(w.elements(), 4_500_794_880);
        for p in Preset::ALL {
            assert_eq!(p.name().parse::<Preset>(), Ok(p));
        }
        assert!("llama-8b".parse::<Preset>().unwrap_err().contains("try one of: llama3-8b, gemma3-4.5b, llama-1b"));
    }

    #[test]
    fn q4_k_m_mix_as_llama_cpp() {
        // n = 32: layers 0-3, 28-31 and 6, 9, ..., 27.
        let more: Vec<usize> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(more, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
        let p = Preset::Llama3_8b;
        assert_eq!((count(p, "attn_v.weight", GgmlType::Q6_K), count(p, "ffn_down.weight", GgmlType::Q6_K)), (16, 16));
        assert_eq!(count(p, "attn_q.weight", GgmlType::Q4_K), 32);
        let types = |p: Preset, name: &str| tensors(&p.config()).into_iter().find(|t| t.0 == name).map(|t| t.2);
        assert_eq!(types(p, "token_embd.weight"), Some(GgmlType::Q4_K));
        assert_eq!(types(p, "output.weight"), Some(GgmlType::Q6_K));
        assert_eq!(types(p, "blk.5.attn_v.weight"), Some(GgmlType::Q4_K));
        assert_eq!(types(p, "blk.6.ffn_down.weight"), Some(GgmlType::Q6_K));
        // Tied: the embedding is the head, so it gets the head's Q6_K.
        assert_eq!(types(Preset::Llama1b, "token_embd.weight"), Some(GgmlType::Q6_K));
        assert_eq!(types(Preset::Llama1b, "output.weight"), None);
        assert_eq!(types(Preset::Gemma3_4_5b, "blk.34.post_ffw_norm.weight"), Some(GgmlType::F32));
        let e2b = Preset::Gemma3nE2b;
        assert_eq!(types(e2b, "per_layer_token_embd.weight"), Some(GgmlType::Q6_K));
        assert_eq!(types(e2b, "altup_proj.weight"), Some(GgmlType::Q4_K));
        assert_eq!(types(e2b, "blk.3.laurel_r.weight"), Some(GgmlType::Q5_0), "rows of 64");
        assert_eq!(
            types(e2b, "blk.29.attn_k.weight"),
            Some(GgmlType::Q4_K),
            "shared layers keep theirs, as llama.cpp loads them"
        );
    }

    #[test]
    fn llama_1b_loads_and_traces_through_the_llama_front_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("llama-1b.gguf");
        let summary = write(&Preset::Llama1b.config(), &path, SynthData::Zeros).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), summary.file_size);
        assert!(
            meta.len() > 700 << 20 && meta.blocks() * 512 < 4 << 20,
            "{} apparent, {} allocated",
            meta.len(),
            meta.blocks() * 512
        );
        let g = Gguf::open(&path).unwrap();
        let c = Config::from_gguf(&g).unwrap();
        assert_eq!(
            (
                c.dims.block_count,
                c.dims.embedding_length,
                c.feed_forward_length,
                c.dims.head_count,
                c.dims.head_count_kv,
                c.dims.head_dim
            ),
            (16, 2048, 8192, 32, 8, 64)
        );
        assert_eq!((c.dims.vocab_size, c.rope.theta, c.dims.rms_norm_eps as f32), (128256, 500000.0, 1e-5));
        let weights = crate::models::GgufWeights::new(&g, crate::models::PackedPolicy::Keep).unwrap();
        let graph = crate::models::prefill(&crate::models::Family::new(c), &weights, crate::graph::DYNAMIC).unwrap();
        // One param per tensor: the tied head is token_embd itself, and the
        // rope divisors are read from the file.
        assert_eq!(graph.params().count(), g.tensors().len());
        let freqs = g.tensor("rope_freqs.weight").unwrap();
        let freqs: Vec<f32> = freqs.data.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(freqs.len(), 32);
        assert_eq!((freqs[0], freqs[31]), (1.0, 32.0), "high frequencies kept, low ones divided by the factor");
        assert!(freqs.windows(2).all(|w| w[0] <= w[1]));
    }

    /// Qwen3-30B-A3B's shape reads back through the qwen3moe front-end, its
    /// down stacks Q6_K where llama.cpp's Q4_K_M gives `ffn_down` more bits,
    /// the routers F32; with `with_experts` the same model has 8 experts.
    #[test]
    fn qwen3_30b_a3b_loads_and_traces_through_the_qwen3moe_front_end() {
        let types = |c: &SynthConfig, name: &str| tensors(c).into_iter().find(|t| t.0 == name).map(|t| (t.1, t.2));
        let c = Preset::Qwen3_30bA3b.config();
        assert_eq!(types(&c, "blk.0.ffn_down_exps.weight"), Some((vec![128, 2048, 768], GgmlType::Q6_K)));
        assert_eq!(types(&c, "blk.7.ffn_down_exps.weight"), Some((vec![128, 2048, 768], GgmlType::Q4_K)));
        assert_eq!(types(&c, "blk.4.ffn_gate_inp.weight"), Some((vec![128, 2048], GgmlType::F32)));
        let small = SynthConfig { arch: c.arch.with_experts(8).unwrap(), ..c.clone() };
        assert_eq!(types(&small, "blk.4.ffn_up_exps.weight"), Some((vec![8, 768, 2048], GgmlType::Q4_K)));
        assert!(c.arch.with_experts(4).unwrap_err().contains("fewer than the 8 each token uses"));
        assert!(Preset::Llama1b.config().arch.with_experts(8).unwrap_err().contains("llama has no experts"));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.gguf");
        write(&c, &path, SynthData::Zeros).unwrap();
        let g = Gguf::open(&path).unwrap();
        let config = Config::from_gguf(&g).unwrap();
        let want = crate::models::moe::MoeConfig::swiglu(128, 8, 768, true);
        assert_eq!((config.experts, config.qk_norm, config.dims.head_dim), (Some(want), true, 128));
        let weights = crate::models::GgufWeights::new(&g, crate::models::PackedPolicy::Keep).unwrap();
        let graph =
            crate::models::entry_points(&crate::models::Family::new(config), &weights, 64, 1).unwrap().remove(1);
        assert_eq!(graph.params().count(), g.tensors().len());
    }

    /// gpt-oss-20b's shape reads back through the gpt-oss front-end: its
    /// MXFP4 experts with biases, sinks, every other layer sliding, yarn
    /// from keys (no `rope_freqs.weight`).
    #[test]
    fn gpt_oss_20b_loads_and_traces_through_the_gpt_oss_front_end() {
        let c = Preset::GptOss20b.config();
        let types = |name: &str| tensors(&c).into_iter().find(|t| t.0 == name).map(|t| (t.1, t.2));
        assert_eq!(types("blk.3.ffn_gate_exps.weight"), Some((vec![32, 2880, 2880], GgmlType::MXFP4)));
        assert_eq!(types("blk.3.ffn_down_exps.bias"), Some((vec![32, 2880], GgmlType::F32)));
        assert_eq!(types("blk.3.attn_q.weight"), Some((vec![4096, 2880], GgmlType::Q8_0)));
        assert_eq!(types("blk.3.attn_sinks.weight"), Some((vec![64], GgmlType::F32)));
        assert_eq!(types(ROPE_FREQS), None);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.gguf");
        write(&SynthConfig { dims: Dims { block_count: 2, ..c.dims }, ..c.clone() }, &path, SynthData::Zeros).unwrap();
        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.get_u64("general.file_type").unwrap(), 38);
        let config = crate::models::gpt_oss::Config::from_gguf(&g).unwrap();
        assert_eq!((config.sliding.as_slice(), config.sliding_window), (&[true, false][..], 128));
        assert_eq!((config.rope, config.experts.used, config.dims.head_dim), (c.rope, 4, 64));
        let weights = crate::models::GgufWeights::new(&g, crate::models::PackedPolicy::Keep).unwrap();
        let graph =
            crate::models::entry_points(&crate::models::Family::new(config), &weights, 64, 1).unwrap().remove(1);
        assert_eq!(graph.params().count(), g.tensors().len());
    }

    /// A cut of Gemma 3n E2B keeps the KV-sharing layers it reaches (its
    /// last 10 of 30), so that any cut loads: 5 layers share none, 25 five.
    #[test]
    fn gemma3n_e2b_cut_to_its_first_layers_loads() {
        let dir = tempfile::tempdir().unwrap();
        for (n, shared, sparse) in [(5, 0, 5), (25, 5, 10), (30, 10, 10)] {
            let mut c = Preset::Gemma3nE2b.config();
            c.first_layers(n).unwrap();
            let path = dir.path().join(format!("e2b-{n}.gguf"));
            write(&c, &path, SynthData::Zeros).unwrap();
            let config = crate::models::gemma3n::Config::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
            let dense = config.sparsity.iter().filter(|s| s.is_none()).count();
            assert_eq!((config.dims.block_count, config.shared_kv_layers, n - dense), (n, shared, sparse));
        }
        let mut c = Preset::Gemma3nE2b.config();
        assert_eq!(c.first_layers(31).unwrap_err(), "kiln synthetic gemma3n-e2b has 30 layers");
        assert!(c.first_layers(0).is_err());
    }

    #[test]
    fn tiny_llama_exports_and_tokenizes() {
        use crate::models::{Family, GgufWeights, PackedPolicy, Serving};
        use crate::tokenizer::Tokenizer;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write(&Preset::TinyLlama.config(), &path, SynthData::Seeded(0)).unwrap();
        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.get_u64("general.file_type").unwrap(), 7);
        for t in g.tensors() {
            let expected = if t.shape().len() == 2 { GgmlType::Q8_0 } else { GgmlType::F32 };
            assert_eq!(t.ggml_type, expected, "{}", t.name);
            let values = quant::dequantize_to_vec(t.ggml_type, t.data).unwrap();
            assert!(values.iter().all(|v| v.is_finite()), "{}", t.name);
        }
        let c = Config::from_gguf(&g).unwrap();
        assert_eq!(
            (c.dims.block_count, c.dims.embedding_length, c.dims.head_count, c.dims.head_count_kv, c.dims.head_dim),
            (2, 64, 4, 2, 16)
        );
        assert_eq!(c.dims.vocab_size, 256);

        let weights = GgufWeights::new(&g, PackedPolicy::Keep).unwrap();
        let serving = Serving::new(&Family::from_gguf(&g).unwrap(), &weights, 16).unwrap();
        let session = crate::lower::Session::new();
        let module = session
            .lower_serving(&serving.greedy_loop(), &Default::default(), &Default::default())
            .expect("the tiny model lowers to a verified module");
        drop(module);
        // Untied: token_embd and output are both params.
        let params: std::collections::BTreeSet<&str> =
            [&serving.fill, &serving.head].into_iter().flat_map(|g| g.params()).map(|(_, name, _)| name).collect();
        assert_eq!(params.len(), g.tensors().len());

        // One token per byte, each byte's own id; decoding gives the bytes back.
        let tok = Tokenizer::from_gguf(&g).unwrap();
        assert_eq!(tok.vocab_size(), 256);
        assert!(!tok.add_bos_token());
        let text = "héllo wörld\n";
        let ids = tok.encode(text, false);
        assert_eq!(ids, text.bytes().map(u32::from).collect::<Vec<_>>());
        assert_eq!(tok.decode(&ids), text);
        assert!((0..256).all(|id| !tok.is_eog(id)));
    }

    #[test]
    fn byte_tokenizer_reserves_tokens_past_256() {
        let mut c = Preset::TinyLlama.config();
        c.dims.vocab_size = 260;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        write(&c, &path, SynthData::Zeros).unwrap();
        let tok = crate::tokenizer::Tokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
        assert_eq!(tok.encode("a<|reserved_3|>", false), [97, 259]);
        c.dims.vocab_size = 255;
        let e = write(&c, &path, SynthData::Zeros).unwrap_err().to_string();
        assert!(e.contains("a byte-level vocabulary needs 256 tokens or more, not 255"), "{e}");
    }

    #[test]
    fn gemma3_embedding_of_2_gib_is_sparse_and_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gemma3.gguf");
        let summary = write(&Preset::Gemma3_4_5b.config(), &path, SynthData::Zeros).unwrap();
        assert_eq!(summary.elements, 4_500_794_880);
        let g = Gguf::open(&path).unwrap();
        let embd = g.tensor("token_embd.weight").unwrap();
        assert_eq!((embd.shape(), embd.data.len()), (vec![262144, 2048], 1 << 31));
        assert_eq!(g.get_u64("gemma3.attention.sliding_window").unwrap(), 1024);
        assert_eq!(g.get_u64("gemma3.attention.key_length").unwrap(), 256);
        assert_eq!(g.get_u64("gemma3.vocab_size").unwrap(), 262144);
        assert_eq!(g.get_str("general.architecture").unwrap(), "gemma3");
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.len() > 4 << 30 && meta.blocks() * 512 < 4 << 20);
    }

    #[test]
    fn seeded_is_deterministic_and_dequantizes() {
        let gemma3 = Preset::Gemma3_4_5b.config();
        let dims = Dims {
            block_count: 2,
            embedding_length: 256,
            head_count: 2,
            head_count_kv: 1,
            head_dim: 128,
            vocab_size: 64,
            ..gemma3.dims
        };
        let tiny = SynthConfig { name: "tiny".into(), dims, feed_forward_length: 512, ..gemma3 };
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
        write(&tiny, &a, SynthData::Seeded(1)).unwrap();
        write(&tiny, &b, SynthData::Seeded(1)).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let g = Gguf::open(&a).unwrap();
        let mut datas = Vec::new();
        for t in g.tensors() {
            let values = quant::dequantize_to_vec(t.ggml_type, t.data).unwrap();
            assert!(values.iter().all(|v| v.is_finite()), "{}", t.name);
            assert!(values.iter().any(|&v| v != 0.0), "{}", t.name);
            datas.push(t.data);
        }
        assert_ne!(datas[1], datas[datas.len() - 2], "tensors differ from each other");
    }
}
