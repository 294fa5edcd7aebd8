"""The build step's time, cold and from the registry cache, with the real BuildKit.

The build step's rendered script runs as the live tests run it (``tests/live/buildkit.py``:
the release's ``buildctl-daemonless.sh``, rootless where a user with subordinate ids
exists), each build with empty BuildKit state as a new build pod has. One app whose
Dockerfile's RUN does some work (it compresses 64 MiB), built three times at one commit:

- ``cold``: nothing in the registry cache (the first build of a Dockerfile);
- ``cached``: the same commit again, ``build.cache`` on: the steps come from
  ``<image>:buildcache`` (``CACHED`` in buildctl's progress);
- ``uncached``: the same again with ``build.cache`` off: every step runs.

Each time is the whole step (buildkitd's start and stop included) and the steps buildctl
reports ``CACHED``. Needs Go (the peers), ``docker-registry`` and ``busybox``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabrique.decisions.plan import make_plan  # noqa: E402
from fabrique.site.config import load_site  # noqa: E402
from pipelines.build import BUILD_INPUTS  # noqa: E402
from tests import servers  # noqa: E402
from tests.conftest import write_values  # noqa: E402
from tests.live.buildkit import Builder, builder  # noqa: E402
from tests.oci import push_image  # noqa: E402

APP_DIR = "dataops/citation-dagster"
REVISION = "5e1f" * 10


def _workspace(bench: Builder, base: str, nonce: str) -> Path:
    """The checkout the build step finds: the app's context under ``src/``."""
    workspace = bench.folder("workspace")
    app = workspace / "src" / APP_DIR
    app.mkdir(parents=True)
    (app / "Dockerfile").write_text(
        f"FROM {base}\n"
        f"RUN echo {nonce} > /nonce && busybox dd if=/dev/urandom of=/data bs=1M count=64 "
        "2>/dev/null && busybox gzip -9 /data\n"
        "COPY app.txt /app.txt\n"
    )
    (app / "app.txt").write_text(f"citation {nonce}\n")
    for path in (workspace / "src", workspace / "src" / "dataops", app):
        path.chmod(0o755)
    return workspace


def _time(bench: Builder, values: Path, workspace: Path) -> tuple[float, int]:
    site = load_site(values, env={})
    plan = make_plan(site, "citation", REVISION)
    inputs = {name: plan.outputs()[name] for name in BUILD_INPUTS}  # as the plan hands them
    started = time.monotonic()
    build = bench.run(site, REVISION, inputs, workspace)
    seconds = time.monotonic() - started
    if build.returncode != 0:
        raise SystemExit(f"the build failed (exit {build.returncode}):\n{build.output}")
    return seconds, build.output.count(" CACHED\n")


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    name = socket.gethostname()
    with (
        tempfile.TemporaryDirectory() as tmp,
        servers.registry(Path(tmp), name) as registry,
        builder() as bench,
    ):
        busybox = Path(servers.require_binary("busybox")).read_bytes()
        push_image(
            registry.url,
            "base/busybox",
            "1",
            {"bin/busybox": busybox, "bin/sh": busybox},
            executables=frozenset({"bin/busybox", "bin/sh"}),
        )
        base = f"{registry.host}/base/busybox:1"
        settings = {"registry.host": registry.host, "registry.plainHttp": True}
        cached = write_values(Path(tmp) / "cached.yaml", **settings)
        uncached = write_values(Path(tmp) / "uncached.yaml", **settings, **{"build.cache": False})
        workspace = _workspace(bench, base, str(time.time_ns()))
        print(f"BuildKit: {bench.mode}")
        print("| build | wall (s) | steps CACHED |\n| --- | ---: | ---: |")
        for label, values in (("cold", cached), ("cached", cached), ("uncached", uncached)):
            seconds, hits = _time(bench, values, workspace)
            print(f"| {label} | {seconds:.1f} | {hits} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
