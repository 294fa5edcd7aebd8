"""``fabrique validate``: strict checks of a rendered tree, the way kubeconform -strict works.

- Argo kinds against the upstream JSON Schemas (``vendor/specs/``), with every object
  schema closed (``additionalProperties: false``) so a misspelled field is an error.
- Argo CD Applications against the CRD's openAPIV3Schema, closed the same way, except
  where the CRD itself says ``x-kubernetes-preserve-unknown-fields``.
- Core kinds with kubernetes-validate in strict mode.
- Every ``metadata.name`` a DNS-1123 name (a label for Namespaces and Services).
- Across documents, what a controller would refuse although each document is valid: a
  step, DAG task, entrypoint, exit handler or hook naming a template that does not exist
  (here or through ``templateRef``), a DAG dependency on no task, a
  ``serviceAccountName`` that is no ServiceAccount of the tree, a RoleBinding to a Role
  the tree lacks. Objects that live outside the tree are declared ``external``.
- Every object small enough for a default cluster to store: etcd refuses a request over
  its ``--max-request-bytes``, 1.5 MiB by default, and the API server answers the apply
  with that refusal. An object is sized as its compact JSON, what the API server stores
  for a custom resource; a server-side apply's ``managedFields`` come on top.
- No object twice: two documents of one API group, kind, namespace and name are one object
  to the cluster, which keeps whichever was applied last (kustomize refuses the build).
- A PrometheusRule's groups as ``promtool check rules`` checks their structure, and
  each alert as fabrique writes it (``fabrique.decisions.alerts.check_rules``, which says what it
  cannot check: PromQL and the annotations' templates).
- The tree's kustomize structure through ``kubectl kustomize`` when kubectl is installed:
  every kustomization file as it is, over each file's first object of each kind (see
  ``kustomize_check``).

Each problem is reported as ``file: document N (Kind/name): json.path: message``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import referencing
import yaml
from kubernetes_validate.utils import latest_version

from fabrique.site.errors import InputError
from fabrique.site.limits import (
    DATA_LIMIT,
    ETCD_REQUEST_LIMIT,
    POD_ENV,
    POD_ENV_LIMIT,
    data_size,
    pod_env_size,
)
from fabrique.site.names import DNS_LABEL_RE, DNS_SUBDOMAIN_RE

SPECS_ENV = "FABRIQUE_SPECS"
# libyaml's parser where PyYAML was built with it: the tree of ten thousand apps parses
# in a second, not in a minute
LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
WORKFLOWS_SCHEMA = "argo-workflows-v4.1.2.schema.json"
EVENTS_SCHEMA = "argo-events-v1.9.11.schema.json"
ARGOCD_CRD = "argo-cd-v3.5.1.application-crd.yaml"
GITEA_SWAGGER = "gitea-1.27.3.swagger.json"  # what the Gitea double is checked against
SPEC_FILES = (WORKFLOWS_SCHEMA, EVENTS_SCHEMA, ARGOCD_CRD, GITEA_SWAGGER)

WORKFLOW_KINDS = frozenset(
    {
        "Workflow",
        "WorkflowTemplate",
        "ClusterWorkflowTemplate",
        "CronWorkflow",
        "WorkflowEventBinding",
    }
)
EVENTS_KINDS = frozenset({"EventSource", "Sensor", "EventBus"})
LABEL_NAMED_KINDS = frozenset({"Namespace", "Service"})


@dataclass(frozen=True)
class Problem:
    file: str
    document: int
    what: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f" {self.path}:" if self.path else ""
        return f"{self.file}: document {self.document} ({self.what}):{where} {self.message}"


def find_specs(explicit: str | Path | None = None) -> Path:
    """The upstream specs directory: ``explicit``, else ``$FABRIQUE_SPECS``, else the copy
    that travels with fabrique (``fabrique/specs`` in a wheel, ``vendor/specs`` in a
    checkout; both pinned in ``vendor/lock.yaml``)."""
    if explicit:
        candidates, hint = [Path(explicit)], "--specs"
    elif os.environ.get(SPECS_ENV):
        candidates, hint = [Path(os.environ[SPECS_ENV])], SPECS_ENV
    else:
        package = Path(__file__).resolve().parent
        candidates, hint = [package / "specs", package.parent / "vendor" / "specs"], ""
    for candidate in candidates:
        if (candidate / WORKFLOWS_SCHEMA).is_file():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    if hint:
        raise InputError(f"{hint} {tried}: holds no {WORKFLOWS_SCHEMA}")
    raise InputError(
        f"upstream specs not found (tried {tried}); reinstall fabrique, "
        f"or pass --specs DIR or set {SPECS_ENV}"
    )


def close_schema(node: Any) -> Any:
    """A copy of a schema in which every object with ``properties`` rejects unknown keys."""
    if isinstance(node, list):
        return [close_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    closed = {key: close_schema(value) for key, value in node.items()}
    if (
        "properties" in closed
        and "additionalProperties" not in closed
        and not closed.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


def _closed(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_LABELS = _closed(
    {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}, ["matchLabels"]
)
_PORTS = {
    "type": "array",
    "minItems": 1,
    "items": _closed(
        {
            "ports": {
                "type": "array",
                "minItems": 1,
                "items": _closed(
                    {
                        "port": {"type": "string", "pattern": "^[0-9]{1,5}$"},
                        "protocol": {"enum": ["TCP", "UDP", "SCTP", "ANY"]},
                    },
                    ["port", "protocol"],
                ),
            },
            "rules": _closed(
                {
                    "dns": {
                        "type": "array",
                        "items": _closed(
                            {"matchPattern": {"type": "string"}, "matchName": {"type": "string"}},
                            [],
                        ),
                    }
                },
                [],
            ),
        },
        ["ports"],
    ),
}
# Cilium's CRD is not among the upstream specs: this closed schema covers the part of
# CiliumNetworkPolicy (cilium.io/v2) that fabrique renders, with the fields Cilium requires.
CILIUM_NETWORK_POLICY = _closed(
    {
        "apiVersion": {"const": "cilium.io/v2"},
        "kind": {"const": "CiliumNetworkPolicy"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": _closed(
            {
                # {}: every endpoint of the namespace (an app's namespace, whole)
                "endpointSelector": {"anyOf": [_LABELS, {"const": {}}]},
                "egress": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "toEndpoints": {"type": "array", "minItems": 1, "items": _LABELS},
                            "toFQDNs": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "minProperties": 1,
                                    "maxProperties": 1,
                                    "properties": {
                                        "matchName": {"type": "string"},
                                        "matchPattern": {"type": "string"},
                                    },
                                    "additionalProperties": False,
                                },
                            },
                            "toPorts": _PORTS,
                        },
                        "required": ["toPorts"],
                        "minProperties": 2,
                        "additionalProperties": False,
                    },
                },
            },
            ["endpointSelector", "egress"],
        ),
    },
    ["apiVersion", "kind", "metadata", "spec"],
)


class Schemas:
    """Strict validators for the Argo and Argo CD kinds, built once per specs directory."""

    def __init__(self, specs: Path) -> None:
        self.specs = specs

    @functools.cached_property
    def _workflows(self) -> dict[str, Any]:
        return close_schema(json.loads((self.specs / WORKFLOWS_SCHEMA).read_text("utf-8")))

    @functools.cached_property
    def _events(self) -> dict[str, Any]:
        return close_schema(json.loads((self.specs / EVENTS_SCHEMA).read_text("utf-8")))

    @functools.cached_property
    def _application(self) -> dict[str, Any]:
        crd = yaml.load((self.specs / ARGOCD_CRD).read_text("utf-8"), Loader=LOADER)
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        return close_schema(version["schema"]["openAPIV3Schema"])

    @functools.cache  # noqa: B019 - one Schemas per run; the cache is the point
    def validator(self, api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
        group = api_version.split("/")[0]
        if group == "argoproj.io" and kind in WORKFLOW_KINDS:
            return self._definition(self._workflows, f"io.argoproj.workflow.v1alpha1.{kind}")
        if group == "argoproj.io" and kind in EVENTS_KINDS:
            return self._definition(self._events, f"io.argoproj.events.v1alpha1.{kind}")
        if group == "argoproj.io" and kind == "Application":
            return jsonschema.Draft7Validator(self._application)
        if group == "cilium.io" and kind == "CiliumNetworkPolicy":
            return jsonschema.Draft7Validator(CILIUM_NETWORK_POLICY)
        return None

    @staticmethod
    def _definition(document: dict[str, Any], name: str) -> jsonschema.protocols.Validator:
        schema = {"$ref": f"#/definitions/{name}", "definitions": document["definitions"]}
        return jsonschema.Draft7Validator(schema)

    @functools.cache  # noqa: B019 - one Schemas per run; the cache is the point
    def core(self, k8s_version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator:
        """kubernetes-validate's strict validator of a core kind, built once a run: its
        ``validate`` reads the kind's schema and 1.4 MB of definitions for every document.
        The files are found as it finds them; FileNotFoundError if it has none."""
        utils = kubernetes_validate.utils
        wanted = k8s_version.removeprefix("v")
        if utils.major_minor(wanted) > utils.latest_version():
            raise kubernetes_validate.VersionNotSupportedError(utils.major_minor(wanted))
        version = [
            v for v in utils.all_versions() if utils.major_minor(v) <= utils.major_minor(wanted)
        ][-1]
        # rbac.authorization.k8s.io/v1 -> rbac-v1
        group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        folder = f"kubernetes-json-schema/v{version}-local-strict"
        schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", wanted)
        definitions = utils.schema_contents(f"{folder}/_definitions.json", wanted)
        registry: referencing.Registry[Any] = referencing.Registry().with_resources(
            (resource.id() or "", resource)
            for resource in map(referencing.Resource.from_contents, (schema, definitions))
        )
        inlined = inline_refs(schema, definitions.get("$defs", {}))
        return jsonschema.Draft202012Validator(inlined, registry=registry)


def inline_refs(node: Any, definitions: dict[str, Any], within: tuple[str, ...] = ()) -> Any:
    """A copy of a schema with each ``$ref`` to ``definitions`` replaced by the definition:
    jsonschema looks a reference up each time it meets it, half its time over ten thousand
    NetworkPolicies. A definition that refers to itself keeps that ``$ref`` (the
    validator's registry resolves it), and one with keys beside it is ``allOf`` both, as
    in draft 2020-12."""
    if isinstance(node, list):
        return [inline_refs(item, definitions, within) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    name = ref.partition("#/$defs/")[2] if isinstance(ref, str) else ""
    if name not in definitions or name in within:
        return {key: inline_refs(value, definitions, within) for key, value in node.items()}
    inlined = inline_refs(definitions[name], definitions, (*within, name))
    beside = {key: inline_refs(value, definitions, within) for key, value in node.items()}
    del beside["$ref"]
    return {"allOf": [inlined], **beside} if beside else inlined


def check_document(doc: Any, schemas: Schemas, k8s_version: str) -> Iterator[tuple[str, str]]:
    """(json path, message) for every problem of one document."""
    if not isinstance(doc, dict):
        yield "", "a document must be a mapping"
        return
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        yield "", "apiVersion and kind are required"
        return
    yield from _check_name(doc, kind)
    yield from _check_size(doc)
    if api_version == "v1" and kind in ("ConfigMap", "Secret"):
        yield from _check_data(doc, kind)
    if (
        api_version.startswith("argoproj.io/")
        and kind in POD_ENV
        and isinstance(doc.get("spec"), dict)
    ):
        yield from _check_pod_env(doc)
    if (api_version, kind) == ("monitoring.coreos.com/v1", "PrometheusRule"):
        # the operator's CRD is not vendored: its spec is a rules file's groups
        from fabrique.decisions.alerts import check_rules

        unknown = set(doc) - {"apiVersion", "kind", "metadata", "spec"}
        yield from (("", f"unknown field {key!r}") for key in sorted(unknown))
        for place, message in check_rules(doc.get("spec"), operator=True):
            yield f"spec.{place}" if place else "spec", message
        return
    validator = schemas.validator(api_version, kind)
    if validator is not None:
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            yield json_path(error.absolute_path), error.message
        return
    if api_version.split("/")[0] in ("argoproj.io", "cilium.io"):
        yield "", f"no schema for {api_version} {kind}"
        return
    try:
        core = schemas.core(k8s_version, api_version, kind)
    except FileNotFoundError:
        yield "", f"no schema for {api_version} {kind} in Kubernetes {k8s_version}"
        return
    # the one error kubernetes-validate reports (jsonschema's ``validate`` raises it)
    error = jsonschema.exceptions.best_match(core.iter_errors(doc))
    if error is not None:
        yield json_path(error.absolute_path), error.message


def _check_name(doc: dict[str, Any], kind: str) -> Iterator[tuple[str, str]]:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        yield "metadata.name", "required"
        return
    pattern, limit, what = (
        (DNS_LABEL_RE, 63, "DNS-1123 label")
        if kind in LABEL_NAMED_KINDS
        else (DNS_SUBDOMAIN_RE, 253, "DNS-1123 subdomain")
    )
    if len(name) > limit or not pattern.fullmatch(name):
        yield "metadata.name", f"{name!r} is not a valid {what}"


def _check_pod_env(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    size = pod_env_size(doc)
    if size > POD_ENV_LIMIT:
        yield (
            "",
            (
                f"{size} bytes as its pod's {POD_ENV[doc['kind']]} variable, over Linux's "
                f"limit of {POD_ENV_LIMIT} bytes for one variable: its container would not "
                "start (argument list too long)"
            ),
        )


def _check_data(doc: dict[str, Any], kind: str) -> Iterator[tuple[str, str]]:
    size = data_size(doc)
    if size > DATA_LIMIT:
        yield (
            "data",
            (
                f"{size} bytes, over the API server's limit of {DATA_LIMIT} bytes (1 MiB) "
                f"for a {kind}'s data: it refuses to store it"
            ),
        )


def _check_size(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    size = len(json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode())
    if size > ETCD_REQUEST_LIMIT:
        yield (
            "",
            (
                f"{size} bytes as JSON, over etcd's default request limit of {ETCD_REQUEST_LIMIT} "
                "bytes (1.5 MiB): a default cluster refuses to store it"
            ),
        )


def json_path(path: Iterable[Any]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _describe(doc: Any) -> str:
    if isinstance(doc, dict):
        name = (
            (doc.get("metadata") or {}).get("name", "?")
            if isinstance(doc.get("metadata"), dict)
            else "?"
        )
        return f"{doc.get('kind', '?')}/{name}"
    return "?"


# ------------------------------------------------------------------ references


@dataclass(frozen=True)
class Located:
    """A document of the tree and where it is."""

    file: str
    index: int
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind", ""))

    @property
    def namespace(self) -> str | None:
        meta = self.doc.get("metadata")
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        return namespace if isinstance(namespace, str) else None

    @property
    def name(self) -> str:
        meta = self.doc.get("metadata")
        return str(meta.get("name", "?")) if isinstance(meta, dict) else "?"

    def problem(self, path: str, message: str) -> Problem:
        return Problem(self.file, self.index, f"{self.kind}/{self.name}", path, message)


def parse_external(value: str) -> tuple[str, str | None, str]:
    """``Kind/namespace/name`` (or ``Kind/name`` for a cluster-scoped kind)."""
    parts = value.split("/")
    if len(parts) == 3 and all(parts):
        return parts[0], parts[1], parts[2]
    if len(parts) == 2 and all(parts):
        return parts[0], None, parts[1]
    raise InputError(
        f"--external {value!r}: must be Kind/namespace/name or Kind/name "
        "(ServiceAccount/fabrique-build/builder)"
    )


class _Objects:
    """What the tree (and the declared externals) holds, by kind, namespace and name."""

    def __init__(
        self, documents: list[Located], external: Iterable[tuple[str, str | None, str]]
    ) -> None:
        self._known: set[tuple[str, str | None, str]] = set(external)
        self.docs: dict[tuple[str, str | None, str], Located] = {}
        for located in documents:
            key = (located.kind, located.namespace, located.name)
            self._known.add(key)
            self.docs[key] = located

    def has(self, kind: str, namespace: str | None, name: str) -> bool:
        # a document without a namespace lands in whichever one kubectl is given
        return (kind, namespace, name) in self._known or any(
            k == kind and n == name and (namespace is None or ns is None)
            for k, ns, n in self._known
        )

    def find(self, kind: str, namespace: str | None, name: str) -> Located | None:
        return self.docs.get((kind, namespace, name)) or self.docs.get((kind, None, name))


_TEMPLATE_KINDS = frozenset({"Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate"})
_DEPENDS_WORD = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_]*(?:\.[A-Za-z]+)?")


def _workflow_spec(located: Located) -> tuple[str, dict[str, Any]] | None:
    spec = located.doc.get("spec")
    if not isinstance(spec, dict):
        return None
    if located.kind == "CronWorkflow":
        inner = spec.get("workflowSpec")
        return ("spec.workflowSpec", inner) if isinstance(inner, dict) else None
    return ("spec", spec) if located.kind in _TEMPLATE_KINDS else None


def _template_names(spec: dict[str, Any]) -> set[str]:
    templates = spec.get("templates") or []
    return {str(t["name"]) for t in templates if isinstance(t, dict) and "name" in t}


def _templated(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def check_references(
    documents: list[Located], external: Iterable[tuple[str, str | None, str]] = ()
) -> list[Problem]:
    """Names one document gives another that a controller would look up and not find."""
    objects = _Objects(documents, external)
    problems: list[Problem] = []
    for located in documents:
        problems += _template_references(located, objects)
        problems += _service_accounts(located, objects)
        problems += _role_refs(located, objects)
    return problems


def _template_references(located: Located, objects: _Objects) -> Iterator[Problem]:
    found = _workflow_spec(located)
    if found is None:
        return
    where, spec = found
    names = _template_names(spec)

    def named(path: str, name: Any, what: str) -> Iterator[Problem]:
        if isinstance(name, str) and not _templated(name) and name not in names:
            yield located.problem(path, f"{what} {name!r} is not a template of this {located.kind}")

    def call(path: str, node: dict[str, Any]) -> Iterator[Problem]:
        """A step, a task or a hook: it runs a template, a templateRef or an inline one."""
        if "template" in node:
            yield from named(f"{path}.template", node["template"], "template")
        ref = node.get("templateRef")
        if isinstance(ref, dict):
            yield from _template_ref(located, objects, f"{path}.templateRef", ref)
        if "onExit" in node:
            yield from named(f"{path}.onExit", node["onExit"], "exit handler")
        for hook, body in (node.get("hooks") or {}).items():
            if isinstance(body, dict):
                yield from call(f"{path}.hooks.{hook}", body)

    if "entrypoint" in spec:
        yield from named(f"{where}.entrypoint", spec["entrypoint"], "entrypoint")
    if "onExit" in spec:
        yield from named(f"{where}.onExit", spec["onExit"], "exit handler")
    for hook, body in (spec.get("hooks") or {}).items():
        if isinstance(body, dict):
            yield from call(f"{where}.hooks.{hook}", body)
    for t_index, template in enumerate(spec.get("templates") or []):
        if not isinstance(template, dict):
            continue
        base = f"{where}.templates[{t_index}]"
        for g_index, group in enumerate(template.get("steps") or []):
            for s_index, step in enumerate(group if isinstance(group, list) else []):
                if isinstance(step, dict):
                    yield from call(f"{base}.steps[{g_index}][{s_index}]", step)
        tasks = (template.get("dag") or {}).get("tasks") or []
        task_names = {str(t.get("name")) for t in tasks if isinstance(t, dict)}
        for k_index, task in enumerate(tasks):
            if not isinstance(task, dict):
                continue
            path = f"{base}.dag.tasks[{k_index}]"
            yield from call(path, task)
            for d_index, dependency in enumerate(task.get("dependencies") or []):
                if dependency not in task_names:
                    yield located.problem(
                        f"{path}.dependencies[{d_index}]",
                        f"{dependency!r} is not a task of this DAG",
                    )
            depends = task.get("depends")
            if isinstance(depends, str):
                for word in _DEPENDS_WORD.findall(depends):
                    task_name = word.split(".")[0]
                    if task_name not in task_names:
                        yield located.problem(
                            f"{path}.depends", f"{task_name!r} is not a task of this DAG"
                        )


def _template_ref(
    located: Located, objects: _Objects, path: str, ref: dict[str, Any]
) -> Iterator[Problem]:
    name, template = ref.get("name"), ref.get("template")
    if _templated(name) or _templated(template):
        return
    kind = "ClusterWorkflowTemplate" if ref.get("clusterScope") else "WorkflowTemplate"
    namespace = None if kind == "ClusterWorkflowTemplate" else located.namespace
    target = objects.find(kind, namespace, str(name))
    if target is None:
        if not objects.has(kind, namespace, str(name)):
            yield located.problem(
                f"{path}.name",
                f"{kind} {name!r} is not in the tree (declare it with --external "
                f"{kind}/{'' if namespace is None else namespace + '/'}{name})",
            )
        return
    target_spec = target.doc.get("spec")
    if isinstance(target_spec, dict) and template not in _template_names(target_spec):
        yield located.problem(f"{path}.template", f"{kind} {name!r} has no template {template!r}")


def _service_accounts(located: Located, objects: _Objects) -> Iterator[Problem]:
    if located.kind == "ServiceAccount":
        return

    def walk(node: Any, path: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, dict):
            for key, value in node.items():
                here = f"{path}.{key}" if path else str(key)
                if key == "serviceAccountName" and isinstance(value, str):
                    yield here, value
                else:
                    yield from walk(value, here)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                yield from walk(item, f"{path}[{index}]")

    for path, name in walk(located.doc, ""):
        # every namespace has its "default" ServiceAccount
        if name == "default" or _templated(name):
            continue
        if not objects.has("ServiceAccount", located.namespace, name):
            namespace = located.namespace or "<namespace>"
            yield located.problem(
                path,
                f"ServiceAccount {name!r} is not in the tree (in namespace {namespace}; "
                f"declare it with --external ServiceAccount/{namespace}/{name})",
            )


def _role_refs(located: Located, objects: _Objects) -> Iterator[Problem]:
    if located.kind != "RoleBinding":
        return
    ref = located.doc.get("roleRef")
    if not isinstance(ref, dict) or ref.get("kind") != "Role":
        return  # a ClusterRole may be one the cluster ships (view, edit)
    name = str(ref.get("name"))
    if not objects.has("Role", located.namespace, name):
        namespace = located.namespace or "<namespace>"
        yield located.problem(
            "roleRef.name",
            f"Role {name!r} is not in the tree (in namespace {namespace}; "
            f"declare it with --external Role/{namespace}/{name})",
        )


def validate_tree(
    root: Path,
    specs: Path,
    *,
    k8s_version: str | None = None,
    external: Iterable[tuple[str, str | None, str]] = (),
) -> list[Problem]:
    """Every problem in every YAML file under ``root`` (kustomization files excepted)."""
    if not root.is_dir():
        raise InputError(f"{root}: not a directory")
    schemas = Schemas(specs)
    version = k8s_version or latest_version()
    problems: list[Problem] = []
    located: list[Located] = []
    files = sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise InputError(f"{root}: no YAML files to validate")
    for path in files:
        relative = str(path.relative_to(root))
        try:
            text = path.read_text("utf-8")
            documents = [d for d in yaml.load_all(text, Loader=LOADER) if d is not None]
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f"line {mark.line + 1}: " if mark is not None else ""
            problems.append(Problem(relative, 0, "?", "", f"{line}not valid YAML"))
            continue
        if path.name == "kustomization.yaml":
            continue  # kustomize's own config: checked by `kubectl kustomize` below
        for index, doc in enumerate(documents):
            for json_path, message in check_document(doc, schemas, version):
                problems.append(Problem(relative, index, _describe(doc), json_path, message))
            if isinstance(doc, dict):
                located.append(Located(relative, index, doc))
    return problems + check_references(located, external) + check_duplicates(located)


def validate_rules_file(path: Path) -> list[Problem]:
    """Every problem of a Prometheus rules file (``fabrique alerts``'), as for a tree's."""
    from fabrique.decisions.alerts import check_rules

    try:
        spec = yaml.load(path.read_text("utf-8"), Loader=LOADER)
    except OSError as exc:
        raise InputError(f"--rules {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        return [Problem(str(path), 0, "rules", "", f"{line}not valid YAML")]
    return [Problem(str(path), 0, "rules", where, why) for where, why in check_rules(spec)]


def check_duplicates(documents: list[Located]) -> list[Problem]:
    """Each document that is an object an earlier one already is: the same API group,
    kind, namespace and name (the version aside, as the API server stores them; no
    namespace is kustomize's ``default``). Named with both places."""
    first: dict[tuple[str, str, str, str], Located] = {}
    problems: list[Problem] = []
    for located in documents:
        api_version = str(located.doc.get("apiVersion", ""))
        group = api_version.split("/")[0] if "/" in api_version else ""
        namespace = located.namespace or "default"
        key = (group, located.kind, namespace, located.name)
        earlier = first.setdefault(key, located)
        if earlier is not located:
            problems.append(
                located.problem(
                    "metadata.name",
                    f"{located.kind} {located.name} in namespace {namespace} is also "
                    f"{earlier.file} document {earlier.index}: the cluster keeps one of them; "
                    "remove one",
                )
            )
    return problems


KUSTOMIZE_TIMEOUT = 120  # seconds
KUSTOMIZATION_FILES = frozenset({"kustomization.yaml", "kustomization.yml", "Kustomization"})
# the fields of a kustomization whose build does not depend on which objects the files
# hold: a patch, a replacement or a namespace acts on the very objects a cut file lacks
CUT_SAFE_FIELDS = frozenset(
    {
        "apiVersion",
        "kind",
        "metadata",
        "resources",
        "bases",
        "labels",
        "commonLabels",
        "commonAnnotations",
        "images",
    }
)
# a line that starts a YAML document, and a top-level apiVersion or kind: block style, as
# render writes and people do (a document these miss is kept whole, never dropped)
_DOCUMENT_START = re.compile(r"^---(?=\s|$)", re.MULTILINE)
_TOP_KEY = re.compile(r"^(apiVersion|kind):[ \t]*(\S*)", re.MULTILINE)


def first_of_each_kind(text: str) -> str:
    """The documents of a YAML stream that no earlier one matches in apiVersion and kind,
    each as written (a document without a top-level ``kind`` is kept)."""
    starts = [0, *(match.start() for match in _DOCUMENT_START.finditer(text) if match.start())]
    seen: set[tuple[str, str]] = set()
    kept: list[str] = []
    for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
        document = text[start:end]
        keys = dict(_TOP_KEY.findall(document))
        if "kind" in keys:
            kind = (keys.get("apiVersion", ""), keys["kind"])
            if kind in seen:
                continue
            seen.add(kind)
        kept.append(document)
    return "".join(kept)


def cut_tree(root: Path, into: Path) -> bool:
    """A copy of the tree in ``into`` for kustomize to build in time that does not grow
    with the objects: every kustomization file as it is, every other YAML file cut to
    ``first_of_each_kind``. False, and ``into`` of no use, where a kustomization's build
    needs the objects themselves (``CUT_SAFE_FIELDS``) or a resource outside the tree."""
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        copy = into / path.relative_to(root)
        copy.parent.mkdir(parents=True, exist_ok=True)
        if path.name in KUSTOMIZATION_FILES:
            if not _cut_safe(path, root):
                return False
            shutil.copyfile(path, copy)
        elif path.suffix in (".yaml", ".yml"):
            copy.write_text(first_of_each_kind(path.read_text("utf-8")), "utf-8")
        else:
            shutil.copyfile(path, copy)
    return True


def _cut_safe(kustomization: Path, root: Path) -> bool:
    try:
        doc = yaml.load(kustomization.read_text("utf-8"), Loader=LOADER)
    except yaml.YAMLError:
        return True  # kustomize refuses it, cut or not
    if not isinstance(doc, dict):
        return True
    if not set(doc) <= CUT_SAFE_FIELDS:
        return False
    entries = [*(doc.get("resources") or []), *(doc.get("bases") or [])]
    if not all(isinstance(entry, str) for entry in entries):
        return True  # kustomize refuses it, cut or not
    inside = root.resolve()
    for entry in entries:
        local = (kustomization.parent / entry).resolve()
        if "://" not in entry and not local.is_relative_to(inside):
            return False
    return True


def kustomize_check(root: Path) -> str | None:
    """``kubectl kustomize`` over the tree: None if it builds, else its error line.

    kustomize checks each object it adds against every object before it, so a build of
    the whole tree costs the square of its objects (six minutes at ten thousand apps).
    What it checks beyond the documents, validate's own checks aside (the ids that
    ``check_duplicates`` holds, the fields ``check_document`` does), is the kustomize
    structure: the files each kustomization lists, its labels, objects kustomize can read.
    So it builds ``cut_tree``'s copy: as many objects at ten thousand apps as at one.

    Raises FileNotFoundError when kubectl is not installed (the caller says it skipped).
    """
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise FileNotFoundError("kubectl")
    with tempfile.TemporaryDirectory(prefix="fabrique-kustomize-") as temporary:
        cut = Path(temporary) / root.name
        built = cut if cut_tree(root, cut) else root
        try:
            result = subprocess.run(
                [kubectl, "kustomize", str(built)],
                capture_output=True,
                text=True,
                timeout=KUSTOMIZE_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"did not finish in {KUSTOMIZE_TIMEOUT} s"
    if result.returncode == 0:
        return None
    lines = [line.replace(str(built), str(root)) for line in result.stderr.splitlines()]
    lines = [line for line in lines if line.strip()]
    return lines[-1] if lines else f"kubectl kustomize exited {result.returncode}"
