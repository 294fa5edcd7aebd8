"""A short run of the event path's scale bench (``bench/event_path_scale.py``), as a
person runs it, at a few apps: what each kind of push costs on the real Gitea, Argo
Events and API server, asserted on what the bench reports.

The figures at 10, 1 000 and 10 000 apps are in ``bench/RESULTS.md``; this run holds the
bench and the event path to their rules at a size the suite can afford (about a minute):
two one-app pushes, five seconds idle."""

from __future__ import annotations

import json

from ..conftest import run_bench
from .fixtures import need_go

APPS = 3


def test_a_push_costs_its_push_workflow_and_the_builds_of_the_apps_it_touches() -> None:
    need_go()
    result = run_bench(
        "event_path_scale.py", "--apps", f"{APPS}", "--pushes", "2", "--idle", "5", "--json",
        timeout=420,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (size,) = json.loads(result.stdout)
    # one Sensor, one pod, one consumer: the same at any size
    assert (size["apps"], size["sensors"], size["sensor_pods"], size["consumers"]) == (
        APPS, 1, 1, 1,
    )  # fmt: skip
    assert size["idle"]["seconds"] == 5 and size["idle"]["sensors_rss_mib"] > 0, size["idle"]
    scenarios = [s["name"] for s in size["scenarios"]]
    assert scenarios == ["one app", "one app", "no app", "test delivery", "replay"]

    def made(scenario: dict[str, object]) -> tuple[object, ...]:
        keys = ("push_workflows", "push_pods", "builds", "build_pods")
        return tuple(scenario[key] for key in keys)

    one, other, none, tested, replayed = size["scenarios"]
    # every push of the branch: its push Workflow and that one's pod; a push touching
    # one app, that app's build and the first pod the Argo controller makes for it
    for push in (one, other):
        assert made(push) == (1, 1, 1, 1), push
        assert push["to_build"] is not None
    assert made(none) == (1, 1, 0, 0), none
    # Gitea's test delivery and the first push's delivery replayed: nothing, and the
    # Sensor took and acked each without waiting out a trigger's tries (a minute of
    # them, were a replay met by 409)
    for scenario in (tested, replayed):
        assert made(scenario) == (0, 0, 0, 0), scenario
        assert scenario["to_settled"] < 30, scenario
