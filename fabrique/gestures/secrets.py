"""Derived Secrets: made from the keys of another Secret, declared, never typed by hand.

A site declares ``derivedSecrets: [{from: postgres/pg-role-pgvector, to:
dagster/pgvector-pg-auth, keys: {username: username, password: password}}]``. The target
holds exactly those keys, copied from the source (which CloudNativePG, say, produced),
and is labelled as fabrique's. The same content makes no change; the source is only
read; a target that fabrique did not make is never overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fabrique.clients.kube import KubeClient
from fabrique.site.config import DerivedSecret, Site
from fabrique.site.errors import InputError
from fabrique.site.names import LABEL_MANAGED_BY

DERIVED_FROM = "fabrique.io/derived-from"


@dataclass(frozen=True)
class Derived:
    target: str
    state: str  # changed | unchanged
    detail: str


def _split(ref: str) -> tuple[str, str]:
    namespace, name = ref.split("/", 1)
    return namespace, name


def wanted(site: Site, app: str | None) -> list[DerivedSecret]:
    return [d for d in site.derived_secrets if app is None or d.app in (None, app)]


def derive(kube: KubeClient, derivation: DerivedSecret, *, dry_run: bool) -> Derived:
    source_ns, source_name = _split(derivation.from_)
    target_ns, target_name = _split(derivation.to)
    source = kube.get_secret(source_ns, source_name)
    if source is None:
        raise InputError(f"derivedSecrets: source Secret {derivation.from_} not found")
    source_data = source.get("data") or {}
    data = {}
    for target_key, source_key in sorted(derivation.keys.items()):
        if source_key not in source_data:
            raise InputError(
                f"derivedSecrets: Secret {derivation.from_} has no key {source_key!r} "
                f"(needed for {derivation.to} key {target_key!r})"
            )
        data[target_key] = source_data[source_key]
    existing = kube.get_secret(target_ns, target_name)
    labels = {LABEL_MANAGED_BY: "fabrique"}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": target_name,
            "namespace": target_ns,
            "labels": labels,
            "annotations": {DERIVED_FROM: derivation.from_},
        },
        "type": "Opaque",
        "data": data,
    }
    keys = ", ".join(sorted(data))
    if existing is None:
        if not dry_run:
            kube.create_secret(body)
        return Derived(derivation.to, "changed", f"created with {keys} from {derivation.from_}")
    meta = existing.get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL_MANAGED_BY) != "fabrique":
        raise InputError(
            f"derivedSecrets: Secret {derivation.to} exists and fabrique did not make it; "
            "refusing to overwrite it (delete it, or label it "
            "app.kubernetes.io/managed-by=fabrique)"
        )
    same = (
        existing.get("data") == data
        and (meta.get("annotations") or {}).get(DERIVED_FROM) == derivation.from_
    )
    if same:
        return Derived(derivation.to, "unchanged", f"{keys} as in {derivation.from_}")
    if not dry_run:
        body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
        kube.replace_secret(body)
    return Derived(derivation.to, "changed", f"{keys} updated from {derivation.from_}")
