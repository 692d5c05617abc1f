//! IREE parameter archives (`.irpa`, format v0): a streaming writer and a
//! zero-copy, memory-mapped reader.
//!
//! The layout is IREE's (`iree/schemas/parameter_archive.h`; the writer
//! mirrors `irpa_builder.c` byte for byte, the reader is at least as strict
//! as `irpa_parser.c`). Little-endian, packed, all offsets u64:
//!
//! ```text
//! 0    header (88 bytes): magic "IRPA", version 0.0, header_size 88,
//!      next_header_offset 0, flags 0, entry_count, then {offset, length}
//!      of the entry table, the metadata segment and the storage segment,
//!      relative to the header
//! 96   entry table: one record per entry, each 16-byte aligned; the
//!      segment length excludes the last record's padding
//!      common 60-byte head: entry_size, u32 type, flags, name {off, len},
//!        metadata {off, len} (both into the metadata segment),
//!        minimum_alignment
//!      data  (type 2, 76 bytes): + storage {off, len} into the storage segment
//!      splat (type 1, 85 bytes): + u64 byte length, pattern[16], u8 pattern_length
//! ...  metadata segment: names back to back, no NUL, no alignment
//! ...  storage segment: 64-byte aligned when it holds data; each entry's
//!      bytes 64-byte aligned within it
//! ...  zero padding up to a multiple of 4096 bytes (IREE's file alignment)
//! ```

use super::WeightsError;
use memmap2::Mmap;
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: u32 = 0x4150_5249; // "IRPA"
const HEADER_SIZE: u64 = 88;
const ENTRY_ALIGNMENT: u64 = 16;
const DATA_ALIGNMENT: u64 = 64;
const FILE_ALIGNMENT: u64 = 4096;
const ENTRY_HEAD_SIZE: u64 = 60;
const DATA_ENTRY_SIZE: u64 = 76;
const SPLAT_ENTRY_SIZE: u64 = 85;
const MAX_PATTERN: usize = 16;
const TYPE_SKIP: u32 = 0;
const TYPE_SPLAT: u32 = 1;
const TYPE_DATA: u32 = 2;
const TYPE_EXTERNAL: u32 = 3;
/// Write buffer: the writer's memory stays at about this, whatever the entry sizes.
const BUFFER_CAPACITY: usize = 1 << 20;

/// An entry declared before writing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntrySpec {
    /// `length` bytes that `fill` streams into the storage segment.
    Data {
        /// The parameter's name.
        name: String,
        /// Its size in bytes.
        length: u64,
    },
    /// `count` repetitions of a little-endian `pattern` of 1, 2, 4, 8 or 16
    /// bytes; nothing is stored but the pattern.
    Splat {
        /// The parameter's name.
        name: String,
        /// The repeated bytes.
        pattern: Vec<u8>,
        /// How many times.
        count: u64,
    },
}

impl EntrySpec {
    /// The entry's parameter name.
    pub fn name(&self) -> &str {
        match self {
            EntrySpec::Data { name, .. } | EntrySpec::Splat { name, .. } => name,
        }
    }
}

/// `length` bytes at `offset`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Range {
    /// Start.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
}

impl Range {
    fn end(self) -> Option<u64> {
        self.offset.checked_add(self.length)
    }
}

/// Where one entry goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryLayout {
    /// Start of the entry's record, from the header.
    pub record: u64,
    /// The name, relative to the metadata segment.
    pub name: Range,
    /// The bytes of a data entry, relative to the storage segment.
    pub storage: Option<Range>,
}

/// The complete placement of an archive; segment offsets are from the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The entry records.
    pub entry_segment: Range,
    /// The names and metadata.
    pub metadata_segment: Range,
    /// The data of data entries.
    pub storage_segment: Range,
    /// Each entry's placement, in declaration order.
    pub entries: Vec<EntryLayout>,
    /// The size of the whole file.
    pub file_size: u64,
}

/// What [`write_archive`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchiveSummary {
    /// The archive's size.
    pub bytes_written: u64,
    /// How many entries it holds.
    pub entries: usize,
}

fn align(value: u64, alignment: u64) -> Option<u64> {
    value.checked_next_multiple_of(alignment)
}

/// Places `entries` the way IREE's archive builder does. Pure; checks
/// names, splat patterns and u64 overflow.
pub fn layout(entries: &[EntrySpec]) -> Result<Layout, WeightsError> {
    let mut seen = HashSet::new();
    let (mut table_len, mut metadata_len, mut storage_len) = (0u64, 0u64, 0u64);
    let mut has_data = false;
    let mut placed = Vec::with_capacity(entries.len());
    for spec in entries {
        let name = spec.name();
        let err = |message: String| WeightsError::ArchiveEntry { entry: name.to_string(), message };
        let overflow = || err("the archive would exceed 2^64 bytes".into());
        if !seen.insert(name) {
            return Err(err("declared twice; parameter names must be unique".into()));
        }
        let record = align(table_len, ENTRY_ALIGNMENT).ok_or_else(overflow)?;
        let name_range = Range { offset: metadata_len, length: name.len() as u64 };
        metadata_len = name_range.end().ok_or_else(overflow)?;
        let (size, storage) = match spec {
            EntrySpec::Data { length, .. } => {
                has_data = true;
                let offset = align(storage_len, DATA_ALIGNMENT).ok_or_else(overflow)?;
                let range = Range { offset, length: *length };
                storage_len = range.end().ok_or_else(overflow)?;
                (DATA_ENTRY_SIZE, Some(range))
            }
            EntrySpec::Splat { pattern, count, .. } => {
                if !matches!(pattern.len(), 1 | 2 | 4 | 8 | 16) {
                    return Err(err(format!("splat pattern is {} bytes; use 1, 2, 4, 8 or 16", pattern.len())));
                }
                (pattern.len() as u64).checked_mul(*count).ok_or_else(overflow)?;
                (SPLAT_ENTRY_SIZE, None)
            }
        };
        table_len = record.checked_add(size).ok_or_else(overflow)?;
        placed.push(EntryLayout { record, name: name_range, storage });
    }
    // IREE: the table follows the header at 16-byte alignment, metadata follows
    // the table unaligned, and storage takes the first data entry's alignment.
    let table_start = align(HEADER_SIZE, ENTRY_ALIGNMENT).expect("a small constant");
    let overflow = || WeightsError::ArchiveEntry {
        entry: entries.last().map(|e| e.name().to_string()).unwrap_or_default(),
        message: "the archive would exceed 2^64 bytes".into(),
    };
    let entry_segment = Range { offset: table_start, length: table_len };
    let metadata_segment = Range { offset: entry_segment.end().ok_or_else(overflow)?, length: metadata_len };
    let storage_alignment = if has_data { DATA_ALIGNMENT } else { 1 };
    let storage_start = metadata_segment.end().and_then(|e| align(e, storage_alignment)).ok_or_else(overflow)?;
    let storage_segment = Range { offset: storage_start, length: storage_len };
    let file_size = storage_segment.end().and_then(|e| align(e, FILE_ALIGNMENT)).ok_or_else(overflow)?;
    for e in &mut placed {
        e.record += table_start;
    }
    Ok(Layout { entry_segment, metadata_segment, storage_segment, entries: placed, file_size })
}

/// Header, entry table, metadata and the padding up to the storage segment:
/// everything but the data. Its size grows with the entry count and names only.
fn encode_head(entries: &[EntrySpec], layout: &Layout) -> Vec<u8> {
    let head_len = usize::try_from(layout.storage_segment.offset).expect("the head is table and names held in memory");
    let mut out = Vec::with_capacity(head_len);
    let put = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // version 0.0
    for v in [HEADER_SIZE, 0, 0, entries.len() as u64] {
        put(&mut out, v); // header_size, next_header_offset, flags, entry_count
    }
    for s in [layout.entry_segment, layout.metadata_segment, layout.storage_segment] {
        put(&mut out, s.offset);
        put(&mut out, s.length);
    }
    for (spec, place) in entries.iter().zip(&layout.entries) {
        out.resize(place.record as usize, 0);
        let (size, kind, min_alignment) = match spec {
            EntrySpec::Data { .. } => (DATA_ENTRY_SIZE, TYPE_DATA, DATA_ALIGNMENT),
            EntrySpec::Splat { .. } => (SPLAT_ENTRY_SIZE, TYPE_SPLAT, 0),
        };
        put(&mut out, size);
        out.extend_from_slice(&kind.to_le_bytes());
        // flags, name, metadata {0, 0} (none), minimum_alignment
        for v in [0, place.name.offset, place.name.length, 0, 0, min_alignment] {
            put(&mut out, v);
        }
        match spec {
            EntrySpec::Data { .. } => {
                let storage = place.storage.expect("data entries have storage");
                put(&mut out, storage.offset);
                put(&mut out, storage.length);
            }
            EntrySpec::Splat { pattern, count, .. } => {
                put(&mut out, pattern.len() as u64 * count);
                let mut padded = [0u8; MAX_PATTERN];
                padded[..pattern.len()].copy_from_slice(pattern);
                out.extend_from_slice(&padded);
                out.push(pattern.len() as u8);
            }
        }
    }
    for spec in entries {
        out.extend_from_slice(spec.name().as_bytes());
    }
    out.resize(head_len, 0);
    out
}

/// Counts what `fill` writes and refuses bytes past the declared length.
struct Counting<'w, W: Write> {
    inner: &'w mut W,
    written: u64,
    limit: u64,
    overflow: bool,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let end = self.written.saturating_add(buf.len() as u64);
        if end > self.limit {
            // Report the attempted total: fill wrote at least this much.
            (self.written, self.overflow) = (end, true);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "more bytes than the entry's declared length"));
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn write_zeros(out: &mut impl Write, n: u64) -> io::Result<()> {
    io::copy(&mut io::repeat(0).take(n), out).map(drop)
}

/// Writes an archive holding `entries`, streaming each data entry's bytes
/// from `fill(index, writer)` in order; `fill` must write exactly the
/// declared length. The file appears at `path` complete and synced, or not
/// at all: it is written to a temporary file in the same directory and
/// renamed over `path` at the end.
pub fn write_archive(
    path: &Path,
    entries: &[EntrySpec],
    mut fill: impl FnMut(usize, &mut dyn Write) -> io::Result<()>,
) -> Result<ArchiveSummary, WeightsError> {
    let layout = layout(entries)?;
    let io_err = |op: &'static str| move |source| WeightsError::ArchiveIo { path: path.to_path_buf(), op, source };
    let mut file = crate::AtomicFile::create(path).map_err(io_err("create a temporary file for"))?;
    // Dropping `file` on any early return deletes the temporary file.
    let mut out = BufWriter::with_capacity(BUFFER_CAPACITY, file.file());
    out.write_all(&encode_head(entries, &layout)).map_err(io_err("write"))?;
    let mut pos = layout.storage_segment.offset;
    for (index, (spec, place)) in entries.iter().zip(&layout.entries).enumerate() {
        let Some(storage) = place.storage else { continue };
        let start = layout.storage_segment.offset + storage.offset;
        write_zeros(&mut out, start - pos).map_err(io_err("write"))?;
        let mut counter = Counting { inner: &mut out, written: 0, limit: storage.length, overflow: false };
        let filled = fill(index, &mut counter);
        let (written, overflow) = (counter.written, counter.overflow);
        if overflow || (filled.is_ok() && written != storage.length) {
            return Err(WeightsError::ArchiveLength {
                path: path.to_path_buf(),
                entry: spec.name().to_string(),
                declared: storage.length,
                written,
                overflow,
            });
        }
        filled.map_err(|source| WeightsError::ArchiveFill {
            path: path.to_path_buf(),
            entry: spec.name().to_string(),
            source,
        })?;
        pos = start + storage.length;
    }
    write_zeros(&mut out, layout.file_size - pos).map_err(io_err("write"))?;
    out.flush().map_err(io_err("write"))?;
    drop(out);
    file.commit().map_err(io_err("sync and rename a temporary file to"))?;
    Ok(ArchiveSummary { bytes_written: layout.file_size, entries: entries.len() })
}

/// What an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind<'a> {
    /// `length` bytes at `offset` from the start of the file.
    Data {
        /// Start, from the start of the file.
        offset: u64,
        /// Length in bytes.
        length: u64,
    },
    /// `count` repetitions of a little-endian `pattern`.
    Splat {
        /// The repeated bytes.
        pattern: &'a [u8],
        /// How many times.
        count: u64,
    },
}

/// One entry of an open [`IrpaArchive`], borrowing its mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The parameter's name.
    pub name: &'a str,
    /// What it holds; [`IrpaArchive::data`] gives a data entry's bytes.
    pub kind: EntryKind<'a>,
    /// Opaque per-entry metadata; empty if none.
    pub metadata: &'a [u8],
}

#[derive(Clone, Copy, Debug)]
enum RawKind {
    Data { offset: u64, length: u64 },
    Splat { pattern: usize, pattern_len: usize, count: u64 },
}

/// A validated entry; byte positions are into the mapping.
#[derive(Clone, Copy, Debug)]
struct RawEntry {
    /// Position in the entry table, for messages.
    index: u64,
    name: (usize, usize),
    metadata: (usize, usize),
    kind: RawKind,
}

/// A memory-mapped, fully validated parameter archive.
pub struct IrpaArchive {
    path: PathBuf,
    map: Mmap,
    entries: Vec<RawEntry>,
    /// Entry indices sorted by name, for `get`.
    by_name: Vec<usize>,
}

impl std::fmt::Debug for IrpaArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IrpaArchive").field("path", &self.path).field("entries", &self.entries.len()).finish()
    }
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("an 8-byte slice"))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("a 4-byte slice"))
}

/// A position already checked against the mapping's length.
fn to_usize(v: u64) -> usize {
    usize::try_from(v).expect("validated to lie within the mapping")
}

impl IrpaArchive {
    /// Maps `path` and validates every entry (bounds, UTF-8 names, unique names)
    /// before returning.
    pub fn open(path: &Path) -> Result<IrpaArchive, WeightsError> {
        let io_err = |op: &'static str| move |source| WeightsError::ArchiveIo { path: path.to_path_buf(), op, source };
        let file = File::open(path).map_err(io_err("open"))?;
        let len = file.metadata().map_err(io_err("read the size of"))?.len();
        // Checked before mapping: an empty file cannot be mapped everywhere.
        if len < HEADER_SIZE {
            return Err(WeightsError::ArchiveTooShort { path: path.to_path_buf(), len, need: HEADER_SIZE });
        }
        // SAFETY: the mapping is read-only; like every mmap reader we rely on
        // nobody truncating or rewriting the file while it is open (kiln's
        // writer replaces files by rename, which leaves this mapping intact).
        let map = unsafe { Mmap::map(&file) }.map_err(io_err("memory-map"))?;
        let (entries, by_name) = parse(path, &map)?;
        Ok(IrpaArchive { path: path.to_path_buf(), map, entries, by_name })
    }

    /// Validates a whole archive held in memory and returns its entry
    /// count: the entry point for fuzzing the parser.
    pub fn validate(bytes: &[u8]) -> Result<usize, WeightsError> {
        let path = Path::new("<memory>");
        if (bytes.len() as u64) < HEADER_SIZE {
            return Err(WeightsError::ArchiveTooShort {
                path: path.to_path_buf(),
                len: bytes.len() as u64,
                need: HEADER_SIZE,
            });
        }
        Ok(parse(path, bytes)?.0.len())
    }

    /// The archive's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of entries (skip entries left out).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in file order (skip entries left out).
    pub fn entries(&self) -> impl ExactSizeIterator<Item = Entry<'_>> + '_ {
        self.entries.iter().map(|e| self.view(e))
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Option<Entry<'_>> {
        let i = self.by_name.binary_search_by(|&i| self.name_bytes(&self.entries[i]).cmp(name.as_bytes())).ok()?;
        Some(self.view(&self.entries[self.by_name[i]]))
    }

    /// The stored bytes of a data entry of this archive, zero-copy; `None`
    /// for a splat (or an entry from another archive that does not fit).
    pub fn data(&self, entry: &Entry<'_>) -> Option<&[u8]> {
        match entry.kind {
            EntryKind::Data { offset, length } => {
                let start = usize::try_from(offset).ok()?;
                self.map.get(start..start.checked_add(usize::try_from(length).ok()?)?)
            }
            EntryKind::Splat { .. } => None,
        }
    }

    fn name_bytes(&self, e: &RawEntry) -> &[u8] {
        &self.map[e.name.0..e.name.1]
    }

    fn view(&self, e: &RawEntry) -> Entry<'_> {
        let name = std::str::from_utf8(self.name_bytes(e)).expect("names are checked to be UTF-8 in open");
        let kind = match e.kind {
            RawKind::Data { offset, length } => EntryKind::Data { offset, length },
            RawKind::Splat { pattern, pattern_len, count } => {
                EntryKind::Splat { pattern: &self.map[pattern..pattern + pattern_len], count }
            }
        };
        Entry { name, kind, metadata: &self.map[e.metadata.0..e.metadata.1] }
    }
}

/// Validates the whole archive with checked u64 math; never trusts a count
/// or offset before checking it against the file.
fn parse(path: &Path, map: &[u8]) -> Result<(Vec<RawEntry>, Vec<usize>), WeightsError> {
    let file_len = map.len() as u64;
    let corrupt =
        |offset: u64, message: String| WeightsError::ArchiveCorrupt { path: path.to_path_buf(), offset, message };
    let unsupported = |message: String| WeightsError::ArchiveUnsupported { path: path.to_path_buf(), message };

    let magic = u32_at(map, 0);
    if magic != MAGIC {
        return Err(WeightsError::ArchiveMagic { path: path.to_path_buf(), found: magic });
    }
    let (major, minor) = (u16::from_le_bytes([map[4], map[5]]), u16::from_le_bytes([map[6], map[7]]));
    if (major, minor) != (0, 0) {
        return Err(unsupported(format!("IRPA version {major}.{minor} is not supported (kiln reads 0.0)")));
    }
    let header_size = u64_at(map, 8);
    if header_size != HEADER_SIZE {
        return Err(corrupt(8, format!("header_size is {header_size}, version 0 requires {HEADER_SIZE}")));
    }
    if u64_at(map, 16) != 0 {
        return Err(unsupported("the file links several archives (next_header_offset is set)".into()));
    }
    let entry_count = u64_at(map, 32);
    let segment = |at: usize, what: &str| {
        let r = Range { offset: u64_at(map, at), length: u64_at(map, at + 8) };
        // Like IREE, an empty segment may point anywhere.
        match r.end() {
            Some(end) if r.length == 0 || end <= file_len => Ok(r),
            _ => Err(corrupt(
                at as u64,
                format!(
                    "the {what} ({} bytes at {}) ends past the end of the file ({file_len} bytes): truncated",
                    r.length, r.offset
                ),
            )),
        }
    };
    let table = segment(40, "entry table")?;
    let metadata = segment(56, "metadata segment")?;
    let storage = segment(72, "storage segment")?;
    // Every record is at least ENTRY_HEAD_SIZE bytes: bounds the allocation.
    if entry_count > table.length / ENTRY_HEAD_SIZE {
        return Err(corrupt(
            32,
            format!("entry_count {entry_count} cannot fit in a {}-byte entry table", table.length),
        ));
    }
    // A sub-range of a segment, as a position in the mapping.
    let resolve = |seg: Range, r: Range, at: u64, what: &str, entry: u64| -> Result<(usize, usize), WeightsError> {
        if r.length == 0 {
            return Ok((0, 0));
        }
        match r.end() {
            Some(end) if end <= seg.length => {
                let start = to_usize(seg.offset + r.offset);
                Ok((start, start + to_usize(r.length)))
            }
            _ => Err(corrupt(
                at,
                format!(
                    "entry {entry}: {what} ({} bytes at {}) lies outside its {}-byte segment",
                    r.length, r.offset, seg.length
                ),
            )),
        }
    };

    let mut entries = Vec::with_capacity(to_usize(entry_count));
    let (mut pos, mut remaining) = (table.offset, table.length);
    for i in 0..entry_count {
        if remaining < ENTRY_HEAD_SIZE {
            return Err(corrupt(
                pos,
                format!("entry {i}: the entry table ends ({remaining} bytes left, a record needs {ENTRY_HEAD_SIZE})"),
            ));
        }
        let rec = &map[to_usize(pos)..to_usize(pos + remaining)];
        let size = u64_at(rec, 0);
        if size < ENTRY_HEAD_SIZE || size > remaining {
            return Err(corrupt(
                pos,
                format!("entry {i}: entry_size {size} is not within {ENTRY_HEAD_SIZE}..={remaining}"),
            ));
        }
        let kind = u32_at(rec, 8);
        let range_at = |at: usize| Range { offset: u64_at(rec, at), length: u64_at(rec, at + 8) };
        let name = resolve(metadata, range_at(20), pos + 20, "name", i)?;
        let meta = resolve(metadata, range_at(36), pos + 36, "metadata", i)?;
        let name_str = std::str::from_utf8(&map[name.0..name.1])
            .map_err(|e| corrupt(pos + 20, format!("entry {i}: name is not UTF-8 ({e})")))?;
        let need = |min: u64, what: &str| {
            if size < min {
                Err(corrupt(
                    pos,
                    format!("entry {i} (\"{name_str}\"): a {what} entry needs {min} bytes, entry_size is {size}"),
                ))
            } else {
                Ok(())
            }
        };
        let raw = match kind {
            TYPE_SKIP => None, // erased entries: ignored, as IREE does
            TYPE_DATA => {
                need(DATA_ENTRY_SIZE, "data")?;
                let r = range_at(60);
                let (start, end) = resolve(storage, r, pos + 60, "storage", i)?;
                // Empty data has no position (IREE reports offset 0 too).
                Some(RawKind::Data { offset: start as u64, length: (end - start) as u64 })
            }
            TYPE_SPLAT => {
                need(SPLAT_ENTRY_SIZE, "splat")?;
                let length = u64_at(rec, 60);
                let pattern_len = rec[84];
                if !matches!(pattern_len, 1 | 2 | 4 | 8 | 16) || !length.is_multiple_of(u64::from(pattern_len)) {
                    return Err(corrupt(
                        pos + 84,
                        format!(
                            "entry {i} (\"{name_str}\"): a {pattern_len}-byte splat pattern cannot fill {length} bytes \
                             (patterns are 1, 2, 4, 8 or 16 bytes and divide the length)"
                        ),
                    ));
                }
                Some(RawKind::Splat {
                    pattern: to_usize(pos + 68),
                    pattern_len: usize::from(pattern_len),
                    count: length / u64::from(pattern_len),
                })
            }
            TYPE_EXTERNAL => {
                return Err(unsupported(format!(
                    "entry {i} (\"{name_str}\") refers to data in another file, which kiln does not read"
                )));
            }
            other => return Err(corrupt(pos + 8, format!("entry {i} (\"{name_str}\"): unknown entry type {other}"))),
        };
        if let Some(kind) = raw {
            entries.push(RawEntry { index: i, name, metadata: meta, kind });
        }
        // The last record need not be padded, hence saturating.
        let step = align(size, ENTRY_ALIGNMENT).expect("size is at most the file length");
        pos += step.min(remaining);
        remaining = remaining.saturating_sub(step);
    }

    let mut by_name: Vec<usize> = (0..entries.len()).collect();
    let name_of = |i: usize| &map[entries[i].name.0..entries[i].name.1];
    by_name.sort_by(|&a, &b| name_of(a).cmp(name_of(b)).then(a.cmp(&b)));
    if let Some(w) = by_name.windows(2).find(|w| name_of(w[0]) == name_of(w[1])) {
        return Err(WeightsError::ArchiveDuplicateName {
            path: path.to_path_buf(),
            name: String::from_utf8_lossy(name_of(w[0])).into_owned(),
            first: entries[w[0]].index,
            second: entries[w[1]].index,
        });
    }
    Ok((entries, by_name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const VENV_BIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin");

    /// IREE's tools are a test requirement, not an optional extra.
    fn tool(name: &str) -> PathBuf {
        let p = Path::new(VENV_BIN).join(name);
        assert!(p.is_file(), "{} is missing; run `make setup` to install IREE into .venv", p.display());
        p
    }

    fn run(cmd: &mut Command) -> String {
        let out = cmd.output().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{cmd:?} failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
        text
    }

    fn data(name: &str, length: u64) -> EntrySpec {
        EntrySpec::Data { name: name.into(), length }
    }

    fn splat(name: &str, pattern: &[u8], count: u64) -> EntrySpec {
        EntrySpec::Splat { name: name.into(), pattern: pattern.to_vec(), count }
    }

    /// Deterministic content for entry `i`, byte `k`.
    fn byte(i: usize, k: u64) -> u8 {
        ((k * 31 + i as u64 * 7) % 251) as u8
    }

    /// Writes `entries`, filling each data entry in 64 KiB chunks.
    fn write_generated(path: &Path, entries: &[EntrySpec]) -> ArchiveSummary {
        write_archive(path, entries, |i, w| {
            let EntrySpec::Data { length, .. } = entries[i] else { panic!("fill called for a splat") };
            let mut k = 0;
            while k < length {
                let chunk: Vec<u8> = (k..length.min(k + 65536)).map(|k| byte(i, k)).collect();
                w.write_all(&chunk)?;
                k += chunk.len() as u64;
            }
            Ok(())
        })
        .expect("write_archive")
    }

    fn sample() -> Vec<EntrySpec> {
        vec![
            data("d0", 0),
            data("d1", 1),
            data("blk.0.attn_q.weight", 63),
            data("d64", 64),
            splat("ones", &1.5f32.to_le_bytes(), 10),
            data("d65", 65),
            data("big", 3 * 1024 * 1024 + 5),
            splat("byte", &[0xab], 3),
        ]
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.irpa");
        let specs = sample();
        let summary = write_generated(&path, &specs);
        let len = std::fs::metadata(&path).expect("metadata").len();
        assert_eq!(summary, ArchiveSummary { bytes_written: len, entries: specs.len() });
        assert_eq!(len % FILE_ALIGNMENT, 0);
        assert_eq!(leftovers(dir.path()), ["p.irpa"]);

        let archive = IrpaArchive::open(&path).expect("open");
        assert_eq!(archive.len(), specs.len());
        for (i, (spec, entry)) in specs.iter().zip(archive.entries()).enumerate() {
            assert_eq!(entry.name, spec.name());
            assert!(entry.metadata.is_empty());
            assert_eq!(archive.get(spec.name()), Some(entry));
            match (spec, entry.kind) {
                (EntrySpec::Data { length, .. }, EntryKind::Data { offset, length: got }) => {
                    assert_eq!(got, *length, "{}", spec.name());
                    assert!(*length == 0 || offset % DATA_ALIGNMENT == 0, "{} at {offset}", spec.name());
                    let bytes = archive.data(&entry).expect("data");
                    assert!(bytes.iter().zip(0..).all(|(&b, k)| b == byte(i, k)), "{} differs", spec.name());
                    assert_eq!(bytes.len() as u64, *length);
                }
                (EntrySpec::Splat { pattern, count, .. }, EntryKind::Splat { pattern: p, count: c }) => {
                    assert_eq!((p, c), (pattern.as_slice(), *count));
                    assert_eq!(archive.data(&entry), None);
                }
                (spec, kind) => panic!("{spec:?} read back as {kind:?}"),
            }
        }
        assert_eq!(archive.get("missing"), None);

        // An empty archive round-trips too.
        let empty = dir.path().join("empty.irpa");
        write_archive(&empty, &[], |_, _| unreachable!()).expect("write empty");
        assert!(IrpaArchive::open(&empty).expect("open empty").is_empty());
    }

    #[test]
    fn layout_beyond_4_gib() {
        let five_gib = 5u64 << 30;
        let l = layout(&[data("huge", five_gib + 3), splat("s", &[1, 2], 3 << 31), data("after", 1)]).expect("layout");
        assert_eq!(l.entry_segment, Range { offset: 96, length: 80 + 96 + DATA_ENTRY_SIZE });
        assert_eq!(l.entries.iter().map(|e| e.record).collect::<Vec<_>>(), [96, 176, 272]);
        assert_eq!(l.metadata_segment, Range { offset: 96 + 252, length: 4 + 1 + 5 });
        assert_eq!(l.storage_segment.offset, 384); // 358 rounded up to 64
        assert_eq!(l.entries[0].storage, Some(Range { offset: 0, length: five_gib + 3 }));
        assert_eq!(l.entries[1].storage, None);
        assert_eq!(l.entries[2].storage, Some(Range { offset: five_gib + 64, length: 1 }));
        assert_eq!(l.storage_segment.length, five_gib + 65);
        assert_eq!(l.file_size, (384 + five_gib + 65).next_multiple_of(4096));
        assert!(l.file_size > u64::from(u32::MAX));

        // Sizes that do not fit in u64, bad patterns and duplicates are errors, not panics.
        for bad in [
            vec![data("a", u64::MAX - 10)],
            vec![data("a", u64::MAX / 2), data("b", u64::MAX / 2 + 100)],
            vec![splat("s", &[0; 8], u64::MAX / 4)],
            vec![splat("s", &[0; 3], 1)],
            vec![splat("s", &[], 1)],
            vec![data("a", 1), splat("a", &[0], 1)],
        ] {
            let e = layout(&bad).expect_err("must fail");
            assert!(matches!(e, WeightsError::ArchiveEntry { .. }), "{e}");
        }
    }

    /// Writes a real > 4 GiB archive (slow, ~4.3 GB of disk): run with `--ignored`.
    #[test]
    #[ignore = "writes 4.3 GB of disk for ~25 s; `make bench` runs it"]
    fn archive_beyond_4_gib() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.irpa");
        let huge = (1u64 << 32) + 3;
        let specs = [data("huge", huge), data("tail", 5)];
        let chunk = vec![0x5a; 1 << 20];
        write_archive(&path, &specs, |i, w| {
            if i == 1 {
                return w.write_all(b"tail!");
            }
            let mut left = huge;
            while left > 0 {
                let n = left.min(chunk.len() as u64);
                w.write_all(&chunk[..n as usize])?;
                left -= n;
            }
            Ok(())
        })
        .expect("write");
        let a = IrpaArchive::open(&path).expect("open");
        let tail = a.get("tail").expect("tail");
        // Storage starts at 320 (96 + 156-byte table + 8 name bytes, 64-aligned).
        let tail_at = 320 + (1u64 << 32) + 64;
        assert_eq!(tail.kind, EntryKind::Data { offset: tail_at, length: 5 });
        assert_eq!(a.data(&tail), Some(&b"tail!"[..]));
        let text = run(Command::new(tool("iree-dump-parameters")).arg(format!("--parameters={}", path.display())));
        assert!(text.contains(&format!("{tail_at} |")), "{text}");
    }

    /// iree-dump-parameters prints `start | end | length | `name`` per entry
    /// (`-` for the position of a splat).
    #[test]
    fn iree_dump_parameters_lists_kiln_archive() {
        let dump = tool("iree-dump-parameters");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.irpa");
        let specs = sample();
        write_generated(&path, &specs);
        let l = layout(&specs).expect("layout");
        let text = run(Command::new(dump).arg(format!("--parameters={}", path.display())));
        let rows: Vec<Vec<String>> = text
            .lines()
            .filter(|line| line.contains('`') && line.contains('|'))
            .map(|line| line.split('|').map(|c| c.trim().to_string()).collect())
            .collect();
        let expected: Vec<Vec<String>> = specs
            .iter()
            .zip(&l.entries)
            .map(|(spec, place)| {
                let (start, end, length) = match (spec, place.storage) {
                    (_, Some(Range { length: 0, .. })) => ("0".into(), "0".into(), 0),
                    (_, Some(r)) => {
                        let start = l.storage_segment.offset + r.offset;
                        (start.to_string(), (start + r.length).to_string(), r.length)
                    }
                    (EntrySpec::Splat { pattern, count, .. }, None) => {
                        ("-".into(), "-".into(), pattern.len() as u64 * count)
                    }
                    (EntrySpec::Data { .. }, None) => unreachable!(),
                };
                vec![start, end, length.to_string(), format!("`{}`", spec.name())]
            })
            .collect();
        assert_eq!(rows, expected, "iree-dump-parameters printed:\n{text}");
        assert!(text.contains(&format!("({} entries,", specs.len())), "{text}");
    }

    /// IREE's own writer, driven through `iree.runtime`.
    const PY_WRITER: &str = r#"
import sys, numpy as np, iree.runtime as rt
mixed, plain = sys.argv[1], sys.argv[2]
i = rt.ParameterIndex()
i.add_buffer("alpha", bytes(range(100)))
i.add_splat("sp", np.array([0x01020304], dtype=np.uint32), 64)
i.add_buffer("empty", b"")
i.add_buffer("with.meta", b"xyz", metadata="hello")
i.add_buffer("big", (np.arange(100000) % 251).astype(np.uint8).tobytes())
i.create_archive_file(mixed)
i = rt.ParameterIndex()
i.add_buffer("a", b"\x01\x02\x03")
i.add_splat("s", np.array([7], dtype=np.int16), 8)
i.add_buffer("bb", bytes(range(70)))
i.add_buffer("z", b"")
i.add_splat("f", np.array([2.5], dtype=np.float64), 16)
i.create_archive_file(plain)
"#;

    #[test]
    fn reads_iree_runtime_archives_and_writes_identical_bytes() {
        let python = tool("python");
        let dir = tempfile::tempdir().expect("tempdir");
        let (mixed, plain) = (dir.path().join("mixed.irpa"), dir.path().join("plain.irpa"));
        run(Command::new(python).arg("-c").arg(PY_WRITER).arg(&mixed).arg(&plain));

        let a = IrpaArchive::open(&mixed).expect("open IREE's archive");
        let names: Vec<&str> = a.entries().map(|e| e.name).collect();
        assert_eq!(names, ["alpha", "sp", "empty", "with.meta", "big"]);
        let get = |n: &str| a.get(n).unwrap_or_else(|| panic!("no {n}"));
        assert_eq!(a.data(&get("alpha")), Some(&(0..100).collect::<Vec<u8>>()[..]));
        assert_eq!(get("sp").kind, EntryKind::Splat { pattern: &0x01020304u32.to_le_bytes(), count: 16 });
        assert_eq!(a.data(&get("empty")), Some(&[][..]));
        assert_eq!(a.data(&get("with.meta")), Some(&b"xyz"[..]));
        assert_eq!(get("with.meta").metadata, b"hello");
        let big: Vec<u8> = (0..100000u32).map(|k| (k % 251) as u8).collect();
        assert_eq!(a.data(&get("big")), Some(&big[..]));

        // The same entries through kiln's writer: byte for byte what IREE writes.
        let contents: [&[u8]; 3] = [&[1, 2, 3], &(0..70).collect::<Vec<u8>>(), &[]];
        let specs = [
            data("a", 3),
            splat("s", &7i16.to_le_bytes(), 4),
            data("bb", 70),
            data("z", 0),
            splat("f", &2.5f64.to_le_bytes(), 2),
        ];
        let ours = dir.path().join("ours.irpa");
        let mut next = contents.iter();
        write_archive(&ours, &specs, |_, w| w.write_all(next.next().expect("three data entries"))).expect("write");
        let (theirs, ours) = (std::fs::read(&plain).expect("read"), std::fs::read(&ours).expect("read"));
        let first_diff = theirs.iter().zip(&ours).position(|(a, b)| a != b);
        assert!(theirs == ours, "lengths {} vs {}, first difference at byte {first_diff:?}", theirs.len(), ours.len());
    }

    /// A module whose weights come from a kiln archive, one data and one splat.
    #[test]
    fn iree_run_module_reads_params_from_kiln_archive() {
        let iree = crate::iree::Iree { compile: tool("iree-compile"), run_module: tool("iree-run-module") };
        let graph = crate::graph::text::parse(
            r#"func @main(%x: tensor<4xf32>) {
  %w = param {name = "w"} : tensor<4xf32>
  %s = param {name = "s"} : tensor<4xf32>
  %y = add %x, %w : tensor<4xf32>
  %z = add %y, %s : tensor<4xf32>
  return %z
}
"#,
        )
        .expect("parse");
        let mlir = crate::lower::lower_to_string(&graph, &crate::lower::LowerOptions::default()).expect("lower");
        let dir = tempfile::tempdir().expect("tempdir");
        let (mlir_path, vmfb, params) =
            (dir.path().join("m.mlir"), dir.path().join("m.vmfb"), dir.path().join("p.irpa"));
        std::fs::write(&mlir_path, &mlir).expect("write mlir");
        iree.compile(&mlir_path, &vmfb).expect("iree-compile");

        let w: Vec<u8> = [10f32, 20., 30., 40.].iter().flat_map(|v| v.to_le_bytes()).collect();
        write_archive(&params, &[data("w", 16), splat("s", &0.5f32.to_le_bytes(), 4)], |_, out| out.write_all(&w))
            .expect("write params");
        let out = run(Command::new(&iree.run_module)
            .arg(format!("--module={}", vmfb.display()))
            .arg("--function=main")
            .arg(format!("--parameters=model={}", params.display()))
            .arg("--input=4xf32=1,2,3,4"));
        assert!(out.contains("4xf32=11.5 22.5 33.5 44.5"), "iree-run-module printed:\n{out}");
    }

    /// A valid archive to break: data, splat, data.
    fn hostile_base(dir: &Path) -> (Vec<u8>, Layout) {
        let specs = [data("alpha", 100), splat("beta", &[1, 2, 3, 4], 8), data("gamma", 10)];
        let path = dir.join("base.irpa");
        write_generated(&path, &specs);
        (std::fs::read(&path).expect("read"), layout(&specs).expect("layout"))
    }

    fn set_u64(bytes: &mut [u8], at: u64, v: u64) {
        bytes[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn hostile_archives_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (base, l) = hostile_base(dir.path());
        let path = dir.path().join("bad.irpa");
        let open = |bytes: &[u8]| {
            std::fs::write(&path, bytes).expect("write");
            let e = IrpaArchive::open(&path).expect_err("a hostile archive must not open");
            let msg = e.to_string();
            assert!(!msg.contains('\n') && msg.contains("bad.irpa"), "{msg}");
            e
        };
        let mutated = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = base.clone();
            f(&mut b);
            open(&b)
        };
        let (rec, meta, storage) = (|i: usize| l.entries[i].record, l.metadata_segment, l.storage_segment);
        let storage_end = storage.offset + storage.length;

        for cut in [0, 4, 40, 87, 88, 100, rec(1) + 30, meta.offset + 2, storage.offset + 50, storage_end - 1] {
            let e = open(&base[..cut as usize]);
            assert!(
                matches!(e, WeightsError::ArchiveTooShort { .. } | WeightsError::ArchiveCorrupt { .. }),
                "cut at {cut}: {e}"
            );
        }
        assert!(matches!(mutated(&|b| b[0] = b'X'), WeightsError::ArchiveMagic { .. }));
        assert!(matches!(mutated(&|b| b[4] = 1), WeightsError::ArchiveUnsupported { .. })); // version 1.0
        assert!(matches!(mutated(&|b| b[6] = 1), WeightsError::ArchiveUnsupported { .. })); // version 0.1
        assert!(matches!(mutated(&|b| set_u64(b, 16, 4096)), WeightsError::ArchiveUnsupported { .. }));
        assert!(matches!(mutated(&|b| b[10] = 1), WeightsError::ArchiveCorrupt { offset: 8, .. }));

        let corrupt = |f: &dyn Fn(&mut Vec<u8>), what: &str| match mutated(f) {
            WeightsError::ArchiveCorrupt { .. } => {}
            e => panic!("{what}: expected Corrupt, got {e}"),
        };
        corrupt(&|b| set_u64(b, 32, u64::MAX), "entry_count u64::MAX");
        corrupt(&|b| set_u64(b, 32, 1 << 40), "entry_count 2^40");
        corrupt(&|b| set_u64(b, 32, 4), "one entry more than the table holds");
        corrupt(&|b| set_u64(b, 48, u64::MAX), "entry table length overflows");
        corrupt(&|b| set_u64(b, 72, u64::MAX - 8), "storage segment offset overflows");
        corrupt(&|b| set_u64(b, 80, 1 << 40), "storage segment past EOF");
        corrupt(&|b| set_u64(b, rec(0) + 20, meta.length), "name offset past the metadata segment");
        corrupt(&|b| set_u64(b, rec(0) + 28, u64::MAX), "name length overflows");
        corrupt(
            &|b| {
                set_u64(b, rec(1) + 36, meta.length - 1);
                set_u64(b, rec(1) + 44, 2);
            },
            "metadata past the metadata segment",
        );
        corrupt(&|b| b[meta.offset as usize] = 0xff, "name not UTF-8");
        corrupt(&|b| set_u64(b, rec(2) + 60, storage.length), "storage offset past the segment");
        corrupt(&|b| set_u64(b, rec(2) + 68, 1 << 40), "storage length past EOF");
        corrupt(&|b| set_u64(b, rec(0), 10), "entry_size below the common head");
        corrupt(&|b| set_u64(b, rec(0), u64::MAX), "entry_size past the table");
        corrupt(&|b| set_u64(b, rec(0), ENTRY_HEAD_SIZE), "data entry too small for its storage");
        corrupt(&|b| b[rec(0) as usize + 8] = 7, "unknown entry type");
        corrupt(&|b| b[rec(1) as usize + 84] = 3, "splat pattern length 3");
        corrupt(&|b| b[rec(1) as usize + 84] = 0, "splat pattern length 0");
        corrupt(&|b| set_u64(b, rec(1) + 60, 33), "splat length not a multiple of the pattern");
        assert!(matches!(mutated(&|b| b[rec(0) as usize + 8] = 3), WeightsError::ArchiveUnsupported { .. }));
        // gamma's name range pointed at alpha's: the same name twice.
        let dup = mutated(&|b| {
            let alpha = b[rec(0) as usize + 20..rec(0) as usize + 36].to_vec();
            b[rec(2) as usize + 20..rec(2) as usize + 36].copy_from_slice(&alpha);
        });
        assert!(matches!(dup, WeightsError::ArchiveDuplicateName { first: 0, second: 2, .. }), "{dup}");

        // A skip entry (type 0) is erased, as in IREE: the rest still reads.
        let mut b = base.clone();
        b[rec(1) as usize + 8] = 0;
        std::fs::write(&path, &b).expect("write");
        let a = IrpaArchive::open(&path).expect("skip entries are valid");
        assert_eq!(a.entries().map(|e| e.name).collect::<Vec<_>>(), ["alpha", "gamma"]);
    }

    #[test]
    fn failed_writes_leave_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.irpa");
        let specs = [data("a", 10), data("b", 1 << 20)];

        let e = write_archive(&path, &specs, |i, w| {
            if i == 1 {
                w.write_all(&[0; 1000])?;
                return Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"));
            }
            w.write_all(&[0; 10])
        })
        .expect_err("fill error");
        assert!(matches!(&e, WeightsError::ArchiveFill { entry, .. } if entry == "b"), "{e}");

        let e = write_archive(&path, &specs, |_, w| w.write_all(&[0; 9])).expect_err("short");
        assert!(
            matches!(&e, WeightsError::ArchiveLength { entry, written: 9, overflow: false, .. } if entry == "a"),
            "{e}"
        );

        let e = write_archive(&path, &specs, |_, w| w.write_all(&[0; 11])).expect_err("long");
        assert!(
            matches!(&e, WeightsError::ArchiveLength { entry, written: 11, overflow: true, .. } if entry == "a"),
            "{e}"
        );

        let e = write_archive(&path, &[data("a", 1), data("a", 1)], |_, w| w.write_all(&[0])).expect_err("dup");
        assert!(matches!(e, WeightsError::ArchiveEntry { .. }), "{e}");

        assert!(leftovers(dir.path()).is_empty(), "left behind: {:?}", leftovers(dir.path()));

        // A failed rewrite keeps the previous archive intact.
        write_generated(&path, &specs);
        let before = std::fs::read(&path).expect("read");
        write_archive(&path, &specs, |_, _| Err(io::Error::other("boom"))).expect_err("fill error");
        assert_eq!(std::fs::read(&path).expect("read"), before);
        assert_eq!(leftovers(dir.path()), ["p.irpa"]);
    }
}
