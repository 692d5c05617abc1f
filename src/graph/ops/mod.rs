//! Graph ops and their shape rules, one file per op family.
//!
//! The same file stems hold the family's lowering (`src/lower/`), its
//! reference semantics (`src/interp/`) and its lit tests (`test/lit/`).
//! Matches over [`Op`] have no `_ =>` arm, so a new op does not compile
//! until every stage handles it.

pub mod bitwise;
pub mod constant;
pub mod dequantize;
pub mod dot_general;
pub mod dynamic_slice;
pub mod elementwise;
pub mod gather;
pub mod layout;
pub mod reduce;

use super::{DType, ShapeError, TensorType};
use crate::weights::ggml::GgmlType;
use std::fmt;

pub use bitwise::BitwiseOp;
pub use dot_general::DotDimensions;
pub use elementwise::{BinaryOp, ComparisonDirection, UnaryOp};
pub use reduce::ReduceKind;

/// What a node computes: StableHLO ops plus `input`, `param` and the
/// composite `dequantize`. Attributes are fields; operands are the node's.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A function argument; its type is declared.
    Input,
    /// A named weight; becomes a `util.global`, never a function argument.
    Param {
        /// The checkpoint tensor name; nodes with one name are one param.
        name: String,
    },
    /// A splat constant of the declared type.
    Constant {
        /// The value of every element.
        value: f64,
    },
    /// Indices along `iota_dimension`, of the declared type.
    Iota {
        /// The dim whose index each element holds.
        iota_dimension: usize,
    },
    /// The indices `0..n` of a static `tensor<n x i32>`, lowered as a
    /// constant rather than an iota (whose `index`, fused into a reduction,
    /// IREE 3.13's Vulkan codegen cannot compile).
    Range,
    /// An element-wise op of one operand.
    Unary(UnaryOp),
    /// An element-wise op of two operands of one type.
    Binary(BinaryOp),
    /// Element type conversion to the declared type's dtype.
    Convert,
    /// The operand's bits as the declared type (see `bitwise::infer_bitcast_convert`).
    BitcastConvert,
    /// An element-wise `and`/`or`/`xor` or shift on integers (and `i1`).
    Bitwise(BitwiseOp),
    /// Bitwise (integers) or logical (`i1`) negation.
    Not,
    /// `clamp(min, operand, max)`.
    Clamp,
    /// Element-wise comparison to an `i1` tensor.
    Compare(ComparisonDirection),
    /// `select(pred, on_true, on_false)`.
    Select,
    /// To the declared shape, same element count.
    Reshape,
    /// Reorders the dims: result dim `i` is operand dim `permutation[i]`.
    Transpose {
        /// Operand dim of each result dim.
        permutation: Vec<usize>,
    },
    /// The same elements with the order along each of `dimensions` reversed.
    Reverse {
        /// The dims whose order is reversed.
        dimensions: Vec<usize>,
    },
    /// To the declared shape.
    BroadcastInDim {
        /// Result dim of each operand dim.
        broadcast_dimensions: Vec<usize>,
    },
    /// Joins the operands along `dimension`.
    Concatenate {
        /// The dim they are joined along.
        dimension: usize,
    },
    /// A strided window: per dim, `start..limit` by `stride`.
    Slice {
        /// First index per dim.
        start_indices: Vec<usize>,
        /// End (exclusive) per dim.
        limit_indices: Vec<usize>,
        /// Step per dim.
        strides: Vec<usize>,
    },
    /// `dynamic_slice(operand, start_indices...)`: one scalar index per dim.
    DynamicSlice {
        /// Size of the window per dim.
        slice_sizes: Vec<usize>,
    },
    /// `dynamic_update_slice(operand, update, start_indices...)`.
    DynamicUpdateSlice,
    /// `real_dynamic_slice(operand, start_indices, limit_indices, strides)`:
    /// a `slice` whose bounds are 1-D integer tensors computed at run time,
    /// to the declared type (a `?` dim where the size is not static).
    RealDynamicSlice,
    /// `pad(operand, padding_value)`.
    Pad {
        /// Padding before the first element, per dim.
        edge_padding_low: Vec<usize>,
        /// Padding after the last element, per dim.
        edge_padding_high: Vec<usize>,
        /// Padding between elements, per dim.
        interior_padding: Vec<usize>,
    },
    /// A general contraction: batch dims, then the free dims of `lhs`, then of `rhs`.
    DotGeneral(DotDimensions),
    /// Embedding row lookup: `operand[indices[...], :]`.
    Gather,
    /// Reduces `dimensions` away with a sum or a max.
    Reduce {
        /// The reduction.
        kind: ReduceKind,
        /// The dims reduced away.
        dimensions: Vec<usize>,
    },
    /// The i32 index of the maximum along `dimension`, which goes away: the
    /// first on ties; a NaN counts as the maximum.
    Argmax {
        /// The dim reduced away.
        dimension: usize,
    },
    /// ggml blocks (1-D `i8`/`ui8` bytes) to f32 of the declared shape.
    Dequantize {
        /// The blocks' ggml type.
        ggml: GgmlType,
    },
    /// `[rows, d1, ..., dk]` as tiles of `lanes` rows with the row
    /// innermost, the last dim reordered: `[ceil(rows / lanes), d1, ...,
    /// dk', lanes]`, element `[t, i1, ..., ik, l]` being operand element
    /// `[t · lanes + l, i1, ..., order[ik]]`, or zero past the last row. The
    /// layout `packed_matvec` reads: one vector load takes the same byte of
    /// `lanes` rows, and a block's bytes lie in the order it reads them.
    TileRows {
        /// Rows per tile.
        lanes: usize,
        /// The operand's last dim in the result's order, a permutation of
        /// it; empty keeps it.
        order: Vec<usize>,
    },
    /// `x [1, k]` f32 times the transpose of each of `n` packed `[rows, k]`
    /// matrices of one type, given as their blocks tiled by rows in the
    /// type's byte order ([`Op::TileRows`] with
    /// [`dequantize::packed_byte_order`]), `[tiles, blocks, type_size,
    /// lanes]` (operands: the
    /// `n` matrices, then `x`): `[n, tiles · lanes]` f32, row `i` from
    /// matrix `i` (rows past the matrix's last are those of zero blocks),
    /// dequantizing as it streams the blocks (a decode step's products;
    /// matrices that share `x` are streamed together).
    PackedMatvec {
        /// The blocks' ggml type.
        ggml: GgmlType,
    },
}

/// An attribute value in the graph text: `3`, `1.5`, `[1, 0]`, `LT`.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// A non-negative integer.
    Int(usize),
    /// A float.
    Float(f64),
    /// A list of dims or indices; `?` in it is [`super::DYNAMIC`].
    Ints(Vec<usize>),
    /// A bare word: `LT`, `sum`.
    Ident(String),
    /// A quoted string: a param name.
    Str(String),
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::Int(i) => write!(f, "{i}"),
            // `{:?}` prints the shortest text that parses back to the same f64.
            AttrValue::Float(x) => write!(f, "{x:?}"),
            AttrValue::Ints(v) => {
                let items: Vec<String> =
                    v.iter().map(|&i| if i == super::DYNAMIC { "?".to_string() } else { i.to_string() }).collect();
                write!(f, "[{}]", items.join(", "))
            }
            AttrValue::Ident(s) => f.write_str(s),
            AttrValue::Str(s) => f.write_str(&serde_json::to_string(s).map_err(|_| fmt::Error)?),
        }
    }
}

impl Op {
    /// The op's name in graph text (StableHLO's spelling where one exists).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "input",
            Op::Param { .. } => "param",
            Op::Constant { .. } => "constant",
            Op::Iota { .. } => "iota",
            Op::Range => "range",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Convert => "convert",
            Op::BitcastConvert => "bitcast_convert",
            Op::Bitwise(b) => b.name(),
            Op::Not => "not",
            Op::Clamp => "clamp",
            Op::Compare(_) => "compare",
            Op::Select => "select",
            Op::Reshape => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::TileRows { .. } => "tile_rows",
            Op::Reverse { .. } => "reverse",
            Op::BroadcastInDim { .. } => "broadcast_in_dim",
            Op::Concatenate { .. } => "concatenate",
            Op::Slice { .. } => "slice",
            Op::DynamicSlice { .. } => "dynamic_slice",
            Op::DynamicUpdateSlice => "dynamic_update_slice",
            Op::RealDynamicSlice => "real_dynamic_slice",
            Op::Pad { .. } => "pad",
            Op::DotGeneral(_) => "dot_general",
            Op::Gather => "gather",
            Op::Reduce { .. } => "reduce",
            Op::Argmax { .. } => "argmax",
            Op::Dequantize { .. } => "dequantize",
            Op::PackedMatvec { .. } => "packed_matvec",
        }
    }

    /// Ops whose result type is given by the caller rather than derived
    /// from the operands.
    pub fn takes_declared_type(&self) -> bool {
        matches!(
            self,
            Op::Input
                | Op::Param { .. }
                | Op::Constant { .. }
                | Op::Iota { .. }
                | Op::Range
                | Op::Convert
                | Op::BitcastConvert
                | Op::Reshape
                | Op::BroadcastInDim { .. }
                | Op::RealDynamicSlice
                | Op::Dequantize { .. }
        )
    }

    /// The shape rule: checks operands and returns the result type.
    pub fn infer(&self, operands: &[&TensorType], declared: Option<&TensorType>) -> Result<TensorType, ShapeError> {
        let op = self.name();
        // The operand count, or the least that a variadic op takes.
        let (arity, variadic) = match self {
            Op::Input | Op::Param { .. } | Op::Constant { .. } | Op::Iota { .. } | Op::Range => (0, false),
            Op::Unary(_)
            | Op::Convert
            | Op::BitcastConvert
            | Op::Not
            | Op::Reshape
            | Op::Transpose { .. }
            | Op::TileRows { .. }
            | Op::Reverse { .. }
            | Op::BroadcastInDim { .. }
            | Op::Slice { .. }
            | Op::Reduce { .. }
            | Op::Argmax { .. }
            | Op::Dequantize { .. } => (1, false),
            Op::Binary(_) | Op::Bitwise(_) | Op::Compare(_) | Op::Pad { .. } | Op::DotGeneral(_) | Op::Gather => {
                (2, false)
            }
            Op::Clamp | Op::Select => (3, false),
            Op::RealDynamicSlice => (4, false),
            Op::Concatenate { .. } => (0, true),
            Op::DynamicSlice { .. } => (1, true),
            Op::DynamicUpdateSlice | Op::PackedMatvec { .. } => (2, true),
        };
        if operands.len() < arity || (!variadic && operands.len() != arity) {
            let least = if variadic { "at least " } else { "" };
            return Err(ShapeError::new(
                op,
                "kiln",
                format!("expects {least}{arity} operands, got {}", operands.len()),
            ));
        }
        let declared = match (self.takes_declared_type(), declared) {
            (true, Some(d)) => Some(d),
            (true, None) => return Err(ShapeError::new(op, "kiln", "needs its result type written after ':'")),
            (false, _) => None,
        };
        if let Some(d) = declared {
            if d.static_num_elements().is_none() {
                return Err(ShapeError::new(op, "kiln", format!("the element count of {d} overflows")));
            }
        }
        if let (Op::Param { .. }, Some(d)) = (self, declared) {
            if d.is_dynamic() {
                return Err(ShapeError::new(op, "kiln", format!("a weight has a static type, found {d}")));
            }
        }
        let inferred = match self {
            Op::Input | Op::Param { .. } | Op::Constant { .. } => {
                Ok(declared.expect("checked above: declared-type op").clone())
            }
            Op::Iota { iota_dimension } => constant::infer_iota(*iota_dimension, declared.expect("declared-type op")),
            Op::Range => constant::infer_range(declared.expect("declared-type op")),
            Op::Unary(u) => elementwise::infer_unary(*u, operands[0]),
            Op::Binary(b) => elementwise::infer_binary(b.name(), operands[0], operands[1]),
            Op::Convert => elementwise::infer_convert(operands[0], declared.expect("declared-type op")),
            Op::BitcastConvert => bitwise::infer_bitcast_convert(operands[0], declared.expect("declared-type op")),
            Op::Bitwise(b) => bitwise::infer_bitwise(*b, operands[0], operands[1]),
            Op::Not => bitwise::infer_not(operands[0]),
            Op::Clamp => elementwise::infer_clamp(operands[0], operands[1], operands[2]),
            Op::Compare(_) => elementwise::infer_compare(operands[0], operands[1]),
            Op::Select => elementwise::infer_select(operands[0], operands[1], operands[2]),
            Op::Reshape => layout::infer_reshape(operands[0], declared.expect("declared-type op")),
            Op::Transpose { permutation } => layout::infer_transpose(operands[0], permutation),
            Op::TileRows { lanes, order } => layout::infer_tile_rows(operands[0], *lanes, order),
            Op::Reverse { dimensions } => layout::infer_reverse(operands[0], dimensions),
            Op::BroadcastInDim { broadcast_dimensions } => {
                layout::infer_broadcast_in_dim(operands[0], broadcast_dimensions, declared.expect("declared-type op"))
            }
            Op::Concatenate { dimension } => layout::infer_concatenate(operands, *dimension),
            Op::Slice { start_indices, limit_indices, strides } => {
                layout::infer_slice(operands[0], start_indices, limit_indices, strides)
            }
            Op::DynamicSlice { slice_sizes } => {
                dynamic_slice::infer_dynamic_slice(operands[0], &operands[1..], slice_sizes)
            }
            Op::DynamicUpdateSlice => {
                dynamic_slice::infer_dynamic_update_slice(operands[0], operands[1], &operands[2..])
            }
            Op::RealDynamicSlice => dynamic_slice::infer_real_dynamic_slice(
                operands[0],
                [operands[1], operands[2], operands[3]],
                declared.expect("declared-type op"),
            ),
            Op::Pad { edge_padding_low, edge_padding_high, interior_padding } => {
                layout::infer_pad(operands[0], operands[1], edge_padding_low, edge_padding_high, interior_padding)
            }
            Op::DotGeneral(dims) => dot_general::infer_dot_general(operands[0], operands[1], dims),
            Op::Gather => gather::infer_gather(operands[0], operands[1]),
            Op::Reduce { kind, dimensions } => reduce::infer_reduce(*kind, operands[0], dimensions),
            Op::Argmax { dimension } => reduce::infer_argmax(operands[0], *dimension),
            Op::Dequantize { ggml } => {
                dequantize::infer_dequantize(*ggml, operands[0], declared.expect("declared-type op"))
            }
            Op::PackedMatvec { ggml } => {
                let (x, matrices) = operands.split_last().expect("at least two operands");
                dequantize::infer_packed_matvec(*ggml, matrices, x)
            }
        }?;
        Ok(inferred)
    }

    /// Attributes as written in graph text, in a fixed order.
    pub fn attributes(&self) -> Vec<(&'static str, AttrValue)> {
        match self {
            Op::Input
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Convert
            | Op::BitcastConvert
            | Op::Bitwise(_)
            | Op::Not
            | Op::Clamp
            | Op::Select
            | Op::Range
            | Op::Reshape
            | Op::DynamicUpdateSlice
            | Op::RealDynamicSlice
            | Op::Gather => vec![],
            Op::Param { name } => vec![("name", AttrValue::Str(name.clone()))],
            Op::Constant { value } => vec![("value", AttrValue::Float(*value))],
            Op::Iota { iota_dimension } => vec![("iota_dimension", AttrValue::Int(*iota_dimension))],
            Op::Compare(d) => vec![("comparison_direction", AttrValue::Ident(d.as_str().into()))],
            Op::Transpose { permutation } => vec![("permutation", AttrValue::Ints(permutation.clone()))],
            Op::TileRows { lanes, order } => {
                vec![("lanes", AttrValue::Int(*lanes)), ("order", AttrValue::Ints(order.clone()))]
            }
            Op::Reverse { dimensions } => vec![("dimensions", AttrValue::Ints(dimensions.clone()))],
            Op::BroadcastInDim { broadcast_dimensions } => {
                vec![("broadcast_dimensions", AttrValue::Ints(broadcast_dimensions.clone()))]
            }
            Op::Concatenate { dimension } => vec![("dimension", AttrValue::Int(*dimension))],
            Op::Slice { start_indices, limit_indices, strides } => vec![
                ("start_indices", AttrValue::Ints(start_indices.clone())),
                ("limit_indices", AttrValue::Ints(limit_indices.clone())),
                ("strides", AttrValue::Ints(strides.clone())),
            ],
            Op::DynamicSlice { slice_sizes } => vec![("slice_sizes", AttrValue::Ints(slice_sizes.clone()))],
            Op::Pad { edge_padding_low, edge_padding_high, interior_padding } => vec![
                ("edge_padding_low", AttrValue::Ints(edge_padding_low.clone())),
                ("edge_padding_high", AttrValue::Ints(edge_padding_high.clone())),
                ("interior_padding", AttrValue::Ints(interior_padding.clone())),
            ],
            Op::DotGeneral(d) => vec![
                ("lhs_batching_dimensions", AttrValue::Ints(d.lhs_batching_dimensions.clone())),
                ("rhs_batching_dimensions", AttrValue::Ints(d.rhs_batching_dimensions.clone())),
                ("lhs_contracting_dimensions", AttrValue::Ints(d.lhs_contracting_dimensions.clone())),
                ("rhs_contracting_dimensions", AttrValue::Ints(d.rhs_contracting_dimensions.clone())),
            ],
            Op::Reduce { kind, dimensions } => vec![
                ("kind", AttrValue::Ident(kind.as_str().into())),
                ("dimensions", AttrValue::Ints(dimensions.clone())),
            ],
            Op::Argmax { dimension } => vec![("dimension", AttrValue::Int(*dimension))],
            Op::Dequantize { ggml } | Op::PackedMatvec { ggml } => {
                vec![("ggml_type", AttrValue::Ident(ggml.name().into()))]
            }
        }
    }

    /// Builds an op from its text name and attributes; the inverse of
    /// [`Op::name`] + [`Op::attributes`].
    pub fn from_parts(name: &str, mut attrs: Attrs) -> Result<Op, String> {
        let op = match name {
            "param" => Op::Param { name: attrs.str("name")? },
            "constant" => Op::Constant { value: attrs.float("value")? },
            "iota" => Op::Iota { iota_dimension: attrs.int("iota_dimension")? },
            "range" => Op::Range,
            "convert" => Op::Convert,
            "bitcast_convert" => Op::BitcastConvert,
            "not" => Op::Not,
            "clamp" => Op::Clamp,
            "compare" => Op::Compare(attrs.ident("comparison_direction")?.parse()?),
            "select" => Op::Select,
            "reshape" => Op::Reshape,
            "transpose" => Op::Transpose { permutation: attrs.ints("permutation")? },
            "tile_rows" => Op::TileRows { lanes: attrs.int("lanes")?, order: attrs.ints("order")? },
            "reverse" => Op::Reverse { dimensions: attrs.ints("dimensions")? },
            "broadcast_in_dim" => Op::BroadcastInDim { broadcast_dimensions: attrs.ints("broadcast_dimensions")? },
            "concatenate" => Op::Concatenate { dimension: attrs.int("dimension")? },
            "slice" => Op::Slice {
                start_indices: attrs.ints("start_indices")?,
                limit_indices: attrs.ints("limit_indices")?,
                strides: attrs.ints("strides")?,
            },
            "dynamic_slice" => Op::DynamicSlice { slice_sizes: attrs.ints("slice_sizes")? },
            "dynamic_update_slice" => Op::DynamicUpdateSlice,
            "real_dynamic_slice" => Op::RealDynamicSlice,
            "pad" => Op::Pad {
                edge_padding_low: attrs.ints("edge_padding_low")?,
                edge_padding_high: attrs.ints("edge_padding_high")?,
                interior_padding: attrs.ints("interior_padding")?,
            },
            "dot_general" => Op::DotGeneral(DotDimensions {
                lhs_batching_dimensions: attrs.ints("lhs_batching_dimensions")?,
                rhs_batching_dimensions: attrs.ints("rhs_batching_dimensions")?,
                lhs_contracting_dimensions: attrs.ints("lhs_contracting_dimensions")?,
                rhs_contracting_dimensions: attrs.ints("rhs_contracting_dimensions")?,
            }),
            "gather" => Op::Gather,
            "reduce" => Op::Reduce { kind: attrs.ident("kind")?.parse()?, dimensions: attrs.ints("dimensions")? },
            "argmax" => Op::Argmax { dimension: attrs.int("dimension")? },
            "dequantize" => Op::Dequantize { ggml: attrs.ident("ggml_type")?.parse()? },
            "packed_matvec" => Op::PackedMatvec { ggml: attrs.ident("ggml_type")?.parse()? },
            other => {
                if let Some(u) = UnaryOp::ALL.iter().find(|u| u.name() == other) {
                    Op::Unary(*u)
                } else if let Some(b) = BinaryOp::ALL.iter().find(|b| b.name() == other) {
                    Op::Binary(*b)
                } else if let Some(b) = BitwiseOp::ALL.iter().find(|b| b.name() == other) {
                    Op::Bitwise(*b)
                } else {
                    return Err(format!("unknown op '{other}'"));
                }
            }
        };
        attrs.finish(name)?;
        Ok(op)
    }
}

/// Attributes parsed from text, consumed by name; leftovers are an error.
#[derive(Debug, Default)]
pub struct Attrs(pub Vec<(String, AttrValue)>);

impl Attrs {
    fn take(&mut self, key: &str) -> Result<AttrValue, String> {
        let pos = self.0.iter().position(|(k, _)| k == key).ok_or_else(|| format!("missing attribute '{key}'"))?;
        Ok(self.0.remove(pos).1)
    }

    fn int(&mut self, key: &str) -> Result<usize, String> {
        match self.take(key)? {
            AttrValue::Int(i) => Ok(i),
            v => Err(format!("attribute '{key}' must be a non-negative integer, found {v}")),
        }
    }

    fn float(&mut self, key: &str) -> Result<f64, String> {
        match self.take(key)? {
            AttrValue::Float(x) => Ok(x),
            AttrValue::Int(i) => Ok(i as f64),
            v => Err(format!("attribute '{key}' must be a number, found {v}")),
        }
    }

    fn ints(&mut self, key: &str) -> Result<Vec<usize>, String> {
        match self.take(key)? {
            AttrValue::Ints(v) => Ok(v),
            v => Err(format!("attribute '{key}' must be a list like [0, 1], found {v}")),
        }
    }

    fn ident(&mut self, key: &str) -> Result<String, String> {
        match self.take(key)? {
            AttrValue::Ident(s) => Ok(s),
            v => Err(format!("attribute '{key}' must be a bare word, found {v}")),
        }
    }

    fn str(&mut self, key: &str) -> Result<String, String> {
        match self.take(key)? {
            AttrValue::Str(s) => Ok(s),
            v => Err(format!("attribute '{key}' must be a quoted string, found {v}")),
        }
    }

    fn finish(self, op: &str) -> Result<(), String> {
        match self.0.first() {
            Some((k, _)) => Err(format!("op '{op}' has no attribute '{k}'")),
            None => Ok(()),
        }
    }
}

/// Checks that `dims` are distinct and each `< rank`.
pub(crate) fn check_dims(
    op: &'static str,
    rule: &'static str,
    what: &str,
    dims: &[usize],
    rank: usize,
) -> Result<(), ShapeError> {
    for (i, &d) in dims.iter().enumerate() {
        if d >= rank {
            return Err(ShapeError::new(op, rule, format!("{what}[{i}] = {d} is out of bounds for rank {rank}")));
        }
        if dims[..i].contains(&d) {
            return Err(ShapeError::new(op, rule, format!("{what} has {d} twice: {dims:?}")));
        }
    }
    Ok(())
}

pub(crate) fn same_dtype(
    op: &'static str,
    rule: &'static str,
    a: &TensorType,
    b: &TensorType,
) -> Result<(), ShapeError> {
    if a.dtype != b.dtype {
        return Err(ShapeError::new(op, rule, format!("element types differ: {a} vs {b}")));
    }
    Ok(())
}

pub(crate) fn require_float(op: &'static str, t: &TensorType) -> Result<(), ShapeError> {
    if !t.dtype.is_float() {
        return Err(ShapeError::new(op, "C1", format!("operand must be a float tensor, found {t}")));
    }
    Ok(())
}

pub(crate) fn require_dtype(
    op: &'static str,
    rule: &'static str,
    t: &TensorType,
    dtype: DType,
) -> Result<(), ShapeError> {
    if t.dtype != dtype {
        return Err(ShapeError::new(op, rule, format!("expected element type {dtype}, found {t}")));
    }
    Ok(())
}
