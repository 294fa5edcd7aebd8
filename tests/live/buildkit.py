"""BuildKit for real: the build step's rendered script, run with the real
``buildctl-daemonless.sh`` of the BuildKit release the step's image carries, its
buildkitd and buildctl, and RootlessKit (``tests/peers/buildkit``, ``rootlesskit``).

The script starts buildkitd for each build and stops it after, as in the pod; its state
is a fresh folder each time, as the pod's emptyDir is, so a second build finds nothing
but what the registry cache holds. buildkitd reads the rendered ``buildkitd.toml`` where
the pod mounts it: ``$HOME/.config/buildkit``.

Rootless, as the step runs it (``rootlesskit buildkitd --oci-worker-no-process-sandbox``),
as an unprivileged user with subordinate ids for newuidmap: the current user, or, when
the tests run as root, ``BUILD_USER`` (``make system-deps`` makes it). Where there is no
such user, buildkitd runs as root with the OCI worker (runc) instead; ``Builder.mode``
says which.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fabrique.site.config import Site
from pipelines.build import BUILDKIT_CONFIG_DIR, buildkitd_toml

from ..manifests import rendered_step, step_env
from . import controlplane

BUILD_USER = "fabrique-builder"
DAEMONLESS = "examples/buildctl-daemonless/buildctl-daemonless.sh"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# As root the script's daemon keeps /var/lib/buildkit and reads /etc/buildkit: this
# stand-in for buildkitd (the script's $BUILDKITD) keeps its state and config with the
# test. The step's --oci-worker-no-process-sandbox is for rootless only (buildkitd refuses
# it as root: "can't enable NoProcessSandbox without Rootless"): as root it is left out.
ROOT_BUILDKITD = """#!/bin/sh
for arg in "$@"; do
  shift
  [ "$arg" = --oci-worker-no-process-sandbox ] || set -- "$@" "$arg"
done
exec buildkitd --config "$HOME/.config/buildkit/buildkitd.toml" --root "$HOME/state" "$@"
"""


def _has_subids(user: pwd.struct_passwd) -> bool:
    """Whether /etc/subuid and /etc/subgid give ``user`` a range (by name or by uid)."""
    for table in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = Path(table).read_text().splitlines()
        except OSError:
            return False
        owners = {line.split(":", 1)[0] for line in lines if line.count(":") == 2}
        if not owners & {user.pw_name, str(user.pw_uid)}:
            return False
    return True


def rootless_user() -> pwd.struct_passwd | None:
    """Who runs BuildKit rootless here, or None: root runs it."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        if not _has_subids(me):
            raise RuntimeError(
                f"rootless BuildKit needs subordinate ids for {me.pw_name} in /etc/subuid "
                "and /etc/subgid (newuidmap maps them); without root there is no other way"
            )
        return me
    try:
        user = pwd.getpwnam(BUILD_USER)
    except KeyError:
        return None
    return user if _has_subids(user) else None


# what the stage's script says before it tries again (pipelines.build.RETRYING)
TRYING_AGAIN = re.compile(r"^build: trying again in \d+s \(retry \d+ of \d+\)$", re.M)


@dataclass(frozen=True)
class Build:
    """One run of the build container's script, every attempt of it."""

    returncode: int
    output: str  # its stdout and stderr: buildctl's plain progress, the script's lines
    metadata: Path  # buildctl --metadata-file

    @property
    def retries(self) -> int:
        """How many times the script tried again after an attempt that exited 75."""
        return len(TRYING_AGAIN.findall(self.output))


@dataclass
class Builder:
    bin: Path  # the peers' binaries and the release's buildctl-daemonless.sh
    user: pwd.struct_passwd | None
    scratch: Path  # every folder the builder reads or writes lives here

    @property
    def mode(self) -> str:
        if self.user is None:
            return "root, OCI worker (runc)"
        return f"rootless as {self.user.pw_name} (RootlessKit, newuidmap, runc)"

    def folder(self, name: str) -> Path:
        """A new folder the builder owns."""
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.scratch))
        self._own(path)
        return path

    def _own(self, path: Path) -> None:
        if self.user is not None and os.geteuid() == 0:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def run(
        self,
        site: Site,
        revision: str,
        inputs: dict[str, str],
        workspace: Path,
        *,
        retry: bool = True,
    ) -> Build:
        """The build container's command, as Argo's executor runs it, with its
        environment: the script tries an attempt that exits 75 again itself,
        ``build.retries`` times at most (none when not ``retry``), at once here."""
        container = rendered_step(site, "build")
        out = self.folder("out")
        env = (
            step_env(container, revision, inputs, plan=self.folder("plan"))
            | self.environment(buildkitd_toml(site))
            | {"WORKSPACE": str(workspace), "METADATA_FILE": str(out / "build-metadata.json")}
            | ({} if retry else {"RETRIES": "0"})
        )
        done = subprocess.run(
            self.command(list(container["command"])),
            env=env,
            cwd=env["HOME"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=600,
            check=False,
        )
        return Build(done.returncode, done.stdout, out / "build-metadata.json")

    def environment(self, buildkitd_toml: str) -> dict[str, str]:
        """What ``buildctl-daemonless.sh`` runs with: a fresh home holding
        ``buildkitd.toml`` where the pod mounts it, a fresh runtime folder, the peers'
        binaries first on PATH, and as root (no build user) ``buildkitd-root`` for its
        daemon."""
        home = self.folder("home")  # the pod's /home/user, with the ConfigMap mounted
        config = home / BUILDKIT_CONFIG_DIR.removeprefix("/home/user/")
        config.mkdir(parents=True)
        (config / "buildkitd.toml").write_text(buildkitd_toml)
        for path in (home / ".config", config, config / "buildkitd.toml"):
            self._own(path)
        env = {
            "PATH": f"{self.bin}:{SYSTEM_PATH}",
            "HOME": str(home),
            "USER": self.user.pw_name if self.user else "root",
            "XDG_RUNTIME_DIR": str(self.folder("run")),
        }
        if self.user is None:
            env["BUILDKITD"] = str(self.bin / "buildkitd-root")
        return env

    def command(self, command: list[str]) -> list[str]:
        """``command`` as the build user runs it (through setpriv when the tests are root)."""
        if self.user is not None and os.geteuid() == 0:
            uid, gid = str(self.user.pw_uid), str(self.user.pw_gid)
            return ["setpriv", "--reuid", uid, "--regid", gid, "--clear-groups", *command]
        return command

    def buildctl(
        self, context: Path, registry: str, options: list[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """``buildctl-daemonless.sh build`` of the Dockerfile of ``context``, with
        ``options`` after it (outputs, caches, build args), ``registry:80`` mirrored to
        ``registry`` over plain HTTP, as the node's containerd has it; its stdout and
        stderr together."""
        toml = (
            f'[registry."registry:80"]\n  mirrors = ["{registry}"]\n'
            f'[registry."{registry}"]\n  http = true\n'
        )
        env = self.environment(toml) | {"BUILDKITD_FLAGS": "--oci-worker-no-process-sandbox"}
        command = [
            *("buildctl-daemonless.sh", "build", "--frontend", "dockerfile.v0"),
            *("--local", f"context={context}", "--local", f"dockerfile={context}"),
            *options,
        ]
        return subprocess.run(
            self.command(command),
            env=env,
            cwd=env["HOME"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )


@contextmanager
def builder() -> Iterator[Builder]:
    """The peers' BuildKit, ready to run the build step's script; its scratch folder is
    removed after."""
    found = controlplane.binaries(("buildkit", "rootlesskit"))
    version = controlplane.peers.Peer(
        "buildkit", controlplane.ROOT / "tests/peers/buildkit"
    ).required("github.com/moby/buildkit")
    script = controlplane.module_dir("github.com/moby/buildkit", version) / DAEMONLESS
    user = rootless_user()
    # under /tmp, readable by the build user: the tests' own folders are root's alone
    scratch = Path(tempfile.mkdtemp(prefix="fabrique-buildkit-"))
    scratch.chmod(0o755)
    try:
        bin_dir = scratch / "bin"
        bin_dir.mkdir()
        for name in ("buildkitd", "buildctl", "rootlesskit"):
            shutil.copy(found[name], bin_dir / name)
        shutil.copy(script, bin_dir / "buildctl-daemonless.sh")
        (bin_dir / "buildkitd-root").write_text(ROOT_BUILDKITD)
        for path in bin_dir.iterdir():
            path.chmod(0o755)
        yield Builder(bin_dir, user, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
