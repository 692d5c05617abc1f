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
use super::{tensor_type, Emitter, Function, FunctionKind, LowerError, Scope, Session};
use crate::graph::{ComparisonDirection, DType, Graph, TensorType};
use melior::dialect::func;
use melior::ir::attribute::IntegerAttribute;
use melior::ir::r#type::{FunctionType, IntegerType};
use melior::ir::{Block, BlockLike, Location, Region, RegionLike, Type, Value, ValueLike};

/// The functions a greedy loop calls, and how many positions the cache has.
pub struct GreedyLoop<'g> {
    /// `prefill(tokens: tensor<1x?xi32>) -> (logits: tensor<1x1xVxf32>,
    /// caches...)`, the prompt's graph; `None` where every prompt is
    /// prefilled by decode steps (`stepped_prefill` at least `max_context`).
    pub prefill: Option<&'g Graph>,
    /// `fill(tokens: tensor<1x1xi32>, position: tensor<i32>, caches...) ->
    /// (hidden: tensor<1x1xHxf32>, caches...)`: a decode step without its
    /// head, what the stepped `prefill` runs for each token of the prompt.
    pub fill: &'g Graph,
    /// `fill` over a chunk of `C` tokens (`tokens: tensor<1xCxi32>`), what
    /// the stepped `prefill` runs while `C` or more of the prompt's tokens
    /// are left: each packed block is read once for `C` rows (Gemma 3n
    /// E2B's 5-token `prefill`: 470 ms in 5 steps, 354 ms in a chunk of 4
    /// and a step); `None`: one token a step.
    pub fill_chunk: Option<&'g Graph>,
    /// `(hidden: tensor<1x1xHxf32>) -> logits: tensor<1x1xVxf32>`: the
    /// head, run once after the prompt's `fill` steps (Gemma 3n E2B's is
    /// 40 of a 126 ms step: Q6_K, 262144 x 2048). The public `decode` is
    /// `head` after `fill` (`lower_decode`).
    pub head: &'g Graph,
    /// `(logits: tensor<1x1xVxf32>, index: tensor<i32>) -> tensor<1x1xi32>`
    pub pick: &'g Graph,
    /// The caches' positions; also the length of `generate`'s output.
    pub max_context: usize,
    /// Prompts of at most this many tokens are prefilled by decode steps,
    /// one token at a time from an empty cache (`lower_prefill`), instead
    /// of the prompt's graph, which dequantizes every packed weight to f32
    /// at each call (a full pass over the weights, written and read back)
    /// that a few tokens do not repay. 0: every prompt runs the prompt's
    /// graph. README "Short prompts as decode steps" has the figures.
    pub stepped_prefill: usize,
}

/// The prompt `prefill` takes: one row of token ids.
fn prompt_type() -> TensorType {
    TensorType::new([1, crate::graph::DYNAMIC], DType::I32)
}

/// The default [`GreedyLoop::stepped_prefill`]: about where the steps and
/// the prompt's graph take the same time (SmolLM2-135M 25 tokens, the
/// Llama-3.2-1B shape 40).
pub const STEPPED_PREFILL: usize = 32;

impl<'g> GreedyLoop<'g> {
    /// Every graph the module holds, the model's first.
    pub fn graphs(&self) -> Vec<&'g Graph> {
        self.prefill.into_iter().chain([self.fill]).chain(self.fill_chunk).chain([self.head, self.pick]).collect()
    }

    /// Whether `prefill` runs prompts as steps (`lower_prefill`).
    pub(super) fn steps_prompts(&self) -> bool {
        self.stepped_prefill > 0 || self.prefill.is_none()
    }

    /// What `prefill` and `decode` return: the logits `[1, 1, V]` and the
    /// caches.
    fn state_types(&self) -> Vec<TensorType> {
        output_types(self.head).into_iter().chain(output_types(self.fill).into_iter().skip(1)).collect()
    }

    /// `decode`'s caches, `[input, output]`: cache `i` is input `2 + i` and
    /// output `1 + i`.
    fn decode_in_place(&self) -> Vec<[usize; 2]> {
        (2..self.fill.inputs().len()).map(|input| [input, input - 1]).collect()
    }
}

/// Appends `func @generate` to `module`, which holds the loop's functions.
pub(super) fn lower_generate(
    session: &Session,
    scope: &Scope<'_, '_>,
    spec: &GreedyLoop<'_>,
) -> Result<(), LowerError> {
    if spec.prefill.is_none() {
        return lower_generate_stepped(session, scope, spec);
    }
    let ctx = session.context();
    let loc = Location::name(ctx, "generate", Location::unknown(ctx));
    let i32_scalar = TensorType::new([], DType::I32);
    let token_ty = TensorType::new([1, 1], DType::I32);
    let out_ty = TensorType::new([1, spec.max_context], DType::I32);
    let prompt_ty = prompt_type();
    let state_tys = spec.state_types();
    let cache_tys = &state_tys[1..];
    let t = |ty: &TensorType| tensor_type(ctx, ty);

    let block = Block::new(&[(t(&prompt_ty), loc), (t(&i32_scalar), loc)]);
    {
        let prompt: Value = block.argument(0).expect("generate has two arguments").into();
        let n_new: Value = block.argument(1).expect("generate has two arguments").into();
        let function = Function::without_inputs();
        let e = Emitter { session, scope, block: &block, function: &function, node: "generate", op: "generate" };
        let int = |v: i64| e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, v), loc));
        let (zero, one) = (int(0)?, int(1)?);

        // The prompt's graph where there is one, not the stepped `prefill`:
        // its loop would be one more inlined copy of decode, compiled again
        // (SmolLM2 with `--stepped-prefill 32`: 63 -> 194 s with it).
        let prefill = match spec.prefill {
            Some(graph) if spec.stepped_prefill > 0 => call_as(&e, PREFILL_PROMPT, graph, &[prompt]),
            Some(graph) => call(&e, graph, &[prompt]),
            None => e.call("prefill", &[prompt], &state_tys.iter().map(t).collect::<Vec<_>>()),
        };
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
            let more = compare(&e, arg(0), arg(n_at), ComparisonDirection::Lt)?;
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
            let decoded = e.call("decode", &inputs, &state_tys.iter().map(t).collect::<Vec<_>>());
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
    let function_type = FunctionType::new(ctx, &[t(&prompt_ty), t(&i32_scalar)], &[t(&out_ty)]);
    session.append_function(scope, "generate", function_type, block, FunctionKind::Public, &[]);
    Ok(())
}

/// `generate` without a prompt graph: one loop of decode steps that reads
/// the prompt's tokens, then its own picks (the same tokens as [`lower_generate`]):
///
/// ```text
/// n = clamp(0, n_new, MAX - len(prompt) + 1)
/// caches = empty; token = prompt[0]; out = [-1, ...]
/// while i < len(prompt) - 1 + max(n, 1):              // i from 0
///   hidden, caches = call @fill(token, i, caches)
///   new = i >= len(prompt) - 1
///   picked = new ? call @pick(call @head(hidden), 0) : 0
///   out[i - len(prompt) + 1] = picked   where new
///   token = i + 1 < len(prompt) ? prompt[i + 1] : picked
/// ```
///
/// One inlined copy of decode's step (`fill`, its head apart: the prompt's
/// tokens but the last need no logits), where calling the stepped `prefill`
/// would nest its loop in this one (which IREE 3.13 miscompiled: wrong
/// tokens from a tiny llama).
fn lower_generate_stepped(session: &Session, scope: &Scope<'_, '_>, spec: &GreedyLoop<'_>) -> Result<(), LowerError> {
    let ctx = session.context();
    let loc = Location::name(ctx, "generate", Location::unknown(ctx));
    let i32_scalar = TensorType::new([], DType::I32);
    let token_ty = TensorType::new([1, 1], DType::I32);
    let out_ty = TensorType::new([1, spec.max_context], DType::I32);
    let prompt_ty = prompt_type();
    let state_tys = spec.state_types();
    let caches = state_tys.len() - 1;
    let t = |ty: &TensorType| tensor_type(ctx, ty);

    let block = Block::new(&[(t(&prompt_ty), loc), (t(&i32_scalar), loc)]);
    {
        let prompt: Value = block.argument(0).expect("generate has two arguments").into();
        let n_new: Value = block.argument(1).expect("generate has two arguments").into();
        let function = Function::without_inputs();
        let e = Emitter { session, scope, block: &block, function: &function, node: "generate", op: "generate" };
        let int = |v: i64| e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, v), loc));
        let (zero, one) = (int(0)?, int(1)?);
        let dim = IntegerAttribute::new(IntegerType::new(ctx, 64).into(), 1);
        let len = e.emit(stablehlo::get_dimension_size(ctx, t(&i32_scalar), prompt, dim.into(), loc))?;
        let last = e.emit(stablehlo::subtract(ctx, t(&i32_scalar), len, one, loc))?;
        let room = e.emit(stablehlo::subtract(ctx, t(&i32_scalar), int(spec.max_context as i64)?, last, loc))?;
        let n = e.emit(stablehlo::clamp(ctx, t(&i32_scalar), zero, n_new, room, loc))?;
        let at_least_one = e.emit(stablehlo::maximum(ctx, t(&i32_scalar), n, one, loc))?;
        let steps = e.emit(stablehlo::add(ctx, t(&i32_scalar), last, at_least_one, loc))?;
        let out = e.emit(stablehlo::constant(ctx, t(&out_ty), splat_i32(&e, &out_ty, -1)?, loc))?;
        let first =
            e.emit(stablehlo::dynamic_slice(ctx, t(&token_ty), prompt, &[zero, zero], e.i64_array(&[1, 1]), loc))?;

        // Loop-carried: i, token, caches..., out, steps, len.
        let mut carried = vec![zero, first];
        carried.extend(empty_state(&e, &state_tys)?.into_iter().skip(1));
        carried.extend([out, steps, len]);
        let mut carried_tys = vec![i32_scalar.clone(), token_ty.clone()];
        carried_tys.extend(state_tys[1..].iter().cloned());
        carried_tys.extend([out_ty.clone(), i32_scalar.clone(), i32_scalar.clone()]);
        let (out_at, steps_at, len_at) = (2 + caches, 3 + caches, 4 + caches);
        let block_args: Vec<(Type, Location)> = carried_tys.iter().map(|ty| (t(ty), loc)).collect();

        let (cond_region, body_region) = (Region::new(), Region::new());
        let cond = cond_region.append_block(Block::new(&block_args));
        {
            let e = Emitter { block: &cond, function: &function, ..e };
            let arg = |i: usize| -> Value { cond.argument(i).expect("one argument per carried value").into() };
            let more = compare(&e, arg(0), arg(steps_at), ComparisonDirection::Lt)?;
            cond.append_operation(stablehlo::r#return(ctx, &[more], loc).into());
        }
        let body = body_region.append_block(Block::new(&block_args));
        // The branches of the pick (their blocks must outlive the emitters
        // that fill them).
        let (pick_region, none_region) = (Region::new(), Region::new());
        let pick = pick_region.append_block(Block::new(&[]));
        let none = none_region.append_block(Block::new(&[]));
        {
            let e = Emitter { block: &body, function: &function, ..e };
            let arg = |i: usize| -> Value { body.argument(i).expect("one argument per carried value").into() };
            let int = |v: i64| e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, v), loc));
            let (i, len) = (arg(0), arg(len_at));
            let (zero, one) = (int(0)?, int(1)?);
            let mut inputs = vec![arg(1), i];
            inputs.extend((0..caches).map(|c| arg(2 + c)));
            let filled = call(&e, spec.fill, &inputs);
            // The new tokens start at the prompt's last position.
            let first_new = e.emit(stablehlo::subtract(ctx, t(&i32_scalar), len, one, loc))?;
            let new = compare(&e, i, first_new, ComparisonDirection::Ge)?;
            {
                let e = Emitter { block: &pick, function: &function, ..e };
                let zero = e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, 0), loc))?;
                let logits = call(&e, spec.head, &[filled[0]])[0];
                let picked = call(&e, spec.pick, &[logits, zero]);
                pick.append_operation(stablehlo::r#return(ctx, &picked, loc).into());
            }
            {
                let e = Emitter { block: &none, function: &function, ..e };
                let token = e.emit(stablehlo::constant(ctx, t(&token_ty), splat_i32(&e, &token_ty, 0)?, loc))?;
                none.append_operation(stablehlo::r#return(ctx, &[token], loc).into());
            }
            let picked =
                body.append_operation(stablehlo::r#if(ctx, &[t(&token_ty)], new, pick_region, none_region, loc).into());
            let picked: Value = picked.result(0).expect("one result").into();
            let next = e.emit(stablehlo::add(ctx, t(&i32_scalar), i, one, loc))?;
            let at = e.emit(stablehlo::subtract(ctx, t(&i32_scalar), i, first_new, loc))?;
            let written =
                e.emit(stablehlo::dynamic_update_slice(ctx, t(&out_ty), arg(out_at), picked, &[zero, at], loc))?;
            let out = e.emit(stablehlo::select(ctx, t(&out_ty), new, written, arg(out_at), loc))?;
            let from_prompt =
                e.emit(stablehlo::dynamic_slice(ctx, t(&token_ty), prompt, &[zero, next], e.i64_array(&[1, 1]), loc))?;
            let in_prompt = compare(&e, next, len, ComparisonDirection::Lt)?;
            let token = e.emit(stablehlo::select(ctx, t(&token_ty), in_prompt, from_prompt, picked, loc))?;
            let mut yielded = vec![next, token];
            yielded.extend(&filled[1..]);
            yielded.extend([out, arg(steps_at), len]);
            body.append_operation(stablehlo::r#return(ctx, &yielded, loc).into());
        }
        let result_types: Vec<Type> = carried_tys.iter().map(t).collect();
        let op = block
            .append_operation(stablehlo::r#while(ctx, &result_types, &carried, cond_region, body_region, loc).into());
        let out: Value =
            op.result(out_at).map_err(|err| e.error(format!("while has no result {out_at}: {err}")))?.into();
        block.append_operation(func::r#return(&[out], loc));
    }
    let function_type = FunctionType::new(ctx, &[t(&prompt_ty), t(&i32_scalar)], &[t(&out_ty)]);
    session.append_function(scope, "generate", function_type, block, FunctionKind::Public, &[]);
    Ok(())
}

/// Appends the public `func @decode`, `head` after `fill` (untiled,
/// `FunctionKind::Untiled`), its caches in place (`iree.abi.output`):
///
/// ```text
/// func @decode(%token: tensor<1x1xi32>, %position: tensor<i32>, %caches...) -> (logits, caches...)
///   hidden, caches = call @fill(token, position, caches)
///   return call @head(hidden), caches
/// ```
pub(super) fn lower_decode(session: &Session, scope: &Scope<'_, '_>, spec: &GreedyLoop<'_>) -> Result<(), LowerError> {
    let ctx = session.context();
    let loc = Location::name(ctx, "decode", Location::unknown(ctx));
    let t = |ty: &TensorType| tensor_type(ctx, ty);
    let inputs: Vec<Type> = spec.fill.inputs().iter().map(|&v| t(&spec.fill.node(v).ty)).collect();
    let state_types: Vec<Type> = spec.state_types().iter().map(t).collect();
    let block = Block::new(&inputs.iter().map(|&ty| (ty, loc)).collect::<Vec<_>>());
    {
        let function = Function::without_inputs();
        let e = Emitter { session, scope, block: &block, function: &function, node: "decode", op: "decode" };
        let args: Vec<Value> = (0..inputs.len()).map(|i| block.argument(i).expect("one per input").into()).collect();
        let mut state = call(&e, spec.fill, &args);
        state[0] = call(&e, spec.head, &[state[0]])[0];
        block.append_operation(func::r#return(&state, loc));
    }
    let function_type = FunctionType::new(ctx, &inputs, &state_types);
    session.append_function(scope, "decode", function_type, block, FunctionKind::Public, &spec.decode_in_place());
    Ok(())
}

/// The private function of the prompt's graph (`GreedyLoop::prefill`).
pub(super) const PREFILL_PROMPT: &str = "prefill_prompt";

/// Appends the public `func @prefill`, of the prompt graph's signature:
///
/// ```text
/// func @prefill(%prompt: tensor<1x?xi32>) -> (logits, caches...)
///   stepped = len(prompt) <= stepped_prefill
///   logits, caches = stepped ? zeros : call @prefill_prompt(prompt)
///   steps = stepped ? len(prompt) : 0
///   i = 0
///   while i + C <= steps:                  // the prompt read from above
///     hidden, caches = call @fill_chunk(prompt[:, i:i+C], i, caches)
///     hidden = i < 0 ? previous hidden : hidden      // `fill_loop`
///     i += C
///   while i + 1 <= steps:
///     hidden, caches = call @fill(prompt[:, i:i+1], i, caches)   // the same
///   logits = stepped ? call @head(hidden) : logits
/// ```
///
/// Both give the last position's logits and caches holding the prompt; the
/// steps read keys and values back from the cache (rounded to its dtype),
/// as `decode` does, where the prompt's graph attends to its own f32 ones.
/// The head runs once, after the steps, not at each as `decode`'s would.
/// Without a `fill_chunk`, the first loop is left out. `fill` and
/// `fill_chunk` are marked untiled (`FunctionKind::Untiled`); the prompt
/// graph's products with the weights carry the data-tiling hint themselves
/// and stay tiled (`dot_general::lower_weight_product`). A data-tiled
/// decode step fails to compile (its attention products over the filled
/// positions, `?`, need unbounded stack).
pub(super) fn lower_prefill(session: &Session, scope: &Scope<'_, '_>, spec: &GreedyLoop<'_>) -> Result<(), LowerError> {
    let ctx = session.context();
    let loc = Location::name(ctx, "prefill", Location::unknown(ctx));
    let i32_scalar = TensorType::new([], DType::I32);
    let prompt_ty = prompt_type();
    let t = |ty: &TensorType| tensor_type(ctx, ty);
    let state_tys = spec.state_types();
    let state_types: Vec<Type> = state_tys.iter().map(t).collect();
    let fill_tys = output_types(spec.fill);

    let block = Block::new(&[(t(&prompt_ty), loc)]);
    {
        let prompt: Value = block.argument(0).expect("prefill has one argument").into();
        let function = Function::without_inputs();
        let e = Emitter { session, scope, block: &block, function: &function, node: "prefill", op: "prefill" };
        let int = |v: i64| e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, v), loc));
        let dim = IntegerAttribute::new(IntegerType::new(ctx, 64).into(), 1);
        let len = e.emit(stablehlo::get_dimension_size(ctx, t(&i32_scalar), prompt, dim.into(), loc))?;
        let zero = int(0)?;
        // The branches of the choice between steps and the prompt's graph
        // (their blocks must outlive the emitters that fill them).
        let (zeros_region, whole_region) = (Region::new(), Region::new());
        let zeros = zeros_region.append_block(Block::new(&[]));
        let whole = whole_region.append_block(Block::new(&[]));
        // And of the choice of logits after them.
        let (head_region, prompt_region) = (Region::new(), Region::new());
        let head = head_region.append_block(Block::new(&[]));
        let from_prompt = prompt_region.append_block(Block::new(&[]));
        // The prompt graph's (logits, caches) and whether the steps run.
        let (prompt_logits, caches, steps): (Option<(Value, Value)>, Vec<Value>, Value) = match spec.prefill {
            // Every prompt is stepped.
            None => (None, empty_state(&e, &fill_tys[1..])?, len),
            Some(graph) => {
                let stepped = compare(&e, len, int(spec.stepped_prefill as i64)?, ComparisonDirection::Le)?;
                let steps = e.emit(stablehlo::select(ctx, t(&i32_scalar), stepped, len, zero, loc))?;
                {
                    let e = Emitter { block: &zeros, function: &function, ..e };
                    let state = empty_state(&e, &state_tys)?;
                    zeros.append_operation(stablehlo::r#return(ctx, &state, loc).into());
                }
                {
                    let e = Emitter { block: &whole, function: &function, ..e };
                    let state = call_as(&e, PREFILL_PROMPT, graph, &[prompt]);
                    whole.append_operation(stablehlo::r#return(ctx, &state, loc).into());
                }
                let first = block.append_operation(
                    stablehlo::r#if(ctx, &state_types, stepped, zeros_region, whole_region, loc).into(),
                );
                let mut state: Vec<Value> =
                    (0..state_tys.len()).map(|i| first.result(i).expect("one result per type").into()).collect();
                let logits = state.remove(0);
                (Some((stepped, logits)), state, steps)
            }
        };

        // (position, hidden, caches...) through the chunks' loop, then the
        // single tokens'.
        let mut state = vec![zero, empty_state(&e, &fill_tys[..1])?[0]];
        state.extend(caches);
        for fill in spec.fill_chunk.into_iter().chain([spec.fill]) {
            state = fill_loop(&e, fill, prompt, &state, steps)?;
        }
        let mut state = state.split_off(1);
        let hidden = state[0];

        // The logits: the head of the last step's hidden state where the
        // steps ran, else the prompt graph's.
        state[0] = match prompt_logits {
            None => call(&e, spec.head, &[hidden])[0],
            Some((stepped, prompt_logits)) => {
                {
                    let e = Emitter { block: &head, function: &function, ..e };
                    let logits = call(&e, spec.head, &[hidden]);
                    head.append_operation(stablehlo::r#return(ctx, &logits, loc).into());
                }
                from_prompt.append_operation(stablehlo::r#return(ctx, &[prompt_logits], loc).into());
                let choice = block.append_operation(
                    stablehlo::r#if(ctx, &state_types[..1], stepped, head_region, prompt_region, loc).into(),
                );
                choice.result(0).expect("one result").into()
            }
        };
        block.append_operation(func::r#return(&state, loc));
    }
    let function_type = FunctionType::new(ctx, &[t(&prompt_ty)], &state_types);
    session.append_function(scope, "prefill", function_type, block, FunctionKind::Public, &[]);
    Ok(())
}

/// `prefill`'s loop of `fill` steps (`fill` a [`GreedyLoop`]'s `fill` or
/// `fill_chunk`, `C` tokens a step) over `prompt` from `state = (position,
/// hidden, caches...)` while `position + C <= end`; returns the state after
/// them.
///
/// iree-compile 3.13's stream conversion crashes on a loop that carries a
/// value its body never reads (the hidden state, replaced at each step), so
/// the body reads it in a select whose predicate never holds. The prompt is
/// read from above (no `?`-sized value is carried).
fn fill_loop<'c, 'a>(
    e: &Emitter<'c, 'a>,
    fill: &Graph,
    prompt: Value<'c, 'a>,
    state: &[Value<'c, 'a>],
    end: Value<'c, 'a>,
) -> Result<Vec<Value<'c, 'a>>, LowerError> {
    let (ctx, loc) = (e.ctx(), e.loc());
    let t = |ty: &TensorType| tensor_type(ctx, ty);
    let i32_scalar = TensorType::new([], DType::I32);
    let tokens_ty = fill.node(fill.inputs()[0]).ty.clone();
    let chunk = tokens_ty.shape[1] as i64;

    // Loop-carried: position, hidden, caches..., end.
    let mut carried = state.to_vec();
    carried.push(end);
    let end_at = carried.len() - 1;
    let carried_types: Vec<Type> = carried.iter().map(|v| v.r#type()).collect();
    let block_args: Vec<(Type, Location)> = carried_types.iter().map(|&ty| (ty, loc)).collect();

    let (cond_region, body_region) = (Region::new(), Region::new());
    let cond = cond_region.append_block(Block::new(&block_args));
    {
        let arg = |i: usize| -> Value { cond.argument(i).expect("one argument per carried value").into() };
        let function = Function::without_inputs();
        let e =
            Emitter { block: &cond, function: &function, session: e.session, scope: e.scope, node: e.node, op: e.op };
        let chunk = e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, chunk), loc))?;
        let after = e.emit(stablehlo::add(ctx, t(&i32_scalar), arg(0), chunk, loc))?;
        let more = compare(&e, after, arg(end_at), ComparisonDirection::Le)?;
        cond.append_operation(stablehlo::r#return(ctx, &[more], loc).into());
    }
    let body = body_region.append_block(Block::new(&block_args));
    {
        let arg = |i: usize| -> Value { body.argument(i).expect("one argument per carried value").into() };
        let function = Function::without_inputs();
        let e =
            Emitter { block: &body, function: &function, session: e.session, scope: e.scope, node: e.node, op: e.op };
        let i = arg(0);
        let zero = e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, 0), loc))?;
        let chunk = e.emit(stablehlo::constant(ctx, t(&i32_scalar), scalar_i32(&e, chunk), loc))?;
        let tokens = e.emit(stablehlo::dynamic_slice(
            ctx,
            t(&tokens_ty),
            prompt,
            &[zero, i],
            e.i64_array(&tokens_ty.shape),
            loc,
        ))?;
        let mut inputs = vec![tokens, i];
        inputs.extend((2..end_at).map(arg));
        let mut filled = call(&e, fill, &inputs);
        let never = compare(&e, i, zero, ComparisonDirection::Lt)?;
        filled[0] = e.emit(stablehlo::select(ctx, filled[0].r#type(), never, arg(1), filled[0], loc))?;
        let mut yielded = vec![e.emit(stablehlo::add(ctx, t(&i32_scalar), i, chunk, loc))?];
        yielded.extend(filled);
        yielded.push(arg(end_at));
        body.append_operation(stablehlo::r#return(ctx, &yielded, loc).into());
    }
    let op = e
        .block
        .append_operation(stablehlo::r#while(ctx, &carried_types, &carried, cond_region, body_region, loc).into());
    Ok((0..end_at).map(|i| op.result(i).expect("one result per carried value").into()).collect())
}

/// Empty caches (and logits) of `types` as constants in `e`'s block. The
/// values' cache (the last) starts as -0.0, the keys' as 0.0: two equal
/// constants become one buffer in IREE 3.13, which the loop's in-place
/// updates of both caches then share (keys overwrote values). Only written
/// positions are ever read.
fn empty_state<'c, 'a>(e: &Emitter<'c, 'a>, types: &[TensorType]) -> Result<Vec<Value<'c, 'a>>, LowerError> {
    let last = types.len() - 1;
    types
        .iter()
        .enumerate()
        .map(|(i, ty)| {
            let zero = if i == last { -0.0 } else { 0.0 };
            let value = super::constant::splat_attribute(e, zero, ty)?;
            e.emit(stablehlo::constant(e.ctx(), tensor_type(e.ctx(), ty), value, e.loc()))
        })
        .collect()
}

/// `call @graph(inputs)`, returning its results.
fn call<'c, 'a>(e: &Emitter<'c, 'a>, graph: &Graph, inputs: &[Value<'c, 'a>]) -> Vec<Value<'c, 'a>> {
    call_as(e, &graph.name, graph, inputs)
}

/// `call @symbol(inputs)` of a function lowered from `graph` under `symbol`.
fn call_as<'c, 'a>(e: &Emitter<'c, 'a>, symbol: &str, graph: &Graph, inputs: &[Value<'c, 'a>]) -> Vec<Value<'c, 'a>> {
    let results: Vec<Type> = output_types(graph).iter().map(|ty| tensor_type(e.ctx(), ty)).collect();
    e.call(symbol, inputs, &results)
}

/// The types `graph` returns.
fn output_types(graph: &Graph) -> Vec<TensorType> {
    graph.outputs().iter().map(|&v| graph.node(v).ty.clone()).collect()
}

/// `lhs direction rhs`, a `tensor<i1>`.
pub(super) fn compare<'c, 'a>(
    e: &Emitter<'c, 'a>,
    lhs: Value<'c, 'a>,
    rhs: Value<'c, 'a>,
    direction: ComparisonDirection,
) -> Result<Value<'c, 'a>, LowerError> {
    let attr = e.parse_attribute(&format!("#stablehlo<comparison_direction {}>", direction.as_str()))?;
    let pred = tensor_type(e.ctx(), &TensorType::new([], DType::I1));
    e.emit(stablehlo::compare(e.ctx(), pred, lhs, rhs, attr, e.loc()))
}

pub(super) fn scalar_i32<'c>(e: &Emitter<'c, '_>, value: i64) -> melior::ir::Attribute<'c> {
    splat_i32(e, &TensorType::new([], DType::I32), value).expect("an i32 splat always builds")
}

fn splat_i32<'c>(e: &Emitter<'c, '_>, ty: &TensorType, value: i64) -> Result<melior::ir::Attribute<'c>, LowerError> {
    super::constant::splat_attribute(e, value as f64, ty)
}
