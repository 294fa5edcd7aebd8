"""The chain at the speed of its build: from a push to the app's pod Ready by digest, stage
by stage, on the real node of ``make up``'s plane, before and after a change, side by side.

    make up
    .venv/bin/python bench/chain_latency.py --pushes 5 --before REV

For each variant (``--before REV``: the build's WorkflowTemplate as that commit renders
it; then this checkout's), this checkout's tree is rendered with the plane's site values
and applied, the variant's WorkflowTemplate over it,
then ``--pushes`` commits are pushed to the first app's context, one at a time, each
followed until the app's pod runs its digest. Beside each push, the same context is
built by ``buildctl-daemonless.sh`` alone on the host (``tests/live/buildkit.py``:
BuildKit's state fresh, as a build pod's is), pushing the image and exporting the same
registry cache as the build does, to the same registry. Nothing here tells Argo CD to
look: it learns of the write-back as the site makes it learn (Gitea's webhook, which
``fabrique seed`` makes, or its own poll).

Each stage is counted from the moment ``git push`` returned (the clone before it and the
push's own time left out), from the objects' own timestamps (whole seconds: each
figure is within a second) and from the containers' own start and finish, read from the
build's pod while it runs (Argo deletes a pod that succeeded):

- ``push workflow``: the push's Workflow's ``creationTimestamp`` (the Sensor's, in the
  control namespace);
- ``workflow``: the build's Workflow's ``creationTimestamp`` (its push's step made it);
- ``build started``: the build container's ``startedAt`` (its script's start, held by
  Argo's executor until the stages before it ended, is the container's own
  ``startedAt`` in a containerSet only when nothing held it: the later of that and the
  end of the stage before it);
- ``image pushed``: the build container's ``finishedAt`` (buildctl has pushed the image
  and its cache);
- ``digest in Git``: the write-back commit's committer date in Gitea;
- ``synced``: the Application's ``operationState.finishedAt`` at that commit;
- ``pod Ready``: the app's pod whose ``imageID`` is the digest, its ``Ready`` condition.

Prints one table per variant (p50 and max of each stage) and the bare build's, then one
JSON object with every push (``--json FILE`` writes it too).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabrique.site.config import Site, load_site  # noqa: E402
from fabrique.site.names import PUSH_PREFIX  # noqa: E402
from pipelines.build import STEP_LABEL  # noqa: E402
from tests.live.argocd import ArgoCD  # noqa: E402
from tests.live.buildkit import builder  # noqa: E402
from tests.live.controlplane import (  # noqa: E402
    ControlPlane,
    default_folder,
    resolving,
    site_values,
)
from tests.live.gitea import USER, Gitea  # noqa: E402
from tests.waits import until  # noqa: E402

STAGES = (
    "push workflow",
    "workflow",
    "build started",
    "image pushed",
    "digest in Git",
    "synced",
    "pod Ready",
)
PUSH_BOUND = 300.0  # seconds a push may take to reach its pod, or the bench fails


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Plane:
    """``make up``'s plane, as the bench reads and drives it."""

    def __init__(self, folder: Path) -> None:
        plane = ControlPlane.load(folder)
        gitea = Gitea.load(folder / "gitea")
        argocd = ArgoCD.load(folder / "argocd", plane) if plane is not None else None
        path = folder / "event-path.json"
        if plane is None or gitea is None or argocd is None or not plane.alive():
            raise SystemExit(f"error: no plane up in {folder}: make up first")
        self.folder, self.plane, self.gitea = folder, plane, gitea
        self.bearer = Path(json.loads(path.read_text())["bearer_file"]).read_text().strip()
        # seed's target, as make scenario's: this plane's context, and its Argo CD's
        # server on loopback for the hooks that tell it of a write-back
        target = {"context": "fabrique-live", "argoCdWebhook": argocd.webhook_url}
        self.values = folder / "chain-site.yaml"
        self.values.write_text(json.dumps(site_values(plane, targets={"prod": target})))
        self.site: Site = load_site(self.values, env={})
        # what an older fabrique reads: the plane's site alone (it renders the template)
        self.plain = folder / "chain-site-plain.yaml"
        self.plain.write_text(json.dumps(site_values(plane)))

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        out = self.plane.kubectl(*args, "-o", "json", check=False)
        return json.loads(out) if out.strip().startswith("{") else {}

    def fabrique(self, checkout: Path, *args: str, values: Path | None = None) -> None:
        """``fabrique <args>`` of ``checkout`` (a variant's code) against the plane."""
        env = {
            **os.environ,
            "PYTHONPATH": str(checkout),
            "KUBECONFIG": str(self.plane.kubeconfig),
            "FABRIQUE_VALUES": str(values or self.values),
            "FABRIQUE_GITEA_TOKEN": self.gitea.token,
            "FABRIQUE_WEBHOOK_TOKEN": self.bearer,
        }
        argv = resolving(self.folder / "hosts", [sys.executable, "-m", "fabrique", *args])
        # run from the checkout: ``-m`` puts the working directory ahead of PYTHONPATH
        done = subprocess.run(
            argv, env=env, cwd=checkout, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"error: fabrique {' '.join(args)}: {done.stderr.strip()}")

    def apply(self, checkout: Path, out: Path) -> None:
        """The variant's build: this checkout's tree applied, then the variant's own
        WorkflowTemplate over it, as its fabrique renders it (the rest of an older tree,
        its site ConfigMap, is not for this checkout's tools image)."""
        self.fabrique(ROOT, "render", "--out", str(out / "now"))
        self.plane.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(out / "now"))
        if checkout != ROOT:
            self.fabrique(checkout, "render", "--out", str(out / "variant"), values=self.plain)
            template = out / "variant" / "build" / "workflowtemplate.yaml"
            self.plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(template))


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _clone(plane: Plane, into: Path) -> Path:
    site = plane.site
    url = urlsplit(plane.gitea.url)
    authed = url._replace(netloc=f"{USER}:{quote(plane.gitea.token)}@{url.netloc}")
    remote = urlunsplit(authed._replace(path=f"/{site.gitea.code_repo}.git"))
    _git(into.parent, "clone", "-q", "--branch", site.gitea.branch, remote, into.name)
    _git(into, "config", "user.name", "chain bench")
    _git(into, "config", "user.email", "bench@example.invalid")
    return into


def _push(clone: Path, branch: str, app_file: str, nonce: str) -> tuple[str, float]:
    """A commit to the app's context, pushed: its sha, and when the push returned."""
    _git(clone, "pull", "-q", "--rebase", "origin", branch)
    path = clone / app_file
    path.write_text(f"{path.read_text()}{nonce}\n")
    _git(clone, "commit", "-qam", f"chain bench: {nonce}")
    _git(clone, "push", "-q", "origin", branch)
    return _git(clone, "rev-parse", "HEAD"), time.time()


def _follow(plane: Plane, sha: str, pushed_at: float) -> dict[str, float]:
    """The stages of the push of ``sha``, in seconds after ``pushed_at``."""
    site, app = plane.site, plane.site.apps[0]
    build_ns, name = site.namespaces.build, f"fabrique-{app.name}-{sha[:12]}"
    seen: dict[str, str] = {}

    def built() -> str | None:
        if "push workflow" not in seen:
            pushes = plane.kubectl_json("get", "workflows", "-n", site.namespaces.control)
            for push in pushes.get("items", []):
                if push["metadata"]["name"].startswith(f"{PUSH_PREFIX}{sha[:12]}-"):
                    seen["push workflow"] = push["metadata"]["creationTimestamp"]
        workflow = plane.kubectl_json("get", "workflow", name, "-n", build_ns)
        if not workflow:
            return None
        seen["workflow"] = workflow["metadata"]["creationTimestamp"]
        pods = plane.kubectl_json(
            "get", "pods", "-n", build_ns, "-l", f"workflows.argoproj.io/workflow={name}"
        )
        for pod in pods.get("items", []):
            statuses = {c["name"]: c for c in pod["status"].get("containerStatuses", [])}
            ended = {
                n: c["state"]["terminated"]
                for n, c in statuses.items()
                if (c.get("state") or {}).get("terminated")
            }
            if "build" in statuses:  # the build's one pod: its build container
                build, before = ended.get("build"), ended.get("checkout")
            elif (pod["metadata"].get("labels") or {}).get(STEP_LABEL) == "build":
                build, before = ended.get("main"), None  # a build step's pod of its own
            else:
                continue
            if build and build.get("exitCode") == 0:
                # held by Argo's executor until the checkout ended, in one pod
                starts = [build["startedAt"], *([before["finishedAt"]] if before else [])]
                seen["build started"] = max(starts, key=_epoch)
                seen["image pushed"] = build["finishedAt"]
        phase = (workflow.get("status") or {}).get("phase")
        if phase in ("Failed", "Error"):
            raise SystemExit(f"error: {name} is {phase}: {workflow['status'].get('message')}")
        return workflow if phase == "Succeeded" else None  # type: ignore[return-value]

    workflow: dict[str, Any] = until(f"{name} Succeeded", built, PUSH_BOUND, every=0.5)
    outputs = [
        p
        for n in workflow["status"]["nodes"].values()
        for p in (n.get("outputs") or {}).get("parameters", [])
    ]
    commit = next(p["value"] for p in outputs if p["name"] == "commit" and p.get("value"))
    digest = next(p["value"] for p in outputs if p["name"] == "digest" and p.get("value"))
    with plane.gitea.admin() as admin:
        answer = admin.get(f"/repos/{site.gitea.code_repo}/git/commits/{commit}")
        answer.raise_for_status()
        seen["digest in Git"] = answer.json()["commit"]["committer"]["date"]
    deployment = app.deployment()
    assert deployment is not None

    def synced() -> bool | None:
        application = plane.kubectl_json(
            "get", "application", deployment.name, "-n", deployment.namespace
        )
        state = (application.get("status") or {}).get("operationState") or {}
        if (state.get("syncResult") or {}).get("revision") == commit and state.get("finishedAt"):
            seen["synced"] = state["finishedAt"]
            return True
        return None

    until(f"the Application at {commit[:12]}", synced, PUSH_BOUND, every=0.5)

    def ready() -> bool | None:
        pods = plane.kubectl_json("get", "pods", "-n", deployment.destination)
        for pod in pods.get("items", []):
            status = pod.get("status") or {}
            ids = [c.get("imageID", "") for c in status.get("containerStatuses", [])]
            up = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
            if any(digest in i for i in ids) and up and up[0]["status"] == "True":
                seen["pod Ready"] = up[0]["lastTransitionTime"]
                return True
        return None

    until(f"the app's pod Ready on {digest}", ready, PUSH_BOUND, every=0.5)
    return {stage: round(_epoch(seen[stage]) - pushed_at, 1) for stage in STAGES if stage in seen}


def _bare(plane: Plane, clone: Path, sha: str) -> float:
    """The same context built by ``buildctl-daemonless.sh`` alone on the host, as the
    scenario's bare build (``registry:80`` mirrored to the plane's registry), pushing the
    image and exporting the registry cache as the build does: its seconds."""
    context = plane.site.apps[0].context
    registry = plane.plane.registry
    image = f"{registry}/citation-dagster-bare:{sha[:12]}"
    cache = f"type=registry,ref={registry}/citation-dagster-bare:buildcache"
    options = [
        *("--output", f"type=image,name={image},push=true"),
        *("--export-cache", f"{cache},mode=max", "--import-cache", cache),
    ]
    with builder() as bench:
        source = bench.folder("context")
        shutil.copytree(clone / context, source, dirs_exist_ok=True)
        for path in [source, *source.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        started = time.monotonic()
        done = bench.buildctl(source, registry, options, timeout=600)
        took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"error: the bare build failed: {done.stdout[-2000:]}")
    return round(took, 1)


def _summary(runs: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    return {
        stage: (statistics.median(values), max(values))
        for stage in STAGES
        if (values := [run[stage] for run in runs if stage in run])
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="chain_latency.py", description=__doc__.split("\n")[0])
    parser.add_argument("--pushes", type=int, default=5, help="pushes per variant (default 5)")
    parser.add_argument("--before", metavar="REV", help="also measure fabrique as of REV, first")
    parser.add_argument("--folder", type=Path, default=None, help="make up's folder")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    plane = Plane(args.folder or default_folder())
    app = plane.site.apps[0]
    app_file = f"{app.context}/app.txt"
    results: dict[str, Any] = {"pushes": args.pushes, "variants": {}, "bare": []}
    with tempfile.TemporaryDirectory(prefix="chain-") as scratch:
        work = Path(scratch)
        variants: list[tuple[str, Path]] = []
        if args.before:
            old = work / "before"
            _git(ROOT, "worktree", "add", "-q", "--detach", str(old), args.before)
            variants.append((f"before ({args.before})", old))
        head = _git(ROOT, "rev-parse", "--short", "HEAD")
        variants.append((f"after ({head})", ROOT))
        clone = _clone(plane, work / "code")
        # the app's Application and the hooks, as a platform team seeds them (a replay
        # changes nothing)
        plane.fabrique(ROOT, "seed", "--app", app.name, "--target", "prod", "--yes")
        try:
            for label, checkout in variants:
                plane.apply(checkout, work / f"tree-{len(results['variants'])}")
                runs = []
                for index in range(args.pushes):
                    sha, pushed_at = _push(
                        clone, plane.site.gitea.branch, app_file, f"{label} {index} {time.time()}"
                    )
                    runs.append(_follow(plane, sha, pushed_at))
                    results["bare"].append(_bare(plane, clone, sha))
                    print(f"{label} push {index + 1}: {runs[-1]}", file=sys.stderr)
                results["variants"][label] = runs
        finally:
            if args.before:
                _git(ROOT, "worktree", "remove", "--force", str(work / "before"))
    bare = results["bare"]
    print(
        f"bare build (buildctl alone, same cache export): p50 {statistics.median(bare):.1f} s, "
        f"max {max(bare):.1f} s, {len(bare)} builds"
    )
    for label, runs in results["variants"].items():
        print(f"\n{label}, {len(runs)} pushes: seconds after the push (p50 / max)")
        for stage, (p50, top) in _summary(runs).items():
            print(f"  {stage:<14} {p50:6.1f} {top:6.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
