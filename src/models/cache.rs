//! The KV cache as explicit tensors: what the `prefill` and `decode` entry
//! points take and return.

use super::{ModelError, Result};
use crate::graph::{ComparisonDirection, DType, TensorType};
use crate::trace::Tensor;

/// Keys or values of every layer, `[block_count, head_count_kv,
/// max_context, head_dim]` f32: one tensor, so entry points take and return
/// two caches whatever the depth.
pub struct Cache<'t>(pub Tensor<'t>);

impl<'t> Cache<'t> {
    /// Writes `x [kv_heads, seq, head_dim]` at positions `start..` of
    /// `layer`, and returns the layer's whole `[kv_heads, max_context,
    /// head_dim]` after the write.
    pub fn write(&mut self, layer: usize, x: &Tensor<'t>, start: &Tensor<'t>) -> Result<Tensor<'t>> {
        let t = start.tracer();
        let [_, kv_heads, context, head_dim] = self.0.ty.shape[..] else {
            return Err(ModelError::Config(format!(
                "a KV cache is [layers, kv_heads, context, head_dim], found {}",
                self.0.ty
            )));
        };
        let index = |i: usize| t.constant(i as f64, start.ty.clone());
        let (layer_index, zero) = (index(layer)?, index(0)?);
        let layer_of = |cache: &Tensor<'t>| {
            cache
                .slice(&[layer, 0, 0, 0], &[layer + 1, kv_heads, context, head_dim], &[1; 4])?
                .reshape(&[kv_heads, context, head_dim])
        };
        if !x.ty.is_dynamic() {
            // The rows go straight into the whole cache, which IREE updates in
            // place; writing the layer's slice and then the slice back made
            // four 96 KB copies per layer and step on SmolLM2.
            let [_, seq, _] = x.ty.shape[..] else {
                return Err(ModelError::Config(format!("cache rows are [kv_heads, seq, head_dim], found {}", x.ty)));
            };
            let rows = x.reshape(&[1, kv_heads, seq, head_dim])?;
            self.0 = self.0.dynamic_update_slice(&rows, &[&layer_index, &zero, start, &zero])?;
            return Ok(layer_of(&self.0)?);
        }
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
        self.0 = self.0.dynamic_update_slice(&update, &[&layer_index, &zero, &zero, &zero])?;
        Ok(row)
    }
}

/// Both caches and where this call's tokens start (`tensor<i32>`).
pub struct KvCache<'t> {
    /// Every layer's keys.
    pub keys: Cache<'t>,
    /// Every layer's values.
    pub values: Cache<'t>,
    /// The position of this call's first token, `tensor<i32>`.
    pub start: Tensor<'t>,
}

impl<'t> KvCache<'t> {
    /// Writes one layer's keys and values `[kv_heads, seq, dim]` at
    /// `start..` and returns the layer's whole keys and values after it.
    pub fn write(&mut self, layer: usize, k: &Tensor<'t>, v: &Tensor<'t>) -> Result<(Tensor<'t>, Tensor<'t>)> {
        Ok((self.keys.write(layer, k, &self.start)?, self.values.write(layer, v, &self.start)?))
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
