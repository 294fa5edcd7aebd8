"""`fabrique seed` and `fabrique derive-secrets` against the Kubernetes and Gitea doubles,
with the real registry holding the app's image."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.validate import Schemas

from .conftest import GITEA_TOKEN, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .oci import built_labels, push_image
from .servers import Registry

APP_FILE = "apps/citation-seeded.yaml"
SOURCE = {
    "username": base64.b64encode(b"pgvector").decode(),
    "password": base64.b64encode(b"s3cr3t-pw").decode(),
}


# Argo CD's own Secret, as its install and its server's first start leave it
ARGOCD_SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "type": "Opaque",
    "metadata": {
        "name": "argocd-secret",
        "namespace": "argocd",
        "labels": {
            "app.kubernetes.io/name": "argocd-secret",
            "app.kubernetes.io/part-of": "argocd",
        },
        "resourceVersion": "3",
    },
    "data": {"server.secretkey": base64.b64encode(b"jwt-key-5a1e").decode()},
}
ARGOCD_HOOK = "http://argocd-server.argocd.svc.cluster.local/api/webhook"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _derived(token: str = "bearer-seed-19ab") -> str:
    """What Gitea signs Argo CD's deliveries with: derived from the bearer token."""
    label = b"fabrique: the secret of Gitea's hooks to Argo CD"
    return hmac.new(token.encode(), label, hashlib.sha256).hexdigest()


@pytest.fixture()
def kube_with_secrets(kube: KubeApiDouble) -> KubeApiDouble:
    kube.secrets[("postgres", "pg-role-pgvector")] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": "pg-role-pgvector", "namespace": "postgres", "resourceVersion": "7"},
        "data": dict(SOURCE),
    }
    kube.secrets[("argocd", "argocd-secret")] = yaml.safe_load(yaml.safe_dump(ARGOCD_SECRET))
    return kube


def _values(
    tmp_path: Path, gitea: GiteaDouble, registry: Registry, keys: dict[str, str] | None = None
) -> Path:
    return write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.url": gitea.url,
            "registry.host": registry.host,
            "derivedSecrets": [
                {
                    "app": "citation",
                    "from": "postgres/pg-role-pgvector",
                    "to": "dagster/pgvector-pg-auth",
                    "keys": keys or {"username": "username", "password": "password"},
                }
            ],
            "apps": [
                {
                    "name": "citation",
                    "image": "citation-dagster",
                    "context": "dataops/citation-dagster",
                    "writeback": {
                        "repo": "atlas/atlas",
                        "path": "dataops/citation-dagster/deploy/overlays/prod/kustomization.yaml",
                    },
                    "application": {
                        "path": APP_FILE,
                        "namespace": "dagster",
                        "sourcePath": "dataops/citation-dagster/deploy/overlays/prod",
                    },
                }
            ],
        },
    )


def _env(tmp_path: Path, kube: KubeApiDouble, context: str = "cluster-prod") -> dict[str, str]:
    return {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig", context=context)),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
        "FABRIQUE_WEBHOOK_TOKEN": "bearer-seed-19ab",
    }


def _writes(gitea: GiteaDouble, kube: KubeApiDouble) -> list[str]:
    return [f"{r.method} {r.path}" for r in [*gitea.requests, *kube.requests] if r.method != "GET"]


def _seed(values: Path, env: dict[str, str], *args: str, **kwargs: Any):  # type: ignore[no-untyped-def]
    result = run_cli("--values", str(values), "seed", "--app", "citation", *args, env=env, **kwargs)
    token = env.get("FABRIQUE_WEBHOOK_TOKEN", "")
    for secret in (GITEA_TOKEN, token, "s3cr3t-pw", _derived(token), _b64(_derived(token))):
        assert secret not in result.stdout + result.stderr
    return result


def _argo_cd_hooks(gitea: GiteaDouble, repo: str = "atlas/atlas") -> list[dict[str, Any]]:
    return [h for h in gitea.hooks[repo].values() if h["config"]["url"] == ARGOCD_HOOK]


def test_a_wrong_context_is_refused_before_any_call(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    values = _values(tmp_path, gitea, registry)
    result = _seed(values, _env(tmp_path, kube_with_secrets, context="cluster-staging"), "--yes")
    assert result.exit_code == 2
    assert (
        "kube context 'cluster-staging' is not target 'prod''s ('cluster-prod'); nothing was done"
        in result.stderr
    )
    assert gitea.requests == [] and kube_with_secrets.requests == []


def test_dry_run_writes_nothing(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    revision = code_repo.head()
    push_image(
        registry.url,
        "citation-dagster",
        revision[:12],
        labels=built_labels(revision, gitea.url),
    )
    result = _seed(
        _values(tmp_path, gitea, registry), _env(tmp_path, kube_with_secrets), "--dry-run"
    )
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "plan for citation on prod (cluster-prod):"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "registry-name",
        "image",
        "write-back",
        "secrets",
        "webhook",
        "argo-cd-webhook",
        "application",
    ]
    # the loopback registry's address resolves as written: nothing to check
    assert lines[1] == "  registry-name: skipped (127.0.0.1 resolves as written)"
    assert all(": changed" in line for line in lines[3:]), lines
    assert _writes(gitea, kube_with_secrets) == []


def test_full_run_then_replay_is_all_unchanged(
    tmp_path: Path,
    code_repo: Repo,
    apps_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
    specs: Path,
) -> None:
    revision = code_repo.head()
    digest = push_image(
        registry.url,
        "citation-dagster",
        revision[:12],
        labels=built_labels(revision, gitea.url),
    )
    values, env = _values(tmp_path, gitea, registry), _env(tmp_path, kube_with_secrets)
    first = _seed(values, env, "--yes")
    assert first.exit_code == 0, first.stderr
    assert "[security] ALLOWED_HOST_LIST" in first.stderr, "what Gitea needs to deliver"
    report = first.stdout.splitlines()[-6:]
    assert [line.split(" (")[0] for line in report] == [
        "image: unchanged",
        "write-back: changed",
        "secrets: changed",
        "webhook: changed",
        "argo-cd-webhook: changed",
        "application: changed",
    ]
    # the digest is deployed, the Secret derived, the hook there, the Application in cluster/apps
    images = yaml.safe_load(
        code_repo.show("dataops/citation-dagster/deploy/overlays/prod/kustomization.yaml")
    )["images"]
    assert {
        "name": "citation-dagster",
        "newName": f"{registry.host}/citation-dagster",
        "newTag": revision[:12],
        "digest": digest,
    } in images
    derived = kube_with_secrets.secrets[("dagster", "pgvector-pg-auth")]
    assert derived["data"] == SOURCE
    assert derived["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "fabrique"
    assert len(gitea.hooks["atlas/atlas"]) == 2, "webhook #2 and Argo CD's"
    assert len(_argo_cd_hooks(gitea)) == 1
    application = yaml.safe_load(apps_repo.show(APP_FILE))
    validator = Schemas(specs).validator("argoproj.io/v1alpha1", "Application")
    assert validator is not None and list(validator.iter_errors(application)) == []
    assert application["spec"]["source"]["repoURL"] == f"{gitea.url}/atlas/atlas.git"

    heads = (code_repo.head(), apps_repo.head())
    writes = len(_writes(gitea, kube_with_secrets))
    again = _seed(values, env)  # no --yes: nothing to change, nothing to ask
    assert again.exit_code == 0, again.stderr
    assert [line.split(" (")[0] for line in again.stdout.splitlines()[-6:]] == [
        "image: unchanged",
        "write-back: unchanged",
        "secrets: unchanged",
        "webhook: unchanged",
        "argo-cd-webhook: unchanged",
        "application: unchanged",
    ]
    assert (code_repo.head(), apps_repo.head()) == heads
    assert len(_writes(gitea, kube_with_secrets)) == writes, "a replay writes nothing"
    assert (
        kube_with_secrets.secrets[("postgres", "pg-role-pgvector")]["metadata"]["resourceVersion"]
        == "7"
    )


def _built(code_repo: Repo, gitea: GiteaDouble, registry: Registry) -> None:
    revision = code_repo.head()
    push_image(
        registry.url, "citation-dagster", revision[:12], labels=built_labels(revision, gitea.url)
    )


def test_gitea_signs_its_pushes_to_argo_cd_with_the_secret_argo_cd_checks(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    """The hook from the repository holding the target (and from the apps repository,
    where seed writes the Application) to Argo CD's /api/webhook, and the secret it signs
    with where Argo CD v3 reads Gitea's (its Gogs parser's key), the same one; the rest
    of argocd-secret as it was."""
    _built(code_repo, gitea, registry)
    values, env = _values(tmp_path, gitea, registry), _env(tmp_path, kube_with_secrets)
    first = _seed(values, env, "--yes")
    assert first.exit_code == 0, first.stderr
    line = next(x for x in first.stdout.splitlines() if x.startswith("argo-cd-webhook:"))
    assert line.startswith(
        "argo-cd-webhook: changed (argocd/argocd-secret webhook.gogs.secret set; "
    )
    assert "atlas/atlas created: webhook #" in line and f"({ARGOCD_HOOK}, push on main)" in line
    (hook,) = _argo_cd_hooks(gitea)
    assert (hook["type"], hook["events"], hook["branch_filter"], hook["active"]) == (
        "gitea", ["push"], "main", True
    )  # fmt: skip
    assert hook["config"]["content_type"] == "json"
    assert gitea.hook_secrets[("atlas/atlas", hook["id"])] == _derived()
    (apps,) = _argo_cd_hooks(gitea, "cluster/apps")
    assert gitea.hook_secrets[("cluster/apps", apps["id"])] == _derived()
    secret = kube_with_secrets.secrets[("argocd", "argocd-secret")]
    assert secret["data"] == {
        **ARGOCD_SECRET["data"],
        "webhook.gogs.secret": _b64(_derived()),
    }
    assert secret["metadata"]["labels"] == ARGOCD_SECRET["metadata"]["labels"]
    # Gitea's servers trust only what the site allows: Argo CD's host is named too
    assert (
        "ALLOWED_HOST_LIST = external, gitea-eventsource-svc.fabrique.svc.cluster.local, "
        "argocd-server.argocd.svc.cluster.local in app.ini" in first.stderr
    )

    # a new bearer token: a new secret, in both places, the hook made again
    env["FABRIQUE_WEBHOOK_TOKEN"] = "bearer-next-77c0"
    rotated = _seed(values, env, "--yes")
    assert rotated.exit_code == 0, rotated.stderr
    assert "argo-cd-webhook: changed (argocd/argocd-secret webhook.gogs.secret set; " in (
        rotated.stdout
    )
    (again,) = _argo_cd_hooks(gitea)
    assert again["id"] != hook["id"]
    assert gitea.hook_secrets[("atlas/atlas", again["id"])] == _derived("bearer-next-77c0")
    assert kube_with_secrets.secrets[("argocd", "argocd-secret")]["data"][
        "webhook.gogs.secret"
    ] == _b64(_derived("bearer-next-77c0"))
    replay = _seed(values, env)
    (apps,) = _argo_cd_hooks(gitea, "cluster/apps")
    assert (
        "argo-cd-webhook: unchanged (argocd/argocd-secret webhook.gogs.secret as derived; "
        f"atlas/atlas unchanged: webhook #{again['id']}; "
        f"cluster/apps unchanged: webhook #{apps['id']})" in replay.stdout
    )


def test_the_dry_run_plans_argo_cd_s_hook_and_secret_and_writes_neither(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    _built(code_repo, gitea, registry)
    values, env = _values(tmp_path, gitea, registry), _env(tmp_path, kube_with_secrets)
    planned = _seed(values, env, "--dry-run")
    assert planned.exit_code == 0, planned.stderr
    assert (
        "  argo-cd-webhook: changed (argocd/argocd-secret webhook.gogs.secret set; "
        f"atlas/atlas created: webhook ({ARGOCD_HOOK}, push on main); "
        f"cluster/apps created: webhook ({ARGOCD_HOOK}, push on main))"
    ) in planned.stdout.splitlines()
    assert _argo_cd_hooks(gitea) == [] and _argo_cd_hooks(gitea, "cluster/apps") == []
    assert kube_with_secrets.secrets[("argocd", "argocd-secret")] == ARGOCD_SECRET


def test_without_argo_cd_s_secret_nothing_is_written_for_it_and_seed_says_so(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    """No argocd-secret where the Applications are: Argo CD is not installed there. No hook
    that nothing would check, no Secret made in its place; a warning, and the rest done."""
    del kube_with_secrets.secrets[("argocd", "argocd-secret")]
    _built(code_repo, gitea, registry)
    result = _seed(_values(tmp_path, gitea, registry), _env(tmp_path, kube_with_secrets), "--yes")
    assert result.exit_code == 0, result.stderr
    assert (
        "argo-cd-webhook: missing (no Secret argocd/argocd-secret: Argo CD is not "
        "installed in argocd" in result.stdout
    )
    assert "warning: argo-cd-webhook: no Secret argocd/argocd-secret" in result.stderr
    assert _argo_cd_hooks(gitea) == []
    assert ("argocd", "argocd-secret") not in kube_with_secrets.secrets
    assert "application: changed" in result.stdout


def test_the_hooks_go_where_the_site_names_its_argo_cd(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    """targets.prod.argoCdWebhook: an Argo CD that Gitea reaches elsewhere than at its
    server's Service (another name, TLS, another cluster)."""
    _built(code_repo, gitea, registry)
    values = _values(tmp_path, gitea, registry)
    site = yaml.safe_load(values.read_text())
    site["targets"] = {
        "prod": {"context": "cluster-prod", "argoCdWebhook": "https://cd.example:8443/api/webhook/"}
    }
    values.write_text(yaml.safe_dump(site))
    result = _seed(values, _env(tmp_path, kube_with_secrets), "--yes")
    assert result.exit_code == 0, result.stderr
    for repo in ("atlas/atlas", "cluster/apps"):
        (hook,) = [
            h for h in gitea.hooks[repo].values()
            if h["config"]["url"] == "https://cd.example:8443/api/webhook"
        ]  # fmt: skip
        assert gitea.hook_secrets[(repo, hook["id"])] == _derived()
        assert not _argo_cd_hooks(gitea, repo), "none to the Service the site does not use"
    assert (
        "ALLOWED_HOST_LIST = external, gitea-eventsource-svc.fabrique.svc.cluster.local, "
        "cd.example in app.ini" in result.stderr
    )


def test_a_missing_image_stops_before_any_write(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    code_repo.commit({"dataops/citation-dagster/app.txt": "not built\n"})
    result = _seed(_values(tmp_path, gitea, registry), _env(tmp_path, kube_with_secrets), "--yes")
    assert result.exit_code == 2
    assert (
        "is not in the registry: build it first (fabrique submit --app citation --revision"
        in result.stderr
    )
    assert _writes(gitea, kube_with_secrets) == []


def test_a_missing_source_key_is_named(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    push_image(
        registry.url,
        "citation-dagster",
        code_repo.head()[:12],
        labels=built_labels(code_repo.head(), gitea.url),
    )
    values = _values(tmp_path, gitea, registry, keys={"password": "pass"})
    result = _seed(values, _env(tmp_path, kube_with_secrets), "--yes")
    assert result.exit_code == 2
    assert (
        "Secret postgres/pg-role-pgvector has no key 'pass' (needed for dagster/pgvector-pg-auth key 'password')"
        in result.stderr
    )
    assert _writes(gitea, kube_with_secrets) == []


def test_declining_the_plan_changes_nothing(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    push_image(
        registry.url,
        "citation-dagster",
        code_repo.head()[:12],
        labels=built_labels(code_repo.head(), gitea.url),
    )
    result = _seed(
        _values(tmp_path, gitea, registry), _env(tmp_path, kube_with_secrets), input="n\n"
    )
    assert result.exit_code == 1
    assert _writes(gitea, kube_with_secrets) == []


# ------------------------------------------------------------------ derive-secrets


def _derive_values(tmp_path: Path) -> Path:
    return write_values(
        tmp_path / "site.yaml",
        **{
            "derivedSecrets": [
                {
                    "from": "postgres/pg-role-pgvector",
                    "to": "dagster/pgvector-pg-auth",
                    "keys": {"user": "username", "password": "password"},
                },
            ]
        },
    )


def test_derive_secrets_copies_then_changes_nothing(
    tmp_path: Path, kube_with_secrets: KubeApiDouble
) -> None:
    values = _derive_values(tmp_path)
    env = {"KUBECONFIG": str(kube_with_secrets.kubeconfig(tmp_path / "kc"))}
    first = run_cli("--values", str(values), "derive-secrets", env=env)
    assert first.exit_code == 0, first.stderr
    assert (
        first.stdout.strip()
        == "changed: Secret dagster/pgvector-pg-auth (created with password, user from postgres/pg-role-pgvector)"
    )
    target = kube_with_secrets.secrets[("dagster", "pgvector-pg-auth")]
    assert target["data"] == {"user": SOURCE["username"], "password": SOURCE["password"]}
    again = run_cli("--values", str(values), "derive-secrets", env=env)
    assert again.stdout.startswith("unchanged: Secret dagster/pgvector-pg-auth")
    assert [r.method for r in kube_with_secrets.requests].count("POST") == 1
    assert "PUT" not in [r.method for r in kube_with_secrets.requests]
    assert kube_with_secrets.secrets[("postgres", "pg-role-pgvector")]["data"] == SOURCE, (
        "the source is only read"
    )


def test_derive_secrets_follows_a_rotated_source(
    tmp_path: Path, kube_with_secrets: KubeApiDouble
) -> None:
    values = _derive_values(tmp_path)
    env = {"KUBECONFIG": str(kube_with_secrets.kubeconfig(tmp_path / "kc"))}
    run_cli("--values", str(values), "derive-secrets", env=env)
    kube_with_secrets.secrets[("postgres", "pg-role-pgvector")]["data"]["password"] = _b64(
        "rotated"
    )
    result = run_cli("--values", str(values), "derive-secrets", env=env)
    assert result.stdout.startswith(
        "changed: Secret dagster/pgvector-pg-auth (password, user updated"
    )
    assert kube_with_secrets.secrets[("dagster", "pgvector-pg-auth")]["data"]["password"] == _b64(
        "rotated"
    )


def test_derive_secrets_never_overwrites_a_secret_it_did_not_make(
    tmp_path: Path, kube_with_secrets: KubeApiDouble
) -> None:
    kube_with_secrets.secrets[("dagster", "pgvector-pg-auth")] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pgvector-pg-auth", "namespace": "dagster", "resourceVersion": "3"},
        "data": {"user": _b64("hand-made")},
    }
    env = {"KUBECONFIG": str(kube_with_secrets.kubeconfig(tmp_path / "kc"))}
    result = run_cli("--values", str(_derive_values(tmp_path)), "derive-secrets", env=env)
    assert result.exit_code == 2
    assert "exists and fabrique did not make it; refusing to overwrite it" in result.stderr
    assert kube_with_secrets.secrets[("dagster", "pgvector-pg-auth")]["data"] == {
        "user": _b64("hand-made")
    }


def test_seed_checks_the_image_as_rollback_does_and_a_replay_keeps_the_verified_digest(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube_with_secrets: KubeApiDouble,
) -> None:
    """A tag is no proof: any build can push to it. Seed deploys an image only when its
    labels name that commit of the code repository; a tag overwritten since a first seed
    is not deployed by a replay, and the digest deployed stays."""
    revision = code_repo.head()
    values, env = _values(tmp_path, gitea, registry), _env(tmp_path, kube_with_secrets)
    push_image(registry.url, "citation-dagster", revision[:12], {"x": b"foreign"})
    refused = _seed(values, env, "--yes")
    assert refused.exit_code == 8, refused.stderr
    assert "this image was not built from that commit by fabrique" in refused.stderr
    assert _writes(gitea, kube_with_secrets) == []

    built = push_image(
        registry.url,
        "citation-dagster",
        revision[:12],
        labels=built_labels(revision, gitea.url),
    )
    assert _seed(values, env, "--yes").exit_code == 0
    target = "dataops/citation-dagster/deploy/overlays/prod/kustomization.yaml"
    assert built in code_repo.show(target)
    head = code_repo.head()
    push_image(registry.url, "citation-dagster", revision[:12], {"x": b"overwritten"})
    replay = _seed(values, env, "--yes")
    assert replay.exit_code == 8, replay.stderr
    assert code_repo.head() == head and built in code_repo.show(target)


def test_a_later_environment_s_application_reads_where_its_target_lives(tmp_path: Path) -> None:
    """The build's environment deploys the overlay of the code repository, on the site's
    branch; a later one deploys the folder of its own target, in the repository and on
    the branch promote writes to, else it would never see a promotion."""
    from fabrique.gestures.seed import application_document
    from fabrique.site.config import default_values, load_site

    app = default_values()["apps"][0]
    app["environments"] = [
        {"name": "bench", "target": "prod"},
        {
            "name": "prod",
            "target": "prod",
            "application": "argocd/citation-prod",
            "namespace": "dagster-prod",
            "writeback": {
                "repo": "platform/deploy",
                "branch": "release",
                "path": "citation/prod/kustomization.yaml",
            },
        },
        {
            "name": "dr",
            "target": "prod",
            "application": "argocd/citation-dr",
            "namespace": "dagster-dr",
            "writeback": {"repo": "platform/deploy", "path": "citation/dr/kustomization.yaml"},
        },
    ]
    site = load_site(write_values(tmp_path / "site.yaml", apps=[app]), env={})
    bench, prod, dr = site.apps[0].environments
    sources = []
    for env in (bench, prod, dr):
        deployment = site.apps[0].deployment(env)
        assert deployment is not None
        sources.append(application_document(site, deployment)["spec"]["source"])
    url = site.gitea.url
    assert sources == [
        {
            "repoURL": f"{url}/atlas/atlas.git",
            "targetRevision": "main",
            "path": site.apps[0].application.source_path,  # type: ignore[union-attr]
        },
        {
            "repoURL": f"{url}/platform/deploy.git",
            "targetRevision": "release",
            "path": "citation/prod",
        },
        {"repoURL": f"{url}/platform/deploy.git", "targetRevision": "main", "path": "citation/dr"},
    ]


def test_where_an_application_of_seed_deploys_the_rendered_tree_keeps_egress_in_the_cluster(
    tmp_path: Path,
) -> None:
    """The Application seed writes and the tree's policies come from one place (the app's
    deployments): the namespace it deploys into and Argo CD's, which holds it, each get
    a policy whose egress stays in the cluster, as far as the app widens it by name."""
    from fabrique.gestures.seed import application_document
    from fabrique.render import render_tree
    from fabrique.site.config import default_values, load_site

    app = default_values()["apps"][0]
    app["environments"] = [
        {"name": "bench", "target": "prod", "namespace": "dagster-bench"},
        {
            "name": "prod",
            "target": "prod",
            "application": "gitops/citation",
            "writeback": {**app["writeback"], "path": "deploy/prod/kustomization.yaml"},
        },
    ]
    app["egress"] = ["registry"]
    site = load_site(write_values(tmp_path / "site.yaml", apps=[app]), env={})
    tree = render_tree(site)
    policies = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]
        for documents in tree.values()
        for d in documents
        if d["kind"] == "NetworkPolicy"
    }
    for env in site.apps[0].environments:
        deployment = site.apps[0].deployment(env)
        assert deployment is not None
        document = application_document(site, deployment)
        runs_in = document["spec"]["destination"]["namespace"]
        app_policy = policies[(runs_in, "citation-egress")]
        assert app_policy["podSelector"] == {} and app_policy["policyTypes"] == ["Egress"]
        assert not any("ipBlock" in peer for rule in app_policy["egress"] for peer in rule["to"])
        assert (document["metadata"]["namespace"], "argo-cd-egress") in policies
    assert {ns for ns, name in policies if name.endswith("-egress") and ns not in (
        "fabrique", "fabrique-build", "gitea")} == {"dagster", "dagster-bench", "argocd", "gitops"}  # fmt: skip
