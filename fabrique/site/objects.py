"""The Kubernetes object helpers every manifest author shares: metadata with fabrique's
labels, and a ServiceAccount with exactly the Role it needs.

Low in the layers on purpose: ``pipelines``, ``eventsources``, ``netpol`` and ``render``
all import it, and it imports nothing of theirs.
"""

from __future__ import annotations

from typing import Any

from .names import LABEL_MANAGED_BY, LABEL_PART_OF

Document = dict[str, Any]


def _labels(**extra: str) -> dict[str, str]:
    return {LABEL_PART_OF: "fabrique", LABEL_MANAGED_BY: "fabrique", **extra}


def object_meta(name: str, namespace: str | None = None, **labels: str) -> dict[str, Any]:
    """``metadata`` with fabrique's labels (part-of, managed-by) and any others."""
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = _labels(**labels)
    return meta


EXECUTOR_RULE = {
    # what the Argo executor in each step pod needs to report its step
    "apiGroups": ["argoproj.io"],
    "resources": ["workflowtaskresults"],
    "verbs": ["create", "patch"],
}


def service_account(
    name: str,
    namespace: str,
    rules: list[dict[str, Any]],
    *,
    role: str | None = None,
    role_namespace: str | None = None,
) -> list[Document]:
    """A ServiceAccount, and a Role with exactly ``rules`` bound to it (in
    ``role_namespace``, which may be another namespace than the account's)."""
    role = role or name
    role_namespace = role_namespace or namespace
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(name, namespace)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_meta(role, role_namespace),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_meta(role, role_namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]
