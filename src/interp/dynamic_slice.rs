//! Slices at runtime positions. Start indices are clamped so the slice stays
//! inside the operand: `clamp(0, start_indices, shape(operand) - sizes)`.

use super::{each_buffer, layout, same, strided_offsets, strides, Buffer, Elem, Value};
use crate::graph::TensorType;

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
