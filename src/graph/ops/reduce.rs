//! Reductions over a set of dimensions (sum, max).

use super::check_dims;
use crate::graph::{DType, ShapeError, TensorType};
use std::str::FromStr;

/// How `reduce` combines elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    /// Addition; its identity is 0.
    Sum,
    /// Maximum; its identity is the dtype's lowest value.
    Max,
}

impl ReduceKind {
    /// The name in graph text: `sum` or `max`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Max => "max",
        }
    }
}

impl FromStr for ReduceKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sum" => Ok(ReduceKind::Sum),
            "max" => Ok(ReduceKind::Max),
            _ => Err(format!("unknown reduce kind '{s}' (expected sum or max)")),
        }
    }
}

/// reduce_c4 (dimensions unique and in range), reduce_c8 (result drops the
/// reduced dimensions).
pub fn infer_reduce(kind: ReduceKind, operand: &TensorType, dimensions: &[usize]) -> Result<TensorType, ShapeError> {
    check_dims("reduce", "C4", "dimensions", dimensions, operand.rank())?;
    if operand.dtype == DType::I1 {
        return Err(ShapeError::new("reduce", "kiln", format!("cannot {} an i1 tensor: {operand}", kind.as_str())));
    }
    let shape = (0..operand.rank()).filter(|d| !dimensions.contains(d)).map(|d| operand.shape[d]).collect::<Vec<_>>();
    Ok(TensorType::new(shape, operand.dtype))
}

/// argmax: `dimension` in range and reduced away, a numeric operand, an
/// i32 result.
pub fn infer_argmax(operand: &TensorType, dimension: usize) -> Result<TensorType, ShapeError> {
    check_dims("argmax", "kiln", "dimension", &[dimension], operand.rank())?;
    if operand.dtype == DType::I1 {
        return Err(ShapeError::new("argmax", "kiln", format!("expects a numeric tensor, found {operand}")));
    }
    let shape = (0..operand.rank()).filter(|&d| d != dimension).map(|d| operand.shape[d]).collect::<Vec<_>>();
    Ok(TensorType::new(shape, DType::I32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_reduced_dims() {
        let x: TensorType = "tensor<2x3x4xf32>".parse().unwrap();
        assert_eq!(infer_reduce(ReduceKind::Sum, &x, &[1]).unwrap().to_string(), "tensor<2x4xf32>");
        assert_eq!(infer_reduce(ReduceKind::Max, &x, &[0, 2]).unwrap().to_string(), "tensor<3xf32>");
        assert_eq!(infer_reduce(ReduceKind::Sum, &x, &[3]).unwrap_err().rule, "C4");
        assert_eq!(infer_reduce(ReduceKind::Sum, &x, &[1, 1]).unwrap_err().rule, "C4");
        assert_eq!(infer_argmax(&x, 2).unwrap().to_string(), "tensor<2x3xi32>");
        assert!(infer_argmax(&x, 3).is_err());
        assert!(infer_argmax(&"tensor<2xi1>".parse().unwrap(), 0).is_err());
    }
}
