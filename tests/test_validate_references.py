"""`fabrique validate` refuses what a controller would: names one document gives another
(templates, tasks, ServiceAccounts, Roles) that the tree does not hold. Each test breaks
one reference in a copy of the rendered tree."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import ROOT, run_cli

Doc = dict[str, Any]


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    copy = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", copy)
    return copy


def _edit(path: Path, edit: Callable[[list[Doc]], None]) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    edit(docs)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def _validate(tree: Path, specs: Path, *extra: str):  # type: ignore[no-untyped-def]
    return run_cli("validate", str(tree), "--specs", str(specs), *extra)


def _steps_template(spec: Doc) -> tuple[int, Doc]:
    """The entrypoint's Steps template (others, like the exit handler, are called)."""
    return next(
        (i, t)
        for i, t in enumerate(spec["templates"])
        if "steps" in t and t["name"] in (spec["entrypoint"], "main")
    )


def _problems(result: Any) -> list[str]:
    return [
        line for line in result.stderr.splitlines() if not line.startswith(("error:", "notice:"))
    ]


def test_the_rendered_tree_refers_only_to_what_it_holds(tree: Path, specs: Path) -> None:
    result = _validate(tree, specs)
    assert result.exit_code == 0, result.stderr


def test_a_step_naming_a_missing_template(tree: Path, specs: Path) -> None:
    index: list[int] = []

    def misname(docs: list[Doc]) -> None:
        i, steps = _steps_template(docs[0]["spec"])
        index.append(i)
        steps["steps"][0][0]["template"] = "rn"

    _edit(tree / "build" / "workflowtemplate.yaml", misname)
    result = _validate(tree, specs)
    assert result.exit_code == 6
    assert _problems(result) == [
        "build/workflowtemplate.yaml: document 0 (WorkflowTemplate/fabrique-build): "
        f"spec.templates[{index[0]}].steps[0][0].template: "
        "template 'rn' is not a template of this WorkflowTemplate"
    ]


def test_a_cron_step_and_an_entrypoint_naming_missing_templates(tree: Path, specs: Path) -> None:
    def misname(docs: list[Doc]) -> None:
        spec = docs[0]["spec"]["workflowSpec"]
        spec["entrypoint"] = "man"
        _, steps = _steps_template(spec)
        steps["steps"][0][0]["template"] = "reconcil"

    _edit(tree / "reconcile" / "cronworkflow-fabrique-reconcile.yaml", misname)
    problems = _problems(_validate(tree, specs))
    assert len(problems) == 2, problems
    assert "spec.workflowSpec.entrypoint: entrypoint 'man' is not a template" in problems[0]
    assert "template 'reconcil' is not a template of this CronWorkflow" in problems[1]


def test_a_template_ref_to_a_missing_template(tree: Path, specs: Path) -> None:
    def refer(template: str, name: str = "fabrique-build") -> Callable[[list[Doc]], None]:
        def edit(docs: list[Doc]) -> None:
            _, steps = _steps_template(docs[0]["spec"])
            step = steps["steps"][0][0]
            del step["template"]
            step["templateRef"] = {"name": name, "template": template}

        return edit

    template = tree / "build" / "workflowtemplate.yaml"
    original = template.read_text()
    _edit(template, refer("run"))
    assert _validate(tree, specs).exit_code == 0, "a template of the tree's WorkflowTemplate"
    template.write_text(original)
    _edit(template, refer("nope"))
    result = _validate(tree, specs)
    assert result.exit_code == 6
    assert "templateRef.template: WorkflowTemplate 'fabrique-build' has no template 'nope'" in (
        result.stderr
    )
    template.write_text(original)
    _edit(template, refer("main", name="elsewhere"))
    result = _validate(tree, specs)
    assert result.exit_code == 6
    assert "WorkflowTemplate 'elsewhere' is not in the tree" in result.stderr
    declared = _validate(tree, specs, "--external", "WorkflowTemplate/fabrique-build/elsewhere")
    assert declared.exit_code == 0, declared.stderr


def test_a_dag_depending_on_no_task(tree: Path, specs: Path) -> None:
    def add_dag(docs: list[Doc]) -> None:
        docs[0]["spec"]["templates"].append(
            {
                "name": "as-a-dag",
                "dag": {
                    "tasks": [
                        {"name": "plan", "template": "run"},
                        {"name": "checkout", "template": "run", "dependencies": ["plan"]},
                        {"name": "build", "template": "run", "dependencies": ["chekout"]},
                        {"name": "verify", "template": "run", "depends": "build && pln"},
                    ]
                },
            }
        )

    _edit(tree / "build" / "workflowtemplate.yaml", add_dag)
    problems = _problems(_validate(tree, specs))
    assert len(problems) == 2, problems
    assert problems[0].endswith(
        ".dag.tasks[2].dependencies[0]: 'chekout' is not a task of this DAG"
    )
    assert problems[1].endswith(".dag.tasks[3].depends: 'pln' is not a task of this DAG")


def test_a_service_account_the_tree_does_not_hold(tree: Path, specs: Path) -> None:
    def misname(docs: list[Doc]) -> None:
        docs[0]["spec"]["serviceAccountName"] = "fabrique-bild"

    _edit(tree / "build" / "workflowtemplate.yaml", misname)
    _edit(
        tree / "events" / "sensor.yaml",
        lambda docs: docs[0]["spec"]["template"].update(serviceAccountName="sensor"),
    )
    result = _validate(tree, specs)
    assert result.exit_code == 6
    problems = _problems(result)
    assert problems == [
        "build/workflowtemplate.yaml: document 0 (WorkflowTemplate/fabrique-build): "
        "spec.serviceAccountName: ServiceAccount 'fabrique-bild' is not in the tree (in "
        "namespace fabrique-build; declare it with --external "
        "ServiceAccount/fabrique-build/fabrique-bild)",
        "events/sensor.yaml: document 0 (Sensor/fabrique-build): spec.template."
        "serviceAccountName: ServiceAccount 'sensor' is not in the tree (in namespace "
        "fabrique; declare it with --external ServiceAccount/fabrique/sensor)",
    ]
    declared = _validate(
        tree,
        specs,
        "--external",
        "ServiceAccount/fabrique-build/fabrique-bild",
        "--external",
        "ServiceAccount/fabrique/sensor",
    )
    assert declared.exit_code == 0, declared.stderr
    elsewhere = _validate(tree, specs, "--external", "ServiceAccount/fabrique/fabrique-bild")
    assert "'fabrique-bild' is not in the tree" in elsewhere.stderr, "another namespace's"


def test_a_role_binding_to_a_missing_role(tree: Path, specs: Path) -> None:
    def misname(docs: list[Doc]) -> None:
        binding = next(d for d in docs if d["kind"] == "RoleBinding")
        binding["roleRef"]["name"] = "fabrique-reconciler-gone"

    _edit(tree / "reconcile" / "rbac.yaml", misname)
    result = _validate(tree, specs)
    assert result.exit_code == 6
    (problem,) = _problems(result)
    assert problem.startswith(
        "reconcile/rbac.yaml: document 2 (RoleBinding/fabrique-reconciler-create-workflows):"
    )
    assert problem.endswith(
        "roleRef.name: Role 'fabrique-reconciler-gone' is not in the tree (in namespace "
        "fabrique-build; declare it with --external Role/fabrique-build/fabrique-reconciler-gone)"
    )


def test_a_bad_external_is_named(tree: Path, specs: Path) -> None:
    result = _validate(tree, specs, "--external", "fabrique-build")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --external 'fabrique-build': must be Kind/")
