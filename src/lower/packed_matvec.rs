//! `packed_matvec` as one `linalg.generic` that decodes the ggml blocks in
//! its body, with a CPU lowering config that IREE keeps.
//!
//! Why not StableHLO: IREE 3.13 vectorizes a reduction over a packed row
//! along the values of one block and sums each vector across its lanes
//! every step (a shuffle tree per 16 values), and fuses any elementwise
//! dequantization into the reduction, dropping a lowering config given to
//! it. Here the op keeps 16 lanes as a *parallel* dim: `part[n, l] =
//! Σ_b Σ_g w[n, b, g, l] · x[b, g, l]` over the blocks `b` and the block's
//! lane groups `g`, accumulated in one vector register per row, and only
//! the final `Σ_l part[n, l]` (a small `stablehlo.reduce`) crosses lanes.
//! The generic's operands are plain slices of the block bytes (each lane
//! group's 16 contiguous bytes, each scalar field's byte, each f16 field of
//! an i16 view), which IREE reads in place. The decoding is the CPU
//! dequantizer's arithmetic (each product in it is exact in f32, so every
//! K-quant weight is bit-exact with it); the 32-value types, the IQ4 types
//! and MXFP4 multiply their block's scale and min into the block's sums
//! instead ([`Decoded`]). The levels of IQ4 and MXFP4 come from a 16-entry
//! table packed in four i32 constants ([`NibbleTable`]): three selects and
//! two shifts per value, on registers. MXFP4's scale is a power of two,
//! built as f32 bits from its e8m0 byte; its subnormal scales are zeros
//! ([`Body::e8m0_half`]).
//! Several matrices of one type and shape that share `x` are one generic
//! with a lane sum per matrix, and one reduce finishes them all: streaming
//! them side by side is faster than one after the other.
//!
//! The generic carries no lowering config, only a tag naming the one
//! llvm-cpu wants (`kiln.kernel`, [`kernel_tag`]), which `iree-compile`
//! applies from kiln's host tuning spec (`iree::HOST_TUNING_SPEC`): 16 rows
//! per workgroup (64 for a vocabulary head, [`WIDE_ROWS`]), 16 lanes per
//! vector, one block per reduction step, and one or two rows per step by
//! row length ([`TWO_ROWS_MAX_BYTES`]). A config on the op would apply to
//! every target and fail the GPU ones; without it GPUs pick their own.

use super::constant::lower_constant;
use super::dequantize::ggml_callee;
use super::dialects::stablehlo;
use super::layout::lower_concatenate;
use super::reduce::lower_reduce_all;
use super::{Emitter, Function, FunctionKind, LowerError};
use crate::graph::{DType, ReduceKind, TensorType};
use crate::trace::dequant::{NibbleTable, KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::weights::ggml::GgmlType;
use melior::dialect::func;
use melior::ir::attribute::IntegerAttribute;
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::{FunctionType, IntegerType};
use melior::ir::{Attribute, Block, BlockLike, Identifier, Location, Region, RegionLike, Type, Value, ValueLike};
use melior::Context;
use std::cell::OnceCell;
use std::collections::HashMap;

/// Lanes per vector: one AVX-512 register of f32.
const LANES: usize = 16;

/// Rows with at most this many bytes are decoded two per step, longer ones
/// one per step. Measured in SmolLM2's and Gemma-3-270M's decode (one
/// thread, weights streamed from memory): two 360-440 byte rows (Q4_1,
/// Q5_0 over 576-640 values) per step take 0.75-0.8x the time of one; rows
/// of 576 bytes and more (Q8_0, K-quants, Q4_1 over 1536 values) take
/// 1.0-1.2x.
const TWO_ROWS_MAX_BYTES: usize = 512;

/// Products with at least this many rows (vocabulary heads) take 64 rows
/// per workgroup, others 16: Gemma-3-270M's 262144-row head then runs 4096
/// workgroups instead of 16384 (decode 2-4% faster), while a 1536-row
/// product split 24 ways balances worse over the threads than 96 ways.
const WIDE_ROWS: usize = 16384;

/// The `kiln.kernel` tag of a generic that wants llvm-cpu's config of
/// `workgroup_rows` rows per workgroup, `step_rows` rows of 16 lanes per
/// vector step and one block per reduction step: the host tuning spec
/// (`iree::HOST_TUNING_SPEC`) holds one entry per tag.
fn kernel_tag(workgroup_rows: usize, step_rows: usize) -> String {
    format!("\"packed_matvec_{workgroup_rows}x{step_rows}\"")
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
    let n = matrices.len();
    let op = if n == 1 { "packed_matvec".to_string() } else { format!("packed_matvec{n}") };
    let callee = ggml_callee(&op, ggml, raw_ty, &raw_ty.shape);
    let arg_types: Vec<Type> = (0..n).map(|_| e.tensor_type(raw_ty)).chain([e.tensor_type(x_ty)]).collect();
    // One `[1, rows]` result per matrix.
    let row_types = vec![e.tensor_type(&TensorType::new([1, raw_ty.shape[0]], DType::F32)); n];
    if e.scope.callees.borrow_mut().insert(callee.clone()) {
        let ctx = e.ctx();
        let loc = Location::name(ctx, &callee, Location::unknown(ctx));
        let block = Block::new(&arg_types.iter().map(|&t| (t, loc)).collect::<Vec<_>>());
        {
            let function =
                Function { dynamic_source: None, dynamic_size: OnceCell::new(), dynamic_index: OnceCell::new() };
            let inner = Emitter { block: &block, function: &function, node: &callee, ..*e };
            let arg = |i: usize| -> Value { block.argument(i).expect("one argument per operand").into() };
            let rows = emit_body(&inner, ggml, (0..n).map(arg).collect(), raw_ty, arg(n))?;
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
/// rows that streams every matrix's blocks and yields each matrix's lane
/// sums, then one reduce across the lanes; a `[1, rows]` result per matrix.
fn emit_body<'c, 'a>(
    e: &Emitter<'c, 'a>,
    ggml: GgmlType,
    matrices: Vec<Value<'c, 'a>>,
    raw_ty: &TensorType,
    x: Value<'c, 'a>,
) -> Result<Vec<Value<'c, 'a>>, LowerError> {
    let [rows, blocks, size] = raw_ty.shape[..] else {
        return Err(e.error(format!("packed_matvec: expects [rows, blocks, type_size] bytes, found {raw_ty}")));
    };
    let ctx = e.ctx();
    // arith takes signless integers: view ui8 bytes as i8.
    let bytes_ty = TensorType::new([rows, blocks, size], DType::I8);
    let matrices = matrices
        .into_iter()
        .map(|raw| match raw_ty.dtype {
            DType::I8 => Ok(raw),
            _ => e.emit(stablehlo::bitcast_convert(ctx, e.tensor_type(&bytes_ty), raw, e.loc())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let n = matrices.len();
    let bs = ggml.block_size();
    let x_ty = TensorType::new([blocks, bs], DType::F32);
    let x = e.emit(stablehlo::reshape(ctx, e.tensor_type(&x_ty), x, e.loc()))?;

    let mut operands = Operands {
        e,
        halves: (0..n).map(|_| OnceCell::new()).collect(),
        matrices,
        x,
        blocks,
        rows,
        size,
        values: Vec::new(),
        maps: Vec::new(),
        args: HashMap::new(),
    };
    let body = Block::new(&[]);
    {
        let mut b = Body { ctx, block: &body, operands: &mut operands, matrix: 0 };
        let mut sums = Vec::with_capacity(n);
        // Σ x over the block's lane groups, shared by every matrix.
        let mut x_sum = None;
        for m in 0..n {
            b.matrix = m;
            let Decoded { terms, scale, min } = decode(&mut b, ggml)?;
            let mut sum = None;
            for (w, group) in &terms {
                let xg = b.x_group(*group)?;
                let p = b.mul(*w, xg);
                sum = Some(sum.map_or(p, |s| b.add(s, p)));
            }
            let sum = sum.ok_or_else(|| e.error("packed_matvec: a block with no values"))?;
            let sum = scale.map_or(sum, |d| b.mul(d, sum));
            let sum = match min {
                Some(m) => {
                    if x_sum.is_none() {
                        let mut xs = None;
                        for (_, group) in &terms {
                            let xg = b.x_group(*group)?;
                            xs = Some(xs.map_or(xg, |s| b.add(s, xg)));
                        }
                        x_sum = xs;
                    }
                    b.add(sum, b.mul(m, x_sum.expect("set above")))
                }
                None => sum,
            };
            sums.push(sum);
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

    let part_ty = TensorType::new([rows, LANES], DType::F32);
    let init = lower_constant(e, 0.0, &part_ty)?;
    maps.extend(std::iter::repeat_n("affine_map<(n, l, b) -> (n, l)>", n));
    let maps = format!("[{}]", maps.join(", "));
    let parallel = "#linalg.iterator_type<parallel>";
    let iterators = format!("[{parallel}, {parallel}, #linalg.iterator_type<reduction>]");
    let segments = format!("array<i32: {}, {n}>", values.len());
    let region = Region::new();
    region.append_block(body);
    let attr = |name: &str, text: &str| -> Result<_, LowerError> {
        Ok((Identifier::new(ctx, name), e.parse_attribute(text)?))
    };
    let generic = OperationBuilder::new("linalg.generic", e.loc())
        .add_operands(&values)
        .add_operands(&vec![init; n])
        .add_results(&vec![e.tensor_type(&part_ty); n])
        .add_attributes(&[
            attr("indexing_maps", &maps)?,
            attr("iterator_types", &iterators)?,
            attr("operandSegmentSizes", &segments)?,
            attr(
                "kiln.kernel",
                &kernel_tag(
                    if rows >= WIDE_ROWS { 64 } else { 16 },
                    if blocks * size <= TWO_ROWS_MAX_BYTES { 2 } else { 1 },
                ),
            )?,
        ])
        .add_regions([region])
        .build()
        .map_err(|err| e.error(format!("linalg.generic: {err}")))?;
    let generic = e.block.append_operation(generic);
    let parts: Vec<Value> = (0..n).map(|i| generic.result(i).expect("one result per matrix").into()).collect();
    let sums = lower_reduce_all(e, ReduceKind::Sum, &parts, &[1], &TensorType::new([rows], DType::F32))?;
    let row_ty = TensorType::new([1, rows], DType::F32);
    sums.into_iter().map(|y| e.emit(stablehlo::reshape(ctx, e.tensor_type(&row_ty), y, e.loc()))).collect()
}

/// The generic's inputs, each added once at its first use: a slice of the
/// block bytes or of `x`, its indexing map, and its body argument.
struct Operands<'e, 'c, 'a> {
    e: &'e Emitter<'c, 'a>,
    /// Each matrix's blocks as i8 `[rows, blocks, type_size]`.
    matrices: Vec<Value<'c, 'a>>,
    /// Each matrix viewed as i16 `[rows, blocks, type_size / 2]`, made at
    /// first use (blocks of an even size only).
    halves: Vec<OnceCell<Value<'c, 'a>>>,
    x: Value<'c, 'a>,
    blocks: usize,
    rows: usize,
    /// Bytes per block.
    size: usize,
    values: Vec<Value<'c, 'a>>,
    maps: Vec<&'static str>,
    args: HashMap<Input, usize>,
}

/// What a body argument reads; the first field of the block inputs is the
/// matrix.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
enum Input {
    /// `LANES` bytes at this offset in each block: `[rows, blocks, LANES]`.
    Lanes(usize, usize),
    /// The byte at this offset in each block: `[rows, blocks]`.
    Byte(usize, usize),
    /// The 16-bit word at this (even) byte offset in each block: `[rows,
    /// blocks]` i16, read from [`Operands::halves`].
    Half(usize, usize),
    /// `x`'s values `LANES * g ..` of each block: `[blocks, LANES]`.
    X(usize),
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

    /// `raw` as i16 words: `flow.tensor.bitcast` is a view, so an f16 field
    /// is one load (two bytes and a shift and an or, vectorized across rows,
    /// are several times that).
    fn halves(&self, matrix: usize) -> Result<Value<'c, 'a>, LowerError> {
        if let Some(&v) = self.halves[matrix].get() {
            return Ok(v);
        }
        let e = self.e;
        if !self.size.is_multiple_of(2) {
            return Err(e.error(format!("packed_matvec: {}-byte blocks have no i16 view", self.size)));
        }
        let ty = TensorType::new([self.rows, self.blocks, self.size / 2], DType::I16);
        let op = OperationBuilder::new("flow.tensor.bitcast", e.loc())
            .add_operands(&[self.matrices[matrix]])
            .add_attributes(&[(
                Identifier::new(e.ctx(), "operandSegmentSizes"),
                e.parse_attribute("array<i32: 1, 0, 0>")?,
            )])
            .add_results(&[e.tensor_type(&ty)])
            .build()
            .map_err(|err| e.error(format!("flow.tensor.bitcast: {err}")))?;
        let v = e.emit(op)?;
        Ok(*self.halves[matrix].get_or_init(|| v))
    }

    /// The operand for `input`, sliced and recorded at its first use.
    fn value(&mut self, input: Input) -> Result<(Value<'c, 'a>, &'static str), LowerError> {
        let (rows, blocks) = (self.rows, self.blocks);
        Ok(match input {
            Input::Lanes(m, off) => (
                self.slice(
                    self.matrices[m],
                    &[0, 0, off],
                    &[rows, blocks, off + LANES],
                    &TensorType::new([rows, blocks, LANES], DType::I8),
                )?,
                "affine_map<(n, l, b) -> (n, b, l)>",
            ),
            Input::Byte(m, off) => (
                self.slice(
                    self.matrices[m],
                    &[0, 0, off],
                    &[rows, blocks, off + 1],
                    &TensorType::new([rows, blocks], DType::I8),
                )?,
                "affine_map<(n, l, b) -> (n, b)>",
            ),
            Input::Half(m, off) => {
                let halves = self.halves(m)?;
                (
                    self.slice(
                        halves,
                        &[0, 0, off / 2],
                        &[rows, blocks, off / 2 + 1],
                        &TensorType::new([rows, blocks], DType::I16),
                    )?,
                    "affine_map<(n, l, b) -> (n, b)>",
                )
            }
            Input::X(g) => (
                self.slice(
                    self.x,
                    &[0, g * LANES],
                    &[blocks, (g + 1) * LANES],
                    &TensorType::new([blocks, LANES], DType::F32),
                )?,
                "affine_map<(n, l, b) -> (b, l)>",
            ),
        })
    }
}

/// Builds the generic's body: scalar arith on one lane of one block.
struct Body<'b, 'e, 'c, 'a> {
    ctx: &'c Context,
    block: &'b Block<'c>,
    operands: &'b mut Operands<'e, 'c, 'a>,
    /// The matrix whose blocks [`Body::lanes`], [`Body::byte`] and
    /// [`Body::f16`] read.
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
            Input::X(_) => self.f32(),
            Input::Half(..) => self.int(16),
            Input::Lanes(..) | Input::Byte(..) => self.int(8),
        };
        let i = self.operands.values.len();
        self.operands.values.push(value);
        self.operands.maps.push(map);
        self.operands.args.insert(input, i);
        Ok(self.block.add_argument(elem, self.operands.e.loc()))
    }

    fn lanes(&mut self, offset: usize) -> Result<Value<'c, 'b>, LowerError> {
        self.arg(Input::Lanes(self.matrix, offset))
    }

    fn byte(&mut self, offset: usize) -> Result<Value<'c, 'b>, LowerError> {
        self.arg(Input::Byte(self.matrix, offset))
    }

    fn x_group(&mut self, group: usize) -> Result<Value<'c, 'b>, LowerError> {
        self.arg(Input::X(group))
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

    fn shr(&self, v: Value<'c, 'b>, bits: i64) -> Value<'c, 'b> {
        if bits == 0 {
            return v;
        }
        let c = self.int_const(v, bits);
        self.binary("arith.shrui", v, c)
    }

    fn shl(&self, v: Value<'c, 'b>, bits: i64) -> Value<'c, 'b> {
        let c = self.int_const(v, bits);
        self.binary("arith.shli", v, c)
    }

    fn sub_int(&self, v: Value<'c, 'b>, value: i64) -> Value<'c, 'b> {
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

    /// The little-endian f16 at `offset` (even in every ggml block), as f32.
    fn f16(&mut self, offset: usize) -> Result<Value<'c, 'b>, LowerError> {
        let bits = self.arg(Input::Half(self.matrix, offset))?;
        let half = self.cast("arith.bitcast", bits, Type::float16(self.ctx));
        Ok(self.cast("arith.extf", half, self.f32()))
    }

    /// The e8m0 byte at `offset` as ggml's `ggml_e8m0_to_fp32_half` reads
    /// it, `2^(e - 128)` from its bits `(e - 1) << 23`, except that the
    /// subnormal scales (`e < 2`) are zeros: `(max(e, 1) - 1) << 23`. IREE's
    /// runtime reads a subnormal operand as zero anyway (`trace::dequant`'s
    /// module doc). Two normal factors, as `dequantize` builds, would keep
    /// those blocks' values (all below `12 * 2^-127`) but made a 2048 x 2048
    /// product about 12% slower (1.20-1.28 ms against 1.06-1.13, one
    /// thread): a second multiply per block and lane.
    fn e8m0_half(&mut self, offset: usize) -> Result<Value<'c, 'b>, LowerError> {
        let byte = self.byte(offset)?;
        let e = self.zext(byte, 32);
        let exponent = self.sub_int(self.binary("arith.maxui", e, self.int_const(e, 1)), 1);
        Ok(self.cast("arith.bitcast", self.shl(exponent, 23), self.f32()))
    }

    /// The little-endian u32 at `offset`.
    fn u32(&mut self, offset: usize) -> Result<Value<'c, 'b>, LowerError> {
        let mut word = None;
        for i in 0..4 {
            let byte = self.byte(offset + i)?;
            let part = self.zext(byte, 32);
            let part = if i == 0 { part } else { self.shl(part, 8 * i as i64) };
            word = Some(match word {
                None => part,
                Some(w) => self.binary("arith.ori", w, part),
            });
        }
        Ok(word.expect("four bytes"))
    }

    /// This lane's index in its group of `LANES`, as i32.
    fn lane(&self) -> Value<'c, 'b> {
        let dim = IntegerAttribute::new(self.int(64), 1).into();
        let i = self.op_with("linalg.index", &[], Some(("dim", dim)), Type::index(self.ctx));
        self.cast("arith.index_cast", i, self.int(32))
    }

    /// The 4-bit value of `byte` at `shift` (0 or 4). The 32-value types
    /// widen their quant bytes to i32 first: LLVM then loads and widens 16
    /// of them in one instruction and splits the nibbles in i32 lanes (two
    /// instructions fewer per block than on bytes).
    fn nibble(&self, byte: Value<'c, 'b>, shift: i64) -> Value<'c, 'b> {
        if shift == 0 {
            self.and(byte, 15)
        } else {
            self.shr(byte, shift)
        }
    }

    /// `table`'s level at `code` (an i32 in `0..16`), sign-extended to
    /// i32: the word that bits 3 and 2 of `code` select, shifted left by `8
    /// * (code & 3)` and arithmetically right by 24 ([`NibbleTable`]).
    fn lookup(&self, table: &NibbleTable, code: Value<'c, 'b>) -> Value<'c, 'b> {
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

    fn sub(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Value<'c, 'b> {
        self.binary("arith.subf", a, b)
    }
}

/// One lane of one block: `(value, x group)` pairs, the value at `LANES *
/// group + lane` of the block decoded as ggml's CPU dequantizer does
/// (`weights::quant`), and the block's scale and min where one pair covers
/// all of its values (the 32-value types, MXFP4, and IQ4_XS's `d`, its
/// sub-block scales being integers multiplied into the levels exactly).
/// Then the values are integers `q` and the block adds `scale · Σ q·x + min
/// · Σ x`, as ggml's dot kernels factor it: the same sum as the dequantized
/// weights' `Σ (scale · q + min) · x` (for IQ4_XS, `scale · q` is the CPU's
/// `(d · (ls - 32)) · level`, both products exact), with one multiply per
/// block instead of one per value, rounded differently. MXFP4's scale is a
/// power of two, which commutes with rounding: `scale · Σ q·x` has the bits
/// of `Σ (scale · q)·x` summed in the same order, unless the product
/// overflows or is subnormal (IREE's runtime writes a subnormal as zero;
/// the subnormal scales themselves are zeros here, [`Body::e8m0_half`]).
struct Decoded<'c, 'b> {
    terms: Vec<(Value<'c, 'b>, usize)>,
    scale: Option<Value<'c, 'b>>,
    min: Option<Value<'c, 'b>>,
}

fn decode<'b, 'c>(b: &mut Body<'b, '_, 'c, '_>, ggml: GgmlType) -> Result<Decoded<'c, 'b>, LowerError> {
    use GgmlType as T;
    let mut terms = Vec::new();
    let (mut scale, mut min) = (None, None);
    match ggml {
        // block_q8_0 { d; qs[32] }: d * qs.
        T::Q8_0 => {
            scale = Some(b.f16(0)?);
            for g in 0..2 {
                let q = b.lanes(2 + LANES * g)?;
                terms.push((b.sfloat(q), g));
            }
        }
        // block_q4_0 { d; qs[16] }: d * (nibble - 8), low nibbles first.
        T::Q4_0 => {
            scale = Some(b.f16(0)?);
            let qs = b.lanes(2)?;
            let qs = b.zext(qs, 32);
            for g in 0..2 {
                terms.push((b.sfloat(b.sub_int(b.nibble(qs, 4 * g as i64), 8)), g));
            }
        }
        // block_q4_1 { d; m; qs[16] }: d * nibble + m.
        T::Q4_1 => {
            (scale, min) = (Some(b.f16(0)?), Some(b.f16(2)?));
            let qs = b.lanes(4)?;
            let qs = b.zext(qs, 32);
            for g in 0..2 {
                terms.push((b.ufloat(b.nibble(qs, 4 * g as i64)), g));
            }
        }
        // block_q5_0 { d; qh[4]; qs[16] } and block_q5_1 { d; m; qh[4];
        // qs[16] }: bit `j` of qh is bit 4 of value `j`; q5_0 is
        // d * (q - 16), q5_1 d * q + m.
        T::Q5_0 | T::Q5_1 => {
            let legacy = ggml == T::Q5_0;
            scale = Some(b.f16(0)?);
            min = if legacy { None } else { Some(b.f16(2)?) };
            let at = if legacy { 2 } else { 4 };
            let qh = b.u32(at)?;
            let qs = b.lanes(at + 4)?;
            let qs = b.zext(qs, 32);
            let lane = b.lane();
            for g in 0..2 {
                let low = b.nibble(qs, 4 * g as i64);
                let bit_at = if g == 0 { lane } else { b.binary("arith.addi", lane, b.int_const(lane, 16)) };
                let high = b.and(b.binary("arith.shrui", qh, bit_at), 1);
                let q = b.binary("arith.ori", low, b.shl(high, 4));
                terms.push((if legacy { b.sfloat(b.sub_int(q, 16)) } else { b.ufloat(q) }, g));
            }
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
                for h in 0..2 {
                    let sub = 2 * j + h;
                    let (sc, m) = if sub < 4 {
                        let (sc, m) = (b.byte(4 + sub)?, b.byte(8 + sub)?);
                        (b.and(sc, 63), b.and(m, 63))
                    } else {
                        let (lo, d_hi, m_hi) = (b.byte(8 + sub)?, b.byte(sub)?, b.byte(4 + sub)?);
                        let sc = b.binary("arith.ori", b.and(lo, 15), b.shl(b.shr(d_hi, 6), 4));
                        let m = b.binary("arith.ori", b.shr(lo, 4), b.shl(b.shr(m_hi, 6), 4));
                        (sc, m)
                    };
                    let d1 = b.mul(d, b.ufloat(sc));
                    let m1 = b.mul(dmin, b.ufloat(m));
                    for s in 0..2 {
                        let qs = b.lanes(qs_at + 32 * j + LANES * s)?;
                        let mut q = b.nibble(qs, 4 * h as i64);
                        if ggml == T::Q5_K {
                            let qh = b.lanes(16 + LANES * s)?;
                            let high = b.and(b.shr(qh, sub as i64), 1);
                            q = b.binary("arith.ori", q, b.shl(high, 4));
                        }
                        terms.push((b.sub(b.mul(d1, b.ufloat(q)), m1), 4 * j + 2 * h + s));
                    }
                }
            }
        }
        // block_q2_k { scales[16]; qs[64]; d; dmin }: value 128n + 32j + 16h
        // + l is d * (sc & 15) * q - dmin * (sc >> 4), q = qs[32n + 16h + l]
        // >> 2j & 3, sc = scales[8n + 2j + h].
        T::Q2_K => {
            let (d, dmin) = (b.f16(80)?, b.f16(82)?);
            for n in 0..2 {
                for j in 0..4 {
                    for h in 0..2 {
                        let sc = b.byte(8 * n + 2 * j + h)?;
                        let dl = b.mul(d, b.ufloat(b.and(sc, 15)));
                        let ml = b.mul(dmin, b.ufloat(b.shr(sc, 4)));
                        let qs = b.lanes(16 + 32 * n + LANES * h)?;
                        let q = b.ufloat(b.and(b.shr(qs, 2 * j as i64), 3));
                        terms.push((b.sub(b.mul(dl, q), ml), 8 * n + 2 * j + h));
                    }
                }
            }
        }
        // block_q3_k { hmask[32]; qs[64]; scales[12]; d }: value 128n + 32j
        // + 16h + l is d * (sc - 32) * (q - 4 * !bit), q = qs[32n + 16h + l]
        // >> 2j & 3, bit 4n + j of hmask[16h + l], sc the 6-bit scale 8n + 2j
        // + h, its low 4 bits and high 2 packed as ggml's kmask1/kmask2 do.
        T::Q3_K => {
            let d = b.f16(108)?;
            for n in 0..2 {
                for j in 0..4 {
                    for h in 0..2 {
                        let sub = 8 * n + 2 * j + h;
                        let (quarter, i) = (sub / 4, sub % 4);
                        let low = b.byte(96 + i + 4 * (quarter % 2))?;
                        let low = if quarter < 2 { b.and(low, 15) } else { b.shr(low, 4) };
                        let high = b.byte(96 + 8 + i)?;
                        let high = b.and(b.shr(high, 2 * quarter as i64), 3);
                        let sc = b.sub_int(b.binary("arith.ori", low, b.shl(high, 4)), 32);
                        let dl = b.mul(d, b.sfloat(sc));
                        let qs = b.lanes(32 + 32 * n + LANES * h)?;
                        let hm = b.lanes(LANES * h)?;
                        let q = b.and(b.shr(qs, 2 * j as i64), 3);
                        // 4 where the mask bit is clear: (bit ^ 1) << 2.
                        let bit = b.and(b.shr(hm, (4 * n + j) as i64), 1);
                        let minus = b.shl(b.binary("arith.xori", bit, b.int_const(bit, 1)), 2);
                        let q = b.sfloat(b.binary("arith.subi", q, minus));
                        terms.push((b.mul(dl, q), 8 * n + 2 * j + h));
                    }
                }
            }
        }
        // block_q6_k { ql[128]; qh[64]; scales[16]; d }: value 128n + 32k +
        // l is d * sc[8n + l/16 + 2k] * (q - 32), q's low 4 bits from
        // ql[64n + 32(k % 2) + l] at 4(k / 2), its high 2 from qh[32n + l]
        // at 2k.
        T::Q6_K => {
            let d = b.f16(208)?;
            for n in 0..2 {
                for k in 0..4 {
                    for s in 0..2 {
                        let ql = b.lanes(64 * n + 32 * (k % 2) + LANES * s)?;
                        let qh = b.lanes(128 + 32 * n + LANES * s)?;
                        let low = b.nibble(ql, 4 * (k / 2) as i64);
                        let high = b.and(b.shr(qh, 2 * k as i64), 3);
                        let q = b.sub_int(b.binary("arith.ori", low, b.shl(high, 4)), 32);
                        let sc = b.byte(192 + 8 * n + s + 2 * k)?;
                        let sc = b.sfloat(sc);
                        terms.push((b.mul(b.mul(d, sc), b.sfloat(q)), 8 * n + 2 * k + s));
                    }
                }
            }
        }
        // block_iq4_nl { d; qs[16] }: d * kvalues_iq4nl[nibble], and
        // block_mxfp4 { e; qs[16] }: e8m0_half(e) * kvalues_mxfp4[nibble];
        // low nibbles first. MXFP4's block is 17 bytes, so its qs sit at odd
        // offsets (1 + 17b), which the lane slice reads where they are.
        T::IQ4_NL | T::MXFP4 => {
            let (table, qs_at) = match ggml {
                T::IQ4_NL => (&KVALUES_IQ4NL, 2),
                _ => (&KVALUES_MXFP4, 1),
            };
            scale = Some(if ggml == T::IQ4_NL { b.f16(0)? } else { b.e8m0_half(0)? });
            let qs = b.lanes(qs_at)?;
            let qs = b.zext(qs, 32);
            for g in 0..2 {
                terms.push((b.sfloat(b.lookup(table, b.nibble(qs, 4 * g as i64))), g));
            }
        }
        // block_iq4_xs { d; scales_h; scales_l[4]; qs[128] }: value 32j +
        // 16h + l is d * (ls - 32) * kvalues_iq4nl[nibble(qs[16j + l], 4h)],
        // ls the 6-bit scale of sub-block j: nibble j % 2 of scales_l[j / 2]
        // under bits 2j.. of the little-endian scales_h. The block's sum is
        // of the exact integers (ls - 32) * level, times d.
        T::IQ4_XS => {
            scale = Some(b.f16(0)?);
            for j in 0..8 {
                let low = b.byte(4 + j / 2)?;
                let low = b.nibble(low, 4 * (j % 2) as i64);
                let high = b.byte(2 + j / 4)?;
                let high = b.and(b.shr(high, 2 * (j % 4) as i64), 3);
                let ls = b.sfloat(b.sub_int(b.binary("arith.ori", low, b.shl(high, 4)), 32));
                let qs = b.lanes(8 + 16 * j)?;
                let qs = b.zext(qs, 32);
                for h in 0..2 {
                    let level = b.sfloat(b.lookup(&KVALUES_IQ4NL, b.nibble(qs, 4 * h as i64)));
                    terms.push((b.mul(ls, level), 2 * j + h));
                }
            }
        }
        other => return Err(b.operands.e.error(format!("packed_matvec: no block decoder for {other}"))),
    }
    Ok(Decoded { terms, scale, min })
}
