"""Rendering: the committed tree is what the default site renders, written atomically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fabrique import render as render_module
from fabrique.render import HEADER, render_tree, write_tree
from fabrique.site.config import load_site
from fabrique.site.errors import RenderError

from .conftest import ROOT, run_cli, write_values
from .manifests import find, load_tree


def test_committed_tree_matches_a_fresh_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Golden check by content. To regenerate: `fabrique render` (or `make render`)."""
    monkeypatch.delenv(
        "FABRIQUE_NETWORK__BACKOFF_SECONDS"
    )  # the committed tree is the default site
    out = tmp_path / "manifests"
    result = run_cli("render", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    fresh, committed = load_tree(out), load_tree(ROOT / "manifests")
    assert sorted(fresh) == sorted(committed), "files differ: run `fabrique render` and commit"
    for path in fresh:
        assert fresh[path] == committed[path], f"{path} differs: run `fabrique render` and commit"


def test_root_kustomization_lists_every_unit(tmp_path: Path) -> None:
    tree = render_tree(load_site(env={}))
    units = sorted(path.split("/")[0] for path in tree if "/" in path)
    root = tree["kustomization.yaml"][0]
    assert sorted(root["resources"]) == sorted(set(units))
    for unit in set(units):
        listed = tree[f"{unit}/kustomization.yaml"][0]["resources"]
        present = sorted(
            p.split("/", 1)[1]
            for p in tree
            if p.startswith(f"{unit}/") and not p.endswith("kustomization.yaml")
        )
        assert sorted(listed) == present


def test_every_object_kubectl_applies_bears_the_label_a_prune_selects(
    tmp_path: Path, kubectl: Path
) -> None:
    """``kubectl kustomize`` of the tree (what ``kubectl apply -k`` and Argo CD apply):
    every object carries ``fabrique.io/rendered=true``, which nothing else fabrique makes
    carries, and is of a kind ``fabrique doctor leftovers`` lists."""
    from fabrique.site.objects import RENDERED_LABEL, RESOURCES

    out = tmp_path / "m"
    write_tree(render_tree(load_site(env={})), out)
    built = subprocess.run(
        [str(kubectl), "kustomize", str(out)], capture_output=True, text=True, check=True
    ).stdout
    objects = [doc for doc in yaml.safe_load_all(built) if doc]
    assert objects
    for doc in objects:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        assert doc["metadata"]["labels"][RENDERED_LABEL] == "true", where
        assert doc["kind"] in RESOURCES, where
        assert RESOURCES[doc["kind"]].api_version == doc["apiVersion"], where
    # the label is on the objects only: selectors and pod templates stay as rendered
    assert RENDERED_LABEL not in built.replace(f'    {RENDERED_LABEL}: "true"\n', "")


def test_values_reach_the_rendered_tree(tmp_path: Path) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{"registry.host": "registry.internal:5000", "namespaces.build": "builds"},
    )
    out = tmp_path / "m"
    assert run_cli("--values", str(values), "render", "--out", str(out)).exit_code == 0
    toml = find(out, "ConfigMap", "fabrique-buildkitd")["data"]["buildkitd.toml"]
    assert toml == '[registry."registry.internal:5000"]\n  http = true\n'
    template = find(out, "WorkflowTemplate", "fabrique-build")
    assert template["metadata"]["namespace"] == "builds"
    site_doc = yaml.safe_load(find(out, "ConfigMap", "fabrique-site")["data"]["site.yaml"])
    assert load_site(env={}).model_validate(site_doc).registry.host == "registry.internal:5000"


def test_render_replaces_only_its_own_tree(tmp_path: Path) -> None:
    foreign = tmp_path / "docs"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(RenderError, match="not a tree written by fabrique render"):
        write_tree(render_tree(load_site(env={})), foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_a_failed_render_keeps_the_previous_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "manifests"
    tree = render_tree(load_site(env={}))
    write_tree(tree, out)
    before = load_tree(out)

    calls = {"n": 0}
    real_dump = render_module.dump_documents

    def failing_dump(documents: list, *, header: bool = True) -> str:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real_dump(documents, header=header)

    monkeypatch.setattr(render_module, "dump_documents", failing_dump)
    with pytest.raises(RenderError, match=r"write failed .*previous tree kept"):
        write_tree(tree, out)
    assert load_tree(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["manifests"], "staging left behind"


def test_every_file_carries_the_generated_header() -> None:
    for path in (ROOT / "manifests").rglob("*.yaml"):
        assert path.read_text().startswith(HEADER), path


def test_hera_generate_yaml_renders_the_same_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hera generate yaml pipelines/` finds the WorkflowTemplates and agrees with render."""
    monkeypatch.delenv("FABRIQUE_NETWORK__BACKOFF_SECONDS")
    hera = Path(sys.executable).parent / "hera"
    result = subprocess.run(
        [str(hera), "generate", "yaml", "pipelines/", "--to", str(tmp_path / "hera")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    generated = [
        doc
        for path in sorted((tmp_path / "hera").rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    assert sorted(d["kind"] for d in generated) == [
        "CronWorkflow",
        "CronWorkflow",
        "WorkflowTemplate",
        "WorkflowTemplate",
    ]
    for doc in generated:
        assert doc == find(ROOT / "manifests", doc["kind"], doc["metadata"]["name"])


@pytest.mark.parametrize("apps", [1, 40], ids=["default site", "40 apps"])
def test_libyaml_writes_the_tree_byte_for_byte_as_pyyaml(apps: int) -> None:
    """Render dumps with libyaml's emitter where PyYAML has it, for speed: every file of
    the tree is the same bytes as PyYAML's own emitter writes (block style for scripts,
    no aliases)."""
    from bench.render import site_with

    if hasattr(yaml, "CSafeDumper"):
        assert issubclass(render_module._FastDumper, yaml.CSafeDumper)
    for path, documents in render_tree(site_with(apps)).items():
        slow = HEADER + render_module._dump(documents, render_module._Dumper)
        assert render_module.dump_documents(documents) == slow, path


def test_a_kept_trailing_newline_is_written_as_pyyaml_writes_it() -> None:
    """libyaml ends a stream with ``...`` once a ``|+`` scalar was written anywhere in its
    last document, PyYAML only when it came last: render writes PyYAML's bytes."""
    documents = [{"data": {"script": "echo\n\n", "after": "x"}, "kind": "ConfigMap"}]
    slow = HEADER + render_module._dump(documents, render_module._Dumper)
    assert not slow.endswith("...\n")
    assert render_module.dump_documents(documents) == slow


def test_the_site_is_dumped_once_a_render(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both namespaces' ConfigMaps hold the site, megabytes of it at ten thousand apps:
    it is dumped once, and both hold the same text."""
    from fabrique.site.config import Site

    dumped: list[Site] = []
    real = Site.to_values

    def counting(site: Site) -> dict[str, object]:
        dumped.append(site)
        return real(site)

    monkeypatch.setattr(Site, "to_values", counting)
    site = load_site(env={})
    tree = render_tree(site)
    assert dumped == [site]
    texts = {
        doc["data"]["site.yaml"]
        for path in ("build/configmaps.yaml", "control/configmaps.yaml")
        for doc in tree[path]
        if doc["metadata"]["name"] == "fabrique-site"
    }
    assert len(texts) == 1
