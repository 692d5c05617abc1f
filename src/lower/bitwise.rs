//! Lowers the bit ops: one StableHLO op each.

use super::dialects::stablehlo;
use super::{Emitter, LowerError};
use crate::graph::ops::BitwiseOp;
use melior::ir::{Type, Value};

pub(super) fn lower_bitwise<'c, 'a>(
    e: &Emitter<'c, 'a>,
    op: BitwiseOp,
    lhs: Value<'c, 'a>,
    rhs: Value<'c, 'a>,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    let (ctx, loc) = (e.ctx(), e.loc());
    match op {
        BitwiseOp::And => e.emit(stablehlo::and(ctx, result, lhs, rhs, loc)),
        BitwiseOp::Or => e.emit(stablehlo::or(ctx, result, lhs, rhs, loc)),
        BitwiseOp::Xor => e.emit(stablehlo::xor(ctx, result, lhs, rhs, loc)),
        BitwiseOp::ShiftLeft => e.emit(stablehlo::shift_left(ctx, result, lhs, rhs, loc)),
        BitwiseOp::ShiftRightLogical => e.emit(stablehlo::shift_right_logical(ctx, result, lhs, rhs, loc)),
        BitwiseOp::ShiftRightArithmetic => e.emit(stablehlo::shift_right_arithmetic(ctx, result, lhs, rhs, loc)),
    }
}

pub(super) fn lower_not<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::not(e.ctx(), result, operand, e.loc()))
}

pub(super) fn lower_bitcast_convert<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::bitcast_convert(e.ctx(), result, operand, e.loc()))
}
