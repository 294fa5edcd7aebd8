"""Helpers to read a rendered tree in tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


def load_tree(root: Path) -> dict[str, list[Any]]:
    return {
        str(path.relative_to(root)): [
            d for d in yaml.safe_load_all(path.read_text()) if d is not None
        ]
        for path in sorted(root.rglob("*.yaml"))
    }


def documents(root: Path) -> Iterator[dict[str, Any]]:
    for docs in load_tree(root).values():
        yield from docs


def find(root: Path, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    for doc in documents(root):
        if doc.get("kind") == kind and doc["metadata"]["name"] == name:
            if namespace is None or doc["metadata"].get("namespace") == namespace:
                return doc
    raise AssertionError(f"{kind}/{name} not in {root}")


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, key, value) for every mapping entry in a document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}.{key}", key, value
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}[{index}]")


def rendered_step(site: Any, name: str) -> dict[str, Any]:
    """The container of stage ``name`` of the fabrique-build template rendered for
    ``site``: one of the build pod's containers, or a template's own (the exit
    handler's report)."""
    from pipelines.build import build_template

    template = build_template(site).to_dict()
    for each in template["spec"]["templates"]:
        for container in (each.get("containerSet") or {}).get("containers", []):
            if container["name"] == name:
                return dict(container)
        if each["name"] == name and "container" in each:
            return dict(each["container"])
    raise AssertionError(f"no stage {name} in the fabrique-build template")


def step_env(
    container: dict[str, Any],
    revision: str,
    inputs: dict[str, str],
    plan: Path | None = None,
    group: str = "",
) -> dict[str, str]:
    """The container's environment as Argo fills it in (secrets left out). With ``plan``,
    the plan's files as the ``plan`` stage leaves them for the later ones: ``inputs``,
    ``build`` true, in that folder, which ``PLAN`` then names; a transient failure is
    tried again at once (``BACKOFF_SECONDS``). ``group``: the build's ``group``
    parameter (its default: none)."""
    env = {}
    for item in container["env"]:
        if "value" not in item:
            continue
        value = item["value"].replace("{{workflow.parameters.revision}}", revision)
        value = value.replace("{{workflow.parameters.group}}", group)
        for name, input_value in inputs.items():
            value = value.replace(f"{{{{inputs.parameters.{name}}}}}", input_value)
        env[item["name"]] = value
    if plan is not None:
        plan.mkdir(parents=True, exist_ok=True)
        for name, value in ({"build": "true", "reason": "changed"} | inputs).items():
            (plan / name).write_text(value)
        env |= {"PLAN": str(plan), "BACKOFF_SECONDS": "0"}
    return env
