"""The chain's stage times of one push, from what the scenario recorded: seconds from the
push to each stage, read from the objects' own timestamps (whole seconds).

    python bench/scenarios/timings.py PUSHED_AT WORKFLOW.json COMMIT.json APP.json PODS.json

PUSHED_AT is the push's epoch time; WORKFLOW the build's Workflow (``kubectl get -o
json``); COMMIT Gitea's git commit of the write-back (``/repos/…/git/commits/SHA``); APP
the Argo CD Application; PODS the app's pods. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def stages(
    pushed_at: float,
    workflow: dict[str, Any],
    commit: dict[str, Any],
    application: dict[str, Any],
    pods: dict[str, Any],
) -> dict[str, float]:
    """Seconds from the push: the Workflow created, its build container started and done
    (its node in the build's pod, ``run(0).build``, as the controller saw it), the
    Workflow done, the digest's commit in Git, the Application's sync done, the last pod
    Ready."""
    nodes = (workflow.get("status") or {}).get("nodes") or {}
    build = [
        n
        for n in nodes.values()
        if n.get("type") == "Container"
        and str(n.get("displayName")).rsplit(".", 1)[-1] == "build"
        and n.get("finishedAt")
    ]
    ready = [
        c["lastTransitionTime"]
        for p in pods.get("items", [])
        for c in (p.get("status") or {}).get("conditions", [])
        if c.get("type") == "Ready" and c.get("status") == "True"
    ]
    found = {
        "workflow_created": workflow["metadata"]["creationTimestamp"],
        "build_started": min(n["startedAt"] for n in build) if build else None,
        "build_done": max(n["finishedAt"] for n in build) if build else None,
        "workflow_done": (workflow.get("status") or {}).get("finishedAt"),
        # Gitea's git commit: its top-level "committer" is a user, the date is inside
        "digest_in_git": commit["commit"]["committer"]["date"],
        "synced": ((application.get("status") or {}).get("operationState") or {}).get("finishedAt"),
        "pod_ready": max(ready) if ready else None,
    }
    return {stage: round(_epoch(stamp) - pushed_at, 1) for stage, stamp in found.items() if stamp}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="timings.py",
        description="The chain's stage times of one push: seconds from the push to each "
        "stage, one JSON object.",
    )
    parser.add_argument("pushed_at", type=float, metavar="PUSHED_AT", help="the push's epoch time")
    for name in ("WORKFLOW", "COMMIT", "APP", "PODS"):
        parser.add_argument(name.lower(), type=Path, metavar=f"{name}.json")
    args = parser.parse_args(argv)
    loaded = [
        json.loads(path.read_text()) for path in (args.workflow, args.commit, args.app, args.pods)
    ]
    print(json.dumps(stages(args.pushed_at, *loaded)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
