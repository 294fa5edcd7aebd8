"""The shell of the checkout and build steps, run for real.

The checkout script runs against a real `git daemon`. The build script runs with an
argv recorder standing in for buildctl-daemonless.sh (BuildKit cannot run here): the
test checks the exact command line BuildKit would get.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fabrique.decisions.plan import make_plan
from fabrique.site.config import load_site
from pipelines.build import CHECKOUT_SCRIPT, build_template

from .conftest import CodeRepo
from .servers import GitDaemon


def _run_checkout(
    workspace: Path, repo_url: str, revision: str, context: str, dockerfile: str = "Dockerfile"
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(workspace.parent),
        "WORKSPACE": str(workspace),
        "REPO_URL": repo_url,
        "REVISION": revision,
        "CONTEXT": context,
        "DOCKERFILE": dockerfile,
    }
    return subprocess.run(
        ["sh", "-c", CHECKOUT_SCRIPT],
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
    assert result.returncode != 0


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


def _run_build(tmp_path: Path, env_overrides: dict[str, str], **site_env: str) -> list[str]:
    site = load_site(env=site_env)
    template = build_template(site).to_dict()
    build = next(t for t in template["spec"]["templates"] if t["name"] == "build")
    container: dict[str, Any] = build["container"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    recorder = bin_dir / "buildctl-daemonless.sh"
    recorder.write_text(RECORDER)
    recorder.chmod(0o755)
    plan = make_plan(site, "citation", "a" * 40)
    inputs = {
        "image-ref": plan.image_ref,
        "cache-ref": plan.cache_ref,
        "context": plan.context,
        "dockerfile": plan.dockerfile,
        "build-opts": plan.build_opts,
        **env_overrides,
    }
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "ARGV_FILE": str(tmp_path / "argv")}
    for item in container["env"]:
        value = item["value"].replace("{{workflow.parameters.revision}}", "a" * 40)
        for name, input_value in inputs.items():
            value = value.replace(f"{{{{inputs.parameters.{name}}}}}", input_value)
        env[item["name"]] = value
    env["WORKSPACE"] = str(tmp_path / "workspace")
    result = subprocess.run(
        container["command"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    return (tmp_path / "argv").read_text().splitlines()


def test_build_command_line(tmp_path: Path) -> None:
    argv = _run_build(tmp_path, {})
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
    argv = _run_build(tmp_path, {"build-opts": opts})
    assert argv[-4:] == [
        "--opt",
        'build-arg:GREETING=hello world; rm -rf / $(id) "quoted"',
        "--opt",
        "build-arg:EMPTY=",
    ]


def test_nested_dockerfile_path(tmp_path: Path) -> None:
    argv = _run_build(tmp_path, {"dockerfile": "docker/Dockerfile.prod"})
    src = f"{tmp_path}/workspace/src/dataops/citation-dagster"
    assert f"dockerfile={src}/docker" in argv
    assert "filename=Dockerfile.prod" in argv


@pytest.mark.parametrize(("cache", "attest"), [("false", "true")])
def test_build_switches(tmp_path: Path, cache: str, attest: str) -> None:
    argv = _run_build(
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
