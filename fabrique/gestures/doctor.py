"""``fabrique doctor eventbus``: what the EventBus's JetStream holds, and what is wrong.

It connects with the EventBus's own auth (a token, or a creds file; TLS with the bus's
CA), then reports Argo Events' stream (``default``, subjects ``default.<source>.<event>``)
and each consumer: pending, awaiting ack, redelivered. It warns about what loses events
(one replica; memory storage) and fails when the stream, or a consumer for the Sensor's
dependency on ``default.gitea.push``, is missing.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoServersError
from nats.js.errors import NotFoundError

from fabrique.site.errors import InputError, RemoteError
from fabrique.site.names import EVENT_NAME, EVENT_SOURCE, STREAM

SENSOR_SUBJECT = f"{STREAM}.{EVENT_SOURCE}.{EVENT_NAME}"


@dataclass(frozen=True)
class Consumer:
    name: str
    filter_subject: str
    pending: int
    ack_pending: int
    redelivered: int


@dataclass(frozen=True)
class Stream:
    name: str
    messages: int
    bytes: int
    storage: str
    replicas: int
    max_age_seconds: float
    consumers: list[Consumer] = field(default_factory=list)


@dataclass(frozen=True)
class Report:
    stream: Stream
    warnings: list[str]
    errors: list[str]

    def lines(self) -> list[str]:
        s = self.stream
        age = f"{s.max_age_seconds / 3600:g}h" if s.max_age_seconds else "unbounded"
        out = [
            f"stream {s.name}: {s.messages} message(s), {s.bytes} bytes, storage {s.storage}, "
            f"replicas {s.replicas}, max age {age}"
        ]
        for c in s.consumers:
            out.append(
                f"consumer {c.name} ({c.filter_subject or 'all subjects'}): pending {c.pending}, "
                f"awaiting ack {c.ack_pending}, redelivered {c.redelivered}"
            )
        out += [f"warning: {w}" for w in self.warnings]
        out += [f"error: {e}" for e in self.errors]
        return out


def diagnose(stream: Stream) -> Report:
    warnings, errors = [], []
    if stream.replicas < 3:
        warnings.append(
            f"replicas {stream.replicas}: a NATS restart can lose an event in flight; "
            "the reconcile CronWorkflow catches it up"
        )
    if stream.storage != "file":
        warnings.append(f"storage {stream.storage}: the stream does not survive a restart")
    if not stream.max_age_seconds:
        warnings.append("no max age: the stream grows until its byte limit")
    if not any(c.filter_subject in (SENSOR_SUBJECT, "", f"{STREAM}.>") for c in stream.consumers):
        errors.append(
            f"no consumer for {SENSOR_SUBJECT}: the Sensor fabrique-build is not listening "
            "(is it running, on this EventBus?)"
        )
    return Report(stream, warnings, errors)


async def _inspect(
    url: str, token: str | None, creds: Path | None, tls_ca: Path | None, timeout: float
) -> Stream:
    tls = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca else None
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc) or exc.__class__.__name__)

    host, _, port = url.split("://", 1)[1].rpartition(":")
    nc = NATS()
    connecting = False
    try:
        # nats-py keeps retrying a refused first connection: look before connecting
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
        writer.close()
        await writer.wait_closed()
        connecting = True
        await asyncio.wait_for(
            nc.connect(
                servers=[url],
                token=token,
                user_credentials=str(creds) if creds else None,
                tls=tls,
                connect_timeout=max(1, round(timeout)),
                allow_reconnect=False,
                max_reconnect_attempts=1,
                error_cb=on_error,
            ),
            timeout * 2,
        )
    except (TimeoutError, NoServersError, NatsError, OSError, ValueError) as exc:
        if connecting:
            await nc.close()  # a refused connection leaves its transport open otherwise
        detail = "; ".join(dict.fromkeys([*errors, str(exc)])) or exc.__class__.__name__
        if "authorization" in detail.lower():
            raise RemoteError(
                f"EventBus at {url}: authorization refused; check the token"
            ) from None
        raise RemoteError(
            f"EventBus at {url}: unreachable ({exc.__class__.__name__})", transient=True
        ) from None
    try:
        jsm = nc.jsm()
        try:
            info = await jsm.stream_info(STREAM, subjects_filter=None)
        except NotFoundError:
            raise RemoteError(
                f"EventBus at {url}: stream {STREAM!r} not found "
                "(has an EventSource published yet?)"
            ) from None
        consumers = await jsm.consumers_info(STREAM)
    except NatsError as exc:
        raise RemoteError(
            f"EventBus at {url}: JetStream answered {exc.__class__.__name__}", transient=True
        ) from None
    finally:
        await nc.close()
    storage = getattr(info.config.storage, "value", info.config.storage) or "file"
    return Stream(
        name=STREAM,
        messages=info.state.messages,
        bytes=info.state.bytes,
        storage=str(storage),
        replicas=info.config.num_replicas or 1,
        max_age_seconds=float(info.config.max_age or 0),
        consumers=[
            Consumer(
                name=c.name,
                filter_subject=c.config.filter_subject or "",
                pending=c.num_pending or 0,
                ack_pending=c.num_ack_pending or 0,
                redelivered=c.num_redelivered or 0,
            )
            for c in sorted(consumers, key=lambda c: c.name)
        ],
    )


def inspect(
    url: str,
    *,
    token: str | None = None,
    creds: Path | None = None,
    tls_ca: Path | None = None,
    timeout: float = 5.0,
) -> Report:
    if not url.startswith(("nats://", "tls://")):
        raise InputError(f"--url {url!r}: must be nats://host:port or tls://host:port")
    for name, path in (("--creds", creds), ("--tls-ca", tls_ca)):
        if path is not None and not path.is_file():
            raise InputError(f"{name} {path}: not found")
    return diagnose(asyncio.run(_inspect(url, token, creds, tls_ca, timeout)))
