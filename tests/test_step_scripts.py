"""The shell of the build pod's containers, run for real.

The checkout script runs against a real `git daemon`. The build script runs with an
argv recorder standing in for buildctl-daemonless.sh, for speed: the test checks the
exact command line BuildKit would get (tests/live/test_build.py runs it with the real
BuildKit). What every container's script shares (the retry of exit 75, the plan's
go-ahead) runs with fakes of the commands it wraps.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fabrique.decisions import status
from fabrique.decisions.plan import make_plan
from fabrique.site.config import load_site
from fabrique.site.errors import TRANSIENT_SAID

from .conftest import CodeRepo
from .doubles.kube import argo_status, workflow_failures
from .manifests import rendered_step, step_env
from .servers import GitDaemon, closed_port


def _container(name: str, **site_env: str) -> dict[str, Any]:
    return rendered_step(load_site(env=site_env), name)


def _reported(step: str, result: subprocess.CompletedProcess[str]) -> str:
    """The state the exit handler reports for ``step`` failed with this run's log: its
    tail on the container's node, as the kubelet makes a termination message of it
    (FallbackToLogsOnError: the last 80 lines, at most 2048 bytes) and as Argo carries it
    after "<container>: Error (exit code <n>): "."""
    tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-80:])
    message = tail.encode()[-2048:].decode(errors="ignore")
    failed = argo_status(
        {"metadata": {"name": "wf"}},
        "Failed",
        failed_step=step,
        message=message,
        exit_code=result.returncode,
    )
    report = status.failed("Failed", json.dumps(workflow_failures(failed)), "wf")
    assert report is not None
    return report.state


def _run_checkout(
    workspace: Path, repo_url: str, revision: str, context: str, dockerfile: str = "Dockerfile"
) -> subprocess.CompletedProcess[str]:
    container = _container("checkout")
    inputs = {"repo-url": repo_url, "context": context, "dockerfile": dockerfile}
    env = step_env(container, revision, inputs, plan=workspace.parent / "plan") | {
        "PATH": os.environ["PATH"],
        "HOME": str(workspace.parent),
        "WORKSPACE": str(workspace),
    }
    return subprocess.run(
        container["command"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_checkout_fetches_the_exact_revision_sparse(
    tmp_path: Path, code_repo: CodeRepo, git_daemon: GitDaemon
) -> None:
    wanted = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"}, "v2")
    code_repo.commit({"dataops/citation-dagster/app.txt": "v3\n"}, "v3 (a newer head)")
    workspace = tmp_path / "workspace"
    result = _run_checkout(
        workspace, git_daemon.url("atlas/atlas.git"), wanted, "dataops/citation-dagster"
    )
    assert result.returncode == 0, result.stderr
    src = workspace / "src"
    assert (src / "dataops/citation-dagster/app.txt").read_text() == "v2\n"
    assert not (src / "dataops/other-app").exists(), "checkout must be sparse to the app's context"
    head = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    assert head.stdout.strip() == wanted


def test_checkout_is_repeatable_in_the_same_volume(
    tmp_path: Path, code_repo: CodeRepo, git_daemon: GitDaemon
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "again\n"})
    workspace = tmp_path / "workspace"
    for _ in range(2):  # a retried step finds the previous attempt's files
        result = _run_checkout(
            workspace, git_daemon.url("atlas/atlas.git"), revision, "dataops/citation-dagster"
        )
        assert result.returncode == 0, result.stderr


def test_checkout_fails_on_an_unknown_revision(
    tmp_path: Path, code_repo: CodeRepo, git_daemon: GitDaemon
) -> None:
    result = _run_checkout(
        tmp_path / "w", git_daemon.url("atlas/atlas.git"), "f" * 40, "dataops/citation-dagster"
    )
    # the server answered: a wrong answer, which a retry would not change
    assert result.returncode == 3, result.stderr
    assert f"the git server refused to fetch {'f' * 40}" in result.stderr
    assert "trying again" not in result.stderr


@pytest.mark.parametrize("scheme", ["git", "http"])
def test_checkout_of_an_unreachable_server_is_transient(tmp_path: Path, scheme: str) -> None:
    """Exit 75, the one failure of the checkout its retry policy retries."""
    url = f"{scheme}://127.0.0.1:{closed_port()}/atlas/atlas.git"
    result = _run_checkout(tmp_path / "w", url, "a" * 40, "dataops/citation-dagster")
    assert result.returncode == 75, result.stderr
    assert f"not reached: {TRANSIENT_SAID}" in result.stderr
    # tried build.retries times more in its container, then given up
    assert result.stdout.count("checkout: fetching") == 1 + 3
    assert "checkout: trying again in 0s (retry 3 of 3)" in result.stderr
    assert _reported("checkout", result) == "error", "the infrastructure's, not the commit's"


class _OneConnection:
    """A git server that drops after its first connection: it forwards one connection to
    ``port``, then stops listening, as a server restarted between the checkout's fetch
    and the blobs its checkout of a partial clone fetches afterwards."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        self.listener.close()  # every later connection is refused
        server = socket.create_connection(("127.0.0.1", self.upstream))
        pipes = [
            threading.Thread(target=self._pipe, args=(a, b), daemon=True)
            for a, b in ((client, server), (server, client))
        ]
        for pipe in pipes:
            pipe.start()
        for pipe in pipes:
            pipe.join()
        client.close()
        server.close()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        while data := source.recv(65536):
            sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_a_server_lost_before_the_checkout_fetches_its_blobs_is_transient(
    tmp_path: Path, code_repo: CodeRepo, git_daemon: GitDaemon
) -> None:
    """A partial clone (--filter=blob:none) fetches the context's blobs at the checkout,
    after the fetch: a server gone by then is as transient as one gone at the fetch."""
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "partial\n"})
    server = _OneConnection(git_daemon.port)
    url = f"git://127.0.0.1:{server.port}/atlas/atlas.git"
    result = _run_checkout(tmp_path / "w", url, revision, "dataops/citation-dagster")
    server.thread.join(timeout=10)
    assert "fetching" in result.stdout  # the fetch passed: the checkout was what failed
    assert result.returncode == 75, result.stderr
    assert f"not reached: {TRANSIENT_SAID}" in result.stderr


def test_checkout_fails_when_the_dockerfile_is_missing(
    tmp_path: Path, code_repo: CodeRepo, git_daemon: GitDaemon
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "x\n"})
    result = _run_checkout(
        tmp_path / "w",
        git_daemon.url("atlas/atlas.git"),
        revision,
        "dataops/citation-dagster",
        "Dockerfile.prod",
    )
    assert result.returncode == 2
    assert "dataops/citation-dagster/Dockerfile.prod not found" in result.stderr


RECORDER = """#!/bin/sh
# argv recorder standing in for buildctl-daemonless.sh: one argument per line
for arg in "$@"; do printf '%s\\n' "$arg"; done > "$ARGV_FILE"
"""


def _run_build(
    tmp_path: Path, env_overrides: dict[str, str], buildctl: str = RECORDER, **site_env: str
) -> subprocess.CompletedProcess[str]:
    container = _container("build", **site_env)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    recorder = bin_dir / "buildctl-daemonless.sh"
    recorder.write_text(buildctl)
    recorder.chmod(0o755)
    plan = make_plan(load_site(env=site_env), "citation", "a" * 40)
    inputs = {
        "image-ref": plan.image_ref,
        "cache-ref": plan.cache_ref,
        "context": plan.context,
        "dockerfile": plan.dockerfile,
        "build-opts": plan.build_opts,
        **env_overrides,
    }
    env = step_env(container, "a" * 40, inputs, plan=tmp_path / "plan") | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ARGV_FILE": str(tmp_path / "argv"),
        "WORKSPACE": str(tmp_path / "workspace"),
    }
    return subprocess.run(
        container["command"], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def _build_argv(tmp_path: Path, env_overrides: dict[str, str], **site_env: str) -> list[str]:
    result = _run_build(tmp_path, env_overrides, **site_env)
    assert result.returncode == 0, result.stderr
    return (tmp_path / "argv").read_text().splitlines()


def test_build_command_line(tmp_path: Path) -> None:
    argv = _build_argv(tmp_path, {})
    src = f"{tmp_path}/workspace/src/dataops/citation-dagster"
    assert argv == [
        "build",
        "--frontend",
        "dockerfile.v0",
        "--local",
        f"context={src}",
        "--local",
        f"dockerfile={src}",
        "--opt",
        "filename=Dockerfile",
        "--opt",
        "label:org.opencontainers.image.revision=" + "a" * 40,
        "--opt",
        "label:org.opencontainers.image.source=http://gitea-http.gitea.svc.cluster.local:3000/atlas/atlas.git",
        "--output",
        "type=image,name=registry:80/citation-dagster:aaaaaaaaaaaa,push=true",
        "--export-cache",
        "type=registry,ref=registry:80/citation-dagster:buildcache,mode=max",
        "--import-cache",
        "type=registry,ref=registry:80/citation-dagster:buildcache",
        "--metadata-file",
        "/workspace/build-metadata.json",
    ]


def test_build_args_stay_whole_and_cannot_inject_shell(tmp_path: Path) -> None:
    opts = 'build-arg:GREETING=hello world; rm -rf / $(id) "quoted"\nbuild-arg:EMPTY='
    argv = _build_argv(tmp_path, {"build-opts": opts})
    assert argv[-4:] == [
        "--opt",
        'build-arg:GREETING=hello world; rm -rf / $(id) "quoted"',
        "--opt",
        "build-arg:EMPTY=",
    ]


def test_nested_dockerfile_path(tmp_path: Path) -> None:
    argv = _build_argv(tmp_path, {"dockerfile": "docker/Dockerfile.prod"})
    src = f"{tmp_path}/workspace/src/dataops/citation-dagster"
    assert f"dockerfile={src}/docker" in argv
    assert "filename=Dockerfile.prod" in argv


@pytest.mark.parametrize(("cache", "attest"), [("false", "true")])
def test_build_switches(tmp_path: Path, cache: str, attest: str) -> None:
    argv = _build_argv(
        tmp_path, {}, FABRIQUE_BUILD__CACHE=cache, FABRIQUE_BUILD__ATTESTATIONS=attest
    )
    assert "--export-cache" not in argv and "--import-cache" not in argv
    assert argv[argv.index("attest:provenance=mode=max") - 1] == "--opt"


def test_checkout_of_a_sha256_repository(
    tmp_path: Path, repos_root: Path, git_daemon: GitDaemon
) -> None:
    """Gitea serves SHA-256 repositories too: their commit ids are 64 hex."""
    repo = CodeRepo(repos_root, "atlas/atlas256", object_format="sha256")
    wanted = repo.commit(
        {"dataops/citation-dagster/Dockerfile": "FROM scratch\n", "dataops/x/y": "z\n"}, "seed"
    )
    assert len(wanted) == 64
    result = _run_checkout(
        tmp_path / "w", git_daemon.url("atlas/atlas256.git"), wanted, "dataops/citation-dagster"
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "w/src/dataops/citation-dagster/Dockerfile").exists()


def _failing_buildctl(last_line: str) -> str:
    """buildctl-daemonless.sh that shows progress, then fails as buildctl does: its last
    line is ``error: <cause>`` on stderr, and it exits 1."""
    return (
        "#!/bin/sh\n"
        "echo '#5 [2/2] RUN curl -f http://example.invalid: connection refused'\n"
        f"echo '{last_line}' >&2\n"
        "exit 1\n"
    )


@pytest.mark.parametrize(
    ("cause", "code"),
    [
        (
            "error: failed to solve: failed to push registry:80/citation-dagster:aaaaaaaaaaaa:"
            ' failed to do request: Put "http://registry:80/v2/": dial tcp 10.0.0.9:80:'
            " connect: connection refused",
            75,
        ),
        (
            "error: failed to solve: registry:80/base:1: failed to resolve source metadata:"
            " unexpected status from HEAD request: 503 Service Unavailable",
            75,
        ),
        (
            'error: failed to solve: process "/bin/sh -c curl -f http://example.invalid"'
            " did not complete successfully: exit code: 7",
            1,
        ),
        ("error: failed to solve: dockerfile parse error on line 2: unknown instruction", 1),
        # BuildKit v0.32.2's words when buildkitd.toml lacks the registry's `http = true`
        # (tests/live/test_build.py): the site's registry settings, which no retry changes
        (
            "error: failed to solve: registry:80/base:1: failed to resolve source metadata for"
            ' registry:80/base:1: failed to do request: Head "https://registry:80/v2/base/'
            'manifests/1": http: server gave HTTP response to HTTPS client',
            1,
        ),
        (
            "error: failed to solve: failed to push registry:80/citation-dagster:aaaaaaaaaaaa:"
            ' failed to do request: Head "https://registry:80/v2/": tls: failed to verify'
            " certificate: x509: certificate signed by unknown authority",
            1,
        ),
    ],
    ids=[
        *("push-refused", "registry-503", "run-failed", "bad-dockerfile"),
        *("https-to-http-registry", "untrusted-certificate"),
    ],
)
def test_the_build_says_which_failures_a_retry_may_fix(
    tmp_path: Path, cause: str, code: int
) -> None:
    """The registry or the network not answering is transient (75, retried); the app's own
    failure is not, even when its RUN's output names a refused connection."""
    result = _run_build(tmp_path, {}, buildctl=_failing_buildctl(cause))
    assert result.returncode == code, result.stdout + result.stderr
    assert cause in result.stdout  # buildctl's own words stay in the step's log
    assert (TRANSIENT_SAID in result.stderr) is (code == 75)
    # what the exit handler reports once the retries ran out: the step's own words decide
    assert _reported("build", result) == ("error" if code == 75 else "failure")


def test_a_build_that_passes_exits_0_with_its_progress_in_the_log(tmp_path: Path) -> None:
    progress = "#!/bin/sh\necho '#7 pushing manifest done' >&2\n"
    result = _run_build(tmp_path, {}, buildctl=progress)
    assert result.returncode == 0, result.stderr
    assert "#7 pushing manifest done" in result.stdout


# ------------------------------------------ what every container of the pod shares

# stands in for the command a container wraps (fabrique, git, buildctl-daemonless.sh):
# records its call, then exits with the next code of $EXITS (0 when there is none left).
# As git, it makes what the checkout reads: the clone's folder with the Dockerfile, HEAD.
FAKE = """#!/bin/sh
printf '%s\\n' "$(basename "$0") $*" >>"$CALLS"
code="$(head -n 1 "$EXITS")"
sed -i 1d "$EXITS"
if [ "${code:-0}" = 0 ] && [ "$(basename "$0")" = git ]; then
  case "$1" in
  init)
    for src; do :; done
    mkdir -p "$src/$(cat "$PLAN/context")"
    touch "$src/$(cat "$PLAN/context")/$(cat "$PLAN/dockerfile")"
    ;;
  rev-parse) echo "$REVISION" ;;
  esac
fi
exit "${code:-0}"
"""
PLAN = {
    "image-ref": "registry:80/citation-dagster:aaaaaaaaaaaa",
    "cache-ref": "registry:80/citation-dagster:buildcache",
    "repo-url": "http://gitea.invalid/atlas/atlas.git",
    "context": "dataops/citation-dagster",
    "dockerfile": "Dockerfile",
    "build-opts": "",
}
# a site that signs, for the ``sign`` container
SIGNING = {
    "FABRIQUE_SIGNING__KEY_SECRET__NAME": "fabrique-cosign",
    "FABRIQUE_SIGNING__KEY_SECRET__KEY": "cosign.key",
    "FABRIQUE_SIGNING__PUBLIC_KEY": ec.generate_private_key(ec.SECP256R1())
    .public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode(),
}
# the stages whose command a failure ends (report-pending and main never fail)
STAGES = ("plan", "checkout", "build", "verify-digest", "sign", "write-back")
AFTER_THE_PLAN = ("checkout", "build", "verify-digest", "sign", "write-back", "main")


def _run_stage(
    tmp_path: Path,
    name: str,
    exits: tuple[int, ...] = (),
    *,
    build: str = "true",
    group: str = "",
    outcome: str | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run container ``name`` of the pod as its script runs, the command it wraps a fake
    exiting ``exits`` in turn, the plan's ``build`` decision ``build``: (the run, the
    fake's calls)."""
    container = _container(name, **(SIGNING if name == "sign" else {}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for command in ("fabrique", "git", "buildctl-daemonless.sh"):
        (bin_dir / command).write_text(FAKE)
        (bin_dir / command).chmod(0o755)
    (tmp_path / "exits").write_text("".join(f"{code}\n" for code in exits))
    plan = tmp_path / "plan"
    env = step_env(container, "a" * 40, PLAN, plan=plan, group=group) | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(tmp_path / "calls"),
        "EXITS": str(tmp_path / "exits"),
        "HOME": str(tmp_path),
        "WORKSPACE": str(tmp_path / "workspace"),
        "DIGEST_FILE": str(tmp_path / "digest"),
        "WRITEBACK_DIR": str(tmp_path / "writeback"),
    }
    (plan / "build").write_text(build)
    (plan / "reason").write_text("no change under dataops/citation-dagster")
    (tmp_path / "digest").write_text("sha256:" + "d" * 64)
    if outcome is not None:
        (tmp_path / "writeback").mkdir(exist_ok=True)
        (tmp_path / "writeback" / "outcome").write_text(outcome)
        (tmp_path / "writeback" / "commit").write_text("")
    result = subprocess.run(
        [*container["command"], *container.get("args", [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    calls = tmp_path / "calls"
    return result, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_that_exits_75_is_tried_again_in_its_container(tmp_path: Path, stage: str) -> None:
    result, calls = _run_stage(tmp_path, stage, (75, 0))
    assert result.returncode == 0, result.stdout + result.stderr
    if stage == "checkout":  # the first of its git commands failed, then all passed
        assert [call.split()[:2] for call in calls[:2]] == [["git", "init"]] * 2
    else:
        assert len(calls) == 2
    assert f"{stage}: trying again in 0s (retry 1 of 3)" in result.stderr


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_that_fails_otherwise_is_not_tried_again(tmp_path: Path, stage: str) -> None:
    result, calls = _run_stage(tmp_path, stage, (3, 0))
    assert result.returncode == 3, result.stdout + result.stderr
    assert len(calls) == 1, calls
    assert "trying again" not in result.stderr


def test_a_stage_is_tried_build_retries_times_at_most(tmp_path: Path) -> None:
    result, calls = _run_stage(tmp_path, "verify-digest", (75,) * 10)
    assert result.returncode == 75
    assert len(calls) == 1 + 3  # build.retries
    assert "retry 3 of 3" in result.stderr and "retry 4" not in result.stderr


def test_the_pause_between_attempts_doubles(tmp_path: Path) -> None:
    container = _container("plan")
    script = container["command"][2]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sleep").write_text('#!/bin/sh\necho "slept $1" >&2\n')
    (bin_dir / "sleep").chmod(0o755)
    (bin_dir / "fabrique").write_text("#!/bin/sh\nexit 75\n")
    (bin_dir / "fabrique").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STAGE": "plan", "RETRIES": "3"}
    result = subprocess.run(
        ["sh", "-c", script, "plan"], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 75
    assert [line for line in result.stderr.splitlines() if line.startswith("slept")] == [
        "slept 10",
        "slept 20",
        "slept 40",
    ]


def test_a_build_that_lost_a_push_race_succeeds_on_its_next_attempt(tmp_path: Path) -> None:
    once = tmp_path / "failed-once"
    buildctl = (
        "#!/bin/sh\n"
        f"if [ ! -e {once} ]; then\n"
        f"  touch {once}\n"
        "  echo 'error: failed to solve: failed to push: blob unknown to registry' >&2\n"
        "  exit 1\n"
        "fi\n"
        "echo '#7 pushing manifest done' >&2\n"
    )
    result = _run_build(tmp_path, {}, buildctl=buildctl)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "build: trying again in 0s (retry 1 of 3)" in result.stderr
    assert "#7 pushing manifest done" in result.stdout


@pytest.mark.parametrize("stage", AFTER_THE_PLAN)
def test_a_plan_that_builds_nothing_ends_every_later_stage_at_once(
    tmp_path: Path, stage: str
) -> None:
    """BuildKit never starts, nothing is checked out, verified, signed or written."""
    result, calls = _run_stage(tmp_path, stage, (1,) * 5, build="false")
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls == []
    assert result.stdout == f"{stage}: nothing to do (no change under dataops/citation-dagster)\n"


def test_a_write_back_that_fails_says_failed_in_its_outcome(tmp_path: Path) -> None:
    result, calls = _run_stage(tmp_path, "write-back", (3,))
    assert result.returncode == 3
    assert (tmp_path / "writeback" / "outcome").read_text() == "failed"
    # the verified digest, read from the file verify-digest wrote
    assert calls == [
        "fabrique writeback --app {{workflow.parameters.app}}"
        " --revision {{workflow.parameters.revision}}"
        " --workflow {{workflow.name}} --digest sha256:" + "d" * 64 + f" --out {tmp_path}/writeback"
    ]


def test_a_build_that_meets_its_push_writes_nothing_and_main_reports_nothing(
    tmp_path: Path,
) -> None:
    """A build a push asked for with its other builds into one repository (``group``):
    the push's Workflow writes the digests and posts the statuses."""
    result, calls = _run_stage(tmp_path, "write-back", (1,), group="fabrique-push-a-b")
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls == []
    assert (tmp_path / "writeback" / "outcome").read_text() == "grouped"
    assert "written with the push's other builds, by fabrique-push-a-b" in result.stdout
    result, calls = _run_stage(tmp_path, "main", (1,), outcome="grouped")
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls == []
    # a build of its own posts its success as before
    result, calls = _run_stage(tmp_path, "main", (0,), outcome="changed")
    assert result.returncode == 0 and calls[0].startswith("fabrique status-report success ")


@pytest.mark.parametrize(("build", "kind"), [("true", "pending"), ("false", "skipped")])
@pytest.mark.parametrize("code", [0, 1, 75])
def test_report_pending_posts_what_the_plan_decided_and_never_fails(
    tmp_path: Path, build: str, kind: str, code: int
) -> None:
    result, calls = _run_stage(tmp_path, "report-pending", (code, code), build=build)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(calls) == 1 and calls[0].startswith(f"fabrique status-report {kind} --app ")


@pytest.mark.parametrize("code", [0, 1, 75])
def test_main_posts_the_success_from_the_write_back_and_never_fails(
    tmp_path: Path, code: int
) -> None:
    (tmp_path / "writeback").mkdir()
    (tmp_path / "writeback" / "outcome").write_text("changed")
    (tmp_path / "writeback" / "commit").write_text("c" * 40)
    result, calls = _run_stage(tmp_path, "main", (code, code))
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(calls) == 1
    assert calls[0].startswith("fabrique status-report success --app ")
    assert calls[0].endswith(f" --digest sha256:{'d' * 64} --outcome changed --commit {'c' * 40}")


def test_a_stage_s_own_set_e_holds_inside_its_retry(tmp_path: Path) -> None:
    """The checkout's script ends at its first failing command (``set -e``): a ``git init``
    that failed must not go on to fetch into another folder. A function called where its
    status is tested (``run && …``) runs with ``set -e`` ignored, so the loop must not."""
    result, calls = _run_stage(tmp_path, "checkout", (3,))
    assert result.returncode == 3, result.stdout + result.stderr
    assert calls == ["git init -q " + str(tmp_path / "workspace" / "src")]
    assert "fetching" not in result.stdout
