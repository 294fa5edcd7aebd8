"""The factory's dashboard (``fabrique dashboard``) asked of a real Prometheus (3.16.0,
``tests/peers/promtool``) scraping the real Argo Workflows controller of the live plane,
after builds of two apps (one passing, one failing) and a reconcile pass ran there from
the rendered templates (their pods played by kwok, their outputs reported as Argo's
executor reports them): every panel's query, as Grafana sends it, returns data.

``DASHBOARD_PICTURE=<file.svg>`` draws what it answered, in the dashboard's
layout: the picture of docs/operate/watching.md.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from html import escape
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fabrique.decisions.dashboard import HEIGHT, WIDTH, dashboard, queries
from fabrique.decisions.reconcile import DECISIONS
from fabrique.site.config import load_site

from . import controlplane
from .cluster import Cluster
from .fixtures import need_go
from .test_workflows import (
    CONTROL_NS,
    RUN,
    RUN_OUTPUTS,
    ended,
    from_cron,
    phase,
    start,
    step_pod,
    walk,
)

RECONCILER_EXECUTOR = f"system:serviceaccount:{CONTROL_NS}:fabrique-executor"
# the pass's counts, as `fabrique reconcile --counts` writes them: one lost push caught
# up (submitted), one app held, the others current
COUNTS = {"ok": "3", "held": "1", "submitted": "1"}


class Prometheus:
    """A real Prometheus scraping the plane's Argo controller once a second."""

    def __init__(self, binary: Path, folder: Path, target: str) -> None:
        self.port = controlplane.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": "argo-workflows", "static_configs": [{"targets": [target]}]}
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = folder / "prometheus.log"
        self.command = [
            str(binary),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, cluster: Cluster) -> Prometheus:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        cluster.wait("Prometheus ready", self._ready, timeout=60)
        return self

    def _ready(self) -> bool | None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"Prometheus exited: {self.log.read_text()[-2000:]}")
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200 or None
        except httpx.HTTPError:
            return None

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", (expr, body)
        return list(body["data"]["result"])

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    need_go()
    binary = controlplane.binaries(("promtool",))["prometheus"]
    target = f"127.0.0.1:{cluster.plane.ports['argo-metrics']}"
    started = Prometheus(binary, tmp_path_factory.mktemp("prometheus"), target).start(cluster)
    try:
        yield started
    finally:
        started.stop()


def _pass(cluster: Cluster) -> str:
    """A reconcile pass of the CronWorkflow's spec, its pod played: its counts reported
    as the step's outputs (DECISIONS: what it did not count reads its default, 0)."""
    workflow = from_cron(cluster, "fabrique-reconcile")
    pod = step_pod(cluster, workflow, "reconcile", namespace=CONTROL_NS, phase="Running")
    answer = cluster.report_outputs(pod, COUNTS, as_user=RECONCILER_EXECUTOR)
    assert answer.status == 201, answer.message
    cluster.finish(pod, 0)
    cluster.wait(
        f"{workflow} Succeeded",
        lambda: phase(cluster, CONTROL_NS, workflow) == "Succeeded" or None,
        timeout=120,
    )
    return workflow


def test_every_panel_of_the_dashboard_returns_data_from_the_real_prometheus(
    cluster: Cluster, applied: Path, prometheus: Prometheus
) -> None:
    passed, failed = start(cluster), start(cluster)
    walk(cluster, passed, [(RUN, 0)])
    walk(cluster, failed, [(RUN, 1), ("report-failure", 0)], RUN_OUTPUTS | {"outcome": "none"})
    ended(cluster, passed, "Succeeded")
    ended(cluster, failed, "Failed")
    _pass(cluster)
    apps = {
        name: cluster.workflow("fabrique-build", name)["metadata"]["labels"]["fabrique.io/app"]
        for name in (passed, failed)
    }
    by_label = {
        "Builds by outcome, per app": lambda r: (r["metric"]["app"], r["metric"]["status"]),
        "Build time, 90th percentile per app": lambda r: r["metric"]["app"],
        "Write-backs by outcome": lambda r: r["metric"]["outcome"],
        "Safety-net decisions": lambda r: r["metric"]["decision"],
    }
    # what each panel must show of these runs (older runs of the plane may add to it)
    wanted: dict[str, Callable[[dict[Any, float]], bool]] = {
        "Builds by outcome, per app": lambda found: (
            found.get((apps[passed], "Succeeded")) == 1 and found.get((apps[failed], "Failed")) == 1
        ),
        "Build time, 90th percentile per app": lambda found: set(apps.values()) <= set(found),
        "Write-backs by outcome": lambda found: found.get("changed", 0) >= 1,
        "Safety-net decisions": lambda found: (
            set(found) == set(DECISIONS) and found["held"] >= 1 and found["submitted"] >= 1
        ),
        "Lost events repaired": lambda found: found.get(None, 0) >= 1,
        "Holds seen by the safety net": lambda found: found.get(None, 0) >= 1,
    }
    site = load_site(env={})
    answered: dict[str, list[dict[str, Any]]] = {}
    for title, query in queries(site):
        label = by_label.get(title, lambda _: None)

        def shows(q: str = query, t: str = title, k: Callable[..., Any] = label) -> Any:
            result = prometheus.query(q)
            found = {k(r): float(r["value"][1]) for r in result}
            return result if wanted[t](found) else None

        # scraped once a second: each panel waits for the scrape after the runs ended
        answered[title] = cluster.wait(
            f"the panel {title!r} to show these runs (query: {query})", shows, timeout=60
        )
    picture = os.environ.get("DASHBOARD_PICTURE")
    if picture:
        Path(picture).write_text(draw(dashboard(site), answered))


def draw(model: dict[str, Any], answered: dict[str, list[dict[str, Any]]]) -> str:
    """An SVG of the dashboard's panels in its grid, each a bar per series answered."""
    cell, row = 40, 30  # the pixels of one grid column, of one grid row
    width = 24 * cell
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in model["panels"]) * row
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 40}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height + 40}" fill="#181b1f"/>',
        f'<text x="10" y="26" fill="#ccccdc" font-size="18">{escape(model["title"])}</text>',
    ]
    for panel in model["panels"]:
        grid = panel["gridPos"]
        x, y = grid["x"] * cell + 6, grid["y"] * row + 46
        w, h = WIDTH * cell - 12, HEIGHT * row - 12
        parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="#22252b" rx="4"/>')
        parts.append(
            f'<text x="{x + 10}" y="{y + 20}" fill="#ccccdc" font-size="14">'
            f"{escape(panel['title'])}</text>"
        )
        legend = panel["targets"][0]["legendFormat"]
        unit = " s" if panel["fieldConfig"]["defaults"]["unit"] == "s" else ""
        series = sorted(
            (
                (_legend(legend, r["metric"]), float(r["value"][1]))
                for r in answered[panel["title"]]
            ),
            key=lambda named: (-named[1], named[0]),
        )[:8]  # the largest first, as many as the panel holds
        top = max((v for _, v in series), default=0) or 1
        for i, (name, value) in enumerate(series):
            bar = (w - 220) * value / top
            by = y + 36 + i * 24
            parts.append(
                f'<text x="{x + 10}" y="{by + 13}" fill="#9fa7b3">{escape(name[:28])}</text>'
            )
            parts.append(
                f'<rect x="{x + 180}" y="{by}" width="{bar:.1f}" height="16" fill="#73bf69"/>'
            )
            parts.append(
                f'<text x="{x + 186 + bar:.1f}" y="{by + 13}" fill="#ccccdc">{value:g}{unit}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _legend(template: str, labels: dict[str, str]) -> str:
    for key, value in labels.items():
        template = template.replace("{{" + key + "}}", value)
    return template
