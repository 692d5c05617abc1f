//! ggml's original 32-value blocks: an f16 scale `d` (and min `m`) and 4-,
//! 5- or 8-bit quants. C reference: `ggml-quants.c`, `dequantize_row_q4_0`
//! and its siblings; gguf-py: the `Q4_0` ... `Q8_0` classes in `quants.py`.
//!
//! In the nibble types value `j` is the low nibble of `qs[j]` and value
//! `j + 16` its high nibble; the 5-bit ones take bit `j` of `qh` as bit 4.

use super::Fields;

const QK4_0: usize = 32;
const QK4_1: usize = 32;
const QK5_0: usize = 32;
const QK5_1: usize = 32;
const QK8_0: usize = 32;
const QK8_1: usize = 32;

/// `block_q4_0 { d; qs[16] }`: `d * (q - 8)`. Bit-exact with gguf-py and C
/// (an f16 times a 4-bit integer is exact in f32).
/// Ref: `ggml-quants.c` `dequantize_row_q4_0`; gguf-py `Q4_0.dequantize_blocks`.
pub(super) fn dequantize_q4_0(block: &[u8; 2 + QK4_0 / 2], y: &mut [f32; QK4_0]) {
    let mut b = Fields(block);
    let d = b.f16();
    let qs: &[u8; QK4_0 / 2] = b.take();
    let (lo, hi) = y.split_at_mut(QK4_0 / 2);
    for ((&q, lo), hi) in qs.iter().zip(lo).zip(hi) {
        *lo = d * f32::from((q & 0x0F) as i8 - 8);
        *hi = d * f32::from((q >> 4) as i8 - 8);
    }
}

/// `block_q4_1 { d; m; qs[16] }`: `d * q + m`, rounded once, as in gguf-py
/// and C (`x0*d + m`).
/// Ref: `ggml-quants.c` `dequantize_row_q4_1`; gguf-py `Q4_1.dequantize_blocks`.
pub(super) fn dequantize_q4_1(block: &[u8; 2 + 2 + QK4_1 / 2], y: &mut [f32; QK4_1]) {
    let mut b = Fields(block);
    let d = b.f16();
    let m = b.f16();
    let qs: &[u8; QK4_1 / 2] = b.take();
    let (lo, hi) = y.split_at_mut(QK4_1 / 2);
    for ((&q, lo), hi) in qs.iter().zip(lo).zip(hi) {
        *lo = d * f32::from(q & 0x0F) + m;
        *hi = d * f32::from(q >> 4) + m;
    }
}

/// `block_q5_0 { d; qh[4]; qs[16] }`: `d * (q - 16)`, exact, so bit-exact
/// with gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_q5_0`; gguf-py `Q5_0.dequantize_blocks`.
pub(super) fn dequantize_q5_0(block: &[u8; 2 + 4 + QK5_0 / 2], y: &mut [f32; QK5_0]) {
    let mut b = Fields(block);
    let d = b.f16();
    let qh = u32::from_le_bytes(*b.take());
    let qs: &[u8; QK5_0 / 2] = b.take();
    let (lo, hi) = y.split_at_mut(QK5_0 / 2);
    for (j, ((&q, lo), hi)) in qs.iter().zip(lo).zip(hi).enumerate() {
        let (h0, h1) = (((qh >> j) & 1) << 4, ((qh >> (j + 16)) & 1) << 4);
        *lo = d * f32::from(((q & 0x0F) | h0 as u8) as i8 - 16);
        *hi = d * f32::from(((q >> 4) | h1 as u8) as i8 - 16);
    }
}

/// `block_q5_1 { d; m; qh[4]; qs[16] }`: `d * q + m`, as gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_q5_1`; gguf-py `Q5_1.dequantize_blocks`.
pub(super) fn dequantize_q5_1(block: &[u8; 2 + 2 + 4 + QK5_1 / 2], y: &mut [f32; QK5_1]) {
    let mut b = Fields(block);
    let d = b.f16();
    let m = b.f16();
    let qh = u32::from_le_bytes(*b.take());
    let qs: &[u8; QK5_1 / 2] = b.take();
    let (lo, hi) = y.split_at_mut(QK5_1 / 2);
    for (j, ((&q, lo), hi)) in qs.iter().zip(lo).zip(hi).enumerate() {
        let (h0, h1) = (((qh >> j) & 1) << 4, ((qh >> (j + 16)) & 1) << 4);
        *lo = d * f32::from((q & 0x0F) | h0 as u8) + m;
        *hi = d * f32::from((q >> 4) | h1 as u8) + m;
    }
}

/// `block_q8_0 { d; qs[32] (int8) }`: `qs * d`, exact, so bit-exact with
/// gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_q8_0`; gguf-py `Q8_0.dequantize_blocks`.
pub(super) fn dequantize_q8_0(block: &[u8; 2 + QK8_0], y: &mut [f32; QK8_0]) {
    let mut b = Fields(block);
    let d = b.f16();
    let qs: &[u8; QK8_0] = b.take();
    for (y, &q) in y.iter_mut().zip(qs) {
        *y = f32::from(q as i8) * d;
    }
}

/// `block_q8_1 { d; s; qs[32] (int8) }`, where `s = d * sum(qs)` serves dot
/// products only. Neither gguf-py nor ggml C dequantizes Q8_1 (C's
/// `dequantize_row_q8_1` is commented out); this is Q8_0's formula.
/// Ref: none in ggml C or gguf-py.
pub(super) fn dequantize_q8_1(block: &[u8; 2 + 2 + QK8_1], y: &mut [f32; QK8_1]) {
    let mut b = Fields(block);
    let d = b.f16();
    let _s: &[u8; 2] = b.take();
    let qs: &[u8; QK8_1] = b.take();
    for (y, &q) in y.iter_mut().zip(qs) {
        *y = f32::from(q as i8) * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // f16 bit patterns, little-endian.
    const TWO: [u8; 2] = [0x00, 0x40];
    const HALF: [u8; 2] = [0x00, 0x38];
    const MINUS_ONE: [u8; 2] = [0x00, 0xBC];

    fn block<const N: usize>(head: &[u8], fill: u8) -> [u8; N] {
        let mut b = [fill; N];
        b[..head.len()].copy_from_slice(head);
        b
    }

    #[test]
    fn q4_0() {
        // d = 2, every byte 0x3A: low nibble 10, high 3.
        let b: [u8; 18] = block(&TWO, 0x3A);
        let mut y = [0.0; 32];
        dequantize_q4_0(&b, &mut y);
        assert_eq!((y[0], y[15]), (2.0 * (10.0 - 8.0), 4.0));
        assert_eq!((y[16], y[31]), (2.0 * (3.0 - 8.0), -10.0));
    }

    #[test]
    fn q4_1() {
        // d = 0.5, m = -1; 0xF0: low 0, high 15.
        let b: [u8; 20] = block(&[HALF, MINUS_ONE].concat(), 0xF0);
        let mut y = [0.0; 32];
        dequantize_q4_1(&b, &mut y);
        assert_eq!((y[0], y[16]), (-1.0, 0.5 * 15.0 - 1.0));
    }

    #[test]
    fn q5_0() {
        // d = 2; qh has bits 0 and 17 set; qs all 0x21 (low 1, high 2).
        let b: [u8; 22] = block(&[TWO[0], TWO[1], 0x01, 0x00, 0x02, 0x00], 0x21);
        let mut y = [0.0; 32];
        dequantize_q5_0(&b, &mut y);
        assert_eq!(y[0], 2.0 * (17.0 - 16.0)); // 1 | 1<<4
        assert_eq!(y[1], 2.0 * (1.0 - 16.0));
        assert_eq!(y[16], 2.0 * (2.0 - 16.0));
        assert_eq!(y[17], 2.0 * (18.0 - 16.0)); // 2 | 1<<4
    }

    #[test]
    fn q5_1() {
        // d = 0.5, m = -1; qh bit 31 set; qs all 0xF0.
        let b: [u8; 24] = block(&[HALF[0], HALF[1], MINUS_ONE[0], MINUS_ONE[1], 0, 0, 0, 0x80], 0xF0);
        let mut y = [0.0; 32];
        dequantize_q5_1(&b, &mut y);
        assert_eq!((y[0], y[30], y[31]), (-1.0, 0.5 * 15.0 - 1.0, 0.5 * 31.0 - 1.0));
    }

    #[test]
    fn q8_0_and_q8_1() {
        let b: [u8; 34] = block(&[HALF[0], HALF[1], 0x80, 0x7F], 0xFF);
        let mut y = [0.0; 32];
        dequantize_q8_0(&b, &mut y);
        assert_eq!((y[0], y[1], y[2]), (-64.0, 63.5, -0.5));
        let b: [u8; 36] = block(&[HALF[0], HALF[1], 0x12, 0x34, 0x80, 0x7F], 0xFF);
        dequantize_q8_1(&b, &mut y);
        assert_eq!((y[0], y[1], y[2]), (-64.0, 63.5, -0.5));
    }
}
