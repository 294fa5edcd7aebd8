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
from collections.abc import Callable, Sequence

import httpx

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(files: dict[str, bytes], executables: frozenset[str]) -> tuple[bytes, bytes]:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o755 if name in executables else 0o644
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
    executables: frozenset[str] = frozenset(),
) -> str:
    """Push a one-layer image; return the manifest digest the registry reports."""
    files = files or {"hello.txt": f"{repo}:{tag}\n".encode()}
    tar_bytes, layer = _layer(files, executables)
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


IN_TOTO = "application/vnd.in-toto+json"
SLSA_V02 = "https://slsa.dev/provenance/v0.2"
SLSA_V1 = "https://slsa.dev/provenance/v1"
SPDX = "https://spdx.dev/Document"


def _descriptor(media_type: str, body: bytes, **extra: object) -> dict[str, object]:
    return {"mediaType": media_type, "digest": sha256(body), "size": len(body), **extra}


def provenance(
    subject: str, revision: str, source: str, *, version: str = SLSA_V02
) -> dict[str, object]:
    """An in-toto statement as BuildKit writes it for an image built with vcs:* opts."""
    vcs = {"revision": revision, "source": source}
    if version == SLSA_V02:
        predicate: dict[str, object] = {
            "builder": {"id": ""},
            "buildType": "https://mobyproject.org/buildkit@v1",
            "invocation": {"parameters": {"frontend": "dockerfile.v0"}},
            "metadata": {"https://mobyproject.org/buildkit@v1#metadata": {"vcs": vcs}},
        }
    else:
        predicate = {
            "buildDefinition": {
                "buildType": "https://github.com/moby/buildkit/blob/master/docs/attestations/slsa-definitions.md"
            },
            "runDetails": {"metadata": {"buildkit_metadata": {"vcs": vcs}}},
        }
    return {
        "_type": "https://in-toto.io/Statement/v0.1",
        "predicateType": version,
        "subject": [
            {
                "name": "pkg:docker/citation-dagster?platform=linux%2Famd64",
                "digest": {"sha256": subject.removeprefix("sha256:")},
            }
        ],
        "predicate": predicate,
    }


def push_attested_index(
    base_url: str,
    repo: str,
    tag: str,
    revision: str,
    source: str,
    *,
    attest: bool = True,
    sbom: bool = False,
    statement: Callable[[str], dict[str, object]] | None = None,
    refers_to: str | None = None,
) -> tuple[str, str]:
    """Push what BuildKit pushes with attestations on: an OCI index holding the image and
    an attestation manifest (provenance, and an SPDX SBOM with ``sbom``) that refers to
    it. ``attest=False`` strips the attestation; ``statement`` makes the provenance from the
    image's digest, ``refers_to`` replaces the image the attestation says it is about. Returns (index, image) digests."""
    with httpx.Client(base_url=base_url, timeout=10) as client:
        image = push_image(
            base_url,
            repo,
            f"{tag}-image",
            {"app.txt": f"{revision}\n".encode()},
            labels={
                "org.opencontainers.image.revision": revision,
                "org.opencontainers.image.source": source,
            },
        )
        image_body = client.get(
            f"/v2/{repo}/manifests/{image}", headers={"Accept": OCI_MANIFEST}
        ).content
        entries: list[dict[str, object]] = [
            _descriptor(OCI_MANIFEST, image_body, platform={"architecture": "amd64", "os": "linux"})
        ]
        if attest:
            layers = []
            document = statement(image) if statement else provenance(image, revision, source)
            documents = [(str(document.get("predicateType") or SLSA_V02), document)]
            if sbom:
                documents.append(
                    (
                        SPDX,
                        {
                            "_type": "https://in-toto.io/Statement/v0.1",
                            "predicateType": SPDX,
                            "subject": [
                                {"name": "_", "digest": {"sha256": image.removeprefix("sha256:")}}
                            ],
                            "predicate": {"SPDXID": "SPDXRef-DOCUMENT", "spdxVersion": "SPDX-2.3"},
                        },
                    )
                )
            for predicate_type, document in documents:
                blob = json.dumps(document, sort_keys=True).encode()
                _upload_blob(client, repo, blob)
                layers.append(
                    _descriptor(
                        IN_TOTO, blob, annotations={"in-toto.io/predicate-type": predicate_type}
                    )
                )
            config = json.dumps(
                {
                    "architecture": "unknown",
                    "os": "unknown",
                    "config": {},
                    "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
                },
                sort_keys=True,
            ).encode()
            _upload_blob(client, repo, config)
            attestation = json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": OCI_MANIFEST,
                    "config": _descriptor("application/vnd.oci.image.config.v1+json", config),
                    "layers": layers,
                }
            ).encode()
            digest = _put_manifest(client, repo, sha256(attestation), attestation, OCI_MANIFEST)
            entries.append(
                _descriptor(
                    OCI_MANIFEST,
                    attestation,
                    annotations={
                        "vnd.docker.reference.digest": refers_to or image,
                        "vnd.docker.reference.type": "attestation-manifest",
                    },
                    platform={"architecture": "unknown", "os": "unknown"},
                )
            )
            assert digest == sha256(attestation)
        index = json.dumps(
            {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
        ).encode()
        return _put_manifest(client, repo, tag, index, OCI_INDEX), image


SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"


def push_signature(
    base_url: str,
    repo: str,
    digest: str,
    sign: Callable[[bytes], bytes],
    payload: bytes,
    *,
    extra_layers: Sequence[tuple[bytes, str]] = (),
) -> str:
    """Push what ``cosign sign`` (v2, a key, no tlog) pushes: under ``sha256-<hex>.sig``,
    a manifest whose layers are simple signing payloads, each with its base64 signature
    in ``dev.cosignproject.cosign/signature``. ``sign`` signs the payload's bytes."""
    import base64

    with httpx.Client(base_url=base_url, timeout=10) as client:
        layers = []
        for body, signature in [(payload, base64.b64encode(sign(payload)).decode()), *extra_layers]:
            _upload_blob(client, repo, body)
            layers.append(
                _descriptor(
                    SIMPLE_SIGNING,
                    body,
                    annotations={"dev.cosignproject.cosign/signature": signature},
                )
            )
        config = json.dumps(
            {
                "architecture": "",
                "os": "",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
            },
            sort_keys=True,
        ).encode()
        _upload_blob(client, repo, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": _descriptor("application/vnd.oci.image.config.v1+json", config),
                "layers": layers,
            }
        ).encode()
        tag = digest.replace(":", "-") + ".sig"
        return _put_manifest(client, repo, tag, manifest, OCI_MANIFEST)
