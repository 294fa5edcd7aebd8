"""``fabrique lint apps DIR``: the Argo CD Applications of a ``cluster/apps`` checkout.

Each Application must validate against the Argo CD CRD (closed: an unknown field is an
error), take its sources from the in-cluster Gitea only (Argo CD never reconciles from
GitHub), and pin every image override by ``@sha256:``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from fabrique.site.config import Site
from fabrique.site.errors import InputError
from fabrique.validate import Schemas, json_path


def _sources(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(spec.get("source"), dict):
        yield "spec.source", spec["source"]
    for index, source in enumerate(spec.get("sources") or []):
        if isinstance(source, dict):
            yield f"spec.sources[{index}]", source


def lint_application(doc: dict[str, Any], site: Site, schemas: Schemas | None) -> Iterator[str]:
    """Every problem of one Application; ``schemas`` None skips the CRD check (no specs)."""
    validator = schemas.validator("argoproj.io/v1alpha1", "Application") if schemas else None
    for error in sorted(
        validator.iter_errors(doc) if validator else [], key=lambda e: list(e.absolute_path)
    ):
        yield f"{json_path(error.absolute_path) or '(document)'}: {error.message}"
    spec: dict[str, Any] = doc["spec"] if isinstance(doc.get("spec"), dict) else {}
    gitea = site.gitea.url.rstrip("/") + "/"
    for where, source in _sources(spec):
        url = str(source.get("repoURL", ""))
        if not url.startswith(gitea):
            yield f"{where}.repoURL: {url!r} is not the in-cluster Gitea ({gitea}…)"
        images = (source.get("kustomize") or {}).get("images") or []
        for index, image in enumerate(images):
            if "@sha256:" not in str(image):
                yield f"{where}.kustomize.images[{index}]: {image!r} is not pinned by @sha256:"


def lint_apps(root: Path, site: Site, specs: Path) -> list[str]:
    if not root.is_dir():
        raise InputError(f"{root}: not a directory")
    schemas = Schemas(specs)
    problems = []
    found = 0
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml")):
        relative = path.relative_to(root)
        try:
            documents = list(yaml.safe_load_all(path.read_text("utf-8")))
        except yaml.YAMLError:
            problems.append(f"{relative}: not valid YAML")
            continue
        for index, doc in enumerate(documents):
            if isinstance(doc, dict) and doc.get("kind") == "Application":
                found += 1
                name = (doc.get("metadata") or {}).get("name", "?")
                problems += [
                    f"{relative}: document {index} (Application/{name}): {p}"
                    for p in lint_application(doc, site, schemas)
                ]
    if not found and not problems:
        # a wrong directory must not pass as "every Application is valid"
        raise InputError(f"{root}: no Application found (is it a cluster/apps checkout?)")
    return problems
