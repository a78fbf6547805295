#!/usr/bin/env bash
# Publishes the Manager's image as a release does, offline against a plain
# HTTP registry (the test bed's; tests/supply_chain.rs): pushes the OCI
# image archive, attaches its SBOM and its build provenance to it as OCI
# referrers, and signs the image, the SBOM and the provenance with cosign
# and a key, no transparency log. README.md's "Verify a release" is the
# other side.
#
#   publish.sh ARCHIVE HOST/REPO:TAG KEY BINARY...
#
# ARCHIVE: build-image.sh's manager.oci.tar; KEY: a cosign private key
# (COSIGN_PASSWORD its password); BINARY: the static binaries in the image,
# built with `cargo auditable` (tests/build-static.sh), whose embedded
# dependency lists are the SBOM. Prints `image=DIGEST`, `sbom=DIGEST` and
# `provenance=DIGEST`. Needs python3, git, cargo, and cosign (COSIGN, or on
# PATH).
set -euo pipefail
usage="usage: publish.sh ARCHIVE HOST/REPO:TAG KEY BINARY..."
archive=${1:?$usage}
ref=${2:?$usage}
key=${3:?$usage}
shift 3
[ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cosign=${COSIGN:-$(command -v cosign || true)}
[ -x "$cosign" ] || { echo "publish.sh: cosign is required (COSIGN=PATH, or on PATH)" >&2; exit 1; }
work=$(mktemp -d -t nexo-publish.XXXXXX)
trap 'rm -rf "$work"' EXIT

name=${ref%:*}
image=$(python3 "$here/registry.py" push "$archive" "$ref")
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
created=$(TZ=UTC git -C "$repo" log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null ||
  echo 1970-01-01T00:00:00Z)
lock=sha256:$(sha256sum "$repo/Cargo.lock" | cut -d' ' -f1)

CREATED=$created python3 "$here/sbom.py" sbom "$@" >"$work/sbom.spdx.json"
python3 "$here/sbom.py" provenance --subject "$name@$image" --revision "$revision" \
  --created "$created" --source "https://nexo.example/nexo-manager" \
  --material "Cargo.lock=$lock" >"$work/provenance.json"
sbom=$(python3 "$here/registry.py" attach "$name@$image" application/spdx+json \
  "$work/sbom.spdx.json" application/spdx+json)
provenance=$(python3 "$here/registry.py" attach "$name@$image" application/vnd.in-toto+json \
  "$work/provenance.json" application/vnd.in-toto+json)

for digest in "$image" "$sbom" "$provenance"; do
  "$cosign" sign --key "$key" --tlog-upload=false --allow-http-registry --yes \
    "$name@$digest" >"$work/sign.log" 2>&1 || {
    cat "$work/sign.log" >&2
    echo "publish.sh: cosign could not sign $name@$digest" >&2
    exit 1
  }
done
echo "image=$image"
echo "sbom=$sbom"
echo "provenance=$provenance"
