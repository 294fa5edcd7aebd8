"""The live tier: one real control plane and one real Gitea for the session
(``fixtures.py``); BuildKit, and a registry it reaches by name, for the build tests.

Every test under ``tests/live/`` is marked ``live`` (``tests/conftest.py``). Without Go
(>= 1.26) they skip, saying so; in CI (``CI`` set) a missing Go fails instead: CI never
skips the live tier.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from .. import servers
from ..oci import push_image
from ..servers import Registry
from .buildkit import Builder, builder
from .fixtures import need_go

BASE = "base/busybox"


@pytest.fixture(scope="session")
def buildkit() -> Iterator[Builder]:
    need_go()
    with builder() as ready:
        print(f"BuildKit: {ready.mode}")
        yield ready


@pytest.fixture(scope="session")
def named_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """The loopback registry under the machine's host name, which resolves to a loopback
    address but which BuildKit does not take for localhost: BuildKit speaks plain HTTP to
    ``localhost`` and ``127.0.0.0/8`` on its own, so only under another name is the
    rendered ``buildkitd.toml`` what makes the push work, as it must for ``registry:80``."""
    name = socket.gethostname()
    try:
        address = ipaddress.ip_address(socket.gethostbyname(name))
    except (OSError, ValueError):
        address = None
    if address is None or not address.is_loopback:
        pytest.fail(
            f"the host name {name!r} must resolve to a loopback address (Debian's /etc/hosts "
            f"has `127.0.1.1 {name}`): the build tests reach the registry by it",
            pytrace=False,
        )
    with servers.registry(tmp_path_factory.mktemp("named-registry"), name) as running:
        yield running


@pytest.fixture(scope="session")
def base_image(named_registry: Registry) -> str:
    """A busybox base image in the registry, for RUN steps without the Internet."""
    busybox = servers.require_binary("busybox")
    content = Path(busybox).read_bytes()
    push_image(
        named_registry.url,
        BASE,
        "1",
        {"bin/busybox": content, "bin/sh": content},
        executables=frozenset({"bin/busybox", "bin/sh"}),
    )
    return f"{named_registry.host}/{BASE}:1"
