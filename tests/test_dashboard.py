"""The factory's Grafana dashboard (``fabrique dashboard``): over the series the alerts
read, with Grafana's own variables only; the copy in the docs is the command's. Its
queries run against a real Prometheus in tests/live/test_dashboard.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fabrique.decisions.alerts import BUILDS, DECIDED, WRITEBACKS
from fabrique.decisions.dashboard import BUCKETS, dashboard, panels, queries
from fabrique.site.config import load_site

from .conftest import ROOT, run_cli

METRIC = re.compile(r"\bargo_workflows_[a-z_]+")


def test_every_panel_reads_the_series_the_alerts_read() -> None:
    site = load_site(env={})
    for panel in panels(site):
        assert set(METRIC.findall(panel.expr)) <= {BUILDS, BUCKETS, WRITEBACKS, DECIDED}
        # Grafana's own variables only, and a count over the range shown
        assert set(re.findall(r"\$\w+", panel.expr)) <= {"$__range", "$__rate_interval"}
        assert "$__range" in panel.expr, panel.title


def test_the_queries_are_sent_with_the_range_s_values() -> None:
    for title, query in queries(load_site(env={}), span="2h"):
        assert "$" not in query and "offset 2h" in query and "[2h]" in query, title


def test_the_panels_tile_the_dashboard_once_each() -> None:
    model = dashboard(load_site(env={}))
    shown = model["panels"]
    assert len({p["id"] for p in shown}) == len(shown) == len(panels(load_site(env={})))
    cells = [
        (x, y)
        for p in shown
        for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
        for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)) and max(x for x, _ in cells) < 24
    (source,) = model["templating"]["list"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    for p in shown:
        assert p["datasource"]["uid"] == "${" + source["name"] + "}"


def test_the_command_writes_the_dashboard_the_docs_hold(tmp_path: Path) -> None:
    result = run_cli("dashboard", "--out", str(tmp_path / "dashboard.json"))
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "dashboard.json").read_text())
    assert written == dashboard(load_site(env={}))
    assert written == json.loads((ROOT / "docs/operate/dashboard.json").read_text()), (
        "docs/operate/dashboard.json: run `fabrique dashboard --out docs/operate/dashboard.json`"
    )
    printed = run_cli("dashboard")
    assert json.loads(printed.stdout) == written


def test_a_dashboard_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    result = run_cli("dashboard", "--out", str(tmp_path / "missing" / "dashboard.json"))
    assert result.exit_code != 0
    assert "--out" in result.output and len(result.output.strip().splitlines()) == 1
