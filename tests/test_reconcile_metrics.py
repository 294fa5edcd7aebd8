"""The reconcile decisions counter: the pass writes its counts, the CronWorkflow emits
them as an Argo template metric, validated strictly like every other field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

from fabrique.decisions.reconcile import DECISIONS, DONE, Action
from fabrique.gestures.promote import PASS_STATES
from fabrique.gestures.verify import STATES as VERIFY_STATES
from fabrique.validate import Schemas

from .conftest import ROOT, Repo
from .doubles.kube import KubeApiDouble
from .manifests import find
from .test_reconcile import _reconcile, env, values  # noqa: F401

TREE = ROOT / "manifests"


def test_every_state_a_pass_gives_is_counted() -> None:
    states = {DONE.get(action, action) for action in get_args(Action)}
    # a write-back that finds the app moved on or held, and a check that failed; one
    # through a pull request (writeback.mode: pull-request)
    states |= {"superseded", "held", "error", "proposed"}
    # an environment the safety net promotes into (promote: auto), or that waits for it
    states |= {s for s in PASS_STATES.values() if not s.startswith("would-")} | {"waiting"}
    # an environment a pass verifies after a deploy
    states |= set(VERIFY_STATES)
    assert states == set(DECISIONS)


def test_the_pass_writes_one_count_per_decision(
    tmp_path: Path,
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
) -> None:
    code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    counts = tmp_path / "counts"
    result = _reconcile(values, env, "--counts", str(counts))
    assert result.exit_code == 0, result.stderr
    written = {path.name: path.read_text() for path in counts.iterdir()}
    assert written == {decision: "1" if decision == "submitted" else "0" for decision in DECISIONS}
    # a replay: the Workflow now exists and is Pending
    _reconcile(values, env, "--counts", str(counts))
    assert (counts / "in-flight").read_text() == "1" and (counts / "submitted").read_text() == "0"


def test_the_cron_emits_a_counter_per_decision(specs: Path) -> None:
    cron = find(TREE, "CronWorkflow", "fabrique-reconcile")
    step = next(t for t in cron["spec"]["workflowSpec"]["templates"] if t["name"] == "reconcile")
    assert step["container"]["args"] == ["reconcile", "--counts", "/tmp/fabrique/decisions"]
    assert [p["name"] for p in step["outputs"]["parameters"]] == list(DECISIONS)
    assert all(p["valueFrom"]["default"] == "0" for p in step["outputs"]["parameters"])
    metrics: list[dict[str, Any]] = step["metrics"]["prometheus"]
    assert {m["name"] for m in metrics} == {"fabrique_reconcile_decisions_total"}
    assert len({m["help"] for m in metrics}) == 1
    assert [(m["labels"], m["counter"]["value"]) for m in metrics] == [
        ([{"key": "decision", "value": d}], f"{{{{outputs.parameters.{d}}}}}") for d in DECISIONS
    ]
    validator = Schemas(specs).validator("argoproj.io/v1alpha1", "CronWorkflow")
    assert validator is not None and list(validator.iter_errors(cron)) == []
    broken = copy.deepcopy(cron)
    broken_step = next(
        t for t in broken["spec"]["workflowSpec"]["templates"] if t["name"] == "reconcile"
    )
    broken_step["metrics"]["prometheus"][0]["counter"] = {"increment": "1"}
    assert list(validator.iter_errors(broken)), "a misspelled counter field is refused"
