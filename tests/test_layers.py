"""The layout shows the architecture, and imports go one way, lowest layer first:
site model, clients, decisions (and validate), gestures, the manifest authors
(pipelines, eventsources, netpol), render, the CLI. No circle anywhere."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fabrique", "pipelines", "eventsources", "netpol")
# the bench is in no layer, but in no circle either
ACYCLIC = (*PACKAGES, "bench")

# rank of each layer: a module may import only its own rank or lower
LAYERS = [
    ("fabrique.site", 0),
    ("fabrique.clients", 1),
    ("fabrique.decisions", 2),
    ("fabrique.validate", 2),
    ("fabrique.gestures", 3),
    ("pipelines", 4),
    ("eventsources", 4),
    ("netpol", 4),
    ("fabrique.render", 5),
    ("fabrique.cli", 6),
    ("fabrique.__main__", 6),
    ("fabrique", 6),  # the package's public surface re-exports the site model
]


def rank(module: str) -> int:
    for prefix, value in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return value
    raise AssertionError(f"{module}: in no layer")


def modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    out = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, packages: tuple[str, ...] = PACKAGES) -> set[str]:
    """Every project module that ``module`` imports, at the top or inside a function."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports pkg.mod when that is a module
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] in packages}
    return found


def graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    found = modules(packages)
    return {
        module: {dep for dep in imports_of(module, path, packages) if dep in found}
        for module, path in found.items()
    }


GRAPH = graph()


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_go_down_the_layers(module: str) -> None:
    upward = sorted(dep for dep in GRAPH[module] if rank(dep) > rank(module))
    assert not upward, f"{module} imports a higher layer: {upward}"


def test_no_import_cycle() -> None:
    edges = graph(ACYCLIC)
    done: set[str] = set()

    def visit(module: str, stack: list[str]) -> None:
        if module in stack:
            cycle = [*stack[stack.index(module) :], module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for dep in sorted(edges[module]):
            # a package's __init__ is imported by its submodules anyway: not an edge back
            if not module.startswith(dep + "."):
                visit(dep, [*stack, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if not m.endswith("__main__")))
def test_each_module_imports_alone(module: str) -> None:
    importlib.import_module(module)


def test_the_authoring_packages_hold_only_manifests() -> None:
    """pipelines/, eventsources/ and netpol/ author manifests; the tool is fabrique/."""
    for package in ("pipelines", "eventsources", "netpol"):
        for dep in (d for m, deps in GRAPH.items() if m.startswith(package) for d in deps):
            assert dep not in ("fabrique.cli", "fabrique.render"), dep
    assert {m for m in GRAPH if m.startswith("fabrique.") and rank(m) >= 4} == {
        "fabrique.render",
        "fabrique.cli",
        "fabrique.__main__",
    }
