#!/usr/bin/env bash
# Builds the static release binary that the image ships, with the command
# Dockerfile.distroless runs, and prints its path on stdout.
#
#   build-static.sh [amd64|arm64]        (default amd64)
#
#   amd64: CC_x86_64_unknown_linux_musl=musl-gcc \
#            cargo auditable build --release --locked --target x86_64-unknown-linux-musl --bin nexo-manager
#   arm64: CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc \
#          CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc \
#            cargo auditable build --release --locked --target aarch64-unknown-linux-musl --bin nexo-manager
#
# `cargo auditable` (cargo-auditable, tests/install.sh installs it) embeds
# the dependency list in the binary (a `.dep-v0` section, about 1 KB), which
# scanners read and the image's SBOM is made from (tests/image/sbom.py).
#
# musl, not glibc with crt-static: the same binary is 1 MB smaller (glibc's
# static archive drags in NSS, iconv and stdio machinery), which is most of
# the footprint budget (see BENCHMARKS.md). It needs the Rust standard
# library for the musl target (`rustup target add <target>`) and a C
# compiler for ring's C code: Debian's musl-tools (musl-gcc) on amd64, the
# cross compiler gcc-aarch64-linux-gnu for arm64, which also links (Rust's
# musl targets bring their own C library and start files); tests/install.sh
# installs all of them. arm64 has no fallback: a missing piece is an error.
# For amd64, in CI (CI=true) a missing one is an error too: the tests and
# the benchmarks must measure the binary the image ships. Elsewhere it says
# so loudly and builds the glibc crt-static binary instead, so the tests
# still run a static binary.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "build-static.sh: $*" >&2; exit 1; }
cargo install --list 2>/dev/null | grep -q '^cargo-auditable v' ||
  fail "cargo-auditable is not installed (tests/install.sh installs it)"
have_std() { rustup target list --installed 2>/dev/null | grep -qx "$1"; }
in_ci() { case ${CI:-} in true | 1) return 0 ;; *) return 1 ;; esac; }
# The binary cargo wrote, which must be there (a target-dir set in a cargo
# configuration would put it elsewhere).
print_binary() { # target
  local bin=${CARGO_TARGET_DIR:-$PWD/target}/$1/release/nexo-manager
  [ -x "$bin" ] || fail "cargo reported success but $bin is not there"
  echo "$bin"
}

case ${1:-amd64} in
  amd64) ;;
  arm64)
    target=aarch64-unknown-linux-musl cc=aarch64-linux-gnu-gcc
    missing=()
    have_std "$target" || missing+=("the $target standard library (rustup target add $target)")
    command -v "$cc" >/dev/null 2>&1 || missing+=("$cc (apt-get install gcc-aarch64-linux-gnu)")
    if [ ${#missing[@]} -gt 0 ]; then
      for what in "${missing[@]}"; do echo "build-static.sh: missing: $what" >&2; done
      fail "cannot build the static $target binary of the arm64 image"
    fi
    CC_aarch64_unknown_linux_musl=$cc CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=$cc \
      cargo auditable build --release --locked --target "$target" --bin nexo-manager >&2 ||
      fail "the $target build of nexo-manager failed (above)"
    print_binary "$target"
    exit 0 ;;
  *) fail "unknown architecture '$1' (amd64 or arm64)" ;;
esac

musl=x86_64-unknown-linux-musl
gnu=x86_64-unknown-linux-gnu
have_musl_std() { have_std "$musl"; }
if have_musl_std && command -v musl-gcc >/dev/null 2>&1; then
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo auditable build --release --locked --target "$musl" --bin nexo-manager >&2 ||
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
  cargo auditable build --release --locked --target "$gnu" --bin nexo-manager >&2
print_binary "$gnu"
