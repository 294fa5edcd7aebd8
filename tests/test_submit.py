"""First-step mode: `fabrique submit` against the Kubernetes API double, and `plan`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.decisions import workflow as submission
from fabrique.decisions.workflow import build_workflow, workspace_claim
from fabrique.site.config import load_site
from fabrique.site.names import workflow_name

from .conftest import GITEA_TOKEN, CodeRepo, run_cli, unreachable_kubeconfig, write_values
from .doubles.gitea import GiteaDouble
from .doubles.http import Request
from .doubles.kube import KubeApiDouble, status
from .servers import Registry
from .test_reconcile import _line, _reconcile, _values

REV = "9c1d0f3b2a4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c"
NS = "fabrique-build"
CLAIMS = re.compile(r"^/api/v1/namespaces/([^/]+)/persistentvolumeclaims/([^/]+)$")


class ClaimsDouble(KubeApiDouble):
    """The double, with the workspace claims the Argo controller makes and the garbage
    collector deletes: a claim of a deleted Workflow stays (``deletionTimestamp`` set, a
    finalizer holding it) for ``lingers`` reads, then is gone. A Workflow created while
    a claim of its name that it does not own exists is one the controller fails
    (``createPVCs``, operator.go): it is recorded in ``collided``."""

    def __init__(self, specs: Path) -> None:
        super().__init__(specs)
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.lingers: dict[tuple[str, str], int] = {}
        self.collided: list[str] = []

    def old_claim(self, workflow: str, *, reads: int | None) -> str:
        """The claim of an earlier ``workflow``, deleted with it; gone after ``reads``
        reads (None: it stays)."""
        name = workspace_claim(workflow)
        self.claims[(NS, name)] = claim_object(name, "uid-of-the-deleted-workflow", deleting=True)
        if reads is not None:
            self.lingers[(NS, name)] = reads
        return name

    def _handle(self, request: Request) -> tuple[int, Any]:
        claim = CLAIMS.match(request.path)
        if claim and request.method == "GET":
            with self._lock:
                self.requests.append(request)
                key = (claim[1], claim[2])
                if key in self.lingers:
                    self.lingers[key] -= 1
                    if self.lingers[key] < 0:
                        del self.lingers[key], self.claims[key]
                found = self.claims.get(key)
                if found is None:
                    message = f'persistentvolumeclaims "{key[1]}" not found'
                    return 404, status(404, "NotFound", message)
                return 200, found
        if request.method == "POST" and request.path.endswith("/workflows"):
            name = (request.json() or {}).get("metadata", {}).get("name", "")
            with self._lock:
                held = self.claims.get((NS, workspace_claim(name)))
            answer = super()._handle(request)
            if answer[0] == 201 and held is not None:
                self.collided.append(name)
            return answer
        return super()._handle(request)


def claim_object(name: str, owner_uid: str, *, deleting: bool) -> dict[str, Any]:
    """A workspace claim as the Argo controller creates it (its owner, the Workflow)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-of-{name}",
        "finalizers": ["kubernetes.io/pvc-protection"],
        "ownerReferences": [
            {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Workflow",
                "name": name.removesuffix("-workspace"),
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta}


@pytest.fixture()
def kube(specs: Path) -> Iterator[ClaimsDouble]:
    double = ClaimsDouble(specs).start()
    try:
        yield double
    finally:
        double.stop()


@pytest.fixture()
def net(
    tmp_path: Path, gitea: GiteaDouble, registry: Registry, kube: ClaimsDouble
) -> tuple[Path, dict[str, str]]:
    """The safety net's values file and environment (as in test_reconcile.py)."""
    env = {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }
    return _values(tmp_path, gitea, registry.host), env


@pytest.fixture()
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submission, "CLAIM_POLL_SECONDS", 0.01)


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


def test_a_resubmission_waits_for_the_earlier_workflows_claim_to_be_collected(
    kube: ClaimsDouble, kubeconfig: dict[str, str], fast_polls: None
) -> None:
    """The Workflow was deleted; its claim, of the name the new one's will have, is
    still being collected. Created now, the new Workflow would fail on it for good."""
    name = f"fabrique-citation-{REV[:12]}"
    claim = kube.old_claim(name, reads=3)
    result = run_cli("-v", "submit", "--app", "citation", "--revision", REV, env=kubeconfig)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"created: workflow {NS}/{name}"
    assert f"claim {claim} of an earlier Workflow of that name is being deleted" in result.stderr
    assert kube.collided == [], "created only once the old claim was gone"
    assert (NS, name) in kube.objects


def test_a_claim_that_outlives_the_wait_creates_nothing_and_exits_75(
    kube: ClaimsDouble,
    kubeconfig: dict[str, str],
    fast_polls: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(submission, "CLAIM_WAIT_SECONDS", 0.1)
    name = f"fabrique-citation-{REV[:12]}"
    claim = kube.old_claim(name, reads=None)
    result = run_cli("submit", "--app", "citation", "--revision", REV, env=kubeconfig)
    assert result.exit_code == 75, result.stderr
    assert f"claim {NS}/{claim} of an earlier {name} is still there after" in result.stderr
    assert kube.objects == {}


def test_the_workflows_own_claim_holds_nothing_back(
    kube: ClaimsDouble, kubeconfig: dict[str, str]
) -> None:
    first = run_cli("submit", "--app", "citation", "--revision", REV, env=kubeconfig)
    assert first.exit_code == 0, first.stderr
    name = f"fabrique-citation-{REV[:12]}"
    uid = kube.objects[(NS, name)]["metadata"]["uid"]
    claim = workspace_claim(name)
    kube.claims[(NS, claim)] = claim_object(claim, uid, deleting=False)
    again = run_cli("submit", "--app", "citation", "--revision", REV, env=kubeconfig)
    assert again.stdout.strip() == f"already exists: workflow {NS}/{name}"


def test_the_safety_net_resubmits_a_deleted_build_once_its_claim_is_gone(
    code_repo: CodeRepo,
    net: tuple[Path, dict[str, str]],
    kube: ClaimsDouble,
    fast_polls: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass whose wait runs out creates nothing and says why; the next one submits."""
    values, env = net
    # a pass waits less than `fabrique submit`: its deadline may be a minute
    assert submission.PASS_CLAIM_WAIT_SECONDS < 60 / 2 < submission.CLAIM_WAIT_SECONDS
    monkeypatch.setattr(submission, "PASS_CLAIM_WAIT_SECONDS", 0.1)
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    name = f"fabrique-citation-{revision[:12]}"
    claim = kube.old_claim(name, reads=None)
    waiting = _reconcile(values, env)
    assert waiting.exit_code == 0, waiting.stderr
    assert _line(waiting).startswith(
        f"citation: in-flight: claim {NS}/{claim} of an earlier {name} is still there"
    )
    assert kube.objects == {}
    del kube.claims[(NS, claim)]  # collected
    submitted = _reconcile(values, env)
    assert _line(submitted).startswith("citation: submitted: "), submitted.stdout
    assert (NS, name) in kube.objects
    assert kube.collided == []


def test_the_workspace_claim_is_named_as_the_argo_controller_names_it() -> None:
    """``<workflow>-<volumeClaimTemplates entry>``, the template's one entry."""
    from fabrique.site.config import load_site as site
    from pipelines.build import build_template

    template = build_template(site(env={})).to_dict()
    (entry,) = template["spec"]["volumeClaimTemplates"]
    name = f"fabrique-citation-{REV[:12]}"
    assert workspace_claim(name) == f"{name}-{entry['metadata']['name']}"


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
