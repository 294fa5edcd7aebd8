"""Least privilege, as the real RBAC authorizer decides it: for each ServiceAccount of
the tree, what fabrique's own code does in that role is allowed, and what it must not
do is denied (SubjectAccessReview), then the same through a real token of the account."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.site.config import load_site

from .. import payloads
from .cluster import ARGO, Cluster
from .controlplane import render
from .test_workflows import sensor_workflow

BUILD, CONTROL = "fabrique-build", "fabrique"
G = "argoproj.io"


def sa(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


EXECUTOR_BUILD = sa(BUILD, "fabrique-executor")
EXECUTOR_CONTROL = sa(CONTROL, "fabrique-executor")
BUILDER = sa(BUILD, "fabrique-build")
SENSOR = sa(CONTROL, "fabrique-sensor")
RECONCILER = sa(CONTROL, "fabrique-reconciler")
PLANNER = sa(CONTROL, "fabrique-planner")
MIRROR = sa(CONTROL, "fabrique-mirror-sync")

ALLOWED = [
    # the executor reports each step's outputs, in both namespaces
    (EXECUTOR_BUILD, "create", "workflowtaskresults", BUILD, G),
    (EXECUTOR_BUILD, "patch", "workflowtaskresults", BUILD, G),
    (EXECUTOR_CONTROL, "create", "workflowtaskresults", CONTROL, G),
    # the Sensor creates push Workflows, and finds a redelivered push's (get, a patch
    # that admission lets through only when it changes nothing)
    (SENSOR, "create", "workflows", CONTROL, G),
    (SENSOR, "get", "workflows", CONTROL, G),
    (SENSOR, "patch", "workflows", CONTROL, G),
    # a push's step creates its builds; its write-back lists those that meet there
    (PLANNER, "create", "workflows", BUILD, G),
    (PLANNER, "list", "workflows", BUILD, G),
    # the reconciler reads and creates build Workflows, and keeps its memory
    (RECONCILER, "create", "workflows", BUILD, G),
    (RECONCILER, "get", "workflows", BUILD, G),
    (RECONCILER, "list", "workflows", BUILD, G),
    (RECONCILER, "get", "workflowtemplates", BUILD, G),
    (RECONCILER, "create", "configmaps", CONTROL, ""),
]

DENIED = [
    # the build's executor can neither start builds nor read secrets
    (EXECUTOR_BUILD, "create", "workflows", BUILD, G),
    (EXECUTOR_BUILD, "get", "secrets", BUILD, ""),
    (EXECUTOR_BUILD, "list", "pods", BUILD, ""),
    (EXECUTOR_CONTROL, "create", "workflows", BUILD, G),
    # the build pods' own account has no right at all
    (BUILDER, "get", "secrets", BUILD, ""),
    (BUILDER, "create", "workflows", BUILD, G),
    # the Sensor creates pushes, and only in the control namespace: no build
    (SENSOR, "get", "secrets", CONTROL, ""),
    (SENSOR, "get", "secrets", BUILD, ""),
    (SENSOR, "delete", "workflows", CONTROL, G),
    (SENSOR, "update", "workflows", CONTROL, G),
    (SENSOR, "list", "workflows", CONTROL, G),
    (SENSOR, "create", "workflows", BUILD, G),
    (SENSOR, "patch", "workflows", BUILD, G),
    # the planner creates and lists builds, nothing else: it reads none by name,
    # changes and deletes none
    (PLANNER, "get", "workflows", BUILD, G),
    (PLANNER, "patch", "workflows", BUILD, G),
    (PLANNER, "delete", "workflows", BUILD, G),
    (PLANNER, "create", "workflows", CONTROL, G),
    (PLANNER, "get", "secrets", CONTROL, ""),
    (PLANNER, "get", "secrets", BUILD, ""),
    # the reconciler deletes nothing and reads no secret
    *[
        (RECONCILER, "delete", resource, namespace, group)
        for resource, namespace, group in [
            ("workflows", BUILD, G),
            ("configmaps", CONTROL, ""),
            ("pods", BUILD, ""),
            ("workflowtemplates", BUILD, G),
        ]
    ],
    (RECONCILER, "get", "secrets", CONTROL, ""),
    (RECONCILER, "get", "secrets", BUILD, ""),
    # a build's workspace is its pod's own: no claim to look up
    (RECONCILER, "get", "persistentvolumeclaims", BUILD, ""),
    (RECONCILER, "update", "workflows", BUILD, G),
    (MIRROR, "get", "secrets", CONTROL, ""),
    (MIRROR, "create", "workflows", BUILD, G),
]


def _id(case: tuple[str, str, str, str, str]) -> str:
    user, verb, resource, namespace, _ = case
    return f"{user.rsplit(':', 2)[-1]}@{user.split(':')[2]}-{verb}-{resource}@{namespace}"


@pytest.mark.parametrize("case", ALLOWED, ids=_id)
def test_what_each_account_does_is_allowed(
    cluster: Cluster, applied: Path, case: tuple[str, str, str, str, str]
) -> None:
    user, verb, resource, namespace, group = case
    assert cluster.can(user, verb, resource, namespace, group)


@pytest.mark.parametrize("case", DENIED, ids=_id)
def test_what_each_account_must_not_do_is_denied(
    cluster: Cluster, applied: Path, case: tuple[str, str, str, str, str]
) -> None:
    user, verb, resource, namespace, group = case
    assert not cluster.can(user, verb, resource, namespace, group)


def test_the_reconcilers_memory_is_the_one_configmap_it_may_change(
    cluster: Cluster, applied: Path
) -> None:
    """resourceNames: get and update on fabrique-reconcile-memory, on no other ConfigMap."""
    memory = "fabrique-reconcile-memory"
    assert cluster.can(RECONCILER, "update", "configmaps", CONTROL, name=memory)
    assert cluster.can(RECONCILER, "get", "configmaps", CONTROL, name=memory)
    assert not cluster.can(RECONCILER, "update", "configmaps", CONTROL, name="fabrique-site")
    assert not cluster.can(RECONCILER, "list", "configmaps", CONTROL)


def test_the_sensor_creates_a_push_workflow_with_its_own_token(
    cluster: Cluster, applied: Path
) -> None:
    """Impersonation aside: a real token of the account, through the real authenticator.
    The push Workflow of its trigger (the committed Sensor's, rendered as the Sensor
    double renders it) is created (201), and read back (its trigger's patch gets it
    first); with the same token it can neither list nor delete it, create one in the
    build namespace, or read a Secret."""
    token = cluster.token(CONTROL, "fabrique-sensor")
    body = sensor_workflow(applied, payloads.revision())
    workflows = f"{ARGO}/namespaces/{CONTROL}/workflows"
    name = body["metadata"]["name"]
    created = cluster.create(workflows, body, token=token)
    try:
        assert created.status == 201, created.message
        assert created.body["metadata"]["name"] == name
        assert cluster.request("GET", f"{workflows}/{name}", token=token).status == 200
        for method, path, sent in [
            ("GET", workflows, None),
            ("DELETE", f"{workflows}/{name}", None),
            ("POST", f"{ARGO}/namespaces/{BUILD}/workflows", in_build(body)),
            ("GET", f"/api/v1/namespaces/{CONTROL}/secrets", None),
            ("GET", f"/api/v1/namespaces/{BUILD}/secrets", None),
        ]:
            answer = cluster.request(method, path, sent, token=token)
            assert answer.status == 403, (method, path, answer.status, answer.message)
            assert "system:serviceaccount:fabrique:fabrique-sensor" in answer.message
        assert cluster.exists(f"{workflows}/{name}"), "the Sensor's DELETE changed nothing"
    finally:
        cluster.request("DELETE", f"{workflows}/{name}")


def in_build(body: dict[str, Any]) -> dict[str, Any]:
    moved = copy.deepcopy(body)
    moved["metadata"]["namespace"] = BUILD
    return moved


def test_an_auto_promotion_reads_the_application_before_it_and_nothing_else(
    cluster: Cluster, applied: Path, tmp_path: Path
) -> None:
    """``promote: auto``: the reconciler may get the one Application it checks, in Argo
    CD's namespace, and no other, and list none; without it, not even that one."""
    assert not cluster.can(RECONCILER, "get", "applications", "argocd", G, name="citation")
    values = load_site(env={}).to_values()
    values["targets"] = {"bench": {"context": "bench", "inCluster": True}, **values["targets"]}
    values["apps"][0]["environments"] = [
        {"name": "bench", "target": "bench"},
        {
            "name": "prod",
            "target": "prod",
            "promote": "auto",
            "writeback": {"repo": "atlas/atlas", "path": "deploy/prod/kustomization.yaml"},
        },
    ]
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(values))
    rbac = render(tmp_path / "site.yaml", tmp_path / "tree") / "reconcile" / "rbac.yaml"
    cluster.kubectl("create", "namespace", "argocd", check=False)
    cluster.kubectl("apply", "--server-side", "--field-manager=fabrique", "-f", str(rbac))
    try:
        assert cluster.can(RECONCILER, "get", "applications", "argocd", G, name="citation")
        assert not cluster.can(RECONCILER, "get", "applications", "argocd", G, name="other")
        assert not cluster.can(RECONCILER, "list", "applications", "argocd", G)
        assert not cluster.can(RECONCILER, "update", "applications", "argocd", G, name="citation")
    finally:
        cluster.kubectl(
            "delete", "-n", "argocd", "role,rolebinding", "fabrique-reconciler-read-applications",
            check=False,
        )  # fmt: skip
