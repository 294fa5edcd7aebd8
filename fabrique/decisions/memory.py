"""What a reconcile pass leaves for the next one: the branch head it saw, each app's want.

A pass needs, for every app, the newest commit that changed the app's context (its
*want*). Asked path by path, that is one request per app. Remembered, it is one listing
of the commits since the previous pass's head, filtered here by every context at once:
an app that no new commit touches keeps its want. So a pass costs requests per target
file and per repository, not per app.

The memory is only a cache; it is dropped, and every want asked again path by path, when
it cannot be trusted:

- it was written for another repository or branch, or in another format;
- an app's context, or the files fabrique writes under it, changed (its ``scope``);
- the branch no longer descends from the remembered head (a force-push, a reset), or
  the new commits include a merge (a path-by-path log simplifies merges; one listing
  does not), or there are too many of them to list.

It lives in a ConfigMap of the control namespace (``fabrique-reconcile-memory``), which the
reconciler's Role may read and write; a pass that cannot read or write it still decides
exactly as well, with more requests. It is JSON, as ``memory.json``, while that takes
half of what a ConfigMap may hold; a larger one (some 230 bytes an app: past about 2 300
apps) is kept gzipped, as ``memory.json.gz`` of its ``binaryData``, a third of the size:
the API server refuses a ConfigMap whose data passes 1 MiB, and a memory not saved
costs the next pass a request per app.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import logging
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fabrique.clients.gitea import Commit
from fabrique.clients.kube import KubeClient
from fabrique.site.config import AppConfig
from fabrique.site.errors import KubeError
from fabrique.site.limits import DATA_LIMIT
from fabrique.site.names import LABEL_MANAGED_BY, LABEL_PART_OF, RECONCILE_MEMORY, REVISION_RE

log = logging.getLogger("fabrique.reconcile")

FORMAT = 1
KEY = "memory.json"
PACKED = f"{KEY}.gz"  # in binaryData, for a memory of more than PLAIN_LIMIT bytes
PLAIN_LIMIT = DATA_LIMIT // 2


@dataclass(frozen=True)
class Remembered:
    scope: str  # what the want was computed for (context and ignored files)
    want: str | None
    # a deployed tag and its commit, checked to descend from ``want``: no need to ask again
    current: tuple[str, str] | None = None
    # the tag and commit of the want before it moved: known not to descend from ``want``
    behind: tuple[str, str] | None = None


@dataclass
class Memory:
    repo: str
    branch: str
    head: str
    apps: dict[str, Remembered] = field(default_factory=dict)
    # app -> the want whose commit status was seen as success: not read again until it moves
    reported: dict[str, str] = field(default_factory=dict)
    # build Workflows seen not ended: name -> (app, revision); one gone by the next pass
    # without having been seen ended may have left its commit's status pending
    running: dict[str, tuple[str, str]] = field(default_factory=dict)
    # build Workflows seen ended Failed or Error whose commit status was then dealt with
    settled: list[str] = field(default_factory=list)

    def dumps(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "repo": self.repo,
                "branch": self.branch,
                "head": self.head,
                "apps": {
                    name: {
                        "scope": r.scope,
                        "want": r.want,
                        "current": r.current,
                        "behind": r.behind,
                    }
                    for name, r in sorted(self.apps.items())
                },
                "reported": dict(sorted(self.reported.items())),
                "running": {name: list(pair) for name, pair in sorted(self.running.items())},
                "settled": sorted(self.settled),
            },
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, text: str, repo: str, branch: str) -> Memory | None:
        """The memory in ``text`` if it is for ``repo``@``branch`` and well formed, else None."""
        try:
            data = json.loads(text)
            if data["format"] != FORMAT or (data["repo"], data["branch"]) != (repo, branch):
                return None
            head = _sha(data["head"])
            apps = {}
            for name, entry in data["apps"].items():
                want = None if entry["want"] is None else _sha(entry["want"])
                apps[str(name)] = Remembered(
                    str(entry["scope"]),
                    want,
                    _pair(entry.get("current")),
                    _pair(entry.get("behind")),
                )
            reported = {str(k): _sha(v) for k, v in (data.get("reported") or {}).items()}
            running = {}
            for name, pair in (data.get("running") or {}).items():
                app, revision = pair
                running[str(name)] = (str(app), _sha(revision))
            settled = [str(name) for name in data.get("settled") or []]
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("the reconcile memory is unreadable; asking every app again")
            return None
        return cls(repo, branch, head, apps, reported, running, settled)


def _pair(value: Any) -> tuple[str, str] | None:
    if value is None:
        return None
    tag, commit = value
    return (str(tag), _sha(commit))


def _sha(value: Any) -> str:
    if not isinstance(value, str) or not REVISION_RE.fullmatch(value):
        raise ValueError(f"not a commit id: {value!r}")
    return value


def ignored_under(app: AppConfig, ignore: frozenset[str]) -> list[str]:
    prefix = app.context.rstrip("/") + "/"
    return sorted(p for p in ignore if p.startswith(prefix) or p == app.context)


def scope(app: AppConfig, ignore: frozenset[str]) -> str:
    """What an app's want depends on: its context and the fabrique-written files in it."""
    key = "\0".join([app.context, *ignored_under(app, ignore)])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def newest_touching(commits: Sequence[Commit], path: str, ignore: frozenset[str]) -> str | None:
    """The first of ``commits`` (newest first) that changed a file under ``path`` other
    than those in ``ignore``: what ``last_change`` finds, from a listing already read."""
    prefix = path.rstrip("/") + "/"
    for commit in commits:
        if any((n.startswith(prefix) or n == path) and n not in ignore for n in commit.files):
            return commit.sha
    return None


def follows(memory: Memory, head: str, commits: Sequence[Commit] | None) -> bool:
    """Whether ``commits`` (``memory.head..head``) can move the remembered wants to ``head``.

    The branch descends from the remembered head exactly when that head is a parent of
    one of the listed commits (a path from ``head`` down to it enters it from a child,
    which is listed); an empty listing with another head means the branch went back."""
    if commits is None:
        return False
    if any(len(c.parents) > 1 for c in commits):
        return False
    return head == memory.head or any(memory.head in c.parents for c in commits)


class MemoryStore(Protocol):
    def load(self) -> str | None: ...

    def save(self, text: str) -> None: ...


class NoMemory:
    """Every pass starts afresh (``fabrique status``, tests, a site without the Role)."""

    def load(self) -> str | None:
        return None

    def save(self, text: str) -> None:
        return None


class ConfigMapMemory:
    """The memory in a ConfigMap; a write names the version read, so two passes that
    overlap cannot interleave (the later one keeps its requests for next time)."""

    def __init__(self, kube: KubeClient, namespace: str, name: str = RECONCILE_MEMORY) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self._version: str | None = None

    def load(self) -> str | None:
        try:
            found = self.kube.get_configmap(self.namespace, self.name)
        except KubeError as err:
            log.warning("reconcile memory: %s; asking every app", err)
            return None
        if found is None:
            return None
        self._version = str(found["metadata"].get("resourceVersion") or "") or None
        packed = (found.get("binaryData") or {}).get(PACKED)
        if packed is None:
            return str((found.get("data") or {}).get(KEY) or "") or None
        try:
            return gzip.decompress(base64.b64decode(str(packed), validate=True)).decode()
        except (binascii.Error, OSError, EOFError, zlib.error, UnicodeDecodeError):
            log.warning("the reconcile memory is unreadable; asking every app again")
            return None

    def save(self, text: str) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {LABEL_PART_OF: "fabrique", LABEL_MANAGED_BY: "fabrique"},
            },
        }
        if len(text.encode()) <= PLAIN_LIMIT:
            body["data"] = {KEY: text}
        else:  # mtime 0: the same memory packs to the same bytes
            packed = gzip.compress(text.encode(), compresslevel=9, mtime=0)
            body["binaryData"] = {PACKED: base64.b64encode(packed).decode()}
        try:
            if self._version is None:
                self.kube.create_configmap(body)
            else:
                body["metadata"]["resourceVersion"] = self._version
                self.kube.replace_configmap(body)
        except KubeError as err:
            log.warning("reconcile memory not saved: %s", err)
