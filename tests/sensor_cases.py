"""Which deliveries the Sensor's one dependency passes: one table, held by the Sensor
double (tests/test_events.py) and by the real Sensor of Argo Events
(tests/live/test_events.py).

A delivery that passes becomes one push Workflow; which apps it builds is the push's
plan's (fabrique/decisions/push.py, tests/test_push.py), not the Sensor's. The site's
code repository and build namespace are the contract's own, so that on the live plane
the site's Sensor lets none of these pushes through, and the Workflows the contract's
Sensor creates run nowhere (no WorkflowTemplate there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fabrique.site.config import Site, default_values, merge, parse_site

from . import payloads

CODE_REPO = "contract/sensor"
NAMESPACE = "fabrique-contract"
SENSOR = "fabrique-contract"


def site() -> Site:
    alpha = {
        "name": "alpha",
        "image": "alpha",
        "context": "apps/alpha",
        "writeback": {"repo": CODE_REPO, "path": "apps/alpha/deploy/kustomization.yaml"},
    }
    return parse_site(
        merge(
            default_values(),
            {"gitea": {"codeRepo": CODE_REPO}, "namespaces": {"build": NAMESPACE}, "apps": [alpha]},
        )
    )


@dataclass(frozen=True)
class Case:
    name: str
    event: dict[str, Any]
    passes: bool

    @property
    def after(self) -> str:
        return str(self.event["body"]["after"])

    @property
    def workflow(self) -> str:
        """The push Workflow it makes when it passes."""
        body = self.event["body"]
        return f"fabrique-push-{body['after'][:12]}-{body['before'][:12]}"


def _case(name: str, passes: bool, number: int, **push: Any) -> Case:
    push.setdefault("after", f"{number:02x}" * 20)
    push.setdefault("repo", CODE_REPO)
    return Case(name, payloads.push(**push), passes)


def _test_delivery() -> dict[str, Any]:
    """Gitea's "Test Delivery": the branch's head as before and after, its files null."""
    head = "0d" * 20
    event = payloads.push(after=head, before=head, repo=CODE_REPO)
    commit = event["body"]["commits"][0]
    commit.update(added=None, modified=None, removed=None)
    return event


CASES = [
    _case("a push of the branch", True, 1, files=["apps/alpha/main.py"]),
    _case("a push beside every app", True, 2, files=["docs/notes.md"]),
    _case("a new branch", True, 3, before="0" * 40),
    _case("a SHA-256 repository", True, 4, after="04" * 32, before="14" * 32),
    _case("another branch", False, 5, ref="refs/heads/feature"),
    _case("a branch named like it", False, 6, ref="refs/heads/main-backup"),
    _case("a tag", False, 7, ref="refs/tags/v1.0.0"),
    _case("a deleted branch", False, 8, after=payloads.ZERO),
    _case("another repository", False, 9, repo=CODE_REPO + "-fork"),
    _case("another event", False, 10, event="pull_request"),
    _case("an after too long", False, 11, after="a" * 41),
    _case("a before that is no commit", False, 12, before="main"),
    Case("Gitea's test delivery", _test_delivery(), False),
]
