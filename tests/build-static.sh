#!/usr/bin/env bash
# Builds the static release binary that the image ships, with the command
# Dockerfile.distroless runs, and prints its path on stdout.
#
#   CC_x86_64_unknown_linux_musl=musl-gcc \
#     cargo build --release --locked --target x86_64-unknown-linux-musl --bin nexo-manager
#
# musl, not glibc with crt-static: the same binary is 1 MB smaller (glibc's
# static archive drags in NSS, iconv and stdio machinery), which is most of
# the footprint budget (see BENCHMARKS.md). It needs the Rust standard
# library for the musl target (`rustup target add x86_64-unknown-linux-musl`)
# and Debian's musl-tools (musl-gcc compiles ring's C code); .ci/run installs
# both. In CI (CI=true) a missing one is an error: the tests and the
# benchmarks must measure the binary the image ships. Elsewhere it says so
# loudly and builds the glibc crt-static binary instead, so the tests still
# run a static binary.
set -euo pipefail
cd "$(dirname "$0")/.."

musl=x86_64-unknown-linux-musl
gnu=x86_64-unknown-linux-gnu
have_musl_std() { rustup target list --installed 2>/dev/null | grep -qx "$musl"; }
in_ci() { case ${CI:-} in true | 1) return 0 ;; *) return 1 ;; esac; }
fail() { echo "build-static.sh: $*" >&2; exit 1; }
# The binary cargo wrote, which must be there (a target-dir set in a cargo
# configuration would put it elsewhere).
print_binary() { # target
  local bin=${CARGO_TARGET_DIR:-$PWD/target}/$1/release/nexo-manager
  [ -x "$bin" ] || fail "cargo reported success but $bin is not there"
  echo "$bin"
}

if have_musl_std && command -v musl-gcc >/dev/null 2>&1; then
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --release --locked --target "$musl" --bin nexo-manager >&2 ||
    fail "the $musl build of nexo-manager failed (above)"
  print_binary "$musl"
  exit 0
fi

missing=()
have_musl_std || missing+=("the $musl standard library (rustup target add $musl)")
command -v musl-gcc >/dev/null 2>&1 || missing+=("musl-gcc (apt-get install musl-tools)")
if in_ci; then
  for what in "${missing[@]}"; do echo "build-static.sh: missing: $what" >&2; done
  fail "cannot build the static $musl binary the image ships, and in CI (CI=$CI) no other binary will do"
fi
{
  echo "################################################################"
  for what in "${missing[@]}"; do echo "build-static.sh: WARNING: missing: $what"; done
  echo "Building the glibc crt-static binary instead: it is about 1 MB"
  echo "larger than the one the image ships. (In CI this is an error.)"
  echo "################################################################"
} >&2
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked --target "$gnu" --bin nexo-manager >&2
print_binary "$gnu"
