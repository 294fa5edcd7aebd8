"""A short run of the fault bench's real mode (``bench/event_loss.py --real``), its rules
asserted: a real Gitea, control plane, EventBus, EventSource and Sensor lose events in
each of their ways, and the reconciler makes every app converge anyway.

The bench starts its own plane and Gitea, in a process of its own, as a person runs it
(about two and a half minutes, a minute of it the Sensor's tries on the redelivery)."""

from __future__ import annotations

import json
import subprocess
import sys

from ..conftest import ROOT
from .fixtures import need_go

APPS, PUSHES, OUTAGE = 3, 10, 2


def test_the_real_event_path_loses_events_and_the_reconciler_converges_without_duplicates() -> None:
    need_go()
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "event_loss.py"),
            "--real",
            *("--apps", str(APPS), "--pushes", str(PUSHES), "--outage", str(OUTAGE)),
            *("--drop", "0.2", "--redeliver", "1", "--json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["events_sent"] == PUSHES
    # the proxy lost some on the way, and Gitea never delivered them again
    assert figures["lost_webhook"] > 0
    assert figures["eventsource_answers"]["502"] == figures["lost_webhook"]
    assert figures["gitea_retried"] == 0
    # the killed EventSource: nothing answered for its Service, every push then lost
    assert figures["lost_outage"] == OUTAGE
    assert figures["eventsource_answers"]["503"] == OUTAGE
    # the bus came back from its claim with every message and every trigger's consumer
    assert figures["bus_messages_after_restart"] == figures["bus_messages_before_restart"] > 0
    assert figures["bus_consumers_after_restart"] == APPS
    # the only push lost on the bus is the one made while the EventSource reconnected
    assert figures["eventsource_answers"].get("500", 0) == figures["lost_eventbus"] <= 1
    # Gitea's test delivery: every trigger met 409 six times, then gave the event up
    assert figures["redelivered"] == 1
    assert figures["redeliveries_given_up"] == APPS
    assert figures["workflows_refused_409"] == 6 * APPS
    # the last pushes were healed by nothing but the reconciler
    assert figures["drifted_before"] > 0
    # nothing built twice, nothing rolled back, every app current at the end
    assert figures["duplicate_builds"] == 0
    assert figures["rollbacks"] == 0
    assert figures["drifted_after"] == 0
    assert 1 <= figures["reconcile_passes"] <= 6
    assert figures["requests_per_app_per_pass"] > 0
    assert figures["events_lost"] == (
        figures["lost_webhook"] + figures["lost_eventbus"] + figures["lost_outage"]
    )
