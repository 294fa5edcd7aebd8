"""The write-back through a pull request (``writeback.mode: pull-request``).

One branch per app and target (``<prefix><app>``, ``<prefix><app>.<env>`` for a later
environment) and at most one open pull request from it into the target's branch. A
proposal is always one commit on the target branch's head: the target read there,
edited as a direct write-back would edit it, and forced onto the proposal branch (the
Contents API's ``new_branch`` with ``force_push``; git's push with a lease on the
branch's tip). An open pull request is updated in place, never closed and reopened:
deleting its branch would close it.

The guards are a direct write-back's, on both branches: a held target proposes nothing
and closes the open pull request, its description saying who holds it and why (a hold
or a rollback of an environment closes too each later environment's proposal of a
digest it no longer deploys: ``writeback.withdraw_later``); a target or a pull
request that already deploys (proposes) a newer commit is ``superseded``; a pull
request that already proposes this very pin is ``in-review`` and nothing is written,
unless the base moved past it (it is made again on the base's head); a pin whose pull
request a person closed unmerged is ``rejected`` (each proposal is recorded on the built
commit, where the refusal is read).
With ``autoMerge``, Gitea is asked to merge the proposed commit once the checks its
branch protection requires pass (``merge_when_checks_succeed``), and deletes the
branch when it has.

The apps of one push that propose into one repository and branch share one pull request
from the push's branch (``group_branch``); each app's record keeps its own branch's
context and links that pull request, where the refusal and the safety net read it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fabrique.clients.gitea import CommitStatus, PullRequest
from fabrique.site.config import AppConfig, Environment, Site, WriteBackTarget
from fabrique.site.errors import ConfigError
from fabrique.site.freeze import Frozen
from fabrique.site.names import PUSH_BRANCH_MARK, push_branch
from fabrique.site.retry import RetryPolicy

from .targets import ImagePin, target_pin

log = logging.getLogger("fabrique.review")


class Reviews(Protocol):
    """What a proposal needs of Gitea's pull requests (``GiteaClient``)."""

    def branch_tip(self, repo: str, branch: str) -> str | None: ...

    def delete_branch(self, repo: str, branch: str) -> None: ...

    def open_pull(self, repo: str, base: str, head: str) -> PullRequest | None: ...

    def open_pulls(self, repo: str, base: str) -> list[PullRequest]: ...

    def pull(self, repo: str, number: int) -> PullRequest | None: ...

    def latest_status(self, repo: str, sha: str, context: str) -> CommitStatus | None: ...

    def latest_statuses(self, repo: str, sha: str) -> dict[str, CommitStatus]: ...

    def create_status(self, repo: str, sha: str, status: CommitStatus) -> None: ...

    def behind(self, repo: str, base: str, head: str) -> int: ...

    def cancel_merge(self, repo: str, number: int) -> None: ...

    def create_pull(
        self, repo: str, base: str, head: str, title: str, body: str
    ) -> PullRequest: ...

    def edit_pull(self, repo: str, number: int, **fields: str) -> PullRequest: ...

    def merge_pull(self, repo: str, number: int, *, style: str, head: str) -> str: ...


def in_review(site: Site, app: AppConfig) -> bool:
    """Whether ``app``'s target (as given: ``app.at(env)`` for an environment's) is
    written through a pull request."""
    return site.writeback.mode_of(app.writeback) == "pull-request"


def review_branch(site: Site, app: str, environment: Environment | None = None) -> str:
    """The branch that proposes ``app``'s pin (in ``environment``, if a later one):
    ``<prefix><app>``, ``<prefix><app>.<env>`` (a dot, which no app or environment name
    holds: app ``web`` in ``prod`` and app ``web-prod`` never share a branch)."""
    first = site.app(app).environments[:1]
    suffix = "" if environment is None or [environment] == first else f".{environment.name}"
    return f"{site.writeback.pull_request.branch_prefix}{app}{suffix}"


def group_branch(site: Site, revision: str, base: str) -> str:
    """The branch that proposes, in one pull request into ``base``, the pins of the
    apps of one push (built at ``revision``) whose targets are files of one repository
    and ``base`` (``names.push_branch``)."""
    return push_branch(site.writeback.pull_request.branch_prefix, revision, base)


def push_freeze(site: Site, repo: str, base: str) -> Frozen | None:
    """The freeze a push's pull request into ``repo@base`` must not be merged in: the
    first that an app proposing into that branch (its first environment) is in, or
    enters before the next pass. Any of them may be in the pull request: it waits for
    all."""
    for app in site.apps:
        target = app.writeback
        if in_review(site, app) and (target.repo, site.branch_of(target)) == (repo, base):
            frozen = site.frozen_soon(app, None)
            if frozen is not None:
                return frozen
    return None


def is_group_branch(site: Site, head: str) -> bool:
    """Whether ``head`` is a push's proposal branch (``group_branch``)."""
    prefix = site.writeback.pull_request.branch_prefix + PUSH_BRANCH_MARK
    return head.startswith(prefix) and "." in head[len(prefix) :]


def reviews_of(transport: object) -> Reviews:
    reviews: Reviews | None = getattr(transport, "reviews", None)
    if reviews is None:
        raise ConfigError(
            "writeback.mode: pull-request needs Gitea's API, and this transport has none"
        )
    return reviews


def pull_text(message: str, site: Site, revision: str) -> tuple[str, str]:
    """A pull request's title and body: the commit's subject, and its body with a link
    to the built commit, whose statuses say how the build went."""
    subject, _, rest = message.partition("\n\n")
    link = f"{site.gitea.url}/{site.gitea.code_repo}/commit/{revision}"
    return subject, f"{rest.strip()}\n\nBuilt commit: {link}\n"


class Reads(Protocol):
    """A transport's read (``writeback.Transport.read``): a snapshot with ``text``."""

    def read(self, repo: str, branch: str, path: str) -> Any: ...


@dataclass(frozen=True)
class Proposal:
    """What an app's proposal branch holds now."""

    head: str  # the branch
    pull: PullRequest | None  # its open pull request
    tip: str | None  # the branch's head commit; None: no such branch
    text: str | None  # the target file on it

    def pin(self, target: WriteBackTarget, pin_for: ImagePin, where: str) -> ImagePin | None:
        """The pin of ``pin_for``'s image that the branch proposes, if any."""
        if self.text is None:
            return None
        return target_pin(self.text, target, pin_for, where=f"{where} (branch {self.head})")


def find_proposal(
    reviews: Reviews, transport: Reads, target: WriteBackTarget, base: str, head: str
) -> Proposal:
    """Branch ``head``'s open pull request into ``base``, its tip and the target on it
    (an open pull request's head is the tip: the branch is not asked then)."""
    pull = reviews.open_pull(target.repo, base, head)
    tip = pull.head_sha if pull is not None else reviews.branch_tip(target.repo, head)
    text = transport.read(target.repo, head, target.path).text if tip else None
    return Proposal(head, pull, tip, text)


def open_or_update(
    reviews: Reviews,
    site: Site,
    repo: str,
    base: str,
    head: str,
    pull: PullRequest | None,
    message: str,
    revision: str,
) -> PullRequest:
    """The pull request from ``head`` once its branch holds the proposal made with
    ``message``: opened, or ``pull`` with its title and description said again."""
    title, body = pull_text(message, site, revision)
    if pull is None:
        pull = reviews.create_pull(repo, base, head, title, body)
        log.info("%s@%s: opened pull request #%d (%s)", repo, base, pull.number, pull.url)
    elif (pull.title, pull.body) != (title, body):
        pull = reviews.edit_pull(repo, pull.number, title=title, body=body)
    return pull


def left_behind(reviews: Reviews, repo: str, pull: PullRequest) -> bool:
    """Whether the base moved since ``pull``'s proposal was made on its head: a
    fast-forward-only merge of it fails then, and it may conflict (Gitea answers 'try
    again later' for ever). Asked of Gitea only when its merge base is not the base's
    head (it may lag behind a push Gitea has not checked yet)."""
    if not pull.base_sha or pull.merge_base == pull.base_sha:
        return False
    return reviews.behind(repo, pull.base_sha, pull.head_sha) > 0


def schedule_merge(
    site: Site,
    reviews: Reviews,
    repo: str,
    number: int,
    head: str,
    backoff: RetryPolicy,
    sleep: Callable[[float], None],
    *,
    attempts: int | None = None,
    wait: str | None = None,
) -> str:
    """With ``autoMerge``, ask Gitea to merge pull request ``number`` once its checks
    pass (asked again by a replay and by each pass that finds it in review: a schedule
    already there is kept); what to say of it, "" without ``autoMerge``. Gitea's 'try
    again later' is asked again after a pause, ``attempts`` times in all (by default
    ``writeback.attempts``: right after a push, while Gitea checks it). ``wait``: a
    freeze (said) that the merge must not fall into: nothing is asked."""
    pulls = site.writeback.pull_request
    if not pulls.auto_merge:
        return ""
    if wait:
        return f"its merge waits: {wait}"
    attempts = attempts or site.writeback.attempts
    for attempt in range(1, attempts + 1):
        answer = reviews.merge_pull(repo, number, style=pulls.merge_style, head=head)
        if answer == "merged":
            return "merged"
        if answer != "busy":
            return "merges once its checks pass"
        if attempt < attempts:  # Gitea is still checking it after a push
            sleep(backoff.delay(attempt))
    log.warning(
        "%s: Gitea kept answering 'try again later' for pull request #%d (checking it, or "
        "it conflicts); its merge is not asked yet",
        repo,
        number,
    )
    return (
        "its merge not asked yet (Gitea was checking it or finds it conflicting; the next "
        "pass asks again)"
    )


# A proposal is recorded on the built commit, in the code repository: a status of its own
# context per proposal branch, whose link is the pull request. A person's refusal is then
# read in two requests whatever the history (Gitea lists pull requests by base, never by
# head), and whatever the proposal branch holds since.
RECORD_STATE = "success"  # a record, no check: it must hold back no merge that requires all
CLOSED_BY_FABRIQUE = "**Closed by fabrique: "
PULL_URL = re.compile(r"/pulls/(\d+)$")


def record_context(head: str) -> str:
    """The status that records the proposals of branch ``head`` on the built commit."""
    return f"proposal: {head}"


def proposal_record(reviews: Reviews, site: Site, revision: str, head: str) -> CommitStatus | None:
    """The record of the last pull request that proposed ``revision``'s pin from
    ``head``, if any."""
    return reviews.latest_status(site.gitea.code_repo, revision, record_context(head))


def recorded(reviews: Reviews, repo: str, record: CommitStatus | None) -> PullRequest | None:
    """The pull request ``record`` names (the app's own or its push's), if any."""
    found = PULL_URL.search(record.target_url) if record is not None else None
    return reviews.pull(repo, int(found[1])) if found is not None else None


def refused(pull: PullRequest | None) -> PullRequest | None:
    """``pull`` if a person closed it unmerged: one that is open, merged, or closed by
    fabrique (a hold) is no refusal; nor is one reopened."""
    if pull is None or pull.state != "closed" or pull.merged:
        return None
    return None if pull.body.startswith(CLOSED_BY_FABRIQUE) else pull


def rejection(reviews: Reviews, repo: str, record: CommitStatus | None) -> PullRequest | None:
    """The pull request a person closed unmerged that ``record`` names, if so."""
    return refused(recorded(reviews, repo, record))


def record_proposal(
    reviews: Reviews,
    site: Site,
    revision: str,
    head: str,
    pull: PullRequest,
    record: CommitStatus | None,
) -> None:
    """Record on the built commit that ``pull`` proposes its pin (unless ``record``, read
    before, says so already). ``head`` is the app's own proposal branch, whatever branch
    ``pull`` proposes from (its push's, ``group_branch``): the record is read by it."""
    if record is not None and record.target_url == pull.url:
        return
    said = f"proposed in pull request #{pull.number}"
    if pull.head != head and pull.head:
        said += " with the other apps of its push"
    status = CommitStatus(record_context(head), RECORD_STATE, said, pull.url)
    reviews.create_status(site.gitea.code_repo, revision, status)


def close_review(
    site: Site, reviews: Reviews, app: str, repo: str, base: str, head: str, why: str
) -> int | None:
    """Close the open pull request from ``head`` (if any), saying ``why`` at the top of
    its description (an issue comment would need the token to hold ``write:issue`` too),
    and delete its branch: the next proposal starts again from the target. Its number,
    or None."""
    pull = reviews.open_pull(repo, base, head)
    if pull is None:
        return None
    return close_pull(reviews, app, repo, head, pull, why)


def close_pull(
    reviews: Reviews, app: str, repo: str, head: str, pull: PullRequest, why: str
) -> int:
    """Close open pull request ``pull`` from ``head`` as ``close_review`` does: its
    scheduled merge cancelled first, ``why`` at the top of its description, its branch
    deleted. Its number."""
    reviews.cancel_merge(repo, pull.number)  # closing alone leaves Gitea's schedule
    body = f"{CLOSED_BY_FABRIQUE}{app} is {why}.**\n\n{pull.body}"
    reviews.edit_pull(repo, pull.number, state="closed", body=body)
    reviews.delete_branch(repo, head)
    log.warning("%s: closed pull request #%d (%s)", app, pull.number, why)
    return pull.number


def pause_merges(site: Site, transport: object, apps: list[AppConfig]) -> list[tuple[str, str]]:
    """A freeze is never broken by a merge Gitea makes on its own: for each environment
    of ``apps`` whose target takes pull requests and that is in a freeze window, or
    whose window opens before the next pass (``Site.frozen_soon``), the merge scheduled
    for its open proposal is cancelled (Gitea would make it once the checks pass, in
    the window). The first pass after the window asks again (``schedule_merge``).
    ``(<app>/<env> or <app>, what was done)`` for each proposal so paused."""
    if not site.writeback.pull_request.auto_merge:
        return []
    reviews: Reviews | None = None
    paused = []
    pushes: set[tuple[str, str]] = set()  # the branches whose pushes' pull requests wait
    for app in apps:
        environments: list[Environment | None] = [*app.environments] or [None]
        for env in environments:
            there = app.at(env) if env is not None else app
            if not in_review(site, there):
                continue
            frozen = site.frozen_soon(app, env)
            if frozen is None:
                continue
            reviews = reviews or reviews_of(transport)
            target = there.writeback
            head = review_branch(site, app.name, env)
            pull = reviews.open_pull(target.repo, site.branch_of(target), head)
            if pull is None:
                continue
            reviews.cancel_merge(target.repo, pull.number)
            name = (
                app.name if env is None or env == app.environments[0] else f"{app.name}/{env.name}"
            )
            paused.append((name, f"the merge of {pull.url} waits: {frozen.describe()}"))
    for app in apps:  # a push's pull request: any of its apps' freezes holds it
        target = app.writeback
        where = (target.repo, site.branch_of(target))
        if not in_review(site, app) or where in pushes:
            continue
        pushes.add(where)
        frozen = push_freeze(site, *where)
        if frozen is None:
            continue
        reviews = reviews or reviews_of(transport)
        for pull in reviews.open_pulls(*where):
            if is_group_branch(site, pull.head):
                reviews.cancel_merge(target.repo, pull.number)
                said = f"the merge of {pull.url} waits: {frozen.describe()}"
                paused.append((f"push pull request #{pull.number}", said))
    return paused
