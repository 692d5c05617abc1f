//! The graphs traced from a decoder family: [`prefill`] without a cache,
//! the serving [`entry_points`] over a KV cache, the greedy picker, and
//! [`Serving`], the three that lowering turns into `generate`.

use super::cache::{Cache, CacheSpec, KvCache};
use super::checkpoint::Checkpoint;
use super::decoder::{Decoder, Keys, Logits, Span};
use super::registry::Family;
use super::{ModelError, Result};
use crate::graph::{DType, Graph, TensorType, DYNAMIC};
use crate::interp::{Buffer, InterpError, ParamSource, Value};
use crate::trace::{Tensor, Tracer};
use std::collections::BTreeSet;

/// Prefill without a KV cache: `main(tokens: tensor<1 x seq_len x i32>) ->
/// logits: tensor<1 x seq_len x vocab x f32>`, positions `0..seq_len`;
/// `seq_len` may be [`DYNAMIC`], one module for every prompt length.
pub fn prefill(family: &Family, weights: &dyn Checkpoint, seq_len: usize) -> Result<Graph> {
    let t = Tracer::new("main");
    let model = family.load(&t, weights)?;
    let tokens = t.input("tokens", TensorType::new([1, seq_len], DType::I32))?;
    let positions = t.iota(0, TensorType::new([seq_len], DType::I32))?;
    let at =
        Span { positions: &positions, keys: Keys::Masked { len: seq_len, q_offset: 0.into() }, logits: Logits::Every };
    let logits = model.forward(&tokens.reshape(&[seq_len])?, at, None)?;
    Ok(t.finish(&[&logits.reshape(&[1, seq_len, model.vocab_size()])?])?)
}

/// The serving entry points, one graph each, sharing the weights:
/// - `prefill(tokens: tensor<1x?xi32>) -> (logits: tensor<1x?xVOCABxf32>,
///   keys, values)`: the prompt at positions `0..`, and caches of
///   `cache`'s positions and dtype holding it;
/// - `decode(tokens: tensor<1xNxi32>, position: tensor<i32>, keys, values)
///   -> (logits: tensor<1xNxVOCABxf32>, keys, values)`: `N` more tokens at
///   `position..`.
pub fn entry_points(
    family: &Family,
    weights: &dyn Checkpoint,
    cache: impl Into<CacheSpec>,
    decode_len: usize,
) -> Result<Vec<Graph>> {
    let cache = cache.into();
    Ok(vec![prompt_graph(family, weights, cache)?, decode_graph(family, weights, cache, decode_len)?])
}

/// [`entry_points`]' `prefill`.
fn prompt_graph(family: &Family, weights: &dyn Checkpoint, cache: CacheSpec) -> Result<Graph> {
    let cache = CacheSpec::new(cache.max_context, cache.dtype)?;
    let t = Tracer::new("prefill");
    let model = family.load(&t, weights)?;
    let tokens = t.input("tokens", TensorType::new([1, DYNAMIC], DType::I32))?;
    let (keys, values) = model.cache_types(cache);
    let (keys, values) = (t.constant(0.0, keys)?, t.constant(0.0, values)?);
    let start = t.constant(0.0, TensorType::new([], DType::I32))?;
    finish_cached(
        &t,
        &*model,
        &tokens,
        KvCache { keys: Cache(keys), values: Cache(values), start, empty: true },
        Returns::Logits,
    )
}

/// [`entry_points`]' `decode`.
fn decode_graph(family: &Family, weights: &dyn Checkpoint, cache: CacheSpec, decode_len: usize) -> Result<Graph> {
    step_graph("decode", family, weights, cache, decode_len, Returns::Logits)
}

/// [`Serving::fill`] (`tokens` 1, `decode`'s step without the head) or
/// [`Serving::fill_chunk`] (`tokens` [`FILL_CHUNK`]).
fn fill_graph(name: &str, family: &Family, weights: &dyn Checkpoint, cache: CacheSpec, tokens: usize) -> Result<Graph> {
    step_graph(name, family, weights, cache, tokens, Returns::Hidden)
}

/// Tokens a [`Serving::fill_chunk`] step takes.
pub const FILL_CHUNK: usize = 4;

/// `name(tokens: tensor<1 x decode_len x i32>, position, keys, values) ->
/// (what `returns` says, keys, values)`.
fn step_graph(
    name: &str,
    family: &Family,
    weights: &dyn Checkpoint,
    cache: CacheSpec,
    decode_len: usize,
    returns: Returns,
) -> Result<Graph> {
    let cache = CacheSpec::new(cache.max_context, cache.dtype)?;
    let t = Tracer::new(name);
    let model = family.load(&t, weights)?;
    let tokens = t.input("tokens", TensorType::new([1, decode_len], DType::I32))?;
    let start = t.input("position", TensorType::new([], DType::I32))?;
    let (keys, values) = model.cache_types(cache);
    let (keys, values) = (t.input("keys", keys)?, t.input("values", values)?);
    let cache = KvCache { keys: Cache(keys), values: Cache(values), start, empty: false };
    finish_cached(&t, &*model, &tokens, cache, returns)
}

/// [`Serving::head`]: the output head alone, pruned of the model's other
/// weights, which its trace declares but never reads.
fn head_graph(family: &Family, weights: &dyn Checkpoint, hidden: &TensorType) -> Result<Graph> {
    let t = Tracer::new("head");
    let model = family.load(&t, weights)?;
    let x = t.input("hidden", hidden.clone())?;
    let logits = model.logits(&x.reshape(&hidden.shape[1..])?)?;
    let logits = logits.reshape(&[1, 1, model.vocab_size()])?;
    Ok(t.finish(&[&logits])?.pruned())
}

/// `name(logits: tensor<1 x seq x vocab x f32>, index: tensor<i32>) ->
/// tensor<1x1xi32>`: the greedy choice at position `index` (the argmax;
/// the first one on a tie). `seq` may be [`DYNAMIC`].
pub fn greedy_pick(name: &str, seq: usize, vocab: usize) -> Result<Graph> {
    let t = Tracer::new(name);
    let logits = t.input("logits", TensorType::new([1, seq, vocab], DType::F32))?;
    let index = t.input("index", TensorType::new([], DType::I32))?;
    let zero = t.constant(0.0, TensorType::new([], DType::I32))?;
    let row = logits.dynamic_slice(&[&zero, &index, &zero], &[1, 1, vocab])?;
    let token = row.argmax(2)?;
    Ok(t.finish(&[&token])?)
}

/// The serving graphs of a model: [`entry_points`]' prompt graph, its
/// one-token decode as a step and a head, and the picker of
/// [`crate::lower::GreedyLoop`].
pub struct Serving {
    /// `prefill(tokens: tensor<1x?xi32>) -> (logits, keys, values)`, the
    /// logits of the prompt's last position; `None` where every prompt is
    /// prefilled by `decode` steps (`stepped_prefill` at least `max_context`).
    pub prefill: Option<Graph>,
    /// `fill(tokens: tensor<1x1xi32>, position, keys, values) -> (hidden:
    /// tensor<1x1xHxf32>, keys, values)`: a decode step up to the head's
    /// input, what the prompt's steps but the last run.
    pub fill: Graph,
    /// `fill_chunk(tokens: tensor<1xCxi32>, position, keys, values) ->
    /// (hidden, keys, values)`, `C` = [`FILL_CHUNK`]: `fill` over `C` tokens
    /// at once, the stepped prompt's steps while `C` or more of its tokens
    /// are left (its products read each packed block once for `C` rows);
    /// `None` where no stepped prompt is that long, and for a mixture of
    /// experts (whose layers run every expert over more than one token).
    pub fill_chunk: Option<Graph>,
    /// `head(hidden) -> logits: tensor<1x1xVxf32>`. `decode` is `head` after
    /// `fill` ([`Serving::decode_reference`]): one traced model body, not
    /// two (Qwen3-30B-A3B's export took 0.66 s and 62 MB with a `decode`
    /// graph beside `fill`).
    pub head: Graph,
    /// [`greedy_pick`] over the `[1, 1, vocab]` logits both return.
    pub pick: Graph,
    /// Positions of the KV cache: prompt plus generated tokens.
    pub max_context: usize,
    /// Prompts of at most this many tokens are prefilled by `decode` steps
    /// ([`crate::lower::GreedyLoop::stepped_prefill`], [`Serving::prefill_reference`]).
    pub stepped_prefill: usize,
}

/// The default [`Serving::stepped_prefill`] of `family`: every prompt for a
/// mixture of experts whose tokens each use an eighth of the experts or
/// less, whose prompt graph would run every expert over every token (more
/// than 8x the work; Qwen3-30B-A3B's is 16x, README "Mixtures of experts"
/// has the figures), else [`crate::lower::STEPPED_PREFILL`].
pub fn default_stepped_prefill(family: &Family, max_context: usize) -> usize {
    match family.experts() {
        Some(moe) if moe.experts >= 8 * moe.used => max_context,
        _ => crate::lower::STEPPED_PREFILL,
    }
}

/// The key and value caches' types of `family` for `cache`, from the model
/// loaded on a scratch trace: what a capacity costs before choosing it.
pub fn cache_types(family: &Family, weights: &dyn Checkpoint, cache: CacheSpec) -> Result<(TensorType, TensorType)> {
    let t = Tracer::new("cache_types");
    let types = family.load(&t, weights)?.cache_types(cache);
    Ok(types)
}

impl Serving {
    /// Traces the graphs of `family` over `weights`, every tensor of the
    /// model used ([`Checkpoint::unused`]), prompts of up to the family's
    /// [`default_stepped_prefill`] tokens stepped.
    pub fn new(family: &Family, weights: &dyn Checkpoint, cache: impl Into<CacheSpec>) -> Result<Serving> {
        let cache = cache.into();
        Serving::stepped(family, weights, cache, default_stepped_prefill(family, cache.max_context))
    }

    /// [`Serving::new`] with prompts of up to `stepped_prefill` tokens
    /// stepped; with `max_context` or more, every prompt, and no prompt
    /// graph is traced.
    pub fn stepped(
        family: &Family,
        weights: &dyn Checkpoint,
        cache: impl Into<CacheSpec>,
        stepped_prefill: usize,
    ) -> Result<Serving> {
        let cache = cache.into();
        let prefill = match stepped_prefill < cache.max_context {
            true => Some(prompt_graph(family, weights, cache)?),
            false => None,
        };
        let fill = fill_graph("fill", family, weights, cache, 1)?;
        let stepped_prefill = stepped_prefill.min(cache.max_context);
        // A mixture of experts runs every expert over several tokens (moe.rs).
        let fill_chunk = match stepped_prefill >= FILL_CHUNK && family.experts().is_none() {
            true => Some(fill_graph("fill_chunk", family, weights, cache, FILL_CHUNK)?),
            false => None,
        };
        let head = head_graph(family, weights, &fill.node(fill.outputs()[0]).ty)?;
        let used: BTreeSet<&str> =
            [&fill, &head].into_iter().chain(&prefill).flat_map(|g| g.params()).map(|(_, name, _)| name).collect();
        if let Some(name) = weights.unused(&used, &family.unread_tensors()) {
            return Err(ModelError::UnusedTensor { name, family: family.name().to_string() });
        }
        let vocab = head.node(head.outputs()[0]).ty.shape[2];
        Ok(Serving {
            prefill,
            fill,
            fill_chunk,
            head,
            pick: greedy_pick("pick", 1, vocab)?,
            max_context: cache.max_context,
            stepped_prefill,
        })
    }

    /// These graphs as the [`crate::lower::GreedyLoop`] that lowering turns
    /// into `generate`.
    pub fn greedy_loop(&self) -> crate::lower::GreedyLoop<'_> {
        crate::lower::GreedyLoop {
            prefill: self.prefill.as_ref(),
            fill: &self.fill,
            fill_chunk: self.fill_chunk.as_ref(),
            head: &self.head,
            pick: &self.pick,
            max_context: self.max_context,
            stepped_prefill: self.stepped_prefill,
        }
    }

    /// What the serving module's `prefill(prompt)` computes, by the reference
    /// interpreter: from empty caches, `fill_chunk` steps while a chunk is
    /// left, `fill` steps for the rest, and the head, for a prompt of at
    /// most [`Serving::stepped_prefill`] tokens; else the prompt's graph.
    /// Returns `(logits, keys, values)`.
    pub fn prefill_reference(
        &self,
        params: &dyn ParamSource,
        prompt: &[u32],
    ) -> std::result::Result<Vec<Value>, InterpError> {
        match &self.prefill {
            Some(prefill) if prompt.len() > self.stepped_prefill => {
                return crate::interp::run(prefill, &[token_ids(prompt)], params)
            }
            _ => {}
        }
        let mut state: Vec<Value> = self
            .fill
            .outputs()
            .iter()
            .map(|&v| {
                let ty = &self.fill.node(v).ty;
                Value::from_le_bytes(ty, &vec![0; ty.num_elements() * ty.dtype.size_in_bytes()])
            })
            .collect::<std::result::Result<_, _>>()?;
        let mut position = 0;
        while position < prompt.len() {
            let (graph, n) = match &self.fill_chunk {
                Some(chunk) if prompt.len() - position >= FILL_CHUNK => (chunk, FILL_CHUNK),
                _ => (&self.fill, 1),
            };
            let mut inputs = vec![token_ids(&prompt[position..position + n]), scalar_i32(position as i32)];
            inputs.extend(state.drain(1..));
            state = crate::interp::run(graph, &inputs, params)?;
            position += n;
        }
        self.head_of(params, state)
    }

    /// What the serving module's `decode(tokens, position, keys, values)`
    /// computes, by the reference interpreter: `fill`, then `head`. Returns
    /// `(logits, keys, values)`.
    pub fn decode_reference(
        &self,
        params: &dyn ParamSource,
        inputs: &[Value],
    ) -> std::result::Result<Vec<Value>, InterpError> {
        let filled = crate::interp::run(&self.fill, inputs, params)?;
        self.head_of(params, filled)
    }

    /// `fill`'s `(hidden, caches...)` as `(logits, caches...)`.
    fn head_of(&self, params: &dyn ParamSource, mut state: Vec<Value>) -> std::result::Result<Vec<Value>, InterpError> {
        let hidden = state.remove(0);
        state.splice(0..0, crate::interp::run(&self.head, &[hidden], params)?);
        Ok(state)
    }

    /// What `generate(prompt, n_new)` computes, by the reference
    /// interpreter: prefill, then one decode per token, each the argmax
    /// (the first on a tie) of the last logits. Stops at `n_new` tokens or
    /// when the cache is full.
    pub fn generate_reference(
        &self,
        params: &dyn ParamSource,
        prompt: &[u32],
        n_new: usize,
    ) -> std::result::Result<Vec<u32>, InterpError> {
        let pick = |logits: &Value| {
            let values = logits.to_f64_vec();
            let vocab = logits.ty.shape[2];
            let last = &values[values.len() - vocab..];
            (0..vocab).fold(0, |best, i| if last[i] > last[best] { i } else { best }) as u32
        };
        let params = &crate::interp::CachedParams::new(params);
        let mut state = self.prefill_reference(params, prompt)?;
        let mut tokens = vec![pick(&state[0])];
        let room = (self.max_context + 1).saturating_sub(prompt.len());
        while tokens.len() < n_new.min(room) {
            let position = (prompt.len() + tokens.len() - 1) as i32;
            let mut inputs = vec![token_ids(&tokens[tokens.len() - 1..]), scalar_i32(position)];
            inputs.extend(state.drain(1..));
            state = self.decode_reference(params, &inputs)?;
            tokens.push(pick(&state[0]));
        }
        tokens.truncate(n_new);
        Ok(tokens)
    }
}

/// What a graph over the cache returns before the caches: the last
/// position's
#[derive(Clone, Copy)]
enum Returns {
    /// logits, `[1, 1, vocab]`;
    Logits,
    /// head input, `[1, 1, hidden]` ([`Decoder::hidden`]).
    Hidden,
}

/// Runs `tokens [1, n]` through `model` with `cache` and ends the trace with
/// `(what returns says, keys, values)`.
fn finish_cached<'t>(
    t: &'t Tracer,
    model: &dyn Decoder<'t>,
    tokens: &Tensor<'t>,
    mut cache: KvCache<'t>,
    returns: Returns,
) -> Result<Graph> {
    let n = tokens.ty.shape[1];
    let hidden = model.hidden_cached(&tokens.reshape(&[n])?, &mut cache)?;
    let last = match returns {
        Returns::Logits => model.logits(&hidden)?,
        Returns::Hidden => hidden,
    };
    let last = last.reshape(&[1, 1, last.ty.shape[1]])?;
    Ok(t.finish(&[&last, &cache.keys.0, &cache.values.0])?)
}

/// Token ids as the entry points take them: `tensor<1xNxi32>`.
pub fn token_ids(ids: &[u32]) -> Value {
    let ids = ids.iter().map(|&id| id as i32).collect::<Vec<_>>();
    Value::new(TensorType::new([1, ids.len()], DType::I32), Buffer::I32(ids)).expect("one element per id")
}

/// A position or a count as the entry points take it: `tensor<i32>`.
pub fn scalar_i32(value: i32) -> Value {
    Value::new(TensorType::new([], DType::I32), Buffer::I32(vec![value])).expect("one element")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::testing;
    use crate::models::{GgufWeights, PackedPolicy};
    use crate::weights::gguf::Gguf;

    /// A decode of 3 tokens streams the packed weights, 3 rows of `x` per
    /// product but the head's, and computes what 3 one-token steps do.
    #[test]
    fn decode_of_several_tokens_streams_the_packed_weights() {
        use crate::models::synth::{self, Preset, SynthData};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        synth::write(&Preset::TinyLlama.config(), &path, SynthData::Seeded(0)).unwrap();
        let gguf = Gguf::open(&path).unwrap();
        let weights = GgufWeights::new(&gguf, PackedPolicy::Keep).unwrap();
        let family = Family::from_gguf(&gguf).unwrap();
        let [prompt, three] = entry_points(&family, &weights, 16, 3).unwrap().try_into().unwrap();
        let one = entry_points(&family, &weights, 16, 1).unwrap().remove(1);
        let rows = |g: &Graph| -> Vec<usize> {
            let products = g.nodes().iter().filter(|n| matches!(n.op, crate::graph::Op::PackedMatvec { .. }));
            products.map(|n| g.node(*n.operands.last().unwrap()).ty.shape[0]).collect()
        };
        let (rows3, rows1) = (rows(&three), rows(&one));
        // The head runs on the last position only.
        let (head, body) = rows3.split_last().unwrap();
        assert!(*head == 1 && !body.is_empty() && body.iter().all(|&r| r == 3), "{rows3:?}");
        assert_eq!((rows3.len(), rows1.iter().all(|&r| r == 1)), (rows1.len(), true));

        let start = crate::interp::run(&prompt, &[token_ids(&[1, 2])], &weights).unwrap();
        let at = |graph: &Graph, ids: &[u32], position: i32, state: &[Value]| {
            let inputs = [token_ids(ids), scalar_i32(position), state[1].clone(), state[2].clone()];
            crate::interp::run(graph, &inputs, &weights).unwrap()
        };
        let together = at(&three, &[5, 9, 3], 2, &start);
        let mut stepped = start;
        for (i, &id) in [5, 9, 3].iter().enumerate() {
            stepped = at(&one, &[id], 2 + i as i32, &stepped);
        }
        for (a, b) in together.iter().zip(&stepped) {
            let worst = crate::max_abs_diff(&a.to_f64_vec(), &b.to_f64_vec());
            assert!(worst <= 1e-5, "{}: {worst}", a.ty);
        }
    }

    /// The real checkpoints trace with one param per tensor (the tied head
    /// is `token_embd.weight`), the tokens their only input.
    #[test]
    fn checkpoints_trace_one_param_per_tensor() {
        for (path, params, vocab) in [(testing::smollm2_path(), 272, 49152), (testing::gemma3_path(), 236, 262144)] {
            let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{e} (run `make setup`)"));
            let start = std::time::Instant::now();
            let graph =
                prefill(&Family::from_gguf(&gguf).unwrap(), &GgufWeights::new(&gguf, PackedPolicy::Keep).unwrap(), 6)
                    .unwrap();
            eprintln!("{}: trace {:.2?}, {} nodes", path.display(), start.elapsed(), graph.nodes().len());
            let names: Vec<&str> = graph.params().map(|(_, name, _)| name).collect();
            assert_eq!((names.len(), gguf.tensors().len()), (params, params));
            assert!(!names.contains(&"output.weight"), "the tied head is token_embd.weight");
            let tokens = graph.node(graph.inputs()[0]);
            assert_eq!(
                (graph.inputs().len(), tokens.name.as_str(), tokens.ty.to_string()),
                (1, "tokens", "tensor<1x6xi32>".into())
            );
            assert_eq!(graph.node(graph.outputs()[0]).ty.to_string(), format!("tensor<1x6x{vocab}xf32>"));
        }
    }
}
