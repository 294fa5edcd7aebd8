"""A hold: an operator's "stay on this one", kept in the write-back target itself.

The hold is the annotation ``hold.fabrique.io/<app>`` in the target document's
``metadata.annotations`` (one per app: apps may share a file; the bare
``fabrique.io/hold`` holds every app of the file): the kustomization (kustomize reads
its own ``metadata`` and passes nothing of it to the resources it renders) or the Argo
CD Application (which ignores annotations it does not know). Kept there, it is in Git
(it survives restarts, it is reviewed like any change), it sits next to the pin it
protects, a rollback writes the pin and the hold in one commit, and every write-back
already reads that file: respecting it costs no request.

The value is one line of JSON, ``{"at": "…Z", "by": "…", "reason": "…"}``, the way
``kubectl.kubernetes.io/last-applied-configuration`` keeps a record in an annotation. Any
other value (a hand-written ``hold.fabrique.io/citation: "incident 42"``) holds too, its text
taken as the reason.

Edits splice one line into the original text (plus ``metadata:``/``annotations:`` when
they are missing, and removing them again when the hold was all they held); the result is
parsed again and must be the original document with exactly that change. An empty
``annotations: {}`` (or ``metadata: {}``, or ``metadata:`` with no value) is written out
in block style, keeping the comment after it, as the pin's edit writes out
``kustomize: {}``; a hold with no value
(``hold.fabrique.io/<app>:``) holds, with no reason. A file the readers refuse (a key that
is a mapping, say) is refused by the edit too, hold and release alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fabrique.site.errors import InputError, TargetError

from .targets import (
    _last_line,
    _load,
    _plain,
    _read_shared,
    _require_block,
    _Splicer,
    _value_line,
    _write_out_empty,
)

# One app's hold: ``hold.fabrique.io/<app>`` (apps may share one target file, and a hold
# belongs to the app). The bare ``fabrique.io/hold`` holds every app of the file: written
# by hand, or by fabrique before holds were per app.
HOLD_ANNOTATION = "fabrique.io/hold"
HOLD_PREFIX = "hold.fabrique.io/"
MAX_TEXT = 200


def hold_key(app: str) -> str:
    return HOLD_PREFIX + app


@dataclass(frozen=True)
class Hold:
    """Who held the app, when (UTC, ISO 8601) and why."""

    by: str
    at: str
    reason: str = ""

    def describe(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"held by {self.by or 'unknown'} since {self.at or 'unknown'}{why}"

    def value(self) -> str:
        return json.dumps(
            {"at": self.at, "by": self.by, "reason": self.reason},
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        )


def check_text(option: str, value: str) -> str:
    """One printable line, at most MAX_TEXT characters: it goes into Git and commit trailers."""
    if len(value) > MAX_TEXT or any(not ch.isprintable() for ch in value):
        raise InputError(
            f"{option} {value[:40]!r}: must be one printable line of at most {MAX_TEXT} characters"
        )
    return value.strip()


def read_hold(text: str, where: str, app: str) -> Hold | None:
    """The hold on ``app`` the target document carries (its own, else the file-wide one),
    or None."""
    return read_hold_own(text, where, app) or file_hold(text, where)


def read_hold_own(text: str, where: str, app: str) -> Hold | None:
    """``app``'s own hold (``hold.fabrique.io/<app>``), not the file-wide one."""
    return _hold_at(text, where, hold_key(app))


def file_hold(text: str, where: str) -> Hold | None:
    """The file-wide hold (``fabrique.io/hold``), which holds every app of the file."""
    return _hold_at(text, where, HOLD_ANNOTATION)


def _hold_at(text: str, where: str, key: str) -> Hold | None:
    annotations = _annotations(_read_shared(text, where), where)
    if annotations is None or key not in annotations:
        return None
    return _parse(annotations[key])


def _parse(value: Any) -> Hold:
    raw = "" if value is None else str(value)
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        return Hold(
            by=str(data.get("by") or ""),
            at=str(data.get("at") or ""),
            reason=str(data.get("reason") or ""),
        )
    return Hold(by="", at="", reason=raw)


def apply_hold(text: str, hold: Hold | None, *, where: str, app: str | None) -> str:
    """The text with ``app``'s hold set to ``hold`` (None: removed), and nothing else
    changed; ``app`` None: the file-wide hold."""
    key = HOLD_ANNOTATION if app is None else hold_key(app)
    _read_shared(text, where)  # first: a file the readers refuse is neither held nor released
    data = _load(text, where)
    expected = _plain(data)
    splicer = _Splicer(text, where)
    metadata = data.get("metadata")
    annotations = _annotations(data, where)
    line = None if hold is None else f"{key}: {_single_quoted(hold.value())}"
    if hold is not None:
        if expected.get("metadata") is None:  # absent, or `metadata:` with no value
            expected["metadata"] = {}
        expected["metadata"].setdefault("annotations", {})[key] = hold.value()
    if "metadata" not in data:
        if line is None:
            return text
        splicer.append(f"metadata:\n  annotations:\n    {line}\n")
    elif annotations is None:
        if line is None:
            return text
        block = ["annotations:", f"  {line}"]
        # `metadata: {}`, or `metadata:` with no value
        if not _write_out_empty(splicer, data, "metadata", block, "metadata"):
            _require_block(metadata, where, "metadata")
            pad = _key_pad(metadata, where, "metadata")
            last = _last_line(metadata, metadata.lc.key(next(iter(metadata)))[0])
            splicer.insert_after(last, f"{pad}annotations:\n{pad}  {line}\n")
    else:
        _require_block(annotations, where, "metadata.annotations")
        if key in annotations:
            at = annotations.lc.key(key)[0]
            if _value_line(annotations, key) != at:  # an empty value (`key:`) is on its line
                raise TargetError(
                    f"{where}: line {at + 1}: the {key} annotation spans several lines; "
                    "write it on one line"
                )
            splicer.delete_line(at)
            if line is not None:
                splicer.insert_after(at, " " * annotations.lc.key(key)[1] + line + "\n")
            else:
                del expected["metadata"]["annotations"][key]
                if len(annotations) == 1:  # the hold was all it held: leave no empty key
                    splicer.delete_line(metadata.lc.key("annotations")[0])
                    del expected["metadata"]["annotations"]
                    if len(metadata) == 1:
                        splicer.delete_line(data.lc.key("metadata")[0])
                        del expected["metadata"]
        elif line is None:
            return text
        elif not _write_out_empty(  # `annotations: {}`
            splicer, metadata, "annotations", [line], "metadata.annotations"
        ):
            pad = _key_pad(annotations, where, "metadata.annotations")
            last = _last_line(annotations, annotations.lc.key(next(iter(annotations)))[0])
            splicer.insert_after(last, pad + line + "\n")
    result = splicer.result()
    if _plain(_load(result, where)) != expected:
        raise TargetError(
            f"{where}: the in-place edit of metadata.annotations did not give the intended "
            "document (an unusual layout?); nothing was written"
        )
    return result


def _annotations(data: Any, where: str) -> Any:
    """``metadata.annotations`` of a read (dict) or round-trip (CommentedMap) document."""
    metadata = data.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise TargetError(f"{where}: metadata must be a mapping")
    annotations = metadata.get("annotations")
    if annotations is None:
        if "annotations" in metadata:
            raise TargetError(f"{where}: metadata.annotations is empty; remove the key")
        return None
    if not isinstance(annotations, dict):
        raise TargetError(f"{where}: metadata.annotations must be a mapping")
    return annotations


def _key_pad(node: Any, where: str, what: str) -> str:
    if not node:
        raise TargetError(f"{where}: {what} is an empty mapping; write it in block style")
    return " " * node.lc.key(next(iter(node)))[1]


def _single_quoted(value: str) -> str:
    """A YAML single-quoted scalar: JSON reads best this way (no backslashes)."""
    return "'" + value.replace("'", "''") + "'"
