"""Argo CD told at once: Gitea's hooks from each repository holding a write-back target
to Argo CD's ``/api/webhook``, signed with a secret Argo CD checks.

Without them Argo CD learns of a write-back when it next polls (``timeout.reconciliation``,
180 s by default). With them, each push is delivered to Argo CD's server, which refreshes
every Application whose source is the pushed repository at the pushed branch, and the
controller syncs it. ``fabrique seed`` keeps them, for the cluster of its ``--target``:
one hook per repository where fabrique writes what Argo CD deploys (each that holds a
target of any app or environment, ``apps[].writeback``,
``apps[].environments[].writeback``, and the apps repository, where seed writes the
Applications), to
``targets.<name>.argoCdWebhook``, by default the Service ``argocd-server`` of the
namespace of the Applications it seeds (``argocd``): type ``gitea``, JSON, ``push`` events
on the targets' branches, the secret set, active.

What Argo CD v3.6.2 reads (``util/webhook``): a delivery carrying ``X-Gogs-Event``, which
Gitea sends beside its own headers, is taken by its Gogs parser, the one that fits Gitea's
payload; it checks ``X-Gogs-Signature`` (the same hex HMAC-SHA256 of the body as
``X-Gitea-Signature``) against the key ``webhook.gogs.secret`` of the Secret
``argocd-secret``. There is no ``webhook.gitea.secret``: a secret put there would be read
by nothing, and Argo CD would take any unsigned push. It then matches the payload's
``repository.html_url`` to each Application's ``repoURL`` by host and path (any scheme,
port, user and ``.git``), so Gitea's ``ROOT_URL`` must name the host Argo CD reads
(``gitea.url``), and the pushed branch to its ``targetRevision``. Argo CD's server reloads
its hook secrets when ``argocd-secret`` changes.

The secret is derived, never typed: an HMAC-SHA256 of a fixed label keyed by the
EventSource's bearer token (``FABRIQUE_WEBHOOK_TOKEN``, the Secret
``fabrique-webhook-token``), so one Secret of the site's tooling stays the root of both
hooks, and a new token gives a new secret on the next seed. It is written into
``argocd-secret`` (that key only, the rest of the Secret as it was) and into each hook,
whose name carries a salted fingerprint of it (``fabrique-argo-cd secret:scrypt:…``, as
webhook.py does for the bearer header: Gitea never shows a hook's secret); it is never
printed. A replay changes nothing. Seed writes nothing for Argo CD where ``argocd-secret``
is missing (Argo CD is not installed there): the step is ``missing``, and says so.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fabrique.clients.gitea import GiteaClient
from fabrique.clients.kube import KubeClient
from fabrique.site.config import AppConfig, Environment, Site
from fabrique.site.errors import InputError

from .webhook import Action, Credentials, fingerprint, keep_hook

HOOK_NAME = "fabrique-argo-cd"
ARGO_CD_SECRET = "argocd-secret"
# the key Argo CD's Gogs parser, which takes Gitea's deliveries, is checked with
SECRET_KEY = "webhook.gogs.secret"
# what the secret is derived from the bearer token for: another label, another secret
LABEL = b"fabrique: the secret of Gitea's hooks to Argo CD"
# Argo CD's server, as its install names it: the Service and its pods' container port
# (a NetworkPolicy sees the pod's port, after the Service's 80 -> 8080)
SERVER = "argocd-server"
SERVER_POD = {"matchLabels": {"app.kubernetes.io/name": SERVER}}
SERVER_PORT = 8080


def hook_secret(credentials: Credentials) -> str:
    """The secret Gitea signs each delivery to Argo CD with: derived from the bearer token."""
    return hmac.new(credentials.token.encode("utf-8"), LABEL, hashlib.sha256).hexdigest()


def deployed_repos(site: Site) -> dict[str, list[str]]:
    """Each repository where fabrique writes what Argo CD deploys, with the branches
    written there: those holding a write-back target of any app or environment, and the
    apps repository, where seed writes the Applications (an App of Apps deploys them)."""
    found: dict[str, list[str]] = {site.gitea.apps_repo: [site.gitea.branch]}
    for app in site.apps:
        for target in (app.writeback, *(env.writeback for env in app.environments)):
            if target is not None:
                branches = found.setdefault(target.repo, [])
                if site.branch_of(target) not in branches:
                    branches.append(site.branch_of(target))
    return dict(sorted(found.items()))


def argo_cd_namespace(app: AppConfig, env: Environment | None) -> str:
    """The namespace of the Argo CD that deploys ``app`` in ``env``: its Application's."""
    return env.application_ref(app.name)[0] if env else "argocd"


def app_argo_cd_namespaces(app: AppConfig, envs: Sequence[Environment]) -> list[str]:
    """The namespaces of the Argo CD that deploys ``app`` in ``envs`` (none: ``app``
    without environments)."""
    chosen: list[Environment | None] = [*envs] or [None]
    return sorted({argo_cd_namespace(app, env) for env in chosen})


def argo_cd_namespaces(site: Site) -> list[str]:
    """The namespace of every Argo CD the site's Applications are in."""
    return sorted({ns for app in site.apps for ns in app_argo_cd_namespaces(app, app.environments)})


def webhook_urls(site: Site, target: str, namespaces: list[str]) -> list[str]:
    """Where Gitea posts for the Argo CD of each of ``namespaces`` in cluster ``target``:
    the site's URL, else each one's server Service."""
    named = site.targets[target].argo_cd_webhook
    if named:
        return [named]
    return [f"http://{SERVER}.{ns}.svc.cluster.local/api/webhook" for ns in namespaces]


def desired(url: str, branches: list[str], secret: str) -> dict[str, Any]:
    """The CreateHookOption body of one hook to Argo CD, named with its secret's fingerprint."""
    return {
        "type": "gitea",
        "name": f"{HOOK_NAME} {fingerprint(secret, kind='secret')}",
        "config": {
            "url": url,
            "content_type": "json",
            "http_method": "post",
            "secret": secret,
        },
        "events": ["push"],
        # Gitea's filter is a glob: one branch as named, several as {a,b}
        "branch_filter": branches[0] if len(branches) == 1 else "{" + ",".join(branches) + "}",
        "active": True,
    }


@dataclass(frozen=True)
class Told:
    """What the step did: ``changed``, ``unchanged`` or ``missing`` (no Argo CD there),
    and its line's detail."""

    state: str
    detail: str


def _set_secret(kube: KubeClient, namespace: str, value: str, *, dry_run: bool) -> str:
    """``webhook.gogs.secret`` of ``argocd-secret`` made ``value``, its other keys kept:
    ``set`` or ``as derived``."""
    found = kube.get_secret(namespace, ARGO_CD_SECRET)
    if found is None:  # gone since it was seen
        raise InputError(f"Secret {namespace}/{ARGO_CD_SECRET}: not found; run seed again")
    data = dict(found.get("data") or {})
    encoded = base64.b64encode(value.encode("utf-8")).decode("ascii")
    if hmac.compare_digest(data.get(SECRET_KEY, ""), encoded):
        return "as derived"
    if not dry_run:
        # the Secret as read, resourceVersion and all: a change meanwhile is a 409
        body = {**found, "metadata": dict(found["metadata"]), "data": {**data, SECRET_KEY: encoded}}
        body["metadata"].pop("managedFields", None)
        kube.replace_secret(body)
    return "set"


def tell_argo_cd(
    site: Site,
    target: str,
    namespaces: list[str],
    *,
    gitea: GiteaClient,
    kube: KubeClient,
    credentials: Credentials,
    dry_run: bool,
) -> Told:
    """Argo CD's secret set in each of ``namespaces`` (of ``target``'s cluster), then
    the hooks to each one's URL from every repository of ``deployed_repos``."""
    for namespace in namespaces:
        if kube.get_secret(namespace, ARGO_CD_SECRET) is None:
            return Told(
                "missing",
                f"no Secret {namespace}/{ARGO_CD_SECRET}: Argo CD is not installed in "
                f"{namespace}, where the Applications are; nothing written for it, it "
                "learns of a push when it polls",
            )
    secret = hook_secret(credentials)
    parts: list[str] = []
    changed = False
    for namespace in namespaces:
        said = _set_secret(kube, namespace, secret, dry_run=dry_run)
        changed |= said == "set"
        parts.append(f"{namespace}/{ARGO_CD_SECRET} {SECRET_KEY} {said}")
    for url in webhook_urls(site, target, namespaces):
        for repo, branches in deployed_repos(site).items():
            want = desired(url, branches, secret)
            made = f"{url}, push on {want['branch_filter']}"
            actions: list[Action] = keep_hook(gitea, repo, want, made, dry_run=dry_run)
            changed |= any(a.verb != "unchanged" for a in actions)
            parts += [f"{repo} {a.line(False)}" for a in actions]
    return Told("changed" if changed else "unchanged", "; ".join(parts))
