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
    Workflow Succeeded, anything else              -> failed       (delete it to rebuild)
    no Workflow (an image under the tag or not)    -> submitted    (the Sensor's very
                                                                    Workflow; it verifies)

A failed Workflow is resubmitted once it is gone: deleted by an operator, or by its TTL
(``ttlStrategy.secondsAfterFailure`` of fabrique-build, 7 days): that is the back-off.
One app's failure does not stop the others; the pass exits non-zero only when a check
itself failed (Gitea, the registry or the Kubernetes API).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Literal

from fabrique.clients.kube import KubeClient, WorkflowState
from fabrique.clients.registry import RegistryClient
from fabrique.site.config import AppConfig, Site
from fabrique.site.errors import FabriqueError, ImageNotFound, RemoteError
from fabrique.site.names import short_sha, workflow_name

from .changes import fabrique_paths
from .holds import Hold, read_hold
from .targets import read_pin
from .workflow import build_workflow
from .writeback import Transport, desired_pin, write_back

log = logging.getLogger("fabrique.reconcile")

Action = Literal["ok", "held", "in-flight", "write-back", "failed", "submit"]
Mode = Literal["act", "dry-run", "status"]
DONE = {"write-back": "written-back", "submit": "submitted"}
# what `fabrique status` calls the state behind each action
STATUS = {
    "ok": "ok",
    "held": "held",
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
    return "write-back", f"{want} was verified ({facts.verified_digest}) but is not deployed"


class Reconciler:
    def __init__(
        self, site: Site, transport: Transport, registry: RegistryClient, kube: KubeClient
    ) -> None:
        self.site = site
        self.transport = transport
        self.registry = registry
        self.kube = kube

    def facts(self, app: AppConfig) -> Facts:
        site, transport = self.site, self.transport
        repo, branch = site.gitea.code_repo, site.gitea.branch
        want = transport.last_change(repo, branch, app.context, fabrique_paths(site))
        target = app.writeback
        snapshot = transport.read(target.repo, target.branch or branch, target.path)
        deployed = hold = None
        if snapshot.text is not None:
            hold = read_hold(snapshot.text, f"{target.repo}:{target.path}")
            probe = desired_pin(site, app, want or "0" * 40, "sha256:" + "0" * 64)
            deployed = read_pin(
                snapshot.text,
                target.kind,
                probe,
                where=f"{target.repo}:{target.path}",
                source_index=target.source_index,
            )
        deployed_revision = (
            transport.resolve(repo, branch, deployed.tag) if deployed and deployed.tag else None
        )
        current = (
            want is not None
            and deployed_revision is not None
            and (
                deployed_revision == want
                or transport.is_ancestor(repo, branch, want, deployed_revision)
            )
        )
        built = name = None
        state: WorkflowState | None = None
        held = False
        if want is not None and not current:
            built = self._digest(app.image, short_sha(want))
            name = workflow_name(app.name, want)
            state = self.kube.workflow(site.namespaces.build, name)
            if state is not None and state.verified_digest is not None:
                # re-verified here: the record must still name an image the registry holds
                held = self._digest(app.image, state.verified_digest) == state.verified_digest
        return Facts(
            app=app.name,
            want=want,
            deployed_revision=deployed_revision,
            deployed_tag=deployed.tag if deployed else None,
            deployed_digest=deployed.digest if deployed else None,
            deployed_is_current=bool(current),
            built_digest=built,
            workflow=name,
            phase=state.phase if state else None,
            workflow_revision=state.revision if state else None,
            verified_digest=state.verified_digest if state else None,
            verified_held=held,
            reason=state.reason if state else "",
            hold=hold,
        )

    def _digest(self, image: str, reference: str) -> str | None:
        try:
            return self.registry.manifest_digest(image, reference).digest
        except ImageNotFound:
            return None

    def one(self, app: AppConfig, mode: Mode) -> AppResult:
        """Gather, decide and (in ``act`` mode) do the one action for ``app``."""
        try:
            facts = self.facts(app)
            action, detail = decide(facts)
            if mode == "status":
                return AppResult(app.name, STATUS[action], detail, facts)
            if action not in DONE:
                return AppResult(app.name, action, detail, facts)
            if mode == "dry-run":
                return AppResult(app.name, f"would-{action}", detail, facts)
            return self._act(app, action, detail, facts)
        except FabriqueError as err:
            log.warning("%s: %s", app.name, err)
            transient = isinstance(err, RemoteError) and err.transient
            return AppResult(app.name, "error", str(err), transient=transient)

    def _act(self, app: AppConfig, action: Action, detail: str, facts: Facts) -> AppResult:
        assert facts.want is not None
        if action == "write-back":
            assert facts.verified_digest is not None and facts.verified_held
            outcome = write_back(
                self.site,
                self.transport,
                app.name,
                facts.want,
                facts.verified_digest,
                workflow="fabrique-reconcile",
            )
            if outcome.state in ("superseded", "held"):  # it moved since the facts were read
                return AppResult(app.name, outcome.state, outcome.detail, facts)
            return AppResult(app.name, DONE[action], f"{detail}; {outcome.state}", facts)
        body = build_workflow(self.site, app.name, facts.want, submitted_by="reconciler")
        created = self.kube.create_workflow(body)
        if not created.created:  # the Sensor got there first: same name, same build
            return AppResult(app.name, "in-flight", f"{created.name} already exists", facts)
        return AppResult(app.name, DONE[action], f"{detail}; created {created.name}", facts)

    def run(
        self, apps: Sequence[AppConfig], mode: Mode, *, concurrency: int | None = None
    ) -> list[AppResult]:
        workers = max(1, min(concurrency or self.site.reconcile.concurrency, len(apps)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile") as pool:
            return list(pool.map(lambda app: self.one(app, mode), apps))


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
    """An aligned table for people: app, state, want, deployed, built, workflow."""
    header = ("APP", "STATE", "WANT", "DEPLOYED", "BUILT", "WORKFLOW")
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
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]
    lines += [f"{r.app}: {r.detail}" for r in results if r.state in ("error", "failed", "held")]
    return lines
