"""The gates of scenario build-gitops-digest, as pure functions of recorded outputs.

Each gate takes what ``kubectl get -o json`` (or fabrique) printed and returns the list
of what is wrong: empty means the gate passes. ``build-gitops-digest.sh`` calls them:

    python bench/scenarios/gates.py GATE FILE [FILE…]    # exit 0 pass, 1 fail, 2 usage
"""

from __future__ import annotations

import argparse
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
    """Gate 3: every pod is Ready, names its images by digest, and runs that very image:
    the container runtime's ``imageID`` (what it pulled and runs) carries the digest the
    spec names. A pod reported Ready by something that pulls nothing has no such id."""
    items = _items(pods)
    if not items:
        return ["no pod"]
    problems = []
    for pod in items:
        name = pod.get("metadata", {}).get("name", "?")
        ready = [c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == "Ready"]
        if not ready or ready[0].get("status") != "True":
            problems.append(f"pod {name}: not Ready")
        ran = {s.get("name"): s for s in pod.get("status", {}).get("containerStatuses", [])}
        for container in pod.get("spec", {}).get("containers", []):
            image = str(container.get("image", ""))
            named = DIGEST.search(image)
            if not named:
                problems.append(
                    f"pod {name}: container {container.get('name')} image {image!r} is not by digest"
                )
                continue
            image_id = str((ran.get(container.get("name")) or {}).get("imageID") or "")
            if not image_id.endswith(named.group(0)):
                problems.append(
                    f"pod {name}: container {container.get('name')} runs imageID {image_id!r}, "
                    f"not {named.group(0)[1:]}"
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


def seed_replay_unchanged(seed: str, commits_before: str, commits_after: str) -> list[str]:
    """Gate 4: ``fabrique seed`` run again changes nothing: each of its steps says
    ``unchanged`` (or ``skipped``, for what the site does not use), the write-back, the
    webhook and the Application among them, and no commit appears."""
    steps = {}
    for line in seed.splitlines():
        match = re.match(r"(\S+): (\S+) \(", line)
        if match:
            steps[match.group(1)] = match.group(2)
    problems = [
        f"seed step {step} is {state}, not unchanged"
        for step, state in steps.items()
        if state not in ("unchanged", "skipped")
    ]
    problems += [
        f"seed replay said nothing of step {step}"
        for step in ("write-back", "webhook", "application")
        if step not in steps
    ]
    if steps.get("write-back") == "skipped" or steps.get("application") == "skipped":
        problems.append("seed replay skipped the write-back or the Application")
    if commits_before.strip() != commits_after.strip():
        problems.append(f"a commit appeared: {commits_before.strip()} -> {commits_after.strip()}")
    return problems


def status_success(statuses: list[dict[str, Any]], app: str, digest: str) -> list[str]:
    """Gate 5: the pushed commit's status ``fabrique/<app>`` (Gitea's list of a commit's
    statuses, newest first) is ``success`` and names the digest deployed."""
    context = f"fabrique/{app}"
    ours = [s for s in statuses if isinstance(s, dict) and s.get("context") == context]
    if not ours:
        return [f"no commit status {context}"]
    latest = max(ours, key=lambda s: (str(s.get("updated_at") or ""), int(s.get("id") or 0)))
    state = latest.get("status") or latest.get("state")
    problems = []
    if state != "success":
        problems.append(f"status {context} is {state}, not success: {latest.get('description')!r}")
    if digest not in str(latest.get("description") or ""):
        problems.append(f"status {context} does not name {digest}: {latest.get('description')!r}")
    return problems


def reconciled(status: list[dict[str, Any]], app: str, revision: str) -> list[str]:
    """After a push the event path missed, the reconcile pass deployed it (the scenario's
    safety-net step, where the EventSource can be scaled down)."""
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
    "seed-replay-unchanged": seed_replay_unchanged,
    "status-success": status_success,
    "reconciled": reconciled,
}
# the gates whose last arguments are words, not files
WORDS = {"reconciled": 2, "status-success": 2}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gates.py",
        description="Judge one gate of scenario 34 on recorded outputs: "
        "exit 0 pass, 1 fail, 2 usage.",
    )
    parser.add_argument("gate", choices=GATES)
    parser.add_argument(
        "args",
        nargs="+",
        metavar="FILE",
        help="the recorded outputs, then APP and REVISION or DIGEST for " + " and ".join(WORDS),
    )
    parsed = parser.parse_args(argv)
    name, args = parsed.gate, parsed.args
    if name in WORDS:
        files, words = args[: -WORDS[name]], args[-WORDS[name] :]
        problems = GATES[name](*[_load(a) for a in files], *words)
    else:
        problems = GATES[name](*[_load(a) for a in args])
    for problem in problems:
        print(f"FAIL {name}: {problem}")
    if not problems:
        print(f"PASS {name}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
