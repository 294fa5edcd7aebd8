"""Real OCI images, made byte by byte and pushed through the registry API.

A minimal but complete image: one gzipped layer holding one file, a config whose
rootfs.diff_ids names that layer, and an OCI manifest. ``push_index`` wraps manifests in
an OCI index, as BuildKit does when attestations are on.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import httpx

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(files: dict[str, bytes]) -> tuple[bytes, bytes]:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(content))
    tar_bytes = raw.getvalue()
    return tar_bytes, gzip.compress(tar_bytes, mtime=0)


def _upload_blob(client: httpx.Client, repo: str, data: bytes) -> str:
    digest = sha256(data)
    if client.head(f"/v2/{repo}/blobs/{digest}").status_code == 200:
        return digest
    start = client.post(f"/v2/{repo}/blobs/uploads/")
    assert start.status_code == 202, start.text
    location = start.headers["Location"]
    separator = "&" if "?" in location else "?"
    done = client.put(
        f"{location}{separator}digest={digest}",
        content=data,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert done.status_code == 201, done.text
    return digest


def push_image(
    base_url: str,
    repo: str,
    tag: str,
    files: dict[str, bytes] | None = None,
    *,
    architecture: str = "amd64",
    labels: dict[str, str] | None = None,
) -> str:
    """Push a one-layer image; return the manifest digest the registry reports."""
    files = files or {"hello.txt": f"{repo}:{tag}\n".encode()}
    tar_bytes, layer = _layer(files)
    config = json.dumps(
        {
            "architecture": architecture,
            "os": "linux",
            "config": {"Cmd": ["/bin/true"], **({"Labels": labels} if labels else {})},
            "rootfs": {"type": "layers", "diff_ids": [sha256(tar_bytes)]},
        },
        sort_keys=True,
    ).encode()
    with httpx.Client(base_url=base_url, timeout=10) as client:
        config_digest = _upload_blob(client, repo, config)
        layer_digest = _upload_blob(client, repo, layer)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config_digest,
                    "size": len(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer_digest,
                        "size": len(layer),
                    }
                ],
            }
        ).encode()
        return _put_manifest(client, repo, tag, manifest, OCI_MANIFEST)


def push_index(base_url: str, repo: str, tag: str, architectures: tuple[str, ...]) -> str:
    """Push one image per architecture and an OCI index over them; return the index digest."""
    entries = []
    with httpx.Client(base_url=base_url, timeout=10) as client:
        for arch in architectures:
            digest = push_image(base_url, repo, f"{tag}-{arch}", architecture=arch)
            size = len(
                client.get(
                    f"/v2/{repo}/manifests/{digest}", headers={"Accept": OCI_MANIFEST}
                ).content
            )
            entries.append(
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": digest,
                    "size": size,
                    "platform": {"architecture": arch, "os": "linux"},
                }
            )
        index = json.dumps(
            {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
        ).encode()
        return _put_manifest(client, repo, tag, index, OCI_INDEX)


def _put_manifest(client: httpx.Client, repo: str, tag: str, body: bytes, media_type: str) -> str:
    response = client.put(
        f"/v2/{repo}/manifests/{tag}", content=body, headers={"Content-Type": media_type}
    )
    assert response.status_code == 201, response.text
    digest = response.headers["Docker-Content-Digest"]
    assert digest == sha256(body)
    return digest


def built_labels(revision: str, gitea_url: str) -> dict[str, str]:
    """The OCI labels fabrique's build puts on an image of ``revision`` of atlas/atlas."""
    return {
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.source": f"{gitea_url}/atlas/atlas.git",
    }
