//! Graph → StableHLO through the MLIR C API (melior).
//!
//! One file per op family, with the same stems as `src/graph/ops/` and
//! `src/interp/`. Each family builds typed ops with the builders generated
//! from `dialects/*.td` ([`dialects`]). Result types are the ones stored on
//! the graph nodes, which the shape rules computed by the StableHLO spec.
//! Every op carries a `NameLoc` with its node's name, so diagnostics point
//! back at the graph. The composite `dequantize` becomes a call to a
//! private function built once per module (`lower/dequantize.rs`). The module is
//! verified before anyone can print it.

pub mod dialects;

mod bitwise;
mod constant;
mod dequantize;
mod dot_general;
mod dynamic_slice;
mod elementwise;
mod emit;
mod gather;
mod generate;
mod layout;
mod packed_matvec;
mod param;
#[cfg(test)]
mod param_iree_tests;
mod reduce;
mod rows;

use crate::graph::{DType, Graph, Op, TensorType, ValueId, DYNAMIC};
use dialects::{arith, stablehlo, tensor};
use melior::dialect::{func, DialectHandle};
use melior::ir::attribute::{
    ArrayAttribute, DenseElementsAttribute, DenseI64ArrayAttribute, DictionaryAttribute, FlatSymbolRefAttribute,
    IntegerAttribute, StringAttribute, TypeAttribute,
};
use melior::ir::operation::{OperationBuilder, OperationLike, OperationMutLike, OperationPrintingFlags, OperationRef};
use melior::ir::r#type::{FunctionType, IntegerType, RankedTensorType};
use melior::ir::{
    Attribute, Block, BlockLike, Identifier, Location, Module, Operation, Region, RegionLike, Type, Value, ValueLike,
};
use melior::Context;
use std::cell::{Cell, OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use thiserror::Error;

pub use emit::{write_module, write_module_to_path, write_module_to_path_with, write_module_with, Emit};
pub use generate::{GreedyLoop, STEPPED_PREFILL};
use param::Globals;
pub use param::{ParamInit, ParamInits};
pub use rows::RowLoop;

/// Why lowering, printing or writing a module failed; errors about one op
/// name its graph node and carry MLIR's diagnostics.
#[derive(Debug, Error)]
pub enum LowerError {
    /// One node (or param) could not be lowered.
    #[error("node %{node} ({op}): {message}{}", fmt_diagnostics(.diagnostics))]
    Node {
        /// The graph node's name (or the param's).
        node: String,
        /// The op being lowered: `add`, `param`, `return`, ...
        op: &'static str,
        /// What went wrong.
        message: String,
        /// MLIR diagnostics emitted while building the op.
        diagnostics: Vec<String>,
    },
    /// The finished module failed MLIR verification: a kiln bug.
    #[error("the lowered module failed MLIR verification; this is a kiln bug, please report it with the graph{}", fmt_diagnostics(.diagnostics))]
    Verify {
        /// MLIR's verifier diagnostics.
        diagnostics: Vec<String>,
    },
    /// The module, or a param attribute's text, could not be printed.
    #[error("cannot print the module: {0}")]
    Print(String),
    /// A param's inline bytes do not match its global's size.
    #[error("param \"{param}\": inline bytes are {got} but its global holds {ty} ({}); pass the param's raw little-endian bytes", match .expected { Some(n) => format!("{n} bytes"), None => "a size that overflows".into() })]
    InlineParamSize {
        /// The param's name.
        param: String,
        /// The global's (stored) type.
        ty: TensorType,
        /// Its size in bytes; `None` when that overflows `usize`.
        expected: Option<usize>,
        /// The bytes given.
        got: usize,
    },
    /// Writing the module file failed.
    #[error("cannot write the module to {path}: {source}")]
    Write {
        /// The module file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

fn fmt_diagnostics(diagnostics: &[String]) -> String {
    diagnostics.iter().map(|d| format!("\n  mlir: {d}")).collect()
}

/// The scope params are named in unless told otherwise: `iree-run-module
/// --parameters=model=CHECKPOINT`.
pub const DEFAULT_PARAM_SCOPE: &str = "model";

/// How lowering names things outside the graph.
#[derive(Clone, Debug)]
pub struct LowerOptions {
    /// Scope of `#flow.parameter.named<"scope"::"name">`; `iree-run-module
    /// --parameters=SCOPE=FILE` binds it to a parameter file.
    pub param_scope: String,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions { param_scope: DEFAULT_PARAM_SCOPE.into() }
    }
}

/// An MLIR context set up for kiln, with a handler that captures
/// diagnostics so errors can carry them.
pub struct Session {
    context: Context,
    diagnostics: Rc<RefCell<Vec<String>>>,
    /// Ops carry their graph node's name as their location: only while a
    /// module that failed verification is lowered again for the report
    /// (27k uniqued names took 6 MB of a 30B model's export).
    named_locations: Cell<bool>,
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// A fresh context with `func` loaded and unregistered dialects allowed.
    pub fn new() -> Self {
        let context = Context::new();
        DialectHandle::func().register_dialect(&context);
        context.get_or_load_dialect("func");
        // stablehlo, util and flow are IREE's; they stay unregistered here and
        // print in generic form.
        context.set_allow_unregistered_dialects(true);
        let diagnostics = Rc::new(RefCell::new(Vec::new()));
        let sink = diagnostics.clone();
        context.attach_diagnostic_handler(move |d| {
            sink.borrow_mut().push(format!("{}: {}", d.location(), d));
            true
        });
        Session { context, diagnostics, named_locations: Cell::new(false) }
    }

    /// The MLIR context that modules lowered in this session live in.
    pub fn context(&self) -> &Context {
        &self.context
    }

    fn take_diagnostics(&self) -> Vec<String> {
        std::mem::take(&mut *self.diagnostics.borrow_mut())
    }

    /// Lowers `graph` into a verified module with one function named after
    /// it; every param is `#flow.parameter.named<options.param_scope::name>`.
    pub fn lower(&self, graph: &Graph, options: &LowerOptions) -> Result<Module<'_>, LowerError> {
        self.lower_functions(&[graph], options, &ParamInits::default())
    }

    /// [`Session::lower`] with each param's initial value from `inits`. The
    /// module aliases the inline bytes, so it cannot outlive them.
    pub fn lower_with<'s>(
        &'s self,
        graph: &Graph,
        options: &LowerOptions,
        inits: &ParamInits<'s>,
    ) -> Result<Module<'s>, LowerError> {
        self.lower_functions(&[graph], options, inits)
    }

    /// Lowers `graphs` into one verified module, a function per graph (named
    /// after it) sharing one global per param name: a model's entry points
    /// (`prefill`, `decode`) read the same weights. Params are initialized as
    /// `inits` says.
    pub fn lower_functions<'s>(
        &'s self,
        graphs: &[&Graph],
        options: &LowerOptions,
        inits: &ParamInits<'s>,
    ) -> Result<Module<'s>, LowerError> {
        self.build_module(graphs, options, inits, |scope| {
            graphs.iter().try_for_each(|graph| self.lower_function(scope, graph, FunctionKind::Public, &[]))
        })
    }

    /// A serving module: the loop's `prefill` and `decode` as public
    /// functions, its pickers as private ones, and `generate`, the greedy
    /// loop over them ([`GreedyLoop`]).
    pub fn lower_serving<'s>(
        &'s self,
        spec: &GreedyLoop<'_>,
        options: &LowerOptions,
        inits: &ParamInits<'s>,
    ) -> Result<Module<'s>, LowerError> {
        let mut module = self.build_module(&spec.graphs(), options, inits, |scope| {
            // iree-compile inlines every call (`generate`'s too), so the model
            // is compiled once per caller. Keeping a body out of line needs
            // `no_inline` on `func.call`, which MLIR 22 prints where IREE's
            // newer parser refuses it.
            // With stepped prefill, the public `prefill` chooses between the
            // prompt's graph and decode steps by the prompt's length
            // (`generate::lower_prefill`).
            match (spec.prefill, spec.stepped_prefill) {
                (Some(prefill), 0) => self.lower_function(scope, prefill, FunctionKind::Public, &[])?,
                (Some(prefill), _) => {
                    self.lower_function_as(scope, prefill, generate::PREFILL_PROMPT, FunctionKind::Private, &[])?
                }
                (None, _) => {}
            }
            for fill in [spec.fill].into_iter().chain(spec.fill_chunk) {
                self.lower_function(scope, fill, FunctionKind::Untiled, &[])?;
            }
            self.lower_function(scope, spec.head, FunctionKind::Private, &[])?;
            // The caller's caches are decode's output storage: without it,
            // IREE writes new caches every step (2 x 94 MB for SmolLM2 at
            // 4096 positions), which took a step from 32 to 285 ms.
            generate::lower_decode(self, scope, spec)?;
            self.lower_function(scope, spec.pick, FunctionKind::Private, &[])?;
            // After `decode`: with the stepped `prefill` first, iree-compile
            // 3.13's stream conversion failed ("failed to legalize unresolved
            // target materialization").
            if spec.steps_prompts() {
                generate::lower_prefill(self, scope, spec)?;
            }
            generate::lower_generate(self, scope, spec)
        })?;
        // `generate`'s loop carries the caches as block arguments, whose
        // device IREE 3.13 does not know: without a topology its stream
        // passes keep a transfer (a copy of both whole caches, 5.9 MB a token
        // for SmolLM2) at every iteration. Any topology lets them see that a
        // device reaches its own memory; the link itself says nothing more.
        let topology = Attribute::parse(
            &self.context,
            "#hal.device.topology<links = [(@__device_0 -> @__device_0 = {unified_memory = true, transparent_access = true})]>",
        )
        .expect("a device topology attribute parses");
        module.as_operation_mut().set_attribute("stream.topology", topology);
        Ok(module)
    }

    /// A module whose one public function is `spec`'s loop over rows of
    /// its inputs ([`RowLoop`]), the row graphs private.
    pub fn lower_rows<'s>(
        &'s self,
        spec: &RowLoop<'_>,
        options: &LowerOptions,
        inits: &ParamInits<'s>,
    ) -> Result<Module<'s>, LowerError> {
        self.build_module(&spec.graphs, options, inits, |scope| {
            spec.graphs.iter().try_for_each(|graph| self.lower_function(scope, graph, FunctionKind::Private, &[]))?;
            rows::lower_row_loop(self, scope, spec)
        })
    }

    /// A module holding one global per param of `graphs` and what `body`
    /// appends, verified.
    fn build_module<'s>(
        &'s self,
        graphs: &[&Graph],
        options: &LowerOptions,
        inits: &ParamInits<'s>,
        body: impl Fn(&Scope<'s, '_>) -> Result<(), LowerError>,
    ) -> Result<Module<'s>, LowerError> {
        self.take_diagnostics();
        let module = Module::new(Location::unknown(&self.context));
        let globals = param::declare_globals(self, &module, graphs, options, inits)?;
        body(&Scope { module: &module, globals, callees: RefCell::default(), tiled: RefCell::default() })?;
        if module.as_operation().verify() {
            return Ok(module);
        }
        if self.named_locations.get() {
            return Err(LowerError::Verify { diagnostics: self.take_diagnostics() });
        }
        // Again with each op located at its node, for diagnostics that name it.
        drop(module);
        self.named_locations.set(true);
        let named = self.build_module(graphs, options, inits, body);
        self.named_locations.set(false);
        match named {
            Ok(_) => Err(LowerError::Verify { diagnostics: self.take_diagnostics() }),
            Err(e) => Err(e),
        }
    }

    /// Appends the graph to the module as a function of `kind`, each
    /// `[input, output]` of `in_place` the output written into the input's
    /// buffer ([`Signature::in_place`]).
    fn lower_function(
        &self,
        scope: &Scope<'_, '_>,
        graph: &Graph,
        kind: FunctionKind,
        in_place: &[[usize; 2]],
    ) -> Result<(), LowerError> {
        self.lower_function_as(scope, graph, &graph.name, kind, in_place)
    }

    /// [`Session::lower_function`] as `func.func @name`.
    fn lower_function_as(
        &self,
        scope: &Scope<'_, '_>,
        graph: &Graph,
        name: &str,
        kind: FunctionKind,
        in_place: &[[usize; 2]],
    ) -> Result<(), LowerError> {
        let ctx = &self.context;
        let arg_types: Vec<Type> = graph.inputs().iter().map(|&v| tensor_type(ctx, &graph.node(v).ty)).collect();
        let result_types: Vec<Type> = graph.outputs().iter().map(|&v| tensor_type(ctx, &graph.node(v).ty)).collect();
        let arg_locs: Vec<(Type, Location)> = graph
            .inputs()
            .iter()
            .zip(&arg_types)
            .map(|(&v, &t)| (t, Location::name(ctx, &graph.node(v).name, Location::unknown(ctx))))
            .collect();
        let block = Block::new(&arg_locs);
        {
            // Where a `?` size is read from: the first dynamic input's first `?` dim.
            let dynamic_source = graph.inputs().iter().enumerate().find_map(|(i, &v)| {
                let dim = graph.node(v).ty.shape.iter().position(|&d| d == DYNAMIC)?;
                Some((block.argument(i).expect("one block argument per graph input").into(), dim))
            });
            let function = Function { dynamic_source, dynamic_size: OnceCell::new(), dynamic_index: OnceCell::new() };
            let mut values: Vec<Option<Value>> = vec![None; graph.nodes().len()];
            for (i, &v) in graph.inputs().iter().enumerate() {
                values[v.0] = Some(block.argument(i).expect("one block argument per graph input").into());
            }
            if kind == FunctionKind::Untiled {
                let first = graph.inputs().first().ok_or_else(|| LowerError::Node {
                    node: graph.name.clone(),
                    op: "func.func",
                    message: "an untiled entry point needs an input to mark".into(),
                    diagnostics: vec![],
                })?;
                values[first.0] = Some(mark_untiled(ctx, &block, values[first.0].expect("set above"))?);
            }
            let chunked = chunked_products(graph);
            for (index, node) in graph.nodes().iter().enumerate() {
                // A chunked product's weight is dequantized by its steps.
                if matches!(node.op, Op::Input) || chunked.dequantized.contains(&index) {
                    continue;
                }
                let e = Emitter {
                    session: self,
                    scope,
                    block: &block,
                    function: &function,
                    node: &node.name,
                    op: node.op.name(),
                };
                if let Some(&weight) = chunked.products.get(&index) {
                    let lowered =
                        |v: ValueId| values[v.0].ok_or_else(|| e.error("operand was not lowered before its use"));
                    let raw = graph.node(node.operands[1]).operands[0];
                    let raw_dtype = graph.node(raw).ty.dtype;
                    let (x, raw) = (lowered(node.operands[0])?, lowered(raw)?);
                    let product = dot_general::lower_chunked_weight_product(&e, weight, x, raw, raw_dtype, &node.ty)?;
                    values[index] = Some(product);
                    continue;
                }
                let mut operands = Vec::with_capacity(node.operands.len());
                for (i, v) in node.operands.iter().enumerate() {
                    let value = values.get(v.0).copied().flatten().ok_or_else(|| {
                        e.error(format!("operand {i} (value #{}) was not lowered before its use", v.0))
                    })?;
                    operands.push(value);
                }
                let operand_types: Vec<&TensorType> = node.operands.iter().map(|v| &graph.node(*v).ty).collect();
                // A param's tiling is computed once, at load.
                if let Op::TileRows { lanes, order } = &node.op {
                    if let Some((name, param_ty)) = graph.param_root(node.operands[0]) {
                        let tiling = param::Tiling { operand: operand_types[0], lanes: *lanes, order };
                        values[index] = Some(param::load_tiled(&e, name, param_ty, &tiling, &node.ty)?);
                        continue;
                    }
                }
                // A prompt's rows times a weight stays data-tiled wherever
                // a decode step's untiled mark is inlined.
                if let Op::DotGeneral(dims) = &node.op {
                    if graph.weight_root(node.operands[1]).is_some() {
                        if let Some(k) = dot_general::weight_product(operand_types[0], dims, &node.ty) {
                            values[index] =
                                Some(dot_general::lower_weight_product(&e, operands[0], operands[1], k, &node.ty)?);
                            continue;
                        }
                    }
                }
                values[index] = Some(e.lower_node(&node.op, &operands, &operand_types, &node.ty)?);
            }
            let outputs = graph
                .outputs()
                .iter()
                .map(|v| {
                    values[v.0].ok_or_else(|| LowerError::Node {
                        node: graph.node(*v).name.clone(),
                        op: "return",
                        message: "returned value was not lowered".into(),
                        diagnostics: vec![],
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            block.append_operation(func::r#return(&outputs, Location::name(ctx, "return", Location::unknown(ctx))));
        }
        let function_type = FunctionType::new(ctx, &arg_types, &result_types);
        self.append_function(scope, name, function_type, block, kind, in_place);
        Ok(())
    }

    /// Appends `func.func @name` of `function_type` to the module, its body
    /// the one `block`.
    fn append_function(
        &self,
        scope: &Scope<'_, '_>,
        name: &str,
        function_type: FunctionType,
        block: Block,
        kind: FunctionKind,
        in_place: &[[usize; 2]],
    ) {
        let ctx = &self.context;
        let region = Region::new();
        region.append_block(block);
        let loc = Location::name(ctx, name, Location::unknown(ctx));
        let private = (Identifier::new(ctx, "sym_visibility"), StringAttribute::new(ctx, "private").into());
        let mut attributes = match kind {
            FunctionKind::Public => vec![],
            FunctionKind::Private | FunctionKind::Untiled => vec![private],
        };
        if !in_place.is_empty() {
            let index = Type::index(ctx);
            let arg_attrs: Vec<Attribute> = (0..function_type.input_count())
                .map(|input| {
                    let storage = in_place.iter().find(|[i, _]| *i == input).map(|&[_, output]| {
                        let output = IntegerAttribute::new(index, output as i64).into();
                        (Identifier::new(ctx, OUTPUT_STORAGE), output)
                    });
                    DictionaryAttribute::new(ctx, storage.as_slice()).into()
                })
                .collect();
            attributes.push((Identifier::new(ctx, "arg_attrs"), ArrayAttribute::new(ctx, &arg_attrs).into()));
        }
        let name = StringAttribute::new(ctx, name);
        let function = func::func(ctx, name, TypeAttribute::new(function_type.into()), region, &attributes, loc);
        scope.module.body().append_operation(function);
    }
}

/// What the functions of one module share while it is built.
pub(crate) struct Scope<'c, 'm> {
    module: &'m Module<'c>,
    /// The global that holds each param.
    globals: Globals,
    /// Private functions appended for composite ops so far, by symbol.
    callees: RefCell<HashSet<String>>,
    /// The globals holding params tiled by rows, computed at load
    /// ([`param::load_tiled`]): symbol by param name and tiled type.
    tiled: RefCell<HashMap<(String, String), String>>,
}

/// A graph's prompt products whose packed weight is dequantized a block of
/// rows at a time ([`dot_general::lower_chunked_weight_product`]).
#[derive(Default)]
struct Chunked {
    /// By the product's node.
    products: HashMap<usize, dot_general::ChunkedWeight>,
    /// The `dequantize` nodes those products take, used by nothing else.
    dequantized: HashSet<usize>,
}

/// The weight products of `graph` ([`dot_general::weight_product`], the
/// weight's rows contracted) whose weight is a `dequantize` of a `[rows,
/// cols]` matrix that no other node reads and that [`dot_general::ChunkedWeight`]
/// splits.
fn chunked_products(graph: &Graph) -> Chunked {
    let mut users = vec![0usize; graph.nodes().len()];
    for node in graph.nodes() {
        for v in &node.operands {
            users[v.0] += 1;
        }
    }
    for v in graph.outputs() {
        users[v.0] += 1;
    }
    let mut chunked = Chunked::default();
    for (index, node) in graph.nodes().iter().enumerate() {
        let Op::DotGeneral(dims) = &node.op else { continue };
        let (x, w) = (graph.node(node.operands[0]), node.operands[1]);
        let Op::Dequantize { ggml } = graph.node(w).op else { continue };
        let &[rows, cols] = &graph.node(w).ty.shape[..] else { continue };
        let raw = &graph.node(graph.node(w).operands[0]).ty;
        let split = dot_general::weight_product(&x.ty, dims, &node.ty) == Some(1)
            && users[w.0] == 1
            && raw.rank() == 1
            && graph.weight_root(w).is_some();
        if let Some(weight) = dot_general::ChunkedWeight::new(ggml, rows, cols).filter(|_| split) {
            chunked.products.insert(index, weight);
            chunked.dequantized.insert(w.0);
        }
    }
    chunked
}

/// `value` through a `util.optimization_barrier` carrying IREE's data-tiling
/// hint. When any op of a function carries the hint, IREE's
/// `AnnotateDataTilingHints` leaves the choice to the hinted ops; the
/// barrier is no linalg op, so nothing in the function is data-tiled.
fn mark_untiled<'c, 'a>(
    ctx: &'c Context,
    block: &'a Block<'c>,
    value: Value<'c, 'a>,
) -> Result<Value<'c, 'a>, LowerError> {
    let loc = Location::name(ctx, "untiled", Location::unknown(ctx));
    let op = OperationBuilder::new("util.optimization_barrier", loc)
        .add_operands(&[value])
        .add_attributes(&[(Identifier::new(ctx, "iree.opt.data_tiling"), Attribute::unit(ctx))])
        .add_results(&[value.r#type()])
        .build()
        .map_err(|err| LowerError::Node {
            node: "untiled".into(),
            op: "util.optimization_barrier",
            message: err.to_string(),
            diagnostics: vec![],
        })?;
    Ok(block.append_operation(op).result(0).expect("one result").into())
}

/// How a graph becomes a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FunctionKind {
    /// `func.func @name`, an entry point.
    Public,
    /// `func.func private @name`, inlined where called.
    Private,
    /// A private function whose contractions iree-compile does not
    /// data-tile, nor any other unhinted one of a function it is inlined
    /// into (`mark_untiled`): a decode step's are matrix-vector products,
    /// and data tiling re-lays out their operands at every call (the
    /// weights too, as kiln compiles without const-expr hoisting). Measured
    /// on SmolLM2's decode: Q4_1 `keep` 13.3 -> 12.2 ms, bf16 weights 51 ->
    /// 34 ms; prefill keeps it (17% faster with it).
    Untiled,
}

/// A public function of a module, with its argument and result types as
/// MLIR prints them (`tensor<1x?xi32>`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Signature {
    /// The function's name.
    pub name: String,
    /// Argument types.
    pub inputs: Vec<String>,
    /// Result types.
    pub outputs: Vec<String>,
    /// `[input, output]` pairs: the input's buffer is the output's storage
    /// (`iree.abi.output`), so the call writes that result into the
    /// caller's own buffer, in place, and the input's old contents are gone
    /// after it. `decode`'s caches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_place: Vec<[usize; 2]>,
}

/// The public functions of `module`: a serving module's `prefill`,
/// `decode` and `generate` in that order (a stepped `prefill` is lowered
/// after `decode`), others in module order.
pub fn signatures(module: &Module<'_>) -> Vec<Signature> {
    let body = module.body();
    let ops = std::iter::successors(body.first_operation(), |op| op.next_in_block());
    let mut functions = ops
        .filter(|op| op.name().as_string_ref().as_str() == Ok("func.func") && !op.has_attribute("sym_visibility"))
        .map(|op| {
            let attribute = |name| op.attribute(name).expect("a func.func has a name and a type");
            let name = StringAttribute::try_from(attribute("sym_name")).expect("sym_name is a string");
            let ty = TypeAttribute::try_from(attribute("function_type")).expect("function_type is a type").value();
            let ty = FunctionType::try_from(ty).expect("function_type is a function type");
            Signature {
                name: name.value().to_string(),
                inputs: (0..ty.input_count()).map(|i| ty.input(i).expect("i < input_count").to_string()).collect(),
                outputs: (0..ty.result_count()).map(|i| ty.result(i).expect("i < result_count").to_string()).collect(),
                in_place: output_storage(&op),
            }
        })
        .collect::<Vec<_>>();
    // A stable sort: `prefill` first, the rest as they were.
    functions.sort_by_key(|s| s.name != "prefill");
    functions
}

/// The `[input, output]` pairs of a `func.func`'s `iree.abi.output`
/// argument attributes.
fn output_storage(function: &OperationRef<'_, '_>) -> Vec<[usize; 2]> {
    let Some(Ok(arg_attrs)) = function.attribute("arg_attrs").ok().map(ArrayAttribute::try_from) else {
        return vec![];
    };
    (0..arg_attrs.len())
        .filter_map(|input| {
            let attrs = DictionaryAttribute::try_from(arg_attrs.element(input).ok()?).ok()?;
            let output = IntegerAttribute::try_from(attrs.element_by_name(OUTPUT_STORAGE)?).ok()?;
            Some([input, usize::try_from(output.value()).ok()?])
        })
        .collect()
}

/// IREE's argument attribute that makes the argument the storage of a result.
const OUTPUT_STORAGE: &str = "iree.abi.output";

/// Prints a verified module as MLIR text (generic form for IREE's dialects).
pub fn print(module: &Module<'_>) -> Result<String, LowerError> {
    module
        .as_operation()
        .to_string_with_flags(OperationPrintingFlags::new())
        .map_err(|e| LowerError::Print(e.to_string()))
}

/// Lowers and prints in one step, for callers that only want text.
pub fn lower_to_string(graph: &Graph, options: &LowerOptions) -> Result<String, LowerError> {
    let session = Session::new();
    let module = session.lower(graph, options)?;
    print(&module)
}

pub(crate) fn element_type<'c>(ctx: &'c Context, dtype: DType) -> Type<'c> {
    match dtype {
        DType::F32 => Type::float32(ctx),
        DType::F16 => Type::float16(ctx),
        DType::BF16 => Type::bfloat16(ctx),
        DType::I1 => IntegerType::new(ctx, 1).into(),
        DType::I8 => IntegerType::new(ctx, 8).into(),
        DType::I16 => IntegerType::new(ctx, 16).into(),
        DType::I32 => IntegerType::new(ctx, 32).into(),
        DType::I64 => IntegerType::new(ctx, 64).into(),
        DType::UI8 => IntegerType::unsigned(ctx, 8).into(),
        DType::UI16 => IntegerType::unsigned(ctx, 16).into(),
        DType::UI32 => IntegerType::unsigned(ctx, 32).into(),
    }
}

pub(crate) fn tensor_type<'c>(ctx: &'c Context, ty: &TensorType) -> Type<'c> {
    // `?` is MLIR's `ShapedType::kDynamic`, i64::MIN.
    let dims: Vec<u64> = ty.shape.iter().map(|&d| if d == DYNAMIC { i64::MIN as u64 } else { d as u64 }).collect();
    RankedTensorType::new(&dims, element_type(ctx, ty.dtype), None).into()
}

/// What the ops of one function share.
pub(crate) struct Function<'c, 'a> {
    /// The block argument and dim a `?` size is read from.
    dynamic_source: Option<(Value<'c, 'a>, usize)>,
    /// That size as `tensor<1xi64>`, emitted at its first use.
    dynamic_size: OnceCell<Value<'c, 'a>>,
    /// That size as an `index`, for `tensor.expand_shape`.
    dynamic_index: OnceCell<Value<'c, 'a>>,
}

impl Function<'_, '_> {
    /// A body with no `?` size: a composite op's private function, an
    /// initializer.
    fn without_inputs() -> Self {
        Function { dynamic_source: None, dynamic_size: OnceCell::new(), dynamic_index: OnceCell::new() }
    }
}

/// Appends the ops of one graph node to the function body.
pub(crate) struct Emitter<'c, 'a> {
    session: &'c Session,
    scope: &'a Scope<'c, 'a>,
    block: &'a Block<'c>,
    function: &'a Function<'c, 'a>,
    node: &'a str,
    op: &'static str,
}

impl<'c, 'a> Emitter<'c, 'a> {
    pub fn ctx(&self) -> &'c Context {
        &self.session.context
    }

    /// The op's location: its node's name where the session names them.
    pub fn loc(&self) -> Location<'c> {
        match self.session.named_locations.get() {
            true => Location::name(self.ctx(), self.node, Location::unknown(self.ctx())),
            false => Location::unknown(self.ctx()),
        }
    }

    pub fn tensor_type(&self, ty: &TensorType) -> Type<'c> {
        tensor_type(self.ctx(), ty)
    }

    pub fn error(&self, message: impl Into<String>) -> LowerError {
        LowerError::Node {
            node: self.node.to_string(),
            op: self.op,
            message: message.into(),
            diagnostics: self.session.take_diagnostics(),
        }
    }

    /// Appends `op` and returns its single result.
    pub fn emit(&self, op: impl Into<Operation<'c>>) -> Result<Value<'c, 'a>, LowerError> {
        let op = self.block.append_operation(op.into());
        let result = op.result(0).map_err(|e| self.error(format!("op has no result: {e}")))?;
        Ok(result.into())
    }

    /// Parses an attribute that has no C API constructor (StableHLO's own
    /// attributes, e.g. `#stablehlo.dot<...>`), failing with MLIR's message.
    pub fn parse_attribute(&self, text: &str) -> Result<Attribute<'c>, LowerError> {
        Attribute::parse(self.ctx(), text).ok_or_else(|| self.error(format!("MLIR cannot parse attribute `{text}`")))
    }

    /// The run-time size of `?` as `tensor<1xi64>`, from the `tensor.dim`
    /// that [`Emitter::dynamic_index`] reads: one read for both uses.
    pub(super) fn dynamic_size(&self) -> Result<Value<'c, 'a>, LowerError> {
        if let Some(&size) = self.function.dynamic_size.get() {
            return Ok(size);
        }
        let ctx = self.ctx();
        let i64_type: Type = IntegerType::new(ctx, 64).into();
        let size = self.emit(arith::index_cast(ctx, i64_type, self.dynamic_index()?, self.loc()))?;
        let size_type = self.tensor_type(&TensorType::new([1], DType::I64));
        let size = self.emit(tensor::from_elements(ctx, size_type, &[size], self.loc()))?;
        Ok(*self.function.dynamic_size.get_or_init(|| size))
    }

    fn dynamic_source(&self) -> Result<(Value<'c, 'a>, usize), LowerError> {
        self.function.dynamic_source.ok_or_else(|| {
            self.error("a ? dim needs a function input with a ? dim (or a real_dynamic_slice) to take its size from")
        })
    }

    /// In a function without a dynamic input, reads the run-time size of
    /// `?` from dim `dim` of `sliced`, the first `real_dynamic_slice` with a
    /// `?` result (as the graph's shape rules have it).
    fn bind_dynamic_size(&self, sliced: Value<'c, 'a>, dim: usize) -> Result<(), LowerError> {
        if self.function.dynamic_source.is_none() && self.function.dynamic_index.get().is_none() {
            let index = self.dim_index(sliced, dim)?;
            self.function.dynamic_index.get_or_init(|| index);
        }
        Ok(())
    }

    /// `tensor.dim(value, dim)`, an `index`.
    fn dim_index(&self, value: Value<'c, 'a>, dim: usize) -> Result<Value<'c, 'a>, LowerError> {
        let ctx = self.ctx();
        let index_type = Type::index(ctx);
        let dim = self.emit(arith::constant(
            ctx,
            index_type,
            IntegerAttribute::new(index_type, dim as i64).into(),
            self.loc(),
        ))?;
        self.emit(tensor::dim(ctx, index_type, value, dim, self.loc()))
    }

    /// The run-time size of `?` as an `index`.
    pub fn dynamic_index(&self) -> Result<Value<'c, 'a>, LowerError> {
        if let Some(&index) = self.function.dynamic_index.get() {
            return Ok(index);
        }
        let (source, dim) = self.dynamic_source()?;
        let index = self.dim_index(source, dim)?;
        Ok(*self.function.dynamic_index.get_or_init(|| index))
    }

    /// `values` as a `tensor<Nxi64>` for the dynamic-shape ops' shape
    /// operands; a `?` entry is the run-time size.
    pub fn shape_tensor(&self, values: &[usize]) -> Result<Value<'c, 'a>, LowerError> {
        let ctx = self.ctx();
        let i64_type: Type = IntegerType::new(ctx, 64).into();
        let constant = |values: &[usize]| -> Result<Value<'c, 'a>, LowerError> {
            let ty = TensorType::new([values.len()], DType::I64);
            let items: Vec<Attribute> =
                values.iter().map(|&v| IntegerAttribute::new(i64_type, v as i64).into()).collect();
            let attr = DenseElementsAttribute::new(self.tensor_type(&ty), &items)
                .map_err(|err| self.error(format!("cannot build shape {values:?}: {err}")))?;
            self.emit(stablehlo::constant(ctx, self.tensor_type(&ty), attr.into(), self.loc()))
        };
        if !values.contains(&DYNAMIC) {
            return constant(values);
        }
        // Runs of static entries are one constant each, `?` the size itself.
        let mut pieces = Vec::new();
        for run in values.split_inclusive(|&v| v == DYNAMIC) {
            let (head, ends_dynamic) = match run.split_last() {
                Some((&DYNAMIC, head)) => (head, true),
                _ => (run, false),
            };
            if !head.is_empty() {
                pieces.push(constant(head)?);
            }
            if ends_dynamic {
                pieces.push(self.dynamic_size()?);
            }
        }
        let dim = IntegerAttribute::new(i64_type, 0);
        let ty = TensorType::new([values.len()], DType::I64);
        self.emit(stablehlo::concatenate(ctx, self.tensor_type(&ty), &pieces, dim.into(), self.loc()))
    }

    /// `func.call @callee(inputs)`, returning its results.
    pub fn call(&self, callee: &str, inputs: &[Value<'c, 'a>], results: &[Type<'c>]) -> Vec<Value<'c, 'a>> {
        let callee = FlatSymbolRefAttribute::new(self.ctx(), callee);
        let op = self.block.append_operation(func::call(self.ctx(), callee, inputs, results, self.loc()));
        (0..results.len()).map(|i| op.result(i).expect("one result per declared type").into()).collect()
    }

    pub fn i64_array(&self, values: &[usize]) -> Attribute<'c> {
        let values: Vec<i64> = values.iter().map(|&v| v as i64).collect();
        DenseI64ArrayAttribute::new(self.ctx(), &values).into()
    }

    fn lower_node(
        &self,
        op: &Op,
        operands: &[Value<'c, 'a>],
        operand_types: &[&TensorType],
        ty: &TensorType,
    ) -> Result<Value<'c, 'a>, LowerError> {
        let result = self.tensor_type(ty);
        match op {
            Op::Input => Err(self.error("inputs are block arguments, not ops")),
            Op::Param { name } => param::load_global(self, &self.scope.globals, name, ty),
            Op::Constant { value } => constant::lower_constant(self, *value, ty),
            Op::Iota { iota_dimension } => constant::lower_iota(self, *iota_dimension, ty),
            Op::Range => constant::lower_range(self, ty.shape[0]),
            Op::Unary(u) => elementwise::lower_unary(self, *u, operands[0], result),
            Op::Binary(b) => elementwise::lower_binary(self, *b, operands[0], operands[1], result),
            Op::Convert => elementwise::lower_convert(self, operands[0], result),
            Op::BitcastConvert => bitwise::lower_bitcast_convert(self, operands[0], result),
            Op::Bitwise(b) => bitwise::lower_bitwise(self, *b, operands[0], operands[1], result),
            Op::Not => bitwise::lower_not(self, operands[0], result),
            Op::Clamp => elementwise::lower_clamp(self, operands, result),
            Op::Compare(d) => elementwise::lower_compare(self, *d, operands[0], operands[1], result),
            Op::Select => elementwise::lower_select(self, operands, result),
            Op::Reshape => layout::lower_reshape(self, operands[0], operand_types[0], ty),
            Op::Transpose { permutation } => layout::lower_transpose(self, operands[0], permutation, result),
            Op::TileRows { lanes, order } => {
                layout::lower_tile_rows(self, operands[0], operand_types[0], *lanes, order, ty)
            }
            Op::Reverse { dimensions } => layout::lower_reverse(self, operands[0], dimensions, result),
            Op::BroadcastInDim { broadcast_dimensions } => {
                layout::lower_broadcast_in_dim(self, operands[0], operand_types[0], broadcast_dimensions, ty)
            }
            Op::Concatenate { dimension } => layout::lower_concatenate(self, operands, *dimension, result),
            Op::Slice { start_indices, limit_indices, strides } => {
                layout::lower_slice(self, operands[0], operand_types[0], start_indices, limit_indices, strides, result)
            }
            Op::DynamicSlice { slice_sizes } => {
                dynamic_slice::lower_dynamic_slice(self, operands[0], &operands[1..], slice_sizes, result)
            }
            Op::DynamicUpdateSlice => {
                dynamic_slice::lower_dynamic_update_slice(self, operands[0], operands[1], &operands[2..], result)
            }
            Op::RealDynamicSlice => {
                let sliced = dynamic_slice::lower_real_dynamic_slice(self, operands, result)?;
                if let Some(dim) = ty.shape.iter().position(|&d| d == DYNAMIC) {
                    self.bind_dynamic_size(sliced, dim)?;
                }
                Ok(sliced)
            }
            Op::Pad { edge_padding_low, edge_padding_high, interior_padding } => {
                let padding = [edge_padding_low.as_slice(), edge_padding_high, interior_padding];
                layout::lower_pad(self, operands[0], operands[1], padding, result)
            }
            Op::DotGeneral(dims) => {
                dot_general::lower_dot_general(self, operands[0], operands[1], operand_types[0], dims, ty)
            }
            Op::Gather => gather::lower_gather(self, operands[0], operands[1], operand_types[0], operand_types[1], ty),
            Op::Reduce { kind, dimensions } => reduce::lower_reduce(self, *kind, operands[0], dimensions, ty),
            Op::Argmax { dimension } => reduce::lower_argmax(self, operands[0], operand_types[0], *dimension, ty),
            Op::Dequantize { ggml } => dequantize::lower_dequantize(self, *ggml, operands[0], operand_types[0], ty),
            Op::PackedMatvec { ggml } => {
                let (&x, matrices) = operands.split_last().expect("at least two operands");
                let x_ty = operand_types[operands.len() - 1];
                packed_matvec::lower_packed_matvec(self, *ggml, matrices, operand_types[0], x, x_ty, ty)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::text;

    /// A module that fails verification is lowered again with each op
    /// located at its node, and the error names the node.
    #[test]
    fn a_module_failing_verification_is_reported_at_named_locations() {
        let session = Session::new();
        let attempts = Cell::new(0);
        let error = session
            .build_module(&[], &LowerOptions::default(), &ParamInits::default(), |scope| {
                attempts.set(attempts.get() + 1);
                let ctx = session.context();
                let loc = match session.named_locations.get() {
                    true => Location::name(ctx, "the_node", Location::unknown(ctx)),
                    false => Location::unknown(ctx),
                };
                // `func.func @f() -> i32` returning nothing.
                let region = Region::new();
                let block = Block::new(&[]);
                block.append_operation(func::r#return(&[], loc));
                region.append_block(block);
                let ty = FunctionType::new(ctx, &[], &[IntegerType::new(ctx, 32).into()]);
                let f =
                    func::func(ctx, StringAttribute::new(ctx, "f"), TypeAttribute::new(ty.into()), region, &[], loc);
                scope.module.body().append_operation(f);
                Ok(())
            })
            .unwrap_err()
            .to_string();
        assert_eq!(attempts.get(), 2);
        assert!(error.contains("the_node"), "{error}");
        assert!(!session.named_locations.get());
    }

    const TIED: &str = r#"
func @main(%ids: tensor<3xi32>, %h: tensor<3x4xf32>) {
  %embed = param {name = "token_embd.weight"} : tensor<10x4xf32>
  %norm = param {name = "output_norm.weight"} : tensor<4xf32>
  %x = gather %embed, %ids : tensor<3x4xf32>
  %n = broadcast_in_dim %norm {broadcast_dimensions = [1]} : tensor<3x4xf32>
  %y = multiply %x, %n : tensor<3x4xf32>
  %z = add %y, %h : tensor<3x4xf32>
  %tied = param {name = "token_embd.weight"} : tensor<10x4xf32>
  %logits = dot_general %z, %tied {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : tensor<3x10xf32>
  return %logits
}
"#;

    #[test]
    fn signature_holds_only_graph_inputs() {
        let graph = text::parse(TIED).unwrap();
        let session = Session::new();
        let module = session.lower(&graph, &LowerOptions::default()).unwrap();
        let body = module.body();
        let mut globals = 0;
        let mut func_args = None;
        let mut op = body.first_operation();
        while let Some(o) = op {
            match o.name().as_string_ref().as_str().unwrap() {
                "util.global" => globals += 1,
                "func.func" => {
                    let region = o.region(0).unwrap();
                    func_args = Some(region.first_block().unwrap().argument_count());
                }
                other => panic!("unexpected top-level op {other}"),
            }
            op = o.next_in_block();
        }
        assert_eq!(func_args, Some(graph.inputs().len()));
        assert_eq!(globals, 2, "tied embedding is one global");
    }

    /// Ops carry their node's name as location only where the session asks
    /// (lowering again a module that failed verification).
    #[test]
    fn ops_carry_the_node_name_as_location_when_asked() {
        let graph = text::parse(TIED).unwrap();
        let session = Session::new();
        let printed = |named: bool| {
            session.named_locations.set(named);
            let module = session.lower(&graph, &LowerOptions::default()).unwrap();
            let flags = OperationPrintingFlags::new().enable_debug_info(true, false);
            module.as_operation().to_string_with_flags(flags).unwrap()
        };
        let named = printed(true);
        assert!(named.contains("loc(\"logits\")"), "{named}");
        let plain = printed(false);
        assert!(!plain.contains("loc(\"logits\")"), "{plain}");
    }

    #[test]
    fn global_symbols_are_sanitized_and_unique() {
        let src = "func @f(%x: tensor<2xf32>) {\n  %a = param {name = \"a b\"} : tensor<2xf32>\n  %b = param {name = \"a_b\"} : tensor<2xf32>\n  %s = add %a, %b : tensor<2xf32>\n  %t = add %s, %x : tensor<2xf32>\n  return %t\n}\n";
        let mlir = lower_to_string(&text::parse(src).unwrap(), &LowerOptions::default()).unwrap();
        assert!(mlir.contains("sym_name = \"a_b\""), "{mlir}");
        assert!(mlir.contains("sym_name = \"a_b_1\""), "{mlir}");
        assert!(mlir.contains("#flow.parameter.named<\"model\"::\"a b\">"), "{mlir}");
    }

    #[test]
    fn a_param_named_like_the_function_gets_its_own_symbol() {
        let src = "func @main(%x: tensor<2xf32>) {\n  %w = param {name = \"main\"} : tensor<2xf32>\n  %y = add %x, %w : tensor<2xf32>\n  return %y\n}\n";
        let mlir = lower_to_string(&text::parse(src).unwrap(), &LowerOptions::default()).unwrap();
        assert!(mlir.contains("sym_name = \"main_1\""), "{mlir}");
    }
}
