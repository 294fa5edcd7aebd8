"""Gitea API client (``/api/v1``): the calls fabrique makes, with typed results.

The token comes from ``FABRIQUE_GITEA_TOKEN`` (in a pod: from the Secret the site names)
and is sent as ``Authorization: token …``. It is never logged nor put in a message.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from fabrique.site.config import Site
from fabrique.site.errors import GiteaError, StaleWrite, TargetError
from fabrique.site.names import REVISION_RE
from fabrique.site.retry import RetryPolicy

from ._http import DEFAULT_TIMEOUT, JsonApi

TOKEN_ENV = "FABRIQUE_GITEA_TOKEN"
PATH_PAGE = 50  # Gitea's [git] COMMITS_RANGE_SIZE: one page of commits listed by path
STATUS_PAGE = 50  # Gitea's [api] MAX_RESPONSE_ITEMS: the most contexts a page of statuses holds
MAX_PULL_PAGES = 100  # 5 000 open pull requests into one branch: past that, gone wrong
MAX_STATUS_PAGES = 400  # 20 000 contexts on one commit: past that, a server gone wrong
# Gitea's [api] DEFAULT_PAGING_NUM: the most entries one file-contents answer holds (it
# stops there, and earlier at [api] DEFAULT_MAX_RESPONSE_SIZE, whatever was asked)
FILES_PAGE = 30
_T = TypeVar("_T")


class TooManyCommits(Exception):
    """A commit listing went past the pages a caller is willing to read."""


def token_from_env(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    return env.get(TOKEN_ENV) or None


@dataclass(frozen=True)
class FileContent:
    path: str
    text: str
    sha: str  # the blob sha: what an update must name


@dataclass(frozen=True)
class FileChange:
    """One file of a ``change_files`` commit: its new text, and the blob sha it replaces
    (the lease: the commit is refused if the file is no longer that blob), or None to
    create it (refused if a file is there)."""

    path: str
    text: str
    sha: str | None


@dataclass(frozen=True)
class Commit:
    """A commit of a listing: its id, its parents' ids, and the files it changed."""

    sha: str
    parents: tuple[str, ...]
    files: tuple[str, ...]


class RepositoryExists(GiteaError):
    """A migration met a repository of that name (409)."""


@dataclass(frozen=True)
class Identity:
    name: str
    email: str


@dataclass(frozen=True)
class PullRequest:
    """A pull request as fabrique reads it."""

    number: int
    url: str  # its page (html_url)
    state: str  # open | closed
    merged: bool
    head_sha: str
    title: str
    body: str
    base_sha: str = ""  # the base branch's head now
    merge_base: str = ""  # where Gitea last found head and base to part
    head: str = ""  # the branch it proposes from (head.ref)


STATUS_STATES = frozenset({"pending", "success", "error", "failure", "warning", "skipped"})


@dataclass(frozen=True)
class CommitStatus:
    """The latest status of one context on a commit, as Gitea keeps it."""

    context: str
    state: str  # pending | success | error | failure (| warning | skipped)
    description: str = ""
    target_url: str = ""
    # when this status was posted (RFC 3339), as Gitea says it; not what it says
    created_at: str = field(default="", compare=False)


class GiteaClient(JsonApi):
    error = GiteaError

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        retry: RetryPolicy | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"token {token}"
        self.url = url
        self.anonymous = not token
        self.system = f"Gitea at {url}"
        super().__init__(
            f"{url}/api/v1", headers=headers, retry=retry, timeout=timeout, transport=transport
        )

    @classmethod
    def for_site(cls, site: Site, token: str | None = None) -> GiteaClient:
        """The site's Gitea, with its timeouts and retries; the token from the environment
        unless given."""
        return cls(
            site.gitea.url,
            token if token is not None else token_from_env(),
            retry=site.network.retry_policy(),
            timeout=site.network.http_timeout(),
        )

    # ------------------------------------------------------------------ reads

    def branch_head(self, repo: str, branch: str) -> str:
        """The commit id at the head of ``repo``'s ``branch``."""
        what = f"branch {branch!r} of {repo}"
        return _head(self._json("GET", f"/repos/{repo}/branches/{_seg(branch)}", what), what)

    def get_file(self, repo: str, path: str, branch: str) -> FileContent | None:
        """The file at the branch head, or None if the branch has no such file."""
        what = f"{path} in {repo}@{branch}"
        response = self.request(
            "GET", f"/repos/{repo}/contents/{_path(path)}", params={"ref": branch}
        )
        if response.status_code == 404:
            self.branch_head(repo, branch)  # raises, naming the branch, if it is missing
            return None
        return _file_content(self._check(response, what), path, what)

    def get_files(self, repo: str, paths: Sequence[str], ref: str) -> dict[str, FileContent | None]:
        """Each of ``paths`` at the head of branch ``ref``: its FileContent, or None if
        there is no file there; read as ``get_file`` reads one, FILES_PAGE at a time.

        Gitea answers a path it cannot read with null (GetContentsListFromTreePaths), an
        unknown ref with 404, and stops early once the answer is large: the rest is asked
        again. A None comes, as get_file's, from a branch seen to be there: a file found
        shows it, else ``branch_head`` is asked (and raises, naming the branch)."""
        pending = list(dict.fromkeys(paths))
        found: dict[str, FileContent | None] = {}
        while pending:
            asked = pending[:FILES_PAGE]
            entries = self._file_entries(repo, asked, ref)
            for path, entry in zip(asked, entries, strict=False):
                what = f"{path} in {repo}@{ref}"
                found[path] = None if entry is None else _file_content(entry, path, what)
            pending = pending[len(entries) :]
        if found and all(content is None for content in found.values()):
            self.branch_head(repo, ref)
        return found

    def _file_entries(self, repo: str, paths: list[str], ref: str) -> list[Any]:
        """Gitea's file-contents answer for ``paths``: an entry or null for each of the
        first of them (at least one)."""
        what = f"{len(paths)} files in {repo}@{ref}"
        response = self.request(
            "POST", f"/repos/{repo}/file-contents", params={"ref": ref}, json={"files": paths}
        )
        if response.status_code == 404:
            self.branch_head(repo, ref)  # raises, naming the branch, if it is missing
        entries = self._check(response, what)
        if not isinstance(entries, list) or len(entries) > len(paths):
            raise GiteaError(f"{what}: Gitea answered something that is not a list of them")
        if not entries:
            # even the first file alone is above [api] DEFAULT_MAX_RESPONSE_SIZE
            raise TargetError(
                f"{paths[0]} in {repo}@{ref}: more than Gitea sends in one answer "
                "([api] DEFAULT_MAX_RESPONSE_SIZE); a write-back target must be a small file"
            )
        return entries

    def resolve_commit(self, repo: str, ref: str) -> str | None:
        """The full commit id of ``ref`` (a short or full sha), or None if unknown."""
        response = self.request(
            "GET",
            f"/repos/{repo}/git/commits/{_seg(ref)}",
            params={"stat": "false", "verification": "false", "files": "false"},
        )
        if response.status_code in (404, 422):
            return None
        sha = _get(self._check(response, f"commit {ref} of {repo}"), "sha")
        if not isinstance(sha, str) or not REVISION_RE.fullmatch(sha):
            raise GiteaError(f"commit {ref} of {repo}: Gitea answered without a valid sha")
        return sha

    def is_ancestor(self, repo: str, ancestor: str, descendant: str) -> bool:
        """Whether ``ancestor`` is reachable from ``descendant`` (or is it).

        Gitea's compare ``base...head`` lists the commits of head since the merge base:
        none when head (``ancestor``) is already in base (``descendant``), but none too
        when the two share no history (``GetCompareInfo`` lists nothing when ``git
        merge-base`` fails, and answers 200). So a 0 is confirmed the other way round:
        ``descendant`` must then have commits since ``ancestor``. Fails closed.
        """
        if ancestor == descendant:
            return True
        if self._compare_total(repo, descendant, ancestor) != 0:
            return False
        return self._compare_total(repo, ancestor, descendant) > 0

    def _compare_total(self, repo: str, base: str, head: str) -> int:
        what = f"compare {base[:12]}...{head[:12]} in {repo}"
        data = self._json("GET", f"/repos/{repo}/compare/{base}...{head}", what)
        total = _get(data, "total_commits")
        if not isinstance(total, int):
            raise GiteaError(f"{what}: Gitea answered without total_commits")
        return total

    def commits_touching(
        self, repo: str, path: str, *, start: str, exclude: str | None = None, max_pages: int = 20
    ) -> Iterator[tuple[str, list[str]]]:
        """(sha, files under ``path`` it changed) for the commits from ``start`` (newest
        first) that touched ``path``, ``exclude`` and its ancestors left out; page by page,
        at most ``max_pages``. Raises TooManyCommits past that."""
        what = f"commits of {repo}@{start[:12]} touching {path}"
        prefix = path.rstrip("/") + "/"
        for page in range(1, max_pages + 1):
            # with `path`, Gitea pages by COMMITS_RANGE_SIZE (50) whatever `limit` says, but
            # counts X-HasMore in pages of `limit`: ask for 50 so that the two agree
            params = {"sha": start, "path": path, "page": str(page), "limit": str(PATH_PAGE)}
            params |= {"files": "true", "stat": "false", "verification": "false"}
            if exclude:
                params["not"] = exclude
            response = self.request("GET", f"/repos/{repo}/commits", params=params)
            if response.status_code == 404 and page == 1:
                # Gitea's answer when no commit touched `path` (commitsCountTotal == 0);
                # a start that does not exist is not that
                if self.resolve_commit(repo, start) is None:
                    raise GiteaError(f"{what}: {start} not found in Gitea")
                return
            commits = self._check(response, what)
            if not isinstance(commits, list):
                raise GiteaError(f"{what}: Gitea answered something that is not a list")
            for commit in commits:
                sha = _get(commit, "sha")
                if not isinstance(sha, str) or not REVISION_RE.fullmatch(sha):
                    raise GiteaError(f"{what}: a commit without a valid sha")
                names = [_get(f, "filename") for f in _get(commit, "files") or []]
                yield (
                    sha,
                    [
                        n
                        for n in names
                        if isinstance(n, str) and (n.startswith(prefix) or n == path)
                    ],
                )
            if not commits or response.headers.get("X-HasMore", "false").lower() != "true":
                return
        raise TooManyCommits(f"{what}: more than {max_pages} pages")

    def commits_since(
        self, repo: str, head: str, since: str, *, max_pages: int = 20
    ) -> list[Commit] | None:
        """The commits reachable from ``head`` and not from ``since``, newest first, with
        the files each changed: one listing for every path at once. None past
        ``max_pages`` pages (the caller then asks path by path)."""
        what = f"commits of {repo} from {since[:12]} to {head[:12]}"
        found: list[Commit] = []
        for page in range(1, max_pages + 1):
            params = {"sha": head, "not": since, "page": str(page), "limit": "50"}
            params |= {"files": "true", "stat": "false", "verification": "false"}
            response = self.request("GET", f"/repos/{repo}/commits", params=params)
            commits = self._check(response, what)
            if not isinstance(commits, list):
                raise GiteaError(f"{what}: Gitea answered something that is not a list")
            for commit in commits:
                sha = _get(commit, "sha")
                parents = [_get(p, "sha") for p in _get(commit, "parents") or []]
                names = [_get(f, "filename") for f in _get(commit, "files") or []]
                if not isinstance(sha, str) or not REVISION_RE.fullmatch(sha):
                    raise GiteaError(f"{what}: a commit without a valid sha")
                if not all(isinstance(p, str) and REVISION_RE.fullmatch(p) for p in parents):
                    raise GiteaError(f"{what}: commit {sha[:12]} has a parent without a valid sha")
                found.append(
                    Commit(sha, tuple(parents), tuple(n for n in names if isinstance(n, str)))
                )
            if not commits or response.headers.get("X-HasMore", "false").lower() != "true":
                return found
        return None

    def files_changed(self, repo: str, since: str, until: str, path: str) -> list[str] | None:
        """Files under ``path`` changed in ``since..until``; None when there are too many
        commits to list (the caller then assumes a change)."""
        try:
            commits = list(self.commits_touching(repo, path, start=until, exclude=since))
        except TooManyCommits:
            return None
        return sorted({name for _, names in commits for name in names})

    def last_change(self, repo: str, branch: str, path: str, ignore: frozenset[str]) -> str | None:
        """The newest commit on ``branch`` that changed a file under ``path`` other than
        those in ``ignore``; None if there is none (within the pages it reads)."""
        try:
            for sha, names in self.commits_touching(repo, path, start=branch):
                if any(name not in ignore for name in names):
                    return sha
        except TooManyCommits:
            return None
        return None

    # ---------------------------------------------------------------- mirrors

    def get_repo(self, repo: str) -> dict[str, Any] | None:
        response = self.request("GET", f"/repos/{repo}")
        if response.status_code == 404:
            return None
        data = self._check(response, f"repository {repo}")
        if not isinstance(data, dict):
            raise GiteaError(f"repository {repo}: Gitea answered something that is not an object")
        return data

    def migrate(self, body: dict[str, Any]) -> dict[str, Any]:
        what = f"mirror {body.get('repo_owner')}/{body.get('repo_name')}"
        response = self.request("POST", "/repos/migrate", json=body)
        if response.status_code == 409:
            raise RepositoryExists(f"{what}: the repository already exists")
        data = self._check(response, what, expect=(201,))
        return data if isinstance(data, dict) else {}

    def edit_repo(self, repo: str, body: dict[str, Any]) -> None:
        self._check(self.request("PATCH", f"/repos/{repo}", json=body), f"repository {repo}")

    def mirror_sync(self, repo: str) -> None:
        response = self.request("POST", f"/repos/{repo}/mirror-sync")
        if response.status_code != 200:  # an empty body: nothing else to read
            self._check(response, f"mirror-sync {repo}")

    # ------------------------------------------------------------------ hooks

    def list_hooks(self, repo: str) -> list[dict[str, Any]]:
        what = f"webhooks of {repo}"
        hooks: list[dict[str, Any]] = []
        for page in range(1, 51):
            response = self.request(
                "GET", f"/repos/{repo}/hooks", params={"page": str(page), "limit": "50"}
            )
            batch = self._check(response, what)
            if not isinstance(batch, list):
                raise GiteaError(f"{what}: Gitea answered something that is not a list")
            hooks += [h for h in batch if isinstance(h, dict)]
            if len(batch) < 50:
                return hooks
        return hooks

    def create_hook(self, repo: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.request("POST", f"/repos/{repo}/hooks", json=body)
        return self._check(response, f"create webhook in {repo}", expect=(201,))

    def delete_hook(self, repo: str, hook_id: int) -> None:
        response = self.request("DELETE", f"/repos/{repo}/hooks/{hook_id}")
        if response.status_code != 204:
            self._check(response, f"delete webhook #{hook_id} of {repo}", expect=(204,))

    # --------------------------------------------------------------- statuses

    def latest_statuses(self, repo: str, sha: str) -> dict[str, CommitStatus]:
        """The latest status of each context on commit ``sha``, keyed by context: every
        page of Gitea's combined status."""
        found: dict[str, CommitStatus] = {}
        for page in self.status_pages(repo, sha):
            for status in page:
                found.setdefault(status.context, status)
        return found

    def status_pages(self, repo: str, sha: str) -> Iterator[list[CommitStatus]]:
        """Gitea's combined status of commit ``sha``, page by page: the latest status of
        each context, at most STATUS_PAGE contexts a page, the most recently updated
        first. X-Total-Count counts the contexts; a page that is not full is the last."""
        what = f"statuses of {repo}@{sha[:12]}"
        for page in range(1, MAX_STATUS_PAGES + 1):
            response = self.request(
                "GET",
                f"/repos/{repo}/commits/{_seg(sha)}/status",
                params={"limit": str(STATUS_PAGE), "page": str(page)},
            )
            data = self._check(response, what)
            if not isinstance(data, dict):
                raise GiteaError(f"{what}: Gitea answered something that is not an object")
            items = data.get("statuses") or []
            yield commit_statuses(items, what)
            if last_status_page(response, page, len(items)):
                return
        raise GiteaError(
            f"{what}: more than {MAX_STATUS_PAGES * STATUS_PAGE} contexts; fabrique reads no more"
        )

    def create_status(self, repo: str, sha: str, status: CommitStatus) -> None:
        """Add a status to commit ``sha``; Gitea then shows it as the context's latest."""
        if status.state not in STATUS_STATES:
            raise ValueError(f"commit status state {status.state!r}")
        body = {"context": status.context, "state": status.state}
        body["description"] = status.description
        if status.target_url:
            body["target_url"] = status.target_url
        what = f"status {status.context} on {repo}@{sha[:12]}"
        url = f"/repos/{repo}/statuses/{_seg(sha)}"
        response = self.request("POST", url, json=body, answered=frozenset({500}))
        if response.status_code == 500 and self.resolve_commit(repo, sha) is None:
            # CreateCommitStatus answers a commit it cannot find with 500, not 404, and
            # tells why to a site admin only: a commit that is not there is no failure
            # to retry
            raise GiteaError(f"{what}: commit not found in Gitea")
        if response.status_code == 500:  # any other failure: retried as every 500 is
            response = self.request("POST", url, json=body)
        if response.status_code == 400:
            raise GiteaError(f"{what}: Gitea refused it (HTTP 400)")
        self._check(response, what, expect=(201,))

    # ---------------------------------------------------------- pull requests

    def branch_tip(self, repo: str, branch: str) -> str | None:
        """The commit at the head of ``branch``, or None if there is no such branch."""
        what = f"branch {branch!r} of {repo}"
        return self._found(f"/repos/{repo}/branches/{_seg(branch)}", what, _head)

    def delete_branch(self, repo: str, branch: str) -> None:
        """Delete ``branch``; one already gone is no error."""
        response = self.request("DELETE", f"/repos/{repo}/branches/{_seg(branch)}")
        if response.status_code not in (204, 404):
            self._check(response, f"delete branch {branch!r} of {repo}", expect=(204,))

    def open_pull(self, repo: str, base: str, head: str) -> PullRequest | None:
        """The open pull request from branch ``head`` of ``repo`` into ``base``, or None.

        Gitea's ``pulls/{base}/{head}`` answers one request: none ever (404), or one of
        them, open, closed or merged, whichever its database gives first. Only when it
        gives one that is not open (an earlier one, merged) are the open ones into
        ``base`` listed and ``head`` found among them: a branch of ``repo`` itself, never
        a fork's of the same name."""
        if "/" not in base:  # the route's {base} is one path segment
            what = f"pull request {head} -> {base} in {repo}"
            found = self._found(f"/repos/{repo}/pulls/{_seg(base)}/{_seg(head)}", what, _pull)
            if found is None:
                return None
            if found.state == "open":
                return found
        return next(self._pulls(repo, base, head, "open"), None)

    def pull(self, repo: str, number: int) -> PullRequest | None:
        """Pull request ``number``, whatever its state; None if there is none."""
        what = f"pull request #{number} of {repo}"
        return self._found(f"/repos/{repo}/pulls/{number}", what, _pull)

    def latest_status(self, repo: str, sha: str, context: str) -> CommitStatus | None:
        """The latest status of ``context`` on commit ``sha``, if any: its combined
        status read no further than the page that holds it."""
        for page in self.status_pages(repo, sha):
            for status in page:
                if status.context == context:
                    return status
        return None

    def open_pulls(self, repo: str, base: str) -> list[PullRequest]:
        """The open pull requests from branches of ``repo`` itself into ``base``."""
        return list(self._pulls(repo, base, None, "open"))

    def _pulls(self, repo: str, base: str, head: str | None, state: str) -> Iterator[PullRequest]:
        """The pull requests in ``state`` from branch ``head`` (None: any) of ``repo``
        into ``base``, the most recently updated first, listed page by page (whatever the
        page size Gitea keeps: a page with none, or the count X-Total-Count gives, ends
        it)."""
        what = f"{state} pull requests into {base} of {repo}"
        seen = 0
        for page in range(1, MAX_PULL_PAGES + 1):
            params = {"state": state, "base_branch": base, "sort": "recentupdate"}
            params |= {"page": str(page), "limit": "50"}
            response = self.request("GET", f"/repos/{repo}/pulls", params=params)
            batch = self._check(response, what)
            if not isinstance(batch, list):
                raise GiteaError(f"{what}: Gitea answered something that is not a list")
            for item in batch:
                same_repo = str(_get(item, "head", "repo", "full_name") or "").lower()
                if (
                    head in (None, _get(item, "head", "ref"))
                    and _get(item, "base", "ref") == base
                    and same_repo == repo.lower()
                ):
                    yield _pull(item, what)
            seen += len(batch)
            total = response.headers.get("X-Total-Count", "")
            if not batch or (total.isdigit() and seen >= int(total)):
                return
        raise GiteaError(f"{what}: more than {seen}; fabrique reads no more")

    def behind(self, repo: str, base: str, head: str) -> int:
        """How many commits of ``base`` ``head`` lacks (one compare)."""
        return self._compare_total(repo, head, base)

    def cancel_merge(self, repo: str, number: int) -> None:
        """Cancel the merge scheduled for pull request ``number``; none is no error."""
        response = self.request("DELETE", f"/repos/{repo}/pulls/{number}/merge")
        if response.status_code not in (204, 404):
            self._check(response, f"cancel the merge of #{number} of {repo}", expect=(204,))

    def create_pull(self, repo: str, base: str, head: str, title: str, body: str) -> PullRequest:
        what = f"pull request {head} -> {base} in {repo}"
        response = self.request(
            "POST",
            f"/repos/{repo}/pulls",
            json={"base": base, "head": head, "title": title, "body": body},
        )
        if response.status_code == 409:  # opened meanwhile (another write-back): that one
            found = self.open_pull(repo, base, head)
            if found is not None:
                return found
        if response.status_code == 422:
            raise GiteaError(f"{what}: Gitea refused it (HTTP 422): {_message(response)}")
        return _pull(self._check(response, what, expect=(201,)), what)

    def edit_pull(self, repo: str, number: int, **fields: str) -> PullRequest:
        """Change ``title``, ``body`` or ``state`` of pull request ``number``."""
        what = f"pull request #{number} of {repo}"
        response = self.request("PATCH", f"/repos/{repo}/pulls/{number}", json=fields)
        return _pull(self._check(response, what, expect=(201,)), what)

    def merge_pull(self, repo: str, number: int, *, style: str, head: str) -> str:
        """Ask Gitea to merge pull request ``number`` once the checks its base branch
        requires pass (at once if none are required): ``scheduled``; ``merged`` when a
        merge scheduled before has taken it already; or ``busy`` while Gitea is still
        checking the pull request after a push (ask again later)."""
        what = f"merge of pull request #{number} of {repo}"
        body: dict[str, Any] = {
            "do": style,
            "merge_when_checks_succeed": True,
            "delete_branch_after_merge": True,
        } | ({"head_commit_id": head} if head else {})
        response = self.request("POST", f"/repos/{repo}/pulls/{number}/merge", json=body)
        message = _message(response)
        if response.status_code in (200, 201):  # 201: scheduled, whatever the checks say
            return "scheduled"
        if response.status_code == 409 and "already scheduled" in message:
            return "scheduled"
        if response.status_code == 405 and "already merged" in message:
            return "merged"  # a schedule asked before took it first (a remade proposal)
        if response.status_code == 405 and "try again later" in message.lower():
            return "busy"  # Gitea is checking it after a push, or finds it conflicting
        if response.status_code in (405, 409):
            raise GiteaError(
                f"{what}: Gitea will not merge it (HTTP {response.status_code}): "
                f"{message or 'a conflict'}"
            )
        self._check(response, what)
        raise GiteaError(f"{what}: Gitea answered HTTP {response.status_code}")

    # ----------------------------------------------------------------- writes

    def update_file(
        self,
        repo: str,
        branch: str,
        current: FileContent,
        text: str,
        message: str,
        author: Identity,
        *,
        onto: str | None = None,
    ) -> str:
        """Replace a file read as ``current``; StaleWrite if it has changed. Returns the
        commit. ``onto``: the commit goes to that branch instead, made from ``branch``'s
        head and forced there (a pull request's branch, made again on its base)."""
        body = self._write_body(branch, text, message, author, onto) | {"sha": current.sha}
        return self._write("PUT", repo, current.path, branch, body)

    def create_file(
        self,
        repo: str,
        path: str,
        branch: str,
        text: str,
        message: str,
        author: Identity,
        *,
        onto: str | None = None,
    ) -> str:
        """Create a file; StaleWrite if it appeared since it was found missing."""
        return self._write(
            "POST", repo, path, branch, self._write_body(branch, text, message, author, onto)
        )

    def change_files(
        self,
        repo: str,
        branch: str,
        changes: Sequence[FileChange],
        message: str,
        author: Identity,
        *,
        onto: str | None = None,
    ) -> str:
        """Create and update ``changes`` in one commit on ``branch``; all or none.
        StaleWrite if any file changed since it was read (or appeared, for a create).
        ``onto``: the commit is made on ``branch``'s head and forced onto branch ``onto``
        instead (a proposal), ``branch`` left as it is. Returns the commit."""
        paths = [change.path for change in changes]
        if not paths or len(set(paths)) != len(paths):
            raise ValueError(f"change_files: no change, or a path twice: {paths}")
        files = [
            {
                "operation": "create" if change.sha is None else "update",
                "path": change.path,
                "content": _base64(change.text),
            }
            | ({} if change.sha is None else {"sha": change.sha})
            for change in changes
        ]
        body = self._commit_fields(branch, message, author, onto) | {"files": files}
        named = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        response = self.request(
            "POST", f"/repos/{repo}/contents", json=body, answered=frozenset({500})
        )
        update = any(change.sha is not None for change in changes)
        return self._written(response, f"{named} in {repo}@{branch}", branch, named, update)

    @staticmethod
    def _commit_fields(
        branch: str, message: str, author: Identity, onto: str | None = None
    ) -> dict[str, Any]:
        person = {"name": author.name, "email": author.email}
        forced = {"new_branch": onto, "force_push": True} if onto else {}
        return {"branch": branch, "message": message, "author": person, "committer": person} | (
            forced
        )

    @classmethod
    def _write_body(
        cls, branch: str, text: str, message: str, author: Identity, onto: str | None = None
    ) -> dict[str, Any]:
        return cls._commit_fields(branch, message, author, onto) | {"content": _base64(text)}

    def _write(self, method: str, repo: str, path: str, branch: str, body: dict[str, Any]) -> str:
        response = self.request(
            method, f"/repos/{repo}/contents/{_path(path)}", json=body, answered=frozenset({500})
        )
        return self._written(response, f"{path} in {repo}@{branch}", branch, path, method == "PUT")

    def _written(
        self, response: httpx.Response, what: str, branch: str, paths: str, update: bool
    ) -> str:
        """The commit of a Contents API write (ChangeRepoFiles), or the error its answer
        means; ``update``: it replaced a file read before (a 404 is then that file gone)."""
        message = _message(response)
        if response.status_code == 422 and not STALE_MESSAGE.match(message):
            # an invalid path or name (a file where a directory is, a malformed component):
            # no re-read will change that
            raise TargetError(f"{what}: Gitea refused the write (HTTP 422): {message}")
        if response.status_code in (409, 422):
            raise StaleWrite(f"{what}: changed since it was read (HTTP {response.status_code})")
        if response.status_code == 500:
            # ChangeRepoFiles pushes a temporary clone; a branch that moved in between is
            # ErrPushOutOfDate, which Gitea answers 500 (with no message in production)
            raise StaleWrite(
                f"{what}: Gitea answered HTTP 500 (its push raced another write, or it failed)"
            )
        if response.status_code == 403 and REF_LOCK_MESSAGE.search(message):
            # two of its pushes at one ref at once: the loser's ref update finds the ref
            # moved, and git.ErrPushRejected is answered 403 with that line; no token
            # was refused, and a re-read lands it
            raise StaleWrite(f"{what}: Gitea's push lost the branch to another write ({message})")
        if response.status_code == 403 and PROTECTION_MESSAGE.search(message):
            raise GiteaError(
                f"{what}: branch protection refused the write ({message}); let the token's "
                f"user push to {branch}, or unprotect {paths}"
            )
        if response.status_code == 404 and update:
            # the update of a file that is gone (deleted since it was read): stale, and the
            # re-read says what is there now (no file, or no branch)
            raise StaleWrite(f"{what}: gone since it was read (HTTP 404)")
        if response.status_code == 404:
            raise GiteaError(f"{what}: branch or repository not found")
        if response.status_code == 423:
            raise GiteaError(f"{what}: repository is locked (archived or being migrated)")
        data = self._check(response, what, expect=(200, 201))
        commit = _get(data, "commit", "sha")
        if not isinstance(commit, str) or not REVISION_RE.fullmatch(commit):
            raise GiteaError(f"{what}: Gitea answered without commit.sha; the write is unconfirmed")
        return commit

    # ---------------------------------------------------------------- helpers

    def _json(self, method: str, url: str, what: str) -> Any:
        return self._check(self.request(method, url), what)

    def _found(self, url: str, what: str, parse: Callable[[Any, str], _T]) -> _T | None:
        """GET ``url``, its answer parsed; None for a 404 the token was there to see
        (without one, a 404 may be a private repository: ``_check`` says so)."""
        response = self.request("GET", url)
        if response.status_code == 404 and not self.anonymous:
            return None
        return parse(self._check(response, what), what)

    def _check(self, response: httpx.Response, what: str, expect: tuple[int, ...] = (200,)) -> Any:
        if self.anonymous and response.status_code in (401, 403, 404):
            # without a token Gitea shows no private repository (404) and takes no write
            raise GiteaError(
                f"{what}: Gitea answered HTTP {response.status_code} to a request without a "
                f"token; set {TOKEN_ENV} (or the token Secret)"
            )
        if response.status_code == 404:
            raise GiteaError(
                f"{what}: not found in Gitea (Gitea also answers 404 for a private repository "
                "that the token's user may not read)"
            )
        scope = SCOPE_MESSAGE.search(_message(response)) if response.status_code == 403 else None
        if scope:
            raise GiteaError(
                f"{what}: the token lacks the scope {scope['required']} (HTTP 403); make a "
                f"token with it (it has {scope['has'] or 'none'})"
            )
        if response.status_code in (401, 403):
            raise GiteaError(
                f"{what}: Gitea refused the token (HTTP {response.status_code}); "
                f"check {TOKEN_ENV} or the token Secret"
            )
        if response.status_code not in expect:
            raise GiteaError(f"{what}: Gitea answered HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise GiteaError(f"{what}: Gitea answered something that is not JSON") from None


# Gitea's 422 messages that mean "someone wrote first": re-read and re-apply. Every
# other 422 of the Contents API is about the path or the request, and final.
STALE_MESSAGE = re.compile(
    r"sha does not match|repository file already exists|file CommitID does not match", re.I
)
# Gitea's tokenRequiresScopes: `…required scope(s), required=[write:repository], token
# scope=read:repository`
SCOPE_MESSAGE = re.compile(
    r"required scope\(s\), required=\[(?P<required>[^\]]*)\], token scope=(?P<has>\S*)"
)
# git's line when a ref moved under an update that expected it elsewhere (receive-pack's
# "cannot lock ref 'refs/heads/main': is at <sha> but expected <sha>")
REF_LOCK_MESSAGE = re.compile(r"cannot lock ref '[^']+': is at [0-9a-f]+ but expected [0-9a-f]+")
# Gitea's 403 messages for a protected branch or path (not a refused token)
PROTECTION_MESSAGE = re.compile(
    r"cannot commit to repo|path is protected|permission to write to the target branch", re.I
)


def _message(response: httpx.Response) -> str:
    """The ``message`` of a Gitea APIError, one line, or ""."""
    try:
        data = response.json()
    except ValueError:
        return ""
    message = data.get("message") if isinstance(data, dict) else None
    return " ".join(str(message).split())[:300] if message else ""


def commit_statuses(items: list[Any], what: str) -> list[CommitStatus]:
    """Gitea's CommitStatus objects, read (GiteaError for one without a context or a
    known state)."""
    found = []
    for item in items:
        context, state = _get(item, "context"), _get(item, "status")
        if not isinstance(context, str) or state not in STATUS_STATES:
            raise GiteaError(f"{what}: a status without a context or a known state")
        description, url = _get(item, "description"), _get(item, "target_url")
        posted = _get(item, "created_at")
        found.append(
            CommitStatus(context, state, str(description or ""), str(url or ""), str(posted or ""))
        )
    return found


def last_status_page(response: httpx.Response, page: int, count: int) -> bool:
    """Whether page ``page`` of statuses, holding ``count``, is the last: it is not full,
    or X-Total-Count says no more follow."""
    total = response.headers.get("X-Total-Count", "")
    return count < STATUS_PAGE or (total.isdigit() and page * STATUS_PAGE >= int(total))


def _file_content(data: Any, path: str, what: str) -> FileContent:
    """The FileContent of Gitea's ContentsResponse of ``path`` (TargetError for what is no
    file, or a file too large for Gitea to send; GiteaError for an answer without it)."""
    if not isinstance(data, dict) or data.get("type") != "file":
        # the contents of a directory are the list of its entries; file-contents gives
        # its entry, of type "dir"
        kind = data.get("type") if isinstance(data, dict) else "directory"
        kind = "directory" if kind == "dir" else kind
        raise TargetError(f"{what}: is a {kind}, not a file; a target must be a file")
    sha, content = data.get("sha"), data.get("content")
    if content is None and data.get("encoding") is None and isinstance(data.get("size"), int):
        # above [api] DEFAULT_MAX_BLOB_SIZE Gitea lists the file without its content
        raise TargetError(
            f"{what}: {data['size']} bytes, more than Gitea sends through the Contents "
            "API ([api] DEFAULT_MAX_BLOB_SIZE); a write-back target must be a small file"
        )
    if data.get("encoding") != "base64" or not isinstance(content, str) or not sha:
        raise GiteaError(f"{what}: Gitea answered without base64 content and sha")
    try:
        text = base64.b64decode(content, validate=False).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise GiteaError(f"{what}: content is not UTF-8 text") from None
    return FileContent(path, text, str(sha))


def _base64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _head(data: Any, what: str) -> str:
    head = _get(data, "commit", "id")
    if not isinstance(head, str) or not REVISION_RE.fullmatch(head):
        raise GiteaError(f"{what}: Gitea answered without a valid commit.id")
    return head


def _pull(data: Any, what: str) -> PullRequest:
    """A PullRequest of Gitea's answer (GiteaError for one that lacks what fabrique reads)."""
    number, url, state = _get(data, "number"), _get(data, "html_url"), _get(data, "state")
    head = _get(data, "head", "sha")
    if not isinstance(number, int) or not isinstance(url, str) or state not in ("open", "closed"):
        raise GiteaError(f"{what}: Gitea answered without a number, html_url or state")
    if not isinstance(head, str) or not REVISION_RE.fullmatch(head):
        raise GiteaError(f"{what}: Gitea answered without a valid head.sha")
    return PullRequest(
        number,
        url,
        state,
        bool(_get(data, "merged")),
        head,
        str(_get(data, "title") or ""),
        str(_get(data, "body") or ""),
        str(_get(data, "base", "sha") or ""),
        str(_get(data, "merge_base") or ""),
        str(_get(data, "head", "ref") or ""),
    )


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _seg(value: str) -> str:
    """One URL path segment (a branch may hold '/')."""
    return quote(value, safe="")


def _path(path: str) -> str:
    return quote(path, safe="/")
