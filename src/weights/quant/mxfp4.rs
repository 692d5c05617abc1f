//! MXFP4 (OCP Microscaling Formats v1.0): blocks of 32 fp4 (e2m1) values
//! under one e8m0 scale, a bare power-of-two exponent. C reference:
//! `ggml-quants.c` `dequantize_row_mxfp4` with `ggml_e8m0_to_fp32_half`
//! (`ggml-impl.h`); gguf-py: `MXFP4` in `quants.py`.

use super::grids::KVALUES_MXFP4;
use super::Fields;

const QK_MXFP4: usize = 32;

/// `ggml_e8m0_to_fp32_half`: half of `2^(e - 127)`, i.e. `2^(e - 128)`,
/// built from its bits (subnormal for `e < 2`). Every byte gives a finite
/// power of two: ggml reads `0xFF`, which the OCP spec makes NaN, as 2^127.
#[inline(always)]
fn e8m0_to_f32_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 { 0x0020_0000 << e } else { u32::from(e - 1) << 23 })
}

/// `block_mxfp4 { e; qs[16] }`: the low nibbles of `qs` are values 0..16,
/// the high ones 16..32, each indexing the doubled e2m1 values
/// `kvalues_mxfp4`; times the halved scale. A power of two times a small
/// integer is exact, so bit-exact with gguf-py and C (overflow aside: `e`
/// above 252 makes the largest values inf in both).
/// Ref: `ggml-quants.c` `dequantize_row_mxfp4`; gguf-py `MXFP4.dequantize_blocks`.
pub(super) fn dequantize_mxfp4(block: &[u8; 1 + QK_MXFP4 / 2], y: &mut [f32; QK_MXFP4]) {
    let mut b = Fields(block);
    let [e] = *b.take();
    let qs: &[u8; QK_MXFP4 / 2] = b.take();
    let d = e8m0_to_f32_half(e);
    let (lo, hi) = y.split_at_mut(QK_MXFP4 / 2);
    for ((&q, lo), hi) in qs.iter().zip(lo).zip(hi) {
        *lo = d * f32::from(KVALUES_MXFP4[usize::from(q & 0x0F)]);
        *hi = d * f32::from(KVALUES_MXFP4[usize::from(q >> 4)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0() {
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(130), 4.0);
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
    }

    #[test]
    fn mxfp4() {
        let mut b = [0u8; 17];
        b[0] = 129; // 2^1
        b[1] = 0xF7; // value 0: e2m1 6.0 (doubled 12); value 16: -6.0 (-12)
        b[16] = 0x89; // value 15: -0.5 (-1); value 31: e2m1 "-0" (0)
        let mut y = [0.0; 32];
        dequantize_mxfp4(&b, &mut y);
        assert_eq!((y[0], y[16], y[15], y[31]), (24.0, -24.0, -2.0, 0.0));
        assert_eq!(y[31].to_bits(), 0, "kvalues_mxfp4 reads -0 as +0");
        assert_eq!(y[1], 0.0);
    }
}
