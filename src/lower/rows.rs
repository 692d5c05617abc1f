//! An entry point over any number of rows (an encoder's sentences) for a
//! graph traced at fixed numbers of them. kiln's graphs have one run-time
//! size per function, which the sentence length takes, so the batch is a
//! loop here, over the graphs largest first (8 rows, then 1):
//!
//! ```text
//! func @embed(%ids: tensor<?x?xi32>, %mask: tensor<?x?xi32>) -> tensor<?xDxf32>
//!   n = rows(ids); out = zeros(n, D); i = 0
//!   for i in i..(n - n % 8) step 8: out = concat(out, @embed_8(ids[i..i+8], mask[i..i+8]))
//!   for i in i..n:                  out = concat(out, @embed_1(ids[i..i+1], mask[i..i+1]))
//!   return out[n..2n]
//! ```
//!
//! Whole chunks keep the products' row counts up; what is left goes one row
//! at a time, so one sentence costs one sentence, not a padded chunk. The
//! output grows by concatenation after `n` rows of zeros, which the end
//! slices off: iree-compile 3.13 does not convert a `dynamic_update_slice`
//! into a `?`-sized operand, and folds an empty start to a static
//! `tensor<0xD>` that its `scf.while` then refuses against the loop's
//! `tensor<?xD>`. The rows are few (one vector per sentence). Each
//! loop is a `stablehlo.while` carrying everything its body reads, as
//! `generate`'s does; the row graphs are private and inlined.

use super::dialects::stablehlo;
use super::generate::scalar_i32;
use super::{tensor_type, Emitter, Function, LowerError, Scope, Session};
use crate::graph::{ComparisonDirection, DType, Graph, TensorType, DYNAMIC};
use melior::dialect::func;
use melior::ir::attribute::{IntegerAttribute, StringAttribute, TypeAttribute};
use melior::ir::r#type::{FunctionType, IntegerType};
use melior::ir::{Block, BlockLike, Location, Region, RegionLike, Type, Value};

/// The graphs a row loop calls: one function of rows traced at several
/// row counts, largest first, the last at one row. Every input and the one
/// output lead with the row dim.
pub struct RowLoop<'g> {
    /// The public function's name.
    pub name: &'g str,
    /// The row graphs, by rows descending; the last takes one row.
    pub graphs: Vec<&'g Graph>,
}

impl RowLoop<'_> {
    /// The public function's input types and its output type: the row
    /// graphs' with the row dim `?`. Fails unless the graphs take the same
    /// inputs and return one value, all leading with their row count, which
    /// falls to 1, the output's other dims static (a row's size).
    fn signature(&self) -> Result<(Vec<TensorType>, TensorType), LowerError> {
        let types = |graph: &Graph| -> Vec<TensorType> {
            graph.inputs().iter().chain(graph.outputs()).map(|&v| graph.node(v).ty.clone()).collect()
        };
        let any_rows = |ty: &TensorType| {
            let mut shape = ty.shape.clone();
            shape[0] = DYNAMIC;
            TensorType::new(shape, ty.dtype)
        };
        let rows: Vec<usize> = self.graphs.iter().map(|g| rows(g)).collect();
        let first = self.graphs.first().map(|g| types(g)).unwrap_or_default();
        let fits = |graph: &Graph, rows: usize| {
            let tys = types(graph);
            graph.outputs().len() == 1
                && !graph.inputs().is_empty()
                && tys.len() == first.len()
                && tys.iter().zip(&first).all(|(a, b)| a.rank() > 0 && a.shape[0] == rows && any_rows(a) == any_rows(b))
        };
        let descending = rows.windows(2).all(|w| w[0] > w[1]) && rows.last() == Some(&1);
        let static_row = first.last().is_some_and(|out| out.rank() > 0 && !out.shape[1..].contains(&DYNAMIC));
        if !descending || !static_row || !self.graphs.iter().zip(&rows).all(|(g, &r)| fits(g, r)) {
            let names: Vec<&str> = self.graphs.iter().map(|g| g.name.as_str()).collect();
            return Err(LowerError::Node {
                node: self.name.to_string(),
                op: "row loop",
                message: format!(
                    "row graphs {names:?} must take the same inputs and return one value of static rows, each leading with its rows, which fall to 1 (got {rows:?})"
                ),
                diagnostics: vec![],
            });
        }
        let mut all: Vec<TensorType> = first.iter().map(any_rows).collect();
        let output = all.pop().expect("one output, checked above");
        Ok((all, output))
    }
}

/// The rows a row graph takes: its first input's first dim.
fn rows(graph: &Graph) -> usize {
    graph.inputs().first().and_then(|&v| graph.node(v).ty.shape.first().copied()).unwrap_or(0)
}

/// Appends `func @{spec.name}`, the loop over the module's row graphs.
pub(super) fn lower_row_loop(session: &Session, scope: &Scope<'_, '_>, spec: &RowLoop<'_>) -> Result<(), LowerError> {
    let ctx = session.context();
    let (input_tys, output_ty) = spec.signature()?;
    let loc = Location::name(ctx, spec.name, Location::unknown(ctx));
    let t = |ty: &TensorType| tensor_type(ctx, ty);
    let i32_scalar = TensorType::new([], DType::I32);

    let block = Block::new(&input_tys.iter().map(|ty| (t(ty), loc)).collect::<Vec<_>>());
    {
        let inputs: Vec<Value> =
            (0..input_tys.len()).map(|i| block.argument(i).expect("one argument per input").into()).collect();
        let function = Function::without_inputs();
        let e = Emitter { session, scope, block: &block, function: &function, node: spec.name, op: "row loop" };
        let int = |v: usize| e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, v as i64), loc));

        let n = dim_size(&e, inputs[0], 0)?;
        let mut extent = vec![n];
        for &d in &output_ty.shape[1..] {
            extent.push(int(d)?);
        }
        let extent = vector(&e, &extent)?;
        let scalar = TensorType::new([], output_ty.dtype);
        let zero = super::constant::splat_attribute(&e, 0.0, &scalar)?;
        let zero = e.emit(stablehlo::constant(ctx, t(&scalar), zero, loc))?;
        let no_dims = e.i64_array(&[]);
        let mut out = e.emit(stablehlo::dynamic_broadcast_in_dim(
            ctx,
            t(&output_ty),
            zero,
            extent,
            no_dims,
            no_dims,
            no_dims,
            loc,
        ))?;
        let mut from = int(0)?;
        for graph in &spec.graphs {
            // Up to the last whole run of this graph's rows: from + (n - from) / r * r.
            let r = int(rows(graph))?;
            let left = e.emit(stablehlo::subtract(ctx, t(&i32_scalar), n, from, loc))?;
            let runs = e.emit(stablehlo::divide(ctx, t(&i32_scalar), left, r, loc))?;
            let covered = e.emit(stablehlo::multiply(ctx, t(&i32_scalar), runs, r, loc))?;
            let to = e.emit(stablehlo::add(ctx, t(&i32_scalar), from, covered, loc))?;
            out = row_loop(&e, graph, [from, to], out, &inputs, &input_tys, &output_ty)?;
            from = to;
        }
        let rank = output_ty.rank();
        let twice = e.emit(stablehlo::add(ctx, t(&i32_scalar), n, n, loc))?;
        let mut limit = vec![twice];
        for &d in &output_ty.shape[1..] {
            limit.push(int(d)?);
        }
        let start = vector(&e, &[vec![n], vec![int(0)?; rank - 1]].concat())?;
        let (limit, strides) = (vector(&e, &limit)?, vector(&e, &vec![int(1)?; rank])?);
        let out = e.emit(stablehlo::real_dynamic_slice(ctx, t(&output_ty), out, start, limit, strides, loc))?;
        block.append_operation(func::r#return(&[out], loc));
    }
    let region = Region::new();
    region.append_block(block);
    let arg_types: Vec<Type> = input_tys.iter().map(t).collect();
    let function_type = FunctionType::new(ctx, &arg_types, &[t(&output_ty)]);
    scope.module.body().append_operation(func::func(
        ctx,
        StringAttribute::new(ctx, spec.name),
        TypeAttribute::new(function_type.into()),
        region,
        &[],
        loc,
    ));
    Ok(())
}

/// `for i in from..to step ROWS: out = concat(out, @graph(inputs[i..i+ROWS]))`,
/// `ROWS` the graph's rows; returns the final `out`.
fn row_loop<'c, 'a>(
    e: &Emitter<'c, 'a>,
    graph: &Graph,
    [from, to]: [Value<'c, 'a>; 2],
    out: Value<'c, 'a>,
    inputs: &[Value<'c, 'a>],
    input_tys: &[TensorType],
    output_ty: &TensorType,
) -> Result<Value<'c, 'a>, LowerError> {
    let ctx = e.ctx();
    let loc = e.loc();
    let t = |ty: &TensorType| tensor_type(ctx, ty);
    let i32_scalar = TensorType::new([], DType::I32);
    let rows = rows(graph);

    // Loop-carried: i, to, out, inputs...
    let mut carried = vec![from, to, out];
    carried.extend(inputs);
    let mut carried_tys = vec![i32_scalar.clone(), i32_scalar.clone(), output_ty.clone()];
    carried_tys.extend(input_tys.iter().cloned());
    let block_args: Vec<(Type, Location)> = carried_tys.iter().map(|ty| (t(ty), loc)).collect();

    // The loop's blocks are not the caller's: their own `Function`, whose
    // values live in them.
    let function = Function::without_inputs();
    let (cond_region, body_region) = (Region::new(), Region::new());
    let cond = cond_region.append_block(Block::new(&block_args));
    {
        let e =
            Emitter { session: e.session, scope: e.scope, block: &cond, function: &function, node: e.node, op: e.op };
        let arg = |i: usize| -> Value { cond.argument(i).expect("one argument per carried value").into() };
        let direction =
            e.parse_attribute(&format!("#stablehlo<comparison_direction {}>", ComparisonDirection::Lt.as_str()))?;
        let pred_ty = t(&TensorType::new([], DType::I1));
        let more = e.emit(stablehlo::compare(ctx, pred_ty, arg(0), arg(1), direction, loc))?;
        cond.append_operation(stablehlo::r#return(ctx, &[more], loc).into());
    }

    let body = body_region.append_block(Block::new(&block_args));
    {
        let e =
            Emitter { session: e.session, scope: e.scope, block: &body, function: &function, node: e.node, op: e.op };
        let arg = |i: usize| -> Value { body.argument(i).expect("one argument per carried value").into() };
        let int = |v: usize| e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, v as i64), loc));
        let i = arg(0);
        let (zero, one, step) = (int(0)?, int(1)?, int(rows)?);
        let next = e.emit(stablehlo::add(ctx, t(&i32_scalar), i, step, loc))?;
        let mut sliced = Vec::with_capacity(inputs.len());
        for (k, &input) in graph.inputs().iter().enumerate() {
            let operand = arg(3 + k);
            let rank = input_tys[k].rank();
            let mut limit = vec![next];
            for d in 1..rank {
                limit.push(dim_size(&e, operand, d)?);
            }
            let start = vector(&e, &[vec![i], vec![zero; rank - 1]].concat())?;
            let limit = vector(&e, &limit)?;
            let strides = vector(&e, &vec![one; rank])?;
            let ty = t(&graph.node(input).ty);
            sliced.push(e.emit(stablehlo::real_dynamic_slice(ctx, ty, operand, start, limit, strides, loc))?);
        }
        let result_ty = t(&graph.node(graph.outputs()[0]).ty);
        let result = e.call(&graph.name, &sliced, &[result_ty])[0];
        let dim = IntegerAttribute::new(IntegerType::new(ctx, 64).into(), 0);
        let out = e.emit(stablehlo::concatenate(ctx, t(output_ty), &[arg(2), result], dim.into(), loc))?;
        let mut yielded = vec![next, arg(1), out];
        yielded.extend((0..inputs.len()).map(|k| arg(3 + k)));
        body.append_operation(stablehlo::r#return(ctx, &yielded, loc).into());
    }

    let result_types: Vec<Type> = carried_tys.iter().map(t).collect();
    let op = e
        .block
        .append_operation(stablehlo::r#while(ctx, &result_types, &carried, cond_region, body_region, loc).into());
    Ok(op.result(2).map_err(|err| e.error(format!("while has no result 2: {err}")))?.into())
}

/// Dim `dim` of `value` as `tensor<i32>`.
fn dim_size<'c, 'a>(e: &Emitter<'c, 'a>, value: Value<'c, 'a>, dim: usize) -> Result<Value<'c, 'a>, LowerError> {
    let ctx = e.ctx();
    let dim = IntegerAttribute::new(IntegerType::new(ctx, 64).into(), dim as i64);
    e.emit(stablehlo::get_dimension_size(
        ctx,
        tensor_type(ctx, &TensorType::new([], DType::I32)),
        value,
        dim.into(),
        e.loc(),
    ))
}

/// Scalars `tensor<i32>` as one `tensor<Nxi32>`.
fn vector<'c, 'a>(e: &Emitter<'c, 'a>, scalars: &[Value<'c, 'a>]) -> Result<Value<'c, 'a>, LowerError> {
    let ctx = e.ctx();
    let one = tensor_type(ctx, &TensorType::new([1], DType::I32));
    let pieces =
        scalars.iter().map(|&s| e.emit(stablehlo::reshape(ctx, one, s, e.loc()))).collect::<Result<Vec<_>, _>>()?;
    let ty = tensor_type(ctx, &TensorType::new([scalars.len()], DType::I32));
    let dim = IntegerAttribute::new(IntegerType::new(ctx, 64).into(), 0);
    e.emit(stablehlo::concatenate(ctx, ty, &pieces, dim.into(), e.loc()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::{LowerOptions, ParamInits};
    use crate::trace::Tracer;

    /// `f_ROWS(x: tensor<ROWSx?xf32>) -> tensor<ROWSxOUTxf32>`: each row's sum,
    /// broadcast to `out` (`?` for a row of the run-time size).
    fn row_graph(rows: usize, out: usize) -> Graph {
        let t = Tracer::new(&format!("f_{rows}"));
        let x = t.input("x", TensorType::new([rows, DYNAMIC], DType::F32)).unwrap();
        let sum = x.reduce(crate::graph::ReduceKind::Sum, &[1]).unwrap();
        let y = sum.broadcast_in_dim(&[rows, out], &[0]).unwrap();
        t.finish(&[&y]).unwrap()
    }

    #[test]
    fn row_graphs_make_one_entry_point_over_any_rows() {
        let (four, one) = (row_graph(4, 3), row_graph(1, 3));
        let session = Session::new();
        let spec = RowLoop { name: "f", graphs: vec![&four, &one] };
        let module = session.lower_rows(&spec, &LowerOptions::default(), &ParamInits::default()).unwrap();
        let text = crate::lower::print(&module).unwrap();
        assert!(text.contains("func.func @f(%arg0: tensor<?x?xf32>) -> tensor<?x3xf32>"), "{text}");
        assert!(text.contains("func.func private @f_4(") && text.contains("func.func private @f_1("), "{text}");
        assert_eq!(text.matches("\"stablehlo.while\"").count(), 2, "{text}");
    }

    #[test]
    fn row_graphs_that_do_not_fall_to_one_row_or_return_a_dynamic_row_are_refused() {
        let session = Session::new();
        let (four, two, one) = (row_graph(4, 3), row_graph(2, 3), row_graph(1, 3));
        let (dynamic_two, dynamic_one) = (row_graph(2, DYNAMIC), row_graph(1, DYNAMIC));
        for graphs in
            [vec![&four, &two], vec![&one, &four], vec![&four, &dynamic_one], vec![&dynamic_two, &dynamic_one], vec![]]
        {
            let spec = RowLoop { name: "f", graphs };
            let err = session.lower_rows(&spec, &LowerOptions::default(), &ParamInits::default()).unwrap_err();
            assert!(err.to_string().contains("fall to 1"), "{err}");
        }
    }
}
