//! kiln exports ML models to StableHLO for the IREE compiler.
//!
//! The pipeline, one module per stage:
//! [`weights`] (mmap checkpoints) → [`trace`] (shape-only DSL) → [`graph`]
//! (the IR) → [`lower`] (typed StableHLO through MLIR's C API) →
//! `.mlir` + parameters; [`interp`] runs a graph on the CPU as the
//! reference, and [`iree`] drives `iree-compile` and `iree-run-module`.

// Every public item is documented; keep it so.
#![warn(missing_docs)]

pub mod atomic;
pub mod check;
pub mod export;
pub mod graph;
pub mod inspect;
pub mod interp;
pub mod iree;
pub mod lower;
pub mod models;
pub mod npy;
pub mod tokenizer;
pub mod trace;
pub mod weights;

pub use atomic::{write_atomically, write_atomically_with, AtomicFile};

/// The process's peak resident memory in bytes (`VmHWM` in
/// `/proc/self/status`), where the OS reports it.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The largest `|a - b|` of two equally long runs of values, for tests:
/// equal values (infinities too) differ by 0, and a NaN on either side is
/// an infinite difference (`f64::max` would drop it, and NaN logits would
/// pass any tolerance).
#[cfg(test)]
pub(crate) fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "compared runs differ in length");
    let diff = |(x, y): (&f64, &f64)| match (x - y).abs() {
        _ if x == y => 0.0,
        d if d.is_nan() => f64::INFINITY,
        d => d,
    };
    a.iter().zip(b).map(diff).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    #[test]
    fn max_abs_diff_counts_a_nan_as_infinite() {
        assert_eq!(super::max_abs_diff(&[1.0, 2.0], &[1.5, 2.0]), 0.5);
        assert_eq!(super::max_abs_diff(&[f64::NEG_INFINITY, 1.0], &[f64::NEG_INFINITY, 1.0]), 0.0);
        assert_eq!(super::max_abs_diff(&[1.0, f64::NAN], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(super::max_abs_diff(&[f64::NAN], &[f64::NAN]), f64::INFINITY);
    }
}
