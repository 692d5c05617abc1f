//! What the families stand on: a checkpoint as the front-ends see it
//! ([`Checkpoint`], asked for tensors by llama.cpp's GGUF names), a GGUF
//! read under a [`PackedPolicy`] ([`GgufWeights`]: how each tensor becomes
//! a graph param, and the same values for the reference interpreter), and
//! [`Weight`], a declared param with what it takes to read it as f32 and
//! multiply by it (fused with the dequantization where one row streams the
//! packed blocks).

use super::{ModelError, Result};
use crate::graph::{DType, TensorType};
use crate::interp::{InterpError, ParamSource, Value};
use crate::trace::dequant::{self, packed_byte_order, PACKED_LANES};
use crate::trace::nn::to_f32;
use crate::trace::{Tensor, Tracer};
use crate::weights::archive::{self, DerivedParam, Encoding, Source};
use crate::weights::ggml::GgmlType;
use crate::weights::gguf::{Gguf, GgufTensor};
use std::collections::BTreeSet;
use std::path::Path;

/// What a quantized (packed) checkpoint tensor becomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PackedPolicy {
    /// Refuse: the error names the tensor, its encoding and the other two
    /// policies. The default, so that nothing is dequantized by surprise.
    #[default]
    Fail,
    /// A dense param of this dtype (f32, f16 or bf16), dequantized on the
    /// host: its bytes differ from the checkpoint's, so export writes them
    /// into an archive.
    Dequantize(DType),
    /// The raw ggml blocks as a `tensor<NBYTESxi8>` param that can point
    /// straight into the GGUF file; the graph dequantizes them
    /// ([`crate::trace::dequant`]).
    Keep,
}

impl std::fmt::Display for PackedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PackedPolicy::Fail => f.write_str("fail"),
            PackedPolicy::Dequantize(dtype) => write!(f, "dequantize to {dtype}"),
            PackedPolicy::Keep => f.write_str("keep"),
        }
    }
}

/// A checkpoint as the front-ends see it. Tensors are asked for by
/// llama.cpp's GGUF names (`blk.0.attn_q.weight`); a source with other
/// names (HF safetensors) maps them. The param each one declares is named
/// as in the source file, so `#flow.parameter.named<"model"::NAME>` finds it
/// there.
pub trait Checkpoint: ParamSource {
    /// Declares the tensor `name` as a param, checking it has the row-major
    /// `expected` shape.
    fn load<'t>(&self, tracer: &'t Tracer, name: &str, expected: &[usize]) -> Result<Weight<'t>>;

    /// Whether the checkpoint has the tensor `name`.
    fn contains(&self, name: &str) -> bool;

    /// How the param `param` (a name in the source file, as declared by
    /// [`Checkpoint::load`]) is made from the stored bytes: copied when
    /// [`DerivedParam::is_copy`], else converted.
    fn stored(&self, param: &str) -> Result<DerivedParam<'_>>;

    /// The file that `#flow.parameter.named` keys of copied params refer to.
    fn path(&self) -> &Path;

    /// A stored tensor of the model that is not among `used` (the params
    /// the front-end declared, by their names in the file): a part of the
    /// model kiln would leave out. Parts that are not the decoder's (a
    /// vision tower) or that the reference implementation ignores too (a
    /// tied checkpoint's stored head; `unread`, by their GGUF names) do not
    /// count.
    fn unused(&self, used: &BTreeSet<&str>, unread: &[String]) -> Option<String>;
}

/// `cast` if it is a float dtype a dense param can be declared as.
pub(super) fn float_cast(cast: Option<DType>) -> Result<Option<DType>> {
    match cast {
        Some(dtype) if !dtype.is_float() => Err(ModelError::DequantizeDType(dtype)),
        cast => Ok(cast),
    }
}

/// The interpreter's view of a checkpoint: each param as it is declared,
/// converted on the host when it is not stored as is.
pub(super) fn param_value(
    checkpoint: &dyn Checkpoint,
    name: &str,
    ty: &TensorType,
) -> std::result::Result<Value, InterpError> {
    let fail = |message: String| InterpError::Param { name: name.to_string(), message };
    let stored = checkpoint.stored(name).map_err(|e| match e {
        ModelError::MissingTensor(_) => InterpError::MissingParam { name: name.to_string() },
        e => fail(e.to_string()),
    })?;
    if stored.target != ty.dtype {
        return Err(InterpError::ParamType {
            name: name.to_string(),
            expected: ty.clone(),
            found: stored.target.to_string(),
        });
    }
    if let Some(bytes) = stored.in_place() {
        return Value::from_le_bytes(ty, bytes);
    }
    let bytes = archive::derive_to_vec(&stored).map_err(|e| fail(e.to_string()))?;
    Value::from_le_bytes(ty, &bytes)
}

/// How a GGUF tensor is declared as a param ([`GgufWeights::declare`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Declared {
    /// The param's type.
    pub ty: TensorType,
    /// The ggml type of the blocks a packed param keeps as `[nbytes]` i8.
    pub packed: Option<GgmlType>,
    /// How the stored bytes are read to make the param's.
    pub encoding: Encoding,
}

impl Declared {
    /// A dense param of type `ty`, made from blocks of `stored`.
    fn dense(ty: TensorType, stored: GgmlType) -> Declared {
        Declared { ty, packed: None, encoding: Encoding::Ggml(stored) }
    }
}

/// A GGUF file read under a [`PackedPolicy`]: how each tensor is declared
/// as a param ([`GgufWeights::declare`], [`Checkpoint::load`]), and the
/// same values for the interpreter ([`ParamSource`]).
pub struct GgufWeights<'g, D: AsRef<[u8]>> {
    /// The parsed, mapped file.
    pub gguf: &'g Gguf<D>,
    /// What quantized tensors become.
    pub packed: PackedPolicy,
    /// Dense float tensors are declared as this dtype instead of their own
    /// (an archive of one dtype); `None` keeps them as stored.
    pub cast: Option<DType>,
}

impl<'g, D: AsRef<[u8]>> GgufWeights<'g, D> {
    /// Reads `gguf` under `packed`; fails if a dequantize dtype is not a float.
    pub fn new(gguf: &'g Gguf<D>, packed: PackedPolicy) -> Result<Self> {
        if let PackedPolicy::Dequantize(dtype) = packed {
            float_cast(Some(dtype))?;
        }
        Ok(GgufWeights { gguf, packed, cast: None })
    }

    /// Declares every dense float tensor as `cast` (f32, f16 or bf16), or
    /// as stored with `None`.
    pub fn with_cast(mut self, cast: Option<DType>) -> Result<Self> {
        self.cast = float_cast(cast)?;
        Ok(self)
    }

    /// How `tensor` becomes a param: f32/f16/bf16 as themselves (or the
    /// cast); a quantized type as the policy says. The one place that
    /// decides it, for [`Checkpoint::load`], [`Checkpoint::stored`] and the
    /// interpreter alike.
    pub fn declare(&self, tensor: &GgufTensor<'_>) -> Result<Declared> {
        let dense = |dtype| Ok(Declared::dense(TensorType::new(tensor.shape(), dtype), tensor.ggml_type));
        let name = || tensor.name.to_string();
        match (tensor.ggml_type, self.packed) {
            (GgmlType::F32, _) => dense(self.cast.unwrap_or(DType::F32)),
            (GgmlType::F16, _) => dense(self.cast.unwrap_or(DType::F16)),
            (GgmlType::BF16, _) => dense(self.cast.unwrap_or(DType::BF16)),
            (ty, _) if !ty.is_quantized() => Err(ModelError::UnsupportedType { name: name(), ty }),
            (ty, PackedPolicy::Fail) => Err(ModelError::Packed { name: name(), ty }),
            (_, PackedPolicy::Dequantize(dtype)) => dense(dtype),
            // The param is the blocks' bytes as stored.
            (ty, PackedPolicy::Keep) if dequant::supported(ty) => Ok(Declared {
                ty: TensorType::new([tensor.data.len()], DType::I8),
                packed: Some(ty),
                encoding: Encoding::Dense(DType::I8),
            }),
            (ty, PackedPolicy::Keep) => Err(ModelError::KeepUnsupported { name: name(), ty }),
        }
    }

    fn tensor(&self, name: &str) -> Result<GgufTensor<'_>> {
        self.gguf.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }
}

impl<D: AsRef<[u8]>> Checkpoint for GgufWeights<'_, D> {
    fn load<'t>(&self, tracer: &'t Tracer, name: &str, expected: &[usize]) -> Result<Weight<'t>> {
        let tensor = self.tensor(name)?;
        let shape = tensor.shape();
        if shape != expected {
            return Err(ModelError::TensorShape { name: name.to_string(), expected: expected.to_vec(), found: shape });
        }
        let Declared { ty, packed, .. } = self.declare(&tensor)?;
        let raw = tracer.param(name, ty)?;
        Ok(Weight { name: name.to_string(), raw, packed, shape, tiles: None })
    }

    fn contains(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    fn stored(&self, param: &str) -> Result<DerivedParam<'_>> {
        let tensor = self.tensor(param)?;
        let Declared { ty, encoding, .. } = self.declare(&tensor)?;
        Ok(DerivedParam { name: tensor.name, source: Source::Tensor(tensor.data), encoding, target: ty.dtype })
    }

    fn path(&self) -> &Path {
        self.gguf.path()
    }

    fn unused(&self, used: &BTreeSet<&str>, unread: &[String]) -> Option<String> {
        let known = |name: &str| used.contains(name) || unread.iter().any(|u| u == name);
        self.gguf.tensors().map(|t| t.name).find(|name| !known(name)).map(str::to_string)
    }
}

impl<D: AsRef<[u8]>> ParamSource for GgufWeights<'_, D> {
    fn param(&self, name: &str, ty: &TensorType) -> std::result::Result<Value, InterpError> {
        param_value(self, name, ty)
    }
}

/// A checkpoint tensor declared as a param: the raw value as declared, with
/// what it takes to read it as f32.
#[derive(Clone, Debug)]
pub struct Weight<'t> {
    /// The param's name, as in the source file.
    pub name: String,
    /// The param as declared: dense, or packed blocks as `[nbytes]` i8.
    pub raw: Tensor<'t>,
    /// The ggml type of `raw`'s blocks when the param is kept packed.
    pub packed: Option<GgmlType>,
    /// Row-major logical shape (`[out, in]` for a matrix).
    pub shape: Vec<usize>,
    /// A packed matrix's blocks tiled by rows (`[tiles, blocks, type_size,
    /// PACKED_LANES]`, what `packed_matvec` reads) where they are a slice of
    /// a larger tiling: a matrix of a stack ([`Weight::select`]) or a block
    /// of rows ([`Weight::row_blocks`]) of a param, whose tiling IREE then
    /// computes once at load. `None`: tile `raw` itself ([`Weight::tiles`]).
    pub tiles: Option<Tensor<'t>>,
}

impl<'t> Weight<'t> {
    /// The whole tensor as f32.
    pub fn f32(&self) -> Result<Tensor<'t>> {
        Ok(match self.packed {
            Some(ty) => dequant::dequantize(&self.raw, ty, &self.shape)?,
            None => to_f32(&self.raw)?,
        })
    }

    /// `x · Wᵀ` for this `[out, in]` matrix: `x [..., in]` -> `[..., out]`.
    ///
    /// A packed weight times one static row of `x` (decode) is a
    /// `packed_matvec`, which streams the blocks and decodes them inside
    /// the product: no f32 copy of the weight is written and no transpose
    /// made. More rows (prefill) or a dynamic `x` dequantize the matrix and
    /// run a matrix product, where the f32 values are shared by every row;
    /// the lowering dequantizes a large weight a block of rows at a time
    /// (`lower::dot_general::lower_chunked_weight_product`).
    pub fn linear(&self, x: &Tensor<'t>) -> Result<Tensor<'t>> {
        self.matrix()?;
        match streamed_type(&[self], x) {
            Some(ty) => Ok(packed_products(&[self], ty, x)?.remove(0)),
            None => Ok(x.linear(&self.f32()?)?),
        }
    }

    /// `[out, in]`, or an error naming the weight.
    fn matrix(&self) -> Result<[usize; 2]> {
        match self.shape[..] {
            [out, inp] => Ok([out, inp]),
            _ => {
                Err(ModelError::Config(format!("{}: linear() needs a matrix, found shape {:?}", self.name, self.shape)))
            }
        }
    }

    /// Rows `ids` (`[n]` integer, `n` may be `?`) of a matrix, as f32 `[n,
    /// cols]`: an embedding lookup. A packed table gathers the rows' bytes
    /// (a row is a whole number of blocks) and dequantizes only those.
    pub fn rows(&self, ids: &Tensor<'t>) -> Result<Tensor<'t>> {
        let [rows, cols] = self.shape[..] else {
            return Err(ModelError::Config(format!(
                "{}: rows() needs a matrix, found shape {:?}",
                self.name, self.shape
            )));
        };
        match self.packed {
            Some(ty) => {
                let row_bytes = self.raw.ty.shape[0] / rows;
                let picked = self.raw.reshape(&[rows, row_bytes])?.gather(ids)?;
                Ok(dequant::dequantize(&picked, ty, &[picked.ty.shape[0], cols])?)
            }
            None => Ok(to_f32(&self.raw.gather(ids)?)?),
        }
    }

    /// The `n` equal blocks of rows of this matrix, or of the `[n · rows,
    /// cols]` matrix a `[n, rows, cols]` stack is: each a slice of the one
    /// param (a packed block is whole rows of whole blocks, so its bytes are
    /// contiguous), which a product reads in place.
    pub fn row_blocks(&self, n: usize) -> Result<Vec<Weight<'t>>> {
        let (rows, cols) = match self.shape[..] {
            [rows, cols] => (rows, cols),
            [stack, rows, cols] => (stack * rows, cols),
            _ => (0, 0),
        };
        if n == 0 || rows == 0 || !rows.is_multiple_of(n) {
            return Err(ModelError::Config(format!(
                "{}: row_blocks({n}) needs a matrix or a stack of them with a multiple of {n} rows, found shape {:?}",
                self.name, self.shape
            )));
        }
        let block = rows / n;
        let part = |i: usize| -> Result<Tensor<'t>> {
            Ok(match self.packed {
                Some(_) => {
                    let len = self.raw.ty.shape[0] / n;
                    self.raw.slice(&[i * len], &[(i + 1) * len], &[1])?
                }
                None => self.raw.reshape(&[rows, cols])?.slice(&[i * block, 0], &[(i + 1) * block, cols], &[1, 1])?,
            })
        };
        // Blocks of whole tiles are slices of the whole matrix's tiling.
        let whole = match self.packed {
            Some(_) if block.is_multiple_of(PACKED_LANES) && self.streams(cols) => Some(self.tiles_of(rows, cols)?),
            _ => None,
        };
        (0..n)
            .map(|i| {
                let name = format!("{}[{i}]", self.name);
                let tiles = match &whole {
                    Some(t) => {
                        let (per, mut limit) = (block / PACKED_LANES, t.ty.shape.clone());
                        limit[0] = (i + 1) * per;
                        Some(t.slice(&[i * per, 0, 0, 0], &limit, &[1; 4])?)
                    }
                    None => None,
                };
                Ok(Weight { name, raw: part(i)?, packed: self.packed, shape: vec![block, cols], tiles })
            })
            .collect()
    }

    /// Matrix `index` (a scalar integer known at run time) of this `[n,
    /// rows, cols]` stack, as a `[rows, cols]` weight: a dynamic slice of
    /// the one param, so a product over it reads that matrix's bytes only
    /// (a packed stack's matrices are contiguous runs of whole blocks, as
    /// in GGUF's `ffn_*_exps`).
    pub fn select(&self, index: &Tensor<'t>) -> Result<Weight<'t>> {
        let [n, rows, cols] = self.shape[..] else {
            return Err(ModelError::Config(format!(
                "{}: select() needs a stack of matrices, found shape {:?}",
                self.name, self.shape
            )));
        };
        let zero = index.tracer().constant(0.0, index.ty.clone())?;
        let (raw, tiles) = match self.packed {
            Some(_) => {
                let len = self.raw.ty.shape[0] / n;
                let raw = self.raw.reshape(&[n, len])?.dynamic_slice(&[index, &zero], &[1, len])?.reshape(&[len])?;
                // Matrices of whole tiles: that matrix's tiles of the stack's.
                let tiles = match rows.is_multiple_of(PACKED_LANES) && self.streams(cols) {
                    true => {
                        let whole = self.tiles_of(n * rows, cols)?;
                        let per = index.tracer().constant((rows / PACKED_LANES) as f64, index.ty.clone())?;
                        let mut sizes = whole.ty.shape.clone();
                        sizes[0] = rows / PACKED_LANES;
                        Some(whole.dynamic_slice(&[&index.multiply(&per)?, &zero, &zero, &zero], &sizes)?)
                    }
                    false => None,
                };
                (raw, tiles)
            }
            None => (self.raw.dynamic_slice(&[index, &zero, &zero], &[1, rows, cols])?.reshape(&[rows, cols])?, None),
        };
        Ok(Weight { name: format!("{}[?]", self.name), raw, packed: self.packed, shape: vec![rows, cols], tiles })
    }

    /// This packed matrix's blocks tiled by rows, as `packed_matvec` reads
    /// them: [`Weight::tiles`] where set, else a tiling of `raw`.
    fn tiled(&self) -> Result<Tensor<'t>> {
        match &self.tiles {
            Some(tiles) => Ok(tiles.clone()),
            None => {
                let [rows, cols] = self.matrix()?;
                self.tiles_of(rows, cols)
            }
        }
    }

    /// Whether rows of `cols` values of this packed weight can be a
    /// `packed_matvec`'s (two blocks or more, [`streamed_together`]).
    fn streams(&self, cols: usize) -> bool {
        self.packed.is_some_and(|ty| cols / ty.block_size() >= 2)
    }

    /// `raw`, packed blocks of `rows` rows of `cols` values, tiled by rows.
    fn tiles_of(&self, rows: usize, cols: usize) -> Result<Tensor<'t>> {
        let ty = self.packed.ok_or_else(|| ModelError::Config(format!("{}: not packed", self.name)))?;
        let blocks = [rows, cols / ty.block_size(), ty.type_size()];
        Ok(self.raw.reshape(&blocks)?.tile_rows(PACKED_LANES, &packed_byte_order(ty))?)
    }
}

/// The most rows of `x` that one `packed_matvec` takes: a block is decoded
/// once for all of them, each then costing its multiply-adds (one Q4_K
/// 8192 x 2048 gate and up product: 4.6 ms for one row, 12 ms for 4, 21 ms
/// for 8). More rows are a `dot_general` on the dequantized weights.
pub const STREAMED_ROWS: usize = 8;

/// Whether [`linear_each`] makes one `packed_matvec` of `weights` times `x`:
/// packed matrices of one type and shape, rows of two blocks or more, times
/// at most [`STREAMED_ROWS`] static f32 rows (a row of one block, a few
/// dozen values, is dequantized: `packed_matvec` takes two blocks or more).
pub fn streamed_together(weights: &[&Weight<'_>], x: &Tensor<'_>) -> bool {
    streamed_type(weights, x).is_some()
}

/// The ggml type of `weights` where they are [`streamed_together`].
fn streamed_type(weights: &[&Weight<'_>], x: &Tensor<'_>) -> Option<GgmlType> {
    let first = weights.first()?;
    let rank = x.ty.rank();
    let few_rows = !x.ty.is_dynamic()
        && x.ty.dtype == DType::F32
        && rank >= 1
        && matches!(first.shape[..], [_, inp] if x.ty.shape[rank - 1] == inp && x.ty.num_elements() <= STREAMED_ROWS * inp);
    let same = weights.iter().all(|w| w.packed == first.packed && w.shape == first.shape);
    let streams = first.shape.last().is_some_and(|&inp| first.streams(inp));
    first.packed.filter(|_| few_rows && same && streams)
}

/// `x · Wᵀ` for each `[out, in]` matrix of `weights`, all taking `x [...,
/// in]` ([`Weight::linear`] each, in turn). Matrices [`streamed_together`]
/// are one `packed_matvec`, which streams their blocks side by side:
/// SmolLM2's gate and up products take 86 µs together, 2 × 60 µs apart.
pub fn linear_each<'t>(weights: &[&Weight<'t>], x: &Tensor<'t>) -> Result<Vec<Tensor<'t>>> {
    match streamed_type(weights, x) {
        Some(ty) => packed_products(weights, ty, x),
        None => weights.iter().map(|w| w.linear(x)).collect(),
    }
}

/// The one `packed_matvec` of `weights`, packed as `ty` and
/// [`streamed_together`] with `x`, split into a product per matrix.
fn packed_products<'t>(weights: &[&Weight<'t>], ty: GgmlType, x: &Tensor<'t>) -> Result<Vec<Tensor<'t>>> {
    let [out, inp] = weights[0].matrix()?;
    let tiles = weights.iter().map(|w| w.tiled()).collect::<Result<Vec<_>>>()?;
    let rows = x.ty.num_elements() / inp;
    let y = dequant::packed_matvec(&tiles.iter().collect::<Vec<_>>(), ty, &x.reshape(&[rows, inp])?)?;
    let shape = [&x.ty.shape[..x.ty.rank() - 1], &[out][..]].concat();
    // Rows past `out` fill the last tile.
    match (weights.len(), y.ty.shape[1] == out) {
        (1, true) => Ok(vec![y.reshape(&shape)?]),
        (n, _) => {
            (0..n).map(|i| Ok(y.slice(&[i * rows, 0], &[(i + 1) * rows, out], &[1, 1])?.reshape(&shape)?)).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{self, CheckOptions};
    use crate::graph::{Graph, Op};
    use crate::interp;
    use crate::iree::Iree;
    use crate::weights::safetensors::SafeTensors;

    /// (type, in): SmolLM2's 18-block Q4_1 rows (tiles of 4 blocks plus a
    /// 2-block tail), an even Q8_0 row, Q5_0, and the K-quants of Gemma 3.
    const CASES: [(GgmlType, usize); 5] = [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q8_0, 640),
        (GgmlType::Q5_0, 96),
        (GgmlType::Q4_K, 512),
        (GgmlType::Q6_K, 512),
    ];
    const OUT: usize = 24;

    /// `W · x` for each case from a packed param, through `linear` (fused or
    /// not, by the rows of `x`) or through the dense `f32()` copy.
    fn linear_graph(rows: usize, fused: bool) -> Graph {
        let t = Tracer::new("main");
        let mut outs = Vec::new();
        for (i, &(ty, k)) in CASES.iter().enumerate() {
            let x = t.input(&format!("x{i}"), TensorType::new([rows, k], DType::F32)).unwrap();
            let bytes = ty.byte_len((OUT * k) as u64).unwrap() as usize;
            let raw = t.param(&format!("w{i}"), TensorType::new([bytes], DType::I8)).unwrap();
            let w = Weight { name: format!("w{i}"), raw, packed: Some(ty), shape: vec![OUT, k], tiles: None };
            outs.push(if fused { w.linear(&x).unwrap() } else { x.linear(&w.f32().unwrap()).unwrap() });
        }
        t.finish(&outs.iter().collect::<Vec<_>>()).unwrap()
    }

    fn dot_generals(g: &Graph) -> usize {
        g.nodes().iter().filter(|n| matches!(n.op, Op::DotGeneral(_))).count()
    }

    #[test]
    fn few_rows_linear_streams_the_blocks_and_agrees_with_dequantize_then_dot() {
        let count = |g: &Graph, f: fn(&Op) -> bool| g.nodes().iter().filter(|n| f(&n.op)).count();
        for rows in [1, STREAMED_ROWS] {
            let fused = linear_graph(rows, true);
            assert_eq!(count(&fused, |op| matches!(op, Op::PackedMatvec { .. })), CASES.len(), "{rows} rows");
            assert_eq!(count(&fused, |op| matches!(op, Op::Dequantize { .. } | Op::DotGeneral(_))), 0);
        }
        let more = linear_graph(STREAMED_ROWS + 1, true);
        assert_eq!(dot_generals(&more), CASES.len(), "more rows: dequantize, then dot_general");

        let dir = tempfile::tempdir().unwrap();
        let fused = linear_graph(1, true);
        let params_path = dir.path().join("params.safetensors");
        check::write_random_params(&fused, &params_path, 7).unwrap();
        let params = SafeTensors::open(&params_path).unwrap();
        for rows in [1, 3] {
            let fused = linear_graph(rows, true);
            let inputs = check::random_inputs(&fused, 7, 0);
            let got = interp::run(&fused, &inputs, &params).unwrap();
            let want = interp::run(&linear_graph(rows, false), &inputs, &params).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.ty, w.ty);
                let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
                let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                let diff = g.iter().zip(&w).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
                assert!(diff <= 1e-5 * scale.max(1.0), "{:?}, {rows} rows: {diff} (scale {scale})", CASES[i]);
            }
        }

        let options = CheckOptions { rtol: 1e-4, atol: 1e-4, ..CheckOptions::default() };
        let report = check::check_graph(&fused, &Iree::for_tests(), dir.path(), &options).unwrap();
        assert!(report.ok(), "{report:?}");
    }
}
