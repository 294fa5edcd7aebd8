"""First-step mode: `fabrique submit` against the Kubernetes API double, and `plan`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fabrique.decisions.workflow import build_workflow
from fabrique.site.config import load_site
from fabrique.site.names import workflow_name

from .conftest import CodeRepo, run_cli, unreachable_kubeconfig, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble

REV = "9c1d0f3b2a4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c"
NS = "fabrique-build"
WORKFLOWS = f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows"


@pytest.fixture()
def kubeconfig(tmp_path: Path, kube: KubeApiDouble) -> dict[str, str]:
    return {"KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig"))}


def test_submit_creates_the_workflow_then_reports_it_exists(
    kube: KubeApiDouble, kubeconfig: dict[str, str]
) -> None:
    first = run_cli("submit", "--app", "citation", "--revision", REV, env=kubeconfig)
    assert first.exit_code == 0, first.stderr
    assert first.stdout.strip() == f"created: workflow fabrique-build/fabrique-citation-{REV[:12]}"
    stored = kube.objects[("fabrique-build", f"fabrique-citation-{REV[:12]}")]
    assert stored["spec"]["workflowTemplateRef"] == {"name": "fabrique-build"}
    assert stored["spec"]["arguments"]["parameters"] == [
        {"name": "app", "value": "citation"},
        {"name": "revision", "value": REV},
    ]
    # a label value holds at most 63 characters: the sha12 there, the revision annotated
    assert stored["metadata"]["labels"]["fabrique.io/revision"] == REV[:12]
    assert stored["metadata"]["annotations"]["fabrique.io/revision"] == REV

    again = run_cli("submit", "--app", "citation", "--revision", REV, env=kubeconfig)
    assert again.exit_code == 0
    assert (
        again.stdout.strip()
        == f"already exists: workflow fabrique-build/fabrique-citation-{REV[:12]}"
    )
    assert len(kube.objects) == 1
    assert kube.rejections == []
    # each submit is one create, and nothing else asked first: a 409 is the same build
    assert [(r.method, r.path) for r in kube.requests] == [("POST", WORKFLOWS)] * 2


def test_the_double_rejects_bodies_outside_the_workflow_schema(
    kube: KubeApiDouble, kubeconfig: dict[str, str]
) -> None:
    """The double is not a rubber stamp: a misspelled field is refused, and the client
    turns the refusal into a KubeError that names the object."""
    from kubernetes import config as k8s_config

    from fabrique.clients.kube import KubeClient
    from fabrique.site.errors import KubeError

    body = build_workflow(load_site(env={}), "citation", REV, submitted_by="test")
    body["spec"]["workflowTemplateRf"] = body["spec"].pop("workflowTemplateRef")
    client = KubeClient(k8s_config.new_client_from_config(config_file=kubeconfig["KUBECONFIG"]))
    with pytest.raises(
        KubeError, match=r"create Workflow fabrique-build/fabrique-citation-9c1d0f3b2a4e: HTTP 422"
    ):
        client.create_workflow(body)
    assert "workflowTemplateRf" in kube.rejections[0]
    assert kube.objects == {}


def test_submit_retries_a_flaky_api(kube: KubeApiDouble, kubeconfig: dict[str, str]) -> None:
    kube.faults = [503]
    result = run_cli("submit", "--app", "citation", "--revision", REV, env=kubeconfig)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("created:")
    assert "retry 1" in result.stderr


def test_submit_dry_run_prints_the_workflow_and_creates_nothing(
    kube: KubeApiDouble, kubeconfig: dict[str, str], specs: Path
) -> None:
    result = run_cli("submit", "--app", "citation", "--revision", REV, "--dry-run", env=kubeconfig)
    assert result.exit_code == 0, result.stderr
    body = yaml.safe_load(result.stdout)
    assert body["kind"] == "Workflow"
    assert body["metadata"]["name"] == workflow_name("citation", REV)
    assert kube.requests == []
    errors = list(kube.validator.iter_errors(body))
    assert errors == []


def test_print_argo_line(kube: KubeApiDouble) -> None:
    result = run_cli("submit", "--app", "citation", "--revision", REV, "--print-argo")
    assert result.exit_code == 0
    assert result.stdout.strip() == (
        "argo submit -n fabrique-build --from workflowtemplate/fabrique-build "
        f"--name fabrique-citation-{REV[:12]} -p app=citation -p revision={REV} "
        f"-l fabrique.io/app=citation,fabrique.io/revision={REV[:12]},"
        "app.kubernetes.io/part-of=fabrique,app.kubernetes.io/managed-by=fabrique,"
        "fabrique.io/submitted-by=cli"
    )
    assert kube.requests == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--app", "citation", "--revision", "abc123"],
            "revision 'abc123': must be a full lowercase hex commit id",
        ),
        (
            ["--app", "citation", "--revision", REV.upper()],
            "must be a full lowercase hex commit id",
        ),
        (
            ["--app", "nope", "--revision", REV],
            "app 'nope': not in the site config (known apps: citation)",
        ),
        (["--app", "citation"], "give exactly one of --revision SHA or --head"),
        (
            ["--app", "citation", "--revision", REV, "--head"],
            "give exactly one of --revision SHA or --head",
        ),
    ],
)
def test_submit_bad_input(
    kube: KubeApiDouble, kubeconfig: dict[str, str], args: list[str], expected: str
) -> None:
    result = run_cli("submit", *args, env=kubeconfig)
    assert result.exit_code == 2
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert kube.requests == []


def test_submit_api_down(tmp_path: Path) -> None:
    config = unreachable_kubeconfig(tmp_path / "kubeconfig")
    result = run_cli(
        "submit", "--app", "citation", "--revision", REV, env={"KUBECONFIG": str(config)}
    )
    assert result.exit_code == 75, "an unreachable API is a transient failure"
    assert "Kubernetes API at http://127.0.0.1:" in result.stderr and "unreachable" in result.stderr


def test_submit_without_any_kube_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = run_cli(
        "submit", "--app", "citation", "--revision", REV, env={"KUBECONFIG": str(tmp_path / "none")}
    )
    assert result.exit_code == 2, "a missing config is the user's to fix, not a server's answer"
    assert "no Kubernetes config" in result.stderr


def _gitea_values(tmp_path: Path, gitea: GiteaDouble) -> Path:
    return write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url})


def test_submit_head_resolves_the_branch_through_gitea(
    tmp_path: Path,
    gitea: GiteaDouble,
    code_repo: CodeRepo,
    kube: KubeApiDouble,
    kubeconfig: dict[str, str],
) -> None:
    head = code_repo.commit({"dataops/citation-dagster/app.txt": "new\n"})
    env = {**kubeconfig, "FABRIQUE_GITEA_TOKEN": gitea.token or ""}
    result = run_cli(
        "--values",
        str(_gitea_values(tmp_path, gitea)),
        "submit",
        "--app",
        "citation",
        "--head",
        env=env,
    )
    assert result.exit_code == 0, result.stderr
    assert (
        result.stdout.strip() == f"created: workflow fabrique-build/fabrique-citation-{head[:12]}"
    )
    assert gitea.requests[0].path == "/api/v1/repos/atlas/atlas/branches/main"


def test_submit_head_with_a_wrong_token_never_shows_it(
    tmp_path: Path, gitea: GiteaDouble, kube: KubeApiDouble
) -> None:
    secret = "wrong-token-7d1e9a"
    result = run_cli(
        "-v",
        "--values",
        str(_gitea_values(tmp_path, gitea)),
        "submit",
        "--app",
        "citation",
        "--head",
        env={"FABRIQUE_GITEA_TOKEN": secret},
    )
    assert result.exit_code == 3
    assert "Gitea refused the token (HTTP 401)" in result.stderr
    assert secret not in result.stderr + result.stdout
    assert gitea.requests[0].headers["authorization"] == f"token {secret}"


def test_submit_head_on_a_missing_branch(tmp_path: Path, gitea: GiteaDouble) -> None:
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "gitea.branch": "release"}
    )
    result = run_cli(
        "--values",
        str(values),
        "submit",
        "--app",
        "citation",
        "--head",
        "--dry-run",
        env={"FABRIQUE_GITEA_TOKEN": gitea.token or ""},
    )
    assert result.exit_code == 3
    assert "branch 'release' of atlas/atlas: not found in Gitea" in result.stderr


def test_plan_writes_the_step_outputs(tmp_path: Path) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{
            "apps": [
                {
                    "name": "citation",
                    "image": "citation-dagster",
                    "context": "dataops/citation-dagster",
                    "dockerfile": "docker/Dockerfile",
                    "buildArgs": {"B": "2", "A": "one two"},
                    "writeback": {"repo": "atlas/atlas", "path": "k.yaml"},
                }
            ]
        },
    )
    out = tmp_path / "plan"
    result = run_cli(
        "--values",
        str(values),
        "plan",
        "--app",
        "citation",
        "--revision",
        REV,
        "--out",
        str(out),
        "--force",
        "true",
    )
    assert result.exit_code == 0, result.stderr
    files = {p.name: p.read_text() for p in out.iterdir()}
    assert files["image-ref"] == f"registry:80/citation-dagster:{REV[:12]}"
    assert files["cache-ref"] == "registry:80/citation-dagster:buildcache"
    assert files["context"] == "dataops/citation-dagster"
    assert files["dockerfile"] == "docker/Dockerfile"
    assert files["repo-url"] == "http://gitea-http.gitea.svc.cluster.local:3000/atlas/atlas.git"
    assert files["build-opts"] == "build-arg:A=one two\nbuild-arg:B=2"
    assert (files["build"], files["reason"]) == ("true", "forced")


@pytest.mark.parametrize("revision", ["", "HEAD", "a" * 39, "g" * 40, "a" * 41])
def test_plan_fails_the_workflow_on_a_bad_revision(tmp_path: Path, revision: str) -> None:
    out = tmp_path / "plan"
    result = run_cli("plan", "--app", "citation", "--revision", revision, "--out", str(out))
    assert result.exit_code == 2
    assert (
        "must be a full lowercase hex commit id (40 characters, or 64 in a SHA-256 repository)"
        in result.stderr
    )
    assert not out.exists()
