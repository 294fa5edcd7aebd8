"""The tests' one bounded wait: a probe asked until it answers or a bound passes, and
then an error that says what was waited for and for how long.

Every wait on a server, a process, a controller or a file goes through ``until``, so
none sleeps bare, none waits forever, and each failure reads the same way:
``after 60 s, still waiting for <what>: <detail>``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    *,
    every: float = 0.2,
    error: Callable[[str], Exception] = AssertionError,
    alive: Callable[[], None] | None = None,
    detail: Callable[[], str] | None = None,
) -> T:
    """``probe``'s first true answer, asked every ``every`` seconds for up to
    ``timeout`` seconds. ``alive``, called between two asks, raises to end the wait at
    once (a process the wait hangs on has died). Past the bound: ``error`` with what was
    waited for, and ``detail()`` (a log's tail, the last answer) where given."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            said = f"after {timeout:.0f} s, still waiting for {what}"
            raise error(f"{said}: {detail()}" if detail is not None else said)
        time.sleep(every)
