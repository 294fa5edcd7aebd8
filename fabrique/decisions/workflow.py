"""The Workflow object that starts one build: the same body for every caller.

``fabrique submit``, the Sensor and the reconciler all create this object, named
``fabrique-<app>-<sha12>``; the Kubernetes API refuses the second one with 409.
"""

from __future__ import annotations

import hashlib
import shlex
from typing import Any

from fabrique.site.config import Site
from fabrique.site.names import (
    ANNOTATION_REVISION,
    GROUP_PARAMETER,
    LABEL_APP,
    LABEL_MANAGED_BY,
    LABEL_PART_OF,
    LABEL_PUSH,
    LABEL_REVISION,
    LABEL_SUBMITTED_BY,
    SHORT_SHA_LEN,
    TEMPLATE_NAME,
    VERIFY_PREFIX,
    VERIFY_TEMPLATE,
    check_revision,
    workflow_name,
)

API_VERSION = "argoproj.io/v1alpha1"


def build_workflow(
    site: Site,
    app: str,
    revision: str,
    *,
    submitted_by: str,
    force: bool = False,
    group: str | None = None,
) -> dict[str, Any]:
    """The Workflow for building ``app`` at ``revision`` from the ``fabrique-build`` template.

    ``force`` builds even if nothing under the app's context changed (the plan step's check).
    ``group``: the push's Workflow that writes this build's digest with its other builds'
    (``writeback.batch``); the build itself then writes nothing.
    """
    site.app(app)
    body = workflow_object(
        site, app, workflow_name(app, check_revision(revision)), revision, submitted_by=submitted_by
    )
    if force:
        body["spec"]["arguments"]["parameters"].append({"name": "force", "value": "true"})
    if group:
        body["metadata"]["labels"][LABEL_PUSH] = group
        body["spec"]["arguments"]["parameters"].append({"name": GROUP_PARAMETER, "value": group})
    return body


def workflow_object(
    site: Site, app: str, name: str, revision: str, *, submitted_by: str | None
) -> dict[str, Any]:
    """The Workflow body itself. ``build_workflow`` checks its inputs; the Sensor fills
    ``name`` and ``revision`` from the push event (``NAME_DEST``, ``REVISION_DESTS``,
    ``SHORT_REVISION_DESTS``). The revision label holds its first 12 characters (a label
    value holds at most 63, a SHA-256 commit 64), the annotation the whole. Without
    ``submitted_by`` (the Sensor's) there is no ``fabrique.io/submitted-by`` label."""
    labels = {
        LABEL_APP: app,
        LABEL_REVISION: revision[:SHORT_SHA_LEN],
        LABEL_PART_OF: "fabrique",
        LABEL_MANAGED_BY: "fabrique",
    }
    if submitted_by is not None:
        labels[LABEL_SUBMITTED_BY] = submitted_by
    return {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": site.namespaces.build,
            "labels": labels,
            "annotations": {ANNOTATION_REVISION: revision},
        },
        "spec": {
            "workflowTemplateRef": {"name": TEMPLATE_NAME},
            "arguments": {
                "parameters": [
                    {"name": "app", "value": app},
                    {"name": "revision", "value": revision},
                ]
            },
        },
    }


def verify_workflow(site: Site, app: str, env: str, digest: str) -> dict[str, Any]:
    """The Workflow that looks at environment ``env`` of ``app`` after ``digest`` was
    promoted there, from the ``fabrique-verify`` template, in the control namespace. Its
    name is ``fabrique-verify-`` and 12 hex digits of the three, so that writing the same
    digest again is a 409, not a second look (and any app or environment name fits)."""
    key = hashlib.sha256(f"{app}\n{env}\n{digest}".encode()).hexdigest()[:SHORT_SHA_LEN]
    return {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {
            "name": f"{VERIFY_PREFIX}{key}",
            "namespace": site.namespaces.control,
            "labels": {
                LABEL_APP: app,
                "fabrique.io/environment": env,
                LABEL_PART_OF: "fabrique",
                LABEL_MANAGED_BY: "fabrique",
            },
            "annotations": {"fabrique.io/digest": digest},
        },
        "spec": {
            "workflowTemplateRef": {"name": VERIFY_TEMPLATE},
            "arguments": {
                "parameters": [{"name": "app", "value": app}, {"name": "env", "value": env}]
            },
        },
    }


# Where the Sensor writes the pushed commit into ``workflow_object``: sjson paths, as
# Argo Events' trigger parameters take them (dots inside a key escaped).
REVISION_DESTS = (
    "spec.arguments.parameters.1.value",
    "metadata.annotations.fabrique\\.io/revision",
)
SHORT_REVISION_DESTS = ("metadata.labels.fabrique\\.io/revision",)
NAME_DEST = "metadata.name"


def argo_submit_line(body: dict[str, Any], *, context: str | None = None) -> str:
    """The ``argo submit`` command line that creates ``body`` (a ``build_workflow``): the
    same name, namespace, template, parameters and labels, so that either way of
    submitting builds the same commit under the same name. ``argo submit`` sets no
    annotation: the full revision is in the ``revision`` parameter there."""
    meta, spec = body["metadata"], body["spec"]
    words = ["argo", "submit"]
    if context:
        words += ["--context", context]
    words += [
        "-n",
        meta["namespace"],
        "--from",
        f"workflowtemplate/{spec['workflowTemplateRef']['name']}",
    ]
    words += ["--name", meta["name"]]
    for parameter in spec["arguments"]["parameters"]:
        words += ["-p", f"{parameter['name']}={parameter['value']}"]
    words += ["-l", ",".join(f"{key}={value}" for key, value in meta["labels"].items())]
    return shlex.join(words)
