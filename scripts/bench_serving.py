"""Serving speed of kiln's exports next to llama.cpp, on the same GGUF and CPU, in one run.

    build/bench-venv/bin/python scripts/bench_serving.py [NAME=MODEL.gguf ...] [--row MODEL@CAPACITY:PROMPTS ...]

A row is a model, a capacity (kiln's `--max-context`, llama.cpp's `n_ctx`) and a prompt
length: `--row llama-1b@4096:5,512` is two rows. Without `--row`, DEFAULT_ROWS. A model is
NAME=PATH from the command line, or a `kiln dev synth` preset (`llama-1b`, `gemma3n-e2b`,
...) written with `--data seeded` into the work directory. Prompts are the token ids of an
English text, cut to the prompt length, for a model with a tokenizer; for one without (the
synthetic checkpoints), pseudo-random ids from `--seed`. Both engines get the same ids.

For each model and capacity: `kiln export --packed keep --max-context CAPACITY --kv-dtype f16`
(params from the GGUF itself; f16 caches, as llama.cpp's default) and `kiln compile` (wall, peak RSS). Then, per row, two worker processes,
each loading its model once: kiln's module through IREE's Python runtime (`.venv`,
`--threads` task workers, default 2) and llama.cpp (llama-cpp-python, this venv, as many
threads, `n_ctx` = the capacity, `n_batch` min(capacity, 512), flash attention off as
llama-cpp-python's default). After one
warm-up round on the first 5 ids, rounds that each time kiln and then llama.cpp:
- time to first token: from the prompt's ids to the argmax of its last logits on the host
  (kiln: `prefill`; llama.cpp: `eval` of the ids from an empty cache); prefill tok/s =
  prompt / that time;
- decode tok/s at that fill: `--decode-steps` greedy steps from the filled cache, each one
  `decode` (kiln; its caches go back in as the previous step returned them, in place) or
  `eval` of one token (llama.cpp), then the logits' argmax on the host: steps / their wall;
- with a prompt of at most `--generate-max-prompt` tokens, kiln's `generate` too:
  (wall of generate 1+K - generate 1) / K, the serving loop inside the module (after a
  generate 1 left out: the first call after the round's is slower);
- the median decode step of each engine (the median of the rounds' median steps: a step
  that other load on the machine preempted counts once, not by its length);
- peak RSS: each worker's VmHWM (Python, runtime, mapped weights, caches).
Rounds stop at `--rounds`, or before one would end past `--row-budget` seconds; a row
that runs past `--row-timeout` is cut. Figures are medians over rounds; ratios are the
median of the rounds' ratios (the machine's load moves both within a round), as speeds:
above 1 is kiln faster. Also: the KV cache bytes of kiln's module, effective weight bandwidth
(the GGUF's tensor bytes x decode tok/s), leading greedy tokens equal to llama.cpp's, and,
at the capacities of `--dispatches-at`, dispatches per `decode` step (`stream.cmd.dispatch`
ops in the stream-level IR under kiln's compile flags).

Workers run at `--nice` (-10 where permitted, both engines alike; the process and its
autogroup): on a shared machine, llama.cpp's threads, which wait for each other spinning,
lose most to other load (SmolLM2, 2 threads, load average 4: llama.cpp decode 6-12 tok/s at
nice 0, 67-73 at -10; kiln 20-32 and 79-82). Every round's figures, each step's time
included, go to serving.json in the work directory; `--report FILE` prints the tables of
such a file again.

A row that fails (export, compile, a worker's error or a timeout) is reported and the
others run; the script then exits 1. Targets (kiln issue 24) are printed next to the
figures; missing one is not a failure.
"""

import argparse
import json
import math
import os
import random
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KILN = ROOT / "target/release/kiln"
IREE_BIN = ROOT / ".venv/bin"
IREE_PYTHON = ROOT / ".venv/bin/python"
PROMPT = "The capital of France is"
LONG_TEXT = (
    " The history of the city begins with a small settlement on the banks of the river, where "
    "traders from the north and the south met to exchange grain, salt, wool and iron. Over the "
    "centuries the settlement grew into a town, and the town into a city with walls, markets, "
    "temples and a harbour that sheltered ships from every corner of the known world."
)
DEFAULT_ROWS = [
    "smollm2@128:5",
    "gemma3-270m@128:5",
    "smollm2@8192:5",
    "gemma3-270m@32768:5",
    "llama-1b@4096:5,512",
    "smollm2@4096:512,2048",
    "gemma3n-e2b@4096:5,512",
]
SYNTH_PRESETS = ["llama3-8b", "gemma3-4.5b", "llama-1b", "tiny-llama", "gemma3n-e2b"]
WARMUP_IDS = 5
# What report() reads from the command line, saved with a run's figures.
REPORT_SETTINGS = ["threads", "nice", "decode_steps", "generate_max_prompt"]


@dataclass(frozen=True)
class Target:
    """One of issue 24's targets: `metric` of the row (model, capacity, prompt) `op` `bound`."""

    model: str
    capacity: int
    prompt: int
    metric: str  # ttft | decode | step_vs_128 | step_vs_generate | serves
    op: str  # ">=" or "<="
    bound: float

    def met(self, value):
        return value >= self.bound if self.op == ">=" else value <= self.bound


TARGETS = [
    Target("llama-1b", 4096, 512, "ttft", ">=", 0.5),
    Target("llama-1b", 4096, 512, "decode", ">=", 0.9),
    Target("gemma3n-e2b", 4096, 5, "ttft", ">=", 0.5),
    Target("gemma3n-e2b", 4096, 5, "decode", ">=", 0.8),
    Target("gemma3n-e2b", 4096, 512, "ttft", ">=", 0.5),
    Target("gemma3n-e2b", 4096, 512, "decode", ">=", 0.8),
    Target("smollm2", 4096, 2048, "ttft", ">=", 0.5),
    Target("smollm2", 4096, 2048, "decode", ">=", 0.8),
    Target("smollm2", 8192, 5, "step_vs_128", "<=", 1.2),
    Target("gemma3-270m", 32768, 5, "serves", ">=", 1.0),
    Target("llama-1b", 4096, 5, "step_vs_generate", "<=", 1.2),
    Target("gemma3n-e2b", 4096, 5, "step_vs_generate", "<=", 1.2),
    Target("smollm2", 128, 5, "decode", ">=", 0.85),
    Target("gemma3-270m", 128, 5, "decode", ">=", 0.95),
]
METRIC_TEXT = {
    "ttft": "time to first token, x llama.cpp's speed",
    "decode": "decode tok/s, x llama.cpp",
    "step_vs_128": "decode step (median) / the step at capacity 128",
    "step_vs_generate": "`decode` step / `generate`'s per-token time",
    "serves": "exports, compiles and serves",
}

T0 = time.perf_counter()


def log(message):
    print(f"[{time.perf_counter() - T0:6.0f} s] {message}", flush=True)


class RowFailed(Exception):
    """A row (or a model and capacity) cannot be measured; the message says why."""


def timed(cmd, timeout):
    """Runs cmd under /usr/bin/time; returns (wall s, peak RSS MB, stdout)."""
    # Its own process group, so that a timeout also ends the tools it runs (iree-compile).
    proc = subprocess.Popen(["/usr/bin/time", "-f", "TIME %e %M", *map(str, cmd)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RowFailed(f"`{Path(str(cmd[0])).name} {cmd[1]}` ran past {timeout:g} s: cut") from None
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-6:])
        raise RowFailed(f"`{Path(str(cmd[0])).name} {cmd[1]}` failed (exit {proc.returncode}): {tail}")
    wall, rss = re.findall(r"^TIME ([0-9.]+) ([0-9]+)$", stderr, re.M)[-1]
    return float(wall), int(rss) / 1024, stdout


def vm_hwm_mb():
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) / 1024


# --- workers: one process per engine and model, driven over JSON lines ------------------


def kiln_worker(export, threads, nice):
    """Loads kiln's compiled module and answers `round` and `generate` requests."""
    out = answer_stream(nice)
    import numpy as np
    import iree.runtime as rt

    rt.flags.parse_flags(f"--task_topology_max_group_count={threads}")
    manifest = json.loads((export / "manifest.json").read_text())
    start = time.perf_counter()
    config = rt.Config("local-task")
    index = rt.ParameterIndex()
    scopes = {p["scope"] for p in manifest["parameters"]}
    if len(scopes) != 1:
        raise RuntimeError(f"expected one parameter scope, found {sorted(scopes)}")
    for p in manifest["parameters"]:
        index.load(str(export / p["file"]))
    modules = [
        rt.create_hal_module(config.vm_instance, config.device),
        rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope=scopes.pop())),
    ]
    main = rt.VmModule.mmap(config.vm_instance, str(export / "model.vmfb"))
    context = rt.VmContext(config.vm_instance, modules=[*modules, main])
    fn = {name: rt.FunctionInvoker(context, config.device, main.lookup_function(name))
          for name in ("prefill", "decode", "generate")}
    load_s = time.perf_counter() - start

    def round_(ids, steps):
        start = time.perf_counter()
        logits, *caches = fn["prefill"](np.array([ids], np.int32))
        token = int(np.argmax(logits.to_host()))
        ttft = time.perf_counter() - start
        tokens, step_s = [token], []
        for position in range(len(ids), len(ids) + steps):
            start = time.perf_counter()
            logits, *caches = fn["decode"](np.array([[token]], np.int32), np.array(position, np.int32), *caches)
            token = int(np.argmax(logits.to_host()))
            step_s.append(time.perf_counter() - start)
            tokens.append(token)
        return {"ttft": ttft, "step_s": step_s, "tokens": tokens}

    def generate(ids, n):
        start = time.perf_counter()
        out = fn["generate"](np.array([ids], np.int32), np.array(n, np.int32)).to_host()
        return {"wall": time.perf_counter() - start, "tokens": [int(t) for t in out[0, :n]]}

    serve(out, {"round": round_, "generate": generate}, load_s)


def llama_worker(model, n_ctx, threads, overrides, flash_attn, nice):
    """Loads the GGUF into llama.cpp and answers `round` requests."""
    out = answer_stream(nice)
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama

    start = time.perf_counter()
    llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=min(n_ctx, 512), n_threads=threads,
                n_threads_batch=threads, flash_attn=flash_attn, kv_overrides=overrides or None, verbose=False)
    load_s = time.perf_counter() - start
    n_vocab = llm.n_vocab()

    def next_token():
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
        return int(np.argmax(logits))

    def round_(ids, steps):
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        token = next_token()
        ttft = time.perf_counter() - start
        tokens, step_s = [token], []
        for _ in range(steps):
            start = time.perf_counter()
            llm.eval([token])
            token = next_token()
            step_s.append(time.perf_counter() - start)
            tokens.append(token)
        return {"ttft": ttft, "step_s": step_s, "tokens": tokens}

    serve(out, {"round": round_}, load_s)


def answer_stream(nice):
    """The worker's stdout, for its answers only: anything else printed (Python or C) goes to
    stderr. Also sets the worker's nice value, before any thread starts, so its threads inherit it."""
    # Under sched autogroup (Linux's default on a desktop kernel, and here) a process's nice
    # only ranks it within its session's group, and groups share the CPU by the group's own
    # nice; a worker is a session of its own, so both are set.
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        autogroup = Path("/proc/self/autogroup")
        if autogroup.exists():
            autogroup.write_text(str(nice))
    except PermissionError:
        pass  # left as it was; the hello line says which
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def autogroup_nice():
    try:
        return int(Path("/proc/self/autogroup").read_text().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None


def serve(out, handlers, load_s):
    """The worker's loop: one JSON request per stdin line, one JSON answer per stdout line."""
    out.write(json.dumps({"load_s": load_s, "hwm_mb": vm_hwm_mb(), "nice": os.getpriority(os.PRIO_PROCESS, 0),
                          "autogroup": autogroup_nice()}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            answer = handlers[op](**request)
            answer["hwm_mb"] = vm_hwm_mb()
        except Exception as error:  # the driver reports it as the row's failure
            answer = {"error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


class Worker:
    """A worker process; every answer must come before the row's deadline."""

    def __init__(self, name, argv, deadline):
        self.name, self.deadline = name, deadline
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, start_new_session=True)
        self.hello = self._answer("load")

    def call(self, op, **request):
        self.proc.stdin.write(json.dumps({"op": op, **request}) + "\n")
        self.proc.stdin.flush()
        return self._answer(op)

    def _answer(self, op):
        left = self.deadline - time.perf_counter()
        ready = select.select([self.proc.stdout], [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            self.close()
            raise RowFailed(f"{self.name}: {op} still running at the row's timeout: cut")
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            self.stderr.seek(0)
            tail = "\n".join(self.stderr.read().strip().splitlines()[-6:])
            raise RowFailed(f"{self.name} exited during {op} (exit {self.proc.returncode}): {tail}")
        answer = json.loads(line)
        if "error" in answer:
            raise RowFailed(f"{self.name} {op}: {answer['error']}")
        return answer

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


# --- the driver ------------------------------------------------------------------------


@dataclass
class Model:
    name: str
    path: Path
    arch: str
    vocab: int
    has_tokenizer: bool
    weight_bytes: int


@dataclass
class Build:
    """One export of a model at one capacity, compiled (or why not)."""

    export: Path
    compile_s: float | None = None  # None: an earlier compile reused (--reuse-compiled)
    compile_mb: float = 0.0
    cache_bytes: int = 0
    dispatches: int | None = None
    error: str | None = None


@dataclass
class Row:
    model: str
    capacity: int
    prompt: int
    build: Build | None = None
    error: str | None = None
    rounds: list = field(default_factory=list)  # (kiln round, llama round, kiln generate pair or None)
    kiln_mb: float = 0.0
    llama_mb: float = 0.0
    llama_only: list = field(default_factory=list)  # llama.cpp's rounds when kiln could not run

    @property
    def key(self):
        return f"{self.model}@{self.capacity}:{self.prompt}"


def parse_rows(specs):
    rows = []
    for spec in specs:
        m = re.fullmatch(r"([\w.-]+)@(\d+):(\d+(?:,\d+)*)", spec)
        if not m:
            sys.exit(f"bench_serving: --row {spec!r} is not MODEL@CAPACITY:PROMPT[,PROMPT...]")
        for prompt in m.group(3).split(","):
            if not 0 < int(prompt) <= int(m.group(2)) - 2:
                sys.exit(f"bench_serving: --row {spec}: a prompt of {prompt} tokens leaves no room for decode steps "
                         f"in {m.group(2)} positions")
            rows.append(Row(m.group(1), int(m.group(2)), int(prompt)))
    return rows


def load_model(name, path):
    inspected = json.loads(subprocess.run([KILN, "inspect", "--json", path], capture_output=True, check=True).stdout)
    meta = {m["key"]: m["value"] for m in inspected["metadata"]}
    embedding = next(t for t in inspected["tensors"] if t["name"] == "token_embd.weight")
    return Model(name, Path(path), meta["general.architecture"], embedding["shape"][0],
                 "tokenizer.ggml.model" in meta, sum(t["bytes"] for t in inspected["tensors"]))


def synth(preset, work):
    """`kiln dev synth PRESET --data seeded`, kept while newer than the kiln binary."""
    path = work / f"{preset}-seeded.gguf"
    if not path.exists() or path.stat().st_mtime < KILN.stat().st_mtime:
        log(f"{preset}: kiln dev synth --data seeded -> {path}")
        subprocess.run([KILN, "dev", "synth", preset, "-o", path, "--data", "seeded"], check=True,
                       capture_output=True)
    return path


def cache_bytes(manifest):
    """Bytes of the caches `decode` takes (every input after the token and the position)."""
    decode = next(f for f in manifest["functions"] if f["name"] == "decode")
    total = 0
    for ty in decode["inputs"][2:]:
        *dims, dtype = re.fullmatch(r"tensor<(.*)>", ty).group(1).split("x")
        total += math.prod(map(int, dims)) * int(re.sub(r"\D", "", dtype)) // 8
    return total


def decode_dispatches(export, timeout):
    """Dispatches one `decode` call runs, counted in the stream-level IR."""
    # iree::COMPILE_FLAGS, then the export's own (the manifest's compile_flags).
    source = (ROOT / "src/iree.rs").read_text()
    flags = re.findall(r'"(--[^"]+)"', source[source.index("pub const COMPILE_FLAGS"):].split("];")[0])
    flags += json.loads((export / "manifest.json").read_text())["compile_flags"]
    stream = export / "model.stream.mlir"
    timed([IREE_BIN / "iree-compile", *flags, export / "model.mlir", "--compile-to=stream", "-o", stream], timeout)
    text = stream.read_text()
    stream.unlink()
    decode = text[text.index("util.func public @decode"):]
    decode = decode[:decode.find("\n  util.func ", 1)]
    return decode.count("stream.cmd.dispatch @")


def build(model, capacity, args):
    b = Build(args.work / f"serve-{model.name}-{capacity}")
    module, vmfb = b.export / "model.mlir", b.export / "model.vmfb"
    before = module.read_bytes() if args.reuse_compiled and module.exists() and vmfb.exists() else None
    try:
        start = time.perf_counter()
        timed([KILN, "export", model.path, "-o", b.export, "--packed", "keep", "--max-context", capacity,
               "--kv-dtype", "f16"],
              args.compile_timeout)
        if before is not None and before == module.read_bytes():
            log(f"{model.name}@{capacity}: exported the module {vmfb} was compiled from; not compiled again")
            b.cache_bytes = cache_bytes(json.loads((b.export / "manifest.json").read_text()))
            return b
        b.cache_bytes = cache_bytes(json.loads((b.export / "manifest.json").read_text()))
        log(f"{model.name}@{capacity}: exported in {time.perf_counter() - start:.1f} s, KV cache "
            f"{b.cache_bytes / 1e6:.1f} MB; compiling")
        b.compile_s, b.compile_mb, _ = timed([KILN, "compile", b.export], args.compile_timeout)
        log(f"{model.name}@{capacity}: compiled in {b.compile_s:.1f} s, peak RSS {b.compile_mb:.0f} MB")
    except RowFailed as error:
        b.error = str(error)
        log(f"{model.name}@{capacity}: FAILED: {b.error}")
        return b
    if capacity in args.dispatches_at:
        try:
            b.dispatches = decode_dispatches(b.export, args.compile_timeout)
        except RowFailed as error:
            log(f"{model.name}@{capacity}: dispatches per decode step not counted: {error}")
    return b


def prompt_ids(model, n, seed):
    if not model.has_tokenizer:
        rng = random.Random(seed)
        return [rng.randrange(model.vocab) for _ in range(n)]
    from llama_cpp import Llama

    tokenizer = Llama(model_path=str(model.path), vocab_only=True, verbose=False)
    text = PROMPT
    while len(ids := tokenizer.tokenize(text.encode())) < n:
        text += LONG_TEXT
    return ids[:n]


def kiln_argv(build, args):
    return [IREE_PYTHON, __file__, "--worker", "kiln", build.export, "--threads", args.threads, "--nice", args.nice]


def llama_argv(model, capacity, args):
    # Without a tokenizer (the synthetic checkpoints) llama.cpp loads as a vocabulary of
    # ids only (`none`), whose size it then reads from the metadata.
    overrides = {} if model.has_tokenizer else {"tokenizer.ggml.model": "none", f"{model.arch}.vocab_size": model.vocab}
    flash = ["--llama-flash-attn"] if args.llama_flash_attn else []
    return [sys.executable, __file__, "--worker", "llama", model.path, "--threads", args.threads, "--nice", args.nice,
            "--n-ctx", capacity, "--overrides", json.dumps(overrides), *flash]


def measure(row, model, args, workers):
    """Runs the row's rounds; workers (kiln, llama) are shared by the rows of one export."""
    deadline = time.perf_counter() + args.row_timeout
    ids = prompt_ids(model, row.prompt, args.seed)
    # Room for generate's 1 + steps tokens after the prompt.
    steps = min(args.decode_steps, row.capacity - row.prompt - 1)
    kiln_ok = row.build.error is None
    for name in ("kiln", "llama"):
        if name == "kiln" and not kiln_ok:
            continue
        if workers.get(name) is None:
            argv = kiln_argv(row.build, args) if name == "kiln" else llama_argv(model, row.capacity, args)
            workers[name] = Worker(f"{name} worker", list(map(str, argv)), deadline)
            warm = workers[name].call("round", ids=ids[:WARMUP_IDS], steps=2)
            log(f"{row.key}: {name} loaded in {workers[name].hello['load_s']:.2f} s (nice "
                f"{workers[name].hello['nice']}, autogroup {workers[name].hello['autogroup']}), warm-up round "
                f"(prefill {min(WARMUP_IDS, row.prompt)}, 2 steps) {warm['ttft'] + sum(warm['step_s']):.2f} s")
        workers[name].deadline = deadline
    start = time.perf_counter()
    while len(row.rounds) + len(row.llama_only) < args.rounds:
        round_start = time.perf_counter()
        if kiln_ok:
            kiln = workers["kiln"].call("round", ids=ids, steps=steps)
            gen = None
            if row.prompt <= args.generate_max_prompt:
                # The first `generate` after the round's calls takes its buffers anew (Gemma 3n
                # E2B: 2.1 s against 1.5 s for one token), which would count against the steps.
                workers["kiln"].call("generate", ids=ids, n=1)
                one = workers["kiln"].call("generate", ids=ids, n=1)
                many = workers["kiln"].call("generate", ids=ids, n=1 + steps)
                gen = (one, many)
                row.kiln_mb = max(row.kiln_mb, many["hwm_mb"])
            row.kiln_mb = max(row.kiln_mb, kiln["hwm_mb"])
        llama = workers["llama"].call("round", ids=ids, steps=steps)
        row.llama_mb = max(row.llama_mb, llama["hwm_mb"])
        if kiln_ok:
            row.rounds.append((kiln, llama, gen))
            log(f"{row.key}: round {len(row.rounds)}: time to first token {kiln['ttft']:.3f} s vs "
                f"{llama['ttft']:.3f} s, decode {steps / sum(kiln['step_s']):.1f} vs "
                f"{steps / sum(llama['step_s']):.1f} tok/s"
                + (f", generate 1+{steps} - 1 tokens {gen[1]['wall'] - gen[0]['wall']:.3f} s" if gen else ""))
        else:
            row.llama_only.append(llama)
            log(f"{row.key}: round {len(row.llama_only)} (llama.cpp only): time to first token "
                f"{llama['ttft']:.3f} s, decode {steps / sum(llama['step_s']):.1f} tok/s")
        now = time.perf_counter()
        if now - start + (now - round_start) > args.row_budget:
            break


# --- figures -----------------------------------------------------------------------------


def figures(row):
    """The row's medians and ratios; empty when it has no round."""
    if row.rounds:
        kiln = [k for k, _, _ in row.rounds]
        llama = [r for _, r, _ in row.rounds]
    elif row.llama_only:
        kiln, llama = [], row.llama_only
    else:
        return {}
    steps = len(llama[0]["step_s"])
    med = statistics.median
    f = {
        "llama_ttft": med(r["ttft"] for r in llama),
        "llama_decode": med(steps / sum(r["step_s"]) for r in llama),
        # The median step of each round, then their median: a step the machine's other load
        # preempted counts once, not by its length.
        "llama_step_med_ms": med(1000 * med(r["step_s"]) for r in llama),
        "rounds": len(llama), "steps": steps,
    }
    if not kiln:
        return f
    f.update({
        "ttft": med(k["ttft"] for k in kiln),
        "decode": med(steps / sum(k["step_s"]) for k in kiln),
        "step_ms": med(1000 * sum(k["step_s"]) / steps for k in kiln),
        "step_med_ms": med(1000 * med(k["step_s"]) for k in kiln),
        "ttft_ratio": med(r["ttft"] / k["ttft"] for k, r, _ in row.rounds),
        "decode_ratio": med(sum(r["step_s"]) / sum(k["step_s"]) for k, r, _ in row.rounds),
        "same": next((i for i, (a, b) in enumerate(zip(kiln[-1]["tokens"], llama[-1]["tokens"])) if a != b),
                     len(kiln[-1]["tokens"])),
    })
    gens = [g for _, _, g in row.rounds if g]
    # Medians of each length first: one round's difference can be noise on a tiny model.
    extra = med(many["wall"] for _, many in gens) - med(one["wall"] for one, _ in gens) if gens else 0
    if extra > 0:
        f["generate"] = steps / extra
        f["generate_ms"] = 1000 * extra / steps
    return f


def target_value(target, rows_by_key, figs):
    """The value a target is checked on, or None (row not run or not measured)."""
    key = f"{target.model}@{target.capacity}:{target.prompt}"
    row, f = rows_by_key.get(key), figs.get(key, {})
    if row is None:
        return None
    if target.metric == "serves":
        return 1.0 if "decode" in f else 0.0
    if target.metric == "ttft":
        return f.get("ttft_ratio")
    if target.metric == "decode":
        return f.get("decode_ratio")
    if target.metric == "step_vs_generate":
        return f["step_ms"] / f["generate_ms"] if "generate_ms" in f and "step_ms" in f else None
    if target.metric == "step_vs_128":
        base = figs.get(f"{target.model}@128:{target.prompt}", {})
        return f["step_med_ms"] / base["step_med_ms"] if "step_med_ms" in f and "step_med_ms" in base else None
    raise ValueError(target.metric)


def ratio_cell(f, key, targets, metric):
    if key not in f:
        return "-"
    bound = next((f"{t.op}{t.bound:g}" for t in targets if t.metric == metric), "")
    return f"{f[key]:.2f}x" + (f" ({bound})" if bound else "")


def report(rows, models, figs, args):
    rows_by_key = {r.key: r for r in rows}
    print(f"\n== serving: kiln (IREE, `--packed keep`) next to llama.cpp, same GGUF, same run, {args.threads} threads, "
          f"workers at nice {args.nice} ==")
    head = (f"{'row (model@capacity:prompt)':<28} {'compile':>14} {'KV MB':>7} | {'TTFT s':>7} {'llama':>7} "
            f"{'x (target)':>14} | {'prefill tok/s':>13} {'llama':>7} | {'decode tok/s':>12} {'llama':>7} "
            f"{'x (target)':>15} {'generate':>8} {'step ms, median':>15} | {'RSS MB':>6} {'llama':>6} | "
            f"{'GB/s':>5} {'=tok':>5} {'disp':>5}")
    print(head)
    print("-" * len(head))
    for row in rows:
        b, f = row.build, figs[row.key]
        targets = [t for t in TARGETS if (t.model, t.capacity, t.prompt) == (row.model, row.capacity, row.prompt)]
        if not b or b.error is not None:
            compile_ = "FAILED"
        elif b.compile_s is None:
            compile_ = "reused"
        else:
            compile_ = f"{b.compile_s:.0f} s {b.compile_mb:.0f} MB"
        kv = f"{b.cache_bytes / 1e6:.1f}" if b and b.cache_bytes else "-"
        num = lambda key, fmt: format(f[key], fmt) if key in f else "-"  # noqa: E731
        prefill = f"{row.prompt / f['ttft']:.1f}" if "ttft" in f else "-"
        ref_prefill = f"{row.prompt / f['llama_ttft']:.1f}" if "llama_ttft" in f else "-"
        model = models.get(row.model)
        gbps = f"{model.weight_bytes * f['decode'] / 1e9:.1f}" if model and "decode" in f else "-"
        same = f"{f['same']}/{f['steps'] + 1}" if "same" in f else "-"
        disp = str(b.dispatches) if b and b.dispatches is not None else "-"
        step = f"{num('step_med_ms', '.1f')} / {num('llama_step_med_ms', '.1f')}"
        print(f"{row.key:<28} {compile_:>14} {kv:>7} | {num('ttft', '.3f'):>7} {num('llama_ttft', '.3f'):>7} "
              f"{ratio_cell(f, 'ttft_ratio', targets, 'ttft'):>14} | {prefill:>13} {ref_prefill:>7} | "
              f"{num('decode', '.1f'):>12} {num('llama_decode', '.1f'):>7} "
              f"{ratio_cell(f, 'decode_ratio', targets, 'decode'):>15} {num('generate', '.1f'):>8} {step:>15} | "
              f"{row.kiln_mb or 0:>6.0f} {row.llama_mb or 0:>6.0f} | {gbps:>5} {same:>5} {disp:>5}")
        if row.error:
            print(f"    FAILED: {row.error}")
    print("TTFT: time to first token (prompt ids to the argmax of the last logits, medians of the rounds);"
          " x: kiln's speed / llama.cpp's (median of the rounds' ratios, above 1 is kiln faster);")
    print(f"decode: {args.decode_steps} greedy steps (fewer if the capacity is short) from the filled cache, each a "
          "`decode` call (kiln) or a one-token eval (llama.cpp); generate: kiln's `generate` (1+K - 1 tokens)/K,"
          f" prompts up to {args.generate_max_prompt} tokens; step ms: the median decode step, kiln / llama.cpp;")
    print("RSS: each worker process's peak; KV MB: kiln's keys and values (f16, as llama.cpp's); GB/s: the GGUF's tensor bytes x decode"
          " tok/s; =tok: leading greedy tokens equal to llama.cpp's; disp: dispatches per decode step.")
    weights = ", ".join(f"{m.name} {m.weight_bytes / 1e6:.0f} MB" for m in models.values())
    print(f"(weights read per decoded token: {weights}; rounds per row: "
          + ", ".join(f"{r.key} {figs[r.key].get('rounds', 0)}" for r in rows) + ")")

    print("\n== targets (kiln issue 24; the goal beyond them: >= 1.0x llama.cpp on every row) ==")
    for t in TARGETS:
        value = target_value(t, rows_by_key, figs)
        what = f"{t.model}@{t.capacity}:{t.prompt}"
        if value is None:
            state = "not run" if what not in rows_by_key else "not measured"
            bound = "" if t.metric == "serves" else f" {t.op} {t.bound:g}"
            print(f"  {what:<24} {METRIC_TEXT[t.metric]}{bound}: {state}")
        elif t.metric == "serves":
            print(f"  {what:<24} {METRIC_TEXT[t.metric]}: {'yes' if value else 'NO'}")
        else:
            print(f"  {what:<24} {METRIC_TEXT[t.metric]} {t.op} {t.bound:g}: {value:.2f} "
                  f"({'met' if t.met(value) else 'NOT met'})")


def report_from(path):
    """Prints the tables of a run from its serving.json, with this script's figures and targets."""
    saved = json.loads(Path(path).read_text())
    models = {name: Model(**{**m, "path": Path(m["path"])}) for name, m in saved["models"].items()}
    rows = []
    for r in saved["rows"]:
        row = parse_rows([r["row"]])[0]
        row.error, row.kiln_mb, row.llama_mb, row.llama_only = r["error"], r["kiln_mb"], r["llama_mb"], r["llama_only"]
        row.build = r["build"] and Build(**{**r["build"], "export": Path(r["build"]["export"])})
        row.rounds = [tuple(x) for x in r["rounds"]]
        rows.append(row)
    report(rows, models, {r.key: figures(r) for r in rows}, argparse.Namespace(**saved["settings"]))
    return 1 if any(r.error for r in rows) else 0


def close_all(workers):
    for worker in workers.values():
        worker.close()
    workers.clear()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", metavar="NAME=MODEL.gguf")
    parser.add_argument("--row", action="append", metavar="MODEL@CAPACITY:PROMPT[,PROMPT...]",
                        help=f"rows to run (default: {' '.join(DEFAULT_ROWS)})")
    parser.add_argument("--rounds", type=int, default=3, help="most rounds per row")
    parser.add_argument("--reuse-compiled", action="store_true",
                        help="keep an export's model.vmfb where the export writes the same model.mlir again "
                             "(no compile figures then)")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--row-budget", type=float, default=240, help="no round starts that would end past this (s)")
    parser.add_argument("--row-timeout", type=float, default=600, help="a row still running after this is cut (s)")
    # The Gemma 3n E2B shape's module compiles in about 11 min on a 2-core machine (33 with const-eval on).
    parser.add_argument("--compile-timeout", type=float, default=3600, help="per export and per compile (s)")
    parser.add_argument("--generate-max-prompt", type=int, default=16,
                        help="also time kiln's `generate` on prompts up to this long")
    parser.add_argument("--dispatches-at", type=lambda v: [int(c) for c in v.split(",") if c], default=[128],
                        metavar="CAPACITY[,CAPACITY...]",
                        help="capacities at which to count dispatches per decode step ('' for none)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--nice", type=int, default=-10,
                        help="the workers' nice value (where permitted), so that other load on the machine moves "
                             "the measurements less")
    parser.add_argument("--seed", type=int, default=0, help="of the prompts of models without a tokenizer")
    parser.add_argument("--llama-flash-attn", action="store_true", help="llama.cpp with flash attention")
    parser.add_argument("--work", type=Path, default=ROOT / "target/bench")
    parser.add_argument("--report", type=Path, metavar="SERVING.json",
                        help="run nothing: print the tables of an earlier run from its serving.json")
    # A worker process (run by the driver, not by hand).
    parser.add_argument("--worker", choices=["kiln", "llama"], help=argparse.SUPPRESS)
    parser.add_argument("--n-ctx", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker == "kiln":
        return kiln_worker(Path(args.models[0]), args.threads, args.nice)
    if args.worker == "llama":
        return llama_worker(Path(args.models[0]), args.n_ctx, args.threads, json.loads(args.overrides),
                            args.llama_flash_attn, args.nice)

    if args.report:
        return report_from(args.report)
    rows = parse_rows(args.row or DEFAULT_ROWS)
    paths = {}
    for arg in args.models:
        name, sep, path = arg.partition("=")
        if not sep:
            sys.exit(f"bench_serving: {arg!r} is not NAME=MODEL.gguf")
        paths[name] = Path(path)
    unknown = sorted({r.model for r in rows} - set(paths) - set(SYNTH_PRESETS))
    if unknown:
        sys.exit(f"bench_serving: no model named {', '.join(unknown)}: give NAME=MODEL.gguf or use a synth preset "
                 f"({', '.join(SYNTH_PRESETS)})")
    # The llama.cpp workers run in this interpreter: without its packages every row would fail
    # after its export compiled.
    try:
        import llama_cpp  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as error:
        sys.exit(f"bench_serving: {sys.executable} cannot import {error.name}: run it with "
                 f"build/bench-venv/bin/python after scripts/bench-venv.sh (`make bench` does both)")
    args.work.mkdir(parents=True, exist_ok=True)
    log(f"rows: {' '.join(r.key for r in rows)}; load average {os.getloadavg()[0]:.1f}")

    models, builds, current = {}, {}, None
    for row in rows:
        log(f"{row.key}: start (load average {os.getloadavg()[0]:.1f})")
        group = (row.model, row.capacity)
        if current in builds and current != group:  # one export's workers at a time
            close_all(builds[current][1])
        current = group
        try:
            if row.model not in models:
                path = paths.get(row.model) or synth(row.model, args.work)
                models[row.model] = load_model(row.model, path)
            if group not in builds:
                builds[group] = (build(models[row.model], row.capacity, args), {})
            row.build, workers = builds[group]
            if row.build.error:
                row.error = f"kiln: {row.build.error}"
            measure(row, models[row.model], args, workers)
        except Exception as error:  # the row fails, the others run
            if isinstance(error, subprocess.CalledProcessError):
                message = f"`{' '.join(map(str, error.cmd))}` failed: {(error.stderr or b'').decode().strip()}"
            else:
                message = str(error) if isinstance(error, RowFailed) else f"{type(error).__name__}: {error}"
            row.error = (row.error + "; " if row.error else "") + message
            log(f"{row.key}: FAILED: {message}")
            if group in builds:
                close_all(builds[group][1])
    if current in builds:
        close_all(builds[current][1])

    figs = {r.key: figures(r) for r in rows}
    raw = args.work / "serving.json"
    plain = lambda obj: {k: str(v) if isinstance(v, Path) else v for k, v in vars(obj).items()}  # noqa: E731
    raw.write_text(json.dumps({
        "settings": {k: getattr(args, k) for k in REPORT_SETTINGS},
        "models": {name: plain(m) for name, m in models.items()},
        "rows": [{"row": r.key, "error": r.error, "figures": figs[r.key], "kiln_mb": r.kiln_mb, "llama_mb": r.llama_mb,
                  "build": r.build and plain(r.build), "rounds": r.rounds, "llama_only": r.llama_only} for r in rows],
    }, indent=1))
    report(rows, models, figs, args)
    print(f"(every round's figures, each step's time included: {raw})")
    failed = [r for r in rows if r.error]
    if failed:
        print(f"\nbench_serving: {len(failed)} of {len(rows)} rows failed: " + "; ".join(
            f"{r.key}: {r.error}" for r in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
