"""EventSource ``gitea``: the webhook endpoint Gitea's webhook #2 posts pushes to."""

from __future__ import annotations

from typing import Any

from fabrique.site.config import Site
from fabrique.site.names import (
    EVENT_BUS,
    EVENT_NAME,
    EVENT_SOURCE,
    WEBHOOK_ENDPOINT,
    WEBHOOK_PORT,
    webhook_service_url,
)

from ._common import document, restricted_container, restricted_pod


def event_source(site: Site) -> dict[str, Any]:
    secret = site.events.webhook_secret
    webhook = {
        # Gitea (>= 1.19) sends this token as "Authorization: Bearer <token>"
        "authSecret": {"key": secret.key, "name": secret.name},
        "endpoint": WEBHOOK_ENDPOINT,
        "method": "POST",
        # a string in the API (WebhookContext.Port)
        "port": str(WEBHOOK_PORT),
        "url": webhook_service_url(site.namespaces.control).removesuffix(WEBHOOK_ENDPOINT),
        # an int64
        "maxPayloadSize": site.events.max_payload_size,
    }
    service = {"ports": [{"name": "webhook", "port": WEBHOOK_PORT, "targetPort": WEBHOOK_PORT}]}
    template = {
        "securityContext": restricted_pod(),
        "container": {"securityContext": restricted_container()},
    }
    spec = {
        "eventBusName": EVENT_BUS,
        "template": template,
        "service": service,  # a ClusterIP Service: <name>-eventsource-svc
        "webhook": {EVENT_NAME: webhook},
    }
    return document("EventSource", EVENT_SOURCE, site.namespaces.control, spec)
