#!/usr/bin/env python3
"""A Gemma 3n checkpoint that transformers saved, converted to GGUF as
llama.cpp's converter writes it, for kiln's GGUF path of the Gemma 3n
tests (src/export/transformers_tests.rs).

    gemma3n_to_gguf.py HF_DIR OUT.gguf

Run by transformers_reference.py (it needs torch, for the sparsity scale
below), in the venv its docstring describes. HF_DIR holds config.json and
model.safetensors of a `Gemma3nForCausalLM`.

What llama.cpp's converter does (`Gemma3NModel` in conversion/gemma.py, on
top of `Gemma3Model` and `TextModel.set_gguf_parameters`), and so this:
- tensor names from gguf-py's own table (`gguf.get_tensor_name_map`);
  `altup.correct_output_scale` gets a `.weight` suffix first;
- the three `altup_projections` and `altup_unembed_projections` stacked
  into one `[3, D, D]` tensor each;
- norm weights as stored (no `1 + w`: Gemma 3n's RMS norm scales by `w`);
- `activation_sparsity_scale` as `Normal(0, 1).icdf(p)` in f32 per layer
  (-inf where p = 0), `attention.sliding_window_pattern` one bool per layer,
  `feed_forward_length` one number per layer;
- `--outtype f32`: every tensor F32 (exact: transformers saved bf16).
  Not bf16, whose tensors IREE 3.13's GGUF reader refuses ("GGML tensor
  type 30 not supported").
No tokenizer: the test model has none, and kiln's export needs none.
"""

import json
import sys
from pathlib import Path

import gguf
import torch
from safetensors.torch import load_file


def convert(hf_dir: Path, out: Path) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(hf_dir / "model.safetensors")
    n_layers = config["num_hidden_layers"]
    assert config["altup_num_inputs"] == 4, "llama.cpp's converter supports only 4 altup inputs"

    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GEMMA3N])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("kiln tiny gemma3n")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    rope = config["rope_parameters"]
    w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_final_logit_softcapping(config["final_logit_softcapping"])
    w.add_sliding_window(config["sliding_window"])
    w.add_altup_active_idx(config["altup_active_idx"])
    w.add_altup_num_inputs(config["altup_num_inputs"])
    w.add_embedding_length_per_layer_input(config["hidden_size_per_layer_input"])
    w.add_shared_kv_layers(config["num_kv_shared_layers"])
    normal = torch.distributions.normal.Normal(0, 1)
    w.add_activation_sparsity_scale(
        [normal.icdf(torch.tensor(p, dtype=torch.float32)).item() for p in config["activation_sparsity_pattern"]]
    )
    w.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3N, n_layers)
    stacks = {"model.altup_projections.": [], "model.altup_unembed_projections.": []}
    for name, tensor in tensors.items():
        stack = next((s for s in stacks if name.startswith(s)), None)
        if stack is not None:
            stacks[stack].append((int(name[len(stack) :].split(".")[0]), tensor))
            continue
        if name.endswith("_scale"):
            name += ".weight"
        add(w, names, name, tensor)
    for stack, parts in stacks.items():
        assert [i for i, _ in sorted(parts, key=lambda p: p[0])] == [0, 1, 2], stack
        add(w, names, stack + "weight", torch.stack([t for _, t in sorted(parts, key=lambda p: p[0])]))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def add(w: gguf.GGUFWriter, names: gguf.TensorNameMap, hf_name: str, tensor: torch.Tensor) -> None:
    new = names.get_name(hf_name, try_suffixes=(".weight",))
    assert new is not None, f"no GGUF name for {hf_name}"
    w.add_tensor(new, tensor.to(torch.float32).numpy())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
