#!/usr/bin/env bash
# Builds, without a container engine, the OCI image archives the node tests
# import into the node's containerd, and prints `name=REF@DIGEST` lines.
#
#   build-image.sh BINARY OUTDIR
#
# - manager.oci.tar, nexo.test/nexo-manager:a: the image Dockerfile.distroless
#   describes: the distroless static base (tests/image/distroless-base.sh)
#   and BINARY (the static musl build) at /nexo-manager, owned by 65532,
#   user 65532:65532, entrypoint /nexo-manager;
# - manager-b.oci.tar, nexo.test/nexo-manager:b: the same layers and one
#   more label: the same binary under another digest, for self-upgrades;
# - manager-crash.oci.tar, nexo.test/nexo-manager:crash: the same, with an
#   argument the binary refuses (exit 2 at start), for a failed upgrade;
# - proxy.oci.tar, nexo.test/tiny-proxy:1: tests/image/tiny-proxy.c, a
#   static program that accepts TCP connections on port 27017, as a
#   stand-in for the Nexo Proxy in legacy deploys.
set -euo pipefail
bin=${1:?usage: build-image.sh BINARY OUTDIR}
out=${2:?usage: build-image.sh BINARY OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
command -v musl-gcc >/dev/null || { echo "build-image.sh: musl-gcc is required (apt-get install musl-tools)" >&2; exit 1; }
mkdir -p "$out"
work=$(mktemp -d -t nexo-image.XXXXXX)
trap 'rm -rf "$work"' EXIT

bash "$here/distroless-base.sh" "$work/base" >&2
image() { # key archive name extra-args...: prints key=REPO@DIGEST
  local key=$1 archive=$2 name=$3
  shift 3
  local digest
  digest=$(python3 "$here/oci-image.py" --out "$out/$archive" --name "$name" "$@")
  [[ $digest == sha256:* ]] || { echo "build-image.sh: no digest for $name" >&2; exit 1; }
  echo "$key=${name%%:*}@$digest"
}
manager=(--rootfs "$work/base" --file "$bin:/nexo-manager:0755:65532"
  --entrypoint /nexo-manager --user 65532:65532)
image manager manager.oci.tar nexo.test/nexo-manager:a "${manager[@]}"
image manager_b manager-b.oci.tar nexo.test/nexo-manager:b "${manager[@]}" --label nexo.test/variant=b
image manager_crash manager-crash.oci.tar nexo.test/nexo-manager:crash "${manager[@]}" --cmd=--crash-at-start

musl-gcc -static -Os -Wall -Werror -o "$work/tiny-proxy" "$here/tiny-proxy.c"
strip "$work/tiny-proxy" 2>/dev/null || true
image proxy proxy.oci.tar nexo.test/tiny-proxy:1 --file "$work/tiny-proxy:/tiny-proxy:0755" \
  --entrypoint /tiny-proxy --user 65532:65532
