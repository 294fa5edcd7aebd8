"""Invariants of the rendered fabrique-build template (DESIGN.md invariants 5 and 6)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fabrique.site.config import load_site
from fabrique.site.names import (
    LABEL_APP,
    LABEL_REVISION,
    VERIFIED_BY,
    VERIFIED_OUTPUT,
    VERIFY_STAGE,
)
from pipelines.build import PLANNED, RETRYING, build_template
from pipelines.steps import POD_LOST

from .conftest import ROOT
from .doubles.kube import BUILD_POD
from .manifests import documents, find, rendered_step, walk

TREE = ROOT / "manifests"


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return find(TREE, "WorkflowTemplate", "fabrique-build")


def _templates(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in template["spec"]["templates"]}


def _pods(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The templates that run a pod: the build's ``run`` and the exit handler's report."""
    return {name: t for name, t in _templates(template).items() if "steps" not in t}


def _containers(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The build pod's containers, by stage."""
    run = _templates(template)[VERIFIED_BY]
    return {c["name"]: c for c in run["containerSet"]["containers"]}


def _every_container(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every container fabrique's own code runs in: the pod's and the report's."""
    reports = {n: t["container"] for n, t in _pods(template).items() if "container" in t}
    return _containers(template) | reports


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts", [])}


def _script(container: dict[str, Any]) -> str:
    """A container's shell script: ``sh -c <script> <stage>``."""
    assert container["command"][:2] == ["sh", "-c"], container["name"]
    return str(container["command"][2])


def test_the_stages_run_in_order_in_one_pod(template: dict[str, Any]) -> None:
    templates = _templates(template)
    # the build (its pod); with no environment deployed by this cluster's Argo CD,
    # nothing after it (the verification: test_verify_deploy.py)
    assert templates["main"]["steps"] == [[{"name": "build", "template": "build"}]]
    assert templates["build"]["steps"] == [[{"name": "run", "template": "run"}]]
    assert "verify-deploy" not in templates
    dependencies = {
        name: (c.get("dependencies") or [None])[0] for name, c in _containers(template).items()
    }
    assert dependencies == {
        "plan": None,
        "report-pending": "plan",
        "checkout": "plan",
        "build": "checkout",
        "verify-digest": "build",
        "write-back": "verify-digest",
        "main": "write-back",
    }
    # the Kubernetes double's Workflow status runs the pod so
    assert dependencies == BUILD_POD
    assert all(len(c.get("dependencies") or []) <= 1 for c in _containers(template).values())
    assert template["spec"]["entrypoint"] == "main"
    assert template["spec"]["arguments"]["parameters"] == [
        {"name": "app"},
        {"name": "revision"},
        {"name": "force", "value": "false"},
        {"name": "group", "value": ""},
    ]


def test_build_container_is_rootless_buildkit(template: dict[str, Any]) -> None:
    container = _containers(template)["build"]
    assert re.fullmatch(
        r"moby/buildkit:v[0-9.]+-rootless(@sha256:[0-9a-f]{64})?", container["image"]
    )
    assert container["securityContext"] == {
        "appArmorProfile": {"type": "Unconfined"},
        "runAsGroup": 1000,
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "Unconfined"},
    }
    assert _env(container)["BUILDKITD_FLAGS"] == "--oci-worker-no-process-sandbox"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _templates(template)[VERIFIED_BY]["volumes"]}
    assert volumes[mounts["/home/user/.local/share/buildkit"]] == {
        "emptyDir": {"sizeLimit": "20Gi"},  # build.stateSize: a runaway build is evicted
        "name": "buildkit-state",
    }
    assert (
        volumes[mounts["/home/user/.config/buildkit"]]["configMap"]["name"] == "fabrique-buildkitd"
    )
    assert "buildctl-daemonless.sh" in _script(container)


def test_only_the_build_container_is_unconfined(template: dict[str, Any]) -> None:
    unconfined = [path for path, _, value in walk(template["spec"]) if value == "Unconfined"]
    build = next(
        i
        for i, c in enumerate(_templates(template)[VERIFIED_BY]["containerSet"]["containers"])
        if c["name"] == "build"
    )
    run = next(i for i, t in enumerate(template["spec"]["templates"]) if t["name"] == VERIFIED_BY)
    assert unconfined == [
        f".templates[{run}].containerSet.containers[{build}].securityContext.{key}.type"
        for key in ("appArmorProfile", "seccompProfile")
    ]
    assert template["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for name, container in _every_container(template).items():
        if name == "build":
            continue
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, name
        assert context["capabilities"] == {"drop": ["ALL"]}, name
        assert context["runAsNonRoot"] is True, name
        assert context["readOnlyRootFilesystem"] is True, name


def test_builder_never_runs_on_the_control_plane(template: dict[str, Any]) -> None:
    run = _templates(template)[VERIFIED_BY]
    terms = run["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}
            ]
        }
    ]
    assert not [path for path, key, _ in walk(template) if key in ("tolerations", "nodeName")]


def test_the_workspace_is_the_pods_own(template: dict[str, Any]) -> None:
    """One pod, no claim: the workspace is an emptyDir, bounded by build.workspaceSize."""
    spec = template["spec"]
    assert "volumeClaimTemplates" not in spec and "volumeClaimGC" not in spec
    assert not [path for path, key, _ in walk(template) if key == "persistentVolumeClaim"]
    volumes = {v["name"]: v for v in _templates(template)[VERIFIED_BY]["volumes"]}
    assert volumes["workspace"] == {"name": "workspace", "emptyDir": {"sizeLimit": "2Gi"}}
    writers = {n for n, c in _containers(template).items() if "workspace" in _mounts(c)}
    assert writers == {"checkout", "build", "verify-digest"}
    assert _mounts(_containers(template)["verify-digest"])["workspace"]["readOnly"] is True


def test_what_the_stages_hand_on_the_build_cannot_write(template: dict[str, Any]) -> None:
    """The plan's decision is read-only for every stage after it; the verified digest and
    the write-back's outcome live where the build container (the app's own Dockerfile,
    Unconfined) and the checkout never reach."""
    containers = _containers(template)
    for name, container in containers.items():
        plan = _mounts(container)["plan"]
        assert plan["mountPath"] == "/fabrique/plan", name
        assert plan.get("readOnly") is (name != "plan"), name
        assert _env(container)["PLAN"] == "/fabrique/plan", name
    verified = {n for n, c in containers.items() if "verified" in _mounts(c)}
    assert verified == {"verify-digest", "write-back", "main"}
    assert "verified" not in _mounts(containers["build"])
    assert "verified" not in _mounts(containers["checkout"])
    # the pod's volumes are all emptyDirs and configMaps (the site's projected into one
    # folder): nothing of the node's, no token
    for volume in _templates(template)[VERIFIED_BY]["volumes"]:
        assert set(volume) - {"name"} <= {"emptyDir", "configMap", "secret", "projected"}, volume
        for source in (volume.get("projected") or {}).get("sources", []):
            assert set(source) == {"configMap"}, volume


def test_nothing_is_privileged_and_nothing_mounts_the_host() -> None:
    for doc in documents(TREE):
        for path, key, value in walk(doc):
            assert not (key == "privileged" and value), f"{doc['kind']}{path}"
            assert key not in ("hostPath", "hostNetwork", "hostPID", "hostIPC"), (
                f"{doc['kind']}{path}"
            )


def test_buildkitd_toml_says_plain_http_for_the_registry_only() -> None:
    configmap = find(TREE, "ConfigMap", "fabrique-buildkitd")
    assert configmap["metadata"]["namespace"] == "fabrique-build"
    assert configmap["data"] == {"buildkitd.toml": '[registry."registry:80"]\n  http = true\n'}
    assert "insecure" not in configmap["data"]["buildkitd.toml"]


def test_https_registry_gets_no_http_override() -> None:
    site = load_site(env={"FABRIQUE_REGISTRY__PLAIN_HTTP": "false"})
    from pipelines.build import buildkitd_toml

    assert "http = true" not in buildkitd_toml(site)


def test_build_pushes_the_sha12_tag_with_metadata_cache_and_labels(
    template: dict[str, Any],
) -> None:
    script = _script(_containers(template)["build"])
    assert '--output "type=image,name=$IMAGE_REF,push=true"' in script
    assert '--metadata-file "$METADATA_FILE"' in script
    assert '--export-cache "type=registry,ref=$CACHE_REF,mode=max"' in script
    assert '--import-cache "type=registry,ref=$CACHE_REF"' in script
    assert '--opt "label:org.opencontainers.image.revision=$REVISION"' in script
    assert '--opt "label:org.opencontainers.image.source=$SOURCE_URL"' in script
    assert "attest" not in script, "attestations are off by default"
    # values come through the environment, never spliced into the script text
    assert "{{" not in script


def test_attestations_switch_turns_provenance_on() -> None:
    site = load_site(env={"FABRIQUE_BUILD__ATTESTATIONS": "true"})
    build = rendered_step(site, "build")
    script = _script(build)
    assert '--opt "attest:provenance=mode=max"' in script
    assert not re.search(r"attest:[a-z]+=[\"\s]", script), (
        "an empty attest value enables it silently"
    )
    # a local context has no commit BuildKit could see: the build names it for the provenance
    assert '--opt "vcs:source=$SOURCE_URL" --opt "vcs:revision=$REVISION"' in script
    assert "sbom" not in script
    assert "SBOM_GENERATOR" not in {e["name"] for e in build["env"]}


def test_sbom_switch_uses_the_mirrored_scanner_through_the_environment() -> None:
    scanner = "registry:80/buildkit-syft-scanner:1.4.0"
    site = load_site(
        env={
            "FABRIQUE_BUILD__ATTESTATIONS": "true",
            "FABRIQUE_BUILD__SBOM": "true",
            "FABRIQUE_IMAGES__SBOM_SCANNER": scanner,
        }
    )
    build = rendered_step(site, "build")
    script = _script(build)
    assert '--opt "attest:sbom=generator=$SBOM_GENERATOR"' in script
    assert scanner not in script, "values reach the script through the environment"
    assert {"name": "SBOM_GENERATOR", "value": scanner} in build["env"]


def test_labels_mutex_and_lifecycle(template: dict[str, Any]) -> None:
    spec = template["spec"]
    assert spec["synchronization"] == {
        "mutexes": [{"name": "fabrique-build-{{workflow.parameters.app}}"}]
    }
    assert spec["workflowMetadata"]["labelsFrom"] == {
        LABEL_APP: {"expression": "workflow.parameters.app"},
        # a label value holds at most 63 characters, a SHA-256 commit 64: the sha12
        LABEL_REVISION: {"expression": "sprig.trunc(12, workflow.parameters.revision)"},
    }
    assert set(_pods(template)) == {VERIFIED_BY, "report-failure"}
    for name, t in _pods(template).items():
        assert t["metadata"]["labels"][LABEL_APP] == "{{workflow.parameters.app}}", name
        assert (
            t["metadata"]["labels"][LABEL_REVISION]
            == "{{=sprig.trunc(12, workflow.parameters.revision)}}"
        ), name
    assert spec["activeDeadlineSeconds"] == 3600
    assert spec["podGC"]["strategy"] == "OnPodSuccess"
    assert spec["ttlStrategy"]["secondsAfterFailure"] >= spec["ttlStrategy"]["secondsAfterSuccess"]


def test_every_stage_retries_only_what_a_retry_may_fix(template: dict[str, Any]) -> None:
    """Exit 75 (a server or the network did not answer), in the stage's own container;
    a lost pod, by the ``run`` step. A digest mismatch, a missing Dockerfile, a failing
    RUN or an OOM kill is never retried."""
    run = _templates(template)[VERIFIED_BY]
    strategy = run["retryStrategy"]
    assert strategy["limit"] == "3"
    assert strategy["backoff"] == {"duration": "10s", "factor": "2"}
    assert strategy["expression"] == POD_LOST
    assert "exitCode" not in strategy["expression"]
    for name, container in _containers(template).items():
        assert _script(container).endswith(RETRYING), name
        assert container["command"][3:] == [name], name
        assert _env(container)["STAGE"] == name, name
        assert _env(container)["RETRIES"] == "3", name  # build.retries
        assert "BACKOFF_SECONDS" not in _env(container), name  # 10 s, doubling
    # the exit handler's report is its own pod, retried as every step was
    report = _templates(template)["report-failure"]["retryStrategy"]
    assert report["expression"] == f"asInt(lastRetry.exitCode) == 75 || {POD_LOST}"


def test_every_stage_after_the_plan_waits_for_its_go_ahead(template: dict[str, Any]) -> None:
    for name, container in _containers(template).items():
        # report-pending reads the plan to say pending or skipped
        assert (PLANNED in _script(container)) is (name not in ("plan", "report-pending")), name


def test_the_retries_follow_the_values() -> None:
    site = load_site(env={"FABRIQUE_BUILD__RETRIES": "5"})
    assert rendered_step(site, "build")["env"][2] == {"name": "RETRIES", "value": "5"}
    run = next(t for t in build_template(site).to_dict()["spec"]["templates"] if t["name"] == "run")
    assert run["retryStrategy"]["limit"] == "5"


def test_write_back_takes_the_verified_digest(template: dict[str, Any]) -> None:
    containers = _containers(template)
    verify = containers["verify-digest"]
    assert verify["args"][-2:] == ["--output", "/fabrique/verified/digest"]
    container = containers["write-back"]
    assert container["args"] == [
        *("writeback", "--app", "{{workflow.parameters.app}}"),
        *("--revision", "{{workflow.parameters.revision}}"),
        *("--workflow", "{{workflow.name}}"),
    ]
    # the script adds the digest verify-digest wrote, and where the outcome goes
    assert '--digest "$(cat "$DIGEST_FILE")" --out "$WRITEBACK_DIR"' in _script(container)
    env = _env(container)
    assert env["DIGEST_FILE"] == "/fabrique/verified/digest"
    assert env["WRITEBACK_DIR"] == "/fabrique/verified/writeback"
    assert env["FABRIQUE_GITEA_TOKEN"] == {
        "secretKeyRef": {"key": "token", "name": "fabrique-gitea"}
    }


def test_digest_is_verified_by_the_tools_image_and_exposed(template: dict[str, Any]) -> None:
    verify = _containers(template)[VERIFY_STAGE]
    assert verify["image"] == _containers(template)["plan"]["image"]  # the tools image
    assert verify["args"][:2] == ["digest", "verify"]
    # Argo reads a containerSet's outputs from its main container, which runs last
    outputs = _templates(template)[VERIFIED_BY]["outputs"]["parameters"]
    assert outputs == [
        {
            "name": "outcome",
            "globalName": "writeback-outcome",
            "valueFrom": {"path": "/fabrique/verified/writeback/outcome", "default": "none"},
        },
        {
            "name": "commit",
            "valueFrom": {"path": "/fabrique/verified/writeback/commit", "default": ""},
        },
        # the environment the build's own Workflow verifies next, "" for none
        {
            "name": "verify",
            "valueFrom": {"path": "/fabrique/verified/writeback/verify", "default": ""},
        },
        {
            "name": VERIFIED_OUTPUT,
            "valueFrom": {"path": "/fabrique/verified/digest", "default": ""},
        },
        # the plan's reason, for `argo get`: a skip leaves no other trace but its status
        {"name": "reason", "valueFrom": {"path": "/fabrique/plan/reason", "default": ""}},
    ]
    assert "verified" in _mounts(_containers(template)["main"])


def test_tokens_come_from_secrets_only() -> None:
    checkout_env = _env(_containers(find(TREE, "WorkflowTemplate", "fabrique-build"))["checkout"])
    assert checkout_env["GITEA_TOKEN"] == {
        "secretKeyRef": {"key": "token", "name": "fabrique-gitea", "optional": True}
    }
    for doc in documents(TREE):
        if doc["kind"] == "Secret":
            # only the executor's token Secrets, which Kubernetes fills: no value here
            assert doc["type"] == "kubernetes.io/service-account-token", doc["metadata"]
            assert "data" not in doc and "stringData" not in doc, doc["metadata"]
        for path, key, value in walk(doc):
            if (
                isinstance(key, str)
                and re.search(r"token|password|secret", key, re.I)
                and isinstance(value, str)
            ):
                pytest.fail(f"{doc['kind']}{path} holds a literal credential-looking value")


def test_build_namespace_is_the_only_privileged_one() -> None:
    levels = {
        doc["metadata"]["name"]: doc["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        for doc in documents(TREE)
        if doc["kind"] == "Namespace"
    }
    assert levels == {"fabrique": "restricted", "fabrique-build": "privileged"}


def test_no_step_of_the_build_holds_a_service_account_token(template: dict[str, Any]) -> None:
    """The build container (Unconfined, no process sandbox) must not be able to forge
    another Workflow's outputs: no token is mounted in any step's own container; only the
    Argo executor (init and wait) gets one, of an account that may only report steps."""
    spec = template["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["executor"] == {"serviceAccountName": "fabrique-executor"}
    for name, t in _templates(template).items():
        assert t.get("automountServiceAccountToken") is not True, name
        assert "serviceAccountName" not in t, name
    # the steps' own account holds no right at all
    assert spec["serviceAccountName"] == "fabrique-build"
    bindings = [
        d
        for d in documents(TREE)
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and any(s["name"] == "fabrique-build" for s in d["subjects"])
    ]
    assert bindings == []


def test_the_executor_account_may_only_report_task_results() -> None:
    for namespace in ("fabrique-build", "fabrique"):
        role = find(TREE, "Role", "fabrique-executor", namespace)
        assert role["rules"] == [
            {
                "apiGroups": ["argoproj.io"],
                "resources": ["workflowtaskresults"],
                "verbs": ["create", "patch"],
            }
        ]
        binding = find(TREE, "RoleBinding", "fabrique-executor", namespace)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "fabrique-executor", "namespace": namespace}
        ]


def test_tools_image_dockerfile_is_non_root_with_a_base_argument() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    first_from = next(i for i, line in enumerate(lines) if line.startswith("FROM"))
    assert any(line.startswith("ARG BASE_IMAGE=") for line in lines[:first_from])
    assert lines[first_from].startswith("FROM ${BASE_IMAGE}")
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] not in ("root", "0")


def test_tools_image_carries_cosign_pinned_by_digest() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "COPY --from=cosign /ko-app/cosign /usr/local/bin/cosign" in text
    check = next(line for line in text.splitlines() if "COSIGN_IMAGE must be pinned" in line)
    for image, ok in (
        ("ghcr.io/sigstore/cosign/cosign:v2.4.1", False),
        ("x:1@sha256:" + "a" * 64, True),
    ):
        script = check.removeprefix("RUN ").replace("${COSIGN_IMAGE}", image)
        assert (subprocess.run(["sh", "-c", script], capture_output=True).returncode == 0) is ok


def test_template_file_is_in_the_tree() -> None:
    assert (Path(TREE) / "build" / "workflowtemplate.yaml").is_file()


def test_the_build_pods_ephemeral_limit_holds_its_volumes() -> None:
    """The kubelet evicts a pod whose ephemeral use, emptyDirs and containers together,
    passes the sum of its containers' ephemeral-storage limits
    (``podEphemeralStorageLimitEviction`` in pkg/kubelet/eviction/eviction_manager.go):
    a limit under the BuildKit state volume's sizeLimit evicts every build that fills
    its cache. The build container's limit, the pod's only one, is the state volume, the
    workspace and its own scratch."""
    from fabrique.site.config import add_sizes

    template = find(TREE, "WorkflowTemplate", "fabrique-build")
    limits = {
        name: c["resources"]["limits"].get("ephemeral-storage")
        for name, c in _containers(template).items()
    }
    assert {name for name, limit in limits.items() if limit} == {"build"}
    volumes = {v["name"]: v for v in _templates(template)[VERIFIED_BY]["volumes"]}
    state = volumes["buildkit-state"]["emptyDir"]["sizeLimit"]
    workspace = volumes["workspace"]["emptyDir"]["sizeLimit"]
    assert (state, workspace) == ("20Gi", "2Gi")
    assert limits["build"] == add_sizes(add_sizes(state, workspace), "2Gi") == "24Gi"


def test_the_ephemeral_limit_follows_the_values(tmp_path: Path) -> None:
    from fabrique.site.config import add_sizes, load_site

    values = tmp_path / "site.yaml"
    values.write_text("build:\n  stateSize: 50Gi\n  workspaceSize: 1Gi\n  scratchSize: 512Mi\n")
    assert load_site(values, env={}).build.ephemeral_limit == "52736Mi"
    assert add_sizes("1Ti", "1Gi") == "1025Gi"


def test_no_retry_is_cut_by_a_window_from_the_first_attempt() -> None:
    """Argo measures ``backoff.maxDuration`` from the first attempt's start and makes
    what is left the retry pod's deadline (``processNodeRetries``, operator.go): a build
    longer than it is never retried, a late retry is killed within seconds."""
    for doc in documents(TREE):
        spec = doc.get("spec") or {}
        spec = spec.get("workflowSpec", spec)
        for t in spec.get("templates") or []:
            strategy = t.get("retryStrategy")
            if strategy:
                assert "maxDuration" not in strategy.get("backoff", {}), t["name"]
                assert int(strategy["limit"]) >= 1, t["name"]


# buildctl's last words when the registry lost the race of BuildKit's two concurrent
# pushes into one repository (the image and <image>:buildcache): the HTTP status on the
# "error: " line, the registry's own error codes on the lines after it
PUSH_RACE = (
    "error: failed to solve: failed to push registry:80/citation-dagster:aaaaaaaaaaaa:"
    " unexpected status from PUT request to"
    " http://registry:80/v2/citation-dagster/manifests/aaaaaaaaaaaa: 400 Bad Request"
)


@pytest.mark.parametrize(
    "registry_said",
    [
        "manifest blob unknown: blob unknown to registry",
        "digest invalid: provided digest did not match uploaded content",
        "errors:\ndigest invalid: provided digest did not match uploaded content\n"
        "manifest blob unknown: blob unknown to registry",
    ],
    ids=["blob-unknown", "digest-invalid", "both"],
)
def test_a_push_that_lost_a_race_in_the_registry_is_retried(
    tmp_path: Path, registry_said: str
) -> None:
    """The registry's words are on the lines after buildctl's ``error: `` line: the
    step reads them too, and exits 75 (retried) where it exited 1."""
    from .test_step_scripts import _run_build

    failing = (
        "#!/bin/sh\n"
        "echo '#12 pushing layers 0.2s done' >&2\n"
        f"cat >&2 <<'EOF'\n{PUSH_RACE}\n{registry_said}\nEOF\n"
        "exit 1\n"
    )
    result = _run_build(tmp_path, {}, buildctl=failing)
    assert result.returncode == 75, result.stdout + result.stderr
    assert "transient, worth retrying" in result.stderr
    assert registry_said in result.stdout  # buildctl's words stay in the step's log


def test_the_lines_after_a_run_failure_do_not_make_it_transient(tmp_path: Path) -> None:
    """A RUN that failed is the app's own failure, whatever buildctl prints after it."""
    from .test_step_scripts import _run_build

    failing = (
        "#!/bin/sh\n"
        "cat >&2 <<'EOF'\n"
        'error: failed to solve: process "/bin/sh -c ./fetch" did not complete successfully:'
        " exit code: 1\n"
        "blob unknown to registry\n"
        "EOF\n"
        "exit 1\n"
    )
    result = _run_build(tmp_path, {}, buildctl=failing)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "transient" not in result.stderr


def test_the_writeback_signing_key_is_mounted_in_the_write_back_alone() -> None:
    from fabrique.site.config import parse_site

    values = load_site(env={}).to_values()
    values["writeback"] |= {
        "transport": "git",
        "signing": {"keySecret": {"name": "fabrique-writeback-signing", "key": "ssh-key"}},
    }
    template = build_template(parse_site(values)).to_dict()
    run = _templates(template)[VERIFIED_BY]
    (volume,) = [v for v in run["volumes"] if v["name"] == "writeback-signing-key"]
    assert volume["secret"] == {
        "secretName": "fabrique-writeback-signing",
        "items": [{"key": "ssh-key", "path": "key"}],
        "defaultMode": 0o400,
    }
    mounting = {
        n for n, c in _containers(template).items() if "writeback-signing-key" in _mounts(c)
    }
    assert mounting == {"write-back"}
    mount = _mounts(_containers(template)["write-back"])["writeback-signing-key"]
    assert mount["readOnly"] is True
    env = _env(_containers(template)["write-back"])
    assert env["FABRIQUE_WRITEBACK_SIGNING_KEY"] == f"{mount['mountPath']}/key"
    assert "fabrique-writeback-signing" not in str(_templates(template)["report-failure"])
