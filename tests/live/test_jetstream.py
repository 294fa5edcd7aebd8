"""The EventBus's JetStream: what fabrique accepts and pins is what the Argo Events
controller of the pinned version admits, read from that very module (its install
bundle's ``argo-events-controller-config``), not from a copy written here."""

from __future__ import annotations

from typing import Any

import yaml

from fabrique.gestures.vendor import (
    CONTROLLER_CONFIG,
    controller_jetstream_versions,
    jetstream_versions,
    load_lock,
)
from fabrique.render import vendor_root

from .controlplane import EVENTS_MODULE, module_dir
from .fixtures import need_go


def upstream_bundle(version: str) -> list[Any]:
    need_go()
    bundle = module_dir(EVENTS_MODULE, version) / "manifests/install.yaml"
    return [d for d in yaml.safe_load_all(bundle.read_text("utf-8")) if d is not None]


def upstream_entries(documents: list[Any]) -> dict[str, dict[str, Any]]:
    config = next(
        d
        for d in documents
        if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == CONTROLLER_CONFIG
    )
    (text,) = config["data"].values()
    versions = yaml.safe_load(text)["eventBus"]["jetstream"]["versions"]
    return {str(v["version"]): v for v in versions}


def test_every_jetstream_version_fabrique_accepts_is_one_the_controller_admits() -> None:
    lock = load_lock(vendor_root())
    events = lock.get("argo-events")
    assert events is not None
    documents = upstream_bundle(events.version)
    admitted = controller_jetstream_versions(documents)
    assert admitted == list(upstream_entries(documents))  # fabrique reads it as upstream lays it
    accepted = jetstream_versions(vendor_root())
    assert set(accepted.listed) <= set(admitted), (accepted.listed, admitted)
    assert accepted.default in admitted


def test_the_pinned_image_set_is_the_controllers_for_that_version() -> None:
    """The lock pins (by digest) the three images the controller runs for the version:
    a version whose images the controller would take from elsewhere is no pin."""
    lock = load_lock(vendor_root())
    events, jetstream = lock.get("argo-events"), lock.get("jetstream")
    assert events is not None and jetstream is not None
    entry = upstream_entries(upstream_bundle(events.version))[jetstream.version]
    wanted = {entry["natsImage"], entry["metricsExporterImage"], entry["configReloaderImage"]}
    assert set(jetstream.images) == wanted
