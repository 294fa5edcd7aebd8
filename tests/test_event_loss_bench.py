"""A short run of the fault bench, its rules asserted (bench/event_loss.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import ROOT


def test_event_loss_bench_converges_without_duplicates_or_rollbacks() -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "event_loss.py"),
            "--apps",
            "5",
            "--pushes",
            "20",
            "--redeliver",
            "0.3",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout)
    assert figures["events_sent"] == 20
    # events really were lost, in each of the three ways
    assert (
        figures["lost_webhook"] > 0 and figures["lost_eventbus"] > 0 and figures["lost_outage"] == 3
    )
    assert (
        figures["events_lost"]
        == figures["lost_webhook"] + figures["lost_eventbus"] + figures["lost_outage"]
    )
    # redeliveries met 409 AlreadyExists, and nothing was built twice or rolled back
    assert figures["redelivered"] > 0 and figures["workflows_refused_409"] > 0
    assert figures["duplicate_builds"] == 0
    assert figures["rollbacks"] == 0
    # the reconciler had work to do, and did it
    assert figures["drifted_before"] > 0
    assert figures["drifted_after"] == 0
    assert 1 <= figures["reconcile_passes"] <= 6
    assert figures["requests_per_app_per_pass"] > 0
