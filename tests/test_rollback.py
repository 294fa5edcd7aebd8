"""`fabrique rollback`: an older image, checked, written through the write-back with a hold.

Against the Gitea double (real bare repository) and a real git daemon, the real loopback
registry holding real images, and the Kubernetes API double for the reconcile passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.decisions.holds import read_hold

from .conftest import GITEA_TOKEN, KUSTOMIZATION, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .oci import built_labels, push_image
from .servers import GitDaemon, Registry
from .test_reconcile import _phase, _posts

APP_FILE = "dataops/citation-dagster/app.txt"


@pytest.fixture()
def env(tmp_path: Path, kube: KubeApiDouble) -> dict[str, str]:
    return {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }


def fab(values: Path, env: dict[str, str], *args: str) -> Any:
    return run_cli("--values", str(values), *args, env=env)


def _pin(code_repo: Repo) -> dict[str, Any]:
    images = yaml.safe_load(code_repo.show(KUSTOMIZATION))["images"]
    return next(e for e in images if e["name"] == "citation-dagster")


def _line(result: Any, app: str = "citation") -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith(f"{app}: "))


def _built(
    code_repo: Repo,
    registry: Registry,
    gitea_url: str,
    text: str,
    values: Path,
    env: dict[str, str],
) -> tuple[str, str]:
    """A commit, its image pushed as the build does, its digest written back."""
    revision = code_repo.commit({APP_FILE: text})
    digest = push_image(
        registry.url,
        "citation-dagster",
        revision[:12],
        {"app.txt": text.encode()},
        labels=built_labels(revision, gitea_url),
    )
    step = fab(
        values, env, "writeback", "--app", "citation", "--revision", revision, "--digest", digest
    )
    assert step.stdout.startswith("changed: "), step.stdout + step.stderr
    return revision, digest


def _scenario(
    code_repo: Repo, registry: Registry, gitea_url: str, values: Path, env: dict[str, str]
) -> tuple[tuple[str, str], tuple[str, str]]:
    old = _built(code_repo, registry, gitea_url, "v1\n", values, env)
    new = _built(code_repo, registry, gitea_url, "v2\n", values, env)
    return old, new


@pytest.fixture()
def values(tmp_path: Path, gitea: GiteaDouble, registry: Registry) -> Path:
    return write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "registry.host": registry.host}
    )


def test_rollback_writes_the_older_digest_and_a_hold_that_every_path_respects(
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    values: Path,
    env: dict[str, str],
    kube: KubeApiDouble,
) -> None:
    (old, old_digest), (new, new_digest) = _scenario(code_repo, registry, gitea.url, values, env)
    result = fab(
        values,
        env,
        *("rollback", "--app", "citation", "--to", old[:12]),
        *("--reason", "v2 loses uploads", "--by", "alice"),
    )
    assert result.exit_code == 0, result.stderr
    head = code_repo.head()
    assert result.stdout.startswith(
        f"rolled back: citation {registry.host}/citation-dagster:{old[:12]}@{old_digest} -> "
    )
    assert f"(commit {head}); held by alice since " in result.stdout
    assert _pin(code_repo)["digest"] == old_digest and _pin(code_repo)["newTag"] == old[:12]
    hold = read_hold(code_repo.show(KUSTOMIZATION), "k", "citation")
    assert hold is not None and (hold.by, hold.reason) == ("alice", "v2 loses uploads")
    message = code_repo.git("log", "-1", "--format=%B", "main")
    assert message.startswith(f"fabrique: roll citation back to citation-dagster {old[:12]}")
    assert "\n\nv2 loses uploads\n\n" in message
    assert f"Source-Revision: {old}" in message and "Held-By: alice" in message
    assert code_repo.git("diff", "--stat", "main~1", "main").count("|") == 1, "one file"

    # a replay changes nothing
    again = fab(values, env, "rollback", "--app", "citation", "--to", old, "--by", "bob")
    assert again.exit_code == 0, again.stderr
    assert again.stdout.startswith("unchanged: citation already deploys ")
    assert code_repo.head() == head

    # the safety net sees a verified build of the wanted commit, and holds
    _phase(kube, new, "Succeeded", verified=new_digest)
    result = fab(values, env, "reconcile")
    assert result.exit_code == 0, result.stderr
    assert _line(result).startswith("citation: held: held by alice since "), result.stdout
    assert f"deploys {old[:12]} (want {new[:12]})" in _line(result)
    assert code_repo.head() == head and _posts(kube) == 0

    # the Sensor path: a new push builds, and its write-back says held
    newest = code_repo.commit({APP_FILE: "v3\n"})
    digest = push_image(registry.url, "citation-dagster", newest[:12], {"v": b"3"})
    step = fab(
        values, env, "writeback", "--app", "citation", "--revision", newest, "--digest", digest
    )
    assert step.exit_code == 0, step.stderr
    assert step.stdout.startswith("held: citation is held by alice"), step.stdout
    head = code_repo.head()
    assert _pin(code_repo)["digest"] == old_digest

    # release, then the next pass rolls forward (to the newest verified build)
    assert fab(values, env, "release", "--app", "citation").stdout.startswith("released: ")
    _phase(kube, newest, "Succeeded", verified=digest)
    forward = fab(values, env, "reconcile")
    assert _line(forward).startswith("citation: written-back: "), forward.stdout
    assert _pin(code_repo)["digest"] == digest and _pin(code_repo)["newTag"] == newest[:12]
    assert read_hold(code_repo.show(KUSTOMIZATION), "k", "citation") is None


def test_rollback_and_hold_on_a_target_whose_metadata_has_no_value(
    code_repo: Repo, gitea: GiteaDouble, registry: Registry, values: Path, env: dict[str, str]
) -> None:
    """`metadata:` with nothing after it is an empty mapping: the hold goes under it."""
    (old, old_digest), _ = _scenario(code_repo, registry, gitea.url, values, env)
    text = code_repo.show(KUSTOMIZATION).replace(
        "kind: Kustomization\n", "kind: Kustomization\nmetadata:\n"
    )
    code_repo.commit({KUSTOMIZATION: text})
    result = fab(values, env, "rollback", "--app", "citation", "--to", old, "--reason", "v2")
    assert result.exit_code == 0, result.stderr
    held = code_repo.show(KUSTOMIZATION)
    assert "kind: Kustomization\nmetadata:\n  annotations:\n    hold.fabrique.io/citation: " in held
    assert _pin(code_repo)["digest"] == old_digest
    assert fab(values, env, "release", "--app", "citation").exit_code == 0
    result = fab(values, env, "hold", "--app", "citation", "--reason", "freeze")
    assert result.exit_code == 0, result.stderr
    hold = read_hold(code_repo.show(KUSTOMIZATION), "k", "citation")
    assert hold is not None and hold.reason == "freeze"


def test_rollback_to_a_revision_never_built_exits_2_and_writes_nothing(
    code_repo: Repo, gitea: GiteaDouble, registry: Registry, values: Path, env: dict[str, str]
) -> None:
    _built(code_repo, registry, gitea.url, "v1\n", values, env)
    unbuilt = code_repo.commit({APP_FILE: "never built\n"})
    _built(code_repo, registry, gitea.url, "v2\n", values, env)
    head = code_repo.head()
    result = fab(values, env, "rollback", "--app", "citation", "--to", unbuilt, "--by", "alice")
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: --to {unbuilt}: {unbuilt[:12]} was never built: the registry holds no "
        f"{registry.host}/citation-dagster:{unbuilt[:12]}; nothing written\n"
    )
    assert code_repo.head() == head
    assert read_hold(code_repo.show(KUSTOMIZATION), "k", "citation") is None


@pytest.mark.parametrize(
    ("to", "message"),
    [
        ("main", "must be a commit id"),
        ("0123456789ab", "not a commit of atlas/atlas"),
    ],
)
def test_rollback_to_something_that_is_no_commit_exits_2(
    code_repo: Repo, values: Path, env: dict[str, str], to: str, message: str
) -> None:
    head = code_repo.head()
    result = fab(values, env, "rollback", "--app", "citation", "--to", to, "--by", "alice")
    assert result.exit_code == 2
    assert message in result.stderr
    assert code_repo.head() == head


def test_an_image_whose_labels_name_another_commit_is_refused(
    code_repo: Repo, gitea: GiteaDouble, registry: Registry, values: Path, env: dict[str, str]
) -> None:
    """Someone pushed under the tag by hand: the image does not say it is that commit's."""
    old = code_repo.commit({APP_FILE: "v1\n"})
    push_image(
        registry.url,
        "citation-dagster",
        old[:12],
        {"x": b"by hand"},
        labels=built_labels("f" * 40, gitea.url),
    )
    _built(code_repo, registry, gitea.url, "v2\n", values, env)
    head = code_repo.head()
    result = fab(values, env, "rollback", "--app", "citation", "--to", old, "--by", "alice")
    assert result.exit_code == 8
    assert "label org.opencontainers.image.revision is 'ffff" in result.stderr
    assert code_repo.head() == head


def test_rollback_dry_run_prints_the_diff_and_writes_nothing(
    code_repo: Repo, gitea: GiteaDouble, registry: Registry, values: Path, env: dict[str, str]
) -> None:
    (old, old_digest), _ = _scenario(code_repo, registry, gitea.url, values, env)
    head = code_repo.head()
    result = fab(
        values, env, "rollback", "--app", "citation", "--to", old, "--by", "alice", "--dry-run"
    )
    assert result.exit_code == 0, result.stderr
    assert f"+    digest: {old_digest}" in result.stdout
    assert "+    hold.fabrique.io/citation: '" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("would change: citation ")
    assert code_repo.head() == head


def test_git_transport_rollback_then_held(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    git_daemon: GitDaemon,
    kube: KubeApiDouble,
) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.url": gitea.url,
            "registry.host": registry.host,
            "writeback.transport": "git",
            "writeback.gitUrl": f"git://127.0.0.1:{git_daemon.port}",
        },
    )
    env = {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }
    (old, old_digest), (new, new_digest) = _scenario(code_repo, registry, gitea.url, values, env)
    result = fab(values, env, "rollback", "--app", "citation", "--to", old, "--by", "alice")
    assert result.exit_code == 0, result.stderr
    assert _pin(code_repo)["digest"] == old_digest
    head = code_repo.head()
    _phase(kube, new, "Succeeded", verified=new_digest)
    assert _line(fab(values, env, "reconcile")).startswith("citation: held: ")
    step = fab(
        values, env, "writeback", "--app", "citation", "--revision", new, "--digest", new_digest
    )
    assert step.stdout.startswith("held: "), step.stdout
    assert code_repo.head() == head
    assert fab(values, env, "release", "--app", "citation").exit_code == 0
    assert _line(fab(values, env, "reconcile")).startswith("citation: written-back: ")
    assert _pin(code_repo)["digest"] == new_digest


def test_in_pull_request_mode_a_rollback_commits_and_closes_the_open_pull_request(
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    values: Path,
    env: dict[str, str],
) -> None:
    """A person's rollback commits to the target branch, as in commit mode, and the app
    is held: the pull request that proposed a newer digest is closed, saying why."""
    (old, _), _ = _scenario(code_repo, registry, gitea.url, values, env)
    reviewed = write_values(
        values.with_name("reviewed.yaml"),
        **{"gitea.url": gitea.url, "registry.host": registry.host},
        **{"writeback.mode": "pull-request"},
    )
    newest = code_repo.commit({APP_FILE: "v3\n"})
    digest = push_image(registry.url, "citation-dagster", newest[:12], {"v": b"3"})
    proposed = fab(
        reviewed, env, "writeback", "--app", "citation", "--revision", newest, "--digest", digest
    )
    assert proposed.stdout.startswith("proposed: citation "), proposed.stdout + proposed.stderr
    (pull,) = gitea.pulls["atlas/atlas"]
    assert pull["state"] == "open"

    rolled = fab(
        reviewed,
        env,
        *("rollback", "--app", "citation", "--to", old[:12]),
        *("--reason", "v2 loses uploads", "--by", "alice"),
    )
    assert rolled.exit_code == 0, rolled.stderr
    assert rolled.stdout.startswith("rolled back: citation "), rolled.stdout
    assert _pin(code_repo)["newTag"] == old[:12]
    assert pull["state"] == "closed" and not pull["merged"]
    assert pull["body"].startswith("**Closed by fabrique: citation is held by alice since ")
    assert "v2 loses uploads" in pull["body"]
    assert code_repo.git("branch", "--list", "fabrique/citation").strip() == ""
