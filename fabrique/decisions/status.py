"""Commit statuses: what a build says on its commit in Gitea, decided from plain facts.

Every ``fabrique-build`` Workflow reports on the revision it builds, in the code
repository, under the context ``fabrique/<app>``. Gitea keeps every status posted and
shows the latest of each context:

    pending   the build starts               building <image>:<sha12>
    success   the digest is written back     deployed sha256:…; changed, commit <sha12>
                                             sha256:… already deployed; unchanged
                                             built sha256:…; superseded, a newer commit …
                                             built sha256:…; held, nothing deployed
              nothing under the context      no change under <context>
              changed
    failure   a step failed on the commit's  <step>: <reason>
              own account (a bad Dockerfile,
              a digest mismatch, a bad target)
    error     the build could not finish:    <step>: <reason>
              the deadline, out of memory, a
              server that stayed unreachable

The failure report is made from Argo's exit-handler variables: ``{{workflow.status}}``
(Succeeded, Failed or Error) and ``{{workflow.failures}}``, a JSON list of the failed
nodes (displayName, message, templateName, phase, podName, finishedAt). Argo quotes that
list once more before substituting it, so it may arrive as a JSON string holding the
JSON list. A step's ``message`` carries the tail of its log when the container sets
``terminationMessagePolicy: FallbackToLogsOnError``: the reason is fabrique's own
``error: …`` line when there is one.

Reporting never fails a build: a Gitea that answers 5xx or times out is logged, and the
next reconcile pass repairs the status (``repair``). A status equal to the latest one of
its context is not posted again, so a replay adds nothing to the commit's history.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fabrique.clients.gitea import CommitStatus, GiteaClient
from fabrique.site.config import AppConfig, Site
from fabrique.site.errors import (
    INFRASTRUCTURE_EXITS,
    NOT_RUN,
    TRANSIENT_SAID,
    RemoteError,
    failed_stage,
    reason_line,
)
from fabrique.site.names import redact_urls, short_sha

log = logging.getLogger("fabrique.status")

CONTEXT_PREFIX = "fabrique/"
MAX_DESCRIPTION = 140  # what GitHub keeps; Gitea shows it on one line beside the commit
SAFETY_NET = "safety net: "

# messages Argo puts on the nodes around a failed pod: they say nothing of the cause
_GENERIC = re.compile(
    r"^(|No more retries left|child '.*' failed|.*evaluated to false.*|"
    r"Stopped with strategy '.*')$",
    re.S,
)
# causes outside the commit itself: the build could not finish (a step that exited with
# one of INFRASTRUCTURE_EXITS says so on its reason line, where ``reason_line`` puts it;
# a step that gave up on a transient cause says TRANSIENT_SAID, on a node message that
# may carry no exit code at all)
_INFRASTRUCTURE = re.compile(
    r"deadline|OOMKilled|out of memory|evicted|pod deleted|ImagePull|ErrImage|"
    r"unreachable|timed out|HTTP 5[0-9][0-9]|Unschedulable|Stopped with strategy|"
    + re.escape(TRANSIENT_SAID)
    + "|"
    + "|".join(f"exit code {code}" for code in sorted(INFRASTRUCTURE_EXITS)),
    re.I,
)
_STEP_GROUP = re.compile(r"^\[\d+\]$")
_RETRY_SUFFIX = re.compile(r"\(\d+\)$")


@dataclass(frozen=True)
class Report:
    """A status to post: Gitea's state and a one-line description."""

    state: str  # pending | success | failure | error
    description: str


def context(app: str) -> str:
    return f"{CONTEXT_PREFIX}{app}"


def one_line(text: str, secrets: tuple[str | None, ...] = ()) -> str:
    """``text`` on one line, at most MAX_DESCRIPTION characters, secrets masked: the
    ones given, and every URL's credentials, query and fragment (a failed step's log
    tail may quote a clone URL with its token)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    text = redact_urls(text)
    flat = " ".join(text.split())
    if len(flat) > MAX_DESCRIPTION:
        flat = flat[: MAX_DESCRIPTION - 1].rstrip() + "…"
    return flat


# ----------------------------------------------------------------- the build's own


def pending(app: AppConfig, revision: str) -> Report:
    return Report("pending", f"building {app.image}:{short_sha(revision)}")


def skipped(app: AppConfig) -> Report:
    return Report("success", f"no change under {app.context}")


# the success of a write-back, by its outcome ({commit}: ", commit <sha12>" when one
# was made)
WRITTEN = {
    "changed": "deployed {digest}; changed{commit}",
    "unchanged": "{digest} already deployed; unchanged",
    "superseded": "built {digest}; superseded, a newer commit is deployed",
    "held": "built {digest}; held, nothing deployed",
    "frozen": "built {digest}; frozen, deployed once the window ends",
    "proposed": "built {digest}; proposed in a pull request{commit}",
    "in-review": "built {digest}; in review, already proposed",
    "rejected": "built {digest}; its pull request was closed unmerged",
}
# a write-back's success that is not yet a deployment: its pull request is open
PROPOSED = re.compile(
    "|".join(
        re.escape(WRITTEN[outcome].split("{digest}")[1].format(commit=""))
        for outcome in ("proposed", "in-review")
    )
)


def written(
    outcome: str, digest: str, commit: str | None = None, *, by_net: bool = False
) -> Report:
    """The success of a write-back: its digest and its outcome."""
    if outcome not in WRITTEN:
        raise ValueError(f"write-back outcome {outcome!r}")
    where = f", commit {commit[:12]}" if commit else ""
    said = WRITTEN[outcome].format(digest=digest, commit=where)
    return Report("success", (SAFETY_NET if by_net else "") + said)


def parse_failures(raw: str | None) -> list[dict[str, Any]]:
    """``{{workflow.failures}}`` as a list of nodes; [] for none or for what is not JSON.

    Argo ``strconv.Quote``s the list before substituting it, so the value may be a JSON
    string that holds the JSON list (or ``null`` when nothing failed).
    """
    value: Any = raw
    for _ in range(3):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value, strict=False)  # control characters in messages
        except ValueError:
            value = _go_unquote(value)
            if value is None:
                log.warning("workflow.failures is not JSON; reporting without it")
                return []
    if not isinstance(value, list):
        return []
    return [node for node in value if isinstance(node, dict)]


def _go_unquote(text: str) -> str | None:
    """A Go ``strconv.Quote``d string (``\\xNN`` escapes are not JSON, but are Python)."""
    if len(text) < 2 or not (text[0] == text[-1] == '"'):
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def failing_step(failures: list[dict[str, Any]], workflow: str) -> tuple[str, str, str] | None:
    """(step, reason, node phase) of the step that failed, or None if no step did.

    The Workflow's own node and the step groups only say "child failed"; a retried step
    has a node per attempt (``run(0)``, ``run(1)``) and a parent that says "No more
    retries left". The build's pod runs its stages as containers, each a node, and the
    pod's node repeats one of their messages: the stage is the container a message names
    (``failed_stage``), and a container that never ran because one before it failed
    says nothing. The most recent node with a message of its own wins.
    """
    steps = []
    for index, node in enumerate(failures):
        name = str(node.get("displayName") or "")
        if not name or name == workflow or _STEP_GROUP.match(name):
            continue
        message = str(node.get("message") or "").strip()
        telling = not _GENERIC.match(message) and not NOT_RUN.search(message)
        steps.append(
            (
                telling,
                str(node.get("finishedAt") or ""),
                index,
                failed_stage(_RETRY_SUFFIX.sub("", name), message),
                message,
                str(node.get("phase") or ""),
            )
        )
    if not steps:
        return None
    _, _, _, step, message, phase = max(steps)
    return step, reason_line(message) or "failed", phase


def failed(workflow_status: str, failures: str | None, workflow: str) -> Report | None:
    """The exit handler's report; None when the Workflow succeeded (it reported itself)."""
    if workflow_status == "Succeeded":
        return None
    found = failing_step(parse_failures(failures), workflow)
    if found is None:
        return Report("error", f"the Workflow ended {workflow_status} before any step failed")
    step, reason, phase = found
    # a step that names itself (the checkout script says "checkout: …") is named once
    said = reason if reason.startswith(f"{step}: ") else f"{step}: {reason}"
    return Report(verdict(workflow_status, reason, phase), said)


def verdict(workflow_phase: str, reason: str, step_phase: str = "Failed") -> str:
    """``failure`` when a step failed for the commit's own sake, else ``error``: the
    Workflow ended otherwise than Failed (Error, terminated), the step errored, or the
    reason names the infrastructure (a deadline, an eviction, an OOM, a server)."""
    infrastructure = (
        workflow_phase != "Failed" or step_phase == "Error" or bool(_INFRASTRUCTURE.search(reason))
    )
    return "error" if infrastructure else "failure"


# ------------------------------------------------------------ the safety net's repair


def step_reason(reason: str) -> str:
    """The reconciler names the attempt's node (``build(0): …``): name the step, as Argo's
    UI does (``build: …``)."""
    return re.sub(r"^([A-Za-z0-9.-]+)\(\d+\): ", r"\1: ", reason)


def repair(
    result: str,
    current: CommitStatus | None,
    *,
    deployed_is_want: bool,
    deployed_digest: str | None,
    workflow: str | None,
    phase: str | None,
    reason: str = "",
    wrote: tuple[str, str, str | None] | None = None,
) -> Report | None:
    """What the reconciler posts on the wanted commit after its action, if anything.

    ``result`` is the pass's line for the app (ok, in-flight, written-back, superseded,
    submitted, failed, error); ``wrote`` the net's own write-back (outcome, digest,
    commit). A status the Workflow posted is left alone unless it is wrong or lost:

    - the net wrote back: success with its digest and outcome;
    - the wanted commit is deployed but its status is not success (the report was lost):
      success;
    - the Workflow failed and the status is missing or pending (the exit handler's
      report was lost): failure for a Failed phase, else error, with the step's reason;
    - the status says pending and the Workflow no longer exists (the net resubmits it):
      error.
    """
    state = current.state if current else None
    if wrote is not None:
        outcome, digest, commit = wrote
        return written(outcome, digest, commit, by_net=True)
    proposed = current is not None and PROPOSED.search(current.description) is not None
    if result == "ok" and deployed_is_want and deployed_digest and (state != "success" or proposed):
        # lost, or it said the digest was proposed in a pull request, merged since
        return Report("success", f"{SAFETY_NET}{deployed_digest} deployed")
    if result == "failed" and state in (None, "pending") and workflow and phase:
        why = step_reason(reason) or f"{workflow} {phase}"
        return Report(verdict(phase, why), f"{SAFETY_NET}{why}")
    if result == "submitted" and state == "pending" and workflow:
        return Report("error", f"{SAFETY_NET}{workflow} no longer exists; resubmitted")
    return None


# ---------------------------------------------------------------------- the poster


class _Read:
    """What a reporter has read of one commit's statuses: the pages of its combined
    status, read no further than a context asked for needs."""

    def __init__(self, pages: Iterator[list[CommitStatus]]) -> None:
        self.pages = pages
        self.latest: dict[str, CommitStatus] = {}
        self.done = False
        self.lock = threading.Lock()

    def find(self, name: str) -> CommitStatus | None:
        while name not in self.latest and not self.done:
            page = next(self.pages, None)
            if page is None:
                self.done = True
                break
            for status in page:
                self.latest.setdefault(status.context, status)  # the first seen is the latest
        return self.latest.get(name)


class StatusReporter:
    """Posts reports on the code repository's commits; never raises for Gitea's faults.

    It lives for one report or one reconcile pass, and reads each commit's statuses once
    (Gitea pages them, 50 contexts a page, the most recently updated first), no further
    than the contexts asked for: a build's report reads the first page or few, a pass over
    a thousand apps that share one commit reads its twenty pages once, not once per app.
    What it posts is what it then reads back.
    """

    def __init__(self, site: Site, gitea: GiteaClient, token: str | None = None) -> None:
        self.site = site
        self.gitea = gitea
        self.token = token
        self.repo = site.gitea.code_repo
        self._reads: dict[str, _Read] = {}
        self._lock = threading.Lock()

    def current(self, app: str, revision: str) -> CommitStatus | None:
        """The latest status of ``fabrique/<app>`` on ``revision`` (RemoteError if unread)."""
        return self.latest(revision, context(app))

    def latest(self, revision: str, name: str) -> CommitStatus | None:
        """The latest status of context ``name`` on ``revision`` (RemoteError if unread)."""
        with self._lock:
            read = self._reads.get(revision)
            if read is None:
                read = self._reads[revision] = _Read(self.gitea.status_pages(self.repo, revision))
        with read.lock:
            try:
                return read.find(name)
            except RemoteError:
                with self._lock:  # a page that failed ends its reading: the next call starts over
                    if self._reads.get(revision) is read:
                        del self._reads[revision]
                raise

    def _posted(self, revision: str, status: CommitStatus) -> None:
        with self._lock:
            read = self._reads.get(revision)
        if read is not None:
            with read.lock:
                read.latest[status.context] = status

    def post(
        self,
        app: str,
        revision: str,
        report: Report,
        *,
        workflow: str | None = None,
        known: bool = False,
        current: CommitStatus | None = None,
        name: str | None = None,
    ) -> str:
        """Post ``report`` unless it is already the latest: ``posted``, ``unchanged`` or
        ``not-posted`` (Gitea failed; logged). With ``known``, ``current`` is the latest
        status, just read by the caller; otherwise it is read here. ``name``: a context
        of the app's other than ``fabrique/<app>`` (a promotion's)."""
        url = self.site.argo_server.workflow_url(self.site.namespaces.build, workflow or "")
        status = CommitStatus(
            name or context(app),
            report.state,
            one_line(report.description, (self.token,)),
            url if workflow and url else "",
        )
        try:
            latest = current if known else self.latest(revision, status.context)
            if latest is not None and (
                (latest.state, latest.description, latest.target_url)
                == (status.state, status.description, status.target_url)
            ):
                return "unchanged"
            self.gitea.create_status(self.repo, revision, status)
            self._posted(revision, status)
        except RemoteError as err:
            log.warning(
                "%s on %s: status %s not posted (%s); %s",
                status.context,
                revision[:12],
                status.state,
                err,
                "the next reconcile pass repairs it" if name is None else "a replay posts it",
            )
            return "not-posted"
        return "posted"
