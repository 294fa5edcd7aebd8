"""Fault bench: events get lost, the reconciler makes the platform converge anyway.

    python bench/event_loss.py [--apps 20] [--pushes 200] [--drop 0.1] [--crash 0.05] [--json]
    python bench/event_loss.py --real [--apps 5] [--pushes 40] [--keep DIR]

A **simulation**, run on this machine: the real Sensor and Argo controller are not in the
loop. What is real: a nats-server with JetStream (memory storage, an EventBus without a
PVC), the OCI registry holding real images, and a bare git repository behind the Gitea
double. What stands in:

- the EventSource: each push is published to ``default.gitea.push`` (a share of the
  webhook deliveries is dropped first, as Gitea does not retry);
- the Sensor: a durable consumer that applies the rendered Sensor's filters and trigger to
  each event and creates the Workflow through the Kubernetes API double, then acks;
- the controller: each created Workflow runs the plan step's change check, "builds" by
  pushing a real image, and writes back through the Gitea double. They finish in a
  shuffled order, and a share crash between the push and the write-back. A crashed
  Workflow is Failed: the reconciler reports it and never writes its image back; it is
  rebuilt once it is gone (the operator's delete, or its TTL, played between passes).

nats-server is killed and restarted halfway through: what the Sensor had not consumed
yet is gone. The last pushes happen while the EventSource is down. Every delivered push
makes every app's plan step look at what changed since its deployed revision, so a later
event heals earlier losses; what is lost at the end only the reconciler can catch. Then
reconcile passes run until every app is deployed at its last change.

Once the events have settled, before the reconciler acts, each push is reported as it went
(``pushes``): what the bench did to its delivery (``fate``), how many times the Sensor
took its event (``taken``), and the apps whose Workflow exists at its commit in the Kubernetes API
double. A push is lost when none does; the losses are counted from that, by what befell
its delivery. The reconciler's states are reported per pass (``reconcile_states``).

It prints the figures below and exits non-zero if a rule breaks: no duplicate build, no
rollback, no app drifted once converged.

``--real`` runs the same faults and rules on the live tier's real programs instead: a real
Gitea, the real EventBus, EventSource and Sensor on the live control plane, the bench
playing the Argo controller there (``bench/event_loss_real.py``; it needs Go).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack, redirect_stdout
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats  # noqa: E402
from kubernetes import config as k8s_config  # noqa: E402
from nats.js.api import StorageType, StreamConfig  # noqa: E402

from bench.event_loss_world import (  # noqa: E402
    CountingTransport,
    Figures,
    World,
    make_site,
    seed_files,
)
from eventsources.sensor import sensor  # noqa: E402
from fabrique.clients.gitea import GiteaClient, Identity  # noqa: E402
from fabrique.clients.kube import KubeClient  # noqa: E402
from fabrique.clients.registry import RegistryClient  # noqa: E402
from fabrique.decisions.push import touched  # noqa: E402
from fabrique.decisions.reconcile import Reconciler  # noqa: E402
from fabrique.decisions.workflow import build_workflow  # noqa: E402
from fabrique.decisions.writeback import GiteaTransport  # noqa: E402
from fabrique.site.names import PUSH_SUBMITTER, workflow_name  # noqa: E402
from fabrique.validate import GITEA_SWAGGER, find_specs  # noqa: E402
from tests import payloads, servers  # noqa: E402
from tests.doubles.gitea import GiteaDouble  # noqa: E402
from tests.doubles.kube import KubeApiDouble  # noqa: E402
from tests.doubles.sensor import dependency_passes, fire  # noqa: E402
from tests.doubles.swagger import Swagger  # noqa: E402
from tests.gitrepo import Repo  # noqa: E402

SUBJECT = "default.gitea.push"
TOKEN = "bench-gitea-token"


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.figures = Figures()
        self.pushes: list[tuple[int, str, str, str]] = []  # index, app, commit, fate
        self.taken: Counter[str] = Counter()  # commit -> times the Sensor took its event

    async def run(self) -> Figures:
        args, work = self.args, self.work
        specs = find_specs()
        (work / "registry").mkdir()
        with servers.registry(work / "registry") as registry, servers.nats(work / "nats") as bus:
            repo = Repo(work / "srv", "atlas/atlas")
            repo.commit(seed_files(args.apps), "seed")
            gitea = GiteaDouble(
                Swagger(specs / GITEA_SWAGGER),
                {"atlas/atlas": repo.bare},
                token=TOKEN,
            )
            kube = KubeApiDouble(specs)
            gitea.start()
            kube.start()
            try:
                site = make_site(args.apps, gitea.url, registry.host)
                kubeconfig = kube.kubeconfig(work / "kubeconfig")
                api = KubeClient(k8s_config.new_client_from_config(config_file=str(kubeconfig)))
                counting = CountingTransport()
                with (
                    GiteaClient(site.gitea.url, TOKEN, retry=site.network.retry_policy()) as client,
                    RegistryClient(registry.host, plain_http=True, transport=counting) as reg,
                ):
                    transport = GiteaTransport(
                        client, Identity("fabrique", "fabrique@fabrique.invalid")
                    )
                    world = DoubleWorld(
                        kube,
                        site,
                        repo,
                        registry,
                        api,
                        transport,
                        self.rng,
                        self.figures,
                        args.crash,
                    )
                    await self.play(world, bus, client)
                    self.figures.drifted_before = world.drifted()
                    reconciler = Reconciler(site, transport, reg, api)
                    await self.converge(world, reconciler, gitea, kube, counting)
                    self.figures.rollbacks = world.rollbacks()
                    # a rebuild after its failed Workflow was deleted is no duplicate
                    self.figures.duplicate_builds = sum(
                        max(0, n - 1 - self.figures.expired.get(key, 0))
                        for key, n in self.figures.built.items()
                    )
                if gitea.violations:
                    raise RuntimeError(
                        f"the Gitea double saw traffic outside Gitea's spec: {gitea.violations[:3]}"
                    )
            finally:
                gitea.stop()
                kube.stop()
        return self.figures

    async def play(self, world: World, bus: servers.Nats, gitea: GiteaClient) -> None:
        """Pushes, webhook drops, a NATS restart halfway, the Sensor consuming in batches."""
        args, f = self.args, self.figures
        rendered = sensor(world.site)["spec"]
        (dependency,), (trigger,) = rendered["dependencies"], rendered["triggers"]

        def push_workflow(event: dict[str, Any]) -> None:
            """The push's Workflow the trigger makes, and its step: the builds it asks."""
            parameters = fire(trigger, event)["spec"]["arguments"]["parameters"]
            before, after = (p["value"] for p in parameters)
            for app in touched(world.site, gitea, before, after).apps:
                world.create(build_workflow(world.site, app, after, submitted_by=PUSH_SUBMITTER))

        nc, psub = await connect(bus)
        try:
            for push in range(args.pushes):
                if push == args.pushes // 2:
                    await nc.close()
                    bus.restart()  # memory storage: whatever was not consumed is gone
                    nc, psub = await connect(bus)
                app = world.site.apps[self.rng.randrange(args.apps)].name
                before = world.repo.head()
                revision = world.repo.commit(
                    {f"apps/{app}/src.txt": f"push {push}\n"}, f"push {push}"
                )
                f.events_sent += 1
                if push >= args.pushes - args.outage:
                    fate = "outage"  # the EventSource is scaled to zero: Gitea gets an error
                elif self.rng.random() < args.drop:
                    fate = "dropped"
                else:
                    fate = "sent"
                    event = payloads.push(
                        after=revision, before=before, files=[f"apps/{app}/src.txt"]
                    )
                    await nc.jetstream().publish(SUBJECT, json.dumps(event).encode())
                self.pushes.append((push, app, revision, fate))
                if (push + 1) % args.batch == 0:
                    await self.consume(psub, dependency, push_workflow)
                    world.run_controller()
            await self.consume(psub, dependency, push_workflow)
        finally:
            await nc.close()
        world.run_controller()
        self.count_losses(world)

    def count_losses(self, world: World) -> None:
        """Report each push by the Workflows that came of it; count the lost ones."""
        f = self.figures
        apps = [app.name for app in world.site.apps]
        for index, app, revision, fate in self.pushes:
            made = [name for name in apps if world.exists(name, revision)]
            f.pushes.append(
                {
                    "index": index,
                    "app": app,
                    "sha": revision,
                    "fate": fate,
                    "taken": self.taken[revision],
                    "workflows": made,
                }
            )
            # lost: no Workflow came of it, counted by what befell its delivery
            if not made and fate == "dropped":
                f.lost_webhook += 1
            elif not made and fate == "outage":
                f.lost_outage += 1
            elif not made:
                f.lost_eventbus += 1  # published, and gone with the bus's restart

    async def consume(
        self, psub: Any, dependency: dict[str, Any], planned: Callable[[dict[str, Any]], None]
    ) -> None:
        while True:
            try:
                messages = await psub.fetch(batch=50, timeout=0.2)
            except TimeoutError:  # nats' own subclass, or the plain one from _fetch_n
                return
            for message in messages:
                event = json.loads(message.data)
                self.taken[event["body"]["after"]] += 1
                if dependency_passes(event, dependency):
                    planned(event)
                if self.rng.random() < self.args.redeliver:
                    # the Sensor died between the create and the ack: JetStream delivers again
                    self.figures.redelivered += 1
                    await message.nak()
                else:
                    await message.ack()

    async def converge(
        self,
        world: World,
        reconciler: Reconciler,
        gitea: GiteaDouble,
        kube: KubeApiDouble,
        counting: CountingTransport,
    ) -> None:
        f = self.figures
        requests = 0
        for _ in range(self.args.max_passes):
            before = len(gitea.requests) + len(kube.requests) + counting.count
            results = reconciler.run(list(world.site.apps), "act")
            requests += len(gitea.requests) + len(kube.requests) + counting.count - before
            f.reconcile_passes += 1
            f.reconcile_states.append(dict(sorted(Counter(r.state for r in results).items())))
            errors = [r for r in results if r.state == "error"]
            if errors:
                raise RuntimeError(f"reconcile errors: {[r.detail for r in errors][:3]}")
            failed = [r for r in results if r.state == "failed"]
            f.failed_reported += len(failed)
            world.expire_failed()
            world.run_controller(crash=0.0)
            if all(r.state == "ok" for r in results):
                break
        f.requests_per_app_per_pass = round(
            requests / (len(world.site.apps) * f.reconcile_passes), 1
        )
        f.drifted_after = world.drifted()


async def connect(bus: servers.Nats) -> tuple[Any, Any]:
    nc = await nats.connect(bus.url, token=bus.token)
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(name="default", subjects=["default.*.*"], storage=StorageType.MEMORY)
    )
    return nc, await js.pull_subscribe(SUBJECT, durable="fabrique-build-sensor", stream="default")


class DoubleWorld(World):
    """The Workflows in the Kubernetes API double, its store written directly."""

    def __init__(self, kube: KubeApiDouble, *args: Any) -> None:
        super().__init__(*args)
        self.kube = kube

    def _key(self, name: str) -> tuple[str, str]:
        return (self.site.namespaces.build, name)

    def pending(self) -> list[tuple[str, dict[str, Any]]]:
        return [
            (name, body) for (_, name), body in self.kube.objects.items() if "status" not in body
        ]

    def record(self, key: str, body: dict[str, Any], status: dict[str, Any]) -> None:
        self.kube.objects[self._key(key)] = {**body, "status": status}

    def failed(self) -> list[tuple[str, dict[str, Any]]]:
        return [
            (name, body)
            for (_, name), body in self.kube.objects.items()
            if (body.get("status") or {}).get("phase") == "Failed"
        ]

    def remove(self, key: str) -> None:
        del self.kube.objects[self._key(key)]

    def exists(self, app: str, revision: str) -> bool:
        return self._key(workflow_name(app, revision)) in self.kube.objects


class OneLineParser(argparse.ArgumentParser):
    """Bad input is one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def bad_input(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, or None."""
    for name in ("apps", "pushes", "batch", "max_passes"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}"
    if not 0 <= args.outage <= args.pushes:
        return f"--outage must be between 0 and --pushes ({args.pushes}), not {args.outage}"
    for name in ("drop", "crash", "redeliver"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            return f"--{name} is a share, between 0 and 1, not {getattr(args, name)}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--real",
        action="store_true",
        help="the live tier's real Gitea, control plane, EventBus, EventSource and Sensor "
        "(bench/event_loss_real.py; needs Go)",
    )
    parser.add_argument("--apps", type=int, help="default 20, or 5 with --real")
    parser.add_argument("--pushes", type=int, help="default 200, or 40 with --real")
    parser.add_argument("--drop", type=float, default=0.1, help="share of webhook deliveries lost")
    parser.add_argument(
        "--crash", type=float, default=0.05, help="share of builds crashing before write-back"
    )
    parser.add_argument(
        "--redeliver",
        type=float,
        default=0.1,
        help="share of events delivered twice (--real: picks one push of the second half)",
    )
    parser.add_argument(
        "--outage", type=int, default=3, help="last pushes sent while the EventSource is down"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=8,
        help="pushes between two Sensor fetches (--real: between two runs of the Workflows)",
    )
    parser.add_argument("--max-passes", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="work in DIR (new or empty) and keep it: the servers' logs and data",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="show fabrique's own log")
    args = parser.parse_args(argv)
    if args.apps is None:
        args.apps = 5 if args.real else 20
    if args.pushes is None:
        args.pushes = 40 if args.real else 200
    wrong = bad_input(args)
    if wrong is None and args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        wrong = f"--keep {args.keep} is not empty"
    if wrong:
        print(f"error: {wrong}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR, format="%(name)s: %(message)s"
    )
    with ExitStack() as stack:
        if args.keep is None:
            work = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="fabrique-event-loss-"))
            )
        else:
            work = args.keep.resolve()
            work.mkdir(parents=True, exist_ok=True)
        if args.real:
            # imported here: the simulation needs no Go and none of the live tier
            from bench.event_loss_real import BenchError, RealBench

            try:
                # what the live tier says of its peers is progress: stdout is the figures'
                with redirect_stdout(sys.stderr):
                    figures: Figures = RealBench(args, work).run()
            except BenchError as failed:
                print(f"error: {failed}", file=sys.stderr)
                return 1
        else:
            figures = asyncio.run(Bench(args, work).run())
    report = figures.report()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        width = max(len(k) for k in report)
        for key, value in report.items():
            if isinstance(value, list):  # the real mode's pushes and passes: one a line
                print(f"{key.replace('_', ' ')}:")
                for item in value:
                    print(f"  {item}")
            else:
                print(f"{key.replace('_', ' '):<{width}}  {value}")
    broken = figures.broken()
    for rule in broken:
        print(f"RULE BROKEN: {rule}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
