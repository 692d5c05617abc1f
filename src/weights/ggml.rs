//! ggml tensor types: ids as in `ggml.h`, and block geometry (elements per
//! block, bytes per block) as ggml C's `block_*` structs. gguf-py's
//! `GGML_QUANT_SIZES` agrees except for Q8_1, where it says 40 bytes;
//! ggml C asserts `sizeof(block_q8_1) == 2*sizeof(ggml_half) + QK8_1` = 36.

use std::fmt;

/// A ggml tensor type: a plain element type or a block quantization.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 4-bit, blocks of 32 with an f16 scale.
    Q4_0,
    /// 4-bit, blocks of 32 with an f16 scale and minimum.
    Q4_1,
    /// 5-bit, blocks of 32 with an f16 scale.
    Q5_0,
    /// 5-bit, blocks of 32 with an f16 scale and minimum.
    Q5_1,
    /// 8-bit, blocks of 32 with an f16 scale.
    Q8_0,
    /// 8-bit, blocks of 32 with an f16 scale and the block's scaled sum.
    Q8_1,
    /// 2-bit K-quant: super-blocks of 256, 4-bit sub-block scales and minimums.
    Q2_K,
    /// 3-bit K-quant: super-blocks of 256, 6-bit sub-block scales.
    Q3_K,
    /// 4-bit K-quant: super-blocks of 256, 6-bit sub-block scales and minimums.
    Q4_K,
    /// 5-bit K-quant: super-blocks of 256, 6-bit sub-block scales and minimums.
    Q5_K,
    /// 6-bit K-quant: super-blocks of 256, 8-bit sub-block scales.
    Q6_K,
    /// 8-bit K-quant: super-blocks of 256 with an f32 scale and sums of 16.
    Q8_K,
    /// 2.06-bit i-quant: super-blocks of 256, groups of 8 from a 256-row
    /// grid, 7-bit sign patterns, 4-bit scales per 32.
    IQ2_XXS,
    /// 2.31-bit i-quant: IQ2_XXS with a 512-row grid and 4-bit scales per 16.
    IQ2_XS,
    /// 3.06-bit i-quant: super-blocks of 256, groups of 4 from a 256-row
    /// grid, 7-bit sign patterns, 4-bit scales per 32.
    IQ3_XXS,
    /// 1.56-bit i-quant: super-blocks of 256, groups of 8 from a 2048-row
    /// grid of {-1, 0, 1} shifted by ±1/8, 3-bit scales per 32.
    IQ1_S,
    /// 4-bit indices into a fixed non-linear table, blocks of 32 with an f16 scale.
    IQ4_NL,
    /// 3.44-bit i-quant: super-blocks of 256, groups of 4 from a 512-row
    /// grid, a sign bit per value, 4-bit scales per 32.
    IQ3_S,
    /// 2.56-bit i-quant: super-blocks of 256, groups of 8 from a 1024-row
    /// grid, a sign bit per value, 4-bit scales per 16.
    IQ2_S,
    /// IQ4_NL's table in super-blocks of 256 with 6-bit sub-block scales.
    IQ4_XS,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// 1.75-bit i-quant: IQ1_S's grid, a shift per group of 8, 3-bit scales
    /// per 16; the f16 scale is spread over the scales' top nibbles.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary {-1, 0, 1}, 1.69 bits: super-blocks of 256, five values per
    /// byte in base 3, an f16 scale.
    TQ1_0,
    /// Ternary {-1, 0, 1}, 2.06 bits: super-blocks of 256, four 2-bit values
    /// per byte, an f16 scale.
    TQ2_0,
    /// OCP microscaling fp4: blocks of 32 e2m1 values under one e8m0
    /// (power of two) scale.
    MXFP4,
}

/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;

/// `(type, ggml id, name, block_size, type_size)`: the one table.
const TABLE: [(GgmlType, u32, &str, usize, usize); 32] = [
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 2 + 16),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 2 + 2 + 16),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 2 + 4 + 16),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 2 + 2 + 4 + 16),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 2 + 32),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 2 + 2 + 32),
    (GgmlType::Q2_K, 10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    (GgmlType::Q3_K, 11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    (GgmlType::Q4_K, 12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
    (GgmlType::Q5_K, 13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
    (GgmlType::Q6_K, 14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
    (GgmlType::Q8_K, 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", QK_K, 2 + 3 * QK_K / 8),
    (GgmlType::IQ1_S, 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 2 + 16),
    (GgmlType::IQ3_S, 21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64),
    (GgmlType::IQ2_S, 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 32),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", QK_K, (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + 2),
    (GgmlType::TQ2_0, 35, "TQ2_0", QK_K, QK_K / 4 + 2),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 1 + 16),
];

impl GgmlType {
    /// Every type kiln knows, in ggml id order.
    pub const ALL: [GgmlType; TABLE.len()] = {
        let mut all = [GgmlType::F32; TABLE.len()];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].0;
            i += 1;
        }
        all
    };

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE.iter().find(|r| r.0 == self).expect("every GgmlType has a row in TABLE")
    }

    /// `None` for ids kiln does not know (including ones ggml has retired);
    /// callers name the tensor and the id in their error.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// The id `ggml.h` gives the type, as GGUF stores it.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name: `Q4_K`, `F16`.
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// Whether the type packs blocks of several elements.
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes of `n_elements` elements, or `None` if `n_elements` is not a
    /// whole number of blocks or the size overflows.
    pub fn byte_len(self, n_elements: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(self.type_size() as u64)
    }
}

impl std::str::FromStr for GgmlType {
    type Err = String;

    /// ggml's name, as [`GgmlType::name`] spells it.
    fn from_str(s: &str) -> Result<Self, String> {
        TABLE.iter().find(|r| r.2 == s).map(|r| r.0).ok_or_else(|| format!("unknown ggml type '{s}'"))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        use GgmlType as T;
        for (i, t) in GgmlType::ALL.iter().enumerate() {
            assert_eq!(GgmlType::from_id(t.id()), Some(*t));
            assert!(GgmlType::ALL[..i].iter().all(|o| o.id() != t.id()), "duplicate id {}", t.id());
        }
        // Sizes as in gguf-py's GGML_QUANT_SIZES.
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q2_K.type_size(), 84);
        assert_eq!(GgmlType::Q3_K.type_size(), 110);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::IQ4_XS.type_size(), 136);
        let new = [(T::IQ2_XXS, 66), (T::IQ2_XS, 74), (T::IQ3_XXS, 98), (T::IQ1_S, 50), (T::IQ3_S, 110)];
        let newer = [(T::IQ2_S, 82), (T::IQ1_M, 56), (T::TQ1_0, 54), (T::TQ2_0, 66), (T::MXFP4, 17)];
        for (t, type_size) in new.into_iter().chain(newer) {
            assert_eq!((t.type_size(), t.block_size()), (type_size, if t == T::MXFP4 { 32 } else { QK_K }), "{t}");
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::Q4_0.byte_len(64), Some(36));
        assert_eq!(GgmlType::Q4_0.byte_len(33), None);
        assert!(GgmlType::ALL.iter().all(|t| t.name().parse() == Ok(*t)));
        assert!("Q4_Z".parse::<GgmlType>().is_err());
    }
}
