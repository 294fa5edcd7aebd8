"""One contract, two servers: fabrique's Kubernetes calls against the double
(``tests/doubles/kube.py``) and against the real kube-apiserver of the live tier.

Each test runs twice, ``[double]`` and ``[live]``. What a test arranges and what it
reads back, it sends to the server's own REST API, the same paths and bodies to both
(``RestApi``), never to the double's dictionaries: so the same assertions hold the
double to the real server, and where the two differ, the double is wrong. Two things
differ on purpose: the double has no namespaces (the live side creates one before its
first object in it), and on the live server the safety net runs with its own
ServiceAccount's token, where the double takes any.
"""

from __future__ import annotations

import base64
import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import config as k8s_config

from fabrique.clients.kube import KubeClient
from fabrique.decisions.workflow import build_workflow
from fabrique.site.config import load_site
from fabrique.site.errors import KubeError

from . import payloads
from .conftest import GITEA_TOKEN, ROOT, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .live.cluster import Answer
from .live.controlplane import established
from .oci import built_labels, push_image
from .servers import Registry

BUILD_NS = "fabrique-build"
SITE = load_site(env={})
CORE = {"Secret": "secrets", "ConfigMap": "configmaps", "Service": "services"}


class RestApi(ABC):
    """A test's own reads and writes, through the server's REST API as an admin."""

    @abstractmethod
    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer: ...

    @abstractmethod
    def kubeconfig(self, path: Path, context: str = "test", account: str | None = None) -> Path:
        """A kubeconfig for fabrique's commands; ``account``: as that ServiceAccount."""

    @abstractmethod
    def ensure_namespace(self, namespace: str) -> None: ...

    @abstractmethod
    def ensure_applications(self) -> None:
        """Argo CD's Application kind is served."""

    @staticmethod
    def path(kind: str, namespace: str, name: str = "") -> str:
        if kind in ("Workflow", "Application"):
            base = f"/apis/argoproj.io/v1alpha1/namespaces/{namespace}/{kind.lower()}s"
        else:
            base = f"/api/v1/namespaces/{namespace}/{CORE[kind]}"
        return f"{base}/{name}" if name else base

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        answer = self.request("GET", self.path(kind, namespace, name))
        assert answer.status in (200, 404), answer.message
        return answer.body if answer.status == 200 else None

    def forget(self, kind: str, namespace: str, name: str) -> None:
        answer = self.request("DELETE", self.path(kind, namespace, name))
        assert answer.status in (200, 404), answer.message

    def put(self, body: dict[str, Any]) -> None:
        """``body`` stored anew: deleted if it exists, then created."""
        meta = body["metadata"]
        self.ensure_namespace(meta["namespace"])
        self.forget(body["kind"], meta["namespace"], meta["name"])
        answer = self.request("POST", self.path(body["kind"], meta["namespace"]), body)
        assert answer.status == 201, answer.message


class DoubleApi(RestApi):
    def __init__(self, double: KubeApiDouble) -> None:
        self.double = double
        self.http = httpx.Client(base_url=double.url, timeout=30)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
        answer = self.http.request(method, path, json=body)
        return Answer(answer.status_code, answer.json())

    def kubeconfig(self, path: Path, context: str = "double", account: str | None = None) -> Path:
        return self.double.kubeconfig(path, context)

    def ensure_namespace(self, namespace: str) -> None:
        pass  # the double has no namespaces: every one exists

    def ensure_applications(self) -> None:
        pass  # the double serves them always


class LiveApi(RestApi):
    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
        answer: Answer = self.cluster.request(method, path, body)
        return answer

    def kubeconfig(self, path: Path, context: str = "live", account: str | None = None) -> Path:
        """The admin's kubeconfig, or with ``account`` a real token of that ServiceAccount
        of the control namespace (TokenRequest), as its pod would mount it."""
        config = yaml.safe_load(self.cluster.kubeconfig.read_text())
        config["contexts"][0]["name"] = context
        config["current-context"] = context
        if account:
            config["users"][0]["user"] = {"token": self.cluster.token("fabrique", account)}
        path.write_text(yaml.safe_dump(config))
        return path

    def ensure_namespace(self, namespace: str) -> None:
        self.cluster.kubectl("create", "namespace", namespace, check=False)

    def ensure_applications(self) -> None:
        """Argo CD's Application CRD, as vendor/specs/ pins it, applied and Established."""
        crd = ROOT / "vendor" / "specs" / "argo-cd-v3.5.1.application-crd.yaml"
        self.cluster.kubectl("apply", "--server-side", "-f", str(crd))
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/applications.argoproj.io"
        self.cluster.wait(
            "the Application CRD Established",
            lambda: established(self.cluster.get(path)),
            timeout=60,
        )


@pytest.fixture(params=["double", pytest.param("live", marks=pytest.mark.live)])
def api(request: pytest.FixtureRequest) -> Iterator[RestApi]:
    if request.param == "double":
        double = DoubleApi(request.getfixturevalue("kube"))
        with double.http:
            yield double
        return
    request.getfixturevalue("applied")
    yield LiveApi(request.getfixturevalue("cluster"))


@pytest.fixture()
def client(api: RestApi, tmp_path: Path) -> KubeClient:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    return KubeClient(k8s_config.new_client_from_config(config_file=str(kubeconfig)))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def the_namespace_exists(api: RestApi, namespace: str) -> None:
    """A derived Secret's namespace is the app's: the site has it before fabrique."""
    api.ensure_namespace(namespace)


# -- Workflows ------------------------------------------------------------------------------


def test_submit_creates_then_says_already_exists(api: RestApi, tmp_path: Path) -> None:
    sha = payloads.revision()
    env = {"KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig"))}
    first = run_cli("submit", "--app", "citation", "--revision", sha, env=env)
    assert first.exit_code == 0, first.stderr
    name = f"fabrique-citation-{sha[:12]}"
    assert first.stdout.strip() == f"created: workflow {BUILD_NS}/{name}"
    again = run_cli("submit", "--app", "citation", "--revision", sha, env=env)
    assert again.exit_code == 0, again.stderr
    assert again.stdout.strip() == f"already exists: workflow {BUILD_NS}/{name}"
    stored = api.read("Workflow", BUILD_NS, name)
    assert stored is not None
    assert stored["spec"]["workflowTemplateRef"] == {"name": "fabrique-build"}
    assert stored["metadata"]["labels"]["fabrique.io/revision"] == sha[:12]
    assert stored["metadata"]["annotations"]["fabrique.io/revision"] == sha


def test_a_workflow_reads_back_with_its_revision_and_a_missing_one_as_none(
    api: RestApi, client: KubeClient
) -> None:
    sha = payloads.revision()
    body = build_workflow(SITE, "citation", sha, submitted_by="cli")
    assert client.create_workflow(body).created
    state = client.workflow(BUILD_NS, body["metadata"]["name"])
    assert state is not None
    assert state.revision == sha
    assert state.phase in ("Pending", "Running")  # the live controller may have begun
    assert client.workflow(BUILD_NS, unique("fabrique-citation-none")) is None
    # one LIST by the labels every build Workflow carries, as the net's sweep reads them
    listed = client.workflows(
        BUILD_NS, "app.kubernetes.io/part-of=fabrique,fabrique.io/app=citation"
    )
    mine = [w for w in listed if w.name == body["metadata"]["name"]]
    assert [(w.app, w.revision) for w in mine] == [("citation", sha)]
    assert client.workflows(BUILD_NS, "fabrique.io/app=no-such-app") == []
    # the sweep's own selector: a Workflow not yet labelled Succeeded is in it
    from fabrique.decisions.reconcile import SWEPT

    assert body["metadata"]["name"] in {w.name for w in client.workflows(BUILD_NS, SWEPT)}
    others = client.workflows(BUILD_NS, SWEPT + ",fabrique.io/app!=citation")
    assert all(w.app != "citation" for w in others)
    # a set of revisions, as the sweep lists the Succeeded ones of the builds it saw running
    among = f"app.kubernetes.io/part-of=fabrique,fabrique.io/revision in ({'0' * 12},{sha[:12]})"
    assert [w.name for w in client.workflows(BUILD_NS, among)] == [body["metadata"]["name"]]
    assert client.workflows(BUILD_NS, f"fabrique.io/revision in ({'0' * 12})") == []


def test_a_workflow_outside_the_template_is_refused_and_named(
    api: RestApi, client: KubeClient
) -> None:
    body = build_workflow(SITE, "citation", payloads.revision(), submitted_by="cli")
    body["spec"]["templates"] = [{"name": "x", "container": {"image": "busybox"}}]
    with pytest.raises(KubeError) as refused:
        client.create_workflow(body)
    assert str(refused.value).startswith(
        f"create Workflow {BUILD_NS}/{body['metadata']['name']}: HTTP 422"
    )
    assert str(refused.value).endswith(
        "ValidatingAdmissionPolicy 'fabrique-build-workflows' with binding "
        "'fabrique-build-workflows' denied request: a Workflow here may hold only "
        "spec.workflowTemplateRef and spec.arguments"
    )
    assert api.read("Workflow", BUILD_NS, body["metadata"]["name"]) is None


# -- ConfigMaps and Secrets -----------------------------------------------------------------


def configmap(namespace: str, name: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"memory": value},
    }


def test_configmap_create_get_replace_and_a_stale_version_is_a_conflict(
    api: RestApi, client: KubeClient
) -> None:
    name = unique("contract")
    assert client.get_configmap("fabrique", name) is None
    client.create_configmap(configmap("fabrique", name, "one"))
    with pytest.raises(KubeError, match=rf"create ConfigMap fabrique/{name}: HTTP 409"):
        client.create_configmap(configmap("fabrique", name, "again"))
    read = client.get_configmap("fabrique", name)
    assert read is not None and read["data"] == {"memory": "one"}
    version = read["metadata"]["resourceVersion"]

    newer = configmap("fabrique", name, "two")
    newer["metadata"]["resourceVersion"] = version
    client.replace_configmap(newer)
    stale = configmap("fabrique", name, "three")
    stale["metadata"]["resourceVersion"] = version
    with pytest.raises(KubeError, match=rf"replace ConfigMap fabrique/{name}: HTTP 409"):
        client.replace_configmap(stale)
    assert (api.read("ConfigMap", "fabrique", name) or {})["data"] == {"memory": "two"}


def test_a_replace_without_a_version_is_unconditional(api: RestApi, client: KubeClient) -> None:
    """Optimistic concurrency is the writer's choice: without a resourceVersion the API
    server takes the write (last one wins)."""
    name = unique("contract")
    client.create_configmap(configmap("fabrique", name, "one"))
    client.replace_configmap(configmap("fabrique", name, "two"))
    assert (api.read("ConfigMap", "fabrique", name) or {})["data"] == {"memory": "two"}


def test_an_invalid_configmap_is_refused(api: RestApi, client: KubeClient) -> None:
    body = configmap("fabrique", unique("contract"), "x")
    body["data"] = {"not a key!": "x"}
    with pytest.raises(KubeError, match="HTTP 422"):
        client.create_configmap(body)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_derive_secrets_copies_then_changes_nothing(api: RestApi, tmp_path: Path) -> None:
    source, target = unique("pg-role"), unique("pg-auth")
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": source, "namespace": "postgres"},
            "data": {"username": _b64("pgvector"), "password": _b64("s3cr3t")},
        }
    )
    the_namespace_exists(api, "dagster")  # the Secret itself does not
    values = write_values(
        tmp_path / "site.yaml",
        derivedSecrets=[
            {
                "from": f"postgres/{source}",
                "to": f"dagster/{target}",
                "keys": {"user": "username", "password": "password"},
            }
        ],
    )
    env = {"KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig"))}
    first = run_cli("--values", str(values), "derive-secrets", env=env)
    assert first.exit_code == 0, first.stderr
    assert first.stdout.startswith(f"changed: Secret dagster/{target} (created")
    again = run_cli("--values", str(values), "derive-secrets", env=env)
    assert again.exit_code == 0, again.stderr
    assert again.stdout.startswith(f"unchanged: Secret dagster/{target}")
    stored = api.read("Secret", "dagster", target)
    assert stored is not None
    assert stored["data"] == {"user": _b64("pgvector"), "password": _b64("s3cr3t")}
    assert stored["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "fabrique"


# -- the safety net: reconcile with its memory, and status ------------------------------------

MEMORY = ("fabrique", "fabrique-reconcile-memory")


@pytest.fixture()
def net_env(api: RestApi, tmp_path: Path) -> dict[str, str]:
    """The reconciler's environment; on the live server, its own ServiceAccount token."""
    api.forget("ConfigMap", *MEMORY)
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", account="fabrique-reconciler")
    return {"KUBECONFIG": str(kubeconfig), "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN}


def test_reconcile_submits_remembers_and_a_second_pass_finds_it_in_flight(
    api: RestApi,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    net_env: dict[str, str],
    tmp_path: Path,
) -> None:
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "registry.host": registry.host}
    )
    sha = code_repo.commit({"dataops/citation-dagster/app.txt": f"v {uuid.uuid4()}\n"})
    first = run_cli("--values", str(values), "reconcile", env=net_env)
    assert first.exit_code == 0, first.stderr
    assert f"citation: submitted: {sha[:12]} is not built" in first.stdout
    assert api.read("Workflow", BUILD_NS, f"fabrique-citation-{sha[:12]}") is not None
    memory = api.read("ConfigMap", *MEMORY)
    assert memory is not None, first.stderr
    assert "memory not saved" not in first.stderr
    # the sweep lists the build Workflows with the reconciler's own token
    assert "could not be listed" not in first.stderr, first.stderr
    assert f"fabrique-citation-{sha[:12]}" in json.loads(memory["data"]["memory.json"])["running"]

    again = run_cli("--values", str(values), "reconcile", env=net_env)
    assert again.exit_code == 0, again.stderr
    assert f"citation: in-flight: fabrique-citation-{sha[:12]} is " in again.stdout
    assert "memory not saved" not in again.stderr

    status = run_cli("--values", str(values), "status", "--output", "json", env=net_env)
    assert status.exit_code == 0, status.stderr
    (entry,) = json.loads(status.stdout)
    assert entry["facts"]["want"] == sha
    assert entry["facts"]["workflow"] == f"fabrique-citation-{sha[:12]}"


def test_a_memory_written_meanwhile_is_not_overwritten(
    api: RestApi, net_env: dict[str, str]
) -> None:
    """The pass names the version it read: a write in between answers 409, and the pass
    keeps its findings for next time instead of clobbering the other one's."""
    from fabrique.decisions.memory import ConfigMapMemory

    kubeconfig = net_env["KUBECONFIG"]
    kube = KubeClient(k8s_config.new_client_from_config(config_file=kubeconfig))
    one, other = ConfigMapMemory(kube, MEMORY[0]), ConfigMapMemory(kube, MEMORY[0])
    one.load()
    one.save("first")
    one.load()
    other.load()
    other.save("other")
    one.save("late")  # read before other's write: refused, logged, not raised
    assert (api.read("ConfigMap", *MEMORY) or {})["data"]["memory.json"] == "other"


def test_seed_runs_its_cluster_steps_and_a_replay_is_unchanged(
    api: RestApi,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    tmp_path: Path,
) -> None:
    """The target's kube context is checked, then the app's Secret is derived."""
    from . import test_seed

    api.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": "pg-role-pgvector", "namespace": "postgres"},
            "data": dict(test_seed.SOURCE),
        }
    )
    the_namespace_exists(api, "dagster")
    api.forget("Secret", "dagster", "pgvector-pg-auth")
    push_image(
        registry.url,
        "citation-dagster",
        code_repo.head()[:12],
        labels=built_labels(code_repo.head(), gitea.url),
    )
    values = test_seed._values(tmp_path, gitea, registry)
    env = {
        "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig", context="cluster-prod")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
        "FABRIQUE_WEBHOOK_TOKEN": "bearer-seed-19ab",
    }
    wrong = {**env, "KUBECONFIG": str(api.kubeconfig(tmp_path / "other", context="elsewhere"))}
    refused = run_cli("--values", str(values), "seed", "--app", "citation", "--yes", env=wrong)
    assert refused.exit_code == 2
    assert "kube context 'elsewhere' is not target 'prod'" in refused.stderr

    first = run_cli("--values", str(values), "seed", "--app", "citation", "--yes", env=env)
    assert first.exit_code == 0, first.stderr
    assert "secrets: changed" in first.stdout
    derived = api.read("Secret", "dagster", "pgvector-pg-auth")
    assert derived is not None and derived["data"] == test_seed.SOURCE
    again = run_cli("--values", str(values), "seed", "--app", "citation", env=env)
    assert again.exit_code == 0, again.stderr
    assert "secrets: unchanged" in again.stdout


# -- seed's check of the registry's bare name ------------------------------------------------


def service(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "registry", "namespace": namespace},
        "spec": spec,
    }


def test_seed_checks_the_registrys_bare_name_resolves_in_both_namespaces(
    api: RestApi, client: KubeClient
) -> None:
    from fabrique.gestures.seed import registry_name

    site = load_site(env={})  # registry:80
    for namespace in (BUILD_NS, "fabrique"):
        api.forget("Service", namespace, "registry")
    missing = registry_name(site, client)
    assert missing.state == "missing"
    assert missing.detail.startswith("no Service registry in fabrique-build; no Service registry")
    api.put(service(BUILD_NS, {"type": "ExternalName", "externalName": "registry.registry.svc"}))
    api.put(service("fabrique", {"ports": [{"port": 5000}]}))
    wrong_port = registry_name(site, client)
    assert wrong_port.detail.startswith("Service fabrique/registry serves no port 80")
    api.put(service("fabrique", {"ports": [{"port": 80}]}))
    found = registry_name(site, client)
    assert (found.state, found.detail) == (
        "unchanged",
        "fabrique-build/registry -> registry.registry.svc, fabrique/registry:80",
    )
    dotted = load_site(env={"FABRIQUE_REGISTRY__HOST": "registry.example.org:5000"})
    assert registry_name(dotted, client).state == "skipped"


# -- Argo CD's Applications -------------------------------------------------------------------


def test_an_application_reads_back_with_the_status_argo_cd_wrote(
    api: RestApi, client: KubeClient
) -> None:
    """What promote reads of the environment before: the Application's sync and health,
    and its pods' images, as Argo CD writes them on the object (no status subresource)."""
    api.ensure_applications()
    name = unique("citation")
    digest = "sha256:" + "b" * 64
    api.put(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": name, "namespace": "argocd"},
            "spec": {
                "project": "default",
                "source": {"repoURL": "http://gitea/atlas/atlas.git", "path": "deploy"},
                "destination": {"server": "https://kubernetes.default.svc", "namespace": "d"},
            },
            "status": {
                "sync": {"status": "Synced", "revision": "c" * 40},
                "health": {"status": "Healthy"},
                "summary": {"images": [f"registry:80/citation-dagster:abc@{digest}"]},
            },
        }
    )
    found = client.application("argocd", name)
    assert found is not None
    assert found["status"]["sync"]["status"] == "Synced"
    assert found["status"]["health"]["status"] == "Healthy"
    assert found["status"]["summary"]["images"] == [f"registry:80/citation-dagster:abc@{digest}"]
    assert client.application("argocd", unique("none")) is None
    api.forget("Application", "argocd", name)


def test_the_pods_of_a_namespace_are_listed_by_their_labels(
    api: RestApi, client: KubeClient
) -> None:
    """What a verification reads of an environment: the pods that run there, by label,
    with the image each container asks for."""
    namespace = unique("dagster")
    api.ensure_namespace(namespace)
    image = "registry:80/citation-dagster:abc@sha256:" + "b" * 64
    for name, app in (("citation-1", "citation"), ("other-1", "other")):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
            "spec": {"containers": [{"name": "app", "image": image}]},
        }
        answer = api.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        assert answer.status == 201, answer.message
    found = client.pods(namespace, "app=citation")
    assert [(p["metadata"]["name"], p["spec"]["containers"][0]["image"]) for p in found] == [
        ("citation-1", image)
    ]
    assert {p["metadata"]["name"] for p in client.pods(namespace)} == {"citation-1", "other-1"}
    assert client.pods(unique("empty")) == []
    # a pod with no container is no pod: both refuse it
    empty = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "none"}, "spec": {}}
    refused = api.request("POST", f"/api/v1/namespaces/{namespace}/pods", empty)
    assert refused.status == 422, refused.message
