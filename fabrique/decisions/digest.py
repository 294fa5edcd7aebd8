"""The digest check between ``buildctl --metadata-file`` and the registry.

What the build says it pushed and what the registry holds under the tag must be the same
``sha256:<64 hex>``; only then is the digest handed to the write-back. With attestations
on, BuildKit pushes an index and both sides name the index digest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fabrique.clients.registry import RegistryClient
from fabrique.site.errors import DigestMismatch, InputError
from fabrique.site.names import DIGEST_RE

METADATA_DIGEST_KEY = "containerimage.digest"
METADATA_NAME_KEY = "image.name"


@dataclass(frozen=True)
class BuildMetadata:
    digest: str
    image_names: tuple[str, ...]


def read_build_metadata(path: Path) -> BuildMetadata:
    """Parse buildctl's metadata file; InputError naming the file on anything unusable."""
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise InputError(f"build metadata {path}: not found (did the build step run?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            f"build metadata {path}: not readable JSON ({exc.__class__.__name__})"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"build metadata {path}: must be a JSON object")
    digest = data.get(METADATA_DIGEST_KEY)
    if not isinstance(digest, str) or not digest:
        raise InputError(f"build metadata {path}: no {METADATA_DIGEST_KEY!r} (was push=true set?)")
    names = data.get(METADATA_NAME_KEY) or ""
    if not isinstance(names, str):
        raise InputError(f"build metadata {path}: {METADATA_NAME_KEY!r} must be a string")
    return BuildMetadata(digest, tuple(n.strip() for n in names.split(",") if n.strip()))


def compare(expected_ref: str, built: BuildMetadata, pushed_digest: str) -> str:
    """The verified digest, or DigestMismatch saying which side is wrong."""
    if not DIGEST_RE.fullmatch(built.digest):
        raise DigestMismatch(
            f"{expected_ref}: build metadata digest {built.digest[:80]!r} is malformed "
            "(expected sha256:<64 hex>); nothing is written back"
        )
    if not DIGEST_RE.fullmatch(pushed_digest):
        raise DigestMismatch(
            f"{expected_ref}: registry digest {pushed_digest[:80]!r} is malformed; "
            "nothing is written back"
        )
    if built.image_names and expected_ref not in built.image_names:
        raise DigestMismatch(
            f"build metadata is for {', '.join(built.image_names)}, not {expected_ref}; "
            "nothing is written back"
        )
    if built.digest != pushed_digest:
        raise DigestMismatch(
            f"{expected_ref}: the build pushed {built.digest} but the registry holds "
            f"{pushed_digest} (another push overwrote the tag?); nothing is written back"
        )
    return pushed_digest


def verify_pushed(client: RegistryClient, repository: str, tag: str, metadata_path: Path) -> str:
    """Read both digests and compare them; return the verified digest."""
    built = read_build_metadata(metadata_path)
    pushed = client.manifest_digest(repository, tag)
    return compare(f"{client.host}/{repository}:{tag}", built, pushed.digest)
