"""Gitea push webhook deliveries, built from the fields of Gitea's ``PushPayload``.

``PushPayload`` itself is not in Gitea's API document, but its parts are: each commit is
a ``PayloadCommit``, ``repository`` a ``Repository``, ``pusher`` and ``sender`` a
``User``; ``parts()`` returns them so a test can check each against the spec. The event
is shaped as the Argo Events webhook EventSource hands it on: ``header`` (every value a
list) and ``body``.
"""

from __future__ import annotations

import uuid
from typing import Any

ZERO = "0" * 40


def revision() -> str:
    """A commit id of its own (40 hex), for a push or a Workflow no other test makes."""
    return uuid.uuid4().hex + uuid.uuid4().hex[:8]


def _user() -> dict[str, Any]:
    return {
        "id": 1,
        "login": "seed",
        "login_name": "",
        "full_name": "Seed",
        "email": "seed@example.invalid",
    }


def _repository(full_name: str) -> dict[str, Any]:
    name = full_name.rsplit("/", 1)[-1]
    return {
        "id": 7,
        "name": name,
        "full_name": full_name,
        "owner": _user(),
        "private": True,
        "default_branch": "main",
        "html_url": f"http://gitea/{full_name}",
        "clone_url": f"http://gitea/{full_name}.git",
    }


def _commit(sha: str, files: list[str]) -> dict[str, Any]:
    person = {"name": "seed", "email": "seed@example.invalid", "username": "seed"}
    return {
        "id": sha,
        "message": "change\n",
        "url": f"http://gitea/commit/{sha}",
        "author": person,
        "committer": person,
        "timestamp": "2026-12-02T10:00:00Z",
        "added": [],
        "removed": [],
        "modified": files,
    }


def push(
    *,
    ref: str = "refs/heads/main",
    before: str = "1" * 40,
    after: str,
    repo: str = "atlas/atlas",
    files: list[str] | None = None,
    event: str = "push",
) -> dict[str, Any]:
    commits = [] if after == ZERO else [_commit(after, files or [])]
    body = {
        "ref": ref,
        "before": before,
        "after": after,
        "compare_url": f"http://gitea/{repo}/compare/{before[:10]}...{after[:10]}",
        "commits": commits,
        "total_commits": len(commits),
        "head_commit": commits[0] if commits else None,
        "repository": _repository(repo),
        "pusher": _user(),
        "sender": _user(),
    }
    headers = {
        "X-Gitea-Event": [event],
        "X-Gitea-Event-Type": [event],
        "X-Gitea-Delivery": ["6f0b7a52-0d6e-4a4b-9d43-2f6b2f0f8d11"],
        "Content-Type": ["application/json"],
    }
    return {"header": headers, "body": body}


def parts(event: dict[str, Any]) -> list[tuple[str, Any]]:
    """(Gitea definition, value) for every part of the payload the spec describes."""
    body = event["body"]
    found = [("Repository", body["repository"]), ("User", body["pusher"]), ("User", body["sender"])]
    found += [("PayloadCommit", commit) for commit in body["commits"]]
    return found


def kustomization(images: list[dict[str, str]]) -> str:
    """The pins, each tag quoted: a sha12 such as 979315794e45 reads as a number in YAML 1.2."""
    lines = ["apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization", "images:"]
    for image in images:
        lines += [
            f"  - name: {image['name']}",
            f"    newName: {image['newName']}",
            f'    newTag: "{image["newTag"]}"',
            f"    digest: {image['digest']}",
        ]
    return "\n".join(lines) + "\n"
