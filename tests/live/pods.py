"""The kubelet's part for a few pods, without a container runtime: one container of a
pod, as the API server holds it, run as a local process.

No kubelet runs on the live plane (kwok reports the phases), so no container of a pod
ever runs. Where a test needs the program a pod holds (the Argo Events controller, the
EventBus's nats-server, the EventSource, the Sensor), ``PodProcess`` runs that container
from the pod the real controllers made: its command and args (the image's entrypoint
when it names none), its environment (values and ``$(VAR)`` references, the pod's
fields, Secret and ConfigMap keys) and its volumes at their mount paths: Secrets and
ConfigMaps read from the API server, the ServiceAccount token from the TokenRequest API
(bound to the pod, as the kubelet asks for it), the pod's fields, emptyDirs, a claim's
folder. The process gets a mount namespace of its own (``unshare``) whose root is a new
tmpfs holding only these, the image's binary at the image's path, ``/proc`` and a few
devices; a container with ``readOnlyRootFilesystem`` gets that root read-only, and the
Secret, ConfigMap and projected volumes are read-only as the kubelet mounts them.

Two things stay the host's, and a test says how it bridges them (``Overrides``):

- the network: every such pod shares the host's loopback, so a port that two programs
  would both bind, and the address of a Service, are the test's to change (a flag, an
  environment variable, an object the controller passed);
- the user: the process runs as the one running the tests (root in its namespace), not
  as the pod's ``runAsUser``; Pod Security's checks of the spec are the API server's.

The in-cluster API address is the live API server's own (``KUBERNETES_SERVICE_HOST``
the address it listens on), not the ``kubernetes`` Service's ClusterIP; no Service links
are set.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .cluster import Cluster
from .controlplane import ControlPlaneError, _exited, _terminate, write_secret

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEVICES = ("null", "zero", "random", "urandom")
READ_ONLY_KINDS = ("secret", "configMap", "downwardAPI", "projected")


class PodError(ControlPlaneError):
    """A pod's container could not be run: the message names the pod and what is missing."""


@dataclass(frozen=True)
class Image:
    """What an image gives a container: a peer's binary at the image's path, and the
    image's entrypoint (what runs when the container names no command)."""

    binary: Path
    path: str

    @property
    def entrypoint(self) -> list[str]:
        return [self.path]


@dataclass
class Overrides:
    """Where the test bridges the host's network: variables set or replaced (after the
    pod's own are resolved), and arguments added."""

    env: dict[str, str] = field(default_factory=dict)
    edit_env: dict[str, Callable[[str], str]] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)


def unshare_prefix() -> list[str]:
    """A mount namespace of its own: root's, or a user namespace's for anyone else."""
    if shutil.which("unshare") is None:
        raise PodError("unshare (util-linux) is not installed: the live tier runs pods with it")
    own = ["unshare", "--mount", "--propagation", "private"]
    return own if os.getuid() == 0 else [*own[:1], "--user", "--map-root-user", *own[1:]]


def expand(value: str, env: dict[str, str]) -> str:
    """A kubelet's ``$(VAR)`` expansion: a defined variable is replaced, an undefined
    reference stays as written, ``$$`` escapes."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, value)


class PodProcess:
    """One container of ``pod`` (a Pod object), run as a local process in ``folder``."""

    def __init__(
        self,
        cluster: Cluster,
        pod: dict[str, Any],
        container: str,
        images: dict[str, Image],
        folder: Path,
        overrides: Overrides | None = None,
    ) -> None:
        self.cluster = cluster
        self.pod = pod
        self.name = str(pod["metadata"]["name"])
        self.namespace = str(pod["metadata"]["namespace"])
        found = [c for c in pod["spec"]["containers"] if c["name"] == container]
        if not found:
            raise PodError(f"pod {self.namespace}/{self.name} has no container {container}")
        self.container = found[0]
        image = self.container["image"]
        if image not in images:
            raise PodError(
                f"pod {self.namespace}/{self.name}: no peer plays the image {image} "
                f"(known: {', '.join(sorted(images))})"
            )
        self.image = images[image]
        self.folder = folder
        self.overrides = overrides or Overrides()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.folder / "container.log"

    def tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return f"log {self.log}:\n" + "\n".join(text[-lines:])

    # -- what the kubelet resolves ----------------------------------------------------------

    def _field(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        fields = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta.get("uid", ""),
            "spec.nodeName": spec.get("nodeName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName", ""),
            # the pod shares the host's loopback (see the module's docstring)
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
        }
        if path not in fields:
            raise PodError(f"pod {self.name}: the field {path} is not resolved here")
        return str(fields[path])

    def _secret(self, name: str) -> dict[str, bytes]:
        body = self.cluster.get(f"/api/v1/namespaces/{self.namespace}/secrets/{name}")
        return {k: base64.b64decode(v) for k, v in (body.get("data") or {}).items()}

    def _config_map(self, name: str) -> dict[str, bytes]:
        body = self.cluster.get(f"/api/v1/namespaces/{self.namespace}/configmaps/{name}")
        found = {k: v.encode() for k, v in (body.get("data") or {}).items()}
        found.update({k: base64.b64decode(v) for k, v in (body.get("binaryData") or {}).items()})
        return found

    def _token(self, audience: str | None, seconds: int) -> bytes:
        """A ServiceAccount token bound to the pod, as the kubelet requests it."""
        account = self.pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {
            "expirationSeconds": seconds,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": self.name,
                "uid": self.pod["metadata"]["uid"],
            },
        }
        if audience:
            spec["audiences"] = [audience]
        answer = self.cluster.create(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        if answer.status != 201:
            raise PodError(f"pod {self.name}: TokenRequest for {account}: {answer.message}")
        return str(answer.body["status"]["token"]).encode()

    def environment(self) -> dict[str, str]:
        """The container's variables, in order, as the kubelet resolves them, then the
        overrides."""
        env: dict[str, str] = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOSTNAME": self.name,
            "KUBERNETES_SERVICE_HOST": str(urlsplit(self.cluster.plane.server).hostname),
            "KUBERNETES_SERVICE_PORT": str(self.cluster.plane.ports["apiserver"]),
        }
        for var in self.container.get("env") or []:
            source = var.get("valueFrom")
            if source is None:
                env[var["name"]] = expand(var.get("value", ""), env)
            elif "fieldRef" in source:
                env[var["name"]] = self._field(source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                env[var["name"]] = self._secret(ref["name"])[ref["key"]].decode()
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                env[var["name"]] = self._config_map(ref["name"])[ref["key"]].decode()
            else:
                raise PodError(f"pod {self.name}: env {var['name']}: {source} is not resolved here")
        for name, edit in self.overrides.edit_env.items():
            if name not in env:
                raise PodError(f"pod {self.name}: no variable {name} to change")
            env[name] = edit(env[name])
        env.update(self.overrides.env)
        return env

    def argv(self, env: dict[str, str]) -> list[str]:
        command = self.container.get("command") or self.image.entrypoint
        args = self.container.get("args") or []
        return [expand(a, env) for a in [*command, *args]] + self.overrides.args

    def _write_volume(self, volume: dict[str, Any], where: Path) -> None:
        """The files of one volume, in ``where``."""
        where.mkdir(parents=True, exist_ok=True)
        where.chmod(0o777)  # an emptyDir is world-writable; the others are read as root

        def put(
            files: dict[str, bytes], items: list[dict[str, Any]] | None, secret: bool = False
        ) -> None:
            chosen = {i["key"]: i["path"] for i in items} if items else {k: k for k in files}
            for key, path in chosen.items():
                if key not in files:
                    raise PodError(f"pod {self.name}: volume {volume['name']} has no key {key}")
                target = where / path
                target.parent.mkdir(parents=True, exist_ok=True)
                if secret:  # 0600: the process runs as the files' owner (see above)
                    write_secret(target, files[key])
                else:
                    target.write_bytes(files[key])
                    target.chmod(0o644)

        if "emptyDir" in volume or "persistentVolumeClaim" in volume:
            return  # the folder itself; a claim's is this pod's, kept across restarts
        if "secret" in volume:
            secret = volume["secret"]
            put(self._secret(secret["secretName"]), secret.get("items"), secret=True)
        elif "configMap" in volume:
            put(self._config_map(volume["configMap"]["name"]), volume["configMap"].get("items"))
        elif "projected" in volume:
            for source in volume["projected"]["sources"]:
                if "secret" in source:
                    secret = source["secret"]
                    put(self._secret(secret["name"]), secret.get("items"), secret=True)
                elif "configMap" in source:
                    put(
                        self._config_map(source["configMap"]["name"]),
                        source["configMap"].get("items"),
                    )
                elif "serviceAccountToken" in source:
                    token = source["serviceAccountToken"]
                    put(
                        {"token": self._token(token.get("audience"), 3607)},
                        [{"key": "token", "path": token["path"]}],
                        secret=True,
                    )
                elif "downwardAPI" in source:
                    items = source["downwardAPI"]["items"]
                    put(
                        {
                            i["path"]: self._field(i["fieldRef"]["fieldPath"]).encode()
                            for i in items
                        },
                        None,
                    )
                else:
                    raise PodError(f"pod {self.name}: projected source {source} not played here")
        else:
            raise PodError(f"pod {self.name}: volume {volume['name']} is of a kind not played here")

    def mounts(self) -> list[tuple[Path, str, bool]]:
        """(host path, path in the container, read-only) of every volume mount, the
        volumes written first."""
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        found = []
        for mount in self.container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            where = self.folder / "volumes" / mount["name"]
            if not where.exists():
                self._write_volume(volume, where)
            source = where / mount["subPath"] if mount.get("subPath") else where
            # the kubelet mounts these read-only whatever the mount says
            fixed = any(kind in volume for kind in READ_ONLY_KINDS)
            found.append((source, mount["mountPath"], fixed or bool(mount.get("readOnly"))))
        return found

    def script(self, root: Path, mounts: list[tuple[Path, str, bool]]) -> str:
        """The shell run in the new mount namespace: a tmpfs root with the image's
        binary, /proc, a few devices and the volumes, then ``chroot`` into it."""
        q = shlex.quote
        lines = ["set -eu", f"mount -t tmpfs -o mode=0755 pod {q(str(root))}"]

        def bind(
            source: Path | str, target: str, read_only: bool = False, rbind: bool = False
        ) -> None:
            inside = f"{root}{target}"
            if Path(source).is_dir():
                lines.append(f"mkdir -p {q(inside)}")
            else:
                lines.append(f"mkdir -p {q(str(Path(inside).parent))} && : > {q(inside)}")
            lines.append(f"mount {'--rbind' if rbind else '--bind'} {q(str(source))} {q(inside)}")
            if read_only:
                lines.append(f"mount -o remount,bind,ro {q(inside)}")

        bind(self.image.binary, self.image.path, read_only=True)
        bind("/proc", "/proc", rbind=True)
        for device in DEVICES:
            bind(f"/dev/{device}", f"/dev/{device}")
        for source, target, read_only in mounts:
            bind(source, target, read_only)
        secure = self.container.get("securityContext") or {}
        if secure.get("readOnlyRootFilesystem"):
            # the mount point read-only (a user namespace may not remount the tmpfs itself)
            lines.append(f"mount -o remount,bind,ro {q(str(root))}")
        lines.append(f'exec chroot {q(str(root))} "$@"')
        return "\n".join(lines)

    # -- run --------------------------------------------------------------------------------

    def start(self) -> PodProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        root = self.folder / "root"
        root.mkdir(exist_ok=True)
        env = self.environment()
        argv = self.argv(env)
        script = self.script(root, self.mounts())
        (self.folder / "argv.json").write_text(json.dumps(argv) + "\n")
        log = self.log.open("ab")
        self.process = subprocess.Popen(
            [*unshare_prefix(), "sh", "-c", script, "pod", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.folder,
            env=env,
            start_new_session=True,
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.process is not None and _exited(self.process.pid) is None

    def died(self) -> str | None:
        """How it ended (with its log), or None while it runs."""
        if self.process is None:
            return "never started"
        ended = _exited(self.process.pid)
        return f"{ended}: {self.tail()}" if ended else None

    def stop(self) -> None:
        if self.process is not None:
            _terminate([self.process.pid])
            self.process.wait(timeout=10)
            self.process = None

    def kill(self) -> None:
        """SIGKILL to its process group, no SIGTERM first: it cannot drain or flush."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            self.process.wait(timeout=10)
            self.process = None


def running_pod(
    cluster: Cluster, namespace: str, selector: str, timeout: float = 90
) -> dict[str, Any]:
    """The one pod matching ``selector`` that kwok reports Running (its phase stands in
    for the kubelet having started it)."""

    def probe() -> dict[str, Any] | None:
        pods = [
            p
            for p in cluster.items(f"/api/v1/namespaces/{namespace}/pods", selector)
            if not p["metadata"].get("deletionTimestamp")
        ]
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return running[0] if len(running) == 1 and len(pods) == 1 else None

    try:
        return cluster.wait(f"one Running pod {selector} in {namespace}", probe, timeout)
    except AssertionError as late:
        pods = {
            p["metadata"]["name"]: (p.get("status") or {}).get("phase")
            for p in cluster.items(f"/api/v1/namespaces/{namespace}/pods", selector)
        }
        raise AssertionError(f"{late}; pods: {pods}") from None
