"""Gitea API client (``/api/v1``), for what fabrique reads and writes in Gitea.

The token comes from ``FABRIQUE_GITEA_TOKEN`` (in a pod: from the Secret the site names)
and is sent as ``Authorization: token …``. It is never logged nor put in a message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import httpx

from ._http import DEFAULT_TIMEOUT, RetryPolicy, Unreachable, send
from .errors import GiteaError
from .names import REVISION_RE

TOKEN_ENV = "FABRIQUE_GITEA_TOKEN"


def token_from_env(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    return env.get(TOKEN_ENV) or None


class GiteaClient:
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
        self.retry = retry or RetryPolicy()
        self._client = httpx.Client(
            base_url=f"{url}/api/v1", headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> GiteaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def branch_head(self, repo: str, branch: str) -> str:
        """The commit id at the head of ``repo``'s ``branch``."""
        what = f"branch {branch!r} of {repo}"
        data = self._get_json(f"/repos/{repo}/branches/{branch}", what)
        commit = data.get("commit") if isinstance(data, dict) else None
        head = commit.get("id") if isinstance(commit, dict) else None
        if not isinstance(head, str) or not REVISION_RE.match(head):
            raise GiteaError(f"{what}: Gitea answered without a valid commit.id")
        return head

    def _get_json(self, path: str, what: str) -> Any:
        try:
            response = send(self._client, "GET", path, retry=self.retry)
        except Unreachable as exc:
            raise GiteaError(f"Gitea at {self.url} unreachable: {exc.reason}") from None
        if response.status_code == 404:
            raise GiteaError(f"{what}: not found in Gitea")
        if response.status_code in (401, 403):
            raise GiteaError(
                f"{what}: Gitea refused the token (HTTP {response.status_code}); "
                f"check {TOKEN_ENV} or the token Secret"
            )
        if response.status_code != 200:
            raise GiteaError(f"{what}: Gitea answered HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise GiteaError(f"{what}: Gitea answered something that is not JSON") from None
