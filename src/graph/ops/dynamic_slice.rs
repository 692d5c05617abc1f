//! Slices at positions computed in the graph: `dynamic_slice` reads one,
//! `dynamic_update_slice` writes one (a KV cache at the decode position),
//! `real_dynamic_slice` reads one whose size is computed too (the filled
//! part of a KV cache).
//!
//! For the first two, start indices are scalar integer values, one per
//! operand dim. At run time they are clamped so the slice stays in bounds:
//! `adjusted_start_indices = clamp(0, start_indices, shape(operand) - sizes)`.

use super::same_dtype;
use crate::graph::{ShapeError, TensorType, DYNAMIC};

/// dynamic_slice_c1..c5: one scalar integer start index per dim, all of one
/// type; `0 <= slice_sizes[k] <= dim(operand, k)`; result shape = slice_sizes.
pub fn infer_dynamic_slice(
    operand: &TensorType,
    start_indices: &[&TensorType],
    slice_sizes: &[usize],
) -> Result<TensorType, ShapeError> {
    let op = "dynamic_slice";
    let rank = operand.rank();
    if start_indices.len() != rank || slice_sizes.len() != rank {
        return Err(ShapeError::new(
            op,
            "C2",
            format!(
                "{operand} needs {rank} start indices and slice sizes, got {} and {}",
                start_indices.len(),
                slice_sizes.len()
            ),
        ));
    }
    check_start_indices(op, "C3", start_indices)?;
    for (k, (&size, &dim)) in slice_sizes.iter().zip(&operand.shape).enumerate() {
        if size == DYNAMIC {
            return Err(ShapeError::new(op, "C4", format!("slice_sizes[{k}] must be static, found ?")));
        }
        // A `?` operand dim is checked when the function runs: the start is
        // clamped, and a slice larger than the dim is an error there.
        if size > dim {
            return Err(ShapeError::new(op, "C4", format!("slice_sizes[{k}] = {size} exceeds dim {k} of {operand}")));
        }
    }
    Ok(TensorType::new(slice_sizes, operand.dtype))
}

/// dynamic_update_slice_c1..c6: `update` has the operand's element type and
/// rank and fits inside it; one scalar integer start index per dim, all of
/// one type; the result has the operand's type.
pub fn infer_dynamic_update_slice(
    operand: &TensorType,
    update: &TensorType,
    start_indices: &[&TensorType],
) -> Result<TensorType, ShapeError> {
    let op = "dynamic_update_slice";
    same_dtype(op, "C2", operand, update)?;
    if update.rank() != operand.rank() {
        return Err(ShapeError::new(op, "C3", format!("update {update} and operand {operand} differ in rank")));
    }
    if start_indices.len() != operand.rank() {
        return Err(ShapeError::new(
            op,
            "C4",
            format!("{operand} needs {} start indices, got {}", operand.rank(), start_indices.len()),
        ));
    }
    check_start_indices(op, "C5", start_indices)?;
    // An update dim of `?` into a static dim (a prompt into a KV cache) is
    // checked when the function runs.
    if let Some(k) = (0..operand.rank()).find(|&k| update.shape[k] != DYNAMIC && update.shape[k] > operand.shape[k]) {
        return Err(ShapeError::new(op, "C6", format!("update {update} is larger than operand {operand} in dim {k}")));
    }
    Ok(operand.clone())
}

/// `real_dynamic_slice(operand, start_indices, limit_indices, strides)`:
/// `slice` with its bounds given at run time as 1-D integer tensors, to the
/// declared `result` type. StableHLO has not specified the op yet
/// (openxla/stablehlo#8); its ODS describes it as `slice` with dynamic
/// bounds, so the checks carry `slice`'s constraint numbers:
/// - C1: the element type is kept;
/// - C2: `start_indices`, `limit_indices` and `strides` are 1-D integer
///   tensors of one type (ODS `AllTypesMatch`) with one entry per operand dim;
/// - C5: the result has the operand's rank, and no static dim of it is
///   larger than the operand's (`ceil((limit - start) / stride) <= dim`).
///
/// C3 (`0 <= start <= limit <= shape(operand)`), C4 (`strides > 0`) and C5
/// on the values are checked when the function runs. A `?` result dim is
/// the function's one run-time size; this op can be what gives it a value
/// (see [`crate::graph::Graph::add_node`]).
pub fn infer_real_dynamic_slice(
    operand: &TensorType,
    [start_indices, limit_indices, strides]: [&TensorType; 3],
    result: &TensorType,
) -> Result<TensorType, ShapeError> {
    let op = "real_dynamic_slice";
    same_dtype(op, "C1", operand, result)?;
    let rank = operand.rank();
    for (name, t) in [("start_indices", start_indices), ("limit_indices", limit_indices), ("strides", strides)] {
        if t.rank() != 1 || t.shape[0] != rank || !t.dtype.is_integer() {
            return Err(ShapeError::new(
                op,
                "C2",
                format!("{name} must be a 1-D integer tensor of {rank} entries, one per dim of {operand}, found {t}"),
            ));
        }
        same_dtype(op, "C2", start_indices, t)?;
    }
    if result.rank() != rank {
        return Err(ShapeError::new(op, "C5", format!("result {result} must have the rank of operand {operand}")));
    }
    let larger = (0..rank).find(|&k| {
        let (size, dim) = (result.shape[k], operand.shape[k]);
        size != DYNAMIC && dim != DYNAMIC && size > dim
    });
    if let Some(k) = larger {
        return Err(ShapeError::new(
            op,
            "C5",
            format!("result {result} is larger than operand {operand} in dim {k}: a slice cannot grow"),
        ));
    }
    Ok(result.clone())
}

/// Each start index is a 0-d integer tensor, and all share one type.
fn check_start_indices(op: &'static str, rule: &'static str, start_indices: &[&TensorType]) -> Result<(), ShapeError> {
    for (i, t) in start_indices.iter().enumerate() {
        if t.rank() != 0 || !t.dtype.is_integer() {
            return Err(ShapeError::new(
                op,
                rule,
                format!("start index {i} must be a scalar integer like tensor<i32>, found {t}"),
            ));
        }
        same_dtype(op, rule, start_indices[0], t)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn dynamic_slice_takes_its_shape_from_slice_sizes() {
        let (x, i) = (t("tensor<8x2x4xf16>"), t("tensor<i32>"));
        assert_eq!(infer_dynamic_slice(&x, &[&i, &i, &i], &[3, 2, 0]).unwrap(), t("tensor<3x2x0xf16>"));
        assert_eq!(infer_dynamic_slice(&x, &[&i, &i], &[3, 2, 1]).unwrap_err().rule, "C2");
        assert_eq!(infer_dynamic_slice(&x, &[&i, &i, &i], &[3, 2]).unwrap_err().rule, "C2");
        let err = infer_dynamic_slice(&x, &[&i, &i, &i], &[9, 2, 4]).unwrap_err();
        assert_eq!(err.to_string(), "dynamic_slice (C4): slice_sizes[0] = 9 exceeds dim 0 of tensor<8x2x4xf16>");
        let mixed = infer_dynamic_slice(&x, &[&i, &t("tensor<i64>"), &i], &[1, 1, 1]).unwrap_err();
        assert_eq!(mixed.rule, "C3");
        assert_eq!(infer_dynamic_slice(&x, &[&i, &t("tensor<1xi32>"), &i], &[1, 1, 1]).unwrap_err().rule, "C3");
        assert_eq!(infer_dynamic_slice(&x, &[&i, &t("tensor<f32>"), &i], &[1, 1, 1]).unwrap_err().rule, "C3");
        let s = t("tensor<f32>");
        assert_eq!(infer_dynamic_slice(&s, &[], &[]).unwrap(), s);
    }

    #[test]
    fn real_dynamic_slice_takes_the_declared_type() {
        let (cache, i) = (t("tensor<2x3x8x4xf32>"), t("tensor<4xi32>"));
        let filled = t("tensor<1x3x?x4xf32>");
        assert_eq!(infer_real_dynamic_slice(&cache, [&i, &i, &i], &filled).unwrap(), filled);
        let all = t("tensor<?x?x?x?xf32>");
        assert_eq!(infer_real_dynamic_slice(&cache, [&i, &i, &i], &all).unwrap(), all);
        let dynamic = t("tensor<?x4xf32>");
        let two = t("tensor<2xi64>");
        assert!(infer_real_dynamic_slice(&dynamic, [&two, &two, &two], &t("tensor<9x2xf32>")).is_ok());

        let err =
            |result: &str, index: [&TensorType; 3]| infer_real_dynamic_slice(&cache, index, &t(result)).unwrap_err();
        assert_eq!(err("tensor<1x3x?x4xf16>", [&i, &i, &i]).rule, "C1");
        assert_eq!(err("tensor<1x3x?x4xf32>", [&i, &t("tensor<3xi32>"), &i]).rule, "C2");
        assert_eq!(err("tensor<1x3x?x4xf32>", [&i, &i, &t("tensor<4xi64>")]).rule, "C2");
        assert_eq!(
            err("tensor<1x3x?x4xf32>", [&t("tensor<4xf32>"), &t("tensor<4xf32>"), &t("tensor<4xf32>")]).rule,
            "C2"
        );
        assert_eq!(err("tensor<1x3x?x4xf32>", [&t("tensor<1x4xi32>"); 3]).rule, "C2");
        assert_eq!(err("tensor<3x?x4xf32>", [&i, &i, &i]).rule, "C5");
        let grown = err("tensor<1x3x9x4xf32>", [&i, &i, &i]);
        assert_eq!(
            grown.to_string(),
            "real_dynamic_slice (C5): result tensor<1x3x9x4xf32> is larger than operand tensor<2x3x8x4xf32> in dim 2: a slice cannot grow"
        );
    }

    #[test]
    fn dynamic_update_slice_keeps_the_operand_type() {
        let (cache, row, i) = (t("tensor<8x4xf32>"), t("tensor<1x4xf32>"), t("tensor<ui32>"));
        assert_eq!(infer_dynamic_update_slice(&cache, &row, &[&i, &i]).unwrap(), cache);
        assert_eq!(infer_dynamic_update_slice(&cache, &t("tensor<1x4xf16>"), &[&i, &i]).unwrap_err().rule, "C2");
        assert_eq!(infer_dynamic_update_slice(&cache, &t("tensor<4xf32>"), &[&i, &i]).unwrap_err().rule, "C3");
        assert_eq!(infer_dynamic_update_slice(&cache, &row, &[&i]).unwrap_err().rule, "C4");
        assert_eq!(infer_dynamic_update_slice(&cache, &row, &[&i, &t("tensor<i32>")]).unwrap_err().rule, "C5");
        assert_eq!(infer_dynamic_update_slice(&cache, &t("tensor<1x5xf32>"), &[&i, &i]).unwrap_err().rule, "C6");
    }
}
