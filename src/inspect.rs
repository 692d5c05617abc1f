//! `kiln inspect`: what a checkpoint or parameter archive holds, read from
//! its headers only (tensor data stays unread in the memory map).

use crate::weights::gguf::{Gguf, MetadataValue};
use crate::weights::irpa::{EntryKind, IrpaArchive};
use crate::weights::safetensors::{SafeTensors, ShardedSafeTensors, TensorView};
use crate::weights::WeightsError;
use serde::Serialize;
use std::fmt;
use std::io::Read;
use std::path::Path;
use thiserror::Error;

/// Why a file could not be inspected.
#[derive(Debug, Error)]
pub enum InspectError {
    /// A malformed checkpoint or parameter archive.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("{path}: {error}")]
    /// The file could not be opened or read.
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    #[error("{path}: not a GGUF, safetensors, safetensors index or IRPA file (first bytes {magic:02x?})")]
    /// The file is none of the formats kiln reads.
    UnknownFormat {
        /// The file.
        path: String,
        /// Its first bytes.
        magic: Vec<u8>,
    },
}

/// What a file holds, for printing (its `Display`) or as JSON (`Serialize`).
#[derive(Debug, Serialize)]
pub struct Inspection {
    /// The file, as given.
    pub path: String,
    /// `gguf`, `safetensors`, `safetensors-index` or `irpa`.
    pub format: String,
    /// One line: the format, its version, counts and offsets.
    pub summary: String,
    /// Every metadata key and value, in file order.
    pub metadata: Vec<MetadataEntry>,
    /// Every tensor, in file order.
    pub tensors: Vec<TensorRow>,
}

/// One metadata key.
#[derive(Debug, Serialize)]
pub struct MetadataEntry {
    /// The key, as the file spells it.
    pub key: String,
    /// The value's type: GGUF's name (`UINT32`, `array<STRING>`), or `string` for safetensors.
    #[serde(rename = "type")]
    pub value_type: String,
    /// The value; an array over 8 items as `{"len": n, "head": [its first 8]}`.
    pub value: serde_json::Value,
}

/// One tensor or archive entry.
#[derive(Debug, Serialize)]
pub struct TensorRow {
    /// The name, as the file spells it.
    pub name: String,
    /// ggml type, safetensors dtype, or `data`/`splat` for archive entries.
    #[serde(rename = "type")]
    pub dtype: String,
    /// Row-major (slowest dim first); empty for archive entries.
    pub shape: Vec<u64>,
    /// Size of its data in the file.
    pub bytes: u64,
    /// Offset of the tensor's bytes in its file.
    pub offset: u64,
    /// The shard file, for sharded checkpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// Arrays longer than this show their first items and their length.
const ARRAY_PREVIEW: usize = 8;

/// Reads the headers of a GGUF, safetensors file, safetensors index or IRPA
/// archive, telling them apart by content, not by extension.
pub fn inspect(path: &Path) -> Result<Inspection, InspectError> {
    let shown = path.display().to_string();
    let mut magic = Vec::with_capacity(8);
    std::fs::File::open(path)
        .and_then(|f| f.take(8).read_to_end(&mut magic))
        .map_err(|error| InspectError::Io { path: shown.clone(), error })?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if magic.starts_with(b"GGUF") {
        inspect_gguf(path)
    } else if magic.starts_with(b"IRPA") {
        inspect_irpa(path)
    } else if name.ends_with(".index.json") {
        inspect_sharded(path)
    } else if name.ends_with(".safetensors") || magic.len() == 8 {
        inspect_safetensors(path).map_err(|e| match e {
            // Without the extension, a file that fails as safetensors was
            // most likely never one: say so rather than blame its header.
            InspectError::Weights(_) if !name.ends_with(".safetensors") => {
                InspectError::UnknownFormat { path: shown.clone(), magic: magic.clone() }
            }
            e => e,
        })
    } else {
        Err(InspectError::UnknownFormat { path: shown, magic })
    }
}

fn metadata_json(v: &MetadataValue<'_>) -> serde_json::Value {
    use serde_json::json;
    match v {
        MetadataValue::U8(x) => json!(x),
        MetadataValue::I8(x) => json!(x),
        MetadataValue::U16(x) => json!(x),
        MetadataValue::I16(x) => json!(x),
        MetadataValue::U32(x) => json!(x),
        MetadataValue::I32(x) => json!(x),
        MetadataValue::U64(x) => json!(x),
        MetadataValue::I64(x) => json!(x),
        MetadataValue::F32(x) => json!(x),
        MetadataValue::F64(x) => json!(x),
        MetadataValue::Bool(x) => json!(x),
        MetadataValue::String(s) => json!(s),
        MetadataValue::Array(a) => {
            let head: Vec<serde_json::Value> = a.iter().take(ARRAY_PREVIEW).map(|v| metadata_json(&v)).collect();
            if a.len() <= ARRAY_PREVIEW {
                serde_json::Value::Array(head)
            } else {
                json!({ "len": a.len(), "head": head })
            }
        }
    }
}

fn inspect_gguf(path: &Path) -> Result<Inspection, InspectError> {
    let gguf = Gguf::open(path)?;
    let metadata = gguf
        .metadata()
        .map(|(key, v)| {
            let value_type = match &v {
                MetadataValue::Array(a) => format!("array<{}>", a.elem_type()),
                v => v.value_type().to_string(),
            };
            MetadataEntry { key: key.to_string(), value_type, value: metadata_json(&v) }
        })
        .collect();
    let tensors: Vec<TensorRow> = gguf
        .tensors()
        .map(|t| TensorRow {
            name: t.name.to_string(),
            dtype: t.ggml_type.to_string(),
            shape: t.dims.iter().rev().copied().collect(),
            bytes: t.data.len() as u64,
            offset: t.offset_in_file,
            file: None,
        })
        .collect();
    let summary = format!(
        "GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at offset {}",
        gguf.version(),
        gguf.metadata().len(),
        tensors.len(),
        gguf.alignment(),
        gguf.data_offset()
    );
    Ok(Inspection { path: path.display().to_string(), format: "gguf".into(), summary, metadata, tensors })
}

fn safetensors_row(t: &TensorView<'_>, file: Option<String>) -> TensorRow {
    TensorRow {
        name: t.name.to_string(),
        dtype: t.dtype.to_string(),
        shape: t.shape.iter().map(|&d| d as u64).collect(),
        bytes: t.data.len() as u64,
        offset: t.offset,
        file,
    }
}

fn string_metadata<'a>(entries: impl Iterator<Item = (&'a String, &'a String)>) -> Vec<MetadataEntry> {
    entries
        .map(|(k, v)| MetadataEntry { key: k.clone(), value_type: "string".into(), value: v.clone().into() })
        .collect()
}

fn inspect_safetensors(path: &Path) -> Result<Inspection, InspectError> {
    let st = SafeTensors::open(path)?;
    let tensors: Vec<TensorRow> = st.tensors().map(|t| safetensors_row(&t, None)).collect();
    let summary = format!("safetensors, {} tensors, {} metadata keys", tensors.len(), st.metadata().len());
    let metadata = string_metadata(st.metadata().iter());
    Ok(Inspection { path: path.display().to_string(), format: "safetensors".into(), summary, metadata, tensors })
}

fn inspect_sharded(path: &Path) -> Result<Inspection, InspectError> {
    let sharded = ShardedSafeTensors::open(path)?;
    let mut tensors = Vec::new();
    for shard in sharded.shards() {
        let file = shard.path().file_name().map(|n| n.to_string_lossy().into_owned());
        tensors.extend(shard.tensors().map(|t| safetensors_row(&t, file.clone())));
    }
    let summary = format!("sharded safetensors, {} shards, {} tensors", sharded.shards().len(), tensors.len());
    Ok(Inspection {
        path: path.display().to_string(),
        format: "safetensors-index".into(),
        summary,
        metadata: vec![],
        tensors,
    })
}

fn inspect_irpa(path: &Path) -> Result<Inspection, InspectError> {
    let archive = IrpaArchive::open(path)?;
    let tensors: Vec<TensorRow> = archive
        .entries()
        .map(|e| match e.kind {
            EntryKind::Data { offset, length } => TensorRow {
                name: e.name.to_string(),
                dtype: "data".into(),
                shape: vec![],
                bytes: length,
                offset,
                file: None,
            },
            EntryKind::Splat { pattern, count } => TensorRow {
                name: e.name.to_string(),
                dtype: format!("splat({} bytes)", pattern.len()),
                shape: vec![],
                bytes: pattern.len() as u64 * count,
                offset: 0,
                file: None,
            },
        })
        .collect();
    let summary = format!("IRPA v0, {} entries", tensors.len());
    Ok(Inspection { path: path.display().to_string(), format: "irpa".into(), summary, metadata: vec![], tensors })
}

/// `s` as is when it is one plain word, else quoted with Rust's escapes
/// (`"a\nb \"c\""`): a name from a file can hold newlines, quotes,
/// spaces or terminal controls, and must not break or fake a table row.
fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    let quoted = format!("{s:?}");
    let plain = !s.is_empty() && quoted.len() == s.len() + 2 && !s.chars().any(char::is_whitespace);
    if plain {
        s.into()
    } else {
        quoted.into()
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {}", shown(&self.path), self.summary)?;
        if !self.metadata.is_empty() {
            writeln!(f, "\nmetadata:")?;
            for m in &self.metadata {
                writeln!(f, "  {} ({}) = {}", shown(&m.key), m.value_type, m.value)?;
            }
        }
        let names: Vec<_> = self.tensors.iter().map(|t| shown(&t.name)).collect();
        let shapes: Vec<String> =
            self.tensors.iter().map(|t| t.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")).collect();
        let width = |items: &mut dyn Iterator<Item = usize>, header: usize| items.max().unwrap_or(0).max(header);
        let name_w = width(&mut names.iter().map(|n| n.chars().count()), 4);
        let type_w = width(&mut self.tensors.iter().map(|t| t.dtype.len()), 4);
        let shape_w = width(&mut shapes.iter().map(String::len), 5);
        writeln!(
            f,
            "\n{:name_w$}  {:type_w$}  {:shape_w$}  {:>12}  {:>12}",
            "name", "type", "shape", "bytes", "offset"
        )?;
        for ((t, name), shape) in self.tensors.iter().zip(&names).zip(&shapes) {
            write!(f, "{name:name_w$}  {:type_w$}  {shape:shape_w$}  {:>12}  {:>12}", t.dtype, t.bytes, t.offset)?;
            match &t.file {
                Some(file) => writeln!(f, "  {}", shown(file))?,
                None => writeln!(f)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn names_that_could_break_a_row_are_quoted_and_escaped() {
        assert_eq!(shown("blk.0.attn_q.weight"), "blk.0.attn_q.weight");
        assert_eq!(shown("a\nb \"c\""), r#""a\nb \"c\"""#);
        assert_eq!(shown("tab\there"), r#""tab\there""#);
        assert_eq!(shown("back\\slash"), r#""back\\slash""#);
        assert_eq!(shown("\u{1b}[31mred"), r#""\u{1b}[31mred""#);
        assert_eq!(shown("rtl\u{202e}"), r#""rtl\u{202e}""#);
        assert_eq!(shown("naïve"), "naïve");
        assert_eq!(shown(""), r#""""#);
    }
}
