"""fabrique's Gitea client against a real Gitea (``real_gitea``, ``tests/live/gitea.py``),
with a token of the scopes the README asks operators for.

The Gitea double (``tests/doubles/gitea.py``) is held to Gitea's Swagger document; these
hold fabrique to the program itself: its version, its Contents API (a stale sha is
still a stale write), its compare under the README's scopes, and a push delivered to
webhook #2 with its bearer token where ``[security] ALLOWED_HOST_LIST`` allows it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fabrique.clients.gitea import FileContent, GiteaClient, Identity
from fabrique.gestures.webhook import Credentials, desired
from fabrique.site.config import load_site
from fabrique.site.errors import StaleWrite
from fabrique.validate import GITEA_SWAGGER, find_specs

from ..conftest import ROOT, run_cli, write_values
from ..doubles.http import LoopbackServer, Request
from ..waits import until
from .gitea import Gitea
from .gitea import binary as gitea_binary

ORG = "atlas"
AUTHOR = Identity("fabrique", "fabrique@example.invalid")
TARGET = "deploy/overlays/prod/kustomization.yaml"


@pytest.fixture(scope="module")
def org(real_gitea: Gitea) -> str:
    return real_gitea.organization(ORG)


@pytest.fixture()
def repo(real_gitea: Gitea, org: str) -> str:
    """A new repository with one commit on main, made by the admin API."""
    name = f"app-{uuid.uuid4().hex[:8]}"
    with real_gitea.admin() as admin:
        made = admin.post(
            f"/admin/users/{org}/repos",
            json={"name": name, "auto_init": True, "default_branch": "main"},
        )
    assert made.status_code == 201, made.text
    return f"{org}/{name}"


@pytest.fixture()
def client(real_gitea: Gitea) -> Iterator[GiteaClient]:
    with GiteaClient(real_gitea.url, real_gitea.token) as opened:
        yield opened


def test_it_is_the_version_pinned_and_renders_the_release_templates(real_gitea: Gitea) -> None:
    lock = yaml.safe_load((ROOT / "vendor" / "lock.yaml").read_text())
    version = lock["peers"]["gitea"]["version"].removeprefix("v")
    assert httpx.get(f"{real_gitea.url}/api/v1/version").json() == {"version": version}
    # the Swagger document is a template of the release (templates/swagger/v1_json.tmpl),
    # read from the module cache through STATIC_ROOT_PATH
    served = httpx.get(f"{real_gitea.url}/swagger.v1.json")
    assert served.status_code == 200
    assert served.json()["info"]["version"] == version
    # what the double is checked against is what the real server serves
    assert served.json() == json.loads((find_specs() / GITEA_SWAGGER).read_text())


def test_it_starts_without_a_deprecated_setting(real_gitea: Gitea) -> None:
    """The app.ini the README gives operators: no key Gitea calls deprecated."""
    logged = "".join(p.read_text() for p in (real_gitea.folder / "log").glob("*.log"))
    logged += (real_gitea.folder / "console.log").read_text()
    assert "Deprecation" not in logged


def test_it_writes_nothing_in_the_home_of_the_user_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Gitea's first start rewrites ``~/.ssh/authorized_keys`` unless told not to, SSH
    off or not: the host would keep the file, and two Gitea starting at once on one
    machine race on its ``.tmp``, and one of them exits."""
    binary = gitea_binary()  # found in the peers' cache of the real home
    for name in ("GOMODCACHE", "GOCACHE"):  # start() reads the release's templates there
        said = subprocess.run(["go", "env", name], capture_output=True, text=True, check=True)
        monkeypatch.setenv(name, said.stdout.strip())
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    gitea = Gitea(tmp_path / "gitea", binary).start()
    try:
        assert not (home / ".ssh").exists(), sorted(p.name for p in (home / ".ssh").iterdir())
    finally:
        gitea.stop()


def test_a_file_put_through_the_contents_api_reads_back_through_fabrique(
    real_gitea: Gitea, repo: str, client: GiteaClient
) -> None:
    put = httpx.post(
        f"{real_gitea.url}/api/v1/repos/{repo}/contents/{TARGET}",
        headers={"Authorization": f"token {real_gitea.token}"},
        json={
            "branch": "main",
            "content": base64.b64encode(b"images: []\n").decode(),
            "message": "add the overlay",
        },
    )
    assert put.status_code == 201, put.text
    found = client.get_file(repo, TARGET, "main")
    assert found == FileContent(TARGET, "images: []\n", put.json()["content"]["sha"])
    assert client.branch_head(repo, "main") == put.json()["commit"]["sha"]
    assert client.get_file(repo, "deploy/missing.yaml", "main") is None


def test_a_write_on_a_stale_sha_is_a_stale_write_and_compare_orders_commits(
    repo: str, client: GiteaClient
) -> None:
    first = client.create_file(repo, TARGET, "main", "images: []\n", "add", AUTHOR)
    read = client.get_file(repo, TARGET, "main")
    assert read is not None
    second = client.update_file(repo, "main", read, "images: [a]\n", "pin", AUTHOR)
    # Gitea's own 422 messages, as fabrique reads them: re-read and re-apply
    with pytest.raises(StaleWrite, match="changed since it was read"):
        client.update_file(repo, "main", read, "images: [b]\n", "pin", AUTHOR)
    with pytest.raises(StaleWrite, match="changed since it was read"):
        client.create_file(repo, TARGET, "main", "images: []\n", "add", AUTHOR)
    # compare answers the README's token (write:repository, no other scope)
    assert client.is_ancestor(repo, first, second)
    assert not client.is_ancestor(repo, second, first)
    assert client.resolve_commit(repo, second[:12]) == second


def test_a_push_reaches_webhook_2_with_its_bearer_token(repo: str, client: GiteaClient) -> None:
    delivered: list[Request] = []

    def receive(request: Request) -> tuple[int, None]:
        delivered.append(request)
        return 200, None

    receiver = LoopbackServer(receive)
    receiver.start()
    try:
        hook = desired(load_site(env={}), Credentials("bearer-live-5e1d"))
        hook["config"]["url"] = f"{receiver.url}/push"
        client.create_hook(repo, hook)
        pushed = client.create_file(repo, TARGET, "main", "images: []\n", "add", AUTHOR)
        until(
            "Gitea's delivery of the push to the loopback hook", lambda: delivered, 20, every=0.05
        )
    finally:
        receiver.stop()
    (push,) = delivered
    assert push.headers["authorization"] == "Bearer bearer-live-5e1d"
    assert push.headers["x-gitea-event"] == "push"
    body: dict[str, Any] = push.json()
    assert (body["ref"], body["after"]) == ("refs/heads/main", pushed)


def test_seed_webhook_again_is_unchanged(real_gitea: Gitea, repo: str, tmp_path: Path) -> None:
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": real_gitea.url, "gitea.codeRepo": repo}
    )
    env = {"FABRIQUE_GITEA_TOKEN": real_gitea.token, "FABRIQUE_WEBHOOK_TOKEN": "bearer-live-5e1d"}
    first = run_cli("--values", str(values), "seed-webhook", env=env)
    assert first.exit_code == 0, first.stderr
    assert first.stdout.startswith("created: webhook #")
    again = run_cli("--values", str(values), "seed-webhook", env=env)
    for secret in env.values():
        assert secret not in first.stdout + first.stderr + again.stdout + again.stderr
    # Gitea shows the header as "": the fingerprint in the hook's name says it is the same
    assert again.stdout.startswith("unchanged: webhook #"), again.stdout
