"""bench/writeback_modes.py's parts: its variants' values, the figures it makes of their
runs, and the table it prints. The runs themselves need the live tier's real Gitea (the
bench has no double), so they are not run here."""

from __future__ import annotations

import pytest
import yaml

from bench.writeback_modes import MODES, SEED, TARGET, site_values, summary, table
from fabrique.site.config import default_values, merge, parse_site

from .conftest import run_bench


@pytest.mark.parametrize("transport", ["gitea", "git"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_variant_is_a_site_in_its_transport_and_mode(transport: str, mode: str) -> None:
    values = site_values(
        "atlas/variant", transport, mode, "http://127.0.0.1:1", "http://127.0.0.1:2"
    )
    site = parse_site(merge(default_values(), yaml.safe_load(yaml.safe_dump(values))))
    assert site.writeback.transport == transport
    assert site.writeback.mode == ("commit" if mode == "commit" else "pull-request")
    assert site.writeback.pull_request.auto_merge == ("autoMerge" in mode)
    # the API through the counting proxy, git straight to Gitea
    assert site.gitea.url == "http://127.0.0.1:1"
    assert site.writeback.git_url == "http://127.0.0.1:2"
    (app,) = site.apps
    assert (app.writeback.repo, app.writeback.path) == ("atlas/variant", TARGET)
    assert TARGET in SEED


def _run(outcome: str, seconds: float, requests: int) -> dict[str, object]:
    return {"outcome": outcome, "seconds": seconds, "requests": requests}


def test_a_variants_runs_make_one_row_of_the_table() -> None:
    """The first write-back, the next ones (median, max, the request counts seen), then
    the replay: the columns of RESULTS' table."""
    runs = [
        _run("proposed", 1.584, 4),
        _run("proposed", 2.101, 3),
        _run("proposed", 2.44, 4),
        _run("proposed", 2.15, 3),
        _run("proposed", 2.2, 3),
        _run("in review", 0.861, 2),
    ]
    row = summary("git", "pull-request, autoMerge", runs)
    assert row["first"] == runs[0] and row["replay"] == runs[-1]
    assert (row["next_median_s"], row["next_max_s"]) == (2.175, 2.44)
    assert (row["next_requests"], row["next_outcomes"]) == ([3, 4], ["proposed"])
    assert table([row])[2] == (
        "| git | pull-request, autoMerge | proposed, 1.58, 4 | 2.17 / 2.44 | 3, 4 "
        "| in review, 0.86, 2 |"
    )


def test_fewer_than_two_builds_is_refused_before_gitea_starts() -> None:
    done = run_bench("writeback_modes.py", "--builds", "1", timeout=60)
    assert done.returncode == 2
    assert "--builds: at least 2" in done.stderr
    assert done.stdout == ""
