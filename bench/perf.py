"""Performance figures, measured side by side in one run on this machine.

    python bench/perf.py [--commits 1000,10000,50000] [--size-mb 200] [--apps 200]
                         [--latency-ms 0,10] [--json]

1. Render of the whole tree for 1, 50 and 200 apps: wall time, peak memory.
2. Write-back cost against repository size, on synthetic repositories (N commits and
   about SIZE MB of data): the Contents API through the Gitea double, the git transport
   (shallow single-branch fetch), and the baseline of clone-based image updaters (a full
   ``git clone``, commit and push). Time, bytes moved, and ratios against the baseline.
3. A reconcile pass over N apps against the real registry, the Gitea double and the
   Kubernetes double: wall time and requests per app, at concurrency 1 and the default.
4. The time of ``fabrique writeback``, as the build step runs it: a process of its own,
   from its start (start-up included) to its commit landed. No build, no event.
5. HTTP requests of one write-back that changes something, and of one that does not.
6. With the passes at scale (``--only scale``): the CLI's start-up, ``fabrique --version``
   in a process of its own (median and max of 5).

Each figure of 2 and 3 is taken at every ``--latency-ms``: the Gitea and Kubernetes
doubles then wait that long before every answer, as servers across a cluster network do,
so that the number of requests shows up in time. Requests are counted on the doubles'
side.

Figures only: no pass/fail. See bench/RESULTS.md for the targets.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.reconcile_scale import Cli  # noqa: E402
from bench.reconcile_scale import measure as scale_measure  # noqa: E402
from bench.render import measure as measure_render  # noqa: E402
from fabrique.clients.gitea import GiteaClient, Identity  # noqa: E402
from fabrique.clients.registry import RegistryClient  # noqa: E402
from fabrique.decisions.changes import fabrique_paths  # noqa: E402
from fabrique.decisions.writeback import GiteaTransport, GitTransport, write_back  # noqa: E402
from fabrique.site.config import default_values, merge, parse_site  # noqa: E402
from fabrique.validate import GITEA_SWAGGER, find_specs  # noqa: E402
from tests import servers  # noqa: E402
from tests.doubles.delay import DelayProxy  # noqa: E402
from tests.doubles.gitea import GiteaDouble  # noqa: E402
from tests.doubles.kube import KubeApiDouble  # noqa: E402
from tests.doubles.proxy import FaultProxy  # noqa: E402
from tests.doubles.swagger import Swagger  # noqa: E402
from tests.oci import push_image  # noqa: E402

TOKEN = "perf-token"
TARGET = "apps/app-000/deploy/kustomization.yaml"
CLI_WRITEBACKS = 10  # write-backs timed through the CLI (about a second each)


class Counting(httpx.BaseTransport):
    """Counts requests and the bytes of their bodies, both ways."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests = 0
        self.bytes = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        self.bytes += len(request.content)
        response = self.inner.handle_request(request)
        response.read()
        self.bytes += len(response.content)
        return response


def synthetic_repo(bare: Path, commits: int, size_mb: int, apps: int) -> None:
    """A bare repo: ``commits`` commits, about ``size_mb`` MB of incompressible data, made
    with git fast-import (fast enough for 50k commits)."""
    bare.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    lines: list[bytes] = []

    def data(payload: bytes) -> None:
        lines.append(b"data %d\n" % len(payload))
        lines.append(payload + b"\n")

    blobs = max(1, size_mb)
    for mark in range(1, blobs + 1):
        lines.append(b"blob\nmark :%d\n" % mark)
        data(os.urandom(1024 * 1024))  # incompressible: the repository really is this big
    for n in range(commits):
        lines.append(b"commit refs/heads/main\n")
        lines.append(b"committer perf <perf@example.invalid> %d +0000\n" % (1_700_000_000 + n))
        data(b"commit %d" % n)
        if n == 0:
            for mark in range(1, blobs + 1):
                lines.append(b"M 100644 :%d data/blob-%04d.bin\n" % (mark, mark))
            for app in range(apps):
                kustomization = b"kind: Kustomization\nresources: []\n"
                lines.append(b"M 100644 inline apps/app-%03d/deploy/kustomization.yaml\n" % app)
                data(kustomization)
        lines.append(b"M 100644 inline apps/app-%03d/src.txt\n" % (n % max(1, apps)))
        data(b"change %d\n" % n)
    subprocess.run(
        ["git", "-C", str(bare), "fast-import", "--quiet"], input=b"".join(lines), check=True
    )


def site_for(gitea_url: str, registry: str, apps: int, **extra: Any) -> Any:
    values = merge(
        default_values(),
        {
            "gitea": {"url": gitea_url},
            "registry": {"host": registry},
            "network": {"backoffSeconds": 0.01},
            "apps": [
                {
                    "name": f"app-{i:03d}",
                    "image": f"app-{i:03d}",
                    "context": f"apps/app-{i:03d}",
                    "writeback": {
                        "repo": "atlas/atlas",
                        "path": f"apps/app-{i:03d}/deploy/kustomization.yaml",
                    },
                }
                for i in range(apps)
            ],
            **extra,
        },
    )
    return parse_site(values)


def head(bare: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(bare), "rev-parse", "main"], capture_output=True, text=True, check=True
    ).stdout.strip()


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def writeback_cost(
    work: Path, bare: Path, commits: int, specs: Path, latency_ms: float
) -> dict[str, Any]:
    """The three ways to write one pin into ``bare`` (made by synthetic_repo), at one
    latency. Each call writes digests of its own, so that each write really changes."""
    revision = head(bare)
    digest = "sha256:" + hashlib.sha256(b"api %g" % latency_ms).hexdigest()
    out: dict[str, Any] = {
        "commits": commits,
        "latency_ms": latency_ms,
        "repo_mb": round(du(bare) / 1e6, 1),
    }
    gitea = GiteaDouble(Swagger(specs / GITEA_SWAGGER), {"atlas/atlas": bare}, token=TOKEN).start()
    gitea.latency = latency_ms / 1000
    try:
        site = site_for(gitea.url, "registry:80", 1)
        counting = Counting()
        with GiteaClient(gitea.url, TOKEN, transport=counting) as client:
            start = time.perf_counter()
            write_back(
                site,
                GiteaTransport(client, Identity("perf", "perf@example.invalid")),
                "app-000",
                revision,
                digest,
            )
            out["contents_api_s"] = time.perf_counter() - start
            out["contents_api_bytes"] = counting.bytes
            out["contents_api_requests"] = len(gitea.requests)
    finally:
        gitea.stop()
    with servers.git_daemon(bare.parent.parent) as daemon:
        # the same round-trip time in front of the git daemon as in front of the double
        proxy = DelayProxy(daemon.port, latency_ms / 1000).start()
        git_url = f"git://127.0.0.1:{proxy.port}"
        git_site = site_for(
            "http://unused.invalid",
            "registry:80",
            1,
            writeback={"transport": "git", "gitUrl": git_url},
        )
        scratch = work / f"git-{commits}-{latency_ms:g}"
        start = time.perf_counter()
        write_back(
            git_site,
            GitTransport(git_site, scratch, None),
            "app-000",
            revision,
            "sha256:" + hashlib.sha256(b"git %g" % latency_ms).hexdigest(),
        )
        out["git_shallow_s"] = time.perf_counter() - start
        out["git_shallow_bytes"] = du(scratch)
        clone = work / f"clone-{commits}-{latency_ms:g}"
        start = time.perf_counter()
        subprocess.run(["git", "clone", "-q", f"{git_url}/atlas/atlas.git", str(clone)], check=True)
        target = clone / TARGET
        target.write_text(target.read_text() + "# baseline\n")
        subprocess.run(
            [
                "git",
                "-C",
                str(clone),
                "-c",
                "user.name=b",
                "-c",
                "user.email=b@x",
                "commit",
                "-qam",
                "b",
            ],
            check=True,
        )
        subprocess.run(["git", "-C", str(clone), "push", "-q", "origin", "HEAD:main"], check=True)
        out["full_clone_s"] = time.perf_counter() - start
        out["full_clone_bytes"] = du(clone / ".git")
        proxy.stop()
        shutil.rmtree(clone)
        shutil.rmtree(scratch)
    for method in ("contents_api", "git_shallow"):
        out[f"{method}_speedup"] = round(out["full_clone_s"] / out[f"{method}_s"], 1)
        out[f"{method}_bytes_ratio"] = round(
            out["full_clone_bytes"] / max(1, out[f"{method}_bytes"]), 1
        )
    return out


def reconcile_and_latency(work: Path, apps: int, specs: Path, latency_ms: float) -> dict[str, Any]:
    """``apps`` apps pinned in a file each, written back one by one, then reconciled with
    no memory at concurrency 1 and the default. Write-backs and passes run the CLI, as
    the Workflow's step and the CronWorkflow do (start-up included); the write-backs past
    the first ``CLI_WRITEBACKS`` only deploy the rest, in process."""
    bare = work / f"srv-reconcile-{latency_ms:g}" / "atlas" / "atlas.git"
    synthetic_repo(bare, apps, 1, apps=apps)
    out: dict[str, Any] = {"apps": apps, "latency_ms": latency_ms}
    (work / f"registry-{latency_ms:g}").mkdir()
    seen: list[str] = []
    with servers.registry(work / f"registry-{latency_ms:g}") as registry:
        proxy = FaultProxy(registry.url, lambda method, path, headers: seen.append(path)).start()
        gitea = GiteaDouble(
            Swagger(specs / GITEA_SWAGGER), {"atlas/atlas": bare}, token=TOKEN
        ).start()
        kube = KubeApiDouble(specs).start()
        gitea.latency = kube.latency = latency_ms / 1000
        kubeconfig = kube.kubeconfig(work / f"kc-{latency_ms:g}")
        try:
            site = site_for(gitea.url, proxy.host, apps)
            values = site.to_values()
            cli = Cli(work, f"reconcile-{latency_ms:g}", values, kubeconfig)
            with GiteaClient(gitea.url, TOKEN) as client:
                transport = GiteaTransport(client, Identity("perf", "perf@example.invalid"))
                # deploy every app at its last change, as a converged platform is
                writebacks = []  # each `fabrique writeback`, from its start to its commit
                for index, app in enumerate(site.apps):
                    want = transport.last_change(
                        "atlas/atlas", "main", app.context, fabrique_paths(site)
                    )
                    assert want is not None
                    digest = push_image(registry.url, app.image, want[:12])
                    if index >= CLI_WRITEBACKS:
                        assert (
                            write_back(site, transport, app.name, want, digest).state == "changed"
                        )
                        continue
                    before = len(gitea.requests)
                    start = time.perf_counter()
                    said = cli.run(
                        "writeback", "--app", app.name, "--revision", want, "--digest", digest
                    )
                    writebacks.append(time.perf_counter() - start)
                    out.setdefault("writeback_changed_requests", len(gitea.requests) - before)
                    assert said.startswith("changed"), said
                out["writeback_cli_ms_median"] = round(statistics.median(writebacks) * 1000, 1)
                out["writeback_cli_ms_max"] = round(max(writebacks) * 1000, 1)
            for label, concurrency in (
                ("concurrency_1", 1),
                ("concurrency_default", site.reconcile.concurrency),
            ):
                kube.configmaps.clear()  # no memory: every app asked by path
                cli = Cli(
                    work,
                    f"reconcile-{label}-{latency_ms:g}",
                    merge(values, {"reconcile": {"concurrency": concurrency}}),
                    kubeconfig,
                )
                before = len(gitea.requests) + len(kube.requests) + len(seen)
                elapsed, _, states = cli.reconcile()
                requests = len(gitea.requests) + len(kube.requests) + len(seen)
                assert states == {"ok": apps}, states
                out[f"reconcile_{label}_s"] = round(elapsed, 2)
                out[f"reconcile_{label}_requests_per_app"] = round((requests - before) / apps, 2)
            out["reconcile_default_concurrency"] = site.reconcile.concurrency
            # a replay: the same digest again
            app = site.apps[0]
            want = head(bare)
            with GiteaClient(gitea.url, TOKEN) as client:
                want = (
                    GiteaTransport(client, Identity("perf", "perf@example.invalid")).last_change(
                        "atlas/atlas", "main", app.context, fabrique_paths(site)
                    )
                    or want
                )
            with RegistryClient(proxy.host, plain_http=True) as reg:
                digest = reg.manifest_digest(app.image, want[:12]).digest
            before = len(gitea.requests)
            said = cli.run("writeback", "--app", app.name, "--revision", want, "--digest", digest)
            assert said.startswith("unchanged"), said
            out["writeback_unchanged_requests"] = len(gitea.requests) - before
        finally:
            gitea.stop()
            kube.stop()
            proxy.stop()
    return out


SECTIONS = ("render", "writeback", "reconcile", "scale", "servers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render-apps", default="1,50,200")
    parser.add_argument("--commits", default="1000,10000,50000")
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--apps", type=int, default=200)
    parser.add_argument(
        "--latency-ms",
        default="0,10",
        help="per-request latency of the Gitea and Kubernetes doubles (and the git daemon)",
    )
    parser.add_argument(
        "--scale",
        default="200x50,1000x50",
        help="reconcile passes of APPSxFILES (apps over target files), at every latency",
    )
    parser.add_argument(
        "--curve",
        default="10,20,50,100,200,500,1000",
        help="apps of the requests curve ('' skips both curves)",
    )
    parser.add_argument("--curve-files", type=int, default=10, help="target files of the curve")
    parser.add_argument(
        "--files-curve", default="1,10,50,100,200", help="target files, at the curve's most apps"
    )
    parser.add_argument(
        "--real-gitea",
        default="200x50,1000x50",
        help="reconcile passes of APPSxFILES against a real Gitea beside the double ('' skips)",
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"the sections to measure, of {','.join(SECTIONS)} (the others print empty)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if only - set(SECTIONS):
        parser.error(f"--only {args.only}: unknown section(s) {sorted(only - set(SECTIONS))}")
    logging.basicConfig(level=logging.ERROR)
    specs = find_specs()
    report: dict[str, Any] = {name: [] for name in (*SECTIONS, "curve", "startup")}
    sizes = [int(n) for n in args.render_apps.split(",")] if "render" in only else []
    for apps in sizes:
        wall, peak = measure_render(apps, 3)
        report["render"].append(
            {"apps": apps, "wall_ms": round(wall * 1000, 1), "peak_kib": round(peak / 1024)}
        )
    with tempfile.TemporaryDirectory(prefix="fabrique-perf-") as tmp:
        work = Path(tmp)
        latencies = [float(n) for n in args.latency_ms.split(",")]
        for commits in (int(n) for n in args.commits.split(",") if "writeback" in only):
            bare = work / f"srv-{commits}" / "atlas" / "atlas.git"
            synthetic_repo(bare, commits, args.size_mb, apps=1)
            for latency in latencies:
                report["writeback"].append(writeback_cost(work, bare, commits, specs, latency))
        if "reconcile" in only:
            report["reconcile"] = [
                reconcile_and_latency(work, args.apps, specs, latency) for latency in latencies
            ]
        if "scale" in only:
            report["startup"] = [cli_startup()]
            report["scale"], report["curve"] = reconcile_at_scale(work, specs, args, latencies)
        if "servers" in only:
            report["servers"] = double_and_real_gitea(work, specs, args.real_gitea)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print("render            apps   wall ms   peak KiB")
    for row in report["render"]:
        print(f"                {row['apps']:>6}  {row['wall_ms']:>8}  {row['peak_kib']:>9}")
    print(
        "\nwrite-back  latency ms  commits  repo MB | contents API s / bytes | git shallow s / bytes | full clone s / bytes"
    )
    for row in report["writeback"]:
        print(
            f"{row['latency_ms']:>22g} {row['commits']:>8} {row['repo_mb']:>8} |"
            f" {row['contents_api_s']:>7.3f} / {row['contents_api_bytes']:>9} |"
            f" {row['git_shallow_s']:>7.3f} / {row['git_shallow_bytes']:>10} |"
            f" {row['full_clone_s']:>7.3f} / {row['full_clone_bytes']:>10}"
        )
    for row in report["reconcile"]:
        print()
        for key, value in row.items():
            print(f"{key.replace('_', ' '):<46} {value}")
    for row in report["startup"]:
        print(
            f"\nstart-up: fabrique --version, median / max of {row['runs']} processes:"
            f" {row['version_ms_median']} ms / {row['version_ms_max']} ms"
        )
    print("\nreconcile at scale (default concurrency): seconds / requests per pass")
    print("   apps  files  latency ms |       cold |       idle |      moved |        one | MB")
    for row in report["scale"]:
        cells = " | ".join(
            f"{row[f'{p}_s']:>5.2f} {row[f'{p}_requests']:>4}"
            for p in ("cold", "idle", "moved", "one")
        )
        print(
            f"{row['apps']:>7} {row['files']:>6} {row['latency_ms']:>11g} | {cells} |"
            f" {row.get('memory_mb', '-')}"
        )
    print()
    print("\n".join(chart(report["curve"])))
    print("\nthe Gitea double beside a real Gitea: seconds / requests / Gitea CPU s per pass")
    for row in report["servers"]:
        cells = " | ".join(
            f"{row[f'{p}_s']:>5.2f} {row[f'{p}_requests']:>4} {row[f'{p}_cpu_s']:>5.2f}"
            for p in ("cold", "idle", "moved", "one")
        )
        print(f"{row['server']:>7} {row['apps']:>6} {row['files']:>5} | {cells}")
    return 0


def reconcile_at_scale(
    work: Path, specs: Path, args: argparse.Namespace, latencies: list[float]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The passes of ``--scale`` at every latency, and the requests curves against the apps and against the files (first latency)."""
    scale = [tuple(int(n) for n in item.split("x")) for item in args.scale.split(",") if item]
    seen: list[str] = []
    (work / "registry-scale").mkdir()
    with servers.registry(work / "registry-scale") as registry:
        proxy = FaultProxy(registry.url, lambda method, path, headers: seen.append(path))
        proxy.start()
        try:
            rows = [
                scale_measure(work, specs, proxy.host, seen, apps, files, latency)
                for latency in latencies
                for apps, files in scale
            ]
            curve_apps = [int(n) for n in args.curve.split(",") if n]  # '' skips the curves
            curve = [
                scale_measure(
                    work, specs, proxy.host, seen, apps, min(apps, args.curve_files), latencies[0]
                )
                for apps in curve_apps
            ] + [
                scale_measure(work, specs, proxy.host, seen, max(curve_apps), files, latencies[0])
                for files in (int(n) for n in args.files_curve.split(",") if n and curve_apps)
                if files != args.curve_files
            ]
        finally:
            proxy.stop()
    return rows, curve


def cli_startup(runs: int = 5) -> dict[str, Any]:
    """The start-up every ``fabrique`` command pays: ``fabrique --version`` in a process
    of its own (the interpreter, the CLI's imports), its median and max over ``runs``."""
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            [str(Path(sys.executable).parent / "fabrique"), "--version"],
            capture_output=True,
            check=True,
        )
        walls.append(time.perf_counter() - start)
    return {
        "runs": runs,
        "version_ms_median": round(statistics.median(walls) * 1000, 1),
        "version_ms_max": round(max(walls) * 1000, 1),
    }


def double_and_real_gitea(work: Path, specs: Path, scale: str) -> list[dict[str, Any]]:
    """The passes of ``scale`` against the Gitea double, then against a real Gitea (the
    live tier's peer, built first if need be), the Kubernetes double with no latency."""
    sizes = [tuple(int(n) for n in item.split("x")) for item in scale.split(",") if item]
    if not sizes:
        return []
    from tests.live.gitea import Gitea
    from tests.live.gitea import binary as gitea_binary

    seen: list[str] = []
    (work / "registry-servers").mkdir()
    rows = []
    with servers.registry(work / "registry-servers") as registry:
        proxy = FaultProxy(registry.url, lambda method, path, headers: seen.append(path))
        proxy.start()
        (work / "gitea").mkdir()
        with contextlib.redirect_stdout(sys.stderr):  # build.py's notes: not into --json
            binary = gitea_binary()
        gitea = Gitea(work / "gitea", binary).start()
        try:
            for apps, files in sizes:
                rows.append(scale_measure(work, specs, proxy.host, seen, apps, files, 0))
                rows.append(
                    scale_measure(work, specs, proxy.host, seen, apps, files, 0, real=gitea)
                )
        finally:
            gitea.stop()
            proxy.stop()
    return rows


def chart(curve: list[dict[str, Any]], width: int = 56) -> list[str]:
    """Requests per pass against the apps (files fixed) and against the files (apps
    fixed), as bars: ``#`` a pass where nothing changed, ``.`` a pass without memory."""
    if not curve:
        return []
    top = max(row["cold_requests"] for row in curve)
    lines = ["requests per pass   # nothing changed (memory)   . no memory (first pass)"]
    by_apps = [r for r in curve if r["files"] == min(r["apps"], curve[0]["files"])]
    apps_max = max(r["apps"] for r in curve)
    by_files = sorted((r for r in curve if r["apps"] == apps_max), key=lambda r: r["files"])
    for title, rows, key in (
        (f"against the apps ({curve[0]['files']} target files at most)", by_apps, "apps"),
        (f"against the target files ({apps_max} apps)", by_files, "files"),
    ):
        lines.append(f"\n{title}")
        for row in rows:
            for series, mark in (("idle", "#"), ("cold", ".")):
                n = row[f"{series}_requests"]
                bar = mark * max(1, round(n / top * width))
                label = f"{key} {row[key]:>5}" if series == "idle" else " " * (len(key) + 6)
                lines.append(f"{label} |{bar} {n}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
