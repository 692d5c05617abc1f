//! Transformer building blocks as short compositions of the tracing
//! primitives: norms, activations, softmax, argmax, attention masks, rotary
//! embeddings and grouped-query attention. Each one checks its arguments at
//! the call (errors name the op and the shapes) and reads like its equation;
//! the doc comment gives the formula and the reference implementation
//! (HF transformers, llama.cpp).
//!
//! Numerics:
//! - norms, softmax and rotary embeddings compute in f32 whatever the
//!   storage type (convert in, convert back), as HF and llama.cpp do;
//!   element-wise activations compute in the storage type;
//! - masks are i1 predicates (true = may attend) that [`attention`] applies
//!   with `select`, writing `f32::MIN` (HF's `finfo(dtype).min`) into masked
//!   logits. Not `-inf`: a fully masked row would give `-inf - -inf = NaN`
//!   in the max-subtracted softmax, while `f32::MIN` gives a uniform row.
//!   Nor an additive bias: `logit + f32::MIN` can overflow to `-inf`.
//!
//! Everything here is built from the primitives `trace` had when it was
//! written, so rotary embeddings take sine and cosine from a polynomial
//! composite, [`sin_cos`]: the one place to switch to `sine`/`cosine`
//! primitives.

use super::{Tensor, TraceError, Tracer};
use crate::graph::{ComparisonDirection as Cmp, DType, DotDimensions, Graph, Op, ReduceKind, TensorType, DYNAMIC};
use std::f64::consts::{FRAC_2_PI, PI};

type Result<T> = std::result::Result<T, TraceError>;

fn fail<T>(op: &'static str, message: impl Into<String>) -> Result<T> {
    Err(TraceError::Op { op, message: message.into() })
}

/// A splat constant of `like`'s type.
fn splat<'t>(like: &Tensor<'t>, value: f64) -> Result<Tensor<'t>> {
    like.tracer.constant(value, like.ty.clone())
}

/// `x` as `dtype`, without a convert node when it already is.
fn cast<'t>(x: &Tensor<'t>, dtype: DType) -> Result<Tensor<'t>> {
    if x.ty.dtype == dtype {
        Ok(x.clone())
    } else {
        x.convert(dtype)
    }
}

/// `x` as f32, or `x` itself if it is f32 already.
pub(crate) fn to_f32<'t>(x: &Tensor<'t>) -> Result<Tensor<'t>> {
    cast(x, DType::F32)
}

/// A tensor reduced over `dim`, broadcast back to `full` (keepdim).
fn keep_dim<'t>(reduced: &Tensor<'t>, full: &TensorType, dim: usize) -> Result<Tensor<'t>> {
    let kept: Vec<usize> = (0..full.rank()).filter(|&d| d != dim).collect();
    reduced.broadcast_in_dim(&full.shape, &kept)
}

/// `mean(x, dim)` with the dim dropped.
fn mean<'t>(x: &Tensor<'t>, dim: usize) -> Result<Tensor<'t>> {
    let n = x.ty.shape[dim];
    let sum = match dim + 1 == x.ty.rank() && n >= 4 * SUM_RUN && n.is_multiple_of(SUM_RUN) {
        // Runs of SUM_RUN, then their sums: in one reduction over the row,
        // IREE 3.13's Vulkan codegen shares a gathered row's index through
        // workgroup memory, which SPIR-V cannot hold (an embedding's rows
        // fused into the first norm). Rows under 64 keep one reduction: the
        // host's codegen fused a tiny model's packed rows (hidden 32, Q8_0
        // kept) into a product's packing past its vector limit with runs.
        true => {
            let mut runs = x.ty.shape.clone();
            runs[dim] = n / SUM_RUN;
            runs.push(SUM_RUN);
            x.reshape(&runs)?.reduce(ReduceKind::Sum, &[dim + 1])?.reduce(ReduceKind::Sum, &[dim])?
        }
        false => x.reduce(ReduceKind::Sum, &[dim])?,
    };
    sum.divide(&splat(&sum, n as f64)?)
}

/// Elements a row's sum adds up at a time ([`mean`]).
const SUM_RUN: usize = 16;

fn require_float(op: &'static str, x: &Tensor<'_>) -> Result<()> {
    if !x.ty.dtype.is_float() {
        return fail(op, format!("expects a float tensor, found {}", x.ty));
    }
    Ok(())
}

fn require_dim(op: &'static str, x: &Tensor<'_>, dim: usize) -> Result<()> {
    if dim >= x.ty.rank() {
        return fail(op, format!("dim {dim} is out of bounds for {}", x.ty));
    }
    Ok(())
}

/// Index of the last dim of a float tensor of rank >= 1.
fn last_dim(op: &'static str, x: &Tensor<'_>) -> Result<usize> {
    require_float(op, x)?;
    match x.ty.rank() {
        0 => fail(op, format!("needs rank >= 1, found {}", x.ty)),
        r => Ok(r - 1),
    }
}

/// Checks a per-feature vector (norm weight or bias): float `[n]` for `x [..., n]`.
fn check_feature_vector(op: &'static str, what: &str, v: &Tensor<'_>, x: &TensorType) -> Result<()> {
    let n = x.shape[x.rank() - 1];
    if v.ty.shape != [n] || !v.ty.dtype.is_float() {
        return fail(op, format!("{what} must be a float [{n}] for x {x}, found {}", v.ty));
    }
    Ok(())
}

/// A per-feature vector in f32, broadcast over the last dim of `x`.
fn over_last_dim<'t>(v: &Tensor<'t>, x: &TensorType) -> Result<Tensor<'t>> {
    to_f32(v)?.broadcast_in_dim(&x.shape, &[x.rank() - 1])
}

fn f32_type(shape: &[usize]) -> TensorType {
    TensorType::new(shape, DType::F32)
}

impl<'t> Tensor<'t> {
    /// RMS norm over the last dim, in f32:
    /// `y = x / sqrt(mean(x², -1) + eps) · w`.
    ///
    /// HF `LlamaRMSNorm`, llama.cpp `ggml_rms_norm` then `ggml_mul`.
    pub fn rms_norm(&self, weight: Option<&Tensor<'_>>, eps: f64) -> Result<Tensor<'t>> {
        const OP: &str = "rms_norm";
        let last = last_dim(OP, self)?;
        if let Some(w) = weight {
            check_feature_vector(OP, "weight", w, &self.ty)?;
        }
        let x = to_f32(self)?;
        let mean_square = mean(&x.multiply(&x)?, last)?;
        let inv_rms = mean_square.add(&splat(&mean_square, eps)?)?.rsqrt()?;
        let y = x.multiply(&keep_dim(&inv_rms, &x.ty, last)?)?;
        let y = match weight {
            Some(w) => y.multiply(&over_last_dim(w, &x.ty)?)?,
            None => y,
        };
        cast(&y, self.ty.dtype)
    }

    /// Gemma's RMS norm, which scales by `1 + w`:
    /// `y = x / sqrt(mean(x², -1) + eps) · (1 + w)`.
    ///
    /// HF `GemmaRMSNorm`/`Gemma3RMSNorm`. llama.cpp's GGUF converter adds
    /// the 1 to the stored weights, so GGUF Gemma uses [`Tensor::rms_norm`].
    pub fn gemma_rms_norm(&self, weight: &Tensor<'_>, eps: f64) -> Result<Tensor<'t>> {
        last_dim("gemma_rms_norm", self)?;
        check_feature_vector("gemma_rms_norm", "weight", weight, &self.ty)?;
        let w = to_f32(weight)?;
        self.rms_norm(Some(&w.add(&splat(&w, 1.0)?)?), eps)
    }

    /// Layer norm over the last dim, in f32, with the biased variance:
    /// `y = (x - mean) / sqrt(mean((x - mean)²) + eps) · w + b`.
    ///
    /// HF/PyTorch `nn.LayerNorm`, llama.cpp `ggml_norm` then `ggml_mul`, `ggml_add`.
    pub fn layer_norm(&self, weight: Option<&Tensor<'_>>, bias: Option<&Tensor<'_>>, eps: f64) -> Result<Tensor<'t>> {
        const OP: &str = "layer_norm";
        let last = last_dim(OP, self)?;
        for (what, v) in [("weight", weight), ("bias", bias)] {
            if let Some(v) = v {
                check_feature_vector(OP, what, v, &self.ty)?;
            }
        }
        let x = to_f32(self)?;
        let centered = x.subtract(&keep_dim(&mean(&x, last)?, &x.ty, last)?)?;
        let variance = mean(&centered.multiply(&centered)?, last)?;
        let inv_std = variance.add(&splat(&variance, eps)?)?.rsqrt()?;
        let mut y = centered.multiply(&keep_dim(&inv_std, &x.ty, last)?)?;
        if let Some(w) = weight {
            y = y.multiply(&over_last_dim(w, &x.ty)?)?;
        }
        if let Some(b) = bias {
            y = y.add(&over_last_dim(b, &x.ty)?)?;
        }
        cast(&y, self.ty.dtype)
    }

    /// Softmax along `dim`, max-subtracted so `exp` cannot overflow, in f32:
    /// `softmax(x)ᵢ = exp(xᵢ - max x) / Σⱼ exp(xⱼ - max x)`.
    ///
    /// HF `nn.functional.softmax(x, dim, dtype=float32)`, llama.cpp `ggml_soft_max`.
    pub fn softmax(&self, dim: usize) -> Result<Tensor<'t>> {
        require_float("softmax", self)?;
        require_dim("softmax", self, dim)?;
        let x = to_f32(self)?;
        let max = keep_dim(&x.reduce(ReduceKind::Max, &[dim])?, &x.ty, dim)?;
        let e = x.subtract(&max)?.exp()?;
        let sum = keep_dim(&e.reduce(ReduceKind::Sum, &[dim])?, &x.ty, dim)?;
        cast(&e.divide(&sum)?, self.ty.dtype)
    }

    /// SiLU (swish): `x · σ(x)`.
    ///
    /// HF `SiLUActivation`, llama.cpp `ggml_silu`.
    pub fn silu(&self) -> Result<Tensor<'t>> {
        require_float("silu", self)?;
        self.multiply(&self.logistic()?)
    }

    /// GELU, tanh approximation:
    /// `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`.
    ///
    /// HF `gelu_pytorch_tanh` (`GELUTanh`), llama.cpp `ggml_gelu` (whose f16
    /// lookup table, when enabled, rounds differently).
    pub fn gelu_tanh(&self) -> Result<Tensor<'t>> {
        require_float("gelu_tanh", self)?;
        let c = |v: f64| splat(self, v);
        let cube = self.multiply(self)?.multiply(self)?;
        let inner = self.add(&cube.multiply(&c(0.044715)?)?)?.multiply(&c((2.0 / PI).sqrt())?)?;
        let gate = inner.tanh()?.add(&c(1.0)?)?.multiply(&c(0.5)?)?;
        self.multiply(&gate)
    }

    /// GELU, exact: `0.5 · x · (1 + erf(x / √2))`.
    ///
    /// HF `gelu` (`GELUActivation`, BERT's `hidden_act`); llama.cpp's BERT
    /// graph uses the tanh approximation ([`Tensor::gelu_tanh`]) instead.
    pub fn gelu_erf(&self) -> Result<Tensor<'t>> {
        require_float("gelu_erf", self)?;
        let c = |v: f64| splat(self, v);
        let gate = self.multiply(&c(std::f64::consts::FRAC_1_SQRT_2)?)?.erf()?.add(&c(1.0)?)?;
        self.multiply(&gate.multiply(&c(0.5)?)?)
    }

    /// Soft-capping: `cap · tanh(x / cap)`, smoothly bounding `x` to `(-cap, cap)`.
    ///
    /// HF Gemma 2/3 (`attn_logit_softcapping`, `final_logit_softcapping`),
    /// llama.cpp `ggml_softcap`.
    pub fn soft_cap(&self, cap: f64) -> Result<Tensor<'t>> {
        require_float("soft_cap", self)?;
        if !(cap > 0.0 && cap.is_finite()) {
            return fail("soft_cap", format!("cap must be positive and finite, found {cap}"));
        }
        let cap = splat(self, cap)?;
        self.divide(&cap)?.tanh()?.multiply(&cap)
    }

    /// Index of the maximum along `dim` as i32, the first one on ties; a NaN
    /// counts as the maximum (as in `torch.argmax`).
    ///
    /// One `argmax` op, which the lowering makes two reductions of, reading
    /// the indices from a constant where an iota here would put an `index`
    /// across a reduction, which IREE 3.13's Vulkan codegen cannot compile.
    pub fn argmax(&self, dim: usize) -> Result<Tensor<'t>> {
        require_dim("argmax", self, dim)?;
        if self.ty.dtype == DType::I1 {
            return fail("argmax", format!("expects a numeric tensor, found {}", self.ty));
        }
        self.tracer.push("", Op::Argmax { dimension: dim }, &[self], None)
    }
}

/// Where the first query sits in the sequence: a trace-time number (prefill
/// from 0) or a graph value, a `tensor<i32>` or `tensor<1xi32>` (decode).
#[derive(Clone, Copy, Debug)]
pub enum QueryOffset<'a, 't> {
    /// A position known while tracing.
    Static(usize),
    /// A position given at run time.
    Dynamic(&'a Tensor<'t>),
}

impl From<usize> for QueryOffset<'_, '_> {
    fn from(offset: usize) -> Self {
        QueryOffset::Static(offset)
    }
}

impl<'a, 't> From<&'a Tensor<'t>> for QueryOffset<'a, 't> {
    fn from(offset: &'a Tensor<'t>) -> Self {
        QueryOffset::Dynamic(offset)
    }
}

/// `[q_len, kv_len]` i32 grids of query positions (`q_offset + i`) and key
/// positions (`j`).
fn position_grids<'t>(
    op: &'static str,
    tracer: &'t Tracer,
    q_len: usize,
    kv_len: usize,
    q_offset: QueryOffset<'_, 't>,
) -> Result<(Tensor<'t>, Tensor<'t>)> {
    let grid = TensorType::new([q_len, kv_len], DType::I32);
    let offset = match q_offset {
        QueryOffset::Static(0) => None,
        QueryOffset::Static(n) if n > i32::MAX as usize => return fail(op, format!("q_offset {n} does not fit i32")),
        QueryOffset::Static(n) => Some(tracer.constant(n as f64, grid.clone())?),
        QueryOffset::Dynamic(p) => {
            let dims: &[usize] = match (p.ty.dtype, p.ty.shape.as_slice()) {
                (DType::I32, []) => &[],
                (DType::I32, [1]) => &[0],
                _ => return fail(op, format!("q_offset must be tensor<i32> or tensor<1xi32>, found {}", p.ty)),
            };
            Some(p.broadcast_in_dim(&grid.shape, dims)?)
        }
    };
    // Static positions are ranges, not iotas: an iota's index, fused into
    // attention's softmax reductions, failed IREE 3.13's Vulkan codegen at a
    // 128-wide sliding window (`memref<128xindex>` in workgroup memory). A
    // prompt's `?` positions stay iotas.
    let positions = |dim: usize, len: usize| match len {
        DYNAMIC => tracer.iota(dim, grid.clone()),
        _ => tracer.range(len)?.broadcast_in_dim(&grid.shape, &[dim]),
    };
    let q = positions(0, q_len)?;
    let q = match offset {
        Some(offset) => q.add(&offset)?,
        None => q,
    };
    Ok((q, positions(1, kv_len)?))
}

/// Causal mask `[q_len, kv_len]`, i1, true where query `i` may attend key `j`:
/// `j <= q_offset + i`.
///
/// HF `causal_mask_function` (`kv_idx <= q_idx`), llama.cpp
/// `llama_kv_cache::set_input_kq_mask` (masked when `p0 > p1`).
pub fn causal_mask<'a, 't: 'a>(
    tracer: &'t Tracer,
    q_len: usize,
    kv_len: usize,
    q_offset: impl Into<QueryOffset<'a, 't>>,
) -> Result<Tensor<'t>> {
    let (q, kv) = position_grids("causal_mask", tracer, q_len, kv_len, q_offset.into())?;
    kv.compare(Cmp::Le, &q)
}

/// Sliding-window causal mask `[q_len, kv_len]`, i1: query at position
/// `p = q_offset + i` sees the `window` keys ending at itself,
/// `j <= p && p - j < window`.
///
/// HF `sliding_window_overlay` (`kv_idx > q_idx - sliding_window`) and
/// llama.cpp `is_masked_swa` (masked when `p1 - p0 >= n_swa`).
pub fn sliding_window_mask<'a, 't: 'a>(
    tracer: &'t Tracer,
    q_len: usize,
    kv_len: usize,
    q_offset: impl Into<QueryOffset<'a, 't>>,
    window: usize,
) -> Result<Tensor<'t>> {
    const OP: &str = "sliding_window_mask";
    if window == 0 || window > i32::MAX as usize {
        return fail(OP, format!("window must be in 1..=i32::MAX, found {window}"));
    }
    let (q, kv) = position_grids(OP, tracer, q_len, kv_len, q_offset.into())?;
    let causal = kv.compare(Cmp::Le, &q)?;
    let in_window = q.subtract(&kv)?.compare(Cmp::Lt, &splat(&q, window as f64)?)?;
    causal.and(&in_window)
}

/// How rotary embeddings pair the features of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i+1)`: llama.cpp `LLAMA_ROPE_TYPE_NORM` (GGUF llama,
    /// whose converter permutes Q/K rows into this order), Meta's original.
    Interleaved,
    /// Pairs `(i, i + d/2)`: HF `rotate_half`, llama.cpp `LLAMA_ROPE_TYPE_NEOX`.
    NeoX,
}

/// How rotary frequencies are stretched for longer contexts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// The frequencies as they are.
    None,
    /// Positions divided by `factor` (HF `rope_type = "linear"`, llama.cpp
    /// `freq_scale = 1 / factor`).
    Linear {
        /// The divisor of every position.
        factor: f64,
    },
    /// Llama 3.1: keep high frequencies, divide low ones by `factor`, blend
    /// between (HF `_compute_llama3_parameters`).
    Llama3 {
        /// The divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor`
        /// are fully scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor`
        /// are kept.
        high_freq_factor: f64,
        /// The context length the model was trained at.
        original_max_position_embeddings: usize,
    },
    /// YaRN (Peng et al., <https://arxiv.org/abs/2309.00071>): frequencies
    /// that turn fewer than `beta_slow` times over the original context are
    /// divided by `factor`, those turning more than `beta_fast` times are
    /// kept, a linear ramp over the dims between; cos and sin are then
    /// multiplied by `attention_factor` (HF `_compute_yarn_parameters`,
    /// llama.cpp `rope_yarn`).
    Yarn {
        /// The divisor of the low frequencies.
        factor: f64,
        /// The context length the model was trained at.
        original_max_position_embeddings: usize,
        /// Rotations over the original context above which a frequency is kept (32).
        beta_fast: f64,
        /// Rotations below which it is fully divided (1).
        beta_slow: f64,
        /// Whether the ramp's ends are rounded out to whole dims (HF's default, llama.cpp's only way).
        truncate: bool,
        /// What cos and sin are multiplied by (HF's `attention_factor`,
        /// llama.cpp's `mscale`): `0.1 ln(factor) + 1` unless the config says.
        attention_factor: f64,
    },
}

impl RopeScaling {
    /// YaRN's ramp over the frequency indices `i` of a `head_dim` head of
    /// base `base`: `(low, high)`, the ramp being `clamp((i - low) / (high -
    /// low), 0, 1)` (1: divided by the factor, 0: kept); HF
    /// `find_correction_range`, `linear_ramp_factor`.
    fn yarn_ramp(&self, head_dim: usize, base: f64) -> Option<(f64, f64)> {
        let RopeScaling::Yarn { original_max_position_embeddings, beta_fast, beta_slow, truncate, .. } = *self else {
            return None;
        };
        let dim = head_dim as f64;
        let old_len = original_max_position_embeddings as f64;
        // The dim whose frequency turns `rotations` times over the original context.
        let correction_dim = |rotations: f64| dim * (old_len / (rotations * 2.0 * PI)).ln() / (2.0 * base.ln());
        let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
        if truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
        if low == high {
            high += 0.001; // HF: prevents a singularity
        }
        Some((low, high))
    }
}

/// Rotary position embedding settings for heads of `head_dim` features.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Features per head; even.
    pub head_dim: usize,
    /// `θ` base: 10000 for Llama 2, 500000 for Llama 3.
    pub freq_base: f64,
    /// Which features are paired.
    pub style: RopeStyle,
    /// How frequencies are stretched.
    pub scaling: RopeScaling,
}

/// `cos` and `sin` of every position's angles, `[seq, head_dim/2]` f32:
/// compute once per forward pass, apply to q and k of every layer.
#[derive(Clone, Debug)]
pub struct Rotation<'t> {
    /// `cos` of the angles.
    pub cos: Tensor<'t>,
    /// `sin` of the angles.
    pub sin: Tensor<'t>,
    /// How [`Rotation::apply`] pairs features.
    pub style: RopeStyle,
}

impl Rope {
    /// Unscaled rotary embeddings with base `freq_base`.
    pub fn new(head_dim: usize, freq_base: f64, style: RopeStyle) -> Rope {
        Rope { head_dim, freq_base, style, scaling: RopeScaling::None }
    }

    /// The same settings with `scaling`.
    pub fn with_scaling(self, scaling: RopeScaling) -> Rope {
        Rope { scaling, ..self }
    }

    /// Checks the settings before any node is traced.
    fn check(&self) -> Result<()> {
        let (d, base) = (self.head_dim, self.freq_base);
        if d == 0 || d % 2 != 0 {
            return fail("rope", format!("head_dim must be even and positive, found {d}"));
        }
        if !(base > 1.0 && base.is_finite()) {
            return fail("rope", format!("freq_base must be finite and > 1, found {base}"));
        }
        match self.scaling {
            RopeScaling::Linear { factor } if !(factor > 0.0 && factor.is_finite()) => {
                fail("rope", format!("linear scaling factor must be positive, found {factor}"))
            }
            RopeScaling::Llama3 { factor, low_freq_factor: low, high_freq_factor: high, .. }
                if !(factor > 0.0 && low > 0.0 && high > low) =>
            {
                fail("rope", format!("llama3 scaling needs factor > 0 and 0 < low_freq_factor < high_freq_factor, found {factor}, {low}, {high}"))
            }
            RopeScaling::Yarn { factor, original_max_position_embeddings: len, beta_fast, beta_slow, attention_factor, .. }
                if !(factor > 0.0 && len > 0 && beta_slow > 0.0 && beta_fast > 0.0 && attention_factor > 0.0) =>
            {
                fail("rope", format!("yarn scaling needs positive factor, original context, betas and attention factor, found {factor}, {len}, {beta_fast}, {beta_slow}, {attention_factor}"))
            }
            _ => Ok(()),
        }
    }

    /// Per-pair frequencies `[head_dim/2]` f32, in-graph from iota:
    /// `inv_freq[i] = base^(-2i/d) = exp(-(2i/d) · ln base)`, then scaled.
    /// f32 `exp` differs from HF's `base ** (arange / d)` by a few ulp.
    pub fn inv_freq<'t>(&self, tracer: &'t Tracer) -> Result<Tensor<'t>> {
        self.check()?;
        let d = self.head_dim;
        let i = tracer.iota(0, f32_type(&[d / 2]))?;
        let inv_freq = i.multiply(&splat(&i, -2.0 * self.freq_base.ln() / d as f64)?)?.exp()?;
        let c = |v: f64| splat(&inv_freq, v);
        match self.scaling {
            RopeScaling::None => Ok(inv_freq),
            RopeScaling::Linear { factor } => inv_freq.divide(&c(factor)?),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings,
            } => {
                let old_len = original_max_position_embeddings as f64;
                let wavelen = c(2.0 * PI)?.divide(&inv_freq)?;
                let scaled = inv_freq.divide(&c(factor)?)?;
                // smooth = (old_len / wavelen - low) / (high - low): 0 at the
                // low-frequency end of the band, 1 at its high-frequency end.
                let smooth = c(old_len)?.divide(&wavelen)?.subtract(&c(low)?)?.divide(&c(high - low)?)?;
                let blended = c(1.0)?.subtract(&smooth)?.multiply(&scaled)?.add(&smooth.multiply(&inv_freq)?)?;
                let is_high = wavelen.compare(Cmp::Lt, &c(old_len / high)?)?;
                let is_low = wavelen.compare(Cmp::Gt, &c(old_len / low)?)?;
                is_high.select(&inv_freq, &is_low.select(&scaled, &blended)?)
            }
            RopeScaling::Yarn { factor, .. } => {
                let (low, high) = self.scaling.yarn_ramp(d, self.freq_base).expect("the scaling is yarn");
                // ramp = clamp((i - low) / (high - low), 0, 1); inv_freq · (1 - ramp) + inv_freq / factor · ramp.
                let ramp = i.subtract(&c(low)?)?.divide(&c(high - low)?)?;
                let ramp = ramp.clamp(&c(0.0)?, &c(1.0)?)?;
                let kept = inv_freq.multiply(&c(1.0)?.subtract(&ramp)?)?;
                kept.add(&inv_freq.divide(&c(factor)?)?.multiply(&ramp)?)
            }
        }
    }

    /// The rotation at `positions` (`[seq]`, integer): angles
    /// `θ[p, i] = positions[p] · inv_freq[i]`, and their cos and sin.
    pub fn at<'t>(&self, positions: &Tensor<'t>) -> Result<Rotation<'t>> {
        self.rotation(positions, self.inv_freq(positions.tracer)?)
    }

    /// [`Rope::at`] with frequency `i` divided by `freq_factors[i]`
    /// (`[head_dim/2]` f32): llama.cpp's `rope_freqs.weight`, which Llama 3.1
    /// GGUFs carry in place of rope-scaling keys (`ggml_rope_ext`'s
    /// `freq_factors`).
    pub fn at_with_freq_factors<'t>(&self, positions: &Tensor<'t>, freq_factors: &Tensor<'t>) -> Result<Rotation<'t>> {
        let half = f32_type(&[self.head_dim / 2]);
        if freq_factors.ty != half {
            return fail("rope", format!("frequency factors must be {half}, found {}", freq_factors.ty));
        }
        self.rotation(positions, self.inv_freq(positions.tracer)?.divide(freq_factors)?)
    }

    fn rotation<'t>(&self, positions: &Tensor<'t>, inv_freq: Tensor<'t>) -> Result<Rotation<'t>> {
        let seq = match positions.ty.shape.as_slice() {
            [seq] if positions.ty.dtype.is_integer() => *seq,
            _ => return fail("rope", format!("positions must be an integer [seq] tensor, found {}", positions.ty)),
        };
        let grid = [seq, self.head_dim / 2];
        let p = positions.convert(DType::F32)?.broadcast_in_dim(&grid, &[0])?;
        let theta = p.multiply(&inv_freq.broadcast_in_dim(&grid, &[1])?)?;
        let (sin, cos) = sin_cos(&theta)?;
        if let RopeScaling::Yarn { attention_factor, .. } = self.scaling {
            let factor = splat(&cos, attention_factor)?;
            return Ok(Rotation { cos: cos.multiply(&factor)?, sin: sin.multiply(&factor)?, style: self.style });
        }
        Ok(Rotation { cos, sin, style: self.style })
    }
}

impl<'t> Rotation<'t> {
    /// Rotates each feature pair `(a, b)` of `x` (`[..., seq, head_dim]`) by
    /// its angle, in f32: `(a cos θ - b sin θ, a sin θ + b cos θ)`.
    ///
    /// HF `apply_rotary_pos_emb` (`x·cos + rotate_half(x)·sin`) for
    /// [`RopeStyle::NeoX`]; llama.cpp `ggml_rope_ext` for both styles.
    pub fn apply(&self, x: &Tensor<'t>) -> Result<Tensor<'t>> {
        const OP: &str = "rope";
        let (seq, half) = (self.cos.ty.shape[0], self.cos.ty.shape[1]);
        let rank = x.ty.rank();
        require_float(OP, x)?;
        if rank < 2 || x.ty.shape[rank - 2] != seq || x.ty.shape[rank - 1] != 2 * half {
            return fail(OP, format!("x must be [..., seq={seq}, head_dim={}], found {}", 2 * half, x.ty));
        }
        let x32 = to_f32(x)?;
        // Each pair on its own axis, [..., seq, 2, half] (NeoX) or [...,
        // seq, half, 2] (interleaved): y = x·cos + reverse(x)·(∓sin) along
        // it, one element-wise expression with no slices or concatenation
        // (which IREE runs as two copies per rotated tensor).
        let (pair_axis, half_axis, pair_dims) = match self.style {
            RopeStyle::NeoX => (rank - 1, rank, [2, half]),
            RopeStyle::Interleaved => (rank, rank - 1, [half, 2]),
        };
        let mut pairs_shape = x.ty.shape[..rank - 1].to_vec();
        pairs_shape.extend(pair_dims);
        let pairs = x32.reshape(&pairs_shape)?;
        let table = |t: &Tensor<'t>| t.broadcast_in_dim(&pairs_shape, &[rank - 2, half_axis]);
        // -1 for the pair's first feature, +1 for its second.
        let tracer = x.tracer;
        let sign = tracer.iota(0, f32_type(&[2]))?.multiply(&tracer.constant(2.0, f32_type(&[2]))?)?;
        let sign =
            sign.subtract(&tracer.constant(1.0, f32_type(&[2]))?)?.broadcast_in_dim(&pairs_shape, &[pair_axis])?;
        let x_cos = pairs.multiply(&table(&self.cos)?)?;
        let swapped_sin = pairs.reverse(&[pair_axis])?.multiply(&table(&self.sin)?.multiply(&sign)?)?;
        let y = x_cos.add(&swapped_sin)?.reshape(&x.ty.shape)?;
        cast(&y, x.ty.dtype)
    }
}

/// π/2 in four parts (Cody-Waite): the first three have 5 significant bits,
/// so `k·PIO2[i]` is exact in f32 for `|k| < 2^19` and each subtraction in
/// `θ - k·π/2` is exact too; the last is the f32 nearest the remainder.
const PIO2: [f64; 4] = [1.5625, 8.30078125e-3, -4.5299530029296875e-6, 7.549790126404332e-8];

/// Cephes `sinf` on `|r| <= π/4`: `sin r = r + r·z·P(z)`, `z = r²`.
const SIN_COEFFS: [f64; 3] = [-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4];
/// Cephes `cosf` on `|r| <= π/4`: `cos r = 1 - z/2 + z²·Q(z)`.
const COS_COEFFS: [f64; 3] = [4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5];

/// `c[0] + z·(c[1] + z·(c[2] + ...))`, by Horner's rule.
fn polynomial<'t>(z: &Tensor<'t>, coeffs: &[f64]) -> Result<Tensor<'t>> {
    let (&last, rest) =
        coeffs.split_last().ok_or_else(|| TraceError::Op { op: "polynomial", message: "no coefficients".into() })?;
    rest.iter().rev().try_fold(splat(z, last)?, |acc, &c| acc.multiply(z)?.add(&splat(z, c)?))
}

/// `(sin θ, cos θ)` of an f32 tensor, composed rather than `sine`/`cosine`
/// so that its accuracy is ours and not the backend's (IREE's f32 sine drifts
/// from libm by 1e-6 already at |θ| ~ 100, and rotary angles reach the
/// context length): `θ = k·π/2 + r` with `|r| <= π/4` (Cody-Waite), then
/// Cephes `sinf`/`cosf` minimax polynomials in `r` (about 1 ulp there),
/// rotated by the quadrant `k mod 4`. Within 1e-7 of the exact values for
/// `|θ| < 2^19·π/2 ≈ 823000` (rotary angles up to that many positions);
/// beyond, `k·π/2` rounds and the error grows to 1e-1 by 4e6.
pub fn sin_cos<'t>(theta: &Tensor<'t>) -> Result<(Tensor<'t>, Tensor<'t>)> {
    if theta.ty.dtype != DType::F32 {
        return fail("sin_cos", format!("expects f32, found {}", theta.ty));
    }
    let c = |v: f64| splat(theta, v);
    let int = |v: f64| theta.tracer.constant(v, theta.ty.with_dtype(DType::I32));
    // k = round(θ · 2/π), halves away from zero (convert truncates).
    let half = theta.compare(Cmp::Lt, &c(0.0)?)?.select(&c(-0.5)?, &c(0.5)?)?;
    let k = theta.multiply(&c(FRAC_2_PI)?)?.add(&half)?.convert(DType::I32)?;
    let kf = k.convert(DType::F32)?;
    let r = PIO2.iter().try_fold(theta.clone(), |r, &part| r.subtract(&kf.multiply(&c(part)?)?))?;
    let z = r.multiply(&r)?;
    let s = polynomial(&z, &SIN_COEFFS)?.multiply(&z)?.multiply(&r)?.add(&r)?;
    let cs =
        polynomial(&z, &COS_COEFFS)?.multiply(&z)?.multiply(&z)?.subtract(&z.multiply(&c(0.5)?)?)?.add(&c(1.0)?)?;
    // quadrant = k mod 4 in 0..4; integer divide truncates, so fold negatives up.
    let four = int(4.0)?;
    let rem4 = |n: &Tensor<'t>| n.subtract(&n.divide(&four)?.multiply(&four)?);
    let quadrant = rem4(&rem4(&k)?.add(&four)?)?;
    let is = |q: f64| quadrant.compare(Cmp::Eq, &int(q)?);
    let (q1, q2, q3) = (is(1.0)?, is(2.0)?, is(3.0)?);
    let pick = |v: [&Tensor<'t>; 4]| q1.select(v[1], &q2.select(v[2], &q3.select(v[3], v[0])?)?);
    let (neg_s, neg_c) = (s.negate()?, cs.negate()?);
    Ok((pick([&s, &cs, &neg_s, &neg_c])?, pick([&cs, &neg_s, &neg_c, &s])?))
}

/// Scaled dot-product attention with grouped-query heads:
/// `softmax(cap(q·kᵀ·scale) masked) · v`, per head, q head `h` reading kv
/// head `h / (heads / kv_heads)`.
///
/// Shapes: `q [..., heads, seq, hd]`, `k [..., kv_heads, kv_seq, hd]`,
/// `v [..., kv_heads, kv_seq, hd_v]` with the same leading (batch) dims;
/// `mask` is i1 (true = attend), broadcast against the trailing dims of the
/// scores `[..., heads, seq, kv_seq]` (usually `[seq, kv_seq]`). Result:
/// `[..., heads, seq, hd_v]`. Logits are soft-capped (Gemma 2) before the
/// mask, and masked and normalized in f32. With `sinks [heads]` (gpt-oss),
/// each head's softmax has one more logit, `sinks[h]`, whose probability is
/// dropped: `p_t = exp(s_t) / (Σ exp(s) + exp(sink))`.
///
/// HF `eager_attention_forward` (its `repeat_kv` is a batch over kv heads
/// here, nothing is copied), llama.cpp `build_attn_mha`.
pub fn attention<'t>(
    q: &Tensor<'t>,
    k: &Tensor<'t>,
    v: &Tensor<'t>,
    mask: Option<&Tensor<'t>>,
    scale: f64,
    soft_cap: Option<f64>,
    sinks: Option<&Tensor<'t>>,
) -> Result<Tensor<'t>> {
    const OP: &str = "attention";
    let rank = q.ty.rank();
    let shapes = || format!("q {}, k {}, v {}", q.ty, k.ty, v.ty);
    if rank < 3 || k.ty.rank() != rank || v.ty.rank() != rank {
        return fail(OP, format!("q, k, v must be [..., heads, seq, head_dim] of one rank >= 3: {}", shapes()));
    }
    let nb = rank - 3; // leading batch dims
    let (heads, kv_heads, kv_seq) = (q.ty.shape[nb], k.ty.shape[nb], k.ty.shape[nb + 1]);
    let batch_matches = q.ty.shape[..nb] == k.ty.shape[..nb] && k.ty.shape[..nb] == v.ty.shape[..nb];
    if !batch_matches || q.ty.shape[rank - 1] != k.ty.shape[rank - 1] || k.ty.shape[..nb + 2] != v.ty.shape[..nb + 2] {
        return fail(OP, format!("batch dims, q/k head_dim and k/v [kv_heads, kv_seq] must agree: {}", shapes()));
    }
    if kv_heads == 0 || heads % kv_heads != 0 {
        return fail(OP, format!("heads {heads} is not a multiple of kv_heads {kv_heads}: {}", shapes()));
    }
    let mut scores_shape = q.ty.shape.clone();
    scores_shape[rank - 1] = kv_seq;
    if let Some(m) = mask {
        let fits = m.ty.dtype == DType::I1
            && m.ty.rank() <= rank
            && m.ty.shape.iter().rev().zip(scores_shape.iter().rev()).all(|(&a, &b)| a == 1 || a == b);
        if !fits {
            let scores = TensorType::new(scores_shape, DType::F32);
            return fail(OP, format!("mask must be i1 and broadcast to the scores {scores}, found {}", m.ty));
        }
    }
    if let Some(s) = sinks {
        if s.ty.shape != [heads] {
            return fail(OP, format!("sinks must be [heads] = [{heads}], found {}", s.ty));
        }
    }
    if k.ty.is_dynamic() && !q.ty.is_dynamic() && k.ty.shape[..=nb].iter().all(|&d| d == 1) {
        return single_kv_head_attention(q, k, v, mask, scale, soft_cap, sinks);
    }
    // Grouped-query heads without repeating k and v (HF `repeat_kv`): q
    // [..., heads, s, d] is viewed as [..., kv_heads, groups, s, d] and each
    // kv head is a batch of the products, so the caches are read in place
    // instead of copied `groups` times per step.
    let groups = heads / kv_heads;
    let grouped = |x: &Tensor<'t>| -> Result<Tensor<'t>> {
        let mut shape = x.ty.shape.clone();
        shape.splice(nb..=nb, [kv_heads, groups]);
        x.reshape(&shape)
    };
    let q = grouped(q)?;
    let g = rank + 1; // rank of the grouped q, scores and output
                      // A `?` query length goes before the groups, away from the softmax's
                      // reduced dim: IREE 3.13 makes a slow dispatch of a softmax whose `?`
                      // dim sits next to the reduced one with the mask fused in (a 64-token
                      // SmolLM2 layer at 4096 positions: 433 ms, against 20 with `?` outer;
                      // research/serving.md §0 rows A and C). `swap` is its own inverse.
    let seq_outer = q.ty.shape[g - 2] == DYNAMIC;
    let swap: Vec<usize> = (0..g)
        .map(|d| {
            if d == nb + 1 {
                nb + 2
            } else if d == nb + 2 {
                nb + 1
            } else {
                d
            }
        })
        .collect();
    let outer = |x: Tensor<'t>| if seq_outer { x.transpose(&swap) } else { Ok(x) };
    let q = outer(q)?;
    let batch: Vec<usize> = (0..=nb).collect(); // batch dims and kv heads
    let dims = |lhs_contract: usize, rhs_contract: usize| DotDimensions {
        lhs_batching_dimensions: batch.clone(),
        rhs_batching_dimensions: batch.clone(),
        lhs_contracting_dimensions: vec![lhs_contract],
        rhs_contracting_dimensions: vec![rhs_contract],
    };
    // scores[.., j, g, s, t] = Σ_d q[.., j, g, s, d] · k[.., j, t, d]
    let scores = to_f32(&q.dot_general(k, dims(g - 1, rank - 1))?)?;
    let mut scores = scores.multiply(&splat(&scores, scale)?)?;
    if let Some(cap) = soft_cap {
        scores = scores.soft_cap(cap)?;
    }
    if let Some(m) = mask {
        // A mask over the heads dim (rank >= 3) is grouped as q is.
        let m = match m.ty.rank() {
            r if r >= 3 => {
                let lead = &scores_shape[rank - r..];
                let trailing: Vec<usize> = (0..r).collect();
                grouped_mask(&m.broadcast_in_dim(lead, &trailing)?, r - 3, kv_heads, groups)?
            }
            _ => m.clone(),
        };
        // Broadcast in the grouped layout, then laid out as the scores are.
        let mut grouped_scores = scores.ty.shape.clone();
        if seq_outer {
            grouped_scores.swap(nb + 1, nb + 2);
        }
        let trailing: Vec<usize> = (g - m.ty.rank()..g).collect();
        let m = outer(m.broadcast_in_dim(&grouped_scores, &trailing)?)?;
        scores = m.select(&scores, &splat(&scores, f32::MIN as f64)?)?;
    }
    let probs = match sinks {
        // Each head's sink over its grouped position: [kv_heads, groups],
        // laid out as the scores are, then broadcast over the queries.
        Some(s) => {
            let rows = &scores.ty.shape[..g - 1];
            let groups_at = if seq_outer { nb + 2 } else { nb + 1 };
            let s = to_f32(s)?.reshape(&[kv_heads, groups])?.broadcast_in_dim(rows, &[nb, groups_at])?;
            softmax_with_sink(&scores, &s)?
        }
        None => scores.softmax(g - 1)?,
    };
    let probs = cast(&probs, v.ty.dtype)?;
    // out[.., j, g, s, e] = Σ_t probs[.., j, g, s, t] · v[.., j, t, e]
    let out = outer(probs.dot_general(v, dims(g - 1, rank - 2))?)?;
    let mut shape = out.ty.shape.clone();
    shape.splice(nb..nb + 2, [heads]);
    out.reshape(&shape)
}

/// [`attention`] where every batch dim and the kv heads are 1 and the keys
/// are `?` long (one kv head, decode over the filled cache), as plain
/// matrix products: `q [heads·seq, hd] · k [kv_seq, hd]ᵀ` (masked as the
/// scores would be), then `· v [kv_seq, hd_v]`. IREE 3.13 rewrites a dot_general whose batch dims are
/// all 1 through a `stablehlo.reshape` without them, which a `?` dim makes
/// invalid ("must be statically shaped").
fn single_kv_head_attention<'t>(
    q: &Tensor<'t>,
    k: &Tensor<'t>,
    v: &Tensor<'t>,
    mask: Option<&Tensor<'t>>,
    scale: f64,
    soft_cap: Option<f64>,
    sinks: Option<&Tensor<'t>>,
) -> Result<Tensor<'t>> {
    let rank = q.ty.rank();
    let (hd, hd_v, kv_seq) = (q.ty.shape[rank - 1], v.ty.shape[rank - 1], k.ty.shape[rank - 2]);
    let rows = q.ty.num_elements() / hd.max(1);
    let scores =
        to_f32(&q.reshape(&[rows, hd])?.dot_general(&k.reshape(&[kv_seq, hd])?, DotDimensions::contracting(1, 1))?)?;
    let mut scores = scores.multiply(&splat(&scores, scale)?)?;
    if let Some(cap) = soft_cap {
        scores = scores.soft_cap(cap)?;
    }
    if let Some(m) = mask {
        // Over the scores' [.., heads, seq, kv_seq], then as their rows.
        let mut shape = q.ty.shape.clone();
        shape[rank - 1] = kv_seq;
        let trailing: Vec<usize> = (rank - m.ty.rank()..rank).collect();
        let m = m.broadcast_in_dim(&shape, &trailing)?.reshape(&[rows, kv_seq])?;
        scores = m.select(&scores, &splat(&scores, f32::MIN as f64)?)?;
    }
    let probs = match sinks {
        // Rows are heads-major: head h's sink over its `seq` rows.
        Some(s) => {
            let (heads, seq) = (q.ty.shape[rank - 3], q.ty.shape[rank - 2]);
            let s = to_f32(s)?.broadcast_in_dim(&[heads, seq], &[0])?.reshape(&[rows])?;
            softmax_with_sink(&scores, &s)?
        }
        None => scores.softmax(1)?,
    };
    let probs = cast(&probs, v.ty.dtype)?;
    let out = probs.dot_general(&v.reshape(&[kv_seq, hd_v])?, DotDimensions::contracting(1, 0))?;
    let mut shape = q.ty.shape.clone();
    shape[rank - 1] = hd_v;
    out.reshape(&shape)
}

/// The softmax over the last dim of f32 `x` with one more logit per row,
/// `sink` (`x`'s shape without its last dim), left out of the result.
fn softmax_with_sink<'t>(x: &Tensor<'t>, sink: &Tensor<'t>) -> Result<Tensor<'t>> {
    let last = x.ty.rank() - 1;
    let max = x.reduce(ReduceKind::Max, &[last])?.maximum(sink)?;
    let e = x.subtract(&keep_dim(&max, &x.ty, last)?)?.exp()?;
    let sum = e.reduce(ReduceKind::Sum, &[last])?.add(&sink.subtract(&max)?.exp()?)?;
    e.divide(&keep_dim(&sum, &x.ty, last)?)
}

/// `m [..., heads, s, t]` (heads at `dim`) as `[..., kv_heads, groups, s, t]`.
fn grouped_mask<'t>(m: &Tensor<'t>, dim: usize, kv_heads: usize, groups: usize) -> Result<Tensor<'t>> {
    let mut shape = m.ty.shape.clone();
    shape.splice(dim..=dim, [kv_heads, groups]);
    m.reshape(&shape)
}

/// Sizes of the decoder-block example: tiny, so compile and run take ~2 s.
mod block {
    pub const HIDDEN: usize = 32;
    pub const HEADS: usize = 4;
    pub const KV_HEADS: usize = 2;
    pub const HEAD_DIM: usize = 8;
    pub const FFN: usize = 64;
    pub const SEQ: usize = 5;
    pub const EPS: f64 = 1e-5;
    pub const FREQ_BASE: f64 = 10000.0;
}

/// A llama-style decoder block over `x [seq, hidden]` at `positions [seq]`,
/// with GGUF tensor names (`blk.0.attn_q.weight`, stored `[out, in]`):
///
/// ```text
/// h = x + W_o · attention(rope(W_q · n), rope(W_k · n), W_v · n, causal)   n = rms_norm(x)
/// y = h + W_down · (silu(W_gate · m) * W_up · m)                           m = rms_norm(h)
/// ```
fn decoder_block<'t>(x: &Tensor<'t>, positions: &Tensor<'t>) -> Result<Tensor<'t>> {
    use block::*;
    let t = x.tracer;
    let seq = x.ty.shape[0];
    let weight = |name: &str, shape: &[usize]| t.param(&format!("blk.0.{name}.weight"), f32_type(shape));
    // [seq, n·hd] -> [n, seq, hd]
    let split_heads = |y: Tensor<'t>, n: usize| y.reshape(&[seq, n, HEAD_DIM])?.transpose(&[1, 0, 2]);

    let n = x.rms_norm(Some(&weight("attn_norm", &[HIDDEN])?), EPS)?;
    let rotation = Rope::new(HEAD_DIM, FREQ_BASE, RopeStyle::Interleaved).at(positions)?;
    let q = rotation.apply(&split_heads(n.linear(&weight("attn_q", &[HEADS * HEAD_DIM, HIDDEN])?)?, HEADS)?)?;
    let k = rotation.apply(&split_heads(n.linear(&weight("attn_k", &[KV_HEADS * HEAD_DIM, HIDDEN])?)?, KV_HEADS)?)?;
    let v = split_heads(n.linear(&weight("attn_v", &[KV_HEADS * HEAD_DIM, HIDDEN])?)?, KV_HEADS)?;
    let mask = causal_mask(t, seq, seq, 0)?;
    let a = attention(&q, &k, &v, Some(&mask), 1.0 / (HEAD_DIM as f64).sqrt(), None, None)?;
    let a = a.transpose(&[1, 0, 2])?.reshape(&[seq, HEADS * HEAD_DIM])?;
    let h = x.add(&a.linear(&weight("attn_output", &[HIDDEN, HEADS * HEAD_DIM])?)?)?;

    let m = h.rms_norm(Some(&weight("ffn_norm", &[HIDDEN])?), EPS)?;
    let gate = m.linear(&weight("ffn_gate", &[FFN, HIDDEN])?)?.silu()?;
    let up = m.linear(&weight("ffn_up", &[FFN, HIDDEN])?)?;
    h.add(&gate.multiply(&up)?.linear(&weight("ffn_down", &[HIDDEN, FFN])?)?)
}

type Example = for<'t> fn(&'t Tracer) -> Result<Vec<Tensor<'t>>>;

/// One small traced graph per composite, for `kiln example NAME` and the
/// lit tests that FileCheck their lowering and check them against IREE.
pub fn examples() -> Vec<(&'static str, Graph)> {
    let list: [(&'static str, Example); 15] = [
        ("rms_norm", |t| {
            let x = t.input("x", f32_type(&[3, 8]))?;
            let w = t.param("norm.weight", f32_type(&[8]))?;
            Ok(vec![x.rms_norm(Some(&w), 1e-6)?])
        }),
        // A prompt's embeddings into the first norm, whose rows are summed
        // in runs of 16 ([`mean`]).
        ("rms_norm_of_rows", |t| {
            let ids = t.input("ids", TensorType::new([DYNAMIC], DType::I32))?;
            let table = t.param("token_embd.weight", f32_type(&[16, 64]))?;
            let w = t.param("norm.weight", f32_type(&[64]))?;
            Ok(vec![table.gather(&ids)?.rms_norm(Some(&w), 1e-6)?])
        }),
        ("layer_norm", |t| {
            let x = t.input("x", f32_type(&[3, 8]))?;
            let w = t.param("norm.weight", f32_type(&[8]))?;
            let b = t.param("norm.bias", f32_type(&[8]))?;
            Ok(vec![x.layer_norm(Some(&w), Some(&b), 1e-5)?])
        }),
        ("softmax", |t| Ok(vec![t.input("x", f32_type(&[3, 8]))?.softmax(1)?])),
        ("silu", |t| Ok(vec![t.input("x", f32_type(&[2, 8]))?.silu()?])),
        ("gelu_tanh", |t| Ok(vec![t.input("x", f32_type(&[2, 8]))?.gelu_tanh()?])),
        ("soft_cap", |t| Ok(vec![t.input("x", f32_type(&[2, 8]))?.soft_cap(0.5)?])),
        ("argmax", |t| Ok(vec![t.input("x", f32_type(&[3, 8]))?.argmax(1)?])),
        ("causal_mask", |t| {
            let offset = t.input("q_offset", TensorType::new([], DType::I32))?;
            Ok(vec![causal_mask(t, 4, 6, &offset)?])
        }),
        ("sliding_window_mask", |t| Ok(vec![sliding_window_mask(t, 6, 6, 0, 3)?])),
        ("rope_interleaved", |t| rope_example(t, Rope::new(8, 10000.0, RopeStyle::Interleaved))),
        ("rope_neox", |t| rope_example(t, Rope::new(8, 10000.0, RopeStyle::NeoX))),
        ("rope_llama3", |t| {
            let scaling = RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 100,
            };
            rope_example(t, Rope::new(8, 10000.0, RopeStyle::NeoX).with_scaling(scaling))
        }),
        ("attention_gqa", |t| {
            let q = t.input("q", f32_type(&[4, 5, 8]))?;
            let k = t.input("k", f32_type(&[2, 5, 8]))?;
            let v = t.input("v", f32_type(&[2, 5, 8]))?;
            let mask = causal_mask(t, 5, 5, 0)?;
            Ok(vec![attention(&q, &k, &v, Some(&mask), 1.0 / 8f64.sqrt(), None, None)?])
        }),
        ("decoder_block", |t| {
            let x = t.input("x", f32_type(&[block::SEQ, block::HIDDEN]))?;
            let positions = t.input("positions", TensorType::new([block::SEQ], DType::I32))?;
            Ok(vec![decoder_block(&x, &positions)?])
        }),
    ];
    list.into_iter()
        .map(|(name, build)| {
            let t = Tracer::new("main");
            let graph = build(&t).and_then(|outputs| t.finish(&outputs.iter().collect::<Vec<_>>()));
            (name, graph.expect("the examples trace fixed shapes the composites accept"))
        })
        .collect()
}

/// `x [2, 5, 8]` (heads, seq, head_dim) rotated at `positions [5]`.
fn rope_example<'t>(t: &'t Tracer, rope: Rope) -> Result<Vec<Tensor<'t>>> {
    let x = t.input("x", f32_type(&[2, 5, 8]))?;
    let positions = t.input("positions", TensorType::new([5], DType::I32))?;
    Ok(vec![rope.at(&positions)?.apply(&x)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check_graph, CheckOptions, CheckReport};
    use crate::graph::{text, Op, DYNAMIC};
    use crate::interp::{self, tests::val, Value};
    use crate::iree::Iree;
    use std::collections::HashMap;

    fn run(graph: &Graph, inputs: &[Value], params: &[(&str, Value)]) -> Vec<Vec<f64>> {
        let params: HashMap<String, Value> = params.iter().map(|(n, v)| (n.to_string(), v.clone())).collect();
        interp::run(graph, inputs, &params).unwrap().iter().map(Value::to_f64_vec).collect()
    }

    fn assert_close(got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "element {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}"
            );
        }
    }

    /// `check_graph` through IREE; prints each output's errors (see with `--nocapture`).
    fn check_with_iree(graph: &Graph, rtol: f64, atol: f64) -> CheckReport {
        let dir = tempfile::tempdir().unwrap();
        let options = CheckOptions { rtol, atol, ..Default::default() };
        let report = check_graph(graph, &Iree::for_tests(), dir.path(), &options).unwrap();
        for out in &report.outputs {
            eprintln!("{out}");
        }
        assert!(report.ok(), "{:#?}", report.outputs.iter().map(|o| o.to_string()).collect::<Vec<_>>());
        report
    }

    fn rms_norm_f64(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
        x.chunks(w.len())
            .flat_map(|row| {
                let inv_rms = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64 + eps).sqrt();
                row.iter().zip(w).map(move |(v, w)| v * inv_rms * w)
            })
            .collect()
    }

    const XS: [f32; 8] = [1.0, 2.0, 3.0, 4.0, -0.5, 0.25, 2.0, -1.0];
    const WS: [f32; 4] = [0.5, 1.0, -1.0, 2.0];

    #[test]
    fn rms_norm_matches_f64_with_and_without_weight() {
        let t = Tracer::new("main");
        let x = t.input("x", f32_type(&[2, 4])).unwrap();
        let w = t.param("norm.weight", f32_type(&[4])).unwrap();
        let outs =
            [x.rms_norm(Some(&w), 1e-5).unwrap(), x.rms_norm(None, 1e-5).unwrap(), x.gemma_rms_norm(&w, 1e-5).unwrap()];
        let g = t.finish(&outs.iter().collect::<Vec<_>>()).unwrap();
        let got =
            run(&g, &[val("tensor<2x4xf32>", XS.to_vec())], &[("norm.weight", val("tensor<4xf32>", WS.to_vec()))]);
        let x64: Vec<f64> = XS.iter().map(|&v| v.into()).collect();
        let w64: Vec<f64> = WS.iter().map(|&v| v.into()).collect();
        assert_close(&got[0], &rms_norm_f64(&x64, &w64, 1e-5), 1e-6);
        assert_close(&got[1], &rms_norm_f64(&x64, &[1.0; 4], 1e-5), 1e-6);
        let one_plus_w: Vec<f64> = w64.iter().map(|w| 1.0 + w).collect();
        assert_close(&got[2], &rms_norm_f64(&x64, &one_plus_w, 1e-5), 1e-6);
    }

    #[test]
    fn norms_of_bf16_compute_in_f32_and_round_once() {
        let t = Tracer::new("main");
        let x = t.input("x", TensorType::new([2, 4], DType::BF16)).unwrap();
        let y = x.rms_norm(None, 1e-5).unwrap();
        assert_eq!(y.ty, x.ty);
        let g = t.finish(&[&y]).unwrap();
        // Every reduce runs in f32; the result converts back once.
        assert!(g.nodes().iter().filter(|n| matches!(n.op, Op::Reduce { .. })).all(|n| n.ty.dtype == DType::F32));
        let xs: Vec<half::bf16> = XS.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let got = run(&g, &[val("tensor<2x4xbf16>", xs)], &[]);
        let want = rms_norm_f64(&XS.map(f64::from), &[1.0; 4], 1e-5);
        // One bf16 rounding: half an ulp is 2^-9 relative.
        assert_close(&got[0], &want, 2f64.powi(-9));
    }

    #[test]
    fn layer_norm_matches_f64() {
        let t = Tracer::new("main");
        let x = t.input("x", f32_type(&[2, 4])).unwrap();
        let w = t.param("norm.weight", f32_type(&[4])).unwrap();
        let b = t.param("norm.bias", f32_type(&[4])).unwrap();
        let y = x.layer_norm(Some(&w), Some(&b), 1e-5).unwrap();
        let g = t.finish(&[&y]).unwrap();
        let bs = [0.1f32, -0.2, 0.0, 1.0];
        let params =
            [("norm.weight", val("tensor<4xf32>", WS.to_vec())), ("norm.bias", val("tensor<4xf32>", bs.to_vec()))];
        let got = run(&g, &[val("tensor<2x4xf32>", XS.to_vec())], &params);
        let want: Vec<f64> = XS
            .chunks(4)
            .flat_map(|row| {
                let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / 4.0;
                let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / 4.0;
                (0..4).map(move |i| {
                    (f64::from(row[i]) - mean) / (var + 1e-5).sqrt() * f64::from(WS[i]) + f64::from(bs[i])
                })
            })
            .collect();
        assert_close(&got[0], &want, 1e-6);
    }

    #[test]
    fn softmax_rows_sum_to_one_and_survive_large_logits() {
        let t = Tracer::new("main");
        let x = t.input("x", f32_type(&[2, 3])).unwrap();
        let g = t.finish(&[&x.softmax(1).unwrap(), &x.softmax(0).unwrap()]).unwrap();
        // Row 1 is row 0 shifted by 1000: exp(1000) overflows without the max-subtract.
        let got = run(&g, &[val("tensor<2x3xf32>", vec![1.0f32, 2.0, 3.0, 1001.0, 1002.0, 1003.0])], &[]);
        let z: f64 = (1..=3).map(|i| f64::from(i).exp()).sum();
        let row: Vec<f64> = (1..=3).map(|i| f64::from(i).exp() / z).collect();
        assert_close(&got[0], &[row.clone(), row].concat(), 1e-6);
        for r in got[0].chunks(3) {
            assert!((r.iter().sum::<f64>() - 1.0).abs() < 1e-6);
        }
        // Along dim 0 the large column entry takes all the mass.
        assert_close(&got[1], &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0], 1e-6);
    }

    #[test]
    fn activations_match_their_formulas() {
        let xs = [-3.0f32, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0];
        let t = Tracer::new("main");
        let x = t.input("x", f32_type(&[7])).unwrap();
        let outs = [x.silu().unwrap(), x.gelu_tanh().unwrap(), x.soft_cap(2.0).unwrap()];
        let g = t.finish(&outs.iter().collect::<Vec<_>>()).unwrap();
        let got = run(&g, &[val("tensor<7xf32>", xs.to_vec())], &[]);
        let x64 = xs.map(f64::from);
        let silu: Vec<f64> = x64.iter().map(|x| x / (1.0 + (-x).exp())).collect();
        let gelu: Vec<f64> =
            x64.iter().map(|x| 0.5 * x * (1.0 + ((2.0 / PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())).collect();
        let capped: Vec<f64> = x64.iter().map(|x| 2.0 * (x / 2.0).tanh()).collect();
        assert_close(&got[0], &silu, 1e-6);
        assert_close(&got[1], &gelu, 1e-6);
        assert_close(&got[2], &capped, 1e-6);
    }

    #[test]
    fn argmax_picks_the_first_maximum() {
        let t = Tracer::new("main");
        let x = t.input("x", f32_type(&[3, 4])).unwrap();
        let a = t.input("a", TensorType::new([5], DType::I32)).unwrap();
        let (rows, cols, ints) = (x.argmax(1).unwrap(), x.argmax(0).unwrap(), a.argmax(0).unwrap());
        assert_eq!((rows.ty.to_string(), ints.ty.to_string()), ("tensor<3xi32>".into(), "tensor<i32>".into()));
        let g = t.finish(&[&rows, &cols, &ints]).unwrap();
        let xs = vec![1.0f32, 3.0, 3.0, 2.0, 5.0, 5.0, 5.0, 5.0, -1.0, -2.0, f32::NAN, 7.0];
        let got = run(&g, &[val("tensor<3x4xf32>", xs), val("tensor<5xi32>", vec![-4, 9, 2, 9, 9])], &[]);
        assert_eq!(got[0], [1.0, 0.0, 2.0]); // ties -> first; NaN counts as the max
        assert_eq!(got[1], [1.0, 1.0, 2.0, 2.0]);
        assert_eq!(got[2], [1.0]);
    }

    fn mask_rows(m: &[f64], kv_len: usize) -> Vec<String> {
        m.chunks(kv_len).map(|r| r.iter().map(|&v| if v != 0.0 { '1' } else { '.' }).collect()).collect()
    }

    #[test]
    fn masks_are_exactly_the_triangle_and_the_band() {
        let t = Tracer::new("main");
        let offset = t.input("q_offset", TensorType::new([], DType::I32)).unwrap();
        let outs = [
            causal_mask(&t, 4, 4, 0).unwrap(),
            causal_mask(&t, 2, 5, 2).unwrap(),
            causal_mask(&t, 2, 5, &offset).unwrap(),
            sliding_window_mask(&t, 6, 6, 0, 3).unwrap(),
            sliding_window_mask(&t, 2, 6, &offset, 2).unwrap(),
        ];
        let g = t.finish(&outs.iter().collect::<Vec<_>>()).unwrap();
        let got = run(&g, &[val("tensor<i32>", vec![2])], &[]);
        assert_eq!(mask_rows(&got[0], 4), ["1...", "11..", "111.", "1111"]);
        assert_eq!(mask_rows(&got[1], 5), ["111..", "1111."]);
        assert_eq!(got[2], got[1]); // the same offset, as a graph value
        assert_eq!(mask_rows(&got[3], 6), ["1.....", "11....", "111...", ".111..", "..111.", "...111"]);
        assert_eq!(mask_rows(&got[4], 6), [".11...", "..11.."]);
    }

    /// HF's inv_freq in f64: `base^(-2i/d)`.
    fn inv_freq_f64(d: usize, base: f64) -> Vec<f64> {
        (0..d / 2).map(|i| base.powf(-2.0 * i as f64 / d as f64)).collect()
    }

    fn rope_graph(rope: Rope, shape: &[usize]) -> Graph {
        let t = Tracer::new("main");
        let x = t.input("x", f32_type(shape)).unwrap();
        let positions = t.input("positions", TensorType::new([shape[shape.len() - 2]], DType::I32)).unwrap();
        let y = rope.at(&positions).unwrap().apply(&x).unwrap();
        t.finish(&[&y]).unwrap()
    }

    fn seeded(ty: &str, seed: u64) -> Value {
        Value::random(&ty.parse().unwrap(), seed, 0..4)
    }

    #[test]
    fn rope_at_position_zero_is_the_identity() {
        for style in [RopeStyle::Interleaved, RopeStyle::NeoX] {
            let g = rope_graph(Rope::new(8, 10000.0, style), &[2, 3, 8]);
            let x = seeded("tensor<2x3x8xf32>", 1);
            let got = run(&g, &[x.clone(), val("tensor<3xi32>", vec![0, 0, 0])], &[]);
            assert_eq!(got[0], x.to_f64_vec(), "{style:?}");
        }
    }

    #[test]
    fn rope_rotates_each_pair_by_position_times_frequency() {
        let (d, p) = (8, 3);
        let x = seeded("tensor<1x8xf32>", 2);
        let xs = x.to_f64_vec();
        let freqs = inv_freq_f64(d, 10000.0);
        for (style, pair) in [(RopeStyle::Interleaved, [0, 1]), (RopeStyle::NeoX, [0, d / 2])] {
            let g = rope_graph(Rope::new(d, 10000.0, style), &[1, d]);
            let got = run(&g, &[x.clone(), val("tensor<1xi32>", vec![p])], &[]);
            let mut want = vec![0.0; d];
            for (i, f) in freqs.iter().enumerate() {
                // Pair i is (2i, 2i+1) interleaved, (i, i + d/2) NeoX.
                let (a, b) = if pair[1] == 1 { (2 * i, 2 * i + 1) } else { (i, i + d / 2) };
                let (sin, cos) = (f * p as f64).sin_cos();
                want[a] = xs[a] * cos - xs[b] * sin;
                want[b] = xs[a] * sin + xs[b] * cos;
            }
            assert_close(&got[0], &want, 1e-6);
        }
    }

    #[test]
    fn interleaved_rope_is_neox_rope_under_the_pair_permutation() {
        // llama.cpp's GGUF converter permutes Q/K rows so that NeoX pair
        // (i, i + d/2) lands on (2i, 2i+1); rope must commute with that.
        let (d, x) = (8, seeded("tensor<2x3x8xf32>", 3));
        let positions = val("tensor<3xi32>", vec![0, 5, 17]);
        let to_interleaved = |v: &[f64]| -> Vec<f64> {
            v.chunks(d).flat_map(|h| (0..d / 2).flat_map(move |i| [h[i], h[i + d / 2]])).collect()
        };
        let neox =
            run(&rope_graph(Rope::new(d, 10000.0, RopeStyle::NeoX), &[2, 3, 8]), &[x.clone(), positions.clone()], &[]);
        let xi =
            val("tensor<2x3x8xf32>", to_interleaved(&x.to_f64_vec()).iter().map(|&v| v as f32).collect::<Vec<_>>());
        let inter = run(&rope_graph(Rope::new(d, 10000.0, RopeStyle::Interleaved), &[2, 3, 8]), &[xi, positions], &[]);
        assert_eq!(inter[0], to_interleaved(&neox[0]));
        assert_ne!(inter[0], neox[0]);
    }

    #[test]
    fn inv_freq_matches_hf_for_every_scaling() {
        let (d, base) = (16, 500000.0);
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let hf = inv_freq_f64(d, base);
        // HF `_compute_llama3_parameters`, in f64.
        let hf_llama3: Vec<f64> = hf
            .iter()
            .map(|&f| {
                let wavelen = 2.0 * PI / f;
                let smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
                if wavelen < 8192.0 / 4.0 {
                    f
                } else if wavelen > 8192.0 {
                    f / 8.0
                } else {
                    (1.0 - smooth) * f / 8.0 + smooth * f
                }
            })
            .collect();
        // All three regions occur.
        assert!(hf_llama3.iter().zip(&hf).any(|(a, b)| a == b));
        assert!(hf_llama3.iter().zip(&hf).any(|(a, b)| *a == b / 8.0));
        assert!(hf_llama3.iter().zip(&hf).any(|(a, b)| *a != *b && *a != b / 8.0));
        let t = Tracer::new("main");
        let rope = Rope::new(d, base, RopeStyle::NeoX);
        let outs = [
            rope.inv_freq(&t).unwrap(),
            rope.with_scaling(RopeScaling::Linear { factor: 4.0 }).inv_freq(&t).unwrap(),
            rope.with_scaling(llama3).inv_freq(&t).unwrap(),
        ];
        let got = run(&t.finish(&outs.iter().collect::<Vec<_>>()).unwrap(), &[], &[]);
        // f32 exp(-(2i/d)·ln base) is a few ulp (2^-24 relative each) off.
        let tol = 8.0 * 2f64.powi(-24);
        assert_close(&got[0], &hf, tol);
        assert_close(&got[1], &hf.iter().map(|f| f / 4.0).collect::<Vec<_>>(), tol);
        assert_close(&got[2], &hf_llama3, tol);
    }

    #[test]
    fn sin_cos_is_accurate_over_many_periods() {
        // Small angles, many periods either side of 0, and rotary angles of
        // long contexts (up to 800k positions at frequency 1).
        let far = (0..200).map(|i| 8192.0 + i as f32 * 3999.3);
        let thetas: Vec<f32> = (-400..=400).map(|i| i as f32 * 0.37).chain([1e-8, -1e-30]).chain(far).collect();
        let t = Tracer::new("main");
        let theta = t.input("theta", f32_type(&[thetas.len()])).unwrap();
        let (sin, cos) = sin_cos(&theta).unwrap();
        let g = t.finish(&[&sin, &cos]).unwrap();
        let got = run(&g, &[val(&format!("tensor<{}xf32>", thetas.len()), thetas.clone())], &[]);
        let worst = |got: &[f64], f: fn(f64) -> f64| {
            crate::max_abs_diff(got, &thetas.iter().map(|&th| f(th.into())).collect::<Vec<_>>())
        };
        let (ws, wc) = (worst(&got[0], f64::sin), worst(&got[1], f64::cos));
        assert!(ws < 1.5e-7 && wc < 1.5e-7, "max error: sin {ws:e}, cos {wc:e}");
    }

    /// Attention in f64 with HF's `repeat_kv` head mapping.
    fn attention_f64(
        (q, k, v): (&[f64], &[f64], &[f64]),
        (heads, kv_heads, seq, kv_seq, d): (usize, usize, usize, usize, usize),
        allowed: impl Fn(usize, usize) -> bool,
        scale: f64,
        cap: Option<f64>,
        sinks: Option<&[f64]>,
    ) -> Vec<f64> {
        let mut out = vec![0.0; heads * seq * d];
        for h in 0..heads {
            let kh = h / (heads / kv_heads);
            for s in 0..seq {
                let logits: Vec<f64> = (0..kv_seq)
                    .map(|j| {
                        let dot: f64 = (0..d).map(|e| q[(h * seq + s) * d + e] * k[(kh * kv_seq + j) * d + e]).sum();
                        let l = cap.map_or(dot * scale, |c| c * (dot * scale / c).tanh());
                        if allowed(s, j) {
                            l
                        } else {
                            f64::from(f32::MIN)
                        }
                    })
                    .collect();
                let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sink = sinks.map_or(0.0, |sinks| (sinks[h] - max).exp());
                let z: f64 = logits.iter().map(|l| (l - max).exp()).sum::<f64>() + sink;
                for j in 0..kv_seq {
                    let p = (logits[j] - max).exp() / z;
                    for e in 0..d {
                        out[(h * seq + s) * d + e] += p * v[(kh * kv_seq + j) * d + e];
                    }
                }
            }
        }
        out
    }

    #[test]
    fn gqa_attention_matches_f64_with_mask_and_soft_cap() {
        let t = Tracer::new("main");
        let q = t.input("q", f32_type(&[4, 3, 4])).unwrap();
        let k = t.input("k", f32_type(&[2, 5, 4])).unwrap();
        let v = t.input("v", f32_type(&[2, 5, 4])).unwrap();
        let mask = causal_mask(&t, 3, 5, 2).unwrap();
        let plain = attention(&q, &k, &v, Some(&mask), 0.5, None, None).unwrap();
        let capped = attention(&q, &k, &v, Some(&mask), 0.5, Some(0.3), None).unwrap();
        // With a batch dim of 1 the same numbers come out.
        fn b<'t>(x: &Tensor<'t>) -> Tensor<'t> {
            let mut s = x.ty.shape.clone();
            s.insert(0, 1);
            x.reshape(&s).unwrap()
        }
        let batched = attention(&b(&q), &b(&k), &b(&v), Some(&mask), 0.5, None, None).unwrap();
        assert_eq!(plain.ty.to_string(), "tensor<4x3x4xf32>");
        let g = t.finish(&[&plain, &capped, &batched]).unwrap();
        let inputs = [seeded("tensor<4x3x4xf32>", 4), seeded("tensor<2x5x4xf32>", 5), seeded("tensor<2x5x4xf32>", 6)];
        let got = run(&g, &inputs, &[]);
        let [qs, ks, vs] = inputs.map(|v| v.to_f64_vec());
        let sizes = (4, 2, 3, 5, 4);
        let causal = |s: usize, j: usize| j <= s + 2;
        assert_close(&got[0], &attention_f64((&qs, &ks, &vs), sizes, causal, 0.5, None, None), 1e-6);
        assert_close(&got[1], &attention_f64((&qs, &ks, &vs), sizes, causal, 0.5, Some(0.3), None), 1e-6);
        assert_eq!(got[2], got[0]);
    }

    /// One kv head and keys of `?` positions (decode over a filled cache):
    /// plain matrix products, the same numbers as with a batch of one.
    #[test]
    fn single_kv_head_over_dynamic_keys_matches_f64() {
        let t = Tracer::new("main");
        let q = t.input("q", f32_type(&[3, 1, 4])).unwrap();
        let k = t.input("k", TensorType::new([1, DYNAMIC, 4], DType::F32)).unwrap();
        let v = t.input("v", TensorType::new([1, DYNAMIC, 2], DType::F32)).unwrap();
        let out = attention(&q, &k, &v, None, 0.5, Some(0.3), None).unwrap();
        assert_eq!(out.ty.to_string(), "tensor<3x1x2xf32>");
        let g = t.finish(&[&out]).unwrap();
        assert!(g.nodes().iter().all(|n| match &n.op {
            Op::DotGeneral(d) => d.lhs_batching_dimensions.is_empty(),
            _ => true,
        }));
        let inputs = [seeded("tensor<3x1x4xf32>", 7), seeded("tensor<1x5x4xf32>", 8), seeded("tensor<1x5x2xf32>", 9)];
        let got = run(&g, &inputs, &[]);
        let [qs, ks, vs] = inputs.map(|v| v.to_f64_vec());
        // attention_f64 takes one head dim for k and v: v padded to 4 wide.
        let v4: Vec<f64> = vs.chunks(2).flat_map(|r| [r[0], r[1], 0.0, 0.0]).collect();
        let want = attention_f64((&qs, &ks, &v4), (3, 1, 1, 5, 4), |_, _| true, 0.5, Some(0.3), None);
        let want: Vec<f64> = want.chunks(4).flat_map(|r| [r[0], r[1]]).collect();
        assert_close(&got[0], &want, 1e-6);
    }

    /// gpt-oss's sinks, one extra logit per head left out of the result:
    /// grouped heads with a static and a `?` query length (which lays the
    /// scores out otherwise), and one kv head over `?` keys.
    #[test]
    fn attention_sinks_match_f64() {
        let t = Tracer::new("main");
        let sinks = t.input("sinks", f32_type(&[4])).unwrap();
        let q = t.input("q", f32_type(&[4, 3, 4])).unwrap();
        let k = t.input("k", f32_type(&[2, 5, 4])).unwrap();
        let v = t.input("v", f32_type(&[2, 5, 4])).unwrap();
        let mask = causal_mask(&t, 3, 5, 2).unwrap();
        let grouped = attention(&q, &k, &v, Some(&mask), 0.5, None, Some(&sinks)).unwrap();
        let q_any = t.input("q_any", TensorType::new([4, DYNAMIC, 4], DType::F32)).unwrap();
        let mask_any = causal_mask(&t, DYNAMIC, 5, 2).unwrap();
        let outer = attention(&q_any, &k, &v, Some(&mask_any), 0.5, None, Some(&sinks)).unwrap();
        let k1 = t.input("k1", TensorType::new([1, DYNAMIC, 4], DType::F32)).unwrap();
        let single = attention(&q, &k1, &k1, None, 0.5, None, Some(&sinks)).unwrap();
        let g = t.finish(&[&grouped, &outer, &single]).unwrap();
        let inputs = [
            val("tensor<4xf32>", vec![0.5f32, -1.0, 2.0, 0.0]),
            seeded("tensor<4x3x4xf32>", 4),
            seeded("tensor<2x5x4xf32>", 5),
            seeded("tensor<2x5x4xf32>", 6),
            seeded("tensor<4x3x4xf32>", 4),
            // One `?` size per run: three keys, as q_any has three queries.
            seeded("tensor<1x3x4xf32>", 7),
        ];
        let got = run(&g, &inputs, &[]);
        let [sinks, qs, ks, vs, _, k1s] = inputs.map(|v| v.to_f64_vec());
        let causal = |s: usize, j: usize| j <= s + 2;
        let want = attention_f64((&qs, &ks, &vs), (4, 2, 3, 5, 4), causal, 0.5, None, Some(&sinks));
        assert_close(&got[0], &want, 1e-6);
        assert_close(&got[1], &want, 1e-6);
        let want = attention_f64((&qs, &k1s, &k1s), (4, 1, 3, 3, 4), |_, _| true, 0.5, None, Some(&sinks));
        assert_close(&got[2], &want, 1e-6);
        let plain = attention_f64((&qs, &ks, &vs), (4, 2, 3, 5, 4), causal, 0.5, None, None);
        assert!(plain.iter().zip(&got[0]).any(|(a, b)| (a - b).abs() > 1e-3), "the sinks change the output");
    }

    #[test]
    fn a_fully_masked_row_averages_v_instead_of_nan() {
        let t = Tracer::new("main");
        let q = t.input("q", f32_type(&[1, 2, 2])).unwrap();
        let kv = t.input("kv", f32_type(&[1, 2, 2])).unwrap();
        let mask = t.input("mask", TensorType::new([2, 2], DType::I1)).unwrap();
        let g = t.finish(&[&attention(&q, &kv, &kv, Some(&mask), 1.0, None, None).unwrap()]).unwrap();
        let kvs = vec![1.0f32, 2.0, 3.0, 6.0];
        let inputs = [
            val("tensor<1x2x2xf32>", vec![1.0f32; 4]),
            val("tensor<1x2x2xf32>", kvs),
            val("tensor<2x2xi1>", vec![false, false, true, false]),
        ];
        let got = run(&g, &inputs, &[]);
        assert_eq!(got[0], [2.0, 4.0, 1.0, 2.0]);
    }

    #[test]
    fn bad_arguments_fail_at_the_call_naming_op_and_shapes() {
        let t = Tracer::new("main");
        let x = t.input("x", f32_type(&[2, 4])).unwrap();
        let i = t.input("i", TensorType::new([2, 4], DType::I32)).unwrap();
        let w5 = t.param("norm.weight", f32_type(&[5])).unwrap();
        let err = |r: Result<Tensor<'_>>| r.unwrap_err().to_string();
        assert_eq!(
            err(x.rms_norm(Some(&w5), 1e-5)),
            "rms_norm: weight must be a float [4] for x tensor<2x4xf32>, found tensor<5xf32>"
        );
        assert_eq!(err(i.softmax(1)), "softmax: expects a float tensor, found tensor<2x4xi32>");
        assert_eq!(err(x.argmax(2)), "argmax: dim 2 is out of bounds for tensor<2x4xf32>");
        assert_eq!(err(x.soft_cap(0.0)), "soft_cap: cap must be positive and finite, found 0");
        assert!(
            err(causal_mask(&t, 2, 4, &x)).starts_with("causal_mask: q_offset must be tensor<i32> or tensor<1xi32>")
        );
        assert_eq!(
            err(sliding_window_mask(&t, 2, 2, 0, 0)),
            "sliding_window_mask: window must be in 1..=i32::MAX, found 0"
        );

        let pos = t.input("positions", TensorType::new([3], DType::I32)).unwrap();
        assert_eq!(
            err(Rope::new(7, 1e4, RopeStyle::NeoX).inv_freq(&t)),
            "rope: head_dim must be even and positive, found 7"
        );
        let rotation = Rope::new(4, 1e4, RopeStyle::NeoX).at(&pos).unwrap();
        assert_eq!(err(rotation.apply(&x)), "rope: x must be [..., seq=3, head_dim=4], found tensor<2x4xf32>");
        assert!(err(Rope::new(4, 1e4, RopeStyle::NeoX).at(&x).map(|r| r.cos)).starts_with("rope: positions must be"));

        let q = t.input("q", f32_type(&[3, 2, 4])).unwrap();
        let kv = t.input("kv", f32_type(&[2, 2, 4])).unwrap();
        assert_eq!(
            err(attention(&q, &kv, &kv, None, 1.0, None, None)),
            "attention: heads 3 is not a multiple of kv_heads 2: q tensor<3x2x4xf32>, k tensor<2x2x4xf32>, v tensor<2x2x4xf32>"
        );
        let q4 = t.input("q4", f32_type(&[4, 2, 4])).unwrap();
        let bad_mask = t.input("m", TensorType::new([3, 2], DType::I1)).unwrap();
        assert_eq!(
            err(attention(&q4, &kv, &kv, Some(&bad_mask), 1.0, None, None)),
            "attention: mask must be i1 and broadcast to the scores tensor<4x2x2xf32>, found tensor<3x2xi1>"
        );
    }

    #[test]
    fn examples_cover_every_composite_and_print_parse_back() {
        let names: Vec<&str> = examples().iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "rms_norm",
                "rms_norm_of_rows",
                "layer_norm",
                "softmax",
                "silu",
                "gelu_tanh",
                "soft_cap",
                "argmax",
                "causal_mask",
                "sliding_window_mask",
                "rope_interleaved",
                "rope_neox",
                "rope_llama3",
                "attention_gqa",
                "decoder_block"
            ]
        );
        for (name, g) in examples() {
            let printed = text::print(&g);
            assert_eq!(text::parse(&printed).unwrap(), g, "{name}");
        }
    }

    // IREE numerics: few graphs with many outputs, to keep iree-compile calls down.

    #[test]
    fn iree_agrees_on_norms_activations_softmax_and_argmax() {
        let t = Tracer::new("main");
        let x = t.input("x", f32_type(&[3, 8])).unwrap();
        let w = t.param("norm.weight", f32_type(&[8])).unwrap();
        let b = t.param("norm.bias", f32_type(&[8])).unwrap();
        let outs = [
            x.rms_norm(Some(&w), 1e-6).unwrap(),
            x.gemma_rms_norm(&w, 1e-6).unwrap(),
            x.layer_norm(Some(&w), Some(&b), 1e-5).unwrap(),
            x.softmax(1).unwrap(),
            x.softmax(0).unwrap(),
            x.silu().unwrap(),
            x.gelu_tanh().unwrap(),
            x.soft_cap(0.5).unwrap(),
            x.argmax(1).unwrap(),
            x.argmax(0).unwrap(),
        ];
        check_with_iree(&t.finish(&outs.iter().collect::<Vec<_>>()).unwrap(), 1e-5, 1e-6);
    }

    #[test]
    fn iree_agrees_on_masks_rope_and_attention() {
        let t = Tracer::new("main");
        let offset = t.input("q_offset", TensorType::new([], DType::I32)).unwrap();
        let positions = t.input("positions", TensorType::new([5], DType::I32)).unwrap();
        let x = t.input("x", f32_type(&[2, 5, 8])).unwrap();
        let (q, k, v) = (
            t.input("q", f32_type(&[4, 5, 8])).unwrap(),
            t.input("k", f32_type(&[2, 5, 8])).unwrap(),
            t.input("v", f32_type(&[2, 5, 8])).unwrap(),
        );
        let theta = t.input("theta", f32_type(&[64])).unwrap();
        let rope = Rope::new(8, 10000.0, RopeStyle::NeoX);
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 100,
        };
        let mask = causal_mask(&t, 5, 5, 0).unwrap();
        // Angles over many periods: inputs are in [-1, 1).
        let (sin, cos) = sin_cos(&theta.multiply(&splat(&theta, 300.0).unwrap()).unwrap()).unwrap();
        let outs = [
            causal_mask(&t, 4, 6, &offset).unwrap(),
            sliding_window_mask(&t, 4, 6, &offset, 2).unwrap(),
            Rope { style: RopeStyle::Interleaved, ..rope }.at(&positions).unwrap().apply(&x).unwrap(),
            rope.at(&positions).unwrap().apply(&x).unwrap(),
            rope.with_scaling(llama3).at(&positions).unwrap().apply(&x).unwrap(),
            rope.with_scaling(RopeScaling::Linear { factor: 2.0 }).at(&positions).unwrap().apply(&x).unwrap(),
            sin,
            cos,
            attention(&q, &k, &v, Some(&mask), 1.0 / 8f64.sqrt(), None, None).unwrap(),
            attention(&q, &k, &v, Some(&mask), 1.0 / 8f64.sqrt(), Some(0.5), None).unwrap(),
        ];
        check_with_iree(&t.finish(&outs.iter().collect::<Vec<_>>()).unwrap(), 1e-5, 1e-6);
    }

    #[test]
    fn iree_agrees_on_a_decoder_block() {
        let (_, g) = examples().into_iter().find(|(n, _)| *n == "decoder_block").unwrap();
        assert_eq!(g.params().count(), 9);
        check_with_iree(&g, 1e-4, 1e-5);
    }
}
