#!/usr/bin/env bash
# The size of the image Dockerfile.distroless would make, without a
# container engine, three ways for each of its two layers:
# - files: the sum of the file sizes once unpacked, which is how container
#   engines report an image's size;
# - tar: the layer as an uncompressed tar (every small file padded to 512
#   bytes, plus a 512-byte header: zoneinfo's 1,800 files weigh double);
# - gz: the tar gzip-compressed, what a registry stores and a node pulls.
#
#   image-size.sh BINARY
#
# - app layer: BINARY at /nexo-manager, owned by 65532, as the Dockerfile's
#   COPY writes it.
# - base layer: a reconstruction of distroless static-debian12 (nonroot)
#   from the Debian 12 packages it is made of (tests/image/distroless-base.sh).
#
# Prints key=value lines: app_files app_tar app_gz base_files base_tar
# base_gz (bytes).
set -euo pipefail
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: image-size.sh BINARY (an existing file)" >&2; exit 2; }
bin=$(readlink -f "$1")
for tool in tar gzip; do
  command -v "$tool" >/dev/null || { echo "image-size.sh: '$tool' is required" >&2; exit 1; }
done
work=$(mktemp -d -t nexo-image.XXXXXX)
trap 'rm -rf "$work"' EXIT

layer() { # dir out.tar: a reproducible tar of dir's contents, like a layer
  tar --sort=name --mtime=@0 --numeric-owner --owner="${3:-0}" --group="${3:-0}" \
    -C "$1" -cf "$2" .
}

mkdir -p "$work/app"
cp "$bin" "$work/app/nexo-manager"
layer "$work/app" "$work/app.tar" 65532

root=$work/base
bash "$(dirname "$0")/../image/distroless-base.sh" "$root"
layer "$root" "$work/base.tar"

size() { stat -c %s "$1"; }
gz() { gzip -9 -n -c "$1" | wc -c; }
files() { find "$1" \( -type f -o -type l \) -printf '%s\n' | awk '{n += $1} END {print n + 0}'; }
echo "app_files=$(files "$work/app")"
echo "app_tar=$(size "$work/app.tar")"
echo "app_gz=$(gz "$work/app.tar")"
echo "base_files=$(files "$root")"
echo "base_tar=$(size "$work/base.tar")"
echo "base_gz=$(gz "$work/base.tar")"
