//! Lowers sum and max reductions to `stablehlo.reduce` with a scalar body,
//! and argmax to two of them.

use super::constant::splat_attribute;
use super::dialects::stablehlo;
use super::layout::lower_broadcast_in_dim;
use super::{Emitter, LowerError};
use crate::graph::{DType, ReduceKind, TensorType, DYNAMIC};
use melior::ir::operation::{OperationLike, OperationResult};
use melior::ir::{Block, BlockLike, Region, RegionLike, Value};

pub(super) fn lower_reduce<'c, 'a>(
    e: &Emitter<'c, 'a>,
    kind: ReduceKind,
    operand: Value<'c, 'a>,
    dimensions: &[usize],
    result: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    if kind == ReduceKind::Max && result.shape.is_empty() && is_dynamic_iota(operand) {
        return last_index(e, result);
    }
    Ok(lower_reduce_all(e, kind, &[operand], dimensions, result)?[0])
}

/// Whether `value` is a 1-D `stablehlo.dynamic_iota` (`0..?`), the iota
/// lowering's form for a `?` length.
fn is_dynamic_iota(value: Value) -> bool {
    OperationResult::try_from(value)
        .is_ok_and(|r| r.owner().name().as_string_ref().as_str() == Ok("stablehlo.dynamic_iota"))
}

/// The max of `0..?` (`models::blocks::last_row`'s index of the last row):
/// `? - 1`, or the max's identity for an empty range, computed from the
/// run-time size. As a reduction over a run-time length it fails IREE
/// 3.13's Vulkan codegen (a workgroup buffer sized by the length's bound).
fn last_index<'c, 'a>(e: &Emitter<'c, 'a>, result: &TensorType) -> Result<Value<'c, 'a>, LowerError> {
    let (ctx, loc) = (e.ctx(), e.loc());
    let scalar = e.tensor_type(result);
    let (min, _) = result.dtype.integer_bounds().ok_or_else(|| e.error("an iota's max has an integer dtype"))?;
    let constant = |value: f64| -> Result<Value<'c, 'a>, LowerError> {
        e.emit(stablehlo::constant(ctx, scalar, splat_attribute(e, value, result)?, loc))
    };
    let size =
        e.emit(stablehlo::convert(ctx, e.tensor_type(&TensorType::new([1], result.dtype)), e.dynamic_size()?, loc))?;
    let size = e.emit(stablehlo::reshape(ctx, scalar, size, loc))?;
    let last = e.emit(stablehlo::subtract(ctx, scalar, size, constant(1.0)?, loc))?;
    let pred = e.tensor_type(&TensorType::new([], DType::I1));
    let gt = e.parse_attribute("#stablehlo<comparison_direction GT>")?;
    let some = e.emit(stablehlo::compare(ctx, pred, size, constant(0.0)?, gt, loc))?;
    e.emit(stablehlo::select(ctx, scalar, some, last, constant(min as f64)?, loc))
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

/// argmax as `min { i : xᵢ = max x }`: max-reduce, compare against the
/// broadcast max (or NE with itself: NaN counts as the max), select the
/// index or a sentinel past every index, min-reduce (as `-max(-i)`).
/// The indices are a constant `0..n`, not an iota: an iota's `index`
/// fused into the second reduction crosses it, which IREE 3.13's Vulkan
/// codegen cannot spill to workgroup memory. JAX's one reduce over
/// (value, index) pairs compiles everywhere too, but takes SmolLM2's pick
/// (49152 logits, one core) from 0.06-0.10 ms to 0.27-0.42 ms.
pub(super) fn lower_argmax<'c, 'a>(
    e: &Emitter<'c, 'a>,
    x: Value<'c, 'a>,
    x_ty: &TensorType,
    dimension: usize,
    result: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let (ctx, loc) = (e.ctx(), e.loc());
    let len = x_ty.shape[dimension];
    let kept: Vec<usize> = (0..x_ty.rank()).filter(|&d| d != dimension).collect();
    let max = lower_reduce_all(e, ReduceKind::Max, &[x], &[dimension], &result.with_dtype(x_ty.dtype))?[0];
    let max = lower_broadcast_in_dim(e, max, &result.with_dtype(x_ty.dtype), &kept, x_ty)?;
    let pred_ty = x_ty.with_dtype(DType::I1);
    let pred = e.tensor_type(&pred_ty);
    let compare = |direction: &str, lhs, rhs| -> Result<Value<'c, 'a>, LowerError> {
        let attr = e.parse_attribute(&format!("#stablehlo<comparison_direction {direction}>"))?;
        e.emit(stablehlo::compare(ctx, pred, lhs, rhs, attr, loc))
    };
    let mut hit = compare("EQ", x, max)?;
    if x_ty.dtype.is_float() {
        let nan = compare("NE", x, x)?;
        hit = e.emit(stablehlo::or(ctx, pred, hit, nan, loc))?;
    }
    let index_ty = x_ty.with_dtype(DType::I32);
    let index = if len == DYNAMIC {
        super::constant::lower_iota(e, dimension, &index_ty)?
    } else {
        let range = super::constant::lower_range(e, len)?;
        lower_broadcast_in_dim(e, range, &TensorType::new([len], DType::I32), &[dimension], &index_ty)?
    };
    let past_end = super::constant::lower_constant(e, len as f64, &index_ty)?;
    let candidate = e.emit(stablehlo::select(ctx, e.tensor_type(&index_ty), hit, index, past_end, loc))?;
    let negated = e.emit(stablehlo::negate(ctx, e.tensor_type(&index_ty), candidate, loc))?;
    let min = lower_reduce_all(e, ReduceKind::Max, &[negated], &[dimension], result)?[0];
    e.emit(stablehlo::negate(ctx, e.tensor_type(result), min, loc))
}
