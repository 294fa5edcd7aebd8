"""The rendered tree on a real API server: it applies whole, a replay changes nothing,
and the CronWorkflows and the admission policy are what the server takes them for."""

from __future__ import annotations

import json
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


def test_a_controllers_status_patch_is_no_change_of_the_tree(
    cluster: Cluster, applied: Path
) -> None:
    """Argo's cron controller merge-patches a CronWorkflow's status at its ticks
    (``persistUpdate``, workflow/cron/operator.go); the CRD has no status subresource, so
    the object's generation moves. The tree was not applied: no change of it."""
    before = cluster.versions(applied)
    answer = cluster.request(
        "PATCH",
        f"{ARGO}/namespaces/fabrique/cronworkflows/fabrique-reconcile",
        {"status": {"phase": "Active", "lastScheduledTime": "2026-12-06T07:00:00Z"}},
        content_type="application/merge-patch+json",
    )
    assert answer.status == 200, answer.message
    assert cluster.versions(applied) == before


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


def test_the_planes_etcd_refuses_what_validate_refuses(cluster: Cluster, applied: Path) -> None:
    """The plane's etcd runs with its default request limit, as a platform team's does,
    and it is the limit ``fabrique validate`` sizes objects against: a custom resource
    (stored as its JSON) under it by a margin (the key, the server's own metadata) is
    stored, one over it is refused by the API server with etcd's answer."""
    from fabrique.site.limits import ETCD_REQUEST_LIMIT

    namespace = "size-check"
    path = f"{ARGO}/namespaces/{namespace}/workflowtemplates"

    def template(name: str, size: int) -> dict[str, object]:
        def doc(source: str) -> dict[str, object]:
            script = {"image": "registry:80/base/busybox:1.35", "source": source}
            spec = {"entrypoint": "main", "templates": [{"name": "main", "script": script}]}
            meta = {"name": name, "namespace": namespace}
            return {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate",
                    "metadata": meta, "spec": spec}  # fmt: skip

        framing = len(json.dumps(doc(""), separators=(",", ":")))
        return doc("x" * (size - framing))

    created = cluster.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    assert created.status == 201, created.message
    try:
        stored = cluster.create(path, template("under", ETCD_REQUEST_LIMIT - 16 * 1024))
        assert stored.status == 201, stored.message
        refused = cluster.create(path, template("over", ETCD_REQUEST_LIMIT + 1))
        assert refused.status >= 400 and "request is too large" in refused.message, refused
        assert not cluster.exists(f"{path}/over")
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{namespace}")


def test_the_api_server_refuses_the_config_map_validate_refuses(
    cluster: Cluster, applied: Path
) -> None:
    """A ConfigMap's data is capped by the API server's own validation at 1 MiB, far
    under etcd's limit, as ``fabrique validate`` reckons it: one at the limit is stored,
    one byte more is refused, and nothing is stored of it."""
    from fabrique.site.limits import DATA_LIMIT

    namespace = "data-check"
    path = f"/api/v1/namespaces/{namespace}/configmaps"

    def config_map(name: str, size: int) -> dict[str, object]:
        return {"metadata": {"name": name}, "data": {"values.yaml": "x" * size}}

    created = cluster.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    assert created.status == 201, created.message
    try:
        stored = cluster.create(path, config_map("at-the-limit", DATA_LIMIT))
        assert stored.status == 201, stored.message
        refused = cluster.create(path, config_map("over", DATA_LIMIT + 1))
        assert refused.status == 422, refused
        assert f"Too long: may not be more than {DATA_LIMIT} bytes" in refused.message, refused
        assert not cluster.exists(f"{path}/over")
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{namespace}")
