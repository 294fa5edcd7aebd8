"""What one push may have changed, and the builds it asks for.

The Sensor hands every push of the site's branch to one Workflow of its own,
``fabrique-push-<after12>-<before12>`` (``pipelines/push.py``), whose one step runs
``fabrique plan-push``: this module. It asks Gitea for the commits the push brought
(reachable from ``after``, not from ``before``) and those it dropped (the other way: a
forced push's, a reset's), each listing with the files every commit changed, and creates
the build ``fabrique-<app>-<sha12>`` of every app a changed file lies under, as every
caller does: AlreadyExists is success, so whoever asks first, there is one build per
app and commit.

A changed file counts for an app when it lies under the app's context and is not a file
fabrique itself writes (``fabrique_paths``): the build's plan step's own rule, so that
fabrique's write-back commits make no build. The build's plan stays the last word on
what is built; this only chooses whose plans run.

When the push cannot be listed (a new branch: there is no ``before``; more commits than
``MAX_PAGES`` pages of a listing), every app may have been touched, and every app's build
is asked for: each one's plan then skips what did not change. Building too often is
safe; missing a change is not.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from fabrique.clients.gitea import Commit
from fabrique.clients.kube import CreateResult
from fabrique.site.config import AppConfig, Site
from fabrique.site.errors import FabriqueError, InputError, KubeError, RemoteError
from fabrique.site.names import PUSH_SUBMITTER, REVISION_RE, check_revision

from . import review
from .changes import fabrique_paths
from .workflow import build_workflow

log = logging.getLogger("fabrique.push")

ZERO = re.compile(r"^0+$")  # a new branch's ``before`` (a deleted one's ``after``)
MAX_PAGES = 20  # of 50 commits: a push of more than 1 000 commits builds every app
CREATORS = 8  # builds created at once: a push touching a shared folder asks for many


class Lister(Protocol):
    def commits_since(
        self, repo: str, head: str, since: str, *, max_pages: int = ...
    ) -> list[Commit] | None: ...


@dataclass(frozen=True)
class Touched:
    apps: tuple[str, ...]  # in the site's order
    reason: str


def touched(site: Site, gitea: Lister, before: str, after: str) -> Touched:
    """The apps a push from ``before`` to ``after`` may have changed, and why."""
    check_revision(after)
    if ZERO.fullmatch(before):
        return Touched(_names(site.apps), "a new branch: what it changed cannot be listed")
    check_revision(before)
    if before == after:  # Gitea's test delivery; no push moves a branch onto itself
        return Touched((), f"{after[:12]} is where the branch was: nothing was pushed")
    repo = site.gitea.code_repo
    brought = gitea.commits_since(repo, after, before, max_pages=MAX_PAGES)
    dropped = gitea.commits_since(repo, before, after, max_pages=MAX_PAGES)
    if brought is None or dropped is None:
        return Touched(
            _names(site.apps),
            f"more than {MAX_PAGES * 50} commits between {before[:12]} and {after[:12]}: "
            "every app may have changed",
        )
    files = {name for commit in (*brought, *dropped) for name in commit.files}
    apps = apps_under(site, files - fabrique_paths(site))
    said = f"{len(brought)} commit(s) pushed"
    if dropped:
        said += f", {len(dropped)} dropped"
    return Touched(_names(apps), f"{said}, {len(files)} file(s) changed")


def apps_under(site: Site, files: Iterable[str]) -> list[AppConfig]:
    """The apps whose context holds one of ``files``, in the site's order: each file's
    folders looked up among the contexts, so the cost is the files' depth, not the apps."""
    by_context: dict[str, list[AppConfig]] = {}
    for app in site.apps:
        by_context.setdefault(app.context.rstrip("/"), []).append(app)
    hit: set[str] = set()
    for name in files:
        parts = name.split("/")
        for depth in range(1, len(parts)):  # a file is under its folders, not itself
            for app in by_context.get("/".join(parts[:depth]), ()):
                hit.add(app.name)
    return [app for app in site.apps if app.name in hit]


def _names(apps: Sequence[AppConfig]) -> tuple[str, ...]:
    return tuple(app.name for app in apps)


class Creator(Protocol):
    def create_workflow(self, body: dict[str, object]) -> CreateResult: ...


@dataclass(frozen=True)
class Asked:
    app: str
    name: str
    created: bool | None  # None: it failed, ``error`` says why
    error: FabriqueError | None = None


def meeting(site: Site, apps: Sequence[str]) -> frozenset[str]:
    """The apps of a push whose write-backs meet in the push's own Workflow
    (``writeback.batch``): those that write into a repository and branch that another of
    them writes too, the same way (one commit; or one pull request). An app alone there
    writes its own, from its build, as a single-app push does."""
    if not site.writeback.batch.enabled:
        return frozenset()
    by_branch: dict[tuple[str, str, bool], list[str]] = {}
    for name in apps:
        app = site.app(name)
        target = app.writeback
        key = (target.repo, site.branch_of(target), review.in_review(site, app))
        by_branch.setdefault(key, []).append(name)
    return frozenset(name for names in by_branch.values() if len(names) > 1 for name in names)


def ask_builds(
    site: Site,
    kube: Creator,
    apps: Sequence[str],
    after: str,
    *,
    group: str | None = None,
    pool: Callable[[int], ThreadPoolExecutor] = ThreadPoolExecutor,
) -> list[Asked]:
    """Create each app's build of ``after``; one that exists already is asked for too.
    Every app is tried whatever another's answer; the caller raises for the failures.
    ``group``: the push's Workflow, which writes the digests of the apps that meet
    (``meeting``) with one commit per repository and branch."""
    meets = meeting(site, apps) if group else frozenset()

    def one(app: str) -> Asked:
        body = build_workflow(
            site, app, after, submitted_by=PUSH_SUBMITTER, group=group if app in meets else None
        )
        try:
            result = kube.create_workflow(body)
        except FabriqueError as err:
            return Asked(app, body["metadata"]["name"], None, err)
        return Asked(app, result.name, result.created)

    if len(apps) <= 1:
        return [one(app) for app in apps]
    with pool(min(CREATORS, len(apps))) as workers:
        return list(workers.map(one, apps))


def raise_for_failures(asked: Sequence[Asked]) -> None:
    """One error for every build that could not be asked for: transient when one of
    them was (the step is then retried, and asks again for all: AlreadyExists is
    success), naming the first and counting the others."""
    failed = [a for a in asked if a.error is not None]
    if not failed:
        return
    first = failed[0]
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    transient = any(isinstance(a.error, RemoteError) and a.error.transient for a in failed)
    raise KubeError(f"{first.error}{more}", transient=transient)


def check_push(before: str, after: str) -> None:
    """One-line errors for what the Sensor passed, before anything is asked."""
    if not REVISION_RE.fullmatch(before):  # zeros too: a new branch
        raise InputError(f"--before {before!r}: not a commit id (40 or 64 hex) nor zeros")
    if not REVISION_RE.fullmatch(after) or ZERO.fullmatch(after):  # zeros: a deleted branch
        raise InputError(f"--after {after!r}: not a commit id (40 or 64 hex, not zeros)")
