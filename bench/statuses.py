"""Commit statuses on one commit built for every app: the requests of reading them.

    python bench/statuses.py [--apps 1000] [--files 50] [--json]

One push that touches every app builds every app on the same commit, and each build
posts its own context ``fabrique/<app>`` there: pending, then success. Gitea answers
at most 50 items a page ([api] MAX_RESPONSE_ITEMS), so reading an app's latest status
past 50 apps takes more than one page. Two ways to read them, side by side:

- ``combined``: the pages of the combined status (``GET …/commits/{sha}/status``), the
  latest status of each context, the most recently updated first; a report reads no
  further than its own context, a reconcile pass reads the commit's pages once. This is
  the client fabrique ships.
- ``listing``: the pages of every status posted (``GET …/commits/{sha}/statuses``,
  ``sort=leastindex``, newest first: Gitea's default order, by the second a status was
  created, leaves ties unordered), the first of each context being its latest; read no
  further than needed, the same way. The same CLI, with the client's page reader swapped
  for this one (``--cli listing``).

Measured through what users run, each a ``fabrique`` process of its own, on a commit
holding every app's pending and success (``apps`` contexts, twice as many statuses):

- ``report, newest context``: ``fabrique status-report success`` replayed for the app
  that reported last (unchanged: nothing posted);
- ``report, oldest context``: the same for the app that reported first;
- ``report, no context yet``: ``fabrique status-report pending`` for an app that has not
  reported (every page read, then the post);
- ``reconcile pass``: ``fabrique reconcile`` with no memory, every app wanting that
  commit and deployed at it: each app's status read (all success: nothing posted).

Requests are counted where they arrive (the Gitea double), split into the status reads
and the rest. Figures only: no pass/fail.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.reconcile_scale import _data, _fast_import, app_values, pin_commit  # noqa: E402
from fabrique.clients.gitea import (  # noqa: E402
    STATUS_PAGE,
    CommitStatus,
    GiteaClient,
    GiteaError,
    commit_statuses,
    last_status_page,
)
from fabrique.site.config import default_values, merge  # noqa: E402
from fabrique.validate import GITEA_SWAGGER, find_specs  # noqa: E402
from tests.doubles.gitea import GiteaDouble  # noqa: E402
from tests.doubles.kube import KubeApiDouble  # noqa: E402
from tests.doubles.swagger import Swagger  # noqa: E402

TOKEN = "bench-token"
REGISTRY = "registry:80"  # never asked: every app is deployed at its want
WAYS = ("combined", "listing")


def listing_pages(self: GiteaClient, repo: str, sha: str) -> Iterator[list[CommitStatus]]:
    """Every status posted on ``sha``, newest first, a page at a time (the ``listing``
    way): the first of each context on the way is its latest."""
    what = f"statuses of {repo}@{sha[:12]}"
    page = 1
    while True:
        params = {"limit": str(STATUS_PAGE), "page": str(page), "sort": "leastindex"}
        response = self.request("GET", f"/repos/{repo}/commits/{sha}/statuses", params=params)
        items = self._check(response, what)
        if not isinstance(items, list):
            raise GiteaError(f"{what}: Gitea answered something that is not a list")
        yield commit_statuses(items, what)
        if last_status_page(response, page, len(items)):
            return
        page += 1


def one_commit_repo(bare: Path, apps: int, files: int) -> str:
    """One commit that changes every app, then one that deploys every app at it: the
    commit's sha."""
    bare.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    stream = [
        b"commit refs/heads/main\n",
        b"committer bench <b@example.invalid> 1700000000 +0000\n",
    ]
    _data(stream, b"every app")
    for i in range(apps):
        stream.append(b"M 100644 inline apps/app-%04d/src.txt\n" % i)
        _data(stream, b"app %d\n" % i)
    _fast_import(bare, stream)
    want = subprocess.run(
        ["git", "-C", str(bare), "rev-parse", "main"], capture_output=True, text=True, check=True
    ).stdout.strip()
    pin_commit(bare, {f"app-{i:04d}": want for i in range(apps)}, files, REGISTRY, 1_700_000_001)
    return want


class Bench:
    """The double, the site and the CLI, for one way of reading."""

    def __init__(self, work: Path, apps: int, files: int, way: str) -> None:
        specs = find_specs()
        self.apps, self.way = apps, way
        bare = work / way / "atlas" / "atlas.git"
        self.want = one_commit_repo(bare, apps + 1, files)
        self.gitea = GiteaDouble(Swagger(specs / GITEA_SWAGGER), {"atlas/atlas": bare}, token=TOKEN)
        self.gitea.start()
        self.kube = KubeApiDouble(specs).start()
        values = merge(
            default_values(),
            {
                "gitea": {"url": self.gitea.url},
                "registry": {"host": REGISTRY},
                "network": {"backoffSeconds": 0.01},
                "apps": app_values(apps + 1, files),  # the last one never reports
            },
        )
        self.values = work / way / "values.yaml"
        self.values.write_text(json.dumps(values))
        self.kubeconfig = self.kube.kubeconfig(work / way / "kubeconfig")

    def stop(self) -> None:
        self.gitea.stop()
        self.kube.stop()

    def fill(self) -> None:
        """Every app but the last posts pending, then every one success, as the builds of
        one push do (pending at their start, success at their end)."""
        with GiteaClient(self.gitea.url, TOKEN) as client:
            for state in ("pending", "success"):
                for i in range(self.apps):
                    status = CommitStatus(f"fabrique/app-{i:04d}", state, self._said(i, state))
                    client.create_status("atlas/atlas", self.want, status)

    def _said(self, i: int, state: str) -> str:
        if state == "pending":
            return f"building app-{i:04d}:{self.want[:12]}"
        return f"deployed sha256:{f'{i % 256:02x}' * 32}; changed"

    def fabrique(self, *args: str) -> str:
        """``fabrique <args>`` in a process of its own, reading the ``way`` given."""
        command = [sys.executable, str(Path(__file__).resolve()), "--cli", self.way]
        command += ["--values", str(self.values), *args]
        env = {"FABRIQUE_GITEA_TOKEN": TOKEN, "KUBECONFIG": str(self.kubeconfig), "PATH": ""}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"fabrique {args[0]} exited {done.returncode}: {done.stderr[-500:]}")
        return done.stdout

    def counted(self, *args: str) -> dict[str, Any]:
        before = len(self.gitea.requests)
        out = self.fabrique(*args)
        seen = self.gitea.requests[before:]
        reads = [r for r in seen if r.method == "GET" and r.path.endswith(("/status", "/statuses"))]
        return {"requests": len(seen), "status_reads": len(reads), "out": out.splitlines()[-1]}

    def report(self, i: int, kind: str) -> dict[str, Any]:
        extra = ["--digest", "sha256:" + f"{i % 256:02x}" * 32, "--outcome", "changed"]
        return self.counted(
            "status-report",
            kind,
            "--app",
            f"app-{i:04d}",
            "--revision",
            self.want,
            *(extra if kind == "success" else []),
        )


def measure(work: Path, apps: int, files: int) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for way in WAYS:
        bench = Bench(work, apps, files, way)
        try:
            bench.fill()
            found = {
                "report, newest context": bench.report(apps - 1, "success"),
                "report, oldest context": bench.report(0, "success"),
                "report, no context yet": bench.report(apps, "pending"),
                "reconcile pass": bench.counted("reconcile"),
            }
        finally:
            bench.stop()
        for name, figures in found.items():
            rows.setdefault(name, {"what": name})[way] = figures
    return list(rows.values())


def table(rows: list[dict[str, Any]], apps: int) -> str:
    lines = [
        f"Statuses on one commit built for {apps} apps ({apps} contexts, {2 * apps} statuses):"
        " Gitea requests of each command, status reads in parentheses",
        "",
        "| what was run | combined status (shipped) | every status (listing) |",
        "| --- | ---: | ---: |",
    ]
    for row in rows:
        cells = [f"{row[w]['requests']} ({row[w]['status_reads']})" for w in WAYS]
        lines.append(f"| {row['what']} | {' | '.join(cells)} |")
    return "\n".join(lines)


def cli(way: str, argv: list[str]) -> None:
    """Run the fabrique CLI, its status pages read the ``way`` given."""
    if way == "listing":
        GiteaClient.status_pages = listing_pages  # type: ignore[method-assign]
    from fabrique.cli import main

    sys.argv = ["fabrique", *argv]
    main()


def main() -> None:
    if sys.argv[1:2] == ["--cli"]:
        cli(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", type=int, default=1000)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-statuses-") as work:
        rows = measure(Path(work), args.apps, args.files)
    print(json.dumps(rows, indent=2) if args.json else table(rows, args.apps))


if __name__ == "__main__":
    main()
