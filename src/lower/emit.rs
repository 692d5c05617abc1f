//! Writing a lowered module: MLIR text or MLIR bytecode, streamed.
//!
//! A module with inline params (`dense_resource` blobs) can be as large as
//! the model, so both forms are streamed from MLIR's printer into the
//! writer, never collected in a string first. Bytecode stores each blob's
//! bytes raw and aligned; text stores them as hex in the trailing
//! `{-# dialect_resources: { builtin: { name: "0x<alignment><bytes>" } } #-}`
//! section, twice the size and slower to parse, but both compile.

use super::LowerError;
use melior::ir::operation::OperationPrintingFlags;
use melior::ir::Module;
use mlir_sys::MlirStringRef;
use std::ffi::c_void;
use std::io::{self, Write};
use std::path::Path;

/// The form a module is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    /// MLIR text.
    Mlir {
        /// With `Some(n)`, resource blobs over `n` bytes print as an
        /// `"__elided__"`-style placeholder: readable, but no longer
        /// compilable; `None` prints every blob in full.
        elide_resources_over: Option<usize>,
    },
    /// MLIR bytecode (`.mlirbc`), which `iree-compile` reads like text.
    Mlirbc,
}

impl Default for Emit {
    /// Text that compiles: every resource in full.
    fn default() -> Self {
        Emit::Mlir { elide_resources_over: None }
    }
}

impl Emit {
    /// Bytecode for a `.mlirbc` path, full text otherwise.
    pub fn for_path(path: &Path) -> Emit {
        match path.extension() {
            Some(ext) if ext == "mlirbc" => Emit::Mlirbc,
            _ => Emit::default(),
        }
    }
}

/// Receives MLIR's output; keeps the first write error, after which the
/// rest of the output is dropped (MLIR's printer cannot be stopped).
struct Sink<'w> {
    out: &'w mut dyn Write,
    written: &'w mut dyn FnMut(&[u8]),
    error: Option<io::Error>,
}

unsafe extern "C" fn sink_callback(chunk: MlirStringRef, user_data: *mut c_void) {
    // SAFETY: `user_data` is the `Sink` that `write_module` passed for this
    // call only, and nothing else touches it meanwhile.
    let sink = unsafe { &mut *(user_data as *mut Sink) };
    if sink.error.is_some() || chunk.length == 0 {
        return;
    }
    // SAFETY: MLIR hands a valid (data, length) pair for the callback's duration.
    let bytes = unsafe { std::slice::from_raw_parts(chunk.data as *const u8, chunk.length) };
    // A blob comes whole (hundreds of MB for an output head): pass it on in
    // pieces, so what `written` drops is never more than one piece behind.
    for piece in bytes.chunks(WRITE_PIECE) {
        if let Err(e) = sink.out.write_all(piece) {
            sink.error = Some(e);
            return;
        }
        (sink.written)(piece);
    }
}

const WRITE_PIECE: usize = 16 << 20;

/// Writes `module` to `out` in the form `emit` names.
pub fn write_module(module: &Module<'_>, emit: Emit, out: &mut dyn Write) -> io::Result<()> {
    write_module_with(module, emit, out, &mut |_| {})
}

/// [`write_module`], calling `written(chunk)` once each chunk of output is
/// written. MLIR's bytecode writer hands a `dense_resource` blob over as
/// the blob's own memory, so `written` can drop the pages of a mapped
/// checkpoint as they are written out (see `export`).
pub fn write_module_with(
    module: &Module<'_>,
    emit: Emit,
    out: &mut dyn Write,
    written: &mut dyn FnMut(&[u8]),
) -> io::Result<()> {
    let mut sink = Sink { out, written, error: None };
    let user_data = &mut sink as *mut Sink as *mut c_void;
    let op = module.as_operation().to_raw();
    match emit {
        Emit::Mlir { elide_resources_over } => {
            let flags = OperationPrintingFlags::new();
            if let Some(limit) = elide_resources_over {
                // SAFETY: `flags` is a live printing-flags object.
                unsafe {
                    mlir_sys::mlirOpPrintingFlagsElideLargeResourceString(
                        flags.to_raw(),
                        isize::try_from(limit).unwrap_or(isize::MAX),
                    )
                };
            }
            // SAFETY: `op` is a live, verified operation; the callback only
            // sees `sink` during this call.
            unsafe { mlir_sys::mlirOperationPrintWithFlags(op, flags.to_raw(), Some(sink_callback), user_data) };
        }
        // SAFETY: as above.
        Emit::Mlirbc => unsafe { mlir_sys::mlirOperationWriteBytecode(op, Some(sink_callback), user_data) },
    }
    match sink.error {
        Some(e) => Err(e),
        None => sink.out.flush(),
    }
}

/// Writes `module` to `path` atomically: a temporary file in the same
/// folder, renamed over `path` once complete.
pub fn write_module_to_path(module: &Module<'_>, emit: Emit, path: &Path) -> Result<(), LowerError> {
    write_module_to_path_with(module, emit, path, &mut |_| {})
}

/// [`write_module_to_path`] with [`write_module_with`]'s `written`.
pub fn write_module_to_path_with(
    module: &Module<'_>,
    emit: Emit,
    path: &Path,
    written: &mut dyn FnMut(&[u8]),
) -> Result<(), LowerError> {
    crate::write_atomically_with(path, |out| write_module_with(module, emit, out, written))
        .map_err(|source| LowerError::Write { path: path.to_path_buf(), source })
}
