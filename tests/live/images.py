"""The real node's images, made here from Debian packages and the project's Go peers and
pushed to one loopback registry, under the names the node's containerd pulls them by:
its mirrors for ``registry:80``, ``docker.io`` and ``quay.io`` all lead to that registry,
the host dropped (``docker.io/moby/buildkit:v0.32.2-rootless`` is
``<registry>/moby/buildkit:v0.32.2-rootless``). Nothing comes from Docker Hub or quay.io.

- ``PAUSE``: the sandbox image containerd pins: Debian's busybox-static as PID 1, waiting
  until TERM or INT;
- ``APP_BASE``: Debian's busybox with its applets linked (``busybox --install`` needs
  /proc), enough for a toy app's ``httpd -f -p 8080``;
- ``BUILDKIT``, the build step's image: buildkitd and buildctl of the buildkit peer,
  RootlessKit, the release's ``buildctl-daemonless.sh``, Debian's runc as
  ``buildkit-runc`` and Debian's newuidmap and newgidmap with file capabilities instead
  of setuid (a setuid-root newuidmap cannot write uid_map in a container), laid out as
  the upstream rootless image: user 1000 with subordinate ids, its home and runtime
  folder, the same environment and entrypoint;
- ``ARGOEXEC``, Argo's executor at the argo-workflows peer's version: the base plus
  ``/bin/argoexec`` and the files upstream's image copies beside it;
- ``GIT``, the checkout step's image: Debian's git, without perl (the step runs git's
  own commands only);
- ``TOOLS``: built by the real BuildKit from the project's ``Dockerfile``, on
  ``PYTHON`` (Debian's python3 and pip, installing into /usr/local as python:3.11-slim
  does) and ``COSIGN`` (``/ko-app/cosign`` of the cosign peer), both pinned by digest.

Every image but the tools image is written here as an OCI layout (one gzip layer, every
mtime 0, owners kept, xattrs as PAX records) and pushed with ``skopeo copy
--preserve-digests``; an image the registry already holds at that digest is not pushed
again. What is slow to make is cached under ``$FABRIQUE_IMAGES_CACHE`` (default
``~/.cache/fabrique/images``), keyed as the peers are: the sha256 of what goes in (the
Debian package list and mmdebstrap's options; the peers' folders, which name their keys;
the files copied; this module's code). mmdebstrap takes the host's apt sources.
"""

from __future__ import annotations

import fcntl
import fnmatch
import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import struct
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from fabrique.site.config import load_site
from fabrique.site.names import ImageRef

from .. import tools_image
from . import buildkit, controlplane

# -- the names ---------------------------------------------------------------------------

ARGO_VERSION = controlplane.peers.Peer(
    "argo-workflows", controlplane.ROOT / "tests/peers/argo-workflows"
).required(controlplane.ARGO_MODULE)
BUILDKIT_MODULE = "github.com/moby/buildkit"
COSIGN_VERSION = controlplane.peers.Peer(
    "cosign", controlplane.ROOT / "tests/peers/cosign"
).required("github.com/sigstore/cosign/v2")

# the hosts whose names the node's containerd pulls from the one registry
MIRRORED = ("registry:80", "docker.io", "quay.io")


def qualified(name: str) -> str:
    """``name`` as containerd reads it: ``moby/buildkit:v1`` is
    ``docker.io/moby/buildkit:v1``, ``busybox`` is ``docker.io/library/busybox:latest``."""
    ref = ImageRef.parse(name)
    host = ref.host or "docker.io"
    repository = ref.repository
    if host == "docker.io" and "/" not in repository:
        repository = f"library/{repository}"
    return f"{host}/{repository}:{ref.tag or 'latest'}"


def mirrored(name: str) -> str:
    """Where the node's mirrors find ``name`` in the registry: its repository and tag."""
    host, _, rest = qualified(name).partition("/")
    if host not in MIRRORED:
        raise ImageError(f"{name}: the node's containerd mirrors only {', '.join(MIRRORED)}")
    return rest


_IMAGES = load_site(env={}).images  # the default site's: what its templates run
PAUSE = "registry:80/fabrique/pause:1"
APP_BASE = "registry:80/base/busybox:1.35"
BUILDKIT = qualified(_IMAGES.buildkit)
ARGOEXEC = f"quay.io/argoproj/argoexec:{ARGO_VERSION}"
GIT = qualified(_IMAGES.git)
PYTHON = "registry:80/fabrique/python:3.11-bookworm"
COSIGN = f"registry:80/fabrique/cosign:{COSIGN_VERSION}"
TOOLS = qualified(_IMAGES.tools)


class ImageError(RuntimeError):
    """An image could not be made or pushed: the message names it and the command."""


# -- a layer and an OCI layout ---------------------------------------------------------

CAP_SETGID = 6
CAP_SETUID = 7
XATTR = "SCHILY.xattr."


def file_capability(*capabilities: int) -> bytes:
    """The ``security.capability`` xattr ``setcap <capabilities>+ep`` writes: a struct
    vfs_cap_data of revision 2 with the effective flag, each capability permitted."""
    permitted = [0, 0]
    for capability in capabilities:
        permitted[capability // 32] |= 1 << (capability % 32)
    # magic_etc, then (permitted, inheritable) for capabilities 0-31 and 32-63
    return struct.pack("<5I", 0x02000000 | 0x1, permitted[0], 0, permitted[1], 0)


def _clean(path: str) -> str:
    return path.removeprefix("./").strip("/")


@dataclass
class _Entry:
    info: tarfile.TarInfo
    data: Callable[[], IO[bytes]] | None = None


class Tree:
    """A root filesystem to write as one layer: a tar entry per path (owner, mode and
    xattrs as given, every mtime 0), from Debian's tarballs, the peers' files and the few
    made here. A context manager: it holds the tarballs it reads from open."""

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}
        self._open = ExitStack()

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self._open.close()

    def __contains__(self, path: str) -> bool:
        return _clean(path) in self.entries

    def _put(self, info: tarfile.TarInfo, data: Callable[[], IO[bytes]] | None = None) -> None:
        info.name = _clean(info.name)
        parent = os.path.dirname(info.name)
        if parent and parent not in self.entries:
            self.dir(parent)
        info.mtime = 0
        info.uname = info.gname = ""
        self.entries[info.name] = _Entry(info, data)

    def extend(self, tarball: Path, *, exclude: tuple[str, ...] = ()) -> None:
        """Every entry of ``tarball`` but those under the ``exclude`` patterns."""
        tar = self._open.enter_context(tarfile.open(tarball))
        for member in tar:
            name = _clean(member.name)
            if not name or _matches(name, exclude):
                continue
            if member.islnk():
                member.linkname = _clean(member.linkname)
            member.pax_headers = {
                k: v for k, v in member.pax_headers.items() if k.startswith(XATTR)
            }
            self._put(member, _reader(tar, member) if member.isreg() else None)

    def dir(self, path: str, mode: int = 0o755, owner: tuple[int, int] = (0, 0)) -> None:
        info = tarfile.TarInfo(path)
        info.type, info.mode = tarfile.DIRTYPE, mode
        info.uid, info.gid = owner
        self._put(info)

    def file(
        self,
        path: str,
        content: bytes | Path,
        mode: int = 0o644,
        owner: tuple[int, int] = (0, 0),
        xattrs: dict[str, bytes] | None = None,
    ) -> None:
        info = tarfile.TarInfo(path)
        info.mode = mode
        info.uid, info.gid = owner
        if isinstance(content, Path):
            info.size = content.stat().st_size
            self._put(info, lambda: content.open("rb"))
        else:
            info.size = len(content)
            self._put(info, lambda: io.BytesIO(content))
        self.xattrs(path, xattrs or {})

    def symlink(self, path: str, target: str) -> None:
        info = tarfile.TarInfo(path)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        self._put(info)

    def chmod(self, path: str, mode: int) -> None:
        self.entries[_clean(path)].info.mode = mode

    def xattrs(self, path: str, xattrs: dict[str, bytes]) -> None:
        """Set extended attributes: PAX records, which containerd applies when it unpacks
        (bytes kept whole: tarfile writes a value that is not UTF-8 as hdrcharset=BINARY)."""
        info = self.entries[_clean(path)].info
        for name, value in xattrs.items():
            info.pax_headers[XATTR + name] = value.decode("utf-8", "surrogateescape")

    def read(self, path: str) -> bytes:
        data = self.entries[_clean(path)].data
        if data is None:
            raise ImageError(f"{path} is not a regular file of the image")
        with data() as stream:
            return stream.read()

    def remove(self, *patterns: str) -> None:
        """Drop every path matching a pattern, with what lies under it."""
        for name in [n for n in self.entries if _matches(n, patterns)]:
            del self.entries[name]

    def write(self, blobs: Path) -> tuple[str, dict[str, Any]]:
        """Write the layer as a gzip blob into ``blobs``; return its diff_id (the digest
        of the tar) and its descriptor."""
        blobs.mkdir(parents=True, exist_ok=True)
        temporary = blobs / f".layer-{os.getpid()}"
        with temporary.open("wb") as out:
            compressed = _Hashing(out)
            # level 6: zlib's default; 9 takes twice as long for a few percent
            with gzip.GzipFile(
                filename="", mode="wb", fileobj=compressed, mtime=0, compresslevel=6
            ) as gz:
                plain = _Hashing(gz)
                with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    # a hard link after what it links to, whatever their names
                    for name in sorted(
                        self.entries, key=lambda n: (self.entries[n].info.islnk(), n)
                    ):
                        self._add(tar, self.entries[name])
        digest = compressed.digest
        temporary.rename(blobs / digest.removeprefix("sha256:"))
        return plain.digest, {
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest,
            "size": compressed.size,
        }

    def _add(self, tar: tarfile.TarFile, entry: _Entry) -> None:
        if entry.info.islnk() and entry.info.linkname not in self.entries:
            raise ImageError(f"{entry.info.name}: a hard link to {entry.info.linkname}, removed")
        if entry.data is None:
            tar.addfile(entry.info)
            return
        with entry.data() as stream:
            tar.addfile(entry.info, stream)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``name`` or a folder above it matches a pattern (``*`` crosses ``/``)."""
    return any(
        fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, p + "/*") for p in patterns
    )


def _reader(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Callable[[], IO[bytes]]:
    def read() -> IO[bytes]:
        stream = tar.extractfile(member)
        assert stream is not None
        return stream

    return read


class _Hashing(io.RawIOBase):
    """A writer that passes its bytes on and keeps their sha256 and count."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        self.hash.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)

    @property
    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()


def architecture() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _blob(blobs: Path, body: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    (blobs / digest.removeprefix("sha256:")).write_bytes(body)
    return {"mediaType": media_type, "digest": digest, "size": len(body)}


def write_layout(folder: Path, tag: str, layer: Tree, config: dict[str, Any]) -> str:
    """An OCI image layout in ``folder``: ``layer``, an image config whose ``config`` is
    ``config`` (Env, Entrypoint, User...), the manifest, index.json naming it ``tag``.
    Returns the manifest's digest."""
    blobs = folder / "blobs" / "sha256"
    diff_id, layer_descriptor = layer.write(blobs)
    image = {
        "architecture": architecture(),
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": f"fabrique {Path(__file__).name}: {tag}"}],
    }
    config_blob = _blob(
        blobs,
        json.dumps(image, sort_keys=True).encode(),
        "application/vnd.oci.image.config.v1+json",
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_blob,
        "layers": [layer_descriptor],
    }
    descriptor = _blob(blobs, json.dumps(manifest).encode(), manifest["mediaType"])
    _index(folder, tag, descriptor)
    return str(descriptor["digest"])


def _index(folder: Path, tag: str, descriptor: dict[str, Any]) -> None:
    (folder / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    entry = {**descriptor, "annotations": {"org.opencontainers.image.ref.name": tag}}
    (folder / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))


def layout_digest(folder: Path) -> str:
    """The digest of the manifest the layout's index.json names."""
    (entry,) = json.loads((folder / "index.json").read_text())["manifests"]
    return str(entry["digest"])


# -- the cache -----------------------------------------------------------------------------

CODE = Path(__file__).read_bytes()


def cache_root() -> Path:
    return Path(
        os.environ.get("FABRIQUE_IMAGES_CACHE") or Path.home() / ".cache" / "fabrique" / "images"
    )


def key(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One process at a time makes a cache entry: the test workers of one run, or
    ``make up`` beside them, may ask for the same image at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _cached(slug: str, digest_key: str, make: Callable[[Path], None]) -> Path:
    """The cache folder ``<slug>-<key>``, made by ``make`` into a fresh folder first
    unless complete (a ``made.json`` in it)."""
    where = cache_root() / f"{slug}-{digest_key}"
    with _locked(where.with_name(where.name + ".lock")):
        if (where / "made.json").exists():
            print(f"image {slug}: up to date ({where})", flush=True)
            return where
        print(f"image {slug}: making ...", flush=True)
        started = time.monotonic()
        partial = where.with_name(where.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        make(partial)
        seconds = time.monotonic() - started
        (partial / "made.json").write_text(json.dumps({"seconds": round(seconds, 1)}) + "\n")
        shutil.rmtree(where, ignore_errors=True)
        partial.rename(where)
        print(f"image {slug}: made in {seconds:.0f} s", flush=True)
        return where


# -- Debian ----------------------------------------------------------------------------------

SUITE = "bookworm"
NO_DOCS = tuple(
    f"--dpkgopt=path-exclude=/usr/share/{folder}/*" for folder in ("doc", "man", "locale")
)
# what mmdebstrap leaves that a container gets from its runtime, or must not carry
NOT_IN_IMAGES = ("dev/*", "etc/hostname", "etc/resolv.conf")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def debian(packages: tuple[str, ...], variant: str = "extract") -> Path:
    """A tarball of ``packages`` and what they depend on, unpacked by mmdebstrap from the
    host's apt sources (``extract``: no maintainer scripts run; ``minbase``: installed,
    dpkg and apt working). Cached by the package list and the options."""
    options = (f"--variant={variant}", f"--include={','.join(packages)}", *NO_DOCS)
    tarball = cache_root() / f"debian-{key(SUITE, *options)}.tar"
    with _locked(tarball.with_suffix(".lock")):
        if tarball.exists():
            return tarball
        mmdebstrap = shutil.which("mmdebstrap")
        if mmdebstrap is None:
            raise ImageError("mmdebstrap is not installed: apt-get install mmdebstrap")
        partial = tarball.with_suffix(".partial.tar")
        command = [mmdebstrap, "--quiet", *options, SUITE, str(partial)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise ImageError(
                f"`{' '.join(command)}` exited {done.returncode}:\n{done.stderr[-3000:]}"
            )
        partial.rename(tarball)
    return tarball


def busybox_links(tree: Tree, busybox: str = "bin/busybox") -> None:
    """A symbolic link to ``busybox`` for each of its applets, where ``--list-full`` puts
    it, unless a package put a program there (``linuxrc``, an initrd's, is no applet)."""
    with tempfile.TemporaryDirectory() as scratch:
        program = Path(scratch) / "busybox"
        program.write_bytes(tree.read(busybox))
        program.chmod(0o755)
        listed = subprocess.run(
            [str(program), "--list-full"], capture_output=True, text=True, check=True
        ).stdout.split()
    for path in listed:
        if path not in tree and path != "linuxrc":
            tree.symlink(path, f"/{busybox}")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    home: str


def skeleton(tree: Tree, *users: User) -> None:
    """What a base image has beside its programs: root's and the users' passwd and group
    entries, /tmp for all, the mount points the runtime fills."""
    accounts = [User("root", 0, "/root"), *users]
    passwd = "".join(f"{u.name}:x:{u.uid}:{u.uid}::{u.home}:/bin/sh\n" for u in accounts)
    group = "".join(f"{u.name}:x:{u.uid}:\n" for u in accounts)
    tree.file("etc/passwd", (passwd + "nobody:x:65534:65534::/nonexistent:/bin/false\n").encode())
    tree.file("etc/group", (group + "nogroup:x:65534:\n").encode())
    tree.dir("root", 0o700)
    tree.dir("tmp", 0o1777)
    for mount_point in ("dev", "proc", "sys", "run"):
        if mount_point not in tree:
            tree.dir(mount_point)
    for user in users:
        tree.dir(user.home.lstrip("/"), owner=(user.uid, user.uid))


def _busybox_tree(tree: Tree, *packages: str, users: tuple[User, ...] = ()) -> Tree:
    tree.extend(debian(("busybox", *packages)), exclude=NOT_IN_IMAGES)
    busybox_links(tree)
    skeleton(tree, *users)
    return tree


# -- the images ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Made:
    """An image made: its name and where its OCI layout is."""

    name: str
    layout: Path

    @property
    def digest(self) -> str:
        return layout_digest(self.layout)

    @property
    def tag(self) -> str:
        return self.name.rpartition(":")[2]


def _slug(name: str) -> str:
    repository, _, tag = mirrored(name).rpartition(":")
    return f"{repository.rsplit('/', 1)[-1]}-{tag}"


def _layout(
    name: str, digest_key: str, tree: Callable[[Tree], object], config: dict[str, Any]
) -> Made:
    """The cached layout of ``name``: the tree ``tree`` fills, with ``config``."""

    def make(folder: Path) -> None:
        with Tree() as layer:
            tree(layer)
            write_layout(folder, name.rpartition(":")[2], layer, config)

    return Made(name, _cached(_slug(name), key(CODE, name, digest_key), make))


PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 2147483647 & wait; done"


def pause() -> Made:
    """busybox-static's shell as PID 1: it exits on TERM or INT (trapped: PID 1 takes no
    default action on a signal) and reaps what ends below it (``wait``)."""
    packages = ("busybox-static",)

    def tree(layer: Tree) -> None:
        with Tree() as debs:
            debs.extend(debian(packages))
            layer.file("bin/busybox", debs.read("bin/busybox"), 0o755)
        for applet in ("sh", "sleep"):
            layer.symlink(f"bin/{applet}", "busybox")

    return _layout(
        PAUSE,
        key(*packages),
        tree,
        {"Env": [f"PATH={PATH}"], "Entrypoint": ["/bin/sh", "-c", PAUSE_SCRIPT]},
    )


def app_base() -> Made:
    return _layout(
        APP_BASE,
        key("busybox"),
        _busybox_tree,
        {"Env": [f"PATH={PATH}"], "Cmd": ["sh"]},
    )


BUILD_USER = User("user", 1000, "/home/user")
SUBORDINATE = "user:100000:65536\n"


def buildkit_image() -> Made:
    """As BuildKit's Dockerfile makes its ``rootless`` stage, on Debian: no git, openssh,
    fuse-overlayfs or pigz (the build step needs none of them)."""
    found = controlplane.binaries(("buildkit", "rootlesskit"))
    version = controlplane.peers.Peer(
        "buildkit", controlplane.ROOT / "tests/peers/buildkit"
    ).required(BUILDKIT_MODULE)
    script = controlplane.module_dir(BUILDKIT_MODULE, version) / buildkit.DAEMONLESS
    packages = ("uidmap", "runc")
    home = BUILD_USER.home.lstrip("/")
    owned = (BUILD_USER.uid, BUILD_USER.uid)

    def tree(layer: Tree) -> None:
        _busybox_tree(layer, *packages, users=(BUILD_USER,))
        for name in ("buildkitd", "buildctl", "rootlesskit"):
            layer.file(f"usr/bin/{name}", found[name], 0o755)
        layer.file("usr/bin/buildctl-daemonless.sh", script, 0o755)
        layer.symlink("usr/bin/buildkit-runc", "/usr/sbin/runc")
        # setuid-root newuidmap cannot write uid_map in a container: the upstream image's
        # way, file capabilities (the PAX record containerd applies as it unpacks)
        for program, capability in (("newuidmap", CAP_SETUID), ("newgidmap", CAP_SETGID)):
            layer.chmod(f"usr/bin/{program}", 0o755)
            layer.xattrs(f"usr/bin/{program}", {"security.capability": file_capability(capability)})
        layer.file("etc/subuid", SUBORDINATE.encode())
        layer.file("etc/subgid", SUBORDINATE.encode())
        for folder in (".local", ".local/tmp", ".local/share", ".local/share/buildkit"):
            layer.dir(f"{home}/{folder}", owner=owned)
        layer.dir("run/user")
        layer.dir("run/user/1000", 0o700, owner=owned)

    state = f"{BUILD_USER.home}/.local/share/buildkit"
    return _layout(
        BUILDKIT,
        key(*packages, *(found[n].parent.name for n in sorted(found)), script.read_bytes()),
        tree,
        {
            "Env": [
                f"PATH={PATH}",
                f"HOME={BUILD_USER.home}",
                f"USER={BUILD_USER.name}",
                "XDG_RUNTIME_DIR=/run/user/1000",
                f"TMPDIR={BUILD_USER.home}/.local/tmp",
                "BUILDKIT_HOST=unix:///run/user/1000/buildkit/buildkitd.sock",
                "BUILDKITD_FLAGS=--oci-worker-no-process-sandbox",
            ],
            "User": "1000:1000",
            "Volumes": {state: {}},
            "Entrypoint": ["rootlesskit", "buildkitd"],
        },
    )


def peer_binary(name: str) -> Path:
    """The binary ``name`` of whichever peer builds it, built first if need be."""
    for peer in controlplane.peers.peers():
        if name in peer.binaries().values():
            return controlplane.binaries((peer.name,))[name]
    raise ImageError(f"no wrapper module of tests/peers/ builds {name}: add its tool line")


def argoexec() -> Made:
    """Upstream's ``argoexec`` stage (distroless static, /etc/mime.types and the
    module's ssh_known_hosts and nsswitch.conf, /bin/argoexec) on the busybox base."""
    binary = peer_binary("argoexec")
    hack = controlplane.module_dir(controlplane.ARGO_MODULE, ARGO_VERSION) / "hack"
    packages = ("media-types",)

    def tree(layer: Tree) -> None:
        _busybox_tree(layer, *packages)
        layer.file("bin/argoexec", binary, 0o755)
        layer.file("etc/ssh/ssh_known_hosts", hack / "ssh_known_hosts")
        layer.file("etc/nsswitch.conf", hack / "nsswitch.conf")

    return _layout(
        ARGOEXEC,
        key(*packages, binary.parent.name, binary.name),
        tree,
        {"Env": [f"PATH={PATH}"], "Entrypoint": ["argoexec"]},
    )


PERL = (
    "usr/bin/perl*",
    "usr/share/perl*",
    "usr/lib/*/perl*",
    "usr/lib/*/libperl*",
    "etc/perl",
    "usr/share/gitweb",
)


def git() -> Made:
    """alpine/git's shape (entrypoint git, /git) with Debian's git: the checkout step's
    sh, git init, sparse-checkout, fetch and checkout, grep and mktemp."""
    packages = ("git",)

    def tree(layer: Tree) -> None:
        _busybox_tree(layer, *packages)
        layer.remove(*PERL)
        layer.dir("git")

    return _layout(
        GIT,
        key(*packages, *PERL),
        tree,
        {"Env": [f"PATH={PATH}"], "WorkingDir": "/git", "Entrypoint": ["git"], "Cmd": ["--help"]},
    )


def python() -> Made:
    """The Dockerfile's BASE_IMAGE: Debian's python3 and pip, installed (apt-get works,
    from Debian's mirror), pip allowed to install into /usr/local as in python:3.11-slim
    (no EXTERNALLY-MANAGED)."""
    packages = ("python3", "python3-pip", "python-is-python3")
    trusted = host_trust()

    def tree(layer: Tree) -> None:
        layer.extend(debian(packages, "minbase"), exclude=NOT_IN_IMAGES)
        layer.remove("usr/lib/python3.*/EXTERNALLY-MANAGED")
        for path, content in trusted.items():
            layer.file(path, content)

    return _layout(
        PYTHON,
        key("minbase", *packages, *(part for item in sorted(trusted.items()) for part in item)),
        tree,
        {"Env": [f"PATH={PATH}", "LANG=C.UTF-8"], "Cmd": ["python3"]},
    )


TRUST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
LOCAL_CAS = Path("/usr/local/share/ca-certificates")


def host_trust() -> dict[str, bytes]:
    """The host's trust store, for the tools build's RUN steps to reach PyPI and Debian
    as the host does (through a TLS-inspecting proxy too, whose CA only the host trusts):
    its bundle, which Debian's pip reads, and its local CAs, which a later
    update-ca-certificates (the Dockerfile's apt-get) keeps in the bundle."""
    found = {}
    if TRUST_BUNDLE.is_file():
        found[str(TRUST_BUNDLE).lstrip("/")] = TRUST_BUNDLE.read_bytes()
    for path in sorted(LOCAL_CAS.rglob("*.crt")) if LOCAL_CAS.is_dir() else []:
        found[str(path).lstrip("/")] = path.read_bytes()
    return found


def cosign() -> Made:
    """The Dockerfile's COSIGN_IMAGE: ``/ko-app/cosign``, as ko lays it out."""
    binary = controlplane.binaries(("cosign",))["cosign"]

    def tree(layer: Tree) -> None:
        layer.file("ko-app/cosign", binary, 0o755)

    return _layout(
        COSIGN,
        key(binary.parent.name),
        tree,
        {"Env": [f"PATH=/ko-app:{PATH}"], "Entrypoint": ["/ko-app/cosign"]},
    )


def built_tools(registry: str, base: str, signer: str) -> Made:
    """The tools image, built by the buildkit peer from the ``Dockerfile`` with
    ``BASE_IMAGE`` and ``COSIGN_IMAGE`` pinned to ``base`` and ``signer`` (digest refs of
    ``PYTHON`` and ``COSIGN``, pulled from ``registry`` by their registry:80 names).
    Keyed by the Dockerfile, the files it copies and the two digests; BuildKit's layer
    cache is kept too, so a changed file rebuilds only the steps after it."""
    root = tools_image.DOCKERFILE.parent
    sources = tools_image.context_sources()
    parts: list[str | bytes] = [tools_image.DOCKERFILE.read_bytes(), base, signer]
    for path in _context_files(root, sources):
        parts += [str(path.relative_to(root)), path.read_bytes()]

    def make(folder: Path) -> None:
        _buildkit_build(
            root, sources, registry, {"BASE_IMAGE": base, "COSIGN_IMAGE": signer}, folder
        )

    return Made(TOOLS, _cached(_slug(TOOLS), key(CODE, TOOLS, *parts), make))


def _context_files(root: Path, sources: list[str]) -> list[Path]:
    found: list[Path] = []
    for source in sources:
        path = root / source
        found += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [p for p in found if "__pycache__" not in p.parts]


def _buildkit_build(
    root: Path, sources: list[str], registry: str, args: dict[str, str], folder: Path
) -> None:
    """``buildctl-daemonless.sh build`` of the Dockerfile by the buildkit peer, as the build
    step runs it (rootless where it can), into an OCI layout in ``folder``."""
    tag = TOOLS.rpartition(":")[2]
    with buildkit.builder() as builder:
        context = builder.folder("context")
        shutil.copy(root / "Dockerfile", context / "Dockerfile")
        for path in _context_files(root, sources):
            target = context / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
        for path in [context, *context.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        out = builder.folder("out")
        layer_cache = builder.folder("cache")
        saved = cache_root() / "buildkit-cache" / _slug(TOOLS)
        if saved.exists():
            shutil.copytree(saved, layer_cache, dirs_exist_ok=True)
            _own(layer_cache, builder)
        options = [
            *(
                arg
                for name, value in args.items()
                for arg in ("--opt", f"build-arg:{name}={value}")
            ),
            "--output",
            f"type=oci,dest={out}/image.tar,name={TOOLS}",
            "--export-cache",
            f"type=local,dest={out}/cache,mode=max",
            *(("--import-cache", f"type=local,src={layer_cache}") if saved.exists() else ()),
        ]
        done = builder.buildctl(context, registry, options, timeout=1800)
        if done.returncode != 0:
            raise ImageError(
                f"BuildKit ({builder.mode}) could not build {TOOLS} from the Dockerfile: "
                f"`{' '.join(done.args)}` exited {done.returncode}:\n{done.stdout[-5000:]}"
            )
        with tarfile.open(out / "image.tar") as tar:
            tar.extractall(folder, filter="data")
        (descriptor,) = json.loads((folder / "index.json").read_text())["manifests"]
        _index(folder, tag, {k: descriptor[k] for k in ("mediaType", "digest", "size")})
        shutil.rmtree(saved, ignore_errors=True)
        saved.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(out / "cache", saved)


def _own(folder: Path, builder: buildkit.Builder) -> None:
    if builder.user is not None and os.geteuid() == 0:
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, builder.user.pw_uid, builder.user.pw_gid, follow_symlinks=False)


# -- the registry ----------------------------------------------------------------------------

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)


def registry_digest(registry: str, name: str) -> str | None:
    """The digest ``registry`` holds under ``name``'s mirrored repository and tag, or None."""
    repository, _, tag = mirrored(name).rpartition(":")
    response = httpx.head(
        f"http://{registry}/v2/{repository}/manifests/{tag}",
        headers={"Accept": MANIFEST_TYPES},
        timeout=30,
    )
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return response.headers.get("Docker-Content-Digest")


def push(made: Made, registry: str) -> str:
    """Push ``made`` to ``registry`` under its mirrored name, unless it is there at the
    same digest; return ``<registry>/<repository>@<digest>``."""
    digest = made.digest
    repository, _, tag = mirrored(made.name).rpartition(":")
    pushed = f"{registry}/{repository}@{digest}"
    if registry_digest(registry, made.name) == digest:
        return pushed
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise ImageError("skopeo is not installed: apt-get install skopeo")
    with tempfile.TemporaryDirectory() as scratch:
        policy = Path(scratch) / "policy.json"
        policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        written = Path(scratch) / "digest"
        command = [
            *(skopeo, "--policy", str(policy), "copy", "--quiet", "--preserve-digests"),
            *("--dest-tls-verify=false", "--digestfile", str(written)),
            f"oci:{made.layout}:{made.tag}",
            f"docker://{registry}/{repository}:{tag}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise ImageError(f"`{' '.join(command)}` exited {done.returncode}: {done.stderr}")
        if written.read_text().strip() != digest:
            raise ImageError(f"{made.name}: pushed as {written.read_text()}, made as {digest}")
    return pushed


def pinned(name: str, pushed: dict[str, str]) -> str:
    """``name`` (``registry:80/base/busybox:1.35``) by the digest ``push_node_images``
    pushed it at, as the node pulls it: ``registry:80/base/busybox@sha256:…``."""
    return f"{name.rsplit(':', 1)[0]}@{pushed[name].split('@', 1)[1]}"


def push_node_images(registry: str, *, tools: bool = True) -> dict[str, str]:
    """Make (or find in the cache) every image the node runs and push each to
    ``registry`` (host:port, plain HTTP) under its mirrored name; return {upstream name:
    ``<registry>/<repository>@<digest>``}. ``tools=False`` leaves out the tools image
    (and the Python and cosign images it is built from)."""
    made = [pause(), app_base(), buildkit_image(), argoexec(), git()]
    pushed = {image.name: push(image, registry) for image in made}
    if tools:
        base, signer = python(), cosign()
        for image in (base, signer):
            pushed[image.name] = push(image, registry)
        built = built_tools(
            registry, f"{base.name}@{base.digest}", f"{signer.name}@{signer.digest}"
        )
        pushed[built.name] = push(built, registry)
    return pushed
