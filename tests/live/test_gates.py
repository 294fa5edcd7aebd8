"""The bench scenario's gates (bench/scenarios/gates.py) on the local control plane.

What a write-back pinned is deployed the way Argo CD would apply it (kustomize, then the
API server); the Deployment and ReplicaSet controllers, the scheduler and kwok make its
pods, and the gates read them as the scenario does on a real cluster. Two gates cannot
pass here: whether the Application is Synced and Healthy needs Argo CD, and a pod that
really pulls and runs its image by digest needs a kubelet and a container runtime (kwok
reports Ready without pulling anything, so gate 3 finds no imageID). The real node's
scenario (``test_scenario.py``) passes them all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from ..conftest import GITEA_TOKEN, KUSTOMIZATION, ROOT, Repo, run_cli, write_values
from ..doubles.gitea import GiteaDouble
from ..oci import push_image
from ..servers import Registry
from .cluster import Cluster
from .controlplane import APP_DEPLOYMENT

sys.path.insert(0, str(ROOT / "bench" / "scenarios"))
import gates

BASE = "dataops/citation-dagster/deploy/base"
# the scenario's app (its readiness probe is kwok's to fake here), with two pods: a gate
# judges every pod of the Deployment
DEPLOYMENT = yaml.safe_dump(
    (deployment := yaml.safe_load(APP_DEPLOYMENT)) | {"spec": deployment["spec"] | {"replicas": 2}},
    sort_keys=False,
)


def test_the_scenarios_gates_pass_on_what_a_write_back_deploys(
    cluster: Cluster,
    applied: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    tmp_path: Path,
) -> None:
    code_repo.commit(
        {
            f"{BASE}/deployment.yaml": DEPLOYMENT,
            f"{BASE}/kustomization.yaml": "resources:\n  - deployment.yaml\n",
        },
        "base",
    )
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    digest = push_image(registry.url, "citation-dagster", revision[:12])
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "registry.host": registry.host}
    )
    env = {"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN, "KUBECONFIG": str(cluster.kubeconfig)}

    def writeback() -> str:
        result = run_cli(
            "--values", str(values), "writeback", "--app", "citation",
            "--revision", revision, "--digest", digest, env=env,
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        return result.stdout

    assert writeback().startswith("changed:")
    submitted = run_cli(
        "--values", str(values), "submit", "--app", "citation", "--revision", revision, env=env
    )
    assert submitted.exit_code == 0, submitted.stderr

    # deployed as Argo CD would: kustomize over the overlay at the branch head
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(code_repo.bare), str(checkout)], check=True)
    overlay = (checkout / KUSTOMIZATION).parent
    rendered = cluster.kubectl("kustomize", str(overlay))
    cluster.kubectl("create", "namespace", "dagster", check=False)
    cluster.kubectl("apply", "--server-side", "-n", "dagster", "-f", "-", stdin=rendered)

    def ready_pods() -> dict[str, object] | None:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", "dagster", "-o", "json"))
        ready = [
            p
            for p in pods["items"]
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions", [])
            )
        ]
        return pods if len(ready) == 2 else None

    pods = cluster.wait("the Deployment's two pods Ready", ready_pods, timeout=90)
    workloads = json.loads(
        cluster.kubectl("get", "deploy,statefulset", "-n", "dagster", "-o", "json")
    )
    assert gates.deployed_by_digest(workloads) == []
    # Ready, and by digest; but kwok pulls and runs nothing, so no pod has the imageID
    # that gate 3 wants (the real node's scenario has: tests/live/test_scenario.py)
    problems = gates.pods_ready_by_digest(pods)
    assert len(problems) == 2 and all("runs imageID ''" in p for p in problems), problems
    image = workloads["items"][0]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"

    # gate 4: a replay of submit and write-back changes nothing
    before = code_repo.head()
    again = run_cli(
        "--values", str(values), "submit", "--app", "citation", "--revision", revision, env=env
    )
    assert gates.replay_is_noop(again.stdout, writeback(), before, code_repo.head()) == []
