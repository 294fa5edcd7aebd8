"""A small run of bench/statuses.py: past 50 apps on one commit, each command reads the
pages it needs and no more, in both ways the bench compares. No time is checked."""

from __future__ import annotations

from pathlib import Path

from bench.statuses import measure


def test_the_statuses_bench_counts_the_pages_each_command_reads(tmp_path: Path) -> None:
    rows = {row["what"]: row for row in measure(tmp_path, apps=60, files=5)}
    reads = {
        what: (row["combined"]["status_reads"], row["listing"]["status_reads"])
        for what, row in rows.items()
    }
    # 60 contexts, 120 statuses: 50 a page
    assert reads == {
        "report, newest context": (1, 1),
        "report, oldest context": (2, 2),  # its latest is past the first 50 either way
        "report, no context yet": (2, 3),  # every context, or every status
        "reconcile pass": (2, 2),  # one read of the commit for its 61 apps
    }
    for row in rows.values():
        for way in ("combined", "listing"):
            assert row[way]["requests"] >= row[way]["status_reads"]
    assert rows["report, no context yet"]["combined"]["out"].startswith("status posted: ")
    assert rows["report, oldest context"]["combined"]["out"].startswith("status unchanged: ")
