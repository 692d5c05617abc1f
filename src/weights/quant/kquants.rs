//! K-quants: 256-value super-blocks of 16 or 32-value sub-blocks, each with
//! its own 4-, 6- or 8-bit scale (and min) under the f16 `d` (and `dmin`).
//! C reference: `ggml-quants.c`, `dequantize_row_q2_K` ... `_q8_K`;
//! gguf-py: the `Q2_K` ... `Q6_K` classes in `quants.py`.
//!
//! Each function computes a sub-block's scale first (`dl = d * sc`,
//! `ml = dmin * m`, exact) and then `dl * q - ml`, gguf-py's order and C's;
//! only the final subtraction rounds.

use super::Fields;
use crate::weights::ggml::QK_K;

/// Bytes of Q4_K/Q5_K's packed 6-bit scales and mins.
const K_SCALE_SIZE: usize = 12;

/// `block_q2_K { scales[16]; qs[64]; d; dmin }`: 16 sub-blocks of 16, each
/// with a 4-bit scale (low nibble) and min (high nibble). Value `i` is bits
/// `2s..2s+2` of `qs[32h + l]` for `i = 128h + 32s + l`.
/// `d * sc * q - dmin * m`, bit-exact with gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_q2_K`; gguf-py `Q2_K.dequantize_blocks`.
pub(super) fn dequantize_q2_k(block: &[u8; QK_K / 16 + QK_K / 4 + 2 + 2], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let scales: &[u8; QK_K / 16] = b.take();
    let qs: &[u8; QK_K / 4] = b.take();
    let d = b.f16();
    let dmin = b.f16();
    for (j, (y, &sc)) in y.as_chunks_mut::<16>().0.iter_mut().zip(scales).enumerate() {
        let dl = d * f32::from(sc & 0x0F);
        let ml = dmin * f32::from(sc >> 4);
        let (shift, q) = (2 * (j % 8 / 2), &qs[32 * (j / 8) + 16 * (j % 2)..][..16]);
        for (y, &q) in y.iter_mut().zip(q) {
            *y = dl * f32::from((q >> shift) & 3) - ml;
        }
    }
}

/// `block_q3_K { hmask[32]; qs[64]; scales[12]; d }`: 16 sub-blocks of 16
/// with 6-bit signed scales. The low two bits of each quant are laid out as
/// in Q2_K; bit `i / 32` of `hmask[i % 32]` clear means subtract 4.
/// `d * (sc - 32) * q`, exact, so bit-exact with gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_q3_K`; gguf-py `Q3_K.dequantize_blocks`.
pub(super) fn dequantize_q3_k(block: &[u8; QK_K / 8 + QK_K / 4 + 12 + 2], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let hmask: &[u8; QK_K / 8] = b.take();
    let qs: &[u8; QK_K / 4] = b.take();
    let scales: &[u8; 12] = b.take();
    let d = b.f16();
    for (j, y) in y.as_chunks_mut::<16>().0.iter_mut().enumerate() {
        // Scale j: low nibble from byte j % 8 (high nibble for j >= 8), top
        // two bits from byte 8 + j % 4 at bit 2 * (j / 4).
        let lo = (scales[j % 8] >> (4 * (j / 8))) & 0x0F;
        let hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        let dl = d * f32::from((lo | (hi << 4)) as i8 - 32);
        let l0 = 16 * (j % 2);
        let (shift, q) = (2 * (j % 8 / 2), &qs[32 * (j / 8) + l0..][..16]);
        let hm = &hmask[l0..][..16];
        for ((y, &q), &hm) in y.iter_mut().zip(q).zip(hm) {
            let q = ((q >> shift) & 3) as i8 - if (hm >> (j / 2)) & 1 == 0 { 4 } else { 0 };
            *y = dl * f32::from(q);
        }
    }
}

/// `get_scale_min_k4`: eight 6-bit scales and mins. Bytes 0..4 hold scales
/// 0..4 and bytes 4..8 mins 0..4 in their low six bits; scales and mins 4..8
/// take their low nibbles from bytes 8..12 and their top bits from the top
/// two bits of bytes 0..8.
fn scale_min_k4(scales: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0; 8], [0; 8]);
    for j in 0..4 {
        sc[j] = scales[j] & 0x3F;
        m[j] = scales[j + 4] & 0x3F;
        sc[j + 4] = (scales[j + 8] & 0x0F) | ((scales[j] >> 6) << 4);
        m[j + 4] = (scales[j + 8] >> 4) | ((scales[j + 4] >> 6) << 4);
    }
    (sc, m)
}

/// `block_q4_K { d; dmin; scales[12]; qs[128] }`: 8 sub-blocks of 32;
/// sub-blocks `2c` and `2c + 1` are the low and high nibbles of
/// `qs[32c..32c + 32]`. `d * sc * q - dmin * m`, bit-exact with gguf-py
/// and C.
/// Ref: `ggml-quants.c` `dequantize_row_q4_K`; gguf-py `Q4_K.dequantize_blocks`.
pub(super) fn dequantize_q4_k(block: &[u8; 2 + 2 + K_SCALE_SIZE + QK_K / 2], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = b.f16();
    let dmin = b.f16();
    let (sc, m) = scale_min_k4(b.take());
    let qs: &[u8; QK_K / 2] = b.take();
    for (j, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
        let dl = d * f32::from(sc[j]);
        let ml = dmin * f32::from(m[j]);
        let (shift, q) = (4 * (j % 2), &qs[32 * (j / 2)..][..32]);
        for (y, &q) in y.iter_mut().zip(q) {
            *y = dl * f32::from((q >> shift) & 0x0F) - ml;
        }
    }
}

/// `block_q5_K { d; dmin; scales[12]; qh[32]; qs[128] }`: Q4_K plus a fifth
/// bit, bit `j` of `qh[l]` for value `l` of sub-block `j`. Bit-exact with
/// gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_q5_K`; gguf-py `Q5_K.dequantize_blocks`.
pub(super) fn dequantize_q5_k(block: &[u8; 2 + 2 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = b.f16();
    let dmin = b.f16();
    let (sc, m) = scale_min_k4(b.take());
    let qh: &[u8; QK_K / 8] = b.take();
    let qs: &[u8; QK_K / 2] = b.take();
    for (j, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
        let dl = d * f32::from(sc[j]);
        let ml = dmin * f32::from(m[j]);
        let (shift, ql) = (4 * (j % 2), &qs[32 * (j / 2)..][..32]);
        for ((y, &ql), &qh) in y.iter_mut().zip(ql).zip(qh) {
            let q = ((ql >> shift) & 0x0F) | (((qh >> j) & 1) << 4);
            *y = dl * f32::from(q) - ml;
        }
    }
}

/// `block_q6_K { ql[128]; qh[64]; scales[16] (int8); d }`: 16 sub-blocks of
/// 16. Value `i = 128h + r` takes its low nibble from `ql[64h + r % 64]`
/// (high nibble when `r >= 64`) and its top two bits from bits
/// `2(r / 32)..` of `qh[32h + r % 32]`. `d * sc * (q - 32)`, as
/// gguf-py's `(d * scales) * q` and C's `d * sc[is] * q`; bit-exact.
/// Ref: `ggml-quants.c` `dequantize_row_q6_K`; gguf-py `Q6_K.dequantize_blocks`.
pub(super) fn dequantize_q6_k(block: &[u8; QK_K / 2 + QK_K / 4 + QK_K / 16 + 2], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let ql: &[u8; QK_K / 2] = b.take();
    let qh: &[u8; QK_K / 4] = b.take();
    let scales: &[u8; QK_K / 16] = b.take();
    let d = b.f16();
    for (j, (y, &sc)) in y.as_chunks_mut::<16>().0.iter_mut().zip(scales).enumerate() {
        let dl = d * f32::from(sc as i8);
        let (h, r) = (j / 8, 16 * (j % 8));
        let (l_shift, ql) = (4 * (r / 64), &ql[64 * h + r % 64..][..16]);
        let (h_shift, qh) = (2 * (r / 32), &qh[32 * h + r % 32..][..16]);
        for ((y, &ql), &qh) in y.iter_mut().zip(ql).zip(qh) {
            let q = (((ql >> l_shift) & 0x0F) | (((qh >> h_shift) & 3) << 4)) as i8 - 32;
            *y = dl * f32::from(q);
        }
    }
}

/// `block_q8_K { float d; int8 qs[256]; int16 bsums[16] }`, the dot-product
/// intermediate; `bsums` (sums of 16 quants) serve dot products only.
/// gguf-py cannot dequantize Q8_K: this is C's `dequantize_row_q8_K`,
/// `d * qs`, one rounding.
/// Ref: `ggml-quants.c` `dequantize_row_q8_K`; none in gguf-py.
pub(super) fn dequantize_q8_k(block: &[u8; 4 + QK_K + QK_K / 8], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = f32::from_le_bytes(*b.take());
    let qs: &[u8; QK_K] = b.take();
    let _bsums: &[u8; QK_K / 8] = b.take();
    for (y, &q) in y.iter_mut().zip(qs) {
        *y = d * f32::from(q as i8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: [u8; 2] = [0x00, 0x3C]; // f16 1.0
    const HALF: [u8; 2] = [0x00, 0x38]; // f16 0.5

    #[test]
    fn q2_k() {
        let mut b = [0u8; 84];
        b[1] = 0x32; // sub-block 1 (values 16..32): scale 2, min 3
        b[16 + 16] = 0b11_10_01_00; // qs[16]: values 16, 48, 80, 112
        b[80..82].copy_from_slice(&HALF); // d
        b[82..84].copy_from_slice(&ONE); // dmin
        let mut y = [0.0; 256];
        dequantize_q2_k(&b, &mut y);
        assert_eq!(y[16], 0.5 * 2.0 * 0.0 - 3.0);
        // Value 48 is sub-block 3 (scale 0, min 0): 0 whatever q is.
        assert_eq!(y[48], 0.0);
        b[3] = 0x01;
        b[7] = 0x10;
        dequantize_q2_k(&b, &mut y);
        assert_eq!((y[48], y[112]), (0.5 * 1.0 * 1.0, 0.0 * 3.0 - 1.0));
        assert_eq!(y[0], 0.0);
    }

    #[test]
    fn q3_k() {
        // Scales (from byte 96): scale 0 is byte 0's low nibble 1 with top
        // bits 2 from byte 8: 0b10_0001 = 33 → 1. Scale 2 (value 32): byte
        // 2's low nibble 5, top bits 3 from byte 10: 0b11_0101 = 53 → 21.
        let mut b = [0u8; 110];
        b[0] = 0b0000_0010; // hmask[0]: bit 1 set, value 32 has no -4
        b[32] = 0b00_00_11_10; // qs[0]: value 0 low bits 2, value 32 low bits 3
        b[96] = 0x01;
        b[96 + 2] = 0x05;
        b[96 + 8] = 0b10;
        b[96 + 10] = 0b11;
        b[108..110].copy_from_slice(&HALF);
        let mut y = [0.0; 256];
        dequantize_q3_k(&b, &mut y);
        assert_eq!(y[0], 0.5 * 1.0 * (2.0 - 4.0));
        assert_eq!(y[32], 0.5 * 21.0 * 3.0);
        // Scale 1 is 0 - 32 = -32, every quant -4: 0.5 * -32 * -4.
        assert_eq!(y[16], 64.0);
    }

    #[test]
    fn scale_min_k4_unpacks() {
        let scales = [1, 2, 3, 0xC4, 5, 6, 7, 0x48, 0x9A, 0, 0, 0xBC];
        let (sc, m) = scale_min_k4(&scales);
        assert_eq!(sc, [1, 2, 3, 4, 0x0A, 0, 0, 0x0C | (3 << 4)]);
        assert_eq!(m, [5, 6, 7, 8, 0x09, 0, 0, 0x0B | (1 << 4)]);
    }

    #[test]
    fn q4_k_and_q5_k() {
        let mut b = [0u8; 144];
        b[0..2].copy_from_slice(&HALF); // d
        b[2..4].copy_from_slice(&ONE); // dmin
        b[4 + 1] = 3; // scale 1
        b[4 + 5] = 2; // min 1
        b[16] = 0x7A; // qs[0]: value 0 = 10, value 32 (sub-block 1) = 7
        let mut y = [0.0; 256];
        dequantize_q4_k(&b, &mut y);
        assert_eq!((y[0], y[32], y[33]), (0.0, 0.5 * 3.0 * 7.0 - 2.0, -2.0));

        let mut b5 = [0u8; 176];
        b5[..16].copy_from_slice(&b[..16]);
        b5[16] = 0b10; // qh[0]: bit 1, the fifth bit of value 32
        b5[48] = 0x7A;
        dequantize_q5_k(&b5, &mut y);
        assert_eq!((y[0], y[32], y[33]), (0.0, 0.5 * 3.0 * 23.0 - 2.0, -2.0));
    }

    #[test]
    fn q6_k() {
        let mut b = [0u8; 210];
        b[0] = 0x5A; // ql[0]: value 0 low nibble 10, value 64 low nibble 5
        b[128] = 0b00_01_00_11; // qh[0]: value 0 top bits 3, value 64 top bits 1
        b[192] = 2; // scale 0
        b[192 + 4] = 0xFF; // scale 4 (values 64..80) = -1
        b[208..210].copy_from_slice(&HALF);
        let mut y = [0.0; 256];
        dequantize_q6_k(&b, &mut y);
        assert_eq!(y[0], 0.5 * 2.0 * (58.0 - 32.0));
        assert_eq!(y[64], -0.5 * (21.0 - 32.0)); // d * scale = -0.5
        assert_eq!(y[1], 0.5 * 2.0 * -32.0);
    }

    #[test]
    fn q8_k() {
        let mut b = [0u8; 292];
        b[..4].copy_from_slice(&0.25f32.to_le_bytes());
        b[4] = 0x80;
        b[5] = 7;
        b[260] = 0xAA; // bsums: ignored
        let mut y = [0.0; 256];
        dequantize_q8_k(&b, &mut y);
        assert_eq!((y[0], y[1], y[2]), (-32.0, 1.75, 0.0));
    }
}
