#!/usr/bin/env python3
"""A Qwen3-MoE checkpoint that transformers saved, converted to GGUF as
llama.cpp's converter writes it, for kiln's GGUF path of the Qwen3-MoE
test (src/export/transformers_tests.rs).

    qwen3moe_to_gguf.py HF_DIR OUT.gguf

Run by transformers_reference.py, in the venv its docstring describes.
HF_DIR holds config.json and model.safetensors of a `Qwen3MoeForCausalLM`
whose layers are all sparse (GGUF has no `mlp_only_layers`).

What llama.cpp's converter does (`Qwen2MoeModel`/`Qwen3MoeModel` in
conversion/qwen.py, on top of `TextModel.set_gguf_parameters`), and so this:
- tensor names from gguf-py's own table (`gguf.get_tensor_name_map`);
- the per-expert `mlp.experts.E.{gate,up,down}_proj` that `save_pretrained`
  writes stacked into one `[E, F, H]` (`[E, H, F]` for down) tensor each,
  `ffn_{gate,up,down}_exps`;
- keys `expert_count`, `expert_used_count`, `expert_feed_forward_length`
  besides the qwen3 ones.
The expert stacks are Q8_0 (as `--outtype q8_0` writes them), everything
else F32 (exact: transformers saved bf16). The reference model's expert
weights are Q8_0-exact (transformers_reference.py), so the GGUF holds the
same numbers. No tokenizer: the test model has none.
"""

import json
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

Q8_0 = gguf.GGMLQuantizationType.Q8_0


def convert(hf_dir: Path, out: Path) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(hf_dir / "model.safetensors")
    n_layers, n_experts = config["num_hidden_layers"], config["num_local_experts"]
    assert config["mlp_only_layers"] == [] and config["decoder_sparse_step"] == 1, "GGUF has no dense layers"
    assert config["norm_topk_prob"], "llama.cpp's qwen3moe always renormalizes the chosen experts' weights"

    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3MOE])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("kiln tiny qwen3moe")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_expert_count(n_experts)
    w.add_expert_used_count(config["num_experts_per_tok"])
    w.add_expert_feed_forward_length(config["moe_intermediate_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3MOE, n_layers)
    experts = {}
    for name, tensor in tensors.items():
        parts = name.split(".")
        if parts[3:5] == ["mlp", "experts"]:
            # model.layers.L.mlp.experts.E.PROJ.weight
            experts.setdefault((int(parts[2]), parts[6]), {})[int(parts[5])] = tensor
            continue
        new = names.get_name(name, try_suffixes=(".weight",))
        assert new is not None, f"no GGUF name for {name}"
        w.add_tensor(new, tensor.to(torch.float32).numpy())
    for (layer, proj), stack in sorted(experts.items()):
        assert sorted(stack) == list(range(n_experts)), (layer, proj)
        data = torch.stack([stack[e] for e in range(n_experts)]).to(torch.float32).numpy()
        new = names.get_name(f"model.layers.{layer}.mlp.experts.{proj}", try_suffixes=(".weight",))
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
