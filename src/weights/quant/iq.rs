//! Grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S):
//! each group of 8 (IQ1, IQ2) or 4 (IQ3) values is one row of a fixed grid
//! of small levels ([`super::grids`]), chosen by an 8- to 11-bit index,
//! times a sub-block scale; IQ2/IQ3 rows also get signs, IQ1 rows a shift
//! of ±1/8. C reference: `ggml-quants.c`, `dequantize_row_iq2_xxs` ...
//! `dequantize_row_iq1_m`; gguf-py: the `IQ2_XXS` ... `IQ1_M` classes in
//! `quants.py`.
//!
//! gguf-py and C agree on the operation order: the sub-block scale `db`
//! first (exact but for one rounding of `d * ...`), then `db * level` (one
//! rounding), then the sign, which is exact. Bit-exact with both.

use super::grids::{IQ1S_GRID, IQ1_DELTA, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::Fields;
use crate::weights::ggml::QK_K;

/// `db * level` for each value of a grid row, negated where bit `j` of
/// `signs` is set (gguf-py multiplies by ±1, the same bits).
#[inline(always)]
fn signed_row(db: f32, row: &[u8], signs: u8, y: &mut [f32]) {
    for (j, (y, &level)) in y.iter_mut().zip(row).enumerate() {
        let v = db * f32::from(level);
        *y = if (signs >> j) & 1 == 0 { v } else { -v };
    }
}

/// The sub-block scale of IQ2_XXS, IQ2_XS and IQ2_S: `d * (0.5 + s) / 4`,
/// in gguf-py's and C's order.
#[inline(always)]
fn iq2_scale(d: f32, s: u32) -> f32 {
    d * (0.5 + s as f32) * 0.25
}

/// Nibble `i` of `bytes`: low nibble of `bytes[i / 2]` for even `i`.
#[inline(always)]
fn nibble(bytes: &[u8], i: usize) -> u8 {
    (bytes[i / 2] >> (4 * (i % 2))) & 0x0F
}

/// `block_iq2_xxs { d; uint16 qs[32] }`: 8 sub-blocks of 32, each 8 bytes.
/// Bytes 0..4 index `iq2xxs_grid` for the 4 groups of 8; bytes 4..8, read
/// as a little-endian `u32`, hold 4 × 7 bits of `ksigns_iq2xs` indices and
/// the 4-bit scale on top. Bit-exact with gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_iq2_xxs`; gguf-py `IQ2_XXS.dequantize_blocks`.
pub(super) fn dequantize_iq2_xxs(block: &[u8; 2 + QK_K / 4], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = b.f16();
    let qs: &[u8; QK_K / 4] = b.take();
    for (q, y) in qs.as_chunks::<8>().0.iter().zip(y.as_chunks_mut::<32>().0) {
        let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
        let db = iq2_scale(d, aux >> 28);
        for (l, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 0x7F) as usize];
            signed_row(db, &IQ2XXS_GRID[usize::from(q[l])].to_le_bytes(), signs, y);
        }
    }
}

/// `block_iq2_xs { d; uint16 qs[32]; scales[8] }`: one `u16` per group of 8,
/// 9 bits of `iq2xs_grid` index and 7 bits of `ksigns_iq2xs` index; a 4-bit
/// scale per 16 values (nibble `i` of `scales`). Bit-exact with gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_iq2_xs`; gguf-py `IQ2_XS.dequantize_blocks`.
pub(super) fn dequantize_iq2_xs(block: &[u8; 2 + QK_K / 4 + QK_K / 32], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = b.f16();
    let qs: &[u8; QK_K / 4] = b.take();
    let scales: &[u8; QK_K / 32] = b.take();
    let groups = qs.as_chunks::<2>().0.iter().zip(y.as_chunks_mut::<8>().0);
    for (g, (q, y)) in groups.enumerate() {
        let q = u16::from_le_bytes(*q);
        let db = iq2_scale(d, u32::from(nibble(scales, g / 2)));
        signed_row(db, &IQ2XS_GRID[usize::from(q & 0x1FF)].to_le_bytes(), KSIGNS_IQ2XS[usize::from(q >> 9)], y);
    }
}

/// `block_iq2_s { d; qs[64]; qh[8]; scales[8] }`: `qs[0..32]` are the low 8
/// bits of the `iq2s_grid` indices of the 32 groups of 8, bits `2(g % 4)..`
/// of `qh[g / 4]` their top two; `qs[32..64]` one sign byte per group; a
/// 4-bit scale per 16 values. Bit-exact with gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_iq2_s`; gguf-py `IQ2_S.dequantize_blocks`.
pub(super) fn dequantize_iq2_s(block: &[u8; 2 + QK_K / 4 + QK_K / 32 + QK_K / 32], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = b.f16();
    let qs: &[u8; QK_K / 8] = b.take();
    let signs: &[u8; QK_K / 8] = b.take();
    let qh: &[u8; QK_K / 32] = b.take();
    let scales: &[u8; QK_K / 32] = b.take();
    for (g, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
        let index = usize::from(qs[g]) | usize::from((qh[g / 4] >> (2 * (g % 4))) & 3) << 8;
        let db = iq2_scale(d, u32::from(nibble(scales, g / 2)));
        signed_row(db, &IQ2S_GRID[index].to_le_bytes(), signs[g], y);
    }
}

/// `block_iq3_xxs { d; qs[96] }`: `qs[0..64]` index `iq3xxs_grid`, one row
/// of 4 per byte; `qs[64..96]` are 8 little-endian `u32`s, one per 32
/// values: 4 × 7 bits of `ksigns_iq2xs` indices (each for 8 values, two
/// rows) and the 4-bit scale on top, `d * (0.5 + s) / 2`. Bit-exact with
/// gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_iq3_xxs`; gguf-py `IQ3_XXS.dequantize_blocks`.
pub(super) fn dequantize_iq3_xxs(block: &[u8; 2 + 3 * QK_K / 8], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = b.f16();
    let qs: &[u8; QK_K / 4] = b.take();
    let scales_and_signs: &[u8; QK_K / 8] = b.take();
    let subs = qs.as_chunks::<8>().0.iter().zip(scales_and_signs.as_chunks::<4>().0).zip(y.as_chunks_mut::<32>().0);
    for ((q, aux), y) in subs {
        let aux = u32::from_le_bytes(*aux);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 0x7F) as usize];
            let (lo, hi) = y.split_at_mut(4);
            signed_row(db, &IQ3XXS_GRID[usize::from(q[2 * l])].to_le_bytes(), signs, lo);
            signed_row(db, &IQ3XXS_GRID[usize::from(q[2 * l + 1])].to_le_bytes(), signs >> 4, hi);
        }
    }
}

/// `block_iq3_s { d; qs[64]; qh[8]; signs[32]; scales[4] }`: row `r` of 4
/// values is `iq3s_grid[qs[r] | bit (r % 8) of qh[r / 8] << 8]`; one sign
/// bit per value; a 4-bit scale per 32 values, `d * (1 + 2s)`. Bit-exact
/// with gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_iq3_s`; gguf-py `IQ3_S.dequantize_blocks`.
pub(super) fn dequantize_iq3_s(block: &[u8; 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = b.f16();
    let qs: &[u8; QK_K / 4] = b.take();
    let qh: &[u8; QK_K / 32] = b.take();
    let signs: &[u8; QK_K / 8] = b.take();
    let scales: &[u8; QK_K / 64] = b.take();
    for (r, y) in y.as_chunks_mut::<4>().0.iter_mut().enumerate() {
        let db = d * f32::from(1 + 2 * nibble(scales, r / 8));
        let index = usize::from(qs[r]) | usize::from((qh[r / 8] >> (r % 8)) & 1) << 8;
        signed_row(db, &IQ3S_GRID[index].to_le_bytes(), signs[r / 2] >> (4 * (r % 2)), y);
    }
}

/// `dl * (level + delta)` for a row of `iq1s_grid` (levels -1, 0, 1 as
/// int8 bytes); `level + delta` is exact, so one rounding, as in gguf-py and C.
#[inline(always)]
fn iq1_row(dl: f32, index: usize, delta: f32, y: &mut [f32; 8]) {
    for (y, level) in y.iter_mut().zip(IQ1S_GRID[index].to_le_bytes()) {
        *y = dl * (f32::from(level as i8) + delta);
    }
}

/// `block_iq1_s { d; qs[32]; uint16 qh[8] }`: per 32 values one `qh`: bits
/// `3l..3l + 3` are the top bits of group `l`'s 11-bit `iq1s_grid` index
/// (low 8 bits in `qs`), bits 12..15 the scale `d * (2s + 1)`, bit 15 the
/// sign of the shift `delta` = ±1/8. Bit-exact with gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_iq1_s`; gguf-py `IQ1_S.dequantize_blocks`.
pub(super) fn dequantize_iq1_s(block: &[u8; 2 + QK_K / 8 + QK_K / 16], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let d = b.f16();
    let qs: &[u8; QK_K / 8] = b.take();
    let qh: &[u8; QK_K / 16] = b.take();
    let subs = qs.as_chunks::<4>().0.iter().zip(qh.as_chunks::<2>().0).zip(y.as_chunks_mut::<32>().0);
    for ((qs, qh), y) in subs {
        let qh = u16::from_le_bytes(*qh);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 == 0 { IQ1_DELTA } else { -IQ1_DELTA };
        for (l, (&q, y)) in qs.iter().zip(y.as_chunks_mut::<8>().0).enumerate() {
            iq1_row(dl, usize::from(q) | usize::from((qh >> (3 * l)) & 7) << 8, delta, y);
        }
    }
}

/// `block_iq1_m { qs[32]; qh[16]; scales[8] }`: no `d` field; its f16 bits
/// are the top nibbles of the four little-endian `u16` scales (the first is
/// bits 0..4). Per 16 values `s`: a 3-bit scale `d * (2k + 1)`, bits
/// `3(s % 4)..` of scale word `s / 4`, and `qh[s]`, whose two nibbles (one
/// per group of 8) hold 3 top bits of the `iq1s_grid` index and, as bit 3,
/// the sign of the shift. Bit-exact with gguf-py and C.
/// Ref: `ggml-quants.c` `dequantize_row_iq1_m`; gguf-py `IQ1_M.dequantize_blocks`.
pub(super) fn dequantize_iq1_m(block: &[u8; QK_K / 8 + QK_K / 16 + QK_K / 32], y: &mut [f32; QK_K]) {
    let mut b = Fields(block);
    let qs: &[u8; QK_K / 8] = b.take();
    let qh: &[u8; QK_K / 16] = b.take();
    let scales: &[u8; QK_K / 32] = b.take();
    let sc: Vec<u16> = scales.as_chunks::<2>().0.iter().map(|s| u16::from_le_bytes(*s)).collect();
    let sc: [u16; 4] = sc.try_into().expect("QK_K / 32 bytes are 4 u16s");
    let d_bits = (sc[0] >> 12) | (sc[1] >> 12) << 4 | (sc[2] >> 12) << 8 | (sc[3] >> 12) << 12;
    let d = half::f16::from_bits(d_bits).to_f32();
    for (s, y) in y.as_chunks_mut::<16>().0.iter_mut().enumerate() {
        let dl = d * f32::from(2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1);
        for (g, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
            let h = qh[s] >> (4 * g);
            let delta = if h & 0x08 == 0 { IQ1_DELTA } else { -IQ1_DELTA };
            iq1_row(dl, usize::from(qs[2 * s + g]) | usize::from(h & 7) << 8, delta, y);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF: [u8; 2] = [0x00, 0x38]; // f16 0.5

    #[test]
    fn iq2_xxs() {
        let mut b = [0u8; 66];
        b[..2].copy_from_slice(&HALF);
        // Sub-block 0: group 0 is grid row 1 (8, .., 8, 43 from the top
        // byte down: value 0 is 43); group 1's sign index 1 = 0x81 negates
        // values 0 and 7; scale 3 → 0.5 * 3.5 / 4.
        b[2] = 1;
        b[6..10].copy_from_slice(&(3u32 << 28 | 1 << 7).to_le_bytes());
        let mut y = [0.0; 256];
        dequantize_iq2_xxs(&b, &mut y);
        let db = 0.5 * 3.5 * 0.25;
        assert_eq!((y[0], y[1], y[7]), (db * 43.0, db * 8.0, db * 8.0));
        assert_eq!((y[8], y[9], y[15]), (-db * 8.0, db * 8.0, -db * 8.0));
        // Sub-block 1: scale 0.
        assert_eq!(y[32], 0.5 * 0.5 * 0.25 * 8.0);
    }

    #[test]
    fn iq2_xs_and_iq2_s() {
        let mut b = [0u8; 74];
        b[..2].copy_from_slice(&HALF);
        // Group 2: grid row 1, sign index 1 (values 0 and 7 negated); its
        // scale is nibble 1, the high nibble of scales[0].
        b[2 + 4..2 + 6].copy_from_slice(&(1u16 | 1 << 9).to_le_bytes());
        b[66] = 0x52;
        let mut y = [0.0; 256];
        dequantize_iq2_xs(&b, &mut y);
        let (db0, db1) = (0.5 * 2.5 * 0.25, 0.5 * 5.5 * 0.25);
        assert_eq!(y[0], db0 * 8.0);
        assert_eq!((y[16], y[17], y[23]), (-db1 * 43.0, db1 * 8.0, -db1 * 8.0));

        let mut b = [0u8; 82];
        b[..2].copy_from_slice(&HALF);
        // Group 5: index 1 | 3 << 8 = 769 (levels 25, 8, 25, 25, 8, 8, 43, 25),
        // its top bits at bit 2 of qh[1]; sign byte 0x80 negates value 7.
        b[2 + 5] = 1;
        b[2 + 32 + 5] = 0x80;
        b[2 + 64 + 1] = 3 << 2;
        b[2 + 64 + 8 + 1] = 0x40; // nibble 2 (groups 4, 5): scale 0, nibble 3: 4
        let mut y = [0.0; 256];
        dequantize_iq2_s(&b, &mut y);
        let db = 0.5 * 0.5 * 0.25;
        assert_eq!(IQ2S_GRID[769], 0x192b080819190819);
        assert_eq!((y[40], y[41], y[46], y[47]), (db * 25.0, db * 8.0, db * 43.0, -db * 25.0));
        assert_eq!(y[48], 0.5 * 4.5 * 0.25 * 8.0);
    }

    #[test]
    fn iq3_xxs_and_iq3_s() {
        let mut b = [0u8; 98];
        b[..2].copy_from_slice(&HALF);
        // Sub-block 0: rows 0, 1 (values 0..8) are grid rows 5 and 0:
        // iq3xxs_grid[5] = 0x04040c3e; sign index 1 negates values 0 and 7.
        b[2] = 5;
        b[2 + 64..2 + 68].copy_from_slice(&(1u32 << 28 | 1).to_le_bytes());
        let mut y = [0.0; 256];
        dequantize_iq3_xxs(&b, &mut y);
        let db = 0.5 * 1.5 * 0.5;
        assert_eq!((y[0], y[1], y[3], y[4], y[7]), (-db * 62.0, db * 12.0, db * 4.0, db * 4.0, -db * 4.0));

        let mut b = [0u8; 110];
        b[..2].copy_from_slice(&HALF);
        // Row 9 (values 36..40): index 2 | bit 1 of qh[1] = 258,
        // iq3s_grid[258] = 0x0509070b; sign byte 4 (values 32..40) high
        // nibble 0b0010 negates value 37; scale nibble 1 = 7 → 0.5 * 15.
        b[2 + 9] = 2;
        b[2 + 64 + 1] = 0b10;
        b[2 + 72 + 4] = 0x20;
        b[2 + 104] = 0x70;
        let mut y = [0.0; 256];
        dequantize_iq3_s(&b, &mut y);
        let db = 0.5 * 15.0;
        assert_eq!(IQ3S_GRID[258], 0x0509070b);
        assert_eq!((y[36], y[37], y[38], y[39]), (db * 11.0, -db * 7.0, db * 9.0, db * 5.0));
        assert_eq!(y[0], 0.5 * 1.0); // sub-block 0: scale 0 → d, grid row 0 = 1s
    }

    #[test]
    fn iq1_s_and_iq1_m() {
        let mut b = [0u8; 50];
        b[..2].copy_from_slice(&HALF);
        // Sub-block 1, group 2: index 3 | 1 << 8 (qh bits 6..9) = 259;
        // scale 2 → 0.5 * 5; negative shift.
        b[2 + 4 + 2] = 3;
        b[2 + 32 + 2..2 + 32 + 4].copy_from_slice(&(0x8000u16 | 2 << 12 | 1 << 6).to_le_bytes());
        let mut y = [0.0; 256];
        dequantize_iq1_s(&b, &mut y);
        let level = |row: u64, j: usize| f32::from(row.to_le_bytes()[j] as i8);
        let want: Vec<f32> = (0..8).map(|j| 2.5 * (level(IQ1S_GRID[259], j) - 0.125)).collect();
        assert_eq!(y[48..56], want[..]);
        assert_eq!(y[0], 0.5 * (-1.0 + 0.125)); // sub-block 0: row 0 is all -1

        // IQ1_M: d = 0.5 (f16 0x3800) in the scale words' top nibbles:
        // 0x0, 0x0, 0x8, 0x3 from word 0 up.
        let mut b = [0u8; 56];
        b[48 + 5] = 0x80;
        b[48 + 7] = 0x30;
        // Values 16..32 (s = 1): scale bits 3..6 of word 0 = 1 → 0.5 * 3;
        // qh[1] high nibble: index bits 1, negative shift, for group 3.
        b[48] = 1 << 3;
        b[3] = 3;
        b[32 + 1] = 0x90;
        let mut y = [0.0; 256];
        dequantize_iq1_m(&b, &mut y);
        let want: Vec<f32> = (0..8).map(|j| 1.5 * (level(IQ1S_GRID[259], j) - 0.125)).collect();
        assert_eq!(y[24..32], want[..]);
        assert_eq!(y[16], 1.5 * (-1.0 + 0.125)); // group 2: row 0, positive shift
        assert_eq!(y[0], 0.5 * (-1.0 + 0.125));
    }
}
