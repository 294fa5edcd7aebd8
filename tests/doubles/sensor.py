"""What Argo Events' Sensor does with an event, for the parts fabrique uses. Not Argo Events.

- Data filters: the value at a gjson-like ``path`` of the event (``header.X-Gitea-Event.0``,
  ``body.ref``), a string, must match one of the filter's values as an **unanchored**
  regex (Go's ``regexp.MatchString``), which is why fabrique anchors every one. Go's ``$``
  is the end of the text (Python's ``\\Z``), not "before a final newline". Filters are
  ANDed (``dataLogicalOperator: and``); a missing path fails the filter.
- Trigger parameters: ``dataKey`` copies a value, ``dataTemplate`` renders a Go template
  over ``.Input`` (only the ``| substr a b`` pipe fabrique uses), and ``dest`` is an sjson
  path (``\\.`` escapes a dot, numbers index lists) into a copy of the resource.
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
