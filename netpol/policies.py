"""Rendering the NetworkPolicies (see the package docstring)."""

from __future__ import annotations

import ipaddress
from typing import Any

from fabrique.gestures import argocd_hook
from fabrique.site.allowlist import too_wide
from fabrique.site.config import (
    EGRESS_PEERS,
    AppConfig,
    Environment,
    PeerSelector,
    Site,
    allowlist_entry,
)
from fabrique.site.errors import RenderError
from fabrique.site.names import (
    EVENT_BUS,
    EVENT_SOURCE,
    LABEL_PART_OF,
    PLANNER_ROLE,
    SENSOR_ROLE,
    SENSOR_ROLE_LABEL,
    WEBHOOK_PORT,
)
from fabrique.site.objects import object_meta

STEP_LABEL = "fabrique.io/step"
NATS_CLIENT, NATS_CLUSTER, NATS_MONITOR = 4222, 6222, 8222
# the metrics port of Argo Events' EventSource and Sensor pods (SensorMetricsPort, const.go)
ARGO_EVENTS_METRICS = 7777
# every pod of a build (the build namespace runs nothing else)
FABRIQUE_PODS = {"matchLabels": {LABEL_PART_OF: "fabrique"}}
# the control namespace's Workflow pods: the safety net and the mirror sync
RECONCILER_POD = {"matchLabels": {"fabrique.io/role": "reconciler"}}
PLANNER_POD = {"matchLabels": {"fabrique.io/role": PLANNER_ROLE}}
VERIFIER_POD = {"matchLabels": {"fabrique.io/role": "verifier"}}
MIRROR_SYNC_POD = {"matchLabels": {"fabrique.io/role": "mirror-sync"}}
BUILD_POD = {"matchLabels": {STEP_LABEL: "build"}}
EVENTSOURCE_POD = {"matchLabels": {"eventsource-name": EVENT_SOURCE}}
# every Sensor of the site (render splits a large one): the label their template sets
SENSOR_POD = {"matchLabels": {SENSOR_ROLE_LABEL: SENSOR_ROLE}}
EVENTBUS_POD = {"matchLabels": {"eventbus-name": EVENT_BUS}}
# every pod of every namespace, whatever its port: inside the cluster, never outside
IN_THE_CLUSTER: dict[str, Any] = {"to": [{"namespaceSelector": {}}]}


def _ns_selector(namespace: str) -> dict[str, Any]:
    return {"matchLabels": {"kubernetes.io/metadata.name": namespace}}


def _peers(selector: PeerSelector) -> list[dict[str, Any]]:
    """The rule's peers: the selected pods, or the addresses of what is not a pod."""
    if selector.cidrs is not None:
        return [{"ipBlock": {"cidr": cidr}} for cidr in selector.cidrs]
    assert selector.namespace is not None and selector.pod_labels is not None
    return [
        {
            "namespaceSelector": _ns_selector(selector.namespace),
            "podSelector": {"matchLabels": dict(selector.pod_labels)},
        }
    ]


def _peer(selector: PeerSelector) -> dict[str, Any]:
    return {"to": _peers(selector), "ports": [{"protocol": "TCP", "port": selector.port}]}


def _dns(site: Site) -> dict[str, Any]:
    dns = site.netpol.dns
    return {
        "to": _peers(dns),
        "ports": [{"protocol": "UDP", "port": dns.port}, {"protocol": "TCP", "port": dns.port}],
    }


def _api(site: Site) -> dict[str, Any]:
    return {
        "to": [{"ipBlock": {"cidr": cidr}} for cidr in site.netpol.api_server_cidrs],
        "ports": [{"protocol": "TCP", "port": port} for port in site.netpol.api_server_ports],
    }


def _policy(
    name: str,
    namespace: str,
    selector: dict[str, Any],
    *,
    ingress: list[Any] | None = None,
    egress: list[Any] | None = None,
) -> dict[str, Any]:
    # An empty rule list denies all: the policy type alone says so. The API server stores
    # no empty list (omitempty), so writing one would differ from what it holds and make
    # every server-side apply a change (a new generation) where nothing changed.
    spec: dict[str, Any] = {"podSelector": selector, "policyTypes": []}
    if ingress is not None:
        spec["policyTypes"].append("Ingress")
        if ingress:
            spec["ingress"] = ingress
    if egress is not None:
        spec["policyTypes"].append("Egress")
        if egress:
            spec["egress"] = egress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(name, namespace),
        "spec": spec,
    }


def _default_deny(namespace: str) -> dict[str, Any]:
    return _policy("default-deny", namespace, {}, ingress=[], egress=[])


def build_namespace(site: Site) -> list[dict[str, Any]]:
    ns = site.namespaces.build
    docs = [
        _default_deny(ns),
        _policy(
            "fabrique-pods-egress",
            ns,
            FABRIQUE_PODS,
            egress=[_dns(site), _peer(site.netpol.gitea), _peer(site.netpol.registry), _api(site)],
        ),
    ]
    if site.netpol.flavor == "kubernetes" and site.netpol.egress_cidrs:
        docs.append(
            _policy(
                "build-internet-egress",
                ns,
                BUILD_POD,
                egress=[
                    {
                        "to": [{"ipBlock": {"cidr": cidr}} for cidr in site.netpol.egress_cidrs],
                        "ports": [{"protocol": "TCP", "port": 443}],
                    }
                ],
            )
        )
    if site.netpol.flavor == "cilium" and site.netpol.egress_fqdns:
        docs.append(cilium_build_egress(site))
    return docs


def cilium_build_egress(site: Site) -> dict[str, Any]:
    """The build's 443 allowlist by host name."""
    return _cilium_fqdn_egress(
        site, "build-internet-egress", site.namespaces.build, BUILD_POD, site.netpol.egress_fqdns
    )


def _cilium_fqdn_egress(
    site: Site, name: str, namespace: str, selector: dict[str, Any], fqdns: list[str]
) -> dict[str, Any]:
    """TCP 443 to ``fqdns`` by host name. Cilium learns the names' addresses through its
    DNS proxy, hence the DNS rule with an L7 ``dns`` match."""
    dns = site.netpol.dns
    assert dns.namespace is not None and dns.pod_labels is not None  # the site refuses cidrs
    dns_endpoint = {
        "matchLabels": {
            "k8s:io.kubernetes.pod.namespace": dns.namespace,
            **{f"k8s:{k}": v for k, v in dns.pod_labels.items()},
        }
    }
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": object_meta(name, namespace),
        "spec": {
            "endpointSelector": selector,
            "egress": [
                {
                    "toEndpoints": [dns_endpoint],
                    "toPorts": [
                        {
                            "ports": [{"port": str(dns.port), "protocol": "ANY"}],
                            "rules": {"dns": [{"matchPattern": "*"}]},
                        }
                    ],
                },
                {
                    "toFQDNs": [
                        {"matchPattern": name} if name.startswith("*") else {"matchName": name}
                        for name in fqdns
                    ],
                    "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}],
                },
            ],
        },
    }


def control_namespace(site: Site) -> list[dict[str, Any]]:
    ns = site.namespaces.control
    same_ns = {"namespaceSelector": _ns_selector(ns)}
    to_bus = {
        "to": [{"podSelector": EVENTBUS_POD}],
        "ports": [{"protocol": "TCP", "port": NATS_CLIENT}],
    }
    scrapes = (
        [
            {
                "from": [
                    {
                        "namespaceSelector": _ns_selector(scraper.namespace),
                        "podSelector": {"matchLabels": dict(scraper.pod_labels)},
                    }
                    for scraper in site.netpol.metrics_scrapers
                ],
                "ports": [{"protocol": "TCP", "port": ARGO_EVENTS_METRICS}],
            }
        ]
        if site.netpol.metrics_scrapers
        else []
    )
    return [
        _default_deny(ns),
        _policy(
            "eventsource",
            ns,
            EVENTSOURCE_POD,
            ingress=[
                # Gitea's pods, or its addresses when it is no pod (a selector matches
                # pods only: a Gitea outside the cluster would have every delivery dropped)
                {
                    "from": _peers(site.netpol.gitea),
                    "ports": [{"protocol": "TCP", "port": WEBHOOK_PORT}],
                },
                *scrapes,
            ],
            egress=[_dns(site), to_bus],
        ),
        _policy("sensor", ns, SENSOR_POD, ingress=scrapes, egress=[_dns(site), to_bus, _api(site)]),
        # the safety net reads Gitea and the registry and creates Workflows through the
        # API (its executor reports there too); no ingress
        _policy(
            "reconciler",
            ns,
            RECONCILER_POD,
            ingress=[],
            egress=[_dns(site), _peer(site.netpol.gitea), _peer(site.netpol.registry), _api(site)],
        ),
        # a push's plan lists its commits in Gitea and creates builds through the API; its
        # write-back (writeback.batch) writes to Gitea, and checks signatures in the
        # registry where the site signs
        _policy(
            "planner",
            ns,
            PLANNER_POD,
            ingress=[],
            egress=[
                _dns(site),
                _peer(site.netpol.gitea),
                *(
                    [_peer(site.netpol.registry)]
                    if site.signing.enabled and site.writeback.batch.enabled
                    else []
                ),
                _api(site),
            ],
        ),
        # a promotion's look (fabrique-verify) reads Gitea, the registry (a rollback
        # checks the image) and the API, as the reconciler does; no ingress
        *(
            [
                _policy(
                    "verifier",
                    ns,
                    VERIFIER_POD,
                    ingress=[],
                    egress=[
                        _dns(site),
                        _peer(site.netpol.gitea),
                        _peer(site.netpol.registry),
                        _api(site),
                    ],
                )
            ]
            if site.looked_by_workflow()
            else []
        ),
        # the mirror sync only calls Gitea's API (and its executor reports to the API)
        _policy(
            "mirror-sync",
            ns,
            MIRROR_SYNC_POD,
            ingress=[],
            egress=[_dns(site), _peer(site.netpol.gitea), _api(site)],
        ),
        _policy(
            "eventbus",
            ns,
            EVENTBUS_POD,
            ingress=[
                {
                    "from": [{"podSelector": EVENTSOURCE_POD}, {"podSelector": SENSOR_POD}],
                    "ports": [{"protocol": "TCP", "port": NATS_CLIENT}],
                },
                {
                    "from": [{"podSelector": EVENTBUS_POD}],
                    "ports": [
                        {"protocol": "TCP", "port": p}
                        for p in (NATS_CLIENT, NATS_CLUSTER, NATS_MONITOR)
                    ],
                },
            ],
            egress=[
                _dns(site),
                {
                    "to": [{"podSelector": EVENTBUS_POD, **same_ns}],
                    "ports": [{"protocol": "TCP", "port": p} for p in (NATS_CLIENT, NATS_CLUSTER)],
                },
            ],
        ),
    ]


def check_no_wide_nets(
    documents: list[dict[str, Any]], where: str, *, widest_ipv4: int = 8, widest_ipv6: int = 32
) -> None:
    """RenderError if any rule would let traffic out to, or in from, anywhere: a /0, or
    CIDRs that together open a block wider than the bounds (``netpol.widestPrefix``)."""
    for doc in documents:
        name = f"{where}: {doc['kind']}/{doc['metadata']['name']}"
        spec = doc["spec"]
        for direction, peers_key in (("egress", "to"), ("ingress", "from")):
            for index, rule in enumerate(spec.get(direction) or []):
                field = f"spec.{direction}[{index}]"
                if doc["kind"] == "NetworkPolicy" and not rule.get(peers_key):
                    raise RenderError(
                        f"{name}: {field}.{peers_key} is empty, which allows every peer"
                    )
                for peer_index, peer in enumerate(rule.get(peers_key) or []):
                    at = f"{name}: {field}.{peers_key}[{peer_index}]"
                    if not peer:
                        raise RenderError(f"{at} is empty, which allows every peer")
                    cidr = (peer.get("ipBlock") or {}).get("cidr")
                    if cidr is not None and ipaddress.ip_network(cidr, strict=False).prefixlen == 0:
                        raise RenderError(f"{at}.ipBlock.cidr is {cidr}, a wide net")
                blocks = [
                    (peer_index, peer["ipBlock"]["cidr"])
                    for peer_index, peer in enumerate(rule.get(peers_key) or [])
                    if "cidr" in (peer.get("ipBlock") or {})
                ]
                wide = too_wide([cidr for _, cidr in blocks], widest_ipv4, widest_ipv6)
                if wide:
                    blamed, why = wide
                    at = f"{field}.{peers_key}"
                    at += "" if blamed is None else f"[{blocks[blamed][0]}].ipBlock.cidr"
                    raise RenderError(f"{name}: {at}: {why}, a wide net")
                for key in ("toCIDR", "toCIDRSet", "toEntities"):
                    if key in rule:
                        raise RenderError(
                            f"{name}: {field}.{key} is not allowed: list host names (toFQDNs)"
                        )


def gitea_namespace(site: Site) -> list[dict[str, Any]]:
    """The Gitea pods pull the mirrors: TCP 443 to GitHub's CIDRs is their only Internet.

    Inside the cluster they reach DNS, their own dependencies (``netpol.giteaPeers``: the
    database, a cache), for webhook #2 the EventSource's pods on its port, and for the
    hooks to Argo CD (``fabrique seed``) the ``argocd-server`` pods of each Argo CD's
    namespace on theirs: nothing else. Argo CD's fetches are ingress to Gitea and are not
    limited here."""
    ns = site.namespaces.gitea
    pods = {"matchLabels": dict(site.mirror_sync.gitea_pod_labels)}
    webhook = {
        "to": [
            {
                "namespaceSelector": _ns_selector(site.namespaces.control),
                "podSelector": EVENTSOURCE_POD,
            }
        ],
        "ports": [{"protocol": "TCP", "port": WEBHOOK_PORT}],
    }
    argo_cd = {
        "to": [
            {"namespaceSelector": _ns_selector(namespace), "podSelector": argocd_hook.SERVER_POD}
            for namespace in argocd_hook.argo_cd_namespaces(site)
        ],
        "ports": [{"protocol": "TCP", "port": argocd_hook.SERVER_PORT}],
    }
    return [
        _policy(
            "gitea-egress",
            ns,
            pods,
            egress=[
                _dns(site),
                webhook,
                argo_cd,
                *(_peer(peer) for peer in site.netpol.gitea_peers),
                {
                    "to": [{"ipBlock": {"cidr": c}} for c in site.mirror_sync.github_cidrs],
                    "ports": [{"protocol": "TCP", "port": 443}],
                },
            ],
        )
    ]


def _named_peer(site: Site, name: str) -> dict[str, Any]:
    """The rule of a peer an app names in ``apps[].egress`` (``EGRESS_PEERS``)."""
    if name == "apiServer":
        return _api(site)
    return _peer(site.netpol.gitea if name == "gitea" else site.netpol.registry)


def app_egress(site: Site, app: AppConfig, namespace: str) -> list[dict[str, Any]]:
    """What every pod of ``namespace``, where ``app`` runs, may reach: pods of any
    namespace, DNS, and what the app names in ``apps[].egress``; nothing else. Its pods
    reach a Service through its endpoints (a policy sees them after kube-proxy's DNAT):
    one whose endpoints are pods is in the cluster; the ``kubernetes`` Service's is the
    API server, reached only when the app names ``apiServer``. Ingress stays the app's."""
    listed = [allowlist_entry(n) for n in app.egress if n not in EGRESS_PEERS]
    rules = [IN_THE_CLUSTER, _dns(site)]
    if listed and site.netpol.flavor == "kubernetes":
        rules.append(
            {
                "to": [{"ipBlock": {"cidr": cidr}} for cidr in listed],
                "ports": [{"protocol": "TCP", "port": 443}],
            }
        )
    rules += [_named_peer(site, name) for name in app.egress if name in EGRESS_PEERS]
    docs = [_policy(f"{app.name}-egress", namespace, {}, egress=rules)]
    if listed and site.netpol.flavor == "cilium":
        docs.append(_cilium_fqdn_egress(site, f"{app.name}-internet-egress", namespace, {}, listed))
    return docs


def argo_cd_egress(site: Site, namespace: str) -> dict[str, Any]:
    """What every pod of Argo CD's ``namespace`` may reach: pods of any namespace, DNS,
    the Gitea it reads and the API server it deploys through; nothing outside."""
    egress = [IN_THE_CLUSTER, _dns(site), _peer(site.netpol.gitea), _api(site)]
    return _policy("argo-cd-egress", namespace, {}, egress=egress)


def deploy_namespaces(site: Site) -> dict[str, list[dict[str, Any]]]:
    """Argo CD's namespaces and the apps', those of the Applications ``fabrique seed``
    writes (``AppConfig.deployment``): the deployment and the runtime stay in the cluster."""
    own = {site.namespaces.control, site.namespaces.build, site.namespaces.gitea}
    argo_cd: dict[str, None] = {}
    apps: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for app in site.apps:
        envs: list[Environment | None] = [*app.environments] or [None]
        for env in envs:
            deployment = app.deployment(env)
            if deployment is None:
                continue
            for namespace in (deployment.namespace, deployment.destination):
                if namespace in own:
                    # its policy would open fabrique's pods to every pod of the cluster
                    raise RenderError(
                        f"app {app.name}: deploys through or into {namespace}, one of "
                        "fabrique's namespaces (namespaces.*): deploy it elsewhere"
                    )
            argo_cd[deployment.namespace] = None
            if (app.name, deployment.destination) not in seen:
                seen.add((app.name, deployment.destination))
                apps += app_egress(site, app, deployment.destination)
    tree = {}
    if argo_cd:
        tree["netpol/argo-cd-namespace.yaml"] = [argo_cd_egress(site, ns) for ns in argo_cd]
    if apps:
        tree["netpol/app-namespaces.yaml"] = apps
    return tree


def policies(site: Site) -> dict[str, list[dict[str, Any]]]:
    tree = {
        "netpol/build-namespace.yaml": build_namespace(site),
        "netpol/control-namespace.yaml": control_namespace(site),
        "netpol/gitea-namespace.yaml": gitea_namespace(site),
        **deploy_namespaces(site),
    }
    bound = site.netpol.widest_prefix
    for path, documents in tree.items():
        check_no_wide_nets(documents, path, widest_ipv4=bound.ipv4, widest_ipv6=bound.ipv6)
    return tree
