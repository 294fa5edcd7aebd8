"""The safety net's sweep lists the build Workflows by the phase label the real Argo
controller sets (``workflows.argoproj.io/phase``): its one LIST leaves the Succeeded
out, and a build it saw running that is gone from that LIST is found among the
Succeeded of its revision, not taken for deleted (issue 29 #7)."""

from __future__ import annotations

from pathlib import Path

from fabrique.decisions.reconcile import SUCCEEDED, SWEPT
from fabrique.site.names import LABEL_REVISION

from .. import payloads
from .cluster import Cluster
from .test_workflows import BUILD_NS, RUN, RUN_OUTPUTS, ended, start, walk


def test_the_sweeps_lists_follow_the_controllers_phase_label(
    cluster: Cluster, applied: Path
) -> None:
    good, bad = payloads.revision(), payloads.revision()
    succeeded, failed = start(cluster, good), start(cluster, bad)
    kube = cluster.kube()
    assert {succeeded, failed} <= {w.name for w in kube.workflows(BUILD_NS, SWEPT)}, "running"
    walk(cluster, succeeded, [(RUN, 0)])
    walk(cluster, failed, [(RUN, 3), ("report-failure", 0)], RUN_OUTPUTS | {"outcome": "failed"})
    ended(cluster, succeeded, "Succeeded")
    ended(cluster, failed, "Failed")
    swept = {w.name for w in kube.workflows(BUILD_NS, SWEPT)}
    assert failed in swept and succeeded not in swept
    among = f"{SUCCEEDED},{LABEL_REVISION} in ({good[:12]},{bad[:12]})"
    assert [(w.name, w.revision) for w in kube.workflows(BUILD_NS, among)] == [(succeeded, good)]
