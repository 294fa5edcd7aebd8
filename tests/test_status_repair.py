"""The safety net repairs commit statuses, and `fabrique status` shows them.

Against the Gitea double (statuses checked against the swagger), the loopback registry
and the Kubernetes API double, with `fabrique reconcile` and `fabrique status` run
in-process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

from fabrique.clients.gitea import CommitStatus, GiteaClient
from fabrique.decisions.memory import Memory
from fabrique.decisions.status import PROPOSED, WRITTEN, written
from fabrique.decisions.writeback import State
from fabrique.site.config import load_site
from fabrique.site.names import RECONCILE_MEMORY, WRITEBACK_OUTCOMES

from .conftest import GITEA_TOKEN, KUSTOMIZATION, Repo, run_cli
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .oci import push_image
from .servers import Registry
from .test_reconcile import _line, _phase, _posts, _reconcile, _values, env, values  # noqa: F401

REPO = "atlas/atlas"
CONTEXT = "fabrique/citation"


def _history(gitea: GiteaDouble, revision: str) -> list[tuple[str, str]]:
    return [
        (s["status"], s["description"])
        for s in gitea.statuses.get((REPO, revision), [])
        if s["context"] == CONTEXT
    ]


def _post(gitea: GiteaDouble, revision: str, state: str, description: str) -> None:
    with GiteaClient(gitea.url, GITEA_TOKEN) as client:
        client.create_status(REPO, revision, CommitStatus(CONTEXT, state, description))


def _change(code_repo: Repo) -> str:
    return code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})


def _seen_running_then_superseded(
    code_repo: Repo, site: Path, environ: dict[str, str], kube: KubeApiDouble, gitea: GiteaDouble
) -> tuple[str, str]:
    """A commit reported pending whose build a pass saw running, then a newer commit
    wanted: the commit and its Workflow's name."""
    old = _change(code_repo)
    _post(gitea, old, "pending", "building")
    name = _phase(kube, old, "Running")
    code_repo.commit({"dataops/citation-dagster/app.txt": "v3\n"})
    assert _reconcile(site, environ).exit_code == 0
    return old, name


def _assert_read_no_more(
    gitea: GiteaDouble, revision: str, site: Path, environ: dict[str, str]
) -> None:
    """Once closed, the next pass does not read the commit's statuses again."""
    reads = _status_reads(gitea, revision)
    assert _reconcile(site, environ).exit_code == 0
    assert _status_reads(gitea, revision) == reads


def test_the_nets_write_back_reports_success_on_the_commit(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    registry: Registry,
    gitea: GiteaDouble,
) -> None:
    revision = _change(code_repo)
    digest = push_image(registry.url, "citation-dagster", revision[:12])
    _phase(kube, revision, "Succeeded", verified=digest)
    _post(gitea, revision, "pending", "building")  # the Workflow's report-success was lost
    result = _reconcile(values, env)
    assert result.exit_code == 0, result.stderr
    assert _line(result).endswith("; changed; status success posted")
    commit = code_repo.head()
    assert _history(gitea, revision)[-1] == (
        "success",
        f"safety net: deployed {digest}; changed, commit {commit[:12]}",
    )
    # the next pass finds the commit deployed and its status right: it posts nothing
    before = len(gitea.statuses[(REPO, revision)])
    again = _reconcile(values, env)
    assert _line(again).startswith("citation: ok: ")
    assert len(gitea.statuses[(REPO, revision)]) == before


def test_a_deployed_commit_whose_success_report_was_lost_is_set_to_success(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    gitea: GiteaDouble,
) -> None:
    revision = _change(code_repo)
    digest = "sha256:" + "5" * 64
    _post(gitea, revision, "pending", "building")  # report-pending, then the build...
    written = run_cli(  # ...wrote back, and its report-success met a Gitea down
        *("--values", str(values), "writeback", "--app", "citation", "--revision", revision),
        *("--digest", digest),
        env=env,
    )
    assert written.exit_code == 0, written.stderr
    result = _reconcile(values, env)
    assert _line(result).startswith("citation: ok: ")
    assert _line(result).endswith("; status success posted")
    assert _history(gitea, revision)[-1] == ("success", f"safety net: {digest} deployed")
    # once seen as success for that want, a pass where nothing changed does not ask again
    before = [r.path for r in gitea.requests]
    again = _reconcile(values, env)
    assert _line(again) == f"citation: ok: deploys {revision[:12]} (want {revision[:12]})"
    assert not [p for p in (r.path for r in gitea.requests[len(before) :]) if "/status" in p]


def test_a_failed_workflow_whose_report_was_lost_is_set_to_failure(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    gitea: GiteaDouble,
) -> None:
    revision = _change(code_repo)
    _phase(kube, revision, "Failed", failed_step="build", message="error: failed to solve")
    _post(gitea, revision, "pending", "building")
    for _ in range(2):  # a replayed pass adds nothing
        result = _reconcile(values, env)
        assert result.exit_code == 0, result.stderr
    assert _history(gitea, revision) == [
        ("pending", "building"),
        ("failure", "safety net: build: failed to solve"),
    ]
    assert _posts(kube) == 0


def test_a_failure_the_exit_handler_reported_is_left_alone(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    gitea: GiteaDouble,
) -> None:
    revision = _change(code_repo)
    _phase(kube, revision, "Failed", failed_step="build", message="Error (exit code 1)")
    _post(gitea, revision, "failure", "build: failed to solve")
    _reconcile(values, env)
    assert _history(gitea, revision) == [("failure", "build: failed to solve")]


def test_a_pending_status_whose_workflow_is_gone_is_set_to_error(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    gitea: GiteaDouble,
) -> None:
    revision = _change(code_repo)
    _post(gitea, revision, "pending", "building")  # and then the Workflow was deleted
    result = _reconcile(values, env)
    assert _line(result).startswith("citation: submitted: ")
    assert _line(result).endswith("; status error posted")
    name = f"fabrique-citation-{revision[:12]}"
    assert _history(gitea, revision)[-1] == (
        "error",
        f"safety net: {name} no longer exists; resubmitted",
    )
    assert (("fabrique-build", name)) in kube.objects


def test_dry_run_and_status_post_nothing(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    gitea: GiteaDouble,
) -> None:
    revision = _change(code_repo)
    _post(gitea, revision, "pending", "building")
    _reconcile(values, env, "--dry-run")
    run_cli("--values", str(values), "status", env=env)
    assert _history(gitea, revision) == [("pending", "building")]


def test_status_shows_the_gitea_status_of_the_wanted_commit(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    gitea: GiteaDouble,
) -> None:
    revision = _change(code_repo)
    table = run_cli("--values", str(values), "status", env=env)
    header, row = table.stdout.splitlines()[:2]
    assert header.split()[-1] == "GITEA" and row.split()[-1] == "none"
    _post(gitea, revision, "pending", f"building citation-dagster:{revision[:12]}")
    table = run_cli("--values", str(values), "status", env=env)
    header, row = table.stdout.splitlines()[:2]
    assert row.split()[-1] == "pending"
    assert header.index("GITEA") == row.index("pending"), "columns are aligned"
    (entry,) = json.loads(run_cli("--values", str(values), "status", "-o", "json", env=env).stdout)
    assert entry["facts"]["status"].pop("created_at").startswith("20")  # when it was posted
    assert entry["facts"]["status"] == {
        "context": CONTEXT,
        "state": "pending",
        "description": f"building citation-dagster:{revision[:12]}",
        "target_url": "",
    }


def test_a_gitea_that_fails_the_status_read_fails_no_decision(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    gitea: GiteaDouble,
) -> None:
    revision = _change(code_repo)
    original = gitea.server.handle

    def status_down(request: Any) -> Any:  # only the status reads fail, every attempt
        if request.path.endswith("/status"):
            return 503, {"message": "injected", "url": gitea.url}
        return original(request)

    gitea.server.handle = status_down
    try:
        result = _reconcile(values, env)
        table = run_cli("--values", str(values), "status", env=env)
    finally:
        gitea.server.handle = original
    assert result.exit_code == 0, result.stderr
    assert _line(result).startswith("citation: submitted: ")
    assert "the commit status of" in result.stderr and "is unknown" in result.stderr
    assert table.stdout.splitlines()[1].split()[-1] == "?"
    assert _history(gitea, revision) == []


# ------------------------------------------ older commits' builds that never reported


def _status_reads(gitea: GiteaDouble, revision: str) -> int:
    return sum(1 for r in gitea.requests if r.method == "GET" and revision in r.path)


def test_an_older_commits_terminated_build_has_its_pending_status_closed(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    gitea: GiteaDouble,
) -> None:
    """`argo terminate` skips the exit handler: the commit kept `pending` for good, and a
    newer commit is now the one the net looks after. The net closes it, once."""
    old = _change(code_repo)
    _post(gitea, old, "pending", "building")
    _phase(kube, old, "Failed", failed_step="build", message="Stopped with strategy 'Terminate'")
    failed = code_repo.commit({"dataops/citation-dagster/app.txt": "v3\n"})
    _post(gitea, failed, "pending", "building")
    _phase(kube, failed, "Failed", failed_step="build", message="error: failed to solve")
    newest = code_repo.commit({"dataops/citation-dagster/app.txt": "v4\n"})
    result = _reconcile(values, env)
    assert result.exit_code == 0, result.stderr
    assert _line(result).startswith("citation: submitted: ")
    assert _history(gitea, old)[-1] == (
        "error",
        "safety net: build: Stopped with strategy 'Terminate'",
    )
    # a step that failed for the commit's own sake is a failure, as the exit handler says
    assert _history(gitea, failed)[-1] == ("failure", "safety net: build: failed to solve")
    assert _history(gitea, newest) == []
    # settled: the next passes neither read those statuses again nor post anything
    reads = _status_reads(gitea, old)
    for _ in range(2):
        assert _reconcile(values, env).exit_code == 0
    assert _status_reads(gitea, old) == reads
    assert len(_history(gitea, old)) == 2


def test_an_older_commits_build_deleted_while_it_ran_has_its_pending_status_closed(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    gitea: GiteaDouble,
) -> None:
    old, name = _seen_running_then_superseded(code_repo, values, env, kube, gitea)
    assert _history(gitea, old) == [("pending", "building")], "running: left alone"
    del kube.objects[("fabrique-build", name)]  # `kubectl delete workflow`, mid-build
    assert _reconcile(values, env).exit_code == 0
    assert _history(gitea, old)[-1] == (
        "error",
        f"safety net: {name} was deleted before it ended",
    )
    _assert_read_no_more(gitea, old, values, env)


def test_a_build_that_ended_and_reported_is_read_once_and_left_alone(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    gitea: GiteaDouble,
) -> None:
    old = _change(code_repo)
    _phase(kube, old, "Failed", failed_step="build", message="error: failed to solve")
    _post(gitea, old, "failure", "build: failed to solve")  # its exit handler's report
    code_repo.commit({"dataops/citation-dagster/app.txt": "v3\n"})
    for _ in range(2):
        assert _reconcile(values, env).exit_code == 0
    assert _history(gitea, old) == [("failure", "build: failed to solve")]
    assert _status_reads(gitea, old) == 1


def test_the_sweep_lists_no_workflow_that_succeeded(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
) -> None:
    """Succeeded builds reported themselves and are most of what a day leaves: the one
    LIST of a pass leaves them out by the controller's phase label."""
    from kubernetes import config as k8s_config

    from fabrique.clients.kube import KubeClient
    from fabrique.decisions.reconcile import SWEPT

    succeeded = _phase(kube, _change(code_repo), "Succeeded")
    failed = _phase(kube, code_repo.commit({"dataops/citation-dagster/app.txt": "v3\n"}), "Failed")
    api = k8s_config.new_client_from_config(config_file=env["KUBECONFIG"])
    listed = {w.name for w in KubeClient(api).workflows("fabrique-build", SWEPT)}
    assert failed in listed and succeeded not in listed


def test_an_older_commits_build_that_succeeded_unreported_is_closed_as_its_success(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    registry: Registry,
    gitea: GiteaDouble,
) -> None:
    """Seen running, then Succeeded with its report-success lost: the sweep's LIST leaves
    the Succeeded out, yet the Workflow is there, and it says what it built."""
    old, name = _seen_running_then_superseded(code_repo, values, env, kube, gitea)
    digest = push_image(registry.url, "citation-dagster", old[:12])
    _phase(kube, old, "Succeeded", verified=digest)
    assert _reconcile(values, env).exit_code == 0
    assert _history(gitea, old)[-1] == (
        "success",
        f"safety net: {name} succeeded; built {digest}",
    )
    _assert_read_no_more(gitea, old, values, env)


def test_a_wanted_failure_whose_repair_could_not_run_is_closed_after_a_newer_push(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    gitea: GiteaDouble,
) -> None:
    """The per-app repair of the wanted commit needs its status read; when Gitea fails
    that read, nothing was repaired, and the sweep must not count it as settled."""
    old = _change(code_repo)
    _post(gitea, old, "pending", "building")
    _phase(kube, old, "Failed", failed_step="build", message="error: failed to solve")
    original = gitea.server.handle

    def status_reads_down(request: Any) -> Any:
        if request.method == "GET" and "/status" in request.path:
            return 503, {"message": "injected", "url": gitea.url}
        return original(request)

    gitea.server.handle = status_reads_down
    try:
        assert _reconcile(values, env).exit_code == 0
    finally:
        gitea.server.handle = original
    assert _history(gitea, old) == [("pending", "building")]
    code_repo.commit({"dataops/citation-dagster/app.txt": "v3\n"})  # old is wanted no more
    assert _reconcile(values, env).exit_code == 0
    assert _history(gitea, old)[-1] == ("failure", "safety net: build: failed to solve")


def test_a_pass_over_one_app_keeps_the_others_memory(
    code_repo: Repo,
    tmp_path: Path,
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    registry: Registry,
    gitea: GiteaDouble,
) -> None:
    """`reconcile --app other` knows nothing of citation's running builds: it must leave
    them remembered, or one deleted later keeps its commit pending for good."""
    apps = [
        {
            "name": "citation",
            "image": "citation-dagster",
            "context": "dataops/citation-dagster",
            "writeback": {"repo": REPO, "path": KUSTOMIZATION},
        },
        {
            "name": "other",
            "image": "other",
            "context": "dataops/other-app",
            "writeback": {
                "repo": REPO,
                "path": "dataops/other-app/kustomization.yaml",
                "create": True,
            },
        },
    ]
    site = _values(tmp_path, gitea, registry.host, apps)
    old = _change(code_repo)
    _post(gitea, old, "pending", "building")
    name = _phase(kube, old, "Running", values=site)
    new = code_repo.commit({"dataops/citation-dagster/app.txt": "v3\n"})
    written = run_cli(
        *("--values", str(site), "writeback", "--app", "citation", "--revision", new),
        *("--digest", "sha256:" + "6" * 64),
        env=env,
    )
    assert written.exit_code == 0, written.stderr
    _post(gitea, new, "success", "deployed")
    assert _reconcile(site, env).exit_code == 0
    kept = _memory(kube, site)
    assert name in kept.running and kept.reported == {"citation": new}
    assert _reconcile(site, env, "--app", "other").exit_code == 0
    assert _memory(kube, site) == kept
    del kube.objects[("fabrique-build", name)]  # `kubectl delete workflow`, mid-build
    assert _reconcile(site, env).exit_code == 0
    assert _history(gitea, old)[-1] == (
        "error",
        f"safety net: {name} was deleted before it ended",
    )


def _memory(kube: KubeApiDouble, path: Path) -> Memory:
    site = load_site(path, env={})
    stored = kube.configmaps[(site.namespaces.control, RECONCILE_MEMORY)]["data"]["memory.json"]
    memory = Memory.loads(stored, site.gitea.code_repo, site.gitea.branch)
    assert memory is not None
    return memory


def test_every_write_back_outcome_has_its_words_and_is_a_write_back_state() -> None:
    """The outcomes the CLI takes (WRITEBACK_OUTCOMES), the words each one's status says
    (WRITTEN) and the write-back's own states are one list."""
    assert tuple(WRITTEN) == WRITEBACK_OUTCOMES
    assert set(WRITEBACK_OUTCOMES) == set(get_args(State)) - {"would-change"}
    assert PROPOSED.search(written("proposed", "sha256:1", "a" * 40).description)
    assert PROPOSED.search(written("in-review", "sha256:1").description)
    assert not PROPOSED.search(written("changed", "sha256:1", "a" * 40).description)
