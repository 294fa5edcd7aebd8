"""CronWorkflow ``fabrique-reconcile``: the safety net, on a schedule.

Every period it runs ``fabrique reconcile`` in the tools image: an event lost anywhere
between Gitea and the Sensor is caught up within one period. ``Forbid`` keeps two passes
from overlapping; a missed start older than ``startingDeadlineSeconds`` is skipped, not
queued.

It runs in the control namespace (Pod Security ``restricted``), not beside the builds:
its account may create Workflows in the build namespace, and the admission policy of
the build namespace admits only references to ``fabrique-build`` there.

Its template metric ``fabrique_reconcile_decisions_total`` (``argo_workflows_`` prefixed
by the controller) counts the decisions of every pass, by decision: the pass writes its
counts (``fabrique reconcile --counts``) as the step's outputs.
"""

from __future__ import annotations

from hera.workflows import CronWorkflow, Parameter, Steps
from hera.workflows import models as m

from fabrique.decisions.reconcile import DECISIONS
from fabrique.site.config import Site
from fabrique.site.names import LABEL_MANAGED_BY, LABEL_PART_OF, RECONCILER_ACCOUNT

from . import site_from_env
from .steps import executor, executor_pod_patch, pod_security, resources, tools_step, writes_git

CRON_NAME = "fabrique-reconcile"
SERVICE_ACCOUNT = RECONCILER_ACCOUNT
POD_LABELS = {LABEL_PART_OF: "fabrique", "fabrique.io/role": "reconciler"}
COUNTS_DIR = "/tmp/fabrique/decisions"


def reconcile_cron(site: Site) -> CronWorkflow:
    settings = site.reconcile
    with CronWorkflow(
        name=CRON_NAME,
        namespace=site.namespaces.control,
        labels={LABEL_PART_OF: "fabrique", LABEL_MANAGED_BY: "fabrique"},
        annotations={
            "workflows.argoproj.io/description": (
                "Converge every app on the image of the last commit that changed it."
            )
        },
        schedules=[settings.schedule],
        timezone=settings.timezone,
        concurrency_policy="Forbid",
        starting_deadline_seconds=settings.starting_deadline_seconds,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=3,
        entrypoint="main",
        service_account_name=SERVICE_ACCOUNT,  # its token creates the Workflows
        executor=executor(),
        security_context=pod_security(),
        pod_spec_patch=executor_pod_patch(),
        # a pass that hangs must not hold the next one off (concurrencyPolicy Forbid)
        active_deadline_seconds=max(60, settings.period_seconds() - 30),
    ) as cron:
        run = tools_step(
            site,
            "reconcile",
            ["reconcile", "--counts", COUNTS_DIR],
            labels=POD_LABELS,
            **writes_git(site),
            sizing=resources("100m", "128Mi", "512Mi"),
            outputs=[
                # "0" when the pass died before counting: the metric still reads a number
                Parameter(
                    name=name, value_from=m.ValueFrom(path=f"{COUNTS_DIR}/{name}", default="0")
                )
                for name in DECISIONS
            ],
            metrics=_decision_metrics(),
        )
        with Steps(name="main"):
            run()
    return cron


def _decision_metrics() -> m.Metrics:
    """``fabrique_reconcile_decisions_total{decision}``: every pass adds its counts."""
    return m.Metrics(
        prometheus=[
            m.Prometheus(
                name="fabrique_reconcile_decisions_total",
                help="Reconcile decisions, one per app and pass, by decision.",
                labels=[m.MetricLabel(key="decision", value=decision)],
                counter=m.Counter(value=f"{{{{outputs.parameters.{decision}}}}}"),
            )
            for decision in DECISIONS
        ]
    )


# `hera generate yaml pipelines/` finds this object; `fabrique render` calls
# reconcile_cron() with the site it was given.
cron_workflow = reconcile_cron(site_from_env())
