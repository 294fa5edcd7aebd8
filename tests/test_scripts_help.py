"""Every script a person may run answers ``--help`` with its usage and does nothing else:
no peer built, no site read, no plane looked for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT
from .peers import build

# the bench's scripts, found by their entry point; the plane's, run as a module
BENCH = sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "bench").rglob("*.py")
    if 'if __name__ == "__main__":' in path.read_text()
)
SCRIPTS = [[path] for path in BENCH] + [["-m", "tests.live.controlplane"]]


def test_the_bench_scripts_are_found() -> None:
    assert "bench/perf.py" in BENCH
    assert "bench/scenarios/gates.py" in BENCH


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s[-1])
def test_help_prints_the_usage_and_exits_0(script: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, *script, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith("usage: "), done.stdout


def _refuse(*_: object, **__: object) -> None:
    raise AssertionError("--help went on to build")


@pytest.mark.parametrize("argv", [["--help"], ["--if-go", "--help"], ["-h", "etcd"]])
def test_the_peers_builder_prints_its_usage_and_builds_nothing(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process, with every way to a build refused: a builder that ignored ``--help``
    would otherwise start building every peer."""
    for name in ("find_go", "build", "Prefetch", "go_version"):
        monkeypatch.setattr(build, name, _refuse)
    with pytest.raises(SystemExit) as exited:
        build.main(argv)
    assert exited.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith("usage: build.py")
    for option in ("--check", "--if-go", "--staging", "PEER"):
        assert option in usage, option
