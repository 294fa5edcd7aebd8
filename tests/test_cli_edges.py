"""The CLI's edges: what it prints beside the happy path, and the reference's table of it
(docs/reference/cli.md)."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml

from fabrique.cli import cli

from .conftest import ROOT, run_cli

REV = "0123456789abcdef0123456789abcdef01234567"


def test_print_argo_carries_the_context_and_the_workflow_labels() -> None:
    args = ["submit", "--app", "citation", "--revision", REV, "--force"]
    workflow = yaml.safe_load(run_cli(*args, "--dry-run").stdout)
    result = run_cli(*args, "--print-argo", "--context", "cluster-prod")
    assert result.exit_code == 0, result.stderr
    words = shlex.split(result.stdout)
    assert words[:4] == ["argo", "submit", "--context", "cluster-prod"]
    flags = dict(zip(words[4::2], words[5::2], strict=True))
    assert flags["-n"] == workflow["metadata"]["namespace"]
    assert flags["--name"] == workflow["metadata"]["name"]
    labels = dict(pair.split("=", 1) for pair in flags["-l"].split(","))
    assert labels == workflow["metadata"]["labels"]
    parameters = [w for i, w in enumerate(words) if i and words[i - 1] == "-p"]
    assert parameters == [
        f"{p['name']}={p['value']}" for p in workflow["spec"]["arguments"]["parameters"]
    ]


def test_print_argo_and_dry_run_do_not_combine() -> None:
    result = run_cli("submit", "--app", "citation", "--revision", REV, "--dry-run", "--print-argo")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: give at most one of --dry-run (the Workflow) or --print-argo (its line)"
    )
    assert result.stdout == ""


def test_hera_with_a_missing_values_file_says_one_line(tmp_path: Path) -> None:
    hera = Path(sys.executable).parent / "hera"
    missing = tmp_path / "site.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIQUE_")}
    result = subprocess.run(
        [str(hera), "generate", "yaml", "pipelines/", "--to", str(tmp_path / "out")],
        cwd=ROOT,
        env={**env, "FABRIQUE_VALUES": str(missing)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: values file {missing}: not found"]


@pytest.fixture()
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_the_rendered_tree_keeps_the_umask_modes(tmp_path: Path, umask_022: None) -> None:
    out = tmp_path / "manifests"
    assert run_cli("render", "--out", str(out)).exit_code == 0
    for path in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))


def test_re_rendering_names_the_files_it_removes(tmp_path: Path) -> None:
    out = tmp_path / "manifests"
    first = run_cli("render", "-o", str(out))
    assert first.exit_code == 0 and first.stderr == ""
    (out / "build" / "by-hand.yaml").write_text("kind: ConfigMap\n")
    (out / "notes.txt").write_text("mine\n")
    again = run_cli("render", "-o", str(out))
    assert again.exit_code == 0, again.stderr
    assert again.stderr.splitlines() == [
        f"notice: removed {out}/build/by-hand.yaml: not part of the rendered tree",
        f"notice: removed {out}/notes.txt: not part of the rendered tree",
    ]
    assert not (out / "build" / "by-hand.yaml").exists()


@pytest.mark.parametrize("command", ["status", "derive-secrets"])
def test_an_unknown_app_is_named_before_the_cluster(tmp_path: Path, command: str) -> None:
    result = run_cli(command, "--app", "nope", env={"KUBECONFIG": str(tmp_path / "none")})
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: app 'nope': not in the site config")


# ------------------------------------------------------------ the reference's table


def _readme_cli_section() -> str:
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    return text[text.index("# The CLI") : text.index("\nExit codes:")]


def _rows() -> list[tuple[str, str]]:
    rows = []
    for line in _readme_cli_section().splitlines():
        if line.startswith("| `fabrique"):
            first, rest = line[2:].split(" | ", 1)
            rows.append((first, rest))
    return rows


def _paths_of(cell: str) -> set[tuple[str, ...]]:
    """The command paths a row's first cell names: ``fabrique status-report pending\\|…``
    names four; a group's options may come before its subcommand."""
    paths: set[tuple[str, ...]] = set()
    for span in re.findall(r"`(fabrique[^`]*)`", cell):
        found: list[tuple[str, ...]] = [()]
        group: click.Command = cli
        for token in span.split()[1:]:
            names = token.replace("\\|", "|").split("|")
            if isinstance(group, click.Group) and all(n in group.commands for n in names):
                found = [(*p, n) for p in found for n in names]
                group = group.commands[names[0]]
            elif not token.startswith(("-", "[")) and not token.isupper():
                break
        paths |= set(found)
    return paths


def _commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def _flags(command: click.Command) -> list[str]:
    return [
        flag
        for param in command.params
        if isinstance(param, click.Option)
        for flag in param.opts + param.secondary_opts
    ]


def _mentions(text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_the_readme_table_lists_every_command_and_flag() -> None:
    rows = _rows()
    missing = []
    for path, command in _commands(cli):
        text = " ".join(first + rest for first, rest in rows if path in _paths_of(first))
        if not text:
            if not isinstance(command, click.Group):
                missing.append(f"fabrique {' '.join(path)}: no row")
            continue
        missing += [
            f"fabrique {' '.join(path)}: {flag}"
            for flag in _flags(command)
            if flag not in ("--help", "-h") and not _mentions(text, flag)
        ]
    top = _readme_cli_section().split("| command |")[0]
    missing += [f"fabrique: {flag}" for flag in _flags(cli) if not _mentions(top, flag)]
    assert missing == [], "the CLI reference's table lacks these"
