"""The three kinds of write-back target, edited in place.

- ``kustomize-images``: a kustomization's ``images[]`` entry for the image gets
  ``newName: <registry>/<image>``, ``newTag: <sha12>`` and ``digest: sha256:…``
  (kustomize renders ``<registry>/<image>:<sha12>@sha256:…``). The entry is created if
  missing.
- ``argocd-application``: an Argo CD Application's ``spec.source.kustomize.images`` (or
  the right ``spec.sources[]`` entry's) gets ``<image>=<registry>/<image>:<sha12>@sha256:…``,
  replacing any earlier entry for the same image.
- ``helm-values``: a Helm values file's keys at the target's paths (``HelmPaths``) get
  the repository, the tag and the digest (by default ``image.repository``, ``image.tag``
  and ``image.digest``), or one string with all three. The keys must be there (an empty
  value will do): a chart's values are the team's, and fabrique adds none.

Not one other byte of the file changes: comments, key order, quoting, indentation, flow
style elsewhere, other images and the final newline. ruamel.yaml round-trip locates the
nodes (line and column) and the edit is spliced into the original text there; the result
is parsed again and must equal the original document with exactly the intended change.
These are pure functions of the file's text.

Values are read as their source text (``newTag: 1.10`` is the tag ``1.10``, not the
number 1.1), inserted lines keep the file's line ending (CRLF stays CRLF) and come in
kustomize's natural order (``name, newName, newTag, digest``); a value in a flow mapping
(``image: {tag: …, digest: ''}``) is replaced where it stands, up to the ``,`` or ``}``
that ends it, quoted where flow style needs it. A file that would not
deploy what fabrique reports is refused, not edited: two entries for the same image
(under its plain name and its registry name, say: kustomize would keep applying the
other one), ``images:`` with no list, YAML merge keys (``<<``), a key that is a mapping or a
list, an anchor or alias where the edit falls. A field with no value (``digest:``) is
filled in. A list (or a kustomization entry) in flow style, ``[]`` and ``[ ]`` alike, is
written out in block style, its other entries keeping their text and the comment after it.
"""

from __future__ import annotations

import copy
import functools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import yaml as pyyaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from fabrique.site.config import HelmPaths, WriteBackTarget
from fabrique.site.errors import TargetError

Kind = Literal["kustomize-images", "argocd-application", "helm-values"]
KUSTOMIZE_FIELDS = ("name", "newName", "newTag", "digest")


@dataclass(frozen=True)
class ImagePin:
    """Where an image points: ``new_name:tag@digest`` for the image called ``image``."""

    image: str
    new_name: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        text = self.new_name
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    def names(self) -> tuple[str, str]:
        """The names an existing entry for this image may go by."""
        return (self.image, self.new_name)


# --------------------------------------------------------------------------- public


def read_pin(
    text: str,
    kind: Kind,
    pin_for: ImagePin,
    *,
    where: str,
    source_index: int | None = None,
    helm: HelmPaths | None = None,
) -> ImagePin | None:
    """What the target says now about ``pin_for.image``, or None if it has no entry."""
    data = _read_shared(text, where)
    if helm is not None and helm.via == "parameters":
        _, source = _helm_source(data, where, source_index, "parameters")
        values = {
            str(entry.get("name")): entry.get("value")
            for entry in source["helm"]["parameters"]
            if isinstance(entry, dict)
        }
        return _helm_pin(_nested(values), pin_for, helm, where)
    if kind == "helm-values" or helm is not None:
        _, root = _helm_root(data, kind, where, source_index)
        return _helm_pin(root, pin_for, helm or HelmPaths(), where)
    if kind == "kustomize-images":
        found = _kustomize_entry(_kustomize_images(data, where), pin_for, where)
        if found is None:
            return None
        _, entry = found

        def field(name: str) -> str | None:
            return _str_or_none(entry.get(name))

        return ImagePin(
            str(field("name")),
            str(field("newName") or field("name")),
            field("newTag"),
            field("digest"),
        )
    _, source = _pick_source(data, pin_for, where, source_index)
    for value in _source_images(source, where) or []:
        parsed = parse_argocd_image(str(value))
        if parsed.image in pin_for.names():
            return parsed
    return None


def apply_pin(
    text: str,
    kind: Kind,
    pin: ImagePin,
    *,
    where: str,
    source_index: int | None = None,
    helm: HelmPaths | None = None,
) -> str:
    """The file's text with ``pin`` written in, and nothing else changed."""
    # kustomize reads every field as a string: compare the documents as source text
    raw = _read_shared(text, where)  # first: what a reader refuses, the edit refuses
    data = _load(text, where)
    splicer = _Splicer(text, where)
    if helm is not None and helm.via == "parameters":
        expected = _plain(data)
        at, source = _helm_source(data, where, source_index, "parameters")
        node = expected
        for part in at:
            node = node[part]
        _pin_parameters(splicer, source, node["helm"]["parameters"], helm, pin, where)
    elif kind == "helm-values" or helm is not None:
        expected = _plain(data)
        at, root = _helm_root(data, kind, where, source_index)
        for path, value in _helm_values(helm or HelmPaths(), pin).items():
            mapping, key = _helm_key(root, path, where)
            node = expected
            for part in [*at, *path.split(".")[:-1]]:
                node = node[part]
            node[key] = value
            first, last = _value_line(mapping, key), _value_line(mapping, key)
            _refuse_anchors(splicer, first, last, f"{path}")
            _set_scalar(splicer, mapping, key, value)
    elif kind == "kustomize-images":
        _pin_kustomize(splicer, data, raw, pin, where)
        expected = copy.deepcopy(raw)
        _expect_kustomize(expected, pin)
    else:
        expected = _plain(data)
        index, source = _pick_source(data, pin, where, source_index)
        _pin_application(splicer, source, pin, where)
        spec = expected["spec"]
        _expect_application(spec["sources"][index] if index is not None else spec["source"], pin)
    result = splicer.result()
    # read back as the expectation was made: a Kustomization as source text (a values
    # file as Helm reads it: a tag that would turn into a number is a defect); what does
    # not read back is the edit's fault, never the user's file
    try:
        got = (
            _read_shared(result, where)
            if kind == "kustomize-images"
            else _plain(_load(result, where))
        )
    except TargetError:
        got = None
    if got != expected:
        raise TargetError(
            f"{where}: the in-place edit did not give the intended document (an unusual "
            "layout around the images?); nothing was written"
        )
    return result


def target_pin(
    text: str, target: WriteBackTarget, pin_for: ImagePin, *, where: str
) -> ImagePin | None:
    """``read_pin`` in the layout ``target`` gives: its kind, its Application source,
    its Helm paths."""
    return read_pin(
        text,
        target.kind,
        pin_for,
        where=where,
        source_index=target.source_index,
        helm=target.helm_paths,
    )


def pin_target(text: str, target: WriteBackTarget, pin: ImagePin, *, where: str) -> str:
    """``apply_pin`` in the layout ``target`` gives."""
    return apply_pin(
        text,
        target.kind,
        pin,
        where=where,
        source_index=target.source_index,
        helm=target.helm_paths,
    )


def new_target(kind: Kind, pin: ImagePin, *, where: str) -> str:
    """The text of a new target file holding only ``pin`` (for targets marked create)."""
    if kind == "helm-values":
        raise TargetError(
            f"{where}: a values file cannot be created from nothing (it holds the chart's "
            "other values); create it with the image's keys first"
        )
    if kind != "kustomize-images":
        raise TargetError(
            f"{where}: an Argo CD Application cannot be created from nothing (it needs a "
            "source and a destination); create it in the apps repository first"
        )
    return (
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "images:\n" + _kustomize_entry_lines(pin, dash_col=0)
    )


def parse_argocd_image(value: str) -> ImagePin:
    """Parse Argo CD's ``[name=]new_name[:tag][@digest]``."""
    name, _, ref = value.partition("=") if "=" in value else ("", "", value)
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    tag = None
    if ":" in ref.rsplit("/", 1)[-1]:
        ref, tag = ref.rsplit(":", 1)
    return ImagePin(name or ref, ref, tag, digest)


# -------------------------------------------------------------------- reading YAML


def _load(text: str, where: str) -> CommentedMap:
    try:
        documents = [d for d in YAML(typ="rt").load_all(text) if d is not None]
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise TargetError(f"{where}:{line} not valid YAML ({problem})") from None
    if len(documents) != 1:
        raise TargetError(f"{where}: holds {len(documents)} YAML documents; expected exactly one")
    if not isinstance(documents[0], CommentedMap):
        raise TargetError(f"{where}: the document must be a mapping")
    _refuse_merge_keys(documents[0], where)
    return documents[0]


_T = TypeVar("_T")


def _parsed_once(maxsize: int) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """``functools.lru_cache`` that parses a text once even when a reconcile pass's
    workers ask for it together: lru_cache lets every concurrent miss run the function
    (a file that 20 apps share was parsed up to 20 times). A miss holds one of a few
    locks, chosen by the arguments' hash, while it parses."""

    def decorate(load: Callable[..., _T]) -> Callable[..., _T]:
        cached = functools.lru_cache(maxsize=maxsize)(load)
        locks = [threading.Lock() for _ in range(32)]

        @functools.wraps(load)
        def once(*args: Any) -> _T:
            with locks[hash(args) % len(locks)]:
                return cached(*args)

        once.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        once.cache_info = cached.cache_info  # type: ignore[attr-defined]
        return once

    return decorate


class _TextLoader(getattr(pyyaml, "CBaseLoader", pyyaml.BaseLoader)):  # type: ignore[misc]
    """What readers parse with, in C where libyaml is there (a round-trip parse of a file
    that pins 20 images costs 20 times more, and a pass reads every app's pin): every
    scalar as its source text, as kustomize reads every field as a string, and a plain
    empty or ``null`` as None. A key given twice, or a merge key, is refused, as the
    round-trip parse that edits refuses them."""

    def construct_scalar(self, node: Any) -> Any:
        value = super().construct_scalar(node)
        plain = not node.style  # None, or "" from the C parser
        return None if plain and value in ("", "~", "null", "Null", "NULL") else value

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, pyyaml.ScalarNode):
                raise _CollectionKey(key_node.start_mark.line)
            key = self.construct_object(key_node, deep=True)
            if key == "<<" and not key_node.style:
                raise _MergeKey
            if key in mapping:
                raise pyyaml.constructor.ConstructorError(
                    None, None, f"found duplicate key {key!r}", key_node.start_mark
                )
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


class _MergeKey(Exception):
    pass


class _CollectionKey(Exception):
    """A key that is a mapping or a list (``? {owner: data} : team``): valid YAML, but
    no Kubernetes object, nor kustomize, takes it, and it cannot be read as text."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


@_parsed_once(maxsize=256)
def _read_shared(text: str, where: str) -> dict[str, Any]:
    """The document as ``_TextLoader`` reads it, with ``_load``'s checks and messages.
    Shared between readers, parsed once: never to be edited (copy it first)."""
    try:
        documents = [d for d in pyyaml.load_all(text, Loader=_TextLoader) if d is not None]
    except pyyaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise TargetError(f"{where}:{line} not valid YAML ({problem})") from None
    except _MergeKey:
        raise TargetError(_MERGE_KEY.format(where=where)) from None
    except _CollectionKey as key:
        raise TargetError(
            f"{where}: line {key.line + 1}: a key that is a mapping or a list, which "
            "Kubernetes and kustomize do not take; write the key as a string"
        ) from None
    if len(documents) != 1:
        raise TargetError(f"{where}: holds {len(documents)} YAML documents; expected exactly one")
    if not isinstance(documents[0], dict):
        raise TargetError(f"{where}: the document must be a mapping")
    return documents[0]


_MERGE_KEY = (
    "{where}: uses a YAML merge key (<<: *anchor); write the keys out to let fabrique edit it"
)


def _refuse_merge_keys(node: Any, where: str) -> None:
    """A merged key has no line of its own to edit, and the edit would change every
    mapping that merges the same anchor."""
    if isinstance(node, CommentedMap):
        if getattr(node, "merge", None):
            raise TargetError(_MERGE_KEY.format(where=where))
        for value in node.values():
            _refuse_merge_keys(value, where)
    elif isinstance(node, CommentedSeq):
        for value in node:
            _refuse_merge_keys(value, where)


def _plain(node: Any) -> Any:
    """A round-trip node as plain Python data, the way a YAML consumer sees it."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, str):
        return str(node)
    return copy.copy(node)


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


NULLS = ("", "~", "null", "Null", "NULL")


def _helm_values(helm: HelmPaths, pin: ImagePin) -> dict[str, str]:
    """Each path of a helm-values target and what ``pin`` puts there."""
    what = {
        "repository": pin.new_name,
        "tag": pin.tag or "",
        "digest": pin.digest or "",
        "image": pin.reference,
    }
    return {path: what[role] for role, path in helm.leaves().items()}


def _helm_root(
    data: Any, kind: Kind, where: str, source_index: int | None
) -> tuple[list[str | int], Any]:
    """Where the helm paths start, and the keys that lead there: the values file itself,
    or the ``helm.valuesObject`` of an Application's source (the one ``sourceIndex``
    names, or the only one that has it)."""
    if kind == "helm-values":
        return [], data
    at, source = _helm_source(data, where, source_index, "valuesObject")
    values = source["helm"]["valuesObject"]
    if not isinstance(values, dict):
        raise TargetError(
            f"{where}: {'.'.join(map(str, at))}.helm.valuesObject: not a mapping; write the "
            "image's keys there (an empty value will do)"
        )
    return [*at, "helm", "valuesObject"], values


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"image.tag": v}`` as ``{"image": {"tag": v}}``: parameters read as values."""
    found: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, last = name.split(".")
        node = found
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[last] = value
    return found


def _pin_parameters(
    splicer: _Splicer,
    source: CommentedMap,
    expected: list[Any],
    helm: HelmPaths,
    pin: ImagePin,
    where: str,
) -> None:
    """Each parameter the paths name gets its value, and ``forceString: true``: Argo CD
    passes a parameter without it to ``helm template --set``, which reads an all-digit
    tag as a number (a chart that builds the image with ``printf "%s"`` then renders
    ``%!s(int64=123456789012)``)."""
    entries = source["helm"]["parameters"]
    for path, value in _helm_values(helm, pin).items():
        found = [
            (i, e)
            for i, e in enumerate(entries)
            if isinstance(e, CommentedMap) and e.get("name") == path
        ]
        if len(found) != 1:
            raise TargetError(
                f"{where}: helm.parameters: {len(found)} entries named {path}; list it once "
                f'(- name: {path}, value: "", forceString: true)'
            )
        index, entry = found[0]
        _require_block(entry, where, f"the parameter {path}")
        if "value" not in entry:
            raise TargetError(f"{where}: helm.parameters: {path} has no value key; add one")
        line = _value_line(entry, "value")
        _refuse_anchors(splicer, line, line, f"the parameter {path}")
        _set_scalar(splicer, entry, "value", value)
        expected[index]["value"] = value
        if entry.get("forceString") is True:
            continue
        if "forceString" in entry:
            raise TargetError(
                f"{where}: helm.parameters: {path} has forceString "
                f"{entry['forceString']!r}; it must be true (Argo CD would pass it to "
                "--set, which reads an all-digit tag as a number)"
            )
        pad = " " * entry.lc.key("value")[1]
        splicer.insert_after(_last_line(entry, line), f"{pad}forceString: true\n")
        expected[index]["forceString"] = True


def _helm_source(
    data: Any, where: str, source_index: int | None, form: str
) -> tuple[list[str | int], Any]:
    """The keys to, and the source of an Application that holds ``helm.<form>``:
    ``spec.source``, or the one of ``spec.sources`` that has it (``sourceIndex``'s)."""
    if data.get("kind") != "Application":
        raise TargetError(f"{where}: kind is {data.get('kind')!r}, not an Argo CD Application")
    spec = data.get("spec")
    if not isinstance(spec, dict):
        raise TargetError(f"{where}: spec must be a mapping")
    if "sources" in spec and isinstance(spec["sources"], list):
        sources = list(enumerate(spec["sources"]))
        if source_index is not None:
            sources = sources[source_index : source_index + 1]
        found = [
            (i, src)
            for i, src in sources
            if isinstance(src, dict) and isinstance(src.get("helm"), dict)
            and form in src["helm"]
        ]  # fmt: skip
        if len(found) != 1:
            raise TargetError(
                f"{where}: {len(found)} of spec.sources have helm.{form}"
                + ("" if source_index is not None else "; set the app's writeback.sourceIndex")
            )
        index, picked = found[0]
        source: Any = picked
        at: list[str | int] = ["spec", "sources", index]
    else:
        source, at = spec.get("source"), ["spec", "source"]
    helm = source.get("helm") if isinstance(source, dict) else None
    held = helm.get(form) if isinstance(helm, dict) else None
    if not isinstance(helm, dict) or form not in helm:
        raise TargetError(
            f"{where}: {'.'.join(map(str, at))}.helm.{form}: missing; write the image's "
            f"{'keys' if form == 'valuesObject' else 'parameters'} there"
        )
    if form == "parameters" and not isinstance(held, list):
        raise TargetError(
            f"{where}: {'.'.join(map(str, at))}.helm.parameters: not a list; list the "
            'image\'s parameters there (- name: image.tag, value: "", forceString: true)'
        )
    return at, source


def _helm_key(data: CommentedMap, path: str, where: str) -> tuple[CommentedMap, str]:
    """The mapping holding the last key of ``path``, and that key; a TargetError naming
    the path when a key is missing or a step is not a mapping."""
    node: Any = data
    parts = path.split(".")
    for depth, part in enumerate(parts):
        at = ".".join(parts[: depth + 1])
        if not isinstance(node, CommentedMap):
            raise TargetError(f"{where}: {at}: {'.'.join(parts[:depth])} is not a mapping")
        if part not in node:
            raise TargetError(
                f"{where}: {path}: no key {at}; add it to the values file (an empty value "
                "will do): fabrique writes only keys the chart's values have"
            )
        if depth == len(parts) - 1:
            if isinstance(node[part], (CommentedMap, CommentedSeq)):
                raise TargetError(f"{where}: {path}: a mapping or a list, not a value")
            return node, part
        node = node[part]
    raise AssertionError("unreachable")  # pragma: no cover


def _helm_pin(
    data: dict[str, Any], pin_for: ImagePin, helm: HelmPaths, where: str
) -> ImagePin | None:
    """What a values file deploys for the app's image: None when a key is missing or
    every value is empty."""
    found: dict[str, str | None] = {}
    for role, path in helm.leaves().items():
        node: Any = data
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        if isinstance(node, (dict, list)):
            raise TargetError(f"{where}: {path}: a mapping or a list, not a value")
        found[role] = None if node in NULLS else str(node)
    if "image" in found:
        image = found["image"]
        if image is None:
            return None
        parsed = parse_argocd_image(image)
        return ImagePin(pin_for.image, parsed.new_name, parsed.tag, parsed.digest)
    if not any(found.values()):
        return None
    return ImagePin(pin_for.image, found["repository"] or "", found["tag"], found["digest"])


def _kustomize_images(data: dict[str, Any], where: str) -> Any:
    kind = data.get("kind")
    if kind is not None and kind not in ("Kustomization", "Component"):
        raise TargetError(f"{where}: kind is {kind!r}, not a Kustomization")
    images = data.get("images")
    if "images" in data and images is None:
        raise TargetError(
            f"{where}: images has no value (null); write the list under it or remove the key"
        )
    if images is not None and not isinstance(images, list):
        raise TargetError(f"{where}: images must be a list")
    return images


def _kustomize_entry(
    images: CommentedSeq | None, pin: ImagePin, where: str
) -> tuple[int, CommentedMap] | None:
    """The one entry for ``pin.image`` (by its plain or its registry name), or None.

    Two entries are refused: kustomize would apply one of them whatever fabrique
    writes into the other, and nothing new would deploy."""
    found = []
    for index, entry in enumerate(images or []):
        if not isinstance(entry, dict):
            raise TargetError(f"{where}: images[{index}] must be a mapping")
        if entry.get("name") in pin.names():
            found.append((index, entry))
    if len(found) > 1:
        listed = ", ".join(f"images[{index}] ({entry['name']})" for index, entry in found)
        raise TargetError(
            f"{where}: {len(found)} entries name the image {pin.image}: {listed}; "
            "kustomize would apply only one of them, so keep exactly one"
        )
    return found[0] if found else None  # type: ignore[return-value]


def _pick_source(
    data: dict[str, Any], pin: ImagePin, where: str, source_index: int | None
) -> tuple[int | None, Any]:
    """(index in spec.sources or None for spec.source, the source that deploys the image)."""
    if data.get("kind") != "Application":
        raise TargetError(f"{where}: kind is {data.get('kind')!r}, not an Argo CD Application")
    spec = data.get("spec")
    if not isinstance(spec, dict):
        raise TargetError(f"{where}: spec must be a mapping")
    if "sources" not in spec:
        if not isinstance(spec.get("source"), dict):
            raise TargetError(f"{where}: spec.source must be a mapping")
        return None, spec["source"]
    sources = spec["sources"]
    if not isinstance(sources, list) or not all(isinstance(s, dict) for s in sources):
        raise TargetError(f"{where}: spec.sources must be a list of mappings")
    if source_index is not None:
        if not 0 <= source_index < len(sources):
            raise TargetError(
                f"{where}: spec.sources has no item {source_index} (writeback.sourceIndex)"
            )
        return source_index, sources[source_index]
    holding = [
        i
        for i, source in enumerate(sources)
        if any(
            parse_argocd_image(str(v)).image in pin.names()
            for v in _source_images(source, where) or []
        )
    ]
    with_path = [i for i, source in enumerate(sources) if "path" in source]
    if len(holding) == 1:
        return holding[0], sources[holding[0]]
    if not holding and len(with_path) == 1:
        return with_path[0], sources[with_path[0]]
    raise TargetError(
        f"{where}: cannot tell which of the {len(sources)} spec.sources deploys {pin.image}; "
        "set the app's writeback.sourceIndex"
    )


def _source_images(source: CommentedMap, where: str) -> CommentedSeq | None:
    kustomize = source.get("kustomize")
    if "kustomize" in source and kustomize is None:
        raise TargetError(
            f"{where}: kustomize has no value (null); write the mapping under it or remove the key"
        )
    if kustomize is None:
        return None
    if not isinstance(kustomize, dict):
        raise TargetError(f"{where}: kustomize must be a mapping")
    images = kustomize.get("images")
    if "images" in kustomize and images is None:
        raise TargetError(
            f"{where}: kustomize.images has no value (null); write the list under it or "
            "remove the key"
        )
    if images is not None and not isinstance(images, list):
        raise TargetError(f"{where}: kustomize.images must be a list")
    return images  # type: ignore[return-value]


# ------------------------------------------------------------- the intended change


def _expect_kustomize(data: dict[str, Any], pin: ImagePin) -> None:
    images = data.setdefault("images", [])
    entry = next((e for e in images if e.get("name") in pin.names()), None)
    if entry is None:
        entry = {"name": pin.image}
        images.append(entry)
    entry.update(newName=pin.new_name, newTag=pin.tag, digest=pin.digest)


def _expect_application(source: dict[str, Any], pin: ImagePin) -> None:
    images = source.setdefault("kustomize", {}).setdefault("images", [])
    kept, dropped = _application_entries([str(v) for v in images], pin)
    if not kept:
        images.append(_argocd_value(None, pin))
        return
    for index, value in kept.items():
        images[index] = value
    for index in reversed(dropped):
        del images[index]


def _argocd_value(existing: str | None, pin: ImagePin) -> str:
    """The Argo CD entry for ``pin``, going by the name ``existing`` goes by: kustomize
    sets the image of the containers whose image has that name (Argo CD runs ``kustomize
    edit set image <entry>``), so an entry rewritten under another name deploys nothing.
    A new entry goes by the plain image name."""
    if existing is None:
        return f"{pin.image}={pin.reference}"
    if "=" not in existing and parse_argocd_image(existing).new_name == pin.new_name:
        return pin.reference  # `registry:80/<app>:<tag>`: its name is its own image
    return f"{parse_argocd_image(existing).image}={pin.reference}"


def _application_entries(images: list[str], pin: ImagePin) -> tuple[dict[int, str], list[int]]:
    """The entries for ``pin``, each rewritten under its own name (index -> value), and the
    later entries that repeat a name already kept (to drop: they would set it again)."""
    kept: dict[int, str] = {}
    dropped: list[int] = []
    names: set[str] = set()
    for index, value in enumerate(images):
        name = parse_argocd_image(value).image
        if name not in pin.names():
            continue
        if name in names:
            dropped.append(index)
            continue
        names.add(name)
        kept[index] = _argocd_value(value, pin)
    return kept, dropped


# ------------------------------------------------------------------ the text edit


def yaml_scalar(value: str, flow: bool = False) -> str:
    """``value`` as a YAML scalar that reads back as the same string, under YAML 1.1 and
    1.2 alike (an all-digit or ``1e5``-like tag must not turn into a number); ``flow``:
    as a value of a flow mapping (``{tag: …}``), where ``,``, ``[`` and ``]`` end it."""
    try:
        text, read = (f"{{k: {value}}}", {"k": value}) if flow else (value, value)
        plain_ok = (
            pyyaml.safe_load(text) == read
            and YAML(typ="safe", pure=True).load(text) == read
            and not value.startswith(("*", "&", "!", "%", "@"))
        )
    except (pyyaml.YAMLError, YAMLError):
        plain_ok = False
    return value if plain_ok else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _kustomize_entry_lines(pin: ImagePin, dash_col: int) -> str:
    pad = " " * dash_col
    lines = [f"{pad}- name: {yaml_scalar(pin.image)}"]
    for field, value in (("newName", pin.new_name), ("newTag", pin.tag), ("digest", pin.digest)):
        if value is not None:
            lines.append(f"{pad}  {field}: {yaml_scalar(value)}")
    return "".join(line + "\n" for line in lines)


class _Splicer:
    """Line-and-column edits of the original text, applied bottom-up."""

    def __init__(self, text: str, where: str) -> None:
        self.lines = text.splitlines(keepends=True)
        # inserted lines end as the file's lines do
        self.newline = "\r\n" if self.lines and self.lines[0].endswith("\r\n") else "\n"
        if self.lines and not self.lines[-1].endswith("\n"):
            self.final_newline = False
            self.lines[-1] += self.newline
        else:
            self.final_newline = True
        self.where = where
        self._edits: list[tuple[int, int, str, Any]] = []  # (line, order, op, payload)
        self._ends: dict[tuple[int, int], tuple[int, int]] | None = None  # _plain_ends

    def replace_scalar(self, line: int, col: int, value: str, flow: bool = False) -> None:
        """Replace the scalar that starts at (``line``, ``col``), in a flow collection or
        not (``flow``), keeping its quotes."""
        self._edits.append((line, 2, "replace", (col, value, flow)))

    def fill_empty(self, line: int, col: int, value: str, flow: bool = False) -> None:
        """Write ``value`` where an empty one stands: ``col`` is just after the colon."""
        self._edits.append((line, 2, "fill", (col, value, flow)))

    def insert_after(self, line: int, text: str) -> None:
        self._edits.append((line, 1, "insert", text))

    def delete_line(self, line: int) -> None:
        self._edits.append((line, 0, "delete", None))

    def append(self, text: str) -> None:
        self._edits.append((len(self.lines) - 1, 1, "insert", text))

    def result(self) -> str:
        lines = list(self.lines)
        # what is inserted after one line goes there in the order it was asked for
        inserts: dict[int, str] = {}
        for line, _, op, payload in self._edits:
            if op == "insert":
                inserts[line] = inserts.get(line, "") + payload.replace("\n", self.newline)
        edits = [e for e in self._edits if e[2] != "insert"]
        edits += [(line, 1, "insert", payload) for line, payload in inserts.items()]
        # bottom-up, and right to left on a line (a flow mapping's values): each edit's
        # column is still the original text's
        in_line = ("replace", "fill")
        edits.sort(key=lambda e: (e[0], e[1], e[3][0] if e[2] in in_line else 0), reverse=True)
        for line, _, op, payload in edits:
            if op == "replace":
                col, value, flow = payload
                lines[line] = self._replace(line, lines[line], col, value, flow)
            elif op == "fill":
                col, value, flow = payload
                text = yaml_scalar(value, flow)
                lines[line] = f"{lines[line][:col]} {text}{lines[line][col:]}"
            elif op == "insert":
                lines.insert(line + 1, payload)
            else:
                del lines[line]
        text = "".join(lines)
        return text if self.final_newline else text[: -len(self.newline)]

    def _replace(self, row: int, line: str, col: int, value: str, flow: bool) -> str:
        rest = line[col:]
        if rest[:1] in ('"', "'"):
            quote = rest[0]
            end = _closing_quote(rest, quote)
            if end < 0:
                raise TargetError(
                    f"{self.where}: a quoted value spans several lines; cannot edit it in place"
                )
            escaped = (
                value.replace("'", "''")
                if quote == "'"
                else value.replace("\\", "\\\\").replace('"', '\\"')
            )
            return line[:col] + quote + escaped + quote + rest[end + 1 :]
        if rest[:1] in ("|", ">", "[", "{"):
            raise TargetError(
                f"{self.where}: a value in block or flow style cannot be edited in place"
            )
        # a plain scalar ends where the parser says: before a comment, or at the `,` or
        # `}` of a flow mapping (the rest of the line is the user's)
        if self._ends is None:
            self._ends = _plain_ends("".join(self.lines))
        stop = self._ends.get((row, col))
        if stop is None or stop[0] != row:
            raise TargetError(
                f"{self.where}: line {row + 1}: a plain value spans several lines; cannot "
                "edit it in place"
            )
        return line[:col] + yaml_scalar(value, flow) + line[stop[1] :]


def _plain_ends(text: str) -> dict[tuple[int, int], tuple[int, int]]:
    """Where each plain scalar of ``text`` ends (line, column), by where it starts."""
    ends = {}
    for event in pyyaml.parse(text, Loader=_TextLoader):
        if isinstance(event, pyyaml.ScalarEvent) and not event.style:  # None, or "" from C
            start, end = event.start_mark, event.end_mark
            assert start is not None and end is not None  # the parser marks every event
            ends[start.line, start.column] = (end.line, end.column)
    return ends


def _closing_quote(text: str, quote: str) -> int:
    index = 1
    while index < len(text):
        char = text[index]
        if quote == '"' and char == "\\":
            index += 2
            continue
        if char == quote:
            if quote == "'" and text[index + 1 : index + 2] == "'":
                index += 2
                continue
            return index
        index += 1
    return -1


def _value_line(mapping: CommentedMap, key: Any) -> int:
    """The line (0-based) of ``mapping[key]``'s value. ruamel.yaml places an empty value
    (``digest:`` and nothing after it) where the next token starts: the next key's line,
    or past the end of the file. Its line is its key's."""
    key_line, key_col = mapping.lc.key(key)
    line, col = mapping.lc.value(key)
    # a value on a later line is indented deeper than its key (`digest:` newline `  ~`)
    if mapping[key] is None and line > key_line and col <= key_col:
        return int(key_line)
    return int(line)


_KEY_COLON = re.compile(r":(?=[ \t\r\n]|$)")


def _scalar_at(splicer: _Splicer, mapping: CommentedMap, key: Any) -> tuple[int, int, bool]:
    """Where ``mapping[key]``'s scalar value stands (line, column), and whether it is
    empty: an empty value has no text to replace, so its column is just after the key's
    colon, where the new value is filled in."""
    line, col = mapping.lc.value(key)
    if mapping[key] is not None:
        return line, col, False
    if _value_line(mapping, key) == line:
        rest = splicer.lines[line][col:].strip()
        # `~` or `null`: text to replace; not what ends a flow mapping's empty value
        if rest and not rest.startswith(("#", ",", "}", "]")):
            return line, col, False
    line, col = mapping.lc.key(key)
    text = splicer.lines[line]
    if text[col : col + 1] in ('"', "'"):
        col += _closing_quote(text[col:], text[col])
    colon = _KEY_COLON.search(text, col)
    if colon is None:
        raise TargetError(
            f"{splicer.where}: line {line + 1}: cannot find the ':' after the key {key}; "
            f"write it as '{key}:' on one line"
        )
    return line, colon.end(), True


def _set_scalar(splicer: _Splicer, mapping: CommentedMap, key: Any, value: str) -> None:
    line, col, empty = _scalar_at(splicer, mapping, key)
    flow = getattr(mapping, "fa", None) is not None and bool(mapping.fa.flow_style())
    if empty:
        splicer.fill_empty(line, col, value, flow)
    else:
        splicer.replace_scalar(line, col, value, flow)


def _last_line(node: Any, fallback: int) -> int:
    """The last line a block node's content uses (0-based)."""
    last = fallback
    if isinstance(node, CommentedMap):
        for key in node:
            last = max(last, node.lc.key(key)[0])
            value = node[key]
            last = max(
                last,
                _last_line(value, node.lc.value(key)[0])
                if isinstance(value, (dict, list))
                else _value_line(node, key),
            )
    elif isinstance(node, CommentedSeq):
        for index, value in enumerate(node):
            line = node.lc.item(index)[0]
            last = max(last, _last_line(value, line) if isinstance(value, (dict, list)) else line)
    return last


def _refuse_anchors(splicer: _Splicer, first: int, last: int, what: str) -> None:
    """Refuse an edit of lines ``first`` to ``last`` (0-based) that an anchor and its
    aliases share: an alias there would be edited where its anchor stands (or lost), and
    an edit of an aliased node would change every alias too."""
    spans: list[tuple[str, str, int, int]] = []  # (&/*, name, first line, last line)
    open_: list[list[Any]] = []  # [anchor, first line, last line] of each open collection
    for event in pyyaml.parse("".join(splicer.lines)):
        start, end = _lines_of(event)
        if isinstance(event, (pyyaml.MappingStartEvent, pyyaml.SequenceStartEvent)):
            open_.append([event.anchor, start, start])
            continue
        if isinstance(event, (pyyaml.MappingEndEvent, pyyaml.SequenceEndEvent)):
            anchor, start, end = open_.pop()
            if anchor:
                spans.append(("&", anchor, start, end))
        elif isinstance(event, pyyaml.AliasEvent):
            spans.append(("*", str(event.anchor), start, end))
        elif isinstance(event, pyyaml.ScalarEvent):
            if event.anchor:
                spans.append(("&", event.anchor, start, end))
        else:
            continue
        if open_:
            open_[-1][2] = max(open_[-1][2], end)
    aliased = {name for sign, name, _, _ in spans if sign == "*"}
    for sign, name, start, end in spans:
        if start <= last and end >= first and (sign == "*" or name in aliased):
            raise TargetError(
                f"{splicer.where}: {what} uses the YAML {'alias' if sign == '*' else 'anchor'} "
                f"{sign}{name}, which an edit would break or carry to its other uses; write "
                "the value out to let fabrique edit it"
            )


def _lines_of(event: Any) -> tuple[int, int]:
    """The first and last line (0-based) of a YAML event."""
    return event.start_mark.line, event.end_mark.line


def _flow_items(splicer: _Splicer, line: int, col: int) -> tuple[list[str], int, int]:
    """The source text of each item of the flow collection whose bracket opens at
    (``line``, ``col``), each on one line, and the line and column of the bracket that
    closes it. A comment inside it, or a quoted value across lines, cannot be kept."""
    items: list[str] = []
    current: list[str] = []
    depth, quote, previous = 1, "", "["
    row, column = line, col + 1
    while row < len(splicer.lines):
        text = splicer.lines[row].rstrip("\r\n")
        while column < len(text):
            char = text[column]
            column += 1
            if quote:
                current.append(char)
                if quote == '"' and char == "\\":
                    current.append(text[column : column + 1])
                    column += 1
                elif quote == "'" and char == "'" and text[column : column + 1] == "'":
                    current.append("'")
                    column += 1
                elif char == quote:
                    quote, previous = "", char
                continue
            if char == "#" and (column == 1 or text[column - 2] in " \t"):
                raise TargetError(
                    f"{splicer.where}: a comment inside a flow-style collection ([…] or {{…}}) "
                    "cannot be kept when fabrique writes it out; move it out of the brackets"
                )
            if char in "'\"" and previous in "[{,:":
                quote = char
            elif char in "[{":
                depth += 1
            elif char in "]}":
                depth -= 1
                if depth == 0:
                    items.append("".join(current).strip())
                    return [item for item in items if item], row, column - 1
            elif char == "," and depth == 1:
                items.append("".join(current).strip())
                current, previous = [], ","
                continue
            current.append(char)
            if not char.isspace():
                previous = char
        if quote:
            raise TargetError(
                f"{splicer.where}: a quoted value spans several lines; cannot edit it in place"
            )
        current.append(" ")
        row += 1
        if row < len(splicer.lines):
            column = len(splicer.lines[row]) - len(splicer.lines[row].lstrip())
    raise TargetError(f"{splicer.where}: a flow-style collection is never closed")


@dataclass(frozen=True)
class _Flow:
    """A flow collection alone on its lines: its items' source text, where it starts
    and ends, what stands before its bracket and the comment after it."""

    items: list[str]
    first: int
    last: int
    before: str
    comment: str


def _flow(splicer: _Splicer, node: Any, at: tuple[int, int], lead: str, what: str) -> _Flow | None:
    """``node`` as a ``_Flow`` when it is a flow collection, opening at ``at`` after text
    that matches ``lead`` (``  images: ``, ``- ``); None when it is in block style.
    ruamel.yaml marks no empty collection as flow style: ``[]``, ``[ ]`` and ``{}`` are
    known by their bracket, so that each is written out as the others are."""
    line, col = at
    if len(node):
        if getattr(node, "fa", None) is None or not node.fa.flow_style():
            return None
    elif line >= len(splicer.lines) or splicer.lines[line][col : col + 1] not in ("[", "{"):
        return None
    items, last, end = _flow_items(splicer, line, col)
    before = splicer.lines[line][:col]
    after = splicer.lines[last][end + 1 :].strip()
    if not re.fullmatch(lead, before) or (after and not after.startswith("#")):
        raise TargetError(
            f"{splicer.where}: {what} is in flow style and shares its lines with other "
            "content; write it in block style"
        )
    if len(items) != len(node):
        raise TargetError(f"{splicer.where}: cannot split {what} into its {len(node)} items")
    return _Flow(items, line, last, before, f" {after}" if after else "")


def _indent(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def _replace_flow(splicer: _Splicer, flow: _Flow, lines: list[str]) -> None:
    """Put ``lines`` where ``flow`` stood, its comment at the end of the first one."""
    for row in range(flow.last, flow.first - 1, -1):
        splicer.delete_line(row)
    text = "".join(line + (flow.comment if n == 0 else "") + "\n" for n, line in enumerate(lines))
    splicer.insert_after(flow.first, text)


def _write_out_empty(
    splicer: _Splicer, parent: CommentedMap, key: str, lines: list[str], what: str
) -> bool:
    """Write out ``key: {}`` (``{ }``, ``[]``, over lines, a comment after it) in block
    style, or ``key:`` with no value, ``lines`` under it one level deeper and the comment
    kept on the key's line. False, and nothing done, when ``parent[key]`` is neither an
    empty flow collection nor empty; a null written out (``~``) is refused."""
    node = parent[key]
    if node is None:
        line, col, empty = _scalar_at(splicer, parent, key)
        if not empty:
            null = splicer.lines[line][col:].split("#")[0].strip()
            raise TargetError(
                f"{splicer.where}: {what} is null ({null}); leave it empty ('{key}:') or "
                "remove the key"
            )
        inner = " " * (parent.lc.key(key)[1] + 2)
        splicer.insert_after(line, "".join(f"{inner}{text}\n" for text in lines))
        return True
    if len(node):
        return False
    lead = rf"[ \t]*{re.escape(key)}:[ \t]*"
    flow = _flow(splicer, node, parent.lc.value(key), lead, what)
    if flow is None:
        return False
    inner = _indent(flow.before) + "  "
    _replace_flow(splicer, flow, [flow.before.rstrip(), *(inner + line for line in lines)])
    return True


def _block_entry(entry: dict[str, Any], pad: str, where: str, image: str) -> list[str]:
    """A kustomize images entry in block style, its list dash at ``pad``."""
    lines: list[str] = []
    for field, value in entry.items():
        if isinstance(value, (dict, list)):
            raise TargetError(f"{where}: images entry {image}.{field} must be a string")
        text = "" if value is None else " " + yaml_scalar(str(value))
        lines.append(f"{pad}{'- ' if not lines else '  '}{field}:{text}")
    return lines or [f"{pad}- {{}}"]


def _require_block(node: Any, where: str, what: str) -> None:
    if getattr(node, "fa", None) is not None and node.fa.flow_style():
        raise TargetError(
            f"{where}: {what} is in flow style ([…] or {{…}}); write it in block style"
        )


def _dash_col(splicer: _Splicer, seq: CommentedSeq) -> int:
    line, col = seq.lc.item(0)
    dash = splicer.lines[line].rfind("-", 0, col)
    if dash < 0:
        raise TargetError(f"{splicer.where}: cannot find the '-' of a list item")
    return dash


def _pin_kustomize(
    splicer: _Splicer, data: CommentedMap, raw: Any, pin: ImagePin, where: str
) -> None:
    images = _kustomize_images(data, where)
    if images is None:
        splicer.append("images:\n" + _kustomize_entry_lines(pin, dash_col=0))
        return
    line = data.lc.key("images")[0]
    _refuse_anchors(splicer, line, _last_line(images, line), "images")
    found = _kustomize_entry(images, pin, where)
    edited = copy.deepcopy(raw)
    _expect_kustomize(edited, pin)
    index = len(images) if found is None else found[0]
    # the entry as it will read, kustomize's fields first (a field left empty stays so)
    now, then = (found[1] if found else {}), edited["images"][index]
    ours = {field: then[field] for field in KUSTOMIZE_FIELDS if field in then}
    ours.update((f, None if now.get(f) is None else v) for f, v in then.items() if f not in ours)
    flow = _flow(splicer, images, data.lc.value("images"), r"[ \t]*images:[ \t]*", "images")
    if flow is not None:  # `images: [{…}, …]` or `[]`: written out, the others as they were
        dash = _indent(flow.before)
        lines = [flow.before.rstrip()]
        for item, text in enumerate([*flow.items, None]):
            if item == index:
                lines += _block_entry(ours, dash, where, pin.image)
            elif text is not None:
                lines.append(f"{dash}- {text}")
        _replace_flow(splicer, flow, lines)
        return
    _require_block(images, where, "images")
    if found is None:
        if not images:
            raise TargetError(
                f"{where}: images is an empty list; write the entry or remove the key"
            )
        line = _last_line(images, images.lc.item(len(images) - 1)[0])
        splicer.insert_after(line, _kustomize_entry_lines(pin, _dash_col(splicer, images)))
        return
    index, entry = found
    raw_entry = raw["images"][index]
    what = f"the images entry for {pin.image}"
    flow = _flow(splicer, entry, images.lc.item(index), r"[ \t]*-[ \t]*", what)
    if flow is not None:  # `- {name: …, newTag: …}`: written out
        _replace_flow(splicer, flow, _block_entry(ours, _indent(flow.before), where, pin.image))
        return
    _require_block(entry, where, what)
    key_col = entry.lc.key(next(iter(entry)))[1]
    wanted = {"newName": pin.new_name, "newTag": pin.tag, "digest": pin.digest}
    for field, value in wanted.items():
        if value is None:
            continue
        if field in entry:
            if isinstance(entry[field], (dict, list)):
                raise TargetError(f"{where}: images entry {pin.image}.{field} must be a string")
            if entry[field] is None or str(raw_entry[field]) != value:
                _set_scalar(splicer, entry, field, value)
            continue
        # a missing field goes after the last of the fields that come before it
        before = [k for k in KUSTOMIZE_FIELDS[: KUSTOMIZE_FIELDS.index(field)] if k in entry]
        anchor = (
            _value_line(entry, before[-1])
            if before
            else _last_line(entry, entry.lc.key(next(iter(entry)))[0])
        )
        splicer.insert_after(anchor, f"{' ' * key_col}{field}: {yaml_scalar(value)}\n")


def _pin_application(splicer: _Splicer, source: CommentedMap, pin: ImagePin, where: str) -> None:
    value = _argocd_value(None, pin)
    images = _source_images(source, where)
    first = source.lc.key(next(iter(source)))[0] if source else source.lc.line
    _refuse_anchors(splicer, first, _last_line(source, first), "the Application source")
    _require_block(source, where, "the Application source")
    if images is None:
        key_col = source.lc.key(next(iter(source)))[1]
        pad = " " * key_col
        last = _last_line(source, source.lc.key(next(iter(source)))[0])
        if "kustomize" in source:
            kustomize = source["kustomize"]
            lines = ["images:", f"- {yaml_scalar(value)}"]
            if _write_out_empty(splicer, source, "kustomize", lines, "kustomize"):
                return
            _require_block(kustomize, where, "kustomize")
            inner = " " * kustomize.lc.key(next(iter(kustomize)))[1] if kustomize else pad + "  "
            splicer.insert_after(
                _last_line(kustomize, source.lc.key("kustomize")[0]),
                f"{inner}images:\n{inner}- {yaml_scalar(value)}\n",
            )
        else:
            splicer.insert_after(
                last, f"{pad}kustomize:\n{pad}  images:\n{pad}  - {yaml_scalar(value)}\n"
            )
        return
    kept, dropped = _application_entries([str(v) for v in images], pin)
    at = source["kustomize"].lc.value("images")
    flow = _flow(splicer, images, at, r"[ \t]*images:[ \t]*", "kustomize.images")
    if flow is not None:  # `images: [a, b]` or `[]`: written out, the others as they were
        dash = _indent(flow.before)
        lines = [flow.before.rstrip()]
        for item, text in enumerate(flow.items):
            if item in kept:
                lines.append(f"{dash}- {yaml_scalar(kept[item])}")
            elif item not in dropped:
                lines.append(f"{dash}- {text}")
        if not kept:
            lines.append(f"{dash}- {yaml_scalar(value)}")
        _replace_flow(splicer, flow, lines)
        return
    _require_block(images, where, "kustomize.images")
    if not kept:
        if not images:
            raise TargetError(
                f"{where}: kustomize.images is an empty list; write the entry or remove the key"
            )
        line = _last_line(images, images.lc.item(len(images) - 1)[0])
        splicer.insert_after(line, f"{' ' * _dash_col(splicer, images)}- {yaml_scalar(value)}\n")
        return
    for index, wanted in kept.items():
        if str(images[index]) != wanted:
            line, col = images.lc.item(index)
            splicer.replace_scalar(line, col, wanted)
    for index in dropped:
        splicer.delete_line(images.lc.item(index)[0])
