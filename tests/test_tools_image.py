"""The tools image's Dockerfile builds what the steps run (``tools_image.py``): its wheel
from exactly the files it copies, installed where its ``pip install`` puts it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .oci import push_image
from .servers import Registry
from .tools_image import build_wheel, copies, cosign_path, install

REV = "3f5e2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f"


def test_the_wheel_stage_copies_what_the_package_is_built_from() -> None:
    copied = {source for sources, _ in copies("wheel") for source in sources}
    # pyproject.toml's package-dir: fabrique.specs and fabrique.upstream live in vendor/
    assert {"pyproject.toml", "README.md", "fabrique", "pipelines", "vendor"} <= copied


def test_cosign_is_where_the_steps_find_it() -> None:
    """fabrique sign runs `cosign` from PATH: /usr/local/bin is on the image's PATH."""
    assert cosign_path() == "/usr/local/bin/cosign"


def test_the_steps_run_from_the_wheel_the_dockerfile_builds(
    tmp_path: Path, registry: Registry
) -> None:
    layout = install(tmp_path / "image", build_wheel(tmp_path / "build"))
    fabrique = str(layout.bin / "fabrique")
    values = tmp_path / "site.yaml"
    values.write_text(f"registry:\n  host: {registry.host}\n  plainHttp: true\n")
    digest = push_image(registry.url, "citation-dagster", REV[:12])
    metadata = tmp_path / "metadata.json"
    metadata.write_text(json.dumps({"containerimage.digest": digest}))
    # what the verify-digest step runs, from the installed wheel alone (the image's HOME)
    done = subprocess.run(
        [
            *(fabrique, "digest", "verify", "--app", "citation"),
            *("--revision", REV, "--metadata", str(metadata)),
        ],
        env={"FABRIQUE_VALUES": str(values), "HOME": str(tmp_path), "PATH": str(layout.bin)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == digest
    # the packaged data: the specs `validate` reads and the lock `render` reads
    validated = subprocess.run(
        [fabrique, "render", "--out", str(tmp_path / "out")],
        env={"HOME": str(tmp_path), "PATH": str(layout.bin)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert validated.returncode == 0, validated.stderr
    checked = subprocess.run(
        [fabrique, "validate", str(tmp_path / "out")],
        env={"HOME": str(tmp_path), "PATH": str(layout.bin)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
