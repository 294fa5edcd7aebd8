"""What the fabrique Workflow kinds share: the tools-image step and restricted pods.

``fabrique-build`` and ``fabrique-reconcile`` both run ``fabrique`` in the tools image,
with the site ConfigMap as ``FABRIQUE_VALUES``, the Gitea token from its Secret, and a
securityContext that Pod Security ``restricted`` admits.
"""

from __future__ import annotations

import json
from typing import Any

from hera.workflows import (
    Container,
    EmptyDirVolume,
    Env,
    Parameter,
    ProjectedVolume,
    RetryStrategy,
    SecretEnv,
    SecretVolume,
)
from hera.workflows import models as m

from fabrique.clients.git import SIGNING_KEY_ENV
from fabrique.clients.gitea import TOKEN_ENV
from fabrique.site.config import AppConfig, Environment, Site
from fabrique.site.errors import TRANSIENT_EXIT_CODE
from fabrique.site.names import SITE_CONFIGMAP

# A failed container's last log lines become its termination message, which Argo puts
# on the node: the exit handler's report then says why (fabrique's `error: …` line).
LOG_TAIL_ON_ERROR = "FallbackToLogsOnError"
SITE_MOUNT = "/etc/fabrique"
RUN_AS = 1000
# The account of the Argo executor (init and wait containers), in each namespace that
# runs Workflows: it may only report steps (workflowtaskresults). A pod whose main
# container needs no API mounts no token there; only the executor gets this one.
EXECUTOR_ACCOUNT = "fabrique-executor"
# the Secret Argo's controller mounts for it (see fabrique.render.executor_account)
EXECUTOR_TOKEN_SECRET = f"{EXECUTOR_ACCOUNT}.service-account-token"


def executor() -> m.ExecutorConfig:
    return m.ExecutorConfig(service_account_name=EXECUTOR_ACCOUNT)


def executor_pod_patch() -> str:
    """The ``podSpecPatch`` that gives Argo's own containers of every step pod, ``init``
    and ``wait``, the restricted container securityContext.

    The controller adds them with the securityContext of its ConfigMap's
    ``executor.securityContext`` (empty upstream), and Pod Security ``restricted``
    refuses a container without ``allowPrivilegeEscalation: false`` and
    ``capabilities.drop: [ALL]``: the control namespace's CronWorkflows would get no
    pod. The patch is applied after the controller adds them (``createWorkflowPod``,
    then ``util.ApplyPodSpecPatch``, a strategic merge keyed by container name), so the
    upstream controller ConfigMap stays as it ships. Every pod has both: ``init``
    always, ``wait`` for every container template."""
    context = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }
    return json.dumps(
        {
            "initContainers": [{"name": "init", "securityContext": context}],
            "containers": [{"name": "wait", "securityContext": context}],
        },
        sort_keys=True,
    )


def backoff() -> m.Backoff:
    """10 s, then doubling. No ``maxDuration``: Argo measures it from the first attempt's
    start and makes what is left of it the retry pod's deadline (``processNodeRetries``
    in workflow/controller/operator.go), so a step longer than it was never retried and
    a late retry was killed within seconds. ``limit`` and the Workflow's
    ``activeDeadlineSeconds`` bound the retries."""
    return m.Backoff(duration="10s", factor=m.IntOrString("2"))


def restricted(read_only_root: bool = True) -> m.SecurityContext:
    """The container securityContext of every step but the build: Pod Security restricted."""
    return m.SecurityContext(
        allow_privilege_escalation=False,
        capabilities=m.Capabilities(drop=["ALL"]),
        read_only_root_filesystem=read_only_root,
        run_as_non_root=True,
    )


def env(**values: str) -> list[Env]:
    return [Env(name=name, value=value) for name, value in values.items()]


def inputs(*names: str) -> list[Parameter]:
    return [Parameter(name=name) for name in names]


def resources(
    cpu: str, memory: str, memory_limit: str, *, ephemeral_limit: str | None = None
) -> m.ResourceRequirements:
    limits = {"memory": m.Quantity(memory_limit)}
    if ephemeral_limit:
        limits["ephemeral-storage"] = m.Quantity(ephemeral_limit)
    return m.ResourceRequirements(
        requests={"cpu": m.Quantity(cpu), "memory": m.Quantity(memory)}, limits=limits
    )


# The step's pod was lost before the step could answer: deleted or preempted (Argo marks
# the node Error, "pod deleted"), Argo's own init or wait container failed (Error), or
# the kubelet evicted it for its node's sake: pressure or shutdown (the pod's message,
# which Argo makes the node's: ``inferFailedReason``; the kubelet's words in
# pkg/kubelet/eviction/helpers.go and pkg/kubelet/nodeshutdown). An eviction for the pod's
# own excess (over its ephemeral-storage limit) and an OOM kill would only happen again:
# they are not retried.
POD_LOST = (
    'lastRetry.status == "Error"'
    ' || lastRetry.message contains "The node was low on resource"'
    ' || lastRetry.message contains "imminent node shutdown"'
)


def retry(site: Site) -> RetryStrategy:
    """Every step's retry policy: again only when trying again can help. A step says so
    with exit 75 (fabrique's and the checkout's and build's scripts, when a server was
    unreachable or answered 5xx); a wrong answer (a digest mismatch, a missing
    Dockerfile, a failing ``RUN``) is never retried. Argo evaluates the expression after
    the policy (``processNodeRetries``), over the last attempt (``lastRetry``)."""
    return RetryStrategy(
        limit=str(site.build.retries),
        retry_policy="Always",
        expression=f"asInt(lastRetry.exitCode) == {TRANSIENT_EXIT_CODE} || {POD_LOST}",
        backoff=backoff(),
    )


WRITEBACK_SIGNING_MOUNT = "/etc/fabrique/writeback-signing"


def writes_git(site: Site) -> dict[str, Any]:
    """What a step that writes back needs: the Gitea token, and with
    ``writeback.signing`` the SSH key that signs its commits (its Secret mounted in that
    step alone, read-only, its file named by FABRIQUE_WRITEBACK_SIGNING_KEY)."""
    signing = site.writeback.signing
    if signing is None:
        return {"extra_env": [token(site)]}
    secret = signing.key_secret
    return {
        "extra_env": [
            token(site),
            *env(**{SIGNING_KEY_ENV: f"{WRITEBACK_SIGNING_MOUNT}/key"}),
        ],
        "extra_volumes": [
            SecretVolume(
                name="writeback-signing-key",
                secret_name=secret.name,
                mount_path=WRITEBACK_SIGNING_MOUNT,
                items=[m.KeyToPath(key=secret.key, path="key")],
                default_mode=0o400,
                read_only=True,
            )
        ],
    }


def site_sources(site: Site) -> list[m.VolumeProjection]:
    """The site's ConfigMaps (``fabrique.site.files.site_files``), projected into one
    folder, ``SITE_MOUNT``: ``site.yaml`` and the files its ``appsFrom`` names."""
    from fabrique.site.files import site_files

    return [
        m.VolumeProjection(config_map=m.ConfigMapProjection(name=file.configmap))
        for file in site_files(site)
    ]


def token(site: Site) -> SecretEnv:
    """The Gitea token, from the Secret the site names."""
    return SecretEnv(
        name=TOKEN_ENV,
        secret_name=site.gitea.token_secret.name,
        secret_key=site.gitea.token_secret.key,
    )


def tools_step(
    site: Site,
    name: str,
    args: list[str],
    *,
    labels: dict[str, str],
    extra_env: list[Any] | None = None,
    extra_volumes: list[Any] | None = None,
    sizing: m.ResourceRequirements | None = None,
    **extra: Any,
) -> Container:
    """A step that runs ``fabrique <args>`` in the tools image, reading the site ConfigMap."""
    return Container(
        name=name,
        labels=labels,
        image=site.images.tools,
        command=["fabrique"],
        args=args,
        env=[*env(FABRIQUE_VALUES=f"{SITE_MOUNT}/site.yaml"), *(extra_env or [])],
        volumes=[
            EmptyDirVolume(name="tmp", mount_path="/tmp"),
            ProjectedVolume(
                name=SITE_CONFIGMAP,
                mount_path=SITE_MOUNT,
                read_only=True,
                sources=site_sources(site),
            ),
            *(extra_volumes or []),
        ],
        security_context=restricted(),
        resources=sizing or resources("50m", "64Mi", "256Mi"),
        termination_message_policy=LOG_TAIL_ON_ERROR,
        **extra,
    )


# beyond a verdict's own bound (verify.timeout and verify.soak), what a look's step may
# take to start and to post it
VERIFY_MARGIN_SECONDS = 120


def verify_deadline(site: Site, looked: list[tuple[AppConfig, Environment]]) -> int | None:
    """Seconds a step running ``fabrique verify --wait`` on any of ``looked`` may take:
    the longest verdict among them and a margin; None when there is none to look at."""
    if not looked:
        return None
    longest = max(site.verify_of(app, env).verdict_within() for app, env in looked)
    return int(longest.total_seconds()) + VERIFY_MARGIN_SECONDS


def pod_security() -> m.PodSecurityContext:
    """The pod securityContext of every fabrique Workflow: non-root, RuntimeDefault seccomp."""
    return m.PodSecurityContext(
        run_as_non_root=True,
        run_as_user=RUN_AS,
        run_as_group=RUN_AS,
        fs_group=RUN_AS,
        seccomp_profile=m.SeccompProfile(type="RuntimeDefault"),
    )
