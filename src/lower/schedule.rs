//! Ops that order work without computing anything: `after`.

use super::{Emitter, LowerError};
use melior::ir::operation::OperationBuilder;
use melior::ir::{BlockLike, Value, ValueLike};

/// `value`, once `other` is computed: a `util.optimization_barrier` over
/// both, whose first result is `value` itself (no copy). IREE orders what
/// reads it after `other`'s producer and folds nothing across it.
pub(super) fn lower_after<'c, 'a>(
    e: &Emitter<'c, 'a>,
    value: Value<'c, 'a>,
    other: Value<'c, 'a>,
) -> Result<Value<'c, 'a>, LowerError> {
    let op = OperationBuilder::new("util.optimization_barrier", e.loc())
        .add_operands(&[value, other])
        .add_results(&[value.r#type(), other.r#type()])
        .build()
        .map_err(|err| e.error(format!("util.optimization_barrier: {err}")))?;
    Ok(e.block.append_operation(op).result(0).expect("one result per operand").into())
}
