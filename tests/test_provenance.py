"""Provenance: `digest verify` with build.attestations checks the index's attestations.

Against the real registry on loopback, holding image indexes built by hand through the
registry API the way BuildKit pushes them (an image, and an attestation manifest whose
in-toto layers are the SLSA provenance and, with build.sbom, an SPDX SBOM).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fabrique.site.config import load_site
from fabrique.site.errors import ConfigError

from .conftest import GITEA_TOKEN, KUSTOMIZATION, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .oci import SLSA_V1, provenance, push_attested_index, push_image
from .servers import Registry

REV = "5b1e0c9d8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d"
TAG = REV[:12]
SOURCE = "http://gitea-http.gitea.svc.cluster.local:3000/atlas/atlas.git"


def _values(tmp_path: Path, registry: Registry, **extra: Any) -> Path:
    return write_values(
        tmp_path / "site.yaml",
        **{"registry.host": registry.host, "build.attestations": True, **extra},
    )


def _verify(values: Path, tmp_path: Path, digest: str) -> tuple[Any, Path]:
    metadata = tmp_path / "metadata.json"
    metadata.write_text(json.dumps({"containerimage.digest": digest}))
    out = tmp_path / "out" / "digest"
    result = run_cli(
        *("--values", str(values), "digest", "verify", "--app", "citation"),
        *("--revision", REV, "--metadata", str(metadata), "--output", str(out)),
    )
    return result, out


def _repo(name: str) -> str:
    return f"citation-dagster-{name}"


def test_an_attested_index_passes_and_its_digest_is_the_index(
    tmp_path: Path, registry: Registry
) -> None:
    index, image = push_attested_index(registry.url, "citation-dagster", TAG, REV, SOURCE)
    result, out = _verify(_values(tmp_path, registry), tmp_path, index)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == index != image
    assert out.read_text() == index


def test_stripped_attestation_fails_and_writes_nothing(tmp_path: Path, registry: Registry) -> None:
    index, _ = push_attested_index(registry.url, "citation-dagster", TAG, REV, SOURCE, attest=False)
    result, out = _verify(_values(tmp_path, registry), tmp_path, index)
    assert result.exit_code == 8
    assert "no attestation manifest for its image sha256:" in result.stderr
    assert "nothing is written back" in result.stderr
    assert not out.exists() and result.stdout == ""


def test_a_single_manifest_fails_when_attestations_are_on(
    tmp_path: Path, registry: Registry
) -> None:
    digest = push_image(registry.url, "citation-dagster", TAG)
    result, out = _verify(_values(tmp_path, registry), tmp_path, digest)
    assert result.exit_code == 8
    assert "a single manifest, without attestations" in result.stderr
    assert not out.exists()


def test_without_the_switch_an_index_is_not_asked_for_attestations(
    tmp_path: Path, registry: Registry
) -> None:
    index, _ = push_attested_index(registry.url, "citation-dagster", TAG, REV, SOURCE, attest=False)
    values = write_values(tmp_path / "site.yaml", **{"registry.host": registry.host})
    result, out = _verify(values, tmp_path, index)
    assert result.exit_code == 0, result.stderr
    assert out.read_text() == index


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        (
            lambda image: provenance(image, "f" * 40, SOURCE),
            f"the provenance names revision '{'f' * 40}', not '{REV}'",
        ),
        (
            lambda image: provenance(image, REV, "http://elsewhere/x/y.git"),
            "the provenance names source 'http://elsewhere/x/y.git'",
        ),
        (
            lambda image: provenance("sha256:" + "0" * 64, REV, SOURCE),
            "the provenance is about ['" + "0" * 64 + "']",
        ),
        (
            lambda image: {**provenance(image, REV, SOURCE), "predicate": {}},
            "the provenance names revision None",
        ),
        (  # a malformed statement is one line and exit 8, never a traceback
            lambda image: {**provenance(image, REV, SOURCE), "subject": [{"digest": image}]},
            "the provenance is about [], not",
        ),
        (
            lambda image: {**provenance(image, REV, SOURCE), "subject": {"digest": image}},
            "the provenance's subject is not a list",
        ),
        (
            lambda image: {**provenance(image, REV, SOURCE), "subject": 7},
            "the provenance's subject is not a list",
        ),
    ],
)
def test_provenance_must_be_about_the_image_and_name_revision_and_repository(
    tmp_path: Path, registry: Registry, statement: Any, message: str
) -> None:
    index, _ = push_attested_index(
        registry.url, "citation-dagster", TAG, REV, SOURCE, statement=statement
    )
    result, out = _verify(_values(tmp_path, registry), tmp_path, index)
    assert result.exit_code == 8, result.stderr
    assert message in result.stderr
    assert not out.exists()


def test_slsa_v1_provenance_is_read_too(tmp_path: Path, registry: Registry) -> None:
    index, _ = push_attested_index(
        *(registry.url, "citation-dagster", TAG, REV, SOURCE),
        statement=lambda image: provenance(image, REV, SOURCE, version=SLSA_V1),
    )
    result, _ = _verify(_values(tmp_path, registry), tmp_path, index)
    assert result.exit_code == 0, result.stderr


def test_an_attestation_for_another_image_does_not_count(
    tmp_path: Path, registry: Registry
) -> None:
    index, _ = push_attested_index(
        registry.url, "citation-dagster", TAG, REV, SOURCE, refers_to="sha256:" + "1" * 64
    )
    result, _ = _verify(_values(tmp_path, registry), tmp_path, index)
    assert result.exit_code == 8
    assert "no attestation manifest for its image" in result.stderr


def test_sbom_switch_requires_the_spdx_attestation(tmp_path: Path, registry: Registry) -> None:
    values = _values(
        tmp_path,
        registry,
        **{"build.sbom": True, "images.sbomScanner": "registry:80/buildkit-syft-scanner:1.4.0"},
    )
    without, _ = push_attested_index(registry.url, "citation-dagster", TAG, REV, SOURCE)
    result, out = _verify(values, tmp_path, without)
    assert result.exit_code == 8
    assert "no SPDX SBOM for sha256:" in result.stderr
    assert not out.exists()
    with_sbom, _ = push_attested_index(
        registry.url, "citation-dagster", TAG, REV, SOURCE, sbom=True
    )
    result, out = _verify(values, tmp_path, with_sbom)
    assert result.exit_code == 0, result.stderr
    assert out.read_text() == with_sbom


def test_sbom_needs_attestations_and_a_mirrored_scanner() -> None:
    with pytest.raises(ConfigError, match=re.escape("build.sbom: needs build.attestations: true")):
        load_site(env={"FABRIQUE_BUILD__SBOM": "true"})
    with pytest.raises(
        ConfigError, match=re.escape("images.sbomScanner: required with build.sbom")
    ):
        load_site(env={"FABRIQUE_BUILD__SBOM": "true", "FABRIQUE_BUILD__ATTESTATIONS": "true"})


def test_rollback_with_attestations_on_refuses_a_stripped_image(
    tmp_path: Path, code_repo: Repo, gitea: GiteaDouble, registry: Registry
) -> None:
    old = code_repo.commit({"dataops/citation-dagster/app.txt": "v1\n"})
    source = f"{gitea.url}/atlas/atlas.git"
    code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    values = _values(tmp_path, registry, **{"gitea.url": gitea.url})
    env = {"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN}
    head = code_repo.head()
    push_attested_index(registry.url, "citation-dagster", old[:12], old, source, attest=False)
    args = ("--values", str(values), "rollback", "--app", "citation", "--to", old, "--by", "a")
    refused = run_cli(*args, env=env)
    assert refused.exit_code == 8, refused.stderr
    assert "no attestation manifest" in refused.stderr
    assert code_repo.head() == head

    index, _ = push_attested_index(registry.url, "citation-dagster", old[:12], old, source)
    done = run_cli(*args, env=env)
    assert done.exit_code == 0, done.stderr
    assert f"@{index} -> " in done.stdout
    assert index in code_repo.show(KUSTOMIZATION)
