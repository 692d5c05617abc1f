//! GGUF, llama.cpp's checkpoint format (versions 2 and 3, little-endian):
//! a header `{"GGUF", u32 version, u64 tensor_count, u64 kv_count}`, the
//! metadata key/values, the tensor infos, padding to `general.alignment`,
//! then the tensor data. Spec: ggml-org/ggml `docs/gguf.md`.
//!
//! Nothing is copied on load: metadata strings and arrays are decoded from
//! the mapped bytes when asked for, and tensors are views of them. Everything
//! a view relies on is checked once, in [`Gguf::parse`], so a hostile file is
//! an error, never a panic or an allocation sized by the file's claims.

use super::ggml::GgmlType;
use super::WeightsError;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Alignment of the data section and of every tensor when the file does not
/// set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays nest at most this deep, so a hostile file cannot exhaust
/// the stack (gguf-py writes nested arrays; llama.cpp itself writes none).
pub const MAX_ARRAY_DEPTH: usize = 16;
/// Fewest bytes a key/value takes (key length, value type, one byte) and a
/// tensor info takes (name length, n_dims, type, offset): they bound the
/// counts in the header before anything is sized by them.
const MIN_KV_SIZE: usize = 8 + 4 + 1;
const MIN_TENSOR_INFO_SIZE: usize = 8 + 4 + 4 + 8;
/// Vectors sized by a file's counts start at most this big and grow with
/// what is actually read.
const MAX_PREALLOC: usize = 4096;

/// A metadata value's type, with the ids of `gguf_type` in ggml's `gguf.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8`.
    U8 = 0,
    /// `i8`.
    I8 = 1,
    /// `u16`.
    U16 = 2,
    /// `i16`.
    I16 = 3,
    /// `u32`.
    U32 = 4,
    /// `i32`.
    I32 = 5,
    /// `f32`.
    F32 = 6,
    /// A boolean, one byte.
    Bool = 7,
    /// A UTF-8 string with a u64 length.
    String = 8,
    /// An array of one element type with a u64 count.
    Array = 9,
    /// `u64`.
    U64 = 10,
    /// `i64`.
    I64 = 11,
    /// `f64`.
    F64 = 12,
}

impl ValueType {
    /// The type of a `gguf_type` id; `None` for an unknown id.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The `gguf_type` id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name gguf-py's `GGUFValueType` gives it.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }

    /// Encoded size; `None` for strings and arrays.
    fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// Fewest bytes one value takes: a string's length, an array's element
    /// type and count.
    fn min_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 4 + 8,
            _ => self.fixed_size().expect("only strings and arrays have no fixed size"),
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value, generic over how it holds strings (`S`) and arrays
/// (`A`): as read, both borrow the file's bytes ([`MetadataValue`]); to be
/// written, both are owned ([`super::gguf_writer::Value`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Metadata<S, A> {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f32`.
    F32(f32),
    /// `f64`.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(S),
    /// An array.
    Array(A),
}

/// A metadata value as read: strings and arrays borrow the file's bytes.
pub type MetadataValue<'a> = Metadata<&'a str, MetadataArray<'a>>;

impl<S, A> Metadata<S, A> {
    /// The value's type; an array's, whatever its elements.
    pub fn value_type(&self) -> ValueType {
        match self {
            Metadata::U8(_) => ValueType::U8,
            Metadata::I8(_) => ValueType::I8,
            Metadata::U16(_) => ValueType::U16,
            Metadata::I16(_) => ValueType::I16,
            Metadata::U32(_) => ValueType::U32,
            Metadata::I32(_) => ValueType::I32,
            Metadata::U64(_) => ValueType::U64,
            Metadata::I64(_) => ValueType::I64,
            Metadata::F32(_) => ValueType::F32,
            Metadata::F64(_) => ValueType::F64,
            Metadata::Bool(_) => ValueType::Bool,
            Metadata::String(_) => ValueType::String,
            Metadata::Array(_) => ValueType::Array,
        }
    }

    /// Any integer type, if the value is non-negative: writers differ in the
    /// width they pick (gguf-py writes Python ints in arrays as INT32).
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type, if the value fits.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Metadata::U8(v) => v.into(),
            Metadata::I8(v) => v.into(),
            Metadata::U16(v) => v.into(),
            Metadata::I16(v) => v.into(),
            Metadata::U32(v) => v.into(),
            Metadata::I32(v) => v.into(),
            Metadata::U64(v) => v.into(),
            Metadata::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Either float type, or an integer (a float hyperparameter written as a
    /// whole number); integers beyond 2^53 round.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Metadata::F32(v) => Some(v.into()),
            Metadata::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Metadata::Bool(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> MetadataValue<'a> {
    /// A string value.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<MetadataArray<'a>> {
        match *self {
            MetadataValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The type for messages: `UINT32`, `ARRAY of STRING`.
    fn type_description(&self) -> String {
        match self {
            MetadataValue::Array(a) => format!("ARRAY of {}", a.elem),
            v => v.value_type().to_string(),
        }
    }
}

/// An array value, decoded element by element as it is iterated: a 150k
/// token vocabulary costs nothing until it is read, and reading it
/// allocates nothing per element.
#[derive(Clone, Copy, PartialEq)]
pub struct MetadataArray<'a> {
    elem: ValueType,
    len: usize,
    /// The encoded elements, checked when the file was parsed.
    bytes: &'a [u8],
}

impl<'a> MetadataArray<'a> {
    /// The type of every element.
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements, decoded as they are read.
    pub fn iter(&self) -> MetadataIter<'a> {
        MetadataIter { elem: self.elem, left: self.len, cursor: Cursor { data: self.bytes, pos: 0 } }
    }
}

impl fmt::Debug for MetadataArray<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for MetadataArray<'a> {
    type Item = MetadataValue<'a>;
    type IntoIter = MetadataIter<'a>;

    fn into_iter(self) -> MetadataIter<'a> {
        self.iter()
    }
}

/// The elements of a [`MetadataArray`].
#[derive(Clone)]
pub struct MetadataIter<'a> {
    elem: ValueType,
    left: usize,
    cursor: Cursor<'a>,
}

impl<'a> Iterator for MetadataIter<'a> {
    type Item = MetadataValue<'a>;

    fn next(&mut self) -> Option<MetadataValue<'a>> {
        self.left = self.left.checked_sub(1)?;
        // Depth restarts at 0: the parse already bounded the whole tree.
        let stored = self.cursor.value(self.elem, 0).expect("array elements were checked when the file was parsed");
        Some(stored.view(self.cursor.data))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for MetadataIter<'_> {}

/// One tensor of a parsed file; `data` borrows the file's bytes.
#[derive(Clone, Copy, Debug)]
pub struct GgufTensor<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// How its elements are stored.
    pub ggml_type: GgmlType,
    /// As stored: fastest-varying first, so `dims[0]` is the row length
    /// (ggml's `ne`). [`GgufTensor::shape`] is the row-major shape.
    pub dims: &'a [u64],
    /// Where `data` starts in the file (what an IREE parameter reference to
    /// the GGUF itself points at).
    pub offset_in_file: u64,
    /// The tensor's bytes in the file (mapped, not copied).
    pub data: &'a [u8],
}

impl GgufTensor<'_> {
    /// Row-major, slowest-varying first: `dims` reversed, so a `[n_embd,
    /// n_vocab]` ggml tensor is the matrix `[n_vocab, n_embd]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| usize::try_from(d).expect("dims were checked to fit usize")).collect()
    }

    /// Number of elements: the product of `dims`.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A metadata value as kept after parsing: scalars decoded, strings and
/// arrays as byte ranges of the file (views are made on request).
#[derive(Clone, Debug)]
enum Stored {
    Plain(MetadataValue<'static>),
    Str(Range<usize>),
    Array { elem: ValueType, len: usize, bytes: Range<usize> },
}

impl Stored {
    fn view<'a>(&self, data: &'a [u8]) -> MetadataValue<'a> {
        match self {
            Stored::Plain(v) => *v,
            Stored::Str(r) => MetadataValue::String(str_at(data, r)),
            Stored::Array { elem, len, bytes } => {
                MetadataValue::Array(MetadataArray { elem: *elem, len: *len, bytes: &data[bytes.clone()] })
            }
        }
    }
}

fn str_at<'a>(data: &'a [u8], range: &Range<usize>) -> &'a str {
    std::str::from_utf8(&data[range.clone()]).expect("strings were checked to be UTF-8 when the file was parsed")
}

#[derive(Debug)]
struct TensorInfo {
    name: Range<usize>,
    ggml_type: GgmlType,
    n_dims: usize,
    dims: [u64; MAX_DIMS],
    /// Byte range in the file.
    start: usize,
    end: usize,
}

/// A parsed, validated GGUF file over its bytes `D`: a memory map from
/// [`Gguf::open`], or any byte buffer given to [`Gguf::parse`]. `D` may
/// be unsized, so `&Gguf<dyn AsRef<[u8]>>` takes any of them: one reader
/// function for every byte holder.
pub struct Gguf<D: ?Sized = Mmap> {
    path: PathBuf,
    version: u32,
    alignment: u64,
    data_offset: u64,
    /// File order; keys are byte ranges of the file.
    metadata: Vec<(Range<usize>, Stored)>,
    by_key: HashMap<String, usize>,
    /// File order.
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    /// Last, so that `D` may be unsized.
    data: D,
}

impl Gguf<Mmap> {
    /// Maps `path` and parses and validates its header, metadata and tensor table.
    pub fn open(path: &Path) -> Result<Gguf<Mmap>, WeightsError> {
        let io = |error| WeightsError::Io { path: path.to_path_buf(), error };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this value; like every
        // mmap reader we rely on nobody truncating or rewriting the file while
        // it is open (kiln writes files by atomic rename, never in place).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Gguf::parse_at(path.to_path_buf(), map)
    }

    /// Drops `bytes` (a view of this file, e.g. a tensor's data, that a
    /// sequential reader is done with) and the MiB before them from
    /// resident memory: they are read from the file again if touched.
    pub fn release(&self, bytes: &[u8]) {
        super::release_pages(&self.data, bytes);
    }
}

impl<D: AsRef<[u8]>> Gguf<D> {
    /// Parses and validates GGUF bytes held in memory: what [`Gguf::open`]
    /// does after mapping the file, public for fuzzing and tests. Errors name
    /// the file `<memory>`. `data.as_ref()` must return the same bytes every
    /// time (as slices, vectors and maps do).
    pub fn parse(data: D) -> Result<Gguf<D>, WeightsError> {
        Gguf::parse_at(PathBuf::from("<memory>"), data)
    }

    fn parse_at(path: PathBuf, data: D) -> Result<Gguf<D>, WeightsError> {
        let bytes = data.as_ref();
        let file_len = bytes.len();
        let bad = |message: String| WeightsError::Format { path: path.clone(), message };
        let mut cur = Cursor { data: bytes, pos: 0 };

        let magic = cur.take(4, "the magic").map_err(bad)?;
        if magic != b"GGUF" {
            return Err(bad(format!("not a GGUF file: it starts with \"{}\", not \"GGUF\"", magic.escape_ascii())));
        }
        let version = cur.u32("the version").map_err(bad)?;
        match version {
            2 | 3 => {}
            // The magic is bytes, so only the numbers show the byte order.
            v if (1..=3).contains(&v.swap_bytes()) => {
                return Err(bad(format!(
                    "big-endian GGUF (version reads as {v:#010x}, byte-swapped {}); kiln reads only little-endian \
                     files (gguf-py's gguf-convert-endian converts them)",
                    v.swap_bytes()
                )))
            }
            1 => {
                return Err(bad("GGUF version 1 (32-bit counts and lengths) is not supported; only 2 and 3 are".into()))
            }
            v => return Err(bad(format!("unsupported GGUF version {v}; only 2 and 3 are supported"))),
        }
        let n_tensors = cur.u64("the tensor count").map_err(bad)?;
        let n_kv = cur.u64("the metadata key/value count").map_err(bad)?;
        let n_kv = cur.count(n_kv, MIN_KV_SIZE, "metadata key/values").map_err(bad)?;
        let n_tensors = cur.count(n_tensors, MIN_TENSOR_INFO_SIZE, "tensor infos").map_err(bad)?;

        let mut metadata = Vec::with_capacity(n_kv.min(MAX_PREALLOC));
        let mut by_key = HashMap::with_capacity(n_kv.min(MAX_PREALLOC));
        for i in 0..n_kv {
            let key = cur.str("a metadata key").map_err(|e| bad(format!("metadata key/value {i}: {e}")))?;
            let key_range = cur.pos - key.len()..cur.pos;
            let at_key = |e: String| bad(format!("metadata \"{key}\": {e}"));
            let id = cur.u32("the value type").map_err(at_key)?;
            let ty = ValueType::from_id(id).ok_or_else(|| at_key(format!("unknown value type {id}")))?;
            let value = cur.value(ty, 0).map_err(at_key)?;
            if by_key.insert(key.to_string(), i).is_some() {
                return Err(at_key("the key appears twice".into()));
            }
            metadata.push((key_range, value));
        }

        let alignment = match by_key.get(ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => {
                let v = metadata[i].1.view(bytes);
                match v.as_u64() {
                    Some(a) if a.is_power_of_two() => a,
                    Some(a) => return Err(bad(format!("{ALIGNMENT_KEY} is {a}, not a non-zero power of two"))),
                    None => {
                        return Err(bad(format!(
                            "{ALIGNMENT_KEY} is {}, expected an unsigned integer",
                            v.type_description()
                        )))
                    }
                }
            }
        };

        // Infos first: the data section starts after the last of them.
        let mut raw = Vec::with_capacity(n_tensors.min(MAX_PREALLOC));
        let mut by_name = HashMap::with_capacity(n_tensors.min(MAX_PREALLOC));
        for i in 0..n_tensors {
            let name = cur.str("a tensor name").map_err(|e| bad(format!("tensor info {i}: {e}")))?;
            let name_range = cur.pos - name.len()..cur.pos;
            let at_tensor =
                |message: String| WeightsError::Tensor { path: path.clone(), tensor: name.to_string(), message };
            let n_dims = cur.u32("n_dims").map_err(at_tensor)?;
            let n_dims = usize::try_from(n_dims)
                .ok()
                .filter(|&n| n <= MAX_DIMS)
                .ok_or_else(|| at_tensor(format!("has {n_dims} dims; ggml allows at most {MAX_DIMS}")))?;
            let mut dims = [0u64; MAX_DIMS];
            for d in &mut dims[..n_dims] {
                *d = cur.u64("a dim").map_err(at_tensor)?;
            }
            let id = cur.u32("the ggml type").map_err(at_tensor)?;
            let ggml_type = GgmlType::from_id(id).ok_or_else(|| at_tensor(format!("unknown ggml type id {id}")))?;
            let offset = cur.u64("the data offset").map_err(at_tensor)?;
            if by_name.insert(name.to_string(), i).is_some() {
                return Err(at_tensor("the tensor name appears twice".into()));
            }
            raw.push((name_range, ggml_type, n_dims, dims, offset));
        }
        let data_offset = (cur.pos as u64)
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| bad(format!("the data section offset overflows with {ALIGNMENT_KEY} {alignment}")))?;

        let mut tensors = Vec::with_capacity(raw.len());
        for (name_range, ggml_type, n_dims, dims, offset) in raw {
            let dims_of = &dims[..n_dims];
            let at_tensor = |message: String| WeightsError::Tensor {
                path: path.clone(),
                tensor: str_at(bytes, &name_range).to_string(),
                message,
            };
            // ggml counts elements in int64_t; shapes are usize here.
            if let Some(d) = dims_of.iter().find(|&&d| i64::try_from(d).is_err() || usize::try_from(d).is_err()) {
                return Err(at_tensor(format!("dim {d} of {dims_of:?} is out of range")));
            }
            let n_elements = dims_of
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .ok_or_else(|| at_tensor(format!("the element count of dims {dims_of:?} overflows u64")))?;
            // Blocks never span rows, so the row length must be whole blocks
            // (which makes the element count whole blocks too).
            let block = ggml_type.block_size() as u64;
            let row = dims_of.first().copied().unwrap_or(1);
            if !row.is_multiple_of(block) {
                return Err(at_tensor(format!(
                    "row length {row} (dims {dims_of:?}) is not a whole number of {ggml_type} blocks of {block}"
                )));
            }
            let byte_len = ggml_type.byte_len(n_elements).ok_or_else(|| {
                at_tensor(format!("the byte size of {n_elements} {ggml_type} elements overflows u64"))
            })?;
            if !offset.is_multiple_of(alignment) {
                return Err(at_tensor(format!(
                    "data offset {offset} is not a multiple of {ALIGNMENT_KEY} {alignment}"
                )));
            }
            let range = data_offset
                .checked_add(offset)
                .and_then(|start| Some(start..start.checked_add(byte_len)?))
                .and_then(|r| Some(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?))
                .filter(|r| r.end <= file_len)
                .ok_or_else(|| {
                    at_tensor(format!(
                        "{byte_len} bytes at data offset {offset} (data section at {data_offset}) run past the end \
                         of the {file_len}-byte file"
                    ))
                })?;
            tensors.push(TensorInfo { name: name_range, ggml_type, n_dims, dims, start: range.start, end: range.end });
        }

        // Empty tensors occupy nothing, so they overlap nothing.
        let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.start < t.end).collect();
        order.sort_by_key(|t| t.start);
        for pair in order.windows(2) {
            let (prev, t) = (pair[0], pair[1]);
            if t.start < prev.end {
                return Err(WeightsError::Tensor {
                    path: path.clone(),
                    tensor: str_at(bytes, &t.name).to_string(),
                    message: format!(
                        "bytes {}..{} overlap tensor \"{}\" at {}..{}",
                        t.start,
                        t.end,
                        str_at(bytes, &prev.name),
                        prev.start,
                        prev.end
                    ),
                });
            }
        }

        Ok(Gguf { path, data, version, alignment, data_offset, metadata, by_key, tensors, by_name })
    }
}

impl<D: AsRef<[u8]> + ?Sized> Gguf<D> {
    fn bytes(&self) -> &[u8] {
        self.data.as_ref()
    }

    /// The file (`<memory>` for [`Gguf::parse`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment`, or 32 when the file does not set it.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the tensor data section starts; tensor offsets count from here.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All key/values in file order.
    pub fn metadata(&self) -> impl ExactSizeIterator<Item = (&str, MetadataValue<'_>)> + '_ {
        self.metadata.iter().map(|(k, v)| (str_at(self.bytes(), k), v.view(self.bytes())))
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<MetadataValue<'_>> {
        self.by_key.get(key).map(|&i| self.metadata[i].1.view(self.bytes()))
    }

    /// Any non-negative integer value.
    pub fn get_u64(&self, key: &str) -> Result<u64, WeightsError> {
        self.get_as(key, "an unsigned integer", |v| v.as_u64())
    }

    /// A float or integer value.
    pub fn get_f64(&self, key: &str) -> Result<f64, WeightsError> {
        self.get_as(key, "a number", |v| v.as_f64())
    }

    /// A string value; an error names the key and what it holds instead.
    pub fn get_str(&self, key: &str) -> Result<&str, WeightsError> {
        self.get_as(key, "a STRING", |v| v.as_str())
    }

    /// An array value; an error names the key and what it holds instead.
    pub fn get_array(&self, key: &str) -> Result<MetadataArray<'_>, WeightsError> {
        self.get_as(key, "an ARRAY", |v| v.as_array())
    }

    /// An array of strings (a tokenizer vocabulary): one allocation, for the
    /// vector of borrowed strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, WeightsError> {
        let strings =
            self.get_as(key, "an ARRAY of STRING", |v| v.as_array().filter(|a| a.elem == ValueType::String))?;
        Ok(strings.iter().map(|v| v.as_str().expect("the elements of a STRING array are strings")).collect())
    }

    fn get_as<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        convert: impl FnOnce(&MetadataValue<'a>) -> Option<T>,
    ) -> Result<T, WeightsError> {
        let bad = |message| WeightsError::Format { path: self.path.clone(), message };
        let v = self.get(key).ok_or_else(|| bad(format!("cannot find {key} in metadata")))?;
        convert(&v).ok_or_else(|| {
            let value = match v {
                MetadataValue::Array(_) => String::new(),
                v => format!(" {v:?}"),
            };
            bad(format!("{key} is {}{value}, expected {expected}", v.type_description()))
        })
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = GgufTensor<'_>> + '_ {
        self.tensors.iter().map(|t| self.view(t))
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<GgufTensor<'_>> {
        self.by_name.get(name).map(|&i| self.view(&self.tensors[i]))
    }

    fn view<'a>(&'a self, t: &'a TensorInfo) -> GgufTensor<'a> {
        GgufTensor {
            name: str_at(self.bytes(), &t.name),
            ggml_type: t.ggml_type,
            dims: &t.dims[..t.n_dims],
            offset_in_file: t.start as u64,
            data: &self.bytes()[t.start..t.end],
        }
    }
}

impl<D: ?Sized> fmt::Debug for Gguf<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

/// Reads little-endian values; every read checks the bytes are there, and
/// messages say what was being read.
#[derive(Clone)]
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "the file ends while reading {what}: {n} bytes at offset {}, {} left",
                self.pos,
                self.remaining()
            ));
        }
        let bytes = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn le<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        Ok(self.take(N, what)?.try_into().expect("take returns exactly N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.le(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.le(what).map(u64::from_le_bytes)
    }

    /// Checks that `n` items of at least `min_size` bytes each fit in what is
    /// left of the file, before anything is sized or looped by `n`.
    fn count(&self, n: u64, min_size: usize, what: &str) -> Result<usize, String> {
        let need = n.checked_mul(min_size as u64);
        match need {
            Some(need) if need <= self.remaining() as u64 => {
                Ok(usize::try_from(n).expect("n <= remaining bytes, which fit usize"))
            }
            _ => Err(format!(
                "{n} {what} of at least {min_size} bytes each cannot fit in the {} bytes left at offset {}",
                self.remaining(),
                self.pos
            )),
        }
    }

    fn str(&mut self, what: &str) -> Result<&'a str, String> {
        let len = self.u64(what)?;
        let len = usize::try_from(len).ok().filter(|&n| n <= self.remaining()).ok_or_else(|| {
            format!(
                "{what} of {len} bytes runs past the end of the file ({} bytes left at offset {})",
                self.remaining(),
                self.pos
            )
        })?;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|e| format!("{what} at offset {} is not UTF-8: {e}", self.pos - len))
    }

    /// Reads (and so checks) one value of type `ty`, nested `depth` arrays
    /// deep.
    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Stored, String> {
        use MetadataValue as V;
        let v = match ty {
            ValueType::U8 => V::U8(u8::from_le_bytes(self.le("a UINT8")?)),
            ValueType::I8 => V::I8(i8::from_le_bytes(self.le("an INT8")?)),
            ValueType::U16 => V::U16(u16::from_le_bytes(self.le("a UINT16")?)),
            ValueType::I16 => V::I16(i16::from_le_bytes(self.le("an INT16")?)),
            ValueType::U32 => V::U32(u32::from_le_bytes(self.le("a UINT32")?)),
            ValueType::I32 => V::I32(i32::from_le_bytes(self.le("an INT32")?)),
            ValueType::U64 => V::U64(u64::from_le_bytes(self.le("a UINT64")?)),
            ValueType::I64 => V::I64(i64::from_le_bytes(self.le("an INT64")?)),
            ValueType::F32 => V::F32(f32::from_le_bytes(self.le("a FLOAT32")?)),
            ValueType::F64 => V::F64(f64::from_le_bytes(self.le("a FLOAT64")?)),
            ValueType::Bool => match self.le::<1>("a BOOL")? {
                [0] => V::Bool(false),
                [1] => V::Bool(true),
                [b] => return Err(format!("BOOL at offset {} is {b}, not 0 or 1", self.pos - 1)),
            },
            ValueType::String => {
                let s = self.str("a STRING")?;
                return Ok(Stored::Str(self.pos - s.len()..self.pos));
            }
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!("arrays nest more than {MAX_ARRAY_DEPTH} deep"));
                }
                let id = self.u32("an array's element type")?;
                let elem = ValueType::from_id(id).ok_or_else(|| format!("unknown array element type {id}"))?;
                let n = self.u64("an array's length")?;
                let len = self.count(n, elem.min_size(), &format!("{elem} array elements"))?;
                let start = self.pos;
                match elem.fixed_size() {
                    // Plain numbers need no per-element check; `count` bounded
                    // the product.
                    Some(size) if elem != ValueType::Bool => {
                        self.take(len * size, "array elements")?;
                    }
                    _ => {
                        for i in 0..len {
                            // Nested indices read `element [2][0]: ...`.
                            self.value(elem, depth + 1).map_err(|e| match e.strip_prefix("element ") {
                                Some(inner) => format!("element [{i}]{inner}"),
                                None => format!("element [{i}]: {e}"),
                            })?;
                        }
                    }
                }
                return Ok(Stored::Array { elem, len, bytes: start..self.pos });
            }
        };
        Ok(Stored::Plain(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::gguf_writer::{Array, Value};
    use half::f16;
    use std::process::Command;

    /// A metadata value as the file holds it: one the writer encodes, or
    /// a value type id followed by arbitrary bytes (hostile files).
    enum W {
        V(Value),
        Raw(u32, Vec<u8>),
    }

    impl<T: Into<Value>> From<T> for W {
        fn from(v: T) -> W {
            W::V(v.into())
        }
    }

    impl W {
        fn type_id(&self) -> u32 {
            match self {
                W::V(v) => v.value_type().id(),
                W::Raw(id, _) => *id,
            }
        }

        fn encode(&self, out: &mut Vec<u8>) {
            match self {
                W::V(v) => v.encode(out),
                W::Raw(_, bytes) => out.extend(bytes),
            }
        }
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    struct Info {
        name: &'static str,
        dims: Vec<u64>,
        ty: u32,
        offset: u64,
    }

    fn info(name: &'static str, dims: &[u64], ty: GgmlType, offset: u64) -> Info {
        Info { name, dims: dims.to_vec(), ty: ty.id(), offset }
    }

    /// Header, `kvs`, `infos`, zero padding to `alignment`, then `data`.
    fn file(version: u32, kvs: &[(&str, W)], infos: &[Info], alignment: usize, data: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend((infos.len() as u64).to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        for (key, v) in kvs {
            put_str(&mut b, key);
            b.extend(v.type_id().to_le_bytes());
            v.encode(&mut b);
        }
        for t in infos {
            put_str(&mut b, t.name);
            b.extend((t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(t.ty.to_le_bytes());
            b.extend(t.offset.to_le_bytes());
        }
        b.resize(b.len().next_multiple_of(alignment), 0);
        b.extend(data);
        b
    }

    /// Lays tensors out as writers do: each at the next multiple of
    /// `alignment` of the data section.
    fn layout(tensors: &[(&'static str, &[u64], GgmlType, Vec<u8>)], alignment: usize) -> (Vec<Info>, Vec<u8>) {
        let mut data = Vec::new();
        let infos = tensors
            .iter()
            .map(|(name, dims, ty, bytes)| {
                data.resize(data.len().next_multiple_of(alignment), 0);
                let i = info(name, dims, *ty, data.len() as u64);
                data.extend(bytes);
                i
            })
            .collect();
        (infos, data)
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn f32s(xs: &[f32]) -> Vec<u8> {
        xs.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// The tensors of the hand-built files: F32, F16 (not a multiple of the
    /// alignment, so padding follows), Q4_0 (2 rows of 2 blocks), Q8_0.
    fn sample_tensors() -> Vec<(&'static str, &'static [u64], GgmlType, Vec<u8>)> {
        let embd = f32s(&(0..12).map(|i| i as f32 * 0.5 - 2.0).collect::<Vec<_>>());
        let norm: Vec<u8> = [1.0f32, -0.5, 0.25, 3.0].iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect();
        vec![
            ("token_embd.weight", &[4, 3], GgmlType::F32, embd),
            ("output_norm.weight", &[4], GgmlType::F16, norm),
            ("blk.0.attn_q.weight", &[64, 2], GgmlType::Q4_0, pattern(4 * 18, 1)),
            ("blk.0.ffn_up.weight", &[32, 3], GgmlType::Q8_0, pattern(3 * 34, 2)),
        ]
    }

    fn sample_metadata() -> Vec<(&'static str, Value)> {
        let array = Value::array;
        vec![
            ("general.architecture", "llama".into()),
            ("llama.context_length", Value::U32(4096)),
            ("test.u8", Value::U8(250)),
            ("test.i8", Value::I8(-3)),
            ("test.u16", Value::U16(65535)),
            ("test.i16", Value::I16(-300)),
            ("test.i32", Value::I32(-5)),
            ("test.u64", Value::U64(u64::MAX)),
            ("test.i64", Value::I64(i64::MIN)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("test.f64", Value::F64(0.1)),
            ("test.bool", Value::Bool(true)),
            ("tokenizer.ggml.tokens", Value::strings(["<s>", "</s>", "héllo", ""])),
            ("tokenizer.ggml.scores", Value::f32s([-1.5, 0.25])),
            ("test.flags", array(ValueType::Bool, vec![Value::Bool(false), Value::Bool(true)])),
            (
                "test.nested",
                array(
                    ValueType::Array,
                    vec![
                        Value::i32s([1, -2]),
                        Value::strings(["a", "bc"]),
                        array(ValueType::Array, vec![array(ValueType::U64, vec![Value::U64(7)])]),
                        array(ValueType::U32, vec![]),
                    ],
                ),
            ),
            ("test.empty", array(ValueType::F64, vec![])),
        ]
    }

    /// [`file`]'s key/values for `kvs`.
    fn kvs(kvs: Vec<(&'static str, Value)>) -> Vec<(&'static str, W)> {
        kvs.into_iter().map(|(k, v)| (k, W::V(v))).collect()
    }

    /// The sample file, with the alignment set to `alignment` (32 by
    /// default, or through `general.alignment`).
    fn sample(version: u32, alignment: Option<u32>) -> Vec<u8> {
        let mut kvs = sample_metadata();
        if let Some(a) = alignment {
            kvs.push(("general.alignment", Value::U32(a)));
        }
        let align = alignment.unwrap_or(32) as usize;
        let (infos, data) = layout(&sample_tensors(), align);
        file(version, &self::kvs(kvs), &infos, align, &data)
    }

    fn check_sample(bytes: &[u8], version: u32, alignment: u64) {
        let g = Gguf::parse(bytes).unwrap();
        assert_eq!(g.version(), version);
        assert_eq!(g.alignment(), alignment);
        assert_eq!(g.data_offset() % alignment, 0);

        let mut kvs = sample_metadata();
        if alignment != 32 {
            kvs.push(("general.alignment", Value::U32(alignment as u32)));
        }
        assert_eq!(g.metadata().len(), kvs.len());
        for ((key, want), (k, v)) in kvs.iter().zip(g.metadata()) {
            assert_eq!(*key, k);
            assert_eq!(Value::from(v), *want, "{key}");
            assert_eq!(g.get(key).map(Value::from).as_ref(), Some(want), "{key}");
            if let (Some(a), Value::Array(Array { items, .. })) = (v.as_array(), want) {
                assert_eq!((a.len(), a.iter().len()), (items.len(), items.len()), "{key}");
            }
        }

        let tensors = sample_tensors();
        assert_eq!(g.tensors().len(), tensors.len());
        let (infos, _) = layout(&tensors, alignment as usize);
        for ((name, dims, ty, data), (t, i)) in tensors.iter().zip(g.tensors().zip(&infos)) {
            assert_eq!(t.name, *name);
            assert_eq!(t.ggml_type, *ty);
            assert_eq!(t.dims, *dims);
            let shape: Vec<usize> = dims.iter().rev().map(|&d| d as usize).collect();
            assert_eq!(t.shape(), shape);
            assert_eq!(t.n_elements(), dims.iter().product::<u64>());
            assert_eq!(t.data, &data[..]);
            assert_eq!(t.offset_in_file, g.data_offset() + i.offset);
            // The view is the file's own bytes, not a copy.
            assert_eq!(t.data.as_ptr(), bytes[t.offset_in_file as usize..].as_ptr());
            assert_eq!(g.tensor(name).unwrap().data, t.data);
        }
        assert!(g.tensor("missing").is_none());
    }

    #[test]
    fn reads_back_v3_alignment_32() {
        check_sample(&sample(3, None), 3, 32);
        // An explicit 32 is the same file layout.
        let g_bytes = sample(3, Some(32));
        let g = Gguf::parse(&g_bytes[..]).unwrap();
        assert_eq!(g.alignment(), 32);
        assert_eq!(g.get_u64("general.alignment").unwrap(), 32);
    }

    #[test]
    fn reads_back_v2_alignment_64() {
        check_sample(&sample(2, Some(64)), 2, 64);
    }

    #[test]
    fn scalars_empty_tensors_and_files_without_tensors() {
        let (infos, data) =
            layout(&[("scalar", &[], GgmlType::F32, f32s(&[2.5])), ("none", &[0, 7], GgmlType::F16, vec![])], 32);
        let g = Gguf::parse(file(3, &[], &infos, 32, &data)).unwrap();
        let s = g.tensor("scalar").unwrap();
        assert_eq!((s.dims, s.shape(), s.n_elements(), s.data), (&[][..], vec![], 1, &2.5f32.to_le_bytes()[..]));
        let n = g.tensor("none").unwrap();
        assert_eq!((n.shape(), n.n_elements(), n.data.len()), (vec![7, 0], 0, 0));

        let g = Gguf::parse(file(3, &[("k", "v".into())], &[], 32, &[])).unwrap();
        assert_eq!((g.tensors().len(), g.get_str("k").unwrap()), (0, "v"));
    }

    #[test]
    fn accessors_convert_integer_widths() {
        use MetadataValue as V;
        assert_eq!(V::U8(7).as_u64(), Some(7));
        assert_eq!(V::I32(7).as_u64(), Some(7));
        assert_eq!(V::I32(-7).as_u64(), None);
        assert_eq!(V::I32(-7).as_i64(), Some(-7));
        assert_eq!(V::U64(u64::MAX).as_i64(), None);
        assert_eq!(V::U64(u64::MAX).as_u64(), Some(u64::MAX));
        assert_eq!(V::I64(i64::MIN).as_i64(), Some(i64::MIN));
        assert_eq!(V::F32(0.5).as_f64(), Some(0.5));
        assert_eq!(V::U32(10000).as_f64(), Some(10000.0));
        assert_eq!(V::F64(1.0).as_u64(), None);
        assert_eq!(V::Bool(true).as_u64(), None);
        assert_eq!(V::Bool(true).as_bool(), Some(true));
        assert_eq!(V::String("x").as_str(), Some("x"));
        assert_eq!(V::U8(1).as_str(), None);
        assert_eq!(V::String("x").value_type(), ValueType::String);
        for id in 0..13 {
            assert_eq!(ValueType::from_id(id).unwrap().id(), id);
        }
        assert_eq!(ValueType::from_id(13), None);
    }

    #[test]
    fn typed_getters_and_their_errors() {
        let bytes = sample(3, None);
        let g = Gguf::parse(&bytes[..]).unwrap();
        assert_eq!(g.get_u64("llama.context_length").unwrap(), 4096);
        assert_eq!(g.get_u64("test.u8").unwrap(), 250);
        assert_eq!(g.get_f64("llama.attention.layer_norm_rms_epsilon").unwrap(), f64::from(1e-5f32));
        assert_eq!(g.get_f64("llama.context_length").unwrap(), 4096.0);
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap(), ["<s>", "</s>", "héllo", ""]);
        let scores: Vec<f64> =
            g.get_array("tokenizer.ggml.scores").unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(scores, [-1.5, 0.25]);

        let err = |e: WeightsError| e.to_string();
        assert_eq!(
            err(g.get_u64("llama.block_count").unwrap_err()),
            "<memory>: cannot find llama.block_count in metadata"
        );
        assert!(
            err(g.get_u64("test.i32").unwrap_err()).contains("test.i32 is INT32 I32(-5), expected an unsigned integer")
        );
        assert!(err(g.get_f64("general.architecture").unwrap_err()).contains("is STRING"));
        assert!(err(g.get_str("test.u8").unwrap_err()).contains("test.u8 is UINT8 U8(250), expected a STRING"));
        assert!(err(g.get_str_array("tokenizer.ggml.scores").unwrap_err())
            .contains("tokenizer.ggml.scores is ARRAY of FLOAT32, expected an ARRAY of STRING"));
    }

    #[test]
    fn open_maps_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, sample(3, Some(64))).unwrap();
        let g = Gguf::open(&path).unwrap();
        assert_eq!((g.path(), g.tensors().len()), (path.as_path(), 4));
        let missing = Gguf::open(&dir.path().join("none.gguf")).unwrap_err();
        assert!(matches!(missing, WeightsError::Io { .. }), "{missing}");
        // Errors name the file (a separate one: `g` still maps `path`).
        let short = dir.path().join("short.gguf");
        std::fs::write(&short, b"GGUF").unwrap();
        let e = Gguf::open(&short).unwrap_err();
        assert!(e.to_string().starts_with(&format!("{}: the file ends", short.display())), "{e}");
    }

    /// A file holding a tensor of every ggml type kiln knows (the i-quants,
    /// TQ1_0, TQ2_0 and MXFP4 among them) opens, each tensor sized by the
    /// type table and its seeded blocks dequantizing to finite values.
    #[test]
    fn opens_a_tensor_of_every_ggml_type() {
        use crate::weights::gguf_writer::{GgufWriter, TensorData};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("types.gguf");
        let mut w = GgufWriter::new(&path);
        for ty in GgmlType::ALL {
            w.add_tensor(&format!("t.{ty}"), &[3, 2 * ty.block_size()], ty).unwrap();
        }
        w.write_data(|i| TensorData::Seeded(i as u64)).unwrap();
        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.tensors().len(), GgmlType::ALL.len());
        for ty in GgmlType::ALL {
            let t = g.tensor(&format!("t.{ty}")).unwrap_or_else(|| panic!("t.{ty}"));
            assert_eq!((t.ggml_type, t.shape()), (ty, vec![3, 2 * ty.block_size()]));
            assert_eq!(t.data.len(), 6 * ty.type_size(), "{ty}");
            let values = crate::weights::quant::dequantize_to_vec(ty, t.data).unwrap();
            assert_eq!(values.len(), 6 * ty.block_size(), "{ty}");
            assert!(values.iter().all(|v| v.is_finite()), "{ty}");
        }
        // The table's block size also bounds the rows of the new types.
        let e = parse_err(with_infos(&[info("q", &[128, 2], GgmlType::IQ2_XXS, 0)], &[0; 66]));
        assert!(e.contains("row length 128") && e.contains("IQ2_XXS blocks of 256"), "{e}");
        let e = parse_err(with_infos(&[info("q", &[16], GgmlType::MXFP4, 0)], &[0; 32]));
        assert!(e.contains("MXFP4 blocks of 32"), "{e}");
    }

    // ---- hostile input: each is an error, never a panic ----

    fn parse_err(bytes: Vec<u8>) -> String {
        Gguf::parse(bytes).unwrap_err().to_string()
    }

    #[track_caller]
    fn assert_err(bytes: Vec<u8>, needle: &str) {
        let e = parse_err(bytes);
        assert!(e.contains(needle), "error \"{e}\" does not contain \"{needle}\"");
    }

    fn with_kv(key: &'static str, v: W) -> Vec<u8> {
        file(3, &[("general.architecture", "llama".into()), (key, v)], &[], 32, &[])
    }

    fn with_infos(infos: &[Info], data: &[u8]) -> Vec<u8> {
        file(3, &[], infos, 32, data)
    }

    fn patch(mut bytes: Vec<u8>, at: usize, with: &[u8]) -> Vec<u8> {
        bytes[at..at + with.len()].copy_from_slice(with);
        bytes
    }

    #[test]
    fn truncated_at_every_length() {
        let bytes = sample(3, Some(64));
        for len in 0..bytes.len() {
            assert!(Gguf::parse(&bytes[..len]).is_err(), "a {len}-byte prefix parsed");
        }
        assert_err(bytes[..20].to_vec(), "the file ends while reading the metadata key/value count");
    }

    #[test]
    fn bad_magic() {
        assert_err(patch(sample(3, None), 0, b"GGML"), "not a GGUF file: it starts with \"GGML\"");
    }

    #[test]
    fn unsupported_versions() {
        assert_err(sample(1, None), "GGUF version 1");
        assert_err(sample(4, None), "unsupported GGUF version 4");
    }

    #[test]
    fn big_endian_is_named() {
        assert_err(patch(sample(3, None), 4, &3u32.to_be_bytes()), "big-endian GGUF");
    }

    #[test]
    fn tensor_count_larger_than_file() {
        assert_err(patch(sample(3, None), 8, &(1u64 << 40).to_le_bytes()), "tensor infos");
        assert_err(patch(sample(3, None), 8, &u64::MAX.to_le_bytes()), "tensor infos");
    }

    #[test]
    fn kv_count_larger_than_file() {
        assert_err(patch(sample(3, None), 16, &(1u64 << 40).to_le_bytes()), "metadata key/values");
        assert_err(patch(sample(3, None), 16, &u64::MAX.to_le_bytes()), "metadata key/values");
    }

    #[test]
    fn string_length_larger_than_file() {
        // The first key's length.
        assert_err(
            patch(sample(3, None), 24, &(1u64 << 62).to_le_bytes()),
            "a metadata key of 4611686018427387904 bytes runs past the end of the file",
        );
        let mut value = vec![];
        put_str(&mut value, "x");
        value[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_err(with_kv("k", W::Raw(8, value)), "metadata \"k\"");
    }

    #[test]
    fn array_count_larger_than_file() {
        let arr = |elem: u32, n: u64| [elem.to_le_bytes().as_slice(), &n.to_le_bytes()].concat();
        assert_err(with_kv("k", W::Raw(9, arr(8, 1 << 40))), "STRING array elements");
        assert_err(with_kv("k", W::Raw(9, arr(10, u64::MAX))), "UINT64 array elements");
        assert_err(with_kv("k", W::Raw(9, arr(9, 1 << 61))), "ARRAY array elements");
    }

    #[test]
    fn unknown_metadata_value_type() {
        assert_err(with_kv("k", W::Raw(13, vec![0; 8])), "metadata \"k\": unknown value type 13");
        let arr = [99u32.to_le_bytes().as_slice(), &0u64.to_le_bytes()].concat();
        assert_err(with_kv("k", W::Raw(9, arr)), "unknown array element type 99");
    }

    #[test]
    fn bad_bool_and_bad_utf8() {
        assert_err(with_kv("k", W::Raw(7, vec![2])), "is 2, not 0 or 1");
        // The first byte of the first key ("general.architecture").
        assert_err(patch(with_kv("k", 0u8.into()), 32, &[0xff]), "is not UTF-8");
    }

    #[test]
    fn arrays_nested_too_deep() {
        let nested = |depth| {
            let innermost = Value::array(ValueType::U8, vec![Value::U8(9)]);
            W::V((1..depth).fold(innermost, |v, _| Value::array(ValueType::Array, vec![v])))
        };
        let g = Gguf::parse(with_kv("k", nested(MAX_ARRAY_DEPTH))).unwrap();
        let mut v = g.get("k").unwrap();
        for _ in 1..MAX_ARRAY_DEPTH {
            v = v.as_array().unwrap().iter().next().unwrap();
        }
        assert_eq!(v.as_array().unwrap().iter().collect::<Vec<_>>(), [MetadataValue::U8(9)]);
        let deep = format!(
            "metadata \"k\": element {}: arrays nest more than {MAX_ARRAY_DEPTH} deep",
            "[0]".repeat(MAX_ARRAY_DEPTH)
        );
        assert_err(with_kv("k", nested(MAX_ARRAY_DEPTH + 1)), &deep);
    }

    #[test]
    fn large_vocab_loads_without_per_token_allocation() {
        let tokens: Vec<String> = (0..150_000).map(|i| format!("tok{i}")).collect();
        let mut value = 8u32.to_le_bytes().to_vec();
        value.extend((tokens.len() as u64).to_le_bytes());
        tokens.iter().for_each(|t| put_str(&mut value, t));
        let g = Gguf::parse(with_kv("tokenizer.ggml.tokens", W::Raw(9, value))).unwrap();
        let vocab = g.get_str_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(vocab.len(), tokens.len());
        assert!(vocab.iter().zip(&tokens).all(|(a, b)| a == b));
    }

    #[test]
    fn unknown_ggml_type_names_tensor_and_id() {
        let e = Gguf::parse(with_infos(&[Info { name: "blk.0.w", dims: vec![32], ty: 4, offset: 0 }], &[0; 32]))
            .unwrap_err();
        assert!(matches!(&e, WeightsError::Tensor { tensor, .. } if tensor == "blk.0.w"), "{e:?}");
        assert_eq!(e.to_string(), "<memory>: tensor \"blk.0.w\": unknown ggml type id 4");
        assert_err(with_infos(&[Info { name: "t", dims: vec![1], ty: 1000, offset: 0 }], &[0; 4]), "id 1000");
    }

    #[test]
    fn dims_product_overflows() {
        let e = parse_err(with_infos(&[info("big", &[1 << 40, 1 << 40], GgmlType::F32, 0)], &[]));
        assert!(e.contains("tensor \"big\"") && e.contains("overflows u64"), "{e}");
        // Elements fit but bytes do not.
        assert_err(with_infos(&[info("b", &[1 << 62], GgmlType::F32, 0)], &[]), "byte size");
        assert_err(with_infos(&[info("b", &[u64::MAX], GgmlType::I8, 0)], &[]), "out of range");
    }

    #[test]
    fn more_than_four_dims() {
        assert_err(with_infos(&[info("t", &[1; 5], GgmlType::F32, 0)], &[0; 4]), "tensor \"t\": has 5 dims");
    }

    #[test]
    fn quantized_rows_must_be_whole_blocks() {
        // 32 elements, one block's worth, but split over two rows of 16.
        assert_err(with_infos(&[info("q", &[16, 2], GgmlType::Q4_0, 0)], &[0; 18]), "row length 16");
        assert_err(with_infos(&[info("q", &[], GgmlType::Q8_0, 0)], &[0; 34]), "row length 1");
    }

    #[test]
    fn tensor_offset_past_end() {
        assert_err(with_infos(&[info("t", &[8], GgmlType::F32, 64)], &[0; 32]), "run past the end");
        assert_err(with_infos(&[info("t", &[9], GgmlType::F32, 0)], &[0; 32]), "run past the end");
        assert_err(with_infos(&[info("t", &[1], GgmlType::F32, u64::MAX - 31)], &[0; 32]), "run past the end");
    }

    #[test]
    fn misaligned_offset() {
        assert_err(
            with_infos(&[info("t", &[4], GgmlType::F32, 16)], &[0; 32]),
            "data offset 16 is not a multiple of general.alignment 32",
        );
    }

    #[test]
    fn overlapping_tensors() {
        let infos = [info("a", &[16], GgmlType::F32, 0), info("b", &[8], GgmlType::F32, 32)];
        assert_err(with_infos(&infos, &[0; 64]), "tensor \"b\": bytes");
        let infos = [info("a", &[16], GgmlType::F32, 32), info("b", &[16], GgmlType::F32, 0)];
        assert_err(with_infos(&infos, &[0; 96]), "overlap tensor \"b\"");
    }

    #[test]
    fn duplicate_tensor_names() {
        let infos = [info("a", &[8], GgmlType::F32, 0), info("a", &[8], GgmlType::F32, 32)];
        assert_err(with_infos(&infos, &[0; 64]), "tensor \"a\": the tensor name appears twice");
    }

    #[test]
    fn duplicate_keys() {
        let kvs = [("a.b", 1u32.into()), ("a.b", "x".into())];
        assert_err(file(3, &kvs, &[], 32, &[]), "metadata \"a.b\": the key appears twice");
    }

    #[test]
    fn alignment_must_be_a_power_of_two() {
        for a in [0, 3] {
            assert_err(
                with_kv("general.alignment", a.into()),
                &format!("general.alignment is {a}, not a non-zero power of two"),
            );
        }
        assert_err(with_kv("general.alignment", "32".into()), "general.alignment is STRING");
    }

    // ---- against gguf-py ----

    /// Writes a GGUF with `gguf.GGUFWriter` and describes what it wrote:
    /// metadata as given (floats rounded as stored), tensors with the offset
    /// and dims `gguf.GGUFReader` reads back.
    const GGUF_PY_WRITER: &str = r#"
import json, sys
import numpy as np
import gguf

T = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType
path, out = sys.argv[1], sys.argv[2]
w = gguf.GGUFWriter(path, "llama")
w.add_custom_alignment(64)
for key, value, vtype in [
    ("llama.context_length", 4096, T.UINT32),
    ("llama.block_count", 2, T.UINT64),
    ("test.u8", 200, T.UINT8),
    ("test.i8", -7, T.INT8),
    ("test.u16", 65535, T.UINT16),
    ("test.i16", -32768, T.INT16),
    ("test.i32", -123456, T.INT32),
    ("test.i64", -(2**40), T.INT64),
    ("test.u64", 2**63 + 5, T.UINT64),
    ("llama.attention.layer_norm_rms_epsilon", 1e-5, T.FLOAT32),
    ("test.f64", 0.1, T.FLOAT64),
    ("test.bool", True, T.BOOL),
    ("general.name", "tiny llama \u2713", T.STRING),
    ("tokenizer.ggml.tokens", ["<unk>", "<s>", "</s>", "\u2581the", "\u00e9"], T.ARRAY),
    ("tokenizer.ggml.scores", [0.0, -1.5, 0.1], T.ARRAY),
    ("tokenizer.ggml.token_type", [2, 3, 3, 1, 1], T.ARRAY),
    ("test.nested", [[1, 2], [3], [4, 5, 6]], T.ARRAY),
    ("test.nested_str", [["a", "b"], ["c"]], T.ARRAY),
]:
    w.add_key_value(key, value, vtype)

rng = np.random.default_rng(0)
tensors = [
    ("token_embd.weight", rng.standard_normal((6, 8)).astype(np.float32), None),
    ("output_norm.weight", rng.standard_normal(8).astype(np.float16), None),
    # Quantized tensors as raw bytes: rows of whole blocks.
    ("blk.0.attn_q.weight", rng.integers(0, 256, (3, 2 * 18), dtype=np.uint8), Q.Q4_0),
    ("blk.0.ffn_down.weight", rng.integers(0, 256, (2, 34), dtype=np.uint8), Q.Q8_0),
    ("rope_freqs", np.arange(5, dtype=np.int32), None),
]
for name, array, raw_dtype in tensors:
    w.add_tensor(name, array, raw_dtype=raw_dtype)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

def stored(value, vtype):
    if vtype == T.FLOAT32:
        return float(np.float32(value))
    if vtype == T.ARRAY:
        elem = T.get_type(value[0])
        return {"elem": elem.name, "items": [stored(v, elem) for v in value]}
    return value

metadata = [{"key": k, "type": v.type.name, "value": stored(v.value, v.type)} for k, v in w.kv_data[0].items()]
reader = gguf.GGUFReader(path)
assert [t.name for t in reader.tensors] == [t[0] for t in tensors]
described = []
for (name, array, raw_dtype), rt in zip(tensors, reader.tensors):
    shape = array.shape if raw_dtype is None else gguf.quant_shape_from_byte_shape(array.shape, raw_dtype)
    described.append({
        "name": name,
        "type": int(rt.tensor_type),
        "shape": [int(d) for d in shape],
        "dims": [int(d) for d in rt.shape],
        "offset": int(rt.data_offset),
        "data": array.tobytes().hex(),
    })
json.dump({"alignment": int(reader.alignment), "metadata": metadata, "tensors": described}, open(out, "w"))
"#;

    fn to_json(v: MetadataValue<'_>) -> serde_json::Value {
        use serde_json::{json, Value};
        match v {
            MetadataValue::F32(x) => json!(f64::from(x)),
            MetadataValue::F64(x) => json!(x),
            MetadataValue::Bool(b) => json!(b),
            MetadataValue::String(s) => json!(s),
            MetadataValue::Array(a) => {
                json!({"elem": a.elem_type().name(), "items": a.iter().map(to_json).collect::<Vec<Value>>()})
            }
            v => match v.as_u64() {
                Some(u) => json!(u),
                None => json!(v.as_i64().expect("an integer")),
            },
        }
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn reads_what_gguf_py_writes() {
        let python = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python"));
        assert!(python.exists(), "{} is missing: run `make setup` to create the venv with gguf-py", python.display());
        let dir = tempfile::tempdir().unwrap();
        let (path, json_path) = (dir.path().join("py.gguf"), dir.path().join("py.json"));
        let out = Command::new(python).arg("-c").arg(GGUF_PY_WRITER).arg(&path).arg(&json_path).output().unwrap();
        assert!(out.status.success(), "gguf-py writer failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let want: serde_json::Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();

        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.version(), 3);
        assert_eq!(g.alignment(), want["alignment"].as_u64().unwrap());
        assert_eq!(g.alignment(), 64);

        let want_meta = want["metadata"].as_array().unwrap();
        assert_eq!(g.metadata().len(), want_meta.len());
        for ((key, v), w) in g.metadata().zip(want_meta) {
            assert_eq!(key, w["key"], "metadata order");
            assert_eq!(v.value_type().name(), w["type"], "{key}");
            assert_eq!(to_json(v), w["value"], "{key}");
        }
        assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap(), ["<unk>", "<s>", "</s>", "\u{2581}the", "é"]);
        assert_eq!(g.get_u64("llama.block_count").unwrap(), 2);

        let want_tensors = want["tensors"].as_array().unwrap();
        assert_eq!(g.tensors().len(), want_tensors.len());
        for (t, w) in g.tensors().zip(want_tensors) {
            assert_eq!(t.name, w["name"]);
            assert_eq!(u64::from(t.ggml_type.id()), w["type"].as_u64().unwrap(), "{}", t.name);
            assert_eq!(serde_json::json!(t.shape()), w["shape"], "{}", t.name);
            assert_eq!(serde_json::json!(t.dims), w["dims"], "{}", t.name);
            assert_eq!(t.offset_in_file, w["offset"].as_u64().unwrap(), "{}", t.name);
            assert_eq!(hex(t.data), w["data"].as_str().unwrap(), "{}", t.name);
        }
        assert_eq!(g.tensor("blk.0.attn_q.weight").unwrap().ggml_type, GgmlType::Q4_0);
        assert_eq!(g.tensor("blk.0.attn_q.weight").unwrap().shape(), [3, 64]);
    }
}
