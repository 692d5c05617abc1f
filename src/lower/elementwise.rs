//! Lowers element-wise ops: one StableHLO op each (`erf` is CHLO's).

use super::dialects::{chlo, stablehlo};
use super::{Emitter, LowerError};
use crate::graph::ops::{BinaryOp, ComparisonDirection, UnaryOp};
use melior::ir::{Type, Value};

pub(super) fn lower_unary<'c, 'a>(
    e: &Emitter<'c, 'a>,
    op: UnaryOp,
    operand: Value<'c, 'a>,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    let (ctx, loc) = (e.ctx(), e.loc());
    match op {
        UnaryOp::Negate => e.emit(stablehlo::negate(ctx, result, operand, loc)),
        UnaryOp::Exponential => e.emit(stablehlo::exponential(ctx, result, operand, loc)),
        UnaryOp::Log => e.emit(stablehlo::log(ctx, result, operand, loc)),
        UnaryOp::Sqrt => e.emit(stablehlo::sqrt(ctx, result, operand, loc)),
        UnaryOp::Rsqrt => e.emit(stablehlo::rsqrt(ctx, result, operand, loc)),
        UnaryOp::Tanh => e.emit(stablehlo::tanh(ctx, result, operand, loc)),
        UnaryOp::Logistic => e.emit(stablehlo::logistic(ctx, result, operand, loc)),
        UnaryOp::Abs => e.emit(stablehlo::abs(ctx, result, operand, loc)),
        UnaryOp::Sign => e.emit(stablehlo::sign(ctx, result, operand, loc)),
        UnaryOp::Floor => e.emit(stablehlo::floor(ctx, result, operand, loc)),
        UnaryOp::RoundNearestEven => e.emit(stablehlo::round_nearest_even(ctx, result, operand, loc)),
        UnaryOp::Cosine => e.emit(stablehlo::cosine(ctx, result, operand, loc)),
        UnaryOp::Sine => e.emit(stablehlo::sine(ctx, result, operand, loc)),
        UnaryOp::Erf => e.emit(chlo::erf(ctx, result, operand, loc)),
    }
}

pub(super) fn lower_binary<'c, 'a>(
    e: &Emitter<'c, 'a>,
    op: BinaryOp,
    lhs: Value<'c, 'a>,
    rhs: Value<'c, 'a>,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    let (ctx, loc) = (e.ctx(), e.loc());
    match op {
        BinaryOp::Add => e.emit(stablehlo::add(ctx, result, lhs, rhs, loc)),
        BinaryOp::Subtract => e.emit(stablehlo::subtract(ctx, result, lhs, rhs, loc)),
        BinaryOp::Multiply => e.emit(stablehlo::multiply(ctx, result, lhs, rhs, loc)),
        BinaryOp::Divide => e.emit(stablehlo::divide(ctx, result, lhs, rhs, loc)),
        BinaryOp::Maximum => e.emit(stablehlo::maximum(ctx, result, lhs, rhs, loc)),
        BinaryOp::Minimum => e.emit(stablehlo::minimum(ctx, result, lhs, rhs, loc)),
        BinaryOp::Power => e.emit(stablehlo::power(ctx, result, lhs, rhs, loc)),
    }
}

pub(super) fn lower_convert<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::convert(e.ctx(), result, operand, e.loc()))
}

/// Operands are `[min, operand, max]`.
pub(super) fn lower_clamp<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operands: &[Value<'c, 'a>],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::clamp(e.ctx(), result, operands[0], operands[1], operands[2], e.loc()))
}

pub(super) fn lower_compare<'c, 'a>(
    e: &Emitter<'c, 'a>,
    direction: ComparisonDirection,
    lhs: Value<'c, 'a>,
    rhs: Value<'c, 'a>,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    let attr = e.parse_attribute(&format!("#stablehlo<comparison_direction {}>", direction.as_str()))?;
    e.emit(stablehlo::compare(e.ctx(), result, lhs, rhs, attr, e.loc()))
}

/// Operands are `[pred, on_true, on_false]`.
pub(super) fn lower_select<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operands: &[Value<'c, 'a>],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::select(e.ctx(), result, operands[0], operands[1], operands[2], e.loc()))
}
