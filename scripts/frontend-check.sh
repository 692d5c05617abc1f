#!/usr/bin/env bash
# Builds and runs examples/frontend as a user's crate would be: in DIR,
# outside kiln's tree and workspace, with its own target folder, set up only
# as the README's "Depending on kiln" says (the dependency line and the
# `.cargo/config.toml` snippet, taken from the README itself).
#
#   scripts/frontend-check.sh /tmp/frontend     # a full build of kiln: minutes
set -euo pipefail
kiln=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: scripts/frontend-check.sh DIR}
rm -rf "$dir"
mkdir -p "$dir/src" "$dir/.cargo"
cp "$kiln/examples/frontend/src/main.rs" "$dir/src/"
sed "s|^kiln = .*|kiln = { path = \"$kiln\" }|" "$kiln/examples/frontend/Cargo.toml" >"$dir/Cargo.toml"
awk '/^# \.cargo\/config\.toml of a crate that depends on kiln/ {on = 1} /^```/ {on = 0} on' \
  "$kiln/README.md" >"$dir/.cargo/config.toml"
grep -q MLIR_SYS_220_PREFIX "$dir/.cargo/config.toml" || { echo "frontend-check: no config snippet in README.md" >&2; exit 1; }
# The versions kiln's own tests use.
cp "$kiln/Cargo.lock" "$dir/"
cd "$dir"
cargo run
