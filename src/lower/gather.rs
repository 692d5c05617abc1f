//! Lowers the embedding row lookup to `stablehlo.gather`.
//!
//! For `operand: [V, d1..dn]` and `indices: [i1..ik]`, each index picks a
//! slice of size `[1, d1..dn]`: dim 0 is collapsed, the offset dims come
//! after the `k` batch dims, and `index_vector_dim = k` makes each index a
//! scalar.

use super::dialects::stablehlo;
use super::dot_general::int_list;
use super::{Emitter, LowerError};
use crate::graph::TensorType;
use melior::ir::Value;

pub(super) fn lower_gather<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    indices: Value<'c, 'a>,
    operand_ty: &TensorType,
    indices_ty: &TensorType,
    result: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let batch_rank = indices_ty.rank();
    let offset_dims: Vec<usize> = (batch_rank..result.rank()).collect();
    let numbers = format!(
        "#stablehlo.gather<offset_dims = {}, collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {batch_rank}>",
        int_list(&offset_dims)
    );
    let mut slice_sizes = vec![1];
    slice_sizes.extend_from_slice(&operand_ty.shape[1..]);
    let attr = e.parse_attribute(&numbers)?;
    e.emit(stablehlo::gather(
        e.ctx(),
        e.tensor_type(result),
        operand,
        indices,
        attr,
        e.i64_array(&slice_sizes),
        e.loc(),
    ))
}
