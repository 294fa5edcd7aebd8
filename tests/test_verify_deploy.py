"""The verification's fast path: the build's Workflow verifies the environment its
write-back wrote into (its ``verify-deploy`` step), when that environment's Argo CD runs
in fabrique's own cluster (``targets.<name>.inCluster``).

The template and the tree against a rendered site; the write-back's hand-over (which
environment to verify, if any) and ``fabrique verify --in-cluster`` through the CLI,
against the Gitea double, the loopback registry and the Kubernetes API double.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fabrique.render import render_tree
from fabrique.site.config import load_site, parse_site
from netpol import policies

from .conftest import Repo, run_cli
from .doubles.gitea import GiteaDouble
from .oci import built_labels, push_image
from .servers import Registry
from .test_promote import env, values  # noqa: F401
from .test_rollback import APP_FILE

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
