"""`fabrique doctor eventbus` against a real nats-server with JetStream on loopback.

The stream and the durable consumer are shaped like Argo Events' own: stream ``default``
on ``default.*.*``, file storage, and a consumer filtered on ``default.gitea.push``.
"""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import ConsumerConfig, StorageType, StreamConfig

from .conftest import run_cli
from .servers import Nats as NatsServer
from .servers import free_port


async def _prepare(
    server: NatsServer, *, consumer: bool, storage: StorageType = StorageType.FILE
) -> None:
    nc = await nats.connect(server.url, token=server.token)
    try:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(
                name="default",
                subjects=["default.*.*"],
                storage=storage,
                num_replicas=1,
                max_age=72 * 3600,
            )
        )
        for n in range(3):
            await js.publish("default.gitea.push", f'{{"n": {n}}}'.encode())
        if consumer:
            await js.add_consumer(
                "default",
                ConsumerConfig(
                    durable_name="fabrique-build-push-citation", filter_subject="default.gitea.push"
                ),
            )
    finally:
        await nc.close()


def _doctor(server: NatsServer, token: str | None = None):  # type: ignore[no-untyped-def]
    return run_cli(
        "doctor",
        "eventbus",
        "--url",
        server.url,
        env={"FABRIQUE_NATS_TOKEN": server.token if token is None else token},
    )


def test_healthy_bus_reports_stream_and_consumer(nats_server: NatsServer) -> None:
    asyncio.run(_prepare(nats_server, consumer=True))
    result = _doctor(nats_server)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("stream default: 3 message(s), ")
    assert "storage file, replicas 1, max age 72h" in lines[0]
    assert lines[1] == (
        "consumer fabrique-build-push-citation (default.gitea.push): pending 3, awaiting ack 0, redelivered 0"
    )
    assert any(
        line.startswith("warning: replicas 1: a NATS restart can lose an event") for line in lines
    )
    assert nats_server.token not in result.stdout + result.stderr


def test_missing_consumer_fails(nats_server: NatsServer) -> None:
    asyncio.run(_prepare(nats_server, consumer=False))
    result = _doctor(nats_server)
    assert result.exit_code == 3
    assert "error: no consumer for default.gitea.push" in result.stdout
    assert "1 problem(s)" in result.stderr


def test_memory_storage_is_a_warning(nats_server: NatsServer) -> None:
    asyncio.run(_prepare(nats_server, consumer=True, storage=StorageType.MEMORY))
    result = _doctor(nats_server)
    assert result.exit_code == 0
    assert "warning: storage memory: the stream does not survive a restart" in result.stdout


def test_missing_stream_fails(nats_server: NatsServer) -> None:
    result = _doctor(nats_server)
    assert result.exit_code == 3
    assert "stream 'default' not found" in result.stderr


def test_wrong_token_is_refused_and_not_shown(nats_server: NatsServer) -> None:
    result = _doctor(nats_server, token="wrong-nats-token")
    assert result.exit_code == 3
    assert "authorization refused" in result.stderr
    assert "wrong-nats-token" not in result.stdout + result.stderr


def test_server_down() -> None:
    result = run_cli("doctor", "eventbus", "--url", f"nats://127.0.0.1:{free_port()}")
    assert result.exit_code == 75
    assert "unreachable" in result.stderr


@pytest.mark.parametrize("url", ["http://nats:4222", "nats"])
def test_bad_url(url: str) -> None:
    result = run_cli("doctor", "eventbus", "--url", url)
    assert result.exit_code == 2
    assert "must be nats://host:port" in result.stderr
