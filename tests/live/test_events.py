"""The event path, live (``events.py``): the Argo Events controller of the pinned
version judges the rendered EventBus, EventSource and Sensor and deploys them; the
programs it deploys run from its pods: nats-server with JetStream, the EventSource and
the Sensor, which creates each push's Workflow in the live API server as its own
ServiceAccount. The push Workflow's step, ``fabrique plan-push``, is played here as its
pod would run it, as the planner's own account (``planner.py``)."""

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

from eventsources.sensor import sensor, sensor_rbac
from fabrique.gestures.doctor import SENSOR_SUBJECT
from fabrique.site.config import load_site
from fabrique.site.limits import GO_ZERO_FIELDS, pod_env_size
from fabrique.site.names import LABEL_SUBMITTED_BY, PUSH_MADE, webhook_service_url

from .. import payloads, sensor_cases
from ..conftest import KUSTOMIZATION, SEED_KUSTOMIZATION
from ..sensor_cases import NAMESPACE
from .cluster import ARGO, Cluster
from .controlplane import ControlPlaneError
from .events import (
    BUS,
    CONTROL,
    EVENTS,
    OBJECTS,
    PLACEMENT,
    SELECTORS,
    SOURCE,
    ArgoEvents,
    ServiceProxy,
    all_true,
    deployed,
    start_event_path,
)
from .forge import Forge
from .forge import forge as open_forge
from .planner import Planner
from .pods import running_pod
from .test_workflows import BUILD_NS, RUN, ended, phase, step_pod, walk

SITE = load_site(env={})
# the webhook's bearer token: the value the event path's fixture gives the Secret
BEARER = f"bearer-{uuid.uuid4().hex}"
APP_FILE = "dataops/citation-dagster/app.txt"
SENSOR_ACCOUNT = "system:serviceaccount:fabrique:fabrique-sensor"


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
    for workflow in cluster.items(f"{ARGO}/namespaces/{BUILD_NS}/workflows", PUSH_MADE):
        delete_workflow(cluster, workflow["metadata"]["name"])
    for workflow in cluster.items(f"{ARGO}/namespaces/{CONTROL}/workflows"):
        if workflow["metadata"]["name"].startswith(PUSH):
            delete_workflow(cluster, workflow["metadata"]["name"], CONTROL)


PUSH = "fabrique-push-"


def delete_workflow(cluster: Cluster, name: str, namespace: str = BUILD_NS) -> None:
    answer = cluster.request("DELETE", f"{ARGO}/namespaces/{namespace}/workflows/{name}")
    assert answer.status in (200, 202, 404), answer.message


def fail(cluster: Cluster, workflow: str) -> None:
    """End a Workflow (and free its app's mutex) as a failed stage ends it: its pod
    exits 1, then the exit handler's report."""
    walk(cluster, workflow, [(RUN, 1), ("report-failure", 0)])
    ended(cluster, workflow, "Failed")


def post(
    events: ArgoEvents, body: dict[str, Any], bearer: str | None = BEARER, event: str = "push"
) -> httpx.Response:
    """A delivery as Gitea makes it: JSON, its event header, the bearer token."""
    headers = {"Content-Type": "application/json", "X-Gitea-Event": event}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    return httpx.post(
        f"http://127.0.0.1:{events.webhook_port}/push", json=body, headers=headers, timeout=30
    )


def push_workflow(cluster: Cluster, after: str, timeout: float = 60) -> dict[str, Any]:
    """The push Workflow the Sensor made of the push of ``after`` (whatever its before)."""
    path = f"{ARGO}/namespaces/{CONTROL}/workflows"

    def made() -> dict[str, Any] | None:
        found = [
            w
            for w in cluster.items(path)
            if w["metadata"]["name"].startswith(f"{PUSH}{after[:12]}-")
        ]
        return found[0] if found else None

    return cluster.wait(f"the push Workflow of {after[:12]}", made, timeout=timeout)


def build_workflow_of(cluster: Cluster, sha: str, timeout: float = 60) -> dict[str, Any]:
    path = f"{ARGO}/namespaces/{BUILD_NS}/workflows/fabrique-citation-{sha[:12]}"
    return cluster.wait(
        f"the build Workflow of {sha[:12]}",
        lambda: cluster.get(path) if cluster.exists(path) else None,
        timeout=timeout,
    )


def test_a_push_posted_to_the_eventsource_becomes_its_push_workflow(
    cluster: Cluster, event_path: ArgoEvents
) -> None:
    after, before = payloads.revision(), payloads.revision()
    event = payloads.push(after=after, before=before, files=[APP_FILE])
    answer = post(event_path, event["body"])
    assert answer.status_code == 200, answer.text
    workflow = push_workflow(cluster, after)
    meta = workflow["metadata"]
    assert meta["name"] == f"{PUSH}{after[:12]}-{before[:12]}"
    assert workflow["spec"] == {
        "workflowTemplateRef": {"name": "fabrique-push"},
        "arguments": {
            "parameters": [{"name": "before", "value": before}, {"name": "after", "value": after}]
        },
    }
    # the trigger's patch found none and created it: the Sensor says so
    assert event_path.said("sensor", "object not found, creating the object") >= 1
    # admitted, and run: the controller makes its pod, Pod Security restricted admits it
    pod = step_pod(cluster, meta["name"], "plan-push", namespace=CONTROL, phase="Running")
    assert pod["spec"]["serviceAccountName"] == "fabrique-planner"
    delete_workflow(cluster, meta["name"], CONTROL)


def test_a_redelivered_push_finds_its_workflow_as_it_is_and_is_settled_at_once(
    cluster: Cluster, event_path: ArgoEvents
) -> None:
    """Gitea's "Replay" sends a delivery again as it was: the trigger's patch finds the
    push's Workflow and changes nothing, the Sensor acks the event within seconds (a
    create would meet 409 for a minute of tries), and no action counts as failed. An
    edit by the Sensor's account is refused by the control namespace's admission."""
    sha = payloads.revision()
    body = payloads.push(after=sha, files=[APP_FILE])["body"]
    assert post(event_path, body).status_code == 200
    first = push_workflow(cluster, sha)
    cluster.wait("the Sensor to take and ack the push", event_path.settled)
    patched = event_path.said("sensor", "patching the object")
    failed = event_path.sensor_metric("argo_events_action_failed_total")
    last = event_path.stream_last()
    assert post(event_path, body).status_code == 200
    cluster.wait(
        "the Sensor to take and ack the redelivery",
        lambda: event_path.stream_last() > last and event_path.settled(),
        timeout=10,
    )
    again = cluster.workflow(CONTROL, first["metadata"]["name"])
    assert again["metadata"]["uid"] == first["metadata"]["uid"]
    assert again["spec"] == first["spec"]
    assert event_path.said("sensor", "patching the object") == patched + 1
    assert event_path.sensor_metric("argo_events_action_failed_total") == failed
    path = f"{ARGO}/namespaces/{CONTROL}/workflows/{first['metadata']['name']}"
    edit = {"metadata": {"labels": {"fabrique.io/submitted-by": "someone"}}}
    answer = cluster.request(
        "PATCH", path, edit, as_user=SENSOR_ACCOUNT, content_type="application/merge-patch+json"
    )
    assert answer.status == 422, answer.message  # a policy says Invalid unless told
    assert answer.message.endswith(
        "the Sensor may find a Workflow here as it is (a redelivered push), never change it"
    ), answer.message
    delete_workflow(cluster, first["metadata"]["name"], CONTROL)


@pytest.fixture(scope="module")
def contract_sensor(cluster: Cluster, event_path: ArgoEvents) -> Iterator[str]:
    """The Sensor of the contract table's site (tests/sensor_cases.py) beside the site's,
    deployed by the controller and run as the site's is, its push Workflows created in a
    namespace of its own where no WorkflowTemplate runs them. All of it, its durable
    consumers too, deleted at the end."""
    site = sensor_cases.site()
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    rendered = sensor(site, sensor_cases.SENSOR)
    k8s = rendered["spec"]["triggers"][0]["template"]["k8s"]
    k8s["source"]["resource"]["metadata"]["namespace"] = NAMESPACE
    if cluster.plane.node:
        rendered["spec"]["template"].update(PLACEMENT)
    rbac = [d for d in sensor_rbac(site) if d["kind"] != "ServiceAccount"]  # the site's own
    for document in rbac:
        document["metadata"]["namespace"] = NAMESPACE
    cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=fabrique-contract",
        "-f",
        "-",
        stdin=yaml.safe_dump_all([namespace, *rbac, rendered]),
    )
    before = set(event_path.consumers())
    role = ""
    try:
        path, wanted = f"{EVENTS}/sensors/{sensor_cases.SENSOR}", OBJECTS["sensor"][2]
        cluster.wait("the contract's Sensor deployed", lambda: all_true(cluster, path, wanted))
        role = event_path.start_sensor(sensor_cases.SENSOR)
        yield sensor_cases.SENSOR
    finally:
        if role:
            event_path.stop_container(role)
            del event_path.pods[role]
        cluster.request("DELETE", f"{EVENTS}/sensors/{sensor_cases.SENSOR}")
        cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
        event_path.delete_consumers(set(event_path.consumers()) - before)


def test_the_real_sensor_passes_the_pushes_the_contract_table_says(
    cluster: Cluster, event_path: ArgoEvents, contract_sensor: str
) -> None:
    """Each delivery of the table posted to the real EventSource; once every consumer has
    taken and acked them all (the trigger's create is done before the ack), the push
    Workflows in the contract's namespace are exactly the table's: one per delivery
    that passes, none for the others."""
    for case in sensor_cases.CASES:
        (event,) = case.event["header"]["X-Gitea-Event"]
        answer = post(event_path, case.event["body"], event=event)
        assert answer.status_code == 200, (case.name, answer.text)
    cluster.wait("every Sensor to take and ack every push", event_path.settled, timeout=60)
    made = {
        w["metadata"]["name"] for w in cluster.items(f"{ARGO}/namespaces/{NAMESPACE}/workflows")
    }
    wanted = {case.workflow for case in sensor_cases.CASES if case.passes}
    assert made == wanted, (sorted(made - wanted), sorted(wanted - made))


def test_the_sensor_object_handed_to_its_pod_is_the_size_validate_reckons(
    cluster: Cluster, contract_sensor: str
) -> None:
    """The controller hands the Sensor to its pod as one variable, which Linux caps at
    128 KiB: ``pod_env_size`` (what render splits by and validate refuses over) is the
    size of the variable in the Deployment it made, or a little more, never less."""
    (deployment,) = cluster.items(
        f"/apis/apps/v1/namespaces/{CONTROL}/deployments", f"sensor-name={contract_sensor}"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (value,) = [e["value"] for e in container["env"] if e["name"] == "SENSOR_OBJECT"]
    real = len("SENSOR_OBJECT=") + len(value) + 1
    reckoned = pod_env_size(cluster.get(f"{EVENTS}/sensors/{contract_sensor}"))
    assert 0 <= reckoned - real <= 4 * GO_ZERO_FIELDS / 3, (real, reckoned)


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


@pytest.fixture(scope="module")
def planner(cluster: Cluster, forge: Forge, tmp_path_factory: pytest.TempPathFactory) -> Planner:
    """The push Workflows' step, played as their pod would run it (``planner.py``)."""
    return Planner(cluster, CONTROL, forge.values, forge.env, tmp_path_factory.mktemp("planner"))


def planned(cluster: Cluster, planner: Planner, sha: str) -> str:
    """The push of ``sha``: its Workflow, made by the Sensor; its step played; its
    Workflow ended Succeeded. What the step printed."""
    name = push_workflow(cluster, sha)["metadata"]["name"]
    said = planner.plan(name)
    cluster.wait(f"{name} Succeeded", lambda: phase(cluster, CONTROL, name) == "Succeeded" or None)
    return said


def plan(cluster: Cluster, forge: Forge, workflow: str, tmp_path: Path) -> dict[str, str]:
    """What the build pod's ``plan`` stage decides: its command (``fabrique plan`` with
    the Workflow's own arguments) run against the real Gitea, once the pod runs."""
    step_pod(cluster, workflow, RUN, phase="Running")
    arguments = cluster.workflow(BUILD_NS, workflow)["spec"]["arguments"]["parameters"]
    parameters = {p["name"]: p["value"] for p in arguments}
    out = tmp_path / workflow
    said = forge.cli(
        "plan", "--app", parameters["app"], "--revision", parameters["revision"], "--out", str(out)
    )
    outputs = {f.name: f.read_text() for f in out.iterdir()}
    assert outputs["reason"] in said
    return outputs


def test_a_git_push_to_the_apps_context_becomes_its_build_and_runs(
    cluster: Cluster, forge: Forge, planner: Planner, tmp_path: Path
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
    said = planned(cluster, planner, sha)
    assert f"citation: created: workflow {BUILD_NS}/fabrique-citation-{sha[:12]}" in said, said
    workflow = build_workflow_of(cluster, sha)
    name = workflow["metadata"]["name"]
    assert workflow["metadata"]["labels"][LABEL_SUBMITTED_BY] == "push"
    outputs = plan(cluster, forge, name, tmp_path)
    assert outputs["build"] == "true", outputs["reason"]
    # admitted and going on: its pod is made, on a worker
    pod = step_pod(cluster, name, RUN, phase="Running")
    assert pod["spec"]["nodeName"] == "kwok-worker-0"
    fail(cluster, name)


def no_build(cluster: Cluster, planner: Planner, sha: str) -> None:
    """The push of ``sha`` went through the Sensor; its step asked for no build."""
    said = planned(cluster, planner, sha)
    assert said.startswith("0 of 1 app(s)"), said
    assert not cluster.items(
        f"{ARGO}/namespaces/{BUILD_NS}/workflows", f"fabrique.io/revision={sha[:12]}"
    )


def test_the_write_back_and_a_push_beside_the_app_make_no_build(
    cluster: Cluster, forge: Forge, planner: Planner
) -> None:
    """fabrique's own write-back commit, then a push that changes nothing under the
    app's context, then one of six commits beside the app (Gitea's payload lists five:
    the step's listing reads them all): each is planned, none makes a build."""
    built = forge.git("rev-parse", "HEAD").strip()
    written = forge.cli(
        "writeback", "--app", "citation", "--revision", built, "--digest", "sha256:" + "ab" * 32
    )
    assert written.startswith("changed:"), written
    forge.git("pull", "-q", "--ff-only", "origin", "main")
    no_build(cluster, planner, forge.git("rev-parse", "HEAD").strip())
    no_build(cluster, planner, forge.push({"docs/notes.md": "more\n"}, "docs"))
    for n in range(6):
        forge.commit({"docs/notes.md": f"notes {n}\n"}, f"docs {n}")
    no_build(cluster, planner, forge.push())


def test_a_push_while_the_eventsource_is_down_is_lost_and_the_next_one_builds_it(
    cluster: Cluster, forge: Forge, event_path: ArgoEvents, planner: Planner, tmp_path: Path
) -> None:
    """Gitea does not retry a failed delivery: a push while the EventSource is down
    gets no Workflow, even once it is back. The next push to the app's context gets its
    build, whose plan looks at everything since the deployed revision, so it builds
    the lost change too. (A next push beside the app would make no build: the safety
    net's pass builds the lost change then.)"""
    event_path.stop_container("eventsource")
    tried = len(forge.proxy.requests)
    lost = forge.push({APP_FILE: "citation v2\n"}, "while the EventSource is down")
    cluster.wait("Gitea's delivery", lambda: len(forge.proxy.requests) > tried)
    (delivery,) = forge.proxy.requests[tried:]
    assert (delivery.status, delivery.after) == (503, lost)
    event_path.start_container("eventsource")
    more = "dataops/citation-dagster/more.txt"
    after = forge.push({more: "back\n"}, "once it is back")
    planned(cluster, planner, after)
    name = build_workflow_of(cluster, after)["metadata"]["name"]
    outputs = plan(cluster, forge, name, tmp_path)
    assert (outputs["build"], outputs["reason"]) == (
        "true",
        f"2 file(s) changed under dataops/citation-dagster: {APP_FILE}, {more}",
    )
    fail(cluster, name)
    assert not cluster.exists(
        f"{ARGO}/namespaces/{BUILD_NS}/workflows/fabrique-citation-{lost[:12]}"
    )
    assert [d.id for d in forge.proxy.requests].count(delivery.id) == 1, "Gitea delivered it again"


def test_gitea_s_test_delivery_makes_nothing(
    cluster: Cluster, forge: Forge, event_path: ArgoEvents
) -> None:
    """Gitea's "Test Delivery" posts the branch head as the push's before and after: the
    Sensor takes it off the bus and makes no Workflow of it, neither a push's nor a
    build's."""
    head = forge.git("rev-parse", "HEAD").strip()
    pushes = {
        w["metadata"]["name"] for w in cluster.items(f"{ARGO}/namespaces/{CONTROL}/workflows")
    }
    builds = {
        w["metadata"]["uid"] for w in cluster.items(f"{ARGO}/namespaces/{BUILD_NS}/workflows")
    }
    published = event_path.stream_messages()
    assert forge.test_delivery(forge.hook_id()) == 204
    # through the EventSource onto the bus, then taken by the Sensor
    cluster.wait("the test delivery on the bus", lambda: event_path.stream_messages() > published)
    cluster.wait("the Sensor to take and ack it", event_path.settled)
    now = {w["metadata"]["name"] for w in cluster.items(f"{ARGO}/namespaces/{CONTROL}/workflows")}
    assert not {n for n in now - pushes if n.startswith(f"{PUSH}{head[:12]}-")}
    assert {
        w["metadata"]["uid"] for w in cluster.items(f"{ARGO}/namespaces/{BUILD_NS}/workflows")
    } == builds
