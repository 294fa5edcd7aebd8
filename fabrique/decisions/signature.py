"""Signatures: is this digest signed with the site's key, in cosign's format?

cosign (v2, key-based, no transparency log) stores the signatures of
``<repo>@sha256:<hex>`` as an OCI manifest under the tag ``sha256-<hex>.sig`` of the same
repository. Each layer is a *simple signing* payload,
``application/vnd.dev.cosign.simplesigning.v1+json``::

    {"critical": {"identity": {"docker-reference": "<host>/<repo>"},
                  "image": {"docker-manifest-digest": "sha256:<hex>"},
                  "type": "cosign container image signature"},
     "optional": null}

and its annotation ``dev.cosignproject.cosign/signature`` holds the base64 signature of
those exact bytes (ECDSA P-256 with SHA-256 for cosign's own keys; RSA PKCS#1 v1.5 and
Ed25519 keys imported into cosign are read too).

cosign itself is packaged neither on PyPI nor in Debian, which is all these machines
reach, so the check is made here with ``cryptography`` (PyCA's library, made for exactly
this: parsing PEM keys and verifying ECDSA, RSA and Ed25519 signatures). The build signs
with the real cosign binary of the tools image; a signature is accepted when one payload
verifies with the site's public key and names this digest and this repository.
"""

from __future__ import annotations

import base64
import binascii
import json
import subprocess
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from fabrique.clients.registry import RegistryClient
from fabrique.site.config import Site
from fabrique.site.errors import ConfigError, ImageNotFound, ProvenanceError, RegistryError

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNATURE_TYPE = "cosign container image signature"

PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey


def signature_tag(digest: str) -> str:
    """Where cosign keeps the signatures of ``digest``: ``sha256-<hex>.sig``."""
    return digest.replace(":", "-", 1) + ".sig"


def load_public_key(pem: str) -> PublicKey:
    try:
        key = serialization.load_pem_public_key(pem.strip().encode() + b"\n")
    except ValueError:
        raise ConfigError("signing.publicKey: not a readable PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey):
        raise ConfigError("signing.publicKey: must be an ECDSA, RSA or Ed25519 key")
    return key


def payload(reference: str, digest: str) -> bytes:
    """The simple signing payload cosign signs for ``reference`` (``host/repo``)@``digest``."""
    return json.dumps(
        {
            "critical": {
                "identity": {"docker-reference": reference},
                "image": {"docker-manifest-digest": digest},
                "type": SIGNATURE_TYPE,
            },
            "optional": None,
        },
        separators=(",", ":"),
    ).encode()


def _verifies(key: PublicKey, signature: bytes, data: bytes) -> bool:
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
        else:
            key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def verify_signed(registry: RegistryClient, repository: str, digest: str, key: PublicKey) -> None:
    """ProvenanceError unless a signature of ``repository@digest`` verifies with ``key``."""
    reference = f"{registry.host}/{repository}"
    shown = f"{reference}@{digest}"
    try:
        manifest = registry.manifest(repository, signature_tag(digest))
    except ImageNotFound:
        raise ProvenanceError(
            f"{shown}: unsigned (no {signature_tag(digest)} in the registry); nothing is "
            "written back"
        ) from None
    layers = [
        layer
        for layer in manifest.data.get("layers") or []
        if isinstance(layer, dict) and layer.get("mediaType") == SIMPLE_SIGNING
    ]
    problems = []
    for layer in layers:
        encoded = (layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION)
        blob_digest = layer.get("digest")
        if not isinstance(encoded, str) or not isinstance(blob_digest, str):
            problems.append("a layer without a signature")
            continue
        try:
            signature = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            problems.append("a signature that is not base64")
            continue
        body = registry.blob(repository, blob_digest)  # checked against its digest
        if not _verifies(key, signature, body):
            problems.append("a signature that does not verify with signing.publicKey")
            continue
        try:
            critical = json.loads(body)["critical"]
            signed_digest = critical["image"]["docker-manifest-digest"]
            signed_reference = critical["identity"]["docker-reference"]
            signed_type = critical["type"]
        except (ValueError, KeyError, TypeError):
            problems.append("a signed payload that is not simple signing")
            continue
        if signed_type != SIGNATURE_TYPE or signed_digest != digest:
            problems.append(f"a signature of {str(signed_digest)[:80]}")
            continue
        if signed_reference != reference:
            problems.append(f"a signature for {str(signed_reference)[:80]}")
            continue
        return
    found = "; ".join(sorted(set(problems))) or "no simple signing layer"
    raise ProvenanceError(
        f"{shown}: no valid signature ({len(layers)} found: {found}); nothing is written back"
    )


def signature_gate(site: Site, registry: RegistryClient) -> Callable[[str, str], None] | None:
    """What the write-back calls on (repository, digest) before writing, when the site signs."""
    if not site.signing.enabled or site.signing.public_key is None:
        return None
    key = load_public_key(site.signing.public_key)
    return lambda repository, digest: verify_signed(registry, repository, digest, key)


# ------------------------------------------------------------------- the sign step

SIGNING_MOUNT = "/etc/fabrique/signing"
KEY_FILE = "cosign.key"


def cosign_argv(site: Site, repository: str, digest: str, key_path: str) -> list[str]:
    """cosign v2 signing ``repository@digest`` with a key file, the air-gapped way: no
    transparency log upload (no Rekor to reach), the legacy ``.sig`` tag format."""
    argv = ["cosign", "sign", "--yes", "--key", key_path, "--tlog-upload=false"]
    if site.registry.plain_http:
        argv.append("--allow-http-registry")
    return [*argv, f"{site.registry.host}/{repository}@{digest}"]


def sign(
    site: Site,
    registry: RegistryClient,
    repository: str,
    digest: str,
    *,
    key_path: str = f"{SIGNING_MOUNT}/{KEY_FILE}",
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> None:
    """Sign with cosign, then check the signature as every write-back will."""
    if site.signing.public_key is None:
        raise ConfigError("signing.keySecret: not set; nothing to sign with")
    argv = cosign_argv(site, repository, digest, key_path)
    try:
        done = run(
            argv,
            capture_output=True,
            text=True,
            timeout=max(60.0, site.network.timeout_seconds * 6),
            check=False,
        )
    except FileNotFoundError:
        raise ConfigError(
            "cosign: not found; the tools image must carry it (see the Dockerfile)"
        ) from None
    except subprocess.TimeoutExpired:
        raise RegistryError(f"cosign sign {argv[-1]}: timed out", transient=True) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise RegistryError(f"cosign sign {argv[-1]}: exit {done.returncode}: {last}")
    verify_signed(registry, repository, digest, load_public_key(site.signing.public_key))
