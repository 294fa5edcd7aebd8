"""What may be created where fabrique's Workflows run: admission policies.

The build namespace admits one kind of Workflow: a reference to ``fabrique-build``. The
push planner's and the reconciler's accounts may create Workflows in the build
namespace, the only privileged one. Without a check, either could create a Workflow
with inline templates (any image, any command, Unconfined) or one that references the
template but overrides its pod fields (``podSpecPatch``, ``serviceAccountName``,
``templates``: a referencing Workflow's spec is merged over the template's).

A ``ValidatingAdmissionPolicy`` bound to the build namespace refuses, at CREATE, every
Workflow whose spec is anything but ``workflowTemplateRef: {name: fabrique-build}`` and
``arguments.parameters`` among ``app``, ``revision``, ``force``, ``group``, or whose name is not
``fabrique-<app>-<sha12>`` of its own parameters (the name is what makes a second
Workflow of one commit a 409): exactly what the push planner, the reconciler and
``fabrique submit`` create (``fabrique.decisions.workflow``).

The Sensor creates one Workflow per push in the control namespace, from
``fabrique-push``. A second policy (``SENSOR_CREATES``) holds what its account creates
there to that: ``workflowTemplateRef: {name: fabrique-push}``, the parameters ``before``
and ``after``, the name ``fabrique-push-<after12>-<before12>``. Its trigger is a
``patch``: Argo Events gets the Workflow of the push, creates it if there is none, and
otherwise merge-patches it with the same body, which is how a redelivered push is
settled at once instead of a minute of 409s. So the Sensor's account may get and patch
Workflows there; a third policy (``SENSOR_POLICY``) lets its UPDATE through only when
it changes nothing: the same spec, labels and annotations.

Argo's own ``workflowRestrictions.templateReferencing: Strict`` was not chosen: it is a
setting of the whole controller (every team's Workflows, every namespace), it lets a
referencing Workflow override the template's fields, and it lives in the controller's
ConfigMap, which fabrique vendors but does not own.
"""

from __future__ import annotations

from typing import Any

from fabrique.site.config import Site
from fabrique.site.names import (
    PLANNER_ACCOUNT,
    PUSH_PARAMETERS,
    PUSH_PREFIX,
    PUSH_TEMPLATE,
    RECONCILER_ACCOUNT,
    REVISION_RE,
    SENSOR_SERVICE_ACCOUNT,
    SHORT_SHA_LEN,
    TEMPLATE_NAME,
    VERIFY_PARAMETERS,
    VERIFY_PREFIX,
    VERIFY_TEMPLATE,
    WORKFLOW_PREFIX,
)
from fabrique.site.objects import object_meta

POLICY = "fabrique-build-workflows"
SENSOR_CREATES = "fabrique-sensor-creates-pushes"
SENSOR_POLICY = "fabrique-sensor-changes-nothing"
RECONCILER_STARTS = "fabrique-reconciler-starts-verifications"
PLANNER_STARTS = "fabrique-planner-starts-verifications"
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
PARAMETERS = ("app", "revision", "force", "group")


def _references(template: str, parameters: tuple[str, ...]) -> list[tuple[str, str]]:
    """A Workflow that references ``template`` and passes only ``parameters``; one
    expression per rule, so that a refusal names the rule it broke."""
    return [
        (
            "object.spec.all(k, k in ['workflowTemplateRef', 'arguments'])",
            "a Workflow here may hold only spec.workflowTemplateRef and spec.arguments",
        ),
        (
            "has(object.spec.workflowTemplateRef) "
            "&& object.spec.workflowTemplateRef.all(k, k == 'name') "
            f"&& object.spec.workflowTemplateRef.name == '{template}'",
            f"a Workflow here must reference the WorkflowTemplate {template} by name",
        ),
        (
            "!has(object.spec.arguments) "
            "|| (object.spec.arguments.all(k, k == 'parameters') "
            "&& (!has(object.spec.arguments.parameters) "
            "|| object.spec.arguments.parameters.all(p, p.all(k, k in ['name', 'value']) "
            f"&& p.name in {list(parameters)!r})))",
            f"a Workflow here may pass only the parameters {', '.join(parameters)}",
        ),
    ]


RULES = (
    *_references(TEMPLATE_NAME, PARAMETERS),
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


PUSH_RULES = (
    *_references(PUSH_TEMPLATE, PUSH_PARAMETERS),
    (
        # standard CEL only: each commit once, a full id (zeros too: a new branch's
        # before), and a name of the push's shape; the name is no build's key (each
        # build's own name is), so it is not tied to the values here
        "has(object.spec.arguments) && has(object.spec.arguments.parameters) && "
        + " && ".join(
            f"object.spec.arguments.parameters.exists_one(p, p.name == '{name}' "
            f"&& p.value.matches('{REVISION_RE.pattern}'))"
            for name in PUSH_PARAMETERS
        )
        + f" && object.metadata.name.matches('^{PUSH_PREFIX}[0-9a-f]{{{SHORT_SHA_LEN}}}"
        f"-[0-9a-f]{{{SHORT_SHA_LEN}}}$')",
        "a push's Workflow must pass before and after once each, full commit ids, and be "
        f"named {PUSH_PREFIX}<after's first {SHORT_SHA_LEN} characters>-<before's>",
    ),
)


VERIFY_RULES = (
    *_references(VERIFY_TEMPLATE, VERIFY_PARAMETERS),
    (
        # standard CEL only: the name is the look's key (fabrique-verify-<12 hex>)
        f"object.metadata.name.matches('^{VERIFY_PREFIX}[0-9a-f]{{{SHORT_SHA_LEN}}}$')",
        f"a Workflow the reconciler starts here must be named {VERIFY_PREFIX}<12 hex digits>",
    ),
)


def _binding(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": object_meta(name),
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
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


def _policy(
    name: str,
    operation: str,
    rules: tuple[tuple[str, str], ...],
    user: str | None = None,
    who: str = "the-sensor",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": _workflows(operation),
    }
    if user is not None:
        spec["matchConditions"] = [
            {"name": who, "expression": f"request.userInfo.username == '{user}'"}
        ]
    spec["validations"] = [{"expression": expr, "message": message} for expr, message in rules]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": object_meta(name),
        "spec": spec,
    }


def workflow_admission(site: Site) -> list[dict[str, Any]]:
    """The policies and their bindings: the build namespace's builds, whoever creates
    them (only CREATE: the controller updates Workflows as they run); the control
    namespace's pushes, as the Sensor creates and finds them."""
    sensor = f"system:serviceaccount:{site.namespaces.control}:{SENSOR_SERVICE_ACCOUNT}"
    control, build = site.namespaces.control, site.namespaces.build
    documents = [
        _policy(POLICY, "CREATE", RULES),
        _binding(POLICY, build),
        _policy(SENSOR_CREATES, "CREATE", PUSH_RULES, sensor),
        _binding(SENSOR_CREATES, control),
        _policy(SENSOR_POLICY, "UPDATE", (SENSOR_RULE,), sensor),
        _binding(SENSOR_POLICY, control),
    ]
    if site.promoted_in_cluster():
        # the reconciler may start a promotion's look there (verify_unit), nothing else
        reconciler = f"system:serviceaccount:{control}:{RECONCILER_ACCOUNT}"
        documents += [
            _policy(RECONCILER_STARTS, "CREATE", VERIFY_RULES, reconciler, "the-reconciler"),
            _binding(RECONCILER_STARTS, control),
        ]
    if site.grouped_in_cluster():
        # and the push's write-back, the look at what it wrote (writeback.batch)
        planner = f"system:serviceaccount:{control}:{PLANNER_ACCOUNT}"
        documents += [
            _policy(PLANNER_STARTS, "CREATE", VERIFY_RULES, planner, "the-planner"),
            _binding(PLANNER_STARTS, control),
        ]
    return documents
