"""Which apps' dependencies a push passes: one table, held by the Sensor double
(tests/test_events.py) and by the real Sensor of Argo Events (tests/live/test_events.py).

The site has an app whose write-back file lies in its context (alpha), one whose target
is another repository (beta), one whose context holds gjson's own syntax (gamma), one
whose context a gjson query cannot hold as it is (delta: every file counts), and one
whose write-back file is the only one of its context in a push (eps). Its code repository
and build namespace are the contract's own, so that on the live plane the site's Sensor
lets none of these pushes through, and the Workflows the contract's Sensor creates run
nowhere (no WorkflowTemplate there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fabrique.site.config import Site, default_values, merge, parse_site

from . import payloads

CODE_REPO = "contract/sensor"
NAMESPACE = "fabrique-contract"
SENSOR = "fabrique-contract"
GAMMA = "apps/g|a#m(m)a, @x{y}%"


def _app(name: str, context: str, repo: str, path: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": name,
        "context": context,
        "writeback": {"repo": repo, "path": path},
    }


def site() -> Site:
    return parse_site(
        merge(
            default_values(),
            {
                "gitea": {"codeRepo": CODE_REPO},
                "namespaces": {"build": NAMESPACE},
                "apps": [
                    _app("alpha", "apps/alpha", CODE_REPO, "apps/alpha/deploy/kustomization.yaml"),
                    _app("beta", "apps/beta", "cluster/apps", "apps/beta/kustomization.yaml"),
                    _app("gamma", GAMMA, CODE_REPO, f"{GAMMA}/k s.yaml"),
                    _app("delta", "apps/d*lta", CODE_REPO, "apps/d*lta/k.yaml"),
                    _app("eps", "apps/eps", CODE_REPO, "apps/eps/a.yaml"),
                ],
            },
        )
    )


ALL = frozenset({"alpha", "beta", "gamma", "delta", "eps"})


@dataclass(frozen=True)
class Case:
    name: str
    event: dict[str, Any]
    apps: frozenset[str]  # the apps whose dependency it passes

    @property
    def after(self) -> str:
        return str(self.event["body"]["after"])


def _case(
    number: int,
    name: str,
    apps: set[str] | frozenset[str],
    *commits: dict[str, Any],
    total: int | None = None,
    before: str = "1" * 40,
) -> Case:
    after = f"{number:02x}" * 20
    event = payloads.push(after=after, before=before, repo=CODE_REPO)
    listed = [{**c, "id": after} for c in commits]
    event["body"]["commits"] = listed
    event["body"]["total_commits"] = len(listed) if total is None else total
    event["body"]["head_commit"] = listed[0] if listed else None
    return Case(name, event, frozenset(apps))


def _files(**files: list[str]) -> dict[str, Any]:
    """A listed commit: the files it adds, modifies and removes."""
    return {
        "message": "change\n",
        **{k: files.get(k, []) for k in ("added", "modified", "removed")},
    }


CASES = [
    _case(1, "a file of alpha", {"alpha", "delta"}, _files(modified=["apps/alpha/main.py"])),
    _case(
        2,
        "alpha's write-back file only",
        {"delta"},
        _files(modified=["apps/alpha/deploy/kustomization.yaml"]),
    ),
    _case(
        3,
        "eps's write-back file and another file of alpha's deploy folder",
        {"alpha", "delta"},
        _files(modified=["apps/eps/a.yaml", "apps/alpha/deploy/other.yaml"]),
    ),
    _case(
        4,
        "added under beta, removed under alpha",
        {"alpha", "beta", "delta"},
        _files(added=["apps/beta/new.txt"], removed=["apps/alpha/old.txt"]),
    ),
    _case(5, "beside every app", {"delta"}, _files(modified=["docs/notes.md"])),
    _case(
        6,
        "a list Gitea cut (5 listed, 6 pushed)",
        ALL,
        *[_files(modified=["docs/notes.md"])] * 5,
        total=6,
    ),
    _case(7, "no commit listed (a reset to an older commit)", ALL, total=0),
    _case(8, "a new branch", ALL, _files(modified=["docs/notes.md"]), before="0" * 40),
    _case(
        9,
        "a test delivery: lists of files null",
        set(),
        {"message": "m", "added": None, "modified": None, "removed": None},
    ),
    _case(
        10,
        "a sibling whose name starts like alpha's, and beta's folder as a file",
        {"delta"},
        _files(modified=["apps/alphabet/x", "apps/beta"]),
    ),
    _case(11, "under gamma's odd name", {"gamma", "delta"}, _files(modified=[f"{GAMMA}/src/a.py"])),
    _case(12, "gamma's write-back file only", {"delta"}, _files(modified=[f"{GAMMA}/k s.yaml"])),
    _case(
        13,
        "the second commit touches beta",
        {"beta", "delta"},
        _files(modified=["docs/a.md"]),
        _files(modified=["apps/beta/Dockerfile"]),
    ),
    _case(
        14,
        "alpha's write-back file, then a new file beside it",
        {"alpha", "delta"},
        _files(modified=["apps/alpha/deploy/kustomization.yaml"]),
        _files(added=["apps/alpha/deploy/extra.yaml"]),
    ),
    _case(15, "a quote in a file name", {"alpha", "delta"}, _files(modified=['apps/alpha/a"b'])),
]
