//! Lowers `dynamic_slice` and `dynamic_update_slice`: the start indices are
//! operands, so StableHLO clamps them at run time exactly as the graph says.

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
