"""A hold: an operator's "stay on this one", kept in the write-back target itself.

The hold is the annotation ``fabrique.io/hold`` in the target document's
``metadata.annotations``: the kustomization (kustomize reads its own ``metadata`` and
passes nothing of it to the resources it renders) or the Argo CD Application (which
ignores annotations it does not know). Kept there, it is in Git (it survives restarts, it
is reviewed like any change), it sits next to the pin it protects, a rollback writes the
pin and the hold in one commit, and every write-back already reads that file: respecting
it costs no request.

The value is one line of JSON, ``{"at": "…Z", "by": "…", "reason": "…"}``, the way
``kubectl.kubernetes.io/last-applied-configuration`` keeps a record in an annotation. Any
other value (a hand-written ``fabrique.io/hold: "incident 42"``) holds too, its text taken
as the reason.

Edits splice one line into the original text (plus ``metadata:``/``annotations:`` when
they are missing, and removing them again when the hold was all they held); the result is
parsed again and must be the original document with exactly that change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ruamel.yaml.comments import CommentedMap

from fabrique.site.errors import InputError, TargetError

from .targets import _last_line, _load, _load_shared, _plain, _require_block, _Splicer

HOLD_ANNOTATION = "fabrique.io/hold"
MAX_TEXT = 200


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


def read_hold(text: str, where: str) -> Hold | None:
    """The hold the target document carries, or None."""
    annotations = _annotations(_load_shared(text, where), where)
    if annotations is None or HOLD_ANNOTATION not in annotations:
        return None
    raw = annotations[HOLD_ANNOTATION]
    raw = "" if raw is None else str(raw)
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


def apply_hold(text: str, hold: Hold | None, *, where: str) -> str:
    """The text with ``hold`` set (None: removed), and nothing else changed."""
    data = _load(text, where)
    expected = _plain(data)
    splicer = _Splicer(text, where)
    metadata = data.get("metadata")
    annotations = _annotations(data, where)
    line = None if hold is None else f"{HOLD_ANNOTATION}: {_single_quoted(hold.value())}\n"
    if hold is not None:
        expected.setdefault("metadata", {}).setdefault("annotations", {})
        expected["metadata"]["annotations"][HOLD_ANNOTATION] = hold.value()
    if metadata is None:
        if line is None:
            return text
        splicer.append(f"metadata:\n  annotations:\n    {line}")
    elif annotations is None:
        if line is None:
            return text
        _require_block(metadata, where, "metadata")
        pad = _key_pad(metadata, where, "metadata")
        last = _last_line(metadata, metadata.lc.key(next(iter(metadata)))[0])
        splicer.insert_after(last, f"{pad}annotations:\n{pad}  {line}")
    else:
        _require_block(annotations, where, "metadata.annotations")
        if HOLD_ANNOTATION in annotations:
            at = annotations.lc.key(HOLD_ANNOTATION)[0]
            if annotations.lc.value(HOLD_ANNOTATION)[0] != at:
                raise TargetError(
                    f"{where}: the {HOLD_ANNOTATION} annotation spans several lines; "
                    "write it on one line"
                )
            splicer.delete_line(at)
            if line is not None:
                splicer.insert_after(at, " " * annotations.lc.key(HOLD_ANNOTATION)[1] + line)
            else:
                del expected["metadata"]["annotations"][HOLD_ANNOTATION]
                if len(annotations) == 1:  # the hold was all it held: leave no empty key
                    splicer.delete_line(metadata.lc.key("annotations")[0])
                    del expected["metadata"]["annotations"]
                    if len(metadata) == 1:
                        splicer.delete_line(data.lc.key("metadata")[0])
                        del expected["metadata"]
        elif line is None:
            return text
        else:
            pad = _key_pad(annotations, where, "metadata.annotations")
            last = _last_line(annotations, annotations.lc.key(next(iter(annotations)))[0])
            splicer.insert_after(last, pad + line)
    result = splicer.result()
    if _plain(_load(result, where)) != expected:
        raise TargetError(
            f"{where}: the in-place edit of metadata.annotations did not give the intended "
            "document (an unusual layout?); nothing was written"
        )
    return result


def _annotations(data: CommentedMap, where: str) -> CommentedMap | None:
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
    return annotations  # type: ignore[return-value]


def _key_pad(node: Any, where: str, what: str) -> str:
    if not node:
        raise TargetError(f"{where}: {what} is an empty mapping; write it in block style")
    return " " * node.lc.key(next(iter(node)))[1]


def _single_quoted(value: str) -> str:
    """A YAML single-quoted scalar: JSON reads best this way (no backslashes)."""
    return "'" + value.replace("'", "''") + "'"
