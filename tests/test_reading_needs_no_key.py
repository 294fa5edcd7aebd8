"""Reading needs no signing key: with ``writeback.signing`` set, the commands that write
nothing (``status``, ``reconcile --dry-run``, the build's ``plan``) run without
``$FABRIQUE_WRITEBACK_SIGNING_KEY``; the ones that write still stop before anything is
read when it is missing, and a transport opened to read never makes an unsigned commit."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabrique.clients.git import SIGNING_KEY_ENV
from fabrique.decisions.writeback import open_transport
from fabrique.site.config import load_site

from .conftest import GITEA_TOKEN, KUSTOMIZATION, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .servers import GitDaemon, Registry

REVISION_FILE = "dataops/citation-dagster/app.txt"


@pytest.fixture()
def values(tmp_path: Path, git_daemon: GitDaemon, gitea: GiteaDouble, registry: Registry) -> Path:
    return write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.url": gitea.url,
            "registry.host": registry.host,
            "writeback.transport": "git",
            "writeback.gitUrl": f"git://127.0.0.1:{git_daemon.port}",
            "writeback.signing": {
                "keySecret": {"name": "fabrique-writeback-signing", "key": "key"}
            },
        },
    )


@pytest.fixture()
def env(tmp_path: Path, kube: KubeApiDouble, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    return {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }


def _fab(values: Path, env: dict[str, str], *args: str):  # type: ignore[no-untyped-def]
    return run_cli("--values", str(values), *args, env=env)


def test_status_reads_without_the_key(values: Path, env: dict[str, str], code_repo: Repo) -> None:
    revision = code_repo.commit({REVISION_FILE: "v2\n"})
    result = _fab(values, env, "status", "--app", "citation")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[:3] == ["citation", "not-built", revision[:12]]


def test_a_dry_run_pass_reads_without_the_key(
    values: Path, env: dict[str, str], code_repo: Repo, kube: KubeApiDouble
) -> None:
    code_repo.commit({REVISION_FILE: "v2\n"})
    result = _fab(values, env, "reconcile", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("citation: would-submit: "), result.stdout
    assert not [r for r in kube.requests if r.method == "POST" and "/workflows" in r.path]


def test_the_build_plan_reads_without_the_key(
    values: Path, env: dict[str, str], code_repo: Repo, tmp_path: Path
) -> None:
    """The plan step mounts no key (the write-back step alone does): it must not need one."""
    revision = code_repo.commit({REVISION_FILE: "v2\n"})
    out = tmp_path / "plan"
    result = _fab(
        values, env, "plan", "--app", "citation", "--revision", revision, "--out", str(out)
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("plan: build "), result.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("writeback", "--revision", "{revision}", "--digest", "sha256:" + "5" * 64), "+"),
        (("hold", "--reason", "freeze", "--by", "alice"), "would hold: citation"),
        (("release", "--by", "alice"), "unchanged: "),
    ],
    ids=["writeback", "hold", "release"],
)
def test_a_dry_run_of_a_gesture_reads_without_the_key(
    values: Path, env: dict[str, str], code_repo: Repo, args: tuple[str, ...], said: str
) -> None:
    """A dry run writes nothing: it says what would be committed, and needs no key to."""
    revision = code_repo.commit({REVISION_FILE: "v2\n"})
    head = code_repo.head()
    given = [arg.format(revision=revision) for arg in args]
    result = _fab(values, env, given[0], "--app", "citation", *given[1:], "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert said in result.stdout, result.stdout
    assert code_repo.head() == head


def test_writing_still_needs_the_key_before_anything_is_read(
    values: Path, env: dict[str, str], code_repo: Repo
) -> None:
    code_repo.commit({REVISION_FILE: "v2\n"})
    head = code_repo.head()
    result = _fab(values, env, "reconcile")
    assert result.exit_code == 2, result.stdout + result.stderr
    assert f"writeback.signing: {SIGNING_KEY_ENV} is not set" in result.stderr
    assert result.stdout == "" and code_repo.head() == head


def test_a_transport_opened_to_read_makes_no_unsigned_commit(
    values: Path, env: dict[str, str], code_repo: Repo
) -> None:
    site = load_site(values, env={})
    head = code_repo.head()
    with open_transport(site, GITEA_TOKEN, writes=False) as transport:
        snapshot = transport.read("atlas/atlas", "main", KUSTOMIZATION)
        assert snapshot.text is not None
        with pytest.raises(RuntimeError, match="opened to read"):
            transport.write("atlas/atlas", "main", KUSTOMIZATION, "x: 1\n", snapshot, "m")
    assert code_repo.head() == head
