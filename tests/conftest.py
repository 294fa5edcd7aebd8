"""Shared fixtures: real servers on loopback (OCI registry, git daemon) and the doubles.

Servers are session-scoped and started by the tests themselves. A missing server binary
is a failure with the command that installs it, never a silent skip.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from fabrique.cli import cli
from fabrique.validate import GITEA_SWAGGER, find_specs

from . import servers
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .doubles.swagger import Swagger
from .gitrepo import Repo
from .live.fixtures import (  # noqa: F401  (the live tier's)
    applied,
    cluster,
    control_plane,
    kubectl,
    node_plane,
    real_gitea,
)
from .servers import GitDaemon
from .servers import Nats as NatsServer

ROOT = Path(__file__).resolve().parent.parent


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under ``tests/live/`` is marked ``live``. ``make test`` runs the suite
    on two workers (pytest-xdist, ``--dist loadgroup``): every ``live`` test, the live
    tier's and the real-server cases of the contract suites, goes to one worker, which
    starts one control plane and one Gitea for all of them and spends most of its time
    waiting on the real programs; the other worker runs the rest."""
    live = ROOT / "tests" / "live"
    for item in items:
        if live in item.path.parents:
            item.add_marker(pytest.mark.live)
        if item.get_closest_marker("live") is not None:
            item.add_marker(pytest.mark.xdist_group("live"))


@pytest.fixture(scope="session")
def specs() -> Path:
    return find_specs()


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
    return Swagger(specs / GITEA_SWAGGER)


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
# the app citation, its image pinned in its Argo CD Application in cluster/apps
APPLICATION_APP = {
    "name": "citation",
    "image": "citation-dagster",
    "context": "dataops/citation-dagster",
    "writeback": {"kind": "argocd-application", "repo": "cluster/apps", "path": APPLICATION},
}
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


def unreachable_kubeconfig(path: Path) -> Path:
    """A kubeconfig whose one context names an API server nothing listens for."""
    from .servers import closed_port

    path.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
        f"    server: http://127.0.0.1:{closed_port()}\n"
        "contexts:\n- name: c\n  context:\n    cluster: c\n"
        "    user: u\nusers:\n- name: u\n  user: {}\ncurrent-context: c\n"
    )
    return path


def run_bench(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``bench/<script> ARGS`` as a person runs it, from the project's folder: what it
    said, and how it exited."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_cli(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
    """Run ``fabrique`` in-process, stdout and stderr kept apart."""
    runner = CliRunner()
    return runner.invoke(cli, list(args), env=env, input=input, catch_exceptions=False)


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
