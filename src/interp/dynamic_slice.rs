//! Slices at runtime positions. `dynamic_slice` and `dynamic_update_slice`
//! clamp their start indices so the slice stays inside the operand:
//! `clamp(0, start_indices, shape(operand) - sizes)`; `real_dynamic_slice`
//! takes its bounds as they are and fails on bounds out of range.

use super::{each_buffer, layout, same, strided_offsets, strides, Buffer, Elem, Value};
use crate::graph::{TensorType, DYNAMIC};

pub(super) fn dynamic_slice(x: &Value, start_indices: &[&Value], out: &TensorType) -> Result<Buffer, String> {
    let starts = adjusted_start_indices(start_indices, &x.ty.shape, &out.shape)?;
    Ok(layout::slice(x, &starts, &vec![1; starts.len()], out))
}

pub(super) fn dynamic_update_slice(x: &Value, update: &Value, start_indices: &[&Value]) -> Result<Buffer, String> {
    let starts = adjusted_start_indices(start_indices, &x.ty.shape, &update.ty.shape)?;
    let s = strides(&x.ty.shape);
    let base = starts.iter().zip(&s).map(|(a, b)| a * b).sum();
    let targets = strided_offsets(&update.ty.shape, &s, base);
    let mut out = x.data.clone();
    each_buffer!(&mut out, v => {
        let u = same(v.as_slice(), &update.data)?;
        targets.iter().zip(u).for_each(|(&t, &e)| v[t] = e);
    });
    Ok(out)
}

/// `x[start:limit:strides]` per dim, the bounds read from 1-D integer
/// tensors: the result's shape is `ceil((limit - start) / strides)`, checked
/// against `declared`, whose `?` dims are `dynamic_size` (or, before the
/// function has one, all one size).
pub(super) fn real_dynamic_slice(
    x: &Value,
    [start_indices, limit_indices, strides]: [&Value; 3],
    declared: &TensorType,
    dynamic_size: Option<usize>,
) -> Result<Value, String> {
    let read = |v: &Value| -> Vec<i64> { each_buffer!(&v.data, e => e.iter().map(|i| i.to_num().as_i64()).collect()) };
    let (start, limit, step) = (read(start_indices), read(limit_indices), read(strides));
    let mut shape = Vec::with_capacity(x.ty.rank());
    for (d, &dim) in x.ty.shape.iter().enumerate() {
        let (s, l, k) = (start[d], limit[d], step[d]);
        if !(0 <= s && s <= l && l <= dim as i64) {
            return Err(format!("(C3) dim {d}: need 0 <= start {s} <= limit {l} <= size {dim} of {}", x.ty));
        }
        if k <= 0 {
            return Err(format!("(C4) dim {d}: stride {k} must be positive"));
        }
        shape.push(((l - s) as usize).div_ceil(k as usize));
    }
    let mut size = dynamic_size;
    for (d, (&want, &got)) in declared.shape.iter().zip(&shape).enumerate() {
        let expected = match want {
            DYNAMIC => *size.get_or_insert(got),
            _ => want,
        };
        if got != expected {
            let what = if want == DYNAMIC { "the function's ?" } else { "its static size" };
            return Err(format!("(C5) dim {d} of the result is {got}, but {declared} needs {what}, {expected}"));
        }
    }
    let ty = TensorType::new(shape, x.ty.dtype);
    let (start, step): (Vec<usize>, Vec<usize>) =
        start.iter().zip(&step).map(|(&s, &k)| (s as usize, k as usize)).unzip();
    let data = layout::slice(x, &start, &step, &ty);
    Ok(Value { ty, data })
}

fn adjusted_start_indices(start_indices: &[&Value], shape: &[usize], sizes: &[usize]) -> Result<Vec<usize>, String> {
    let mut starts = Vec::with_capacity(shape.len());
    for ((i, &dim), &size) in start_indices.iter().zip(shape).zip(sizes) {
        let start = each_buffer!(&i.data, v => v.first().map(|e| e.to_num().as_i64()))
            .ok_or_else(|| format!("start index {} holds no element", i.ty))?;
        starts.push(start.clamp(0, dim.saturating_sub(size) as i64) as usize);
    }
    Ok(starts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::tests::val;

    #[test]
    fn starts_clamp_into_range() {
        // The spec's example: starts (-1, 3) on a 4x4 become (0, 2).
        let x = val("tensor<4x4xi32>", vec![0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        let (a, b) = (val("tensor<i64>", vec![-1i64]), val("tensor<i64>", vec![3i64]));
        let out = dynamic_slice(&x, &[&a, &b], &"tensor<2x2xi32>".parse().unwrap()).unwrap();
        assert_eq!(out, Buffer::from(vec![1i32, 1, 1, 1]));
        let r = val("tensor<ui8>", vec![1u8]);
        let out = dynamic_slice(&x, &[&r, &r], &"tensor<3x1xi32>".parse().unwrap()).unwrap();
        assert_eq!(out, Buffer::from(vec![0i32, 0, 0]));
    }

    #[test]
    fn real_dynamic_slice_reads_its_bounds_at_run_time() {
        // Rows 1..3 and every other column from 1 of a 4x4 iota.
        let x = val("tensor<4x4xi32>", (0..16).collect::<Vec<i32>>());
        let v = |s: &[i64]| val("tensor<2xi64>", s.to_vec());
        let (start, limit, strides) = (v(&[1, 1]), v(&[3, 4]), v(&[1, 2]));
        let ty: TensorType = "tensor<?x2xi32>".parse().unwrap();
        let out = real_dynamic_slice(&x, [&start, &limit, &strides], &ty, None).unwrap();
        assert_eq!((out.ty.to_string().as_str(), out.data), ("tensor<2x2xi32>", Buffer::from(vec![5i32, 7, 9, 11])));
        // An empty slice is a slice.
        let rows: TensorType = "tensor<?x4xi32>".parse().unwrap();
        let out = real_dynamic_slice(&x, [&v(&[2, 0]), &v(&[2, 4]), &v(&[1, 1])], &rows, None).unwrap();
        assert_eq!(out.ty.to_string(), "tensor<0x4xi32>");
        let err = |b: [&Value; 3], ty: &str, size: Option<usize>| {
            real_dynamic_slice(&x, b, &ty.parse().unwrap(), size).unwrap_err()
        };
        assert!(err([&v(&[3, 0]), &v(&[2, 4]), &v(&[1, 1])], "tensor<?x4xi32>", None).starts_with("(C3) dim 0"));
        assert!(err([&v(&[0, -1]), &v(&[2, 4]), &v(&[1, 1])], "tensor<2x?xi32>", None).starts_with("(C3) dim 1"));
        assert!(err([&v(&[0, 0]), &v(&[5, 4]), &v(&[1, 1])], "tensor<?x4xi32>", None).starts_with("(C3) dim 0"));
        assert!(err([&v(&[0, 0]), &v(&[2, 4]), &v(&[1, 0])], "tensor<?x4xi32>", None).starts_with("(C4) dim 1"));
        // `?` is one size: the function's, or the first `?` dim's.
        assert!(err([&v(&[0, 0]), &v(&[2, 4]), &v(&[1, 1])], "tensor<?x4xi32>", Some(3)).starts_with("(C5) dim 0"));
        assert!(err([&v(&[0, 0]), &v(&[2, 4]), &v(&[1, 1])], "tensor<?x?xi32>", None).starts_with("(C5) dim 1"));
        assert!(err([&v(&[0, 0]), &v(&[2, 4]), &v(&[1, 1])], "tensor<2x3xi32>", None).starts_with("(C5) dim 1"));
    }

    #[test]
    fn update_writes_at_the_clamped_start() {
        let cache = val("tensor<4x2xf32>", vec![0.0f32; 8]);
        let row = val("tensor<1x2xf32>", vec![1.0f32, 2.0]);
        let (pos, zero) = (val("tensor<i32>", vec![2]), val("tensor<i32>", vec![0]));
        let out = dynamic_update_slice(&cache, &row, &[&pos, &zero]).unwrap();
        assert_eq!(out, Buffer::from(vec![0.0f32, 0., 0., 0., 1., 2., 0., 0.]));
        let far = val("tensor<i32>", vec![9]);
        let out = dynamic_update_slice(&cache, &row, &[&far, &far]).unwrap();
        assert_eq!(out, Buffer::from(vec![0.0f32, 0., 0., 0., 0., 0., 1., 2.]));
        let wrong = val("tensor<1x2xf16>", vec![half::f16::ONE; 2]);
        assert!(dynamic_update_slice(&cache, &wrong, &[&pos, &zero]).is_err());
    }
}
