//! CPU dequantizers from ggml's tensor types to f32: one function per type
//! over a single block, fields named as in ggml's C structs, sizes from the
//! one table in [`super::ggml`].
//!
//! The target is the f32 bits of gguf-py's `gguf.quants.dequantize`
//! (llama.cpp `gguf-py/gguf/quants.py`): where its numpy float32 operation
//! order differs from ggml C's (`ggml-quants.c`), gguf-py's is followed. The
//! few types gguf-py lacks follow ggml C; each function says which it matches.
//!
//! [`dequantize`] takes any whole number of blocks, so a huge tensor can be
//! converted chunk by chunk with bounded memory.

mod grids;
mod iq;
mod iq4;
mod kquants;
mod legacy;
mod mxfp4;
mod plain;
mod ternary;

use super::ggml::GgmlType;
use thiserror::Error;

/// Why a buffer could not be dequantized.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum QuantError {
    /// The input is not a whole number of blocks.
    #[error("{ty}: {len} bytes is not a whole number of {type_size}-byte blocks")]
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// The input's length in bytes.
        len: usize,
        /// Bytes per block.
        type_size: usize,
    },
    /// The output does not hold exactly the input's elements.
    #[error("{ty}: {blocks} blocks of {block_size} need room for {blocks}×{block_size} f32s, but the output holds {out_len}")]
    OutputLen {
        /// The type.
        ty: GgmlType,
        /// Blocks in the input.
        blocks: usize,
        /// Elements per block.
        block_size: usize,
        /// The output's length.
        out_len: usize,
    },
}

/// Dequantizes `bytes`, a whole number of `ty` blocks, into `out`, which
/// must hold exactly `blocks × block_size` values.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let blocks = whole_blocks(ty, bytes)?;
    let block_size = ty.block_size();
    if blocks.checked_mul(block_size) != Some(out.len()) {
        return Err(QuantError::OutputLen { ty, blocks, block_size, out_len: out.len() });
    }
    use GgmlType as T;
    match ty {
        T::F32 => each_value(bytes, out, plain::f32),
        T::F16 => plain::f16_slice(bytes, out),
        T::BF16 => each_value(bytes, out, plain::bf16),
        T::F64 => each_value(bytes, out, plain::f64),
        T::I8 => each_value(bytes, out, plain::i8),
        T::I16 => each_value(bytes, out, plain::i16),
        T::I32 => each_value(bytes, out, plain::i32),
        T::I64 => each_value(bytes, out, plain::i64),
        T::Q4_0 => each_block(bytes, out, legacy::dequantize_q4_0),
        T::Q4_1 => each_block(bytes, out, legacy::dequantize_q4_1),
        T::Q5_0 => each_block(bytes, out, legacy::dequantize_q5_0),
        T::Q5_1 => each_block(bytes, out, legacy::dequantize_q5_1),
        T::Q8_0 => each_block(bytes, out, legacy::dequantize_q8_0),
        T::Q8_1 => each_block(bytes, out, legacy::dequantize_q8_1),
        T::Q2_K => each_block(bytes, out, kquants::dequantize_q2_k),
        T::Q3_K => each_block(bytes, out, kquants::dequantize_q3_k),
        T::Q4_K => each_block(bytes, out, kquants::dequantize_q4_k),
        T::Q5_K => each_block(bytes, out, kquants::dequantize_q5_k),
        T::Q6_K => each_block(bytes, out, kquants::dequantize_q6_k),
        T::Q8_K => each_block(bytes, out, kquants::dequantize_q8_k),
        T::IQ4_NL => each_block(bytes, out, iq4::dequantize_iq4_nl),
        T::IQ4_XS => each_block(bytes, out, iq4::dequantize_iq4_xs),
        T::IQ2_XXS => each_block(bytes, out, iq::dequantize_iq2_xxs),
        T::IQ2_XS => each_block(bytes, out, iq::dequantize_iq2_xs),
        T::IQ2_S => each_block(bytes, out, iq::dequantize_iq2_s),
        T::IQ3_XXS => each_block(bytes, out, iq::dequantize_iq3_xxs),
        T::IQ3_S => each_block(bytes, out, iq::dequantize_iq3_s),
        T::IQ1_S => each_block(bytes, out, iq::dequantize_iq1_s),
        T::IQ1_M => each_block(bytes, out, iq::dequantize_iq1_m),
        T::TQ1_0 => each_block(bytes, out, ternary::dequantize_tq1_0),
        T::TQ2_0 => each_block(bytes, out, ternary::dequantize_tq2_0),
        T::MXFP4 => each_block(bytes, out, mxfp4::dequantize_mxfp4),
    }
    Ok(())
}

/// [`dequantize`] into a new vector.
pub fn dequantize_to_vec(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>, QuantError> {
    let mut out = vec![0.0; whole_blocks(ty, bytes)? * ty.block_size()];
    dequantize(ty, bytes, &mut out)?;
    Ok(out)
}

fn whole_blocks(ty: GgmlType, bytes: &[u8]) -> Result<usize, QuantError> {
    let type_size = ty.type_size();
    if !bytes.len().is_multiple_of(type_size) {
        return Err(QuantError::PartialBlock { ty, len: bytes.len(), type_size });
    }
    Ok(bytes.len() / type_size)
}

/// Runs a block function over matching chunks; `TS` and `BS` come from its
/// signature, and `dequantize` has checked the lengths against the table.
#[inline(always)]
fn each_block<const TS: usize, const BS: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn(&[u8; TS], &mut [f32; BS])) {
    debug_assert_eq!((bytes.len() / TS, bytes.len() % TS), (out.len() / BS, 0), "block function vs ggml table");
    for (block, y) in bytes.as_chunks::<TS>().0.iter().zip(out.as_chunks_mut::<BS>().0) {
        f(block, y);
    }
}

/// [`each_block`] for the plain types, whose blocks are single values.
#[inline(always)]
fn each_value<const N: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    for (x, y) in bytes.as_chunks::<N>().0.iter().zip(out) {
        *y = f(*x);
    }
}

/// A block's bytes, peeled off in struct order like gguf-py's
/// `d, rest = np.hsplit(blocks, [2])`.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    #[inline(always)]
    fn take<const N: usize>(&mut self) -> &'a [u8; N] {
        // Block functions take fixed-size arrays, so this folds away.
        let (field, rest) = self.0.split_first_chunk().expect("fields lie within the block: sizes are the C struct's");
        self.0 = rest;
        field
    }

    /// A `ggml_half` field; exact, as is numpy's `astype(np.float32)`.
    #[inline(always)]
    fn f16(&mut self) -> f32 {
        half::f16::from_le_bytes(*self.take()).to_f32()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::fs::{self, File};
    use std::io::{BufReader, Read};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};

    const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
    const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/test/quant");

    fn python(script: &str, args: &[&OsStr]) -> Child {
        assert!(Path::new(PYTHON).exists(), "{PYTHON} is missing: run `make setup` to create the venv with gguf-py");
        let mut cmd = Command::new(PYTHON);
        cmd.arg(Path::new(SCRIPTS).join(script));
        let child = cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
        child.unwrap_or_else(|e| panic!("cannot run {PYTHON}: {e}; run `make setup`"))
    }

    fn finish(child: Child, what: &str) {
        let out = child.wait_with_output().expect("python's output is readable");
        assert!(
            out.status.success(),
            "{what} failed ({}); run `make setup` if a package is missing:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
        bytes.as_chunks::<4>().0.iter().map(|b| f32::from_le_bytes(*b))
    }

    /// Index and values of the first element whose bits differ, and how many do.
    fn mismatches(got: &[f32], want: &[u8]) -> Option<(usize, f32, f32, usize)> {
        assert_eq!(got.len() * 4, want.len());
        let mut bad = got.iter().zip(f32s(want)).enumerate().filter(|(_, (g, w))| g.to_bits() != w.to_bits());
        let (i, (g, w)) = bad.next()?;
        Some((i, *g, w, 1 + bad.count()))
    }

    #[test]
    fn sizes_match_the_ggml_table() {
        for ty in GgmlType::ALL {
            // Two blocks of zeros: a block function whose array sizes
            // disagree with the table trips `each_block`'s debug_assert.
            let bytes = vec![0u8; 2 * ty.type_size()];
            let out = dequantize_to_vec(ty, &bytes).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(out.len(), 2 * ty.block_size(), "{ty}");
            assert!(out.iter().all(|&x| x == 0.0), "{ty}: zeros dequantize to {out:?}");
        }
    }

    #[test]
    fn errors_name_type_and_sizes() {
        let err = dequantize_to_vec(GgmlType::Q4_K, &[0; 145]).unwrap_err();
        assert_eq!(err.to_string(), "Q4_K: 145 bytes is not a whole number of 144-byte blocks");
        let err = dequantize(GgmlType::Q8_0, &[0; 68], &mut [0.0; 63]).unwrap_err();
        assert_eq!(err.to_string(), "Q8_0: 2 blocks of 32 need room for 2×32 f32s, but the output holds 63");
        assert_eq!(dequantize(GgmlType::F16, &[], &mut []), Ok(()));
    }

    /// Random blocks of every type against gguf-py (or, for the types it
    /// lacks, numpy after ggml C): one python run for all types.
    #[test]
    fn random_blocks_bit_exact_with_gguf_py() {
        const SEED: &str = "20240601";
        const BLOCKS: usize = 300;
        let dir = tempfile::tempdir().expect("temp dir");
        let blocks = BLOCKS.to_string();
        let mut args = vec![dir.path().as_os_str(), SEED.as_ref(), blocks.as_ref()];
        args.extend(GgmlType::ALL.iter().map(|t| OsStr::new(t.name())));
        finish(python("gguf_reference.py", &args), "test/quant/gguf_reference.py");

        let mut failures = Vec::new();
        for ty in GgmlType::ALL {
            let read = |f: &str| fs::read(dir.path().join(ty.name()).join(f)).expect("gguf_reference.py output");
            let (bytes, want, source) = (read("blocks.bin"), read("expected.f32"), read("source.txt"));
            let source = String::from_utf8_lossy(&source);
            let n = BLOCKS * ty.block_size();
            let got = dequantize_to_vec(ty, &bytes).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got.len(), n, "{ty}");
            if let Some((i, g, w, count)) = mismatches(&got, &want) {
                failures.push(format!(
                    "{ty}: {count} of {n} values differ from {source}; first at {i} (block {}, element {}): kiln {g:e} ({:#010x}), {source} {w:e} ({:#010x})",
                    i / ty.block_size(),
                    i % ty.block_size(),
                    g.to_bits(),
                    w.to_bits()
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// `grids.rs` is what `gen_grids.py` makes of gguf-py's grids today.
    #[test]
    fn grids_are_gen_grids_output() {
        let child = python("gen_grids.py", &[]);
        let out = child.wait_with_output().expect("python's output is readable");
        assert!(out.status.success(), "test/quant/gen_grids.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let generated = String::from_utf8(out.stdout).expect("gen_grids.py prints UTF-8");
        assert!(
            generated == include_str!("grids.rs"),
            "src/weights/quant/grids.rs differs from gen_grids.py's output: rerun\n  .venv/bin/python test/quant/gen_grids.py > src/weights/quant/grids.rs"
        );
    }

    #[derive(serde::Deserialize)]
    struct Index {
        checkpoint: PathBuf,
        tensors: Vec<TensorEntry>,
    }

    #[derive(serde::Deserialize)]
    struct TensorEntry {
        name: String,
        #[serde(rename = "type")]
        ty: String,
        quant_nbytes: usize,
        f32_nbytes: usize,
    }

    /// Compares every tensor of the checkpoint `dequant_checkpoint.py` wrote
    /// to `dir`, in chunks of whole blocks (as a streaming caller would).
    /// Returns a summary line, or the mismatching tensors.
    fn compare_checkpoint(dir: &Path) -> Result<String, String> {
        const CHUNK: usize = 1 << 16; // values per chunk
        let index: Index =
            serde_json::from_slice(&fs::read(dir.join("index.json")).expect("index.json")).expect("index.json parses");
        let open = |f: &str| BufReader::with_capacity(1 << 20, File::open(dir.join(f)).expect(f));
        let (mut quant, mut expected) = (open("quant.bin"), open("expected.f32"));
        let (mut qbuf, mut fbuf, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let mut per_type = std::collections::BTreeMap::<String, (usize, usize)>::new();
        let mut failures = Vec::new();
        for t in &index.tensors {
            let ty = *GgmlType::ALL
                .iter()
                .find(|ty| ty.name() == t.ty)
                .unwrap_or_else(|| panic!("{}: type {}", t.name, t.ty));
            let n = t.f32_nbytes / 4;
            assert_eq!(Some(t.quant_nbytes as u64), ty.byte_len(n as u64), "{}: {ty} size", t.name);
            let blocks_per_chunk = (CHUNK / ty.block_size()).max(1);
            let (mut done, mut first_bad, mut bad) = (0, None, 0);
            while done < n {
                let values = (blocks_per_chunk * ty.block_size()).min(n - done);
                qbuf.resize(values / ty.block_size() * ty.type_size(), 0);
                fbuf.resize(values * 4, 0);
                out.resize(values, 0.0);
                quant.read_exact(&mut qbuf).expect("quant.bin");
                expected.read_exact(&mut fbuf).expect("expected.f32");
                dequantize(ty, &qbuf, &mut out).unwrap_or_else(|e| panic!("{}: {e}", t.name));
                if let Some((i, g, w, count)) = mismatches(&out, &fbuf) {
                    first_bad.get_or_insert((done + i, g, w));
                    bad += count;
                }
                done += values;
            }
            let entry = per_type.entry(t.ty.clone()).or_default();
            *entry = (entry.0 + 1, entry.1 + n);
            if let Some((i, g, w)) = first_bad {
                failures
                    .push(format!("  {} ({ty}): {bad} of {n} differ; first at {i}: kiln {g:e}, gguf-py {w:e}", t.name));
            }
        }
        let types: Vec<String> = per_type.iter().map(|(ty, (k, n))| format!("{ty}: {k} tensors, {n} values")).collect();
        let summary =
            format!("{}: {} tensors bit-exact ({})", index.checkpoint.display(), index.tensors.len(), types.join("; "));
        if failures.is_empty() {
            Ok(summary)
        } else {
            let (count, more) = (failures.len(), failures.len().saturating_sub(10));
            failures.truncate(10);
            if more > 0 {
                failures.push(format!("  ... and {more} more"));
            }
            Err(format!(
                "{}: {count} tensors differ from gguf-py:\n{}",
                index.checkpoint.display(),
                failures.join("\n")
            ))
        }
    }

    /// Every tensor of two real checkpoints (installed by `make setup`)
    /// against gguf-py, bit for bit. Both python runs start at once; the
    /// comparison of the first overlaps the second's dequantization.
    #[test]
    fn checkpoints_bit_exact_with_gguf_py() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ckpts = ["smollm2", "gemma3"];
        let runs: Vec<(PathBuf, Child)> = ckpts
            .iter()
            .map(|c| {
                let out = dir.path().join(c);
                let child = python("dequant_checkpoint.py", &[c.as_ref(), out.as_os_str()]);
                (out, child)
            })
            .collect();
        let mut results = Vec::new();
        for (c, (out, child)) in ckpts.iter().zip(runs) {
            finish(child, &format!("test/quant/dequant_checkpoint.py {c}"));
            results.push(compare_checkpoint(&out));
        }
        for summary in results.iter().flatten() {
            eprintln!("{summary}");
        }
        let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(errors.is_empty(), "{}", errors.iter().map(|e| e.as_str()).collect::<Vec<_>>().join("\n"));
    }
}
