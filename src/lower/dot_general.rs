//! Lowers `dot_general` with its `#stablehlo.dot<...>` dimension numbers.

use super::dialects::stablehlo;
use super::{Emitter, LowerError};
use crate::graph::DotDimensions;
use melior::ir::{Type, Value};

/// `#stablehlo.dot<...>` has no C API constructor; it is parsed through the
/// C API from its canonical text. Empty lists are omitted, as MLIR prints them.
pub(super) fn dot_dimension_numbers(dims: &DotDimensions) -> String {
    let fields = [
        ("lhs_batching_dimensions", &dims.lhs_batching_dimensions),
        ("rhs_batching_dimensions", &dims.rhs_batching_dimensions),
        ("lhs_contracting_dimensions", &dims.lhs_contracting_dimensions),
        ("rhs_contracting_dimensions", &dims.rhs_contracting_dimensions),
    ];
    let items: Vec<String> =
        fields.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k} = {}", int_list(v))).collect();
    format!("#stablehlo.dot<{}>", items.join(", "))
}

pub(super) fn int_list(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(|d| d.to_string()).collect();
    format!("[{}]", items.join(", "))
}

pub(super) fn lower_dot_general<'c, 'a>(
    e: &Emitter<'c, 'a>,
    lhs: Value<'c, 'a>,
    rhs: Value<'c, 'a>,
    dims: &DotDimensions,
    result: Type<'c>,
) -> Result<Value<'c, 'a>, LowerError> {
    let attr = e.parse_attribute(&dot_dimension_numbers(dims))?;
    e.emit(stablehlo::dot_general(e.ctx(), result, lhs, rhs, attr, e.loc()))
}
