"""CronWorkflow ``gitea-mirror-sync``: asks Gitea to pull each mirror, on a schedule.

Its pod reaches Gitea (and the API, for the Argo executor) and nothing else: the pulls
themselves are made by the Gitea pods.
"""

from __future__ import annotations

from hera.workflows import CronWorkflow, Steps

from fabrique.site.config import Site
from fabrique.site.names import LABEL_MANAGED_BY, LABEL_PART_OF

from . import site_from_env
from .steps import executor, executor_pod_patch, pod_security, token, tools_step

CRON_NAME = "gitea-mirror-sync"
SERVICE_ACCOUNT = "fabrique-mirror-sync"
ROLE = "mirror-sync"
POD_LABELS = {LABEL_PART_OF: "fabrique", "fabrique.io/role": ROLE}


def mirror_cron(site: Site) -> CronWorkflow:
    with CronWorkflow(
        name=CRON_NAME,
        namespace=site.namespaces.control,
        labels={LABEL_PART_OF: "fabrique", LABEL_MANAGED_BY: "fabrique"},
        annotations={"workflows.argoproj.io/description": "Ask Gitea to pull every mirror now."},
        schedules=[site.mirror_sync.schedule],
        timezone=site.reconcile.timezone,
        concurrency_policy="Forbid",
        starting_deadline_seconds=site.reconcile.starting_deadline_seconds,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=3,
        entrypoint="main",
        service_account_name=SERVICE_ACCOUNT,
        automount_service_account_token=False,  # it calls Gitea, never the API
        executor=executor(),
        security_context=pod_security(),
        pod_spec_patch=executor_pod_patch(),
        active_deadline_seconds=300,
    ) as cron:
        run = tools_step(
            site, "sync", ["mirror", "sync"], labels=POD_LABELS, extra_env=[token(site)]
        )
        with Steps(name="main"):
            run()
    return cron


cron_workflow = mirror_cron(site_from_env())
