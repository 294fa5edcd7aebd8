"""What Git says about every app of a reconcile pass, each question asked once.

For each app a pass needs its *want* (the newest commit that changed its context) and
what its target deploys. Asked app by app that is three requests or more per app; here:

- the branch head of the code repository, once;
- the wants: from the previous pass's memory moved forward by one listing of the new
  commits (``memory``), and path by path only for the apps it does not cover;
- each target **file** read once, whatever the number of apps pinned in it;
- a deployed tag resolved, and compared with the want, only when it is not the want's
  own tag, and each such question once per pass (``PassTransport``).

The registry and the Kubernetes API are asked afterwards, by the reconciler, and only for
the apps that this survey does not find current.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from fabrique.clients.gitea import Commit
from fabrique.site.config import AppConfig, Site
from fabrique.site.errors import FabriqueError
from fabrique.site.names import short_sha

from .changes import fabrique_paths
from .holds import Hold, read_hold
from .memory import Memory, Remembered, follows, newest_touching, scope
from .targets import ImagePin
from .writeback import Snapshot, Transport, deployed_pin, deployed_revision

log = logging.getLogger("fabrique.reconcile")

_T = TypeVar("_T")
_K = TypeVar("_K")


@dataclass(frozen=True)
class Seen:
    """One app as Git shows it."""

    want: str | None
    deployed: ImagePin | None
    deployed_revision: str | None  # None: nothing deployed, a tag that is no commit, no want
    current: bool  # deployed == want, or descends from it
    hold: Hold | None = None  # an operator's hold on the target file


class _Once:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False
        self.value: Any = None


class PassTransport:
    """A transport that answers each read-only question once per pass.

    Commits are immutable, so ``resolve`` and ``is_ancestor`` keep their answers; a file
    is kept until this pass writes there, and every branch head until it writes anywhere.
    An answer that raised is not kept: the next asker asks again."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        # Gitea leases one file (its blob sha); git leases the whole branch (its tip)
        self._lease_is_file = getattr(inner, "lease", "branch") == "file"
        self._lock = threading.Lock()
        self._answers: dict[Hashable, _Once] = {}

    def _once(self, key: Hashable, ask: Callable[[], _T]) -> _T:
        with self._lock:
            entry = self._answers.setdefault(key, _Once())
        with entry.lock:
            if not entry.done:
                entry.value = ask()
                entry.done = True
            return entry.value

    def _forget(self, keep: Callable[[Hashable], bool]) -> None:
        with self._lock:
            self._answers = {k: v for k, v in self._answers.items() if keep(k)}

    def read(self, repo: str, branch: str, path: str) -> Snapshot:
        return self._once(("read", repo, branch, path), lambda: self.inner.read(repo, branch, path))

    @property
    def reviews(self) -> Any:
        return getattr(self.inner, "reviews", None)

    def propose(
        self,
        repo: str,
        base: str,
        head: str,
        files: Sequence[tuple[str, str, Snapshot]],
        message: str,
        head_tip: str | None,
    ) -> str:
        try:
            return self.inner.propose(repo, base, head, files, message, head_tip)
        finally:
            # the proposal branch moved, or the write was lost to another writer of the
            # base: what was read of either is stale, and every branch head with it
            def keep(key: Hashable) -> bool:
                if not isinstance(key, tuple) or key[0] == "head":
                    return not isinstance(key, tuple)
                return key[0] != "read" or key[1:3] not in ((repo, head), (repo, base))

            self._forget(keep)

    def write(
        self, repo: str, branch: str, path: str, text: str, snapshot: Snapshot, message: str
    ) -> str:
        try:
            return self.inner.write(repo, branch, path, text, snapshot, message)
        finally:  # written, or lost to another writer: either way what was read is stale
            self._written(repo, branch, {path})

    def read_many(self, repo: str, branch: str, paths: Sequence[str]) -> dict[str, Snapshot]:
        """What this pass read already, and the rest in one request. Over git every file
        must come from one tip, one lease: all are read again unless all were kept."""
        wanted = list(dict.fromkeys(paths))
        with self._lock:
            entries = {p: self._answers.get(("read", repo, branch, p)) for p in wanted}
        kept = {p: e.value for p, e in entries.items() if e is not None and e.done}
        if not self._lease_is_file and (
            len(kept) < len(wanted) or len({str(s.lease) for s in kept.values()}) > 1
        ):
            kept = {}  # over git every file comes from one tip, one lease
        missing = [p for p in wanted if p not in kept]
        read = self.inner.read_many(repo, branch, missing) if missing else {}
        for p, snapshot in read.items():
            once = _Once()
            once.value, once.done = snapshot, True
            with self._lock:
                self._answers[("read", repo, branch, p)] = once
        return kept | read

    def write_many(
        self, repo: str, branch: str, files: Sequence[tuple[str, str, Snapshot]], message: str
    ) -> str:
        try:
            return self.inner.write_many(repo, branch, files, message)
        finally:
            self._written(repo, branch, {path for path, _, _ in files})

    def _written(self, repo: str, branch: str, paths: set[str]) -> None:
        """Written, or lost to another writer: either way what was read is stale."""

        def keep(key: Hashable) -> bool:
            if not isinstance(key, tuple):
                return True
            if key[0] == "head":
                # every branch head: a write lost to a newer build's write-back means
                # a newer push, in the code repository, whatever repository the target
                # lives in; the never-roll-back guard compares with the head now
                return False
            if key[1:3] != (repo, branch):
                return True
            return key[0] != "read" or (self._lease_is_file and key[3] not in paths)

        self._forget(keep)

    def head(self, repo: str, branch: str) -> str:
        return self._once(("head", repo, branch), lambda: self.inner.head(repo, branch))

    def resolve(self, repo: str, branch: str, ref: str) -> str | None:
        return self._once(
            ("resolve", repo, branch, ref), lambda: self.inner.resolve(repo, branch, ref)
        )

    def is_ancestor(self, repo: str, branch: str, ancestor: str, descendant: str) -> bool:
        return self._once(
            ("ancestor", repo, branch, ancestor, descendant),
            lambda: self.inner.is_ancestor(repo, branch, ancestor, descendant),
        )

    def files_changed(
        self, repo: str, branch: str, since: str, until: str, path: str
    ) -> list[str] | None:
        return self.inner.files_changed(repo, branch, since, until, path)

    def last_change(self, repo: str, branch: str, path: str, ignore: frozenset[str]) -> str | None:
        return self.inner.last_change(repo, branch, path, ignore)

    def commits_since(self, repo: str, branch: str, head: str, since: str) -> list[Commit] | None:
        return self.inner.commits_since(repo, branch, head, since)


def each(
    pool: Executor, ask: Callable[[_K], _T], keys: Iterable[_K]
) -> dict[_K, _T | FabriqueError]:
    """``ask`` for every key at once; a key whose question failed maps to its error."""

    def safe(key: _K) -> _T | FabriqueError:
        try:
            return ask(key)
        except FabriqueError as err:
            return err

    keys = list(keys)
    return dict(zip(keys, pool.map(safe, keys), strict=True))


def survey(
    site: Site,
    transport: PassTransport,
    apps: Sequence[AppConfig],
    remembered: Memory | None,
    pool: Executor,
) -> tuple[dict[str, Seen | FabriqueError], Memory]:
    """Every app's ``Seen`` (or the error that kept it from being seen), and the memory
    to leave for the next pass. Raises if the branch head itself cannot be read."""
    repo, branch = site.gitea.code_repo, site.gitea.branch
    ignore = fabrique_paths(site)
    head = transport.head(repo, branch)
    memory = Memory(repo, branch, head)
    if remembered is not None:
        memory.apps = _moved(site, transport, remembered, head, ignore)

    by_name = {app.name: app for app in apps}
    asked = each(
        pool,
        lambda name: transport.last_change(repo, branch, by_name[name].context, ignore),
        [app.name for app in apps if app.name not in memory.apps],
    )
    wants: dict[str, str | FabriqueError | None] = {}
    for app in apps:
        if app.name in memory.apps:
            wants[app.name] = memory.apps[app.name].want
            continue
        want = asked[app.name]
        wants[app.name] = want
        if not isinstance(want, FabriqueError):
            memory.apps[app.name] = Remembered(scope(app, ignore), want)

    def target(app: AppConfig) -> tuple[str, str, str]:
        t = app.writeback
        return (t.repo, site.branch_of(t), t.path)

    files = each(pool, lambda key: transport.read(*key), sorted({target(app) for app in apps}))

    def judge(name: str) -> Seen:
        app = by_name[name]
        want, snapshot = wants[name], files[target(app)]
        if isinstance(want, FabriqueError):
            raise want
        if isinstance(snapshot, FabriqueError):
            raise snapshot
        return _seen(site, transport, app, want, snapshot, memory)

    # file by file: the apps of one file read the one parse of it (targets._read_shared)
    by_file = sorted(apps, key=target)
    seen = each(pool, judge, [app.name for app in by_file])
    return {app.name: seen[app.name] for app in apps}, memory


def _moved(
    site: Site,
    transport: PassTransport,
    remembered: Memory,
    head: str,
    ignore: frozenset[str],
) -> dict[str, Remembered]:
    """The remembered wants, moved to ``head`` by one listing; empty if they cannot be."""
    repo, branch = site.gitea.code_repo, site.gitea.branch
    commits: list[Commit] | None = []
    if head != remembered.head:
        try:
            commits = transport.commits_since(repo, branch, head, remembered.head)
        except FabriqueError as err:  # the remembered head is gone (a rewrite, then gc)
            log.info("commits since %s: %s", remembered.head[:12], err)
            commits = None
    if not follows(remembered, head, commits):
        log.info(
            "%s@%s does not simply follow %s; asking every app",
            repo,
            branch,
            remembered.head[:12],
        )
        return {}
    assert commits is not None
    listed = {c.sha for c in commits}
    moved = {}
    for app in site.apps:
        known = remembered.apps.get(app.name)
        if known is None or known.scope != scope(app, ignore):
            continue
        newer = newest_touching(commits, app.context, ignore)
        if newer is None:
            moved[app.name] = known
            continue
        # the old want is on the branch and not listed, so it is the remembered head or
        # older: the new want, listed after that head, cannot be its ancestor
        old = known.want
        behind = (short_sha(old), old) if old and old not in listed else None
        moved[app.name] = Remembered(known.scope, newer, behind=behind)
    return moved


def _seen(
    site: Site,
    transport: PassTransport,
    app: AppConfig,
    want: str | None,
    snapshot: Snapshot,
    memory: Memory,
) -> Seen:
    t = app.writeback
    deployed = hold = None
    if snapshot.text is not None:
        hold = read_hold(snapshot.text, f"{t.repo}:{t.path}", app.name)
        deployed = deployed_pin(site, app, snapshot.text)
    tag = deployed.tag if deployed else None
    if want is None or not tag:
        return Seen(want, deployed, None, False, hold)
    if tag == short_sha(want):
        return Seen(want, deployed, want, True, hold)
    known = memory.apps[app.name]
    if known.current is not None and known.current[0] == tag:
        return Seen(want, deployed, known.current[1], True, hold)
    if known.behind is not None and known.behind[0] == tag:
        return Seen(want, deployed, known.behind[1], False, hold)
    repo, branch = site.gitea.code_repo, site.gitea.branch
    revision = deployed_revision(transport, repo, branch, tag)
    current = revision is not None and (
        revision == want or transport.is_ancestor(repo, branch, want, revision)
    )
    if current:
        assert revision is not None
        memory.apps[app.name] = dataclasses.replace(known, current=(tag, revision))
    return Seen(want, deployed, revision, current, hold)
