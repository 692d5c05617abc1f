//! Ops that move elements without computing: transpose, broadcast_in_dim,
//! concatenate, slice (reshape is a copy, in `mod.rs`). Each computes, for
//! every result element, the flat offset it reads, then `take`s; `pad`
//! instead computes where each operand element lands.

use super::{each_buffer, same, strided_offsets, strides, take, Buffer, Elem, Value};
use crate::graph::TensorType;

/// Result dim `i` is operand dim `permutation[i]`.
pub(super) fn transpose(x: &Value, permutation: &[usize]) -> Buffer {
    let s = strides(&x.ty.shape);
    let shape: Vec<usize> = permutation.iter().map(|&p| x.ty.shape[p]).collect();
    let walk: Vec<usize> = permutation.iter().map(|&p| s[p]).collect();
    take(&x.data, &strided_offsets(&shape, &walk, 0))
}

/// `[rows, d...]` as `[tiles, d..., lanes]` (`Op::TileRows`): the last
/// dim reordered, the rows padded with zeros to whole tiles, then each
/// tile's row dim moved last.
pub(super) fn tile_rows(x: &Value, lanes: usize, order: &[usize], out: &TensorType) -> Result<Buffer, String> {
    let (tiles, rest) = (out.shape[0], &x.ty.shape[1..]);
    let (row, last) = (rest.iter().product::<usize>(), rest[rest.len() - 1]);
    let offsets: Vec<usize> = match order {
        [] => (0..x.ty.num_elements()).collect(),
        _ => (0..x.ty.num_elements()).map(|i| i - i % last + order[i % last]).collect(),
    };
    let padded = Value {
        ty: TensorType::new([&[tiles, lanes][..], rest].concat(), x.ty.dtype),
        data: each_buffer!(&take(&x.data, &offsets), v => {
            let mut all = v.to_vec();
            all.resize(tiles * lanes * row, Default::default());
            Ok::<_, String>(Elem::wrap(all))
        })?,
    };
    let permutation: Vec<usize> = [0].into_iter().chain(2..rest.len() + 2).chain([1]).collect();
    Ok(transpose(&padded, &permutation))
}

/// Result index `i` reads operand index `i` with `size - 1 - i[d]` along
/// each of `dims`.
pub(super) fn reverse(x: &Value, dims: &[usize]) -> Buffer {
    let (shape, s) = (&x.ty.shape, strides(&x.ty.shape));
    let offsets = strided_offsets(shape, &s, 0)
        .into_iter()
        .map(|offset| {
            dims.iter().fold(offset, |o, &d| {
                let i = o / s[d] % shape[d];
                o - i * s[d] + (shape[d] - 1 - i) * s[d]
            })
        })
        .collect::<Vec<_>>();
    take(&x.data, &offsets)
}

/// Operand dim `j` maps to result dim `dims[j]`; size-1 operand dims repeat.
pub(super) fn broadcast_in_dim(x: &Value, dims: &[usize], out: &TensorType) -> Buffer {
    let s = strides(&x.ty.shape);
    // Result dims that no operand dim maps to (or that map to size 1) do not move the read.
    let mut walk = vec![0; out.rank()];
    for (j, &d) in dims.iter().enumerate() {
        if x.ty.shape[j] != 1 {
            walk[d] = s[j];
        }
    }
    take(&x.data, &strided_offsets(&out.shape, &walk, 0))
}

/// Row-major concatenation along `dimension`: for each index of the dims
/// before it, one contiguous block of each input in turn.
pub(super) fn concatenate(inputs: &[&Value], dimension: usize) -> Result<Buffer, String> {
    let first = inputs.first().ok_or("needs at least one input")?;
    let outer: usize = first.ty.shape[..dimension].iter().product();
    let joined = join(inputs)?;
    let mut offsets = Vec::with_capacity(joined.len());
    for o in 0..outer {
        let mut base = 0;
        for x in inputs {
            let block = x.ty.num_elements() / outer;
            offsets.extend(base + o * block..base + (o + 1) * block);
            base += x.ty.num_elements();
        }
    }
    Ok(take(&joined, &offsets))
}

/// All inputs' elements back to back, so one flat offset addresses any of them.
fn join(inputs: &[&Value]) -> Result<Buffer, String> {
    let first = &inputs.first().ok_or("needs at least one input")?.data;
    each_buffer!(first, v => {
        let mut all = v.to_vec();
        for x in &inputs[1..] {
            all.extend_from_slice(same(v, &x.data)?);
        }
        Ok(Elem::wrap(all))
    })
}

/// Result index `i` reads operand index `start + i * stride`.
pub(super) fn slice(x: &Value, start_indices: &[usize], steps: &[usize], out: &TensorType) -> Buffer {
    let s = strides(&x.ty.shape);
    let base = start_indices.iter().zip(&s).map(|(a, b)| a * b).sum();
    let walk: Vec<usize> = steps.iter().zip(&s).map(|(a, b)| a * b).collect();
    take(&x.data, &strided_offsets(&out.shape, &walk, base))
}

/// Operand index `j` lands at result index `low + j * (interior + 1)`; every
/// other result element is `padding_value`.
pub(super) fn pad(
    x: &Value,
    padding_value: &Value,
    low: &[usize],
    interior: &[usize],
    out: &TensorType,
) -> Result<Buffer, String> {
    let s = strides(&out.shape);
    let base = low.iter().zip(&s).map(|(a, b)| a * b).sum();
    let walk: Vec<usize> = interior.iter().zip(&s).map(|(i, b)| (i + 1) * b).collect();
    let targets = strided_offsets(&x.ty.shape, &walk, base);
    each_buffer!(&x.data, v => {
        let fill = *same(v, &padding_value.data)?.first().ok_or("padding_value holds no element")?;
        let mut result = vec![fill; out.num_elements()];
        targets.iter().zip(v).for_each(|(&t, &e)| result[t] = e);
        Ok(Elem::wrap(result))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::tests::val;

    fn t(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn transpose_2x3_and_3d() {
        let x = val("tensor<2x3xi32>", vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(transpose(&x, &[1, 0]), Buffer::from(vec![1i32, 4, 2, 5, 3, 6]));
        // [2,1,3] -> perm [2,0,1] -> [3,2,1]: out[k][i][0] = x[i][0][k].
        let y = val("tensor<2x1x3xi32>", vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(transpose(&y, &[2, 0, 1]), Buffer::from(vec![1i32, 4, 2, 5, 3, 6]));
    }

    #[test]
    fn broadcast_rows_columns_and_scalars() {
        let row = val("tensor<3xf32>", vec![1.0f32, 2., 3.]);
        assert_eq!(broadcast_in_dim(&row, &[1], &t("tensor<2x3xf32>")), Buffer::from(vec![1.0f32, 2., 3., 1., 2., 3.]));
        assert_eq!(broadcast_in_dim(&row, &[0], &t("tensor<3x2xf32>")), Buffer::from(vec![1.0f32, 1., 2., 2., 3., 3.]));
        let one = val("tensor<1x2xi8>", vec![7i8, 8]);
        assert_eq!(broadcast_in_dim(&one, &[0, 1], &t("tensor<2x2xi8>")), Buffer::from(vec![7i8, 8, 7, 8]));
        let s = val("tensor<i1>", vec![true]);
        assert_eq!(broadcast_in_dim(&s, &[], &t("tensor<2xi1>")), Buffer::from(vec![true, true]));
    }

    #[test]
    fn concatenate_along_each_dim() {
        let a = val("tensor<2x2xi32>", vec![1, 2, 3, 4]);
        let b = val("tensor<2x1xi32>", vec![5, 6]);
        assert_eq!(concatenate(&[&a, &b], 1).unwrap(), Buffer::from(vec![1i32, 2, 5, 3, 4, 6]));
        let c = val("tensor<1x2xi32>", vec![7, 8]);
        assert_eq!(concatenate(&[&a, &c, &a], 0).unwrap(), Buffer::from(vec![1i32, 2, 3, 4, 7, 8, 1, 2, 3, 4]));
        let empty = val("tensor<2x0xi32>", Vec::<i32>::new());
        assert_eq!(concatenate(&[&empty, &b], 1).unwrap(), b.data);
    }

    #[test]
    fn strided_slice() {
        // 3x4 of 0..12; rows 0..3 step 2, cols 1..4 step 2 -> [[1, 3], [9, 11]].
        let x = val("tensor<3x4xi64>", (0..12).collect::<Vec<i64>>());
        assert_eq!(slice(&x, &[0, 1], &[2, 2], &t("tensor<2x2xi64>")), Buffer::from(vec![1i64, 3, 9, 11]));
        assert_eq!(slice(&x, &[2, 0], &[1, 3], &t("tensor<1x2xi64>")), Buffer::from(vec![8i64, 11]));
    }

    #[test]
    fn pad_edges_and_interior() {
        // The spec's example.
        let x = val("tensor<2x3xi32>", vec![1, 2, 3, 4, 5, 6]);
        let zero = val("tensor<i32>", vec![0]);
        let out = pad(&x, &zero, &[0, 1], &[1, 2], &t("tensor<5x9xi32>")).unwrap();
        #[rustfmt::skip]
        let want = vec![
            0, 1, 0, 0, 2, 0, 0, 3, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 4, 0, 0, 5, 0, 0, 6, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(out, Buffer::from(want));
        let s = val("tensor<f32>", vec![2.5f32]);
        let nine = val("tensor<f32>", vec![9.0f32]);
        assert_eq!(pad(&s, &nine, &[], &[], &t("tensor<f32>")).unwrap(), s.data);
        assert!(pad(&x, &nine, &[0, 0], &[0, 0], &t("tensor<2x3xi32>")).is_err());
    }
}
