"""The build step for real: its rendered checkout and build scripts, the release's
``buildctl-daemonless.sh``, buildkitd and buildctl (``buildkit.py``), pushing to a real
registry that ``fabrique digest verify`` then reads.

The registry is reached by the machine's host name (``named_registry``, in conftest.py),
under which the rendered ``buildkitd.toml`` is what makes the push work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from fabrique.clients.registry import RegistryClient
from fabrique.decisions.plan import make_plan
from fabrique.decisions.provenance import Expected, check_labels
from fabrique.site.config import Site, load_site
from fabrique.site.errors import ImageNotFound
from pipelines.build import BUILD_INPUTS

from ..conftest import GITEA_TOKEN, KUSTOMIZATION, Repo, run_cli, write_values
from ..doubles.gitea import GiteaDouble
from ..doubles.proxy import Answer, FaultProxy
from ..manifests import rendered_step, step_env
from ..oci import OCI_MANIFEST, push_image
from ..servers import GitDaemon, Registry
from .buildkit import Build, Builder

APP_DIR = "dataops/citation-dagster"


def _site(tmp_path: Path, registry: Registry, **overrides: object) -> tuple[Path, Site]:
    values = write_values(
        tmp_path / "site.yaml",
        **{"registry.host": registry.host, "registry.plainHttp": True, **overrides},
    )
    return values, load_site(values, env={})


def _app(code_repo: Repo, base_image: str) -> str:
    """A commit of the app whose Dockerfile runs a command (runc) and copies a file; its
    own, so that no other test's build cache holds its steps."""
    nonce = time.time_ns()
    return code_repo.commit(
        {
            f"{APP_DIR}/Dockerfile": (
                f"FROM {base_image}\n"
                f"RUN echo built {nonce} > /built.txt && busybox sha256sum /built.txt\n"
                "COPY app.txt /app.txt\n"
            ),
            f"{APP_DIR}/app.txt": f"citation {nonce}\n",
        },
        "app",
    )


def _checkout(buildkit: Builder, site: Site, git_daemon: GitDaemon, revision: str) -> Path:
    """The rendered checkout step, into a workspace the builder can read."""
    workspace = buildkit.folder("workspace")
    container = rendered_step(site, "checkout")
    inputs = {
        "repo-url": git_daemon.url("atlas/atlas.git"),
        "context": APP_DIR,
        "dockerfile": "Dockerfile",
    }
    env = step_env(container, revision, inputs, plan=buildkit.folder("plan")) | {
        "PATH": os.environ["PATH"],
        "HOME": str(workspace.parent),
        "WORKSPACE": str(workspace),
    }
    done = subprocess.run(
        container["command"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return workspace


def _build(buildkit: Builder, site: Site, revision: str, workspace: Path) -> Build:
    plan = make_plan(site, "citation", revision)
    inputs = {name: plan.outputs()[name] for name in BUILD_INPUTS}  # as the plan hands them
    return buildkit.run(site, revision, inputs, workspace)


def _verify(values: Path, revision: str, metadata: Path):  # type: ignore[no-untyped-def]
    return run_cli(
        *("--values", str(values), "digest", "verify", "--app", "citation"),
        *("--revision", revision, "--metadata", str(metadata)),
    )


def _writeback(values: Path, revision: str, digest: str):  # type: ignore[no-untyped-def]
    return run_cli(
        *("--values", str(values), "writeback", "--app", "citation"),
        *("--revision", revision, "--digest", digest),
        env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN},
    )


def test_the_build_step_pushes_what_digest_verify_accepts(
    tmp_path: Path,
    buildkit: Builder,
    named_registry: Registry,
    base_image: str,
    code_repo: Repo,
    git_daemon: GitDaemon,
) -> None:
    values, site = _site(tmp_path, named_registry)
    revision = _app(code_repo, base_image)
    build = _build(buildkit, site, revision, _checkout(buildkit, site, git_daemon, revision))
    assert build.returncode == 0, build.output
    assert re.search(r"RUN echo built .*\n.*[0-9a-f]{64}  /built\.txt", build.output), (
        "the RUN step ran in a container"
    )
    metadata = json.loads(build.metadata.read_text())
    ref = f"{named_registry.host}/citation-dagster:{revision[:12]}"
    assert metadata["image.name"] == ref

    verified = _verify(values, revision, build.metadata)
    assert verified.exit_code == 0, verified.stderr
    assert verified.stdout.strip() == metadata["containerimage.digest"]
    # the image carries the labels the write-back and a rollback check
    with RegistryClient(named_registry.host, plain_http=True) as client:
        check_labels(
            client,
            Expected(
                "citation-dagster",
                metadata["containerimage.digest"],
                revision,
                site.gitea.repo_url(site.gitea.code_repo),
            ),
        )

    # another push to the tag between the build and the check: exit 4, nothing verified
    push_image(named_registry.url, "citation-dagster", revision[:12], {"other": b"x"})
    overwritten = _verify(values, revision, build.metadata)
    assert overwritten.exit_code == 4, overwritten.stderr
    assert "another push overwrote the tag?" in overwritten.stderr


def test_without_the_rendered_plain_http_entry_the_push_is_refused(
    tmp_path: Path,
    buildkit: Builder,
    named_registry: Registry,
    base_image: str,
    code_repo: Repo,
    git_daemon: GitDaemon,
) -> None:
    """The same build, the site saying its registry speaks HTTPS: buildkitd.toml has no
    entry, and BuildKit speaks HTTPS to the registry, which answers in plain HTTP."""
    _, https = _site(tmp_path, named_registry, **{"registry.plainHttp": False})
    revision = _app(code_repo, base_image)
    workspace = _checkout(buildkit, https, git_daemon, revision)
    build = _build(buildkit, https, revision, workspace)
    assert "http: server gave HTTP response to HTTPS client" in build.output
    # the site's settings are wrong: a retry would fail the same way
    assert build.returncode == 1, build.output
    assert "transient" not in build.output


def test_with_attestations_the_index_carries_the_provenance_and_is_written_back(
    tmp_path: Path,
    buildkit: Builder,
    named_registry: Registry,
    base_image: str,
    code_repo: Repo,
    git_daemon: GitDaemon,
    gitea: GiteaDouble,
) -> None:
    values, site = _site(
        tmp_path, named_registry, **{"build.attestations": True, "gitea.url": gitea.url}
    )
    revision = _app(code_repo, base_image)
    build = _build(buildkit, site, revision, _checkout(buildkit, site, git_daemon, revision))
    assert build.returncode == 0, build.output
    digest = json.loads(build.metadata.read_text())["containerimage.digest"]
    with RegistryClient(named_registry.host, plain_http=True) as client:
        assert client.manifest("citation-dagster", digest).is_index

    # verify-digest reads BuildKit's own provenance: the revision and the repository
    verified = _verify(values, revision, build.metadata)
    assert verified.exit_code == 0, verified.stderr
    assert verified.stdout.strip() == digest

    written = _writeback(values, revision, digest)
    assert written.exit_code == 0, written.stderr
    pins = yaml.safe_load(code_repo.show(KUSTOMIZATION))["images"]
    assert pins[-1]["digest"] == digest


def test_an_sbom_needs_the_scanner_image_in_the_registry(
    tmp_path: Path,
    buildkit: Builder,
    named_registry: Registry,
    base_image: str,
    code_repo: Repo,
    git_daemon: GitDaemon,
) -> None:
    """BuildKit runs the SBOM generator as an image: the air-gapped factory must mirror
    it. Without it the build fails, and no image goes without its SBOM."""
    scanner = f"{named_registry.host}/buildkit-syft-scanner:1.4.0"
    _, site = _site(
        tmp_path,
        named_registry,
        **{"build.attestations": True, "build.sbom": True, "images.sbomScanner": scanner},
    )
    revision = _app(code_repo, base_image)
    build = _build(buildkit, site, revision, _checkout(buildkit, site, git_daemon, revision))
    assert build.returncode == 1, build.output
    assert f"{scanner}: not found" in build.output
    with (
        RegistryClient(named_registry.host, plain_http=True) as client,
        pytest.raises(ImageNotFound),
    ):
        client.manifest_digest("citation-dagster", revision[:12])


def test_a_second_build_of_the_commit_imports_the_registry_cache(
    tmp_path: Path,
    buildkit: Builder,
    named_registry: Registry,
    base_image: str,
    code_repo: Repo,
    git_daemon: GitDaemon,
) -> None:
    """Each build starts with empty BuildKit state, as each build pod does: what the
    second finds, it finds in ``<image>:buildcache``."""
    _, site = _site(tmp_path, named_registry)
    assert site.build.cache
    revision = _app(code_repo, base_image)
    workspace = _checkout(buildkit, site, git_daemon, revision)
    first = _build(buildkit, site, revision, workspace)
    assert first.returncode == 0, first.output
    assert "CACHED" not in first.output
    second = _build(buildkit, site, revision, workspace)
    assert second.returncode == 0, second.output
    assert "importing cache manifest from" in second.output
    run = re.search(r"^#(\d+) \[2/3\] RUN ", second.output, re.M)
    assert run is not None, second.output
    assert f"#{run[1]} CACHED" in second.output, second.output


# the registry's words for a read that met a blob link being rewritten
RACE_WORDS = ("blob unknown to registry", "provided digest did not match uploaded content")


def _race_answer(registry: Registry, base: str, rounds: int = 40) -> Answer:
    """The registry's own answer to a manifest PUT that lost the race BuildKit's two
    concurrent pushes run in it: mounts of a blob the repository already links rewrite
    the link in place (truncate, write), and the PUT, checking its blobs, reads it in
    between. Provoked here as the image and cache pushes do it, at a higher rate; at most
    ``rounds`` rounds of 2 x 20 mounts against 20 PUTs, each in a new repository."""
    name, tag = base.removeprefix(f"{registry.host}/").split(":")
    with httpx.Client(base_url=registry.url, timeout=10) as client:
        manifest = client.get(f"/v2/{name}/manifests/{tag}", headers={"Accept": OCI_MANIFEST})
        body = manifest.content
        blobs = [d["digest"] for d in [*manifest.json()["layers"], manifest.json()["config"]]]
    for _ in range(rounds):
        repo = f"race-{uuid.uuid4().hex[:8]}"
        answers: list[httpx.Response] = []

        def mount(repo: str = repo) -> None:
            with httpx.Client(base_url=registry.url, timeout=10) as client:
                for _ in range(20):
                    for blob in blobs:
                        client.post(f"/v2/{repo}/blobs/uploads/?mount={blob}&from={name}")

        def put(repo: str = repo, answers: list[httpx.Response] = answers) -> None:
            with httpx.Client(base_url=registry.url, timeout=10) as client:
                for i in range(20):
                    answers.append(
                        client.put(
                            f"/v2/{repo}/manifests/t{i}",
                            content=body,
                            headers={"Content-Type": OCI_MANIFEST},
                        )
                    )

        with httpx.Client(base_url=registry.url, timeout=10) as client:
            for blob in blobs:  # linked once: every mount after rewrites the link
                client.post(f"/v2/{repo}/blobs/uploads/?mount={blob}&from={name}")
        threads = [threading.Thread(target=t) for t in (mount, mount, put)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for answer in answers:
            if answer.status_code == 400 and any(w in answer.text for w in RACE_WORDS):
                headers = {"Content-Type": answer.headers["content-type"]}
                return answer.status_code, headers, answer.content
    pytest.fail(f"the registry answered no manifest PUT with {RACE_WORDS} in {rounds} rounds")


def test_a_push_that_lost_the_registrys_race_exits_75_and_the_retry_pushes(
    tmp_path: Path,
    buildkit: Builder,
    named_registry: Registry,
    base_image: str,
    code_repo: Repo,
    git_daemon: GitDaemon,
) -> None:
    """Issue 29 #14: about one build in seven failed with exit 1, not retried. The
    registry's answer when the image's manifest PUT meets a link being rewritten, got
    from the real registry, is given to the real BuildKit once (a proxy in front of the
    registry): buildctl fails with it, the attempt exits 75, and the build container's
    script tries again. The retry pushes, and digest verify accepts what it pushed."""
    lost = _race_answer(named_registry, base_image)
    manifest_put: list[str] = []  # the image's, once its revision is known
    faults: list[str] = []

    def race(method: str, path: str, headers: dict[str, str]) -> Answer | None:
        if method == "PUT" and path in manifest_put and not faults:
            faults.append(path)
            return lost
        return None

    proxy = FaultProxy(named_registry.url, race).start()
    try:
        # all through the proxy, the base image too: on loopback, BuildKit speaks plain
        # HTTP to it without buildkitd.toml
        revision = _app(code_repo, base_image.replace(named_registry.host, proxy.host))
        manifest_put.append(f"/v2/citation-dagster/manifests/{revision[:12]}")
        values, site = _site(tmp_path, named_registry, **{"registry.host": proxy.host})
        workspace = _checkout(buildkit, site, git_daemon, revision)
        retried = _build(buildkit, site, revision, workspace)
        assert faults == manifest_put, retried.output
        assert retried.retries == 1, retried.output
        assert any(words in retried.output for words in RACE_WORDS), retried.output
        assert "transient, worth retrying" in retried.output
        assert retried.returncode == 0, retried.output
        verified = _verify(values, revision, retried.metadata)
        assert verified.exit_code == 0, verified.stderr
        assert (
            verified.stdout.strip()
            == json.loads(retried.metadata.read_text())["containerimage.digest"]
        )
    finally:
        proxy.stop()


def test_buildctl_daemonless_sh_is_the_release_s(buildkit: Builder) -> None:
    """The script the step's image runs, not a stand-in."""
    script = (buildkit.bin / "buildctl-daemonless.sh").read_text()
    assert "spawns ephemeral buildkitd" in script
    assert shutil.which("runc"), "the OCI worker runs its containers with runc"
