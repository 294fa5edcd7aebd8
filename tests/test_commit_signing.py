"""Signed write-back commits (``writeback.signing``): over the git transport every
commit is signed with the SSH key of ``$FABRIQUE_WRITEBACK_SIGNING_KEY``, which
``git verify-commit`` accepts; a missing or unusable key stops before anything is read
or written, naming the variable, never the key. Gitea's own verdict is in
``tests/live/test_gitea_signing.py``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from fabrique.render import render_tree
from fabrique.site.config import load_site, parse_site

from .conftest import KUSTOMIZATION, Repo, run_cli, write_values
from .servers import GitDaemon

DIGEST = "sha256:" + "5" * 64


def ssh_key(folder: Path, name: str = "signing", passphrase: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    key = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "fabrique write-back",
         "-f", str(key)],
        check=True, capture_output=True,
    )  # fmt: skip
    return key


def verify_commit(repo: Repo, key: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    """``git verify-commit main`` of ``repo``, trusting ``key``'s public half as
    fabrique's write-back author."""
    signers = folder / "allowed_signers"
    public = key.with_suffix(".pub").read_text().split()
    signers.write_text(f"fabrique@fabrique.invalid {public[0]} {public[1]}\n")
    return subprocess.run(
        ["git", "-C", str(repo.bare), "-c", f"gpg.ssh.allowedSignersFile={signers}",
         "verify-commit", "main"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.fixture()
def signed_values(tmp_path: Path, git_daemon: GitDaemon) -> Path:
    return write_values(
        tmp_path / "site.yaml",
        **{
            "writeback.transport": "git",
            "writeback.gitUrl": f"git://127.0.0.1:{git_daemon.port}",
            "writeback.signing": {
                "keySecret": {"name": "fabrique-writeback-signing", "key": "key"}
            },
        },
    )


def _writeback(values: Path, revision: str, key: Path | None) -> subprocess.CompletedProcess[str]:
    env = {"FABRIQUE_WRITEBACK_SIGNING_KEY": str(key)} if key else {}
    return run_cli(
        "--values", str(values), "writeback", "--app", "citation", "--revision", revision,
        "--digest", DIGEST, env=env,
    )  # fmt: skip


def test_each_write_back_commit_is_signed_and_git_verifies_it(
    tmp_path: Path, code_repo: Repo, signed_values: Path
) -> None:
    key = ssh_key(tmp_path / "keys")
    os.chmod(key, 0o644)  # as a Secret's file may be: fabrique signs from a private copy
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    result = _writeback(signed_values, revision, key)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.startswith("changed:")
    verified = verify_commit(code_repo, key, tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert 'Good "git" signature for fabrique@fabrique.invalid' in verified.stderr
    assert yaml.safe_load(code_repo.show(KUSTOMIZATION))["images"][-1]["digest"] == DIGEST


@pytest.mark.parametrize("problem", ["unset", "missing", "passphrase", "not-a-key"])
def test_a_key_that_cannot_sign_stops_before_anything_is_written(
    tmp_path: Path, code_repo: Repo, signed_values: Path, problem: str
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    head = code_repo.head()
    key: Path | None = {
        "unset": None,
        "missing": tmp_path / "nowhere",
        "passphrase": ssh_key(tmp_path / "keys", passphrase="secret phrase"),
        "not-a-key": tmp_path / "junk",
    }[problem]
    (tmp_path / "junk").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot one\n")
    result = _writeback(signed_values, revision, key)
    assert result.exit_code == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    expected = {
        "unset": "error: writeback.signing: FABRIQUE_WRITEBACK_SIGNING_KEY is not set",
        "missing": f"error: FABRIQUE_WRITEBACK_SIGNING_KEY {key}: No such file",
        "passphrase": f"error: FABRIQUE_WRITEBACK_SIGNING_KEY {key}: not an SSH private key "
        "that signs without a passphrase",
        "not-a-key": f"error: FABRIQUE_WRITEBACK_SIGNING_KEY {key}: not an SSH private key",
    }[problem]
    assert line.startswith(expected), line
    assert "not one" not in result.stderr
    assert code_repo.head() == head


def test_signing_is_for_the_git_transport(tmp_path: Path) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{"writeback.signing": {"keySecret": {"name": "s", "key": "key"}}},
    )
    result = run_cli("--values", str(values), "render", "--out", str(tmp_path / "m"))
    assert result.exit_code == 2
    assert "writeback.signing: signs the commits the git transport makes" in result.stderr


def test_the_key_is_mounted_in_the_writing_steps_alone() -> None:
    site = load_site(env={}).to_values()
    site["writeback"] |= {
        "transport": "git",
        "signing": {"keySecret": {"name": "fabrique-writeback-signing", "key": "ssh-key"}},
    }
    tree = render_tree(parse_site(site))
    mounted: dict[str, str] = {}
    for path, documents in tree.items():
        for doc in documents:
            spec = doc.get("spec") or {}
            spec = spec.get("workflowSpec", spec)
            for template in spec.get("templates") or []:
                volumes = {v["name"]: v for v in template.get("volumes") or []}
                if "writeback-signing-key" not in volumes:
                    continue
                assert volumes["writeback-signing-key"]["secret"] == {
                    "secretName": "fabrique-writeback-signing",
                    "items": [{"key": "ssh-key", "path": "key"}],
                    "defaultMode": 0o400,
                }
                # the build pod's containers, or a template's own, named as its template
                containers = (template.get("containerSet") or {}).get("containers") or [
                    template["container"] | {"name": template["name"]}
                ]
                for container in containers:
                    mounts = {m["name"] for m in container.get("volumeMounts") or []}
                    if "writeback-signing-key" in mounts:
                        env = {e["name"]: e.get("value") for e in container["env"]}
                        key = env["FABRIQUE_WRITEBACK_SIGNING_KEY"]
                        mounted[f"{path}:{container['name']}"] = key
    assert mounted == {
        "build/workflowtemplate.yaml:write-back": "/etc/fabrique/writeback-signing/key",
        # a push's write-back of the builds that meet there (writeback.batch)
        "push/workflowtemplate.yaml:write-back": "/etc/fabrique/writeback-signing/key",
        "reconcile/cronworkflow-fabrique-reconcile.yaml:reconcile": (
            "/etc/fabrique/writeback-signing/key"
        ),
    }
