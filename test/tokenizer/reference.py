#!/usr/bin/env python3
"""Token ids per Hugging Face `tokenizers`, built by transformers from a GGUF's
embedded tokenizer, for kiln's tokenizer tests (src/tokenizer/mod.rs).

    reference.py CHECKPOINT < texts.json > ids.json

CHECKPOINT is `smollm2` or `gemma3` (the checkpoints `make setup` installs) or
a path to a .gguf. stdin is a JSON list of texts; stdout is a JSON object:

    {"path": "/resolved/model.gguf",
     "ids": [[...], ...],           # encode(text, add_special_tokens=False)
     "as_converted": [[...], ...],  # the same, before the fix below
     "decoded": ["...", ...]}       # decode(ids), special tokens kept

This is what `AutoTokenizer.from_pretrained(dir, gguf_file=name)` builds:
`get_gguf_tokenizer` then `convert_gguf_tokenizer`. transformers 5's GGUF
reader imports torch for the tensors, so the metadata is read here (the same
values: numeric arrays in full, the vocabulary and merges as strings) and
handed to `convert_gguf_tokenizer` directly; no torch is needed.

One fix, where the conversion and llama.cpp part ways: transformers has no
split for `tokenizer.ggml.pre = "smollm"` (nor the other pre types llama.cpp
gives the same regexes: starcoder, refact, codeshell, command-r), so it falls
back to GPT-2's. llama.cpp (LLAMA_VOCAB_PRE_TYPE_SMOLLM) first splits every
digit off on its own, as the StarCoder/SmolLM `tokenizer.json` does with
`Digits(individual_digits=True)` before `ByteLevel`; "ids" uses that.
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np
from tokenizers import pre_tokenizers
from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from checkpoints import resolve  # noqa: E402

DIGITS_FIRST = {"smollm", "starcoder", "refact", "codeshell", "command-r"}

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_metadata(path):
    """The GGUF's key/values: scalars, strings, and arrays as lists."""
    blob = np.memmap(path, mode="r", dtype=np.uint8)
    buf = memoryview(blob)
    if bytes(buf[:4]) != b"GGUF":
        sys.exit(f"{path} is not a GGUF file")
    _, _, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos = 24

    def string(pos):
        (n,) = struct.unpack_from("<Q", buf, pos)
        return bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n

    def value(ty, pos):
        if ty in _SCALAR:
            fmt = "<" + _SCALAR[ty]
            return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
        if ty == 8:
            return string(pos)
        if ty == 9:
            elem, count = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if elem in _SCALAR:
                fmt = f"<{count}{_SCALAR[elem]}"
                return list(struct.unpack_from(fmt, buf, pos)), pos + struct.calcsize(fmt)
            out = []
            for _ in range(count):
                v, pos = value(elem, pos)
                out.append(v)
            return out, pos
        sys.exit(f"{path}: metadata value type {ty} is not one GGUF defines")

    metadata = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (ty,) = struct.unpack_from("<I", buf, pos)
        metadata[key], pos = value(ty, pos + 4)
    return metadata


def build(metadata):
    """`convert_gguf_tokenizer`'s tokenizer, as `get_gguf_tokenizer` feeds it."""
    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    tokenizer_dict = {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
    tokenizer, _ = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    return tokenizer


def split_digits_first(tokenizer, metadata):
    """The fix above: llama.cpp's digit split for the pre types that have it."""
    if metadata.get("tokenizer.ggml.model") == "gpt2" and metadata.get("tokenizer.ggml.pre") in DIGITS_FIRST:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )


def main():
    path = resolve(sys.argv[1])
    texts = json.load(sys.stdin)
    metadata = read_metadata(path)
    tokenizer = build(metadata)

    def encode(texts):
        return [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]

    as_converted = encode(texts)
    split_digits_first(tokenizer, metadata)
    ids = encode(texts)
    decoded = [tokenizer.decode(i, skip_special_tokens=False) for i in ids]
    json.dump({"path": str(path), "ids": ids, "as_converted": as_converted, "decoded": decoded}, sys.stdout)


if __name__ == "__main__":
    main()
