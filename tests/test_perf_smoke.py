"""A fast smoke run of bench/perf.py: every figure is printed and the request counts are
within their bounds. No time is checked: these machines are noisy."""

from __future__ import annotations

import json
from typing import Any

from .conftest import run_bench


def test_perf_prints_every_figure_within_request_bounds() -> None:
    result = run_bench(
        "perf.py",
        *("--render-apps", "1,5", "--commits", "20,40", "--size-mb", "1", "--apps", "4"),
        # one latency: that every figure is taken at each is a loop, not a figure
        *("--latency-ms", "5"),
        *("--scale", "12x3", "--curve", "4,12", "--curve-files", "3", "--files-curve", "1"),
        *("--real-gitea", ""),  # the live tier runs it: tests/live/test_bench_servers.py
        "--json",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert [r["apps"] for r in report["render"]] == [1, 5]
    assert all(r["wall_ms"] > 0 and r["peak_kib"] > 0 for r in report["render"])
    assert [(r["latency_ms"], r["commits"]) for r in report["writeback"]] == [(5, 20), (5, 40)]
    for row in report["writeback"]:
        for method in ("contents_api", "git_shallow", "full_clone"):
            assert row[f"{method}_s"] > 0 and row[f"{method}_bytes"] > 0, (method, row)
        assert row["contents_api_bytes"] < row["full_clone_bytes"], (
            "the Contents API moves less than a clone"
        )
    assert [r["latency_ms"] for r in report["reconcile"]] == [5]
    for reconcile in report["reconcile"]:
        _check_reconcile(reconcile)
    assert [(r["apps"], r["files"], r["latency_ms"]) for r in report["scale"]] == [(12, 3, 5)]
    (startup,) = report["startup"]
    assert 0 < startup["version_ms_median"] <= startup["version_ms_max"]
    for row in report["scale"]:
        # through the CLI, as the CronWorkflow runs it. No memory: the head, a listing per
        # app, a read per file, the memory looked for and made, the sweep's LIST, and each
        # app's commit status read and posted (none yet)
        assert row["cold_requests"] == 1 + 12 + 3 + 2 + 1 + 2 * 12
        assert row["idle_requests"] == 1 + 3 + 1 + 1, "head, files, memory, sweep"
        assert row["moved_requests"] == 1 + 1 + 3 + 2 + 1, "and one listing, the memory written"
        assert row["one_requests"] > row["moved_requests"]
    assert 0 < report["scale"][0]["memory_mb"] < 200
    assert [(r["apps"], r["files"]) for r in report["curve"]] == [(4, 3), (12, 3), (12, 1)]
    assert {r["idle_requests"] for r in report["curve"][:2]} == {6}, "flat in the apps"


def _check_reconcile(reconcile: dict[str, Any]) -> None:
    assert reconcile["writeback_unchanged_requests"] == 1
    assert reconcile["writeback_changed_requests"] <= 3
    for key in (
        "reconcile_concurrency_1_requests_per_app",
        "reconcile_concurrency_default_requests_per_app",
    ):
        # per app a listing, its file, its status read and posted (the CLI reports them);
        # per pass the head, the memory read and written, the sweep's one LIST
        assert reconcile[key] <= 4 + 4 / reconcile["apps"], (key, reconcile[key])
    assert 0 < reconcile["writeback_cli_ms_median"] <= reconcile["writeback_cli_ms_max"]
