"""Build the real peers of the live tier from their wrapper modules (``make peers``).

Each folder beside this file is one Go module: ``go.mod`` and ``go.sum`` whose ``tool``
lines name the upstream commands to build, or the wrapper's own few lines of Go where
the live tier needs upstream's command with another value (``argo-events``: the metrics
address), built as a tool of its own module. Nothing of the upstream projects is
committed; ``go build`` fetches them through the Go module proxy into the module cache,
which stays outside the repository, as does the build cache.

Every peer is built by the installed Go (``GOTOOLCHAIN=local``), with ``CGO_ENABLED=0``,
its release's version stamps (``Peer.ldflags``) and build tags (``Peer.tags``), except
where its go.mod names a ``toolchain`` (``argo-cd``: Argo CD v3.6 needs Go 1.27): that
one toolchain, which the go command fetches through the proxy, builds it. Beside the
binaries a peer may get further names for one binary (``LINKS``: ``argocd`` dispatches
on the name it is called by) and files of its upstream module (``FILES``). Where a
module zip lacks an upstream symlink (Go's module zips hold none), the peer is built
from a copy of that module with the link restored, in a temporary folder of the cache
(``SYMLINKS``, ``argoexec``): the module cache and the committed go.mod stay untouched.

The binaries go to ``$FABRIQUE_PEERS_CACHE`` (default ``~/.cache/fabrique/peers``), one
folder per peer and per key: the sha256 of its go.mod, go.sum, the version of the Go
that builds it (its toolchain, if it names one), the linker flags and the build tags. A
peer whose key has a complete folder is not built again, so a changed go.mod rebuilds
that peer only, and a clean clone on a machine that built before starts warm. Every
peer prints its name and how long it took.

    python tests/peers/build.py [PEER ...]     build (or find) the peers, print their folders
    python tests/peers/build.py --check        exit 1 if any peer would be built
    python tests/peers/build.py --if-go        without Go, a notice and exit 0 (not in CI)
    python tests/peers/build.py --staging      the kubernetes peer's replace lines, from
                                               the upstream go.mod of the version required
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIN_GO = (1, 26)
# tools whose package path does not name the command
RENAMED = {
    "go.etcd.io/etcd/server/v3": "etcd",
    "gitea.dev": "gitea",
    "fabrique.test/peers/argo-cd": "argocd",
    "sigs.k8s.io/kube-network-policies/cmd": "kube-network-policies",
}
# further names of a binary, as symlinks beside it: the Argo CD command dispatches on the
# name it is called by, as its image's links do
LINKS = {
    "argo-cd": {
        "argocd-application-controller": "argocd",
        "argocd-repo-server": "argocd",
    }
}
# files of an upstream module installed beside the binaries, executable: the repo server
# runs git-verify-wrapper.sh from PATH, as its image has it
FILES = {"argo-cd": {"git-verify-wrapper.sh": ("github.com/argoproj/argo-cd/v3", "hack")}}
# upstream symlinks that the module zip drops (Go's module zips hold no symlinks), which
# the build restores in a copy of the module: {peer: (module, {link: its target})}
SYMLINKS = {
    "argoexec": (
        "github.com/argoproj/argo-workflows/v4",
        # without it, Linux has no Setpgid: the package does not compile
        {"workflow/executor/osspecific/signal_linux.go": "signal_darwin.go"},
    )
}


class PeerError(Exception):
    """A peer could not be built: the message names the peer and the go command."""


@dataclass(frozen=True)
class Peer:
    name: str
    module: Path

    @property
    def gomod(self) -> str:
        return (self.module / "go.mod").read_text()

    def tools(self) -> list[str]:
        """The packages of its ``tool`` lines, in the order written."""
        found: list[str] = []
        block = False
        for raw in self.gomod.splitlines():
            line = raw.split("//", 1)[0].strip()
            if line == "tool (":
                block = True
            elif block and line == ")":
                block = False
            elif block and line:
                found.append(line)
            elif line.startswith("tool "):
                found.append(line.split(None, 1)[1])
        return found

    def required(self, module: str) -> str:
        """The version of ``module`` it builds: the one a replace line puts in its own
        or another module's place (``gitea.dev => code.gitea.io/gitea v1.27.3``: Gitea's
        go.mod declares a path the proxy does not serve), or else the one it requires."""
        name = re.escape(module)
        match = re.search(
            rf"^\s*(?:replace\s+)?\S+(?: v\S+)? => {name} (v\S+)", self.gomod, re.M
        ) or re.search(rf"^\s*(?:require\s+)?{name} (v\S+)", self.gomod, re.M)
        if match is None:
            raise PeerError(f"peer {self.name}: go.mod requires no {module}")
        return match.group(1)

    def ldflags(self) -> str:
        """Version stamps, as the upstream release builds set them."""
        if self.name == "kubernetes":
            version = self.required("k8s.io/kubernetes")
            major, minor = version.lstrip("v").split(".")[:2]
            pkg = "k8s.io/component-base/version"
            return (
                f"-X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} "
                f"-X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
            )
        if self.name in ("argo-workflows", "argoexec"):
            version = self.required("github.com/argoproj/argo-workflows/v4")
            return f"-X github.com/argoproj/argo-workflows/v4.version={version}"
        if self.name == "containerd":
            # its Makefile's GO_LDFLAGS; the revision is a git commit, which a module lacks
            pkg = "github.com/containerd/containerd/v2"
            return f"-X {pkg}/version.Version={self.required(pkg)} -X {pkg}/version.Package={pkg}"
        if self.name == "argo-cd":
            # its Makefile's LDFLAGS: version is its VERSION file, without the v; with no
            # git commit to stamp, the version reported is v<version>+unknown
            version = self.required("github.com/argoproj/argo-cd/v3")
            pkg = "github.com/argoproj/argo-cd/v3/common"
            return (
                f"-X {pkg}.version={version.lstrip('v')} -X {pkg}.gitTag={version} "
                f"-X {pkg}.gitTreeState=clean "
                f"-X {pkg}.kubectlVersion={self.required('k8s.io/client-go')}"
            )
        if self.name == "argo-events":
            # its Makefile's LDFLAGS: the version /metrics' build_info and the logs report
            version = self.required("github.com/argoproj/argo-events")
            return f"-X github.com/argoproj/argo-events.version={version}"
        if self.name == "gitea":
            # its Makefile's GITEA_VERSION: the tag without the v
            return f"-X main.Version={self.required('code.gitea.io/gitea').lstrip('v')}"
        if self.name == "buildkit":
            pkg = "github.com/moby/buildkit"
            return f"-X {pkg}/version.Version={self.required(pkg)} -X {pkg}/version.Package={pkg}"
        if self.name == "helm":
            # its Makefile's LDFLAGS: `helm version` says the release, clean
            pkg = "helm.sh/helm/v4/internal/version"
            return (
                f"-X {pkg}.version={self.required('helm.sh/helm/v4')} -X {pkg}.gitTreeState=clean"
            )
        if self.name == "cosign":
            pkg = "sigs.k8s.io/release-utils/version"
            return f"-X {pkg}.gitVersion={self.required('github.com/sigstore/cosign/v2')}"
        if self.name == "promtool":
            # its .promu.yml's ldflags, for both its binaries: `promtool --version` and
            # `prometheus --version` say the release, whose module version v0.3XY.Z is
            # Prometheus 3.XY.Z (its VERSION file)
            module = self.required("github.com/prometheus/prometheus")
            minor, patch = module.removeprefix("v0.").split(".", 1)
            version = f"{int(minor) // 100}.{int(minor) % 100}.{patch}"
            pkg = "github.com/prometheus/common/version"
            return f"-X {pkg}.Version={version} -X {pkg}.Branch=HEAD"
        return ""

    def tags(self) -> str:
        """Build tags, as the upstream release builds set them."""
        if self.name == "buildkit":
            # its Dockerfile's buildkitd stage: seccomp puts the default profile on RUN
            return "osusergo netgo static_build seccomp"
        if self.name == "containerd":
            # no_btrfs: without cgo there is no btrfs snapshotter; urfave_cli_no_docs: its
            # Makefile always sets it
            return "no_btrfs urfave_cli_no_docs"
        if self.name == "promtool":
            # its .promu.yml's tags but builtinassets: that one embeds the web UI, which the
            # module zip lacks (web/ui/embed.go and static/ are made by its npm build), so
            # prometheus does not compile with it. Without it only the UI's pages are gone
            # (the HTTP API, /api/v1/..., is the same); promtool never imports web/ui
            return "netgo"
        return ""

    def toolchain(self) -> str | None:
        """The Go toolchain its go.mod names (``toolchain go1.27.3``), which builds it
        instead of the installed Go."""
        match = re.search(r"^toolchain (go\S+)", self.gomod, re.M)
        return match[1] if match else None

    def goversion(self, installed: str) -> str:
        """The version of the Go that builds it: its toolchain, or the Go installed."""
        return self.toolchain() or installed

    def binaries(self) -> dict[str, str]:
        """The command each tool is installed as, from the name ``go build`` gives it
        (the last path element, the one before a /vN suffix)."""
        names = {}
        for tool in self.tools():
            parts = tool.split("/")
            if re.fullmatch(r"v\d+", parts[-1]):
                parts = parts[:-1]
            names[parts[-1]] = RENAMED.get(tool, parts[-1])
        return names

    def installed(self) -> list[str]:
        """Everything its folder holds once built: the binaries, their further names
        and the upstream files."""
        return [
            *self.binaries().values(),
            *LINKS.get(self.name, {}),
            *FILES.get(self.name, {}),
        ]


def staging_replaces(upstream_gomod: str, version: str) -> list[str]:
    """The replace lines that map each staging module of k8s.io/kubernetes' go.mod
    (``k8s.io/x => ./staging/src/k8s.io/x``) to its published ``v0.<minor>.<patch>``."""
    published = "v0." + version.lstrip("v").split(".", 1)[1]
    return [
        f"{match[1]} => {match[1]} {published}"
        for match in re.finditer(
            r"^\s*(k8s\.io/\S+) => \./staging/src/\1\s*$", upstream_gomod, re.M
        )
    ]


def download(go: str, module: str, version: str, toolchain: str = "local") -> dict[str, str]:
    """``module@version`` in the module cache, fetched first if need be: what ``go mod
    download -json`` says of it (``Dir``, its folder; ``GoMod``, its go.mod). A module
    whose go.mod needs a newer Go than the installed one needs that ``toolchain``."""
    out = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=HERE,  # no module here: nothing's go.mod or go.sum is touched
        env={**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": toolchain},
    )
    try:
        found: dict[str, str] = json.loads(out.stdout)
    except ValueError:
        found = {}
    if out.returncode != 0 or "Dir" not in found:
        said = found.get("Error") or out.stderr.strip()
        raise PeerError(f"`go mod download {module}@{version}` exited {out.returncode}: {said}")
    return found


def with_symlinks(peer: Peer, upstream: Path, work: Path) -> Path:
    """A copy of ``peer``'s wrapper module in ``work`` whose go.mod replaces the module
    of ``SYMLINKS[peer]`` with a copy of ``upstream`` (its folder in the module cache)
    in which the dropped links are restored. Only ``work`` is written: the module cache
    stays read-only and the committed go.mod pristine (a directory replacement needs no
    go.sum line, so the build stays ``-mod=readonly``)."""
    module, links = SYMLINKS[peer.name]
    source = work / "upstream"
    # copyfile, not copy2: the module cache's read-only modes stay behind
    shutil.copytree(upstream, source, copy_function=shutil.copyfile)
    for copied, _, _ in os.walk(source):
        os.chmod(copied, 0o755)
    for link, target in links.items():
        if not (source / link).exists():
            (source / link).symlink_to(target)
    wrapper = work / "wrapper"
    wrapper.mkdir()
    for own in ("go.mod", "go.sum", *(p.name for p in peer.module.glob("*.go"))):
        shutil.copyfile(peer.module / own, wrapper / own)
    with open(wrapper / "go.mod", "a") as gomod:
        gomod.write(f"\nreplace {module} => {source}\n")
    return wrapper


def upstream_gomod(go: str, module: str, version: str) -> str:
    """The go.mod of ``module@version``, through the module cache."""
    return Path(download(go, module, version)["GoMod"]).read_text()


def peers() -> list[Peer]:
    return [Peer(p.parent.name, p.parent) for p in sorted(HERE.glob("*/go.mod"))]


def cache_root() -> Path:
    return Path(
        os.environ.get("FABRIQUE_PEERS_CACHE") or Path.home() / ".cache" / "fabrique" / "peers"
    )


@functools.cache
def go_version(go: str) -> str:
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def find_go() -> str | None:
    """The go command, if it is at least MIN_GO (None otherwise)."""
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        return None
    match = re.match(r"go(\d+)\.(\d+)", go_version(go))
    if match is None or (int(match.group(1)), int(match.group(2))) < MIN_GO:
        return None
    return go


def key(peer: Peer, goversion: str) -> str:
    """The key of ``peer``'s folder, built by the installed Go of ``goversion`` unless
    its go.mod names a toolchain."""
    digest = hashlib.sha256()
    for part in (
        peer.gomod,
        (peer.module / "go.sum").read_text(),
        peer.goversion(goversion),
        peer.ldflags(),
        *sorted(p.read_text() for p in peer.module.glob("*.go")),
        # only when set: the keys of the peers without tags stay what they were
        *([peer.tags()] if peer.tags() else []),
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def folder(peer: Peer, goversion: str) -> Path:
    return cache_root() / f"{peer.name}-{key(peer, goversion)}"


def is_built(where: Path, peer: Peer) -> bool:
    return (where / "built.json").exists() and all(
        (where / name).exists() for name in peer.installed()
    )


def build(peer: Peer, go: str) -> Path:
    """The folder of ``peer``'s binaries, built there first unless it already is. One
    process at a time per peer (a lock beside its folder): the test workers of one run,
    or ``make peers`` beside a test run, may ask for the same peer at once, and two builds
    into one ``.partial`` folder spoil each other."""
    goversion = go_version(go)
    where = folder(peer, goversion)
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.with_name(where.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(peer, go, goversion, where)


def _build(peer: Peer, go: str, goversion: str, where: Path) -> Path:
    if is_built(where, peer):
        print(f"peer {peer.name}: up to date ({where})", flush=True)
        return where
    print(f"peer {peer.name}: building {' '.join(peer.installed())} ...", flush=True)
    started = time.monotonic()
    partial = where.with_name(where.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    toolchain = peer.toolchain() or "local"
    # a peer that restores symlinks builds from a copy of its wrapper in a folder beside
    # its own, gone once built
    with tempfile.TemporaryDirectory(prefix=f".{where.name}.", dir=where.parent) as work:
        module = peer.module
        if peer.name in SYMLINKS:
            name = SYMLINKS[peer.name][0]
            upstream = download(go, name, peer.required(name), toolchain)["Dir"]
            module = with_symlinks(peer, Path(upstream), Path(work))
        _go_build(peer, go, module, toolchain, partial)
    for built, installed in peer.binaries().items():
        if built != installed:
            (partial / built).rename(partial / installed)
    for link, target in LINKS.get(peer.name, {}).items():
        (partial / link).symlink_to(target)
    for name, (module_path, under) in FILES.get(peer.name, {}).items():
        found = download(go, module_path, peer.required(module_path), toolchain)["Dir"]
        shutil.copyfile(Path(found) / under / name, partial / name)
        (partial / name).chmod(0o755)
    seconds = time.monotonic() - started
    (partial / "built.json").write_text(
        json.dumps(
            {"peer": peer.name, "go": peer.goversion(goversion), "seconds": round(seconds, 1)}
        )
        + "\n"
    )
    shutil.rmtree(where, ignore_errors=True)
    partial.rename(where)
    print(f"peer {peer.name}: built in {seconds:.0f} s", flush=True)
    return where


def _go_build(peer: Peer, go: str, module: Path, toolchain: str, partial: Path) -> None:
    command = [
        go,
        "build",
        "-trimpath",
        "-ldflags",
        peer.ldflags(),
        "-tags",
        peer.tags(),
        "-o",
        f"{partial}/",
        *peer.tools(),
    ]
    # GOTOOLCHAIN=local: the Go installed builds, never one downloaded, unless the peer
    # names its toolchain
    env = {
        **os.environ,
        "GOFLAGS": "-mod=readonly -buildvcs=false",
        "CGO_ENABLED": "0",
        "GOTOOLCHAIN": toolchain,
    }
    result = subprocess.run(command, cwd=module, env=env, check=False)
    if result.returncode != 0:
        raise PeerError(f"peer {peer.name}: `{' '.join(command)}` exited {result.returncode}")


class Prefetch:
    """Downloads the modules of the peers to build, one peer after the other, in a thread
    beside the builds: a cold build otherwise waits for each peer's downloads (Gitea's
    1.4 GB, Argo Events' 2.7 GB) before it compiles, with both cores idle. The go command
    locks the module cache, so a build that reaches a module being fetched waits for it.
    A failure here is left for that peer's build to report; ``stop`` ends what is left."""

    def __init__(self, go: str, unbuilt: list[Peer]) -> None:
        self.go, self.unbuilt = go, unbuilt
        self.lock = threading.Lock()
        self.stopped = False
        self.running: subprocess.Popen[bytes] | None = None
        self.thread = threading.Thread(target=self._fetch, daemon=True)
        if len(unbuilt) > 1:
            print(
                f"peers: fetching the modules of {len(unbuilt)} peers beside the builds",
                flush=True,
            )
            self.thread.start()

    def _fetch(self) -> None:
        for peer in self.unbuilt:
            toolchain = peer.toolchain() or "local"
            env = {**os.environ, "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": toolchain}
            with self.lock:
                if self.stopped:
                    return
                self.running = subprocess.Popen(
                    [self.go, "mod", "download"],
                    cwd=peer.module,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            self.running.wait()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            if self.running is not None and self.running.poll() is None:
                self.running.terminate()
        if self.thread.is_alive():
            self.thread.join(timeout=10)


def parser() -> argparse.ArgumentParser:
    said = argparse.ArgumentParser(
        prog="build.py",
        description="Build (or find) the live tier's peers and print their folders.",
    )
    said.add_argument("names", nargs="*", metavar="PEER", help="the peers to build (all)")
    said.add_argument("--check", action="store_true", help="exit 1 if any peer would be built")
    said.add_argument(
        "--if-go", action="store_true", help="without Go, a notice and exit 0 (not in CI)"
    )
    said.add_argument(
        "--staging",
        action="store_true",
        help="print the kubernetes peer's replace lines, from the upstream go.mod of the "
        "version required",
    )
    return said


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    check, names = args.check, args.names
    chosen = [p for p in peers() if not names or p.name in names]
    unknown = set(names) - {p.name for p in chosen}
    if unknown:
        print(f"error: no peer named {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    go = find_go()
    if go is None and args.if_go and not os.environ.get("CI"):
        print(
            f"notice: no Go >= {MIN_GO[0]}.{MIN_GO[1]}: the live tier's peers are not built "
            "and its tests will skip",
            file=sys.stderr,
        )
        return 0
    if go is None:
        print(
            f"error: the live tier's peers need Go >= {MIN_GO[0]}.{MIN_GO[1]} and the Go module "
            "proxy: install Go, or run the tests without the live tier",
            file=sys.stderr,
        )
        return 3
    if args.staging:
        kubernetes = Peer("kubernetes", HERE / "kubernetes")
        version = kubernetes.required("k8s.io/kubernetes")
        lines = staging_replaces(upstream_gomod(go, "k8s.io/kubernetes", version), version)
        print("replace (\n" + "".join(f"\t{line}\n" for line in lines) + ")")
        return 0
    if check:
        stale = [p.name for p in chosen if not is_built(folder(p, go_version(go)), p)]
        print("\n".join(f"peer {n}: not built" for n in stale) or "all peers built")
        return 1 if stale else 0
    started = time.monotonic()
    fetching = Prefetch(go, [p for p in chosen if not is_built(folder(p, go_version(go)), p)])
    try:
        for peer in chosen:
            build(peer, go)
    except PeerError as failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    finally:
        fetching.stop()
    print(f"peers: {len(chosen)} ready in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
