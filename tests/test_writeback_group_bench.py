"""bench/writeback_group.py: its variants' values and the figures it makes of them, then a
small run of it on the live tier's real Gitea (a push touching 1 and 3 apps)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from bench.writeback_group import VARIANTS, names, ratios, site_values, split_requests, table
from fabrique.site.config import default_values, merge, parse_site

from .conftest import run_bench
from .live.fixtures import need_go


def test_a_variants_values_are_a_site_of_its_apps_in_one_repository() -> None:
    values = site_values("push-3/grouped", names(3), "http://127.0.0.1:1")
    site = parse_site(merge(default_values(), yaml.safe_load(yaml.safe_dump(values))))
    # the guard resolves the deployed tags in the repository written, through the proxy
    assert (site.gitea.code_repo, site.gitea.url) == ("push-3/grouped", "http://127.0.0.1:1")
    assert [a.name for a in site.apps] == ["app-000", "app-001", "app-002"]
    assert {(a.writeback.kind, a.writeback.repo) for a in site.apps} == {
        ("kustomize-images", "push-3/grouped")
    }
    assert site.writeback.batch.enabled and site.signing.public_key is None


def test_statuses_are_counted_apart_from_the_write_back() -> None:
    requests = [
        "GET /api/v1/repos/o/r/contents/deploy/app-000/kustomization.yaml",
        "POST /api/v1/repos/o/r/file-contents",
        "GET /api/v1/repos/o/r/commits/abc/status",
        "GET /api/v1/repos/o/r/commits/abc/statuses",
        "POST /api/v1/repos/o/r/statuses/abc",
        "GET /api/v1/repos/o/r/git/commits/abc",
    ]
    assert split_requests(requests) == (3, 3)


def _row(
    n: int, variant: str, commits: int, writes: int, statuses: int, s: float
) -> dict[str, Any]:
    return {
        "apps": n,
        "variant": variant,
        "commits": commits,
        "writeback_requests": writes,
        "status_requests": statuses,
        "seconds": s,
        "failed": [],
        "missing_digests": [],
        "gitea_cpu_s": 2.0,
        "clients_cpu_s": 20.0,
    }


def test_the_rows_make_the_table_and_the_ratios() -> None:
    rows = [_row(20, "per-app", 20, 100, 40, 9.0), _row(20, "grouped", 1, 5, 40, 3.0)]
    assert table(rows)[2:] == [
        "| 20 | per-app | 20 | 0 | 100 | 40 | 9.00 | 0 | 0 | 2.0 | 20.0 |",
        "| 20 | grouped | 1 | 0 | 5 | 40 | 3.00 | 0 | 0 | 2.0 | 20.0 |",
    ]
    assert ratios(rows) == [
        {"apps": 20, "writeback_requests": 20.0, "all_requests": 3.1, "seconds": 3.0}
    ]


@pytest.mark.live
def test_a_push_of_three_apps_lands_as_one_commit_grouped_and_three_per_app() -> None:
    """One build at a time per app (``--concurrency 1``): no race among them, so the
    per-app variant's commits are the apps' (a race's outcome would depend on timing)."""
    need_go()
    done = run_bench(
        "writeback_group.py", "--apps", "1,3", "--concurrency", "1", "--json", timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    rows = {(r["apps"], r["variant"]): r for r in figures["rows"]}
    assert set(rows) == {(n, v) for n in (1, 3) for v in VARIANTS}
    assert figures["violations"] == []
    for row in rows.values():
        assert row["missing_digests"] == [] and row["failed"] == []
        assert row["outcomes"] == {"changed": row["apps"]}
    assert rows[3, "grouped"]["commits"] == 1
    assert rows[3, "per-app"]["commits"] == 3
    assert rows[1, "grouped"]["commits"] == rows[1, "per-app"]["commits"] == 1
    assert rows[3, "grouped"]["writeback_requests"] < rows[3, "per-app"]["writeback_requests"]
    # each app's status is posted either way
    assert rows[3, "grouped"]["status_requests"] > 0 and rows[3, "per-app"]["status_requests"] > 0


@pytest.mark.live
def test_a_push_of_three_apps_that_take_pull_requests_opens_one_grouped_and_three_per_app() -> None:
    need_go()
    done = run_bench(
        *("writeback_group.py", "--apps", "3", "--concurrency", "1"),
        *("--mode", "pull-request", "--json"),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    rows = {r["variant"]: r for r in figures["rows"]}
    assert figures["violations"] == [] and figures["mode"] == "pull-request"
    for row in rows.values():
        # each digest on the branch that proposes it; the base waits for the merge
        assert row["missing_digests"] == [] and row["failed"] == [] and row["commits"] == 0
        assert row["outcomes"] == {"proposed": 3}
    assert (rows["grouped"]["pull_requests"], rows["per-app"]["pull_requests"]) == (1, 3)
    assert rows["grouped"]["writeback_requests"] < rows["per-app"]["writeback_requests"]
