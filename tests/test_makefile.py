"""The Makefile's targets as a person runs them, with a stand-in Python: what they print
where."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT

# a Python that makes a venv of itself, says something on stdout for every command, and
# for `-m tests.live.controlplane up` what make up prints: one export line
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && cp "$0" "$3/bin/pip"
fi
case "$*" in
  *"tests.live.controlplane up"*) echo "export KUBECONFIG=/plane/kubeconfig" ;;
  *) echo "noise from $(basename "$0") $*" ;;
esac
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_up_prints_only_what_a_shell_may_eval_even_while_it_makes_the_venv(
    tmp_path: Path,
) -> None:
    """`eval "$(make up)"` runs what make up prints: with the venv still to make, make's
    recipe lines and pip's output go to stderr, not into the shell."""
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    venv = tmp_path / "venv"
    up = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "up", f"VENV={venv}", f"PYTHON={python}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert up.returncode == 0, up.stderr
    assert up.stdout == "export KUBECONFIG=/plane/kubeconfig\n"
    assert "-m venv" in up.stderr and "pip install" in up.stderr  # made, and said where
    assert (venv / ".test").exists()
