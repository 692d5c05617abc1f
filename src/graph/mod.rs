//! The traced program: values, nodes, params, inputs and outputs.
//!
//! Every value is a [`Node`] whose result type is computed by the op's shape
//! rule (in [`ops`]) when the node is added, so a graph that exists is
//! well-typed. Lowering and the interpreter trust `Node::ty`, as StableHLO's
//! reference interpreter trusts the inferred result type.
//!
//! The graph has a textual form ([`text`]) that prints and parses back.

pub mod ops;
pub mod text;

use std::collections::HashMap;
use thiserror::Error;

pub use ops::{ComparisonDirection, DotDimensions, Op, ReduceKind};
// Element and tensor types belong to the data floor: checkpoints and
// archives have them too.
pub use crate::weights::{DType, TensorType, DYNAMIC};

/// Index of a node in its graph; a node has exactly one result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub usize);

/// One op application and its result.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Unique within the graph; becomes the MLIR `NameLoc` of what it lowers to.
    pub name: String,
    /// What the node computes.
    pub op: Op,
    /// The values it reads, defined earlier in the graph.
    pub operands: Vec<ValueId>,
    /// Its result type, from the op's shape rule.
    pub ty: TensorType,
}

/// A rule of an op was broken: names the op, the spec constraint and the values.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("{op} ({rule}): {message}")]
pub struct ShapeError {
    /// The op, by its StableHLO name.
    pub op: &'static str,
    /// The StableHLO spec constraint, e.g. `C10`, or `kiln` for kiln's own rules.
    pub rule: &'static str,
    /// What is wrong, with the values involved.
    pub message: String,
}

impl ShapeError {
    /// A broken `rule` of `op`.
    pub fn new(op: &'static str, rule: &'static str, message: impl Into<String>) -> Self {
        ShapeError { op, rule, message: message.into() }
    }
}

/// Why a node cannot be added or a graph text cannot be parsed.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum GraphError {
    /// A node's operands break its op's shape rule.
    #[error("node %{node}: {error}")]
    Shape {
        /// The node's name.
        node: String,
        /// The rule and the values.
        error: ShapeError,
    },
    /// An operand refers to a value not defined before the node.
    #[error("node %{node} ({op}): operand {index} refers to %{operand}, which is not defined before it")]
    MissingOperand {
        /// The node's name.
        node: String,
        /// Its op.
        op: String,
        /// Which operand.
        index: usize,
        /// The operand as written (a name, or `#id`).
        operand: String,
    },
    /// Two values have the same name.
    #[error("value name %{0} is defined twice")]
    DuplicateName(String),
    /// One param name is declared with two types.
    #[error("param \"{name}\" is declared as {first} and again as {second}")]
    ParamTypeConflict {
        /// The param (checkpoint tensor) name.
        name: String,
        /// The type it was first declared with.
        first: TensorType,
        /// The conflicting type.
        second: TensorType,
    },
    /// A node has a `?` dim but no value before it gives its size.
    #[error("node %{node}: its type {ty} has a ? dim, but no function input before it has one (nor a real_dynamic_slice) to take the run-time size from")]
    UnboundDynamic {
        /// The node's name.
        node: String,
        /// Its result type.
        ty: TensorType,
    },
    /// A graph must return at least one value.
    #[error("the graph has no outputs; `return` at least one value")]
    NoOutputs,
    /// The graph text is malformed.
    #[error("line {line}: {message}")]
    Parse {
        /// The 1-based line.
        line: usize,
        /// What is wrong there.
        message: String,
    },
}

/// A function: nodes in definition order, its inputs and its outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    /// The function's name (`main`, `prefill`), the MLIR symbol it lowers to.
    pub name: String,
    nodes: Vec<Node>,
    inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
    by_name: HashMap<String, ValueId>,
    /// Checkpoint tensor name -> its single param node (tied weights share one).
    params: HashMap<String, ValueId>,
}

impl Graph {
    /// An empty function called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Graph { name: name.into(), ..Default::default() }
    }

    /// Every node, in definition order; a [`ValueId`] indexes it.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node `id` names; panics if `id` is out of range.
    pub fn node(&self, id: ValueId) -> &Node {
        &self.nodes[id.0]
    }

    /// The function arguments, in order.
    pub fn inputs(&self) -> &[ValueId] {
        &self.inputs
    }

    /// The returned values, in order.
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    /// Param nodes in definition order.
    pub fn params(&self) -> impl Iterator<Item = (ValueId, &str, &TensorType)> {
        self.nodes.iter().enumerate().filter_map(|(i, n)| match &n.op {
            Op::Param { name } => Some((ValueId(i), name.as_str(), &n.ty)),
            _ => None,
        })
    }

    /// The param that `value` is or reshapes, with its type: a constant of
    /// the module, whose layout changes (`tile_rows`) the lowering computes
    /// once, at load.
    pub fn param_root(&self, value: ValueId) -> Option<(&str, &TensorType)> {
        let node = self.node(value);
        match &node.op {
            Op::Param { name } => Some((name, &node.ty)),
            Op::Reshape => self.param_root(node.operands[0]),
            _ => None,
        }
    }

    /// The param whose values `value` holds in another form (reshaped,
    /// transposed, converted or dequantized): a weight, as opposed to an
    /// activation.
    pub fn weight_root(&self, value: ValueId) -> Option<&str> {
        let node = self.node(value);
        match &node.op {
            Op::Param { name } => Some(name),
            Op::Reshape | Op::Convert | Op::Dequantize { .. } | Op::Transpose { .. } => {
                self.weight_root(node.operands[0])
            }
            _ => None,
        }
    }

    /// The bytes of each `tile_rows` of a param, keyed by the param's name,
    /// the op and its type (a function tiles a param once per tiling; the
    /// lowering's initializers allocate each key once across functions).
    pub fn tiled_param_bytes(&self) -> impl Iterator<Item = ((&str, &Op, &TensorType), u64)> + '_ {
        self.nodes.iter().filter_map(|n| match &n.op {
            Op::TileRows { .. } => {
                let (name, _) = self.param_root(n.operands[0])?;
                Some(((name, &n.op, &n.ty), n.ty.num_elements() as u64 * n.ty.dtype.size_in_bytes() as u64))
            }
            _ => None,
        })
    }

    /// The value named `name` (without the `%`); a tied param's alias names the one param.
    pub fn lookup(&self, name: &str) -> Option<ValueId> {
        self.by_name.get(name).copied()
    }

    /// A fresh node name: `prefix`, or `prefix_N` if taken.
    pub fn fresh_name(&self, prefix: &str) -> String {
        if !prefix.is_empty() && !self.by_name.contains_key(prefix) {
            return prefix.to_string();
        }
        let base = if prefix.is_empty() { "v" } else { prefix };
        (self.nodes.len()..)
            .map(|i| format!("{base}{i}"))
            .find(|n| !self.by_name.contains_key(n))
            .expect("an unbounded range always yields a free name")
    }

    /// Adds a node after checking its operands with the op's shape rule.
    ///
    /// `declared` is the result type written by the caller: required for ops
    /// whose result type is not a function of their operands (see
    /// [`Op::takes_declared_type`]), and otherwise checked against the
    /// inferred type.
    pub fn add_node(
        &mut self,
        name: impl Into<String>,
        op: Op,
        operands: Vec<ValueId>,
        declared: Option<TensorType>,
    ) -> Result<ValueId, GraphError> {
        let name = name.into();
        if self.by_name.contains_key(&name) {
            return Err(GraphError::DuplicateName(name));
        }
        for (index, v) in operands.iter().enumerate() {
            if v.0 >= self.nodes.len() {
                return Err(GraphError::MissingOperand {
                    node: name,
                    op: op.name().to_string(),
                    index,
                    operand: format!("#{}", v.0),
                });
            }
        }
        let types: Vec<&TensorType> = operands.iter().map(|v| &self.nodes[v.0].ty).collect();
        let ty =
            op.infer(&types, declared.as_ref()).map_err(|error| GraphError::Shape { node: name.clone(), error })?;
        // A `?` is the size of a dynamic input's `?` dim (see `DYNAMIC`), or
        // in a function without one, of a `real_dynamic_slice`'s `?` result
        // dim (a decode step's filled cache length): sizes computed from
        // values. Other ops (iota, constant...) only take that size once it
        // exists.
        if ty.is_dynamic() && !matches!(op, Op::Input | Op::RealDynamicSlice) && !self.has_dynamic_size() {
            return Err(GraphError::UnboundDynamic { node: name, ty });
        }
        if let Op::Param { name: pname } = &op {
            if let Some(&existing) = self.params.get(pname) {
                let first = &self.nodes[existing.0].ty;
                if *first != ty {
                    return Err(GraphError::ParamTypeConflict {
                        name: pname.clone(),
                        first: first.clone(),
                        second: ty,
                    });
                }
                // Tied weights: the new name is an alias of the one param.
                self.by_name.insert(name, existing);
                return Ok(existing);
            }
        }
        let id = ValueId(self.nodes.len());
        if let Op::Param { name: pname } = &op {
            self.params.insert(pname.clone(), id);
        }
        if matches!(op, Op::Input) {
            self.inputs.push(id);
        }
        self.by_name.insert(name.clone(), id);
        self.nodes.push(Node { name, op, operands, ty });
        Ok(id)
    }

    /// Whether a value defined so far gives `?` its run-time size: a
    /// dynamic input or a dynamic `real_dynamic_slice`.
    fn has_dynamic_size(&self) -> bool {
        let binds = |n: &Node| matches!(n.op, Op::Input | Op::RealDynamicSlice) && n.ty.is_dynamic();
        self.inputs.iter().any(|v| binds(&self.nodes[v.0])) || self.nodes.iter().any(binds)
    }

    /// This graph without the nodes its outputs do not read (its inputs
    /// stay): a function traced from a whole model that returns a part of
    /// it, such as the output head alone.
    pub fn pruned(&self) -> Graph {
        let mut live = vec![false; self.nodes.len()];
        for v in self.inputs.iter().chain(&self.outputs) {
            live[v.0] = true;
        }
        for (i, node) in self.nodes.iter().enumerate().rev() {
            if live[i] {
                node.operands.iter().for_each(|v| live[v.0] = true);
            }
        }
        let mut pruned = Graph::new(self.name.clone());
        let mut ids = vec![None; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate().filter(|(i, _)| live[*i]) {
            let id = ValueId(pruned.nodes.len());
            match &node.op {
                Op::Param { name } => _ = pruned.params.insert(name.clone(), id),
                Op::Input => pruned.inputs.push(id),
                _ => {}
            }
            pruned.by_name.insert(node.name.clone(), id);
            let operands = node.operands.iter().map(|v| ids[v.0].expect("operands are defined first")).collect();
            pruned.nodes.push(Node { operands, ..node.clone() });
            ids[i] = Some(id);
        }
        pruned.outputs = self.outputs.iter().map(|v| ids[v.0].expect("outputs are live")).collect();
        pruned
    }

    /// Sets the returned values; there must be at least one.
    pub fn set_outputs(&mut self, outputs: Vec<ValueId>) -> Result<(), GraphError> {
        if outputs.is_empty() {
            return Err(GraphError::NoOutputs);
        }
        self.outputs = outputs;
        Ok(())
    }
}
