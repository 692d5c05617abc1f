//! Element types and tensor types: of checkpoint tensors, archive entries,
//! graph values and interpreter values alike.

use std::fmt;
use std::str::FromStr;

/// Element type of a tensor, spelled as in MLIR (`f32`, `i1`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16: f32's exponent range, 8 bits of precision.
    BF16,
    /// StableHLO's boolean (`i1`), produced by `compare`.
    I1,
    /// Signless integers, which StableHLO reads as signed (`si8`, ...).
    I8,
    /// Signless 16-bit integer.
    I16,
    /// Signless 32-bit integer.
    I32,
    /// Signless 64-bit integer.
    I64,
    /// Unsigned integers (`ui8`, ...), e.g. packed quantized weights.
    UI8,
    /// Unsigned 16-bit integer.
    UI16,
    /// Unsigned 32-bit integer.
    UI32,
}

impl DType {
    /// Every element type, in `as_str` order.
    pub const ALL: [DType; 11] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I1,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::UI8,
        DType::UI16,
        DType::UI32,
    ];

    /// `f32`, `f16` or `bf16`.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Signed or unsigned integers; not `i1`.
    pub fn is_integer(self) -> bool {
        self.is_signed_integer() || self.is_unsigned()
    }

    /// `i8` to `i64`.
    pub fn is_signed_integer(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// `ui8` to `ui32`.
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::UI8 | DType::UI16 | DType::UI32)
    }

    /// StableHLO's `num_bits`: 1 for `i1`.
    pub fn bit_width(self) -> usize {
        match self {
            DType::I1 => 1,
            _ => 8 * self.size_in_bytes(),
        }
    }

    /// Bytes per element in a dense buffer (`i1` is stored as one byte).
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::UI32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::UI16 => 2,
            DType::I1 | DType::I8 | DType::UI8 => 1,
            DType::I64 => 8,
        }
    }

    /// The smallest and largest value of an integer type (`i1`: 0 and 1).
    pub fn integer_bounds(self) -> Option<(i64, i64)> {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => None,
            DType::I1 => Some((0, 1)),
            DType::I64 => Some((i64::MIN, i64::MAX)),
            d if d.is_unsigned() => Some((0, (1 << d.bit_width()) - 1)),
            d => Some((-(1 << (d.bit_width() - 1)), (1 << (d.bit_width() - 1)) - 1)),
        }
    }

    /// The MLIR spelling: `f32`, `i1`, `ui8`.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I1 => "i1",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::UI8 => "ui8",
            DType::UI16 => "ui16",
            DType::UI32 => "ui32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL.into_iter().find(|d| d.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.as_str()).collect();
            format!("unknown element type '{s}' (expected one of {})", names.join(", "))
        })
    }
}

/// A dim whose size is known only when the function runs: `?` in text,
/// MLIR's `ShapedType::kDynamic`. kiln gives `?` one meaning per function:
/// every `?` is the same run-time size (the sequence length). That keeps
/// shape rules decidable without symbolic arithmetic: `?` equals `?`, a
/// reshape keeps its `?` dims, and an op that would make a different
/// run-time size (concatenating or padding along `?`) is rejected.
pub const DYNAMIC: usize = usize::MAX;

/// A ranked tensor type: `tensor<2x3xf32>`, or `tensor<1x?xi32>` with a
/// [`DYNAMIC`] dim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Dim sizes, slowest first; a [`DYNAMIC`] dim is `?`.
    pub shape: Vec<usize>,
    /// The element type.
    pub dtype: DType,
}

impl TensorType {
    /// A tensor of `shape` and `dtype`.
    pub fn new(shape: impl Into<Vec<usize>>, dtype: DType) -> Self {
        TensorType { shape: shape.into(), dtype }
    }

    /// Number of dims (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Saturates at `usize::MAX` (as does a dynamic type); shapes from
    /// untrusted text are checked with [`TensorType::checked_num_elements`]
    /// when they enter a graph.
    pub fn num_elements(&self) -> usize {
        self.checked_num_elements().unwrap_or(usize::MAX)
    }

    /// `None` on overflow or if a dim is [`DYNAMIC`].
    pub fn checked_num_elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |acc, &d| if d == DYNAMIC { None } else { acc.checked_mul(d) })
    }

    /// The product of the static dims (`None` on overflow): the element
    /// count per unit of each `?`.
    pub fn static_num_elements(&self) -> Option<usize> {
        self.shape.iter().filter(|&&d| d != DYNAMIC).try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Whether any dim is `?`.
    pub fn is_dynamic(&self) -> bool {
        self.shape.contains(&DYNAMIC)
    }

    /// How many dims are `?`.
    pub fn dynamic_rank(&self) -> usize {
        self.shape.iter().filter(|&&d| d == DYNAMIC).count()
    }

    /// This type with every `?` replaced by `size`.
    pub fn with_dynamic_size(&self, size: usize) -> Self {
        let shape = self.shape.iter().map(|&d| if d == DYNAMIC { size } else { d }).collect::<Vec<_>>();
        TensorType::new(shape, self.dtype)
    }

    /// The same shape with elements of `dtype`.
    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType::new(self.shape.clone(), dtype)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for &d in &self.shape {
            if d == DYNAMIC {
                f.write_str("?x")?;
            } else {
                write!(f, "{d}x")?;
            }
        }
        write!(f, "{}>", self.dtype)
    }
}

impl FromStr for TensorType {
    type Err = String;

    /// Parses `tensor<2x3xf32>`, `tensor<?x4xf32>` or `tensor<f32>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let inner = s
            .strip_prefix("tensor<")
            .and_then(|r| r.strip_suffix('>'))
            .ok_or_else(|| format!("expected a tensor type like tensor<2x3xf32>, found '{s}'"))?;
        let mut parts: Vec<&str> = inner.split('x').collect();
        let dtype: DType = parts.pop().unwrap_or_default().parse()?;
        let shape = parts
            .iter()
            .map(|p| match *p {
                "?" => Ok(DYNAMIC),
                _ => p
                    .parse::<usize>()
                    .ok()
                    .filter(|&d| d != DYNAMIC)
                    .ok_or_else(|| format!("bad dimension '{p}' in '{s}'")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TensorType { shape, dtype })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_type_round_trips() {
        for text in [
            "tensor<2x3xf32>",
            "tensor<i1>",
            "tensor<7xbf16>",
            "tensor<1x2x3x4xi64>",
            "tensor<4xui8>",
            "tensor<i16>",
            "tensor<1x?xi32>",
        ] {
            let ty: TensorType = text.parse().unwrap();
            assert_eq!(ty.to_string(), text);
        }
    }

    #[test]
    fn integer_bounds_follow_width_and_signedness() {
        assert_eq!(DType::I8.integer_bounds(), Some((-128, 127)));
        assert_eq!(DType::UI16.integer_bounds(), Some((0, 65535)));
        assert_eq!(DType::UI32.integer_bounds(), Some((0, u32::MAX as i64)));
        assert_eq!(DType::I64.integer_bounds(), Some((i64::MIN, i64::MAX)));
        assert_eq!(DType::BF16.integer_bounds(), None);
        assert_eq!(DType::I1.bit_width(), 1);
        assert!(DType::UI8.is_integer() && !DType::UI8.is_signed_integer() && !DType::I1.is_integer());
    }

    #[test]
    fn tensor_type_rejects_garbage() {
        assert!("tensor<2xq7>".parse::<TensorType>().is_err());
        assert!("tensor<axf32>".parse::<TensorType>().is_err());
        assert!("memref<2xf32>".parse::<TensorType>().is_err());
        assert!("tensor<18446744073709551615xf32>".parse::<TensorType>().is_err(), "usize::MAX is `?`'s spelling");
    }

    #[test]
    fn dynamic_dims_count_per_unit() {
        let ty: TensorType = "tensor<?x4x?xf32>".parse().unwrap();
        assert!(ty.is_dynamic());
        assert_eq!((ty.dynamic_rank(), ty.static_num_elements(), ty.checked_num_elements()), (2, Some(4), None));
        assert_eq!(ty.with_dynamic_size(3).to_string(), "tensor<3x4x3xf32>");
    }
}
