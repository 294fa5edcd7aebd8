"""`fabrique vendor` end to end on loopback: real registries, a served bundle, a token gate."""

from __future__ import annotations

import functools
import hashlib
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fabrique.clients.registry import RegistryClient
from fabrique.gestures.vendor import controller_settings

from . import servers
from .conftest import ROOT, run_cli
from .doubles.http import QuietServer
from .doubles.proxy import FaultProxy, token_gate
from .live import controlplane
from .oci import push_image, push_index

AMD_ARM = ("amd64", "arm64")
SETTINGS = ROOT / "vendor" / "argo-workflows" / "settings"


class BundleServer:
    """Serves files from a directory over HTTP on loopback: the upstream release site."""

    def __init__(self, directory: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self._server = QuietServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def url(self, name: str) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/{name}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def upstream(tmp_path: Path) -> Iterator[BundleServer]:
    site = tmp_path / "upstream"
    site.mkdir()
    server = BundleServer(site)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def second_registry(tmp_path: Path) -> Iterator[servers.Registry]:
    root = tmp_path / "mirror"
    root.mkdir()
    with servers.registry(root) as running:
        yield running


def _bundle(reg: str, *, single: bool = False) -> str:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "workflow-controller", "namespace": "argo"},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "workflow-controller",
                                "image": f"{reg}/argoproj/workflow-controller:v4.1.2",
                                "args": [
                                    "--configmap",
                                    "workflow-controller-configmap",
                                    f"--executor-image={reg}/argoproj/argoexec:v4.1.2",
                                ],
                            }
                        ]
                    }
                }
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "argo-server", "namespace": "argo"},
            "spec": {
                "template": {
                    "spec": {
                        "initContainers": [
                            {"name": "init", "image": f"{reg}/argoproj/argocli:v4.1.2"}
                        ],
                        "containers": [
                            {"name": "argo-server", "image": f"{reg}/argoproj/argocli:v4.1.2"}
                        ],
                    }
                }
            },
        },
    ]
    if single:
        docs[1]["spec"]["template"]["spec"]["containers"].append(
            {"name": "helper", "image": f"{reg}/tools/single:v1"}
        )
    return yaml.safe_dump_all(docs, sort_keys=False)


def _events_bundle(reg: str) -> str:
    # the shape of upstream's controller-config.yaml: eventBus.jetstream.versions
    config = {
        "eventBus": {
            "jetstream": {
                "versions": [
                    {
                        "version": "latest",
                        "natsImage": f"{reg}/library/nats:latest",
                        "metricsExporterImage": f"{reg}/natsio/exporter:0.14.0",
                        "configReloaderImage": f"{reg}/natsio/reloader:0.14.0",
                        "startCommand": "/nats-server",
                    },
                ]
            },
        }
    }
    docs = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "argo-events-controller-config"},
            "data": {"controller-config.yaml": yaml.safe_dump(config)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "controller-manager"},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "c", "image": f"{reg}/argoproj/argo-events:v1.9.11"}
                        ]
                    }
                }
            },
        },
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)


def _lock(root: Path, components: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "lock.yaml").write_text(yaml.safe_dump({"components": components}, sort_keys=False))
    return root


def _vendor(root: Path, *args: str, plain: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    flags = [x for host in plain for x in ("--plain-http", host)]
    return run_cli("vendor", "--dir", str(root), *flags, *args)


@pytest.fixture()
def published(registry: servers.Registry, upstream: BundleServer, tmp_path: Path) -> dict[str, Any]:
    reg = registry.host
    digests = {
        f"{reg}/argoproj/workflow-controller:v4.1.2": push_index(
            registry.url, "argoproj/workflow-controller", "v4.1.2", AMD_ARM
        ),
        f"{reg}/argoproj/argoexec:v4.1.2": push_index(
            registry.url, "argoproj/argoexec", "v4.1.2", AMD_ARM
        ),
        f"{reg}/argoproj/argocli:v4.1.2": push_index(
            registry.url, "argoproj/argocli", "v4.1.2", AMD_ARM
        ),
    }
    single = push_image(registry.url, "tools/single", "v1")
    text = _bundle(reg)
    (tmp_path / "upstream" / "install.yaml").write_text(text)
    (tmp_path / "upstream" / "install-single.yaml").write_text(_bundle(reg, single=True))
    return {
        "digests": digests,
        "single": single,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "reg": reg,
    }


def test_vendor_pins_every_image_by_index_digest(
    tmp_path: Path, upstream: BundleServer, published: dict[str, Any]
) -> None:
    root = _lock(
        tmp_path / "vendor",
        {
            "argo-workflows": {
                "version": "v4.1.2",
                "url": upstream.url("install.yaml"),
                "sha256": None,
                "images": {},
            },
        },
    )
    result = _vendor(root, "--update", plain=(published["reg"],))
    assert result.exit_code == 0, result.stderr
    assert (
        result.stdout.strip()
        == f"argo-workflows v4.1.2: 3 image(s) pinned, sha256 {published['sha256'][:12]}"
    )
    bundle = (root / "argo-workflows" / "v4.1.2" / "bundle.yaml").read_text()
    for ref, digest in published["digests"].items():
        assert f"{ref}@{digest}" in bundle
    assert (
        f"--executor-image={published['reg']}/argoproj/argoexec:v4.1.2@{published['digests'][published['reg'] + '/argoproj/argoexec:v4.1.2']}"
        in bundle
    )
    lock = yaml.safe_load((root / "lock.yaml").read_text())["components"]["argo-workflows"]
    assert lock["sha256"] == published["sha256"]
    assert {ref: i["digest"] for ref, i in lock["images"].items()} == published["digests"]
    assert yaml.safe_load(
        (root / "argo-workflows" / "v4.1.2" / "kustomization.yaml").read_text()
    ) == {"resources": ["bundle.yaml"]}

    check = _vendor(root, "--check")
    assert check.exit_code == 0, check.stderr
    assert check.stdout.strip() == f"{root}: matches lock.yaml"


def test_a_single_arch_image_is_refused_unless_the_lock_allows_it(
    tmp_path: Path, upstream: BundleServer, published: dict[str, Any]
) -> None:
    reg = published["reg"]
    component = {"version": "v4.1.2", "url": upstream.url("install-single.yaml"), "images": {}}
    root = _lock(tmp_path / "vendor", {"argo-workflows": component})
    refused = _vendor(root, "--update", plain=(reg,))
    assert refused.exit_code == 7
    assert (
        f"image {reg}/tools/single:v1: application/vnd.oci.image.manifest.v1+json is not a multi-arch index"
        in refused.stderr
    )
    assert not (root / "argo-workflows").exists()

    component["images"] = {
        f"{reg}/tools/single:v1": {"singleArch": "an internal helper built for amd64 only"}
    }
    _lock(root, {"argo-workflows": component})
    allowed = _vendor(root, "--update", plain=(reg,))
    assert allowed.exit_code == 0, allowed.stderr
    lock = yaml.safe_load((root / "lock.yaml").read_text())["components"]["argo-workflows"][
        "images"
    ]
    assert lock[f"{reg}/tools/single:v1"] == {
        "digest": published["single"],
        "singleArch": "an internal helper built for amd64 only",
    }


def test_a_bundle_that_does_not_match_the_lock_is_refused(
    tmp_path: Path, upstream: BundleServer, published: dict[str, Any]
) -> None:
    root = _lock(
        tmp_path / "vendor",
        {
            "argo-workflows": {
                "version": "v4.1.2",
                "url": upstream.url("install.yaml"),
                "sha256": "0" * 64,
                "images": {},
            },
        },
    )
    result = _vendor(root, plain=(published["reg"],))
    assert result.exit_code == 7
    assert (
        f"has sha256 {published['sha256']}, the lock says {'0' * 64}; refusing it" in result.stderr
    )
    assert not (root / "argo-workflows").exists()


def test_check_catches_a_hand_edit(
    tmp_path: Path, upstream: BundleServer, published: dict[str, Any]
) -> None:
    root = _lock(
        tmp_path / "vendor",
        {
            "argo-workflows": {
                "version": "v4.1.2",
                "url": upstream.url("install.yaml"),
                "images": {},
            },
        },
    )
    assert _vendor(root, "--update", plain=(published["reg"],)).exit_code == 0
    bundle = root / "argo-workflows" / "v4.1.2" / "bundle.yaml"
    ref = f"{published['reg']}/argoproj/argocli:v4.1.2"
    bundle.write_text(bundle.read_text().replace(f"{ref}@{published['digests'][ref]}", ref, 1))
    result = _vendor(root, "--check")
    assert result.exit_code == 7
    assert "differs from the lock (edited by hand?)" in result.stderr
    assert f"image {ref} is not pinned by digest" in result.stderr
    (root / "stray" / "v1").mkdir(parents=True)
    assert f"{root}/stray/v1: not in the lock" in _vendor(root, "--check").stderr


def _with_settings(root: Path) -> Path:
    """``root`` holding fabrique's own settings of Argo Workflows, as vendor/ does."""
    shutil.copytree(SETTINGS, root / "argo-workflows" / "settings")
    return root


def test_the_vendored_kustomization_applies_fabriques_controller_settings(
    tmp_path: Path, upstream: BundleServer, published: dict[str, Any], kubectl: Path
) -> None:
    root = _with_settings(
        _lock(
            tmp_path / "vendor",
            {"argo-workflows": {"version": "v4.1.2", "url": upstream.url("install.yaml")}},
        )
    )
    assert _vendor(root, "--update", plain=(published["reg"],)).exit_code == 0
    out = root / "argo-workflows" / "v4.1.2"
    assert yaml.safe_load((out / "kustomization.yaml").read_text()) == {
        "resources": ["bundle.yaml"],
        "components": ["../settings"],
    }
    rendered = subprocess.run(
        [kubectl, "kustomize", str(out)], capture_output=True, text=True, check=True
    )
    (controller,) = [
        c
        for d in yaml.safe_load_all(rendered.stdout)
        if d["metadata"]["name"] == "workflow-controller"
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    env = {e["name"]: e["value"] for e in controller["env"]}
    assert env == controller_settings(root) == {"DEFAULT_REQUEUE_TIME": "2s"}
    checked = _vendor(root, "--check")
    assert checked.exit_code == 0, checked.stderr

    # a version vendored without the settings installs upstream's defaults: check says so
    (out / "kustomization.yaml").write_text("resources:\n- bundle.yaml\n")
    checked = _vendor(root, "--check")
    assert checked.exit_code == 7
    assert (
        f"{out}/kustomization.yaml: is not the one fabrique vendor writes "
        "(it applies ../settings); re-run fabrique vendor"
    ) in checked.stderr


def test_the_live_plane_runs_the_controller_with_fabriques_settings() -> None:
    """The plane's controller environment holds what the install sets, value for value;
    what it adds is its own (kwok's nodes, the fault benches) and sets nothing the
    install sets."""
    installed = controller_settings(ROOT / "vendor")
    assert installed, "vendor/argo-workflows/settings sets the controller's environment"
    for real_node in (True, False):
        env = controlplane.controller_env(real_node=real_node)
        assert {k: env.get(k) for k in installed} == installed
        assert set(env) - set(installed) <= set(controlplane.PLANE_ONLY)
    assert not set(controlplane.PLANE_ONLY) & set(installed)


def test_mirror_copies_every_platform_with_the_same_digests(
    tmp_path: Path,
    upstream: BundleServer,
    published: dict[str, Any],
    second_registry: servers.Registry,
) -> None:
    reg = published["reg"]
    root = _lock(
        tmp_path / "vendor",
        {
            "argo-workflows": {
                "version": "v4.1.2",
                "url": upstream.url("install.yaml"),
                "images": {},
            },
        },
    )
    assert _vendor(root, "--update", plain=(reg,)).exit_code == 0
    result = run_cli(
        "vendor",
        "--dir",
        str(root),
        "--plain-http",
        reg,
        "--plain-http",
        second_registry.host,
        "mirror",
        "--to",
        second_registry.host,
    )
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3
    with RegistryClient(second_registry.host, plain_http=True) as mirror:
        for ref, digest in published["digests"].items():
            repository, tag = ref.split("/", 1)[1].split(":")
            found = mirror.manifest_digest(repository, tag)
            assert found.digest == digest and found.is_index
            index = httpx.get(
                f"{second_registry.url}/v2/{repository}/manifests/{digest}",
                headers={"Accept": "application/vnd.oci.image.index.v1+json"},
            ).json()
            platforms = []
            for child in index["manifests"]:  # every platform came along, by digest
                assert mirror.manifest_digest(repository, child["digest"]).digest == child["digest"]
                platforms.append(child["platform"]["architecture"])
            assert sorted(platforms) == ["amd64", "arm64"]


def test_the_anonymous_token_flow_of_public_registries(
    tmp_path: Path, upstream: BundleServer, registry: servers.Registry
) -> None:
    digest = push_index(registry.url, "argoproj/gated", "v1", AMD_ARM)
    gate, scopes = token_gate("anon-token-7c2a")
    proxy = FaultProxy(registry.url, gate).start()
    try:
        component = {"version": "1", "images": {f"{proxy.host}/argoproj/gated:v1": {}}}
        root = _lock(tmp_path / "vendor", {"jetstream": component})
        result = _vendor(root, "--update", plain=(proxy.host,))
    finally:
        proxy.stop()
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"jetstream: {proxy.host}/argoproj/gated:v1@{digest}"
    assert scopes == ["repository:argoproj/gated:pull"]


def test_argo_events_gets_the_pinned_jetstream_version(
    tmp_path: Path, upstream: BundleServer, registry: servers.Registry
) -> None:
    reg = registry.host
    pins = {
        f"{reg}/library/nats:2.10.10": push_index(registry.url, "library/nats", "2.10.10", AMD_ARM),
        f"{reg}/natsio/reloader:0.14.0": push_index(
            registry.url, "natsio/reloader", "0.14.0", AMD_ARM
        ),
        f"{reg}/natsio/exporter:0.14.0": push_index(
            registry.url, "natsio/exporter", "0.14.0", AMD_ARM
        ),
    }
    for name, tag in (("library/nats", "latest"), ("argoproj/argo-events", "v1.9.11")):
        push_index(registry.url, name, tag, AMD_ARM)
    (tmp_path / "upstream" / "events.yaml").write_text(_events_bundle(reg))
    root = _lock(
        tmp_path / "vendor",
        {
            "jetstream": {"version": "2.10.10", "images": {ref: {} for ref in pins}},
            "argo-events": {"version": "v1.9.11", "url": upstream.url("events.yaml"), "images": {}},
        },
    )
    result = _vendor(root, "--update", plain=(reg,))
    assert result.exit_code == 0, result.stderr
    docs = list(yaml.safe_load_all((root / "argo-events" / "v1.9.11" / "bundle.yaml").read_text()))
    config = yaml.safe_load(docs[0]["data"]["controller-config.yaml"])
    versions = config["eventBus"]["jetstream"]["versions"]
    assert "jetstream" not in config, "where the controller reads them, nowhere else"
    entry = next(v for v in versions if v["version"] == "2.10.10")
    assert entry["natsImage"] == f"{reg}/library/nats:2.10.10@{pins[reg + '/library/nats:2.10.10']}"
    assert entry["configReloaderImage"].endswith(pins[f"{reg}/natsio/reloader:0.14.0"])
    assert entry["metricsExporterImage"].endswith(pins[f"{reg}/natsio/exporter:0.14.0"])
    assert [v["version"] for v in versions] == ["latest", "2.10.10"]
    assert all("@sha256:" in v["natsImage"] for v in versions), "every version pinned"
    checked = _vendor(root, "--check")
    assert checked.exit_code == 0, checked.stderr


def test_the_committed_vendor_dir_matches_its_lock() -> None:
    result = run_cli("vendor", "--dir", str(ROOT / "vendor"), "--check")
    assert result.exit_code == 0, result.stderr
    assert "notice: argo-workflows v4.1.2: not vendored yet" in result.stderr
    assert not [p for p in (ROOT / "vendor").rglob("bundle.yaml")], "no fake bundle in vendor/"


def test_an_unknown_component(tmp_path: Path) -> None:
    root = _lock(tmp_path / "vendor", {"jetstream": {"version": "1", "images": {"nats:1": {}}}})
    result = _vendor(root, "--component", "nope")
    assert result.exit_code == 2
    assert "--component 'nope': not in" in result.stderr


# ----------------------------------------------------------------- the upstream specs

TEMPLATE = '{"swagger": "2.0", "info": {"version": "{{.SwaggerAppVer}}"}, "basePath": "{{.SwaggerAppSubUrl}}/api/v1"}'
SERVED = '{"swagger": "2.0", "info": {"version": "1.27.1"}, "basePath": "/api/v1"}'


def _spec_lock(root: Path, url: str, sha256: str | None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {
        "version": "1.27.1",
        "url": url,
        "file": "gitea-1.27.1.swagger.json",
        "sha256": sha256,
        "substitute": {"{{.SwaggerAppVer}}": "1.27.1", "{{.SwaggerAppSubUrl}}": ""},
    }
    lock = {
        "components": {
            "jetstream": {"version": "1", "images": {"nats:1": {"digest": "sha256:" + "a" * 64}}}
        },
        "specs": {"gitea-swagger": entry},
    }
    (root / "lock.yaml").write_text(yaml.safe_dump(lock, sort_keys=False))
    return root


def test_a_spec_is_vendored_as_served_and_pinned_by_sha256(
    tmp_path: Path, upstream: BundleServer
) -> None:
    (tmp_path / "upstream" / "v1_json.tmpl").write_text(TEMPLATE)
    root = _spec_lock(tmp_path / "vendor", upstream.url("v1_json.tmpl"), None)
    result = _vendor(root, "--component", "gitea-swagger")
    assert result.exit_code == 0, result.stderr
    sha = hashlib.sha256(SERVED.encode()).hexdigest()
    assert (
        f"gitea-swagger 1.27.1: specs/gitea-1.27.1.swagger.json, sha256 {sha[:12]}" in result.stdout
    )
    assert (root / "specs" / "gitea-1.27.1.swagger.json").read_text() == SERVED
    lock = yaml.safe_load((root / "lock.yaml").read_text())
    assert lock["specs"]["gitea-swagger"]["sha256"] == sha
    assert lock["components"]["jetstream"]["images"]["nats:1"]["digest"] == "sha256:" + "a" * 64
    assert _vendor(root, "--check").exit_code == 0


def test_a_spec_that_changed_upstream_is_refused_without_update(
    tmp_path: Path, upstream: BundleServer
) -> None:
    (tmp_path / "upstream" / "v1_json.tmpl").write_text(TEMPLATE)
    root = _spec_lock(tmp_path / "vendor", upstream.url("v1_json.tmpl"), "0" * 64)
    result = _vendor(root, "--component", "gitea-swagger")
    assert result.exit_code == 7
    assert f"the lock says {'0' * 64}; refusing it (--update to accept a new spec)" in result.stderr
    assert not (root / "specs").exists()
    assert _vendor(root, "--component", "gitea-swagger", "--update").exit_code == 0
    assert (root / "specs" / "gitea-1.27.1.swagger.json").read_text() == SERVED


def test_a_spec_without_its_placeholders_is_refused(tmp_path: Path, upstream: BundleServer) -> None:
    (tmp_path / "upstream" / "v1_json.tmpl").write_text(SERVED)
    root = _spec_lock(tmp_path / "vendor", upstream.url("v1_json.tmpl"), None)
    result = _vendor(root, "--component", "gitea-swagger")
    assert result.exit_code == 7
    assert "holds no '{{.SwaggerAppVer}}' to substitute" in result.stderr


def test_check_catches_an_edited_missing_or_unlisted_spec(tmp_path: Path) -> None:
    root = _spec_lock(
        tmp_path / "vendor", "http://127.0.0.1:9/x", hashlib.sha256(SERVED.encode()).hexdigest()
    )
    spec = root / "specs" / "gitea-1.27.1.swagger.json"
    spec.parent.mkdir()
    spec.write_text(SERVED)
    assert _vendor(root, "--check").exit_code == 0
    spec.write_text(SERVED.replace("/api/v1", "/api/v2"))
    edited = _vendor(root, "--check")
    assert edited.exit_code == 7
    assert f"{spec}: differs from the lock (edited by hand?)" in edited.stderr
    spec.unlink()
    assert (
        f"{spec}: missing (fabrique vendor --component gitea-swagger)"
        in _vendor(root, "--check").stderr
    )
    (root / "specs" / "stray.json").write_text("{}")
    assert f"{root}/specs/stray.json: not in the lock" in _vendor(root, "--check").stderr


def test_the_committed_specs_are_the_ones_fabrique_reads() -> None:
    from fabrique.gestures.vendor import load_specs
    from fabrique.validate import SPEC_FILES, find_specs

    specs = load_specs(ROOT / "vendor")
    assert sorted(s.file for s in specs.values()) == sorted(SPEC_FILES)
    for spec in specs.values():
        assert (
            hashlib.sha256((ROOT / "vendor" / "specs" / spec.file).read_bytes()).hexdigest()
            == spec.sha256
        )
        assert spec.url.startswith("https://"), spec.name
    assert find_specs() == (ROOT / "vendor" / "specs").resolve()


def test_writing_the_lock_keeps_the_live_tiers_peers(tmp_path: Path) -> None:
    """`fabrique vendor --update` rewrites the lock from what it knows: the peers section
    (tests/peers/, pinned by hand) is none of its business and must stay as written."""
    from fabrique.gestures.vendor import load_lock, save_lock

    peers = {"kubernetes": {"module": "k8s.io/kubernetes", "version": "v1.37.2"}}
    (tmp_path / "lock.yaml").write_text(
        yaml.safe_dump({"components": {"jetstream": {"version": "2.10.29"}}, "peers": peers})
    )
    save_lock(tmp_path, load_lock(tmp_path))
    assert yaml.safe_load((tmp_path / "lock.yaml").read_text())["peers"] == peers
