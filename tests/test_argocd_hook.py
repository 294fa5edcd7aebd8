"""Gitea's hooks to Argo CD (fabrique/gestures/argocd_hook.py): which repositories, where
they go, and the Gitea pods' egress that lets them through. Seed's step itself is tested
through the CLI in test_seed.py."""

from __future__ import annotations

from typing import Any

from fabrique.gestures.argocd_hook import argo_cd_namespaces, deployed_repos, webhook_urls
from fabrique.site.config import default_values, parse_site
from netpol.policies import policies


def _site(**changes: Any) -> Any:
    data = default_values()
    data.update(changes)
    return parse_site(data)


def _two_environments() -> list[dict[str, Any]]:
    app = default_values()["apps"][0]
    app["environments"] = [
        {"name": "bench", "target": "prod", "application": "argocd-bench/citation"},
        {
            "name": "prod",
            "target": "prod",
            "application": "argocd/citation-prod",
            "namespace": "dagster-prod",
            "writeback": {
                "repo": "cluster/cluster",
                "path": "deploy/citation/prod/kustomization.yaml",
                "branch": "release",
            },
        },
    ]
    return [app]


def test_every_repository_holding_a_target_and_the_apps_repository_with_their_branches() -> None:
    assert deployed_repos(_site()) == {"atlas/atlas": ["main"], "cluster/apps": ["main"]}
    assert deployed_repos(_site(apps=_two_environments())) == {
        "atlas/atlas": ["main"],
        "cluster/apps": ["main"],
        "cluster/cluster": ["release"],
    }


def test_the_hook_goes_to_the_server_of_each_argo_cd_unless_the_site_names_its_url() -> None:
    site = _site(apps=_two_environments())
    assert argo_cd_namespaces(site) == ["argocd", "argocd-bench"]
    assert webhook_urls(site, "prod", ["argocd", "argocd-bench"]) == [
        "http://argocd-server.argocd.svc.cluster.local/api/webhook",
        "http://argocd-server.argocd-bench.svc.cluster.local/api/webhook",
    ]
    named = _site(
        targets={"prod": {"context": "c", "argoCdWebhook": "https://cd.example/api/webhook"}}
    )
    assert webhook_urls(named, "prod", ["argocd"]) == ["https://cd.example/api/webhook"]


def test_gitea_pods_reach_argo_cd_s_server_pods_on_their_port_only() -> None:
    """Where fabrique renders the Gitea pods' egress, the hooks to Argo CD get through:
    to the argocd-server pods of each Argo CD's namespace, on 8080 (the policy sees the
    pod's port after the Service's 80), and nowhere else."""
    tree = policies(_site(apps=_two_environments()))
    (policy,) = [
        d for d in tree["netpol/gitea-namespace.yaml"] if d["metadata"]["name"] == "gitea-egress"
    ]
    rule = {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "argocd-server"}},
            }
            for ns in ("argocd", "argocd-bench")
        ],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }
    assert rule in policy["spec"]["egress"]
    # Argo CD's namespace gets no ingress policy of fabrique's: nothing to open there
    argo = tree["netpol/argo-cd-namespace.yaml"]
    assert all("Ingress" not in d["spec"]["policyTypes"] for d in argo)
