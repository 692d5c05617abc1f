//! Plain (unblocked) types: one value per "block".
//!
//! F32, F16 and BF16 are bit-exact with gguf-py (`dequantize`'s F32 and F16
//! cases, `BF16.dequantize_blocks`); conversion is exact, so these match
//! ggml C's `ggml_fp16_to_fp32`/`ggml_bf16_to_fp32` too. gguf-py cannot
//! dequantize F64 or the integer types, and ggml C has no `to_float` for
//! them; they convert as numpy's `astype(np.float32)` does, rounding to
//! nearest even (Rust's `as f32`), with F64 overflowing to ±inf.

pub(super) fn f32(x: [u8; 4]) -> f32 {
    f32::from_le_bytes(x)
}

/// F16 goes by slices, not values: half's slice conversion checks for F16C
/// once per call rather than per value, and converts 8 at a time (~4×).
pub(super) fn f16_slice(bytes: &[u8], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    const CHUNK: usize = 256;
    let mut buf = [half::f16::ZERO; CHUNK];
    for (x, y) in bytes.chunks(2 * CHUNK).zip(out.chunks_mut(CHUNK)) {
        let buf = &mut buf[..y.len()];
        for (h, b) in buf.iter_mut().zip(x.as_chunks::<2>().0) {
            *h = half::f16::from_le_bytes(*b);
        }
        buf.convert_to_f32_slice(y);
    }
}

/// A bf16 is the top half of an f32: `(int32(x) << 16).view(float32)`,
/// which also keeps NaN payloads as they are.
pub(super) fn bf16(x: [u8; 2]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes(x)) << 16)
}

pub(super) fn f64(x: [u8; 8]) -> f32 {
    f64::from_le_bytes(x) as f32
}

pub(super) fn i8(x: [u8; 1]) -> f32 {
    f32::from(i8::from_le_bytes(x))
}

pub(super) fn i16(x: [u8; 2]) -> f32 {
    f32::from(i16::from_le_bytes(x))
}

pub(super) fn i32(x: [u8; 4]) -> f32 {
    i32::from_le_bytes(x) as f32
}

pub(super) fn i64(x: [u8; 8]) -> f32 {
    i64::from_le_bytes(x) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats() {
        assert_eq!(f32(1.5f32.to_le_bytes()), 1.5);
        let mut y = [0.0; 3];
        // 0x3C00, the smallest subnormal, 0xC500.
        f16_slice(&[0x00, 0x3C, 0x01, 0x00, 0x00, 0xC5], &mut y);
        assert_eq!(y, [1.0, 2f32.powi(-24), -5.0]);
        assert_eq!(bf16([0x80, 0x3F]), 1.0); // 0x3F80
        assert_eq!(bf16([0x49, 0x40]), 3.140625); // 0x4049
        assert_eq!(f64(0.1f64.to_le_bytes()), 0.1f32);
        assert_eq!(f64(1e300f64.to_le_bytes()), f32::INFINITY);
    }

    #[test]
    fn f16_slice_matches_scalar_conversion() {
        // Every f16 bit pattern, NaNs aside (F16C may set their quiet bit),
        // in a length that leaves a partial chunk.
        let bits: Vec<u16> = (0..=u16::MAX).filter(|b| b & 0x7C00 != 0x7C00 || b & 0x03FF == 0).collect();
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let mut out = vec![0.0; bits.len()];
        f16_slice(&bytes, &mut out);
        for (b, y) in bits.iter().zip(&out) {
            assert_eq!(y.to_bits(), half::f16::from_bits(*b).to_f32().to_bits(), "{b:#06x}");
        }
    }

    #[test]
    fn integers() {
        assert_eq!(i8([0xFF]), -1.0);
        assert_eq!(i16((-300i16).to_le_bytes()), -300.0);
        // 2^24 + 1 is halfway between two f32s: ties to even.
        assert_eq!(i32(((1 << 24) + 1i32).to_le_bytes()), 16_777_216.0);
        assert_eq!(i32(((1 << 24) + 3i32).to_le_bytes()), 16_777_220.0);
        assert_eq!(i64(i64::MIN.to_le_bytes()), -(2f32.powi(63)));
    }
}
