"""Verification after a deploy, and what a failure does: ``fabrique verify`` and each pass.

One look at an environment (``verify_environment``): what its target deploys (the pin,
and the commit its tag names), the environment's Argo CD Application and the pods in
its namespace, read through the cluster's API, the ``verify.checks`` on the built
commit; ``decisions.verify.judge`` says ``pending``, ``success`` or ``failure``. The
verdict is the commit status ``fabrique/<app>/<env>/verified`` on the built commit
(``verifying in bench: sha256:…: what it waits for``, ``verified in bench: sha256:…``,
``failed in bench: sha256:…: why; what was done``): that status is the only memory. A
digest whose status is final is not looked at again, and the timeout counts from the
``pending`` status, posted once, at the first look.

A failure does what ``verify.onFailure`` says, after which its status is posted (so a
write that fails is tried again by the next look):

- ``rollback``: the newest commit of the app's context before the failed one whose
  digest was verified in that environment is written back, through the write-back's
  path (a direct commit even where the target takes pull requests: it is an emergency),
  with a hold that names the failure, in one commit; every later environment's pending
  proposal of the failed digest is withdrawn (``writeback.withdraw_later``). With none
  verified before, or a target already held (a person's hold, or a rollback's: a
  rollback is never rolled back), it holds instead;
- ``hold``: the environment is held where it is, the hold naming the failure;
- ``none``: only the status.

Rolled back or held, the digest is never written again by a replay or a pass until a
person runs ``fabrique release``; a newer build after that deploys as any.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from fabrique.clients.gitea import TooManyCommits
from fabrique.clients.kube import KubeClient
from fabrique.clients.registry import RegistryClient
from fabrique.decisions.holds import Hold, read_hold
from fabrique.decisions.reconcile import AppResult, error_result
from fabrique.decisions.status import Report, StatusReporter
from fabrique.decisions.verify import Judgement, Seen, containers_of, judge, parse_time
from fabrique.decisions.writeback import (
    Transport,
    deployed_revision,
    set_hold,
    target_where,
)
from fabrique.site.config import AppConfig, Environment, Site
from fabrique.site.errors import FabriqueError, NotPassed
from fabrique.site.freeze import parse_duration, parse_span
from fabrique.site.names import verified_context

from .promote import Candidate, Stage, deployed_in
from .rollback import roll_back

log = logging.getLogger("fabrique.verify")

VERIFIER = "fabrique verify"  # who holds, in the hold a failure writes
# the commits of the app's context read back for the last verified one
LOOK_BACK = 30
FINAL = ("success", "failure", "error")
# seconds between two looks of ``fabrique verify --wait``
VERIFY_EVERY = 5.0
# what a look says of a digest that failed there, what it did (would do, in a dry run)
FAILED_VERIFICATION = ("rolled-back", "roll-back", "held", "hold", "verify-failed")
# every state a look gives (a pass counts each: decisions.reconcile.DECISIONS)
STATES = ("verifying", "verified", "rolled-back", "held", "verify-failed")


def verify_environment(
    site: Site,
    transport: Transport,
    statuses: StatusReporter,
    registry: RegistryClient,
    kube: KubeClient,
    app: AppConfig,
    env: Environment,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    gate: Callable[[str, str], None] | None = None,
) -> AppResult | None:
    """Look once at ``env`` of ``app`` and say what was found, or None when its digest
    is judged already or it deploys nothing fabrique built. Results are ``<app>/<env>``:
    ``verifying``, ``verified``, ``rolled-back``, ``held``, ``verify-failed`` (and
    ``would-…`` in a dry run)."""
    name = f"{app.name}/{env.name}"
    try:
        candidate = deployed_in(site, transport, app, env)
    except NotPassed:
        return None  # nothing deployed, or nothing fabrique built: nothing to verify
    digest = candidate.pin.digest or ""
    context = verified_context(app.name, env.name)
    current = statuses.latest(candidate.revision, context)
    ours = current is not None and digest in current.description
    if ours and current is not None and current.state in FINAL:
        return None
    moment = now or datetime.now(UTC)
    started = (parse_time(current.created_at) if ours and current else None) or moment
    config = site.verify_of(app, env)
    found = judge(
        look(site, kube, statuses, app, env, candidate, started, config.checks),
        moment,
        timeout=parse_duration(config.timeout),
        soak=parse_span(config.soak),
    )
    said = f"{digest}: {found.reason}"
    if found.verdict == "pending":
        if not dry_run and not ours:
            statuses.post(app.name, candidate.revision, _report("pending", env, said), name=context)
        return AppResult(name, "verifying", said)
    if found.verdict == "success":
        if not dry_run:
            statuses.post(
                app.name, candidate.revision, _report("success", env, digest), name=context
            )
        return AppResult(name, "would-verify" if dry_run else "verified", said)
    return _failed(
        site, transport, statuses, registry, app, env, candidate, found, config.on_failure,
        dry_run=dry_run, gate=gate, now=moment,
    )  # fmt: skip


def _report(state: str, env: Environment, said: str) -> Report:
    words = {"pending": "verifying in", "success": "verified in", "failure": "failed in"}
    return Report(state, f"{words[state]} {env.name}: {said}")


def look(
    site: Site,
    kube: KubeClient,
    statuses: StatusReporter,
    app: AppConfig,
    env: Environment,
    candidate: Candidate,
    started: datetime,
    checks: list[str],
) -> Seen:
    """What ``env`` shows of ``candidate``: its Application, the pods of its namespace
    that run the app's image, the checks on the built commit."""
    namespace, application_name = env.application_ref(app.name)
    application = kube.application(namespace, application_name)
    if application is None:
        raise NotPassed(
            f"{env.name}: Application {namespace}/{application_name} not found: nothing "
            "deploys the environment to verify"
        )
    status = application.get("status") or {}
    health = status.get("health") or {}
    destination = ((application.get("spec") or {}).get("destination") or {}).get("namespace")
    # as the tree's RBAC names it (render.reconcile_unit): the config's, else Argo CD's
    configured = env.namespace or (app.application.namespace if app.application else None)
    runs_in = configured or destination or ""
    pods = kube.pods(runs_in) if runs_in else []
    repository = f"{site.registry.host}/{app.image}"
    return Seen(
        digest=candidate.pin.digest or "",
        written_at=started,
        sync=str((status.get("sync") or {}).get("status") or "Unknown"),
        health=str(health.get("status") or "Unknown"),
        health_message=str(health.get("message") or "")[:200],
        containers=containers_of(pods, repository),
        checks={
            check: (found.state if (found := statuses.latest(candidate.revision, check)) else "")
            for check in checks
        },
    )


def _failed(
    site: Site,
    transport: Transport,
    statuses: StatusReporter,
    registry: RegistryClient,
    app: AppConfig,
    env: Environment,
    candidate: Candidate,
    found: Judgement,
    on_failure: str | None,
    *,
    dry_run: bool,
    gate: Callable[[str, str], None] | None,
    now: datetime,
) -> AppResult:
    name, digest = f"{app.name}/{env.name}", candidate.pin.digest or ""
    said = f"{digest}: {found.reason}"
    hold = Hold(
        by=VERIFIER,
        at=now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        reason=f"{digest} failed verification in {env.name}: {found.reason}"[:200],
    )
    there = app.at(env)
    where = target_where(site, there)
    if on_failure == "none":
        done, state = "nothing done (onFailure: none)", "verify-failed"
    else:
        text = transport.read(
            there.writeback.repo, site.branch_of(there.writeback), there.writeback.path
        ).text
        held = read_hold(text, where, app.name) if text is not None else None
        back = None
        if on_failure == "rollback" and held is None:
            back = last_verified(site, statuses, app, env, candidate)
        if dry_run:
            what = f"roll back to {back[0][:12]}" if back else "hold"
            return AppResult(
                name, f"would-{'roll-back' if back else 'hold'}", f"{said}; would {what}"
            )
        if held is not None:
            done, state = f"already {held.describe()}: nothing rolled back", "held"
        elif back is not None:
            revision, previous = back
            outcome = roll_back(
                site, transport, registry, app.name, revision, hold,
                gate=gate, environment=env, digest=previous,
            )  # fmt: skip
            done = f"rolled back to {revision[:12]} ({previous})"
            if outcome.commit:
                done += f", commit {outcome.commit[:12]}"
            state = "rolled-back"
        else:
            why = "" if on_failure == "hold" else ": no digest verified there before"
            set_hold(site, transport, app.name, hold, by=VERIFIER, environment=env)
            done, state = f"held where it is{why}", "held"
    statuses.post(
        app.name, candidate.revision, _report("failure", env, f"{said}; {done}"),
        name=verified_context(app.name, env.name),
    )  # fmt: skip
    log.warning("%s: %s failed verification: %s; %s", name, digest, found.reason, done)
    return AppResult(name, state, f"{said}; {done}")


def last_verified(
    site: Site, statuses: StatusReporter, app: AppConfig, env: Environment, failed: Candidate
) -> tuple[str, str] | None:
    """The newest commit of the app's context before ``failed``'s whose digest was
    verified in ``env`` (its ``verified in <env>: sha256:…`` status), and that digest;
    None within the last ``LOOK_BACK`` commits."""
    context = verified_context(app.name, env.name)
    seen = 0
    try:
        for revision, _ in statuses.gitea.commits_touching(
            site.gitea.code_repo, app.context, start=failed.revision, max_pages=2
        ):
            if revision == failed.revision:
                continue
            seen += 1
            if seen > LOOK_BACK:
                return None
            status = statuses.latest(revision, context)
            if status is None or status.state != "success":
                continue
            digest = status.description.rpartition(": ")[2]
            if digest.startswith("sha256:") and digest != failed.pin.digest:
                return revision, digest
    except TooManyCommits:
        return None
    return None


def auto_verify(
    site: Site,
    transport: Transport,
    statuses: StatusReporter,
    registry: RegistryClient,
    kube: KubeClient,
    apps: list[AppConfig],
    *,
    dry_run: bool = False,
    gate: Callable[[str, str], None] | None = None,
) -> list[AppResult]:
    """The safety net's look at every environment of ``apps`` whose Argo CD runs in the
    cluster the pass runs in (``targets.<name>.inCluster``): one result each that is
    not judged yet, before the pass promotes anything."""
    results: list[AppResult] = []
    for app in apps:
        for env in app.environments:
            if not site.targets[env.target].in_cluster:
                continue
            try:
                found = verify_environment(
                    site, transport, statuses, registry, kube, app, env,
                    dry_run=dry_run, gate=gate,
                )  # fmt: skip
            except NotPassed as err:
                found = AppResult(f"{app.name}/{env.name}", "verifying", str(err))
            except FabriqueError as err:
                found = error_result(f"{app.name}/{env.name}", err)
            if found is not None:
                results.append(found)
    return results


# what ``fabrique status`` says of an environment's verification, by its status's state
SAID = {"pending": "verifying", "success": "verified", "failure": "failed", "error": "failed"}


def verification_of(
    site: Site, transport: Transport, statuses: StatusReporter, app: AppConfig, stage: Stage
) -> str | None:
    """How the digest ``stage`` deploys fares in its environment: ``verifying``,
    ``verified``, ``failed`` or ``not verified``; None when it deploys nothing fabrique
    built."""
    if not stage.tag or not stage.digest:
        return None
    revision = deployed_revision(transport, site.gitea.code_repo, site.gitea.branch, stage.tag)
    if revision is None:
        return None
    found = statuses.latest(revision, verified_context(app.name, stage.environment))
    if found is None or stage.digest not in found.description:
        return "not verified"
    return SAID.get(found.state, found.state)
