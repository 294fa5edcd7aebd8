"""Verification after a deploy: did the digest written into an environment run well there?

A digest written into an environment's target (a build's write-back, a promotion, a
merged pull request) is **verified** once the environment's Argo CD Application is
Synced and Healthy, every pod of the app's image there runs that digest (its
``imageID``), each commit status of ``verify.checks`` is ``success`` on the built
commit, and those pods have stayed Ready, with no restart, for ``verify.soak``. It
**fails** as soon as a pod of the digest cannot run (a crash loop, an image it cannot
pull, a container that exits in error), the Application is Degraded, a check fails, or
when ``verify.timeout`` has passed since the digest was written without all of that.

``judge`` is a pure function of what was seen once (``Seen``) and the clock: the same
question asked again later gives the next answer, so whoever asks (the safety net's
pass, ``fabrique verify``, a loop) keeps no state between two looks; the soak is read
from the pods' own Ready times and restart counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple

Verdict = Literal["pending", "success", "failure"]

# a container that waits for one of these will not run by itself
STUCK = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


@dataclass(frozen=True)
class Container:
    """One container of a pod that runs the app's image, as its status says."""

    pod: str
    name: str
    image: str  # what the spec asked for
    image_id: str  # what runs: <repository>@sha256:… (empty until it started)
    ready: bool
    restarts: int
    waiting: str = ""  # the reason it waits, if it does
    message: str = ""  # what the kubelet said of it
    exit_code: int | None = None  # its last termination's, if it ended
    ready_since: datetime | None = None  # the pod's Ready condition, when True


@dataclass(frozen=True)
class Seen:
    """One look at an environment, for one digest."""

    digest: str
    written_at: datetime  # when verification began: its first look's pending status
    sync: str  # the Application's sync status: Synced, OutOfSync, Unknown
    health: str  # its health: Healthy, Progressing, Degraded, Missing, Suspended, Unknown
    health_message: str
    containers: Sequence[Container]  # of the pods that run the app's image
    checks: Mapping[str, str]  # each of verify.checks: its state on the built commit ("": none)


class Judgement(NamedTuple):
    verdict: Verdict
    reason: str


def _runs(container: Container, digest: str) -> bool:
    return container.image_id.endswith(f"@{digest}")


def _stuck(containers: Sequence[Container]) -> str | None:
    for c in containers:
        if c.waiting in STUCK:
            said = f": {c.message}" if c.message else ""
            return f"pod {c.pod} ({c.name}) is {c.waiting}, {c.restarts} restart(s){said}"
        if c.exit_code not in (None, 0) and c.restarts > 0:
            return f"pod {c.pod} ({c.name}) exited {c.exit_code}, {c.restarts} restart(s)"
    return None


def judge(
    seen: Seen, now: datetime, *, timeout: timedelta, soak: timedelta = timedelta(0)
) -> Judgement:
    """The verdict on ``seen.digest`` at ``now``, and why, in one line."""
    # the pods of the digest, and those of the same image that run anything else
    ours = [c for c in seen.containers if _runs(c, seen.digest)]
    # a container not started yet has no imageID: it is the digest's when its spec is
    starting = [c for c in seen.containers if not c.image_id and c.image.endswith(seen.digest)]
    stuck = _stuck([*ours, *starting])
    if stuck:
        return Judgement("failure", stuck)
    if seen.health == "Degraded" and seen.sync == "Synced":
        said = f": {seen.health_message}" if seen.health_message else ""
        return Judgement("failure", f"the Application is Degraded{said}")
    failed = {name: state for name, state in seen.checks.items() if state in ("failure", "error")}
    if failed:
        name, state = next(iter(failed.items()))
        return Judgement("failure", f"check {name} is {state}")
    missing = _missing(seen, ours)
    deadline = seen.written_at + timeout
    if missing:
        if now >= deadline:
            return Judgement("failure", f"not verified within {_span(timeout)}: {missing}")
        return Judgement("pending", missing)
    soaked = min((c.ready_since for c in ours if c.ready_since is not None), default=now) + soak
    if now < soaked:
        return Judgement("pending", f"Healthy; soaking until {soaked:%Y-%m-%dT%H:%M:%SZ}")
    return Judgement("success", f"Synced and Healthy, {len(_pods(ours))} pod(s) run it")


def _missing(seen: Seen, ours: list[Container]) -> str:
    """What verification still waits for, or "" when nothing."""
    if seen.sync != "Synced":
        return f"the Application is {seen.sync}, not Synced"
    if seen.health != "Healthy":
        said = f" ({seen.health_message})" if seen.health_message else ""
        return f"the Application is {seen.health}, not Healthy{said}"
    if not ours:
        return "no pod runs it yet"
    others = sorted({c.pod for c in seen.containers if c.image_id and not _runs(c, seen.digest)})
    if others:
        return f"pod(s) {', '.join(others[:3])} still run another digest"
    not_ready = sorted({c.pod for c in ours if not c.ready})
    if not_ready:
        return f"pod(s) {', '.join(not_ready[:3])} not Ready"
    if any(c.restarts for c in ours):
        restarted = sorted({c.pod for c in ours if c.restarts})
        return f"pod(s) {', '.join(restarted[:3])} restarted"
    waiting = [name for name, state in seen.checks.items() if state != "success"]
    if waiting:
        return f"check {waiting[0]} is {seen.checks[waiting[0]] or 'not posted'}"
    return ""


def _pods(containers: Sequence[Container]) -> set[str]:
    return {c.pod for c in containers}


def _span(span: timedelta) -> str:
    minutes, seconds = divmod(int(span.total_seconds()), 60)
    return f"{minutes}m" if not seconds else f"{minutes}m{seconds}s"


# -- what the API says ------------------------------------------------------------------


def parse_time(text: Any) -> datetime | None:
    """An RFC 3339 time as the API or Gitea writes it (``Z`` or an offset), else None."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def containers_of(pods: Sequence[Mapping[str, Any]], repository: str) -> list[Container]:
    """The containers of ``pods`` (as the API lists them) whose image is of
    ``repository`` (``registry:80/citation-dagster``), tag or digest whatever; a pod
    being deleted is left out: it runs no longer."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        ready_since = next(
            (
                parse_time(c.get("lastTransitionTime"))
                for c in status.get("conditions") or []
                if c.get("type") == "Ready" and c.get("status") == "True"
            ),
            None,
        )
        statuses = {c.get("name"): c for c in status.get("containerStatuses") or []}
        for spec in (pod.get("spec") or {}).get("containers") or []:
            image = str(spec.get("image") or "")
            if not _of(image, repository):
                continue
            state = statuses.get(spec.get("name")) or {}
            current = state.get("state") or {}
            waiting = current.get("waiting") or {}
            ended = current.get("terminated") or (state.get("lastState") or {}).get("terminated")
            found.append(
                Container(
                    pod=str(meta.get("name") or ""),
                    name=str(spec.get("name") or ""),
                    image=image,
                    image_id=str(state.get("imageID") or ""),
                    ready=bool(state.get("ready")),
                    restarts=int(state.get("restartCount") or 0),
                    waiting=str(waiting.get("reason") or ""),
                    message=str(waiting.get("message") or "")[:200],
                    exit_code=ended.get("exitCode") if isinstance(ended, dict) else None,
                    ready_since=ready_since,
                )
            )
    return found


def _of(image: str, repository: str) -> bool:
    """Whether ``image`` names ``repository``: ``<repository>:<tag>``, ``@<digest>``,
    or both."""
    name = image.split("@", 1)[0]
    if name == repository:
        return True
    base, _, tag = name.rpartition(":")
    return base == repository and "/" not in tag
