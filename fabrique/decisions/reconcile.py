"""The safety net: every app converges on the image of the last commit that changed it.

For each app, four facts, read concurrently across apps:

- **want**: the newest commit on the branch that changed a file under the app's context
  (files fabrique writes itself do not count);
- **deployed**: the revision and digest in the write-back target;
- **in flight**: whether the Workflow ``fabrique-<app>-<sha12>`` exists, its phase, and
  the digest its verify-digest step recorded;
- **built**: what the registry holds under ``<image>:<sha12 of want>``, and whether it
  still holds the verified digest.

A tag is no proof: any build can push to the registry. The only digest that is ever
written back is the one a Succeeded Workflow of that very revision verified, and only
while the registry still holds it. Then exactly one action (``decide``, a pure function):

    the target carries a hold                      -> held         (nothing written, nothing
                                                                    submitted: fabrique
                                                                    release lets it go on)
    deployed == want (or newer)                    -> ok
    Workflow Pending or Running                    -> in-flight    (wait for it)
    Workflow Failed or Error                       -> failed       (with its reason; never
                                                                    written back, never
                                                                    resubmitted by a pass)
    Workflow Succeeded, verified digest held       -> written-back (that digest only)
      ... and the target is in a freeze window     -> frozen       (written by the first
                                                                    pass after it)
      ... a push's build, its push still writing   -> in-flight    (its push's Workflow
                                                                    writes it: maxWait and
                                                                    a margin after its end)
    Workflow Succeeded, anything else              -> failed       (delete it to rebuild)
    no Workflow (an image under the tag or not)    -> submitted    (the Sensor's very
                                                                    Workflow; it verifies)

A failed Workflow is resubmitted once it is gone: deleted by an operator, or by its TTL
(``ttlStrategy.secondsAfterFailure`` of fabrique-build, 7 days): that is the back-off.

The pass also reads the wanted commit's status ``fabrique/<app>`` in Gitea, and repairs
it when the build's own report was lost or the net did the write-back itself
(``status.repair``): for every app that is not current, and for a current app until its
success has been seen once for that want (the memory keeps it), so that a pass where
nothing changed asks Gitea nothing more. It then lists the build Workflows once and closes
the ``pending`` statuses that older commits' builds left when they ended without
reporting or were deleted (``Reconciler._sweep``); a pass over some apps (``--app``)
leaves what it remembers of the others as it was.
One app's failure does not stop the others; the pass exits non-zero only when a check
itself failed (Gitea, the registry or the Kubernetes API).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from fabrique.clients.gitea import CommitStatus, PullRequest
from fabrique.clients.kube import KubeClient, WorkflowState
from fabrique.clients.registry import RegistryClient
from fabrique.site.config import AppConfig, Site, seconds_of
from fabrique.site.errors import (
    FabriqueError,
    ImageNotFound,
    RemoteError,
)
from fabrique.site.names import (
    LABEL_MANAGED_BY,
    LABEL_PART_OF,
    LABEL_REVISION,
    short_sha,
    workflow_name,
)

from . import review
from .holds import Hold
from .memory import Memory, MemoryStore, NoMemory
from .signature import signature_gate
from .status import (
    PROPOSED,
    SAFETY_NET,
    Report,
    StatusReporter,
    repair,
    step_reason,
    verdict,
)
from .survey import PassTransport, Seen, survey
from .targets import target_pin
from .workflow import build_workflow
from .writeback import (
    Deploy,
    Transport,
    backoff_of,
    close_held_review,
    desired_pin,
    withdraw_later,
    write_back_many,
)

log = logging.getLogger("fabrique.reconcile")

Action = Literal[
    "ok", "held", "frozen", "in-review", "rejected", "in-flight", "write-back", "failed", "submit"
]
Mode = Literal["act", "dry-run", "status"]
DONE = {"write-back": "written-back", "submit": "submitted"}
# what `fabrique status` calls the state behind each action
STATUS = {
    "ok": "ok",
    "held": "held",
    "frozen": "frozen",
    "in-review": "in-review",
    "rejected": "rejected",
    "in-flight": "in-flight",
    "write-back": "built-not-deployed",
    "failed": "failed",
    "submit": "not-built",
}


@dataclass(frozen=True)
class Facts:
    app: str
    want: str | None
    deployed_revision: str | None  # None: nothing deployed, or a tag that is no commit
    deployed_tag: str | None
    deployed_digest: str | None
    deployed_is_current: bool  # deployed == want, or descends from it
    built_digest: str | None  # what <image>:<sha12> holds now: shown, never deployed as such
    workflow: str | None
    phase: str | None
    workflow_revision: str | None = None  # the revision the Workflow was given
    verified_digest: str | None = None  # what its verify-digest step recorded
    verified_held: bool = False  # the registry still holds <image>@<verified_digest>
    reason: str = ""  # why the Workflow failed, from its failed step
    hold: Hold | None = None  # an operator's hold on the target (fabrique hold, rollback)
    frozen: str = ""  # the freeze window its target is in, said (freeze[]): none, ""
    status: CommitStatus | None = None  # the wanted commit's fabrique/<app> status in Gitea
    status_known: bool = False  # False: not read (current and reported, no Gitea, a failure)
    review: str | None = None  # the pull request that proposes want (pull-request mode)
    review_number: int = 0
    review_closed: bool = False  # a person closed it unmerged
    review_push: bool = False  # it is its push's, shared with the push's other apps
    # the push's Workflow that writes this build with the push's others
    # (writeback.batch), while it may still be waiting: the pass leaves it the write
    grouped: str = ""


@dataclass(frozen=True)
class AppResult:
    app: str
    state: str  # ok | in-flight | written-back | submitted | failed | error (+ would-…)
    detail: str
    facts: Facts | None = None
    transient: bool = False  # for errors: a later pass may succeed

    def as_dict(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "state": self.state,
            "detail": self.detail,
            "facts": asdict(self.facts) if self.facts else None,
        }


def decide(facts: Facts) -> tuple[Action, str]:
    """The one action for an app, and why. Pure: the table in the module docstring."""
    if facts.hold is not None:
        return (
            "held",
            f"{facts.hold.describe()}; deploys {facts.deployed_tag or '-'}"
            f" (want {facts.want[:12] if facts.want else '-'}); nothing written until "
            "fabrique release",
        )
    if facts.want is None:
        return "ok", "no commit changes the app's context"
    want = facts.want[:12]
    if facts.deployed_is_current:
        return "ok", f"deploys {facts.deployed_tag} (want {want})"
    if facts.review is not None and facts.review_closed:
        return (
            "rejected",
            f"{want} was proposed in {facts.review}, closed unmerged; nothing built or "
            "written: a newer build proposes again (reopen the pull request to propose "
            "this one again)",
        )
    if facts.review is not None:
        return "in-review", f"{want} is proposed in {facts.review}; nothing to build or write"
    if facts.phase is None:
        if facts.built_digest is not None:
            return "submit", f"{want} has an image under its tag but no verified build"
        return "submit", f"{want} is not built"
    wf = facts.workflow
    if facts.phase in ("Pending", "Running"):
        return "in-flight", f"{wf} is {facts.phase}"
    if facts.phase in ("Failed", "Error"):
        why = f": {facts.reason}" if facts.reason else ""
        return (
            "failed",
            f"{wf} {facts.phase}{why}; nothing written back: fix the cause, then delete it "
            "to rebuild (its TTL deletes it after 7 days)",
        )
    if facts.phase != "Succeeded":
        return "failed", f"{wf} is in an unknown phase {facts.phase!r}"
    if facts.workflow_revision != facts.want:
        return (
            "failed",
            f"{wf} built revision {facts.workflow_revision!r}, not {facts.want}; "
            "delete it to rebuild",
        )
    if facts.verified_digest is None:
        return "failed", f"{wf} is Succeeded but recorded no verified digest; delete it to rebuild"
    if not facts.verified_held:
        return (
            "failed",
            f"{wf} verified {facts.verified_digest}, which the registry no longer holds; "
            "delete it to rebuild",
        )
    if facts.frozen:
        return (
            "frozen",
            f"{want} was verified ({facts.verified_digest}) but is not deployed: "
            f"{facts.frozen}; the first pass after the window writes it",
        )
    if facts.grouped:
        return (
            "in-flight",
            f"{want} was verified ({facts.verified_digest}); the push's Workflow "
            f"{facts.grouped} writes it with the push's other builds",
        )
    return "write-back", f"{want} was verified ({facts.verified_digest}) but is not deployed"


# beyond maxWait, what a push's write-back may take to write a build that has ended (its
# list of the builds once a second, a window, the commit): the pass leaves it that long
GROUP_MARGIN = timedelta(minutes=2)


class Reconciler:
    """One pass: survey Git for every app at once, ask the registry and the Kubernetes
    API about the apps that are not current, decide each app, then act: one commit per
    repository and branch for all the write-backs into it, one Workflow per app to build."""

    def __init__(
        self,
        site: Site,
        transport: Transport,
        registry: RegistryClient,
        kube: KubeClient,
        memory: MemoryStore | None = None,
        statuses: StatusReporter | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.site = site
        self.transport = transport
        self.registry = registry
        self.kube = kube
        self.memory = memory or NoMemory()
        self.statuses = statuses
        self.clock = clock
        # a push's freeze is every app's of its branch: asked once a pass per branch, not
        # once per app in review (each asking every app of the site)
        self._push_freeze = functools.lru_cache(maxsize=None)(
            lambda repo, base: review.push_freeze(site, repo, base)
        )

    def facts(self, app: AppConfig, seen: Seen, *, status: bool = True) -> Facts:
        """``seen`` (what Git says), completed by the registry and the Kubernetes API when
        the app is not current, and by the wanted commit's status in Gitea when it is not
        current or ``status`` says to read it."""
        site = self.site
        want, deployed = seen.want, seen.deployed
        built = name = None
        state: WorkflowState | None = None
        held = False
        proposed: tuple[str, int, bool, bool] | None = None
        # a held app is held whatever a pull request proposes (the pass closes it)
        if (
            want is not None
            and not seen.current
            and seen.hold is None
            and review.in_review(site, app)
        ):
            proposed = self._proposed(app, want)
        if want is not None and not seen.current and proposed is None:
            built = self._digest(app.image, short_sha(want))
            name = workflow_name(app.name, want)
            state = self.kube.workflow(site.namespaces.build, name)
            if state is not None and state.verified_digest is not None:
                # re-verified here: the record must still name an image the registry holds
                held = self._digest(app.image, state.verified_digest) == state.verified_digest
        frozen = site.frozen(app, None) if want is not None and not seen.current else None
        return Facts(
            app=app.name,
            want=want,
            deployed_revision=seen.deployed_revision,
            deployed_tag=deployed.tag if deployed else None,
            deployed_digest=deployed.digest if deployed else None,
            deployed_is_current=seen.current,
            built_digest=built,
            workflow=name,
            phase=state.phase if state else None,
            workflow_revision=state.revision if state else None,
            verified_digest=state.verified_digest if state else None,
            verified_held=held,
            reason=state.reason if state else "",
            hold=seen.hold,
            frozen=frozen.describe() if frozen is not None else "",
            review=proposed[0] if proposed else None,
            review_number=proposed[1] if proposed else 0,
            review_closed=proposed[2] if proposed else False,
            review_push=proposed[3] if proposed else False,
            grouped=self._grouped(state),
            **self._status(app, want, read=status or not seen.current),
        )

    def _grouped(self, state: WorkflowState | None) -> str:
        """The push's Workflow that writes ``state``'s build (``writeback.batch``) while it
        may still be waiting for the push's other builds: ``maxWait`` and a margin from
        the build's end. Past it, the pass writes it, as any build's."""
        if state is None or not state.group or state.phase != "Succeeded":
            return ""
        try:
            ended = datetime.fromisoformat(state.finished_at.replace("Z", "+00:00"))
        except ValueError:
            return ""  # not said: the pass writes it
        bound = timedelta(seconds=seconds_of(self.site.writeback.batch.max_wait)) + GROUP_MARGIN
        return state.group if self.clock() - ended < bound else ""

    def _tend_review(self, app: AppConfig, action: Action, facts: Facts) -> str:
        """In review: ask Gitea again to merge it (autoMerge), a schedule lost to a
        'try again later' included. Held (by a gesture or by hand): its open pull request
        (any) is closed, and so is each later environment's that proposes a digest it no
        longer deploys, as ``fabrique hold`` does (``withdraw_later``). What to add to the
        app's line; a Gitea that fails here fails no decision."""
        try:
            if action == "in-review" and not facts.review_closed:
                reviews = review.reviews_of(self.transport)
                target = app.writeback
                # no merge may fall into a freeze: a push's waits for any of its apps'
                frozen = (
                    self._push_freeze(target.repo, self.site.branch_of(target))
                    if facts.review_push
                    else self.site.frozen_soon(app, None)
                )
                merge = review.schedule_merge(
                    self.site,
                    reviews,
                    target.repo,
                    facts.review_number,
                    "",
                    backoff_of(self.site),
                    time.sleep,
                    attempts=1,  # a 'try again later' is the next pass's to ask
                    wait=frozen.describe() if frozen is not None else None,
                )
                return f"; {merge}" if merge else ""
            if action == "held" and facts.hold is not None:
                closed = close_held_review(self.site, self.transport, app.name, None, facts.hold)
                withdrawn = withdraw_later(
                    *(self.site, self.transport, app.name, None, facts.hold),
                    lambda: facts.deployed_digest,
                )
                own = "".join(f"; closed pull request #{n}" for n in closed)
                return own + "".join(f"; closed {env}'s pull request #{n}" for env, n in withdrawn)
        except FabriqueError as err:
            log.warning("%s: its pull request was not tended: %s", app.name, err)
        return ""

    def _proposed(self, app: AppConfig, want: str) -> tuple[str, int, bool, bool] | None:
        """The pull request that proposes ``want`` for ``app``, if any: its page, its
        number, whether a person closed it unmerged, and whether it is its push's."""
        reviews = review.reviews_of(self.transport)
        target = app.writeback
        base = self.site.branch_of(target)
        head = review.review_branch(self.site, app.name)
        probe = desired_pin(self.site, app, want, "sha256:" + "0" * 64)

        def proposes(pull: PullRequest | None, text: str | None, branch: str) -> bool:
            """Whether open ``pull``, whose branch holds ``text``, proposes ``want`` on
            the base's head."""
            there = None if text is None else target_pin(text, target, probe, where=branch)
            return (
                pull is not None
                and there is not None
                and there.tag == short_sha(want)
                and not review.left_behind(reviews, target.repo, pull)
            )

        found = review.find_proposal(reviews, self.transport, target, base, head)
        if found.pull is not None and proposes(found.pull, found.text, head):
            return found.pull.url, found.pull.number, False, False
        # proposed with the other apps of its push (its record names that pull request);
        # refused by a person, whatever the branch proposes since; else (made again on the
        # base's head when it left the proposal behind) proposed as any pin
        record = review.proposal_record(reviews, self.site, want, head)
        pull = review.recorded(reviews, target.repo, record)
        if (
            pull is not None
            and pull.state == "open"
            and review.is_group_branch(self.site, pull.head)
        ):
            text = self.transport.read(target.repo, pull.head, target.path).text
            if proposes(pull, text, pull.head):
                return pull.url, pull.number, False, True
        closed = review.refused(pull)
        return (closed.url, closed.number, True, False) if closed is not None else None

    def _status(self, app: AppConfig, want: str | None, *, read: bool) -> dict[str, Any]:
        """The wanted commit's status; a Gitea that fails here fails no decision."""
        if want is None or self.statuses is None or not read:
            return {}
        try:
            return {"status": self.statuses.current(app.name, want), "status_known": True}
        except RemoteError as err:
            log.warning("%s: the commit status of %s is unknown: %s", app.name, want[:12], err)
            return {}

    def _digest(self, image: str, reference: str) -> str | None:
        try:
            return self.registry.manifest_digest(image, reference).digest
        except ImageNotFound:
            return None

    def one(
        self, app: AppConfig, mode: Mode, seen: Seen | FabriqueError, *, status: bool = True
    ) -> AppResult | _Pending:
        """Gather and decide for ``app``: its result, or (in ``act`` mode) the action to do."""
        try:
            if isinstance(seen, FabriqueError):
                raise seen
            facts = self.facts(app, seen, status=status or mode == "status")
            action, detail = decide(facts)
            if mode == "status":
                return AppResult(app.name, STATUS[action], detail, facts)
            if mode == "act" and action in ("in-review", "held"):
                detail += self._tend_review(app, action, facts)
            if action not in DONE:
                return self._repair(AppResult(app.name, action, detail, facts), mode)
            if mode == "dry-run":
                return AppResult(app.name, f"would-{action}", detail, facts)
            return _Pending(app, action, detail, facts)
        except FabriqueError as err:
            return error_result(app.name, err)

    def _submit(self, todo: _Pending) -> AppResult:
        app, facts = todo.app, todo.facts
        assert facts.want is not None
        try:
            body = build_workflow(self.site, app.name, facts.want, submitted_by="reconciler")
            created = self.kube.create_workflow(body)
        except FabriqueError as err:
            return error_result(app.name, err)
        if not created.created:  # the Sensor got there first: same name, same build
            return AppResult(app.name, "in-flight", f"{created.name} already exists", facts)
        submitted = AppResult(
            app.name, DONE[todo.action], f"{todo.detail}; created {created.name}", facts
        )
        return self._repair(submitted, "act")

    def _write_back(self, transport: Transport, todos: Sequence[_Pending]) -> list[AppResult]:
        """The write-backs of one repository and branch, in one commit."""
        deploys = []
        for todo in todos:
            facts = todo.facts
            assert facts.want is not None
            assert facts.verified_digest is not None and facts.verified_held
            deploys.append(
                Deploy(todo.app.name, facts.want, facts.verified_digest, "fabrique-reconcile")
            )
        try:
            gate = signature_gate(self.site, self.registry)
            # one app's refusal (its deployed tag names no commit, its digest is unsigned)
            # is its result alone: the others of the repository are written
            outcomes = write_back_many(self.site, transport, deploys, gate=gate)
        except FabriqueError as err:
            return [error_result(todo.app.name, err) for todo in todos]
        results = []
        for todo, outcome in zip(todos, outcomes, strict=True):
            if isinstance(outcome, FabriqueError):
                results.append(error_result(todo.app.name, outcome))
                continue
            if outcome.state in ("held", "frozen"):  # since the facts were read
                results.append(AppResult(todo.app.name, outcome.state, outcome.detail, todo.facts))
                continue
            if outcome.state in ("superseded", "proposed", "in-review"):
                # superseded: it moved since the facts were read; the others: in review
                result = AppResult(todo.app.name, outcome.state, outcome.detail, todo.facts)
            else:
                detail = f"{todo.detail}; {outcome.state}"
                result = AppResult(todo.app.name, DONE[todo.action], detail, todo.facts)
            digest = todo.facts.verified_digest
            assert digest is not None
            results.append(self._repair(result, "act", (outcome.state, digest, outcome.commit)))
        return results

    def _repair(
        self, result: AppResult, mode: Mode, wrote: tuple[str, str, str | None] | None = None
    ) -> AppResult:
        """Post the wanted commit's status when the build's own report is missing or wrong;
        the result's facts then hold the status posted."""
        facts = result.facts
        if mode != "act" or self.statuses is None or facts is None or facts.want is None:
            return result
        if not facts.status_known:
            return result  # not read (or Gitea failed the read): a later pass repairs
        report = repair(
            result.state,
            facts.status,
            deployed_is_want=facts.deployed_revision == facts.want,
            deployed_digest=facts.deployed_digest,
            workflow=facts.workflow,
            phase=facts.phase,
            reason=facts.reason,
            wrote=wrote,
        )
        if report is None:
            return result
        url = facts.workflow if facts.phase else None
        posted = self.statuses.post(
            result.app, facts.want, report, workflow=url, known=True, current=facts.status
        )
        if posted != "posted":
            return result
        status = CommitStatus(
            facts.status.context if facts.status else "", report.state, report.description
        )
        return replace(
            result,
            detail=f"{result.detail}; status {report.state} posted",
            facts=replace(facts, status=status),
        )

    def run(
        self, apps: Sequence[AppConfig], mode: Mode, *, concurrency: int | None = None
    ) -> list[AppResult]:
        site = self.site
        workers = max(1, min(concurrency or site.reconcile.concurrency, len(apps)))
        transport = PassTransport(self.transport)
        text = self.memory.load()
        remembered = Memory.loads(text, site.gitea.code_repo, site.gitea.branch) if text else None
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile") as pool:
            try:
                seen, memory = survey(site, transport, apps, remembered, pool)
            except FabriqueError as err:
                return [error_result(app.name, err) for app in apps]
            # a current app's status is read until its success was seen for that want
            reported = remembered.reported if remembered else {}
            unreported = {
                app.name
                for app in apps
                if not isinstance(seen[app.name], Seen)
                or reported.get(app.name) != getattr(seen[app.name], "want", None)
            }
            decided = list(
                pool.map(
                    lambda app: self.one(app, mode, seen[app.name], status=app.name in unreported),
                    apps,
                )
            )
            results: dict[str, AppResult] = {r.app: r for r in decided if isinstance(r, AppResult)}
            pending = [r for r in decided if isinstance(r, _Pending)]
            # a repository and branch takes one commit, whatever the apps and files
            by_branch: dict[tuple[str, str], list[_Pending]] = {}
            for todo in pending:
                if todo.action == "write-back":
                    t = todo.app.writeback
                    by_branch.setdefault((t.repo, site.branch_of(t)), []).append(todo)
            submits = [todo for todo in pending if todo.action == "submit"]
            for group in pool.map(
                lambda todos: self._write_back(transport, todos), by_branch.values()
            ):
                results |= {r.app: r for r in group}
            results |= {r.app: r for r in pool.map(self._submit, submits)}
        # a pass over some apps (--app) leaves the others' memory as it was
        others = {app.name for app in site.apps} - {app.name for app in apps}
        memory.reported = {a: w for a, w in reported.items() if a in others} | _reported(
            reported, [results[app.name] for app in apps]
        )
        if mode == "act":
            self._sweep(apps, [results[app.name] for app in apps], remembered, memory)
        if mode == "act" and memory.dumps() != text:  # a pass that learnt nothing writes nothing
            self.memory.save(memory.dumps())
        return [results[app.name] for app in apps]

    def _sweep(
        self,
        apps: Sequence[AppConfig],
        results: Sequence[AppResult],
        remembered: Memory | None,
        memory: Memory,
    ) -> None:
        """Close the ``pending`` statuses the builds of older commits left behind.

        A Workflow terminated, cut by its deadline before its exit handler, or deleted
        while it ran never reports its end: its commit keeps ``pending`` for good. The
        per-app decisions repair the wanted commit only; this looks at every other build
        Workflow, in one LIST: one that ended Failed or Error is read once (the memory
        settles it), one the previous pass saw running and that is now gone from the LIST
        is read once. A ``pending`` found there becomes ``failure`` (a step failed) or
        ``error`` (anything else), with the reason; or ``success`` for one that is gone
        from the LIST only because it succeeded (a second LIST, of those alone, says so).
        A wanted commit's Workflow is settled only once its status was repaired. The
        memory of the apps outside this pass is left as it was. A Kubernetes API or Gitea
        that fails here only delays it to a later pass."""
        if self.statuses is None:
            return
        before = remembered or Memory("", "", "")
        memory.running, memory.settled = dict(before.running), list(before.settled)
        try:
            listed = self.kube.workflows(self.site.namespaces.build, SWEPT)
        except FabriqueError as err:
            log.warning("the build Workflows could not be listed: %s", err)
            return
        names = {app.name for app in apps}
        others = {app.name for app in self.site.apps} - names
        wanted = {(r.app, r.facts.want) for r in results if r.facts is not None}
        repaired = {(r.app, r.facts.want) for r in results if r.facts and _repaired(r.facts)}
        settled = set(before.settled)
        running = {n: entry for n, entry in before.running.items() if entry[0] in others}
        for state in listed:
            if state.app not in names or state.revision is None:
                continue
            key = (state.app, state.revision)
            if state.phase in ("Pending", "Running"):
                running[state.name] = key
            elif state.phase in ("Failed", "Error") and state.name not in settled:
                if key in wanted:  # the per-app repair deals with it, when it can
                    done = key in repaired
                else:
                    done = self._close(*key, state.name, _ended(state))
                if done:
                    settled.add(state.name)
        present = {state.name for state in listed}
        gone = {
            name: (app, revision)
            for name, (app, revision) in before.running.items()
            if name not in present and app in names and (app, revision) not in wanted
        }
        try:
            succeeded = self._succeeded({revision for _, revision in gone.values()})
        except FabriqueError as err:
            log.warning("the build Workflows that succeeded could not be listed: %s", err)
            running |= gone  # asked again by the next pass
            gone = {}
        for name, (app, revision) in gone.items():
            if name in succeeded:
                ended = _ended(succeeded[name])
            else:
                ended = Report("error", f"{SAFETY_NET}{name} was deleted before it ended")
            if not self._close(app, revision, name, ended):
                running[name] = (app, revision)  # asked again by the next pass
        memory.running = running
        memory.settled = sorted(settled & present)  # a Workflow gone is never listed again

    def _succeeded(self, revisions: set[str]) -> dict[str, WorkflowState]:
        """The Succeeded build Workflows of ``revisions``, by name: one LIST, none if none."""
        if not revisions:
            return {}
        shorts = ",".join(sorted({short_sha(revision) for revision in revisions}))
        selector = f"{SUCCEEDED},{LABEL_REVISION} in ({shorts})"
        listed = self.kube.workflows(self.site.namespaces.build, selector)
        return {state.name: state for state in listed if state.revision in revisions}

    def _close(self, app: str, revision: str, workflow: str, report: Report) -> bool:
        """Post ``report`` on ``revision`` if its status is still ``pending``; False when
        Gitea could not say or take it."""
        assert self.statuses is not None
        try:
            current = self.statuses.current(app, revision)
        except RemoteError as err:
            log.warning("%s: the commit status of %s is unknown: %s", app, revision[:12], err)
            return False
        if current is None or current.state != "pending":
            return True
        posted = self.statuses.post(
            app, revision, report, workflow=workflow, known=True, current=current
        )
        if posted == "not-posted":
            return False
        log.info("%s: %s on %s: status %s posted", app, workflow, revision[:12], report.state)
        return True


# The build Workflows the sweep lists: not the Succeeded ones (the controller's phase
# label), which reported themselves and are most of what a day of builds leaves, so the
# LIST a pass makes stays small. One that succeeded since the previous pass saw it running
# is absent: those alone are listed then (SUCCEEDED, by their revisions' labels), so that
# one whose report was lost is closed as the success it was, not as deleted.
PHASE_LABEL = "workflows.argoproj.io/phase"  # the controller's (common.LabelKeyPhase)
BUILDS = f"{LABEL_PART_OF}=fabrique,{LABEL_MANAGED_BY}=fabrique"
SWEPT = f"{BUILDS},{PHASE_LABEL}!=Succeeded"
SUCCEEDED = f"{BUILDS},{PHASE_LABEL}=Succeeded"


def _ended(state: WorkflowState) -> Report:
    """The status of a build that ended without reporting: ``success`` when it
    succeeded, ``failure`` when one of its steps failed for the commit's own sake,
    ``error`` otherwise (terminated, its deadline, its infrastructure), as the build
    would have said it."""
    if state.phase == "Succeeded":
        built = f"; built {state.verified_digest}" if state.verified_digest else ""
        return Report("success", f"{SAFETY_NET}{state.name} succeeded{built}")
    if not state.reason:  # no step failed: it was stopped or cut before any did
        return Report("error", f"{SAFETY_NET}{state.name} ended {state.phase}")
    reason = step_reason(state.reason)
    return Report(verdict(state.phase, reason), f"{SAFETY_NET}{reason}")


@dataclass(frozen=True)
class _Pending:
    """An action decided in ``act`` mode, done once every app is decided."""

    app: AppConfig
    action: Action
    detail: str
    facts: Facts


def _repaired(facts: Facts) -> bool:
    """Whether the wanted commit's status, read in this pass and repaired if it had to
    be, says its build ended: not ``pending``, not missing, not unread."""
    return facts.status_known and facts.status is not None and facts.status.state != "pending"


def _reported(before: dict[str, str], results: Sequence[AppResult]) -> dict[str, str]:
    """Apps whose wanted commit's status needs no more reading: it shows success (read or
    posted in this pass), or the deployed commit descends from it (nothing to post), or it
    was not read since a pass that found so for the same want."""
    reported = {}
    for result in results:
        facts = result.facts
        if facts is None or facts.want is None:
            continue
        if facts.status_known:
            status = facts.status
            # a success that says its digest waits in a pull request is read again, until
            # the pass that sees it merged says it deployed
            success = (
                status is not None
                and status.state == "success"
                and PROPOSED.search(status.description) is None
            )
            newer = result.state == "ok" and facts.deployed_revision != facts.want
            if success or newer:
                reported[result.app] = facts.want
        elif before.get(result.app) == facts.want:
            reported[result.app] = facts.want
    return reported


def error_result(app: str, err: FabriqueError) -> AppResult:
    """An app (or ``app/env``) whose check failed, logged; transient when a later pass
    may succeed."""
    log.warning("%s: %s", app, err)
    transient = isinstance(err, RemoteError) and err.transient
    return AppResult(app, "error", str(err), transient=transient)


# every state a pass gives an app; the reconcile CronWorkflow counts each one (a metric)
DECISIONS = (
    *("ok", "held", "frozen", "in-flight", "written-back", "superseded", "submitted"),
    *("failed", "error"),
    *("in-review", "proposed", "rejected"),  # an app written back through a pull request
    *("promoted", "waiting"),  # an environment's, with promote: auto
    # an environment's, after a deploy (gestures.verify); held is one of them too
    *("verifying", "verified", "rolled-back", "verify-failed"),
)


def decision_counts(results: Sequence[AppResult]) -> dict[str, int]:
    """How many apps got each decision of DECISIONS (dry-run's would-… are not counted)."""
    counts = dict.fromkeys(DECISIONS, 0)
    for result in results:
        if result.state in counts:
            counts[result.state] += 1
    return counts


def summary(results: Sequence[AppResult]) -> str:
    counts: dict[str, int] = {}
    for result in results:
        counts[result.state] = counts.get(result.state, 0) + 1
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"reconcile: {len(results)} app(s): {parts}"


def raise_for_errors(results: Sequence[AppResult]) -> None:
    errors = [r for r in results if r.state == "error"]
    if errors:
        transient = all(r.transient for r in errors)
        names = ", ".join(r.app for r in errors)
        raise RemoteError(
            f"{len(errors)} app(s) could not be checked: {names}", transient=transient
        )


def selected(site: Site, app: str | None) -> list[AppConfig]:
    return [site.app(app)] if app else list(site.apps)


def table(results: Sequence[AppResult], short: Callable[[str | None], str]) -> list[str]:
    """An aligned table for people: app, state, want, deployed, built, workflow, and the
    wanted commit's status in Gitea (``?`` when it could not be read)."""
    header = ("APP", "STATE", "WANT", "DEPLOYED", "BUILT", "WORKFLOW", "GITEA")
    rows = [header]
    for r in results:
        f = r.facts
        rows.append(
            (
                r.app,
                r.state,
                short(f.want) if f else "-",
                (f.deployed_tag or "-") if f else "-",
                short(f.verified_digest or f.built_digest) if f else "-",
                f"{f.workflow} ({f.phase})" if f and f.workflow and f.phase else "-",
                _status_cell(f),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]
    shown = ("error", "failed", "held", "in-review")  # why, or the pull request it waits on
    lines += [f"{r.app}: {r.detail}" for r in results if r.state in shown]
    return lines


def _status_cell(facts: Facts | None) -> str:
    if facts is None or facts.want is None:
        return "-"
    if not facts.status_known:
        return "?"
    return facts.status.state if facts.status else "none"
