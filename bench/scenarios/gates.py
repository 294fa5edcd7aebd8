"""The gates of scenario build-gitops-digest, as pure functions of recorded outputs.

Each gate takes what ``kubectl get -o json`` (or fabrique) printed and returns the list
of what is wrong: empty means the gate passes. ``build-gitops-digest.sh`` calls them:

    python bench/scenarios/gates.py GATE FILE [FILE…]    # exit 0 pass, 1 fail, 2 usage
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def _items(data: dict[str, Any]) -> list[dict[str, Any]]:
    return data.get("items", [data]) if isinstance(data, dict) else []


def deployed_by_digest(workloads: dict[str, Any]) -> list[str]:
    """Gate 1: every container of the deployed workloads names its image by digest."""
    problems = []
    items = _items(workloads)
    if not items:
        return ["no workload deployed"]
    for item in items:
        name = f"{item.get('kind', '?')}/{item.get('metadata', {}).get('name', '?')}"
        spec = item.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            if not DIGEST.search(str(container.get("image", ""))):
                problems.append(
                    f"{name}: container {container.get('name')} runs {container.get('image')!r}, not by digest"
                )
    return problems


def application_synced_healthy(application: dict[str, Any]) -> list[str]:
    """Gate 2: the Argo CD Application is Synced and Healthy."""
    status = application.get("status", {})
    sync = status.get("sync", {}).get("status")
    health = status.get("health", {}).get("status")
    problems = []
    if sync != "Synced":
        problems.append(
            f"Application {application.get('metadata', {}).get('name')}: sync is {sync}, not Synced"
        )
    if health != "Healthy":
        problems.append(
            f"Application {application.get('metadata', {}).get('name')}: health is {health}, not Healthy"
        )
    return problems


def pods_ready_by_digest(pods: dict[str, Any]) -> list[str]:
    """Gate 3: every pod is Ready and its containers run an image named by digest."""
    items = _items(pods)
    if not items:
        return ["no pod"]
    problems = []
    for pod in items:
        name = pod.get("metadata", {}).get("name", "?")
        ready = [c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == "Ready"]
        if not ready or ready[0].get("status") != "True":
            problems.append(f"pod {name}: not Ready")
        for container in pod.get("spec", {}).get("containers", []):
            if not DIGEST.search(str(container.get("image", ""))):
                problems.append(
                    f"pod {name}: container {container.get('name')} image {container.get('image')!r} is not by digest"
                )
    return problems


def replay_is_noop(
    submit: str, writeback: str, commits_before: str, commits_after: str
) -> list[str]:
    """Gate 4: replaying submit and write-back for the same commit changes nothing."""
    problems = []
    if "already exists" not in submit:
        problems.append(f"submit replay did not say 'already exists': {submit.strip()[:200]!r}")
    if not writeback.strip().startswith("unchanged:"):
        problems.append(f"writeback replay did not say 'unchanged': {writeback.strip()[:200]!r}")
    if commits_before.strip() != commits_after.strip():
        problems.append(f"a commit appeared: {commits_before.strip()} -> {commits_after.strip()}")
    return problems


def reconciled(status: list[dict[str, Any]], app: str, revision: str) -> list[str]:
    """Gate 5: after a push the event path missed, the reconcile pass deployed it."""
    entry = next((s for s in status if s.get("app") == app), None)
    if entry is None:
        return [f"app {app} not in the status"]
    facts = entry.get("facts") or {}
    problems = []
    if facts.get("want") != revision:
        problems.append(f"app {app}: want is {facts.get('want')}, the push was {revision}")
    if entry.get("state") != "ok":
        problems.append(f"app {app}: state {entry.get('state')} ({entry.get('detail')}), not ok")
    return problems


def _load(path: str) -> Any:
    text = Path(path).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


GATES: dict[str, Callable[..., list[str]]] = {
    "deployed-by-digest": deployed_by_digest,
    "application-synced-healthy": application_synced_healthy,
    "pods-ready-by-digest": pods_ready_by_digest,
    "replay-is-noop": replay_is_noop,
    "reconciled": reconciled,
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in GATES:
        print(f"usage: gates.py {{{','.join(GATES)}}} FILE… [APP REVISION]", file=sys.stderr)
        return 2
    name, args = argv[0], argv[1:]
    if name == "reconciled":
        problems = reconciled(_load(args[0]), args[1], args[2])
    else:
        problems = GATES[name](*[_load(a) for a in args])
    for problem in problems:
        print(f"FAIL {name}: {problem}")
    if not problems:
        print(f"PASS {name}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
