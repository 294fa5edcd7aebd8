"""Commit statuses: the Gitea double's endpoints, the decisions, and `fabrique status-report`
run as the steps run it, against the double (checked against Gitea's swagger)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabrique.clients.gitea import CommitStatus, GiteaClient
from fabrique.decisions import status
from fabrique.site.config import load_site
from fabrique.site.errors import TRANSIENT_SAID

from .conftest import GITEA_TOKEN, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import BUILD_POD, argo_status, workflow_failures
from .safety_net import repaired_from_node

REPO = "atlas/atlas"
DIGEST = "sha256:" + "d" * 64
CONTEXT = "fabrique/citation"
WORKFLOW = "fabrique-citation-0123456789ab"


@pytest.fixture()
def values(tmp_path: Path, gitea: GiteaDouble) -> Path:
    return write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url})


def _report(values: Path, kind: str, revision: str, *extra: str, token: str = GITEA_TOKEN):  # type: ignore[no-untyped-def]
    return run_cli(
        "-v",
        "--values",
        str(values),
        "status-report",
        kind,
        "--app",
        "citation",
        "--revision",
        revision,
        "--workflow",
        f"fabrique-citation-{revision[:12]}",
        *extra,
        env={"FABRIQUE_GITEA_TOKEN": token},
    )


def _history(gitea: GiteaDouble, revision: str) -> list[tuple[str, str]]:
    """Every status posted on ``revision`` for the app, oldest first."""
    return [
        (s["status"], s["description"])
        for s in gitea.statuses.get((REPO, revision), [])
        if s["context"] == CONTEXT
    ]


def _combined(gitea: GiteaDouble, revision: str) -> dict[str, Any]:
    response = httpx.get(
        f"{gitea.url}/api/v1/repos/{REPO}/commits/{revision}/status",
        headers={"Authorization": f"token {GITEA_TOKEN}"},
    )
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def _failures(*nodes: dict[str, Any], quoted: bool = True) -> str:
    """``{{workflow.failures}}`` as Argo substitutes it: the JSON list, strconv.Quote'd."""
    text = json.dumps(list(nodes), separators=(",", ":"))
    return json.dumps(text) if quoted else text


def _node(name: str, message: str, *, template: str | None = None, phase: str = "Failed",
          at: str = "2026-12-02T10:00:00Z") -> dict[str, Any]:  # fmt: skip
    return {
        "displayName": name,
        "message": message,
        "templateName": template or name.split("(")[0],
        "phase": phase,
        "podName": f"fabrique-citation-0123456789ab-{name}-1234",
        "finishedAt": at,
    }


# ------------------------------------------------------------------ the double


def test_the_double_keeps_every_status_and_combines_the_latest(
    gitea: GiteaDouble, code_repo: Repo
) -> None:
    head = code_repo.head()
    with GiteaClient(gitea.url, GITEA_TOKEN) as client:
        assert client.latest_statuses(REPO, head) == {}
        client.create_status(REPO, head, CommitStatus(CONTEXT, "pending", "building"))
        client.create_status(REPO, head, CommitStatus("other/ci", "success", "ok"))
        assert _combined(gitea, head)["state"] == "pending"
        client.create_status(REPO, head, CommitStatus(CONTEXT, "success", "deployed", "http://x"))
        latest = client.latest_statuses(REPO, head)
    assert latest[CONTEXT] == CommitStatus(CONTEXT, "success", "deployed", "http://x")
    combined = _combined(gitea, head)
    assert (combined["state"], combined["total_count"]) == ("success", 2)
    listed = httpx.get(
        f"{gitea.url}/api/v1/repos/{REPO}/statuses/{head}",
        headers={"Authorization": f"token {GITEA_TOKEN}"},
    ).json()
    assert [s["status"] for s in listed] == ["success", "success", "pending"]  # newest first


def test_a_failure_in_any_context_fails_the_combined_state(
    gitea: GiteaDouble, code_repo: Repo
) -> None:
    head = code_repo.head()
    with GiteaClient(gitea.url, GITEA_TOKEN) as client:
        client.create_status(REPO, head, CommitStatus(CONTEXT, "error", "build: deadline"))
        client.create_status(REPO, head, CommitStatus("other/ci", "success", "ok"))
    assert _combined(gitea, head)["state"] == "failure"


def test_a_status_on_an_unknown_commit_is_not_found(gitea: GiteaDouble, code_repo: Repo) -> None:
    with GiteaClient(gitea.url, GITEA_TOKEN) as client:
        with pytest.raises(Exception, match="not found in Gitea"):
            client.create_status(REPO, "f" * 40, CommitStatus(CONTEXT, "pending", "x"))


# ------------------------------------------------------------------- decisions


def _pod_failed(stage: str, tail: str, code: int = 1) -> str:
    """``{{workflow.failures}}`` of a build whose ``stage`` container exited ``code`` with
    the log tail ``tail``: its node, the pod's, the Retry's, the root's and those of the
    containers after it, which Argo's executor ended (exit 64, "dependency ...")."""
    body = {"metadata": {"name": WORKFLOW}}
    status_ = argo_status(body, "Failed", failed_step=stage, message=tail, exit_code=code)
    return _failures(*workflow_failures(status_))


def test_failures_as_argo_substitutes_them_name_the_step_and_its_reason() -> None:
    failures = _pod_failed(
        "verify-digest",
        "INFO fabrique: checking\nerror: citation-dagster:0123456789ab: the build pushed "
        "sha256:aaa but the registry holds sha256:bbb",
    )
    report = status.failed("Failed", failures, WORKFLOW)
    assert report == status.Report(
        "failure",
        "verify-digest: citation-dagster:0123456789ab: the build pushed sha256:aaa but the "
        "registry holds sha256:bbb",
    )


@pytest.mark.parametrize("stage", list(BUILD_POD))
def test_the_failed_container_is_named_never_one_its_failure_stopped(stage: str) -> None:
    """The pod's node repeats the message of one failed container, the first in the
    kubelet's order, which may be one Argo's executor stopped; those say "dependency …
    exited with non-zero code" and are no cause."""
    failures = _pod_failed(stage, f"INFO fabrique: {stage}\nerror: {stage} broke")
    report = status.failed("Failed", failures, WORKFLOW)
    assert report == status.Report("failure", f"{stage}: {stage} broke")


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        ("error: the build pushed sha256:aaa but the registry holds sha256:bbb",
         "the build pushed sha256:aaa but the registry holds sha256:bbb"),
        ("", "Error (exit code 1)"),
    ],
    ids=["one-line-tail", "no-tail"],
)  # fmt: skip
def test_argo_s_words_ahead_of_a_short_tail_are_not_the_reason(tail: str, said: str) -> None:
    """ "verify-digest: Error (exit code 1): " ahead of a one-line tail names the stage,
    which the report names once; with no tail, Argo's words are all there is."""
    report = status.failed("Failed", _pod_failed("verify-digest", tail), WORKFLOW)
    assert report == status.Report("failure", f"verify-digest: {said}")
    repaired = repaired_from_node("verify-digest", f"verify-digest: Error (exit code 1): {tail}")
    assert repaired is not None and repaired.description.endswith(f"verify-digest: {said}")


def test_a_write_back_that_failed_is_a_failure_though_the_pod_names_main() -> None:
    tail = "INFO fabrique: writing back\nerror: atlas/apps: push refused: protected branch"
    failures = _pod_failed("write-back", tail, 3)
    pod = next(n for n in json.loads(json.loads(failures)) if n["displayName"] == "run(0)")
    assert pod["message"].startswith("main: Error (exit code 64): ")  # as the kubelet sorts
    assert pod["message"].endswith('dependency "write-back" exited with non-zero code: 3')
    report = status.failed("Failed", failures, WORKFLOW)
    assert report == status.Report(
        "failure", "write-back: atlas/apps: push refused: protected branch"
    )
    # the safety net reads the same nodes from the Workflow, when the report was lost
    repaired = repaired_from_node("write-back", f"write-back: Error (exit code 3): {tail}")
    assert repaired is not None and repaired.state == "failure", repaired


def test_the_latest_attempt_of_a_lost_pod_gives_the_reason() -> None:
    """A lost pod is made again (``run(1)``): the pod that failed after it says why."""
    cause = "build: Error (exit code 1): #5 [2/2] RUN make\nerror: failed to solve: process did not complete"
    stopped = 'verify-digest: Error (exit code 64): Error: dependency "build" exited with non-zero code: 1'
    failures = _failures(
        _node("run(0)", "pod deleted", template="run", phase="Error", at="2026-12-02T10:00:00Z"),
        _node("run(1)", cause, template="run", at="2026-12-02T10:05:00Z"),
        _node("build", cause, template="run", at="2026-12-02T10:05:00Z"),
        _node("verify-digest", stopped, template="run", phase="Error", at="2026-12-02T10:05:00Z"),
        _node("run", "retryStrategy.expression evaluated to false", template="run", at="2026-12-02T10:05:01Z"),
        quoted=False,
    )  # fmt: skip
    report = status.failed("Failed", failures, "wf")
    assert report == status.Report("failure", "build: failed to solve: process did not complete")


@pytest.mark.parametrize(
    ("workflow_status", "message", "phase", "state"),
    [
        ("Failed", "Error (exit code 1)", "Failed", "failure"),
        ("Failed", "Step exceeded its deadline", "Failed", "error"),
        ("Failed", "OOMKilled (exit code 137)", "Failed", "error"),
        ("Failed", "error: Gitea at http://g unreachable: timed out after 4 attempt(s)", "Failed", "error"),
        ("Failed", "failed to save outputs: verify serviceaccount", "Error", "error"),
        ("Error", "pod deleted", "Error", "error"),
    ],
)  # fmt: skip
def test_failure_or_error(workflow_status: str, message: str, phase: str, state: str) -> None:
    report = status.failed(workflow_status, _failures(_node("build", message, phase=phase)), "wf")
    assert report is not None and report.state == state
    assert report.description.startswith("build: ")


# What the checkout and the build log when they give up (each container retries 75 itself,
# RETRIES times), and an OOM kill: Argo puts "<container>: <Reason> (exit code <n>): "
# ahead of the tail (FallbackToLogsOnError) on the container's node
GAVE_UP = {
    "checkout": (
        "checkout",
        75,
        "checkout: fetching " + "a" * 40 + " (sparse: x)\n"
        "fatal: unable to connect to gitea:\ngitea[0: 10.0.0.7]: errno=Connection refused\n"
        "checkout: the git server was not reached: transient, worth retrying",
    ),
    "build": (
        "build",
        75,
        "#5 exporting to image\n"
        "error: failed to solve: failed to push registry:80/citation:aaaaaaaaaaaa: failed to"
        ' do request: Put "http://registry:80/v2/": dial tcp 10.0.0.9:80: connect:'
        " connection refused\n"
        "build: the registry or the network did not answer: transient, worth retrying",
    ),
    "killed": (
        "build",
        137,
        "#7 [3/4] RUN pip install -r requirements.txt\n#7 41.2 Collecting numpy==2.3.1",
    ),
}


@pytest.mark.parametrize("case", list(GAVE_UP))
def test_a_step_that_exited_75_until_its_retries_ran_out_is_an_error(case: str) -> None:
    """An infrastructure give-up blames no commit, whatever words its log ends with: the
    exit code Argo's message carries decides, on the exit handler's path and the safety
    net's alike."""
    stage, code, tail = GAVE_UP[case]
    report = status.failed("Failed", _pod_failed(stage, tail, code), WORKFLOW)
    assert report is not None and report.state == "error", report
    assert report.description.startswith(f"{stage}: ") and f"exit code {code}" in report.description
    # the safety net reads the same node from the Workflow, when the report was lost
    reason = "OOMKilled" if code == 137 else "Error"
    repaired = repaired_from_node(stage, f"{stage}: {reason} (exit code {code}): {tail}")
    assert repaired is not None and repaired.state == "error", repaired


# The step's own last line, as the checkout and the build print it when they give up on
# a transient cause, as Argo's node message carries it with no exit code ahead of it
# (operator.go, inferFailedReason, before v4: a main container's termination message as
# it is): that last line alone, or the log tail it ends (FallbackToLogsOnError)
SAID = {
    "checkout": f"checkout: the git server was not reached: {TRANSIENT_SAID}",
    "build": f"build: the registry or the network did not answer: {TRANSIENT_SAID}",
}
FORMS = {
    "tail-alone": "{said}",
    "log-tail": "fatal: unable to connect to gitea:\nerrno=Connection refused\n{said}",
    # buildctl's own error line before it, which the reason line is made of
    "after-an-error-line": (
        "#5 exporting to image\nerror: failed to solve: failed to push registry:80/citation:"
        'aaaaaaaaaaaa: failed to do request: Put "http://registry:80/v2/": dial tcp '
        "10.0.0.9:80: connect: connection refused\n{said}"
    ),
}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("step", list(SAID))
def test_a_step_that_says_its_cause_is_transient_is_an_error_in_any_form(
    step: str, form: str
) -> None:
    """The step's own word for a transient cause blames no commit, whether or not Argo's
    message carries the exit code 75 too."""
    message = FORMS[form].format(said=SAID[step])
    failures = _failures(
        _node(f"{step}(2)", message), _node(step, "No more retries left", at="2026-12-02T10:00:01Z")
    )
    report = status.failed("Failed", failures, "wf")
    assert report is not None and report.state == "error", report
    if form != "after-an-error-line":
        assert report.description == SAID[step]
    repaired = repaired_from_node(f"{step}(2)", message)
    assert repaired is not None and repaired.state == "error", repaired


def test_a_step_that_failed_on_the_commit_s_own_account_stays_a_failure() -> None:
    tail = (
        "#5 [2/2] RUN curl -f http://example.invalid\n"
        'error: failed to solve: process "/bin/sh -c curl -f http://example.invalid" did not'
        " complete successfully: exit code: 7"
    )
    report = status.failed("Failed", _pod_failed("build", tail), WORKFLOW)
    assert report == status.Report(
        "failure",
        'build: failed to solve: process "/bin/sh -c curl -f http://example.invalid" did not'
        " complete successfully: exit code: 7",
    )


def test_nothing_failed_and_succeeded() -> None:
    assert status.failed("Succeeded", _failures(), "wf") is None
    assert status.failed("Error", '"null"', "wf") == status.Report(
        "error", "the Workflow ended Error before any step failed"
    )
    assert status.parse_failures("not json") == []
    # Go's strconv.Quote writes \x escapes, which JSON does not read
    go_quoted = '"[{\\"displayName\\":\\"plan\\",\\"message\\":\\"bad \\x01 byte\\"}]"'
    assert status.parse_failures(go_quoted)[0]["displayName"] == "plan"


def test_a_description_is_one_short_line_without_secrets() -> None:
    text = "line one\nline two " + "x" * 300 + " token-abc"
    flat = status.one_line("token-abc " + text, ("token-abc", None))
    assert "\n" not in flat and len(flat) == status.MAX_DESCRIPTION and flat.endswith("…")
    assert "token-abc" not in flat and flat.startswith("*** line one line two")


def test_success_descriptions_carry_the_digest_and_the_outcome() -> None:
    assert status.written("changed", DIGEST, "c" * 40).description == (
        f"deployed {DIGEST}; changed, commit {'c' * 12}"
    )
    assert (
        status.written("unchanged", DIGEST).description == f"{DIGEST} already deployed; unchanged"
    )
    assert "superseded" in status.written("superseded", DIGEST).description
    assert status.written("held", DIGEST).description == f"built {DIGEST}; held, nothing deployed"
    for outcome in ("changed", "unchanged", "superseded", "held"):
        assert len(status.written(outcome, DIGEST, "c" * 40, by_net=True).description) <= 140


# -------------------------------------------------- the steps' command, for real


def test_pending_then_success(values: Path, gitea: GiteaDouble, code_repo: Repo) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    started = _report(values, "pending", revision)
    assert started.exit_code == 0, started.stderr
    assert started.stdout == f"status posted: {CONTEXT} pending on {revision[:12]}\n"
    assert _combined(gitea, revision)["state"] == "pending"
    done = _report(
        values,
        "success",
        revision,
        "--digest",
        DIGEST,
        "--outcome",
        "changed",
        "--commit",
        "e" * 40,
    )
    assert done.exit_code == 0, done.stderr
    assert _history(gitea, revision) == [
        ("pending", f"building citation-dagster:{revision[:12]}"),
        ("success", f"deployed {DIGEST}; changed, commit {'e' * 12}"),
    ]
    assert _combined(gitea, revision)["state"] == "success"
    assert GITEA_TOKEN not in started.stdout + started.stderr + done.stdout + done.stderr


def test_a_replay_past_fifty_apps_on_one_commit_posts_nothing(
    values: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    """One push builds every app on the same commit: each posts its own context. Gitea
    answers the combined status fifty contexts a page at most, so an app's status read
    from the first page alone goes unseen past fifty, and its replay posts it again."""
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    with GiteaClient(gitea.url, GITEA_TOKEN) as client:

        def others(first: int) -> None:
            for n in range(first, first + 60):
                other = CommitStatus(f"fabrique/app-{n:03d}", "pending", "building")
                client.create_status(REPO, revision, other)

        others(0)
        started = _report(values, "pending", revision)
        others(60)
    assert started.stdout == f"status posted: {CONTEXT} pending on {revision[:12]}\n"
    replayed = _report(values, "pending", revision)
    assert replayed.exit_code == 0, replayed.stderr
    assert replayed.stdout == f"status unchanged: {CONTEXT} pending on {revision[:12]}\n"
    assert _history(gitea, revision) == [("pending", f"building citation-dagster:{revision[:12]}")]


def test_pending_then_failure_from_the_exit_handler(
    values: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    workflow = f"fabrique-citation-{revision[:12]}"
    _report(values, "pending", revision)
    failures = _failures(
        _node(workflow, "child failed", template="main"),
        _node("checkout", "checkout: dataops/citation-dagster/Dockerfile not found at x"),
    )
    result = _report(
        values, "failure", revision, "--workflow-status", "Failed", "--failures", failures
    )
    assert result.exit_code == 0, result.stderr
    assert _history(gitea, revision)[-1] == (
        "failure",
        "checkout: dataops/citation-dagster/Dockerfile not found at x",
    )
    assert _combined(gitea, revision)["state"] == "failure"


def test_a_replay_posts_no_duplicate(values: Path, gitea: GiteaDouble, code_repo: Repo) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    success = ("success", revision, "--digest", DIGEST, "--outcome", "unchanged")
    for _ in range(2):
        assert _report(values, "pending", revision).exit_code == 0
        assert _report(values, *success).exit_code == 0
    # a replay's statuses alternate, but never repeat the latest: Gitea shows success
    assert _history(gitea, revision) == [
        ("pending", f"building citation-dagster:{revision[:12]}"),
        ("success", f"{DIGEST} already deployed; unchanged"),
        ("pending", f"building citation-dagster:{revision[:12]}"),
        ("success", f"{DIGEST} already deployed; unchanged"),
    ]
    again = _report(values, *success)
    assert again.stdout.startswith("status unchanged: ")
    assert len(_history(gitea, revision)) == 4
    assert _combined(gitea, revision)["state"] == "success"


def test_skipped_is_success_no_change(values: Path, gitea: GiteaDouble, code_repo: Repo) -> None:
    revision = code_repo.head()
    assert _report(values, "skipped", revision).exit_code == 0
    assert _history(gitea, revision) == [("success", "no change under dataops/citation-dagster")]


def test_target_url_only_when_the_site_names_the_argo_ui(
    tmp_path: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    revision = code_repo.head()
    plain = write_values(tmp_path / "plain.yaml", **{"gitea.url": gitea.url})
    _report(plain, "pending", revision)
    assert gitea.statuses[(REPO, revision)][-1]["target_url"] == ""
    assert "target_url" not in gitea.requests[-1].json()
    linked = write_values(
        tmp_path / "linked.yaml",
        **{"gitea.url": gitea.url, "argoServer.url": "https://argo.example.org/"},
    )
    _report(linked, "pending", revision)
    assert gitea.statuses[(REPO, revision)][-1]["target_url"] == (
        f"https://argo.example.org/workflows/fabrique-build/fabrique-citation-{revision[:12]}"
    )


@pytest.mark.parametrize("fault", [503, "drop", ("slow", 1.0)], ids=["5xx", "drop", "timeout"])
def test_a_failing_status_api_never_fails_the_build(
    tmp_path: Path, gitea: GiteaDouble, code_repo: Repo, fault: Any
) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{"gitea.url": gitea.url, "network.timeoutSeconds": 0.3, "network.attempts": 2},
    )
    revision = code_repo.head()
    gitea.faults = [("*", fault)] * 2  # every attempt of the first call
    result = _report(values, "pending", revision)
    assert result.exit_code == 0
    assert result.stdout.startswith("status not-posted: ")
    assert "not posted" in result.stderr and "the next reconcile pass repairs it" in result.stderr
    assert _history(gitea, revision) == []
    assert GITEA_TOKEN not in result.stdout + result.stderr


def test_a_refused_token_never_fails_the_build(
    values: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    result = _report(values, "pending", code_repo.head(), token="wrong-token-77")
    assert result.exit_code == 0
    assert "Gitea refused the token (HTTP 401)" in result.stderr
    assert "wrong-token-77" not in result.stdout + result.stderr


def test_nothing_to_report_on_a_bad_revision_or_app(values: Path, gitea: GiteaDouble) -> None:
    result = _report(values, "failure", "not-a-sha", "--workflow-status", "Failed")
    assert result.exit_code == 0
    assert "notice: no status reported: revision 'not-a-sha'" in result.stderr
    assert gitea.requests == []


def test_the_token_never_reaches_a_description(
    values: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    revision = code_repo.head()
    leaky = _failures(_node("plan", f"error: Gitea said {GITEA_TOKEN} is wrong"))
    _report(values, "failure", revision, "--workflow-status", "Failed", "--failures", leaky)
    assert _history(gitea, revision) == [("failure", "plan: Gitea said *** is wrong")]


@pytest.mark.parametrize(
    "leak",
    [
        "https://ci-bot:s3cr3t-9f@gitea.example/atlas/atlas.git",  # URL userinfo
        "https://s3cr3t-9f@gitea.example/atlas/atlas.git",  # a token as the user
        "https://gitea.example/api/v1/repos?token=s3cr3t-9f",  # a query
        "https://auth.example/callback#access_token=s3cr3t-9f",  # a fragment
    ],
    ids=["userinfo", "user", "query", "fragment"],
)
def test_no_credential_of_a_log_tail_reaches_a_status_or_the_reconcile_line(
    values: Path, gitea: GiteaDouble, code_repo: Repo, leak: str
) -> None:
    """A failed step's last log line may quote a URL with its credentials: the status
    and the reconciler's reason carry the URL masked, never the secret."""
    from fabrique.clients.kube import workflow_state

    revision = code_repo.head()
    failures = _failures(_node("checkout", f"fatal: unable to access '{leak}': 403"))
    _report(values, "failure", revision, "--workflow-status", "Failed", "--failures", failures)
    ((state, description),) = _history(gitea, revision)
    assert state == "failure" and "s3cr3t-9f" not in description, description
    assert "***" in description
    body = {
        "status": {
            "phase": "Failed",
            "nodes": {"n": {**_node("checkout(0)", f"fatal: {leak} refused"), "type": "Pod"}},
        }
    }
    reason = workflow_state("fabrique-citation-0123456789ab", body).reason
    assert "s3cr3t-9f" not in reason and "***" in reason, reason


def test_the_site_config_takes_an_argo_ui_url() -> None:
    site = load_site(env={"FABRIQUE_ARGO_SERVER__URL": "http://argo:2746"})
    assert site.argo_server.workflow_url("ns", "wf") == "http://argo:2746/workflows/ns/wf"
    assert load_site(env={}).argo_server.workflow_url("ns", "wf") is None


def test_the_reconcilers_reason_is_the_telling_line_of_a_log_tail() -> None:
    from fabrique.clients.kube import workflow_state

    body = {
        "spec": {"arguments": {"parameters": [{"name": "revision", "value": "a" * 40}]}},
        "status": {
            "phase": "Failed",
            "nodes": {
                "n1": {
                    "type": "Pod",
                    "phase": "Failed",
                    "displayName": "write-back",
                    "templateName": "write-back",
                    "message": "INFO fabrique: reading\nerror: x.yaml: not valid YAML\n",
                }
            },
        },
    }
    assert workflow_state("wf", body).reason == "write-back: x.yaml: not valid YAML"
