"""The real Argo controller resolves a Workflow's template from its informer: a Workflow
made at once after a new WorkflowTemplate can end in Error, ``workflowtemplates "..." not
found``, for good (seen about once in 60 tries on a plane just started). After
``Cluster.wait_templates_seen``, which ``apply_site`` calls, it finds it every time, and
the wait leaves none of its probes behind."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import ARGO, PROBE_NAMESPACE, Cluster, probe_resolved

ROUNDS = 10


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"informer-{uuid.uuid4().hex[:6]}"
    answer = cluster.create("/api/v1/namespaces", {"metadata": {"name": name}})
    assert answer.status == 201, answer.message
    yield name
    answer = cluster.request("DELETE", f"/api/v1/namespaces/{name}")
    assert answer.status in (200, 202), answer.message


def test_a_workflow_made_at_once_after_the_wait_finds_its_new_template(
    cluster: Cluster, namespace: str
) -> None:
    # each template in a namespace of its own, not the probe's: the wait holds for all
    for _ in range(ROUNDS):
        template = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "WorkflowTemplate",
            "metadata": {"generateName": "new-", "namespace": namespace},
            "spec": {"entrypoint": "wait", "templates": [{"name": "wait", "suspend": {}}]},
        }
        made = cluster.create(f"{ARGO}/namespaces/{namespace}/workflowtemplates", template)
        assert made.status == 201, made.message
        name = made.body["metadata"]["name"]

        cluster.wait_templates_seen()

        assert made_at_once(cluster, namespace, name), f"a Workflow missed its template {name}"


def made_at_once(cluster: Cluster, namespace: str, template: str) -> bool:
    """Did a Workflow made now find ``template`` in the controller's informer?"""
    body = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": f"{template}-", "namespace": namespace},
        "spec": {"workflowTemplateRef": {"name": template}},
    }
    answer = cluster.create(f"{ARGO}/namespaces/{namespace}/workflows", body)
    assert answer.status == 201, answer.message
    workflow = answer.body["metadata"]["name"]
    verdict = cluster.wait(
        f"the controller to take {namespace}/{workflow}",
        lambda: (
            (found,)
            if (found := probe_resolved(cluster.workflow(namespace, workflow), template))
            is not None
            else None
        ),
    )
    return verdict[0]


def test_the_wait_leaves_no_probe_behind(cluster: Cluster, applied: Path) -> None:
    cluster.wait_templates_seen()

    for kind in ("workflows", "workflowtemplates"):
        left = cluster.items(f"{ARGO}/namespaces/{PROBE_NAMESPACE}/{kind}")
        assert [item["metadata"]["name"] for item in left] == [], kind
