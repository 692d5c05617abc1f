#!/usr/bin/env bash
# Installs what kiln's build and tests need, and nothing that is already
# there: Debian's LLVM/MLIR 22 (+ lit, FileCheck, CMake) and a project-local
# Python venv with IREE's compiler and runtime from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools libpolly-22-dev
  libzstd-dev zlib1g-dev libxml2-dev cmake
)
PIP_PACKAGES=(
  iree-base-compiler==3.13.0 iree-base-runtime==3.13.0 numpy gguf safetensors
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

# The stamp holds the package list, so changing it reinstalls.
stamp=.venv/.kiln-setup
want="${PIP_PACKAGES[*]}"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating .venv with ${want}"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
  echo "$want" > "$stamp"
fi

for tool in iree-compile iree-run-module; do
  [ -x ".venv/bin/$tool" ] || { echo "setup: .venv/bin/$tool is missing after install" >&2; exit 1; }
done
for tool in lit FileCheck; do
  [ -x "/usr/lib/llvm-22/bin/$tool" ] || { echo "setup: /usr/lib/llvm-22/bin/$tool is missing" >&2; exit 1; }
done
