//! Ops on the bits of integers, for dequantizing packed weights inside the
//! graph: `and`, `or`, `xor`, `not`, the three shifts, and
//! `bitcast_convert`. Shape rules follow StableHLO `docs/spec.md`.

use super::elementwise::same_type;
use crate::graph::{DType, ShapeError, TensorType};

/// A bitwise op of two operands of one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitwiseOp {
    /// Bitwise and (logical and on `i1`).
    And,
    /// Bitwise or (logical or on `i1`).
    Or,
    /// Bitwise xor (logical xor on `i1`).
    Xor,
    /// `lhs << rhs`; 0 once `rhs` reaches the bit width.
    ShiftLeft,
    /// `lhs >> rhs`, filling with zeros.
    ShiftRightLogical,
    /// `lhs >> rhs`, filling with the sign bit.
    ShiftRightArithmetic,
}

impl BitwiseOp {
    /// Every op, in graph-text order.
    pub const ALL: [BitwiseOp; 6] = [
        BitwiseOp::And,
        BitwiseOp::Or,
        BitwiseOp::Xor,
        BitwiseOp::ShiftLeft,
        BitwiseOp::ShiftRightLogical,
        BitwiseOp::ShiftRightArithmetic,
    ];

    /// The op's name in graph text and StableHLO.
    pub fn name(self) -> &'static str {
        match self {
            BitwiseOp::And => "and",
            BitwiseOp::Or => "or",
            BitwiseOp::Xor => "xor",
            BitwiseOp::ShiftLeft => "shift_left",
            BitwiseOp::ShiftRightLogical => "shift_right_logical",
            BitwiseOp::ShiftRightArithmetic => "shift_right_arithmetic",
        }
    }

    /// Whether this is one of the three shifts (integers only).
    pub fn is_shift(self) -> bool {
        matches!(self, BitwiseOp::ShiftLeft | BitwiseOp::ShiftRightLogical | BitwiseOp::ShiftRightArithmetic)
    }
}

/// and_c1, shift_left_c1, ...: `lhs`, `rhs` and the result have one type;
/// `and`/`or`/`xor` take booleans or integers, shifts integers only.
pub fn infer_bitwise(op: BitwiseOp, lhs: &TensorType, rhs: &TensorType) -> Result<TensorType, ShapeError> {
    same_type(op.name(), lhs, rhs)?;
    require_bits(op.name(), lhs, !op.is_shift())?;
    Ok(lhs.clone())
}

/// not_c1: result type = operand type, boolean or integer.
pub fn infer_not(operand: &TensorType) -> Result<TensorType, ShapeError> {
    require_bits("not", operand, true)?;
    Ok(operand.clone())
}

fn require_bits(op: &'static str, t: &TensorType, boolean_ok: bool) -> Result<(), ShapeError> {
    if t.dtype.is_integer() || (boolean_ok && t.dtype == DType::I1) {
        return Ok(());
    }
    let what = if boolean_ok { "a boolean or integer tensor" } else { "an integer tensor" };
    Err(ShapeError::new(op, "C1", format!("operands must be {what}, found {t}")))
}

/// bitcast_convert_c1: the same bits under the declared element type. Same
/// width keeps the shape; a narrower type appends a dim of the width ratio
/// (`tensor<4xf32> -> tensor<4x4xui8>`); a wider type consumes a last dim
/// that equals the ratio (`tensor<Nx2xi8> -> tensor<Nxf16>`). kiln does not
/// bitcast `i1`, whose bits StableHLO leaves to the implementation.
pub fn infer_bitcast_convert(operand: &TensorType, declared: &TensorType) -> Result<TensorType, ShapeError> {
    let (from, to) = (operand.dtype, declared.dtype);
    if from == DType::I1 || to == DType::I1 {
        return Err(ShapeError::new(
            "bitcast_convert",
            "kiln",
            format!("i1 has no bit layout to reinterpret: {operand} -> {declared}"),
        ));
    }
    let expected = bitcast_shape(operand, to).ok_or_else(|| {
        ShapeError::new(
            "bitcast_convert",
            "C1",
            format!(
                "to a {}-bit type from {operand}, the last dim must be {}",
                to.bit_width(),
                to.bit_width() / from.bit_width()
            ),
        )
    })?;
    if declared.shape != expected {
        return Err(ShapeError::new(
            "bitcast_convert",
            "C1",
            format!("the bits of {operand} as {to} are {}, not {declared}", TensorType::new(expected, to)),
        ));
    }
    Ok(declared.clone())
}

/// The shape `operand`'s bits have as `to` elements, if they fit.
pub fn bitcast_shape(operand: &TensorType, to: DType) -> Option<Vec<usize>> {
    let (from_bits, to_bits) = (operand.dtype.bit_width(), to.bit_width());
    let mut shape = operand.shape.clone();
    if to_bits < from_bits {
        shape.push(from_bits / to_bits);
    } else if to_bits > from_bits && shape.pop() != Some(to_bits / from_bits) {
        return None;
    }
    Some(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn logic_takes_booleans_shifts_do_not() {
        let (b, u) = (t("tensor<3xi1>"), t("tensor<3xui8>"));
        assert_eq!(infer_bitwise(BitwiseOp::Xor, &b, &b).unwrap(), b);
        assert_eq!(infer_bitwise(BitwiseOp::ShiftRightLogical, &u, &u).unwrap(), u);
        assert_eq!(infer_not(&b).unwrap(), b);
        let err = infer_bitwise(BitwiseOp::ShiftLeft, &b, &b).unwrap_err();
        assert_eq!(err.to_string(), "shift_left (C1): operands must be an integer tensor, found tensor<3xi1>");
        let f = t("tensor<3xf32>");
        assert_eq!(infer_bitwise(BitwiseOp::And, &f, &f).unwrap_err().rule, "C1");
        assert!(infer_not(&f).is_err());
        assert!(infer_bitwise(BitwiseOp::Or, &u, &t("tensor<3xi8>")).is_err());
        assert!(infer_bitwise(BitwiseOp::Or, &u, &t("tensor<4xui8>")).is_err());
    }

    #[test]
    fn bitcast_reshapes_by_the_width_ratio() {
        let ok = |from: &str, to: &str| infer_bitcast_convert(&t(from), &t(to)).map(|r| r.to_string());
        assert_eq!(ok("tensor<2x3xf32>", "tensor<2x3xi32>").unwrap(), "tensor<2x3xi32>");
        assert_eq!(ok("tensor<2xf32>", "tensor<2x4xui8>").unwrap(), "tensor<2x4xui8>");
        assert_eq!(ok("tensor<5x2xi8>", "tensor<5xf16>").unwrap(), "tensor<5xf16>");
        assert_eq!(ok("tensor<f16>", "tensor<2xui8>").unwrap(), "tensor<2xui8>");
        assert_eq!(ok("tensor<4xui16>", "tensor<f32>").unwrap_err().rule, "C1");
        assert_eq!(ok("tensor<5x3xi8>", "tensor<5xf16>").unwrap_err().rule, "C1");
        assert_eq!(ok("tensor<i8>", "tensor<f16>").unwrap_err().rule, "C1");
        assert_eq!(ok("tensor<2xf32>", "tensor<2x2xui16>").unwrap(), "tensor<2x2xui16>");
        assert_eq!(ok("tensor<2xf32>", "tensor<2x4xui16>").unwrap_err().rule, "C1");
        assert_eq!(ok("tensor<2xf32>", "tensor<2xi16>").unwrap_err().rule, "C1");
        assert_eq!(ok("tensor<8xi1>", "tensor<i8>").unwrap_err().rule, "kiln");
    }
}
