"""The Workflow object that starts one build: the same body for every caller.

``fabrique submit``, the Sensor and the reconciler all create this object, named
``fabrique-<app>-<sha12>``; the Kubernetes API refuses the second one with 409.

The name is reused when a Workflow is deleted and submitted again (the safety net does
it for a lost build), and so is its workspace claim's: the Argo controller names the
claim of each ``volumeClaimTemplates`` entry ``<workflow>-<entry>`` (``createPVCs``,
operator.go), and when one of that name exists that another Workflow owns, it fails the
new Workflow for good (``pvc … already exists with different ownerreference``). The old
claim is deleted with its Workflow, but only once the garbage collector gets to it and
its pods have ended (the ``kubernetes.io/pvc-protection`` finalizer). ``submit`` waits,
bounded, for such a claim to be gone before it creates the Workflow.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fabrique.site.config import Site
from fabrique.site.names import (
    ANNOTATION_REVISION,
    LABEL_APP,
    LABEL_MANAGED_BY,
    LABEL_PART_OF,
    LABEL_REVISION,
    LABEL_SUBMITTED_BY,
    SHORT_SHA_LEN,
    TEMPLATE_NAME,
    check_revision,
    workflow_name,
)

if TYPE_CHECKING:  # the Kubernetes client is imported where it is used
    from fabrique.clients.kube import ClaimState, KubeClient

log = logging.getLogger("fabrique.submit")

API_VERSION = "argoproj.io/v1alpha1"
# fabrique-build's one volumeClaimTemplates entry (pipelines/build.py mounts it)
WORKSPACE_VOLUME = "workspace"
# How long a submission waits for an earlier Workflow's claim of the same name to be
# collected: its pods' grace period (30 s by default) and the garbage collector's turn.
CLAIM_WAIT_SECONDS = 120.0
# A pass of the safety net waits less: its deadline may be 60 s (pipelines/reconcile_cron),
# and a claim still there is submitted by a later pass.
PASS_CLAIM_WAIT_SECONDS = 20.0
CLAIM_POLL_SECONDS = 2.0


def build_workflow(
    site: Site, app: str, revision: str, *, submitted_by: str, force: bool = False
) -> dict[str, Any]:
    """The Workflow for building ``app`` at ``revision`` from the ``fabrique-build`` template.

    ``force`` builds even if nothing under the app's context changed (the plan step's check).
    """
    site.app(app)
    body = workflow_object(
        site, app, workflow_name(app, check_revision(revision)), revision, submitted_by=submitted_by
    )
    if force:
        body["spec"]["arguments"]["parameters"].append({"name": "force", "value": "true"})
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


def workspace_claim(workflow: str) -> str:
    """The workspace claim the Argo controller makes for ``workflow``:
    ``<workflow>-<volumeClaimTemplates entry>``."""
    return f"{workflow}-{WORKSPACE_VOLUME}"


@dataclass(frozen=True)
class Submission:
    name: str
    namespace: str
    # created; exists (a Workflow of that name already did: the same build); waiting (an
    # earlier Workflow's claim of the same name outlived the wait: nothing was created)
    outcome: Literal["created", "exists", "waiting"]
    claim: str = ""  # waiting: the claim still there
    waited: float = 0.0  # seconds spent waiting for it

    @property
    def detail(self) -> str:
        if self.outcome == "waiting":
            return (
                f"claim {self.namespace}/{self.claim} of an earlier {self.name} is still "
                f"there after {self.waited:.0f}s; the Workflow is not created until it is "
                "collected (a new one would fail on it)"
            )
        return f"{self.outcome}: workflow {self.namespace}/{self.name}"


def submit(
    kube: KubeClient,
    body: dict[str, Any],
    *,
    wait_seconds: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Submission:
    """Create the Workflow ``body`` once no earlier Workflow's claim holds its claim's name.

    A claim owned by the Workflow of that name that exists now is its own (the create
    then meets 409: the same build). Any other is an earlier one's, being collected: the
    create waits for it, ``wait_seconds`` at most (``CLAIM_WAIT_SECONDS``)."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    bound = CLAIM_WAIT_SECONDS if wait_seconds is None else wait_seconds
    claim = workspace_claim(name)
    start = clock()
    while (blocking := _earlier_claim(kube, namespace, name, claim)) is not None:
        waited = clock() - start
        if waited >= bound:
            return Submission(name, namespace, "waiting", claim, waited)
        log.info(
            "%s: claim %s of an earlier Workflow of that name is %s; waiting",
            name,
            claim,
            "being deleted" if blocking.deleting else "still there",
        )
        sleep(min(CLAIM_POLL_SECONDS, max(bound - waited, 0.0)))
    created = kube.create_workflow(body)
    return Submission(created.name, created.namespace, "created" if created.created else "exists")


def _earlier_claim(kube: KubeClient, namespace: str, name: str, claim: str) -> ClaimState | None:
    """The claim ``claim`` if it exists and the Workflow ``name`` of now does not own it."""
    found = kube.claim(namespace, claim)
    if found is None:
        return None
    current = kube.workflow(namespace, name)
    if current is not None and current.uid and current.uid in found.owners:
        return None
    return found
