"""bench/perf.py's passes against the Gitea double and a real Gitea, side by side: the
double must not flatter the figures by asking less than the real server is asked."""

from __future__ import annotations

from pathlib import Path

from bench.perf import double_and_real_gitea
from fabrique.validate import find_specs

from .fixtures import need_go


def test_the_double_and_a_real_gitea_see_the_same_requests_per_pass(tmp_path: Path) -> None:
    need_go()
    double, real = double_and_real_gitea(tmp_path, find_specs(), "6x2")
    assert (double["server"], real["server"]) == ("double", "gitea")
    for label in ("cold", "idle", "moved", "one"):
        assert double[f"{label}_requests"] == real[f"{label}_requests"], label
    # each server's CPU is measured (that it counts its git commands is not seen here)
    assert double["cold_cpu_s"] > 0 and real["cold_cpu_s"] > 0
