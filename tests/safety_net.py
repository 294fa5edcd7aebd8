"""What the reconcile pass's safety net makes of a failed step, when the exit handler's
report was lost: the step's node read from the Workflow, repaired into a commit status."""

from __future__ import annotations

from fabrique.clients.kube import workflow_state
from fabrique.decisions import status


def repaired_from_node(display_name: str, message: str) -> status.Report | None:
    """The report ``status.repair`` makes of a Workflow failed at one pod node
    ``display_name`` whose message is ``message`` (nothing deployed yet)."""
    node = {"type": "Pod", "phase": "Failed", "displayName": display_name, "message": message}
    state = workflow_state("wf", {"status": {"phase": "Failed", "nodes": {"n": node}}})
    return status.repair(
        "failed", None, deployed_is_want=False, deployed_digest=None, workflow="wf",
        phase="Failed", reason=state.reason,
    )  # fmt: skip
