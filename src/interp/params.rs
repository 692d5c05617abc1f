//! Where [`super::run`] gets the weights a graph's `param` nodes name: a
//! map of values, a safetensors file (or a sharded checkpoint), or another
//! source read once and cached.

use super::{InterpError, Value};
use crate::graph::TensorType;
use crate::weights::safetensors::{SafeTensors, ShardedSafeTensors, TensorView};
use std::collections::HashMap;

/// Where `run` gets the weights a graph's `param` nodes name.
pub trait ParamSource {
    /// The tensor `name`, which the graph declares as `ty`.
    fn param(&self, name: &str, ty: &TensorType) -> Result<Value, InterpError>;
}

impl ParamSource for HashMap<String, Value> {
    fn param(&self, name: &str, ty: &TensorType) -> Result<Value, InterpError> {
        let v = self.get(name).ok_or_else(|| InterpError::MissingParam { name: name.to_string() })?;
        if v.ty != *ty {
            return Err(InterpError::ParamType {
                name: name.to_string(),
                expected: ty.clone(),
                found: v.ty.to_string(),
            });
        }
        Ok(v.clone())
    }
}

/// A [`ParamSource`] that reads each param from `source` once and hands out
/// copies after: for graphs run many times (a decode loop) over params that
/// are costly to produce (dequantized on every read).
pub struct CachedParams<'a> {
    source: &'a dyn ParamSource,
    cache: std::cell::RefCell<HashMap<String, Value>>,
}

impl<'a> CachedParams<'a> {
    /// Caches the params of `source`.
    pub fn new(source: &'a dyn ParamSource) -> Self {
        CachedParams { source, cache: Default::default() }
    }
}

impl ParamSource for CachedParams<'_> {
    fn param(&self, name: &str, ty: &TensorType) -> Result<Value, InterpError> {
        if let Some(v) = self.cache.borrow().get(name).filter(|v| v.ty == *ty) {
            return Ok(v.clone());
        }
        let v = self.source.param(name, ty)?;
        self.cache.borrow_mut().insert(name.to_string(), v.clone());
        Ok(v)
    }
}

impl ParamSource for SafeTensors {
    fn param(&self, name: &str, ty: &TensorType) -> Result<Value, InterpError> {
        tensor_value(self.get(name), name, ty)
    }
}

impl ParamSource for ShardedSafeTensors {
    fn param(&self, name: &str, ty: &TensorType) -> Result<Value, InterpError> {
        tensor_value(self.get(name), name, ty)
    }
}

/// The stored tensor `name` (`None`: missing) as a value of `ty`, which it
/// must have exactly.
fn tensor_value(tensor: Option<TensorView<'_>>, name: &str, ty: &TensorType) -> Result<Value, InterpError> {
    let t = tensor.ok_or_else(|| InterpError::MissingParam { name: name.to_string() })?;
    if t.dtype.to_graph_dtype() != Some(ty.dtype) || t.shape != ty.shape.as_slice() {
        let found = match t.dtype.to_graph_dtype() {
            Some(d) => TensorType::new(t.shape, d).to_string(),
            None => format!("{} {:?}", t.dtype, t.shape),
        };
        return Err(InterpError::ParamType { name: name.to_string(), expected: ty.clone(), found });
    }
    Value::from_le_bytes(ty, t.data).map_err(|e| InterpError::Param { name: name.to_string(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::Buffer;
    use crate::weights::safetensors::{write, StDType};
    use half::bf16;
    use std::collections::BTreeMap;

    #[test]
    fn safetensors_params_are_read_as_declared() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.safetensors");
        let w: Vec<u8> = [1.0f32, -2.0, 3.5, 0.25, 5.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let bf = bf16::from_f32(-3.0).to_le_bytes();
        let tensors: Vec<(&str, StDType, &[usize], &[u8])> = vec![
            ("flags", StDType::BOOL, &[3], &[1, 0, 1]),
            ("w", StDType::F32, &[2, 3], &w),
            ("scalar", StDType::BF16, &[], &bf),
        ];
        write(&path, &tensors, &BTreeMap::new()).unwrap();
        let st = SafeTensors::open(&path).unwrap();
        let w = st.param("w", &"tensor<2x3xf32>".parse().unwrap()).unwrap();
        assert_eq!(w.data, Buffer::from(vec![1.0f32, -2.0, 3.5, 0.25, 5.0, 6.0]));
        let s = st.param("scalar", &"tensor<bf16>".parse().unwrap()).unwrap();
        assert_eq!(s.data, Buffer::from(vec![bf16::from_f32(-3.0)]));
        let b = st.param("flags", &"tensor<3xi1>".parse().unwrap()).unwrap();
        assert_eq!(b.data, Buffer::from(vec![true, false, true]));
    }

    #[test]
    fn safetensors_params_check_their_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.safetensors");
        let d = [0u8; 16];
        write(&path, &[("a", StDType::F32, &[2, 2], &d), ("b", StDType::F64, &[2], &d)], &BTreeMap::new()).unwrap();
        let st = SafeTensors::open(&path).unwrap();
        let err = |name: &str, ty: &str| st.param(name, &ty.parse().unwrap()).unwrap_err().to_string();
        assert_eq!(
            err("a", "tensor<4xf32>"),
            "param \"a\" is declared as tensor<4xf32> but the weights hold tensor<2x2xf32>"
        );
        assert_eq!(
            err("a", "tensor<2x2xi32>"),
            "param \"a\" is declared as tensor<2x2xi32> but the weights hold tensor<2x2xf32>"
        );
        assert_eq!(err("b", "tensor<2xf32>"), "param \"b\" is declared as tensor<2xf32> but the weights hold F64 [2]");
        assert_eq!(err("c", "tensor<2xf32>"), "param \"c\" is missing from the weights");
    }
}
