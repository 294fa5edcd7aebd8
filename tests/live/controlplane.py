"""A real control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, the Argo Workflows controller and kwok, built from the wrapper modules
of ``tests/peers/`` (``make peers``).

No kubelet runs: kwok plays the nodes and moves pods through the phases of
``stages.yaml``, and the tests play the executor where a step's outputs are needed. What
the API server, its admission (Pod Security, ValidatingAdmissionPolicy, ServiceAccount),
RBAC, the scheduler and the Argo controller decide is decided by the real programs.

``ControlPlane(folder, node=True)`` has a real node instead of kwok's two
(``tests/live/node.py``): containerd, the kubelet, kube-proxy, CoreDNS and a registry,
in a network namespace of the plane's own; the API server then listens on the host's end
of the node's veth (``address``), which pods reach through the ``kubernetes`` Service.
kwok keeps one node there, tainted, for the event path's pods alone: the tests run
their containers on the host (``events.py``), so nothing there is pulled or run.

The pytest session fixture (``tests/live/conftest.py``) starts one and stops it at the
end; ``make up`` starts the same for a person and leaves it running (``python -m
tests.live.controlplane up``), with a real Gitea beside it (``tests/live/gitea.py``, in
the folder's ``gitea/``); ``make down`` stops both. Everything lives in one folder:
the kubeconfig, the certificates, etcd's data, a log per process and ``state.json``
(the processes and ports), so ``up`` is replayable: a running plane is reported again.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import ipaddress
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from ..peers import build as peers
from ..servers import listens
from ..waits import until

if TYPE_CHECKING:
    from fabrique.site.config import Site

    from .gitea import Gitea
    from .node import Node

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

ARGO_MODULE = "github.com/argoproj/argo-workflows/v4"
EVENTS_MODULE = "github.com/argoproj/argo-events"
# the peers the control plane runs (tests/peers/ may hold others)
PLANE_PEERS = ("etcd", "kubernetes", "argo-workflows", "kwok")
WORKER = "kwok-worker-0"
CONTROL_PLANE = "kwok-control-plane-0"
# Beside a real node, one kwok node for the event path's pods, whose containers the
# tests run on the host (events.py): tainted, so that nothing else lands there, the
# build's and the app's pods least of all
EVENTS_NODE = "kwok-events-0"
EVENTS_TAINT = {"key": "fabrique.test/kwok", "value": "event-path", "effect": "NoSchedule"}
EVENTS_VOLUMES = 4
ARGO_NAMESPACE = "argo"
# the peers a plane with a real node runs: its node's programs instead of kwok
NODE_PEERS = (
    "etcd",
    "kubernetes",
    "argo-workflows",
    "kwok",
    "containerd",
    "coredns",
    "kube-network-policies",
)
SERVICE_CIDR = "10.0.0.0/24"
# the user the node's NetworkPolicy engine reads the API as (its token in netpol.token)
NETPOL_USER = "fabrique-live-netpol"
# namespaces a cluster running fabrique already has: Argo's, Argo Events', the site's Gitea
SITE_NAMESPACES = (ARGO_NAMESPACE, "argo-events", "gitea")


class ControlPlaneError(RuntimeError):
    """A peer did not start or answer: the message names it and its log."""


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range.

    A port the kernel hands out for bind(0) comes from the ephemeral range, which the
    peers' own outgoing connections (every watch of every controller) draw from too:
    between choosing it and the peer binding it, one of them may take it. Below that
    range only a listener takes a port."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(10000, max(10001, low - 1))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ControlPlaneError("no free loopback port below the ephemeral range")


def established(crd: dict[str, Any]) -> bool:
    """A CRD the API server serves: its condition Established is True (a CRD just
    created has no conditions yet, on which `kubectl wait` errs rather than waits)."""
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def write_secret(path: Path, content: str | bytes) -> None:
    """Write a secret file of the plane (a key, a token, a password, a kubeconfig): mode
    0600 from its creation, and a file already there is made 0600 before the new content
    goes in (``touch(mode=…)`` and ``open`` leave an existing file's mode as it was)."""
    data = content.encode() if isinstance(content, str) else content
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(data)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _certificates(folder: Path, host: str | None = None) -> None:
    """A CA, a serving certificate for 127.0.0.1 and localhost, and the ServiceAccount
    signing key pair. With a real node, the certificate names the API server as pods
    reach it too: ``host`` (where it listens), the ``kubernetes`` Service's IP and
    names."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fabrique-live-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    *(_in_cluster_names(host) if host else []),
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    write_secret(folder / "ca.key", _pem_key(ca_key))
    (folder / "apiserver.crt").write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    write_secret(folder / "apiserver.key", _pem_key(key))
    write_secret(folder / "sa.key", _pem_key(sa_key))
    (folder / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _in_cluster_names(host: str) -> list[x509.GeneralName]:
    service = next(ipaddress.ip_network(SERVICE_CIDR).hosts())
    names: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address(host)),
        x509.IPAddress(service),
    ]
    for name in ("kubernetes", "kubernetes.default", "kubernetes.default.svc.cluster.local"):
        names.append(x509.DNSName(name))
    return names


@dataclass
class ControlPlane:
    """The folder of one control plane, and what runs in it."""

    folder: Path
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    token: str = ""
    bins: dict[str, str] = field(default_factory=dict)
    # a real node (tests/live/node.py) in place of kwok's
    node: bool = False
    worker: Node | None = None
    # the processes this one started (a loaded plane knows their pids only)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "kubeconfig"

    @property
    def address(self) -> str:
        """Where the API server listens: loopback, or with a real node the host's end of
        the node's veth, which pods reach."""
        return self.worker.address if self.worker else "127.0.0.1"

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.ports['apiserver']}"

    # -- the real node (node=True) --------------------------------------------------------

    @property
    def real_node(self) -> Node:
        if self.worker is None:
            raise ControlPlaneError(f"the plane in {self.folder} has no real node")
        return self.worker

    @property
    def node_name(self) -> str:
        return self.real_node.name

    @property
    def node_ip(self) -> str:
        return self.real_node.ip

    @property
    def registry(self) -> str:
        """The plane's registry as the host reaches it (``host:80``); pods and
        containerd know it as ``registry:80``, and as docker.io's and quay.io's mirror."""
        return self.real_node.registry

    @property
    def images(self) -> dict[str, Any]:
        """What ``images.push_node_images`` pushed to the registry at start."""
        return self.real_node.images

    def in_node(self, argv: list[str], cwd: Path | None = None) -> list[str]:
        """``argv`` prefixed to run as the node's programs run: in its network namespace
        (pod and Service IPs reachable) and its mount namespace, whose resolver is
        CoreDNS (``gitea-http.gitea.svc.cluster.local`` resolves) and whose ``/run`` is
        the node's (containerd's socket, ``/run/containerd/containerd.sock``). It starts
        in ``cwd``, else ``/``."""
        return self.real_node.in_node(argv, cwd)

    def in_netns(self, argv: list[str]) -> list[str]:
        """``argv`` prefixed to run in the node's network namespace only, with the
        host's files and mounts: pod and Service IPs are reachable, but not the host's
        resolver."""
        return self.real_node.in_netns(argv)

    def expose(self, namespace: str, name: str, port: int, target_port: int) -> None:
        """A host service to pods by name: the Service ``name`` in ``namespace`` (made if
        missing), port ``port``, whose one endpoint is the host's end of the veth, port
        ``target_port`` (the service must listen there, or on every address)."""
        self.kubectl("create", "namespace", namespace, check=False)
        self.kubectl(
            "apply",
            "--server-side",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(_exposed(namespace, name, port, target_port, self.address)),
        )

    @property
    def state_file(self) -> Path:
        return self.folder / "state.json"

    # -- state: what `make down` and a second `make up` read ------------------------------

    def save(self) -> None:
        state: dict[str, Any] = {"ports": self.ports, "pids": self.pids, "bins": self.bins}
        if self.node:
            state["node"] = self.worker.state() if self.worker else None
        self.state_file.write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, folder: Path) -> ControlPlane | None:
        try:
            state = json.loads((folder / "state.json").read_text())
            token = (folder / "admin.token").read_text().strip()
        except (OSError, ValueError):
            return None
        plane = cls(folder, state["ports"], state["pids"], token, state.get("bins", {}))
        if "node" in state:
            from .node import Node

            plane.node = True
            plane.worker = Node.from_state(folder, state["node"]) if state["node"] else None
        return plane

    def alive(self) -> bool:
        """Every process runs and the API server is ready."""
        return all(_exited(pid) is None for pid in self.pids.values()) and self._ready()

    # -- start ----------------------------------------------------------------------------

    def start(self, bins: dict[str, Path], attempts: int = 3) -> ControlPlane:
        """Start every peer; a port taken meanwhile (by a listener outside this plane)
        is a new try on new ports, up to ``attempts``."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start(bins)
            except ControlPlaneError as failed:
                if "address already in use" not in str(failed) or attempt == attempts:
                    raise
                print(f"# control plane: a port was taken, try {attempt + 1}", file=sys.stderr)
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self, bins: dict[str, Path]) -> ControlPlane:
        self.folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.folder / "etcd", ignore_errors=True)  # every start is a new cluster
        self.bins = {name: str(path) for name, path in bins.items()}
        self.ports.clear()
        for name in ("etcd", "apiserver", "etcd-peer", "controller-manager", "scheduler"):
            self.ports[name] = free_port()
        for name in ("argo-metrics", "argo-telemetry", "kwok"):
            self.ports[name] = free_port()
        try:
            if self.node:
                self._claim_node()
            _certificates(self.folder, self.worker.address if self.worker else None)
            self._write_credentials(secrets.token_hex(16))
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
            self._install()
            if self.worker:
                self._start_node(self.worker)
            self._start_argo()
            self._start_kwok()
        except BaseException:
            self.stop()
            raise
        self.save()
        return self

    def _claim_node(self) -> None:
        """The node's index, network namespace and veth: first, since the API server
        listens on the veth's host end and its certificate names it."""
        from .node import Node

        self.worker = Node.claim(self.folder)
        self.save()  # from here on, a stop (after a crash too) knows what to remove
        self.worker.network()

    def _start_node(self, node: Node) -> None:
        started = time.monotonic()
        node.start_registry(self)
        node.push_images()
        self.save()
        pushed = time.monotonic()
        node.hold_mounts(self)
        node.cgroups()
        node.start_containerd(self)
        node.start_kubelet(self)
        node.start_kube_proxy(self)
        node.start_coredns(self)
        node.start_world(self)
        node.start_netpol(self)
        print(
            f"# node {node.name}: its images in {pushed - started:.0f} s, then Ready with "
            f"its Services, DNS, NetworkPolicies and outside world in "
            f"{time.monotonic() - pushed:.0f} s",
            file=sys.stderr,
        )

    def _write_credentials(self, token: str) -> None:
        """The admin's token (``system:masters``), in the API server's token file and in
        the kubeconfig."""
        self.token = token
        write_secret(self.folder / "admin.token", token + "\n")
        users = f'{token},fabrique-live-admin,fabrique-live-admin,"system:masters"\n'
        if self.worker:
            # the node's NetworkPolicy engine: a user of its own, bound to what it reads
            engine = secrets.token_hex(16)
            write_secret(self.folder / "netpol.token", engine + "\n")
            users += f"{engine},{NETPOL_USER},{NETPOL_USER}\n"
        write_secret(self.folder / "tokens.csv", users)
        self.write_kubeconfig(self.kubeconfig, namespace="default")

    def write_kubeconfig(self, path: Path, namespace: str, token: str | None = None) -> None:
        """A kubeconfig of this plane: the admin's, or the holder of ``token``'s."""
        ca = base64.b64encode((self.folder / "ca.crt").read_bytes()).decode()
        write_secret(
            path,
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "fabrique-live",
                            "cluster": {
                                "server": self.server,
                                "certificate-authority-data": ca,
                            },
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": token or self.token}}],
                    "contexts": [
                        {
                            "name": "fabrique-live",
                            "context": {
                                "cluster": "fabrique-live",
                                "user": "admin",
                                "namespace": namespace,
                            },
                        }
                    ],
                    "current-context": "fabrique-live",
                }
            ),
        )

    def _spawn(self, name: str, argv: Iterable[str], env: dict[str, str] | None = None) -> None:
        process = spawn(self.folder, name, argv, {**os.environ, **(env or {})})
        self.processes[name] = process
        self.pids[name] = process.pid
        self.save()

    def _died(self, name: str) -> str | None:
        return _exited(self.pids[name])

    def _wait(self, name: str, ready: Any, timeout: float) -> None:
        wait_on(
            self.pids[name], name, f"{name} to be ready", ready, timeout, lambda: self.tail(name)
        )

    def tail(self, name: str, lines: int = 15) -> str:
        return log_tail(self.folder, name, lines)

    def _start_etcd(self) -> None:
        client, peer = self.ports["etcd"], self.ports["etcd-peer"]
        self._spawn(
            "etcd",
            [
                self.bins["etcd"],
                "--name=live",
                f"--data-dir={self.folder / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=live=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",  # a test store: speed over durability, as envtest does
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: _http_ok(f"http://127.0.0.1:{client}/health"), 30)

    def _start_apiserver(self) -> None:
        f = self.folder
        if self.worker:
            # the default endpoint reconciler, so the `kubernetes` Service leads pods to
            # the host's end of the veth; the kubelet reached at the node's InternalIP,
            # not its name, which nothing on the host resolves
            node = ["--kubelet-preferred-address-types=InternalIP"]
        else:
            # the `kubernetes` Service's endpoint would be 127.0.0.1, which endpoints refuse
            node = ["--endpoint-reconciler-type=none"]
        self._spawn(
            "apiserver",
            [
                self.bins["kube-apiserver"],
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={self.ports['apiserver']}",
                f"--tls-cert-file={f / 'apiserver.crt'}",
                f"--tls-private-key-file={f / 'apiserver.key'}",
                f"--client-ca-file={f / 'ca.crt'}",
                f"--token-auth-file={f / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                # the default admission plugins, PodSecurity and ValidatingAdmissionPolicy
                # among them: none is turned off
                "--allow-privileged=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={f / 'sa.pub'}",
                f"--service-account-signing-key-file={f / 'sa.key'}",
                *node,
                "--profiling=false",
                "--v=0",
            ],
        )
        self._wait("apiserver", self._ready, 90)

    def _ready(self) -> bool:
        try:
            answer = httpx.get(
                f"{self.server}/readyz",
                headers={"Authorization": f"Bearer {self.token}"},
                verify=ssl.create_default_context(cafile=str(self.folder / "ca.crt")),
                timeout=2,
            )
        except (httpx.HTTPError, OSError, KeyError):
            return False
        return answer.status_code == 200

    def _start_controllers(self) -> None:
        f, kubeconfig = self.folder, str(self.kubeconfig)
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
        ]
        self._spawn(
            "controller-manager",
            [
                self.bins["kube-controller-manager"],
                *common,
                f"--secure-port={self.ports['controller-manager']}",
                f"--cert-dir={f / 'controller-manager'}",
                # every on-by-default controller, as a cluster runs them: among them the
                # ServiceAccount and token controllers, namespaces, garbage collection,
                # volume binding, the node lifecycle (it lifts the not-ready taint once
                # kwok reports Ready) and the admission policies' type checking
                "--controllers=*",
                f"--service-account-private-key-file={f / 'sa.key'}",
                f"--root-ca-file={f / 'ca.crt'}",
                # its FlexVolume prober makes this folder: the plane's, not
                # /usr/libexec/kubernetes/kubelet-plugins/volume/exec on the machine
                f"--flex-volume-plugin-dir={f / 'flexvolume'}",
            ],
        )
        self._spawn(
            "scheduler",
            [
                self.bins["kube-scheduler"],
                *common,
                f"--secure-port={self.ports['scheduler']}",
                f"--cert-dir={f / 'scheduler'}",
            ],
        )
        self._wait(
            "controller-manager",
            lambda: _https_ok(f"https://127.0.0.1:{self.ports['controller-manager']}/healthz"),
            60,
        )
        self._wait(
            "scheduler",
            lambda: _https_ok(f"https://127.0.0.1:{self.ports['scheduler']}/healthz"),
            60,
        )

    def metrics(self) -> dict[str, float]:
        """The Argo controller's metrics, as ``name{labels}`` (Prometheus' own text) to
        value: what a Prometheus scraping it would store."""
        text = httpx.get(f"http://127.0.0.1:{self.ports['argo-metrics']}/metrics").text
        series = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                series[key] = float(value)
        return series

    # -- what a cluster running fabrique has before fabrique ------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [self.bins["kubectl"], f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def _install(self) -> None:
        # the full CRDs, as the upstream installs ship them, from the same modules
        argo = module_dir(ARGO_MODULE, self.argo_version())
        events = module_dir(EVENTS_MODULE, self.events_version())
        crds = [*sorted((argo / "manifests/base/crds/full").glob("argoproj.io_*.yaml"))]
        crds += sorted((events / "manifests/base/crds").glob("argoproj.io_*.yaml"))
        self.kubectl("apply", "--server-side", *(f"--filename={c}" for c in crds))
        self._wait("apiserver", lambda: self._established(len(crds)), 60)
        for namespace in SITE_NAMESPACES:
            self.kubectl("create", "namespace", namespace, check=False)
        # a default StorageClass and local volumes on both nodes, as a provisioner would
        # make them: a claim (the EventBus's JetStream storage) binds to one
        if self.worker:
            # on the real node, each a folder of the plane's, writable by every user as
            # local-path-provisioner makes them (the build's steps run as non-root)
            volumes = self.worker.dir / "volumes"
            for index in range(40):
                (volumes / f"local-{index}").mkdir(parents=True, exist_ok=True)
                (volumes / f"local-{index}").chmod(0o777)
            storage = _storage_yaml(40, (self.worker.name, volumes))
        else:
            storage = _storage_yaml(40)
        self.kubectl("apply", "--server-side", "-f", "-", stdin=storage)
        self.kubectl("apply", "--server-side", "-f", "-", stdin=_nodes_yaml(events_only=self.node))

    def _established(self, count: int) -> bool:
        """All ``count`` CRDs are Established (`kubectl wait` errs on one that has no
        conditions yet, as a CRD just created has)."""
        listed = json.loads(self.kubectl("get", "crd", "-o", "json"))["items"]
        return len(listed) == count and all(established(crd) for crd in listed)

    def argo_version(self) -> str:
        return peers.Peer("argo-workflows", ROOT / "tests/peers/argo-workflows").required(
            ARGO_MODULE
        )

    def events_version(self) -> str:
        """Argo Events' version, as the lock pins it for the live tier (its CRDs only)."""
        lock = yaml.safe_load((ROOT / "vendor/lock.yaml").read_text())
        return str(lock["peers"]["argo-events"]["version"])

    def _start_argo(self) -> None:
        config = {
            "metricsConfig": yaml.safe_dump(
                {"enabled": True, "port": self.ports["argo-metrics"], "secure": False}
            ),
            "telemetryConfig": yaml.safe_dump(
                {"enabled": True, "port": self.ports["argo-telemetry"], "secure": False}
            ),
        }
        self.kubectl(
            "apply",
            "--server-side",
            "-f",
            "-",
            stdin=yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": "workflow-controller-configmap",
                        "namespace": ARGO_NAMESPACE,
                    },
                    "data": config,
                }
            ),
        )
        argo_kubeconfig = self.folder / "argo.kubeconfig"
        self.write_kubeconfig(argo_kubeconfig, namespace=ARGO_NAMESPACE)
        self._spawn(
            "workflow-controller",
            [
                self.bins["workflow-controller"],
                f"--kubeconfig={argo_kubeconfig}",
                "--executor-image=quay.io/argoproj/argoexec:" + self.argo_version(),
                "--loglevel=info",
            ],
            env=controller_env(real_node=self.node),
        )
        self._wait(
            "workflow-controller",
            lambda: _http_ok(f"http://127.0.0.1:{self.ports['argo-metrics']}/metrics"),
            60,
        )

    def _start_kwok(self) -> None:
        self._spawn(
            "kwok",
            [
                self.bins["kwok"],
                f"--kubeconfig={self.kubeconfig}",
                "--config=" + str(HERE / "stages.yaml"),
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--server-address=127.0.0.1:{self.ports['kwok']}",
                "--node-ip=127.0.0.1",
            ],
        )
        self._wait("kwok", self._nodes_ready, 60)

    def _nodes_ready(self) -> bool:
        """Both nodes Ready: kwok's two, or the real node and kwok's event-path node."""
        out = self.kubectl(
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        return out.split() == ["True", "True"]

    # -- stop -----------------------------------------------------------------------------

    def stop_peer(self, name: str) -> None:
        """Stop one of its processes and leave the others running (a bench that plays the
        Argo controller's part itself stops the real one, so that only one acts)."""
        pid = self.pids.pop(name)
        _terminate([pid])
        process = self.processes.pop(name, None)
        if process is not None:
            process.wait(timeout=10)
        self.save()

    def stop(self) -> None:
        """Stop every process; with a real node, then what is left of it (its pods'
        processes, cgroups, namespaces: ``Node.teardown``). Again after a crash, from
        ``state.json``: what is already gone is skipped."""
        # the kubelet first: it would start again what containerd loses
        first = [self.pids[name] for name in ("kubelet",) if name in self.pids]
        _terminate(first)
        _terminate([pid for pid in reversed(self.pids.values()) if pid not in first])
        for process in self.processes.values():
            process.wait(timeout=10)
        self.processes.clear()
        self.pids.clear()
        if self.worker:
            self.worker.teardown()
            self.worker = None
        if self.state_file.exists():
            self.state_file.unlink()


def _exited(pid: int) -> str | None:
    """How process ``pid`` ended, or None while it runs (a child of this process is
    reaped; one started by an earlier ``make up`` is only looked for)."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return "exited"
        return "exited" if state in ("Z", "X") else None  # a zombie nobody reaps ended too
    return f"exited with status {status >> 8}" if done else None


def _terminate(pids: list[int], grace: float = 3, reaped: float = 10) -> None:
    """SIGTERM to every process group at once, then SIGKILL to those still there after
    ``grace`` seconds (the API server and the Argo controller drain for longer, and
    nothing of a test cluster is worth keeping), and return once every one has ended: a
    process of several gigabytes, or one in an fsync, takes a while to go after SIGKILL,
    and whoever stopped it must not see it run. Still there ``reaped`` seconds after
    SIGKILL, it is an error naming it."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
    running = _running(pids, grace)
    for pid in running:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    left = _running(running, reaped)
    if left:
        raise ControlPlaneError(
            f"process {', '.join(map(str, left))} still runs {reaped:g} s after SIGKILL"
        )


# The plane's own settings of the Argo Workflows controller, none of which fabrique's
# install sets (the test asserts they never overlap).
PLANE_ONLY = {
    # one controller process, no Lease to take
    "LEADER_ELECTION_DISABLE": "true",
    # on kwok's nodes no executor runs to report a step's outputs unless a test plays it:
    # a step without a report is taken as done after this, not after 10 minutes (a real
    # node's executor reports)
    "TASK_RESULT_TIMEOUT_DURATION": "3s",
    # a pod missing from a node that started more than this ago is "pod deleted" (Error),
    # not made again (podReconciliation; 10 s upstream): the fault tests delete pods
    "RECENTLY_STARTED_POD_DURATION": "3s",
}


def controller_env(*, real_node: bool) -> dict[str, str]:
    """The workflow controller's environment: exactly what fabrique's install sets
    (vendor/argo-workflows/settings, the requeue time among them), then the plane's own."""
    from fabrique.gestures.vendor import controller_settings

    own = dict(PLANE_ONLY)
    if real_node:  # its executor reports
        del own["TASK_RESULT_TIMEOUT_DURATION"]
    return {**controller_settings(ROOT / "vendor"), **own}


def spawn(
    folder: Path, name: str, argv: Iterable[str | Path], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Process ``name`` of a plane, started in ``folder`` with ``env`` and nothing else,
    its output in ``<folder>/<name>.log``; in a session of its own, so that ``make up``
    leaves it running after the command ends."""
    with (folder / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            [str(part) for part in argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            env=env,
            start_new_session=True,
        )


def log_tail(folder: Path, name: str, lines: int = 15) -> str:
    """The last ``lines`` of process ``name``'s log, as errors quote it."""
    log = folder / f"{name}.log"
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    return f"log {log}:\n" + "\n".join(text[-lines:])


def wait_on(
    pid: int, name: str, what: str, ready: Any, timeout: float, tail: Callable[[], str]
) -> None:
    """Back once ``ready()`` is true. Process ``pid`` (``name``), which ``ready`` hangs
    on, dead first, or ``timeout`` seconds passed: a ControlPlaneError with ``tail()``,
    its log's last lines."""

    def alive() -> None:
        died = _exited(pid)
        if died:
            raise ControlPlaneError(f"{name} {died} while waiting for {what}: {tail()}")

    until(what, ready, timeout, error=ControlPlaneError, alive=alive, detail=tail)


def _running(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still running after up to ``seconds`` of waiting for them."""
    deadline = time.monotonic() + seconds
    running = [pid for pid in pids if _exited(pid) is None]
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = [pid for pid in running if _exited(pid) is None]
    return running


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except (httpx.HTTPError, OSError):
        return False


def _https_ok(url: str) -> bool:
    # the controllers' own self-signed serving certificates: only liveness is asked
    try:
        return httpx.get(url, timeout=2, verify=False).status_code == 200
    except (httpx.HTTPError, OSError):
        return False


def module_dir(module: str, version: str) -> Path:
    """The module's folder in the Go module cache, downloaded first if need be."""
    go = peers.find_go()
    if go is None:
        raise ControlPlaneError("Go is not installed: the live tier needs it")
    return Path(peers.download(go, module, version)["Dir"])


def _nodes_yaml(events_only: bool = False) -> str:
    """A worker and a control-plane node, labelled as kubeadm labels them; kwok plays
    both (the annotation). The control plane is left untainted, as on a small cluster
    whose control-plane node takes workloads: only the builder's own node affinity keeps
    it (and every pod of its workspace) off there. ``events_only``: beside a real node,
    the one tainted kwok node of the event path's pods instead."""
    nodes = []
    chosen = ((EVENTS_NODE, False),) if events_only else ((WORKER, False), (CONTROL_PLANE, True))
    for name, control_plane in chosen:
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}
        if control_plane:
            labels["node-role.kubernetes.io/control-plane"] = ""
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
        }
        if events_only:
            node["spec"] = {"taints": [EVENTS_TAINT]}
        nodes.append(node)
    return yaml.safe_dump_all(nodes)


def _storage_yaml(volumes: int, real: tuple[str, Path] | None = None) -> str:
    """A default WaitForFirstConsumer class and local volumes on every node, the
    control plane's too: where a claim binds is the scheduler's choice, as on a cluster
    whose control-plane node takes workloads. With ``real`` (a node's name and a folder),
    every volume is on that node, a folder in that folder, but a few on the event path's
    kwok node, for its bus's claim."""
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": "local",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        }
    ]
    for index in range(volumes + (EVENTS_VOLUMES if real else 0)):
        node = WORKER if index % 2 == 0 else CONTROL_PLANE
        path = f"/mnt/local-{index}"
        if real:
            node = real[0] if index < volumes else EVENTS_NODE
            if index < volumes:
                path = str(real[1] / f"local-{index}")
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"local-{index}"},
                "spec": {
                    "capacity": {"storage": "100Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": "local",
                    "local": {"path": path},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [node],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
            }
        )
    return yaml.safe_dump_all(docs)


def _exposed(
    namespace: str, name: str, port: int, target_port: int, host: str
) -> list[dict[str, Any]]:
    """A Service with no selector and its EndpointSlice: ``host:target_port``."""
    meta = {"name": name, "namespace": namespace}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {"ports": [{"name": "main", "port": port, "targetPort": target_port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-host",
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "fabrique-live",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "main", "port": target_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        },
    ]


def binaries(names: tuple[str, ...] = PLANE_PEERS) -> dict[str, Path]:
    """Every binary of the peers ``names`` (by default, those the control plane runs),
    built first if need be."""
    go = peers.find_go()
    if go is None:
        raise ControlPlaneError(
            f"Go >= {peers.MIN_GO[0]}.{peers.MIN_GO[1]} is not installed: the live tier builds "
            "its peers with it (make peers)"
        )
    found: dict[str, Path] = {}
    for peer in peers.peers():
        if peer.name not in names:
            continue
        where = peers.build(peer, go)
        for name in peer.binaries().values():
            found[name] = where / name
    return found


def _start_argo_events(plane: ControlPlane) -> None:
    """The Argo Events controller of the upstream bundle beside the plane's own
    (``tests/live/events.py``), the default site applied, and its event path running as
    the tests run it: the bus, the EventSource and the Sensor, from the pods the
    controller makes. Their processes are the plane's, stopped by ``make down``; where
    to reach them is written to ``event-path.json``."""
    # imported here: these build on this module
    from fabrique.site.config import load_site

    from .cluster import Cluster
    from .events import ArgoEvents, start_event_path
    from .fixtures import apply_site

    site = load_site(env={})
    cluster = Cluster(plane)
    # a new cluster's pods: the volumes an earlier plane's left (its Secrets, the bus's
    # store) would be taken for theirs, and the bus would refuse its new client auth
    shutil.rmtree(plane.folder / "argo-events", ignore_errors=True)
    events = ArgoEvents(cluster, plane.folder / "argo-events")
    try:
        # the tree first: beside a real node, the controller places the event path's
        # pods on kwok's node from its first deployment (events.keep_off_the_node)
        values = plane.folder / "site.yaml"
        values.write_text(yaml.safe_dump(site_values(plane)))
        apply_site(cluster, render(values, plane.folder / "manifests"))
        events.start_controller()
        bearer, token = plane.folder / "webhook.bearer", secrets.token_urlsafe(32)
        write_secret(bearer, token)
        start_event_path(cluster, events, site, token)
    except AssertionError as late:  # a wait that ran out
        raise ControlPlaneError(f"the event path: {late}") from None
    finally:
        for role, pod in events.pods.items():
            if pod.process is not None:
                plane.pids[f"argo-events-{role}"] = pod.process.pid
        plane.save()
        cluster.http.close()
    # what kube-proxy and the cluster's DNS would give Gitea, which runs outside the
    # cluster: the EventSource's Service, for the hook `fabrique seed-webhook` makes
    from fabrique.site.names import webhook_service_url

    service = urlsplit(webhook_service_url(site.namespaces.control)).netloc
    proxy = free_port()
    plane._spawn(
        "webhook-proxy",
        [
            sys.executable,
            "-m",
            "tests.live.events",
            "proxy",
            str(proxy),
            f"{service}=127.0.0.1:{events.webhook_port}",
        ],
        env={"PYTHONPATH": str(ROOT)},
    )
    plane._wait("webhook-proxy", lambda: listens(proxy), 30)
    (plane.folder / "event-path.json").write_text(
        json.dumps(
            {
                "webhook": f"http://127.0.0.1:{events.webhook_port}/push",
                "bearer_file": str(bearer),
                "nats": events.nats_url,
                "proxy": f"http://127.0.0.1:{proxy}",
                "service": service,
            }
        )
    )


def _event_path_lines(folder: Path) -> list[str]:
    try:
        found = json.loads((folder / "event-path.json").read_text())
    except (OSError, ValueError):
        return []
    return [
        f"# the EventSource takes Gitea's pushes at {found['webhook']} (the bearer token in "
        f"{found['bearer_file']}); the Sensor creates their Workflows; the bus is {found['nats']}"
    ]


def _code_repository(
    site: Site, plane: ControlPlane, gitea: Gitea, folder: Path, base: str
) -> list[str]:
    """The default site's code repository in ``gitea``, for a person to push to; its
    webhook the one ``fabrique seed-webhook`` makes, but to the EventSource this plane
    runs (the loopback URL of ``event-path.json``, which this Gitea's ALLOWED_HOST_LIST
    allows, where seed-webhook names the cluster's Service), made again when the plane
    has a new EventSource or bearer token, and left alone otherwise.

    A repository made now gets its app's build context as its first commit, after the
    hook: Gitea's push queue would deliver a commit made before the hook to the hook all
    the same, whenever it gets to it. That build is the chain's first, and it is waited
    for, its digest written back (``_seed_built``): a person who clones from the lines
    printed then starts from the branch's head, and their first push is not refused as
    non-fast-forward by a write-back landing a minute later. The lines that say how to
    push."""
    # imported here: these build on this module
    from fabrique.gestures.webhook import HOOK_NAME, Credentials, desired, differences

    from .gitea import ADMIN

    repo, branch, app = site.gitea.code_repo, site.gitea.branch, site.apps[0]
    new = gitea.repository(repo, branch)
    event_path = json.loads((folder / "event-path.json").read_text())
    url = event_path["webhook"]
    want = desired(site, Credentials(Path(event_path["bearer_file"]).read_text().strip()))
    want["config"]["url"] = url
    with gitea.admin() as admin:
        listed = admin.get(f"/repos/{repo}/hooks")
        if listed.status_code != 200:
            raise ControlPlaneError(f"the hooks of {repo}: {listed.status_code} {listed.text}")
        ours = [h for h in listed.json() if str(h.get("name") or "").startswith(HOOK_NAME)]
        if not (
            len(ours) == 1
            and (ours[0].get("config") or {}).get("url") == url
            and not differences(ours[0], want)
        ):
            for hook in ours:
                admin.delete(f"/repos/{repo}/hooks/{hook['id']}")
            made = admin.post(f"/repos/{repo}/hooks", json=want)
            if made.status_code != 201:
                raise ControlPlaneError(f"a webhook of {repo}: {made.status_code} {made.text}")
    if new:
        seed = gitea.commit(
            repo, branch, app_files(site, base), f"{app.name}: its build context and deployment"
        )
        _seed_built(site, plane, gitea, folder, seed)
    # the admin's password reaches git through a credential helper: never in a URL, an
    # argument or the shell's history
    password = shlex.quote(str(gitea.password_file))
    helper = f'!f() {{ echo username={ADMIN}; echo "password=$(cat {password})"; }}; f'
    name = repo.split("/")[1]
    return [
        f"# {repo} holds {app.name}'s build context ({app.context}); its webhook sends each "
        f"push on {branch} to the EventSource. To push to it as the admin:",
        f"#   git clone -c credential.helper={shlex.quote(helper)} {gitea.url}/{repo}.git",
        f"#   cd {name} && date >> {app.context}/app.txt && "
        f"git commit -qam 'change {app.name}' && git push -q",
        f"# the Sensor then creates the push's Workflow (kubectl get workflows -n "
        f"{site.namespaces.control}), whose step creates fabrique-{app.name}-<the commit's "
        f"first 12 hex digits>: kubectl get workflows -n {site.namespaces.build}",
    ]


# the seed commit's build on a fresh plane: the push's Workflow and its step's pod (the
# tools image pulled once), the build's Workflow, then its pod (BuildKit's image pulled
# once) and its write-back
SEED_DELIVERED = 90  # seconds for the hook's delivery to become the build's Workflow
SEED_BUILT = 420  # seconds for that Workflow to end


def _seed_built(site: Site, plane: ControlPlane, gitea: Gitea, folder: Path, seed: str) -> None:
    """Back once the seed commit's build has ended Succeeded and its digest is written
    back on the branch, said on stderr. The hook delivers the commit; were the delivery
    lost, the build is submitted as the safety net would (one Workflow per app and
    commit, whoever asks). A ControlPlaneError if the build ends otherwise or takes too
    long."""
    app, namespace = site.apps[0].name, site.namespaces.build
    name = f"fabrique-{app}-{seed[:12]}"

    def phase() -> str:
        return plane.kubectl(
            "get", "workflow", name, "-n", namespace, "-o", "jsonpath={.status.phase}",
            "--ignore-not-found",
        )  # fmt: skip

    def exists() -> bool:
        found = plane.kubectl("get", "workflow", name, "-n", namespace, "--ignore-not-found")
        return bool(found.strip())

    print(f"# the seed commit {seed[:12]} is built now: Workflow {name}", file=sys.stderr)
    delivered = True
    try:
        until(f"Workflow {name}, from the hook", exists, SEED_DELIVERED, error=TimeoutError)
    except TimeoutError:
        delivered = False
    if not delivered:
        print(f"# no Workflow {name} from the hook: submitted", file=sys.stderr)
        # its output on stderr: stdout is what `make up`'s shell evaluates
        submitted = _fabrique(folder, ["submit", "--app", app, "--revision", seed], sys.stderr)
        if submitted != 0:
            raise ControlPlaneError(f"fabrique submit of the seed commit {seed[:12]} failed")
    ended = until(
        f"Workflow {name} to end",
        lambda: (found := phase()) not in ("", "Pending", "Running") and found,
        SEED_BUILT,
        every=2,
        error=ControlPlaneError,
        detail=phase,
    )
    if ended != "Succeeded":
        message = plane.kubectl(
            "get", "workflow", name, "-n", namespace, "-o", "jsonpath={.status.message}",
            check=False,
        )  # fmt: skip
        raise ControlPlaneError(f"the seed commit's build {name} ended {ended}: {message}")
    with gitea.admin() as admin:
        listed = admin.get(
            f"/repos/{site.gitea.code_repo}/commits",
            params={"sha": site.gitea.branch, "limit": "1", "stat": "false"},
        )
    head = listed.json()[0] if listed.status_code == 200 and listed.json() else {}
    parents = [p.get("sha") for p in head.get("parents") or []]
    if parents != [seed]:
        raise ControlPlaneError(
            f"the seed commit's build {name} succeeded, but the branch's head is "
            f"{str(head.get('sha'))[:12]}, not its write-back on {seed[:12]}"
        )
    print(
        f"# the seed commit {seed[:12]} built and its digest written back "
        f"({head['sha'][:12]}): a clone starts from there",
        file=sys.stderr,
    )


APP_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: citation-dagster
spec:
  replicas: 1
  selector:
    matchLabels: {app: citation-dagster}
  template:
    metadata:
      labels: {app: citation-dagster}
    spec:
      containers:
        - name: webserver
          image: citation-dagster
          ports: [{containerPort: 8080}]
          readinessProbe:
            httpGet: {path: /, port: 8080}
            periodSeconds: 1
"""


def app_files(site: Site, base: str) -> dict[str, str]:
    """The site's first app in its code repository: a build context whose image runs
    (busybox's httpd over its one file, from ``base``, the node's busybox base by
    digest) and its kustomize deployment, the overlay its write-back pins."""
    app = site.apps[0]
    assert app.writeback is not None
    overlay = app.writeback.path
    base_dir = f"{app.context}/deploy/base"
    return {
        f"{app.context}/{app.dockerfile}": (
            f"FROM {base}\n"
            "COPY app.txt /www/index.html\n"
            'CMD ["httpd", "-f", "-p", "8080", "-h", "/www"]\n'
        ),
        f"{app.context}/app.txt": f"{app.name}\n",
        f"{base_dir}/deployment.yaml": APP_DEPLOYMENT,
        f"{base_dir}/kustomization.yaml": "resources:\n  - deployment.yaml\n",
        overlay: (
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources:\n  - {os.path.relpath(base_dir, os.path.dirname(overlay))}\n"
        ),
    }


def site_names(site: Site, plane: ControlPlane) -> dict[str, str]:
    """The site's host names (its Gitea's, its registry's) and the address that serves
    them on a plane with a real node: what a platform team's DNS answers, which the
    node's CoreDNS answers its pods, and a hosts file answers the bench's programs
    outside the cluster (the scenario's script, Argo CD's repo server)."""
    gitea = urlsplit(site.gitea.url).hostname or ""
    return {gitea: plane.address, site.registry.host.split(":")[0]: plane.address}


def hosts_file(path: Path, names: dict[str, str]) -> Path:
    """The machine's /etc/hosts and ``names``, in ``path``: bound over /etc/hosts in a
    private mount namespace (``resolving``), never written to the machine's."""
    machine = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
    path.write_text(
        machine.rstrip("\n")
        + "\n"
        + "".join(f"{address} {name}\n" for name, address in names.items())
    )
    return path


def private_mounts(script: str, *args: str | Path) -> list[str]:
    """The prefix that runs ``script`` (sh, its mounts, then ``exec "$@"``) with
    ``args`` as $1… in a mount namespace of its own, whose mounts die with it and never
    reach the machine's; what follows the prefix is the command it execs."""
    return ["unshare", "--mount", "--propagation=private", "--", "sh", "-c", script, "sh",
            *(str(arg) for arg in args)]  # fmt: skip


def resolving(hosts: Path, argv: list[str]) -> list[str]:
    """``argv`` run with ``hosts`` as its /etc/hosts, in a mount namespace of its own."""
    bind = 'mount --bind -o ro "$1" /etc/hosts && shift && exec "$@"'
    return [*private_mounts(bind, hosts), *argv]


def serve_site(site: Site, plane: ControlPlane, gitea: Gitea) -> None:
    """What the site needs of a cluster beyond fabrique's tree, on a plane with a real
    node: Gitea's Service at the site's URL, the ``registry`` Services that seed checks,
    and the Secrets the README's install asks of the site's secret tooling holding
    fabrique's real Gitea token (``apply_site`` made them with a stand-in)."""
    gitea_host = urlsplit(site.gitea.url).hostname or ""
    plane.expose(site.namespaces.gitea, gitea_host.split(".")[0], gitea.port, gitea.port)
    for namespace in (site.namespaces.build, site.namespaces.control):
        plane.expose(namespace, "registry", 80, 80)
        plane.kubectl(
            "patch", "secret", site.gitea.token_secret.name, "-n", namespace, "--type=merge",
            "-p", json.dumps({"stringData": {site.gitea.token_secret.key: gitea.token}}),
        )  # fmt: skip


def site_values(plane: ControlPlane, **more: Any) -> dict[str, Any]:
    """The default site as it runs on ``plane``'s real node, with ``more``: its
    NetworkPolicies reach the plane's Gitea, registry, DNS and API server by address
    (``Node.netpol_values``), which the node's engine enforces."""
    return {"netpol": plane.real_node.netpol_values(plane.ports["apiserver"]), **more}


def render(values: Path, out: Path) -> Path:
    """``fabrique --values VALUES render --out OUT``, as a platform team runs it."""
    done = subprocess.run(
        [ROOT / ".venv" / "bin" / "fabrique", "--values", values, "render", "--out", out],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ControlPlaneError(f"fabrique render: {done.stderr.strip()}")
    return out


def default_folder() -> Path:
    return Path(os.environ.get("FABRIQUE_LIVE_DIR") or Path.home() / ".cache" / "fabrique" / "live")


def _up(folder: Path) -> list[str]:
    """Start what does not run (the plane with its real node and its event path, Gitea,
    Argo CD), see to the code repository; the lines to print. A ControlPlaneError or a
    PeerError if it fails."""
    # imported here: these build on this module
    from fabrique.site.config import load_site

    from . import images
    from .argocd import ArgoCD
    from .argocd import version as argocd_version
    from .gitea import ADMIN, SCOPES, USER, Gitea
    from .gitea import binary as gitea_binary
    from .gitea import version as gitea_version

    site = load_site(env={})
    running = ControlPlane.load(folder)
    gitea = Gitea.load(folder / "gitea")
    argocd = ArgoCD.load(folder / "argocd", running) if running is not None else None
    fresh = running is None or not running.alive()
    if not fresh:
        print(f"# the control plane in {folder} is already up", file=sys.stderr)
    else:
        for stale in (argocd, gitea, running):
            if stale is not None:
                stale.stop()
        running = ControlPlane(folder, node=True)
        try:
            running.start(binaries(NODE_PEERS))
            _start_argo_events(running)
        except BaseException:
            running.stop()
            raise
    assert running is not None
    if not fresh and gitea is not None and gitea.alive():
        print(f"# Gitea in {gitea.folder} is already up", file=sys.stderr)
    else:
        if gitea is not None:
            gitea.stop()
        # at the site's URL's port, where the node's pods reach it (gitea-http.gitea)
        port = urlsplit(site.gitea.url).port
        path = json.loads((folder / "event-path.json").read_text())
        gitea = Gitea(
            folder / "gitea",
            gitea_binary(),
            # the make-up hook to the EventSource's loopback port, and the one seed-webhook
            # makes, to its Service, through the plane's proxy
            allowed_hosts=f"loopback, {path['service'].split(':')[0]}",
            webhook={"PROXY_URL": path["proxy"], "PROXY_HOSTS": "*.svc.cluster.local:*"},
            host=running.address,
            fixed_port=port,
            # the host Argo CD's Applications name, in its pushes' payloads
            root_url=site.gitea.url,
        ).start()
    try:
        if gitea.repository(site.gitea.apps_repo, site.gitea.branch):
            gitea.commit(
                site.gitea.apps_repo, site.gitea.branch,
                {"apps/README.md": "The Argo CD Applications fabrique seed writes\n"},
                "the apps repository",
            )  # fmt: skip
    except httpx.HTTPError as failed:
        raise ControlPlaneError(f"Gitea's repositories: {failed}") from None
    names = site_names(site, running)
    hosts = hosts_file(folder / "hosts", names)
    if not fresh and argocd is not None and argocd.alive():
        print(f"# Argo CD in {argocd.folder} is already up", file=sys.stderr)
    else:
        if argocd is not None:
            argocd.stop()
        # the tools image the Workflow's steps run, built by the real BuildKit; the node's
        # store may hold an earlier checkout's under the same tag
        images.push_node_images(running.registry)
        running.real_node.forget_image(running, images.TOOLS)
        serve_site(site, running, gitea)
        argocd = ArgoCD(folder / "argocd", running, hosts=names).start()
        argocd.repository(site.gitea.url, USER, gitea.token)
        argocd.root_application(
            f"{site.gitea.url}/{site.gitea.apps_repo}.git", site.gitea.branch, "apps"
        )
    # last: a new code repository's first commit is built, which needs the tools image
    try:
        base = images.pinned(images.APP_BASE, running.images)
        pushing = _code_repository(site, running, gitea, folder, base)
    except httpx.HTTPError as failed:
        raise ControlPlaneError(f"Gitea's code repository: {failed}") from None
    from .node import WORLD_HOSTS

    world = ", ".join(f"{address} ({role})" for role, (address, _) in WORLD_HOSTS.items())
    return [
        f"export KUBECONFIG={running.kubeconfig}",
        f"# a real node, {running.node_name} ({running.node_ip}), runs the Workflows' pods "
        f"and the apps'; its images are in the plane's registry {running.registry} "
        f"(registry:80 to the node)",
        f"# the Argo Events controller {running.events_version()} judges what is applied "
        f"there; the default site is applied ({folder / 'manifests'}), its NetworkPolicies "
        "enforced by kube-network-policies",
        f"# the outside world, behind the node: {world}, each serving 80 and 443",
        *_event_path_lines(folder),
        f"# Gitea {gitea_version()} at {gitea.url} ({site.gitea.url} to the node's pods): "
        f"its admin {ADMIN} (the password in {gitea.password_file}); fabrique's user "
        f"{USER} (no site admin; {', '.join(SCOPES)}), its token in {gitea.token_file}",
        f"# Argo CD {argocd_version()} deploys the Applications of "
        f"{site.gitea.apps_repo}/apps (its root Application); the default site's names "
        f"resolve outside the cluster through {hosts}",
        *pushing,
        "# scenario 34 against it, STRICT: make scenario",
    ]


def _scenario(folder: Path) -> int:
    """``bench/scenarios/build-gitops-digest.sh``, STRICT, against the plane of ``make
    up``, as a platform team runs it on their bench (``make scenario``): its exit
    status."""
    from fabrique.site.config import load_site

    from .argocd import ArgoCD
    from .gitea import Gitea

    running = ControlPlane.load(folder)
    gitea = Gitea.load(folder / "gitea")
    argocd = ArgoCD.load(folder / "argocd", running) if running is not None else None
    event_path = folder / "event-path.json"
    if (
        running is None
        or gitea is None
        or argocd is None
        or not running.alive()
        or not event_path.exists()
    ):
        print(f"error: no plane up in {folder}: make up first", file=sys.stderr)
        return 1
    bearer = Path(json.loads(event_path.read_text())["bearer_file"]).read_text().strip()
    values = folder / "scenario-site.yaml"  # seed's target: this plane's kube context, and
    # its Argo CD's server on loopback for the hooks seed keeps
    target = {"context": "fabrique-live", "argoCdWebhook": argocd.webhook_url}
    values.write_text(yaml.safe_dump(site_values(running, targets={"prod": target})))
    argv, env = scenario(
        load_site(env={}), running, folder / "hosts", values, gitea.token, bearer, os.environ
    )
    return subprocess.run(argv, env=env, check=False).returncode


def _fabrique(folder: Path, args: list[str], stdout: TextIO | None = None) -> int:
    """``fabrique <args>`` against the plane of ``make up``, as its pods would run it:
    the default site's names through the plane's hosts file (in a mount namespace of its
    own), fabrique's token read from its file, the plane's kube context: its exit status."""
    from .gitea import Gitea

    running = ControlPlane.load(folder)
    gitea = Gitea.load(folder / "gitea")
    if running is None or gitea is None or not running.alive():
        print(f"error: no plane up in {folder}: make up first", file=sys.stderr)
        return 1
    values = folder / "scenario-site.yaml"
    values.write_text(
        yaml.safe_dump(site_values(running, targets={"prod": {"context": "fabrique-live"}}))
    )
    env = {
        **os.environ,
        "KUBECONFIG": str(running.kubeconfig),
        "FABRIQUE_VALUES": str(values),
        "FABRIQUE_GITEA_TOKEN": gitea.token,
    }
    argv = resolving(folder / "hosts", [str(Path(sys.executable).parent / "fabrique"), *args])
    return subprocess.run(argv, env=env, stdout=stdout, check=False).returncode


SCENARIO = ROOT / "bench" / "scenarios" / "build-gitops-digest.sh"


def scenario(
    site: Site,
    plane: ControlPlane,
    hosts: Path,
    values: Path,
    gitea_token: str,
    bearer: str,
    base: Mapping[str, str],
) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run scenario 34 STRICT against ``plane``, as a
    platform team runs it on their bench: its kubectl first on ``PATH``, the site's names
    through ``hosts``, seed's values file, the tokens; over ``base`` (the caller's
    environment, or what a test sets: its ``HOME``, ``TIMINGS``)."""
    kubectl = Path(plane.bins["kubectl"])
    env = {
        "POLL": "1",
        **base,
        "PATH": f"{kubectl.parent}:{base.get('PATH', os.environ.get('PATH', ''))}",
        "KUBECONFIG": str(plane.kubeconfig),
        "KUBE_CONTEXT": "fabrique-live",
        "FABRIQUE_VALUES": str(values),
        "GITEA_URL": site.gitea.url,
        "FABRIQUE_GITEA_TOKEN": gitea_token,
        "FABRIQUE_WEBHOOK_TOKEN": bearer,
        "STRICT": "1",
        # the EventSource is the plane's process, not a Deployment to scale to zero
        "SAFETY_NET": "0",
    }
    return resolving(hosts, ["bash", str(SCENARIO)]), env


def main(argv: list[str]) -> int:
    from .gitea import Gitea

    parser = argparse.ArgumentParser(
        prog="python -m tests.live.controlplane",
        description="The control plane of `make up` on loopback, with Gitea beside it.",
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="up",
        choices=("up", "down", "scenario", "fabrique"),
        help="start it (the default), stop it, run scenario 34 on it, or run fabrique against it",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="fabrique's arguments")
    parsed = parser.parse_args(argv)
    command = parsed.command
    folder = default_folder()
    if command == "up":
        # stdout is only what a shell may eval (`export`, and comments): what is said on
        # the way, the peers' build lines among them, goes to stderr
        try:
            with contextlib.redirect_stdout(sys.stderr):
                said = _up(folder)
        except (ControlPlaneError, peers.PeerError) as failed:
            print(f"error: {failed}", file=sys.stderr)
            return 1
        for line in said:
            print(line)
        return 0
    if command == "scenario":
        return _scenario(folder)
    if command == "fabrique":
        return _fabrique(folder, parsed.args)
    running = ControlPlane.load(folder)
    gitea = Gitea.load(folder / "gitea")
    from .argocd import ArgoCD  # down: the one command left

    try:
        argocd = ArgoCD.load(folder / "argocd", running) if running is not None else None
        if argocd is not None:
            argocd.stop()
            print(f"# stopped Argo CD in {argocd.folder}", file=sys.stderr)
        if gitea is not None:
            gitea.stop()
            print(f"# stopped Gitea in {gitea.folder}", file=sys.stderr)
        if running is None:
            print(f"# no control plane in {folder}", file=sys.stderr)
            return 0
        running.stop()
    except ControlPlaneError as failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    print(f"# stopped the control plane in {folder}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # the module as the others import it, not as __main__: the ControlPlaneError that
    # argocd.py and gitea.py raise is then the one main catches
    from tests.live.controlplane import main as imported_main

    sys.exit(imported_main(sys.argv[1:]))
