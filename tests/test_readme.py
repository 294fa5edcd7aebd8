"""The examples of the README and of the documentation site (``docs/``) run as pasted:
each values example renders and validates, each `fabrique …` line that needs no server
runs, and the tree they draw is the rendered one.

A new example is either run here or classified in NEEDS with what it needs: an example
cannot escape the test by being new."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from fabrique.render import KUSTOMIZATION, render_tree
from fabrique.site.config import Site, load_site

from .conftest import ROOT, run_cli

README = ROOT / "README.md"
# the README and every page of the site, in a stable order
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
DEPLOYED = ROOT / "docs" / "operate" / "deploy.md"  # its tree is the rendered one
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

# What a command line needs that this machine lacks; every other line is run. The key
# is the command (its first words); a value None means "runs here".
NEEDS: dict[str, str | None] = {
    "render": None,
    "validate": None,
    "alerts": None,
    "dashboard": None,
    "vendor --check": None,
    "submit": "Gitea (--head) and the Kubernetes API",
    "vendor --update": "Internet access (the upstream release sites)",
    "vendor mirror": "the pinned images and a registry",
    "seed-webhook": "Gitea",
    "hold": "Gitea",
    "release": "Gitea",
    "status": "Gitea, the registry and the Kubernetes API",
    "rollback": "Gitea and the registry",
    "promote": "Gitea and the environments' clusters",
    "doctor eventbus": "the EventBus (tests/live/test_events.py runs it on the real one)",
}


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int  # where the block starts in its page
    page: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        text = page.read_text("utf-8")
        name = str(page.relative_to(ROOT))
        blocks += [
            Block(m[1], m[2], text[: m.start()].count("\n") + 1, name) for m in FENCE.finditer(text)
        ]
    return blocks


def _command_lines() -> list[tuple[Block, list[str]]]:
    """Every `fabrique …` line of the pages' shell blocks, split as the shell would."""
    lines = []
    for block in _blocks():
        if block.language != "sh":
            continue
        for line in block.text.splitlines():
            if line.startswith("fabrique "):
                lines.append((block, shlex.split(line, comments=True)[1:]))
    return lines


def _command(argv: list[str]) -> str:
    """The command an argv names, global options (--values FILE) skipped."""
    words = list(argv)
    while words and words[0] in ("--values", "-f", "-v", "--verbose"):
        words = words[2:] if words[0] in ("--values", "-f") else words[1:]
    for size in (2, 1):
        key = " ".join(words[:size])
        if key in NEEDS:
            return key
    raise AssertionError(
        f"fabrique {shlex.join(argv)}: not classified; add its command to NEEDS in "
        "tests/test_readme.py (None if it runs without a server)"
    )


def _is_values_example(data: object) -> bool:
    fields = {info.alias or name for name, info in Site.model_fields.items()}
    return isinstance(data, dict) and bool(data) and set(data) <= fields


def _values_examples() -> list[Block]:
    return [
        b for b in _blocks() if b.language == "yaml" and _is_values_example(yaml.safe_load(b.text))
    ]


def _values_example() -> str:
    found = [b.text for b in _values_examples() if b.text.startswith("# site.yaml")]
    assert len(found) == 1, "the pages show one site values example (site.yaml)"
    return found[0]


@pytest.fixture()
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory like the project root: the site.yaml shown and the vendor/ folder."""
    (tmp_path / "site.yaml").write_text(_values_example())
    (tmp_path / "vendor").symlink_to(ROOT / "vendor")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_yaml_example_parses_and_is_known() -> None:
    kinds = []
    for block in _blocks():
        if block.language != "yaml":
            continue
        data = yaml.safe_load(block.text)
        assert isinstance(data, dict), f"{block.where}: a YAML example is a mapping"
        kinds.append("values" if _is_values_example(data) else data.get("kind", "fragment"))
    assert "values" in kinds and "Application" in kinds, kinds


def test_the_site_example_renders_and_validates_as_pasted(workdir: Path) -> None:
    site = load_site(workdir / "site.yaml", env={})
    assert site.images.tools.startswith("registry:80/fabrique-tools:0.1.0@sha256:")
    rendered = run_cli("--values", "site.yaml", "render", "--out", "out")
    assert rendered.exit_code == 0, rendered.stderr
    checked = run_cli("validate", "out")
    assert checked.exit_code == 0, checked.stderr
    shown = run_cli("--values", "site.yaml", "config", "show")
    assert yaml.safe_load(shown.stdout)["images"]["tools"] == site.images.tools


def test_every_other_values_example_renders_and_validates(tmp_path: Path) -> None:
    """The sections' own values fragments (provenance, signing…) work as pasted too."""
    fragments = [b for b in _values_examples() if not b.text.startswith("# site.yaml")]
    assert fragments, "the sections show their switches as values fragments"
    (tmp_path / "vendor").symlink_to(ROOT / "vendor")
    for block in fragments:
        (tmp_path / "fragment.yaml").write_text(block.text)
        out = tmp_path / f"out-{block.line}"
        args = ("--values", str(tmp_path / "fragment.yaml"), "render", "--out", str(out))
        rendered = run_cli(*args)
        assert rendered.exit_code == 0, f"{block.where}: {rendered.stderr}"
        checked = run_cli("validate", str(out))
        assert checked.exit_code == 0, f"{block.where}: {checked.stdout}{checked.stderr}"


def test_the_argo_cd_application_example_lints(workdir: Path) -> None:
    (apps := workdir / "apps").mkdir()
    (block,) = [
        b
        for b in _blocks()
        if b.language == "yaml" and (yaml.safe_load(b.text) or {}).get("kind") == "Application"
    ]
    (apps / "fabrique.yaml").write_text(block.text)
    result = run_cli("lint", "apps", str(apps))
    assert result.exit_code == 0, f"{block.where}: {result.stderr}"


def test_every_command_line_is_run_or_says_what_it_needs(workdir: Path) -> None:
    ran = []
    for block, argv in _command_lines():
        if NEEDS[_command(argv)] is not None:
            continue
        result = run_cli(*argv)
        assert result.exit_code == 0, f"{block.where}: fabrique {shlex.join(argv)}: {result.stderr}"
        ran.append(shlex.join(argv))
    assert "render" in ran and "validate manifests" in ran and "vendor --check" in ran, ran
    assert "--values site.yaml render --out manifests" in ran, ran
    assert (workdir / "manifests" / KUSTOMIZATION).is_file()


def test_no_command_line_is_left_unclassified() -> None:
    lines = _command_lines()
    assert len(lines) >= 8, "the pages' shell examples were found"
    unused = set(NEEDS) - {_command(argv) for _, argv in lines}
    assert not unused, f"NEEDS lists commands no page shows any more: {sorted(unused)}"


def _readme_tree() -> tuple[set[str], set[str]]:
    """The folders and files the "What gets deployed" tree names."""
    text = DEPLOYED.read_text("utf-8")
    section = text[text.index("# What gets deployed") :]
    block = FENCE.search(section)
    assert block is not None and block[2].startswith("manifests/\n")
    folders, files = set(), set()
    folder = ""
    for line in block[2].splitlines()[1:]:
        name = line.split()[0] if line.strip() else ""
        indent = len(line) - len(line.lstrip())
        if name.endswith("/") and indent == 2:
            folder = name
            folders.add(name.rstrip("/"))
        elif name.endswith(".yaml"):
            files.add(name if indent == 2 else folder + name)
    return folders, files


def test_the_readme_tree_is_the_rendered_tree() -> None:
    tree = render_tree(load_site(env={}))
    folders, files = _readme_tree()
    assert folders == {path.split("/")[0] for path in tree if "/" in path}
    rendered = {path for path in tree if not path.endswith(f"/{KUSTOMIZATION}")}
    assert files == rendered
