"""A command that was asked to do something and did nothing says so; it never passes for
a success that did not happen."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import run_cli, write_values
from .doubles.kube import KubeApiDouble


def _lock(root: Path, components: dict[str, object]) -> Path:
    root.mkdir(parents=True)
    (root / "lock.yaml").write_text(yaml.safe_dump({"components": components}))
    return root


def test_vendor_mirror_with_nothing_pinned_says_so(tmp_path: Path) -> None:
    root = _lock(tmp_path / "vendor", {"jetstream": {"version": "1", "images": {"nats:1": {}}}})
    result = run_cli("vendor", "--dir", str(root), "mirror", "--to", "127.0.0.1:1")
    assert result.exit_code != 0
    assert result.stderr.strip() == (
        "error: nothing to mirror to 127.0.0.1:1: no image of the lock is pinned yet "
        "(run fabrique vendor --update with Internet access first)"
    )
    assert result.stdout == ""


def test_vendor_an_unknown_component_is_an_error_with_check_too(tmp_path: Path) -> None:
    root = _lock(tmp_path / "vendor", {"jetstream": {"version": "1", "images": {"nats:1": {}}}})
    for args in (["--check"], ["mirror", "--to", "127.0.0.1:1"], []):
        result = run_cli("vendor", "--dir", str(root), "--component", "nope", *args)
        assert result.exit_code == 2, (args, result.stderr)
        assert "--component 'nope': not in" in result.stderr and "(jetstream)" in result.stderr
    checked = run_cli("vendor", "--dir", str(root), "--component", "jetstream", "--check")
    assert checked.exit_code == 0, checked.stderr
    assert "notice: jetstream: not pinned yet: nats:1" in checked.stderr


def test_derive_secrets_with_nothing_declared_says_so(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "none")}  # no cluster is needed to say it
    for args in (["--dry-run"], []):
        result = run_cli("derive-secrets", *args, env=env)
        assert result.exit_code == 0, result.stderr
        assert result.stdout.strip() == "nothing declared: the site lists no derivedSecrets"
    scoped = run_cli("derive-secrets", "--dry-run", "--app", "citation", env=env)
    assert scoped.stdout.strip() == (
        "nothing declared: the site lists no derivedSecrets for app citation"
    )


def test_lint_apps_on_a_directory_without_any_application(tmp_path: Path, specs: Path) -> None:
    checkout = tmp_path / "apps"
    checkout.mkdir()
    (checkout / "configmap.yaml").write_text("apiVersion: v1\nkind: ConfigMap\n")
    for directory in (checkout, tmp_path / "empty"):
        directory.mkdir(exist_ok=True)
        result = run_cli("lint", "apps", str(directory), "--specs", str(specs))
        assert result.exit_code == 2, result.stderr
        assert "no Application found" in result.stderr
        assert result.stdout == ""


def test_an_empty_values_file_is_an_error(tmp_path: Path) -> None:
    for text in ("", "# only a comment\n", "---\n"):
        values = tmp_path / "site.yaml"
        values.write_text(text)
        result = run_cli("--values", str(values), "config", "show")
        assert result.exit_code == 2, text
        assert (
            result.stderr.strip()
            == f"error: values file {values}: is empty; give at least one setting"
        )


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("registry:\n  host: a:80\nbuild:\n  cache: true\nregistry:\n  plainHttp: false\n", 5),
        ("registry:\n  host: a:80\n  host: b:80\n", 3),
    ],
    ids=["top-level", "nested"],
)
def test_a_key_given_twice_is_an_error(tmp_path: Path, text: str, where: int) -> None:
    values = tmp_path / "site.yaml"
    values.write_text(text)
    result = run_cli("--values", str(values), "config", "show")
    assert result.exit_code == 2
    key = "registry" if where == 5 else "host"
    assert (
        result.stderr.strip() == f"error: values file {values}: line {where}: duplicate key {key!r}"
    )


def test_every_config_error_is_listed(tmp_path: Path) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{"registry.host": "http://x", "build.retries": 99, "gitea.brnch": "main"},
    )
    result = run_cli("--values", str(values), "config", "show")
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "more]" not in line
    assert "registry.host: must be host or host:port, without a scheme (got 'http://x')" in line
    assert "build.retries: Input should be less than or equal to 10 (got 99)" in line
    assert "gitea.brnch: unknown field" in line


def test_every_unknown_variable_is_named() -> None:
    env = {"FABRIQUE_REGISTRY_HOST": "x:80", "FABRIQUE_BUILD__RETRIS": "2"}
    result = run_cli("config", "show", env=env)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: FABRIQUE_BUILD__RETRIS: unknown setting 'retris'; "
        "FABRIQUE_REGISTRY_HOST: unknown setting 'registry_host' (nested settings use '__' "
        "between levels: FABRIQUE_REGISTRY__HOST)"
    )


def test_derive_secrets_dry_run_says_what_it_would_do(tmp_path: Path, kube: KubeApiDouble) -> None:
    kube.secrets[("postgres", "pg-role-pgvector")] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pg-role-pgvector", "namespace": "postgres", "resourceVersion": "1"},
        "data": {"password": "czNjcjN0"},
    }
    values = write_values(
        tmp_path / "site.yaml",
        derivedSecrets=[
            {
                "from": "postgres/pg-role-pgvector",
                "to": "dagster/pg-auth",
                "keys": {"pw": "password"},
            }
        ],
    )
    env = {"KUBECONFIG": str(kube.kubeconfig(tmp_path / "kc"))}
    result = run_cli("--values", str(values), "derive-secrets", "--dry-run", env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == (
        "would be changed: Secret dagster/pg-auth (created with pw from postgres/pg-role-pgvector)"
    )
    assert ("dagster", "pg-auth") not in kube.secrets
