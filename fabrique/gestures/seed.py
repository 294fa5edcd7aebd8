"""``fabrique seed``: the one operator gesture, from a workstation, replayable.

In order: check the kube context is the target's; check the registry's bare name can
resolve in fabrique's namespaces; verify the app's image exists by digest, and that its
labels (and provenance, with attestations) name that commit, as rollback does; write the
digest back; derive the app's Secrets; seed webhook #2, then Gitea's hooks to Argo CD
(argocd_hook.py: a write-back is deployed at once, not at Argo CD's next poll); create
the Argo CD Application in the apps repository. Each step reports ``changed``,
``unchanged``, ``skipped`` or ``missing``; run again, everything is ``unchanged``.
Nothing is written in ``--dry-run``, and a step that cannot proceed stops the seed before
any write of its own.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

import yaml

from fabrique.clients.gitea import GiteaClient
from fabrique.clients.kube import KubeClient
from fabrique.clients.registry import RegistryClient
from fabrique.decisions.changes import fabrique_paths
from fabrique.decisions.provenance import check_built_here
from fabrique.decisions.signature import signature_gate
from fabrique.decisions.writeback import Transport, write_back
from fabrique.gestures.argocd_hook import app_argo_cd_namespaces, tell_argo_cd, webhook_urls
from fabrique.gestures.webhook import Credentials, seed_webhook
from fabrique.site.config import AppConfig, Deployment, Environment, Site
from fabrique.site.errors import ImageNotFound, InputError, NotPassed
from fabrique.site.names import short_sha

from .lint import lint_application
from .promote import deployed_in
from .secrets import derive, wanted

GITEA_ADMIN_SECRET = "gitea-admin"


@dataclass(frozen=True)
class Step:
    name: str
    state: str  # changed | unchanged | skipped | missing (a check that found nothing)
    detail: str

    def line(self) -> str:
        return f"{self.name}: {self.state} ({self.detail})"


def check_target(site: Site, target: str, context: str) -> None:
    """Stop before anything else when the kube context is not the target's."""
    if target not in site.targets:
        known = ", ".join(site.targets) or "none"
        raise InputError(f"--target {target!r}: not in the site's targets (known: {known})")
    wanted_context = site.targets[target].context
    if context != wanted_context:
        raise InputError(
            f"kube context {context!r} is not target {target!r}'s ({wanted_context!r}); "
            "nothing was done (switch context or pass --context)"
        )


def registry_name(site: Site, kube: KubeClient) -> Step:
    """Whether the registry's bare host name (``registry`` of ``registry:80``) can resolve
    in the build and control namespaces: a pod looks a bare name up through its DNS
    search path, so each namespace needs a Service of that name (an ExternalName to the
    registry's Service, or one with its endpoints on the registry's port). A cluster DNS
    rewrite would do too, which the API does not show: a missing Service is ``missing``,
    a warning, not a failure. A dotted name or an address resolves as written."""
    address = re.fullmatch(r"(\[[^\]]+\]|[^:]+)(?::(\d+))?", site.registry.host)
    assert address is not None  # the config checked host[:port]
    host, port = address[1], address[2] or ("80" if site.registry.plain_http else "443")
    if "." in host or host.startswith("["):
        return Step("registry-name", "skipped", f"{host} resolves as written")
    problems, found = [], []
    for namespace in (site.namespaces.build, site.namespaces.control):
        service = kube.get_service(namespace, host)
        spec = (service or {}).get("spec") or {}
        if service is None:
            problems.append(f"no Service {host} in {namespace}")
        elif spec.get("type") == "ExternalName":
            found.append(f"{namespace}/{host} -> {spec.get('externalName')}")
        elif not any(str(p.get("port")) == port for p in spec.get("ports") or []):
            problems.append(f"Service {namespace}/{host} serves no port {port}")
        else:
            found.append(f"{namespace}/{host}:{port}")
    if problems:
        detail = "; ".join(problems) + (
            f": pods resolve {site.registry.host} only through a cluster DNS rewrite "
            "(docs/operate/troubleshooting.md: lookup registry … no such host)"
        )
        return Step("registry-name", "missing", detail)
    return Step("registry-name", "unchanged", ", ".join(found))


def gitea_admin_token(kube: KubeClient, site: Site) -> str:
    """Gitea's admin token, from the Secret gitea-admin (key token) of the Gitea namespace."""
    secret = kube.get_secret(site.namespaces.gitea, GITEA_ADMIN_SECRET)
    if secret is None:
        raise InputError(f"Secret {site.namespaces.gitea}/{GITEA_ADMIN_SECRET}: not found")
    value = (secret.get("data") or {}).get("token")
    if not value:
        raise InputError(f"Secret {site.namespaces.gitea}/{GITEA_ADMIN_SECRET}: no key 'token'")
    return base64.b64decode(value).decode("utf-8").strip()


def seeded_environments(app: AppConfig, target: str) -> list[Environment]:
    """The environments of ``app`` whose cluster is ``target`` (none: an app without
    environments); an InputError when it has environments and none there."""
    if not app.environments:
        return []
    found = [env for env in app.environments if env.target == target]
    if not found:
        known = ", ".join(f"{env.name} on {env.target}" for env in app.environments)
        raise InputError(f"--target {target!r}: {app.name} has no environment there ({known})")
    return found


def application_document(site: Site, deployment: Deployment) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": deployment.name,
            "namespace": deployment.namespace,
            "finalizers": ["resources-finalizer.argocd.argoproj.io"],
        },
        "spec": {
            "project": deployment.project,
            "source": {
                "repoURL": site.gitea.repo_url(deployment.repo or site.gitea.code_repo),
                "targetRevision": deployment.branch or site.gitea.branch,
                "path": deployment.source_path,
            },
            "destination": {
                "server": "https://kubernetes.default.svc",
                "namespace": deployment.destination,
            },
            "syncPolicy": {
                "automated": {"prune": True, "selfHeal": True},
                "syncOptions": ["CreateNamespace=true"],
            },
        },
    }


class Seeder:
    def __init__(
        self,
        site: Site,
        app: AppConfig,
        *,
        kube: KubeClient,
        gitea: GiteaClient,
        transport: Transport,
        registry: RegistryClient,
        webhook: Credentials,
        specs_schemas: Any,
        target: str,
        environments: list[Environment] | None = None,
    ) -> None:
        self.site, self.app, self.kube, self.gitea = site, app, kube, gitea
        self.transport, self.registry, self.webhook = transport, registry, webhook
        self.schemas = specs_schemas
        # the cluster seeded (targets.<name>), and the app's environments there
        # (seeded_environments)
        self.target = target
        self.environments = environments or []

    def run(self, *, dry_run: bool) -> list[Step]:
        """Each step in order; the first environment (or the app without any) gets the
        build's digest, each later one must deploy what a promotion wrote there."""
        envs: list[Environment | None] = list(self.environments) or [None]
        steps = [registry_name(self.site, self.kube)]
        waiting: dict[str, str] = {}  # an environment no promotion reached yet: why
        for env in envs:
            suffix = f" {env.name}" if env else ""
            if env is None or env == self.app.environments[0]:
                revision, digest, image = self.image()
                steps.append(image)
                steps.append(self.write_back(revision, digest, dry_run, suffix))
                continue
            try:
                steps.append(self.promoted(env))
            except NotPassed as err:
                waiting[env.name] = (
                    f"{err}; promote into it first (fabrique promote --app {self.app.name} "
                    f"--to {env.name})"
                )
                steps.append(Step(f"promoted {env.name}", "skipped", waiting[env.name]))
        if len(waiting) == len(envs):  # nothing here to seed yet
            raise InputError(f"{next(iter(waiting.values()))}; nothing was written")
        steps.append(self.secrets(dry_run))
        steps.append(self.webhook_step(dry_run))
        steps.append(self.argo_cd_step(dry_run))
        for env in envs:
            if env is not None and env.name in waiting:  # an Application would deploy a tag
                steps.append(Step(f"application {env.name}", "skipped", "no promotion yet"))
            else:
                steps.append(self.application(env, dry_run))
        return steps

    def promoted(self, env: Environment) -> Step:
        """An environment after the first deploys only what a promotion wrote, a digest
        built here: seed writes none there (NotPassed: none yet)."""
        candidate = deployed_in(self.site, self.transport, self.app, env)
        digest = candidate.pin.digest or ""
        check_built_here(self.site, self.registry, self.app, candidate.revision, digest)
        return Step(
            f"promoted {env.name}", "unchanged", f"{candidate.where}: {candidate.pin.reference}"
        )

    def image(self) -> tuple[str, str, Step]:
        site, app = self.site, self.app
        want = self.transport.last_change(
            site.gitea.code_repo, site.gitea.branch, app.context, fabrique_paths(site)
        )
        if want is None:
            raise InputError(
                f"app {app.name}: no commit of {site.gitea.code_repo} changes {app.context}"
            )
        ref = f"{site.registry.host}/{app.image}:{short_sha(want)}"
        try:
            digest = self.registry.manifest_digest(app.image, short_sha(want)).digest
        except ImageNotFound:
            raise InputError(
                f"image {ref} is not in the registry: build it first "
                f"(fabrique submit --app {app.name} --revision {want}); nothing was written"
            ) from None
        # what rollback checks: the image says it was built from that commit of the code
        # repository (and, with attestations, its provenance does): a tag is no proof,
        # any build may push to it, and a replay would deploy whatever it holds now
        check_built_here(site, self.registry, app, want, digest)
        return want, digest, Step("image", "unchanged", f"{ref}@{digest}")

    def write_back(self, revision: str, digest: str, dry_run: bool, suffix: str = "") -> Step:
        outcome = write_back(
            self.site,
            self.transport,
            self.app.name,
            revision,
            digest,
            dry_run=dry_run,
            workflow="fabrique-seed",
            gate=signature_gate(self.site, self.registry),
        )
        state = {"changed": "changed", "would-change": "changed", "unchanged": "unchanged"}.get(
            outcome.state, "skipped"
        )
        detail = outcome.where if state != "skipped" else outcome.detail
        return Step(f"write-back{suffix}", state, detail)

    def secrets(self, dry_run: bool) -> Step:
        derivations = wanted(self.site, self.app.name)
        if not derivations:
            return Step("secrets", "skipped", "no derivedSecrets for this app")
        results = [derive(self.kube, d, dry_run=dry_run) for d in derivations]
        state = "changed" if any(r.state == "changed" for r in results) else "unchanged"
        return Step("secrets", state, ", ".join(f"{r.target} {r.state}" for r in results))

    def webhook_step(self, dry_run: bool) -> Step:
        actions = seed_webhook(self.site, self.gitea, self.webhook, dry_run=dry_run, rotate=False)
        state = "unchanged" if all(a.verb == "unchanged" for a in actions) else "changed"
        return Step("webhook", state, "; ".join(a.line(False) for a in actions))

    def argo_cd_namespaces(self) -> list[str]:
        """The namespaces of the Argo CD that deploys what is seeded here."""
        return app_argo_cd_namespaces(self.app, self.environments)

    def argo_cd_urls(self) -> list[str]:
        """Where Gitea's hooks tell that Argo CD of a push."""
        return webhook_urls(self.site, self.target, self.argo_cd_namespaces())

    def argo_cd_step(self, dry_run: bool) -> Step:
        """Gitea's hooks to the Argo CD of the Applications seeded here (argocd_hook.py)."""
        told = tell_argo_cd(
            self.site,
            self.target,
            self.argo_cd_namespaces(),
            gitea=self.gitea,
            kube=self.kube,
            credentials=self.webhook,
            dry_run=dry_run,
        )
        return Step("argo-cd-webhook", told.state, told.detail)

    def application(self, env: Environment | None, dry_run: bool) -> Step:
        name = f"application {env.name}" if env else "application"
        deployment = self.app.deployment(env)
        if deployment is None:
            kind = self.app.at(env).writeback.kind if env else self.app.writeback.kind
            why = (
                "no apps[].application in the site"
                if self.app.application is None
                else f"its target is of kind {kind}: seed writes the Application of a "
                "kustomize overlay only"
            )
            return Step(name, "skipped", why)
        repo, branch = self.site.gitea.apps_repo, self.site.gitea.branch
        where = f"{repo}@{branch}:{deployment.path}"
        snapshot = self.transport.read(repo, branch, deployment.path)
        if snapshot.text is None:
            document = application_document(self.site, deployment)
            if not dry_run:
                text = "# Written by `fabrique seed`: Argo CD deploys this app from Gitea.\n"
                text += yaml.safe_dump(document, sort_keys=False)
                what = f"{self.app.name} in {env.name}" if env else self.app.name
                message = f"fabrique: Argo CD Application for {what}\n"
                self.transport.write(repo, branch, deployment.path, text, snapshot, message)
            return Step(name, "changed", f"created {where}")
        try:
            existing = yaml.safe_load(snapshot.text)
        except yaml.YAMLError:
            raise InputError(f"{where}: not valid YAML") from None
        if not isinstance(existing, dict):
            raise InputError(f"{where}: not a mapping")
        problems = list(lint_application(existing, self.site, self.schemas))
        if problems:
            raise InputError(f"{where}: {problems[0]} (fix it in the apps repository)")
        return Step(name, "unchanged", where)
