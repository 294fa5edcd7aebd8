"""``fabrique rollback``: the one sanctioned way back to an older image, and a hold on it.

The automation never rolls back (see ``decisions.writeback``). An operator may: the image
built for the older commit is found in the registry by its tag, checked (its labels name
that commit and the code repository; with attestations, its provenance; with signing, its
signature), then written through the write-back's own path, leased and retried, together
with a hold in the same commit, so that neither the next build nor the next reconcile
pass rolls it forward again. ``fabrique release`` ends it. Before it commits, each later
environment's pull request that proposes the digest it leaves is closed, its merge
cancelled (``writeback.withdraw_later``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fabrique.clients.registry import RegistryClient
from fabrique.decisions.holds import Hold
from fabrique.decisions.provenance import check_built_here
from fabrique.decisions.writeback import Outcome, Transport, write_back
from fabrique.site.config import Environment, Site
from fabrique.site.errors import ImageNotFound, InputError
from fabrique.site.names import short_sha

COMMIT_PREFIX_RE = re.compile(r"[0-9a-f]{7,64}")


def resolve_revision(site: Site, transport: Transport, to: str) -> str:
    """The full commit ``to`` names on the code repository's branch, or InputError."""
    repo, branch = site.gitea.code_repo, site.gitea.branch
    if not COMMIT_PREFIX_RE.fullmatch(to):
        raise InputError(f"--to {to[:80]!r}: must be a commit id (7 to 64 lowercase hex)")
    revision = transport.resolve(repo, branch, to)
    if revision is None:
        raise InputError(f"--to {to}: not a commit of {repo}; nothing written")
    head = transport.head(repo, branch)
    if revision != head and not transport.is_ancestor(repo, branch, revision, head):
        raise InputError(f"--to {to}: {revision} is not on {repo}@{branch}; nothing written")
    return revision


def roll_back(
    site: Site,
    transport: Transport,
    registry: RegistryClient,
    app_name: str,
    to: str,
    hold: Hold,
    *,
    dry_run: bool = False,
    gate: Callable[[str, str], None] | None = None,
    environment: Environment | None = None,
    digest: str | None = None,
) -> Outcome:
    """Deploy the image built for ``to`` and hold the app there (in ``environment``'s
    target, when given). ``digest``: that image, as known already (a verification's),
    else the one the registry holds under its tag."""
    app = site.app(app_name)
    revision = resolve_revision(site, transport, to)
    tag = short_sha(revision)
    if digest is None:
        try:
            digest = registry.manifest_digest(app.image, tag).digest
        except ImageNotFound:
            raise InputError(
                f"--to {to}: {revision[:12]} was never built: the registry holds no "
                f"{site.registry.host}/{app.image}:{tag}; nothing written"
            ) from None
    check_built_here(site, registry, app, revision, digest)
    return write_back(
        site,
        transport,
        app.name,
        revision,
        digest,
        dry_run=dry_run,
        rollback=hold,
        gate=gate,
        environment=environment,
    )
