//! kiln exports ML models to StableHLO for the IREE compiler.
//!
//! The pipeline, one module per stage:
//! [`weights`] (mmap checkpoints) → [`trace`] (shape-only DSL) → [`graph`]
//! (the IR) → [`lower`] (typed StableHLO through MLIR's C API) →
//! `.mlir` + parameters; [`interp`] runs a graph on the CPU as the
//! reference, and [`iree`] drives `iree-compile` and `iree-run-module`.

pub mod graph;
pub mod trace;
