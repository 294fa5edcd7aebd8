"""``make up`` and ``make down`` as a person runs them (``python -m tests.live.controlplane``,
what the Makefile's targets call): the control plane, Gitea and the default site's event
path come up, their secret files readable by their owner only; the code repository's
first commit is built and its digest written back before ``up`` returns; a push to the
code repository, cloned and pushed at once as ``up`` says, becomes its Workflow and its
write-back, and ``fabrique status`` says ``ok`` for it; a second ``up`` changes nothing,
``down`` stops every process, and ``up`` comes up again after it."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fabrique.gestures.doctor import TLS_EOF_WARNING
from fabrique.site.config import load_site

from . import controlplane
from .cluster import ARGO, Cluster
from .controlplane import ROOT, ControlPlane, ControlPlaneError, _exited
from .fixtures import need_go, need_root
from .gitea import ADMIN, Gitea

# every secret file of the plane and of its Gitea: keys, tokens, a password, kubeconfigs
SECRET_FILES = (
    "ca.key",
    "apiserver.key",
    "sa.key",
    "admin.token",
    "netpol.token",
    "tokens.csv",
    "kubeconfig",
    "argo.kubeconfig",
    "webhook.bearer",
    "gitea/token",
    "gitea/admin.password",
    "gitea/app.ini",
)
CODE_REPO = load_site(env={}).gitea.code_repo
# a person's git, with no identity or terminal of its own here
GIT_ENV = {
    "GIT_AUTHOR_NAME": "a person",
    "GIT_AUTHOR_EMAIL": "person@example.invalid",
    "GIT_COMMITTER_NAME": "a person",
    "GIT_COMMITTER_EMAIL": "person@example.invalid",
    "GIT_TERMINAL_PROMPT": "0",
}


def _run(folder: Path, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.live.controlplane", command],
        cwd=ROOT,
        env={**os.environ, "FABRIQUE_LIVE_DIR": str(folder)},
        capture_output=True,
        text=True,
        # a fresh plane: the node's images, Argo CD, and the seed commit's build
        timeout=900,
        check=False,
    )


def _mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


def _push_as_printed(out: str, where: Path) -> str:
    """Run the commands ``up`` printed to clone the code repository and push a change,
    as a person pastes them; the commit pushed."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("To push to it as the admin:"))
    commands = [line.removeprefix("#   ") for line in lines[start + 1 : start + 3]]
    assert all(c.startswith(("git clone ", "cd ")) for c in commands), commands
    done = subprocess.run(
        ["bash", "-euc", " && ".join([*commands, "git rev-parse HEAD"])],
        cwd=where,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def _head(gitea: Gitea) -> dict[str, Any]:
    """The code repository's branch head: its ``sha`` and ``parents``."""
    with gitea.admin() as admin:
        listed = admin.get(f"/repos/{CODE_REPO}/commits", params={"sha": "main", "limit": "1"})
    assert listed.status_code == 200, listed.text
    return dict(listed.json()[0])


def _parents(commit: dict[str, Any]) -> list[str]:
    return [p["sha"] for p in commit["parents"]]


def _hooks(gitea: Gitea) -> list[tuple[int, str]]:
    with gitea.admin() as admin:
        return [
            (h["id"], h["config"]["url"]) for h in admin.get(f"/repos/{CODE_REPO}/hooks").json()
        ]


# beside the real node's tests, on their worker: its own plane runs a real node too, and
# the worker of the session's plane is the suite's longest
@pytest.mark.xdist_group("real-node")
def test_make_up_brings_up_the_event_path_and_make_down_stops_it(tmp_path: Path) -> None:
    need_go()
    need_root()  # the real node: its network and mount namespaces, its cgroups
    folder = tmp_path / "live"
    # an earlier plane's secret files, readable by all: tightened, not kept so
    (folder / "gitea").mkdir(parents=True)
    for name in SECRET_FILES:
        (folder / name).write_text("an earlier plane's\n")
        (folder / name).chmod(0o644)
    up = _run(folder, "up")
    try:
        assert up.returncode == 0, up.stderr
        plane = ControlPlane.load(folder)
        gitea = Gitea.load(folder / "gitea")
        assert plane is not None and gitea is not None
        assert {name: _mode(folder / name) for name in SECRET_FILES} == dict.fromkeys(
            SECRET_FILES, "0o600"
        )
        # what a shell may eval (`eval "$(make up)"`): the rest went to stderr
        assert f"export KUBECONFIG={plane.kubeconfig}" in up.stdout.splitlines()
        assert [line for line in up.stdout.splitlines() if not line.startswith("#")] == [
            f"export KUBECONFIG={plane.kubeconfig}"
        ]
        found = re.search(r"takes Gitea's pushes at (\S+) \(the bearer token in (\S+)\)", up.stdout)
        assert found, up.stdout
        bearer = Path(found[2]).read_text()
        assert bearer not in up.stdout + up.stderr
        assert gitea.password not in up.stdout + up.stderr
        assert f"its admin {ADMIN} (the password in {gitea.password_file})" in up.stdout
        assert TLS_EOF_WARNING not in up.stderr
        assert {"argo-events-eventbus", "argo-events-eventsource", "argo-events-sensor"} <= set(
            plane.pids
        )
        # the applied NetworkPolicies are enforced, the outside world is there
        assert {"kube-network-policies", "world"} <= set(plane.pids)
        assert "enforced by kube-network-policies" in up.stdout
        ((_, hook_url),) = _hooks(gitea)
        assert hook_url == found[1]  # the EventSource this plane runs
        # the seed commit was built before `up` returned: the head is its write-back
        seeded = _head(gitea)
        (seed,) = _parents(seeded)
        assert f"the seed commit {seed[:12]} built and its digest written back" in up.stderr

        # a person clones the code repository and pushes at once, as `up` says: the push
        # is taken (no write-back lands under it), Gitea delivers it to the EventSource,
        # the Sensor makes its Workflow, whose write-back lands on it
        sha = _push_as_printed(up.stdout, tmp_path)
        cluster = Cluster(plane)
        try:
            path = f"{ARGO}/namespaces/fabrique-build/workflows/fabrique-citation-{sha[:12]}"
            cluster.wait("the push's Workflow", lambda: cluster.exists(path) or None)
            cluster.wait(
                f"the write-back of {sha[:12]} on main",
                lambda: _parents(_head(gitea)) == [sha] or None,
                timeout=300,
            )
        finally:
            cluster.http.close()

        # the README's tour: fabrique's own view of the plane, as a person asks for it
        status = subprocess.run(
            [sys.executable, "-m", "tests.live.controlplane", "fabrique", "status"],
            cwd=ROOT,
            env={**os.environ, "FABRIQUE_LIVE_DIR": str(folder)},
            capture_output=True,
            text=True,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        (row,) = [line for line in status.stdout.splitlines() if line.startswith("citation ")]
        assert row.split()[1:3] == ["ok", sha[:12]], status.stdout  # STATE, WANT

        # again: the same processes, the same lines, the same repository and hook
        hooks = _hooks(gitea)
        again = _run(folder, "up")
        assert again.returncode == 0, again.stderr
        assert again.stdout == up.stdout
        assert TLS_EOF_WARNING not in again.stderr
        reloaded = ControlPlane.load(folder)
        assert reloaded is not None and reloaded.pids == plane.pids
        assert _hooks(gitea) == hooks
        assert _parents(_head(gitea)) == [sha]  # the push's write-back, and nothing since
    finally:
        # what runs, recorded before `down`, which deletes the state files
        running = Gitea.load(folder / "gitea")
        down = _run(folder, "down")
    assert down.returncode == 0, down.stderr
    assert all(_exited(pid) is not None for pid in plane.pids.values())
    assert running is not None and running.pid == gitea.pid
    assert _exited(gitea.pid) is not None, f"gitea web ({gitea.pid}) still runs after down"

    # up again, over what the first plane left in the folder
    up = _run(folder, "up")
    try:
        assert up.returncode == 0, up.stderr
    finally:
        down = _run(folder, "down")
    assert down.returncode == 0, down.stderr


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
