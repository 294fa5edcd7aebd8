"""The event path, live (``events.py``): the Argo Events controller of the pinned
version judges the rendered EventBus, EventSource and Sensor and deploys them; the
programs it deploys run from its pods: nats-server with JetStream, the EventSource and
the Sensor, which creates Workflows in the live API server as its own ServiceAccount."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabrique.site.config import load_site
from fabrique.site.names import webhook_service_url

from .cluster import Cluster
from .controlplane import ControlPlaneError
from .events import BUS, CONTROL, SELECTORS, SENSOR, SOURCE, ArgoEvents
from .pods import running_pod

SITE = load_site(env={})
EVENTS = "/apis/argoproj.io/v1alpha1/namespaces/" + CONTROL


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


def test_a_replay_of_the_tree_once_deployed_changes_nothing(
    cluster: Cluster, applied: Path, argo_events: ArgoEvents
) -> None:
    """The controller writes statuses and finalizers, never a field the tree sets."""
    for role in OBJECTS:
        deployed(cluster, role)
    before = cluster.versions(applied)
    cluster.apply_tree(applied)
    assert cluster.versions(applied) == before
    diff = cluster.kubectl("diff", "--server-side", "--field-manager=fabrique", "-k", str(applied))
    assert diff == ""
