//! The `generate` entry point: greedy decoding inside the module, so one
//! `iree-run-module` call turns a prompt into its continuation.
//!
//! ```text
//! func @generate(%prompt: tensor<1x?xi32>, %n_new: tensor<i32>) -> tensor<1xMAXxi32>
//!   logits, caches = call @prefill(prompt)                  // the last position's
//!   token = call @pick(logits, 0)                           // the first new token
//!   n = clamp(0, n_new, min(MAX, MAX - len(prompt) + 1))    // what the cache has room for
//!   out = [token, -1, -1, ...]
//!   while i < n:                                            // i from 1
//!     logits, caches = call @decode(token, len(prompt) + i - 1, caches)
//!     token = call @pick(logits, 0)
//!     out[i] = token
//! ```
//!
//! The loop is a `stablehlo.while` over `(i, token, caches..., out, n,
//! len)`: everything the body reads is loop-carried, nothing is captured.
//! The model functions are the graphs' own; the `pick` graph (argmax at
//! one position) is private and inlined by iree-compile.

use super::dialects::stablehlo;
use super::{tensor_type, Emitter, Function, LowerError, Scope, Session};
use crate::graph::{ComparisonDirection, DType, Graph, TensorType};
use melior::dialect::func;
use melior::ir::attribute::{IntegerAttribute, StringAttribute, TypeAttribute};
use melior::ir::r#type::{FunctionType, IntegerType};
use melior::ir::{Block, BlockLike, Location, Region, RegionLike, Type, Value};

/// The functions a greedy loop calls, and how many positions the cache has.
pub struct GreedyLoop<'g> {
    /// `prefill(tokens: tensor<1x?xi32>) -> (logits: tensor<1x1xVxf32>, caches...)`
    pub prefill: &'g Graph,
    /// `decode(tokens: tensor<1x1xi32>, position: tensor<i32>, caches...) ->
    /// (logits: tensor<1x1xVxf32>, caches...)`
    pub decode: &'g Graph,
    /// `(logits: tensor<1x1xVxf32>, index: tensor<i32>) -> tensor<1x1xi32>`
    pub pick: &'g Graph,
    /// The caches' positions; also the length of `generate`'s output.
    pub max_context: usize,
}

impl<'g> GreedyLoop<'g> {
    /// Every graph the module holds, the model's first.
    pub fn graphs(&self) -> [&'g Graph; 3] {
        [self.prefill, self.decode, self.pick]
    }

    /// `decode`'s caches, `[input, output]`: cache `i` is input `2 + i` and
    /// output `1 + i`.
    pub fn decode_in_place(&self) -> Vec<[usize; 2]> {
        (2..self.decode.inputs().len()).map(|input| [input, input - 1]).collect()
    }
}

/// Appends `func @generate` to `module`, which holds the loop's functions.
pub(super) fn lower_generate(
    session: &Session,
    scope: &Scope<'_, '_>,
    spec: &GreedyLoop<'_>,
) -> Result<(), LowerError> {
    let ctx = session.context();
    let loc = Location::name(ctx, "generate", Location::unknown(ctx));
    let i32_scalar = TensorType::new([], DType::I32);
    let token_ty = TensorType::new([1, 1], DType::I32);
    let out_ty = TensorType::new([1, spec.max_context], DType::I32);
    let prompt_ty = spec.prefill.node(spec.prefill.inputs()[0]).ty.clone();
    let cache_tys: Vec<TensorType> =
        spec.prefill.outputs()[1..].iter().map(|&v| spec.prefill.node(v).ty.clone()).collect();
    let t = |ty: &TensorType| tensor_type(ctx, ty);

    let block = Block::new(&[(t(&prompt_ty), loc), (t(&i32_scalar), loc)]);
    {
        let prompt: Value = block.argument(0).expect("generate has two arguments").into();
        let n_new: Value = block.argument(1).expect("generate has two arguments").into();
        let function = Function::without_inputs();
        let e = Emitter { session, scope, block: &block, function: &function, node: "generate", op: "generate" };
        let int = |v: i64| e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, v), loc));
        let (zero, one) = (int(0)?, int(1)?);

        let prefill = call(&e, spec.prefill, &[prompt]);
        let dim = IntegerAttribute::new(IntegerType::new(ctx, 64).into(), 1);
        let len = e.emit(stablehlo::get_dimension_size(ctx, t(&i32_scalar), prompt, dim.into(), loc))?;
        let last = e.emit(stablehlo::subtract(ctx, t(&i32_scalar), len, one, loc))?;
        let token = call(&e, spec.pick, &[prefill[0], zero])[0];

        let max = int(spec.max_context as i64)?;
        let room = e.emit(stablehlo::subtract(ctx, t(&i32_scalar), max, last, loc))?;
        let n = e.emit(stablehlo::clamp(ctx, t(&i32_scalar), zero, n_new, room, loc))?;
        let minus_one = e.emit(stablehlo::constant(ctx, t(&out_ty), splat_i32(&e, &out_ty, -1)?, loc))?;
        let out = e.emit(stablehlo::dynamic_update_slice(ctx, t(&out_ty), minus_one, token, &[zero, zero], loc))?;

        // Loop-carried: i, token, caches..., out, n, len.
        let mut carried = vec![one, token];
        carried.extend(&prefill[1..]);
        carried.extend([out, n, len]);
        let mut carried_tys = vec![i32_scalar.clone(), token_ty.clone()];
        carried_tys.extend(cache_tys.iter().cloned());
        carried_tys.extend([out_ty.clone(), i32_scalar.clone(), i32_scalar.clone()]);
        let caches = cache_tys.len();
        let (out_at, n_at, len_at) = (2 + caches, 3 + caches, 4 + caches);
        let block_args: Vec<(Type, Location)> = carried_tys.iter().map(|ty| (t(ty), loc)).collect();

        let (cond_region, body_region) = (Region::new(), Region::new());
        let cond = cond_region.append_block(Block::new(&block_args));
        {
            let e = Emitter { block: &cond, function: &function, ..e };
            let arg = |i: usize| -> Value { cond.argument(i).expect("one argument per carried value").into() };
            let direction =
                e.parse_attribute(&format!("#stablehlo<comparison_direction {}>", ComparisonDirection::Lt.as_str()))?;
            let pred_ty = t(&TensorType::new([], DType::I1));
            let more = e.emit(stablehlo::compare(ctx, pred_ty, arg(0), arg(n_at), direction, loc))?;
            cond.append_operation(stablehlo::r#return(ctx, &[more], loc).into());
        }

        let body = body_region.append_block(Block::new(&block_args));
        {
            let e = Emitter { block: &body, function: &function, ..e };
            let arg = |i: usize| -> Value { body.argument(i).expect("one argument per carried value").into() };
            let i = arg(0);
            let one = e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, 1), loc))?;
            let zero = e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, 0), loc))?;
            // The previous token sits at len + i - 1.
            let after = e.emit(stablehlo::add(ctx, t(&i32_scalar), arg(len_at), i, loc))?;
            let position = e.emit(stablehlo::subtract(ctx, t(&i32_scalar), after, one, loc))?;
            let mut inputs = vec![arg(1), position];
            inputs.extend((0..caches).map(|c| arg(2 + c)));
            let decoded = call(&e, spec.decode, &inputs);
            let token = call(&e, spec.pick, &[decoded[0], zero])[0];
            let out = e.emit(stablehlo::dynamic_update_slice(ctx, t(&out_ty), arg(out_at), token, &[zero, i], loc))?;
            let next = e.emit(stablehlo::add(ctx, t(&i32_scalar), i, one, loc))?;
            let mut yielded = vec![next, token];
            yielded.extend(&decoded[1..]);
            yielded.extend([out, arg(n_at), arg(len_at)]);
            body.append_operation(stablehlo::r#return(ctx, &yielded, loc).into());
        }

        let result_types: Vec<Type> = carried_tys.iter().map(t).collect();
        let op = block
            .append_operation(stablehlo::r#while(ctx, &result_types, &carried, cond_region, body_region, loc).into());
        let out: Value =
            op.result(out_at).map_err(|err| e.error(format!("while has no result {out_at}: {err}")))?.into();
        block.append_operation(func::r#return(&[out], loc));
    }
    let region = Region::new();
    region.append_block(block);
    let function_type = FunctionType::new(ctx, &[t(&prompt_ty), t(&i32_scalar)], &[t(&out_ty)]);
    scope.module.body().append_operation(func::func(
        ctx,
        StringAttribute::new(ctx, "generate"),
        TypeAttribute::new(function_type.into()),
        region,
        &[],
        loc,
    ));
    Ok(())
}

/// `call @graph(inputs)`, returning its results.
fn call<'c, 'a>(e: &Emitter<'c, 'a>, graph: &Graph, inputs: &[Value<'c, 'a>]) -> Vec<Value<'c, 'a>> {
    let results: Vec<Type> = graph.outputs().iter().map(|&v| tensor_type(e.ctx(), &graph.node(v).ty)).collect();
    e.call(&graph.name, inputs, &results)
}

pub(super) fn scalar_i32<'c>(e: &Emitter<'c, '_>, value: i64) -> melior::ir::Attribute<'c> {
    splat_i32(e, &TensorType::new([], DType::I32), value).expect("an i32 splat always builds")
}

fn splat_i32<'c>(e: &Emitter<'c, '_>, ty: &TensorType, value: i64) -> Result<melior::ir::Attribute<'c>, LowerError> {
    super::constant::splat_attribute(e, value as f64, ty)
}
