"""A short run of the fault bench's simulation (``bench/event_loss.py``), its rules asserted
on what the bench observed: events are lost in each of the three ways, a redelivery finds
its Workflow and settles at once (the trigger's patch: no 409), and the reconciler makes
every app converge anyway.

For each push the bench reports what it did to the delivery (``fate``), how many times the
Sensor double took its event (``taken``), and which apps' Workflows exist in the Kubernetes API double
at its commit once the events settled, before the reconciler acts: a loss is a push of
which no Workflow came."""

from __future__ import annotations

import json
from typing import Any

from .conftest import run_bench

APPS, PUSHES, OUTAGE, BATCH, MAX_PASSES = 5, 20, 3, 8, 6
RESTART = PUSHES // 2  # the bus restarts before this push
# the bus's memory storage loses what the Sensor had not fetched when it restarted: the
# pushes published since its last fetch (it fetches after every BATCH pushes)
UNFETCHED = range(RESTART - RESTART % BATCH, RESTART)


def test_event_loss_bench_converges_without_duplicates_or_rollbacks() -> None:
    result = run_bench(
        "event_loss.py",
        *("--apps", str(APPS), "--pushes", str(PUSHES), "--outage", str(OUTAGE)),
        *("--batch", str(BATCH), "--max-passes", str(MAX_PASSES)),
        *("--redeliver", "0.3", "--json"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    holds(json.loads(result.stdout))


def holds(figures: dict[str, Any]) -> None:
    pushes = figures["pushes"]
    assert [p["index"] for p in pushes] == list(range(PUSHES))
    # the dropped webhooks: the Sensor never saw them, no Workflow of any app came of them
    dropped = [p for p in pushes if p["fate"] == "dropped"]
    assert dropped
    for push in dropped:
        assert (push["taken"], push["workflows"]) == (0, []), push
    # the EventSource's outage: the last pushes, none seen, no Workflow
    outage = [p for p in pushes if p["fate"] == "outage"]
    assert [p["index"] for p in outage] == list(range(PUSHES - OUTAGE, PUSHES))
    for push in outage:
        assert (push["taken"], push["workflows"]) == (0, []), push
    # the published ones: those the bus held unfetched at its restart are gone, none seen,
    # no Workflow; every other became the Workflow of the app it touched, and of no other
    sent = [p for p in pushes if p["fate"] == "sent"]
    on_the_bus = [p for p in sent if p["index"] in UNFETCHED]
    assert on_the_bus, "no push was published between the Sensor's last fetch and the restart"
    for push in sent:
        if push in on_the_bus:
            assert (push["taken"], push["workflows"]) == (0, []), push
        else:
            assert push["taken"] >= 1 and push["workflows"] == [push["app"]], push
    # the bench's counts of losses and creations are these observations
    assert figures["lost_webhook"] == len(dropped)
    assert figures["lost_outage"] == OUTAGE
    assert figures["lost_eventbus"] == len(on_the_bus)
    assert figures["events_lost"] == len([p for p in pushes if not p["workflows"]])
    assert figures["workflows_created"] == len([p for p in pushes if p["workflows"]])
    # each event the Sensor took again met its app's Workflow, settled at once: no 409
    again = sum(p["taken"] - 1 for p in sent if p["taken"] > 1)
    assert again > 0
    assert figures["redelivered"] == again
    assert figures["workflows_existing"] == again
    assert figures["workflows_refused_409"] == 0
    # the last pushes were healed by nothing but the reconciler: its first pass found
    # work, its last found every app current (the bench stops there, or at MAX_PASSES)
    assert figures["drifted_before"] > 0
    states = figures["reconcile_states"]
    assert len(states) == figures["reconcile_passes"]
    assert states[0].get("ok", 0) < APPS
    assert states[-1] == {"ok": APPS}
    # nothing built twice, nothing rolled back, every app current at the end
    assert figures["duplicate_builds"] == 0
    assert figures["rollbacks"] == 0
    assert figures["drifted_after"] == 0
    assert figures["requests_per_app_per_pass"] > 0
