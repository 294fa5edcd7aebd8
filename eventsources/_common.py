"""What the Events kinds share: dumping hera.events models, documents, the restricted pod.

Hera's ``hera.events`` has only generated models: ``EventSource`` and ``Sensor`` lack
``apiVersion`` and ``kind``, there is no EventBus model, and a few models dump in a shape
the API rejects (``K8SResource`` as a base64 ``{value: …}``, ``Amount`` as ``{value: …}``).
Documents are therefore dumped by alias without nulls, completed here, and then checked
against the upstream schema by ``fabrique validate``.
"""

from __future__ import annotations

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
