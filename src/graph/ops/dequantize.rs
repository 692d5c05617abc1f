//! ggml block dequantization: kiln's one composite op.
//!
//! `dequantize(raw: tensor<NBYTES x i8|ui8>) -> tensor<shape x f32>` reads
//! `raw` as the blocks of a ggml-quantized tensor of `shape` (row-major, as
//! GGUF stores it). It stays one node so that a model's hundreds of packed
//! weights, which come in a handful of (type, shape) pairs, share one
//! decomposition each: the lowering calls a private function built from
//! [`crate::trace::dequant::decompose`], and the interpreter runs the CPU
//! dequantizer it is bit-exact with.

use crate::graph::{DType, ShapeError, TensorType, DYNAMIC};
use crate::weights::ggml::GgmlType;

const OP: &str = "dequantize";

/// The ggml types `dequantize` takes.
pub const SUPPORTED: [GgmlType; 13] = {
    use GgmlType as T;
    [
        T::Q8_0,
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q5_1,
        T::Q2_K,
        T::Q3_K,
        T::Q4_K,
        T::Q5_K,
        T::Q6_K,
        T::IQ4_NL,
        T::IQ4_XS,
        T::MXFP4,
    ]
};

/// Whether `dequantize` handles `ty`.
pub fn supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// `declared` (f32) if `raw` (`i8`/`ui8`) holds exactly the bytes of a
/// `ggml` tensor of `declared`'s shape: either `raw` is static 1-D and
/// `declared` static, or `raw` is `[lead..., row_bytes]` (rows of whole
/// blocks, e.g. gathered from a packed table; one lead dim may be `?`) and
/// `declared` is `[lead..., row...]`, `row` static dims holding one raw
/// row's values (`[row_values]`, or `[blocks, block_dims...]`).
pub fn infer_dequantize(ggml: GgmlType, raw: &TensorType, declared: &TensorType) -> Result<TensorType, ShapeError> {
    let fail = |message: String| Err(ShapeError::new(OP, "kiln", message));
    if !supported(ggml) {
        let names: Vec<&str> = SUPPORTED.iter().map(|t| t.name()).collect();
        return fail(format!("ggml type {ggml} is not supported in graphs (supported: {})", names.join(" ")));
    }
    if !matches!(raw.dtype, DType::I8 | DType::UI8) || raw.rank() == 0 {
        return fail(format!("{ggml}: expects raw block bytes as a static 1-D i8 or ui8 tensor, found {raw}"));
    }
    if raw.rank() > 1 {
        let (rank, last) = (raw.rank(), raw.shape[raw.rank() - 1]);
        let row = declared.shape.get(rank - 1..).unwrap_or_default();
        let rows_fit = declared.dtype == DType::F32
            && declared.rank() >= rank
            && declared.shape[..rank - 1] == raw.shape[..rank - 1]
            && last != crate::graph::DYNAMIC
            && !row.contains(&crate::graph::DYNAMIC)
            && ggml.byte_len(row.iter().product::<usize>() as u64) == Some(last as u64);
        if !rows_fit {
            return fail(format!(
                "{ggml}: rows of raw bytes {raw} need an f32 result with the same leading dims and then static \
                 dims of whole {}-value blocks filling {last} bytes, found {declared}",
                ggml.block_size()
            ));
        }
        return Ok(declared.clone());
    }
    if raw.is_dynamic() {
        return fail(format!("{ggml}: expects raw block bytes as a static 1-D i8 or ui8 tensor, found {raw}"));
    }
    if declared.dtype != DType::F32 || declared.is_dynamic() {
        return fail(format!("{ggml}: the result is a static f32 tensor, found {declared}"));
    }
    let shape = &declared.shape;
    let n = declared.num_elements() as u64;
    let Some(len) = ggml.byte_len(n) else {
        return fail(format!(
            "{ggml}: shape {shape:?} ({n} elements) is not a whole number of {}-value blocks",
            ggml.block_size()
        ));
    };
    if raw.shape[0] as u64 != len {
        return fail(format!("{ggml}: shape {shape:?} needs {len} bytes, found {raw}"));
    }
    Ok(declared.clone())
}

/// The order of a block's bytes in `packed_matvec`'s operands (the last dim
/// of [`super::Op::TileRows`], empty where ggml's own): the order in which
/// its decoding reads them, so that a product streams each row's blocks
/// front to back. Q6_K's reads its 16 scales and `d` first, then its bits
/// in four runs of `qh`, `ql` low and `ql` high 16 bytes each, where ggml
/// keeps all of `ql`, then `qh`, then the scales: in ggml's order a decode
/// step's Q6_K products streamed at half the rate (8192 x 2048 matrices,
/// 12.5 against 6.9 GB/s). Q2_K and Q3_K read their scales and `d` first.
pub fn packed_byte_order(ggml: GgmlType) -> Vec<usize> {
    match ggml {
        GgmlType::Q6_K => {
            let mut order: Vec<usize> = (208..210).chain(192..208).collect();
            for (n, s) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let run = |at: usize| at..at + 16;
                order.extend(run(128 + 32 * n + 16 * s).chain(run(64 * n + 16 * s)).chain(run(64 * n + 32 + 16 * s)));
            }
            order
        }
        GgmlType::Q2_K => (80..84).chain(0..80).collect(),
        GgmlType::Q3_K => (96..110).chain(0..96).collect(),
        _ => Vec::new(),
    }
}

/// Where each of ggml's `size` block bytes lies in a `packed_matvec`
/// operand's block: the inverse of [`packed_byte_order`].
pub fn packed_byte_positions(ggml: GgmlType, size: usize) -> Vec<usize> {
    let mut position: Vec<usize> = (0..size).collect();
    packed_byte_order(ggml).iter().enumerate().for_each(|(j, &o)| position[o] = j);
    position
}

/// `[n · c, tiles · lanes]` f32 for `n` matrices `raws`, each tiled blocks
/// `[tiles, blocks, type_size, lanes]` `i8`/`ui8` of one shape, and `x` `[c,
/// blocks * block_size]` f32 (static `c`): row `i · c + j` is matrix `i`
/// times row `j` of `x`.
pub fn infer_packed_matvec(ggml: GgmlType, raws: &[&TensorType], x: &TensorType) -> Result<TensorType, ShapeError> {
    const OP: &str = "packed_matvec";
    if !supported(ggml) {
        let names: Vec<&str> = SUPPORTED.iter().map(|t| t.name()).collect();
        return Err(ShapeError::new(
            OP,
            "kiln",
            format!("ggml type {ggml} is not supported (supported: {})", names.join(" ")),
        ));
    }
    let raw = raws[0];
    if let Some(other) = raws.iter().find(|r| **r != raw) {
        return Err(ShapeError::new(
            OP,
            "kiln",
            format!("{ggml}: the matrices share one type, found {raw} and {other}"),
        ));
    }
    let (tiles, blocks, lanes) = match raw.shape[..] {
        [tiles, blocks, size, lanes]
            if matches!(raw.dtype, DType::I8 | DType::UI8)
                && !raw.is_dynamic()
                && tiles > 0
                && lanes > 0
                && size == ggml.type_size() =>
        {
            (tiles, blocks, lanes)
        }
        _ => {
            return Err(ShapeError::new(
                OP,
                "kiln",
                format!(
                    "{ggml}: expects blocks tiled by rows (tile_rows) as static i8 or ui8 [tiles, blocks, {}, lanes], found {raw}",
                    ggml.type_size()
                ),
            ))
        }
    };
    // With one block the reduction dim is a unit dim, which IREE 3.13 folds:
    // the product became an elementwise dispatch taking x's producer in,
    // with an operand offset per push constant, over the runtime's limit.
    if blocks < 2 {
        return Err(ShapeError::new(
            OP,
            "kiln",
            format!("{ggml}: rows of {blocks} block(s) in {raw}; it takes 2 or more"),
        ));
    }
    let k = blocks * ggml.block_size();
    match x.shape[..] {
        [columns, width] if x.dtype == DType::F32 && columns != DYNAMIC && columns > 0 && width == k => {
            Ok(TensorType::new([raws.len() * columns, tiles * lanes], DType::F32))
        }
        _ => Err(ShapeError::new(OP, "kiln", format!("{ggml}: {raw} needs x as tensor<Nx{k}xf32>, found {x}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(s: &str) -> TensorType {
        s.parse().unwrap()
    }

    #[test]
    fn byte_count_type_and_dtypes_are_checked() {
        let out = infer_dequantize(GgmlType::Q4_0, &ty("tensor<36xi8>"), &ty("tensor<2x32xf32>")).unwrap();
        assert_eq!(out.to_string(), "tensor<2x32xf32>");
        assert!(infer_dequantize(GgmlType::Q4_0, &ty("tensor<36xui8>"), &ty("tensor<64xf32>")).is_ok());
        let err = |g, raw: &str, out: &str| infer_dequantize(g, &ty(raw), &ty(out)).unwrap_err().to_string();
        assert!(err(GgmlType::Q4_0, "tensor<36xi8>", "tensor<3x32xf32>").contains("needs 54 bytes"));
        assert!(err(GgmlType::Q4_0, "tensor<36xi8>", "tensor<2x31xf32>").contains("whole number of 32-value blocks"));
        let unsupported = err(GgmlType::Q8_1, "tensor<36xi8>", "tensor<32xf32>");
        assert!(unsupported.contains("ggml type Q8_1 is not supported in graphs (supported: Q8_0 "), "{unsupported}");
        assert!(unsupported.ends_with(" IQ4_NL IQ4_XS MXFP4)"), "{unsupported}");
        assert!(err(GgmlType::Q4_0, "tensor<36xf32>", "tensor<2x32xf32>").contains("1-D i8 or ui8"));
        assert!(err(GgmlType::Q4_0, "tensor<36xi8>", "tensor<2x32xf16>").contains("static f32"));
        assert!(!supported(GgmlType::F16) && !supported(GgmlType::Q8_K));
    }

    #[test]
    fn rows_of_blocks_keep_their_leading_dims() {
        let ok = |raw: &str, out: &str| infer_dequantize(GgmlType::Q4_0, &ty(raw), &ty(out));
        assert_eq!(ok("tensor<?x36xi8>", "tensor<?x64xf32>").unwrap().to_string(), "tensor<?x64xf32>");
        assert!(ok("tensor<3x2x18xui8>", "tensor<3x2x32xf32>").is_ok());
        assert!(ok("tensor<3x36xi8>", "tensor<3x2x2x16xf32>").is_ok());
        let err = |raw: &str, out: &str| ok(raw, out).unwrap_err().to_string();
        assert!(err("tensor<?x36xi8>", "tensor<?x32xf32>").contains("filling 36 bytes"));
        assert!(err("tensor<?x36xi8>", "tensor<4x64xf32>").contains("same leading dims"));
        assert!(err("tensor<?x36xi8>", "tensor<?x64xf16>").contains("f32 result"));
    }
}
