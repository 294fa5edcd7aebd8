"""What the live tests ask of the real control plane: plain REST calls (so a test sees
the API server's own status codes and messages), kubectl for kustomize trees, waits,
and the kubelet's and executor's parts that no program plays here.
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from ..waits import until
from .controlplane import ARGO_NAMESPACE, ControlPlane

if TYPE_CHECKING:
    from fabrique.clients.kube import KubeClient

T = TypeVar("T")
ARGO = "/apis/argoproj.io/v1alpha1"
# the controller's annotation on each step pod: the node it runs (the executor's report
# is named after it)
NODE_ID = "workflows.argoproj.io/node-id"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
# where the informer probe writes: the controller's own namespace, which no policy of the
# tree binds and whose Workflows no test counts
PROBE_NAMESPACE = ARGO_NAMESPACE
# the probe's marker: a template that runs no pod
MARKER_TEMPLATE: dict[str, Any] = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "WorkflowTemplate",
    "metadata": {"generateName": "informer-marker-", "namespace": PROBE_NAMESPACE},
    "spec": {"entrypoint": "wait", "templates": [{"name": "wait", "suspend": {}}]},
}


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


class Cluster:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.http = httpx.Client(
            base_url=plane.server,
            headers={"Authorization": f"Bearer {plane.token}"},
            verify=ssl.create_default_context(cafile=str(plane.folder / "ca.crt")),
            timeout=30,
        )

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def kube(self) -> KubeClient:
        """fabrique's own client of this cluster, from its kubeconfig."""
        # imported here: the fast tests of the informer wait use Cluster over HTTP alone
        from kubernetes import config as k8s_config

        from fabrique.clients.kube import KubeClient

        return KubeClient(k8s_config.new_client_from_config(config_file=str(self.kubeconfig)))

    # -- REST -----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        as_user: str | None = None,
        token: str | None = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Answer:
        """As the admin; ``as_user`` impersonated by it; or with ``token``, as its holder
        alone, through the real authenticator."""
        headers = {"Content-Type": content_type}
        if as_user:
            headers["Impersonate-User"] = as_user
        if token:
            headers["Authorization"] = f"Bearer {token}"
        answer = self.http.request(
            method,
            path,
            content=None if body is None else json.dumps(body),
            headers=headers,
            params=params,
        )
        try:
            parsed = answer.json()
        except ValueError:
            parsed = {"message": answer.text}
        return Answer(answer.status_code, parsed)

    def get(self, path: str) -> dict[str, Any]:
        answer = self.request("GET", path)
        assert answer.status == 200, f"GET {path}: {answer.status} {answer.message}"
        return answer.body

    def items(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        answer = self.request("GET", path, params={"labelSelector": selector} if selector else None)
        assert answer.status == 200, f"GET {path}: {answer.status} {answer.message}"
        return list(answer.body.get("items") or [])

    def create(self, path: str, body: dict[str, Any], **kwargs: Any) -> Answer:
        return self.request("POST", path, body, **kwargs)

    def exists(self, path: str) -> bool:
        answer = self.request("GET", path)
        assert answer.status in (200, 404), f"GET {path}: {answer.status} {answer.message}"
        return answer.status == 200

    def token(self, namespace: str, account: str) -> str:
        """A real token of the ServiceAccount (TokenRequest), as its pod would mount it."""
        answer = self.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )
        assert answer.status == 201, answer.message
        return str(answer.body["status"]["token"])

    def can(
        self, user: str, verb: str, resource: str, namespace: str, group: str = "", name: str = ""
    ) -> bool:
        """A SubjectAccessReview: may ``user`` do ``verb`` on ``resource`` (``name``) there?"""
        resource, _, subresource = resource.partition("/")
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
                if user.startswith("system:serviceaccount:")
                else [],
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "name": name,
                },
            },
        }
        answer = self.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        assert answer.status == 201, answer.message
        return bool(answer.body["status"].get("allowed"))

    def policy_refuses_inline_templates(self) -> bool:
        """Does the build namespace's admission policy refuse a Workflow with its own
        templates yet? (A dry run: nothing is stored.)"""
        probe = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"generateName": "policy-probe-", "namespace": "fabrique-build"},
            "spec": {"entrypoint": "x", "templates": [{"name": "x", "container": {"image": "x"}}]},
        }
        answer = self.create(
            f"{ARGO}/namespaces/fabrique-build/workflows", probe, params={"dryRun": "All"}
        )
        return answer.status == 422 and "ValidatingAdmissionPolicy" in answer.message

    # -- kubectl over trees ---------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return self.plane.kubectl(*args, stdin=stdin, check=check)

    def apply_tree(self, tree: Path) -> str:
        return self.kubectl("apply", "--server-side", "--field-manager=fabrique", "-k", str(tree))

    def versions(self, tree: Path) -> dict[str, str]:
        """kind/namespace/name -> what the apply itself last changed of every object of
        the tree: its generation and the time of the ``fabrique`` field manager's entry.
        A no-op apply moves neither; a controller filling a status or a token Secret's
        data (Kubernetes' token controller) moves neither either. But a CronWorkflow's
        generation: its CRD has no status subresource, and Argo's cron controller patches
        its status and metadata at each tick (``persistUpdate``): for it, its spec."""
        listed = json.loads(self.kubectl("get", "-k", str(tree), "-o", "json"))
        found = {}
        for item in listed["items"]:
            meta = item["metadata"]
            applied = [
                entry.get("time", "")
                for entry in meta.get("managedFields") or []
                if entry.get("manager") == "fabrique" and entry.get("operation") == "Apply"
            ]
            key = "/".join((item["kind"], meta.get("namespace", ""), meta["name"]))
            found[key] = f"generation {meta.get('generation')}, applied {applied}"
            if item["kind"] == "CronWorkflow":
                spec = json.dumps(item.get("spec"), sort_keys=True).encode()
                found[key] = f"spec {hashlib.sha256(spec).hexdigest()[:16]}, applied {applied}"
        return found

    # -- waiting --------------------------------------------------------------------------

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float = 60) -> T:
        return until(what, probe, timeout, every=0.3)

    def wait_templates_seen(self, timeout: float = 60) -> None:
        """Back once the Argo controller holds every WorkflowTemplate written before the
        call, in the version written.

        The controller resolves a ``workflowTemplateRef`` from its informer's lister, not
        from the API server (``fetchWorkflowSpec``, workflow/controller/operator.go): a
        Workflow it takes before the watch has delivered the template ends in Error,
        ``workflowtemplates "..." not found``, for good. That informer keeps one watch
        over every namespace, and a watch delivers in resourceVersion order: once the
        controller resolves a marker template written now, it holds every one written
        before (unless its watch broke meanwhile: a relist fills the lister one object
        at a time). Probe Workflows show it (a suspend step: no pod), one more after each
        not-found; they and the marker are deleted and waited gone."""
        templates = f"{ARGO}/namespaces/{PROBE_NAMESPACE}/workflowtemplates"
        marker = self.create(templates, MARKER_TEMPLATE)
        assert marker.status == 201, f"POST {templates}: {marker.status} {marker.message}"
        name = str(marker.body["metadata"]["name"])
        probes: list[str] = []

        def resolved() -> bool:
            if not probes:
                probes.append(self._probe(name))
            found = probe_resolved(self.workflow(PROBE_NAMESPACE, probes[-1]), name)
            if found is False:  # taken before the template reached the lister: again
                probes.append(self._probe(name))
            return bool(found)

        what = f"the Argo controller to resolve WorkflowTemplate {PROBE_NAMESPACE}/{name}"
        try:
            self.wait(f"{what} from its informer", resolved, timeout)
        except AssertionError as late:
            raise AssertionError(f"{late} (probe Workflows {probes})") from None
        finally:
            made = [f"{ARGO}/namespaces/{PROBE_NAMESPACE}/workflows/{p}" for p in probes]
            made.append(f"{templates}/{name}")
            for path in made:
                answer = self.request("DELETE", path)
                assert answer.status in (200, 202, 404), f"DELETE {path}: {answer.message}"
            self.wait(
                f"the informer probes gone: {made}",
                lambda: not any(self.exists(path) for path in made),
            )

    def _probe(self, template: str) -> str:
        body = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"generateName": "informer-probe-", "namespace": PROBE_NAMESPACE},
            "spec": {"workflowTemplateRef": {"name": template}},
        }
        answer = self.create(f"{ARGO}/namespaces/{PROBE_NAMESPACE}/workflows", body)
        assert answer.status == 201, f"the informer probe: {answer.status} {answer.message}"
        return str(answer.body["metadata"]["name"])

    def workflow(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get(f"{ARGO}/namespaces/{namespace}/workflows/{name}")

    def workflow_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.items(
            f"/api/v1/namespaces/{namespace}/pods", f"workflows.argoproj.io/workflow={name}"
        )

    def nodes_of(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        return dict((self.workflow(namespace, name).get("status") or {}).get("nodes") or {})

    def node(self, namespace: str, workflow: str, step: str) -> dict[str, Any] | None:
        """The pod node of a step's latest attempt (``plan``, or ``plan(1)`` under a
        retry strategy), once the controller has made it."""
        attempts = [
            node
            for node in self.nodes_of(namespace, workflow).values()
            if node.get("type") == "Pod"
            and re.fullmatch(rf"{re.escape(step)}(\(\d+\))?", str(node.get("displayName")))
        ]
        return max(attempts, key=lambda n: str(n.get("displayName")), default=None)

    def pod_of(self, namespace: str, workflow: str, display_name: str) -> dict[str, Any] | None:
        node = self.node(namespace, workflow, display_name)
        if node is None:
            return None
        for pod in self.workflow_pods(namespace, workflow):
            if (pod["metadata"].get("annotations") or {}).get(NODE_ID) == node["id"]:
                return pod
        return None

    # -- the kubelet's and the executor's parts -------------------------------------------

    def finish(self, pod: dict[str, Any], exit_code: int) -> None:
        """End a running pod: kwok's pod-exit stage reads this annotation."""
        meta = pod["metadata"]
        answer = self.request(
            "PATCH",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            {"metadata": {"annotations": {"fabrique.test/exit-code": str(exit_code)}}},
            content_type="application/merge-patch+json",
        )
        assert answer.status == 200, answer.message

    def evict(self, pod: dict[str, Any], message: str) -> None:
        """Evict a running pod with the kubelet's ``message``: kwok's pod-evict stage."""
        meta = pod["metadata"]
        answer = self.request(
            "PATCH",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            {"metadata": {"annotations": {"fabrique.test/evicted": message}}},
            content_type="application/merge-patch+json",
        )
        assert answer.status == 200, answer.message

    def delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        answer = self.request(
            "DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        )
        assert answer.status == 200, answer.message

    def report_outputs(
        self,
        pod: dict[str, Any],
        parameters: dict[str, str],
        *,
        as_user: str,
    ) -> Answer:
        """What the ``wait`` container's executor reports for a step: a
        WorkflowTaskResult named after the node, with the step's output parameters,
        created with the executor's ServiceAccount (``as_user``). As the executor, it
        reports each output its template declares (the pod's ``ARGO_TEMPLATE``), with
        its ``globalName``, its value from ``parameters`` or else its default
        (``SaveParameters``); a pod that names no template reports ``parameters``."""
        meta = pod["metadata"]
        declared = _declared_outputs(pod)
        if declared:
            reported = []
            for declared_one in declared:
                value = parameters.get(declared_one["name"])
                if value is None:
                    value = (declared_one.get("valueFrom") or {}).get("default")
                if value is not None:
                    reported.append(declared_one | {"value": value})
        else:
            reported = [{"name": k, "value": v} for k, v in parameters.items()]
        workflow = meta["labels"][WORKFLOW_LABEL]
        node_id = meta["annotations"][NODE_ID]
        owner = self.workflow(meta["namespace"], workflow)
        body = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "WorkflowTaskResult",
            "metadata": {
                "name": node_id,
                "labels": {
                    "workflows.argoproj.io/workflow": workflow,
                    "workflows.argoproj.io/report-outputs-completed": "true",
                },
                "ownerReferences": [
                    {
                        "apiVersion": "argoproj.io/v1alpha1",
                        "kind": "Workflow",
                        "name": workflow,
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
            "outputs": {"parameters": reported},
        }
        return self.create(
            f"{ARGO}/namespaces/{meta['namespace']}/workflowtaskresults", body, as_user=as_user
        )


def _declared_outputs(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The output parameters the pod's template declares, from ``ARGO_TEMPLATE``, the
    template the controller hands Argo's own containers."""
    spec = pod["spec"]
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for variable in container.get("env") or []:
            if variable.get("name") == "ARGO_TEMPLATE" and "value" in variable:
                template = json.loads(variable["value"])
                return list((template.get("outputs") or {}).get("parameters") or [])
    return []


def probe_resolved(workflow: dict[str, Any], template: str) -> bool | None:
    """Did the controller resolve the probe's ``template`` from its informer (True), take
    the probe before the template reached it (False), or not take it yet (None)? It
    stores the template's spec in the status once the lister has it
    (``setStoredWfSpec``); any other end is the probe's own failure."""
    status = workflow.get("status") or {}
    if status.get("storedWorkflowTemplateSpec"):
        return True
    phase, message = status.get("phase") or "", str(status.get("message") or "")
    if phase == "Error" and f'"{template}" not found' in message:
        return False
    if phase in ("Error", "Failed"):
        raise AssertionError(
            f"the informer probe {workflow['metadata']['name']}: {phase} {message}"
        )
    return None
