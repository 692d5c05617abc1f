//! Lowers reshape, transpose, tile_rows, broadcast_in_dim, concatenate,
//! slice and pad.

use super::dialects::{stablehlo, tensor};
use super::{Emitter, LowerError};
use crate::graph::{TensorType, DYNAMIC};
use melior::ir::attribute::DenseI64ArrayAttribute;
use melior::ir::attribute::IntegerAttribute;
use melior::ir::operation::{OperationLike, OperationResult};
use melior::ir::r#type::{DimSize, IntegerType, RankedTensorType, ShapedTypeLike};
use melior::ir::{Type, Value, ValueLike};

pub(super) fn lower_reshape<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    operand_type: &TensorType,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    if ty.is_dynamic() {
        return lower_dynamic_reshape(e, operand, operand_type, ty);
    }
    e.emit(stablehlo::reshape(e.ctx(), e.tensor_type(ty), operand, e.loc()))
}

/// A reshape whose operand and result have one `?` each (the shape rule's
/// guarantee) as `tensor.collapse_shape` to rank 1 and `tensor.expand_shape`
/// to the result, the `?` taking the function's run-time size: iree-compile
/// cannot legalize `stablehlo.dynamic_reshape` (see dialects/Tensor.td).
fn lower_dynamic_reshape<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    operand_type: &TensorType,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let all_dims = |rank: usize| {
        let dims: Vec<String> = (0..rank).map(|d| d.to_string()).collect();
        format!("[[{}]]", dims.join(", "))
    };
    let flat_type = TensorType::new([DYNAMIC], ty.dtype);
    let flat = if operand_type.rank() == 1 {
        operand
    } else {
        let reassociation = e.parse_attribute(&all_dims(operand_type.rank()))?;
        e.emit(tensor::collapse_shape(e.ctx(), e.tensor_type(&flat_type), operand, reassociation, e.loc()))?
    };
    if ty.rank() == 1 {
        return Ok(flat);
    }
    let reassociation = e.parse_attribute(&all_dims(ty.rank()))?;
    let static_shape: Vec<i64> = ty.shape.iter().map(|&d| if d == DYNAMIC { i64::MIN } else { d as i64 }).collect();
    let static_shape = DenseI64ArrayAttribute::new(e.ctx(), &static_shape).into();
    let size = e.dynamic_index()?;
    e.emit(tensor::expand_shape(e.ctx(), e.tensor_type(ty), flat, &[size], reassociation, static_shape, e.loc()))
}

pub(super) fn lower_transpose<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    permutation: &[usize],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::transpose(e.ctx(), result, operand, e.i64_array(permutation), e.loc()))
}

/// `tile_rows` as ops: the last dim reordered (a slice per run of
/// consecutive indices, concatenated), the rows padded with zeros to whole
/// tiles, split into `[tiles, lanes, ...]`, and each tile's rows moved last.
/// Where the operand is a param, the lowering computes this once, at load
/// (`param::load_tiled`).
pub(super) fn lower_tile_rows<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    operand_type: &TensorType,
    lanes: usize,
    order: &[usize],
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let (rows, rest) = operand_type.shape.split_first().ok_or_else(|| e.error("tile_rows of a scalar"))?;
    let last = operand_type.rank() - 1;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &i in order {
        match runs.last_mut() {
            Some((_, end)) if *end == i => *end += 1,
            _ => runs.push((i, i + 1)),
        }
    }
    let operand = match runs[..] {
        [] | [(0, _)] => operand,
        _ => {
            let pieces = runs
                .iter()
                .map(|&(start, end)| {
                    let mut from = vec![0; operand_type.rank()];
                    let mut to = operand_type.shape.clone();
                    (from[last], to[last]) = (start, end);
                    let mut piece = operand_type.clone();
                    piece.shape[last] = end - start;
                    let strides = vec![1; from.len()];
                    lower_slice(e, operand, operand_type, &from, &to, &strides, e.tensor_type(&piece))
                })
                .collect::<Result<Vec<_>, _>>()?;
            lower_concatenate(e, &pieces, last, e.tensor_type(operand_type))?
        }
    };
    let tiles = ty.shape[0];
    let padded_type = TensorType::new([&[tiles * lanes][..], rest].concat(), ty.dtype);
    let padded = if tiles * lanes == *rows {
        operand
    } else {
        let zero = super::constant::lower_constant(e, 0.0, &TensorType::new([], ty.dtype))?;
        let mut high = vec![0; rest.len() + 1];
        high[0] = tiles * lanes - rows;
        let low = vec![0; high.len()];
        lower_pad(e, operand, zero, [&low, &high, &low], e.tensor_type(&padded_type))?
    };
    let split = TensorType::new([&[tiles, lanes][..], rest].concat(), ty.dtype);
    let split = e.emit(stablehlo::reshape(e.ctx(), e.tensor_type(&split), padded, e.loc()))?;
    let permutation: Vec<usize> = [0].into_iter().chain(2..rest.len() + 2).chain([1]).collect();
    lower_transpose(e, split, &permutation, e.tensor_type(ty))
}

pub(super) fn lower_reverse<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    dimensions: &[usize],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::reverse(e.ctx(), result, operand, e.i64_array(dimensions), e.loc()))
}

pub(super) fn lower_broadcast_in_dim<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    operand_type: &TensorType,
    broadcast_dimensions: &[usize],
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    if ty.is_dynamic() {
        return lower_dynamic_broadcast_in_dim(e, operand, operand_type, broadcast_dimensions, ty);
    }
    let dims = e.i64_array(broadcast_dimensions);
    e.emit(stablehlo::broadcast_in_dim(e.ctx(), e.tensor_type(ty), operand, dims, e.loc()))
}

/// `dynamic_broadcast_in_dim` to `ty`, with every operand dim marked as
/// expanding (size 1 to more) or not; a `?` operand dim keeps its size, as
/// every `?` is the same run-time size.
pub(super) fn lower_dynamic_broadcast_in_dim<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    operand_type: &TensorType,
    broadcast_dimensions: &[usize],
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let (expanding, kept): (Vec<usize>, Vec<usize>) =
        (0..operand_type.rank()).partition(|&i| operand_type.shape[i] == 1 && ty.shape[broadcast_dimensions[i]] != 1);
    let shape = e.shape_tensor(&ty.shape)?;
    e.emit(stablehlo::dynamic_broadcast_in_dim(
        e.ctx(),
        e.tensor_type(ty),
        operand,
        shape,
        e.i64_array(broadcast_dimensions),
        e.i64_array(&expanding),
        e.i64_array(&kept),
        e.loc(),
    ))
}

pub(super) fn lower_concatenate<'c, 'a>(
    e: &Emitter<'c, 'a>,
    inputs: &[Value<'c, 'a>],
    dimension: usize,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    let dim = IntegerAttribute::new(IntegerType::new(e.ctx(), 64).into(), dimension as i64);
    e.emit(stablehlo::concatenate(e.ctx(), result, inputs, dim.into(), e.loc()))
}

pub(super) fn lower_slice<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    operand_type: &TensorType,
    start_indices: &[usize],
    limit_indices: &[usize],
    strides: &[usize],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    // `slice` needs static limits; a `?` dim is taken whole up to its run-time size.
    if operand_type.is_dynamic() {
        let (start, limit, strides) =
            (e.shape_tensor(start_indices)?, e.shape_tensor(limit_indices)?, e.shape_tensor(strides)?);
        return e.emit(stablehlo::real_dynamic_slice(e.ctx(), result, operand, start, limit, strides, e.loc()));
    }
    if let Some(input) = concatenated_input(operand, &operand_type.shape, start_indices, limit_indices, strides) {
        return Ok(input);
    }
    e.emit(stablehlo::slice(
        e.ctx(),
        result,
        operand,
        e.i64_array(start_indices),
        e.i64_array(limit_indices),
        e.i64_array(strides),
        e.loc(),
    ))
}

/// The input of the `stablehlo.concatenate` that made `operand` (of
/// `shape`) when the slice is exactly that input. IREE 3.13 folds such a
/// slice only after it has formed dispatches, and until then the
/// concatenation keeps the input's consumers out of its producer's dispatch
/// (a decode step's gate and up from one `packed_matvec`: one more dispatch a
/// layer).
fn concatenated_input<'c, 'a>(
    operand: Value<'c, 'a>,
    shape: &[usize],
    start: &[usize],
    limit: &[usize],
    strides: &[usize],
) -> Option<Value<'c, 'a>>
where
    'c: 'a,
{
    let concat = OperationResult::try_from(operand).ok()?.owner();
    if concat.name().as_string_ref().as_str() != Ok("stablehlo.concatenate") || strides.iter().any(|&s| s != 1) {
        return None;
    }
    let dim = usize::try_from(IntegerAttribute::try_from(concat.attribute("dimension").ok()?).ok()?.value()).ok()?;
    let whole_elsewhere = (0..shape.len()).all(|d| d == dim || (start[d] == 0 && limit[d] == shape[d]));
    let mut offset = 0;
    for i in 0..concat.operand_count() {
        let input = concat.operand(i).ok()?;
        let DimSize::Static(len) = RankedTensorType::try_from(input.r#type()).ok()?.dim_size(dim).ok()? else {
            return None;
        };
        let len = len as usize;
        if whole_elsewhere && start[dim] == offset && limit[dim] == offset + len {
            return Some(input);
        }
        offset += len;
    }
    None
}

pub(super) fn lower_pad<'c, 'a>(
    e: &Emitter<'c, 'a>,
    operand: Value<'c, 'a>,
    padding_value: Value<'c, 'a>,
    [low, high, interior]: [&[usize]; 3],
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    e.emit(stablehlo::pad(
        e.ctx(),
        result,
        operand,
        padding_value,
        e.i64_array(low),
        e.i64_array(high),
        e.i64_array(interior),
        e.loc(),
    ))
}
