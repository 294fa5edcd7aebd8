"""``make up`` and ``make down`` as a person runs them (``python -m tests.live.controlplane``,
what the Makefile's targets call): the control plane, Gitea and the default site's event
path come up, a push delivered where it says becomes its Workflow, a second ``up``
changes nothing, and ``down`` stops every process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import httpx

from .. import payloads
from .cluster import ARGO, Cluster
from .controlplane import ROOT, ControlPlane, _exited
from .fixtures import need_go
from .gitea import Gitea

APP_FILE = "dataops/citation-dagster/app.txt"


def _run(folder: Path, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.live.controlplane", command],
        cwd=ROOT,
        env={**os.environ, "FABRIQUE_LIVE_DIR": str(folder)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _said(out: str) -> list[str]:
    """What ``up`` says of what runs (the peers' build lines aside)."""
    return [line for line in out.splitlines() if not line.startswith("peer")]


def test_make_up_brings_up_the_event_path_and_make_down_stops_it(tmp_path: Path) -> None:
    need_go()
    folder = tmp_path / "live"
    up = _run(folder, "up")
    try:
        assert up.returncode == 0, up.stderr
        plane = ControlPlane.load(folder)
        assert plane is not None
        assert f"export KUBECONFIG={plane.kubeconfig}" in up.stdout.splitlines()
        found = re.search(r"takes Gitea's pushes at (\S+) \(the bearer token in (\S+)\)", up.stdout)
        assert found, up.stdout
        webhook, bearer = found[1], Path(found[2]).read_text()
        assert bearer not in up.stdout + up.stderr
        assert {"argo-events-eventbus", "argo-events-eventsource", "argo-events-sensor"} <= set(
            plane.pids
        )

        # a push delivered where it says, with the bearer: the Sensor makes its Workflow
        sha = uuid.uuid4().hex + uuid.uuid4().hex[:8]
        body = payloads.push(after=sha, files=[APP_FILE])["body"]
        headers = {"X-Gitea-Event": "push", "Authorization": f"Bearer {bearer}"}
        assert httpx.post(webhook, json=body, headers=headers, timeout=30).status_code == 200
        cluster = Cluster(plane)
        try:
            path = f"{ARGO}/namespaces/fabrique-build/workflows/fabrique-citation-{sha[:12]}"
            cluster.wait("the push's Workflow", lambda: cluster.exists(path) or None)
        finally:
            cluster.http.close()

        # again: the same processes, the same lines
        again = _run(folder, "up")
        assert again.returncode == 0, again.stderr
        assert _said(again.stdout) == _said(up.stdout)
        reloaded = ControlPlane.load(folder)
        assert reloaded is not None and reloaded.pids == plane.pids
    finally:
        down = _run(folder, "down")
    assert down.returncode == 0, down.stderr
    assert all(_exited(pid) is not None for pid in plane.pids.values())
    gitea = Gitea.load(folder / "gitea")
    assert gitea is None or not gitea.alive()
