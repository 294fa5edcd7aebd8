"""The rendered tree on a real API server: it applies whole, a replay changes nothing,
and the CronWorkflows and the admission policy are what the server takes them for."""

from __future__ import annotations

from pathlib import Path

from .cluster import ARGO, Cluster


def test_the_whole_tree_applies_server_side_and_a_replay_changes_nothing(
    cluster: Cluster, applied: Path
) -> None:
    before = cluster.versions(applied)
    kinds = {key.split("/")[0] for key in before}
    assert {"WorkflowTemplate", "CronWorkflow", "Sensor", "EventSource", "EventBus"} <= kinds
    assert {"ValidatingAdmissionPolicy", "NetworkPolicy", "Role", "Namespace"} <= kinds

    cluster.apply_tree(applied)

    assert cluster.versions(applied) == before, "a replay of the tree changed objects"
    diff = cluster.kubectl("diff", "--server-side", "--field-manager=fabrique", "-k", str(applied))
    assert diff == ""


def test_the_admission_policy_compiles_against_argos_full_crds(
    cluster: Cluster, applied: Path
) -> None:
    """The API server type-checks a policy's CEL against the Workflow CRD's schema: a
    warning there is an expression that errors at admission, and failurePolicy Fail
    then refuses every Workflow."""
    policy = cluster.wait(
        "the policy's type checking",
        lambda: (
            found
            if "typeChecking"
            in (
                found := cluster.get(
                    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/"
                    "fabrique-build-workflows"
                )
            ).get("status", {})
            else None
        ),
    )
    assert policy["status"]["typeChecking"].get("expressionWarnings") is None, policy["status"]


def test_each_cronworkflow_is_accepted(cluster: Cluster, applied: Path) -> None:
    for name in ("fabrique-reconcile", "gitea-mirror-sync"):
        cron = cluster.get(f"{ARGO}/namespaces/fabrique/cronworkflows/{name}")
        assert cron["spec"]["workflowSpec"]["serviceAccountName"]
