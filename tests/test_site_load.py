"""Loading the site as the pods do, at the size of the largest site: every push's plan
and every build's containers load it. What render writes for them is JSON, one app a
line, which the loader parses at C speed; anything else (a values file a person writes)
is YAML. The checks count calls, never time: these machines are noisy."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from bench.render import values_with
from fabrique.site import config
from fabrique.site.config import (
    Site,
    _relative_path,
    _UniqueKeyLoader,
    load_site,
    parse_site,
    read_values_file,
)
from fabrique.site.errors import ConfigError, InputError
from fabrique.site.files import site_files

from .test_site_shards import unpack
from .test_startup import _loaded


def as_yaml(text: str) -> Any:
    """``text`` as the loader's YAML reads it (a person's yq, kubectl's reader)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


@pytest.fixture(scope="module")
def thousand() -> Site:
    return parse_site(values_with(1_000))


def test_the_rendered_files_are_json_one_app_a_line(thousand: Site) -> None:
    files = site_files(thousand)
    assert len(files) > 1
    apps: list[Any] = []
    for file in files:
        data = json.loads(file.text)
        # JSON, and the YAML it also is means the same: a person reads it as YAML
        assert as_yaml(file.text) == data
        lines = file.text.splitlines()
        if file.key == "site.yaml":
            assert lines[0] == "{" and lines[-1] == "}"
            first = lines.index('"apps": [') + 1
            ours = data["apps"]
        else:
            assert lines[0] == "[" and lines[-1] == "]"
            first = 1
            ours = data
        # one app a line, as the model has it less what it would take by default
        for line, app in zip(lines[first:], ours, strict=False):
            assert json.loads(line.removesuffix(",")) == app
        assert all(app.keys() >= {"name", "image", "context", "writeback"} for app in ours)
        assert not any("sourceIndex" in app["writeback"] for app in ours)
        apps += ours
    assert [app["name"] for app in apps] == [app.name for app in thousand.apps]


def test_a_rendered_site_loads_without_yaml_for_its_apps(
    thousand: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    construct = _UniqueKeyLoader.construct_mapping

    def counting(self: Any, node: Any, deep: bool = False) -> Any:
        built.append(1)
        return construct(self, node, deep=deep)

    monkeypatch.setattr(_UniqueKeyLoader, "construct_mapping", counting)
    load_site(env={})
    defaults = len(built)  # the embedded defaults' mappings, and those alone
    assert load_site(unpack(thousand, tmp_path), env={}) == thousand
    assert len(built) == 2 * defaults


def test_the_files_read_back_the_same_whatever_their_characters(tmp_path: Path) -> None:
    """Characters a YAML reader takes for a line break (U+0085, U+2028) or refuses raw
    (DEL, C1 controls) are escaped; the rest are written as they are."""
    values = values_with(600)
    odd = "é ✓ 😀 \x85 \u2028 \u2029 \x7f \x9b \ufeff <&> \\ \" '"
    values["apps"][-1]["buildArgs"] = {"NOTE": odd}
    site = parse_site(values)
    for file in site_files(site):
        assert json.loads(file.text) == as_yaml(file.text)
        assert not {"\x85", "\u2028", "\x7f", "\x9b", "\ufeff"} & set(file.text)
    back = load_site(unpack(site, tmp_path), env={})
    assert back.apps[-1].build_args == {"NOTE": odd}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[{"name": "a",\n  "name": "b"}]\n',
            r"^values file \S+/more\.yaml: line 2: duplicate key 'name'$",
        ),
        (
            '[{"name": "a", "name": "b"}]\n',
            r"^values file \S+/more\.yaml: line 1: duplicate key 'name'$",
        ),
    ],
    ids=["lines", "one-line"],
)
def test_a_key_given_twice_in_json_is_refused_by_its_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    (tmp_path / "more.yaml").write_text(text)
    (tmp_path / "site.yaml").write_text('{"appsFrom": [{"file": "more.yaml"}]}\n')
    with pytest.raises(ConfigError, match=expected):
        load_site(tmp_path / "site.yaml", env={})


def test_a_json_file_means_what_its_yaml_means(tmp_path: Path) -> None:
    """JSON is read fast only where it means what the YAML it also is means: a number
    YAML 1.1 reads as a string (1e-05), NaN (no JSON at all) go the YAML way."""
    path = tmp_path / "site.yaml"
    for text in (
        '{"a": 1e-05, "b": 2.5, "c": 1.0e+3, "d": -7, "e": null, "f": true}\n',
        '{"a": NaN, "b": Infinity, "c": "x\\/y"}\n',
        "{a: 1, b: [x, y]}\n",
    ):
        path.write_text(text)
        assert read_values_file(path) == as_yaml(text)


# ------------------------------------------------------------- validation, per app


def _relative_path_by_pathlib(value: str) -> str:
    """What a relative path is, as pathlib says it: the rule the validator keeps."""
    path = PurePosixPath(value)
    if (
        not value
        or "\\" in value
        or path.is_absolute()
        or ".." in path.parts
        or str(path) in (".", "")
        or str(path) != value.rstrip("/")
    ):
        raise ValueError(value)
    return str(path)


@pytest.mark.parametrize(
    "value",
    ["a", "a/", "a//", "a/b", "a/b/", "a//b", "a/./b", "./a", "a/.", ".", "./", "..",
     "a/..", "../a", "a/../b", "/a", "//a", "a\\b", "", "/", "...", "a/.../b", ".a",
     "a..b", " ", "a /b", "dataops/citation-dagster"],
)  # fmt: skip
def test_a_relative_path_is_checked_as_pathlib_would(value: str) -> None:
    try:
        expected: str | None = _relative_path_by_pathlib(value)
    except ValueError:
        expected = None
    try:
        got: str | None = _relative_path(value)
    except ValueError:
        got = None
    assert got == expected


def test_an_app_is_validated_without_a_path_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each app has four paths: made into pathlib objects, they cost 0.8 s of the 1.1 s
    that validating 10 000 apps took."""
    made: list[str] = []

    class Counting(PurePosixPath):
        def __new__(cls, *args: Any) -> Any:
            made.append(str(args))
            return PurePosixPath(*args)

    monkeypatch.setattr(config, "PurePosixPath", Counting)
    site = parse_site(values_with(100))
    assert len(site.apps) == 100
    assert made == []


def test_an_unknown_app_of_a_large_site_names_a_few_known_ones() -> None:
    """One line a person reads: not ten thousand names."""
    site = parse_site(values_with(1_000))
    with pytest.raises(InputError) as caught:
        site.app("nope")
    assert str(caught.value) == (
        "app 'nope': not in the site config (known apps: app-000, app-001, app-002, "
        "app-003, app-004, app-005, app-006, app-007, app-008, app-009 and 990 more)"
    )


def test_the_defaults_are_read_by_libyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every load reads the embedded defaults: with the values files' loader, in C, not
    with PyYAML's Python one (10 ms a load)."""

    def python_loader(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("yaml.safe_load")

    monkeypatch.setattr(yaml, "safe_load", python_loader)
    assert load_site(env={}).apps


# ------------------------------------------------------------- what a pod imports


def test_help_imports_no_http_client() -> None:
    """The site's config names its HTTP timeouts, and makes them only when a command
    asks: httpx (and the rich and pygments its own command line pulls in) is a tenth of
    a second that ``--help``, ``render`` and ``validate`` need not pay."""
    code, modules = _loaded("--help")
    assert code == 0
    assert {m.split(".")[0] for m in modules} & {"httpx", "rich", "pygments"} == set()


@pytest.mark.parametrize(
    ("argv", "exit_code"),
    [
        (["plan", "--out", "out"], InputError.exit_code),
        (["writeback", "--digest", "sha256:" + "0" * 64], InputError.exit_code),
        (["status-report", "pending"], 0),  # a report never fails the build
    ],
    ids=["plan", "writeback", "status"],
)
def test_the_commands_a_pod_runs_import_no_hera_and_no_kubernetes_client(
    thousand: Site, tmp_path: Path, argv: list[str], exit_code: int
) -> None:
    """Every push runs them, each in a pod of its own: they import what they use. The
    app is unknown: each stops once its modules are imported and the site is loaded."""
    values = unpack(thousand, tmp_path)
    command = [*argv, "--app", "nope", "--revision", "a" * 40]
    code, modules = _loaded("--values", str(values), *command)
    assert code == exit_code
    assert {m.split(".")[0] for m in modules} & {"hera", "kubernetes", "pipelines"} == set()
