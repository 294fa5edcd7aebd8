"""WorkflowTemplate ``fabrique-push``: one Workflow per push, whose step asks for its builds.

The site's one Sensor creates ``fabrique-push-<after12>-<before12>`` from it for every
push of the site's branch (eventsources/sensor.py); its one step runs ``fabrique
plan-push`` in the tools image (fabrique/decisions/push.py), which lists what the push
changed and creates the build of every app it touched in the build namespace, as the
safety net and ``fabrique submit`` do.

When the push touched several apps that write into one repository and branch
(``writeback.batch``), their builds carry this Workflow's name and write nothing; its
second step, ``write-back`` (``fabrique writeback-group``), waits for them and writes
their digests in one commit per repository and branch (fabrique/gestures/group.py).

It runs in the control namespace (Pod Security ``restricted``), beside the reconciler:
its account may create and list Workflows in the build namespace, where admission admits
only references to ``fabrique-build``, and nothing else. A retried step asks again for
every build: AlreadyExists is success; a retried write-back writes again, and a replay
changes nothing.
"""

from __future__ import annotations

from hera.workflows import Container, Parameter, Steps, WorkflowTemplate
from hera.workflows import models as m

from fabrique.site.config import Site, seconds_of
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
    writes_git,
)

POD_LABELS = {LABEL_PART_OF: "fabrique", "fabrique.io/role": PLANNER_ROLE}
# a push's Workflow is kept a day (a replay of its delivery finds it and makes nothing);
# its pod goes when it succeeds
KEPT_SECONDS = 86400
DEADLINE_SECONDS = 900  # retries included; a new branch of 10 000 apps asks in seconds


PLAN_STEP = "plan-push"
WRITE_STEP = "write-back"
OUT_DIR = "/tmp/push"


def push_template(site: Site) -> WorkflowTemplate:
    batched = site.writeback.batch.enabled
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
        # retries included: a step that hangs must not hold a push's builds for long;
        # the write-back of the builds that meet waits for them
        active_deadline_seconds=DEADLINE_SECONDS + (group_deadline(site) if batched else 0),
    ) as template:
        plan = tools_step(
            site,
            PLAN_STEP,
            [
                "plan-push",
                *("--before", "{{workflow.parameters.before}}"),
                *("--after", "{{workflow.parameters.after}}"),
                *(("--group", "{{workflow.name}}", "--out", OUT_DIR) if batched else ()),
            ],
            labels=POD_LABELS,
            extra_env=[token(site)],
            sizing=resources("100m", "128Mi", "512Mi"),
            retry_strategy=retry(site),
            outputs=(
                [
                    Parameter(
                        name="grouped",
                        value_from=m.ValueFrom(path=f"{OUT_DIR}/grouped", default="0"),
                    )
                ]
                if batched
                else None
            ),
        )
        write = _write_back(site) if batched else None
        with Steps(name="main"):
            plan()
            if write is not None:
                write(when=f"{{{{steps.{PLAN_STEP}.outputs.parameters.grouped}}}} != 0")
    return template


def group_deadline(site: Site) -> int:
    """Seconds the push's write-back may wait and write: its builds' own deadline, then
    maxWait, then a margin for the writes themselves."""
    return site.build.active_deadline_seconds + int(seconds_of(site.writeback.batch.max_wait)) + 300


def _write_back(site: Site) -> Container:
    """``fabrique writeback-group``: once the builds of the push that meet have ended,
    their digests in one commit per repository and branch, their statuses posted."""
    git = writes_git(site)
    return tools_step(
        site,
        WRITE_STEP,
        ["writeback-group", "--push", "{{workflow.name}}"],
        labels=POD_LABELS,
        extra_env=git["extra_env"],
        extra_volumes=git.get("extra_volumes"),
        sizing=resources("100m", "128Mi", "512Mi"),
        retry_strategy=retry(site),
        active_deadline_seconds=str(group_deadline(site)),
    )


# `hera generate yaml pipelines/` finds this object; `fabrique render` calls
# push_template() with the site it was given.
workflow_template = push_template(site_from_env())
