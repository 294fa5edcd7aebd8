"""``fabrique promote``: bench before prod, by the same digest.

The digest an environment gets is the one the environment before it deploys, read from
that environment's target in Git: never a rebuild, never a digest typed by hand. Before
anything is written it must have **passed** there: the environment's Argo CD
Application, read through the Kubernetes API of its cluster, is Synced and Healthy with
that digest among the images its pods run (``status.summary.images``, which Argo CD
fills from the live pods), each commit status the environment names (``checks``) is
``success`` on the built commit, and so is its verification there
(``fabrique/<app>/<env>/verified``, ``gestures.verify``): healthy at this moment is
not enough. Each refusal is one line naming what
is missing (``NotPassed``, exit 8), and nothing is written.

The image must say this factory built it from that commit (its labels, and with
attestations its provenance), as for a rollback: a pin in Git is no proof. Then the pin,
tag and digest, goes into the next environment's target through the write-back's own
path: a hold there stops it, an older digest never replaces a newer
one, the signature is checked where the site signs, one commit, a replay is
``unchanged``, a lost race is re-read. A promotion posts ``fabrique/<app>/<env>`` on the
built commit (once: a replay posts nothing new; a post Gitea refuses is logged, and the
replay posts it), through the reporter that read the checks. Through a pull request
(the environment's ``writeback.mode``) the pin is proposed, and ``promoted to <env>`` is
posted once the merge is seen: by a replay of ``promote`` (``unchanged``), or by the
first pass after it for a ``promote: auto`` environment.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from fabrique.clients.kube import KubeClient
from fabrique.clients.registry import RegistryClient
from fabrique.decisions import review
from fabrique.decisions.provenance import check_built_here
from fabrique.decisions.reconcile import AppResult, error_result
from fabrique.decisions.signature import signature_gate
from fabrique.decisions.status import Report, StatusReporter
from fabrique.decisions.targets import ImagePin
from fabrique.decisions.workflow import verify_workflow
from fabrique.decisions.writeback import (
    Outcome,
    Transport,
    deployed_pin,
    deployed_revision,
    desired_pin,
    target_where,
    write_back,
)
from fabrique.site.config import AppConfig, Environment, Site
from fabrique.site.errors import FabriqueError, InputError, NotPassed
from fabrique.site.names import verified_context

REVISION_PREFIX_RE = re.compile(r"[0-9a-f]{7,64}")


@dataclass(frozen=True)
class Candidate:
    """What an environment deploys: the pin, and the commit its tag names."""

    environment: str
    revision: str
    pin: ImagePin
    where: str


def status_context(app: str, env: str) -> str:
    """The commit status a promotion posts on the built commit."""
    return f"fabrique/{app}/{env}"


def promote_message(app: AppConfig, pin: ImagePin, revision: str, source: str, env: str) -> str:
    return (
        f"fabrique: promote {app.image} {pin.tag} for {app.name} to {env}\n\n"
        f"App: {app.name}\n"
        f"Image: {pin.new_name}:{pin.tag}\n"
        f"Digest: {pin.digest}\n"
        f"Source-Revision: {revision}\n"
        f"Promoted-From: {source}\n"
    )


def deployed_in(site: Site, transport: Transport, app: AppConfig, env: Environment) -> Candidate:
    """What ``env`` deploys now, from its target in Git; NotPassed when it deploys nothing
    a promotion may take (no file, no pin of the app, a tag alone, a tag naming no commit
    of the code repository)."""
    there = app.at(env)
    target = there.writeback
    where = target_where(site, there)
    snapshot = transport.read(target.repo, site.branch_of(target), target.path)
    if snapshot.text is None:
        raise NotPassed(f"{env.name}: {where} not found: it deploys nothing to promote")
    pin = deployed_pin(site, there, snapshot.text)
    if pin is None or not pin.digest:
        what = "no image of" if pin is None else "a tag alone, no digest, for"
        raise NotPassed(f"{env.name}: {where} deploys {what} {app.image}: nothing to promote")
    revision = deployed_revision(transport, site.gitea.code_repo, site.gitea.branch, pin.tag or "")
    if revision is None:
        raise NotPassed(
            f"{env.name}: {where} deploys tag {pin.tag!r}, which names no commit of "
            f"{site.gitea.code_repo}: only what fabrique built may be promoted"
        )
    return Candidate(env.name, revision, pin, where)


@dataclass(frozen=True)
class Stage:
    """What one environment deploys, per its target in Git (``fabrique status``)."""

    environment: str
    tag: str | None
    digest: str | None
    # the environment before deploys another commit: what promote would give this one
    waiting: str | None = None
    # its verification there (verifying, verified, failed, not verified), when asked
    verified: str | None = None


def stages(site: Site, transport: Transport, app: AppConfig) -> list[Stage]:
    """Each environment of ``app`` in order, what it deploys, and what waits for a
    promotion into it: one read of each target, nothing asked of any cluster."""
    found: list[Stage] = []
    for env in app.environments:
        there = app.at(env)
        target = there.writeback
        text = transport.read(target.repo, site.branch_of(target), target.path).text
        pin = deployed_pin(site, there, text) if text is not None else None
        tag, digest = (pin.tag, pin.digest) if pin is not None else (None, None)
        before = found[-1] if found else None
        waiting = (
            before.tag if before is not None and before.digest and before.digest != digest else None
        )
        found.append(Stage(env.name, tag, digest, waiting))
    return found


def stage_line(app: str, found: list[Stage], short: Callable[[str | None], str]) -> str:
    """``citation: bench 1a2b3c4d5e6f (sha256:…, verified), prod 0f0f… (sha256:…);
    waiting for promotion to prod: 1a2b3c4d5e6f``."""
    line = f"{app}: " + ", ".join(
        f"{s.environment} {s.tag or '-'} ({short(s.digest)}"
        + (f", {s.verified})" if s.verified else ")")
        for s in found
    )
    waiting = [f"{s.environment}: {s.waiting}" for s in found if s.waiting]
    return line + (f"; waiting for promotion to {', '.join(waiting)}" if waiting else "")


def check_passed(
    site: Site,
    kube: KubeClient,
    statuses: StatusReporter,
    app: AppConfig,
    env: Environment,
    candidate: Candidate,
) -> None:
    """NotPassed, naming what is missing, unless ``candidate`` passed in ``env``."""
    namespace, name = env.application_ref(app.name)
    context = site.targets[env.target].context
    application = f"{env.name}: Application {namespace}/{name} (context {context})"
    found = kube.application(namespace, name)
    if found is None:
        raise NotPassed(f"{application}: not found")
    status = found.get("status") or {}
    sync = (status.get("sync") or {}).get("status") or "Unknown"
    health = (status.get("health") or {}).get("status") or "Unknown"
    if sync != "Synced":
        raise NotPassed(f"{application} is {sync}, not Synced")
    if health != "Healthy":
        raise NotPassed(f"{application} is {health}, not Healthy")
    digest = candidate.pin.digest or ""
    images = [str(i) for i in (status.get("summary") or {}).get("images") or []]
    if not any(image.endswith(f"@{digest}") for image in images):
        running = ", ".join(images) or "none"
        raise NotPassed(
            f"{application} runs no pod of {candidate.pin.reference} (its pods' images: {running})"
        )
    on = f"{site.gitea.code_repo}@{candidate.revision[:12]}"
    for check in env.checks:
        got = statuses.latest(candidate.revision, check)
        if got is None:
            raise NotPassed(f"{env.name}: commit status {check} on {on}: none posted")
        if got.state != "success":
            raise NotPassed(f"{env.name}: commit status {check} on {on} is {got.state}")
    # healthy now is not enough: verified there, after its deploy (gestures.verify)
    context = verified_context(app.name, env.name)
    verified = statuses.latest(candidate.revision, context)
    if verified is None or verified.state != "success" or digest not in verified.description:
        said = "none posted" if verified is None else f"{verified.state}: {verified.description}"
        raise NotPassed(
            f"{env.name}: {digest} is not verified there ({context} on {on}: {said}); "
            f"fabrique verify --app {app.name} --env {env.name} looks"
        )


def promote(
    site: Site,
    transport: Transport,
    statuses: StatusReporter,
    registry: RegistryClient,
    kube_for: Callable[[str], KubeClient],
    app_name: str,
    to: str,
    *,
    revision: str | None = None,
    dry_run: bool = False,
    gate: Callable[[str, str], None] | None = None,
) -> Outcome:
    """Write into environment ``to`` the digest that passed in the one before it."""
    app = site.app(app_name)
    env, source = app.environment(to)
    if source is None:
        raise InputError(
            f"--to {to}: the first environment of {app.name}; the build writes it, "
            "promote writes the ones after it"
        )
    if revision is not None and not REVISION_PREFIX_RE.fullmatch(revision):
        raise InputError(
            f"--revision {revision[:80]!r}: must be a commit id (7 to 64 lowercase hex)"
        )
    candidate = deployed_in(site, transport, app, source)
    if revision is not None and not candidate.revision.startswith(revision):
        raise NotPassed(
            f"--revision {revision}: {source.name} deploys {candidate.revision[:12]} "
            f"({candidate.pin.digest}), not {revision}: only what runs there may be promoted"
        )
    digest = candidate.pin.digest or ""
    # a pin in Git is no proof: the image must say this factory built it from that commit
    check_built_here(site, registry, app, candidate.revision, digest)
    check_passed(site, kube_for(source.target), statuses, app, source, candidate)
    outcome = write_back(
        *(site, transport, app.name, candidate.revision, digest),
        environment=env,
        message=promote_message(app, candidate.pin, candidate.revision, source.name, env.name),
        dry_run=dry_run,
        gate=gate,
    )
    if not dry_run and outcome.state in ("changed", "unchanged"):
        # once: the pages read for the checks say whether it is already there
        statuses.post(
            app.name,
            candidate.revision,
            Report("success", f"promoted to {env.name}: {digest}"),
            name=status_context(app.name, env.name),
        )
    return outcome


def look_after(
    site: Site,
    kube_for: Callable[[str], KubeClient],
    app: AppConfig,
    env: Environment,
    outcome: Outcome,
) -> str | None:
    """After a promotion wrote a new digest into ``env`` whose Argo CD runs in fabrique's
    cluster, the Workflow that looks at it until its verdict (``fabrique-verify``): what
    to say of it; None when there is none to start. A Workflow of that digest there
    already is the same look; one that cannot be created is said, and the next pass
    looks instead (it never undoes the promotion)."""
    if outcome.state != "changed" or not site.targets[env.target].in_cluster:
        return None
    body = verify_workflow(site, app.name, env.name, outcome.pin.digest or "")
    where = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
    try:
        created = kube_for(env.target).create_workflow(body)
    except FabriqueError as err:
        return f"not verifying in {env.name} now: {err}; the next reconcile pass looks"
    return f"verifying in {env.name}: Workflow {where}" + ("" if created.created else " (already)")


# what a pass says of an environment it promotes into (``promote: auto``), by outcome
PASS_STATES = {
    "changed": "promoted",
    "would-change": "would-promote",
    "unchanged": "ok",
    "held": "held",
    "frozen": "frozen",
    "superseded": "superseded",
    "proposed": "proposed",  # the environment's target takes pins through pull requests
    "in-review": "in-review",
    "rejected": "rejected",
}


def auto_promote(
    site: Site,
    transport: Transport,
    statuses: StatusReporter,
    registry: RegistryClient,
    kube: KubeClient,
    apps: list[AppConfig],
    *,
    dry_run: bool = False,
) -> list[AppResult]:
    """The safety net's promotions: into each ``promote: auto`` environment whose
    previous one deploys another digest, what passed there, checked and written as
    ``fabrique promote`` does. One result per such environment, ``<app>/<env>``:
    ``promoted`` (``would-promote``), ``waiting`` with what has not passed yet, ``held``,
    ``superseded``, ``proposed``/``in-review`` (through a pull request), or ``error``. An
    environment that already deploys the digest before it asks nothing of any cluster;
    one whose target takes pins through pull requests gets ``promoted to <env>`` posted
    once its proposal merged (``promoted`` that pass, then no line). ``kube`` is the
    cluster the pass runs in, where the site says the previous environments' Argo CD is
    (``targets.<name>.inCluster``)."""
    results: list[AppResult] = []
    gate = None
    for app in apps:
        auto = app.auto_promotions()
        if not auto:
            continue
        try:
            found = {stage.environment: stage for stage in stages(site, transport, app)}
        except FabriqueError as err:
            results += [error_result(f"{app.name}/{env.name}", err) for env, _ in auto]
            continue
        for env, previous in auto:
            name, waiting = f"{app.name}/{env.name}", found[env.name].waiting
            if waiting is None:  # deploys what the one before does (or that one nothing)
                if not dry_run and review.in_review(site, app.at(env)):
                    merged = _merged(site, transport, statuses, app, env, previous, found)
                    results += [merged] if merged is not None else []
                continue
            try:
                if gate is None:
                    gate = signature_gate(site, registry)
                outcome = promote(
                    *(site, transport, statuses, registry, lambda _target: kube),
                    *(app.name, env.name),
                    dry_run=dry_run,
                    gate=gate,
                )
            except NotPassed as err:
                results.append(AppResult(name, "waiting", f"{waiting} from {previous.name}: {err}"))
                continue
            except FabriqueError as err:
                results.append(error_result(name, err))
                continue
            state = PASS_STATES[outcome.state]
            detail = f"{outcome.pin.reference} from {previous.name} -> {outcome.where}"
            if outcome.commit:
                detail += f" (commit {outcome.commit})"
            elif outcome.detail:
                detail = f"{outcome.detail}; nothing written to {outcome.where}"
            looking = None if dry_run else look_after(site, lambda _: kube, app, env, outcome)
            if looking:
                detail += f"; {looking}"
            results.append(AppResult(name, state, detail))
    return results


def _merged(
    site: Site,
    transport: Transport,
    statuses: StatusReporter,
    app: AppConfig,
    env: Environment,
    previous: Environment,
    found: dict[str, Stage],
) -> AppResult | None:
    """``env``, whose target takes pins through pull requests, deploys what ``previous``
    does: its proposal merged. Post ``promoted to <env>`` on the built commit, as a
    promotion written at once does, unless it is there already (one read of the commit's
    statuses, kept for the pass); the pass's line when it is posted now."""
    stage, name = found[env.name], f"{app.name}/{env.name}"
    if not stage.digest or not stage.tag:
        return None
    try:
        revision = deployed_revision(transport, site.gitea.code_repo, site.gitea.branch, stage.tag)
    except FabriqueError as err:
        return error_result(name, err)
    if revision is None:
        return None  # a tag that names no commit: never a promotion's
    report = Report("success", f"promoted to {env.name}: {stage.digest}")
    posted = statuses.post(app.name, revision, report, name=status_context(app.name, env.name))
    if posted != "posted":
        return None  # there already, or Gitea failed (logged: the next pass posts it)
    pin = desired_pin(site, app, revision, stage.digest)
    where = target_where(site, app.at(env))
    return AppResult(
        name,
        "promoted",
        f"{pin.reference} from {previous.name} -> {where} (its pull request merged)",
    )
