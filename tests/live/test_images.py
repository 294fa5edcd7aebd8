"""The real node's images for real (``images.py``): made from Debian's packages and the
peers, the tools image built by the buildkit peer from the Dockerfile, pushed to a
loopback registry under the names the node's mirrors look up, and read back from it.
The pause and base images are run too, as PID 1 of a new PID namespace.

Cold (the peers built, nothing in ``$FABRIQUE_IMAGES_CACHE``) it takes about two minutes,
most of it mmdebstrap and the tools image's pip and apt-get (PyPI and Debian's mirror
reached from the host); warm, seconds."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .. import servers
from ..servers import Registry
from . import images
from .fixtures import need_go

ACCEPT = {"Accept": images.MANIFEST_TYPES}


@pytest.fixture(scope="module")
def pushed(registry: Registry) -> dict[str, str]:
    need_go()
    started = time.monotonic()
    found = images.push_node_images(registry.host)
    print(f"node images: {len(found)} pushed in {time.monotonic() - started:.0f} s")
    return found


@pytest.fixture(scope="module")
def again(registry: Registry, pushed: dict[str, str]) -> dict[str, str]:
    return images.push_node_images(registry.host)


def _manifest(registry: Registry, ref: str) -> tuple[str, dict[str, Any]]:
    repository, _, digest = ref.removeprefix(f"{registry.host}/").partition("@")
    response = httpx.get(f"{registry.url}/v2/{repository}/manifests/{digest}", headers=ACCEPT)
    response.raise_for_status()
    return repository, response.json()


def _config(registry: Registry, ref: str) -> dict[str, Any]:
    repository, manifest = _manifest(registry, ref)
    blob = httpx.get(f"{registry.url}/v2/{repository}/blobs/{manifest['config']['digest']}")
    return dict(blob.json())


def _layers(registry: Registry, ref: str) -> Iterator[tarfile.TarFile]:
    repository, manifest = _manifest(registry, ref)
    for layer in manifest["layers"]:
        blob = httpx.get(f"{registry.url}/v2/{repository}/blobs/{layer['digest']}", timeout=120)
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob.content))) as tar:
            yield tar


def _members(registry: Registry, ref: str) -> dict[str, tarfile.TarInfo]:
    return {m.name: m for tar in _layers(registry, ref) for m in tar.getmembers()}


def _rootfs(registry: Registry, ref: str, folder: Path) -> Path:
    """The image's one layer unpacked, as the runtime unpacks it (links kept absolute)."""
    repository, manifest = _manifest(registry, ref)
    (layer,) = manifest["layers"]
    blob = httpx.get(f"{registry.url}/v2/{repository}/blobs/{layer['digest']}")
    folder.mkdir()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob.content))) as tar:
        tar.extractall(folder, filter="fully_trusted")
    return folder


def _as_pid_1(root: Path, command: list[str]) -> subprocess.Popen[bytes]:
    """``command`` in ``root`` as PID 1 of a new PID namespace, with the host's network."""
    unshare = servers.require_binary("unshare")
    return subprocess.Popen(
        [unshare, "--user", "--map-root-user", "--pid", "--fork", f"--root={root}", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_every_image_is_where_the_nodes_mirrors_look_at_the_digest_returned(
    registry: Registry, pushed: dict[str, str]
) -> None:
    names = (images.PAUSE, images.APP_BASE, images.BUILDKIT, images.ARGOEXEC, images.GIT)
    assert set(names) | {images.TOOLS} <= set(pushed)
    for name, ref in pushed.items():
        repository, _, digest = ref.partition("@")
        assert repository == f"{registry.host}/{images.mirrored(name).rpartition(':')[0]}"
        assert images.registry_digest(registry.host, name) == digest, name


def test_a_second_push_finds_them_all_in_the_cache_and_the_registry(
    pushed: dict[str, str], again: dict[str, str]
) -> None:
    assert again == pushed


def test_the_buildkit_image_maps_ids_with_file_capabilities_not_setuid(
    registry: Registry, pushed: dict[str, str]
) -> None:
    members = _members(registry, pushed[images.BUILDKIT])
    for program, capability in (("newuidmap", images.CAP_SETUID), ("newgidmap", images.CAP_SETGID)):
        member = members[f"usr/bin/{program}"]
        assert member.mode & 0o7000 == 0, f"{program} is still setuid"
        raw = member.pax_headers["SCHILY.xattr.security.capability"]
        assert raw.encode("utf-8", "surrogateescape") == images.file_capability(capability)
    for program in ("buildkitd", "buildctl", "rootlesskit", "buildctl-daemonless.sh"):
        assert members[f"usr/bin/{program}"].mode == 0o755, program
    assert members["usr/bin/buildkit-runc"].linkname == "/usr/sbin/runc"
    assert members["usr/sbin/runc"].isreg()
    for owned in ("home/user", "home/user/.local/share/buildkit", "run/user/1000"):
        assert (members[owned].uid, members[owned].gid) == (1000, 1000), owned
    config = _config(registry, pushed[images.BUILDKIT])["config"]
    assert config["User"] == "1000:1000"
    assert config["Entrypoint"] == ["rootlesskit", "buildkitd"]
    assert {"USER=user", "HOME=/home/user", "XDG_RUNTIME_DIR=/run/user/1000"} <= set(config["Env"])


def test_the_capability_written_is_what_setcap_writes(tmp_path: Path) -> None:
    setcap = shutil.which("setcap") or "/usr/sbin/setcap"
    pairs = (("cap_setuid+ep", images.CAP_SETUID), ("cap_setgid+ep", images.CAP_SETGID))
    for spec, capability in pairs:
        program = tmp_path / spec
        program.write_bytes(b"")
        subprocess.run([setcap, spec, str(program)], check=True, capture_output=True)
        assert os.getxattr(program, "security.capability") == images.file_capability(capability)


def test_the_pause_image_waits_until_terminated(
    registry: Registry, pushed: dict[str, str], tmp_path: Path
) -> None:
    root = _rootfs(registry, pushed[images.PAUSE], tmp_path / "pause")
    entrypoint = _config(registry, pushed[images.PAUSE])["config"]["Entrypoint"]
    pause = _as_pid_1(root, entrypoint)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            pause.wait(timeout=1)
        # unshare --fork waits on PID 1 of the new namespace: signal that one
        pid_1 = int(Path(f"/proc/{pause.pid}/task/{pause.pid}/children").read_text().split()[0])
        os.kill(pid_1, signal.SIGTERM)
        assert pause.wait(timeout=10) == 0
    finally:
        pause.kill()
        pause.wait()


def test_the_app_base_serves_http_with_busybox(
    registry: Registry, pushed: dict[str, str], tmp_path: Path
) -> None:
    root = _rootfs(registry, pushed[images.APP_BASE], tmp_path / "base")
    (root / "www").mkdir()
    (root / "www/index.html").write_text("up\n")
    port = servers.free_port()
    httpd = _as_pid_1(root, ["httpd", "-f", "-p", f"127.0.0.1:{port}", "-h", "/www"])
    try:
        servers.wait_port(port)
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "up\n"
    finally:
        httpd.kill()
        httpd.wait()


def test_the_executor_and_git_images_carry_what_their_steps_run(
    registry: Registry, pushed: dict[str, str]
) -> None:
    argoexec = _members(registry, pushed[images.ARGOEXEC])
    assert argoexec["bin/argoexec"].mode == 0o755
    assert {"etc/mime.types", "etc/nsswitch.conf", "etc/ssh/ssh_known_hosts"} <= set(argoexec)
    assert _config(registry, pushed[images.ARGOEXEC])["config"]["Entrypoint"] == ["argoexec"]
    git = _members(registry, pushed[images.GIT])
    assert {"usr/bin/git", "bin/sh", "bin/mktemp", "bin/grep"} <= set(git)
    assert not [name for name in git if name.startswith("usr/share/perl")]


def test_the_tools_image_is_built_from_the_dockerfile(
    registry: Registry, pushed: dict[str, str]
) -> None:
    config = _config(registry, pushed[images.TOOLS])["config"]
    assert config["User"] == "1000:1000"
    assert config["Entrypoint"] == ["fabrique"]
    members = _members(registry, pushed[images.TOOLS])
    assert {"usr/local/bin/fabrique", "usr/local/bin/cosign", "usr/bin/git"} <= set(members)
