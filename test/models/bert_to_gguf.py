#!/usr/bin/env python3
"""An HF BERT checkpoint directory to GGUF as llama.cpp's converter writes it
(conversion/bert.py, `BertModel`): arch `bert`, its keys, tensor names and
WordPiece vocabulary, f32 tensors (`--outtype f32`).

    bert_to_gguf.py HF_DIR OUT.gguf

Needs gguf, numpy and safetensors (all in `make setup`'s .venv). The
pooling comes from sentence-transformers' modules.json and Pooling config
as llama.cpp's `_try_set_pooling_type` reads them; the vocabulary, when the
directory has a tokenizer.json, is spelled as its `phantom`: "[...]" as it
is, "##x" as "x", a word-initial "x" as "▁x".
"""

import json
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

# HF name -> GGUF name, llama.cpp's tensor map for BERT.
BLOCK = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
}
TOP = {
    "embeddings.word_embeddings": "token_embd", "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types", "embeddings.LayerNorm": "token_embd_norm",
}
# Dropped, as the converter drops them.
SKIP = ("embeddings.position_ids", "pooler.", "cls.")


def pooling_type(d):
    modules = d / "modules.json"
    if not modules.exists():
        return None
    for m in json.loads(modules.read_text()):
        if m["type"].endswith("Pooling"):
            c = json.loads((d / m["path"] / "config.json").read_text())
            if c.get("pooling_mode_mean_tokens"):
                return gguf.PoolingType.MEAN
            if c.get("pooling_mode_cls_token"):
                return gguf.PoolingType.CLS
            if c.get("pooling_mode_lasttoken"):
                return gguf.PoolingType.LAST
            raise SystemExit(f"{d}: only mean, cls and last pooling are supported")
    return None


def phantom(t):
    if t.startswith("[") and t.endswith("]"):
        return t
    return t[2:] if t.startswith("##") else "\u2581" + t


def vocabulary(d, vocab_size):
    """The tokens and their types, from tokenizer.json, or a stand-in of
    letters when there is none (a test model)."""
    path = d / "tokenizer.json"
    if path.exists():
        t = json.loads(path.read_text())
        by_id = {i: tok for tok, i in t["model"]["vocab"].items()}
        special = {a["id"] for a in t.get("added_tokens", []) if a.get("special")}
        vocab = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    else:
        letters = [chr(ord("a") + i) for i in range((vocab_size - 5) // 2)]
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + letters + ["##" + c for c in letters]
        vocab += [f"[unused{i}]" for i in range(vocab_size - len(vocab))]
        special = set(range(5))
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(vocab_size)]
    return vocab, types


def convert(d, out):
    d = Path(d)
    config = json.loads((d / "config.json").read_text())
    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name(d.name)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_head_count(config["num_attention_heads"])
    w.add_layer_norm_eps(config.get("layer_norm_eps", 1e-12))
    w.add_causal_attention(False)
    pooling = pooling_type(d)
    if pooling is not None:
        w.add_pooling_type(pooling)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab, types = vocabulary(d, config["vocab_size"])
    w.add_tokenizer_model("bert")
    w.add_token_list([phantom(t) for t in vocab])
    w.add_token_types(types)
    w.add_token_type_count(config.get("type_vocab_size", 2))
    ids = {t: i for i, t in enumerate(vocab)}
    w.add_unk_token_id(ids["[UNK]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_mask_token_id(ids["[MASK]"])
    # gguf.SpecialVocab writes BERT's [CLS] as the BOS and [SEP] as the EOS too.
    w.add_bos_token_id(ids["[CLS]"])
    w.add_eos_token_id(ids["[SEP]"])
    for name, t in load_file(d / "model.safetensors").items():
        name = name.removeprefix("bert.")
        if name.startswith(SKIP):
            continue
        base, kind = name.rsplit(".", 1)
        if base.startswith("encoder.layer."):
            i, rest = base[len("encoder.layer."):].split(".", 1)
            new = f"blk.{i}.{BLOCK[rest]}.{kind}"
        else:
            new = f"{TOP[base]}.{kind}"
        w.add_tensor(new, t.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    convert(sys.argv[1], sys.argv[2])
