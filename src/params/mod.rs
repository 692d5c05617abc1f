//! Weights as IREE globals.
//!
//! Every param becomes `util.global private @<name>` whose initial value is
//! `#flow.parameter.named<"scope"::"<checkpoint name>">`, read where used
//! with `util.global.load`. The function signature never holds a weight:
//! `iree-run-module --parameters=scope=FILE` supplies them.
//!
//! iree-compile makes unsigned integer types signless in StableHLO ops and
//! function signatures, but not in `util.global`s ("failed to legalize
//! operation 'util.global.load'" for `tensor<4xui8>`): an unsigned param is
//! stored as the signless type of its width and bitcast after the load.

mod error;
pub mod irpa;
pub use error::ParamsError;

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

/// The `#flow.parameter.named` text; no C API builds IREE attributes.
fn parameter_attribute(scope: &str, name: &str, ty: &TensorType) -> Result<String, LowerError> {
    let quote = |s: &str| serde_json::to_string(s).map_err(|e| LowerError::Print(e.to_string()));
    Ok(format!("#flow.parameter.named<{}::{}> : {ty}", quote(scope)?, quote(name)?))
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

/// Declares one global per param name of `graphs` at the top of `module`;
/// a name declared with two types is an error.
pub(crate) fn declare_globals(
    session: &Session,
    module: &Module<'_>,
    graphs: &[&Graph],
    options: &LowerOptions,
) -> Result<Globals, LowerError> {
    let ctx = session.context();
    let mut globals = Globals::default();
    // The functions' own symbols are taken too.
    let mut taken: HashSet<String> = graphs.iter().map(|g| g.name.clone()).collect();
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
        let text = parameter_attribute(&options.param_scope, name, &stored)?;
        let node = &graph.node(id).name;
        let initial_value = Attribute::parse(ctx, &text).ok_or_else(|| LowerError::Node {
            node: node.clone(),
            op: "param",
            message: format!("MLIR cannot parse `{text}`"),
            diagnostics: vec![],
        })?;
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
