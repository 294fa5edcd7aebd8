"""A reconcile pass at scale: requests and time against the apps and the target files.

A synthetic code repository holds one commit per app (the app's want) and ``files``
kustomizations under ``deploy/`` that pin every app at its want, as a converged platform
does. Against the Gitea and Kubernetes doubles, each with ``latency`` before every
answer, it measures four passes at the default concurrency:

- ``cold``: no memory (the first pass, or a lost ConfigMap): an app costs a listing;
- ``idle``: nothing changed since the last pass;
- ``moved``: new commits outside every app's context (a write-back, a README);
- ``one``: one app changed (its build submitted).

Requests are counted where they arrive (the doubles; the registry through its client).
``memory_mb`` is the peak resident size of a separate ``fabrique reconcile`` process run
against the same servers (a nothing-changed pass), the figure a pod's limit must cover.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import config as k8s_config

from fabrique.clients.gitea import GiteaClient, Identity
from fabrique.clients.kube import KubeClient
from fabrique.clients.registry import RegistryClient
from fabrique.decisions.memory import ConfigMapMemory
from fabrique.decisions.reconcile import Reconciler
from fabrique.decisions.writeback import GiteaTransport
from fabrique.site.config import default_values, merge, parse_site
from fabrique.validate import GITEA_SWAGGER
from tests.doubles.gitea import GiteaDouble
from tests.doubles.kube import KubeApiDouble
from tests.doubles.swagger import Swagger
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
        b"committer perf <perf@example.invalid> %d +0000\n" % (1_700_000_000 + apps),
    ]
    _data(stream, b"deploy")
    stream.append(b"from refs/heads/main^0\n")
    for path, images in sorted(groups.items()):
        stream.append(b"M 100644 inline %s\n" % path.encode())
        _data(stream, kustomization(images).encode())
    _fast_import(bare, stream)
    return wants


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
    memory: bool = False,
) -> dict[str, Any]:
    tag = f"{apps}-{files}-{latency_ms:g}"
    bare = Path(tempfile.mkdtemp(prefix=f"scale-{tag}-", dir=work)) / "atlas" / "atlas.git"
    converged_repo(bare, apps, files, registry_host)
    out: dict[str, Any] = {"apps": apps, "files": files, "latency_ms": latency_ms}
    gitea = GiteaDouble(Swagger(specs / GITEA_SWAGGER), {"atlas/atlas": bare}, token=TOKEN).start()
    kube = KubeApiDouble(specs).start()
    gitea.latency = kube.latency = latency_ms / 1000
    kubeconfig = kube.kubeconfig(bare.parent.parent / "kubeconfig")
    try:
        values = merge(
            default_values(),
            {
                "gitea": {"url": gitea.url},
                "registry": {"host": registry_host},
                "network": {"backoffSeconds": 0.01},
                "apps": app_values(apps, files),
            },
        )
        site = parse_site(values)
        out["concurrency"] = site.reconcile.concurrency
        api = KubeClient(k8s_config.new_client_from_config(config_file=str(kubeconfig)))
        with (
            GiteaClient(gitea.url, TOKEN) as client,
            RegistryClient(registry_host, plain_http=True) as reg,
        ):
            transport = GiteaTransport(client, Identity("perf", "perf@example.invalid"))
            reconciler = Reconciler(
                site, transport, reg, api, ConfigMapMemory(api, site.namespaces.control)
            )

            def run(label: str, expect: dict[str, int]) -> None:
                before = len(gitea.requests) + len(kube.requests) + len(registry_requests)
                start = time.perf_counter()
                results = reconciler.run(list(site.apps), "act")
                elapsed = time.perf_counter() - start
                requests = len(gitea.requests) + len(kube.requests) + len(registry_requests)
                requests -= before
                states: dict[str, int] = {}
                for r in results:
                    states[r.state] = states.get(r.state, 0) + 1
                assert states == expect, (
                    label,
                    states,
                    [r for r in results if r.state != "ok"][:2],
                )
                out[f"{label}_s"] = round(elapsed, 3)
                out[f"{label}_requests"] = requests
                out[f"{label}_requests_per_app"] = round(requests / apps, 3)

            run("cold", {"ok": apps})
            run("idle", {"ok": apps})
            commit_file(bare, "README.md", "elsewhere\n", 1)
            run("moved", {"ok": apps})
            commit_file(bare, "apps/app-0000/src.txt", "v2\n", 2)
            run("one", {"ok": apps - 1, "submitted": 1} if apps > 1 else {"submitted": 1})
            if memory:
                out["memory_mb"] = _peak_rss_mb(work, tag, values, kubeconfig)
    finally:
        gitea.stop()
        kube.stop()
    return out


def _peak_rss_mb(work: Path, tag: str, values: dict[str, Any], kubeconfig: Path) -> float:
    """The peak resident size of ``fabrique reconcile`` in a process of its own.

    Read as the process's VmHWM, polled until it exits: the rusage of a child counts the
    copy of this (large) process it was forked from, before its exec."""
    path = Path(tempfile.mkdtemp(prefix=f"values-{tag}-", dir=work)) / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "FABRIQUE_GITEA_TOKEN": TOKEN}
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "fabrique"), "--values", str(path), "reconcile"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    status = Path(f"/proc/{process.pid}/status")
    peak_kib = 0
    while process.poll() is None:
        try:
            lines = status.read_text().splitlines()
        except OSError:  # exited between the poll and the read
            break
        for line in lines:
            if line.startswith("VmHWM:"):
                peak_kib = int(line.split()[1])  # the last one read: after the exec
        time.sleep(0.01)
    stderr = process.stderr.read().decode() if process.stderr else ""
    if process.wait() != 0:
        raise RuntimeError(f"fabrique reconcile exited {process.returncode}: {stderr[-500:]}")
    return round(peak_kib / 1024, 1)
