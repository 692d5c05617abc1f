//! Ops that make values from nothing: splat `constant` and `iota`.

use crate::graph::{ShapeError, TensorType};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iota_dimension_must_be_in_range() {
        let ty: TensorType = "tensor<2x3xi32>".parse().unwrap();
        assert_eq!(infer_iota(1, &ty).unwrap(), ty);
        assert_eq!(infer_iota(2, &ty).unwrap_err().rule, "C1");
    }
}
