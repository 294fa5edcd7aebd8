"""The build plan: what one ``fabrique-build`` run builds, resolved from the site config.

The WorkflowTemplate is the same for every app; its first step, ``fabrique plan``, turns
``app`` and ``revision`` into these values and fails the Workflow on a bad revision or
an unknown app, before anything is cloned or built.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from fabrique.site.config import Site
from fabrique.site.errors import InputError
from fabrique.site.names import check_revision, short_sha

CACHE_TAG = "buildcache"


@dataclass(frozen=True)
class BuildPlan:
    app: str
    revision: str
    tag: str  # the 12-character commit prefix
    image_ref: str  # where the build pushes: registry/<image>:<tag>
    cache_ref: str  # registry cache for --import-cache/--export-cache
    repo_url: str
    context: str
    dockerfile: str  # relative to the context
    build_opts: str  # one buildctl --opt per line: build-arg:NAME=value

    def outputs(self) -> dict[str, str]:
        """The values as Argo output parameters, keyed by parameter name."""
        return {key.replace("_", "-"): value for key, value in asdict(self).items()}


def make_plan(site: Site, app_name: str, revision: str) -> BuildPlan:
    app = site.app(app_name)
    check_revision(revision)
    tag = short_sha(revision)
    opts = "\n".join(f"build-arg:{key}={value}" for key, value in sorted(app.build_args.items()))
    return BuildPlan(
        app=app.name,
        revision=revision,
        tag=tag,
        image_ref=site.image_ref(app, tag),
        cache_ref=site.image_ref(app, CACHE_TAG),
        repo_url=site.gitea.repo_url(site.gitea.code_repo),
        context=app.context,
        dockerfile=app.dockerfile,
        build_opts=opts,
    )


def write_outputs(plan: BuildPlan, directory: Path, *, build: bool, reason: str) -> None:
    """One file per output parameter, each written whole (temp file, then rename).

    ``build`` is ``true`` or ``false``: the later steps run only when it is ``true``.
    """
    outputs = plan.outputs() | {"build": "true" if build else "false", "reason": reason}
    write_files(directory, outputs, "plan output directory")


def write_files(directory: Path, files: Mapping[str, str], what: str) -> None:
    """A step's outputs: one file per name in ``directory`` (made if missing), each
    written whole; InputError naming ``what`` (the option) when it cannot be."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            write_atomic(directory / name, value)
    except OSError as exc:
        raise InputError(f"{what} {directory}: {exc.strerror}") from None


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
