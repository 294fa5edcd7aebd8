"""The live tier: one real control plane and one real Gitea for the session
(``fixtures.py``).

Every test under ``tests/live/`` is marked ``live``. Without Go (>= 1.26) they skip,
saying so; in CI (``CI`` set) a missing Go fails instead: CI never skips the live tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.live)
