"""A real worker node beside the live control plane (``ControlPlane(folder, node=True)``):
containerd and runc run the pods, the kubelet registers the node, kube-proxy programs
Services, CoreDNS answers ``cluster.local``, a docker-registry serves images as
``registry:80``, as on kind's node.

Where it runs, and why nothing of it reaches the rest of the machine:

- **A network namespace of its own**, ``fabrique-N``: the plane takes the first free
  index N (1..250) by creating it (``ip netns add`` refuses a name taken, so planes that
  start at once never share one). A veth joins it to the host: ``fabN`` 10.255.N.1 on
  the host side (the API server and the registry listen there), ``node0`` 10.255.N.2
  inside (the node's IP). Pods get 10.244.0.0/24 on a CNI bridge, masqueraded to the node
  IP on their way to the host end. The namespace has no route beyond 10.255.N.0/24 (its
  default route is ``unreachable``), and nothing is changed in the host's namespace but
  the veth's end: no forwarding, no NAT, no firewall rule. Bridges, nftables rules and
  ``ip_forward`` are the namespace's own.
- **A mount namespace of its own**, held by one process (``unshare --mount`` running
  ``sleep``), which containerd, its shims, runc, the kubelet, kube-proxy and CoreDNS join
  with the network namespace (``nsenter``, not ``ip netns exec``, which would remount
  ``/sys`` and hide the cgroups). In it: a tmpfs on ``/run`` (containerd's state and
  sockets, the shims' sockets, runc's state, the pods' network namespaces); ``/var/lib``
  and ``/var/log`` as overlays whose upper layer is in the plane's folder (the CNI cache
  and IPAM state, ``/var/log/containers``); and the machine-wide kernel settings the
  kubelet writes at start (``setupKernelTunables``: ``vm.overcommit_memory``,
  ``kernel.panic``…) and the conntrack hash size kube-proxy may write, each covered by a
  plain file of the folder, so their writes never reach the kernel. Every mount the
  kubelet and containerd make (volumes, root filesystems, the kubelet's own root-dir
  bind) dies with the namespace.
- **Cgroups under ``/fabrique-N``** in every hierarchy (the kubelet's ``cgroupRoot``),
  so that two planes' pods never meet.

Stopping (``teardown``) kills what runs in the plane's cgroups, its mount namespace and
its network namespace, removes the cgroups and the network namespace (the veth goes with
it): a stop after a crash finds all of it again from the index in ``state.json``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..waits import until
from .controlplane import NETPOL_USER, SERVICE_CIDR, ControlPlaneError, _http_ok, write_secret

if TYPE_CHECKING:
    from .controlplane import ControlPlane

# the indexes a plane may take: 10.255.255.0/24 is left alone (this machine's resolver
# lives there)
INDEXES = range(1, 251)
NETNS_DIR = Path("/run/netns")
CGROUPS = Path("/sys/fs/cgroup")
POD_CIDR = "10.244.0.0/24"
CLUSTER_DOMAIN = "cluster.local"
REGISTRY_NAME = "registry"
RUNC = "/usr/sbin/runc"
CNI_BIN = "/usr/lib/cni"
# what the kubelet sets machine-wide at start (pkg/kubelet/cm/container_manager_linux.go,
# setupKernelTunables) and kube-proxy may (the conntrack table's hash size): each is
# covered, in the node's mount namespace, by a file of the plane's folder
MASKED = (
    "/proc/sys/vm/overcommit_memory",
    "/proc/sys/vm/panic_on_oom",
    "/proc/sys/kernel/panic",
    "/proc/sys/kernel/panic_on_oops",
    "/proc/sys/kernel/keys/root_maxkeys",
    "/proc/sys/kernel/keys/root_maxbytes",
    "/sys/module/nf_conntrack/parameters/hashsize",
)
# the host folders the node's programs write in whatever their configuration says (the
# CNI cache, /var/log/containers): overlays, their upper layer in the plane's folder
OVERLAID = ("/var/lib", "/var/log")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The outside world: a network namespace of the plane's own behind the node's, standing
# for the Internet. A veth joins them (the node's end, the world's), and the node routes
# there each host's block alone: every other address stays unreachable.
WORLD_LINK = ("100.64.0.1", "100.64.0.2")
# {role: (the host's address, the block the node routes to it)}
WORLD_HOSTS = {
    # TEST-NET-3: the live site lists this block in the build's allowlist
    "allowlisted": ("203.0.113.10", "203.0.113.0/24"),
    # TEST-NET-2: in no list
    "outside": ("198.51.100.10", "198.51.100.0/24"),
    # inside the first of GitHub's published git ranges (the default site's
    # mirrorSync.githubCidrs): what Gitea's mirrors pull from
    "github": ("140.82.112.10", "140.82.112.0/20"),
}
# what every host of the world serves (TCP): the build's 443 and a plain 80 beside it
WORLD_PORTS = (80, 443)
NETPOL_MODULE = "sigs.k8s.io/kube-network-policies"
# the queue the NetworkPolicy engine reads (its --nfqueue-id default)
NETPOL_QUEUE = 100
NETPOL_METRICS = "127.0.0.1:9080"
# where client-go's in-cluster config reads its token and CA, in the node's mount
# namespace (its /run is the node's own)
SERVICE_ACCOUNT_DIR = "/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class Node:
    """The node of one plane: its index, the process holding its mount namespace, and
    the images pushed to its registry."""

    folder: Path  # the plane's folder
    index: int
    holder: int = 0
    mount_ns: str = ""
    images: dict[str, Any] = field(default_factory=dict)

    # -- names and addresses ----------------------------------------------------------------

    @property
    def netns(self) -> str:
        return f"fabrique-{self.index}"

    @property
    def address(self) -> str:
        """The host's end of the veth: the API server and the registry listen here."""
        return f"10.255.{self.index}.1"

    @property
    def ip(self) -> str:
        """The node's IP, inside its network namespace."""
        return f"10.255.{self.index}.2"

    @property
    def name(self) -> str:
        return f"fabrique-node-{self.index}"

    @property
    def veth(self) -> str:
        return f"fab{self.index}"

    @property
    def cgroup(self) -> str:
        return f"/fabrique-{self.index}"

    @property
    def registry(self) -> str:
        """The registry as the host reaches it (pushes go here)."""
        return f"{self.address}:80"

    @property
    def dir(self) -> Path:
        return self.folder / "node"

    @property
    def world_netns(self) -> str:
        """The outside world's network namespace."""
        return f"{self.netns}-world"

    def netpol_values(self, api_port: int) -> dict[str, Any]:
        """The site's ``netpol`` on this plane. Gitea and the registry run on the host's
        end of the veth, CoreDNS on the node's IP, the API server on the host's end at
        ``api_port``: none is a pod, so the policies reach them by address, as a site
        reaches a registry outside its cluster or a node-local DNS cache. The build's
        allowlist is the world's allowlisted block; GitHub's stays the default site's."""
        host = [f"{self.address}/32"]
        return {
            "dns": {"cidrs": [f"{self.ip}/32"]},
            "gitea": {"cidrs": host},
            "registry": {"cidrs": host},
            "apiServerCidrs": host,
            "apiServerPorts": [api_port],
            "egressCidrs": [WORLD_HOSTS["allowlisted"][1]],
        }

    def state(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "holder": self.holder,
            "mount_ns": self.mount_ns,
            "images": self.images,
        }

    @classmethod
    def from_state(cls, folder: Path, state: dict[str, Any]) -> Node:
        return cls(folder, int(state["index"]), state["holder"], state["mount_ns"], state["images"])

    # -- running a program on the node --------------------------------------------------------

    def in_netns(self, argv: list[str]) -> list[str]:
        """``argv`` run in the node's network namespace only, with the host's files and
        mounts (and its resolver, which the namespace cannot reach): a host program that
        must reach pod and Service IPs as the node does."""
        return ["nsenter", f"--net={NETNS_DIR / self.netns}", "--", *argv]

    def in_node(self, argv: list[str], cwd: Path | None = None) -> list[str]:
        """``argv`` run as the node's own programs run: in its network namespace and its
        mount namespace, where ``/etc/resolv.conf`` names CoreDNS (Service names
        resolve) and ``/run`` is the node's (containerd's socket among it). Entering a
        mount namespace starts in its ``/``: the working directory is ``cwd``, else
        ``/``."""
        if not self.holder:
            raise ControlPlaneError(f"node {self.name}: its mount namespace is not held")
        return [
            "nsenter",
            f"--mount=/proc/{self.holder}/ns/mnt",
            f"--net={NETNS_DIR / self.netns}",
            *([f"--wdns={cwd}"] if cwd else []),
            "--",
            *argv,
        ]

    def run(self, argv: list[str], timeout: float = 60, stdin: str | None = None) -> str:
        """Run ``argv`` on the node; its output, or a ControlPlaneError naming it."""
        done = subprocess.run(
            self.in_node(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise ControlPlaneError(
                f"on node {self.name}: {shlex.join(argv)} exited {done.returncode}: "
                f"{done.stderr.strip()}"
            )
        return done.stdout

    # -- claim --------------------------------------------------------------------------------

    @classmethod
    def claim(cls, folder: Path) -> Node:
        """The first free index, taken by creating its network namespace."""
        for index in INDEXES:
            made = subprocess.run(
                ["ip", "netns", "add", f"fabrique-{index}"],
                capture_output=True,
                text=True,
                check=False,
            )
            if made.returncode == 0:
                return cls(folder, index)
            if "File exists" not in made.stderr:
                raise ControlPlaneError(
                    f"ip netns add fabrique-{index} exited {made.returncode}: {made.stderr.strip()}"
                )
        raise ControlPlaneError(
            f"every network namespace fabrique-{INDEXES[0]}..{INDEXES[-1]} is taken: "
            "stop planes left running (make down, or their folder's state.json)"
        )

    # -- start --------------------------------------------------------------------------------

    def network(self) -> None:
        """The veth between the host and the node, the node's addresses and routes."""
        netns = self.netns
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", "node0", "netns", netns)
        _ip("addr", "add", f"{self.address}/24", "dev", self.veth)
        _ip("link", "set", self.veth, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "addr", "add", f"{self.ip}/24", "dev", "node0")
        _ip("-n", netns, "link", "set", "node0", "up")
        # nothing beyond the host's end: an address outside is unreachable at once
        _ip("-n", netns, "route", "add", "unreachable", "default")
        # Service IPs need a route for the node's own programs: their packets meet
        # kube-proxy's DNAT after the route lookup, which the unreachable default fails
        # (a pod's meet it before). What no endpoint takes goes to the host, which
        # forwards nothing
        _ip("-n", netns, "route", "add", SERVICE_CIDR, "dev", "node0")
        # the pods' traffic leaves the bridge through node0: the namespace's own setting
        _sysctl_in(netns, "net.ipv4.ip_forward", "1")

    def hold_mounts(self, plane: ControlPlane) -> None:
        """The node's mount namespace, held by one process, and what is mounted in it."""
        plane._spawn(
            "node-holder", ["unshare", "--mount", "--propagation", "slave", "sleep", "infinity"]
        )
        self.holder = plane.pids["node-holder"]
        own = os.readlink("/proc/self/ns/mnt")

        def unshared() -> bool:
            with contextlib.suppress(OSError):
                self.mount_ns = os.readlink(f"/proc/{self.holder}/ns/mnt")
            return bool(self.mount_ns) and self.mount_ns != own

        plane._wait("node-holder", unshared, 10)
        masks, lines = self.dir / "masked", ["set -eu"]
        masks.mkdir(parents=True, exist_ok=True)
        lines.append(f"mount -t tmpfs -o mode=0755,size=1g fabrique-{self.index}-run /run")
        # the kubelet's root-dir at a short path: the sockets it makes there must fit
        # in a socket address (108 bytes), which a folder of pytest's tmp_path may not
        root = self.dir / "kubelet" / "root"
        root.mkdir(parents=True, exist_ok=True)
        lines.append(
            f"mkdir {KUBELET_ROOT} && mount --bind {shlex.quote(str(root))} {KUBELET_ROOT}"
        )
        for where in OVERLAID:
            upper = self.dir / "overlay" / where.strip("/").replace("/", "-")
            (upper / "upper").mkdir(parents=True, exist_ok=True)
            (upper / "work").mkdir(parents=True, exist_ok=True)
            lines.append(
                f"mount -t overlay overlay -o lowerdir={where},upperdir={upper / 'upper'},"
                f"workdir={upper / 'work'} {where}"
            )
        for path in MASKED:
            real = Path(path)
            if not real.exists():
                continue
            cover = masks / path.strip("/").replace("/", ".")
            cover.write_text(real.read_text())
            lines.append(f"mount --bind {shlex.quote(str(cover))} {path}")
        # the node's resolver for what runs in the namespace: CoreDNS, Service names
        # first (the host's resolver is out of the namespace's reach)
        resolv = self.dir / "node-resolv.conf"
        resolv.write_text(
            f"nameserver {self.ip}\nsearch svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\noptions ndots:5\n"
        )
        lines.append(f"mount --bind {shlex.quote(str(resolv))} /etc/resolv.conf")
        # the NetworkPolicy engine's in-cluster credentials (start_netpol writes them)
        account = self.dir / "serviceaccount"
        account.mkdir(mode=0o700, exist_ok=True)
        lines.append(
            f"mkdir -p {SERVICE_ACCOUNT_DIR} && "
            f"mount --bind {shlex.quote(str(account))} {SERVICE_ACCOUNT_DIR}"
        )
        self.run(["sh", "-c", "\n".join(lines)])

    def cgroups(self) -> None:
        """The kubelet's cgroupRoot, in every hierarchy (the kubelet wants it there)."""
        for hierarchy in _hierarchies():
            (hierarchy / self.cgroup.strip("/")).mkdir(exist_ok=True)

    def start_registry(self, plane: ControlPlane) -> None:
        """Debian's docker-registry on the host's end, port 80: ``registry:80`` for the
        plane (CoreDNS), and the mirror of docker.io and quay.io (containerd)."""
        config = self.dir / "registry.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "version": 0.1,
                    "log": {"level": "error", "accesslog": {"disabled": True}},
                    "storage": {
                        "filesystem": {"rootdirectory": str(self.dir / "registry")},
                        "delete": {"enabled": True},
                    },
                    "http": {"addr": self.registry},
                }
            )
        )
        plane._spawn("registry", ["docker-registry", "serve", str(config)])
        plane._wait("registry", lambda: _http_ok(f"http://{self.registry}/v2/"), 30)

    def push_images(self) -> None:
        """The images the node's pods run (its pause image first), made or taken from
        their cache; not fabrique's tools image, which its own tests build and push."""
        # imported here: the images are another module's, built on demand
        from . import images

        try:
            self.images = dict(images.push_node_images(self.registry, tools=False))
        except images.ImageError as failed:
            raise ControlPlaneError(f"node {self.name}'s images: {failed}") from None

    def start_containerd(self, plane: ControlPlane) -> None:
        bins = plane.bins
        certs = self.dir / "certs.d"
        for name in (f"{REGISTRY_NAME}:80", "docker.io", "quay.io"):
            (certs / name).mkdir(parents=True, exist_ok=True)
            (certs / name / "hosts.toml").write_text(
                f'server = "http://{self.registry}"\n\n'
                f'[host."http://{self.registry}"]\n'
                '  capabilities = ["pull", "resolve"]\n'
            )
        cni = self.dir / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-fabrique.conflist").write_text(json.dumps(self._cni_config(), indent=1))
        config = self.dir / "containerd.toml"
        config.write_text(self._containerd_config(certs, cni))
        shim = Path(bins["containerd-shim-runc-v2"]).parent
        plane._spawn(
            "containerd",
            self.in_node([bins["containerd"], f"--config={config}"]),
            env={"PATH": f"{shim}:{PATH}"},
        )
        plane._wait("containerd", lambda: self._answers(plane), 30)

    def forget_image(self, plane: ControlPlane, ref: str) -> None:
        """Drop ``ref`` from the node's image store, so that its next pod pulls it again:
        ``make up``'s node keeps its store from one plane to the next, and an image pushed
        again under the same tag (the tools image of a changed checkout) would otherwise
        be run as it was (the pods pull if not present)."""
        ctr = [plane.bins["ctr"], "--address", CONTAINERD_SOCKET, "-n", "k8s.io"]
        done = subprocess.run(
            self.in_node([*ctr, "images", "rm", ref]),
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        # an image not there is a warning and exit 0 (ctr's images rm); a failure would
        # leave the old image run
        if done.returncode != 0:
            raise ControlPlaneError(f"node {self.name}: ctr images rm {ref}: {done.stderr.strip()}")

    def _answers(self, plane: ControlPlane) -> bool:
        done = subprocess.run(
            self.in_node([plane.bins["ctr"], "--address", CONTAINERD_SOCKET, "version"]),
            capture_output=True,
            check=False,
            timeout=10,
        )
        return done.returncode == 0

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "fabrique",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    # pods reach the host's end (the API server, the registry, what is
                    # exposed) as the node: the host has no route to the pods
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _containerd_config(self, certs: Path, cni: Path) -> str:
        from . import images

        root = self.dir / "containerd"
        cri = "plugins.'io.containerd.cri.v1"
        return f"""\
version = 3
root = "{root}"
# the node's own /run: a tmpfs of its mount namespace
state = "/run/containerd"
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins.'io.containerd.internal.v1.opt']
  path = "{self.dir / "opt"}"

[{cri}.images']
  snapshotter = "overlayfs"
  [{cri}.images'.pinned_images]
    sandbox = "{images.PAUSE}"
  [{cri}.images'.registry]
    config_path = "{certs}"

[{cri}.runtime']
  # this machine's root has no CAP_SYS_RESOURCE: runc may not lower oom_score_adj
  restrict_oom_score_adj = true
  cdi_spec_dirs = []
  [{cri}.runtime'.cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{cni}"
  [{cri}.runtime'.containerd]
    default_runtime_name = "runc"
    [{cri}.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        Root = "/run/containerd/runc"
        SystemdCgroup = false
"""

    def start_kubelet(self, plane: ControlPlane) -> None:
        kubelet = self.dir / "kubelet"
        for sub in ("pki", "pod-logs", "volume-plugins"):
            (kubelet / sub).mkdir(parents=True, exist_ok=True)
        resolv = self.dir / "resolv.conf"
        # what a pod of dnsPolicy Default gets, and the kubelet adds ClusterFirst pods'
        # search domains to: the node's resolver, nothing of the host's
        resolv.write_text(f"nameserver {self.ip}\n")
        config = kubelet / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "failCgroupV1": False,  # this machine's cgroups are v1
                    "cgroupDriver": "cgroupfs",
                    "cgroupRoot": self.cgroup,
                    "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
                    "address": self.ip,
                    "readOnlyPort": 0,
                    "healthzBindAddress": self.ip,
                    "authentication": {
                        "anonymous": {"enabled": True},
                        "webhook": {"enabled": False},
                    },
                    "authorization": {"mode": "AlwaysAllow"},
                    "failSwapOn": False,
                    "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE to lower its own
                    "resolvConf": str(resolv),
                    "clusterDNS": [self.ip],
                    "clusterDomain": CLUSTER_DOMAIN,
                    "podLogsDir": str(kubelet / "pod-logs"),
                    "volumePluginDir": str(kubelet / "volume-plugins"),
                    "evictionHard": {
                        "memory.available": "100Mi",
                        "nodefs.available": "1%",
                        "nodefs.inodesFree": "1%",
                        "imagefs.available": "1%",
                        "imagefs.inodesFree": "1%",
                    },
                    # no image is ever collected: the registry's are all the plane has
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 99,
                    "serializeImagePulls": False,
                }
            )
        )
        plane._spawn(
            "kubelet",
            self.in_node(
                [
                    plane.bins["kubelet"],
                    f"--config={config}",
                    f"--kubeconfig={plane.kubeconfig}",
                    f"--hostname-override={self.name}",
                    f"--node-ip={self.ip}",
                    f"--root-dir={KUBELET_ROOT}",
                    f"--cert-dir={kubelet / 'pki'}",
                ]
            ),
            env={"PATH": PATH},
        )
        plane._wait("kubelet", lambda: self._ready(plane), 90)
        # a worker: no control-plane label, which the build template's affinity shuns
        # (the kubelet may not set node-role labels on itself)
        plane.kubectl("label", "node", self.name, "node-role.kubernetes.io/worker=", "--overwrite")

    def _ready(self, plane: ControlPlane) -> bool:
        out = plane.kubectl(
            "get",
            "node",
            self.name,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        return out.strip() == "True"

    def start_kube_proxy(self, plane: ControlPlane) -> None:
        """kube-proxy in nftables mode: the kernel's current packet filter, the mode
        upstream develops, and no iptables lock shared with the CNI plugins."""
        config = self.dir / "kube-proxy.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "mode": "nftables",
                    "clientConnection": {"kubeconfig": str(plane.kubeconfig)},
                    "hostnameOverride": self.name,
                    "bindAddress": self.ip,
                    "healthzBindAddress": f"{self.ip}:10256",
                    "metricsBindAddress": "127.0.0.1:10249",
                    "clusterCIDR": POD_CIDR,
                    "oomScoreAdj": 0,
                    # leave the conntrack table's size and timeouts as they are: its size
                    # (and the module's hash size) is machine-wide
                    "conntrack": {
                        "maxPerCore": 0,
                        "min": 0,
                        "tcpEstablishedTimeout": "0s",
                        "tcpCloseWaitTimeout": "0s",
                        "udpTimeout": "0s",
                        "udpStreamTimeout": "0s",
                    },
                }
            )
        )
        plane._spawn(
            "kube-proxy",
            self.in_node([plane.bins["kube-proxy"], f"--config={config}"]),
            env={"PATH": PATH},
        )
        plane._wait("kube-proxy", lambda: _http_ok(f"http://{self.ip}:10256/healthz"), 60)

    def start_coredns(self, plane: ControlPlane) -> None:
        """CoreDNS on the node's IP: ``cluster.local`` from the API server, ``registry``
        the host's end, every other name refused (nothing is forwarded)."""
        corefile = self.dir / "Corefile"
        corefile.write_text(
            f"""\
{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {self.ip}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {plane.kubeconfig} fabrique-live
        pods insecure
    }}
    ready {self.ip}:8181
}}
{REGISTRY_NAME}:53 {{
    bind {self.ip}
    hosts {{
        {self.address} {REGISTRY_NAME}
    }}
}}
"""
        )
        plane._spawn("coredns", self.in_node([plane.bins["coredns"], "-conf", str(corefile)]))
        plane._wait("coredns", lambda: _http_ok(f"http://{self.ip}:8181/ready"), 60)

    def start_world(self, plane: ControlPlane) -> None:
        """The outside world (``WORLD_HOSTS``): a network namespace behind the node's, its
        hosts' addresses on its loopback, one listener answering on ``WORLD_PORTS`` for
        all of them. Pods reach it as they would the Internet: routed by the node,
        masqueraded to the node's end of the link."""
        world, node = self.world_netns, self.netns
        # one left by a plane that crashed before its stop: this index is ours now
        subprocess.run(["ip", "netns", "delete", world], capture_output=True, check=False)
        _ip("netns", "add", world)
        _ip("-n", node, "link", "add", "world0", "type", "veth",
            "peer", "name", "ext0", "netns", world)  # fmt: skip
        _ip("-n", node, "addr", "add", f"{WORLD_LINK[0]}/30", "dev", "world0")
        _ip("-n", node, "link", "set", "world0", "up")
        _ip("-n", world, "link", "set", "lo", "up")
        _ip("-n", world, "addr", "add", f"{WORLD_LINK[1]}/30", "dev", "ext0")
        _ip("-n", world, "link", "set", "ext0", "up")
        _ip("-n", world, "route", "add", "default", "via", WORLD_LINK[0])
        for address, block in WORLD_HOSTS.values():
            _ip("-n", world, "addr", "add", f"{address}/32", "dev", "lo")
            _ip("-n", node, "route", "add", block, "via", WORLD_LINK[1])
        ready = self.dir / "world.ready"
        ready.unlink(missing_ok=True)
        listener = Path(__file__).with_name("packets.py")
        plane._spawn(
            "world",
            [
                "nsenter", f"--net={NETNS_DIR / world}", "--",
                sys.executable, str(listener), "serve", "world", str(ready),
                *(f"tcp:{port}" for port in WORLD_PORTS),
            ],
        )  # fmt: skip
        plane._wait("world", ready.exists, 30)

    def start_netpol(self, plane: ControlPlane) -> None:
        """kube-network-policies, the NetworkPolicy engine kind runs, beside kube-proxy.

        Upstream's dataplane is one nftables chain on POSTROUTING, before SNAT: packets of
        a new connection from or to a pod go to the engine's nfqueue, which judges them
        by the policies. It writes that chain with nftables' ``queue`` statement, which
        a kernel without CONFIG_NFT_QUEUE refuses (its sync fails, and its listener runs
        on). The node writes the same rules with iptables' NFQUEUE target instead
        (``_netpol_rules``), once the engine holds the queue: no packet is judged before
        the engine reads it, and, as upstream's, a packet the engine cannot judge is
        dropped (no bypass)."""
        account = self.dir / "serviceaccount"
        write_secret(account / "token", (plane.folder / "netpol.token").read_text().strip())
        (account / "ca.crt").write_bytes((plane.folder / "ca.crt").read_bytes())
        (account / "namespace").write_text("kube-system\n")
        plane.kubectl("apply", "-f", "-", stdin=_netpol_rbac())
        plane._spawn(
            "kube-network-policies",
            self.in_node(
                [
                    plane.bins["kube-network-policies"],
                    f"--hostname-override={self.name}",
                    # the node's pods' IPs are read from the API: no NRI in its containerd
                    "--disable-nri",
                    # the DNS race it works around is fixed in kernels 6.12 and later; on
                    # it needs an nftables chain this kernel refuses too
                    "--netfilter-bug-1766-fix=false",
                    f"--nfqueue-id={NETPOL_QUEUE}",
                    f"--metrics-bind-address={NETPOL_METRICS}",
                ]
            ),
            env={
                "KUBERNETES_SERVICE_HOST": self.address,
                "KUBERNETES_SERVICE_PORT": str(plane.ports["apiserver"]),
            },
        )
        plane._wait("kube-network-policies", self._queue_held, 60)
        self.run(["iptables-restore", "--noflush"], stdin=_netpol_rules(self.ip))

    def _queue_held(self) -> bool:
        """The engine reads its queue: /proc/net/netfilter/nfnetlink_queue lists it."""
        held = self.run(["cat", "/proc/net/netfilter/nfnetlink_queue"])
        return any(line.split()[:1] == [str(NETPOL_QUEUE)] for line in held.splitlines())

    # -- stop ---------------------------------------------------------------------------------

    def teardown(self) -> None:
        """Kill what is left of the node (the pods' processes, the shims, every process
        in its namespaces), then remove its cgroups and its network namespace."""
        nets = set()
        for name in (self.netns, self.world_netns):
            with contextlib.suppress(OSError):
                nets.add(f"net:[{(NETNS_DIR / name).stat().st_ino}]")
        for _ in range(50):
            left = self._processes(nets)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        else:
            raise ControlPlaneError(
                f"node {self.name}: processes {sorted(self._processes(nets))} outlive SIGKILL"
            )
        self._remove_cgroups()
        for name in (self.world_netns, self.netns):
            if not (NETNS_DIR / name).exists():
                continue
            deleted = subprocess.run(
                ["ip", "netns", "delete", name], capture_output=True, text=True, check=False
            )
            if deleted.returncode != 0:
                raise ControlPlaneError(f"ip netns delete {name}: {deleted.stderr.strip()}")
        _unmount_netns_dir()
        # the veth goes with the namespace, once its last process is gone
        until(
            f"node {self.name}'s veth {self.veth} to go with it",
            lambda: not Path(f"/sys/class/net/{self.veth}").exists(),
            10,
            every=0.1,
            error=ControlPlaneError,
        )
        self.holder, self.mount_ns = 0, ""

    def _processes(self, nets: set[str]) -> set[int]:
        """The processes of this node: those in its cgroups, and those in its mount
        namespace (the plane's folder among its mounts: an identifier a later
        namespace may take again is not enough) or in its network namespace."""
        found: set[int] = set()
        for hierarchy in _hierarchies():
            root = hierarchy / self.cgroup.strip("/")
            for procs in root.rglob("cgroup.procs") if root.is_dir() else ():
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(p) for p in procs.read_text().split())
        marker = f" {self.dir}/"
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if os.readlink(entry / "ns/net") in nets:
                    found.add(int(entry.name))
                elif self.mount_ns and os.readlink(entry / "ns/mnt") == self.mount_ns:
                    if marker in (entry / "mountinfo").read_text():
                        found.add(int(entry.name))
            except OSError:
                continue
        return found

    def _remove_cgroups(self) -> None:
        for hierarchy in _hierarchies():
            root = hierarchy / self.cgroup.strip("/")
            if not root.is_dir():
                continue
            for folder in sorted(
                (p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                _rmdir_cgroup(folder)
            _rmdir_cgroup(root)


CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
# in the node's mount namespace: the plane's node/kubelet/root
KUBELET_ROOT = "/run/kubelet"


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _sysctl_in(netns: str, key: str, value: str) -> None:
    path = "/proc/sys/" + key.replace(".", "/")
    done = subprocess.run(
        ["nsenter", f"--net={NETNS_DIR / netns}", "--", "sh", "-c", f"echo {value} > {path}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ControlPlaneError(f"{key}={value} in {netns}: {done.stderr.strip()}")


def _hierarchies() -> list[Path]:
    """Every cgroup hierarchy mounted: the unified one alone (cgroup v2), or each v1
    controller's, the named ones and the unified one beside them (hybrid)."""
    if (CGROUPS / "cgroup.controllers").exists():
        return [CGROUPS]
    return sorted(p for p in CGROUPS.iterdir() if p.is_dir() and (p / "cgroup.procs").exists())


def _rmdir_cgroup(folder: Path) -> None:
    """rmdir a cgroup whose processes are gone (the kernel may take a moment after their
    death to let it go)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as failed:
            if failed.errno != errno.EBUSY or time.monotonic() > deadline:
                raise ControlPlaneError(f"rmdir {folder}: {failed.strerror}") from None
            time.sleep(0.1)


def _unmount_netns_dir() -> None:
    """``ip netns add`` made /run/netns a mount of its own: with no namespace left in
    it, undo that (the unmount fails while another plane's namespace is there)."""
    with contextlib.suppress(OSError):
        if any(NETNS_DIR.iterdir()):
            return
        subprocess.run(["umount", str(NETNS_DIR)], capture_output=True, check=False)
        NETNS_DIR.rmdir()


def _netpol_rbac() -> str:
    """Upstream's ClusterRole, from its install.yaml in the module the engine is built
    from (what it reads follows its version), bound to the engine's user."""
    from . import controlplane

    name = "kube-network-policies"
    peer = controlplane.peers.Peer(name, controlplane.ROOT / "tests" / "peers" / name)
    install = controlplane.module_dir(NETPOL_MODULE, peer.required(NETPOL_MODULE))
    documents = yaml.safe_load_all((install / "install.yaml").read_text())
    role = next(d for d in documents if d and d["kind"] == "ClusterRole")
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": role["metadata"]["name"]},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": NETPOL_USER}
        ],
    }
    return yaml.safe_dump_all([role, binding])


def _netpol_rules(node_ip: str) -> str:
    """Upstream's chain (pkg/networkpolicy/controller.go, syncNFTablesRules) in iptables:
    on POSTROUTING, before SNAT (mangle), established and related packets and what the
    node's root sends (the kubelet's probes) pass, and a new connection from or to a pod
    goes to the engine. Upstream hands it the pods some policy selects; here every pod,
    which the engine lets through when no policy selects it.

    One rule more than upstream's: a pod's packets to the node's own address go to the
    engine too (INPUT). CoreDNS runs there, not in a pod, and what never reaches
    POSTROUTING would never be judged: a wrong DNS rule would pass."""
    queue = f"-j NFQUEUE --queue-num {NETPOL_QUEUE}"
    return f"""\
*mangle
:FABRIQUE-NETPOL - [0:0]
-A POSTROUTING -j FABRIQUE-NETPOL
-A FABRIQUE-NETPOL -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
-A FABRIQUE-NETPOL -m owner --uid-owner 0 -j RETURN
-A FABRIQUE-NETPOL -s {POD_CIDR} {queue}
-A FABRIQUE-NETPOL -d {POD_CIDR} {queue}
-A INPUT -s {POD_CIDR} -d {node_ip}/32 -m conntrack --ctstate NEW {queue}
COMMIT
"""
