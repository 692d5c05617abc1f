//! Element types and tensor types of graph values.

use std::fmt;
use std::str::FromStr;

/// Element type of a tensor, spelled as in MLIR (`f32`, `i1`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// StableHLO's boolean (`i1`), produced by `compare`.
    I1,
    I8,
    I32,
    I64,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I1,
        DType::I8,
        DType::I32,
        DType::I64,
    ];

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn is_integer(self) -> bool {
        matches!(self, DType::I8 | DType::I32 | DType::I64)
    }

    /// Bytes per element in a dense buffer (`i1` is stored as one byte).
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I1 | DType::I8 => 1,
            DType::I64 => 8,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I1 => "i1",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I64 => "i64",
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
        DType::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| format!("unknown element type '{s}' (expected one of f32, f16, bf16, i1, i8, i32, i64)"))
    }
}

/// A ranked tensor type with static dims: `tensor<2x3xf32>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl TensorType {
    pub fn new(shape: impl Into<Vec<usize>>, dtype: DType) -> Self {
        TensorType { shape: shape.into(), dtype }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Saturates at `usize::MAX`; shapes from untrusted text are checked
    /// with [`TensorType::checked_num_elements`] when they enter a graph.
    pub fn num_elements(&self) -> usize {
        self.checked_num_elements().unwrap_or(usize::MAX)
    }

    pub fn checked_num_elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType::new(self.shape.clone(), dtype)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.dtype)
    }
}

impl FromStr for TensorType {
    type Err = String;

    /// Parses `tensor<2x3xf32>` or `tensor<f32>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let inner = s
            .strip_prefix("tensor<")
            .and_then(|r| r.strip_suffix('>'))
            .ok_or_else(|| format!("expected a tensor type like tensor<2x3xf32>, found '{s}'"))?;
        let mut parts: Vec<&str> = inner.split('x').collect();
        let dtype: DType = parts.pop().unwrap_or_default().parse()?;
        let shape = parts
            .iter()
            .map(|p| p.parse::<usize>().map_err(|_| format!("bad dimension '{p}' in '{s}'")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TensorType { shape, dtype })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_type_round_trips() {
        for text in ["tensor<2x3xf32>", "tensor<i1>", "tensor<7xbf16>", "tensor<1x2x3x4xi64>"] {
            let ty: TensorType = text.parse().unwrap();
            assert_eq!(ty.to_string(), text);
        }
    }

    #[test]
    fn tensor_type_rejects_garbage() {
        assert!("tensor<2xq7>".parse::<TensorType>().is_err());
        assert!("tensor<axf32>".parse::<TensorType>().is_err());
        assert!("memref<2xf32>".parse::<TensorType>().is_err());
    }
}
