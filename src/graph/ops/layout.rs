//! Ops that move elements without computing: reshape, transpose,
//! broadcast_in_dim, concatenate, slice, pad.

use super::{check_dims, same_dtype};
use crate::graph::{ShapeError, TensorType, DYNAMIC};

/// reshape_c1 (same element type), reshape_c2 (same element count). With
/// `?` dims both sides need as many `?` and the same static element count,
/// which is the same count for every run-time size.
pub fn infer_reshape(operand: &TensorType, declared: &TensorType) -> Result<TensorType, ShapeError> {
    same_dtype("reshape", "C1", operand, declared)?;
    if operand.dynamic_rank() != declared.dynamic_rank() || operand.dynamic_rank() > 1 {
        return Err(ShapeError::new(
            "reshape",
            "C2",
            format!(
                "{operand} -> {declared}: a reshape keeps its one ? dim, if any (a ? dim cannot be split or merged)"
            ),
        ));
    }
    if operand.static_num_elements() != declared.static_num_elements() {
        return Err(ShapeError::new(
            "reshape",
            "C2",
            format!(
                "element counts differ: operand {operand} has {}, result {declared} has {}",
                operand.static_num_elements().unwrap_or(usize::MAX),
                declared.static_num_elements().unwrap_or(usize::MAX)
            ),
        ));
    }
    Ok(declared.clone())
}

/// transpose_c2 (permutation is a permutation of 0..rank), transpose_c4
/// (result dim `i` = operand dim `permutation[i]`).
pub fn infer_transpose(operand: &TensorType, permutation: &[usize]) -> Result<TensorType, ShapeError> {
    if permutation.len() != operand.rank() {
        return Err(ShapeError::new(
            "transpose",
            "C2",
            format!(
                "permutation {permutation:?} has {} entries for operand {operand} of rank {}",
                permutation.len(),
                operand.rank()
            ),
        ));
    }
    check_dims("transpose", "C2", "permutation", permutation, operand.rank())?;
    let shape = permutation.iter().map(|&p| operand.shape[p]).collect::<Vec<_>>();
    Ok(TensorType::new(shape, operand.dtype))
}

/// `tile_rows`: a static operand of rank 2 or more, `lanes > 0`, and
/// `order` empty or a permutation of the last dim.
pub fn infer_tile_rows(operand: &TensorType, lanes: usize, order: &[usize]) -> Result<TensorType, ShapeError> {
    let op = "tile_rows";
    let Some((&rows, rest)) = operand.shape.split_first().filter(|_| !operand.is_dynamic() && operand.rank() >= 2)
    else {
        return Err(ShapeError::new(
            op,
            "kiln",
            format!("expects a static operand of rank 2 or more, found {operand}"),
        ));
    };
    if lanes == 0 {
        return Err(ShapeError::new(op, "kiln", "lanes must be at least 1"));
    }
    let last = rest[rest.len() - 1];
    let mut sorted = order.to_vec();
    sorted.sort_unstable();
    if !order.is_empty() && !sorted.iter().copied().eq(0..last) {
        return Err(ShapeError::new(op, "kiln", format!("order {order:?} is not a permutation of 0..{last}")));
    }
    let shape = [&[rows.div_ceil(lanes)][..], rest, &[lanes]].concat();
    Ok(TensorType::new(shape, operand.dtype))
}

/// reverse_c2..c3: `dimensions` unique and in range; the type is kept.
pub fn infer_reverse(operand: &TensorType, dimensions: &[usize]) -> Result<TensorType, ShapeError> {
    check_dims("reverse", "C2", "dimensions", dimensions, operand.rank())?;
    Ok(operand.clone())
}

/// broadcast_in_dim_c2..c5: one result dim per operand dim, unique, in range,
/// and each operand dim is 1 or equals the result dim it maps to.
pub fn infer_broadcast_in_dim(
    operand: &TensorType,
    broadcast_dimensions: &[usize],
    declared: &TensorType,
) -> Result<TensorType, ShapeError> {
    same_dtype("broadcast_in_dim", "C1", operand, declared)?;
    if broadcast_dimensions.len() != operand.rank() {
        return Err(ShapeError::new(
            "broadcast_in_dim",
            "C2",
            format!("broadcast_dimensions {broadcast_dimensions:?} must have one entry per operand dim of {operand}"),
        ));
    }
    check_dims("broadcast_in_dim", "C3", "broadcast_dimensions", broadcast_dimensions, declared.rank())?;
    for (i, &d) in broadcast_dimensions.iter().enumerate() {
        let (from, to) = (operand.shape[i], declared.shape[d]);
        if from != 1 && from != to {
            return Err(ShapeError::new(
                "broadcast_in_dim",
                "C5",
                format!("operand dim {i} has size {from}, which cannot broadcast to result dim {d} of size {to} ({operand} -> {declared})"),
            ));
        }
    }
    Ok(declared.clone())
}

/// concatenate_c1..c6: at least one input, same rank and element type, equal
/// sizes except along `dimension`.
pub fn infer_concatenate(inputs: &[&TensorType], dimension: usize) -> Result<TensorType, ShapeError> {
    let first = inputs.first().ok_or_else(|| ShapeError::new("concatenate", "C2", "needs at least one input"))?;
    if dimension >= first.rank() {
        return Err(ShapeError::new(
            "concatenate",
            "C4",
            format!("dimension {dimension} is out of bounds for {first}"),
        ));
    }
    let mut shape = first.shape.clone();
    for (i, t) in inputs.iter().enumerate().skip(1) {
        same_dtype("concatenate", "C1", first, t)?;
        let compatible =
            t.rank() == first.rank() && (0..t.rank()).all(|d| d == dimension || t.shape[d] == first.shape[d]);
        if !compatible {
            return Err(ShapeError::new(
                "concatenate",
                "C3",
                format!("input ({i}) {t} does not match input (0) {first} outside dimension {dimension}"),
            ));
        }
        shape[dimension] = shape[dimension].saturating_add(t.shape[dimension]);
    }
    if inputs.iter().any(|t| t.shape[dimension] == DYNAMIC) {
        return Err(ShapeError::new(
            "concatenate",
            "C6",
            format!("dimension {dimension} is ? in an input: the result would have a new run-time size"),
        ));
    }
    Ok(TensorType::new(shape, first.dtype))
}

/// slice_c2..c4: one start/limit/stride per dim, `0 <= start <= limit <= size`,
/// `stride > 0`; result dim = ceil((limit - start) / stride). A `?` dim is
/// taken whole: start 0, limit `?`, stride 1.
pub fn infer_slice(
    operand: &TensorType,
    start_indices: &[usize],
    limit_indices: &[usize],
    strides: &[usize],
) -> Result<TensorType, ShapeError> {
    let rank = operand.rank();
    if start_indices.len() != rank || limit_indices.len() != rank || strides.len() != rank {
        return Err(ShapeError::new(
            "slice",
            "C2",
            format!("start_indices, limit_indices and strides need {rank} entries each for {operand}"),
        ));
    }
    let mut shape = Vec::with_capacity(rank);
    for d in 0..rank {
        let (start, limit, stride) = (start_indices[d], limit_indices[d], strides[d]);
        if operand.shape[d] == DYNAMIC || limit == DYNAMIC {
            if (start, limit, stride, operand.shape[d]) != (0, DYNAMIC, 1, DYNAMIC) {
                return Err(ShapeError::new(
                    "slice",
                    "C3",
                    format!("dim {d} of {operand}: a ? dim is sliced whole (start 0, limit ?, stride 1)"),
                ));
            }
            shape.push(DYNAMIC);
            continue;
        }
        if !(start <= limit && limit <= operand.shape[d]) {
            return Err(ShapeError::new(
                "slice",
                "C3",
                format!("dim {d}: need 0 <= start {start} <= limit {limit} <= size {}", operand.shape[d]),
            ));
        }
        if stride == 0 {
            return Err(ShapeError::new("slice", "C4", format!("dim {d}: stride must be positive")));
        }
        shape.push((limit - start).div_ceil(stride));
    }
    Ok(TensorType::new(shape, operand.dtype))
}

/// pad_c1..c4: `padding_value` is a scalar of the operand's element type;
/// one low/high/interior amount per dim; result dim =
/// `low + d + max(d - 1, 0) * interior + high`. kiln's padding is
/// non-negative (StableHLO's negative edge padding crops: use `slice`).
pub fn infer_pad(
    operand: &TensorType,
    padding_value: &TensorType,
    edge_padding_low: &[usize],
    edge_padding_high: &[usize],
    interior_padding: &[usize],
) -> Result<TensorType, ShapeError> {
    if padding_value.rank() != 0 {
        return Err(ShapeError::new("pad", "C1", format!("padding_value must be a scalar, found {padding_value}")));
    }
    same_dtype("pad", "C1", operand, padding_value)?;
    let rank = operand.rank();
    if edge_padding_low.len() != rank || edge_padding_high.len() != rank || interior_padding.len() != rank {
        return Err(ShapeError::new(
            "pad",
            "C2",
            format!(
                "edge_padding_low, edge_padding_high and interior_padding need {rank} entries each for {operand}, got {}, {} and {}",
                edge_padding_low.len(),
                edge_padding_high.len(),
                interior_padding.len()
            ),
        ));
    }
    let mut shape = Vec::with_capacity(rank);
    for d in 0..rank {
        let size = operand.shape[d];
        if size == DYNAMIC {
            if (edge_padding_low[d], edge_padding_high[d], interior_padding[d]) != (0, 0, 0) {
                return Err(ShapeError::new(
                    "pad",
                    "C4",
                    format!("dim {d} of {operand} is ?: padding it would make a new run-time size"),
                ));
            }
            shape.push(DYNAMIC);
            continue;
        }
        let padded = size.saturating_sub(1).checked_mul(interior_padding[d]).and_then(|interior| {
            [edge_padding_low[d], edge_padding_high[d], size].into_iter().try_fold(interior, usize::checked_add)
        });
        shape.push(padded.ok_or_else(|| ShapeError::new("pad", "C4", format!("dim {d} of the result overflows")))?);
    }
    Ok(TensorType::new(shape, operand.dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn reshape_keeps_element_count() {
        assert!(infer_reshape(&t("tensor<2x3xf32>"), &t("tensor<6xf32>")).is_ok());
        assert_eq!(infer_reshape(&t("tensor<2x3xf32>"), &t("tensor<7xf32>")).unwrap_err().rule, "C2");
    }

    #[test]
    fn transpose_permutes_dims() {
        assert_eq!(infer_transpose(&t("tensor<2x3x4xf32>"), &[2, 0, 1]).unwrap(), t("tensor<4x2x3xf32>"));
        assert!(infer_transpose(&t("tensor<2x3xf32>"), &[0, 0]).is_err());
    }

    #[test]
    fn broadcast_checks_sizes() {
        assert!(infer_broadcast_in_dim(&t("tensor<3xf32>"), &[1], &t("tensor<2x3xf32>")).is_ok());
        assert!(infer_broadcast_in_dim(&t("tensor<1xf32>"), &[0], &t("tensor<4x3xf32>")).is_ok());
        assert_eq!(infer_broadcast_in_dim(&t("tensor<3xf32>"), &[0], &t("tensor<2x3xf32>")).unwrap_err().rule, "C5");
    }

    #[test]
    fn concatenate_and_slice() {
        let (a, b) = (t("tensor<2x3xf32>"), t("tensor<4x3xf32>"));
        assert_eq!(infer_concatenate(&[&a, &b], 0).unwrap(), t("tensor<6x3xf32>"));
        assert_eq!(infer_concatenate(&[&a, &b], 1).unwrap_err().rule, "C3");
        assert_eq!(infer_slice(&b, &[1, 0], &[4, 3], &[2, 1]).unwrap(), t("tensor<2x3xf32>"));
        assert_eq!(infer_slice(&b, &[0, 0], &[5, 3], &[1, 1]).unwrap_err().rule, "C3");
    }

    #[test]
    fn dynamic_dims_follow_one_run_time_size() {
        let x = t("tensor<1x?x64xf32>");
        assert_eq!(infer_reshape(&x, &t("tensor<?x4x16xf32>")).unwrap(), t("tensor<?x4x16xf32>"));
        assert_eq!(infer_reshape(&x, &t("tensor<?x64xf32>")).unwrap(), t("tensor<?x64xf32>"));
        assert_eq!(infer_reshape(&x, &t("tensor<?x65xf32>")).unwrap_err().rule, "C2");
        assert_eq!(infer_reshape(&x, &t("tensor<64xf32>")).unwrap_err().rule, "C2");
        assert!(infer_concatenate(&[&x, &x], 2).is_ok());
        assert_eq!(infer_concatenate(&[&x, &x], 1).unwrap_err().rule, "C6");
        assert_eq!(infer_slice(&x, &[0, 0, 2], &[1, DYNAMIC, 64], &[1, 1, 2]).unwrap(), t("tensor<1x?x31xf32>"));
        assert_eq!(infer_slice(&x, &[0, 1, 0], &[1, DYNAMIC, 64], &[1, 1, 1]).unwrap_err().rule, "C3");
        assert_eq!(infer_slice(&x, &[0, 0, 0], &[1, 3, 64], &[1, 1, 1]).unwrap_err().rule, "C3");
        let zero = t("tensor<f32>");
        assert_eq!(infer_pad(&x, &zero, &[0, 0, 1], &[0, 0, 0], &[0, 0, 0]).unwrap(), t("tensor<1x?x65xf32>"));
        assert_eq!(infer_pad(&x, &zero, &[0, 1, 0], &[0, 0, 0], &[0, 0, 0]).unwrap_err().rule, "C4");
        assert!(infer_broadcast_in_dim(&t("tensor<?xf32>"), &[1], &t("tensor<2x?xf32>")).is_ok());
        assert_eq!(infer_broadcast_in_dim(&t("tensor<?xf32>"), &[1], &t("tensor<2x3xf32>")).unwrap_err().rule, "C5");
    }

    #[test]
    fn pad_adds_edges_and_interior() {
        // The spec's example: 2x3 with low [0, 1], high [2, 1], interior [1, 2] -> 5x9.
        let (x, zero) = (t("tensor<2x3xi32>"), t("tensor<i32>"));
        assert_eq!(infer_pad(&x, &zero, &[0, 1], &[2, 1], &[1, 2]).unwrap(), t("tensor<5x9xi32>"));
        // Interior padding adds nothing to an empty or size-1 dim.
        let e = t("tensor<0x1xf32>");
        assert_eq!(infer_pad(&e, &t("tensor<f32>"), &[1, 0], &[0, 2], &[3, 3]).unwrap(), t("tensor<1x3xf32>"));
        assert_eq!(infer_pad(&x, &t("tensor<f32>"), &[0, 0], &[0, 0], &[0, 0]).unwrap_err().rule, "C1");
        assert_eq!(infer_pad(&x, &t("tensor<1xi32>"), &[0, 0], &[0, 0], &[0, 0]).unwrap_err().rule, "C1");
        assert_eq!(infer_pad(&x, &zero, &[0], &[0, 0], &[0, 0]).unwrap_err().rule, "C2");
        assert_eq!(infer_pad(&x, &zero, &[usize::MAX, 0], &[1, 0], &[0, 0]).unwrap_err().rule, "C4");
    }
}
