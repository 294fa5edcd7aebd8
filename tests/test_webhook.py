"""`fabrique seed-webhook` against the Gitea double: create, unchanged, repair, dedupe."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from fabrique.gestures.webhook import HOOK_NAME, carries, fingerprint

from .conftest import GITEA_TOKEN, run_cli, write_values
from .doubles.gitea import GiteaDouble

URL = "http://gitea-eventsource-svc.fabrique.svc.cluster.local:12000/push"
WEBHOOK_TOKEN = "bearer-7f3a9c"
ENV = {"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN, "FABRIQUE_WEBHOOK_TOKEN": WEBHOOK_TOKEN}


@pytest.fixture()
def values(tmp_path: Path, gitea: GiteaDouble) -> Path:
    return write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url})


def _seed(values: Path, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    result = run_cli("--values", str(values), "seed-webhook", *args, env=env or ENV)
    for secret in (WEBHOOK_TOKEN, GITEA_TOKEN):
        assert secret not in result.stdout + result.stderr
    return result


def test_creates_then_unchanged(values: Path, gitea: GiteaDouble) -> None:
    first = _seed(values)
    assert first.exit_code == 0, first.stderr
    assert first.stdout.strip() == f"created: webhook #1 ({URL}, push on main)"
    (hook,) = gitea.hooks["atlas/atlas"].values()
    assert hook["type"] == "gitea"
    assert hook["config"] == {"url": URL, "content_type": "json"}
    assert gitea.hook_methods[("atlas/atlas", 1)] == "post"
    assert hook["events"] == ["push"] and hook["branch_filter"] == "main" and hook["active"] is True
    assert gitea.hook_headers[("atlas/atlas", 1)] == f"Bearer {WEBHOOK_TOKEN}"
    # no HMAC secret: the EventSource checks the bearer header, nothing checks a signature
    assert gitea.hook_secrets[("atlas/atlas", 1)] == ""

    # Gitea shows the header as "": the fingerprint in the name tells it is the same
    again = _seed(values)
    assert again.stdout.strip() == "unchanged: webhook #1"
    assert [r.method for r in gitea.requests[-1:]] == ["GET"], "a second run only reads"


def test_the_name_holds_a_fingerprint_of_the_header_never_the_token(
    values: Path, gitea: GiteaDouble
) -> None:
    _seed(values)
    (hook,) = gitea.hooks["atlas/atlas"].values()
    name, mark = hook["name"].split(" ")
    assert name == HOOK_NAME and mark.startswith("bearer:scrypt:")
    assert WEBHOOK_TOKEN not in hook["name"]
    assert carries(hook["name"], f"Bearer {WEBHOOK_TOKEN}")
    assert not carries(hook["name"], "Bearer bearer-other")
    assert not carries(HOOK_NAME, f"Bearer {WEBHOOK_TOKEN}")
    # salted: the same token makes another fingerprint each time
    assert fingerprint("Bearer t") != fingerprint("Bearer t")


def test_a_new_token_in_the_secret_is_applied_without_rotate(
    values: Path, gitea: GiteaDouble
) -> None:
    _seed(values)
    changed = _seed(values, env={**ENV, "FABRIQUE_WEBHOOK_TOKEN": "bearer-new-0c1d"})
    assert changed.stdout.strip() == (
        "repaired: webhook #2 (authorization_header; recreated, #1 removed)"
    )
    assert gitea.hook_headers[("atlas/atlas", 2)] == "Bearer bearer-new-0c1d"
    assert "bearer-new-0c1d" not in changed.stdout + changed.stderr
    replay = _seed(values, env={**ENV, "FABRIQUE_WEBHOOK_TOKEN": "bearer-new-0c1d"})
    assert replay.stdout.strip() == "unchanged: webhook #2"


def test_a_hook_without_a_fingerprint_is_recreated_once(values: Path, gitea: GiteaDouble) -> None:
    """A hook made by hand, or by a fabrique that did not name it so: which token it
    sends cannot be known, so it is written once, then left alone."""
    _seed(values)
    gitea.hooks["atlas/atlas"][1]["name"] = HOOK_NAME
    repaired = _seed(values)
    assert repaired.stdout.strip() == (
        "repaired: webhook #2 (authorization_header; recreated, #1 removed)"
    )
    assert _seed(values).stdout.strip() == "unchanged: webhook #2"


def test_repairs_a_hook_edited_by_hand(values: Path, gitea: GiteaDouble) -> None:
    _seed(values)
    hook = gitea.hooks["atlas/atlas"][1]
    hook.update(events=["push", "pull_request"], active=False)
    repaired = _seed(values)
    assert repaired.exit_code == 0
    assert repaired.stdout.strip() == (
        "repaired: webhook #2 (events, active; recreated, #1 removed)"
    )
    hook = gitea.hooks["atlas/atlas"][2]
    assert hook["events"] == ["push"] and hook["active"] is True
    assert gitea.hook_headers[("atlas/atlas", 2)] == f"Bearer {WEBHOOK_TOKEN}"
    assert list(gitea.hooks["atlas/atlas"]) == [2]
    assert _seed(values).stdout.strip() == "unchanged: webhook #2"


def test_removes_duplicates_and_leaves_other_hooks(values: Path, gitea: GiteaDouble) -> None:
    _seed(values)
    gitea.hooks["atlas/atlas"][2] = {**gitea.hooks["atlas/atlas"][1], "id": 2}
    gitea.hooks["atlas/atlas"][3] = {
        **gitea.hooks["atlas/atlas"][1],
        "id": 3,
        "config": {"url": "http://argocd/webhook", "content_type": "json"},
    }
    result = _seed(values)
    assert result.stdout.splitlines() == [
        "unchanged: webhook #1",
        "removed: webhook #2 (a duplicate pointing at the same URL)",
    ]
    assert sorted(gitea.hooks["atlas/atlas"]) == [1, 3]


def test_rotate_rewrites_the_token(values: Path, gitea: GiteaDouble) -> None:
    _seed(values)
    rotated = _seed(values, "--rotate", env={**ENV, "FABRIQUE_WEBHOOK_TOKEN": "bearer-new-0c1d"})
    assert rotated.stdout.strip() == (
        "repaired: webhook #2 (authorization_header, token rotated; recreated, #1 removed)"
    )
    assert list(gitea.hooks["atlas/atlas"]) == [2]
    assert gitea.hook_headers[("atlas/atlas", 2)] == "Bearer bearer-new-0c1d"


def test_rotate_rewrites_a_header_changed_where_it_cannot_be_seen(
    values: Path, gitea: GiteaDouble
) -> None:
    """An API edit that omits the header clears it (editHook), and nothing shows it: the
    name still says the token was set. --rotate writes it again."""
    _seed(values)
    gitea.hook_headers[("atlas/atlas", 1)] = ""
    assert _seed(values).stdout.strip() == "unchanged: webhook #1"
    rotated = _seed(values, "--rotate")
    assert rotated.stdout.strip() == ("repaired: webhook #2 (token rotated; recreated, #1 removed)")
    assert gitea.hook_headers[("atlas/atlas", 2)] == f"Bearer {WEBHOOK_TOKEN}"


def test_a_secret_an_earlier_seeding_set_is_cleared(values: Path, gitea: GiteaDouble) -> None:
    """Gitea's PATCH ignores config.secret (editHook): only a new hook is sure to carry
    no HMAC secret, so a repair recreates the hook."""
    _seed(values)
    gitea.hook_secrets[("atlas/atlas", 1)] = "hmac-from-before"
    assert _seed(values, "--rotate").exit_code == 0
    (hook_id,) = gitea.hooks["atlas/atlas"]
    assert gitea.hook_secrets[("atlas/atlas", hook_id)] == ""


def test_a_patch_leaves_a_hooks_secret_as_gitea_does(gitea: GiteaDouble) -> None:
    auth = {"Authorization": f"token {GITEA_TOKEN}"}
    hooks = f"{gitea.url}/api/v1/repos/atlas/atlas/hooks"
    config = {"url": "http://es:12000/push", "content_type": "json", "secret": "hmac"}
    created = httpx.post(hooks, json={"type": "gitea", "config": config}, headers=auth).json()
    httpx.patch(
        f"{hooks}/{created['id']}", json={"config": {"secret": ""}, "active": True}, headers=auth
    )
    assert gitea.hook_secrets[("atlas/atlas", created["id"])] == "hmac"


def test_seeding_states_what_gitea_needs_to_deliver_in_cluster(
    values: Path, gitea: GiteaDouble
) -> None:
    for args in ((), ("--dry-run",)):
        result = _seed(values, *args)
        host = "gitea-eventsource-svc.fabrique.svc.cluster.local"
        assert "notice: Gitea delivers webhooks only to the hosts its ALLOWED_HOST_LIST" in (
            result.stderr
        )
        assert f"set [security] ALLOWED_HOST_LIST = external, {host} in app.ini" in result.stderr
        assert f"before Gitea 1.27, [webhook] ALLOWED_HOST_LIST = {host})" in result.stderr


def test_dry_run_changes_nothing(values: Path, gitea: GiteaDouble) -> None:
    result = _seed(values, "--dry-run")
    assert result.exit_code == 0
    assert result.stdout.strip().startswith("would be created: webhook")
    assert gitea.hooks["atlas/atlas"] == {}
    assert {r.method for r in gitea.requests} == {"GET"}


def test_missing_credentials_are_named(values: Path, gitea: GiteaDouble) -> None:
    result = run_cli(
        "--values", str(values), "seed-webhook", env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN}
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("error: FABRIQUE_WEBHOOK_TOKEN: not set")
    assert gitea.hooks["atlas/atlas"] == {}


def test_bodies_follow_gitea_create_and_edit_hook_options(values: Path, gitea: GiteaDouble) -> None:
    """The double checks every request body against CreateHookOption / EditHookOption."""
    _seed(values)
    gitea.hooks["atlas/atlas"][1]["active"] = False
    _seed(values)
    methods = [r.method for r in gitea.requests if "/hooks" in r.path]
    assert "POST" in methods and "DELETE" in methods and "PATCH" not in methods
    assert gitea.violations == []
    # the repair of `active` alone recreates the whole hook
    (hook,) = gitea.hooks["atlas/atlas"].values()
    assert (hook["events"], hook["branch_filter"]) == (["push"], "main")
    assert gitea.hook_headers[("atlas/atlas", hook["id"])] == f"Bearer {WEBHOOK_TOKEN}"
