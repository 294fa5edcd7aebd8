"""One contract, two servers: fabrique's Gitea client, its write-back through the Contents
API and its Gitea gestures against the double (``tests/doubles/gitea.py``) and against a
real Gitea (``real_gitea``, ``tests/live/gitea.py``).

Each test runs twice, ``[double]`` and ``[real]``, on repositories it makes for itself
(uniquely named: one real Gitea serves the session), their history pushed with git as a
developer pushes it. They read back through the server's API or through git, never
through the double's dictionaries, so that the same assertions hold the double to the
real server: where the two differ, the double is wrong, or fabrique read Gitea wrong.
fabrique's traffic to the real Gitea passes a proxy that checks it against the swagger
the double is held to (``SpecProxy``), so the checker is held to the real server too.

The last test makes every call fabrique makes, and the errors it reads, on both servers
at once and compares the answers field by field: the same status, fields, JSON types,
error messages and paging headers. The real side is marked ``live``: without Go it
skips, saying why (in CI it fails).
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import yaml

from fabrique.clients.gitea import CommitStatus, FileChange, FileContent, GiteaClient, Identity
from fabrique.decisions import review
from fabrique.gestures import mirrors
from fabrique.gestures.webhook import HOOK_NAME
from fabrique.site.config import Mirror, load_site
from fabrique.site.errors import GiteaError, StaleWrite, TargetError
from fabrique.site.names import webhook_service_url
from fabrique.site.retry import RetryPolicy

from . import servers
from .conftest import GITEA_TOKEN, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .doubles.proxy import SpecProxy
from .doubles.swagger import Swagger
from .gitrepo import make_commit
from .live.gitea import USER, Gitea
from .oci import push_image
from .waits import until

ORG = "atlas"
AUTHOR = Identity("fabrique", "fabrique@example.invalid")
APP = "dataops/citation-dagster"
TARGET = f"{APP}/deploy/overlays/prod/kustomization.yaml"
KUSTOMIZATION = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../base
"""
SEED = {
    f"{APP}/Dockerfile": "FROM scratch\nCOPY app.txt /\n",
    f"{APP}/app.txt": "citation\n",
    TARGET: KUSTOMIZATION,
    "README.md": "atlas\n",
}
RETRY = RetryPolicy(attempts=2, base_delay=0.01)
MAX_BLOB_SIZE = 10 * 1024 * 1024  # Gitea's [api] DEFAULT_MAX_BLOB_SIZE, on both servers
HOOK_URL = webhook_service_url("fabrique")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Clone:
    """A working clone of one repository of a server: what it commits is pushed at once."""

    def __init__(self, slug: str, work: Path, origin: str, env: dict[str, str]) -> None:
        self.slug = slug
        self.work = work
        self.env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", **env}
        subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
        self.git("remote", "add", "origin", origin)

    def git(self, *args: str, input_text: str | None = None, strip: bool = True) -> str:
        ident = ["-c", "user.name=seed", "-c", "user.email=seed@example.invalid"]
        out = subprocess.run(
            ["git", "-C", str(self.work), *ident, *args],
            input=input_text,
            capture_output=True,
            text=True,
            env=self.env,
            check=True,
        ).stdout
        return out.strip() if strip else out

    def pull(self) -> None:
        self.git("pull", "-q", "--ff-only", "origin", "main")

    def commit(
        self,
        files: dict[str, str],
        message: str = "change",
        *,
        remove: tuple[str, ...] = (),
        links: dict[str, str] | None = None,
    ) -> str:
        """Commit ``files`` (and remove, and symlink) on top of the server's main; pushed."""
        if self.git("ls-remote", "origin", "refs/heads/main"):
            self.pull()
        for path in remove:
            (self.work / path).unlink()
        for path, target in (links or {}).items():
            os.symlink(target, self.work / path)
        sha = make_commit(self.work, files, message)
        self.git("push", "-q", "origin", "HEAD:main")
        return sha

    def commits(self, count: int, path: str) -> list[str]:
        """``count`` commits each changing ``path``, pushed at once; their shas, oldest first."""
        self.pull()
        made = [make_commit(self.work, {path: f"v{n}\n"}, f"v{n}") for n in range(count)]
        self.git("push", "-q", "origin", "HEAD:main")
        return made

    def merge(self, ours: dict[str, str], theirs: dict[str, str]) -> tuple[str, str, str]:
        """A merge commit on main of a side branch that commits ``theirs``, main having
        committed ``ours`` meanwhile: (ours, theirs, merge), pushed."""
        self.pull()
        self.git("checkout", "-q", "-b", "side")
        side = make_commit(self.work, theirs, "their side")
        self.git("checkout", "-q", "main")
        main = make_commit(self.work, ours, "our side")
        self.git("merge", "-q", "--no-ff", "--no-edit", "side")
        self.git("branch", "-q", "-D", "side")
        self.git("push", "-q", "origin", "HEAD:main")
        return main, side, self.head()

    def orphan(self, files: dict[str, str], branch: str = "orphan") -> str:
        """A commit sharing no history with main, pushed as ``branch``."""
        entries = "".join(
            f"100644 blob {self.git('hash-object', '-w', '--stdin', input_text=text)}\t{path}\n"
            for path, text in files.items()
        )
        tree = self.git("mktree", input_text=entries)
        sha = self.git("commit-tree", tree, "-m", "another history")
        self.git("push", "-q", "origin", f"{sha}:refs/heads/{branch}")
        return sha

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")

    def remote_head(self, branch: str = "main") -> str:
        return self.git("ls-remote", "origin", f"refs/heads/{branch}").split()[0]

    def show(self, path: str) -> str:
        """``path`` at the server's main."""
        self.git("fetch", "-q", "origin", "main")
        return self.git("show", f"FETCH_HEAD:{path}", strip=False)

    def blob(self, path: str) -> str:
        self.git("fetch", "-q", "origin", "main")
        return self.git("rev-parse", f"FETCH_HEAD:{path}")


class Server(Protocol):
    """A Gitea that fabrique is pointed at, and what a test sets up on it."""

    name: str
    url: str  # what fabrique is given
    token: str  # fabrique's token: the README's scopes

    def repo(self, files: dict[str, str]) -> Clone:
        """A new private repository of the organization, ``files`` its first commit."""

    def token_with(self, *scopes: str) -> str:
        """A new token of fabrique's user, with only ``scopes``."""

    def outsider(self) -> str:
        """The token of a user who is no member of the organization."""

    def git_url(self) -> AbstractContextManager[str]:
        """Where the git transport finds the repositories (``writeback.gitUrl``)."""

    def protect(self, slug: str, branch: str, checks: list[str], *, pushes: bool = False) -> None:
        """Protect ``branch``: nobody pushes to it (``pushes``: anyone who may write
        does); a pull request into it merges once the commit statuses ``checks`` are
        green on its head."""

    def merge_failed(self, slug: str, number: int) -> bool:
        """Whether Gitea has tried the scheduled merge of pull request ``number`` and
        failed (it says so in its log alone: the pull request stays open, scheduled)."""


class DoubleServer:
    name = "double"

    def __init__(self, double: GiteaDouble, root: Path) -> None:
        self.double = double
        self.root = root
        self.url = double.url
        self.token = GITEA_TOKEN

    def repo(self, files: dict[str, str]) -> Clone:
        slug = f"{ORG}/{unique('app')}"
        bare = self.root / f"{slug}.git"
        bare.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
        self.double.add_repo(slug, bare)
        clone = Clone(slug, self.root / "work" / slug, str(bare), {})
        clone.commit(files, "seed")
        return clone

    def token_with(self, *scopes: str) -> str:
        return self.double.add_token(scopes)

    def protect(self, slug: str, branch: str, checks: list[str], *, pushes: bool = False) -> None:
        self.double.protect(slug, branch, checks=checks)
        if pushes:
            self.double.protected.pop((slug, branch))  # the required checks alone

    def merge_failed(self, slug: str, number: int) -> bool:
        return bool(self.double.pulls[slug][number - 1].get("merge_failed"))

    def outsider(self) -> str:
        return self.double.add_token(["write:repository"], member=False)

    @contextmanager
    def git_url(self) -> Iterator[str]:
        """The double serves no git: a git daemon serves its bare repositories."""
        with servers.git_daemon(self.root) as daemon:
            yield daemon.url("")[:-1]


class RealServer:
    name = "real"

    def __init__(self, gitea: Gitea, proxy: SpecProxy, root: Path) -> None:
        self.gitea = gitea
        self.root = root
        self.url = proxy.url
        self.token = gitea.token
        gitea.organization(ORG)

    def repo(self, files: dict[str, str]) -> Clone:
        slug = f"{ORG}/{unique('app')}"
        with self.gitea.admin() as admin:
            made = admin.post(
                f"/admin/users/{ORG}/repos",
                json={"name": slug.split("/")[1], "default_branch": "main", "private": True},
            )
        assert made.status_code == 201, made.text
        # the token reaches git as fabrique's git transport passes it: never in argv
        env = {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: token {self.token}",
        }
        clone = Clone(slug, self.root / "work" / slug, f"{self.gitea.url}/{slug}.git", env)
        clone.commit(files, "seed")
        self._settled(slug)
        return clone

    def _settled(self, slug: str) -> None:
        """Wait until Gitea has taken in the first push. Its hook records the branch
        at once, but the repository stays marked empty a moment longer, and an API call in
        between finds the branch with no git repository opened: Gitea 1.27.3 panics (500)."""
        with self.gitea.admin() as admin:
            until(
                f"{slug} to be no longer empty after a push",
                lambda: admin.get(f"/repos/{slug}").json().get("empty") is False,
                30,
                every=0.02,
            )

    def token_with(self, *scopes: str) -> str:
        return self._token(USER, scopes)

    def protect(self, slug: str, branch: str, checks: list[str], *, pushes: bool = False) -> None:
        rule = {"branch_name": branch, "rule_name": branch, "enable_push": pushes}
        rule |= {"enable_status_check": True, "status_check_contexts": checks}
        with self.gitea.admin() as admin:
            made = admin.post(f"/repos/{slug}/branch_protections", json=rule)
        assert made.status_code == 201, made.text

    @contextmanager
    def git_url(self) -> Iterator[str]:
        """Gitea's own smart HTTP, with the token as fabrique's git transport sends it."""
        yield self.gitea.url

    def merge_failed(self, slug: str, number: int) -> bool:
        """doMergeStyleFastForwardOnly (and the other styles' merges) log the pull
        request, ``<PullRequest [id]<slug>#<number>[base...head]>``, when the merge fails."""
        log = self.gitea.folder / "log" / "gitea.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return any(
            f"{slug}#{number}[" in line and "Unable to merge tracking into base" in line
            for line in text.splitlines()
        )

    def outsider(self) -> str:
        name = unique("outsider")
        with self.gitea.admin() as admin:
            made = admin.post(
                "/admin/users",
                json={
                    "username": name,
                    "email": f"{name}@example.invalid",
                    "password": uuid.uuid4().hex,
                    "must_change_password": False,
                },
            )
        assert made.status_code == 201, made.text
        return self._token(name, ("write:repository",))

    def _token(self, user: str, scopes: tuple[str, ...]) -> str:
        """A new token of ``user``, made by the site admin for it."""
        with self.gitea.admin() as admin:
            made = admin.post(
                f"/users/{user}/tokens", json={"name": unique("token"), "scopes": list(scopes)}
            )
        assert made.status_code == 201, made.text
        return str(made.json()["sha1"])


@pytest.fixture(params=["double", pytest.param("real", marks=pytest.mark.live)])
def server(
    request: pytest.FixtureRequest, gitea_swagger: Swagger, tmp_path: Path
) -> Iterator[Server]:
    if request.param == "double":
        double = GiteaDouble(gitea_swagger, {}, token=GITEA_TOKEN).start()
        try:
            yield DoubleServer(double, tmp_path / "srv")
        finally:
            double.stop()
        assert double.violations == [], "the Gitea double saw traffic outside Gitea's spec"
        return
    real: Gitea = request.getfixturevalue("real_gitea")
    proxy = SpecProxy(real.url, gitea_swagger).start()
    try:
        yield RealServer(real, proxy, tmp_path / "srv")
    finally:
        proxy.stop()
    assert proxy.violations == [], "Gitea answered fabrique outside the swagger the double keeps"


@pytest.fixture()
def client(server: Server) -> Iterator[GiteaClient]:
    with GiteaClient(server.url, server.token, retry=RETRY) as opened:
        yield opened


def api(server: Server, token: str | None = None, scheme: str = "token") -> httpx.Client:
    """The server's API as a person calls it (a hand edit, a raw answer to look at)."""
    return httpx.Client(
        base_url=f"{server.url}/api/v1",
        headers={"Authorization": f"{scheme} {token or server.token}"},
        timeout=30,
    )


# -- reads ---------------------------------------------------------------------------------


def test_the_branch_head_and_a_file_read_as_git_has_them(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo(SEED)
    assert client.branch_head(repo.slug, "main") == repo.head()
    found = client.get_file(repo.slug, TARGET, "main")
    assert found == FileContent(TARGET, KUSTOMIZATION, repo.blob(TARGET))
    assert client.get_file(repo.slug, f"{APP}/missing.yaml", "main") is None
    with pytest.raises(GiteaError, match=r"branch 'gone' of .*: not found in Gitea"):
        client.get_file(repo.slug, TARGET, "gone")
    with pytest.raises(GiteaError, match="not found in Gitea"):
        client.branch_head(repo.slug, "gone")


@pytest.mark.parametrize(("path", "kind"), [(APP, "directory"), ("link.yaml", "symlink")])
def test_a_target_that_is_no_file_is_named_as_gitea_shows_it(
    server: Server, client: GiteaClient, path: str, kind: str
) -> None:
    repo = server.repo(SEED)
    repo.commit({}, "a symlink", links={"link.yaml": "README.md"})
    with pytest.raises(TargetError, match=f"is a {kind}, not a file"):
        client.get_file(repo.slug, path, "main")
    with pytest.raises(TargetError, match=f"{path} in .*: is a {kind}, not a file"):
        client.get_files(repo.slug, [TARGET, path], "main")


def test_a_file_above_the_max_blob_size_is_refused_by_name(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo({**SEED, "big.yaml": "#" * (MAX_BLOB_SIZE + 1)})
    with pytest.raises(TargetError, match=f"{MAX_BLOB_SIZE + 1} bytes, more than Gitea sends"):
        client.get_file(repo.slug, "big.yaml", "main")
    with pytest.raises(TargetError, match=f"{MAX_BLOB_SIZE + 1} bytes, more than Gitea sends"):
        client.get_files(repo.slug, [TARGET, "big.yaml"], "main")


def test_files_are_read_together_and_a_missing_one_is_none(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo(SEED)
    missing = f"{APP}/missing.yaml"
    found = client.get_files(repo.slug, [TARGET, missing, "README.md", TARGET], "main")
    assert found == {
        TARGET: FileContent(TARGET, KUSTOMIZATION, repo.blob(TARGET)),
        missing: None,
        "README.md": FileContent("README.md", "atlas\n", repo.blob("README.md")),
    }
    assert client.get_files(repo.slug, [missing], "main") == {missing: None}
    with pytest.raises(GiteaError, match=r"branch 'gone' of .*: not found in Gitea"):
        client.get_files(repo.slug, [TARGET], "gone")
    with pytest.raises(GiteaError, match=r"branch 'gone' of .*: not found in Gitea"):
        client.get_files(repo.slug, [missing], "gone")


# -- writes --------------------------------------------------------------------------------


def test_a_file_is_created_then_updated_and_a_stale_write_is_stale(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo(SEED)
    created = client.create_file(repo.slug, "deploy/k.yaml", "main", "images: []\n", "add", AUTHOR)
    assert created == repo.remote_head()
    read = client.get_file(repo.slug, "deploy/k.yaml", "main")
    assert read is not None and read.text == "images: []\n"
    updated = client.update_file(repo.slug, "main", read, "images: [a]\n", "pin", AUTHOR)
    assert updated == repo.remote_head() and repo.show("deploy/k.yaml") == "images: [a]\n"
    assert repo.git("log", "-1", "--format=%an <%ae> %s", updated) == (
        "fabrique <fabrique@example.invalid> pin"
    )
    with pytest.raises(StaleWrite, match=r"changed since it was read \(HTTP 422\)"):
        client.update_file(repo.slug, "main", read, "images: [b]\n", "pin", AUTHOR)
    with pytest.raises(StaleWrite, match=r"changed since it was read \(HTTP 422\)"):
        client.create_file(repo.slug, "deploy/k.yaml", "main", "images: []\n", "add", AUTHOR)
    assert repo.remote_head() == updated


def test_a_file_deleted_since_it_was_read_is_a_stale_write(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo(SEED)
    read = client.get_file(repo.slug, TARGET, "main")
    assert read is not None
    repo.commit({}, "deleted meanwhile", remove=(TARGET,))
    with pytest.raises(StaleWrite, match=r"gone since it was read \(HTTP 404\)"):
        client.update_file(repo.slug, "main", read, "images: [x]\n", "pin", AUTHOR)


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        (APP, f"a directory exists where you\u2019re trying to create a file [path: {APP}]"),
        ("README.md/k.yaml", "a file exists where you\u2019re trying to create a subdirectory"),
    ],
)
def test_a_path_gitea_cannot_write_is_refused_with_its_reason(
    server: Server, client: GiteaClient, path: str, reason: str
) -> None:
    repo = server.repo(SEED)
    with pytest.raises(TargetError, match=r"Gitea refused the write \(HTTP 422\)") as refused:
        client.create_file(repo.slug, path, "main", "images: []\n", "add", AUTHOR)
    assert reason in str(refused.value)
    assert repo.remote_head() == repo.head()


def test_a_write_to_a_missing_branch_is_named(server: Server, client: GiteaClient) -> None:
    repo = server.repo(SEED)
    with pytest.raises(GiteaError, match="branch or repository not found"):
        client.create_file(repo.slug, "new.yaml", "gone", "a: 1\n", "add", AUTHOR)
    with pytest.raises(GiteaError, match="branch or repository not found"):
        client.change_files(
            repo.slug, "gone", [FileChange("new.yaml", "a: 1\n", None)], "add", AUTHOR
        )


def _read(client: GiteaClient, repo: Clone, *paths: str) -> list[FileContent]:
    found = client.get_files(repo.slug, paths, "main")
    assert None not in found.values()
    return [content for content in found.values() if content is not None]


def test_files_are_updated_and_created_in_one_commit(server: Server, client: GiteaClient) -> None:
    repo = server.repo(SEED)
    before = repo.remote_head()
    target, readme = _read(client, repo, TARGET, "README.md")
    changes = [
        FileChange(TARGET, "images: [a]\n", target.sha),
        FileChange("README.md", "atlas, pinned\n", readme.sha),
        FileChange("deploy/new.yaml", "images: []\n", None),
    ]
    commit = client.change_files(repo.slug, "main", changes, "pin three", AUTHOR)
    assert commit == repo.remote_head() == client.branch_head(repo.slug, "main")
    assert [client.get_file(repo.slug, c.path, "main") for c in changes] == [
        FileContent(c.path, c.text, repo.blob(c.path)) for c in changes
    ]
    assert repo.git("rev-list", "--parents", f"{before}..{commit}") == f"{commit} {before}"
    assert repo.git("log", "-1", "--format=%an <%ae> %cn <%ce> %s", commit) == (
        "fabrique <fabrique@example.invalid> fabrique <fabrique@example.invalid> pin three"
    )
    changed = repo.git("diff", "--name-only", before, commit).splitlines()
    assert sorted(changed) == sorted(c.path for c in changes)


def test_a_stale_lease_in_a_batch_writes_none_of_it(server: Server, client: GiteaClient) -> None:
    repo = server.repo(SEED)
    target, readme = _read(client, repo, TARGET, "README.md")
    moved = repo.commit({"README.md": "moved meanwhile\n"}, "a rival")
    fresh = FileChange(TARGET, "images: [a]\n", target.sha)
    stale = FileChange("README.md", "atlas, pinned\n", readme.sha)
    created = FileChange("deploy/new.yaml", "images: []\n", None)
    with pytest.raises(StaleWrite, match=r"changed since it was read \(HTTP 422\)"):
        client.change_files(repo.slug, "main", [fresh, stale, created], "pin", AUTHOR)
    assert repo.remote_head() == moved, "no commit made"
    assert client.get_files(repo.slug, [TARGET, created.path], "main") == {
        TARGET: target,
        created.path: None,
    }
    deleted = repo.commit({}, "deleted meanwhile", remove=(TARGET,))
    with pytest.raises(StaleWrite, match=r"gone since it was read \(HTTP 404\)"):
        client.change_files(repo.slug, "main", [created, fresh], "pin", AUTHOR)
    assert repo.remote_head() == deleted, "no commit made"


def test_a_batch_creating_a_file_that_exists_is_stale(server: Server, client: GiteaClient) -> None:
    repo = server.repo(SEED)
    (target,) = _read(client, repo, TARGET)
    fresh = FileChange(TARGET, "images: [a]\n", target.sha)
    existing = FileChange("README.md", "atlas, again\n", None)
    with pytest.raises(StaleWrite, match=r"changed since it was read \(HTTP 422\)"):
        client.change_files(repo.slug, "main", [fresh, existing], "pin", AUTHOR)
    with pytest.raises(TargetError, match=r"README.md/k.yaml in .*: Gitea refused the write"):
        client.change_files(
            repo.slug, "main", [FileChange("README.md/k.yaml", "a\n", None)], "add", AUTHOR
        )
    assert repo.remote_head() == repo.head()
    assert client.get_files(repo.slug, [TARGET, "README.md"], "main") == {
        TARGET: FileContent(TARGET, KUSTOMIZATION, target.sha),
        "README.md": FileContent("README.md", "atlas\n", repo.blob("README.md")),
    }


# -- history -------------------------------------------------------------------------------


def test_commits_by_path_come_in_pages_of_50_with_gitea_s_headers(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo(SEED)
    first = repo.head()
    made = repo.commits(60, f"{APP}/app.txt")
    repo.commit({"README.md": "elsewhere\n"})
    query = {"sha": "main", "path": APP, "limit": "50", "files": "true", "stat": "false"}
    with api(server) as raw:
        page = raw.get(f"/repos/{repo.slug}/commits", params=query)
        last = raw.get(f"/repos/{repo.slug}/commits", params={**query, "page": "2"})
        nowhere = raw.get(f"/repos/{repo.slug}/commits", params={**query, "path": "nowhere"})
        none_since = raw.get(f"/repos/{repo.slug}/commits", params={**query, "not": repo.head()})
    assert len(page.json()) == 50
    assert page.headers["X-Total-Count"] == "61"
    assert (page.headers["X-Page"], page.headers["X-PerPage"]) == ("1", "50")
    assert (page.headers["X-PageCount"], page.headers["X-HasMore"]) == ("2", "true")
    assert 'rel="next"' in page.headers["Link"] and "page=2" in page.headers["Link"]
    assert len(last.json()) == 11 and last.headers["X-HasMore"] == "false"
    assert 'rel="prev"' in last.headers["Link"]
    assert nowhere.status_code == 404, "no commit touches the path"
    assert none_since.status_code == 404, "none since the head"
    listed = [sha for sha, _ in client.commits_touching(repo.slug, APP, start="main")]
    assert listed == [*reversed(made), first], "every page read, newest first"
    assert client.last_change(repo.slug, "main", "nowhere", frozenset()) is None
    assert client.files_changed(repo.slug, made[-1], repo.head(), APP) == []
    assert client.files_changed(repo.slug, made[0], made[1], APP) == [f"{APP}/app.txt"]


def test_writers_of_one_branch_at_once_each_land_their_file(
    server: Server, client: GiteaClient
) -> None:
    """Twelve writes of one branch at the same moment, each its own file, as twelve builds
    of one push writing per app: Gitea's pushes of its own race at the branch's ref, and
    each loser is told so (a 500, or a 403 with the ref lock's message: never a refused
    token), so that a re-read lands it."""
    repo = server.repo(SEED)
    writers = 12

    def write(n: int) -> int:
        # each round of lost races lands at least its winner: twelve writers need twelve
        # rounds at most, asked again at once (a re-read is what a write-back does)
        for attempt in range(1, 3 * writers):
            try:
                client.create_file(
                    repo.slug, f"deploy/w{n}.txt", "main", f"{n}\n", f"writer {n}", AUTHOR
                )
                return attempt
            except StaleWrite:
                continue
        raise AssertionError(f"writer {n} never landed in {3 * writers - 1} attempts")

    with ThreadPoolExecutor(writers) as pool:
        attempts = list(pool.map(write, range(writers)))
    repo.pull()
    for n in range(writers):
        assert repo.show(f"deploy/w{n}.txt") == f"{n}\n"
    print(f"attempts per writer: {attempts}")


def test_a_missing_start_of_a_listing_is_an_error_not_no_change(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo(SEED)
    # with `path`, Gitea hands the revision to git, which fails: a 500, not "no change"
    with pytest.raises(GiteaError, match="HTTP 500"):
        client.files_changed(repo.slug, repo.head(), "f" * 40, APP)
    with pytest.raises(GiteaError, match="HTTP 500"):
        client.last_change(repo.slug, "gone", APP, frozenset())


def test_a_merge_s_files_are_those_it_changed_against_its_first_parent(
    server: Server, client: GiteaClient
) -> None:
    """A merge that brings in only the deployed file (ignored) is no change of the app;
    the commit of main before it, which changed the app's code, is."""
    repo = server.repo(SEED)
    since = repo.head()
    ours, theirs, merge = repo.merge({f"{APP}/app.txt": "ours\n"}, {TARGET: "images: []\n"})
    assert client.last_change(repo.slug, "main", APP, frozenset({TARGET})) == ours
    assert client.last_change(repo.slug, "main", APP, frozenset()) == merge
    listed = dict(client.commits_touching(repo.slug, APP, start="main"))
    assert listed[merge] == [TARGET] and listed[ours] == [f"{APP}/app.txt"]
    commits = client.commits_since(repo.slug, merge, since)
    assert commits is not None
    assert (commits[0].sha, commits[0].parents) == (merge, (ours, theirs))
    assert {c.sha for c in commits} == {merge, ours, theirs}


def test_compare_orders_commits_and_fails_closed_on_unrelated_histories(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo(SEED)
    older = repo.head()
    newer = repo.commit({"README.md": "next\n"})
    assert client.is_ancestor(repo.slug, older, newer) is True
    assert client.is_ancestor(repo.slug, newer, older) is False
    assert client.is_ancestor(repo.slug, newer, newer) is True
    orphan = repo.orphan({"README.md": "another history\n"})
    with api(server) as raw:
        # GetCompareInfo: no merge base, no commit listed, and 200 all the same
        unrelated = raw.get(f"/repos/{repo.slug}/compare/{newer}...{orphan}")
    assert unrelated.status_code == 200
    assert unrelated.json()["total_commits"] == 0
    assert client.is_ancestor(repo.slug, orphan, newer) is False
    assert client.is_ancestor(repo.slug, newer, orphan) is False


def test_a_commit_resolves_by_its_short_sha_and_a_name_that_is_none_is_none(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo(SEED)
    head = repo.head()
    assert client.resolve_commit(repo.slug, head[:12]) == head
    assert client.resolve_commit(repo.slug, "main") == head
    assert client.resolve_commit(repo.slug, "1.4.2") is None
    assert client.resolve_commit(repo.slug, "f" * 40) is None
    with api(server) as raw:
        answer = raw.get(f"/repos/{repo.slug}/git/commits/not-a-branch")
    assert answer.status_code == 404
    assert answer.json()["message"] == "commit doesn't exist: not-a-branch"


# -- commit statuses -----------------------------------------------------------------------


def test_statuses_are_posted_and_the_latest_of_each_context_read_back(
    server: Server, client: GiteaClient
) -> None:
    repo = server.repo(SEED)
    head = repo.head()
    assert client.latest_statuses(repo.slug, head) == {}
    with api(server) as raw:
        none = raw.get(f"/repos/{repo.slug}/commits/{head}/status").json()
    assert (none["state"], none["total_count"]) == ("pending", 0)
    assert not none["statuses"]
    build = "fabrique/build"
    client.create_status(repo.slug, head, CommitStatus(build, "pending", "building"))
    done = CommitStatus(build, "success", "built", "http://argo.invalid/workflows/x")
    client.create_status(repo.slug, head, done)
    deploy = CommitStatus("fabrique/deploy", "failure", "write-back refused")
    client.create_status(repo.slug, head, deploy)
    latest = client.latest_statuses(repo.slug, head)
    assert latest == {build: done, deploy.context: deploy}
    # when each was posted, on Gitea's clock (a verification's timeout counts from it)
    for found in latest.values():
        posted = datetime.fromisoformat(found.created_at)
        assert abs(datetime.now(UTC) - posted) < timedelta(minutes=10), found.created_at
    with api(server) as raw:
        combined = raw.get(f"/repos/{repo.slug}/commits/{head}/status").json()
        every = raw.get(f"/repos/{repo.slug}/commits/{head}/statuses").json()
    assert (combined["state"], combined["total_count"]) == ("failure", 2)
    assert len(every) == 3
    # Gitea answers 500 to a status on a commit it cannot find: not a failure to retry
    with pytest.raises(GiteaError, match="commit not found in Gitea") as missing:
        client.create_status(repo.slug, "f" * 40, CommitStatus(build, "pending"))
    assert not missing.value.transient


def test_more_than_fifty_contexts_on_one_commit_are_all_read(
    server: Server, client: GiteaClient
) -> None:
    """One push builds every app on one commit, each under its own context. Gitea answers
    the combined status a page at a time, at most 50 contexts (MaxResponseItems), the
    most recently updated first (GetLatestCommitStatus: ``max(id) desc``), the count of
    every context in X-Total-Count; the client reads every page."""
    repo = server.repo(SEED)
    head = repo.head()
    contexts = [f"fabrique/app-{n:02d}" for n in range(55)]
    for name in contexts:
        client.create_status(repo.slug, head, CommitStatus(name, "pending", "building"))
    done = CommitStatus(contexts[0], "success", "built")
    client.create_status(repo.slug, head, done)  # the oldest context is now the newest
    latest = client.latest_statuses(repo.slug, head)
    assert set(latest) == set(contexts)
    assert latest[done.context] == done
    assert {s.state for name, s in latest.items() if name != done.context} == {"pending"}
    seen = [status for page in client.status_pages(repo.slug, head) for status in page]
    assert next(s for s in seen if s.context == contexts[1]) == latest[contexts[1]]
    assert "fabrique/none" not in {s.context for s in seen}
    url = f"/repos/{repo.slug}/commits/{head}/status"
    with api(server) as raw:
        first = raw.get(url, params={"limit": "100"})  # more than 50 is 50
        second = raw.get(url, params={"limit": "50", "page": "2"})
        default = raw.get(url)  # [api] DEFAULT_PAGING_NUM
        every = raw.get(f"/repos/{repo.slug}/commits/{head}/statuses", params={"limit": "50"})
    on_first = [s["context"] for s in first.json()["statuses"]]
    assert (len(on_first), first.json()["total_count"]) == (50, 50)
    assert first.headers["X-Total-Count"] == "55"
    assert done.context in on_first
    assert sorted(s["context"] for s in second.json()["statuses"]) == contexts[1:6]
    assert (second.json()["total_count"], second.headers["X-Total-Count"]) == (5, "55")
    assert len(default.json()["statuses"]) == 30
    assert (len(every.json()), every.headers["X-Total-Count"]) == (50, "56")
    assert 'rel="next"' in first.headers["Link"] and 'rel="next"' not in second.headers["Link"]


# -- webhook #2 ----------------------------------------------------------------------------


def _seed_webhook(server: Server, repo: str, tmp_path: Path, *args: str, token: str) -> str:
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": server.url, "gitea.codeRepo": repo}
    )
    env = {"FABRIQUE_GITEA_TOKEN": server.token, "FABRIQUE_WEBHOOK_TOKEN": token}
    result = run_cli("--values", str(values), "seed-webhook", *args, env=env)
    assert result.exit_code == 0, result.stderr
    for secret in env.values():
        assert secret not in result.stdout + result.stderr
    return result.stdout.strip()


def _hooks(server: Server, repo: str) -> list[dict[str, Any]]:
    with api(server) as raw:
        answer = raw.get(f"/repos/{repo}/hooks")
    assert answer.status_code == 200, answer.text
    return list(answer.json())


def test_seed_webhook_creates_then_changes_nothing(server: Server, tmp_path: Path) -> None:
    repo = server.repo(SEED)
    created = _seed_webhook(server, repo.slug, tmp_path, token="bearer-1a2b")
    assert created.startswith("created: webhook #")
    (hook,) = _hooks(server, repo.slug)
    assert created == f"created: webhook #{hook['id']} ({HOOK_URL}, push on main)"
    assert hook["type"] == "gitea" and hook["name"].startswith(HOOK_NAME)
    assert hook["config"] == {"url": HOOK_URL, "content_type": "json"}
    assert (hook["events"], hook["branch_filter"], hook["active"]) == (["push"], "main", True)
    # Gitea never shows the header it stores, nor anything else that holds the token
    assert hook["authorization_header"] == ""
    assert "bearer-1a2b" not in str(hook)
    again = _seed_webhook(server, repo.slug, tmp_path, token="bearer-1a2b")
    assert again == f"unchanged: webhook #{hook['id']}"
    assert _hooks(server, repo.slug) == [hook]


def test_seed_webhook_repairs_a_hook_edited_by_hand(server: Server, tmp_path: Path) -> None:
    repo = server.repo(SEED)
    _seed_webhook(server, repo.slug, tmp_path, token="bearer-1a2b")
    (hook,) = _hooks(server, repo.slug)
    with api(server) as raw:  # the settings page sends every field; the API may not
        edited = raw.patch(
            f"/repos/{repo.slug}/hooks/{hook['id']}",
            json={"events": ["push", "create"], "branch_filter": "main", "active": False},
        )
    assert edited.status_code == 200, edited.text
    repaired = _seed_webhook(server, repo.slug, tmp_path, token="bearer-1a2b")
    (new,) = _hooks(server, repo.slug)
    assert repaired == (
        f"repaired: webhook #{new['id']} (events, active; recreated, #{hook['id']} removed)"
    )
    assert (new["events"], new["active"]) == (["push"], True)
    assert _seed_webhook(server, repo.slug, tmp_path, token="bearer-1a2b") == (
        f"unchanged: webhook #{new['id']}"
    )


def test_seed_webhook_applies_a_new_token_and_rotate_rewrites_it(
    server: Server, tmp_path: Path
) -> None:
    repo = server.repo(SEED)
    _seed_webhook(server, repo.slug, tmp_path, token="bearer-1a2b")
    (first,) = _hooks(server, repo.slug)
    # the Secret holds a new token: the hook is found to carry another one
    changed = _seed_webhook(server, repo.slug, tmp_path, token="bearer-3c4d")
    (second,) = _hooks(server, repo.slug)
    assert changed == (
        f"repaired: webhook #{second['id']} (authorization_header; recreated, "
        f"#{first['id']} removed)"
    )
    assert _seed_webhook(server, repo.slug, tmp_path, token="bearer-3c4d") == (
        f"unchanged: webhook #{second['id']}"
    )
    rotated = _seed_webhook(server, repo.slug, tmp_path, "--rotate", token="bearer-3c4d")
    (third,) = _hooks(server, repo.slug)
    assert rotated == (
        f"repaired: webhook #{third['id']} (token rotated; recreated, #{second['id']} removed)"
    )
    assert "bearer-3c4d" not in str(_hooks(server, repo.slug))


def test_seed_webhook_removes_duplicates_and_leaves_other_hooks(
    server: Server, tmp_path: Path
) -> None:
    repo = server.repo(SEED)
    _seed_webhook(server, repo.slug, tmp_path, token="bearer-1a2b")
    (hook,) = _hooks(server, repo.slug)
    with api(server) as raw:
        body = {"type": "gitea", "config": {"url": HOOK_URL, "content_type": "json"}}
        twin = raw.post(f"/repos/{repo.slug}/hooks", json=body).json()
        other = {
            "type": "gitea",
            "config": {"url": "http://argocd.invalid/hook", "content_type": "json"},
        }
        argocd = raw.post(f"/repos/{repo.slug}/hooks", json=other).json()
    result = _seed_webhook(server, repo.slug, tmp_path, token="bearer-1a2b")
    assert result.splitlines() == [
        f"unchanged: webhook #{hook['id']}",
        f"removed: webhook #{twin['id']} (a duplicate pointing at the same URL)",
    ]
    assert sorted(h["id"] for h in _hooks(server, repo.slug)) == [hook["id"], argocd["id"]]


# -- mirrors -------------------------------------------------------------------------------


def test_a_mirror_is_created_left_unchanged_repaired_and_synced(
    server: Server, client: GiteaClient, tmp_path: Path
) -> None:
    """``fabrique mirror`` takes only https:// sources (GitHub); the gesture itself runs
    here on a git daemon's, which Gitea clones from loopback as it would from GitHub."""
    upstream = tmp_path / "upstream"
    init = ["git", "init", "-q", "--bare", "-b", "main"]
    subprocess.run([*init, str(upstream / "cluster.git")], check=True)
    source = Clone("upstream", tmp_path / "upstream-work", str(upstream / "cluster.git"), {})
    source.commit({"README.md": "cluster\n"})
    slug = f"{ORG}/{unique('mirror')}"
    site = load_site(env={})
    with servers.git_daemon(upstream) as daemon:
        mirror = Mirror.model_construct(repo=slug, source=daemon.url("cluster.git"), interval="10m")
        created = mirrors.ensure(site, client, mirror, dry_run=False)
        assert created.line() == (
            f"created: {slug} (pull mirror of {daemon.url('cluster.git')} every 10m)"
        )
        assert mirrors.ensure(site, client, mirror, dry_run=False).line() == f"unchanged: {slug}"
        with api(server) as raw:
            shown = raw.get(f"/repos/{slug}").json()
            edited = raw.patch(f"/repos/{slug}", json={"mirror_interval": "8h"})
        assert (shown["mirror"], shown["private"], shown["mirror_interval"]) == (
            True,
            True,
            "10m0s",
        )
        assert shown["original_url"] == daemon.url("cluster.git")
        assert edited.status_code == 200, edited.text
        repaired = mirrors.ensure(site, client, mirror, dry_run=False)
        assert repaired.line() == f"repaired: {slug} (interval 8h0m0s -> 10m)"
        assert mirrors.ensure(site, client, mirror, dry_run=False).line() == f"unchanged: {slug}"
        assert mirrors.sync(client, mirror).line() == f"synced: {slug}"


# -- tokens --------------------------------------------------------------------------------


def test_a_token_without_the_scope_is_named_with_the_scope_it_lacks(
    server: Server,
) -> None:
    repo = server.repo(SEED)
    token = server.token_with("read:repository")
    with GiteaClient(server.url, token, retry=RETRY) as reader:
        assert reader.branch_head(repo.slug, "main") == repo.head()
        with pytest.raises(GiteaError) as refused:
            reader.create_file(repo.slug, "new.yaml", "main", "a: 1\n", "add", AUTHOR)
        # file-contents is a read, but a POST: Gitea's tokenRequiresScopes asks write of it
        with pytest.raises(GiteaError, match=r"lacks the scope write:repository \(HTTP 403\)"):
            reader.get_files(repo.slug, [TARGET], "main")
    assert "lacks the scope write:repository (HTTP 403)" in str(refused.value)
    assert "(it has read:repository)" in str(refused.value)
    assert token not in str(refused.value)


def test_a_bearer_token_is_a_token(server: Server) -> None:
    repo = server.repo(SEED)
    for scheme in ("token", "Bearer", "bearer"):
        with api(server, scheme=scheme) as raw:
            answer = raw.get(f"/repos/{repo.slug}/branches/main")
        assert answer.status_code == 200, scheme
        assert answer.json()["commit"]["id"] == repo.head()


def test_the_readme_s_scopes_compare(server: Server, client: GiteaClient) -> None:
    """The README asks for write:repository only: compare, which reads the code, needs
    no other scope."""
    repo = server.repo(SEED)
    older = repo.head()
    newer = repo.commit({"README.md": "next\n"})
    token = server.token_with("write:repository")
    with GiteaClient(server.url, token, retry=RETRY) as writer:
        assert writer.is_ancestor(repo.slug, older, newer) is True


def test_a_private_repository_the_user_cannot_see_is_a_404_that_says_so(
    server: Server,
) -> None:
    repo = server.repo(SEED)
    with GiteaClient(server.url, server.outsider(), retry=RETRY) as outsider:
        with pytest.raises(GiteaError, match="private repository that the token's user may not"):
            outsider.branch_head(repo.slug, "main")
        assert outsider.get_repo(repo.slug) is None
    with GiteaClient(server.url, None, retry=RETRY) as anonymous:
        with pytest.raises(GiteaError, match="HTTP 404 to a request without a token; set FABRI"):
            anonymous.get_file(repo.slug, TARGET, "main")


# -- the write-back, end to end ------------------------------------------------------------

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def _citation(repo: Clone, image: str = "citation-dagster") -> dict[str, Any]:
    """The site's app citation, pinned in ``repo``'s kustomization."""
    return {
        "name": "citation",
        "image": image,
        "context": APP,
        "writeback": {"kind": "kustomize-images", "repo": repo.slug, "path": TARGET},
    }


@pytest.mark.parametrize("transport", ["gitea", "git"])
def test_writeback_writes_then_is_unchanged_and_never_rolls_back(
    server: Server, tmp_path: Path, transport: str
) -> None:
    """Through either transport: the Contents API, or git (fetch, commit, push)."""
    repo = server.repo(SEED)
    app = _citation(repo)
    settings: dict[str, Any] = {"gitea.url": server.url, "gitea.codeRepo": repo.slug}
    settings |= {"apps": [app], "writeback.transport": transport}
    with server.git_url() as git_url:
        values = write_values(tmp_path / "site.yaml", **settings, **{"writeback.gitUrl": git_url})
        _writes_then_supersedes(server, repo, values)


def _writes_then_supersedes(server: Server, repo: Clone, values: Path) -> None:
    def writeback(revision: str, digest: str) -> str:
        result = run_cli(
            *("--values", str(values), "writeback", "--app", "citation"),
            *("--revision", revision, "--digest", digest),
            env={"FABRIQUE_GITEA_TOKEN": server.token},
        )
        assert result.exit_code == 0, result.stderr
        return result.stdout

    older = repo.commit({f"{APP}/app.txt": "v1\n"})
    newer = repo.commit({f"{APP}/app.txt": "v2\n"})
    assert writeback(newer, DIGEST_B).startswith("changed:")
    images = yaml.safe_load(repo.show(TARGET))["images"]
    assert images == [
        {
            "name": "citation-dagster",
            "newName": "registry:80/citation-dagster",
            "newTag": newer[:12],
            "digest": DIGEST_B,
        }
    ]
    assert writeback(newer, DIGEST_B).startswith("unchanged:")
    late = writeback(older, DIGEST_A)
    assert late.startswith("superseded:"), late
    assert yaml.safe_load(repo.show(TARGET))["images"] == images


CHECK = "ci/lint"  # the apps repository's own check, which its branch protection requires


def _pull_requests(server: Server, slug: str, state: str = "open") -> list[dict[str, Any]]:
    with api(server) as raw:
        answer = raw.get(f"/repos/{slug}/pulls", params={"state": state})
    assert answer.status_code == 200, answer.text
    return list(answer.json())


@pytest.mark.parametrize("transport", ["gitea", "git"])
def test_a_protected_branch_takes_the_pin_through_a_pull_request_merged_when_checks_pass(
    server: Server, tmp_path: Path, transport: str
) -> None:
    """A branch nobody may push to: a direct write-back is refused; in pull-request mode
    the pin is proposed in one pull request, updated in place by a newer build, never by
    an older one, left as it is by a replay, and merged by Gitea once the check the
    branch requires is green on its head."""
    repo = server.repo(SEED)
    older = repo.commit({f"{APP}/app.txt": "v1\n"})
    newer = repo.commit({f"{APP}/app.txt": "v2\n"})
    newest = repo.commit({f"{APP}/app.txt": "v3\n"})
    server.protect(repo.slug, "main", [CHECK])
    app = _citation(repo)
    settings: dict[str, Any] = {"gitea.url": server.url, "gitea.codeRepo": repo.slug}
    settings |= {"apps": [app], "writeback.transport": transport}
    env = {"FABRIQUE_GITEA_TOKEN": server.token}
    with server.git_url() as git_url:
        settings["writeback.gitUrl"] = git_url
        direct = write_values(tmp_path / "direct.yaml", **settings)
        reviewed = write_values(
            tmp_path / "reviewed.yaml",
            **settings,
            **{"writeback.mode": "pull-request", "writeback.pullRequest.autoMerge": True},
        )

        def writeback(values: Path, revision: str, digest: str) -> tuple[int, str]:
            result = run_cli(
                *("--values", str(values), "writeback", "--app", "citation"),
                *("--revision", revision, "--digest", digest),
                env=env,
            )
            return result.exit_code, result.stdout if result.exit_code == 0 else result.stderr

        if not (server.name == "double" and transport == "git"):  # a git daemon has no hooks
            code, said = writeback(direct, newer, DIGEST_B)
            assert code != 0 and "protect" in said.lower(), said
        main = repo.remote_head()

        code, said = writeback(reviewed, newer, DIGEST_B)
        assert code == 0 and said.startswith("proposed: citation "), said
        (pull,) = _pull_requests(server, repo.slug)
        assert pull["head"]["ref"] == "fabrique/citation" and pull["base"]["ref"] == "main"
        assert pull["title"] == "fabrique: deploy citation-dagster " + newer[:12] + " for citation"
        assert f"/{repo.slug}/commit/{newer}" in pull["body"]
        assert said.rstrip().endswith(f"{pull['html_url']}, merges once its checks pass)"), said
        assert repo.remote_head() == main

        code, said = writeback(reviewed, newer, DIGEST_B)
        assert code == 0 and said.startswith("in review: citation "), said
        code, said = writeback(reviewed, older, DIGEST_A)
        assert code == 0 and said.startswith("superseded: citation "), said
        assert "pull request #" in said, said

        digest_c = "sha256:" + "c" * 64
        code, said = writeback(reviewed, newest, digest_c)
        assert code == 0 and said.startswith("proposed: citation "), said
        (updated,) = _pull_requests(server, repo.slug)
        assert updated["number"] == pull["number"] and updated["head"]["sha"] != pull["head"]["sha"]
        assert repo.remote_head() == main

        with GiteaClient(server.url, server.token) as client:
            client.create_status(repo.slug, updated["head"]["sha"], CommitStatus(CHECK, "success"))

            def merged() -> bool:
                # Gitea moves the branch, then marks the pull request merged
                return repo.remote_head() != main and _pull_requests(server, repo.slug) == []

            until(f"Gitea to merge pull request #{pull['number']} once {CHECK} passed", merged, 30)
        images = yaml.safe_load(repo.show(TARGET))["images"]
        assert (images[0]["newTag"], images[0]["digest"]) == (newest[:12], digest_c)
        (done,) = _pull_requests(server, repo.slug, "closed")
        assert done["number"] == pull["number"] and done["merged"]


@pytest.mark.parametrize("transport", ["gitea", "git"])
def test_a_hold_closes_the_open_pull_request_saying_who_holds_it_and_why(
    server: Server, tmp_path: Path, transport: str, kube: KubeApiDouble
) -> None:
    """The safety net and status see the open pull request (in review, its link); a hold
    closes it, its description saying who holds the app and why, and proposes nothing."""
    repo = server.repo(SEED)
    revision = repo.commit({f"{APP}/app.txt": "v1\n"})
    app = _citation(repo)
    settings: dict[str, Any] = {"gitea.url": server.url, "gitea.codeRepo": repo.slug}
    settings |= {"apps": [app], "writeback.transport": transport, "writeback.mode": "pull-request"}
    env = {"FABRIQUE_GITEA_TOKEN": server.token}
    env["KUBECONFIG"] = str(kube.kubeconfig(tmp_path / "kubeconfig"))
    with server.git_url() as git_url:
        values = write_values(tmp_path / "site.yaml", **settings, **{"writeback.gitUrl": git_url})

        def fab(*args: str) -> str:
            result = run_cli("--values", str(values), *args, env=env)
            assert result.exit_code == 0, result.stdout + result.stderr
            return result.stdout

        proposed = fab(
            "writeback", "--app", "citation", "--revision", revision, "--digest", DIGEST_A
        )
        assert proposed.startswith("proposed: citation "), proposed
        (pull,) = _pull_requests(server, repo.slug)
        with GiteaClient(server.url, server.token) as client:
            assert client.branch_tip(repo.slug, "fabrique/citation") == pull["head"]["sha"]
            found = client.open_pull(repo.slug, "main", "fabrique/citation")
            assert found is not None and found.number == pull["number"]
        (entry,) = yaml.safe_load(fab("status", "-o", "json"))
        assert entry["state"] == "in-review" and pull["html_url"] in entry["detail"], entry
        line = fab("reconcile").splitlines()[0]
        assert line.startswith("citation: in-review: "), line
        held = fab("hold", "--app", "citation", "--reason", "incident 42", "--by", "alice")
        assert held.startswith("held: citation held by alice since "), held
        assert _pull_requests(server, repo.slug) == []
        (closed,) = _pull_requests(server, repo.slug, "closed")
        assert closed["number"] == pull["number"] and not closed["merged"]
        assert closed["body"].startswith("**Closed by fabrique: citation is held by alice since ")
        assert "incident 42" in closed["body"]
        with GiteaClient(server.url, server.token) as client:
            assert client.branch_tip(repo.slug, "fabrique/citation") is None
        step = fab("writeback", "--app", "citation", "--revision", revision, "--digest", DIGEST_A)
        assert step.startswith("held: citation is held by alice since "), step
        assert _pull_requests(server, repo.slug) == []


def _reviewed(server: Server, repo: Clone, tmp_path: Path, **more: Any) -> Callable[..., str]:
    """fabrique's write-back of ``repo``'s citation through pull requests (Contents API),
    ``more`` settings besides: the write-back's line, which must exit 0."""
    settings: dict[str, Any] = {"gitea.url": server.url, "gitea.codeRepo": repo.slug}
    settings |= {"apps": [_citation(repo)], "writeback.mode": "pull-request", **more}
    values = write_values(tmp_path / "site.yaml", **settings)

    def writeback(revision: str, digest: str) -> str:
        result = run_cli(
            *("--values", str(values), "writeback", "--app", "citation"),
            *("--revision", revision, "--digest", digest),
            env={"FABRIQUE_GITEA_TOKEN": server.token},
        )
        assert result.exit_code == 0, result.stdout + result.stderr
        return str(result.stdout)

    return writeback


def test_a_proposal_is_recorded_on_the_built_commit_and_a_refusal_read_there(
    server: Server, client: GiteaClient, tmp_path: Path
) -> None:
    """Each proposal is a success status ``proposal: <branch>`` on the built commit,
    linking its pull request; the pull request read by number (``GET pulls/{n}``) says
    whether a person closed it unmerged, and then the pin is ``rejected``."""
    repo = server.repo(SEED)
    revision = repo.commit({f"{APP}/app.txt": "v1\n"})
    writeback = _reviewed(server, repo, tmp_path)
    assert writeback(revision, DIGEST_A).startswith("proposed: citation ")
    (listed,) = _pull_requests(server, repo.slug)
    record = client.latest_status(repo.slug, revision, review.record_context("fabrique/citation"))
    assert record is not None, "the proposal is recorded on the built commit"
    assert (record.state, record.target_url) == ("success", listed["html_url"])
    assert record.description == f"proposed in pull request #{listed['number']}"

    pull = client.pull(repo.slug, listed["number"])
    assert pull is not None and (pull.number, pull.state, pull.merged) == (
        listed["number"], "open", False
    )  # fmt: skip
    assert pull.head_sha == listed["head"]["sha"] and pull.base_sha == repo.remote_head()
    assert client.pull(repo.slug, listed["number"] + 1) is None
    assert review.rejection(client, repo.slug, record) is None, "open: no refusal"

    with api(server) as raw:
        closed = raw.patch(f"/repos/{repo.slug}/pulls/{listed['number']}", json={"state": "closed"})
    assert closed.status_code == 201, closed.text
    refused = review.rejection(client, repo.slug, record)
    assert refused is not None and (refused.state, refused.merged) == ("closed", False)
    said = writeback(revision, DIGEST_A)
    assert said.startswith("rejected: citation ") and listed["html_url"] in said, said
    assert _pull_requests(server, repo.slug) == []


def test_a_conflicting_pull_request_is_unmergeable_and_its_merge_asked_later(
    server: Server, client: GiteaClient, tmp_path: Path
) -> None:
    """The base takes an edit of the lines a proposal edits: once Gitea has checked the
    pull request again it is ``mergeable: false``, and a merge asked of it answers 405
    "Please try again later" (CheckPullMergeable's ErrNotMergeableState), whatever the
    branch's checks."""
    repo = server.repo(SEED)
    revision = repo.commit({f"{APP}/app.txt": "v1\n"})
    writeback = _reviewed(server, repo, tmp_path)
    assert writeback(revision, DIGEST_A).startswith("proposed: citation ")
    (listed,) = _pull_requests(server, repo.slug)
    number = listed["number"]
    # another app's entry appended where the proposal appends its own
    repo.commit({TARGET: KUSTOMIZATION + 'images:\n  - name: redis\n    newTag: "7"\n'})

    def unmergeable() -> bool:
        with api(server) as raw:
            found = raw.get(f"/repos/{repo.slug}/pulls/{number}").json()
        return found["mergeable"] is False and found["base"]["sha"] == repo.remote_head()

    until(
        f"Gitea to find pull request #{number} unmergeable once the base conflicts", unmergeable, 30
    )
    body = {"do": "merge", "merge_when_checks_succeed": True, "delete_branch_after_merge": True}
    with api(server) as raw:
        asked = raw.post(f"/repos/{repo.slug}/pulls/{number}/merge", json=body)
    assert asked.status_code == 405 and asked.json()["message"] == "Please try again later", (
        asked.text
    )
    head = listed["head"]["sha"]
    assert client.merge_pull(repo.slug, number, style="merge", head=head) == "busy"
    (still,) = _pull_requests(server, repo.slug)
    assert (still["number"], still["merged"], still["mergeable"]) == (number, False, False)


def test_a_merge_asked_of_a_pull_request_merged_meanwhile_is_merged_not_an_error(
    server: Server, client: GiteaClient, tmp_path: Path
) -> None:
    """A merge scheduled before takes a remade proposal as soon as it is pushed, before
    the write-back asks its own: Gitea answers 405 "The PR is already merged", which is
    the outcome asked for, not a refusal."""
    repo = server.repo(SEED)
    revision = repo.commit({f"{APP}/app.txt": "v1\n"})
    writeback = _reviewed(server, repo, tmp_path)
    assert writeback(revision, DIGEST_A).startswith("proposed: citation ")
    (listed,) = _pull_requests(server, repo.slug)
    number, head = listed["number"], listed["head"]["sha"]
    # no check required: the merge asked now is done now
    assert client.merge_pull(repo.slug, number, style="merge", head=head) == "scheduled"
    until(f"pull request #{number} merged", lambda: _pull_requests(server, repo.slug) == [], 30)
    body = {"do": "merge", "merge_when_checks_succeed": True, "delete_branch_after_merge": True}
    with api(server) as raw:
        again = raw.post(f"/repos/{repo.slug}/pulls/{number}/merge", json=body)
    assert again.status_code == 405 and "already merged" in again.json()["message"], again.text
    assert client.merge_pull(repo.slug, number, style="merge", head=head) == "merged"


def test_a_fast_forward_only_merge_stalls_once_the_base_moves_and_a_remade_proposal_merges(
    server: Server, client: GiteaClient, tmp_path: Path
) -> None:
    """mergeStyle fast-forward-only, the merge scheduled until a check passes: the base
    moves meanwhile, and when the check passes Gitea's merge fails (its log says so) and
    the pull request stays open, its merge still scheduled. Gitea's pull request shows
    why (``base.sha`` past ``merge_base``); the next write-back makes the proposal again
    on the base's head, and that one merges."""
    repo = server.repo(SEED)
    revision = repo.commit({f"{APP}/app.txt": "v1\n"})
    server.protect(repo.slug, "main", [CHECK], pushes=True)
    more = {"writeback.pullRequest.autoMerge": True}
    writeback = _reviewed(
        server, repo, tmp_path, **more, **{"writeback.pullRequest.mergeStyle": "fast-forward-only"}
    )
    said = writeback(revision, DIGEST_A)
    assert said.startswith("proposed: citation ") and "merges once its checks pass" in said, said
    (listed,) = _pull_requests(server, repo.slug)
    number, proposed = listed["number"], listed["head"]["sha"]
    fork = repo.remote_head()
    moved = repo.commit({"README.md": "the base moves on\n"}, "the base moves on")

    client.create_status(repo.slug, proposed, CommitStatus(CHECK, "success"))
    until(
        f"Gitea to try the fast-forward-only merge of #{number} and log its failure",
        lambda: server.merge_failed(repo.slug, number),
        30,
        detail=lambda: str(_pull_requests(server, repo.slug)),
    )
    (stalled,) = _pull_requests(server, repo.slug)
    assert (stalled["merged"], stalled["head"]["sha"]) == (False, proposed)
    assert repo.remote_head() == moved
    pull = client.pull(repo.slug, number)
    assert pull is not None and (pull.base_sha, pull.merge_base) == (moved, fork)
    assert review.left_behind(client, repo.slug, pull), "the base moved past the proposal"
    # still scheduled: asked again, Gitea says so (409), or, while the base's push has it
    # check the pull request again, "Please try again later" (405, 'busy'); asking until
    # it has checked would merge now, the check being green (MergePullRequest)
    asked = client.merge_pull(repo.slug, number, style="fast-forward-only", head="")
    assert asked in ("scheduled", "busy"), asked

    again = writeback(revision, DIGEST_A)
    assert again.startswith("proposed: citation "), again
    # the remade proposal is the same pull request, one commit on the base's head; the
    # merge scheduled before may take it at once, else its check passing does
    checked: set[str] = set()

    def merged() -> bool:
        for still in _pull_requests(server, repo.slug):
            if still["head"]["sha"] not in checked:
                client.create_status(
                    repo.slug, still["head"]["sha"], CommitStatus(CHECK, "success")
                )
                checked.add(still["head"]["sha"])
        return repo.remote_head() != moved and _pull_requests(server, repo.slug) == []

    until(f"Gitea to fast-forward main to the remade proposal #{number}", merged, 30)
    (done,) = _pull_requests(server, repo.slug, "closed")
    assert done["number"] == number and done["merged"] and done["head"]["sha"] != proposed
    repo.git("fetch", "-q", "origin", "main")
    assert repo.git("rev-parse", "FETCH_HEAD^") == moved, "one commit on the base's head"
    images = yaml.safe_load(repo.show(TARGET))["images"]
    assert (images[0]["newTag"], images[0]["digest"]) == (revision[:12], DIGEST_A)


def _gestures(
    server: Server,
    repo: Clone,
    tmp_path: Path,
    registry: servers.Registry,
    kube: KubeApiDouble,
    image: str,
) -> Callable[..., str]:
    """``fabrique <args>`` on a site whose one app, citation, is pinned in ``repo``: what
    it printed, once it has exited 0."""
    app = _citation(repo, image)
    values = write_values(
        tmp_path / "site.yaml",
        **{"gitea.url": server.url, "gitea.codeRepo": repo.slug, "registry.host": registry.host},
        apps=[app],
    )
    env = {
        "FABRIQUE_GITEA_TOKEN": server.token,
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
    }

    def fab(*args: str) -> str:
        result = run_cli("--values", str(values), *args, env=env)
        assert result.exit_code == 0, result.stderr
        return result.stdout

    return fab


def test_hold_release_rollback_and_status_read_and_write_as_on_the_double(
    server: Server, tmp_path: Path, registry: servers.Registry, kube: KubeApiDouble
) -> None:
    """The gestures a person runs on a deployed app: each writes one commit through the
    server's API, and reads back what it wrote, with the same lines on both servers."""
    repo = server.repo(SEED)
    image = unique("citation")
    fab = _gestures(server, repo, tmp_path, registry, kube, image)
    built = {}
    for text in ("v1\n", "v2\n"):
        revision = repo.commit({f"{APP}/app.txt": text})
        labels = {
            "org.opencontainers.image.revision": revision,
            "org.opencontainers.image.source": f"{server.url}/{repo.slug}.git",
        }
        built[revision] = push_image(
            registry.url, image, revision[:12], {"app.txt": text.encode()}, labels=labels
        )
        written = fab(
            "writeback", "--app", "citation", "--revision", revision, "--digest", built[revision]
        )
        assert written.startswith("changed: "), written
    (old, old_digest), (new, _) = built.items()

    held = fab("hold", "--app", "citation", "--reason", "incident 42", "--by", "alice")
    assert held.startswith("held: citation held by alice since "), held
    head = repo.remote_head()
    assert fab("hold", "--app", "citation", "--by", "bob").startswith("unchanged: ")
    step = fab("writeback", "--app", "citation", "--revision", new, "--digest", built[new])
    assert step.startswith("held: citation is held by alice since "), step
    assert repo.remote_head() == head
    released = fab("release", "--app", "citation", "--by", "alice")
    assert released.startswith("released: citation ") and repo.remote_head() != head

    rolled = fab("rollback", "--app", "citation", "--to", old[:12], "--by", "alice")
    assert rolled.startswith(
        f"rolled back: citation {registry.host}/{image}:{old[:12]}@{old_digest} -> "
    )
    head = repo.remote_head()
    assert fab("rollback", "--app", "citation", "--to", old, "--by", "bob").startswith(
        "unchanged: "
    )
    assert repo.remote_head() == head
    pin = yaml.safe_load(repo.show(TARGET))["images"][0]
    assert (pin["newTag"], pin["digest"]) == (old[:12], old_digest)
    message = repo.git("log", "-1", "--format=%B", "FETCH_HEAD")
    assert f"Source-Revision: {old}" in message and "Held-By: alice" in message

    (entry,) = yaml.safe_load(fab("status", "-o", "json"))
    assert (entry["app"], entry["state"]) == ("citation", "held")
    assert entry["facts"]["hold"]["by"] == "alice"


def test_a_lost_success_report_is_posted_by_the_safety_net(
    server: Server, tmp_path: Path, registry: servers.Registry, kube: KubeApiDouble
) -> None:
    """The exit handler's pending report, then a write-back whose success report was
    lost: the next reconcile pass posts it, and reads it back as posted."""
    repo = server.repo(SEED)
    fab = _gestures(server, repo, tmp_path, registry, kube, "citation-dagster")
    revision = repo.commit({f"{APP}/app.txt": "v2\n"})
    digest = "sha256:" + "5" * 64
    workflow = f"fabrique-citation-{revision[:12]}"
    fab(
        "status-report",
        "pending",
        "--app",
        "citation",
        "--revision",
        revision,
        "--workflow",
        workflow,
    )
    fab("writeback", "--app", "citation", "--revision", revision, "--digest", digest)
    line = fab("reconcile").splitlines()[0]
    assert line.startswith("citation: ok: ") and line.endswith("; status success posted"), line
    with GiteaClient(server.url, server.token) as client:
        (status,) = client.latest_statuses(repo.slug, revision).values()
    assert (status.context, status.state) == ("fabrique/citation", "success")
    assert status.description == f"safety net: {digest} deployed"


def test_a_file_reads_back_as_the_utf_8_text_git_stores(
    server: Server, client: GiteaClient
) -> None:
    text = "name: caf\u00e9 \u2014 \u00fcber\n"
    repo = server.repo({**SEED, "unicode.yaml": text})
    found = client.get_file(repo.slug, "unicode.yaml", "main")
    assert found == FileContent("unicode.yaml", text, repo.blob("unicode.yaml"))
    with api(server) as raw:
        answer = raw.get(f"/repos/{repo.slug}/contents/unicode.yaml", params={"ref": "main"})
    assert base64.b64decode(answer.json()["content"]) == text.encode()


# -- the shape of every answer -------------------------------------------------------------

HEX = re.compile(r"\b[0-9a-f]{7,64}\b")
NUMBER = re.compile(r"\b\d+\b")  # an id
DECIDED = ("type", "state", "total_count", "total_commits", "mirror", "mirror_interval", "empty")


def shape(value: Any) -> Any:
    """A JSON value with its scalars replaced by their type: what must agree."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        type(value), "null"
    )


def shape_differences(double: Any, real: Any, where: str) -> list[str]:
    if isinstance(double, dict) and isinstance(real, dict):
        found = []
        for key in sorted(set(double) | set(real)):
            path = f"{where}.{key}"
            if key not in real:
                found.append(f"{path}: the double sends it, Gitea does not")
            elif key not in double:
                found.append(f"{path}: Gitea sends it ({real[key]}), the double does not")
            else:
                found += shape_differences(double[key], real[key], path)
        return found
    if isinstance(double, list) and isinstance(real, list) and double and real:
        return shape_differences(double[0], real[0], f"{where}[0]")
    return [] if double == real else [f"{where}: Gitea sends {real}, the double {double}"]


def exchanges(server: Server, tmp_path: Path) -> dict[str, Any]:
    """The answers to every call fabrique makes, and to the errors it reads, on a new
    repository: (status, shape, the message of an error with its ids masked, paging)."""
    repo = server.repo(SEED)
    first = repo.head()
    repo.commit({}, "a symlink", links={"link.yaml": "README.md"})
    head = repo.commit({f"{APP}/app.txt": "v2\n"})
    orphan = repo.orphan({"README.md": "another history\n"})
    blob = repo.blob(TARGET)
    person = {"name": AUTHOR.name, "email": AUTHOR.email}
    write = {"branch": "main", "content": base64.b64encode(b"images: []\n").decode()}
    write |= {"message": "m", "author": person, "committer": person}
    hook = {
        "type": "gitea",
        "name": HOOK_NAME,
        "config": {"url": HOOK_URL, "content_type": "json", "http_method": "post"},
        "events": ["push"],
        "branch_filter": "main",
        "authorization_header": "Bearer shape-5a6b",
        "active": True,
    }
    listing = {"sha": "main", "limit": "50", "files": "true", "stat": "false"}
    listing["verification"] = "false"
    one = {"stat": "false", "verification": "false", "files": "false"}
    upstream = tmp_path / f"upstream-{server.name}"
    init = ["git", "init", "-q", "--bare", "-b", "main"]
    subprocess.run([*init, str(upstream / "up.git")], check=True)
    Clone("up", upstream / "work", str(upstream / "up.git"), {}).commit({"README.md": "up\n"})
    r, m = f"/repos/{repo.slug}", f"/repos/{ORG}/{unique('mirror')}"
    found: dict[str, Any] = {}
    with servers.git_daemon(upstream) as daemon, api(server) as raw:
        source = daemon.url("up.git")
        migrate = {"clone_addr": source, "repo_owner": ORG, "repo_name": m.split("/")[-1]}
        migrate |= {"mirror": True, "mirror_interval": "10m", "private": True, "service": "git"}
        short = {**migrate, "repo_name": unique("short"), "mirror_interval": "1m"}

        def call(name: str, method: str, url: str, **kwargs: Any) -> None:
            found[name] = _exchange(raw.request(method, url, **kwargs), repo.slug)

        call("branch", "GET", f"{r}/branches/main")
        call("branch missing", "GET", f"{r}/branches/gone")
        call("file", "GET", f"{r}/contents/{TARGET}", params={"ref": "main"})
        call("directory", "GET", f"{r}/contents/{APP}", params={"ref": "main"})
        call("symlink", "GET", f"{r}/contents/link.yaml", params={"ref": "main"})
        call("file missing", "GET", f"{r}/contents/gone.yaml", params={"ref": "main"})
        call("file on no branch", "GET", f"{r}/contents/{TARGET}", params={"ref": "gone"})
        call("commit", "GET", f"{r}/git/commits/{first}", params=one)
        call("commit short", "GET", f"{r}/git/commits/{first[:12]}", params=one)
        call("commit missing", "GET", f"{r}/git/commits/not-a-branch", params=one)
        call("commit invalid", "GET", f"{r}/git/commits/a..b", params=one)
        call("by path", "GET", f"{r}/commits", params={**listing, "path": APP})
        call("by path none", "GET", f"{r}/commits", params={**listing, "path": "nowhere"})
        call(
            "by path no start",
            "GET",
            f"{r}/commits",
            params={**listing, "path": APP, "sha": "gone"},
        )
        call("since", "GET", f"{r}/commits", params={**listing, "not": first})
        call("since no start", "GET", f"{r}/commits", params={**listing, "sha": "f" * 40})
        call("compare", "GET", f"{r}/compare/{first}...{head}")
        call("compare unrelated", "GET", f"{r}/compare/{head}...{orphan}")
        call("compare missing", "GET", f"{r}/compare/{'f' * 40}...{head}")
        call("create", "POST", f"{r}/contents/deploy/k.yaml", json=write)
        call("create existing", "POST", f"{r}/contents/deploy/k.yaml", json=write)
        call("create on a file", "POST", f"{r}/contents/README.md/k.yaml", json=write)
        call("create on a directory", "POST", f"{r}/contents/{APP}", json=write)
        call(
            "create on no branch",
            "POST",
            f"{r}/contents/new.yaml",
            json={**write, "branch": "gone"},
        )
        call("update", "PUT", f"{r}/contents/{TARGET}", json={**write, "sha": blob})
        call("update stale", "PUT", f"{r}/contents/{TARGET}", json={**write, "sha": blob})
        call("update gone", "PUT", f"{r}/contents/gone.yaml", json={**write, "sha": blob})
        call("update a directory", "PUT", f"{r}/contents/{APP}", json={**write, "sha": blob})
        files = f"{r}/file-contents"
        on_main = {"ref": "main"}
        call("files", "POST", files, params=on_main, json={"files": [TARGET, "gone.yaml"]})
        call("files missing", "POST", files, params=on_main, json={"files": ["gone.yaml"]})
        call("files a directory", "POST", files, params=on_main, json={"files": [APP]})
        call("files a symlink", "POST", files, params=on_main, json={"files": ["link.yaml"]})
        call("files on no branch", "POST", files, params={"ref": "gone"}, json={"files": [TARGET]})
        batch = {key: value for key, value in write.items() if key != "content"}
        now = raw.get(f"{r}/contents/{TARGET}", params={"ref": "main"}).json()["sha"]
        update = {"operation": "update", "path": TARGET, "content": write["content"], "sha": now}
        add = {"operation": "create", "path": "deploy/batch.yaml", "content": write["content"]}
        call("change", "POST", f"{r}/contents", json={**batch, "files": [update, add]})
        call("change stale", "POST", f"{r}/contents", json={**batch, "files": [update]})
        call("change existing", "POST", f"{r}/contents", json={**batch, "files": [add]})
        gone = {**update, "path": "gone.yaml"}
        call("change gone", "POST", f"{r}/contents", json={**batch, "files": [gone]})
        call(
            "change on no branch",
            "POST",
            f"{r}/contents",
            json={**batch, "branch": "gone", "files": [add]},
        )
        propose = {**write, "new_branch": "fabrique/shape", "force_push": True}
        now = raw.get(f"{r}/contents/{TARGET}", params={"ref": "main"}).json()["sha"]
        call("propose", "PUT", f"{r}/contents/{TARGET}", json={**propose, "sha": now})
        call("propose again", "PUT", f"{r}/contents/{TARGET}", json={**propose, "sha": now})
        # a push's proposal: several files, one commit on main forced onto its branch
        now = raw.get(f"{r}/contents/{TARGET}", params={"ref": "main"}).json()["sha"]
        both = [{**update, "sha": now}, {**add, "path": "deploy/push.yaml"}]
        forced = {**batch, "new_branch": "fabrique/push.0123456789ab.main", "force_push": True}
        call("propose files", "POST", f"{r}/contents", json={**forced, "files": both})
        call("propose files again", "POST", f"{r}/contents", json={**forced, "files": both})
        pull = {"base": "main", "head": "fabrique/shape", "title": "t", "body": "b"}
        call("pull", "POST", f"{r}/pulls", json=pull)
        call("pull again", "POST", f"{r}/pulls", json=pull)
        call("pull of no branch", "POST", f"{r}/pulls", json={**pull, "head": "gone"})
        call("pull by branches", "GET", f"{r}/pulls/main/fabrique%2Fshape")
        call("pull by branches none", "GET", f"{r}/pulls/main/gone")
        pulls = {"base_branch": "main", "sort": "recentupdate", "page": "1", "limit": "50"}
        call("pulls open", "GET", f"{r}/pulls", params={**pulls, "state": "open"})
        call("pull edit", "PATCH", f"{r}/pulls/1", json={"title": "t2", "body": "b2"})
        call("pull read", "GET", f"{r}/pulls/1")
        call("pull read missing", "GET", f"{r}/pulls/99")
        call("pull merge unscheduled", "DELETE", f"{r}/pulls/1/merge")
        call("pull close", "PATCH", f"{r}/pulls/1", json={"state": "closed", "body": "c"})
        call("pulls closed", "GET", f"{r}/pulls", params={**pulls, "state": "closed"})
        call("branch delete", "DELETE", f"{r}/branches/fabrique%2Fshape")
        call("branch delete again", "DELETE", f"{r}/branches/fabrique%2Fshape")
        call("combined none", "GET", f"{r}/commits/{first}/status", params={"limit": "50"})
        call("statuses none", "GET", f"{r}/commits/{first}/statuses")
        status = {"context": "c", "state": "pending"}
        call("status", "POST", f"{r}/statuses/{first}", json=status)
        done = {"context": "c", "state": "success", "description": "d", "target_url": HOOK_URL}
        call("status again", "POST", f"{r}/statuses/{first}", json=done)
        call(
            "status other",
            "POST",
            f"{r}/statuses/{first}",
            json={"context": "o", "state": "warning"},
        )
        call("status missing", "POST", f"{r}/statuses/{'f' * 40}", json=status)
        record = {"context": "proposal: fabrique/shape", "state": "success"}
        record |= {"description": "proposed in pull request #1", "target_url": f"{HOOK_URL}/1"}
        call("status record", "POST", f"{r}/statuses/{first}", json=record)
        call("combined", "GET", f"{r}/commits/{first}/status", params={"limit": "50"})
        call("combined missing", "GET", f"{r}/commits/gone/status", params={"limit": "50"})
        call("statuses", "GET", f"{r}/commits/{first}/statuses")
        call("hook", "POST", f"{r}/hooks", json=hook)
        call(
            "hook without url",
            "POST",
            f"{r}/hooks",
            json={**hook, "config": {"content_type": "json"}},
        )
        call("hooks", "GET", f"{r}/hooks", params={"page": "1", "limit": "50"})
        hook_id = raw.get(f"{r}/hooks").json()[0]["id"]
        call("hook read", "GET", f"{r}/hooks/{hook_id}")
        call("hook edit", "PATCH", f"{r}/hooks/{hook_id}", json={"active": False})
        call("hook delete", "DELETE", f"{r}/hooks/{hook_id}")
        call("hook deleted", "DELETE", f"{r}/hooks/{hook_id}")
        call("repository", "GET", r)
        call("repository missing", "GET", f"/repos/{ORG}/gone")
        call("migrate", "POST", "/repos/migrate", json=migrate)
        call("migrate again", "POST", "/repos/migrate", json=migrate)
        call("migrate too often", "POST", "/repos/migrate", json=short)
        call("mirror left behind", "GET", f"/repos/{ORG}/{short['repo_name']}")
        call("mirror", "GET", m)
        call("mirror interval", "PATCH", m, json={"mirror_interval": "8h"})
        call("mirror interval too short", "PATCH", m, json={"mirror_interval": "1m"})
        call("mirror sync", "POST", f"{m}/mirror-sync")
        call("mirror sync missing", "POST", f"/repos/{ORG}/gone/mirror-sync")
    with api(server, "not-a-token") as stranger:
        found["a wrong token"] = _exchange(stranger.get(f"{r}/branches/main"), repo.slug)
    with httpx.Client(base_url=f"{server.url}/api/v1") as anonymous:
        found["no token"] = _exchange(anonymous.get(f"{r}/branches/main"), repo.slug)
    return found


def _exchange(answer: httpx.Response, slug: str) -> dict[str, Any]:
    body = answer.json() if answer.content else None
    found: dict[str, Any] = {"status": answer.status_code, "shape": shape(body)}
    if answer.status_code >= 400 and isinstance(body, dict):
        message = NUMBER.sub("<n>", HEX.sub("<hex>", str(body.get("message"))))
        found["message"] = message.replace(slug, "<repo>") if slug else message
    if isinstance(body, dict):  # what fabrique decides on, besides the shape
        found["values"] = {k: body[k] for k in DECIDED if k in body}
    elif isinstance(body, list):
        found["values"] = {"length": len(body)}
    paging = ("x-total-count", "x-hasmore", "x-pagecount", "x-page", "x-perpage", "x-total")
    found["paging"] = {k: answer.headers[k] for k in paging if k in answer.headers}
    return found


@pytest.mark.live
def test_the_double_answers_in_the_shape_gitea_does(
    real_gitea: Gitea, gitea_swagger: Swagger, tmp_path: Path
) -> None:
    """Every call fabrique makes, and every error it reads, made on both servers: the
    same status, the same fields of the same JSON types (null where Gitea sends null),
    the same error message and paging headers."""
    double = GiteaDouble(gitea_swagger, {}, token=GITEA_TOKEN).start()
    proxy = SpecProxy(real_gitea.url, gitea_swagger).start()
    try:
        mine = exchanges(DoubleServer(double, tmp_path / "double"), tmp_path)
        theirs = exchanges(RealServer(real_gitea, proxy, tmp_path / "real"), tmp_path)
    finally:
        double.stop()
        proxy.stop()
    assert double.violations == [] and proxy.violations == []
    found = [
        difference
        for name in theirs
        for difference in shape_differences(mine[name], theirs[name], name)
    ]
    assert found == [], "\n".join(found)
