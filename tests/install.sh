#!/usr/bin/env bash
# Installs what a fresh machine (Rust and Go, nothing else) lacks for the
# tests and the sandbox: Debian's packages, rustup's components and
# targets. Does nothing when everything is there. tests/run.sh and
# tests/sandbox.sh run it first, so README.md's two commands work on such a
# machine as they are written; .ci/run runs tests/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in curl openssl python3 pgrep strace jq musl-gcc aarch64-linux-gnu-gcc qemu-aarch64-static containerd runc iptables conntrack ip nsenter flock git gpg; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
# The CNI plugins of the test bed's node (bridge, host-local, portmap).
[ -x /usr/lib/cni/bridge ] || missing+=(cni)
if [ ${#missing[@]} -gt 0 ]; then
  pkgs=()
  for tool in "${missing[@]}"; do
    case $tool in
      pgrep) pkgs+=(procps) ;;
      musl-gcc) pkgs+=(musl-tools) ;;
      aarch64-linux-gnu-gcc) pkgs+=(gcc-aarch64-linux-gnu) ;;
      qemu-aarch64-static) pkgs+=(qemu-user-static) ;;
      ip) pkgs+=(iproute2) ;;
      nsenter | flock) pkgs+=(util-linux) ;;
      gpg) pkgs+=(gnupg) ;;
      cni) pkgs+=(containernetworking-plugins) ;;
      *) pkgs+=("$tool") ;;
    esac
  done
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}"
fi
command -v go >/dev/null || { echo "tests/install.sh: Go is required to build the test bed" >&2; exit 1; }
command -v cargo >/dev/null || { echo "tests/install.sh: Rust (cargo) is required" >&2; exit 1; }
# clippy and rustfmt, for the release check (.ci/release-check).
if ! cargo clippy --version >/dev/null 2>&1 || ! cargo fmt --version >/dev/null 2>&1; then
  rustup component add clippy rustfmt ||
    { echo "tests/install.sh: cannot add clippy and rustfmt, which the release check needs" >&2; exit 1; }
fi
# cargo-auditable, which embeds the dependency list in the shipped static
# binaries (tests/build-static.sh): a scanner reads it from the binary, and
# the image's SBOM is made from it (tests/image/sbom.py).
AUDITABLE_VERSION=0.7.7
if ! cargo install --list 2>/dev/null | grep -qx "cargo-auditable v$AUDITABLE_VERSION:"; then
  echo "tests/install.sh: building cargo-auditable $AUDITABLE_VERSION (once)" >&2
  cargo install --locked --quiet cargo-auditable --version "$AUDITABLE_VERSION" ||
    { echo "tests/install.sh: cannot build cargo-auditable $AUDITABLE_VERSION from the crates registry" >&2; exit 1; }
fi
# The standard library for the musl targets of the shipped static binaries.
# Without it tests/build-static.sh fails in CI (no glibc stand-in there):
# said here, before the test bed is built rather than after.
# The arm64 one (aarch64-unknown-linux-musl) is built beside it, and run
# under qemu-user (tests/arm64.rs).
for target in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
  if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    rustup target add "$target" ||
      { echo "tests/install.sh: cannot add the $target target, which the static binaries need" >&2; exit 1; }
  fi
done

