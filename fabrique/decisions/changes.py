"""Build only what changed: the authoritative check, run by the plan step.

A push builds an app only if a file under the app's context changed between the
revision deployed now and the pushed one. Files that fabrique itself writes (the
write-back targets) do not count: otherwise every write-back commit, which lands inside
the context when the overlay lives there, would trigger the next build, forever.

When it cannot tell (nothing deployed yet, a deployed tag that is not a commit, a pushed
commit that does not descend from the deployed one, too many commits to list), it builds:
building too often is safe, and the write-back guards against rolling back.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabrique.site.config import Site
from fabrique.site.names import check_revision

from .writeback import Transport, deployed_pin, deployed_revision


def fabrique_paths(site: Site) -> frozenset[str]:
    """The files of the code repository that fabrique itself writes: each app's write-back
    target, and each of its environments' (a promotion's commit is no change to build)."""
    targets = [
        target
        for app in site.apps
        for target in (app.writeback, *(env.writeback for env in app.environments))
        if target is not None
    ]
    return frozenset(t.path for t in targets if t.repo == site.gitea.code_repo)


@dataclass(frozen=True)
class Decision:
    build: bool
    reason: str


def needs_build(site: Site, transport: Transport, app_name: str, revision: str) -> Decision:
    app = site.app(app_name)
    check_revision(revision)
    code_repo, branch = site.gitea.code_repo, site.gitea.branch
    target = app.writeback
    snapshot = transport.read(target.repo, site.branch_of(target), target.path)
    if snapshot.text is None:
        return Decision(True, f"no deployment recorded yet ({target.path} does not exist)")
    deployed = deployed_pin(site, app, snapshot.text)
    if deployed is None or not deployed.tag:
        return Decision(True, f"no deployed revision of {app.image} in {target.path}")
    deployed_commit = deployed_revision(transport, code_repo, branch, deployed.tag)
    if deployed_commit is None:
        return Decision(True, f"deployed tag {deployed.tag!r} is not a commit of {code_repo}")
    if deployed_commit == revision:
        return Decision(False, f"{revision[:12]} is the deployed revision already")
    if not transport.is_ancestor(code_repo, branch, deployed_commit, revision):
        return Decision(
            True, f"{revision[:12]} does not descend from deployed {deployed_commit[:12]}"
        )
    files = transport.files_changed(code_repo, branch, deployed_commit, revision, app.context)
    if files is None:
        return Decision(True, f"too many commits since {deployed_commit[:12]} to list")
    own = fabrique_paths(site)  # a walk of every app: once, not once a file
    changed = [f for f in files if f not in own]
    if not changed:
        return Decision(
            False, f"nothing under {app.context} changed since deployed {deployed_commit[:12]}"
        )
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return Decision(True, f"{len(changed)} file(s) changed under {app.context}: {shown}")
