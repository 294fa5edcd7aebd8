"""WorkflowTemplate ``fabrique-push``: one Workflow per push, whose step asks for its builds.

The site's one Sensor creates ``fabrique-push-<after12>-<before12>`` from it for every
push of the site's branch (eventsources/sensor.py); its one step runs ``fabrique
plan-push`` in the tools image (fabrique/decisions/push.py), which lists what the push
changed and creates the build of every app it touched in the build namespace, as the
safety net and ``fabrique submit`` do.

It runs in the control namespace (Pod Security ``restricted``), beside the reconciler:
its account may create and get Workflows in the build namespace, where admission admits
only references to ``fabrique-build``, and nothing else. A retried step asks again for
every build: AlreadyExists is success.
"""

from __future__ import annotations

from hera.workflows import Parameter, Steps, WorkflowTemplate
from hera.workflows import models as m

from fabrique.site.config import Site
from fabrique.site.names import (
    LABEL_MANAGED_BY,
    LABEL_PART_OF,
    PLANNER_ACCOUNT,
    PLANNER_ROLE,
    PUSH_PARAMETERS,
    PUSH_TEMPLATE,
)

from . import site_from_env
from .steps import (
    executor,
    executor_pod_patch,
    pod_security,
    resources,
    retry,
    token,
    tools_step,
)

POD_LABELS = {LABEL_PART_OF: "fabrique", "fabrique.io/role": PLANNER_ROLE}
# a push's Workflow is kept a day (a replay of its delivery finds it and makes nothing);
# its pod goes when it succeeds
KEPT_SECONDS = 86400
DEADLINE_SECONDS = 900  # retries included; a new branch of 10 000 apps asks in seconds


def push_template(site: Site) -> WorkflowTemplate:
    with WorkflowTemplate(
        name=PUSH_TEMPLATE,
        namespace=site.namespaces.control,
        labels={LABEL_PART_OF: "fabrique", LABEL_MANAGED_BY: "fabrique"},
        annotations={
            "workflows.argoproj.io/description": (
                "Ask for the build of every app a push of the site's branch touched."
            )
        },
        entrypoint="main",
        arguments=[Parameter(name=name) for name in PUSH_PARAMETERS],
        service_account_name=PLANNER_ACCOUNT,  # its token creates the builds
        executor=executor(),
        workflow_metadata=m.WorkflowMetadata(labels={LABEL_PART_OF: "fabrique"}),
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        ttl_strategy=m.TTLStrategy(
            seconds_after_success=KEPT_SECONDS, seconds_after_failure=7 * KEPT_SECONDS
        ),
        security_context=pod_security(),
        pod_spec_patch=executor_pod_patch(),
        # retries included: a step that hangs must not hold a push's builds for long
        active_deadline_seconds=DEADLINE_SECONDS,
    ) as template:
        plan = tools_step(
            site,
            "plan-push",
            [
                "plan-push",
                *("--before", "{{workflow.parameters.before}}"),
                *("--after", "{{workflow.parameters.after}}"),
            ],
            labels=POD_LABELS,
            extra_env=[token(site)],
            sizing=resources("100m", "128Mi", "512Mi"),
            retry_strategy=retry(site),
        )
        with Steps(name="main"):
            plan()
    return template


# `hera generate yaml pipelines/` finds this object; `fabrique render` calls
# push_template() with the site it was given.
workflow_template = push_template(site_from_env())
