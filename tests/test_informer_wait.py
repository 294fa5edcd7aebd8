"""The live tier's wait for the Argo controller's informer (``Cluster.wait_templates_seen``),
on a double of the API server whose controller takes a Workflow at once but receives a
new WorkflowTemplate only a few Workflows later, as the real one can: each probe it
failed for good is followed by another, the wait ends at the first it resolved, and
every probe and the marker template are deleted, on a timeout too.

Its live counterpart is ``tests/live/test_informer.py``."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import httpx
import pytest

from .live.cluster import ARGO, PROBE_NAMESPACE, Cluster, probe_resolved

NS = f"{ARGO}/namespaces/{PROBE_NAMESPACE}"


class LaggingController:
    """The objects of the probe's namespace; the controller's informer receives each
    template only after ``lag`` Workflows have been taken (``None``: never)."""

    def __init__(self, lag: int | None) -> None:
        self.lag = lag
        self.objects: dict[str, dict[str, Any]] = {}
        self.taken = 0
        self.names = itertools.count()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST":
            body = json.loads(request.content)
            name = f"{body['metadata']['generateName']}{next(self.names)}"
            body["metadata"]["name"] = name
            self.objects[f"{path}/{name}"] = body
            return httpx.Response(201, json=body)
        if request.method == "DELETE":
            found = self.objects.pop(path, None)
            return httpx.Response(200 if found else 404, json=found or {"message": "gone"})
        found = self.objects.get(path)
        if found is None:
            return httpx.Response(404, json={"message": f"{path} not found"})
        if re.fullmatch(rf"{NS}/workflows/[^/]+", path) and "status" not in found:
            found["status"] = self.take(found["spec"]["workflowTemplateRef"]["name"])
        return httpx.Response(200, json=found)

    def take(self, template: str) -> dict[str, Any]:
        """What the controller writes in a Workflow it operates on the first time."""
        self.taken += 1
        if self.lag is None or self.taken <= self.lag:
            message = f'workflowtemplates.argoproj.io "{template}" not found'
            return {"phase": "Error", "message": message}
        spec = self.objects[f"{NS}/workflowtemplates/{template}"]["spec"]
        return {"phase": "Running", "storedWorkflowTemplateSpec": spec}


def cluster_on(controller: LaggingController) -> Cluster:
    cluster = Cluster.__new__(Cluster)  # no control plane: only its HTTP client is used
    cluster.http = httpx.Client(
        base_url="https://api.test", transport=httpx.MockTransport(controller)
    )
    return cluster


def test_the_wait_probes_again_after_each_miss_and_leaves_nothing() -> None:
    controller = LaggingController(lag=2)

    cluster_on(controller).wait_templates_seen(timeout=10)

    assert controller.taken == 3, "a new probe after each of the two misses, then none"
    assert controller.objects == {}, "every probe and the marker deleted"


def test_a_controller_that_never_sees_the_template_ends_the_wait_saying_what_it_waited_for() -> (
    None
):
    controller = LaggingController(lag=None)

    with pytest.raises(AssertionError) as late:
        cluster_on(controller).wait_templates_seen(timeout=0)

    assert re.search(
        r"after 0 s, still waiting for the Argo controller to resolve WorkflowTemplate "
        rf"{PROBE_NAMESPACE}/informer-marker-0 from its informer \(probe Workflows "
        r"\['informer-probe-1', 'informer-probe-2'\]\)",
        str(late.value),
    ), late.value
    assert controller.objects == {}


def test_a_probe_that_fails_otherwise_ends_the_wait_with_its_message() -> None:
    probe = {
        "metadata": {"name": "informer-probe-1"},
        "status": {"phase": "Failed", "message": "invalid spec: templates.wait: bad"},
    }
    with pytest.raises(AssertionError, match="informer-probe-1: Failed invalid spec"):
        probe_resolved(probe, "informer-marker-0")


def test_a_probe_the_controller_has_not_taken_yet_says_nothing() -> None:
    assert probe_resolved({"metadata": {"name": "p"}}, "t") is None
    # a miss of another template is not this one's
    other = {"metadata": {"name": "p"}, "status": {"phase": "Error", "message": '"u" not found'}}
    with pytest.raises(AssertionError):
        probe_resolved(other, "t")
