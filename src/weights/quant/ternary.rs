//! Ternary quants (BitNet b1.58 style): every value is `d * t` with `t` in
//! {-1, 0, 1}, under one f16 `d` per 256. C reference: `ggml-quants.c`,
//! `dequantize_row_tq1_0` and `dequantize_row_tq2_0`; gguf-py: `TQ1_0` and
//! `TQ2_0` in `quants.py`. `d * t` is exact (signed zeros included, as
//! numpy's `d * float32(t)` gives them), so bit-exact with both.

use super::Fields;
use crate::weights::ggml::QK_K;

/// Bytes of TQ1_0's five-trit `qs`.
const TQ1_QS: usize = (QK_K - 4 * QK_K / 64) / 5;

/// Trit `n` of a byte holding trits in base 3 scaled to 256ths (`q =
/// ceil(256 * x / 243)` for `x` = the base-3 number): multiplying by `3^n`
/// modulo 256 brings trit `n` to the top, and `(q * 3) >> 8` reads it.
#[inline(always)]
fn trit(q: u8, pow3: u8) -> f32 {
    let q = q.wrapping_mul(pow3);
    f32::from(((u16::from(q) * 3) >> 8) as i8 - 1)
}

/// `block_tq1_0 { qs[48]; qh[4]; d }`: 5 trits per byte of `qs` and 4 per
/// byte of `qh` (whose fifth trit is unused). Value order: trit `n` of
/// `qs[m]` for `m < 32` is value `32n + m`; of `qs[32 + m]`, value
/// `160 + 16n + m`; of `qh[m]`, value `240 + 4n + m`.
/// Ref: `ggml-quants.c` `dequantize_row_tq1_0`; gguf-py `TQ1_0.dequantize_blocks`.
pub(super) fn dequantize_tq1_0(block: &[u8; TQ1_QS + QK_K / 64 + 2], y: &mut [f32; QK_K]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let mut b = Fields(block);
    let qs: &[u8; TQ1_QS] = b.take();
    let qh: &[u8; QK_K / 64] = b.take();
    let d = b.f16();
    // Three runs of bytes: (bytes, trits used per byte).
    let runs: [(&[u8], usize); 3] = [(&qs[..32], 5), (&qs[32..], 5), (qh, 4)];
    let mut out = y.iter_mut();
    for (bytes, trits) in runs {
        for &pow3 in &POW3[..trits] {
            for (&q, y) in bytes.iter().zip(&mut out) {
                *y = d * trit(q, pow3);
            }
        }
    }
}

/// `block_tq2_0 { qs[64]; d }`: 2 bits per value, `t = q - 1`; bits
/// `2l..2l + 2` of `qs[32j + m]` are value `128j + 32l + m`.
/// Ref: `ggml-quants.c` `dequantize_row_tq2_0`; gguf-py `TQ2_0.dequantize_blocks`.
pub(super) fn dequantize_tq2_0(block: &[u8; QK_K / 4 + 2], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let qs: &[u8; QK_K / 4] = b.take();
    let d = b.f16();
    for (qs, y) in qs.as_chunks::<32>().0.iter().zip(y.as_chunks_mut::<128>().0) {
        for (l, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
            for (&q, y) in qs.iter().zip(y) {
                *y = d * f32::from(((q >> (2 * l)) & 3) as i8 - 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF: [u8; 2] = [0x00, 0x38]; // f16 0.5

    /// The byte ggml's quantizer stores for five trits (`t + 1` in 0..3),
    /// most significant first: `ceil(x * 256 / 243)`.
    fn pack(trits: [u8; 5]) -> u8 {
        let x = trits.iter().fold(0u16, |x, &t| 3 * x + u16::from(t));
        (x * 256).div_ceil(243) as u8
    }

    #[test]
    fn tq1_0() {
        let mut b = [0u8; 54];
        b[52..].copy_from_slice(&HALF);
        b[0] = pack([2, 0, 1, 1, 2]); // values 0, 32, 64, 96, 128: 1, -1, 0, 0, 1
        b[32 + 15] = pack([0, 2, 2, 1, 0]); // values 175, 191, 207, 223, 239
        b[48 + 3] = pack([1, 2, 0, 2, 0]); // values 243, 247, 251, 255 (fifth unused)
        let mut y = [0.0; 256];
        dequantize_tq1_0(&b, &mut y);
        assert_eq!([y[0], y[32], y[64], y[96], y[128]], [0.5, -0.5, 0.0, 0.0, 0.5]);
        assert_eq!([y[175], y[191], y[207], y[223], y[239]], [-0.5, 0.5, 0.5, 0.0, -0.5]);
        assert_eq!([y[243], y[247], y[251], y[255]], [0.0, 0.5, -0.5, 0.5]);
        // A zero byte is five trits of 0, i.e. t = -1.
        assert_eq!((y[1], y[240]), (-0.5, -0.5));
    }

    #[test]
    fn tq2_0() {
        let mut b = [0u8; 66];
        let minus_half = [0x00, 0xB8]; // f16 -0.5
        b[64..].copy_from_slice(&minus_half);
        // Values 133, 165, 197, 229: q = 3, 2, 1, 0. q = 3 (t = 2) is not
        // ternary, but ggml and gguf-py read it as 2 all the same.
        b[32 + 5] = 0b00_01_10_11;
        let mut y = [0.0; 256];
        dequantize_tq2_0(&b, &mut y);
        assert_eq!([y[133], y[165], y[197], y[229]], [-1.0, -0.5, 0.0, 0.5]);
        assert_eq!(y[197].to_bits(), (-0.0f32).to_bits(), "d < 0 times t = 0 is -0, as in numpy");
        assert_eq!(y[0], 0.5);
    }
}
