"""WorkflowTemplate ``fabrique-verify``: a look at an environment after a promotion, until
its verdict.

A promotion has no build whose Workflow could look (``fabrique-build``'s
``verify-deploy`` step does after a build's write-back): whoever writes it
(``fabrique promote``, the pass's ``promote: auto``) creates one Workflow from this
template, named ``fabrique-verify-<12 hex>`` of the app, the environment and the digest
(``fabrique.decisions.workflow.verify_workflow``), so that writing the same digest again
is a 409, not a second look. Its one step runs ``fabrique verify --wait --in-cluster``:
the verdict, and a rollback or a hold on failure, within seconds of the pods saying so.
The pass stays its safety net.

It runs in the control namespace (``restricted``) with ``fabrique-promotion-verifier``: get the
Applications of the environments fabrique's cluster deploys by name, list their
namespaces' pods; the Gitea token (a rollback writes through the write-back's path).
Looks at one environment never overlap (a mutex per app and environment).
"""

from __future__ import annotations

from hera.workflows import Parameter, Steps, WorkflowTemplate
from hera.workflows import models as m

from fabrique.site.config import Site
from fabrique.site.names import (
    LABEL_APP,
    LABEL_MANAGED_BY,
    LABEL_PART_OF,
    VERIFY_PARAMETERS,
    VERIFY_TEMPLATE,
)

from . import site_from_env
from .steps import (
    executor,
    executor_pod_patch,
    pod_security,
    retry,
    tools_step,
    verify_deadline,
    writes_git,
)

SERVICE_ACCOUNT = "fabrique-promotion-verifier"
ROLE = "verifier"
POD_LABELS = {LABEL_PART_OF: "fabrique", "fabrique.io/role": ROLE}
APP = "{{workflow.parameters.app}}"
ENV = "{{workflow.parameters.env}}"


def verify_template(site: Site) -> WorkflowTemplate:
    """The ``fabrique-verify`` WorkflowTemplate for ``site``."""
    git = writes_git(site)
    with WorkflowTemplate(
        name=VERIFY_TEMPLATE,
        namespace=site.namespaces.control,
        labels={LABEL_PART_OF: "fabrique", LABEL_MANAGED_BY: "fabrique"},
        annotations={
            "workflows.argoproj.io/description": (
                "Look at an environment after a promotion until its verdict; roll back or "
                "hold on failure."
            )
        },
        entrypoint="main",
        arguments=[Parameter(name=name) for name in VERIFY_PARAMETERS],
        service_account_name=SERVICE_ACCOUNT,  # its token reads Applications and pods
        executor=executor(),
        workflow_metadata=m.WorkflowMetadata(
            labels={LABEL_PART_OF: "fabrique"},
            labels_from={LABEL_APP: m.LabelValueFrom(expression="workflow.parameters.app")},
        ),
        synchronization=m.Synchronization(mutexes=[m.Mutex(name=f"fabrique-verify-{APP}-{ENV}")]),
        active_deadline_seconds=verify_deadline(site, site.looked_by_workflow()),
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        ttl_strategy=m.TTLStrategy(seconds_after_success=86400, seconds_after_failure=604800),
        security_context=pod_security(),
        pod_spec_patch=executor_pod_patch(),
    ) as template:
        look = tools_step(
            site,
            "verify",
            ["verify", "--app", APP, "--env", ENV, "--wait", "--in-cluster"],
            labels=POD_LABELS | {LABEL_APP: APP},
            extra_env=git["extra_env"],
            extra_volumes=git.get("extra_volumes"),
            retry_strategy=retry(site),
        )
        with Steps(name="main"):
            look()
    return template


# `hera generate yaml pipelines/` finds this object, where the site has such an
# environment (as `fabrique render`, which calls verify_template() with its site)
_SITE = site_from_env()
workflow_template = verify_template(_SITE) if _SITE.looked_by_workflow() else None
