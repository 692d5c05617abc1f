//! `dequantize`: the CPU dequantizer, which the graph decomposition in
//! [`crate::trace::dequant`] is bit-exact with (tested there).

use super::{Buffer, Value};
use crate::graph::ops::dequantize::{packed_byte_order, packed_byte_positions};
use crate::graph::TensorType;
use crate::weights::ggml::GgmlType;
use crate::weights::quant;

pub(super) fn dequantize(ggml: GgmlType, raw: &Value) -> Result<Buffer, String> {
    let unsigned: Vec<u8>;
    let bytes: &[u8] = match &raw.data {
        Buffer::UI8(bytes) => bytes,
        // The bit pattern is the block data; the sign is the graph's view.
        Buffer::I8(values) => {
            unsigned = values.iter().map(|&b| b as u8).collect();
            &unsigned
        }
        _ => return Err(format!("expects i8 or ui8 block bytes, found {}", raw.ty)),
    };
    quant::dequantize_to_vec(ggml, bytes).map(Buffer::F32).map_err(|e| e.to_string())
}

/// `x · wᵀ` for each `w` the dequantized rows of one of `matrices`, one
/// after another, each for every row of `x` in turn, summed in f64 like
/// `dot_general`.
pub(super) fn packed_matvec(ggml: GgmlType, matrices: &[&Value], x: &Value) -> Result<Buffer, String> {
    let Buffer::F32(xs) = &x.data else { return Err(format!("expects f32 x, found {}", x.ty)) };
    let width = x.ty.shape.last().copied().unwrap_or(1);
    let mut y = Vec::new();
    for tiled in matrices {
        // Back to whole rows of blocks: [tiles, blocks, size, lanes] -> [tiles, lanes, blocks, size].
        let [tiles, blocks, size, lanes] = tiled.ty.shape[..] else {
            return Err(format!("expects blocks tiled by rows, found {}", tiled.ty));
        };
        let ty = TensorType::new([tiles, lanes, blocks, size], tiled.ty.dtype);
        let rows = Value { ty: ty.clone(), data: super::layout::transpose(tiled, &[0, 3, 1, 2]) };
        // Each block's bytes back in ggml's order.
        let raw = match packed_byte_order(ggml).is_empty() {
            true => rows,
            false => {
                let position = packed_byte_positions(ggml, size);
                let offsets: Vec<usize> = (0..ty.num_elements()).map(|i| i - i % size + position[i % size]).collect();
                Value { ty, data: super::take(&rows.data, &offsets) }
            }
        };
        let Buffer::F32(w) = dequantize(ggml, &raw)? else { unreachable!("dequantize yields f32") };
        for x in xs.chunks(width) {
            let dot = |row: &[f32]| row.iter().zip(x).map(|(&w, &x)| w as f64 * x as f64).sum::<f64>() as f32;
            y.extend(w.chunks(width).map(dot));
        }
    }
    Ok(Buffer::F32(y))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::tests::val;

    #[test]
    fn signed_and_unsigned_bytes_read_alike() {
        // One Q8_0 block: d = 0.5 (f16 0x3800), then 32 int8 quants.
        let mut block = vec![0x00u8, 0x38];
        block.extend((0..32).map(|i: i8| (i - 16) as u8));
        let want: Vec<f32> = (0..32).map(|i| (i - 16) as f32 * 0.5).collect();
        let unsigned = val("tensor<34xui8>", block.clone());
        let signed = val("tensor<34xi8>", block.iter().map(|&b| b as i8).collect::<Vec<i8>>());
        assert_eq!(dequantize(GgmlType::Q8_0, &unsigned).unwrap(), Buffer::from(want.clone()));
        assert_eq!(dequantize(GgmlType::Q8_0, &signed).unwrap(), Buffer::from(want));
        assert!(dequantize(GgmlType::Q8_0, &val("tensor<34xi32>", vec![0i32; 34])).is_err());
    }
}
