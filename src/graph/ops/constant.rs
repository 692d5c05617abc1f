//! Ops that make values from nothing: splat `constant`, `iota` and `range`.

use crate::graph::{DType, ShapeError, TensorType};

/// iota_c1: `0 <= iota_dimension < rank(output)`.
pub fn infer_iota(iota_dimension: usize, declared: &TensorType) -> Result<TensorType, ShapeError> {
    if iota_dimension >= declared.rank() {
        return Err(ShapeError::new(
            "iota",
            "C1",
            format!("iota_dimension {iota_dimension} is out of bounds for {declared}"),
        ));
    }
    Ok(declared.clone())
}

/// `range`: a static `tensor<n x i32>`.
pub fn infer_range(declared: &TensorType) -> Result<TensorType, ShapeError> {
    match (declared.dtype, &declared.shape[..]) {
        (DType::I32, [n]) if *n != crate::graph::DYNAMIC => Ok(declared.clone()),
        _ => Err(ShapeError::new("range", "kiln", format!("expects a static tensor<n x i32>, found {declared}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_is_static_i32_of_rank_1() {
        let ty: TensorType = "tensor<8xi32>".parse().unwrap();
        assert_eq!(infer_range(&ty).unwrap(), ty);
        for bad in ["tensor<?xi32>", "tensor<8xf32>", "tensor<2x4xi32>"] {
            assert!(infer_range(&bad.parse().unwrap()).unwrap_err().to_string().contains("static tensor<n x i32>"));
        }
    }

    #[test]
    fn iota_dimension_must_be_in_range() {
        let ty: TensorType = "tensor<2x3xi32>".parse().unwrap();
        assert_eq!(infer_iota(1, &ty).unwrap(), ty);
        assert_eq!(infer_iota(2, &ty).unwrap_err().rule, "C1");
    }
}
