//! ggml block dequantization, for the **Keep** packed-weight policy: a
//! param stays the checkpoint's raw block bytes (a `tensor<NBYTESxi8>`
//! global that can point straight into the GGUF file) and the graph turns
//! it into f32.
//!
//! [`dequantize`] traces one composite `dequantize` node
//! ([`crate::graph::ops::dequantize`]); [`decompose`] is what it means in
//! StableHLO ops, the body of the private function the lowering calls.
//!
//! Each type mirrors its CPU dequantizer in [`crate::weights::quant`]
//! (which is bit-exact with gguf-py) operation by operation: the bytes are
//! reshaped to `[n_blocks, type_size]`, the fields are sliced off in struct
//! order under ggml's names (`d`, `dmin`, `scales`, `qs`, `qh`), f16 fields
//! are bitcast from `[n, 2]` bytes and converted to f32 (exact), and the
//! quants are unpacked with `and`/shifts on `ui8`.
//!
//! IQ4_NL, IQ4_XS and MXFP4 index a 16-entry table of int8 levels with
//! each nibble ([`NibbleTable`], looked up with selects and shifts, no
//! memory). MXFP4's e8m0 scale is built as f32 bits with integer ops and
//! bitcast, as the CPU's `e8m0_to_f32_half` does, but never subnormal
//! (`Blocks::e8m0_half`).
//!
//! Rounding: every product here is exact in f32 (an f16 has 11 significant
//! bits; times a scale of at most 7 bits and a quant of at most 6, or an
//! IQ4 scale of at most 6 bits and a level of at most 7, never more than
//! 24; MXFP4's factors are powers of two and its levels have at most two
//! significant bits, so even its smallest products, down to `2^-128`, are
//! subnormals that f32 holds exactly, and `e <= 252` keeps them finite), so
//! the only rounding step is the final `+ m` / `- ml` of Q4_1, Q5_1, Q2_K,
//! Q4_K and Q5_K. A compiler that contracts `a * b - c` into an FMA or
//! reassociates the products therefore gets the same bits.
//!
//! Subnormals: IREE's CPU runtime flushes them (its task workers set FTZ and
//! DAZ, `iree/task/worker.c`): an f32 op reads a subnormal operand as zero
//! and writes a subnormal result as zero of its sign. No operand here is
//! subnormal, so in IREE every value that is a normal f32 keeps the CPU's
//! bits and only MXFP4's values below `2^-126` (in blocks with `e < 2`)
//! become zeros.

use super::{Tensor, TraceError};
use crate::graph::{DType, Op, TensorType};
use crate::weights::ggml::{GgmlType, QK_K};

pub use crate::graph::ops::dequantize::{packed_byte_order, packed_byte_positions, supported};

type Result<T> = std::result::Result<T, TraceError>;

/// The f32 values of `raw`, the ggml `ty` blocks of a tensor of `shape`
/// (row-major, as [`crate::weights::gguf::GgufTensor::shape`] gives it).
/// `raw` is 1-D `i8` or `ui8` holding exactly `ty.byte_len(prod(shape))`
/// bytes. Bit-exact with [`crate::weights::quant::dequantize`].
pub fn dequantize<'t>(raw: &Tensor<'t>, ty: GgmlType, shape: &[usize]) -> Result<Tensor<'t>> {
    raw.tracer.push("", Op::Dequantize { ggml: ty }, &[raw], Some(TensorType::new(shape.to_vec(), DType::F32)))
}

/// Rows per tile of the packed matrices [`packed_matvec`] reads: one AVX-512
/// register of f32 holds one value of each.
pub const PACKED_LANES: usize = 16;

/// `x [1, k]` times the transpose of each packed matrix of `matrices`, whose
/// blocks are tiled by rows, `[tiles, blocks, type_size, PACKED_LANES]` (one
/// type and shape; [`crate::trace::Tensor::tile_rows`] of `[rows, blocks,
/// type_size]`): `[n, tiles · PACKED_LANES]`, row `i` from `matrices[i]`
/// (see `Op::PackedMatvec`).
pub fn packed_matvec<'t>(matrices: &[&Tensor<'t>], ty: GgmlType, x: &Tensor<'t>) -> Result<Tensor<'t>> {
    let Some(first) = matrices.first() else {
        return Err(TraceError::Op { op: "packed_matvec", message: "needs at least one matrix".into() });
    };
    let operands: Vec<&Tensor<'t>> = matrices.iter().copied().chain([x]).collect();
    first.tracer.push("", Op::PackedMatvec { ggml: ty }, &operands, None)
}

/// How [`decompose`] shapes one block's values before its final reshape:
/// dims whose row-major order is ggml's value order, split (never merged)
/// along the way the bits are unpacked. `dequantize` to `[rows, blocks,
/// block_dims...]` therefore ends in a reshape that only splits the
/// leading dim, and IREE fuses the whole dequantization into a consumer
/// that reads that shape (a collapse after the unpacking would make it
/// write the unpacked values out first, IREE #8637).
pub fn block_dims(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q8_0 => &[32],
        T::Q4_0 | T::Q4_1 => &[2, 16],
        T::Q5_0 | T::Q5_1 => &[2, 2, 8],
        T::Q2_K | T::Q3_K => &[2, 4, 2, 16],
        T::Q4_K | T::Q5_K => &[4, 2, 32],
        T::Q6_K => &[2, 2, 2, 2, 16],
        T::IQ4_NL => &[2, 16],
        T::IQ4_XS => &[8, 2, 16],
        T::MXFP4 => &[2, 16],
        _ => &[],
    }
}

/// [`dequantize`] in StableHLO ops, for `raw` and `shape` that its shape
/// rule admits.
pub fn decompose<'t>(raw: &Tensor<'t>, ty: GgmlType, shape: &[usize]) -> Result<Tensor<'t>> {
    block_values(raw, ty)?.reshape(shape)
}

/// [`decompose`] plus `after`, a `tensor<f32>` zero computed from another
/// value, added to every value where the blocks' values are made: one
/// elementwise computation that cannot start before `after`'s. (Added after
/// the final reshape, it is a dispatch of its own, and the decoding can
/// still run first.)
pub fn decompose_after<'t>(raw: &Tensor<'t>, ty: GgmlType, shape: &[usize], after: &Tensor<'t>) -> Result<Tensor<'t>> {
    let values = block_values(raw, ty)?;
    values.add(&after.broadcast_in_dim(&values.ty.shape, &[])?)?.reshape(shape)
}

/// The blocks' values, `[blocks, block_dims(ty)...]`.
fn block_values<'t>(raw: &Tensor<'t>, ty: GgmlType) -> Result<Tensor<'t>> {
    let blocks = Blocks::new(raw, ty)?;
    use GgmlType as T;
    let y = match ty {
        T::Q8_0 => q8_0(&blocks)?,
        T::Q4_0 => q4_0(&blocks)?,
        T::Q4_1 => q4_1(&blocks)?,
        T::Q5_0 => q5_0(&blocks)?,
        T::Q5_1 => q5_1(&blocks)?,
        T::Q2_K => q2_k(&blocks)?,
        T::Q3_K => q3_k(&blocks)?,
        T::Q4_K => q4_k(&blocks)?,
        T::Q5_K => q5_k(&blocks)?,
        T::Q6_K => q6_k(&blocks)?,
        T::IQ4_NL => iq4_nl(&blocks)?,
        T::IQ4_XS => iq4_xs(&blocks)?,
        T::MXFP4 => mxfp4(&blocks)?,
        _ => return Err(TraceError::Op { op: "dequantize", message: format!("ggml type {ty} has no decomposition") }),
    };
    Ok(y)
}

/// A tensor's blocks as `[lead..., type_size]` bytes (`i8` and `ui8`
/// views), with a cursor that slices fields off in struct order like the
/// CPU's `Fields`. `lead` is `[n_blocks]` for 1-D raw bytes, and the raw
/// rows' leading dims (one may be `?`) plus the blocks per row otherwise.
/// The helpers below write shapes and dims as if `lead` were one dim `n`
/// ([`Blocks::sh`], [`Blocks::d`]).
struct Blocks<'t> {
    signed: Tensor<'t>,
    unsigned: Tensor<'t>,
    lead: Vec<usize>,
    offset: std::cell::Cell<usize>,
}

impl<'t> Blocks<'t> {
    fn new(raw: &Tensor<'t>, ty: GgmlType) -> Result<Self> {
        let rank = raw.ty.rank();
        let mut lead = raw.ty.shape[..rank - 1].to_vec();
        // Rows of one block each (`[..., type_size]`) are already blocks.
        let rows = match (rank, raw.ty.shape[rank - 1] == ty.type_size()) {
            (2.., true) => raw.clone(),
            _ => {
                lead.push(raw.ty.shape[rank - 1] / ty.type_size());
                raw.reshape(&[&lead[..], &[ty.type_size()]].concat())?
            }
        };
        let (signed, unsigned) = match rows.ty.dtype {
            DType::I8 => (rows.clone(), rows.bitcast_convert(DType::UI8)?),
            _ => (rows.bitcast_convert(DType::I8)?, rows),
        };
        Ok(Blocks { signed, unsigned, lead, offset: 0.into() })
    }

    /// `[n, rest...]`: the leading dims, then `rest`.
    fn sh(&self, rest: &[usize]) -> Vec<usize> {
        [&self.lead[..], rest].concat()
    }

    /// Dim `i` of a `[n, ...]` shape (`i >= 1`) in the real shape.
    fn d(&self, i: usize) -> usize {
        i + self.lead.len() - 1
    }

    /// `x [n, L]` sliced to `[n, start..end]` along its last dim.
    fn cols(&self, x: &Tensor<'t>, start: usize, end: usize) -> Result<Tensor<'t>> {
        let zeros = vec![0; self.lead.len()];
        x.slice(&[&zeros[..], &[start]].concat(), &self.sh(&[end]), &vec![1; self.lead.len() + 1])
    }

    /// The next `len` bytes of every block, `[n, len]`, from `view`.
    fn take_from(&self, view: &Tensor<'t>, len: usize) -> Result<Tensor<'t>> {
        let start = self.offset.get();
        self.offset.set(start + len);
        self.cols(view, start, start + len)
    }

    /// The next `len` bytes as `ui8`, `[n, len]`.
    fn take(&self, len: usize) -> Result<Tensor<'t>> {
        self.take_from(&self.unsigned, len)
    }

    /// The next `len` bytes as `i8` (ggml's `int8_t` fields), `[n, len]`.
    fn take_i8(&self, len: usize) -> Result<Tensor<'t>> {
        self.take_from(&self.signed, len)
    }

    /// A `ggml_half` field as f32, `[n]`; exact. The two bytes are joined
    /// into a `ui16` with element-wise ops and bitcast at the same width:
    /// IREE makes a `[n, 2] i8 -> [n] f16` bitcast a dispatch of its own,
    /// while this fuses into the consumer.
    fn f16(&self) -> Result<Tensor<'t>> {
        let bytes = self.take(2)?;
        let byte = |k: usize| self.cols(&bytes, k, k + 1)?.reshape(&self.lead)?.convert(DType::UI16);
        let bits = byte(0)?.or(&shl(&byte(1)?, 8)?)?;
        bits.bitcast_convert(DType::F16)?.convert(DType::F32)
    }

    /// An e8m0 byte as ggml's `ggml_e8m0_to_fp32_half` reads it, `2^(e -
    /// 128)`, as two f32 factors `[n]`, `(scale, first)`, neither subnormal
    /// (IREE reads a subnormal as zero). `scale` is built from its bits as
    /// the CPU builds it, `(e - 1) << 23`, but from `max(e, 2)`; `first` is
    /// `2^(min(e, 2) - 2)` (1/4 and 1/2 for the subnormal scales `e < 2`,
    /// else 1), to multiply the levels by first. Each product of a power of
    /// two and a level is exact, so `scale * (first * level)` has the bits
    /// of the CPU's `2^(e - 128) * level`.
    fn e8m0_half(&self) -> Result<(Tensor<'t>, Tensor<'t>)> {
        let e = self.take(1)?.reshape(&self.lead)?.convert(DType::I32)?;
        let two = splat(&e, 2.0)?;
        let from_bits = |exponent: Tensor<'t>| shl(&exponent, 23)?.bitcast_convert(DType::F32);
        let scale = from_bits(e.maximum(&two)?.subtract(&splat(&e, 1.0)?)?)?;
        let first = from_bits(e.minimum(&two)?.add(&splat(&e, 125.0)?)?)?;
        Ok((scale, first))
    }
}

/// A splat of `like`'s type.
fn splat<'t>(like: &Tensor<'t>, value: f64) -> Result<Tensor<'t>> {
    like.tracer.constant(value, like.ty.clone())
}

fn and<'t>(x: &Tensor<'t>, mask: u8) -> Result<Tensor<'t>> {
    x.and(&splat(x, mask.into())?)
}

fn shr<'t>(x: &Tensor<'t>, bits: u8) -> Result<Tensor<'t>> {
    if bits == 0 {
        return Ok(x.clone());
    }
    x.shift_right_logical(&splat(x, bits.into())?)
}

fn shl<'t>(x: &Tensor<'t>, bits: u8) -> Result<Tensor<'t>> {
    x.shift_left(&splat(x, bits.into())?)
}

fn f32<'t>(x: &Tensor<'t>) -> Result<Tensor<'t>> {
    x.convert(DType::F32)
}

/// `x - c` for an f32 `x`; exact for the small integers it is used on.
fn minus<'t>(x: &Tensor<'t>, c: f64) -> Result<Tensor<'t>> {
    x.subtract(&splat(x, c)?)
}

/// Broadcasts `[n, ...]` (a per-block or per-sub-block scale) to `like`'s
/// shape over its leading dims.
fn per<'t>(scale: &Tensor<'t>, like: &Tensor<'t>) -> Result<Tensor<'t>> {
    let dims: Vec<usize> = (0..scale.ty.rank()).collect();
    scale.broadcast_in_dim(&like.ty.shape, &dims)
}

/// Unpacks `count` bit fields per element: `x` `[..., L]` gains a dim of
/// `count` at `dim` (before the dims from `dim` on), whose index `k` holds
/// `(x >> step * k) & mask`. Broadcast, iota and element-wise ops only, so
/// IREE fuses the whole unpacking into its consumer.
fn unpack<'t>(x: &Tensor<'t>, dim: usize, count: usize, step: u8, mask: u8) -> Result<Tensor<'t>> {
    let mut shape = x.ty.shape.clone();
    shape.insert(dim, count);
    let kept: Vec<usize> = (0..shape.len()).filter(|&d| d != dim).collect();
    let wide = x.broadcast_in_dim(&shape, &kept)?;
    let k = x.tracer.iota(dim, TensorType::new(shape, x.ty.dtype))?;
    let shift = if step == 1 { k } else { k.multiply(&splat(&k, step.into())?)? };
    and(&wide.shift_right_logical(&shift)?, mask)
}

/// `x` with its dim `dim` split into `parts` (row-major).
fn split<'t>(x: &Tensor<'t>, dim: usize, parts: &[usize]) -> Result<Tensor<'t>> {
    let mut shape = x.ty.shape.clone();
    shape.splice(dim..=dim, parts.iter().copied());
    x.reshape(&shape)
}

/// `x` `[a, b, ...]` with its dims `dim` and `dim + 1` merged.
fn merge<'t>(x: &Tensor<'t>, dim: usize) -> Result<Tensor<'t>> {
    let mut shape = x.ty.shape.clone();
    let inner = shape.remove(dim + 1);
    shape[dim] *= inner;
    x.reshape(&shape)
}

/// The legacy nibble layout: `[n, L]` bytes to `[n, 2, L]` values, value
/// `j` the low nibble of `qs[j]` and value `j + L` its high nibble.
fn nibbles<'t>(b: &Blocks<'t>, qs: &Tensor<'t>) -> Result<Tensor<'t>> {
    unpack(qs, b.d(1), 2, 4, 0x0F)
}

/// Q5_0/Q5_1's values `[n, 2, 2, 8]` (value `16h + 8g + k`): the nibbles of
/// `qs` (`[n, 16]`) under bit `i` of the little-endian `u32` `qh` (`[n, 4]`)
/// as bit 4 of value `i`.
fn five_bit_32<'t>(b: &Blocks<'t>, qs: &Tensor<'t>, qh: &Tensor<'t>) -> Result<Tensor<'t>> {
    let low = nibbles(b, &qs.reshape(&b.sh(&[2, 8]))?)?;
    let high = unpack(&qh.reshape(&b.sh(&[2, 2]))?, b.d(3), 8, 1, 1)?;
    low.or(&shl(&high, 4)?)
}

/// The 2-bit layout of Q2_K and Q3_K: `[n, 64]` bytes to `[n, 2, 4, 2, 16]`
/// values, value `128h + 32s + l` being bits `2s..2s + 2` of `qs[32h + l]`
/// (`l` split in two, so that dims 1..4 index the 16-value sub-blocks).
fn crumbs_256<'t>(b: &Blocks<'t>, qs: &Tensor<'t>) -> Result<Tensor<'t>> {
    split(&unpack(&qs.reshape(&b.sh(&[2, 32]))?, b.d(2), 4, 2, 3)?, b.d(3), &[2, 16])
}

/// Bit `j` of `bytes[l]`, for `j` in `0..8`: `[n, len]` to `[n, 8, len]`.
fn bit_planes<'t>(b: &Blocks<'t>, bytes: &Tensor<'t>) -> Result<Tensor<'t>> {
    unpack(bytes, b.d(1), 8, 1, 1)
}

/// A table of 16 int8 levels indexed by a 4-bit code (IQ4's
/// `kvalues_iq4nl`, MXFP4's `kvalues_mxfp4`), packed for a lookup that
/// needs no memory: four 32-bit words, level `4k + j` the big-endian byte
/// `j` of word `k`. Bits 3 and 2 of the code pick the word (three selects),
/// a left shift by `8 * (code & 3)` brings the level to the top byte, and
/// an arithmetic right shift by 24 sign-extends it. Element-wise on 32-bit lanes, so it vectorizes and
/// fuses; in packed_matvec on AVX-512 this took a 2048 x 2048 IQ4_NL
/// product to 1.1 ms against 1.95 for two 64-bit words (twice the
/// registers) and 3.8 for a gather from a constant table. `lookup` is
/// the StableHLO form; packed_matvec's lowering has the scalar one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NibbleTable {
    /// Levels `4k..4k + 4` in word `k`, the first in the top byte.
    pub words: [i32; 4],
}

impl NibbleTable {
    /// `levels` packed into their four words.
    pub const fn new(levels: [i8; 16]) -> Self {
        let mut words = [0i32; 4];
        let mut i = 0;
        while i < 16 {
            words[i / 4] |= ((levels[i] as u8 as u32) << (24 - 8 * (i % 4))) as i32;
            i += 1;
        }
        NibbleTable { words }
    }

    /// Level `code` (`0..16`) read as the lowerings read it.
    pub const fn level(&self, code: u8) -> i8 {
        ((self.words[(code / 4) as usize] << (8 * (code % 4))) >> 24) as i8
    }
}

/// `kvalues_iq4nl` from `ggml-common.h`, the levels of IQ4_NL and IQ4_XS.
/// The CPU dequantizer keeps its own copy; the tests check that the two
/// agree.
pub const KVALUES_IQ4NL: NibbleTable =
    NibbleTable::new([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]);

/// `kvalues_mxfp4` from `ggml-common.h`: the e2m1 values doubled (so
/// integers), the levels of MXFP4. Code 8 is e2m1's `-0`, read as 0. The
/// CPU dequantizer keeps its own copy; the tests check that the two agree.
pub const KVALUES_MXFP4: NibbleTable = NibbleTable::new([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]);

/// `table`'s levels at `code` (an integer tensor, values in `0..16`), as
/// f32 (exact). Every step is defined on i32: the word is a splat of its
/// signed value, and no convert narrows a value that does not fit.
fn lookup<'t>(table: &NibbleTable, code: &Tensor<'t>) -> Result<Tensor<'t>> {
    let code = code.convert(DType::I32)?;
    let word = |k: usize| splat(&code, table.words[k].into());
    let bit = |mask: u8| -> Result<Tensor<'t>> {
        and(&code, mask)?.compare(crate::graph::ComparisonDirection::Ne, &splat(&code, 0.0)?)
    };
    let (bit2, bit3) = (bit(4)?, bit(8)?);
    let low = bit2.select(&word(1)?, &word(0)?)?;
    let high = bit2.select(&word(3)?, &word(2)?)?;
    let w = bit3.select(&high, &low)?;
    let top = w.shift_left(&shl(&and(&code, 3)?, 3)?)?;
    f32(&top.shift_right_arithmetic(&splat(&code, 24.0)?)?)
}

/// `block_q8_0 { d; qs[32] (int8) }`: `qs * d`.
fn q8_0<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let d = b.f16()?;
    let qs = b.take_i8(32)?;
    let q = f32(&qs)?;
    q.multiply(&per(&d, &q)?)
}

/// `block_q4_0 { d; qs[16] }`: `d * (q - 8)`.
fn q4_0<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let d = b.f16()?;
    let qs = b.take(16)?;
    let q = minus(&f32(&nibbles(b, &qs)?)?, 8.0)?;
    per(&d, &q)?.multiply(&q)
}

/// `block_q4_1 { d; m; qs[16] }`: `d * q + m`.
fn q4_1<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let d = b.f16()?;
    let m = b.f16()?;
    let qs = b.take(16)?;
    let q = f32(&nibbles(b, &qs)?)?;
    per(&d, &q)?.multiply(&q)?.add(&per(&m, &q)?)
}

/// `block_q5_0 { d; qh[4]; qs[16] }`: `d * (q - 16)`, bit `i` of `qh` as
/// bit 4 of value `i`.
fn q5_0<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let d = b.f16()?;
    let qh = b.take(4)?;
    let qs = b.take(16)?;
    let q = minus(&f32(&five_bit_32(b, &qs, &qh)?)?, 16.0)?;
    per(&d, &q)?.multiply(&q)
}

/// `block_q5_1 { d; m; qh[4]; qs[16] }`: `d * q + m`.
fn q5_1<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let d = b.f16()?;
    let m = b.f16()?;
    let qh = b.take(4)?;
    let qs = b.take(16)?;
    let q = f32(&five_bit_32(b, &qs, &qh)?)?;
    per(&d, &q)?.multiply(&q)?.add(&per(&m, &q)?)
}

/// `dl * q - ml` over sub-blocks: `dl`, `ml` `[n, S...]`, `q` f32 `[n, S..., L]`.
fn scaled_minus_min<'t>(dl: &Tensor<'t>, q: &Tensor<'t>, ml: &Tensor<'t>) -> Result<Tensor<'t>> {
    per(dl, q)?.multiply(q)?.subtract(&per(ml, q)?)
}

/// `block_q2_K { scales[16]; qs[64]; d; dmin }`: `d * sc * q - dmin * m`
/// per 16-value sub-block, `sc`/`m` the low/high nibbles of `scales`.
fn q2_k<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let scales = b.take(QK_K / 16)?;
    let qs = b.take(QK_K / 4)?;
    let d = b.f16()?;
    let dmin = b.f16()?;
    let sc = f32(&and(&scales, 0x0F)?)?;
    let dl = split(&per(&d, &sc)?.multiply(&sc)?, b.d(1), &[2, 4, 2])?;
    let m = f32(&shr(&scales, 4)?)?;
    let ml = split(&per(&dmin, &m)?.multiply(&m)?, b.d(1), &[2, 4, 2])?;
    let q = f32(&crumbs_256(b, &qs)?)?;
    scaled_minus_min(&dl, &q, &ml)
}

/// `block_q3_K { hmask[32]; qs[64]; scales[12]; d }`: `d * (sc - 32) * q`
/// per 16-value sub-block; `q` takes its low two bits as Q2_K does and
/// loses 4 when bit `i / 32` of `hmask[i % 32]` is clear.
fn q3_k<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let hmask = b.take(QK_K / 8)?;
    let qs = b.take(QK_K / 4)?;
    let scales = b.take(12)?;
    let d = b.f16()?;
    // Scale j: low nibble of byte j % 8 (high nibble for j >= 8), top two
    // bits from byte 8 + j % 4 at bit 2 * (j / 4).
    let lo = merge(&nibbles(b, &b.cols(&scales, 0, 8)?)?, b.d(1))?;
    let hi = merge(&unpack(&b.cols(&scales, 8, 12)?, b.d(1), 4, 2, 3)?, b.d(1))?;
    let sc = minus(&f32(&lo.or(&shl(&hi, 4)?)?)?, 32.0)?;
    let dl = split(&per(&d, &sc)?.multiply(&sc)?, b.d(1), &[2, 4, 2])?;
    // Value 128h + 32s + l: low bits from qs, bit 4h + s of hmask[l] as bit 2.
    let low = crumbs_256(b, &qs)?;
    let high = split(&split(&bit_planes(b, &hmask)?, b.d(1), &[2, 4])?, b.d(3), &[2, 16])?;
    let q = minus(&f32(&low.or(&shl(&high, 2)?)?)?, 4.0)?;
    per(&dl, &q)?.multiply(&q)
}

/// `get_scale_min_k4`: Q4_K/Q5_K's 12 bytes to eight 6-bit scales and
/// mins, as f32 `[n, 8]` each. For `j < 4` they are the low six bits of
/// bytes `j` and `j + 4`; for `j >= 4` the nibbles of byte `j + 4` under
/// the top two bits of bytes `j - 4` and `j`.
fn scale_min_k4<'t>(b: &Blocks<'t>, scales: &Tensor<'t>) -> Result<(Tensor<'t>, Tensor<'t>)> {
    let wide = b.sh(&[2, 4]);
    let kept: Vec<usize> = (0..b.lead.len()).chain([b.d(2)]).collect();
    let part = |k: usize| -> Result<Tensor<'t>> { b.cols(scales, 4 * k, 4 * k + 4)?.broadcast_in_dim(&wide, &kept) };
    let (s0, s1, s2) = (part(0)?, part(1)?, part(2)?);
    let first = scales.tracer.iota(b.d(1), TensorType::new(wide.clone(), DType::UI8))?;
    let first = first.compare(crate::graph::ComparisonDirection::Eq, &splat(&first, 0.0)?)?;
    let top = |s: &Tensor<'t>| shl(&shr(s, 6)?, 4);
    let sc = first.select(&and(&s0, 0x3F)?, &and(&s2, 0x0F)?.or(&top(&s0)?)?)?;
    let m = first.select(&and(&s1, 0x3F)?, &shr(&s2, 4)?.or(&top(&s1)?)?)?;
    Ok((f32(&merge(&sc, b.d(1))?)?, f32(&merge(&m, b.d(1))?)?))
}

/// Q4_K/Q5_K's low nibbles: `[n, 128]` bytes to `[n, 4, 2, 32]`, sub-blocks
/// `2c` and `2c + 1` the low and high nibbles of `qs[32c..32c + 32]`.
fn nibbles_k<'t>(b: &Blocks<'t>, qs: &Tensor<'t>) -> Result<Tensor<'t>> {
    unpack(&qs.reshape(&b.sh(&[4, 32]))?, b.d(2), 2, 4, 0x0F)
}

/// `block_q4_K { d; dmin; scales[12]; qs[128] }`: `d * sc * q - dmin * m`
/// per 32-value sub-block.
fn q4_k<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let d = b.f16()?;
    let dmin = b.f16()?;
    let (sc, m) = scale_min_k4(b, &b.take(12)?)?;
    let qs = b.take(QK_K / 2)?;
    let dl = split(&per(&d, &sc)?.multiply(&sc)?, b.d(1), &[4, 2])?;
    let ml = split(&per(&dmin, &m)?.multiply(&m)?, b.d(1), &[4, 2])?;
    let q = f32(&nibbles_k(b, &qs)?)?;
    scaled_minus_min(&dl, &q, &ml)
}

/// `block_q5_K { d; dmin; scales[12]; qh[32]; qs[128] }`: Q4_K with bit
/// `j` of `qh[l]` as bit 4 of value `l` of sub-block `j`.
fn q5_k<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let d = b.f16()?;
    let dmin = b.f16()?;
    let (sc, m) = scale_min_k4(b, &b.take(12)?)?;
    let qh = b.take(QK_K / 8)?;
    let qs = b.take(QK_K / 2)?;
    let dl = split(&per(&d, &sc)?.multiply(&sc)?, b.d(1), &[4, 2])?;
    let ml = split(&per(&dmin, &m)?.multiply(&m)?, b.d(1), &[4, 2])?;
    let q = nibbles_k(b, &qs)?.or(&shl(&split(&bit_planes(b, &qh)?, b.d(1), &[4, 2])?, 4)?)?;
    scaled_minus_min(&dl, &f32(&q)?, &ml)
}

/// `block_q6_K { ql[128]; qh[64]; scales[16] (int8); d }`: `d * sc * (q -
/// 32)` per 16-value sub-block. Value `128h + r` takes its low nibble from
/// `ql[64h + r % 64]` (high nibble when `r >= 64`) and its top two bits
/// from bits `2(r / 32)..` of `qh[32h + r % 32]`.
fn q6_k<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let ql = b.take(QK_K / 2)?;
    let qh = b.take(QK_K / 4)?;
    let scales = b.take_i8(QK_K / 16)?;
    let d = b.f16()?;
    // Value 128h + 64s + 32u + 16w + v: dims [n, h, s, u, w, v].
    let low = split(&unpack(&ql.reshape(&b.sh(&[2, 64]))?, b.d(2), 2, 4, 0x0F)?, b.d(3), &[2, 2, 16])?;
    let high = split(&unpack(&qh.reshape(&b.sh(&[2, 32]))?, b.d(2), 4, 2, 3)?, b.d(2), &[2, 2])?;
    let high = split(&high, b.d(4), &[2, 16])?;
    let q = minus(&f32(&low.or(&shl(&high, 4)?)?)?, 32.0)?;
    let sc = f32(&scales)?;
    let dl = split(&per(&d, &sc)?.multiply(&sc)?, b.d(1), &[2, 2, 2, 2])?;
    per(&dl, &q)?.multiply(&q)
}

/// `block_iq4_nl { d; qs[16] }`: `d * kvalues_iq4nl[q]`, the nibbles in the
/// legacy layout.
fn iq4_nl<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let d = b.f16()?;
    let qs = b.take(16)?;
    let q = lookup(&KVALUES_IQ4NL, &nibbles(b, &qs)?)?;
    per(&d, &q)?.multiply(&q)
}

/// `block_iq4_xs { d; scales_h; scales_l[4]; qs[128] }`: `d * (ls - 32) *
/// kvalues_iq4nl[q]` per 32-value sub-block `j`, whose values are the
/// nibbles of `qs[16j..16j + 16]` in the legacy layout. The 6-bit `ls`
/// takes its low four bits from nibble `j % 2` of `scales_l[j / 2]` and its
/// top two from bits `2j..` of the little-endian `u16` `scales_h`.
fn iq4_xs<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let d = b.f16()?;
    let scales_h = b.take(2)?;
    let scales_l = b.take(QK_K / 64)?;
    let qs = b.take(QK_K / 2)?;
    // [n, 4, 2] nibbles of scales_l and [n, 2, 4] crumbs of scales_h, both
    // in sub-block order once merged to [n, 8].
    let lo = merge(&unpack(&scales_l, b.d(2), 2, 4, 0x0F)?, b.d(1))?;
    let hi = merge(&unpack(&scales_h, b.d(2), 4, 2, 3)?, b.d(1))?;
    let ls = minus(&f32(&lo.or(&shl(&hi, 4)?)?)?, 32.0)?;
    let dl = per(&d, &ls)?.multiply(&ls)?;
    let q = lookup(&KVALUES_IQ4NL, &unpack(&qs.reshape(&b.sh(&[8, 16]))?, b.d(2), 2, 4, 0x0F)?)?;
    per(&dl, &q)?.multiply(&q)
}

/// `block_mxfp4 { e; qs[16] }`: `e8m0_half(e) * kvalues_mxfp4[q]`, the
/// nibbles in the legacy layout, the scale in two factors
/// ([`Blocks::e8m0_half`]). The block is 17 bytes, so `qs` starts at an odd
/// offset; the slices read it where it is.
fn mxfp4<'t>(b: &Blocks<'t>) -> Result<Tensor<'t>> {
    let (d, first) = b.e8m0_half()?;
    let qs = b.take(16)?;
    let q = lookup(&KVALUES_MXFP4, &nibbles(b, &qs)?)?;
    let q = per(&first, &q)?.multiply(&q)?;
    per(&d, &q)?.multiply(&q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::{self, Buffer, Value};
    use crate::iree::Iree;
    use crate::lower::{self, LowerOptions};
    use crate::npy;
    use crate::trace::Tracer;
    use crate::weights::quant;
    use crate::weights::safetensors::{self, SafeTensors, StDType};
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    const BLOCKS: usize = 8;

    /// Every type [`supported`] admits, in the order the test graph holds them.
    const TYPES: [GgmlType; 13] = {
        use GgmlType as T;
        [
            T::Q8_0,
            T::Q4_0,
            T::Q4_1,
            T::Q5_0,
            T::Q4_K,
            T::Q6_K,
            T::Q5_1,
            T::Q2_K,
            T::Q3_K,
            T::Q5_K,
            T::IQ4_NL,
            T::IQ4_XS,
            T::MXFP4,
        ]
    };

    /// Byte offsets of the f16 fields in each block, as gguf_reference.py has them.
    fn f16_fields(ty: GgmlType) -> &'static [usize] {
        use GgmlType as T;
        match ty {
            T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => &[0],
            T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => &[0, 2],
            T::Q2_K => &[80, 82],
            T::Q3_K => &[108],
            T::Q6_K => &[208],
            // MXFP4's scale is an e8m0 byte (see `random_blocks_n`).
            T::MXFP4 => &[],
            _ => unreachable!("{ty}"),
        }
    }

    fn splitmix64(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Random blocks whose f16 fields are finite, subnormals included
    /// (exponent field 0..=20, random sign and mantissa), as in
    /// `test/quant/gguf_reference.py`. MXFP4's e8m0 `e` is at most 252
    /// (its scale `2^(e - 128)` times 12 stays finite); the first three
    /// blocks take 0 and 1 (the subnormal scales) and 252.
    fn random_blocks(ty: GgmlType, seed: u64) -> Vec<u8> {
        random_blocks_n(ty, seed, BLOCKS)
    }

    fn random_blocks_n(ty: GgmlType, seed: u64, blocks: usize) -> Vec<u8> {
        let mut state = seed ^ u64::from(ty.id()).wrapping_mul(0x1000_0000_01b3);
        let mut bytes: Vec<u8> = (0..blocks * ty.type_size()).map(|_| splitmix64(&mut state) as u8).collect();
        for block in bytes.chunks_exact_mut(ty.type_size()) {
            for &off in f16_fields(ty) {
                let r = splitmix64(&mut state);
                let (sign, exp, man) = ((r & 1) as u16, ((r >> 1) % 21) as u16, ((r >> 8) & 0x3FF) as u16);
                block[off..off + 2].copy_from_slice(&((sign << 15) | (exp << 10) | man).to_le_bytes());
            }
        }
        if ty == GgmlType::MXFP4 {
            for (k, block) in bytes.chunks_exact_mut(ty.type_size()).enumerate() {
                block[0] = [0, 1, 252].get(k).copied().unwrap_or((splitmix64(&mut state) % 253) as u8);
            }
        }
        bytes
    }

    fn shape_of(ty: GgmlType) -> [usize; 2] {
        [2, BLOCKS / 2 * ty.block_size()]
    }

    /// The first index where `got`'s bits differ from `want`'s.
    fn first_mismatch(got: &Value, want: &[f32]) -> Option<String> {
        let Buffer::F32(got) = &got.data else { return Some(format!("not f32: {}", got.ty)) };
        if got.len() != want.len() {
            return Some(format!("{} values, expected {}", got.len(), want.len()));
        }
        let i = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits())?;
        Some(format!(
            "index {i}: got {:e} ({:#010x}), expected {:e} ({:#010x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        ))
    }

    /// Every type dequantized from its param, by `op` ([`dequantize`] or
    /// [`decompose`]).
    fn graph_of(names: &[String], raw: &[Vec<u8>], op: DequantizeFn) -> crate::graph::Graph {
        let t = Tracer::new("main");
        let mut outs = Vec::new();
        for ((&ty, name), bytes) in TYPES.iter().zip(names).zip(raw) {
            let p = t.param(name, TensorType::new([bytes.len()], DType::I8)).unwrap();
            let y = op(&p, ty, &shape_of(ty)).unwrap();
            assert_eq!(y.ty, TensorType::new(shape_of(ty), DType::F32));
            outs.push(y);
        }
        // The same bytes as rows of blocks, `[2, blocks, type_size]`, to
        // `[2, blocks, block_dims...]`: the form `Weight::linear` streams.
        for ((&ty, name), bytes) in TYPES.iter().zip(names).zip(raw) {
            let p = t.param(name, TensorType::new([bytes.len()], DType::I8)).unwrap();
            let rows = p.reshape(&[2, BLOCKS / 2, ty.type_size()]).unwrap();
            let shape = [&[2, BLOCKS / 2][..], block_dims(ty)].concat();
            outs.push(op(&rows, ty, &shape).unwrap());
        }
        t.finish(&outs.iter().collect::<Vec<_>>()).unwrap()
    }

    type DequantizeFn = for<'t> fn(&Tensor<'t>, GgmlType, &[usize]) -> Result<Tensor<'t>>;

    /// The composite op through IREE (its lowering calls the decomposition)
    /// and the interpreter (the CPU dequantizer), and the decomposition
    /// itself through the interpreter. IREE's runtime writes subnormal
    /// results as zeros (the module doc), so its values are compared with
    /// the CPU's flushed so: MXFP4's blocks with `e < 2` hold both kinds.
    #[test]
    fn iree_and_interpreter_match_the_cpu_dequantizers_bit_for_bit() {
        assert!(TYPES.iter().all(|&t| supported(t)));
        assert_eq!(GgmlType::ALL.iter().filter(|&&t| supported(t)).count(), TYPES.len());
        let raw: Vec<Vec<u8>> = TYPES.iter().map(|&ty| random_blocks(ty, 0x5eed)).collect();
        let names: Vec<String> = TYPES.iter().map(|ty| format!("q.{ty}")).collect();
        let graph = graph_of(&names, &raw, dequantize);
        let decomposed = graph_of(&names, &raw, decompose);

        let dir = tempfile::tempdir().unwrap();
        let params_path = dir.path().join("params.safetensors");
        let shapes: Vec<[usize; 1]> = raw.iter().map(|b| [b.len()]).collect();
        let tensors: Vec<(&str, StDType, &[usize], &[u8])> = names
            .iter()
            .zip(&shapes)
            .zip(&raw)
            .map(|((n, s), b)| (n.as_str(), StDType::I8, s.as_slice(), b.as_slice()))
            .collect();
        safetensors::write(&params_path, &tensors, &BTreeMap::new()).unwrap();

        let expected: Vec<Vec<f32>> =
            TYPES.iter().zip(&raw).map(|(&ty, b)| quant::dequantize_to_vec(ty, b).unwrap()).collect();
        let flushed: Vec<Vec<f32>> = expected
            .iter()
            .map(|v| v.iter().map(|&w| if w.is_subnormal() { 0f32.copysign(w) } else { w }).collect())
            .collect();
        // MXFP4's first block (e = 0, scale 2^-128) has normal values and
        // subnormal ones; the other types have no subnormal value.
        let mxfp4 = &expected[TYPES.iter().position(|&t| t == GgmlType::MXFP4).expect("in TYPES")][..32];
        assert!(mxfp4.iter().any(|w| w.is_normal()) && mxfp4.iter().any(|w| w.is_subnormal()), "{mxfp4:?}");
        assert_eq!(flushed.iter().zip(&expected).filter(|(f, e)| f != e).count(), 1);

        let params = SafeTensors::open(&params_path).unwrap();
        let interp_out = interp::run(&graph, &[], &params).unwrap();
        let decomposed_out = interp::run(&decomposed, &[], &params).unwrap();

        let iree = Iree::for_tests();
        let mlir_path = dir.path().join("module.mlir");
        std::fs::write(&mlir_path, lower::lower_to_string(&graph, &LowerOptions::default()).unwrap()).unwrap();
        let vmfb = dir.path().join("module.vmfb");
        iree.compile(&mlir_path, &vmfb).unwrap();
        // Every GPU target takes every type's dequantize too (compile only).
        iree.compile_for_test_gpus(&mlir_path, &dir.path().join("gpus.vmfb")).unwrap();
        let out_paths: Vec<PathBuf> = (0..2 * TYPES.len()).map(|i| dir.path().join(format!("out{i}.npy"))).collect();
        iree.run(&vmfb, "main", &[], &[("model", params_path.as_path())], &out_paths).unwrap();

        let mut failures = Vec::new();
        for (i, ty) in TYPES.iter().chain(&TYPES).enumerate() {
            let (form, want) = (if i < TYPES.len() { "" } else { " as blocks" }, &expected[i % TYPES.len()]);
            if let Some(m) = first_mismatch(&interp_out[i], want) {
                failures.push(format!("{ty}{form} interpreter: {m}"));
            }
            if let Some(m) = first_mismatch(&decomposed_out[i], want) {
                failures.push(format!("{ty}{form} decomposition, interpreter: {m}"));
            }
            if let Some(m) = first_mismatch(&npy::read(&out_paths[i]).unwrap(), &flushed[i % TYPES.len()]) {
                failures.push(format!("{ty}{form} IREE: {m}"));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    /// `packed_matvec` of every type it takes, through IREE (the blocks
    /// decoded in a `linalg.generic`'s body) and the interpreter, against
    /// the CPU dequantizer and an f64 dot: every bit of every field is
    /// random, so a misread bit or field shows (MXFP4's scales within
    /// [`mxfp4_rows`]' bounds). Every other type streams two matrices in one
    /// product, and x has 1, 2 or 3 rows by turns (a step of that many
    /// tokens).
    #[test]
    fn packed_matvec_matches_the_cpu_dequantizer_and_dot() {
        const ROWS: usize = 21; // not a whole number of the lowering's 16-row tiles
        let t = Tracer::new("main");
        let (mut outs, mut raws, mut xs) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &ty) in TYPES.iter().enumerate() {
            let blocks = 512 / ty.block_size();
            // One type reads its blocks as ui8, the dtype packed params have.
            let dtype = if ty == GgmlType::Q4_1 { DType::UI8 } else { DType::I8 };
            let mut matrices = Vec::new();
            for m in 0..1 + i % 2 {
                let mut raw = random_blocks_n(ty, 0x3a7 + (16 * m + i) as u64, ROWS * blocks);
                if ty == GgmlType::MXFP4 {
                    mxfp4_rows(&mut raw, blocks);
                }
                let p = t.param(&format!("w{i}_{m}"), TensorType::new([raw.len()], dtype)).unwrap();
                matrices.push(
                    p.reshape(&[ROWS, blocks, ty.type_size()])
                        .unwrap()
                        .tile_rows(PACKED_LANES, &packed_byte_order(ty))
                        .unwrap(),
                );
                raws.push((format!("w{i}_{m}"), dtype, raw));
            }
            let x = t.input(&format!("x{i}"), TensorType::new([1 + i % 3, 512], DType::F32)).unwrap();
            outs.push(packed_matvec(&matrices.iter().collect::<Vec<_>>(), ty, &x).unwrap());
            let seed = 0x51 + i as u64;
            let x = Value::random(&x.ty, seed, 0..1);
            xs.push(if ty == GgmlType::MXFP4 { mxfp4_x(x) } else { x });
        }
        let graph = t.finish(&outs.iter().collect::<Vec<_>>()).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let params_path = dir.path().join("params.safetensors");
        let shapes: Vec<[usize; 1]> = raws.iter().map(|(_, _, b)| [b.len()]).collect();
        let tensors: Vec<(&str, StDType, &[usize], &[u8])> = raws
            .iter()
            .zip(&shapes)
            .map(|((n, dt, b), s)| {
                (n.as_str(), if *dt == DType::UI8 { StDType::U8 } else { StDType::I8 }, s.as_slice(), b.as_slice())
            })
            .collect();
        safetensors::write(&params_path, &tensors, &BTreeMap::new()).unwrap();
        let params = SafeTensors::open(&params_path).unwrap();
        let interp_out = interp::run(&graph, &xs, &params).unwrap();

        let iree = Iree::for_tests();
        let mlir = lower::lower_to_string(&graph, &LowerOptions::default()).unwrap();
        assert_eq!(mlir.matches("\"linalg.generic\"").count(), TYPES.len(), "one generic per product");
        let mlir_path = dir.path().join("module.mlir");
        std::fs::write(&mlir_path, mlir).unwrap();
        let vmfb = dir.path().join("module.vmfb");
        iree.compile(&mlir_path, &vmfb).unwrap();
        // Every GPU target takes every type's product too (compile only).
        iree.compile_for_test_gpus(&mlir_path, &dir.path().join("gpus.vmfb")).unwrap();
        let in_paths: Vec<PathBuf> = (0..xs.len()).map(|i| dir.path().join(format!("x{i}.npy"))).collect();
        for (path, x) in in_paths.iter().zip(&xs) {
            npy::write(path, x).unwrap();
        }
        let out_paths: Vec<PathBuf> = (0..xs.len()).map(|i| dir.path().join(format!("y{i}.npy"))).collect();
        iree.run(&vmfb, "main", &in_paths, &[("model", params_path.as_path())], &out_paths).unwrap();

        let mut failures = Vec::new();
        let mut matrices = raws.iter();
        // Each matrix's ROWS rows, without the last tile's padding.
        let rows = |v: Vec<f64>| -> Vec<f64> {
            v.chunks(ROWS.next_multiple_of(PACKED_LANES)).flat_map(|r| r[..ROWS].to_vec()).collect()
        };
        for (i, &ty) in TYPES.iter().enumerate() {
            let xs = xs[i].to_f64_vec();
            let columns = xs.len() / 512;
            let got_iree = rows(npy::read(&out_paths[i]).unwrap().to_f64_vec());
            let got_interp = rows(interp_out[i].to_f64_vec());
            let raw: Vec<&[u8]> =
                (0..1 + i % 2).map(|_| matrices.next().expect("one per matrix").2.as_slice()).collect();
            let w: Vec<f32> = raw.iter().flat_map(|raw| quant::dequantize_to_vec(ty, raw).unwrap()).collect();
            // packed_matvec makes MXFP4's subnormal scales (e < 2) zeros, as
            // IREE's runtime would read them.
            let w_iree: Vec<f32> = match ty {
                GgmlType::MXFP4 => {
                    let blocks = raw.iter().flat_map(|raw| raw.chunks_exact(ty.type_size()));
                    let tiny = |block: &[u8]| block[0] < 2;
                    let w_iree: Vec<f32> = blocks
                        .zip(w.chunks_exact(ty.block_size()))
                        .flat_map(|(block, values)| values.iter().map(move |&v| if tiny(block) { 0.0 } else { v }))
                        .collect();
                    assert_ne!(w_iree, w, "some block has e < 2");
                    w_iree
                }
                _ => w.clone(),
            };
            // Output rows are matrix-major, then x's rows.
            let (w, w_iree) = (w.chunks(ROWS * 512), w_iree.chunks(ROWS * 512));
            let outputs = w.zip(w_iree).flat_map(|pair| xs.chunks(512).map(move |x| (pair, x)));
            for (o, ((w, w_iree), x)) in outputs.enumerate() {
                for (r, (row, row_iree)) in w.chunks(512).zip(w_iree.chunks(512)).enumerate() {
                    let dot = |row: &[f32]| -> (f64, f64) {
                        let terms = row.iter().zip(x).map(|(&w, x)| w as f64 * x);
                        (terms.clone().sum(), terms.map(f64::abs).sum())
                    };
                    let ((want, scale), (want_iree, scale_iree)) = (dot(row), dot(row_iree));
                    let at = o * ROWS + r;
                    let checks = [
                        ("IREE", got_iree[at], want_iree, scale_iree, 1e-5),
                        ("interpreter", got_interp[at], want, scale, 1e-7),
                    ];
                    for (who, got, want, scale, tol) in checks {
                        if (got - want).abs() > tol * scale.max(f64::MIN_POSITIVE) {
                            failures.push(format!("{ty} output {o} row {r} {who}: {got} vs {want} (scale {scale})"));
                        }
                    }
                }
            }
            assert_eq!(got_iree.len(), (1 + i % 2) * columns * ROWS, "{ty}: rows of every matrix and column");
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    /// MXFP4 rows of `blocks` blocks whose sums stay finite and whose blocks
    /// weigh alike, so that a misdecoded block shows in its row's sum: row
    /// `r`'s exponents span four binades from a base that cycles through
    /// e8m0's range, the subnormal scales (`e < 2`, which packed_matvec
    /// makes zeros) among the smallest normal ones in the first. At most
    /// `e = 215`: 512 values of at most `12 * 2^87` times `|x| < 2^24`
    /// ([`mxfp4_x`]) sum to less than `2^124`.
    fn mxfp4_rows(raw: &mut [u8], blocks: usize) {
        const BASES: [u8; 6] = [0, 60, 120, 127, 200, 212];
        for (k, block) in raw.chunks_exact_mut(GgmlType::MXFP4.type_size()).enumerate() {
            block[0] = BASES[k / blocks % BASES.len()] + block[0] % 4;
        }
    }

    /// `x` (24-bit steps in `[-1, 1)`) times `2^24`: integers, so that each
    /// lane's sum `Σ level · x` over a block is 0 or at least 1, and a block
    /// with the smallest normal scales (`e = 2, 3`) adds normal f32s that
    /// IREE, which writes subnormals as zeros, keeps.
    fn mxfp4_x(x: Value) -> Value {
        let scaled = x.to_f64_vec().iter().map(|v| (v * 16_777_216.0) as f32).collect();
        Value::new(x.ty, Buffer::F32(scaled)).expect("the same type and length")
    }

    /// The packed table is `kvalues_mxfp4` as the CPU dequantizer reads it:
    /// an MXFP4 block with `e = 128` (scale 1) and low nibbles `0..16`
    /// dequantizes to the levels in order.
    #[test]
    fn mxfp4_table_matches_the_cpu_dequantizer() {
        let mut block = vec![128];
        block.extend(0..16u8);
        let levels = quant::dequantize_to_vec(GgmlType::MXFP4, &block).unwrap();
        let packed: Vec<f32> = (0..16).map(|i| f32::from(KVALUES_MXFP4.level(i))).collect();
        assert_eq!(packed, levels[..16]);
        assert_eq!(packed[7], 12.0);
    }

    /// The packed table is `kvalues_iq4nl` as the CPU dequantizer reads it:
    /// an IQ4_NL block with `d = 1` and low nibbles `0..16` dequantizes to
    /// the levels in order.
    #[test]
    fn iq4_table_matches_the_cpu_dequantizer() {
        let mut block = vec![0x00, 0x3C]; // f16 1.0
        block.extend(0..16u8);
        let levels = quant::dequantize_to_vec(GgmlType::IQ4_NL, &block).unwrap();
        let packed: Vec<f32> = (0..16).map(|i| f32::from(KVALUES_IQ4NL.level(i))).collect();
        assert_eq!(packed, levels[..16]);
        // Levels 0..4 (-127, -104, -83, -65), the first in the top byte.
        assert_eq!(KVALUES_IQ4NL.words[0] as u32, 0x8198_ADBF);
    }

    #[test]
    fn wrong_lengths_and_unsupported_types_are_errors() {
        let t = Tracer::new("main");
        let raw = t.param("w", TensorType::new([2 * 18], DType::I8)).unwrap();
        assert!(dequantize(&raw, GgmlType::Q4_0, &[2, 32]).is_ok());
        let err = dequantize(&raw, GgmlType::Q4_0, &[3, 32]).unwrap_err().to_string();
        assert!(err.contains("Q4_0") && err.contains("needs 54 bytes"), "{err}");
        let err = dequantize(&raw, GgmlType::Q4_0, &[2, 31]).unwrap_err().to_string();
        assert!(err.contains("whole number of 32-value blocks"), "{err}");
        // Q8_1 (36-byte blocks of 32) has no decomposition: only the type is wrong.
        let err = dequantize(&raw, GgmlType::Q8_1, &[32]).unwrap_err().to_string();
        assert!(err.contains("ggml type Q8_1 is not supported in graphs"), "{err}");
        assert!(!supported(GgmlType::F16) && !supported(GgmlType::Q8_K));
        let wide = t.param("f", TensorType::new([36], DType::F32)).unwrap();
        let err = dequantize(&wide, GgmlType::Q4_0, &[2, 32]).unwrap_err().to_string();
        assert!(err.contains("1-D i8 or ui8"), "{err}");
        let unsigned = t.param("u", TensorType::new([36], DType::UI8)).unwrap();
        assert!(dequantize(&unsigned, GgmlType::Q4_0, &[64]).is_ok());
    }
}
