"""The identifiers every part agrees on: revisions (SHA-1 and SHA-256), digests, images."""

from __future__ import annotations

import pytest

from fabrique.site.errors import InputError
from fabrique.site.names import ImageRef, check_digest, check_revision, short_sha, workflow_name

SHA1 = "0123456789abcdef0123456789abcdef01234567"
SHA256 = "89abcdef" * 8


@pytest.mark.parametrize("revision", [SHA1, SHA256])
def test_a_sha1_or_sha256_commit_is_a_revision_and_its_tag_is_12_hex(revision: str) -> None:
    assert check_revision(revision) == revision
    assert short_sha(revision) == revision[:12]
    assert workflow_name("citation", revision) == f"fabrique-citation-{revision[:12]}"


@pytest.mark.parametrize(
    "revision",
    [SHA1 + "\n", SHA256 + "\n", SHA1[:-1], SHA1 + "8", SHA256[:-1], SHA1.upper(), "main", ""],
)
def test_anything_else_is_refused(revision: str) -> None:
    with pytest.raises(InputError, match=r"must be a full lowercase hex commit id \(40 char"):
        check_revision(revision)


def test_a_digest_with_a_final_newline_is_refused() -> None:
    digest = "sha256:" + "a" * 64
    assert check_digest(digest) == digest
    with pytest.raises(InputError, match="must match sha256:<64 lowercase hex>"):
        check_digest(digest + "\n")


@pytest.mark.parametrize(
    "text", ["registry:80/citation:0.1\n", "citation\n", "registry:80/x@sha256:" + "a" * 64 + "\n"]
)
def test_an_image_reference_with_a_final_newline_is_refused(text: str) -> None:
    with pytest.raises(InputError, match="not of the form"):
        ImageRef.parse(text)


def test_the_shared_patterns_are_only_ever_fullmatched() -> None:
    """Their ``$`` also matches before a final newline: ``.match`` would let one through."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for package in ("fabrique", "pipelines", "eventsources", "netpol")
        for path in sorted((root / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\b[A-Z_]+_RE\.(match|search)\(", line)
    ]
    assert offenders == []
