//! Lowers `dot_general` with its `#stablehlo.dot<...>` dimension numbers.

use super::dialects::{stablehlo, tensor};
use super::{Emitter, LowerError};
use crate::graph::{DotDimensions, TensorType, DYNAMIC};
use melior::ir::attribute::DenseI64ArrayAttribute;
use melior::ir::Value;

/// `#stablehlo.dot<...>` has no C API constructor; it is parsed through the
/// C API from its canonical text. Empty lists are omitted, as MLIR prints them.
pub(super) fn dot_dimension_numbers(dims: &DotDimensions) -> String {
    let fields = [
        ("lhs_batching_dimensions", &dims.lhs_batching_dimensions),
        ("rhs_batching_dimensions", &dims.rhs_batching_dimensions),
        ("lhs_contracting_dimensions", &dims.lhs_contracting_dimensions),
        ("rhs_contracting_dimensions", &dims.rhs_contracting_dimensions),
    ];
    let items: Vec<String> =
        fields.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k} = {}", int_list(v))).collect();
    format!("#stablehlo.dot<{}>", items.join(", "))
}

pub(super) fn int_list(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(|d| d.to_string()).collect();
    format!("[{}]", items.join(", "))
}

pub(super) fn lower_dot_general<'c, 'a>(
    e: &Emitter<'c, 'a>,
    lhs: Value<'c, 'a>,
    rhs: Value<'c, 'a>,
    lhs_type: &TensorType,
    dims: &DotDimensions,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    if flattens_rows(lhs_type, dims) {
        return lower_row_product(e, lhs, rhs, lhs_type, dims, ty);
    }
    let attr = e.parse_attribute(&dot_dimension_numbers(dims))?;
    e.emit(stablehlo::dot_general(e.ctx(), e.tensor_type(ty), lhs, rhs, attr, e.loc()))
}

/// A product of `x [..., ?, ..., in]` (rank >= 3, no batch dims, the last
/// dim contracted) with a matrix: iree-compile 3.13 flattens its rows with
/// a `stablehlo.dynamic_reshape`, which it then cannot legalize.
fn flattens_rows(lhs: &TensorType, dims: &DotDimensions) -> bool {
    let rank = lhs.rank();
    rank >= 3
        && lhs.is_dynamic()
        && dims.lhs_batching_dimensions.is_empty()
        && dims.lhs_contracting_dimensions == [rank - 1]
        && dims.rhs_contracting_dimensions.len() == 1
}

/// [`flattens_rows`]' product with the rows flattened by kiln instead:
/// `tensor.collapse_shape` to `[rows, in]`, a matrix product, and
/// `tensor.expand_shape` back, the `?` taking the function's run-time size.
fn lower_row_product<'c, 'a>(
    e: &Emitter<'c, 'a>,
    lhs: Value<'c, 'a>,
    rhs: Value<'c, 'a>,
    lhs_type: &TensorType,
    dims: &DotDimensions,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let rank = lhs_type.rank();
    let (inp, out) = (lhs_type.shape[rank - 1], ty.shape[rank - 1]);
    let rows = format!("[{}, [{}]]", int_list(&(0..rank - 1).collect::<Vec<_>>()), rank - 1);
    let reassociation = e.parse_attribute(&rows)?;
    let flat = TensorType::new([DYNAMIC, inp], lhs_type.dtype);
    let flat = e.emit(tensor::collapse_shape(e.ctx(), e.tensor_type(&flat), lhs, reassociation, e.loc()))?;
    let matrix = DotDimensions::contracting(1, dims.rhs_contracting_dimensions[0]);
    let attr = e.parse_attribute(&dot_dimension_numbers(&matrix))?;
    let product = TensorType::new([DYNAMIC, out], ty.dtype);
    let product = e.emit(stablehlo::dot_general(e.ctx(), e.tensor_type(&product), flat, rhs, attr, e.loc()))?;
    let static_shape: Vec<i64> = ty.shape.iter().map(|&d| if d == DYNAMIC { i64::MIN } else { d as i64 }).collect();
    let static_shape = DenseI64ArrayAttribute::new(e.ctx(), &static_shape).into();
    let size = e.dynamic_index()?;
    let reassociation = e.parse_attribute(&rows)?;
    e.emit(tensor::expand_shape(e.ctx(), e.tensor_type(ty), product, &[size], reassociation, static_shape, e.loc()))
}
