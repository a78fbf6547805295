#!/usr/bin/env python3
"""An OCI distribution client of the few calls a release makes, without a
container engine (the registry is plain HTTP on loopback in the tests; a
release uses its own tools against its registry, README.md, "Verify a
release").

    registry.py push ARCHIVE HOST/REPO:TAG
        push an OCI image layout archive (oci-image.py's) and tag its image;
        prints the digest of what the tag names
    registry.py attach HOST/REPO@DIGEST ARTIFACT_TYPE FILE MEDIA_TYPE
        push FILE as an OCI 1.1 artifact whose subject is DIGEST, and list it
        among DIGEST's referrers (the referrers API where the registry has
        one, else the referrers tag schema, `sha256-HEX`); prints its digest
    registry.py referrers HOST/REPO@DIGEST
        prints DIGEST's referrers, as an OCI image index (JSON)
    registry.py blob HOST/REPO@DIGEST ARTIFACT_DIGEST
        prints the one layer of the artifact ARTIFACT_DIGEST
    registry.py manifest HOST/REPO:TAG|HOST/REPO@DIGEST
        prints the manifest (or index) the reference names, as stored
"""
import hashlib
import json
import sys
import tarfile
import urllib.error
import urllib.request

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
ACCEPT = ", ".join([INDEX, MANIFEST])
TIMEOUT = 30


def die(msg):
    sys.exit(f"registry.py: {msg}")


def parse_ref(ref):
    host, _, rest = ref.partition("/")
    if not rest:
        die(f"{ref!r} is not HOST/REPO:TAG or HOST/REPO@DIGEST")
    if "@" in rest:
        repo, _, digest = rest.partition("@")
        return host, repo, digest
    repo, _, tag = rest.rpartition(":")
    if not repo:
        die(f"{ref!r} has no tag")
    return host, repo, tag


def call(method, url, body=None, headers=None):
    """One request: its status, headers and body (an error status is an
    answer too; the caller judges it)."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except (urllib.error.URLError, OSError) as e:
        die(f"{method} {url}: {e}")


def digest_of(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def put_blob(host, repo, data):
    digest = digest_of(data)
    status, _, _ = call("HEAD", f"http://{host}/v2/{repo}/blobs/{digest}")
    if status == 200:
        return digest
    status, headers, body = call("POST", f"http://{host}/v2/{repo}/blobs/uploads/", b"")
    if status != 202:
        die(f"starting an upload to {repo}: {status} {body[:300]!r}")
    location = headers.get("Location") or headers.get("location")
    if location.startswith("/"):
        location = f"http://{host}{location}"
    sep = "&" if "?" in location else "?"
    status, _, body = call("PUT", f"{location}{sep}digest={digest}", data,
                           {"Content-Type": "application/octet-stream"})
    if status != 201:
        die(f"uploading {digest} to {repo}: {status} {body[:300]!r}")
    return digest


def put_manifest(host, repo, ref, data, media_type):
    status, _, body = call("PUT", f"http://{host}/v2/{repo}/manifests/{ref}", data,
                           {"Content-Type": media_type})
    if status != 201:
        die(f"putting manifest {ref} to {repo}: {status} {body[:300]!r}")
    return digest_of(data)


def get_manifest(host, repo, ref):
    status, headers, body = call("GET", f"http://{host}/v2/{repo}/manifests/{ref}",
                                 headers={"Accept": ACCEPT})
    if status == 404:
        return None, None
    if status != 200:
        die(f"getting manifest {ref} of {repo}: {status} {body[:300]!r}")
    media_type = (headers.get("Content-Type") or headers.get("content-type") or "").split(";")[0]
    return body, media_type


def push(archive, ref):
    host, repo, tag = parse_ref(ref)
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    layout = json.loads(files["index.json"])
    top = layout["manifests"][0]

    def blob(digest):
        return files[f"blobs/sha256/{digest.split(':')[1]}"]

    def push_manifest(desc, ref):
        data = blob(desc["digest"])
        m = json.loads(data)
        if desc["mediaType"] == INDEX:
            for child in m["manifests"]:
                push_manifest(child, child["digest"])
        else:
            for d in [m["config"]] + m["layers"]:
                put_blob(host, repo, blob(d["digest"]))
        return put_manifest(host, repo, ref, data, desc["mediaType"])

    push_manifest(top, top["digest"])
    print(put_manifest(host, repo, tag, blob(top["digest"]), top["mediaType"]))


def referrers(host, repo, digest):
    """The referrers index of `digest`: from the referrers API, or from the
    tag schema's index (empty when there is none)."""
    status, _, body = call("GET", f"http://{host}/v2/{repo}/referrers/{digest}",
                           headers={"Accept": INDEX})
    if status == 200:
        return json.loads(body), True
    data, _ = get_manifest(host, repo, digest.replace(":", "-"))
    if data is None:
        return {"schemaVersion": 2, "mediaType": INDEX, "manifests": []}, False
    return json.loads(data), False


def attach(ref, artifact_type, path, media_type):
    host, repo, subject = parse_ref(ref)
    if not subject.startswith("sha256:"):
        die(f"{ref!r}: attach to a digest, not a tag")
    data, subject_type = get_manifest(host, repo, subject)
    if data is None:
        die(f"{ref}: no such manifest")
    with open(path, "rb") as f:
        content = f.read()
    empty = put_blob(host, repo, b"{}")
    layer = put_blob(host, repo, content)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": EMPTY, "digest": empty, "size": 2},
        "layers": [{"mediaType": media_type, "digest": layer, "size": len(content)}],
        "subject": {"mediaType": subject_type, "digest": subject, "size": len(data)},
    }
    body = json.dumps(manifest, sort_keys=True).encode()
    digest = put_manifest(host, repo, digest_of(body), body, MANIFEST)
    index, api = referrers(host, repo, subject)
    if not api:
        # The referrers tag schema (OCI distribution 1.1, "Pushing
        # manifests with subject"): the registry has no referrers API.
        desc = {"mediaType": MANIFEST, "digest": digest, "size": len(body),
                "artifactType": artifact_type}
        index["manifests"] = [m for m in index["manifests"] if m["digest"] != digest] + [desc]
        put_manifest(host, repo, subject.replace(":", "-"),
                     json.dumps(index, sort_keys=True).encode(), INDEX)
    print(digest)


def main():
    if len(sys.argv) < 2:
        die(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "push" and len(args) == 2:
        push(*args)
    elif cmd == "attach" and len(args) == 4:
        attach(*args)
    elif cmd == "referrers" and len(args) == 1:
        host, repo, digest = parse_ref(args[0])
        print(json.dumps(referrers(host, repo, digest)[0], indent=2, sort_keys=True))
    elif cmd == "manifest" and len(args) == 1:
        host, repo, ref = parse_ref(args[0])
        data, _ = get_manifest(host, repo, ref)
        if data is None:
            die(f"no manifest {args[0]}")
        sys.stdout.buffer.write(data)
    elif cmd == "blob" and len(args) == 2:
        host, repo, _ = parse_ref(args[0])
        data, _ = get_manifest(host, repo, args[1])
        if data is None:
            die(f"no artifact {args[1]}")
        layer = json.loads(data)["layers"][0]["digest"]
        status, _, body = call("GET", f"http://{host}/v2/{repo}/blobs/{layer}")
        if status != 200 or digest_of(body) != layer:
            die(f"blob {layer}: {status}, or not what its digest says")
        sys.stdout.buffer.write(body)
    else:
        die(__doc__)


if __name__ == "__main__":
    main()
