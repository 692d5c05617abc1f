//! What a decoder family provides: its hyper-parameters
//! ([`DecoderConfig`], which a registry row reads from a checkpoint) and the
//! model they load ([`Decoder`]), traced at the positions a [`Span`] says.

use super::cache::{CacheSpec, KvCache};
use super::checkpoint::Checkpoint;
use super::config;
use super::Result;
use crate::graph::TensorType;
use crate::trace::nn::QueryOffset;
use crate::trace::{Tensor, Tracer};

/// A decoder-only language model traced into one function: what the entry
/// points need from a family.
pub trait Decoder<'t> {
    /// The model's sizes.
    fn dims(&self) -> &config::Dims;

    /// Features per value head: the head's, unless the family says.
    fn value_length(&self) -> usize {
        self.dims().head_dim
    }

    /// Rows of the output head: the logits' last dim.
    fn vocab_size(&self) -> usize {
        self.dims().vocab_size
    }

    /// The key and value caches' types for `cache`'s positions and dtype:
    /// `[layers, kv_heads, max_context, dim]`.
    fn cache_types(&self, cache: CacheSpec) -> (TensorType, TensorType) {
        let d = self.dims();
        let ty = |dim: usize| TensorType::new([d.block_count, d.head_count_kv, cache.max_context, dim], cache.dtype);
        (ty(d.head_dim), ty(self.value_length()))
    }

    /// `tokens [seq]` i32 -> the head's input f32 at the positions of `at`,
    /// `[seq, hidden]` or `[1, hidden]` as `at.logits` says; with a cache,
    /// the queries attend over it, after this call's keys and values are
    /// written into it at `cache.start`.
    fn hidden(&self, tokens: &Tensor<'t>, at: Span<'_, 't>, cache: Option<&mut KvCache<'t>>) -> Result<Tensor<'t>>;

    /// The output head: [`Decoder::hidden`]'s `[n, hidden]` -> logits `[n,
    /// vocab]`.
    fn logits(&self, hidden: &Tensor<'t>) -> Result<Tensor<'t>>;

    /// [`Decoder::hidden`] through the head: logits `[seq, vocab]` or `[1,
    /// vocab]`.
    fn forward(&self, tokens: &Tensor<'t>, at: Span<'_, 't>, cache: Option<&mut KvCache<'t>>) -> Result<Tensor<'t>> {
        self.logits(&self.hidden(tokens, at, cache)?)
    }

    /// [`Decoder::hidden`] at the cache's next positions: the last
    /// position's, `[1, hidden]`. Into an empty cache the tokens attend to
    /// their own keys only ([`Keys::Own`]); else over the cache's filled
    /// positions only ([`Keys::Filled`]).
    fn hidden_cached(&self, tokens: &Tensor<'t>, cache: &mut KvCache<'t>) -> Result<Tensor<'t>> {
        let positions = cache.positions(tokens.ty.shape[0])?;
        let keys = if cache.empty { Keys::Own } else { Keys::Filled };
        self.hidden(tokens, Span { positions: &positions, keys, logits: Logits::Last }, Some(cache))
    }
}

/// Where the tokens of a forward pass are: their positions (`[seq]` i32),
/// and which keys their queries see.
#[derive(Clone, Copy, Debug)]
pub struct Span<'a, 't> {
    /// Each token's position, for the rotary embedding.
    pub positions: &'a Tensor<'t>,
    /// The keys the queries attend to.
    pub keys: Keys<'a, 't>,
    /// Which positions get logits.
    pub logits: Logits,
}

/// The keys the queries of a forward pass attend to.
#[derive(Clone, Copy, Debug)]
pub enum Keys<'a, 't> {
    /// `len` keys (this call's, or the whole cache's), the first query at
    /// `q_offset` among them, under a causal (or sliding-window) mask.
    Masked {
        /// How many keys the queries attend to.
        len: usize,
        /// The first query's position among the keys.
        q_offset: QueryOffset<'a, 't>,
    },
    /// This call's keys only, causally from position 0: the call fills an
    /// empty cache (`prefill`), so its own keys are all there is, and its
    /// attention costs what the prompt holds, not the capacity. They are
    /// still written into the cache, for the calls after it.
    Own,
    /// Queries at the cache's next positions (`cache.start..`), a static
    /// number of them: each attends to the positions written so far, up to
    /// and including its own (the last `window` of them on a sliding layer),
    /// which the cache slices out (`KvCache::write_filled`). A decode step's
    /// attention then costs what the cache holds, not what it could hold.
    Filled,
}

/// The positions a forward pass computes logits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Every position: `[seq, vocab]` (scoring a text).
    Every,
    /// The last: `[1, vocab]`, all that choosing the next token needs. The
    /// head, the largest product of a small model, then runs on one row:
    /// Gemma-3-270M's 262144 x 640 head on a 64-token prompt is 64x less
    /// work and no f32 copy of the packed head.
    Last,
}

/// A decoder family's hyper-parameters, as its registry row reads them
/// from a checkpoint ([`super::registry::Family`] holds one): what the
/// entry points ask of a family besides its equations.
pub trait DecoderConfig: std::fmt::Debug + std::any::Any {
    /// The architecture's name as in `general.architecture` (`model_type`
    /// for HF llama-family checkpoints).
    fn name(&self) -> &str;

    /// Tensors a checkpoint of this family may hold that the reference
    /// implementation loads but never reads (GGUF names): not a part kiln
    /// leaves out.
    fn unread_tensors(&self) -> Vec<String> {
        Vec::new()
    }

    /// The widest mixture of experts of its layers, if it has any.
    fn experts(&self) -> Option<super::moe::MoeConfig> {
        None
    }

    /// Declares the weights in `t` and returns the model, ready to trace.
    fn load<'t>(&self, t: &'t Tracer, weights: &dyn Checkpoint) -> Result<Box<dyn Decoder<'t> + 't>>;
}
