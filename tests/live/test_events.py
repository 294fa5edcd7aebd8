"""The event path, live (``events.py``): the Argo Events controller of the pinned
version judges the rendered EventBus, EventSource and Sensor and deploys them; the
programs it deploys run from its pods: nats-server with JetStream, the EventSource and
the Sensor, which creates Workflows in the live API server as its own ServiceAccount."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabrique.site.config import load_site
from fabrique.site.names import webhook_service_url

from .. import payloads
from .cluster import ARGO, Cluster
from .controlplane import ControlPlaneError
from .events import BUS, CONTROL, SELECTORS, SENSOR, SOURCE, ArgoEvents
from .pods import running_pod
from .test_workflows import BUILD_NS, ended, step_pod

SITE = load_site(env={})
EVENTS = "/apis/argoproj.io/v1alpha1/namespaces/" + CONTROL
# the webhook's bearer token: the value the event path's fixture gives the Secret
BEARER = f"bearer-{uuid.uuid4().hex}"


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


def conditions(cluster: Cluster, path: str) -> dict[str, dict[str, Any]]:
    status = cluster.get(path).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def all_true(cluster: Cluster, path: str, wanted: set[str]) -> dict[str, dict[str, Any]] | None:
    """Its conditions, once it has all of ``wanted`` and every one it has is True."""
    found = conditions(cluster, path)
    if wanted <= set(found) and all(c["status"] == "True" for c in found.values()):
        return found
    return None


OBJECTS = {
    "eventbus": ("eventbus", BUS, {"Configured", "Deployed"}),
    "eventsource": ("eventsources", SOURCE, {"SourcesProvided", "Deployed"}),
    "sensor": ("sensors", SENSOR, {"DependenciesProvided", "TriggersProvided", "Deployed"}),
}


def deployed(cluster: Cluster, role: str) -> None:
    resource, name, wanted = OBJECTS[role]
    path = f"{EVENTS}/{resource}/{name}"
    try:
        cluster.wait(f"{resource}/{name}'s conditions", lambda: all_true(cluster, path, wanted))
    except AssertionError as late:
        raise AssertionError(f"{late}: {conditions(cluster, path)}") from None


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
    for role in OBJECTS:
        deployed(cluster, role)
    # a token of the kind a site's secret tooling makes, read by the EventSource from the
    # Secret's volume
    secret = SITE.events.webhook_secret
    answer = cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{CONTROL}/secrets/{secret.name}",
        {"stringData": {secret.key: BEARER}},
        content_type="application/merge-patch+json",
    )
    assert answer.status == 200, answer.message
    try:
        argo_events.start_bus()
        argo_events.start_eventsource()
        argo_events.start_sensor()
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


def revision() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex[:8]


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
    sha = revision()
    event = payloads.push(after=sha, files=["dataops/citation-dagster/app.txt"])
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
        answer = post(event_path, payloads.push(after=revision())["body"], bearer=bearer)
        assert answer.status_code == 401, answer.text
    assert event_path.stream_messages() == before
