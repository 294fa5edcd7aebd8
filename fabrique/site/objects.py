"""The Kubernetes object helpers every manifest author shares: metadata with fabrique's
labels, a ServiceAccount with exactly the Role it needs, and where each kind render
makes is listed in the API (``RESOURCES``).

Low in the layers on purpose: ``pipelines``, ``eventsources``, ``netpol`` and ``render``
all import it, and it imports nothing of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
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


# The label the rendered tree's kustomization puts on every object it holds, and on no
# other: the reconciler's memory and the builds' Workflows carry fabrique's labels too,
# so this one, not those, selects what a prune may delete (docs/operate/deploy.md).
RENDERED_LABEL = "fabrique.io/rendered"
RENDERED = f"{RENDERED_LABEL}=true"


@dataclass(frozen=True)
class Resource:
    """Where the API lists a kind: its group/version and its resource (plural) name."""

    api_version: str
    plural: str


# every kind render makes (tests/test_render.py holds the table to the tree)
RESOURCES = {
    "Namespace": Resource("v1", "namespaces"),
    "ConfigMap": Resource("v1", "configmaps"),
    "Secret": Resource("v1", "secrets"),
    "ServiceAccount": Resource("v1", "serviceaccounts"),
    "Role": Resource("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Resource("rbac.authorization.k8s.io/v1", "rolebindings"),
    "NetworkPolicy": Resource("networking.k8s.io/v1", "networkpolicies"),
    "ValidatingAdmissionPolicy": Resource(
        "admissionregistration.k8s.io/v1", "validatingadmissionpolicies"
    ),
    "ValidatingAdmissionPolicyBinding": Resource(
        "admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings"
    ),
    "WorkflowTemplate": Resource("argoproj.io/v1alpha1", "workflowtemplates"),
    "CronWorkflow": Resource("argoproj.io/v1alpha1", "cronworkflows"),
    "EventBus": Resource("argoproj.io/v1alpha1", "eventbus"),
    "EventSource": Resource("argoproj.io/v1alpha1", "eventsources"),
    "Sensor": Resource("argoproj.io/v1alpha1", "sensors"),
}
