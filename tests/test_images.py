"""The real node's image writer (``live/images.py``) without Debian or the Go peers: the
names it pushes are those the templates run, a layer keeps owners, modes and binary
xattrs and is the same bytes every time, a layout is pushed once with its own digest,
and the cache makes an image once."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import uuid
from pathlib import Path

import pytest

from fabrique.site.config import load_site

from .live import images
from .manifests import rendered_step
from .servers import Registry


def test_the_images_are_those_the_templates_run() -> None:
    site = load_site(env={})
    assert images.qualified(rendered_step(site, "build")["image"]) == images.BUILDKIT
    assert images.qualified(rendered_step(site, "checkout")["image"]) == images.GIT
    assert images.qualified(rendered_step(site, "plan")["image"]) == images.TOOLS
    assert images.ARGOEXEC == f"quay.io/argoproj/argoexec:{images.ARGO_VERSION}"


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("moby/buildkit:v0.32.2-rootless", "moby/buildkit:v0.32.2-rootless"),
        ("docker.io/moby/buildkit:v0.32.2-rootless", "moby/buildkit:v0.32.2-rootless"),
        ("quay.io/argoproj/argoexec:v4.0.5", "argoproj/argoexec:v4.0.5"),
        ("registry:80/fabrique-tools:0.1.0", "fabrique-tools:0.1.0"),
        ("busybox", "library/busybox:latest"),
    ],
)
def test_a_name_is_found_where_the_nodes_mirrors_look(name: str, path: str) -> None:
    assert images.mirrored(name) == path


def test_a_host_the_node_does_not_mirror_is_refused() -> None:
    with pytest.raises(images.ImageError, match=r"ghcr\.io/sigstore/cosign.*mirrors only"):
        images.mirrored("ghcr.io/sigstore/cosign/cosign:v2.4.1")


def test_the_file_capabilities_are_what_setcap_writes() -> None:
    """``setcap cap_setuid+ep`` and ``cap_setgid+ep`` wrote these on Debian 12 (libcap2
    2.66), read back with getfattr: vfs_cap_data revision 2, effective, one permitted bit."""
    assert images.file_capability(images.CAP_SETUID).hex() == "01000002" + "80" + "0" * 30
    assert images.file_capability(images.CAP_SETGID).hex() == "01000002" + "40" + "0" * 30


def _tree(folder: Path) -> images.Tree:
    binary = folder / "program"
    binary.write_bytes(b"\x7fELF not really\n")
    tree = images.Tree()
    tree.file("usr/bin/newuidmap", binary, 0o755)
    tree.xattrs("usr/bin/newuidmap", {"security.capability": images.file_capability(7)})
    tree.file("usr/bin/newgidmap", b"gid\n", 0o755)
    tree.xattrs("usr/bin/newgidmap", {"security.capability": images.file_capability(6)})
    tree.dir("home/user", owner=(1000, 1000))
    tree.dir("tmp", 0o1777)
    tree.symlink("usr/bin/buildkit-runc", "/usr/sbin/runc")
    link = tarfile.TarInfo("usr/bin/a-link")  # sorts before what it links to
    link.type, link.linkname = tarfile.LNKTYPE, "usr/bin/newgidmap"
    tree._put(link)
    return tree


def _members(layer: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        return tar.getmembers()


def test_a_layer_keeps_owners_modes_and_capabilities_and_is_the_same_each_time(
    tmp_path: Path,
) -> None:
    written = []
    for attempt in ("one", "two"):
        blobs = tmp_path / attempt
        with _tree(tmp_path) as tree:
            diff_id, descriptor = tree.write(blobs)
        layer = (blobs / descriptor["digest"].removeprefix("sha256:")).read_bytes()
        assert descriptor["size"] == len(layer)
        assert diff_id == "sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest()
        written.append(descriptor["digest"])
    assert written[0] == written[1]
    members = {m.name: m for m in _members(layer)}
    assert all(m.mtime == 0 for m in members.values())
    assert [m.name for m in members.values()][-1] == "usr/bin/a-link"
    for program, capability in (("newuidmap", 7), ("newgidmap", 6)):
        member = members[f"usr/bin/{program}"]
        assert member.mode == 0o755  # no setuid: the capability instead
        raw = member.pax_headers["SCHILY.xattr.security.capability"]
        assert raw.encode("utf-8", "surrogateescape") == images.file_capability(capability)
    assert (members["home/user"].uid, members["home/user"].gid) == (1000, 1000)
    assert members["tmp"].mode == 0o1777
    assert members["usr/bin/buildkit-runc"].linkname == "/usr/sbin/runc"
    assert members["usr"].isdir()  # parents made as the files went in


def test_a_layout_is_pushed_once_under_its_mirrored_name_with_its_digest(
    tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = f"fabrique-test/node-{uuid.uuid4().hex[:8]}"
    name = f"docker.io/{repository}:v1"
    with _tree(tmp_path) as tree:
        digest = images.write_layout(tmp_path / "layout", "v1", tree, {"Entrypoint": ["x"]})
    made = images.Made(name, tmp_path / "layout")
    assert made.digest == digest
    assert images.push(made, registry.host) == f"{registry.host}/{repository}@{digest}"
    assert images.registry_digest(registry.host, name) == digest
    # there already: no skopeo needed
    monkeypatch.setattr(images.shutil, "which", lambda _: None)
    assert images.push(made, registry.host).endswith(digest)
    index = json.loads((tmp_path / "layout/index.json").read_text())
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "v1"


def test_an_image_is_made_once_per_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FABRIQUE_IMAGES_CACHE", str(tmp_path))
    made: list[Path] = []

    def make(folder: Path) -> None:
        made.append(folder)
        (folder / "index.json").write_text("{}")

    first = images._cached("thing-1", "k1", make)
    assert images._cached("thing-1", "k1", make) == first
    assert (first / "index.json").exists() and len(made) == 1
    assert images._cached("thing-1", "k2", make) != first
    assert len(made) == 2
