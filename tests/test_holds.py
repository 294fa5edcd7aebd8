"""Holds: `fabrique hold` / `release`, respected by the write-back and the reconciler.

The edit itself is tested as a pure function of the text; the gestures against the Gitea
double (real bare repository) and a real git daemon, with the real loopback registry and
the Kubernetes API double for the reconcile passes.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.decisions.holds import Hold, apply_hold, hold_key, read_hold
from fabrique.decisions.reconcile import decide
from fabrique.site.errors import InputError, TargetError

from .conftest import (
    APPLICATION,
    APPLICATION_APP,
    GITEA_TOKEN,
    KUSTOMIZATION,
    Repo,
    run_cli,
    write_values,
)
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .oci import push_image
from .servers import GitDaemon, Registry
from .test_reconcile import _facts, _phase, _posts

KEY = hold_key("citation")  # the app's own hold
HOLD = Hold(by="alice", at="2026-12-03T07:00:00Z", reason="the 2.3 release loses uploads")
WHERE = "atlas/atlas:kustomization.yaml"
DIGEST_A = "sha256:" + "a" * 64
KUSTOMIZATION_WITH_METADATA = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
metadata:
  name: prod   # the overlay
resources:
  - ../../base
"""
WITH_ANNOTATIONS = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
metadata:
    annotations:
        owner: "data team"
images: []
"""


# ------------------------------------------------------------------ the edit


@pytest.mark.parametrize(
    "text",
    [
        "kind: Kustomization\nresources:\n  - ../../base\n",  # no metadata
        KUSTOMIZATION_WITH_METADATA,  # metadata without annotations
        WITH_ANNOTATIONS,  # other annotations, other indentation
        "kind: Kustomization\nimages: []",  # no final newline
    ],
)
def test_hold_then_release_gives_back_the_very_same_bytes(text: str) -> None:
    held = apply_hold(text, HOLD, where=WHERE, app="citation")
    assert read_hold(text, WHERE, "citation") is None
    assert read_hold(held, WHERE, "citation") == HOLD
    data = yaml.safe_load(held)
    assert json.loads(data["metadata"]["annotations"][KEY]) == {
        "at": HOLD.at,
        "by": HOLD.by,
        "reason": HOLD.reason,
    }
    before = yaml.safe_load(text)
    del data["metadata"]["annotations"][KEY]
    if not data["metadata"]["annotations"]:
        del data["metadata"]["annotations"]
    if not data["metadata"]:
        del data["metadata"]
    assert data == before, "the hold is the only change"
    assert apply_hold(held, None, where=WHERE, app="citation") == text


def test_only_one_line_is_added_next_to_other_annotations() -> None:
    held = apply_hold(WITH_ANNOTATIONS, HOLD, where=WHERE, app="citation")
    added = [line for line in held.splitlines() if line not in WITH_ANNOTATIONS.splitlines()]
    assert added == [f"        {KEY}: '{HOLD.value()}'"]


def test_a_new_hold_replaces_the_old_one_in_place() -> None:
    held = apply_hold(KUSTOMIZATION_WITH_METADATA, HOLD, where=WHERE, app="citation")
    other = Hold(by="bob", at="2026-12-04T08:00:00Z", reason="it's the 'db' again")
    again = apply_hold(held, other, where=WHERE, app="citation")
    assert read_hold(again, WHERE, "citation") == other
    assert len(again.splitlines()) == len(held.splitlines())


def test_an_application_keeps_the_hold_in_its_own_metadata() -> None:
    from .conftest import SEED_APPLICATION

    held = apply_hold(SEED_APPLICATION, HOLD, where=WHERE, app="citation")
    data = yaml.safe_load(held)
    assert data["metadata"]["name"] == "citation"
    assert read_hold(held, WHERE, "citation") == HOLD
    assert apply_hold(held, None, where=WHERE, app="citation") == SEED_APPLICATION


def test_a_held_application_is_still_a_valid_application(specs: Path) -> None:
    from fabrique.validate import Schemas

    from .conftest import SEED_APPLICATION

    validator = Schemas(specs).validator("argoproj.io/v1alpha1", "Application")
    assert validator is not None
    held = yaml.safe_load(apply_hold(SEED_APPLICATION, HOLD, where=WHERE, app="citation"))
    assert list(validator.iter_errors(held)) == []


def test_kustomize_reads_a_held_kustomization_and_leaks_nothing(
    tmp_path: Path, kubectl: Path
) -> None:
    (tmp_path / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
        "spec: {containers: [{name: a, image: citation-dagster}]}\n"
    )
    text = "resources:\n- pod.yaml\nimages:\n- name: citation-dagster\n  newTag: abc\n"
    (tmp_path / "kustomization.yaml").write_text(
        apply_hold(text, HOLD, where=WHERE, app="citation")
    )
    rendered = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, check=True
    )
    pod = yaml.safe_load(rendered.stdout)
    assert pod["spec"]["containers"][0]["image"] == "citation-dagster:abc"
    assert "annotations" not in pod["metadata"], "the hold stays in the kustomization"


def test_a_hold_written_by_hand_holds_too() -> None:
    text = 'kind: Kustomization\nmetadata:\n  annotations:\n    fabrique.io/hold: "incident 42"\n'
    assert read_hold(text, WHERE, "citation") == Hold(by="", at="", reason="incident 42")
    assert "held by unknown since unknown: incident 42" == Hold("", "", "incident 42").describe()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Kustomization\nmetadata: {name: prod}\n", "flow style"),
        ("kind: Kustomization\nmetadata: [1]\n", "metadata must be a mapping"),
        ("kind: Kustomization\nmetadata:\n  annotations:\n", "metadata.annotations is empty"),
    ],
)
def test_odd_metadata_is_refused_with_its_field(text: str, message: str) -> None:
    with pytest.raises(TargetError, match=re.escape(message)):
        apply_hold(text, HOLD, where=WHERE, app="citation")


def test_a_file_the_readers_refuse_is_neither_held_nor_released() -> None:
    """A key that is a mapping (valid YAML, which ruamel.yaml edits) is refused by every
    reader of the target: a hold placed there could never be read back, so the edit
    refuses the file first, as the readers do, with its line."""
    text = (
        "kind: Kustomization\nmetadata:\n  labels:\n    ? {owner: data}\n    : team\n"
        "images:\n- name: citation-dagster\n"
    )
    refused = rf"^{re.escape(WHERE)}: line 4: a key that is a mapping or a list, "
    with pytest.raises(TargetError, match=refused):
        read_hold(text, WHERE, "citation")
    for hold, app in ((HOLD, "citation"), (None, "citation"), (HOLD, None)):
        with pytest.raises(TargetError, match=refused):
            apply_hold(text, hold, where=WHERE, app=app)


@pytest.mark.parametrize(
    ("text", "held", "released"),
    [
        (
            f"kind: Kustomization\nmetadata:\n  annotations:\n    {KEY}:\n    owner: data\n",
            f"kind: Kustomization\nmetadata:\n  annotations:\n    {KEY}: '{HOLD.value()}'\n"
            "    owner: data\n",
            "kind: Kustomization\nmetadata:\n  annotations:\n    owner: data\n",
        ),
        (
            f"kind: Kustomization\nmetadata:\n  name: prod\n  annotations:\n    {KEY}:",
            f"kind: Kustomization\nmetadata:\n  name: prod\n  annotations:\n"
            f"    {KEY}: '{HOLD.value()}'",
            "kind: Kustomization\nmetadata:\n  name: prod",
        ),
        (
            f"metadata:\r\n  annotations:\r\n    {KEY}:\r\nimages: []\r\n",
            f"metadata:\r\n  annotations:\r\n    {KEY}: '{HOLD.value()}'\r\nimages: []\r\n",
            "images: []\r\n",
        ),
    ],
    ids=["mid-file", "last-no-final-newline", "crlf"],
)
def test_a_hold_annotation_with_no_value_is_a_hold_on_one_line(
    text: str, held: str, released: str
) -> None:
    """`hold.fabrique.io/citation:` and nothing after it holds (no reason given), and is
    replaced or removed on its own line like any other value, wherever it stands."""
    assert read_hold(text, WHERE, "citation") == Hold(by="", at="", reason="")
    assert apply_hold(text, HOLD, where=WHERE, app="citation") == held
    assert apply_hold(text, None, where=WHERE, app="citation") == released


def test_a_hold_annotation_whose_value_is_on_the_next_line_is_refused_with_its_line() -> None:
    text = f"kind: Kustomization\nmetadata:\n  annotations:\n    {KEY}:\n      incident 42\n"
    with pytest.raises(TargetError, match=rf"^{re.escape(WHERE)}: line 4: the {KEY} annotation "):
        apply_hold(text, None, where=WHERE, app="citation")


@pytest.mark.parametrize(
    ("text", "held"),
    [
        (
            "kind: Kustomization\nmetadata:\n  annotations: {}\nimages: []\n",
            f"kind: Kustomization\nmetadata:\n  annotations:\n    {KEY}: '{HOLD.value()}'\n"
            "images: []\n",
        ),
        (
            "kind: Kustomization\nmetadata:\n  name: prod\n  annotations: { }  # by hand\n",
            "kind: Kustomization\nmetadata:\n  name: prod\n  annotations: # by hand\n"
            f"    {KEY}: '{HOLD.value()}'\n",
        ),
        (
            "kind: Kustomization\r\nmetadata:\r\n    annotations: {\r\n    }\r\n",
            "kind: Kustomization\r\nmetadata:\r\n    annotations:\r\n"
            f"      {KEY}: '{HOLD.value()}'\r\n",
        ),
        (
            "kind: Kustomization\nmetadata: {}   # the overlay's\nimages: []\n",
            "kind: Kustomization\nmetadata: # the overlay's\n  annotations:\n"
            f"    {KEY}: '{HOLD.value()}'\nimages: []\n",
        ),
    ],
    ids=["annotations", "space-inside-comment", "over-two-lines-crlf", "metadata"],
)
def test_an_empty_flow_mapping_is_written_out_keeping_its_comment(text: str, held: str) -> None:
    """`annotations: {}` (or `{ }`, a comment after it) is an empty mapping: it is written
    out in block style, as a target's `kustomize: {}` is, and the comment stays."""
    assert apply_hold(text, HOLD, where=WHERE, app="citation") == held
    assert read_hold(held, WHERE, "citation") == HOLD
    assert apply_hold(text, None, where=WHERE, app="citation") == text


@pytest.mark.parametrize(
    ("text", "held"),
    [
        (
            "kind: Kustomization\nmetadata:\nimages: []\n",
            f"kind: Kustomization\nmetadata:\n  annotations:\n    {KEY}: '{HOLD.value()}'\n"
            "images: []\n",
        ),
        (
            "kind: Kustomization\r\nmetadata:   # the overlay's\r\n",
            "kind: Kustomization\r\nmetadata:   # the overlay's\r\n  annotations:\r\n"
            f"    {KEY}: '{HOLD.value()}'\r\n",
        ),
        (
            "kind: Kustomization\nmetadata:",
            f"kind: Kustomization\nmetadata:\n  annotations:\n    {KEY}: '{HOLD.value()}'",
        ),
    ],
    ids=["mid-file", "comment-crlf", "last-no-final-newline"],
)
def test_metadata_with_no_value_gets_the_hold_under_it(text: str, held: str) -> None:
    """`metadata:` and nothing after it is an empty mapping: the hold is written under it,
    and releasing an app that is not held there changes nothing."""
    assert read_hold(text, WHERE, "citation") is None
    assert apply_hold(text, HOLD, where=WHERE, app="citation") == held
    assert read_hold(held, WHERE, "citation") == HOLD
    assert apply_hold(text, None, where=WHERE, app="citation") == text


def test_metadata_that_is_null_is_refused_with_what_to_do() -> None:
    text = "kind: Kustomization\nmetadata: ~   # none\n"
    with pytest.raises(TargetError, match=rf"^{re.escape(WHERE)}: metadata is null \(~\); "):
        apply_hold(text, HOLD, where=WHERE, app="citation")


def test_a_held_app_is_decided_held_before_anything_else() -> None:
    for changes in ({}, {"deployed_is_current": True}, {"phase": "Succeeded"}):
        action, detail = decide(_facts(hold=HOLD, **changes))
        assert action == "held"
        assert detail.startswith("held by alice since 2026-12-03T07:00:00Z: the 2.3 release")


def test_reason_and_by_are_one_printable_line() -> None:
    from fabrique.decisions.holds import check_text

    with pytest.raises(InputError, match="--reason"):
        check_text("--reason", "two\nlines")
    with pytest.raises(InputError, match="at most 200"):
        check_text("--reason", "x" * 201)


# --------------------------------------------------------- the gestures, end to end


@pytest.fixture()
def env(tmp_path: Path, kube: KubeApiDouble) -> dict[str, str]:
    return {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }


@pytest.fixture()
def values(tmp_path: Path, gitea: GiteaDouble, registry: Registry) -> Path:
    return write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "registry.host": registry.host}
    )


def fab(values: Path, env: dict[str, str], *args: str) -> Any:
    return run_cli("--values", str(values), *args, env=env)


def _line(result: Any, app: str = "citation") -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith(f"{app}: "))


def _deployed_tag(code_repo: Repo) -> str | None:
    images = yaml.safe_load(code_repo.show(KUSTOMIZATION)).get("images") or []
    entry = next((e for e in images if e["name"] == "citation-dagster"), {})
    return entry.get("newTag")


def test_hold_is_respected_by_writeback_and_reconcile_until_release(
    code_repo: Repo, values: Path, env: dict[str, str], kube: KubeApiDouble, registry: Registry
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    held = fab(values, env, "hold", "--app", "citation", "--reason", "incident 42", "--by", "alice")
    assert held.exit_code == 0, held.stderr
    assert re.fullmatch(
        r"held: citation held by alice since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ: incident 42 "
        rf"\(atlas/atlas@main:{re.escape(KUSTOMIZATION)}, commit {code_repo.head()}\)\n",
        held.stdout,
    ), held.stdout
    message = code_repo.git("log", "-1", "--format=%B", "main")
    assert message.startswith("fabrique: hold citation\n\nincident 42\n")
    assert "Held-By: alice" in message
    assert read_hold(code_repo.show(KUSTOMIZATION), WHERE, "citation") is not None
    head = code_repo.head()

    # a replay holds nothing more
    again = fab(values, env, "hold", "--app", "citation", "--reason", "other", "--by", "bob")
    assert again.stdout.startswith("unchanged: citation is already held by alice")
    assert code_repo.head() == head

    # the Sensor path: the build ran, its write-back step says held and writes nothing
    digest = push_image(registry.url, "citation-dagster", revision[:12])
    step = fab(
        values, env, "writeback", "--app", "citation", "--revision", revision, "--digest", digest
    )
    assert step.exit_code == 0, step.stderr
    assert step.stdout.startswith("held: citation is held by alice since "), step.stdout
    assert code_repo.head() == head

    # the safety net: held, no commit, no Workflow, even with a verified build waiting
    _phase(kube, revision, "Succeeded", verified=digest)
    for _ in range(2):
        result = fab(values, env, "reconcile")
        assert result.exit_code == 0, result.stderr
        assert _line(result).startswith("citation: held: held by alice since "), result.stdout
        assert result.stdout.splitlines()[-1] == "reconcile: 1 app(s): 1 held"
    assert code_repo.head() == head and _posts(kube) == 0

    # status: who, why, when
    table = fab(values, env, "status")
    assert table.stdout.splitlines()[1].split()[:2] == ["citation", "held"]
    assert _line(table).startswith("citation: held by alice since 20")
    (entry,) = json.loads(fab(values, env, "status", "-o", "json").stdout)
    assert entry["state"] == "held"
    assert entry["facts"]["hold"]["by"] == "alice"
    assert entry["facts"]["hold"]["reason"] == "incident 42"

    released = fab(values, env, "release", "--app", "citation", "--by", "alice")
    assert released.exit_code == 0, released.stderr
    assert released.stdout.startswith("released: citation ")
    assert "it was held by alice" in released.stdout
    assert read_hold(code_repo.show(KUSTOMIZATION), WHERE, "citation") is None
    assert "Released-By: alice" in code_repo.git("log", "-1", "--format=%B", "main")
    assert fab(values, env, "release", "--app", "citation").stdout.startswith(
        "unchanged: citation is not held"
    )

    forward = fab(values, env, "reconcile")
    assert _line(forward).startswith("citation: written-back: "), forward.stdout
    assert _deployed_tag(code_repo) == revision[:12]


def test_hold_dry_run_prints_the_diff_and_writes_nothing(
    code_repo: Repo, values: Path, env: dict[str, str]
) -> None:
    head = code_repo.head()
    result = fab(values, env, "hold", "--app", "citation", "--by", "alice", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert f"+    {KEY}: '" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("would hold: citation")
    assert code_repo.head() == head


def test_bad_reason_is_refused_before_anything_is_read(values: Path, env: dict[str, str]) -> None:
    result = fab(values, env, "hold", "--app", "citation", "--reason", "a\nb", "--by", "x")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --reason ")


def test_an_argocd_application_target_is_held_in_its_metadata(
    tmp_path: Path, apps_repo: Repo, gitea: GiteaDouble, env: dict[str, str]
) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.url": gitea.url,
            "apps": [APPLICATION_APP],
        },
    )
    assert fab(values, env, "hold", "--app", "citation", "--by", "alice").exit_code == 0
    hold = read_hold(apps_repo.show(APPLICATION), WHERE, "citation")
    assert hold is not None and hold.by == "alice"
    assert fab(values, env, "release", "--app", "citation").exit_code == 0
    from .conftest import SEED_APPLICATION

    assert apps_repo.show(APPLICATION) == SEED_APPLICATION


def test_git_transport_hold_then_held_writeback(
    tmp_path: Path, code_repo: Repo, git_daemon: GitDaemon
) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{"writeback.transport": "git", "writeback.gitUrl": f"git://127.0.0.1:{git_daemon.port}"},
    )
    env = {"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN}
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    assert fab(values, env, "hold", "--app", "citation", "--by", "alice").exit_code == 0
    head = code_repo.head()
    step = fab(
        values, env, "writeback", "--app", "citation", "--revision", revision, "--digest", DIGEST_A
    )
    assert step.exit_code == 0, step.stderr
    assert step.stdout.startswith("held: citation is held by alice")
    assert code_repo.head() == head
    assert fab(values, env, "release", "--app", "citation").stdout.startswith("released: ")
    step = fab(
        values, env, "writeback", "--app", "citation", "--revision", revision, "--digest", DIGEST_A
    )
    assert step.stdout.startswith("changed: "), step.stdout
    assert _deployed_tag(code_repo) == revision[:12]


# ---------------------------------------------------- apps that share one target file


@pytest.fixture()
def shared(tmp_path: Path, gitea: GiteaDouble, registry: Registry) -> Path:
    """citation and other pin their images in the same kustomization."""
    return write_values(
        tmp_path / "shared.yaml",
        **{
            "gitea.url": gitea.url,
            "registry.host": registry.host,
            "apps": [
                {
                    "name": name,
                    "image": image,
                    "context": context,
                    "writeback": {"repo": "atlas/atlas", "path": KUSTOMIZATION},
                }
                for name, image, context in (
                    ("citation", "citation-dagster", "dataops/citation-dagster"),
                    ("other", "other-app", "dataops/other-app"),
                )
            ],
        },
    )


def _writeback(
    values: Path, env: dict[str, str], app: str, revision: str, registry: Registry
) -> Any:
    image = {"citation": "citation-dagster", "other": "other-app"}[app]
    digest = push_image(registry.url, image, revision[:12])
    return fab(values, env, "writeback", "--app", app, "--revision", revision, "--digest", digest)


def test_a_hold_is_the_apps_own_in_a_shared_file(
    code_repo: Repo, shared: Path, env: dict[str, str], registry: Registry
) -> None:
    held = fab(shared, env, "hold", "--app", "other", "--reason", "incident 7", "--by", "bob")
    assert held.stdout.startswith("held: other held by bob"), held.stdout
    # citation was never held: releasing it says so and leaves other's hold alone
    head = code_repo.head()
    release = fab(shared, env, "release", "--app", "citation", "--by", "alice")
    assert release.stdout.startswith("unchanged: citation is not held"), release.stdout
    assert code_repo.head() == head
    text = code_repo.show(KUSTOMIZATION)
    assert (
        read_hold(text, WHERE, "other") is not None and read_hold(text, WHERE, "citation") is None
    )
    # holding citation holds it (it was not "already held")
    both = fab(shared, env, "hold", "--app", "citation", "--reason", "too", "--by", "alice")
    assert both.stdout.startswith("held: citation held by alice"), both.stdout
    fab(shared, env, "release", "--app", "citation", "--by", "alice")
    # the write-backs: citation goes on, other stays held
    revision = code_repo.commit(
        {"dataops/citation-dagster/app.txt": "v2\n", "dataops/other-app/x": "2\n"}
    )
    assert _writeback(shared, env, "citation", revision, registry).stdout.startswith("changed:")
    assert _writeback(shared, env, "other", revision, registry).stdout.startswith("held: other")
    text = code_repo.show(KUSTOMIZATION)
    assert read_hold(text, WHERE, "other") is not None


def test_releasing_one_app_from_a_file_wide_hold_keeps_the_others_held(
    code_repo: Repo, shared: Path, env: dict[str, str], registry: Registry
) -> None:
    """A hand-written (or older) `fabrique.io/hold` holds every app of the file. Releasing
    one app gives each other app the same hold as its own, and removes the file-wide one."""
    text = code_repo.show(KUSTOMIZATION)
    code_repo.commit(
        {KUSTOMIZATION: apply_hold(text, Hold("", "", "incident 42"), where=WHERE, app=None)}
    )
    released = fab(shared, env, "release", "--app", "citation", "--by", "alice")
    assert released.exit_code == 0, released.stderr
    assert released.stdout.startswith("released: citation "), released.stdout
    assert "still held: other (the file-wide hold, now their own)" in released.stdout
    after = code_repo.show(KUSTOMIZATION)
    assert "fabrique.io/hold:" not in after
    assert read_hold(after, WHERE, "citation") is None
    assert read_hold(after, WHERE, "other") == Hold("", "", "incident 42")
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    assert _writeback(shared, env, "citation", revision, registry).stdout.startswith("changed:")
