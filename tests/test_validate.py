"""Strict validation: the committed tree passes, and each kind of mistake is caught."""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from fabrique.validate import close_schema, validate_tree

from .conftest import ROOT, run_cli


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    copy = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", copy)
    return copy


@pytest.fixture()
def with_kubectl(kubectl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubectl peer first on ``PATH``, where ``fabrique validate`` looks for it."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "kubectl").symlink_to(kubectl)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def _edit(path: Path, index: int, edit) -> None:  # type: ignore[no-untyped-def]
    docs = list(yaml.safe_load_all(path.read_text()))
    edit(docs[index])
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def test_committed_tree_is_valid(specs: Path, with_kubectl: None) -> None:
    result = run_cli("validate", str(ROOT / "manifests"), "--specs", str(specs))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip().endswith(": valid")
    assert "notice: kubectl not found" not in result.stderr, "kustomize checked it too"


def test_misspelled_container_field_is_caught(tree: Path, specs: Path) -> None:
    misspelled: list[int] = []

    def misspell(doc: dict) -> None:
        index, template = next(
            (i, t) for i, t in enumerate(doc["spec"]["templates"]) if "container" in t
        )
        template["containr"] = template.pop("container")
        misspelled.append(index)

    _edit(tree / "build" / "workflowtemplate.yaml", 0, misspell)
    result = run_cli("validate", str(tree), "--specs", str(specs))
    assert result.exit_code == 6
    assert (
        "build/workflowtemplate.yaml: document 0 (WorkflowTemplate/fabrique-build): "
        f"spec.templates[{misspelled[0]}]: Additional properties are not allowed "
        "('containr' was unexpected)"
    ) in result.stderr


def test_misspelled_field_deep_in_a_container_is_caught(tree: Path, specs: Path) -> None:
    where: list[str] = []

    def misspell(doc: dict) -> None:
        # the build container, in the containerSet of the build's pod
        for index, template in enumerate(doc["spec"]["templates"]):
            for number, container in enumerate(
                (template.get("containerSet") or {}).get("containers", [])
            ):
                if container["name"] == "build":
                    container["securityContext"]["runAsUsr"] = 1000
                    where.append(f"spec.templates[{index}].containerSet.containers[{number}]")

    _edit(tree / "build" / "workflowtemplate.yaml", 0, misspell)
    problems = [str(p) for p in validate_tree(tree, specs)]
    assert len(problems) == 1
    assert f"{where[0]}.securityContext" in problems[0]
    assert "'runAsUsr' was unexpected" in problems[0]


def test_core_kinds_are_checked_strictly(tree: Path, specs: Path) -> None:
    _edit(tree / "build" / "configmaps.yaml", 1, lambda doc: doc.update(datta={"a": "b"}))
    _edit(tree / "build" / "rbac.yaml", 2, lambda doc: doc["rules"][0].update(verb=["get"]))
    problems = [str(p) for p in validate_tree(tree, specs)]
    assert any("document 1 (ConfigMap/fabrique-site)" in p and "'datta'" in p for p in problems)
    assert any("document 2 (Role/fabrique-executor)" in p and "'verb'" in p for p in problems)


def test_bad_names_and_missing_kinds_are_caught(tree: Path, specs: Path) -> None:
    _edit(
        tree / "namespaces" / "namespaces.yaml",
        0,
        lambda doc: doc["metadata"].update(name="Fabrique_NS"),
    )
    _edit(tree / "build" / "rbac.yaml", 0, lambda doc: doc.pop("kind"))
    problems = [str(p) for p in validate_tree(tree, specs)]
    assert any("metadata.name: 'Fabrique_NS' is not a valid DNS-1123 label" in p for p in problems)
    assert any("apiVersion and kind are required" in p for p in problems)


def test_unknown_argo_kind_has_no_schema(tree: Path, specs: Path) -> None:
    (tree / "build" / "extra.yaml").write_text(
        "apiVersion: argoproj.io/v1alpha1\nkind: WorkflowThing\nmetadata:\n  name: x\n"
    )
    problems = [str(p) for p in validate_tree(tree, specs)]
    assert any("no schema for argoproj.io/v1alpha1 WorkflowThing" in p for p in problems)


def test_kustomize_failure_is_reported(tree: Path, specs: Path, with_kubectl: None) -> None:
    root = tree / "kustomization.yaml"
    doc = yaml.safe_load(root.read_text())
    doc["resources"].append("missing-unit")
    root.write_text(yaml.safe_dump(doc))
    result = run_cli("validate", str(tree), "--specs", str(specs))
    assert result.exit_code == 6
    assert "kubectl kustomize:" in result.stderr and "missing-unit" in result.stderr


def test_without_kubectl_the_kustomize_check_is_skipped_with_a_notice(
    tree: Path, specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    result = run_cli("validate", str(tree), "--specs", str(specs))
    assert result.exit_code == 0
    assert "notice: kubectl not found" in result.stderr


def test_missing_specs_is_a_clear_error(tree: Path, tmp_path: Path) -> None:
    result = run_cli("validate", str(tree), "--specs", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: --specs {tmp_path / 'nowhere'}: holds no argo-workflows-v4.1.2.schema.json"
    )


def test_close_schema_closes_objects_but_respects_preserve_unknown() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "free": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {},
            },
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    closed = close_schema(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["free"]
    assert closed["properties"]["labels"]["additionalProperties"] == {"type": "string"}
    assert "additionalProperties" not in schema, "the input schema must not be modified"


def test_an_object_over_etcds_default_request_limit_is_refused_by_name_and_size(
    tmp_path: Path, specs: Path
) -> None:
    """A default cluster's etcd takes no write over 1.5 MiB: the object is named with its
    size; one just under the limit passes."""
    from fabrique.site.limits import ETCD_REQUEST_LIMIT

    def template(name: str, size: int) -> dict[str, object]:
        def doc(source: str) -> dict[str, object]:
            script = {"image": "registry:80/base/busybox:1.35", "source": source}
            spec = {"entrypoint": "main", "templates": [{"name": "main", "script": script}]}
            return {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate",
                    "metadata": {"name": name}, "spec": spec}  # fmt: skip

        framing = len(json.dumps(doc(""), separators=(",", ":")))
        return doc("x" * (size - framing))

    (tmp_path / "objects.yaml").write_text(
        yaml.safe_dump_all(
            [template("fits", ETCD_REQUEST_LIMIT), template("too-big", ETCD_REQUEST_LIMIT + 1)]
        )
    )
    problems = [str(p) for p in validate_tree(tmp_path, specs)]
    assert problems == [
        f"objects.yaml: document 1 (WorkflowTemplate/too-big): {ETCD_REQUEST_LIMIT + 1} bytes "
        f"as JSON, over etcd's default request limit of {ETCD_REQUEST_LIMIT} bytes (1.5 MiB): a "
        "default cluster refuses to store it"
    ]


def test_a_config_map_or_secret_over_the_api_servers_data_limit_is_refused_by_name_and_size(
    tmp_path: Path, specs: Path
) -> None:
    """The API server takes no ConfigMap whose data and binaryData sum over 1 MiB, nor a
    Secret whose data does (decoded), far under etcd's limit: each is named with its
    size; one at the limit passes."""
    from fabrique.site.limits import DATA_LIMIT

    def config_map(name: str, size: int) -> dict[str, object]:
        binary = base64.b64encode(b"\0" * 1024).decode()  # 1 KiB once decoded
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                "data": {"text": "x" * (size - 1024)}, "binaryData": {"blob": binary}}  # fmt: skip

    def secret(name: str, size: int) -> dict[str, object]:
        data = {"token": base64.b64encode(b"t" * (size - 10)).decode()}
        return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                "data": data, "stringData": {"extra": "s" * 10}}  # fmt: skip

    (tmp_path / "objects.yaml").write_text(
        yaml.safe_dump_all(
            [
                config_map("fits", DATA_LIMIT),
                config_map("too-big", DATA_LIMIT + 1),
                secret("fits", DATA_LIMIT),
                secret("too-big", DATA_LIMIT + 1),
            ]
        )
    )
    problems = [str(p) for p in validate_tree(tmp_path, specs)]
    assert problems == [
        f"objects.yaml: document {n} ({kind}/too-big): data: {DATA_LIMIT + 1} bytes, over the "
        f"API server's limit of {DATA_LIMIT} bytes (1 MiB) for a {kind}'s data: it refuses to "
        "store it"
        for n, kind in ((1, "ConfigMap"), (3, "Secret"))
    ]


def test_a_sensor_its_pod_could_not_be_handed_is_refused_by_name_and_size(
    tmp_path: Path, specs: Path
) -> None:
    """The Argo Events controller hands a Sensor to its pod as one environment variable,
    which Linux caps at 128 KiB: a Sensor over it, though far under etcd's limit, is
    named with the variable's size."""
    from bench.render import values_with
    from eventsources.sensor import sensor
    from fabrique.site.config import parse_site
    from fabrique.site.limits import POD_ENV_LIMIT, pod_env_size

    small = sensor(parse_site(values_with(3)))
    large = sensor(parse_site(values_with(3)), "fabrique-build-large")
    large["spec"]["dependencies"][0]["filters"]["data"][1]["value"] = ["^" + "a" * 100_000 + "$"]
    assert pod_env_size(small) < POD_ENV_LIMIT < pod_env_size(large)
    (tmp_path / "sensors.yaml").write_text(yaml.safe_dump_all([small, large]))
    problems = [str(p) for p in validate_tree(tmp_path, specs) if "variable" in str(p)]
    assert problems == [
        f"sensors.yaml: document 1 (Sensor/fabrique-build-large): {pod_env_size(large)} bytes "
        f"as its pod's SENSOR_OBJECT variable, over Linux's limit of {POD_ENV_LIMIT} bytes "
        "for one variable: its container would not start (argument list too long)"
    ]


@pytest.mark.parametrize("character", ["<", ">", "&", "\u2028", "\u2029"])
def test_a_sensor_s_variable_is_counted_as_go_writes_its_json(character: str) -> None:
    """Go's encoding/json writes ``<``, ``>`` and ``&`` as ``\\u003c``, ``\\u003e``,
    ``\\u0026`` (and U+2028, U+2029 escaped too): six bytes each of the JSON that the
    controller base64-encodes into the variable, not one."""
    from bench.render import values_with
    from eventsources.sensor import sensor
    from fabrique.site.config import parse_site
    from fabrique.site.limits import pod_env_size

    plain = sensor(parse_site(values_with(1)))
    escaped = copy.deepcopy(plain)
    plain["spec"]["eventBusName"] = "a" * 300
    escaped["spec"]["eventBusName"] = character * 300
    # 300 times 5 bytes more of JSON, 2 000 of base64
    assert pod_env_size(escaped) - pod_env_size(plain) == 2000


def test_a_core_kinds_schema_is_read_once_a_run_not_once_a_document(
    tmp_path: Path, specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubernetes-validate reads a kind's schema and its 1.4 MB of definitions for every
    document it checks: a site of ten thousand apps has ten thousand NetworkPolicies.
    validate reads each once, and still checks every document."""
    import kubernetes_validate.utils

    read: list[str] = []
    real = kubernetes_validate.utils.schema_contents

    def counting(filename: str, desired_version: str) -> object:
        read.append(filename.rsplit("/", 1)[-1])
        return real(filename, desired_version)

    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents", counting)
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
    }
    documents = [
        {**copy.deepcopy(policy), "metadata": {"name": f"p{n}", "namespace": "a"}}
        for n in range(30)
    ]
    documents[7]["spec"]["podSelectr"] = {}
    (tmp_path / "policies.yaml").write_text(yaml.safe_dump_all(documents))
    problems = [str(p) for p in validate_tree(tmp_path, specs)]
    assert sorted(read) == ["_definitions.json", "networkpolicy-networking-v1.json"]
    assert len(problems) == 1 and "document 7 (NetworkPolicy/p7)" in problems[0], problems
    assert "'podSelectr' was unexpected" in problems[0]


def test_a_file_that_is_no_yaml_is_named_with_its_line(tmp_path: Path, specs: Path) -> None:
    """The tree is parsed by libyaml where PyYAML has it: a broken file is still named
    with the line where it breaks."""
    (tmp_path / "broken.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: [\n")
    problems = [str(p) for p in validate_tree(tmp_path, specs)]
    assert problems == ["broken.yaml: document 0 (?): line 4: not valid YAML"]


# ------------------------------------------------------------------ the kustomize check

# a kubectl that builds nothing: it keeps a copy of the tree it is given, in $SEEN/<n>
_SEEING_KUBECTL = """#!{python}
import os, shutil, sys
from pathlib import Path
seen = Path(os.environ["SEEN"])
shutil.copytree(sys.argv[2], seen / str(len(list(seen.iterdir()))))
(seen.parent / "given").write_text(sys.argv[2])
"""


@pytest.fixture()
def seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the copies of the trees a seeing kubectl (first on ``PATH``) was given go."""
    folder, seen = tmp_path / "seeing-bin", tmp_path / "seeing" / "trees"
    folder.mkdir()
    seen.mkdir(parents=True)
    kubectl = folder / "kubectl"
    kubectl.write_text(_SEEING_KUBECTL.format(python=sys.executable))
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("SEEN", str(seen))
    return seen


def _objects(tree: Path) -> list[tuple[str, str]]:
    """Each object of a tree by its file and kind, kustomization files aside."""
    return sorted(
        (str(path.relative_to(tree)), doc["kind"])
        for path in tree.rglob("*.yaml")
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    )


def test_the_kustomize_check_builds_a_tree_that_does_not_grow_with_the_apps(
    tmp_path: Path, seen: Path
) -> None:
    """kustomize checks each object it adds against every one before it, so a build of
    the whole tree grows with the square of the apps (six minutes at ten thousand). The
    check builds the tree's kustomization files as they are over each file's first object
    of each kind: as many at forty apps as at three."""
    from bench.render import values_with
    from fabrique.render import render_tree, write_tree
    from fabrique.site.config import parse_site
    from fabrique.validate import kustomize_check

    given: dict[int, list[tuple[str, str]]] = {}
    for apps in (3, 40):
        tree = tmp_path / f"tree-{apps}"
        write_tree(render_tree(parse_site(values_with(apps))), tree)
        assert kustomize_check(tree) is None
        (built,) = sorted(seen.iterdir(), key=lambda p: int(p.name))[-1:]
        given[apps] = _objects(built)
        assert len(given[apps]) < len(_objects(tree))
        assert {p.relative_to(built) for p in built.rglob("*")} == {
            p.relative_to(tree) for p in tree.rglob("*")
        }, "every file is there"
        for kustomization in tree.rglob("kustomization.yaml"):
            assert (built / kustomization.relative_to(tree)).read_text() == (
                kustomization.read_text()
            ), "the kustomization files as they are"
        assert {kind for _, kind in given[apps]} == {kind for _, kind in _objects(tree)}
    assert given[3] == given[40]


@pytest.mark.parametrize(
    "field",
    [
        {"namespace": "elsewhere"},
        {"patches": [{"path": "patch.yaml", "target": {"kind": "Role"}}]},
        {"resources": ["configmaps.yaml", "rbac.yaml", "workflowtemplate.yaml", "../../outside"]},
    ],
    ids=["namespace", "patches", "outside"],
)
def test_a_kustomization_whose_build_needs_every_object_is_built_whole(
    tree: Path, seen: Path, field: dict[str, object]
) -> None:
    """A patch, a replacement or a namespace acts on objects the cut tree lacks, and a
    resource outside the tree is not in its copy: kustomize is then given the tree."""
    from fabrique.validate import kustomize_check

    unit = tree / "build" / "kustomization.yaml"
    unit.write_text(yaml.safe_dump({**yaml.safe_load(unit.read_text()), **field}))
    kustomize_check(tree)
    assert (seen.parent / "given").read_text() == str(tree)


def test_a_unit_listing_a_missing_file_is_refused(
    tree: Path, specs: Path, with_kubectl: None
) -> None:
    unit = tree / "build" / "kustomization.yaml"
    doc = yaml.safe_load(unit.read_text())
    doc["resources"].append("secrets.yaml")
    unit.write_text(yaml.safe_dump(doc))
    result = run_cli("validate", str(tree), "--specs", str(specs))
    assert result.exit_code == 6
    assert "kubectl kustomize:" in result.stderr and "secrets.yaml" in result.stderr


def test_a_kustomization_with_an_unknown_field_is_refused(
    tree: Path, specs: Path, with_kubectl: None
) -> None:
    unit = tree / "build" / "kustomization.yaml"
    unit.write_text(unit.read_text().replace("resources:", "resource:"))
    result = run_cli("validate", str(tree), "--specs", str(specs))
    assert result.exit_code == 6
    assert "kubectl kustomize:" in result.stderr and "resource" in result.stderr


def test_an_object_twice_in_the_tree_is_refused_naming_both_places(
    tree: Path, specs: Path, with_kubectl: None
) -> None:
    """One object in two files: kustomize refuses the whole tree's build, and the cluster
    would keep the last applied. Neither is the first object of its kind in its file, so
    only validate's own check sees them both."""
    build_rbac, control_rbac = tree / "build" / "rbac.yaml", tree / "control" / "rbac.yaml"
    twice = list(yaml.safe_load_all(build_rbac.read_text()))[1]
    assert (twice["kind"], twice["metadata"]["name"]) == ("ServiceAccount", "fabrique-executor")
    docs = [d for d in yaml.safe_load_all(control_rbac.read_text()) if d]
    control_rbac.write_text(yaml.safe_dump_all([*docs, twice], sort_keys=False))
    result = run_cli("validate", str(tree), "--specs", str(specs))
    assert result.exit_code == 6
    assert (
        f"control/rbac.yaml: document {len(docs)} (ServiceAccount/fabrique-executor): "
        "metadata.name: ServiceAccount fabrique-executor in namespace fabrique-build is "
        "also build/rbac.yaml document 1: the cluster keeps one of them; remove one"
    ) in result.stderr.splitlines()


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        ({"namespace": "a"}, {"namespace": "a"}, True),
        ({"namespace": "default"}, {}, True),  # kustomize's default namespace
        ({"namespace": "a"}, {"namespace": "b"}, False),
        ({"apiVersion": "rbac.authorization.k8s.io/v1beta1"}, {}, True),  # one object
        ({"kind": "ClusterRole"}, {}, False),
    ],
)
def test_an_object_is_one_by_its_group_kind_namespace_and_name(
    tmp_path: Path, specs: Path, first: dict[str, str], second: dict[str, str], same: bool
) -> None:
    def role(changes: dict[str, str]) -> dict[str, object]:
        meta = {
            "name": "reader",
            **({"namespace": changes["namespace"]} if "namespace" in changes else {}),
        }
        return {"apiVersion": changes.get("apiVersion", "rbac.authorization.k8s.io/v1"),
                "kind": changes.get("kind", "Role"), "metadata": meta, "rules": []}  # fmt: skip

    (tmp_path / "a.yaml").write_text(yaml.safe_dump(role(first)))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(role(second)))
    twice = [str(p) for p in validate_tree(tmp_path, specs) if "is also" in str(p)]
    assert len(twice) == same, twice


def test_a_core_kinds_validator_looks_up_no_reference(specs: Path) -> None:
    """jsonschema resolves a ``$ref`` each time it meets one: half of validate's time over
    ten thousand NetworkPolicies. The core kinds' definitions are inlined once a run."""
    from kubernetes_validate.utils import latest_version

    from fabrique.validate import Schemas

    schemas = Schemas(specs)
    for api_version, kind in (("networking.k8s.io/v1", "NetworkPolicy"), ("v1", "ConfigMap")):
        validator = schemas.core(latest_version(), api_version, kind)
        assert "$ref" not in json.dumps(validator.schema), kind


def test_a_definition_that_refers_to_itself_keeps_its_reference() -> None:
    from fabrique.validate import inline_refs

    definitions = {
        "Props": {"type": "object", "properties": {"items": {"$ref": "/d.json#/$defs/Props"}}},
        "Meta": {"type": "object"},
    }
    schema = {"properties": {"spec": {"$ref": "/d.json#/$defs/Props"},
              "metadata": {"$ref": "/d.json#/$defs/Meta", "description": "kept"}}}  # fmt: skip
    inlined = inline_refs(schema, definitions)
    spec = inlined["properties"]["spec"]
    assert spec["properties"]["items"] == {"$ref": "/d.json#/$defs/Props"}
    assert inlined["properties"]["metadata"] == {
        "allOf": [{"type": "object"}],
        "description": "kept",
    }
