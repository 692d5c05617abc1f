#!/usr/bin/env bash
# Runs the README's promise on a fresh Debian 12 root: `make demo` (setup,
# build, SmolLM2 through IREE), a few lit tests (lit, FileCheck, CMake,
# kiln check through IREE) and scripts/frontend-check.sh (a crate that
# depends on kiln, built as the README says), inside a chroot made with debootstrap that holds
# only Debian's minbase and scripts/fresh-packages.txt, which is less than a
# new machine of this kind has. The host's Rust toolchain and pyenv CPython,
# which a new machine has outside Debian's packages, are bind-mounted read-only.
# A build that passes on this machine only because of a package installed
# by hand once (libclang, say) fails here.
#
#   scripts/fresh-check.sh                    # as root; 5-10 min on 2 cores
#   KILN_FRESH_FULL=1 scripts/fresh-check.sh  # all of `make test` instead of a few lit tests
#
# The base root is cached in build/fresh-base (delete it to re-bootstrap);
# every run works on a new copy, build/fresh-root, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "fresh-check: run as root (debootstrap, chroot, mount)" >&2; exit 1; }

MIRROR=http://deb.debian.org/debian
BASE=build/fresh-base
ROOT=build/fresh-root
PYENV_PYTHON=$(python3 -c 'import sys; print(sys.base_prefix)')
RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
CARGO_BIN=$(dirname "$(command -v cargo)")
start=$(date +%s)
log() { echo "fresh-check [$(( $(date +%s) - start ))s]: $*"; }

# Checked against the env's list of what a new machine holds, where present.
FRESH_LIST=${KILN_FRESH_LIST:-/work/.library/env/packages/installed-rust.txt}
packages=$(grep -v '^#' scripts/fresh-packages.txt | xargs)
if [ -f "$FRESH_LIST" ]; then
  for p in $packages; do
    grep -qP "^apt\t$p(:amd64)?\t" "$FRESH_LIST" || { echo "fresh-check: $p is not on a new machine ($FRESH_LIST)" >&2; exit 1; }
  done
fi

if [ ! -f "$BASE/.kiln-base" ] || [ "$(cat "$BASE/.kiln-base")" != "$packages" ]; then
  command -v debootstrap >/dev/null || { apt-get update -q; apt-get install -y -q debootstrap; }
  log "debootstrap bookworm (minbase + ${packages// /,}) into $BASE"
  rm -rf "$BASE"
  debootstrap --variant=minbase --include="${packages// /,}" bookworm "$BASE" "$MIRROR" >build/fresh-debootstrap.log
  # LLVM/MLIR 22 come from bookworm-security, as on the host.
  cat >"$BASE/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  echo "$packages" >"$BASE/.kiln-base"
fi

mounts=()
# Never removes a root with anything still mounted in it: that would reach
# the host's /dev or toolchain.
remove_root() {
  [ -e "$ROOT" ] || return 0
  if findmnt -rn -o TARGET | grep -q "^$(realpath "$ROOT")/"; then
    echo "fresh-check: $ROOT still has mounts (findmnt); not removing it" >&2
    return 1
  fi
  rm -rf --one-file-system "$ROOT"
}
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
  remove_root
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bind() { # bind SRC DEST [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
  [ "${3:-}" != ro ] || mount -o remount,ro,bind "$2"
}

log "copying $BASE to $ROOT"
remove_root
cp -a "$BASE" "$ROOT"
# The network of a machine of this kind: DNS, and the CA of its egress proxy
# (in the system bundle, and pip's config pointing at it).
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
[ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$ROOT/etc/pip.conf"
mkdir -p "$ROOT/root/kiln"
# The working tree as a clean clone would have it, plus files not yet committed.
git ls-files -z --cached --others --exclude-standard | tar --null -T - -c | tar -x -C "$ROOT/root/kiln"

bind /proc "$ROOT/proc"
bind /sys "$ROOT/sys" ro
bind /dev "$ROOT/dev"
bind "$RUSTUP_HOME" "$ROOT/opt/rustup" ro
bind "$CARGO_BIN" "$ROOT/opt/cargo-bin" ro
bind "$PYENV_PYTHON" "$ROOT$PYENV_PYTHON" ro

log "make demo, then lit tests, in the chroot"
chroot "$ROOT" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
  PATH="/opt/cargo-bin:$PYENV_PYTHON/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  RUSTUP_HOME=/opt/rustup CARGO_HOME=/root/.cargo CARGO_TERM_COLOR=never KILN_FRESH_FULL="${KILN_FRESH_FULL:-}" \
  SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
  bash -euo pipefail -c '
    cd /root/kiln
    make demo
    if [ -n "${KILN_FRESH_FULL:-}" ]; then
      make test
    else
      /usr/lib/llvm-22/bin/lit -sv test/lit/inspect.test test/lit/cmake.test test/lit/add.kiln
    fi

    scripts/frontend-check.sh /root/frontend
  '
log "passed: make demo, the lit tests and a front-end crate work on a fresh Debian 12 root"
