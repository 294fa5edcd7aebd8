"""WorkflowTemplate ``fabrique-build``: what runs where. No business logic lives here.

A build is **one pod**, the ``run`` step: an Argo ``containerSet`` whose containers run
in order, each held by Argo's executor until the one before it has ended well:

    plan ─► checkout ─► build ─► verify-digest ─► [sign] ─► write-back ─► main
    tools   git         rootless tools             tools     tools         tools
     └─► report-pending BuildKit

- ``plan`` (``fabrique plan``) checks the revision and resolves the app from the site
  ConfigMap; a bad revision or an unknown app fails the build here. It also decides
  whether anything under the app's context changed since the deployed revision: if not,
  every later container ends at once, and BuildKit never starts (``force=true``
  overrides). Its outputs are files of the ``plan`` volume, which every later container
  reads and none but ``plan`` can write.
- ``report-pending`` posts ``pending`` on the commit (``skipped``'s ``success`` when the
  plan skips), beside the checkout; it never fails the build.
- ``checkout`` clones the code repo at the revision, sparse to the app's context, into
  the pod's ``workspace``.
- ``build`` runs rootless BuildKit (``buildctl-daemonless.sh``) and pushes
  ``<registry>/<image>:<sha12>``; it is the only container with an Unconfined profile,
  and the pod never lands on a control-plane node.
- ``verify-digest`` (``fabrique digest verify``) compares buildctl's metadata with the
  registry and writes the digest into the ``verified`` volume, which the build
  container does not mount.
- ``sign`` (``fabrique sign``, only with ``signing``) signs the digest with cosign, the
  key mounted in this container alone (never in the build, which runs the app's own
  Dockerfile).
- ``write-back`` (``fabrique writeback``) writes that digest into the app's target in
  Git: changed, unchanged (a replay), superseded (never a rollback), held or frozen
  (a freeze window: ``freeze[]``); with
  ``signing`` it refuses a digest whose signature does not verify. A build a push asked
  for with its other builds into one repository and branch (the ``group`` parameter,
  ``writeback.batch``) writes nothing (``grouped``): the push's Workflow writes them
  all in one commit and posts their statuses (``fabrique writeback-group``).
- ``main`` posts the ``success`` status and holds the pod's outputs (Argo reads a
  containerSet's outputs from its ``main`` container alone): the write-back's outcome
  and commit, and the verified digest, the record the safety net trusts.

After the pod, when its write-back wrote a new digest into the app's first environment
and that environment's Argo CD runs in this cluster (``targets.<name>.inCluster``), the
``verify-deploy`` step (its own pod, ``fabrique verify --wait --in-cluster``) looks at
it until the verdict: the fast path of the verification (docs/DESIGN.md, "After a
deploy"). Its account is the namespace's one token, reading those Applications and
listing their pods; its verdict is its own status, never the build's.

A container that fails ends the pod: the ones after it never run (Argo's executor
ends them with code 64, "dependency … exited with non-zero code"), so nothing is
written after a failed verify. Each container retries what a later attempt may fix, and
that only: exit 75 (a server or the network did not answer), ``build.retries`` times
with a doubling pause (``RETRYING``); a wrong answer is never retried. A lost pod
(deleted, preempted, evicted for its node's sake) is made again by the ``run`` step's
retryStrategy. Why one pod, and how the air-gap's split holds in it: docs/DESIGN.md.

The exit handler's ``report-failure`` (``onExit``, so that a deadline, an OOM or a
failed container still reports) posts the failure when the Workflow did not succeed; it
is the one other pod, and only a failed build makes it. Each path posts exactly one
terminal status. A report never fails the build: the reconciler repairs a status that
could not be posted.

Template metrics (``metrics.prometheus``, prefixed ``argo_workflows_`` by the
controller): the build's duration per app (the ``run`` step, every attempt), and the
write-back outcomes per app.

Step values reach the shell scripts as environment variables or files, never spliced
into the script text, so a parameter cannot inject shell.
"""

from __future__ import annotations

from typing import Any

from hera.workflows import (
    Container,
    ContainerNode,
    ContainerSet,
    Parameter,
    SecretEnv,
    Steps,
    WorkflowTemplate,
)
from hera.workflows import models as m

from fabrique.clients.git import TRANSIENT_ERE
from fabrique.decisions.signature import KEY_FILE, SIGNING_MOUNT
from fabrique.site.config import Site
from fabrique.site.errors import TRANSIENT_EXIT_CODE, TRANSIENT_SAID
from fabrique.site.names import (
    GROUP_PARAMETER,
    LABEL_APP,
    LABEL_MANAGED_BY,
    LABEL_PART_OF,
    LABEL_REVISION,
    SHORT_SHA_LEN,
    SITE_CONFIGMAP,
    TEMPLATE_NAME,
    VERIFIED_BY,
    VERIFIED_OUTPUT,
    VERIFY_STAGE,
)

from . import site_from_env
from .steps import (
    LOG_TAIL_ON_ERROR,
    POD_LOST,
    SITE_MOUNT,
    WRITEBACK_SIGNING_MOUNT,
    backoff,
    env,
    executor,
    executor_pod_patch,
    pod_security,
    resources,
    restricted,
    retry,
    site_sources,
    token,
    tools_step,
    verify_deadline,
    writes_git,
)

SERVICE_ACCOUNT = "fabrique-build"
BUILDKITD_CONFIGMAP = "fabrique-buildkitd"
RUN_STEP = VERIFIED_BY  # the one step of ``main``: the build's pod
WORKSPACE = "/workspace"
BUILDKIT_CONFIG_DIR = "/home/user/.config/buildkit"
BUILDKIT_STATE_DIR = "/home/user/.local/share/buildkit"
METADATA_FILE = f"{WORKSPACE}/build-metadata.json"
# The plan's decision and parameters: written by ``plan``, read-only everywhere else.
PLAN_DIR = "/fabrique/plan"
PLAN_OUTPUTS = (
    *("image-ref", "cache-ref", "repo-url", "context", "dockerfile", "build-opts"),
    *("build", "reason"),
)
# What the tools containers hand on after the build: the verified digest, the
# write-back's outcome and commit. The build and checkout containers do not mount it.
VERIFIED_DIR = "/fabrique/verified"
DIGEST_FILE = f"{VERIFIED_DIR}/digest"
WRITEBACK_DIR = f"{VERIFIED_DIR}/writeback"
WRITEBACK_OUTPUTS = ("outcome", "commit")
# ``main``'s outputs when it did not run (an earlier container failed, or the plan
# skipped): every output has a value, so the metrics and the reconciler read one.
NO_OUTCOME = "none"
BUILD_INPUTS = ("image-ref", "cache-ref", "context", "dockerfile", "build-opts")
EXIT_HANDLER = "exit-handler"
# ``main``: the build (its pod, and its duration's metric), then the verification of the
# environment its write-back wrote into, when its Argo CD runs in this cluster
BUILD_STEPS = "build"
VERIFY_DEPLOY_STEP = "verify-deploy"
VERIFY_OUTPUT = "verify"  # the write-back's: the environment to verify, "" for none
VERIFIER_ACCOUNT = "fabrique-verifier"
BUILD_SECONDS_BUCKETS = (30, 60, 120, 300, 600, 900, 1800, 3600)
BUILDER_UID = 1000
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"

APP = "{{workflow.parameters.app}}"
REVISION = "{{workflow.parameters.revision}}"
FORCE = "{{workflow.parameters.force}}"
GROUP = "{{workflow.parameters.group}}"  # the push's Workflow that writes it, or ""
# the revision label holds the sha12 (a label value holds at most 63 characters, a
# SHA-256 commit 64); the whole revision is the Workflow's annotation and parameter
SHORT_REVISION_EXPRESSION = f"sprig.trunc({SHORT_SHA_LEN}, workflow.parameters.revision)"
POD_LABELS = {
    LABEL_APP: APP,
    LABEL_REVISION: "{{=" + SHORT_REVISION_EXPRESSION + "}}",
    LABEL_PART_OF: "fabrique",
}
STEP_LABEL = "fabrique.io/step"

# Every container's command: ``run`` (the stage's own script, in a subshell so that its
# ``exit`` ends only the attempt) is tried again while it exits 75 (a server or the
# network did not answer), ``$RETRIES`` times at most, the pause doubling from
# ``$BACKOFF_SECONDS``, as the steps' retryStrategy did when each stage was a pod. Any
# other code ends the container at once. ``$STAGE`` names the stage in the log.
RETRYING = f"""attempt=0
pause="${{BACKOFF_SECONDS:-10}}"
while :; do
  # called alone, not in `&&` or `||`, where the shell would ignore the stage's `set -e`
  run "$@"
  status=$?
  if [ "$status" -eq 0 ]; then exit 0; fi
  if [ "$status" -ne {TRANSIENT_EXIT_CODE} ] || [ "$attempt" -ge "${{RETRIES:-0}}" ]; then
    exit "$status"
  fi
  attempt=$((attempt + 1))
  echo "$STAGE: trying again in ${{pause}}s (retry $attempt of ${{RETRIES:-0}})" >&2
  sleep "$pause"
  pause=$((pause * 2))
done
"""
# A stage after the plan does nothing when the plan decided that nothing is to build.
PLANNED = """if [ "$(cat "$PLAN/build")" != true ]; then
  echo "$STAGE: nothing to do ($(cat "$PLAN/reason"))"
  exit 0
fi
"""


def staged(body: str, *, planned: bool = True) -> str:
    """The container script of a stage: ``body`` as the function ``run``, retried on 75
    (``RETRYING``), after the plan's go-ahead when ``planned``."""
    return (
        "set -u\n"
        + (PLANNED if planned else "")
        + "run() (\n"
        + body.rstrip("\n")
        + "\n)\n"
        + RETRYING
    )


CHECKOUT_SCRIPT = rf"""set -eu
REPO_URL="$(cat "$PLAN/repo-url")" CONTEXT="$(cat "$PLAN/context")"
DOCKERFILE="$(cat "$PLAN/dockerfile")"
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
        "# the plan's parameters, each one file, kept whole whatever it holds\n"
        'IMAGE_REF="$(cat "$PLAN/image-ref")" CACHE_REF="$(cat "$PLAN/cache-ref")"\n'
        'CONTEXT="$(cat "$PLAN/context")" DOCKERFILE="$(cat "$PLAN/dockerfile")"\n'
        'BUILD_OPTS="$(cat "$PLAN/build-opts")"\n'
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
    """Off the control plane: the builder never runs there (invariant 5), and its pod
    holds the builder."""
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


def _tool(
    site: Site,
    stage: str,
    args: list[str],
    *,
    extra_env: list[Any] | None = None,
    mounts: list[m.VolumeMount] | None = None,
    planned: bool = True,
    body: str = 'fabrique "$@"',
) -> ContainerNode:
    """A container of the tools image: ``fabrique <args>`` (or ``body``) as stage
    ``stage``, retried on 75, reading the site ConfigMap and the plan."""
    return ContainerNode(
        name=stage,
        image=site.images.tools,
        command=["sh", "-c", staged(body, planned=planned), stage],
        args=args,
        env=[
            *env(
                FABRIQUE_VALUES=f"{SITE_MOUNT}/site.yaml",
                STAGE=stage,
                PLAN=PLAN_DIR,
                RETRIES=str(site.build.retries),
            ),
            *(extra_env or []),
        ],
        volume_mounts=[
            m.VolumeMount(name="tmp", mount_path="/tmp"),
            m.VolumeMount(name=SITE_CONFIGMAP, mount_path=SITE_MOUNT, read_only=True),
            m.VolumeMount(name="plan", mount_path=PLAN_DIR, read_only=stage != "plan"),
            *(mounts or []),
        ],
        security_context=restricted(),
        # the containers run one after the other: each asks for little, the pod for
        # their sum (Argo's containerSet), and the build the most
        resources=resources("50m", "64Mi", "256Mi"),
        termination_message_policy=LOG_TAIL_ON_ERROR,
    )


VERIFIED_MOUNT = m.VolumeMount(name="verified", mount_path=VERIFIED_DIR)


def _sign(site: Site) -> ContainerNode:
    """``fabrique sign``: cosign with the key of ``signing.keySecret``, mounted in this
    container alone (never in the build, which runs the app's own Dockerfile)."""
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
    return _tool(
        site,
        "sign",
        [
            *("sign", "--app", APP, "--key", f"{SIGNING_MOUNT}/{KEY_FILE}"),
        ],
        extra_env=[*password, *env(DIGEST_FILE=DIGEST_FILE)],
        body='fabrique "$@" --digest "$(cat "$DIGEST_FILE")"',
        mounts=[
            VERIFIED_MOUNT,
            m.VolumeMount(name="signing-key", mount_path=SIGNING_MOUNT, read_only=True),
        ],
    )


def _volumes(site: Site) -> list[Any]:
    """The pod's volumes. The workspace is the pod's own now (one pod, no claim): the
    checkout writes it, the build and verify read it. ``plan`` and ``verified`` carry
    what the stages hand on; the build container mounts ``plan`` read-only and never
    ``verified``."""
    volumes: list[Any] = [
        m.Volume(
            name="workspace",
            empty_dir=m.EmptyDirVolumeSource(size_limit=m.Quantity(site.build.workspace_size)),
        ),
        # bounded: a runaway build is evicted instead of filling the node's disk
        m.Volume(
            name="buildkit-state",
            empty_dir=m.EmptyDirVolumeSource(size_limit=m.Quantity(site.build.state_size)),
        ),
        m.Volume(name="plan", empty_dir=m.EmptyDirVolumeSource(size_limit=m.Quantity("1Mi"))),
        m.Volume(name="verified", empty_dir=m.EmptyDirVolumeSource(size_limit=m.Quantity("1Mi"))),
        m.Volume(name="tmp", empty_dir=m.EmptyDirVolumeSource()),
        m.Volume(name="build-tmp", empty_dir=m.EmptyDirVolumeSource()),
        m.Volume(
            name=SITE_CONFIGMAP,
            projected=m.ProjectedVolumeSource(sources=site_sources(site)),
        ),
        m.Volume(
            name=BUILDKITD_CONFIGMAP,
            config_map=m.ConfigMapVolumeSource(name=BUILDKITD_CONFIGMAP),
        ),
    ]
    if site.signing.enabled:
        secret = site.signing.key_secret
        assert secret is not None
        volumes.append(
            m.Volume(
                name="signing-key",
                secret=m.SecretVolumeSource(
                    secret_name=secret.name,
                    items=[m.KeyToPath(key=secret.key, path=KEY_FILE)],
                    default_mode=0o400,
                ),
            )
        )
    signing = site.writeback.signing
    if signing is not None:
        volumes.append(
            m.Volume(
                name="writeback-signing-key",
                secret=m.SecretVolumeSource(
                    secret_name=signing.key_secret.name,
                    items=[m.KeyToPath(key=signing.key_secret.key, path="key")],
                    default_mode=0o400,
                ),
            )
        )
    return volumes


# a write-back that fails says so in its outcome, which the metrics count
WRITE_BACK_SCRIPT = """mkdir -p "$WRITEBACK_DIR"
if [ -n "$GROUP" ]; then
  # the push's Workflow writes it with the push's other builds, and reports it
  printf grouped >"$WRITEBACK_DIR/outcome"
  echo "write-back: written with the push's other builds, by $GROUP"
  exit 0
fi
fabrique "$@" --digest "$(cat "$DIGEST_FILE")" --out "$WRITEBACK_DIR" || {
  status=$?
  printf failed >"$WRITEBACK_DIR/outcome"
  exit "$status"
}
"""
# ``main``: the success status, from the write-back's own outputs; a report that cannot
# be made never fails the build (the reconciler repairs it)
REPORT_SUCCESS_SCRIPT = """if [ "$(cat "$WRITEBACK_DIR/outcome")" = grouped ]; then
  echo "main: the push's Workflow posts the status once it wrote the digest"
  exit 0
fi
fabrique "$@" --digest "$(cat "$DIGEST_FILE")" \
  --outcome "$(cat "$WRITEBACK_DIR/outcome")" --commit "$(cat "$WRITEBACK_DIR/commit")" \
  || echo "main: the success status was not posted; the next reconcile pass repairs it" >&2"""
# ``report-pending``: pending when the plan builds, skipped's success when it does not
REPORT_PLAN_SCRIPT = """kind=skipped
if [ "$(cat "$PLAN/build")" = true ]; then kind=pending; fi
fabrique status-report "$kind" "$@" \
  || echo "report-pending: the status was not posted; the next reconcile pass repairs it" >&2"""


def _run(site: Site) -> ContainerSet:
    """The build's one pod: every stage a container, in order (see the module's text)."""
    workspace = m.VolumeMount(name="workspace", mount_path=WORKSPACE)
    report_args = ["--app", APP, "--revision", REVISION, "--workflow", "{{workflow.name}}"]
    with ContainerSet(
        name=RUN_STEP,
        # the one pod the NetworkPolicies let out to the Internet (TCP 443, allowlist)
        labels=POD_LABELS | {STEP_LABEL: "build"},
        volumes=_volumes(site),
        affinity=_no_control_plane(),
        # a lost pod is made again (deleted, preempted, evicted for its node's sake);
        # exit 75 is retried inside each container, a wrong answer never
        retry_strategy=m.RetryStrategy(
            limit=m.IntOrString(str(site.build.retries)),
            retry_policy="Always",
            expression=POD_LOST,
            backoff=backoff(),
        ),
        outputs=[
            Parameter(
                name=name,
                value_from=m.ValueFrom(path=f"{WRITEBACK_DIR}/{name}", default=default),
                global_name=global_name,
            )
            for name, default, global_name in (
                ("outcome", NO_OUTCOME, OUTCOME_GLOBAL),
                ("commit", "", None),
                (VERIFY_OUTPUT, "", None),
            )
        ]
        + [Parameter(name=VERIFIED_OUTPUT, value_from=m.ValueFrom(path=DIGEST_FILE, default=""))]
        # why the plan built or skipped, for `argo get` (a skip's only trace but its status)
        + [Parameter(name="reason", value_from=m.ValueFrom(path=f"{PLAN_DIR}/reason", default=""))],
    ) as run:
        plan = _tool(
            site,
            "plan",
            [
                *("plan", "--app", APP, "--revision", REVISION),
                *("--force", FORCE, "--out", PLAN_DIR),
            ],
            extra_env=[token(site)],
            planned=False,
        )
        report_pending = _tool(
            site,
            "report-pending",
            report_args,
            extra_env=[token(site)],
            planned=False,
            body=REPORT_PLAN_SCRIPT,
        )
        checkout = ContainerNode(
            name="checkout",
            image=site.images.git,
            command=["sh", "-c", staged(CHECKOUT_SCRIPT), "checkout"],
            env=[
                *env(
                    HOME="/tmp",
                    STAGE="checkout",
                    PLAN=PLAN_DIR,
                    RETRIES=str(site.build.retries),
                    WORKSPACE=WORKSPACE,
                    REVISION=REVISION,
                    GIT_TRANSIENT=TRANSIENT_ERE,
                ),
                SecretEnv(
                    name="GITEA_TOKEN",
                    secret_name=site.gitea.token_secret.name,
                    secret_key=site.gitea.token_secret.key,
                    optional=True,
                ),
            ],
            volume_mounts=[
                workspace,
                m.VolumeMount(name="tmp", mount_path="/tmp"),
                m.VolumeMount(name="plan", mount_path=PLAN_DIR, read_only=True),
            ],
            security_context=restricted(),
            resources=resources("100m", "128Mi", "1Gi"),
            termination_message_policy=LOG_TAIL_ON_ERROR,
        )
        build = ContainerNode(
            name="build",
            image=site.images.buildkit,
            command=["sh", "-c", staged(_build_script(site)), "build"],
            env=env(
                STAGE="build",
                PLAN=PLAN_DIR,
                RETRIES=str(site.build.retries),
                BUILDKITD_FLAGS="--oci-worker-no-process-sandbox",
                WORKSPACE=WORKSPACE,
                REVISION=REVISION,
                SOURCE_URL=site.gitea.repo_url(site.gitea.code_repo),
                METADATA_FILE=METADATA_FILE,
                BUILD_TRANSIENT=BUILD_TRANSIENT,
                **({"SBOM_GENERATOR": site.images.sbom_scanner or ""} if site.build.sbom else {}),
            ),
            volume_mounts=[
                workspace,
                m.VolumeMount(name="buildkit-state", mount_path=BUILDKIT_STATE_DIR),
                m.VolumeMount(
                    name=BUILDKITD_CONFIGMAP, mount_path=BUILDKIT_CONFIG_DIR, read_only=True
                ),
                # its own /tmp: nothing of the tools containers' scratch is shared with
                # the one container that runs the app's Dockerfile
                m.VolumeMount(name="build-tmp", mount_path="/tmp"),
                m.VolumeMount(name="plan", mount_path=PLAN_DIR, read_only=True),
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
            # the writable layer and the logs; the BuildKit state is the bounded volume
            resources=resources("500m", "1Gi", "4Gi", ephemeral_limit=site.build.ephemeral_limit),
            termination_message_policy=LOG_TAIL_ON_ERROR,
        )
        verify = _tool(
            site,
            VERIFY_STAGE,
            [
                *("digest", "verify", "--app", APP, "--revision", REVISION),
                *("--metadata", METADATA_FILE, "--output", DIGEST_FILE),
            ],
            mounts=[
                m.VolumeMount(name="workspace", mount_path=WORKSPACE, read_only=True),
                VERIFIED_MOUNT,
            ],
        )
        git = writes_git(site)
        write_back = _tool(
            site,
            "write-back",
            [
                *("writeback", "--app", APP, "--revision", REVISION),
                *("--workflow", "{{workflow.name}}"),
            ],
            extra_env=[
                *git["extra_env"],
                *env(DIGEST_FILE=DIGEST_FILE, WRITEBACK_DIR=WRITEBACK_DIR, GROUP=GROUP),
            ],
            mounts=[
                VERIFIED_MOUNT,
                *(
                    [
                        m.VolumeMount(
                            name="writeback-signing-key",
                            mount_path=WRITEBACK_SIGNING_MOUNT,
                            read_only=True,
                        )
                    ]
                    if site.writeback.signing is not None
                    else []
                ),
            ],
            body=WRITE_BACK_SCRIPT,
        )
        main = _tool(
            site,
            "main",
            ["status-report", "success", *report_args],
            extra_env=[
                token(site),
                *env(DIGEST_FILE=DIGEST_FILE, WRITEBACK_DIR=WRITEBACK_DIR),
            ],
            mounts=[VERIFIED_MOUNT],
            body=REPORT_SUCCESS_SCRIPT,
        )
        plan >> [report_pending, checkout]
        checkout >> build >> verify
        if site.signing.enabled:
            verify >> _sign(site) >> write_back
        else:
            verify >> write_back
        write_back >> main
    return run


def build_template(site: Site) -> WorkflowTemplate:
    """The ``fabrique-build`` WorkflowTemplate for ``site``."""
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
            # set by a push's plan when the push's Workflow writes this build's digest
            # with its other builds' (writeback.batch): its own write-back writes nothing
            Parameter(name=GROUP_PARAMETER, value=""),
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
        # the build's, and the verification's after it when there is one
        active_deadline_seconds=site.build.active_deadline_seconds
        + (verify_deadline(site, site.built_in_cluster()) or 0),
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        ttl_strategy=m.TTLStrategy(seconds_after_success=86400, seconds_after_failure=604800),
        security_context=pod_security(),
        pod_spec_patch=executor_pod_patch(),
        on_exit=EXIT_HANDLER,
    ) as template:
        run = _run(site)
        report_failure = _report_step(
            site,
            "report-failure",
            "failure",
            *("--workflow-status", "{{workflow.status}}"),
            *("--failures", "{{workflow.failures}}"),
        )
        # Argo emits a retried template's metrics for each failed attempt, and again for
        # the whole; a Steps template's once, when it ends: the build's duration is
        # counted on ``build``, whose {{duration}} spans every attempt of the pod (and
        # not the verification after it).
        with Steps(
            name=BUILD_STEPS,
            metrics=_build_metrics(),
            outputs=[
                Parameter(
                    name=VERIFY_OUTPUT,
                    value_from=m.ValueFrom(
                        parameter=f"{{{{steps.{RUN_STEP}.outputs.parameters.{VERIFY_OUTPUT}}}}}"
                    ),
                )
            ],
        ) as build:
            run(name=RUN_STEP)
        verify = _verify_deploy(site)
        with Steps(name="main"):
            build(name=BUILD_STEPS)
            if verify is not None:
                # a verdict of failure is the status it posts, not the build's: the
                # Workflow still succeeds (the pass looks again if this one could not)
                env_name = f"{{{{steps.{BUILD_STEPS}.outputs.parameters.{VERIFY_OUTPUT}}}}}"
                verify(
                    name=VERIFY_DEPLOY_STEP,
                    arguments=[Parameter(name=VERIFY_OUTPUT, value=env_name)],
                    when=f"'{env_name}' != ''",
                    continue_on=CONTINUE,
                )

        with Steps(name=EXIT_HANDLER, metrics=_writeback_outcome_metric()):
            # The exit handler reads Argo's own account of the run: {{workflow.status}}
            # is Succeeded, Failed or Error; {{workflow.failures}} the failed nodes.
            report_failure(when="{{workflow.status}} != Succeeded", continue_on=CONTINUE)
    return template


# a report that cannot be made never fails the build: the reconciler repairs the status
CONTINUE = m.ContinueOn(failed=True, error=True)


def _verify_deploy(site: Site) -> Container | None:
    """``fabrique verify --wait`` of the environment the write-back wrote into: the fast
    path of the verification (docs/DESIGN.md, "After a deploy"). Its own pod, after the
    build's, with the one token of the build namespace: its account reads the
    environments' Applications by name and lists their namespaces' pods, nothing else.
    A failure rolls back or holds through the write-back's path, hence the Git
    credentials."""
    bound = verify_deadline(site, site.built_in_cluster())
    if bound is None:
        return None
    env_name = f"{{{{inputs.parameters.{VERIFY_OUTPUT}}}}}"
    git = writes_git(site)
    return tools_step(
        site,
        VERIFY_DEPLOY_STEP,
        ["verify", "--app", APP, "--env", env_name, "--wait", "--in-cluster"],
        labels=POD_LABELS | {STEP_LABEL: VERIFY_DEPLOY_STEP},
        inputs=[Parameter(name=VERIFY_OUTPUT)],
        extra_env=git["extra_env"],
        extra_volumes=git.get("extra_volumes"),
        retry_strategy=retry(site),
        service_account_name=VERIFIER_ACCOUNT,
        automount_service_account_token=True,
        active_deadline_seconds=str(bound),
    )


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
                    "Duration of a build per app and final status, once per run: its pod"
                    " from the plan to the write-back, every attempt and the waits between."
                ),
                labels=[_label("app", APP), _label("status", "{{status}}")],
                histogram=m.Histogram(
                    buckets=[m.Amount(b) for b in BUILD_SECONDS_BUCKETS], value="{{duration}}"
                ),
            )
        ]
    )


# the run's outcome as a Workflow output: set from the pod's outputs (which have a value
# whatever became of it), read by the exit handler, which ends once per run
OUTCOME_GLOBAL = "writeback-outcome"
WRITEBACK_HELP = (
    "Write-back outcomes per app, one per run that reached the write-back: changed, "
    "unchanged, superseded, held, frozen (proposed, in-review or rejected) or failed."
)


def _writeback_outcome_metric() -> m.Metrics:
    """The write-back's outcome, counted by the exit handler: it ends once per run,
    whatever the run's fate, where a retried pod's template would count each attempt
    (Argo emits a retried template's metrics for each failed attempt and again for the
    whole: ``executeTemplate``, operator.go). A run whose write-back never started
    (a skipped plan, a failed build) counts nothing."""
    outcome = f"{{{{workflow.outputs.parameters.{OUTCOME_GLOBAL}}}}}"
    return m.Metrics(
        prometheus=[
            m.Prometheus(
                name="fabrique_writeback_total",
                help=WRITEBACK_HELP,
                labels=[_label("app", APP), _label("outcome", outcome)],
                when=f"{outcome} != {NO_OUTCOME}",
                counter=m.Counter(value="1"),
            )
        ]
    )


# `hera generate yaml pipelines/` finds this object; `fabrique render` calls
# build_template() with the site it was given.
workflow_template = build_template(site_from_env())
