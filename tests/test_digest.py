"""`fabrique digest verify` against a real OCI registry on loopback, with real images."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from fabrique.clients.registry import OCI_INDEX, OCI_MANIFEST, RegistryClient
from fabrique.site.errors import RegistryError

from .conftest import run_cli, write_values
from .oci import push_image, push_index
from .servers import Registry, closed_port

REV = "3f5e2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f"
TAG = REV[:12]


@pytest.fixture()
def values(tmp_path: Path, registry: Registry) -> Path:
    return write_values(
        tmp_path / "site.yaml", **{"registry.host": registry.host, "registry.plainHttp": True}
    )


def _metadata(tmp_path: Path, digest: str, name: str | None = None) -> Path:
    data = {"containerimage.digest": digest, "containerimage.descriptor": {"digest": digest}}
    if name is not None:
        data["image.name"] = name
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps(data))
    return path


def _verify(values: Path, metadata: Path, *extra: str):  # type: ignore[no-untyped-def]
    return run_cli(
        "--values",
        str(values),
        "digest",
        "verify",
        "--app",
        "citation",
        "--revision",
        REV,
        "--metadata",
        str(metadata),
        *extra,
    )


def test_matching_digest_is_printed_and_written(
    tmp_path: Path, registry: Registry, values: Path
) -> None:
    digest = push_image(registry.url, "citation-dagster", TAG)
    out = tmp_path / "out" / "digest"
    result = _verify(
        values,
        _metadata(tmp_path, digest, f"{registry.host}/citation-dagster:{TAG}"),
        "--output",
        str(out),
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == digest
    assert out.read_text() == digest


def test_the_digest_is_the_one_skopeo_sees(
    tmp_path: Path, registry: Registry, values: Path
) -> None:
    """A second, independent client agrees: the image is real and the digest is right."""
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        pytest.fail("skopeo is not installed; `make test` installs it", pytrace=False)
    digest = push_image(registry.url, "citation-dagster", TAG, {"app/main.py": b"print('hi')\n"})
    inspected = subprocess.run(
        [
            skopeo,
            "inspect",
            "--tls-verify=false",
            f"docker://{registry.host}/citation-dagster:{TAG}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(inspected.stdout)["Digest"] == digest
    result = _verify(values, _metadata(tmp_path, digest))
    assert result.stdout.strip() == digest


def test_index_digest_when_attestations_push_an_index(
    tmp_path: Path, registry: Registry, values: Path
) -> None:
    digest = push_index(registry.url, "citation-dagster", TAG, ("amd64", "arm64"))
    with RegistryClient(registry.host, plain_http=True) as client:
        found = client.manifest_digest("citation-dagster", TAG)
    assert found.is_index and found.media_type == OCI_INDEX
    result = _verify(values, _metadata(tmp_path, digest))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == digest


def test_mismatch_fails_and_writes_nothing(
    tmp_path: Path, registry: Registry, values: Path
) -> None:
    push_image(registry.url, "citation-dagster", TAG)
    other = "sha256:" + "0" * 64
    out = tmp_path / "digest"
    result = _verify(values, _metadata(tmp_path, other), "--output", str(out))
    assert result.exit_code == 4
    assert f"the build pushed {other} but the registry holds" in result.stderr
    assert "nothing is written back" in result.stderr
    assert not out.exists()
    assert result.stdout == ""


def test_metadata_for_another_image_is_a_mismatch(
    tmp_path: Path, registry: Registry, values: Path
) -> None:
    digest = push_image(registry.url, "citation-dagster", TAG)
    result = _verify(values, _metadata(tmp_path, digest, f"{registry.host}/someone-else:{TAG}"))
    assert result.exit_code == 4
    assert "build metadata is for" in result.stderr


def test_missing_tag_is_image_not_found(tmp_path: Path, registry: Registry, values: Path) -> None:
    result = run_cli(
        "--values",
        str(values),
        "digest",
        "verify",
        "--app",
        "citation",
        "--revision",
        "ab" * 20,
        "--metadata",
        str(_metadata(tmp_path, "sha256:" + "1" * 64)),
    )
    assert result.exit_code == 3
    assert result.stderr.strip() == (
        f"error: {registry.host}/citation-dagster:{'ab' * 6}: not found in the registry "
        "(was the image pushed under this tag?)"
    )


@pytest.mark.parametrize("bad", ["sha256:XYZ", "sha256:" + "a" * 63, "md5:" + "a" * 32, ""])
def test_malformed_metadata_digest(
    tmp_path: Path, registry: Registry, values: Path, bad: str
) -> None:
    push_image(registry.url, "citation-dagster", TAG)
    result = _verify(values, _metadata(tmp_path, bad))
    assert result.exit_code in (2, 4)
    assert "digest" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_missing_or_broken_metadata_file(tmp_path: Path, values: Path) -> None:
    missing = _verify(values, tmp_path / "nope.json")
    assert missing.exit_code == 2 and "not found (did the build step run?)" in missing.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    result = _verify(values, broken)
    assert result.exit_code == 2 and "not readable JSON" in result.stderr


def test_registry_down(tmp_path: Path) -> None:
    values = write_values(tmp_path / "site.yaml", **{"registry.host": f"127.0.0.1:{closed_port()}"})
    result = _verify(values, _metadata(tmp_path, "sha256:" + "2" * 64))
    assert result.exit_code == 75, "a registry that is down is a transient failure"
    assert "unreachable: connection failed" in result.stderr
    assert "after 4 attempt(s)" in result.stderr


def test_bad_revision_is_refused_before_any_request(tmp_path: Path, values: Path) -> None:
    result = run_cli(
        "--values",
        str(values),
        "digest",
        "verify",
        "--app",
        "citation",
        "--revision",
        "main",
        "--metadata",
        str(_metadata(tmp_path, "sha256:" + "2" * 64)),
    )
    assert result.exit_code == 2
    assert "revision 'main': must be a full lowercase hex commit id" in result.stderr


def _client(handler) -> RegistryClient:  # type: ignore[no-untyped-def]
    from fabrique.site.retry import RetryPolicy

    return RegistryClient(
        "registry.test",
        plain_http=True,
        transport=httpx.MockTransport(handler),
        retry=RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002),
    )


def test_registry_without_digest_header_is_hashed() -> None:
    body = b'{"schemaVersion":2}'

    def handler(request: httpx.Request) -> httpx.Response:
        assert OCI_MANIFEST in request.headers["Accept"] and OCI_INDEX in request.headers["Accept"]
        return httpx.Response(
            200,
            content=body if request.method == "GET" else b"",
            headers={"Content-Type": OCI_MANIFEST},
        )

    import hashlib

    assert (
        _client(handler).manifest_digest("app", "t").digest
        == "sha256:" + hashlib.sha256(body).hexdigest()
    )


def test_registry_malformed_digest_header_and_retries() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) == 1:
            return httpx.Response(503)
        return httpx.Response(200, headers={"Docker-Content-Digest": "sha256:nothex"})

    with pytest.raises(RegistryError, match="malformed digest 'sha256:nothex'"):
        _client(handler).manifest_digest("app", "t")
    assert calls == ["HEAD", "HEAD"], "a 503 is retried once, then the answer is judged"


def test_registry_auth_refusal() -> None:
    with pytest.raises(RegistryError, match=r"refused access \(HTTP 401\)"):
        _client(lambda request: httpx.Response(401)).manifest_digest("app", "t")
