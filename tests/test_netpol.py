"""Air-gap by construction: the rendered NetworkPolicies, and wide nets refused."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from fabrique.render import render_tree, write_tree
from fabrique.site.config import load_site
from fabrique.site.errors import ConfigError, RenderError
from fabrique.validate import validate_tree
from netpol.policies import check_no_wide_nets

from .conftest import ROOT, run_cli, write_values
from .manifests import documents, find, walk

TREE = ROOT / "manifests"


def _render_refused(tmp_path: Path, overrides: dict[str, Any]) -> str:
    """``render`` of the defaults with ``overrides``: refused as a config error (exit 2),
    writing nothing; its stderr."""
    values = write_values(tmp_path / "site.yaml", **overrides)
    out = tmp_path / "m"
    result = run_cli("--values", str(values), "render", "--out", str(out))
    assert result.exit_code == 2
    assert not out.exists()
    return result.stderr


def _policies(root: Path) -> list[dict[str, Any]]:
    return [d for d in documents(root) if d["kind"] in ("NetworkPolicy", "CiliumNetworkPolicy")]


def test_no_wide_net_anywhere_in_the_tree() -> None:
    for doc in documents(TREE):
        for path, key, value in walk(doc):
            if key in ("cidr", "toCIDR") and isinstance(value, str):
                assert ipaddress.ip_network(value, strict=False).prefixlen > 0, path
    for policy in _policies(TREE):
        for direction, peers in (("egress", "to"), ("ingress", "from")):
            for rule in policy["spec"].get(direction) or []:
                assert rule.get(peers), (
                    f"{policy['metadata']['name']}: an empty {peers} allows everything"
                )
                assert all(rule[peers]), (
                    f"{policy['metadata']['name']}: an empty peer allows everything"
                )


@pytest.mark.parametrize("namespace", ["fabrique", "fabrique-build"])
def test_default_deny_in_each_namespace(namespace: str) -> None:
    deny = next(
        p
        for p in _policies(TREE)
        if p["metadata"]["namespace"] == namespace and p["metadata"]["name"] == "default-deny"
    )
    # both types and no rule: all denied (an empty list is not written: the API server
    # stores none, and a written one would make every apply a change)
    assert deny["spec"] == {
        "podSelector": {},
        "policyTypes": ["Ingress", "Egress"],
    }


def test_only_the_build_pod_may_leave_on_443_to_exactly_the_allowlist(tmp_path: Path) -> None:
    allowlist = ["151.101.0.223/32", "199.232.0.0/16"]
    values = write_values(tmp_path / "site.yaml", **{"netpol.egressCidrs": allowlist})
    out = tmp_path / "m"
    assert run_cli("--values", str(values), "render", "--out", str(out)).exit_code == 0
    egress = find(out, "NetworkPolicy", "build-internet-egress")
    assert egress["spec"]["podSelector"] == {"matchLabels": {"fabrique.io/step": "build"}}
    assert egress["spec"]["egress"] == [
        {
            "to": [{"ipBlock": {"cidr": c}} for c in allowlist],
            "ports": [{"protocol": "TCP", "port": 443}],
        }
    ]
    # the label that opens the door is on the build's pod only, not its exit handler's
    template = find(out, "WorkflowTemplate", "fabrique-build")
    stepped = [
        t["name"]
        for t in template["spec"]["templates"]
        if "fabrique.io/step" in (t.get("metadata") or {}).get("labels", {})
    ]
    assert stepped == ["run"]
    # every other rule of the build namespace stays inside the cluster or on the API
    others = find(out, "NetworkPolicy", "fabrique-pods-egress")["spec"]["egress"]
    ports = sorted({p["port"] for rule in others for p in rule["ports"]})
    assert ports == [53, 80, 443, 3000, 6443]
    api_rule = next(r for r in others if "ipBlock" in r["to"][0])
    assert api_rule["to"] == [{"ipBlock": {"cidr": "192.0.2.1/32"}}], "only the API endpoint"


def test_without_an_allowlist_the_build_gets_no_internet() -> None:
    names = [p["metadata"]["name"] for p in _policies(TREE)]
    assert "build-internet-egress" not in names


def test_event_source_accepts_only_gitea() -> None:
    """Gitea's pods, as ``netpol.gitea`` names them: not every pod of its namespace."""
    policy = find(TREE, "NetworkPolicy", "eventsource")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"eventsource-name": "gitea"}}
    assert policy["spec"]["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gitea"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "gitea"}},
                }
            ],
            "ports": [{"protocol": "TCP", "port": 12000}],
        }
    ]


def test_a_gitea_outside_the_cluster_reaches_the_event_source_by_its_addresses(
    tmp_path: Path, specs: Path
) -> None:
    """A site whose Gitea is no pod (``netpol.gitea.cidrs``) gets its webhooks from those
    addresses: a namespace selector matches pods only, so every delivery was dropped."""
    gitea = {"cidrs": ["10.20.0.5/32"], "port": 3000}
    values = write_values(tmp_path / "site.yaml", **{"netpol.gitea": gitea})
    out = tmp_path / "m"
    assert run_cli("--values", str(values), "render", "--out", str(out)).exit_code == 0
    assert find(out, "NetworkPolicy", "eventsource")["spec"]["ingress"] == [
        {
            "from": [{"ipBlock": {"cidr": "10.20.0.5/32"}}],
            "ports": [{"protocol": "TCP", "port": 12000}],
        }
    ]
    assert validate_tree(out, specs) == []


def test_sensor_reaches_only_dns_the_bus_and_the_api() -> None:
    policy = find(TREE, "NetworkPolicy", "sensor")
    assert "Ingress" in policy["spec"]["policyTypes"] and "ingress" not in policy["spec"]
    targets = [rule["to"][0] for rule in policy["spec"]["egress"]]
    assert targets[0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert targets[1] == {"podSelector": {"matchLabels": {"eventbus-name": "default"}}}
    assert targets[2] == {"ipBlock": {"cidr": "192.0.2.1/32"}}


def test_the_sites_scrapers_alone_reach_the_event_pods_metrics(tmp_path: Path, specs: Path) -> None:
    """What the Sensor drops is counted on its metrics port (7777): the scrapers the site
    names reach it there, on the Sensor and the EventSource, and nothing else does."""
    scraper = {"namespace": "monitoring", "podLabels": {"app.kubernetes.io/name": "prometheus"}}
    values = write_values(tmp_path / "site.yaml", **{"netpol.metricsScrapers": [scraper]})
    out = tmp_path / "m"
    assert run_cli("--values", str(values), "render", "--out", str(out)).exit_code == 0
    scrape = {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 7777}],
    }
    assert find(out, "NetworkPolicy", "sensor")["spec"]["ingress"] == [scrape]
    assert find(out, "NetworkPolicy", "eventsource")["spec"]["ingress"][1:] == [scrape]
    assert validate_tree(out, specs) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("netpol.egressCidrs", ["10.0.0.0/8", "0.0.0.0/0"]),
        ("netpol.egressCidrs", ["::/0"]),
        ("netpol.apiServerCidrs", ["0.0.0.0/0"]),
    ],
)
def test_a_wide_net_in_the_values_file_is_refused(
    tmp_path: Path, field: str, value: list[str]
) -> None:
    stderr = _render_refused(tmp_path, {field: value})
    assert "must not be a /0: no wide nets" in stderr
    assert f"{field.split('.')[1]}[" in stderr


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        (
            "netpol.egressCidrs",
            ["0.0.0.0/1", "128.0.0.0/1"],
            "netpol.egressCidrs[0]: 0.0.0.0/1 is wider than /8",
        ),
        ("netpol.egressCidrs", ["::/1", "8000::/1"], "netpol.egressCidrs[0]: ::/1 is wider"),
        (
            "netpol.egressCidrs",
            ["::ffff:0.0.0.0/96"],
            "netpol.egressCidrs[0]: ::ffff:0:0/96 reaches 0.0.0.0/0, wider than /8",
        ),
        (
            "netpol.egressCidrs",
            ["64:ff9b::/96"],
            "netpol.egressCidrs[0]: 64:ff9b::/96 reaches 0.0.0.0/0, wider than /8",
        ),
        (
            "netpol.egressCidrs",
            ["10.0.0.0/8", "11.0.0.0/8"],
            "netpol.egressCidrs: the entries together open 10.0.0.0/7, wider than /8",
        ),
        ("netpol.apiServerCidrs", ["10.0.0.0/7"], "netpol.apiServerCidrs[0]: 10.0.0.0/7 is"),
        ("mirrorSync.githubCidrs", ["2001:db8::/31"], "mirrorSync.githubCidrs[0]: 2001:db8::/31"),
    ],
)
def test_an_allowlist_wider_than_the_bound_is_refused(
    tmp_path: Path, field: str, value: list[str], expected: str
) -> None:
    stderr = _render_refused(tmp_path, {field: value})
    assert stderr.startswith(f"error: {expected}"), stderr


def test_the_bound_is_the_sites_and_whole_spaces_stay_refused(tmp_path: Path) -> None:
    wider = {"netpol.widestPrefix": {"ipv4": 1, "ipv6": 1}}
    site = load_site(
        write_values(tmp_path / "a.yaml", **wider, **{"netpol.egressCidrs": ["10.0.0.0/7"]}),
        env={},
    )
    assert site.netpol.egress_cidrs == ["10.0.0.0/7"]
    covering = {"netpol.egressCidrs": ["0.0.0.0/1", "128.0.0.0/1"]}
    with pytest.raises(ConfigError, match=r"together cover the whole IPv4 space \(0\.0\.0\.0/0\)"):
        load_site(write_values(tmp_path / "b.yaml", **wider, **covering), env={})


def test_the_render_guard_refuses_cidrs_that_add_up_to_a_wide_net() -> None:
    halves = [{"ipBlock": {"cidr": "0.0.0.0/1"}}, {"ipBlock": {"cidr": "128.0.0.0/1"}}]
    policy = {
        "kind": "NetworkPolicy",
        "metadata": {"name": "x"},
        "spec": {"egress": [{"to": halves}]},
    }
    with pytest.raises(RenderError, match=r"egress\[0\]\.to: the entries together cover the whole"):
        check_no_wide_nets([policy], "netpol/x.yaml", widest_ipv4=1)
    with pytest.raises(
        RenderError, match=r"egress\[0\]\.to\[0\]\.ipBlock\.cidr: 0\.0\.0\.0/1 is wider"
    ):
        check_no_wide_nets([policy], "netpol/x.yaml")


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]},
            r"egress\[0\]\.to\[0\]\.ipBlock\.cidr is 0\.0\.0\.0/0, a wide net",
        ),
        ({"to": [{}]}, r"egress\[0\]\.to\[0\] is empty, which allows every peer"),
        ({"ports": [{"port": 443}]}, r"egress\[0\]\.to is empty, which allows every peer"),
    ],
)
def test_the_render_guard_refuses_what_config_could_not(
    rule: dict[str, Any], expected: str
) -> None:
    policy = {"kind": "NetworkPolicy", "metadata": {"name": "x"}, "spec": {"egress": [rule]}}
    with pytest.raises(RenderError, match=expected):
        check_no_wide_nets([policy], "netpol/x.yaml")


def test_cilium_flavor_lists_the_hosts_by_name(tmp_path: Path, specs: Path) -> None:
    site = load_site(env={"FABRIQUE_NETPOL__FLAVOR": "cilium"})
    out = tmp_path / "m"
    write_tree(render_tree(site), out)
    assert validate_tree(out, specs) == []
    policy = find(out, "CiliumNetworkPolicy", "build-internet-egress")
    fqdns = policy["spec"]["egress"][1]["toFQDNs"]
    assert [f["matchName"] for f in fqdns] == [
        "pypi.org",
        "files.pythonhosted.org",
        "huggingface.co",
        "cdn-lfs.huggingface.co",
        "cas-bridge.xethub.hf.co",
        "deb.debian.org",
        "extensions.duckdb.org",
    ]
    assert policy["spec"]["egress"][1]["toPorts"] == [
        {"ports": [{"port": "443", "protocol": "TCP"}]}
    ]
    assert "build-internet-egress" not in [
        p["metadata"]["name"] for p in _policies(out) if p["kind"] == "NetworkPolicy"
    ]


def test_cilium_policies_are_checked_for_their_required_fields(tmp_path: Path, specs: Path) -> None:
    import yaml

    site = load_site(env={"FABRIQUE_NETPOL__FLAVOR": "cilium"})
    out = tmp_path / "m"
    write_tree(render_tree(site), out)
    path = out / "netpol" / "build-namespace.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    cilium = next(d for d in docs if d["kind"] == "CiliumNetworkPolicy")
    del cilium["spec"]["endpointSelector"]
    cilium["spec"]["egress"][1]["toFQDN"] = cilium["spec"]["egress"][1].pop("toFQDNs")
    path.write_text(yaml.safe_dump_all(docs))
    problems = [str(p) for p in validate_tree(out, specs)]
    assert any("'endpointSelector' is a required property" in p for p in problems)
    assert any("'toFQDN' was unexpected" in p for p in problems)


def test_a_bad_host_name_is_refused() -> None:
    from fabrique.site.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^netpol\.egressFqdns\[0\]: must be a host name"):
        load_site(env={"FABRIQUE_NETPOL__EGRESS_FQDNS__0": "https://pypi.org"})


def test_a_peer_outside_the_pod_network_is_reached_by_its_addresses(
    tmp_path: Path, specs: Path
) -> None:
    """A selector matches pods only: a node-local DNS cache or a registry outside the
    cluster is reached by its addresses, the default's port kept unless given."""
    values = write_values(
        tmp_path / "site.yaml",
        **{
            "netpol.dns": {"cidrs": ["169.254.20.10/32"]},
            "netpol.registry": {"cidrs": ["10.9.0.0/16"], "port": 5000},
        },
    )
    out = tmp_path / "m"
    assert run_cli("--values", str(values), "render", "--out", str(out)).exit_code == 0
    for name in ("fabrique-pods-egress", "reconciler"):
        egress = find(out, "NetworkPolicy", name)["spec"]["egress"]
        assert egress[0] == {
            "to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }
        assert {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [
            {"protocol": "TCP", "port": 5000}
        ]} in egress  # fmt: skip
    # Gitea stays the default's pods
    gitea = find(out, "NetworkPolicy", "mirror-sync")["spec"]["egress"][1]
    assert gitea["to"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "gitea"}}
    assert validate_tree(out, specs) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {
                "netpol.registry": {
                    "namespace": "r",
                    "podLabels": {"a": "b"},
                    "cidrs": ["10.1.2.3/32"],
                }
            },
            "netpol.registry: give either namespace and podLabels, or cidrs, not both",
        ),
        (
            {"netpol.gitea": {"cidrs": ["0.0.0.0/0"]}},
            "netpol.gitea.cidrs[0]: must not be a /0: no wide nets",
        ),
        (
            {"netpol.registry": {"cidrs": ["10.0.0.0/7"]}},
            "netpol.registry.cidrs[0]: 10.0.0.0/7 is wider than /8",
        ),
        (
            {"netpol.flavor": "cilium", "netpol.dns": {"cidrs": ["169.254.20.10/32"]}},
            "netpol.dns.cidrs: flavor cilium learns the build's host names through its DNS proxy",
        ),
    ],
)
def test_a_peer_is_pods_or_addresses_never_both_nor_a_wide_net(
    tmp_path: Path, overrides: dict[str, Any], expected: str
) -> None:
    stderr = _render_refused(tmp_path, overrides)
    assert stderr.startswith(f"error: {expected}"), stderr


# -- the deployment and the runtime: Argo CD's namespace and the apps' -------------------


def _app(**fields: Any) -> dict[str, Any]:
    from fabrique.site.config import default_values

    return {**default_values()["apps"][0], **fields}


IN_THE_CLUSTER = {"to": [{"namespaceSelector": {}}]}
DNS_PODS = {
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}


def _in(root: Path, kind: str, name: str, namespace: str) -> dict[str, Any]:
    found = [
        d
        for d in documents(root)
        if d["kind"] == kind
        and d["metadata"]["name"] == name
        and d["metadata"].get("namespace") == namespace
    ]
    assert len(found) == 1, f"{kind} {namespace}/{name}: {len(found)} found"
    return found[0]


def test_the_apps_namespace_keeps_its_egress_inside_the_cluster() -> None:
    """Every pod of the namespace the app deploys into (``dagster``) may reach pods of
    any namespace (Services too: a policy sees their endpoints, after kube-proxy's DNAT)
    and DNS; nothing outside the cluster. Ingress stays the app's."""
    policy = _in(TREE, "NetworkPolicy", "citation-egress", "dagster")
    assert policy["spec"] == {
        "podSelector": {},
        "policyTypes": ["Egress"],
        "egress": [IN_THE_CLUSTER, DNS_PODS],
    }


def test_argo_cds_namespace_reaches_the_cluster_gitea_and_the_api_only() -> None:
    policy = _in(TREE, "NetworkPolicy", "argo-cd-egress", "argocd")
    assert policy["spec"] == {
        "podSelector": {},
        "policyTypes": ["Egress"],
        "egress": [
            IN_THE_CLUSTER,
            DNS_PODS,
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "gitea"}
                        },
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "gitea"}},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": 3000}],
            },
            {
                "to": [{"ipBlock": {"cidr": "192.0.2.1/32"}}],
                "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}],
            },
        ],
    }


def test_an_app_is_widened_by_the_names_of_what_the_site_lists(tmp_path: Path, specs: Path) -> None:
    """``apps[].egress`` names a peer of the site (``gitea``, ``registry``, ``apiServer``)
    or an entry of the build's allowlist (its CIDR): the app's namespace reaches that,
    on the peer's port or on 443 as the build does, and nothing else outside."""
    values = write_values(
        tmp_path / "site.yaml",
        **{
            "netpol.egressCidrs": ["203.0.113.0/24", "198.51.100.0/24"],
            "netpol.registry": {"cidrs": ["10.9.0.0/16"], "port": 5000},
            "apps": [_app(egress=["203.0.113.0/24", "registry", "apiServer"])],
        },
    )
    out = tmp_path / "m"
    assert run_cli("--values", str(values), "render", "--out", str(out)).exit_code == 0
    egress = _in(out, "NetworkPolicy", "citation-egress", "dagster")["spec"]["egress"]
    assert egress[2:] == [
        {
            "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        },
        {
            "to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}],
            "ports": [{"protocol": "TCP", "port": 5000}],
        },
        {
            "to": [{"ipBlock": {"cidr": "192.0.2.1/32"}}],
            "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}],
        },
    ]
    assert validate_tree(out, specs) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"apps": [_app(egress=["pypi.org"])]},
            "apps[0].egress[0]: 'pypi.org' names nothing the site lists: a peer "
            "(gitea, registry, apiServer) or an entry of netpol.egressCidrs (none)",
        ),
        (
            {"netpol.egressCidrs": ["203.0.113.0/24"], "apps": [_app(egress=["203.0.113.0/25"])]},
            "apps[0].egress[0]: '203.0.113.0/25' names nothing the site lists: a peer "
            "(gitea, registry, apiServer) or an entry of netpol.egressCidrs (203.0.113.0/24)",
        ),
        (
            {"netpol.flavor": "cilium", "apps": [_app(egress=["example.org"])]},
            "apps[0].egress[0]: 'example.org' names nothing the site lists: a peer "
            "(gitea, registry, apiServer) or an entry of netpol.egressFqdns (pypi.org, ",
        ),
    ],
)
def test_a_widening_names_only_what_the_site_lists(
    tmp_path: Path, overrides: dict[str, Any], expected: str
) -> None:
    stderr = _render_refused(tmp_path, overrides)
    assert stderr.startswith(f"error: {expected}"), stderr


def test_with_cilium_an_app_is_widened_by_host_name(tmp_path: Path, specs: Path) -> None:
    site = load_site(
        write_values(
            tmp_path / "site.yaml",
            **{"netpol.flavor": "cilium", "apps": [_app(egress=["huggingface.co"])]},
        ),
        env={},
    )
    out = tmp_path / "m"
    write_tree(render_tree(site), out)
    assert validate_tree(out, specs) == []
    policy = _in(out, "CiliumNetworkPolicy", "citation-internet-egress", "dagster")
    assert policy["spec"]["endpointSelector"] == {}
    assert policy["spec"]["egress"][1] == {
        "toFQDNs": [{"matchName": "huggingface.co"}],
        "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}],
    }
    # the namespace's own policy stays inside the cluster
    assert _in(out, "NetworkPolicy", "citation-egress", "dagster")["spec"]["egress"] == [
        IN_THE_CLUSTER,
        DNS_PODS,
    ]


def test_each_environment_and_its_argo_cd_get_their_policy(tmp_path: Path) -> None:
    """Where an app runs in each environment (its ``namespace``) and the namespace of
    the Argo CD that deploys it (its ``application``) each get theirs, once."""
    writeback = {
        "kind": "kustomize-images",
        "repo": "atlas/atlas",
        "path": "dataops/citation-dagster/deploy/overlays/prod2/kustomization.yaml",
    }
    environments = [
        {"name": "bench", "target": "prod", "namespace": "dagster-bench"},
        {
            "name": "prod",
            "target": "prod",
            "application": "gitops/citation-prod",
            "writeback": writeback,
        },
    ]
    values = write_values(tmp_path / "site.yaml", apps=[_app(environments=environments)])
    out = tmp_path / "m"
    assert run_cli("--values", str(values), "render", "--out", str(out)).exit_code == 0
    egress = {
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for d in _policies(out)
        if d["metadata"]["namespace"] not in ("fabrique", "fabrique-build", "gitea")
    }
    assert egress == {
        ("dagster-bench", "citation-egress"),
        ("dagster", "citation-egress"),
        ("argocd", "argo-cd-egress"),
        ("gitops", "argo-cd-egress"),
    }
