"""The scenario's gates on recorded outputs: each passes on a good one and fails on a bad one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "bench" / "scenarios"))
import gates

FIXTURES = ROOT / "bench" / "scenarios" / "fixtures"
REVISION = "9c1d0f3b2a4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c"


def _json(name: str) -> object:
    return json.loads((FIXTURES / name).read_text())


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_gate_deployed_by_digest() -> None:
    assert gates.deployed_by_digest(_json("workloads-by-digest.json")) == []
    assert gates.deployed_by_digest(_json("workloads-by-tag.json")) == [
        "Deployment/citation-dagster: container webserver runs 'registry:80/citation-dagster:0a1b2c3d4e5f', not by digest"
    ]
    assert gates.deployed_by_digest({"items": []}) == ["no workload deployed"]


def test_gate_application_synced_healthy() -> None:
    assert gates.application_synced_healthy(_json("application-healthy.json")) == []
    assert gates.application_synced_healthy(_json("application-progressing.json")) == [
        "Application citation: sync is OutOfSync, not Synced",
        "Application citation: health is Progressing, not Healthy",
    ]


def test_gate_pods_ready_by_digest() -> None:
    assert gates.pods_ready_by_digest(_json("pods-ready.json")) == []
    problems = gates.pods_ready_by_digest(_json("pods-not-ready.json"))
    assert problems[0] == "pod citation-dagster-6d5f7c9b8-x2k4p: not Ready"
    assert "is not by digest" in problems[1]


def test_gate_pods_ready_by_digest_wants_the_runtime_to_run_that_digest() -> None:
    """A pod reported Ready by what pulls nothing (kwok: no imageID), or running another
    image than the one its spec names, fails gate 3."""
    pods = _json("pods-ready.json")
    assert isinstance(pods, dict)
    (status,) = pods["items"][0]["status"]["containerStatuses"]
    status["imageID"] = ""
    (problem,) = gates.pods_ready_by_digest(pods)
    assert problem.startswith("pod citation-dagster-") and "runs imageID ''" in problem
    status["imageID"] = "registry:80/citation-dagster@sha256:" + "4" * 64
    (problem,) = gates.pods_ready_by_digest(pods)
    assert problem.endswith("not sha256:" + "3" * 64)


SEED_REPLAY = """\
plan for citation on prod (bench):
  registry-name: unchanged (registry resolves in fabrique, fabrique-build)
registry-name: unchanged (registry resolves in fabrique, fabrique-build)
image: unchanged (registry:80/citation-dagster:0a1b2c3d4e5f@sha256:3333)
write-back: unchanged (atlas/atlas@main:dataops/citation-dagster/deploy/overlays/prod/kustomization.yaml)
secrets: unchanged (dagster/pgvector-pg-auth unchanged)
webhook: unchanged (unchanged: webhook #2)
application: unchanged (cluster/apps@main:apps/citation.yaml)
"""


def test_gate_seed_replay_unchanged() -> None:
    head = "a" * 40
    assert gates.seed_replay_unchanged(SEED_REPLAY, head, head) == []
    changed = SEED_REPLAY.replace("application: unchanged", "application: changed")
    assert gates.seed_replay_unchanged(changed, head, "b" * 40) == [
        "seed step application is changed, not unchanged",
        f"a commit appeared: {head} -> {'b' * 40}",
    ]
    # the plan's indented lines are not what was done
    planned_only = "\n".join(line for line in SEED_REPLAY.splitlines() if "application" not in line)
    assert gates.seed_replay_unchanged(planned_only, head, head) == [
        "seed replay said nothing of step application"
    ]


def test_gate_status_success() -> None:
    digest = "sha256:" + "3" * 64
    statuses = [
        {"id": 2, "context": "fabrique/citation", "status": "success",
         "description": f"deployed {digest}; changed, commit 0a1b2c3d4e5f",
         "updated_at": "2026-12-04T10:00:05Z"},
        {"id": 1, "context": "fabrique/citation", "status": "pending",
         "description": "building", "updated_at": "2026-12-04T10:00:00Z"},
        {"id": 3, "context": "fabrique/other", "status": "failure", "description": "x",
         "updated_at": "2026-12-04T10:00:09Z"},
    ]  # fmt: skip
    assert gates.status_success(statuses, "citation", digest) == []
    assert gates.status_success(statuses, "citation", "sha256:" + "4" * 64) == [
        f"status fabrique/citation does not name sha256:{'4' * 64}: "
        f"'deployed {digest}; changed, commit 0a1b2c3d4e5f'"
    ]
    assert gates.status_success(statuses[1:], "citation", digest)[0].startswith(
        "status fabrique/citation is pending, not success"
    )
    assert gates.status_success([], "citation", digest) == ["no commit status fabrique/citation"]


def test_gate_replay_is_noop() -> None:
    head = "a" * 40
    assert (
        gates.replay_is_noop(_text("submit-replay.out"), _text("writeback-replay.out"), head, head)
        == []
    )
    problems = gates.replay_is_noop(
        "created: workflow x", _text("writeback-changed.out"), head, "b" * 40
    )
    assert len(problems) == 3


def test_gate_reconciled() -> None:
    assert gates.reconciled(_json("status-reconciled.json"), "citation", REVISION) == []  # type: ignore[arg-type]
    assert gates.reconciled(_json("status-in-flight.json"), "citation", REVISION) == [  # type: ignore[arg-type]
        "app citation: state in-flight (fabrique-citation-9c1d0f3b2a4e is Running), not ok"
    ]
    assert gates.reconciled(_json("status-reconciled.json"), "citation", "f" * 40)[0].startswith(
        "app citation: want is"
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["deployed-by-digest", "workloads-by-digest.json"], 0),
        (["deployed-by-digest", "workloads-by-tag.json"], 1),
        (["reconciled", "status-reconciled.json", "citation", REVISION], 0),
        (["status-success", "status-reconciled.json", "citation", "sha256:" + "3" * 64], 1),
    ],
)
def test_the_script_calls_gates_by_name(args: list[str], code: int) -> None:
    argv = [a if not a.endswith((".json", ".out")) else str(FIXTURES / a) for a in args]
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scenarios" / "gates.py"), *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == code, result.stdout + result.stderr
    assert result.stdout.startswith("PASS" if code == 0 else "FAIL")


def test_scenario_skips_without_a_cluster_and_fails_when_strict(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(tmp_path / "none"),
        "FABRIQUE": sys.executable,
        "PYTHON": sys.executable,
    }
    script = ROOT / "bench" / "scenarios" / "build-gitops-digest.sh"
    skipped = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert skipped.returncode == 0 and skipped.stdout.startswith("SKIP: ")
    strict = subprocess.run(
        ["bash", str(script)],
        env=env | {"STRICT": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert strict.returncode == 1 and strict.stdout.startswith("FAIL: ")


def test_timings_reads_each_stage_from_the_objects_own_times() -> None:
    import timings

    pushed = timings._epoch("2026-12-04T10:00:00Z") - 0.5
    workflow = {
        "metadata": {"creationTimestamp": "2026-12-04T10:00:01Z"},
        "status": {
            "finishedAt": "2026-12-04T10:00:40Z",
            "nodes": {
                # the build container's node in the build's pod, as the controller names it
                "a": {
                    "displayName": "run(0).build",
                    "type": "Container",
                    "startedAt": "2026-12-04T10:00:12Z",
                    "finishedAt": "2026-12-04T10:00:30Z",
                },
                "b": {
                    "displayName": "run(0).write-back",
                    "type": "Container",
                    "finishedAt": "2026-12-04T10:00:39Z",
                },
                "c": {"displayName": "run", "type": "Retry", "finishedAt": "2026-12-04T10:00:39Z"},
            },
        },
    }
    commit = {
        "committer": {"login": "fabrique"},
        "commit": {"committer": {"date": "2026-12-04T10:00:38Z"}},
    }
    application = {"status": {"operationState": {"finishedAt": "2026-12-04T10:00:50Z"}}}
    pods = {"items": [{"status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-04T10:00:55Z"}]}}]}  # fmt: skip
    assert timings.stages(pushed, workflow, commit, application, pods) == {
        "workflow_created": 1.5,
        "build_started": 12.5,
        "build_done": 30.5,
        "workflow_done": 40.5,
        "digest_in_git": 38.5,
        "synced": 50.5,
        "pod_ready": 55.5,
    }


def _environments(values: Path | None, app: str = "citation") -> subprocess.CompletedProcess[str]:
    script = ROOT / "bench" / "scenarios" / "environments.py"
    env = {"PATH": "/usr/bin:/bin", **({"FABRIQUE_VALUES": str(values)} if values else {})}
    return subprocess.run(
        [sys.executable, str(script), app], env=env, capture_output=True, text=True, check=False
    )


def test_the_scenario_walks_the_environments_with_seed_s_and_promote_s_defaults(
    tmp_path: Path,
) -> None:
    alone = _environments(None)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines() == ["-\t-\t-\targocd\tcitation\tdagster"]
    from fabrique.site.config import load_site

    app = load_site(env={}).to_values()["apps"][0]
    app["environments"] = [
        {"name": "bench", "target": "bench", "checks": ["bench/scenario-34", "bench/smoke"]},
        {"name": "prod", "target": "prod", "application": "argocd/citation-prod",
         "writeback": {"repo": "atlas/atlas", "path": "deploy/prod/kustomization.yaml"}},
    ]  # fmt: skip
    values = tmp_path / "site.yaml"
    values.write_text(
        json.dumps({"targets": {"bench": {"context": "lab"}, "prod": {"context": "p"}},
                    "apps": [app]})
    )  # fmt: skip
    walked = _environments(values)
    assert walked.returncode == 0, walked.stderr
    assert [line.split("\t") for line in walked.stdout.splitlines()] == [
        ["bench", "bench", "lab", "argocd", "citation", "dagster", "bench/scenario-34",
         "bench/smoke"],
        ["prod", "prod", "p", "argocd", "citation-prod", "dagster"],
    ]  # fmt: skip
    unknown = _environments(values, "nope")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: app 'nope'")
