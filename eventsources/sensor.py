"""Sensor ``fabrique-build``: each push to the branch creates ``fabrique-<app>-<sha12>``.

Per app, one dependency on the push event, filtered by anchored regexes (Argo Events
treats a string value as an unanchored regex), and one trigger that creates the same
Workflow ``fabrique submit`` creates, named from the pushed commit. A redelivered or
replayed event meets 409 AlreadyExists: the commit is not built twice. Whether the push
changed the app at all is decided by the Workflow's plan step, not here.
"""

from __future__ import annotations

import re
from typing import Any

from hera.events.models import (
    DataFilter,
    EventDependency,
    EventDependencyFilter,
    RateLimit,
    StandardK8STrigger,
    TriggerParameter,
    TriggerParameterSource,
)

from fabrique.decisions.workflow import (
    NAME_DEST,
    REVISION_DESTS,
    SHORT_REVISION_DESTS,
    workflow_object,
)
from fabrique.site.config import Site
from fabrique.site.names import (
    EVENT_BUS,
    EVENT_NAME,
    EVENT_SOURCE,
    REVISION_RE,
    SENSOR,
    SENSOR_SERVICE_ACCOUNT,
    SHORT_SHA_LEN,
    WORKFLOW_PREFIX,
)

from ._common import document, dump, restricted_container, restricted_pod

UNRESOLVED = "unresolved"  # what the resource says until the event fills it in
NON_ZERO_SHA = "^[0-9a-f]*[1-9a-f][0-9a-f]*$"  # a deleted branch pushes after = 0{40|64}


def anchored(text: str) -> str:
    return f"^{re.escape(text)}$"


def dependency_name(app: str) -> str:
    return f"push-{app}"


# the pushed commit's sha12: the Workflow's name ends with it, and the revision label
# holds it (a label value holds at most 63 characters)
SHORT_REVISION_TEMPLATE = f"{{{{ .Input.body.after | substr 0 {SHORT_SHA_LEN} }}}}"


def name_template(app: str) -> str:
    """The Go template that yields ``fabrique-<app>-<sha12>`` from the event."""
    return f"{WORKFLOW_PREFIX}{app}-{SHORT_REVISION_TEMPLATE}"


# The revision through the same Go template as the name, not a dataKey: a dataKey is read
# with gjson (the first of duplicated keys), a template over the decoded body (the last),
# so a payload with `after` twice could name one commit and build another.
REVISION_TEMPLATE = "{{ .Input.body.after }}"


def push_filters(site: Site) -> list[DataFilter]:
    """A push of a commit to the site's branch of the code repository."""
    return [
        DataFilter(path="header.X-Gitea-Event.0", type="string", value=["^push$"]),
        DataFilter(
            path="body.ref", type="string", value=[anchored(f"refs/heads/{site.gitea.branch}")]
        ),
        DataFilter(
            path="body.repository.full_name", type="string", value=[anchored(site.gitea.code_repo)]
        ),
        # 40 hex, or 64 in a SHA-256 repository; Go's $ is the end of the text
        DataFilter(path="body.after", type="string", value=[REVISION_RE.pattern]),
        DataFilter(path="body.after", type="string", value=[NON_ZERO_SHA]),
    ]


def sensor(site: Site) -> dict[str, Any]:
    dependencies = []
    triggers = []
    for app in site.apps:
        dep = dependency_name(app.name)
        dependencies.append(
            dump(
                EventDependency(
                    name=dep,
                    event_source_name=EVENT_SOURCE,
                    event_name=EVENT_NAME,
                    filters=EventDependencyFilter(
                        data=push_filters(site), data_logical_operator="and"
                    ),
                )
            )
        )
        parameters = [
            TriggerParameter(
                src=TriggerParameterSource(
                    dependency_name=dep, data_template=name_template(app.name)
                ),
                dest=NAME_DEST,
            ),
            *(
                TriggerParameter(
                    src=TriggerParameterSource(
                        dependency_name=dep, data_template=REVISION_TEMPLATE
                    ),
                    dest=dest,
                )
                for dest in REVISION_DESTS
            ),
            *(
                TriggerParameter(
                    src=TriggerParameterSource(
                        dependency_name=dep, data_template=SHORT_REVISION_TEMPLATE
                    ),
                    dest=dest,
                )
                for dest in SHORT_REVISION_DESTS
            ),
        ]
        k8s = dump(StandardK8STrigger(operation="create", parameters=parameters))
        # The resource must be the raw Workflow object: hera's K8SResource would dump it as
        # a base64 {value: …}, which the API rejects.
        k8s["source"] = {
            "resource": workflow_object(
                site,
                app.name,
                f"{WORKFLOW_PREFIX}{app.name}-{UNRESOLVED}",
                UNRESOLVED,
                submitted_by="sensor",
            )
        }
        trigger = {
            "template": {"name": f"build-{app.name}", "conditions": dep, "k8s": k8s},
            # at-most-once unless told: a Sensor that dies between ack and create would lose it
            "atLeastOnce": True,
            "retryStrategy": RETRY_STRATEGY,
            "rateLimit": dump(
                RateLimit(unit="Second", requests_per_unit=site.events.triggers_per_second)
            ),
        }
        triggers.append(trigger)
    template = {
        "serviceAccountName": SENSOR_SERVICE_ACCOUNT,
        "securityContext": restricted_pod(),
        "container": {"securityContext": restricted_container()},
    }
    spec = {
        "eventBusName": EVENT_BUS,
        "template": template,
        "dependencies": dependencies,
        "triggers": triggers,
    }
    return document("Sensor", SENSOR, site.namespaces.control, spec)


# The trigger's tries (Argo Events' DoWithRetry, pkg/shared/util/retry.go: a
# k8s.io/apimachinery wait.Backoff, `steps` tries, the wait doubling from `duration`, each
# stretched by up to `jitter`): 2, 4, 8, 16 and 32 s between six tries, so an API server
# away for a minute loses no event. DoWithRetry retries every error alike: a redelivered
# commit's 409 AlreadyExists holds that app's trigger for the same minute, then counts
# one argo_events_action_retries_failed_total, harmlessly (README, The safety net).
RETRY_STRATEGY = {"steps": 6, "duration": "2s", "factor": 2, "jitter": 0.2}


def sensor_rbac(site: Site) -> list[dict[str, Any]]:
    """The Sensor's ServiceAccount may create Workflows in the build namespace; nothing else."""
    from fabrique.site.objects import service_account

    return service_account(
        SENSOR_SERVICE_ACCOUNT,
        site.namespaces.control,
        [{"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create"]}],
        role=f"{SENSOR_SERVICE_ACCOUNT}-create-workflows",
        role_namespace=site.namespaces.build,
    )
