"""``fabrique doctor``: what the EventBus's JetStream holds, and what the cluster holds
that render no longer makes.

``doctor leftovers``: ``kubectl apply -k`` creates and updates, never deletes. After a
site shrinks, or its Sensors are split anew, an earlier render's objects stay, a Sensor
still triggering for an old list of apps. Every object labelled ``RENDERED`` (the tree's
kustomization puts it on each one) of a kind render makes, and absent from what render
makes now, is named (``leftovers``).

``doctor eventbus``:

It connects as the EventSource and the Sensor do, with the EventBus's own client auth
(the Secret ``eventbus-<bus>-js-client-auth``: a user and a password for JetStream, or a
token; or a creds file) and TLS checked against the bus's CA, then reports Argo Events'
stream (``default``, subjects ``default.<source>.<event>``) and each consumer: pending,
awaiting ack, redelivered. It warns about what loses events (one replica; memory
storage) and fails when the stream, or a consumer for the Sensor's dependency on
``default.gitea.push``, is missing.

Only fabrique's lines reach the user: asyncio's own warning about a TLS connection the
bus closes is dropped where asyncio logs it (``quiet_tls_eof``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoServersError
from nats.js.api import ConsumerInfo
from nats.js.errors import NotFoundError
from nats.js.manager import JetStreamManager

from fabrique.site.errors import InputError, RemoteError
from fabrique.site.names import EVENT_NAME, EVENT_SOURCE, STREAM
from fabrique.site.objects import RENDERED, RESOURCES

SENSOR_SUBJECT = f"{STREAM}.{EVENT_SOURCE}.{EVENT_NAME}"
# What asyncio's SSL transport logs (sslproto, through the ``asyncio`` logger, which
# logging's last-resort handler prints to stderr) when the server ends a TLS connection
# and the protocol asks to stay half-open. nats-py upgrades its stream with
# ``loop.start_tls`` and a new StreamReaderProtocol that never learns it is over SSL
# (``_over_ssl`` is set in connection_made, which start_tls does not call), so every
# TLS connection the bus closes, or refuses, says it. Nothing is wrong: the connection
# closes as it must.
TLS_EOF_WARNING = "returning true from eof_received() has no effect when using ssl"


class _WithoutTlsEof(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != TLS_EOF_WARNING


@contextmanager
def quiet_tls_eof() -> Iterator[None]:
    """asyncio's ``TLS_EOF_WARNING`` dropped where asyncio logs it, while this lasts;
    every other line of asyncio's kept."""
    asyncio_log = logging.getLogger("asyncio")
    without = _WithoutTlsEof()
    asyncio_log.addFilter(without)
    try:
        yield
    finally:
        asyncio_log.removeFilter(without)


@dataclass(frozen=True)
class ClientAuth:
    """What the bus asks of a client: a token, or a user and a password (what Argo Events'
    controller writes for a JetStream bus). Never printed."""

    token: str | None = None
    username: str | None = None
    password: str | None = None

    def __repr__(self) -> str:
        return "ClientAuth(***)"

    @classmethod
    def parse(cls, client_auth: str | None, token: str | None) -> ClientAuth:
        """From the Secret's ``client-auth`` as it is (``FABRIQUE_NATS_CLIENT_AUTH``, YAML
        as Argo Events reads it: ``token``, or ``username`` and ``password``), or a bare
        token (``FABRIQUE_NATS_TOKEN``)."""
        where = "FABRIQUE_NATS_CLIENT_AUTH"
        if client_auth and token:
            raise InputError(f"{where} and FABRIQUE_NATS_TOKEN: set one, not both")
        if not client_auth:
            return cls(token=token or None)
        try:
            fields = yaml.safe_load(client_auth)
        except yaml.YAMLError:
            fields = None
        if not isinstance(fields, dict) or not fields.keys() & {"token", "username"}:
            raise InputError(
                f"{where}: not an EventBus client-auth (YAML with token, or username and "
                "password: the Secret eventbus-default-js-client-auth's client-auth)"
            )
        values = {}
        for key in ("token", "username", "password"):
            value = fields.get(key)
            if value is not None and not isinstance(value, str | int):
                raise InputError(f"{where}: {key} must be a string")
            values[key] = str(value) if value is not None else None
        if values["username"] and not values["password"]:
            raise InputError(f"{where}: username without a password")
        return cls(**values)


def _issued_by(ca_file: Path) -> ssl.SSLContext:
    """TLS that accepts the server's certificate when one of ``ca_file``'s certificates
    issued it (its name and signature, within its validity) or is it.

    Argo Events' controller gives the bus's certificate its CA's very subject, so OpenSSL
    takes it for self-signed and refuses it (error 18) whatever the CA file; the bus's own
    clients skip verification. The check runs when the handshake ends, before the
    credentials go out. The certificate's names are not checked: a port-forward reaches
    the bus as 127.0.0.1, and its CA is the bus's alone.
    """
    try:
        cas = x509.load_pem_x509_certificates(ca_file.read_bytes())
    except (ValueError, OSError):
        raise InputError(f"--tls-ca {ca_file}: not a PEM certificate") from None

    class Checked(ssl.SSLObject):
        def do_handshake(self) -> None:
            super().do_handshake()
            problem = _certificate_problem(self.getpeercert(binary_form=True), cas)
            if problem:
                refused = ssl.SSLCertVerificationError(problem)
                refused.verify_message = problem  # as OpenSSL's own refusals carry it
                raise refused

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the check is Checked's, not OpenSSL's
    context.sslobject_class = Checked
    return context


def _certificate_problem(der: bytes | None, cas: list[x509.Certificate]) -> str | None:
    if not der:
        return "the server sent no certificate"
    leaf = x509.load_der_x509_certificate(der)
    now = datetime.now(UTC)
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        return f"the server's certificate is not valid now (until {leaf.not_valid_after_utc})"
    for ca in cas:
        if leaf == ca:
            return None
        try:
            leaf.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return None
    return "the server's certificate was not issued by --tls-ca"


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
            f"no consumer for {SENSOR_SUBJECT}: no Sensor of fabrique is listening "
            "(is fabrique-build running, on this EventBus?)"
        )
    return Report(stream, warnings, errors)


async def consumers_of(jsm: JetStreamManager, stream: str) -> list[ConsumerInfo]:
    """Every consumer of ``stream``. JetStream lists them a page at a time (256, its
    ``JSApiListLimit``), and a site of a thousand apps has a consumer per app's trigger."""
    found: dict[str, ConsumerInfo] = {}
    while True:
        page = await jsm.consumers_info(stream, offset=len(found))
        fresh = {str(c.name): c for c in page if str(c.name) not in found}
        if not fresh:  # the end, or a server that ignores the offset
            return list(found.values())
        found.update(fresh)


async def _inspect(
    url: str, auth: ClientAuth, creds: Path | None, tls_ca: Path | None, timeout: float
) -> Stream:
    tls = _issued_by(tls_ca) if tls_ca else None
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
                token=auth.token,
                user=auth.username,
                password=auth.password,
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
            # a refused connection leaves its transport open otherwise; after a refused
            # TLS handshake nats-py's close never returns
            try:
                await asyncio.wait_for(nc.close(), timeout)
            except TimeoutError:
                pass
        if isinstance(exc, ssl.SSLError):
            reason = getattr(exc, "verify_message", None) or exc.strerror or str(exc)
            hint = "" if tls_ca else " (pass --tls-ca: eventbus-default-js-server's ca-cert)"
            raise RemoteError(f"EventBus at {url}: TLS refused: {reason}{hint}") from None
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
        consumers = await consumers_of(jsm, STREAM)
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
    auth: ClientAuth | None = None,
    creds: Path | None = None,
    tls_ca: Path | None = None,
    timeout: float = 5.0,
) -> Report:
    if not url.startswith(("nats://", "tls://")):
        raise InputError(f"--url {url!r}: must be nats://host:port or tls://host:port")
    for name, path in (("--creds", creds), ("--tls-ca", tls_ca)):
        if path is not None and not path.is_file():
            raise InputError(f"{name} {path}: not found")
    with quiet_tls_eof():
        stream = asyncio.run(_inspect(url, auth or ClientAuth(), creds, tls_ca, timeout))
    return diagnose(stream)


@dataclass(frozen=True, order=True)
class Leftover:
    """An object in the cluster that an earlier render made and the current one does not."""

    kind: str
    namespace: str
    name: str

    def line(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return (
            f"not rendered: {self.kind} {where} (labelled {RENDERED}, absent from what render "
            "makes now): delete it, or prune the site's objects (docs/operate/deploy.md)"
        )


def _identity(doc: dict[str, Any]) -> tuple[str, str, str]:
    meta = doc.get("metadata") or {}
    return str(doc.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name", ""))


def leftovers(
    rendered: Iterable[dict[str, Any]],
    listed: Callable[[str, str], list[dict[str, Any]]],
) -> list[Leftover]:
    """The objects ``listed(api_version, plural)`` gives (every one labelled ``RENDERED``,
    in every namespace) that are not in ``rendered``, kind by kind in ``RESOURCES``'
    order; an object another one owns (made by a controller from it) is its owner's."""
    made = {_identity(doc) for doc in rendered}
    found = []
    for kind, resource in RESOURCES.items():
        for item in listed(resource.api_version, resource.plural):
            if (item.get("metadata") or {}).get("ownerReferences"):
                continue
            identity = _identity({**item, "kind": kind})
            if identity not in made:
                found.append(Leftover(*identity))
    return found
