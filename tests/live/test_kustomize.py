"""What the write-back writes, rendered by the programs that deploy it: Argo CD's repo
server runs `kustomize edit set image <entry>…` with an Application's
`kustomize.images`, then builds; a kustomization target is built as `kubectl kustomize`
builds it. The image a Deployment renders with must be the pinned digest, whatever name
form the entry had before."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from fabrique.decisions.targets import ImagePin, apply_pin

from . import controlplane
from .fixtures import need_go

DIGEST = "sha256:" + "3" * 64
PIN = ImagePin("citation-dagster", "registry:80/citation-dagster", "abcdefabcdef", DIGEST)


@pytest.fixture(scope="module")
def tools() -> dict[str, Path]:
    need_go()
    return controlplane.binaries(("kustomize", "kubernetes"))


def run(*args: str | Path, cwd: Path) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def app_dir(root: Path, container_image: str, kustomization: str = "") -> Path:
    """An app's manifests: one Deployment whose container runs ``container_image``."""
    root.mkdir(parents=True)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "citation"},
        "spec": {
            "selector": {"matchLabels": {"app": "citation"}},
            "template": {
                "metadata": {"labels": {"app": "citation"}},
                "spec": {"containers": [{"name": "app", "image": container_image}]},
            },
        },
    }
    (root / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    (root / "kustomization.yaml").write_text(
        kustomization
        or "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources:\n  - deployment.yaml\n"
    )
    return root


def rendered_image(text: str) -> str:
    (deployment,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "Deployment"]
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def application(entry: str) -> str:
    return (
        "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {name: citation}\n"
        "spec:\n  source:\n    kustomize:\n      images:\n"
        f"      - {entry}\n"
    )


@pytest.mark.parametrize(
    ("container", "entry"),
    [
        ("registry:80/citation-dagster:0.1", "registry:80/citation-dagster:aaaaaaaaaaaa"),
        ("citation-dagster:0.1", "citation-dagster=registry:80/citation-dagster:aaaaaaaaaaaa"),
        (
            "registry:80/citation-dagster:0.1",
            "registry:80/citation-dagster=registry:80/citation-dagster:aaaaaaaaaaaa",
        ),
    ],
    ids=["registry-named-bare", "plain-named", "registry-named"],
)
def test_an_application_entry_deploys_the_digest_as_argo_cd_renders_it(
    tools: dict[str, Path], tmp_path: Path, container: str, entry: str
) -> None:
    before = application(entry)
    # the entry as it was deploys the old tag: the test can tell
    old = app_dir(tmp_path / "before", container)
    run(tools["kustomize"], "edit", "set", "image", entry, cwd=old)
    assert rendered_image(run(tools["kustomize"], "build", ".", cwd=old)).endswith(":aaaaaaaaaaaa")
    written = apply_pin(before, "argocd-application", PIN, where="a")
    entries = yaml.safe_load(written)["spec"]["source"]["kustomize"]["images"]
    app = app_dir(tmp_path / "after", container)
    run(tools["kustomize"], "edit", "set", "image", *entries, cwd=app)  # as the repo server
    image = rendered_image(run(tools["kustomize"], "build", ".", cwd=app))
    assert image.startswith("registry:80/citation-dagster") and image.endswith(f"@{DIGEST}"), (
        entries,
        image,
    )


@pytest.mark.parametrize(
    ("container", "name"),
    [
        ("registry:80/citation-dagster:0.1", "registry:80/citation-dagster"),
        ("citation-dagster:0.1", "citation-dagster"),
    ],
)
def test_a_kustomization_target_deploys_the_digest_as_kubectl_kustomize_renders_it(
    tools: dict[str, Path], tmp_path: Path, container: str, name: str
) -> None:
    kustomization = (
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources:\n  - deployment.yaml\n"
        f"images:\n  - name: {name}\n    newTag: aaaaaaaaaaaa\n"
    )
    app = app_dir(tmp_path / "app", container, kustomization)
    written = apply_pin(kustomization, "kustomize-images", PIN, where="k")
    (app / "kustomization.yaml").write_text(written)
    image = rendered_image(run(tools["kubectl"], "kustomize", ".", cwd=app))
    assert image.startswith("registry:80/citation-dagster") and image.endswith(f"@{DIGEST}"), (
        written,
        image,
    )


def test_flow_style_targets_are_written_out_and_deploy_the_digest(
    tools: dict[str, Path], tmp_path: Path
) -> None:
    kustomization = (
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [deployment.yaml]\n"
        "images: [{name: registry:80/citation-dagster, newTag: aaaaaaaaaaaa}, {name: other}]\n"
    )
    app = app_dir(tmp_path / "kustomization", "registry:80/citation-dagster:0.1", kustomization)
    (app / "kustomization.yaml").write_text(
        apply_pin(kustomization, "kustomize-images", PIN, where="k")
    )
    assert rendered_image(run(tools["kubectl"], "kustomize", ".", cwd=app)).endswith(f"@{DIGEST}")

    before = application("x").replace(
        "images:\n      - x\n", "images: [registry:80/citation-dagster:aaaaaaaaaaaa, other=o:1]\n"
    )
    written = apply_pin(before, "argocd-application", PIN, where="a")
    entries = yaml.safe_load(written)["spec"]["source"]["kustomize"]["images"]
    app = app_dir(tmp_path / "application", "registry:80/citation-dagster:0.1")
    run(tools["kustomize"], "edit", "set", "image", *entries, cwd=app)
    assert rendered_image(run(tools["kustomize"], "build", ".", cwd=app)).endswith(f"@{DIGEST}")
