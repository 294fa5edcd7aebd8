"""Argo CD for a control plane, run on the host as its upstream install behaves in a
cluster: ``argocd-application-controller``, ``argocd-repo-server`` and ``argocd-server``
built from the wrapper module of ``tests/peers/argo-cd``, beside a Debian
``redis-server``. The server is there for its ``/api/webhook``, where Gitea's hooks
(``fabrique seed``) tell Argo CD of a push: it serves plain HTTP on loopback
(``server.insecure``, as behind an ingress that terminates TLS), at ``webhook_url``.

What the install applies is applied from the module's own ``manifests/install.yaml``:
its CRDs, ServiceAccounts, Roles, ClusterRoles, bindings, ConfigMaps and Secrets, in
namespace ``argocd``. Its workloads, Services and NetworkPolicies are not: the processes
here take the place of the pods. What ``argocd-server`` would add at its first start is
added too (``server.secretkey`` in ``argocd-secret``, the ``default`` AppProject, as
``initializeDefaultProject`` writes it), and so is what the redis init job would (the
``argocd-redis`` Secret's ``auth``, which redis then requires). Each process gets the
environment its pod would: the ``env`` of its container in ``install.yaml``, with the
references to ``argocd-cm``, ``argocd-cmd-params-cm`` and ``argocd-redis`` resolved
against the cluster as the kubelet resolves them, so a key a platform team sets there
(``timeout.reconciliation``, ``controller.self.heal.timeout.seconds``) works here as
there. Where to reach redis and the repo server is set through argocd-cmd-params-cm
(``redis.server``, ``repo.server``, ``controller.repo.server.plaintext``,
``reposerver.disable.tls``), as a platform team moves them; only the ports have no key.

**The in-cluster destination.** seed's Application names ``https://kubernetes.default.svc``,
Argo CD's in-cluster address. With no cluster Secret for that address (and
``cluster.inClusterEnabled`` left on, its default), ``db.GetCluster`` returns its
built-in local cluster, whose ``rawRestConfig`` (``pkg/apis/application/v1alpha1``) calls
client-go's ``rest.InClusterConfig``: the host and port of ``KUBERNETES_SERVICE_HOST`` and
``KUBERNETES_SERVICE_PORT``, and the token and CA at the fixed path
``/var/run/secrets/kubernetes.io/serviceaccount/``. The name kubernetes.default.svc is
never dialled: in a pod too the address comes from the environment. So the controller
runs as its pod does: those two variables name the plane's API server, and its folder's
``serviceaccount/`` (a TokenRequest token of the install's ``argocd-application-controller``
ServiceAccount, the plane's CA, the namespace ``argocd``) is bind-mounted at that path in
a private mount namespace of the controller alone (``unshare --mount``, a tmpfs over
``/run`` so that nothing is created on the host), as the kubelet mounts the projected
volume; the server runs the same way, with a token of its own ServiceAccount. The controller takes no kubeconfig at all: its own client is in-cluster too
(clientcmd's fallback), it acts with the install's RBAC, and the namespace comes from that
file. The alternatives were worse: a cluster Secret for https://kubernetes.default.svc
with a bearer token keeps that host name, which does not resolve on the host; a cluster
Secret for the plane's real URL would need seed's Application changed; and
``ARGOCD_FAKE_IN_CLUSTER`` (a development switch) takes a kubeconfig instead of the
path every pod has.

Outside a pod, the repo server also needs: ``ARGOCD_GPG_ENABLED=false`` (its GnuPG keyring
is an emptyDir of the pod, and gpg would leave agents behind); ``--client-ca-path=``
beside ``reposerver.disable.tls`` (v3.6.2 refuses ``--disable-tls`` with the default
path, which is never empty); ``hack/git-verify-wrapper.sh`` of the module on ``PATH``
(every manifest generation runs it) and ``argocd`` (git's askpass) and ``kustomize``
(the kustomize peer) there too; its askpass socket (``ARGOCD_ASK_PASS_SOCK``), its
``TMPDIR`` and ``HOME`` in this folder, so two Argo CDs on one host do not meet in
``/tmp``.

A private Gitea repository needs credentials: ``repository`` registers them as
``argocd repo add`` would, a Secret labelled ``argocd.argoproj.io/secret-type:
repository`` (or ``repo-creds``, a template for every URL under a prefix), named as
``db.URIToSecretName`` names it. ``root_application`` makes the root Application a platform
team keeps, which syncs the Application files of a repository path into ``argocd``;
``wait_synced`` waits, bounded, for an Application to be Synced and Healthy at a commit.
Everything lives in one folder: a log per process, the ServiceAccount files, the repo
server's scratch space and ``state.json`` (ports and pids) for ``load``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from ..waits import until
from . import controlplane
from .controlplane import ControlPlane, ControlPlaneError, write_secret

ARGOCD_MODULE = "github.com/argoproj/argo-cd/v3"
NAMESPACE = "argocd"
IN_CLUSTER = "https://kubernetes.default.svc"
CONTROLLER = "argocd-application-controller"
REPO_SERVER = "argocd-repo-server"
SERVER = "argocd-server"
# the ServiceAccount files of a pod, where rest.InClusterConfig reads them
SERVICE_ACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# what of install.yaml the processes here take the place of
NOT_APPLIED = ("Deployment", "StatefulSet", "Service", "NetworkPolicy")
SECRET_TYPE = "argocd.argoproj.io/secret-type"
APPS = "/apis/argoproj.io/v1alpha1"
# a pod's own PATH: nothing of the caller's environment reaches a process
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the longest path a unix socket may have (sun_path, with its NUL)
SOCKET_PATH_MAX = 107


def _peer() -> controlplane.peers.Peer:
    return controlplane.peers.Peer("argo-cd", controlplane.ROOT / "tests/peers/argo-cd")


def version() -> str:
    """The version of Argo CD its wrapper module builds (``v3.6.2``)."""
    return _peer().required(ARGOCD_MODULE)


def module_dir() -> Path:
    """Argo CD's module folder in the Go module cache (its manifests), downloaded first
    if need be, by the toolchain its go.mod asks for (Go 1.27: not the installed one)."""
    go = controlplane.peers.find_go()
    if go is None:
        raise ControlPlaneError("Go is not installed: the live tier needs it")
    toolchain = _peer().toolchain() or "local"
    return Path(controlplane.peers.download(go, ARGOCD_MODULE, version(), toolchain)["Dir"])


def binaries() -> dict[str, Path]:
    """``argocd`` (Argo CD's one command, also installed as each component, with
    git-verify-wrapper.sh beside it) and ``kustomize``, built first if need be."""
    return controlplane.binaries(("argo-cd", "kustomize"))


@dataclass
class ArgoCD:
    """The folder of one Argo CD for ``plane``, and its processes."""

    folder: Path
    plane: ControlPlane
    # ``binaries()``: argocd, and kustomize; found (built if need be) at start when empty
    bins: dict[str, Path] = field(default_factory=dict)
    # argocd-cm and argocd-cmd-params-cm keys a platform team would set
    # (``{"timeout.reconciliation": "10s"}``), applied at every start
    config: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    # names the repo server resolves as a cluster's DNS would answer them in its pod
    # (``{"gitea-http.gitea.svc.cluster.local": "10.255.1.1"}``): a hosts file of its own
    hosts: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _client: httpx.Client | None = field(default=None, repr=False)

    @property
    def state_file(self) -> Path:
        return self.folder / "state.json"

    @property
    def repo_server(self) -> str:
        return f"127.0.0.1:{self.ports['repo-server']}"

    @property
    def webhook_url(self) -> str:
        """Where Gitea posts to argocd-server: ``targets.<name>.argoCdWebhook`` here."""
        return f"http://127.0.0.1:{self.ports['server']}/api/webhook"

    def _bin(self, name: str) -> Path:
        """A command of the argo-cd peer's folder (every name is ``argocd`` there)."""
        path = Path(self.bins["argocd"]).parent / name
        if not path.exists():
            raise ControlPlaneError(f"{path}: missing from the argo-cd peer (make peers)")
        return path

    # -- state: what `make down` and a second `make up` read ------------------------------

    def save(self) -> None:
        self.state_file.write_text(
            json.dumps(
                {
                    "ports": self.ports,
                    "pids": self.pids,
                    "bins": {name: str(path) for name, path in self.bins.items()},
                },
                indent=1,
            )
        )

    @classmethod
    def load(cls, folder: Path, plane: ControlPlane) -> ArgoCD | None:
        try:
            state = json.loads((folder / "state.json").read_text())
            bins = {name: Path(path) for name, path in state["bins"].items()}
            return cls(folder, plane, bins, ports=state["ports"], pids=state["pids"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    def alive(self) -> bool:
        """Every process runs, and the repo server, the controller and the server answer."""
        return (
            bool(self.pids)
            and all(controlplane._exited(pid) is None for pid in self.pids.values())
            and all(self.answers(name) for name in ("repo-server", "controller", "server"))
        )

    def answers(self, name: str) -> bool:
        """Whether process ``name`` (repo-server, controller, server) says it is healthy."""
        port = {
            "repo-server": self.ports.get("repo-server-metrics"),
            "controller": self.ports.get("controller-metrics"),
            "server": self.ports.get("server"),
        }[name]
        return port is not None and _http_ok(f"http://127.0.0.1:{port}/healthz")

    # -- start ----------------------------------------------------------------------------

    def start(self, attempts: int = 3) -> ArgoCD:
        """Install Argo CD in the plane and start its processes; a port taken meanwhile
        is a new try on new ports, up to ``attempts``."""
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                self._start()
                break
            except ControlPlaneError as failed:
                if "address already in use" not in str(failed).lower() or attempt == attempts:
                    raise
                print(f"# argo-cd: a port was taken, try {attempt + 1}", file=sys.stderr)
        print(
            f"# argo-cd {version()} for {self.plane.server}: started in "
            f"{time.monotonic() - started:.1f} s",
            file=sys.stderr,
        )
        return self

    def _start(self) -> None:
        if not self.bins:
            self.bins = binaries()
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in ("redis", "repo-server", "controller", "server"):
            shutil.rmtree(self.folder / name, ignore_errors=True)  # every start is new
        self.ports = {
            name: controlplane.free_port()
            for name in (
                "redis",
                "repo-server",
                "repo-server-metrics",
                "controller-metrics",
                "server",
                "server-metrics",
            )
        }
        try:
            password = secrets.token_urlsafe(24)
            self._start_redis(password)
            install = self._install(password)
            for account, home in ((CONTROLLER, "controller"), (SERVER, "server")):
                self._service_account(account, self.folder / home / "serviceaccount")
            self._start_repo_server(install)
            self._start_controller(install)
            self._start_server(install)
        except BaseException:
            self.stop()
            raise
        self.save()

    def _spawn(self, name: str, argv: Iterable[str | Path], env: dict[str, str]) -> None:
        # a pod's environment: nothing of the caller's (its KUBECONFIG)
        process = controlplane.spawn(self.folder, name, argv, env)
        self.processes[name] = process
        self.pids[name] = process.pid
        self.save()

    def _wait(self, name: str, what: str, ready: Any, timeout: float) -> None:
        controlplane.wait_on(
            self.pids[name], name, f"{name}: {what}", ready, timeout, lambda: self.tail(name)
        )

    def tail(self, name: str, lines: int = 15) -> str:
        return controlplane.log_tail(self.folder, name, lines)

    def _start_redis(self, password: str) -> None:
        """Debian's redis-server as argocd-redis runs it: no persistence, a password
        (the one ``argocd-redis`` holds), on loopback. The password is in a 0600 config
        file, never an argument."""
        redis = shutil.which("redis-server")
        if redis is None:
            raise ControlPlaneError(
                "redis-server is not installed: Argo CD's cache (make system-deps installs it)"
            )
        data = self.folder / "redis"
        data.mkdir()
        conf = self.folder / "redis.conf"
        write_secret(
            conf,
            f'bind 127.0.0.1\nport {self.ports["redis"]}\nsave ""\nappendonly no\n'
            f'dir {data}\nrequirepass {password}\ndaemonize no\nlogfile ""\n',
        )
        self._spawn("redis", [redis, conf], {"PATH": SYSTEM_PATH})
        self._wait("redis", "an answer to PING", lambda: _redis_up(self.ports["redis"]), 30)

    def _install(self, redis_password: str) -> list[dict[str, Any]]:
        """install.yaml's objects but its workloads, what argocd-server and the redis
        init add, and this folder's addresses; back once the CRDs are Established. The
        install's documents, for the pods' environment."""
        manifests = module_dir() / "manifests"
        install = [d for d in yaml.safe_load_all((manifests / "install.yaml").read_text()) if d]
        objects = [d for d in install if d["kind"] not in NOT_APPLIED]
        self.plane.kubectl("create", "namespace", NAMESPACE, check=False)
        self._apply(objects, namespace=NAMESPACE)
        crds = [d["metadata"]["name"] for d in objects if d["kind"] == "CustomResourceDefinition"]
        self._wait_established(crds)
        secret_key = base64.b64encode(secrets.token_bytes(32)).decode()
        params = {
            "redis.server": f"127.0.0.1:{self.ports['redis']}",
            "repo.server": self.repo_server,
            "controller.repo.server.plaintext": "true",
            "reposerver.disable.tls": "true",
            "reposerver.listen.address": "127.0.0.1",
            # the server: plain HTTP on loopback, to the repo server without TLS
            "server.insecure": "true",
            "server.listen.address": "127.0.0.1",
            "server.repo.server.plaintext": "true",
            **self.params,
        }
        self._apply(
            [
                # argocd-server's InitializeSettings: the JWT signature key
                _secret("argocd-secret", {"server.secretkey": secret_key}),
                # argocd-redis's secret-init: the password redis requires
                _secret("argocd-redis", {"auth": redis_password}),
                _config_map("argocd-cmd-params-cm", params),
                _config_map("argocd-cm", self.config),
                {
                    "apiVersion": "argoproj.io/v1alpha1",
                    "kind": "AppProject",
                    "metadata": {"name": "default", "namespace": NAMESPACE},
                    # server.initializeDefaultProject's spec
                    "spec": {
                        "sourceRepos": ["*"],
                        "destinations": [{"server": "*", "namespace": "*"}],
                        "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
                    },
                },
            ],
            manager="argocd-server",
        )
        return install

    def _apply(
        self, documents: list[dict[str, Any]], namespace: str = NAMESPACE, manager: str = ""
    ) -> None:
        self.plane.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            f"--field-manager={manager or 'fabrique-live'}",
            f"--namespace={namespace}",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(documents),
        )

    def _wait_established(self, crds: list[str], timeout: float = 60) -> None:
        def served(name: str) -> bool:
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            return controlplane.established(self._request("GET", path).json())

        until(
            f"Argo CD's CRDs {', '.join(crds)} to be Established",
            lambda: all(served(name) for name in crds),
            timeout,
            error=ControlPlaneError,
        )

    def _service_account(self, account: str, where: Path) -> None:
        """The files the kubelet projects into the pod of ``account`` (the controller's,
        the server's) at ``where``: a token of its ServiceAccount (TokenRequest, as the
        projected volume asks for one), the cluster's CA, the namespace."""
        answer = self._request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                # the kubelet would rotate it; a test plane lives 30 days at most (its CA)
                "spec": {"expirationSeconds": 30 * 24 * 3600},
            },
        )
        if answer.status_code != 201:
            raise ControlPlaneError(
                f"a token of ServiceAccount {NAMESPACE}/{account}: {answer.status_code} "
                f"{answer.text}"
            )
        where.mkdir(mode=0o700, parents=True)
        write_secret(where / "token", answer.json()["status"]["token"])
        shutil.copyfile(self.plane.folder / "ca.crt", where / "ca.crt")
        (where / "namespace").write_text(NAMESPACE)

    def _pod_env(self, install: list[dict[str, Any]], workload: str) -> dict[str, str]:
        """The environment the kubelet gives the container ``workload`` of install.yaml:
        its ``value``s, and its ConfigMap and Secret keys read now; an optional key that
        is missing is left out, a required one is an error."""
        found = [
            d
            for d in install
            if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == workload
        ]
        if not found:
            raise ControlPlaneError(f"install.yaml of Argo CD {version()} has no {workload}")
        pod = found[0]["spec"]["template"]["spec"]
        container = next(c for c in pod["containers"] if c["name"] == workload)
        read: dict[tuple[str, str], dict[str, str] | None] = {}

        def data(kind: str, name: str) -> dict[str, str] | None:
            if (kind, name) not in read:
                answer = self._request("GET", f"/api/v1/namespaces/{NAMESPACE}/{kind}/{name}")
                if answer.status_code not in (200, 404):
                    raise ControlPlaneError(
                        f"{kind} {NAMESPACE}/{name}: {answer.status_code} {answer.text}"
                    )
                values = (answer.json().get("data") or {}) if answer.status_code == 200 else None
                if kind == "secrets" and values is not None:
                    values = {k: base64.b64decode(v).decode() for k, v in values.items()}
                read[(kind, name)] = values
            return read[(kind, name)]

        env: dict[str, str] = {}
        for entry in container.get("env") or []:
            if "value" in entry:
                env[entry["name"]] = str(entry["value"])
                continue
            source = entry.get("valueFrom") or {}
            for key, kind in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
                if key not in source:
                    continue
                ref = source[key]
                values = data(kind, ref["name"])
                if values is not None and ref["key"] in values:
                    env[entry["name"]] = values[ref["key"]]
                elif not ref.get("optional", False):
                    raise ControlPlaneError(
                        f"{workload}'s {entry['name']}: {kind} {NAMESPACE}/{ref['name']} has no "
                        f"key {ref['key']}"
                    )
        return env

    def _start_repo_server(self, install: list[dict[str, Any]]) -> None:
        home = self.folder / "repo-server"
        for sub in ("home", "tmp", "helm", "tls", "ssh", "gpg"):
            (home / sub).mkdir(parents=True)
        socket_path = home / "askpass.sock"
        if len(str(socket_path)) > SOCKET_PATH_MAX:
            # a deep folder (pytest's, under xdist): the socket in a short one of its own,
            # named after this folder, removed at stop
            short = Path(tempfile.gettempdir()) / f"fabrique-argocd-{_short(self.folder)}"
            short.mkdir(mode=0o700, exist_ok=True)
            socket_path = short / "askpass.sock"
        if len(str(socket_path)) > SOCKET_PATH_MAX:
            raise ControlPlaneError(
                f"{socket_path}: too long for a unix socket; use a shorter folder"
            )
        tools = [self._bin("git-verify-wrapper.sh").parent, Path(self.bins["kustomize"]).parent]
        env = {
            **self._pod_env(install, REPO_SERVER),
            "PATH": ":".join([*map(str, tools), SYSTEM_PATH]),
            "HOME": str(home / "home"),
            "TMPDIR": str(home / "tmp"),
            "HELM_CACHE_HOME": str(home / "helm"),
            "HELM_CONFIG_HOME": str(home / "helm"),
            "HELM_DATA_HOME": str(home / "helm"),
            # the pod's mounts of argocd-tls-certs-cm and argocd-ssh-known-hosts-cm
            "ARGOCD_TLS_DATA_PATH": str(home / "tls"),
            "ARGOCD_SSH_DATA_PATH": str(home / "ssh"),
            "ARGOCD_GNUPGHOME": str(home / "gpg"),
            "ARGOCD_GPG_ENABLED": "false",
            "ARGOCD_ASK_PASS_SOCK": str(socket_path),
        }
        metrics = self.ports["repo-server-metrics"]
        self._spawn(
            "repo-server",
            [
                *self._resolving(),
                self._bin(REPO_SERVER),
                f"--port={self.ports['repo-server']}",
                f"--metrics-port={metrics}",
                # install.yaml maps reposerver.metrics.listen.address to a variable the
                # command does not read (ARGOCD_REPO_SERVER_LISTEN_METRICS_ADDRESS)
                "--metrics-address=127.0.0.1",
                "--client-ca-path=",
            ],
            env,
        )
        # ?full=true: the repo server dials its own gRPC port
        self._wait(
            "repo-server",
            "/healthz?full=true",
            lambda: _http_ok(f"http://127.0.0.1:{metrics}/healthz?full=true"),
            60,
        )

    def _resolving(self) -> list[str]:
        """The prefix that runs a command with ``hosts`` in its /etc/hosts, bound over the
        machine's in a private mount namespace of its own (the machine's is not touched);
        none without ``hosts``."""
        if not self.hosts:
            return []
        return controlplane.resolving(
            controlplane.hosts_file(self.folder / "hosts", self.hosts), []
        )

    def _in_cluster(
        self, install: list[dict[str, Any]], workload: str, home: Path
    ) -> tuple[list[str], dict[str, str]]:
        """The prefix and the environment that run ``workload`` as in its pod, in-cluster:
        the API server's address as the kubelet sets it, and ``home``'s
        ``serviceaccount/`` bind-mounted at the fixed path in a private mount namespace."""
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        api = urlsplit(self.plane.server)
        env = {
            **self._pod_env(install, workload),
            "PATH": SYSTEM_PATH,
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "KUBECACHEDIR": str(home / "tmp" / "kubecache"),
            # what the kubelet sets in every container: the API server's address
            "KUBERNETES_SERVICE_HOST": str(api.hostname),
            "KUBERNETES_SERVICE_PORT": str(api.port or 443),
        }
        run = os.path.realpath("/var/run")
        mount = (
            'mount -t tmpfs -o mode=0755,size=1m fabrique-argocd "$1" && mkdir -p "$2" '
            '&& mount --bind -o ro "$3" "$2" && shift 3 && exec "$@"'
        )
        prefix = controlplane.private_mounts(
            mount, run, SERVICE_ACCOUNT_PATH, home / "serviceaccount"
        )
        return prefix, env

    def _start_controller(self, install: list[dict[str, Any]]) -> None:
        prefix, env = self._in_cluster(install, CONTROLLER, self.folder / "controller")
        metrics = self.ports["controller-metrics"]
        self._spawn(
            "controller", [*prefix, self._bin(CONTROLLER), f"--metrics-port={metrics}"], env
        )
        self._wait(
            "controller",
            "/healthz",
            lambda: _http_ok(f"http://127.0.0.1:{metrics}/healthz"),
            90,
        )

    def _start_server(self, install: list[dict[str, Any]]) -> None:
        """argocd-server, for its /api/webhook: plain HTTP on loopback (server.insecure),
        its metrics on loopback too (the flag: install.yaml's variable for the metrics
        address names the flag instead, upstream's slip), an empty folder for the UI's
        extra assets (the build embeds the module's placeholder UI)."""
        home = self.folder / "server"
        prefix, env = self._in_cluster(install, SERVER, home)
        (home / "static").mkdir()
        env["ARGOCD_BINARY_NAME"] = SERVER
        self._spawn(
            "server",
            [
                *prefix,
                self._bin("argocd"),
                f"--port={self.ports['server']}",
                f"--metrics-port={self.ports['server-metrics']}",
                "--metrics-address=127.0.0.1",
                f"--staticassets={home / 'static'}",
            ],
            env,
        )
        self._wait("server", "/healthz", lambda: self.answers("server"), 90)

    # -- what a platform team and seed give it --------------------------------------------

    def repository(
        self, url: str, username: str, password: str, template: bool | None = None
    ) -> str:
        """Credentials for the Git repository ``url`` (a ``repository`` Secret, as
        ``argocd repo add`` writes it), or with ``template`` for every repository under
        the URL prefix ``url`` (``repo-creds``, as ``argocd repocreds add``): by default,
        a template unless ``url`` names a repository (``….git``, as Gitea's clone URLs
        and fabrique's do), so that Gitea's own URL covers all its repositories. The
        Secret's name. The password goes through kubectl's stdin only."""
        if template is None:
            template = not url.endswith(".git")
        kind = "repo-creds" if template else "repository"
        name = _uri_secret_name("creds" if template else "repo", url)
        secret = _secret(
            name,
            {"type": "git", "url": url, "username": username, "password": password},
        )
        secret["metadata"]["labels"] = {SECRET_TYPE: kind}
        self._apply([secret], manager="argocd-server")
        return name

    def apply(self, document: dict[str, Any]) -> None:
        """An Application (or any object) as written, server-side applied."""
        namespace = (document.get("metadata") or {}).get("namespace") or NAMESPACE
        self._apply([document], namespace=namespace)

    def root_application(
        self, repo_url: str, revision: str, path: str, name: str = "root"
    ) -> dict[str, Any]:
        """The root Application a platform team keeps: every Application file under
        ``path`` of ``repo_url`` synced into ``argocd``, pruned when removed there. The
        document, applied."""
        document = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "finalizers": ["resources-finalizer.argocd.argoproj.io"],
            },
            "spec": {
                "project": "default",
                "source": {"repoURL": repo_url, "targetRevision": revision, "path": path},
                "destination": {"server": IN_CLUSTER, "namespace": NAMESPACE},
                "syncPolicy": {"automated": {"prune": True, "selfHeal": True}},
            },
        }
        self.apply(document)
        return document

    def refresh(self, name: str, hard: bool = False) -> None:
        """Ask for a new comparison with Git now (``argocd app get --refresh``, or
        ``--hard-refresh``: the repo server's cache dropped too), as Gitea's webhook to
        argocd-server would on a push; otherwise it comes at ``timeout.reconciliation``."""
        answer = self._request(
            "PATCH",
            f"{APPS}/namespaces/{NAMESPACE}/applications/{name}",
            {
                "metadata": {
                    "annotations": {"argocd.argoproj.io/refresh": "hard" if hard else "normal"}
                }
            },
            content_type="application/merge-patch+json",
        )
        if answer.status_code != 200:
            raise ControlPlaneError(
                f"refresh of Application {name}: {answer.status_code} {answer.text}"
            )

    def application(self, name: str) -> dict[str, Any] | None:
        answer = self._request("GET", f"{APPS}/namespaces/{NAMESPACE}/applications/{name}")
        if answer.status_code == 404:
            return None
        if answer.status_code != 200:
            raise ControlPlaneError(f"Application {name}: {answer.status_code} {answer.text}")
        body: dict[str, Any] = answer.json()
        return body

    def wait_synced(self, name: str, revision: str, timeout: float = 120) -> dict[str, Any]:
        """Wait until Application ``name`` is Synced to ``revision`` (a commit) and
        Healthy; the Application. Not within ``timeout`` seconds: a ControlPlaneError
        with its status, conditions and the controller's log."""
        what = f"Application {NAMESPACE}/{name} Synced and Healthy at {revision[:12]}"
        print(f"# argo-cd: waiting up to {timeout:.0f} s for {what}", file=sys.stderr)
        started = time.monotonic()
        last: dict[str, Any] = {}

        def synced() -> dict[str, Any] | None:
            last["app"] = self.application(name)
            return last["app"] if synced_at(last["app"], revision) else None

        def alive() -> None:
            for process, pid in self.pids.items():
                died = controlplane._exited(pid)
                if died:
                    raise ControlPlaneError(
                        f"{process} {died} while waiting for {what}: {self.tail(process)}"
                    )

        app = until(
            what,
            synced,
            timeout,
            every=0.5,
            error=ControlPlaneError,
            alive=alive,
            detail=lambda: f"{describe(last.get('app'))}; {self.tail('controller')}",
        )
        print(f"# argo-cd: {what} after {time.monotonic() - started:.1f} s", file=sys.stderr)
        return app

    # -- the API ----------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> httpx.Response:
        if self._client is None:
            self._client = httpx.Client(
                base_url=self.plane.server,
                headers={"Authorization": f"Bearer {self.plane.token}"},
                verify=ssl.create_default_context(cafile=str(self.plane.folder / "ca.crt")),
                timeout=30,
            )
        try:
            return self._client.request(
                method,
                path,
                content=None if body is None else json.dumps(body),
                headers={"Content-Type": content_type},
            )
        except httpx.HTTPError as failed:
            raise ControlPlaneError(f"{method} {path} on {self.plane.server}: {failed}") from None

    # -- stop -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every process (the controller first, redis last); what the install
        applied stays in the plane, which is stopped on its own."""
        controlplane._terminate(list(reversed(self.pids.values())))
        for process in self.processes.values():
            process.wait(timeout=10)
        self.processes.clear()
        self.pids.clear()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.state_file.exists():
            self.state_file.unlink()
        shutil.rmtree(
            Path(tempfile.gettempdir()) / f"fabrique-argocd-{_short(self.folder)}",
            ignore_errors=True,
        )


def _short(folder: Path) -> str:
    return hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:12]


def synced_at(app: dict[str, Any] | None, revision: str) -> bool:
    """Whether ``app`` is Synced to ``revision`` and Healthy, as its status says."""
    status = (app or {}).get("status") or {}
    sync, health = status.get("sync") or {}, status.get("health") or {}
    return (
        sync.get("status") == "Synced"
        and sync.get("revision") == revision
        and health.get("status") == "Healthy"
    )


def describe(app: dict[str, Any] | None) -> str:
    """An Application's status in one line: sync and revision, health, the last
    operation, the conditions."""
    if app is None:
        return "no such Application"
    status = app.get("status") or {}
    sync, health = status.get("sync") or {}, status.get("health") or {}
    parts = [
        f"sync {sync.get('status', 'unknown')} at {sync.get('revision') or 'no revision'}",
        f"health {health.get('status', 'unknown')}"
        + (f" ({health['message']})" if health.get("message") else ""),
    ]
    operation = status.get("operationState") or {}
    if operation:
        parts.append(f"last operation {operation.get('phase')}: {operation.get('message', '')}")
    conditions = status.get("conditions") or []
    parts.append(
        "conditions: "
        + ("; ".join(f"{c.get('type')}: {c.get('message')}" for c in conditions) or "none")
    )
    return ", ".join(parts)


def _uri_secret_name(kind: str, url: str) -> str:
    """``db.URIToSecretName``: ``<kind>-<host>-<FNV-1a 32 of the URL>``."""
    host = (urlsplit(url).hostname or "").lower()
    digest = 0x811C9DC5
    for byte in url.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{kind}-{host}-{digest}"


def _secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def _config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": data,
    }


def _redis_up(port: int) -> bool:
    """redis answers (``-NOAUTH`` before a password is a redis answering)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except (httpx.HTTPError, OSError):
        return False
