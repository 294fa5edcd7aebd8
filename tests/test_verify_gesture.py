"""`fabrique verify` and the safety net's look after a deploy: the verdict posted as
``fabrique/<app>/<env>/verified``, and what a failure does (rollback, hold, none).

Against the Gitea double (a real bare repository), the real loopback registry and the
Kubernetes API double holding bench's Argo CD Application and the pods of its namespace,
their status as Argo CD and the kubelet write it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.decisions.holds import read_hold
from fabrique.gestures import verify as verify_gesture

from .conftest import Repo
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .servers import Registry
from .test_promote import (  # noqa: F401
    BENCH,
    PROD,
    _application,
    _lines,
    _pin,
    _statuses,
    env,
    values,
)
from .test_rollback import _built, fab

CONTEXT = "fabrique/citation/bench/verified"


def _pods(kube: KubeApiDouble, registry: Registry, digest: str, **state: Any) -> None:
    """One pod of the app in its namespace, running ``digest`` (``state``: its
    container's status, over a running, Ready one)."""
    repository = f"{registry.host}/citation-dagster"
    container = {
        "name": "app",
        "imageID": f"{repository}@{digest}",
        "ready": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": "2026-12-06T10:00:00Z"}},
    } | state
    kube.pods.clear()
    kube.pods[("dagster", "citation-1")] = {
        "metadata": {"name": "citation-1", "namespace": "dagster", "labels": {"app": "citation"}},
        "spec": {"containers": [{"name": "app", "image": f"{repository}:x@{digest}"}]},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True" if container["ready"] else "False",
                 "lastTransitionTime": "2026-12-06T10:00:00Z"}
            ],
            "containerStatuses": [container],
        },
    }  # fmt: skip


def _at_the_third_look(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], None]) -> None:
    """``fabrique verify --wait`` looks again at once, and ``meanwhile`` happens (as Argo CD
    or seed would make it) just before its third look."""
    monkeypatch.setattr(verify_gesture, "VERIFY_EVERY", 0.05)
    looks = itertools.count(1)
    looked = verify_gesture.look

    def look(*args: Any, **kwargs: Any) -> Any:
        if next(looks) == 3:
            meanwhile()
        return looked(*args, **kwargs)

    monkeypatch.setattr(verify_gesture, "look", look)


def _on_failure(path: Path, action: str) -> None:
    site = yaml.safe_load(path.read_text())
    site["apps"][0]["environments"][0]["verify"] = {"onFailure": action}
    path.write_text(yaml.safe_dump(site))


def _verified(gitea: GiteaDouble, revision: str) -> list[tuple[str, str]]:
    return [(s["state"], s["description"]) for s in _statuses(gitea, revision)
            if s["context"] == CONTEXT]  # fmt: skip


def test_a_digest_that_crash_loops_is_rolled_back_to_the_last_verified_and_held(
    values: Path,  # noqa: F811
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],  # noqa: F811
) -> None:
    _on_failure(values, "rollback")
    good, good_digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    reference = f"{registry.host}/citation-dagster:{good[:12]}@{good_digest}"
    _application(kube, "Synced", "Healthy", [reference])
    _pods(kube, registry, good_digest)
    first = fab(values, env, "verify", "--app", "citation", "--env", "bench")
    assert first.exit_code == 0, first.stdout + first.stderr
    assert first.stdout.strip() == (
        f"citation/bench: verified: {good_digest}: Synced and Healthy, 1 pod(s) run it"
    )
    assert _verified(gitea, good) == [("success", f"verified in bench: {good_digest}")]
    again = fab(values, env, "verify", "--app", "citation", "--env", "bench")
    assert again.stdout.startswith("citation/bench: judged: "), again.stdout
    assert _verified(gitea, good) == [("success", f"verified in bench: {good_digest}")]

    bad, bad_digest = _built(code_repo, registry, gitea.url, "v2\n", values, env)
    prod_before = code_repo.show(PROD)
    _application(kube, "Synced", "Progressing", [reference])
    crash = {"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
             "ready": False, "restartCount": 2}  # fmt: skip
    _pods(kube, registry, bad_digest, **crash)
    failed = fab(values, env, "verify", "--app", "citation", "--env", "bench")
    assert failed.exit_code == 8, failed.stdout + failed.stderr
    head = code_repo.head()
    why = "pod citation-1 (app) is CrashLoopBackOff, 2 restart(s): back-off 20s"
    done = f"rolled back to {good[:12]} ({good_digest}), commit {head[:12]}"
    assert failed.stdout.strip() == f"citation/bench: rolled-back: {bad_digest}: {why}; {done}"
    assert _pin(code_repo, BENCH)["digest"] == good_digest
    hold = read_hold(code_repo.show(BENCH), BENCH, "citation")
    assert hold is not None and hold.by == "fabrique verify"
    assert hold.reason == f"{bad_digest} failed verification in bench: {why}"
    # Gitea keeps a description to 140 characters: the digest first, then why
    ((state, description),) = _verified(gitea, bad)
    assert state == "failure"
    assert description.startswith(f"failed in bench: {bad_digest}: pod citation-1 (app) is Cra")
    assert code_repo.show(PROD) == prod_before, "prod is never touched"

    # the rolled-back digest is verified already: nothing more to do, and a replay of
    # the failed build's write-back finds the environment held
    after = fab(values, env, "verify", "--app", "citation", "--env", "bench")
    assert after.exit_code == 0 and after.stdout.startswith("citation/bench: judged: ")
    replay = fab(
        values, env, "writeback", "--app", "citation", "--revision", bad, "--digest", bad_digest
    )
    assert replay.stdout.startswith("held: citation is held by fabrique verify"), replay.stdout
    assert code_repo.head() == head


def test_in_the_first_environment_a_failure_holds_it_where_it_is(
    values: Path,  # noqa: F811
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],  # noqa: F811
) -> None:
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    _application(kube, "Synced", "Degraded", [])
    kube.applications[("argocd", "citation")]["status"]["health"]["message"] = "exceeded"
    failed = fab(values, env, "verify", "--app", "citation", "--env", "bench")
    assert failed.exit_code == 8, failed.stdout + failed.stderr
    assert failed.stdout.strip() == (
        f"citation/bench: held: {digest}: the Application is Degraded: exceeded; held where it is"
    )
    assert _pin(code_repo, BENCH)["digest"] == digest
    hold = read_hold(code_repo.show(BENCH), BENCH, "citation")
    assert hold is not None and "failed verification in bench" in hold.reason
    assert [state for state, _ in _verified(gitea, revision)] == ["failure"]


def test_what_is_missing_is_pending_once_then_a_failure_past_the_timeout(
    values: Path,  # noqa: F811
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],  # noqa: F811
) -> None:
    _on_failure(values, "none")
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    _application(kube, "OutOfSync", "Healthy", [])
    waiting = f"{digest}: the Application is OutOfSync, not Synced"
    for _ in range(2):
        look = fab(values, env, "verify", "--app", "citation", "--env", "bench")
        assert look.exit_code == 0, look.stdout + look.stderr
        assert look.stdout.strip() == f"citation/bench: verifying: {waiting}"
    assert _verified(gitea, revision) == [("pending", f"verifying in bench: {waiting}")]
    # the first look was eleven minutes ago: the timeout (10m) counts from it
    (pending,) = [s for s in gitea.statuses[("atlas/atlas", revision)] if s["context"] == CONTEXT]
    pending["created_at"] = "2026-12-06T09:00:00Z"
    late = fab(values, env, "verify", "--app", "citation", "--env", "bench")
    assert late.exit_code == 8
    said = f"{digest}: not verified within 10m: the Application is OutOfSync, not Synced"
    assert late.stdout.strip() == (
        f"citation/bench: verify-failed: {said}; nothing done (onFailure: none)"
    )
    assert read_hold(code_repo.show(BENCH), BENCH, "citation") is None


def test_each_pass_looks_at_the_environments_of_its_own_cluster_first(
    values: Path,  # noqa: F811
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],  # noqa: F811
) -> None:
    site = yaml.safe_load(values.read_text())
    site["targets"]["bench"]["inCluster"] = True
    values.write_text(yaml.safe_dump(site))
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    reference = f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"
    _application(kube, "Synced", "Healthy", [reference])
    _pods(kube, registry, digest)
    result = fab(values, env, "reconcile")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert _lines(result, "citation/bench") == [
        f"citation/bench: verified: {digest}: Synced and Healthy, 1 pod(s) run it"
    ]
    again = fab(values, env, "reconcile")
    assert _lines(again, "citation/bench") == []


def test_verify_wait_looks_again_until_the_verdict(
    values: Path,  # noqa: F811
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a job runs after a deploy: it returns with the verdict, saying each look."""
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    reference = f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"
    _application(kube, "Synced", "Progressing", [reference])
    _pods(kube, registry, digest)
    _at_the_third_look(monkeypatch, lambda: _application(kube, "Synced", "Healthy", [reference]))
    done = fab(values, env, "verify", "--app", "citation", "--env", "bench", "--wait")
    assert done.exit_code == 0, done.stdout + done.stderr
    assert done.stdout.strip() == (
        f"citation/bench: verified: {digest}: Synced and Healthy, 1 pod(s) run it"
    )
    waiting = f"citation/bench: verifying: {digest}: the Application is Progressing, not Healthy"
    assert done.stderr.splitlines() == [waiting, waiting]
