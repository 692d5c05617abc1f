//! The `param` op: weights as IREE globals.
//!
//! Every param becomes `util.global private @<name>`, read where used with
//! `util.global.load`; the function signature never holds a weight. The
//! global's initial value is chosen per param ([`ParamInits`]): by default
//! `#flow.parameter.named<"scope"::"<checkpoint name>">`, which
//! `iree-run-module --parameters=scope=FILE` supplies, or the bytes inline
//! as a `dense_resource` blob ([`ParamInit`]).
//!
//! iree-compile makes unsigned integer types signless in StableHLO ops and
//! function signatures, but not in `util.global`s ("failed to legalize
//! operation 'util.global.load'" for `tensor<4xui8>`): an unsigned param is
//! stored as the signless type of its width and bitcast after the load.

use super::dialects::{stablehlo, util};
use super::layout::lower_tile_rows;
use super::{tensor_type, Emitter, Function, LowerError, LowerOptions, Session};
use crate::graph::{DType, Graph, TensorType};
use melior::ir::attribute::{FlatSymbolRefAttribute, StringAttribute, TypeAttribute};
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::FunctionType;
use melior::ir::{
    Attribute, Block, BlockLike, Identifier, Location, Module, Operation, Region, RegionLike, TypeLike, Value,
};
use melior::{Context, StringRef};
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
fn symbol_name(param: &str) -> String {
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
            Some(ParamInit::Inline(bytes)) => inline_attribute(ctx, name, &symbol, &stored, bytes)?,
            named => {
                let (scope, key) = match named {
                    Some(ParamInit::Named { scope, key }) => (scope.as_str(), key.as_str()),
                    _ => (options.param_scope.as_str(), name),
                };
                let text = parameter_attribute(scope, key, &stored)?;
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
    load_symbol(e, symbol, ty)
}

/// `util.global.load @symbol` of a global holding `ty` as its storage
/// type ([`storage_type`]), as `ty`.
fn load_symbol<'c, 'a>(e: &Emitter<'c, 'a>, symbol: &str, ty: &TensorType) -> Result<Value<'c, 'a>, LowerError> {
    let stored = storage_type(ty);
    let symbol = FlatSymbolRefAttribute::new(e.ctx(), symbol);
    let value = e.emit(util::global_load(e.ctx(), e.tensor_type(&stored), symbol, e.loc()))?;
    if stored == *ty {
        return Ok(value);
    }
    e.emit(stablehlo::bitcast_convert(e.ctx(), e.tensor_type(ty), value, e.loc()))
}

/// A `tile_rows` of a param: the param reshaped to `operand`, tiled by
/// `lanes` rows with its last dim in `order`.
pub(crate) struct Tiling<'o> {
    pub operand: &'o TensorType,
    pub lanes: usize,
    pub order: &'o [usize],
}

/// `tiling` of param `name` (of type `param_ty`) as `ty`, from a global
/// that an initializer computes once, at load, from the param's own global:
/// a decode step's `packed_matvec` then reads the tiled bytes where they
/// lie, and the checkpoint's bytes are read once. Each (param, tiling) has
/// one global, whichever function asks first.
pub(crate) fn load_tiled<'c, 'a>(
    e: &Emitter<'c, 'a>,
    name: &str,
    param_ty: &TensorType,
    tiling: &Tiling<'_>,
    ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let key = (name.to_string(), format!("{} {:?} {ty}", tiling.operand, tiling.order));
    let existing = e.scope.tiled.borrow().get(&key).cloned();
    let symbol = match existing {
        Some(symbol) => symbol,
        None => {
            let base =
                e.scope.globals.symbol(name).ok_or_else(|| e.error(format!("param \"{name}\" has no global")))?;
            let count = e.scope.tiled.borrow().keys().filter(|(n, _)| n == name).count();
            let lanes = tiling.lanes;
            let symbol = match count {
                0 => format!("{base}.tiles{lanes}"),
                n => format!("{base}.tiles{lanes}_{n}"),
            };
            declare_tiled(e, &symbol, name, param_ty, tiling, ty)?;
            e.scope.tiled.borrow_mut().insert(key, symbol.clone());
            symbol
        }
    };
    load_symbol(e, &symbol, ty)
}

/// `util.global private @symbol` and the `util.initializer` that stores
/// [`load_tiled`]'s tiling into it.
fn declare_tiled<'c>(
    e: &Emitter<'c, '_>,
    symbol: &str,
    name: &str,
    param_ty: &TensorType,
    tiling: &Tiling<'_>,
    ty: &TensorType,
) -> Result<(), LowerError> {
    let operand = tiling.operand;
    let ctx = e.ctx();
    let loc = e.loc();
    let stored = storage_type(ty);
    let build = |builder: OperationBuilder<'c>, what: &str| -> Result<Operation<'c>, LowerError> {
        builder.build().map_err(|err| e.error(format!("{what}: {err}")))
    };
    let attr = |key: &str, value: Attribute<'c>| (Identifier::new(ctx, key), value);
    let global = OperationBuilder::new("util.global", loc).add_attributes(&[
        attr("sym_name", StringAttribute::new(ctx, symbol).into()),
        attr("sym_visibility", StringAttribute::new(ctx, "private").into()),
        attr("type", TypeAttribute::new(tensor_type(ctx, &stored)).into()),
    ]);
    e.scope.module.body().append_operation(build(global, "util.global")?);
    let block = Block::new(&[]);
    {
        let function = Function::without_inputs();
        let init = Emitter { block: &block, function: &function, op: "tile_rows", ..*e };
        let value = load_global(&init, &e.scope.globals, name, param_ty)?;
        let value = match param_ty == operand {
            true => value,
            false => init.emit(stablehlo::reshape(ctx, init.tensor_type(operand), value, loc))?,
        };
        let tiled = lower_tile_rows(&init, value, operand, tiling.lanes, tiling.order, ty)?;
        let tiled = match stored == *ty {
            true => tiled,
            false => init.emit(stablehlo::bitcast_convert(ctx, init.tensor_type(&stored), tiled, loc))?,
        };
        let store = OperationBuilder::new("util.global.store", loc)
            .add_operands(&[tiled])
            .add_attributes(&[attr("global", FlatSymbolRefAttribute::new(ctx, symbol).into())]);
        block.append_operation(build(store, "util.global.store")?);
        block.append_operation(build(OperationBuilder::new("util.return", loc), "util.return")?);
    }
    let region = Region::new();
    region.append_block(block);
    let function_type = FunctionType::new(ctx, &[], &[]);
    let initializer = OperationBuilder::new("util.initializer", loc)
        .add_attributes(&[attr("function_type", TypeAttribute::new(function_type.into()).into())])
        .add_regions([region]);
    e.scope.module.body().append_operation(build(initializer, "util.initializer")?);
    Ok(())
}

/// One param's initial value.
///
/// - [`ParamInit::Named`]: bound at run time by `iree-run-module
///   --parameters=scope=FILE` (a GGUF, a safetensors file or an `.irpa`).
///   The default, with the lowering's `param_scope` and the param's own name.
/// - [`ParamInit::Inline`]: the bytes go into the module itself, as a
///   `dense_resource<blob>` elements attribute. The attribute aliases the
///   caller's bytes (an mmap'd checkpoint, an archive entry) without copying;
///   they are copied once, when the module is written: raw in bytecode, hex
///   in the text form's `{-# dialect_resources #-}` trailer. The module then
///   runs with no parameter file, and IREE may fold the weights as constants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamInit<'a> {
    /// `#flow.parameter.named<"scope"::"key">`.
    Named {
        /// The scope `--parameters=SCOPE=FILE` binds.
        scope: String,
        /// The tensor's name in that file.
        key: String,
    },
    /// The param's bytes as stored in its global: little-endian, row-major,
    /// unsigned integers as the same bytes (the global is signless), `i1` as
    /// one byte per element.
    Inline(&'a [u8]),
}

/// Per-param initial values; a param without an entry is
/// `Named { scope: <the lowering's param_scope>, key: <param name> }`.
///
/// The `'a` bytes of inline params must outlive the module lowered with
/// them, which [`crate::lower::Session::lower_with`] enforces.
#[derive(Clone, Debug, Default)]
pub struct ParamInits<'a> {
    by_param: HashMap<String, ParamInit<'a>>,
}

impl<'a> ParamInits<'a> {
    /// No entries: every param named in the lowering's scope.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the initial value of `param` (a checkpoint name, as in the graph).
    pub fn set(&mut self, param: impl Into<String>, init: ParamInit<'a>) -> &mut Self {
        self.by_param.insert(param.into(), init);
        self
    }

    /// `param` gets `bytes` inline.
    pub fn inline(mut self, param: impl Into<String>, bytes: &'a [u8]) -> Self {
        self.set(param, ParamInit::Inline(bytes));
        self
    }

    /// `param` is read from `scope::key` at run time.
    pub fn named(mut self, param: impl Into<String>, scope: impl Into<String>, key: impl Into<String>) -> Self {
        self.set(param, ParamInit::Named { scope: scope.into(), key: key.into() });
        self
    }

    /// The initial value set for `param`, if any.
    pub fn get(&self, param: &str) -> Option<&ParamInit<'a>> {
        self.by_param.get(param)
    }

    /// How many params have an initial value set.
    pub fn len(&self) -> usize {
        self.by_param.len()
    }

    /// Whether no param has one.
    pub fn is_empty(&self) -> bool {
        self.by_param.is_empty()
    }
}

impl<'a, S: Into<String>> FromIterator<(S, ParamInit<'a>)> for ParamInits<'a> {
    fn from_iter<I: IntoIterator<Item = (S, ParamInit<'a>)>>(iter: I) -> Self {
        ParamInits { by_param: iter.into_iter().map(|(k, v)| (k.into(), v)).collect() }
    }
}

/// The `#flow.parameter.named` text; no C API builds IREE attributes.
fn parameter_attribute(scope: &str, key: &str, ty: &TensorType) -> Result<String, LowerError> {
    let quote = |s: &str| serde_json::to_string(s).map_err(|e| LowerError::Print(e.to_string()));
    Ok(format!("#flow.parameter.named<{}::{}> : {ty}", quote(scope)?, quote(key)?))
}

/// `dense_resource<blob>` of type `stored` over `bytes`, which must be
/// exactly the stored type's size.
///
/// The blob is registered in the context's builtin resource manager under
/// `blob` (uniqued with a suffix if a module lowered earlier in the same
/// session took the name) with no deleter: MLIR never frees or writes it.
fn inline_attribute<'c>(
    ctx: &'c Context,
    param: &str,
    blob: &str,
    stored: &TensorType,
    bytes: &'c [u8],
) -> Result<Attribute<'c>, LowerError> {
    let element = stored.dtype.size_in_bytes();
    let expected = stored.checked_num_elements().and_then(|n| n.checked_mul(element));
    if expected != Some(bytes.len()) {
        return Err(LowerError::InlineParamSize {
            param: param.to_string(),
            ty: stored.clone(),
            expected,
            got: bytes.len(),
        });
    }
    // The alignment is recorded with the blob: bytecode pads the blob to it
    // within the file and the text form prefixes it, so a reader can view
    // the bytes as elements. It must stay small: MLIR's bytecode reader
    // insists that its input buffer be aligned to the largest blob
    // alignment, and iree-compile reads a small file into a 16-byte aligned
    // buffer ("expected section alignment 64 but bytecode buffer 0x...70 is
    // not aligned"). The element size (at most 8) is what typed access needs.
    let alignment = element.next_power_of_two();
    let ty = tensor_type(ctx, stored);
    // SAFETY: `ty` and the name are valid for the call (MLIR copies the
    // name). The data pointer stays valid for 'c, the lifetime of the module
    // and its attributes; MLIR only reads it (`dataIsMutable` false, no
    // deleter), when the module is printed or written. After the module is
    // dropped the context still lists the blob, but nothing refers to its
    // handle any more, so the bytes are never read again.
    let raw = unsafe {
        mlir_sys::mlirUnmanagedDenseResourceElementsAttrGet(
            ty.to_raw(),
            StringRef::new(blob).to_raw(),
            bytes.as_ptr() as *mut std::ffi::c_void,
            bytes.len(),
            alignment,
            false,
            None,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a null attribute is mapped to None.
    unsafe { Attribute::from_option_raw(raw) }.ok_or_else(|| LowerError::Node {
        node: param.to_string(),
        op: "param",
        message: format!("MLIR cannot make a dense_resource attribute of type {stored}"),
        diagnostics: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::text;
    use crate::lower::{print, write_module, Emit, LowerOptions, Session};
    use melior::ir::Module;

    const GRAPH: &str = "func @main(%x: tensor<2xf32>) {
  %w = param {name = \"blk.0.w\"} : tensor<2xf32>
  %s = param {name = \"s\"} : tensor<2xui8>
  %n = param {name = \"n\"} : tensor<2xf32>
  %y = add %x, %w : tensor<2xf32>
  %z = add %y, %n : tensor<2xf32>
  return %z, %s
}
";

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Parses text or bytecode (MLIR tells them apart by the magic).
    fn parse<'c>(session: &'c Session, bytes: &[u8]) -> Module<'c> {
        let source = mlir_sys::MlirStringRef { data: bytes.as_ptr().cast(), length: bytes.len() };
        // SAFETY: the context is live and MLIR copies what it keeps of the source.
        let raw = unsafe { mlir_sys::mlirModuleCreateParse(session.context().to_raw(), source) };
        unsafe { Module::from_option_raw(raw) }.expect("the written module parses back")
    }

    #[test]
    fn inline_params_are_dense_resources_of_the_stored_type() {
        let graph = text::parse(GRAPH).unwrap();
        // Cache-line aligned bytes still record their element size as the
        // alignment (see `inline_attribute`).
        #[repr(align(64))]
        struct Line([u8; 72]);
        let mut line = Line([0; 72]);
        line.0[0..8].copy_from_slice(&f32_bytes(&[1.5, -2.0]));
        line.0[64..66].copy_from_slice(&[7, 200]);
        let (w, s) = (&line.0[0..8], &line.0[64..66]);
        let session = Session::new();
        let inits = ParamInits::new().inline("blk.0.w", w).inline("s", s).named("n", "other", "norm.weight");
        let module = session.lower_with(&graph, &LowerOptions::default(), &inits).unwrap();
        let text = print(&module).unwrap();
        // Unsigned params are stored signless, as for named params.
        for line in [
            "initial_value = dense_resource<blk.0.w> : tensor<2xf32>, sym_name = \"blk.0.w\"",
            "initial_value = dense_resource<s> : tensor<2xi8>, sym_name = \"s\"",
            "initial_value = #flow.parameter.named<\"other\"::\"norm.weight\"> : tensor<2xf32>, sym_name = \"n\"",
            // The alignment as a little-endian u32, then the bytes.
            "blk.0.w: \"0x040000000000C03F000000C0\"",
            "s: \"0x0100000007C8\"",
        ] {
            assert!(text.contains(line), "missing `{line}` in:\n{text}");
        }
    }

    #[test]
    fn params_without_an_init_stay_named_in_the_lowering_scope() {
        let graph = text::parse(GRAPH).unwrap();
        let session = Session::new();
        let options = LowerOptions { param_scope: "ckpt".into() };
        let module = session.lower_with(&graph, &options, &ParamInits::new().named("s", "q", "s.raw")).unwrap();
        let text = print(&module).unwrap();
        assert!(text.contains("#flow.parameter.named<\"ckpt\"::\"blk.0.w\">"), "{text}");
        assert!(text.contains("#flow.parameter.named<\"q\"::\"s.raw\"> : tensor<2xi8>"), "{text}");
        assert!(!text.contains("dialect_resources"), "{text}");
    }

    #[test]
    fn inline_bytes_of_the_wrong_size_name_the_param() {
        let graph = text::parse(GRAPH).unwrap();
        let session = Session::new();
        let short = [0u8; 7];
        let e = session
            .lower_with(&graph, &LowerOptions::default(), &ParamInits::new().inline("blk.0.w", &short))
            .unwrap_err();
        assert!(
            matches!(&e, LowerError::InlineParamSize { param, expected: Some(8), got: 7, .. } if param == "blk.0.w")
        );
        assert_eq!(
            e.to_string(),
            "param \"blk.0.w\": inline bytes are 7 but its global holds tensor<2xf32> (8 bytes); \
             pass the param's raw little-endian bytes"
        );
    }

    /// Text with resources in full and bytecode both parse back (in a fresh
    /// context, where the blob names are free) to the same module; elided
    /// text drops the blobs.
    #[test]
    fn text_and_bytecode_round_trip_with_their_resources() {
        let graph = text::parse(GRAPH).unwrap();
        let w = f32_bytes(&[1.5, -2.0]);
        let s = [7u8, 200];
        let session = Session::new();
        let inits = ParamInits::new().inline("blk.0.w", &w).inline("s", &s);
        let module = session.lower_with(&graph, &LowerOptions::default(), &inits).unwrap();
        let text = print(&module).unwrap();

        let mut written = Vec::new();
        write_module(&module, Emit::default(), &mut written).unwrap();
        assert_eq!(String::from_utf8(written).unwrap(), text, "streamed text equals print()");
        let fresh = Session::new();
        assert_eq!(print(&parse(&fresh, text.as_bytes())).unwrap(), text);

        let mut bytecode = Vec::new();
        // The blob reaches the writer as its own memory, not a copy: what
        // lets an export drop a mapped checkpoint's pages as they go out.
        let mut blob_seen = false;
        crate::lower::write_module_with(&module, Emit::Mlirbc, &mut bytecode, &mut |chunk| {
            blob_seen |= chunk.as_ptr() == w.as_ptr() && chunk.len() == w.len();
        })
        .unwrap();
        assert!(blob_seen, "the writer was handed the blob's own bytes");
        assert!(bytecode.starts_with(b"ML\xefR"), "bytecode magic");
        // The blobs are stored raw: the f32 bytes appear as they are.
        assert!(bytecode.windows(w.len()).any(|c| c == w), "raw blob in the bytecode");
        let fresh = Session::new();
        assert_eq!(print(&parse(&fresh, &bytecode)).unwrap(), text);

        let mut elided = Vec::new();
        write_module(&module, Emit::Mlir { elide_resources_over: Some(2) }, &mut elided).unwrap();
        let elided = String::from_utf8(elided).unwrap();
        assert!(elided.contains("dense_resource<blk.0.w>") && !elided.contains("0x0400"), "{elided}");
    }

    /// A later lowering in the same session gets fresh blob names: MLIR
    /// uniques them per context.
    #[test]
    fn blob_names_are_unique_per_session() {
        let graph = text::parse(GRAPH).unwrap();
        let w = f32_bytes(&[1.5, -2.0]);
        let session = Session::new();
        let inits = ParamInits::new().inline("blk.0.w", &w);
        let first = print(&session.lower_with(&graph, &LowerOptions::default(), &inits).unwrap()).unwrap();
        let second = print(&session.lower_with(&graph, &LowerOptions::default(), &inits).unwrap()).unwrap();
        assert!(first.contains("dense_resource<blk.0.w>"), "{first}");
        assert!(second.contains("dense_resource<blk.0.w_1>") && second.contains("blk.0.w_1: \"0x"), "{second}");
    }
}
