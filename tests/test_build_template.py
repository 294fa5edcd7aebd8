"""Invariants of the rendered fabrique-build template (DESIGN.md invariants 5 and 6)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fabrique.site.config import load_site
from fabrique.site.names import LABEL_APP, LABEL_REVISION
from pipelines.build import build_template

from .conftest import ROOT
from .manifests import documents, find, walk

TREE = ROOT / "manifests"


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return find(TREE, "WorkflowTemplate", "fabrique-build")


def _templates(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in template["spec"]["templates"]}


def _pods(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The templates that run a pod (not the steps templates main and exit-handler)."""
    return {name: t for name, t in _templates(template).items() if "steps" not in t}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_steps_run_in_order(template: dict[str, Any]) -> None:
    main = _templates(template)["main"]
    assert [[step["name"] for step in group] for group in main["steps"]] == [
        ["plan"],
        ["report-skipped", "report-pending", "checkout"],
        ["build"],
        ["verify-digest"],
        ["write-back"],
        ["report-success"],
    ]
    assert template["spec"]["entrypoint"] == "main"
    assert template["spec"]["arguments"]["parameters"] == [
        {"name": "app"},
        {"name": "revision"},
        {"name": "force", "value": "false"},
    ]
    for group in main["steps"][1:]:
        for step in group:
            expected = "false" if step["name"] == "report-skipped" else "true"
            assert step["when"] == f"{{{{steps.plan.outputs.parameters.build}}}} == {expected}", (
                step["name"]
            )


def test_build_container_is_rootless_buildkit(template: dict[str, Any]) -> None:
    build = _templates(template)["build"]
    container = build["container"]
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
    volumes = {v["name"]: v for v in build["volumes"]}
    assert volumes[mounts["/home/user/.local/share/buildkit"]] == {
        "emptyDir": {"sizeLimit": "20Gi"},  # build.stateSize: a runaway build is evicted
        "name": "buildkit-state",
    }
    assert (
        container["resources"]["limits"]["ephemeral-storage"] == "22Gi"
    )  # the state volume (20Gi) and its scratch (2Gi)
    assert (
        volumes[mounts["/home/user/.config/buildkit"]]["configMap"]["name"] == "fabrique-buildkitd"
    )
    assert "buildctl-daemonless.sh" in container["command"][-1]


def test_only_the_build_container_is_unconfined(template: dict[str, Any]) -> None:
    unconfined = [
        name
        for name, t in _templates(template).items()
        if any(value == "Unconfined" for _, _, value in walk(t))
    ]
    assert unconfined == ["build"]
    assert template["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for name, t in _pods(template).items():
        if name == "build":
            continue
        context = t["container"]["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, name
        assert context["capabilities"] == {"drop": ["ALL"]}, name
        assert context["runAsNonRoot"] is True, name


def test_builder_never_runs_on_the_control_plane(template: dict[str, Any]) -> None:
    build = _templates(template)["build"]
    terms = build["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}
            ]
        }
    ]
    assert not [path for path, key, _ in walk(template) if key == "tolerations"]


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
    script = _templates(template)["build"]["container"]["command"][-1]
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
    build = next(
        t for t in build_template(site).to_dict()["spec"]["templates"] if t["name"] == "build"
    )
    script = build["container"]["command"][-1]
    assert '--opt "attest:provenance=mode=max"' in script
    assert not re.search(r"attest:[a-z]+=[\"\s]", script), (
        "an empty attest value enables it silently"
    )
    # a local context has no commit BuildKit could see: the build names it for the provenance
    assert '--opt "vcs:source=$SOURCE_URL" --opt "vcs:revision=$REVISION"' in script
    assert "sbom" not in script
    assert "SBOM_GENERATOR" not in {e["name"] for e in build["container"]["env"]}


def test_sbom_switch_uses_the_mirrored_scanner_through_the_environment() -> None:
    scanner = "registry:80/buildkit-syft-scanner:1.4.0"
    site = load_site(
        env={
            "FABRIQUE_BUILD__ATTESTATIONS": "true",
            "FABRIQUE_BUILD__SBOM": "true",
            "FABRIQUE_IMAGES__SBOM_SCANNER": scanner,
        }
    )
    build = next(
        t for t in build_template(site).to_dict()["spec"]["templates"] if t["name"] == "build"
    )
    script = build["container"]["command"][-1]
    assert '--opt "attest:sbom=generator=$SBOM_GENERATOR"' in script
    assert scanner not in script, "values reach the script through the environment"
    assert {"name": "SBOM_GENERATOR", "value": scanner} in build["container"]["env"]


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
    for name, t in _pods(template).items():
        assert t["metadata"]["labels"][LABEL_APP] == "{{workflow.parameters.app}}", name
        assert (
            t["metadata"]["labels"][LABEL_REVISION]
            == "{{=sprig.trunc(12, workflow.parameters.revision)}}"
        ), name
    assert spec["activeDeadlineSeconds"] == 3600
    assert spec["podGC"]["strategy"] == "OnPodSuccess"
    assert spec["ttlStrategy"]["secondsAfterFailure"] >= spec["ttlStrategy"]["secondsAfterSuccess"]
    assert spec["volumeClaimGC"] == {"strategy": "OnWorkflowCompletion"}


def test_every_step_retries_only_what_a_retry_may_fix(template: dict[str, Any]) -> None:
    """Exit 75 (a server or the network did not answer) or a lost pod: a digest mismatch,
    a missing Dockerfile, a failing RUN or an OOM kill is never retried."""
    templates = _templates(template)
    steps = [t for t in templates.values() if "container" in t]
    assert {"plan", "checkout", "build", "verify-digest", "write-back"} <= {
        t["name"] for t in steps
    }
    for step in steps:
        strategy = step["retryStrategy"]
        assert int(strategy["limit"]) >= 1, step["name"]
        assert strategy["backoff"]["duration"] and strategy["backoff"]["factor"], step["name"]
        assert strategy["expression"] == (
            'asInt(lastRetry.exitCode) == 75 || lastRetry.status == "Error"'
            ' || lastRetry.message contains "The node was low on resource"'
            ' || lastRetry.message contains "imminent node shutdown"'
        ), step["name"]


def test_write_back_takes_the_verified_digest(template: dict[str, Any]) -> None:
    main = _templates(template)["main"]
    step = main["steps"][-2][0]
    assert step["arguments"]["parameters"] == [
        {"name": "digest", "value": "{{steps.verify-digest.outputs.parameters.digest}}"}
    ]
    container = _templates(template)["write-back"]["container"]
    assert container["args"] == [
        *("writeback", "--app", "{{workflow.parameters.app}}"),
        *("--revision", "{{workflow.parameters.revision}}"),
        *("--digest", "{{inputs.parameters.digest}}", "--workflow", "{{workflow.name}}"),
        *("--out", "/tmp/fabrique/writeback"),
    ]
    assert _env(container)["FABRIQUE_GITEA_TOKEN"] == {
        "secretKeyRef": {"key": "token", "name": "fabrique-gitea"}
    }


def test_digest_is_verified_by_the_tools_image_and_exposed(template: dict[str, Any]) -> None:
    verify = _templates(template)["verify-digest"]
    assert verify["container"]["command"] == ["fabrique"]
    assert verify["container"]["args"][:2] == ["digest", "verify"]
    assert verify["outputs"]["parameters"] == [
        {"name": "digest", "valueFrom": {"path": "/tmp/fabrique/digest"}}
    ]


def test_tokens_come_from_secrets_only() -> None:
    checkout_env = _env(
        _templates(find(TREE, "WorkflowTemplate", "fabrique-build"))["checkout"]["container"]
    )
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


def test_the_build_pods_ephemeral_limit_holds_its_state_volume() -> None:
    """The kubelet evicts a pod whose ephemeral use, emptyDirs and containers together,
    passes the sum of its containers' ephemeral-storage limits
    (``podEphemeralStorageLimitEviction`` in pkg/kubelet/eviction/eviction_manager.go):
    a limit under the BuildKit state volume's sizeLimit evicts every build that fills
    its cache. The limit is the state volume plus the container's own scratch."""
    from fabrique.site.config import add_sizes

    build = _templates(find(TREE, "WorkflowTemplate", "fabrique-build"))["build"]
    limit = build["container"]["resources"]["limits"]["ephemeral-storage"]
    state = next(v for v in build["volumes"] if v["name"] == "buildkit-state")
    assert state["emptyDir"]["sizeLimit"] == "20Gi"
    assert limit == add_sizes(state["emptyDir"]["sizeLimit"], "2Gi") == "22Gi"


def test_the_ephemeral_limit_follows_the_values(tmp_path: Path) -> None:
    from fabrique.site.config import add_sizes, load_site

    values = tmp_path / "site.yaml"
    values.write_text("build:\n  stateSize: 50Gi\n  scratchSize: 512Mi\n")
    assert load_site(values, env={}).build.ephemeral_limit == "51712Mi"
    assert add_sizes("1Ti", "1Gi") == "1025Gi"


def test_every_pod_of_the_workspace_keeps_off_the_control_plane() -> None:
    """The scheduler's VolumeBinding plugin (pkg/scheduler/framework/plugins/volumebinding)
    binds a WaitForFirstConsumer claim on its first pod's node, and the volume's node
    affinity then holds every later pod of the claim there. A checkout on a schedulable
    control-plane node would leave the build, which never runs there, unschedulable."""
    templates = _templates(find(TREE, "WorkflowTemplate", "fabrique-build"))
    build_affinity = templates["build"]["affinity"]
    mounting = [
        name
        for name, t in templates.items()
        if any(m["name"] == "workspace" for m in (t.get("container") or {}).get("volumeMounts", []))
    ]
    assert {"checkout", "build", "verify-digest"} <= set(mounting)
    for name in mounting:
        assert templates[name].get("affinity") == build_affinity, name


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
