"""Vendoring the upstream bundles, every image pinned by its multi-arch index digest.

``vendor/lock.yaml`` lists each component: its source URL and version, the sha256 of the
bundle as downloaded, the sha256 of the vendored file, and every image with its digest.

- ``fabrique vendor [--component C] [--update]`` downloads each bundle, checks it against
  the lock (``--update`` accepts a new one), finds every image it references (containers,
  initContainers, the workflow controller's executor, the JetStream images of the
  ``argo-events-controller-config``), resolves each tag to its **index** digest (refusing
  a single-arch manifest unless the lock allows it with a reason), rewrites every
  reference to ``repo:tag@sha256:…``, adds the site's pinned JetStream version to the
  Argo Events controller config, and writes ``vendor/<component>/<version>/``. Its
  ``kustomization.yaml`` applies fabrique's own settings of the component over the
  bundle: ``vendor/<component>/settings/``, a kustomize Component kept by hand (the
  workflow controller's requeue time, each setting with its reason).
- The upstream API specifications (``specs:`` in the lock: the Argo Workflows and Argo
  Events JSON Schemas, the Argo CD Application CRD, Gitea's swagger) live in
  ``vendor/specs/``, each with its URL, version and sha256; ``fabrique validate`` and the
  test doubles read them, and the wheel ships them as ``fabrique/specs``.
- ``fabrique vendor --check`` is offline: the vendored files must be what the lock says.
- ``fabrique vendor mirror --to registry:80`` copies every pinned image, all platforms,
  digests unchanged, into the internal registry, and checks them there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fabrique.clients._http import DEFAULT_TIMEOUT, Unreachable, send
from fabrique.clients.registry import RegistryClient
from fabrique.site.errors import DigestMismatch, FabriqueError, InputError, RemoteError
from fabrique.site.names import DIGEST_RE, ImageRef
from fabrique.site.retry import RetryPolicy

log = logging.getLogger("fabrique.vendor")

LOCK = "lock.yaml"
NEEDS_INTERNET = "fabrique vendor --update, with Internet access"
SPECS = "specs"
PEERS = "peers"  # the Go modules the live tier builds (tests/peers/), kept as written
BUNDLE = "bundle.yaml"
HEADER = "# Vendored by `fabrique vendor`; images pinned by index digest. Do not edit.\n"
DOCKER_HUB = "docker.io"
CONTROLLER_CONFIG = "argo-events-controller-config"
SETTINGS = "settings"  # vendor/<component>/settings: fabrique's own Component, every version
KUSTOMIZATION = "kustomization.yaml"
WORKFLOW_CONTROLLER = "workflow-controller"  # Argo Workflows' Deployment and its container


class VendorError(FabriqueError):
    """The lock, a bundle or a vendored file is not what it must be."""

    exit_code = 7


@dataclass
class Image:
    digest: str | None = None
    single_arch: str | None = None  # the reason a single-arch manifest is acceptable


@dataclass
class Component:
    name: str
    version: str
    url: str | None = None
    sha256: str | None = None
    vendored_sha256: str | None = None
    images: dict[str, Image] = field(default_factory=dict)

    @property
    def vendored(self) -> bool:
        return self.vendored_sha256 is not None or (self.url is None and bool(self.images))


@dataclass
class Spec:
    """One upstream API specification, vendored as ``vendor/specs/<file>``."""

    name: str
    version: str
    url: str
    file: str
    sha256: str | None = None
    # template placeholders the upstream file holds and the served document fills in
    substitute: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------ the lock


def _read_lock(root: Path) -> tuple[Path, dict[str, Any]]:
    path = root / LOCK
    try:
        data = yaml.safe_load(path.read_text("utf-8"))
    except FileNotFoundError:
        raise VendorError(f"{path}: not found") from None
    except yaml.YAMLError:
        raise VendorError(f"{path}: not valid YAML") from None
    return path, data if isinstance(data, dict) else {}


def load_lock(root: Path) -> dict[str, Component]:
    path, data = _read_lock(root)
    components = data.get("components")
    if not isinstance(components, dict) or not components:
        raise VendorError(f"{path}: components: must be a non-empty mapping")
    out = {}
    for name, entry in components.items():
        where = f"{path}: components.{name}"
        if not isinstance(entry, dict) or not isinstance(entry.get("version"), str):
            raise VendorError(f"{where}.version: required")
        images = {}
        for ref, image in (entry.get("images") or {}).items():
            image = image or {}
            digest = image.get("digest")
            if digest is not None and not DIGEST_RE.fullmatch(digest):
                raise VendorError(f"{where}.images.{ref}.digest: must be sha256:<64 hex>")
            images[ref] = Image(digest, image.get("singleArch"))
        out[name] = Component(
            name,
            entry["version"],
            entry.get("url"),
            entry.get("sha256"),
            entry.get("vendoredSha256"),
            images,
        )
    return out


def load_specs(root: Path) -> dict[str, Spec]:
    path, data = _read_lock(root)
    entries = data.get(SPECS)
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        raise VendorError(f"{path}: specs: must be a mapping")
    out = {}
    for name, entry in entries.items():
        where = f"{path}: specs.{name}"
        if not isinstance(entry, dict):
            raise VendorError(f"{where}: must be a mapping")
        for key in ("version", "url", "file"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise VendorError(f"{where}.{key}: required")
        if "/" in entry["file"] or entry["file"].startswith("."):
            raise VendorError(f"{where}.file: must be a plain file name")
        sha = entry.get("sha256")
        if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", str(sha)):
            raise VendorError(f"{where}.sha256: must be 64 lowercase hex")
        substitute = entry.get("substitute") or {}
        if not isinstance(substitute, dict):
            raise VendorError(f"{where}.substitute: must be a mapping")
        out[name] = Spec(
            name,
            entry["version"],
            entry["url"],
            entry["file"],
            sha,
            {str(k): str(v) for k, v in substitute.items()},
        )
    return out


def save_lock(
    root: Path, components: dict[str, Component], specs: dict[str, Spec] | None = None
) -> None:
    if specs is None:
        specs = load_specs(root) if (root / LOCK).exists() else {}
    # the live tier's peers (tests/peers/) are pinned by hand: kept as they are
    peers = _read_lock(root)[1].get(PEERS) if (root / LOCK).exists() else None
    data: dict[str, Any] = {"components": {}}
    for c in components.values():
        entry: dict[str, Any] = {"version": c.version}
        if c.url:
            entry |= {"url": c.url, "sha256": c.sha256, "vendoredSha256": c.vendored_sha256}
        entry["images"] = {
            ref: {
                k: v
                for k, v in (("digest", i.digest), ("singleArch", i.single_arch))
                if v is not None
            }
            for ref, i in sorted(c.images.items())
        }
        data["components"][c.name] = entry
    if specs:
        data[SPECS] = {
            s.name: {
                "version": s.version,
                "url": s.url,
                "file": s.file,
                "sha256": s.sha256,
                **({"substitute": s.substitute} if s.substitute else {}),
            }
            for s in specs.values()
        }
    if peers:
        data[PEERS] = peers
    text = (
        "# Upstream bundles, images and API specs, pinned. Written by `fabrique vendor --update`;\n"
        "# `fabrique vendor --check` verifies vendor/ against it, offline.\n"
        + yaml.safe_dump(data, sort_keys=False, width=120)
    )
    _write(root / LOCK, text)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, "utf-8")
    tmp.replace(path)


# --------------------------------------------------------------- finding images


def find_images(documents: list[Any]) -> list[str]:
    """Every image a bundle references, in order of first appearance."""
    found: dict[str, None] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("containers", "initContainers"):
                for container in node.get(key) or []:
                    if isinstance(container, dict) and isinstance(container.get("image"), str):
                        found.setdefault(container["image"], None)
                    for arg in (container.get("args") or []) if isinstance(container, dict) else []:
                        if isinstance(arg, str) and arg.startswith("--executor-image="):
                            found.setdefault(arg.split("=", 1)[1], None)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for doc in documents:
        walk(doc)
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            for text in (doc.get("data") or {}).values():
                for match in re.finditer(
                    r"(?m)^\s*(?:-\s*)?(?:\w*[Ii]mage|image):\s*['\"]?([^\s'\"#]+)", str(text)
                ):
                    found.setdefault(match[1], None)
    return [ref for ref in found if not ref.startswith("{{")]


def pinned(ref: str, digest: str) -> str:
    return f"{ref.split('@')[0]}@{digest}"


def rewrite(text: str, digests: dict[str, str]) -> str:
    """Every reference to an image, tag alone, becomes ``repo:tag@sha256:…``."""
    for ref, digest in sorted(digests.items(), key=lambda item: -len(item[0])):
        pattern = re.compile(r"(?<![\w./@:-])" + re.escape(ref) + r"(?![\w.@:/-])")
        text = pattern.sub(pinned(ref, digest), text)
    return text


def add_jetstream_version(documents: list[Any], version: str, images: dict[str, str]) -> None:
    """Add (or replace) a JetStream version in the Argo Events controller config, pinned.

    ``images`` maps ``nats``, ``reloader`` and ``exporter`` to pinned references."""
    for doc in documents:
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "ConfigMap"
            and doc["metadata"]["name"] == CONTROLLER_CONFIG
        ):
            data = doc.setdefault("data", {})
            key = next(iter(data), "controller-config.yaml")
            config = yaml.safe_load(data.get(key) or "") or {}
            # where the controller reads them (GlobalConfig.eventBus.jetstream.versions)
            if not isinstance(config.get("eventBus"), dict):
                config["eventBus"] = {}
            bus = config["eventBus"]
            versions = bus.setdefault("jetstream", {}).setdefault("versions", [])
            versions[:] = [v for v in versions if str(v.get("version")) != version]
            versions.append(
                {
                    "version": version,
                    "natsImage": images["nats"],
                    "metricsExporterImage": images["exporter"],
                    "configReloaderImage": images["reloader"],
                    "startCommand": "/nats-server",
                }
            )
            data[key] = yaml.safe_dump(config, sort_keys=False)
            return
    raise VendorError(
        f"the bundle has no ConfigMap {CONTROLLER_CONFIG} to add JetStream {version} to"
    )


def controller_jetstream_entries(documents: list[Any]) -> list[dict[str, Any]]:
    """The JetStream versions the Argo Events controller config of a bundle lists, each
    with the images the controller runs for it (``eventBus.jetstream.versions``)."""
    for doc in documents:
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "ConfigMap"
            and doc["metadata"]["name"] == CONTROLLER_CONFIG
        ):
            for text in (doc.get("data") or {}).values():
                config = yaml.safe_load(text or "") or {}
                jetstream = (config.get("eventBus") or {}).get("jetstream") or {}
                versions = jetstream.get("versions") or []
                return [v for v in versions if isinstance(v, dict)]
    return []


def controller_jetstream_versions(documents: list[Any]) -> list[str]:
    """The JetStream versions the Argo Events controller config of a bundle lists."""
    return [str(v.get("version")) for v in controller_jetstream_entries(documents)]


JETSTREAM_IMAGES = ("natsImage", "metricsExporterImage", "configReloaderImage")


def _pinned(entry: dict[str, Any]) -> bool:
    """The controller runs every image of this version by digest."""
    return all(DIGEST_SUFFIX.search(str(entry.get(key) or "")) for key in JETSTREAM_IMAGES)


DIGEST_SUFFIX = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class JetStreamVersions:
    """What the EventBus may ask for: ``default`` (the lock's image set) and ``listed``
    (what the vendored Argo Events controller config holds, or, before it is vendored,
    the one version ``fabrique vendor`` will add to it), and where that was read."""

    default: str
    listed: tuple[str, ...]  # the controller runs their images by digest
    source: str
    unpinned: tuple[str, ...] = ()  # listed, but their images are tags


def jetstream_versions(root: Path) -> JetStreamVersions:
    """The JetStream versions the vendored Argo Events admits, from ``root``."""
    lock = load_lock(root)
    js = lock.get("jetstream")
    if js is None:
        raise VendorError(f"{root / LOCK}: components.jetstream: required (the EventBus image set)")
    events = lock.get("argo-events")
    bundle = root / "argo-events" / events.version / BUNDLE if events else None
    if bundle is not None and bundle.is_file():
        documents = [d for d in yaml.safe_load_all(bundle.read_text("utf-8")) if d is not None]
        entries = controller_jetstream_entries(documents)
        return JetStreamVersions(
            js.version,
            tuple(str(e.get("version")) for e in entries if _pinned(e)),
            f"{bundle} ({CONTROLLER_CONFIG})",
            tuple(str(e.get("version")) for e in entries if not _pinned(e)),
        )
    # not vendored yet: vendoring adds the lock's version, pinned, and that is all we know
    return JetStreamVersions(js.version, (js.version,), f"{root / LOCK} (components.jetstream)")


# -------------------------------------------------------------- fabrique's settings


def kustomization(root: Path, name: str) -> str:
    """The ``kustomization.yaml`` written beside a component's bundle: the bundle, and
    fabrique's settings of the component (``<component>/settings``) when it has any."""
    text = f"{HEADER}resources:\n- {BUNDLE}\n"
    if (root / name / SETTINGS / KUSTOMIZATION).is_file():
        text += f"components:\n- ../{SETTINGS}\n"
    return text


def controller_settings(root: Path) -> dict[str, str]:
    """The environment fabrique sets for the Argo Workflows controller: the ``env`` of the
    ``workflow-controller`` container in the patches of ``argo-workflows/settings``, which
    every vendored version's kustomization applies."""
    folder = root / "argo-workflows" / SETTINGS
    component = yaml.safe_load((folder / KUSTOMIZATION).read_text("utf-8")) or {}
    env: dict[str, str] = {}
    for patch in component.get("patches") or []:
        path = folder / str(patch.get("path"))
        for doc in yaml.safe_load_all(path.read_text("utf-8")):
            if not isinstance(doc, dict) or doc.get("kind") != "Deployment":
                continue
            if doc["metadata"]["name"] != WORKFLOW_CONTROLLER:
                continue
            for container in doc["spec"]["template"]["spec"].get("containers") or []:
                if container.get("name") != WORKFLOW_CONTROLLER:
                    continue
                for entry in container.get("env") or []:
                    if not isinstance(entry.get("value"), str):
                        raise VendorError(
                            f"{path}: env {entry.get('name')}: needs a literal value "
                            "(the live tier's controller runs with it)"
                        )
                    env[entry["name"]] = entry["value"]
    return env


# -------------------------------------------------------------------- resolving


class Resolver:
    """Tags to index digests, one registry client per host."""

    def __init__(self, plain_http: frozenset[str], retry: RetryPolicy | None = None) -> None:
        self.plain_http = plain_http
        self.retry = retry
        self._clients: dict[str, RegistryClient] = {}

    def close(self) -> None:
        for client in self._clients.values():
            client.close()

    @staticmethod
    def locate(ref: str) -> tuple[str, str, str]:
        """(registry host, repository, tag) of a reference, Docker Hub's defaults applied."""
        parsed = ImageRef.parse(ref)
        host = parsed.host or DOCKER_HUB
        repository = parsed.repository
        if host == DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        if parsed.tag is None:
            raise InputError(f"image {ref!r}: has no tag to resolve")
        return ("registry-1.docker.io" if host == DOCKER_HUB else host), repository, parsed.tag

    def resolve(self, ref: str, image: Image) -> str:
        host, repository, tag = self.locate(ref)
        if host not in self._clients:
            self._clients[host] = RegistryClient(
                host, plain_http=host in self.plain_http, retry=self.retry
            )
        found = self._clients[host].manifest_digest(repository, tag)
        if not found.is_index and not image.single_arch:
            raise VendorError(
                f"image {ref}: {found.media_type or 'a manifest'} is not a multi-arch index; "
                "mark it `singleArch: <reason>` in vendor/lock.yaml to accept it"
            )
        return found.digest


# ------------------------------------------------------------------- vendoring


def download(url: str, retry: RetryPolicy | None = None) -> bytes:
    with httpx.Client(timeout=DEFAULT_TIMEOUT, follow_redirects=True) as client:
        try:
            response = send(client, "GET", url, retry=retry or RetryPolicy())
        except Unreachable as exc:
            raise RemoteError(f"{url}: unreachable: {exc.reason}", transient=True) from None
    if response.status_code != 200:
        raise RemoteError(f"{url}: answered HTTP {response.status_code}")
    return response.content


def vendor_component(
    root: Path,
    component: Component,
    lock: dict[str, Component],
    resolver: Resolver,
    *,
    update: bool,
    jetstream_version: str | None,
) -> list[str]:
    """Vendor one component; returns what it did, one line each."""
    lines = []
    if component.url is None:  # an image set: pins only
        for ref, image in component.images.items():
            digest = resolver.resolve(ref, image)
            if image.digest and image.digest != digest and not update:
                raise DigestMismatch(
                    f"image {ref}: the lock pins {image.digest}, the registry has {digest}; "
                    "--update to move"
                )
            image.digest = digest
            lines.append(f"{component.name}: {pinned(ref, digest)}")
        return lines
    raw = download(component.url)
    sha = hashlib.sha256(raw).hexdigest()
    if component.sha256 and component.sha256 != sha and not update:
        raise VendorError(
            f"{component.name} {component.version}: {component.url} has sha256 {sha}, "
            f"the lock says {component.sha256}; refusing it (--update to accept a new bundle)"
        )
    try:
        documents = [d for d in yaml.safe_load_all(raw.decode("utf-8")) if d is not None]
    except (UnicodeDecodeError, yaml.YAMLError):
        raise VendorError(f"{component.url}: not a YAML bundle") from None
    if component.name == "argo-events" and jetstream_version:
        js = lock.get("jetstream")
        if js is None or not all(i.digest for i in js.images.values()):
            raise VendorError(
                "argo-events needs the jetstream component pinned first (vendor it before)"
            )
        by_role = {
            (
                "reloader" if "reloader" in ref else "exporter" if "exporter" in ref else "nats"
            ): pinned(ref, str(i.digest))
            for ref, i in js.images.items()
        }
        add_jetstream_version(documents, jetstream_version, by_role)
    refs = [ref for ref in find_images(documents) if "@" not in ref]
    digests = {}
    for ref in refs:
        image = component.images.get(ref, Image())
        digests[ref] = resolver.resolve(ref, image)
        component.images[ref] = Image(digests[ref], image.single_arch)
    text = HEADER + rewrite(yaml.safe_dump_all(documents, sort_keys=False, width=1000), digests)
    out = root / component.name / component.version
    if out.exists():
        shutil.rmtree(out)
    _write(out / BUNDLE, text)
    _write(out / KUSTOMIZATION, kustomization(root, component.name))
    component.sha256 = sha
    component.vendored_sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    lines.append(
        f"{component.name} {component.version}: {len(digests)} image(s) pinned, sha256 {sha[:12]}"
    )
    return lines


def vendor_spec(root: Path, spec: Spec, *, update: bool) -> str:
    """Download one upstream spec, fill in its placeholders, check it, write it."""
    raw = download(spec.url)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VendorError(f"{spec.url}: not UTF-8 text") from None
    for placeholder, value in spec.substitute.items():
        if placeholder not in text:
            raise VendorError(f"{spec.url}: holds no {placeholder!r} to substitute")
        text = text.replace(placeholder, value)
    try:
        json.loads(text) if spec.file.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError):
        raise VendorError(
            f"{spec.url}: not a valid {spec.file.rsplit('.', 1)[-1]} document"
        ) from None
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if spec.sha256 and spec.sha256 != sha and not update:
        raise VendorError(
            f"{spec.name} {spec.version}: {spec.url} has sha256 {sha}, the lock says "
            f"{spec.sha256}; refusing it (--update to accept a new spec)"
        )
    _write(root / SPECS / spec.file, text)
    spec.sha256 = sha
    return f"{spec.name} {spec.version}: {SPECS}/{spec.file}, sha256 {sha[:12]}"


def check_specs(root: Path, component: str | None = None) -> list[str]:
    """Offline: every spec the lock lists is there, byte for byte; nothing else is.

    ``component`` checks that spec only (stray files are then not looked for)."""
    specs = load_specs(root)
    problems = []
    for spec in specs.values():
        if component is not None and spec.name != component:
            continue
        path = root / SPECS / spec.file
        if spec.sha256 is None:
            problems.append(f"{spec.name} {spec.version}: not vendored yet ({NEEDS_INTERNET})")
        elif not path.is_file():
            problems.append(f"{path}: missing (fabrique vendor --component {spec.name})")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != spec.sha256:
            problems.append(
                f"{path}: differs from the lock (edited by hand?); re-run fabrique vendor"
            )
    listed = {spec.file for spec in specs.values()}
    strays = sorted((root / SPECS).glob("*")) if (root / SPECS).is_dir() else []
    for path in strays if component is None else []:
        if path.name not in listed:
            problems.append(f"{path}: not in the lock")
    return problems


def check(root: Path, component: str | None = None) -> list[str]:
    """Offline: every vendored file is the one the lock names; every image is pinned.

    Returns the problems (empty when all is right); components never vendored are noted.
    ``component`` checks that one only (stray directories are then not looked for)."""
    lock = load_lock(root)
    pins = dict(all_pins(lock))  # a bundle may carry another component's pins (JetStream)
    problems = []
    for c in lock.values():
        if component is not None and c.name != component:
            continue
        if c.url is None:
            unpinned = [ref for ref, i in c.images.items() if not i.digest]
            if unpinned:
                problems.append(
                    f"{c.name}: not pinned yet: {', '.join(unpinned)} (fabrique vendor --update)"
                )
            continue
        bundle = root / c.name / c.version / BUNDLE
        if c.vendored_sha256 is None:
            if bundle.exists():
                problems.append(f"{bundle}: present, but the lock records no vendoredSha256")
            else:
                problems.append(f"{c.name} {c.version}: not vendored yet ({NEEDS_INTERNET})")
            continue
        if not bundle.is_file():
            problems.append(f"{bundle}: missing")
            continue
        text = bundle.read_text("utf-8")
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != c.vendored_sha256:
            problems.append(
                f"{bundle}: differs from the lock (edited by hand?); re-run fabrique vendor"
            )
        written = bundle.parent / KUSTOMIZATION
        expected = kustomization(root, c.name)
        if not written.is_file() or written.read_text("utf-8") != expected:
            applies = f" (it applies ../{SETTINGS})" if "components:" in expected else ""
            problems.append(
                f"{written}: is not the one fabrique vendor writes{applies}; re-run fabrique vendor"
            )
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
        for ref in find_images(documents):
            base = ref.split("@")[0]
            if "@" not in ref:
                problems.append(f"{bundle}: image {ref} is not pinned by digest")
            elif pins.get(base) != ref.split("@")[1]:
                problems.append(f"{bundle}: image {ref} is not the digest the lock pins")
    known = {(c.name, c.version) for c in lock.values()}
    strays = (
        sorted(p for p in root.glob("*/*") if p.is_dir() and p.name != SETTINGS)
        if component is None
        else []
    )
    for path in strays:
        if (path.parent.name, path.name) not in known:
            problems.append(f"{path}: not in the lock")
    return problems + check_specs(root, component)


def pending(problems: list[str]) -> bool:
    """True when the only problems are components not vendored yet."""
    return all("not vendored yet" in p or "not pinned yet" in p for p in problems)


def all_pins(lock: dict[str, Component]) -> Iterator[tuple[str, str]]:
    for c in lock.values():
        for ref, image in c.images.items():
            if image.digest:
                yield ref, image.digest


def mirror(
    lock: dict[str, Component], target: str, resolver: Resolver, *, plain_http_target: bool
) -> list[str]:
    """Copy every pinned image, all platforms, digests unchanged, into ``target``."""
    pins = sorted(all_pins(lock))
    if not pins:
        raise VendorError(
            f"nothing to mirror to {target}: no image of the lock is pinned yet "
            "(run fabrique vendor --update with Internet access first)"
        )
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise VendorError(
            "skopeo is not installed; it copies images with all their platforms "
            "(apt-get install skopeo)"
        )
    lines = []
    for ref, digest in pins:
        host, source_repository, tag = resolver.locate(ref)
        repository = source_repository.removeprefix("library/")
        source = f"docker://{host}/{source_repository}@{digest}"
        destination = f"docker://{target}/{repository}:{tag}"
        command = [skopeo, "copy", "--all", "--preserve-digests", "--retry-times", "3"]
        if host in resolver.plain_http:
            command.append("--src-tls-verify=false")
        if plain_http_target:
            command.append("--dest-tls-verify=false")
        with tempfile.TemporaryDirectory() as scratch:
            result = subprocess.run(
                [*command, source, destination],
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
                env={"HOME": scratch, "PATH": "/usr/bin:/bin"},
            )
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or ["failed"])[-1]
            raise RemoteError(f"mirror {ref} to {target}: {detail}")
        with RegistryClient(target, plain_http=plain_http_target) as client:
            copied = client.manifest_digest(repository, tag).digest
        if copied != digest:
            raise DigestMismatch(f"mirror {ref}: {target} holds {copied}, the lock pins {digest}")
        lines.append(f"mirrored: {target}/{repository}:{tag}@{digest}")
    return lines
