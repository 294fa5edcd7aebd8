"""A ``helm-values`` target: a chart's values file, the image's keys rewritten in place,
nothing else of the file changed; the real ``helm template`` renders it in
``tests/live/test_helm.py``."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
import yaml

from fabrique.decisions import targets
from fabrique.decisions.holds import read_hold
from fabrique.decisions.targets import ImagePin, apply_pin, new_target, read_pin
from fabrique.site.config import HelmPaths, load_site
from fabrique.site.errors import TargetError

from .conftest import GITEA_TOKEN, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble

DIGEST = "sha256:" + "3" * 64
PIN = ImagePin("citation-dagster", "registry:80/citation-dagster", "abcdefabcdef", DIGEST)
VALUES = """\
# citation's chart values (prod)
replicaCount: 2
image:
  repository: registry:80/citation-dagster   # fabrique writes these three
  tag: "0f0f0f0f0f0f"
  digest: ""
  pullPolicy: IfNotPresent
resources: {limits: {memory: 512Mi}}
"""


def _changes(before: str, after: str) -> list[str]:
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(before.splitlines(True), after.splitlines(True), n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def test_the_three_keys_are_written_and_nothing_else() -> None:
    after = apply_pin(VALUES, "helm-values", PIN, where="v", helm=HelmPaths())
    assert _changes(VALUES, after) == [
        '-  tag: "0f0f0f0f0f0f"',
        '-  digest: ""',
        '+  tag: "abcdefabcdef"',
        f'+  digest: "{DIGEST}"',
    ]
    assert read_pin(after, "helm-values", PIN, where="v", helm=HelmPaths()) == PIN
    assert apply_pin(after, "helm-values", PIN, where="v", helm=HelmPaths()) == after


def test_a_tag_that_would_read_as_a_number_is_quoted() -> None:
    """Helm reads its values with YAML types: ``tag: 123456789012`` is a number, which
    renders as 1.23456789012e+11."""
    values = "image:\n  repository: r\n  tag: latest\n  digest:\n"
    for tag in ("123456789012", "1e5678901234", "0b1010101010"):
        pin = ImagePin("citation-dagster", "registry:80/citation-dagster", tag, DIGEST)
        after = apply_pin(values, "helm-values", pin, where="v", helm=HelmPaths())
        assert yaml.safe_load(after)["image"]["tag"] == tag, after


def test_one_image_string_and_other_paths() -> None:
    values = "app:\n  main:\n    image: registry:80/citation-dagster:0f0f0f0f0f0f  # by tag\n"
    helm = HelmPaths(image="app.main.image")
    after = apply_pin(values, "helm-values", PIN, where="v", helm=helm)
    assert _changes(values, after) == [
        "-    image: registry:80/citation-dagster:0f0f0f0f0f0f  # by tag",
        f"+    image: registry:80/citation-dagster:abcdefabcdef@{DIGEST}  # by tag",
    ]
    assert read_pin(after, "helm-values", PIN, where="v", helm=helm) == PIN
    before = read_pin(values, "helm-values", PIN, where="v", helm=helm)
    assert before == ImagePin(PIN.image, PIN.new_name, "0f0f0f0f0f0f", None)


@pytest.mark.parametrize(
    ("values", "written"),
    [
        (
            "image: {repository: registry:80/citation-dagster, tag: 0f0f0f0f0f0f, digest: ''}"
            "  # by digest\nreplicaCount: 2\n",
            "image: {repository: registry:80/citation-dagster, tag: abcdefabcdef, digest: "
            f"'{DIGEST}'}}  # by digest\nreplicaCount: 2\n",
        ),
        (  # nested, over two lines, CRLF, empty and null values, no final newline
            'chart: {image: {repository: "",\r\n  tag: ~, digest: }, replicas: 2}',
            'chart: {image: {repository: "registry:80/citation-dagster",\r\n  tag: '
            f"abcdefabcdef, digest: {DIGEST} }}, replicas: 2}}",
        ),
    ],
    ids=["one-line", "nested-crlf"],
)
def test_keys_in_flow_style_are_written_in_place(values: str, written: str) -> None:
    """`image: {repository: …, tag: …, digest: ''}` is valid YAML: each value is
    replaced where it stands, and every other byte of the line stays."""
    helm = (
        HelmPaths()
        if values.startswith("image")
        else HelmPaths(
            repository="chart.image.repository", tag="chart.image.tag", digest="chart.image.digest"
        )
    )
    after = apply_pin(values, "helm-values", PIN, where="v", helm=helm)
    assert after == written
    assert read_pin(after, "helm-values", PIN, where="v", helm=helm) == PIN
    assert apply_pin(after, "helm-values", PIN, where="v", helm=helm) == after


def test_an_edit_that_does_not_read_back_is_the_edit_s_fault_not_the_file_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The user's file is valid YAML: an edit that breaks it says so, never "not valid
    YAML" of a file the user may not touch."""
    monkeypatch.setattr(targets._Splicer, "result", lambda self: "image: {tag: a, b\n")
    with pytest.raises(TargetError, match=r"^v: the in-place edit did not give the intended"):
        apply_pin(VALUES, "helm-values", PIN, where="v", helm=HelmPaths())


def test_a_value_in_flow_style_is_quoted_where_flow_style_needs_it() -> None:
    """A registry named by its IPv6 address holds brackets, which end a plain value in a
    flow mapping; an all-digit tag would read as a number there as anywhere."""
    pin = ImagePin("citation-dagster", "[fd00::1]:5000/citation-dagster", "123456789012", DIGEST)
    values = "image: {repository: r, tag: t, digest: d}\n"
    after = apply_pin(values, "helm-values", pin, where="v", helm=HelmPaths())
    assert yaml.safe_load(after)["image"] == {
        "repository": pin.new_name,
        "tag": pin.tag,
        "digest": DIGEST,
    }
    image = "app: {image: r:t}\n"
    after = apply_pin(image, "helm-values", pin, where="v", helm=HelmPaths(image="app.image"))
    assert yaml.safe_load(after) == {"app": {"image": pin.reference}}
    assert targets.yaml_scalar("a,b") == "a,b" and targets.yaml_scalar("a,b", flow=True) == '"a,b"'


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            "image:\n  repository: r\n  tag: t\n",
            "v: image.digest: no key image.digest; add it to the values file (an empty value "
            "will do)",
        ),
        ("image: nginx\n", "v: image.repository: image is not a mapping"),
        (
            "image:\n  repository: r\n  tag: [a]\n  digest: d\n",
            "v: image.tag: a mapping or a list, not a value",
        ),
    ],
)
def test_a_values_file_without_the_keys_is_refused_with_the_path(
    values: str, expected: str
) -> None:
    with pytest.raises(TargetError) as refused:
        apply_pin(values, "helm-values", PIN, where="v", helm=HelmPaths())
    assert str(refused.value).startswith(expected), refused.value


def test_a_values_file_is_never_created() -> None:
    with pytest.raises(TargetError, match="a values file cannot be created from nothing"):
        new_target("helm-values", PIN, where="v")


@pytest.mark.parametrize(
    ("writeback", "expected"),
    [
        (
            {"kind": "kustomize-images", "helm": {"tag": "image.tag"}},
            "helm: for kind helm-values, or argocd-application (its helm.valuesObject); this "
            "target is kustomize-images",
        ),
        (
            {"kind": "helm-values", "helm": {"image": "image.ref", "tag": "image.tag"}},
            "image: one string holds the repository, tag and digest; leave tag out",
        ),
        ({"kind": "helm-values", "helm": {"tag": "image..tag"}}, "apps[0].writeback.helm.tag"),
        ({"kind": "helm-values", "create": True}, "apps[0].writeback.create: only a"),
        (
            {"kind": "helm-values", "helm": {"via": "parameters"}},
            "helm.via: parameters is an Application's; a values file has keys",
        ),
        (  # the digest written over the tag: an image reference nothing can pull
            {"kind": "helm-values", "helm": {"digest": "image.tag"}},
            "apps[0].writeback.helm.digest: image.tag is the tag's path (by default) too: one "
            "would be written over the other",
        ),
        (
            {"kind": "argocd-application", "helm": {"tag": "img.ref", "repository": "img.ref"}},
            "apps[0].writeback.helm.repository: img.ref is the tag's path too: one would",
        ),
        (  # a key cannot hold both a value and the keys under it
            {"kind": "helm-values", "helm": {"repository": "image"}},
            "apps[0].writeback.helm.repository: image and the tag's path (by default), "
            "image.tag, are one inside the other",
        ),
    ],
)
def test_the_config_says_what_is_wrong_with_a_helm_target(
    tmp_path: Path, writeback: dict[str, object], expected: str
) -> None:
    app = load_site(env={}).to_values()["apps"][0]
    app["writeback"] = {**app["writeback"], **writeback}
    values = write_values(tmp_path / "site.yaml", apps=[app])
    result = run_cli("--values", str(values), "render", "--out", str(tmp_path / "m"))
    assert result.exit_code == 2, result.stdout
    assert expected in result.stderr.splitlines()[0], result.stderr


def test_the_write_back_and_a_hold_on_a_values_file(
    tmp_path: Path, code_repo: Repo, gitea: GiteaDouble
) -> None:
    """The write-back command into a values file through the Contents API; a replay is
    unchanged; a hold there stops it, as on any target."""
    path = "dataops/citation-dagster/chart/values-prod.yaml"
    code_repo.commit({path: VALUES})
    app = load_site(env={}).to_values()["apps"][0]
    app["writeback"] = {"kind": "helm-values", "repo": "atlas/atlas", "path": path}
    values = write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url, "apps": [app]})
    env = {"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN}
    revision = code_repo.head()

    def writeback() -> str:
        result = run_cli(
            "--values", str(values), "writeback", "--app", "citation", "--revision", revision,
            "--digest", DIGEST, env=env,
        )  # fmt: skip
        assert result.exit_code == 0, result.stdout + result.stderr
        return result.stdout

    assert writeback().startswith("changed: citation ")
    written = yaml.safe_load(code_repo.show(path))["image"]
    assert written == {
        "repository": "registry:80/citation-dagster",
        "tag": revision[:12],
        "digest": DIGEST,
        "pullPolicy": "IfNotPresent",
    }
    assert code_repo.show(path).startswith("# citation's chart values (prod)\n")
    assert writeback().startswith("unchanged: ")
    held = run_cli(
        "--values", str(values), "hold", "--app", "citation", "--reason", "freeze",
        "--by", "alice", env=env,
    )  # fmt: skip
    assert held.exit_code == 0, held.stderr
    assert read_hold(code_repo.show(path), path, "citation") is not None
    assert held.stdout.startswith("held: citation") and path in held.stdout, held.stdout


APPLICATION = """\
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata:
  name: citation
  namespace: argocd
spec:
  project: default
  sources:
    - repoURL: http://gitea-http.gitea.svc.cluster.local:3000/atlas/atlas.git
      path: charts/citation
      targetRevision: main
      helm:
        valuesObject:
          replicaCount: 2   # prod
          image:
            repository: registry:80/citation-dagster
            tag: "0f0f0f0f0f0f"
            digest: ""
    - repoURL: http://gitea-http.gitea.svc.cluster.local:3000/cluster/apps.git
      targetRevision: main
      ref: values
  destination: {server: https://kubernetes.default.svc, namespace: dagster}
"""


SINGLE = """\
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: citation}
spec:
  source:
    repoURL: http://gitea/atlas/atlas.git
    path: chart
    helm:
      valuesObject:
        image:
          repository: r
          tag: t
          digest: d
        other:
          image:
            tag: kept
"""


def test_an_application_s_helm_values_object_gets_the_pin() -> None:
    helm = HelmPaths()
    after = apply_pin(APPLICATION, "argocd-application", PIN, where="a", helm=helm)
    assert _changes(APPLICATION, after) == [
        '-            tag: "0f0f0f0f0f0f"',
        '-            digest: ""',
        '+            tag: "abcdefabcdef"',
        f'+            digest: "{DIGEST}"',
    ]
    assert read_pin(after, "argocd-application", PIN, where="a", helm=helm) == PIN
    edited = apply_pin(SINGLE, "argocd-application", PIN, where="a", helm=helm)
    values = yaml.safe_load(edited)["spec"]["source"]["helm"]["valuesObject"]
    assert values == {
        "image": {"repository": PIN.new_name, "tag": "abcdefabcdef", "digest": DIGEST},
        "other": {"image": {"tag": "kept"}},
    }


def test_an_application_without_a_values_object_is_refused() -> None:
    without = APPLICATION.replace("valuesObject:", "valuesNope:")
    with pytest.raises(TargetError, match=r"0 of spec\.sources have helm\.valuesObject"):
        apply_pin(without, "argocd-application", PIN, where="a", helm=HelmPaths())


PARAMETERS = """\
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: citation}
spec:
  source:
    repoURL: http://gitea/atlas/atlas.git
    path: chart
    helm:
      parameters:
        - name: replicaCount
          value: "2"
        - name: image.tag
          value: 0f0f0f0f0f0f   # fabrique's
        - name: image.digest
          value: ""
          forceString: true
        - name: image.repository
          value: registry:80/citation-dagster
"""


def test_an_application_s_helm_parameters_get_the_pin_and_force_string() -> None:
    """Argo CD passes a parameter without forceString to --set, which reads an all-digit
    tag as a number: each parameter fabrique writes says forceString: true."""
    helm = HelmPaths(via="parameters")
    after = apply_pin(PARAMETERS, "argocd-application", PIN, where="a", helm=helm)
    assert _changes(PARAMETERS, after) == [
        "-          value: 0f0f0f0f0f0f   # fabrique's",
        "+          value: abcdefabcdef   # fabrique's",
        "+          forceString: true",
        '-          value: ""',
        f'+          value: "{DIGEST}"',
        "+          forceString: true",
    ]
    assert read_pin(after, "argocd-application", PIN, where="a", helm=helm) == PIN
    assert apply_pin(after, "argocd-application", PIN, where="a", helm=helm) == after
    parameters = yaml.safe_load(after)["spec"]["source"]["helm"]["parameters"]
    assert all(p["forceString"] is True for p in parameters if p["name"].startswith("image."))


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("        - name: image.digest\n          value: \"\"\n          forceString: true\n", ""),
         "a: helm.parameters: 0 entries named image.digest; list it once"),
        (("          forceString: true\n", "          forceString: false\n"),
         "a: helm.parameters: image.digest has forceString False; it must be true"),
        (("parameters:", "parameterz:"), "a: spec.source.helm.parameters: missing"),
    ],
)  # fmt: skip
def test_parameters_that_cannot_take_the_pin_are_refused(
    edit: tuple[str, str], expected: str
) -> None:
    broken = PARAMETERS.replace(*edit)
    with pytest.raises(TargetError) as refused:
        apply_pin(broken, "argocd-application", PIN, where="a", helm=HelmPaths(via="parameters"))
    assert str(refused.value).startswith(expected), refused.value
