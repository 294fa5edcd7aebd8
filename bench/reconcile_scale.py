"""A reconcile pass at scale: requests and time against the apps and the target files.

A synthetic code repository holds one commit per app (the app's want) and ``files``
kustomizations under ``deploy/`` that pin every app at its want, as a converged platform
does. Against the Gitea and Kubernetes doubles, each with ``latency`` before every
answer, it measures four passes at the default concurrency:

- ``cold``: no memory (the first pass, or a lost ConfigMap): an app costs a listing;
- ``idle``: nothing changed since the last pass;
- ``moved``: new commits outside every app's context (a write-back, a README);
- ``one``: one app changed (its build submitted).

Every pass is ``fabrique reconcile`` in a process of its own, as the CronWorkflow runs it
(with its commit statuses reported): its time includes the start-up. Requests are counted
where they arrive (the doubles; the registry through a counting proxy). ``memory_mb`` is
the peak resident size of the nothing-changed pass, the figure a pod's limit must cover.
"""

from __future__ import annotations

import base64
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fabrique.site.config import default_values, merge, parse_site
from fabrique.validate import GITEA_SWAGGER
from tests.doubles.gitea import GiteaDouble
from tests.doubles.kube import KubeApiDouble
from tests.doubles.proxy import FaultProxy
from tests.doubles.swagger import Swagger
from tests.live.gitea import ADMIN, Gitea
from tests.payloads import kustomization

TOKEN = "perf-token"


def target(i: int, files: int) -> str:
    return f"deploy/group-{i % files:03d}/kustomization.yaml"


def app_values(apps: int, files: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"app-{i:04d}",
            "image": f"app-{i:04d}",
            "context": f"apps/app-{i:04d}",
            "writeback": {"repo": "atlas/atlas", "path": target(i, files)},
        }
        for i in range(apps)
    ]


def _fast_import(bare: Path, stream: list[bytes]) -> None:
    subprocess.run(
        ["git", "-C", str(bare), "fast-import", "--quiet"], input=b"".join(stream), check=True
    )


def _data(stream: list[bytes], payload: bytes) -> None:
    stream.append(b"data %d\n" % len(payload))
    stream.append(payload + b"\n")


def converged_repo(bare: Path, apps: int, files: int, registry: str) -> dict[str, str]:
    """One commit per app, then one commit pinning every app at it; the wants by app."""
    bare.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    stream: list[bytes] = []
    for i in range(apps):
        stream.append(b"commit refs/heads/main\n")
        stream.append(b"committer perf <perf@example.invalid> %d +0000\n" % (1_700_000_000 + i))
        _data(stream, b"app %d" % i)
        stream.append(b"M 100644 inline apps/app-%04d/src.txt\n" % i)
        _data(stream, b"app %d\n" % i)
    _fast_import(bare, stream)
    shas = subprocess.run(
        ["git", "-C", str(bare), "rev-list", "--reverse", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    wants = {f"app-{i:04d}": shas[i] for i in range(apps)}
    pin_commit(bare, wants, files, registry, 1_700_000_000 + apps)
    return wants


def pin_commit(bare: Path, wants: dict[str, str], files: int, registry: str, when: int) -> None:
    """One commit on top of ``main`` whose kustomizations pin every app at its want."""
    groups: dict[str, list[dict[str, str]]] = {}
    for i, (app, want) in enumerate(wants.items()):
        groups.setdefault(target(i, files), []).append(
            {
                "name": app,
                "newName": f"{registry}/{app}",
                "newTag": want[:12],
                "digest": "sha256:" + f"{i % 256:02x}" * 32,
            }
        )
    stream = [
        b"commit refs/heads/main\n",
        b"committer perf <perf@example.invalid> %d +0000\n" % when,
    ]
    _data(stream, b"deploy")
    stream.append(b"from refs/heads/main^0\n")
    for path, images in sorted(groups.items()):
        stream.append(b"M 100644 inline %s\n" % path.encode())
        _data(stream, kustomization(images).encode())
    _fast_import(bare, stream)


def commit_file(bare: Path, path: str, text: str, n: int) -> None:
    stream = [
        b"commit refs/heads/main\n",
        b"committer perf <perf@example.invalid> %d +0000\n" % (1_800_000_000 + n),
    ]
    _data(stream, b"change %d" % n)
    stream.append(b"from refs/heads/main^0\n")
    stream.append(b"M 100644 inline %s\n" % path.encode())
    _data(stream, text.encode())
    _fast_import(bare, stream)


def measure(
    work: Path,
    specs: Path,
    registry_host: str,
    registry_requests: list[str],
    apps: int,
    files: int,
    latency_ms: float,
    *,
    real: Gitea | None = None,
) -> dict[str, Any]:
    """The four passes against the Gitea double, or against ``real``, a real Gitea (its
    own answers' time: ``latency_ms`` is then the Kubernetes double's only). ``*_cpu_s``
    is the Gitea side's CPU time during the pass (the double's: this process's)."""
    tag = f"{'real' if real else 'double'}-{apps}-{files}-{latency_ms:g}"
    bare = Path(tempfile.mkdtemp(prefix=f"scale-{tag}-", dir=work)) / "atlas" / "atlas.git"
    converged_repo(bare, apps, files, registry_host)
    out: dict[str, Any] = {
        "server": "gitea" if real else "double",
        "apps": apps,
        "files": files,
        "latency_ms": latency_ms,
    }
    kube = KubeApiDouble(specs).start()
    kube.latency = latency_ms / 1000
    kubeconfig = kube.kubeconfig(bare.parent.parent / "kubeconfig")
    # the double runs in this process: its CPU is this process's, the passes' taken out
    served = (
        RealServer(real, bare)
        if real
        else DoubleServer(specs, bare, latency_ms, cli_cpu=lambda: cli.cpu_s)
    )
    try:
        values = merge(
            default_values(),
            {
                "gitea": {"url": served.url},
                "registry": {"host": registry_host},
                "network": {"backoffSeconds": 0.01},
                "apps": app_values(apps, files),
            },
        )
        out["concurrency"] = parse_site(values).reconcile.concurrency
        cli = Cli(work, tag, values, kubeconfig, served.token)

        def run(label: str, expect: dict[str, int]) -> None:
            served.sync()
            before = served.requests() + len(kube.requests) + len(registry_requests)
            cpu = served.cpu()
            elapsed, peak_mb, states = cli.reconcile()
            out[f"{label}_cpu_s"] = round(served.cpu() - cpu, 2)
            requests = served.requests() + len(kube.requests) + len(registry_requests)
            requests -= before
            assert states == expect, (label, states)
            out[f"{label}_s"] = round(elapsed, 3)
            out[f"{label}_requests"] = requests
            out[f"{label}_requests_per_app"] = round(requests / apps, 3)
            if label == "idle":
                out["memory_mb"] = peak_mb

        run("cold", {"ok": apps})
        run("idle", {"ok": apps})
        commit_file(bare, "README.md", "elsewhere\n", 1)
        run("moved", {"ok": apps})
        commit_file(bare, "apps/app-0000/src.txt", "v2\n", 2)
        run("one", {"ok": apps - 1, "submitted": 1} if apps > 1 else {"submitted": 1})
    finally:
        served.stop()
        kube.stop()
    return out


class DoubleServer:
    """The Gitea double over the synthetic repository."""

    token = TOKEN

    def __init__(
        self, specs: Path, bare: Path, latency_ms: float, cli_cpu: Callable[[], float]
    ) -> None:
        self.gitea = GiteaDouble(Swagger(specs / GITEA_SWAGGER), {"atlas/atlas": bare}, token=TOKEN)
        self.gitea.latency = latency_ms / 1000
        self.gitea.start()
        self.url = self.gitea.url
        self.cli_cpu = cli_cpu

    def sync(self) -> None:
        """Nothing to do: the double reads the repository itself."""

    def requests(self) -> int:
        return len(self.gitea.requests)

    def cpu(self) -> float:
        """The double's CPU time: this process's (the double's threads, and the registry's
        proxy) and its children's (the ``git`` commands the double runs), without the
        ``fabrique`` processes the bench runs, which are children too."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
        return total - self.cli_cpu()

    def stop(self) -> None:
        self.gitea.stop()


class RealServer:
    """A real Gitea holding the synthetic repository as ``atlas/atlas`` (made again from
    the bare one, pushed over HTTP), its requests counted by a proxy in front of it."""

    def __init__(self, gitea: Gitea, bare: Path) -> None:
        self.gitea, self.bare = gitea, bare
        self.token = gitea.token
        gitea.organization("atlas")  # owned by the token's user
        with gitea.admin() as admin:
            admin.delete("/repos/atlas/atlas")
            admin.post("/orgs/atlas/repos", json={"name": "atlas"}).raise_for_status()
        self.seen: list[str] = []
        self.proxy = FaultProxy(gitea.url, lambda method, path, headers: self.seen.append(path))
        self.proxy.start()
        self.url = f"http://{self.proxy.host}"

    def sync(self) -> None:
        """Push what the bench committed to the bare repository."""
        basic = base64.b64encode(f"{ADMIN}:{self.gitea.password}".encode()).decode()
        subprocess.run(
            [
                "git",
                "-C",
                str(self.bare),
                "-c",
                f"http.extraHeader=Authorization: Basic {basic}",
                "push",
                "-q",
                "--force",
                f"{self.gitea.url}/atlas/atlas.git",
                "main",
            ],
            check=True,
        )

    def requests(self) -> int:
        return len(self.seen)

    def cpu(self) -> float:
        """The CPU time of the ``gitea web`` process and of the children it has waited
        for, its ``git`` commands (utime, stime, cutime and cstime of /proc/PID/stat)."""
        fields = Path(f"/proc/{self.gitea.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proxy.stop()


class Cli:
    """``fabrique reconcile`` as the CronWorkflow runs it: a process of its own, its
    statuses reported, the values in a file and the token in the environment."""

    def __init__(
        self,
        work: Path,
        tag: str,
        values: dict[str, Any],
        kubeconfig: Path,
        token: str = TOKEN,
    ) -> None:
        self.values = Path(tempfile.mkdtemp(prefix=f"values-{tag}-", dir=work)) / "values.yaml"
        self.values.write_text(yaml.safe_dump(values))
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "FABRIQUE_GITEA_TOKEN": token}
        self.cpu_s = 0.0  # the CPU time of the passes run so far

    def run(self, *args: str) -> str:
        """``fabrique <args>``: what it printed; an exit other than 0 raises."""
        done = subprocess.run(
            [str(Path(sys.executable).parent / "fabrique"), "--values", str(self.values), *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"fabrique {args[0]} exited {done.returncode}: {done.stderr[-500:]!r}"
            )
        return done.stdout

    def reconcile(self) -> tuple[float, float, dict[str, int]]:
        """One pass: its wall time (the process's, start-up included), its peak resident
        size in MB and how many apps got each decision.

        The size is the process's VmHWM, polled until it exits: the rusage of a child
        counts the copy of this (large) process it was forked from, before its exec."""
        # its output goes to files: a pipe that nobody reads while it runs fills up with
        # one line per app and stops it, waiting for the reader
        out = tempfile.TemporaryFile()
        err = tempfile.TemporaryFile()
        start = time.perf_counter()
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "fabrique"),
                "--values",
                str(self.values),
                "reconcile",
            ],
            env=self.env,
            stdout=out,
            stderr=err,
        )
        status = Path(f"/proc/{process.pid}/status")
        peak_kib = 0
        while True:
            # wait4, not poll: it reaps the process with its own CPU time (cpu_s)
            pid, code, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                process.returncode = os.waitstatus_to_exitcode(code)
                self.cpu_s += usage.ru_utime + usage.ru_stime
                break
            try:
                lines = status.read_text().splitlines()
            except OSError:  # exited between the wait and the read
                continue
            for line in lines:
                if line.startswith("VmHWM:"):
                    peak_kib = int(line.split()[1])  # the last one read: after the exec
            time.sleep(0.01)
        elapsed = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        out.close()
        err.close()
        if process.returncode != 0:
            raise RuntimeError(f"fabrique reconcile exited {process.returncode}: {stderr[-500:]!r}")
        states: dict[str, int] = {}
        for line in stdout.decode().splitlines()[:-1]:  # the last line is the summary
            state = line.split(": ", 2)[1]
            states[state] = states.get(state, 0) + 1
        return elapsed, round(peak_kib / 1024, 1), states
