//! `.irpa` archives of params derived from a checkpoint: each entry is a
//! source tensor (quantized ggml blocks, or dense) converted to f32, f16 or
//! bf16, streamed chunk by chunk into [`irpa::write_archive`].
//!
//! This is the ahead-of-time alternative to dequantizing inside the graph
//! (the Keep policy of [`crate::models`]): the module then reads dense
//! params with `--parameters=SCOPE=FILE.irpa`. Memory stays bounded
//! whatever the tensor sizes: a chunk of about 1 MiB of output (whole ggml
//! blocks), its f32 values, and the writer's 1 MiB buffer. The source is
//! only read, typically straight from a memory-mapped checkpoint.

use super::ggml::GgmlType;
use super::irpa::{self, ArchiveSummary, EntrySpec};
use super::quant;
use super::DType;
use super::WeightsError;
use half::{bf16, f16};
use std::fmt;
use std::io;
use std::path::Path;

/// How a source tensor's bytes are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// ggml blocks (a GGUF tensor), quantized or plain.
    Ggml(GgmlType),
    /// Dense little-endian elements (a safetensors tensor).
    Dense(DType),
}

impl From<GgmlType> for Encoding {
    fn from(ty: GgmlType) -> Self {
        Encoding::Ggml(ty)
    }
}

impl From<DType> for Encoding {
    fn from(dtype: DType) -> Self {
        Encoding::Dense(dtype)
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Encoding::Ggml(ty) => write!(f, "ggml {ty}"),
            Encoding::Dense(dtype) => write!(f, "dense {dtype}"),
        }
    }
}

impl Encoding {
    /// The dense dtype whose bytes these are, if any: copying needs no conversion.
    fn dense(self) -> Option<DType> {
        match self {
            Encoding::Dense(dtype) => Some(dtype),
            Encoding::Ggml(GgmlType::F32) => Some(DType::F32),
            Encoding::Ggml(GgmlType::F16) => Some(DType::F16),
            Encoding::Ggml(GgmlType::BF16) => Some(DType::BF16),
            Encoding::Ggml(GgmlType::I8) => Some(DType::I8),
            Encoding::Ggml(GgmlType::I16) => Some(DType::I16),
            Encoding::Ggml(GgmlType::I32) => Some(DType::I32),
            Encoding::Ggml(GgmlType::I64) => Some(DType::I64),
            Encoding::Ggml(_) => None,
        }
    }

    /// The ggml type whose dequantizer reads these bytes as f32, if any.
    fn ggml(self) -> Option<GgmlType> {
        match self {
            Encoding::Ggml(ty) => Some(ty),
            Encoding::Dense(DType::F32) => Some(GgmlType::F32),
            Encoding::Dense(DType::F16) => Some(GgmlType::F16),
            Encoding::Dense(DType::BF16) => Some(GgmlType::BF16),
            Encoding::Dense(DType::I8) => Some(GgmlType::I8),
            Encoding::Dense(DType::I16) => Some(GgmlType::I16),
            Encoding::Dense(DType::I32) => Some(GgmlType::I32),
            Encoding::Dense(DType::I64) => Some(GgmlType::I64),
            Encoding::Dense(DType::I1 | DType::UI8 | DType::UI16 | DType::UI32) => None,
        }
    }
}

/// Where a param's bytes are in the checkpoint.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// One stored tensor's bytes.
    Tensor(&'a [u8]),
    /// Runs of stored bytes joined end to end: a stack of experts' matrices
    /// that an HF checkpoint keeps apart (or interleaved with others). No
    /// file holds the param as such, so it is never read in place.
    Joined(&'a [&'a [u8]]),
    /// Bytes that no runs of stored ones are (a transposed stack of
    /// experts), assembled at export; never read in place either.
    Assembled(&'a dyn Assembled),
}

/// A param's bytes assembled from stored ones, in pieces: the archive
/// writer asks for one chunk at a time, so memory stays that of a chunk.
pub trait Assembled: std::fmt::Debug + Sync {
    /// The param's bytes in all.
    fn byte_len(&self) -> usize;

    /// Appends the param's bytes `[start, start + len)` to `out`.
    fn read_into(&self, start: usize, len: usize, out: &mut Vec<u8>);

    /// The stored bytes it reads, released from memory once written.
    fn stored(&self) -> &[u8];
}

impl<'a> Source<'a> {
    /// The runs of stored bytes, in order; none for assembled bytes.
    fn parts(&self) -> &[&'a [u8]] {
        match self {
            Source::Tensor(bytes) => std::slice::from_ref(bytes),
            Source::Joined(parts) => parts,
            Source::Assembled(_) => &[],
        }
    }

    /// The param's bytes in all.
    pub fn len(&self) -> usize {
        match self {
            Source::Assembled(a) => a.byte_len(),
            _ => self.parts().iter().map(|p| p.len()).sum(),
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The runs joined, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        match self {
            Source::Assembled(a) => {
                let mut out = Vec::with_capacity(a.byte_len());
                a.read_into(0, a.byte_len(), &mut out);
                out
            }
            _ => self.parts().concat(),
        }
    }

    /// Calls `each` with the bytes in pieces of at most `size` (whole
    /// pieces of a run: a multiple of `size`'s granule stays one).
    fn for_each_chunk(&self, size: usize, mut each: impl FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        let size = size.max(1);
        match self {
            Source::Assembled(a) => {
                let mut buffer = Vec::with_capacity(size.min(a.byte_len()));
                for start in (0..a.byte_len()).step_by(size) {
                    buffer.clear();
                    a.read_into(start, size.min(a.byte_len() - start), &mut buffer);
                    each(&buffer)?;
                }
                Ok(())
            }
            _ => self.parts().iter().flat_map(|part| part.chunks(size)).try_for_each(each),
        }
    }
}

/// One archive entry: `source`, encoded as `encoding`, stored as `target`.
#[derive(Clone, Copy, Debug)]
pub struct DerivedParam<'a> {
    /// The entry's name: the key of `#flow.parameter.named<"scope"::"key">`.
    pub name: &'a str,
    /// The bytes as the checkpoint stores them.
    pub source: Source<'a>,
    /// How `source` is encoded: a ggml type or a dense dtype.
    pub encoding: Encoding,
    /// f32, f16 or bf16; or the source's own dense dtype, which copies it.
    pub target: DType,
}

/// Output bytes per chunk: large enough for the writes to be efficient,
/// small enough to keep memory flat.
const CHUNK_BYTES: usize = 1 << 20;

/// Writes `params` to an IREE parameter archive at `path`, converting each
/// source to its target dtype chunk by chunk. Every entry is checked before
/// the file is touched; the archive appears complete or not at all.
pub fn write_derived(path: &Path, params: &[DerivedParam<'_>]) -> Result<ArchiveSummary, WeightsError> {
    write_in_chunks(path, params, CHUNK_BYTES, &mut |_, _| {})
}

/// [`write_derived`], calling `chunk_done(source, written)` after each
/// chunk with the source bytes it read and the bytes it wrote: for a
/// progress bar, and to release mapped source pages as the archive passes
/// them ([`crate::weights::gguf::Gguf::release`]).
pub fn write_derived_with(
    path: &Path,
    params: &[DerivedParam<'_>],
    chunk_done: &mut dyn FnMut(&[u8], u64),
) -> Result<ArchiveSummary, WeightsError> {
    write_in_chunks(path, params, CHUNK_BYTES, chunk_done)
}

/// The bytes each param takes in an archive.
pub fn derived_len(p: &DerivedParam<'_>) -> Result<u64, WeightsError> {
    Ok(plan(p, CHUNK_BYTES)?.1)
}

/// One param's derived bytes in memory (for inline params and the
/// interpreter): what [`write_derived`] would store for it.
pub fn derive_to_vec(p: &DerivedParam<'_>) -> Result<Vec<u8>, WeightsError> {
    match plan(p, usize::MAX)?.0 {
        Plan::Copy => Ok(p.source.to_vec()),
        Plan::Convert { from, .. } => {
            let values = quant::dequantize_to_vec(from, &p.source.to_vec())
                .map_err(|e| WeightsError::ArchiveEntry { entry: p.name.to_string(), message: e.to_string() })?;
            let mut bytes = Vec::new();
            encode(&values, p.target, &mut bytes);
            Ok(bytes)
        }
    }
}

impl<'a> DerivedParam<'a> {
    /// Whether the stored bytes already are the param's: it can be read
    /// from the source file as is.
    pub fn is_copy(&self) -> bool {
        self.in_place().is_some()
    }

    /// The param's bytes as one stored tensor, where they are that
    /// ([`DerivedParam::is_copy`]).
    pub fn in_place(&self) -> Option<&'a [u8]> {
        match self.source {
            Source::Tensor(bytes) if self.encoding.dense() == Some(self.target) => Some(bytes),
            _ => None,
        }
    }
}

/// How one entry's bytes are produced.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// The source already is the target's bytes.
    Copy,
    /// Dequantize `from` to f32, `values` per chunk (whole blocks), and round
    /// to the target.
    Convert { from: GgmlType, values: usize },
}

fn plan(p: &DerivedParam<'_>, chunk_bytes: usize) -> Result<(Plan, u64), WeightsError> {
    let err = |message: String| WeightsError::ArchiveEntry { entry: p.name.to_string(), message };
    if p.encoding.dense() == Some(p.target) {
        return Ok((Plan::Copy, p.source.len() as u64));
    }
    let from = match p.encoding.ggml() {
        Some(from) if p.target.is_float() => from,
        _ => {
            return Err(err(format!(
                "cannot convert {} to {}: targets are f32, f16 and bf16 from float, integer or ggml sources, \
                 or the source's own dtype (copied)",
                p.encoding, p.target
            )))
        }
    };
    let (type_size, block_size) = (from.type_size(), from.block_size());
    let lengths = match p.source {
        Source::Assembled(a) => vec![a.byte_len()],
        _ => p.source.parts().iter().map(|part| part.len()).collect(),
    };
    if let Some(len) = lengths.into_iter().find(|len| !len.is_multiple_of(type_size)) {
        return Err(err(format!(
            "{len} source bytes are not a whole number of {type_size}-byte {} blocks",
            p.encoding
        )));
    }
    let elements = (p.source.len() / type_size) as u64 * block_size as u64;
    let length = elements
        .checked_mul(p.target.size_in_bytes() as u64)
        .ok_or_else(|| err("the converted size overflows u64".into()))?;
    let blocks = (chunk_bytes / (block_size * p.target.size_in_bytes())).max(1);
    Ok((Plan::Convert { from, values: blocks * block_size }, length))
}

fn write_in_chunks(
    path: &Path,
    params: &[DerivedParam<'_>],
    chunk_bytes: usize,
    chunk_done: &mut dyn FnMut(&[u8], u64),
) -> Result<ArchiveSummary, WeightsError> {
    let mut plans = Vec::with_capacity(params.len());
    let mut specs = Vec::with_capacity(params.len());
    for p in params {
        let (plan, length) = plan(p, chunk_bytes)?;
        plans.push(plan);
        specs.push(EntrySpec::Data { name: p.name.to_string(), length });
    }
    // Reused across chunks and entries: memory is set by the largest chunk.
    let (mut values, mut bytes) = (Vec::<f32>::new(), Vec::<u8>::new());
    irpa::write_archive(path, &specs, |i, out| {
        let p = &params[i];
        match plans[i] {
            Plan::Copy => p.source.for_each_chunk(chunk_bytes, |c| {
                out.write_all(c)?;
                chunk_done(c, c.len() as u64);
                Ok(())
            })?,
            Plan::Convert { from, values: per_chunk } => {
                let source_chunk = per_chunk / from.block_size() * from.type_size();
                p.source.for_each_chunk(source_chunk, |src| {
                    let n = src.len() / from.type_size() * from.block_size();
                    values.resize(n, 0.0);
                    quant::dequantize(from, src, &mut values).map_err(io::Error::other)?;
                    encode(&values, p.target, &mut bytes);
                    out.write_all(&bytes)?;
                    chunk_done(src, bytes.len() as u64);
                    Ok(())
                })?
            }
        }
        // An assembled param read its stored bytes out of order: they are
        // released once it is written.
        if let Source::Assembled(a) = p.source {
            chunk_done(a.stored(), 0);
        }
        Ok(())
    })
}

/// `values` rounded to `target` (f32, f16 or bf16; round to nearest even),
/// little-endian, into `out`.
fn encode(values: &[f32], target: DType, out: &mut Vec<u8>) {
    let size = target.size_in_bytes();
    out.resize(values.len() * size, 0);
    match target {
        DType::F32 => {
            for (o, v) in out.as_chunks_mut::<4>().0.iter_mut().zip(values) {
                *o = v.to_le_bytes();
            }
        }
        DType::F16 => {
            for (o, v) in out.as_chunks_mut::<2>().0.iter_mut().zip(values) {
                *o = f16::from_f32(*v).to_le_bytes();
            }
        }
        DType::BF16 => {
            for (o, v) in out.as_chunks_mut::<2>().0.iter_mut().zip(values) {
                *o = bf16::from_f32(*v).to_le_bytes();
            }
        }
        other => unreachable!("plan() admits only float targets for conversion, got {other}"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::weights::irpa::IrpaArchive;

    /// `blocks` Q4_K blocks with random scales and quants, and finite
    /// super-block scales `d`, `dmin` (random f16 bits could be NaN).
    pub(crate) fn q4_k_blocks(blocks: usize, seed: u64) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut bytes: Vec<u8> = (0..blocks * GgmlType::Q4_K.type_size())
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        for (i, block) in bytes.chunks_exact_mut(GgmlType::Q4_K.type_size()).enumerate() {
            block[0..2].copy_from_slice(&f16::from_f32(0.01 + i as f32 * 1e-3).to_le_bytes()); // d
            block[2..4].copy_from_slice(&f16::from_f32(0.004).to_le_bytes()); // dmin
        }
        bytes
    }

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn bf16_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect()
    }

    fn entry_bytes(archive: &IrpaArchive, name: &str) -> Vec<u8> {
        let entry = archive.get(name).unwrap_or_else(|| panic!("no entry {name}"));
        archive.data(&entry).expect("a data entry").to_vec()
    }

    #[test]
    fn q4_k_and_f32_to_bf16_match_the_cpu_dequantizer() {
        let q4k = q4_k_blocks(5, 1);
        let dense: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let dense_src = f32_bytes(&dense);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("derived.irpa");
        let params = [
            DerivedParam {
                name: "blk.0.ffn_down.weight",
                source: Source::Tensor(&q4k),
                encoding: GgmlType::Q4_K.into(),
                target: DType::BF16,
            },
            DerivedParam {
                name: "output_norm.weight",
                source: Source::Tensor(&dense_src),
                encoding: DType::F32.into(),
                target: DType::BF16,
            },
        ];
        let summary = write_derived(&path, &params).unwrap();
        assert_eq!(summary.entries, 2);

        let archive = IrpaArchive::open(&path).unwrap();
        let want = bf16_bytes(&quant::dequantize_to_vec(GgmlType::Q4_K, &q4k).unwrap());
        assert_eq!(want.len(), 5 * 256 * 2);
        assert_eq!(entry_bytes(&archive, "blk.0.ffn_down.weight"), want);
        assert_eq!(entry_bytes(&archive, "output_norm.weight"), bf16_bytes(&dense));
    }

    #[test]
    fn copies_its_own_dtype_and_widens_floats() {
        let raw: Vec<u8> = (0..=255).collect();
        let halves: Vec<u8> = [1.5f32, -0.25, 65504.0].iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.irpa");
        let params = [
            DerivedParam { name: "u8", source: Source::Tensor(&raw), encoding: DType::UI8.into(), target: DType::UI8 },
            DerivedParam {
                name: "f16",
                source: Source::Tensor(&halves),
                encoding: GgmlType::F16.into(),
                target: DType::F16,
            },
            DerivedParam {
                name: "f16-as-f32",
                source: Source::Tensor(&halves),
                encoding: DType::F16.into(),
                target: DType::F32,
            },
        ];
        write_derived(&path, &params).unwrap();
        let archive = IrpaArchive::open(&path).unwrap();
        assert_eq!(entry_bytes(&archive, "u8"), raw);
        assert_eq!(entry_bytes(&archive, "f16"), halves);
        assert_eq!(entry_bytes(&archive, "f16-as-f32"), f32_bytes(&[1.5, -0.25, 65504.0]));
    }

    /// A joined source is its runs end to end, copied or converted; never
    /// read in place.
    #[test]
    fn joined_runs_are_written_end_to_end() {
        let values: Vec<f32> = (0..12).map(|i| i as f32 - 5.5).collect();
        let bytes = f32_bytes(&values);
        // The second and first thirds, then the last: a stack out of order.
        let runs = [&bytes[16..32], &bytes[..16], &bytes[32..]];
        let joined =
            |target| DerivedParam { name: "j", source: Source::Joined(&runs), encoding: DType::F32.into(), target };
        let want: Vec<f32> = [&values[4..8], &values[..4], &values[8..]].concat();
        let (copy, half) = (joined(DType::F32), joined(DType::BF16));
        assert!(!copy.is_copy() && copy.in_place().is_none());
        assert_eq!(derive_to_vec(&copy).unwrap(), f32_bytes(&want));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.irpa");
        // Chunks of 8 bytes: each run is split.
        write_in_chunks(&path, &[copy], 8, &mut |_, _| {}).unwrap();
        assert_eq!(entry_bytes(&IrpaArchive::open(&path).unwrap(), "j"), f32_bytes(&want));
        write_derived(&path, &[half]).unwrap();
        assert_eq!(entry_bytes(&IrpaArchive::open(&path).unwrap(), "j"), bf16_bytes(&want));
    }

    /// Chunks that split neither on a tensor's end nor on a round number
    /// give the same bytes as one chunk per tensor.
    #[test]
    fn chunk_boundaries_do_not_change_the_bytes() {
        let q4k = q4_k_blocks(7, 2);
        let dense: Vec<f32> = (0..1237).map(|i| i as f32 / 7.0 - 50.0).collect();
        let dense_src = f32_bytes(&dense);
        let params = [
            DerivedParam {
                name: "q",
                source: Source::Tensor(&q4k),
                encoding: GgmlType::Q4_K.into(),
                target: DType::BF16,
            },
            DerivedParam {
                name: "d",
                source: Source::Tensor(&dense_src),
                encoding: DType::F32.into(),
                target: DType::F16,
            },
            DerivedParam {
                name: "c",
                source: Source::Tensor(&dense_src),
                encoding: DType::F32.into(),
                target: DType::F32,
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        let whole = dir.path().join("whole.irpa");
        write_in_chunks(&whole, &params, 1 << 30, &mut |_, _| {}).unwrap();
        let whole = std::fs::read(&whole).unwrap();
        // 1: one block or one value per chunk; 1000: 1 Q4_K block (512 bytes
        // of bf16), 500 f16 values; 1537: 3 blocks, 768 values; and the default.
        for chunk in [1, 1000, 1537, CHUNK_BYTES] {
            let path = dir.path().join(format!("chunk{chunk}.irpa"));
            write_in_chunks(&path, &params, chunk, &mut |_, _| {}).unwrap();
            assert!(std::fs::read(&path).unwrap() == whole, "chunks of {chunk} bytes change the archive");
        }
        let archive = IrpaArchive::open(&dir.path().join("chunk1000.irpa")).unwrap();
        let halves: Vec<u8> = dense.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
        assert_eq!(entry_bytes(&archive, "d"), halves);
        assert_eq!(entry_bytes(&archive, "c"), dense_src);
    }

    #[test]
    fn bad_entries_are_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.irpa");
        let q4k = q4_k_blocks(1, 3);
        let cases: [(DerivedParam, &str); 3] = [
            (
                DerivedParam {
                    name: "w",
                    source: Source::Tensor(&q4k[..100]),
                    encoding: GgmlType::Q4_K.into(),
                    target: DType::F32,
                },
                "parameter entry \"w\": 100 source bytes are not a whole number of 144-byte ggml Q4_K blocks",
            ),
            (
                DerivedParam {
                    name: "w",
                    source: Source::Tensor(&q4k),
                    encoding: GgmlType::Q4_K.into(),
                    target: DType::I8,
                },
                "parameter entry \"w\": cannot convert ggml Q4_K to i8",
            ),
            (
                DerivedParam {
                    name: "u",
                    source: Source::Tensor(&q4k),
                    encoding: DType::UI8.into(),
                    target: DType::F32,
                },
                "parameter entry \"u\": cannot convert dense ui8 to f32",
            ),
        ];
        for (param, message) in cases {
            let e = write_derived(&path, &[param]).unwrap_err();
            assert!(e.to_string().starts_with(message), "{e}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing is written");
    }

    /// Throughput and peak memory for a 256 MiB Q4_K tensor → bf16 (953 MB
    /// written). Release only: `cargo test --release --lib archive_throughput -- --ignored --nocapture`.
    #[test]
    #[ignore = "writes ~1 GB; a measurement, not a check"]
    fn archive_throughput_256_mib_q4_k() {
        let rss_peak_kib = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            status.lines().find_map(|l| l.strip_prefix("VmHWM:")).map(|v| v.trim().to_string()).unwrap_or_default()
        };
        let blocks = (256 << 20) / GgmlType::Q4_K.type_size();
        let q4k = q4_k_blocks(blocks, 4);
        eprintln!("source {} MiB; peak RSS before: {}", q4k.len() >> 20, rss_peak_kib());
        // Dequantize and round alone, to tell compute from disk.
        let start = std::time::Instant::now();
        let (mut values, mut bytes) = (Vec::new(), Vec::new());
        let per_chunk = CHUNK_BYTES / (256 * 2) * GgmlType::Q4_K.type_size();
        for src in q4k.chunks(per_chunk) {
            values.resize(src.len() / GgmlType::Q4_K.type_size() * 256, 0.0);
            quant::dequantize(GgmlType::Q4_K, src, &mut values).unwrap();
            encode(&values, DType::BF16, &mut bytes);
        }
        eprintln!("dequantize + round alone: {:.2} s", start.elapsed().as_secs_f64());
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("big.irpa");
        let start = std::time::Instant::now();
        let param = DerivedParam {
            name: "w",
            source: Source::Tensor(&q4k),
            encoding: GgmlType::Q4_K.into(),
            target: DType::BF16,
        };
        let summary = write_derived(&path, &[param]).unwrap();
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "{} MB in {secs:.2} s: {:.0} MB/s of bf16 output, {:.0} MB/s of Q4_K input; peak RSS after: {}",
            summary.bytes_written / 1_000_000,
            summary.bytes_written as f64 / secs / 1e6,
            q4k.len() as f64 / secs / 1e6,
            rss_peak_kib()
        );
    }
}
