//! Element-wise ops: unary math, binary arithmetic, convert, clamp,
//! compare and select. Shape rules follow StableHLO `docs/spec.md`.
//! (`erf` is CHLO's: StableHLO has none, and iree-compile takes `chlo.erf`.)

use super::{require_dtype, require_float, same_dtype};
use crate::graph::{DType, ShapeError, TensorType};
use std::str::FromStr;

/// An element-wise op of one operand, result of the operand's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// `-x`.
    Negate,
    /// `eˣ`.
    Exponential,
    /// Natural logarithm.
    Log,
    /// `√x`.
    Sqrt,
    /// `1/√x`.
    Rsqrt,
    /// Hyperbolic tangent.
    Tanh,
    /// The sigmoid `1/(1 + e⁻ˣ)`.
    Logistic,
    /// `|x|`.
    Abs,
    /// -1, 0 or 1 by the sign of `x` (NaN stays NaN).
    Sign,
    /// Rounds toward -∞.
    Floor,
    /// Rounds to the nearest integer, ties to even.
    RoundNearestEven,
    /// Cosine.
    Cosine,
    /// Sine.
    Sine,
    /// The error function (`chlo.erf`).
    Erf,
}

impl UnaryOp {
    /// Every op, in graph-text order.
    pub const ALL: [UnaryOp; 14] = [
        UnaryOp::Negate,
        UnaryOp::Exponential,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Logistic,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Floor,
        UnaryOp::RoundNearestEven,
        UnaryOp::Cosine,
        UnaryOp::Sine,
        UnaryOp::Erf,
    ];

    /// The op's name in graph text and StableHLO.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Negate => "negate",
            UnaryOp::Exponential => "exponential",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Floor => "floor",
            UnaryOp::RoundNearestEven => "round_nearest_even",
            UnaryOp::Cosine => "cosine",
            UnaryOp::Sine => "sine",
            UnaryOp::Erf => "erf",
        }
    }
}

/// An element-wise op of two operands of one type, result of that type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `lhs + rhs`.
    Add,
    /// `lhs - rhs`.
    Subtract,
    /// `lhs · rhs`.
    Multiply,
    /// `lhs / rhs` (integers: see the interpreter for `/ 0`).
    Divide,
    /// The larger; NaN propagates.
    Maximum,
    /// The smaller; NaN propagates.
    Minimum,
    /// `lhs` raised to `rhs`.
    Power,
}

impl BinaryOp {
    /// Every op, in graph-text order.
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Subtract,
        BinaryOp::Multiply,
        BinaryOp::Divide,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Power,
    ];

    /// The op's name in graph text and StableHLO.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Subtract => "subtract",
            BinaryOp::Multiply => "multiply",
            BinaryOp::Divide => "divide",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Power => "power",
        }
    }
}

/// How `compare` relates `lhs` to `rhs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComparisonDirection {
    /// `lhs == rhs`.
    Eq,
    /// `lhs != rhs`.
    Ne,
    /// `lhs >= rhs`.
    Ge,
    /// `lhs > rhs`.
    Gt,
    /// `lhs <= rhs`.
    Le,
    /// `lhs < rhs`.
    Lt,
}

impl ComparisonDirection {
    /// Every direction, in `as_str` order.
    pub const ALL: [ComparisonDirection; 6] = [
        ComparisonDirection::Eq,
        ComparisonDirection::Ne,
        ComparisonDirection::Ge,
        ComparisonDirection::Gt,
        ComparisonDirection::Le,
        ComparisonDirection::Lt,
    ];

    /// StableHLO's spelling: `#stablehlo<comparison_direction LT>`.
    pub fn as_str(self) -> &'static str {
        match self {
            ComparisonDirection::Eq => "EQ",
            ComparisonDirection::Ne => "NE",
            ComparisonDirection::Ge => "GE",
            ComparisonDirection::Gt => "GT",
            ComparisonDirection::Le => "LE",
            ComparisonDirection::Lt => "LT",
        }
    }
}

impl FromStr for ComparisonDirection {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| format!("unknown comparison_direction '{s}' (expected EQ, NE, GE, GT, LE or LT)"))
    }
}

/// negate_c1, exponential_c1, ...: result type = operand type. `negate` takes
/// any integer too, `abs` and `sign` signed integers; the rest are defined
/// on floats only.
pub fn infer_unary(op: UnaryOp, operand: &TensorType) -> Result<TensorType, ShapeError> {
    let d = operand.dtype;
    let (ok, what) = match op {
        UnaryOp::Negate => (d != DType::I1, "numeric"),
        UnaryOp::Abs | UnaryOp::Sign => (d.is_float() || d.is_signed_integer(), "a float or signed integer tensor"),
        _ => return require_float(op.name(), operand).map(|()| operand.clone()),
    };
    if !ok {
        return Err(ShapeError::new(op.name(), "C1", format!("operand must be {what}, found {operand}")));
    }
    Ok(operand.clone())
}

/// add_c1 and friends: operands and result have the same type. kiln does
/// not broadcast implicitly; use `broadcast_in_dim`.
pub fn infer_binary(op: &'static str, lhs: &TensorType, rhs: &TensorType) -> Result<TensorType, ShapeError> {
    same_type(op, lhs, rhs)?;
    if lhs.dtype == DType::I1 {
        return Err(ShapeError::new(op, "C1", format!("operands must be numeric, found {lhs}")));
    }
    Ok(lhs.clone())
}

/// The C1 of every binary element-wise op: `lhs` and `rhs` have one type.
pub(crate) fn same_type(op: &'static str, lhs: &TensorType, rhs: &TensorType) -> Result<(), ShapeError> {
    if lhs.shape != rhs.shape {
        return Err(ShapeError::new(
            op,
            "C1",
            format!("operand shapes differ: lhs {lhs} vs rhs {rhs}; broadcast_in_dim one of them first"),
        ));
    }
    same_dtype(op, "C1", lhs, rhs)
}

/// convert_c1: same shape, any element type.
pub fn infer_convert(operand: &TensorType, declared: &TensorType) -> Result<TensorType, ShapeError> {
    if operand.shape != declared.shape {
        return Err(ShapeError::new("convert", "C1", format!("shape changes from {operand} to {declared}")));
    }
    Ok(declared.clone())
}

/// clamp_c1, clamp_c2: min/max are scalars or the operand's shape; all share
/// the element type.
pub fn infer_clamp(min: &TensorType, operand: &TensorType, max: &TensorType) -> Result<TensorType, ShapeError> {
    for (what, bound) in [("min", min), ("max", max)] {
        if bound.rank() != 0 && bound.shape != operand.shape {
            return Err(ShapeError::new(
                "clamp",
                "C1",
                format!("{what} must be a scalar or have the operand's shape: {what} {bound} vs operand {operand}"),
            ));
        }
        same_dtype("clamp", "C2", bound, operand)?;
    }
    Ok(operand.clone())
}

/// compare_c1..c3: operands of one type; result is `i1` of their shape.
pub fn infer_compare(lhs: &TensorType, rhs: &TensorType) -> Result<TensorType, ShapeError> {
    if lhs.shape != rhs.shape {
        return Err(ShapeError::new("compare", "C1", format!("operand shapes differ: lhs {lhs} vs rhs {rhs}")));
    }
    same_dtype("compare", "C3", lhs, rhs)?;
    Ok(lhs.with_dtype(DType::I1))
}

/// select_c1, select_c2: `pred` is i1, scalar or of the branches' shape;
/// both branches have one type.
pub fn infer_select(pred: &TensorType, on_true: &TensorType, on_false: &TensorType) -> Result<TensorType, ShapeError> {
    require_dtype("select", "C1", pred, DType::I1)?;
    if pred.rank() != 0 && pred.shape != on_true.shape {
        return Err(ShapeError::new(
            "select",
            "C1",
            format!("pred must be a scalar or have the branches' shape: pred {pred} vs on_true {on_true}"),
        ));
    }
    if on_true != on_false {
        return Err(ShapeError::new(
            "select",
            "C2",
            format!("branch types differ: on_true {on_true} vs on_false {on_false}"),
        ));
    }
    Ok(on_true.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn binary_rejects_shape_mismatch_naming_both() {
        let err = infer_binary("add", &t("tensor<2x3xf32>"), &t("tensor<3x2xf32>")).unwrap_err();
        assert_eq!(err.rule, "C1");
        assert!(err.message.contains("tensor<2x3xf32>") && err.message.contains("tensor<3x2xf32>"));
    }

    #[test]
    fn unary_math_needs_floats() {
        assert!(infer_unary(UnaryOp::Exponential, &t("tensor<4xi32>")).is_err());
        assert_eq!(infer_unary(UnaryOp::Negate, &t("tensor<4xi32>")).unwrap(), t("tensor<4xi32>"));
        assert_eq!(infer_unary(UnaryOp::Negate, &t("tensor<4xui8>")).unwrap(), t("tensor<4xui8>"));
        for op in [UnaryOp::Floor, UnaryOp::RoundNearestEven, UnaryOp::Cosine, UnaryOp::Sine, UnaryOp::Erf] {
            assert_eq!(infer_unary(op, &t("tensor<2xbf16>")).unwrap(), t("tensor<2xbf16>"));
            assert_eq!(infer_unary(op, &t("tensor<2xi32>")).unwrap_err().rule, "C1", "{op:?}");
        }
    }

    #[test]
    fn abs_and_sign_take_floats_and_signed_integers() {
        for op in [UnaryOp::Abs, UnaryOp::Sign] {
            assert_eq!(infer_unary(op, &t("tensor<3xi8>")).unwrap(), t("tensor<3xi8>"));
            assert_eq!(infer_unary(op, &t("tensor<3xf16>")).unwrap(), t("tensor<3xf16>"));
            let err = infer_unary(op, &t("tensor<3xui8>")).unwrap_err();
            assert_eq!(
                (err.rule, err.message.as_str()),
                ("C1", "operand must be a float or signed integer tensor, found tensor<3xui8>")
            );
            assert!(infer_unary(op, &t("tensor<3xi1>")).is_err());
        }
    }

    #[test]
    fn power_takes_integers_and_floats() {
        let i = t("tensor<2xui16>");
        assert_eq!(infer_binary("power", &i, &i).unwrap(), i);
        assert!(infer_binary("power", &t("tensor<2xi1>"), &t("tensor<2xi1>")).is_err());
        assert!(infer_binary("power", &t("tensor<2xf32>"), &t("tensor<2xi32>")).is_err());
    }

    #[test]
    fn compare_yields_i1_and_select_checks_pred() {
        let c = infer_compare(&t("tensor<2xf32>"), &t("tensor<2xf32>")).unwrap();
        assert_eq!(c, t("tensor<2xi1>"));
        assert!(infer_select(&t("tensor<2xf32>"), &t("tensor<2xf32>"), &t("tensor<2xf32>")).is_err());
        assert_eq!(infer_select(&c, &t("tensor<2xf32>"), &t("tensor<2xf32>")).unwrap(), t("tensor<2xf32>"));
    }

    #[test]
    fn clamp_accepts_scalar_bounds() {
        let x = t("tensor<3xf32>");
        assert_eq!(infer_clamp(&t("tensor<f32>"), &x, &t("tensor<f32>")).unwrap(), x);
        assert!(infer_clamp(&t("tensor<2xf32>"), &x, &t("tensor<f32>")).is_err());
    }
}
