"""A Kubernetes API double for Argo Workflows objects. Not a Kubernetes API server.

It answers what fabrique's kube client sends: create a Workflow (201, or 409
AlreadyExists for a taken name, as the API server does), get and list them; get, create
and replace Secrets and ConfigMaps; get Services; list pods (a verification reads what
runs), whose status a test sets, as no kubelet runs here. It also creates and deletes Secrets,
ConfigMaps and Services, as a test arranges them on the real server. It has no
namespaces: every one exists. What the real API server decides, it decides alike, held
to it by ``tests/test_kube_contract.py`` (run against both): in the build namespace the
rendered ValidatingAdmissionPolicy refuses with the server's words (422 Invalid); a PUT
with a resourceVersion that is not the current one is a 409, one without is
unconditional; a ConfigMap or Secret key must be a valid config key. One difference is on
purpose: each Workflow is checked against the upstream schema, closed (kubeconform -strict
style), where the real server, with Argo's full CRDs, drops a misspelled field with a
warning. Faults can be queued: statuses to answer before the next real handling.
``latency`` (seconds) is added to every answer, outside the lock, as an API server across
a network would; every request is counted in ``requests``.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fabrique.validate import Schemas

from .admission import admission_of
from .http import LoopbackServer, Request

TREE = Path(__file__).resolve().parents[2] / "manifests"
# a ConfigMap or Secret key, as the API server validates it (IsConfigMapKey)
DATA_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")

# a selector's terms: commas inside a set's parentheses belong to the set
SELECTOR_TERM = re.compile(r"[^,(]+(?:\([^)]*\))?")
SET_TERM = re.compile(r"\s*([^\s!=]+)\s+in\s+\(([^)]*)\)\s*")
WORKFLOWS = re.compile(r"^/apis/argoproj\.io/v1alpha1/namespaces/([^/]+)/workflows(?:/([^/]+))?$")
CORE = re.compile(r"^/api/v1/namespaces/([^/]+)/(secrets|configmaps|services)(?:/([^/]+))?$")
APPLICATION = re.compile(
    r"^/apis/argoproj\.io/v1alpha1/namespaces/([^/]+)/applications(?:/([^/]+))?$"
)
KINDS = {"secrets": "Secret", "configmaps": "ConfigMap", "services": "Service"}
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?$")


def status(code: int, reason: str, message: str, name: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name:
        body["details"] = {"name": name, "group": "argoproj.io", "kind": "workflows"}
    return body


class KubeApiDouble:
    def __init__(self, specs: Path, tree: Path = TREE) -> None:
        self.validator = Schemas(specs).validator("argoproj.io/v1alpha1", "Workflow")
        self.admission = admission_of(tree)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        # Argo CD's Applications, their status as Argo CD writes it: read only
        self.applications: dict[tuple[str, str], dict[str, Any]] = {}
        # pods, as a test arranges them: their status is the test's (no kubelet here)
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 100
        self.requests: list[Request] = []
        self.faults: list[int] = []
        self.rejections: list[str] = []
        self.latency = 0.0
        self._lock = threading.Lock()
        self.server = LoopbackServer(self._handle)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> KubeApiDouble:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def kubeconfig(self, path: Path, context: str = "double") -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: {context}\n  cluster:\n    server: {self.url}\n"
            f"users:\n- name: {context}\n  user:\n    token: double-token\n"
            f"contexts:\n- name: {context}\n  context:\n"
            f"    cluster: {context}\n    user: {context}\n"
            f"current-context: {context}\n"
        )
        return path

    def _handle(self, request: Request) -> tuple[int, Any]:
        if self.latency:
            time.sleep(self.latency)
        with self._lock:
            self.requests.append(request)
            if self.faults:
                code = self.faults.pop(0)
                return code, status(code, "ServiceUnavailable", "injected fault")
            core = CORE.match(request.path)
            if core:
                store = {
                    "secrets": self.secrets,
                    "configmaps": self.configmaps,
                    "services": self.services,
                }[core[2]]
                return self._core(request, core[1], core[3], store, core[2])
            application = APPLICATION.match(request.path)
            if application:
                return self._application(request, application[1], application[2])
            pod = PODS.match(request.path)
            if pod:
                return self._pod(request, pod[1], pod[2])
            match = WORKFLOWS.match(request.path)
            if not match:
                return 404, status(404, "NotFound", f"the server could not find {request.path}")
            namespace, name = match[1], match[2]
            if request.method == "POST" and name is None:
                return self._create(namespace, request.json())
            if request.method == "GET" and name is None:
                return 200, self._list(namespace, request)
            if request.method == "GET" and name is not None:
                found = self.objects.get((namespace, name))
                if found is None:
                    return 404, status(
                        404, "NotFound", f'workflows.argoproj.io "{name}" not found', name
                    )
                return 200, found
            return 405, status(
                405, "MethodNotAllowed", f"{request.method} not served by the double"
            )

    def _application(self, request: Request, namespace: str, name: str | None) -> tuple[int, Any]:
        """Argo CD's Applications: created whole, status and all (the CRD has no status
        subresource: Argo CD writes it on the object), read, deleted."""
        if request.method == "POST" and name is None:
            body = request.json()
            name = body["metadata"]["name"]
            if (namespace, name) in self.applications:
                return 409, status(
                    409, "AlreadyExists", f'applications.argoproj.io "{name}" already exists', name
                )
            self.version += 1
            body["metadata"] = {**body["metadata"], "namespace": namespace,
                                "resourceVersion": str(self.version)}  # fmt: skip
            self.applications[(namespace, name)] = body
            return 201, body
        found = self.applications.get((namespace, name or ""))
        if name is None or request.method not in ("GET", "DELETE"):
            return 405, status(
                405, "MethodNotAllowed", f"{request.method} not served by the double"
            )
        if found is None:
            return 404, status(
                404, "NotFound", f'applications.argoproj.io "{name}" not found', name
            )
        if request.method == "DELETE":
            del self.applications[(namespace, name)]
        return 200, found

    def _pod(self, request: Request, namespace: str, name: str | None) -> tuple[int, Any]:
        """Pods: created (AlreadyExists for a taken name), listed by ``labelSelector``,
        read, deleted. What their status says is the test's: it sets it in ``pods``."""
        if request.method == "POST" and name is None:
            body = request.json()
            refused = self._invalid(body, "Pod")
            if refused is not None:
                return refused
            name = body["metadata"]["name"]
            if (namespace, name) in self.pods:
                return 409, status(409, "AlreadyExists", f'pods "{name}" already exists')
            self.version += 1
            body["metadata"] = {**body["metadata"], "namespace": namespace,
                                "resourceVersion": str(self.version)}  # fmt: skip
            self.pods[(namespace, name)] = body
            return 201, body
        if request.method == "GET" and name is None:
            items = _selected(self.pods, namespace, request)
            return 200, {"apiVersion": "v1", "kind": "PodList",
                         "metadata": {"resourceVersion": str(self.version)}, "items": items}  # fmt: skip
        found = self.pods.get((namespace, name or ""))
        if name is None or request.method not in ("GET", "DELETE"):
            return 405, status(
                405, "MethodNotAllowed", f"{request.method} not served by the double"
            )
        if found is None:
            return 404, status(404, "NotFound", f'pods "{name}" not found')
        if request.method == "DELETE":
            del self.pods[(namespace, name)]
        return 200, found

    def _list(self, namespace: str, request: Request) -> dict[str, Any]:
        """A WorkflowList, filtered by its ``labelSelector`` (``_selected``)."""
        return {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "WorkflowList",
            "metadata": {"resourceVersion": str(self.version)},
            "items": _selected(self.objects, namespace, request),
        }

    def _core(
        self,
        request: Request,
        namespace: str,
        name: str | None,
        store: dict[tuple[str, str], dict[str, Any]],
        kind: str,
    ) -> tuple[int, Any]:
        """Secrets, ConfigMaps and Services, checked with kubernetes-validate (strict) on
        every write; a PUT must carry the current resourceVersion, as optimistic
        concurrency requires. A DELETE answers the Service deleted, or a Status for a Secret
        or a ConfigMap, as the API server does."""
        what = KINDS[kind]
        if request.method in ("GET", "DELETE") and name:
            found = store.get((namespace, name))
            if found is None:
                return 404, status(404, "NotFound", f'{kind} "{name}" not found')
            if request.method == "GET":
                return 200, found
            del store[(namespace, name)]
            if kind == "services":
                return 200, found
            return 200, {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "kind": kind},
            }
        body = request.json()
        if request.method not in ("POST", "PUT"):
            return 405, status(405, "MethodNotAllowed", request.method)
        refused = self._invalid(body, what)
        if refused is not None:
            return refused
        for field in ("data", "stringData", "binaryData"):
            for data_key in body.get(field) or {}:
                if not DATA_KEY.fullmatch(data_key):
                    message = (
                        f'{what} "{body["metadata"].get("name")}" is invalid: '
                        f"{field}[{data_key}]: Invalid value: {data_key!r}: a valid config key "
                        "must consist of alphanumeric characters, '-', '_' or '.'"
                    )
                    self.rejections.append(message)
                    return 422, status(422, "Invalid", message)
        key = (namespace, body["metadata"]["name"])
        current = store.get(key)
        if request.method == "POST" and current is not None:
            return 409, status(409, "AlreadyExists", f'{kind} "{key[1]}" already exists')
        if request.method == "PUT":
            if current is None:
                return 404, status(404, "NotFound", f'{kind} "{key[1]}" not found')
            # without a resourceVersion the write is unconditional, as the API server takes it
            asked = body["metadata"].get("resourceVersion")
            if asked is not None and asked != current["metadata"]["resourceVersion"]:
                return 409, status(409, "Conflict", "the object has been modified")
        self.version += 1
        stored = {
            **body,
            "metadata": {
                **body["metadata"],
                "namespace": namespace,
                "resourceVersion": str(self.version),
            },
        }
        store[key] = stored
        return (201 if request.method == "POST" else 200), stored

    def _invalid(self, body: dict[str, Any], what: str) -> tuple[int, Any] | None:
        """422 Invalid for an object the core schema refuses (kubernetes-validate,
        strict, as the API server's own schema would), else None."""
        import kubernetes_validate
        from kubernetes_validate.utils import latest_version

        try:
            kubernetes_validate.validate(body, latest_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            self.rejections.append(error.message)
            return 422, status(422, "Invalid", f"{what} is invalid: {error.message}")
        return None

    def _create(self, namespace: str, body: Any) -> tuple[int, Any]:
        errors = sorted(self.validator.iter_errors(body), key=lambda e: list(e.absolute_path))
        if errors:
            where = ".".join(str(p) for p in errors[0].absolute_path)
            message = f"Workflow is invalid: {where}: {errors[0].message}"
            self.rejections.append(message)
            return 422, status(422, "Invalid", message)
        meta = body.get("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            return 400, status(
                400, "BadRequest", "the namespace of the object does not match the URL"
            )
        name = meta.get("name")
        if not name:
            return 422, status(422, "Invalid", "metadata.name: Required value")
        denial = self.admission.denial(namespace, body)
        if denial is not None:
            self.rejections.append(denial)
            return 422, status(422, "Invalid", denial, name)
        if (namespace, name) in self.objects:
            return 409, status(
                409, "AlreadyExists", f'workflows.argoproj.io "{name}" already exists', name
            )
        stored = {
            **body,
            "metadata": {
                **meta,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(len(self.objects) + 1),
            },
        }
        self.objects[(namespace, name)] = stored
        return 201, stored


def _selected(
    store: dict[tuple[str, str], dict[str, Any]], namespace: str, request: Request
) -> list[dict[str, Any]]:
    """The objects of ``namespace`` whose labels match the request's ``labelSelector`` of
    ``k=v``, ``k!=v`` (the label absent or another value, as the API server reads it)
    and ``k in (v1,v2)`` terms."""
    terms = SELECTOR_TERM.findall(request.query.get("labelSelector", ""))

    def selected(labels: dict[str, str]) -> bool:
        for term in terms:
            among = SET_TERM.fullmatch(term)
            if among:
                values = {v.strip() for v in among[2].split(",")}
                if labels.get(among[1]) not in values:
                    return False
            elif "!=" in term:
                key, value = term.split("!=", 1)
                if labels.get(key) == value:
                    return False
            else:
                key, value = term.split("=", 1)
                if labels.get(key) != value:
                    return False
        return True

    return [
        body
        for (ns, _), body in sorted(store.items())
        if ns == namespace and selected(body["metadata"].get("labels", {}))
    ]


def _build_pod(tree: Path) -> dict[str, str | None]:
    """The build's pod as Argo's executor runs it: each container after the one it
    depends on, read from the rendered ``fabrique-build`` (the default site signs
    nothing: no ``sign``)."""
    from fabrique.site.names import VERIFIED_BY

    from ..manifests import find

    template = find(tree, "WorkflowTemplate", "fabrique-build")
    (run,) = [t for t in template["spec"]["templates"] if t["name"] == VERIFIED_BY]
    return {
        c["name"]: (c.get("dependencies") or [None])[0] for c in run["containerSet"]["containers"]
    }


BUILD_POD = _build_pod(TREE)
# what Argo's executor (cmd/argoexec/commands/emissary.go) ends a container with when the
# one it waits for failed: exit 64, its error the last line of the container's log
NOT_RUN_EXIT = 64
FINISHED_AT = "2026-12-02T10:00:09Z"


def argo_status(
    body: dict[str, Any],
    phase: str,
    *,
    verified: str | None = None,
    failed_step: str | None = None,
    message: str = "",
    exit_code: int = 1,
) -> dict[str, Any]:
    """``status`` as the Argo controller writes it for a fabrique-build Workflow: a Steps
    root, its step group, the ``run`` step's Retry node and its Pod child, both with the
    pod's outputs (``digest``, ``outcome``, ``commit``), and a Container node per
    container of the pod. ``verified``: verify-digest recorded that digest (else the
    output is empty, as when the plan skipped). ``failed_step``: that container exited
    ``exit_code`` with ``message`` (its log tail); the ones after it never ran, ended by
    Argo's executor. Messages are Argo's (operator.go): "<container>: <Reason> (exit code
    <n>): <termination message>" on a container, and on the pod the first failed
    container's in the kubelet's order (by name), which may be one that never ran."""
    name = body["metadata"]["name"]
    group, retry = f"{name}[0]", f"{name}[0].run"
    pod = f"{retry}(0)"
    exits: dict[str, int] = {}
    messages: dict[str, str] = {}
    for container, after in BUILD_POD.items():
        if after is not None and exits[after] != 0:
            exits[container] = NOT_RUN_EXIT
            messages[container] = (
                f"{container}: Error (exit code {NOT_RUN_EXIT}): "
                f'Error: dependency "{after}" exited with non-zero code: {exits[after]}'
            )
        elif container == failed_step:
            exits[container] = exit_code
            reason = "OOMKilled" if exit_code == 137 else "Error"
            messages[container] = f"{container}: {reason} (exit code {exit_code}): {message}"
        else:
            exits[container] = 0
    pod_failed = any(exits.values())
    outputs = {
        "parameters": [
            {"name": "outcome", "value": "none" if pod_failed or verified is None else "changed"},
            {"name": "commit", "value": ""},
            {"name": "digest", "value": verified or "" if not exits["verify-digest"] else ""},
        ]
    }

    nodes: dict[str, Any] = {}

    def node(node_name: str, display: str, node_type: str, node_phase: str, **more: Any) -> None:
        nodes[node_name] = {
            "id": node_name,
            "name": node_name,
            "displayName": display,
            "type": node_type,
            "templateName": "main" if node_type == "Steps" else "run",
            "phase": node_phase,
            "finishedAt": FINISHED_AT,
            **more,
        }

    run_phase = "Failed" if pod_failed else "Succeeded"
    node(name, name, "Steps", phase)
    nodes[name].update(children=[group])
    node(group, "[0]", "StepGroup", run_phase, children=[retry])
    del nodes[group]["templateName"]
    failed_first = next((messages[c] for c in sorted(messages)), None)
    retry_said = {"message": "retryStrategy.expression evaluated to false"} if pod_failed else {}
    node(retry, "run", "Retry", run_phase, outputs=outputs, children=[pod], **retry_said)
    pod_said = {"message": failed_first} if failed_first else {}
    node(pod, "run(0)", "Pod", run_phase, outputs=outputs, **pod_said)
    for container, code in exits.items():
        said = {"message": messages[container]} if container in messages else {}
        container_phase = {0: "Succeeded", NOT_RUN_EXIT: "Error"}.get(code, "Failed")
        node(f"{pod}.{container}", container, "Container", container_phase, **said)
    status: dict[str, Any] = {"phase": phase, "nodes": nodes}
    if phase in ("Failed", "Error"):
        status["message"] = f"child '{retry}' failed"
    return status


def workflow_failures(status: dict[str, Any]) -> list[dict[str, Any]]:
    """``{{workflow.failures}}`` of a Workflow with this ``status``, as the controller makes
    it for the exit handler (operator.go, ``failedNodeStatus``): every node Failed or
    Error, unquoted."""
    return [
        {
            "displayName": node["displayName"],
            "message": node.get("message", ""),
            "templateName": node.get("templateName", ""),
            "phase": node["phase"],
            "podName": node["name"],
            "finishedAt": node["finishedAt"],
        }
        for node in status["nodes"].values()
        if node["phase"] in ("Failed", "Error")
    ]
