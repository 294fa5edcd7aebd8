"""The event path's Gitea: a real Gitea that delivers webhook #2 as the README says to set
it up, its code repository ``atlas/atlas`` and a clone that pushes over HTTP.

Only the EventSource's Service is allowed (``[security] ALLOWED_HOST_LIST``), reached
through the cluster's Service network (``events.ServiceProxy``, Gitea's ``[webhook]
PROXY_URL``); the hook is made by ``fabrique seed-webhook``. Used by the event path's
live tests and by the fault bench's real mode (``bench/event_loss.py --real``).
"""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from fabrique.site.config import merge
from fabrique.site.names import webhook_service_url

from ..conftest import run_cli
from ..gitrepo import make_commit
from .events import CONTROL, ServiceProxy
from .gitea import ADMIN, Gitea
from .gitea import binary as gitea_binary

SERVICE_HOST = urlsplit(webhook_service_url(CONTROL)).hostname or ""
CODE_REPO = "atlas/atlas"


@dataclass
class Forge:
    """The event path's Gitea, its code repository and a clone that pushes over HTTP."""

    gitea: Gitea
    proxy: ServiceProxy
    work: Path
    values: Path
    bearer: str

    @property
    def env(self) -> dict[str, str]:
        return {"FABRIQUE_GITEA_TOKEN": self.gitea.token, "FABRIQUE_WEBHOOK_TOKEN": self.bearer}

    @property
    def bare(self) -> Path:
        """The code repository as Gitea keeps it on disk (to read, never to write)."""
        return self.gitea.folder / "repositories" / f"{CODE_REPO}.git"

    def git(self, *args: str) -> str:
        # the admin's credentials as a header, never in a URL or an argument
        basic = base64.b64encode(f"{ADMIN}:{self.gitea.password}".encode()).decode()
        env = {
            **os.environ,
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
        }
        done = subprocess.run(
            ["git", "-C", str(self.work), *args], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, f"git {args[0]}: {done.stderr}"
        return done.stdout

    def commit(self, files: dict[str, str], message: str) -> str:
        """A commit on main over the server's (pulled first), not pushed yet."""
        if self.git("ls-remote", "origin", "refs/heads/main"):
            self.git("pull", "-q", "--ff-only", "origin", "main")
        return make_commit(self.work, files, message)

    def push(self, files: dict[str, str] | None = None, message: str = "change") -> str:
        """Push main over HTTP, with a commit of ``files`` first if given; the head."""
        sha = (
            self.commit(files, message)
            if files is not None
            else self.git("rev-parse", "HEAD").strip()
        )
        self.git("push", "-q", "origin", "HEAD:main")
        return sha

    def cli(self, *args: str) -> str:
        result = run_cli("--values", str(self.values), *args, env=self.env)
        assert result.exit_code == 0, result.stderr
        for secret in self.env.values():
            assert secret not in result.stdout + result.stderr
        return result.stdout

    def hook_id(self) -> int:
        with self.gitea.admin() as admin:
            (hook,) = admin.get(f"/repos/{CODE_REPO}/hooks").json()
        return int(hook["id"])

    def test_delivery(self, hook: int) -> int:
        """Gitea's "Test Delivery" of the hook: the branch head's push, delivered again.
        The status Gitea answered (204)."""
        with self.gitea.admin() as admin:
            return admin.post(f"/repos/{CODE_REPO}/hooks/{hook}/tests").status_code


@contextmanager
def forge(
    folder: Path,
    proxy: ServiceProxy,
    bearer: str,
    values: dict[str, Any] | None = None,
    seed: dict[str, str] | None = None,
) -> Iterator[Forge]:
    """A Gitea whose webhooks go through ``proxy`` to the EventSource's Service only;
    its code repository, with a first commit of ``seed`` pushed before the hook is made
    (so that it is delivered to nobody); the site's ``values`` (its Gitea the one
    started here) in the values file ``fabrique`` is run with; the hook made by
    ``fabrique seed-webhook``. A ControlPlaneError if Gitea does not start."""
    webhook = {"PROXY_URL": proxy.url, "PROXY_HOSTS": "*.svc.cluster.local:*"}
    gitea = Gitea(
        folder / "gitea",
        gitea_binary(),
        allowed_hosts=f"external, {SERVICE_HOST}",
        webhook=webhook,
    ).start()
    try:
        assert gitea.repository(CODE_REPO)
        work = folder / CODE_REPO.split("/")[1]
        subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
        values_file = folder / "site.yaml"
        values_file.write_text(yaml.safe_dump(merge(values or {}, {"gitea": {"url": gitea.url}})))
        made_forge = Forge(gitea, proxy, work, values_file, bearer)
        made_forge.git("remote", "add", "origin", f"{gitea.url}/{CODE_REPO}.git")
        if seed is not None:
            made_forge.push(seed, "seed")
        seeded = made_forge.cli("seed-webhook")
        assert seeded.startswith("created: webhook #"), seeded
        yield made_forge
    finally:
        gitea.stop()
