//! Minimal NumPy `.npy` files for interpreter values: how inputs and outputs
//! travel to and from `iree-run-module --input=@x.npy --output=@y.npy`.
//!
//! Writes version 1.0; reads 1.0 and 2.0. Only little-endian, C-order data
//! of the dtypes below; bf16 has no NumPy dtype and is refused rather than
//! written as raw `<u2` bits, which IREE would not read back as bf16.

use crate::graph::{DType, TensorType};
use crate::interp::{checked_num_elements, Value};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

const MAGIC: &[u8] = b"\x93NUMPY";

/// Why a `.npy` file could not be written or read; each names the file.
#[derive(Debug, Error)]
pub enum NpyError {
    #[error("{}: {error}", path.display())]
    /// The file could not be created, written or read.
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    /// The file is not a `.npy` file kiln reads, or its header cannot be written.
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    #[error("{}: {dtype} has no NumPy dtype that IREE reads back as {dtype}", path.display())]
    /// The value's dtype has no NumPy dtype IREE reads back as the same type.
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The value's dtype.
        dtype: DType,
    },
}

fn descr(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("<f4"),
        DType::F16 => Some("<f2"),
        DType::I32 => Some("<i4"),
        DType::I64 => Some("<i8"),
        DType::I16 => Some("<i2"),
        DType::I8 => Some("|i1"),
        DType::UI8 => Some("|u1"),
        DType::UI16 => Some("<u2"),
        DType::UI32 => Some("<u4"),
        DType::I1 => Some("|b1"),
        DType::BF16 => None,
    }
}

/// Writes `v` as a version 1.0 `.npy` file (bf16 is refused, see the module docs).
pub fn write(path: &Path, v: &Value) -> Result<(), NpyError> {
    let io = |error| NpyError::Io { path: path.to_path_buf(), error };
    let descr =
        descr(v.ty.dtype).ok_or_else(|| NpyError::Unsupported { path: path.to_path_buf(), dtype: v.ty.dtype })?;
    let dims: Vec<String> = v.ty.shape.iter().map(|d| d.to_string()).collect();
    // Python tuple syntax: `()`, `(n,)`, `(a, b)`.
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic, version and length take 10 bytes; the spec pads the whole
    // preamble with spaces to a multiple of 64, ending in a newline.
    let total = (MAGIC.len() + 4 + header.len() + 1).next_multiple_of(64);
    header.extend(std::iter::repeat_n(' ', total - (MAGIC.len() + 4 + header.len() + 1)));
    header.push('\n');
    let header_len = u16::try_from(header.len()).map_err(|_| NpyError::Format {
        path: path.to_path_buf(),
        message: format!("a header for {} does not fit version 1.0", v.ty),
    })?;

    let mut out = BufWriter::new(std::fs::File::create(path).map_err(io)?);
    out.write_all(MAGIC).map_err(io)?;
    out.write_all(&[1, 0]).map_err(io)?;
    out.write_all(&header_len.to_le_bytes()).map_err(io)?;
    out.write_all(header.as_bytes()).map_err(io)?;
    out.write_all(&v.to_le_bytes()).map_err(io)?;
    out.flush().map_err(io)
}

/// Reads a `.npy` file of a supported dtype, C order, little-endian.
pub fn read(path: &Path) -> Result<Value, NpyError> {
    let bad = |message: String| NpyError::Format { path: path.to_path_buf(), message };
    let bytes = std::fs::read(path).map_err(|error| NpyError::Io { path: path.to_path_buf(), error })?;
    if bytes.len() < 10 || !bytes.starts_with(MAGIC) {
        return Err(bad("not a .npy file (no \\x93NUMPY magic)".into()));
    }
    // Version 2.0 only widens the header length to u32.
    let (len, start): (usize, usize) = match (bytes[6], bytes[7]) {
        (1, 0) => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        (2, 0) if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        (major, minor) => return Err(bad(format!("unsupported .npy version {major}.{minor}"))),
    };
    let header = bytes
        .get(start..start.saturating_add(len))
        .ok_or_else(|| bad(format!("header length {len} runs past the end of the file")))?;
    let header = std::str::from_utf8(header).map_err(|_| bad("header is not text".into()))?;
    let (dtype, shape) = parse_header(header).map_err(|m| bad(format!("{m} in header {}", header.trim_end())))?;
    let ty = TensorType::new(shape, dtype);
    let data = &bytes[start + len..];
    // Checked: the shape comes from the file.
    let need = checked_num_elements(&ty.shape).and_then(|n| n.checked_mul(dtype.size_in_bytes()));
    if need != Some(data.len()) {
        let need = need.map_or("an overflowing number of".into(), |n| n.to_string());
        return Err(bad(format!("{ty} needs {need} bytes of data, the file has {}", data.len())));
    }
    Value::from_le_bytes(&ty, data).map_err(|e| bad(e.to_string()))
}

/// Reads the dict loosely: the value after each of `'descr'`,
/// `'fortran_order'` and `'shape'`, wherever they are.
fn parse_header(header: &str) -> Result<(DType, Vec<usize>), String> {
    let value = |key: &str| -> Result<&str, String> {
        let at = header
            .find(&format!("'{key}'"))
            .or_else(|| header.find(&format!("\"{key}\"")))
            .ok_or_else(|| format!("no '{key}'"))?;
        let rest = header[at + key.len() + 2..].trim_start();
        Ok(rest.strip_prefix(':').ok_or_else(|| format!("no ':' after '{key}'"))?.trim_start())
    };
    let d = value("descr")?;
    let quote = d.chars().next().filter(|c| *c == '\'' || *c == '"').ok_or("descr is not a string")?;
    let d = d[1..].split(quote).next().unwrap_or_default();
    let dtype = DType::ALL.into_iter().find(|&t| descr(t) == Some(d)).ok_or_else(|| {
        format!("unsupported descr '{d}' (expected <f4, <f2, <i8, <i4, <i2, |i1, <u4, <u2, |u1 or |b1)")
    })?;
    if !value("fortran_order")?.starts_with("False") {
        return Err("fortran_order must be False".into());
    }
    let s = value("shape")?;
    let inner = s.strip_prefix('(').and_then(|s| s.split_once(')')).ok_or("shape is not a tuple")?.0;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<usize>().map_err(|_| format!("bad dimension '{p}'")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((dtype, shape))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::Buffer;

    #[test]
    fn round_trips_every_dtype_and_rank() {
        let dir = tempfile::tempdir().unwrap();
        for dtype in DType::ALL.into_iter().filter(|&d| d != DType::BF16) {
            for shape in [vec![], vec![5], vec![2, 3], vec![2, 0, 4], vec![1, 2, 1, 3]] {
                let v = Value::random(&TensorType::new(shape, dtype), 9, -50..50);
                let path = dir.path().join("v.npy");
                write(&path, &v).unwrap();
                let raw = std::fs::read(&path).unwrap();
                let header_end = 10 + u16::from_le_bytes([raw[8], raw[9]]) as usize;
                assert_eq!(header_end % 64, 0);
                assert_eq!(raw[header_end - 1], b'\n');
                assert_eq!(read(&path).unwrap(), v, "{}", v.ty);
            }
        }
    }

    #[test]
    fn header_is_numpys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.npy");
        let header = |v: Value| {
            write(&path, &v).unwrap();
            let raw = std::fs::read(&path).unwrap();
            let end = raw.iter().position(|&b| b == b'}').unwrap();
            String::from_utf8(raw[10..=end].to_vec()).unwrap()
        };
        let scalar = Value::new(TensorType::new([], DType::F32), vec![1.5f32].into()).unwrap();
        assert_eq!(header(scalar), "{'descr': '<f4', 'fortran_order': False, 'shape': (), }");
        let v = Value::new(TensorType::new([3], DType::I1), vec![true, false, true].into()).unwrap();
        assert_eq!(header(v), "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }");
        let v = Value::random(&TensorType::new([2, 3], DType::I64), 0, 0..1);
        assert_eq!(header(v), "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }");
    }

    #[test]
    fn reads_version_2_and_loose_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v2.npy");
        let header = "{\"shape\": (2,),  \"fortran_order\": False, \"descr\": \"<i4\"}\n";
        let mut raw = b"\x93NUMPY\x02\x00".to_vec();
        raw.extend_from_slice(&(header.len() as u32).to_le_bytes());
        raw.extend_from_slice(header.as_bytes());
        raw.extend_from_slice(&[7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        std::fs::write(&path, raw).unwrap();
        assert_eq!(read(&path).unwrap().data, Buffer::from(vec![7i32, -1]));
    }

    #[test]
    fn refuses_bf16_and_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.npy");
        let v = Value::random(&TensorType::new([2], DType::BF16), 0, 0..1);
        let e = write(&path, &v).unwrap_err().to_string();
        assert!(e.ends_with("bf16 has no NumPy dtype that IREE reads back as bf16"), "{e}");

        let file = |header: &str, data: &[u8]| {
            let mut raw = b"\x93NUMPY\x01\x00".to_vec();
            raw.extend_from_slice(&(header.len() as u16).to_le_bytes());
            raw.extend_from_slice(header.as_bytes());
            raw.extend_from_slice(data);
            std::fs::write(&path, raw).unwrap();
            read(&path).unwrap_err().to_string()
        };
        let h = |descr: &str, fortran: &str, shape: &str| {
            format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}\n")
        };
        assert!(file(&h("<u8", "False", "(1,)"), &[0; 8]).contains("unsupported descr '<u8'"));
        assert!(file(&h(">f4", "False", "(1,)"), &[0; 4]).contains("unsupported descr '>f4'"));
        assert!(file(&h("<f4", "True", "(2, 2)"), &[0; 16]).contains("fortran_order must be False"));
        assert!(
            file(&h("<f4", "False", "(3,)"), &[0; 8]).contains("tensor<3xf32> needs 12 bytes of data, the file has 8")
        );
        let huge = h("<i8", "False", "(18446744073709551615, 2)");
        assert!(file(&huge, &[0; 8]).contains("an overflowing number of bytes"));
        assert!(file(&h("<f4", "False", "(x,)"), &[]).contains("bad dimension 'x'"));
        assert!(file("{'descr': '<f4'}", &[]).contains("no 'fortran_order'"));

        std::fs::write(&path, b"\x93NUMPY\x01\x00\xff\xff{}").unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("runs past the end"));
        std::fs::write(&path, b"PK\x03\x04").unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("not a .npy file"));
        std::fs::write(&path, b"\x93NUMPY\x03\x00\x00\x00\x00\x00").unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("unsupported .npy version 3.0"));
    }
}
