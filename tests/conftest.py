"""Shared fixtures: real servers on loopback (OCI registry, git daemon) and the doubles.

Servers are session-scoped and started by the tests themselves. A missing server binary
is a failure with the command that installs it, never a silent skip.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from pipelines.cli import cli
from pipelines.validate import find_specs

from . import servers
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .doubles.swagger import Swagger
from .servers import GitDaemon
from .servers import Nats as NatsServer

ROOT = Path(__file__).resolve().parent.parent
GITEA_SPEC = "gitea-1.27.1.swagger.json"


@pytest.fixture(scope="session")
def specs() -> Path:
    return find_specs(ROOT / ".." / "shared" / "specs")


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Registry]:
    with _need_server(), servers.registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@contextmanager
def _need_server() -> Iterator[None]:
    try:
        yield
    except servers.MissingServer as missing:
        pytest.fail(str(missing), pytrace=False)


@pytest.fixture(scope="session")
def gitea_swagger(specs: Path) -> Swagger:
    return Swagger(specs / GITEA_SPEC)


def make_commit(work: Path, files: dict[str, str], message: str) -> str:
    for relative, content in files.items():
        path = work / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(work),
            "-c",
            "user.name=seed",
            "-c",
            "user.email=seed@example.invalid",
            "commit",
            "-q",
            "-m",
            message,
        ],
        check=True,
    )
    return subprocess.run(
        ["git", "-C", str(work), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


class Repo:
    """A bare repository ``<root>/<owner>/<name>.git`` with a working clone to commit from."""

    def __init__(self, root: Path, slug: str) -> None:
        self.slug = slug
        self.bare = root / f"{slug}.git"
        self.work = root / "work" / slug
        self.bare.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(self.bare)], check=True)
        subprocess.run(["git", "init", "-q", "-b", "main", str(self.work)], check=True)
        subprocess.run(
            ["git", "-C", str(self.work), "remote", "add", "origin", str(self.bare)], check=True
        )

    def commit(self, files: dict[str, str], message: str = "change") -> str:
        """Commit on top of the server's main (pulled first), push, return the sha."""
        subprocess.run(
            ["git", "-C", str(self.work), "pull", "-q", "--ff-only", "origin", "main"],
            check=False,
            capture_output=True,
        )
        sha = make_commit(self.work, files, message)
        subprocess.run(
            ["git", "-C", str(self.work), "push", "-q", "origin", "HEAD:main"], check=True
        )
        return sha

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.bare), *args], capture_output=True, text=True, check=True
        ).stdout

    def head(self) -> str:
        return self.git("rev-parse", "refs/heads/main").strip()

    def show(self, path: str, ref: str = "main") -> str:
        return self.git("show", f"{ref}:{path}")


CodeRepo = Repo
KUSTOMIZATION = "dataops/citation-dagster/deploy/overlays/prod/kustomization.yaml"
SEED_KUSTOMIZATION = """\
# prod overlay of citation-dagster
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../base
images:
  - name: postgres   # pinned by hand
    newTag: "16.4"
"""


@pytest.fixture()
def repos_root(tmp_path: Path) -> Path:
    root = tmp_path / "srv"
    root.mkdir()
    return root


@pytest.fixture()
def code_repo(repos_root: Path) -> Repo:
    repo = Repo(repos_root, "atlas/atlas")
    repo.commit(
        {
            "dataops/citation-dagster/Dockerfile": "FROM scratch\nCOPY app.txt /\n",
            "dataops/citation-dagster/app.txt": "citation\n",
            KUSTOMIZATION: SEED_KUSTOMIZATION,
            "dataops/other-app/Dockerfile": "FROM scratch\n",
            # unique per test: the registry is shared by the session, and equal
            # histories made in the same second would have equal commit ids
            "README.md": f"atlas {uuid.uuid4()}\n",
        },
        "seed",
    )
    return repo


APPLICATION = "apps/citation.yaml"
SEED_APPLICATION = """\
# citation in prod: deployed by digest, written by fabrique
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata:
  name: citation
  namespace: argocd
spec:
  project: default
  sources:
    - repoURL: http://gitea-http.gitea.svc.cluster.local:3000/cluster/apps.git
      targetRevision: main
      ref: values
    - repoURL: http://gitea-http.gitea.svc.cluster.local:3000/atlas/atlas.git
      targetRevision: main
      path: dataops/citation-dagster/deploy/overlays/prod
  destination:
    server: https://kubernetes.default.svc
    namespace: dagster
"""


@pytest.fixture()
def apps_repo(repos_root: Path) -> Repo:
    repo = Repo(repos_root, "cluster/apps")
    repo.commit({APPLICATION: SEED_APPLICATION}, "seed")
    return repo


GITEA_TOKEN = "gitea-test-token-0f3c"


@pytest.fixture()
def gitea(gitea_swagger: Swagger, code_repo: Repo, apps_repo: Repo) -> Iterator[GiteaDouble]:
    double = GiteaDouble(
        gitea_swagger,
        {"atlas/atlas": code_repo.bare, "cluster/apps": apps_repo.bare},
        token=GITEA_TOKEN,
    )
    double.start()
    try:
        yield double
    finally:
        double.stop()
    assert double.violations == [], "the Gitea double saw traffic outside Gitea's spec"


@pytest.fixture()
def kube(specs: Path) -> Iterator[KubeApiDouble]:
    double = KubeApiDouble(specs).start()
    try:
        yield double
    finally:
        double.stop()


def write_values(path: Path, **overrides: Any) -> Path:
    """A values file: the generic site with ``overrides`` merged in (dotted keys)."""
    data: dict[str, Any] = {}
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run ``fabrique`` in-process, stdout and stderr kept apart."""
    runner = CliRunner()
    return runner.invoke(cli, list(args), env=env, catch_exceptions=False)


@pytest.fixture(autouse=True)
def _clean_fabrique_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the FABRIQUE_* variables they set themselves."""
    import os

    for name in list(os.environ):
        if name.startswith("FABRIQUE_"):
            monkeypatch.delenv(name)
    # real retries and backoff, on a test's time scale
    monkeypatch.setenv("FABRIQUE_NETWORK__BACKOFF_SECONDS", "0.01")


@pytest.fixture()
def git_daemon(repos_root: Path, code_repo: Repo) -> Iterator[GitDaemon]:
    with _need_server(), servers.git_daemon(repos_root) as running:
        yield running


@pytest.fixture()
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    with _need_server(), servers.nats(tmp_path / "jetstream") as running:
        yield running
