"""A fresh clone works on its own: nothing beside the checkout, nothing but the wheel.

A user's clone has no folder beside it, so the project must carry every file it reads,
and an installed wheel must carry what ``fabrique validate`` needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT

SPEC_ENV = "FABRIQUE_SPECS"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIQUE_")}
    return env | extra


def _run(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _render_and_validate(out: Path, *, cwd: Path, env: dict[str, str]) -> None:
    rendered = _run(sys.executable, "-m", "fabrique", "render", "--out", str(out), cwd=cwd, env=env)
    assert rendered.returncode == 0, rendered.stderr
    checked = _run(sys.executable, "-m", "fabrique", "validate", str(out), cwd=cwd, env=env)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == f"{out}: valid"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed tree, cloned alone into a directory with nothing beside it."""
    where = tmp_path_factory.mktemp("alone") / "fabrique"
    subprocess.run(
        ["git", "clone", "-q", "--no-local", str(ROOT), str(where)], check=True, timeout=120
    )
    assert list(where.parent.iterdir()) == [where], "the clone stands alone"
    return where


def test_a_fresh_clone_renders_and_validates_with_nothing_beside_it(
    clone: Path, tmp_path: Path
) -> None:
    """The README's render command, run from the clone's own sources."""
    _render_and_validate(tmp_path / "manifests", cwd=clone, env=_env(PYTHONPATH=str(clone)))


def test_specs_env_overrides_and_a_wrong_one_is_named(clone: Path, tmp_path: Path) -> None:
    env = _env(PYTHONPATH=str(clone), **{SPEC_ENV: str(tmp_path / "nope")})
    result = _run(
        sys.executable, "-m", "fabrique", "validate", str(clone / "manifests"), cwd=clone, env=env
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {SPEC_ENV} {tmp_path / 'nope'}: holds no argo-workflows-v4.1.2.schema.json"
    )


def test_the_wheel_alone_can_validate(clone: Path, tmp_path: Path) -> None:
    """``pip install fabrique`` alone: the wheel ships the specs as package data."""
    wheels = tmp_path / "wheels"
    built = _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(wheels),
        str(clone),
        cwd=tmp_path,
        env=_env(),
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("fabrique-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    from fabrique.validate import SPEC_FILES

    assert {f"fabrique/specs/{name}" for name in SPEC_FILES} <= names
    assert "fabrique/site/site.default.yaml" in names
    assert "fabrique/upstream/lock.yaml" in names, "the EventBus's JetStream version"
    # run from the unpacked wheel only: no checkout on the path, the cwd elsewhere
    env = _env(PYTHONPATH=str(tmp_path / "site"))
    probe = _run(
        sys.executable,
        "-c",
        "import fabrique.validate as v; print(v.find_specs())",
        cwd=tmp_path,
        env=env,
    )
    assert probe.stdout.strip() == str((tmp_path / "site" / "fabrique" / "specs").resolve()), (
        probe.stderr
    )
    _render_and_validate(tmp_path / "manifests", cwd=tmp_path, env=env)


def _imported_packages(root: Path) -> dict[str, Path]:
    """Each top-level package outside the standard library that the code under ``root``
    imports, with one file that imports it."""
    import ast

    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names:
                    found.setdefault(top, path)
    return found


def test_every_package_fabrique_imports_is_a_runtime_dependency() -> None:
    """``pip install fabrique`` installs only ``[project] dependencies``: a package that
    only the test extra brings would fail its command on a user's install."""
    import re
    import tomllib
    from importlib.metadata import packages_distributions

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ours = {p.partition(".")[0] for p in pyproject["tool"]["setuptools"]["packages"]}
    declared = {
        canonical(re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0])
        for d in pyproject["project"]["dependencies"]
    }
    distributions = packages_distributions()
    undeclared = {
        f"{package} ({path.relative_to(ROOT)})"
        for top in sorted(ours)
        for package, path in _imported_packages(ROOT / top).items()
        if package not in ours
        and not {canonical(d) for d in distributions.get(package, [package])} & declared
    }
    assert not undeclared, f"imported but not a runtime dependency: {sorted(undeclared)}"
