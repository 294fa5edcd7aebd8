"""What the Events kinds share: documents, the restricted pod.

The kinds are written as the API has them, plain mappings checked against the upstream
schema by ``fabrique validate`` (``vendor/specs/argo-events-*.schema.json``). Hera's
``hera.events`` has only generated models, which lack ``apiVersion`` and ``kind``, have no
EventBus, dump a few fields in a shape the API rejects (``K8SResource`` as a base64
``{value: …}``), and cost render some 0.8 s of imports for the few used.
"""

from __future__ import annotations

from typing import Any

from fabrique.site.objects import object_meta

API_VERSION = "argoproj.io/v1alpha1"


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
