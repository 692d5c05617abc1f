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

use crate::graph::ops::{BinaryOp, UnaryOp};
use crate::graph::{ComparisonDirection, DType, DotDimensions, Graph, GraphError, Op, ReduceKind, TensorType, ValueId};
use std::cell::RefCell;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TraceError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("tensors from two different tracers were combined in {op}")]
    ForeignTensor { op: &'static str },
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
    pub id: ValueId,
    pub ty: TensorType,
}

impl Tracer {
    pub fn new(name: &str) -> Self {
        Tracer { graph: RefCell::new(Graph::new(name)) }
    }

    fn push(&self, prefix: &str, op: Op, operands: &[&Tensor<'_>], declared: Option<TensorType>) -> Result<Tensor<'_>, TraceError> {
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

    pub fn iota(&self, iota_dimension: usize, ty: TensorType) -> Result<Tensor<'_>, TraceError> {
        self.push("", Op::Iota { iota_dimension }, &[], Some(ty))
    }

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
    fn unary(&self, op: UnaryOp) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Unary(op), &[self], None)
    }

    fn binary(&self, op: BinaryOp, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Binary(op), &[self, rhs], None)
    }

    pub fn add(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Add, rhs)
    }
    pub fn subtract(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Subtract, rhs)
    }
    pub fn multiply(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Multiply, rhs)
    }
    pub fn divide(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Divide, rhs)
    }
    pub fn maximum(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Maximum, rhs)
    }
    pub fn minimum(&self, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.binary(BinaryOp::Minimum, rhs)
    }
    pub fn negate(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Negate)
    }
    pub fn exp(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Exponential)
    }
    pub fn log(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Log)
    }
    pub fn sqrt(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Sqrt)
    }
    pub fn rsqrt(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Rsqrt)
    }
    pub fn tanh(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Tanh)
    }
    pub fn logistic(&self) -> Result<Tensor<'t>, TraceError> {
        self.unary(UnaryOp::Logistic)
    }

    pub fn convert(&self, dtype: DType) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Convert, &[self], Some(self.ty.with_dtype(dtype)))
    }

    pub fn clamp(&self, min: &Tensor<'_>, max: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Clamp, &[min, self, max], None)
    }

    pub fn compare(&self, direction: ComparisonDirection, rhs: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Compare(direction), &[self, rhs], None)
    }

    /// `self` is the i1 predicate.
    pub fn select(&self, on_true: &Tensor<'_>, on_false: &Tensor<'_>) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Select, &[self, on_true, on_false], None)
    }

    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Reshape, &[self], Some(TensorType::new(shape, self.ty.dtype)))
    }

    pub fn transpose(&self, permutation: &[usize]) -> Result<Tensor<'t>, TraceError> {
        self.tracer.push("", Op::Transpose { permutation: permutation.to_vec() }, &[self], None)
    }

    pub fn broadcast_in_dim(&self, shape: &[usize], broadcast_dimensions: &[usize]) -> Result<Tensor<'t>, TraceError> {
        let op = Op::BroadcastInDim { broadcast_dimensions: broadcast_dimensions.to_vec() };
        self.tracer.push("", op, &[self], Some(TensorType::new(shape, self.ty.dtype)))
    }

    pub fn slice(&self, start_indices: &[usize], limit_indices: &[usize], strides: &[usize]) -> Result<Tensor<'t>, TraceError> {
        let op = Op::Slice {
            start_indices: start_indices.to_vec(),
            limit_indices: limit_indices.to_vec(),
            strides: strides.to_vec(),
        };
        self.tracer.push("", op, &[self], None)
    }

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
    fn tracing_allocates_no_data_for_huge_shapes() {
        // 2^40 elements would be 4 TiB if anything were allocated.
        let t = Tracer::new("main");
        let x = t.input("x", TensorType::new([1 << 20, 1 << 20], DType::F32)).unwrap();
        let y = x.exp().unwrap().add(&x).unwrap();
        assert_eq!(y.ty.num_elements(), 1 << 40);
    }
}
