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
