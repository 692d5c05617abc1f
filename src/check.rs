//! End-to-end check of one graph: the reference interpreter against the
//! module IREE compiled from kiln's lowering, on the same seeded inputs and
//! params.
//!
//! Params are written to a safetensors file and read back through kiln's
//! reader for the interpreter, and passed to `iree-run-module` as
//! `--parameters=model=FILE`, so both sides see the same bytes.

use crate::graph::{Graph, Op, TensorType, ValueId};
use crate::interp::{self, InterpError, Value};
use crate::iree::{Iree, IreeError};
use crate::lower::{self, LowerError, LowerOptions};
use crate::npy::{self, NpyError};
use crate::weights::safetensors::{self, SafeTensors, StDType};
use crate::weights::WeightsError;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Why a check could not run (a mismatch is not an error: see [`CheckReport::ok`]).
#[derive(Debug, Error)]
pub enum CheckError {
    /// The graph did not lower.
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// The reference interpreter failed.
    #[error(transparent)]
    Interp(#[from] InterpError),
    /// `iree-compile` or `iree-run-module` failed.
    #[error(transparent)]
    Iree(#[from] IreeError),
    /// An input or output `.npy` file could not be written or read.
    #[error(transparent)]
    Npy(#[from] NpyError),
    /// The params file could not be written or read back.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// A file in the work folder could not be written.
    #[error("{context}: {error}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        error: std::io::Error,
    },
}

/// How [`check_graph`] seeds its data and compares the results.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Seed of the random inputs and params.
    pub seed: u64,
    /// Float outputs match when `|iree - ref| <= atol + rtol * |ref|`.
    pub rtol: f64,
    /// Absolute tolerance, with `rtol`.
    pub atol: f64,
    /// Run-time sizes a graph with `?` dims is run at, each with its own
    /// seeded inputs, through one compiled module.
    pub dynamic_sizes: Vec<usize>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { seed: 0, rtol: 1e-5, atol: 1e-6, dynamic_sizes: vec![2, 5] }
    }
}

/// How one output compared.
#[derive(Clone, Debug)]
pub struct OutputReport {
    /// Which graph output this is.
    pub index: usize,
    /// The size of `?` in this run, for a graph with `?` dims.
    pub dynamic_size: Option<usize>,
    /// The interpreter's result type.
    pub ty: TensorType,
    /// Largest `|iree - ref|` (infinite where only one side is NaN or infinite).
    pub max_abs_err: f64,
    /// Largest `|iree - ref| / |ref|` over nonzero references.
    pub max_rel_err: f64,
    /// Whether the values match: exactly for integers, within tolerance for floats.
    pub ok: bool,
    /// The interpreter's value.
    pub reference: Value,
    /// IREE's value.
    pub iree: Value,
}

impl fmt::Display for OutputReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "output {}", self.index)?;
        if let Some(size) = self.dynamic_size {
            write!(f, " (?={size})")?;
        }
        write!(
            f,
            ": {} max_abs_err={:.3e} max_rel_err={:.3e} {}",
            self.ty,
            self.max_abs_err,
            self.max_rel_err,
            if self.ok { "ok" } else { "MISMATCH" }
        )
    }
}

/// The outcome of [`check_graph`].
#[derive(Debug)]
pub struct CheckReport {
    /// The lowered module's text, as compiled.
    pub mlir: String,
    /// Each output of each run, in order.
    pub outputs: Vec<OutputReport>,
}

impl CheckReport {
    /// Whether every output matched.
    pub fn ok(&self) -> bool {
        self.outputs.iter().all(|o| o.ok)
    }
}

/// Seeded inputs: floats in [-1, 1); integers in [0, 4), or in range of the
/// table rows when the input indexes a `gather`; each `?` is `dynamic_size`.
pub fn random_inputs(graph: &Graph, seed: u64, dynamic_size: usize) -> Vec<Value> {
    graph
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let ty = graph.node(v).ty.with_dynamic_size(dynamic_size);
            Value::random(&ty, seed.wrapping_add(i as u64), 0..index_bound(graph, v).unwrap_or(4))
        })
        .collect()
}

/// The row count of the smallest table `v` indexes, if it is gather indices.
fn index_bound(graph: &Graph, v: ValueId) -> Option<i64> {
    graph
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Gather) && n.operands.get(1) == Some(&v))
        .map(|n| graph.node(n.operands[0]).ty.shape[0] as i64)
        .min()
}

/// Writes seeded params for `graph` to a safetensors file.
pub fn write_random_params(graph: &Graph, path: &Path, seed: u64) -> Result<(), CheckError> {
    let values: Vec<(String, Value)> = graph
        .params()
        .enumerate()
        .map(|(i, (_, name, ty))| (name.to_string(), Value::random(ty, seed ^ (0x9e37_79b9 + i as u64), 0..4)))
        .collect();
    let bytes: Vec<Vec<u8>> = values.iter().map(|(_, v)| v.to_le_bytes()).collect();
    let mut tensors = Vec::with_capacity(values.len());
    for ((name, v), b) in values.iter().zip(&bytes) {
        tensors.push((name.as_str(), StDType::from(v.ty.dtype), v.ty.shape.as_slice(), b.as_slice()));
    }
    safetensors::write(path, &tensors, &BTreeMap::new())?;
    Ok(())
}

/// Runs `graph` through the interpreter and through IREE in `workdir`: once,
/// or once per `options.dynamic_sizes` entry if it has `?` dims, all from
/// one compiled module.
pub fn check_graph(
    graph: &Graph,
    iree: &Iree,
    workdir: &Path,
    options: &CheckOptions,
) -> Result<CheckReport, CheckError> {
    let io = |context: String| move |error| CheckError::Io { context, error };
    let params_path = workdir.join("params.safetensors");
    write_random_params(graph, &params_path, options.seed)?;
    let params = SafeTensors::open(&params_path)?;

    let mlir = lower::lower_to_string(graph, &LowerOptions::default())?;
    let mlir_path = workdir.join("module.mlir");
    std::fs::write(&mlir_path, &mlir).map_err(io(format!("writing {}", mlir_path.display())))?;
    let vmfb = workdir.join("module.vmfb");
    iree.compile(&mlir_path, &vmfb)?;

    let dynamic = graph.inputs().iter().any(|&v| graph.node(v).ty.is_dynamic());
    let sizes: Vec<Option<usize>> = match dynamic {
        true => options.dynamic_sizes.iter().copied().map(Some).collect(),
        false => vec![None],
    };
    let mut outputs = Vec::new();
    for size in sizes {
        let inputs = random_inputs(graph, options.seed.wrapping_add(size.unwrap_or(0) as u64), size.unwrap_or(0));
        let expected = interp::run(graph, &inputs, &params)?;
        let tag = size.map(|s| format!("_{s}")).unwrap_or_default();
        let mut input_paths = Vec::new();
        for (i, v) in inputs.iter().enumerate() {
            let p = workdir.join(format!("input{i}{tag}.npy"));
            npy::write(&p, v)?;
            input_paths.push(p);
        }
        let output_paths: Vec<PathBuf> =
            (0..expected.len()).map(|i| workdir.join(format!("output{i}{tag}.npy"))).collect();
        iree.run(&vmfb, &graph.name, &input_paths, &[("model", params_path.as_path())], &output_paths)?;
        for (index, (reference, path)) in expected.into_iter().zip(&output_paths).enumerate() {
            let got = npy::read(path)?;
            outputs.push(OutputReport { dynamic_size: size, ..compare(index, reference, got, options) });
        }
    }
    Ok(CheckReport { mlir, outputs })
}

fn compare(index: usize, reference: Value, iree: Value, options: &CheckOptions) -> OutputReport {
    let (mut max_abs_err, mut max_rel_err, mut ok) = (0.0f64, 0.0f64, reference.ty == iree.ty);
    if ok {
        let exact = !reference.ty.dtype.is_float();
        for (r, g) in reference.to_f64_vec().into_iter().zip(iree.to_f64_vec()) {
            if r == g || (r.is_nan() && g.is_nan()) {
                continue;
            }
            // A NaN or an infinity on one side only is an infinite error.
            let abs = (r - g).abs();
            let abs = if abs.is_nan() { f64::INFINITY } else { abs };
            max_abs_err = max_abs_err.max(abs);
            if r != 0.0 {
                max_rel_err = max_rel_err.max(abs / r.abs());
            }
            let within = if exact { abs == 0.0 } else { abs <= options.atol + options.rtol * r.abs() };
            ok &= within;
        }
    }
    OutputReport { index, dynamic_size: None, ty: reference.ty.clone(), max_abs_err, max_rel_err, ok, reference, iree }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{text, DType};

    #[test]
    fn interpreter_and_iree_agree_on_a_small_mlp() {
        let graph = text::parse(include_str!("../examples/mlp.kiln")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let report = check_graph(&graph, &Iree::for_tests(), dir.path(), &CheckOptions::default()).unwrap();
        assert!(report.ok(), "{:?}", report.outputs.iter().map(|o| o.to_string()).collect::<Vec<_>>());
        assert_eq!(report.outputs.len(), 1);
    }

    #[test]
    fn a_wrong_result_is_reported_as_a_mismatch() {
        let ty = TensorType::new([2], DType::F32);
        let reference = Value::random(&ty, 1, 0..1);
        let mut off = reference.to_f64_vec();
        off[1] += 1e-3;
        let iree = Value::new(ty, interp::Buffer::F32(off.iter().map(|&v| v as f32).collect())).unwrap();
        let report = compare(0, reference, iree, &CheckOptions::default());
        assert!(!report.ok);
        assert!(report.to_string().ends_with("MISMATCH"));
    }
}
