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
