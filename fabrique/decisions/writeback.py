"""The write-back: a verified digest becomes a deployment, written into Git.

One pass reads the target file, writes the pin in (``targets``), and commits through a
transport: the Gitea Contents API (blob sha as the lease, 422 when someone wrote first)
or plain git (the branch tip as the lease, a rejected push when it moved). Losing the
race means re-read, re-apply, retry, a bounded number of times with jitter.

Four outcomes, and only four:

- ``changed``: a commit was made (its sha is reported);
- ``unchanged``: the target already says exactly this; no commit;
- ``superseded``: the target deploys a newer commit (the built one is neither the branch
  head nor a descendant of it); nothing is written, so a slow build of an old commit
  never rolls production back;
- ``held``: an operator holds the app (``fabrique hold``, ``fabrique rollback``; see
  ``holds``); nothing is written until ``fabrique release``.

Only the operator's ``fabrique rollback`` writes an older pin, and it records a hold in
the same commit.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from fabrique.clients.git import SIGNING_KEY_ENV, Author, GitRemote, ssh_signing_key
from fabrique.clients.gitea import (
    Commit,
    FileChange,
    FileContent,
    GiteaClient,
    Identity,
    PullRequest,
)
from fabrique.site.config import AppConfig, Environment, Site
from fabrique.site.errors import FabriqueError, ProvenanceError, StaleWrite, TargetError
from fabrique.site.freeze import Frozen
from fabrique.site.names import check_digest, check_revision, short_sha, workflow_name
from fabrique.site.retry import RetryPolicy

from . import review
from .holds import Hold, apply_hold, file_hold, read_hold, read_hold_own
from .targets import ImagePin, new_target, pin_target, target_pin

log = logging.getLogger("fabrique.writeback")

_T = TypeVar("_T")

State = Literal[
    "changed",
    "unchanged",
    "superseded",
    "held",
    "frozen",
    "would-change",
    "proposed",
    "in-review",
    "rejected",
]


@dataclass(frozen=True)
class Snapshot:
    """A file as read, with the lease a write must present (blob sha or branch tip)."""

    text: str | None  # None: the branch has no such file
    lease: object


class Transport(Protocol):
    """What the write-back needs from a Git host. ``repo`` is ``owner/name``."""

    def read(self, repo: str, branch: str, path: str) -> Snapshot: ...

    def write(
        self, repo: str, branch: str, path: str, text: str, snapshot: Snapshot, message: str
    ) -> str: ...

    def read_many(self, repo: str, branch: str, paths: Sequence[str]) -> dict[str, Snapshot]:
        """Several files of one branch, each with the lease its write presents."""
        ...

    def write_many(
        self, repo: str, branch: str, files: Sequence[tuple[str, str, Snapshot]], message: str
    ) -> str:
        """One commit in which each ``(path, text, snapshot)`` holds its text, leased on
        what each snapshot read; StaleWrite when someone wrote first."""
        ...

    def head(self, repo: str, branch: str) -> str: ...

    def resolve(self, repo: str, branch: str, ref: str) -> str | None: ...

    def is_ancestor(self, repo: str, branch: str, ancestor: str, descendant: str) -> bool: ...

    def files_changed(
        self, repo: str, branch: str, since: str, until: str, path: str
    ) -> list[str] | None: ...

    def last_change(
        self, repo: str, branch: str, path: str, ignore: frozenset[str]
    ) -> str | None: ...

    def commits_since(
        self, repo: str, branch: str, head: str, since: str
    ) -> list[Commit] | None: ...

    def propose(
        self,
        repo: str,
        base: str,
        head: str,
        files: Sequence[tuple[str, str, Snapshot]],
        message: str,
        head_tip: str | None,
    ) -> str:
        """One commit, on what the snapshots read of ``base``, in which each ``(path,
        text, snapshot)`` holds its text; branch ``head`` (at ``head_tip``, None: none
        yet) is forced to it, ``base`` left as it is."""
        ...


@dataclass(frozen=True)
class Outcome:
    state: State
    app: str
    where: str  # repo@branch:path
    pin: ImagePin
    commit: str | None = None
    detail: str = ""
    diff: str = ""

    def line(self) -> str:
        if self.state == "changed":
            return (
                f"changed: {self.app} {self.pin.reference} -> {self.where} (commit {self.commit})"
            )
        if self.state == "unchanged":
            return f"unchanged: {self.app} already deploys {self.pin.reference} ({self.where})"
        if self.state == "would-change":
            return f"would change: {self.app} {self.pin.reference} -> {self.where} (dry run)"
        if self.state == "proposed":
            return (
                f"proposed: {self.app} {self.pin.reference} -> {self.where} "
                f"(commit {self.commit}; {self.detail})"
            )
        if self.state == "in-review":
            return f"in review: {self.app} {self.pin.reference} is proposed in {self.detail}"
        if self.state == "rejected":
            return (
                f"rejected: {self.app} {self.pin.reference} was proposed in {self.detail}, "
                "closed unmerged; nothing written (a newer build proposes again; reopen the "
                "pull request to propose this one again)"
            )
        if self.state == "held":
            return (
                f"held: {self.app} is {self.detail}; nothing written to {self.where} "
                "(fabrique release lets it roll forward)"
            )
        if self.state == "frozen":
            return (
                f"frozen: {self.app} {self.pin.reference} not written to {self.where}: "
                f"{self.detail} (the first pass after the window writes it)"
            )
        return f"superseded: {self.app} {self.detail}; nothing written to {self.where}"


def desired_pin(site: Site, app: AppConfig, revision: str, digest: str) -> ImagePin:
    return ImagePin(
        image=app.image,
        new_name=f"{site.registry.host}/{app.image}",
        tag=short_sha(revision),
        digest=check_digest(digest),
    )


def deployed_pin(site: Site, app: AppConfig, text: str) -> ImagePin | None:
    """The pin of ``app``'s image that its target file ``text`` deploys now, if any."""
    target = app.writeback
    # only the image's name and registry path matter to the lookup, not tag or digest
    probe = desired_pin(site, app, "0" * 40, "sha256:" + "0" * 64)
    return target_pin(text, target, probe, where=f"{target.repo}:{target.path}")


def commit_message(app: AppConfig, pin: ImagePin, revision: str, workflow: str) -> str:
    return (
        f"fabrique: deploy {app.image} {pin.tag} for {app.name}\n\n"
        f"App: {app.name}\n"
        f"Image: {pin.new_name}:{pin.tag}\n"
        f"Digest: {pin.digest}\n"
        f"Source-Revision: {revision}\n"
        f"Workflow: {workflow}\n"
    )


def rollback_message(app: AppConfig, pin: ImagePin, revision: str, hold: Hold) -> str:
    return (
        f"fabrique: roll {app.name} back to {app.image} {pin.tag}, and hold it\n\n"
        f"{hold.reason or 'No reason given.'}\n\n"
        f"App: {app.name}\n"
        f"Image: {pin.new_name}:{pin.tag}\n"
        f"Digest: {pin.digest}\n"
        f"Source-Revision: {revision}\n"
        f"Held-By: {hold.by}\n"
    )


@dataclass(frozen=True)
class Written:
    """What ``commit_edit`` did: the commit made, or (dry run) the diff it would make."""

    commit: str | None
    diff: str = ""


def write_back(
    site: Site,
    transport: Transport,
    app_name: str,
    revision: str,
    digest: str,
    *,
    workflow: str | None = None,
    dry_run: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    rollback: Hold | None = None,
    gate: Callable[[str, str], None] | None = None,
    environment: Environment | None = None,
    message: str | None = None,
) -> Outcome:
    """Write ``digest`` of ``app`` built at ``revision`` into its target, once.

    While the target carries a hold, nothing is written (``held``). ``rollback`` is the
    operator's gesture: the pin is written whatever is deployed, with that hold, in one
    commit. With ``signing`` on, ``gate(image, digest)`` (``signature.signature_gate``)
    must accept the digest before anything is written. ``environment``: the target is
    that environment's (a promotion, whose ``message`` says so)."""
    app = site.app(app_name)
    if environment is not None:
        app = app.at(environment)
    check_revision(revision)
    pin = desired_pin(site, app, revision, digest)
    target = app.writeback
    where = target_where(site, app)
    if message is None:
        message = (
            commit_message(app, pin, revision, workflow or workflow_name(app.name, revision))
            if rollback is None
            else rollback_message(app, pin, revision, rollback)
        )
    if rollback is None:  # a rollback is written in a freeze: it undoes, it deploys nothing new
        frozen = site.frozen(app, environment)
        if frozen is not None:
            log.warning("%s: %s; not writing %s", where, frozen.describe(), pin.reference)
            return Outcome("frozen", app.name, where, pin, detail=frozen.describe())
    signed = signature_check(site, gate)

    def newer_than(built: str, tag: str) -> str | None:
        return _newer_deployed(site, transport, built, tag)

    def edit(old: str | None) -> str | Outcome:
        texts = {target.path: old}
        judged = _judge(site, app, revision, where, pin, texts, newer_than, signed, rollback)
        return judged if judged is not None else texts[target.path] or ""

    if rollback is None and review.in_review(site, app):
        return _propose(
            *(site, transport, app, review.review_branch(site, app.name, environment)),
            *(edit, pin, message),
            revision=revision,
            newer=lambda tag: _newer_deployed(site, transport, revision, tag),
            dry_run=dry_run,
            sleep=sleep,
            frozen=site.frozen_soon(app, environment),
        )
    if rollback is not None and not dry_run:
        # held from now: its pull request and Gitea's scheduled merge go first, so that
        # no merge lands after the hold; so do the later environments' of what it leaves
        close_held_review(site, transport, app_name, environment, rollback)
        withdraw_later(site, transport, app_name, environment, rollback, lambda: pin.digest)
    done = commit_edit(site, transport, app, edit, message, dry_run=dry_run, sleep=sleep)
    if isinstance(done, Outcome):
        return done
    if done.commit is None:
        return Outcome("would-change", app.name, where, pin, diff=done.diff)
    return Outcome("changed", app.name, where, pin, commit=done.commit)


@dataclass(frozen=True)
class Deploy:
    """One app's verified digest, built at ``revision``, to write into its target."""

    app: str
    revision: str
    digest: str
    workflow: str | None = None


def write_back_many(
    site: Site,
    transport: Transport,
    deploys: Sequence[Deploy],
    *,
    dry_run: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    gate: Callable[[str, str], None] | None = None,
) -> list[Outcome | FabriqueError]:
    """Write the digests of several apps, one commit per repository and branch.

    Each app is judged as ``write_back`` judges it (``frozen``, ``held``, ``unchanged``,
    ``superseded``, or its pin applied), and the pins applied into the target files of
    one repository and branch make one commit, whose message names every app, image, tag
    and digest it writes. One app alone gets the very commit ``write_back`` makes. Apps
    written through pull requests, built at one revision (a push's), are proposed in one
    pull request per repository and branch (``_propose_group``); one alone, in its own,
    as ``write_back`` proposes it.
    The results follow ``deploys``: an app refused on its own (its deployed tag names no
    commit, its target cannot take the pin, its digest is unsigned) gets its error, and
    holds back no other."""
    apps = [site.app(d.app) for d in deploys]
    for d in deploys:
        check_revision(d.revision)
    outcomes: dict[int, Outcome | FabriqueError] = {}
    # commits: one per repository and branch; pull requests: one per push (revision) too
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i, app in enumerate(apps):
        proposed = deploys[i].revision if review.in_review(site, app) else ""
        key = (app.writeback.repo, site.branch_of(app.writeback), proposed)
        groups.setdefault(key, []).append(i)
    for (repo, branch, proposed), members in groups.items():
        alone = len(members) == 1
        if alone and proposed and _in_push(site, transport, apps[members[0]], proposed, branch):
            alone = False  # its push's pull request holds it: made again, never a second
        if alone:
            outcomes[members[0]] = _alone(
                site, transport, deploys[members[0]], dry_run, sleep, gate
            )
            continue
        write = functools.partial(_propose_group, revision=proposed) if proposed else _write_group
        written = write(
            *(site, transport, repo, branch),
            [(apps[i], deploys[i]) for i in members],
            dry_run=dry_run,
            sleep=sleep,
            gate=gate,
        )
        outcomes |= dict(zip(members, written, strict=True))
    return [outcomes[i] for i in range(len(deploys))]


def _in_push(site: Site, transport: Transport, app: AppConfig, revision: str, base: str) -> bool:
    """Whether the pull request ``app``'s record names for ``revision`` is its push's,
    still open: proposing the app alone would open a second one beside it."""
    reviews = review.reviews_of(transport)
    record = review.proposal_record(reviews, site, revision, review.review_branch(site, app.name))
    pull = review.recorded(reviews, app.writeback.repo, record)
    return (
        pull is not None
        and pull.state == "open"
        and pull.head == review.group_branch(site, revision, base)
    )


def _alone(
    site: Site,
    transport: Transport,
    d: Deploy,
    dry_run: bool,
    sleep: Callable[[float], None],
    gate: Callable[[str, str], None] | None,
) -> Outcome | FabriqueError:
    try:
        return write_back(
            *(site, transport, d.app, d.revision, d.digest),
            workflow=d.workflow,
            dry_run=dry_run,
            sleep=sleep,
            gate=gate,
        )
    except (TargetError, ProvenanceError) as err:
        return err


class _Group:
    """The apps of one group (``members``, whose targets are files of ``repo@branch``),
    as each attempt reads and judges them."""

    def __init__(
        self,
        site: Site,
        transport: Transport,
        repo: str,
        branch: str,
        members: Sequence[tuple[AppConfig, Deploy]],
        gate: Callable[[str, str], None] | None,
    ) -> None:
        self.site, self.transport, self.repo, self.branch = site, transport, repo, branch
        self.members = members
        self.pins = [desired_pin(site, app, d.revision, d.digest) for app, d in members]
        self.wheres = [target_where(site, app) for app, _ in members]
        self.paths = list(dict.fromkeys(app.writeback.path for app, _ in members))
        # the apps whose first environment is in a freeze: judged once, before any read
        self.frozen = {app.name: f for app, _ in members if (f := site.frozen(app, None))}
        self.signed = signature_check(site, gate)

    def judge(
        self, refused: dict[str, str] | None = None
    ) -> tuple[dict[str, Snapshot], dict[str, str | None], list[Outcome | FabriqueError | None]]:
        """One attempt: the files read at once, their texts with every pin applied, and
        each app's outcome (None: its pin applied). ``refused``: the apps whose pin a
        person refused, with the pull request they closed."""
        site, transport = self.site, self.transport
        # asked once per attempt: a push's apps share their revision, and mostly what
        # they deploy; the branch head it may ask moves between attempts
        newer = functools.lru_cache(maxsize=None)(
            lambda revision, tag: _newer_deployed(site, transport, revision, tag)
        )
        snapshots = transport.read_many(self.repo, self.branch, self.paths)
        texts = {path: snapshots[path].text for path in self.paths}
        decided: list[Outcome | FabriqueError | None] = []
        for (app, d), where, pin in zip(self.members, self.wheres, self.pins, strict=True):
            if app.name in self.frozen:
                detail = self.frozen[app.name].describe()
                decided.append(Outcome("frozen", app.name, where, pin, detail=detail))
            elif refused and app.name in refused:
                closed = refused[app.name]
                log.warning("%s: %s was closed unmerged; not proposing it again", where, closed)
                decided.append(Outcome("rejected", app.name, where, pin, detail=closed))
            else:
                try:
                    decided.append(
                        _judge(site, app, d.revision, where, pin, texts, newer, self.signed)
                    )
                except (TargetError, ProvenanceError) as err:  # this app's alone
                    log.warning("%s", err)
                    decided.append(err)
        return snapshots, texts, decided

    def all_frozen(self) -> list[Outcome | FabriqueError]:
        """Every app in a freeze: said without a read."""
        return [
            Outcome("frozen", app.name, where, pin, detail=self.frozen[app.name].describe())
            for (app, _), where, pin in zip(self.members, self.wheres, self.pins, strict=True)
        ]

    def rest(
        self, decided: Sequence[Outcome | FabriqueError | None], state: State, **fields: str
    ) -> list[Outcome | FabriqueError]:
        """Each app's outcome: as decided, or ``state`` for the apps whose pin was applied."""
        return [
            o or Outcome(state, app.name, where, pin, **fields)
            for (app, _), where, pin, o in zip(
                self.members, self.wheres, self.pins, decided, strict=True
            )
        ]

    def written(
        self, decided: Sequence[Outcome | FabriqueError | None]
    ) -> list[tuple[AppConfig, ImagePin, Deploy]]:
        """The apps whose pin was applied, for the message."""
        return [
            (a, p, d)
            for (a, d), p, o in zip(self.members, self.pins, decided, strict=True)
            if o is None
        ]


def _write_group(
    site: Site,
    transport: Transport,
    repo: str,
    branch: str,
    members: Sequence[tuple[AppConfig, Deploy]],
    *,
    dry_run: bool,
    sleep: Callable[[float], None],
    gate: Callable[[str, str], None] | None,
) -> list[Outcome | FabriqueError]:
    """The pins of ``members``, whose targets are files of ``repo@branch``, in one
    commit; re-read, re-judged and retried whole when someone wrote first."""
    group = _Group(site, transport, repo, branch, members, gate)
    if len(group.frozen) == len(members):
        return group.all_frozen()
    where_all = f"{repo}@{branch}"
    for attempt in range(1, site.writeback.attempts + 1):
        snapshots, texts, decided = group.judge()
        changed = [p for p in group.paths if texts[p] != snapshots[p].text]
        if not changed:
            return [o for o in decided if o is not None]
        if dry_run:
            diff = "".join(diff_of(p, snapshots[p].text, texts[p] or "") for p in changed)
            return group.rest(decided, "would-change", diff=diff)
        message = group_message(group.written(decided), repo, changed)
        try:
            commit = transport.write_many(
                repo, branch, [(p, texts[p] or "", snapshots[p]) for p in changed], message
            )
        except StaleWrite as exc:
            lost_race(site, where_all, attempt, exc, sleep, f"{len(group.paths)} file(s)")
            continue
        log.info("%s: %s (commit %s)", where_all, message.splitlines()[0], commit)
        return group.rest(decided, "changed", commit=commit)
    raise AssertionError("unreachable")  # pragma: no cover


def _propose_group(
    site: Site,
    transport: Transport,
    repo: str,
    base: str,
    members: Sequence[tuple[AppConfig, Deploy]],
    *,
    revision: str,
    dry_run: bool,
    sleep: Callable[[float], None],
    gate: Callable[[str, str], None] | None,
) -> list[Outcome | FabriqueError]:
    """The pins of ``members``, apps of one push (built at ``revision``) whose targets
    are files of ``repo@base`` and take pull requests, proposed in one pull request from
    the push's branch (``review.group_branch``): one commit on the base's head, made
    again when the base leaves it behind. Each app is judged as ``_propose`` judges it
    (frozen, held: its own pull request closed, unchanged, superseded by what the base
    deploys, rejected: a person closed the pull request that proposed it); each app it
    proposes is recorded on the built commit under its own branch's context, so that
    the refusal, the safety net and a hold find it there."""
    reviews = review.reviews_of(transport)
    head = review.group_branch(site, revision, base)
    group = _Group(site, transport, repo, base, members, gate)
    if len(group.frozen) == len(members):
        return group.all_frozen()
    paths = group.paths
    soon = review.push_freeze(site, repo, base)
    wait = soon.describe() if soon is not None else None
    backoff = backoff_of(site)
    # a pin a person refused stays refused: each app's record, all read at once
    records = reviews.latest_statuses(site.gitea.code_repo, revision)
    own = {app.name: review.review_branch(site, app.name) for app, _ in members}
    seen: dict[str, PullRequest | None] = {}  # a push's apps share their pull request

    def refusal(app: AppConfig) -> PullRequest | None:
        record = records.get(review.record_context(own[app.name]))
        if record is None:
            return None
        if record.target_url not in seen:
            seen[record.target_url] = review.recorded(reviews, repo, record)
        return review.refused(seen[record.target_url])

    refused = {app.name: closed.url for app, _ in members if (closed := refusal(app))}
    closed_for: set[str] = set()  # the held apps whose pull requests were closed
    for attempt in range(1, site.writeback.attempts + 1):
        snapshots, texts, decided = group.judge(refused)
        for (app, _), o in zip(members, decided, strict=True):
            if dry_run or app.name in closed_for or not isinstance(o, Outcome):
                continue
            if o.state == "held":  # its pin is proposed nowhere, once per app
                _close_held(site, transport, app.name, None, o.detail)
                closed_for.add(app.name)
        changed = [p for p in paths if texts[p] != snapshots[p].text]
        if not changed:
            return [o for o in decided if o is not None]
        pull = reviews.open_pull(repo, base, head)
        tip = pull.head_sha if pull is not None else reviews.branch_tip(repo, head)
        proposed = transport.read_many(repo, head, paths) if pull is not None else {}
        if (
            pull is not None
            and all(proposed[p].text == texts[p] for p in paths)
            and not review.left_behind(reviews, repo, pull)
        ):  # a replay: this very proposal is there, on the base's head
            merge = "" if dry_run else review.schedule_merge(
                site, reviews, repo, pull.number, pull.head_sha, backoff, sleep, wait=wait
            )  # fmt: skip
            return group.rest(decided, "in-review", detail=_said(pull.url, merge))
        if dry_run:
            diff = "".join(diff_of(p, snapshots[p].text, texts[p] or "") for p in changed)
            return group.rest(decided, "would-change", diff=diff, detail=head)
        written = group.written(decided)
        message = group_message(written, repo, changed)
        files = [(p, texts[p] or "", snapshots[p]) for p in changed]
        try:
            commit = transport.propose(repo, base, head, files, message, tip)
        except StaleWrite as exc:
            lost_race(site, f"{repo}@{base}", attempt, exc, sleep, f"{len(paths)} file(s)")
            continue
        pull = review.open_or_update(reviews, site, repo, base, head, pull, message, revision)
        for app, _, _ in written:
            context = review.record_context(own[app.name])
            review.record_proposal(
                reviews, site, revision, own[app.name], pull, records.get(context)
            )
        merge = review.schedule_merge(
            site, reviews, repo, pull.number, commit, backoff, sleep, wait=wait
        )
        return group.rest(decided, "proposed", commit=commit, detail=_said(pull.url, merge))
    raise AssertionError("unreachable")  # pragma: no cover


def _judge(
    site: Site,
    app: AppConfig,
    revision: str,
    where: str,
    pin: ImagePin,
    texts: dict[str, str | None],
    newer: Callable[[str, str], str | None],
    signed: Callable[[AppConfig, ImagePin], None],
    rollback: Hold | None = None,
) -> Outcome | None:
    """One app's pin against its target's text in ``texts`` (None: no such file), as
    every write-back judges it (``held``, ``unchanged``, ``superseded``, the signature):
    its outcome, or None when the pin is applied to ``texts`` (edited in place).
    ``rollback``: the operator's gesture, written whatever is deployed or held, with
    that hold."""
    target = app.writeback
    text = texts[target.path]
    held = None
    if text is None:
        if not target.create:
            raise TargetError(
                f"{where}: file not found (set apps[].writeback.create: true to create it)"
            )
        old_text, deployed = "", None
        new_text = new_target(target.kind, pin, where=where)
    else:
        old_text = text
        held = read_hold(text, where, app.name)
        if held is not None and rollback is None:  # its own hold, or the file-wide one
            log.warning("%s: %s; not writing %s", where, held.describe(), pin.reference)
            return Outcome("held", app.name, where, pin, detail=held.describe())
        deployed = target_pin(text, target, pin, where=where)
        new_text = pin_target(text, target, pin, where=where)
    if rollback is not None and (new_text != old_text or held is None):
        # a replay of the same rollback keeps the hold it made: no commit
        new_text = apply_hold(new_text, rollback, where=where, app=app.name)
    if new_text == old_text:
        return Outcome("unchanged", app.name, where, pin)
    if rollback is None and deployed is not None and deployed.tag and deployed.tag != pin.tag:
        why = newer(revision, deployed.tag)
        if why:
            log.warning("%s: %s; not rolling back", where, why)
            return Outcome("superseded", app.name, where, pin, detail=why)
    signed(app, pin)
    texts[target.path] = new_text
    return None


def signature_check(
    site: Site, gate: Callable[[str, str], None] | None
) -> Callable[[AppConfig, ImagePin], None]:
    """Where the site signs, ``gate(image, digest)`` (``signature.signature_gate``) asked
    once per app before its pin is written; a caller that cannot check must not write."""
    checked: set[str] = set()

    def check(app: AppConfig, pin: ImagePin) -> None:
        if not site.signing.enabled or app.name in checked:
            return
        if gate is None:
            raise ProvenanceError(
                f"{target_where(site, app)}: signing is on, and this write-back has no "
                "signature check; nothing written"
            )
        gate(app.image, pin.digest or "")
        checked.add(app.name)

    return check


def group_message(
    written: Sequence[tuple[AppConfig, ImagePin, Deploy]], repo: str, paths: Sequence[str]
) -> str:
    """One commit's message for several apps: a subject that counts them, then each
    app's block (app, image and tag, digest, source revision, Workflow). One app alone
    gets ``write_back``'s own message."""
    blocks = [
        commit_message(a, p, d.revision, d.workflow or workflow_name(a.name, d.revision))
        for a, p, d in written
    ]
    if len(blocks) == 1:
        return blocks[0]
    names = [a.name for a, _, _ in written]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    into = paths[0] if len(paths) == 1 else f"{len(paths)} files of {repo}"
    subject = f"fabrique: deploy {len(names)} images into {into} ({shown})"
    return subject + "\n\n" + "\n".join(block.split("\n\n", 1)[1] for block in blocks)


def _propose(
    site: Site,
    transport: Transport,
    app: AppConfig,
    head: str,
    edit: Callable[[str | None], str | Outcome],
    pin: ImagePin,
    message: str,
    *,
    revision: str,
    newer: Callable[[str], str | None],
    dry_run: bool = False,
    sleep: Callable[[float], None],
    frozen: Frozen | None = None,
) -> Outcome:
    """Propose ``edit`` of the app's target in the pull request from ``head``, once.

    ``newer(tag)`` says why the pin ``tag`` a pull request proposes must not be replaced
    by this one (the never-roll-back guard), or None. ``frozen``: a freeze window opens
    before the next pass, and Gitea is asked to merge nothing on its own meanwhile."""
    wait = frozen.describe() if frozen is not None else None
    reviews = review.reviews_of(transport)
    target = app.writeback
    base = site.branch_of(target)
    where = target_where(site, app)
    backoff = backoff_of(site)

    def proposes(text: str | None) -> bool:
        """Whether ``text``, the target on the proposal branch, holds this very pin."""
        return text is not None and pin_target(text, target, pin, where=where) == text

    for attempt in range(1, site.writeback.attempts + 1):
        snapshot: Snapshot = transport.read(target.repo, base, target.path)
        edited = edit(snapshot.text)
        if not isinstance(edited, str):
            if edited.state == "held" and not dry_run:
                review.close_review(site, reviews, app.name, target.repo, base, head, edited.detail)
            return edited
        found = review.find_proposal(reviews, transport, target, base, head)
        pull = found.pull
        if (
            pull is not None
            and proposes(found.text)
            and not review.left_behind(reviews, target.repo, pull)
        ):
            merge = "" if dry_run else review.schedule_merge(
                site, reviews, target.repo, pull.number, pull.head_sha, backoff, sleep,
                wait=wait,
            )  # fmt: skip
            return Outcome("in-review", app.name, where, pin, detail=_said(pull.url, merge))
        # a pin a person refused stays refused, whatever the branch has proposed since
        record = review.proposal_record(reviews, site, revision, head)
        closed = review.rejection(reviews, target.repo, record)
        if closed is not None:
            log.warning("%s: %s was closed unmerged; not proposing it again", where, closed.url)
            return Outcome("rejected", app.name, where, pin, detail=closed.url)
        if pull is not None:
            proposed = found.pin(target, pin, where)
            later = newer(proposed.tag) if proposed and proposed.tag else None
            if later:
                log.warning("%s: pull request #%d proposes newer: %s", where, pull.number, later)
                detail = f"pull request #{pull.number} proposes newer ({later})"
                return Outcome("superseded", app.name, where, pin, detail=detail)
        if dry_run:
            diff = diff_of(target.path, snapshot.text, edited)
            return Outcome("would-change", app.name, where, pin, diff=diff, detail=head)
        try:
            commit = transport.propose(
                target.repo, base, head, [(target.path, edited, snapshot)], message, found.tip
            )
        except StaleWrite as exc:
            if attempt == site.writeback.attempts:
                raise StaleWrite(
                    f"{where}: still losing the write race after {attempt} attempt(s); "
                    "run the write-back again"
                ) from exc
            sleep(backoff.delay(attempt))
            continue
        pull = review.open_or_update(
            reviews, site, target.repo, base, head, pull, message, revision
        )
        review.record_proposal(reviews, site, revision, head, pull, record)
        merge = review.schedule_merge(
            site, reviews, target.repo, pull.number, commit, backoff, sleep, wait=wait
        )
        detail = _said(pull.url, merge)
        return Outcome("proposed", app.name, where, pin, commit=commit, detail=detail)
    raise AssertionError("unreachable")  # pragma: no cover


def _said(first: str, then: str) -> str:
    return f"{first}, {then}" if then else first


def target_where(site: Site, app: AppConfig) -> str:
    target = app.writeback
    return f"{target.repo}@{site.branch_of(target)}:{target.path}"


def backoff_of(site: Site) -> RetryPolicy:
    """The pauses between attempts of a write lost to another writer."""
    return dataclasses.replace(site.network.retry_policy(), attempts=site.writeback.attempts)


def diff_of(path: str, old: str | None, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


def lost_race(
    site: Site,
    where: str,
    attempt: int,
    lost: StaleWrite,
    sleep: Callable[[float], None],
    what: str = "",
) -> None:
    """After a write lost to another writer: past the last attempt, say so (StaleWrite);
    otherwise pause (jittered, growing) before the caller reads ``what`` again."""
    if attempt == site.writeback.attempts:
        raise StaleWrite(
            f"{where}: still losing the write race after {attempt} attempt(s); "
            "run the write-back again"
        ) from lost
    delay = backoff_of(site).delay(attempt)
    log.info(
        "%s: someone wrote first; re-reading%s (attempt %d, %.2fs)",
        *(where, f" {what}" if what else "", attempt + 1, delay),
    )
    sleep(delay)


def commit_edit(
    site: Site,
    transport: Transport,
    app: AppConfig,
    edit: Callable[[str | None], str | _T],
    message: str | Callable[[], str],
    *,
    dry_run: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> _T | Written:
    """Read the app's target, ``edit`` it, and commit the result leased on what was read.

    Losing the race (422, a rejected push) means re-read, re-edit, retry, a bounded
    number of times with jitter. ``edit`` may end it with an Outcome of its own."""
    target = app.writeback
    branch = site.branch_of(target)
    where = target_where(site, app)
    for attempt in range(1, site.writeback.attempts + 1):
        snapshot = transport.read(target.repo, branch, target.path)
        edited = edit(snapshot.text)
        if not isinstance(edited, str):
            return edited
        if dry_run:
            return Written(None, diff_of(target.path, snapshot.text, edited))
        # a message may depend on what the edit wrote (several apps: those it wrote)
        text = message if isinstance(message, str) else message()
        try:
            commit = transport.write(target.repo, branch, target.path, edited, snapshot, text)
        except StaleWrite as exc:
            lost_race(site, where, attempt, exc, sleep)
            continue
        log.info("%s: %s (commit %s)", where, text.splitlines()[0], commit)
        return Written(commit)
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class HoldOutcome:
    """What ``set_hold`` did: ``changed``, ``unchanged`` or ``would-change``."""

    state: Literal["changed", "unchanged", "would-change"]
    app: str
    where: str
    hold: Hold | None  # the hold the target carries now (or would)
    previous: Hold | None
    commit: str | None = None
    diff: str = ""
    # released from a file-wide hold: the other apps of the file that keep it, as their own
    still_held: tuple[str, ...] = ()


def set_hold(
    site: Site,
    transport: Transport,
    app_name: str,
    hold: Hold | None,
    *,
    by: str,
    dry_run: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    environment: Environment | None = None,
) -> HoldOutcome:
    """Put ``hold`` on the app's target (None: release it), once; ``environment``: on
    that environment's target.

    A replay changes nothing: holding a held app keeps the hold it has (release it first
    to say something else), releasing an app that is not held writes nothing."""
    app = site.app(app_name)
    if environment is not None:
        app = app.at(environment)
    where = target_where(site, app)
    branch = site.branch_of(app.writeback)
    if hold is None:
        message = f"fabrique: release {app.name}\n\nApp: {app.name}\nReleased-By: {by}\n"
    else:
        message = (
            f"fabrique: hold {app.name}\n\n{hold.reason or 'No reason given.'}\n\n"
            f"App: {app.name}\nHeld-By: {hold.by}\n"
        )
    found: list[Hold | None] = []
    # the other apps of the file: a file-wide hold released for one app keeps them held
    sharing = [a.name for a in site.apps if a.name != app.name and target_where(site, a) == where]
    kept: list[str] = []

    def edit(old: str | None) -> str | HoldOutcome:
        if old is None:
            raise TargetError(f"{where}: file not found; nothing to hold or release")
        previous = read_hold(old, where, app.name)
        found[:] = [previous]
        if (previous is None) == (hold is None):
            return HoldOutcome("unchanged", app.name, where, previous, previous)
        if hold is not None:
            return apply_hold(old, hold, where=where, app=app.name)
        text = old
        if read_hold_own(text, where, app.name) is not None:
            text = apply_hold(text, None, where=where, app=app.name)
        whole = file_hold(text, where)
        if whole is not None:
            # the file-wide hold held this app too: the other apps keep it, as their own
            kept[:] = [name for name in sharing if read_hold_own(text, where, name) is None]
            for name in kept:
                text = apply_hold(text, whole, where=where, app=name)
            text = apply_hold(text, None, where=where, app=None)
        return text

    if hold is not None and not dry_run:
        # its pull request and Gitea's scheduled merge go first, so that no merge lands
        # after the hold (a hold already there is the one that stays: said in its place);
        # so do the later environments' of a digest it no longer deploys (reverted by hand)
        close_held_review(site, transport, app.name, environment, hold)

        def deploys() -> str | None:
            text = transport.read(app.writeback.repo, branch, app.writeback.path).text
            pin = None if text is None else deployed_pin(site, app, text)
            return pin.digest if pin is not None else None

        withdraw_later(site, transport, app.name, environment, hold, deploys)
    done = commit_edit(site, transport, app, edit, message, dry_run=dry_run, sleep=sleep)
    if isinstance(done, HoldOutcome):
        return done
    state: Literal["changed", "would-change"] = "would-change" if done.commit is None else "changed"
    return HoldOutcome(state, app.name, where, hold, found[0], done.commit, done.diff, tuple(kept))


def close_held_review(
    site: Site, transport: Transport, app_name: str, environment: Environment | None, hold: Hold
) -> list[int]:
    """A held app proposes nothing: its open pull request (if any) is closed, saying who
    holds it and why, and so is each open pull request of a push (``review.group_branch``)
    that proposes a pin of it other than the one its target holds: the whole of it (a
    proposal is one commit), the push's other apps proposed again, without it, by the
    next pass. The numbers of those closed."""
    return _close_held(site, transport, app_name, environment, hold.describe())


def _close_held(
    site: Site, transport: Transport, app_name: str, environment: Environment | None, why: str
) -> list[int]:
    app = site.app(app_name)
    if environment is not None:
        app = app.at(environment)
    if not review.in_review(site, app):
        return []
    target = app.writeback
    base = site.branch_of(target)
    reviews = review.reviews_of(transport)
    own = review.close_review(
        *(site, reviews, app.name, target.repo, base),
        review.review_branch(site, app.name, environment),
        why,
    )
    closed = [own] if own is not None else []
    if environment is not None and [environment] != site.app(app_name).environments[:1]:
        return closed  # a promotion is proposed alone
    pushes = [
        p for p in reviews.open_pulls(target.repo, base) if review.is_group_branch(site, p.head)
    ]
    if not pushes:
        return closed
    text = transport.read(target.repo, base, target.path).text
    held = deployed_pin(site, app, text) if text is not None else None
    for pull in pushes:
        there = transport.read(target.repo, pull.head, target.path).text
        proposed = deployed_pin(site, app, there) if there is not None else None
        if proposed is None or proposed == held:
            continue
        said = f"{why}; the push's other apps are proposed again without it"
        closed.append(review.close_pull(reviews, app.name, target.repo, pull.head, pull, said))
    return closed


def withdraw_later(
    site: Site,
    transport: Transport,
    app_name: str,
    environment: Environment | None,
    hold: Hold,
    deploys: Callable[[], str | None],
) -> list[tuple[str, int]]:
    """A rollback or a hold of ``environment`` (None: the first) withdraws what it left:
    each later environment's open pull request that proposes a digest other than
    ``deploys()`` (what the held environment deploys now) is closed, its scheduled merge
    cancelled first, so that Gitea never merges into prod what the bench was taken back
    from. A proposal of the very digest held stays. Gitea is asked only of the later
    environments whose target takes pins through pull requests, the branch read only
    when its pull request is open: the reconcile pass calls it for every held app, each
    pass. Each environment whose pull request was closed, with its number."""
    app = site.app(app_name)
    names = [env.name for env in app.environments]
    held = environment.name if environment is not None else names[0] if names else None
    if held is None:
        return []
    closed: list[tuple[str, int]] = []
    kept: list[str | None] = []  # read once, and only when a later proposal is open
    for later in app.environments[names.index(held) + 1 :]:
        there = app.at(later)
        if not review.in_review(site, there):
            continue
        reviews = review.reviews_of(transport)
        target = there.writeback
        head = review.review_branch(site, app.name, later)
        pull = reviews.open_pull(target.repo, site.branch_of(target), head)
        if pull is None:
            continue
        text = transport.read(target.repo, head, target.path).text
        proposed = None if text is None else deployed_pin(site, there, text)
        if proposed is None:
            continue
        if not kept:
            kept.append(deploys())
        if proposed.digest == kept[0]:
            continue
        why = f"held in {held} ({hold.describe()}), which no longer deploys {proposed.digest}"
        closed.append(
            (later.name, review.close_pull(reviews, app.name, target.repo, head, pull, why))
        )
    return closed


# a deployed revision is a commit id, as fabrique writes it (the sha12) or in full: a tag
# such as `main` or `1.4` is none, though Gitea's "ref or sha" would resolve a branch name
DEPLOYED_TAG_RE = re.compile(r"[0-9a-f]{12}|[0-9a-f]{40}|[0-9a-f]{64}")


def deployed_revision(transport: Transport, repo: str, branch: str, tag: str) -> str | None:
    """The commit a deployed tag names, or None when it names none: only a commit id is
    a deployed revision (a branch name resolves to whatever the branch holds now)."""
    if not DEPLOYED_TAG_RE.fullmatch(tag):
        return None
    revision = transport.resolve(repo, branch, tag)
    return revision if revision is not None and revision.startswith(tag) else None


def _newer_deployed(
    site: Site, transport: Transport, revision: str, deployed_tag: str
) -> str | None:
    """Why ``revision`` must not replace what is deployed, or None if it may.

    The usual case (a descendant of what is deployed) costs three requests over Gitea
    (the tag resolved, the compare both ways); the branch head is asked only when the
    revision does not descend from the deployed one. Fails closed: a deployed tag that
    names no commit of the branch (a hand-written ``1.4.2``, a rewritten history) may be
    replaced by the branch head only."""
    repo, branch = site.gitea.code_repo, site.gitea.branch
    deployed = deployed_revision(transport, repo, branch, deployed_tag)
    if deployed is None:
        head = transport.head(repo, branch)
        if head != revision:
            raise TargetError(
                f"deployed tag {deployed_tag!r} is not a commit of {repo}@{branch}, so "
                f"nothing tells whether {revision} is newer: only the branch head ({head}) "
                "may replace it; build the head (fabrique submit --head) or set the tag "
                "by hand"
            )
        log.warning(
            "deployed tag %r is not a commit of %s@%s; the branch head %s replaces it",
            deployed_tag,
            repo,
            branch,
            revision,
        )
        return None
    if deployed == revision or transport.is_ancestor(repo, branch, deployed, revision):
        return None
    if transport.head(repo, branch) == revision:
        return None
    return (
        f"deployed revision {deployed} is not an ancestor of {revision}, "
        f"which is not the head of {repo}@{branch}"
    )


# ----------------------------------------------------------------------- transports


class GiteaTransport:
    """The Contents API: the blob sha is the lease; 422 means it went stale."""

    lease = "file"  # a write to one file leaves what was read of the others valid

    def __init__(self, client: GiteaClient, author: Identity) -> None:
        self.client = client
        self.reviews = client
        self.author = author

    def read(self, repo: str, branch: str, path: str) -> Snapshot:
        found = self.client.get_file(repo, path, branch)
        return Snapshot(found.text if found else None, found)

    def write(
        self, repo: str, branch: str, path: str, text: str, snapshot: Snapshot, message: str
    ) -> str:
        if isinstance(snapshot.lease, FileContent):
            return self.client.update_file(repo, branch, snapshot.lease, text, message, self.author)
        return self.client.create_file(repo, path, branch, text, message, self.author)

    def read_many(self, repo: str, branch: str, paths: Sequence[str]) -> dict[str, Snapshot]:
        found = self.client.get_files(repo, paths, branch)
        # Gitea answers null for a file it could not read as for one that is not there:
        # those few are asked alone, which tells the two apart
        return {
            path: Snapshot(f.text, f) if f else self.read(repo, branch, path)
            for path, f in found.items()
        }

    def write_many(
        self, repo: str, branch: str, files: Sequence[tuple[str, str, Snapshot]], message: str
    ) -> str:
        if len(files) == 1:  # one file: the very request a single write-back makes
            return self.write(repo, branch, files[0][0], files[0][1], files[0][2], message)
        return self.client.change_files(repo, branch, self._changes(files), message, self.author)

    def propose(
        self,
        repo: str,
        base: str,
        head: str,
        files: Sequence[tuple[str, str, Snapshot]],
        message: str,
        head_tip: str | None,
    ) -> str:
        # the Contents API forces the new branch with no lease on it: a rival proposal's
        # commit may be replaced, and the next pass proposes again what it wants
        if len(files) == 1:  # one file: the very request a single proposal makes
            path, text, snapshot = files[0]
            if isinstance(snapshot.lease, FileContent):
                return self.client.update_file(
                    repo, base, snapshot.lease, text, message, self.author, onto=head
                )
            return self.client.create_file(repo, path, base, text, message, self.author, onto=head)
        return self.client.change_files(
            repo, base, self._changes(files), message, self.author, onto=head
        )

    @staticmethod
    def _changes(files: Sequence[tuple[str, str, Snapshot]]) -> list[FileChange]:
        return [
            FileChange(path, text, s.lease.sha if isinstance(s.lease, FileContent) else None)
            for path, text, s in files
        ]

    def head(self, repo: str, branch: str) -> str:
        return self.client.branch_head(repo, branch)

    def resolve(self, repo: str, branch: str, ref: str) -> str | None:
        return self.client.resolve_commit(repo, ref)

    def is_ancestor(self, repo: str, branch: str, ancestor: str, descendant: str) -> bool:
        return self.client.is_ancestor(repo, ancestor, descendant)

    def files_changed(
        self, repo: str, branch: str, since: str, until: str, path: str
    ) -> list[str] | None:
        return self.client.files_changed(repo, since, until, path)

    def last_change(self, repo: str, branch: str, path: str, ignore: frozenset[str]) -> str | None:
        return self.client.last_change(repo, branch, path, ignore)

    def commits_since(self, repo: str, branch: str, head: str, since: str) -> list[Commit] | None:
        return self.client.commits_since(repo, head, since)


def _locked(method: Callable[..., _T]) -> Callable[..., _T]:
    """One git operation at a time: the local repositories are shared between threads."""

    @functools.wraps(method)
    def wrapper(self: GitTransport, *args: object, **kwargs: object) -> _T:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class GitTransport:
    """Plain git: the branch tip is the lease; a rejected push means it moved."""

    lease = "branch"  # a write moves the tip every other read was leased on

    def __init__(
        self,
        site: Site,
        workdir: Path,
        token: str | None,
        signing_key: Path | None = None,
        reviews: GiteaClient | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self.reviews = reviews  # pull requests are Gitea's API's, whatever the transport
        self.site = site
        self.workdir = workdir
        self.token = token
        self.signing_key = signing_key
        self._remotes: dict[tuple[str, str], GitRemote] = {}

    @_locked
    def _remote(self, repo: str, branch: str) -> GitRemote:
        key = (repo, branch)
        if key not in self._remotes:
            self._remotes[key] = GitRemote(
                self.site.writeback.repo_url(self.site.gitea.url, repo),
                branch,
                self.workdir / f"{len(self._remotes)}",
                token=self.token,
                timeout=max(30.0, self.site.network.timeout_seconds * 6),
                retry=self.site.network.retry_policy(),
                signing_key=self.signing_key,
            )
        return self._remotes[key]

    @_locked
    def read(self, repo: str, branch: str, path: str) -> Snapshot:
        remote = self._remote(repo, branch)
        tip = remote.fetch_tip()
        return Snapshot(remote.show(tip, path), tip)

    def _signed(self) -> None:
        """Never an unsigned commit where the site signs: a transport opened to read
        (``open_transport(writes=False)``) holds no key, and makes no commit."""
        if self.site.writeback.signing is not None and self.signing_key is None:
            raise RuntimeError("this git transport was opened to read, with no signing key")

    @_locked
    def write(
        self, repo: str, branch: str, path: str, text: str, snapshot: Snapshot, message: str
    ) -> str:
        self._signed()
        remote = self._remote(repo, branch)
        tip = str(snapshot.lease)
        author = self.site.writeback.author
        commit = remote.commit_file(tip, path, text, message, Author(author.name, author.email))
        remote.push(commit, tip)
        return commit

    @_locked
    def read_many(self, repo: str, branch: str, paths: Sequence[str]) -> dict[str, Snapshot]:
        remote = self._remote(repo, branch)
        tip = remote.fetch_tip()  # one fetch: every file read at one tip, one lease
        return {path: Snapshot(remote.show(tip, path), tip) for path in paths}

    @_locked
    def write_many(
        self, repo: str, branch: str, files: Sequence[tuple[str, str, Snapshot]], message: str
    ) -> str:
        self._signed()
        tips = {str(s.lease) for _, _, s in files}
        if len(tips) != 1:  # read at several tips: no one lease covers them all
            raise StaleWrite(f"{repo}@{branch}: files read at different tips; read again")
        tip = tips.pop()
        remote = self._remote(repo, branch)
        author = self.site.writeback.author
        commit = remote.commit_files(
            tip, {path: text for path, text, _ in files}, message, Author(author.name, author.email)
        )
        remote.push(commit, tip)
        return commit

    @_locked
    def propose(
        self,
        repo: str,
        base: str,
        head: str,
        files: Sequence[tuple[str, str, Snapshot]],
        message: str,
        head_tip: str | None,
    ) -> str:
        self._signed()
        tips = {str(s.lease) for _, _, s in files}
        if len(tips) != 1:  # read at several tips: the proposal would mix them
            raise StaleWrite(f"{repo}@{base}: files read at different tips; read again")
        remote = self._remote(repo, base)
        author = self.site.writeback.author
        commit = remote.commit_files(
            tips.pop(),
            {path: text for path, text, _ in files},
            message,
            Author(author.name, author.email),
        )
        remote.push(commit, head_tip or "", branch=head)
        return commit

    @_locked
    def head(self, repo: str, branch: str) -> str:
        return self._remote(repo, branch).remote_head()

    @_locked
    def resolve(self, repo: str, branch: str, ref: str) -> str | None:
        return self._remote(repo, branch).resolve(ref)

    @_locked
    def is_ancestor(self, repo: str, branch: str, ancestor: str, descendant: str) -> bool:
        return self._remote(repo, branch).is_ancestor(ancestor, descendant)

    @_locked
    def files_changed(
        self, repo: str, branch: str, since: str, until: str, path: str
    ) -> list[str] | None:
        return self._remote(repo, branch).files_changed(since, until, path)

    @_locked
    def last_change(self, repo: str, branch: str, path: str, ignore: frozenset[str]) -> str | None:
        return self._remote(repo, branch).last_change(path, ignore)

    @_locked
    def commits_since(self, repo: str, branch: str, head: str, since: str) -> list[Commit] | None:
        return self._remote(repo, branch).commits_since(head, since)


@contextmanager
def open_transport(site: Site, token: str | None, *, writes: bool = True) -> Iterator[Transport]:
    """The site's transport, its connections and scratch space released on exit.

    ``writes=False`` for a command that writes nothing (status, a dry run, the plan):
    reading needs no signing key, so none is asked for, and such a transport makes no
    commit."""
    author = Identity(site.writeback.author.name, site.writeback.author.email)
    if site.writeback.transport == "gitea":
        with GiteaClient.for_site(site, token) as client:
            yield GiteaTransport(client, author)
    else:
        with (
            tempfile.TemporaryDirectory(prefix="fabrique-git-") as scratch,
            GiteaClient.for_site(site, token) as reviews,  # asked for pull requests only
        ):
            key = None
            if writes and site.writeback.signing is not None:  # checked before any read
                key = ssh_signing_key(os.environ.get(SIGNING_KEY_ENV), Path(scratch))
            yield GitTransport(site, Path(scratch), token, key, reviews)
