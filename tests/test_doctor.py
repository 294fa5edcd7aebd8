"""`fabrique doctor eventbus` against a real nats-server with JetStream on loopback.

The stream and the durable consumer are shaped like Argo Events' own: stream ``default``
on ``default.*.*``, file storage, and a consumer filtered on ``default.gitea.push``. The
bus of ``argo_bus`` is configured as Argo Events' controller configures a JetStream bus:
a user and a password, and TLS with a certificate that bears its CA's own subject
(``tests/live/test_events.py`` runs the doctor against the real one).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from nats.js.api import ConsumerConfig, StorageType, StreamConfig

from . import servers
from .conftest import run_cli
from .servers import Nats as NatsServer
from .servers import closed_port

ARGO_AUTH = "username: argo-bus-user\npassword: argo-bus-password-7f3e\n"


async def _prepare(
    server: NatsServer, *, consumer: bool, storage: StorageType = StorageType.FILE
) -> None:
    if server.tls:
        unverified = ssl.create_default_context()
        unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
        nc = await nats.connect(server.url, user=server.user, password=server.token, tls=unverified)
    else:
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


def test_every_consumer_is_read_past_jetstreams_page_of_256(nats_server: NatsServer) -> None:
    # a site of a thousand apps has a durable consumer per app's trigger; JetStream lists
    # consumers 256 at a time
    asyncio.run(_prepare(nats_server, consumer=True))

    async def more() -> None:
        nc = await nats.connect(nats_server.url, token=nats_server.token)
        try:
            js = nc.jetstream()
            for n in range(300):
                await js.add_consumer(
                    "default",
                    ConsumerConfig(durable_name=f"app-{n:03}", filter_subject="default.gitea.push"),
                )
        finally:
            await nc.close()

    asyncio.run(more())
    result = _doctor(nats_server)
    assert result.exit_code == 0, result.stderr
    listed = [line for line in result.stdout.splitlines() if line.startswith("consumer ")]
    assert len(listed) == 301
    assert listed[-1].startswith("consumer fabrique-build-push-citation ")


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
    result = run_cli("doctor", "eventbus", "--url", f"nats://127.0.0.1:{closed_port()}")
    assert result.exit_code == 75
    assert "unreachable" in result.stderr


@pytest.mark.parametrize("url", ["http://nats:4222", "nats"])
def test_bad_url(url: str) -> None:
    result = run_cli("doctor", "eventbus", "--url", url)
    assert result.exit_code == 2
    assert "must be nats://host:port" in result.stderr


# -- a bus as Argo Events' controller makes it ----------------------------------------------


def _certificate(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None,
    *,
    ca: bool = False,
    days: int = 365,
) -> x509.Certificate:
    """As the controller's ``createCert``: the CA and the server certificate share one
    subject and the service's DNS names."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("eventbus-default-js-svc.fabrique.svc")]),
            critical=False,
        )
        .sign(issuer_key, hashes.SHA256())
    )


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


@pytest.fixture()
def argo_bus(tmp_path: Path) -> Iterator[tuple[NatsServer, Path]]:
    """The bus with a user, a password and TLS, and the file of its CA."""
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "io.argoproj"),
            x509.NameAttribute(NameOID.COMMON_NAME, "eventbus-default-js-svc.fabrique.svc"),
        ]
    )
    ca_key, server_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = _certificate(subject, ca_key, ca=True)
    (tmp_path / "ca.crt").write_bytes(_pem(ca))
    (tmp_path / "server.crt").write_bytes(
        _pem(_certificate(subject, server_key, (subject, ca_key)))
    )
    (tmp_path / "server.key").write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    tls = (tmp_path / "server.crt", tmp_path / "server.key")
    with servers.nats(
        tmp_path / "jetstream", "argo-bus-password-7f3e", user="argo-bus-user", tls=tls
    ) as bus:
        yield bus, tmp_path / "ca.crt"


def _doctor_argo(bus: NatsServer, ca: Path | None, auth: str = ARGO_AUTH):  # type: ignore[no-untyped-def]
    return run_cli(
        "doctor",
        "eventbus",
        "--url",
        bus.url,
        *(("--tls-ca", str(ca)) if ca else ()),
        env={"FABRIQUE_NATS_CLIENT_AUTH": auth},
    )


def test_a_bus_made_as_argo_events_makes_it_is_read_with_its_client_auth_and_its_ca(
    argo_bus: tuple[NatsServer, Path],
) -> None:
    """Its certificate bears its CA's subject, which OpenSSL refuses as self-signed."""
    bus, ca = argo_bus
    asyncio.run(_prepare(bus, consumer=True))
    result = _doctor_argo(bus, ca)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[1].startswith("consumer fabrique-build-push-citation")
    assert "argo-bus-password-7f3e" not in result.stdout + result.stderr


def test_a_certificate_another_ca_issued_is_refused_and_named(
    argo_bus: tuple[NatsServer, Path], tmp_path: Path
) -> None:
    bus, _ = argo_bus
    other = tmp_path / "other-ca.crt"
    key = ec.generate_private_key(ec.SECP256R1())
    other.write_bytes(_pem(_certificate(x509.Name([]), key, ca=True)))
    result = _doctor_argo(bus, other)
    assert result.exit_code == 3, result.stderr
    assert result.stderr.strip().endswith(
        "TLS refused: the server's certificate was not issued by --tls-ca"
    )
    assert "argo-bus-password-7f3e" not in result.stdout + result.stderr


def test_a_tls_bus_without_its_ca_says_to_pass_it(argo_bus: tuple[NatsServer, Path]) -> None:
    bus, _ = argo_bus
    result = _doctor_argo(bus, None)
    assert result.exit_code == 3
    assert "TLS refused" in result.stderr
    assert "pass --tls-ca" in result.stderr


@pytest.mark.parametrize(
    ("auth", "named"),
    [
        ("argo-bus-password-7f3e", "not an EventBus client-auth"),
        ("username: argo-bus-user\n", "username without a password"),
        ("username: [argo-bus-password-7f3e]\npassword: x\n", "username must be a string"),
    ],
)
def test_a_client_auth_that_is_not_the_secrets_is_named_and_not_shown(
    auth: str, named: str
) -> None:
    result = run_cli(
        "doctor",
        "eventbus",
        "--url",
        f"nats://127.0.0.1:{closed_port()}",
        env={"FABRIQUE_NATS_CLIENT_AUTH": auth},
    )
    assert result.exit_code == 2
    assert f"FABRIQUE_NATS_CLIENT_AUTH: {named}" in result.stderr
    assert "argo-bus-password-7f3e" not in result.stderr


def test_a_wrong_password_is_refused_and_not_shown(argo_bus: tuple[NatsServer, Path]) -> None:
    bus, ca = argo_bus
    result = _doctor_argo(bus, ca, "username: argo-bus-user\npassword: wrong-bus-password\n")
    assert result.exit_code == 3
    assert "authorization refused" in result.stderr
    assert "wrong-bus-password" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("auth", "exit_code", "said"),
    [
        (ARGO_AUTH, 0, ""),
        (
            "username: argo-bus-user\npassword: wrong-bus-password\n",
            3,
            "error: EventBus at {url}: authorization refused; check the token\n",
        ),
    ],
    ids=["read", "refused"],
)
def test_only_fabriques_own_lines_reach_the_user_from_a_tls_bus(
    argo_bus: tuple[NatsServer, Path], auth: str, exit_code: int, said: str
) -> None:
    """Run as a person runs it, in a process of its own, where logging's last resort
    prints to stderr what asyncio logs (under pytest, its records go to the capture).
    The bus ends the TLS connection, after the report or on a refusal: asyncio's SSL
    transport warned of nats-py's stream asking to stay half-open."""
    bus, ca = argo_bus
    asyncio.run(_prepare(bus, consumer=True))
    doctor = ["doctor", "eventbus", "--url", bus.url, "--tls-ca", str(ca)]
    done = subprocess.run(
        [sys.executable, "-m", "fabrique", *doctor],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "FABRIQUE_NATS_CLIENT_AUTH": auth},
    )
    assert done.returncode == exit_code, done.stderr
    assert done.stderr == said.format(url=bus.url)


# ------------------------------------- objects of an earlier render, left in the cluster


def _in_cluster(doc: dict[str, object]) -> dict[str, object]:
    """``doc`` as the cluster lists it after ``kubectl apply -k``: the tree's labels on it."""
    from fabrique.site.objects import RENDERED_LABEL

    listed = copy.deepcopy(doc)
    meta = listed["metadata"]
    assert isinstance(meta, dict)
    meta["labels"] = {**meta.get("labels", {}), RENDERED_LABEL: "true"}
    return listed


def test_doctor_names_each_object_render_no_longer_makes() -> None:
    """A site that shrank, or whose Sensors were split anew: ``kubectl apply -k`` leaves
    the old objects (here a Sensor of the old split and a NetworkPolicy of an app gone),
    still triggering. The doctor names each, one line apiece; what render makes now is
    not named."""
    from bench.render import values_with
    from fabrique.gestures.doctor import leftovers
    from fabrique.render import render_tree
    from fabrique.site.config import parse_site

    site = parse_site(values_with(3))
    now = [doc for docs in render_tree(site).values() for doc in docs]
    old_sensor = next(d for d in now if d["kind"] == "Sensor")
    gone = [
        {**old_sensor, "metadata": {**old_sensor["metadata"], "name": "fabrique-build-7"}},
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "old-app-egress", "namespace": "old-app"},
            "spec": {},
        },
    ]
    cluster = [_in_cluster(d) for d in now if d["kind"] != "Kustomization"]
    # what a controller makes from a rendered object carries the label too, and its owner:
    # it is its owner's, never a leftover
    owned = _in_cluster({**gone[1], "metadata": {**gone[1]["metadata"], "name": "made-by-one"}})
    owned["metadata"]["ownerReferences"] = [{"kind": "Sensor", "name": "fabrique-build"}]
    cluster += [owned]
    cluster += [_in_cluster(d) for d in gone]

    def listed(api_version: str, plural: str) -> list[dict[str, object]]:
        return [d for d in cluster if d["apiVersion"] == api_version and _plural(d) == plural]

    found = leftovers(now, listed)
    assert [f.line() for f in found] == [
        "not rendered: NetworkPolicy old-app/old-app-egress (labelled "
        "fabrique.io/rendered=true, absent from what render makes now): delete it, or prune "
        "the site's objects (docs/operate/deploy.md)",
        "not rendered: Sensor fabrique/fabrique-build-7 (labelled fabrique.io/rendered=true, "
        "absent from what render makes now): delete it, or prune the site's objects "
        "(docs/operate/deploy.md)",
    ]
    cluster = cluster[: -len(gone)]
    assert leftovers(now, listed) == []


def _plural(doc: dict[str, object]) -> str:
    from fabrique.site.objects import RESOURCES

    return RESOURCES[str(doc["kind"])].plural
