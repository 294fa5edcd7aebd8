"""The event path, live (``events.py``): the Argo Events controller of the pinned
version judges the rendered EventBus, EventSource and Sensor and deploys them; the
programs it deploys run from its pods: nats-server with JetStream, the EventSource and
the Sensor, which creates Workflows in the live API server as its own ServiceAccount."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fabrique.gestures.doctor import SENSOR_SUBJECT
from fabrique.site.config import load_site
from fabrique.site.names import webhook_service_url

from .. import payloads
from ..conftest import KUSTOMIZATION, SEED_KUSTOMIZATION
from .cluster import ARGO, NODE_ID, Cluster
from .controlplane import ControlPlaneError
from .events import (
    BUS,
    CONTROL,
    OBJECTS,
    SELECTORS,
    SENSOR,
    SOURCE,
    ArgoEvents,
    ServiceProxy,
    deployed,
    start_event_path,
)
from .forge import Forge
from .forge import forge as open_forge
from .pods import running_pod
from .test_workflows import BUILD_NS, EXECUTOR, ended, step_pod

SITE = load_site(env={})
# the webhook's bearer token: the value the event path's fixture gives the Secret
BEARER = f"bearer-{uuid.uuid4().hex}"
APP_FILE = "dataops/citation-dagster/app.txt"


@pytest.fixture(scope="module")
def argo_events(
    cluster: Cluster, applied: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ArgoEvents]:
    events = ArgoEvents(cluster, tmp_path_factory.mktemp("argo-events"))
    try:
        events.start_controller()
    except ControlPlaneError as failed:
        events.stop()
        pytest.fail(str(failed), pytrace=False)
    try:
        yield events
    finally:
        events.stop()


# -- the controller judges ------------------------------------------------------------------


@pytest.mark.parametrize("role", OBJECTS)
def test_the_controller_takes_each_rendered_object_and_deploys_it(
    cluster: Cluster, argo_events: ArgoEvents, role: str
) -> None:
    deployed(cluster, role)


@pytest.mark.parametrize("role", OBJECTS)
def test_the_pods_it_makes_pass_pod_security_restricted_and_run(
    cluster: Cluster, argo_events: ArgoEvents, role: str
) -> None:
    """The control namespace enforces Pod Security ``restricted``: a pod it refused
    would never be made. kwok reports it Running; the bus's claim binds."""
    namespace, selector = SELECTORS[role]
    pod = running_pod(cluster, namespace, selector)
    assert pod["spec"]["nodeName"]
    for volume in pod["spec"].get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            found = cluster.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
            assert found["status"]["phase"] == "Bound", claim


def test_the_eventsource_service_is_where_webhook_2_points(
    cluster: Cluster, argo_events: ArgoEvents
) -> None:
    """``fabrique seed-webhook`` points Gitea at the Service the controller makes."""
    deployed(cluster, "eventsource")
    service = cluster.get(f"/api/v1/namespaces/{CONTROL}/services/{SOURCE}-eventsource-svc")
    meta, (port,) = service["metadata"], service["spec"]["ports"]
    assert webhook_service_url(SITE.namespaces.control) == (
        f"http://{meta['name']}.{meta['namespace']}.svc.cluster.local:{port['port']}/push"
    )


def test_a_replay_of_the_event_path_once_deployed_changes_nothing(
    cluster: Cluster, applied: Path, argo_events: ArgoEvents
) -> None:
    """The controller writes statuses and finalizers, never a field the tree sets."""
    for role in OBJECTS:
        deployed(cluster, role)
    events = applied / "events"
    before = cluster.versions(events)
    cluster.apply_tree(events)
    assert cluster.versions(events) == before
    diff = cluster.kubectl("diff", "--server-side", "--field-manager=fabrique", "-k", str(events))
    assert diff == ""


# -- the programs it deploys, on a real JetStream ----------------------------------------------


@pytest.fixture(scope="module")
def event_path(cluster: Cluster, argo_events: ArgoEvents) -> Iterator[ArgoEvents]:
    """The bus, the EventSource and the Sensor running; the Workflows they made deleted
    at the end (each holds its app's mutex)."""
    try:
        start_event_path(cluster, argo_events, SITE, BEARER)
    except ControlPlaneError as failed:
        pytest.fail(str(failed), pytrace=False)
    yield argo_events
    for workflow in cluster.items(
        f"{ARGO}/namespaces/{BUILD_NS}/workflows", f"events.argoproj.io/sensor={SENSOR}"
    ):
        delete_workflow(cluster, workflow["metadata"]["name"])


def delete_workflow(cluster: Cluster, name: str) -> None:
    answer = cluster.request("DELETE", f"{ARGO}/namespaces/{BUILD_NS}/workflows/{name}")
    assert answer.status in (200, 202, 404), answer.message


def fail(cluster: Cluster, workflow: str, running: list[str]) -> None:
    """End a Workflow (and free its app's mutex) as a failed step ends it: the steps
    ``running`` exit, the first with 1, then the exit handler's report."""
    for index, step in enumerate(running):
        cluster.finish(step_pod(cluster, workflow, step, phase="Running"), 1 if index == 0 else 0)
    cluster.finish(step_pod(cluster, workflow, "report-failure", phase="Running"), 0)
    ended(cluster, workflow, "Failed")


def post(events: ArgoEvents, body: dict[str, Any], bearer: str | None = BEARER) -> httpx.Response:
    """A delivery as Gitea makes it: JSON, its event header, the bearer token."""
    headers = {"Content-Type": "application/json", "X-Gitea-Event": "push"}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    return httpx.post(
        f"http://127.0.0.1:{events.webhook_port}/push", json=body, headers=headers, timeout=30
    )


def sensor_workflow(cluster: Cluster, sha: str, timeout: float = 60) -> dict[str, Any]:
    path = f"{ARGO}/namespaces/{BUILD_NS}/workflows/fabrique-citation-{sha[:12]}"
    return cluster.wait(
        f"the Workflow of {sha[:12]}",
        lambda: cluster.get(path) if cluster.exists(path) else None,
        timeout=timeout,
    )


def test_a_push_posted_to_the_eventsource_becomes_the_workflow_of_its_commit(
    cluster: Cluster, event_path: ArgoEvents
) -> None:
    sha = payloads.revision()
    event = payloads.push(after=sha, files=[APP_FILE])
    answer = post(event_path, event["body"])
    assert answer.status_code == 200, answer.text
    workflow = sensor_workflow(cluster, sha)
    meta = workflow["metadata"]
    assert meta["labels"]["fabrique.io/submitted-by"] == "sensor"
    assert meta["annotations"]["fabrique.io/revision"] == sha
    assert workflow["spec"]["arguments"]["parameters"][1] == {"name": "revision", "value": sha}
    # the trigger's own marks: the real Sensor made it, and the admission policy took them
    assert meta["labels"]["events.argoproj.io/sensor"] == SENSOR
    assert meta["labels"]["events.argoproj.io/trigger"] == "build-citation"
    # admitted, and run: the controller makes the first step's pod
    fail(cluster, meta["name"], ["plan"])  # it holds citation's mutex: end it


def test_a_delivery_without_the_bearer_is_refused_and_publishes_nothing(
    cluster: Cluster, event_path: ArgoEvents
) -> None:
    before = event_path.stream_messages()
    for bearer in ("wrong", None):
        answer = post(event_path, payloads.push(after=payloads.revision())["body"], bearer=bearer)
        assert answer.status_code == 401, answer.text
    assert event_path.stream_messages() == before


def test_doctor_eventbus_reads_the_real_bus_as_the_readme_says(
    event_path: ArgoEvents, tmp_path: Path
) -> None:
    """The README's Checking the bus: the client auth of eventbus-default-js-client-auth
    as it is (a user and a password), TLS checked against the bus's CA, whose subject
    its certificate bears. Run as its own process, as a person runs it."""
    ca = tmp_path / "ca.crt"
    ca.write_bytes(event_path.bus_secret(f"eventbus-{BUS}-js-server")["ca-cert"])
    auth = event_path.bus_secret(f"eventbus-{BUS}-js-client-auth")["client-auth"].decode()
    fabrique = str(Path(sys.executable).parent / "fabrique")
    done = subprocess.run(
        [fabrique, "doctor", "eventbus", "--url", event_path.nats_url, "--tls-ca", str(ca)],
        env={**os.environ, "FABRIQUE_NATS_CLIENT_AUTH": auth},
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert done.returncode == 0, done.stderr
    assert f"({SENSOR_SUBJECT})" in done.stdout
    assert yaml.safe_load(auth)["password"] not in done.stdout + done.stderr


# -- a push to the real Gitea, end to end --------------------------------------------------------


@pytest.fixture(scope="module")
def forge(
    cluster: Cluster, event_path: ArgoEvents, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Forge]:
    """A Gitea that delivers webhook #2 as the README says to set it up (``forge.py``):
    an empty code repository, its hook seeded by ``fabrique seed-webhook``."""
    proxy = ServiceProxy().start()
    proxy.route(cluster, CONTROL, f"{SOURCE}-eventsource-svc", event_path.webhook_port)
    try:
        with open_forge(tmp_path_factory.mktemp("events-gitea"), proxy, BEARER) as made:
            yield made
    except ControlPlaneError as failed:
        pytest.fail(str(failed), pytrace=False)
    finally:
        proxy.stop()


def plan(cluster: Cluster, forge: Forge, workflow: str, tmp_path: Path) -> dict[str, str]:
    """Play the ``plan`` step: run its command (``fabrique plan`` with the Workflow's own
    arguments) against the real Gitea, report its outputs as the executor does, end it."""
    pod = step_pod(cluster, workflow, "plan", phase="Running")
    arguments = cluster.workflow(BUILD_NS, workflow)["spec"]["arguments"]["parameters"]
    parameters = {p["name"]: p["value"] for p in arguments}
    out = tmp_path / workflow
    said = forge.cli(
        "plan", "--app", parameters["app"], "--revision", parameters["revision"], "--out", str(out)
    )
    outputs = {f.name: f.read_text() for f in out.iterdir()}
    assert outputs["reason"] in said
    answer = cluster.report_outputs(pod, outputs, as_user=EXECUTOR)
    assert answer.status == 201, answer.message
    cluster.finish(pod, 0)
    return outputs


def skipped(cluster: Cluster, forge: Forge, sha: str, tmp_path: Path) -> str:
    """The Workflow of ``sha``: its plan skips, it succeeds, only the plan and the
    skipped report ran. The plan's reason."""
    workflow = sensor_workflow(cluster, sha)["metadata"]["name"]
    outputs = plan(cluster, forge, workflow, tmp_path)
    assert outputs["build"] == "false", outputs["reason"]
    cluster.finish(step_pod(cluster, workflow, "report-skipped", phase="Running"), 0)
    ended(cluster, workflow, "Succeeded")
    nodes = cluster.nodes_of(BUILD_NS, workflow)
    ran = sorted(  # a retried step's pod is its attempt's: plan(0)
        nodes[p["metadata"]["annotations"][NODE_ID]]["displayName"].removesuffix("(0)")
        for p in cluster.workflow_pods(BUILD_NS, workflow)
    )
    assert ran == ["plan", "report-skipped"], ran
    return outputs["reason"]


def test_a_git_push_to_the_apps_context_becomes_its_workflow_and_runs(
    cluster: Cluster, forge: Forge, tmp_path: Path
) -> None:
    sha = forge.push(
        {
            "dataops/citation-dagster/Dockerfile": "FROM scratch\nCOPY app.txt /\n",
            APP_FILE: "citation\n",
            KUSTOMIZATION: SEED_KUSTOMIZATION,
            "docs/notes.md": "notes\n",
        },
        "the app",
    )
    workflow = sensor_workflow(cluster, sha)
    name = workflow["metadata"]["name"]
    assert name == f"fabrique-citation-{sha[:12]}"
    assert workflow["metadata"]["labels"]["events.argoproj.io/sensor"] == SENSOR
    outputs = plan(cluster, forge, name, tmp_path)
    assert outputs["build"] == "true", outputs["reason"]
    # admitted and going on: the checkout's pod is made, on a worker
    pod = step_pod(cluster, name, "checkout", phase="Running")
    assert pod["spec"]["nodeName"] == "kwok-worker-0"
    fail(cluster, name, ["checkout", "report-pending"])


def test_the_write_back_and_a_push_beside_the_app_are_skipped_by_the_plan(
    cluster: Cluster, forge: Forge, tmp_path: Path
) -> None:
    """fabrique's own write-back commit, then a push that changes nothing under the
    app's context: each is delivered, each gets its Workflow, whose plan skips it."""
    built = forge.git("rev-parse", "HEAD").strip()
    written = forge.cli(
        "writeback", "--app", "citation", "--revision", built, "--digest", "sha256:" + "ab" * 32
    )
    assert written.startswith("changed:"), written
    forge.git("pull", "-q", "--ff-only", "origin", "main")
    write_back = forge.git("rev-parse", "HEAD").strip()
    reason = skipped(cluster, forge, write_back, tmp_path)
    assert reason == f"nothing under dataops/citation-dagster changed since deployed {built[:12]}"
    beside = forge.push({"docs/notes.md": "more notes\n"}, "docs only")
    reason = skipped(cluster, forge, beside, tmp_path)
    assert reason == f"nothing under dataops/citation-dagster changed since deployed {built[:12]}"


def test_a_push_while_the_eventsource_is_down_is_lost_and_the_next_one_builds_it(
    cluster: Cluster, forge: Forge, event_path: ArgoEvents, tmp_path: Path
) -> None:
    """Gitea does not retry a failed delivery: a push while the EventSource is down
    gets no Workflow, even once it is back. The next push's plan looks at everything
    since the deployed revision, so it builds the lost change."""
    event_path.stop_container("eventsource")
    tried = len(forge.proxy.requests)
    lost = forge.push({APP_FILE: "citation v2\n"}, "while the EventSource is down")
    cluster.wait("Gitea's delivery", lambda: len(forge.proxy.requests) > tried)
    (delivery,) = forge.proxy.requests[tried:]
    assert (delivery.status, delivery.after) == (503, lost)
    event_path.start_container("eventsource")
    after = forge.push({"docs/notes.md": "back\n"}, "once it is back")
    name = sensor_workflow(cluster, after)["metadata"]["name"]
    outputs = plan(cluster, forge, name, tmp_path)
    assert (outputs["build"], outputs["reason"]) == (
        "true",
        f"1 file(s) changed under dataops/citation-dagster: {APP_FILE}",
    )
    fail(cluster, name, ["checkout", "report-pending"])
    assert not cluster.exists(
        f"{ARGO}/namespaces/{BUILD_NS}/workflows/fabrique-citation-{lost[:12]}"
    )
    assert [d.id for d in forge.proxy.requests].count(delivery.id) == 1, "Gitea delivered it again"


def test_gitea_s_test_delivery_of_the_same_commit_makes_no_second_workflow(
    cluster: Cluster, forge: Forge, event_path: ArgoEvents
) -> None:
    head = forge.git("rev-parse", "HEAD").strip()
    name = f"fabrique-citation-{head[:12]}"
    before = cluster.workflow(BUILD_NS, name)["metadata"]["uid"]
    published = event_path.stream_messages()
    assert forge.test_delivery(forge.hook_id()) == 204
    # through the EventSource onto the bus, then taken by the Sensor
    cluster.wait("the test delivery on the bus", lambda: event_path.stream_messages() > published)
    cluster.wait("the Sensor to take it", lambda: event_path.delivered() > published)
    assert cluster.workflow(BUILD_NS, name)["metadata"]["uid"] == before
    same = cluster.items(
        f"{ARGO}/namespaces/{BUILD_NS}/workflows", f"fabrique.io/revision={head[:12]}"
    )
    assert [w["metadata"]["name"] for w in same] == [name]
