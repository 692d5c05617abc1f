#!/usr/bin/env python3
"""A mixture-of-experts checkpoint that transformers saved (Qwen3-MoE or
Mixtral), converted to GGUF as llama.cpp's converter writes it, for kiln's
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
The expert stacks are Q8_0 (as `--outtype q8_0` writes them), everything
else F32 (exact: transformers saved bf16). The reference models' expert
weights are Q8_0-exact (transformers_reference.py), so the GGUF holds the
same numbers. No tokenizer: the test models have none.
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

# model.layers.L.<experts>.E.<proj>.weight
EXPERT = re.compile(r"model\.layers\.(\d+)\.(mlp\.experts|block_sparse_moe\.experts)\.(\d+)\.(\w+)\.weight")


def permute(w, n_head):
    """llama.cpp's `LlamaModel.permute`: HF rows -> GGUF rows."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert(hf_dir: Path, out: Path) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(hf_dir / "model.safetensors")
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
        packed = gguf.quants.quantize(data, Q8_0)
        assert np.array_equal(gguf.quants.dequantize(packed, Q8_0), data), f"{new}: not Q8_0-exact"
        w.add_tensor(new + ".weight", packed, raw_dtype=Q8_0)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
