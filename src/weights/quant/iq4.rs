//! 4-bit non-linear quants: each nibble indexes `kvalues_iq4nl`, a fixed
//! table of 16 int8 levels. C reference: `ggml-quants.c`,
//! `dequantize_row_iq4_nl` and `dequantize_row_iq4_xs`; gguf-py: `IQ4_NL`
//! and `IQ4_XS` in `quants.py`.

use super::Fields;
use crate::weights::ggml::QK_K;

const QK4_NL: usize = 32;

/// `kvalues_iq4nl` from `ggml-common.h`.
const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Dequantizes 32 values from 16 bytes of nibbles: the low nibbles of `qs`
/// are values 0..16, the high ones 16..32.
#[inline(always)]
fn nibbles(dl: f32, qs: &[u8; 16], y: &mut [f32; 32]) {
    let (lo, hi) = y.split_at_mut(16);
    for ((&q, lo), hi) in qs.iter().zip(lo).zip(hi) {
        *lo = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0F)]);
        *hi = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

/// `block_iq4_nl { d; qs[16] }`: `d * kvalues[q]`, exact, so bit-exact with
/// gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_iq4_nl`; gguf-py `IQ4_NL.dequantize_blocks`.
pub(super) fn dequantize_iq4_nl(block: &[u8; 2 + QK4_NL / 2], y: &mut [f32; QK4_NL]) {
    let mut b = Fields(block);
    let d = b.f16();
    nibbles(d, b.take(), y);
}

/// `block_iq4_xs { d; uint16 scales_h; scales_l[4]; qs[128] }`: 8 sub-blocks
/// of 32 with 6-bit signed scales, low nibble from `scales_l[j / 2]`, top
/// two bits from bits `2j..` of `scales_h`. `(d * (ls - 32)) * kvalues[q]`,
/// as gguf-py and C (`dl * kvalues[...]`); bit-exact.
/// Ref: `ggml-quants.c` `dequantize_row_iq4_xs`; gguf-py `IQ4_XS.dequantize_blocks`.
pub(super) fn dequantize_iq4_xs(block: &[u8; 2 + 2 + QK_K / 64 + QK_K / 2], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = b.f16();
    let scales_h = u16::from_le_bytes(*b.take());
    let scales_l: &[u8; QK_K / 64] = b.take();
    let qs: &[u8; QK_K / 2] = b.take();
    let subs = qs.as_chunks::<16>().0.iter().zip(y.as_chunks_mut::<32>().0);
    for (j, (qs, y)) in subs.enumerate() {
        let lo = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0F;
        let hi = ((scales_h >> (2 * j)) & 3) as u8;
        nibbles(d * f32::from((lo | (hi << 4)) as i8 - 32), qs, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF: [u8; 2] = [0x00, 0x38]; // f16 0.5

    #[test]
    fn iq4_nl() {
        let mut b = [0x8F; 18]; // low nibble 15 → 113, high 8 → 1
        b[..2].copy_from_slice(&HALF);
        b[2] = 0x70; // value 0 → -127, value 16 → -10
        let mut y = [0.0; 32];
        dequantize_iq4_nl(&b, &mut y);
        assert_eq!((y[0], y[16], y[1], y[17]), (-63.5, -5.0, 56.5, 0.5));
    }

    #[test]
    fn iq4_xs() {
        let mut b = [0u8; 136];
        b[..2].copy_from_slice(&HALF);
        // Sub-block 0: low nibble 1, top bits 2 → 33 - 32 = 1.
        // Sub-block 3: high nibble of scales_l[1] = 0xF, top bits 3 → 63 - 32 = 31.
        b[2..4].copy_from_slice(&(0b11_00_00_10u16).to_le_bytes());
        b[4] = 0x01;
        b[5] = 0xF0;
        b[8] = 0x8F; // qs[0]: value 0 → 113, value 16 → 1
        b[8 + 3 * 16] = 0x07; // sub-block 3, value 96 → -10, value 112 → -127
        let mut y = [0.0; 256];
        dequantize_iq4_xs(&b, &mut y);
        assert_eq!((y[0], y[16]), (0.5 * 113.0, 0.5));
        assert_eq!((y[96], y[112]), (0.5 * 31.0 * -10.0, 0.5 * 31.0 * -127.0));
        // Sub-block 1: scale 0 - 32 = -32, all nibbles 0 → -127.
        assert_eq!(y[32], 0.5 * -32.0 * -127.0);
    }
}
