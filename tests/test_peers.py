"""The wrapper modules of tests/peers/: what they hold, how they are keyed and named."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT
from .live.fixtures import need_go
from .peers import build

PEERS = ROOT / "tests" / "peers"


def test_each_peer_holds_its_go_mod_and_go_sum_and_nothing_of_upstream() -> None:
    """No upstream source and no binary: a wrapper is its dependency manifest."""
    for peer in build.peers():
        files = sorted(p.name for p in peer.module.iterdir())
        assert files == ["go.mod", "go.sum"], f"{peer.name}: {files}"
        assert peer.tools(), f"{peer.name} names no tool"


def test_tracked_files_under_peers_are_the_manifests_and_the_builder() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "tests/peers"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for path in tracked:
        assert re.fullmatch(r"tests/peers/([\w-]+/go\.(mod|sum)|build\.py|__init__\.py)", path), (
            path
        )


def test_the_binaries_are_named_as_go_build_names_them() -> None:
    names = {p.name: p.binaries() for p in build.peers()}
    assert names["etcd"] == {"server": "etcd"}
    assert names["kubernetes"] == {
        "kube-apiserver": "kube-apiserver",
        "kube-controller-manager": "kube-controller-manager",
        "kube-scheduler": "kube-scheduler",
        "kubectl": "kubectl",
    }
    assert names["argo-workflows"] == {"workflow-controller": "workflow-controller"}


def test_the_versions_stamped_are_the_versions_required() -> None:
    kubernetes = build.Peer("kubernetes", PEERS / "kubernetes")
    version = kubernetes.required("k8s.io/kubernetes")
    assert f"gitVersion={version} " in kubernetes.ldflags()
    argo = build.Peer("argo-workflows", PEERS / "argo-workflows")
    assert argo.ldflags().endswith(
        f".version={argo.required('github.com/argoproj/argo-workflows/v4')}"
    )


def test_each_peer_builds_the_version_the_lock_pins() -> None:
    lock = yaml.safe_load((ROOT / "vendor" / "lock.yaml").read_text())["peers"]
    for peer in build.peers():
        pinned = lock[peer.name]
        assert peer.required(pinned["module"]) == pinned["version"], peer.name


def test_the_staging_modules_map_to_their_published_versions() -> None:
    upstream = (
        "replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n"
        "\tk8s.io/client-go => ./staging/src/k8s.io/client-go\n"
        "\tgithub.com/x/y => github.com/x/y v1.0.0\n)\n"
    )
    assert build.staging_replaces(upstream, "v1.37.2") == [
        "k8s.io/api => k8s.io/api v0.37.2",
        "k8s.io/client-go => k8s.io/client-go v0.37.2",
    ]


def test_a_key_changes_with_the_go_mod(tmp_path: Path) -> None:
    peer = build.Peer("kwok", PEERS / "kwok")
    assert build.key(peer, "go1.26.8") != build.key(peer, "go1.26.9")
    copy = build.Peer("kwok", tmp_path)
    (copy.module / "go.mod").write_text(peer.gomod + "\n// changed\n")
    (copy.module / "go.sum").write_text((peer.module / "go.sum").read_text())
    assert build.key(copy, "go1.26.8") != build.key(peer, "go1.26.8")


@pytest.mark.live
def test_the_kubernetes_replace_lines_are_the_upstream_staging_list() -> None:
    go = need_go()
    kubernetes = build.Peer("kubernetes", PEERS / "kubernetes")
    version = kubernetes.required("k8s.io/kubernetes")
    expected = build.staging_replaces(
        build.upstream_gomod(go, "k8s.io/kubernetes", version), version
    )
    block = re.search(r"^replace \(\n(.*?)^\)", kubernetes.gomod, re.M | re.S)
    assert block is not None
    assert [line.strip() for line in block[1].splitlines()] == expected
