"""Serving speed of kiln's exports next to llama.cpp, on the same GGUF and CPU, in one run.

    build/bench-venv/bin/python scripts/bench_serving.py NAME=MODEL.gguf ...

For each model: `kiln export --packed keep --max-context 128` (params from the GGUF
itself), `kiln compile` (wall, peak RSS), then through IREE's own tools and through
llama.cpp (llama-cpp-python, 2 threads):
- decode tok/s = (wall of generate with 33 new tokens - with 1) / 32 on the prompt "The
  capital of France is" (the same token ids for both; greedy), in 5 rounds that each
  time kiln and then llama.cpp: the medians, and the median of the rounds' ratios (the
  machine's load moves both within a round);
- prefill tok/s on a 64-token prompt (iree-benchmark-module's median; llama.cpp's
  eval of the same ids, median of 3);
- module load: wall of one iree-run-module prefill minus its benchmarked time;
- iree-run-module's peak RSS (generate, 33 tokens);
- effective weight bandwidth: the GGUF's tensor bytes (every weight is read once
  per decoded token; the tied embedding is the output matrix) x decode tok/s;
- dispatches per decode step: `stream.cmd.dispatch` ops in `decode` after
  `iree-compile --compile-to=stream` with kiln's flags.
"""

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from llama_cpp import Llama

ROOT = Path(__file__).resolve().parent.parent
KILN = ROOT / "target/release/kiln"
IREE_BIN = ROOT / ".venv/bin"
WORK = ROOT / "target/bench"
PROMPT = "The capital of France is"
LONG_PROMPT = (
    "The history of the city begins with a small settlement on the banks of the river, where "
    "traders from the north and the south met to exchange grain, salt, wool and iron. Over the "
    "centuries the settlement grew into a town, and the town into a city with walls, markets, "
    "temples and a harbour that sheltered ships from every corner of the known world."
)
MAX_CONTEXT = 128
THREADS = 2
RUNS = 3
DECODE_ROUNDS = 5


def timed(cmd):
    """Runs cmd under /usr/bin/time; returns (wall s, peak RSS MB, stdout)."""
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %e %M", *map(str, cmd)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench_serving: {' '.join(map(str, cmd))} failed:\n{out.stderr}")
    wall, rss = re.findall(r"^TIME ([0-9.]+) ([0-9]+)$", out.stderr, re.M)[-1]
    return float(wall), int(rss) / 1024, out.stdout


def ids_arg(ids):
    return f"--input=1x{len(ids)}xi32=" + ",".join(map(str, ids))


def iree_inputs(export):
    manifest = json.loads((export / "manifest.json").read_text())
    params = [f"--parameters={p['scope']}={export / p['file']}" for p in manifest["parameters"]]
    return [f"--module={export / 'model.vmfb'}", *params]


def iree_generate(export, ids, n_new):
    """Wall of one generate call, its peak RSS and the tokens."""
    start = time.perf_counter()
    _, rss, stdout = timed(
        [IREE_BIN / "iree-run-module", *iree_inputs(export), "--function=generate", ids_arg(ids), f"--input=i32={n_new}"]
    )
    wall = time.perf_counter() - start
    # `1x128xi32=[t0 t1 ...]`: the new tokens, then -1s.
    tokens = [int(t) for t in re.findall(r"-?\d+", stdout.split("=", 1)[-1])][:n_new]
    return wall, rss, tokens


def iree_prefill(export, ids):
    """iree-benchmark-module's median prefill time, and the load time of one run."""
    out = subprocess.run(
        [IREE_BIN / "iree-benchmark-module", *iree_inputs(export), "--function=prefill", ids_arg(ids),
         f"--benchmark_repetitions={RUNS}", "--benchmark_format=json", "--device_allocator=caching"],
        capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    median = next(b for b in report["benchmarks"] if b.get("aggregate_name") == "median")
    unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[median["time_unit"]]
    seconds = median["real_time"] * unit
    start = time.perf_counter()
    subprocess.run([IREE_BIN / "iree-run-module", *iree_inputs(export), "--function=prefill", ids_arg(ids)],
                   capture_output=True, check=True)
    return seconds, time.perf_counter() - start - seconds


def decode_dispatches(export):
    """Dispatches one `decode` call runs, counted in the stream-level IR."""
    # iree::COMPILE_FLAGS, then the export's own (the manifest's compile_flags).
    source = (ROOT / "src/iree.rs").read_text()
    flags = re.findall(r'"(--[^"]+)"', source[source.index("pub const COMPILE_FLAGS"):].split("];")[0])
    flags += json.loads((export / "manifest.json").read_text())["compile_flags"]
    stream = export / "model.stream.mlir"
    subprocess.run([IREE_BIN / "iree-compile", *flags, export / "model.mlir", "--compile-to=stream", "-o", stream],
                   check=True, capture_output=True)
    text = stream.read_text()
    stream.unlink()
    decode = text[text.index("util.func public @decode"):]
    decode = decode[:decode.find("\n  util.func ", 1)]
    return decode.count("stream.cmd.dispatch @")


class LlamaCpp:
    """llama.cpp on the same GGUF, loaded once."""

    def __init__(self, model):
        self.llm = Llama(model_path=str(model), n_ctx=MAX_CONTEXT, n_threads=THREADS, n_threads_batch=THREADS,
                         n_batch=MAX_CONTEXT, verbose=False)

    def generate(self, ids, n_new):
        """Wall of a greedy generation of n_new tokens, and the tokens."""
        start, tokens = time.perf_counter(), []
        for token in self.llm.generate(ids, top_k=1, temp=0.0, reset=True):
            tokens.append(token)
            if len(tokens) == n_new:
                return time.perf_counter() - start, tokens

    def prefill(self, long_ids):
        """Median wall of evaluating long_ids from an empty cache."""
        def once():
            self.llm.reset()
            start = time.perf_counter()
            self.llm.eval(long_ids)
            return time.perf_counter() - start
        return statistics.median(once() for _ in range(RUNS))


def decode_rounds(export, ref, ids):
    """Decode tok/s of kiln and of llama.cpp, measured in turn in each round."""
    ref.generate(ids, 1)  # warm up
    kiln, llama, rss, tokens, ref_tokens = [], [], 0.0, None, None
    for _ in range(DECODE_ROUNDS):
        one, _, _ = iree_generate(export, ids, 1)
        many, many_rss, tokens = iree_generate(export, ids, 33)
        kiln.append(32 / (many - one))
        rss = max(rss, many_rss)
        one, _ = ref.generate(ids, 1)
        many, ref_tokens = ref.generate(ids, 33)
        llama.append(32 / (many - one))
    ratio = statistics.median(k / r for k, r in zip(kiln, llama))
    return statistics.median(kiln), statistics.median(llama), ratio, rss, tokens, ref_tokens


def bench(name, model):
    export = WORK / f"serve-{name}"
    subprocess.run([KILN, "export", model, "-o", export, "--packed", "keep", "--max-context", str(MAX_CONTEXT)],
                   check=True, capture_output=True)
    compile_s, compile_mb, _ = timed([KILN, "compile", export])

    tokenizer = Llama(model_path=str(model), vocab_only=True, verbose=False)
    ids = tokenizer.tokenize(PROMPT.encode())
    long_ids = (tokenizer.tokenize(LONG_PROMPT.encode()) * 2)[:64]
    assert len(long_ids) == 64
    del tokenizer

    ref = LlamaCpp(model)
    decode, ref_decode, decode_ratio, run_mb, iree_tokens, ref_tokens = decode_rounds(export, ref, ids)
    prefill_s, load_s = iree_prefill(export, long_ids)
    prefill = 64 / prefill_s

    inspected = json.loads(subprocess.run([KILN, "inspect", "--json", model], capture_output=True, check=True).stdout)
    weight_bytes = sum(t["bytes"] for t in inspected["tensors"])

    dispatches = decode_dispatches(export)
    ref_prefill = len(long_ids) / ref.prefill(long_ids)
    same = next((i for i, (a, b) in enumerate(zip(iree_tokens, ref_tokens)) if a != b), min(len(iree_tokens), 33))
    return {
        "name": name, "compile_s": compile_s, "compile_mb": compile_mb, "decode": decode, "prefill": prefill,
        "load_s": load_s, "run_mb": run_mb, "gbps": weight_bytes * decode / 1e9, "weight_mb": weight_bytes / 1e6,
        "ref_decode": ref_decode, "decode_ratio": decode_ratio, "ref_prefill": ref_prefill, "same_tokens": same, "dispatches": dispatches,
    }


def main():
    WORK.mkdir(parents=True, exist_ok=True)
    rows = [bench(*arg.split("=", 1)) for arg in sys.argv[1:]]
    print(f"{'model':<14} {'compile s':>9} {'MB':>6} | {'decode tok/s':>12} {'llama.cpp':>9} {'ratio':>6} | "
          f"{'prefill64 tok/s':>15} {'llama.cpp':>9} {'ratio':>6} | {'load s':>6} {'run MB':>7} {'GB/s':>5} "
          f"{'= llama.cpp':>11} {'dispatches':>10}")
    for r in rows:
        print(f"{r['name']:<14} {r['compile_s']:>9.1f} {r['compile_mb']:>6.0f} | {r['decode']:>12.1f} "
              f"{r['ref_decode']:>9.1f} {r['decode_ratio']:>5.2f}x | {r['prefill']:>15.1f} "
              f"{r['ref_prefill']:>9.1f} {r['prefill'] / r['ref_prefill']:>5.2f}x | {r['load_s']:>6.2f} "
              f"{r['run_mb']:>7.0f} {r['gbps']:>5.1f} {r['same_tokens']:>8}/33 {r['dispatches']:>10}")
    print("targets: decode >= 0.75 x llama.cpp, prefill >= 0.5 x llama.cpp, SmolLM2 compile <= 90 s")
    print(f"(decode: medians of {DECODE_ROUNDS} rounds of kiln then llama.cpp, ratio: the rounds' median;")
    print(" = llama.cpp: leading greedy tokens equal to llama.cpp's, which rounds activations to 8 bits;")
    print(" dispatches: per decode step)")
    weights = ", ".join(f"{r['name']} {r['weight_mb']:.0f} MB" for r in rows)
    print(f"(weights read per decoded token: {weights})")


if __name__ == "__main__":
    main()
