#!/usr/bin/env python3
"""Writes the SBOM (SPDX 2.3, JSON) and the build provenance (an in-toto
statement of SLSA provenance v1) of the Manager's image.

    sbom.py sbom BINARY... > sbom.spdx.json
    sbom.py deps BINARY
    sbom.py provenance --subject NAME@DIGEST --revision SHA --created TIME \
        --source URL [--material NAME=DIGEST]... > provenance.json

The SBOM lists what is linked into each binary, read from the binary itself:
the dependency list `cargo auditable` embeds (its `.dep-v0` section, zlib
compressed JSON), with each crate's declared licence from `cargo metadata`
of the checkout. `deps` prints that list, one `name version` a line.
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def die(msg):
    sys.exit(f"sbom.py: {msg}")


def section(path, wanted):
    """The bytes of the ELF section `wanted` of `path` (64-bit, either
    endianness)."""
    with open(path, "rb") as f:
        elf = f.read()
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        die(f"{path} is not a 64-bit ELF file")
    end = "<" if elf[5] == 1 else ">"
    shoff, = struct.unpack_from(end + "Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", elf, 0x3A)

    def header(i):
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            end + "IIQQQQ", elf, shoff + i * shentsize)
        return name, offset, size

    _, str_off, str_size = header(shstrndx)
    names = elf[str_off:str_off + str_size]
    for i in range(shnum):
        name, offset, size = header(i)
        if names[name:names.index(b"\0", name)].decode() == wanted:
            return elf[offset:offset + size]
    die(f"{path} has no {wanted} section (not built with `cargo auditable build`)")


def deps(path):
    """The `cargo auditable` dependency list of the binary at `path`."""
    return json.loads(zlib.decompress(section(path, ".dep-v0")))["packages"]


def licences():
    out = subprocess.run(
        ["cargo", "metadata", "--locked", "--offline", "--format-version", "1",
         "--manifest-path", os.path.join(REPO, "Cargo.toml")],
        check=True, capture_output=True, text=True).stdout
    return {(p["name"], p["version"]): p.get("license") or "NOASSERTION"
            for p in json.loads(out)["packages"]}


def spdx_id(name, version):
    safe = "".join(c if c.isalnum() or c in ".-" else "-" for c in f"{name}-{version}")
    return f"SPDXRef-Package-cargo-{safe}"


def sbom(binaries):
    lic = licences()
    packages, relationships, seen = {}, [], set()
    roots = []
    for path in binaries:
        pkgs = deps(path)
        for p in pkgs:
            key = (p["name"], p["version"])
            if key in packages:
                continue
            packages[key] = {
                "SPDXID": spdx_id(*key),
                "name": p["name"],
                "versionInfo": p["version"],
                "downloadLocation": "NOASSERTION",
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": lic.get(key, "NOASSERTION"),
                "copyrightText": "NOASSERTION",
                "filesAnalyzed": False,
                "externalRefs": [{
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": f"pkg:cargo/{p['name']}@{p['version']}",
                }],
            }
        for p in pkgs:
            src = spdx_id(p["name"], p["version"])
            if p.get("root"):
                roots.append(src)
            for i in p.get("dependencies", []):
                d = pkgs[i]
                dep = spdx_id(d["name"], d["version"])
                # A build dependency (a build script's, `kind: build`) ran at
                # build time and is not linked in.
                if d.get("kind") == "build":
                    edge = (dep, "BUILD_DEPENDENCY_OF", src)
                else:
                    edge = (src, "DEPENDS_ON", dep)
                if edge not in seen:
                    seen.add(edge)
                    relationships.append({"spdxElementId": edge[0], "relationshipType": edge[1],
                                          "relatedSpdxElement": edge[2]})
    if not roots:
        die("no root package in the dependency lists")
    root = packages[next(k for k in packages if spdx_id(*k) == roots[0])]
    digest = hashlib.sha256(json.dumps(sorted(packages), sort_keys=True).encode()).hexdigest()
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{root['name']}-{root['versionInfo']}",
        "documentNamespace": f"https://nexo.example/spdx/{root['name']}-{root['versionInfo']}-{digest}",
        "creationInfo": {
            "created": os.environ.get("CREATED", "1970-01-01T00:00:00Z"),
            "creators": ["Tool: nexo-manager tests/image/sbom.py"],
        },
        "documentDescribes": sorted(set(roots)),
        "packages": [packages[k] for k in sorted(packages)],
        "relationships": sorted(relationships, key=lambda r: (r["spdxElementId"], r["relatedSpdxElement"])),
    }
    return doc


def provenance(a):
    name, _, digest = a.subject.partition("@")
    if not digest.startswith("sha256:"):
        die(f"--subject {a.subject!r} is not NAME@sha256:HEX")
    materials = [{"uri": f"git+{a.source}@{a.revision}", "digest": {"gitCommit": a.revision}}]
    for m in a.material:
        uri, _, d = m.partition("=")
        algo, _, hexd = d.partition(":")
        if not uri or algo != "sha256" or not hexd:
            die(f"--material {m!r} is not NAME=sha256:HEX")
        materials.append({"uri": uri, "digest": {"sha256": hexd}})
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": name, "digest": {"sha256": digest.split(":", 1)[1]}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "https://nexo.example/nexo-manager/build/v1",
                "externalParameters": {
                    "source": a.source,
                    "revision": a.revision,
                    "build": "tests/build-static.sh (cargo auditable build --release --locked) "
                             "and tests/image/build-image.sh, as Dockerfile.distroless",
                },
                "resolvedDependencies": materials,
            },
            "runDetails": {
                "builder": {"id": a.builder},
                "metadata": {"invocationId": f"{a.revision}-{digest}", "finishedOn": a.created},
            },
        },
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sbom")
    s.add_argument("binary", nargs="+")
    d = sub.add_parser("deps")
    d.add_argument("binary")
    v = sub.add_parser("provenance")
    v.add_argument("--subject", required=True)
    v.add_argument("--revision", required=True)
    v.add_argument("--created", required=True)
    v.add_argument("--source", required=True)
    v.add_argument("--builder", default="https://nexo.example/nexo-manager/builder/tests-image")
    v.add_argument("--material", action="append", default=[])
    a = p.parse_args()
    if a.cmd == "sbom":
        json.dump(sbom(a.binary), sys.stdout, indent=2, sort_keys=True)
        print()
    elif a.cmd == "deps":
        for pkg in deps(a.binary):
            print(pkg["name"], pkg["version"])
    else:
        json.dump(provenance(a), sys.stdout, indent=2, sort_keys=True)
        print()


if __name__ == "__main__":
    main()
