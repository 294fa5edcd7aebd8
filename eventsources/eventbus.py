"""EventBus ``default``: NATS JetStream, persisted, with a bounded retention.

With one replica a NATS restart can still lose an event in flight (and Gitea does not
retry a failed delivery): the reconcile CronWorkflow is the safety net for that.
"""

from __future__ import annotations

from typing import Any

from fabrique.site.config import Site
from fabrique.site.names import EVENT_BUS

from ._common import document, restricted_container, restricted_pod


def event_bus(site: Site, version: str) -> dict[str, Any]:
    """The EventBus at JetStream ``version`` (see ``fabrique.render.jetstream_version``)."""
    jetstream = site.events.jetstream
    persistence: dict[str, Any] = {
        "accessMode": "ReadWriteOnce",
        "volumeSize": jetstream.storage_size,
    }
    if jetstream.storage_class_name:
        persistence["storageClassName"] = jetstream.storage_class_name
    # NATS writes its pid and state next to its config: a read-only root is not assumed
    container = {"securityContext": restricted_container(read_only_root=False)}
    spec = {
        "jetstream": {
            "version": version,
            "replicas": jetstream.replicas,
            "persistence": persistence,
            # merged by the controller into its defaults; stream replicas follow the bus
            "streamConfig": f"maxAge: {jetstream.max_age}\nreplicas: {jetstream.replicas}\n",
            "securityContext": restricted_pod(),
            "containerTemplate": container,
            "reloaderContainerTemplate": container,
            "metricsContainerTemplate": container,
        }
    }
    return document("EventBus", EVENT_BUS, site.namespaces.control, spec)
