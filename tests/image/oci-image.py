#!/usr/bin/env python3
"""Writes an OCI image archive (an OCI image layout in a tar), without a
container engine, for `ctr images import`.

    oci-image.py --out IMAGE.tar --name REPO:TAG \
        [--rootfs DIR]... [--file SRC:DEST:MODE[:UID]]... \
        [--arch ARCH | --arch-file ARCH=SRC:DEST:MODE[:UID]...] \
        [--entrypoint PATH] [--cmd ARG]... [--user UID:GID] [--env K=V]... [--label K=V]...
        [--annotation K=V]...

Each --rootfs DIR becomes one layer (its files owned by root), then all
--file entries together become one more layer. Layers are uncompressed,
reproducible tars (sorted names, mtime 0, numeric owners), so the same
inputs always give the same digests.

One image, for --arch (default amd64): prints its manifest digest, which
is what `REPO@sha256:...` references name. With --arch-file, one image per
architecture named there, whose last layer holds the --file entries and
that architecture's files, and an OCI image index of them all (platform
linux/ARCH each): prints the index's digest (what the reference names; a
runtime picks its platform's image from it), then one `linux/ARCH=DIGEST`
line per image.

Each --annotation is set on every image manifest and on the index (the
OCI annotations, `org.opencontainers.image.*`, as buildx's `--annotation
index,manifest:K=V` sets them); each --label is a label of each config.
"""
import argparse
import hashlib
import io
import json
import os
import sys
import tarfile


def add_blob(blobs, data, media_type):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def tar_info(name, st_mode, size=0, uid=0, gid=0):
    info = tarfile.TarInfo(name)
    info.mode = st_mode & 0o7777
    info.size = size
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def rootfs_layer(root):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            for name in sorted(dirnames + filenames):
                path = os.path.join(dirpath, name)
                arc = os.path.normpath(os.path.join(rel, name))
                st = os.lstat(path)
                if os.path.islink(path):
                    info = tar_info(arc, st.st_mode)
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(path)
                    tar.addfile(info)
                elif os.path.isdir(path):
                    info = tar_info(arc, st.st_mode)
                    info.type = tarfile.DIRTYPE
                    # /tmp stays world-writable with the sticky bit.
                    tar.addfile(info)
                elif os.path.isfile(path):
                    info = tar_info(arc, st.st_mode, st.st_size)
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
    return out.getvalue()


def files_layer(specs):
    out = io.BytesIO()
    dirs = set()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for spec in sorted(specs, key=lambda s: s.split(":")[1]):
            parts = spec.split(":")
            if len(parts) not in (3, 4):
                sys.exit(f"oci-image.py: --file {spec!r} is not SRC:DEST:MODE[:UID]")
            src, dest, mode = parts[0], parts[1].lstrip("/"), int(parts[2], 8)
            uid = int(parts[3]) if len(parts) == 4 else 0
            parent = os.path.dirname(dest)
            while parent and parent not in dirs:
                dirs.add(parent)
                info = tar_info(parent, 0o755)
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                parent = os.path.dirname(parent)
            with open(src, "rb") as f:
                data = f.read()
            tar.addfile(tar_info(dest, mode, len(data), uid, uid), io.BytesIO(data))
    return out.getvalue()


def image_manifest(blobs, a, arch, base, files):
    """The config and manifest of one image for `arch`: the `base` layers
    and, when there are `files`, a layer of them. Returns the manifest's
    descriptor."""
    layers = list(base)
    if files:
        layers.append(add_blob(blobs, files_layer(files), "application/vnd.oci.image.layer.v1.tar"))
    diff_ids = [layer["digest"] for layer in layers]
    config = {
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + a.env,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/image/oci-image.py"}],
    }
    if a.entrypoint:
        config["config"]["Entrypoint"] = [a.entrypoint]
    if a.cmd:
        config["config"]["Cmd"] = a.cmd
    if a.user:
        config["config"]["User"] = a.user
    if a.label:
        config["config"]["Labels"] = dict(kv.split("=", 1) for kv in a.label)
    cfg = add_blob(blobs, json.dumps(config, sort_keys=True).encode(),
                   "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": cfg, "layers": layers}
    if a.annotation:
        manifest["annotations"] = dict(kv.split("=", 1) for kv in a.annotation)
    return add_blob(blobs, json.dumps(manifest, sort_keys=True).encode(),
                    "application/vnd.oci.image.manifest.v1+json")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True, help="REPO:TAG the image is imported as")
    p.add_argument("--rootfs", action="append", default=[])
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--entrypoint")
    p.add_argument("--cmd", action="append", default=[], help="one argument of Cmd")
    p.add_argument("--user")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--label", action="append", default=[])
    p.add_argument("--annotation", action="append", default=[],
                   help="K=V: an annotation of each manifest and of the index")
    p.add_argument("--arch", default="amd64", help="the one image's architecture")
    p.add_argument("--arch-file", action="append", default=[],
                   help="ARCH=SRC:DEST:MODE[:UID]: an image per ARCH, in an image index")
    a = p.parse_args()
    if not a.rootfs and not a.file and not a.arch_file:
        sys.exit("oci-image.py: nothing to put in the image (--rootfs or --file)")
    for kv in a.label + a.annotation:
        if "=" not in kv or not kv.split("=", 1)[0]:
            sys.exit(f"oci-image.py: {kv!r} is not K=V")

    arch_files = {}
    for spec in a.arch_file:
        arch, sep, file_spec = spec.partition("=")
        if not sep or not arch or not file_spec:
            sys.exit(f"oci-image.py: --arch-file {spec!r} is not ARCH=SRC:DEST:MODE[:UID]")
        arch_files.setdefault(arch, []).append(file_spec)

    blobs = {}
    base = [add_blob(blobs, rootfs_layer(r), "application/vnd.oci.image.layer.v1.tar")
            for r in a.rootfs]
    if not arch_files:
        top, lines = image_manifest(blobs, a, a.arch, base, a.file), []
    else:
        mans = []
        for arch in sorted(arch_files):
            m = image_manifest(blobs, a, arch, base, a.file + arch_files[arch])
            m["platform"] = {"architecture": arch, "os": "linux"}
            mans.append(m)
        index_blob = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                      "manifests": mans}
        if a.annotation:
            index_blob["annotations"] = dict(kv.split("=", 1) for kv in a.annotation)
        top = add_blob(blobs, json.dumps(index_blob, sort_keys=True).encode(),
                       "application/vnd.oci.image.index.v1+json")
        lines = [f"linux/{m['platform']['architecture']}={m['digest']}" for m in mans]
    tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
    top["annotations"] = {"io.containerd.image.name": a.name,
                          "org.opencontainers.image.ref.name": tag}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [top]}

    entries = [("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
               ("index.json", json.dumps(index, sort_keys=True).encode())]
    entries += [(f"blobs/sha256/{d.split(':')[1]}", data) for d, data in sorted(blobs.items())]
    with tarfile.open(a.out, "w", format=tarfile.PAX_FORMAT) as tar:
        for dname in ("blobs", "blobs/sha256"):
            info = tar_info(dname, 0o755)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in entries:
            tar.addfile(tar_info(name, 0o644, len(data)), io.BytesIO(data))
    print(top["digest"])
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
