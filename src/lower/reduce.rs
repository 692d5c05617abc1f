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
    Ok(lower_reduce_all(e, kind, &[operand], dimensions, result)?[0])
}

/// `operands`, each reduced by `kind` over `dimensions` to a `result`, in
/// one `stablehlo.reduce`: IREE makes one dispatch of it.
pub(super) fn lower_reduce_all<'c, 'a>(
    e: &Emitter<'c, 'a>,
    kind: ReduceKind,
    operands: &[Value<'c, 'a>],
    dimensions: &[usize],
    result: &TensorType,
) -> Result<Vec<Value<'c, 'a>>, LowerError> {
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

    // The body takes the accumulators, then the elements: (acc_0..acc_n,
    // x_0..x_n) -> (acc_i + x_i).
    let n = operands.len();
    let body = Block::new(&vec![(scalar_type, loc); 2 * n]);
    {
        let arg = |i: usize| -> Value { body.argument(i).expect("two arguments per operand").into() };
        let combined: Vec<Value> = (0..n)
            .map(|i| {
                let (lhs, rhs) = (arg(i), arg(n + i));
                let op = match kind {
                    ReduceKind::Sum => body.append_operation(stablehlo::add(ctx, scalar_type, lhs, rhs, loc).into()),
                    ReduceKind::Max => {
                        body.append_operation(stablehlo::maximum(ctx, scalar_type, lhs, rhs, loc).into())
                    }
                };
                op.result(0).expect("add and maximum have one result").into()
            })
            .collect();
        body.append_operation(stablehlo::r#return(ctx, &combined, loc).into());
    }
    let region = Region::new();
    region.append_block(body);
    let results = vec![e.tensor_type(result); n];
    let inits = vec![init; n];
    let op = stablehlo::reduce(ctx, &results, operands, &inits, region, e.i64_array(dimensions), loc);
    let op = e.block.append_operation(op.into());
    Ok((0..n).map(|i| op.result(i).expect("one result per operand").into()).collect())
}
