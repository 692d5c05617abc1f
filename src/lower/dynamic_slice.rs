//! Lowers `dynamic_slice`, `dynamic_update_slice` and `real_dynamic_slice`:
//! the start indices (and the latter's limits and strides) are operands, so
//! StableHLO reads them at run time exactly as the graph says.

use super::dialects::stablehlo;
use super::{Emitter, LowerError};
use melior::ir::{Type, Value};

pub(super) fn lower_dynamic_slice<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    start_indices: &[Value<'c, 'a>],
    slice_sizes: &[usize],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::dynamic_slice(e.ctx(), result, operand, start_indices, e.i64_array(slice_sizes), e.loc()))
}

pub(super) fn lower_dynamic_update_slice<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    update: Value<'c, 'a>,
    start_indices: &[Value<'c, 'a>],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::dynamic_update_slice(e.ctx(), result, operand, update, start_indices, e.loc()))
}

/// `real_dynamic_slice(operand, start_indices, limit_indices, strides)`, the
/// operands as the graph has them.
pub(super) fn lower_real_dynamic_slice<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operands: &[Value<'c, 'a>],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    let &[operand, start, limit, strides] = operands else {
        return Err(e.error(format!("takes 4 operands, got {}", operands.len())));
    };
    e.emit(stablehlo::real_dynamic_slice(e.ctx(), result, operand, start, limit, strides, e.loc()))
}
