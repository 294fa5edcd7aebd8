"""A write-back through a pull request beside a direct one: Gitea requests and time.

    python bench/writeback_modes.py [--builds 5] [--json]

A real Gitea (the live tier's peer: needs Go, ``make peers`` builds it) serves one
repository per variant, the app's kustomization in it. For each transport (``gitea``, the
Contents API; ``git``) and mode (``commit``; ``pull-request``; ``pull-request`` with
``autoMerge``, its branch protected with a required check that nobody posts, so the
merge is asked and scheduled, never done), ``fabrique writeback`` runs as the build step
runs it, a process of its own, for ``--builds`` successive builds of the app (each a
newer commit: the first opens the pull request, the next update it), then once more for
the last build (a replay: ``unchanged`` or ``in review``).

For each: the wall time of each process (start-up included; median and max), and the
Gitea API requests it made, counted by a proxy in front of Gitea that also holds them to
Gitea's swagger. The git transport's fetch and push go to Gitea directly and are not
among the requests. Figures only: no pass/fail. See bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from fabrique.validate import GITEA_SWAGGER, find_specs  # noqa: E402
from tests.doubles.proxy import SpecProxy  # noqa: E402
from tests.doubles.swagger import Swagger  # noqa: E402
from tests.live.gitea import Gitea  # noqa: E402
from tests.live.gitea import binary as gitea_binary  # noqa: E402

FABRIQUE = str(Path(sys.executable).parent / "fabrique")

APP = "dataops/citation-dagster"
TARGET = f"{APP}/deploy/overlays/prod/kustomization.yaml"
SEED = {
    f"{APP}/Dockerfile": "FROM scratch\nCOPY app.txt /\n",
    f"{APP}/app.txt": "citation\n",
    TARGET: "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
    "resources:\n  - ../../base\n",
}
MODES = {
    "commit": {},
    "pull-request": {"writeback.mode": "pull-request"},
    "pull-request, autoMerge": {
        "writeback.mode": "pull-request",
        "writeback.pullRequest.autoMerge": True,
    },
}
CHECK = "ci/lint"


@contextmanager
def real_gitea(work: Path) -> Iterator[tuple[Gitea, SpecProxy]]:
    gitea = Gitea(work / "gitea", gitea_binary()).start()
    proxy = SpecProxy(gitea.url, Swagger(find_specs() / GITEA_SWAGGER)).start()
    try:
        yield gitea, proxy
    finally:
        proxy.stop()
        gitea.stop()


def variant(
    gitea: Gitea, proxy: SpecProxy, work: Path, transport: str, mode: str, builds: int
) -> dict[str, Any]:
    slug = f"atlas/{transport}-{mode.replace(', ', '-').replace('-', '')}".lower()
    gitea.repository(slug)
    gitea.commit(slug, "main", SEED, "seed")
    revisions = [
        gitea.commit(slug, "main", {f"{APP}/app.txt": f"v{n}\n"}, f"v{n}") for n in range(builds)
    ]
    if "autoMerge" in mode:
        rule = {"branch_name": "main", "rule_name": "main", "enable_push": False}
        rule |= {"enable_status_check": True, "status_check_contexts": [CHECK]}
        with gitea.admin() as admin:
            admin.post(f"/repos/{slug}/branch_protections", json=rule).raise_for_status()
    values = work / f"{slug.replace('/', '-')}.yaml"
    values.write_text(yaml.safe_dump(site_values(slug, transport, mode, proxy.url, gitea.url)))
    env = {**os.environ, "FABRIQUE_GITEA_TOKEN": gitea.token}
    digests = ["sha256:" + f"{n % 16:x}" * 64 for n in range(builds)]
    runs = []
    # each build, then the last one's write-back again (a replay)
    for revision, digest in [*zip(revisions, digests, strict=True), (revisions[-1], digests[-1])]:
        before = len(proxy.requests)
        start = time.perf_counter()
        done = subprocess.run(
            [
                *(FABRIQUE, "--values", str(values), "writeback", "--app", "citation"),
                *("--revision", revision, "--digest", digest),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{transport}/{mode}: writeback failed: {done.stderr[-500:]}")
        runs.append(
            {
                "outcome": done.stdout.split(":", 1)[0],
                "seconds": round(wall, 3),
                "requests": len(proxy.requests) - before,
            }
        )
    return summary(transport, mode, runs)


def site_values(slug: str, transport: str, mode: str, api_url: str, git_url: str) -> dict[str, Any]:
    """The values of one variant: the app pinned in ``slug``, the API reached through the
    counting proxy at ``api_url``, git directly at ``git_url``, ``mode``'s settings."""
    app = {
        "name": "citation",
        "image": "citation-dagster",
        "context": APP,
        "writeback": {"kind": "kustomize-images", "repo": slug, "path": TARGET},
    }
    settings: dict[str, Any] = {"gitea": {"url": api_url, "codeRepo": slug}, "apps": [app]}
    settings["writeback"] = {"transport": transport, "gitUrl": git_url}
    for dotted, value in MODES[mode].items():
        node = settings
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return settings


def summary(transport: str, mode: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of figures from a variant's runs: its builds' write-backs, then the
    replay (the last run)."""
    writes, replay = runs[:-1], runs[-1]
    return {
        "transport": transport,
        "mode": mode,
        "first": writes[0],
        "next_median_s": round(statistics.median(r["seconds"] for r in writes[1:]), 3),
        "next_max_s": max(r["seconds"] for r in writes[1:]),
        "next_requests": sorted({r["requests"] for r in writes[1:]}),
        "next_outcomes": sorted({r["outcome"] for r in writes[1:]}),
        "replay": replay,
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as RESULTS' table prints them."""
    lines = [
        "| transport | mode | first: outcome, s, requests | next (median / max s) "
        "| next requests | replay: outcome, s, requests |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]
    for r in rows:
        first, replay = r["first"], r["replay"]
        lines.append(
            f"| {r['transport']} | {r['mode']} | {first['outcome']}, {first['seconds']:.2f}, "
            f"{first['requests']} | {r['next_median_s']:.2f} / {r['next_max_s']:.2f} | "
            f"{', '.join(map(str, r['next_requests']))} | {replay['outcome']}, "
            f"{replay['seconds']:.2f}, {replay['requests']} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=5, help="successive builds of the app")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.builds < 2:
        parser.error("--builds: at least 2 (a first write-back and the next)")
    with tempfile.TemporaryDirectory(prefix="fabrique-bench-") as scratch:
        work = Path(scratch)
        with real_gitea(work) as (gitea, proxy):
            rows = [
                variant(gitea, proxy, work, transport, mode, args.builds)
                for transport in ("gitea", "git")
                for mode in MODES
            ]
            violations = list(proxy.violations)
    if args.json:
        print(json.dumps({"rows": rows, "violations": violations}, indent=2))
        return 0
    print("\n".join(table(rows)))
    if violations:
        print(f"swagger violations: {violations}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
