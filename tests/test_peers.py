"""The wrapper modules of tests/peers/: what they hold, how they are keyed and named."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT
from .live.fixtures import need_go
from .peers import build
from .waits import until

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
        "kubelet": "kubelet",
        "kube-proxy": "kube-proxy",
    }
    assert names["argo-workflows"] == {"workflow-controller": "workflow-controller"}
    # the real node's
    assert names["containerd"] == {
        "containerd": "containerd",
        "containerd-shim-runc-v2": "containerd-shim-runc-v2",
        "ctr": "ctr",
    }
    assert names["coredns"] == {"coredns": "coredns"}
    assert names["argoexec"] == {"argoexec": "argoexec"}
    # Argo CD's and CoreDNS's are their wrappers' own (main.go), with what runs here only
    assert names["argo-cd"] == {"argo-cd": "argocd"}
    # Gitea's main package is its module's root, gitea.dev
    assert names["gitea"] == {"gitea.dev": "gitea"}
    # the build step's own tools
    assert names["buildkit"] == {"buildkitd": "buildkitd", "buildctl": "buildctl"}
    assert names["rootlesskit"] == {"rootlesskit": "rootlesskit"}
    assert names["cosign"] == {"cosign": "cosign"}
    # the wrapper's own command (upstream's, its metrics address aside), and a module root
    assert names["argo-events"] == {"argo-events": "argo-events"}
    assert names["nats-server"] == {"nats-server": "nats-server"}


def test_argo_cd_is_one_binary_under_the_names_it_dispatches_on() -> None:
    """argocd runs as the controller or the repo server by the name it is called by;
    the repo server runs git-verify-wrapper.sh from PATH."""
    assert build.Peer("argo-cd", PEERS / "argo-cd").installed() == [
        "argocd",
        "argocd-application-controller",
        "argocd-repo-server",
        "git-verify-wrapper.sh",
    ]
    assert build.Peer("kwok", PEERS / "kwok").installed() == ["kwok"]


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
    containerd = build.Peer("containerd", PEERS / "containerd")
    pkg = "github.com/containerd/containerd/v2"
    assert f"{pkg}/version.Version={containerd.required(pkg)} " in containerd.ldflags()
    argoexec = build.Peer("argoexec", PEERS / "argoexec")
    assert argoexec.ldflags() == argo.ldflags()
    argocd = build.Peer("argo-cd", PEERS / "argo-cd")
    version = argocd.required("github.com/argoproj/argo-cd/v3")
    # its Makefile stamps its VERSION file, without the v
    assert f"common.version={version[1:]} " in argocd.ldflags()
    assert f"common.gitTag={version} " in argocd.ldflags()
    # the kubectl it embeds: the client-go its replace block builds
    assert argocd.ldflags().endswith(".kubectlVersion=" + argocd.required("k8s.io/client-go"))
    assert argocd.required("k8s.io/client-go").startswith("v0.")
    promtool = build.Peer("promtool", PEERS / "promtool")
    # Prometheus' module v0.316.0 is its release 3.16.0: `promtool --version` says so
    assert promtool.required("github.com/prometheus/prometheus") == "v0.316.0"
    assert promtool.ldflags().startswith("-X github.com/prometheus/common/version.Version=3.16.0 ")


def test_buildkitd_is_built_with_the_tags_of_its_release() -> None:
    """seccomp: the default profile on RUN containers, as the released buildkitd has it."""
    assert build.Peer("buildkit", PEERS / "buildkit").tags().split() == [
        *("osusergo", "netgo", "static_build", "seccomp")
    ]
    assert build.Peer("kwok", PEERS / "kwok").tags() == ""


def test_containerd_is_built_without_btrfs() -> None:
    """Without cgo there is no btrfs snapshotter: its Makefile's no_btrfs leaves it out."""
    assert "no_btrfs" in build.Peer("containerd", PEERS / "containerd").tags().split()


def test_only_argo_cd_is_built_by_a_toolchain_of_its_own() -> None:
    """Argo CD v3.6 needs Go 1.27; every other peer is built by the Go installed."""
    toolchains = {p.name: p.toolchain() for p in build.peers()}
    assert {name: t for name, t in toolchains.items() if t} == {"argo-cd": "go1.27.3"}
    argocd = build.Peer("argo-cd", PEERS / "argo-cd")
    assert argocd.goversion("go1.26.8") == "go1.27.3"
    assert build.Peer("kwok", PEERS / "kwok").goversion("go1.26.8") == "go1.26.8"


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
    assert sorted(lock) == sorted(p.name for p in build.peers())
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


def _copy(peer: build.Peer, where: Path, gomod: str | None = None) -> build.Peer:
    where.mkdir()
    (where / "go.mod").write_text(peer.gomod if gomod is None else gomod)
    (where / "go.sum").write_text((peer.module / "go.sum").read_text())
    return build.Peer(peer.name, where)


def test_a_key_is_that_of_the_toolchain_named_not_the_go_installed(tmp_path: Path) -> None:
    argocd = build.Peer("argo-cd", PEERS / "argo-cd")
    assert build.key(argocd, "go1.26.8") == build.key(argocd, "go1.26.9")
    other = _copy(argocd, tmp_path / "a", argocd.gomod.replace("go1.27.3", "go1.27.4"))
    assert build.key(other, "go1.26.8") != build.key(argocd, "go1.26.8")


def test_a_key_changes_with_the_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    containerd = build.Peer("containerd", PEERS / "containerd")
    before = build.key(containerd, "go1.26.8")
    monkeypatch.setattr(build.Peer, "tags", lambda self: "no_btrfs")
    assert build.key(containerd, "go1.26.8") != before


def test_argoexecs_own_go_mod_builds_the_module_as_the_proxy_serves_it() -> None:
    """The restored symlink lives in a copy made at build time: the committed go.mod
    replaces nothing, so ``-mod=readonly`` holds it to the real module."""
    argoexec = build.Peer("argoexec", PEERS / "argoexec")
    module, links = build.SYMLINKS["argoexec"]
    workflows = build.Peer("argo-workflows", PEERS / "argo-workflows")
    assert argoexec.required(module) == workflows.required(module)
    assert _directives(argoexec.gomod, "replace") == []
    assert links == {"workflow/executor/osspecific/signal_linux.go": "signal_darwin.go"}


def _read_only_module(where: Path) -> dict[str, tuple[int, str]]:
    """A module folder as the module cache holds it (read-only), and what it holds."""
    (where / "pkg").mkdir(parents=True)
    (where / "go.mod").write_text("module example.com/up\n")
    (where / "pkg" / "signal_darwin.go").write_text("package pkg\n")
    for path in (where / "pkg" / "signal_darwin.go", where / "go.mod"):
        path.chmod(0o444)
    for folder in (where / "pkg", where):
        folder.chmod(0o555)
    return _listing(where)


def _listing(where: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(where)): (p.lstat().st_mode, "" if p.is_dir() else p.read_text())
        for p in sorted(where.rglob("*"))
    } | {".": (where.lstat().st_mode, "")}


def test_restoring_a_symlink_writes_only_in_the_work_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = tmp_path / "modcache" / "example.com" / "up@v1.0.0"
    before = _read_only_module(upstream)
    monkeypatch.setitem(
        build.SYMLINKS, "fake", ("example.com/up", {"pkg/signal_linux.go": "signal_darwin.go"})
    )
    module = tmp_path / "fake"
    module.mkdir()
    gomod = "module fabrique.test/peers/fake\n\ntool example.com/up/cmd\n"
    (module / "go.mod").write_text(gomod)
    (module / "go.sum").write_text("example.com/up v1.0.0 h1:x=\n")
    work = tmp_path / "work"
    work.mkdir()
    try:
        wrapper = build.with_symlinks(build.Peer("fake", module), upstream, work)
        assert _listing(upstream) == before
        assert (module / "go.mod").read_text() == gomod
        link = work / "upstream" / "pkg" / "signal_linux.go"
        assert link.is_symlink() and link.read_text() == "package pkg\n"
        assert wrapper.parent == work
        assert (
            (wrapper / "go.mod")
            .read_text()
            .endswith(f"\nreplace example.com/up => {work / 'upstream'}\n")
        )
        assert (wrapper / "go.sum").read_text() == "example.com/up v1.0.0 h1:x=\n"
    finally:
        for folder in (upstream, upstream / "pkg"):
            folder.chmod(0o755)


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
def test_the_argo_cd_wrapper_keeps_the_upstream_replace_lines_but_gitops_engine() -> None:
    """Argo CD's go.mod pins k8s.io at its own minor by replace lines, which a module
    requiring it does not inherit; its ``=> ./gitops-engine`` is served by the proxy."""
    go = need_go()
    argocd = build.Peer("argo-cd", PEERS / "argo-cd")
    module = "github.com/argoproj/argo-cd/v3"
    toolchain = argocd.toolchain() or "local"
    upstream = build.download(go, module, argocd.required(module), toolchain)["GoMod"]
    replaces = _directives(Path(upstream).read_text(), "replace")
    assert [r for r in replaces if "=> ./" in r] == [
        "github.com/argoproj/argo-cd/gitops-engine/v3 => ./gitops-engine"
    ]
    assert _directives(argocd.gomod, "replace") == [r for r in replaces if "=> ./" not in r]


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


def test_a_peer_with_a_toolchain_links_files_and_symlinks_is_built_as_they_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """go build runs under the peer's toolchain, in a copy of the wrapper that replaces
    the module with a copy whose symlink is restored; the folder gets the further names
    and the upstream file; the work folder is gone and the module cache untouched."""
    upstream = tmp_path / "modcache" / "example.com" / "up@v1.0.0"
    (upstream / "hack").mkdir(parents=True)
    (upstream / "hack" / "wrapper.sh").write_text("#!/bin/sh\n")
    before = _read_only_module(upstream)
    calls = tmp_path / "calls"
    go = tmp_path / "go"
    go.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = env ]; then echo go1.26.0; exit 0; fi\n'
        f'if [ "$1" = mod ]; then echo \'{{"Dir": "{upstream}"}}\'; exit 0; fi\n'
        f'echo "$GOTOOLCHAIN $PWD $(tail -1 go.mod)" >> {calls}\n'
        'while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done\n'
        'echo binary > "${out}tool"\n'
    )
    go.chmod(0o755)
    module = tmp_path / "fake"
    module.mkdir()
    gomod = "module fabrique.test/peers/fake\n\ntoolchain go1.27.3\n\ntool example.com/up/tool\n"
    (module / "go.mod").write_text(gomod)
    (module / "go.sum").write_text("")
    monkeypatch.setenv("FABRIQUE_PEERS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(build.LINKS, "fake", {"alias": "tool"})
    monkeypatch.setitem(build.FILES, "fake", {"wrapper.sh": ("example.com/up", "hack")})
    monkeypatch.setitem(
        build.SYMLINKS, "fake", ("example.com/up", {"pkg/signal_linux.go": "signal_darwin.go"})
    )
    (module / "go.mod").write_text(gomod + "\nrequire example.com/up v1.0.0\n")
    peer = build.Peer("fake", module)
    try:
        where = build.build(peer, str(go))
        assert _listing(upstream) == before
    finally:
        for folder in (upstream, upstream / "pkg"):
            folder.chmod(0o755)
    toolchain, cwd, replace = calls.read_text().splitlines()[0].split(" ", 2)
    assert toolchain == "go1.27.3"
    assert Path(cwd).parent.parent == tmp_path / "cache" and Path(cwd).name == "wrapper"
    assert replace.startswith("replace example.com/up => ")
    assert not Path(cwd).exists()
    assert sorted(p.name for p in where.iterdir()) == ["alias", "built.json", "tool", "wrapper.sh"]
    assert (where / "alias").readlink() == Path("tool")
    assert (where / "wrapper.sh").stat().st_mode & 0o111
    assert json.loads((where / "built.json").read_text())["go"] == "go1.27.3"
    assert where.name == f"fake-{build.key(peer, 'go1.26.0')}"


def test_the_modules_are_fetched_beside_the_builds_and_the_fetch_ends_with_them(
    tmp_path: Path,
) -> None:
    """Each peer to build has its modules downloaded in its own folder, under its own
    toolchain, one after the other; once the builds are over, a download still running
    is ended, not left behind."""
    calls = tmp_path / "calls"
    go = tmp_path / "go"
    go.write_text(
        "#!/bin/sh\n"
        f'echo "$GOTOOLCHAIN $(basename $PWD) $*" >> {calls}\n'
        '[ "$(basename $PWD)" = slow ] && exec sleep 60\n'
        "exit 0\n"
    )
    go.chmod(0o755)
    peers = []
    for name, toolchain in (("fast", ""), ("slow", "toolchain go1.27.3\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "go.mod").write_text(f"module fabrique.test/peers/{name}\n{toolchain}")
        peers.append(build.Peer(name, tmp_path / name))
    fetching = build.Prefetch(str(go), peers)
    until(
        "the second peer's download to start",
        lambda: calls.exists() and len(calls.read_text().splitlines()) == 2,
        20,
        every=0.05,
    )
    running = fetching.running
    assert running is not None and running.poll() is None
    fetching.stop()
    assert running.wait(timeout=10) != 0  # ended, not finished
    assert not fetching.thread.is_alive()
    assert calls.read_text().splitlines() == [
        "local fast mod download",
        "go1.27.3 slow mod download",
    ]
