//! Lowers `dot_general` with its `#stablehlo.dot<...>` dimension numbers.

use super::dialects::{stablehlo, tensor};
use super::generate::compare;
use super::{Emitter, Function, LowerError};
use crate::graph::{ComparisonDirection, DType, DotDimensions, TensorType, DYNAMIC};
use crate::weights::ggml::GgmlType;
use melior::ir::attribute::DenseI64ArrayAttribute;
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::IntegerType;
use melior::ir::{Attribute, Block, BlockLike, Identifier, Location, Region, RegionLike, Type, Value, ValueLike};

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
    let init = super::constant::lower_constant(e, 0.0, ty)?;
    weight_product_into(e, lhs, rhs, rhs_contracting, init, ty)
}

/// [`lower_weight_product`] accumulating into `init`, zeros of `ty`.
fn weight_product_into<'c, 'a>(
    e: &Emitter<'c, 'a>,
    lhs: Value<'c, 'a>,
    rhs: Value<'c, 'a>,
    rhs_contracting: usize,
    init: Value<'c, 'a>,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let ctx = e.ctx();
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

/// The most f32 bytes of a packed weight that a prompt's product
/// dequantizes at once ([`ChunkedWeight`]).
const CHUNK_BYTES: usize = 4 << 20;

/// A packed `[rows, cols]` weight whose product with a prompt's rows is
/// dequantized `chunk` rows at a time ([`lower_chunked_weight_product`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct ChunkedWeight {
    pub ggml: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub chunk: usize,
}

impl ChunkedWeight {
    /// `chunk`: the most rows, a multiple of 16 dividing `rows`, whose f32
    /// values take at most [`CHUNK_BYTES`]. `None` where the whole weight
    /// takes no more (one step) or no such count exists.
    pub fn new(ggml: GgmlType, rows: usize, cols: usize) -> Option<ChunkedWeight> {
        let most = CHUNK_BYTES / (4 * cols.max(1));
        if rows <= most {
            return None;
        }
        let chunk = (1..=most / 16).rev().map(|tiles| 16 * tiles).find(|&chunk| rows.is_multiple_of(chunk))?;
        Some(ChunkedWeight { ggml, rows, cols, chunk })
    }
}

/// A prompt's rows `x [?, cols]` times the transpose of a packed `[rows,
/// cols]` weight, its blocks `raw` (`[bytes]` of `raw_dtype`, row-major: each
/// block of `chunk` rows is a contiguous run of bytes), as a
/// `stablehlo.while` over those blocks of rows: each step multiplies
/// ([`lower_weight_product`]'s data-tiled generic) the rows the step before
/// dequantized (the private function of a whole `dequantize` of that shape)
/// into its columns of the result, and dequantizes the next block.
///
/// The whole weight dequantized at once is an f32 copy of it per call, and
/// IREE 3.13 runs every weight's dequantization at the start of the
/// prompt's graph, so all of them live at once, in freshly faulted pages
/// (Gemma 3n E2B's 512-token prompt: an 11.75 GB peak, 6.3 GB in blocks).
pub(super) fn lower_chunked_weight_product<'c, 'a>(
    e: &Emitter<'c, 'a>,
    weight: ChunkedWeight,
    x: Value<'c, 'a>,
    raw: Value<'c, 'a>,
    raw_dtype: DType,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let ChunkedWeight { ggml, rows, cols, chunk } = weight;
    let ctx = e.ctx();
    let loc = e.loc();
    let index_ty = TensorType::new([], DType::I64);
    let chunk_bytes = ggml
        .byte_len((chunk * cols) as u64)
        .ok_or_else(|| e.error(format!("{ggml}: {chunk} rows of {cols} values are not whole blocks")))?
        as usize;
    let raw_ty = TensorType::new([chunk_bytes], raw_dtype);
    let part_ty = TensorType::new([chunk, cols], DType::F32);
    let product_ty = TensorType::new([DYNAMIC, chunk], DType::F32);
    let prompt_rows = e.dynamic_index()?;
    // Each step's product starts from zeros of the run-time size, which
    // only the function's own block can read.
    let product_init = super::constant::lower_constant(e, 0.0, &product_ty)?;
    let chunks = Chunks { ggml, raw, raw_ty, part_ty, x, product_init, product_ty, prompt_rows, chunk };
    // Software-pipelined: each step multiplies the rows the step before
    // dequantized while it dequantizes the next, two independent dispatches
    // that IREE runs side by side; the last rows' product follows the loop.
    // The result starts as the first rows' product padded to the whole
    // width, a value of this loop's own: from a zero splat, which every
    // loop of the same shape shares, IREE 3.13 wrote two loops' columns
    // into one buffer.
    // The blocks dequantized before the loop wait for `x` (`after_x`): with
    // nothing to wait for, IREE 3.13 ran every loop's first blocks at the
    // start of the function. In `generate`, whose prompt graph a loop of
    // decode steps follows, each call then took 1.4 GB more and 3x longer
    // (Gemma 3n E2B, 5 tokens: 5.0 s against 1.6).
    let zero = super::constant::lower_constant(e, 0.0, &TensorType::new([], DType::F32))?;
    let after_x = zero_after(e, x, zero)?;
    let first = chunks.dequantize(e, index_constant(e, 0)?, Some(after_x))?;
    let first = weight_product_into(e, x, first, 1, product_init, &chunks.product_ty)?;
    let init = super::layout::lower_pad(e, first, zero, [&[0, 0], &[0, rows - chunk], &[0, 0]], e.tensor_type(ty))?;
    let second = chunks.dequantize(e, index_constant(e, 1)?, Some(after_x))?;
    let carried = [index_constant(e, 1)?, init, second];
    let carried_types = [e.tensor_type(&index_ty), e.tensor_type(ty), e.tensor_type(&chunks.part_ty)];
    let block_args: Vec<(Type, Location)> = carried_types.iter().map(|&ty| (ty, loc)).collect();

    let (cond_region, body_region) = (Region::new(), Region::new());
    let cond = cond_region.append_block(Block::new(&block_args));
    let function = Function::without_inputs();
    {
        let e = &Emitter { block: &cond, function: &function, ..*e };
        let i = cond.argument(0).expect("three carried values").into();
        let more = compare(e, i, index_constant(e, rows / chunk - 1)?, ComparisonDirection::Lt)?;
        cond.append_operation(stablehlo::r#return(ctx, &[more], loc).into());
    }
    let body = body_region.append_block(Block::new(&block_args));
    {
        let e = &Emitter { block: &body, function: &function, ..*e };
        let arg = |n: usize| -> Value { body.argument(n).expect("three carried values").into() };
        let next = e.emit(stablehlo::add(ctx, e.tensor_type(&index_ty), arg(0), index_constant(e, 1)?, loc))?;
        let part = chunks.dequantize(e, next, None)?;
        let out = chunks.multiply(e, arg(2), arg(0), arg(1))?;
        body.append_operation(stablehlo::r#return(ctx, &[next, out, part], loc).into());
    }
    let op = stablehlo::r#while(ctx, &carried_types, &carried, cond_region, body_region, loc);
    let op = e.block.append_operation(op.into());
    let result = |n: usize| -> Result<Value<'c, 'a>, LowerError> {
        Ok(op.result(n).map_err(|err| e.error(format!("while has no result {n}: {err}")))?.into())
    };
    chunks.multiply(e, result(2)?, result(0)?, result(1)?)
}

/// What each step of [`lower_chunked_weight_product`] reads.
struct Chunks<'c, 'a> {
    ggml: GgmlType,
    /// The weight's blocks, `[bytes]`.
    raw: Value<'c, 'a>,
    /// One chunk's blocks and its dequantized rows.
    raw_ty: TensorType,
    part_ty: TensorType,
    /// The prompt's rows, `[?, cols]`.
    x: Value<'c, 'a>,
    /// Zeros `[?, chunk]`, each product's start, and the `?` as an index.
    product_init: Value<'c, 'a>,
    product_ty: TensorType,
    prompt_rows: Value<'c, 'a>,
    chunk: usize,
}

impl<'c, 'a> Chunks<'c, 'a> {
    /// Chunk `i`'s rows (a `tensor<i64>`) as f32: its blocks' bytes, a
    /// slice of `raw`, through the private function of a whole `dequantize`
    /// of that shape; with `after`, a zero read from the prompt's rows
    /// ([`zero_after`]) added where the values are made, so that the
    /// dequantization waits for `x`.
    fn dequantize<'b>(
        &self,
        e: &Emitter<'c, 'b>,
        i: Value<'c, 'b>,
        after: Option<Value<'c, 'b>>,
    ) -> Result<Value<'c, 'b>, LowerError>
    where
        'a: 'b,
    {
        let (ctx, loc) = (e.ctx(), e.loc());
        let bytes = self.raw_ty.shape[0];
        let index = e.tensor_type(&TensorType::new([], DType::I64));
        let start = e.emit(stablehlo::multiply(ctx, index, i, index_constant(e, bytes)?, loc))?;
        let raw_ty = e.tensor_type(&self.raw_ty);
        let part = e.emit(stablehlo::dynamic_slice(ctx, raw_ty, self.raw, &[start], e.i64_array(&[bytes]), loc))?;
        super::dequantize::lower_dequantize_after(e, self.ggml, part, &self.raw_ty, &self.part_ty, after)
    }

    /// `out` with chunk `i`'s columns the product of the prompt's rows and
    /// `part`, that chunk's f32 rows.
    fn multiply<'b>(
        &self,
        e: &Emitter<'c, 'b>,
        part: Value<'c, 'b>,
        i: Value<'c, 'b>,
        out: Value<'c, 'b>,
    ) -> Result<Value<'c, 'b>, LowerError>
    where
        'a: 'b,
    {
        let product = weight_product_into(e, self.x, part, 1, self.product_init, &self.product_ty)?;
        let index = e.tensor_type(&TensorType::new([], DType::I64));
        let column = e.emit(stablehlo::multiply(e.ctx(), index, i, index_constant(e, self.chunk)?, e.loc()))?;
        insert_columns(e, product, out, column, self.prompt_rows, self.chunk)
    }
}

/// `x[0, 0] * zero`: a `tensor<f32>` zero that IREE cannot fold (`v * 0` is
/// not `0` for an infinite or NaN `v`), computed from `x [?, n]` (`?` at
/// least 1, as the prompt's graph reads its last row). Added to a value, it
/// orders that value's computation after `x`'s and changes nothing, but
/// where `x[0, 0]` is not finite, which the prompt's products and attention
/// spread to every position anyway.
fn zero_after<'c, 'a>(e: &Emitter<'c, 'a>, x: Value<'c, 'a>, zero: Value<'c, 'a>) -> Result<Value<'c, 'a>, LowerError> {
    let (ctx, loc) = (e.ctx(), e.loc());
    let origin = [index_constant(e, 0)?, index_constant(e, 0)?];
    let corner_ty = e.tensor_type(&TensorType::new([1, 1], DType::F32));
    let corner = e.emit(stablehlo::dynamic_slice(ctx, corner_ty, x, &origin, e.i64_array(&[1, 1]), loc))?;
    let scalar = e.tensor_type(&TensorType::new([], DType::F32));
    let corner = e.emit(stablehlo::reshape(ctx, scalar, corner, loc))?;
    e.emit(stablehlo::multiply(ctx, scalar, corner, zero, loc))
}

/// `product [?, chunk]` written into `out [?, n]` from column `column` (a
/// `tensor<i64>`), `rows` the run-time `?`: `tensor.insert_slice`, as
/// iree-compile 3.13 cannot legalize a `stablehlo.dynamic_update_slice`
/// with a `?` dim.
fn insert_columns<'c, 'a>(
    e: &Emitter<'c, 'a>,
    product: Value<'c, 'a>,
    out: Value<'c, 'a>,
    column: Value<'c, 'a>,
    rows: Value<'c, 'a>,
    chunk: usize,
) -> Result<Value<'c, 'a>, LowerError> {
    let (ctx, loc) = (e.ctx(), e.loc());
    let build = |op: Result<melior::ir::Operation<'c>, melior::Error>| {
        op.map_err(|err| e.error(format!("cannot build the columns' insert: {err}")))
    };
    let i64_type = IntegerType::new(ctx, 64).into();
    let column = e.emit(build(
        OperationBuilder::new("tensor.extract", loc).add_operands(&[column]).add_results(&[i64_type]).build(),
    )?)?;
    let column = e.emit(super::dialects::arith::index_cast(ctx, Type::index(ctx), column, loc))?;
    let dynamic = i64::MIN;
    let attr = |name: &str, value: Attribute<'c>| (Identifier::new(ctx, name), value);
    let array = |values: &[i64]| DenseI64ArrayAttribute::new(ctx, values).into();
    let insert = OperationBuilder::new("tensor.insert_slice", loc)
        .add_operands(&[product, out, column, rows])
        .add_results(&[out.r#type()])
        .add_attributes(&[
            attr("static_offsets", array(&[0, dynamic])),
            attr("static_sizes", array(&[dynamic, chunk as i64])),
            attr("static_strides", array(&[1, 1])),
            attr("operandSegmentSizes", e.parse_attribute("array<i32: 1, 1, 1, 1, 0>")?),
        ])
        .build();
    e.emit(build(insert)?)
}

/// `value` as a `tensor<i64>` constant: a loop's counter and offsets.
fn index_constant<'c, 'a>(e: &Emitter<'c, 'a>, value: usize) -> Result<Value<'c, 'a>, LowerError> {
    super::constant::lower_constant(e, value as f64, &TensorType::new([], DType::I64))
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
