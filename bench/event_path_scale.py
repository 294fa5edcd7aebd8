"""What a push costs on the event path, by catalogue size, on the live tier's programs.

    python bench/event_path_scale.py [--apps 10,200,1000] [--json]

For each size: a real Gitea whose code repository holds that many apps (each its
Dockerfile and its write-back file), the live control plane with the site rendered for
them and applied (its Argo controller running, so that a Workflow makes its first pod),
the Argo Events controller and the event path it deploys: JetStream, the EventSource,
and the Sensors render made (one, or as many as fit the limit of a pod's variable).
Then, one after the other:

- **one app**: a ``git push`` of a commit touching one app's context;
- **no app**: a ``git push`` of a commit beside every app (``docs/``);
- **test delivery**: Gitea's "Test Delivery" of the webhook (the head commit, listed
  without its files);
- **replay**: the first push's delivery sent again, headers and body as they were, as
  Gitea's "Replay" of a delivery sends it: its Workflow exists already.

For each: the Workflows and the pods created, the time from the push (or the delivery)
to its Workflow, the time until every Sensor has taken and acked it, the CPU seconds the
Sensors and the EventSource spent meanwhile, and their memory at the end (resident; the
Sensors' summed). Also the time the event path took to be ready, and the largest
rendered Sensor's size.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_loss_real import BenchError, live_event_path
from bench.event_loss_world import make_site
from eventsources.sensor import sensor
from fabrique.site.config import Site
from fabrique.site.names import LABEL_REVISION
from tests.live import controlplane
from tests.live.cluster import ARGO, Cluster
from tests.live.events import (
    CONTROL,
    ArgoEvents,
    ServiceProxy,
)
from tests.live.forge import Forge
from tests.live.planner import Planner
from tests.waits import until

WAIT_SECONDS = 120.0  # a replay's trigger tries for about a minute: settle within two
POLL = 0.01
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Scenario:
    name: str
    workflows: int  # Workflows created of the pushed commit
    pods: int  # pods created in the build namespace
    to_workflow: float | None  # seconds from the push to its (first) Workflow
    to_settled: float  # seconds from the push until every Sensor took and acked it
    sensors_cpu: float  # CPU seconds the Sensors spent meanwhile
    eventsource_cpu: float
    sensors_rss_mib: float  # at the end, summed
    eventsource_rss_mib: float


@dataclass
class Size:
    apps: int
    sensors: int
    largest_sensor_bytes: int
    ready_seconds: float  # from the Argo Events controller's start to every Sensor listening
    scenarios: list[Scenario] = field(default_factory=list)


def _tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        one = todo.pop()
        found.append(one)
        todo += children.get(one, [])
    return found


def _usage(pid: int) -> tuple[float, float]:
    """CPU seconds (user and system) and resident MiB of ``pid``'s process tree."""
    cpu = rss = 0.0
    for one in _tree(pid):
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{one}/status").read_text()
        except OSError:
            continue
        cpu += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss += int(line.split()[1]) / 1024
    return cpu, rss


class ScaleBench:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.bearer = f"bench-{secrets.token_hex(16)}"
        self.proxy = ServiceProxy()

    def measure(self, apps: int) -> Size:
        site = make_site(apps, "http://gitea", "registry:80")
        rendered = [len(json.dumps(sensor(site), separators=(",", ":")))]
        work = self.work / f"apps-{apps}"
        work.mkdir()
        # the Argo controller runs: it makes each Workflow's first pod
        try:
            with live_event_path(work, self.proxy, self.bearer, apps, argo_controller=True) as path:
                forged = path.forged
                # the push Workflows' step, played as their pod would run it (kwok runs
                # no container): what it creates is the builds the bench waits for
                planner = Planner(path.cluster, CONTROL, forged.values, forged.env, work)
                planner.start()
                size = Size(apps, len(rendered), max(rendered), path.ready_seconds)
                run = Runner(forged, path.cluster, path.events, path.site, self.proxy)
                first = path.site.apps[0].name
                size.scenarios.append(
                    run.scenario(
                        "one app",
                        lambda: forged.push({f"apps/{first}/src.txt": "change\n"}, "one app"),
                        expect_workflow=True,
                    )
                )
                touched = run.last_sha
                size.scenarios.append(
                    run.scenario(
                        "no app", lambda: forged.push({"docs/notes.md": "notes\n"}, "docs")
                    )
                )
                hook = forged.hook_id()
                head = run.last_sha
                size.scenarios.append(
                    run.scenario("test delivery", lambda: run.test_delivery(hook), of=head)
                )
                size.scenarios.append(
                    run.scenario("replay", lambda: run.replay(touched), of=touched)
                )
                planner.stop()
                return size
        except (controlplane.ControlPlaneError, controlplane.peers.PeerError) as failed:
            raise BenchError(f"the live tier did not start: {failed}") from None


class Runner:
    def __init__(
        self, forged: Forge, cluster: Cluster, events: ArgoEvents, site: Site, proxy: ServiceProxy
    ) -> None:
        self.forged, self.cluster, self.events, self.site, self.proxy = (
            forged,
            cluster,
            events,
            site,
            proxy,
        )
        self.build = site.namespaces.build
        self.last_sha = ""

    def usage(self) -> tuple[float, float, float, float]:
        sensors_cpu = sensors_rss = 0.0
        for role, pod in self.events.pods.items():
            if role.startswith("sensor") and pod.process is not None:
                cpu, rss = _usage(pod.process.pid)
                sensors_cpu, sensors_rss = sensors_cpu + cpu, sensors_rss + rss
        source = self.events.pods["eventsource"].process
        assert source is not None
        cpu, rss = _usage(source.pid)
        return sensors_cpu, sensors_rss, cpu, rss

    def pods(self) -> int:
        return len(self.cluster.items(f"/api/v1/namespaces/{self.build}/pods"))

    def workflows(self, sha: str) -> list[str]:
        return [
            w["metadata"]["name"]
            for w in self.cluster.items(
                f"{ARGO}/namespaces/{self.build}/workflows", f"{LABEL_REVISION}={sha[:12]}"
            )
        ]

    def test_delivery(self, hook: int) -> str:
        sha = self.forged.git("rev-parse", "HEAD").strip()
        answer = self.forged.test_delivery(hook)
        if answer != 204:
            raise BenchError(f"Gitea's test delivery of hook #{hook} answered {answer}")
        return sha

    def replay(self, sha: str) -> str:
        answer = self.proxy.replay(sha)
        if answer != 200:
            raise BenchError(f"the replay of {sha[:12]}'s delivery answered {answer}")
        return sha

    def scenario(
        self,
        name: str,
        act: Callable[[], str],
        *,
        expect_workflow: bool = False,
        of: str = "",
    ) -> Scenario:
        """Do ``act`` (it returns the commit concerned: ``of``, for a delivery of a commit
        pushed before), then wait for its Workflow when one is expected, and for every
        Sensor to have taken and acked it."""
        events = self.events
        last, pods = events.stream_last(), self.pods()
        known = set(self.workflows(of)) if of else set()
        sensors_cpu, _, source_cpu, _ = self.usage()
        start = time.monotonic()
        sha = act()
        to_workflow = None
        deadline = start + WAIT_SECONDS

        def left() -> float:
            return max(deadline - time.monotonic(), 0.0)

        if expect_workflow:
            until(
                f"{name}: a Workflow of {sha[:12]}",
                lambda: self.workflows(sha),
                left(),
                every=POLL,
                error=BenchError,
            )
            to_workflow = round(time.monotonic() - start, 3)
        until(
            f"{name}: every Sensor to take and ack the event",
            lambda: events.stream_last() > last and events.settled(),
            left(),
            every=0.1,
            error=BenchError,
            detail=lambda: str(events.consumer_states()[:3]),
        )
        to_settled = round(time.monotonic() - start, 3)
        made = [w for w in self.workflows(sha) if w not in known]
        until(
            f"{name}: the Argo controller to make the first pod of each of {len(made)} Workflow(s)",
            lambda: self.pods() >= pods + len(made),
            left(),
            every=0.1,
            error=BenchError,
        )
        sensors_after, sensors_rss, source_after, source_rss = self.usage()
        if not of:
            self.last_sha = sha
        return Scenario(
            name,
            len(made),
            self.pods() - pods,
            to_workflow,
            to_settled,
            round(sensors_after - sensors_cpu, 2),
            round(source_after - source_cpu, 2),
            round(sensors_rss, 1),
            round(source_rss, 1),
        )


def table(sizes: list[Size]) -> str:
    lines = [
        "| apps | Sensors | largest Sensor (bytes) | ready (s) | push | Workflows | pods "
        "| push → Workflow (s) | push → settled (s) | Sensors CPU (s) | EventSource CPU (s) "
        "| Sensors RSS (MiB) | EventSource RSS (MiB) |",
        "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for size in sizes:
        for s in size.scenarios:
            to_workflow = "" if s.to_workflow is None else f"{s.to_workflow:.2f}"
            lines.append(
                f"| {size.apps} | {size.sensors} | {size.largest_sensor_bytes} "
                f"| {size.ready_seconds} | {s.name} | {s.workflows} | {s.pods} | {to_workflow} "
                f"| {s.to_settled:.2f} | {s.sensors_cpu:.2f} | {s.eventsource_cpu:.2f} "
                f"| {s.sensors_rss_mib:.0f} | {s.eventsource_rss_mib:.0f} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", default="10,200,1000")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = []
    try:
        for apps in (int(n) for n in args.apps.split(",")):
            # what the live tier says of its peers is progress: stdout is the figures'
            with (
                tempfile.TemporaryDirectory(prefix="fabrique-scale-") as work,
                redirect_stdout(sys.stderr),
            ):
                sizes.append(ScaleBench(Path(work)).measure(apps))
            print(f"measured {apps} apps", file=sys.stderr, flush=True)
    except BenchError as failed:
        print(f"event_path_scale: {failed}", file=sys.stderr)
        return 1
    print(json.dumps([asdict(s) for s in sizes]) if args.json else table(sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
