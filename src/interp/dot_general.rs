//! `dot_general`: result dims are `batch..., lhs free..., rhs free...`.

use super::{each_buffer, same, strided_offsets, strides, Buffer, Elem, Value};
use crate::graph::{DotDimensions, TensorType};

pub(super) fn dot_general(lhs: &Value, rhs: &Value, dims: &DotDimensions, out: &TensorType) -> Result<Buffer, String> {
    let (ls, rs) = (strides(&lhs.ty.shape), strides(&rhs.ty.shape));
    let (lb, rb) = (&dims.lhs_batching_dimensions, &dims.rhs_batching_dimensions);
    let (lc, rc) = (&dims.lhs_contracting_dimensions, &dims.rhs_contracting_dimensions);
    let free = |rank: usize, b: &[usize], c: &[usize]| -> Vec<usize> {
        (0..rank).filter(|d| !b.contains(d) && !c.contains(d)).collect()
    };
    let (lf, rf) = (free(lhs.ty.rank(), lb, lc), free(rhs.ty.rank(), rb, rc));

    // How far each result dim moves the lhs and rhs reads: batch dims move
    // both, free dims only their own side.
    let mut l_walk: Vec<usize> = lb.iter().map(|&d| ls[d]).collect();
    let mut r_walk: Vec<usize> = rb.iter().map(|&d| rs[d]).collect();
    l_walk.extend(lf.iter().map(|&d| ls[d]).chain(rf.iter().map(|_| 0)));
    r_walk.extend(lf.iter().map(|_| 0).chain(rf.iter().map(|&d| rs[d])));
    let l_base = strided_offsets(&out.shape, &l_walk, 0);
    let r_base = strided_offsets(&out.shape, &r_walk, 0);

    // The contraction, shared by every result element.
    let k_shape: Vec<usize> = lc.iter().map(|&d| lhs.ty.shape[d]).collect();
    let l_k = strided_offsets(&k_shape, &lc.iter().map(|&d| ls[d]).collect::<Vec<_>>(), 0);
    let r_k = strided_offsets(&k_shape, &rc.iter().map(|&d| rs[d]).collect::<Vec<_>>(), 0);

    each_buffer!(&lhs.data, a => {
        let b = same(a, &rhs.data)?;
        Ok(Elem::wrap(contract(a, b, &l_base, &r_base, &l_k, &r_k)))
    })
}

/// `out[i] = Σ_k a[l_base[i] + l_k[k]] * b[r_base[i] + r_k[k]]`, summed in
/// the wide accumulator in row-major `k` order.
fn contract<T: Elem>(a: &[T], b: &[T], l_base: &[usize], r_base: &[usize], l_k: &[usize], r_k: &[usize]) -> Vec<T> {
    l_base
        .iter()
        .zip(r_base)
        .map(|(&lo, &ro)| {
            let acc = l_k
                .iter()
                .zip(r_k)
                .fold(T::Acc::default(), |acc, (&i, &j)| acc + a[lo + i].widen() * b[ro + j].widen());
            T::narrow(acc)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::tests::val;
    use half::bf16;

    fn t(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn matmul_2x3_by_3x2() {
        let a = val("tensor<2x3xf32>", vec![1.0f32, 2., 3., 4., 5., 6.]);
        let b = val("tensor<3x2xf32>", vec![7.0f32, 8., 9., 10., 11., 12.]);
        let r = dot_general(&a, &b, &DotDimensions::contracting(1, 0), &t("tensor<2x2xf32>")).unwrap();
        assert_eq!(r, Buffer::from(vec![58.0f32, 64., 139., 154.]));
        // Against an [out, in] weight: a . a^T.
        let r = dot_general(&a, &a, &DotDimensions::contracting(1, 1), &t("tensor<2x2xf32>")).unwrap();
        assert_eq!(r, Buffer::from(vec![14.0f32, 32., 32., 77.]));
    }

    #[test]
    fn batched_with_free_dims_ordered_batch_lhs_rhs() {
        // lhs [k=2, b=2, m=1], rhs [b=2, n=3, k=2] -> [b, m, n].
        let dims = DotDimensions {
            lhs_batching_dimensions: vec![1],
            rhs_batching_dimensions: vec![0],
            lhs_contracting_dimensions: vec![0],
            rhs_contracting_dimensions: vec![2],
        };
        let a = val("tensor<2x2x1xi32>", vec![1, 10, 2, 20]); // a[k][b]: b0 = [1, 2], b1 = [10, 20]
        let b = val("tensor<2x3x2xi32>", vec![1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1]);
        let r = dot_general(&a, &b, &dims, &t("tensor<2x1x3xi32>")).unwrap();
        assert_eq!(r, Buffer::from(vec![1i32, 2, 3, 10, 20, 30]));
    }

    #[test]
    fn outer_product_and_empty_contraction() {
        let a = val("tensor<2xf32>", vec![1.0f32, 2.]);
        let b = val("tensor<3xf32>", vec![1.0f32, 10., 100.]);
        let r = dot_general(&a, &b, &DotDimensions::default(), &t("tensor<2x3xf32>")).unwrap();
        assert_eq!(r, Buffer::from(vec![1.0f32, 10., 100., 2., 20., 200.]));
        let e = val("tensor<2x0xf32>", Vec::<f32>::new());
        let r = dot_general(&e, &e, &DotDimensions::contracting(1, 1), &t("tensor<2x2xf32>")).unwrap();
        assert_eq!(r, Buffer::from(vec![0.0f32; 4]));
    }

    #[test]
    fn low_precision_accumulates_wide_and_rounds_once() {
        // 256 + 1 + 1 in bf16 step by step stays 256 (8-bit mantissa); summed
        // wide it is 258, which bf16 represents.
        let a = val("tensor<1x3xbf16>", vec![bf16::from_f32(256.0), bf16::ONE, bf16::ONE]);
        let b = val("tensor<3x1xbf16>", vec![bf16::ONE; 3]);
        let r = dot_general(&a, &b, &DotDimensions::contracting(1, 0), &t("tensor<1x1xbf16>")).unwrap();
        assert_eq!(r, Buffer::from(vec![bf16::from_f32(258.0)]));
        let i = val("tensor<2xi8>", vec![100i8, 100]);
        let r = dot_general(&i, &i, &DotDimensions::contracting(0, 0), &t("tensor<i8>")).unwrap();
        assert_eq!(r, Buffer::from(vec![(20000i32 as i8)]));
    }
}
