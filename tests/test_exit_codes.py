"""The exit codes the README documents: 75 only when a later attempt may pass, 2 for
config the user must fix, 3 for a server that answered wrongly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabrique.decisions import status
from fabrique.site.errors import TRANSIENT_SAID

from .conftest import run_cli, unreachable_kubeconfig, write_values
from .doubles.proxy import FaultProxy
from .safety_net import repaired_from_node
from .servers import closed_port, free_port

REV = "a" * 40
DIGEST = "sha256:" + "a" * 64


def _writeback_over(tmp_path: Path, git_url: str, **env: str):  # type: ignore[no-untyped-def]
    values = write_values(
        tmp_path / "site.yaml", **{"writeback.transport": "git", "writeback.gitUrl": git_url}
    )
    return run_cli(
        "--values",
        str(values),
        "writeback",
        "--app",
        "citation",
        "--revision",
        REV,
        "--digest",
        DIGEST,
        env={"FABRIQUE_GITEA_TOKEN": "t", **env},
    )


@pytest.mark.parametrize(
    ("scheme", "cause"),
    [
        ("http://127.0.0.1:{port}", "Couldn't connect to server"),
        ("https://127.0.0.1:{port}", "Couldn't connect to server"),
        ("git://127.0.0.1:{port}", "Connection refused"),
        ("ssh://git@127.0.0.1:{port}", "Connection refused"),
    ],
    ids=["http", "https", "git", "ssh"],
)
def test_git_transport_with_the_server_down_is_transient(
    tmp_path: Path, scheme: str, cause: str
) -> None:
    port = free_port()  # nothing listens there
    result = _writeback_over(tmp_path, scheme.format(port=port))
    assert result.exit_code == 75, result.stderr
    assert "git fetch failed" in result.stderr and cause in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 + result.stderr.count("retry ")


def test_an_ssh_failure_keeps_the_cause_git_prints_first(tmp_path: Path) -> None:
    port = free_port()
    result = _writeback_over(tmp_path, f"ssh://git@127.0.0.1:{port}")
    last = result.stderr.strip().splitlines()[-1]
    assert f"ssh: connect to host 127.0.0.1 port {port}: Connection refused" in last
    assert "the repository exists" not in last


def test_the_operators_ssh_command_reaches_git(tmp_path: Path) -> None:
    """GIT_SSH_COMMAND is how an operator picks a key or known_hosts: git must see it,
    while git's other variables (GIT_DIR and the like) stay out."""
    seen = tmp_path / "ssh-called"
    ssh = tmp_path / "ssh"
    ssh.write_text(f'#!/bin/sh\necho "$@" > {seen}\necho "ssh: stand-in refused" >&2\nexit 255\n')
    ssh.chmod(0o755)
    result = _writeback_over(
        tmp_path,
        "ssh://git@127.0.0.1:1/atlas/atlas.git",
        GIT_SSH_COMMAND=str(ssh),
        GIT_DIR=str(tmp_path / "elsewhere"),
    )
    assert result.exit_code != 0
    assert "127.0.0.1" in seen.read_text()
    assert "ssh: stand-in refused" in result.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_git_error_lines_are_taken_whole() -> None:
    from fabrique.clients.git import first_error, is_transient

    denied = (
        "git@gitea-ssh.gitea: Permission denied (publickey).\n"
        "fatal: Could not read from remote repository.\n\n"
        "Please make sure you have the correct access rights\nand the repository exists.\n"
    )
    assert first_error(denied) == "git@gitea-ssh.gitea: Permission denied (publickey)."
    assert not is_transient(128, denied), "a refused key does not get better by retrying"
    daemon = "fatal: unable to connect to gitea:\ngitea[0: 10.0.0.1]: errno=Connection refused\n"
    assert first_error(daemon) == (
        "fatal: unable to connect to gitea: gitea[0: 10.0.0.1]: errno=Connection refused"
    )
    assert is_transient(128, daemon)
    assert first_error("warning: redirecting to https://x/\nfatal: boom\n") == "fatal: boom"
    http_500 = "fatal: unable to access 'https://x/a.git/': The requested URL returned error: 502\n"
    assert is_transient(128, http_500)
    missing = "fatal: repository 'https://x/a.git/' not found\n"
    assert not is_transient(128, missing)
    assert not is_transient(1, "error: connection refused"), "only git's fatal exit"
    assert is_transient(-9, ""), "killed by a signal"


def test_no_kubeconfig_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    env = {"KUBECONFIG": str(tmp_path / "none")}
    for args in (
        ["submit", "--app", "citation", "--revision", REV],
        ["status"],
    ):
        result = run_cli(*args, env=env)
        assert result.exit_code == 2, (args, result.stderr)
        assert "no Kubernetes config" in result.stderr


def test_an_unknown_kube_context_is_a_config_error(tmp_path: Path) -> None:
    config = unreachable_kubeconfig(tmp_path / "kubeconfig")
    result = run_cli(
        "submit",
        "--app",
        "citation",
        "--revision",
        REV,
        "--context",
        "nope",
        env={"KUBECONFIG": str(config)},
    )
    assert result.exit_code == 2, result.stderr
    assert "kube context 'nope'" in result.stderr


@pytest.fixture()
def unavailable() -> Iterator[str]:
    """An HTTP server that answers 503 to everything: the URL of it."""
    proxy = FaultProxy(f"http://127.0.0.1:{closed_port()}", lambda *_: 503).start()
    try:
        yield f"http://{proxy.host}"
    finally:
        proxy.stop()


# fabrique's own steps in fabrique-build, each with a server it needs down or answering
# 503: the site values, then the command after ``--values``
STEPS = {
    "plan, git server down": (
        {"writeback.transport": "git", "writeback.gitUrl": "git://127.0.0.1:{closed}"},
        ["plan", "--app", "citation", "--revision", REV, "--out", "{tmp}/plan"],
    ),
    "plan, git server answering 503": (
        {"writeback.transport": "git", "writeback.gitUrl": "{unavailable}"},
        ["plan", "--app", "citation", "--revision", REV, "--out", "{tmp}/plan"],
    ),
    "verify-digest, registry answering 503": (
        {"registry.host": "{unavailable_host}"},
        ["digest", "verify", "--app", "citation", "--revision", REV, "--metadata", "{tmp}/m.json"],
    ),
    "write-back, Gitea answering 503": (
        {"gitea.url": "{unavailable}"},
        ["writeback", "--app", "citation", "--revision", REV, "--digest", DIGEST],
    ),
    "write-back, git server down": (
        {"writeback.transport": "git", "writeback.gitUrl": "git://127.0.0.1:{closed}"},
        ["writeback", "--app", "citation", "--revision", REV, "--digest", DIGEST],
    ),
}


@pytest.mark.parametrize("case", list(STEPS))
def test_a_step_that_gives_up_on_a_transient_cause_says_so_on_its_last_line(
    tmp_path: Path, unavailable: str, case: str
) -> None:
    """Exit 75's words end the error line, once, so that the exit handler's report and the
    reconcile pass count it the infrastructure's even on a node message that carries the
    last line alone, with no exit code ahead of it."""
    (tmp_path / "m.json").write_text(json.dumps({"containerimage.digest": DIGEST}))
    fill = {
        "closed": str(closed_port()),
        "unavailable": unavailable,
        "unavailable_host": unavailable.removeprefix("http://"),
        "tmp": str(tmp_path),
    }
    settings, args = STEPS[case]
    values = write_values(
        tmp_path / "site.yaml",
        **{"network.attempts": 1, **{k: v.format(**fill) for k, v in settings.items()}},
    )
    result = run_cli(
        "--values",
        str(values),
        *(arg.format(**fill) for arg in args),
        env={"FABRIQUE_GITEA_TOKEN": "t"},
    )
    assert result.exit_code == 75, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and last.endswith(f": {TRANSIENT_SAID}"), last
    assert last.count(TRANSIENT_SAID) == 1, last
    step = args[0]
    failures = [{"displayName": f"{step}(2)", "message": last, "phase": "Failed"}]
    report = status.failed("Failed", json.dumps(failures), "wf")
    assert report is not None and report.state == "error", report
    repaired = repaired_from_node(f"{step}(2)", last)
    assert repaired is not None and repaired.state == "error", "the reconcile pass's too"
