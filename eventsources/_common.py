"""What the Events kinds share: dumping hera.events models, documents, the restricted pod.

Hera's ``hera.events`` has only generated models: ``EventSource`` and ``Sensor`` lack
``apiVersion`` and ``kind``, there is no EventBus model, and a few models dump in a shape
the API rejects (``K8SResource`` as a base64 ``{value: …}``, ``Amount`` as ``{value: …}``).
Documents are therefore dumped by alias without nulls, completed here, and then checked
against the upstream schema by ``fabrique validate``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pydantic import BaseModel

from fabrique.site.objects import object_meta

API_VERSION = "argoproj.io/v1alpha1"


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def document(kind: str, name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": object_meta(name, namespace),
        "spec": spec,
    }


# Linux's limit on one environment variable ("NAME=value" and its NUL: MAX_ARG_STRLEN,
# 32 pages of 4 KiB). The Argo Events controller hands its pod the whole EventSource or
# Sensor as one variable, base64 JSON of its name, namespace and spec (SENSOR_OBJECT,
# EVENTSOURCE_OBJECT; pkg/reconciler/*/resource.go): over it, the container does not
# start, "argument list too long" (argo-events#2146). For a Sensor that is about 96 KiB
# of JSON, far below etcd's 1.5 MiB.
POD_ENV_LIMIT = 32 * 4096
POD_ENV = {"Sensor": "SENSOR_OBJECT", "EventSource": "EVENTSOURCE_OBJECT"}
# What Go's encoding/json writes beside the fields fabrique sets: zero values it does not
# omit (creationTimestamp, status, loggingFields, the container's resources: 98 bytes for
# the Sensor; tests/live/test_events.py compares with the controller's own), rounded up
GO_ZERO_FIELDS = 128


def pod_env_size(doc: dict[str, Any]) -> int:
    """The bytes of the variable that hands ``doc`` (a Sensor or an EventSource) to its
    pod: ``NAME=`` and the base64 JSON of its name, namespace and spec, and a NUL; at
    most ``GO_ZERO_FIELDS`` of JSON above what the controller makes."""
    meta = doc.get("metadata") or {}
    handed = {
        "metadata": {"name": meta.get("name", ""), "namespace": meta.get("namespace", "")},
        "spec": doc["spec"],
    }
    raw = json.dumps(handed, separators=(",", ":"), ensure_ascii=False).encode()
    encoded = len(base64.b64encode(raw + b" " * GO_ZERO_FIELDS))
    return len(POD_ENV[doc["kind"]]) + 1 + encoded + 1


def restricted_pod() -> dict[str, Any]:
    """Pod securityContext that Pod Security ``restricted`` admits."""
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_container(*, read_only_root: bool = True) -> dict[str, Any]:
    """Container securityContext that Pod Security ``restricted`` admits."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
    }
