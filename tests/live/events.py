"""Argo Events on the live plane, from the pinned module (``tests/peers/argo-events``):
the upstream install bundle, its controller, and the pods that controller makes for the
rendered EventBus, EventSource and Sensor, each container run by ``pods.PodProcess``.

The controller runs as its Deployment of the bundle says (``argo-events controller``,
the ServiceAccount ``argo-events-sa`` and its ClusterRole, the ConfigMap
``argo-events-controller-config`` at ``/etc/argo-events``), and judges the objects as on
a cluster: it validates them, makes the EventBus's StatefulSet, Secrets and ConfigMap,
the EventSource's and the Sensor's Deployments and Services; the API server admits their
pods (Pod Security ``restricted`` in the control namespace), the scheduler places them
and kwok reports them Running. Then the containers run here, from those very pods:

- the EventBus's ``main`` container is nats-server (``tests/peers/nats-server``, the
  version of the image the controller config names) with the controller's config file,
  server auth and TLS certificates, its claim a folder;
- the EventSource's and the Sensor's are ``argo-events eventsource-service`` and
  ``sensor-service``, with the objects the controller passed them (base64 JSON in
  ``EVENTSOURCE_OBJECT``/``SENSOR_OBJECT`` and ``EVENTBUS_CONFIG``), the bus's client
  auth at ``/etc/eventbus/auth``, the webhook's Secret at ``/argo-events/secrets/`` and
  the Sensor's ServiceAccount token: it creates Workflows as ``fabrique-sensor``.

What the host's shared network asks of them (see ``pods``): the bus listens on loopback
ports of its own (``-a 127.0.0.1 -p … -m …``); the EventSource's webhook port and the
bus URL the controller passed (``nats://eventbus-default-js-svc.<ns>.svc:4222``) are
replaced by loopback ones in the objects; the EventSource and the Sensor serve metrics on
a port of their own (``METRICS_ADDRESS``, the one thing the wrapper module's command
adds to upstream's); the controller's metrics and health ports are its own flags.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import ssl
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

import httpx
import yaml
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError
from nats.js.manager import JetStreamManager

from fabrique.gestures.doctor import consumers_of, quiet_tls_eof
from fabrique.site.config import Site

from ..doubles.http import QuietServer
from . import controlplane
from .cluster import Cluster
from .controlplane import (
    EVENTS_MODULE,
    EVENTS_NODE,
    EVENTS_TAINT,
    ControlPlaneError,
    free_port,
    module_dir,
)
from .pods import Image, Overrides, PodProcess, running_pod

T = TypeVar("T")
EVENTS_NAMESPACE = "argo-events"
CONTROL = "fabrique"  # the site's control namespace: the EventBus, EventSource and Sensor
BUS, SOURCE, SENSOR = "default", "gitea", "fabrique-build"
NATS_MODULE = "github.com/nats-io/nats-server/v2"
STREAM = "default"  # v1alpha1.JetStreamStreamName
SELECTORS = {
    "controller": (EVENTS_NAMESPACE, "app=controller-manager"),
    "eventbus": (CONTROL, f"controller=eventbus-controller,eventbus-name={BUS}"),
    "eventsource": (CONTROL, f"controller=eventsource-controller,eventsource-name={SOURCE}"),
    "sensor": (CONTROL, f"controller=sensor-controller,sensor-name={SENSOR}"),
}
EVENTS = "/apis/argoproj.io/v1alpha1/namespaces/" + CONTROL
# beside a real node: where the event path's pods go (controlplane.EVENTS_NODE)
PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"kubernetes.io/hostname": EVENTS_NODE},
    "tolerations": [{**EVENTS_TAINT, "operator": "Equal"}],
}
# each object the controller deploys, and the conditions it sets once it has
OBJECTS = {
    "eventbus": ("eventbus", BUS, {"Configured", "Deployed"}),
    "eventsource": ("eventsources", SOURCE, {"SourcesProvided", "Deployed"}),
    "sensor": ("sensors", SENSOR, {"DependenciesProvided", "TriggersProvided", "Deployed"}),
}


def events_version() -> str:
    return controlplane.peers.Peer(
        "argo-events", controlplane.ROOT / "tests/peers/argo-events"
    ).required(EVENTS_MODULE)


def nats_version() -> str:
    return controlplane.peers.Peer(
        "nats-server", controlplane.ROOT / "tests/peers/nats-server"
    ).required(NATS_MODULE)


def install_documents() -> list[dict[str, Any]]:
    """The upstream bundle (``manifests/install.yaml`` of the pinned module) but its
    CRDs, which the control plane installed from the same module."""
    bundle = module_dir(EVENTS_MODULE, events_version()) / "manifests/install.yaml"
    return [
        d
        for d in yaml.safe_load_all(bundle.read_text("utf-8"))
        if d and d["kind"] != "CustomResourceDefinition"
    ]


def images() -> dict[str, Image]:
    """The images the event path's pods name, each played by a peer of that version:
    Argo Events' own (``/bin/argo-events``, its Dockerfile's ENTRYPOINT) and NATS's
    (``/nats-server``, the controller config's ``startCommand``)."""
    bins = controlplane.binaries(("argo-events", "nats-server"))
    return {
        f"quay.io/argoproj/argo-events:{events_version()}": Image(
            bins["argo-events"], "/bin/argo-events"
        ),
        f"nats:{nats_version().removeprefix('v')}": Image(bins["nats-server"], "/nats-server"),
    }


def edit_base64_json(edit: Callable[[dict[str, Any]], None]) -> Callable[[str], str]:
    """An edit of an object the controller passes as base64 JSON."""

    def apply(encoded: str) -> str:
        value = json.loads(base64.b64decode(encoded))
        edit(value)
        return base64.b64encode(json.dumps(value).encode()).decode()

    return apply


def conditions(cluster: Cluster, path: str) -> dict[str, dict[str, Any]]:
    status = cluster.get(path).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def all_true(cluster: Cluster, path: str, wanted: set[str]) -> dict[str, dict[str, Any]] | None:
    """Its conditions, once it has all of ``wanted`` and every one it has is True."""
    found = conditions(cluster, path)
    if wanted <= set(found) and all(c["status"] == "True" for c in found.values()):
        return found
    return None


def deployed(cluster: Cluster, role: str, name: str | None = None) -> None:
    """Wait until the controller has taken the object of ``role`` (named ``name``, if
    not the site's one) and deployed it."""
    resource, default, wanted = OBJECTS[role]
    name = name or default
    path = f"{EVENTS}/{resource}/{name}"
    try:
        cluster.wait(f"{resource}/{name}'s conditions", lambda: all_true(cluster, path, wanted))
    except AssertionError as late:
        raise AssertionError(f"{late}: {conditions(cluster, path)}") from None


def start_event_path(cluster: Cluster, events: ArgoEvents, site: Site, bearer: str) -> None:
    """The bus, the EventSource and the Sensor running, once the controller has deployed
    each; the webhook's Secret holding ``bearer``, a token of the kind a site's secret
    tooling makes, which the EventSource reads from the Secret's volume."""
    for role in OBJECTS:
        deployed(cluster, role)
    secret = site.events.webhook_secret
    answer = cluster.request(
        "PATCH",
        f"/api/v1/namespaces/{CONTROL}/secrets/{secret.name}",
        {"stringData": {secret.key: bearer}},
        content_type="application/merge-patch+json",
    )
    if answer.status != 200:
        raise ControlPlaneError(f"the webhook's Secret {secret.name}: {answer.message}")
    events.start_bus()
    events.start_eventsource()
    events.start_sensor()


@dataclass(frozen=True)
class ConsumerState:
    """One durable consumer of the stream, as JetStream reports it."""

    name: str
    delivered: int  # the last stream sequence handed to it
    pending: int  # messages of the stream not handed to it yet
    ack_pending: int  # handed to it, not acked yet


class ArgoEvents:
    """The controller and the event path's pods, their folders under ``folder``."""

    def __init__(self, cluster: Cluster, folder: Path) -> None:
        self.cluster = cluster
        self.folder = folder
        self.images = images()
        self.ports: dict[str, int] = {}
        self.pods: dict[str, PodProcess] = {}
        self.ready: dict[str, Callable[[], bool]] = {}

    # -- the controller -----------------------------------------------------------------

    def start_controller(self) -> None:
        """The upstream bundle applied and its controller running. Beside a real node,
        the controller's pod and the event path's are kept on kwok's event-path node
        first (the objects the controller deploys, where they are applied already)."""
        documents = install_documents()
        if self.cluster.plane.node:
            for document in documents:
                if document["kind"] == "Deployment":
                    document["spec"]["template"]["spec"].update(PLACEMENT)
            self.keep_off_the_node()
        self.cluster.kubectl(
            "apply",
            "--server-side",
            "--field-manager=argo-events-install",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(documents),
        )
        self.ports["controller-metrics"] = free_port()
        self.ports["controller-health"] = free_port()
        self._run(
            "controller",
            "controller-manager",
            Overrides(
                args=[
                    f"--metrics-port={self.ports['controller-metrics']}",
                    f"--health-port={self.ports['controller-health']}",
                ]
            ),
            ready=lambda: _http_ok(f"http://127.0.0.1:{self.ports['controller-health']}/readyz"),
        )

    def keep_off_the_node(self) -> None:
        """The rendered EventBus, EventSource and Sensor placed on kwok's event-path node
        (their pods' nodeSelector and toleration), by a field manager of the tests' own:
        a later apply of the tree by ``fabrique`` keeps them. Their containers run on
        the host; a real node would pull images nobody made."""
        sensors = [s["metadata"]["name"] for s in self.cluster.items(f"{EVENTS}/sensors")]
        for kind, name, path in (
            ("eventbus", BUS, ("spec", "jetstream")),
            ("eventsources", SOURCE, ("spec", "template")),
            *(("sensors", sensor, ("spec", "template")) for sensor in sensors),
        ):
            patch: dict[str, Any] = dict(PLACEMENT)
            for key in reversed(path):
                patch = {key: patch}
            answer = self.cluster.request(
                "PATCH",
                f"{EVENTS}/{kind}/{name}?fieldManager=fabrique-live-placement",
                patch,
                content_type="application/merge-patch+json",
            )
            if answer.status != 200:
                raise ControlPlaneError(f"{kind}/{name} on kwok's node: {answer.message}")

    # -- the event path's pods ----------------------------------------------------------

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.ports['nats']}"

    @property
    def webhook_port(self) -> int:
        return self.ports["webhook"]

    def start_bus(self) -> None:
        self.ports["nats"] = free_port()
        self.ports["nats-monitor"] = free_port()
        self._run(
            "eventbus",
            "main",
            Overrides(
                args=[
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.ports["nats"]),
                    "-m",
                    str(self.ports["nats-monitor"]),
                ]
            ),
            ready=lambda: _http_ok(
                f"http://127.0.0.1:{self.ports['nats-monitor']}/healthz?js-enabled-only=true"
            ),
        )

    def _to_loopback_bus(self, config: dict[str, Any]) -> None:
        config["jetstream"]["url"] = self.nats_url

    def start_eventsource(self) -> None:
        self.ports.setdefault("webhook", free_port())
        self.ports.setdefault("eventsource-metrics", free_port())

        def to_loopback_port(source: dict[str, Any]) -> None:
            for webhook in source["spec"]["webhook"].values():
                webhook["port"] = str(self.ports["webhook"])

        self._run(
            "eventsource",
            "main",
            Overrides(
                env={"METRICS_ADDRESS": f"127.0.0.1:{self.ports['eventsource-metrics']}"},
                edit_env={
                    "EVENTSOURCE_OBJECT": edit_base64_json(to_loopback_port),
                    "EVENTBUS_CONFIG": edit_base64_json(self._to_loopback_bus),
                },
            ),
            ready=lambda: _http_ok(f"http://127.0.0.1:{self.ports['webhook']}/health"),
        )

    def start_sensor(self, name: str = SENSOR) -> str:
        """The container of the Sensor ``name`` running, once it has a durable consumer
        per trigger (they take only what comes after them: DeliverNew). Its role: "sensor"
        for the site's, ``sensor/<name>`` for another."""
        role = "sensor" if name == SENSOR else f"sensor/{name}"
        self.ports.setdefault(f"{role}-metrics", free_port())
        sensor = self.cluster.get(f"{EVENTS}/sensors/{name}")
        wanted = len(self.consumers()) + len(sensor["spec"]["triggers"])
        self._run(
            role,
            "main",
            Overrides(
                env={"METRICS_ADDRESS": f"127.0.0.1:{self.ports[f'{role}-metrics']}"},
                edit_env={"EVENTBUS_CONFIG": edit_base64_json(self._to_loopback_bus)},
            ),
            ready=lambda: len(self.consumers()) >= wanted,
            selector=f"controller=sensor-controller,sensor-name={name}",
        )
        return role

    def _run(
        self,
        role: str,
        container: str,
        overrides: Overrides,
        ready: Callable[[], bool],
        selector: str | None = None,
    ) -> PodProcess:
        namespace, selector = SELECTORS[role] if selector is None else (CONTROL, selector)
        pod = running_pod(self.cluster, namespace, selector)
        self.pods[role] = PodProcess(
            self.cluster, pod, container, self.images, self.folder / role, overrides
        )
        self.ready[role] = ready
        self.start_container(role)
        return self.pods[role]

    def start_container(self, role: str) -> None:
        """Start the container of ``role`` (again: a restart keeps its pod and volumes)
        and wait until it is ready."""
        process = self.pods[role].start()

        def probe() -> bool:
            died = process.died()
            if died:
                raise ControlPlaneError(f"{role} ({process.name}) {died}")
            return self.ready[role]()

        try:
            self.cluster.wait(f"the {role}'s container to be ready", probe, timeout=60)
        except AssertionError as late:
            raise ControlPlaneError(f"{late}: {process.tail()}") from None

    def stop_container(self, role: str) -> None:
        self.pods[role].stop()

    def kill_container(self, role: str) -> None:
        """SIGKILL, no grace: the container's process dies as on an OOM kill or a lost node."""
        self.pods[role].kill()

    def stop(self) -> None:
        for process in reversed(self.pods.values()):
            process.stop()

    def said(self, role: str, words: str) -> int:
        """How many lines of ``role``'s container log (every start of it) hold ``words``."""
        log = self.pods[role].log
        text = log.read_text(errors="replace") if log.exists() else ""
        return sum(words in line for line in text.splitlines())

    def sensor_metric(self, name: str, **labels: str) -> float:
        """The sum of a series the Sensor serves, over the samples with ``labels``."""
        text = httpx.get(f"http://127.0.0.1:{self.ports['sensor-metrics']}/metrics").text
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(w in line for w in wanted):
                total += float(line.rpartition(" ")[2])
        return total

    # -- what the bus holds -------------------------------------------------------------

    def bus_secret(self, name: str) -> dict[str, bytes]:
        """A Secret of the control namespace (the controller writes the bus's there)."""
        body = self.cluster.get(f"/api/v1/namespaces/{CONTROL}/secrets/{name}")
        return {k: base64.b64decode(v) for k, v in body["data"].items()}

    def _ask(self, question: Callable[[JetStreamManager], Awaitable[T]], otherwise: T) -> T:
        """One question to JetStream, as the bus's clients connect: the client auth the
        controller wrote (user and password), TLS unverified as theirs is (the bus's
        certificate has its CA's very subject, which OpenSSL takes for self-signed; Go's
        verifier would not, but the EventSource and the Sensor skip it). ``otherwise``
        when the stream is not there yet."""
        auth = yaml.safe_load(self.bus_secret(f"eventbus-{BUS}-js-client-auth")["client-auth"])
        tls = ssl.create_default_context()
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE

        async def asked() -> T:
            nc = NATS()
            await nc.connect(
                servers=[self.nats_url],
                user=auth["username"],
                password=auth["password"],
                tls=tls,
                allow_reconnect=False,
                connect_timeout=5,
            )
            try:
                return await question(nc.jsm())
            except NotFoundError:
                return otherwise
            finally:
                await nc.close()

        with quiet_tls_eof():  # asyncio's warning of the TLS connection the bus ends
            return asyncio.run(asked())

    def delete_consumers(self, names: set[str]) -> None:
        """Delete the durable consumers ``names`` (a Sensor deleted leaves its own)."""

        async def deleted(jsm: JetStreamManager) -> None:
            for name in names:
                await jsm.delete_consumer(STREAM, name)

        self._ask(deleted, None)

    def consumers(self) -> list[str]:
        """The durable consumers on the stream (the Sensor's, one per trigger)."""

        async def listed(jsm: JetStreamManager) -> list[str]:
            return [str(c.name) for c in await consumers_of(jsm, STREAM)]

        return self._ask(listed, [])

    def delivered(self) -> int:
        """The last stream sequence handed to a consumer (the Sensor has taken every
        event up to it)."""

        async def last(jsm: JetStreamManager) -> int:
            found = await consumers_of(jsm, STREAM)
            return max((int(c.delivered.stream_seq or 0) for c in found if c.delivered), default=0)

        return self._ask(last, 0)

    def stream_messages(self) -> int:
        """How many messages the stream holds (every event an EventSource published)."""

        async def counted(jsm: JetStreamManager) -> int:
            return int((await jsm.stream_info(STREAM)).state.messages)

        return self._ask(counted, 0)

    def stream_last(self) -> int:
        """The stream's last sequence (0 while there is none)."""

        async def last(jsm: JetStreamManager) -> int:
            return int((await jsm.stream_info(STREAM)).state.last_seq or 0)

        return self._ask(last, 0)

    def consumer_states(self) -> list[ConsumerState]:
        async def listed(jsm: JetStreamManager) -> list[ConsumerState]:
            return [
                ConsumerState(
                    str(c.name),
                    int(c.delivered.stream_seq or 0) if c.delivered else 0,
                    int(c.num_pending or 0),
                    int(c.num_ack_pending or 0),
                )
                for c in await consumers_of(jsm, STREAM)
            ]

        return self._ask(listed, [])

    def settled(self) -> bool:
        """The Sensor has taken and acked every event on the stream: each of its
        consumers has been handed the last one, and none waits for an ack."""
        last, found = self.stream_last(), self.consumer_states()
        return bool(found) and all(
            c.delivered >= last and c.pending == 0 and c.ack_pending == 0 for c in found
        )


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except (httpx.HTTPError, OSError):
        return False


class Delivery(NamedTuple):
    """A request the proxy took: Gitea's delivery id, the status answered, the ``after``
    of its body when it is a push ("" otherwise), and the start of the answer's body."""

    id: str
    status: int
    after: str
    said: str = ""


def _after(body: bytes) -> str:
    try:
        found = json.loads(body).get("after") if body else None
    except (ValueError, AttributeError):
        return ""
    return found if isinstance(found, str) else ""


class ServiceProxy:
    """What kube-proxy and the cluster's DNS give a caller of a Service, for a program
    outside the plane that takes an HTTP proxy (Gitea's ``[webhook] PROXY_URL``): a
    request for ``http://<service>.<namespace>.svc.cluster.local:<port>/…`` goes to the
    local endpoint given for that Service (the pod's loopback port), with its Host
    header as sent; any other host is refused with 502.

    ``refuse`` plays a network that loses a request on the way: a request whose body it
    says yes to is answered 502 and never forwarded."""

    def __init__(self, refuse: Callable[[bytes], bool] | None = None, port: int = 0) -> None:
        self.endpoints: dict[str, str] = {}
        self.refuse = refuse
        # every request taken, in order
        self.requests: list[Delivery] = []
        # the last request forwarded for each pushed commit: where, its headers, its body
        self.forwarded: dict[str, tuple[str, dict[str, str], bytes]] = {}
        proxy = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                target = urlsplit(self.path)
                endpoint = proxy.endpoints.get(target.netloc)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers: dict[str, str] = {}
                if endpoint is None:
                    status, content = 502, f"no Service {target.netloc}".encode()
                elif proxy.refuse is not None and proxy.refuse(body):
                    status, content = 502, b"lost on the way"
                else:
                    path = target.path + (f"?{target.query}" if target.query else "")
                    sent = {
                        k: v
                        for k, v in self.headers.items()
                        if k.lower() not in ("proxy-connection", "connection", "content-length")
                    }
                    proxy.forwarded[_after(body)] = (f"http://{endpoint}{path}", sent, body)
                    try:
                        answer = httpx.request(
                            self.command, f"http://{endpoint}{path}", headers=sent, content=body
                        )
                    except httpx.TransportError:
                        # the pod's port refuses: a Service without a ready endpoint
                        status, content = 503, f"no endpoint for {target.netloc}".encode()
                    else:
                        status, content = answer.status_code, answer.content
                        headers["Content-Type"] = answer.headers.get("content-type", "text/plain")
                delivery = self.headers.get("X-Gitea-Delivery", "")
                said = content[:200].decode("utf-8", "replace")
                proxy.requests.append(Delivery(delivery, status, _after(body), said))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = _forward

            def log_message(self, *args: object) -> None:
                pass

        self._server = QuietServer(("127.0.0.1", port), _Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def replay(self, after: str) -> int:
        """Send the delivery of ``after``'s push again, headers and body as they were, as
        Gitea's "Replay" of a delivery does; the status answered."""
        url, headers, body = self.forwarded[after]
        return httpx.post(url, headers=headers, content=body, timeout=30).status_code

    def route(self, cluster: Cluster, namespace: str, service: str, local_port: int) -> None:
        """Send what is addressed to the Service (every port it has) to ``local_port``."""
        found = cluster.get(f"/api/v1/namespaces/{namespace}/services/{service}")
        for port in found["spec"]["ports"]:
            host = f"{service}.{namespace}.svc.cluster.local:{port['port']}"
            self.endpoints[host] = f"127.0.0.1:{local_port}"

    def start(self) -> ServiceProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve_proxy(argv: list[str]) -> int:
    """``python -m tests.live.events proxy PORT HOST:PORT=ENDPOINT…``: a ServiceProxy as
    a process of its own, for ``make up``'s Gitea, which outlives the command that
    started it; until SIGTERM."""
    if len(argv) < 2 or argv[0] != "proxy" or not argv[1].isdigit():
        print("usage: python -m tests.live.events proxy PORT HOST:PORT=ENDPOINT…", file=sys.stderr)
        return 2
    proxy = ServiceProxy(port=int(argv[1]))
    for route in argv[2:]:
        host, _, endpoint = route.partition("=")
        proxy.endpoints[host] = endpoint
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    proxy.start()
    stopped.wait()
    proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(serve_proxy(sys.argv[1:]))
