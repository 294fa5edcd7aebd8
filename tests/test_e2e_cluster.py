"""Checks that need a live cluster with Argo Workflows. Skipped without one.

Set E2E_KUBECONTEXT to a kube context (a one-node bench cluster is enough).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from .conftest import ROOT

CONTEXT = os.environ.get("E2E_KUBECONTEXT")

pytestmark = [
    pytest.mark.e2e_cluster,
    pytest.mark.skipif(
        not CONTEXT, reason="needs a live cluster: set E2E_KUBECONTEXT to a kube context"
    ),
]


def test_the_api_server_accepts_the_tree() -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is required for cluster checks"
    result = subprocess.run(
        [
            kubectl,
            "--context",
            str(CONTEXT),
            "apply",
            "-k",
            str(ROOT / "manifests"),
            "--dry-run=server",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
