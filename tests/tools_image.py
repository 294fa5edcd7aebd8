"""The tools image, laid out without an image builder: its ``Dockerfile`` read for what
it copies and where, its wheel built from exactly those files, installed in a virtual
environment at ``<root>/usr/local`` as the image's ``pip install`` puts it in
``/usr/local``, with cosign where the Dockerfile copies it (``/usr/local/bin/cosign``).

The wheel's dependencies are not downloaded: the layout reads them from the test's own
environment (a ``.pth`` file), which installs the same requirements.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def stage(name: str) -> list[str]:
    """The instructions of the Dockerfile's stage ``name`` (the last one for ``""``),
    continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            alias = re.search(r"\s+AS\s+(\S+)$", line, re.I)
            stages.append((alias[1] if alias else "", [line]))
        elif stages:
            stages[-1][1].append(line)
    found = [lines for alias, lines in stages if alias == name]
    return found[-1] if found else []


def copies(stage_name: str) -> list[tuple[list[str], str]]:
    """The stage's ``COPY`` instructions from the build context: (sources, destination)."""
    return _context_copies(stage(stage_name))


def context_sources() -> list[str]:
    """What every stage copies from the build context, in the Dockerfile's order."""
    lines = re.sub(r"\\\n", " ", DOCKERFILE.read_text()).splitlines()
    return [source for sources, _ in _context_copies(lines) for source in sources]


def _context_copies(lines: list[str]) -> list[tuple[list[str], str]]:
    found = []
    for line in map(str.strip, lines):
        if not line.upper().startswith("COPY "):
            continue
        words = shlex.split(line)
        if not any(w.startswith("--from") for w in words):
            found.append((words[1:-1], words[-1]))
    return found


def cosign_path() -> str:
    """Where the final stage puts cosign."""
    for line in stage(""):
        words = line.split()
        if words[0].upper() == "COPY" and "--from=cosign" in words:
            return words[-1]
    raise AssertionError("the Dockerfile copies no cosign into the tools image")


def build_wheel(work: Path) -> Path:
    """The wheel stage: its context files copied as it copies them, ``pip wheel`` run
    there (without downloading its build backend: the test's environment has it)."""
    src = work / "src"
    src.mkdir(parents=True)
    for sources, destination in copies("wheel"):
        for source in sources:
            # as COPY does: a folder's contents into the destination, a file into it
            # when it ends with / or as it otherwise
            target = src / destination
            if (ROOT / source).is_dir():
                shutil.copytree(
                    ROOT / source,
                    target,
                    ignore=shutil.ignore_patterns("__pycache__"),
                    dirs_exist_ok=True,
                )
            else:
                if destination.endswith("/"):
                    target.mkdir(parents=True, exist_ok=True)
                    target = target / Path(source).name
                shutil.copy(ROOT / source, target)
    wheels = work / "wheels"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("-q", "--wheel-dir", str(wheels), str(src)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"pip wheel of the Dockerfile's wheel stage failed:\n{done.stderr}")
    (wheel,) = wheels.glob("fabrique-*.whl")
    return wheel


@dataclass(frozen=True)
class Layout:
    root: Path  # stands for the image's /

    @property
    def bin(self) -> Path:
        return self.root / "usr/local/bin"


def install(root: Path, wheel: Path) -> Layout:
    """``pip install`` of the wheel into ``<root>/usr/local``."""
    prefix = root / "usr/local"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    python = prefix / "bin/python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # after the layout's own site-packages: the dependencies, never this checkout's fabrique
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python), "install", "-q"),
            *("--no-deps", "--no-index", str(wheel)),
        ],
        check=True,
        timeout=300,
    )
    return Layout(root)
