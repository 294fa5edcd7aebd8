"""The fault bench's real mode (``python bench/event_loss.py --real``): the same faults
and the same rules as the simulation, with the live tier's real programs in the loop.

What is real (``tests/live/``):

- **Gitea** (``forge.py``): each push is a ``git push`` over HTTP of a commit touching
  one app's context; webhook #2 is made by ``fabrique seed-webhook``, delivered through
  the proxy that stands in for the Service network (``[webhook] PROXY_URL``), only the
  EventSource's Service allowed (``[security] ALLOWED_HOST_LIST``);
- **the event path** (``events.py``): the control plane (etcd, kube-apiserver,
  controllers, scheduler, kwok), the bench's site rendered and applied, the Argo Events
  controller, and the containers of the pods it makes run as local processes: the
  EventBus's nats-server (JetStream on the folder standing in for its claim), the
  EventSource and the Sensor, which creates each push's Workflow in the live API server
  as ``fabrique-sensor``; that Workflow's step (``fabrique plan-push``: the commits
  Gitea lists of the push, the builds of the apps they touch) is played by the bench
  as the planner's own account;
- the registry, and the reconciler's Gitea, registry and Kubernetes clients.

The faults:

- the proxy loses a share of the push deliveries on the way (502; Gitea does not retry);
- the bus's container is stopped and started again halfway, on the claim it had; the
  push made then most often meets the EventSource not reconnected yet (500, lost), and
  the bench waits for its reconnection before the next push;
- the EventSource's container is SIGKILLed before the last ``--outage`` pushes, and
  started again once the Sensor has done all it had: the write-backs of those builds are
  pushes that meet the outage too, so only the reconciler can heal the last pushes;
- Gitea's "Test Delivery" redelivers one push of the second half that the EventSource
  took (the first the ``--redeliver`` share picks). Gitea's test delivery posts the
  head as the push's before and after: the Sensor passes no such push, so it makes no
  Workflow and no trigger meets 409;
- a share of the builds crash between the push and the write-back.

**What plays the Argo controller: the bench**, on the live API server. The plane's
workflow-controller is stopped once the plane is up, so that nothing else acts on the
Workflows. The bench runs each Workflow without a status as in the simulation (the plan
step's change check, a real image pushed, the write-back through fabrique's Gitea client
to the real Gitea, a share crashing before it) and writes the status the controller
would (``argo_status``) onto the Workflow. Every write-back is a push to Gitea too, as
on a cluster: it is delivered, and its push's step makes no build of it (it touches
only a file fabrique writes).

Once the Sensor has taken and acked every event, each push is reported as it went
(``pushes``): what the bench did to its delivery, every answer Gitea's deliveries of it
got, and the apps whose Workflow exists at its commit. A push is lost when none does;
the losses are counted from that, by what befell its delivery.

Then the real ``Reconciler`` runs passes
against the real Gitea, registry and API server until every app is current. Requests
per app per pass count Gitea's, the registry's and the API server's.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import config as k8s_config

from bench.event_loss_world import (
    CountingTransport,
    Figures,
    World,
    make_site,
    seed_files,
    site_values,
)
from fabrique.clients.gitea import GiteaClient, Identity
from fabrique.clients.kube import KubeClient
from fabrique.clients.registry import RegistryClient
from fabrique.decisions.push import ask_builds, raise_for_failures, touched
from fabrique.decisions.reconcile import Reconciler
from fabrique.decisions.writeback import GiteaTransport
from fabrique.render import render_tree, write_tree
from fabrique.site.config import Site
from fabrique.site.names import PLANNER_ACCOUNT, PUSH_MADE, PUSH_PREFIX, workflow_name
from tests import servers
from tests.gitrepo import BareRepo
from tests.live import controlplane
from tests.live.cluster import ARGO, Cluster
from tests.live.events import (
    CONTROL,
    SOURCE,
    ArgoEvents,
    Delivery,
    ServiceProxy,
    start_event_path,
)
from tests.live.fixtures import apply_site
from tests.live.forge import Forge, forge

# what the EventSource logs once its connection daemon has a new connection to the bus
# (argo-events pkg/eventsources/eventing.go)
RECONNECTED = "reconnected to eventbus successfully"
SETTLE_SECONDS = 180  # the Sensor's slowest: a redelivery's minute, then what waited behind it


class BenchError(RuntimeError):
    """The real components could not be set up or did not settle: the message says which."""


@dataclass
class LiveEventPath:
    forged: Forge
    cluster: Cluster
    events: ArgoEvents
    registry: servers.Registry
    site: Site
    ready_seconds: float  # from the Argo Events controller's start to every Sensor listening


@contextmanager
def live_event_path(
    work: Path, proxy: ServiceProxy, bearer: str, apps: int, *, argo_controller: bool
) -> Iterator[LiveEventPath]:
    """Gitea holding ``apps`` apps, the registry, the control plane with their site
    applied (its Argo controller running or stopped), the Argo Events controller and the
    event path it deploys, Gitea's webhook routed to the EventSource through ``proxy``;
    all stopped on the way out."""
    go = controlplane.peers.find_go()
    if go is None:
        low = controlplane.peers.MIN_GO
        raise BenchError(
            f"the live tier needs Go >= {low[0]}.{low[1]} to build its peers (make peers)"
        )
    with ExitStack() as stack:
        (work / "registry").mkdir()
        registry = stack.enter_context(servers.registry(work / "registry"))
        proxy.start()
        stack.callback(proxy.stop)
        forged = stack.enter_context(
            forge(
                work / "forge",
                proxy,
                bearer,
                site_values(apps, registry.host),
                seed=seed_files(apps),
            )
        )
        site = make_site(apps, forged.gitea.url, registry.host)
        plane = controlplane.ControlPlane(work / "plane")
        plane.start(controlplane.binaries())
        stack.callback(plane.stop)
        if not argo_controller:
            plane.stop_peer("workflow-controller")
        cluster = Cluster(plane)
        stack.callback(cluster.http.close)
        tree = work / "tree"
        write_tree(render_tree(site), tree)
        apply_site(cluster, tree)
        events = ArgoEvents(cluster, work / "argo-events")
        stack.callback(events.stop)
        started = time.monotonic()
        events.start_controller()
        start_event_path(cluster, events, site, bearer)
        ready = round(time.monotonic() - started, 1)
        proxy.route(cluster, CONTROL, f"{SOURCE}-eventsource-svc", events.webhook_port)
        yield LiveEventPath(forged, cluster, events, registry, site, ready)


@dataclass
class LiveFigures(Figures):
    """The simulation's figures, and what only the real programs tell."""

    deliveries: int = 0  # requests Gitea made to the EventSource's Service (all pushes)
    writebacks_lost: int = 0  # deliveries of write-back pushes that got no 200 (not events_sent)
    eventsource_answers: dict[str, int] = field(default_factory=dict)  # pushes: status -> n
    gitea_retried: int = 0  # lost pushes Gitea delivered again (it does not retry)
    bus_messages_before_restart: int = 0
    bus_messages_after_restart: int = 0
    bus_unconsumed_at_restart: int = 0  # events a trigger had not acked when it stopped
    bus_consumers_after_restart: int = 0
    redeliveries_given_up: int = 0  # the Sensor's six tries met 409 each time
    seconds_setup: float = 0.0
    seconds_events: float = 0.0
    seconds_reconcile: float = 0.0


@dataclass
class Push:
    index: int
    app: str
    sha: str
    fate: str  # what the bench did to its delivery: dropped | outage | sent
    answered: int = 0  # the status Gitea's first delivery of it got
    said: str = ""  # the start of that answer's body
    # for the push made at the bus's restart: had the EventSource said it reconnected by
    # the time that answer came? (None for the others)
    reconnected: bool | None = None


class LiveWorld(World):
    """The Workflows in the live API server, their status written as the controller
    writes it (the Workflow CRD has no status subresource)."""

    def __init__(self, cluster: Cluster, gitea: GiteaClient, *args: Any) -> None:
        super().__init__(*args)
        self.cluster = cluster
        self.gitea = gitea
        self.path = f"{ARGO}/namespaces/{self.site.namespaces.build}/workflows"
        self.pushes = f"{ARGO}/namespaces/{self.site.namespaces.control}/workflows"
        # the push step's own account: RBAC and admission judge the builds it creates
        kubeconfig = Path(cluster.plane.folder) / "planner.kubeconfig"
        control = self.site.namespaces.control
        cluster.plane.write_kubeconfig(
            kubeconfig, control, token=cluster.token(control, PLANNER_ACCOUNT)
        )
        self.planner = KubeClient(k8s_config.new_client_from_config(config_file=str(kubeconfig)))

    def _all(self) -> list[dict[str, Any]]:
        return self.cluster.items(self.path)

    def plan_pushes(self) -> None:
        """Each push Workflow not run yet, run as its pod would (``fabrique plan-push``:
        what the push touched, its builds), then marked Succeeded."""
        for push in self.cluster.items(self.pushes):
            name = push["metadata"]["name"]
            if not name.startswith(PUSH_PREFIX) or (push.get("status") or {}).get("phase"):
                continue
            before, after = (p["value"] for p in push["spec"]["arguments"]["parameters"])
            found = touched(self.site, self.gitea, before, after)
            raise_for_failures(ask_builds(self.site, self.planner, found.apps, after))
            answer = self.cluster.request(
                "PATCH",
                f"{self.pushes}/{name}",
                {"status": {"phase": "Succeeded"}},
                content_type="application/merge-patch+json",
            )
            if answer.status != 200:
                raise BenchError(f"the status of Workflow {name}: {answer.message}")

    def pending(self) -> list[tuple[str, dict[str, Any]]]:
        self.plan_pushes()
        return [
            (w["metadata"]["name"], w)
            for w in self._all()
            if not (w.get("status") or {}).get("phase")
        ]

    def record(self, key: str, body: dict[str, Any], status: dict[str, Any]) -> None:
        answer = self.cluster.request(
            "PATCH",
            f"{self.path}/{key}",
            {"status": status},
            content_type="application/merge-patch+json",
        )
        if answer.status != 200:
            raise BenchError(f"the status of Workflow {key}: {answer.status} {answer.message}")

    def failed(self) -> list[tuple[str, dict[str, Any]]]:
        return [
            (w["metadata"]["name"], w)
            for w in self._all()
            if (w.get("status") or {}).get("phase") == "Failed"
        ]

    def remove(self, key: str) -> None:
        answer = self.cluster.request("DELETE", f"{self.path}/{key}")
        if answer.status not in (200, 202, 404):
            raise BenchError(f"delete Workflow {key}: {answer.status} {answer.message}")

    def exists(self, app: str, revision: str) -> bool:
        return self.cluster.exists(f"{self.path}/{workflow_name(app, revision)}")


class RealBench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.figures = LiveFigures()
        self.bearer = f"bench-{secrets.token_hex(16)}"
        self.refusing: set[str] = set()
        self.proxy = ServiceProxy(refuse=self._refuse)
        self.pushes: list[Push] = []

    def _refuse(self, body: bytes) -> bool:
        try:
            after = json.loads(body).get("after")
        except (ValueError, AttributeError):
            return False
        return after in self.refusing

    # -- the real components ------------------------------------------------------------

    def run(self) -> LiveFigures:
        f, args = self.figures, self.args
        started = time.monotonic()
        try:
            # the bench plays the Argo controller: the real one must not act too
            with live_event_path(
                self.work, self.proxy, self.bearer, args.apps, argo_controller=False
            ) as path:
                forged, cluster, events, registry, site = (
                    path.forged,
                    path.cluster,
                    path.events,
                    path.registry,
                    path.site,
                )
                f.seconds_setup = round(time.monotonic() - started, 1)
                kubeconfig = cluster.kubeconfig
                api_client = k8s_config.new_client_from_config(config_file=str(kubeconfig))
                kube_calls = count_calls(api_client)
                api = KubeClient(api_client)
                gitea_counting, registry_counting = CountingTransport(), CountingTransport()
                with (
                    GiteaClient(
                        site.gitea.url,
                        forged.gitea.token,
                        retry=site.network.retry_policy(),
                        transport=gitea_counting,
                    ) as client,
                    RegistryClient(
                        registry.host, plain_http=True, transport=registry_counting
                    ) as reg,
                ):
                    transport = GiteaTransport(
                        client, Identity("fabrique", "fabrique@fabrique.invalid")
                    )
                    world = LiveWorld(
                        cluster,
                        client,
                        site,
                        BareRepo(forged.bare),
                        registry,
                        api,
                        transport,
                        # its own stream: how many Workflows wait at each run is timing's,
                        # and must not move which pushes are lost
                        random.Random(args.seed + 1),
                        f,
                        args.crash,
                    )
                    played = time.monotonic()
                    self.play(world, forged, events)
                    # the EventSource stays down until the builds in flight are done:
                    # their write-backs' deliveries are lost too, and nothing heals the
                    # last pushes but the reconciler
                    self.settle(world, events)
                    if args.outage:
                        events.start_container("eventsource")
                    self.count_losses(world, events)
                    f.seconds_events = round(time.monotonic() - played, 1)
                    f.drifted_before = world.drifted()
                    reconciling = time.monotonic()
                    self.converge(
                        world,
                        Reconciler(site, transport, reg, api),
                        lambda: gitea_counting.count + registry_counting.count + kube_calls[0],
                    )
                    f.seconds_reconcile = round(time.monotonic() - reconciling, 1)
                    f.rollbacks = world.rollbacks()
                    f.duplicate_builds = sum(
                        max(0, n - 1 - f.expired.get(key, 0)) for key, n in f.built.items()
                    )
        except (controlplane.ControlPlaneError, controlplane.peers.PeerError) as failed:
            raise BenchError(f"the live tier did not start: {failed}") from None
        return f

    # -- the faults ------------------------------------------------------------------------

    def play(self, world: LiveWorld, forged: Forge, events: ArgoEvents) -> None:
        args, f = self.args, self.figures
        hook = forged.hook_id()
        outage_from = args.pushes - args.outage
        reconnections = 0
        for push in range(args.pushes):
            if push == args.pushes // 2:
                reconnections = events.said("eventsource", RECONNECTED)
                self.restart_bus(events)
            if push == outage_from:
                events.kill_container("eventsource")
            app = world.site.apps[self.rng.randrange(args.apps)].name
            sha = forged.commit({f"apps/{app}/src.txt": f"push {push}\n"}, f"push {push}")
            fate = "outage" if push >= outage_from else "sent"
            if fate == "sent" and self.rng.random() < args.drop:
                fate = "dropped"
                self.refusing.add(sha)
            # drawn for every push, whatever the EventSource answers: which pushes are
            # lost or redelivered must not hang on timing
            redeliver = self.rng.random() < args.redeliver
            forged.push()
            f.events_sent += 1
            first = self.delivered(sha, 1)[0]
            status = first.status
            self.pushes.append(Push(push, app, sha, fate, status, first.said))
            f.eventsource_answers[str(status)] = f.eventsource_answers.get(str(status), 0) + 1
            if push == args.pushes // 2:
                self.pushes[-1].reconnected = (
                    events.said("eventsource", RECONNECTED) > reconnections
                )
                # the EventSource finds its connection closed on its next 5-s tick only:
                # the push just made likely met the bus away (500); the next ones must
                # not, or no push of the second half is left to redeliver
                self.reconnected(events, reconnections)
            if (
                status == 200  # the EventSource took it: a redelivery, not a second chance
                and not f.redelivered
                and push >= args.pushes // 2
                and redeliver
            ):
                # the head is this push: Gitea delivers it again, as a person's click would
                tested = forged.test_delivery(hook)
                if tested != 204:
                    raise BenchError(f"Gitea's test delivery of hook #{hook} answered {tested}")
                self.delivered(sha, 2)
                f.redelivered += 1
            if (push + 1) % args.batch == 0:
                world.run_controller()

    def delivered(self, sha: str, times: int) -> list[Delivery]:
        """Gitea's deliveries of ``sha``'s push, once there are ``times`` of them."""
        deadline = time.monotonic() + 30
        while True:
            found = [d for d in self.proxy.requests if d.after == sha]
            if len(found) >= times:
                return found
            if time.monotonic() > deadline:
                raise BenchError(f"Gitea delivered the push of {sha[:12]} {len(found)} time(s)")
            time.sleep(0.05)

    def reconnected(self, events: ArgoEvents, before: int) -> None:
        """Wait until the EventSource says it reconnected to the bus once more than
        ``before`` times (eventing.go's connection daemon, every 5 s)."""
        deadline = time.monotonic() + 30
        while events.said("eventsource", RECONNECTED) <= before:
            if time.monotonic() > deadline:
                raise BenchError(
                    "the EventSource did not reconnect to the restarted bus in 30 s: "
                    + events.pods["eventsource"].tail()
                )
            time.sleep(0.2)

    def restart_bus(self, events: ArgoEvents) -> None:
        """Stop the EventBus's container and start it again, with the claim it had:
        what does JetStream keep?"""
        f = self.figures
        f.bus_messages_before_restart = events.stream_messages()
        states = events.consumer_states()
        f.bus_unconsumed_at_restart = max((c.pending + c.ack_pending for c in states), default=0)
        events.stop_container("eventbus")
        events.start_container("eventbus")
        f.bus_messages_after_restart = events.stream_messages()
        f.bus_consumers_after_restart = len(events.consumer_states())

    def settle(self, world: LiveWorld, events: ArgoEvents) -> None:
        """Run the Workflows until the event path is quiet: the Sensor has taken and acked
        every event, no Workflow waits, and Gitea delivered nothing new for a second."""
        deadline = time.monotonic() + SETTLE_SECONDS
        seen = -1
        while True:
            world.run_controller()
            now = len(self.proxy.requests)
            if now == seen and events.settled() and not world.pending():
                return
            seen = now
            if time.monotonic() > deadline:
                states = events.consumer_states()
                raise BenchError(
                    f"the event path did not settle in {SETTLE_SECONDS} s: stream at "
                    f"{events.stream_last()}, consumers {states}"
                )
            time.sleep(1)

    def count_losses(self, world: LiveWorld, events: ArgoEvents) -> None:
        f = self.figures
        f.deliveries = len(self.proxy.requests)
        per_push = Counter(d.after for d in self.proxy.requests)
        ours = {push.sha for push in self.pushes}
        f.writebacks_lost = sum(d.status != 200 for d in self.proxy.requests if d.after not in ours)
        apps = [app.name for app in world.site.apps]
        for push in self.pushes:
            made = [app for app in apps if world.exists(app, push.sha)]
            f.pushes.append(
                {
                    "index": push.index,
                    "app": push.app,
                    "sha": push.sha,
                    "fate": push.fate,
                    "answers": [d.status for d in self.proxy.requests if d.after == push.sha],
                    "said": push.said,
                    "reconnected": push.reconnected,
                    "workflows": made,
                }
            )
            # lost: no Workflow came of it, counted by what befell its delivery
            if not made and push.fate == "dropped":
                f.lost_webhook += 1
            elif not made and push.fate == "outage":
                f.lost_outage += 1
            elif not made:
                f.lost_eventbus += 1  # the EventSource had it, and lost it
            if push.fate != "sent" and per_push[push.sha] > 1:
                f.gitea_retried += 1
        # the Sensor's trigger patches: a creation of a push's Workflow and a redelivery's
        # no-op are both "triggered"; the builds the pushes' steps created carry the
        # submitter push (none expired yet)
        triggered = int(events.sensor_metric("argo_events_action_triggered_total"))
        pushed = [
            w
            for w in world.cluster.items(world.pushes)
            if w["metadata"]["name"].startswith(PUSH_PREFIX)
        ]
        f.workflows_created = len(world.cluster.items(world.path, PUSH_MADE))
        f.workflows_existing = triggered - len(pushed)
        f.workflows_refused_409 = int(events.sensor_metric("argo_events_action_failed_total"))
        f.redeliveries_given_up = int(
            events.sensor_metric("argo_events_action_retries_failed_total")
        )

    # -- the safety net --------------------------------------------------------------------

    def converge(
        self, world: LiveWorld, reconciler: Reconciler, requests: Callable[[], int]
    ) -> None:
        f = self.figures
        total = 0
        for _ in range(self.args.max_passes):
            before = requests()
            results = reconciler.run(list(world.site.apps), "act")
            total += requests() - before
            f.reconcile_passes += 1
            f.reconcile_states.append(dict(sorted(Counter(r.state for r in results).items())))
            errors = [r for r in results if r.state == "error"]
            if errors:
                raise BenchError(f"reconcile errors: {[r.detail for r in errors][:3]}")
            f.workflows_created += sum(r.state == "submitted" for r in results)
            f.failed_reported += sum(r.state == "failed" for r in results)
            world.expire_failed()
            world.run_controller(crash=0.0)
            if all(r.state == "ok" for r in results):
                break
        f.requests_per_app_per_pass = round(total / (len(world.site.apps) * f.reconcile_passes), 1)
        f.drifted_after = world.drifted()


def count_calls(api_client: Any) -> list[int]:
    """Count the API server requests made through ``api_client`` (one per ``call_api``)."""
    calls = [0]
    call_api = api_client.call_api

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return call_api(*args, **kwargs)

    api_client.call_api = counted
    return calls
