"""Workflows as fabrique's three callers create them, judged by the real API server
(admission: the ValidatingAdmissionPolicy, Pod Security, the ServiceAccount plugin) and
run by the real Argo controller, with kwok as the kubelet."""

from __future__ import annotations

import copy
import datetime
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabrique.decisions.workflow import build_workflow
from fabrique.site.config import load_site

from .. import payloads
from ..conftest import run_cli
from ..doubles.sensor import fire
from ..manifests import find
from .cluster import ARGO, NODE_ID, WORKFLOW_LABEL, Answer, Cluster

SITE = load_site(env={})
BUILD_NS = "fabrique-build"
CONTROL_NS = "fabrique"
EXECUTOR = f"system:serviceaccount:{BUILD_NS}:fabrique-executor"


def create_workflow(cluster: Cluster, body: dict[str, Any], token: str | None = None) -> Answer:
    """As the admin, or as the holder of ``token``."""
    namespace = body["metadata"]["namespace"]
    return cluster.create(f"{ARGO}/namespaces/{namespace}/workflows", body, token=token)


def sensor_workflow(tree: Path, sha: str) -> dict[str, Any]:
    """The push Workflow the committed Sensor's trigger makes of a push of ``sha``, as
    the Sensor double renders it (``tests/live/test_events.py`` has the real Sensor make
    its own)."""
    sensor = find(tree, "Sensor", "fabrique-build")
    event = payloads.push(after=sha, files=["dataops/citation-dagster/app.txt"])
    return fire(sensor["spec"]["triggers"][0], event)


# -- b. admission ---------------------------------------------------------------------------


def test_the_sensor_s_push_workflow_from_its_token_is_admitted_and_a_redelivery_meets_409(
    cluster: Cluster, applied: Path
) -> None:
    """The trigger's push Workflow (``sensor_workflow``) created with a real token of the
    Sensor's ServiceAccount, as the Sensor creates it, in the control namespace:
    admitted; the same again, 409."""
    token = cluster.token(CONTROL_NS, "fabrique-sensor")
    body = sensor_workflow(applied, payloads.revision())
    answer = create_workflow(cluster, body, token=token)
    assert answer.status == 201, answer.message
    again = create_workflow(cluster, copy.deepcopy(body), token=token)
    assert again.status == 409
    assert again.body["reason"] == "AlreadyExists"
    name = body["metadata"]["name"]
    cluster.request("DELETE", f"{ARGO}/namespaces/{CONTROL_NS}/workflows/{name}")


def test_the_sensor_may_create_nothing_but_a_push_workflow(cluster: Cluster, applied: Path) -> None:
    """Its account's other Workflows in the control namespace are refused by admission:
    another template, or inline templates running as another account."""
    token = cluster.token(CONTROL_NS, "fabrique-sensor")
    body = sensor_workflow(applied, payloads.revision())
    body["spec"]["workflowTemplateRef"] = {"name": "fabrique-build"}
    answer = create_workflow(cluster, body, token=token)
    assert answer.status == 422, answer.message
    assert "fabrique-sensor-creates-pushes" in answer.message
    assert "must reference the WorkflowTemplate fabrique-push" in answer.message


def test_a_push_s_build_from_the_planner_s_token_is_admitted_and_again_meets_409(
    cluster: Cluster, applied: Path
) -> None:
    """What ``fabrique plan-push`` creates, with a real token of the planner's account:
    admitted in the build namespace; asked again, 409, which it takes as success."""
    token = cluster.token(CONTROL_NS, "fabrique-planner")
    body = build_workflow(SITE, "citation", payloads.revision(), submitted_by="push")
    answer = create_workflow(cluster, body, token=token)
    assert answer.status == 201, answer.message
    again = create_workflow(cluster, copy.deepcopy(body), token=token)
    assert (again.status, again.body["reason"]) == (409, "AlreadyExists")
    cluster.request("DELETE", f"{ARGO}/namespaces/{BUILD_NS}/workflows/{body['metadata']['name']}")


def test_the_reconcilers_workflow_is_admitted(cluster: Cluster, applied: Path) -> None:
    body = build_workflow(SITE, "citation", payloads.revision(), submitted_by="reconciler")
    answer = create_workflow(cluster, body)
    assert answer.status == 201, answer.message


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (
            lambda spec: spec.update(
                templates=[{"name": "x", "container": {"image": "busybox"}}], entrypoint="x"
            ),
            "may hold only spec.workflowTemplateRef and spec.arguments",
        ),
        (
            lambda spec: spec.update(workflowTemplateRef={"name": "another"}),
            "must reference the WorkflowTemplate fabrique-build",
        ),
        (
            lambda spec: spec["arguments"]["parameters"].append({"name": "image", "value": "x"}),
            "may pass only the parameters app, revision, force",
        ),
    ],
    ids=["inline-template", "another-template", "another-parameter"],
)
def test_the_api_server_refuses_any_other_workflow_in_the_build_namespace(
    cluster: Cluster, applied: Path, change: Any, refusal: str
) -> None:
    body = build_workflow(SITE, "citation", payloads.revision(), submitted_by="cli")
    change(body["spec"])
    answer = create_workflow(cluster, body)
    assert answer.status == 422, answer.body
    assert refusal in answer.message
    assert "fabrique-build-workflows" in answer.message


def test_the_api_server_refuses_a_workflow_named_for_another_commit(
    cluster: Cluster, applied: Path
) -> None:
    body = build_workflow(SITE, "citation", payloads.revision(), submitted_by="cli")
    body["metadata"]["name"] = f"fabrique-citation-{payloads.revision()[:12]}"
    answer = create_workflow(cluster, body)
    assert answer.status == 422, answer.body
    assert (
        "must be named fabrique-<app>-<the first 12 characters of its revision>" in answer.message
    )


def test_a_sha256_revision_is_admitted_labelled_by_its_sha12_and_run(
    cluster: Cluster, applied: Path
) -> None:
    """A label value holds at most 63 characters and a SHA-256 commit id is 64: the API
    server refuses it as a label, and the controller refuses it from labelsFrom. The
    label holds the sha12, the annotation the whole; submit finds the Workflow again."""
    sha = (uuid.uuid4().hex * 2)[:64]
    env = {"KUBECONFIG": str(cluster.kubeconfig)}
    first = run_cli("submit", "--app", "citation", "--revision", sha, env=env)
    assert first.exit_code == 0, first.stderr
    again = run_cli("submit", "--app", "citation", "--revision", sha, env=env)
    assert again.stdout.startswith("already exists:"), again.stdout + again.stderr
    name = f"fabrique-citation-{sha[:12]}"
    stored = cluster.workflow(BUILD_NS, name)
    assert stored["metadata"]["labels"]["fabrique.io/revision"] == sha[:12]
    assert stored["metadata"]["annotations"]["fabrique.io/revision"] == sha
    other = (uuid.uuid4().hex * 2)[:64]
    pushed = build_workflow(SITE, "citation", other, submitted_by="push")
    assert create_workflow(cluster, pushed).status == 201
    # the controller takes one (labelsFrom) and labels its pods with the sha12
    running = start(cluster, sha)
    pod = step_pod(cluster, running, RUN)
    assert pod["metadata"]["labels"]["fabrique.io/revision"] == sha[:12]
    assert (
        cluster.workflow(BUILD_NS, running)["metadata"]["labels"]["fabrique.io/revision"]
        == sha[:12]
    )


# -- c. the controller runs them --------------------------------------------------------------


def start(cluster: Cluster, sha: str | None = None) -> str:
    """A build Workflow for an app of its own: the template holds one mutex per app, and
    the Workflows that other tests leave running would keep this one waiting for it."""
    app = f"live-{uuid.uuid4().hex[:6]}"
    body = build_workflow(SITE, "citation", sha or payloads.revision(), submitted_by="cli")
    name = body["metadata"]["name"].replace("citation", app)
    body["metadata"]["name"] = name
    body["metadata"]["labels"]["fabrique.io/app"] = app
    body["spec"]["arguments"]["parameters"][0] = {"name": "app", "value": app}
    answer = create_workflow(cluster, body)
    assert answer.status == 201, answer.message
    return str(name)


def step_pod(
    cluster: Cluster, workflow: str, step: str, namespace: str = BUILD_NS, phase: str | None = None
) -> dict[str, Any]:
    """The pod of ``step``'s latest attempt (in ``phase``); a Workflow that ends first
    fails the wait with its message."""

    def probe() -> dict[str, Any] | None:
        pod = cluster.pod_of(namespace, workflow, step)
        if pod is not None and (phase is None or pod["status"].get("phase") == phase):
            return pod
        status = cluster.workflow(namespace, workflow).get("status") or {}
        if status.get("phase") in ("Failed", "Error"):
            raise AssertionError(f"{workflow} is {status['phase']}: {status.get('message')}")
        return None

    try:
        return cluster.wait(f"the pod of {step} in {workflow}", probe, timeout=90)
    except AssertionError as late:
        status = cluster.workflow(namespace, workflow).get("status") or {}
        pods = {
            p["metadata"]["name"]: p["status"].get("phase")
            for p in cluster.workflow_pods(namespace, workflow)
        }
        raise AssertionError(
            f"{late}; {workflow}: {status.get('phase')} {status.get('message')!r}, "
            f"synchronization {status.get('synchronization')}, pods {pods}"
        ) from None


def phase(cluster: Cluster, namespace: str, workflow: str) -> str:
    return str((cluster.workflow(namespace, workflow).get("status") or {}).get("phase") or "")


DIGEST = "sha256:" + "ab" * 32
RUN = "run"  # the build's one pod
# what the executor reports for it: the outputs of its ``main`` container
RUN_OUTPUTS = {
    "outcome": "changed",
    "commit": "c0" * 20,
    "verify": "",  # no environment to look at after it (the site has none)
    "digest": DIGEST,
    "reason": "1 file(s) changed under dataops/citation-dagster: app.txt",
}
# its containers, in the order they run (report-pending beside the checkout)
STAGES = [
    "plan",
    "report-pending",
    "checkout",
    "build",
    "verify-digest",
    "write-back",
    "main",
]


def walk(
    cluster: Cluster,
    workflow: str,
    ends: list[tuple[str, int]],
    outputs: dict[str, str] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Play each pod as the kubelet and the executor would: it runs, its outputs are
    reported (the build's, ``outputs`` or RUN_OUTPUTS, whatever its end: the executor
    saves them from the pod's volumes, defaults where a file is missing), it exits with
    the code given. ``run(1)`` is the pod's second attempt. Each pod, as it ran."""
    played = []
    for step, code in ends:
        pod = step_pod(cluster, workflow, step, phase="Running")
        played.append((step, pod))
        if step.split("(")[0] == RUN:
            # the builder never runs on the control plane (the plane offers both nodes)
            assert pod["spec"]["nodeName"] == "kwok-worker-0", f"{step} on the control plane"
            answer = cluster.report_outputs(pod, outputs or RUN_OUTPUTS, as_user=EXECUTOR)
            assert answer.status == 201, answer.message
        cluster.finish(pod, code)
    return played


def ended(cluster: Cluster, workflow: str, phase_: str) -> None:
    cluster.wait(
        f"{workflow} {phase_}",
        lambda: phase(cluster, BUILD_NS, workflow) == phase_ or None,
        timeout=120,
    )


def test_a_build_is_one_pod_on_a_worker_its_stages_in_order(
    cluster: Cluster, applied: Path
) -> None:
    """The real controller makes one pod for a whole build, its stages the containers
    of a containerSet, which Argo's executor runs in order: each waits for the ones it
    depends on (the pod's ``/var/run/argo/template``)."""
    workflow = start(cluster)
    ((_, pod),) = walk(cluster, workflow, [(RUN, 0)])
    ended(cluster, workflow, "Succeeded")
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["wait", *STAGES] or names == [*STAGES, "wait"], names
    pods = cluster.workflow_pods(BUILD_NS, workflow)
    assert [p["metadata"]["name"] for p in pods] == [pod["metadata"]["name"]], "one pod"
    stored = cluster.workflow(BUILD_NS, workflow)
    run = next(n for n in stored["status"]["nodes"].values() if n["displayName"] == RUN)
    assert {p["name"]: p["value"] for p in run["outputs"]["parameters"]} == RUN_OUTPUTS
    # a container's node is named for its pod's: run(0).plan
    containers = {
        n["displayName"].rsplit(".", 1)[-1]: n["phase"]
        for n in stored["status"]["nodes"].values()
        if n.get("type") == "Container"
    }
    assert containers == dict.fromkeys(STAGES, "Succeeded")


def test_metrics_count_each_runs_outcome_once(cluster: Cluster, applied: Path) -> None:
    """The real controller's metrics endpoint: a build whose pod was lost and whose second
    pod passed counts once, as passed; a write-back refused for good counts once, as
    failed; a skipped plan counts no write-back. No run carries a MetricsError
    condition."""
    retried, refused, skipped = start(cluster), start(cluster), start(cluster)
    delete_running(cluster, step_pod(cluster, retried, RUN, phase="Running"))
    walk(cluster, refused, [(RUN, 3), ("report-failure", 0)], RUN_OUTPUTS | {"outcome": "failed"})
    walk(cluster, skipped, [(RUN, 0)], {"outcome": "none", "commit": "", "digest": ""})
    walk(cluster, retried, [("run(1)", 0)])
    ended(cluster, retried, "Succeeded")
    ended(cluster, refused, "Failed")
    ended(cluster, skipped, "Succeeded")
    series = cluster.plane.metrics()
    app = {
        name: cluster.workflow(BUILD_NS, name)["metadata"]["labels"]["fabrique.io/app"]
        for name in (retried, refused, skipped)
    }
    build = "argo_workflows_fabrique_build_duration_seconds_count"
    writeback = "argo_workflows_fabrique_writeback_total"
    assert series.get(f'{build}{{app="{app[retried]}",status="Succeeded"}}') == 1
    assert series.get(f'{build}{{app="{app[retried]}",status="Error"}}') is None
    stored = cluster.workflow(BUILD_NS, retried)["status"]
    assert series.get(f'{writeback}{{app="{app[retried]}",outcome="changed"}}') == 1, (
        stored.get("outputs"),
        stored.get("conditions"),
        [(n["displayName"], n.get("type")) for n in stored["nodes"].values()],
    )
    assert series.get(f'{writeback}{{app="{app[refused]}",outcome="failed"}}') == 1
    assert series.get(f'{build}{{app="{app[refused]}",status="Failed"}}') == 1
    assert series.get(f'{build}{{app="{app[skipped]}",status="Succeeded"}}') == 1
    assert not [key for key in series if writeback in key and app[skipped] in key]
    for name in (retried, refused, skipped):
        conditions = cluster.workflow(BUILD_NS, name)["status"].get("conditions") or []
        assert [c for c in conditions if c["type"] == "MetricsError"] == [], name


def test_a_failed_stage_fails_the_workflow_and_the_exit_handler_reports(
    cluster: Cluster, applied: Path
) -> None:
    workflow = start(cluster)
    walk(cluster, workflow, [(RUN, 1), ("report-failure", 0)])
    ended(cluster, workflow, "Failed")


def delete_running(cluster: Cluster, pod: dict[str, Any]) -> None:
    """Delete a step's pod as a preemption or a drain would, once Argo holds its node
    Running for longer than its grace for a missing pod (the plane's
    RECENTLY_STARTED_POD_DURATION): sooner, the controller only makes the same pod again
    (``podReconciliation``, then ``createWorkflowPod``)."""
    meta = pod["metadata"]
    workflow, node_id = meta["labels"][WORKFLOW_LABEL], meta["annotations"][NODE_ID]
    node = cluster.wait(
        f"{meta['name']}'s node Running",
        lambda: (n := cluster.nodes_of(BUILD_NS, workflow)[node_id])["phase"] == "Running" and n,
    )
    started = datetime.datetime.fromisoformat(node["startedAt"].replace("Z", "+00:00"))
    grace = started + datetime.timedelta(seconds=4)
    time.sleep(max(0.0, (grace - datetime.datetime.now(datetime.UTC)).total_seconds()))
    cluster.delete(pod)


def test_a_pod_is_made_again_only_when_it_was_lost(cluster: Cluster, applied: Path) -> None:
    """The real controller evaluates the pod's retry expression: a deleted pod and a
    node-pressure eviction get a second pod. A stage that gave up on a transient cause
    (exit 75: it retried itself, ``build.retries`` times), a wrong answer (exit 3) and an
    eviction for the pod's own excess do not. One Workflow per ending, side by side (the
    first backoff is 10 s)."""
    ends: dict[str, Any] = {
        "deleted": lambda pod: delete_running(cluster, pod),
        "node-pressure": lambda pod: cluster.evict(
            pod, "The node was low on resource: ephemeral-storage. "
        ),
        "transient": lambda pod: cluster.finish(pod, 75),
        "wrong-answer": lambda pod: cluster.finish(pod, 3),
        "own-excess": lambda pod: cluster.evict(
            pod, "Pod ephemeral local storage usage exceeds the total limit of containers 2Gi. "
        ),
    }
    workflows = {end: start(cluster) for end in ends}
    for end, workflow in workflows.items():
        ends[end](step_pod(cluster, workflow, RUN, phase="Running"))
    for end in ("deleted", "node-pressure"):
        assert step_pod(cluster, workflows[end], "run(1)", phase="Running"), end
    for end in ("transient", "wrong-answer", "own-excess"):

        def run_ended(workflow: str = workflows[end]) -> dict[str, Any] | None:
            nodes = cluster.nodes_of(BUILD_NS, workflow).values()
            retry = next(n for n in nodes if n.get("type") == "Retry" and n["displayName"] == RUN)
            return retry if retry.get("phase") in ("Failed", "Error") else None

        retry = cluster.wait(f"the run of {end} ended", run_ended, timeout=60)
        assert retry["message"] == "retryStrategy.expression evaluated to false", end
        assert cluster.node(BUILD_NS, workflows[end], "run(1)") is None, end


@pytest.fixture()
def enforcing(cluster: Cluster) -> Iterator[dict[str, str]]:
    """A namespace per Pod Security level below ``privileged``, enforcing it, with the
    build's ServiceAccounts (the ServiceAccount plugin refuses a pod naming a missing
    one); deleted after."""
    made = {level: f"pss-{level}-{uuid.uuid4().hex[:6]}" for level in ("baseline", "restricted")}
    try:
        for level, namespace in made.items():
            labels = {
                "pod-security.kubernetes.io/enforce": level,
                "pod-security.kubernetes.io/enforce-version": "latest",
            }
            answer = cluster.create(
                "/api/v1/namespaces",
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": labels},
                },
            )
            assert answer.status == 201, answer.message
            for account in ("fabrique-build", "fabrique-executor"):
                answer = cluster.create(
                    f"/api/v1/namespaces/{namespace}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
                )
                assert answer.status == 201, answer.message
        yield made
    finally:
        for namespace in made.values():
            cluster.request("DELETE", f"/api/v1/namespaces/{namespace}")


def pod_security_refusal(cluster: Cluster, pod: dict[str, Any], namespace: str) -> str | None:
    """The pod's spec created in ``namespace`` as a dry run: Pod Security's refusal, or
    None when admitted. (Without what the kubelet and the scheduler filled in.)"""
    spec = copy.deepcopy(pod["spec"])
    for filled in ("nodeName", "priority"):
        spec.pop(filled, None)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod["metadata"]["name"], "namespace": namespace},
        "spec": spec,
    }
    answer = cluster.create(f"/api/v1/namespaces/{namespace}/pods", body, params={"dryRun": "All"})
    if answer.status == 201:
        return None
    assert answer.status == 403 and "violates PodSecurity" in answer.message, answer.message
    return answer.message


def test_a_build_pod_is_admitted_and_needs_privileged_for_its_builder_alone(
    cluster: Cluster, applied: Path, enforcing: dict[str, str]
) -> None:
    """A build's pod, and its exit handler's, get admitted in the build namespace, whose
    Pod Security level, ``privileged``, admits any pod. What needs that level is for the
    real Pod Security admission to say: the same pods, created as a dry run where
    ``baseline`` and ``restricted`` are enforced. The build's pod fails both for its
    builder container alone (seccomp and AppArmor ``Unconfined``); the exit handler's
    passes ``restricted``."""
    namespace = cluster.get(f"/api/v1/namespaces/{BUILD_NS}")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    workflow = start(cluster)
    played = dict(walk(cluster, workflow, [(RUN, 1), ("report-failure", 0)]))
    ended(cluster, workflow, "Failed")
    assert all(pod["metadata"]["namespace"] == BUILD_NS for pod in played.values())
    for where in enforcing.values():
        assert pod_security_refusal(cluster, played["report-failure"], where) is None
    message = pod_security_refusal(cluster, played[RUN], enforcing["baseline"]) or ""
    assert 'violates PodSecurity "baseline:latest"' in message
    assert 'container "build"' in message, message
    assert "seccompProfile" in message and "AppArmor profile" in message
    # never privileged, no hostPath: Unconfined is all that baseline refuses in it
    assert "privileged (" not in message and "hostPath" not in message, message
    # the other containers alone pass restricted
    tools = copy.deepcopy(played[RUN])
    tools["spec"]["containers"] = [c for c in tools["spec"]["containers"] if c["name"] != "build"]
    for volume in ("buildkit-state", "fabrique-buildkitd", "build-tmp"):
        tools["spec"]["volumes"] = [v for v in tools["spec"]["volumes"] if v["name"] != volume]
    assert pod_security_refusal(cluster, tools, enforcing["restricted"]) is None


def named_objects(pod: dict[str, Any]) -> list[str]:
    """Every Secret, ConfigMap, PVC and ServiceAccount the pod needs to start, as API paths."""
    ns = pod["metadata"]["namespace"]
    found = [
        f"/api/v1/namespaces/{ns}/serviceaccounts/{pod['spec'].get('serviceAccountName', 'default')}"
    ]
    for volume in pod["spec"].get("volumes") or []:
        if "secret" in volume:
            found.append(f"/api/v1/namespaces/{ns}/secrets/{volume['secret']['secretName']}")
        if "configMap" in volume:
            found.append(f"/api/v1/namespaces/{ns}/configmaps/{volume['configMap']['name']}")
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "configMap" in source and not source["configMap"].get("optional"):
                found.append(f"/api/v1/namespaces/{ns}/configmaps/{source['configMap']['name']}")
        if "persistentVolumeClaim" in volume:
            found.append(
                f"/api/v1/namespaces/{ns}/persistentvolumeclaims/"
                f"{volume['persistentVolumeClaim']['claimName']}"
            )
    for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        for variable in container.get("env") or []:
            source = variable.get("valueFrom") or {}
            if "secretKeyRef" in source and not source["secretKeyRef"].get("optional"):
                found.append(f"/api/v1/namespaces/{ns}/secrets/{source['secretKeyRef']['name']}")
            if "configMapKeyRef" in source and not source["configMapKeyRef"].get("optional"):
                found.append(
                    f"/api/v1/namespaces/{ns}/configmaps/{source['configMapKeyRef']['name']}"
                )
    return found


def test_everything_a_build_pod_names_exists(cluster: Cluster, applied: Path) -> None:
    workflow = start(cluster)
    pod = step_pod(cluster, workflow, RUN)
    missing = [path for path in named_objects(pod) if not cluster.exists(path)]
    assert missing == []
    # the executor's token Secret is rendered empty; Kubernetes' token controller fills it
    token = cluster.wait(
        "the executor's token",
        lambda: cluster.get(
            f"/api/v1/namespaces/{BUILD_NS}/secrets/fabrique-executor.service-account-token"
        ).get("data"),
    )
    assert set(token) >= {"token", "ca.crt", "namespace"}


# -- d. the CronWorkflows ---------------------------------------------------------------------


def from_cron(cluster: Cluster, name: str) -> str:
    """A Workflow made from the CronWorkflow's spec, as the controller makes one on
    schedule (and as `argo submit --from cronwf/NAME` does)."""
    cron = cluster.get(f"{ARGO}/namespaces/{CONTROL_NS}/cronworkflows/{name}")
    workflow = f"{name}-live-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": workflow,
            "namespace": CONTROL_NS,
            "labels": {"workflows.argoproj.io/cron-workflow": name},
        },
        "spec": cron["spec"]["workflowSpec"],
    }
    answer = create_workflow(cluster, body)
    assert answer.status == 201, answer.message
    return workflow


@pytest.mark.parametrize("cron", ["fabrique-reconcile", "gitea-mirror-sync"])
def test_a_workflow_of_each_cronworkflow_gets_admitted_pods(
    cluster: Cluster, applied: Path, cron: str
) -> None:
    workflow = from_cron(cluster, cron)

    def settled() -> str | None:
        if cluster.workflow_pods(CONTROL_NS, workflow):
            return "pod"
        nodes = cluster.nodes_of(CONTROL_NS, workflow)
        refused = [n.get("message", "") for n in nodes.values() if n.get("phase") == "Error"]
        return f"refused: {refused[0]}" if refused else None

    assert cluster.wait(f"a pod of {workflow}", settled, timeout=60) == "pod"
