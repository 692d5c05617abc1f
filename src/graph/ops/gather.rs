//! Embedding row lookup, lowered to `stablehlo.gather`.
//!
//! `gather(operand: [V, d1..dn], indices: [i1..ik]) -> [i1..ik, d1..dn]`
//! picks whole rows of `operand`. Indices are clamped into range, as
//! StableHLO's gather does.

use crate::graph::{ShapeError, TensorType};

/// The result type of an embedding lookup: `[indices..., operand dims but the first]`;
/// `operand` needs rank >= 1 and `indices` an integer type.
pub fn infer_gather(operand: &TensorType, indices: &TensorType) -> Result<TensorType, ShapeError> {
    if operand.rank() == 0 {
        return Err(ShapeError::new(
            "gather",
            "kiln",
            format!("operand must have rank >= 1 (rows to pick), found {operand}"),
        ));
    }
    if !indices.dtype.is_integer() {
        return Err(ShapeError::new("gather", "C13", format!("indices must be an integer tensor, found {indices}")));
    }
    let mut shape = indices.shape.clone();
    shape.extend_from_slice(&operand.shape[1..]);
    Ok(TensorType::new(shape, operand.dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_the_index_shape() {
        let table: TensorType = "tensor<10x8xf32>".parse().unwrap();
        let ids: TensorType = "tensor<2x3xi32>".parse().unwrap();
        assert_eq!(infer_gather(&table, &ids).unwrap().to_string(), "tensor<2x3x8xf32>");
        assert!(infer_gather(&table, &"tensor<3xf32>".parse().unwrap()).is_err());
    }
}
