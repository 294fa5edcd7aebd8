"""`fabrique render` and `fabrique validate` against the apps, as a person runs them.

    python bench/render_cli.py [--apps 10,1000,10000] [--before REV] [--before-apps 10,1000]
                               [--repeat 3]

For each catalogue size it writes a values file of that many apps (``bench/render.py``'s
``values_with``, its apps alone: each commit reads its own defaults), then runs
``fabrique --values FILE render --out TREE`` and ``fabrique validate TREE``, each a
process of its own timed from its start to its exit, ``--repeat`` times (the median
shown; a first run of each commit, which writes its bytecode, is not counted):
the interpreter's start-up and imports are in, and so is validate's ``kubectl
kustomize`` when kubectl is on ``PATH`` (the first line says). With ``--before REV``
the CLI of that commit (its files, from ``git archive``, run as ``python -m fabrique``
from their folder) renders and validates the same values in the same run, at
``--before-apps`` (default: ``--apps``). A run that outlasts ``--timeout`` is stopped
and said. Prints a Markdown table: each size, each commit, side by side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.render import values_with

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Checkout:
    """A folder of fabrique's files and the commit it is."""

    label: str
    folder: Path

    def run(self, args: list[str], timeout: float) -> tuple[float | None, str]:
        """``python -m fabrique ARGS`` of this checkout: its wall time (None if stopped
        at ``timeout``) and what it said last (its verdict)."""
        # ``python -m`` puts the working folder first on sys.path: run from the checkout
        env = {**os.environ, "PYTHONPATH": _path(self.folder)}
        start = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "fabrique", *args],
                cwd=self.folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None, f"did not finish in {timeout:.0f} s"
        wall = time.perf_counter() - start
        said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        told = done.stdout.strip().splitlines()
        # "rendered 29 files into TREE", "TREE: valid": the verdict without the folder
        last = told[-1].rsplit(": ", 1)[-1] if told else ""
        if done.returncode:
            problems = sum(": document " in line for line in said)
            last = f"{problems} problems" if problems else (said[0] if said else "")
        return wall, f"exit {done.returncode}: {last[:80]}"

    def module(self) -> Path:
        """Where this checkout's ``python -m fabrique`` takes fabrique from."""
        done = subprocess.run(
            [sys.executable, "-c", "import fabrique; print(fabrique.__file__)"],
            cwd=self.folder,
            env={**os.environ, "PYTHONPATH": _path(self.folder)},
            capture_output=True,
            text=True,
            check=True,
        )
        return Path(done.stdout.strip()).resolve()


def _path(folder: Path) -> str:
    """``folder`` first, then whatever PYTHONPATH the bench was given."""
    given = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(folder), *([given] if given else [])])


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def this_checkout() -> Checkout:
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return Checkout(_git("rev-parse", "--short", "HEAD") + (" (+ changes)" if dirty else ""), ROOT)


def archived(revision: str, into: Path) -> Checkout:
    """The files of ``revision`` in ``into``: the CLI as that commit had it."""
    commit = _git("rev-parse", "--short", f"{revision}^{{commit}}")
    archive = into / "before.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", commit], cwd=ROOT, stdout=out, check=True)
    folder = into / f"fabrique-{commit}"
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    checkout = Checkout(f"{commit} (before)", folder)
    if not checkout.module().is_relative_to(folder.resolve()):
        raise SystemExit(f"{revision}: python -m fabrique does not take fabrique from {folder}")
    return checkout


@dataclass(frozen=True)
class Row:
    apps: int
    commit: str
    render: float | None
    validate: float | None
    verdict: str

    def cells(self) -> list[str]:
        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        both = None if self.render is None or self.validate is None else self.render + self.validate
        return [
            f"{self.apps:,}".replace(",", " "),
            self.commit,
            seconds(self.render),
            seconds(self.validate),
            seconds(both),
            self.verdict,
        ]


def measure(checkout: Checkout, apps: int, work: Path, timeout: float, repeat: int = 1) -> Row:
    """The median of ``repeat`` renders and validates of ``apps`` apps by ``checkout``."""
    rows = [_once(checkout, apps, work, timeout) for _ in range(repeat)]
    renders = [r.render for r in rows if r.render is not None]
    validates = [r.validate for r in rows if r.validate is not None]
    if len(renders) < repeat or len(validates) < repeat:
        return next(r for r in rows if r.render is None or r.validate is None)
    return Row(
        apps, checkout.label, statistics.median(renders), statistics.median(validates),
        rows[-1].verdict,
    )  # fmt: skip


def _once(checkout: Checkout, apps: int, work: Path, timeout: float) -> Row:
    values = work / f"values-{apps}.yaml"
    if not values.exists():
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        # the apps alone, the rest the defaults of whichever commit reads it: a setting
        # added since the commit before would be an unknown field there
        values.write_text(yaml.dump({"apps": values_with(apps)["apps"]}, Dumper=dumper))
    tree = work / f"tree-{apps}-{checkout.folder.name}"
    render, said = checkout.run(["--values", str(values), "render", "--out", str(tree)], timeout)
    if render is None or not said.startswith("exit 0"):
        return Row(apps, checkout.label, render, None, f"render: {said}")
    validate, verdict = checkout.run(["validate", str(tree)], timeout)
    shutil.rmtree(tree, ignore_errors=True)
    return Row(apps, checkout.label, render, validate, verdict)


def table(rows: list[Row]) -> str:
    header = ["apps", "commit", "render (s)", "validate (s)", "both (s)", "validate says"]
    lines = [header, ["---"] * len(header), *(row.cells() for row in rows)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", default="10,1000,10000")
    parser.add_argument("--before", metavar="REV", help="also measure this commit's CLI")
    parser.add_argument("--before-apps", help="the sizes for --before (default: --apps)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds, each process")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each cell, its median shown (default 3)"
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.apps.split(",")]
    before_sizes = [int(n) for n in (args.before_apps or args.apps).split(",")]
    kubectl = shutil.which("kubectl")
    print(
        f"validate's `kubectl kustomize`: {'in, ' + kubectl if kubectl else 'skipped (no kubectl)'}"
    )
    with tempfile.TemporaryDirectory(prefix="render-cli-") as temporary:
        work = Path(temporary)
        checkouts = [(this_checkout(), sizes)]
        if args.before:
            checkouts.append((archived(args.before, work), before_sizes))
        # a first run of each checkout writes its bytecode: not counted
        for checkout, _ in checkouts:
            _once(checkout, 10, work, args.timeout)
        rows = [
            measure(checkout, apps, work, args.timeout, args.repeat)
            for apps in sorted({*sizes, *before_sizes})
            for checkout, wanted in checkouts
            if apps in wanted
        ]
    print(table(rows))


if __name__ == "__main__":
    main()
