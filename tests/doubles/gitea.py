"""A Gitea API double over real bare git repositories. Not Gitea.

It serves the subset of ``/api/v1`` that fabrique uses: branch GET, contents GET, PUT
and POST, several files' contents at once (``file-contents``: at most 30 entries, null
for a path it cannot read) and several files changed in one commit (POST ``contents``),
``git/commits/{sha}``, compare, commits filtered by path, commit statuses
(create, list, combined), hooks, a repository, and pull mirrors (migrate, edit, sync).
Every request and every answer is checked against Gitea 1.27.1's Swagger document
(``doubles.swagger``); a violation is recorded and fails the test that caused it. The
answers are Gitea 1.27.3's, down to the nulls and the error messages: the contract tests
(``tests/test_gitea_contract.py``) make the same calls on a real Gitea and on the double.

It sits on real bare repositories: every write is a real commit made with git plumbing
and moved onto the branch with a compare-and-swap ``update-ref``, so tests can check the
history with ``git log`` and ``git show``. Like Gitea, an update must name the file's
current blob sha, and a stale one answers 422; a path Gitea cannot write answers 422
with its own message; a protected branch or path (``protect``) answers 403. Writes take
no lock, as in Gitea: when the branch moves between the check and the push
(``before_push`` lets a test move it), the answer is 500. A file larger than
``max_blob_size`` is listed with ``content: null``. Editing a hook resets what the PATCH
omits (``events``, ``branch_filter``, ``authorization_header``), as Gitea's editHook does;
a hook is shown as Gitea's ToHook shows it: its config without the HTTP method or the
secret, its authorization header as "" (the double keeps them in ``hook_methods``,
``hook_headers`` and ``hook_secrets``).

The token goes as ``token …`` or ``Bearer …``; its ``scopes`` are checked as Gitea's
tokenRequiresScopes does (403 naming the scope), and a ``hidden`` repository (private,
not the user's) answers 404. ``add_token`` makes more tokens, of other scopes or of a
user who is no member (who sees no repository). The double's repositories are private:
a request without a token sees none (404), one with a token Gitea does not know is 401.

Commit statuses are kept as Gitea keeps them: every POST adds one (nothing is replaced),
numbered per commit; a POST on a commit Gitea cannot find is a 500. The combined status
holds the latest of each context, a page at a time (at most 50, the most recently updated
context first; X-Total-Count counts them all), and its state is Gitea's
``CommitStatusStates.Combine`` of the page: ``failure`` if any context is error, failure
or warning, ``success`` if every one is success or skipped, else ``pending``; with no
status at all it is ``pending`` too (ToCombinedStatus), and ``statuses`` is null.

Pull requests are Gitea's too: a merge asked while Gitea checks a new head or base
(``check_answers`` requests after a push, 0 by default) or of one that conflicts answers
405 "Please try again later", and ``mergeable`` is false then; a scheduled
fast-forward-only merge of a head the base has moved past never happens (the pull
request's ``merge_failed`` records what Gitea only logs: it stays open, scheduled).

Faults can be injected: ``faults`` is a queue of (method, fault) consumed by the next
matching request, where fault is an HTTP status, ``"drop"`` (close the connection with no
answer), ``"lost"`` (do the work, then close the connection: a timeout the server
outlived) or ``("slow", seconds)``; ``race_rate`` answers a write that updates a file with 422 at that rate, as if
another writer had just won. ``latency`` (seconds) is added to every answer, as a Gitea
across a cluster network would, so that the number of requests shows up in time; every
request is counted in ``requests`` on the double's side.
"""

from __future__ import annotations

import base64
import fnmatch
import random
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode

from .http import DROP, LoopbackServer, Request
from .swagger import SpecViolation, Swagger

RSQUO = "\u2019"  # the apostrophe of Gitea's ErrFilePathInvalid messages
# Gitea's ErrNotExist of a git object, as its API words it
NO_OBJECT = "object does not exist [id: {id}, rel_path: {path}]"
# Gitea's IsValidRefPattern: what a ref or sha may not hold
INVALID_REF = re.compile(
    r"[\x00-\x1f\x7f \\~^:?*\[]|^[/.]|/\.|\.lock$|\.lock/|\.\.|//|@\{|[/.]$|^@$"
)
# [mirror] MIN_INTERVAL
MIRROR_MIN_SECONDS = 600
# [api] DEFAULT_PAGING_NUM: where GetContentsListFromTreePaths stops, whatever was asked
FILES_PAGE = 30
# the user the double's tokens belong to, as Gitea's ToUser shows a user
USER = {
    "id": 1,
    "login": "fabrique",
    "login_name": "",
    "source_id": 0,
    "full_name": "",
    "email": "fabrique@noreply.localhost",
    "avatar_url": "",
    "html_url": "",
    "language": "",
    "is_admin": False,
    "last_login": "0001-01-01T00:00:00Z",
    "created": "2026-12-02T10:00:00Z",
    "restricted": False,
    "active": False,
    "prohibit_login": False,
    "location": "",
    "website": "",
    "description": "",
    "visibility": "public",
    "followers_count": 0,
    "following_count": 0,
    "starred_repos_count": 0,
    "username": "fabrique",  # User's MarshalJSON adds it, beside login
}
# a commit nobody signed, as ToVerification shows it
UNSIGNED = {
    "verified": False,
    "reason": "gpg.error.not_signed_commit",
    "signature": "",
    "signer": None,
    "payload": "",
}


def git(
    repo: Path, *args: str, input_text: str | None = None, env: dict[str, str] | None = None
) -> str:
    import os

    result = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=input_text,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, args, result.stdout, result.stderr)
    return result.stdout.strip()


@dataclass
class Grant:
    """What one token may do: its scopes (None: every one), the repositories its user may
    not see, and whether the user is a member of the owners at all (the double's
    repositories are private: a stranger sees none of them)."""

    scopes: set[str] | None = None
    hidden: set[str] = field(default_factory=set)
    member: bool = True


class GiteaDouble:
    def __init__(self, swagger: Swagger, repos: dict[str, Path], token: str | None = None) -> None:
        self.swagger = swagger
        self.repos = repos  # "owner/name" -> bare repository
        self.token = token
        # the token's scopes, as Gitea checks them on every /repos route (None: all); and
        # the repositories its user may not see, which Gitea answers 404 (never 403)
        self.scopes: set[str] | None = None
        self.hidden: set[str] = set()
        self.grants: dict[str, Grant] = {}  # the other tokens a test made (``add_token``)
        self.violations: list[str] = []
        self.requests: list[Request] = []
        self.faults: list[tuple[str, Any]] = []
        self.race_rate = 0.0
        self.races = 0
        self.latency = 0.0
        self._random = random.Random(1234)
        self.hooks: dict[str, dict[int, dict[str, Any]]] = {repo: {} for repo in repos}
        # stored, never shown, as Gitea keeps them: a hook's HMAC secret, its
        # authorization header (shown as ""), its HTTP method (config shows none)
        self.hook_secrets: dict[tuple[str, int], str] = {}
        self.hook_headers: dict[tuple[str, int], str] = {}
        self.hook_methods: dict[tuple[str, int], str] = {}
        self.mirrors: dict[str, dict[str, Any]] = {}
        # (repo, sha) -> every status posted, oldest first, as Gitea stores them
        self.statuses: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._next_hook = 1
        self._write_lock = threading.Lock()
        self.protected: dict[tuple[str, str], str | None] = {}  # (repo, branch) -> file glob
        # (repo, branch) -> the status contexts a merge into it waits for (branch protection)
        self.required_checks: dict[tuple[str, str], list[str]] = {}
        self.pulls: dict[str, list[dict[str, Any]]] = {}  # repo -> its pull requests, by number
        # the merge requests a pull request answers 405 "Please try again later" after its
        # head or base moved: Gitea is checking it (PullRequestStatusChecking) until then
        self.check_answers = 0
        self.push_races = 0  # writes answered 500: the branch moved under Gitea's push
        # how Gitea answers a push of its own that lost the branch: "out-of-date" (a tip
        # that moved before it pushed: 500) or "lock" (two pushes at once: 403, the ref
        # lock's message, git.ErrPushRejected); which one depends on the moment
        self.push_race_answer = "out-of-date"
        self.before_push: Callable[[str, str], None] | None = None  # a rival, in a test
        self.max_blob_size = 10 * 1024 * 1024  # [api] DEFAULT_MAX_BLOB_SIZE
        self.max_response_size = 100 * 1024 * 1024  # [api] DEFAULT_MAX_RESPONSE_SIZE
        # answers that a commit id fixes for good (a tree entry, a blob, a path's last
        # commit at that commit): git objects never change, so each is asked of git once,
        # as Gitea's own last-commit cache does; a double is there to be fast
        self._fixed: dict[tuple[str, ...], Any] = {}
        self._fault_lock = threading.Lock()
        self.server = LoopbackServer(self._handle)

    @property
    def url(self) -> str:
        return self.server.url

    def add_repo(self, slug: str, bare: Path) -> None:
        """Serve one more bare repository as ``slug``."""
        self.repos[slug] = bare
        self.hooks.setdefault(slug, {})

    def add_token(self, scopes: Iterable[str] | None = None, *, member: bool = True) -> str:
        """A new token, of ``scopes`` (None: every scope); its user, unless ``member``,
        sees none of the double's repositories."""
        token = f"double-token-{len(self.grants) + 1:04x}"
        self.grants[token] = Grant(None if scopes is None else set(scopes), member=member)
        return token

    def start(self) -> GiteaDouble:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    # ----------------------------------------------------------------- dispatch

    def _handle(self, request: Request) -> tuple[int, Any]:
        self.requests.append(request)
        if self.latency:
            time.sleep(self.latency)  # each request pays it, concurrently, as on a network
        fault = self._take_fault(request.method)
        if fault == "drop":
            return DROP
        if isinstance(fault, tuple) and fault[0] == "slow":
            time.sleep(fault[1])
        elif isinstance(fault, int):
            return fault, {"message": "injected fault", "url": self.url}
        base = self.swagger.base_path
        if not request.path.startswith(base + "/"):
            return 404, None
        path = request.path[len(base) :]
        try:
            self.swagger.check_request(request.method, unquote(path), request.query, request.json())
            status, body, *headers = self._route(request, path)
            self.swagger.check_answer(request.method, unquote(path), status, body)
        except SpecViolation as violation:
            self.violations.append(str(violation))
            return 500, {"message": f"double: {violation}", "url": self.url}
        if fault == "lost":
            return DROP
        return status, body, *headers

    def _take_fault(self, method: str) -> Any:
        with self._fault_lock:
            for index, (wanted, fault) in enumerate(self.faults):
                if wanted in ("*", method):
                    del self.faults[index]
                    return fault
        return None

    def _error(self, status: int, message: str) -> tuple[int, dict[str, Any]]:
        """An APIError, as Gitea answers one. The message of a 500 is shown to a site
        admin only (APIErrorInternal), and the double's tokens are no admin's: it is
        written here to say what failed, and sent empty."""
        shown = "" if status == 500 else message
        return status, {"message": shown, "url": f"{self.url}/api/swagger"}

    def _not_found(self, message: str = "not found") -> tuple[int, dict[str, Any]]:
        return self._error(404, message)

    @staticmethod
    def _token(request: Request) -> str | None:
        """The token of ``Authorization: token …`` or ``Bearer …`` (any case), as Gitea's
        httpauth.ParseAuthorizationHeader reads it."""
        parts = request.headers.get("authorization", "").split()
        if len(parts) == 2 and parts[0].lower() in ("token", "bearer"):
            return parts[1]
        return None

    def _grant(self, request: Request) -> Grant | None:
        """What the request's token may do; None for a token Gitea does not know. No
        token at all is anonymous: it sees no repository, since the double's are private."""
        token = self._token(request)
        if self.token is None or token == self.token:
            return Grant(self.scopes, self.hidden)
        if token is None:
            return Grant(member=False)
        return self.grants.get(token)

    @staticmethod
    def _scope_refusal(scopes: set[str] | None, method: str) -> str | None:
        """Gitea's tokenRequiresScopes for the repository category: a read needs
        read:repository (or write:), a POST, PUT, PATCH or DELETE needs write:repository."""
        if scopes is None or "all" in scopes:
            return None
        level = "read" if method == "GET" else "write"
        allowed = {"write:repository"} | ({"read:repository"} if level == "read" else set())
        if scopes & allowed:
            return None
        return (
            "token does not have at least one of required scope(s), "
            f"required=[{level}:repository], token scope={','.join(sorted(scopes))}"
        )

    def _route(self, request: Request, path: str) -> tuple[int, Any]:
        grant = self._grant(request)
        if grant is None:
            return self._error(401, "invalid username, password or token")
        refused = self._scope_refusal(grant.scopes, request.method)
        if refused:
            return self._error(403, refused)
        named = re.match(r"/repos/([^/]+)/([^/]+)", path)
        if named and (f"{named[1]}/{named[2]}" in grant.hidden or not grant.member):
            return self._not_found()
        if path == "/repos/migrate" and request.method == "POST":
            return self._migrate(request.json())
        whole = re.fullmatch(r"/repos/([^/]+)/([^/]+)(/mirror-sync)?", path)
        if whole and f"{whole[1]}/{whole[2]}" in self.repos:
            if request.method == "GET" and not whole[3]:
                return 200, self._repository(f"{whole[1]}/{whole[2]}")
            raise SpecViolation(f"{request.method} {path}: not served by the double")
        if whole and f"{whole[1]}/{whole[2]}" not in self.repos:
            return self._mirror_repo(
                f"{whole[1]}/{whole[2]}", request.method, bool(whole[3]), request.json()
            )
        match = re.fullmatch(r"/repos/([^/]+)/([^/]+)/(.+)", path)
        if not match or f"{match[1]}/{match[2]}" not in self.repos:
            return self._not_found()
        repo = f"{match[1]}/{match[2]}"
        rest, method = match[3], request.method
        if method == "GET" and rest.startswith("branches/"):
            return self._branch(repo, unquote(rest[len("branches/") :]))
        if method == "DELETE" and rest.startswith("branches/"):
            return self._delete_branch(repo, unquote(rest[len("branches/") :]))
        if rest == "pulls" and method == "GET":
            return self._list_pulls(request, repo)
        by_branches = re.fullmatch(r"pulls/([^/]+)/(.+)", rest)
        if by_branches and method == "GET" and not by_branches[1].isdigit():
            return self._pull_by_branches(repo, unquote(by_branches[1]), unquote(by_branches[2]))
        if rest == "pulls" and method == "POST":
            return self._create_pull(repo, request.json())
        pull = re.fullmatch(r"pulls/(\d+)(/merge)?", rest)
        if pull and method == "GET" and not pull[2]:
            return self._get_pull(repo, int(pull[1]))
        if pull and method == "PATCH" and not pull[2]:
            return self._edit_pull(repo, int(pull[1]), request.json())
        if pull and method == "POST" and pull[2]:
            return self._merge_pull(repo, int(pull[1]), request.json())
        if pull and method == "DELETE" and pull[2]:
            return self._cancel_merge(repo, int(pull[1]))
        if rest.startswith("contents/"):
            file_path = unquote(rest[len("contents/") :])
            if method == "GET":
                return self._get_contents(repo, file_path, request.query.get("ref"))
            if method in ("PUT", "POST"):
                return self._write_contents(
                    repo, file_path, request.json(), create=method == "POST"
                )
        if rest == "contents" and method == "POST":
            return self._change_files(repo, request.json())
        if rest == "file-contents" and method == "POST":
            return self._file_contents(repo, request.query.get("ref"), request.json())
        if method == "GET" and rest.startswith("git/commits/"):
            return self._commit(repo, unquote(rest[len("git/commits/") :]), request.query)
        if method == "GET" and rest.startswith("compare/"):
            return self._compare(repo, unquote(rest[len("compare/") :]))
        if method == "GET" and rest == "commits":
            return self._commits(repo, request)
        if rest == "hooks" and method in ("GET", "POST"):
            if method == "GET":
                return self._list_hooks(repo)
            return self._create_hook(repo, request.json())
        status = re.fullmatch(r"statuses/([^/]+)|commits/([^/]+)/(status|statuses)", rest)
        if status and (status[1] or status[2]):
            ref = unquote(status[1] or status[2])
            if method == "POST" and status[1]:
                return self._create_status(repo, ref, request.json())
            if method == "GET":
                if status[3] == "status":
                    return self._combined_status(request, repo, ref)
                return self._list_statuses(request, repo, ref)
        hook = re.fullmatch(r"hooks/(\d+)", rest)
        if hook and method in ("GET", "PATCH", "DELETE"):
            return self._hook(repo, int(hook[1]), method, request.json())
        raise SpecViolation(f"{method} {path}: declared by Gitea, not served by the double")

    # -------------------------------------------------------------------- reads

    def _bare(self, repo: str) -> Path:
        return self.repos[repo]

    def _resolve(self, repo: str, ref: str) -> str | None:
        try:
            return git(self._bare(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        except subprocess.CalledProcessError:
            return None

    def _default_branch(self, repo: str) -> str:
        return git(self._bare(repo), "symbolic-ref", "--short", "HEAD")

    def _branch(self, repo: str, branch: str) -> tuple[int, Any]:
        sha = self._resolve(repo, f"refs/heads/{branch}")
        if sha is None:
            return self._not_found()
        return 200, {
            "name": branch,
            "commit": self._payload_commit(repo, sha),
            "protected": False,
            "required_approvals": 0,
            "enable_status_check": False,
            "status_check_contexts": [],
            "user_can_push": True,
            "user_can_merge": True,
            "effective_branch_protection_name": "",
        }

    def _payload_commit(self, repo: str, sha: str) -> dict[str, Any]:
        """A branch's head as Gitea's ToPayloadCommit shows it: the lists of files are
        never filled (null), the verification is the commit's, and a person's username is
        empty when no Gitea user has that email (the double has none)."""
        bare = self._bare(repo)
        an, ae, cn, ce, date, message = git(
            bare, "log", "-1", "--format=%an%x00%ae%x00%cn%x00%ce%x00%cI%x00%B", sha
        ).split("\x00")
        return {
            "id": sha,
            "message": message.strip() + "\n",
            "url": f"{self.url}/{repo}/commit/{sha}",
            "author": {"name": an, "email": ae, "username": ""},
            "committer": {"name": cn, "email": ce, "username": ""},
            "verification": UNSIGNED,
            "timestamp": date,
            "added": None,
            "removed": None,
            "modified": None,
        }

    def _once(self, key: tuple[str, ...], answer: Callable[[], Any]) -> Any:
        """``answer()``, asked once for ``key``: what a commit id or a blob id fixes."""
        if key not in self._fixed:
            self._fixed[key] = answer()
        return self._fixed[key]

    def _at(self, repo: str, *args: str) -> str:
        """``git *args`` in ``repo``, where ``args`` name a commit id or a blob id: the same
        answer for ever, so asked once."""
        bare = self._bare(repo)
        return str(self._once((str(bare), *args), lambda: git(bare, *args)))

    def _blob_data(self, repo: str, blob: str) -> bytes:
        bare = self._bare(repo)
        command = ["git", "-C", str(bare), "cat-file", "blob", blob]
        return bytes(
            self._once(
                (str(bare), "blob", blob),
                lambda: subprocess.run(command, capture_output=True, check=True).stdout,
            )
        )

    def _blob(self, repo: str, commit: str, file_path: str) -> tuple[str, str] | None:
        listed = self._at(repo, "ls-tree", commit, "--", file_path)
        if not listed or listed.split()[1] != "blob":
            return None
        return listed.split()[2], listed.split()[0]

    def _contents(self, repo: str, commit: str, file_path: str) -> dict[str, Any] | None:
        found = self._blob(repo, commit, file_path)
        if found is None:
            return None
        blob, _ = found
        data = self._blob_data(repo, blob)
        entry = self._entry(repo, commit, file_path, "file", blob, len(data))
        if len(data) <= self.max_blob_size:  # GetBlobBySHA: above it, neither is sent
            entry["encoding"] = "base64"
            entry["content"] = base64.b64encode(data).decode("ascii")
        return entry

    def _entry(
        self, repo: str, commit: str, file_path: str, kind: str, sha: str, size: int
    ) -> dict[str, Any]:
        """A ContentsResponse without content: what GetContents lists of an entry (of a
        directory, a symlink, or a file before its content is added)."""
        last = self._at(
            repo, "log", "-1", "--format=%H%x00%aI%x00%cI", commit, "--", file_path
        ).split("\x00")
        url = f"{self.url}/api/v1/repos/{repo}/contents/{file_path}?ref={commit}"
        html = f"{self.url}/{repo}/src/commit/{commit}/{file_path}"
        git_url = (
            f"{self.url}/api/v1/repos/{repo}/git/{'trees' if kind == 'dir' else 'blobs'}/{sha}"
        )
        return {
            "name": file_path.rsplit("/", 1)[-1],
            "path": file_path,
            "sha": sha,
            "last_commit_sha": last[0],
            "last_committer_date": last[2],
            "last_author_date": last[1],
            "type": kind,
            "size": size,
            "encoding": None,
            "content": None,
            "target": None,
            "url": url,
            "html_url": html,
            "git_url": git_url,
            # a file's or a symlink's only (getFileContentsByEntryInternal)
            "download_url": None
            if kind in ("dir", "submodule")
            else f"{self.url}/{repo}/raw/commit/{commit}/{file_path}",
            "submodule_git_url": None,
            "_links": {"self": url, "git": git_url, "html": html},
        }

    def _get_contents(self, repo: str, file_path: str, ref: str | None) -> tuple[int, Any]:
        """GetContentsOrList: a directory answers 200 with the list of its entries, a
        symlink 200 with ``type: symlink`` and its target, a file its content."""
        ref = ref or self._default_branch(repo)
        commit = self._resolve(repo, ref)
        if commit is None:
            return self._not_found(NO_OBJECT.format(id=ref, path=""))
        listed = self._at(repo, "ls-tree", "-l", commit, "--", file_path.rstrip("/"))
        if listed and listed.split()[1] == "tree":
            entries = git(
                self._bare(repo), "ls-tree", "-l", commit, "--", file_path.rstrip("/") + "/"
            )
            return 200, [self._listed(repo, commit, line) for line in entries.splitlines()]
        found = self._file_entry(repo, commit, file_path)
        if found is None:
            return self._not_found(NO_OBJECT.format(id="", path=file_path))
        return 200, found

    def _file_entry(self, repo: str, commit: str, file_path: str) -> dict[str, Any] | None:
        """GetFileContents: the entry of whatever ``file_path`` is (a file with its
        content, a symlink with its target, a directory without its entries), or None."""
        listed = self._at(repo, "ls-tree", "-l", commit, "--", file_path.rstrip("/"))
        if not listed:
            return None
        if listed.split()[0] == "120000":
            entry = self._listed(repo, commit, listed)
            entry["target"] = git(self._bare(repo), "cat-file", "blob", listed.split()[2])
            return entry
        if listed.split()[1] != "blob":
            return self._listed(repo, commit, listed)
        return self._contents(repo, commit, file_path)

    def _contents_list(self, repo: str, commit: str, paths: list[str]) -> list[Any]:
        """GetContentsListFromTreePaths: an entry for each path, null for one it cannot
        read; it stops after FILES_PAGE entries, and before the one whose content takes
        the answer past ``max_response_size``."""
        entries: list[Any] = []
        size = 0
        for file_path in paths:
            entry = self._file_entry(repo, commit, file_path)
            size += len((entry or {}).get("content") or "")
            if size > self.max_response_size:
                break
            entries.append(entry)
            if len(entries) == FILES_PAGE:
                break
        return entries

    def _file_contents(self, repo: str, ref: str | None, body: Any) -> tuple[int, Any]:
        """GetFileContentsPost: the entries of the files asked, at ``ref``."""
        ref = ref or self._default_branch(repo)
        commit = self._resolve(repo, ref)
        if commit is None:
            return self._not_found(NO_OBJECT.format(id=ref, path=""))
        return 200, self._contents_list(repo, commit, list((body or {}).get("files") or []))

    def _listed(self, repo: str, commit: str, line: str) -> dict[str, Any]:
        """The entry of one ``git ls-tree -l`` line."""
        meta, path = line.split("\t", 1)
        mode, kind, sha, size = meta.split()
        kinds = {"tree": "dir", "commit": "submodule"}
        shown = "symlink" if mode == "120000" else kinds.get(kind, "file")
        return self._entry(repo, commit, path, shown, sha, 0 if size == "-" else int(size))

    def _commit(self, repo: str, ref: str, query: dict[str, str]) -> tuple[int, Any]:
        """GetSingleCommit: a ref that cannot be one is 422; any other that names no
        commit (a branch, a tag, a short sha: git resolves it) is 404."""
        if INVALID_REF.search(ref):
            return self._error(422, f"no valid ref or sha: {ref}")
        sha = self._resolve(repo, ref)
        if sha is None:
            return self._not_found(f"commit doesn't exist: {ref}")
        return 200, self._api_commit(repo, sha, **self._commit_options(query))

    @staticmethod
    def _commit_options(query: dict[str, str]) -> dict[str, bool]:
        """ParseCommitOptions: stat, files and verification, each true unless given false."""
        return {
            key: query.get(key, "") == "" or query[key] == "true"
            for key in ("stat", "files", "verification")
        }

    def _api_commit(
        self,
        repo: str,
        sha: str,
        *,
        stat: bool = True,
        files: bool = True,
        verification: bool = True,
    ) -> dict[str, Any]:
        return self._api_commits(repo, [sha], stat=stat, files=files, verification=verification)[0]

    def _api_commits(
        self,
        repo: str,
        shas: list[str],
        *,
        stat: bool = True,
        files: bool = True,
        verification: bool = True,
    ) -> list[dict[str, Any]]:
        """Gitea ``Commit`` objects for ``shas``, read with one ``git log`` (and one more
        for the stats). What was not asked for is null, as are ``author`` and
        ``committer``: no Gitea user has the email (the double has no users)."""
        if not shas:
            return []
        fmt = "%x02%H%x00%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%P%x00%B%x00"
        args = ["log", "--no-walk=unsorted", f"--format={fmt}"]
        # a merge's files are those it changed against its first parent (Gitea's
        # GetCommitFileStatus: `git log --name-status -m --first-parent --no-renames -1`)
        args += ["--name-status", "--no-renames", "--diff-merges=first-parent"] if files else []
        out = git(self._bare(repo), *args, *shas)
        stats = self._stats(repo, shas) if stat else {}
        statuses = {"A": "added", "M": "modified", "D": "removed"}
        commits = []
        for record in out.split("\x02")[1:]:
            sha, an, ae, ad, cn, ce, cd, parents, message, changed = record.split("\x00")
            url = f"{self.url}/api/v1/repos/{repo}/git/commits/{sha}"
            commits.append(
                {
                    "url": url,
                    "sha": sha,
                    "created": cd,
                    "html_url": f"{self.url}/{repo}/commit/{sha}",
                    "commit": {
                        "url": url,
                        "author": {"name": an, "email": ae, "date": ad},
                        "committer": {"name": cn, "email": ce, "date": cd},
                        "message": message.strip() + "\n",
                        # Gitea names the commit's own id as its tree's (ToCommit)
                        "tree": {
                            "url": f"{self.url}/api/v1/repos/{repo}/git/trees/{sha}",
                            "sha": sha,
                            "created": cd,
                        },
                        "verification": UNSIGNED if verification else None,
                    },
                    "author": None,
                    "committer": None,
                    "parents": [
                        {
                            "url": f"{self.url}/api/v1/repos/{repo}/git/commits/{p}",
                            "sha": p,
                            "created": "0001-01-01T00:00:00Z",
                        }
                        for p in parents.split()
                    ],
                    "files": (
                        [
                            {
                                "filename": line.split("\t", 1)[1],
                                "status": statuses.get(line[0], "modified"),
                            }
                            for line in changed.splitlines()
                            if "\t" in line
                        ]
                        if files
                        else None
                    ),
                    "stats": stats.get(sha),
                }
            )
        return commits

    def _stats(self, repo: str, shas: list[str]) -> dict[str, dict[str, int]]:
        """GetDiffShortStat of each commit against its first parent."""
        out = git(
            self._bare(repo),
            *("log", "--no-walk=unsorted", "--format=%x02%H", "--numstat"),
            *("--no-renames", "--diff-merges=first-parent", *shas),
        )
        found = {}
        for record in out.split("\x02")[1:]:
            sha, *lines = record.strip().splitlines()
            counts = [line.split("\t")[:2] for line in lines if line.strip()]
            added = sum(int(a) for a, _ in counts if a != "-")
            deleted = sum(int(d) for _, d in counts if d != "-")
            found[sha] = {"total": added + deleted, "additions": added, "deletions": deleted}
        return found

    def _compare(self, repo: str, basehead: str) -> tuple[int, Any]:
        if "..." not in basehead:
            return self._error(400, "invalid compare")
        base, head = basehead.split("...", 1)
        base_sha, head_sha = self._resolve(repo, base), self._resolve(repo, head)
        for ref, sha in ((base, base_sha), (head, head_sha)):
            if sha is None:
                return self._not_found(f'ref "{ref}" does not exist')
        # GetCompareInfo (modules/git/repo_compare.go): when `git merge-base` fails (no
        # common history), Gitea lists no commit and answers 200 all the same
        found = subprocess.run(
            ["git", "-C", str(self._bare(repo)), "merge-base", base_sha, head_sha],
            capture_output=True,
            text=True,
            check=False,
        )
        merge_base = found.stdout.strip()
        shas = (
            git(self._bare(repo), "rev-list", f"{merge_base}..{head_sha}").split()
            if found.returncode == 0
            else []
        )
        # CompareDiff lists every commit with its stats, files and verification
        return 200, {"total_commits": len(shas), "commits": self._api_commits(repo, shas)}

    default_page_size = 30  # [api] DEFAULT_PAGING_NUM
    commits_range_size = 50  # [git] COMMITS_RANGE_SIZE: the page of a listing by path

    def _commits(self, repo: str, request: Request) -> tuple[Any, ...]:
        """GetAllCommits: with ``path``, a page holds COMMITS_RANGE_SIZE commits whatever
        ``limit`` says, while the paging headers count pages of ``limit``; no commit
        touching ``path`` is a 404. A revision git cannot read is a 500 (git failed)."""
        query = request.query
        path = query.get("path")
        per_page = min(int(query.get("limit") or self.default_page_size), self.commits_range_size)
        page = max(1, int(query.get("page") or 1))
        named = query.get("sha") or self._default_branch(repo)
        start = self._resolve(repo, named)
        excluded = self._resolve(repo, query["not"]) if query.get("not") else None
        if start is None and not path:  # GetCommit(sha): APIErrorAuto
            return self._not_found(NO_OBJECT.format(id=named, path=""))
        for ref, sha in ((named, start), (query.get("not"), excluded)):
            if ref and sha is None:  # git rev-list failed, and Gitea says how
                bad = (
                    f"bad object {ref}"
                    if re.fullmatch(r"[0-9a-f]{40,64}", ref)
                    else (f"bad revision '{ref}'")
                )
                return self._error(500, f"exit status 128 - fatal: {bad}")
        args = ["rev-list", str(start), *([f"^{excluded}"] if excluded else [])]
        shas = git(self._bare(repo), *args, *(["--", path] if path else [])).split()
        if path and not shas:  # commitsCountTotal == 0
            return self._not_found()
        size = self.commits_range_size if path else per_page
        chunk = shas[(page - 1) * size : page * size]
        commits = self._api_commits(repo, chunk, **self._commit_options(query))
        pages = -(-len(shas) // per_page)
        headers = {
            "Link": self._links(request, page, pages),
            "X-Total-Count": str(len(shas)),
            "X-Page": str(page),
            "X-PerPage": str(per_page),
            "X-Total": str(len(shas)),
            "X-PageCount": str(pages),
            "X-HasMore": "true" if page < pages else "false",
        }
        return 200, commits, {k: v for k, v in headers.items() if v}

    def _links(self, request: Request, page: int, pages: int) -> str:
        """Gitea's Link header (genAPILinks): next, last, first, prev, as they apply."""

        def at(number: int) -> str:
            query = urlencode({**request.query, "page": str(number)})
            return f"<{self.url}{request.path}?{query}>"

        links = []
        if page < pages:
            links.append(f'{at(page + 1)}; rel="next"')
            links.append(f'{at(pages)}; rel="last"')
        if page > 1:
            links.append(f'{at(1)}; rel="first"')
            links.append(f'{at(page - 1)}; rel="prev"')
        return ",".join(links)

    # ------------------------------------------------------------------ mirrors

    def _repository(self, slug: str) -> dict[str, Any]:
        """A Repository as Gitea's ToRepo shows it to its admin: a repository of the
        double's, or a mirror that a migration made."""
        owner, name = slug.split("/")
        mirror = self.mirrors.get(slug)
        now = "2026-12-02T10:00:00Z"
        never = "0001-01-01T00:00:00Z"
        ids = list(self.repos)
        return {
            "id": mirror["id"] if mirror else ids.index(slug) + 1,
            "owner": {**USER, "id": 2, "login": owner, "email": "", "username": owner},
            "name": name,
            "full_name": slug,
            "description": "",
            "empty": bool(mirror and mirror.get("empty")),
            "private": True,
            "fork": False,
            "template": False,
            "mirror": mirror is not None,
            "size": 0,
            "language": "",
            "languages_url": f"{self.url}/api/v1/repos/{slug}/languages",
            "html_url": f"{self.url}/{slug}",
            "url": f"{self.url}/api/v1/repos/{slug}",
            "link": "",
            "ssh_url": f"git@localhost:{slug}.git",
            "clone_url": f"{self.url}/{slug}.git",
            "original_url": mirror["source"] if mirror else "",
            "website": "",
            "stars_count": 0,
            "forks_count": 0,
            "watchers_count": 1,
            "branch_count": 0 if mirror else 1,
            "open_issues_count": 0,
            "open_pr_counter": 0,
            "release_counter": 0,
            "default_branch": "main",
            "archived": False,
            "created_at": now,
            "updated_at": now,
            "archived_at": "1970-01-01T00:00:00Z",
            "permissions": {"admin": True, "push": True, "pull": True},
            "has_code": True,
            "has_issues": True,
            "internal_tracker": {
                "enable_time_tracker": True,
                "allow_only_contributors_to_track_time": True,
                "enable_issue_dependencies": True,
            },
            "has_wiki": True,
            "has_pull_requests": True,
            "has_projects": True,
            "projects_mode": "all",
            "has_releases": True,
            "has_packages": True,
            "has_actions": False,
            "ignore_whitespace_conflicts": False,
            "allow_merge_commits": True,
            "allow_rebase": True,
            "allow_rebase_explicit": True,
            "allow_squash_merge": True,
            "allow_fast_forward_only_merge": True,
            "allow_merge_update": True,
            "allow_rebase_update": True,
            "allow_manual_merge": False,
            "autodetect_manual_merge": False,
            "default_delete_branch_after_merge": False,
            "default_merge_style": "merge",
            "default_update_style": "merge",
            "default_allow_maintainer_edit": True,
            "avatar_url": "",
            "internal": False,
            "mirror_interval": mirror["interval"] if mirror else "",
            "object_format_name": "sha1",
            "mirror_updated": never,
            "mirror_last_sync_at": never,
            "topics": [],
            "licenses": [],
        }

    @staticmethod
    def _seconds(interval: str) -> int:
        return sum(
            int(n) * {"h": 3600, "m": 60, "s": 1}[u]
            for n, u in re.findall(r"(\d+)([hms])", interval)
        )

    @staticmethod
    def _duration(seconds: int) -> str:
        """Go's Duration.String: 10m0s, 8h0m0s, 30s."""
        hours, rest = divmod(seconds, 3600)
        minutes, secs = divmod(rest, 60)
        if hours:
            return f"{hours}h{minutes}m{secs}s"
        return f"{minutes}m{secs}s" if minutes else f"{secs}s"

    def _migrate(self, body: dict[str, Any]) -> tuple[int, Any]:
        slug = f"{body.get('repo_owner')}/{body['repo_name']}"
        if slug in self.mirrors or slug in self.repos:
            return self._error(409, "The repository with the same name already exists.")
        seconds = self._seconds(body.get("mirror_interval", "8h"))
        record = {
            "id": 100 + len(self.mirrors),
            "interval": self._duration(seconds),
            "source": body["clone_addr"],
            "syncs": 0,
            "empty": False,
        }
        self.mirrors[slug] = record
        if seconds and seconds < MIRROR_MIN_SECONDS:
            # MigrateRepository fails after the repository was made, and leaves it: an
            # empty mirror with no interval
            record.update(interval="", empty=True)
            return self._error(
                500,
                f"interval {self._duration(seconds)} is set below Minimum Interval of "
                f"{self._duration(MIRROR_MIN_SECONDS)}",
            )
        return 201, self._repository(slug)

    def _mirror_repo(self, slug: str, method: str, sync: bool, body: Any) -> tuple[int, Any]:
        record = self.mirrors.get(slug)
        if record is None:
            return self._not_found()
        if sync and method == "POST":
            record["syncs"] += 1
            return 200, None
        if method == "GET" and not sync:
            return 200, self._repository(slug)
        if method == "PATCH" and not sync:
            if "mirror_interval" in body:
                seconds = self._seconds(body["mirror_interval"])
                if seconds and seconds < MIRROR_MIN_SECONDS:
                    return self._error(
                        422,
                        f"invalid mirror interval: {self._duration(seconds)} is below "
                        f"minimum interval: {self._duration(MIRROR_MIN_SECONDS)}",
                    )
                record["interval"] = self._duration(seconds)
            return 200, self._repository(slug)
        raise SpecViolation(f"{method} {slug}: not served by the double")

    # -------------------------------------------------------------------- hooks

    def _hook_view(self, repo: str, hook: dict[str, Any]) -> dict[str, Any]:
        """ToHook: config holds the url and the content type only, and the authorization
        header is never returned (""), like the secret."""
        return {**hook, "config": dict(hook["config"]), "authorization_header": ""}

    def _list_hooks(self, repo: str) -> tuple[Any, ...]:
        hooks = [self._hook_view(repo, h) for h in self.hooks[repo].values()]
        return 200, hooks, {"X-Total-Count": str(len(hooks))}

    def _create_hook(self, repo: str, body: dict[str, Any]) -> tuple[int, Any]:
        config = dict(body["config"])
        for key in ("content_type", "url"):
            if not config.get(key):
                return self._error(422, f"Missing config option: {key}")
        hook_id, self._next_hook = self._next_hook, self._next_hook + 1
        now = "2026-12-02T10:00:00Z"
        self.hook_secrets[(repo, hook_id)] = config.get("secret", "")
        self.hook_headers[(repo, hook_id)] = body.get("authorization_header", "")
        self.hook_methods[(repo, hook_id)] = config.get("http_method", "post")
        self.hooks[repo][hook_id] = {
            "id": hook_id,
            "name": body.get("name", ""),
            "type": body["type"],
            "branch_filter": body.get("branch_filter", "*"),
            "config": {"content_type": config["content_type"], "url": config["url"]},
            "events": body.get("events") or ["push"],
            "active": bool(body.get("active", False)),
            "updated_at": now,
            "created_at": now,
        }
        return 201, self._hook_view(repo, self.hooks[repo][hook_id])

    def _hook(self, repo: str, hook_id: int, method: str, body: Any) -> tuple[int, Any]:
        hook = self.hooks[repo].get(hook_id)
        if hook is None:
            return self._not_found()
        if method == "GET":
            return 200, self._hook_view(repo, hook)
        if method == "DELETE":
            del self.hooks[repo][hook_id]
            return 204, None
        # editHook: the events, the branch filter and the authorization header are set
        # from the form whatever it holds (omitted: push only, "", ""); active and the
        # config keys only when given
        hook["events"] = body.get("events") or ["push"]
        hook["branch_filter"] = body.get("branch_filter", "")
        self.hook_headers[(repo, hook_id)] = body.get("authorization_header", "")
        for key in ("active", "name"):
            if key in body:
                hook[key] = body[key]
        if "config" in body:
            # editHook takes only the url and the content type of config: a secret sent
            # there is ignored, and the one stored stays
            config = {k: v for k, v in body["config"].items() if k in ("url", "content_type")}
            hook["config"].update(config)
        hook["updated_at"] = "2026-12-02T10:00:01Z"
        return 200, self._hook_view(repo, hook)

    # ----------------------------------------------------------------- statuses

    def _create_status(self, repo: str, sha: str, body: dict[str, Any]) -> tuple[int, Any]:
        commit = self._resolve(repo, sha) if re.fullmatch(r"[0-9a-f]{4,64}", sha) else None
        if commit is None:  # CreateCommitStatus: GetCommit fails, answered as any error
            return self._error(500, f"GetCommit[{sha}]: " + NO_OBJECT.format(id=sha, path=""))
        with self._write_lock:
            stored = self.statuses.setdefault((repo, commit), [])
            # the time of the post, as Gitea stamps it (a verification's timeout counts
            # from its pending status)
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            status = {
                "id": len(stored) + 1,  # Gitea numbers statuses per commit
                "status": body["state"],
                "target_url": body.get("target_url") or "",
                "description": (body.get("description") or "").strip(),
                "url": f"{self.url}/api/v1/repos/{repo}/statuses/{commit}",
                "context": (body.get("context") or "default").strip(),
                "creator": USER,
                "created_at": now,
                "updated_at": now,
            }
            stored.append(status)
        if status["status"] == "success":  # services/automerge: a success may merge one
            self._auto_merge(repo)
        return 201, status

    def latest_statuses(self, repo: str, sha: str) -> list[dict[str, Any]]:
        """The newest status of each context, the most recently updated context first
        (GetLatestCommitStatus: ``max(id) desc``, the order it pages by)."""
        latest: dict[str, dict[str, Any]] = {}
        for status in self.statuses.get((repo, sha), []):
            latest[status["context"]] = status
        return sorted(latest.values(), key=lambda s: s["id"], reverse=True)

    @staticmethod
    def combine(states: list[str]) -> str:
        """CommitStatusStates.Combine: failure if any is error, failure or warning;
        success if every one is success or skipped; else pending (and with none)."""
        if any(state in ("error", "failure", "warning") for state in states):
            return "failure"
        if states and all(state in ("success", "skipped") for state in states):
            return "success"
        return "pending"

    max_response_items = 50  # [api] MAX_RESPONSE_ITEMS: no page holds more

    def _page(self, request: Request, every: list[Any]) -> tuple[list[Any], dict[str, str]]:
        """The page of ``every`` that the request asks for, and its paging headers. The
        limit is read as utils.GetListOptions reads it: 0 or none is DEFAULT_PAGING_NUM,
        above MAX_RESPONSE_ITEMS it is that (ToCorrectPageSize)."""
        limit = int(request.query.get("limit") or 0)
        limit = self.default_page_size if limit <= 0 else min(limit, self.max_response_items)
        page = max(1, int(request.query.get("page") or 1))
        pages = -(-len(every) // limit)
        headers = {"X-Total-Count": str(len(every)), "Link": self._links(request, page, pages)}
        return every[(page - 1) * limit : page * limit], {k: v for k, v in headers.items() if v}

    def _combined_status(self, request: Request, repo: str, ref: str) -> tuple[Any, ...]:
        """GetCombinedCommitStatusByRef: a page of the latest status of each context, the
        most recently updated first, listed on the page in the order they were stored
        (the second query names the page's ids and sets no order); its state and
        ``total_count`` are the page's, X-Total-Count counts every context."""
        sha = self._resolve(repo, ref)
        if sha is None:
            return self._not_found(NO_OBJECT.format(id=ref, path=""))
        every = self.latest_statuses(repo, sha)
        chunk, headers = self._page(request, every)
        latest = sorted(chunk, key=lambda s: s["id"])
        return (
            200,
            {
                "state": self.combine([s["status"] for s in latest]),
                "sha": sha,
                "total_count": len(latest),
                "statuses": latest or None,  # ToCombinedStatus leaves it nil with none
                "repository": self._repository(repo),
                "commit_url": f"{self.url}/api/v1/repos/{repo}/commits/{sha}",
                "url": f"{self.url}/api/v1/repos/{repo}/commits/{sha}/status",
            },
            headers,
        )

    def _list_statuses(self, request: Request, repo: str, ref: str) -> tuple[Any, ...]:
        """GetCommitStatuses: every status posted, newest first, a page at a time."""
        sha = self._resolve(repo, ref)
        if sha is None:
            return self._not_found(NO_OBJECT.format(id=ref, path=""))
        every = list(reversed(self.statuses.get((repo, sha), [])))  # newest first
        if request.query.get("state"):
            every = [s for s in every if s["status"] == request.query["state"]]
        return (200, *self._page(request, every))

    # ------------------------------------------------------------------- writes

    def _write_contents(
        self, repo: str, file_path: str, body: dict[str, Any], *, create: bool
    ) -> tuple[int, Any]:
        """CreateFile (POST) and UpdateFile (PUT: an update if it names a sha, else a
        creation): ChangeRepoFiles of one file, answered with that file."""
        create = create or not body.get("sha")
        change = {"operation": "create" if create else "update", "path": file_path}
        change |= {"content": body.get("content", ""), "sha": body.get("sha")}
        written = self._change_repo_files(repo, body, [change])
        if isinstance(written, tuple):
            return written
        return (201 if create else 200), {
            "content": self._contents(repo, written, file_path),
            "commit": self._file_commit(repo, written),
            "verification": UNSIGNED,
        }

    def _change_files(self, repo: str, body: dict[str, Any]) -> tuple[int, Any]:
        """ChangeFiles: every operation of ``files`` in one commit, answered with the
        entries of those files (as file-contents lists them) and the commit."""
        files = list(body.get("files") or [])
        if any(f.get("operation") not in ("create", "update") for f in files):
            raise SpecViolation("POST contents: the double serves create and update only")
        written = self._change_repo_files(repo, body, files)
        if isinstance(written, tuple):
            return written
        return 201, {
            "files": self._contents_list(repo, written, [f["path"] for f in files]),
            "commit": self._file_commit(repo, written),
            "verification": UNSIGNED,
        }

    def _change_repo_files(
        self, repo: str, body: dict[str, Any], files: list[dict[str, Any]]
    ) -> str | tuple[int, Any]:
        """ChangeRepoFiles, as Gitea runs it: no lock. It checks each file on the tip it
        read, in order, commits them all in a temporary clone and pushes; a tip that
        moved in between makes the push fail (ErrPushOutOfDate), which the API answers
        500. An update looks up what it replaces first (gone: 404; another sha, even a
        directory's: 422), then the path; a creation the path first, then whether
        something is there. The commit made, or the error answer."""
        updates = any(f.get("operation") == "update" for f in files)
        if updates and self._random.random() < self.race_rate:
            self.races += 1
            return self._error(422, "sha does not match [injected race]")
        branch = body.get("branch") or self._default_branch(repo)
        onto = body.get("new_branch") or None  # the commit goes there, made on branch's tip
        if onto and self._resolve(repo, f"refs/heads/{onto}") and not body.get("force_push"):
            return self._error(422, f"branch already exists [name: {onto}]")
        for change in files:
            refused = self._protection(repo, onto or branch, change["path"])
            if refused:
                return self._error(403, refused)
        tip = self._resolve(repo, f"refs/heads/{branch}")
        if tip is None:
            repo_id = list(self.repos).index(repo) + 1
            return self._not_found(f"branch does not exist [repo_id: {repo_id} name: {branch}]")
        written: list[tuple[str, bytes, str]] = []
        for change in files:
            file_path = change["path"]
            if change["operation"] == "update":
                listed = git(self._bare(repo), "ls-tree", tip, "--", file_path)
                if not listed:
                    return self._not_found(NO_OBJECT.format(id="", path=file_path))
                given, expected = change.get("sha"), listed.split()[2]
                if given and given != expected:  # no sha: nothing to check it against
                    return self._error(
                        422, f"sha does not match [given: {given}, expected: {expected}]"
                    )
            invalid = self._invalid_path(repo, tip, file_path)
            if invalid:
                return self._error(422, invalid)
            current = self._blob(repo, tip, file_path)
            if change["operation"] == "create" and current is not None:
                return self._error(422, f"repository file already exists [path: {file_path}]")
            content = base64.b64decode(change.get("content") or "")
            written.append((file_path, content, current[1] if current else "100644"))
        try:
            commit = self._commit_files(repo, tip, branch, written, body)
            if onto:  # forced there, whatever it held (force_push)
                git(self._bare(repo), "update-ref", f"refs/heads/{onto}", commit)
        except subprocess.CalledProcessError:
            self.push_races += 1
            if self.push_race_answer == "lock":
                # two pushes at one ref: the loser's ref transaction finds it moved, git's
                # receive-pack says so on its remote lines, ErrPushRejected answers 403
                moved = self._resolve(repo, f"refs/heads/{branch}")
                return self._error(
                    403, f"cannot lock ref 'refs/heads/{branch}': is at {moved} but expected {tip}"
                )
            return self._error(500, "failed to push: the branch moved (ErrPushOutOfDate)")
        return commit

    def _file_commit(self, repo: str, sha: str) -> dict[str, Any]:
        """GetFileCommitResponse: the commit a write made, its tree its own, and no
        creation time (zero) on it or its parents."""
        an, ae, ad, cn, ce, cd, tree, parents, message = git(
            self._bare(repo),
            "log",
            "-1",
            "--format=%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%T%x00%P%x00%B",
            sha,
        ).split("\x00")
        zero = "0001-01-01T00:00:00Z"
        api = f"{self.url}/api/v1/repos/{repo}/git"
        return {
            "url": f"{api}/commits/{sha}",
            "sha": sha,
            "created": zero,
            "html_url": f"{self.url}/{repo}/commit/{sha}",
            "author": {"name": an, "email": ae, "date": ad},
            "committer": {"name": cn, "email": ce, "date": cd},
            "parents": [
                {"url": f"{api}/commits/{p}", "sha": p, "created": zero} for p in parents.split()
            ],
            "message": message.strip() + "\n",
            "tree": {"url": f"{api}/trees/{tree}", "sha": tree, "created": zero},
        }

    def _commit_files(
        self,
        repo: str,
        tip: str,
        branch: str,
        files: list[tuple[str, bytes, str]],
        body: dict[str, Any],
    ) -> str:
        """One commit on ``tip`` of ``files`` (path, content, mode), moved onto ``branch``
        only if it is still at ``tip``."""
        bare = self._bare(repo)
        with tempfile.TemporaryDirectory() as scratch:  # one index per writer, as a clone
            index = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
            git(bare, "read-tree", tip, env=index)
            for file_path, content, mode in files:
                blob = (
                    subprocess.run(
                        ["git", "-C", str(bare), "hash-object", "-w", "--stdin"],
                        input=content,
                        capture_output=True,
                        check=True,
                    )
                    .stdout.decode()
                    .strip()
                )
                entry = f"{mode},{blob},{file_path}"
                git(bare, "update-index", "--add", "--cacheinfo", entry, env=index)
            tree = git(bare, "write-tree", env=index)
        author = body.get("author") or {"name": "gitea", "email": "gitea@example.invalid"}
        committer = body.get("committer") or author
        identity = {
            "GIT_AUTHOR_NAME": author["name"],
            "GIT_AUTHOR_EMAIL": author["email"],
            "GIT_COMMITTER_NAME": committer["name"],
            "GIT_COMMITTER_EMAIL": committer["email"],
        }
        message = body.get("message") or f"Update {', '.join(f[0] for f in files)}"
        commit = git(
            bare, "commit-tree", tree, "-p", tip, "-F", "-", input_text=message, env=identity
        )
        if self.before_push is not None:
            self.before_push(repo, branch)
        if body.get("new_branch"):  # the base stays where it is; the caller moves new_branch
            return commit
        git(bare, "update-ref", f"refs/heads/{branch}", commit, tip)  # fails if the tip moved
        return commit

    def protect(
        self, repo: str, branch: str, *, files: str | None = None, checks: list[str] | None = None
    ) -> None:
        """Protect ``branch``: no push for fabrique's user, or, with ``files`` (a glob),
        only those paths (ProtectedBranch.ProtectedFilePatterns); ``checks``: the status
        contexts a pull request's head must have green before it merges."""
        self.protected[(repo, branch)] = files
        self.required_checks[(repo, branch)] = list(checks or [])

    # ------------------------------------------------------------ pull requests

    def _delete_branch(self, repo: str, branch: str) -> tuple[int, Any]:
        if self._resolve(repo, f"refs/heads/{branch}") is None:
            return self._not_found()
        if branch == self._default_branch(repo) or (repo, branch) in self.protected:
            return self._error(403, "branch protected")
        git(self._bare(repo), "update-ref", "-d", f"refs/heads/{branch}")
        for pull in self.pulls.get(repo, []):  # AdjustPullsCausedByBranchDeleted
            if pull["head"] == branch and pull["state"] == "open":
                pull["state"] = "closed"
                pull["updated"] = self._touch()
                pull["closed_at"] = self._moment(pull["updated"])
        return 204, None

    def _pull_view(
        self, repo: str, pull: dict[str, Any], *, listed: bool = False
    ) -> dict[str, Any]:
        """A PullRequest as Gitea shows it (ToAPIPullRequest): head.sha is the branch's
        live tip; a listing leaves out the diff's counts and sends its empty lists of
        assignees and reviewers as null, one pull request sends them as []."""
        head_sha = self._resolve(repo, f"refs/heads/{pull['head']}") or pull["head_sha"]
        pull["head_sha"] = head_sha
        base_sha = self._resolve(repo, f"refs/heads/{pull['base']}") or ""
        html = f"{self.url}/{repo}/pulls/{pull['number']}"
        empty = None if listed else []
        branch = {"repo_id": list(self.repos).index(repo) + 1, "repo": self._repository(repo)}
        view: dict[str, Any] = {
            "id": pull["number"],
            "url": html,
            "number": pull["number"],
            "user": USER,
            "title": pull["title"],
            "body": pull["body"],
            "labels": [],
            "milestone": None,
            "assignee": None,
            "assignees": empty,
            "requested_reviewers": empty,
            "requested_reviewers_teams": empty,
            "state": pull["state"],
            "draft": False,
            "is_locked": False,
            "comments": 0,
            "html_url": html,
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "mergeable": pull["state"] == "open" and self._pull_status(repo, pull) == "mergeable",
            "merged": pull["merged"],
            "merged_at": pull.get("closed_at") if pull["merged"] else None,
            "merge_commit_sha": pull.get("merge_commit"),
            "merged_by": USER if pull["merged"] else None,
            "allow_maintainer_edit": True,
            "base": {"label": pull["base"], "ref": pull["base"], "sha": base_sha, **branch},
            "head": {"label": pull["head"], "ref": pull["head"], "sha": head_sha, **branch},
            "merge_base": pull["merge_base"],
            "due_date": None,
            "created_at": pull["created_at"],
            "updated_at": self._moment(pull["updated"]),
            "closed_at": pull.get("closed_at"),
            "pin_order": 0,
            "content_version": 0,
        }
        if not listed:
            stats = git(self._bare(repo), "diff", "--numstat", pull["merge_base"], head_sha)
            counts = [line.split("\t") for line in stats.splitlines() if line]
            view["additions"] = sum(int(c[0]) for c in counts if c[0].isdigit())
            view["deletions"] = sum(int(c[1]) for c in counts if c[1].isdigit())
            view["changed_files"] = len(counts)
        return view

    @staticmethod
    def _moment(order: int) -> str:
        """A time for the ``order``-th update: later is later."""
        return f"2026-12-02T11:{order // 60 % 60:02d}:{order % 60:02d}Z"

    def _list_pulls(self, request: Request, repo: str) -> tuple[Any, ...]:
        state, base = request.query.get("state", "open"), request.query.get("base_branch")
        chosen = [
            p
            for p in self.pulls.get(repo, [])
            if (state == "all" or p["state"] == state) and base in (None, p["base"])
        ]
        if request.query.get("sort") == "recentupdate":
            chosen.sort(key=lambda p: -p["updated"])
        else:  # Gitea's default: the newest first
            chosen.reverse()
        every = [self._pull_view(repo, p, listed=True) for p in chosen]
        page, headers = self._page(request, every)
        return 200, page, headers

    def _pull_by_branches(self, repo: str, base: str, head: str) -> tuple[int, Any]:
        """GetPullRequestByBaseHead: one pull request of that base and head, whatever its
        state, the first made (Gitea's database has no order; SQLite's is this)."""
        for pull in self.pulls.get(repo, []):
            if (pull["base"], pull["head"]) == (base, head):
                return 200, self._pull_view(repo, pull)
        return self._not_found()

    def _create_pull(self, repo: str, body: dict[str, Any]) -> tuple[int, Any]:
        base, head = body["base"], body["head"]
        if self._resolve(repo, f"refs/heads/{head}") is None:
            return self._not_found(f'ref "{head}" does not exist')
        if base == head:
            return self._error(
                422, "Invalid PullRequest: There are no changes between the head and the base"
            )
        pulls = self.pulls.setdefault(repo, [])
        repo_id = list(self.repos).index(repo) + 1
        for p in pulls:
            if (p["base"], p["head"], p["state"]) == (base, head, "open"):
                return self._error(
                    409,
                    f"pull request already exists for these targets [id: {p['number']}, "
                    f"issue_id: {p['number']}, head_repo_id: {repo_id}, base_repo_id: "
                    f"{repo_id}, head_branch: {head}, base_branch: {base}]",
                )
        pull = {
            "number": len(pulls) + 1,
            "title": body["title"],
            "body": body.get("body") or "",
            "base": base,
            "head": head,
            "head_sha": "",
            "state": "open",
            "merged": False,
            "scheduled": None,
            "updated": self._touch(),
            "merge_base": git(
                self._bare(repo), "merge-base", f"refs/heads/{base}", f"refs/heads/{head}"
            ),
        }
        pull["created_at"] = self._moment(pull["updated"])
        pulls.append(pull)
        return 201, self._pull_view(repo, pull)

    def _get_pull(self, repo: str, number: int) -> tuple[int, Any]:
        pulls = self.pulls.get(repo, [])
        if not 0 < number <= len(pulls):
            return self._not_found()
        return 200, self._pull_view(repo, pulls[number - 1])

    def _edit_pull(self, repo: str, number: int, body: dict[str, Any]) -> tuple[int, Any]:
        pulls = self.pulls.get(repo, [])
        if not 0 < number <= len(pulls):
            return self._not_found()
        pull = pulls[number - 1]
        if pull["merged"] and "state" in body:
            return self._error(
                412, "cannot change state of this pull request, it was already merged"
            )
        if body.get("title"):
            pull["title"] = body["title"]
        if "body" in body:
            pull["body"] = body["body"]
        if body.get("state") in ("open", "closed"):
            pull["state"] = body["state"]
        pull["updated"] = self._touch()
        if pull["state"] == "closed":
            pull.setdefault("closed_at", self._moment(pull["updated"]))
        else:
            pull.pop("closed_at", None)
        return 201, self._pull_view(repo, pull)

    def _touch(self) -> int:
        """A pull request's update time, as an order: later is larger."""
        self._updates = getattr(self, "_updates", 0) + 1
        return self._updates

    def _cancel_merge(self, repo: str, number: int) -> tuple[int, Any]:
        pulls = self.pulls.get(repo, [])
        if not 0 < number <= len(pulls) or pulls[number - 1]["scheduled"] is None:
            return self._not_found()
        pulls[number - 1]["scheduled"] = None
        return 204, None

    def _merge_pull(self, repo: str, number: int, body: dict[str, Any]) -> tuple[int, Any]:
        """MergePullRequest with merge_when_checks_succeed: always scheduled (201), the
        merge itself once the base's required checks are green on the head."""
        pulls = self.pulls.get(repo, [])
        if not 0 < number <= len(pulls) or (
            pulls[number - 1]["state"] != "open" and not pulls[number - 1]["merged"]
        ):
            return self._not_found()
        pull = pulls[number - 1]
        if pull["merged"]:
            return self._error(405, "The PR is already merged")
        if self._pull_status(repo, pull, asked=True) != "mergeable":
            # CheckPullMergeable: a status other than mergeable (checking, conflict) is
            # ErrNotMergeableState, which MergePullRequest answers so
            return self._error(405, "Please try again later")
        if not body.get("merge_when_checks_succeed"):
            raise SpecViolation("the double merges only when checks succeed")
        if pull["scheduled"] is not None:
            return self._error(
                409,
                f"pull request is already scheduled to auto merge when checks succeed [pull_id: {number}]",
            )
        pull["scheduled"] = body["do"]
        pull["delete_branch"] = bool(body.get("delete_branch_after_merge"))
        self._auto_merge(repo)
        return 201, None

    def _pull_status(self, repo: str, pull: dict[str, Any], *, asked: bool = False) -> str:
        """Gitea's status of an open pull request: ``checking`` for ``check_answers``
        merge requests (``asked``) after its head or base moved (a push queues its check:
        AddToTaskQueue), then ``conflict`` when its head does not merge into its base
        (the check's merge-tree), else ``mergeable``."""
        head = self._resolve(repo, f"refs/heads/{pull['head']}") or pull["head_sha"]
        base = self._resolve(repo, f"refs/heads/{pull['base']}") or ""
        if pull.get("checked") != (head, base):
            pull["checked"], pull["checking"] = (head, base), self.check_answers
        if pull["checking"] > 0:
            pull["checking"] -= 1 if asked else 0
            return "checking"
        if base:  # the check records where head and base part (checkPullRequestMergeable)
            pull["merge_base"] = git(self._bare(repo), "merge-base", base, head)
        merged = subprocess.run(
            ["git", "-C", str(self._bare(repo)), "merge-tree", "--write-tree", base, head],
            capture_output=True,
            check=False,
        )
        return "conflict" if merged.returncode == 1 else "mergeable"

    def _auto_merge(self, repo: str) -> None:
        """Merge each scheduled pull request whose head has every required check green."""
        for pull in self.pulls.get(repo, []):
            if pull["state"] != "open" or pull["scheduled"] is None:
                continue
            head = self._resolve(repo, f"refs/heads/{pull['head']}")
            if head is None:
                continue
            latest = {s["context"]: s["status"] for s in self.latest_statuses(repo, head)}
            wanted = self.required_checks.get((repo, pull["base"]), [])
            if any(latest.get(context) != "success" for context in wanted):
                continue
            if self._pull_status(repo, pull) != "mergeable":
                continue  # handlePullRequestAutoMerge: CheckPullMergeable fails, logged
            self._merge(repo, pull, head)

    def _merge(self, repo: str, pull: dict[str, Any], head: str) -> None:
        bare = self._bare(repo)
        base = git(bare, "rev-parse", f"refs/heads/{pull['base']}")
        if pull["scheduled"] == "fast-forward-only":
            ahead = subprocess.run(
                ["git", "-C", str(bare), "merge-base", "--is-ancestor", base, head]
            )
            if ahead.returncode != 0:
                # `git merge --ff-only` fails: logged (doMergeStyleFastForwardOnly), no
                # more; the pull request stays open, its merge still scheduled
                pull["merge_failed"] = True
                return
            git(bare, "update-ref", f"refs/heads/{pull['base']}", head, base)
            self._merged(repo, pull, head, head)
            return
        tree = git(bare, "merge-tree", "--write-tree", base, head).splitlines()[0]
        message = f"Merge pull request '{pull['title']}' (#{pull['number']})"
        name, email = USER["login"], USER["email"]
        identity = {
            "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email,
        }  # fmt: skip
        merged = git(bare, "commit-tree", tree, "-p", base, "-p", head, "-m", message, env=identity)
        git(bare, "update-ref", f"refs/heads/{pull['base']}", merged, base)
        self._merged(repo, pull, head, merged)

    def _merged(self, repo: str, pull: dict[str, Any], head: str, merged: str) -> None:
        bare = self._bare(repo)
        pull.update(state="closed", merged=True, merge_commit=merged, head_sha=head)
        pull["updated"] = self._touch()
        pull["closed_at"] = self._moment(pull["updated"])
        if pull.get("delete_branch"):
            git(bare, "update-ref", "-d", f"refs/heads/{pull['head']}")

    def _protection(self, repo: str, branch: str, file_path: str) -> str | None:
        """The 403 message Gitea gives a write the branch protection refuses, if any."""
        if (repo, branch) not in self.protected:
            return None
        files = self.protected[(repo, branch)]
        if files is None:  # ReqChangeRepoFileOptionsAndCheck: CanWriteToBranch is false
            return "user should have a permission to write to the target branch"
        if fnmatch.fnmatchcase(file_path, files):  # VerifyBranchProtection
            return f"path is protected and can not be changed [path: {file_path}]"
        return None

    def _invalid_path(self, repo: str, tip: str, file_path: str) -> str | None:
        """The 422 message of a path Gitea cannot write (ErrFilenameInvalid,
        ErrFilePathInvalid), whoever wrote last."""
        parts = file_path.split("/")
        if any(part in ("", ".", "..", ".git") for part in parts):
            return f"path contains a malformed path component [path: {file_path}]"
        for depth in range(1, len(parts) + 1):
            sub = "/".join(parts[:depth])
            listed = git(self._bare(repo), "ls-tree", tip, "--", sub)
            if not listed:
                return None
            kind = listed.split()[1]
            if depth < len(parts) and kind != "tree":
                return f"a file exists where you{RSQUO}re trying to create a subdirectory [path: {sub}]"
            if depth == len(parts) and kind == "tree":
                return (
                    f"a directory exists where you{RSQUO}re trying to create a file [path: {sub}]"
                )
        return None
