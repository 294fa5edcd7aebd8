"""``make test`` runs pytest on two workers, the live tier grouped on one (tests/conftest.py):
a pytest or pytest-xdist that stops grouping would start a control plane per worker,
silently. Run alone (no ``--dist loadgroup``), there is nothing to check."""

from __future__ import annotations

import pytest


def test_under_loadgroup_a_live_test_runs_in_the_live_group(request: pytest.FixtureRequest) -> None:
    grouped = getattr(request.config.option, "loadgroup", False)  # set on the workers
    assert not grouped or request.node.nodeid.endswith("@live"), request.node.nodeid
