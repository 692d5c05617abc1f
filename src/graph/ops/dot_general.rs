//! `dot_general`: contraction with batching dims. Result dims are
//! `batch..., lhs free..., rhs free...` in operand order (spec C12).

use super::{check_dims, same_dtype};
use crate::graph::{ShapeError, TensorType};

/// `dot_general`'s dimension numbers, as in StableHLO.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DotDimensions {
    /// Batch dims of `lhs`, paired in order with `rhs_batching_dimensions`.
    pub lhs_batching_dimensions: Vec<usize>,
    /// Batch dims of `rhs`.
    pub rhs_batching_dimensions: Vec<usize>,
    /// Dims of `lhs` summed over, paired in order with `rhs_contracting_dimensions`.
    pub lhs_contracting_dimensions: Vec<usize>,
    /// Dims of `rhs` summed over.
    pub rhs_contracting_dimensions: Vec<usize>,
}

impl DotDimensions {
    /// `[m, k] x [k, n]`-style contraction of `lhs_dim` with `rhs_dim`, no batch.
    pub fn contracting(lhs_dim: usize, rhs_dim: usize) -> Self {
        DotDimensions {
            lhs_contracting_dimensions: vec![lhs_dim],
            rhs_contracting_dimensions: vec![rhs_dim],
            ..Default::default()
        }
    }
}

/// The result type of `dot_general(lhs, rhs)`: checks constraints C1–C12
/// (matching batch and contracting sizes, one dtype).
pub fn infer_dot_general(lhs: &TensorType, rhs: &TensorType, dims: &DotDimensions) -> Result<TensorType, ShapeError> {
    let op = "dot_general";
    let (lb, rb) = (&dims.lhs_batching_dimensions, &dims.rhs_batching_dimensions);
    let (lc, rc) = (&dims.lhs_contracting_dimensions, &dims.rhs_contracting_dimensions);
    // dot_general_c1, c2
    if lb.len() != rb.len() {
        return Err(ShapeError::new(op, "C1", format!("batching dims differ in count: lhs {lb:?}, rhs {rb:?}")));
    }
    if lc.len() != rc.len() {
        return Err(ShapeError::new(op, "C2", format!("contracting dims differ in count: lhs {lc:?}, rhs {rc:?}")));
    }
    // dot_general_c3..c8: unique and in range, batching and contracting disjoint.
    let lhs_all: Vec<usize> = lb.iter().chain(lc).copied().collect();
    let rhs_all: Vec<usize> = rb.iter().chain(rc).copied().collect();
    check_dims(op, "C3", "lhs batching+contracting dimensions", &lhs_all, lhs.rank())?;
    check_dims(op, "C4", "rhs batching+contracting dimensions", &rhs_all, rhs.rank())?;
    // dot_general_c9, c10
    for (&l, &r) in lb.iter().zip(rb) {
        if lhs.shape[l] != rhs.shape[r] {
            return Err(ShapeError::new(
                op,
                "C9",
                format!("batching sizes differ: lhs[{l}]={}, rhs[{r}]={} ({lhs} x {rhs})", lhs.shape[l], rhs.shape[r]),
            ));
        }
    }
    for (&l, &r) in lc.iter().zip(rc) {
        if lhs.shape[l] != rhs.shape[r] {
            return Err(ShapeError::new(
                op,
                "C10",
                format!(
                    "contracting sizes differ: lhs[{l}]={}, rhs[{r}]={} ({lhs} x {rhs})",
                    lhs.shape[l], rhs.shape[r]
                ),
            ));
        }
    }
    same_dtype(op, "C11", lhs, rhs)?;
    // dot_general_c12: batch dims, then lhs free dims, then rhs free dims.
    let mut shape: Vec<usize> = lb.iter().map(|&d| lhs.shape[d]).collect();
    shape.extend((0..lhs.rank()).filter(|d| !lhs_all.contains(d)).map(|d| lhs.shape[d]));
    shape.extend((0..rhs.rank()).filter(|d| !rhs_all.contains(d)).map(|d| rhs.shape[d]));
    Ok(TensorType::new(shape, lhs.dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn linear_against_out_in_weight() {
        // x[2,4] . w[8,4]^T without a transpose: contract lhs 1 with rhs 1.
        let r = infer_dot_general(&t("tensor<2x4xf32>"), &t("tensor<8x4xf32>"), &DotDimensions::contracting(1, 1));
        assert_eq!(r.unwrap(), t("tensor<2x8xf32>"));
    }

    #[test]
    fn batched_matmul() {
        let dims = DotDimensions {
            lhs_batching_dimensions: vec![0],
            rhs_batching_dimensions: vec![0],
            lhs_contracting_dimensions: vec![2],
            rhs_contracting_dimensions: vec![1],
        };
        let r = infer_dot_general(&t("tensor<3x2x4xf32>"), &t("tensor<3x4x5xf32>"), &dims).unwrap();
        assert_eq!(r, t("tensor<3x2x5xf32>"));
    }

    #[test]
    fn contracting_mismatch_names_both_sizes() {
        let e = infer_dot_general(&t("tensor<2x4xf32>"), &t("tensor<3x5xf32>"), &DotDimensions::contracting(1, 0))
            .unwrap_err();
        assert_eq!(e.rule, "C10");
        assert!(e.to_string().contains("lhs[1]=4, rhs[0]=3"), "{e}");
    }
}
