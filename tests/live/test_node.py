"""The live tier's real node (``ControlPlane(..., node=True)``, ``tests/live/node.py``):
it is Ready as a worker; a pod pulled by digest from the plane's registry runs; in a pod,
an exposed host service, ``registry`` and the ``kubernetes`` Service resolve and answer,
and nothing outside the plane does; a plane stopped after a crash, as ``make down`` stops
it, leaves the machine as it found it: namespaces, links, mounts, cgroups, processes,
kernel settings, the node programs' default folders."""

from __future__ import annotations

import json
import os
import re
import signal
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ..waits import until
from . import controlplane, images
from .cluster import Cluster
from .controlplane import EVENTS_NODE, EVENTS_TAINT, ControlPlane, _exited
from .node import _hierarchies

pytestmark = pytest.mark.xdist_group("real-node")

EXPOSED = "fabrique exposed from the host\n"
# what connecting from a pod may say when the address is out of reach (busybox nc): an
# ICMP unreachable, or none at all when the kernel rate-limits them
UNREACHABLE = ("No route to host", "Network is unreachable", "timed out")
# what may change on its own between two looks at the kernel's settings
VOLATILE = re.compile(
    r"^(kernel\.random\.|kernel\.ns_last_pid|kernel\.pty\.nr|fs\.(dentry-state|file-nr|"
    r"inode-nr|inode-state|aio-nr|quota\.)|net\.netfilter\.nf_conntrack_count)"
)
# where a node's programs write when their configuration does not say otherwise
DEFAULT_FOLDERS = (
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/nri",
    "/etc/containerd",
    "/etc/cni",
    "/etc/cdi",
    "/opt/cni",
    "/opt/containerd",
    "/usr/libexec/kubernetes",
)


@pytest.fixture(scope="module")
def node_cluster(node_plane: ControlPlane) -> Iterator[Cluster]:
    client = Cluster(node_plane)
    try:
        yield client
    finally:
        client.http.close()


def app_base(plane: ControlPlane) -> str:
    """The app base image as the node pulls it: ``registry:80/…@sha256:…``."""
    pushed = str(plane.images[images.APP_BASE])
    return "registry:80/" + pushed.split("/", 1)[1]


def run_pod(cluster: Cluster, name: str, image: str, **spec: Any) -> dict[str, Any]:
    """A pod that sleeps (its container given ``spec``'s ``container`` fields, the pod
    the rest), once Ready."""
    container = {
        "name": "main",
        "image": image,
        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
        **spec.pop("container", {}),
    }
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [container], **spec},
            }
        ),
    )
    path = f"/api/v1/namespaces/default/pods/{name}"

    def ready() -> dict[str, Any] | None:
        pod = cluster.get(path)
        conditions = (pod.get("status") or {}).get("conditions") or []
        is_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        return pod if is_ready else None

    return cluster.wait(f"pod {name} Ready", ready, timeout=120)


@pytest.fixture(scope="module")
def probe_pod(node_plane: ControlPlane, node_cluster: Cluster) -> dict[str, Any]:
    return run_pod(node_cluster, "probe", app_base(node_plane))


def in_probe(cluster: Cluster, script: str) -> str:
    """What ``script`` (busybox's sh) says in the probe pod, its errors too, and its
    exit status as a last line ``exit=N``."""
    return cluster.kubectl(
        "exec", "probe", "--", "sh", "-c", f"{{ {script}; }} 2>&1; echo exit=$?", check=False
    )


def resolve(cluster: Cluster, name: str) -> str | None:
    """The address the pod's resolver (CoreDNS) gives ``name``, fully qualified."""
    said = in_probe(cluster, f"nslookup {name}").split("Name:", 1)
    found = re.search(r"Address(?: 1)?:\s*(\S+)", said[1]) if len(said) == 2 else None
    return found[1] if found else None


def fetch(cluster: Cluster, url: str) -> str | None:
    """The body a GET of ``url`` answers in the pod (the pod's own resolver and search
    domains), or None."""
    said = in_probe(cluster, f"wget -q -O- {url}")
    body, _, status = said.rpartition("exit=")
    return body if status.strip() == "0" else None


def connect(cluster: Cluster, host: str, port: int) -> str:
    """What busybox's nc says connecting from the pod: ``exit=0`` once connected."""
    return in_probe(cluster, f"nc -w 3 {host} {port} </dev/null").strip()


def test_the_node_is_ready_as_a_worker(node_plane: ControlPlane, node_cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in node_cluster.items("/api/v1/nodes")}
    # beside it only kwok's event-path node, which its taint keeps every other pod off
    assert set(nodes) == {node_plane.node_name, EVENTS_NODE}
    assert nodes[EVENTS_NODE]["spec"]["taints"] == [EVENTS_TAINT]
    node = nodes[node_plane.node_name]
    labels = node["metadata"]["labels"]
    assert "node-role.kubernetes.io/worker" in labels
    assert "node-role.kubernetes.io/control-plane" not in labels
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == node_plane.node_ip
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def test_a_pod_pulled_by_digest_runs(node_plane: ControlPlane, probe_pod: dict[str, Any]) -> None:
    (status,) = probe_pod["status"]["containerStatuses"]
    image = app_base(node_plane)
    assert "@sha256:" in image
    assert status["ready"] is True
    # what containerd pulled, by the digest the registry gave at the push
    assert status["imageID"] == image
    assert probe_pod["spec"]["nodeName"] == node_plane.node_name


def test_a_pods_volumes_reach_its_container(
    node_cluster: Cluster, probe_pod: dict[str, Any]
) -> None:
    """The kubelet's mounts (its ServiceAccount token's projected volume) are the
    container's: the two share the node's mount namespace."""
    said = in_probe(node_cluster, "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace")
    assert said == "defaultexit=0\n"


def test_a_claim_binds_on_the_node_and_a_non_root_pod_writes_to_it(
    node_plane: ControlPlane, node_cluster: Cluster
) -> None:
    """A claim of the default class (the EventBus's JetStream storage asks one) binds,
    once its pod is scheduled, to a local volume of the node, a folder of the plane's,
    which a pod running as uid 1000 (as fabrique's pods do) writes to."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "workspace", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    node_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(claim))
    run_pod(
        node_cluster,
        "writer",
        app_base(node_plane),
        securityContext={"runAsUser": 1000, "runAsGroup": 1000},
        volumes=[{"name": "work", "persistentVolumeClaim": {"claimName": "workspace"}}],
        container={
            "command": ["sh", "-c", "echo written > /work/file && sleep 3600"],
            "volumeMounts": [{"name": "work", "mountPath": "/work"}],
        },
    )
    bound = node_cluster.get("/api/v1/namespaces/default/persistentvolumeclaims/workspace")
    volume = node_cluster.get(f"/api/v1/persistentvolumes/{bound['spec']['volumeName']}")
    folder = Path(volume["spec"]["local"]["path"])
    assert node_plane.folder in folder.parents
    node_cluster.wait(
        "the pod's file in the local volume's folder", lambda: (folder / "file").exists(), 30
    )
    assert (folder / "file").read_text() == "written\n"
    assert (folder / "file").stat().st_uid == 1000


def test_a_pod_resolves_and_reaches_the_planes_names(
    node_plane: ControlPlane, node_cluster: Cluster, probe_pod: dict[str, Any]
) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(EXPOSED.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((node_plane.address, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        node_plane.expose("gitea", "gitea-http", 3000, server.server_address[1])
        service = node_cluster.get("/api/v1/namespaces/gitea/services/gitea-http")
        name = "gitea-http.gitea.svc.cluster.local"
        url = f"http://{name}:3000/"
        assert resolve(node_cluster, name) == service["spec"]["clusterIP"]
        # kube-proxy programs a new Service a moment after it is made
        exposed = node_cluster.wait(
            "the exposed service answering in a pod",
            lambda: fetch(node_cluster, url),
            timeout=30,
        )
        short = fetch(node_cluster, "http://gitea-http.gitea:3000/")  # the search domains
        # and a host program run in the node's namespaces (Argo CD's repo-server, say)
        fetched = subprocess.run(
            node_plane.in_node(
                [
                    sys.executable,
                    "-c",
                    f"import urllib.request as u; print(u.urlopen({url!r}).read().decode(), end='')",
                ]
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert exposed == short == fetched.stdout == EXPOSED, fetched.stderr
    assert resolve(node_cluster, "registry.") == node_plane.address
    assert fetch(node_cluster, "http://registry/v2/") == "{}"
    # the `kubernetes` Service leads to the API server: Go's TLS server answers plain
    # HTTP with a 400 of its own
    kubernetes = node_cluster.get("/api/v1/namespaces/default/services/kubernetes")
    assert (
        resolve(node_cluster, "kubernetes.default.svc.cluster.local")
        == (kubernetes["spec"]["clusterIP"])
    )
    said = in_probe(
        node_cluster, r"printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 kubernetes.default.svc 443"
    )
    assert "Client sent an HTTP request to an HTTPS server" in said, said


def test_a_pod_reaches_nothing_outside_the_plane(
    node_plane: ControlPlane, node_cluster: Cluster, probe_pod: dict[str, Any]
) -> None:
    # a server on every host address, which closes what it accepts: the host's outside
    # addresses must stay out of reach (refused would mean reached), while the plane's
    # own address answers
    server = socketserver.ThreadingTCPServer(("0.0.0.0", 0), socketserver.BaseRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert connect(node_cluster, node_plane.address, port).endswith("exit=0")
        outside = ["192.0.2.1", *_outside_addresses()]  # TEST-NET-1, the host's own
        for address in outside:
            said = connect(node_cluster, address, port)
            assert any(words in said for words in UNREACHABLE), (address, said)
    finally:
        server.shutdown()
        server.server_close()
    # and no name outside: CoreDNS forwards nothing
    assert resolve(node_cluster, "example.com") is None


def test_a_node_plane_stopped_after_a_crash_leaves_the_machine_as_found(
    node_plane: ControlPlane, tmp_path: Path
) -> None:
    """A second plane beside the session's (each takes its own index), a pod run on it,
    then its node's programs killed as a crash kills them, with the pod's processes and
    shims left running; ``make down``'s stop from its folder's state removes the rest,
    and a second stop has nothing to do."""
    before = _machine()
    folder = tmp_path / "plane"
    plane = ControlPlane(folder, node=True).start(controlplane.binaries(controlplane.NODE_PEERS))
    try:
        assert plane.real_node.index != node_plane.real_node.index
        cluster = Cluster(plane)
        try:
            run_pod(cluster, "crashed", app_base(plane))
        finally:
            cluster.http.close()
        running = _node_processes(plane)
        assert any(
            Path(f"/proc/{pid}/exe").resolve().name == "containerd-shim-runc-v2" for pid in running
        )
        during = _machine()
        assert during["netns"] != before["netns"] and during["mounts"] != before["mounts"]
        assert during["cgroups"] != before["cgroups"]
        for name in ("kubelet", "containerd", "node-holder"):
            os.kill(plane.pids[name], signal.SIGKILL)
    finally:
        loaded = ControlPlane.load(folder)
        assert loaded is not None and loaded.worker is not None
        loaded.stop()
        for process in plane.processes.values():  # this one's children, stopped by the other
            process.wait(timeout=10)
    assert ControlPlane.load(folder) is None
    loaded.stop()  # again: nothing left to stop
    # the killed shims' zombies, until init reaps them
    until(
        f"processes {running} to be gone",
        lambda: all(_exited(pid) is not None for pid in running),
        10,
        every=0.1,
        detail=lambda: f"left: {[pid for pid in running if _exited(pid) is None]}",
    )
    after = _machine()
    for part in before:
        assert after[part] == before[part], part
    assert _mentioning(folder) == []
    # the session's plane is untouched by the other's stop
    ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    assert node_plane.kubectl("get", "node", node_plane.node_name, "-o", ready) == "True"


def _outside_addresses() -> list[str]:
    """The host's IPv4 addresses but loopback and the planes' veth ends."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if not fields[1].startswith("fab"):
            found.append(fields[3].split("/")[0])
    return found


def _node_processes(plane: ControlPlane) -> list[int]:
    """The processes in the node's mount namespace (its programs, the shims), and in
    its cgroups (the pods')."""
    node = plane.real_node
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns/mnt") == node.mount_ns:
                    found.add(int(entry.name))
            except OSError:
                continue
    for hierarchy in _hierarchies():
        for procs in hierarchy.glob(f"{node.cgroup.strip('/')}/**/cgroup.procs"):
            found.update(int(p) for p in procs.read_text().split())
    return sorted(found)


def _mentioning(folder: Path) -> list[str]:
    """The processes whose command line names ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(folder) in line:
                found.append(f"{entry.name}: {line}")
    return found


def _machine() -> dict[str, Any]:
    """What a node may change on the machine, as one look sees it."""
    mounts = sorted(
        (fields[4], fields[fields.index("-") + 1])
        for fields in (
            line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()
        )
    )
    cgroups = {
        str(hierarchy): sorted(p.name for p in hierarchy.iterdir() if p.is_dir())
        for hierarchy in _hierarchies()
    }
    listed = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, check=False)
    settings = dict(
        line.split(" = ", 1)
        for line in listed.stdout.splitlines()
        if " = " in line and not VOLATILE.match(line)
    )
    hashsize = Path("/sys/module/nf_conntrack/parameters/hashsize")
    if hashsize.exists():
        settings["nf_conntrack.hashsize"] = hashsize.read_text().strip()
    netns = Path("/run/netns")
    return {
        "netns": sorted(os.listdir(netns)) if netns.is_dir() else None,
        "links": sorted(os.listdir("/sys/class/net")),
        "mounts": mounts,
        "cgroups": cgroups,
        "sysctls": settings,
        "folders": {f: Path(f).exists() for f in DEFAULT_FOLDERS},
    }
