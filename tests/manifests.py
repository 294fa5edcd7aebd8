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
    """The container of step ``name`` of the fabrique-build template rendered for ``site``."""
    from pipelines.build import build_template

    template = build_template(site).to_dict()
    step = next(t for t in template["spec"]["templates"] if t["name"] == name)
    return dict(step["container"])


def step_env(container: dict[str, Any], revision: str, inputs: dict[str, str]) -> dict[str, str]:
    """The container's environment as Argo fills it in (secrets left out)."""
    env = {}
    for item in container["env"]:
        if "value" not in item:
            continue
        value = item["value"].replace("{{workflow.parameters.revision}}", revision)
        for name, input_value in inputs.items():
            value = value.replace(f"{{{{inputs.parameters.{name}}}}}", input_value)
        env[item["name"]] = value
    return env
