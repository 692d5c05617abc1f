//! Embedding row lookup: `operand [V, d...]`, `indices [i...]` -> `[i..., d...]`.

use super::{each_buffer, take, Buffer, Elem, Num, Value};

pub(super) fn gather(operand: &Value, indices: &Value) -> Result<Buffer, String> {
    if !indices.ty.dtype.is_integer() {
        return Err(format!("indices must be integers, found {}", indices.ty));
    }
    let rows = operand.ty.shape[0];
    let row: usize = operand.ty.shape[1..].iter().product();
    let ids: Vec<i64> = each_buffer!(&indices.data, v => v.iter().map(|x| match x.to_num() {
        Num::I(i) => i,
        Num::F(f) => f as i64,
    }).collect());
    if rows == 0 && !ids.is_empty() {
        return Err(format!("cannot pick rows from the empty table {}", operand.ty));
    }
    let mut offsets = Vec::with_capacity(ids.len() * row);
    for id in ids {
        // StableHLO gather clamps start indices so the row stays in bounds.
        let r = id.clamp(0, rows as i64 - 1) as usize;
        offsets.extend(r * row..(r + 1) * row);
    }
    Ok(take(&operand.data, &offsets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::tests::val;

    #[test]
    fn picks_rows_and_clamps_out_of_range() {
        let table = val("tensor<3x2xf32>", vec![0.0f32, 1., 10., 11., 20., 21.]);
        let ids = val("tensor<2x2xi64>", vec![2i64, 0, -5, 99]);
        let r = gather(&table, &ids).unwrap();
        assert_eq!(r, Buffer::from(vec![20.0f32, 21., 0., 1., 0., 1., 20., 21.]));
        let one = gather(&table, &val("tensor<i8>", vec![1i8])).unwrap();
        assert_eq!(one, Buffer::from(vec![10.0f32, 11.]));
    }

    #[test]
    fn rank_one_table_and_empty_cases() {
        let table = val("tensor<3xi32>", vec![5, 6, 7]);
        assert_eq!(gather(&table, &val("tensor<2xi32>", vec![2, 3])).unwrap(), Buffer::from(vec![7i32, 7]));
        let none = val("tensor<0x2xf32>", Vec::<f32>::new());
        assert!(gather(&none, &val("tensor<1xi32>", vec![0])).is_err());
        assert!(gather(&none, &val("tensor<0xi32>", Vec::<i32>::new())).unwrap().is_empty());
    }
}
