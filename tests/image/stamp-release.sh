#!/usr/bin/env bash
# Pins the release's Manager image by digest in the bundle's defaults:
# builds the static binary (tests/build-static.sh) and the image
# (tests/image/build-image.sh, the steps of Dockerfile.distroless), and
# writes the image's digest into charts/nexo-manager/values.yaml
# (image.digest) and manifests/deployment.yaml (the container's image).
# Pushing that archive as is keeps the digest: it is the OCI manifest's.
# Prints the digest. tests/chart.rs checks the two files agree.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(bash tests/build-static.sh)
out=$(mktemp -d -t nexo-release.XXXXXX)
trap 'rm -rf "$out"' EXIT
digest=$(bash tests/image/build-image.sh "$bin" "$out" | sed -n 's/^manager=.*@\(sha256:[0-9a-f]\{64\}\)$/\1/p')
[ -n "$digest" ] || { echo "stamp-release.sh: build-image.sh gave no manager digest" >&2; exit 1; }
sed -i "s|^  digest: \"sha256:[0-9a-f]\{64\}\"|  digest: \"$digest\"|" charts/nexo-manager/values.yaml
sed -i "s|\(image: registry.example.com/nexo/manager@\)sha256:[0-9a-f]\{64\}|\1$digest|" manifests/deployment.yaml
grep -q "$digest" charts/nexo-manager/values.yaml && grep -q "$digest" manifests/deployment.yaml ||
  { echo "stamp-release.sh: the digest was not written into both files" >&2; exit 1; }
echo "$digest"
