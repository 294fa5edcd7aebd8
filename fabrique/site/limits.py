"""The limits a rendered object meets on its way into a cluster: etcd's, for any object,
and Linux's, for the objects Argo Events hands its pods as one environment variable.
Render keeps under them (the Sensors are split); validate refuses what is over."""

from __future__ import annotations

import base64
import json
from typing import Any

# etcd's default --max-request-bytes (embed.DefaultMaxRequestBytes): the largest write a
# default cluster's etcd takes, its key and the request's framing included
ETCD_REQUEST_LIMIT = 1536 * 1024
# the API server's own limit on a ConfigMap's data and binaryData, or a Secret's data,
# summed (core.MaxSecretSize, pkg/apis/core/validation: ValidateConfigMap, ValidateSecret)
DATA_LIMIT = 1024 * 1024
# the API server's limit on all of an object's annotations together
# (TotalAnnotationSizeLimitB, apimachinery pkg/api/validation/objectmeta.go). kubectl's
# client-side apply keeps the whole object it applied, as JSON, in the annotation
# kubectl.kubernetes.io/last-applied-configuration: an object larger than this cannot be
# applied that way (`metadata.annotations: Too long`), only server-side.
ANNOTATIONS_LIMIT = 256 * 1024


# Linux's limit on one environment variable ("NAME=value" and its NUL: MAX_ARG_STRLEN,
# 32 pages of 4 KiB). The Argo Events controller hands its pod the whole EventSource or
# Sensor as one variable, base64 JSON of its name, namespace and spec (SENSOR_OBJECT,
# EVENTSOURCE_OBJECT; pkg/reconciler/*/resource.go): over it, the container does not
# start, "argument list too long" (argo-events#2146). For a Sensor that is about 96 KiB
# of JSON, far below etcd's 1.5 MiB.
POD_ENV_LIMIT = 32 * 4096
POD_ENV = {"Sensor": "SENSOR_OBJECT", "EventSource": "EVENTSOURCE_OBJECT"}
# What Go's encoding/json writes beside the fields fabrique sets: zero values it does not
# omit (creationTimestamp, status, loggingFields, the container's resources: 98 bytes for
# the Sensor; tests/live/test_events.py compares with the controller's own), rounded up
GO_ZERO_FIELDS = 128


def data_size(doc: dict[str, Any]) -> int:
    """The bytes of a ConfigMap's or a Secret's data as the API server sums them: the
    values of ``data`` and ``stringData`` as text, those of ``binaryData`` (and a
    Secret's ``data``) decoded from base64. A value that does not decode counts as
    written: validation names it elsewhere."""

    def text(values: Any) -> dict[str, int]:
        return {k: len(str(v).encode()) for k, v in (values or {}).items()}

    def decoded(values: Any) -> dict[str, int]:
        sizes = {}
        for key, value in (values or {}).items():
            try:
                sizes[key] = len(base64.b64decode(str(value), validate=True))
            except ValueError:
                sizes[key] = len(str(value).encode())
        return sizes

    if doc.get("kind") == "Secret":  # stringData is merged into data, and wins
        return sum({**decoded(doc.get("data")), **text(doc.get("stringData"))}.values())
    return sum(text(doc.get("data")).values()) + sum(decoded(doc.get("binaryData")).values())


# What Go's encoding/json escapes that Python's json writes as it is: HTML's three
# characters (json.Marshal's default, HTMLEscape) and the JavaScript line separators.
_GO_ESCAPES = str.maketrans({c: f"\\u{ord(c):04x}" for c in ("<", ">", "&", "\u2028", "\u2029")})


def go_json(value: Any) -> bytes:
    """``value`` as compact JSON the way Go's ``json.Marshal`` writes it: UTF-8, with
    ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as ``\\u003c`` and so on (six bytes
    where Python's writes one to three)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.translate(_GO_ESCAPES).encode()


def pod_env_size(doc: dict[str, Any]) -> int:
    """The bytes of the variable that hands ``doc`` (a Sensor or an EventSource) to its
    pod: ``NAME=`` and the base64 JSON (``go_json``) of its name, namespace and spec, and
    a NUL; at most ``GO_ZERO_FIELDS`` of JSON above what the controller makes."""
    meta = doc.get("metadata") or {}
    handed = {
        "metadata": {"name": meta.get("name", ""), "namespace": meta.get("namespace", "")},
        "spec": doc["spec"],
    }
    encoded = len(base64.b64encode(go_json(handed) + b" " * GO_ZERO_FIELDS))
    return len(POD_ENV[doc["kind"]]) + 1 + encoded + 1
