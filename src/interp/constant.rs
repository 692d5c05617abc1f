//! Ops that make values from nothing: splat `constant` and `iota`.

use super::{each_dtype, strided_offsets, Buffer, Elem, Num};
use crate::graph::{DType, TensorType};
use half::{bf16, f16};

/// `value` converted to `ty`'s dtype (see `Elem::from_num`), everywhere.
pub(super) fn constant(value: f64, ty: &TensorType) -> Buffer {
    each_dtype!(ty.dtype, T => T::wrap(vec![T::from_num(Num::F(value)); ty.num_elements()]))
}

/// Each element is its index along `iota_dimension`.
pub(super) fn iota(iota_dimension: usize, ty: &TensorType) -> Buffer {
    // Strides that are 1 on the iota dim and 0 elsewhere yield that index.
    let unit: Vec<usize> = (0..ty.rank()).map(|d| usize::from(d == iota_dimension)).collect();
    let index = strided_offsets(&ty.shape, &unit, 0);
    each_dtype!(ty.dtype, T => T::wrap(index.iter().map(|&i| T::from_num(Num::I(i as i64))).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn constant_splats_in_the_dtype() {
        assert_eq!(constant(-2.5, &t("tensor<2x2xf32>")), Buffer::from(vec![-2.5f32; 4]));
        assert_eq!(constant(1e-5, &t("tensor<1xbf16>")), Buffer::from(vec![bf16::from_f64(1e-5)]));
        assert_eq!(constant(-2.5, &t("tensor<2xi32>")), Buffer::from(vec![-2i32; 2]));
        assert_eq!(constant(1e9, &t("tensor<i8>")), Buffer::from(vec![127i8]));
        assert_eq!(constant(f64::NEG_INFINITY, &t("tensor<f16>")), Buffer::from(vec![f16::NEG_INFINITY]));
        assert_eq!(constant(0.5, &t("tensor<i1>")), Buffer::from(vec![true]));
    }

    #[test]
    fn iota_counts_along_its_dimension() {
        assert_eq!(iota(0, &t("tensor<2x3xi32>")), Buffer::from(vec![0i32, 0, 0, 1, 1, 1]));
        assert_eq!(iota(1, &t("tensor<2x3xf32>")), Buffer::from(vec![0.0f32, 1., 2., 0., 1., 2.]));
        assert_eq!(iota(0, &t("tensor<0xi64>")), Buffer::from(Vec::<i64>::new()));
    }
}
