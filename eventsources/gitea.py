"""EventSource ``gitea``: the webhook endpoint Gitea's webhook #2 posts pushes to."""

from __future__ import annotations

from typing import Any

from hera.events.models import Service, Template, WebhookContext
from hera.events.models.io.k8s.api.core.v1 import SecretKeySelector, ServicePort
from hera.events.models.io.k8s.apimachinery.pkg.util.intstr import IntOrString

from fabrique.site.config import Site
from fabrique.site.names import (
    EVENT_BUS,
    EVENT_NAME,
    EVENT_SOURCE,
    WEBHOOK_ENDPOINT,
    WEBHOOK_PORT,
    webhook_service_url,
)

from ._common import document, dump, restricted_container, restricted_pod


def event_source(site: Site) -> dict[str, Any]:
    # hera nests these fields under ``webhook_context`` (Go's inline struct): the
    # WebhookContext model dumps them flat, as the API has them.
    webhook = WebhookContext(
        url=webhook_service_url(site.namespaces.control).removesuffix(WEBHOOK_ENDPOINT),
        port=str(WEBHOOK_PORT),
        endpoint=WEBHOOK_ENDPOINT,
        method="POST",
        # Gitea (>= 1.19) sends this token as "Authorization: Bearer <token>".
        auth_secret=SecretKeySelector(
            name=site.events.webhook_secret.name, key=site.events.webhook_secret.key
        ),
    )
    service = Service(
        ports=[
            ServicePort(name="webhook", port=WEBHOOK_PORT, target_port=IntOrString(WEBHOOK_PORT))
        ]
    )
    template = dump(Template())
    template["securityContext"] = restricted_pod()
    template["container"] = {"securityContext": restricted_container()}
    spec = {
        "eventBusName": EVENT_BUS,
        "template": template,
        "service": dump(service),  # a ClusterIP Service: <name>-eventsource-svc
        # an int64 that hera types as a string; the API wants the number
        "webhook": {EVENT_NAME: dump(webhook) | {"maxPayloadSize": site.events.max_payload_size}},
    }
    return document("EventSource", EVENT_SOURCE, site.namespaces.control, spec)
