//! The safetensors format: `u64` little-endian header length `N`, `N` bytes
//! of JSON header, then the data section.
//!
//! The header maps each tensor name to `{"dtype", "shape", "data_offsets":
//! [begin, end]}` (offsets relative to the data section) plus an optional
//! `"__metadata__"` string map. The reader checks everything the spec
//! requires before handing out a view, so a hostile file is an error, never
//! a panic or an allocation sized by the file's claims.

use super::DType;
use super::WeightsError;
use memmap2::Mmap;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Element types safetensors defines, spelled as in the header.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StDType {
    /// Booleans, one byte each.
    BOOL,
    /// OCP MX FP4 (E2M1), two per byte.
    F4,
    /// OCP MX FP6, four per three bytes.
    F6_E2M3,
    /// OCP MX FP6 (E3M2), four per three bytes.
    F6_E3M2,
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// 8-bit float, 5 exponent and 2 mantissa bits.
    F8_E5M2,
    /// 8-bit float, 4 exponent and 3 mantissa bits.
    F8_E4M3,
    /// OCP MX scale: an 8-bit power of two.
    F8_E8M0,
    /// E4M3 with negative zero as NaN and its exponent bias shifted by one.
    F8_E4M3FNUZ,
    /// E5M2 with negative zero as NaN and its exponent bias shifted by one.
    F8_E5M2FNUZ,
    /// `i16`.
    I16,
    /// `u16`.
    U16,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// `i32`.
    I32,
    /// `u32`.
    U32,
    /// 32-bit IEEE float.
    F32,
    /// A complex number of two f32s.
    C64,
    /// 64-bit IEEE float.
    F64,
    /// `i64`.
    I64,
    /// `u64`.
    U64,
}

impl StDType {
    /// Every dtype, in the order the safetensors spec lists them.
    pub const ALL: [StDType; 22] = [
        StDType::BOOL,
        StDType::F4,
        StDType::F6_E2M3,
        StDType::F6_E3M2,
        StDType::U8,
        StDType::I8,
        StDType::F8_E5M2,
        StDType::F8_E4M3,
        StDType::F8_E8M0,
        StDType::F8_E4M3FNUZ,
        StDType::F8_E5M2FNUZ,
        StDType::I16,
        StDType::U16,
        StDType::F16,
        StDType::BF16,
        StDType::I32,
        StDType::U32,
        StDType::F32,
        StDType::C64,
        StDType::F64,
        StDType::I64,
        StDType::U64,
    ];

    /// The header's spelling: `F32`, `BF16`.
    pub fn name(self) -> &'static str {
        match self {
            StDType::BOOL => "BOOL",
            StDType::F4 => "F4",
            StDType::F6_E2M3 => "F6_E2M3",
            StDType::F6_E3M2 => "F6_E3M2",
            StDType::U8 => "U8",
            StDType::I8 => "I8",
            StDType::F8_E5M2 => "F8_E5M2",
            StDType::F8_E4M3 => "F8_E4M3",
            StDType::F8_E8M0 => "F8_E8M0",
            StDType::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            StDType::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            StDType::I16 => "I16",
            StDType::U16 => "U16",
            StDType::F16 => "F16",
            StDType::BF16 => "BF16",
            StDType::I32 => "I32",
            StDType::U32 => "U32",
            StDType::F32 => "F32",
            StDType::C64 => "C64",
            StDType::F64 => "F64",
            StDType::I64 => "I64",
            StDType::U64 => "U64",
        }
    }

    /// Bits per element (4 and 6 for the packed MX floats).
    pub fn size_in_bits(self) -> usize {
        match self {
            StDType::F4 => 4,
            StDType::F6_E2M3 | StDType::F6_E3M2 => 6,
            StDType::BOOL
            | StDType::U8
            | StDType::I8
            | StDType::F8_E5M2
            | StDType::F8_E4M3
            | StDType::F8_E8M0
            | StDType::F8_E4M3FNUZ
            | StDType::F8_E5M2FNUZ => 8,
            StDType::I16 | StDType::U16 | StDType::F16 | StDType::BF16 => 16,
            StDType::I32 | StDType::U32 | StDType::F32 => 32,
            StDType::C64 | StDType::F64 | StDType::I64 | StDType::U64 => 64,
        }
    }

    /// Bytes per element; `None` for the sub-byte F4 and F6 types.
    pub fn size_in_bytes(self) -> Option<usize> {
        let bits = self.size_in_bits();
        bits.is_multiple_of(8).then_some(bits / 8)
    }

    /// Bytes a tensor of `shape` occupies; `None` if that overflows or is not
    /// a whole number of bytes (an odd count of F4s).
    pub fn byte_len(self, shape: &[usize]) -> Option<u64> {
        let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))?;
        let bits = elements.checked_mul(self.size_in_bits() as u64)?;
        bits.is_multiple_of(8).then_some(bits / 8)
    }

    /// The graph element type with the same bytes, if there is one.
    pub fn to_graph_dtype(self) -> Option<DType> {
        match self {
            StDType::F32 => Some(DType::F32),
            StDType::F16 => Some(DType::F16),
            StDType::BF16 => Some(DType::BF16),
            StDType::BOOL => Some(DType::I1),
            StDType::I8 => Some(DType::I8),
            StDType::I16 => Some(DType::I16),
            StDType::I32 => Some(DType::I32),
            StDType::I64 => Some(DType::I64),
            StDType::U8 => Some(DType::UI8),
            StDType::U16 => Some(DType::UI16),
            StDType::U32 => Some(DType::UI32),
            _ => None,
        }
    }
}

impl From<DType> for StDType {
    fn from(d: DType) -> StDType {
        match d {
            DType::F32 => StDType::F32,
            DType::F16 => StDType::F16,
            DType::BF16 => StDType::BF16,
            DType::I1 => StDType::BOOL,
            DType::I8 => StDType::I8,
            DType::I16 => StDType::I16,
            DType::I32 => StDType::I32,
            DType::I64 => StDType::I64,
            DType::UI8 => StDType::U8,
            DType::UI16 => StDType::U16,
            DType::UI32 => StDType::U32,
        }
    }
}

impl fmt::Display for StDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StDType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        StDType::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| format!("unknown dtype \"{s}\""))
    }
}

/// One tensor of an open file; `data` borrows the memory map.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Its element type.
    pub dtype: StDType,
    /// Row-major, slowest dim first.
    pub shape: &'a [usize],
    /// The tensor's bytes (mapped, not copied).
    pub data: &'a [u8],
    /// Where `data` starts in the file.
    pub offset: u64,
}

#[derive(Debug)]
struct Entry {
    name: String,
    dtype: StDType,
    shape: Vec<usize>,
    /// Byte range within the data section.
    begin: usize,
    end: usize,
}

/// A memory-mapped, validated safetensors file.
#[derive(Debug)]
pub struct SafeTensors {
    path: PathBuf,
    map: Mmap,
    data_start: usize,
    /// Sorted by offset (file order).
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
}

/// A parsed header: data section start, entries sorted by offset, and `__metadata__`.
type ParsedHeader = (usize, Vec<Entry>, BTreeMap<String, String>);

/// The header of a safetensors file.
fn parse(path: &Path, map: &[u8]) -> Result<ParsedHeader, WeightsError> {
    let bad = |message: String| WeightsError::Format { path: path.to_path_buf(), message };
    let len = map.len() as u64;
    if len < 8 {
        return Err(bad(format!("file is {len} bytes, too short for the 8-byte header length")));
    }
    let header_len = u64::from_le_bytes(map[..8].try_into().expect("len >= 8 checked above"));
    // Checked against the file before anything is sized by it.
    if header_len > len - 8 {
        return Err(bad(format!("header length {header_len} runs past the end of the {len}-byte file")));
    }
    let data_start = 8 + header_len as usize;
    let text = std::str::from_utf8(&map[8..data_start]).map_err(|e| bad(format!("header is not UTF-8: {e}")))?;
    let header: Header =
        serde_json::from_str(text).map_err(|e| bad(format!("header is not a JSON object of tensors: {e}")))?;
    let data_len = len - 8 - header_len;

    let mut entries = Vec::with_capacity(header.tensors.len());
    for (name, raw) in header.tensors {
        let tensor_err =
            |message: String| WeightsError::Tensor { path: path.to_path_buf(), tensor: name.clone(), message };
        let dtype: StDType = raw.dtype.parse().map_err(tensor_err)?;
        let [begin, end] = raw.data_offsets;
        if end < begin {
            return Err(tensor_err(format!("data_offsets [{begin}, {end}] end before they begin")));
        }
        if end > data_len {
            return Err(tensor_err(format!("data_offsets [{begin}, {end}] run past the {data_len}-byte data section")));
        }
        let need = dtype.byte_len(&raw.shape).ok_or_else(|| {
            tensor_err(format!("shape {:?} of {dtype} overflows or is not a whole number of bytes", raw.shape))
        })?;
        if need != end - begin {
            return Err(tensor_err(format!(
                "shape {:?} of {dtype} is {need} bytes, but data_offsets [{begin}, {end}] hold {}",
                raw.shape,
                end - begin
            )));
        }
        // Both fit: they are at most the file length, which the map fits.
        entries.push(Entry { name, dtype, shape: raw.shape, begin: begin as usize, end: end as usize });
    }

    // The spec requires the tensors to tile the data section exactly.
    entries.sort_by_key(|e| (e.begin, e.end));
    let mut covered = 0;
    for (i, e) in entries.iter().enumerate() {
        let tensor_err =
            |message: String| WeightsError::Tensor { path: path.to_path_buf(), tensor: e.name.clone(), message };
        if e.begin < covered {
            let prev = &entries[i - 1].name;
            return Err(tensor_err(format!("bytes {}..{} overlap tensor \"{prev}\"", e.begin, e.end)));
        }
        if e.begin > covered {
            return Err(tensor_err(format!(
                "starts at {}, leaving bytes {covered}..{} of the data section unused",
                e.begin, e.begin
            )));
        }
        covered = e.end;
    }
    if covered as u64 != data_len {
        return Err(bad(format!("bytes {covered}..{data_len} of the data section belong to no tensor")));
    }

    Ok((data_start, entries, header.metadata))
}

impl SafeTensors {
    /// Maps `path` and validates its header: every tensor in bounds, the data
    /// section covered exactly.
    pub fn open(path: &Path) -> Result<SafeTensors, WeightsError> {
        let io = |error| WeightsError::Io { path: path.to_path_buf(), error };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this value; like every
        // mmap reader we rely on nobody truncating or rewriting the file while
        // it is open (kiln writes files by atomic rename, never in place).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (data_start, entries, metadata) = parse(path, &map)?;
        let by_name = entries.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect();
        Ok(SafeTensors { path: path.to_path_buf(), map, data_start, entries, by_name, metadata })
    }

    /// Validates a whole file held in memory and returns its tensor count:
    /// the entry point for fuzzing the header parser.
    pub fn validate(bytes: &[u8]) -> Result<usize, WeightsError> {
        Ok(parse(Path::new("<memory>"), bytes)?.1.len())
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Drops `bytes` (a view of this file that a streaming reader is done
    /// with) and the MiB before them from resident memory, as
    /// [`crate::weights::gguf::Gguf::release`] does.
    pub fn release(&self, bytes: &[u8]) {
        super::release_pages(&self.map, bytes);
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.entries.iter().map(|e| self.view(e))
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.by_name.get(name).map(|&i| self.view(&self.entries[i]))
    }

    /// The header's `__metadata__` (empty if absent).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    fn view<'a>(&'a self, e: &'a Entry) -> TensorView<'a> {
        TensorView {
            name: &e.name,
            dtype: e.dtype,
            shape: &e.shape,
            data: &self.map[self.data_start + e.begin..self.data_start + e.end],
            offset: (self.data_start + e.begin) as u64,
        }
    }
}

/// Writes `tensors` (name, dtype, shape, little-endian bytes) and `metadata`
/// to `path` atomically: through a temporary file in the same directory and
/// a rename, so on any error nothing new is left at `path`.
pub fn write(
    path: &Path,
    tensors: &[(&str, StDType, &[usize], &[u8])],
    metadata: &BTreeMap<String, String>,
) -> Result<(), WeightsError> {
    let io = |error| WeightsError::Io { path: path.to_path_buf(), error };
    let mut seen = HashSet::new();
    for &(name, dtype, shape, data) in tensors {
        let tensor_err =
            |message: String| WeightsError::Tensor { path: path.to_path_buf(), tensor: name.to_string(), message };
        if name == "__metadata__" {
            return Err(tensor_err("the name is reserved for the metadata".into()));
        }
        if !seen.insert(name) {
            return Err(tensor_err("given twice".into()));
        }
        let need = dtype.byte_len(shape);
        if need != Some(data.len() as u64) {
            let need = need.map_or("overflowing or fractional".to_string(), |n| n.to_string());
            return Err(tensor_err(format!(
                "shape {shape:?} of {dtype} is {need} bytes, but {} were given",
                data.len()
            )));
        }
    }
    // Widest elements first (stably): with the 8-byte-aligned header every
    // tensor then starts aligned to its element size, as the reference
    // writer arranges, so readers may view the data in place.
    let mut order: Vec<&(&str, StDType, &[usize], &[u8])> = tensors.iter().collect();
    order.sort_by_key(|t| Reverse(t.1.size_in_bits()));

    use serde_json::{Map, Value as Json};
    let mut header = Map::new();
    if !metadata.is_empty() {
        let meta = metadata.iter().map(|(k, v)| (k.clone(), Json::from(v.as_str()))).collect();
        header.insert("__metadata__".into(), Json::Object(meta));
    }
    let mut offset = 0;
    for (name, dtype, shape, data) in &order {
        let end = offset + data.len();
        let info = Map::from_iter([
            ("dtype".to_string(), Json::from(dtype.name())),
            ("shape".to_string(), Json::from(shape.to_vec())),
            ("data_offsets".to_string(), Json::from(vec![offset, end])),
        ]);
        header.insert(name.to_string(), Json::Object(info));
        offset = end;
    }
    let mut text = Json::Object(header).to_string();
    // Padding keeps the data section 8-byte aligned.
    text.extend(std::iter::repeat_n(' ', text.len().next_multiple_of(8) - text.len()));

    // On failure the temporary file is dropped, which deletes it.
    crate::write_atomically_with(path, |out| {
        out.write_all(&(text.len() as u64).to_le_bytes())?;
        out.write_all(text.as_bytes())?;
        order.iter().try_for_each(|(.., data)| out.write_all(data))
    })
    .map_err(io)
}

/// A header entry as written, before validation.
#[derive(Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

/// The header in file order, read with a visitor rather than into a map so
/// that a name given twice is an error instead of "the last one wins".
struct Header {
    metadata: BTreeMap<String, String>,
    tensors: Vec<(String, RawInfo)>,
}

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HeaderVisitor;

        impl<'de> Visitor<'de> for HeaderVisitor {
            type Value = Header;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of tensor entries")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Header, A::Error> {
                let mut header = Header { metadata: BTreeMap::new(), tensors: Vec::new() };
                let mut seen = HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom(format!("\"{key}\" appears twice")));
                    }
                    let context = |e: A::Error| de::Error::custom(format!("\"{key}\": {e}"));
                    if key == "__metadata__" {
                        header.metadata = map.next_value().map_err(context)?;
                    } else {
                        let info = map.next_value().map_err(context)?;
                        header.tensors.push((key, info));
                    }
                }
                Ok(header)
            }
        }

        deserializer.deserialize_map(HeaderVisitor)
    }
}

/// A sharded checkpoint: `model.safetensors.index.json` maps each tensor to
/// the shard file that holds it; every shard is memory-mapped.
#[derive(Debug)]
pub struct ShardedSafeTensors {
    shards: Vec<SafeTensors>,
    /// Tensor name → index into `shards`.
    weight_map: BTreeMap<String, usize>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

impl ShardedSafeTensors {
    /// Opens the index and every shard it names; each tensor of the index
    /// must be in its shard, and each shard tensor in the index.
    pub fn open(index: &Path) -> Result<ShardedSafeTensors, WeightsError> {
        let bad = |message: String| WeightsError::Format { path: index.to_path_buf(), message };
        let text = std::fs::read_to_string(index).map_err(|error| WeightsError::Io { path: index.into(), error })?;
        let parsed: ShardIndex =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a safetensors index (needs weight_map): {e}")))?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut files: Vec<String> = parsed.weight_map.values().cloned().collect();
        files.sort_unstable();
        files.dedup();
        let mut shards = Vec::with_capacity(files.len());
        for f in &files {
            if Path::new(f).components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
                return Err(bad(format!("shard \"{f}\" must be a plain file name next to the index")));
            }
            shards.push(SafeTensors::open(&dir.join(f))?);
        }
        let mut weight_map = BTreeMap::new();
        for (tensor, file) in parsed.weight_map {
            let shard = files.binary_search(&file).expect("every file of the map is in `files`");
            if shards[shard].get(&tensor).is_none() {
                return Err(bad(format!("tensor \"{tensor}\" is mapped to {file}, which does not contain it")));
            }
            weight_map.insert(tensor, shard);
        }
        for shard in &shards {
            if let Some(t) = shard.tensors().find(|t| !weight_map.contains_key(t.name)) {
                return Err(bad(format!(
                    "{} holds \"{}\", which the index does not list",
                    shard.path().display(),
                    t.name
                )));
            }
        }
        Ok(ShardedSafeTensors { shards, weight_map })
    }

    /// The shard files, sorted by file name.
    pub fn shards(&self) -> &[SafeTensors] {
        &self.shards
    }

    /// All tensors, by name.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.weight_map.iter().filter_map(|(name, &i)| self.shards[i].get(name))
    }

    /// The tensor called `name`, from whichever shard holds it.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.weight_map.get(name).and_then(|&i| self.shards[i].get(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn bytes<T: Copy, const N: usize>(xs: [T; N], f: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
        xs.iter().flat_map(|&x| f(x)).collect()
    }

    /// A file with `header` (JSON text, unpadded) and `data`, built by hand.
    fn raw_file(dir: &Path, header: &str, data: &[u8]) -> PathBuf {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        let path = dir.join("raw.safetensors");
        std::fs::write(&path, b).unwrap();
        path
    }

    fn open_err(dir: &Path, header: &str, data: &[u8]) -> String {
        SafeTensors::open(&raw_file(dir, header, data)).unwrap_err().to_string()
    }

    #[test]
    fn write_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let f32s = bytes([1.0f32, -2.0, 3.5, 0.25, 5.0, 6.0], f32::to_le_bytes);
        let halfs: Vec<u8> = [1.5f32, -0.5].iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect();
        let bf: Vec<u8> = bf16::from_f32(-3.0).to_le_bytes().to_vec();
        let ints = 7i64.to_le_bytes();
        let tensors: Vec<(&str, StDType, &[usize], &[u8])> = vec![
            ("flags", StDType::BOOL, &[3], &[1, 0, 1]),
            ("w", StDType::F32, &[2, 3], &f32s),
            ("h", StDType::F16, &[2], &halfs),
            ("scalar", StDType::BF16, &[], &bf),
            ("empty", StDType::I32, &[0, 4], &[]),
            ("count", StDType::I64, &[1], &ints),
            ("packed", StDType::F4, &[2], &[0x21]),
        ];
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        write(&path, &tensors, &meta).unwrap();

        let st = SafeTensors::open(&path).unwrap();
        assert_eq!(st.metadata(), &meta);
        // File order is widest-first, stable among equals.
        let names: Vec<&str> = st.tensors().map(|t| t.name).collect();
        assert_eq!(names, ["count", "w", "empty", "h", "scalar", "flags", "packed"]);
        for &(name, dtype, shape, data) in &tensors {
            let t = st.get(name).unwrap();
            assert_eq!((t.name, t.dtype, t.shape, t.data), (name, dtype, shape, data));
        }
        assert!(st.get("nope").is_none());
        // Every tensor starts aligned to its element size.
        for t in st.tensors() {
            let at = t.data.as_ptr() as usize - st.map.as_ptr() as usize;
            assert_eq!(at % t.dtype.size_in_bytes().unwrap_or(1), 0, "{}", t.name);
        }
    }

    #[test]
    fn empty_file_and_empty_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.safetensors");
        write(&path, &[], &BTreeMap::new()).unwrap();
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(&raw[..8], &8u64.to_le_bytes());
        assert_eq!(&raw[8..], b"{}      ");
        let st = SafeTensors::open(&path).unwrap();
        assert_eq!(st.tensors().count(), 0);
        assert!(st.metadata().is_empty());
    }

    #[test]
    fn writer_rejects_bad_tensors_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.safetensors");
        let meta = BTreeMap::new();
        let e = write(&path, &[("x", StDType::F32, &[3], &[0; 8])], &meta).unwrap_err().to_string();
        assert!(e.ends_with("tensor \"x\": shape [3] of F32 is 12 bytes, but 8 were given"), "{e}");
        let dup: Vec<(&str, StDType, &[usize], &[u8])> =
            vec![("x", StDType::U8, &[1], &[0]), ("x", StDType::U8, &[1], &[0])];
        assert!(write(&path, &dup, &meta).unwrap_err().to_string().contains("given twice"));
        assert!(write(&path, &[("x", StDType::F4, &[3], &[0, 0])], &meta).is_err());
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no temporary files left");
        let missing_dir = dir.path().join("no/such/dir/x.safetensors");
        assert!(write(&missing_dir, &[], &meta).is_err());
    }

    #[test]
    fn hostile_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let t = |s: &str| format!(r#"{{"t":{s}}}"#);
        // `"name": U8 tensor over data bytes begin..end`.
        let u8s = |name: &str, begin: usize, end: usize| {
            format!(r#""{name}":{{"dtype":"U8","shape":[{}],"data_offsets":[{begin},{end}]}}"#, end - begin)
        };
        // Truncated: shorter than the length prefix.
        std::fs::write(d.join("short"), [1, 2, 3]).unwrap();
        let e = SafeTensors::open(&d.join("short")).unwrap_err().to_string();
        assert!(e.contains("too short"), "{e}");
        // A header length of 2^64 - 1 must not be allocated or trusted.
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        std::fs::write(d.join("huge"), huge).unwrap();
        let e = SafeTensors::open(&d.join("huge")).unwrap_err().to_string();
        assert!(e.contains("runs past the end of the 10-byte file"), "{e}");
        let mut latin1 = 2u64.to_le_bytes().to_vec();
        latin1.extend_from_slice(&[0xff, 0xfe]);
        std::fs::write(d.join("latin1"), latin1).unwrap();
        let e = SafeTensors::open(&d.join("latin1")).unwrap_err().to_string();
        assert!(e.contains("header is not UTF-8"), "{e}");

        let cases: &[(&str, &[u8], &str)] = &[
            ("{\"t\": {", &[], "not a JSON object"),
            ("[1, 2]", &[], "not a JSON object"),
            ("null", &[], "not a JSON object"),
            (&t(r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#), &[0; 2], "run past the 2-byte data section"),
            (&t(r#"{"dtype":"F32","shape":[1],"data_offsets":[4,0]}"#), &[0; 4], "end before they begin"),
            (&t(r#"{"dtype":"F9","shape":[1],"data_offsets":[0,4]}"#), &[0; 4], "unknown dtype \"F9\""),
            (
                &t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,4]}"#),
                &[0; 4],
                "is 8 bytes, but data_offsets [0, 4] hold 4",
            ),
            (&t(r#"{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}"#), &[0; 4], "overflows"),
            (&t(r#"{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}"#), &[0; 4], "\"t\""),
            (&t(r#"{"dtype":"F32","shape":[1]}"#), &[0; 4], "data_offsets"),
            (&format!("{{{},{}}}", u8s("a", 0, 2), u8s("b", 1, 3)), &[0; 3], "overlap tensor \"a\""),
            (&format!("{{{}}}", u8s("a", 1, 2)), &[0; 2], "bytes 0..1 of the data section unused"),
            (&format!("{{{}}}", u8s("a", 0, 1)), &[0; 2], "bytes 1..2 of the data section belong to no tensor"),
            (&format!("{{{},{}}}", u8s("a", 0, 1), u8s("a", 1, 2)), &[0; 2], "\"a\" appears twice"),
            (r#"{"__metadata__":{"k":1}}"#, &[], "\"__metadata__\""),
        ];
        for (header, data, needle) in cases {
            let e = open_err(d, header, data);
            assert!(e.contains(needle), "header {header}: error '{e}' should contain '{needle}'");
            assert!(e.starts_with(&d.join("raw.safetensors").display().to_string()), "{e}");
        }
        // The header is named in per-tensor errors.
        let e = open_err(d, &t(r#"{"dtype":"F9","shape":[1],"data_offsets":[0,4]}"#), &[0; 4]);
        assert!(e.contains("tensor \"t\": unknown dtype"), "{e}");
    }

    #[test]
    fn dtype_names_round_trip() {
        for d in StDType::ALL {
            assert_eq!(d.name().parse::<StDType>().unwrap(), d);
        }
        for d in DType::ALL {
            assert_eq!(StDType::from(d).to_graph_dtype(), Some(d));
            assert_eq!(StDType::from(d).size_in_bytes(), Some(d.size_in_bytes()));
        }
        assert_eq!(StDType::F4.byte_len(&[3]), None);
        assert_eq!(StDType::F6_E2M3.byte_len(&[4]), Some(3));
        assert_eq!(StDType::U64.byte_len(&[usize::MAX, 2]), None);
    }

    #[test]
    fn sharded_index_maps_tensors_to_shards() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = ([1u8, 0, 128, 63], [0u8, 0, 0, 64]);
        let none = BTreeMap::new();
        write(&dir.path().join("m-1.safetensors"), &[("a", StDType::F32, &[1], &a)], &none).unwrap();
        write(&dir.path().join("m-2.safetensors"), &[("b", StDType::F32, &[1], &b)], &none).unwrap();
        let index = dir.path().join("model.safetensors.index.json");
        std::fs::write(&index, r#"{"metadata": {}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}"#)
            .unwrap();
        let s = ShardedSafeTensors::open(&index).unwrap();
        assert_eq!(s.shards().len(), 2);
        assert_eq!(s.get("b").unwrap().data, &b);
        assert_eq!(s.tensors().count(), 2);

        std::fs::write(&index, r#"{"weight_map": {"a": "m-2.safetensors", "b": "m-2.safetensors"}}"#).unwrap();
        let e = ShardedSafeTensors::open(&index).unwrap_err().to_string();
        assert!(e.contains("\"a\" is mapped to m-2.safetensors"), "{e}");
        std::fs::write(&index, r#"{"weight_map": {"a": "../m-1.safetensors"}}"#).unwrap();
        assert!(ShardedSafeTensors::open(&index).is_err());
        std::fs::write(&index, r#"{"weight_map": {"a": "m-1.safetensors"}, "x": 1}"#).unwrap();
        assert!(ShardedSafeTensors::open(&index).is_ok());
        std::fs::write(&index, r#"{"weight_map": {"a": "m-1.safetensors", "b": "m-1.safetensors"}}"#).unwrap();
        assert!(ShardedSafeTensors::open(&index).is_err());
    }
}
