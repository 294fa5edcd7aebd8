"""Signed write-back commits, as the real Gitea judges them (its API's
``commit.verification``): over git, signed with the write-back's SSH key, which the
site's Gitea trusts (``[repository.signing] TRUSTED_SSH_KEYS``); through the Contents
API, signed by Gitea itself with its instance key (``SIGNING_FORMAT = ssh``,
``CRUD_ACTIONS = always``), as the README tells a platform team to set them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..conftest import run_cli, write_values
from ..test_commit_signing import ssh_key
from . import controlplane
from .fixtures import need_go
from .gitea import Gitea
from .gitea import binary as gitea_binary

SLUG, BRANCH = "atlas/atlas", "main"
TARGET = "deploy/prod/kustomization.yaml"
DIGEST = "sha256:" + "9" * 64


@pytest.fixture(scope="module")
def signing_gitea(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gitea, Path]]:
    """A Gitea that signs its own commits with an instance SSH key and trusts the
    write-back's; the write-back's private key."""
    need_go()
    keys = tmp_path_factory.mktemp("keys")
    instance, writeback = ssh_key(keys, "instance"), ssh_key(keys, "writeback")
    gitea = Gitea(
        tmp_path_factory.mktemp("gitea"),
        gitea_binary(),
        signing={
            "SIGNING_FORMAT": "ssh",
            "SIGNING_KEY": str(instance.with_suffix(".pub")),
            "SIGNING_NAME": "Gitea",
            "SIGNING_EMAIL": "gitea@fabrique.invalid",
            "CRUD_ACTIONS": "always",
            "TRUSTED_SSH_KEYS": " ".join(writeback.with_suffix(".pub").read_text().split()[:2]),
        },
    )
    try:
        gitea.start()
    except (controlplane.ControlPlaneError, controlplane.peers.PeerError) as failed:
        pytest.fail(str(failed), pytrace=False)
    try:
        gitea.repository(SLUG, BRANCH)
        gitea.commit(
            SLUG, BRANCH,
            {TARGET: "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                      "images: []\n"},
            "the prod overlay",
        )  # fmt: skip
        yield gitea, writeback
    finally:
        gitea.stop()


def _verification(gitea: Gitea, sha: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{gitea.url}/api/v1/repos/{SLUG}/git/commits/{sha}",
        headers={"Authorization": f"token {gitea.token}"},
        timeout=30,
    )
    answer.raise_for_status()
    return dict(answer.json()["commit"]["verification"])


def _write_back(gitea: Gitea, tmp_path: Path, transport: str, key: Path | None) -> str:
    """A new commit of the app, and its write-back as the build's step makes it; the
    commit the write-back made."""
    revision = gitea.commit(
        SLUG, BRANCH, {"dataops/citation-dagster/app.txt": transport + str(key)}, "a change"
    )
    settings: dict[str, Any] = {"gitea.url": gitea.url, "writeback.transport": transport}
    if key is not None:
        settings["writeback.signing"] = {"keySecret": {"name": "s", "key": "key"}}
    app = {
        "name": "citation", "image": "citation-dagster", "context": "dataops/citation-dagster",
        "writeback": {"repo": SLUG, "path": TARGET},
    }  # fmt: skip
    values = write_values(tmp_path / f"{transport}.yaml", apps=[app], **settings)
    env = {"FABRIQUE_GITEA_TOKEN": gitea.token}
    if key is not None:
        env["FABRIQUE_WRITEBACK_SIGNING_KEY"] = str(key)
    result = run_cli(
        "--values", str(values), "writeback", "--app", "citation", "--revision", revision,
        "--digest", DIGEST, env=env,
    )  # fmt: skip
    assert result.exit_code == 0 and result.stdout.startswith("changed: "), (
        result.stdout + result.stderr
    )
    return str(result.stdout.rsplit("(commit ", 1)[1].rstrip(")\n"))


def test_a_commit_signed_with_the_write_back_key_is_verified_by_gitea(
    signing_gitea: tuple[Gitea, Path], tmp_path: Path
) -> None:
    gitea, key = signing_gitea
    sha = _write_back(gitea, tmp_path, "git", key)
    verification = _verification(gitea, sha)
    assert verification["verified"] is True, verification
    assert verification["signature"].startswith("-----BEGIN SSH SIGNATURE-----")
    assert verification["reason"].startswith("Gitea / SHA256:"), verification["reason"]


def test_a_contents_api_commit_is_signed_by_gitea_itself(
    signing_gitea: tuple[Gitea, Path], tmp_path: Path
) -> None:
    gitea, _ = signing_gitea
    sha = _write_back(gitea, tmp_path, "gitea", None)
    verification = _verification(gitea, sha)
    assert verification["verified"] is True, verification
    assert verification["signature"].startswith("-----BEGIN SSH SIGNATURE-----")


def test_an_unsigned_commit_is_not_verified(
    signing_gitea: tuple[Gitea, Path], tmp_path: Path
) -> None:
    """The control: the same write over git, no key: Gitea says so."""
    gitea, _ = signing_gitea
    sha = _write_back(gitea, tmp_path, "git", None)
    verification = _verification(gitea, sha)
    assert verification["verified"] is False and verification["signature"] == "", verification
