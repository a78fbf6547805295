#!/usr/bin/env bash
# Pins the release's Manager image by digest in the bundle's defaults:
# builds the static binaries (tests/build-static.sh, amd64 and arm64) and
# the multi-architecture image (tests/image/build-image.sh, the steps of
# Dockerfile.distroless: an OCI image index of the linux/amd64 and
# linux/arm64 images), and writes the index's digest into
# manifests/deployment.yaml (the container's image) and Chart.yaml
# (Artifact Hub's artifacthub.io/images; the chart's values pin no digest
# unless image.digest is given), and the three
# digests into the release notes: the `### Image` list of the newest
# release's section of CHANGELOG.md. Pushing that archive as is keeps the
# digests: they are its OCI index's and manifests'. Prints the index
# digest. tests/chart.rs checks that the three places agree.
#
# Run it once the release's section (`## [X.Y.Z] - DATE`) is written.
set -euo pipefail
cd "$(dirname "$0")/../.."
amd64=$(bash tests/build-static.sh amd64)
arm64=$(bash tests/build-static.sh arm64)
out=$(mktemp -d -t nexo-release.XXXXXX)
trap 'rm -rf "$out"' EXIT
refs=$(bash tests/image/build-image.sh "$amd64" "$out" "$arm64")
ref() { printf '%s\n' "$refs" | sed -n "s/^$1=.*@\(sha256:[0-9a-f]\{64\}\)\$/\1/p"; }
digest=$(ref manager) digest_amd64=$(ref manager_amd64) digest_arm64=$(ref manager_arm64)
[ -n "$digest" ] && [ -n "$digest_amd64" ] && [ -n "$digest_arm64" ] ||
  { printf '%s\n' "$refs" >&2; echo "stamp-release.sh: build-image.sh gave no index and per-architecture digests" >&2; exit 1; }
sed -i "s|\(image: registry.example.com/nexo/manager@\)sha256:[0-9a-f]\{64\}|\1$digest|" manifests/deployment.yaml charts/nexo-manager/Chart.yaml
for f in manifests/deployment.yaml charts/nexo-manager/Chart.yaml; do
  grep -q "$digest" "$f" || { echo "stamp-release.sh: the digest was not written into $f" >&2; exit 1; }
done
# The release notes: the newest `## [X.Y.Z]` section's `### Image` list,
# replaced or added at the section's end.
python3 - "$digest" "$digest_amd64" "$digest_arm64" <<'PY'
import re, sys
index, amd64, arm64 = sys.argv[1:]
path = "CHANGELOG.md"
text = open(path).read()
m = re.search(r"^## \[\d+\.\d+\.\d+\].*$", text, re.M)
if not m:
    sys.exit("stamp-release.sh: CHANGELOG.md has no release section (## [X.Y.Z] - DATE) to write the digests into")
start = m.end()
nxt = re.search(r"^## ", text[start:], re.M)
end = start + nxt.start() if nxt else len(text)
section = re.sub(r"\n### Image\n(?:.*\n)*?(?=\n### |\Z)", "\n", text[start:end].rstrip("\n") + "\n")
block = ("\n### Image\n"
         "The multi-architecture image (an OCI image index; the chart and `manifests/` pin the index):\n"
         f"- index: `{index}`\n- linux/amd64: `{amd64}`\n- linux/arm64: `{arm64}`\n"
         "\nVerify it with the release's `cosign.pub` (README.md, \"Verify a release\"):\n"
         f"`cosign verify --key cosign.pub --insecure-ignore-tlog=true registry.example.com/nexo/manager@{index}`;\n"
         "its SBOM (SPDX) and build provenance (SLSA v1) are its OCI referrers (`oras discover`),\n"
         "each signed with the same key.\n")
text = text[:start] + section.rstrip("\n") + "\n" + block + ("\n" if nxt else "") + text[end:]
open(path, "w").write(text)
PY
echo "$digest"
