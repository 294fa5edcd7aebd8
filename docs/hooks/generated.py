"""MkDocs hooks: what the site shows of the code is made from the code at each build.

- ``<!-- fabrique:config-reference -->``: every field of the site config, from the
  model (``fabrique.site.config.Site``): its path, type, default (the embedded default
  site's value, else the model's) and meaning (the field's comment in the model, else
  its comment in ``site.default.yaml``, else its model's docstring). A field with no
  meaning fails the build.
- ``<!-- fabrique:include PATH -->``: a file of the project (the README, bench/'s
  pages), its links into ``docs/`` made the site's own.

The CLI reference is mkdocs-click's, from the click commands themselves.
"""

from __future__ import annotations

import inspect
import os
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
INCLUDE = re.compile(r"<!-- fabrique:include (\S+) -->")
CONFIG = "<!-- fabrique:config-reference -->"


class DocsError(Exception):
    pass


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    here = (DOCS / page.file.src_uri).parent
    markdown = INCLUDE.sub(lambda m: include(m.group(1), here), markdown)
    if CONFIG in markdown:
        markdown = markdown.replace(CONFIG, config_reference())
    return markdown


# ----------------------------------------------------------------------- includes


def include(path: str, here: Path) -> str:
    """The file ``path`` of the project, its relative links made relative to ``here``:
    a link into ``docs/`` becomes the page's, any other one a path shown as code."""
    source = ROOT / path
    text = source.read_text("utf-8")

    def relink(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+:|#", target):
            return match.group(0)
        file, _, anchor = target.partition("#")
        resolved = (source.parent / file).resolve()
        if DOCS in resolved.parents or resolved == DOCS:
            link = os.path.relpath(resolved, here) + (f"#{anchor}" if anchor else "")
            return f"[{label}]({link})"
        return f"{label} (`{resolved.relative_to(ROOT)}`)"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", relink, text).replace(
        "](docs/", "](" + os.path.relpath(DOCS, here) + "/"
    )


# --------------------------------------------------------------- config reference


def config_reference(model: type[BaseModel] | None = None) -> str:
    """The table of every field of ``model`` (the site config's, by default)."""
    from fabrique.site import config

    defaults = yaml.safe_load((ROOT / "fabrique/site/site.default.yaml").read_text())
    comments = _yaml_comments(ROOT / "fabrique/site/site.default.yaml")
    rows = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    missing: list[str] = []
    for key, field, owner in _fields(model or config.Site, ""):
        meaning = (
            field.description
            or _source_comments(owner).get(_name_of(owner, field))
            or comments.get(key.replace("[]", ""))
            or _model_doc(field.annotation)
        )
        if not meaning:
            missing.append(key)
        rows.append(
            f"| `{key}` | {_type(field.annotation)} | {_default(key, field, defaults)} | "
            f"{_cell(meaning or '')} |"
        )
    if missing:
        raise DocsError(f"the config reference has no meaning for: {', '.join(missing)}")
    return "\n".join(rows) + "\n"


def _fields(model: type[BaseModel], prefix: str) -> typing.Iterator[tuple[str, Any, type]]:
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        yield key, field, model
        inner = _models(field.annotation)
        origin = typing.get_origin(_strip(field.annotation))
        for sub in inner:
            if origin is list:
                yield from _fields(sub, key + "[].")
            elif origin is dict:
                yield from _fields(sub, key + ".<name>.")
            else:
                yield from _fields(sub, key + ".")


def _strip(annotation: Any) -> Any:
    """``X`` of ``Annotated[X, …]`` and of ``X | None``."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _strip(args[0])
    return annotation


def _models(annotation: Any) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    stack = [annotation]
    while stack:
        node = stack.pop()
        if isinstance(node, type) and issubclass(node, BaseModel):
            found.append(node)
            continue
        stack += typing.get_args(node)
    return found


def _model_doc(annotation: Any) -> str:
    for model in _models(annotation):
        if model.__doc__ and model.__module__.startswith("fabrique"):
            return " ".join(model.__doc__.strip().split("\n\n")[0].split())
    return ""


def _type(annotation: Any) -> str:
    raw = annotation
    nullable = type(None) in typing.get_args(raw) or (
        typing.get_origin(raw) is typing.Annotated
        and type(None) in typing.get_args(typing.get_args(raw)[0])
    )
    node = _strip(raw)
    origin = typing.get_origin(node)
    if origin is typing.Literal:
        text = " \\| ".join(f"`{value}`" for value in typing.get_args(node))
    elif origin is list:
        text = f"list of {_type(typing.get_args(node)[0])}"
    elif origin is dict:
        text = "map"
    elif isinstance(node, type) and issubclass(node, BaseModel):
        text = "object"
    elif isinstance(node, type):
        text = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            node.__name__, node.__name__
        )
    else:
        text = str(node)
    return text + (", or null" if nullable else "")


def _default(key: str, field: Any, defaults: dict[str, Any]) -> str:
    node: Any = defaults
    for part in key.split("."):
        if "[]" in part or part == "<name>" or not isinstance(node, dict) or part not in node:
            node = _MISSING
            break
        node = node[part]
    if node is not _MISSING and not isinstance(node, dict | list):
        return f"`{yaml.safe_dump(node).splitlines()[0].removesuffix(' ...')}`"
    if node is not _MISSING:
        return "(see the values example)" if node else "none"
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(its fields' defaults)"
    if value in ([], {}, None):
        return "none"
    return f"`{value}`"


_MISSING = object()


def _name_of(model: type, field: Any) -> str:
    for name, candidate in model.model_fields.items():  # type: ignore[attr-defined]
        if candidate is field:
            return name
    return ""


def _source_comments(model: type) -> dict[str, str]:
    """Each field's comment in the model's source: the comment lines right above it,
    then its trailing comment."""
    found: dict[str, str] = {}
    above: list[str] = []
    for line in textwrap.dedent(inspect.getsource(model)).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#") and line.startswith("    #"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"    ([a-z_][a-z0-9_]*)\s*:", line)
        if match:
            trailing = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            text = " ".join([*above, trailing]).strip()
            if text:
                found[match.group(1)] = text
        above = []
    return found


def _yaml_comments(path: Path) -> dict[str, str]:
    """Each key's comment in the default site: the lines above it and its trailing one,
    keyed by its dotted path."""
    found: dict[str, str] = {}
    stack: list[str] = []
    above: list[str] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            above = []  # a comment apart from the key is the file's or a section's
            continue
        if line.strip().startswith("#"):
            above.append(line.strip().lstrip("#").strip())
            continue
        match = re.match(r"(\s*)([A-Za-z_][A-Za-z0-9_]*):(.*)$", line)
        if not match:
            above = []
            continue
        stack = [*stack[: len(match.group(1)) // 2], match.group(2)]
        rest = match.group(3)
        trailing = rest.split(" # ", 1)[1].strip() if " # " in rest else ""
        if not trailing and rest.strip().startswith("#"):
            trailing = rest.strip().lstrip("#").strip()
        text = " ".join([*above, trailing]).strip()
        if text:
            found[".".join(stack)] = text
        above = []
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
