"""The live tier's session fixtures, registered by ``tests/conftest.py`` so that a
contract test outside ``tests/live/`` can run against the real server too."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from . import controlplane
from .cluster import Cluster
from .gitea import Gitea
from .gitea import binary as gitea_binary

SITE_SECRETS = [
    ("fabrique-build", "fabrique-gitea"),
    ("fabrique", "fabrique-gitea"),
    ("fabrique", "fabrique-webhook-token"),
]


def need_go() -> str:
    """The go command; without it a live test skips, saying why (and fails in CI)."""
    go = controlplane.peers.find_go()
    if go is None:
        reason = (
            f"the live tier needs Go >= {controlplane.peers.MIN_GO[0]}."
            f"{controlplane.peers.MIN_GO[1]} and the Go module proxy to build its peers "
            "(tests/peers/); install Go to run it"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI never skips the live tier: {reason}", pytrace=False)
        pytest.skip(reason)
    return go


@pytest.fixture(scope="session")
def kubectl() -> Path:
    """kubectl built from the kubernetes peer (``make peers``), the version of the live
    tier's API server, for the tests that render a tree with ``kubectl kustomize``;
    ``make system-deps`` installs no kubectl. Without Go, a kubectl on ``PATH`` outside
    CI; with neither, they skip, saying why (and fail in CI)."""
    installed = shutil.which("kubectl")
    if controlplane.peers.find_go() is None and installed and not os.environ.get("CI"):
        return Path(installed)
    need_go()
    try:
        return controlplane.binaries(("kubernetes",))["kubectl"]
    except (controlplane.ControlPlaneError, controlplane.peers.PeerError) as failed:
        pytest.fail(str(failed), pytrace=False)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.ControlPlane]:
    need_go()
    try:
        bins = controlplane.binaries()
        plane = controlplane.ControlPlane(tmp_path_factory.mktemp("live")).start(bins)
    except (controlplane.ControlPlaneError, controlplane.peers.PeerError) as failed:
        pytest.fail(str(failed), pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


def need_root() -> None:
    """A real node needs root (network and mount namespaces, cgroups); without it the
    test skips, saying why (and fails in CI)."""
    if os.geteuid() != 0:
        reason = (
            "a real node needs root: it makes a network and a mount namespace and cgroups "
            "(tests/live/node.py)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI never skips the live tier: {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def node_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.ControlPlane]:
    """A plane of its own with a real node (``ControlPlane(..., node=True)``) in place of
    kwok's: its tests share one xdist worker (``xdist_group("real-node")``)."""
    need_go()
    need_root()
    try:
        bins = controlplane.binaries(controlplane.NODE_PEERS)
        folder = tmp_path_factory.mktemp("node")
        plane = controlplane.ControlPlane(folder, node=True).start(bins)
    except (controlplane.ControlPlaneError, controlplane.peers.PeerError) as failed:
        pytest.fail(str(failed), pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def cluster(control_plane: controlplane.ControlPlane) -> Iterator[Cluster]:
    client = Cluster(control_plane)
    try:
        yield client
    finally:
        client.http.close()


@pytest.fixture(scope="session")
def applied(cluster: Cluster) -> Path:
    """The committed tree (the default site's render), applied server-side once."""
    return apply_site(cluster, controlplane.ROOT / "manifests")


def apply_site(cluster: Cluster, tree: Path) -> Path:
    """A rendered tree applied server-side as the README's install does it, the Secrets
    its step 4 asks the site's own secret tooling for made; back once the admission
    policy is in force and the Argo controller holds the tree's WorkflowTemplates."""
    # Argo CD's namespace and the apps' are the platform's, made before fabrique's tree
    # (docs/operate/air-gap.md): the tree only gives them their egress policy
    for path in (tree / "netpol").glob("*.yaml"):
        if path.name in ("argo-cd-namespace.yaml", "app-namespaces.yaml"):
            for doc in yaml.safe_load_all(path.read_text()):
                cluster.kubectl("create", "namespace", doc["metadata"]["namespace"], check=False)
    cluster.apply_tree(tree)
    for namespace, name in SITE_SECRETS:
        cluster.kubectl(
            "create", "secret", "generic", name, "-n", namespace, "--from-literal=token=live"
        )
    # a new policy binds a moment after it is written: until then the API server admits
    # what it will refuse, so what follows starts once it refuses
    cluster.wait("the admission policy in force", cluster.policy_refuses_inline_templates)
    # the controller finds a Workflow's template in its informer only, and a Workflow it
    # takes before the template gets there fails for good (a bench that plays the
    # controller has stopped it)
    if "workflow-controller" in cluster.plane.pids:
        cluster.wait_templates_seen()
    return tree


@pytest.fixture(scope="session")
def real_gitea(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gitea]:
    """A real Gitea on loopback, its admin made and a token with the README's scopes;
    no control plane."""
    need_go()
    try:
        gitea = Gitea(tmp_path_factory.mktemp("gitea"), gitea_binary()).start()
    except (controlplane.ControlPlaneError, controlplane.peers.PeerError) as failed:
        pytest.fail(str(failed), pytrace=False)
    try:
        yield gitea
    finally:
        gitea.stop()
