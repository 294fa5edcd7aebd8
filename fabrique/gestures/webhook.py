"""Seeding webhook #2: the code repository posts its pushes to the EventSource.

``fabrique seed-webhook`` makes sure ``atlas/atlas`` has exactly one webhook pointing at
the EventSource's Service: type ``gitea``, JSON, ``push`` events only, the branch filter,
``Authorization: Bearer <token>`` (what the EventSource's authSecret checks), active. It
creates it when missing, repairs it when it differs, removes duplicates, and changes
nothing when all is right. ``--rotate`` writes the token again. It is never printed.

Gitea never shows the authorization header it stores (1.27 answers ""), so fabrique
cannot read back which token a hook sends. It names the hook with a fingerprint of the
header instead: ``fabrique-eventsource bearer:scrypt:<salt>:<key>``, a salted scrypt
that tells whether a token is the one set and gives nothing back to a reader of the
name. A hook whose fingerprint does not match the token given (the Secret holds a new
one), or that has none (made by hand or by an older fabrique), is recreated with it;
another run with the same token changes nothing. A header changed behind the name's
back (by hand in Gitea, or cleared by an API edit that omits it) cannot be seen:
``--rotate`` writes it again.

No HMAC secret is set: Gitea would sign each delivery (``X-Gitea-Signature``), but the
webhook EventSource checks only the bearer header and nothing else on the path could
check a signature; a secret nobody verifies would only look like protection (the hooks
to Argo CD carry one, which Argo CD checks: argocd_hook.py, through ``keep_hook``). A hook
that must change is recreated rather than edited: Gitea's PATCH ignores ``config.secret``,
so only a new hook is sure to carry none. A secret set by hand on an otherwise right hook
is invisible (Gitea never shows it): ``--rotate`` recreates the hook.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fabrique.clients.gitea import GiteaClient
from fabrique.site.config import Site
from fabrique.site.errors import InputError
from fabrique.site.names import webhook_service_url

TOKEN_ENV = "FABRIQUE_WEBHOOK_TOKEN"
HOOK_NAME = "fabrique-eventsource"
# scrypt's interactive cost (2**14, 8, 1: 16 MiB, tens of milliseconds): a guess of the
# token from the name costs as much
SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 16}
# what a fingerprint is of: ``bearer``, the authorization header; ``secret``, the HMAC
# secret that signs each delivery (Argo CD's hooks, argocd_hook.py)
FINGERPRINT = re.compile(
    r"\b(?P<kind>bearer|secret):scrypt:(?P<salt>[0-9a-f]{32}):(?P<key>[0-9a-f]{32})$"
)


def fingerprint(value: str, salt: bytes | None = None, kind: str = "bearer") -> str:
    """A salted, one-way fingerprint of what a hook sends and Gitea never shows back
    (the authorization header, the secret), to put where Gitea shows it (the hook's
    name): never the value itself."""
    salt = os.urandom(16) if salt is None else salt
    key = hashlib.scrypt(value.encode("utf-8"), salt=salt, **SCRYPT)
    return f"{kind}:scrypt:{salt.hex()}:{key.hex()}"


def carries(name: str, value: str, kind: str = "bearer") -> bool:
    """Whether a hook named ``name`` was made with ``value``, by its fingerprint; False
    when the name holds none of that kind."""
    found = FINGERPRINT.search(name)
    if found is None or found["kind"] != kind:
        return False
    expected = fingerprint(value, bytes.fromhex(found["salt"]), kind)
    return hmac.compare_digest(expected, found[0])


@dataclass(frozen=True)
class Credentials:
    token: str = field(repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials:
        env = os.environ if env is None else env
        if not env.get(TOKEN_ENV):
            raise InputError(
                f"{TOKEN_ENV}: not set; the webhook's bearer token (the value of the Secret "
                "the EventSource checks) comes from there"
            )
        return cls(env[TOKEN_ENV])


@dataclass(frozen=True)
class Action:
    verb: str  # created | repaired | unchanged | removed
    hook_id: int | None
    detail: str = ""

    def line(self, dry_run: bool) -> str:
        hook = f"webhook #{self.hook_id}" if self.hook_id is not None else "webhook"
        prefix = "would be " if dry_run and self.verb != "unchanged" else ""
        return f"{prefix}{self.verb}: {hook}" + (f" ({self.detail})" if self.detail else "")


def allowed_host_notice(site: Site, also: Sequence[str] = ()) -> str:
    """What Gitea needs before webhook #2 (and the hooks to ``also``'s URLs, Argo CD's)
    delivers anything, said where it is seeded.

    Gitea refuses to deliver to a host its ``ALLOWED_HOST_LIST`` does not allow, and the
    default (``external``) excludes every cluster-internal address, so the hook would
    exist and no push would ever reach the EventSource. No API shows the setting. Since
    Gitea 1.27 the key is ``[security]``'s (it also bounds OAuth2, OpenID, migrations and
    pull mirrors, hence ``external`` kept); ``[webhook]``'s is read before 1.27 and
    deprecated since."""
    urls = [webhook_service_url(site.namespaces.control), *also]
    host = ", ".join(dict.fromkeys(str(urlsplit(url).hostname) for url in urls))
    return (
        "Gitea delivers webhooks only to the hosts its ALLOWED_HOST_LIST allows, and its "
        f"default (external) refuses {host}: set [security] ALLOWED_HOST_LIST = external, "
        f"{host} in app.ini (GITEA__security__ALLOWED_HOST_LIST; before Gitea 1.27, "
        f"[webhook] ALLOWED_HOST_LIST = {host}), then check the hook's deliveries"
    )


def desired(site: Site, credentials: Credentials) -> dict[str, Any]:
    """The CreateHookOption body of webhook #2, named with the fingerprint of its header."""
    header = f"Bearer {credentials.token}"
    return {
        "type": "gitea",
        "name": f"{HOOK_NAME} {fingerprint(header)}",
        "config": {
            "url": webhook_service_url(site.namespaces.control),
            "content_type": "json",
            "http_method": "post",
            "secret": "",  # no signature: nothing on the path checks one (see above)
        },
        "events": ["push"],
        "branch_filter": site.gitea.branch,
        "authorization_header": header,
        "active": True,
    }


def differences(hook: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """What differs between a hook as Gitea shows it and the wanted one (names only)."""
    config = hook.get("config") or {}
    found = []
    if hook.get("type") != want["type"]:
        found.append("type")
    if config.get("content_type") != want["config"]["content_type"]:
        found.append("content_type")
    # Gitea 1.27 shows only the url and the content type of config: a method it shows is
    # compared, one it does not is taken for the POST it was created with
    if (config.get("http_method") or "post").lower() != want["config"]["http_method"]:
        found.append("http_method")
    if sorted(hook.get("events") or []) != sorted(want["events"]):
        found.append("events")
    if (hook.get("branch_filter") or "") != want["branch_filter"]:
        found.append("branch_filter")
    if hook.get("active") is not True:
        found.append("active")
    name = str(hook.get("name") or "")
    header = want.get("authorization_header") or ""
    shown = hook.get("authorization_header") or ""
    if shown:  # a Gitea that shows the header it stores is believed
        same = shown == header
    else:  # Gitea 1.27 shows "": the fingerprint in the name says
        same = not header or carries(name, header)
    if not same:
        found.append("authorization_header")
    # Gitea never shows the secret: only the fingerprint in the name can say
    secret = want["config"].get("secret") or ""
    if secret and not carries(name, secret, "secret"):
        found.append("secret")
    return found


def seed_webhook(
    site: Site, gitea: GiteaClient, credentials: Credentials, *, dry_run: bool, rotate: bool
) -> list[Action]:
    want = desired(site, credentials)
    made = f"{want['config']['url']}, push on {site.gitea.branch}"
    return keep_hook(gitea, site.gitea.code_repo, want, made, dry_run=dry_run, rotate=rotate)


def keep_hook(
    gitea: GiteaClient,
    repo: str,
    want: dict[str, Any],
    made: str,
    *,
    dry_run: bool,
    rotate: bool = False,
) -> list[Action]:
    """Exactly one hook of ``repo`` to ``want``'s URL, as ``want`` says: created (``made``
    says what), recreated when it differs, duplicates removed, otherwise unchanged."""
    url = want["config"]["url"]
    ours = sorted(
        (h for h in gitea.list_hooks(repo) if (h.get("config") or {}).get("url") == url),
        key=lambda h: int(h.get("id") or 0),
    )
    actions: list[Action] = []
    if not ours:
        hook_id = None if dry_run else int(gitea.create_hook(repo, want).get("id") or 0)
        return [Action("created", hook_id, made)]
    keep, *duplicates = ours
    hook_id = int(keep["id"])
    changed = differences(keep, want)
    if rotate:
        changed.append("token rotated")
    if changed:
        # Recreated, not edited: Gitea's PATCH ignores config.secret (editHook reads only
        # the url and the content type of config), so an edit could not clear an HMAC
        # secret set earlier, which Gitea never shows. The new hook comes first: a push in
        # between is delivered twice at worst, and its second Workflow meets 409.
        if not dry_run:
            new_id = int(gitea.create_hook(repo, want).get("id") or 0)
            gitea.delete_hook(repo, hook_id)
        else:
            new_id = None
        detail = f"{', '.join(changed)}; recreated, #{hook_id} removed"
        actions.append(Action("repaired", new_id, detail))
    else:
        actions.append(Action("unchanged", hook_id))
    for duplicate in duplicates:
        if not dry_run:
            gitea.delete_hook(repo, int(duplicate["id"]))
        actions.append(
            Action("removed", int(duplicate["id"]), "a duplicate pointing at the same URL")
        )
    return actions
