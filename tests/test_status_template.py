"""The commit statuses as the rendered fabrique-build template makes them.

The report steps' commands are taken from the rendered template, their Argo variables
substituted the way the controller would, and run for real against the Gitea double. An
invariant walks every path through the template (each step succeeding or failing, the
plan building or skipping) and counts the terminal status calls: exactly one each time.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fabrique.validate import Schemas

from .conftest import GITEA_TOKEN, ROOT, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .manifests import find

TREE = ROOT / "manifests"
REPO = "atlas/atlas"
CONTEXT = "fabrique/citation"
DIGEST = "sha256:" + "e" * 64
TERMINAL = {"success", "skipped", "failure"}
WHEN = re.compile(r"^(\{\{[a-z.-]+\}\}) (==|!=) ([A-Za-z]+)$")


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return find(TREE, "WorkflowTemplate", "fabrique-build")


def _templates(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in template["spec"]["templates"]}


# ------------------------------------------------------------ the strict schema


def test_the_exit_handler_and_the_metrics_pass_the_strict_schema(
    template: dict[str, Any], specs: Path
) -> None:
    validator = Schemas(specs).validator("argoproj.io/v1alpha1", "WorkflowTemplate")
    assert validator is not None
    assert list(validator.iter_errors(template)) == []
    templates = _templates(template)
    assert template["spec"]["onExit"] == "exit-handler"
    assert templates["exit-handler"]["steps"] == [
        [
            {
                "name": "report-failure",
                "template": "report-failure",
                "when": "{{workflow.status}} != Succeeded",
                "continueOn": {"error": True, "failed": True},
            }
        ]
    ]
    # each counted on the Steps template around its retried step: once per run
    assert [m["name"] for m in templates["build-once"]["metrics"]["prometheus"]] == [
        "fabrique_build_duration_seconds"
    ]
    for name in ("write-back-once", "report-success-once"):
        assert [m["name"] for m in templates[name]["metrics"]["prometheus"]] == [
            "fabrique_writeback_total"
        ]
    assert not [t["name"] for t in templates.values() if "retryStrategy" in t and "metrics" in t]
    # the same check fails on a misspelled metric field: it is not a check that cannot fail
    broken = copy.deepcopy(template)
    metric = next(t for t in broken["spec"]["templates"] if t["name"] == "build-once")["metrics"]
    metric["prometheus"][0]["histogram"]["bucket"] = [1.0]
    assert any("bucket" in e.message for e in validator.iter_errors(broken))


def test_metrics_follow_prometheus_rules(template: dict[str, Any]) -> None:
    metrics = [
        metric
        for t in template["spec"]["templates"]
        for metric in (t.get("metrics") or {}).get("prometheus", [])
    ]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for metric in metrics:
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", metric["name"]), metric["name"]
        by_name.setdefault(metric["name"], []).append(metric)
    for name, same in by_name.items():
        # one help, one type and one label set per name, or the controller refuses it
        assert len({m["help"] for m in same}) == 1, name
        assert (
            len({tuple(k for k in m if k in ("counter", "gauge", "histogram")) for m in same}) == 1
        )
        assert len({tuple(label["key"] for label in m["labels"]) for m in same}) == 1, name
    build = by_name["fabrique_build_duration_seconds"][0]
    assert build["histogram"]["value"] == "{{duration}}"
    assert build["histogram"]["buckets"] == sorted(build["histogram"]["buckets"])
    assert {"key": "app", "value": "{{workflow.parameters.app}}"} in build["labels"]
    # a failed run has no outputs: no label of a metric that counts failures may need one
    # (the controller resolves every label before the `when`, and a MetricsError follows)
    outcomes = by_name["fabrique_writeback_total"]
    assert [m.get("when") for m in outcomes] == ["{{status}} != Succeeded", None]
    for metric in metrics:
        assert "outputs." not in json.dumps(metric), metric["name"]


def test_every_container_step_reports_its_log_tail_on_error(template: dict[str, Any]) -> None:
    for name, t in _templates(template).items():
        if "container" in t:
            assert t["container"]["terminationMessagePolicy"] == "FallbackToLogsOnError", name


# --------------------------------------------------- every path, one terminal call


def _evaluate(when: str | None, values: dict[str, str]) -> bool:
    if when is None:
        return True
    match = WHEN.match(when)
    assert match, f"a when this walk cannot read: {when!r}"
    left = values[match[1]]
    return (left == match[3]) == (match[2] == "==")


def _kind(templates: dict[str, dict[str, Any]], step: dict[str, Any]) -> str | None:
    called = templates[step["template"]]
    if "steps" in called:  # a `<step>-once` around the step itself
        [[inner]] = called["steps"]
        return _kind(templates, inner)
    args = called.get("container", {}).get("args", [])
    return args[1] if args[:1] == ["status-report"] else None


def _walk(
    template: dict[str, Any], build: str, failing: str | None
) -> tuple[list[str], str, list[str]]:
    """Run the template in the mind: (status calls, workflow status, steps that ran)."""
    templates = _templates(template)
    values = {"{{steps.plan.outputs.parameters.build}}": build}
    calls: list[str] = []
    ran: list[str] = []
    status = "Succeeded"
    for group in templates[template["spec"]["entrypoint"]]["steps"]:
        failed_here = False
        for step in group:
            if not _evaluate(step.get("when"), values):
                continue
            ran.append(step["name"])
            if kind := _kind(templates, step):
                calls.append(kind)  # attempted, whether or not its pod then fails
            if step["name"] == failing and "continueOn" not in step:
                failed_here = True
        if failed_here:
            status = "Failed"
            break
    values["{{workflow.status}}"] = status
    for group in templates[template["spec"]["onExit"]]["steps"]:
        for step in group:
            if _evaluate(step.get("when"), values) and (kind := _kind(templates, step)):
                calls.append(kind)
    return calls, status, ran


def test_every_path_ends_with_exactly_one_terminal_status(template: dict[str, Any]) -> None:
    templates = _templates(template)
    steps = [s["name"] for group in templates["main"]["steps"] for s in group]
    paths = 0
    for build, failing in itertools.product(("true", "false"), [None, *steps]):
        calls, status, ran = _walk(template, build, failing)
        if failing is not None and failing not in ran:
            continue  # that step does not run on this path
        paths += 1
        terminal = [c for c in calls if c in TERMINAL]
        assert len(terminal) == 1, (build, failing, calls)
        if status == "Failed":
            assert terminal == ["failure"], (build, failing, calls)
        else:
            assert terminal == (["success"] if build == "true" else ["skipped"]), (failing, calls)
        # pending comes first, and only when something is built
        assert calls[:1] == (["pending"] if build == "true" and failing != "plan" else calls[:1])
        assert calls.count("pending") == (1 if build == "true" and failing != "plan" else 0)
    # plan, each step of the build, each report step: every one was walked
    assert paths >= len(steps) + 2


def test_a_failing_report_step_never_fails_the_build(template: dict[str, Any]) -> None:
    for name in ("report-pending", "report-success"):
        calls, status, _ = _walk(template, "true", name)
        assert status == "Succeeded" and "failure" not in calls, name


# ------------------------------------------- the steps' own commands, for real


def _run_step(
    template: dict[str, Any],
    name: str,
    *,
    values: Path,
    tmp: Path,
    variables: dict[str, str],
) -> Any:
    """Run the container of template ``name`` as Argo would, in-process."""
    container = _templates(template)[name]["container"]
    assert container["command"] == ["fabrique"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "FABRIQUE_GITEA_TOKEN" in env and env["FABRIQUE_GITEA_TOKEN"] is None, (
        "the token comes from the Secret, never from a value"
    )
    args = []
    for arg in container["args"]:
        arg = arg.replace("/tmp/fabrique", str(tmp))
        for variable, value in variables.items():
            arg = arg.replace(variable, value)
        assert "{{" not in arg, f"{name}: {arg} left unsubstituted"
        args.append(arg)
    return run_cli("--values", str(values), *args, env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN})


def _globals(revision: str) -> dict[str, str]:
    return {
        "{{workflow.parameters.app}}": "citation",
        "{{workflow.parameters.revision}}": revision,
        "{{workflow.parameters.force}}": "false",
        "{{workflow.name}}": f"fabrique-citation-{revision[:12]}",
    }


def _history(gitea: GiteaDouble, revision: str) -> list[tuple[str, str, str]]:
    return [
        (s["status"], s["description"], s["target_url"])
        for s in gitea.statuses.get((REPO, revision), [])
        if s["context"] == CONTEXT
    ]


def _combined_state(gitea: GiteaDouble, revision: str) -> str:
    return gitea.combine([s["status"] for s in gitea.latest_statuses(REPO, revision)])


def _success_path(template: dict[str, Any], values: Path, tmp: Path, revision: str) -> list[Any]:
    """plan, report-pending, write-back and report-success, each as its step runs it."""
    variables = _globals(revision)
    plan = _run_step(template, "plan", values=values, tmp=tmp, variables=variables)
    assert plan.exit_code == 0, plan.stderr
    assert (tmp / "plan" / "build").read_text() == "true"
    pending = _run_step(template, "report-pending", values=values, tmp=tmp, variables=variables)
    variables["{{inputs.parameters.digest}}"] = DIGEST
    written = _run_step(template, "write-back", values=values, tmp=tmp, variables=variables)
    assert written.exit_code == 0, written.stderr
    variables["{{inputs.parameters.outcome}}"] = (tmp / "writeback" / "outcome").read_text()
    variables["{{inputs.parameters.commit}}"] = (tmp / "writeback" / "commit").read_text()
    success = _run_step(template, "report-success", values=values, tmp=tmp, variables=variables)
    return [plan, pending, written, success]


@pytest.fixture()
def values(tmp_path: Path, gitea: GiteaDouble) -> Path:
    return write_values(
        tmp_path / "site.yaml",
        **{"gitea.url": gitea.url, "argoServer.url": "https://argo.example.org"},
    )


def test_pending_then_success_as_the_steps_run(
    template: dict[str, Any], values: Path, tmp_path: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    results = _success_path(template, values, tmp_path, revision)
    assert all(r.exit_code == 0 for r in results)
    commit = (tmp_path / "writeback" / "commit").read_text()
    assert commit == code_repo.head()
    url = f"https://argo.example.org/workflows/fabrique-build/fabrique-citation-{revision[:12]}"
    assert _history(gitea, revision) == [
        ("pending", f"building citation-dagster:{revision[:12]}", url),
        ("success", f"deployed {DIGEST}; changed, commit {commit[:12]}", url),
    ]
    assert _combined_state(gitea, revision) == "success"
    output = "".join(r.stdout + r.stderr for r in results)
    assert GITEA_TOKEN not in output


def test_a_replayed_workflow_posts_no_confusing_duplicate(
    template: dict[str, Any], values: Path, tmp_path: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    _success_path(template, values, tmp_path / "first", revision)
    first = _history(gitea, revision)
    # the replay (the Workflow deleted and submitted with force=true): the write-back
    # finds the digest already there and says unchanged; its report step runs twice
    (tmp_path / "replay").mkdir()
    variables = _globals(revision) | {
        "{{inputs.parameters.digest}}": DIGEST,
        "{{inputs.parameters.outcome}}": "unchanged",
        "{{inputs.parameters.commit}}": "",
    }
    for step in ("report-pending", "write-back", "report-success", "report-success"):
        result = _run_step(
            template, step, values=values, tmp=tmp_path / "replay", variables=variables
        )
        assert result.exit_code == 0, result.stderr
    history = _history(gitea, revision)
    assert history[: len(first)] == first
    assert [state for state, _, _ in history[len(first) :]] == ["pending", "success"]
    assert history[-1][1] == f"{DIGEST} already deployed; unchanged"
    assert _combined_state(gitea, revision) == "success"


def test_pending_then_failure_from_the_exit_handler_names_the_step(
    template: dict[str, Any], values: Path, tmp_path: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    variables = _globals(revision)
    _run_step(template, "report-pending", values=values, tmp=tmp_path, variables=variables)
    workflow = variables["{{workflow.name}}"]
    nodes = [
        {"displayName": workflow, "message": "child failed", "templateName": "main",
         "phase": "Failed", "podName": workflow, "finishedAt": "2026-12-02T10:00:09Z"},
        {"displayName": "verify-digest", "message": "No more retries left",
         "templateName": "verify-digest", "phase": "Failed", "podName": "p",
         "finishedAt": "2026-12-02T10:00:08Z"},
        {"displayName": "verify-digest(0)", "templateName": "verify-digest", "phase": "Failed",
         "message": "INFO fabrique: verify\nerror: citation-dagster:x: the build pushed "
                    "sha256:a but the registry holds sha256:b",
         "podName": "p0", "finishedAt": "2026-12-02T10:00:07Z"},
    ]  # fmt: skip
    # {{workflow.failures}} as the controller substitutes it: strconv.Quote of the list
    variables["{{workflow.failures}}"] = json.dumps(json.dumps(nodes))
    variables["{{workflow.status}}"] = "Failed"
    result = _run_step(template, "report-failure", values=values, tmp=tmp_path, variables=variables)
    assert result.exit_code == 0, result.stderr
    assert [(s, d) for s, d, _ in _history(gitea, revision)] == [
        ("pending", f"building citation-dagster:{revision[:12]}"),
        (
            "failure",
            "verify-digest: citation-dagster:x: the build pushed sha256:a but the registry "
            "holds sha256:b",
        ),
    ]
    assert _combined_state(gitea, revision) == "failure"


def test_a_skipped_plan_reports_no_change_as_the_steps_run(
    template: dict[str, Any], values: Path, tmp_path: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    revision = code_repo.head()  # the step runs when the plan says build=false
    variables = _globals(revision)
    result = _run_step(template, "report-skipped", values=values, tmp=tmp_path, variables=variables)
    assert result.exit_code == 0, result.stderr
    assert [(s, d) for s, d, _ in _history(gitea, revision)] == [
        ("success", "no change under dataops/citation-dagster")
    ]
