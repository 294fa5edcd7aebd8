"""Git repositories for tests and benches: a bare repo with a working clone to commit from."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_commit(work: Path, files: dict[str, str], message: str) -> str:
    for relative, content in files.items():
        path = work / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(work),
            "-c",
            "user.name=seed",
            "-c",
            "user.email=seed@example.invalid",
            "commit",
            "-q",
            "-m",
            message,
        ],
        check=True,
    )
    return subprocess.run(
        ["git", "-C", str(work), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


class BareRepo:
    """A bare repository, read with git (another program may be the one writing it:
    Gitea keeps its repositories so, under its ``repositories/``)."""

    def __init__(self, bare: Path) -> None:
        self.bare = bare

    def git(self, *args: str, input_text: str | None = None) -> str:
        return subprocess.run(
            ["git", "-C", str(self.bare), *args],
            capture_output=True,
            text=True,
            check=True,
            input=input_text,
        ).stdout

    def git_ok(self, *args: str) -> bool:
        """Whether a git command (such as ``merge-base --is-ancestor``) exits 0."""
        return (
            subprocess.run(
                ["git", "-C", str(self.bare), *args], capture_output=True, check=False
            ).returncode
            == 0
        )

    def head(self) -> str:
        return self.git("rev-parse", "refs/heads/main").strip()

    def show(self, path: str, ref: str = "main") -> str:
        return self.git("show", f"{ref}:{path}")


class Repo(BareRepo):
    """A bare repository ``<root>/<owner>/<name>.git`` with a working clone to commit from."""

    def __init__(self, root: Path, slug: str, *, object_format: str = "sha1") -> None:
        self.slug = slug
        super().__init__(root / f"{slug}.git")
        self.work = root / "work" / slug
        self.bare.parent.mkdir(parents=True, exist_ok=True)
        init = ["git", "init", "-q", f"--object-format={object_format}", "-b", "main"]
        subprocess.run([*init, "--bare", str(self.bare)], check=True)
        # as Gitea serves every repository (partial clone on, since git 2.22): a filtered
        # fetch is honoured, and a missing object can be fetched by its id
        for key in ("uploadpack.allowFilter", "uploadpack.allowAnySHA1InWant"):
            subprocess.run(["git", "-C", str(self.bare), "config", key, "true"], check=True)
        subprocess.run([*init, str(self.work)], check=True)
        subprocess.run(
            ["git", "-C", str(self.work), "remote", "add", "origin", str(self.bare)], check=True
        )

    def commit(self, files: dict[str, str], message: str = "change") -> str:
        """Commit on top of the server's main (pulled first), push, return the sha."""
        subprocess.run(
            ["git", "-C", str(self.work), "pull", "-q", "--ff-only", "origin", "main"],
            check=False,
            capture_output=True,
        )
        sha = make_commit(self.work, files, message)
        subprocess.run(
            ["git", "-C", str(self.work), "push", "-q", "origin", "HEAD:main"], check=True
        )
        return sha

    def merge(self, ours: dict[str, str], theirs: dict[str, str]) -> str:
        """A merge commit on main: a side branch from main commits ``theirs``, main
        commits ``ours``, then main merges the side (no fast-forward). Pushed; its sha."""
        work = str(self.work)

        def run(*args: str) -> None:
            subprocess.run(["git", "-C", work, *args], check=True, capture_output=True)

        run("pull", "-q", "--ff-only", "origin", "main")
        run("checkout", "-q", "-b", "side")
        make_commit(self.work, theirs, "their side")
        run("checkout", "-q", "main")
        make_commit(self.work, ours, "our side")
        ident = ["-c", "user.name=seed", "-c", "user.email=seed@example.invalid"]
        run(*ident, "merge", "-q", "--no-ff", "--no-edit", "side")
        run("branch", "-q", "-D", "side")
        run("push", "-q", "origin", "HEAD:main")
        return subprocess.run(
            ["git", "-C", work, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
