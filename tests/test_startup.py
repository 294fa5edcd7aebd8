"""What ``fabrique`` imports before it works: the start-up of every command, and most of
an idle ``fabrique reconcile`` pass (bench/RESULTS.md).

The Kubernetes client is the heaviest import: the ``kubernetes`` package, and above all
its ``CoreV1Api`` (hundreds of validated methods). A command imports the package only
once it talks to a cluster, and never ``CoreV1Api``: the core kinds are read and
written by path. Each check runs in a fresh interpreter, whose ``sys.modules`` is what
the command itself imported. No time is checked: these machines are noisy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import GITEA_TOKEN, ROOT, Repo, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .servers import Registry

CORE_V1_API = "kubernetes.client.api.core_v1_api"

# runs ``fabrique <argv>`` as the console script does, then prints the modules it loaded
_RUN = """
import json, sys
from fabrique.cli import main
sys.argv = ["fabrique", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exit:
    code = exit.code
else:
    code = 0
print(json.dumps({"exit": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _loaded(*argv: str, env: dict[str, str] | None = None) -> tuple[int, set[str]]:
    """``fabrique argv`` in a fresh interpreter: its exit code and the modules it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(argv)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(done.stderr.splitlines()[-1])
    return report["exit"], set(report["modules"])


def test_help_and_the_reconcile_entry_import_no_kubernetes_client() -> None:
    code, modules = _loaded("--help")
    assert code == 0
    assert "kubernetes" not in modules
    # the modules of the reconcile command, imported but not run
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, fabrique.cli, fabrique.decisions.reconcile, fabrique.clients.kube;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'urllib3')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_a_reconcile_pass_reads_the_cluster_without_core_v1_api(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    kube: KubeApiDouble,
    registry: Registry,
) -> None:
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "registry.host": registry.host}
    )
    env = {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }
    for _ in range(2):  # without memory, then with it (written, then read)
        code, modules = _loaded("--values", str(values), "reconcile", env=env)
        assert code == 0
        assert "kubernetes" in modules, "it talked to the cluster through the client's config"
        assert CORE_V1_API not in modules
    asked = {part for request in kube.requests for part in request.path.split("/")}
    assert {"configmaps", "workflows"} <= asked, "the memory and the sweep were asked"
