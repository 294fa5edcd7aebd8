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
    """No upstream source and no binary: a wrapper is its dependency manifest, and at
    most a few lines of Go of its own, built as its own tool, that call upstream's
    exported functions."""
    for peer in build.peers():
        files = sorted(p.name for p in peer.module.iterdir())
        own = [name for name in files if name.endswith(".go")]
        assert [name for name in files if name not in own] == ["go.mod", "go.sum"], peer.name
        assert peer.tools(), f"{peer.name} names no tool"
        if own:
            module = re.search(r"^module (\S+)", peer.gomod, re.M)
            assert module is not None and module[1] in peer.tools(), peer.name
            lines = sum(len((peer.module / name).read_text().splitlines()) for name in own)
            assert lines <= 150, f"{peer.name}: {lines} lines of Go"


def test_tracked_files_under_peers_are_the_manifests_and_the_builder() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "tests/peers"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for path in tracked:
        assert re.fullmatch(
            r"tests/peers/([\w-]+/(go\.(mod|sum)|\w+\.go)|build\.py|__init__\.py)", path
        ), path


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
    # Gitea's main package is its module's root, gitea.dev
    assert names["gitea"] == {"gitea.dev": "gitea"}
    # the build step's own tools
    assert names["buildkit"] == {"buildkitd": "buildkitd", "buildctl": "buildctl"}
    assert names["rootlesskit"] == {"rootlesskit": "rootlesskit"}
    assert names["cosign"] == {"cosign": "cosign"}
    # the wrapper's own command (upstream's, its metrics address aside), and a module root
    assert names["argo-events"] == {"argo-events": "argo-events"}
    assert names["nats-server"] == {"nats-server": "nats-server"}


def test_the_versions_stamped_are_the_versions_required() -> None:
    kubernetes = build.Peer("kubernetes", PEERS / "kubernetes")
    version = kubernetes.required("k8s.io/kubernetes")
    assert f"gitVersion={version} " in kubernetes.ldflags()
    argo = build.Peer("argo-workflows", PEERS / "argo-workflows")
    assert argo.ldflags().endswith(
        f".version={argo.required('github.com/argoproj/argo-workflows/v4')}"
    )
    events = build.Peer("argo-events", PEERS / "argo-events")
    assert events.ldflags().endswith(
        f"argoproj/argo-events.version={events.required('github.com/argoproj/argo-events')}"
    )
    gitea = build.Peer("gitea", PEERS / "gitea")
    # as Gitea's Makefile stamps it (`git describe` without the v): /api/v1/version says it
    assert gitea.ldflags() == "-X main.Version=" + gitea.required("code.gitea.io/gitea")[1:]
    buildkit = build.Peer("buildkit", PEERS / "buildkit")
    # `buildctl debug workers -v` and `buildkitd --version` say it
    assert "version.Version=" + buildkit.required("github.com/moby/buildkit") in buildkit.ldflags()
    cosign = build.Peer("cosign", PEERS / "cosign")
    assert cosign.ldflags().endswith(
        ".gitVersion=" + cosign.required("github.com/sigstore/cosign/v2")
    )


def test_buildkitd_is_built_with_the_tags_of_its_release() -> None:
    """seccomp: the default profile on RUN containers, as the released buildkitd has it."""
    assert build.Peer("buildkit", PEERS / "buildkit").tags().split() == [
        *("osusergo", "netgo", "static_build", "seccomp")
    ]
    assert build.Peer("kwok", PEERS / "kwok").tags() == ""


def test_the_buildkit_peer_is_the_version_of_the_build_steps_image() -> None:
    """buildctl talks to the daemon of its own release: the peer tested is the image run."""
    from fabrique.site.config import load_site
    from fabrique.site.names import ImageRef

    tag = ImageRef.parse(load_site(env={}).images.buildkit).tag or ""
    pinned = build.Peer("buildkit", PEERS / "buildkit").required("github.com/moby/buildkit")
    assert tag == f"{pinned}-rootless"


def test_the_cosign_peer_is_the_version_of_the_tools_image() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    image = re.search(r"^ARG COSIGN_IMAGE=\S+:(v[\d.]+)$", dockerfile, re.M)
    assert image is not None
    cosign = build.Peer("cosign", PEERS / "cosign")
    assert cosign.required("github.com/sigstore/cosign/v2") == image[1]


def test_a_module_put_in_another_ones_place_is_the_version_built(tmp_path: Path) -> None:
    """A replace line that puts ``code.gitea.io/gitea`` in ``gitea.dev``'s place builds
    the version it names (what the lock pins), whatever ``gitea.dev``'s require says."""
    (tmp_path / "go.mod").write_text(
        "module m\n\nrequire gitea.dev v1.27.3\n\n"
        "replace gitea.dev => code.gitea.io/gitea v1.27.4\n"
    )
    peer = build.Peer("gitea", tmp_path)
    assert peer.required("code.gitea.io/gitea") == "v1.27.4"
    assert peer.required("gitea.dev") == "v1.27.3"
    with pytest.raises(build.PeerError, match=r"requires no code\.gitea\.io/other"):
        peer.required("code.gitea.io/other")


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


def _directives(gomod: str, verb: str) -> list[str]:
    """The ``replace`` or ``exclude`` directives of a go.mod, single lines and blocks,
    without their comments."""
    found, block = [], False
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line == f"{verb} (":
            block = True
        elif block and line == ")":
            block = False
        elif block and line:
            found.append(line)
        elif line.startswith(f"{verb} "):
            found.append(line.split(None, 1)[1])
    return found


@pytest.mark.live
def test_the_gitea_wrapper_keeps_every_replace_and_exclude_of_the_upstream_go_mod() -> None:
    go = need_go()
    gitea = build.Peer("gitea", PEERS / "gitea")
    upstream = build.upstream_gomod(
        go, "code.gitea.io/gitea", gitea.required("code.gitea.io/gitea")
    )
    for verb in ("replace", "exclude"):
        ours = _directives(gitea.gomod, verb)
        assert [d for d in _directives(upstream, verb) if d not in ours] == [], verb
    # and its own: the module its go.mod declares, in the place of the one the proxy serves
    assert "gitea.dev => code.gitea.io/gitea " + gitea.required("code.gitea.io/gitea") in (
        _directives(gitea.gomod, "replace")
    )


def test_two_builds_of_one_peer_at_once_build_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test workers of one run may ask for the same peer at once (the live tier's
    plane and the kubectl of the kustomize tests): the second waits for the first's
    folder instead of building into the same ``.partial`` folder."""
    import threading

    builds = tmp_path / "builds"
    go = tmp_path / "go"
    go.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = env ]; then echo go1.26.0; exit 0; fi\n'
        'while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done\n'
        f"echo build >> {builds}\n"
        'sleep 1; echo binary > "${out}tool"\n'
    )
    go.chmod(0o755)
    module = tmp_path / "fake"
    module.mkdir()
    (module / "go.mod").write_text("module fabrique.test/peers/fake\n\ntool example.com/x/tool\n")
    (module / "go.sum").write_text("")
    monkeypatch.setenv("FABRIQUE_PEERS_CACHE", str(tmp_path / "cache"))
    peer = build.Peer("fake", module)
    found: list[Path] = []
    errors: list[Exception] = []

    def one() -> None:
        try:
            found.append(build.build(peer, str(go)))
        except (build.PeerError, OSError) as failed:  # two builds spoiling one folder
            errors.append(failed)

    workers = [threading.Thread(target=one) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)  # the second waits on the first's folder: never forever
        assert not worker.is_alive(), "a build of the peer still waiting after 30 s"
    assert errors == []
    assert builds.read_text().splitlines() == ["build"]
    assert len(found) == 2 and found[0] == found[1]
    assert (found[0] / "tool").read_text() == "binary\n"
