//! Lowers sum and max reductions to `stablehlo.reduce` with a scalar body.

use super::constant::splat_attribute;
use super::dialects::stablehlo;
use super::{Emitter, LowerError};
use crate::graph::{ReduceKind, TensorType};
use melior::ir::{Block, BlockLike, Region, RegionLike, Value};

pub(super) fn lower_reduce<'c, 'a>(
    e: &Emitter<'c, 'a>,
    kind: ReduceKind,
    operand: Value<'c, 'a>,
    dimensions: &[usize],
    result: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let (ctx, loc) = (e.ctx(), e.loc());
    let scalar = TensorType::new([], result.dtype);
    let scalar_type = e.tensor_type(&scalar);
    let init = match (kind, result.dtype.integer_bounds()) {
        (ReduceKind::Sum, _) => 0.0,
        (ReduceKind::Max, None) => f64::NEG_INFINITY,
        // Integer max starts at the type's minimum.
        (ReduceKind::Max, Some((min, _))) => min as f64,
    };
    let init = e.emit(stablehlo::constant(ctx, scalar_type, splat_attribute(e, init, &scalar)?, loc))?;

    let body = Block::new(&[(scalar_type, loc), (scalar_type, loc)]);
    {
        let lhs: Value = body.argument(0).expect("reduce body has two arguments").into();
        let rhs: Value = body.argument(1).expect("reduce body has two arguments").into();
        let combined = match kind {
            ReduceKind::Sum => body.append_operation(stablehlo::add(ctx, scalar_type, lhs, rhs, loc).into()),
            ReduceKind::Max => body.append_operation(stablehlo::maximum(ctx, scalar_type, lhs, rhs, loc).into()),
        };
        let value: Value = combined.result(0).expect("add and maximum have one result").into();
        body.append_operation(stablehlo::r#return(ctx, &[value], loc).into());
    }
    let region = Region::new();
    region.append_block(body);
    e.emit(stablehlo::reduce(ctx, e.tensor_type(result), operand, init, region, e.i64_array(dimensions), loc))
}
