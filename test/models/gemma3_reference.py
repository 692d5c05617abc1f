#!/usr/bin/env python3
"""Gemma 3 logits in numpy, from a GGUF checkpoint dequantized by gguf-py, as
an independent reference for kiln's front-end (src/models/gemma3.rs).

    gemma3_reference.py CKPT OUT_FILE TOKEN_ID [TOKEN_ID ...]

CKPT is a .gguf path or `gemma3` (see test/checkpoints.py). Writes the
logits of every position, `[seq, vocab]` little-endian f32, to OUT_FILE.

Written from HF transformers' `modeling_gemma3.py` (float64 throughout), with
the GGUF conventions of llama.cpp's converter: norm weights already hold
HF's `1 + w`, Q/K rows in HF order (rotate_half RoPE), tied head.
"""

import sys
from pathlib import Path

import numpy as np
from gguf import quants

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "quant"))
from checkpoints import resolve  # noqa: E402
from dequant_checkpoint import FastReader  # noqa: E402


def field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


def main():
    ckpt, out, ids = resolve(sys.argv[1]), Path(sys.argv[2]), [int(a) for a in sys.argv[3:]]
    r = FastReader(ckpt)
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "gemma3"
    tensors = {t.name: t for t in r.tensors}

    def w(name):
        t = tensors[name]
        return quants.dequantize(t.data, t.tensor_type).astype(np.float64)

    n_layer = int(field(r, "gemma3.block_count"))
    hidden = int(field(r, "gemma3.embedding_length"))
    heads = int(field(r, "gemma3.attention.head_count"))
    kv_heads = int(field(r, "gemma3.attention.head_count_kv"))
    hd = int(field(r, "gemma3.attention.key_length"))
    eps = float(field(r, "gemma3.attention.layer_norm_rms_epsilon"))
    base_global = float(field(r, "gemma3.rope.freq_base"))
    window = int(field(r, "gemma3.attention.sliding_window"))
    base_local = 10000.0
    seq = len(ids)

    def rms_norm(x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight

    def rope(x, base):  # x [n, seq, hd], HF rotate_half
        inv_freq = 1.0 / base ** (np.arange(0, hd, 2) / hd)
        theta = np.arange(seq)[:, None] * inv_freq[None, :]
        cos, sin = np.cos(np.concatenate([theta, theta], -1)), np.sin(np.concatenate([theta, theta], -1))
        half = hd // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def gelu_tanh(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    embd = w("token_embd.weight")
    x = embd[ids] * np.sqrt(hidden)
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    causal = j <= i
    sliding = causal & (i - j < window)
    for layer in range(n_layer):
        p = f"blk.{layer}."
        is_local = (layer + 1) % 6 != 0
        h = rms_norm(x, w(p + "attn_norm.weight"))
        q = (h @ w(p + "attn_q.weight").T).reshape(seq, heads, hd).transpose(1, 0, 2)
        k = (h @ w(p + "attn_k.weight").T).reshape(seq, kv_heads, hd).transpose(1, 0, 2)
        v = (h @ w(p + "attn_v.weight").T).reshape(seq, kv_heads, hd).transpose(1, 0, 2)
        q, k = rms_norm(q, w(p + "attn_q_norm.weight")), rms_norm(k, w(p + "attn_k_norm.weight"))
        base = base_local if is_local else base_global
        q, k = rope(q, base), rope(k, base)
        k, v = np.repeat(k, heads // kv_heads, axis=0), np.repeat(v, heads // kv_heads, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        scores = np.where(sliding if is_local else causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        a = (probs @ v).transpose(1, 0, 2).reshape(seq, heads * hd) @ w(p + "attn_output.weight").T
        x = x + rms_norm(a, w(p + "post_attention_norm.weight"))
        h = rms_norm(x, w(p + "ffn_norm.weight"))
        f = gelu_tanh(h @ w(p + "ffn_gate.weight").T) * (h @ w(p + "ffn_up.weight").T)
        x = x + rms_norm(f @ w(p + "ffn_down.weight").T, w(p + "post_ffw_norm.weight"))
    logits = rms_norm(x, w("output_norm.weight")) @ embd.T
    out.write_bytes(np.ascontiguousarray(logits, dtype="<f4").tobytes())


if __name__ == "__main__":
    main()
