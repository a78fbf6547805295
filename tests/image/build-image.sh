#!/usr/bin/env bash
# Builds, without a container engine, the OCI image archives the node tests
# import into the node's containerd, and prints `name=REF@DIGEST` lines.
#
#   build-image.sh BINARY OUTDIR [ARM64_BINARY]
#
# - manager.oci.tar, nexo.test/nexo-manager:a: the image Dockerfile.distroless
#   describes: the distroless static base (tests/image/distroless-base.sh)
#   and BINARY (the static musl build) at /nexo-manager, owned by 65532,
#   user 65532:65532, entrypoint /nexo-manager, and the Dockerfile's
#   org.opencontainers.image.* labels as labels and as annotations of the
#   index and each manifest (VERSION from Cargo.toml, REVISION and CREATED
#   the checkout's commit and its time). With ARM64_BINARY (the
#   aarch64 build, `tests/build-static.sh arm64`), the multi-architecture
#   image: an OCI image index of the linux/amd64 image and the linux/arm64
#   one, which share the base layer (its files are the same on both: text,
#   certificates and time zones, no program); `manager=` names the index,
#   `manager_amd64=` and `manager_arm64=` each image;
# - manager-b.oci.tar, nexo.test/nexo-manager:b: the same layers and one
#   more label: the same binary under another digest, for self-upgrades;
# - manager-crash.oci.tar, nexo.test/nexo-manager:crash: the same, with an
#   argument the binary refuses (exit 2 at start), for a failed upgrade;
# - proxy.oci.tar, nexo.test/tiny-proxy:1: tests/image/tiny-proxy.c, a
#   static program that accepts TCP connections on port 27017, as a
#   stand-in for the Nexo Proxy in legacy deploys.
set -euo pipefail
bin=${1:?usage: build-image.sh BINARY OUTDIR [ARM64_BINARY]}
out=${2:?usage: build-image.sh BINARY OUTDIR [ARM64_BINARY]}
arm64=${3:-}
[ -z "$arm64" ] || [ -f "$arm64" ] || { echo "build-image.sh: no arm64 binary $arm64" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
command -v musl-gcc >/dev/null || { echo "build-image.sh: musl-gcc is required (apt-get install musl-tools)" >&2; exit 1; }
mkdir -p "$out"
work=$(mktemp -d -t nexo-image.XXXXXX)
trap 'rm -rf "$work"' EXIT

bash "$here/distroless-base.sh" "$work/base" >&2
# The Dockerfile's OCI labels, its build arguments given as a release gives
# them.
repo=$(cd "$here/../.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
created=$(TZ=UTC git -C "$repo" log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null ||
  echo 1970-01-01T00:00:00Z)
oci=()
while IFS= read -r kv; do
  kv=${kv//'${VERSION}'/$version}
  kv=${kv//'${REVISION}'/$revision}
  kv=${kv//'${CREATED}'/$created}
  oci+=(--label "$kv" --annotation "$kv")
done < <(sed -n 's/^LABEL \(org\.opencontainers\.image\.[a-z.]*\)="\(.*\)"$/\1=\2/p' "$repo/Dockerfile.distroless")
[ "${#oci[@]}" -ge 14 ] || { echo "build-image.sh: no OCI labels read from Dockerfile.distroless" >&2; exit 1; }
image() { # key archive name extra-args...: prints key=REPO@DIGEST
  # (and key_ARCH=REPO@DIGEST for each image of an index)
  local key=$1 archive=$2 name=$3
  shift 3
  local lines digest platform
  lines=$(python3 "$here/oci-image.py" --out "$out/$archive" --name "$name" "$@")
  digest=$(printf '%s\n' "$lines" | head -n 1)
  [[ $digest == sha256:* ]] || { echo "build-image.sh: no digest for $name" >&2; exit 1; }
  echo "$key=${name%%:*}@$digest"
  while IFS== read -r platform digest; do
    echo "${key}_${platform#linux/}=${name%%:*}@$digest"
  done < <(printf '%s\n' "$lines" | tail -n +2)
}
manager=(--rootfs "$work/base" --file "$bin:/nexo-manager:0755:65532"
  --entrypoint /nexo-manager --user 65532:65532 "${oci[@]}")
if [ -n "$arm64" ]; then
  image manager manager.oci.tar nexo.test/nexo-manager:a --rootfs "$work/base" \
    --arch-file "amd64=$bin:/nexo-manager:0755:65532" --arch-file "arm64=$arm64:/nexo-manager:0755:65532" \
    --entrypoint /nexo-manager --user 65532:65532 "${oci[@]}"
else
  image manager manager.oci.tar nexo.test/nexo-manager:a "${manager[@]}"
fi
image manager_b manager-b.oci.tar nexo.test/nexo-manager:b "${manager[@]}" --label nexo.test/variant=b
image manager_crash manager-crash.oci.tar nexo.test/nexo-manager:crash "${manager[@]}" --cmd=--crash-at-start

musl-gcc -static -Os -Wall -Werror -o "$work/tiny-proxy" "$here/tiny-proxy.c"
strip "$work/tiny-proxy" 2>/dev/null || true
image proxy proxy.oci.tar nexo.test/tiny-proxy:1 --file "$work/tiny-proxy:/tiny-proxy:0755" \
  --entrypoint /tiny-proxy --user 65532:65532
