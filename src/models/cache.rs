//! The KV cache as explicit tensors: what the `prefill` and `decode` entry
//! points take and return.

use super::blocks::LayerKv;
use super::{ModelError, Result};
use crate::graph::{ComparisonDirection, DType, TensorType, DYNAMIC};
use crate::trace::nn::{causal_mask, sliding_window_mask};
use crate::trace::{Tensor, Tracer};

/// Keys or values of every layer, `[block_count, head_count_kv,
/// max_context, head_dim]`: one tensor, so entry points take and return
/// two caches whatever the depth. Its dtype is the cache's
/// ([`CacheSpec::dtype`]): rows are converted to it when written (rounding
/// to nearest even, as torch's `.to` does) and back to the rows' own dtype
/// when read, so attention computes in f32 whatever the cache holds.
pub struct Cache<'t>(pub Tensor<'t>);

impl<'t> Cache<'t> {
    /// `[layers, kv_heads, context, head_dim]`.
    fn dims(&self) -> Result<[usize; 4]> {
        self.0.ty.shape[..].try_into().map_err(|_| {
            ModelError::Config(format!("a KV cache is [layers, kv_heads, context, head_dim], found {}", self.0.ty))
        })
    }

    /// Writes `x [kv_heads, seq, head_dim]` at positions `start..` of
    /// `layer`, and returns the layer's whole `[kv_heads, max_context,
    /// head_dim]` after the write.
    pub fn write(&mut self, layer: usize, x: &Tensor<'t>, start: &Tensor<'t>) -> Result<Tensor<'t>> {
        let t = start.tracer();
        let [_, kv_heads, context, head_dim] = self.dims()?;
        let layer_of = |cache: &Tensor<'t>| {
            cache
                .slice(&[layer, 0, 0, 0], &[layer + 1, kv_heads, context, head_dim], &[1; 4])?
                .reshape(&[kv_heads, context, head_dim])
        };
        if !x.ty.is_dynamic() {
            self.put(layer, x, start)?;
            return as_dtype(layer_of(&self.0)?, x.ty.dtype);
        }
        let (read_as, x) = (x.ty.dtype, &as_dtype(x.clone(), self.0.ty.dtype)?);
        // iree-compile cannot legalize a dynamic_update_slice whose update is
        // `?` long, so a prompt is spread over the whole row instead: position
        // j takes x[j - start] (gather clamps the index) where j >= start.
        // Positions past the prompt get copies of its last row; the mask
        // hides them until decode overwrites them.
        let old = layer_of(&self.0)?;
        let j = t.iota(0, TensorType::new([context], DType::I32))?;
        let start_j = start.broadcast_in_dim(&[context], &[])?;
        let spread = x.transpose(&[1, 0, 2])?.gather(&j.subtract(&start_j)?)?.transpose(&[1, 0, 2])?;
        let before = j.compare(ComparisonDirection::Lt, &start_j)?.broadcast_in_dim(&old.ty.shape, &[1])?;
        let row = before.select(&old, &spread)?;
        let update = row.reshape(&[1, kv_heads, context, head_dim])?;
        let (layer_index, zero) = layer_and_zero(layer, start)?;
        self.0 = self.0.dynamic_update_slice(&update, &[&layer_index, &zero, &zero, &zero])?;
        as_dtype(row, read_as)
    }

    /// Writes the rows `x [kv_heads, seq, head_dim]` (a static `seq`) at
    /// positions `start..` of `layer`. The rows go straight into the whole
    /// cache, which IREE updates in place: writing the layer's slice and
    /// then the slice back made four 96 KB copies per layer and step on
    /// SmolLM2.
    fn put(&mut self, layer: usize, x: &Tensor<'t>, start: &Tensor<'t>) -> Result<()> {
        let [_, kv_heads, _, head_dim] = self.dims()?;
        let [_, seq, _] = x.ty.shape[..] else {
            return Err(ModelError::Config(format!("cache rows are [kv_heads, seq, head_dim], found {}", x.ty)));
        };
        let (layer_index, zero) = layer_and_zero(layer, start)?;
        let rows = as_dtype(x.reshape(&[1, kv_heads, seq, head_dim])?, self.0.ty.dtype)?;
        self.0 = self.0.dynamic_update_slice(&rows, &[&layer_index, &zero, start, &zero])?;
        Ok(())
    }

    /// Positions `0..filled` of `layer` (`filled` a `tensor<i32>` in
    /// `1..=max_context`) as `read_as`: `[kv_heads, ?, head_dim]`, one
    /// `real_dynamic_slice` of the whole cache, so nothing past them is read.
    fn filled(&self, layer: usize, filled: &Tensor<'t>, read_as: DType) -> Result<Tensor<'t>> {
        let [_, kv_heads, _, head_dim] = self.dims()?;
        let t = filled.tracer();
        let dtype = filled.ty.dtype;
        let start = index_vector(t, dtype, &[Index::At(layer), Index::At(0), Index::At(0), Index::At(0)])?;
        let limit = [Index::At(layer + 1), Index::At(kv_heads), Index::Of(filled), Index::At(head_dim)];
        let limit = index_vector(t, dtype, &limit)?;
        let strides = t.constant(1.0, TensorType::new([4], dtype))?;
        let rows = self.0.real_dynamic_slice(&start, &limit, &strides, &[1, kv_heads, DYNAMIC, head_dim])?;
        as_dtype(rows.reshape(&[kv_heads, DYNAMIC, head_dim])?, read_as)
    }

    /// The `window` positions of `layer` from `first` on as `read_as`:
    /// `[kv_heads, window, head_dim]`.
    fn window(&self, layer: usize, first: &Tensor<'t>, window: usize, read_as: DType) -> Result<Tensor<'t>> {
        let [_, kv_heads, _, head_dim] = self.dims()?;
        let (layer_index, zero) = layer_and_zero(layer, first)?;
        let rows = self.0.dynamic_slice(&[&layer_index, &zero, first, &zero], &[1, kv_heads, window, head_dim])?;
        as_dtype(rows.reshape(&[kv_heads, window, head_dim])?, read_as)
    }
}

/// `x` converted to `dtype`, if it is not of it already.
fn as_dtype(x: Tensor<'_>, dtype: DType) -> Result<Tensor<'_>> {
    Ok(if x.ty.dtype == dtype { x } else { x.convert(dtype)? })
}

/// `layer` and 0 as start indices of `like`'s type (`tensor<i32>`).
fn layer_and_zero<'t>(layer: usize, like: &Tensor<'t>) -> Result<(Tensor<'t>, Tensor<'t>)> {
    let index = |i: usize| like.tracer().constant(i as f64, like.ty.clone());
    Ok((index(layer)?, index(0)?))
}

/// An entry of an index vector: known while tracing, or a `tensor<i32>`
/// computed at run time.
enum Index<'a, 't> {
    At(usize),
    Of(&'a Tensor<'t>),
}

/// `entries` as a 1-D tensor of `dtype`, each run of one static value a
/// single splat.
fn index_vector<'t>(t: &'t Tracer, dtype: DType, entries: &[Index<'_, 't>]) -> Result<Tensor<'t>> {
    let mut pieces = Vec::new();
    let mut rest = entries;
    while let Some(first) = rest.first() {
        let (piece, taken) = match *first {
            Index::Of(x) => (x.reshape(&[1])?, 1),
            Index::At(v) => {
                let run = rest.iter().take_while(|e| matches!(e, Index::At(w) if *w == v)).count();
                (t.constant(v as f64, TensorType::new([run], dtype))?, run)
            }
        };
        pieces.push(piece);
        rest = &rest[taken..];
    }
    Ok(t.concatenate(&pieces.iter().collect::<Vec<_>>(), 0)?)
}

/// Both caches and where this call's tokens start (`tensor<i32>`).
pub struct KvCache<'t> {
    /// Every layer's keys.
    pub keys: Cache<'t>,
    /// Every layer's values.
    pub values: Cache<'t>,
    /// The position of this call's first token, `tensor<i32>`.
    pub start: Tensor<'t>,
    /// Nothing is written before this call (`start` is 0): its tokens
    /// attend to their own keys ([`super::Keys::Own`]).
    pub empty: bool,
}

impl<'t> KvCache<'t> {
    /// Writes one layer's keys and values `[kv_heads, seq, dim]` at
    /// `start..` and returns the layer's whole keys and values after it.
    pub fn write(&mut self, layer: usize, k: &Tensor<'t>, v: &Tensor<'t>) -> Result<(Tensor<'t>, Tensor<'t>)> {
        Ok((self.keys.write(layer, k, &self.start)?, self.values.write(layer, v, &self.start)?))
    }

    /// Writes this call's keys and values `[kv_heads, n, dim]` (a static
    /// `n`) at `start..start + n` of `layer` and returns those its queries
    /// see:
    /// - positions `0..start + n`, `[kv_heads, ?, dim]` with `?` = `start +
    ///   n`, under a causal mask where `n` > 1 (none for one query, which
    ///   sees them all);
    /// - on a layer whose `window` is shorter than the cache, the `window +
    ///   n - 1` positions ending at `start + n - 1` (starting at 0 until that
    ///   many are written), under a sliding-window mask. A static slice:
    ///   every `?` of a function is one run-time size, and the global
    ///   layers' is `start + n`.
    ///
    /// Either way the cost follows the filled positions (or the window), not
    /// the capacity.
    pub(crate) fn write_filled(
        &mut self,
        layer: usize,
        k: &Tensor<'t>,
        v: &Tensor<'t>,
        window: Option<usize>,
    ) -> Result<LayerKv<'t>> {
        if [k, v].iter().any(|x| x.ty.rank() != 3 || x.ty.is_dynamic() || x.ty.shape[1] != k.ty.shape[1]) {
            return Err(ModelError::Config(format!(
                "attending over the filled cache takes this call's keys and values [kv_heads, n, dim], n static, found {} and {}",
                k.ty, v.ty
            )));
        }
        let n = k.ty.shape[1];
        self.keys.put(layer, k, &self.start)?;
        self.values.put(layer, v, &self.start)?;
        let t = self.start.tracer();
        let scalar = |x: usize| t.constant(x as f64, self.start.ty.clone());
        let filled = self.start.add(&scalar(n)?)?;
        match window.filter(|&w| w + n - 1 < self.context()) {
            None => {
                let keys = self.keys.filled(layer, &filled, k.ty.dtype)?;
                let values = self.values.filled(layer, &filled, v.ty.dtype)?;
                // Traced after the slices, which give the `?` its size.
                let mask = match (n, window) {
                    (1, _) => None,
                    (_, Some(window)) => Some(sliding_window_mask(t, n, DYNAMIC, &self.start, window)?),
                    (_, None) => Some(causal_mask(t, n, DYNAMIC, &self.start)?),
                };
                Ok(LayerKv { keys, values, mask })
            }
            Some(window) => {
                let seen = window + n - 1;
                // dynamic_slice would clamp a negative start to 0 too; the
                // mask needs the start it reads from.
                let first = filled.subtract(&scalar(seen)?)?.maximum(&scalar(0)?)?;
                let mask = sliding_window_mask(t, n, seen, &self.start.subtract(&first)?, window)?;
                Ok(LayerKv {
                    keys: self.keys.window(layer, &first, seen, k.ty.dtype)?,
                    values: self.values.window(layer, &first, seen, v.ty.dtype)?,
                    mask: Some(mask),
                })
            }
        }
    }

    /// This call's positions, `start..start + seq`, as `[seq]` i32.
    pub fn positions(&self, seq: usize) -> Result<Tensor<'t>> {
        let offsets = self.start.tracer().iota(0, TensorType::new([seq], DType::I32))?;
        Ok(offsets.add(&self.start.broadcast_in_dim(&[seq], &[])?)?)
    }

    /// How many positions the cache holds.
    pub fn context(&self) -> usize {
        self.keys.0.ty.shape[2]
    }
}

/// What the KV caches hold: how many positions, and in which dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSpec {
    /// Positions: prompt plus generated tokens.
    pub max_context: usize,
    /// The caches' element type: f32, f16 or bf16 ([`CacheSpec::DTYPES`]).
    pub dtype: DType,
}

impl CacheSpec {
    /// The dtypes a cache can hold.
    pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// `max_context` positions of `dtype`; no positions, or a dtype not in
    /// [`CacheSpec::DTYPES`], is refused.
    pub fn new(max_context: usize, dtype: DType) -> Result<CacheSpec> {
        if max_context == 0 {
            return Err(ModelError::Config("a KV cache of 0 positions holds no prompt; give it at least 1".into()));
        }
        if !Self::DTYPES.contains(&dtype) {
            let names: Vec<&str> = Self::DTYPES.iter().map(|d| d.as_str()).collect();
            return Err(ModelError::Config(format!("a KV cache holds {}, not {dtype}", names.join(", "))));
        }
        Ok(CacheSpec { max_context, dtype })
    }
}

/// An f32 cache of this many positions.
impl From<usize> for CacheSpec {
    fn from(max_context: usize) -> CacheSpec {
        CacheSpec { max_context, dtype: DType::F32 }
    }
}
