"""What Argo Events' Sensor does with an event, for the parts fabrique uses. Not Argo Events.

- Data filters: the value at a gjson-like ``path`` of the event (``header.X-Gitea-Event.0``,
  ``body.ref``), a string, must match one of the filter's values as an **unanchored**
  regex (Go's ``regexp.MatchString``), which is why fabrique anchors every one. Go's ``$``
  is the end of the text (Python's ``\\Z``), not "before a final newline". Filters are
  ANDed (``dataLogicalOperator: and``); a missing path fails the filter.
- Expressions (``exprs``): each field is read at its gjson path (the forms fabrique
  writes: a dotted path, ``#`` for a list's length, ``#.key`` over a list, a
  ``[a,b,c]`` multipath, ``@flatten:{"deep":true}``, the queries ``#(%"glob")#`` and
  ``#(!="text")#`` on a list of strings, a final ``|#``), then the expression is
  evaluated as govaluate does the ones fabrique writes: comparisons (``>``, ``==``,
  ``!=``, ``=~``) joined by ``||``. A missing path fails that expression (an error in
  Argo Events); ``exprLogicalOperator`` joins the expressions, and the data filters
  and the expressions must both pass (``filtersLogicalOperator: and``).
- Trigger parameters: ``dataKey`` copies a value, ``dataTemplate`` renders a Go template
  over ``.Input`` (only the ``| substr a b`` pipe fabrique uses), and ``dest`` is an sjson
  path (``\\.`` escapes a dot, numbers index lists) into a copy of the resource.
- A ``patch`` trigger (standard-k8s.go) gets the object of that name, creates the
  resource when there is none, and otherwise sends it as a JSON merge patch (RFC 7386,
  ``merge_patch``: a map's keys merged, a list replaced whole, ``null`` removes).
"""

from __future__ import annotations

import copy
import re
from typing import Any


def _split(path: str) -> list[str]:
    return [part.replace("\\.", ".") for part in re.split(r"(?<!\\)\.", path)]


def lookup(event: dict[str, Any], path: str) -> Any:
    node: Any = event
    for part in _split(path):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def filters_pass(event: dict[str, Any], filters: list[dict[str, Any]]) -> bool:
    for data_filter in filters:
        assert data_filter.get("comparator", "=") == "=", "only equality is modelled"
        assert data_filter["type"] == "string", "only string filters are modelled"
        value = lookup(event, data_filter["path"])
        if not isinstance(value, str):
            return False
        if not any(re.search(_go(pattern), value) for pattern in data_filter["value"]):
            return False
    return True


MISSING = object()


def _top_split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside quotes, brackets and braces."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, char in enumerate(text):
        if char == '"' and text[i - 1 : i] != "\\":
            quoted = not quoted
        elif not quoted and char in "[({":
            depth += 1
        elif not quoted and char in "])}":
            depth -= 1
        elif not quoted and depth == 0 and char == sep:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _dotted(node: Any, path: str) -> Any:
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part == "#" and isinstance(node, list):
            rest = ".".join(parts[i + 1 :])
            if not rest:
                return len(node)
            found = [_dotted(item, rest) for item in node]
            return [item for item in found if item is not MISSING]
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def _flatten(items: list[Any]) -> list[Any]:
    return [
        leaf for item in items for leaf in (_flatten(item) if isinstance(item, list) else [item])
    ]


def gjson(event: dict[str, Any], path: str) -> Any:
    """The value at ``path``, for the gjson forms fabrique writes; ``MISSING`` if none."""
    first, *pipes = _top_split(path, "|")
    if first.startswith("["):
        value: Any = [_dotted(event, p) for p in _top_split(first[1:-1], ",")]
        value = [v for v in value if v is not MISSING]
    else:
        value = _dotted(event, first)
    for pipe in pipes:
        if value is MISSING:
            return MISSING
        if pipe == '@flatten:{"deep":true}':
            value = _flatten(value) if isinstance(value, list) else value
        elif pipe == "#":
            value = len(value) if isinstance(value, list) else MISSING
        elif match := re.fullmatch(r'#\((%|!=)"(.*)"\)#', pipe):
            operator, operand = match.groups()
            if operator == "%":
                glob = re.compile(
                    "".join(
                        ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in operand
                    ),
                    re.S,
                )
                value = [v for v in value if isinstance(v, str) and glob.fullmatch(v)]
            else:
                value = [v for v in value if not (isinstance(v, str) and v == operand)]
        else:
            raise AssertionError(f"gjson {pipe!r} is not modelled")
    return value


def _operand(token: str, fields: dict[str, Any]) -> Any:
    token = token.strip()
    if token.startswith("'"):
        return re.sub(r"\\(.)", r"\1", token[1:-1])
    if re.fullmatch(r"[0-9.]+", token):
        return float(token)
    return fields[token]


def evaluate(expression: str, fields: dict[str, Any]) -> bool:
    """A govaluate expression of the forms fabrique writes."""
    for clause in expression.split("||"):
        match = re.fullmatch(r"\s*(\S+)\s*(=~|!=|==|>)\s*(.+?)\s*", clause)
        assert match, f"expression {clause!r} is not modelled"
        left, operator, right = _operand(match[1], fields), match[2], _operand(match[3], fields)
        if operator == "=~":
            held = bool(re.search(_go(right), str(left)))
        elif operator == ">":
            held = float(left) > float(right)
        elif isinstance(left, str) and isinstance(right, str):
            # govaluate's == and != are reflect.DeepEqual: two strings as strings
            held = (left == right) == (operator == "==")
        else:
            held = (float(left) == float(right)) == (operator == "==")
        if held:
            return True
    return False


def exprs_pass(event: dict[str, Any], filters: dict[str, Any]) -> bool:
    results = []
    for expr in filters.get("exprs", []):
        fields = {f["name"]: gjson(event, f["path"]) for f in expr["fields"]}
        results.append(None if MISSING in fields.values() else evaluate(expr["expr"], fields))
    if not results:
        return True
    if filters.get("exprLogicalOperator") == "or":
        return any(results)
    return all(results)


def dependency_passes(event: dict[str, Any], dependency: dict[str, Any]) -> bool:
    """Whether ``event`` passes the dependency's data filters and its expressions."""
    assert dependency.get("filtersLogicalOperator", "and") == "and"
    filters = dependency["filters"]
    return filters_pass(event, filters.get("data", [])) and exprs_pass(event, filters)


def _go(pattern: str) -> str:
    """A Go (RE2) pattern as Python reads it: an unescaped ``$`` ends the text."""
    return re.sub(r"(?<!\\)\$", r"\\Z", pattern)


def render_template(template: str, event: dict[str, Any]) -> str:
    def one(match: re.Match[str]) -> str:
        path, _, pipe = match[1].partition("|")
        value = lookup(event, path.strip().removeprefix(".Input."))
        pipe = pipe.strip()
        if pipe:
            name, start, end = pipe.split()
            assert name == "substr", f"pipe {name} is not modelled"
            value = str(value)[int(start) : int(end)]
        return str(value)

    return re.sub(r"\{\{\s*(.+?)\s*\}\}", one, template)


def set_path(resource: dict[str, Any], dest: str, value: Any) -> None:
    parts = _split(dest)
    node: Any = resource
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def fire(
    trigger: dict[str, Any], event: dict[str, Any], *, first: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The object a k8s ``create`` trigger would send for ``event``.

    ``event`` is the payload as Go's json decodes it (of duplicated keys, the last);
    ``first`` as gjson reads it (the first), which is what a ``dataKey`` and the data
    filters see. Without duplicates they are the same."""
    k8s = trigger["template"]["k8s"]
    resource = copy.deepcopy(k8s["source"]["resource"])
    for parameter in k8s["parameters"]:
        source = parameter["src"]
        if "dataTemplate" in source:
            value = render_template(source["dataTemplate"], event)
        else:
            value = lookup(first if first is not None else event, source["dataKey"])
        set_path(resource, parameter["dest"], value)
    return resource


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` after the JSON merge patch ``patch`` (RFC 7386), as the API server
    applies a trigger's ``patch`` to the object it found: what the Sensor's account asks
    its admission to let through."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged
