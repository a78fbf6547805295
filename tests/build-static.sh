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
# both. Where they cannot be had, it says so loudly and builds the glibc
# crt-static binary instead, so the tests still run a static binary.
set -euo pipefail
cd "$(dirname "$0")/.."

musl=x86_64-unknown-linux-musl
gnu=x86_64-unknown-linux-gnu
have_musl_std() { rustup target list --installed 2>/dev/null | grep -qx "$musl"; }

if have_musl_std && command -v musl-gcc >/dev/null 2>&1; then
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --release --locked --target "$musl" --bin nexo-manager >&2
  echo "${CARGO_TARGET_DIR:-$PWD/target}/$musl/release/nexo-manager"
else
  {
    echo "################################################################"
    echo "build-static.sh: WARNING: the $musl standard library or musl-gcc"
    echo "is missing (rustup target add $musl; apt-get install musl-tools)."
    echo "Building the glibc crt-static binary instead: it is about 1 MB"
    echo "larger than the one the image ships."
    echo "################################################################"
  } >&2
  RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked --target "$gnu" --bin nexo-manager >&2
  echo "${CARGO_TARGET_DIR:-$PWD/target}/$gnu/release/nexo-manager"
fi
