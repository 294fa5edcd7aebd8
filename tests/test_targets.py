"""Golden edits of write-back targets: only the intended lines change, byte for byte."""

from __future__ import annotations

import difflib
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.decisions.targets import ImagePin, apply_pin, new_target, parse_argocd_image, read_pin
from fabrique.site.errors import TargetError
from fabrique.validate import Schemas

DATA = Path(__file__).parent / "data"
DIGEST = "sha256:" + "3" * 64
PIN = ImagePin("citation-dagster", "registry:80/citation-dagster", "abcdefabcdef", DIGEST)


def _changes(before: str, after: str) -> list[str]:
    """The +/- lines of a diff, nothing else."""
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(before.splitlines(True), after.splitlines(True), n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_kustomization_with_comments_and_three_images() -> None:
    before = _read("kustomization-three-images.yaml")
    after = apply_pin(before, "kustomize-images", PIN, where="k")
    assert _changes(before, after) == [
        "-    newTag: 0a1b2c3d4e5f",
        "-    digest: sha256:2222222222222222222222222222222222222222222222222222222222222222",
        "+    newTag: abcdefabcdef",
        f"+    digest: {DIGEST}",
    ]
    assert read_pin(after, "kustomize-images", PIN, where="k") == PIN


def test_kustomization_lacking_the_entry_gets_one_in_its_own_style() -> None:
    before = _read("kustomization-without-entry.yaml")
    after = apply_pin(before, "kustomize-images", PIN, where="k")
    assert _changes(before, after) == [
        "+- name: citation-dagster",
        "+  newName: registry:80/citation-dagster",
        "+  newTag: abcdefabcdef",
        f"+  digest: {DIGEST}",
    ]


def test_kustomization_without_images_and_without_final_newline() -> None:
    before = _read("kustomization-no-images-no-newline.yaml")
    assert not before.endswith("\n")
    after = apply_pin(before, "kustomize-images", PIN, where="k")
    assert not after.endswith("\n"), "the missing final newline stays missing"
    assert after.startswith(before)
    assert yaml.safe_load(after)["images"] == [
        {
            "name": "citation-dagster",
            "newName": "registry:80/citation-dagster",
            "newTag": "abcdefabcdef",
            "digest": DIGEST,
        }
    ]


def test_entry_with_only_a_tag_gets_the_missing_fields_in_order() -> None:
    before = "images:\n  - name: citation-dagster  # app\n    newTag: old  # was a tag\n"
    after = apply_pin(before, "kustomize-images", PIN, where="k")
    assert after == (
        "images:\n"
        "  - name: citation-dagster  # app\n"
        "    newName: registry:80/citation-dagster\n"
        "    newTag: abcdefabcdef  # was a tag\n"
        f"    digest: {DIGEST}\n"
    )


def test_an_all_digit_tag_is_quoted_so_it_stays_a_string() -> None:
    pin = ImagePin("citation-dagster", "registry:80/citation-dagster", "012345678901", DIGEST)
    after = apply_pin(_read("kustomization-three-images.yaml"), "kustomize-images", pin, where="k")
    assert '    newTag: "012345678901"' in after.splitlines()
    float_like = ImagePin(
        "citation-dagster", "registry:80/citation-dagster", "1234567e8901", DIGEST
    )
    after = apply_pin(
        _read("kustomization-three-images.yaml"), "kustomize-images", float_like, where="k"
    )
    assert yaml.safe_load(after)["images"][1]["newTag"] == "1234567e8901"


def test_quoted_values_keep_their_quotes() -> None:
    before = (
        "images:\n- name: citation-dagster\n"
        "  newName: 'registry:80/citation-dagster'\n  newTag: \"old\"\n"
    )
    after = apply_pin(before, "kustomize-images", PIN, where="k")
    assert _changes(before, after) == [
        '-  newTag: "old"',
        '+  newTag: "abcdefabcdef"',
        f"+  digest: {DIGEST}",
    ]


def test_multi_source_application_only_the_image_line_changes() -> None:
    before = _read("application-multi-source.yaml")
    after = apply_pin(before, "argocd-application", PIN, where="a")
    assert _changes(before, after) == [
        '-          - "citation-dagster=registry:80/citation-dagster:0a1b2c3d4e5f@sha256:'
        + "2" * 64
        + '"',
        f'+          - "citation-dagster=registry:80/citation-dagster:abcdefabcdef@{DIGEST}"',
    ]


def test_single_source_application_gets_kustomize_images() -> None:
    before = _read("application-single-source.yaml")
    after = apply_pin(before, "argocd-application", PIN, where="a")
    assert _changes(before, after) == [
        "+    kustomize:",
        "+      images:",
        f"+      - citation-dagster=registry:80/citation-dagster:abcdefabcdef@{DIGEST}",
    ]


def _application(*entries: str) -> str:
    return (
        "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {name: citation}\n"
        "spec:\n  source:\n    kustomize:\n      images:\n"
        + "".join(f"      - {entry}\n" for entry in entries)
    )


def _entries(text: str) -> list[str]:
    return list(yaml.safe_load(text)["spec"]["source"]["kustomize"]["images"])


def test_an_application_entry_keeps_the_name_its_containers_go_by() -> None:
    """Argo CD runs `kustomize edit set image <entry>`: the part before `=` (or, without
    one, the image itself) is the name kustomize matches the containers by. Rewritten
    under another name, the entry would set no container's image."""
    registry_named = _application("registry:80/citation-dagster:aaaaaaaaaaaa")
    assert _entries(apply_pin(registry_named, "argocd-application", PIN, where="a")) == [
        PIN.reference
    ]
    elsewhere = _application("docker.io/acme/citation-dagster:1.0")  # another image: kept
    assert _entries(apply_pin(elsewhere, "argocd-application", PIN, where="a")) == [
        "docker.io/acme/citation-dagster:1.0",
        f"citation-dagster={PIN.reference}",
    ]
    plain = _application("citation-dagster:1.0")
    assert _entries(apply_pin(plain, "argocd-application", PIN, where="a")) == [
        f"citation-dagster={PIN.reference}"
    ]


def test_application_entries_under_each_name_are_pinned_and_repeats_dropped() -> None:
    before = _application(
        "citation-dagster=registry:80/citation-dagster:aaaaaaaaaaaa",
        "other=registry:80/other:1",
        "registry:80/citation-dagster:bbbbbbbbbbbb",
        "citation-dagster=registry:80/citation-dagster:cccccccccccc",
    )
    after = apply_pin(before, "argocd-application", PIN, where="a")
    assert _entries(after) == [
        f"citation-dagster={PIN.reference}",
        "other=registry:80/other:1",
        PIN.reference,
    ]


def test_edited_application_is_still_a_valid_application(specs: Path) -> None:
    validator = Schemas(specs).validator("argoproj.io/v1alpha1", "Application")
    assert validator is not None
    for name in ("application-multi-source.yaml", "application-single-source.yaml"):
        after = apply_pin(_read(name), "argocd-application", PIN, where=name)
        assert list(validator.iter_errors(yaml.safe_load(after))) == [], name


def test_kustomize_renders_the_pinned_reference(tmp_path: Path, kubectl: Path) -> None:
    (tmp_path / "deployment.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: citation}\nspec:\n"
        "  selector: {matchLabels: {app: citation}}\n  template:\n"
        "    metadata: {labels: {app: citation}}\n"
        "    spec: {containers: [{name: app, image: citation-dagster}]}\n"
    )
    text = apply_pin("resources:\n- deployment.yaml\n", "kustomize-images", PIN, where="k")
    (tmp_path / "kustomization.yaml").write_text(text)
    rendered = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, check=True
    )
    image = yaml.safe_load(rendered.stdout)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"registry:80/citation-dagster:abcdefabcdef@{DIGEST}"


def test_new_kustomization_target() -> None:
    text = new_target("kustomize-images", PIN, where="k")
    assert read_pin(text, "kustomize-images", PIN, where="k") == PIN
    with pytest.raises(TargetError, match="cannot be created from nothing"):
        new_target("argocd-application", PIN, where="a")


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("images: [\n", "kustomize-images", r"^k: line \d+: not valid YAML"),
        ("a: 1\n---\nb: 2\n", "kustomize-images", "holds 2 YAML documents"),
        ("- a\n", "kustomize-images", "the document must be a mapping"),
        ("kind: Deployment\n", "kustomize-images", "kind is 'Deployment', not a Kustomization"),
        ("images: {a: b}\n", "kustomize-images", "images must be a list"),
        (
            "{kind: Kustomization, images: [{name: citation-dagster}]}\n",
            "kustomize-images",
            "in flow style and shares its lines",
        ),
        ("images: [{name: a}, # why\n  {name: b}]\n", "kustomize-images", "comment inside"),
        (
            "images:\n- name: citation-dagster\n  newTag: &t old\nlabels: {v: *t}\n",
            "kustomize-images",
            "images uses the YAML anchor &t",
        ),
        (
            "x: &t old\nimages:\n- name: citation-dagster\n  newTag: *t\n",
            "kustomize-images",
            "images uses the YAML alias [*]t",
        ),
        (
            "kind: Application\nspec:\n  source: &s\n    path: a\n  x: *s\n",
            "argocd-application",
            "the Application source uses the YAML anchor &s",
        ),
        ("images:\n- just-a-string\n", "kustomize-images", r"images\[0\] must be a mapping"),
        ("kind: Kustomization\n", "argocd-application", "not an Argo CD Application"),
        (
            "kind: Application\nspec:\n  sources:\n  - path: a\n  - path: b\n",
            "argocd-application",
            "set the app's writeback.sourceIndex",
        ),
    ],
)
def test_bad_targets_are_refused_with_one_line(text: str, kind: str, expected: str) -> None:
    with pytest.raises(TargetError, match=expected) as caught:
        apply_pin(text, kind, PIN, where="k")  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("value", "image", "tag", "digest"),
    [
        (
            "citation-dagster=registry:80/citation-dagster:abc@sha256:x",
            "citation-dagster",
            "abc",
            "sha256:x",
        ),
        ("registry:80/citation-dagster:abc", "registry:80/citation-dagster", "abc", None),
        ("registry:80/citation-dagster", "registry:80/citation-dagster", None, None),
        ("name=registry:80/x@sha256:y", "name", None, "sha256:y"),
    ],
)
def test_parse_argocd_image(value: str, image: str, tag: str | None, digest: str | None) -> None:
    parsed = parse_argocd_image(value)
    assert (parsed.image, parsed.tag, parsed.digest) == (image, tag, digest)


# ------------------------------------------------------------ odd target files


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "kind: Kustomization\nimages:\n",
            r"^k: images has no value \(null\); write the list under it or remove the key$",
        ),
        (
            "kind: Kustomization\nimages:\n- &base {newName: x}\n- <<: *base\n  name: y\n",
            r"^k: uses a YAML merge key \(<<: \*anchor\)",
        ),
        (
            "base: &b {kind: Kustomization}\n<<: *b\nimages:\n- name: citation-dagster\n",
            r"^k: uses a YAML merge key",
        ),
        (
            "images:\n- name: citation-dagster\n  newTag: a\n- name: citation-dagster\n",
            r"^k: 2 entries name the image citation-dagster: images\[0\] \(citation-dagster\), "
            r"images\[1\] \(citation-dagster\); kustomize would apply only one of them",
        ),
        (
            # the registry name after the plain one: kustomize keeps applying the other
            "images:\n- name: citation-dagster\n- name: registry:80/citation-dagster\n  newTag: b\n",
            r"^k: 2 entries name the image citation-dagster: images\[0\] \(citation-dagster\), "
            r"images\[1\] \(registry:80/citation-dagster\)",
        ),
    ],
    ids=["null-images", "merge-in-entry", "merge-at-top", "listed-twice", "registry-name-shadow"],
)
def test_odd_kustomizations_are_refused_not_half_edited(text: str, expected: str) -> None:
    for read_or_write in (read_pin, apply_pin):
        with pytest.raises(TargetError, match=expected) as caught:
            read_or_write(text, "kustomize-images", PIN, where="k")
        assert "\n" not in str(caught.value)


def test_a_crlf_file_keeps_its_line_endings() -> None:
    before = "kind: Kustomization\r\nimages:\r\n- name: postgres\r\n  newTag: '16'\r\n"
    after = apply_pin(before, "kustomize-images", PIN, where="k")
    assert after.startswith(before)
    assert after.count("\r\n") == after.count("\n") == 8, repr(after)
    entry = apply_pin(
        "images:\r\n- name: citation-dagster\r\n  newTag: old\r\n",
        "kustomize-images",
        PIN,
        where="k",
    )
    assert entry == (
        "images:\r\n- name: citation-dagster\r\n  newName: registry:80/citation-dagster\r\n"
        f"  newTag: abcdefabcdef\r\n  digest: {DIGEST}\r\n"
    )
    unterminated = apply_pin(
        "kind: Kustomization\r\nresources: []", "kustomize-images", PIN, where="k"
    )
    assert unterminated.count("\r\n") == unterminated.count("\n") and not unterminated.endswith(
        "\n"
    )


def test_a_tag_is_read_as_its_source_text() -> None:
    text = "images:\n- name: citation-dagster\n  newTag: 1.10\n  digest: null\n"
    assert read_pin(text, "kustomize-images", PIN, where="k") == ImagePin(
        "citation-dagster", "citation-dagster", "1.10", None
    )
    same = ImagePin("citation-dagster", "citation-dagster", "1.10", DIGEST)
    text = (
        "images:\n- name: citation-dagster\n  newName: citation-dagster\n  newTag: 1.10\n"
        f"  digest: {DIGEST}\n"
    )
    assert apply_pin(text, "kustomize-images", same, where="k") == text, "1.10 is the tag already"


def test_inserted_keys_come_in_kustomizes_order() -> None:
    after = apply_pin("images:\n- name: citation-dagster\n", "kustomize-images", PIN, where="k")
    assert after == (
        "images:\n- name: citation-dagster\n  newName: registry:80/citation-dagster\n"
        f"  newTag: abcdefabcdef\n  digest: {DIGEST}\n"
    )
    with_digest = apply_pin(
        "images:\n- name: citation-dagster\n  digest: sha256:" + "1" * 64 + "\n",
        "kustomize-images",
        PIN,
        where="k",
    )
    assert [line.split(":")[0].strip(" -") for line in with_digest.splitlines()[1:]] == [
        "name",
        "newName",
        "newTag",
        "digest",
    ]


@pytest.mark.parametrize(
    ("before", "kind", "entries"),
    [
        (
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nimages: []\n",
            "kustomize-images",
            lambda data: data["images"],
        ),
        (
            "kind: Kustomization\nimages: []   # pinned by fabrique\nresources: [a.yaml]\n",
            "kustomize-images",
            lambda data: data["images"],
        ),
        (
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {name: c}\n"
            "spec:\n  source:\n    path: a\n    kustomize: {}\n",
            "argocd-application",
            lambda data: data["spec"]["source"]["kustomize"]["images"],
        ),
        (
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {name: c}\n"
            "spec:\n  source:\n    path: a\n    kustomize:\n      images: []\n",
            "argocd-application",
            lambda data: data["spec"]["source"]["kustomize"]["images"],
        ),
    ],
    ids=["kustomization-images", "with-a-comment", "application-kustomize", "application-images"],
)
def test_an_empty_flow_collection_is_edited_not_refused(
    before: str, kind: str, entries: Any
) -> None:
    """`images: []` and `kustomize: {}` are valid and common: the edit writes them out in
    block style, with the pin, and nothing else changes."""
    after = apply_pin(before, kind, PIN, where="t")  # type: ignore[arg-type]
    data = yaml.safe_load(after)
    (entry,) = entries(data)
    if kind == "kustomize-images":
        assert entry == {
            "name": "citation-dagster",
            "newName": PIN.new_name,
            "newTag": PIN.tag,
            "digest": PIN.digest,
        }
    else:
        assert entry == f"citation-dagster={PIN.reference}"
    assert read_pin(after, kind, PIN, where="t") == PIN  # type: ignore[arg-type]
    assert apply_pin(after, kind, PIN, where="t") == after  # type: ignore[arg-type]
    kept = [line for line in before.splitlines() if "[]" not in line and "{}" not in line]
    assert all(line in after.splitlines() for line in kept)


def test_a_shared_file_is_parsed_once_when_the_workers_ask_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reconcile pass reads one pin per app, 8 workers at once: a file that many apps
    share must be parsed once, not once per worker that missed the cache together."""
    import threading
    import time

    from fabrique.decisions import targets

    parses: list[str] = []
    real = targets.pyyaml.load_all

    def slow_load(text: str, Loader: Any) -> Any:
        parses.append(text)
        time.sleep(0.05)  # long enough for every worker to miss together
        return real(text, Loader=Loader)

    monkeypatch.setattr(targets.pyyaml, "load_all", slow_load)
    text = "images:\n- name: citation-dagster\n  newTag: " + uuid_hex() + "\n"
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait()
        targets._read_shared(text, "shared.yaml")

    workers = [threading.Thread(target=ask) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert parses == [text]


def uuid_hex() -> str:
    import uuid

    return uuid.uuid4().hex[:12]


# ------------------------------------------------------------ flow style, written out


def test_a_flow_style_images_list_is_written_out_keeping_the_other_entries() -> None:
    before = (
        "kind: Kustomization\n"
        "images: [{name: citation-dagster, newTag: old}, {name: other, newTag: '1'}]  # pins\n"
        "resources: [a.yaml]\n"
    )
    after = apply_pin(before, "kustomize-images", PIN, where="k")
    assert after == (
        "kind: Kustomization\n"
        "images: # pins\n"
        "- name: citation-dagster\n"
        "  newName: registry:80/citation-dagster\n"
        "  newTag: abcdefabcdef\n"
        f"  digest: {DIGEST}\n"
        "- {name: other, newTag: '1'}\n"
        "resources: [a.yaml]\n"
    )
    assert read_pin(after, "kustomize-images", PIN, where="k") == PIN


def test_a_flow_style_list_over_several_lines_gets_the_new_entry_last() -> None:
    before = "images: [\n  {name: other,\n   newTag: '1'},\n]\n"
    after = apply_pin(before, "kustomize-images", PIN, where="k")
    assert after.startswith("images:\n- {name: other, newTag: '1'}\n- name: citation-dagster\n")
    assert read_pin(after, "kustomize-images", PIN, where="k") == PIN


def test_a_flow_style_entry_in_a_block_list_is_written_out() -> None:
    before = "images:\n  - {name: citation-dagster, newTag: old}\n  - name: other\n"
    after = apply_pin(before, "kustomize-images", PIN, where="k")
    assert after == (
        "images:\n"
        "  - name: citation-dagster\n"
        "    newName: registry:80/citation-dagster\n"
        "    newTag: abcdefabcdef\n"
        f"    digest: {DIGEST}\n"
        "  - name: other\n"
    )


def test_a_flow_style_application_list_is_written_out_under_its_own_names() -> None:
    before = (
        "kind: Application\nspec:\n  source:\n    kustomize:\n"
        "      images: [registry:80/citation-dagster:old, other=o:1, 'citation-dagster=x:2']\n"
    )
    after = apply_pin(before, "argocd-application", PIN, where="a")
    assert _entries(after) == [PIN.reference, "other=o:1", f"citation-dagster={PIN.reference}"]
    assert after.endswith(
        f"      images:\n      - {PIN.reference}\n      - other=o:1\n"
        f"      - citation-dagster={PIN.reference}\n"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("images: []\nimages: []\n", "duplicate key .images."),
        ("base: &b {name: x}\nimages:\n- <<: *b\n  newTag: y\n", "uses a YAML merge key"),
        ("images:\n- name: a\n  name: b\n", "duplicate key .name."),
    ],
)
def test_a_reader_refuses_what_the_edit_refuses(text: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        read_pin(text, "kustomize-images", PIN, where="k")
    with pytest.raises(TargetError, match=message):
        apply_pin(text, "kustomize-images", PIN, where="k")


def test_a_reader_reads_values_as_their_text_and_plain_nulls_as_none() -> None:
    text = "images:\n- name: citation-dagster\n  newTag: 1.10\n  digest:\n  newName: 'null'\n"
    assert read_pin(text, "kustomize-images", PIN, where="k") == ImagePin(
        "citation-dagster", "null", "1.10", None
    )


# ------------------------------------------------------------ empty fields and odd keys


PINNED = f"  newName: registry:80/citation-dagster\n  newTag: abcdefabcdef\n  digest: {DIGEST}\n"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            "images:\n- name: citation-dagster\n  newTag: old\n  digest:\n",
            "images:\n- name: citation-dagster\n" + PINNED,
        ),
        (
            "images:\n- name: citation-dagster\n  newTag:\n",
            "images:\n- name: citation-dagster\n" + PINNED,
        ),
        (
            "images:\n- name: citation-dagster\n  newTag: old\n  digest:",
            "images:\n- name: citation-dagster\n" + PINNED.removesuffix("\n"),
        ),
        (
            "images:\n- name: citation-dagster\n  newTag:\n  digest:\nresources: [a.yaml]\n",
            "images:\n- name: citation-dagster\n" + PINNED + "resources: [a.yaml]\n",
        ),
        (
            "images:\n- name: citation-dagster\n  newName:\n  newTag:   # the tag\n"
            "  digest: ''\n- name: other\n",
            "images:\n- name: citation-dagster\n  newName: registry:80/citation-dagster\n"
            f"  newTag: abcdefabcdef   # the tag\n  digest: '{DIGEST}'\n- name: other\n",
        ),
        (
            "images:\r\n- name: citation-dagster\r\n  digest:\r\n  newTag: old\r\n",
            "images:\r\n- name: citation-dagster\r\n  newName: registry:80/citation-dagster\r\n"
            f"  digest: {DIGEST}\r\n  newTag: abcdefabcdef\r\n",
        ),
        (
            "images:\n- name: other\n  newTag:\nresources: [a.yaml]\n",
            "images:\n- name: other\n  newTag:\n- name: citation-dagster\n"
            + PINNED
            + "resources: [a.yaml]\n",
        ),
    ],
    ids=["digest-last", "tag-last", "no-final-newline", "mid-file", "comment", "crlf", "after-one"],
)
def test_an_entry_with_an_empty_field_is_pinned_like_any_other(before: str, after: str) -> None:
    """`digest:` with no value is an empty scalar: its value goes right after the colon,
    wherever the entry stands in the file."""
    assert apply_pin(before, "kustomize-images", PIN, where="k") == after
    assert read_pin(after, "kustomize-images", PIN, where="k") == PIN


def test_an_empty_field_whose_colon_is_on_another_line_is_refused_by_name() -> None:
    text = "images:\n- name: citation-dagster\n  ? newTag\n  :\n"
    with pytest.raises(TargetError, match=r"^k: line 3: cannot find the ':' after the key newT"):
        apply_pin(text, "kustomize-images", PIN, where="k")


@pytest.mark.parametrize(
    ("text", "kind", "line"),
    [
        (
            "kind: Kustomization\nmetadata:\n  labels:\n    ? {owner: data}\n    : team\n"
            "images:\n- name: citation-dagster\n",
            "kustomize-images",
            4,
        ),
        ("kind: Kustomization\n? [a, b]\n: team\n", "kustomize-images", 2),
        (
            "kind: Application\nmetadata:\n  labels:\n    ? {owner: data}\n    : team\n"
            "spec:\n  source:\n    path: a\n",
            "argocd-application",
            4,
        ),
    ],
    ids=["mapping-key", "list-key", "application"],
)
def test_a_key_that_is_a_mapping_or_a_list_is_refused_by_name(
    text: str, kind: str, line: int
) -> None:
    """Valid YAML, but no Kubernetes object (nor kustomize) takes such a key: the file is
    refused with its line, as a TargetError, never a TypeError."""
    for read_or_write in (read_pin, apply_pin):
        with pytest.raises(TargetError, match=rf"^k: line {line}: a key that is a mapping or a "):
            read_or_write(text, kind, PIN, where="k")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            "kind: Kustomization\nimages: []  # pinned by fabrique\n",
            "kind: Kustomization\nimages: # pinned by fabrique\n- name: citation-dagster\n"
            + PINNED,
        ),
        (
            "kind: Kustomization\nimages: [ ]  # pinned by fabrique\n",
            "kind: Kustomization\nimages: # pinned by fabrique\n- name: citation-dagster\n"
            + PINNED,
        ),
        (
            "kind: Kustomization\nimages: [\n]\nresources: [a.yaml]\n",
            "kind: Kustomization\nimages:\n- name: citation-dagster\n"
            + PINNED
            + "resources: [a.yaml]\n",
        ),
        (
            "kind: Application\nspec:\n  source:\n    path: a\n    kustomize: { }  # pins\n",
            "kind: Application\nspec:\n  source:\n    path: a\n    kustomize: # pins\n"
            f"      images:\n      - citation-dagster={PIN.reference}\n",
        ),
        (
            "kind: Application\nspec:\n  source:\n    kustomize:\n      images: [ ] # pins\n"
            "    path: a\n",
            "kind: Application\nspec:\n  source:\n    kustomize:\n      images: # pins\n"
            f"      - citation-dagster={PIN.reference}\n    path: a\n",
        ),
    ],
    ids=["comment", "space-inside", "over-two-lines", "application-kustomize", "application"],
)
def test_an_empty_flow_collection_keeps_its_comment_however_it_is_spelled(
    before: str, after: str
) -> None:
    """`[]`, `[ ]` and `[` newline `]` are the same empty list: each is written out, and
    the comment after it stays, as it does for a flow list with entries."""
    kind = "argocd-application" if "Application" in before else "kustomize-images"
    assert apply_pin(before, kind, PIN, where="k") == after  # type: ignore[arg-type]
    assert read_pin(after, kind, PIN, where="k") == PIN  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "kind: Application\nspec:\n  source:\n    path: a\n    kustomize:\n",
            r"^a: kustomize has no value \(null\); write the mapping under it or remove the key$",
        ),
        (
            "kind: Application\nspec:\n  source:\n    kustomize:\n      images:\n    path: a\n",
            r"^a: kustomize.images has no value \(null\); write the list under it",
        ),
    ],
    ids=["kustomize", "images"],
)
def test_an_application_with_an_empty_collection_is_refused_by_name(
    text: str, expected: str
) -> None:
    """As a Kustomization's `images:` with no value is: not an AttributeError."""
    for read_or_write in (read_pin, apply_pin):
        with pytest.raises(TargetError, match=expected):
            read_or_write(text, "argocd-application", PIN, where="a")
