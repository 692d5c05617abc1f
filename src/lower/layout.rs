//! Lowers reshape, transpose, broadcast_in_dim, concatenate, slice and pad.

use super::dialects::stablehlo;
use super::{Emitter, LowerError};
use melior::ir::attribute::IntegerAttribute;
use melior::ir::r#type::IntegerType;
use melior::ir::{Type, Value};

pub(super) fn lower_reshape<'c, 'a>(e: &Emitter<'c, 'a>, operand: Value<'c, 'a>, result: Type<'c>) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::reshape(e.ctx(), result, operand, e.loc()))
}

pub(super) fn lower_transpose<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    permutation: &[usize],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::transpose(e.ctx(), result, operand, e.i64_array(permutation), e.loc()))
}

pub(super) fn lower_broadcast_in_dim<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    broadcast_dimensions: &[usize],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::broadcast_in_dim(e.ctx(), result, operand, e.i64_array(broadcast_dimensions), e.loc()))
}

pub(super) fn lower_concatenate<'c, 'a>(
    e: &Emitter<'c, 'a>,
    inputs: &[Value<'c, 'a>],
    dimension: usize,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    let dim = IntegerAttribute::new(IntegerType::new(e.ctx(), 64).into(), dimension as i64);
    e.emit(stablehlo::concatenate(e.ctx(), result, inputs, dim.into(), e.loc()))
}

pub(super) fn lower_slice<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    start_indices: &[usize],
    limit_indices: &[usize],
    strides: &[usize],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::slice(
        e.ctx(),
        result,
        operand,
        e.i64_array(start_indices),
        e.i64_array(limit_indices),
        e.i64_array(strides),
        e.loc(),
    ))
}

pub(super) fn lower_pad<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    padding_value: Value<'c, 'a>,
    [low, high, interior]: [&[usize]; 3],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::pad(
        e.ctx(),
        result,
        operand,
        padding_value,
        e.i64_array(low),
        e.i64_array(high),
        e.i64_array(interior),
        e.loc(),
    ))
}
