"""A build Workflow deleted and submitted again under its name, judged by the real Argo
controller and the real garbage collector (issue 29 #15).

The controller names a Workflow's workspace claim ``<workflow>-workspace`` and fails a
Workflow for good when a claim of that name exists that another Workflow owns. The old
claim is deleted with its Workflow, but only once the garbage collector gets to it and
nothing holds it (the ``kubernetes.io/pvc-protection`` finalizer, while a pod of the old
build still uses it). Here a finalizer of the test's own holds it, so that the window
is as long as the test needs.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

from fabrique.clients.kube import KubeClient
from fabrique.decisions.workflow import Submission, build_workflow, submit, workspace_claim
from fabrique.site.config import load_site

from .. import payloads
from .cluster import ARGO, Cluster

BUILD_NS = "fabrique-build"
HOLD = "fabrique.test/hold"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def _body() -> dict[str, Any]:
    """A build Workflow for an app of its own: the template holds one mutex per app, and
    the Workflows other tests leave running would keep this one waiting for it."""
    app = f"live-{uuid.uuid4().hex[:6]}"
    body = build_workflow(load_site(env={}), "citation", payloads.revision(), submitted_by="cli")
    body["metadata"]["name"] = body["metadata"]["name"].replace("citation", app)
    body["metadata"]["labels"]["fabrique.io/app"] = app
    body["spec"]["arguments"]["parameters"][0] = {"name": "app", "value": app}
    return body


def _claim_path(workflow: str) -> str:
    return f"/api/v1/namespaces/{BUILD_NS}/persistentvolumeclaims/{workspace_claim(workflow)}"


def _workflow_path(workflow: str) -> str:
    return f"{ARGO}/namespaces/{BUILD_NS}/workflows/{workflow}"


def _claim_of(cluster: Cluster, workflow: str) -> dict[str, Any]:
    """The workspace claim of ``workflow`` as it is now, owned by it."""
    uid = cluster.get(_workflow_path(workflow))["metadata"]["uid"]

    def owned() -> dict[str, Any] | None:
        found = cluster.request("GET", _claim_path(workflow))
        if found.status != 200:
            return None
        owners = [o["uid"] for o in found.body["metadata"].get("ownerReferences") or []]
        return found.body if uid in owners else None

    return cluster.wait(f"the claim of {workflow}", owned, timeout=60)


def _set_finalizers(cluster: Cluster, workflow: str, finalizers: list[str]) -> None:
    answer = cluster.request(
        "PATCH",
        _claim_path(workflow),
        {"metadata": {"finalizers": finalizers}},
        content_type=MERGE,
    )
    assert answer.status == 200, answer.message


def _deleted_and_held(cluster: Cluster, workflow: str) -> dict[str, Any]:
    """Delete ``workflow`` (as an operator, or the safety net's user, does); its claim,
    held by the test's finalizer, is marked for deletion by the garbage collector and
    stays."""
    claim = _claim_of(cluster, workflow)
    _set_finalizers(cluster, workflow, [*claim["metadata"].get("finalizers", []), HOLD])
    assert cluster.request("DELETE", _workflow_path(workflow)).status == 200

    def collected() -> dict[str, Any] | None:
        found = cluster.request("GET", _claim_path(workflow))
        return found.body if found.body["metadata"].get("deletionTimestamp") else None

    held = cluster.wait(f"the claim of the deleted {workflow} marked", collected, timeout=60)
    cluster.wait(f"{workflow} gone", lambda: not cluster.exists(_workflow_path(workflow)) or None)
    return held


def _release(cluster: Cluster, workflow: str, claim: dict[str, Any]) -> None:
    """Take the test's finalizer off the claim as it is now, and nothing else: the
    controller-manager may have removed ``kubernetes.io/pvc-protection`` since ``claim``
    was read, and a claim being deleted takes no finalizer back (422). A JSON patch that
    tests the entry before removing it, after a fresh read, each time."""

    def removed() -> bool | None:
        found = cluster.request("GET", _claim_path(workflow))
        if found.status == 404:
            return True
        finalizers = found.body["metadata"].get("finalizers") or []
        if HOLD not in finalizers:
            return True
        at = f"/metadata/finalizers/{finalizers.index(HOLD)}"
        answer = cluster.request(
            "PATCH",
            _claim_path(workflow),
            [{"op": "test", "path": at, "value": HOLD}, {"op": "remove", "path": at}],
            content_type=JSON_PATCH,
        )
        return answer.status in (200, 404) or None

    cluster.wait(f"the test's finalizer off the claim of {workflow}", removed, timeout=30)


def _phase(cluster: Cluster, workflow: str) -> tuple[str, str]:
    status = cluster.get(_workflow_path(workflow)).get("status") or {}
    return str(status.get("phase") or ""), str(status.get("message") or "")


def _submitted_and_deleted(
    cluster: Cluster, kube: KubeClient
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """A build Workflow submitted, then deleted with its claim held: its body, its name
    and the held claim."""
    body = _body()
    name = body["metadata"]["name"]
    assert submit(kube, body).outcome == "created"
    return body, name, _deleted_and_held(cluster, name)


def test_a_workflow_created_while_its_old_claim_is_collected_errors_for_good(
    cluster: Cluster, applied: Path
) -> None:
    """The defect, as the controller judges it: created at once, the new Workflow meets
    the old claim and ends in Error."""
    body = _body()
    name = body["metadata"]["name"]
    kube = cluster.kube()
    assert kube.create_workflow(body).created
    held = _deleted_and_held(cluster, name)
    try:
        assert kube.create_workflow(body).created  # what submit did before it waited
        errored = cluster.wait(
            f"{name} in Error", lambda: (p := _phase(cluster, name))[0] == "Error" and p
        )
        assert "already exists with different ownerreference" in errored[1]
    finally:
        cluster.request("DELETE", _workflow_path(name))
        _release(cluster, name, held)


def test_submit_waits_for_the_old_claim_and_the_new_workflow_gets_its_own(
    cluster: Cluster, applied: Path
) -> None:
    kube = cluster.kube()
    body, name, held = _submitted_and_deleted(cluster, kube)
    outcome: list[Submission] = []
    resubmit = threading.Thread(target=lambda: outcome.append(submit(kube, body)))
    resubmit.start()
    try:
        resubmit.join(timeout=5)
        assert resubmit.is_alive(), f"submit did not wait for the old claim: {outcome}"
        assert not cluster.exists(_workflow_path(name)), "created while the old claim held"
    finally:
        _release(cluster, name, held)
        resubmit.join(timeout=90)
    assert [s.outcome for s in outcome] == ["created"]
    claim = _claim_of(cluster, name)  # the new Workflow's own
    assert not claim["metadata"].get("deletionTimestamp")
    assert _phase(cluster, name)[0] not in ("Error", "Failed"), _phase(cluster, name)
    cluster.request("DELETE", _workflow_path(name))


def test_past_its_bound_submit_creates_nothing_and_says_which_claim(
    cluster: Cluster, applied: Path
) -> None:
    kube = cluster.kube()
    body, name, held = _submitted_and_deleted(cluster, kube)
    try:
        waited = submit(kube, body, wait_seconds=3)
        assert (waited.outcome, waited.claim) == ("waiting", workspace_claim(name))
        assert not cluster.exists(_workflow_path(name))
    finally:
        _release(cluster, name, held)
