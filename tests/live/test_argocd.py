"""Argo CD v3.6.2 (``argocd.py``) deploys what fabrique writes: the Application ``fabrique
seed`` writes syncs as written (the in-cluster destination, the private Gitea repository
read with the credentials a platform team registers, the namespace made), a new digest
committed to the overlay is rolled out on the next comparison, a root Application
deploys the Application files of the apps repository (app of apps), and Gitea's hook
that seed keeps tells argocd-server of a push, whose Application then syncs at once.

Argo CD runs against a control plane of its own, with kwok's pods, and the session's real
Gitea on loopback, which the repo server on the host reaches there.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from fabrique.clients.gitea import GiteaClient
from fabrique.gestures.argocd_hook import tell_argo_cd
from fabrique.gestures.seed import application_document
from fabrique.gestures.webhook import Credentials
from fabrique.site.config import Site, default_values, parse_site

from ..waits import until
from . import controlplane
from .argocd import ArgoCD, describe
from .cluster import Cluster
from .fixtures import need_go
from .gitea import USER, Gitea

# repositories of their own in the session's Gitea
CODE_REPO = "argocd-live/atlas"
APPS_REPO = "argocd-live/apps"
BASE = "dataops/citation-dagster/deploy/base"


@pytest.fixture(scope="module")
def argocd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArgoCD]:
    """A control plane of its own, and Argo CD for it."""
    need_go()
    folder = tmp_path_factory.mktemp("argocd")
    plane = controlplane.ControlPlane(folder / "plane")
    try:
        plane.start(controlplane.binaries())
        argo = ArgoCD(folder / "argocd", plane).start()
    except (controlplane.ControlPlaneError, controlplane.peers.PeerError) as failed:
        plane.stop()
        pytest.fail(str(failed), pytrace=False)
    try:
        yield argo
    finally:
        argo.stop()
        plane.stop()


def _site(
    gitea: Gitea, name: str = "citation", namespace: str = "dagster", hook: str | None = None
) -> Site:
    """The default site, its Gitea the real one and its repositories this module's; its
    app ``name`` deployed to ``namespace``; Argo CD's hook URL ``hook``."""
    data = default_values()
    data["gitea"].update(url=gitea.url, codeRepo=CODE_REPO, appsRepo=APPS_REPO)
    data["targets"]["prod"]["argoCdWebhook"] = hook
    app = data["apps"][0]
    app["name"] = name
    app["writeback"]["repo"] = CODE_REPO  # the overlay the Application reads, as by default
    app["application"].update(path=f"apps/{name}.yaml", namespace=namespace)
    return parse_site(data)


def _digest(seed: str) -> str:
    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()


def _kustomization(digest: str) -> str:
    """The overlay: the base, and the image by digest (the write-back's images entry)."""
    return yaml.safe_dump(
        {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["../../base"],
            "images": [{"name": "citation", "newName": "registry:80/citation", "digest": digest}],
        },
        sort_keys=False,
    )


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "citation"},
    "spec": {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "citation"}},
        "template": {
            "metadata": {"labels": {"app": "citation"}},
            "spec": {"containers": [{"name": "citation", "image": "citation"}]},
        },
    },
}


def _private(gitea: Gitea, slug: str) -> None:
    """``slug`` made (when missing) and private, as the site's repositories are."""
    gitea.repository(slug)
    with gitea.admin() as admin:
        admin.patch(f"/repos/{slug}", json={"private": True}).raise_for_status()


def _update(gitea: Gitea, slug: str, path: str, content: str, message: str) -> str:
    """One commit changing ``path`` on main, by the admin; its id."""
    with gitea.admin() as admin:
        current = admin.get(f"/repos/{slug}/contents/{path}", params={"ref": "main"})
        current.raise_for_status()
        made = admin.put(
            f"/repos/{slug}/contents/{path}",
            json={
                "branch": "main",
                "message": message,
                "sha": current.json()["sha"],
                "content": base64.b64encode(content.encode()).decode(),
            },
        )
        made.raise_for_status()
    return str(made.json()["commit"]["sha"])


@pytest.fixture(scope="module")
def code(real_gitea: Gitea) -> dict[str, str]:
    """The code repository, private, with the app's kustomize base and prod overlay; the
    overlay's path, its digest and the commit."""
    application = _site(real_gitea).apps[0].application
    assert application is not None
    overlay = application.source_path
    _private(real_gitea, CODE_REPO)
    digest = _digest("first build")
    commit = real_gitea.commit(
        CODE_REPO,
        "main",
        {
            f"{BASE}/deployment.yaml": yaml.safe_dump(DEPLOYMENT, sort_keys=False),
            f"{BASE}/kustomization.yaml": "resources:\n  - deployment.yaml\n",
            f"{overlay}/kustomization.yaml": _kustomization(digest),
        },
        "citation: its kustomize base and prod overlay",
    )
    return {"overlay": overlay, "digest": digest, "commit": commit}


def _head(gitea: Gitea, slug: str) -> str:
    """The commit at the head of main."""
    with gitea.admin() as admin:
        branch = admin.get(f"/repos/{slug}/branches/main")
        branch.raise_for_status()
    return str(branch.json()["commit"]["id"])


def _image(cluster: Cluster, namespace: str) -> str:
    deployment = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/citation")
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def _wait_condition(argocd: ArgoCD, name: str, text: str, timeout: float = 60) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def said() -> dict[str, Any] | None:
        app = last["app"] = argocd.application(name)
        conditions = ((app or {}).get("status") or {}).get("conditions") or []
        return app if any(text in str(c.get("message")) for c in conditions) else None

    return until(
        f"a condition of Application {name} saying {text!r}",
        said,
        timeout,
        every=0.5,
        detail=lambda: describe(last.get("app")),
    )


def test_the_seeds_application_syncs_as_written(
    argocd: ArgoCD, real_gitea: Gitea, code: dict[str, str]
) -> None:
    site = _site(real_gitea)
    app = site.apps[0]
    deployment = app.deployment()
    assert deployment is not None
    document = application_document(site, deployment)
    assert document["spec"]["source"]["repoURL"] == f"{real_gitea.url}/{CODE_REPO}.git"
    assert document["spec"]["destination"]["server"] == "https://kubernetes.default.svc"
    argocd.apply(document)
    # the repository is private: without credentials the repo server is refused
    _wait_condition(argocd, app.name, "authentication required")
    argocd.repository(document["spec"]["source"]["repoURL"], USER, real_gitea.token)
    argocd.refresh(app.name, hard=True)
    argocd.wait_synced(app.name, code["commit"])
    cluster = Cluster(argocd.plane)
    try:
        # CreateNamespace=true made the app's namespace
        assert cluster.exists("/api/v1/namespaces/dagster")
        assert _image(cluster, "dagster") == f"registry:80/citation@{code['digest']}"

        # the next build's digest, written to the overlay as the write-back writes it
        digest = _digest("second build")
        commit = _update(
            real_gitea,
            CODE_REPO,
            f"{code['overlay']}/kustomization.yaml",
            _kustomization(digest),
            "citation: the digest of the next build",
        )
        started = time.monotonic()
        argocd.refresh(app.name)  # what Gitea's push webhook to argocd-server asks for
        argocd.wait_synced(app.name, commit, timeout=60)
        print(f"rolled out {commit[:12]} in {time.monotonic() - started:.1f} s")
        assert _image(cluster, "dagster") == f"registry:80/citation@{digest}"
    finally:
        cluster.http.close()


@pytest.mark.usefixtures("code")
def test_a_root_application_deploys_the_apps_repository(argocd: ArgoCD, real_gitea: Gitea) -> None:
    # a second app of the same code, deployed elsewhere, so as not to meet the first
    site = _site(real_gitea, name="citation-apps", namespace="dagster-apps")
    app = site.apps[0]
    assert app.application is not None
    _private(real_gitea, APPS_REPO)
    # the file seed writes into the apps repository (Seeder.application's text)
    text = "# Written by `fabrique seed`: Argo CD deploys this app from Gitea.\n"
    deployment = app.deployment()
    assert deployment is not None
    text += yaml.safe_dump(application_document(site, deployment), sort_keys=False)
    apps_commit = real_gitea.commit(
        APPS_REPO, "main", {app.application.path: text}, "fabrique: Argo CD Application"
    )
    # Gitea's own URL: a template for every repository there
    argocd.repository(real_gitea.url, USER, real_gitea.token)
    argocd.root_application(site.gitea.repo_url(APPS_REPO), site.gitea.branch, "apps")
    argocd.wait_synced("root", apps_commit)
    argocd.wait_synced(app.name, _head(real_gitea, CODE_REPO))
    cluster = Cluster(argocd.plane)
    try:
        assert _image(cluster, "dagster-apps").startswith("registry:80/citation@sha256:")
        made = cluster.get(f"/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/{app.name}")
        # the root tracks the Application it made (v3's default tracking: an annotation)
        tracking = made["metadata"].get("annotations", {}).get("argocd.argoproj.io/tracking-id")
        assert str(tracking).startswith("root:argoproj.io/Application:argocd/"), tracking
    finally:
        cluster.http.close()


@pytest.mark.usefixtures("code")
def test_gitea_s_hook_tells_argo_cd_of_a_push_and_the_sync_starts_without_a_refresh(
    argocd: ArgoCD, real_gitea: Gitea
) -> None:
    """Seed's step makes Gitea's hook to argocd-server's /api/webhook and the secret it
    signs with in argocd-secret; a push to the target's repository is then delivered,
    verified, and the Application refreshed by Argo CD's server: nobody writes a refresh
    annotation, and the controller polls only every 180 s (its default), past the wait."""
    site = _site(real_gitea, "citation-told", "dagster-told", hook=argocd.webhook_url)
    _private(real_gitea, APPS_REPO)  # the hooks go from it too
    app = site.apps[0]
    deployment = app.deployment()
    assert deployment is not None
    argocd.repository(real_gitea.url, USER, real_gitea.token)
    argocd.apply(application_document(site, deployment))
    argocd.wait_synced(app.name, _head(real_gitea, CODE_REPO))

    cluster = Cluster(argocd.plane)
    try:
        with GiteaClient.for_site(site, real_gitea.token) as gitea:
            told = tell_argo_cd(
                site, "prod", ["argocd"], gitea=gitea, kube=cluster.kube(),
                credentials=Credentials("bearer-live-a9c4"), dry_run=False,
            )  # fmt: skip
            assert told.state == "changed", told.detail
            again = tell_argo_cd(
                site, "prod", ["argocd"], gitea=gitea, kube=cluster.kube(),
                credentials=Credentials("bearer-live-a9c4"), dry_run=True,
            )  # fmt: skip
            assert again.state == "unchanged", again.detail
        assert "bearer-live-a9c4" not in told.detail + again.detail
        # argocd-server restarts its handlers on a new secret (watchSettings): pushed
        # before, the delivery would meet a server between two lives
        log = argocd.folder / "server.log"

        def restarted() -> bool:
            said = log.read_text(errors="replace")
            at = said.find("gogs secret modified")
            return at >= 0 and "serving on port" in said[at:] and argocd.answers("server")

        until("argocd-server to serve again with the new Gogs secret", restarted, 30, every=0.2)
        # the secret is checked: a push unsigned, or signed with another, is refused
        for signature in ({}, {"X-Gogs-Signature": "0" * 64}):
            forged = httpx.post(
                argocd.webhook_url,
                content=b"{}",
                headers={"X-Gogs-Event": "push", "Content-Type": "application/json", **signature},
            )
            assert forged.status_code == 400, (forged.status_code, forged.text)
        assert "Gogs webhook HMAC verification failed" in log.read_text()

        commit = _update(
            real_gitea,
            CODE_REPO,
            f"{deployment.source_path}/kustomization.yaml",
            _kustomization(_digest("told by gitea")),
            "citation: a digest Argo CD is told of",
        )
        started = time.monotonic()
        argocd.wait_synced(app.name, commit, timeout=60)
        print(f"told and synced {commit[:12]} in {time.monotonic() - started:.1f} s")
        said = log.read_text()
        assert f"Received push event repo: {real_gitea.url}/{CODE_REPO}, revision: main" in said
        assert f"Requested app '{app.name}' refresh" in said
    finally:
        cluster.http.close()
