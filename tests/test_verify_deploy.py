"""The verification's fast path: the build's Workflow verifies the environment its
write-back wrote into (its ``verify-deploy`` step), when that environment's Argo CD runs
in fabrique's own cluster (``targets.<name>.inCluster``).

The template and the tree against a rendered site; the write-back's hand-over (which
environment to verify, if any) and ``fabrique verify --in-cluster`` through the CLI,
against the Gitea double, the loopback registry and the Kubernetes API double.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.decisions.workflow import verify_workflow
from fabrique.render import render_tree, write_tree
from fabrique.site.config import load_site, parse_site
from netpol import policies

from .conftest import Repo, run_cli
from .doubles.admission import Admission
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .manifests import documents, find
from .oci import built_labels, push_image
from .servers import Registry
from .test_promote import _application, _passed, env, values  # noqa: F401
from .test_rollback import APP_FILE, _built, fab
from .test_verify_gesture import _at_the_third_look, _pods

BUILD_DEADLINE = 3600  # build.activeDeadlineSeconds, the default site's


def _tree(in_cluster: bool, **verify: str) -> dict[str, list[dict[str, Any]]]:
    site = load_site(env={}).to_values()
    site["targets"]["prod"]["inCluster"] = in_cluster
    if verify:
        site["verify"] = verify
    site["apps"][0]["environments"] = [
        {"name": "bench", "target": "prod", "application": "argocd/citation-bench",
         "namespace": "citation-bench"},
    ]  # fmt: skip
    return render_tree(parse_site(site))


def _templates(tree: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    (template,) = tree["build/workflowtemplate.yaml"]
    return {t["name"]: t for t in template["spec"]["templates"]}


def test_the_build_verifies_its_first_environment_when_its_argo_cd_runs_here() -> None:
    tree = _tree(True, timeout="3m", soak="1m")
    templates = _templates(tree)
    # after the build (whose duration its metric counts), the look, when the write-back
    # said where; its failure is a verdict in its own status, never the build's
    chosen = "{{steps.build.outputs.parameters.verify}}"
    assert templates["main"]["steps"] == [
        [{"name": "build", "template": "build"}],
        [
            {
                "name": "verify-deploy",
                "template": "verify-deploy",
                "arguments": {"parameters": [{"name": "verify", "value": chosen}]},
                "when": f"'{chosen}' != ''",
                "continueOn": {"error": True, "failed": True},
            }
        ],
    ]
    assert templates["build"]["outputs"]["parameters"] == [
        {"name": "verify", "valueFrom": {"parameter": "{{steps.run.outputs.parameters.verify}}"}}
    ]
    step = templates["verify-deploy"]
    assert step["container"]["args"] == [
        *("verify", "--app", "{{workflow.parameters.app}}"),
        *("--env", "{{inputs.parameters.verify}}", "--wait", "--in-cluster"),
    ]
    # its own bound: the verdict's (3m + 1m) and two minutes; the Workflow's the build's
    # and that
    assert step["activeDeadlineSeconds"] == str(4 * 60 + 120)
    (template,) = tree["build/workflowtemplate.yaml"]
    assert template["spec"]["activeDeadlineSeconds"] == BUILD_DEADLINE + 4 * 60 + 120
    # the one token of the build namespace, in this step alone; no Internet
    assert step["serviceAccountName"] == "fabrique-verifier"
    assert [n for n, t in templates.items() if t.get("automountServiceAccountToken")] == [
        "verify-deploy"
    ]
    labels = step["metadata"]["labels"]
    assert labels["fabrique.io/step"] == "verify-deploy"
    # the build namespace's fabrique pods' egress (DNS, Gitea, the registry, the API), not
    # the build pod's Internet
    assert labels["app.kubernetes.io/part-of"] == "fabrique"
    assert not policies.BUILD_POD["matchLabels"].items() <= labels.items()
    env_names = {e["name"] for e in step["container"]["env"]}
    assert env_names == {"FABRIQUE_VALUES", "FABRIQUE_GITEA_TOKEN"}


def test_the_verifiers_account_reads_that_application_and_lists_its_pods_only() -> None:
    rbac = _tree(True)["build/rbac.yaml"]
    bound = {
        (d["metadata"]["namespace"], d["roleRef"]["name"])
        for d in rbac
        if d["kind"] == "RoleBinding" and d["subjects"][0]["name"] == "fabrique-verifier"
    }
    assert bound == {
        ("argocd", "fabrique-verifier-read-applications"),
        ("citation-bench", "fabrique-verifier-list-pods"),
    }
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["rules"] for d in rbac
             if d["kind"] == "Role"}  # fmt: skip
    assert roles[("argocd", "fabrique-verifier-read-applications")] == [
        {"apiGroups": ["argoproj.io"], "resources": ["applications"],
         "resourceNames": ["citation-bench"], "verbs": ["get"]}
    ]  # fmt: skip
    assert roles[("citation-bench", "fabrique-verifier-list-pods")] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    ]


def test_nothing_verifies_in_the_build_where_the_environment_is_read_through_a_context() -> None:
    tree = _tree(False)
    templates = _templates(tree)
    assert "verify-deploy" not in templates
    assert templates["main"]["steps"] == [[{"name": "build", "template": "build"}]]
    (template,) = tree["build/workflowtemplate.yaml"]
    assert template["spec"]["activeDeadlineSeconds"] == BUILD_DEADLINE
    assert not [
        d for d in tree["build/rbac.yaml"] if d["metadata"]["name"].startswith("fabrique-verifier")
    ]


def _in_cluster(path: Path) -> None:
    site = yaml.safe_load(path.read_text())
    site["targets"]["bench"]["inCluster"] = True
    path.write_text(yaml.safe_dump(site))


def test_the_write_back_names_the_environment_to_verify_once_it_wrote_there(
    values: Path,  # noqa: F811
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    revision = code_repo.commit({APP_FILE: "v1\n"})
    digest = push_image(
        registry.url, "citation-dagster", revision[:12], {"app.txt": b"v1\n"},
        labels=built_labels(revision, gitea.url),
    )  # fmt: skip
    out = tmp_path / "out"
    step = ["writeback", "--app", "citation", "--revision", revision, "--digest", digest]

    def written(*args: str) -> tuple[str, str]:
        done = run_cli("--values", str(values), *step, *args, "--out", str(out), env=env)
        assert done.exit_code == 0, done.stdout + done.stderr
        return (out / "outcome").read_text(), (out / "verify").read_text()

    # bench's Argo CD is read through a context: the pass (or a person) verifies it
    assert written("--dry-run") == ("would-change", "")
    _in_cluster(values)
    assert written() == ("changed", "bench")
    # a replay wrote nothing: nothing for the build to verify (the pass looks still)
    assert written() == ("unchanged", "")


def test_verify_in_cluster_refuses_an_environment_read_through_a_context(
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
) -> None:
    done = run_cli(
        "--values", str(values), "verify", "--app", "citation", "--env", "bench", "--in-cluster",
        env=env,
    )  # fmt: skip
    assert done.exit_code == 2, done.stdout + done.stderr
    assert done.stderr == (
        "error: --in-cluster: environment bench deploys through target bench, which is not "
        "inCluster\n"
    )


# -- after a promotion: a Workflow of its own (fabrique-verify) ------------------------------


def _promoted_tree(tmp_path: Path, prod_in_cluster: bool, *, batch: bool = True) -> Path:
    site = load_site(env={}).to_values()
    site["writeback"]["batch"]["enabled"] = batch
    site["targets"]["bench"] = {"context": "cluster-bench", "inCluster": True}
    site["targets"]["prod"]["inCluster"] = prod_in_cluster
    app = site["apps"][0]
    app["environments"] = [
        {"name": "bench", "target": "bench"},
        {"name": "prod", "target": "prod", "application": "argocd/citation-prod",
         "namespace": "dagster-prod",
         "writeback": {**app["writeback"], "path": "deploy/prod/kustomization.yaml"}},
    ]  # fmt: skip
    write_tree(render_tree(parse_site(site)), tmp_path / "tree")
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    return tmp_path / "tree"


def test_a_promotion_into_this_cluster_is_looked_at_by_a_workflow_of_its_own(
    tmp_path: Path,
) -> None:
    tree = _promoted_tree(tmp_path, True)
    # the build's look at bench and the promotion's at prod, side by side: one tree
    valid = run_cli("--values", str(tmp_path / "site.yaml"), "validate", str(tree))
    assert valid.exit_code == 0, valid.stdout + valid.stderr
    template = find(tree, "WorkflowTemplate", "fabrique-verify")
    spec = template["spec"]
    assert template["metadata"]["namespace"] == "fabrique"
    assert spec["serviceAccountName"] == "fabrique-promotion-verifier"
    assert spec["arguments"]["parameters"] == [{"name": "app"}, {"name": "env"}]
    assert spec["synchronization"] == {
        "mutexes": [
            {"name": "fabrique-verify-{{workflow.parameters.app}}-{{workflow.parameters.env}}"}
        ]
    }
    # prod's verdict (10m by default) and two minutes
    assert spec["activeDeadlineSeconds"] == 600 + 120
    (step,) = [t for t in spec["templates"] if "container" in t]
    assert step["container"]["args"] == [
        *("verify", "--app", "{{workflow.parameters.app}}"),
        *("--env", "{{workflow.parameters.env}}", "--wait", "--in-cluster"),
    ]
    assert step["metadata"]["labels"]["fabrique.io/role"] == "verifier"
    # its account reads the Applications it looks at and lists their pods, nothing else:
    # prod's (a promotion's) and bench's (a push's write-back's, writeback.batch)
    bindings = {
        (d["metadata"]["namespace"], d["roleRef"]["name"])
        for d in documents(tree)
        if d["kind"] == "RoleBinding"
        and d["subjects"][0] == {"kind": "ServiceAccount", "name": "fabrique-promotion-verifier",
                                 "namespace": "fabrique"}
    }  # fmt: skip
    assert bindings == {
        ("argocd", "fabrique-promotion-verifier-read-applications"),
        ("dagster-prod", "fabrique-promotion-verifier-list-pods"),
        ("dagster", "fabrique-promotion-verifier-list-pods"),
    }
    # the reconciler (promote: auto) may start one there; its NetworkPolicy lets it out
    # to DNS, Gitea, the registry and the API only
    start = find(tree, "Role", "fabrique-reconciler-start-verifications")
    assert start["metadata"]["namespace"] == "fabrique"
    assert start["rules"] == [
        {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create"]}
    ]
    policy = find(tree, "NetworkPolicy", "verifier")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"fabrique.io/role": "verifier"}}
    assert "ingress" not in policy["spec"] and len(policy["spec"]["egress"]) == 4


def test_admission_holds_the_reconciler_to_the_look_it_starts(tmp_path: Path) -> None:
    tree = _promoted_tree(tmp_path, True)
    admission = Admission(tree, "fabrique-reconciler-starts-verifications")
    assert admission.namespace == "fabrique"
    assert admission.policy["spec"]["matchConditions"] == [
        {
            "name": "the-reconciler",
            "expression": (
                "request.userInfo.username == 'system:serviceaccount:fabrique:fabrique-reconciler'"
            ),
        }
    ]
    site = load_site(env={})
    body = verify_workflow(site, "citation", "prod", "sha256:" + "ab" * 32)
    assert (
        body["metadata"]["name"]
        == verify_workflow(site, "citation", "prod", "sha256:" + "ab" * 32)["metadata"]["name"]
    ), "the same digest, the same look"
    assert re.fullmatch(r"fabrique-verify-[0-9a-f]{12}", body["metadata"]["name"])
    assert admission.refusals(body) == []
    inline = copy.deepcopy(body)
    inline["spec"] = {"entrypoint": "x", "templates": [{"name": "x", "container": {}}]}
    assert "only spec.workflowTemplateRef" in " ".join(admission.refusals(inline))
    build = copy.deepcopy(body)
    build["spec"]["workflowTemplateRef"]["name"] = "fabrique-build"
    assert "fabrique-verify by name" in " ".join(admission.refusals(build))
    renamed = copy.deepcopy(body)
    renamed["metadata"]["name"] = "fabrique-citation-" + "a" * 12
    assert "be named fabrique-verify-" in " ".join(admission.refusals(renamed))


def test_nothing_of_it_where_promotions_go_to_another_cluster(tmp_path: Path) -> None:
    tree = _promoted_tree(tmp_path, False, batch=False)
    names = {(d["kind"], d.get("metadata", {}).get("name")) for d in documents(tree)}
    assert ("WorkflowTemplate", "fabrique-verify") not in names
    assert ("NetworkPolicy", "verifier") not in names
    assert ("ValidatingAdmissionPolicy", "fabrique-reconciler-starts-verifications") not in names
    assert ("Role", "fabrique-reconciler-start-verifications") not in names
    assert ("WorkflowTemplate", "fabrique-build") in names, "a tree was rendered"


def test_a_push_s_write_back_starts_the_look_at_what_it_wrote_in_this_cluster(
    tmp_path: Path,
) -> None:
    """Builds that meet in their push's Workflow (writeback.batch) have no look of their
    own: the push's write-back starts fabrique-verify at bench, as a promotion does at
    prod; the planner may start that and nothing else, the reconciler nothing here."""
    tree = _promoted_tree(tmp_path, False)
    valid = run_cli("--values", str(tmp_path / "site.yaml"), "validate", str(tree))
    assert valid.exit_code == 0, valid.stdout + valid.stderr
    names = {(d["kind"], d.get("metadata", {}).get("name")) for d in documents(tree)}
    assert ("WorkflowTemplate", "fabrique-verify") in names
    assert ("NetworkPolicy", "verifier") in names
    assert ("ValidatingAdmissionPolicy", "fabrique-planner-starts-verifications") in names
    assert ("Role", "fabrique-planner-start-verifications") in names
    assert ("Role", "fabrique-reconciler-start-verifications") not in names
    policy = find(tree, "ValidatingAdmissionPolicy", "fabrique-planner-starts-verifications")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:fabrique:fabrique-planner'"
    )


def _prod_in_this_cluster(path: Path, **prod: str) -> None:
    """Prod's Argo CD runs in fabrique's cluster (bench's context), its Application and
    namespace its own; ``prod``: more of its fields."""
    site = yaml.safe_load(path.read_text())
    site["targets"]["prod"] = {"context": "bench", "inCluster": True}
    site["apps"][0]["environments"][1] |= {
        "application": "argocd/citation-prod", "namespace": "dagster-prod", **prod,
    }  # fmt: skip
    path.write_text(yaml.safe_dump(site))


def _passed_on_bench(
    code_repo: Repo,
    registry: Registry,
    gitea: GiteaDouble,
    kube: KubeApiDouble,
    path: Path,
    environ: dict[str, str],
) -> str:
    """A build written back to bench, Synced and Healthy there, and passed: its digest."""
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", path, environ)
    reference = f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"
    _application(kube, "Synced", "Healthy", [reference])
    _passed(gitea, revision, digest)
    return digest


def test_promote_into_this_cluster_starts_the_look_and_a_replay_starts_none(
    values: Path,  # noqa: F811
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],  # noqa: F811
) -> None:
    _prod_in_this_cluster(values)
    digest = _passed_on_bench(code_repo, registry, gitea, kube, values, env)
    promote = ["promote", "--app", "citation", "--to", "prod"]
    done = fab(values, env, *promote)
    assert done.exit_code == 0, done.stdout + done.stderr
    body = verify_workflow(load_site(values, env={}), "citation", "prod", digest)
    name = body["metadata"]["name"]
    assert done.stdout.splitlines()[-1] == f"verifying in prod: Workflow fabrique/{name}"
    made = kube.objects[("fabrique", name)]
    assert made["spec"] == body["spec"]
    assert made["metadata"]["labels"]["fabrique.io/environment"] == "prod"
    # a replay writes nothing, and starts nothing
    again = fab(values, env, *promote)
    assert again.exit_code == 0 and again.stdout.startswith("unchanged: "), again.stdout
    assert [k for k in kube.objects if k[0] == "fabrique"] == [("fabrique", name)]


def test_verify_wait_looks_again_until_the_application_is_there(
    values: Path,  # noqa: F811
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A promotion's look starts before the environment's first Application exists (seed
    makes it once the first promotion wrote a pin): it waits for it, posting nothing,
    where a single look says so and exits 8."""
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    reference = f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"
    once = fab(values, env, "verify", "--app", "citation", "--env", "bench")
    assert once.exit_code == 8, once.stdout + once.stderr
    assert "Application argocd/citation not found" in once.stderr

    def seeded_and_synced() -> None:
        _application(kube, "Synced", "Healthy", [reference])
        _pods(kube, registry, digest)

    _at_the_third_look(monkeypatch, seeded_and_synced)
    done = fab(values, env, "verify", "--app", "citation", "--env", "bench", "--wait")
    assert done.exit_code == 0, done.stdout + done.stderr
    assert done.stdout.strip() == (
        f"citation/bench: verified: {digest}: Synced and Healthy, 1 pod(s) run it"
    )
    assert len(done.stderr.splitlines()) == 2
    assert all("Application argocd/citation not found" in line for line in done.stderr.splitlines())


def test_the_pass_starts_the_look_after_its_own_promotion(
    values: Path,  # noqa: F811
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],  # noqa: F811
) -> None:
    _in_cluster(values)
    _prod_in_this_cluster(values, promote="auto")
    digest = _passed_on_bench(code_repo, registry, gitea, kube, values, env)
    done = fab(values, env, "reconcile")
    assert done.exit_code == 0, done.stdout + done.stderr
    name = verify_workflow(load_site(values, env={}), "citation", "prod", digest)["metadata"][
        "name"
    ]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("citation/prod: promoted: ")]
    assert line.endswith(f"; verifying in prod: Workflow fabrique/{name}"), line
    assert ("fabrique", name) in kube.objects
