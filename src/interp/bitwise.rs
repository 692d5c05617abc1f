//! Ops on the bits of integers. Each element travels as its bit pattern:
//! the low `bit_width` bits of a u64.

use super::{each_buffer, not_defined, same, Buffer, Elem, Num, Value};
use crate::graph::ops::BitwiseOp;
use crate::graph::{DType, TensorType};

pub(super) fn bitwise(op: BitwiseOp, a: &Buffer, b: &Buffer) -> Result<Buffer, String> {
    let dtype = a.dtype();
    if dtype.is_float() || (op.is_shift() && dtype == DType::I1) {
        return Err(not_defined(op.name(), dtype));
    }
    let w = dtype.bit_width();
    each_buffer!(a, x => {
        let y = same(x, b)?;
        Ok(on_bits(x, w, |i| apply(op, bits(x[i], w), bits(y[i], w), w)))
    })
}

pub(super) fn not(x: &Buffer) -> Result<Buffer, String> {
    if x.dtype().is_float() {
        return Err(not_defined("not", x.dtype()));
    }
    let w = x.dtype().bit_width();
    Ok(each_buffer!(x, v => on_bits(v, w, |i| !bits(v[i], w))))
}

/// A buffer like `like` whose element `i` has the (truncated) bits `f(i)`;
/// `T::from_num` wraps integers, and `i1` is the low bit.
fn on_bits<T: Elem>(like: &[T], w: usize, f: impl Fn(usize) -> u64) -> Buffer {
    T::wrap((0..like.len()).map(|i| T::from_num(Num::I((f(i) & mask(w)) as i64))).collect())
}

fn apply(op: BitwiseOp, x: u64, y: u64, w: usize) -> u64 {
    // The shift amount is unsigned: a negative one is huge, so past the width.
    let past = y >= w as u64;
    match op {
        BitwiseOp::And => x & y,
        BitwiseOp::Or => x | y,
        BitwiseOp::Xor => x ^ y,
        BitwiseOp::ShiftLeft if past => 0,
        BitwiseOp::ShiftLeft => x << y,
        BitwiseOp::ShiftRightLogical if past => 0,
        BitwiseOp::ShiftRightLogical => x >> y,
        // The top bit of the w-bit pattern fills in, also for unsigned types.
        BitwiseOp::ShiftRightArithmetic => (sign_extend(x, w) >> y.min(63)) as u64,
    }
}

fn mask(w: usize) -> u64 {
    u64::MAX >> (64 - w)
}

fn bits<T: Elem>(x: T, w: usize) -> u64 {
    x.to_num().as_i64() as u64 & mask(w)
}

fn sign_extend(x: u64, w: usize) -> i64 {
    ((x << (64 - w)) as i64) >> (64 - w)
}

/// The operand's little-endian bytes read as `ty`: element `[i..., k]` of a
/// narrower result is the k-th chunk of operand element `[i...]`, as in
/// the spec's example (1.0f32 -> [0, 0, -128, 63] as i8).
pub(super) fn bitcast_convert(x: &Value, ty: &TensorType) -> Result<Buffer, String> {
    if x.ty.dtype == DType::I1 || ty.dtype == DType::I1 {
        return Err(format!("cannot bitcast {} to {ty}: i1 has no bit layout", x.ty));
    }
    Value::from_le_bytes(ty, &x.to_le_bytes()).map(|v| v.data).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::tests::val;

    fn run(op: BitwiseOp, a: impl Into<Buffer>, b: impl Into<Buffer>) -> Buffer {
        bitwise(op, &a.into(), &b.into()).unwrap()
    }

    #[test]
    fn logic_on_integers_and_booleans() {
        let (a, b) = (vec![0b1100u8, 0xff, 0], vec![0b1010u8, 0x0f, 0]);
        assert_eq!(run(BitwiseOp::And, a.clone(), b.clone()), Buffer::from(vec![0b1000u8, 0x0f, 0]));
        assert_eq!(run(BitwiseOp::Or, a.clone(), b.clone()), Buffer::from(vec![0b1110u8, 0xff, 0]));
        assert_eq!(run(BitwiseOp::Xor, a.clone(), b), Buffer::from(vec![0b0110u8, 0xf0, 0]));
        assert_eq!(not(&Buffer::from(a)).unwrap(), Buffer::from(vec![0xf3u8, 0, 0xff]));
        assert_eq!(not(&Buffer::from(vec![-1i32, 5])).unwrap(), Buffer::from(vec![0i32, -6]));
        assert_eq!(not(&Buffer::from(vec![true, false])).unwrap(), Buffer::from(vec![false, true]));
        assert_eq!(run(BitwiseOp::Xor, vec![true, true], vec![true, false]), Buffer::from(vec![false, true]));
        let f = Buffer::from(vec![1.0f32]);
        assert_eq!(bitwise(BitwiseOp::And, &f, &f).unwrap_err(), "and is not defined on f32");
        let t = Buffer::from(vec![true]);
        assert_eq!(bitwise(BitwiseOp::ShiftLeft, &t, &t).unwrap_err(), "shift_left is not defined on i1");
    }

    #[test]
    fn shifts_past_the_width_give_zero_or_the_sign() {
        let x = vec![-8i32, 1, -1, 5, i32::MIN];
        let by = vec![1i32, 32, 33, -1, 31];
        assert_eq!(run(BitwiseOp::ShiftLeft, x.clone(), by.clone()), Buffer::from(vec![-16i32, 0, 0, 0, 0]));
        assert_eq!(
            run(BitwiseOp::ShiftRightArithmetic, x.clone(), by.clone()),
            Buffer::from(vec![-4i32, 0, -1, 0, -1])
        );
        assert_eq!(run(BitwiseOp::ShiftRightLogical, x, by), Buffer::from(vec![0x7fff_fffci32, 0, 0, 0, 1]));
        // Unsigned: logical fills zeros, arithmetic the top bit of the pattern.
        let u = vec![200u8, 255, 7, 128];
        let by = vec![1u8, 8, 9, 7];
        assert_eq!(run(BitwiseOp::ShiftRightLogical, u.clone(), by.clone()), Buffer::from(vec![100u8, 0, 0, 1]));
        assert_eq!(run(BitwiseOp::ShiftRightArithmetic, u.clone(), by.clone()), Buffer::from(vec![228u8, 255, 0, 255]));
        assert_eq!(run(BitwiseOp::ShiftLeft, u, by), Buffer::from(vec![144u8, 0, 0, 0]));
        let big = vec![i64::MIN, 3];
        assert_eq!(run(BitwiseOp::ShiftRightArithmetic, big.clone(), vec![64i64, 1]), Buffer::from(vec![-1i64, 1]));
        assert_eq!(run(BitwiseOp::ShiftLeft, big, vec![63i64, 62]), Buffer::from(vec![0i64, i64::MIN | (1 << 62)]));
    }

    #[test]
    fn bitcast_reads_little_endian_chunks() {
        let x = val("tensor<2xf32>", vec![0.0f32, 1.0]);
        let bytes = bitcast_convert(&x, &"tensor<2x4xi8>".parse().unwrap()).unwrap();
        assert_eq!(bytes, Buffer::from(vec![0i8, 0, 0, 0, 0, 0, -128, 63]));
        let pairs = val("tensor<2x2xi8>", vec![0i8, 60, 0, -64]);
        let halves = bitcast_convert(&pairs, &"tensor<2xf16>".parse().unwrap()).unwrap();
        assert_eq!(halves, Buffer::from(vec![half::f16::ONE, half::f16::from_f32(-2.0)]));
        let same = bitcast_convert(&val("tensor<2xi32>", vec![-1, 2]), &"tensor<2xui32>".parse().unwrap());
        assert_eq!(same.unwrap(), Buffer::from(vec![u32::MAX, 2]));
        assert!(bitcast_convert(&val("tensor<8xi1>", vec![true; 8]), &"tensor<ui8>".parse().unwrap()).is_err());
    }
}
