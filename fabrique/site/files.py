"""The site as the pods read it: the files render splits it into, one ConfigMap each.

Below ``fabrique.render`` and ``pipelines``: render writes these files into the site's
ConfigMaps, and the Workflow kinds project every one of them into their pods.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import APPS_FROM, Site, json_line, shard_digest
from .limits import ANNOTATIONS_LIMIT, go_json
from .names import SITE_CONFIGMAP


@dataclass(frozen=True)
class SiteFile:
    """One file of the site as the pods read it: the key of a ConfigMap of its own."""

    configmap: str
    key: str
    text: str


# Each site ConfigMap's data, as the JSON an API client sends it, stays under this: far
# below the API server's 1 MiB, so that kubectl's client-side apply (and Argo CD's, by
# default), which keeps a copy of the whole object in the
# kubectl.kubernetes.io/last-applied-configuration annotation, stays under the 256 KiB
# that all of an object's annotations may hold, with room for a deploy tool's own.
SITE_DATA_TARGET = 3 * ANNOTATIONS_LIMIT // 4

# the last sites split, by identity (each held, so that its id is not reused): a render
# names one site's files in every pod spec and both namespaces, and pipelines' own
# module-level objects split the site of FABRIQUE_VALUES on their first import
_splits: dict[int, tuple[Site, list[SiteFile]]] = {}
_SPLITS_KEPT = 4


def site_files(site: Site) -> list[SiteFile]:
    """The site as the tools image reads it (``FABRIQUE_VALUES``), in as few files as
    keep each under ``SITE_DATA_TARGET``, one ConfigMap each. ``site.yaml`` (ConfigMap
    ``fabrique-site``) holds every setting and the first apps; when they do not all fit,
    its ``appsFrom`` names the files the apps go on in, in order, ``site-2.yaml``
    (``fabrique-site-2``) and on, each with its sha256 (``fabrique.site.config``). Apps
    are packed in the site's order: an app added at the end changes the last file and
    ``site.yaml``; one added or grown before moves the later files' boundaries. It holds
    no token.

    Each file is JSON, which is YAML too, laid out to be read: one setting a line, one
    app a line (what it sets, less what it would take by default). Every push's plan and
    every build pod load the site: the loader parses JSON in C, ten thousand apps in a
    tenth of a second, where their YAML took three."""
    if id(site) in _splits:
        return _splits[id(site)][1]
    values = site.to_values()
    del values["apps"]
    settings = {key: json_line(value) for key, value in values.items()}
    dumped = site.model_dump(mode="json", by_alias=True, exclude_defaults=True, include={"apps"})
    items = [json_line(app) for app in dumped["apps"]]

    def weight(text: str) -> int:  # as the JSON of the ConfigMap carries it
        return len(go_json(text)) - 2

    sizes = [weight(item + ",\n") for item in items]
    bound = sum(sizes) // max(SITE_DATA_TARGET - max(sizes), 1) + 2  # files, at most
    # site.yaml without its apps, and an appsFrom of as many files as there may be
    entry = json_line({"file": f"site-{bound + 1}.yaml", "sha256": shard_digest("")})
    budget = SITE_DATA_TARGET - weight(_site_yaml(settings, [], [entry] * bound))
    shards: list[list[str]] = [[]]
    for item, size in zip(items, sizes, strict=True):
        if shards[-1] and size > budget:
            shards.append([])
            budget = SITE_DATA_TARGET - weight(_json_list([]))
        shards[-1].append(item)
        budget -= size
    files = [
        SiteFile(f"{SITE_CONFIGMAP}-{number}", f"site-{number}.yaml", _json_list(shard))
        for number, shard in enumerate(shards[1:], start=2)
    ]
    listed = [json_line({"file": f.key, "sha256": shard_digest(f.text)}) for f in files]
    split = [SiteFile(SITE_CONFIGMAP, "site.yaml", _site_yaml(settings, shards[0], listed)), *files]
    while len(_splits) >= _SPLITS_KEPT:
        del _splits[next(iter(_splits))]
    _splits[id(site)] = (site, split)
    return split


def _json_list(lines: list[str]) -> str:
    """A JSON list, one item a line."""
    return "[\n" + ",\n".join(lines) + "\n]\n"


def _site_yaml(settings: dict[str, str], apps: list[str], listed: list[str]) -> str:
    """``site.yaml``: a JSON object, one setting a line, then its apps and the files
    they go on in (``appsFrom``, only when there are any), one a line."""
    members = {**settings, "apps": _json_list(apps).rstrip("\n")}
    if listed:
        members[APPS_FROM] = _json_list(listed).rstrip("\n")
    return (
        "{\n" + ",\n".join(f"{json_line(key)}: {text}" for key, text in members.items()) + "\n}\n"
    )
