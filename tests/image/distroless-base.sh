#!/usr/bin/env bash
# Writes into DIR (new or empty) the root filesystem of distroless
# static-debian12 (nonroot), rebuilt from the Debian 12 packages it is made
# of, since no registry can be reached: base-files, netbase, tzdata and the
# CA bundle of ca-certificates, plus passwd, group, nsswitch.conf, /tmp and
# /home/nonroot; documentation and package scripts left out, as distroless
# leaves them out.
#
#   distroless-base.sh DIR
set -euo pipefail
root=${1:?usage: distroless-base.sh DIR}
for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "distroless-base.sh: '$tool' is required" >&2; exit 1; }
done
mkdir -p "$root"
[ -z "$(ls -A "$root")" ] || { echo "distroless-base.sh: $root is not empty" >&2; exit 1; }
root=$(cd "$root" && pwd)
debs=$(mktemp -d -t nexo-debs.XXXXXX)
trap 'rm -rf "$debs"' EXIT
pkgs=(base-files netbase tzdata ca-certificates)
cd "$debs"
if ! apt-get download "${pkgs[@]}" >/dev/null 2>"$debs/apt.err"; then
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get download "${pkgs[@]}" >/dev/null 2>"$debs/apt.err" || {
    echo "distroless-base.sh: cannot download ${pkgs[*]} from Debian's archive:" >&2
    cat "$debs/apt.err" >&2
    exit 1
  }
fi
for deb in ./*.deb; do dpkg-deb -x "$deb" "$root"; done
# The CA bundle as update-ca-certificates writes it; the separate files go.
mkdir -p "$root/etc/ssl/certs"
cat "$root"/usr/share/ca-certificates/mozilla/*.crt >"$root/etc/ssl/certs/ca-certificates.crt"
rm -rf "$root/usr/share/ca-certificates" "$root/usr/sbin" "$root/etc/ca-certificates" \
  "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian" \
  "$root/usr/share/info" "$root/usr/share/bash-completion"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$root/etc/group"
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
mkdir -p "$root/tmp" "$root/home/nonroot"
chmod 1777 "$root/tmp"
