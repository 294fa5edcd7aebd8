"""A real Gitea on loopback, built from the wrapper module of ``tests/peers/gitea``.

It needs no control plane: one ``gitea web`` with its SQLite database, its repositories
and its log in one folder. Starting it is Gitea's own commands, as an operator runs them
on a new host: ``gitea migrate`` makes the database, ``gitea admin user create`` its
admin and fabrique's user, ``gitea admin user generate-access-token`` the token fabrique
is given, with the scopes the README asks for, then ``gitea web``; it is up once
``/api/v1/version`` answers. fabrique's user is no site admin, as in production: Gitea
shows the message of a 500 to a site admin only, and hides from nobody else a private
repository. A test gives it its repositories by making their organization its own
(``organization``).

Built without ``bindata``, Gitea reads its templates, locales and public files from
``[server] STATIC_ROOT_PATH`` (``templates/``, ``options/``, ``public/`` under it, by
``modules/templates``, ``modules/options`` and ``modules/public``; by default the work
path). They are the release's own, in the module cache: ``STATIC_ROOT_PATH`` names
the folder of ``code.gitea.io/gitea`` there, which Gitea only reads.

The token and the admin's password are written to files of mode 0600 in the folder and
never printed; a failure ends with the tail of Gitea's log, which holds neither.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from . import controlplane
from .controlplane import ControlPlaneError, write_secret

GITEA_MODULE = "code.gitea.io/gitea"
ADMIN = "fabrique-admin"
USER = "fabrique"  # the token's user; its email is no commit author's
# the README's token (Deploy with kubectl): it writes the write-back targets' repositories,
# and Gitea 1.27's compare asks for no more than reading their code
SCOPES = ("write:repository",)


def version() -> str:
    """The version of Gitea its wrapper module builds (``v1.27.3``): the templates must
    be that release's."""
    return controlplane.peers.Peer("gitea", controlplane.ROOT / "tests/peers/gitea").required(
        GITEA_MODULE
    )


def _run_user() -> str:
    """The user Gitea must run as (``RUN_USER``): the one running it."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER", "")


@dataclass
class Gitea:
    """The folder of one Gitea, and the ``gitea web`` that serves it."""

    folder: Path
    binary: Path
    port: int = 0
    pid: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # [security] ALLOWED_HOST_LIST, which Gitea 1.27.3 reads for webhooks (its [webhook]
    # key is deprecated): by default deliveries may go to loopback receivers
    allowed_hosts: str = "loopback"
    # app.ini's [webhook] section
    webhook: dict[str, str] = field(default_factory=dict)
    # where it listens: a plane's pods reach the host at the plane's own address, where
    # a Gitea of the plane can take the port of the site's URL (3000)
    host: str = "127.0.0.1"
    fixed_port: int | None = None
    # ROOT_URL, what Gitea calls itself in its payloads (a push's repository.html_url,
    # which Argo CD matches to an Application's repoURL): the site's URL, where the
    # node's pods know it; its own URL by default
    root_url: str | None = None
    # app.ini's [repository.signing] section: how Gitea signs and whose keys it trusts
    signing: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def app_ini(self) -> Path:
        return self.folder / "app.ini"

    @property
    def token_file(self) -> Path:
        """fabrique's token: its user's, with the README's scopes."""
        return self.folder / "token"

    @property
    def password_file(self) -> Path:
        return self.folder / "admin.password"

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    @property
    def state_file(self) -> Path:
        return self.folder / "state.json"

    def admin(self) -> httpx.Client:
        """An API client as the site admin (basic auth): what fabrique's token may not
        do, such as making organizations and repositories."""
        return httpx.Client(base_url=f"{self.url}/api/v1", auth=(ADMIN, self.password), timeout=30)

    def organization(self, name: str) -> str:
        """The organization ``name``, owned by fabrique's user (made once)."""
        with self.admin() as admin:
            made = admin.post(f"/admin/users/{USER}/orgs", json={"username": name})
        if made.status_code != 422:  # 422: it is there already
            made.raise_for_status()
        return name

    def repository(self, slug: str, branch: str = "main") -> bool:
        """The repository ``slug``, ``branch`` its default, in an organization of
        fabrique's user, made by the admin when missing (fabrique's token may not make
        one); whether it was made now."""
        owner, name = slug.split("/")
        self.organization(owner)
        with self.admin() as admin:
            if admin.get(f"/repos/{slug}").status_code == 200:
                return False
            made = admin.post(
                f"/admin/users/{owner}/repos", json={"name": name, "default_branch": branch}
            )
        if made.status_code != 201:
            raise ControlPlaneError(f"Gitea did not make {slug}: {made.status_code} {made.text}")
        return True

    def commit(self, slug: str, branch: str, files: dict[str, str], message: str) -> str:
        """One commit of ``files`` on ``branch`` (a first one into an empty repository
        too), by the admin through the Contents API; its id. A file the branch has is
        updated (the Contents API wants its blob's sha), any other created."""
        with self.admin() as admin:
            changes = []
            for path, content in files.items():
                found = admin.get(f"/repos/{slug}/contents/{path}", params={"ref": branch})
                change = {"operation": "create", "path": path, "content": _base64(content)}
                if found.status_code == 200:
                    change.update(operation="update", sha=found.json()["sha"])
                changes.append(change)
            body = {"branch": branch, "message": message, "files": changes}
            made = admin.post(f"/repos/{slug}/contents", json=body)
        if made.status_code != 201:
            raise ControlPlaneError(
                f"Gitea did not commit to {slug}: {made.status_code} {made.text}"
            )
        return str(made.json()["commit"]["sha"])

    # -- state: what `make down` and a second `make up` read ------------------------------

    def save(self) -> None:
        self.state_file.write_text(
            json.dumps(
                {"port": self.port, "pid": self.pid, "binary": str(self.binary), "host": self.host}
            )
        )

    @classmethod
    def load(cls, folder: Path) -> Gitea | None:
        try:
            state = json.loads((folder / "state.json").read_text())
            gitea = cls(folder, Path(state["binary"]), int(state["port"]), int(state["pid"]))
            gitea.host = str(state.get("host") or gitea.host)
            return gitea
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def alive(self) -> bool:
        return controlplane._exited(self.pid) is None and self._version() is not None

    # -- start ----------------------------------------------------------------------------

    def start(self, attempts: int = 3) -> Gitea:
        """A new Gitea in the folder (what was there is dropped); a port taken meanwhile
        is a new try on a new port, up to ``attempts``."""
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                self._start()
                break
            except ControlPlaneError as failed:
                if "address already in use" not in str(failed) or attempt == attempts:
                    raise
                print(f"# gitea: its port was taken, try {attempt + 1}", file=sys.stderr)
        print(
            f"# gitea {version()} at {self.url}: started in {time.monotonic() - started:.1f} s",
            file=sys.stderr,
        )
        return self

    def _start(self) -> None:
        for name in ("data", "repositories", "log"):  # every start is a new Gitea
            shutil.rmtree(self.folder / name, ignore_errors=True)
        (self.folder / "console.log").unlink(missing_ok=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = self.fixed_port or controlplane.free_port()
        self._write_app_ini()
        self._gitea("migrate")
        password = secrets.token_urlsafe(18)
        self._gitea(
            "admin",
            "user",
            "create",
            "--admin",
            f"--username={ADMIN}",
            f"--password={password}",
            f"--email={ADMIN}@example.invalid",
            "--must-change-password=false",
        )
        write_secret(self.password_file, password + "\n")
        self._gitea(
            "admin",
            "user",
            "create",
            f"--username={USER}",
            "--random-password",
            f"--email={USER}-user@example.invalid",
            "--must-change-password=false",
        )
        token = self._gitea(
            "admin",
            "user",
            "generate-access-token",
            f"--username={USER}",
            "--token-name=fabrique",
            f"--scopes={','.join(SCOPES)}",
            "--raw",
        ).strip()
        write_secret(self.token_file, token + "\n")
        log = (self.folder / "console.log").open("ab")
        self.process = subprocess.Popen(
            [str(self.binary), "web", f"--config={self.app_ini}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.folder,
            env=_environment(),
            start_new_session=True,  # `make up` leaves it running after this process ends
        )
        log.close()
        self.pid = self.process.pid
        self.save()
        try:
            controlplane.wait_on(
                self.pid,
                "gitea web",
                "gitea web to answer",
                lambda: self._version() is not None,
                60,
                self.tail,
            )
        except ControlPlaneError:
            self.stop()
            raise

    def _write_app_ini(self) -> None:
        f = self.folder
        static = controlplane.module_dir(GITEA_MODULE, version())
        root = os.getuid() == 0
        webhook = "\n".join(f"{key} = {value}" for key, value in self.webhook.items())
        signing = "\n".join(f"{key} = {value}" for key, value in self.signing.items())
        # its SECRET_KEY and INTERNAL_TOKEN
        write_secret(
            self.app_ini,
            f"""\
APP_NAME = fabrique live
RUN_MODE = prod
RUN_USER = {_run_user()}
WORK_PATH = {f}
{"I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true" if root else ""}

[server]
PROTOCOL = http
HTTP_ADDR = {self.host}
HTTP_PORT = {self.port}
ROOT_URL = {self.root_url or self.url}/
APP_DATA_PATH = {f / "data"}
; built without bindata: the templates and options of the release, read in place
STATIC_ROOT_PATH = {static}
DISABLE_SSH = true
START_SSH_SERVER = false
; else its first start rewrites ~/.ssh/authorized_keys, SSH off or not: on the host,
; where two Gitea starting at once race on its .tmp and one exits
SSH_CREATE_AUTHORIZED_KEYS_FILE = false
OFFLINE_MODE = true
LFS_START_SERVER = false

[database]
DB_TYPE = sqlite3
PATH = {f / "data" / "gitea.db"}

[repository]
ROOT = {f / "repositories"}

[repository.signing]
{signing}

[security]
INSTALL_LOCK = true
SECRET_KEY = {secrets.token_hex(32)}
INTERNAL_TOKEN = {secrets.token_hex(32)}
ALLOWED_HOST_LIST = {self.allowed_hosts}

[oauth2]
; on, Gitea would write a JWT secret of its own into this file
ENABLED = false

[webhook]
{webhook}

[migrations]
; the mirror tests' source is a git daemon on loopback, which the default refuses
ALLOW_LOCALNETWORKS = true

[service]
DISABLE_REGISTRATION = true

[indexer]
ISSUE_INDEXER_TYPE = db

[queue]
; in memory: a push is taken in (the repository no longer empty, the webhooks queued)
; within a tenth of a second, where the on-disk queue polls for about a second
TYPE = channel

[actions]
ENABLED = false

[log]
MODE = file
LEVEL = info
ROOT_PATH = {f / "log"}
""",
        )

    def _gitea(self, *args: str) -> str:
        """One ``gitea`` command on this folder's config; its output (never in an error:
        it may be a token)."""
        command = [str(self.binary), *args, f"--config={self.app_ini}"]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=self.folder,
            env=_environment(),
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            said = "\n".join(result.stderr.strip().splitlines()[-5:])
            raise ControlPlaneError(
                f"`gitea {' '.join(args[:3])}` exited {result.returncode}: {said}\n{self.tail()}"
            )
        return result.stdout

    def _version(self) -> str | None:
        try:
            answer = httpx.get(f"{self.url}/api/v1/version", timeout=2)
            return str(answer.json()["version"]) if answer.status_code == 200 else None
        except (httpx.HTTPError, OSError, ValueError, KeyError, TypeError):
            return None

    def tail(self, lines: int = 15) -> str:
        """The end of Gitea's log, and of what its commands wrote before it had one."""
        parts = []
        for log in (self.folder / "log" / "gitea.log", self.folder / "console.log"):
            if log.exists():
                text = log.read_text(errors="replace").splitlines()
                parts.append(f"log {log}:\n" + "\n".join(text[-lines:]))
        return "\n".join(parts) or f"no log in {self.folder}"

    # -- stop -----------------------------------------------------------------------------

    def stop(self) -> None:
        if self.pid:
            controlplane._terminate([self.pid])
        if self.process is not None:
            self.process.wait(timeout=10)
            self.process = None
        self.pid = 0
        if self.state_file.exists():
            self.state_file.unlink()


def _environment() -> dict[str, str]:
    """This process's environment without Gitea's own variables (``GITEA_WORK_DIR``,
    ``GITEA__section__KEY``): a developer's would change the Gitea under test."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GITEA")}


def _base64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def binary() -> Path:
    """The gitea binary, built first if need be."""
    return controlplane.binaries(("gitea",))["gitea"]
