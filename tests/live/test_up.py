"""``make up`` and ``make down`` as a person runs them (``python -m tests.live.controlplane``,
what the Makefile's targets call): the control plane, Gitea and the default site's event
path come up, a push delivered where it says becomes its Workflow, a second ``up``
changes nothing, and ``down`` stops every process."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .. import payloads
from . import controlplane
from .cluster import ARGO, Cluster
from .controlplane import ROOT, ControlPlane, ControlPlaneError, _exited
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


def _mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


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
        sha = payloads.revision()
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


def test_the_planes_secret_files_are_0600_from_creation_and_tightened_if_there(
    tmp_path: Path,
) -> None:
    """What an earlier plane left readable by all is made 0600 before it is written
    again; a new file is 0600 whatever the umask."""
    made_here = ("ca.key", "apiserver.key", "sa.key", "admin.token", "tokens.csv", "kubeconfig")
    for name in made_here[::2]:
        (tmp_path / name).write_text("an earlier plane's\n")
        (tmp_path / name).chmod(0o644)
    umask = os.umask(0)
    try:
        controlplane._certificates(tmp_path)
        ControlPlane(tmp_path, ports={"apiserver": 6443})._write_credentials("a-token")
    finally:
        os.umask(umask)
    assert {name: _mode(tmp_path / name) for name in made_here} == dict.fromkeys(made_here, "0o600")
    assert (tmp_path / "admin.token").read_text() == "a-token\n"


def test_a_stop_returns_once_the_killed_process_has_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    # a process that ignores SIGTERM, and that takes four looks to be gone after SIGKILL
    # (a Go server of gigabytes, or one in an fsync): `down` must not return before it is
    sent: list[int] = []
    looks = iter([None] * 4 + ["exited"] * 10)
    monkeypatch.setattr(controlplane.os, "killpg", lambda pid, sig: sent.append(sig))
    monkeypatch.setattr(
        controlplane, "_exited", lambda pid: next(looks) if signal.SIGKILL in sent else None
    )
    controlplane._terminate([4242], grace=0.2)
    assert sent == [signal.SIGTERM, signal.SIGKILL]
    assert next(looks) == "exited"  # every look before the last was taken before returning


def test_a_process_that_outlives_sigkill_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controlplane.os, "killpg", lambda pid, sig: None)
    monkeypatch.setattr(controlplane, "_exited", lambda pid: None)
    with pytest.raises(ControlPlaneError, match=r"^process 4242 still runs 0\.2 s after SIGKILL$"):
        controlplane._terminate([4242], grace=0.1, reaped=0.2)
