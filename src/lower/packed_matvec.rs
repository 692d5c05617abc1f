//! `packed_matvec` as one `linalg.generic` that decodes the ggml blocks in
//! its body, with a CPU lowering config that IREE keeps.
//!
//! The matrices come tiled by rows (`tile_rows`, computed once at load for
//! a param): `[tiles, blocks, type_size, lanes]`, the same byte of `lanes`
//! rows side by side. The generic's dims are the tiles `t` and their rows
//! `r` (parallel) and the blocks `b` (reduction), and its operands plain
//! slices: each byte offset of the blocks `[tiles, blocks, lanes]`, and
//! each value of `x` (and the sums of its runs, [`Group`]) `[blocks]`.
//! Vectorized along `r`, one load widens one byte of 16 rows, every
//! decoding step (nibbles, scales, the 6-bit K-quant scales) runs once for
//! 16 rows, `x` is a broadcast, and each row's sum stays in its lane: no
//! sum across lanes, and each row's result is where it is accumulated.
//! Against the rows' own layout (16 consecutive values of one row in the
//! lanes, which also had to be summed across lanes after) a decode step's
//! Q4_K products stream 1.8x faster (16 of Llama-3.2-1B's 8192 x 2048
//! gate and up matrices, 151 MB: 9.4 against 17.3 ms, 2 threads).
//!
//! Why not StableHLO: IREE 3.13 vectorizes a reduction over a packed row
//! along the values of one block and sums each vector across its lanes
//! every step, and fuses any elementwise dequantization into the
//! reduction, dropping a lowering config given to it.
//!
//! The decoding is the CPU dequantizer's arithmetic on integers, with each
//! group of values that share a scale and min summed as ggml's dot kernels
//! do, `scale · Σ q·x + min · Σ x` ([`Group`]). The levels of IQ4 and MXFP4
//! come from a 16-entry table packed in four i32 constants
//! ([`NibbleTable`]): three selects and two shifts per value, on registers.
//! MXFP4's scale is a power of two, built as f32 bits from its e8m0 byte;
//! its subnormal scales are zeros ([`Body::e8m0_half`]). Several matrices
//! of one type and shape that share `x` are one generic: streaming them
//! side by side is faster than one after the other.
//!
//! The generic carries no lowering config, only a tag naming the one
//! llvm-cpu wants (`kiln.kernel`, [`kernel_tag`]), which `iree-compile`
//! applies from kiln's host tuning spec (`iree::HOST_TUNING_SPEC`): one tile
//! per workgroup (four for a vocabulary head, [`WIDE_ROWS`]), 16 lanes per
//! vector, one block per reduction step. A config on the op would apply to
//! every target and fail the GPU ones; without it GPUs pick their own.

use super::constant::lower_constant;
use super::dequantize::ggml_callee;
use super::dialects::stablehlo;
use super::layout::lower_concatenate;
use super::reduce::lower_reduce_all;
use super::{Emitter, Function, FunctionKind, LowerError};
use crate::graph::{DType, ReduceKind, TensorType};
use crate::trace::dequant::{packed_byte_positions, NibbleTable, KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::weights::ggml::GgmlType;
use melior::dialect::func;
use melior::ir::attribute::{FloatAttribute, IntegerAttribute};
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::{FunctionType, IntegerType};
use melior::ir::{Attribute, Block, BlockLike, Identifier, Location, Region, RegionLike, Type, Value, ValueLike};
use melior::Context;
use std::collections::HashMap;

/// Products with at least this many rows (vocabulary heads) take 4 tiles
/// of rows per workgroup, others 1: Gemma-3-270M's 262144-row head then
/// runs 4096 workgroups instead of 16384, while a 1536-row product split 24
/// ways balances worse over the threads than 96 ways.
const WIDE_ROWS: usize = 16384;

/// The `kiln.kernel` tag of a generic that wants llvm-cpu's config of
/// `tiles` tiles of rows per workgroup, one tile per vector step and one
/// block per reduction step: the host tuning spec (`iree::HOST_TUNING_SPEC`)
/// holds one entry per tag.
fn kernel_tag(tiles: usize) -> String {
    format!("\"packed_matvec_t{tiles}\"")
}

/// A call to one private function per (ggml type, raw type, shape, number
/// of matrices), appended at its first use: a model's hundreds of products
/// come in a handful of shapes, and each body is a few hundred ops.
/// iree-compile inlines the calls again.
pub(super) fn lower_packed_matvec<'c, 'a>(
    e: &Emitter<'c, 'a>,
    ggml: GgmlType,
    matrices: &[Value<'c, 'a>],
    raw_ty: &TensorType,
    x: Value<'c, 'a>,
    x_ty: &TensorType,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let (n, columns) = (matrices.len(), x_ty.shape[0]);
    let matrices_part = if n == 1 { String::new() } else { n.to_string() };
    let columns_part = if columns == 1 { String::new() } else { format!("_x{columns}") };
    let callee = ggml_callee(&format!("packed_matvec{matrices_part}{columns_part}"), ggml, raw_ty, &raw_ty.shape);
    let arg_types: Vec<Type> = (0..n).map(|_| e.tensor_type(raw_ty)).chain([e.tensor_type(x_ty)]).collect();
    // One `[1, tiles · lanes]` result per matrix and column of x.
    let rows = raw_ty.shape[0] * raw_ty.shape.last().copied().unwrap_or(1);
    let row_types = vec![e.tensor_type(&TensorType::new([1, rows], DType::F32)); n * columns];
    if e.scope.callees.borrow_mut().insert(callee.clone()) {
        let ctx = e.ctx();
        let loc = Location::name(ctx, &callee, Location::unknown(ctx));
        let block = Block::new(&arg_types.iter().map(|&t| (t, loc)).collect::<Vec<_>>());
        {
            let function = Function::without_inputs();
            let inner = Emitter { block: &block, function: &function, node: &callee, ..*e };
            let arg = |i: usize| -> Value { block.argument(i).expect("one argument per operand").into() };
            let rows = emit_body(&inner, ggml, (0..n).map(arg).collect(), raw_ty, arg(n), columns)?;
            block.append_operation(func::r#return(&rows, loc));
        }
        let function_type = FunctionType::new(e.ctx(), &arg_types, &row_types);
        e.session.append_function(e.scope, &callee, function_type, block, FunctionKind::Private, &[]);
    }
    let operands: Vec<Value> = matrices.iter().copied().chain([x]).collect();
    let rows = e.call(&callee, &operands, &row_types);
    // The rows are concatenated here, not in the callee, so that
    // `lower_slice` sees that a slice of one row is that row.
    match rows[..] {
        [y] => Ok(y),
        _ => lower_concatenate(e, &rows, 0, e.tensor_type(ty)),
    }
}

/// The body of [`lower_packed_matvec`]'s function: one generic over the
/// tiles and their rows that streams every matrix's blocks and yields each
/// matrix's rows times each of the `columns` rows of `x`; a `[1, tiles ·
/// lanes]` result per matrix and column, matrix-major. The body decodes a
/// block once for all columns ([`Group::push`]).
fn emit_body<'c, 'a>(
    e: &Emitter<'c, 'a>,
    ggml: GgmlType,
    matrices: Vec<Value<'c, 'a>>,
    raw_ty: &TensorType,
    x: Value<'c, 'a>,
    columns: usize,
) -> Result<Vec<Value<'c, 'a>>, LowerError> {
    let [tiles, blocks, size, lanes] = raw_ty.shape[..] else {
        return Err(e.error(format!("packed_matvec: expects [tiles, blocks, type_size, lanes] bytes, found {raw_ty}")));
    };
    let ctx = e.ctx();
    // arith takes signless integers: view ui8 bytes as i8.
    let bytes_ty = TensorType::new([tiles, blocks, size, lanes], DType::I8);
    let matrices = matrices
        .into_iter()
        .map(|raw| match raw_ty.dtype {
            DType::I8 => Ok(raw),
            _ => e.emit(stablehlo::bitcast_convert(ctx, e.tensor_type(&bytes_ty), raw, e.loc())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let n = matrices.len();
    let bs = ggml.block_size();
    let x_ty = TensorType::new([columns, blocks, bs], DType::F32);
    let x = e.emit(stablehlo::reshape(ctx, e.tensor_type(&x_ty), x, e.loc()))?;

    let mut operands = Operands {
        e,
        matrices,
        x,
        x_sums: HashMap::new(),
        position: packed_byte_positions(ggml, size),
        block_size: bs,
        tiles,
        blocks,
        lanes,
        columns,
        values: Vec::new(),
        maps: Vec::new(),
        args: HashMap::new(),
    };
    let body = Block::new(&[]);
    {
        let mut b = Body { ctx, block: &body, operands: &mut operands, matrix: 0 };
        let mut sums = Vec::with_capacity(n * columns);
        for m in 0..n {
            b.matrix = m;
            sums.extend(decode(&mut b, ggml)?);
        }
        // The accumulators follow every input among the body's arguments.
        let totals: Vec<Value> = sums
            .into_iter()
            .map(|sum| {
                let acc = body.add_argument(b.f32(), e.loc());
                b.binary("arith.addf", acc, sum)
            })
            .collect();
        body.append_operation(
            OperationBuilder::new("linalg.yield", e.loc())
                .add_operands(&totals)
                .build()
                .map_err(|err| e.error(format!("linalg.yield: {err}")))?,
        );
    }
    let Operands { values, mut maps, .. } = operands;

    let out_ty = TensorType::new([tiles, lanes], DType::F32);
    let init = lower_constant(e, 0.0, &out_ty)?;
    let outputs = n * columns;
    maps.extend(std::iter::repeat_n("affine_map<(t, r, b) -> (t, r)>", outputs));
    let maps = format!("[{}]", maps.join(", "));
    let parallel = "#linalg.iterator_type<parallel>";
    let iterators = format!("[{parallel}, {parallel}, #linalg.iterator_type<reduction>]");
    let segments = format!("array<i32: {}, {outputs}>", values.len());
    let region = Region::new();
    region.append_block(body);
    let attr = |name: &str, text: &str| -> Result<_, LowerError> {
        Ok((Identifier::new(ctx, name), e.parse_attribute(text)?))
    };
    let tiles_per_workgroup = if tiles * lanes >= WIDE_ROWS { 4 } else { 1 };
    let generic = OperationBuilder::new("linalg.generic", e.loc())
        .add_operands(&values)
        .add_operands(&vec![init; outputs])
        .add_results(&vec![e.tensor_type(&out_ty); outputs])
        .add_attributes(&[
            attr("indexing_maps", &maps)?,
            attr("iterator_types", &iterators)?,
            attr("operandSegmentSizes", &segments)?,
            attr("kiln.kernel", &kernel_tag(tiles_per_workgroup))?,
        ])
        .add_regions([region])
        .build()
        .map_err(|err| e.error(format!("linalg.generic: {err}")))?;
    let generic = e.block.append_operation(generic);
    let row_ty = TensorType::new([1, tiles * lanes], DType::F32);
    (0..outputs)
        .map(|i| {
            let y = generic.result(i).expect("one result per matrix and column").into();
            e.emit(stablehlo::reshape(ctx, e.tensor_type(&row_ty), y, e.loc()))
        })
        .collect()
}

/// The generic's inputs, each added once at its first use: a slice of the
/// tiled blocks or of `x`, its indexing map, and its body argument.
struct Operands<'e, 'c, 'a> {
    e: &'e Emitter<'c, 'a>,
    /// Each matrix's tiled blocks as i8 `[tiles, blocks, type_size, lanes]`.
    matrices: Vec<Value<'c, 'a>>,
    /// `x` as `[columns, blocks, block_size]`.
    x: Value<'c, 'a>,
    /// `x`'s sums over runs of a length, `[columns, blocks, block_size /
    /// length]`, by length, made at first use.
    x_sums: HashMap<usize, Value<'c, 'a>>,
    /// Where each of ggml's block bytes lies in a tiled block
    /// (`packed_byte_order`).
    position: Vec<usize>,
    /// Values per block.
    block_size: usize,
    tiles: usize,
    blocks: usize,
    lanes: usize,
    columns: usize,
    values: Vec<Value<'c, 'a>>,
    maps: Vec<&'static str>,
    args: HashMap<Input, usize>,
}

/// What a body argument reads.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
enum Input {
    /// Matrix `.0`'s byte at offset `.1` in each block, of each row:
    /// `[tiles, blocks, lanes]`.
    Byte(usize, usize),
    /// Column `.0` of `x`: its value at offset `.1` in each block,
    /// `[blocks]`.
    X(usize, usize),
    /// Column `.0` of `x`: the sum of its values `start .. start + len` of
    /// each block, `(.0, start, len)`: `[blocks]`.
    XSum(usize, usize, usize),
}

impl<'c, 'a> Operands<'_, 'c, 'a> {
    fn slice(
        &self,
        of: Value<'c, 'a>,
        start: &[usize],
        limit: &[usize],
        out: &TensorType,
    ) -> Result<Value<'c, 'a>, LowerError> {
        let e = self.e;
        let strides = vec![1; start.len()];
        let sliced = TensorType::new(limit.iter().zip(start).map(|(l, s)| l - s).collect::<Vec<_>>(), out.dtype);
        let v = e.emit(stablehlo::slice(
            e.ctx(),
            e.tensor_type(&sliced),
            of,
            e.i64_array(start),
            e.i64_array(limit),
            e.i64_array(&strides),
            e.loc(),
        ))?;
        if sliced.shape == out.shape {
            return Ok(v);
        }
        e.emit(stablehlo::reshape(e.ctx(), e.tensor_type(out), v, e.loc()))
    }

    /// `x`'s sums over runs of `len` values: one small reduce outside the
    /// generic, shared by every row, instead of a sum per row in its body.
    fn x_sums(&mut self, len: usize) -> Result<Value<'c, 'a>, LowerError> {
        if let Some(&v) = self.x_sums.get(&len) {
            return Ok(v);
        }
        let e = self.e;
        let (columns, blocks, runs) = (self.columns, self.blocks, self.block_size / len);
        let split = TensorType::new([columns, blocks, runs, len], DType::F32);
        let split = e.emit(stablehlo::reshape(e.ctx(), e.tensor_type(&split), self.x, e.loc()))?;
        let sums_ty = TensorType::new([columns, blocks, runs], DType::F32);
        let sums = lower_reduce_all(e, ReduceKind::Sum, &[split], &[3], &sums_ty)?;
        Ok(*self.x_sums.entry(len).or_insert(sums[0]))
    }

    /// The operand for `input`, sliced and recorded at its first use.
    fn value(&mut self, input: Input) -> Result<(Value<'c, 'a>, &'static str), LowerError> {
        let (tiles, blocks, lanes) = (self.tiles, self.blocks, self.lanes);
        Ok(match input {
            Input::Byte(m, off) => (
                self.slice(
                    self.matrices[m],
                    &[0, 0, self.position[off], 0],
                    &[tiles, blocks, self.position[off] + 1, lanes],
                    &TensorType::new([tiles, blocks, lanes], DType::I8),
                )?,
                "affine_map<(t, r, b) -> (t, b, r)>",
            ),
            Input::X(c, j) => (
                self.slice(self.x, &[c, 0, j], &[c + 1, blocks, j + 1], &TensorType::new([blocks], DType::F32))?,
                "affine_map<(t, r, b) -> (b)>",
            ),
            Input::XSum(c, start, len) => {
                let sums = self.x_sums(len)?;
                let run = start / len;
                let column = TensorType::new([blocks], DType::F32);
                (self.slice(sums, &[c, 0, run], &[c + 1, blocks, run + 1], &column)?, "affine_map<(t, r, b) -> (b)>")
            }
        })
    }
}

/// Builds the generic's body: scalar arith on one row's block.
struct Body<'b, 'e, 'c, 'a> {
    ctx: &'c Context,
    block: &'b Block<'c>,
    operands: &'b mut Operands<'e, 'c, 'a>,
    /// The matrix whose blocks [`Body::byte`] and [`Body::f16`] read.
    matrix: usize,
}

impl<'b, 'c> Body<'b, '_, 'c, '_> {
    fn f32(&self) -> Type<'c> {
        Type::float32(self.ctx)
    }

    fn int(&self, bits: u32) -> Type<'c> {
        IntegerType::new(self.ctx, bits).into()
    }

    fn arg(&mut self, input: Input) -> Result<Value<'c, 'b>, LowerError> {
        if let Some(&i) = self.operands.args.get(&input) {
            return Ok(self.block.argument(i).expect("added below").into());
        }
        let (value, map) = self.operands.value(input)?;
        let elem = match input {
            Input::X(..) | Input::XSum(..) => self.f32(),
            Input::Byte(..) => self.int(8),
        };
        let i = self.operands.values.len();
        self.operands.values.push(value);
        self.operands.maps.push(map);
        self.operands.args.insert(input, i);
        Ok(self.block.add_argument(elem, self.operands.e.loc()))
    }

    /// The block's byte at `offset`, of 16 rows at once. Bit fields are
    /// taken apart on bytes (a vector of 16 is one xmm register) and only
    /// the integer each value becomes is widened, by its conversion to f32:
    /// on i32 lanes, a Q6_K product took 2.5x a Q4_K one per value.
    fn byte(&mut self, offset: usize) -> Result<Value<'c, 'b>, LowerError> {
        self.arg(Input::Byte(self.matrix, offset))
    }

    /// Bits `shift .. shift + width` of the block's byte at `offset`.
    fn field(&mut self, offset: usize, shift: usize, width: usize) -> Result<Value<'c, 'b>, LowerError> {
        let byte = self.byte(offset)?;
        Ok(self.bits(byte, shift, width))
    }

    /// The block's byte at `offset` as a signed integer, to f32.
    fn signed_float(&mut self, offset: usize) -> Result<Value<'c, 'b>, LowerError> {
        let byte = self.byte(offset)?;
        Ok(self.sfloat(byte))
    }

    fn op(&self, name: &str, operands: &[Value<'c, 'b>], result: Type<'c>) -> Value<'c, 'b> {
        self.op_with(name, operands, None, result)
    }

    /// `name` with `operands` and one attribute, if any, to one `result`.
    fn op_with(
        &self,
        name: &str,
        operands: &[Value<'c, 'b>],
        attribute: Option<(&str, Attribute<'c>)>,
        result: Type<'c>,
    ) -> Value<'c, 'b> {
        let attributes: Vec<_> = attribute.into_iter().map(|(k, v)| (Identifier::new(self.ctx, k), v)).collect();
        let op = OperationBuilder::new(name, self.operands.e.loc())
            .add_operands(operands)
            .add_attributes(&attributes)
            .add_results(&[result])
            .build()
            .expect("a generic op with operands and one result builds");
        self.block.append_operation(op).result(0).expect("one result").into()
    }

    fn binary(&self, name: &str, lhs: Value<'c, 'b>, rhs: Value<'c, 'b>) -> Value<'c, 'b> {
        self.op(name, &[lhs, rhs], lhs.r#type())
    }

    fn cast(&self, name: &str, v: Value<'c, 'b>, to: Type<'c>) -> Value<'c, 'b> {
        self.op(name, &[v], to)
    }

    /// An integer constant of `v`'s type.
    fn int_const(&self, v: Value<'c, 'b>, value: i64) -> Value<'c, 'b> {
        let attr = IntegerAttribute::new(v.r#type(), value).into();
        self.op_with("arith.constant", &[], Some(("value", attr)), v.r#type())
    }

    fn and(&self, v: Value<'c, 'b>, mask: i64) -> Value<'c, 'b> {
        let c = self.int_const(v, mask);
        self.binary("arith.andi", v, c)
    }

    fn or(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Value<'c, 'b> {
        self.binary("arith.ori", a, b)
    }

    fn shr(&self, v: Value<'c, 'b>, bits: i64) -> Value<'c, 'b> {
        if bits == 0 {
            return v;
        }
        let c = self.int_const(v, bits);
        self.binary("arith.shrui", v, c)
    }

    fn shl(&self, v: Value<'c, 'b>, bits: i64) -> Value<'c, 'b> {
        if bits == 0 {
            return v;
        }
        let c = self.int_const(v, bits);
        self.binary("arith.shli", v, c)
    }

    /// Bits `shift .. shift + width` of the byte `v`.
    fn bits(&self, v: Value<'c, 'b>, shift: usize, width: usize) -> Value<'c, 'b> {
        let v = self.shr(v, shift as i64);
        if shift + width >= 8 && shift > 0 {
            // The logical shift leaves nothing above the field.
            return v;
        }
        self.and(v, (1 << width) - 1)
    }

    /// Bits `shift .. shift + width` of `v` moved to bit `at`: one shift and
    /// one mask.
    fn place(&self, v: Value<'c, 'b>, shift: usize, width: usize, at: usize) -> Value<'c, 'b> {
        let moved = match shift.cmp(&at) {
            std::cmp::Ordering::Less => self.shl(v, (at - shift) as i64),
            _ => self.shr(v, (shift - at) as i64),
        };
        self.and(moved, ((1 << width) - 1) << at)
    }

    fn float_const(&self, value: f32) -> Value<'c, 'b> {
        let attr = FloatAttribute::new(self.ctx, self.f32(), value.into()).into();
        self.op_with("arith.constant", &[], Some(("value", attr)), self.f32())
    }

    fn sub_int(&self, v: Value<'c, 'b>, value: i64) -> Value<'c, 'b> {
        if value == 0 {
            return v;
        }
        let c = self.int_const(v, value);
        self.binary("arith.subi", v, c)
    }

    fn zext(&self, v: Value<'c, 'b>, bits: u32) -> Value<'c, 'b> {
        self.cast("arith.extui", v, self.int(bits))
    }

    /// Unsigned integer to f32.
    fn ufloat(&self, v: Value<'c, 'b>) -> Value<'c, 'b> {
        self.cast("arith.uitofp", v, self.f32())
    }

    /// Signed integer to f32.
    fn sfloat(&self, v: Value<'c, 'b>) -> Value<'c, 'b> {
        self.cast("arith.sitofp", v, self.f32())
    }

    /// The little-endian f16 at `offset`, as f32: its two bytes, each a
    /// slice of its own in this layout.
    fn f16(&mut self, offset: usize) -> Result<Value<'c, 'b>, LowerError> {
        let (low, high) = (self.byte(offset)?, self.byte(offset + 1)?);
        let (low, high) = (self.zext(low, 16), self.zext(high, 16));
        let bits = self.or(low, self.shl(high, 8));
        let half = self.cast("arith.bitcast", bits, Type::float16(self.ctx));
        Ok(self.cast("arith.extf", half, self.f32()))
    }

    /// The e8m0 byte at `offset` as ggml's `ggml_e8m0_to_fp32_half` reads
    /// it, `2^(e - 128)` from its bits `(e - 1) << 23`, except that the
    /// subnormal scales (`e < 2`) are zeros: `(max(e, 1) - 1) << 23`. IREE's
    /// runtime reads a subnormal operand as zero anyway (`trace::dequant`'s
    /// module doc). Two normal factors, as `dequantize` builds, would keep
    /// those blocks' values (all below `12 * 2^-127`) at a second multiply
    /// per block.
    fn e8m0_half(&mut self, offset: usize) -> Result<Value<'c, 'b>, LowerError> {
        let e = self.byte(offset)?;
        let e = self.zext(e, 32);
        let exponent = self.sub_int(self.binary("arith.maxui", e, self.int_const(e, 1)), 1);
        Ok(self.cast("arith.bitcast", self.shl(exponent, 23), self.f32()))
    }

    /// `table`'s level at `code` (a byte in `0..16`), sign-extended to
    /// i32: the word that bits 3 and 2 of `code` select, shifted left by `8
    /// * (code & 3)` and arithmetically right by 24 ([`NibbleTable`]).
    fn lookup(&self, table: &NibbleTable, code: Value<'c, 'b>) -> Value<'c, 'b> {
        let code = self.zext(code, 32);
        let word = |k: usize| self.int_const(code, table.words[k].into());
        let bit = |mask: i64| {
            // arith.cmpi's predicate 1 is `ne`.
            let predicate = IntegerAttribute::new(self.int(64), 1).into();
            let zero = self.int_const(code, 0);
            self.op_with("arith.cmpi", &[self.and(code, mask), zero], Some(("predicate", predicate)), self.int(1))
        };
        let (bit2, bit3) = (bit(4), bit(8));
        let select = |pred, on_true, on_false| self.op("arith.select", &[pred, on_true, on_false], code.r#type());
        let low = select(bit2, word(1), word(0));
        let high = select(bit2, word(3), word(2));
        let top = self.binary("arith.shli", select(bit3, high, low), self.shl(self.and(code, 3), 3));
        self.binary("arith.shrsi", top, self.int_const(top, 24))
    }

    fn mul(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Value<'c, 'b> {
        self.binary("arith.mulf", a, b)
    }

    fn add(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Value<'c, 'b> {
        self.binary("arith.addf", a, b)
    }

    fn neg(&self, a: Value<'c, 'b>) -> Value<'c, 'b> {
        self.op("arith.negf", &[a], a.r#type())
    }
}

/// Values of one block of one row that share a scale and a min, as ggml's
/// dot kernels factor them: `scale · Σ q·x + min · Σ x` over the group's
/// integer values `q` (exact in f32), where the dequantized weights give
/// `Σ (scale · q + min) · x`: the same sum, rounded differently, with two
/// multiplies per group instead of one or two per value. Offsets of the
/// integers (Q6_K's `q - 32`) are mins too. `Σ x` is summed once outside
/// the generic ([`Operands::x_sums`]). The products are added as the values
/// are decoded ([`Group::push`]), in the order of the bytes they come from,
/// and a group is added to the block's sum as soon as its last value is:
/// each byte's values are used at once, and only the groups that share
/// bytes are open together, which keeps LLVM from holding a whole block in
/// registers (spilling) to reorder it.
struct Group<'c, 'b> {
    scale: Option<Value<'c, 'b>>,
    min: Option<Value<'c, 'b>>,
    /// `Σ q·x` for each column of `x`, from the first value on.
    sums: Vec<Value<'c, 'b>>,
    /// The block indices of the group's values, which are contiguous.
    first: usize,
    count: usize,
}

impl<'c, 'b> Group<'c, 'b> {
    fn new(scale: Option<Value<'c, 'b>>, min: Option<Value<'c, 'b>>) -> Self {
        Group { scale, min, sums: Vec::new(), first: usize::MAX, count: 0 }
    }

    /// Adds `q · x[j]` for each column of `x`, `q` the integer value at
    /// index `j` of the block: its products side by side, so that `q` is
    /// live for a few instructions only (column by column, 4 columns spilled
    /// the values between them and took 3.75x one column's time).
    fn push(&mut self, b: &mut Body<'b, '_, 'c, '_>, q: Value<'c, 'b>, j: usize) -> Result<(), LowerError> {
        for column in 0..b.operands.columns {
            let x = b.arg(Input::X(column, j))?;
            let p = b.mul(q, x);
            match self.sums.get_mut(column) {
                Some(sum) => *sum = b.add(*sum, p),
                None => self.sums.push(p),
            }
        }
        self.first = self.first.min(j);
        self.count += 1;
        Ok(())
    }

    /// Adds `scale · Σ q·x + min · Σ x` to the block's total of each column.
    fn add_to(self, b: &mut Body<'b, '_, 'c, '_>, totals: &mut Totals<'c, 'b>) -> Result<(), LowerError> {
        if self.sums.is_empty() {
            return Err(b.operands.e.error("packed_matvec: a group with no values"));
        }
        for (column, (sum, total)) in self.sums.into_iter().zip(totals.iter_mut()).enumerate() {
            let sum = self.scale.map_or(sum, |d| b.mul(d, sum));
            let sum = match self.min {
                Some(m) => {
                    let x_sum = b.arg(Input::XSum(column, self.first, self.count))?;
                    b.add(sum, b.mul(m, x_sum))
                }
                None => sum,
            };
            *total = Some(total.map_or(sum, |t| b.add(t, sum)));
        }
        Ok(())
    }
}

/// A block's sum for each column of `x` (`None` before its first group),
/// each group added as soon as its last value is.
type Totals<'c, 'b> = Vec<Option<Value<'c, 'b>>>;

/// `Σ w·x` over one row's block for each column of x, its values decoded as ggml's CPU
/// dequantizer does (`weights::quant`) in groups of integers that share a
/// scale and min ([`Group`]). For IQ4_XS a value is
/// `(ls - 32) · level`, the CPU's `(d · (ls - 32)) · level` without `d`,
/// both products exact. MXFP4's scale is a power of two, which commutes
/// with rounding: `scale · Σ q·x` has the bits of `Σ (scale · q)·x` summed
/// in the same order, unless the product overflows or is subnormal (IREE's
/// runtime writes a subnormal as zero; the subnormal scales themselves are
/// zeros here, [`Body::e8m0_half`]).
fn decode<'b, 'c>(b: &mut Body<'b, '_, 'c, '_>, ggml: GgmlType) -> Result<Vec<Value<'c, 'b>>, LowerError> {
    use GgmlType as T;
    // `scale · -offset`: the min of integers stored `offset` above their value.
    let offset_min = |b: &Body<'b, '_, 'c, '_>, scale: Value<'c, 'b>, offset: f32| {
        let c = b.float_const(-offset);
        b.mul(scale, c)
    };
    let mut total: Totals = vec![None; b.operands.columns];
    match ggml {
        // block_q8_0 { d; qs[32] }: d * qs.
        T::Q8_0 => {
            let mut g = Group::new(Some(b.f16(0)?), None);
            for j in 0..32 {
                let q = b.signed_float(2 + j)?;
                g.push(b, q, j)?;
            }
            g.add_to(b, &mut total)?;
        }
        // block_q4_0 { d; qs[16] }: d * (nibble - 8), low nibbles first;
        // block_q4_1 { d; m; qs[16] }: d * nibble + m. Likewise
        // block_q5_0 { d; qh[4]; qs[16] } and block_q5_1 { d; m; qh[4];
        // qs[16] } with bit `j` of qh as bit 4 of value `j`: q5_0 is
        // d * (q - 16), q5_1 d * q + m.
        T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q5_1 => {
            let d = b.f16(0)?;
            let (min, at) = match ggml {
                T::Q4_0 => (offset_min(b, d, 8.0), 2),
                T::Q5_0 => (offset_min(b, d, 16.0), 6),
                T::Q4_1 => (b.f16(2)?, 4),
                _ => (b.f16(2)?, 8),
            };
            let five = matches!(ggml, T::Q5_0 | T::Q5_1);
            let mut g = Group::new(Some(d), Some(min));
            for l in 0..16 {
                let byte = b.byte(at + l)?;
                for h in 0..2 {
                    let j = 16 * h + l;
                    let mut q = b.bits(byte, 4 * h, 4);
                    if five {
                        let high = b.byte(at - 4 + j / 8)?;
                        q = b.or(q, b.place(high, j % 8, 1, 4));
                    }
                    let q = b.ufloat(q);
                    g.push(b, q, j)?;
                }
            }
            g.add_to(b, &mut total)?;
        }
        // block_q4_k { d; dmin; scales[12]; qs[128] } and block_q5_k { d;
        // dmin; scales[12]; qh[32]; qs[128] }: value 64j + 32h + l is d * sc
        // * q - dmin * m, q = nibble(qs[32j + l], 4h) (plus 16 for bit 2j + h
        // of qh[l]), (sc, m) the 6-bit pair of sub-block 2j + h
        // (get_scale_min_k4).
        T::Q4_K | T::Q5_K => {
            let (d, dmin) = (b.f16(0)?, b.f16(2)?);
            let qs_at = if ggml == T::Q4_K { 16 } else { 48 };
            for j in 0..4 {
                let mut pair = Vec::with_capacity(2);
                for sub in [2 * j, 2 * j + 1] {
                    let (sc, m) = if sub < 4 {
                        (b.field(4 + sub, 0, 6)?, b.field(8 + sub, 0, 6)?)
                    } else {
                        let (lo, d_hi, m_hi) = (b.byte(8 + sub)?, b.byte(sub)?, b.byte(4 + sub)?);
                        let sc = b.or(b.bits(lo, 0, 4), b.place(d_hi, 6, 2, 4));
                        let m = b.or(b.bits(lo, 4, 4), b.place(m_hi, 6, 2, 4));
                        (sc, m)
                    };
                    let scale = b.mul(d, b.ufloat(sc));
                    let min = b.neg(b.mul(dmin, b.ufloat(m)));
                    pair.push(Group::new(Some(scale), Some(min)));
                }
                for l in 0..32 {
                    let byte = b.byte(qs_at + 32 * j + l)?;
                    for (h, g) in pair.iter_mut().enumerate() {
                        let mut q = b.bits(byte, 4 * h, 4);
                        if ggml == T::Q5_K {
                            let high = b.byte(16 + l)?;
                            q = b.or(q, b.place(high, 2 * j + h, 1, 4));
                        }
                        let q = b.ufloat(q);
                        g.push(b, q, 64 * j + 32 * h + l)?;
                    }
                }
                for g in pair {
                    g.add_to(b, &mut total)?;
                }
            }
        }
        // block_q2_k { scales[16]; qs[64]; d; dmin }: value 128n + 32j + 16h
        // + l is d * (sc & 15) * q - dmin * (sc >> 4), q = qs[32n + 16h + l]
        // >> 2j & 3, sc = scales[8n + 2j + h].
        T::Q2_K => {
            let (d, dmin) = (b.f16(80)?, b.f16(82)?);
            for n in 0..2 {
                for h in 0..2 {
                    let mut four = Vec::with_capacity(4);
                    for j in 0..4 {
                        let sc = b.byte(8 * n + 2 * j + h)?;
                        let scale = b.mul(d, b.ufloat(b.bits(sc, 0, 4)));
                        let min = b.neg(b.mul(dmin, b.ufloat(b.bits(sc, 4, 4))));
                        four.push(Group::new(Some(scale), Some(min)));
                    }
                    for l in 0..16 {
                        let byte = b.byte(16 + 32 * n + 16 * h + l)?;
                        for (j, g) in four.iter_mut().enumerate() {
                            let q = b.ufloat(b.bits(byte, 2 * j, 2));
                            g.push(b, q, 128 * n + 32 * j + 16 * h + l)?;
                        }
                    }
                    for g in four {
                        g.add_to(b, &mut total)?;
                    }
                }
            }
        }
        // block_q3_k { hmask[32]; qs[64]; scales[12]; d }: value 128n + 32j
        // + 16h + l is d * (sc - 32) * (q - 4 * !bit), q = qs[32n + 16h + l]
        // >> 2j & 3, bit 4n + j of hmask[16h + l], sc the 6-bit scale 8n + 2j
        // + h, its low 4 bits and high 2 packed as ggml's kmask1/kmask2 do.
        // Here the integer is q + 4 * bit, 4 above the value.
        T::Q3_K => {
            let d = b.f16(108)?;
            for n in 0..2 {
                for h in 0..2 {
                    let mut four = Vec::with_capacity(4);
                    for j in 0..4 {
                        let sub = 8 * n + 2 * j + h;
                        let (quarter, i) = (sub / 4, sub % 4);
                        let low = b.field(96 + i + 4 * (quarter % 2), 4 * (quarter / 2), 4)?;
                        let high = b.byte(96 + 8 + i)?;
                        let sc = b.sub_int(b.or(low, b.place(high, 2 * quarter, 2, 4)), 32);
                        let scale = b.mul(d, b.sfloat(sc));
                        let min = offset_min(b, scale, 4.0);
                        four.push(Group::new(Some(scale), Some(min)));
                    }
                    for l in 0..16 {
                        let (qs, hm) = (b.byte(32 + 32 * n + 16 * h + l)?, b.byte(16 * h + l)?);
                        for (j, g) in four.iter_mut().enumerate() {
                            let q = b.or(b.bits(qs, 2 * j, 2), b.place(hm, 4 * n + j, 1, 2));
                            let q = b.ufloat(q);
                            g.push(b, q, 128 * n + 32 * j + 16 * h + l)?;
                        }
                    }
                    for g in four {
                        g.add_to(b, &mut total)?;
                    }
                }
            }
        }
        // block_q6_k { ql[128]; qh[64]; scales[16]; d }: value 128n + 32k +
        // 16s + l is d * sc[8n + s + 2k] * (q - 32), q's low 4 bits from
        // ql[64n + 32(k % 2) + 16s + l] at 4(k / 2), its high 2 from
        // qh[32n + 16s + l] at 2k.
        T::Q6_K => {
            let d = b.f16(208)?;
            for n in 0..2 {
                for s in 0..2 {
                    let mut four = Vec::with_capacity(4);
                    for k in 0..4 {
                        let sc = b.signed_float(192 + 8 * n + s + 2 * k)?;
                        let scale = b.mul(d, sc);
                        let min = offset_min(b, scale, 32.0);
                        four.push(Group::new(Some(scale), Some(min)));
                    }
                    for l in 0..16 {
                        let qh = b.byte(128 + 32 * n + 16 * s + l)?;
                        let ql = [b.byte(64 * n + 16 * s + l)?, b.byte(64 * n + 32 + 16 * s + l)?];
                        for (k, g) in four.iter_mut().enumerate() {
                            let low = b.bits(ql[k % 2], 4 * (k / 2), 4);
                            let q = b.ufloat(b.or(low, b.place(qh, 2 * k, 2, 4)));
                            g.push(b, q, 128 * n + 32 * k + 16 * s + l)?;
                        }
                    }
                    for g in four {
                        g.add_to(b, &mut total)?;
                    }
                }
            }
        }
        // block_iq4_nl { d; qs[16] }: d * kvalues_iq4nl[nibble], and
        // block_mxfp4 { e; qs[16] }: e8m0_half(e) * kvalues_mxfp4[nibble];
        // low nibbles first.
        T::IQ4_NL | T::MXFP4 => {
            let (table, qs_at) = match ggml {
                T::IQ4_NL => (&KVALUES_IQ4NL, 2),
                _ => (&KVALUES_MXFP4, 1),
            };
            let scale = if ggml == T::IQ4_NL { b.f16(0)? } else { b.e8m0_half(0)? };
            let mut g = Group::new(Some(scale), None);
            for l in 0..16 {
                let byte = b.byte(qs_at + l)?;
                for h in 0..2 {
                    let q = b.sfloat(b.lookup(table, b.bits(byte, 4 * h, 4)));
                    g.push(b, q, 16 * h + l)?;
                }
            }
            g.add_to(b, &mut total)?;
        }
        // block_iq4_xs { d; scales_h; scales_l[4]; qs[128] }: value 32j +
        // 16h + l is d * (ls - 32) * kvalues_iq4nl[nibble(qs[16j + l], 4h)],
        // ls the 6-bit scale of sub-block j: nibble j % 2 of scales_l[j / 2]
        // under bits 2j.. of the little-endian scales_h.
        T::IQ4_XS => {
            let mut g = Group::new(Some(b.f16(0)?), None);
            for j in 0..8 {
                let low = b.field(4 + j / 2, 4 * (j % 2), 4)?;
                let high = b.byte(2 + j / 4)?;
                let ls = b.sfloat(b.sub_int(b.or(low, b.place(high, 2 * (j % 4), 2, 4)), 32));
                for l in 0..16 {
                    let byte = b.byte(8 + 16 * j + l)?;
                    for h in 0..2 {
                        let level = b.sfloat(b.lookup(&KVALUES_IQ4NL, b.bits(byte, 4 * h, 4)));
                        let q = b.mul(ls, level);
                        g.push(b, q, 32 * j + 16 * h + l)?;
                    }
                }
            }
            g.add_to(b, &mut total)?;
        }
        other => return Err(b.operands.e.error(format!("packed_matvec: no block decoder for {other}"))),
    }
    total.into_iter().map(|t| t.ok_or_else(|| b.operands.e.error("packed_matvec: a block with no values"))).collect()
}
