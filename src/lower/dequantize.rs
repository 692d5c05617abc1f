//! `dequantize` as `func.call` to one private function per (ggml type, raw
//! type, shape), appended at its first use; the body is the decomposition
//! in [`crate::trace::dequant::decompose`].
//!
//! A model dequantizes hundreds of packed weights in each entry point, but
//! they come in a handful of (type, shape) pairs: sharing the bodies keeps
//! an 8B Q4_K_M module at a fifth of the ops it has inline, and the export's
//! memory with it. iree-compile inlines the calls again.

use super::{Emitter, FunctionKind, LowerError};
use crate::graph::{DType, TensorType};
use crate::trace::{dequant, Tracer};
use crate::weights::ggml::GgmlType;
use melior::ir::Value;

pub(super) fn lower_dequantize<'c, 'a>(
    e: &Emitter<'c, 'a>,
    ggml: GgmlType,
    raw: Value<'c, 'a>,
    raw_ty: &TensorType,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    lower_dequantize_after(e, ggml, raw, raw_ty, ty, None)
}

/// [`lower_dequantize`], plus (where given) `after`, a `tensor<f32>` zero
/// computed from another value, which the decoding then waits for
/// ([`dequant::decompose_after`]). `@dequantize_q4_k_4096x14336`, or
/// `@dequantize_after_...` with `after`.
pub(super) fn lower_dequantize_after<'c, 'a>(
    e: &Emitter<'c, 'a>,
    ggml: GgmlType,
    raw: Value<'c, 'a>,
    raw_ty: &TensorType,
    ty: &TensorType,
    after: Option<Value<'c, 'a>>,
) -> Result<Value<'c, 'a>, LowerError> {
    let op = if after.is_some() { "dequantize_after" } else { "dequantize" };
    let callee = ggml_callee(op, ggml, raw_ty, &ty.shape);
    if e.scope.callees.borrow_mut().insert(callee.clone()) {
        let t = Tracer::new(&callee);
        let body = (|| {
            let raw = t.input("raw", raw_ty.clone())?;
            let y = match after {
                Some(_) => {
                    let after = t.input("after", TensorType::new([], DType::F32))?;
                    dequant::decompose_after(&raw, ggml, &ty.shape, &after)?
                }
                None => dequant::decompose(&raw, ggml, &ty.shape)?,
            };
            t.finish(&[&y])
        })()
        .map_err(|err| e.error(format!("cannot build @{callee}: {err}")))?;
        e.session.lower_function(e.scope, &body, FunctionKind::Private, &[])?;
    }
    let operands: Vec<Value> = std::iter::once(raw).chain(after).collect();
    Ok(e.call(&callee, &operands, &[e.tensor_type(ty)])[0])
}

/// `{op}_{ggml type}_{dims}`: the symbol of a composite op's private
/// function, with `_ui8` for unsigned raw bytes and `d` for a `?` dim.
pub(super) fn ggml_callee(op: &str, ggml: GgmlType, raw_ty: &TensorType, dims: &[usize]) -> String {
    let dims: Vec<String> =
        dims.iter().map(|&d| if d == crate::graph::DYNAMIC { "d".into() } else { d.to_string() }).collect();
    let unsigned = if raw_ty.dtype == DType::UI8 { "_ui8" } else { "" };
    format!("{op}_{}_{}{unsigned}", ggml.name().to_lowercase(), dims.join("x"))
}
