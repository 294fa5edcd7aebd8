"""The commit statuses as the rendered fabrique-build template makes them.

The containers' scripts are taken from the rendered template, their Argo variables
substituted the way the controller would, and run for real: with the real ``fabrique``
against the Gitea double, and, to walk every path through the pod (each container
succeeding or failing, the plan building or skipping), with a fake that counts the
terminal status calls: exactly one each time.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fabrique.validate import Schemas

from .conftest import GITEA_TOKEN, ROOT, Repo, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import argo_status, workflow_failures
from .manifests import find
from .test_step_scripts import _run_stage

TREE = ROOT / "manifests"
REPO = "atlas/atlas"
CONTEXT = "fabrique/citation"
DIGEST = "sha256:" + "e" * 64
TERMINAL = {"success", "skipped", "failure"}
WHEN = re.compile(r"^(\{\{[a-z.-]+\}\}) (==|!=) ([A-Za-z]+)$")
OUTCOME = "{{workflow.outputs.parameters.writeback-outcome}}"


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return find(TREE, "WorkflowTemplate", "fabrique-build")


def _templates(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in template["spec"]["templates"]}


def _containers(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The build pod's containers, in the order they are listed (and run)."""
    return {c["name"]: c for c in _templates(template)["run"]["containerSet"]["containers"]}


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
    # each counted once per run: the build's duration on build around the retried pod (not
    # main: the verification after it is no build time), the write-back's outcome by the
    # exit handler
    assert "metrics" not in templates["main"]
    assert [m["name"] for m in templates["build"]["metrics"]["prometheus"]] == [
        "fabrique_build_duration_seconds"
    ]
    assert [m["name"] for m in templates["exit-handler"]["metrics"]["prometheus"]] == [
        "fabrique_writeback_total"
    ]
    assert not [t["name"] for t in templates.values() if "retryStrategy" in t and "metrics" in t]
    # the same check fails on a misspelled metric field: it is not a check that cannot fail
    broken = copy.deepcopy(template)
    metric = next(t for t in broken["spec"]["templates"] if t["name"] == "build")["metrics"]
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
    assert build["labels"] == [
        {"key": "app", "value": "{{workflow.parameters.app}}"},
        {"key": "status", "value": "{{status}}"},
    ]
    (outcomes,) = by_name["fabrique_writeback_total"]
    assert outcomes["labels"] == [
        {"key": "app", "value": "{{workflow.parameters.app}}"},
        {"key": "outcome", "value": OUTCOME},
    ]
    # a run whose write-back never ran counts nothing
    assert outcomes["when"] == f"{OUTCOME} != none"


def test_the_metrics_read_only_what_argo_resolves(template: dict[str, Any]) -> None:
    """The controller resolves every variable of a metric before its ``when``; one it
    cannot resolve is a MetricsError and no metric. The duration's are the node's own
    ({{status}}, {{duration}}); the outcome's is the Workflow's output, which the pod's
    ``outcome`` sets whatever became of the write-back (its default when it did not run)."""
    variables = {
        t["name"]: set(re.findall(r"\{\{[^}]+\}\}", json.dumps(t["metrics"])))
        for t in template["spec"]["templates"]
        if "metrics" in t
    }
    assert variables == {
        "build": {"{{workflow.parameters.app}}", "{{status}}", "{{duration}}"},
        "exit-handler": {"{{workflow.parameters.app}}", OUTCOME},
    }
    (outcome,) = [
        p for p in _templates(template)["run"]["outputs"]["parameters"] if p.get("globalName")
    ]
    assert outcome["globalName"] == "writeback-outcome"
    assert outcome["valueFrom"]["default"] == "none"


def test_every_container_reports_its_log_tail_on_error(template: dict[str, Any]) -> None:
    containers = list(_containers(template).items()) + [
        (name, t["container"]) for name, t in _templates(template).items() if "container" in t
    ]
    assert len(containers) == len(_containers(template)) + 1  # and report-failure
    for name, container in containers:
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError", name


# --------------------------------------------------- every path, one terminal call


def _evaluate(when: str | None, values: dict[str, str]) -> bool:
    if when is None:
        return True
    match = WHEN.match(when)
    assert match, f"a when this walk cannot read: {when!r}"
    left = values[match[1]]
    return (left == match[3]) == (match[2] == "==")


def _walk(
    template: dict[str, Any], tmp: Path, build: str, failing: str | None
) -> tuple[list[str], str, list[str]]:
    """Run the pod's containers as Argo's executor does, each after the one it depends on
    ended well, their command a fake that fails in ``failing`` alone; then the exit
    handler: (status calls, workflow status, containers whose command ran)."""
    exits: dict[str, int] = {}
    calls: list[str] = []
    ran: list[str] = []
    for name, container in _containers(template).items():
        if any(exits[after] != 0 for after in container.get("dependencies") or []):
            exits[name] = 64  # never run: Argo's executor ends it
            continue
        code = 3 if name == failing else 0
        (tmp / name).mkdir(parents=True)
        result, called = _run_stage(tmp / name, name, (code,), build=build)
        exits[name] = result.returncode
        ran += [name] if called else []
        calls += [c.split()[2] for c in called if c.startswith("fabrique status-report ")]
    status = "Failed" if any(exits.values()) else "Succeeded"
    values = {"{{workflow.status}}": status}
    templates = _templates(template)
    for group in templates[template["spec"]["onExit"]]["steps"]:
        for step in group:
            if _evaluate(step.get("when"), values):
                args = templates[step["template"]]["container"]["args"]
                calls += [args[1]] if args[0] == "status-report" else []
    return calls, status, ran


def test_every_path_ends_with_exactly_one_terminal_status(
    template: dict[str, Any], tmp_path: Path
) -> None:
    paths = 0
    for build, failing in itertools.product(("true", "false"), [None, *_containers(template)]):
        calls, status, ran = _walk(template, tmp_path / f"{build}-{failing}", build, failing)
        if failing is not None and failing not in ran:
            continue  # that container's command does not run on this path
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
    # the plan, each container of the build, each report: every one was walked
    assert paths >= len(_containers(template)) + 2


def test_a_failing_report_never_fails_the_build(template: dict[str, Any], tmp_path: Path) -> None:
    for name in ("report-pending", "main"):
        calls, status, _ = _walk(template, tmp_path / name, "true", name)
        assert status == "Succeeded" and "failure" not in calls, name


# ------------------------------------------- the containers' own commands, for real


def _run(
    template: dict[str, Any],
    name: str,
    *,
    values: Path,
    tmp: Path,
    variables: dict[str, str],
) -> subprocess.CompletedProcess[str]:
    """Run container ``name`` of the build pod, or the exit handler's report, as Argo
    would: its command, with the real ``fabrique``, the pod's folders under ``tmp``."""
    container = _containers(template).get(name) or _templates(template)[name]["container"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "FABRIQUE_GITEA_TOKEN" in env and env["FABRIQUE_GITEA_TOKEN"] is None, (
        "the token comes from the Secret, never from a value"
    )

    def filled(text: str) -> str:
        text = text.replace("/fabrique/", f"{tmp}/fabrique/")
        for variable, value in variables.items():
            text = text.replace(variable, value)
        assert "{{" not in text, f"{name}: {text} left unsubstituted"
        return text

    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "fabrique").write_text(f'#!/bin/sh\nexec {sys.executable} -m fabrique "$@"\n')
    (bin_dir / "fabrique").chmod(0o755)
    for folder in ("plan", "verified"):
        (tmp / "fabrique" / folder).mkdir(parents=True, exist_ok=True)
    command = container["command"][:3] + [filled(a) for a in container["command"][3:]]
    return subprocess.run(
        [*command, *(filled(a) for a in container.get("args", []))],
        env={k: filled(v) for k, v in env.items() if v is not None}
        | {k: v for k, v in os.environ.items() if k.startswith("FABRIQUE_")}
        | {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),
            "FABRIQUE_VALUES": str(values),
            "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
            "BACKOFF_SECONDS": "0",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _globals(revision: str) -> dict[str, str]:
    return {
        "{{workflow.parameters.app}}": "citation",
        "{{workflow.parameters.revision}}": revision,
        "{{workflow.parameters.force}}": "false",
        "{{workflow.parameters.group}}": "",  # a build of its own, not a push's group
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


def _success_path(
    template: dict[str, Any], values: Path, tmp: Path, revision: str
) -> list[subprocess.CompletedProcess[str]]:
    """plan, report-pending, write-back and main, each as its container runs it; the
    digest as verify-digest leaves it."""
    variables = _globals(revision)
    plan = _run(template, "plan", values=values, tmp=tmp, variables=variables)
    assert plan.returncode == 0, plan.stderr
    assert (tmp / "fabrique" / "plan" / "build").read_text() == "true"
    pending = _run(template, "report-pending", values=values, tmp=tmp, variables=variables)
    (tmp / "fabrique" / "verified" / "digest").write_text(DIGEST)
    written = _run(template, "write-back", values=values, tmp=tmp, variables=variables)
    assert written.returncode == 0, written.stderr
    success = _run(template, "main", values=values, tmp=tmp, variables=variables)
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
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    writeback = tmp_path / "fabrique" / "verified" / "writeback"
    assert (writeback / "outcome").read_text() == "changed"
    commit = (writeback / "commit").read_text()
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
    # finds the digest already there and says unchanged; main runs twice
    replay = tmp_path / "replay"
    (replay / "fabrique" / "plan").mkdir(parents=True)
    (replay / "fabrique" / "plan" / "build").write_text("true")
    (replay / "fabrique" / "verified").mkdir(parents=True)
    (replay / "fabrique" / "verified" / "digest").write_text(DIGEST)
    for name in ("report-pending", "write-back", "main", "main"):
        result = _run(template, name, values=values, tmp=replay, variables=_globals(revision))
        assert result.returncode == 0, result.stderr
    assert (replay / "fabrique" / "verified" / "writeback" / "outcome").read_text() == "unchanged"
    history = _history(gitea, revision)
    assert history[: len(first)] == first
    assert [state for state, _, _ in history[len(first) :]] == ["pending", "success"]
    assert history[-1][1] == f"{DIGEST} already deployed; unchanged"
    assert _combined_state(gitea, revision) == "success"


def test_pending_then_failure_from_the_exit_handler_names_the_container(
    template: dict[str, Any], values: Path, tmp_path: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    variables = _globals(revision)
    (tmp_path / "fabrique" / "plan").mkdir(parents=True)
    (tmp_path / "fabrique" / "plan" / "build").write_text("true")
    _run(template, "report-pending", values=values, tmp=tmp_path, variables=variables)
    workflow = variables["{{workflow.name}}"]
    status = argo_status(
        {"metadata": {"name": workflow}},
        "Failed",
        failed_step="verify-digest",
        message="INFO fabrique: verify\nerror: citation-dagster:x: the build pushed sha256:a"
        " but the registry holds sha256:b",
    )
    # {{workflow.failures}} as the controller substitutes it: strconv.Quote of the list
    variables["{{workflow.failures}}"] = json.dumps(json.dumps(workflow_failures(status)))
    variables["{{workflow.status}}"] = "Failed"
    result = _run(template, "report-failure", values=values, tmp=tmp_path, variables=variables)
    assert result.returncode == 0, result.stderr
    assert [(s, d) for s, d, _ in _history(gitea, revision)] == [
        ("pending", f"building citation-dagster:{revision[:12]}"),
        (
            "failure",
            "verify-digest: citation-dagster:x: the build pushed sha256:a but the registry "
            "holds sha256:b",
        ),
    ]
    assert _combined_state(gitea, revision) == "failure"


def test_a_skipped_plan_reports_no_change_as_the_containers_run(
    template: dict[str, Any], values: Path, tmp_path: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    revision = code_repo.head()
    variables = _globals(revision)
    plan = tmp_path / "fabrique" / "plan"
    plan.mkdir(parents=True)
    # as the plan leaves them when nothing under the context changed (tests/test_events.py)
    (plan / "build").write_text("false")
    (plan / "reason").write_text("nothing under dataops/citation-dagster changed")
    for name in ("report-pending", "main"):
        result = _run(template, name, values=values, tmp=tmp_path, variables=variables)
        assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("main: nothing to do (")  # no success of its own
    assert [(s, d) for s, d, _ in _history(gitea, revision)] == [
        ("success", "no change under dataops/citation-dagster")
    ]
