"""`fabrique status`: one app's unreadable facts are that app's row, never the whole table.

Against the Gitea double (a real bare repository), the loopback registry and the
Kubernetes API double, with two apps: citation, deployed to bench then prod, and other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from fabrique.site.config import load_site
from fabrique.site.errors import TRANSIENT_EXIT_CODE, TRANSIENT_SAID

from .conftest import GITEA_TOKEN, KUSTOMIZATION, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .doubles.proxy import FaultProxy
from .servers import Registry

BENCH = "dataops/citation-dagster/deploy/overlays/bench/kustomization.yaml"
PROD = KUSTOMIZATION
OTHER = "dataops/other-app/kustomization.yaml"


def _values(tmp_path: Path, gitea_url: str, registry: Registry, **more: Any) -> Path:
    citation = load_site(env={}).to_values()["apps"][0]
    citation["writeback"] = {**citation["writeback"], "path": BENCH, "create": True}
    citation["environments"] = [
        {"name": "bench", "target": "bench"},
        {"name": "prod", "target": "prod", "writeback": {"repo": "atlas/atlas", "path": PROD}},
    ]
    other = {
        "name": "other",
        "image": "other",
        "context": "dataops/other-app",
        "writeback": {"repo": "atlas/atlas", "path": OTHER, "create": True},
    }
    return write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.url": gitea_url,
            "registry.host": registry.host,
            "targets": {"bench": {"context": "bench"}, "prod": {"context": "cluster-prod"}},
            "apps": [citation, other],
            **more,
        },
    )


@pytest.fixture()
def env(tmp_path: Path, kube: KubeApiDouble) -> dict[str, str]:
    return {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig", context="bench")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }


def _rows(stdout: str) -> dict[str, list[str]]:
    """The table's rows by app: its cells, split on blanks."""
    lines = stdout.splitlines()
    assert lines[0].split()[:2] == ["APP", "STATE"], stdout
    rows = {}
    for line in lines[1:]:
        cells = line.split()
        if not cells or cells[0].endswith(":"):
            break
        rows[cells[0]] = cells
    return rows


def _shows_the_others(result: Any, cause: str, code: int) -> None:
    assert result.exit_code == code, result.stdout + result.stderr
    rows = _rows(result.stdout)
    assert list(rows) == ["citation", "other"], result.stdout
    assert rows["citation"][1] == "error"
    assert rows["other"][1] == "not-built", "the other app's row is as it is"
    detail = next(line for line in result.stdout.splitlines() if line.startswith("citation: "))
    assert cause in detail, detail
    # a transient one says so in the words the exit handler's report reads
    said = f": {TRANSIENT_SAID}" if code == TRANSIENT_EXIT_CODE else ""
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: 1 app(s) could not be checked: citation{said}"
    ), result.stderr


def test_a_bad_hand_edit_of_an_environment_target_is_its_apps_row(
    tmp_path: Path, code_repo: Repo, gitea: GiteaDouble, registry: Registry, env: dict[str, str]
) -> None:
    code_repo.commit({PROD: "images: [this is: not yaml\n"})
    values = _values(tmp_path, gitea.url, registry)
    table = run_cli("--values", str(values), "status", env=env)
    _shows_the_others(table, f"atlas/atlas:{PROD}", 3)

    as_json = run_cli("--values", str(values), "status", "--output", "json", env=env)
    assert as_json.exit_code == 3, as_json.stderr
    entries = {entry["app"]: entry for entry in json.loads(as_json.stdout)}
    assert entries["citation"]["state"] == "error"
    assert f"atlas/atlas:{PROD}" in entries["citation"]["detail"]
    assert entries["other"]["state"] == "not-built"


def test_a_gitea_failure_on_an_environment_target_is_its_apps_row(
    tmp_path: Path, code_repo: Repo, gitea: GiteaDouble, registry: Registry, env: dict[str, str]
) -> None:
    proxy = FaultProxy(
        gitea.url, lambda method, path, headers: 503 if PROD in unquote(path) else None
    ).start()
    try:
        values = _values(
            tmp_path,
            f"http://{proxy.host}",
            registry,
            **{"network.attempts": 1, "network.backoffSeconds": 0.01},
        )
        result = run_cli("--values", str(values), "status", env=env)
    finally:
        proxy.stop()
    _shows_the_others(result, "503", 75)  # a later run may read it: transient


def test_the_help_says_when_the_exit_code_is_not_zero() -> None:
    shown = run_cli("status", "--help")
    assert "non-zero when any row is an error" in " ".join(shown.stdout.split())
