"""The air-gap, judged by packets on the real node: the rendered NetworkPolicies applied,
kube-network-policies enforcing them (``Node.start_netpol``), real pods with the
namespaces, labels and ServiceAccounts the rendered tree gives fabrique's pods, and the
outside world of the plane (``WORLD_HOSTS``: an allowlisted host, one outside every
list, one in GitHub's ranges, each serving 80 and 443).

Every probe is a new connection from a pod (``packets.py probe``): allowed is a
connection made or a DNS answer; refused is a timeout or a reset, observed. A pod no
policy selects, in ``default``, reaches every target first: what is refused to the
others is the policies' doing, not the routing's.

Two forms of the same site, as a site may write its peers:
- by address (what the live plane's Gitea, registry and CoreDNS need: none runs in a
  pod), the form scenario 34 runs under;
- by pods (the default site's selectors), with stand-in pods carrying the labels the
  default site names for DNS, Gitea and the registry, each listening on its port.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.site.config import load_site

from ..waits import until
from . import images
from .cluster import Cluster
from .controlplane import ControlPlane, render
from .node import WORLD_HOSTS

KUSTOMIZATION = "kustomization.yaml"
# a Service in front of the Gitea stand-in: what a pod reaches through kube-proxy's DNAT
GITEA_SERVICE = "airgap-gitea"
# the second app of the apps' form: its own namespace, widened by name
WIDENED_APP, WIDENED_NAMESPACE = "widened", "dagster-wide"

pytestmark = pytest.mark.xdist_group("real-node")

PACKETS = Path(__file__).with_name("packets.py")
SCRIPT = PACKETS.read_text()
# every probe pod listens here too, for the ingress side
POD_PORT = 8080
# the file a pod's listener writes once every port of it listens
READY = "/tmp/serving"
# the tree's files that make fabrique's namespaces and ServiceAccounts
ACCOUNTS = (
    "namespaces/namespaces.yaml",
    "build/rbac.yaml",
    "reconcile/rbac.yaml",
    "mirror/rbac.yaml",
)
KUBERNETES_SERVICE = "10.0.0.1"  # the first address of the plane's Service CIDR
OPEN, REFUSED = "open", "refused"
# how long a target that should be open is asked again before its refusal counts
OPEN_WAIT = 10


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    account: str | None = None
    serves: tuple[str, ...] = ()  # ports beside POD_PORT, for the stand-ins


def _template_pod(tree: Path, path: str, template: str) -> tuple[dict[str, str], str]:
    """The labels and ServiceAccount that ``template`` of the rendered ``path`` gives
    its pods (the Workflow's own templated labels left out)."""
    for doc in yaml.safe_load_all((tree / path).read_text()):
        if not doc:
            continue
        spec = doc["spec"].get("workflowSpec", doc["spec"])
        for entry in spec["templates"]:
            if entry["name"] == template:
                labels = {k: v for k, v in entry["metadata"]["labels"].items() if "{{" not in v}
                return labels, spec["serviceAccountName"]
    raise AssertionError(f"{path} has no template {template}")


def render_netpol(
    folder: Path, netpol: dict[str, Any], apps: list[dict[str, Any]] | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    values = folder / "site.yaml"
    values.write_text(yaml.safe_dump({"netpol": netpol, **({"apps": apps} if apps else {})}))
    return render(values, folder / "manifests")


def apply_policies(cluster: Cluster, tree: Path) -> None:
    """The tree's namespaces, fabrique's ServiceAccounts and its NetworkPolicies: what
    packets are judged by (the Workflows and CronWorkflows are the scenario's)."""
    policies = sorted(
        f"netpol/{p.name}" for p in (tree / "netpol").glob("*.yaml") if p.name != KUSTOMIZATION
    )
    for name in [*ACCOUNTS, *policies]:
        cluster.kubectl(
            "apply", "--server-side", "--field-manager=fabrique", "-f", str(tree / name)
        )


@dataclass
class Airgap:
    plane: ControlPlane
    cluster: Cluster
    folder: Path
    pods: dict[str, Pod]
    ips: dict[str, str]

    def probe(self, pod: str, targets: list[str]) -> dict[str, str]:
        """What each target gives a connection from ``pod``: ``open`` or ``refused``
        (a timeout or a reset), anything else as said."""
        said = self.cluster.kubectl(
            "exec", "-n", self.pods[pod].namespace, pod, "--",
            "python3", "-c", SCRIPT, "probe", *targets,
        )  # fmt: skip
        found = {}
        for line in said.splitlines():
            target, result = line.split(" ", 1)
            word = result.split()[0]
            found[target] = (
                OPEN if word == "open" else REFUSED if word in ("timeout", "refused") else result
            )
        return found

    def judge(self, pod: str, expected: dict[str, str]) -> None:
        """Each target gives ``pod`` what ``expected`` says. A refusal one observed is
        taken as it is; a target that should be open and was not is asked again, for up
        to ``OPEN_WAIT`` seconds: one connection made proves the way open, and the first
        packets of a connection wait in the engine's queue, which a loaded machine may
        hold past the probe's timeout (or kube-proxy may not have written a new
        Service's rule yet)."""
        got = self.probe(pod, list(expected))

        def shut() -> list[str]:
            return [t for t, want in expected.items() if want == OPEN and got[t] != OPEN]

        def all_open() -> bool | None:
            got.update(self.probe(pod, shut()))
            return not shut() or None

        if shut():
            with contextlib.suppress(TimeoutError):  # what is still shut is said below
                until(f"pod {pod} to reach {shut()}", all_open, OPEN_WAIT, every=1,
                      error=TimeoutError)  # fmt: skip
        wrong = {t: f"{got[t]}, not {want}" for t, want in expected.items() if got[t] != want}
        assert not wrong, f"from pod {pod}: {wrong}"


def _start_pod(cluster: Cluster, pod: Pod, image: str) -> None:
    ports = [f"tcp:{POD_PORT}", *pod.serves]
    security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if pod.serves:  # a stand-in listens on a port below 1024
        security = {"runAsUser": 0}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": image,
                "command": ["python3", "-c", SCRIPT, "serve", pod.name, READY, *ports],
                "securityContext": security,
                # Ready once every port listens, not once the process starts: the first
                # probe of a pod's ports may come the moment it is Ready
                "readinessProbe": {
                    "exec": {"command": ["python3", "-c", f"open({READY!r})"]},
                    "periodSeconds": 1,
                    "failureThreshold": 1,
                },
            }
        ],
    }
    if pod.account:
        spec["serviceAccountName"] = pod.account
        spec["automountServiceAccountToken"] = False
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": pod.labels},
                "spec": spec,
            }
        ),
    )


def _ready_ip(cluster: Cluster, pod: Pod) -> str | None:
    got = cluster.get(f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}")
    conditions = (got.get("status") or {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return got["status"].get("podIP") if ready else None


def _service(cluster: Cluster, namespace: str, selector: dict[str, str], port: int) -> str:
    """A ClusterIP Service on ``port`` in front of the pods ``selector`` names; its
    address, once it has an endpoint."""
    cluster.kubectl(
        "apply", "-f", "-",
        stdin=yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": GITEA_SERVICE, "namespace": namespace},
            "spec": {"selector": dict(selector), "ports": [{"port": port, "targetPort": port}]},
        }),
    )  # fmt: skip
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
    label = f"kubernetes.io/service-name={GITEA_SERVICE}"

    def endpoint() -> bool | None:
        return any(s.get("endpoints") for s in cluster.items(slices, label)) or None

    cluster.wait(f"Service {namespace}/{GITEA_SERVICE} to have an endpoint", endpoint, timeout=60)
    address: str = cluster.get(f"/api/v1/namespaces/{namespace}/services/{GITEA_SERVICE}")["spec"][
        "clusterIP"
    ]
    return address


@pytest.fixture(scope="module")
def airgap(node_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Airgap]:
    plane = node_plane
    folder = tmp_path_factory.mktemp("airgap")
    cluster = Cluster(plane)
    site = load_site(env={})
    tree = render_netpol(folder / "labels", {})
    # the build's one pod; the other pod of a build, its exit handler's report
    build_labels, build_account = _template_pod(tree, "build/workflowtemplate.yaml", "run")
    step_labels, _ = _template_pod(tree, "build/workflowtemplate.yaml", "report-failure")
    reconciler, reconciler_account = _template_pod(
        tree, "reconcile/cronworkflow-fabrique-reconcile.yaml", "reconcile"
    )
    mirror, mirror_account = _template_pod(
        tree, "mirror/cronworkflow-gitea-mirror-sync.yaml", "sync"
    )
    build_ns, control_ns = site.namespaces.build, site.namespaces.control
    dns, gitea, registry = site.netpol.dns, site.netpol.gitea, site.netpol.registry
    assert dns.namespace and dns.pod_labels and gitea.namespace and gitea.pod_labels
    assert registry.namespace and registry.pod_labels
    deployment = site.apps[0].deployment()
    assert deployment is not None
    app_namespace, argo_cd_namespace = deployment.destination, deployment.namespace
    pods = [
        Pod("free", "default", {}),
        Pod("build", build_ns, build_labels, build_account),
        Pod("step", build_ns, step_labels, build_account),
        Pod("stray-build", build_ns, {}),
        Pod("reconciler", control_ns, reconciler, reconciler_account),
        Pod("mirror-sync", control_ns, mirror, mirror_account),
        Pod("stray-control", control_ns, {}),
        # Gitea's pods, which the default site's mirror policy selects; and the stand-in
        # that the pods' form of the site names as Gitea
        Pod("gitea", site.namespaces.gitea, dict(site.mirror_sync.gitea_pod_labels), None,
            (f"tcp:{gitea.port}",)),
        Pod("dns", dns.namespace, dict(dns.pod_labels), None,
            (f"udp:{dns.port}", f"tcp:{dns.port}", "udp:5353")),
        Pod("registry", registry.namespace, dict(registry.pod_labels), None,
            (f"tcp:{registry.port}", "tcp:5000")),
        # a pod where the default site's app runs, one of the widened app's, and one of
        # Argo CD's namespace (Argo CD runs outside the cluster here: its policy selects
        # every pod of the namespace, this one as the repo server's)
        Pod("app", app_namespace, {}),
        Pod("app-wide", WIDENED_NAMESPACE, {}),
        Pod("argo-cd", argo_cd_namespace, {}),
    ]  # fmt: skip
    # the tree's namespaces and accounts first, before any policy: the pods start free
    for name in ACCOUNTS:
        cluster.kubectl(
            "apply", "--server-side", "--field-manager=fabrique", "-f", str(tree / name)
        )
    for namespace in {p.namespace for p in pods}:
        cluster.kubectl("create", "namespace", namespace, check=False)
    python = images.python()
    image = images.pinned(images.PYTHON, {images.PYTHON: images.push(python, plane.registry)})
    # Gitea as the live plane runs it: a host process on the host's end, its port the
    # site's (a listener here: the scenario's Gitea is its own module's)
    ready = folder / "gitea-host.ready"
    host_gitea = subprocess.Popen(
        [sys.executable, str(PACKETS), "serve", "gitea-host", str(ready),
         f"tcp:{plane.address}:{gitea.port}"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for pod in pods:
            _start_pod(cluster, pod, image)
        ips = {
            pod.name: cluster.wait(f"pod {pod.namespace}/{pod.name} Ready with an IP",
                                   lambda pod=pod: _ready_ip(cluster, pod), timeout=120)
            for pod in pods
        }  # fmt: skip
        cluster.wait(
            "the host's Gitea stand-in to listen", lambda: ready.exists() or None, timeout=30
        )
        ips[GITEA_SERVICE] = _service(cluster, gitea.namespace, site.mirror_sync.gitea_pod_labels,
                                      gitea.port)  # fmt: skip
        yield Airgap(plane, cluster, folder, {p.name: p for p in pods}, ips)
    finally:
        host_gitea.terminate()
        host_gitea.wait(timeout=10)
        cluster.kubectl("delete", "service", "-n", gitea.namespace, GITEA_SERVICE,
                        "--wait=false", check=False)  # fmt: skip
        for pod in pods:
            cluster.kubectl(
                "delete", "pod", "-n", pod.namespace, pod.name, "--wait=false", check=False
            )
        cluster.http.close()


def _targets(gap: Airgap) -> dict[str, str]:
    node = gap.plane.real_node
    site = load_site(env={})
    world = {role: address for role, (address, _) in WORLD_HOSTS.items()}
    return {
        "dns": f"udp:{node.ip}:53",
        "dns-tcp": f"tcp:{node.ip}:53",
        "gitea": f"tcp:{node.address}:{site.netpol.gitea.port}",
        "registry": f"tcp:{node.address}:80",
        "api": f"tcp:{KUBERNETES_SERVICE}:443",
        "allowlisted": f"tcp:{world['allowlisted']}:443",
        "allowlisted-80": f"tcp:{world['allowlisted']}:80",
        "outside": f"tcp:{world['outside']}:443",
        "github": f"tcp:{world['github']}:443",
        "github-80": f"tcp:{world['github']}:80",
        "dns-pod": f"udp:{gap.ips['dns']}:53",
        "dns-pod-tcp": f"tcp:{gap.ips['dns']}:53",
        "dns-pod-5353": f"udp:{gap.ips['dns']}:5353",
        "gitea-pod": f"tcp:{gap.ips['gitea']}:{site.netpol.gitea.port}",
        "registry-pod": f"tcp:{gap.ips['registry']}:80",
        "registry-pod-5000": f"tcp:{gap.ips['registry']}:5000",
        "free-pod": f"tcp:{gap.ips['free']}:{POD_PORT}",
        "gitea-service": f"tcp:{gap.ips[GITEA_SERVICE]}:{site.netpol.gitea.port}",
    }


def _expect(gap: Airgap, allowed: set[str], names: list[str]) -> dict[str, str]:
    targets = _targets(gap)
    return {targets[name]: OPEN if name in allowed else REFUSED for name in names}


def test_with_no_policy_every_pod_reaches_every_target(airgap: Airgap) -> None:
    """The control: before the tree's policies, the world, the plane's services and the
    stand-ins all answer. Each refusal below is a policy's."""
    every = list(_targets(airgap))
    airgap.cluster.kubectl("delete", "networkpolicies", "--all", "-A", check=False)
    for pod in ("free", "build", "stray-build", "mirror-sync", "gitea", "app", "argo-cd"):
        airgap.judge(pod, _expect(airgap, set(every), every))


def _in_force(
    gap: Airgap,
    form: str,
    netpol: dict[str, Any],
    sign: tuple[str, str, str],
    apps: list[dict[str, Any]] | None = None,
) -> None:
    """Render the site with ``netpol`` (and ``apps``), apply it, and wait until the
    engine judges by it: ``sign`` is (pod, target name, what it gives once the policies
    are in force)."""
    tree = render_netpol(gap.folder / form, netpol, apps)
    apply_policies(gap.cluster, tree)
    pod, name, want = sign
    target = _targets(gap)[name]
    gap.cluster.wait(
        f"the engine to judge {pod} -> {name} ({target}) {want}",
        lambda: gap.probe(pod, [target])[target] == want or None,
        timeout=60,
    )


EVERY = [
    "dns", "dns-tcp", "gitea", "registry", "api", "allowlisted", "allowlisted-80",
    "outside", "github", "github-80",
]  # fmt: skip


def test_by_address_each_pod_reaches_what_the_tree_says_and_nothing_else(airgap: Airgap) -> None:
    """The form the live plane's site takes (scenario 34 runs under it): Gitea, the
    registry, DNS and the API server by address."""
    node = airgap.plane.real_node
    _in_force(
        airgap,
        "by-address",
        node.netpol_values(airgap.plane.ports["apiserver"]),
        ("stray-build", "dns", REFUSED),
    )
    plane = {"dns", "dns-tcp", "gitea", "registry", "api"}
    # anything not in a namespace of fabrique's is as free as before
    airgap.judge("free", _expect(airgap, set(EVERY), EVERY))
    # the build: the plane, and the allowlist on 443 only
    airgap.judge("build", _expect(airgap, plane | {"allowlisted"}, EVERY))
    # the build's other steps (checkout, verify, write-back): the plane only
    airgap.judge("step", _expect(airgap, plane, EVERY))
    # a pod in the build namespace that is not of a build: nothing, DNS neither
    airgap.judge("stray-build", _expect(airgap, set(), EVERY))
    # the safety net: the plane, nothing outside
    airgap.judge("reconciler", _expect(airgap, plane, EVERY))
    # the mirror sync calls Gitea's API (and its executor the API server): no registry
    airgap.judge("mirror-sync", _expect(airgap, plane - {"registry"}, EVERY))
    airgap.judge("stray-control", _expect(airgap, set(), EVERY))
    # Gitea's pods pull their mirrors from GitHub on 443: its ranges, nothing else
    airgap.judge("gitea", _expect(airgap, {"dns", "dns-tcp", "github"}, EVERY))
    # ingress: nothing enters fabrique's pods, not even from a free pod
    free = {
        f"tcp:{airgap.ips[pod]}:{POD_PORT}": REFUSED
        for pod in ("build", "stray-build", "reconciler", "mirror-sync")
    }
    airgap.judge("free", {**free, f"tcp:{airgap.ips['gitea']}:{POD_PORT}": OPEN})


def test_by_pods_the_selectors_find_the_labelled_pods_on_their_ports(airgap: Airgap) -> None:
    """The default site's form: DNS, Gitea and the registry are pods its selectors name
    (stand-ins with their labels), each reached on its port alone; the same services
    off the pod network are refused. The API server stays by address (the default's is a
    placeholder)."""
    node = airgap.plane.real_node
    netpol = node.netpol_values(airgap.plane.ports["apiserver"])
    for peer in ("dns", "gitea", "registry"):
        del netpol[peer]
    _in_force(airgap, "by-pods", netpol, ("build", "dns-pod", OPEN))
    names = [
        "dns-pod", "dns-pod-tcp", "dns-pod-5353", "gitea-pod", "registry-pod",
        "registry-pod-5000", "dns", "gitea", "registry", "api", "allowlisted",
    ]  # fmt: skip
    pods = {"dns-pod", "dns-pod-tcp", "gitea-pod", "registry-pod", "api"}
    airgap.judge("build", _expect(airgap, pods | {"allowlisted"}, names))
    airgap.judge("step", _expect(airgap, pods, names))
    airgap.judge("stray-build", _expect(airgap, set(), names))
    airgap.judge("mirror-sync", _expect(airgap, pods - {"registry-pod"}, names))
    airgap.judge("free", _expect(airgap, set(names), names))


IN_THE_CLUSTER = [
    "dns-pod", "dns-pod-tcp", "dns-pod-5353", "gitea-pod", "registry-pod", "registry-pod-5000",
    "free-pod", "gitea-service",
]  # fmt: skip


def test_the_app_and_argo_cd_reach_the_cluster_and_nothing_outside(airgap: Airgap) -> None:
    """The deployment and the runtime stay air-gapped. A pod of the app's namespace
    reaches pods of any namespace on any port, a Service whose endpoint is a pod (judged
    after kube-proxy's DNAT, as the pod it reaches) and DNS; not the API server (the
    ``kubernetes`` Service's endpoint is no pod), nor Gitea or the registry off the pod
    network, nor anything outside. A pod of Argo CD's namespace reaches the same, and
    Gitea and the API server besides. An app widened by name (``apps[].egress``: an entry
    of the build's allowlist, the registry) reaches those, on their ports, and no more."""
    from fabrique.site.config import default_values

    node = airgap.plane.real_node
    netpol = node.netpol_values(airgap.plane.ports["apiserver"])
    citation = default_values()["apps"][0]
    widened = {
        **citation,
        "name": WIDENED_APP,
        "image": WIDENED_APP,
        "context": "widened",
        "writeback": {**citation["writeback"], "path": "widened/kustomization.yaml"},
        "application": {**citation["application"], "path": "apps/widened.yaml",
                        "namespace": WIDENED_NAMESPACE},
        "egress": [WORLD_HOSTS["allowlisted"][1], "registry"],
    }  # fmt: skip
    _in_force(airgap, "apps", netpol, ("app-wide", "outside", REFUSED), [citation, widened])
    names = [*EVERY, *IN_THE_CLUSTER]
    inside = {"dns", "dns-tcp", *IN_THE_CLUSTER}
    airgap.judge("app", _expect(airgap, inside, names))
    airgap.judge("argo-cd", _expect(airgap, inside | {"gitea", "api"}, names))
    airgap.judge("app-wide", _expect(airgap, inside | {"allowlisted", "registry"}, names))
    # fabrique's own pods keep theirs: a policy of the apps' opens nothing of fabrique's
    airgap.judge("stray-build", _expect(airgap, set(), names))
    airgap.judge("free", _expect(airgap, set(names), names))
