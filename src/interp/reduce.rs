//! Reductions over a set of dimensions: sum (init 0) and max (init -inf /
//! MIN), folded in row-major order of the operand.

use super::{each_buffer, strided_offsets, strides, Buffer, Elem, Value};
use crate::graph::{ReduceKind, TensorType};

pub(super) fn reduce(kind: ReduceKind, x: &Value, dimensions: &[usize], out: &TensorType) -> Buffer {
    // Each operand element folds into the result element of its kept dims:
    // kept dims walk the result's strides, reduced dims stand still.
    let os = strides(&out.shape);
    let mut kept = os.iter();
    let walk: Vec<usize> = (0..x.ty.rank())
        .map(|d| if dimensions.contains(&d) { 0 } else { *kept.next().expect("result keeps every other dim") })
        .collect();
    let target = strided_offsets(&x.ty.shape, &walk, 0);
    let n = out.num_elements();
    each_buffer!(&x.data, v => match kind {
        ReduceKind::Sum => sum(v, &target, n),
        ReduceKind::Max => max(v, &target, n),
    })
}

/// The first index of the maximum along `dimension` (a NaN is the maximum),
/// from the values as f64: exact but for i64 beyond 2^53.
pub(super) fn argmax(x: &Value, dimension: usize, out: &TensorType) -> Buffer {
    let values = x.to_f64_vec();
    let len = x.ty.shape[dimension];
    let inner: usize = x.ty.shape[dimension + 1..].iter().product();
    let mut best = vec![(f64::NEG_INFINITY, -1i32); out.num_elements()];
    for (i, &v) in values.iter().enumerate() {
        let (outer, at, rest) = (i / (len * inner), (i / inner) % len, i % inner);
        let slot = &mut best[outer * inner + rest];
        let wins = slot.1 < 0 || (!slot.0.is_nan() && (v.is_nan() || v > slot.0));
        if wins {
            *slot = (v, at as i32);
        }
    }
    // An empty dim gives the lowering's sentinel past every index, 0.
    Buffer::from(best.into_iter().map(|(_, i)| i.max(0)).collect::<Vec<i32>>())
}

/// Summed in the wide accumulator, rounded once per result element.
fn sum<T: Elem>(v: &[T], target: &[usize], n: usize) -> Buffer {
    let mut acc = vec![T::Acc::default(); n];
    for (&x, &t) in v.iter().zip(target) {
        acc[t] = acc[t] + x.widen();
    }
    T::wrap(acc.into_iter().map(T::narrow).collect())
}

fn max<T: Elem>(v: &[T], target: &[usize], n: usize) -> Buffer {
    let mut acc = vec![T::LOWEST; n];
    for (&x, &t) in v.iter().zip(target) {
        acc[t] = acc[t].elem_max(x);
    }
    T::wrap(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::tests::val;
    use half::f16;

    fn t(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn sum_over_rows_columns_and_all() {
        let x = val("tensor<2x3xf32>", vec![1.0f32, 2., 3., 4., 5., 6.]);
        assert_eq!(reduce(ReduceKind::Sum, &x, &[0], &t("tensor<3xf32>")), Buffer::from(vec![5.0f32, 7., 9.]));
        assert_eq!(reduce(ReduceKind::Sum, &x, &[1], &t("tensor<2xf32>")), Buffer::from(vec![6.0f32, 15.]));
        assert_eq!(reduce(ReduceKind::Sum, &x, &[0, 1], &t("tensor<f32>")), Buffer::from(vec![21.0f32]));
        assert_eq!(reduce(ReduceKind::Sum, &x, &[], &t("tensor<2x3xf32>")), x.data);
    }

    #[test]
    fn max_with_negatives_nan_and_empty() {
        let x = val("tensor<2x2x2xi32>", vec![-5, -3, -8, -1, 4, -9, -2, 0]);
        // Over dims 0 and 2: for d1 = 0: max(-5, -3, 4, -9) = 4; d1 = 1: max(-8, -1, -2, 0) = 0.
        assert_eq!(reduce(ReduceKind::Max, &x, &[0, 2], &t("tensor<2xi32>")), Buffer::from(vec![4i32, 0]));
        let f = val("tensor<2x2xf16>", [-3.0f32, -2., f32::NAN, 1.].map(f16::from_f32).to_vec());
        let Buffer::F16(m) = reduce(ReduceKind::Max, &f, &[1], &t("tensor<2xf16>")) else { panic!() };
        assert!(m[0] == f16::from_f32(-2.0) && m[1].is_nan());
        let e = val("tensor<2x0xf32>", Vec::<f32>::new());
        assert_eq!(reduce(ReduceKind::Max, &e, &[1], &t("tensor<2xf32>")), Buffer::from(vec![f32::NEG_INFINITY; 2]));
        let e = val("tensor<0xi8>", Vec::<i8>::new());
        assert_eq!(reduce(ReduceKind::Max, &e, &[0], &t("tensor<i8>")), Buffer::from(vec![i8::MIN]));
    }

    #[test]
    fn integer_sum_wraps() {
        let x = val("tensor<3xi8>", vec![100i8, 100, 100]);
        assert_eq!(reduce(ReduceKind::Sum, &x, &[0], &t("tensor<i8>")), Buffer::from(vec![44i8]));
    }
}
