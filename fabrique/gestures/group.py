"""The write-back of a push's builds that meet: one commit per repository and branch.

A push that touches several apps writing into one repository and branch (a shared folder
of a monorepo) asks for their builds with its own Workflow's name (``writeback.batch``,
``decisions.push.meeting``): each such build verifies its digest and writes nothing. The
push's Workflow then runs ``fabrique writeback-group --push <its name>``, this module: it
watches those builds, and once every one has ended it writes the digests of those that
built, one commit per repository and branch (``write_back_many``: every per-app guard
holds), and posts each app's status as the build's own ``main`` would have. A build that
failed is left out and said (its own exit handler reported it); the others land.

How long it waits: until every build of the push has ended, and never more than
``maxWait`` after the first ended. Then what has ended is written, and the builds still
running land together, ``window`` after the last of them ended unless another ends
meanwhile. Past the builds' own deadline nothing is left to wait for: what still runs
is the safety net's to write (it reads each build's verified digest, as it always has).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fabrique.clients.kube import WorkflowState
from fabrique.decisions.status import Report, StatusReporter, written
from fabrique.decisions.writeback import Deploy, Outcome, Transport, write_back_many
from fabrique.site.config import AppConfig, Environment, Site, seconds_of
from fabrique.site.errors import FabriqueError
from fabrique.site.names import LABEL_PUSH

log = logging.getLogger("fabrique.group")

ENDED = frozenset({"Succeeded", "Failed", "Error"})
POLL_SECONDS = 1.0  # a list of the push's builds, by label, from the API server
# beyond the builds' own deadline, what a build's end may take to show
MARGIN_SECONDS = 120


class Lister(Protocol):
    def workflows(self, namespace: str, selector: str) -> list[WorkflowState]: ...


@dataclass(frozen=True)
class Landed:
    """What became of one build of the push: its write-back's outcome, its error, or
    why nothing of it was written (``left``)."""

    app: str
    build: str
    outcome: Outcome | FabriqueError | None = None
    left: str = ""
    looked: str | None = None  # the look started at what it wrote, said

    def line(self) -> str:
        if isinstance(self.outcome, Outcome):
            return self.outcome.line() + (f"; {self.looked}" if self.looked else "")
        if self.outcome is not None:
            return f"failed: {self.app}: {self.outcome}"
        return f"left out: {self.app}: {self.left}"


def wait_and_write(
    site: Site,
    kube: Lister,
    push: str,
    write: Callable[[Sequence[WorkflowState]], list[Landed]],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[Landed], list[str]]:
    """Watch the builds of ``push`` and hand each batch that is due to ``write``: what
    landed, and the builds still running when the wait ended (the safety net's)."""
    batch = site.writeback.batch
    window, max_wait = seconds_of(batch.window), seconds_of(batch.max_wait)
    bound = clock() + site.build.active_deadline_seconds + max_wait + MARGIN_SECONDS
    selector = f"{LABEL_PUSH}={push}"
    done: set[str] = set()
    landed: list[Landed] = []
    ended_at: dict[str, float] = {}
    first_end: float | None = None
    late = False  # maxWait passed: each later batch lands ``window`` after its last end
    while True:
        builds = kube.workflows(site.namespaces.build, selector)
        now = clock()
        ended = [b for b in builds if b.phase in ENDED and b.name not in done]
        running = [b.name for b in builds if b.phase not in ENDED]
        for b in ended:
            ended_at.setdefault(b.name, now)
        if ended:
            first_end = min(ended_at[b.name] for b in ended) if first_end is None else first_end
            last_end = max(ended_at[b.name] for b in ended)
            late = late or now - first_end >= max_wait
            if not running or (late and now - last_end >= window) or now >= bound:
                log.info(
                    "%s: writing %d build(s), %d still running", push, len(ended), len(running)
                )
                landed += write(ended)
                done |= {b.name for b in ended}
                first_end = None
        if not running:
            return landed, []
        if now >= bound:
            return landed, sorted(running)
        sleep(POLL_SECONDS)


def write_batch(
    site: Site,
    transport: Transport,
    statuses: StatusReporter | None,
    builds: Sequence[WorkflowState],
    *,
    gate: Callable[[str, str], None] | None = None,
    dry_run: bool = False,
    look: Callable[[AppConfig, Environment, Outcome], str | None] | None = None,
) -> list[Landed]:
    """The digests of ``builds`` that built, written one commit per repository and
    branch, each app's status posted as its build's ``main`` would have; the others
    said. ``look(app, env, outcome)`` starts the look at a first environment a new
    digest went into (``changed``) whose Argo CD runs in this cluster (the build's own
    ``verify-deploy`` when it writes alone), and says so."""
    first = {app.name: env for app, env in site.grouped_in_cluster()}
    landed: list[Landed] = []
    deploys: list[tuple[WorkflowState, Deploy]] = []
    for b in builds:
        app = b.app or "?"
        if b.phase != "Succeeded":
            why = f": {b.reason}" if b.reason else ""
            landed.append(Landed(app, b.name, left=f"build {b.name} {b.phase.lower()}{why}"))
        elif b.verified_digest is None or b.revision is None:
            landed.append(Landed(app, b.name, left=f"build {b.name} built nothing (no change)"))
        else:
            deploys.append((b, Deploy(app, b.revision, b.verified_digest, b.name)))
    results = write_back_many(site, transport, [d for _, d in deploys], gate=gate, dry_run=dry_run)
    for (b, d), result in zip(deploys, results, strict=True):
        looked = None
        if (
            look is not None
            and isinstance(result, Outcome)
            and result.state == "changed"
            and d.app in first
        ):
            looked = look(site.app(d.app), first[d.app], result)
        landed.append(Landed(d.app, b.name, result, looked=looked))
        if statuses is None or dry_run:
            continue
        if isinstance(result, Outcome):
            report = written(result.state, d.digest, result.commit)
        else:
            report = Report("failure", f"write-back: {result}")
        statuses.post(d.app, d.revision, report, workflow=b.name)
    return landed
