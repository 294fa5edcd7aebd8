"""What a push costs on the event path, by catalogue size, on the live tier's programs.

    python bench/event_path_scale.py [--apps 10,1000,10000] [--pushes 5] [--idle 60]
        [--before REV] [--before-apps 10,1000] [--json]

For each size: a real Gitea whose code repository holds that many apps (each its
Dockerfile and its write-back file, seeded in one commit), the live control plane with
the site rendered for them and applied server-side (its Argo controller running, so that
a Workflow makes its first pod), the Argo Events controller and the event path it
deploys: JetStream (the EventBus's nats-server), the EventSource and the Sensor. The
push Workflows' step (``fabrique plan-push``) is played by ``tests/live/planner.py`` as
its pod would run it, reading the site from the files its pod mounts (JSON, one app a
line). Then, one after the other:

- **one app**, ``--pushes`` times: a ``git push`` of a commit touching one app's
  context, a different app each time;
- **no app**: a ``git push`` of a commit beside every app (``docs/``);
- **test delivery**: Gitea's "Test Delivery" of the webhook (the head commit, listed
  without its files);
- **replay**: the first push's delivery sent again, headers and body as they were, as
  Gitea's "Replay" of a delivery sends it: its push Workflow exists already.

For each: the push Workflows (control namespace) and the builds (build namespace)
created, apart, and their pods (a push Workflow's, played here; a build's first, made by
the Argo controller); the time from the push to the app's build Workflow; the time until
the Sensor has taken and acked the event; the CPU seconds the event path spent meanwhile
and its memory at the end (resident), the EventSource and the Sensors summed, the
EventBus's nats-server apart. Then the event path left idle for ``--idle`` seconds: its
CPU seconds and its memory at the end. Also: the Sensors and their pods, JetStream's
durable consumers, the Sensor's bytes and the ``SENSOR_OBJECT`` variable its pod was
given, the largest object rendered, and the time the event path took to be ready.

``--before REV`` runs commit ``REV``'s own ``bench/event_path_scale.py`` (its files from
``git archive``, run from there with this venv) at ``--before-apps`` and reads its
``--json``: what that script measured (one push of each kind; no idle minute, no bus, no
consumers, no push Workflows, which that design did not have) fills its rows, the rest
is left empty.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.event_loss_real import BenchError, live_event_path
from bench.object_sizes import documents, size
from fabrique.site.config import Site
from fabrique.site.files import site_files
from fabrique.site.names import LABEL_REVISION, PUSH_PREFIX
from tests.live import controlplane
from tests.live.cluster import ARGO, Cluster
from tests.live.events import CONTROL, ArgoEvents, ServiceProxy
from tests.live.forge import Forge
from tests.live.planner import Planner
from tests.waits import until

ROOT = Path(__file__).resolve().parent.parent
WAIT_SECONDS = 120.0  # a replay's trigger tries for about a minute: settle within two
POLL = 0.01
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SENSOR_PODS = "controller=sensor-controller"


@dataclass
class Scenario:
    name: str
    push_workflows: int | None  # push Workflows created (control namespace)
    builds: int  # build Workflows created of the pushed commit (build namespace)
    push_pods: int | None  # push Workflows' pods run
    build_pods: int  # pods created in the build namespace
    to_build: float | None  # seconds from the push to the app's build Workflow
    to_settled: float  # seconds from the push until the Sensor took and acked it
    cpu: float  # CPU seconds the EventSource and the Sensors spent meanwhile
    bus_cpu: float | None  # the EventBus's nats-server's
    rss_mib: float  # the EventSource's and the Sensors' resident memory at the end, summed
    bus_rss_mib: float | None


@dataclass
class Idle:
    seconds: float
    cpu: float  # CPU seconds the EventSource and the Sensors spent
    bus_cpu: float
    eventsource_rss_mib: float  # resident at its end
    sensors_rss_mib: float
    bus_rss_mib: float

    @property
    def all_rss_mib(self) -> float:
        return self.eventsource_rss_mib + self.sensors_rss_mib + self.bus_rss_mib


@dataclass
class Size:
    apps: int
    code: str  # "after", or "before <rev>"
    sensors: int
    sensor_pods: int | None
    consumers: int | None  # JetStream's durable consumers on the stream
    sensor_bytes: int  # the largest Sensor, compact JSON
    sensor_env_bytes: int | None  # its pod's SENSOR_OBJECT variable, as the pod has it
    largest: str  # the largest object rendered, Kind/name
    largest_bytes: int | None
    ready_seconds: float  # from the Argo Events controller's start to the Sensors listening
    idle: Idle | None = None
    scenarios: list[Scenario] = field(default_factory=list)

    def to_build(self) -> list[float]:
        return [s.to_build for s in self.scenarios if s.to_build is not None]


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


@dataclass(frozen=True)
class Usage:
    """The event path's CPU seconds so far and resident MiB now, by part."""

    eventsource: tuple[float, float]
    sensors: tuple[float, float]
    bus: tuple[float, float]

    @property
    def cpu(self) -> float:
        return self.eventsource[0] + self.sensors[0]

    @property
    def rss(self) -> float:
        return self.eventsource[1] + self.sensors[1]


def usage(events: ArgoEvents) -> Usage:
    parts: dict[str, tuple[float, float]] = {}
    for role, pod in events.pods.items():
        part = "sensors" if role.startswith("sensor") else role
        if part in ("eventsource", "sensors", "eventbus") and pod.process is not None:
            cpu, rss = _usage(pod.process.pid)
            had = parts.get(part, (0.0, 0.0))
            parts[part] = (had[0] + cpu, had[1] + rss)
    return Usage(parts["eventsource"], parts["sensors"], parts["eventbus"])


def write_site_files(site: Site, folder: Path) -> Path:
    """The site as a pod reads it (the files of its ConfigMaps); its ``site.yaml``."""
    folder.mkdir()
    for one in site_files(site):
        (folder / one.key).write_text(one.text)
    return folder / "site.yaml"


class ScaleBench:
    def __init__(self, work: Path, pushes: int, idle: float) -> None:
        self.work, self.pushes, self.idle = work, pushes, idle
        self.bearer = f"bench-{secrets.token_hex(16)}"
        self.proxy = ServiceProxy()

    def measure(self, apps: int) -> Size:
        work = self.work / f"apps-{apps}"
        work.mkdir()
        # the Argo controller runs: it makes each Workflow's first pod
        try:
            with live_event_path(work, self.proxy, self.bearer, apps, argo_controller=True) as path:
                forged = path.forged
                # the push Workflows' step, played as their pod would run it (kwok runs
                # no container), on the site's files as its pod mounts them
                values = write_site_files(path.site, work / "site")
                planner = Planner(path.cluster, CONTROL, values, forged.env, work).start()
                size = self.objects(apps, work / "tree", path.cluster, path.events)
                size.ready_seconds = path.ready_seconds
                run = Runner(forged, path.cluster, path.events, path.site, self.proxy, planner)
                names = [app.name for app in path.site.apps]
                for push in range(self.pushes):
                    app = names[push * len(names) // self.pushes]
                    size.scenarios.append(
                        run.scenario(
                            "one app",
                            lambda app=app, push=push: forged.push(
                                {f"apps/{app}/src.txt": f"change {push}\n"}, f"{app} {push}"
                            ),
                            expect_build=True,
                        )
                    )
                    if push == 0:
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
                size.idle = run.idle(self.idle)
                planner.stop()
                return size
        except (controlplane.ControlPlaneError, controlplane.peers.PeerError) as failed:
            raise BenchError(f"the live tier did not start: {failed}") from None

    @staticmethod
    def objects(apps: int, tree: Path, cluster: Cluster, events: ArgoEvents) -> Size:
        """The Sensors and their pods, the consumers, the objects' sizes: the rendered
        tree's, and the variable the Sensor's pod was given."""
        docs = {key: size(doc) for key, doc in documents(tree).items()}
        largest = max(docs, key=docs.__getitem__)
        sensors = [key for key in docs if key.startswith("Sensor/")]
        pods = cluster.items(f"/api/v1/namespaces/{CONTROL}/pods", SENSOR_PODS)
        env = [
            len(f"{e['name']}={e['value']}") + 1
            for pod in pods
            for c in pod["spec"]["containers"]
            for e in c.get("env") or []
            if e["name"] == "SENSOR_OBJECT"
        ]
        return Size(
            apps,
            "after",
            len(sensors),
            len(pods),
            len(events.consumers()),
            max(docs[key] for key in sensors),
            max(env),
            largest,
            docs[largest],
            0.0,
        )


class Runner:
    def __init__(
        self,
        forged: Forge,
        cluster: Cluster,
        events: ArgoEvents,
        site: Site,
        proxy: ServiceProxy,
        planner: Planner,
    ) -> None:
        self.forged, self.cluster, self.events, self.proxy = forged, cluster, events, proxy
        self.planner = planner
        self.build = site.namespaces.build
        self.last_sha = ""

    def build_pods(self) -> set[str]:
        return {
            p["metadata"]["name"]
            for p in self.cluster.items(f"/api/v1/namespaces/{self.build}/pods")
        }

    def builds(self, sha: str = "") -> set[str]:
        selector = f"{LABEL_REVISION}={sha[:12]}" if sha else ""
        return {
            w["metadata"]["name"]
            for w in self.cluster.items(f"{ARGO}/namespaces/{self.build}/workflows", selector)
        }

    def push_workflows(self) -> set[str]:
        return {
            w["metadata"]["name"]
            for w in self.cluster.items(f"{ARGO}/namespaces/{CONTROL}/workflows")
            if w["metadata"]["name"].startswith(PUSH_PREFIX)
        }

    def played(self, workflow: str) -> bool:
        return any(pod.startswith(f"{workflow}-") for pod in list(self.planner.played))

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
        expect_build: bool = False,
        of: str = "",
    ) -> Scenario:
        """Do ``act`` (it returns the commit concerned: ``of``, for a delivery of a commit
        pushed before), then wait for its build when one is expected, for the Sensor to
        have taken and acked it, for each push Workflow made to have run its pod and each
        build to have its first pod."""
        events = self.events
        last = events.stream_last()
        pushes, builds, pods = self.push_workflows(), self.builds(), self.build_pods()
        played = len(self.planner.played)
        before = usage(events)
        start = time.monotonic()
        sha = act()
        to_build = None
        deadline = start + WAIT_SECONDS

        def left() -> float:
            return max(deadline - time.monotonic(), 0.0)

        if expect_build:
            until(
                f"{name}: a build of {sha[:12]}",
                lambda: self.builds(sha),
                left(),
                every=POLL,
                error=BenchError,
            )
            to_build = round(time.monotonic() - start, 3)
        until(
            f"{name}: the Sensor to take and ack the event",
            lambda: events.stream_last() > last and events.settled(),
            left(),
            every=0.1,
            error=BenchError,
            detail=lambda: str(events.consumer_states()[:3]),
        )
        to_settled = round(time.monotonic() - start, 3)
        made = self.push_workflows() - pushes
        until(
            f"{name}: the pod of each of {len(made)} push Workflow(s) run",
            lambda: all(self.played(w) for w in made),
            left(),
            every=0.1,
            error=BenchError,
        )
        built = self.builds() - builds
        until(
            f"{name}: the Argo controller to make the first pod of each of {len(built)} build(s)",
            lambda: len(self.build_pods() - pods) >= len(built),
            left(),
            every=0.1,
            error=BenchError,
        )
        after = usage(events)
        if not of:
            self.last_sha = sha
        return Scenario(
            name,
            len(made),
            len(built),
            len(self.planner.played) - played,
            len(self.build_pods() - pods),
            to_build,
            to_settled,
            round(after.cpu - before.cpu, 2),
            round(after.bus[0] - before.bus[0], 2),
            round(after.rss, 1),
            round(after.bus[1], 1),
        )

    def idle(self, seconds: float) -> Idle:
        """The event path left alone for ``seconds``: what it spent, what it holds."""
        events, last = self.events, self.events.stream_last()
        before = usage(events)
        end = time.monotonic() + seconds

        def alive() -> None:
            for role, pod in events.pods.items():
                if (died := pod.died()) is not None:
                    raise BenchError(f"idle: the {role} process ended ({died})")

        # the window is the measurement: awaited on the clock, its processes checked once
        # a second, so that a process that dies ends it at once
        until(
            f"the idle window of {seconds:.0f} s to end",
            lambda: time.monotonic() >= end or None,
            seconds + 5,
            every=1.0,
            error=BenchError,
            alive=alive,
        )
        after = usage(events)
        if events.stream_last() != last:
            raise BenchError("idle: an event reached the bus in the idle window; not idle")
        return Idle(
            seconds,
            round(after.cpu - before.cpu, 2),
            round(after.bus[0] - before.bus[0], 2),
            round(after.eventsource[1], 1),
            round(after.sensors[1], 1),
            round(after.bus[1], 1),
        )


def before(rev: str, apps: list[int], work: Path) -> list[Size]:
    """Commit ``rev``'s own bench, its files from ``git archive``, run from there with
    this venv: what it measured, in this bench's terms."""
    checkout = work / f"before-{rev}"
    checkout.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise BenchError(f"git archive {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive.stdout, check=True)
    ran = subprocess.run(
        [sys.executable, "bench/event_path_scale.py", "--apps", ",".join(map(str, apps)), "--json"],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if ran.returncode != 0:
        raise BenchError(f"{rev}'s bench/event_path_scale.py exited {ran.returncode}")
    return [_old_size(rev, found) for found in json.loads(ran.stdout)]


def _old_size(rev: str, found: dict[str, Any]) -> Size:
    made = Size(
        found["apps"],
        f"before {rev}",
        found["sensors"],
        None,
        None,
        found["largest_sensor_bytes"],
        None,
        "",
        None,
        found["ready_seconds"],
    )
    for s in found["scenarios"]:
        # that design's triggers created the builds themselves: its Workflows are builds
        made.scenarios.append(
            Scenario(
                s["name"],
                None,
                s["workflows"],
                None,
                s["pods"],
                s["to_workflow"],
                s["to_settled"],
                round(s["sensors_cpu"] + s["eventsource_cpu"], 2),
                None,
                round(s["sensors_rss_mib"] + s["eventsource_rss_mib"], 1),
                None,
            )
        )
    return made


def _n(value: float | None, digits: int = 2) -> str:
    """A figure as printed: thousands spaced, nothing for a figure not measured."""
    if value is None:
        return ""
    return f"{value:,.{digits}f}".replace(",", " ")


def _counts(values: list[int | None]) -> str:
    known = sorted({v for v in values if v is not None})
    if not known:
        return ""
    return str(known[0]) if len(known) == 1 else f"{known[0]}\u2013{known[-1]}"


def tables(sizes: list[Size]) -> str:
    lines = [
        "| apps | code | Sensors | Sensor pods | consumers | Sensor (bytes) "
        "| SENSOR_OBJECT (bytes) | largest object (bytes) | ready (s) "
        "| idle: EventSource + Sensors CPU (s) | idle: bus CPU (s) | EventSource RSS (MiB) "
        "| Sensors RSS (MiB) | bus RSS (MiB) | all three RSS (MiB) | push → build p50 (s) "
        "| push → build max (s) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in sizes:
        idle, timed = s.idle, s.to_build()
        largest = f"{s.largest} ({_n(s.largest_bytes, 0)})" if s.largest else ""
        lines.append(
            f"| {_n(s.apps, 0)} | {s.code} | {s.sensors} | {_n(s.sensor_pods, 0)} "
            f"| {_n(s.consumers, 0)} | {_n(s.sensor_bytes, 0)} | {_n(s.sensor_env_bytes, 0)} "
            f"| {largest} | {s.ready_seconds} "
            f"| {_n(idle and idle.cpu)} | {_n(idle and idle.bus_cpu)} "
            f"| {_n(idle and idle.eventsource_rss_mib, 0)} "
            f"| {_n(idle and idle.sensors_rss_mib, 0)} | {_n(idle and idle.bus_rss_mib, 0)} "
            f"| {_n(idle and idle.all_rss_mib, 0)} "
            f"| {_n(statistics.median(timed)) if len(timed) > 1 else ''} "
            f"| {_n(max(timed)) if len(timed) > 1 else ''} |"
        )
    lines += [
        "",
        "| apps | code | push | push Workflows | builds | push pods | build pods "
        "| push → build (s) | push → settled (s) | EventSource + Sensors CPU (s) "
        "| bus CPU (s) | EventSource + Sensors RSS (MiB) | bus RSS (MiB) |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for s in sizes:
        kinds: dict[str, list[Scenario]] = {}
        for one in s.scenarios:
            kinds.setdefault(one.name, []).append(one)
        for name, runs in kinds.items():
            last = runs[-1]
            timed = [r.to_build for r in runs if r.to_build is not None]
            label = f"{name} (\u00d7{len(runs)})" if len(runs) > 1 else name

            def median(values: list[float]) -> str:
                return _n(statistics.median(values))

            def bus(values: list[float | None]) -> str:
                known = [v for v in values if v is not None]
                return median(known) if known else ""

            lines.append(
                f"| {_n(s.apps, 0)} | {s.code} | {label} "
                f"| {_counts([r.push_workflows for r in runs])} "
                f"| {_counts([r.builds for r in runs])} "
                f"| {_counts([r.push_pods for r in runs])} "
                f"| {_counts([r.build_pods for r in runs])} "
                f"| {median(timed) if timed else ''} | {median([r.to_settled for r in runs])} "
                f"| {median([r.cpu for r in runs])} | {bus([r.bus_cpu for r in runs])} "
                f"| {_n(last.rss_mib, 0)} | {_n(last.bus_rss_mib, 0)} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--apps", default="10,1000,10000", help="sizes, after the change")
    parser.add_argument("--pushes", type=int, default=5, help="one-app pushes per size")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds left idle")
    parser.add_argument("--before", default="", help="a commit to measure too, at --before-apps")
    parser.add_argument("--before-apps", default="10,1000")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.pushes < 1:
        parser.error("--pushes: at least 1")
    sizes = []
    try:
        for apps in (int(n) for n in args.apps.split(",") if n):
            # what the live tier says of its peers is progress: stdout is the figures'
            with (
                tempfile.TemporaryDirectory(prefix="fabrique-scale-") as work,
                redirect_stdout(sys.stderr),
            ):
                sizes.append(ScaleBench(Path(work), args.pushes, args.idle).measure(apps))
            print(f"measured {apps} apps", file=sys.stderr, flush=True)
        if args.before:
            with tempfile.TemporaryDirectory(prefix="fabrique-scale-before-") as work:
                old = [int(n) for n in args.before_apps.split(",") if n]
                sizes += before(args.before, old, Path(work))
    except BenchError as failed:
        print(f"event_path_scale: {failed}", file=sys.stderr)
        return 1
    print(json.dumps([asdict(s) for s in sizes]) if args.json else tables(sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
