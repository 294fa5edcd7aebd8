"""A Gitea API double over a real bare git repository. Not Gitea.

It serves the subset of ``/api/v1`` that fabrique uses. Every request and answer is
checked against Gitea 1.27.1's Swagger document (``doubles.swagger``); a violation is
recorded and fails the test that caused it. Commits are read from the bare repository
with git itself, so what the double says is what the repository holds.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from .http import LoopbackServer, Request
from .swagger import SpecViolation, Swagger


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


class GiteaDouble:
    def __init__(self, swagger: Swagger, repos: dict[str, Path], token: str | None = None) -> None:
        self.swagger = swagger
        self.repos = repos  # "owner/name" -> bare repository
        self.token = token
        self.violations: list[str] = []
        self.requests: list[Request] = []
        self.server = LoopbackServer(self._handle)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> GiteaDouble:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def _handle(self, request: Request) -> tuple[int, Any]:
        self.requests.append(request)
        base = self.swagger.base_path
        if not request.path.startswith(base + "/"):
            return 404, None
        path = request.path[len(base) :]
        try:
            self.swagger.check_request(request.method, path, request.query, request.json())
            status, body = self._route(request, path)
            self.swagger.check_response(request.method, path, status, body)
        except SpecViolation as violation:
            self.violations.append(str(violation))
            return 500, {"message": f"double: {violation}"}
        return status, body

    def _route(self, request: Request, path: str) -> tuple[int, Any]:
        if self.token is not None and request.headers.get("authorization") != f"token {self.token}":
            return 401, {"message": "token is required", "url": self.url}
        match = re.fullmatch(r"/repos/([^/]+)/([^/]+)/branches/([^/]+)", path)
        if match and request.method == "GET":
            return self._branch(f"{match[1]}/{match[2]}", match[3])
        raise SpecViolation(f"{request.method} {path}: declared by Gitea, not served by the double")

    def _branch(self, repo: str, branch: str) -> tuple[int, Any]:
        bare = self.repos.get(repo)
        if bare is None:
            return 404, {"message": "The target couldn't be found.", "url": self.url, "errors": []}
        try:
            sha = git(bare, "rev-parse", "--verify", f"refs/heads/{branch}^{{commit}}")
        except subprocess.CalledProcessError:
            return 404, {"message": "The target couldn't be found.", "url": self.url, "errors": []}
        message = git(bare, "log", "-1", "--format=%B", sha)
        return 200, {
            "name": branch,
            "commit": {
                "id": sha,
                "message": message,
                "url": f"{self.url}/{repo}/commit/{sha}",
                "timestamp": git(bare, "log", "-1", "--format=%cI", sha),
                "author": {"name": "seed", "email": "seed@example.invalid", "username": "seed"},
                "committer": {"name": "seed", "email": "seed@example.invalid", "username": "seed"},
                "added": [],
                "removed": [],
                "modified": [],
            },
            "protected": False,
            "required_approvals": 0,
            "enable_status_check": False,
            "status_check_contexts": [],
            "user_can_push": True,
            "user_can_merge": True,
            "effective_branch_protection_name": "",
        }
