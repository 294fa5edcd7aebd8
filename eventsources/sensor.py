"""Sensor ``fabrique-build``: every push of the site's branch becomes one push Workflow.

One dependency on the push event, one ``k8s`` trigger. The dependency passes a push of
a commit to the site's branch of the code repository (data filters: anchored regexes,
since Argo Events treats a string value as an unanchored one) that moved the branch
(``before`` is not ``after``: Gitea's "Test Delivery" posts the head as both). The
trigger creates ``fabrique-push-<after12>-<before12>`` from the WorkflowTemplate
``fabrique-push`` in the control namespace (pipelines/push.py), passing the push's two
commits; its step asks for the build of every app the push touched
(fabrique/decisions/push.py). Which apps those are is fabrique's own code, not a filter:
the Sensor is the same whatever the apps, one dependency, one trigger, one JetStream
consumer, one NATS connection (docs/DESIGN.md, "The event path").

The trigger's operation is ``patch``: Argo Events gets the Workflow of that name, creates
it when there is none, and otherwise merge-patches it with the very body it would have
created, which changes nothing. A redelivered push (Gitea's "Replay", or JetStream
handing an event again to a Sensor that died before its ack) is so settled at once; a
``create`` would meet 409 AlreadyExists, which Argo Events retries like any error, for
the minute of ``RETRY_STRATEGY``. The control namespace's admission refuses any UPDATE
by the Sensor's account that would change a Workflow, and any CREATE but this one
(pipelines/admission.py).
"""

from __future__ import annotations

import re
from typing import Any

from fabrique.site.config import Site
from fabrique.site.names import (
    EVENT_BUS,
    EVENT_NAME,
    EVENT_SOURCE,
    LABEL_MANAGED_BY,
    LABEL_PART_OF,
    PUSH_PARAMETERS,
    PUSH_PREFIX,
    PUSH_TEMPLATE,
    REVISION_RE,
    SENSOR,
    SENSOR_ROLE,
    SENSOR_ROLE_LABEL,
    SENSOR_SERVICE_ACCOUNT,
    SHORT_SHA_LEN,
)

from ._common import document, restricted_container, restricted_pod

UNRESOLVED = "unresolved"  # what the resource says until the event fills it in
NON_ZERO_SHA = "^[0-9a-f]*[1-9a-f][0-9a-f]*$"  # a deleted branch pushes after = 0{40|64}
DEPENDENCY = "push"
TRIGGER = "plan-push"


def anchored(text: str) -> str:
    return f"^{re.escape(text)}$"


def _short(field: str) -> str:
    return f"{{{{ .Input.body.{field} | substr 0 {SHORT_SHA_LEN} }}}}"


# fabrique-push-<after12>-<before12>: one Workflow per push, the same for its replays.
# Through Go templates over the decoded body, not dataKeys: a dataKey is read with gjson
# (the first of duplicated keys), a template over the decoded body (the last), so a
# payload with `after` twice could name one commit and plan another.
NAME_TEMPLATE = f"{PUSH_PREFIX}{_short('after')}-{_short('before')}"
PARAMETER_TEMPLATES = {name: f"{{{{ .Input.body.{name} }}}}" for name in PUSH_PARAMETERS}
# Gitea's test delivery posts the branch's head as both; no push moves a branch onto itself
MOVED = {
    "expr": "before != after",
    "fields": [{"name": n, "path": f"body.{n}"} for n in ("before", "after")],
}


def _data(path: str, pattern: str) -> dict[str, Any]:
    """A data filter: the string at ``path`` matches ``pattern`` (unanchored, as Argo
    Events reads it: anchor it)."""
    return {"path": path, "type": "string", "value": [pattern]}


def push_filters(site: Site) -> list[dict[str, Any]]:
    """A push of a commit to the site's branch of the code repository."""
    return [
        _data("header.X-Gitea-Event.0", "^push$"),
        _data("body.ref", anchored(f"refs/heads/{site.gitea.branch}")),
        _data("body.repository.full_name", anchored(site.gitea.code_repo)),
        # 40 hex, or 64 in a SHA-256 repository; Go's $ is the end of the text
        _data("body.after", REVISION_RE.pattern),
        _data("body.after", NON_ZERO_SHA),
        # the commit before: zeros when the branch is new (its push's plan builds all)
        _data("body.before", REVISION_RE.pattern),
    ]


def sensor(site: Site, name: str = SENSOR) -> dict[str, Any]:
    """The site's one Sensor: one dependency, one trigger, whatever the apps (``name``:
    another Sensor of the same, as a test deploys one beside the site's)."""
    dependency = {
        "eventName": EVENT_NAME,
        "eventSourceName": EVENT_SOURCE,
        "filters": {"data": push_filters(site), "dataLogicalOperator": "and", "exprs": [MOVED]},
        "name": DEPENDENCY,
    }
    templates = {"metadata.name": NAME_TEMPLATE} | {
        f"spec.arguments.parameters.{index}.value": template
        for index, template in enumerate(PARAMETER_TEMPLATES.values())
    }
    parameters = [
        {"dest": dest, "src": {"dataTemplate": template, "dependencyName": DEPENDENCY}}
        for dest, template in templates.items()
    ]
    # the resource is the raw Workflow object the trigger patches
    k8s = {
        "operation": "patch",
        "parameters": parameters,
        "source": {"resource": push_workflow(site)},
    }
    trigger = {
        "template": {"name": TRIGGER, "conditions": DEPENDENCY, "k8s": k8s},
        # at-most-once unless told: a Sensor that dies between ack and create would lose it
        "atLeastOnce": True,
        "retryStrategy": RETRY_STRATEGY,
        "rateLimit": {"requestsPerUnit": site.events.triggers_per_second, "unit": "Second"},
    }
    template = {
        "metadata": {"labels": {SENSOR_ROLE_LABEL: SENSOR_ROLE}},
        "serviceAccountName": SENSOR_SERVICE_ACCOUNT,
        "securityContext": restricted_pod(),
        "container": {"securityContext": restricted_container()},
    }
    spec = {
        "eventBusName": EVENT_BUS,
        "template": template,
        "dependencies": [dependency],
        "triggers": [trigger],
    }
    return document("Sensor", name, site.namespaces.control, spec)


def push_workflow(site: Site) -> dict[str, Any]:
    """The push's Workflow as the trigger creates it, before the event fills in its name
    and the two commits."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": f"{PUSH_PREFIX}{UNRESOLVED}",
            "namespace": site.namespaces.control,
            "labels": {LABEL_PART_OF: "fabrique", LABEL_MANAGED_BY: "fabrique"},
        },
        "spec": {
            "workflowTemplateRef": {"name": PUSH_TEMPLATE},
            "arguments": {
                "parameters": [{"name": name, "value": UNRESOLVED} for name in PUSH_PARAMETERS]
            },
        },
    }


# The trigger's tries (Argo Events' DoWithRetry, pkg/shared/util/retry.go: a
# k8s.io/apimachinery wait.Backoff, `steps` tries, the wait doubling from `duration`, each
# stretched by up to `jitter`): 2, 4, 8, 16 and 32 s between six tries, so an API server
# away for a minute loses no event. DoWithRetry retries every error alike, which is why
# the operation is a patch: a redelivered commit finds its Workflow and is done.
RETRY_STRATEGY = {"steps": 6, "duration": "2s", "factor": 2, "jitter": 0.2}


def sensor_rbac(site: Site) -> list[dict[str, Any]]:
    """The Sensor's ServiceAccount may create push Workflows in the control namespace,
    and get and patch them (a patch that changes nothing: admission refuses any other)."""
    from fabrique.site.objects import service_account

    return service_account(
        SENSOR_SERVICE_ACCOUNT,
        site.namespaces.control,
        [
            {
                "apiGroups": ["argoproj.io"],
                "resources": ["workflows"],
                "verbs": ["create", "get", "patch"],
            }
        ],
        role=f"{SENSOR_SERVICE_ACCOUNT}-workflows",
        role_namespace=site.namespaces.control,
    )
