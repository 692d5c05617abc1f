//! A streaming GGUF v3 writer, the counterpart of [`super::gguf`]: metadata
//! and tensor infos are collected and checked first (so a bad shape or key
//! fails before any byte is written), then the file is written header first
//! and each tensor's bytes are streamed in order, through a 1 MiB buffer.
//! Memory stays flat however large the tensors: nothing tensor-sized is ever
//! held, which is what lets kiln make multi-billion-parameter test
//! checkpoints (see [`crate::models::synth`]).
//!
//! Layout as ggml's `gguf.cpp` and gguf-py's `GGUFWriter` write it: header
//! `{"GGUF", 3, n_tensors, n_kv}`, the key/values, the tensor infos (dims
//! fastest-first, offsets relative to the data section), zero padding to
//! `general.alignment` (32 unless set), then every tensor at an aligned
//! offset, the file itself padded to the alignment at the end.
//!
//! All-zero tensors ([`TensorData::Zeros`]) are not written but seeked over,
//! so on filesystems with holes the file is sparse: a checkpoint whose
//! apparent size is gigabytes takes a few kilobytes of disk. The file
//! appears at its path complete and synced, or not at all ([`crate::AtomicFile`]).

use super::ggml::GgmlType;
use super::gguf::{Metadata, MetadataValue, ValueType, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
use super::WeightsError;
use crate::AtomicFile;
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// `GGML_MAX_NAME`: llama.cpp refuses tensor names of this many bytes or more.
pub const MAX_NAME: usize = 64;
/// Write buffer: the writer's memory stays at about this, whatever the tensor sizes.
const BUFFER_CAPACITY: usize = 1 << 20;
/// Bytes of seeded data generated at a time.
const SEEDED_CHUNK: usize = 1 << 20;

/// A metadata value to write: strings and arrays owned (the reader's
/// [`MetadataValue`] borrows the file; `Value::from` copies one, to carry
/// metadata over to a new file).
pub type Value = Metadata<String, Array>;

/// An array to write: elements all of type `elem`; nested arrays have
/// element type [`ValueType::Array`] and may differ in their own element
/// types, as GGUF allows. The type is explicit so an empty array has one.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    /// The type of every element.
    pub elem: ValueType,
    /// The elements.
    pub items: Vec<Value>,
}

impl Value {
    /// An ARRAY of `elem` elements.
    pub fn array(elem: ValueType, items: Vec<Value>) -> Value {
        Metadata::Array(Array { elem, items })
    }

    /// An ARRAY of STRING (a tokenizer vocabulary).
    pub fn strings<S: Into<String>>(items: impl IntoIterator<Item = S>) -> Value {
        Value::array(ValueType::String, items.into_iter().map(|s| Value::String(s.into())).collect())
    }

    /// An ARRAY of INT32 (token types).
    pub fn i32s(items: impl IntoIterator<Item = i32>) -> Value {
        Value::array(ValueType::I32, items.into_iter().map(Value::I32).collect())
    }

    /// An ARRAY of FLOAT32 (token scores).
    pub fn f32s(items: impl IntoIterator<Item = f32>) -> Value {
        Value::array(ValueType::F32, items.into_iter().map(Value::F32).collect())
    }

    /// Array elements must have the array's type, and arrays nest at most
    /// as deep as the reader accepts. `level` is this value's array nesting
    /// (1 for a top-level array), so the recursion is bounded however deep
    /// a caller nested its values.
    fn check(&self, level: usize) -> Result<(), String> {
        let Value::Array(Array { elem, items }) = self else { return Ok(()) };
        if level > MAX_ARRAY_DEPTH {
            return Err(format!("arrays nest more than {MAX_ARRAY_DEPTH} deep"));
        }
        for (i, item) in items.iter().enumerate() {
            if item.value_type() != *elem {
                return Err(format!("element [{i}] is {}, but the array holds {elem}", item.value_type()));
            }
            item.check(level + 1).map_err(|e| format!("element [{i}]: {e}"))?;
        }
        Ok(())
    }

    /// The value's bytes, without its type id (which an array's elements
    /// do not repeat).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::U8(v) => out.extend(v.to_le_bytes()),
            Value::I8(v) => out.extend(v.to_le_bytes()),
            Value::U16(v) => out.extend(v.to_le_bytes()),
            Value::I16(v) => out.extend(v.to_le_bytes()),
            Value::U32(v) => out.extend(v.to_le_bytes()),
            Value::I32(v) => out.extend(v.to_le_bytes()),
            Value::U64(v) => out.extend(v.to_le_bytes()),
            Value::I64(v) => out.extend(v.to_le_bytes()),
            Value::F32(v) => out.extend(v.to_le_bytes()),
            Value::F64(v) => out.extend(v.to_le_bytes()),
            Value::Bool(v) => out.push(u8::from(*v)),
            Value::String(s) => put_str(out, s),
            Value::Array(Array { elem, items }) => {
                out.extend(elem.id().to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|item| item.encode(out));
            }
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

macro_rules! value_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$v(v)
            }
        }
    )*};
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64, i64 => I64,
            f32 => F32, f64 => F64, bool => Bool, String => String);

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::String(v.to_string())
    }
}

impl From<MetadataValue<'_>> for Value {
    fn from(v: MetadataValue<'_>) -> Value {
        match v {
            Metadata::U8(v) => Value::U8(v),
            Metadata::I8(v) => Value::I8(v),
            Metadata::U16(v) => Value::U16(v),
            Metadata::I16(v) => Value::I16(v),
            Metadata::U32(v) => Value::U32(v),
            Metadata::I32(v) => Value::I32(v),
            Metadata::U64(v) => Value::U64(v),
            Metadata::I64(v) => Value::I64(v),
            Metadata::F32(v) => Value::F32(v),
            Metadata::F64(v) => Value::F64(v),
            Metadata::Bool(v) => Value::Bool(v),
            Metadata::String(s) => Value::String(s.to_string()),
            // The reader bounded the nesting, so this recursion is bounded.
            Metadata::Array(a) => Value::array(a.elem_type(), a.iter().map(Value::from).collect()),
        }
    }
}

/// A tensor declared for writing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name; at most [`MAX_NAME`] bytes.
    pub name: String,
    /// Row-major, slowest-varying first (the file stores it reversed).
    pub shape: Vec<usize>,
    /// How its elements are stored.
    pub ggml_type: GgmlType,
    /// Bytes of data: whole blocks of `ggml_type`.
    pub byte_len: u64,
}

impl TensorSpec {
    /// Number of elements: the product of `shape`.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

/// Where everything goes; offsets are from the start of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Where the data section starts (the end of the header, aligned).
    pub data_offset: u64,
    /// Each tensor's start, in declaration order.
    pub tensor_offsets: Vec<u64>,
    /// The whole file, padded to the alignment.
    pub file_size: u64,
}

/// What [`GgufWriter::write_data`] writes for one tensor.
#[derive(Clone, Copy, Debug)]
pub enum TensorData<'a> {
    /// All zero bytes: not written but skipped, leaving a hole, so the file
    /// is sparse where the filesystem supports it.
    Zeros,
    /// Exactly the tensor's bytes.
    Bytes(&'a [u8]),
    /// Deterministic pseudo-random bytes from the seed that are valid
    /// blocks of the tensor's type: random quants, scale fields (`d`,
    /// `dmin`, ...) small positive finite numbers, float elements in
    /// [-1, 1), so every value dequantizes to a finite number. Generated in
    /// bounded chunks.
    Seeded(u64),
}

/// What a write produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteSummary {
    /// The file's apparent size.
    pub file_size: u64,
    /// How many tensors it holds.
    pub tensors: usize,
    /// Elements of all tensors.
    pub elements: u64,
}

/// Collects metadata and tensor infos for a GGUF v3 file at `path`, then
/// writes it with [`GgufWriter::write`] or [`GgufWriter::write_data`].
#[derive(Clone, Debug)]
pub struct GgufWriter {
    path: PathBuf,
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<TensorSpec>,
    names: HashSet<String>,
    alignment: u64,
}

impl GgufWriter {
    /// Nothing is created until the file is written.
    pub fn new(path: impl Into<PathBuf>) -> GgufWriter {
        GgufWriter {
            path: path.into(),
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            alignment: DEFAULT_ALIGNMENT,
        }
    }

    /// The file the writer writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Adds a key/value; keys are written in the order they are added.
    /// `general.alignment` must be an unsigned integer power of two, and
    /// sets the alignment of the data section and of every tensor.
    pub fn add(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut Self, WeightsError> {
        let value = value.into();
        let bad = |message: String| WeightsError::Format { path: self.path.clone(), message };
        if self.keys.contains(key) {
            return Err(bad(format!("metadata \"{key}\": the key is already set")));
        }
        value.check(1).map_err(|e| bad(format!("metadata \"{key}\": {e}")))?;
        if key == ALIGNMENT_KEY {
            let a = match value {
                Value::U8(a) => Some(u64::from(a)),
                Value::U16(a) => Some(u64::from(a)),
                Value::U32(a) => Some(u64::from(a)),
                Value::U64(a) => Some(a),
                _ => None,
            };
            self.alignment = a.filter(|a| a.is_power_of_two()).ok_or_else(|| {
                bad(format!("{ALIGNMENT_KEY} is {value:?}, expected an unsigned integer power of two"))
            })?;
        }
        self.keys.insert(key.to_string());
        self.metadata.push((key.to_string(), value));
        Ok(self)
    }

    /// Declares a tensor of row-major `shape`; tensors are written in the
    /// order they are declared. The rules are the reader's (and ggml's): at
    /// most 4 dims, rows of whole blocks, sizes that fit, unique names
    /// shorter than [`MAX_NAME`] bytes.
    pub fn add_tensor(&mut self, name: &str, shape: &[usize], ggml_type: GgmlType) -> Result<&mut Self, WeightsError> {
        let bad = |message: String| WeightsError::Tensor { path: self.path.clone(), tensor: name.to_string(), message };
        if self.names.contains(name) {
            return Err(bad("the tensor name is already declared".into()));
        }
        if name.len() >= MAX_NAME {
            return Err(bad(format!("the name is {} bytes; ggml allows at most {}", name.len(), MAX_NAME - 1)));
        }
        if shape.len() > MAX_DIMS {
            return Err(bad(format!("shape {shape:?} has {} dims; ggml allows at most {MAX_DIMS}", shape.len())));
        }
        // ggml counts elements in int64_t.
        if let Some(d) = shape.iter().find(|&&d| i64::try_from(d).is_err()) {
            return Err(bad(format!("dim {d} of shape {shape:?} is out of range")));
        }
        let block = ggml_type.block_size();
        let row = shape.last().copied().unwrap_or(1);
        if !row.is_multiple_of(block) {
            return Err(bad(format!(
                "row length {row} (shape {shape:?}) is not a whole number of {ggml_type} blocks of {block}"
            )));
        }
        let n_elements = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .ok_or_else(|| bad(format!("the element count of shape {shape:?} overflows u64")))?;
        let byte_len = ggml_type
            .byte_len(n_elements)
            .filter(|&b| i64::try_from(b).is_ok())
            .ok_or_else(|| bad(format!("the byte size of {n_elements} {ggml_type} elements overflows")))?;
        self.names.insert(name.to_string());
        self.tensors.push(TensorSpec { name: name.to_string(), shape: shape.to_vec(), ggml_type, byte_len });
        Ok(self)
    }

    /// The declared tensors, in file order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// The alignment of the data section and of each tensor (32 unless set).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Elements of all declared tensors (the parameter count of a model).
    pub fn elements(&self) -> u64 {
        self.tensors.iter().map(TensorSpec::n_elements).sum()
    }

    /// The whole file in memory when it holds metadata only (a converted
    /// tokenizer); `None` once a tensor is declared.
    pub fn metadata_only_bytes(&self) -> Option<Vec<u8>> {
        match self.tensors.is_empty() {
            true => self.encode_head().ok().map(|(head, _)| head),
            false => None,
        }
    }

    /// The header: magic, counts, key/values, tensor infos, unpadded; and
    /// each tensor's offset in the data section.
    fn encode_head(&self) -> Result<(Vec<u8>, Vec<u64>), WeightsError> {
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend(value.value_type().id().to_le_bytes());
            value.encode(&mut out);
        }
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut data_len = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend((t.shape.len() as u32).to_le_bytes());
            // Fastest-varying first.
            t.shape.iter().rev().for_each(|&d| out.extend((d as u64).to_le_bytes()));
            out.extend(t.ggml_type.id().to_le_bytes());
            out.extend(data_len.to_le_bytes());
            offsets.push(data_len);
            data_len = data_len
                .checked_add(t.byte_len)
                .and_then(|end| end.checked_next_multiple_of(self.alignment))
                .ok_or_else(|| WeightsError::Tensor {
                    path: self.path.clone(),
                    tensor: t.name.clone(),
                    message: "the data section's size overflows u64".into(),
                })?;
        }
        Ok((out, offsets))
    }

    /// Where the data section and each tensor start, and the file's size.
    pub fn layout(&self) -> Result<Layout, WeightsError> {
        let (head, offsets) = self.encode_head()?;
        self.layout_of(&head, &offsets)
    }

    fn layout_of(&self, head: &[u8], offsets: &[u64]) -> Result<Layout, WeightsError> {
        let overflow = || WeightsError::Format { path: self.path.clone(), message: "the file size overflows".into() };
        let data_offset = (head.len() as u64).checked_next_multiple_of(self.alignment).ok_or_else(overflow)?;
        let tensor_offsets =
            offsets.iter().map(|&o| data_offset.checked_add(o).ok_or_else(overflow)).collect::<Result<Vec<_>, _>>()?;
        let end = match (self.tensors.last(), tensor_offsets.last()) {
            (Some(t), Some(&start)) => start.checked_add(t.byte_len).ok_or_else(overflow)?,
            _ => data_offset,
        };
        let file_size = end.checked_next_multiple_of(self.alignment).ok_or_else(overflow)?;
        Ok(Layout { data_offset, tensor_offsets, file_size })
    }

    /// Writes the file, streaming tensor `i`'s bytes from `fill(i, writer)`,
    /// which must write exactly the tensor's `byte_len`.
    pub fn write(
        self,
        mut fill: impl FnMut(usize, &mut dyn Write) -> io::Result<()>,
    ) -> Result<WriteSummary, WeightsError> {
        self.write_with(|i, _, sink| fill(i, sink))
    }

    /// Writes the file with tensor `i`'s bytes as `data(i)` says.
    pub fn write_data<'a>(self, mut data: impl FnMut(usize) -> TensorData<'a>) -> Result<WriteSummary, WeightsError> {
        self.write_with(|i, spec, sink| match data(i) {
            TensorData::Zeros => sink.skip(spec.byte_len),
            TensorData::Bytes(bytes) => {
                if bytes.len() as u64 != spec.byte_len {
                    // Caught before writing, so the message can be exact.
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{} bytes given for a tensor of {} bytes", bytes.len(), spec.byte_len),
                    ));
                }
                sink.write_all(bytes)
            }
            TensorData::Seeded(seed) => seeded::write(spec.ggml_type, spec.byte_len, seed, sink),
        })
    }

    fn write_with(
        self,
        mut produce: impl FnMut(usize, &TensorSpec, &mut TensorSink<'_, '_>) -> io::Result<()>,
    ) -> Result<WriteSummary, WeightsError> {
        let (head, offsets) = self.encode_head()?;
        let layout = self.layout_of(&head, &offsets)?;
        let path = &self.path;
        let io_err = |error| WeightsError::Io { path: path.clone(), error };
        // Dropping `file` on any early return deletes the temporary file.
        let mut file = AtomicFile::create(path).map_err(io_err)?;
        let mut out = BufWriter::with_capacity(BUFFER_CAPACITY, file.file());
        out.write_all(&head).map_err(io_err)?;
        let mut pos = head.len() as u64;
        for (i, (spec, &start)) in self.tensors.iter().zip(&layout.tensor_offsets).enumerate() {
            write_zeros(&mut out, start - pos).map_err(io_err)?;
            let mut sink = TensorSink { out: &mut out, written: 0, limit: spec.byte_len, overflow: false };
            let produced = produce(i, spec, &mut sink);
            let (written, overflow) = (sink.written, sink.overflow);
            let bad = |message: String| WeightsError::Tensor { path: path.clone(), tensor: spec.name.clone(), message };
            let shape = format!("{} {:?}", spec.ggml_type, spec.shape);
            if overflow {
                return Err(bad(format!("the data has more than the {} bytes of {shape}", spec.byte_len)));
            }
            produced.map_err(|e| bad(format!("writing its data: {e}")))?;
            if written != spec.byte_len {
                return Err(bad(format!("the data has {written} bytes, but {shape} takes {}", spec.byte_len)));
            }
            pos = start + spec.byte_len;
        }
        out.flush().map_err(io_err)?;
        drop(out);
        // Also extends the file over skipped zeros at the end and the final padding.
        file.file().set_len(layout.file_size).map_err(io_err)?;
        file.commit().map_err(io_err)?;
        Ok(WriteSummary { file_size: layout.file_size, tensors: self.tensors.len(), elements: self.elements() })
    }
}

fn write_zeros(out: &mut impl Write, n: u64) -> io::Result<()> {
    io::copy(&mut io::repeat(0).take(n), out).map(drop)
}

/// Where one tensor's bytes go: counts them, refuses bytes past the
/// tensor's length, and skips zeros by seeking.
struct TensorSink<'w, 'f> {
    out: &'w mut BufWriter<&'f mut File>,
    written: u64,
    limit: u64,
    overflow: bool,
}

impl TensorSink<'_, '_> {
    fn claim(&mut self, n: u64) -> io::Result<()> {
        let end = self.written.saturating_add(n);
        if end > self.limit {
            // Report the attempted total: the data had at least this much.
            (self.written, self.overflow) = (end, true);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "more bytes than the tensor's length"));
        }
        Ok(())
    }

    /// `n` zero bytes without writing them: the new file reads as zeros
    /// wherever nothing was written.
    fn skip(&mut self, n: u64) -> io::Result<()> {
        self.claim(n)?;
        let by = i64::try_from(n).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "skip too large"))?;
        self.out.seek(SeekFrom::Current(by))?;
        self.written += n;
        Ok(())
    }
}

impl Write for TensorSink<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.claim(buf.len() as u64)?;
        let n = self.out.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Seeded data: valid blocks of every ggml type from a small PRNG, block by
/// block, so the bytes depend only on the seed and the type, never on how
/// they are chunked.
mod seeded {
    use super::{GgmlType, SEEDED_CHUNK};
    use half::{bf16, f16};
    use std::io::{self, Write};

    /// SplitMix64 (Steele et al., "Fast splittable pseudorandom number
    /// generators", 2014): one add and a few mixes per 8 bytes.
    pub(super) struct SplitMix64(u64);

    impl SplitMix64 {
        pub(super) fn new(seed: u64) -> SplitMix64 {
            SplitMix64(seed)
        }

        pub(super) fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn fill(&mut self, buf: &mut [u8]) {
            let mut chunks = buf.chunks_exact_mut(8);
            for c in &mut chunks {
                c.copy_from_slice(&self.next().to_le_bytes());
            }
            let rest = chunks.into_remainder();
            let n = rest.len();
            rest.copy_from_slice(&self.next().to_le_bytes()[..n]);
        }

        /// Uniform in [-1, 1), 24 bits.
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }

        /// A block scale: positive, in [2^-12, 2^-11), so that the largest
        /// dequantized value of any type (Q8_K: d·127; Q4_K: d·63·15 +
        /// dmin·63) stays well inside f16's and f32's range.
        fn scale(&mut self) -> f32 {
            (1.0 + (self.next() >> 40) as f32 / (1u64 << 24) as f32) / 4096.0
        }
    }

    /// Byte offsets of a block's `ggml_half` scale fields (`d`, `dmin`, `m`,
    /// `s`), as laid out in ggml's `block_*` structs. Everything else in a
    /// block is quants or packed sub-scales, valid whatever their bits.
    fn f16_fields(ty: GgmlType) -> &'static [usize] {
        use GgmlType as T;
        match ty {
            // { d; qs } and { d; qh; qs }
            T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL => &[0],
            // The i-quants: { d; qs; ... }
            T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S | T::IQ1_S => &[0],
            // { qs[48]; qh[4]; d } and { qs[64]; d }
            T::TQ1_0 => &[52],
            T::TQ2_0 => &[64],
            // { d; m; ... }, { d; s; qs }, { d; dmin; scales; ... }
            T::Q4_1 | T::Q5_1 | T::Q8_1 | T::Q4_K | T::Q5_K => &[0, 2],
            // { d; scales_h; scales_l; qs }
            T::IQ4_XS => &[0],
            // { scales[16]; qs[64]; d; dmin }
            T::Q2_K => &[80, 82],
            // { hmask[32]; qs[64]; scales[12]; d }
            T::Q3_K => &[108],
            // { ql[128]; qh[64]; scales[16]; d }
            T::Q6_K => &[208],
            // Q8_K's d is a float, IQ1_M's is spread over nibbles, MXFP4's
            // scale is an exponent byte (see `block`); the plain types are
            // handled per element.
            T::Q8_K | T::IQ1_M | T::MXFP4 | T::F32 | T::F16 | T::BF16 | T::F64 | T::I8 | T::I16 | T::I32 | T::I64 => {
                &[]
            }
        }
    }

    /// Fills `block`, one block (or one element of a plain type).
    fn block(ty: GgmlType, rng: &mut SplitMix64, block: &mut [u8]) {
        use GgmlType as T;
        match ty {
            T::F32 => block.copy_from_slice(&rng.unit().to_le_bytes()),
            T::F64 => block.copy_from_slice(&f64::from(rng.unit()).to_le_bytes()),
            T::F16 => block.copy_from_slice(&f16::from_f32(rng.unit()).to_le_bytes()),
            T::BF16 => block.copy_from_slice(&bf16::from_f32(rng.unit()).to_le_bytes()),
            T::I8 | T::I16 | T::I32 | T::I64 => rng.fill(block),
            T::Q8_K => {
                rng.fill(block);
                block[..4].copy_from_slice(&rng.scale().to_le_bytes());
            }
            T::IQ1_M => {
                // { qs[32]; qh[16]; scales[8] }: the f16 d's four nibbles are
                // the top nibbles of the four u16 scales, lowest first.
                rng.fill(block);
                let d = f16::from_f32(rng.scale()).to_bits();
                for k in 0..4 {
                    let top = &mut block[48 + 2 * k + 1];
                    *top = (*top & 0x0F) | (((d >> (4 * k)) & 0x0F) as u8) << 4;
                }
            }
            T::MXFP4 => {
                // { e; qs[16] }: the (halved) scale 2^(e - 128) is 2^-12,
                // 2^-11 or 2^-10, the size of `scale`.
                rng.fill(block);
                block[0] = 116 + (rng.next() % 3) as u8;
            }
            T::Q4_0
            | T::Q4_1
            | T::Q5_0
            | T::Q5_1
            | T::Q8_0
            | T::Q8_1
            | T::Q2_K
            | T::Q3_K
            | T::Q4_K
            | T::Q5_K
            | T::Q6_K
            | T::IQ4_NL
            | T::IQ4_XS
            | T::IQ2_XXS
            | T::IQ2_XS
            | T::IQ2_S
            | T::IQ3_XXS
            | T::IQ3_S
            | T::IQ1_S
            | T::TQ1_0
            | T::TQ2_0 => {
                rng.fill(block);
                for &at in f16_fields(ty) {
                    block[at..at + 2].copy_from_slice(&f16::from_f32(rng.scale()).to_le_bytes());
                }
            }
        }
    }

    /// Streams `byte_len` bytes (whole blocks of `ty`) in chunks of about
    /// [`SEEDED_CHUNK`] bytes.
    pub(super) fn write(ty: GgmlType, byte_len: u64, seed: u64, out: &mut dyn Write) -> io::Result<()> {
        let type_size = ty.type_size();
        let per_chunk = (SEEDED_CHUNK / type_size).max(1);
        let mut rng = SplitMix64::new(seed);
        let mut buf = vec![0u8; per_chunk * type_size];
        let mut left = byte_len / type_size as u64;
        while left > 0 {
            let n = per_chunk.min(usize::try_from(left).unwrap_or(usize::MAX));
            let chunk = &mut buf[..n * type_size];
            chunk.chunks_exact_mut(type_size).for_each(|b| block(ty, &mut rng, b));
            out.write_all(chunk)?;
            left -= n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::gguf::Gguf;
    use crate::weights::quant;
    use std::process::Command;

    const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");

    /// Every metadata type, including nested arrays and an empty one.
    fn all_metadata() -> Vec<(&'static str, Value)> {
        vec![
            ("general.architecture", Value::from("llama")),
            ("test.u8", Value::U8(200)),
            ("test.i8", Value::I8(-7)),
            ("test.u16", Value::U16(65535)),
            ("test.i16", Value::I16(-32768)),
            ("test.u32", Value::U32(4096)),
            ("test.i32", Value::I32(-123456)),
            ("test.u64", Value::U64((1 << 63) + 5)),
            ("test.i64", Value::I64(-(1 << 40))),
            ("test.f32", Value::F32(1e-5)),
            ("test.f64", Value::F64(0.1)),
            ("test.bool", Value::Bool(true)),
            ("general.name", Value::from("tiny \u{2713}")),
            ("tokenizer.ggml.tokens", Value::strings(["<unk>", "<s>", "\u{2581}the", "é"])),
            ("tokenizer.ggml.scores", Value::f32s([0.0, -1.5, 0.25])),
            ("tokenizer.ggml.token_type", Value::i32s([2, 3, 1, 1])),
            ("test.empty", Value::array(ValueType::U64, vec![])),
            (
                "test.nested",
                Value::array(ValueType::Array, vec![Value::i32s([1, 2]), Value::strings(["a"]), Value::f32s([])]),
            ),
        ]
    }

    /// Distinct bytes per tensor, so a misplaced tensor shows.
    fn pattern(i: usize, len: u64) -> Vec<u8> {
        (0..len).map(|k| (k as usize * 7 + i * 31) as u8).collect()
    }

    fn sample_tensors() -> Vec<(&'static str, Vec<usize>, GgmlType)> {
        vec![
            ("token_embd.weight", vec![6, 8], GgmlType::F32),
            ("output_norm.weight", vec![8], GgmlType::F16),
            ("blk.0.attn_q.weight", vec![3, 64], GgmlType::Q4_0),
            ("blk.0.ffn_down.weight", vec![2, 256], GgmlType::Q4_K),
            ("blk.0.ffn_up.weight", vec![1, 1, 256], GgmlType::Q6_K),
            ("rope_freqs", vec![5], GgmlType::I32),
            ("scalar", vec![], GgmlType::F32),
            ("empty", vec![0, 4], GgmlType::F32),
        ]
    }

    fn sample_writer(path: &Path, alignment: Option<u32>) -> GgufWriter {
        let mut w = GgufWriter::new(path);
        if let Some(a) = alignment {
            w.add("general.alignment", a).unwrap();
        }
        for (k, v) in all_metadata() {
            w.add(k, v).unwrap();
        }
        for (name, shape, ty) in sample_tensors() {
            w.add_tensor(name, &shape, ty).unwrap();
        }
        w
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn round_trip_through_kilns_reader() {
        for alignment in [None, Some(64), Some(1)] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.gguf");
            let w = sample_writer(&path, alignment);
            let layout = w.layout().unwrap();
            let lens: Vec<u64> = w.tensors().iter().map(|t| t.byte_len).collect();
            let summary = w.write(|i, out| out.write_all(&pattern(i, lens[i]))).unwrap();

            let g = Gguf::open(&path).unwrap();
            let want_alignment = alignment.map_or(32, u64::from);
            assert_eq!((g.version(), g.alignment(), g.data_offset()), (3, want_alignment, layout.data_offset));
            assert_eq!(std::fs::metadata(&path).unwrap().len(), layout.file_size);
            assert_eq!(summary.file_size, layout.file_size);
            assert!(layout.file_size.is_multiple_of(want_alignment));
            let meta: Vec<(String, Value)> = g.metadata().map(|(k, v)| (k.to_string(), Value::from(v))).collect();
            let mut want: Vec<(String, Value)> = all_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            if let Some(a) = alignment {
                want.insert(0, ("general.alignment".into(), Value::U32(a)));
            }
            assert_eq!(meta, want);
            assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap(), ["<unk>", "<s>", "\u{2581}the", "é"]);

            let tensors: Vec<_> = g.tensors().collect();
            assert_eq!(tensors.len(), sample_tensors().len());
            for (i, (t, (name, shape, ty))) in tensors.iter().zip(sample_tensors()).enumerate() {
                assert_eq!((t.name, t.ggml_type, t.shape()), (name, ty, shape.clone()));
                assert_eq!(t.offset_in_file, layout.tensor_offsets[i], "{name}");
                assert_eq!(t.data, pattern(i, lens[i]), "{name}");
            }
            assert_eq!(g.tensor("blk.0.ffn_down.weight").unwrap().dims, [256, 2]);
            assert_eq!(summary.elements, 48 + 8 + 192 + 512 + 256 + 5 + 1);
        }
    }

    #[test]
    fn tensor_data_variants() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let w = sample_writer(&path, None);
        let lens: Vec<u64> = w.tensors().iter().map(|t| t.byte_len).collect();
        let bytes: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| pattern(i, n)).collect();
        w.write_data(|i| match i % 3 {
            0 => TensorData::Bytes(&bytes[i]),
            1 => TensorData::Zeros,
            _ => TensorData::Seeded(i as u64),
        })
        .unwrap();
        let g = Gguf::open(&path).unwrap();
        for (i, t) in g.tensors().enumerate() {
            match i % 3 {
                0 => assert_eq!(t.data, bytes[i], "{}", t.name),
                1 => assert!(t.data.iter().all(|&b| b == 0), "{}", t.name),
                _ => {
                    let mut again = Vec::new();
                    seeded::write(t.ggml_type, lens[i], i as u64, &mut again).unwrap();
                    assert_eq!(t.data, again, "{}", t.name);
                }
            }
        }
    }

    #[test]
    fn seeded_blocks_dequantize_to_finite_values() {
        for ty in GgmlType::ALL {
            let blocks = 3 * (1 << 20) / ty.type_size() + 1; // more than one chunk
            let mut bytes = Vec::new();
            seeded::write(ty, (blocks * ty.type_size()) as u64, 7, &mut bytes).unwrap();
            assert_eq!(bytes.len(), blocks * ty.type_size(), "{ty}");
            let integer = matches!(ty, GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64);
            if !integer {
                let values = quant::dequantize_to_vec(ty, &bytes).unwrap();
                let bad = values.iter().position(|v| !v.is_finite() || v.abs() > 64.0);
                assert_eq!(bad, None, "{ty}: {:?}", bad.map(|i| values[i]));
            }
            let mut other = Vec::new();
            seeded::write(ty, ty.type_size() as u64 * 4, 8, &mut other).unwrap();
            assert_ne!(bytes[..other.len()], other, "{ty}: the seed changes the data");
        }
    }

    #[test]
    fn zeros_make_a_sparse_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse.gguf");
        let mut w = GgufWriter::new(&path);
        w.add("general.architecture", "llama").unwrap();
        // 144 MiB of Q4_K, then a small F32 tensor written for real, then
        // zeros again at the end.
        w.add_tensor("big", &[1 << 15, 1 << 13], GgmlType::Q4_K).unwrap();
        w.add_tensor("small", &[4], GgmlType::F32).unwrap();
        w.add_tensor("tail", &[1 << 20], GgmlType::F32).unwrap();
        let ones: Vec<u8> = [1f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let summary = w.write_data(|i| if i == 1 { TensorData::Bytes(&ones) } else { TensorData::Zeros }).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), summary.file_size);
        assert!(meta.len() > 144 << 20);
        // `du`: blocks actually allocated, in 512-byte units.
        assert!(meta.blocks() * 512 < 1 << 20, "{} bytes allocated for {}", meta.blocks() * 512, meta.len());
        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.tensor("small").unwrap().data, ones);
        assert!(g.tensor("tail").unwrap().data.iter().all(|&b| b == 0));
        assert_eq!(g.tensor("big").unwrap().data[..4096], [0; 4096]);
    }

    #[test]
    fn data_length_mismatch_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.gguf");
        let short = |path: &Path| {
            let mut w = GgufWriter::new(path);
            w.add_tensor("a", &[8], GgmlType::F32).unwrap().add_tensor("blk.0.b", &[2, 32], GgmlType::Q8_0).unwrap();
            w
        };
        let e = short(&path).write(|i, out| out.write_all(&vec![0; if i == 0 { 32 } else { 60 }])).unwrap_err();
        assert!(matches!(&e, WeightsError::Tensor { tensor, .. } if tensor == "blk.0.b"), "{e:?}");
        assert!(e.to_string().contains("the data has 60 bytes, but Q8_0 [2, 32] takes 68"), "{e}");
        let e = short(&path).write(|_, out| out.write_all(&[0; 100])).unwrap_err();
        assert!(e.to_string().contains("tensor \"a\": the data has more than the 32 bytes of F32 [8]"), "{e}");
        let e = short(&path).write_data(|_| TensorData::Bytes(&[0; 3])).unwrap_err();
        assert!(e.to_string().contains("tensor \"a\": writing its data: 3 bytes given for a tensor of 32"), "{e}");
        let e = short(&path)
            .write(|i, out| if i == 1 { Err(io::Error::other("source gone")) } else { out.write_all(&[0; 32]) })
            .unwrap_err();
        assert!(e.to_string().contains("tensor \"blk.0.b\": writing its data: source gone"), "{e}");
        assert_eq!(leftovers(dir.path()), Vec::<String>::new());

        // An existing file is left as it was.
        std::fs::write(&path, b"old").unwrap();
        short(&path).write_data(|_| TensorData::Bytes(&[])).unwrap_err();
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(leftovers(dir.path()), ["bad.gguf"]);
    }

    #[test]
    fn bad_declarations_name_the_key_or_tensor() {
        let mut w = GgufWriter::new("m.gguf");
        let err = |r: Result<&mut GgufWriter, WeightsError>| r.unwrap_err().to_string();
        w.add("a.b", 1u32).unwrap();
        assert_eq!(err(w.add("a.b", "x")), "m.gguf: metadata \"a.b\": the key is already set");
        let mixed = Value::array(ValueType::I32, vec![Value::I32(1), Value::U8(2)]);
        assert!(err(w.add("k", mixed)).contains("metadata \"k\": element [1] is UINT8, but the array holds INT32"));
        let deep = (0..MAX_ARRAY_DEPTH).fold(Value::i32s([1]), |v, _| Value::array(ValueType::Array, vec![v]));
        assert!(err(w.add("deep", deep)).contains("arrays nest more than 16 deep"));
        for bad in [Value::U32(3), Value::U32(0), Value::I32(32), Value::from("32")] {
            assert!(err(w.add("general.alignment", bad)).contains("general.alignment is"));
        }
        w.add_tensor("t", &[4, 32], GgmlType::Q8_0).unwrap();
        assert_eq!(
            err(w.add_tensor("t", &[1], GgmlType::F32)),
            "m.gguf: tensor \"t\": the tensor name is already declared"
        );
        assert!(err(w.add_tensor("q", &[32, 16], GgmlType::Q4_0)).contains("row length 16 (shape [32, 16])"));
        assert!(err(w.add_tensor("q", &[], GgmlType::Q4_K)).contains("row length 1"));
        assert!(err(w.add_tensor("q", &[1; 5], GgmlType::F32)).contains("has 5 dims"));
        assert!(err(w.add_tensor("q", &[1 << 40, 1 << 40], GgmlType::F32)).contains("overflows"));
        assert!(err(w.add_tensor("q", &[1 << 62], GgmlType::F32)).contains("byte size"));
        assert!(err(w.add_tensor(&"x".repeat(64), &[1], GgmlType::F32)).contains("64 bytes"));
        // Failed declarations leave nothing behind.
        assert_eq!((w.tensors().len(), w.alignment()), (1, 32));
    }

    /// Reads a file with `gguf.GGUFReader` and describes it as JSON.
    const GGUF_PY_READER: &str = r#"
import json, sys
import gguf

r = gguf.GGUFReader(sys.argv[1])
T = gguf.GGUFValueType
fields = {}
for name, f in r.fields.items():
    if name.startswith("GGUF."):
        continue
    nested = f.types[0] == T.ARRAY and len(f.types) > 1 and f.types[1] == T.ARRAY
    fields[name] = {"types": [t.name for t in f.types], "value": None if nested else f.contents()}
tensors = [{
    "name": t.name,
    "type": t.tensor_type.name,
    "dims": [int(d) for d in t.shape],
    "offset": int(t.data_offset),
    "data": t.data.tobytes().hex(),
} for t in r.tensors]
json.dump({"alignment": int(r.alignment), "fields": fields, "tensors": tensors}, sys.stdout)
"#;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn gguf_py_reads_what_kiln_writes() {
        use serde_json::json;
        assert!(Path::new(PYTHON).exists(), "{PYTHON} is missing: run `make setup` to create the venv with gguf-py");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kiln.gguf");
        let w = sample_writer(&path, Some(64));
        let lens: Vec<u64> = w.tensors().iter().map(|t| t.byte_len).collect();
        let layout = w.layout().unwrap();
        w.write_data(|i| if i % 2 == 1 { TensorData::Seeded(i as u64) } else { TensorData::Zeros }).unwrap();
        let out = Command::new(PYTHON).arg("-c").arg(GGUF_PY_READER).arg(&path).output().unwrap();
        assert!(out.status.success(), "gguf-py reader failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

        assert_eq!(got["alignment"], 64);
        let fields = got["fields"].as_object().unwrap();
        assert_eq!(fields.len(), all_metadata().len() + 1);
        for (key, types, value) in [
            ("general.alignment", json!(["UINT32"]), json!(64)),
            ("test.u8", json!(["UINT8"]), json!(200)),
            ("test.i16", json!(["INT16"]), json!(-32768)),
            ("test.u64", json!(["UINT64"]), json!((1u64 << 63) + 5)),
            ("test.i64", json!(["INT64"]), json!(-(1i64 << 40))),
            ("test.f32", json!(["FLOAT32"]), json!(f64::from(1e-5f32))),
            ("test.f64", json!(["FLOAT64"]), json!(0.1)),
            ("test.bool", json!(["BOOL"]), json!(true)),
            ("general.name", json!(["STRING"]), json!("tiny \u{2713}")),
            ("tokenizer.ggml.tokens", json!(["ARRAY", "STRING"]), json!(["<unk>", "<s>", "\u{2581}the", "é"])),
            ("tokenizer.ggml.scores", json!(["ARRAY", "FLOAT32"]), json!([0.0, -1.5, 0.25])),
            ("tokenizer.ggml.token_type", json!(["ARRAY", "INT32"]), json!([2, 3, 1, 1])),
        ] {
            assert_eq!(fields[key], json!({"types": types, "value": value}), "{key}");
        }
        assert_eq!(fields["test.nested"]["types"].as_array().unwrap()[..2], [json!("ARRAY"), json!("ARRAY")]);

        let tensors = got["tensors"].as_array().unwrap();
        let data = std::fs::read(&path).unwrap();
        for (i, ((t, (name, shape, ty)), &len)) in tensors.iter().zip(sample_tensors()).zip(&lens).enumerate() {
            let dims: Vec<usize> = shape.iter().rev().copied().collect();
            let start = layout.tensor_offsets[i] as usize;
            let want = json!({
                "name": name,
                "type": ty.name(),
                "dims": dims,
                "offset": layout.tensor_offsets[i],
                "data": hex(&data[start..start + len as usize]),
            });
            assert_eq!(t, &want, "{name}");
        }
    }
}
