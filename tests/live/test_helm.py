"""A helm-values target, rendered by the real ``helm template`` (``tests/peers/helm``,
Helm 4): the values file fabrique wrote makes the chart's Deployment name the image by
digest, whatever the tag looks like, held or not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fabrique.decisions.holds import Hold, apply_hold
from fabrique.decisions.targets import ImagePin, apply_pin
from fabrique.site.config import HelmPaths

from . import controlplane
from .fixtures import need_go

CHART = Path(__file__).resolve().parent.parent / "data" / "chart"
DIGEST = "sha256:" + "7" * 64


@pytest.fixture(scope="module")
def helm() -> str:
    need_go()
    return str(controlplane.binaries(("helm",))["helm"])


def _image(helm: str, chart: Path) -> str:
    """The image of the Deployment ``helm template`` renders from ``chart``."""
    done = subprocess.run(
        [helm, "template", "citation", str(chart)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (deployment,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "Deployment"]
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


@pytest.mark.parametrize("tag", ["abcdefabcdef", "123456789012", "1e5678901234"])
def test_helm_renders_the_pinned_digest(helm: str, tmp_path: Path, tag: str) -> None:
    chart = Path(shutil.copytree(CHART, tmp_path / "chart"))
    values = chart / "values.yaml"
    assert _image(helm, chart) == "registry:80/citation-dagster:0f0f0f0f0f0f", "by tag first"
    pin = ImagePin("citation-dagster", "registry:80/citation-dagster", tag, DIGEST)
    values.write_text(
        apply_pin(values.read_text(), "helm-values", pin, where="v", helm=HelmPaths())
    )
    assert _image(helm, chart) == f"registry:80/citation-dagster:{tag}@{DIGEST}"
    # a hold lives in the values file's metadata.annotations: the chart renders the same
    hold = Hold(by="alice", at="2026-12-05T10:00:00Z", reason="freeze")
    values.write_text(apply_hold(values.read_text(), hold, where="v", app="citation"))
    assert _image(helm, chart) == f"registry:80/citation-dagster:{tag}@{DIGEST}"


def test_helm_renders_one_image_string(helm: str, tmp_path: Path) -> None:
    chart = Path(shutil.copytree(CHART, tmp_path / "chart"))
    template = chart / "templates" / "deployment.yaml"
    lines = template.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "if .Values.image.digest" in line)
    end = next(i for i, line in enumerate(lines) if "{{- end }}" in line)
    lines[start : end + 1] = ['          image: "{{ .Values.app.image }}"\n']
    template.write_text("".join(lines))
    values = chart / "values.yaml"
    values.write_text(values.read_text() + "app:\n  image: registry:80/citation-dagster:old\n")
    pin = ImagePin("citation-dagster", "registry:80/citation-dagster", "abcdefabcdef", DIGEST)
    helm_paths = HelmPaths(image="app.image")
    values.write_text(apply_pin(values.read_text(), "helm-values", pin, where="v", helm=helm_paths))
    assert _image(helm, chart) == pin.reference


def test_helm_renders_an_application_s_values_object(helm: str, tmp_path: Path) -> None:
    """Argo CD hands an Application's ``helm.valuesObject`` to Helm as a values file:
    the same, by hand, of the Application fabrique pinned."""
    application = (
        "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {name: citation}\n"
        "spec:\n  source:\n    repoURL: http://gitea/atlas/atlas.git\n    path: chart\n"
        "    helm:\n      valuesObject:\n        image:\n"
        "          repository: registry:80/citation-dagster\n"
        '          tag: "0f0f0f0f0f0f"   # pinned by fabrique\n          digest: ""\n'
    )
    pin = ImagePin("citation-dagster", "registry:80/citation-dagster", "123456789012", DIGEST)
    helm_paths = HelmPaths()
    pinned = yaml.safe_load(
        apply_pin(application, "argocd-application", pin, where="a", helm=helm_paths)
    )
    values = tmp_path / "values-object.yaml"
    values.write_text(yaml.safe_dump(pinned["spec"]["source"]["helm"]["valuesObject"]))
    done = subprocess.run(
        [helm, "template", "citation", str(CHART), "-f", str(values)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f'image: "{pin.reference}"' in done.stdout, done.stdout


def _argocd_parameters(helm: str, parameters: list[dict[str, object]]) -> str:
    """What Argo CD's repo server renders of an Application's ``helm.parameters``:
    ``--set-string`` for those that force a string, ``--set`` for the others."""
    args = []
    for parameter in parameters:
        flag = "--set-string" if parameter.get("forceString") is True else "--set"
        args += [flag, f"{parameter['name']}={parameter['value']}"]
    done = subprocess.run(
        [helm, "template", "citation", str(CHART), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (deployment,) = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "Deployment"]
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def test_helm_renders_an_application_s_parameters_as_argo_cd_passes_them(helm: str) -> None:
    application = (
        "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {name: citation}\n"
        "spec:\n  source:\n    repoURL: http://gitea/atlas/atlas.git\n    path: chart\n"
        "    helm:\n      parameters:\n"
        "        - name: image.repository\n          value: registry:80/citation-dagster\n"
        "        - name: image.tag\n          value: latest\n"
        '        - name: image.digest\n          value: ""\n'
    )
    pin = ImagePin("citation-dagster", "registry:80/citation-dagster", "123456789012", DIGEST)
    # the trap, first: an all-digit tag passed to --set is a number, which the chart's
    # printf "%s" cannot format
    plain = [{"name": "image.tag", "value": pin.tag}, {"name": "image.digest", "value": DIGEST}]
    assert "%!s(int64=123456789012)" in _argocd_parameters(helm, plain)
    pinned = yaml.safe_load(
        apply_pin(
            application, "argocd-application", pin, where="a", helm=HelmPaths(via="parameters")
        )
    )
    assert _argocd_parameters(helm, pinned["spec"]["source"]["helm"]["parameters"]) == (
        pin.reference
    )
