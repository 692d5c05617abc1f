//! Element-wise ops: unary math, binary arithmetic, convert, clamp, compare
//! and select.

use super::{each_buffer, each_dtype, keeps_first_max, keeps_first_min, not_defined, same, Buffer, Elem, Num, Value};
use crate::graph::ops::{BinaryOp, UnaryOp};
use crate::graph::{ComparisonDirection, DType};
use half::{bf16, f16};

fn map<T: Copy, U>(v: &[T], f: impl Fn(T) -> U) -> Vec<U> {
    v.iter().map(|&x| f(x)).collect()
}

fn zip<T: Copy, U>(a: &[T], b: &[T], f: impl Fn(T, T) -> U) -> Vec<U> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

fn float_unary(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Negate => -x,
        UnaryOp::Exponential => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Logistic => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Abs => x.abs(),
        // NaN and signed zeros are their own sign.
        UnaryOp::Sign if x == 0.0 || x.is_nan() => x,
        UnaryOp::Sign => x.signum(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::RoundNearestEven => x.round_ties_even(),
        // In f64, rounded once: as accurate as f32 results get.
        UnaryOp::Cosine => f64::from(x).cos() as f32,
        UnaryOp::Sine => f64::from(x).sin() as f32,
        UnaryOp::Erf => erf(f64::from(x)) as f32,
    }
}

/// The integer form of an op, in i64 (see `int_map`), if it has one.
fn int_unary(op: UnaryOp) -> Option<fn(i64) -> i64> {
    match op {
        UnaryOp::Negate => Some(i64::wrapping_neg),
        // |MIN| wraps to MIN, as two's complement `abs` does.
        UnaryOp::Abs => Some(i64::wrapping_abs),
        UnaryOp::Sign => Some(i64::signum),
        UnaryOp::Exponential
        | UnaryOp::Log
        | UnaryOp::Sqrt
        | UnaryOp::Rsqrt
        | UnaryOp::Tanh
        | UnaryOp::Logistic
        | UnaryOp::Floor
        | UnaryOp::RoundNearestEven
        | UnaryOp::Cosine
        | UnaryOp::Sine
        | UnaryOp::Erf => None,
    }
}

/// The Gauss error function to f64 accuracy, from the series
/// `erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n x (2x^2)^n / (1 * 3 * ... * (2n+1))`
/// (Abramowitz & Stegun 7.1.6). All its terms have one sign, so nothing
/// cancels; beyond |x| = 6, erf(x) is ±1 to within f64's precision.
fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let two_x2 = 2.0 * x * x;
    let (mut term, mut sum) = (x, x);
    // At most ~150 terms for |x| < 6: they grow until 2n + 1 > 2x^2, then fall fast.
    for n in 1..500 {
        term *= two_x2 / f64::from(2 * n + 1);
        sum += term;
        if term.abs() <= sum.abs() * f64::EPSILON / 4.0 {
            break;
        }
    }
    std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp() * sum
}

fn float_binary(op: BinaryOp, x: f32, y: f32) -> f32 {
    let pick = |keep_x: bool| if keep_x { x } else { y };
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Subtract => x - y,
        BinaryOp::Multiply => x * y,
        BinaryOp::Divide => x / y,
        BinaryOp::Maximum => pick(keeps_first_max(x.into(), y.into())),
        BinaryOp::Minimum => pick(keeps_first_min(x.into(), y.into())),
        BinaryOp::Power => f64::from(x).powf(f64::from(y)) as f32,
    }
}

/// Computed in i64 and narrowed by `int_zip`.
fn int_binary(op: BinaryOp, x: i64, y: i64) -> i64 {
    match op {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Subtract => x.wrapping_sub(y),
        BinaryOp::Multiply => x.wrapping_mul(y),
        // Truncates toward zero. StableHLO leaves x / 0 undefined; -1 is what
        // XLA defines, and MIN / -1 wraps to MIN.
        BinaryOp::Divide if y == 0 => -1,
        BinaryOp::Divide => x.wrapping_div(y),
        BinaryOp::Maximum => x.max(y),
        BinaryOp::Minimum => x.min(y),
        BinaryOp::Power => int_power(x, y),
    }
}

/// Square-and-multiply, wrapping. As in StableHLO's reference interpreter,
/// a negative exponent gives 0 unless the base is 1 or -1.
fn int_power(base: i64, exponent: i64) -> i64 {
    if exponent < 0 && base.unsigned_abs() != 1 {
        return 0;
    }
    let (mut base, mut e, mut result) = (base, exponent.unsigned_abs(), 1i64);
    while e > 0 {
        if e & 1 == 1 {
            result = result.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    result
}

/// An integer op computed in i64 and narrowed with `as`: wrapping in i64 and
/// then truncating equals wrapping in the narrow type (unsigned elements
/// widen with zeros, so their order and quotients are right too).
fn int_map<T: Elem>(v: &[T], f: impl Fn(i64) -> i64) -> Buffer {
    T::wrap(map(v, |x| T::from_num(Num::I(f(x.to_num().as_i64())))))
}

fn int_zip<T: Elem>(a: &[T], b: &Buffer, f: impl Fn(i64, i64) -> i64) -> Result<Buffer, String> {
    let wide = |x: T| x.to_num().as_i64();
    Ok(T::wrap(zip(a, same(a, b)?, |x, y| T::from_num(Num::I(f(wide(x), wide(y)))))))
}

pub(super) fn unary(op: UnaryOp, x: &Buffer) -> Result<Buffer, String> {
    Ok(match x {
        Buffer::F32(v) => Buffer::F32(map(v, |a| float_unary(op, a))),
        Buffer::F16(v) => Buffer::F16(map(v, |a| f16::from_f32(float_unary(op, a.to_f32())))),
        Buffer::BF16(v) => Buffer::BF16(map(v, |a| bf16::from_f32(float_unary(op, a.to_f32())))),
        Buffer::I1(_) => return Err(not_defined(op.name(), DType::I1)),
        _ => {
            let f = int_unary(op).ok_or_else(|| not_defined(op.name(), x.dtype()))?;
            each_buffer!(x, v => int_map(v, f))
        }
    })
}

pub(super) fn binary(op: BinaryOp, a: &Buffer, b: &Buffer) -> Result<Buffer, String> {
    let via_f32 = |x: f32, y: f32| float_binary(op, x, y);
    Ok(match a {
        Buffer::F32(x) => Buffer::F32(zip(x, same(x, b)?, via_f32)),
        Buffer::F16(x) => Buffer::F16(zip(x, same(x, b)?, |p, q| f16::from_f32(via_f32(p.to_f32(), q.to_f32())))),
        Buffer::BF16(x) => Buffer::BF16(zip(x, same(x, b)?, |p, q| bf16::from_f32(via_f32(p.to_f32(), q.to_f32())))),
        Buffer::I1(_) => return Err(not_defined(op.name(), DType::I1)),
        _ => return each_buffer!(a, x => int_zip(x, b, |p, q| int_binary(op, p, q))),
    })
}

/// Element type conversion with Rust `as` semantics (see `Elem::from_num`).
pub(super) fn convert(x: &Buffer, to: DType) -> Buffer {
    each_dtype!(to, T => each_buffer!(x, v => T::wrap(map(v, |e| T::from_num(e.to_num())))))
}

/// `min(max(operand, lo), hi)`; `lo` and `hi` are scalars or of the operand's shape.
pub(super) fn clamp(lo: &Value, x: &Value, hi: &Value) -> Result<Buffer, String> {
    // A scalar bound is read at index 0 for every element.
    let at = |bound: &Value, i: usize| if bound.ty.rank() == 0 { 0 } else { i };
    each_buffer!(&x.data, v => {
        let (l, h) = (same(v, &lo.data)?, same(v, &hi.data)?);
        let out = v.iter().enumerate().map(|(i, &e)| e.elem_max(l[at(lo, i)]).elem_min(h[at(hi, i)]));
        Ok(Elem::wrap(out.collect()))
    })
}

/// IEEE comparisons: with a NaN operand only `NE` is true.
pub(super) fn compare(direction: ComparisonDirection, a: &Buffer, b: &Buffer) -> Result<Buffer, String> {
    fn cmp<T: PartialOrd>(direction: ComparisonDirection, x: T, y: T) -> bool {
        match direction {
            ComparisonDirection::Eq => x == y,
            ComparisonDirection::Ne => x != y,
            ComparisonDirection::Ge => x >= y,
            ComparisonDirection::Gt => x > y,
            ComparisonDirection::Le => x <= y,
            ComparisonDirection::Lt => x < y,
        }
    }
    each_buffer!(a, x => Ok(Buffer::I1(zip(x, same(x, b)?, |p, q| cmp(direction, p, q)))))
}

/// `pred ? on_true : on_false`, with `pred` a scalar or of the branches' shape.
pub(super) fn select(pred: &Value, on_true: &Value, on_false: &Value) -> Result<Buffer, String> {
    let Buffer::I1(p) = &pred.data else {
        return Err(format!("pred must be i1, found {}", pred.ty));
    };
    let scalar = pred.ty.rank() == 0;
    each_buffer!(&on_true.data, t => {
        let f = same(t, &on_false.data)?;
        let out = (0..t.len()).map(|i| if p[if scalar { 0 } else { i }] { t[i] } else { f[i] });
        Ok(Elem::wrap(out.collect()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::tests::val;

    #[test]
    fn float_math() {
        let x = Buffer::from(vec![0.0f32, 1.0, 4.0]);
        assert_eq!(unary(UnaryOp::Negate, &x).unwrap(), Buffer::from(vec![-0.0f32, -1.0, -4.0]));
        assert_eq!(unary(UnaryOp::Sqrt, &x).unwrap(), Buffer::from(vec![0.0f32, 1.0, 2.0]));
        assert_eq!(unary(UnaryOp::Rsqrt, &x).unwrap(), Buffer::from(vec![f32::INFINITY, 1.0, 0.5]));
        assert_eq!(unary(UnaryOp::Logistic, &x).unwrap(), Buffer::from(vec![0.5f32, 0.7310586, 0.98201376]));
        assert_eq!(unary(UnaryOp::Log, &x).unwrap(), Buffer::from(vec![f32::NEG_INFINITY, 0.0, 4f32.ln()]));
        let y = Buffer::from(vec![2.0f32, -0.0, 8.0]);
        assert_eq!(binary(BinaryOp::Divide, &x, &y).unwrap(), Buffer::from(vec![0.0f32, f32::NEG_INFINITY, 0.5]));
        assert_eq!(binary(BinaryOp::Subtract, &x, &y).unwrap(), Buffer::from(vec![-2.0f32, 1.0, -4.0]));
    }

    #[test]
    fn erf_matches_reference_values() {
        // erf at 0.5, 1, 2, 3 and 5.5 to 16 digits (A&S table 7.1 / mpmath).
        let cases = [
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (5.5, 0.9999999999999927),
            (1e-10, 1.1283791670955126e-10),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() <= 1e-15 * want, "erf({x}) = {} vs {want}", erf(x));
            assert_eq!(erf(-x), -erf(x));
        }
        assert_eq!((erf(6.0), erf(f64::NEG_INFINITY)), (1.0, -1.0));
        assert!(erf(f64::NAN).is_nan() && erf(-0.0).is_sign_negative());
    }

    #[test]
    fn rounding_sign_and_trigonometry() {
        let x = Buffer::from(vec![-2.5f32, -0.5, -0.0, 0.5, 1.5, 2.5, f32::NAN]);
        let Buffer::F32(r) = unary(UnaryOp::RoundNearestEven, &x).unwrap() else { panic!() };
        assert_eq!(r[..6], [-2.0, -0.0, -0.0, 0.0, 2.0, 2.0]);
        let Buffer::F32(f) = unary(UnaryOp::Floor, &x).unwrap() else { panic!() };
        assert_eq!(f[..6], [-3.0, -1.0, -0.0, 0.0, 1.0, 2.0]);
        let Buffer::F32(s) = unary(UnaryOp::Sign, &x).unwrap() else { panic!() };
        assert!(s[2] == 0.0 && s[2].is_sign_negative() && s[6].is_nan());
        assert_eq!([s[0], s[3]], [-1.0, 1.0]);
        let Buffer::F32(a) = unary(UnaryOp::Abs, &x).unwrap() else { panic!() };
        assert!(a[2].is_sign_positive() && a[0] == 2.5);
        let t = Buffer::from(vec![0.0f32, std::f32::consts::FRAC_PI_2]);
        assert_eq!(unary(UnaryOp::Cosine, &t).unwrap(), Buffer::from(vec![1.0f32, -4.371139e-8]));
        assert_eq!(unary(UnaryOp::Sine, &t).unwrap(), Buffer::from(vec![0.0f32, 1.0]));
    }

    #[test]
    fn integer_abs_sign_and_power_wrap() {
        let a = Buffer::from(vec![-128i8, -3, 0, 7]);
        assert_eq!(unary(UnaryOp::Abs, &a).unwrap(), Buffer::from(vec![-128i8, 3, 0, 7]));
        assert_eq!(unary(UnaryOp::Sign, &a).unwrap(), Buffer::from(vec![-1i8, -1, 0, 1]));
        assert_eq!(unary(UnaryOp::Negate, &Buffer::from(vec![1u8, 0])).unwrap(), Buffer::from(vec![255u8, 0]));
        assert_eq!(unary(UnaryOp::Floor, &a).unwrap_err(), "floor is not defined on i8");
        // Negative exponents: 0 unless the base is 1 or -1.
        let base = Buffer::from(vec![2i32, -2, -1, 1, 0, 3, 2]);
        let exp = Buffer::from(vec![10i32, 3, -3, -5, -1, 0, 31]);
        assert_eq!(
            binary(BinaryOp::Power, &base, &exp).unwrap(),
            Buffer::from(vec![1024i32, -8, -1, 1, 0, 1, i32::MIN])
        );
        let u = binary(BinaryOp::Power, &Buffer::from(vec![3u8, 255]), &Buffer::from(vec![5u8, 2])).unwrap();
        assert_eq!(u, Buffer::from(vec![243u8, 1]));
        let p = binary(
            BinaryOp::Power,
            &Buffer::from(vec![2.0f32, -8.0, 4.0]),
            &Buffer::from(vec![0.5f32, 1.0 / 3.0, -0.5]),
        );
        let Buffer::F32(p) = p.unwrap() else { panic!() };
        assert!(p[0] == std::f32::consts::SQRT_2 && p[1].is_nan() && p[2] == 0.5);
    }

    #[test]
    fn unsigned_and_i16_arithmetic_wraps() {
        let a = Buffer::from(vec![250u8, 3, 7]);
        let b = Buffer::from(vec![10u8, 5, 0]);
        assert_eq!(binary(BinaryOp::Add, &a, &b).unwrap(), Buffer::from(vec![4u8, 8, 7]));
        assert_eq!(binary(BinaryOp::Subtract, &a, &b).unwrap(), Buffer::from(vec![240u8, 254, 7]));
        // Unsigned x / 0 is all ones, XLA's -1.
        assert_eq!(binary(BinaryOp::Divide, &a, &b).unwrap(), Buffer::from(vec![25u8, 0, 255]));
        assert_eq!(binary(BinaryOp::Maximum, &a, &b).unwrap(), Buffer::from(vec![250u8, 5, 7]));
        let big = Buffer::from(vec![u32::MAX, 1 << 31]);
        assert_eq!(
            binary(BinaryOp::Multiply, &big, &Buffer::from(vec![2u32, 2])).unwrap(),
            Buffer::from(vec![u32::MAX - 1, 0])
        );
        let h = Buffer::from(vec![i16::MAX]);
        assert_eq!(binary(BinaryOp::Add, &h, &Buffer::from(vec![1i16])).unwrap(), Buffer::from(vec![i16::MIN]));
        assert_eq!(
            convert(&Buffer::from(vec![-1.7f32, 300.0, 65535.9]), DType::UI16),
            Buffer::from(vec![0u16, 300, 65535])
        );
        assert_eq!(convert(&Buffer::from(vec![200u8]), DType::I8), Buffer::from(vec![-56i8]));
        assert_eq!(convert(&Buffer::from(vec![u32::MAX]), DType::F32), Buffer::from(vec![4294967296.0f32]));
    }

    #[test]
    fn half_precision_rounds_per_op() {
        // 1 + 2^-11 is not an f16: the sum rounds (to even) back to 1.
        let one = Buffer::from(vec![f16::ONE]);
        let tiny = Buffer::from(vec![f16::from_f32(2f32.powi(-11))]);
        assert_eq!(binary(BinaryOp::Add, &one, &tiny).unwrap(), one);
        let x = Buffer::from(vec![bf16::from_f32(2.0)]);
        assert_eq!(unary(UnaryOp::Exponential, &x).unwrap(), Buffer::from(vec![bf16::from_f32(7.375)]));
    }

    #[test]
    fn maximum_propagates_nan_and_orders_zeros() {
        let a = Buffer::from(vec![f32::NAN, 1.0, -0.0, 0.0]);
        let b = Buffer::from(vec![1.0f32, f32::NAN, 0.0, -0.0]);
        let Buffer::F32(max) = binary(BinaryOp::Maximum, &a, &b).unwrap() else { panic!() };
        assert!(max[0].is_nan() && max[1].is_nan());
        assert!(max[2] == 0.0 && max[2].is_sign_positive() && max[3].is_sign_positive());
        let Buffer::F32(min) = binary(BinaryOp::Minimum, &a, &b).unwrap() else { panic!() };
        assert!(min[2].is_sign_negative() && min[3].is_sign_negative());
    }

    #[test]
    fn integer_arithmetic_wraps_and_divides_toward_zero() {
        let a = Buffer::from(vec![127i8, -7, 7, -128, 5]);
        let b = Buffer::from(vec![1i8, 2, -2, -1, 0]);
        assert_eq!(binary(BinaryOp::Add, &a, &b).unwrap(), Buffer::from(vec![-128i8, -5, 5, 127, 5]));
        assert_eq!(binary(BinaryOp::Divide, &a, &b).unwrap(), Buffer::from(vec![127i8, -3, -3, -128, -1]));
        assert_eq!(unary(UnaryOp::Negate, &a).unwrap(), Buffer::from(vec![-127i8, 7, -7, -128, -5]));
        let big = Buffer::from(vec![i64::MIN]);
        assert_eq!(binary(BinaryOp::Divide, &big, &Buffer::from(vec![-1i64])).unwrap(), big);
        assert_eq!(unary(UnaryOp::Exponential, &a).unwrap_err(), "exponential is not defined on i8");
        let t = Buffer::from(vec![true]);
        assert_eq!(binary(BinaryOp::Add, &t, &t).unwrap_err(), "add is not defined on i1");
        assert_eq!(binary(BinaryOp::Add, &a, &t).unwrap_err(), "operand element types differ: i8 vs i1");
    }

    #[test]
    fn convert_truncates_saturates_and_wraps() {
        let f = Buffer::from(vec![-1.7f32, 2.9, 1e10, f32::NAN, -0.0]);
        assert_eq!(convert(&f, DType::I32), Buffer::from(vec![-1i32, 2, i32::MAX, 0, 0]));
        assert_eq!(convert(&f, DType::I8), Buffer::from(vec![-1i8, 2, 127, 0, 0]));
        assert_eq!(convert(&f, DType::I1), Buffer::from(vec![true, true, true, true, false]));
        assert_eq!(convert(&Buffer::from(vec![300i32, -1]), DType::I8), Buffer::from(vec![44i8, -1]));
        assert_eq!(convert(&Buffer::from(vec![true, false]), DType::F16), Buffer::from(vec![f16::ONE, f16::ZERO]));
        assert_eq!(convert(&Buffer::from(vec![2i64, 0]), DType::I1), Buffer::from(vec![true, false]));
        let f16s = convert(&Buffer::from(vec![65520.0f32, 1.0 / 3.0]), DType::F16);
        assert_eq!(f16s, Buffer::from(vec![f16::INFINITY, f16::from_f32(1.0 / 3.0)]));
        assert_eq!(convert(&f16s, DType::BF16), Buffer::from(vec![bf16::INFINITY, bf16::from_f32(0.33325195)]));
    }

    #[test]
    fn clamp_with_scalar_and_tensor_bounds() {
        let x = val("tensor<4xf32>", vec![-2.0f32, 0.5, 3.0, f32::NAN]);
        let lo = val("tensor<f32>", vec![-1.0f32]);
        let hi = val("tensor<4xf32>", vec![1.0f32, 0.0, 2.0, 1.0]);
        let Buffer::F32(out) = clamp(&lo, &x, &hi).unwrap() else { panic!() };
        assert_eq!(out[..3], [-1.0, 0.0, 2.0]);
        assert!(out[3].is_nan());
        let i = val("tensor<3xi32>", vec![-5, 5, 50]);
        let (l, h) = (val("tensor<i32>", vec![0]), val("tensor<i32>", vec![10]));
        assert_eq!(clamp(&l, &i, &h).unwrap(), Buffer::from(vec![0i32, 5, 10]));
    }

    #[test]
    fn compare_every_direction_with_nan() {
        let a = Buffer::from(vec![1.0f32, 2.0, f32::NAN]);
        let b = Buffer::from(vec![2.0f32, 2.0, f32::NAN]);
        let expect = [
            (ComparisonDirection::Eq, [false, true, false]),
            (ComparisonDirection::Ne, [true, false, true]),
            (ComparisonDirection::Ge, [false, true, false]),
            (ComparisonDirection::Gt, [false, false, false]),
            (ComparisonDirection::Le, [true, true, false]),
            (ComparisonDirection::Lt, [true, false, false]),
        ];
        for (d, want) in expect {
            assert_eq!(compare(d, &a, &b).unwrap(), Buffer::from(want.to_vec()), "{d:?}");
        }
        let ints = compare(ComparisonDirection::Lt, &Buffer::from(vec![-1i64, 3]), &Buffer::from(vec![0i64, 3]));
        assert_eq!(ints.unwrap(), Buffer::from(vec![true, false]));
    }

    #[test]
    fn select_with_scalar_and_tensor_pred() {
        let t = val("tensor<3xi32>", vec![1, 2, 3]);
        let f = val("tensor<3xi32>", vec![-1, -2, -3]);
        let p = val("tensor<3xi1>", vec![true, false, true]);
        assert_eq!(select(&p, &t, &f).unwrap(), Buffer::from(vec![1i32, -2, 3]));
        let p = val("tensor<i1>", vec![false]);
        assert_eq!(select(&p, &t, &f).unwrap(), f.data);
    }
}
