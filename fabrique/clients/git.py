"""A git server, through the git command: fetch, read, commit and push one file.

Works with any server git speaks to (HTTP(S), SSH, ``git://``). Nothing is checked out:
the file is read with ``git show`` and the commit is built with plumbing
(``hash-object``, a private index, ``commit-tree``), so a write costs a shallow,
single-branch fetch of the tip whatever the size of the repository.

Ancestry questions need the commit graph: it is fetched once (commits only, no trees or
blobs, where the server allows a filter), and from then on the repository is never made
shallow again: each later fetch of the tip extends the history instead of cutting it, and
a commit that is not found yet makes the history be fetched again before the answer is
"no such commit".

A token, when given, reaches git through ``GIT_CONFIG_*`` environment variables as an
``Authorization`` header: never on a command line, in a URL, or in a message.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fabrique.site.errors import ConfigError, GitError, StaleWrite
from fabrique.site.names import REVISION_RE, redact_urls
from fabrique.site.retry import RetryPolicy

from .gitea import Commit

SSH_VARIABLES = frozenset({"GIT_SSH_COMMAND", "GIT_SSH", "GIT_SSH_VARIANT"})
log = logging.getLogger("fabrique.git")

# git exits 128 on a fatal error; among those, these messages of git itself, of curl
# (http://, https://) and of ssh mean the server was not reached or dropped the line, so a
# later attempt may pass (exit 75). Anything else (a refused key, a missing repository) is
# not worth a retry.
FATAL_EXIT = 128
TRANSIENT = re.compile(
    # git:// and git's own
    r"unable to connect|connection refused|connection reset|connection timed out|timed out|"
    r"early eof|remote end hung up|could not resolve host|service unavailable|"
    r"the requested url returned error: (?:429|50[0234])|http 50[234]|rpc failed|"
    # curl, as git over http(s) reports it
    r"failed to connect to|couldn't connect to server|could not connect to server|"
    r"couldn't resolve host|empty reply from server|recv failure|send failure|"
    r"ssl connect error|gnutls_handshake\(\) failed|operation too slow|"
    # ssh
    r"ssh: connect to host .*: (?:no route to host|network is unreachable)|"
    r"ssh: could not resolve hostname|kex_exchange_identification",
    re.I,
)
# The same, as a POSIX extended regular expression for `grep -Ei`: the build's checkout
# step is a shell script in the git image, and exits 75 on these too.
TRANSIENT_ERE = TRANSIENT.pattern.replace("(?:", "(")
OBJECT_FORMAT_MISMATCH = re.compile(r"mismatched algorithms: client \w+; server (?P<server>\w+)")
# A push lost to another writer: the branch moved (a lease that no longer holds, a ref
# locked or moved under the server's own update). A `[remote rejected]` for any other
# reason (a pre-receive hook, a protected branch) is the server's answer, not a race.
REJECTED = re.compile(
    r"\[rejected\]|non-fast-forward|fetch first|cannot lock ref|failed to lock|stale info",
    re.I,
)


@dataclass(frozen=True)
class Author:
    name: str
    email: str


class GitRemote:
    """One branch of one remote repository, worked on in a private local directory."""

    def __init__(
        self,
        url: str,
        branch: str,
        workdir: Path,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        signing_key: Path | None = None,
    ) -> None:
        self.url = url
        self.branch = branch
        self.workdir = workdir
        self.signing_key = signing_key  # an SSH private key file: every commit signed
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._env = {
            # git's own variables could point it at another repository or config; only
            # the operator's choice of ssh command passes (the README documents it)
            **{
                k: v
                for k, v in os.environ.items()
                if not k.startswith("GIT_") or k in SSH_VARIABLES
            },
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_NOSYSTEM": "1",
            "LC_ALL": "C",
        }
        if token:
            self._env |= {
                "GIT_CONFIG_COUNT": "1",
                "GIT_CONFIG_KEY_0": "http.extraHeader",
                "GIT_CONFIG_VALUE_0": f"Authorization: token {token}",
            }
        self._history = False
        workdir.mkdir(parents=True, exist_ok=True)
        self._init()

    def _init(self, object_format: str | None = None) -> None:
        """A fresh local repository; SHA-1 unless the server said it is SHA-256."""
        for stale in self.workdir.iterdir():
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        formats = [f"--object-format={object_format}"] if object_format else []
        self._git("init", "-q", "--bare", *formats, ".")
        self._git("remote", "add", "origin", self.url)
        self._history = False

    @property
    def _ref(self) -> str:
        return f"refs/remotes/origin/{self.branch}"

    # -------------------------------------------------------------------- remote

    def fetch_tip(self) -> str:
        """Fetch the branch tip; return its commit id.

        Depth 1 until the history is needed; after that a depth would make the repository
        shallow at the new tip, and every commit in between would be lost to ``resolve``
        and ``is_ancestor``."""
        depth = [] if self._history else ["--depth=1"]
        self._remote(
            "fetch",
            "-q",
            *depth,
            "--no-tags",
            "origin",
            f"+refs/heads/{self.branch}:{self._ref}",
        )
        return self._git("rev-parse", self._ref).strip()

    def remote_head(self) -> str:
        out = self._remote("ls-remote", "origin", f"refs/heads/{self.branch}")
        head = out.split()[0] if out.split() else ""
        if not REVISION_RE.fullmatch(head):
            raise GitError(f"{self._what()}: branch not found on the server")
        return head

    def fetch_history(self, *, again: bool = False) -> None:
        """The branch's whole commit graph, without trees or blobs, for ancestry questions.

        Fetched once; ``again`` fetches what was pushed since (a commit not found yet)."""
        if self._history and not again:
            return
        shallow = (self.workdir / "shallow").exists()
        args = ["fetch", "-q", "--no-tags", "--filter=tree:0"]
        args += ["--unshallow"] if shallow else []
        self._remote(*args, "origin", f"+refs/heads/{self.branch}:{self._ref}")
        self._history = True

    def push(self, commit: str, expected_tip: str, branch: str | None = None) -> None:
        """Move the remote branch (``branch``, or this one) from ``expected_tip`` to
        ``commit``; StaleWrite if it moved. An empty ``expected_tip``: the branch must not
        exist yet."""
        ref = f"refs/heads/{branch or self.branch}"
        try:
            self._remote(
                "push",
                "-q",
                f"--force-with-lease={ref}:{expected_tip}",
                "origin",
                f"{commit}:{ref}",
                retry_transient=False,
            )
        except GitError as exc:
            if REJECTED.search(str(exc)):
                raise StaleWrite(
                    f"{self._what()}: {ref.removeprefix('refs/heads/')} moved since it was read"
                ) from None
            raise

    # --------------------------------------------------------------------- local

    def show(self, commit: str, path: str) -> str | None:
        """The file at ``commit``, or None if it has no such file."""
        listed = self._git("ls-tree", commit, "--", path).strip()
        if not listed:
            return None
        kind = listed.split()[1]
        if kind != "blob":
            raise GitError(f"{self._what()}: {path} is a {kind}, not a file")
        try:
            return self._git("cat-file", "blob", f"{commit}:{path}")
        except UnicodeDecodeError:
            raise GitError(f"{self._what()}: {path} is not UTF-8 text") from None

    def commit_file(self, parent: str, path: str, text: str, message: str, author: Author) -> str:
        """A new commit on ``parent`` in which ``path`` holds ``text``; nothing else changes.
        Signed with the SSH key of ``signing_key`` when there is one."""
        return self.commit_files(parent, {path: text}, message, author)

    def commit_files(
        self, parent: str, files: Mapping[str, str], message: str, author: Author
    ) -> str:
        """A new commit on ``parent`` in which each path of ``files`` holds its text;
        nothing else changes (a file keeps its mode). Signed with the SSH key of
        ``signing_key`` when there is one."""
        index = {"GIT_INDEX_FILE": str(self.workdir / "fabrique.index")}
        self._git("read-tree", parent, extra_env=index)
        for path, text in files.items():
            listed = self._git("ls-tree", parent, "--", path).split()
            mode = listed[0] if listed else "100644"
            blob = self._git("hash-object", "-w", "--stdin", input_text=text).strip()
            self._git(
                "update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}", extra_env=index
            )
        tree = self._git("write-tree", extra_env=index).strip()
        identity = {
            "GIT_AUTHOR_NAME": author.name,
            "GIT_AUTHOR_EMAIL": author.email,
            "GIT_COMMITTER_NAME": author.name,
            "GIT_COMMITTER_EMAIL": author.email,
        }
        sign: list[str] = []
        if self.signing_key is not None:
            sign = ["-S"]
            identity |= _config_env(
                self._env, {"gpg.format": "ssh", "user.signingkey": str(self.signing_key)}
            )
        return self._git(
            "commit-tree", *sign, tree, "-p", parent, "-F", "-",
            input_text=message, extra_env=identity,
        ).strip()  # fmt: skip

    def resolve(self, ref: str) -> str | None:
        """The full id of a commit named by a (short) sha, or None if not in the history
        of the branch as it is on the server now."""
        self.fetch_history()
        for attempt in (1, 2):
            sha = self._commit_id(ref)
            if sha is not None:
                return sha
            if attempt == 1:  # pushed since the history was fetched?
                self.fetch_history(again=True)
        return None

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        self.fetch_history()
        for attempt in (1, 2):
            result = self._run("merge-base", "--is-ancestor", ancestor, descendant)
            if result.returncode in (0, 1):
                return result.returncode == 0
            if attempt == 1:  # a commit not fetched yet
                self.fetch_history(again=True)
        raise GitError(f"{self._what()}: cannot compare {ancestor[:12]} and {descendant[:12]}")

    def files_changed(self, since: str, until: str, path: str) -> list[str]:
        """Files under ``path`` changed by the commits in ``since..until``."""
        self.fetch_history()
        if self._commit_id(since) is None or self._commit_id(until) is None:
            self.fetch_history(again=True)
        out = self._git("log", "--format=", "--name-only", f"{since}..{until}", "--", path)
        return sorted({line for line in out.splitlines() if line.strip()})

    def last_change(self, path: str, ignore: frozenset[str]) -> str | None:
        """The newest commit of the branch changing a file under ``path`` not in ``ignore``."""
        tip = self.fetch_tip()
        self.fetch_history()
        # a merge's files against its first parent, as Gitea lists them (without it git
        # shows none for a merge, and an older commit would be taken for the last change)
        out = self._git(
            "log", "--format=%x00%H", "--name-only", "--diff-merges=first-parent", tip, "--", path
        )
        for block in out.split("\x00")[1:]:
            sha, *names = [line for line in block.splitlines() if line.strip()]
            if any(name not in ignore for name in names):
                return sha
        return None

    def _commit_id(self, ref: str) -> str | None:
        result = self._run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        sha = result.stdout.strip()
        return sha if result.returncode == 0 and REVISION_RE.fullmatch(sha) else None

    def commits_since(self, head: str, since: str, *, limit: int = 1000) -> list[Commit] | None:
        """The commits of ``head`` not in ``since``, newest first, with the files each
        changed; None past ``limit`` commits."""
        self.fetch_history()
        if self._commit_id(head) is None or self._commit_id(since) is None:
            self.fetch_history(again=True)  # the head was read from the server, not fetched
        out = self._git(
            "log",
            "--format=%x00%H %P",
            "--name-only",
            "--no-renames",
            "--diff-merges=first-parent",  # as Gitea lists a merge's files
            f"--max-count={limit + 1}",
            head,
            f"^{since}",
        )
        found = []
        for block in out.split("\x00")[1:]:
            ids, *names = [line for line in block.splitlines() if line.strip()]
            sha, *parents = ids.split()
            found.append(Commit(sha, tuple(parents), tuple(names)))
        return None if len(found) > limit else found

    # ------------------------------------------------------------------- running

    def _what(self) -> str:
        return f"git {redact_urls(self.url)} branch {self.branch!r}"

    def _remote(self, *args: str, retry_transient: bool = True) -> str:
        try:
            return self._remote_attempts(*args, retry_transient=retry_transient)
        except GitError as exc:
            mismatch = OBJECT_FORMAT_MISMATCH.search(str(exc))
            if not mismatch:
                raise
        # a SHA-256 server: the local repository must be one too (the first fetch says)
        self._init(mismatch["server"])
        return self._remote_attempts(*args, retry_transient=retry_transient)

    def _remote_attempts(self, *args: str, retry_transient: bool) -> str:
        attempts = self.retry.attempts if retry_transient else 1
        for attempt in range(1, attempts + 1):
            try:
                return self._git(*args, timeout=self.timeout)
            except GitError as exc:
                if not exc.transient or attempt == attempts:
                    raise
                delay = self.retry.delay(attempt)
                log.warning("%s: %s; retry %d in %.1fs", self._what(), exc, attempt, delay)
                self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _run(
        self,
        *args: str,
        input_text: str | None = None,
        extra_env: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["git", "-C", str(self.workdir), *args],
                input=input_text,
                capture_output=True,
                text=True,
                env=self._env | (extra_env or {}),
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise GitError(
                f"{self._what()}: git {args[0]} timed out after {timeout:.0f}s", transient=True
            ) from None
        except FileNotFoundError:
            raise GitError("git is not installed") from None

    def _git(self, *args: str, **kwargs: object) -> str:
        result = self._run(*args, **kwargs)  # type: ignore[arg-type]
        if result.returncode != 0:
            detail = first_error(result.stderr) or f"exit {result.returncode}"
            if args[0] == "push":
                lines = [line.strip() for line in result.stderr.splitlines()]
                raced = [line for line in lines if REJECTED.search(line)]
                # a decline: the server's own words (a hook's output), then git's line
                said = [line for line in lines if line.startswith("remote:") and line[7:].strip()]
                declined = [line for line in lines if "[remote rejected]" in line]
                if raced:
                    detail = raced[0]
                elif declined:
                    detail = "; ".join([*(line[7:].strip() for line in said[:3]), declined[0]])
            raise GitError(
                # git quotes the remote URL in its errors ("unable to access '…'")
                f"{self._what()}: git {args[0]} failed: {redact_urls(detail)}",
                transient=is_transient(result.returncode, result.stderr),
            )
        return result.stdout


def _config_env(env: dict[str, str], settings: dict[str, str]) -> dict[str, str]:
    """``settings`` as git configuration variables, after those ``env`` already holds."""
    first = int(env.get("GIT_CONFIG_COUNT", "0"))
    found = {"GIT_CONFIG_COUNT": str(first + len(settings))}
    for index, (key, value) in enumerate(settings.items(), start=first):
        found |= {f"GIT_CONFIG_KEY_{index}": key, f"GIT_CONFIG_VALUE_{index}": value}
    return found


SIGNING_KEY_ENV = "FABRIQUE_WRITEBACK_SIGNING_KEY"


def ssh_signing_key(source: str | None, folder: Path) -> Path:
    """A private copy (0600, as ssh-keygen wants it) of the SSH private key at ``source``
    (``$FABRIQUE_WRITEBACK_SIGNING_KEY``), checked to be one that signs without a
    passphrase; a ConfigError naming what is wrong, never the key."""
    if not source:
        raise ConfigError(
            f"writeback.signing: {SIGNING_KEY_ENV} is not set: every write-back commit must "
            "be signed; set it to the SSH private key's file (the Secret's, mounted)"
        )
    try:
        key = Path(source).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{SIGNING_KEY_ENV} {source}: {exc.strerror}") from None
    copy = folder / "signing-key"
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key)
    try:
        checked = subprocess.run(
            ["ssh-keygen", "-y", "-P", "", "-f", str(copy)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except FileNotFoundError:
        raise ConfigError(
            "writeback.signing: ssh-keygen is not installed (openssh-client): git signs with it"
        ) from None
    if checked.returncode != 0:
        raise ConfigError(
            f"{SIGNING_KEY_ENV} {source}: not an SSH private key that signs without a "
            "passphrase (ssh-keygen -y refused it)"
        )
    return copy


def is_transient(returncode: int, stderr: str) -> bool:
    """A failure worth a later attempt: killed by a signal, or git's fatal exit with a
    message that says the server was not reached or dropped the line."""
    return returncode < 0 or (returncode == FATAL_EXIT and bool(TRANSIENT.search(stderr)))


_NOISE = ("warning:", "hint:")


def first_error(stderr: str) -> str:
    """git's first error message, whole: its first line and the lines that continue it.

    ssh prints the cause first (``ssh: connect to host … Connection refused``) and git
    its generic ``fatal: Could not read from remote repository.`` after it; git://
    splits one message over two lines (``fatal: unable to connect to h:`` then
    ``h[0: …]: errno=Connection refused``).
    """
    message: list[str] = []
    for raw in stderr.splitlines():
        line = raw.strip()
        if not message:
            if line and not line.lower().startswith(_NOISE):
                message.append(line)
            continue
        if not line or re.match(r"(fatal|error|warning|hint|remote|ssh):", line, re.I):
            break
        message.append(line)
    return " ".join(message)
