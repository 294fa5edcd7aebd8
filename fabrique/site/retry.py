"""The retry policy every network call follows: bounded attempts, exponential backoff
with full jitter. A value of the site model (``network.*``); the clients apply it."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 8.0

    def delay(self, attempt: int) -> float:
        """Exponential backoff with full jitter, for the ``attempt``-th retry (1-based)."""
        ceiling = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        return random.uniform(ceiling / 2, ceiling)


NO_RETRY = RetryPolicy(attempts=1)
