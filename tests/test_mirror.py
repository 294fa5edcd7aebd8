"""Gitea pull mirrors, the mirror CronWorkflow and the egress it implies; lint apps."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import GITEA_TOKEN, ROOT, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .manifests import find

TREE = ROOT / "manifests"
ENV = {"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN}


@pytest.fixture()
def values(tmp_path: Path, gitea: GiteaDouble) -> Path:
    return write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.url": gitea.url,
            "mirrors": [
                {
                    "repo": "mirrors/cluster",
                    "source": "https://github.com/example/cluster.git",
                    "interval": "10m",
                },
            ],
        },
    )


def test_ensure_creates_then_unchanged_then_repairs(values: Path, gitea: GiteaDouble) -> None:
    created = run_cli("--values", str(values), "mirror", "ensure", env=ENV)
    assert created.exit_code == 0, created.stderr
    assert (
        created.stdout.strip()
        == "created: mirrors/cluster (pull mirror of https://github.com/example/cluster.git every 10m)"
    )
    migrate = next(r for r in gitea.requests if r.path == "/api/v1/repos/migrate")
    assert migrate.json() == {
        "clone_addr": "https://github.com/example/cluster.git",
        "repo_owner": "mirrors",
        "repo_name": "cluster",
        "mirror": True,
        "mirror_interval": "10m",
        "private": True,
        "service": "git",
    }  # and the double checked it against MigrateRepoOptions

    assert (
        run_cli("--values", str(values), "mirror", "ensure", env=ENV).stdout.strip()
        == "unchanged: mirrors/cluster"
    )

    gitea.mirrors["mirrors/cluster"]["interval"] = "8h0m0s"  # changed by hand in Gitea
    repaired = run_cli("--values", str(values), "mirror", "ensure", env=ENV)
    assert repaired.stdout.strip() == "repaired: mirrors/cluster (interval 8h0m0s -> 10m)"
    assert (
        run_cli("--values", str(values), "mirror", "ensure", env=ENV).stdout.strip()
        == "unchanged: mirrors/cluster"
    )


def test_dry_run_and_sync(values: Path, gitea: GiteaDouble) -> None:
    dry = run_cli("--values", str(values), "mirror", "ensure", "--dry-run", env=ENV)
    assert dry.stdout.startswith("would be created: mirrors/cluster")
    assert gitea.mirrors == {}
    run_cli("--values", str(values), "mirror", "ensure", env=ENV)
    synced = run_cli("--values", str(values), "mirror", "sync", env=ENV)
    assert synced.stdout.strip() == "synced: mirrors/cluster"
    assert gitea.mirrors["mirrors/cluster"]["syncs"] == 1


def test_a_repository_that_is_not_a_mirror_is_not_converted(
    tmp_path: Path, gitea: GiteaDouble
) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.url": gitea.url,
            "mirrors": [
                {
                    "repo": "other/thing",
                    "source": "https://github.com/example/thing.git",
                    "interval": "10m",
                },
            ],
        },
    )
    gitea.mirrors["other/thing"] = {
        "id": 9,
        "interval": "10m0s",
        "source": "https://github.com/someone/else.git",
        "syncs": 0,
    }
    result = run_cli("--values", str(values), "mirror", "ensure", env=ENV)
    assert result.exit_code == 3
    assert (
        "mirrors https://github.com/someone/else.git, not https://github.com/example/thing.git"
        in result.stderr
    )


def test_mirror_cron_and_its_egress() -> None:
    cron = find(TREE, "CronWorkflow", "gitea-mirror-sync")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    container = cron["spec"]["workflowSpec"]["templates"][0]["container"]
    assert container["args"] == ["mirror", "sync"]
    assert cron["metadata"]["namespace"] == "fabrique", "not in the privileged namespace"
    spec = cron["spec"]["workflowSpec"]
    assert spec["automountServiceAccountToken"] is False, "it calls Gitea, never the API"
    assert spec["executor"] == {"serviceAccountName": "fabrique-executor"}
    sync = find(TREE, "NetworkPolicy", "mirror-sync", "fabrique")
    assert sync["spec"]["podSelector"] == {"matchLabels": {"fabrique.io/role": "mirror-sync"}}
    assert "Ingress" in sync["spec"]["policyTypes"] and "ingress" not in sync["spec"]
    targets = [rule["to"][0] for rule in sync["spec"]["egress"]]
    assert [t.get("podSelector", t.get("ipBlock")) for t in targets] == [
        {"matchLabels": {"k8s-app": "kube-dns"}},
        {"matchLabels": {"app.kubernetes.io/name": "gitea"}},
        {"cidr": "192.0.2.1/32"},
    ]


def test_gitea_pods_reach_only_github_on_443_outside_the_cluster() -> None:
    policy = find(TREE, "NetworkPolicy", "gitea-egress")
    assert policy["metadata"]["namespace"] == "gitea"
    outside = [rule for rule in policy["spec"]["egress"] if "ipBlock" in rule["to"][0]]
    assert outside == [
        {
            "to": [
                {"ipBlock": {"cidr": c}}
                for c in (
                    "140.82.112.0/20",
                    "143.55.64.0/20",
                    "185.199.108.0/22",
                    "192.30.252.0/22",
                )
            ],
            "ports": [{"protocol": "TCP", "port": 443}],
        }
    ]
    inside = [rule for rule in policy["spec"]["egress"] if "ipBlock" not in rule["to"][0]]
    assert all(rule.get("ports") for rule in inside), "no in-cluster rule opens every port"
    assert all(
        peer.get("podSelector") and peer.get("namespaceSelector", {}).get("matchLabels")
        for rule in inside
        for peer in rule["to"]
    ), "named pods of named namespaces only: no namespaceSelector {}"
    webhook = {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "fabrique"}},
                "podSelector": {"matchLabels": {"eventsource-name": "gitea"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 12000}],
    }
    assert webhook in inside, "webhook #2 reaches the EventSource, on its port only"
    database = {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gitea"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "postgresql"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 5432}],
    }
    assert database in inside, "netpol.giteaPeers: the database"
    assert not [r for r in policy["spec"].get("ingress", [])], (
        "no inbound rule: GitHub never pushes in"
    )


# ------------------------------------------------------------------------- lint apps

GOOD = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "Application",
    "metadata": {"name": "citation", "namespace": "argocd"},
    "spec": {
        "project": "default",
        "source": {
            "repoURL": "http://gitea-http.gitea.svc.cluster.local:3000/atlas/atlas.git",
            "path": "dataops/citation-dagster/deploy/overlays/prod",
            "kustomize": {
                "images": ["citation-dagster=registry:80/citation-dagster:abc@sha256:" + "1" * 64]
            },
        },
        "destination": {"server": "https://kubernetes.default.svc", "namespace": "dagster"},
    },
}


def _apps(tmp_path: Path, **docs: dict) -> Path:
    root = tmp_path / "apps"
    root.mkdir()
    for name, doc in docs.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return root


def test_lint_apps_passes_a_good_application(tmp_path: Path, specs: Path) -> None:
    result = run_cli("lint", "apps", str(_apps(tmp_path, citation=GOOD)), "--specs", str(specs))
    assert result.exit_code == 0, result.stderr


def test_lint_apps_catches_github_tags_and_typos(tmp_path: Path, specs: Path) -> None:
    import copy

    github = copy.deepcopy(GOOD)
    github["spec"]["source"]["repoURL"] = "https://github.com/example/atlas.git"
    tagged = copy.deepcopy(GOOD)
    tagged["spec"]["source"]["kustomize"]["images"] = [
        "citation-dagster=registry:80/citation-dagster:latest"
    ]
    typo = copy.deepcopy(GOOD)
    typo["spec"]["destinaton"] = typo["spec"].pop("destination")
    result = run_cli(
        "lint",
        "apps",
        str(_apps(tmp_path, github=github, tagged=tagged, typo=typo)),
        "--specs",
        str(specs),
    )
    assert result.exit_code == 6
    assert (
        "github.yaml: document 0 (Application/citation): spec.source.repoURL: 'https://github.com/example/atlas.git' is not the in-cluster Gitea"
        in result.stderr
    )
    assert (
        "tagged.yaml: document 0 (Application/citation): spec.source.kustomize.images[0]: 'citation-dagster=registry:80/citation-dagster:latest' is not pinned by @sha256:"
        in result.stderr
    )
    assert (
        "typo.yaml: document 0 (Application/citation): spec: Additional properties are not allowed ('destinaton' was unexpected)"
        in result.stderr
    )


def test_a_migrate_retried_after_its_clone_landed_checks_and_goes_on(
    values: Path, gitea: GiteaDouble
) -> None:
    """Gitea clones inside the migrate request: a try whose answer is lost (a timeout the
    server outlived) has made the mirror, and the retry meets 409. ensure reads the
    repository and goes on."""
    gitea.faults.append(("POST", "lost"))
    result = run_cli("--values", str(values), "mirror", "ensure", env=ENV)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "unchanged: mirrors/cluster"
    migrates = [r for r in gitea.requests if r.path == "/api/v1/repos/migrate"]
    assert len(migrates) == 2, "the lost answer, then the retry's 409"
    assert gitea.violations == []
