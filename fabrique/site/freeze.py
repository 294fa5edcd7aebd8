"""Freeze windows: when nothing is written back or promoted into an environment.

A window opens at ``start`` and at each later occurrence of its RFC 5545 ``rrule``
(python-dateutil's ``rrule``, not parsed here), and lasts ``duration``. With a
``timezone`` (an IANA name) the recurrence keeps its wall-clock time across daylight
saving, as a calendar does: ``FREQ=WEEKLY;BYDAY=FR`` from 18:00 Europe/Paris opens at
18:00 in Paris in winter and in summer. Without one it keeps ``start``'s offset.

``frozen_at`` says whether a moment lies in any of a list of windows, and until when:
windows that overlap or touch make one freeze, which ends when the last of them does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

if TYPE_CHECKING:
    from dateutil.rrule import rrule

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?$")
# the longest window: a freeze longer than a year is no window, but a stop
LONGEST = timedelta(days=366)
# a recurrence finer than hourly is no calendar window (and costs the pass a long walk)
_TOO_FINE = {"SECONDLY", "MINUTELY"}
# windows chained end to end: a bound on the walk, far past any real calendar
_CHAINED = 64


def parse_duration(text: str) -> timedelta:
    """``30m``, ``64h``, ``3d``, ``1d12h``: ValueError, saying the form, otherwise."""
    found = _DURATION.match(text)
    if not text or found is None:
        raise ValueError(f"{text!r}: a duration is days, hours and minutes, as 3d, 64h, 1h30m")
    days, hours, minutes = (int(part or 0) for part in found.groups())
    duration = timedelta(days=days, hours=hours, minutes=minutes)
    if duration <= timedelta(0):
        raise ValueError(f"{text!r}: must last more than nothing")
    if duration > LONGEST:
        raise ValueError(f"{text!r}: longer than a year; a stop that long is a hold")
    return duration


def parse_span(text: str) -> timedelta:
    """A duration that may be nothing at all (``0m``: no soak), else ``parse_duration``."""
    return timedelta(0) if text == "0m" else parse_duration(text)


def zone(name: str) -> tzinfo:
    """The IANA time zone ``name``: ValueError naming it otherwise."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r}: no such time zone (an IANA name, as Europe/Paris)") from None


def first(start: datetime, timezone: str | None) -> datetime:
    """When the first window opens, on the clock of ``timezone`` (or ``start``'s)."""
    return start.astimezone(zone(timezone)) if timezone else start


# keyed by the zone's name too: two starts at one instant in two zones are equal (and
# hash alike) as datetimes, and recur differently
@lru_cache(maxsize=256)
def recurrence(rule: str, start: datetime, timezone: str | None = None) -> rrule:
    """``rule`` (an RRULE's value, ``FREQ=…;…``) from ``start`` on the clock of
    ``timezone``: ValueError saying why dateutil refused it, or why a window may not
    recur so."""
    from dateutil.rrule import rrulestr

    text = rule.removeprefix("RRULE:")
    if "\n" in text or "DTSTART" in text.upper():
        raise ValueError(f"{rule!r}: the rule alone (FREQ=…); its first window is start")
    try:
        parsed = rrulestr(text, dtstart=first(start, timezone), cache=True)
    except (ValueError, TypeError) as refused:
        raise ValueError(f"{rule!r}: not an RFC 5545 RRULE: {refused}") from None
    frequency = text.upper().partition("FREQ=")[2].split(";")[0]
    if frequency in _TOO_FINE:
        raise ValueError(f"{rule!r}: FREQ={frequency} is finer than a calendar's window")
    return parsed


@dataclass(frozen=True)
class Window:
    """One recurring window, as the site config gives it (``FreezeWindow``)."""

    start: datetime  # aware
    duration: timedelta
    reason: str
    rule: str | None = None
    timezone: str | None = None

    def opened(self, since: datetime, until: datetime) -> list[datetime]:
        """The windows' starts in [since, until]."""
        if self.rule is None:
            return [self.start] if since <= self.start <= until else []
        return list(
            recurrence(self.rule, self.start, self.timezone).between(since, until, inc=True)
        )

    def around(self, moment: datetime) -> datetime | None:
        """When the window holding ``moment`` ends, or None."""
        starts = self.opened(moment - self.duration, moment)
        ends = [start + self.duration for start in starts if start + self.duration > moment]
        return max(ends, default=None)


@dataclass(frozen=True)
class Frozen:
    """A freeze in force: until when, and why (its windows' reasons)."""

    until: datetime
    reason: str

    def describe(self) -> str:
        return f"frozen until {self.until.astimezone(UTC):%Y-%m-%dT%H:%MZ}: {self.reason}"


def frozen_at(windows: Sequence[Window], moment: datetime) -> Frozen | None:
    """The freeze ``moment`` lies in, or None: its end is the last end of the windows
    that hold it and of those that open before that end (a chain of windows is one
    freeze)."""
    if moment.tzinfo is None:
        raise ValueError("a freeze is judged at an aware moment (UTC)")
    holding = [(w, end) for w in windows if (end := w.around(moment)) is not None]
    if not holding:
        return None
    reasons = list(dict.fromkeys(w.reason for w, _ in holding))
    until = max(end for _, end in holding)
    for _ in range(_CHAINED):
        later = [(w, end) for w in windows if (end := w.around(until)) is not None]
        if not later or max(end for _, end in later) <= until:
            break
        reasons += [w.reason for w, _ in later if w.reason not in reasons]
        until = max(end for _, end in later)
    return Frozen(until, "; ".join(reasons))
