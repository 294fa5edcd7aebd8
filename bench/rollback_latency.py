"""A deploy that breaks undoes itself: from the broken build's pod failing to the last
verified digest's pod Ready again, and what the verification adds to a good build's
chain, on the real node of ``make up``'s plane.

    make up
    .venv/bin/python bench/rollback_latency.py --runs 3

The plane's site, with its first app deployed through one environment, ``bench``, whose
Argo CD runs in the plane (``targets.prod.inCluster``) and whose failures roll back
(``verify.onFailure: rollback``), is rendered and applied: each build's Workflow then
verifies bench after its write-back (its ``verify-deploy`` step, ``fabrique verify
--wait --in-cluster``), as a site runs it. Nobody runs anything after a push.

First a good push (a line appended to the app's ``app.txt``), followed as
``bench/chain_latency.py`` follows one, and further: ``verified``, the
``fabrique/<app>/bench/verified`` status's ``success`` in Gitea (whole seconds), and
``workflow done``, the build's Workflow's ``finishedAt``. What the verification adds
to the chain is ``verified`` after ``pod Ready``.

Then ``--runs`` times: a push whose image cannot start (its Dockerfile's ``CMD`` runs
``false`` first), and, from the moment a bench pod of it is seen failing (a container in
``CrashLoopBackOff``, or ended in error: polled every 0.3 s), ``rolled back in Git``
(the target's pin back on the verified digest, with its hold) and ``pod Ready again``
(every pod of the app's namespace on the verified digest, Ready, polled). Argo CD calls
such a Deployment Progressing until its progress deadline, so the clock starts at the
pod, earlier than Degraded would. ``fabrique release`` lifts the hold before the next
run. At the end the Dockerfile is restored, the hold released, and the plane's own tree
applied again.

Prints p50 and max of each, and one JSON object (``--json FILE`` writes it too).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.chain_latency import Plane, _clone, _epoch, _follow, _git, _push  # noqa: E402
from fabrique.site.config import load_site  # noqa: E402
from tests.live.controlplane import default_folder  # noqa: E402
from tests.waits import until  # noqa: E402

BOUND = 300.0  # seconds each wait may take, or the bench fails
GOOD_CMD, BROKEN_CMD = 'CMD ["httpd"', 'CMD ["false", "httpd"'


def _with_bench(plane: Plane) -> None:
    """The plane's site, its first app deployed through environment bench, verified by
    its builds' Workflows and rolled back on failure."""
    values = json.loads(plane.values.read_text())
    values["targets"]["prod"]["inCluster"] = True
    values.setdefault("apps", plane.site.to_values()["apps"])
    values["apps"][0]["environments"] = [
        {"name": "bench", "target": "prod", "verify": {"onFailure": "rollback"}}
    ]
    plane.values.write_text(json.dumps(values))
    plane.site = load_site(plane.values, env={})


def _verified(plane: Plane, sha: str) -> tuple[str, str, str] | None:
    """The newest ``fabrique/<app>/bench/verified`` status on ``sha``: state, when, what."""
    site, app = plane.site, plane.site.apps[0]
    with plane.gitea.admin() as admin:
        answer = admin.get(f"/repos/{site.gitea.code_repo}/statuses/{sha}")
        answer.raise_for_status()
    found = [s for s in answer.json() if s["context"] == f"fabrique/{app.name}/bench/verified"]
    if not found:
        return None
    newest = max(found, key=lambda s: (s["created_at"], s["id"]))
    return newest["status"], newest["created_at"], newest["description"]


def _pods(plane: Plane) -> list[dict[str, Any]]:
    namespace = plane.site.apps[0].application.namespace  # type: ignore[union-attr]
    found = plane.kubectl_json("get", "pods", "-n", namespace)
    return [p for p in found.get("items", []) if not p["metadata"].get("deletionTimestamp")]


def _failing(plane: Plane, tag: str) -> str | None:
    """How a pod of the image tagged ``tag`` (the broken build's) fails, if one does."""
    for pod in _pods(plane):
        images = [c.get("image", "") for c in pod.get("spec", {}).get("containers", [])]
        if not any(f":{tag}@" in image for image in images):
            continue
        for status in pod.get("status", {}).get("containerStatuses", []):
            state = status.get("state") or {}
            waiting = (state.get("waiting") or {}).get("reason", "")
            ended = state.get("terminated") or (status.get("lastState") or {}).get("terminated")
            if waiting == "CrashLoopBackOff" or (ended and ended.get("exitCode")):
                return waiting or f"exit {ended['exitCode']}"
    return None


def _all_on(plane: Plane, digest: str) -> bool | None:
    statuses = [s for p in _pods(plane) for s in p.get("status", {}).get("containerStatuses", [])]
    up = statuses and all(
        s.get("imageID", "").endswith(f"@{digest}") and s.get("ready") for s in statuses
    )
    return True if up else None


def _target(plane: Plane) -> str:
    site, app = plane.site, plane.site.apps[0]
    with plane.gitea.admin() as admin:
        answer = admin.get(
            f"/repos/{app.writeback.repo}/raw/{app.writeback.path}",
            params={"ref": site.branch_of(app.writeback)},
        )
        answer.raise_for_status()
        return answer.text


def _dockerfile(clone: Path, branch: str, dockerfile: str, cmd: str, note: str) -> str:
    """A commit whose Dockerfile starts the app with ``cmd`` (and a note), pushed."""
    _git(clone, "pull", "-q", "--rebase", "origin", branch)
    path = clone / dockerfile
    text = path.read_text().split("\n# bench:")[0].rstrip("\n")
    for known in (GOOD_CMD, BROKEN_CMD):
        text = text.replace(known, cmd)
    if cmd not in text:
        raise SystemExit(f"error: {dockerfile} holds neither {GOOD_CMD!r} nor {BROKEN_CMD!r}")
    path.write_text(f"{text}\n# bench: {note}\n")
    _git(clone, "commit", "-qam", f"rollback bench: {note}")
    _git(clone, "push", "-q", "origin", branch)
    return _git(clone, "rev-parse", "HEAD")


def _broken_run(
    plane: Plane, clone: Path, dockerfile: str, digest: str, note: str
) -> dict[str, Any]:
    """A push whose image cannot start, followed from its pod failing until bench runs
    ``digest`` (the verified one) again; its Workflow ended (the app's lock freed)."""
    site, app = plane.site, plane.site.apps[0]
    broken = _dockerfile(clone, site.gitea.branch, dockerfile, BROKEN_CMD, note)
    how = until(
        "a bench pod of the broken build failing",
        lambda: _failing(plane, broken[:12]),
        BOUND,
        every=0.3,
    )
    failed_at = time.monotonic()
    rolled = f"digest: {digest}"
    until(
        "the target rolled back in Git", lambda: rolled in _target(plane) or None, BOUND, every=0.3
    )
    in_git = time.monotonic() - failed_at
    until(
        "every pod on the verified digest, Ready", lambda: _all_on(plane, digest), BOUND, every=0.3
    )
    ready = time.monotonic() - failed_at
    verdict = until(
        "the broken build's verdict", lambda: _verified(plane, broken), BOUND, every=0.5
    )
    name = f"fabrique-{app.name}-{broken[:12]}"

    def done() -> str | None:
        found = plane.kubectl_json("get", "workflow", name, "-n", site.namespaces.build)
        return (found.get("status") or {}).get("finishedAt")

    until(f"{name} done", done, BOUND, every=0.5)
    return {
        "failing": how,
        "rolled back in Git": round(in_git, 1),
        "pod Ready again": round(ready, 1),
        "verdict": verdict[2],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rollback_latency.py", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="broken pushes (default 3)")
    parser.add_argument("--folder", type=Path, default=None, help="make up's folder")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    plane = Plane(args.folder or default_folder())
    own = plane.values.read_text()  # the plane's site, applied again at the end
    _with_bench(plane)
    site, app = plane.site, plane.site.apps[0]
    assert app.application is not None
    branch, dockerfile = site.gitea.branch, f"{app.context}/Dockerfile"
    release = ("release", "--app", app.name, "--env", "bench", "--by", "rollback bench")
    results: dict[str, Any] = {"good": {}, "runs": []}
    with tempfile.TemporaryDirectory(prefix="rollback-") as scratch:
        work = Path(scratch)
        plane.plane.kubectl("create", "namespace", app.application.namespace, check=False)
        plane.apply(ROOT, work / "tree")
        plane.fabrique(ROOT, "seed", "--app", app.name, "--target", "prod", "--yes")
        clone = _clone(plane, work / "code")
        try:
            sha, pushed_at = _push(clone, branch, f"{app.context}/app.txt", f"good {time.time()}")
            good = _follow(plane, sha, pushed_at)
            state, at, said = until(
                "the good build verified", lambda: _verified(plane, sha), BOUND, every=0.5
            )
            if state != "success":
                raise SystemExit(f"error: the good build: {state}: {said}")
            digest = said.rpartition(" ")[2]
            workflow = plane.kubectl_json(
                "get", "workflow", f"fabrique-{app.name}-{sha[:12]}", "-n", site.namespaces.build
            )
            good["verified"] = round(_epoch(at) - pushed_at, 1)
            good["workflow done"] = round(_epoch(workflow["status"]["finishedAt"]) - pushed_at, 1)
            results["good"] = good
            print(f"good push: {good}", file=sys.stderr)
            for index in range(args.runs):
                run = _broken_run(plane, clone, dockerfile, digest, f"broken {index} {time.time()}")
                results["runs"].append(run)
                print(f"broken push {index + 1}: {run}", file=sys.stderr)
                plane.fabrique(ROOT, *release)
        finally:
            plane.fabrique(ROOT, *release)
            if BROKEN_CMD in (clone / dockerfile).read_text():
                _dockerfile(clone, branch, dockerfile, GOOD_CMD, "restored")
            plane.values.write_text(own)
            plane.apply(ROOT, work / "tree-after")
    added = round(results["good"]["verified"] - results["good"]["pod Ready"], 1)
    print(f"good push: {results['good']}; verified {added} s after the pod was Ready")
    for stage in ("rolled back in Git", "pod Ready again"):
        values = [run[stage] for run in results["runs"]]
        print(
            f"from the broken pod failing to {stage}: p50 {statistics.median(values):.1f} s, "
            f"max {max(values):.1f} s, {len(values)} runs"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
