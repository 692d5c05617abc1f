#!/bin/sh
# kill_export.sh MODEL DIR: starts an archive export of MODEL into DIR,
# SIGKILLs it while it writes the archive (an open file under DIR with data
# in it), then lists DIR. A killed export must leave no temporary file.
set -eu
model=$1 dir=$2
kiln export "$model" -o "$dir" --params archive --packed dequantize --dtype f32 >/dev/null &
pid=$!
writing=""
for _ in $(seq 3000); do
  for fd in /proc/$pid/fd/*; do
    target=$(readlink "$fd" 2>/dev/null) || continue
    case $target in
      "$dir"/*) [ "$(stat -L -c %s "$fd" 2>/dev/null || echo 0)" -gt 1048576 ] && writing=$target ;;
    esac
  done
  [ -z "$writing" ] || break
  sleep 0.01
done
kill -9 $pid
wait $pid 2>/dev/null || true
[ -n "$writing" ] || { echo "the export never wrote into $dir" >&2; exit 1; }
echo "killed while writing: $writing"
ls -A "$dir"
echo "listed"
