//! Lowers splat constants and iota.

use super::dialects::stablehlo;
use super::{element_type, Emitter, LowerError};
use crate::graph::{DType, TensorType};
use melior::ir::attribute::{DenseElementsAttribute, FloatAttribute, IntegerAttribute};
use melior::ir::r#type::{IntegerType, TypeLike};
use melior::ir::{Attribute, Value};

/// `dense<value> : tensor<...>`, a splat built through the C API.
pub(super) fn splat_attribute<'c>(
    e: &Emitter<'c, '_>,
    value: f64,
    ty: &TensorType,
) -> Result<Attribute<'c>, LowerError> {
    let ctx = e.ctx();
    let elem = element_type(ctx, ty.dtype);
    let scalar: Attribute = match ty.dtype.integer_bounds() {
        None => FloatAttribute::new(ctx, elem, value).into(),
        Some(_) if ty.dtype == DType::I1 => IntegerAttribute::new(elem, i64::from(value != 0.0)).into(),
        // Truncate toward zero and saturate to the element type, as the
        // interpreter's float-to-int conversion does.
        Some((min, max)) => IntegerAttribute::new(elem, (value as i64).clamp(min, max)).into(),
    };
    DenseElementsAttribute::new(e.tensor_type(ty), &[scalar])
        .map(Into::into)
        .map_err(|err| e.error(format!("cannot build splat {value} of {ty}: {err}")))
}

/// A dynamic splat is a scalar constant broadcast to the run-time shape.
pub(super) fn lower_constant<'c, 'a>(
    e: &Emitter<'c, 'a>,
    value: f64,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    if ty.is_dynamic() {
        let scalar = TensorType::new([], ty.dtype);
        let attr = splat_attribute(e, value, &scalar)?;
        let splat = e.emit(stablehlo::constant(e.ctx(), e.tensor_type(&scalar), attr, e.loc()))?;
        return super::layout::lower_dynamic_broadcast_in_dim(e, splat, &scalar, &[], ty);
    }
    let attr = splat_attribute(e, value, ty)?;
    e.emit(stablehlo::constant(e.ctx(), e.tensor_type(ty), attr, e.loc()))
}

/// The constant `0..len` as `tensor<len x i32>`, built from the values
/// themselves: an attribute per element made a 152k-token vocabulary's
/// indices cost 5 MB of uniqued integers.
pub(super) fn lower_range<'c, 'a>(e: &Emitter<'c, 'a>, len: usize) -> Result<Value<'c, 'a>, LowerError> {
    let ty = e.tensor_type(&TensorType::new([len], DType::I32));
    let values: Vec<i32> = (0..len as i32).collect();
    // SAFETY: the type is a valid shaped type of `len` i32 elements and
    // `values` holds `len` of them, which MLIR copies.
    let raw = unsafe { mlir_sys::mlirDenseElementsAttrInt32Get(ty.to_raw(), len as isize, values.as_ptr()) };
    // SAFETY: a null attribute is mapped to None.
    let range = unsafe { Attribute::from_option_raw(raw) }
        .ok_or_else(|| e.error(format!("cannot build the indices 0..{len}")))?;
    e.emit(stablehlo::constant(e.ctx(), ty, range, e.loc()))
}

pub(super) fn lower_iota<'c, 'a>(
    e: &Emitter<'c, 'a>,
    iota_dimension: usize,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let dim = IntegerAttribute::new(IntegerType::new(e.ctx(), 64).into(), iota_dimension as i64);
    if ty.is_dynamic() {
        let shape = e.shape_tensor(&ty.shape)?;
        return e.emit(stablehlo::dynamic_iota(e.ctx(), e.tensor_type(ty), shape, dim.into(), e.loc()));
    }
    e.emit(stablehlo::iota(e.ctx(), e.tensor_type(ty), dim.into(), e.loc()))
}
