//! The reference interpreter: runs a [`Graph`] on the CPU with naive loops.
//!
//! It is the oracle IREE's results are checked against, so each op is a
//! small index loop written for clarity, following StableHLO `docs/spec.md`.
//! Like StableHLO's reference interpreter it trusts each node's result type
//! (`Node::ty`) and never re-derives shapes: the graph's shape rules already
//! did. Op families live in files with the same stems as `graph/ops`.
//!
//! Numerics, per op:
//! - f16/bf16 compute in f32 and round to the storage type once per op;
//! - integer arithmetic wraps; `x / 0` is `-1` and `MIN / -1` is `MIN` (the
//!   results XLA defines; StableHLO leaves them undefined); shifting by the
//!   bit width or more (or by a negative amount, read as unsigned) gives 0,
//!   or the sign for `shift_right_arithmetic`, as StableHLO and IREE do;
//! - float -> integer `convert` truncates toward zero and saturates, NaN -> 0
//!   (Rust's `as`). Out of range, IREE on x86 differs: it yields the
//!   `cvttss2si` "integer indefinite" pattern (f32 -> i32 of 1e10, -1e10 or
//!   NaN is `i32::MIN`; -1.7 -> ui32 is 4294967295) and narrow types clamp
//!   that, so tests keep conversions in range;
//! - transcendental ops new to kiln (`cosine`, `sine`, `erf`, `power`) run
//!   in f64 and round once;
//! - sums (`dot_general`, `reduce sum`) accumulate floats in f64 and integers
//!   in wrapping i64, in row-major order, rounding once at the end, so the
//!   reference is deterministic and at least as accurate as any backend;
//! - `maximum`/`minimum` are IEEE 754-2019's: NaN propagates, `-0 < +0`.

mod bitwise;
mod constant;
mod dequantize;
mod dot_general;
mod dynamic_slice;
mod elementwise;
mod gather;
mod layout;
mod params;
mod reduce;

use crate::graph::{DType, Graph, Node, Op, TensorType, DYNAMIC};
use half::{bf16, f16};
use std::num::Wrapping;
use std::ops::{Add, Mul, Range};
use thiserror::Error;

/// Matches every [`Buffer`] variant, binding its typed slice to `$v`;
/// `$body` is compiled once per element type.
macro_rules! each_buffer {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            Buffer::F32($v) => $body,
            Buffer::F16($v) => $body,
            Buffer::BF16($v) => $body,
            Buffer::I1($v) => $body,
            Buffer::I8($v) => $body,
            Buffer::I16($v) => $body,
            Buffer::I32($v) => $body,
            Buffer::I64($v) => $body,
            Buffer::UI8($v) => $body,
            Buffer::UI16($v) => $body,
            Buffer::UI32($v) => $body,
        }
    };
}

/// Matches every [`DType`], naming its Rust element type `$t` in `$body`.
macro_rules! each_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F16 => {
                type $t = f16;
                $body
            }
            DType::BF16 => {
                type $t = bf16;
                $body
            }
            DType::I1 => {
                type $t = bool;
                $body
            }
            DType::I8 => {
                type $t = i8;
                $body
            }
            DType::I16 => {
                type $t = i16;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::UI8 => {
                type $t = u8;
                $body
            }
            DType::UI16 => {
                type $t = u16;
                $body
            }
            DType::UI32 => {
                type $t = u32;
                $body
            }
        }
    };
}

// Paths for the op files (`use super::each_buffer`).
use {each_buffer, each_dtype};

pub use params::{CachedParams, ParamSource};

/// Dense row-major elements of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum Buffer {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f16` elements.
    F16(Vec<f16>),
    /// `bf16` elements.
    BF16(Vec<bf16>),
    /// `i1` elements.
    I1(Vec<bool>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `ui8` elements.
    UI8(Vec<u8>),
    /// `ui16` elements.
    UI16(Vec<u16>),
    /// `ui32` elements.
    UI32(Vec<u32>),
}

impl Buffer {
    /// The element type the variant holds.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::F32(_) => DType::F32,
            Buffer::F16(_) => DType::F16,
            Buffer::BF16(_) => DType::BF16,
            Buffer::I1(_) => DType::I1,
            Buffer::I8(_) => DType::I8,
            Buffer::I16(_) => DType::I16,
            Buffer::I32(_) => DType::I32,
            Buffer::I64(_) => DType::I64,
            Buffer::UI8(_) => DType::UI8,
            Buffer::UI16(_) => DType::UI16,
            Buffer::UI32(_) => DType::UI32,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each_buffer!(self, v => v.len())
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tensor value: `data.len() == ty.num_elements()`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// Shape and element type; static (a `?` is bound to its size).
    pub ty: TensorType,
    /// The elements.
    pub data: Buffer,
}

impl Value {
    /// Checks that `data` has `ty`'s dtype and element count.
    pub fn new(ty: TensorType, data: Buffer) -> Result<Self, InterpError> {
        let v = Value { ty, data };
        v.check().map_err(|message| InterpError::BadValue { what: format!("value of type {}", v.ty), message })?;
        Ok(v)
    }

    /// Reads little-endian elements (`i1` as one byte each, nonzero = true).
    pub fn from_le_bytes(ty: &TensorType, bytes: &[u8]) -> Result<Value, InterpError> {
        let size = ty.dtype.size_in_bytes();
        // Checked: `ty` may come from a hostile file header.
        let expected = checked_num_elements(&ty.shape).and_then(|n| n.checked_mul(size));
        if expected != Some(bytes.len()) {
            let message = match expected {
                Some(e) => format!("{e} bytes expected, got {}", bytes.len()),
                None => "element count overflows".to_string(),
            };
            return Err(InterpError::BadValue { what: format!("value of type {ty}"), message });
        }
        let data = each_dtype!(ty.dtype, T => T::wrap(bytes.chunks_exact(size).map(T::read_le).collect()));
        Ok(Value { ty: ty.clone(), data })
    }

    /// The same values as `dtype`, by `convert`'s rules.
    pub fn convert(&self, dtype: DType) -> Value {
        Value { ty: self.ty.with_dtype(dtype), data: elementwise::convert(&self.data, dtype) }
    }

    /// The elements' memory as little-endian bytes, without a copy: what
    /// [`crate::lower::ParamInit::Inline`] takes, so a module can alias a
    /// value built in memory. Equal to [`Value::to_le_bytes`]; only on
    /// little-endian hosts, where the two are the same memory.
    #[cfg(target_endian = "little")]
    pub fn as_le_bytes(&self) -> &[u8] {
        // SAFETY: every element type is plain data without padding (f16 and
        // bf16 are `repr(transparent)` u16s; a bool is one byte, 0 or 1, as
        // `i1` is stored), so its initialized memory is valid as bytes, and
        // the slice borrows `self`.
        each_buffer!(&self.data, v => unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v.as_slice()))
        })
    }

    /// The elements as little-endian bytes (`i1` as one byte each, 0 or 1).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() * self.ty.dtype.size_in_bytes());
        each_buffer!(&self.data, v => v.iter().for_each(|x| x.write_le(&mut out)));
        out
    }

    /// Every element as f64 (exact for all but i64 beyond 2^53); for comparing results.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        each_buffer!(&self.data, v => v.iter().map(|x| x.to_num().as_f64()).collect())
    }

    /// Deterministic test data: floats uniform in [-1, 1) on a grid the dtype
    /// represents exactly (so rounding never reaches 1), integers uniform in
    /// `int_range` (wrapped into the dtype if it does not fit), i1 fair coins.
    pub fn random(ty: &TensorType, seed: u64, int_range: Range<i64>) -> Value {
        let mut state = seed;
        // Bits of precision: steps of 2^(1-p) on [-1, 1) are exact in the dtype.
        let p = match ty.dtype {
            DType::F16 => 11,
            DType::BF16 => 8,
            _ => 24,
        };
        let span = (int_range.end as i128 - int_range.start as i128).max(1) as u128;
        let mut next = || {
            let r = splitmix64(&mut state);
            match ty.dtype {
                d if d.is_float() => Num::F((r >> (64 - p)) as f64 * 2f64.powi(1 - p) - 1.0),
                DType::I1 => Num::I((r >> 63) as i64),
                _ => Num::I((int_range.start as i128 + (r as u128 % span) as i128) as i64),
            }
        };
        let n = ty.num_elements();
        let data = each_dtype!(ty.dtype, T => T::wrap((0..n).map(|_| T::from_num(next())).collect()));
        Value { ty: ty.clone(), data }
    }

    /// Whether `data` fits `ty`; the message says how it does not.
    fn check(&self) -> Result<(), String> {
        if self.data.dtype() != self.ty.dtype {
            return Err(format!("buffer holds {} elements", self.data.dtype()));
        }
        match checked_num_elements(&self.ty.shape) {
            Some(n) if n == self.data.len() => {}
            Some(n) => return Err(format!("buffer holds {} elements, the type needs {n}", self.data.len())),
            None => return Err("the element count overflows".into()),
        }
        Ok(())
    }
}

/// Why the interpreter could not run a graph; each names the value, input, param or node.
#[derive(Debug, Error)]
pub enum InterpError {
    /// A value's buffer does not fit its type.
    #[error("{what}: {message}")]
    BadValue {
        /// The value.
        what: String,
        /// How it does not fit.
        message: String,
    },
    /// Not as many inputs as the graph takes.
    #[error("the graph takes {expected} inputs, got {got}")]
    InputCount {
        /// The graph's input count.
        expected: usize,
        /// The count given.
        got: usize,
    },
    /// An input's dtype or rank differs from the graph's.
    #[error("input {index} (%{name}) must be {expected}, got {got}")]
    InputType {
        /// Which input.
        index: usize,
        /// Its node name.
        name: String,
        /// The graph's type.
        expected: TensorType,
        /// The type given.
        got: TensorType,
    },
    /// An input's `?` dim is a different size from an earlier one's: every `?`
    /// in a function is one size.
    #[error("input {index} (%{name}) has {got} where the graph has ?, but an earlier input bound ? to {}", .bound.unwrap_or_default())]
    DynamicSize {
        /// Which input.
        index: usize,
        /// Its node name.
        name: String,
        /// Its size for `?`.
        got: usize,
        /// The size an earlier input gave `?`.
        bound: Option<usize>,
    },
    /// A param is not in the [`ParamSource`].
    #[error("param \"{name}\" is missing from the weights")]
    MissingParam {
        /// The param name.
        name: String,
    },
    /// A param's weights have another type than the graph declares.
    #[error("param \"{name}\" is declared as {expected} but the weights hold {found}")]
    ParamType {
        /// The param name.
        name: String,
        /// The graph's type.
        expected: TensorType,
        /// What the weights hold.
        found: String,
    },
    /// A param's weights could not be read.
    #[error("param \"{name}\": {message}")]
    Param {
        /// The param name.
        name: String,
        /// Why.
        message: String,
    },
    /// An op cannot run on its operands' values.
    #[error("node %{node} ({op}): {message}")]
    Op {
        /// The node's name.
        node: String,
        /// Its op.
        op: &'static str,
        /// Why.
        message: String,
    },
}

/// Evaluates `graph` on `inputs` (in the order of `graph.inputs()`), reading
/// weights from `params`; returns the graph's outputs.
pub fn run(graph: &Graph, inputs: &[Value], params: &dyn ParamSource) -> Result<Vec<Value>, InterpError> {
    if inputs.len() != graph.inputs().len() {
        return Err(InterpError::InputCount { expected: graph.inputs().len(), got: inputs.len() });
    }
    // Every `?` in the graph is one run-time size, taken from the inputs
    // (or, without a dynamic input, from a `real_dynamic_slice` below).
    let mut dynamic_size = None;
    for (index, (v, &id)) in inputs.iter().zip(graph.inputs()).enumerate() {
        let node = graph.node(id);
        let mismatch =
            || InterpError::InputType { index, name: node.name.clone(), expected: node.ty.clone(), got: v.ty.clone() };
        if v.ty.dtype != node.ty.dtype || v.ty.rank() != node.ty.rank() {
            return Err(mismatch());
        }
        for (&want, &got) in node.ty.shape.iter().zip(&v.ty.shape) {
            if want == DYNAMIC {
                if *dynamic_size.get_or_insert(got) != got {
                    return Err(InterpError::DynamicSize { index, name: node.name.clone(), got, bound: dynamic_size });
                }
            } else if want != got {
                return Err(mismatch());
            }
        }
        v.check()
            .map_err(|message| InterpError::BadValue { what: format!("input {index} (%{})", node.name), message })?;
    }
    // Each value is dropped after its last use, so peak memory is the live set
    // rather than every intermediate of the model.
    let nodes = graph.nodes();
    let mut last_use: Vec<usize> = (0..nodes.len()).collect();
    for (i, node) in nodes.iter().enumerate() {
        node.operands.iter().for_each(|o| last_use[o.0] = i);
    }
    graph.outputs().iter().for_each(|o| last_use[o.0] = usize::MAX);

    let mut values: Vec<Option<Value>> = Vec::with_capacity(nodes.len());
    // Input nodes appear in the order of `graph.inputs()`.
    let mut next_input = inputs.iter();
    for (i, node) in nodes.iter().enumerate() {
        let value = eval(node, &values, &mut next_input, params, dynamic_size)?;
        // In a function without a dynamic input, the first `?` result of a
        // `real_dynamic_slice` gives `?` its size.
        if dynamic_size.is_none() && matches!(node.op, Op::RealDynamicSlice) {
            dynamic_size = node.ty.shape.iter().position(|&d| d == DYNAMIC).map(|d| value.ty.shape[d]);
        }
        values.push(Some(value));
        for id in node.operands.iter().map(|o| o.0).chain([i]) {
            if last_use[id] == i {
                values[id] = None;
            }
        }
    }
    Ok(graph.outputs().iter().map(|o| values[o.0].clone().expect("outputs are never dropped")).collect())
}

/// Evaluates one node from the values before it.
fn eval(
    node: &Node,
    values: &[Option<Value>],
    next_input: &mut std::slice::Iter<'_, Value>,
    params: &dyn ParamSource,
    dynamic_size: Option<usize>,
) -> Result<Value, InterpError> {
    let arg = |k: usize| -> &Value {
        values[node.operands[k].0]
            .as_ref()
            .expect("operands are evaluated before their users and dropped after their last use")
    };
    let op_err = |message: String| InterpError::Op { node: node.name.clone(), op: node.op.name(), message };
    let concrete;
    let ty = match dynamic_size {
        Some(size) if node.ty.is_dynamic() => {
            concrete = node.ty.with_dynamic_size(size);
            &concrete
        }
        _ => &node.ty,
    };
    let data = match &node.op {
        Op::Input => return Ok(next_input.next().expect("input count checked in run").clone()),
        Op::Param { name } => return load_param(params, name, ty),
        Op::Constant { value } => Ok(constant::constant(*value, ty)),
        Op::Iota { iota_dimension } => Ok(constant::iota(*iota_dimension, ty)),
        Op::Range => Ok(constant::iota(0, ty)),
        Op::Unary(op) => elementwise::unary(*op, &arg(0).data),
        Op::Binary(op) => elementwise::binary(*op, &arg(0).data, &arg(1).data),
        Op::Convert => Ok(elementwise::convert(&arg(0).data, ty.dtype)),
        Op::BitcastConvert => bitwise::bitcast_convert(arg(0), ty),
        Op::Bitwise(op) => bitwise::bitwise(*op, &arg(0).data, &arg(1).data),
        Op::Not => bitwise::not(&arg(0).data),
        Op::Clamp => elementwise::clamp(arg(0), arg(1), arg(2)),
        Op::Compare(direction) => elementwise::compare(*direction, &arg(0).data, &arg(1).data),
        Op::Select => elementwise::select(arg(0), arg(1), arg(2)),
        // Row-major data reinterpreted under the new shape.
        Op::Reshape => Ok(arg(0).data.clone()),
        Op::Transpose { permutation } => Ok(layout::transpose(arg(0), permutation)),
        Op::TileRows { lanes, order } => layout::tile_rows(arg(0), *lanes, order, ty),
        Op::Reverse { dimensions } => Ok(layout::reverse(arg(0), dimensions)),
        Op::BroadcastInDim { broadcast_dimensions } => Ok(layout::broadcast_in_dim(arg(0), broadcast_dimensions, ty)),
        Op::Concatenate { dimension } => {
            let inputs: Vec<&Value> = (0..node.operands.len()).map(arg).collect();
            layout::concatenate(&inputs, *dimension)
        }
        Op::Slice { start_indices, strides, .. } => Ok(layout::slice(arg(0), start_indices, strides, ty)),
        Op::DynamicSlice { .. } => {
            let start_indices: Vec<&Value> = (1..node.operands.len()).map(arg).collect();
            dynamic_slice::dynamic_slice(arg(0), &start_indices, ty)
        }
        Op::DynamicUpdateSlice => {
            let start_indices: Vec<&Value> = (2..node.operands.len()).map(arg).collect();
            dynamic_slice::dynamic_update_slice(arg(0), arg(1), &start_indices)
        }
        // Its shape comes from its operands' values, not from the node.
        Op::RealDynamicSlice => {
            return dynamic_slice::real_dynamic_slice(arg(0), [arg(1), arg(2), arg(3)], &node.ty, dynamic_size)
                .map_err(op_err)
        }
        Op::Pad { edge_padding_low, interior_padding, .. } => {
            layout::pad(arg(0), arg(1), edge_padding_low, interior_padding, ty)
        }
        Op::DotGeneral(dims) => dot_general::dot_general(arg(0), arg(1), dims, ty),
        Op::Gather => gather::gather(arg(0), arg(1)),
        Op::Reduce { kind, dimensions } => Ok(reduce::reduce(*kind, arg(0), dimensions, ty)),
        Op::Argmax { dimension } => Ok(reduce::argmax(arg(0), *dimension, ty)),
        Op::Dequantize { ggml } => dequantize::dequantize(*ggml, arg(0)),
        Op::PackedMatvec { ggml } => {
            let matrices: Vec<&Value> = (0..node.operands.len() - 1).map(arg).collect();
            dequantize::packed_matvec(*ggml, &matrices, arg(node.operands.len() - 1))
        }
    }
    .map_err(op_err)?;
    let value = Value { ty: ty.clone(), data };
    value.check().map_err(|m| op_err(format!("interpreter bug: the result does not fit {ty}: {m}")))?;
    Ok(value)
}

/// A param from `params`, re-checked: the source is outside the graph's control.
fn load_param(params: &dyn ParamSource, name: &str, ty: &TensorType) -> Result<Value, InterpError> {
    let v = params.param(name, ty)?;
    if v.ty != *ty {
        return Err(InterpError::ParamType { name: name.to_string(), expected: ty.clone(), found: v.ty.to_string() });
    }
    v.check().map_err(|message| InterpError::Param { name: name.to_string(), message })?;
    Ok(v)
}

/// `shape`'s element count, or `None` if it overflows `usize`.
pub(crate) fn checked_num_elements(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// Row-major strides: element `i` of a tensor of `shape` is at `Σ i[d] * strides[d]`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (1..shape.len()).rev() {
        s[d - 1] = s[d] * shape[d];
    }
    s
}

/// `base + Σ i[d] * strides[d]` for every index `i` of `shape`, in row-major
/// order. With an operand's strides rearranged, this is how every layout op
/// finds the element each result element reads.
fn strided_offsets(shape: &[usize], strides: &[usize], base: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(shape.iter().product());
    if shape.contains(&0) {
        return out;
    }
    let (mut index, mut offset) = (vec![0; shape.len()], base);
    loop {
        out.push(offset);
        // Odometer step: bump the last dim, carrying into earlier ones.
        let mut d = shape.len();
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            offset += strides[d];
            if index[d] < shape[d] {
                break;
            }
            offset -= strides[d] * shape[d];
            index[d] = 0;
        }
    }
}

/// `x[i]` for each `i` in `offsets`: the data movement of every layout op.
fn take(x: &Buffer, offsets: &[usize]) -> Buffer {
    each_buffer!(x, v => Elem::wrap(offsets.iter().map(|&i| v[i]).collect()))
}

/// `b`'s elements if it has the same element type as `like`; operands of one
/// op share a dtype in a well-typed graph.
/// (`_like` only names `T`.)
fn same<'b, T: Elem>(_like: &[T], b: &'b Buffer) -> Result<&'b [T], String> {
    T::slice(b).ok_or_else(|| format!("operand element types differ: {} vs {}", T::DTYPE, b.dtype()))
}

fn not_defined(op: &str, dtype: DType) -> String {
    format!("{op} is not defined on {dtype}")
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A scalar widened so that any dtype converts through it exactly: floats
/// (at most f32 precision) fit f64, integers fit i64.
#[derive(Clone, Copy, Debug)]
enum Num {
    F(f64),
    I(i64),
}

impl Num {
    fn as_f64(self) -> f64 {
        match self {
            Num::F(x) => x,
            Num::I(i) => i as f64,
        }
    }

    /// Floats truncate toward zero, saturating.
    fn as_i64(self) -> i64 {
        match self {
            Num::F(x) => x as i64,
            Num::I(i) => i,
        }
    }
}

/// The element types of [`Buffer`], for code written once over all of them.
trait Elem: Copy + PartialOrd {
    const DTYPE: DType;
    /// The identity of `elem_max`: -inf, MIN or false.
    const LOWEST: Self;
    /// Sum accumulator: f64 for floats, wrapping i64 for integers and i1.
    type Acc: Copy + Default + Add<Output = Self::Acc> + Mul<Output = Self::Acc>;
    fn to_num(self) -> Num;
    /// Conversion with Rust `as` semantics: float -> int truncates and
    /// saturates (NaN -> 0), int -> int wraps, anything -> i1 is `!= 0`.
    fn from_num(n: Num) -> Self;
    fn widen(self) -> Self::Acc;
    fn narrow(acc: Self::Acc) -> Self;
    fn slice(b: &Buffer) -> Option<&[Self]>;
    fn wrap(v: Vec<Self>) -> Buffer;
    fn elem_max(self, other: Self) -> Self;
    fn elem_min(self, other: Self) -> Self;
    fn write_le(self, out: &mut Vec<u8>);
    /// From exactly `DTYPE.size_in_bytes()` bytes.
    fn read_le(bytes: &[u8]) -> Self;
}

/// IEEE 754-2019 `maximum` keeps `a`: NaN wins, and +0 > -0.
fn keeps_first_max(a: f64, b: f64) -> bool {
    a.is_nan() || (!b.is_nan() && (a > b || (a == b && b.is_sign_negative())))
}

/// IEEE 754-2019 `minimum` keeps `a`: NaN wins, and -0 < +0.
fn keeps_first_min(a: f64, b: f64) -> bool {
    a.is_nan() || (!b.is_nan() && (a < b || (a == b && a.is_sign_negative())))
}

macro_rules! impl_elem {
    // Shared by all: buffer plumbing and bytes.
    (@common $t:ty, $variant:ident) => {
        const DTYPE: DType = DType::$variant;
        fn slice(b: &Buffer) -> Option<&[Self]> {
            match b {
                Buffer::$variant(v) => Some(v),
                _ => None,
            }
        }
        fn wrap(v: Vec<Self>) -> Buffer {
            Buffer::$variant(v)
        }
        fn write_le(self, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.to_le_bytes());
        }
        fn read_le(bytes: &[u8]) -> Self {
            <$t>::from_le_bytes(bytes.try_into().expect("chunks_exact yields whole elements"))
        }
    };
    (float $t:ty, $variant:ident, $lowest:expr, $to64:expr, $from64:expr) => {
        impl Elem for $t {
            impl_elem!(@common $t, $variant);
            const LOWEST: Self = $lowest;
            type Acc = f64;
            fn to_num(self) -> Num {
                Num::F($to64(self))
            }
            fn from_num(n: Num) -> Self {
                $from64(n.as_f64())
            }
            fn widen(self) -> f64 {
                $to64(self)
            }
            fn narrow(acc: f64) -> Self {
                $from64(acc)
            }
            fn elem_max(self, other: Self) -> Self {
                if keeps_first_max($to64(self), $to64(other)) { self } else { other }
            }
            fn elem_min(self, other: Self) -> Self {
                if keeps_first_min($to64(self), $to64(other)) { self } else { other }
            }
        }
        impl From<Vec<$t>> for Buffer {
            fn from(v: Vec<$t>) -> Buffer {
                Buffer::$variant(v)
            }
        }
    };
    (int $t:ty, $variant:ident) => {
        impl Elem for $t {
            impl_elem!(@common $t, $variant);
            const LOWEST: Self = <$t>::MIN;
            type Acc = Wrapping<i64>;
            fn to_num(self) -> Num {
                Num::I(self as i64)
            }
            fn from_num(n: Num) -> Self {
                match n {
                    Num::F(x) => x as $t,
                    Num::I(i) => i as $t,
                }
            }
            fn widen(self) -> Wrapping<i64> {
                Wrapping(self as i64)
            }
            fn narrow(acc: Wrapping<i64>) -> Self {
                acc.0 as $t
            }
            fn elem_max(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            fn elem_min(self, other: Self) -> Self {
                Ord::min(self, other)
            }
        }
        impl From<Vec<$t>> for Buffer {
            fn from(v: Vec<$t>) -> Buffer {
                Buffer::$variant(v)
            }
        }
    };
}

impl_elem!(float f32, F32, f32::NEG_INFINITY, |x: f32| x as f64, |x: f64| x as f32);
impl_elem!(float f16, F16, f16::NEG_INFINITY, f16::to_f64, f16::from_f64);
impl_elem!(float bf16, BF16, bf16::NEG_INFINITY, bf16::to_f64, bf16::from_f64);
impl_elem!(int i8, I8);
impl_elem!(int i16, I16);
impl_elem!(int i32, I32);
impl_elem!(int i64, I64);
impl_elem!(int u8, UI8);
impl_elem!(int u16, UI16);
impl_elem!(int u32, UI32);

impl Elem for bool {
    const DTYPE: DType = DType::I1;
    const LOWEST: Self = false;
    type Acc = Wrapping<i64>;
    fn to_num(self) -> Num {
        Num::I(self as i64)
    }
    fn from_num(n: Num) -> Self {
        match n {
            Num::F(x) => x != 0.0,
            Num::I(i) => i != 0,
        }
    }
    fn widen(self) -> Wrapping<i64> {
        Wrapping(self as i64)
    }
    fn narrow(acc: Wrapping<i64>) -> Self {
        acc.0 != 0
    }
    fn slice(b: &Buffer) -> Option<&[Self]> {
        match b {
            Buffer::I1(v) => Some(v),
            _ => None,
        }
    }
    fn wrap(v: Vec<Self>) -> Buffer {
        Buffer::I1(v)
    }
    fn elem_max(self, other: Self) -> Self {
        self | other
    }
    fn elem_min(self, other: Self) -> Self {
        self & other
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

impl From<Vec<bool>> for Buffer {
    fn from(v: Vec<bool>) -> Buffer {
        Buffer::I1(v)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::graph::text::parse;
    use std::collections::HashMap;

    /// A value of type `ty` (graph-text spelling) holding `data`.
    pub(crate) fn val(ty: &str, data: impl Into<Buffer>) -> Value {
        Value::new(ty.parse().unwrap(), data.into()).unwrap()
    }

    #[test]
    fn as_le_bytes_aliases_the_elements() {
        for v in [
            val("tensor<2xf32>", vec![1.5f32, -2.0]),
            val("tensor<3xbf16>", vec![bf16::from_f32(1.0), bf16::MIN, bf16::NAN]),
            val("tensor<2xi64>", vec![-1i64, 1 << 40]),
            val("tensor<3xi1>", vec![true, false, true]),
            val("tensor<0xui16>", Vec::<u16>::new()),
        ] {
            assert_eq!(v.as_le_bytes(), v.to_le_bytes(), "{}", v.ty);
        }
    }

    #[test]
    fn strided_offsets_walk_row_major() {
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(strided_offsets(&[2, 3], &[3, 1], 0), (0..6).collect::<Vec<_>>());
        // Transposed walk of a 2x3: column-major order of the original.
        assert_eq!(strided_offsets(&[3, 2], &[1, 3], 0), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(strided_offsets(&[], &[], 7), vec![7]);
        assert!(strided_offsets(&[2, 0], &[0, 1], 0).is_empty());
    }

    #[test]
    fn value_checks_dtype_and_length() {
        assert!(Value::new("tensor<2xf32>".parse().unwrap(), vec![1.0f32].into()).is_err());
        assert!(Value::new("tensor<1xf32>".parse().unwrap(), vec![1i32].into()).is_err());
        let e = Value::from_le_bytes(&"tensor<2xi32>".parse().unwrap(), &[0; 7]).unwrap_err();
        assert!(e.to_string().contains("8 bytes expected, got 7"), "{e}");
        let huge: TensorType = TensorType::new([usize::MAX, 2], DType::F32);
        assert!(Value::from_le_bytes(&huge, &[]).is_err());
    }

    #[test]
    fn bytes_round_trip_every_dtype() {
        for dtype in DType::ALL {
            let ty = TensorType::new([2, 3], dtype);
            let v = Value::random(&ty, 7, -100..100);
            assert_eq!(Value::from_le_bytes(&ty, &v.to_le_bytes()).unwrap(), v, "{dtype}");
        }
        let v = val("tensor<2xi32>", vec![1, -2]);
        assert_eq!(v.to_le_bytes(), [1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn random_is_deterministic_and_in_range() {
        for dtype in DType::ALL {
            let ty = TensorType::new([500], dtype);
            let a = Value::random(&ty, 42, -3..5);
            assert_eq!(a, Value::random(&ty, 42, -3..5));
            assert_ne!(a, Value::random(&ty, 43, -3..5), "{dtype}");
            let xs = a.to_f64_vec();
            match dtype {
                d if d.is_float() => assert!(xs.iter().all(|x| (-1.0..1.0).contains(x)), "{dtype}"),
                DType::I1 => assert!(xs.contains(&0.0) && xs.contains(&1.0)),
                d => {
                    // Unsigned types wrap -3..0 to the top of their range.
                    let lowest = if d.is_unsigned() { d.integer_bounds().unwrap().1 as f64 - 2.0 } else { -3.0 };
                    let ok = |x: &f64| (-3.0..5.0).contains(x) || *x >= lowest;
                    assert!(xs.iter().all(ok), "{dtype}");
                    assert!(xs.contains(&lowest) && xs.contains(&4.0), "{dtype}");
                }
            }
        }
    }

    #[test]
    fn runs_a_parsed_graph() {
        let g = parse(
            r#"func @main(%x: tensor<2x3xf32>, %ids: tensor<2xi32>) {
              %w = param {name = "emb"} : tensor<4x3xf32>
              %e = gather %w, %ids : tensor<2x3xf32>
              %y = add %x, %e : tensor<2x3xf32>
              %s = reduce %y {kind = sum, dimensions = [1]} : tensor<2xf32>
              %z = dot_general %y, %w {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : tensor<2x4xf32>
              return %s, %z, %s
            }"#,
        )
        .unwrap();
        let w = val("tensor<4x3xf32>", vec![1.0f32, 0., 0., 0., 1., 0., 0., 0., 1., 1., 1., 1.]);
        let params = HashMap::from([("emb".to_string(), w)]);
        let x = val("tensor<2x3xf32>", vec![0.5f32, 0., 0., 0., 0., -1.]);
        let out = run(&g, &[x, val("tensor<2xi32>", vec![3, 0])], &params).unwrap();
        // y = [[1.5, 1, 1], [1, 0, -1]]
        assert_eq!(out[0], val("tensor<2xf32>", vec![3.5f32, 0.]));
        assert_eq!(out[1], val("tensor<2x4xf32>", vec![1.5f32, 1., 1., 3.5, 1., 0., -1., 0.]));
        assert_eq!(out[2], out[0]);
    }

    #[test]
    fn run_errors_name_the_culprit() {
        let g = parse(
            "func @f(%x: tensor<2xf32>) {\n  %w = param {name = \"w\"} : tensor<2xf32>\n  %y = add %x, %w : tensor<2xf32>\n  return %y\n}",
        )
        .unwrap();
        let x = [val("tensor<2xf32>", vec![1.0f32, 2.])];
        let mut params = HashMap::new();
        let err = |r: Result<Vec<Value>, InterpError>| r.unwrap_err().to_string();
        assert_eq!(err(run(&g, &[], &params)), "the graph takes 1 inputs, got 0");
        let e = err(run(&g, &[val("tensor<3xf32>", vec![0.0f32; 3])], &params));
        assert_eq!(e, "input 0 (%x) must be tensor<2xf32>, got tensor<3xf32>");
        let bad = Value { ty: x[0].ty.clone(), data: vec![1.0f32].into() };
        assert!(err(run(&g, &[bad], &params)).starts_with("input 0 (%x): buffer holds 1 elements"));
        assert_eq!(err(run(&g, &x, &params)), "param \"w\" is missing from the weights");
        params.insert("w".to_string(), val("tensor<2xf16>", vec![f16::ONE; 2]));
        let e = err(run(&g, &x, &params));
        assert_eq!(e, "param \"w\" is declared as tensor<2xf32> but the weights hold tensor<2xf16>");
        params.insert("w".to_string(), val("tensor<2xf32>", vec![1.0f32, 1.]));
        assert_eq!(run(&g, &x, &params).unwrap()[0], val("tensor<2xf32>", vec![2.0f32, 3.]));
    }
}
