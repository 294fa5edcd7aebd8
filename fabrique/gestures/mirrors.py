"""Gitea pull mirrors: upstream (GitHub) is pulled by Gitea, never pushed into the cluster.

``fabrique mirror ensure`` creates each mirror the site lists through Gitea's migrate
API (``mirror: true`` and its interval), or repairs its interval; ``fabrique mirror sync``
asks Gitea to pull now (the ``gitea-mirror-sync`` CronWorkflow runs it). The pulls come
from the Gitea pods, whose only Internet is GitHub's CIDRs on 443.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fabrique.clients.gitea import GiteaClient, RepositoryExists
from fabrique.site.config import Mirror, Site
from fabrique.site.errors import GiteaError


@dataclass(frozen=True)
class MirrorResult:
    repo: str
    state: str  # created | repaired | unchanged | synced
    detail: str = ""

    def line(self, dry_run: bool = False) -> str:
        prefix = "would be " if dry_run and self.state in ("created", "repaired") else ""
        return f"{prefix}{self.state}: {self.repo}" + (f" ({self.detail})" if self.detail else "")


def _interval_seconds(text: str) -> int:
    """Gitea shows ``10m0s`` for ``10m``: compare intervals as seconds."""
    total = 0
    for amount, unit in re.findall(r"(\d+)([hms])", text):
        total += int(amount) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


def ensure(site: Site, gitea: GiteaClient, mirror: Mirror, *, dry_run: bool) -> MirrorResult:
    owner, name = mirror.repo.split("/")
    found = gitea.get_repo(mirror.repo)
    if found is None:
        created = MirrorResult(
            mirror.repo, "created", f"pull mirror of {mirror.source} every {mirror.interval}"
        )
        if dry_run:
            return created
        try:
            gitea.migrate(
                {
                    "clone_addr": mirror.source,
                    "repo_owner": owner,
                    "repo_name": name,
                    "mirror": True,
                    "mirror_interval": mirror.interval,
                    "private": True,
                    "service": "git",
                }
            )
            return created
        except RepositoryExists:
            # Gitea clones inside the migrate request: a try that timed out may have made
            # the repository, and its retry meets 409. Check what is there, then go on.
            found = gitea.get_repo(mirror.repo)
            if found is None:
                raise
    if not found.get("mirror"):
        raise GiteaError(
            f"repository {mirror.repo} exists and is not a mirror; fabrique does not convert it "
            "(rename it, or remove it from mirrors)"
        )
    original = str(found.get("original_url") or "")
    if original and original.rstrip("/") != mirror.source.rstrip("/"):
        raise GiteaError(
            f"repository {mirror.repo} mirrors {original}, not {mirror.source}; "
            "fix the site's mirrors or recreate the mirror"
        )
    if _interval_seconds(str(found.get("mirror_interval") or "")) != _interval_seconds(
        mirror.interval
    ):
        if not dry_run:
            gitea.edit_repo(mirror.repo, {"mirror_interval": mirror.interval})
        return MirrorResult(
            mirror.repo, "repaired", f"interval {found.get('mirror_interval')} -> {mirror.interval}"
        )
    return MirrorResult(mirror.repo, "unchanged")


def sync(gitea: GiteaClient, mirror: Mirror) -> MirrorResult:
    gitea.mirror_sync(mirror.repo)
    return MirrorResult(mirror.repo, "synced")
