"""A Gitea API double over real bare git repositories. Not Gitea.

It serves the subset of ``/api/v1`` that fabrique uses: branch GET, contents GET, PUT
and POST, ``git/commits/{sha}``, compare, commits filtered by path, and commit statuses
(create, list, combined). Every request
and every answer is checked against Gitea 1.27.1's Swagger document
(``doubles.swagger``); a violation is recorded and fails the test that caused it.

It sits on real bare repositories: every write is a real commit made with git plumbing
and moved onto the branch with a compare-and-swap ``update-ref``, so tests can check the
history with ``git log`` and ``git show``. Like Gitea, an update must name the file's
current blob sha, and a stale one answers 422; a path Gitea cannot write answers 422
with its own message; a protected branch or path (``protect``) answers 403. Writes take
no lock, as in Gitea: when the branch moves between the check and the push
(``before_push`` lets a test move it), the answer is 500. A file larger than
``max_blob_size`` is listed with ``content: null``. Editing a hook resets what the PATCH
omits (``events``, ``branch_filter``, ``authorization_header``), as Gitea's editHook does.
The token goes as ``token …`` or ``Bearer …``; its ``scopes`` are checked as Gitea's
tokenRequiresScopes does (403 naming the scope), and a ``hidden`` repository (private,
not the user's) answers 404.

Commit statuses are kept as Gitea keeps them: every POST adds one (nothing is replaced),
numbered per commit; the combined status holds the latest of each context, and its state
is Gitea's ``CommitStatusStates.Combine``: ``failure`` if any context is error or
failure, ``success`` if every one is success (or warning, skipped), else ``pending``.
With no status at all Gitea's Go code leaves the state empty, which its own spec's enum
refuses; the double answers ``pending`` there (GitHub's rule, the one Combine follows).

Faults can be injected: ``faults`` is a queue of (method, fault) consumed by the next
matching request, where fault is an HTTP status, ``"drop"`` (close the connection with no
answer), ``"lost"`` (do the work, then close the connection: a timeout the server
outlived) or ``("slow", seconds)``; ``race_rate`` answers a PUT with 422 at that rate, as if
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
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode

from .http import DROP, LoopbackServer, Request
from .swagger import SpecViolation, Swagger

RSQUO = "\u2019"  # the apostrophe of Gitea's ErrFilePathInvalid messages
NOT_FOUND = {"message": "The target couldn't be found.", "url": "", "errors": []}


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


class GiteaDouble:
    def __init__(self, swagger: Swagger, repos: dict[str, Path], token: str | None = None) -> None:
        self.swagger = swagger
        self.repos = repos  # "owner/name" -> bare repository
        self.token = token
        # the token's scopes, as Gitea checks them on every /repos route (None: all); and
        # the repositories its user may not see, which Gitea answers 404 (never 403)
        self.scopes: set[str] | None = None
        self.hidden: set[str] = set()
        self.violations: list[str] = []
        self.requests: list[Request] = []
        self.faults: list[tuple[str, Any]] = []
        self.race_rate = 0.0
        self.races = 0
        self.latency = 0.0
        self._random = random.Random(1234)
        self.hooks: dict[str, dict[int, dict[str, Any]]] = {repo: {} for repo in repos}
        self.hook_secrets: dict[tuple[str, int], str] = {}  # stored, never shown, like Gitea
        self.mirrors: dict[str, dict[str, Any]] = {}
        # (repo, sha) -> every status posted, oldest first, as Gitea stores them
        self.statuses: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._next_hook = 1
        self._write_lock = threading.Lock()
        self.protected: dict[tuple[str, str], str | None] = {}  # (repo, branch) -> file glob
        self.push_races = 0  # writes answered 500: the branch moved under Gitea's push
        self.before_push: Callable[[str, str], None] | None = None  # a rival, in a test
        self.max_blob_size = 10 * 1024 * 1024  # [api] DEFAULT_MAX_BLOB_SIZE
        self._fault_lock = threading.Lock()
        self.server = LoopbackServer(self._handle)

    @property
    def url(self) -> str:
        return self.server.url

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
            # where Gitea answers outside its own swagger, the real server is right: the
            # contents of a directory are a list (GetContentsOrList), the spec says object
            off_spec = request.method == "GET" and "/contents/" in path and isinstance(body, list)
            if not off_spec:
                self.swagger.check_response(request.method, unquote(path), status, body)
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

    @staticmethod
    def _token(request: Request) -> str | None:
        """The token of ``Authorization: token …`` or ``Bearer …`` (any case), as Gitea's
        httpauth.ParseAuthorizationHeader reads it."""
        parts = request.headers.get("authorization", "").split()
        if len(parts) == 2 and parts[0].lower() in ("token", "bearer"):
            return parts[1]
        return None

    def _scope_refusal(self, method: str) -> str | None:
        """Gitea's tokenRequiresScopes for the repository category: a read needs
        read:repository (or write:), a POST, PUT, PATCH or DELETE needs write:repository."""
        if self.scopes is None or "all" in self.scopes:
            return None
        level = "read" if method == "GET" else "write"
        allowed = {"write:repository"} | ({"read:repository"} if level == "read" else set())
        if self.scopes & allowed:
            return None
        return (
            "token does not have at least one of required scope(s), "
            f"required=[{level}:repository], token scope={','.join(sorted(self.scopes))}"
        )

    def _route(self, request: Request, path: str) -> tuple[int, Any]:
        if self.token is not None and self._token(request) != self.token:
            return 401, {"message": "token is required", "url": self.url}
        refused = self._scope_refusal(request.method)
        if refused:
            return 403, {"message": refused, "url": self.url}
        named = re.match(r"/repos/([^/]+)/([^/]+)", path)
        if named and f"{named[1]}/{named[2]}" in self.hidden:
            return 404, NOT_FOUND
        if path == "/repos/migrate" and request.method == "POST":
            return self._migrate(request.json())
        whole = re.fullmatch(r"/repos/([^/]+)/([^/]+)(/mirror-sync)?", path)
        if whole and f"{whole[1]}/{whole[2]}" not in self.repos:
            return self._mirror_repo(
                f"{whole[1]}/{whole[2]}", request.method, bool(whole[3]), request.json()
            )
        match = re.fullmatch(r"/repos/([^/]+)/([^/]+)/(.+)", path)
        if not match or f"{match[1]}/{match[2]}" not in self.repos:
            return 404, NOT_FOUND
        repo = f"{match[1]}/{match[2]}"
        rest, method = match[3], request.method
        if method == "GET" and rest.startswith("branches/"):
            return self._branch(repo, unquote(rest[len("branches/") :]))
        if rest.startswith("contents/"):
            file_path = unquote(rest[len("contents/") :])
            if method == "GET":
                return self._get_contents(repo, file_path, request.query.get("ref"))
            if method in ("PUT", "POST"):
                return self._write_contents(
                    repo, file_path, request.json(), create=method == "POST"
                )
        if method == "GET" and rest.startswith("git/commits/"):
            return self._commit(repo, unquote(rest[len("git/commits/") :]))
        if method == "GET" and rest.startswith("compare/"):
            return self._compare(repo, unquote(rest[len("compare/") :]))
        if method == "GET" and rest == "commits":
            return self._commits(repo, request)
        if rest == "hooks" and method in ("GET", "POST"):
            return (
                self._list_hooks(repo)
                if method == "GET"
                else self._create_hook(repo, request.json())
            )
        status = re.fullmatch(r"statuses/([^/]+)|commits/([^/]+)/(status|statuses)", rest)
        if status and (status[1] or status[2]):
            ref = unquote(status[1] or status[2])
            if method == "POST" and status[1]:
                return self._create_status(repo, ref, request.json())
            if method == "GET":
                if status[3] == "status":
                    return self._combined_status(repo, ref)
                return self._list_statuses(repo, ref, request.query)
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
            return 404, NOT_FOUND
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
        bare = self._bare(repo)
        name, email, date, message = git(
            bare, "log", "-1", "--format=%an%x00%ae%x00%cI%x00%B", sha
        ).split("\x00")
        person = {"name": name, "email": email, "username": name}
        return {
            "id": sha,
            "message": message.strip() + "\n",
            "url": f"{self.url}/{repo}/commit/{sha}",
            "timestamp": date,
            "author": person,
            "committer": person,
            "added": [],
            "removed": [],
            "modified": [],
        }

    def _blob(self, repo: str, commit: str, file_path: str) -> tuple[str, str] | None:
        listed = git(self._bare(repo), "ls-tree", commit, "--", file_path)
        if not listed or listed.split()[1] != "blob":
            return None
        return listed.split()[2], listed.split()[0]

    def _contents(self, repo: str, commit: str, file_path: str) -> dict[str, Any] | None:
        found = self._blob(repo, commit, file_path)
        if found is None:
            return None
        blob, _ = found
        bare = self._bare(repo)
        data = subprocess.run(
            ["git", "-C", str(bare), "cat-file", "blob", blob], capture_output=True, check=True
        ).stdout
        last = git(
            bare, "log", "-1", "--format=%H%x00%aI%x00%cI%x00%s", commit, "--", file_path
        ).split("\x00")
        url = f"{self.url}/api/v1/repos/{repo}/contents/{file_path}"
        return {
            "name": file_path.rsplit("/", 1)[-1],
            "path": file_path,
            "sha": blob,
            "last_commit_sha": last[0],
            "last_author_date": last[1],
            "last_committer_date": last[2],
            "last_commit_message": last[3],
            "type": "file",
            "size": len(data),
            # GetBlobBySHA: above DEFAULT_MAX_BLOB_SIZE, no encoding and no content
            "encoding": "base64" if len(data) <= self.max_blob_size else None,
            "content": (
                base64.b64encode(data).decode("ascii") if len(data) <= self.max_blob_size else None
            ),
            "url": url,
            "html_url": f"{self.url}/{repo}/src/commit/{commit}/{file_path}",
            "git_url": f"{self.url}/api/v1/repos/{repo}/git/blobs/{blob}",
            "download_url": f"{self.url}/{repo}/raw/commit/{commit}/{file_path}",
            "_links": {
                "self": url,
                "git": f"{self.url}/api/v1/repos/{repo}/git/blobs/{blob}",
                "html": url,
            },
        }

    def _get_contents(self, repo: str, file_path: str, ref: str | None) -> tuple[int, Any]:
        """GetContentsOrList: a directory answers 200 with the list of its entries, a
        symlink 200 with ``type: symlink`` and its target, a file its content."""
        commit = self._resolve(repo, ref or self._default_branch(repo))
        if commit is None:
            return 404, NOT_FOUND
        listed = git(self._bare(repo), "ls-tree", commit, "--", file_path.rstrip("/"))
        if listed and listed.split()[1] == "tree":
            entries = git(self._bare(repo), "ls-tree", commit, "--", file_path.rstrip("/") + "/")
            return 200, [
                {
                    "name": line.split("\t", 1)[1].rsplit("/", 1)[-1],
                    "path": line.split("\t", 1)[1],
                    "sha": line.split()[2],
                    "type": "dir" if line.split()[1] == "tree" else "file",
                }
                for line in entries.splitlines()
            ]
        if listed and listed.split()[0] == "120000":
            target = git(self._bare(repo), "cat-file", "blob", listed.split()[2])
            return 200, {
                "name": file_path.rsplit("/", 1)[-1],
                "path": file_path,
                "sha": listed.split()[2],
                "type": "symlink",
                "target": target,
                "size": len(target),
            }
        found = self._contents(repo, commit, file_path)
        return (200, found) if found is not None else (404, NOT_FOUND)

    def _commit(self, repo: str, ref: str) -> tuple[int, Any]:
        if (
            # Gitea's IsValidSHAPattern: a SHA-256 repository's ids are 64 hex
            not re.fullmatch(r"[0-9a-f]{4,64}", ref)
            and self._resolve(repo, f"refs/heads/{ref}") is None
        ):
            return 422, {"message": "invalid sha", "url": self.url}
        sha = self._resolve(repo, ref)
        if sha is None:
            return 404, NOT_FOUND
        return 200, self._api_commit(repo, sha)

    def _api_commit(self, repo: str, sha: str) -> dict[str, Any]:
        return self._api_commits(repo, [sha])[0]

    def _api_commits(
        self, repo: str, shas: list[str], *, files: bool = False
    ) -> list[dict[str, Any]]:
        """Gitea ``Commit`` objects for ``shas``, read with one ``git log``."""
        if not shas:
            return []
        fmt = "%x02%H%x00%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%T%x00%P%x00%B%x00"
        args = ["log", "--no-walk=unsorted", f"--format={fmt}"]
        # a merge's files are those it changed against its first parent (Gitea's
        # GetCommitFileStatus: `git log --name-status -m --first-parent --no-renames -1`)
        args += ["--name-status", "--no-renames", "--diff-merges=first-parent"] if files else []
        out = git(self._bare(repo), *args, *shas)
        statuses = {"A": "added", "M": "modified", "D": "deleted"}
        commits = []
        for record in out.split("\x02")[1:]:
            sha, an, ae, ad, cn, ce, cd, tree, parents, message, changed = record.split("\x00")
            url = f"{self.url}/api/v1/repos/{repo}/git/commits/{sha}"
            commit: dict[str, Any] = {
                "url": url,
                "sha": sha,
                "created": cd,
                "html_url": f"{self.url}/{repo}/commit/{sha}",
                "commit": {
                    "url": url,
                    "author": {"name": an, "email": ae, "date": ad},
                    "committer": {"name": cn, "email": ce, "date": cd},
                    "message": message.strip() + "\n",
                    "tree": {
                        "url": f"{self.url}/api/v1/repos/{repo}/git/trees/{tree}",
                        "sha": tree,
                        "created": cd,
                    },
                },
                "parents": [
                    {
                        "url": f"{self.url}/api/v1/repos/{repo}/git/commits/{p}",
                        "sha": p,
                        "created": cd,
                    }
                    for p in parents.split()
                ],
            }
            if files:
                commit["files"] = [
                    {
                        "filename": line.split("\t", 1)[1],
                        "status": statuses.get(line[0], "modified"),
                    }
                    for line in changed.splitlines()
                    if "\t" in line
                ]
            commits.append(commit)
        return commits

    def _compare(self, repo: str, basehead: str) -> tuple[int, Any]:
        if "..." not in basehead:
            return 400, {"message": "invalid compare", "url": self.url}
        base, head = basehead.split("...", 1)
        base_sha, head_sha = self._resolve(repo, base), self._resolve(repo, head)
        if base_sha is None or head_sha is None:
            return 404, NOT_FOUND
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
        return 200, {
            "total_commits": len(shas),
            "commits": self._api_commits(repo, shas),
        }

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
        start = self._resolve(repo, query.get("sha") or self._default_branch(repo))
        excluded = self._resolve(repo, query["not"]) if query.get("not") else None
        if start is None and not path:
            return 404, NOT_FOUND  # GetCommit(sha): NotFoundOrServerError
        if start is None or (query.get("not") and excluded is None):
            return 500, {"message": "", "url": self.url}  # git rev-list failed
        args = ["rev-list", start, *([f"^{excluded}"] if excluded else [])]
        shas = git(self._bare(repo), *args, *(["--", path] if path else [])).split()
        if path and not shas:
            return 404, {"message": "FileCommitsCount", "url": self.url}
        size = self.commits_range_size if path else per_page
        chunk = shas[(page - 1) * size : page * size]
        commits = self._api_commits(repo, chunk, files=query.get("files", "true") == "true")
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

    def _repository(self, slug: str, record: dict[str, Any]) -> dict[str, Any]:
        owner, name = slug.split("/")
        return {
            "id": record["id"],
            "name": name,
            "full_name": slug,
            "owner": {
                "id": 1,
                "login": owner,
                "full_name": owner,
                "email": f"{owner}@example.invalid",
            },
            "private": True,
            "mirror": True,
            "mirror_interval": record["interval"],
            "original_url": record["source"],
            "clone_url": f"{self.url}/{slug}.git",
            "default_branch": "main",
        }

    def _migrate(self, body: dict[str, Any]) -> tuple[int, Any]:
        slug = f"{body.get('repo_owner')}/{body['repo_name']}"
        if slug in self.mirrors or slug in self.repos:
            return 409, {
                "message": "The repository with the same name already exists.",
                "url": self.url,
            }
        interval = body.get("mirror_interval", "8h")
        seconds = sum(
            int(n) * {"h": 3600, "m": 60, "s": 1}[u]
            for n, u in re.findall(r"(\d+)([hms])", interval)
        )
        shown = (
            f"{seconds // 3600}h{seconds % 3600 // 60}m{seconds % 60}s".lstrip("0h")
            if seconds
            else "0s"
        )
        self.mirrors[slug] = {
            "id": 100 + len(self.mirrors),
            "interval": shown,
            "source": body["clone_addr"],
            "syncs": 0,
        }
        return 201, self._repository(slug, self.mirrors[slug])

    def _mirror_repo(self, slug: str, method: str, sync: bool, body: Any) -> tuple[int, Any]:
        record = self.mirrors.get(slug)
        if record is None:
            return 404, NOT_FOUND
        if sync and method == "POST":
            record["syncs"] += 1
            return 200, None
        if method == "GET" and not sync:
            return 200, self._repository(slug, record)
        if method == "PATCH" and not sync:
            if "mirror_interval" in body:
                record["interval"] = body["mirror_interval"]
            return 200, self._repository(slug, record)
        raise SpecViolation(f"{method} {slug}: not served by the double")

    # -------------------------------------------------------------------- hooks

    def _hook_view(self, repo: str, hook: dict[str, Any]) -> dict[str, Any]:
        shown = {k: v for k, v in hook.items() if k != "config"}
        shown["config"] = {k: v for k, v in hook["config"].items() if k != "secret"}
        return shown

    def _list_hooks(self, repo: str) -> tuple[int, Any]:
        return 200, [self._hook_view(repo, h) for h in self.hooks[repo].values()]

    def _create_hook(self, repo: str, body: dict[str, Any]) -> tuple[int, Any]:
        config = dict(body["config"])
        if not config.get("url") or not config.get("content_type"):
            return 422, {
                "message": "config.url and config.content_type are required",
                "url": self.url,
            }
        hook_id, self._next_hook = self._next_hook, self._next_hook + 1
        now = "2026-12-02T10:00:00Z"
        self.hook_secrets[(repo, hook_id)] = config.get("secret", "")
        self.hooks[repo][hook_id] = {
            "id": hook_id,
            "type": body["type"],
            "name": body.get("name", ""),
            "config": {
                "url": config["url"],
                "content_type": config["content_type"],
                "http_method": config.get("http_method", "post"),
            },
            "events": body.get("events") or ["push"],
            "branch_filter": body.get("branch_filter", "*"),
            "authorization_header": body.get("authorization_header", ""),
            "active": bool(body.get("active", False)),
            "created_at": now,
            "updated_at": now,
        }
        return 201, self._hook_view(repo, self.hooks[repo][hook_id])

    def _hook(self, repo: str, hook_id: int, method: str, body: Any) -> tuple[int, Any]:
        hook = self.hooks[repo].get(hook_id)
        if hook is None:
            return 404, NOT_FOUND
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
        hook["authorization_header"] = body.get("authorization_header", "")
        for key in ("active", "name"):
            if key in body:
                hook[key] = body[key]
        if "config" in body:
            # editHook takes only the url and the content type of config: a secret sent
            # there is ignored, and the one stored stays
            config = {k: v for k, v in body["config"].items() if k in ("url", "content_type")}
            hook["config"].update(config)
        return 200, self._hook_view(repo, hook)

    # ----------------------------------------------------------------- statuses

    def _create_status(self, repo: str, sha: str, body: dict[str, Any]) -> tuple[int, Any]:
        commit = self._resolve(repo, sha) if re.fullmatch(r"[0-9a-f]{4,64}", sha) else None
        if commit is None:  # Gitea: GetCommit fails with ErrNotExist, answered as 404
            return 404, NOT_FOUND
        with self._write_lock:
            stored = self.statuses.setdefault((repo, commit), [])
            now = f"2026-12-02T10:{len(stored) // 60:02d}:{len(stored) % 60:02d}Z"
            status = {
                "id": len(stored) + 1,  # Gitea numbers statuses per commit
                "context": (body.get("context") or "default").strip(),
                "status": body["state"],
                "description": (body.get("description") or "").strip(),
                "target_url": body.get("target_url") or "",
                "url": f"{self.url}/api/v1/repos/{repo}/statuses/{commit}",
                "created_at": now,
                "updated_at": now,
            }
            stored.append(status)
        return 201, status

    def latest_statuses(self, repo: str, sha: str) -> list[dict[str, Any]]:
        """The newest status of each context, newest first (GetLatestCommitStatus)."""
        latest: dict[str, dict[str, Any]] = {}
        for status in self.statuses.get((repo, sha), []):
            latest[status["context"]] = status
        return sorted(latest.values(), key=lambda s: s["id"], reverse=True)

    @staticmethod
    def combine(states: list[str]) -> str:
        if any(state in ("error", "failure") for state in states):
            return "failure"
        if states and all(state in ("success", "warning", "skipped") for state in states):
            return "success"
        return "pending"

    def _combined_status(self, repo: str, ref: str) -> tuple[int, Any]:
        sha = self._resolve(repo, ref)
        if sha is None:
            return 404, NOT_FOUND
        latest = self.latest_statuses(repo, sha)
        return 200, {
            "sha": sha,
            "state": self.combine([s["status"] for s in latest]),
            "statuses": latest,
            "total_count": len(latest),
            "commit_url": f"{self.url}/api/v1/repos/{repo}/commits/{sha}",
            "url": f"{self.url}/api/v1/repos/{repo}/commits/{sha}/status",
        }

    def _list_statuses(self, repo: str, ref: str, query: dict[str, str]) -> tuple[Any, ...]:
        sha = self._resolve(repo, ref)
        if sha is None:
            return 404, NOT_FOUND
        every = list(reversed(self.statuses.get((repo, sha), [])))  # newest first
        if query.get("state"):
            every = [s for s in every if s["status"] == query["state"]]
        limit = int(query.get("limit") or 30)
        page = max(1, int(query.get("page") or 1))
        return 200, every[(page - 1) * limit : page * limit], {"X-Total-Count": str(len(every))}

    # ------------------------------------------------------------------- writes

    def _write_contents(
        self, repo: str, file_path: str, body: dict[str, Any], *, create: bool
    ) -> tuple[int, Any]:
        """ChangeRepoFiles, as Gitea runs it: no lock. It checks the sha on the tip it
        read, commits in a temporary clone and pushes; a tip that moved in between makes
        the push fail (ErrPushOutOfDate), which the API answers 500."""
        if not create and self._random.random() < self.race_rate:
            self.races += 1
            return 422, {"message": "sha does not match [injected race]", "url": self.url}
        branch = body.get("branch") or self._default_branch(repo)
        refused = self._protection(repo, branch, file_path)
        if refused:
            return 403, {"message": refused, "url": self.url}
        tip = self._resolve(repo, f"refs/heads/{branch}")
        if tip is None:
            return 404, NOT_FOUND
        invalid = self._invalid_path(repo, tip, file_path)
        if invalid:
            return 422, {"message": invalid, "url": self.url}
        current = self._blob(repo, tip, file_path)
        if create and current is not None:
            return 422, {
                "message": f"repository file already exists [path: {file_path}]",
                "url": self.url,
            }
        if not create:
            if current is None:
                return 404, NOT_FOUND
            if body.get("sha") != current[0]:
                return 422, {
                    "message": (
                        f"sha does not match [given: {body.get('sha')}, expected: {current[0]}]"
                    ),
                    "url": self.url,
                }
        content = base64.b64decode(body["content"])
        try:
            commit = self._commit_file(
                repo, tip, branch, file_path, content, body, current[1] if current else "100644"
            )
        except subprocess.CalledProcessError:
            self.push_races += 1
            return 500, {"message": "", "url": self.url}  # production hides the message
        contents = self._contents(repo, commit, file_path)
        api = self._api_commit(repo, commit)
        return (201 if create else 200), {
            "content": contents,
            "commit": {
                "url": api["url"],
                "sha": commit,
                "created": api["created"],
                "html_url": api["html_url"],
                "author": api["commit"]["author"],
                "committer": api["commit"]["committer"],
                "parents": api["parents"],
                "message": api["commit"]["message"],
                "tree": api["commit"]["tree"],
            },
            "verification": {
                "verified": False,
                "reason": "gpg.error.not_signed_commit",
                "signature": "",
                "payload": "",
            },
        }

    def _commit_file(
        self,
        repo: str,
        tip: str,
        branch: str,
        file_path: str,
        content: bytes,
        body: dict[str, Any],
        mode: str,
    ) -> str:
        bare = self._bare(repo)
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
        with tempfile.TemporaryDirectory() as scratch:  # one index per writer, as a clone
            index = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
            git(bare, "read-tree", tip, env=index)
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
        message = body.get("message") or f"Update {file_path}"
        commit = git(
            bare, "commit-tree", tree, "-p", tip, "-F", "-", input_text=message, env=identity
        )
        if self.before_push is not None:
            self.before_push(repo, branch)
        git(bare, "update-ref", f"refs/heads/{branch}", commit, tip)  # fails if the tip moved
        return commit

    def protect(self, repo: str, branch: str, *, files: str | None = None) -> None:
        """Protect ``branch``: no push for fabrique's user, or, with ``files`` (a glob),
        only those paths (ProtectedBranch.ProtectedFilePatterns)."""
        self.protected[(repo, branch)] = files

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
