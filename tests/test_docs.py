"""The documentation site, built as ``make docs`` builds it: ``mkdocs build --strict``
fails on a broken link or anchor, a page outside the nav, or a field of the site config
without a meaning (``docs/hooks/generated.py``); the README stays the short front door."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from fabrique.cli import cli

from .conftest import ROOT

README_MAX_LINES = 150
DOCS = ROOT / "docs"


def _mkdocs(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(str(Path(sys.executable).parent / "mkdocs"), "build", "--strict"),
            *("--site-dir", str(site), *args),
        ],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = tmp_path_factory.mktemp("site")
    done = _mkdocs(built)
    assert done.returncode == 0, done.stdout + done.stderr
    return built


def _text(page: Path) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text())).split())


def test_the_readme_is_a_short_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_every_page_of_docs_is_in_the_nav() -> None:
    """mkdocs warns of a page outside the nav (strict fails); this says which."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        if isinstance(node, dict):
            return [p for value in node.values() for p in pages(value)]
        return []

    listed = set(pages(config["nav"]))
    found = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "hooks" not in p.parts}
    assert found == listed


def test_the_cli_reference_names_every_command_and_option(site: Path) -> None:
    text = _text(site / "reference" / "cli" / "index.html")
    for name, command in cli.commands.items():
        assert f"fabrique {name}" in text, name
        for param in command.params:
            for option in getattr(param, "opts", []):
                if option.startswith("--"):
                    assert option in text, f"fabrique {name} {option}"


def test_the_config_reference_lists_every_field_with_its_meaning(site: Path) -> None:
    text = _text(site / "reference" / "config" / "index.html")
    for field in (
        "gitea.codeRepo",
        "writeback.pullRequest.autoMerge",
        "apps[].environments[].promote",
        "netpol.widestPrefix.ipv4",
        "targets.<name>.inCluster",
    ):
        assert field in text, field
    assert "pull-request: through a pull request" in text


def test_a_field_without_a_meaning_fails_the_build() -> None:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks" / "generated.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)

    class Bare(BaseModel):
        documented: int  # what it means
        undocumented: int

    with pytest.raises(hooks.DocsError, match=r"no meaning for: undocumented$"):
        hooks.config_reference(Bare)


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    """The project's validation settings make a link to an anchor no page has an error."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](other.md#nowhere)\n")
    (docs / "other.md").write_text("# Other\n")
    ours = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "site_name": "t",
                "docs_dir": "docs",
                "validation": ours["validation"],  # the project's own strictness
                "nav": ["index.md", "other.md"],
            }
        )
    )
    done = _mkdocs(tmp_path / "site", "--config-file", str(config))
    assert done.returncode != 0 and "nowhere" in done.stdout + done.stderr
