"""A short run of the event path's scale bench (``bench/event_path_scale.py``), as a
person runs it, at a few apps: what each kind of push costs on the real Gitea, Argo
Events and API server, asserted on what the bench reports.

The figures at 10, 200 and 1 000 apps are in ``bench/RESULTS.md``; this run holds the
bench and the event path to their rules at a size the suite can afford (about a minute)."""

from __future__ import annotations

import json

from ..conftest import run_bench
from .fixtures import need_go

APPS = 3


def test_a_push_costs_the_workflows_of_the_apps_it_touches_and_a_replay_costs_none() -> None:
    need_go()
    result = run_bench("event_path_scale.py", "--apps", f"{APPS}", "--json", timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]
    (size,) = json.loads(result.stdout)
    assert (size["apps"], size["sensors"]) == (APPS, 1)
    scenarios = {s["name"]: s for s in size["scenarios"]}
    assert list(scenarios) == ["one app", "no app", "test delivery", "replay"]
    # one app's push: its Workflow, and the first pod the Argo controller makes for it
    one = scenarios["one app"]
    assert (one["workflows"], one["pods"]) == (1, 1), one
    assert one["to_workflow"] is not None
    # a push beside every app, Gitea's test delivery, the first push's delivery replayed:
    # no Workflow, no pod, and the Sensor took and acked each without waiting out a
    # trigger's tries (a minute of them, were a replay met by 409)
    for name in ("no app", "test delivery", "replay"):
        scenario = scenarios[name]
        assert (scenario["workflows"], scenario["pods"]) == (0, 0), scenario
        assert scenario["to_settled"] < 30, scenario
