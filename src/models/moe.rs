//! The mixture-of-experts feed-forward, a block's FFN where a router sends
//! each token to `k` of `E` SwiGLU experts and sums their outputs weighted
//! by its probabilities:
//! ```text
//! p = softmax(W_r · h)                       [E]
//! chosen = topk(p, k)                        ties to the lowest index, as torch.topk
//! w = p[chosen] (/ Σ p[chosen] with norm_topk_prob)
//! moe(h) = Σ_j w_j · W_down[e_j] · (silu(W_gate[e_j] · h) * W_up[e_j] · h)
//! ```
//! gpt-oss adds biases to the router and to each expert's three products,
//! and gates with its clamped SwiGLU ([`ExpertGate::ClampedSwiglu`]); its
//! softmax over the `k` chosen logits is the renormalized one above.
//! - References: transformers `Qwen3MoeSparseMoeBlock`, `Qwen3MoeTopKRouter`
//!   (models/qwen3_moe/modeling_qwen3_moe.py); llama.cpp `build_moe_ffn`
//!   (src/llama-graph.cpp), whose GGUF names and `[E, F, H]` expert stacks
//!   these are.
//! - Selection is on the router's logits (softmax keeps their order), ties
//!   to the lowest index in both paths below; the weights are the softmax's.
//! - Decode (one token) reads only the chosen experts: `k` rounds of argmax
//!   (`top_k`, the winner masked to `-inf` after each: plain StableHLO)
//!   give their indices, each expert is a dynamic slice of the stacks
//!   ([`Weight::select`]) fed to the product dense weights use (the fused
//!   packed one for a packed stack; the `k` experts' gate and up matrices
//!   as one).
//! - Prefill runs every expert over every token and contracts their outputs
//!   with the routing `[seq, E]` (zero for the experts a token did not
//!   choose), which `routing` finds by rank, without argmax rounds (IREE
//!   3.13's CPU codegen fails on those over a dynamic number of rows).
//!   Simple and correct; its cost against grouping tokens by expert at
//!   E = 128 is still to be measured. The outputs are weighed 8 experts
//!   at a time and summed (`GROUP`).

use super::blocks::{add_bias, Layer};
use super::{linear_each, Result, Weight};
use crate::graph::{ComparisonDirection, DType, DotDimensions, ReduceKind, TensorType};
use crate::trace::Tensor;

/// Experts whose outputs the prompt graph stacks and weighs in one
/// product ([`Moe::forward`]).
const GROUP: usize = 8;

/// The shape of a mixture-of-experts feed-forward and its routing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts, `E`.
    pub experts: usize,
    /// Experts each token is sent to, `k`.
    pub used: usize,
    /// Width of each expert's feed-forward, `F`.
    pub feed_forward_length: usize,
    /// The chosen experts' probabilities are divided by their sum (HF's
    /// `norm_topk_prob`; llama.cpp's `norm_w`).
    pub norm_topk: bool,
    /// The router and every expert's products have biases (gpt-oss).
    pub biases: bool,
    /// How an expert combines its gate and up products.
    pub gate: ExpertGate,
}

impl MoeConfig {
    /// `k` of `E` SwiGLU experts `F` wide without biases, as Qwen3-MoE's and
    /// Mixtral's, their weights renormalized with `norm_topk`.
    pub fn swiglu(experts: usize, used: usize, feed_forward_length: usize, norm_topk: bool) -> Self {
        MoeConfig { experts, used, feed_forward_length, norm_topk, biases: false, gate: ExpertGate::Silu }
    }
}

/// What an expert computes from its gate and up products `g` and `u`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertGate {
    /// SwiGLU: `silu(g) · u`.
    Silu,
    /// gpt-oss's: `g' · σ(alpha · g') · (u' + 1)` with `g' = min(g, limit)`
    /// and `u' = clamp(u, −limit, limit)` (transformers'
    /// `GptOssExperts._apply_gate`, llama.cpp's `swiglu_oai`).
    ClampedSwiglu {
        /// 1.702 in every gpt-oss.
        alpha: f64,
        /// 7 in every gpt-oss.
        limit: f64,
    },
}

impl ExpertGate {
    fn apply<'t>(self, g: &Tensor<'t>, u: &Tensor<'t>) -> Result<Tensor<'t>> {
        match self {
            ExpertGate::Silu => Ok(g.silu()?.multiply(u)?),
            ExpertGate::ClampedSwiglu { alpha, limit } => {
                let t = g.tracer();
                let scalar = |v: f64| t.constant(v, TensorType::new([], g.ty.dtype));
                let g = g.clamp(&scalar(f64::NEG_INFINITY)?, &scalar(limit)?)?;
                let u = u.clamp(&scalar(-limit)?, &scalar(limit)?)?;
                let glu = g.multiply(&g.multiply(&t.constant(alpha, g.ty.clone())?)?.logistic()?)?;
                Ok(glu.multiply(&u.add(&t.constant(1.0, u.ty.clone())?)?)?)
            }
        }
    }
}

/// gpt-oss's biases: the router's `[E]`, the experts' gate and up `[E, F]`
/// and down `[E, H]` (`ffn_gate_inp.bias`, `ffn_{gate,up,down}_exps.bias`).
struct Biases<'t> {
    router: Tensor<'t>,
    gate: Tensor<'t>,
    up: Tensor<'t>,
    down: Tensor<'t>,
}

/// `y [seq, n]` plus `bias [n]` where there is one.
fn biased<'t>(y: Tensor<'t>, bias: Option<Tensor<'t>>) -> Result<Tensor<'t>> {
    match bias {
        Some(b) => add_bias(&y, &b),
        None => Ok(y),
    }
}

/// A block's router `ffn_gate_inp` (`[E, H]`) and its experts, stacked:
/// `ffn_gate_exps`, `ffn_up_exps` (`[E, F, H]`), `ffn_down_exps` (`[E, H, F]`).
pub(crate) struct Moe<'t> {
    router: Weight<'t>,
    gate: Weight<'t>,
    up: Weight<'t>,
    down: Weight<'t>,
    /// Boxed: a block's feed-forward is this or a dense one, of the size
    /// of the weights alone.
    biases: Option<Box<Biases<'t>>>,
    c: MoeConfig,
}

impl<'t> Moe<'t> {
    /// The router and expert stacks of `l`, for a residual stream of `hidden`.
    pub fn load(l: &Layer<'_, 't>, hidden: usize, c: MoeConfig) -> Result<Self> {
        let (e, f) = (c.experts, c.feed_forward_length);
        let biases = match c.biases {
            true => Some(Box::new(Biases {
                router: l.bias("ffn_gate_inp", e)?,
                gate: l.stacked_bias("ffn_gate_exps", &[e, f])?,
                up: l.stacked_bias("ffn_up_exps", &[e, f])?,
                down: l.stacked_bias("ffn_down_exps", &[e, hidden])?,
            })),
            false => None,
        };
        Ok(Moe {
            router: l.weight("ffn_gate_inp", &[e, hidden])?,
            gate: l.weight("ffn_gate_exps", &[e, f, hidden])?,
            up: l.weight("ffn_up_exps", &[e, f, hidden])?,
            down: l.weight("ffn_down_exps", &[e, hidden, f])?,
            biases,
            c,
        })
    }

    /// `h [seq, hidden]` -> `[seq, hidden]`: with one static row (decode),
    /// the `k` chosen experts only; else every expert, weighted by the
    /// routing.
    pub fn forward(&self, h: &Tensor<'t>) -> Result<Tensor<'t>> {
        let logits = biased(self.router.linear(h)?, self.biases.as_ref().map(|b| b.router.clone()))?;
        if h.ty.shape[0] != 1 {
            let routing = routing(&logits, self.c.used, self.c.norm_topk)?;
            // Every expert's output `[seq, E, hidden]`, contracted with the
            // routing per token: one batched product, which IREE 3.13
            // compiles (a `[seq]` weight broadcast over each expert's
            // `[seq, hidden]` output fails its CPU workgroup distribution).
            let (e, seq, hidden) = (self.c.experts, h.ty.shape[0], h.ty.shape[1]);
            let (gates, ups, downs) = (self.gate.row_blocks(e)?, self.up.row_blocks(e)?, self.down.row_blocks(e)?);
            let outputs = (0..e)
                .map(|i| {
                    let rows = self.bias_rows(|stack| {
                        let n = stack.ty.shape[1];
                        Ok(stack.slice(&[i, 0], &[i + 1, n], &[1, 1])?.reshape(&[n])?)
                    })?;
                    self.expert([&gates[i], &ups[i], &downs[i]], rows, h)
                })
                .collect::<Result<Vec<_>>>()?;
            let per_token = DotDimensions {
                lhs_batching_dimensions: vec![0],
                rhs_batching_dimensions: vec![0],
                lhs_contracting_dimensions: vec![1],
                rhs_contracting_dimensions: vec![1],
            };
            // In groups of GROUP experts, summed: a concatenation of 32
            // `[?, hidden]` outputs (gpt-oss-20b) made a dispatch of 70
            // push constants, which IREE 3.13's CPU runtime refuses (64).
            let mut sum: Option<Tensor<'t>> = None;
            for (g, group) in outputs.chunks(GROUP).enumerate() {
                let n = group.len();
                let stacked =
                    h.tracer().concatenate(&group.iter().collect::<Vec<_>>(), 1)?.reshape(&[seq, n, hidden])?;
                let weights = match n == e {
                    true => routing.clone(),
                    false => routing.slice(&[0, g * GROUP], &[seq, g * GROUP + n], &[1, 1])?,
                };
                let y = weights.dot_general(&stacked, per_token.clone())?;
                sum = Some(match sum {
                    Some(s) => s.add(&y)?,
                    None => y,
                });
            }
            return Ok(sum.expect("at least one expert"));
        }
        let chosen = top_k(&logits, &logits.softmax(1)?, self.c.used)?;
        let total = match self.c.norm_topk {
            true => Some(chosen.iter().skip(1).try_fold(chosen[0].weight.clone(), |s, c| s.add(&c.weight))?),
            false => None,
        };
        let normed = |w: &Tensor<'t>| -> Result<Tensor<'t>> {
            Ok(match &total {
                Some(total) => w.divide(total)?,
                None => w.clone(),
            })
        };
        let weighted = |y: Tensor<'t>, w: &Tensor<'t>| -> Result<Tensor<'t>> {
            Ok(y.multiply(&w.broadcast_in_dim(&y.ty.shape, &[0])?)?)
        };
        let picked = chosen
            .iter()
            .map(|c| {
                let index = c.index.reshape(&[])?;
                let weights = [self.gate.select(&index)?, self.up.select(&index)?, self.down.select(&index)?];
                let rows = self.bias_rows(|stack| {
                    let (n, zero) = (stack.ty.shape[1], stack.tracer().constant(0.0, TensorType::new([], DType::I32))?);
                    Ok(stack.dynamic_slice(&[&index, &zero], &[1, n])?.reshape(&[n])?)
                })?;
                Ok((weights, rows))
            })
            .collect::<Result<Vec<_>>>()?;
        // Every chosen expert's gate and up as one streamed product (one
        // dispatch for the k experts' 2k matrices, where they are packed).
        let gate_up: Vec<&Weight<'t>> = picked.iter().flat_map(|([gate, up, _], _)| [gate, up]).collect();
        let gate_up = linear_each(&gate_up, h)?;
        let mut out: Option<Tensor<'t>> = None;
        for ((c, ([_, _, down], rows)), gu) in chosen.iter().zip(picked).zip(gate_up.chunks(2)) {
            let y = self.finish(&down, rows, &gu[0], &gu[1])?;
            let y = weighted(y, &normed(&c.weight)?)?;
            out = Some(match out {
                Some(o) => o.add(&y)?,
                None => y,
            });
        }
        Ok(out.expect("k is at least one"))
    }

    /// An expert's gate, up and down bias rows, where there are biases:
    /// `row` takes the expert's row of a `[experts, n]` stack (a static
    /// slice in the prompt graph, a dynamic one at the routed index in
    /// decode).
    fn bias_rows(&self, row: impl Fn(&Tensor<'t>) -> Result<Tensor<'t>>) -> Result<Option<[Tensor<'t>; 3]>> {
        let Some(b) = &self.biases else { return Ok(None) };
        Ok(Some([row(&b.gate)?, row(&b.up)?, row(&b.down)?]))
    }

    /// One expert (`[gate, up, down]`, with its bias rows) over `h [seq,
    /// hidden]`: gate and up as one streamed product where they can be
    /// ([`linear_each`]).
    fn expert(
        &self,
        [gate, up, down]: [&Weight<'t>; 3],
        rows: Option<[Tensor<'t>; 3]>,
        h: &Tensor<'t>,
    ) -> Result<Tensor<'t>> {
        let [g, u]: [Tensor<'t>; 2] = linear_each(&[gate, up], h)?.try_into().expect("two products");
        self.finish(down, rows, &g, &u)
    }

    /// An expert's output from its gate and up products `g` and `u`: their
    /// biases added, gated, then the down product and its bias.
    fn finish(
        &self,
        down: &Weight<'t>,
        rows: Option<[Tensor<'t>; 3]>,
        g: &Tensor<'t>,
        u: &Tensor<'t>,
    ) -> Result<Tensor<'t>> {
        let [gate_bias, up_bias, down_bias] = rows.map_or([None, None, None], |r| r.map(Some));
        let gated = self.c.gate.apply(&biased(g.clone(), gate_bias)?, &biased(u.clone(), up_bias)?)?;
        biased(down.linear(&gated)?, down_bias)
    }
}

/// One round of [`top_k`]: per row, the expert chosen, where it sits and
/// its probability.
struct Chosen<'t> {
    /// `[seq]` i32.
    index: Tensor<'t>,
    /// `[seq]`: its probability.
    weight: Tensor<'t>,
}

/// The `k` largest of each row of `logits [seq, E]`, largest first, each
/// with its probability in `probs`, by `k` rounds of argmax with each
/// winner masked to `-inf`: equal values go to the lowest index first, as
/// `torch.topk` orders them.
fn top_k<'t>(logits: &Tensor<'t>, probs: &Tensor<'t>, k: usize) -> Result<Vec<Chosen<'t>>> {
    let t = probs.tracer();
    let shape = probs.ty.shape.clone();
    // A constant range broadcast over the rows: IREE 3.13 fails to compile
    // a prefill's `[?, E]` dynamic iota here ("vector.store ... restricted
    // to workgroup distributed contexts"), and Vulkan a static one at 128
    // experts (its `index` crosses the next round's reduction).
    let columns = t.range(shape[1])?.broadcast_in_dim(&shape, &[1])?;
    let (zero, neg_inf) = (t.constant(0.0, probs.ty.clone())?, t.constant(f64::NEG_INFINITY, probs.ty.clone())?);
    let mut left = logits.clone();
    (0..k)
        .map(|_| {
            let index = left.argmax(1)?;
            let hit = columns.compare(ComparisonDirection::Eq, &index.broadcast_in_dim(&shape, &[0])?)?;
            let weight = hit.select(probs, &zero)?.reduce(ReduceKind::Sum, &[1])?;
            left = hit.select(&neg_inf, &left)?;
            Ok(Chosen { index, weight })
        })
        .collect()
}

/// Each token's weight of each expert, `[seq, E]` from the router's
/// `logits`: its probability where it is among the `k` most probable (with
/// `norm`, divided by their sum), else zero. An expert is chosen when fewer
/// than `k` experts beat it (a larger logit, or an equal one at a lower
/// index, as [`top_k`] breaks ties): one comparison of every pair and one
/// sum, where IREE 3.13's CPU codegen fails to distribute `k` chained
/// argmax rounds over a dynamic number of rows.
fn routing<'t>(logits: &Tensor<'t>, k: usize, norm: bool) -> Result<Tensor<'t>> {
    let t = logits.tracer();
    let (seq, e) = (logits.ty.shape[0], logits.ty.shape[1]);
    let pairs = [seq, e, e];
    // [token, e, j]: logit e against logit j.
    let (own, other) = (logits.broadcast_in_dim(&pairs, &[0, 1])?, logits.broadcast_in_dim(&pairs, &[0, 2])?);
    let square = TensorType::new([e, e], DType::I32);
    let lower = t.iota(1, square.clone())?.compare(ComparisonDirection::Lt, &t.iota(0, square)?)?;
    let tie_won = other.compare(ComparisonDirection::Eq, &own)?.and(&lower.broadcast_in_dim(&pairs, &[1, 2])?)?;
    let beats = other.compare(ComparisonDirection::Gt, &own)?.or(&tie_won)?;
    let rank = beats.convert(DType::F32)?.reduce(ReduceKind::Sum, &[2])?;
    let chosen = rank.compare(ComparisonDirection::Lt, &t.constant(k as f64, rank.ty.clone())?)?;
    let zero = t.constant(0.0, logits.ty.clone())?;
    let probs = logits.softmax(1)?;
    let picked = chosen.select(&probs, &zero)?;
    if !norm {
        return Ok(picked);
    }
    let total = picked.reduce(ReduceKind::Sum, &[1])?.broadcast_in_dim(&logits.ty.shape, &[0])?;
    Ok(picked.divide(&total)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::{self, tests::val, Value};
    use crate::trace::Tracer;
    use std::collections::HashMap;

    /// `Weight::select` of a dense stack is the matrix at the run-time index.
    #[test]
    fn select_reads_the_matrix_at_the_index() {
        let t = Tracer::new("main");
        let raw = t.input("stack", TensorType::new([3, 2, 2], DType::F32)).unwrap();
        let index = t.input("index", TensorType::new([], DType::I32)).unwrap();
        let stack = Weight { name: "stack".into(), raw, packed: None, shape: vec![3, 2, 2], tiles: None };
        let picked = stack.select(&index).unwrap();
        assert_eq!(picked.shape, [2, 2]);
        let g = t.finish(&[&picked.raw]).unwrap();
        let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
        for i in 0..3 {
            let inputs = [val("tensor<3x2x2xf32>", data.clone()), val("tensor<i32>", vec![i])];
            let got = interp::run(&g, &inputs, &HashMap::new()).unwrap().remove(0).to_f64_vec();
            assert_eq!(got, (4 * i..4 * i + 4).map(f64::from).collect::<Vec<_>>());
        }
    }

    /// Decode's argmax rounds and prefill's ranks choose the same experts,
    /// ties going to the lowest index as `torch.topk` does, and weigh them
    /// by their probabilities (renormalized or not).
    #[test]
    fn both_selections_agree_and_break_ties_to_the_lowest_index() {
        let t = Tracer::new("main");
        let x = t.input("logits", TensorType::new([3, 4], DType::F32)).unwrap();
        let chosen = top_k(&x, &x.softmax(1).unwrap(), 2).unwrap();
        let (plain, normed) = (routing(&x, 2, false).unwrap(), routing(&x, 2, true).unwrap());
        let g = t.finish(&[&chosen[0].index, &chosen[1].index, &chosen[0].weight, &plain, &normed]).unwrap();
        // A three-way tie after a winner, a two-way tie at the top, and one
        // at second place.
        let logits = [1.0f32, 3.0, 3.0, 3.0, 5.0, 1.0, 5.0, 0.0, 0.0, 2.0, 1.0, 2.0];
        let got: Vec<Vec<f64>> = interp::run(&g, &[val("tensor<3x4xf32>", logits.to_vec())], &HashMap::new())
            .unwrap()
            .iter()
            .map(Value::to_f64_vec)
            .collect();
        assert_eq!((&got[0], &got[1]), (&vec![1.0, 0.0, 1.0], &vec![2.0, 2.0, 3.0]));
        let probs: Vec<f64> = logits
            .chunks(4)
            .flat_map(|r| {
                let z: f64 = r.iter().map(|&l| f64::from(l).exp()).sum();
                r.iter().map(move |&l| f64::from(l).exp() / z)
            })
            .collect();
        let picked = [[1, 2], [0, 2], [1, 3]];
        for (row, pick) in picked.iter().enumerate() {
            let p = |e: usize| probs[row * 4 + e];
            assert!((got[2][row] - p(pick[0])).abs() < 1e-6);
            for e in 0..4 {
                let want = if pick.contains(&e) { p(e) } else { 0.0 };
                assert!((got[3][row * 4 + e] - want).abs() < 1e-6, "row {row}, expert {e}: {:?}", got[3]);
                let want = want / (p(pick[0]) + p(pick[1]));
                assert!((got[4][row * 4 + e] - want).abs() < 1e-6, "row {row}, expert {e}: {:?}", got[4]);
            }
        }
    }
}
