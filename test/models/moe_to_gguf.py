#!/usr/bin/env python3
"""A mixture-of-experts checkpoint that transformers saved (Qwen3-MoE,
Mixtral or gpt-oss), converted to GGUF as llama.cpp's converter writes it, for kiln's
GGUF paths of the MoE tests (src/export/transformers_tests.rs).

    moe_to_gguf.py HF_DIR OUT.gguf

Run by transformers_reference.py, in the venv its docstring describes.
HF_DIR holds config.json and model.safetensors, experts one tensor each
(as `save_pretrained` writes them), of a `Qwen3MoeForCausalLM` whose layers
are all sparse (GGUF has no `mlp_only_layers`) or a `MixtralForCausalLM`.

What llama.cpp's converter does (conversion/qwen.py `Qwen2MoeModel`,
`Qwen3MoeModel`; conversion/llama.py `LlamaModel` for Mixtral, on top of
`TextModel.set_gguf_parameters`), and so this:
- tensor names from gguf-py's own table (`gguf.get_tensor_name_map`);
- each layer's per-expert tensors stacked into one `[E, F, H]` (`[E, H, F]`
  for down) tensor each, `ffn_{gate,up,down}_exps` (Mixtral's `w1`, `w3`,
  `w2`);
- Qwen3-MoE: arch `qwen3moe`, keys `expert_count`, `expert_used_count`,
  `expert_feed_forward_length` besides the qwen3 ones;
- Mixtral: arch `llama`, its Q and K rows permuted for llama.cpp's
  adjacent-pair RoPE (`LlamaModel.permute`), keys `expert_count` and
  `expert_used_count` (no `expert_feed_forward_length`: the experts are
  `feed_forward_length` wide).
- gpt-oss (conversion/gpt_oss.py `GptOssModel`): arch `gpt-oss`, the
  experts' `gate_up_proj` `[E, H, 2F]` transposed and split into its even
  (gate) and odd (up) columns, `down_proj` transposed, their biases split
  likewise; `self_attn.sinks` as `attn_sinks.weight`; keys
  `expert_feed_forward_length`, `attention.sliding_window` and the yarn
  scaling (`rope.scaling.*`).
The expert stacks are Q8_0 (as `--outtype q8_0` writes them; gpt-oss's
MXFP4, as its converter keeps them), everything else F32 (exact:
transformers saved bf16). The reference models' expert weights are exact in
that type (transformers_reference.py), so the GGUF holds the same numbers.
No tokenizer: the test models have none.
"""

import json
import re
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

Q8_0 = gguf.GGMLQuantizationType.Q8_0
MXFP4 = gguf.GGMLQuantizationType.MXFP4

# model.layers.L.<experts>.E.<proj>.weight
EXPERT = re.compile(r"model\.layers\.(\d+)\.(mlp\.experts|block_sparse_moe\.experts)\.(\d+)\.(\w+)\.weight")


def permute(w, n_head):
    """llama.cpp's `LlamaModel.permute`: HF rows -> GGUF rows."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def quantized(data, qtype, name):
    """`data` packed as `qtype`, which must hold it exactly."""
    packed = gguf.quants.quantize(data, qtype)
    assert np.array_equal(gguf.quants.dequantize(packed, qtype), data), f"{name}: not exact in {qtype.name}"
    return packed


def convert_gpt_oss(config, tensors, out: Path) -> None:
    """gpt-oss as conversion/gpt_oss.py writes it, the experts MXFP4."""
    arch = gguf.MODEL_ARCH.GPT_OSS
    n_layers = config["num_hidden_layers"]
    rope = config["rope_parameters"]
    assert rope["rope_type"] == "yarn" and config["layer_types"][:2] == ["sliding_attention", "full_attention"]
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("kiln tiny gpt_oss")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_expert_count(config["num_local_experts"])
    w.add_expert_used_count(config["num_experts_per_tok"])
    w.add_expert_feed_forward_length(config["intermediate_size"])
    w.add_sliding_window(config["sliding_window"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    names = gguf.get_tensor_name_map(arch, n_layers)
    expert = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?")
    for name, tensor in tensors.items():
        data = tensor.to(torch.float32).numpy()
        m = expert.fullmatch(name)
        if m is None:
            new = names.get_name(name, try_suffixes=(".weight", ".bias"))
            assert new is not None, f"no GGUF name for {name}"
            w.add_tensor(new + (".weight" if name.endswith("sinks") else ""), data)
            continue
        layer, proj, bias = m.groups()
        if not bias:
            data = np.ascontiguousarray(data.swapaxes(1, 2))  # [E, out, in]
        parts = {"gate": data[:, ::2], "up": data[:, 1::2]} if proj == "gate_up_proj" else {"down": data}
        for part, x in parts.items():
            new = f"blk.{layer}.ffn_{part}_exps.{'bias' if bias else 'weight'}"
            x = np.ascontiguousarray(x)
            if bias:
                w.add_tensor(new, x)
            else:
                w.add_tensor(new, quantized(x, MXFP4, new), raw_dtype=MXFP4)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def convert(hf_dir: Path, out: Path) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(hf_dir / "model.safetensors")
    if config["model_type"] == "gpt_oss":
        return convert_gpt_oss(config, tensors, out)
    n_layers, n_experts = config["num_hidden_layers"], config["num_local_experts"]
    mixtral = config["model_type"] == "mixtral"
    arch = gguf.MODEL_ARCH.LLAMA if mixtral else gguf.MODEL_ARCH.QWEN3MOE
    if not mixtral:
        assert config["mlp_only_layers"] == [] and config["decoder_sparse_step"] == 1, "GGUF has no dense layers"
        assert config["norm_topk_prob"], "llama.cpp's qwen3moe always renormalizes the chosen experts' weights"
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"kiln tiny {config['model_type']}")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if mixtral:
        w.add_vocab_size(config["vocab_size"])
        w.add_rope_dimension_count(config["hidden_size"] // heads)
    else:
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
        w.add_expert_feed_forward_length(config["moe_intermediate_size"])
    w.add_expert_count(n_experts)
    w.add_expert_used_count(config["num_experts_per_tok"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    names = gguf.get_tensor_name_map(arch, n_layers)
    experts = {}
    for name, tensor in tensors.items():
        m = EXPERT.fullmatch(name)
        if m:
            layer, group, e, proj = m.groups()
            experts.setdefault((int(layer), group, proj), {})[int(e)] = tensor
            continue
        data = tensor.to(torch.float32).numpy()
        if mixtral and name.endswith("self_attn.q_proj.weight"):
            data = permute(data, heads)
        if mixtral and name.endswith("self_attn.k_proj.weight"):
            data = permute(data, kv_heads)
        new = names.get_name(name, try_suffixes=(".weight",))
        assert new is not None, f"no GGUF name for {name}"
        w.add_tensor(new, data)
    for (layer, group, proj), stack in sorted(experts.items()):
        assert sorted(stack) == list(range(n_experts)), (layer, proj)
        data = torch.stack([stack[e] for e in range(n_experts)]).to(torch.float32).numpy()
        # The name llama.cpp's converter gives the stack before mapping it.
        merged = f"layers.{layer}.feed_forward.experts.{proj}" if mixtral else f"model.layers.{layer}.{group}.{proj}"
        new = names.get_name(merged, try_suffixes=(".weight",))
        assert new is not None and "_exps" in new, f"no GGUF stack name for {merged}: {new}"
        w.add_tensor(new + ".weight", quantized(data, Q8_0, new), raw_dtype=Q8_0)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
