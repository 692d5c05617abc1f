//! Lowers `dot_general` with its `#stablehlo.dot<...>` dimension numbers.

use super::dialects::{stablehlo, tensor};
use super::{Emitter, LowerError};
use crate::graph::{DType, DotDimensions, TensorType, DYNAMIC};
use melior::ir::attribute::DenseI64ArrayAttribute;
use melior::ir::operation::OperationBuilder;
use melior::ir::{Attribute, Block, BlockLike, Identifier, Region, RegionLike, Type, Value};

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

/// The least contracted dim of a weight product that is data-tiled
/// ([`weight_product`]). With a shallower one, IREE 3.13 tiles the `?` rows
/// so deep that unpacking the tiled result fails at codegen when a consumer
/// is fused in ("operations with large vector sizes (32768 bytes)"):
/// Gemma 3n's 64-deep laurel and 256-deep per-layer products followed by a
/// norm, a whole E2B export failing to compile. Such products are cheap
/// untiled.
const TILED_DEPTH: usize = 512;

/// Where `lhs` is `x [?, in]` f32 times a static f32 matrix (a prompt's
/// rows times a weight; no batch dims), `in` at least [`TILED_DEPTH`]: the
/// matrix's contracted dim.
pub(super) fn weight_product(lhs: &TensorType, dims: &DotDimensions, ty: &TensorType) -> Option<usize> {
    let f32 = |t: &TensorType| t.dtype == DType::F32;
    // Products of fewer than 16 outputs (a MoE router) stay dot_generals:
    // as hinted generics, IREE 3.13's data-tiled codegen of one failed
    // ("vector.store ... restricted to workgroup distributed contexts").
    let rows = lhs.rank() == 2
        && lhs.shape[0] == DYNAMIC
        && lhs.shape[1] != DYNAMIC
        && lhs.shape[1] >= TILED_DEPTH
        && ty.shape[1] >= 16;
    match (&dims.lhs_contracting_dimensions[..], &dims.rhs_contracting_dimensions[..]) {
        ([1], &[k]) if rows && f32(lhs) && f32(ty) && dims.lhs_batching_dimensions.is_empty() && k < 2 => Some(k),
        _ => None,
    }
}

/// A prompt's rows times a weight (`Graph::weight_root`) as a
/// `linalg.generic` contraction that
/// carries IREE's data-tiling hint (`iree.opt.data_tiling`): a function
/// holding any hinted op has only those data-tiled, so the hint keeps these
/// products tiled where the decode step's untiled mark is inlined (a stepped
/// `prefill`, `generate`), and, where nothing else is hinted, changes
/// nothing (IREE tiles every contraction then).
pub(super) fn lower_weight_product<'c, 'a>(
    e: &Emitter<'c, 'a>,
    lhs: Value<'c, 'a>,
    rhs: Value<'c, 'a>,
    rhs_contracting: usize,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let ctx = e.ctx();
    let init = super::constant::lower_constant(e, 0.0, ty)?;
    let rhs_map = match rhs_contracting {
        1 => "affine_map<(m, n, k) -> (n, k)>",
        _ => "affine_map<(m, n, k) -> (k, n)>",
    };
    let maps = format!("[affine_map<(m, n, k) -> (m, k)>, {rhs_map}, affine_map<(m, n, k) -> (m, n)>]");
    let f32 = Type::float32(ctx);
    let body = Block::new(&[(f32, e.loc()), (f32, e.loc()), (f32, e.loc())]);
    let arg = |i: usize| -> Value { body.argument(i).expect("three arguments").into() };
    let binary = |name: &str, a: Value<'c, '_>, b: Value<'c, '_>| {
        let op = OperationBuilder::new(name, e.loc()).add_operands(&[a, b]).add_results(&[f32]).build();
        op.map_err(|err| e.error(format!("{name}: {err}")))
    };
    let product = body.append_operation(binary("arith.mulf", arg(0), arg(1))?).result(0).expect("one result").into();
    let sum = body.append_operation(binary("arith.addf", arg(2), product)?).result(0).expect("one result").into();
    let yield_op = OperationBuilder::new("linalg.yield", e.loc()).add_operands(&[sum]).build();
    body.append_operation(yield_op.map_err(|err| e.error(format!("linalg.yield: {err}")))?);
    let region = Region::new();
    region.append_block(body);
    let attr = |name: &str, text: &str| -> Result<_, LowerError> {
        Ok((Identifier::new(ctx, name), e.parse_attribute(text)?))
    };
    let parallel = "#linalg.iterator_type<parallel>";
    let generic = OperationBuilder::new("linalg.generic", e.loc())
        .add_operands(&[lhs, rhs, init])
        .add_results(&[e.tensor_type(ty)])
        .add_attributes(&[
            attr("indexing_maps", &maps)?,
            attr("iterator_types", &format!("[{parallel}, {parallel}, #linalg.iterator_type<reduction>]"))?,
            attr("operandSegmentSizes", "array<i32: 2, 1>")?,
            (Identifier::new(ctx, "iree.opt.data_tiling"), Attribute::unit(ctx)),
        ])
        .add_regions([region])
        .build()
        .map_err(|err| e.error(format!("linalg.generic: {err}")))?;
    Ok(e.block.append_operation(generic).result(0).expect("one result").into())
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
