"""The push Workflows' one step on the kwok plane, where no kubelet runs its pod.

The Sensor creates a push's Workflow in the control namespace (``fabrique-push-…``), the
Argo controller makes its pod, the scheduler places it on a kwok node and kwok reports it
Running: nothing runs its container. ``Planner`` does what the container would do: the
pod's own command (``fabrique`` and the pod's arguments: ``plan-push --before … --after
…``), run here with the site's values file, the Gitea token, and a token of the pod's
own ServiceAccount (TokenRequest), so that the real authenticator, RBAC and admission
judge the builds it creates; then it ends the pod with the command's exit code, as
kwok's pod-exit stage reads it. On the real node the pod runs for real
(``tests/live/test_scenario.py``).

``plan`` plays one push's pod and returns what it printed; ``start`` plays every push's
pod as it comes, in the background, until ``stop``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from fabrique.site.names import PLANNER_ACCOUNT, PLANNER_ROLE

from .cluster import Cluster

FABRIQUE = str(Path(sys.executable).parent / "fabrique")
ROLE = f"fabrique.io/role={PLANNER_ROLE}"
EXECUTOR = "system:serviceaccount:{namespace}:fabrique-executor"
POLL_SECONDS = 0.1


class Planner:
    def __init__(
        self, cluster: Cluster, namespace: str, values: Path, env: dict[str, str], folder: Path
    ) -> None:
        self.cluster, self.namespace, self.values, self.env = cluster, namespace, values, env
        self.kubeconfig = folder / "planner.kubeconfig"
        cluster.plane.write_kubeconfig(
            self.kubeconfig, namespace, token=cluster.token(namespace, PLANNER_ACCOUNT)
        )
        self.folder = folder
        self.played: dict[str, subprocess.CompletedProcess[str]] = {}  # pod name -> its run
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def running(self) -> list[dict[str, Any]]:
        """The push pods kwok reports Running that were not played yet."""
        return [
            pod
            for pod in self.cluster.items(f"/api/v1/namespaces/{self.namespace}/pods", ROLE)
            if pod["status"].get("phase") == "Running"
            and pod["metadata"]["name"] not in self.played
        ]

    def play(self, pod: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """Run the pod's main container's command here, then end the pod as it ended;
        what it wrote under ``--out`` is reported as its outputs, as Argo's executor
        reports a step's output files (a folder of its own here, not the pod's /tmp)."""
        (main,) = [c for c in pod["spec"]["containers"] if c["name"] == "main"]
        args = list(main["args"])
        out: Path | None = None
        if "--out" in args:
            out = self.folder / pod["metadata"]["name"]
            args[args.index("--out") + 1] = str(out)
        done = subprocess.run(
            [FABRIQUE, *args],
            env={
                **os.environ,
                "FABRIQUE_VALUES": str(self.values),
                "KUBECONFIG": str(self.kubeconfig),
                **self.env,
            },
            capture_output=True,
            text=True,
            timeout=300,  # a push's write-back waits for its builds
            check=False,
        )
        self.played[pod["metadata"]["name"]] = done
        if out is not None and done.returncode == 0:
            outputs = {f.name: f.read_text() for f in out.iterdir()} if out.is_dir() else {}
            answer = self.cluster.report_outputs(
                pod, outputs, as_user=EXECUTOR.format(namespace=self.namespace)
            )
            assert answer.status == 201, answer.message
        self.cluster.finish(pod, done.returncode)
        return done

    def plan(self, workflow: str, timeout: float = 60) -> str:
        """Play the pod of push Workflow ``workflow`` once it runs; what it printed."""

        def found() -> dict[str, Any] | None:
            pods = [p for p in self.running() if p["metadata"]["name"].startswith(f"{workflow}-")]
            return pods[0] if pods else None

        pod = self.cluster.wait(f"the pod of {workflow} running", found, timeout=timeout)
        done = self.play(pod)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self) -> Planner:
        def loop() -> None:
            while not self._stop.wait(POLL_SECONDS):
                for pod in self.running():
                    self.play(pod)

        self._thread = threading.Thread(target=loop, name="planner", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
