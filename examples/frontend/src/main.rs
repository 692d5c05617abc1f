//! A front-end crate of its own over kiln's library API, end to end: a small
//! [MLP-Mixer](https://arxiv.org/abs/2105.01601) classifier, which is none of
//! kiln's built-in families, with weights that exist only in this program.
//!
//! 1. **Trace** the model with the DSL ([`kiln::trace`]): shapes only, no data.
//! 2. **Lower** it to StableHLO with every weight inline: a `dense_resource`
//!    blob that aliases this program's own `Vec<f32>` (no copy until the
//!    module is written), so the `.mlirbc` runs with no parameter file.
//! 3. **Check** it: compile and run the module with IREE and compare the
//!    result with kiln's reference interpreter on the same weights and input.
//!
//! ```sh
//! make setup                        # IREE into .venv, once
//! cargo run -p mixer-frontend       # exits non-zero on a mismatch
//! ```

use anyhow::bail;
use kiln::graph::{DType, Graph, ReduceKind, TensorType};
use kiln::interp::{self, Value};
use kiln::iree::Iree;
use kiln::lower::{write_module_to_path, Emit, LowerOptions, ParamInit, ParamInits, Session};
use kiln::npy;
use kiln::trace::{Tensor, TraceError, Tracer};
use std::collections::HashMap;

const BATCH: usize = 2;
const TOKENS: usize = 8; // patches per image
const PATCH: usize = 12; // values per patch
const CHANNELS: usize = 16;
const TOKEN_HIDDEN: usize = 32;
const CHANNEL_HIDDEN: usize = 64;
const LAYERS: usize = 2;
const CLASSES: usize = 5;
const EPS: f64 = 1e-6;

fn f32s(shape: &[usize]) -> TensorType {
    TensorType::new(shape, DType::F32)
}

/// `x · wᵀ + b` over the last dim, with `w` stored `[out, in]` (PyTorch's `nn.Linear`).
fn linear<'t>(x: &Tensor<'t>, name: &str, out: usize) -> Result<Tensor<'t>, TraceError> {
    let t = x.tracer();
    let w = t.param(&format!("{name}.weight"), f32s(&[out, x.ty.shape[x.ty.rank() - 1]]))?;
    let b = t.param(&format!("{name}.bias"), f32s(&[out]))?;
    let y = x.linear(&w)?;
    y.add(&b.broadcast_in_dim(&y.ty.shape, &[y.ty.rank() - 1])?)
}

/// Layer norm over the last dim, with a learned scale and shift.
fn norm<'t>(x: &Tensor<'t>, name: &str) -> Result<Tensor<'t>, TraceError> {
    let t = x.tracer();
    let w = t.param(&format!("{name}.weight"), f32s(&[CHANNELS]))?;
    let b = t.param(&format!("{name}.bias"), f32s(&[CHANNELS]))?;
    x.layer_norm(Some(&w), Some(&b), EPS)
}

/// `fc2(gelu(fc1(x)))`.
fn mlp<'t>(x: &Tensor<'t>, name: &str, hidden: usize) -> Result<Tensor<'t>, TraceError> {
    let h = linear(x, &format!("{name}.fc1"), hidden)?.gelu_tanh()?;
    linear(&h, &format!("{name}.fc2"), x.ty.shape[x.ty.rank() - 1])
}

/// patches `[batch, tokens, patch]` → class probabilities `[batch, classes]`.
fn mixer(t: &Tracer) -> Result<Graph, TraceError> {
    let patches = t.input("patches", f32s(&[BATCH, TOKENS, PATCH]))?;
    let mut x = linear(&patches, "stem", CHANNELS)?;
    for i in 0..LAYERS {
        // Token mixing: one MLP across the tokens, shared by every channel.
        let h = norm(&x, &format!("blk.{i}.norm1"))?.transpose(&[0, 2, 1])?;
        let h = mlp(&h, &format!("blk.{i}.token_mix"), TOKEN_HIDDEN)?.transpose(&[0, 2, 1])?;
        x = x.add(&h)?;
        // Channel mixing: one MLP across the channels, shared by every token.
        let h = norm(&x, &format!("blk.{i}.norm2"))?;
        x = x.add(&mlp(&h, &format!("blk.{i}.channel_mix"), CHANNEL_HIDDEN)?)?;
    }
    // Mean over tokens, then a linear classifier.
    let sum = norm(&x, "norm")?.reduce(ReduceKind::Sum, &[1])?;
    let pooled = sum.divide(&t.constant(TOKENS as f64, sum.ty.clone())?)?;
    let probs = linear(&pooled, "head", CLASSES)?.softmax(1)?;
    t.finish(&[&probs])
}

/// `n` values uniform in `[-scale, scale)` from a fixed-seed generator (SplitMix64).
fn uniform(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = *seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 * scale - scale
        })
        .collect()
}

/// Weights for every param the graph names: norms near 1, biases near 0,
/// matrices scaled by `1/√fan_in`.
fn init_weights(graph: &Graph) -> anyhow::Result<HashMap<String, Value>> {
    let mut seed = 2021;
    let mut weights = HashMap::new();
    for (_, name, ty) in graph.params() {
        let n = ty.num_elements();
        let data = match ty.shape[..] {
            [_] if name.contains("norm") => uniform(n, &mut seed, 0.1).iter().map(|v| 1.0 + v).collect(),
            [_] => uniform(n, &mut seed, 0.1),
            _ => uniform(n, &mut seed, 1.0 / (ty.shape[1] as f32).sqrt()),
        };
        weights.insert(name.to_string(), Value::new(ty.clone(), data.into())?);
    }
    Ok(weights)
}

fn main() -> anyhow::Result<()> {
    // 1. Trace the model; then make its weights and an input.
    let graph = mixer(&Tracer::new("main"))?;
    let weights = init_weights(&graph)?;
    let input = Value::random(&f32s(&[BATCH, TOKENS, PATCH]), 7, 0..1);
    let n_weights: usize = weights.values().map(|w| w.ty.num_elements()).sum();
    println!(
        "traced @{}: {} nodes, {} params ({n_weights} f32), input {}",
        graph.name,
        graph.nodes().len(),
        weights.len(),
        input.ty
    );

    // 2. Lower, each param's global aliasing the bytes of its weight.
    let inits: ParamInits =
        weights.iter().map(|(name, w)| (name.as_str(), ParamInit::Inline(w.as_le_bytes()))).collect();
    let session = Session::new();
    let module = session.lower_with(&graph, &LowerOptions::default(), &inits)?;
    let dir = tempfile::tempdir()?;
    let (mlirbc, vmfb) = (dir.path().join("mixer.mlirbc"), dir.path().join("mixer.vmfb"));
    write_module_to_path(&module, Emit::Mlirbc, &mlirbc)?;
    println!("wrote {} ({} bytes)", mlirbc.display(), std::fs::metadata(&mlirbc)?.len());

    // 3. Run with IREE, and with the reference interpreter.
    let iree = Iree::locate()?;
    iree.compile(&mlirbc, &vmfb)?;
    let (x, y) = (dir.path().join("patches.npy"), dir.path().join("probs.npy"));
    npy::write(&x, &input)?;
    iree.run(&vmfb, &graph.name, &[x], &[], std::slice::from_ref(&y))?;
    let got = npy::read(&y)?;
    let want = interp::run(&graph, &[input], &weights)?.remove(0);

    if got.ty != want.ty {
        bail!("IREE returned {}, the interpreter {}", got.ty, want.ty);
    }
    let ty = want.ty.clone();
    let (got, want) = (got.to_f64_vec(), want.to_f64_vec());
    let (rtol, atol) = (1e-5, 1e-5);
    let mut max_diff = 0f64;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let diff = (g - w).abs();
        max_diff = max_diff.max(diff);
        let close = diff <= atol + rtol * w.abs(); // false for NaN
        if !close {
            bail!("element {i}: IREE {g}, interpreter {w} (|diff| {diff:e} > {atol:e} + {rtol:e}·|ref|)");
        }
    }
    println!("probs[0] = {:.4?}", &want[..CLASSES]);
    println!("IREE vs interpreter: {ty}, max |diff| = {max_diff:e}: ok");
    Ok(())
}
