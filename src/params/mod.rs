//! Weights as IREE globals.
//!
//! Every param becomes `util.global private @<name>`, read where used with
//! `util.global.load`; the function signature never holds a weight. The
//! global's initial value is chosen per param ([`ParamInits`]): by default
//! `#flow.parameter.named<"scope"::"<checkpoint name>">`, which
//! `iree-run-module --parameters=scope=FILE` supplies, or the bytes inline
//! as a `dense_resource` blob. [`archive`] writes the `.irpa` files that
//! hold params derived from a checkpoint (dequantized, converted).
//!
//! iree-compile makes unsigned integer types signless in StableHLO ops and
//! function signatures, but not in `util.global`s ("failed to legalize
//! operation 'util.global.load'" for `tensor<4xui8>`): an unsigned param is
//! stored as the signless type of its width and bitcast after the load.

pub mod archive;
mod error;
mod init;
#[cfg(test)]
mod iree_tests;
pub mod irpa;
pub use error::ParamsError;
pub use init::{ParamInit, ParamInits};

use crate::graph::{DType, Graph, TensorType};
use crate::lower::dialects::{stablehlo, util};
use crate::lower::{tensor_type, Emitter, LowerError, LowerOptions, Session};
use melior::ir::attribute::{FlatSymbolRefAttribute, StringAttribute, TypeAttribute};
use melior::ir::{Attribute, BlockLike, Location, Module, Value};
use std::collections::{HashMap, HashSet};

/// Checkpoint tensor name → global symbol name.
#[derive(Debug, Default)]
pub struct Globals {
    symbols: HashMap<String, String>,
}

impl Globals {
    /// The global that holds `param`, if the module has one.
    pub fn symbol(&self, param: &str) -> Option<&str> {
        self.symbols.get(param).map(String::as_str)
    }
}

/// An MLIR bare identifier close to the checkpoint name: `blk.0.attn_q.weight`
/// stays as is; other characters become `_`.
pub fn symbol_name(param: &str) -> String {
    let mut s: String =
        param.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c } else { '_' }).collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        s.insert(0, '_');
    }
    s
}

/// The type a param's global holds: unsigned integers as the signless type
/// of their width, the same bytes.
fn storage_type(ty: &TensorType) -> TensorType {
    let dtype = match ty.dtype {
        DType::UI8 => DType::I8,
        DType::UI16 => DType::I16,
        DType::UI32 => DType::I32,
        d => d,
    };
    ty.with_dtype(dtype)
}

/// Declares one global per param name of `graphs` at the top of `module`,
/// initialized as `inits` says; a name declared with two types is an
/// error. Inline bytes live as long as the module (`'s`).
pub(crate) fn declare_globals<'s>(
    session: &'s Session,
    module: &Module<'s>,
    graphs: &[&Graph],
    options: &LowerOptions,
    inits: &ParamInits<'s>,
) -> Result<Globals, LowerError> {
    let ctx = session.context();
    let mut globals = Globals::default();
    // The functions' own symbols are taken too, `generate` included.
    let mut taken: HashSet<String> = graphs.iter().map(|g| g.name.clone()).collect();
    taken.insert("generate".into());
    let mut declared: HashMap<&str, &TensorType> = HashMap::new();
    for (graph, (id, name, ty)) in graphs.iter().flat_map(|g| g.params().map(move |p| (g, p))) {
        if let Some(first) = declared.insert(name, ty) {
            if first == ty {
                continue;
            }
            return Err(LowerError::Node {
                node: graph.node(id).name.clone(),
                op: "param",
                message: format!("param \"{name}\" is {ty} in @{}, but {first} in an earlier function", graph.name),
                diagnostics: vec![],
            });
        }
        let base = symbol_name(name);
        let symbol = (0..)
            .map(|i| if i == 0 { base.clone() } else { format!("{base}_{i}") })
            .find(|s| !taken.contains(s))
            .expect("an unbounded range always yields a free name");
        taken.insert(symbol.clone());
        let stored = storage_type(ty);
        let node = &graph.node(id).name;
        let initial_value = match inits.get(name) {
            Some(ParamInit::Inline(bytes)) => init::inline_attribute(ctx, name, &symbol, &stored, bytes)?,
            named => {
                let (scope, key) = match named {
                    Some(ParamInit::Named { scope, key }) => (scope.as_str(), key.as_str()),
                    _ => (options.param_scope.as_str(), name),
                };
                let text = init::parameter_attribute(scope, key, &stored)?;
                Attribute::parse(ctx, &text).ok_or_else(|| LowerError::Node {
                    node: node.clone(),
                    op: "param",
                    message: format!("MLIR cannot parse `{text}`"),
                    diagnostics: vec![],
                })?
            }
        };
        let loc = Location::name(ctx, node, Location::unknown(ctx));
        module.body().append_operation(
            util::global(
                ctx,
                StringAttribute::new(ctx, &symbol),
                StringAttribute::new(ctx, "private"),
                TypeAttribute::new(tensor_type(ctx, &stored)),
                initial_value,
                loc,
            )
            .into(),
        );
        globals.symbols.insert(name.to_string(), symbol);
    }
    Ok(globals)
}

pub(crate) fn load_global<'c, 'a>(
    e: &Emitter<'c, 'a>,
    globals: &Globals,
    name: &str,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let symbol = globals.symbol(name).ok_or_else(|| e.error(format!("param \"{name}\" has no global")))?;
    let stored = storage_type(ty);
    let symbol = FlatSymbolRefAttribute::new(e.ctx(), symbol);
    let value = e.emit(util::global_load(e.ctx(), e.tensor_type(&stored), symbol, e.loc()))?;
    if stored == *ty {
        return Ok(value);
    }
    e.emit(stablehlo::bitcast_convert(e.ctx(), e.tensor_type(ty), value, e.loc()))
}
