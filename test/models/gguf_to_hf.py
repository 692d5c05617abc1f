#!/usr/bin/env python3
"""A llama-family GGUF turned back into a Hugging Face checkpoint, for
kiln's safetensors front-end test (src/models/hf.rs).

    gguf_to_hf.py CKPT OUT_DIR

CKPT is a .gguf path or `smollm2` (see test/checkpoints.py). Writes
OUT_DIR/model.safetensors (every tensor dequantized to f32 by gguf-py, under
its HF name), OUT_DIR/config.json (HF keys, from the GGUF metadata) and
OUT_DIR/tokenizer.json + tokenizer_config.json (transformers' conversion of
the GGUF's tokenizer, with test/tokenizer/reference.py's pre-tokenizer fix).

llama.cpp's converter (convert_hf_to_gguf.py, `LlamaModel.permute`) reorders
the rows of attn_q and attn_k so that RoPE rotates adjacent pairs; HF
checkpoints keep the `rotate_half` order. This script undoes that, so the
result is what the HF model would hold (up to the GGUF's quantization).
"""

import json
import sys
from pathlib import Path

import numpy as np
from gguf import quants
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "quant"))
sys.path.insert(0, str(HERE.parent / "tokenizer"))
from checkpoints import resolve  # noqa: E402
from dequant_checkpoint import FastReader  # noqa: E402
from reference import build, read_metadata, split_digits_first  # noqa: E402

# GGUF name -> HF name; `{i}` is the block index.
NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
}


def hf_name(name):
    parts = name.split(".")
    if parts[0] == "blk":
        i, key = parts[1], ".".join(["blk", "{i}"] + parts[2:])
        return NAMES[key].format(i=i)
    return NAMES[name]


def permute(w, n_head):
    """llama.cpp's `LlamaModel.permute`: HF rows -> GGUF rows."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    """The inverse of `permute`: GGUF rows -> HF rows. Within each head,
    GGUF row 2j + p came from HF row p * hd/2 + j."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


def main():
    ckpt, out = resolve(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    r = FastReader(ckpt)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    assert arch == "llama", f"{ckpt}: general.architecture is {arch}, not llama"

    def meta(key, default=None):
        return field(r, f"llama.{key}") if f"llama.{key}" in r.fields else default

    heads = int(meta("attention.head_count"))
    kv_heads = int(meta("attention.head_count_kv", heads))

    # The inverse really is one: check on an index matrix of Q's shape.
    probe = np.arange(2 * heads * 8 * 3).reshape(heads * 16, 3)
    assert np.array_equal(permute(unpermute(probe, heads), heads), probe)
    assert np.array_equal(unpermute(permute(probe, heads), heads), probe)

    tensors = {}
    for t in r.tensors:
        w = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        # gguf-py gives the row-major shape, [rows, cols] for a matrix.
        w = w.reshape([int(n) for n in reversed(t.shape)])
        if t.name.endswith(".attn_q.weight"):
            w = unpermute(w, heads)
        elif t.name.endswith(".attn_k.weight"):
            w = unpermute(w, kv_heads)
        tensors[hf_name(t.name)] = np.ascontiguousarray(w)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})

    embed = tensors["model.embed_tokens.weight"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": int(meta("embedding_length")),
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "vocab_size": int(embed.shape[0]),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "max_position_embeddings": int(meta("context_length", 2048)),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    metadata = read_metadata(ckpt)
    tokenizer = build(metadata)
    split_digits_first(tokenizer, metadata)
    tokenizer.save(str(out / "tokenizer.json"))
    tokens = metadata["tokenizer.ggml.tokens"]
    special = {
        name: tokens[metadata[key]]
        for name, key in [("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id")]
        if key in metadata
    }
    tokenizer_config = {**special, "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False))}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


if __name__ == "__main__":
    main()
