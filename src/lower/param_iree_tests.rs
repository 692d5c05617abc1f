//! The three ways weights reach IREE, end to end: the same graph and the
//! same weights, inline in bytecode, inline in text, and named in an
//! `.irpa` written by [`crate::weights::archive`]; each run by `iree-run-module`
//! against the reference interpreter.

use super::{write_module_to_path, Emit, LowerOptions, ParamInits, Session};
use crate::graph::{text, DType, Graph};
use crate::interp::{self, Value};
use crate::iree::Iree;
use crate::npy;
use crate::weights::archive::{self, tests::q4_k_blocks, DerivedParam, Source};
use crate::weights::ggml::GgmlType;
use crate::weights::irpa::IrpaArchive;
use crate::weights::quant;
use half::bf16;
use std::collections::HashMap;
use std::path::Path;

/// A Q4_K matrix (dequantized to f32), a bf16 and a ui8 vector.
const GRAPH: &str = r#"func @main(%x: tensor<2x256xf32>) {
  %w = param {name = "blk.0.ffn_down.weight"} : tensor<3x256xf32>
  %b = param {name = "bias"} : tensor<3xbf16>
  %s = param {name = "shift"} : tensor<3xui8>
  %y = dot_general %x, %w {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : tensor<2x3xf32>
  %bf = convert %b : tensor<3xf32>
  %sf = convert %s : tensor<3xf32>
  %t = add %bf, %sf : tensor<3xf32>
  %tb = broadcast_in_dim %t {broadcast_dimensions = [1]} : tensor<2x3xf32>
  %z = add %y, %tb : tensor<2x3xf32>
  return %z
}
"#;

/// The checkpoint side: the sources the archive converts.
struct Sources {
    q4k: Vec<u8>,
    bias_f32: Vec<u8>,
    shift: Vec<u8>,
}

impl Sources {
    fn new() -> Self {
        let bias: Vec<u8> = [0.1f32, -1.7, 2.71].iter().flat_map(|v| v.to_le_bytes()).collect();
        Sources { q4k: q4_k_blocks(3, 7), bias_f32: bias, shift: vec![1, 128, 255] }
    }

    fn derived(&self) -> [DerivedParam<'_>; 3] {
        [
            DerivedParam {
                name: "w.f32",
                source: Source::Tensor(&self.q4k),
                encoding: GgmlType::Q4_K.into(),
                target: DType::F32,
            },
            DerivedParam {
                name: "b.bf16",
                source: Source::Tensor(&self.bias_f32),
                encoding: DType::F32.into(),
                target: DType::BF16,
            },
            DerivedParam {
                name: "s.u8",
                source: Source::Tensor(&self.shift),
                encoding: DType::UI8.into(),
                target: DType::UI8,
            },
        ]
    }

    /// The params' bytes as their globals hold them, converted on the CPU.
    fn stored(&self) -> [(&'static str, Vec<u8>); 3] {
        let w = quant::dequantize_to_vec(GgmlType::Q4_K, &self.q4k).expect("whole blocks");
        let b = self.bias_f32.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")));
        [
            ("blk.0.ffn_down.weight", w.iter().flat_map(|v| v.to_le_bytes()).collect()),
            ("bias", b.flat_map(|v| bf16::from_f32(v).to_le_bytes()).collect()),
            ("shift", self.shift.clone()),
        ]
    }
}

fn input() -> Value {
    let ty = crate::graph::TensorType::new([2, 256], DType::F32);
    let data = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    Value::new(ty, interp::Buffer::F32(data)).expect("512 values")
}

/// The interpreter over the same bytes, as a ParamSource.
fn expected(graph: &Graph, stored: &[(&str, Vec<u8>)]) -> Vec<f64> {
    let params: HashMap<String, Value> = graph
        .params()
        .map(|(_, name, ty)| {
            let bytes = &stored.iter().find(|(n, _)| *n == name).expect("every param has bytes").1;
            (name.to_string(), Value::from_le_bytes(ty, bytes).expect("sizes match"))
        })
        .collect();
    let out = interp::run(graph, &[input()], &params).expect("interpreter");
    out[0].to_f64_vec()
}

/// Compiles `module_path`, runs it (binding `parameters` if given) and
/// compares with the interpreter.
fn run_and_compare(dir: &Path, module_path: &Path, parameters: Option<(&str, &Path)>, want: &[f64]) {
    let iree = Iree::for_tests();
    let vmfb = dir.join(format!("{}.vmfb", module_path.file_name().expect("a file").to_string_lossy()));
    let start = std::time::Instant::now();
    let compiled = iree.compile(module_path, &vmfb).unwrap_or_else(|e| panic!("{}: {e}", module_path.display()));
    // iree-compile's own figures: within the call's time, and at least the
    // compiler library it loads.
    assert!(compiled.seconds > 0.0 && compiled.seconds <= start.elapsed().as_secs_f64(), "{compiled:?}");
    assert!(compiled.peak_rss >= 32 << 20, "{compiled:?}");
    let (x, out) = (dir.join("x.npy"), dir.join("out.npy"));
    npy::write(&x, &input()).expect("write input");
    iree.run(&vmfb, "main", &[x], parameters.as_slice(), std::slice::from_ref(&out)).expect("iree-run-module");
    let got = npy::read(&out).expect("read output").to_f64_vec();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 + 1e-5 * w.abs(),
            "{}: output {i}: IREE {g}, interpreter {w}",
            module_path.display()
        );
    }
}

/// Inline params, written as bytecode and as text with the resources in
/// full: both compile and run with no parameter file.
#[test]
fn inline_params_run_without_a_parameter_file() {
    let graph = text::parse(GRAPH).expect("graph");
    let sources = Sources::new();
    let stored = sources.stored();
    let want = expected(&graph, &stored);
    // Cache-line aligned, as an mmap'd tensor usually is: the bytecode must
    // still be readable from iree-compile's 16-byte aligned buffer.
    let mut buffers: Vec<Vec<u8>> = stored.iter().map(|(_, bytes)| vec![0; bytes.len() + 64]).collect();
    let inits: ParamInits = stored
        .iter()
        .zip(&mut buffers)
        .map(|((name, bytes), buffer)| {
            let start = buffer.as_ptr().align_offset(64);
            let aligned = &mut buffer[start..start + bytes.len()];
            aligned.copy_from_slice(bytes);
            (*name, super::ParamInit::Inline(&*aligned))
        })
        .collect();
    let session = Session::new();
    let module = session.lower_with(&graph, &LowerOptions::default(), &inits).expect("lower");
    let dir = tempfile::tempdir().expect("tempdir");
    for (file, emit) in [("inline.mlirbc", Emit::Mlirbc), ("inline.mlir", Emit::default())] {
        let path = dir.path().join(file);
        write_module_to_path(&module, emit, &path).expect("write module");
        run_and_compare(dir.path(), &path, None, &want);
    }
}

/// Named params under their own scope and keys, from an archive of params
/// converted from the checkpoint encodings.
#[test]
fn named_params_run_from_a_derived_archive() {
    let graph = text::parse(GRAPH).expect("graph");
    let sources = Sources::new();
    let stored = sources.stored();
    let want = expected(&graph, &stored);
    let dir = tempfile::tempdir().expect("tempdir");
    let irpa = dir.path().join("derived.irpa");
    archive::write_derived(&irpa, &sources.derived()).expect("write archive");
    // The archive holds exactly the bytes the interpreter sees.
    let a = IrpaArchive::open(&irpa).expect("open archive");
    for ((_, bytes), derived) in stored.iter().zip(sources.derived()) {
        let entry = a.get(derived.name).expect("entry");
        assert!(a.data(&entry) == Some(bytes.as_slice()), "{}", derived.name);
    }

    let inits = ParamInits::new()
        .named("blk.0.ffn_down.weight", "archive", "w.f32")
        .named("bias", "archive", "b.bf16")
        .named("shift", "archive", "s.u8");
    let session = Session::new();
    let module = session.lower_with(&graph, &LowerOptions::default(), &inits).expect("lower");
    let path = dir.path().join("named.mlirbc");
    write_module_to_path(&module, Emit::Mlirbc, &path).expect("write module");
    run_and_compare(dir.path(), &path, Some(("archive", &irpa)), &want);
}
