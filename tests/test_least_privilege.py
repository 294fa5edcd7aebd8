"""Least privilege in the rendered tree: only the build runs in the privileged namespace,
no step of it holds a token, and the build namespace admits only Workflows that
reference fabrique-build (the admission policy's CEL, evaluated here)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fabrique.decisions.workflow import build_workflow
from fabrique.site.config import load_site

from . import payloads
from .conftest import ROOT
from .doubles.admission import Admission, admission_of
from .doubles.sensor import fire, merge_patch
from .manifests import documents, find

TREE = ROOT / "manifests"
SITE = load_site(env={})
BUILD_NS, CONTROL_NS = "fabrique-build", "fabrique"
REVISION = "9c1d0f3b2a4e" + "5" * 28
WORKLOADS = {"CronWorkflow", "Workflow", "WorkflowTemplate", "EventSource", "Sensor", "EventBus"}


def test_only_the_build_runs_in_the_privileged_namespace() -> None:
    in_build = sorted(
        (d["kind"], d["metadata"]["name"])
        for d in documents(TREE)
        if d["kind"] in WORKLOADS and d["metadata"].get("namespace") == BUILD_NS
    )
    assert in_build == [("WorkflowTemplate", "fabrique-build")]
    for name in ("fabrique-reconcile", "gitea-mirror-sync"):
        assert find(TREE, "CronWorkflow", name)["metadata"]["namespace"] == CONTROL_NS, name
    # what the control namespace's pods mount is there too
    assert find(TREE, "ConfigMap", "fabrique-site", CONTROL_NS)["data"]["site.yaml"]


def test_the_reconciler_may_create_workflows_in_the_build_namespace_and_nothing_else() -> None:
    cron = find(TREE, "CronWorkflow", "fabrique-reconcile")["spec"]["workflowSpec"]
    assert cron["serviceAccountName"] == "fabrique-reconciler"
    assert cron["executor"] == {"serviceAccountName": "fabrique-executor"}
    bound = [
        (d["metadata"]["namespace"], d["roleRef"]["name"])
        for d in documents(TREE)
        if d["kind"] == "RoleBinding"
        and any(s["name"] == "fabrique-reconciler" for s in d["subjects"])
    ]
    assert bound == [
        (BUILD_NS, "fabrique-reconciler-create-workflows"),
        (CONTROL_NS, "fabrique-reconciler-memory"),
    ]
    memory = find(TREE, "Role", "fabrique-reconciler-memory", CONTROL_NS)
    assert {r["resources"][0] for r in memory["rules"]} == {"configmaps"}, "its memory only"
    role = find(TREE, "Role", "fabrique-reconciler-create-workflows", BUILD_NS)
    assert role["rules"] == [
        {
            "apiGroups": ["argoproj.io"],
            "resources": ["workflows"],
            "verbs": ["get", "list", "create"],
        },
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtemplates"], "verbs": ["get"]},
    ]
    policy = find(TREE, "NetworkPolicy", "reconciler", CONTROL_NS)
    assert policy["spec"]["podSelector"] == {"matchLabels": {"fabrique.io/role": "reconciler"}}
    reached = [rule["ports"][0]["port"] for rule in policy["spec"]["egress"]]
    assert reached == [53, 3000, 80, 443], "DNS, Gitea, the registry, the API"
    assert "Ingress" in policy["spec"]["policyTypes"] and "ingress" not in policy["spec"]


def test_the_build_namespace_policies_select_build_pods_only() -> None:
    names = sorted(
        d["metadata"]["name"]
        for d in documents(TREE)
        if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == BUILD_NS
    )
    assert "mirror-sync-egress" not in names, "the mirror sync left the build namespace"


# --------------------------------------------------------------------- admission


@pytest.fixture(scope="module")
def admission() -> Admission:
    policy = find(TREE, "ValidatingAdmissionPolicy", "fabrique-build-workflows")
    binding = find(TREE, "ValidatingAdmissionPolicyBinding", "fabrique-build-workflows")
    assert binding["spec"]["policyName"] == "fabrique-build-workflows"
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": BUILD_NS}
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["argoproj.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["workflows"],
        }
    ]
    return admission_of(TREE)


def _sensor_workflow() -> dict[str, Any]:
    """The push Workflow the Sensor creates for a push."""
    trigger = find(TREE, "Sensor", "fabrique-build")["spec"]["triggers"][0]
    return fire(trigger, payloads.push(after=REVISION, files=["dataops/citation-dagster/x"]))


def test_what_the_three_callers_create_is_admitted(admission: Admission) -> None:
    callers = {
        "push": build_workflow(SITE, "citation", REVISION, submitted_by="push"),
        "reconciler": build_workflow(SITE, "citation", REVISION, submitted_by="reconciler"),
        "submit": build_workflow(SITE, "citation", REVISION, submitted_by="cli", force=True),
    }
    for caller, workflow in callers.items():
        assert workflow["metadata"]["namespace"] == BUILD_NS, caller
        assert admission.refusals(workflow) == [], caller


def _inline(spec: dict[str, Any]) -> None:
    spec.clear()
    spec |= {"entrypoint": "x", "templates": [{"name": "x", "container": {"image": "evil"}}]}


@pytest.mark.parametrize(
    ("edit", "broken"),
    [
        (_inline, "only spec.workflowTemplateRef and spec.arguments"),
        (lambda s: s.update(podSpecPatch='{"hostPID": true}'), "only spec.workflowTemplateRef"),
        (lambda s: s.update(serviceAccountName="fabrique-reconciler"), "only spec.workflow"),
        (lambda s: s.update(templates=[{"name": "main", "script": {}}]), "only spec.workflow"),
        (lambda s: s.update(workflowTemplateRef={"name": "other"}), "by name"),
        (lambda s: s["workflowTemplateRef"].update(clusterScope=True), "by name"),
        (lambda s: s.pop("workflowTemplateRef"), "by name"),
        (
            lambda s: s["arguments"]["parameters"].append({"name": "image", "value": "evil"}),
            "only the parameters app, revision, force",
        ),
        (
            lambda s: s["arguments"]["parameters"][0].update(valueFrom={"configMapKeyRef": {}}),
            "only the parameters",
        ),
        (lambda s: s["arguments"].update(artifacts=[{"name": "a"}]), "only the parameters"),
    ],
)
def test_anything_else_is_refused(admission: Admission, edit: Any, broken: str) -> None:
    workflow = build_workflow(SITE, "citation", REVISION, submitted_by="push")
    edit(workflow["spec"])
    refusals = admission.refusals(workflow)
    assert any(broken in message for message in refusals), refusals


@pytest.mark.parametrize(
    "name",
    [
        "fabrique-citation-000000000000",  # another commit's sha12
        "fabrique-other-4e1d9c0b7a6f",  # another app
        "fabrique-citation-4e1d9c0b7a6",  # a short sha
        "fabrique-citation-4e1d9c0b7a6f5",  # a longer one
        "citation-4e1d9c0b7a6f",
    ],
)
def test_a_workflow_named_for_another_build_is_refused(admission: Admission, name: str) -> None:
    """The name makes a second Workflow of one commit a 409: a caller that names it
    otherwise could build one commit twice, or hide a build under another's name."""
    workflow = build_workflow(SITE, "citation", REVISION, submitted_by="push")
    assert admission.refusals(workflow) == []
    workflow["metadata"]["name"] = name
    assert admission.refusals(workflow) == [
        "a Workflow here must be named fabrique-<app>-<the first 12 characters of its revision>"
    ]


def test_a_sha256_revision_names_its_workflow_by_its_sha12(admission: Admission) -> None:
    revision = "ab" * 32
    workflow = build_workflow(load_site(env={}), "citation", revision, submitted_by="cli")
    assert workflow["metadata"]["name"] == f"fabrique-citation-{revision[:12]}"
    assert admission.refusals(workflow) == []


# ------------------------------------------- the Sensor: its pushes, and nothing else


def test_the_sensor_creates_push_workflows_and_nothing_else() -> None:
    """The Sensor's account creates, in the control namespace, the push Workflow of a
    push: a reference to fabrique-push with its two commits. Anything else it might
    create there (inline templates, another account, another template) is refused."""
    policy = find(TREE, "ValidatingAdmissionPolicy", "fabrique-sensor-creates-pushes")
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:fabrique:fabrique-sensor'"
    )
    creates = Admission(TREE, "fabrique-sensor-creates-pushes")
    assert creates.namespace == CONTROL_NS
    push = _sensor_workflow()
    assert push["metadata"]["namespace"] == CONTROL_NS
    assert push["metadata"]["name"] == f"fabrique-push-{REVISION[:12]}-{'1' * 12}"
    assert creates.refusals(push) == []
    edits = {
        "only spec.workflowTemplateRef and spec.arguments": [
            _inline,
            lambda s: s.update(serviceAccountName="fabrique-planner"),
            lambda s: s.update(podSpecPatch='{"hostPID": true}'),
        ],
        "must reference the WorkflowTemplate fabrique-push": [
            lambda s: s.update(workflowTemplateRef={"name": "fabrique-build"}),
        ],
        "only the parameters before, after": [
            lambda s: s["arguments"]["parameters"].append({"name": "app", "value": "x"}),
        ],
        "must pass before and after once each": [
            lambda s: s["arguments"]["parameters"][1].update(value="main"),
            lambda s: s["arguments"]["parameters"].pop(),
        ],
    }
    for broken, changes in edits.items():
        for edit in changes:
            workflow = copy.deepcopy(push)
            edit(workflow["spec"])
            refusals = creates.refusals(workflow)
            assert any(broken in message for message in refusals), (broken, refusals)
    renamed = copy.deepcopy(push)
    renamed["metadata"]["name"] = "fabrique-citation-" + REVISION[:12]
    assert any("be named fabrique-push-" in m for m in creates.refusals(renamed))


def test_the_sensor_s_update_is_admitted_only_when_it_changes_nothing() -> None:
    """The trigger patches the push Workflow of a redelivered push with the body it
    would have created: admitted, since it changes nothing. Any change by the Sensor's
    account (a parameter, a label, an annotation, the template) is refused."""
    policy = find(TREE, "ValidatingAdmissionPolicy", "fabrique-sensor-changes-nothing")
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["UPDATE"]
    assert policy["spec"]["matchConditions"] == [
        {
            "name": "the-sensor",
            "expression": "request.userInfo.username == "
            "'system:serviceaccount:fabrique:fabrique-sensor'",
        }
    ]
    sensor = Admission(TREE, "fabrique-sensor-changes-nothing")
    assert sensor.namespace == CONTROL_NS
    running = _running(_sensor_workflow())
    assert sensor.refusals(copy.deepcopy(running), old=running) == []
    message = "the Sensor may find a Workflow here as it is (a redelivered push), never change it"
    edits = [
        lambda w: w["spec"]["arguments"]["parameters"][0].update(value="0" * 40),
        lambda w: w["spec"].update(podSpecPatch='{"hostPID": true}'),
        lambda w: w["metadata"]["labels"].update({"fabrique.io/submitted-by": "sensor-2"}),
        lambda w: w["metadata"].update(annotations={"x": "y"}),
    ]
    for edit in edits:
        changed = copy.deepcopy(running)
        edit(changed)
        assert sensor.refusals(changed, old=running) == [message]


def _running(workflow: dict[str, Any]) -> dict[str, Any]:
    """``workflow`` as the API holds it once the Argo controller has taken it."""
    running = copy.deepcopy(workflow)
    running["metadata"]["labels"]["workflows.argoproj.io/phase"] = "Running"
    return running


def test_a_redelivered_push_finds_its_push_workflow_as_it_is() -> None:
    """The trigger's merge patch of a redelivered push changes nothing in the push
    Workflow it made, and the Sensor's policy admits it: the redelivery is settled at
    once, not a minute of refused tries and a failure counted."""
    trigger = find(TREE, "Sensor", "fabrique-build")["spec"]["triggers"][0]
    found = _running(_sensor_workflow())
    patch = fire(trigger, payloads.push(after=REVISION, files=["dataops/citation-dagster/x"]))
    patched = merge_patch(found, patch)
    assert patched == found
    sensor = Admission(TREE, "fabrique-sensor-changes-nothing")
    assert sensor.refusals(patched, old=found) == []


def test_the_sensor_holds_no_right_in_the_build_namespace() -> None:
    """Builds are the push planner's, the safety net's and a person's to create: the
    Sensor's account cannot touch one (a redelivery can no longer meet a build at all)."""
    bound = [
        (d["metadata"]["namespace"], d["roleRef"]["name"])
        for d in documents(TREE)
        if d["kind"] == "RoleBinding" and any(s["name"] == "fabrique-sensor" for s in d["subjects"])
    ]
    assert bound == [(CONTROL_NS, "fabrique-sensor-workflows")]
    planner = [
        (d["metadata"]["namespace"], d["roleRef"]["name"])
        for d in documents(TREE)
        if d["kind"] == "RoleBinding"
        and any(s["name"] == "fabrique-planner" for s in d["subjects"])
    ]
    assert planner == [(BUILD_NS, "fabrique-planner-create-workflows")]
    role = find(TREE, "Role", "fabrique-planner-create-workflows", BUILD_NS)
    # it lists them too: the push's write-back waits for the builds that meet there
    assert role["rules"] == [
        {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create", "list"]}
    ]
    policy = find(TREE, "NetworkPolicy", "planner", CONTROL_NS)
    reached = [rule["ports"][0]["port"] for rule in policy["spec"]["egress"]]
    assert reached == [53, 3000, 443], "DNS, Gitea, the API"
