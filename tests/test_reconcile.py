"""The safety net: every decision row, idempotence, a race with the Sensor, partial failure.

Against the Gitea double (real bare repository), the real loopback registry holding real
images, and the Kubernetes API double.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fabrique.clients.kube import KubeClient
from fabrique.decisions.holds import Hold
from fabrique.decisions.reconcile import Facts, decide
from fabrique.decisions.workflow import build_workflow
from fabrique.site.config import load_site

from .conftest import (
    GITEA_TOKEN,
    KUSTOMIZATION,
    Repo,
    run_cli,
    unreachable_kubeconfig,
    write_values,
)
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble, argo_status
from .doubles.proxy import FaultProxy
from .oci import push_image
from .servers import GitDaemon, Registry

NS = "fabrique-build"


@pytest.fixture()
def env(tmp_path: Path, kube: KubeApiDouble) -> dict[str, str]:
    return {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }


def _values(
    tmp_path: Path, gitea: GiteaDouble, registry_host: str, apps: list[dict[str, Any]] | None = None
) -> Path:
    overrides: dict[str, Any] = {"gitea.url": gitea.url, "registry.host": registry_host}
    if apps is not None:
        overrides["apps"] = apps
    return write_values(tmp_path / "site.yaml", **overrides)


@pytest.fixture()
def values(tmp_path: Path, gitea: GiteaDouble, registry: Registry) -> Path:
    return _values(tmp_path, gitea, registry.host)


def _reconcile(values: Path, env: dict[str, str], *args: str):  # type: ignore[no-untyped-def]
    return run_cli("--values", str(values), "reconcile", *args, env=env)


def _line(result: Any, app: str = "citation") -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith(f"{app}: "))


def _phase(
    kube: KubeApiDouble,
    revision: str,
    phase: str,
    app: str = "citation",
    values: Path | None = None,
    **status: Any,
) -> str:
    """Put Workflow ``fabrique-<app>-<sha12>`` in ``phase``, its status as Argo writes it."""
    name = f"fabrique-{app}-{revision[:12]}"
    body = build_workflow(load_site(values, env={}), app, revision, submitted_by="sensor")
    stored = {**body, "status": argo_status(body, phase, **status)}
    # the controller labels each Workflow with its phase (common.LabelKeyPhase)
    stored["metadata"]["labels"]["workflows.argoproj.io/phase"] = phase
    assert not list(kube.validator.iter_errors(stored)), "the status is Argo's shape"
    kube.objects[(NS, name)] = stored
    return name


def _deployed(code_repo: Repo) -> dict[str, Any]:
    images = yaml.safe_load(code_repo.show(KUSTOMIZATION))["images"]
    return next(e for e in images if e["name"] == "citation-dagster")


def _posts(kube: KubeApiDouble) -> int:
    """Workflows created (the pass's memory is a ConfigMap, not counted here)."""
    return sum(1 for r in kube.requests if r.method == "POST" and "/workflows" in r.path)


# ------------------------------------------------------------ the decision table


def test_not_built_is_submitted_with_the_sensors_name(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    result = _reconcile(values, env)
    assert result.exit_code == 0, result.stderr
    assert _line(result).startswith(
        f"citation: submitted: {revision[:12]} is not built; created fabrique-citation-{revision[:12]}"
    )
    stored = kube.objects[(NS, f"fabrique-citation-{revision[:12]}")]
    assert stored["metadata"]["labels"]["fabrique.io/submitted-by"] == "reconciler"
    assert (
        stored["spec"]
        == build_workflow(load_site(env={}), "citation", revision, submitted_by="sensor")["spec"]
    )
    assert result.stdout.splitlines()[-1] == "reconcile: 1 app(s): 1 submitted"


def test_in_flight_is_left_alone(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    for phase in ("Pending", "Running"):
        name = _phase(kube, revision, phase)
        result = _reconcile(values, env)
        assert _line(result) == f"citation: in-flight: {name} is {phase}"
    assert _posts(kube) == 0


def test_verified_but_not_written_back_is_written_back(
    code_repo: Repo, values: Path, env: dict[str, str], registry: Registry, kube: KubeApiDouble
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    digest = push_image(registry.url, "citation-dagster", revision[:12])
    _phase(kube, revision, "Succeeded", verified=digest)
    result = _reconcile(values, env)
    assert result.exit_code == 0, result.stderr
    assert _line(result).startswith("citation: written-back: ")
    assert _deployed(code_repo) == {
        "name": "citation-dagster",
        "newName": f"{registry.host}/citation-dagster",
        "newTag": revision[:12],
        "digest": digest,
    }
    assert "Workflow: fabrique-reconcile" in code_repo.git("log", "-1", "--format=%B", "main")


@pytest.mark.parametrize("phase", ["Failed", "Error"])
def test_failed_is_reported_not_resubmitted(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble, phase: str
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    name = _phase(kube, revision, phase)
    for _ in range(2):
        result = _reconcile(values, env)
        assert result.exit_code == 0, "a failed build is reported, not an error of the pass"
        assert _line(result).startswith(f"citation: failed: {name} {phase}")
    assert _posts(kube) == 0


def test_a_failed_verify_is_never_written_back(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble, registry: Registry
) -> None:
    """Another push overwrote the tag between the build and verify-digest: the Workflow
    failed there, and the tag now holds what someone else chose. It is not deployed."""
    head_before = code_repo.git("rev-parse", "main").strip()
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    head = code_repo.head()
    foreign = push_image(registry.url, "citation-dagster", revision[:12], {"x": b"not ours\n"})
    why = "the build pushed sha256:" + "a" * 64 + " but the registry holds " + foreign
    # the container's log tail, fabrique's one line, as Argo carries it on the node
    name = _phase(kube, revision, "Failed", failed_step="verify-digest", message=f"error: {why}")
    for _ in range(2):
        result = _reconcile(values, env)
        assert result.exit_code == 0, result.stderr
        assert _line(result).startswith(f"citation: failed: {name} Failed: verify-digest: {why}")
    assert code_repo.head() == head and head != head_before, "nothing written back"
    assert foreign not in code_repo.show(KUSTOMIZATION)
    assert _posts(kube) == 0, "not resubmitted by the pass"


def test_only_the_verified_digest_is_written_back(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble, registry: Registry
) -> None:
    """The tag moved after a successful verify: the Workflow's record is what deploys."""
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    verified = push_image(registry.url, "citation-dagster", revision[:12])
    _phase(kube, revision, "Succeeded", verified=verified)
    foreign = push_image(registry.url, "citation-dagster", revision[:12], {"x": b"not ours\n"})
    assert foreign != verified
    result = _reconcile(values, env)
    assert _line(result).startswith("citation: written-back: "), result.stdout
    assert _deployed(code_repo)["digest"] == verified


def test_an_image_without_a_verified_build_is_rebuilt_not_deployed(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble, registry: Registry
) -> None:
    """A tag with no Workflow behind it proves nothing: build it, and let the build verify."""
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    head = code_repo.head()
    push_image(registry.url, "citation-dagster", revision[:12], {"x": b"pushed by hand\n"})
    result = _reconcile(values, env)
    assert _line(result).startswith(
        f"citation: submitted: {revision[:12]} has an image under its tag but no verified build"
    )
    assert code_repo.head() == head
    assert (NS, f"fabrique-citation-{revision[:12]}") in kube.objects


def test_succeeded_without_image_is_failed(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    name = _phase(kube, revision, "Succeeded")
    assert _line(_reconcile(values, env)).startswith(
        f"citation: failed: {name} is Succeeded but recorded no verified digest"
    )


def test_deployed_is_ok_and_two_passes_change_nothing(
    code_repo: Repo, values: Path, env: dict[str, str], registry: Registry, kube: KubeApiDouble
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    digest = push_image(registry.url, "citation-dagster", revision[:12])
    _phase(kube, revision, "Succeeded", verified=digest)
    assert _line(_reconcile(values, env)).startswith("citation: written-back")
    head = code_repo.head()  # the write-back commit itself is inside the context
    for _ in range(2):
        result = _reconcile(values, env)
        assert _line(result).startswith(f"citation: ok: deploys {revision[:12]}")
        assert result.stdout.splitlines()[-1] == "reconcile: 1 app(s): 1 ok"
    assert code_repo.head() == head, "no commit"
    assert _posts(kube) == 0, "no Workflow"


def test_a_commit_elsewhere_does_not_move_want(
    code_repo: Repo, values: Path, env: dict[str, str], registry: Registry, kube: KubeApiDouble
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    digest = push_image(registry.url, "citation-dagster", revision[:12])
    _phase(kube, revision, "Succeeded", verified=digest)
    _reconcile(values, env)
    code_repo.commit({"dataops/other-app/Dockerfile": "FROM scratch\n# v2\n"})
    assert _line(_reconcile(values, env)).startswith(f"citation: ok: deploys {revision[:12]}")


def test_dry_run_takes_no_action(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble
) -> None:
    code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    result = _reconcile(values, env, "--dry-run")
    assert _line(result).startswith("citation: would-submit: ")
    assert _posts(kube) == 0


def _facts(**changes: Any) -> Facts:
    base: dict[str, Any] = dict(
        app="citation",
        want="b" * 40,
        deployed_revision="a" * 40,
        deployed_tag="a" * 12,
        deployed_digest="sha256:" + "1" * 64,
        deployed_is_current=False,
        built_digest=None,
        workflow="fabrique-citation-" + "b" * 12,
        phase=None,
    )
    return Facts(**(base | changes))


BUILT = {"built_digest": "sha256:" + "2" * 64}
REVIEW = {"review": "http://gitea/cluster/apps/pulls/1"}
VERIFIED = {
    "phase": "Succeeded",
    "workflow_revision": "b" * 40,
    "verified_digest": "sha256:" + "2" * 64,
    "verified_held": True,
}


@pytest.mark.parametrize(
    ("changes", "action"),
    [
        ({"deployed_is_current": True}, "ok"),
        ({"want": None}, "ok"),
        ({"phase": "Pending"}, "in-flight"),
        ({"phase": "Running"} | BUILT, "in-flight"),
        (VERIFIED, "write-back"),
        (VERIFIED | BUILT, "write-back"),
        # the tag moved after the verify: the record still deploys, not the tag
        (VERIFIED | {"built_digest": "sha256:" + "3" * 64}, "write-back"),
        # a tag is no proof: a failed verify is never written back
        (BUILT | {"phase": "Failed"}, "failed"),
        (BUILT | {"phase": "Error"}, "failed"),
        (VERIFIED | {"phase": "Failed"}, "failed"),
        ({"phase": "Failed"}, "failed"),
        ({"phase": "Error"}, "failed"),
        ({"phase": "Succeeded"}, "failed"),
        (BUILT | {"phase": "Succeeded", "workflow_revision": "b" * 40}, "failed"),
        (VERIFIED | {"verified_held": False}, "failed"),
        (VERIFIED | {"workflow_revision": "c" * 40}, "failed"),
        (VERIFIED | {"phase": "Omitted"}, "failed"),
        ({}, "submit"),
        (BUILT, "submit"),
        ({"deployed_revision": None, "deployed_tag": None}, "submit"),
        # want is proposed in an open pull request: neither rebuilt nor written again
        (REVIEW, "in-review"),
        (REVIEW | VERIFIED, "in-review"),
        (REVIEW | {"phase": "Failed"}, "in-review"),
        (REVIEW | {"deployed_is_current": True}, "ok"),
        (REVIEW | {"hold": Hold("alice", "2026-12-05T10:00:00Z", "incident")}, "held"),
    ],
)
def test_decision_table(changes: dict[str, Any], action: str) -> None:
    assert decide(_facts(**changes))[0] == action


def test_a_failed_workflow_says_why() -> None:
    _, detail = decide(_facts(phase="Failed", reason="verify-digest(0): digest mismatch"))
    assert "Failed: verify-digest(0): digest mismatch; nothing written back" in detail


# --------------------------------------------------------------- races, failures


def test_reconciler_and_sensor_race_for_the_same_commit(
    tmp_path: Path, code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble
) -> None:
    from kubernetes import config as k8s_config

    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    sensor_client = KubeClient(k8s_config.new_client_from_config(config_file=env["KUBECONFIG"]))
    body = build_workflow(load_site(env={}), "citation", revision, submitted_by="sensor")
    outcome: dict[str, Any] = {}
    start = threading.Barrier(2)

    def sensor() -> None:
        start.wait()
        outcome["sensor"] = sensor_client.create_workflow(body)

    thread = threading.Thread(target=sensor)
    thread.start()
    start.wait()
    result = _reconcile(values, env)
    thread.join(timeout=30)
    assert len(kube.objects) == 1
    created = [r for r in kube.requests if r.method == "POST"]
    assert 1 <= len(created) <= 2
    line = _line(result)
    if outcome["sensor"].created:
        assert line.startswith("citation: in-flight: "), line  # saw it, or met 409 already exists
    else:
        assert line.startswith("citation: submitted: "), line


def test_one_app_registry_down_others_still_reconciled(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    kube: KubeApiDouble,
) -> None:
    proxy = FaultProxy(
        registry.url, lambda method, path, headers: 503 if path.startswith("/v2/broken/") else None
    ).start()
    try:
        apps = [
            {
                "name": "citation",
                "image": "citation-dagster",
                "context": "dataops/citation-dagster",
                "writeback": {"repo": "atlas/atlas", "path": KUSTOMIZATION},
            },
            {
                "name": "other",
                "image": "broken",
                "context": "dataops/other-app",
                "writeback": {
                    "repo": "atlas/atlas",
                    "path": "dataops/other-app/kustomization.yaml",
                    "create": True,
                },
            },
        ]
        values = _values(tmp_path, gitea, proxy.host, apps)
        revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
        code_repo.commit({"dataops/other-app/Dockerfile": "FROM scratch\n# v2\n"})
        result = _reconcile(values, env)
    finally:
        proxy.stop()
    assert _line(result).startswith("citation: submitted: ")
    assert (NS, f"fabrique-citation-{revision[:12]}") in kube.objects
    assert _line(result, "other").startswith("other: error: ")
    assert "503" in _line(result, "other")
    assert result.exit_code == 75
    assert "1 app(s) could not be checked: other" in result.stderr
    assert proxy.faulted > 0


def test_kube_api_down_is_an_error_for_every_app(
    code_repo: Repo, values: Path, tmp_path: Path
) -> None:

    config = unreachable_kubeconfig(tmp_path / "down.kubeconfig")
    code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    result = _reconcile(values, {"KUBECONFIG": str(config), "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN})
    assert result.exit_code == 75
    assert _line(result).startswith("citation: error: get Workflow")


# ------------------------------------------------------------------------- status


def test_status_table_and_json_are_read_only(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble, registry: Registry
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    head = code_repo.head()
    table = run_cli("--values", str(values), "status", env=env)
    assert table.exit_code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["APP", "STATE", "WANT", "DEPLOYED", "BUILT", "WORKFLOW", "GITEA"]
    assert lines[1].split()[:3] == ["citation", "not-built", revision[:12]]
    assert lines[0].index("STATE") == lines[1].index("not-built"), "columns are aligned"

    digest = push_image(registry.url, "citation-dagster", revision[:12])
    _phase(kube, revision, "Succeeded", verified=digest)
    as_json = run_cli("--values", str(values), "status", "--output", "json", env=env)
    (entry,) = json.loads(as_json.stdout)
    assert entry["state"] == "built-not-deployed"
    assert entry["facts"]["want"] == revision
    assert entry["facts"]["built_digest"] == digest
    assert entry["facts"]["workflow"] == f"fabrique-citation-{revision[:12]}"
    assert code_repo.head() == head and _posts(kube) == 0


def test_status_of_an_unknown_app(values: Path, env: dict[str, str]) -> None:
    result = run_cli("--values", str(values), "status", "--app", "nope", env=env)
    assert result.exit_code == 2
    assert "app 'nope': not in the site config" in result.stderr


# ------------------------------------------------------------------ git transport


@pytest.mark.parametrize("concurrency", [1, 8])
def test_git_transport_reconciles_each_app_at_its_own_change(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    git_daemon: GitDaemon,
    env: dict[str, str],
    kube: KubeApiDouble,
    concurrency: int,
) -> None:
    """Three apps, three contexts, one git remote shared by the pass's threads: each app
    wants the commit that changed it, not the tip, and no thread trips on another."""
    contexts = {"citation": "dataops/citation-dagster", "other": "dataops/other-app"}
    contexts |= {"third": "dataops/third"}
    apps = [
        {
            "name": name,
            "image": f"{name}-image",
            "context": context,
            "writeback": {
                "repo": "atlas/atlas",
                "path": f"{context}/deploy/kustomization.yaml",
                "create": True,
            },
        }
        for name, context in contexts.items()
    ]
    values = _values(tmp_path, gitea, registry.host, apps)
    values.write_text(
        values.read_text()
        + yaml.safe_dump(
            {
                "writeback": {"transport": "git", "gitUrl": git_daemon.url("")[:-1]},
                "reconcile": {"concurrency": concurrency},
            }
        )
    )
    changed = {
        name: code_repo.commit({f"{context}/src.txt": f"{name} v2\n"}, f"change {name}")
        for name, context in contexts.items()
    }
    code_repo.commit({"README.md": "the tip touches no app\n"}, "docs")
    result = _reconcile(values, env)
    assert result.exit_code == 0, result.stderr
    for name, revision in changed.items():
        assert _line(result, name).startswith(f"{name}: submitted: {revision[:12]} is not built")
    assert set(kube.objects) == {(NS, f"fabrique-{n}-{r[:12]}") for n, r in changed.items()}


def test_one_apps_refused_write_back_does_not_hold_back_its_file(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    kube: KubeApiDouble,
) -> None:
    """Two apps pin their images in one file. One deploys a hand-written tag that is no
    commit, and its wanted commit is not the head: the guard refuses it (fail closed).
    The other app's write-back still lands."""
    apps = [
        {
            "name": name,
            "image": image,
            "context": context,
            "writeback": {"repo": "atlas/atlas", "path": KUSTOMIZATION},
        }
        for name, image, context in (
            ("citation", "citation-dagster", "dataops/citation-dagster"),
            ("other", "other-image", "dataops/other-app"),
        )
    ]
    values = _values(tmp_path, gitea, registry.host, apps)
    hand = code_repo.show(KUSTOMIZATION) + "  - name: citation-dagster\n    newTag: 1.4.2\n"
    code_repo.commit({KUSTOMIZATION: hand}, "pinned by hand")
    wants = {
        "citation": code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"}),
        "other": code_repo.commit({"dataops/other-app/src.txt": "v2\n"}),
    }
    for app, revision in wants.items():
        image = "citation-dagster" if app == "citation" else "other-image"
        digest = push_image(registry.url, image, revision[:12])
        _phase(kube, revision, "Succeeded", app, values, verified=digest)
    result = _reconcile(values, env)
    assert _line(result, "citation").startswith(
        "citation: error: deployed tag '1.4.2' is not a commit of atlas/atlas@main"
    )
    assert _line(result, "other").startswith("other: written-back: "), result.stdout
    pins = {
        e["name"]: e.get("newTag") for e in yaml.safe_load(code_repo.show(KUSTOMIZATION))["images"]
    }
    assert pins["citation-dagster"] == "1.4.2" and pins["other-image"] == wants["other"][:12]


def test_a_branch_name_deployed_as_a_tag_is_no_deployed_revision(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble, gitea: GiteaDouble
) -> None:
    """`newTag: main` resolves, through Gitea's "ref or sha", to the branch head: taken for
    a commit, it made every push "already deployed" and the net say ok forever, so the
    mutable tag was never replaced. Only a commit id is a deployed revision."""
    from fabrique.decisions.changes import needs_build
    from fabrique.decisions.writeback import open_transport

    text = code_repo.show(KUSTOMIZATION)
    code_repo.commit(
        {
            KUSTOMIZATION: text
            + "  - name: citation-dagster\n    newName: registry:80/citation-dagster\n    newTag: main\n"
        },
        "deployed by a branch tag",
    )
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    site = load_site(values, env={})
    with open_transport(site, GITEA_TOKEN) as transport:
        decision = needs_build(site, transport, "citation", revision)
    assert decision.build, decision
    assert "deployed tag 'main' is not a commit" in decision.reason
    result = _reconcile(values, env)
    assert _line(result).startswith(f"citation: submitted: {revision[:12]} is not built"), (
        result.stdout
    )


def test_pull_request_mode_proposes_then_waits_in_review_then_is_ok_once_merged(
    code_repo: Repo,
    tmp_path: Path,
    gitea: GiteaDouble,
    env: dict[str, str],
    registry: Registry,
    kube: KubeApiDouble,
) -> None:
    """writeback.mode pull-request: the net's write-back proposes the verified digest;
    the next pass finds it in the open pull request (in-review: no Workflow, no write),
    and once Gitea merged it the app is ok."""
    values = write_values(
        tmp_path / "site.yaml",
        **{"gitea.url": gitea.url, "registry.host": registry.host},
        **{"writeback.mode": "pull-request", "writeback.pullRequest.autoMerge": True},
    )
    gitea.protect("atlas/atlas", "main", checks=["ci/lint"])
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    digest = push_image(registry.url, "citation-dagster", revision[:12])
    _phase(kube, revision, "Succeeded", values=values, verified=digest)
    main = code_repo.git("rev-parse", "main")

    first = _reconcile(values, env, "--app", "citation")
    assert first.exit_code == 0, first.stderr
    assert _line(first).startswith("citation: proposed: "), first.stdout
    (pull,) = gitea.pulls["atlas/atlas"]
    assert pull["head"] == "fabrique/citation" and code_repo.git("rev-parse", "main") == main

    second = _reconcile(values, env, "--app", "citation")
    line = _line(second)
    assert line.startswith("citation: in-review: ") and "/atlas/atlas/pulls/1" in line, line
    assert _posts(kube) == 0 and code_repo.git("rev-parse", "main") == main
    status = run_cli("--values", str(values), "status", "--app", "citation", env=env)
    assert "citation: " + revision[:12] in status.stdout and "/pulls/1" in status.stdout

    head = code_repo.git("rev-parse", "fabrique/citation").strip()
    with httpx.Client(base_url=f"{gitea.url}/api/v1") as api:
        posted = api.post(
            f"/repos/atlas/atlas/statuses/{head}",
            json={"context": "ci/lint", "state": "success"},
            headers={"Authorization": f"token {GITEA_TOKEN}"},
        )
    assert posted.status_code == 201 and pull["merged"]
    assert _deployed(code_repo)["digest"] == digest
    (proposed,) = [
        s
        for s in gitea.latest_statuses("atlas/atlas", revision)
        if s["context"] == "fabrique/citation"
    ]
    assert "proposed in a pull request" in proposed["description"]
    assert _line(_reconcile(values, env, "--app", "citation")).startswith("citation: ok: ")
    # merged since it said so: the status now says what is deployed
    (deployed,) = [
        s
        for s in gitea.latest_statuses("atlas/atlas", revision)
        if s["context"] == "fabrique/citation"
    ]
    assert deployed["description"] == f"safety net: {digest} deployed"
