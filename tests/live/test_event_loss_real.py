"""A short run of the fault bench's real mode (``bench/event_loss.py --real``), its rules
asserted on what the bench observed: a real Gitea, control plane, EventBus, EventSource
and Sensor lose events in each of their ways, and the reconciler makes every app
converge anyway.

The bench starts its own plane and Gitea, in a process of its own, as a person runs it
(about a minute and a half).
For each push it reports what it did to the delivery (``fate``), every answer Gitea's
deliveries of it got, and which apps' Workflows exist at its commit once the event path
settled, before the reconciler acts: a loss is a push of which no Workflow came."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from ..conftest import run_bench
from .fixtures import need_go

APPS, PUSHES, OUTAGE, MAX_PASSES = 3, 10, 2, 6
RESTART = PUSHES // 2  # the push made right after the bus's restart


def test_the_real_event_path_loses_events_and_the_reconciler_converges_without_duplicates() -> None:
    need_go()
    result = run_bench(
        "event_loss.py",
        "--real",
        *("--apps", str(APPS), "--pushes", str(PUSHES), "--outage", str(OUTAGE)),
        *("--drop", "0.2", "--redeliver", "1", "--max-passes", str(MAX_PASSES), "--json"),
        timeout=480,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    holds(json.loads(result.stdout))


def holds(figures: dict[str, Any]) -> None:
    pushes = figures["pushes"]
    assert [p["index"] for p in pushes] == list(range(PUSHES))
    assert figures["events_sent"] == PUSHES
    # the proxy lost some on the way (502), Gitea never delivered them again, and no
    # Workflow of any app came of them
    dropped = [p for p in pushes if p["fate"] == "dropped"]
    assert dropped
    for push in dropped:
        assert (push["answers"], push["workflows"]) == ([502], []), push
    # the killed EventSource: its Service answered 503 to each of the last pushes, Gitea
    # never delivered them again, no Workflow came of them
    outage = [p for p in pushes if p["fate"] == "outage"]
    assert [p["index"] for p in outage] == list(range(PUSHES - OUTAGE, PUSHES))
    for push in outage:
        assert (push["answers"], push["workflows"]) == ([503], []), push
    # every other push the EventSource took became the Workflow of the app it touched,
    # and of no other; the one made at the bus's restart, if answered before the
    # EventSource reconnected, was answered 500 and lost
    sent = [p for p in pushes if p["fate"] == "sent"]
    restart = pushes[RESTART]
    assert restart["fate"] == "sent", "the push at the restart must reach the EventSource"
    for push in sent:
        if push["answers"][0] == 200:
            assert push["workflows"] == [push["app"]], push
        else:
            assert push is restart, push
            assert push["answers"][0] == 500, push
            # the EventSource's answer when its dispatch to the bus failed (webhook.go)
            assert "failed to record event" in push["said"], push
            assert push["workflows"] == [], push
    if restart["reconnected"] is False:  # answered before the EventSource reconnected
        assert restart["answers"][0] == 500, restart
    # the bench's counts of losses are these observations
    assert figures["lost_webhook"] == len(dropped)
    assert figures["lost_outage"] == OUTAGE
    assert figures["lost_eventbus"] == len([p for p in sent if not p["workflows"]])
    assert figures["events_lost"] == len([p for p in pushes if not p["workflows"]])
    assert figures["eventsource_answers"] == Counter(str(p["answers"][0]) for p in pushes)
    assert figures["gitea_retried"] == 0
    # the bus came back from its claim with every message and the Sensor's one consumer
    # (one trigger, one dependency, whatever the apps)
    assert figures["bus_messages_after_restart"] == figures["bus_messages_before_restart"] > 0
    assert figures["bus_consumers_after_restart"] == 1
    # Gitea's test delivery of one taken push (its head as both before and after):
    # two deliveries, each answered 200, the one Workflow of its app, no trigger met 409
    assert figures["redelivered"] == 1
    (redelivered,) = [p for p in pushes if len(p["answers"]) > 1]
    assert redelivered["answers"] == [200, 200]
    assert redelivered["workflows"] == [redelivered["app"]]
    assert figures["redeliveries_given_up"] == 0
    assert figures["workflows_refused_409"] == 0
    assert figures["workflows_existing"] == 0  # its files unlisted: no trigger fired
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
