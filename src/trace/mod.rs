//! The tracing DSL: model code calls ops on [`Tensor`] handles, which carry
//! only an id and a type. Each call runs the op's shape rule right away, so
//! a wrong model fails at the call with the op, the shapes and the rule.
//! No tensor data is ever allocated while tracing.
//!
//! ```
//! use kiln::graph::{DType, TensorType};
//! use kiln::trace::Tracer;
//!
//! let t = Tracer::new("main");
//! let x = t.input("x", TensorType::new([2, 4], DType::F32)).unwrap();
//! let w = t.param("proj.weight", TensorType::new([8, 4], DType::F32)).unwrap();
//! let y = x.linear(&w).unwrap().tanh().unwrap();
//! let graph = t.finish(&[&y]).unwrap();
//! assert_eq!(graph.node(graph.outputs()[0]).ty.to_string(), "tensor<2x8xf32>");
//! ```

use crate::graph::ops::{bitwise, BinaryOp, BitwiseOp, UnaryOp};
use crate::graph::{ComparisonDirection, DType, DotDimensions, Graph, GraphError, Op, ReduceKind, TensorType, ValueId};
use std::cell::RefCell;
use thiserror::Error;

pub mod dequant;
pub mod nn;

/// Why an op could not be traced.
#[derive(Debug, Error)]
pub enum TraceError {
    /// An op's shape rule rejected its operands (names the op, rule and shapes).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A tensor from another [`Tracer`] was passed to an op.
    #[error("tensors from two different tracers were combined in {op}")]
    ForeignTensor {
        /// The op.
        op: &'static str,
    },
    /// A composite op ([`nn`]) was given arguments it cannot take.
    #[error("{op}: {message}")]
    Op {
        /// The composite op.
        op: &'static str,
        /// What is wrong with its arguments.
        message: String,
    },
}

/// Records ops into a [`Graph`].
#[derive(Debug)]
pub struct Tracer {
    graph: RefCell<Graph>,
}

/// A traced value: an id into the tracer's graph plus its type.
#[derive(Clone, Debug)]
pub struct Tensor<'t> {
    tracer: &'t Tracer,
    /// The node this value is in the tracer's graph.
    pub id: ValueId,
    /// Its type, from the op's shape rule.
    pub ty: TensorType,
}

impl Tracer {
    /// An empty function called `name` (`main`, `prefill`).
    pub fn new(name: &str) -> Self {
        Tracer { graph: RefCell::new(Graph::new(name)) }
    }

    fn push(
        &self,
        prefix: &str,
        op: Op,
        operands: &[&Tensor<'_>],
        declared: Option<TensorType>,
    ) -> Result<Tensor<'_>, TraceError> {
        let op_name = op.name();
        if operands.iter().any(|t| !std::ptr::eq(t.tracer, self)) {
            return Err(TraceError::ForeignTensor { op: op_name });
        }
        let mut g = self.graph.borrow_mut();
        let name = g.fresh_name(if prefix.is_empty() { op_name } else { prefix });
        let id = g.add_node(name, op, operands.iter().map(|t| t.id).collect(), declared)?;
        Ok(Tensor { tracer: self, id, ty: g.node(id).ty.clone() })
    }

    /// A function argument (tokens, positions, caches).
    pub fn input(&self, name: &str, ty: TensorType) -> Result<Tensor<'_>, TraceError> {
        self.push(name, Op::Input, &[], Some(ty))
    }

    /// A named weight. Asking twice for the same name gives the same value.
    pub fn param(&self, name: &str, ty: TensorType) -> Result<Tensor<'_>, TraceError> {
        self.push(&sanitize(name), Op::Param { name: name.to_string() }, &[], Some(ty))
    }

    /// A splat constant.
    pub fn constant(&self, value: f64, ty: TensorType) -> Result<Tensor<'_>, TraceError> {
        self.push("", Op::Constant { value }, &[], Some(ty))
    }

    /// Indices along `iota_dimension`, of type `ty`: `iota(1, [2, 3])` is `[[0, 1, 2], [0, 1, 2]]`.
    pub fn iota(&self, iota_dimension: usize, ty: TensorType) -> Result<Tensor<'_>, TraceError> {
        self.push("", Op::Iota { iota_dimension }, &[], Some(ty))
    }

    /// The indices `0..n` as a constant `tensor<n x i32>` ([`Op::Range`]):
    /// an iota's values, where an iota would be fused into a reduction.
    pub fn range(&self, n: usize) -> Result<Tensor<'_>, TraceError> {
        self.push("", Op::Range, &[], Some(TensorType::new([n], DType::I32)))
    }

    /// Joins `inputs` (same dtype, sizes equal off `dimension`) along `dimension`.
    pub fn concatenate(&self, inputs: &[&Tensor<'_>], dimension: usize) -> Result<Tensor<'_>, TraceError> {
        self.push("", Op::Concatenate { dimension }, inputs, None)
    }

    /// Ends tracing with the function results and hands over the graph;
    /// the tracer is left empty.
    pub fn finish(&self, outputs: &[&Tensor<'_>]) -> Result<Graph, TraceError> {
        let mut g = std::mem::take(&mut *self.graph.borrow_mut());
        g.set_outputs(outputs.iter().map(|t| t.id).collect())?;
        Ok(g)
    }
}

/// Node names are MLIR-friendly: checkpoint names like `blk.0.attn_q.weight`
/// keep their shape with `.` as `_`.
fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

impl<'t> Tensor<'t> {
    /// The tracer this value belongs to, for building constants next to it.
    pub fn tracer(&self) -> &'t Tracer {
        self.tracer
    }

    fn unary(&self, op: UnaryOp) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Unary(op), &[self], None)
    }

    fn binary(&self, op: BinaryOp, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Binary(op), &[self, rhs], None)
    }

    /// `self + rhs`, element-wise; operands of one type (broadcast explicitly).
    pub fn add(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Add, rhs)
    }
    /// `self - rhs`, element-wise.
    pub fn subtract(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Subtract, rhs)
    }
    /// `self · rhs`, element-wise.
    pub fn multiply(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Multiply, rhs)
    }
    /// `self / rhs`, element-wise.
    pub fn divide(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Divide, rhs)
    }
    /// The element-wise maximum; NaN propagates.
    pub fn maximum(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Maximum, rhs)
    }
    /// The element-wise minimum; NaN propagates.
    pub fn minimum(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Minimum, rhs)
    }
    /// `-self`.
    pub fn negate(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Negate)
    }
    /// `eˣ`.
    pub fn exp(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Exponential)
    }
    /// The natural logarithm.
    pub fn log(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Log)
    }
    /// `√x`.
    pub fn sqrt(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Sqrt)
    }
    /// `1/√x`.
    pub fn rsqrt(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Rsqrt)
    }
    /// The hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Tanh)
    }
    /// The sigmoid `1/(1 + e⁻ˣ)`.
    pub fn logistic(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Logistic)
    }
    /// `|x|`.
    pub fn abs(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Abs)
    }
    /// -1, 0 or 1 (floats keep the sign of zero and NaN).
    pub fn sign(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Sign)
    }
    /// Rounds toward -∞.
    pub fn floor(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Floor)
    }
    /// Rounds half-way cases to even: 0.5 -> 0, 1.5 -> 2.
    pub fn round_nearest_even(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::RoundNearestEven)
    }
    /// Cosine.
    pub fn cosine(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Cosine)
    }
    /// Sine.
    pub fn sine(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Sine)
    }
    /// The Gauss error function (`chlo.erf`).
    pub fn erf(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Erf)
    }
    /// `self` raised to `rhs`, element-wise.
    pub fn power(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Power, rhs)
    }

    fn bitwise(&self, op: BitwiseOp, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Bitwise(op), &[self, rhs], None)
    }

    /// Bitwise and on integers, logical and on `i1`.
    pub fn and(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.bitwise(BitwiseOp::And, rhs)
    }
    /// Bitwise or on integers, logical or on `i1`.
    pub fn or(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.bitwise(BitwiseOp::Or, rhs)
    }
    /// Bitwise xor on integers, logical xor on `i1`.
    pub fn xor(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.bitwise(BitwiseOp::Xor, rhs)
    }
    /// Bitwise not on integers, logical not on `i1`.
    pub fn not(&self) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Not, &[self], None)
    }
    /// Shifting by the bit width or more gives 0.
    pub fn shift_left(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.bitwise(BitwiseOp::ShiftLeft, rhs)
    }
    /// Fills with zeros; shifting by the bit width or more gives 0.
    pub fn shift_right_logical(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.bitwise(BitwiseOp::ShiftRightLogical, rhs)
    }
    /// Fills with the top bit, also past the bit width (0 or -1).
    pub fn shift_right_arithmetic(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.bitwise(BitwiseOp::ShiftRightArithmetic, rhs)
    }

    /// The same bits as `dtype`: a narrower type adds a last dim of the
    /// width ratio, a wider one consumes it (`[n, 2] i8 -> [n] f16`).
    pub fn bitcast_convert(&self, dtype: DType) -> Result<Tensor<'t>, TraceError> {
        // A shape that does not fit is left to the shape rule to report.
        let shape = bitwise::bitcast_shape(&self.ty, dtype).unwrap_or_else(|| self.ty.shape.clone());
        self.tracer.push("", Op::BitcastConvert, &[self], Some(TensorType::new(shape, dtype)))
    }

    /// Each element converted to `dtype` (floats to integers truncate toward zero).
    pub fn convert(&self, dtype: DType) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Convert, &[self], Some(self.ty.with_dtype(dtype)))
    }

    /// `self` clamped into `[min, max]`; `min` and `max` are scalars or of `self`'s shape.
    pub fn clamp(&self, min: &Tensor<'_>, max: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Clamp, &[min, self, max], None)
    }

    /// The `i1` result of `self <direction> rhs`, element-wise.
    pub fn compare(&self, direction: ComparisonDirection, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Compare(direction), &[self, rhs], None)
    }

    /// `self` is the i1 predicate.
    pub fn select(&self, on_true: &Tensor<'_>, on_false: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Select, &[self, on_true, on_false], None)
    }

    /// The same elements, row-major, in `shape`.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Reshape, &[self], Some(TensorType::new(shape, self.ty.dtype)))
    }

    /// Dims reordered: result dim `i` is `self`'s dim `permutation[i]`.
    pub fn transpose(&self, permutation: &[usize]) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Transpose { permutation: permutation.to_vec() }, &[self], None)
    }

    /// `[rows, ..., n]` as tiles of `lanes` rows, the row innermost and the
    /// last dim in `order` (a permutation of `0..n`, or empty to keep it):
    /// `[ceil(rows / lanes), ..., n, lanes]`, zeros past the last row
    /// (`Op::TileRows`).
    pub fn tile_rows(&self, lanes: usize, order: &[usize]) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::TileRows { lanes, order: order.to_vec() }, &[self], None)
    }

    /// The same elements, their order along each of `dimensions` reversed.
    pub fn reverse(&self, dimensions: &[usize]) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Reverse { dimensions: dimensions.to_vec() }, &[self], None)
    }

    /// `self` broadcast to `shape`; its dim `i` becomes the result's dim
    /// `broadcast_dimensions[i]` (of the same size, or 1).
    pub fn broadcast_in_dim(&self, shape: &[usize], broadcast_dimensions: &[usize]) -> Result<Tensor<'t>, TraceError> {
        let op = Op::BroadcastInDim { broadcast_dimensions: broadcast_dimensions.to_vec() };
        self.tracer.push("", op, &[self], Some(TensorType::new(shape, self.ty.dtype)))
    }

    /// The strided window `start_indices..limit_indices` by `strides`, per dim.
    pub fn slice(
        &self,
        start_indices: &[usize],
        limit_indices: &[usize],
        strides: &[usize],
    ) -> Result<Tensor<'t>, TraceError> {
        let op = Op::Slice {
            start_indices: start_indices.to_vec(),
            limit_indices: limit_indices.to_vec(),
            strides: strides.to_vec(),
        };
        self.tracer.push("", op, &[self], None)
    }

    /// A `slice_sizes` slice starting at the runtime `start_indices` (scalar
    /// integers, one per dim), clamped to stay inside `self`.
    pub fn dynamic_slice(
        &self,
        start_indices: &[&Tensor<'_>],
        slice_sizes: &[usize],
    ) -> Result<Tensor<'t>, TraceError> {
        let operands: Vec<&Tensor<'_>> = std::iter::once(self).chain(start_indices.iter().copied()).collect();
        self.tracer.push("", Op::DynamicSlice { slice_sizes: slice_sizes.to_vec() }, &operands, None)
    }

    /// The strided window `start_indices..limit_indices` by `strides`, each
    /// a 1-D integer tensor with one entry per dim, computed at run time:
    /// a tensor of `shape` (`?` where the size is not static). The bounds
    /// must be in range (`0 <= start <= limit <= dim`, `stride > 0`): they
    /// are not clamped.
    pub fn real_dynamic_slice(
        &self,
        start_indices: &Tensor<'_>,
        limit_indices: &Tensor<'_>,
        strides: &Tensor<'_>,
        shape: &[usize],
    ) -> Result<Tensor<'t>, TraceError> {
        let operands = [self, start_indices, limit_indices, strides];
        self.tracer.push("", Op::RealDynamicSlice, &operands, Some(TensorType::new(shape, self.ty.dtype)))
    }

    /// `self` with `update` written at the runtime `start_indices` (clamped
    /// like `dynamic_slice`'s): e.g. a KV cache at the decode position.
    pub fn dynamic_update_slice(
        &self,
        update: &Tensor<'_>,
        start_indices: &[&Tensor<'_>],
    ) -> Result<Tensor<'t>, TraceError> {
        let operands: Vec<&Tensor<'_>> = [self, update].into_iter().chain(start_indices.iter().copied()).collect();
        self.tracer.push("", Op::DynamicUpdateSlice, &operands, None)
    }

    /// Pads each dim with `padding_value` (a scalar): `low` before, `high`
    /// after and `interior` between elements.
    pub fn pad(
        &self,
        padding_value: &Tensor<'_>,
        low: &[usize],
        high: &[usize],
        interior: &[usize],
    ) -> Result<Tensor<'t>, TraceError> {
        let op = Op::Pad {
            edge_padding_low: low.to_vec(),
            edge_padding_high: high.to_vec(),
            interior_padding: interior.to_vec(),
        };
        self.tracer.push("", op, &[self, padding_value], None)
    }

    /// A general contraction (see [`DotDimensions`]); [`Tensor::linear`] covers the usual case.
    pub fn dot_general(&self, rhs: &Tensor<'_>, dims: DotDimensions) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::DotGeneral(dims), &[self, rhs], None)
    }

    /// `x[..., in] . w[out, in] -> [..., out]`: contracts with a weight
    /// stored `[out, in]` (GGUF and HF layout) without a transpose.
    pub fn linear(&self, weight: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        let last = self.ty.rank().saturating_sub(1);
        self.dot_general(weight, DotDimensions::contracting(last, 1))
    }

    /// Embedding lookup: `self` is the `[vocab, dim]` table.
    pub fn gather(&self, indices: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Gather, &[self, indices], None)
    }

    /// Reduces `dimensions` away with `kind`.
    pub fn reduce(&self, kind: ReduceKind, dimensions: &[usize]) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Reduce { kind, dimensions: dimensions.to_vec() }, &[self], None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_errors_surface_at_the_call() {
        let t = Tracer::new("main");
        let x = t.input("x", TensorType::new([2, 4], DType::F32)).unwrap();
        let w = t.param("blk.0.attn_q.weight", TensorType::new([8, 5], DType::F32)).unwrap();
        let err = x.linear(&w).unwrap_err().to_string();
        assert!(err.contains("dot_general (C10)") && err.contains("lhs[1]=4, rhs[1]=5"), "{err}");
    }

    #[test]
    fn tied_params_are_one_value() {
        let t = Tracer::new("main");
        let ty = TensorType::new([4, 2], DType::F32);
        let a = t.param("token_embd.weight", ty.clone()).unwrap();
        let b = t.param("token_embd.weight", ty).unwrap();
        assert_eq!(a.id, b.id);
        let g = t.finish(&[&a]).unwrap();
        assert_eq!(g.params().count(), 1);
    }

    #[test]
    fn kv_cache_update_and_packed_weights() {
        let t = Tracer::new("main");
        let cache = t.input("cache", TensorType::new([16, 2, 4], DType::F16)).unwrap();
        let row = t.input("row", TensorType::new([1, 2, 4], DType::F16)).unwrap();
        let pos = t.input("pos", TensorType::new([], DType::I32)).unwrap();
        let zero = t.constant(0.0, TensorType::new([], DType::I32)).unwrap();
        let cache = cache.dynamic_update_slice(&row, &[&pos, &zero, &zero]).unwrap();
        let window = cache.dynamic_slice(&[&pos, &zero, &zero], &[4, 2, 4]).unwrap();
        assert_eq!(window.ty, TensorType::new([4, 2, 4], DType::F16));
        let err = cache.dynamic_slice(&[&pos, &zero], &[4, 2, 4]).unwrap_err().to_string();
        assert!(err.contains("dynamic_slice (C2)"), "{err}");

        let packed = t.param("blk.0.ffn_down.qs", TensorType::new([8], DType::UI8)).unwrap();
        let four = t.constant(4.0, TensorType::new([8], DType::UI8)).unwrap();
        let low = packed.and(&t.constant(15.0, TensorType::new([8], DType::UI8)).unwrap()).unwrap();
        let high = packed.shift_right_logical(&four).unwrap();
        assert_eq!(high.ty, low.ty);
        let scales =
            t.param("scales", TensorType::new([4, 2], DType::I8)).unwrap().bitcast_convert(DType::F16).unwrap();
        assert_eq!(scales.ty, TensorType::new([4], DType::F16));
        assert_eq!(scales.bitcast_convert(DType::UI8).unwrap().ty, TensorType::new([4, 2], DType::UI8));
        let err = packed.bitcast_convert(DType::F32).unwrap_err().to_string();
        assert!(err.contains("bitcast_convert (C1)"), "{err}");
        assert!(packed.shift_left(&scales).is_err());
    }

    #[test]
    fn tracing_allocates_no_data_for_huge_shapes() {
        // 2^40 elements would be 4 TiB if anything were allocated.
        let t = Tracer::new("main");
        let x = t.input("x", TensorType::new([1 << 20, 1 << 20], DType::F32)).unwrap();
        let y = x.exp().unwrap().add(&x).unwrap();
        assert_eq!(y.ty.num_elements(), 1 << 40);
    }
}
