//! The blocks the decoder families are built from, so that a family's file
//! holds only its equations: [`Layer`], a block's tensors by their GGUF
//! names; [`GatedFfn`], the gated feed-forward by its activation (its gate
//! sparse for Gemma 3n);
//! [`Attention`], grouped-query self-attention with its options; [`Stack`],
//! the embedding, the blocks (two normed residual sub-layers each) and the
//! head. The decoder trait they serve is [`super::Decoder`], their sizes
//! [`super::config::Dims`].

use super::config::{Dims, RopeConfig};
use super::moe::{Moe, MoeConfig};
use super::{linear_each, streamed_together, Checkpoint, Keys, KvCache, Logits, ModelError, Result, Span, Weight};
use crate::graph::{DType, ReduceKind, TensorType, DYNAMIC};
use crate::trace::nn::{attention, causal_mask, sliding_window_mask, Rope, RopeStyle, Rotation};
use crate::trace::{Tensor, Tracer};

/// Block `i`'s tensors, asked for by their GGUF names
/// (`blk.{i}.{name}.weight`, `.bias`); the checkpoint maps them to its own.
pub(crate) struct Layer<'a, 't> {
    t: &'t Tracer,
    weights: &'a dyn Checkpoint,
    i: usize,
    /// Norm weights are stored as `w` and scale by `1 + w` ([`norm_weight`]).
    norm_adds_one: bool,
}

impl<'a, 't> Layer<'a, 't> {
    /// Block `i` of `weights`, declared in `t`.
    pub fn new(t: &'t Tracer, weights: &'a dyn Checkpoint, i: usize, norm_adds_one: bool) -> Self {
        Layer { t, weights, i, norm_adds_one }
    }

    /// `blk.{i}.{name}.weight`, which must have the row-major `shape`.
    pub fn weight(&self, name: &str, shape: &[usize]) -> Result<Weight<'t>> {
        self.weights.load(self.t, &format!("blk.{}.{name}.weight", self.i), shape)
    }

    /// `blk.{i}.{name}.bias` as f32 `[len]`.
    pub fn bias(&self, name: &str, len: usize) -> Result<Tensor<'t>> {
        self.weights.load(self.t, &format!("blk.{}.{name}.bias", self.i), &[len])?.f32()
    }

    /// `blk.{i}.{name}.bias` as f32 of `shape`: a stack of experts' biases.
    pub fn stacked_bias(&self, name: &str, shape: &[usize]) -> Result<Tensor<'t>> {
        self.weights.load(self.t, &format!("blk.{}.{name}.bias", self.i), shape)?.f32()
    }

    /// The norm weight `blk.{i}.{name}.weight` (`[len]`), as the forward
    /// pass multiplies by it.
    pub fn norm(&self, name: &str, len: usize) -> Result<Tensor<'t>> {
        norm_weight(self.weight(name, &[len])?.f32()?, self.norm_adds_one)
    }
}

/// A norm weight as the forward pass multiplies by it: `1 + w` where the
/// checkpoint stores `w` (HF's `Gemma3RMSNorm`), as stored otherwise.
pub(crate) fn norm_weight(w: Tensor<'_>, adds_one: bool) -> Result<Tensor<'_>> {
    if !adds_one {
        return Ok(w);
    }
    let one = w.tracer().constant(1.0, w.ty.clone())?;
    Ok(w.add(&one)?)
}

/// The activation of a [`GatedFfn`]'s gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Activation {
    /// SwiGLU's (Llama).
    Silu,
    /// GeGLU's (Gemma), the tanh approximation.
    GeluTanh,
}

/// The gated feed-forward: `ffn(h) = W_down · (act(topk(W_gate · h)) * W_up · h)`,
/// `topk` only where the gate is sparse ([`GatedFfn::sparse`]).
pub(crate) struct GatedFfn<'t> {
    ffn_gate: Weight<'t>,
    ffn_up: Weight<'t>,
    ffn_down: Weight<'t>,
    activation: Activation,
    /// `k` of the gate's Gaussian top-k ([`gaussian_top_k`]), Gemma 3n's
    /// activation sparsity.
    sparsity: Option<f64>,
}

impl<'t> GatedFfn<'t> {
    /// `ffn_gate`, `ffn_up` (`[ff, hidden]`) and `ffn_down` (`[hidden, ff]`) of `l`.
    pub fn load(l: &Layer<'_, 't>, hidden: usize, ff: usize, activation: Activation) -> Result<Self> {
        Ok(GatedFfn {
            ffn_gate: l.weight("ffn_gate", &[ff, hidden])?,
            ffn_up: l.weight("ffn_up", &[ff, hidden])?,
            ffn_down: l.weight("ffn_down", &[hidden, ff])?,
            activation,
            sparsity: None,
        })
    }

    /// The gate through [`gaussian_top_k`] with `k` before the activation
    /// (nothing with `None`).
    pub fn sparse(self, k: Option<f64>) -> Self {
        GatedFfn { sparsity: k, ..self }
    }

    /// `h [seq, hidden]` -> `[seq, hidden]`: gate and up as one product
    /// where they are [`streamed_together`] (decode), else the up product
    /// after the gate's activation. That order is the one IREE 3.13 compiles
    /// Gemma 3n E2B's prefill in: with both products first, it fuses the
    /// 8192-wide sparse gate's reduction into the down product's data-tiling
    /// pack and fails ("large vector sizes").
    pub fn forward(&self, h: &Tensor<'t>) -> Result<Tensor<'t>> {
        let pair = [&self.ffn_gate, &self.ffn_up];
        let (gate, up) = match streamed_together(&pair, h) {
            true => {
                let [gate, up]: [Tensor<'t>; 2] = linear_each(&pair, h)?.try_into().expect("two products");
                (gate, Some(up))
            }
            false => (self.ffn_gate.linear(h)?, None),
        };
        let gate = match self.sparsity {
            Some(k) => gaussian_top_k(&gate, k)?,
            None => gate,
        };
        let gate = match self.activation {
            Activation::Silu => gate.silu()?,
            Activation::GeluTanh => gate.gelu_tanh()?,
        };
        let up = match up {
            Some(up) => up,
            None => self.ffn_up.linear(h)?,
        };
        self.ffn_down.linear(&gate.multiply(&up)?)
    }
}

/// `relu(g − (mean(g) + k · std(g)))` over the last dim, with the
/// population standard deviation (transformers' `unbiased=False`; llama.cpp
/// divides by `n − 1`): keeps the values above the `Φ(k)` quantile of a
/// normal fit of the row.
fn gaussian_top_k<'t>(g: &Tensor<'t>, k: f64) -> Result<Tensor<'t>> {
    let last = g.ty.rank() - 1;
    let constant = |x: &Tensor<'t>, v: f64| x.tracer().constant(v, x.ty.clone());
    let mean = |x: &Tensor<'t>| -> Result<Tensor<'t>> {
        let sum = x.reduce(ReduceKind::Sum, &[last])?;
        let m = sum.multiply(&constant(&sum, 1.0 / x.ty.shape[last] as f64)?)?;
        Ok(m.broadcast_in_dim(&x.ty.shape, &(0..last).collect::<Vec<_>>())?)
    };
    let centered = g.subtract(&mean(g)?)?;
    let std = mean(&centered.multiply(&centered)?)?.sqrt()?;
    let above = centered.subtract(&std.multiply(&constant(&std, k)?)?)?;
    Ok(above.maximum(&constant(g, 0.0)?)?)
}

/// What attention takes from the positions of a forward pass: the rotation
/// of the queries and keys, and which keys the queries see.
pub(crate) struct Positional<'t> {
    pub rotation: Rotation<'t>,
    pub visible: Visible<'t>,
}

impl<'t> Positional<'t> {
    /// `rotation`, and the keys of `at` a layer sees: causally and, with a
    /// `window`, within it.
    pub fn new(rotation: Rotation<'t>, at: &Span<'_, 't>, window: Option<usize>) -> Result<Self> {
        let (t, seq) = (at.positions.tracer(), at.positions.ty.shape[0]);
        let visible = match at.keys {
            Keys::Filled => Visible::Filled { window },
            Keys::Own => Visible::Own(match window {
                Some(window) => sliding_window_mask(t, seq, seq, 0, window)?,
                None => causal_mask(t, seq, seq, 0)?,
            }),
            Keys::Masked { len, q_offset } => Visible::Masked(match window {
                Some(window) => sliding_window_mask(t, seq, len, q_offset, window)?,
                None => causal_mask(t, seq, len, q_offset)?,
            }),
        };
        Ok(Positional { rotation, visible })
    }

    /// A layer type of the Gemmas: `rope` in NeoX order over heads of
    /// `head_dim`, at `at`'s positions, the keys seen causally and, with a
    /// `window`, within it.
    pub fn neox(rope: RopeConfig, head_dim: usize, at: &Span<'_, 't>, window: Option<usize>) -> Result<Self> {
        let rotation = Rope::new(head_dim, rope.theta, RopeStyle::NeoX).with_scaling(rope.scaling).at(at.positions)?;
        Positional::new(rotation, at, window)
    }
}

/// Which keys a layer's queries see ([`Keys`], for one layer type).
pub(crate) enum Visible<'t> {
    /// Those the mask allows, of all this call's keys or all the cache's.
    Masked(Tensor<'t>),
    /// Those the mask allows of this call's keys, which are also written
    /// into the (empty) cache.
    Own(Tensor<'t>),
    /// The cache's positions written so far, up to the last `window` of
    /// them: the cache hands over only those ([`KvCache::write_filled`]).
    Filled {
        /// The layer's sliding window, if it has one.
        window: Option<usize>,
    },
}

impl<'t> Visible<'t> {
    /// This call's keys and values `[kv_heads, seq, dim]`, written into the
    /// cache at `layer` first if there is one, as the queries see them.
    pub fn keys(&self, k: Tensor<'t>, v: Tensor<'t>, cache: LayerCache<'_, 't>) -> Result<LayerKv<'t>> {
        match (self, cache) {
            (Visible::Masked(mask), cache) => {
                let (keys, values) = match cache {
                    Some((cache, layer)) => cache.write(layer, &k, &v)?,
                    None => (k, v),
                };
                Ok(LayerKv { keys, values, mask: Some(mask.clone()) })
            }
            (Visible::Own(mask), cache) => {
                if let Some((cache, layer)) = cache {
                    cache.write(layer, &k, &v)?;
                }
                Ok(LayerKv { keys: k, values: v, mask: Some(mask.clone()) })
            }
            (Visible::Filled { window }, Some((cache, layer))) => cache.write_filled(layer, &k, &v, *window),
            (Visible::Filled { .. }, None) => {
                Err(ModelError::Config("attending over a cache's filled positions needs the cache".into()))
            }
        }
    }
}

/// The keys and values `[kv_heads, kv_len, dim]` a layer's queries attend
/// to, and the mask over them where they do not see them all.
#[derive(Clone)]
pub(crate) struct LayerKv<'t> {
    pub keys: Tensor<'t>,
    pub values: Tensor<'t>,
    pub mask: Option<Tensor<'t>>,
}

/// The KV cache and the layer whose keys and values an attention writes.
pub(crate) type LayerCache<'c, 't> = Option<(&'c mut KvCache<'t>, usize)>;

/// The shape of a grouped-query self-attention, and its options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttentionConfig {
    /// Width of the residual stream.
    pub hidden: usize,
    /// Query heads.
    pub head_count: usize,
    /// Key and value heads; they divide the query heads.
    pub head_count_kv: usize,
    /// Features per query and key head.
    pub head_dim: usize,
    /// Features per value head.
    pub value_length: usize,
    /// What the scores `q · kᵀ` are multiplied by.
    pub scale: f64,
    /// The per-head norms' epsilon.
    pub eps: f64,
    /// The q, k and v projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// Each query and key head is RMS-normed before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// The output projection has a bias (gpt-oss).
    pub output_bias: bool,
    /// Each head's softmax has a learned extra logit, `attn_sinks` (gpt-oss).
    pub sinks: bool,
}

impl AttentionConfig {
    /// Attention of `dims`' heads without options: value heads as wide as
    /// the others, scores scaled by `1/√head_dim`, no biases, no per-head
    /// norms.
    pub fn of(dims: &Dims) -> AttentionConfig {
        AttentionConfig {
            hidden: dims.embedding_length,
            head_count: dims.head_count,
            head_count_kv: dims.head_count_kv,
            head_dim: dims.head_dim,
            value_length: dims.head_dim,
            scale: 1.0 / (dims.head_dim as f64).sqrt(),
            eps: dims.rms_norm_eps,
            qkv_bias: false,
            qk_norm: false,
            output_bias: false,
            sinks: false,
        }
    }
}

/// Grouped-query self-attention:
/// `attn(x) = W_o · softmax(rope(norm(W_q x + b_q)) · rope(norm(W_k x + b_k))ᵀ · scale + mask) · (W_v x + b_v)`,
/// the biases and the per-head norms as the config says.
pub(crate) struct Attention<'t> {
    pub attn_q: Weight<'t>,
    pub attn_k: Weight<'t>,
    pub attn_v: Weight<'t>,
    /// `[attn_q_norm, attn_k_norm]`, `[head_dim]` each.
    pub qk_norm: Option<[Tensor<'t>; 2]>,
    /// The q, k and v biases.
    pub bias: Option<[Tensor<'t>; 3]>,
    pub attn_output: Weight<'t>,
    pub output_bias: Option<Tensor<'t>>,
    /// `[heads]`: each head's extra softmax logit.
    pub sinks: Option<Tensor<'t>>,
    pub c: AttentionConfig,
}

impl<'t> Attention<'t> {
    /// The projections of `l` (`attn_q`, `attn_k`, `attn_v`, `attn_output`)
    /// and, where `c` has them, the per-head norms, the biases and the sinks.
    pub fn load(l: &Layer<'_, 't>, c: AttentionConfig) -> Result<Self> {
        let (q_dim, k_dim, v_dim) =
            (c.head_count * c.head_dim, c.head_count_kv * c.head_dim, c.head_count_kv * c.value_length);
        let (attn_q, attn_k, attn_v) = (
            l.weight("attn_q", &[q_dim, c.hidden])?,
            l.weight("attn_k", &[k_dim, c.hidden])?,
            l.weight("attn_v", &[v_dim, c.hidden])?,
        );
        let qk_norm = match c.qk_norm {
            true => Some([l.norm("attn_q_norm", c.head_dim)?, l.norm("attn_k_norm", c.head_dim)?]),
            false => None,
        };
        let bias = match c.qkv_bias {
            true => Some([l.bias("attn_q", q_dim)?, l.bias("attn_k", k_dim)?, l.bias("attn_v", v_dim)?]),
            false => None,
        };
        let attn_output = l.weight("attn_output", &[c.hidden, c.head_count * c.value_length])?;
        let output_bias = c.output_bias.then(|| l.bias("attn_output", c.hidden)).transpose()?;
        let sinks = c.sinks.then(|| l.weight("attn_sinks", &[c.head_count])?.f32()).transpose()?;
        Ok(Attention { attn_q, attn_k, attn_v, qk_norm, bias, attn_output, output_bias, sinks, c })
    }

    /// `x [seq, hidden]` -> `[seq, hidden]`, each of q, k and v projected
    /// (k and v in one [`linear_each`]) and made into heads. With a cache,
    /// this call's keys and values are written into it at `cache.start` and
    /// the queries attend over the cache's keys they see ([`Visible`]).
    pub fn forward(&self, x: &Tensor<'t>, at: &Positional<'t>, cache: LayerCache<'_, 't>) -> Result<Tensor<'t>> {
        let c = &self.c;
        let heads = |which: usize, y: Tensor<'t>, n: usize, dim: usize| -> Result<Tensor<'t>> {
            let y = match &self.bias {
                Some(b) => add_bias(&y, &b[which])?,
                None => y,
            };
            split_heads(&y, n, dim)
        };
        let rotated = |which: usize, y: Tensor<'t>| -> Result<Tensor<'t>> {
            let y = match &self.qk_norm {
                Some(norms) => y.rms_norm(Some(&norms[which]), c.eps)?,
                None => y,
            };
            Ok(at.rotation.apply(&y)?)
        };
        let q = rotated(0, heads(0, self.attn_q.linear(x)?, c.head_count, c.head_dim)?)?;
        let [k, v]: [Tensor<'t>; 2] = linear_each(&[&self.attn_k, &self.attn_v], x)?.try_into().expect("two products");
        let k = rotated(1, heads(1, k, c.head_count_kv, c.head_dim)?)?;
        let v = heads(2, v, c.head_count_kv, c.value_length)?;
        self.attend(&q, k, v, &at.visible, cache)
    }

    /// The heads `q [heads, seq, head_dim]`, `k` and `v` `[kv_heads, seq,
    /// dim]` (written into the cache at `layer` first, if any) through
    /// attention over the keys `visible` says and the output projection:
    /// `[seq, hidden]`.
    pub fn attend(
        &self,
        q: &Tensor<'t>,
        k: Tensor<'t>,
        v: Tensor<'t>,
        visible: &Visible<'t>,
        cache: LayerCache<'_, 't>,
    ) -> Result<Tensor<'t>> {
        let kv = visible.keys(k, v, cache)?;
        let a = attention(q, &kv.keys, &kv.values, kv.mask.as_ref(), self.c.scale, None, self.sinks.as_ref())?;
        let out = self.attn_output.linear(&merge_heads(&a)?)?;
        match &self.output_bias {
            Some(b) => add_bias(&out, b),
            None => Ok(out),
        }
    }
}

/// An attention's forward pass over `x`: [`Attention::forward`], or a
/// family's own order of the same equations.
pub(crate) type Attend<'t> = fn(&Attention<'t>, &Tensor<'t>, &Positional<'t>, LayerCache<'_, 't>) -> Result<Tensor<'t>>;

/// The shape of a decoder block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct BlockConfig {
    /// The attention; its width and epsilon are the block's.
    pub attention: AttentionConfig,
    /// Width of the feed-forward layer.
    pub feed_forward_length: usize,
    /// The feed-forward's gate activation.
    pub activation: Activation,
    /// Each sub-layer's output is normed too, before the residual add
    /// (Gemma's `post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// The feed-forward is a mixture of experts ([`Moe`], SwiGLU experts)
    /// in place of the dense one.
    pub experts: Option<MoeConfig>,
    /// The GGUF name of the feed-forward's input norm: `ffn_norm`
    /// (gpt-oss's is `post_attention_norm`).
    pub ffn_norm: &'static str,
}

/// A block's feed-forward: dense, or a mixture of experts.
enum Ffn<'t> {
    Dense(GatedFfn<'t>),
    Experts(Moe<'t>),
}

/// One decoder block, each sub-layer normed on the way in (and with
/// `post_norms`, on the way out):
/// ```text
/// x = x + post_attention_norm(attn(attn_norm(x)))
/// x = x + post_ffw_norm(ffn(ffn_norm(x)))
/// ```
struct Block<'t> {
    attn_norm: Tensor<'t>,
    attn: Attention<'t>,
    attend: Attend<'t>,
    post_attention_norm: Option<Tensor<'t>>,
    ffn_norm: Tensor<'t>,
    ffn: Ffn<'t>,
    post_ffw_norm: Option<Tensor<'t>>,
    eps: f64,
}

impl<'t> Block<'t> {
    /// The weights of `l`, its attention run by `attend`.
    fn load(l: &Layer<'_, 't>, c: &BlockConfig, attend: Attend<'t>) -> Result<Self> {
        let hidden = c.attention.hidden;
        let post_norm = |name: &str| c.post_norms.then(|| l.norm(name, hidden)).transpose();
        Ok(Block {
            attn_norm: l.norm("attn_norm", hidden)?,
            attn: Attention::load(l, c.attention)?,
            attend,
            post_attention_norm: post_norm("post_attention_norm")?,
            ffn_norm: l.norm(c.ffn_norm, hidden)?,
            ffn: match c.experts {
                Some(experts) => Ffn::Experts(Moe::load(l, hidden, experts)?),
                None => Ffn::Dense(GatedFfn::load(l, hidden, c.feed_forward_length, c.activation)?),
            },
            post_ffw_norm: post_norm("post_ffw_norm")?,
            eps: c.attention.eps,
        })
    }

    /// `x [seq, hidden]` -> `[seq, hidden]`.
    fn forward(&self, x: &Tensor<'t>, at: &Positional<'t>, cache: LayerCache<'_, 't>) -> Result<Tensor<'t>> {
        let norm = |y: &Tensor<'t>, w: &Option<Tensor<'t>>| match w {
            Some(w) => y.rms_norm(Some(w), self.eps),
            None => Ok(y.clone()),
        };
        let attn = (self.attend)(&self.attn, &x.rms_norm(Some(&self.attn_norm), self.eps)?, at, cache)?;
        let x = x.add(&norm(&attn, &self.post_attention_norm)?)?;
        let h = x.rms_norm(Some(&self.ffn_norm), self.eps)?;
        let ffn = match &self.ffn {
            Ffn::Dense(ffn) => ffn.forward(&h)?,
            Ffn::Experts(moe) => moe.forward(&h)?,
        };
        Ok(x.add(&norm(&ffn, &self.post_ffw_norm)?)?)
    }
}

/// `y [seq, n] + b [n]`, the bias broadcast over the sequence.
pub(crate) fn add_bias<'t>(y: &Tensor<'t>, b: &Tensor<'t>) -> Result<Tensor<'t>> {
    Ok(y.add(&b.broadcast_in_dim(&y.ty.shape, &[1])?)?)
}

/// The final norm and the output head of a decoder, after its blocks:
/// `output.weight`, or the embedding itself when the head is tied (then
/// one param serves both).
pub(crate) struct Head<'t> {
    output_norm: Tensor<'t>,
    output: Weight<'t>,
    eps: f64,
}

impl<'t> Head<'t> {
    /// `output_norm.weight` and the head of `token_embd`'s shape.
    pub fn load(
        t: &'t Tracer,
        weights: &dyn Checkpoint,
        token_embd: &Weight<'t>,
        eps: f64,
        norm_adds_one: bool,
    ) -> Result<Self> {
        let output_norm = weights.load(t, "output_norm.weight", &[token_embd.shape[1]])?.f32()?;
        let output = match weights.contains("output.weight") {
            true => weights.load(t, "output.weight", &token_embd.shape)?,
            false => token_embd.clone(),
        };
        Ok(Head { output_norm: norm_weight(output_norm, norm_adds_one)?, output, eps })
    }

    /// `x [n, hidden]` -> logits `[n, vocab]`.
    pub fn forward(&self, x: &Tensor<'t>) -> Result<Tensor<'t>> {
        self.output.linear(&x.rms_norm(Some(&self.output_norm), self.eps)?)
    }
}

/// What every decoder is made of, declared in this order: the token
/// embedding, the blocks, the final norm and the output head.
pub(crate) struct Stack<'t> {
    token_embd: Weight<'t>,
    blocks: Vec<Block<'t>>,
    head: Head<'t>,
}

impl<'t> Stack<'t> {
    /// `dims.block_count` blocks, block `i` shaped by `block(i)`, their
    /// attention run by `attend`; `norm_adds_one` as for [`Layer`].
    pub fn load(
        t: &'t Tracer,
        weights: &dyn Checkpoint,
        dims: &Dims,
        block: &dyn Fn(usize) -> BlockConfig,
        attend: Attend<'t>,
        norm_adds_one: bool,
    ) -> Result<Self> {
        let token_embd = weights.load(t, "token_embd.weight", &[dims.vocab_size, dims.embedding_length])?;
        let blocks =
            (0..dims.block_count).map(|i| Block::load(&Layer::new(t, weights, i, norm_adds_one), &block(i), attend));
        let blocks = blocks.collect::<Result<Vec<_>>>()?;
        let head = Head::load(t, weights, &token_embd, dims.rms_norm_eps, norm_adds_one)?;
        Ok(Stack { token_embd, blocks, head })
    }

    /// The embeddings of `tokens [seq]`: `[seq, hidden]` f32.
    pub fn embed(&self, tokens: &Tensor<'t>) -> Result<Tensor<'t>> {
        self.token_embd.rows(tokens)
    }

    /// `x [seq, hidden]` through the blocks, block `i` attending at `at(i)`
    /// and, with a cache, writing layer `i` of it: the head's input
    /// `[seq, hidden]`, or `[1, hidden]` for the last position.
    pub fn hidden<'p>(
        &self,
        mut x: Tensor<'t>,
        at: impl Fn(usize) -> &'p Positional<'t>,
        mut cache: Option<&mut KvCache<'t>>,
        logits: Logits,
    ) -> Result<Tensor<'t>>
    where
        't: 'p,
    {
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(&x, at(i), cache.as_deref_mut().map(|c| (c, i)))?;
        }
        match logits {
            Logits::Every => Ok(x),
            Logits::Last => last_row(&x),
        }
    }

    /// [`Stack::hidden`]'s `[n, hidden]` -> logits `[n, vocab]`.
    pub fn logits(&self, x: &Tensor<'t>) -> Result<Tensor<'t>> {
        self.head.forward(x)
    }
}

/// Row `seq - 1` of `x [seq, n]` (`seq` may be `?`): `[1, n]`.
pub(crate) fn last_row<'t>(x: &Tensor<'t>) -> Result<Tensor<'t>> {
    let (seq, n) = (x.ty.shape[0], x.ty.shape[1]);
    if seq != DYNAMIC {
        return Ok(x.slice(&[seq - 1, 0], &[seq, n], &[1, 1])?);
    }
    // A slice at `seq - 1` (a gather's fused row copy needs a stack buffer
    // per row in IREE 3.13, past its 32 KiB limit at hidden 576).
    let t = x.tracer();
    let last = t.iota(0, TensorType::new([seq], DType::I32))?.reduce(ReduceKind::Max, &[0])?;
    let zero = t.constant(0.0, TensorType::new([], DType::I32))?;
    Ok(x.dynamic_slice(&[&last, &zero], &[1, n])?)
}

/// `x [seq, n·hd] -> [n, seq, hd]`
pub(crate) fn split_heads<'t>(x: &Tensor<'t>, heads: usize, head_dim: usize) -> Result<Tensor<'t>> {
    let seq = x.ty.shape[0];
    Ok(x.reshape(&[seq, heads, head_dim])?.transpose(&[1, 0, 2])?)
}

/// `x [n, seq, hd] -> [seq, n·hd]`
pub(crate) fn merge_heads<'t>(x: &Tensor<'t>) -> Result<Tensor<'t>> {
    let (heads, seq, head_dim) = (x.ty.shape[0], x.ty.shape[1], x.ty.shape[2]);
    Ok(x.transpose(&[1, 0, 2])?.reshape(&[seq, heads * head_dim])?)
}
