"""The one module that talks to the Kubernetes API.

Everything else asks it for typed results. Connection settings come from a kubeconfig
(``--context`` or ``FABRIQUE_KUBECONTEXT``) or, inside a pod, the in-cluster config.

The Kubernetes client is imported when a cluster is first asked, not with this module:
it is most of a command's start-up (bench/RESULTS.md). Its generated API classes are not
used at all: each request goes by path through the client's connection pool, set up
from the kubeconfig (TLS, client certificates, tokens refreshed by exec plugins); the
``CoreV1Api`` class alone costs more to import than an idle reconcile pass's work.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from fabrique.site.config import Site
from fabrique.site.errors import NOT_RUN, ConfigError, KubeError, failed_stage, reason_line
from fabrique.site.names import DIGEST_RE, VERIFIED_BY, VERIFIED_OUTPUT, redact_urls
from fabrique.site.retry import RetryPolicy

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger("fabrique.kube")

ARGO_GROUP = "argoproj.io"
ARGO_VERSION = "v1alpha1"


@dataclass(frozen=True)
class CreateResult:
    name: str
    namespace: str
    created: bool  # False: a Workflow of that name already existed


@dataclass(frozen=True)
class WorkflowState:
    """What the reconciler reads of a build Workflow."""

    name: str
    phase: str  # Pending (also before the controller sets one), Running, Succeeded, ...
    revision: str | None  # its ``revision`` argument
    verified_digest: str | None  # what its verify-digest stage recorded (the pod's output)
    reason: str  # why it is in that phase, from the failed step or the Workflow ("" if none)
    app: str | None = None  # its ``app`` argument
    group: str = ""  # its ``group`` argument: the push's Workflow that writes it, or ""
    finished_at: str = ""  # when it ended (RFC 3339), as the controller says; "" if it runs


def workflow_state(name: str, body: dict[str, Any]) -> WorkflowState:
    """Read a Workflow object as the Argo controller writes it (``status.nodes``)."""
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    params = (spec.get("arguments") or {}).get("parameters") or []
    revision = next((p.get("value") for p in params if p.get("name") == "revision"), None)
    app = next((p.get("value") for p in params if p.get("name") == "app"), None)
    group = next((p.get("value") for p in params if p.get("name") == "group"), None) or ""
    digests: set[str] = set()
    reasons: list[str] = []
    for node in (status.get("nodes") or {}).values():
        if node.get("templateName") == VERIFIED_BY and node.get("phase") == "Succeeded":
            outputs = (node.get("outputs") or {}).get("parameters") or []
            digests.update(
                str(p.get("value", "")).strip() for p in outputs if p.get("name") == VERIFIED_OUTPUT
            )
        message = str(node.get("message", ""))
        if (
            node.get("type") in ("Pod", "Container")
            and node.get("phase") in ("Failed", "Error")
            and not NOT_RUN.search(message)
        ):
            step = failed_stage(str(node.get("displayName", node.get("name"))), message)
            # its message may be a log tail (FallbackToLogsOnError): keep the telling line
            reasons.append(f"{step}: {reason_line(message)}")
    # A retried pod records its outputs on the retry node and on the pod node, a pod whose
    # verify never ran an empty digest; anything but one well-formed digest is no
    # verified record.
    digests.discard("")
    verified = digests.pop() if len(digests) == 1 else None
    if verified is not None and not DIGEST_RE.fullmatch(verified):
        verified = None
    # a step's log tail goes into the reconcile line and the commit status: no URL
    # credential, query or fragment leaves with it
    reason = redact_urls(reasons[0] if reasons else str(status.get("message") or ""))
    return WorkflowState(
        name=name,
        phase=str(status.get("phase") or "Pending"),
        revision=str(revision) if revision is not None else None,
        verified_digest=verified,
        reason=reason.strip().rstrip(":"),
        app=str(app) if app is not None else None,
        group=str(group),
        finished_at=str(status.get("finishedAt") or ""),
    )


SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Connection:
    """How requests reach the API server: its URL, a urllib3 pool (TLS set up) and the
    headers that authenticate a request, asked for each one (a token is renewed)."""

    server: str
    pool: Any  # urllib3.PoolManager
    auth: Callable[[], dict[str, str]]


def connect(context: str | None = None) -> Connection:
    """A connection from the kubeconfig (``context``), else the in-cluster config.

    A kubeconfig whose context has a server, a CA (or plain HTTP) and a token or no
    credential, and the in-cluster config, are read here; anything else (exec plugins,
    client certificates, several files, ...) by the Kubernetes client, imported then.
    Retries are fabrique's own (KubeClient), so urllib3's are turned off. No kubeconfig
    or an unknown context is a ConfigError (exit 2): no server was asked anything.
    """
    kubeconfig = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    plain = _plain_kubeconfig(kubeconfig, context)
    if plain is None and not context and not os.path.exists(kubeconfig):
        plain = _in_cluster()
    return plain or _from_api_client(_client_library(kubeconfig, context))


def _client_library(kubeconfig: str, context: str | None) -> ApiClient:
    from kubernetes import config as k8s_config
    from kubernetes.client import ApiClient, Configuration
    from kubernetes.config.config_exception import ConfigException

    configuration = Configuration()
    try:
        k8s_config.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    except (ConfigException, FileNotFoundError) as kubeconfig_error:
        if context:
            raise ConfigError(f"kube context {context!r}: {kubeconfig_error}") from None
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except ConfigException:
            raise ConfigError(
                "no Kubernetes config: set KUBECONFIG or ~/.kube/config, or run in a pod"
            ) from None
    configuration.retries = 0
    return ApiClient(configuration)


def _from_api_client(api: ApiClient) -> Connection:
    """The connection of a Kubernetes client's ApiClient: its pool, its credentials."""
    configuration = api.configuration

    def auth() -> dict[str, str]:
        # asked each time: the client refreshes an exec plugin's or a pod's token here
        return {
            str(a["key"]): str(a["value"])
            for a in configuration.auth_settings().values()
            if a.get("in") == "header" and a.get("value")
        }

    return Connection(configuration.host, api.rest_client.pool_manager, auth)


def _pool(cafile: str | None = None, cadata: str | None = None) -> Any:
    import ssl

    import urllib3

    tls = ssl.create_default_context(cafile=cafile, cadata=cadata) if cafile or cadata else None
    return urllib3.PoolManager(num_pools=4, maxsize=16, ssl_context=tls, retries=False)


def _plain_kubeconfig(path: str, context: str | None) -> Connection | None:
    """The connection of a plain kubeconfig's context, or None if it is not one."""
    import yaml

    if os.pathsep in path:
        return None
    try:
        config = yaml.load(
            Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        )
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(config, dict):
        return None
    chosen = _named(config, "contexts", "context", context or config.get("current-context"))
    if chosen is None:
        return None
    cluster = _named(config, "clusters", "cluster", chosen.get("cluster"))
    user = _named(config, "users", "user", chosen.get("user")) if chosen.get("user") else {}
    if cluster is None or user is None or set(chosen) - {"cluster", "user", "namespace"}:
        return None
    server = cluster.get("server")
    token = user.get("token")
    if (
        set(cluster) - {"server", "certificate-authority", "certificate-authority-data"}
        or set(user) - {"token"}
        or not isinstance(server, str)
        or not (token is None or isinstance(token, str))
    ):
        return None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if server.startswith("http://"):
        return Connection(server, _pool(), lambda: headers)
    if not server.startswith("https://"):
        return None
    try:
        if isinstance(data := cluster.get("certificate-authority-data"), str):
            pool = _pool(cadata=base64.b64decode(data).decode())
        elif isinstance(file := cluster.get("certificate-authority"), str):
            pool = _pool(cafile=str(Path(path).parent / file))  # relative to the kubeconfig
        else:
            return None  # the client's own default CAs
    except (OSError, ValueError):
        return None  # the client says what is wrong with it
    return Connection(server, pool, lambda: headers)


def _named(config: dict[str, Any], kind: str, key: str, name: Any) -> dict[str, Any] | None:
    """The ``key`` mapping of the entry of ``config[kind]`` named ``name`` (None: none)."""
    entries = config.get(kind)
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            found = entry.get(key) or {}
            return found if isinstance(found, dict) else None
    return None


def _in_cluster() -> Connection | None:
    """The pod's own API server and ServiceAccount, or None outside a pod."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    token, ca = SERVICE_ACCOUNT / "token", SERVICE_ACCOUNT / "ca.crt"
    if not host or not port or not token.is_file() or not ca.is_file():
        return None
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    try:
        pool = _pool(cafile=str(ca))
    except (OSError, ValueError):
        return None

    def auth() -> dict[str, str]:
        # read for each request: the kubelet renews the projected token in place
        return {"Authorization": f"Bearer {token.read_text().strip()}"}

    return Connection(f"https://{host}:{port}", pool, auth)


def kubeconfig_context(context: str | None = None) -> str:
    """The context a client would use: ``context``, else the kubeconfig's current one."""
    if context:
        return context
    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException

    kubeconfig = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        _, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)
    except (ConfigException, FileNotFoundError):
        raise ConfigError(
            "no kubeconfig with a current context: set KUBECONFIG or --context"
        ) from None
    return str(active["name"])


@dataclass(frozen=True)
class _Answer:
    """The API server's answer to one request: its status, reason and body."""

    status: int
    reason: str
    data: bytes

    def json(self, what: str) -> Any:
        try:
            return json.loads(self.data)
        except ValueError:
            raise KubeError(f"{what}: the API answered something that is not JSON") from None


class KubeClient:
    def __init__(
        self,
        api: Connection | ApiClient,
        *,
        retry: RetryPolicy | None = None,
        timeout_seconds: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._timeout = (min(5.0, timeout_seconds), timeout_seconds)
        self._api = api  # an ApiClient owns its pool
        self._connection = api if isinstance(api, Connection) else _from_api_client(api)
        self._retry = retry or RetryPolicy()
        self._sleep = sleep
        self._server = self._connection.server

    @classmethod
    def for_site(cls, site: Site, context: str | None = None) -> KubeClient:
        """The API of ``context`` (else the kubeconfig's, else in-cluster), with the
        site's timeouts and retries."""
        return cls(
            connect(context),
            retry=site.network.retry_policy(),
            timeout_seconds=site.network.timeout_seconds,
        )

    def create_workflow(self, body: dict[str, Any]) -> CreateResult:
        """Create a Workflow; an existing one of the same name is reported, not an error."""
        meta = body["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        what = f"create Workflow {namespace}/{name}"
        answer = self._call(what, "POST", _workflows(namespace), body=body)
        if answer.status == 409:
            return CreateResult(name, namespace, created=False)
        if not 200 <= answer.status < 300:
            raise self._error(what, answer)
        return CreateResult(name, namespace, created=True)

    def workflow(self, namespace: str, name: str) -> WorkflowState | None:
        """Workflow ``name`` as the reconciler reads it, or None if there is no such one."""
        body = self._get(f"get Workflow {namespace}/{name}", _workflows(namespace, name))
        return None if body is None else workflow_state(name, body)

    def workflows(self, namespace: str, selector: str) -> list[WorkflowState]:
        """Every Workflow of ``namespace`` whose labels match ``selector``, in one LIST."""
        what = f"list Workflows {namespace} ({selector})"
        return [
            workflow_state(str((item.get("metadata") or {}).get("name", "")), item)
            for item in self._list(what, _workflows(namespace), selector)
        ]

    def labelled(self, api_version: str, plural: str, selector: str) -> list[dict[str, Any]]:
        """Every object of ``plural`` (``api_version``'s) in every namespace whose labels
        match ``selector``, in one LIST; none where the API does not serve that kind."""
        what = f"list {plural} ({selector})"
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        return self._list(what, f"{path}/{plural}", selector, unserved=True)

    def _list(
        self, what: str, path: str, selector: str, unserved: bool = False
    ) -> list[dict[str, Any]]:
        """The objects of one LIST of ``path`` whose labels match ``selector``; with
        ``unserved``, none where the API does not serve the kind (404)."""
        query = {"labelSelector": selector} if selector else None
        answer = self._call(what, "GET", path, query=query)
        if unserved and answer.status == 404:
            return []
        if not 200 <= answer.status < 300:
            raise self._error(what, answer)
        body = answer.json(what)
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise KubeError(f"{what}: the API answered something that is not a list")
        return [item for item in items if isinstance(item, dict)]

    def application(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Argo CD's Application ``namespace/name`` (its status as Argo CD wrote it), or
        None if there is none."""
        path = _namespaced(f"/apis/{ARGO_GROUP}/{ARGO_VERSION}", namespace, "applications", name)
        return self._get(f"get Application {namespace}/{name}", path)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        """The pods of ``namespace`` (those whose labels match ``selector``), in one LIST."""
        what = f"list pods {namespace}" + (f" ({selector})" if selector else "")
        return self._list(what, _core(namespace, "pods"), selector)

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret as the API returns it (``data`` base64), or None if there is none."""
        return self._read_core("Secret", namespace, name)

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read_core("Service", namespace, name)

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap as the API returns it, or None if there is none."""
        return self._read_core("ConfigMap", namespace, name)

    def create_configmap(self, body: dict[str, Any]) -> None:
        self._write_core("create", "ConfigMap", body)

    def replace_configmap(self, body: dict[str, Any]) -> None:
        """Replace a ConfigMap; ``metadata.resourceVersion`` makes a concurrent change a 409."""
        self._write_core("replace", "ConfigMap", body)

    def create_secret(self, body: dict[str, Any]) -> None:
        self._write_core("create", "Secret", body)

    def replace_secret(self, body: dict[str, Any]) -> None:
        """Replace a Secret; ``metadata.resourceVersion`` makes a concurrent change a 409."""
        self._write_core("replace", "Secret", body)

    # the core kinds fabrique reads and writes, by their resource (plural) names
    _CORE = {"Secret": "secrets", "ConfigMap": "configmaps", "Service": "services"}

    def _read_core(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(f"get {kind} {namespace}/{name}", _core(namespace, self._CORE[kind], name))

    def _get(self, what: str, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when the API says 404."""
        answer = self._call(what, "GET", path)
        if answer.status == 404:
            return None
        if not 200 <= answer.status < 300:
            raise self._error(what, answer)
        body = answer.json(what)
        if not isinstance(body, dict):
            raise KubeError(f"{what}: the API answered something that is not an object")
        return body

    def _write_core(self, verb: str, kind: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        what = f"{verb} {kind} {meta['namespace']}/{meta['name']}"
        plural = self._CORE[kind]
        if verb == "create":
            answer = self._call(what, "POST", _core(meta["namespace"], plural), body=body)
        else:
            path = _core(meta["namespace"], plural, meta["name"])
            answer = self._call(what, "PUT", path, body=body)
        if not 200 <= answer.status < 300:
            raise self._error(what, answer)

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
    ) -> _Answer:
        """One request, tried again on 429, a 5xx or a lost connection, as the site's
        retry policy says; the last answer, whatever its status."""
        import urllib3

        url = self._server.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        timeout = urllib3.Timeout(connect=self._timeout[0], read=self._timeout[1])
        for attempt in range(1, self._retry.attempts + 1):
            try:
                response = self._connection.pool.request(
                    method,
                    url,
                    body=data,
                    headers=headers | self._connection.auth(),  # a renewed token
                    timeout=timeout,
                    retries=False,
                )
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if attempt == self._retry.attempts:
                    raise KubeError(
                        f"{what}: Kubernetes API at {self._server} unreachable "
                        f"({exc.__class__.__name__}) after {attempt} attempt(s)",
                        transient=True,
                    ) from None
                reason = exc.__class__.__name__
            else:
                answer = _Answer(response.status, response.reason or "", response.data)
                if (
                    answer.status not in (429, 500, 502, 503, 504)
                    or attempt == self._retry.attempts
                ):
                    return answer
                reason = f"HTTP {answer.status}"
            delay = self._retry.delay(attempt)
            log.warning("%s: %s; retry %d in %.1fs", what, reason, attempt, delay)
            self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _error(self, what: str, answer: _Answer) -> KubeError:
        hint = {
            401: "the credentials were refused",
            403: "forbidden: the ServiceAccount or user lacks RBAC for this",
            404: "not found: are Argo Workflows' CRDs installed, and does the namespace exist?",
            422: "the API rejected the object as invalid",
        }.get(answer.status, "")
        return KubeError(
            f"{what}: HTTP {answer.status} {answer.reason}"
            + (f" ({hint})" if hint else "")
            + (f": {said}" if (said := _status_message(answer.data)) else ""),
            transient=answer.status >= 500 or answer.status == 429,
        )


def _workflows(namespace: str, name: str = "") -> str:
    return _namespaced(f"/apis/{ARGO_GROUP}/{ARGO_VERSION}", namespace, "workflows", name)


def _core(namespace: str, plural: str, name: str = "") -> str:
    return _namespaced("/api/v1", namespace, plural, name)


def _namespaced(group: str, namespace: str, plural: str, name: str) -> str:
    """The path of ``plural`` in ``namespace`` under ``group``'s API, or of one of them."""
    path = f"{group}/namespaces/{quote(namespace, safe='')}/{plural}"
    return f"{path}/{quote(name, safe='')}" if name else path


def _status_message(data: bytes) -> str:
    """The API server's own one-line reason (a Status object's message), if it gave one:
    an admission policy's refusal, a conflict, a name that is taken."""
    try:
        body = json.loads(data or b"")
    except ValueError:
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return reason_line(str(message)) if message else ""
