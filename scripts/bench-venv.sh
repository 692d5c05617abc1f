#!/usr/bin/env bash
# The benchmarks' own venv, build/bench-venv (not `make test`'s): llama.cpp
# (llama-cpp-python, built from source) as the speed reference, and numpy.
# A native build of llama.cpp dies with "Illegal instruction" on these
# machines (it enables AMX, which the VMs do not pass through), so the
# instruction sets are named: AVX-512 with VNNI and BF16, no AMX. About
# 6 min on 2 cores, once; the stamp keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/bench-venv
packages="llama-cpp-python==0.3.36 numpy"
cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
-DGGML_AMX_BF16=OFF"
stamp="$packages $cmake_args"
if [ "$(cat "$venv/.kiln-bench" 2>/dev/null)" != "$stamp" ]; then
  echo "bench-venv: building $packages into $venv (llama.cpp from source, ~6 min)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL=2 "$venv/bin/pip" install -q --no-binary llama-cpp-python $packages
  echo "$stamp" >"$venv/.kiln-bench"
fi
