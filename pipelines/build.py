"""WorkflowTemplate ``fabrique-build``: what runs where. No business logic lives here.

    plan ─► checkout ─► build ─► verify-digest ─► write-back
    tools    git         rootless   tools           tools
                         BuildKit

- ``plan`` (``fabrique plan``) checks the revision and resolves the app from the site
  ConfigMap; a bad revision or an unknown app fails the Workflow here. It also decides
  whether anything under the app's context changed since the deployed revision: if not,
  every later step is skipped (``force=true`` overrides).
- ``checkout`` clones the code repo at the revision, sparse to the app's context, into
  the Workflow's volume.
- ``build`` runs rootless BuildKit (``buildctl-daemonless.sh``) and pushes
  ``<registry>/<image>:<sha12>``; it is the only pod that needs an Unconfined profile,
  and it never lands on a control-plane node.
- ``verify-digest`` (``fabrique digest verify``) compares buildctl's metadata with the
  registry and outputs the digest.
- ``sign`` (``fabrique sign``, only with ``signing``) signs the digest with cosign, the
  key mounted from its Secret in this step alone.
- ``write-back`` (``fabrique writeback``) writes that digest into the app's target in
  Git: changed, unchanged (a replay), superseded (never a rollback) or held; with
  ``signing`` it refuses a digest whose signature does not verify.

Every step retries only what a later attempt may fix: exit 75 (a server or the network
did not answer) or a lost pod; a wrong answer is not retried.

Every run says on its commit in Gitea how it went (``fabrique status-report``, context
``fabrique/<app>``): ``report-pending`` beside the checkout, ``report-success`` after the
write-back, ``report-skipped`` when the plan skips, and the exit handler's
``report-failure`` (``onExit``, so that a deadline, an OOM or a failed step still
reports) when the Workflow did not succeed. Each path posts exactly one terminal status.
The report steps never fail the build (``continueOn``): the reconciler repairs a status
that could not be posted.

Template metrics (``metrics.prometheus``, prefixed ``argo_workflows_`` by the
controller): the build step's duration per app, and the write-back outcomes per app.

Step values reach the shell scripts as environment variables, never spliced into the
script text, so a parameter cannot inject shell.
"""

from __future__ import annotations

from typing import Any

from hera.workflows import (
    ConfigMapVolume,
    Container,
    EmptyDirVolume,
    Parameter,
    SecretEnv,
    SecretVolume,
    Step,
    Steps,
    Volume,
    WorkflowTemplate,
)
from hera.workflows import models as m

from fabrique.clients.git import TRANSIENT_ERE
from fabrique.decisions.signature import KEY_FILE, SIGNING_MOUNT
from fabrique.decisions.workflow import WORKSPACE_VOLUME
from fabrique.site.config import Site
from fabrique.site.errors import TRANSIENT_SAID
from fabrique.site.names import (
    LABEL_APP,
    LABEL_MANAGED_BY,
    LABEL_PART_OF,
    LABEL_REVISION,
    SHORT_SHA_LEN,
    TEMPLATE_NAME,
    VERIFIED_OUTPUT,
    VERIFY_STEP,
)

from . import site_from_env
from .steps import (
    LOG_TAIL_ON_ERROR,
    env,
    executor,
    executor_pod_patch,
    inputs,
    pod_security,
    resources,
    restricted,
    retry,
    token,
    tools_step,
    writes_git,
)

SERVICE_ACCOUNT = "fabrique-build"
BUILDKITD_CONFIGMAP = "fabrique-buildkitd"
WORKSPACE = "/workspace"
BUILDKIT_CONFIG_DIR = "/home/user/.config/buildkit"
BUILDKIT_STATE_DIR = "/home/user/.local/share/buildkit"
METADATA_FILE = f"{WORKSPACE}/build-metadata.json"
PLAN_DIR = "/tmp/fabrique/plan"
PLAN_OUTPUTS = (
    *("image-ref", "cache-ref", "repo-url", "context", "dockerfile", "build-opts"),
    *("build", "reason"),
)
DIGEST_FILE = "/tmp/fabrique/digest"
WRITEBACK_DIR = "/tmp/fabrique/writeback"
WRITEBACK_OUTPUTS = ("outcome", "commit")
BUILD_INPUTS = ("image-ref", "cache-ref", "context", "dockerfile", "build-opts")
EXIT_HANDLER = "exit-handler"
BUILD_SECONDS_BUCKETS = (30, 60, 120, 300, 600, 900, 1800, 3600)
BUILDER_UID = 1000
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"

APP = "{{workflow.parameters.app}}"
REVISION = "{{workflow.parameters.revision}}"
FORCE = "{{workflow.parameters.force}}"
# the revision label holds the sha12 (a label value holds at most 63 characters, a
# SHA-256 commit 64); the whole revision is the Workflow's annotation and parameter
SHORT_REVISION_EXPRESSION = f"sprig.trunc({SHORT_SHA_LEN}, workflow.parameters.revision)"
POD_LABELS = {
    LABEL_APP: APP,
    LABEL_REVISION: "{{=" + SHORT_REVISION_EXPRESSION + "}}",
    LABEL_PART_OF: "fabrique",
}
STEP_LABEL = "fabrique.io/step"

CHECKOUT_SCRIPT = rf"""set -eu
if [ -n "${{GITEA_TOKEN:-}}" ]; then
  # passed to git through the environment: never on a command line, never in a log
  export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=http.extraHeader
  export GIT_CONFIG_VALUE_0="Authorization: token ${{GITEA_TOKEN}}"
fi
src="$WORKSPACE/src"
rm -rf "$src"
# a SHA-256 repository (64-hex commit ids) needs a SHA-256 local repository
if [ "${{#REVISION}}" -eq 64 ]; then
  git init -q --object-format=sha256 "$src"
else
  git init -q "$src"
fi
cd "$src"
git remote add origin "$REPO_URL"
git sparse-checkout set --cone -- "$CONTEXT"
echo "checkout: fetching $REVISION (sparse: $CONTEXT)"
errors="$(mktemp)"
# remote WHAT GIT-ARGS...: a git command that talks to the server. A partial clone's
# checkout does too (it fetches the context's blobs), so both are judged alike: a server
# not reached is transient (75, retried); any other failure is final (3).
remote() {{
  what="$1"
  shift
  if ! git "$@" 2>"$errors"; then
    cat "$errors" >&2
    if grep -Eiq "$GIT_TRANSIENT" "$errors"; then
      echo "checkout: the git server was not reached: {TRANSIENT_SAID}" >&2
      exit 75
    fi
    echo "checkout: the git server refused to $what $REVISION" >&2
    exit 3
  fi
}}
remote fetch fetch -q --depth=1 --filter=blob:none origin "$REVISION"
remote "check out" -c advice.detachedHead=false checkout -q --detach FETCH_HEAD
head="$(git rev-parse HEAD)"
if [ "$head" != "$REVISION" ]; then
  echo "checkout: fetched $head, expected $REVISION" >&2
  exit 1
fi
if [ ! -f "$CONTEXT/$DOCKERFILE" ]; then
  echo "checkout: $CONTEXT/$DOCKERFILE not found at $REVISION" >&2
  exit 2
fi
echo "checkout: $REVISION ready in $src/$CONTEXT"
"""


# buildctl ends a failed build with "error: <cause>" (cmd/buildctl/main.go, handleErr);
# a registry's own error codes follow on the next lines (containerd joins them to the
# HTTP status: core/remotes/docker/errcode.go). A RUN that fails or a bad Dockerfile is
# the app's own failure and would fail the same way again. A registry or a network that
# did not answer (Go's and containerd's words) may answer a later attempt: exit 75, which
# the step retries. So may a push that lost a race in the registry: BuildKit pushes the
# image and the registry cache (<image>:buildcache) at once (solver.go: "Run image
# finalize and cache export in parallel"), both into the image's repository, and the
# Distribution registry rewrites a repository's blob link in place (truncate, write) at
# each mount or upload of a blob it already links: a read in between finds no link, and
# a HEAD answers 500, a manifest PUT "blob unknown to registry" or "provided digest did
# not match uploaded content". The attempt after finds the blobs linked.
BUILD_TRANSIENT = (
    r"failed to do request|connection refused|connection reset by peer|i/o timeout|"
    r"TLS handshake timeout|no such host|server misbehaving|unexpected EOF|"
    r"50[0234] (Internal|Bad|Service|Gateway)|429 Too Many Requests|"
    r"blob unknown to registry|provided digest did not match uploaded content"
)
RUN_FAILED = "did not complete successfully"
# The registry answered, in another protocol than buildkitd.toml says, or with a
# certificate it does not trust: the site's registry settings, which no retry changes,
# though Go words them as a failed request.
REGISTRY_MISCONFIGURED = ("server gave HTTP response to HTTPS client", "x509: ")
# `set -e` would end the pipeline's left side at buildctl's failure: its status is
# kept by && and ||, which -e leaves alone.
BUILD_OUTCOME = f"""log="$(mktemp)" code="$(mktemp)"
{{ buildctl-daemonless.sh "$@" 2>&1 && status=0 || status=$?; echo "$status" >"$code"; }} \\
  | tee "$log"
status="$(cat "$code")"
if [ "$status" -ne 0 ]; then
  # the last "error: " line and the registry's words after it
  cause="$(awk '/^error: /{{c=""; f=1}} f{{c=c $0 "\\n"}} END{{printf "%s", c}}' "$log")"
  case "$cause" in
  *"{RUN_FAILED}"* | {" | ".join(f'*"{words}"*' for words in REGISTRY_MISCONFIGURED)}) ;;
  *)
    if printf '%s\\n' "$cause" | grep -Eiq "$BUILD_TRANSIENT"; then
      echo "build: the registry or the network did not answer: {TRANSIENT_SAID}" >&2
      exit 75
    fi
    ;;
  esac
fi
exit "$status"
"""


def _build_script(site: Site) -> str:
    cache = (
        '  --export-cache "type=registry,ref=$CACHE_REF,mode=max" \\\n'
        '  --import-cache "type=registry,ref=$CACHE_REF" \\\n'
        if site.build.cache
        else ""
    )
    # Off by default: with attestations BuildKit pushes an index, and the index digest
    # is what gets deployed. An empty "attest:provenance=" would turn provenance ON.
    # The context is a local directory, so BuildKit cannot tell its commit: vcs:* puts the
    # revision and the repository into the provenance, where verify-digest checks them.
    attest = (
        '  --opt "attest:provenance=mode=max" \\\n'
        '  --opt "vcs:source=$SOURCE_URL" --opt "vcs:revision=$REVISION" \\\n'
        if site.build.attestations
        else ""
    )
    if site.build.sbom:
        # the scanner image runs inside BuildKit: it must come from the internal registry
        attest += '  --opt "attest:sbom=generator=$SBOM_GENERATOR" \\\n'
    return (
        "set -eu\n"
        'src="$WORKSPACE/src/$CONTEXT"\n'
        'dockerfile_dir="$(dirname "$src/$DOCKERFILE")"\n'
        "set -- build --frontend dockerfile.v0 \\\n"
        '  --local "context=$src" --local "dockerfile=$dockerfile_dir" \\\n'
        '  --opt "filename=$(basename "$DOCKERFILE")" \\\n'
        '  --opt "label:org.opencontainers.image.revision=$REVISION" \\\n'
        '  --opt "label:org.opencontainers.image.source=$SOURCE_URL" \\\n'
        '  --output "type=image,name=$IMAGE_REF,push=true" \\\n'
        f"{cache}{attest}"
        '  --metadata-file "$METADATA_FILE"\n'
        "# one build arg per line, each kept whole whatever it contains\n"
        "while IFS= read -r opt; do\n"
        '  if [ -n "$opt" ]; then set -- "$@" --opt "$opt"; fi\n'
        "done <<EOF\n"
        "$BUILD_OPTS\n"
        "EOF\n"
        'echo "build: $IMAGE_REF from $CONTEXT at $REVISION"\n'
        f"{BUILD_OUTCOME}"
    )


def buildkitd_toml(site: Site) -> str:
    """buildkitd.toml: plain HTTP for the site registry, keyed by its exact host:port."""
    if not site.registry.plain_http:
        return "# the registry is served over HTTPS: no override needed\n"
    # `http = true` alone: since BuildKit v0.23 `insecure` means HTTPS with an
    # unverified certificate, and must not be combined with plain HTTP.
    return f'[registry."{site.registry.host}"]\n  http = true\n'


def _no_control_plane() -> m.Affinity:
    """Off the control plane: the builder never runs there (invariant 5), and neither does
    any other pod of the workspace claim. A ReadWriteOnce claim of a WaitForFirstConsumer
    class is bound on the node of its first pod (the scheduler's VolumeBinding plugin),
    and a local volume's node affinity then holds every later pod to that node: a checkout
    on a schedulable control-plane node would leave the build unschedulable for good."""
    return m.Affinity(
        node_affinity=m.NodeAffinity(
            required_during_scheduling_ignored_during_execution=m.NodeSelector(
                node_selector_terms=[
                    m.NodeSelectorTerm(
                        match_expressions=[
                            m.NodeSelectorRequirement(
                                key=CONTROL_PLANE_LABEL, operator="DoesNotExist"
                            )
                        ]
                    )
                ]
            )
        )
    )


def _sign_step(site: Site) -> Container:
    """``fabrique sign``: cosign with the key of ``signing.keySecret``, mounted in this
    step alone (never in the build, which runs the app's own Dockerfile)."""
    secret = site.signing.key_secret
    assert secret is not None
    password = (
        [
            SecretEnv(
                name="COSIGN_PASSWORD",
                secret_name=secret.name,
                secret_key=site.signing.password_key,
            )
        ]
        if site.signing.password_key
        else []
    )
    return tools_step(
        site,
        "sign",
        [
            *("sign", "--app", APP, "--digest", "{{inputs.parameters.digest}}"),
            *("--key", f"{SIGNING_MOUNT}/{KEY_FILE}"),
        ],
        labels=POD_LABELS,
        extra_env=password,
        extra_volumes=[
            SecretVolume(
                name="signing-key",
                secret_name=secret.name,
                mount_path=SIGNING_MOUNT,
                items=[m.KeyToPath(key=secret.key, path=KEY_FILE)],
                default_mode=0o400,
                read_only=True,
            )
        ],
        inputs=inputs("digest"),
        retry_strategy=retry(site),
    )


def build_template(site: Site) -> WorkflowTemplate:
    """The ``fabrique-build`` WorkflowTemplate for ``site``."""
    workspace = Volume(
        name=WORKSPACE_VOLUME,  # its claim: <workflow>-workspace (workflow.workspace_claim)
        mount_path=WORKSPACE,
        access_modes=["ReadWriteOnce"],
        size=site.build.workspace_size,
        storage_class_name=site.build.storage_class_name,
    )
    tmp = EmptyDirVolume(name="tmp", mount_path="/tmp")

    with WorkflowTemplate(
        name=TEMPLATE_NAME,
        namespace=site.namespaces.build,
        labels={LABEL_PART_OF: "fabrique", LABEL_MANAGED_BY: "fabrique"},
        annotations={
            "workflows.argoproj.io/description": (
                "Build an app at a commit with rootless BuildKit, push it, verify its digest."
            )
        },
        entrypoint="main",
        arguments=[
            Parameter(name="app"),
            Parameter(name="revision"),
            Parameter(name="force", value="false"),
        ],
        service_account_name=SERVICE_ACCOUNT,
        # No step's own container talks to the Kubernetes API: none gets a token (the
        # build, the least confined, least of all). The executor reports with its own.
        automount_service_account_token=False,
        executor=executor(),
        workflow_metadata=m.WorkflowMetadata(
            labels={LABEL_PART_OF: "fabrique"},
            labels_from={
                LABEL_APP: m.LabelValueFrom(expression="workflow.parameters.app"),
                LABEL_REVISION: m.LabelValueFrom(expression=SHORT_REVISION_EXPRESSION),
            },
        ),
        # Builds of one app run one at a time; other apps build in parallel.
        synchronization=m.Synchronization(mutexes=[m.Mutex(name="fabrique-build-" + APP)]),
        active_deadline_seconds=site.build.active_deadline_seconds,
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        ttl_strategy=m.TTLStrategy(seconds_after_success=86400, seconds_after_failure=604800),
        volume_claim_gc=m.VolumeClaimGC(strategy="OnWorkflowCompletion"),
        security_context=pod_security(),
        pod_spec_patch=executor_pod_patch(),
        on_exit=EXIT_HANDLER,
    ) as template:
        plan = tools_step(
            site,
            "plan",
            [
                *("plan", "--app", APP, "--revision", REVISION),
                *("--force", FORCE, "--out", PLAN_DIR),
            ],
            labels=POD_LABELS,
            extra_env=[token(site)],
            retry_strategy=retry(site),
            outputs=[
                Parameter(name=name, value_from=m.ValueFrom(path=f"{PLAN_DIR}/{name}"))
                for name in PLAN_OUTPUTS
            ],
        )
        checkout = Container(
            name="checkout",
            labels=POD_LABELS,
            image=site.images.git,
            command=["sh", "-c", CHECKOUT_SCRIPT],
            inputs=inputs("repo-url", "context", "dockerfile"),
            env=[
                *env(
                    HOME="/tmp",
                    WORKSPACE=WORKSPACE,
                    REVISION=REVISION,
                    REPO_URL="{{inputs.parameters.repo-url}}",
                    CONTEXT="{{inputs.parameters.context}}",
                    DOCKERFILE="{{inputs.parameters.dockerfile}}",
                    GIT_TRANSIENT=TRANSIENT_ERE,
                ),
                SecretEnv(
                    name="GITEA_TOKEN",
                    secret_name=site.gitea.token_secret.name,
                    secret_key=site.gitea.token_secret.key,
                    optional=True,
                ),
            ],
            volumes=[workspace, tmp],
            security_context=restricted(),
            resources=resources("100m", "128Mi", "1Gi"),
            retry_strategy=retry(site),
            termination_message_policy=LOG_TAIL_ON_ERROR,
            # the workspace claim binds on its first pod's node: keep to the build's nodes
            affinity=_no_control_plane(),
        )
        build = Container(
            name="build",
            # the one pod the NetworkPolicies let out to the Internet (TCP 443, allowlist)
            labels=POD_LABELS | {STEP_LABEL: "build"},
            image=site.images.buildkit,
            command=["sh", "-c", _build_script(site)],
            inputs=inputs(*BUILD_INPUTS),
            env=env(
                BUILDKITD_FLAGS="--oci-worker-no-process-sandbox",
                WORKSPACE=WORKSPACE,
                REVISION=REVISION,
                SOURCE_URL=site.gitea.repo_url(site.gitea.code_repo),
                METADATA_FILE=METADATA_FILE,
                IMAGE_REF="{{inputs.parameters.image-ref}}",
                CACHE_REF="{{inputs.parameters.cache-ref}}",
                CONTEXT="{{inputs.parameters.context}}",
                DOCKERFILE="{{inputs.parameters.dockerfile}}",
                BUILD_OPTS="{{inputs.parameters.build-opts}}",
                BUILD_TRANSIENT=BUILD_TRANSIENT,
                **({"SBOM_GENERATOR": site.images.sbom_scanner or ""} if site.build.sbom else {}),
            ),
            volumes=[
                workspace,
                # bounded: a runaway build is evicted instead of filling the node's disk
                EmptyDirVolume(
                    name="buildkit-state",
                    mount_path=BUILDKIT_STATE_DIR,
                    size_limit=m.Quantity(site.build.state_size),
                ),
                ConfigMapVolume(
                    name=BUILDKITD_CONFIGMAP, mount_path=BUILDKIT_CONFIG_DIR, read_only=True
                ),
            ],
            # Rootless BuildKit needs user namespaces: seccomp and AppArmor Unconfined,
            # on this container only. Not privileged. newuidmap is setuid, so privilege
            # escalation and the file capabilities it relies on stay allowed here.
            security_context=m.SecurityContext(
                run_as_user=BUILDER_UID,
                run_as_group=BUILDER_UID,
                run_as_non_root=True,
                seccomp_profile=m.SeccompProfile(type="Unconfined"),
                app_armor_profile=m.AppArmorProfile(type="Unconfined"),
            ),
            affinity=_no_control_plane(),
            # the writable layer and the logs; the BuildKit state is the bounded volume
            resources=resources("500m", "1Gi", "4Gi", ephemeral_limit=site.build.ephemeral_limit),
            retry_strategy=retry(site),
            termination_message_policy=LOG_TAIL_ON_ERROR,
        )
        verify = tools_step(
            site,
            VERIFY_STEP,
            [
                *("digest", "verify", "--app", APP, "--revision", REVISION),
                *("--metadata", METADATA_FILE, "--output", DIGEST_FILE),
            ],
            labels=POD_LABELS,
            volume_mounts=[
                m.VolumeMount(name=WORKSPACE_VOLUME, mount_path=WORKSPACE, read_only=True)
            ],
            affinity=_no_control_plane(),
            retry_strategy=retry(site),
            outputs=[Parameter(name=VERIFIED_OUTPUT, value_from=m.ValueFrom(path=DIGEST_FILE))],
        )
        sign = _sign_step(site) if site.signing.enabled else None
        write_back = tools_step(
            site,
            "write-back",
            [
                *("writeback", "--app", APP, "--revision", REVISION),
                *("--digest", "{{inputs.parameters.digest}}", "--workflow", "{{workflow.name}}"),
                *("--out", WRITEBACK_DIR),
            ],
            labels=POD_LABELS,
            **writes_git(site),
            inputs=inputs("digest"),
            retry_strategy=retry(site),
            outputs=[
                Parameter(name=name, value_from=m.ValueFrom(path=f"{WRITEBACK_DIR}/{name}"))
                for name in WRITEBACK_OUTPUTS
            ],
        )
        report_pending = _report_step(site, "report-pending", "pending")
        report_skipped = _report_step(site, "report-skipped", "skipped")
        report_success = _report_step(
            site,
            "report-success",
            "success",
            *("--digest", "{{inputs.parameters.digest}}"),
            *("--outcome", "{{inputs.parameters.outcome}}"),
            *("--commit", "{{inputs.parameters.commit}}"),
            inputs=inputs("digest", "outcome", "commit"),
        )
        # The exit handler reads Argo's own account of the run: {{workflow.status}} is
        # Succeeded, Failed or Error; {{workflow.failures}} the JSON list of failed nodes.
        report_failure = _report_step(
            site,
            "report-failure",
            "failure",
            *("--workflow-status", "{{workflow.status}}"),
            *("--failures", "{{workflow.failures}}"),
        )

        # Argo emits a retried template's metrics for each failed attempt, and again for
        # the whole; a Steps template's once, when it ends. The counted steps run inside one.
        build_once = _once(build, BUILD_INPUTS, metrics=_build_metrics())
        write_back_once = _once(
            write_back, ("digest",), WRITEBACK_OUTPUTS, metrics=_writeback_failed_metric()
        )
        report_success_once = _once(
            report_success, ("digest", *WRITEBACK_OUTPUTS), metrics=_writeback_outcome_metric()
        )

        with Steps(name="main") as main:
            planned = plan()
            assert isinstance(planned, Step)
            # nothing under the app's context changed: the Workflow succeeds having
            # built and written nothing
            built = planned.get_parameter("build").value
            changed, unchanged = f"{built} == true", f"{built} == false"
            with main.parallel():
                report_skipped(when=unchanged, continue_on=CONTINUE)
                report_pending(when=changed, continue_on=CONTINUE)
                checkout(
                    arguments={
                        name: planned.get_parameter(name).value
                        for name in ("repo-url", "context", "dockerfile")
                    },
                    when=changed,
                )
            build_once(
                name="build",
                arguments={name: planned.get_parameter(name).value for name in BUILD_INPUTS},
                when=changed,
            )
            verified = verify(when=changed)
            assert isinstance(verified, Step)
            digest = verified.get_parameter(VERIFIED_OUTPUT).value
            if sign is not None:
                sign(arguments={"digest": digest}, when=changed)
            written = write_back_once(name="write-back", arguments={"digest": digest}, when=changed)
            assert isinstance(written, Step)
            report_success_once(
                name="report-success",
                arguments={"digest": digest}
                | {name: written.get_parameter(name).value for name in WRITEBACK_OUTPUTS},
                when=changed,
                continue_on=CONTINUE,
            )

        with Steps(name=EXIT_HANDLER):
            report_failure(when="{{workflow.status}} != Succeeded", continue_on=CONTINUE)
    return template


# a report that cannot be made never fails the build: the reconciler repairs the status
CONTINUE = m.ContinueOn(failed=True, error=True)


def _report_step(site: Site, name: str, kind: str, *args: str, **extra: Any) -> Container:
    """A step that posts the commit status of this run (``fabrique status-report``)."""
    return tools_step(
        site,
        name,
        [
            *("status-report", kind, "--app", APP, "--revision", REVISION),
            *("--workflow", "{{workflow.name}}", *args),
        ],
        labels=POD_LABELS,
        extra_env=[token(site)],
        retry_strategy=retry(site),
        **extra,
    )


def _label(key: str, value: str) -> m.MetricLabel:
    return m.MetricLabel(key=key, value=value)


def _build_metrics() -> m.Metrics:
    return m.Metrics(
        prometheus=[
            m.Prometheus(
                name="fabrique_build_duration_seconds",
                help=(
                    "Duration of the BuildKit build step per app and final status, once per run:"
                    " every attempt and the waits between them."
                ),
                labels=[_label("app", APP), _label("status", "{{status}}")],
                histogram=m.Histogram(
                    buckets=[m.Amount(b) for b in BUILD_SECONDS_BUCKETS], value="{{duration}}"
                ),
            )
        ]
    )


WRITEBACK_HELP = (
    "Write-back outcomes per app, one per run that reached the write-back: changed, "
    "unchanged, superseded, held or failed."
)


def _writeback_failed_metric() -> m.Metrics:
    """``failed`` once per run whose write-back failed, all its attempts spent. A failed
    run has no outputs to name its outcome, so the other outcomes are counted where
    they are an input (``_writeback_outcome_metric``)."""
    return m.Metrics(
        prometheus=[
            m.Prometheus(
                name="fabrique_writeback_total",
                help=WRITEBACK_HELP,
                labels=[_label("app", APP), _label("outcome", "failed")],
                when="{{status}} != Succeeded",
                counter=m.Counter(value="1"),
            )
        ]
    )


def _writeback_outcome_metric() -> m.Metrics:
    """The outcome of a write-back that passed, counted by the step that reports it,
    whatever that report's own fate (it is an input there, always known)."""
    return m.Metrics(
        prometheus=[
            m.Prometheus(
                name="fabrique_writeback_total",
                help=WRITEBACK_HELP,
                labels=[_label("app", APP), _label("outcome", "{{inputs.parameters.outcome}}")],
                counter=m.Counter(value="1"),
            )
        ]
    )


def _once(
    step: Container,
    inputs_: tuple[str, ...],
    outputs: tuple[str, ...] = (),
    *,
    metrics: m.Metrics,
) -> Steps:
    """``<step>-once``: a Steps template that runs the retried ``step`` and carries its
    metrics. Argo emits a retried template's metrics for each failed attempt and for the
    whole (``executeTemplate``, operator.go: the last child while the retry node waits,
    then the retry node), but a Steps node's once, when it ends: its ``{{status}}`` is
    the step's final one and its ``{{duration}}`` spans every attempt."""
    name = str(step.name)
    with Steps(
        name=f"{name}-once",
        inputs=inputs(*inputs_),
        outputs=[
            Parameter(
                name=output,
                value_from=m.ValueFrom(
                    parameter=f"{{{{steps.{name}.outputs.parameters.{output}}}}}"
                ),
            )
            for output in outputs
        ],
        metrics=metrics,
    ) as wrapper:
        step(arguments={n: f"{{{{inputs.parameters.{n}}}}}" for n in inputs_})
    return wrapper


# `hera generate yaml pipelines/` finds this object; `fabrique render` calls
# build_template() with the site it was given.
workflow_template = build_template(site_from_env())
