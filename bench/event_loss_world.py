"""What both modes of the fault bench share (``bench/event_loss.py``, the simulation, and
``bench/event_loss_real.py``, its real mode): the bench's site and its code repository's
first commit, the figures and the rules they are judged by, and the ``World``, the
cluster side both play (Workflows run, builds, write-backs), whichever API holds the
Workflows."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from fabrique.clients.kube import KubeClient
from fabrique.decisions.changes import fabrique_paths, needs_build
from fabrique.decisions.targets import read_pin
from fabrique.decisions.writeback import GiteaTransport, desired_pin, write_back
from fabrique.site.config import Site, default_values, merge, parse_site
from tests import servers
from tests.doubles.kube import argo_status
from tests.gitrepo import BareRepo
from tests.oci import push_image

SEED_KUSTOMIZATION = "kind: Kustomization\nresources: []\n"


@dataclass
class Figures:
    events_sent: int = 0
    lost_webhook: int = 0
    lost_eventbus: int = 0
    lost_outage: int = 0
    redelivered: int = 0
    workflows_created: int = 0
    workflows_existing: int = 0  # a redelivery met its Workflow: the trigger's patch, no change
    workflows_refused_409: int = 0
    builds: int = 0
    builds_skipped_unchanged: int = 0
    crashed_after_push: int = 0
    failed_reported: int = 0
    failed_expired: int = 0
    duplicate_builds: int = 0
    superseded: int = 0
    rollbacks: int = 0
    drifted_before: int = 0
    drifted_after: int = 0
    reconcile_passes: int = 0
    requests_per_app_per_pass: float = 0.0
    # each push as it went, once the event path settled (before the reconciler acts): what
    # the bench did to its delivery, and which apps' Workflows exist at its commit
    pushes: list[dict[str, Any]] = field(default_factory=list)
    reconcile_states: list[dict[str, int]] = field(default_factory=list)  # per pass
    built: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    expired: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)

    @property
    def events_lost(self) -> int:
        return self.lost_webhook + self.lost_eventbus + self.lost_outage

    def broken(self) -> list[str]:
        rules = []
        if self.duplicate_builds:
            rules.append(f"{self.duplicate_builds} duplicate build(s)")
        if self.rollbacks:
            rules.append(f"{self.rollbacks} rollback(s)")
        if self.drifted_after:
            rules.append(f"{self.drifted_after} app(s) still drifted after reconciling")
        return rules

    def report(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("built", "expired")}
        out["events_lost"] = self.events_lost
        return out


class CountingTransport(httpx.BaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.count = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.count += 1
        return self.inner.handle_request(request)


def site_values(apps: int, registry: str) -> dict[str, Any]:
    """The bench's site, over the defaults: ``apps`` apps in one code repository."""
    return {
        "registry": {"host": registry},
        "network": {"backoffSeconds": 0.01, "timeoutSeconds": 10},
        "writeback": {"attempts": 50},
        "reconcile": {"concurrency": 8},
        "apps": [
            {
                "name": f"app-{i:02d}",
                "image": f"app-{i:02d}",
                "context": f"apps/app-{i:02d}",
                "writeback": {
                    "repo": "atlas/atlas",
                    "path": f"apps/app-{i:02d}/deploy/kustomization.yaml",
                },
            }
            for i in range(apps)
        ],
    }


def make_site(apps: int, gitea_url: str, registry: str) -> Site:
    values = merge(site_values(apps, registry), {"gitea": {"url": gitea_url}})
    return parse_site(merge(default_values(), values))


def seed_files(apps: int) -> dict[str, str]:
    """The code repository's first commit: each app's Dockerfile and deploy target."""
    return {
        **{f"apps/app-{i:02d}/Dockerfile": "FROM scratch\n" for i in range(apps)},
        **{f"apps/app-{i:02d}/deploy/kustomization.yaml": SEED_KUSTOMIZATION for i in range(apps)},
    }


class World:
    """The cluster side of the simulation: Workflows, builds, write-backs. The controller's
    part is played on whichever API holds the Workflows (``pending``, ``record``,
    ``failed``, ``remove``); ``repo`` is the code repository, read with git."""

    def __init__(
        self,
        site: Site,
        repo: BareRepo,
        registry: servers.Registry,
        api: KubeClient,
        transport: GiteaTransport,
        rng: random.Random,
        figures: Figures,
        crash: float,
    ) -> None:
        self.site, self.repo, self.registry = site, repo, registry
        self.api, self.transport, self.rng, self.f = api, transport, rng, figures
        self.crash = crash

    # -- the Workflows, where the API keeps them -------------------------------------------

    def pending(self) -> list[tuple[str, dict[str, Any]]]:
        """The Workflows that have not run yet (no status), by key."""
        raise NotImplementedError

    def record(self, key: str, body: dict[str, Any], status: dict[str, Any]) -> None:
        """Write the status the controller writes once the Workflow has run."""
        raise NotImplementedError

    def failed(self) -> list[tuple[str, dict[str, Any]]]:
        raise NotImplementedError

    def remove(self, key: str) -> None:
        raise NotImplementedError

    def exists(self, app: str, revision: str) -> bool:
        """Whether the Workflow building ``app`` at ``revision`` exists."""
        raise NotImplementedError

    # -- the controller's part -------------------------------------------------------------

    def create(self, body: dict[str, Any]) -> None:
        """The Sensor's ``patch`` operation: create the Workflow, or find it there (a
        redelivery) and patch it with what it holds already, which changes nothing."""
        if self.api.create_workflow(body).created:
            self.f.workflows_created += 1
        else:
            self.f.workflows_existing += 1

    def run_controller(self, crash: float | None = None) -> None:
        """Run every Workflow that has not run yet, in a shuffled order."""
        crash = self.crash if crash is None else crash
        pending = self.pending()
        self.rng.shuffle(pending)
        for key, body in pending:
            params = {p["name"]: p["value"] for p in body["spec"]["arguments"]["parameters"]}
            app, revision = params["app"], params["revision"]
            self.record(key, body, self.build(body, app, revision, crash))

    def build(self, body: dict[str, Any], app: str, revision: str, crash: float) -> dict[str, Any]:
        """Run the Workflow; its status as the controller would write it."""
        if not needs_build(self.site, self.transport, app, revision).build:
            self.f.builds_skipped_unchanged += 1
            return argo_status(body, "Succeeded")  # plan said no: no verify, no output
        key = (app, revision)
        self.f.built[key] = self.f.built.get(key, 0) + 1
        self.f.builds += 1
        image = self.site.app(app).image
        digest = push_image(self.registry.url, image, revision[:12], {"rev": revision.encode()})
        if self.rng.random() < crash:
            self.f.crashed_after_push += 1
            return argo_status(
                body, "Failed", verified=digest, failed_step="write-back", message="pod deleted"
            )
        outcome = write_back(self.site, self.transport, app, revision, digest)
        if outcome.state == "superseded":
            self.f.superseded += 1
        return argo_status(body, "Succeeded", verified=digest)

    def expire_failed(self) -> None:
        """The failed Workflows go (an operator's delete, or their TTL): the next pass
        resubmits them."""
        for key, body in self.failed():
            params = {p["name"]: p["value"] for p in body["spec"]["arguments"]["parameters"]}
            built = (params["app"], params["revision"])
            self.f.expired[built] = self.f.expired.get(built, 0) + 1
            self.f.failed_expired += 1
            self.remove(key)

    def want(self, app: Any) -> str | None:
        return self.transport.last_change(
            "atlas/atlas", "main", app.context, fabrique_paths(self.site)
        )

    def deployed(self, app: Any, ref: str = "main") -> str | None:
        text = self.repo.show(app.writeback.path, ref)
        pin = read_pin(
            text,
            "kustomize-images",
            desired_pin(self.site, app, "0" * 40, "sha256:" + "0" * 64),
            where="k",
        )
        if pin is None or not pin.tag:
            return None
        return self.repo.git("rev-parse", f"{pin.tag}^{{commit}}").strip()

    def drifted(self) -> int:
        """Apps whose deployed revision does not contain their last change (the reconciler's
        own test: deployed == want, or deployed descends from want)."""
        count = 0
        for app in self.site.apps:
            want, deployed = self.want(app), self.deployed(app)
            if want is None:
                continue
            current = deployed is not None and (
                deployed == want or self.repo.git_ok("merge-base", "--is-ancestor", want, deployed)
            )
            count += 0 if current else 1
        return count

    def rollbacks(self) -> int:
        """Successive deployed revisions of an app must each descend from the one before."""
        count = 0
        for app in self.site.apps:
            history = self.repo.git(
                "log", "--reverse", "--format=%H", "main", "--", app.writeback.path
            ).split()
            previous = None
            for commit in history:
                current = self.deployed(app, commit)
                if previous and current and current != previous:
                    ancestor = self.repo.git_ok("merge-base", "--is-ancestor", previous, current)
                    count += 0 if ancestor else 1
                previous = current or previous
        return count
