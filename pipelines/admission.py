"""The build namespace admits one kind of Workflow: a reference to ``fabrique-build``.

The Sensor's and the reconciler's accounts may create Workflows in the build namespace,
the only privileged one. Without a check, either could create a Workflow with inline
templates (any image, any command, Unconfined) or one that references the template but
overrides its pod fields (``podSpecPatch``, ``serviceAccountName``, ``templates``: a
referencing Workflow's spec is merged over the template's).

A ``ValidatingAdmissionPolicy`` bound to the build namespace refuses, at CREATE, every
Workflow whose spec is anything but ``workflowTemplateRef: {name: fabrique-build}`` and
``arguments.parameters`` among ``app``, ``revision``, ``force``, or whose name is not
``fabrique-<app>-<sha12>`` of its own parameters (the name is what makes a second
Workflow of one commit a 409): exactly what the Sensor, the reconciler and ``fabrique
submit`` create (``fabrique.decisions.workflow``).

The Sensor's trigger is a ``patch``: Argo Events gets the Workflow of the pushed commit,
creates it if there is none, and otherwise merge-patches it with the same body, which is
how a redelivered push is settled at once instead of a minute of 409s. So the Sensor's
account may get and patch Workflows; a second policy (``SENSOR_POLICY``) lets its UPDATE
through only when it changes nothing: the same spec, labels and annotations. A
redelivery passes whoever made the Workflow (the Sensor's body leaves out the one label
that differs by caller, eventsources/sensor.py); any edit by that account is refused,
and so is a redelivery that would drop a ``--force`` submission's ``force``.

Argo's own ``workflowRestrictions.templateReferencing: Strict`` was not chosen: it is a
setting of the whole controller (every team's Workflows, every namespace), it lets a
referencing Workflow override the template's fields, and it lives in the controller's
ConfigMap, which fabrique vendors but does not own.
"""

from __future__ import annotations

from typing import Any

from fabrique.site.config import Site
from fabrique.site.names import (
    SENSOR_SERVICE_ACCOUNT,
    SHORT_SHA_LEN,
    TEMPLATE_NAME,
    WORKFLOW_PREFIX,
)
from fabrique.site.objects import object_meta

POLICY = "fabrique-build-workflows"
SENSOR_POLICY = "fabrique-sensor-changes-nothing"
# what the Sensor's UPDATE must leave as it found it
SENSOR_RULE = (
    "object.spec == oldObject.spec && "
    + " && ".join(
        f"has(object.metadata.{field}) == has(oldObject.metadata.{field}) "
        f"&& (!has(object.metadata.{field}) "
        f"|| object.metadata.{field} == oldObject.metadata.{field})"
        for field in ("labels", "annotations")
    ),
    "the Sensor may find a Workflow here as it is (a redelivered push), never change it",
)
PARAMETERS = ("app", "revision", "force")

# One expression per rule, so that a refusal names the rule it broke.
RULES = (
    (
        "object.spec.all(k, k in ['workflowTemplateRef', 'arguments'])",
        "a Workflow here may hold only spec.workflowTemplateRef and spec.arguments",
    ),
    (
        "has(object.spec.workflowTemplateRef) "
        "&& object.spec.workflowTemplateRef.all(k, k == 'name') "
        f"&& object.spec.workflowTemplateRef.name == '{TEMPLATE_NAME}'",
        f"a Workflow here must reference the WorkflowTemplate {TEMPLATE_NAME} by name",
    ),
    (
        "!has(object.spec.arguments) "
        "|| (object.spec.arguments.all(k, k == 'parameters') "
        "&& (!has(object.spec.arguments.parameters) "
        "|| object.spec.arguments.parameters.all(p, p.all(k, k in ['name', 'value']) "
        f"&& p.name in {list(PARAMETERS)!r})))",
        f"a Workflow here may pass only the parameters {', '.join(PARAMETERS)}",
    ),
    (
        # the name is what makes a second Workflow of one commit a 409: it must be the
        # one of its app and revision, fabrique-<app>-<sha12> (standard CEL only)
        "has(object.metadata.name) && object.spec.arguments.parameters.exists(a, "
        "a.name == 'app' && object.spec.arguments.parameters.exists(r, r.name == 'revision' "
        f"&& size(object.metadata.name) == size('{WORKFLOW_PREFIX}' + a.value + '-') "
        f"+ {SHORT_SHA_LEN} "
        f"&& object.metadata.name.startsWith('{WORKFLOW_PREFIX}' + a.value + '-') "
        f"&& ('{WORKFLOW_PREFIX}' + a.value + '-' + r.value).startsWith(object.metadata.name)))",
        f"a Workflow here must be named {WORKFLOW_PREFIX}<app>-<the first {SHORT_SHA_LEN} "
        "characters of its revision>",
    ),
)


def _binding(site: Site, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": object_meta(name),
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": site.namespaces.build}
                }
            },
        },
    }


def _workflows(operation: str) -> dict[str, Any]:
    return {
        "resourceRules": [
            {
                "apiGroups": ["argoproj.io"],
                "apiVersions": ["*"],
                "operations": [operation],
                "resources": ["workflows"],
            }
        ]
    }


def workflow_admission(site: Site) -> list[dict[str, Any]]:
    """The policies and their bindings to the build namespace."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": object_meta(POLICY),
        "spec": {
            "failurePolicy": "Fail",
            # only CREATE: the controller updates Workflows as they run
            "matchConstraints": _workflows("CREATE"),
            "validations": [
                {"expression": expression, "message": message} for expression, message in RULES
            ],
        },
    }
    sensor = f"system:serviceaccount:{site.namespaces.control}:{SENSOR_SERVICE_ACCOUNT}"
    sensor_policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": object_meta(SENSOR_POLICY),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": _workflows("UPDATE"),
            "matchConditions": [
                {"name": "the-sensor", "expression": f"request.userInfo.username == '{sensor}'"}
            ],
            "validations": [{"expression": SENSOR_RULE[0], "message": SENSOR_RULE[1]}],
        },
    }
    return [policy, _binding(site, POLICY), sensor_policy, _binding(site, SENSOR_POLICY)]
