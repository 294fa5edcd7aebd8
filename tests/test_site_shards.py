"""The site as the pods read it, at any size: split by render into ConfigMaps that each
fit the limits on their way into a cluster, read back by the loader into the same Site."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.render import values_with
from fabrique.render import build_unit, control_unit, mirror_unit, reconcile_unit
from fabrique.site.config import Site, load_site, parse_site, shard_digest
from fabrique.site.errors import ConfigError
from fabrique.site.files import SITE_DATA_TARGET, site_files
from fabrique.site.limits import ANNOTATIONS_LIMIT, DATA_LIMIT, data_size, go_json
from fabrique.validate import _check_data, _check_size

from .conftest import write_values

LARGE = 10_000


@pytest.fixture(scope="module")
def large() -> Site:
    return parse_site(values_with(LARGE))


def unpack(site: Site, folder: Path) -> Path:
    """The site's files in ``folder`` as a pod's projected volume holds them."""
    for file in site_files(site):
        (folder / file.key).write_text(file.text, "utf-8")
    return folder / "site.yaml"


def pod_sources(pod: dict[str, Any]) -> list[str]:
    """The ConfigMaps the site's volume of a pod spec projects, checked to be mounted
    where FABRIQUE_VALUES points."""
    (volume,) = [v for v in pod["volumes"] if v["name"] == "fabrique-site"]
    assert set(volume) == {"name", "projected"}
    return [source["configMap"]["name"] for source in volume["projected"]["sources"]]


# ---------------------------------------------------------------- read back


def test_a_large_site_reads_back_the_same_from_its_files(large: Site, tmp_path: Path) -> None:
    files = site_files(large)
    numbers = range(2, len(files) + 1)
    assert [f.key for f in files] == ["site.yaml", *(f"site-{n}.yaml" for n in numbers)]
    assert [f.configmap for f in files] == [
        "fabrique-site",
        *(f"fabrique-site-{n}" for n in numbers),
    ]
    # as few as hold the apps: each but the last is full to within an app
    total = sum(len(go_json(f.text)) - 2 for f in files)  # as the ConfigMaps carry them
    assert 1 < len(files) <= total // (SITE_DATA_TARGET - 4096) + 1
    # one folder, one key per file: no file hides another
    assert len({f.key for f in files}) == len(files)
    back = load_site(unpack(large, tmp_path), env={})
    assert back == large
    assert [app.name for app in back.apps] == [app.name for app in large.apps]


def test_a_small_site_is_one_file_with_no_apps_from() -> None:
    site = load_site(env={})
    (file,) = site_files(site)
    assert (file.configmap, file.key) == ("fabrique-site", "site.yaml")
    values = yaml.safe_load(file.text)
    assert "appsFrom" not in values
    assert parse_site(values) == site


def _split_values(tmp_path: Path) -> Path:
    """A values file whose apps go on in two files beside it, written by hand."""
    apps = values_with(3)["apps"]
    (tmp_path / "more.yaml").write_text(yaml.safe_dump(apps[1:2]))
    (tmp_path / "last.yaml").write_text(yaml.safe_dump(apps[2:]))
    values = write_values(tmp_path / "site.yaml", apps=apps[:1])
    data = yaml.safe_load(values.read_text())
    data["appsFrom"] = [{"file": "more.yaml"}, {"file": "last.yaml"}]
    values.write_text(yaml.safe_dump(data))
    return values


def test_apps_from_continues_the_apps_in_order(tmp_path: Path) -> None:
    site = load_site(_split_values(tmp_path), env={})
    assert [app.name for app in site.apps] == ["app-000", "app-001", "app-002"]
    # an override's index counts every app, wherever it is written
    moved = load_site(_split_values(tmp_path), env={"FABRIQUE_APPS__2__CONTEXT": "src/last"})
    assert moved.apps[2].context == "src/last"


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: (d / "last.yaml").unlink(), r"^values file \S+/last\.yaml: not found$"),
        (
            lambda d: (d / "more.yaml").write_text("- name: x\n  image: [\n"),
            r"^values file \S+/more\.yaml: line 3: ",
        ),
        (
            lambda d: (d / "more.yaml").write_text("name: x\n"),
            r"^values file \S+/more\.yaml: must be a list of apps, which continue "
            r"site\.yaml's apps \(appsFrom\[0\]\)$",
        ),
        (
            lambda d: (d / "site.yaml").write_text(
                (d / "site.yaml").read_text().replace("- file: more.yaml", "- more.yaml")
            ),
            r"^values file \S+/site\.yaml: appsFrom: must be a list of \{file: NAME, "
            r"sha256: HEX\}, NAME a file beside it$",
        ),
        (
            lambda d: (d / "site.yaml").write_text(
                (d / "site.yaml").read_text().replace("file: more.yaml", "file: ../more.yaml")
            ),
            r"^values file \S+/site\.yaml: appsFrom\[0\]\.file: '\.\./more\.yaml' must be a "
            r"file beside it$",
        ),
    ],
    ids=["missing", "not-yaml", "not-a-list", "not-a-file-entry", "outside"],
)
def test_a_missing_or_malformed_file_is_one_line_naming_it(
    tmp_path: Path, damage: Any, expected: str
) -> None:
    values = _split_values(tmp_path)
    damage(tmp_path)
    with pytest.raises(ConfigError, match=expected) as caught:
        load_site(values, env={})
    assert "\n" not in str(caught.value)


def test_files_of_two_renders_are_refused_not_mixed(tmp_path: Path) -> None:
    """A pod that starts while a new render is applied may read site.yaml of one render
    and a later file of the other: it stops with a line that says so, rather than decide
    on apps missing or counted twice."""
    site = parse_site(values_with(1_000))
    path = unpack(site, tmp_path)
    assert load_site(path, env={}) == site
    last = site_files(parse_site(values_with(1_001)))[-1]
    assert last.key != "site.yaml"
    (tmp_path / last.key).write_text(last.text, "utf-8")
    with pytest.raises(ConfigError) as caught:
        load_site(path, env={})
    assert str(caught.value) == (
        f"values file {tmp_path}/{last.key}: not the file site.yaml names (its sha256 "
        "differs): they come from two renders of the site; render again, or wait for the "
        "site being applied and retry"
    )


# ----------------------------------------------------------------- the split


def test_an_app_added_at_the_end_changes_the_last_file_and_site_yaml() -> None:
    before = {f.configmap: f.text for f in site_files(parse_site(values_with(1_000)))}
    after = {f.configmap: f.text for f in site_files(parse_site(values_with(1_001)))}
    assert before.keys() == after.keys()
    changed = [name for name in after if after[name] != before[name]]
    assert changed == ["fabrique-site", f"fabrique-site-{len(after)}"]
    listed = yaml.safe_load(after["fabrique-site"])["appsFrom"]
    assert listed == [
        {"file": f"site-{n}.yaml", "sha256": shard_digest(after[f"fabrique-site-{n}"])}
        for n in range(2, len(after) + 1)
    ]


def test_every_site_configmap_fits_every_limit_at_10_000_apps(large: Site) -> None:
    """The API server's 1 MiB for its data, etcd's 1.5 MiB for the object (validate's
    own checks), and the 256 KiB of annotations in which kubectl's client-side apply
    keeps a copy of it: ``kubectl apply -k`` takes every one."""
    for unit in (build_unit, control_unit):
        configmaps = [
            doc
            for documents in unit(large).values()
            for doc in documents
            if doc["metadata"]["name"].startswith("fabrique-site")
        ]
        assert len(configmaps) == len(site_files(large)) > 1
        for doc in configmaps:
            assert list(_check_data(doc, "ConfigMap")) == []
            assert list(_check_size(doc)) == []
            assert data_size(doc) < DATA_LIMIT
            applied = len(json.dumps(doc, separators=(",", ":")).encode())
            assert applied <= SITE_DATA_TARGET + 1024 < ANNOTATIONS_LIMIT


def test_every_pod_projects_every_site_configmap_into_one_folder(large: Site) -> None:
    names = [f.configmap for f in site_files(large)]
    template = build_unit(large)["build/workflowtemplate.yaml"][0]
    templates = {t["name"]: t for t in template["spec"]["templates"]}
    assert pod_sources(templates["run"]) == names
    for step in templates.values():
        if "container" in step:  # the exit handler's
            assert pod_sources(step) == names
    for stage in templates["run"]["containerSet"]["containers"]:
        for mount in stage.get("volumeMounts") or []:
            if mount["name"] == "fabrique-site":
                assert mount == {
                    "name": "fabrique-site",
                    "mountPath": "/etc/fabrique",
                    "readOnly": True,
                }
    crons = [*reconcile_unit(large).values(), *mirror_unit(large).values()]
    for cron in (doc for documents in crons for doc in documents):
        if cron["kind"] != "CronWorkflow":
            continue
        for step in cron["spec"]["workflowSpec"]["templates"]:
            if "container" in step:
                assert pod_sources(step) == names
                values = {e["name"]: e.get("value") for e in step["container"]["env"]}
                assert values["FABRIQUE_VALUES"] == "/etc/fabrique/site.yaml"
