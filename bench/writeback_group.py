"""One push, one commit: a push's write-backs grouped beside one commit per app.

    python bench/writeback_group.py [--apps 1,20,200] [--concurrency 20]
                                    [--mode commit|pull-request] [--json]

A real Gitea (the live tier's peer: needs Go, ``make peers`` builds it) behind a proxy
that counts its API requests and holds them to Gitea's swagger. For each number of apps
N, two repositories seeded alike, one per variant: N apps ``app-000…``, each deployed
through ``deploy/<app>/kustomization.yaml`` (a kustomize-images target whose tag names
the previous push's commit, so that the never-roll-back guard resolves and compares it),
then a push touching every app's ``src/<app>/Dockerfile``. Its builds' digests are made
up (signing is off: no registry is asked). From the moment they exist:

- per app, as each build's pod writes when nothing groups them (``writeback.batch``
  off, as before it): ``fabrique writeback`` then ``fabrique status-report success``
  with its outcome and commit, each app's two in sequence, ``--concurrency`` apps at a
  time (a cluster's build slots). A write-back that exits non-zero is a failed app, its
  status not posted (its build's exit handler would: not played);
- grouped, as the push's write-back step does once its builds have ended: one
  ``fabrique writeback-group --from deploys.json`` (the step's wait, a list of the
  builds once a second, is not in it).

Every command is a process of its own. For each: the time from the digests to the last
process's end (every digest written, every status posted), the commits made on the
branch, the Gitea API requests (those of the write-back, and those of the commit
statuses apart), the apps whose write-back failed, whether every digest is in its file
afterwards (read back from Gitea), and the CPU time Gitea and the fabrique processes
spent (the machine's cores are shared by both, where a cluster's build pods would not
share Gitea's). With ``--mode pull-request`` the apps take pull requests: per app, one
pull request each (``<prefix><app>``); grouped, one for the push
(``<prefix>push.<commit12>.main``); the pull requests opened are counted, and each
digest is read back from the branch that proposes it. Figures only: no pass/fail. See
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, redirect_stdout
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.writeback_modes import FABRIQUE, real_gitea  # noqa: E402
from fabrique.site.names import workflow_name  # noqa: E402
from tests.doubles.proxy import SpecProxy  # noqa: E402
from tests.live.gitea import Gitea  # noqa: E402

VARIANTS = ("per-app", "grouped")
MODES = ("commit", "pull-request")
BRANCH = "main"
PREFIX = "fabrique/"  # the default writeback.pullRequest.branchPrefix
TIMES = "\u00d7"  # a ratio's sign
# a commit status is posted to …/statuses/{sha} and read from …/commits/{ref}/status(es)
STATUS_PATH = re.compile(r"/status(?:es)?(?:/|$)")
# writeback-group's line of an app: "changed: app-000 …", "failed: app-001: …"
SAID = re.compile(r"^(?P<state>[a-z][a-z -]*): (?P<app>app-\d{3})\b", re.M)
TARGET = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
images:
  - name: {app}
    newTag: {tag}
"""


def names(n: int) -> list[str]:
    return [f"app-{i:03d}" for i in range(n)]


def target(app: str) -> str:
    return f"deploy/{app}/kustomization.yaml"


def dockerfile(app: str) -> str:
    return f"src/{app}/Dockerfile"


def digest(app: str) -> str:
    """A well-formed digest of the push's build of ``app``, the same in both variants."""
    return "sha256:" + hashlib.sha256(f"push {app}".encode()).hexdigest()


def site_values(slug: str, apps: list[str], api_url: str, mode: str = "commit") -> dict[str, Any]:
    """The values of one variant: ``apps`` written into ``slug``, also the code
    repository (where the never-roll-back guard resolves the deployed tags), the API
    reached through the counting proxy at ``api_url``, in writeback ``mode``."""
    return {
        "gitea": {"url": api_url, "codeRepo": slug},
        "writeback": {"mode": mode},
        "apps": [
            {
                "name": app,
                "image": app,
                "context": f"src/{app}",
                "writeback": {"kind": "kustomize-images", "repo": slug, "path": target(app)},
            }
            for app in apps
        ],
    }


def deploys(apps: list[str], revision: str) -> list[dict[str, str]]:
    """``writeback-group --from``'s list: each build of the push and its digest."""
    return [
        {
            "app": app,
            "revision": revision,
            "digest": digest(app),
            "workflow": workflow_name(app, revision),
        }
        for app in apps
    ]


def split_requests(requests: list[str]) -> tuple[int, int]:
    """The write-back's requests (everything but commit statuses) and the statuses'."""
    statuses = sum(1 for r in requests if STATUS_PATH.search(r.split(" ", 1)[1]))
    return len(requests) - statuses, statuses


def seed(gitea: Gitea, slug: str, apps: list[str]) -> str:
    """The repository ``slug`` with ``apps`` deployed at a previous push's commit, then
    a push touching all of them (each a commit of Gitea's ChangeFiles); the push's id."""
    gitea.repository(slug, BRANCH)
    previous = gitea.commit(
        slug, BRANCH, {dockerfile(a): "FROM scratch\n" for a in apps}, "the apps"
    )
    # what the previous push's write-back wrote: every app at its commit
    tag = previous[:12]
    gitea.commit(
        slug, BRANCH, {target(a): TARGET.format(app=a, tag=tag) for a in apps}, f"deploy {tag}"
    )
    return gitea.commit(
        slug, BRANCH, {dockerfile(a): "FROM scratch\nLABEL push=1\n" for a in apps}, "push"
    )


def commits(gitea: Gitea, slug: str) -> int:
    """The commits of the branch (Gitea's count of its history)."""
    with gitea.admin() as admin:
        listed = admin.get(
            f"/repos/{slug}/commits",
            params={"sha": BRANCH, "limit": 1, "stat": False, "verification": False},
        )
    listed.raise_for_status()
    return int(listed.headers["X-Total-Count"])


def pull_requests(gitea: Gitea, slug: str) -> int:
    """The open pull requests of ``slug`` (Gitea's count of them)."""
    with gitea.admin() as admin:
        listed = admin.get(f"/repos/{slug}/pulls", params={"state": "open", "limit": 1})
    listed.raise_for_status()
    return int(listed.headers["X-Total-Count"])


def proposal_ref(mode: str, variant: str, apps: list[str], app: str, revision: str) -> str:
    """Where ``app``'s digest is written: the branch, or the branch that proposes it (an
    app alone proposes from its own, grouped or not)."""
    if mode == "commit":
        return BRANCH
    alone = variant == "per-app" or len(apps) == 1
    return f"{PREFIX}{app}" if alone else f"{PREFIX}push.{revision[:12]}.{BRANCH}"


def missing_digests(
    gitea: Gitea, slug: str, apps: list[str], ref: Callable[[str], str] = lambda _: BRANCH
) -> list[str]:
    """The apps whose digest is not in their file on ``ref(app)``, read back from Gitea."""
    missing = []
    with gitea.admin() as admin:
        for app in apps:
            text = admin.get(f"/repos/{slug}/raw/{target(app)}", params={"ref": ref(app)})
            if text.status_code != 200 or f"digest: {digest(app)}" not in text.text:
                missing.append(app)
    return missing


def gitea_cpu(gitea: Gitea) -> float:
    """The CPU time of ``gitea web`` and of the children it has waited for (its ``git``
    commands and hooks): utime, stime, cutime and cstime of /proc/PID/stat."""
    fields = Path(f"/proc/{gitea.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def clients_cpu() -> float:
    """The CPU time of the ``fabrique`` processes ended so far (this process's children
    waited for: Gitea's own is counted once it ends, after the runs)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def fabrique(values: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FABRIQUE, "--values", str(values), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def per_app(
    values: Path, env: dict[str, str], work: Path, revision: str, apps: list[str], concurrency: int
) -> dict[str, Any]:
    """Each app's build writing its own digest and posting its status, ``concurrency``
    at a time; the times are each app's end, from the digests."""
    start = time.perf_counter()

    def build(app: str) -> dict[str, Any]:
        workflow = workflow_name(app, revision)
        out = work / "out" / app
        wrote = fabrique(
            *(values, env, "writeback", "--app", app, "--revision", revision),
            *("--digest", digest(app), "--workflow", workflow, "--out", str(out)),
        )
        result: dict[str, Any] = {"app": app, "writeback": wrote.returncode}
        if wrote.returncode != 0:
            # its build fails there (its exit handler reports it: not played here)
            result |= {"outcome": "failed", "error": wrote.stderr.strip()[-300:]}
        else:
            outcome = (out / "outcome").read_text()
            reported = fabrique(
                *(values, env, "status-report", "success", "--app", app),
                *("--revision", revision, "--workflow", workflow, "--digest", digest(app)),
                *("--outcome", outcome, "--commit", (out / "commit").read_text()),
            )
            result |= {"outcome": outcome, "status_report": reported.returncode}
        result["end_s"] = round(time.perf_counter() - start, 3)
        return result

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(build, apps))
    return {
        "seconds": max(r["end_s"] for r in results),
        "outcomes": dict(Counter(r["outcome"] for r in results)),
        "failed": sorted(r["app"] for r in results if r["writeback"] != 0),
        "exit_codes": dict(Counter(str(r["writeback"]) for r in results)),
        "errors": sorted({r["error"] for r in results if "error" in r}),
        "builds": results,
    }


def grouped(
    values: Path, env: dict[str, str], work: Path, revision: str, apps: list[str]
) -> dict[str, Any]:
    """One ``writeback-group --from`` of every build of the push."""
    listed = work / "deploys.json"
    listed.write_text(json.dumps(deploys(apps, revision)))
    start = time.perf_counter()
    done = fabrique(values, env, "writeback-group", "--from", str(listed))
    seconds = round(time.perf_counter() - start, 3)
    # one line per app (its outcome, "failed" or "left out"), after the diffs
    said = {found["app"]: found["state"] for found in SAID.finditer(done.stdout)}
    return {
        "seconds": seconds,
        "outcomes": dict(Counter(said.get(app, "unsaid") for app in apps)),
        # an app the process did not get to say is failed too
        "failed": [app for app in apps if said.get(app, "failed") == "failed"],
        "exit_codes": {str(done.returncode): 1},
        "errors": [done.stderr.strip()[-300:]] if done.returncode else [],
    }


def measure(
    gitea: Gitea,
    proxy: SpecProxy,
    work: Path,
    n: int,
    name: str,
    concurrency: int,
    mode: str = "commit",
) -> dict[str, Any]:
    """One variant at ``n`` apps: seeded, then its write-backs run and counted."""
    apps = names(n)
    slug = f"push-{n}/{name}"
    revision = seed(gitea, slug, apps)
    folder = work / f"{n}-{name}"
    folder.mkdir()
    values = folder / "values.yaml"
    values.write_text(yaml.safe_dump(site_values(slug, apps, proxy.url, mode)))
    # the processes run this tree's fabrique, whatever the environment imports
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "FABRIQUE_GITEA_TOKEN": gitea.token, "PYTHONPATH": path}
    before, first = commits(gitea, slug), len(proxy.requests)
    cpu = gitea_cpu(gitea), clients_cpu()
    if name == "per-app":
        figures = per_app(values, env, folder, revision, apps, concurrency)
    else:
        figures = grouped(values, env, folder, revision, apps)
    spent = gitea_cpu(gitea) - cpu[0], clients_cpu() - cpu[1]
    writeback, statuses = split_requests(proxy.requests[first:])
    return {
        "apps": n,
        "variant": name,
        "commits": commits(gitea, slug) - before,
        "pull_requests": pull_requests(gitea, slug),
        "writeback_requests": writeback,
        "status_requests": statuses,
        **figures,
        "gitea_cpu_s": round(spent[0], 1),
        "clients_cpu_s": round(spent[1], 1),
        "missing_digests": missing_digests(
            gitea, slug, apps, lambda app: proposal_ref(mode, name, apps, app, revision)
        ),
    }


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per app over grouped, at each number of apps: requests (the write-back's, and
    with the statuses) and time."""
    found = []
    for n in sorted({r["apps"] for r in rows}):
        one, group = (
            next(r for r in rows if r["apps"] == n and r["variant"] == v) for v in VARIANTS
        )
        total = [r["writeback_requests"] + r["status_requests"] for r in (one, group)]
        found.append(
            {
                "apps": n,
                "writeback_requests": round(
                    one["writeback_requests"] / group["writeback_requests"], 1
                ),
                "all_requests": round(total[0] / total[1], 1),
                "seconds": round(one["seconds"] / group["seconds"], 1),
            }
        )
    return found


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as RESULTS' table prints them."""
    lines = [
        "| apps | variant | commits | pull requests | write-back requests | status requests "
        "| seconds | failed | digests not in Git | Gitea CPU (s) | fabrique CPU (s) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['apps']} | {r['variant']} | {r['commits']} | {r.get('pull_requests', 0)} | "
            f"{r['writeback_requests']} | "
            f"{r['status_requests']} | {r['seconds']:.2f} | {len(r['failed'])} | "
            f"{len(r['missing_digests'])} | {r['gitea_cpu_s']:.1f} | {r['clients_cpu_s']:.1f} |"
        )
    return lines


def ratio_table(found: list[dict[str, Any]]) -> list[str]:
    """Per app over grouped: the write-back's requests, all requests, the time."""
    lines = [
        "| apps | write-back requests, per app / grouped | all requests, per app / grouped "
        "| seconds, per app / grouped |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for r in found:
        cells = [r["writeback_requests"], r["all_requests"], r["seconds"]]
        lines.append(f"| {r['apps']} | " + " | ".join(f"{c}{TIMES}" for c in cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", default="1,20,200", help="the apps a push touches, each a run")
    parser.add_argument(
        "--concurrency", type=int, default=20, help="per app: builds writing back at once"
    )
    parser.add_argument(
        "--mode", choices=MODES, default="commit", help="writeback.mode of the apps"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    try:
        sizes = [int(n) for n in args.apps.split(",")]
    except ValueError:
        parser.error(f"--apps: numbers separated by commas, not {args.apps!r}")
    if not sizes or min(sizes) < 1 or max(sizes) > 1000:
        parser.error("--apps: each from 1 to 1000")
    if args.concurrency < 1:
        parser.error("--concurrency: at least 1")
    with tempfile.TemporaryDirectory(prefix="fabrique-bench-") as scratch, ExitStack() as stack:
        work = Path(scratch)
        with redirect_stdout(sys.stderr):  # the peer's build notes: not into --json
            gitea, proxy = stack.enter_context(real_gitea(work))
        rows = [
            measure(gitea, proxy, work, n, name, args.concurrency, args.mode)
            for n in sizes
            for name in VARIANTS
        ]
        violations = list(proxy.violations)
    found = ratios(rows)
    if args.json:
        figures = {"rows": rows, "ratios": found, "concurrency": args.concurrency}
        figures["mode"] = args.mode
        print(json.dumps(figures | {"violations": violations}, indent=2))
        return 0
    print("\n".join(table(rows)))
    print()
    print("\n".join(ratio_table(found)))
    for r in rows:
        if r["missing_digests"]:
            print(f"{r['apps']} {r['variant']}: digests not in Git: {r['missing_digests']}")
        if r["errors"]:
            print(f"{r['apps']} {r['variant']}: failures: {r['errors']}")
    if violations:
        print(f"swagger violations: {violations}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
