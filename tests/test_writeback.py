"""`fabrique writeback` over the Gitea double (Contents API) and a real git daemon."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.clients.git import GitRemote
from fabrique.decisions.targets import yaml_scalar
from fabrique.decisions.writeback import open_transport, write_back
from fabrique.site.config import default_values, load_site, merge, parse_site
from fabrique.site.errors import StaleWrite

from .conftest import (
    APPLICATION,
    APPLICATION_APP,
    GITEA_TOKEN,
    KUSTOMIZATION,
    SEED_KUSTOMIZATION,
    Repo,
    run_cli,
    write_values,
)
from .doubles.gitea import GiteaDouble
from .servers import GitDaemon, Registry, closed_port
from .test_reconcile import _reconcile, env  # noqa: F401  (env: the fixture)

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


@pytest.fixture()
def values(tmp_path: Path, gitea: GiteaDouble) -> Path:
    return write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url})


def _writeback(
    values: Path,
    revision: str,
    digest: str,
    *extra: str,
    token: str = GITEA_TOKEN,
    app: str = "citation",
    verbose: bool = False,
):  # type: ignore[no-untyped-def]
    return run_cli(
        *(["-v"] if verbose else []),
        "--values",
        str(values),
        "writeback",
        "--app",
        app,
        "--revision",
        revision,
        "--digest",
        digest,
        *extra,
        env={"FABRIQUE_GITEA_TOKEN": token},
    )


def _images(repo: Repo, path: str = KUSTOMIZATION) -> list[dict[str, Any]]:
    return yaml.safe_load(repo.show(path))["images"]


def _commits(repo: Repo) -> int:
    return int(repo.git("rev-list", "--count", "main").strip())


# ------------------------------------------------------------------ Contents API


def test_write_back_then_replay_makes_exactly_one_commit(code_repo: Repo, values: Path) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"}, "v2")
    before = _commits(code_repo)

    first = _writeback(values, revision, DIGEST_A)
    assert first.exit_code == 0, first.stderr
    head = code_repo.head()
    assert first.stdout.strip() == (
        f"changed: citation registry:80/citation-dagster:{revision[:12]}@{DIGEST_A} -> "
        f"atlas/atlas@main:{KUSTOMIZATION} (commit {head})"
    )
    assert _images(code_repo)[-1] == {
        "name": "citation-dagster",
        "newName": "registry:80/citation-dagster",
        "newTag": revision[:12],
        "digest": DIGEST_A,
    }
    message = code_repo.git("log", "-1", "--format=%an <%ae>%n%B", "main")
    assert message.startswith(
        "fabrique <fabrique@fabrique.invalid>\nfabrique: deploy citation-dagster"
    )
    for needle in (
        "App: citation",
        f"Digest: {DIGEST_A}",
        f"Source-Revision: {revision}",
        f"Workflow: fabrique-citation-{revision[:12]}",
        "Image: registry:80/citation-dagster:",
    ):
        assert needle in message

    replay = _writeback(values, revision, DIGEST_A)
    assert replay.exit_code == 0
    assert replay.stdout.strip().startswith("unchanged: citation already deploys")
    assert _commits(code_repo) == before + 1
    assert code_repo.head() == head


def test_only_the_image_lines_change_in_the_repository(code_repo: Repo, values: Path) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    assert _writeback(values, revision, DIGEST_A).exit_code == 0
    diff = code_repo.git("diff", "main~1", "main", "--unified=0", "--", KUSTOMIZATION)
    changed = [
        line
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == [
        "+  - name: citation-dagster",
        "+    newName: registry:80/citation-dagster",
        f"+    newTag: {yaml_scalar(revision[:12])}",  # quoted if YAML would read a number
        f"+    digest: {DIGEST_A}",
    ]
    assert code_repo.git("diff", "--stat", "main~1", "main").count("|") == 1, (
        "one file, nothing else"
    )


def test_dry_run_prints_the_exact_diff_and_writes_nothing(code_repo: Repo, values: Path) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    head = code_repo.head()
    result = _writeback(values, revision, DIGEST_A, "--dry-run")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"--- a/{KUSTOMIZATION}"
    assert lines[1] == f"+++ b/{KUSTOMIZATION}"
    assert f"+    digest: {DIGEST_A}" in lines
    assert lines[-1].startswith("would change: citation")
    assert code_repo.head() == head


def test_never_roll_back_to_a_parent(code_repo: Repo, values: Path) -> None:
    parent = code_repo.commit({"dataops/citation-dagster/app.txt": "A\n"}, "A")
    child = code_repo.commit({"dataops/citation-dagster/app.txt": "B\n"}, "B")
    assert _writeback(values, child, DIGEST_B).stdout.startswith("changed:")
    head = code_repo.head()

    late = _writeback(values, parent, DIGEST_A)  # the slow build of the older commit
    assert late.exit_code == 0, late.stderr
    assert late.stdout.startswith("superseded: citation deployed revision")
    assert child in late.stdout and parent in late.stdout
    assert "not rolling back" in late.stderr
    assert code_repo.head() == head
    assert _images(code_repo)[-1]["digest"] == DIGEST_B


def test_a_descendant_replaces_the_deployed_revision(code_repo: Repo, values: Path) -> None:
    first = code_repo.commit({"dataops/citation-dagster/app.txt": "1\n"})
    assert _writeback(values, first, DIGEST_A).stdout.startswith("changed:")
    code_repo.commit({"README.md": "unrelated\n"})
    second = code_repo.commit({"dataops/citation-dagster/app.txt": "2\n"})
    code_repo.commit({"README.md": "a newer head\n"})  # second is not the head any more
    result = _writeback(values, second, DIGEST_B)
    assert result.stdout.startswith("changed:"), result.stdout + result.stderr
    assert _images(code_repo)[-1]["newTag"] == second[:12]


@pytest.mark.parametrize("transport", ["gitea", "git"])
def test_a_deployed_tag_that_is_no_commit_yields_only_to_the_branch_head(
    code_repo: Repo, tmp_path: Path, gitea: GiteaDouble, git_daemon: GitDaemon, transport: str
) -> None:
    """Fail closed: when the deployed tag names no commit, nothing tells whether a build
    is newer, so only the branch head may replace it."""
    settings: dict[str, Any] = {"gitea.url": gitea.url}
    if transport == "git":
        settings |= {"writeback.transport": "git", "writeback.gitUrl": git_daemon.url("")[:-1]}
    values = write_values(tmp_path / "site.yaml", **settings)
    hand = SEED_KUSTOMIZATION + "  - name: citation-dagster\n    newTag: 1.4.2\n"
    older = code_repo.commit({"dataops/citation-dagster/app.txt": "older\n"})
    head = code_repo.commit({KUSTOMIZATION: hand}, "pinned by hand")
    refused = _writeback(values, older, DIGEST_A)
    assert refused.exit_code == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: deployed tag '1.4.2' is not a commit of atlas/atlas@main, so nothing tells "
        f"whether {older} is newer: only the branch head ({head}) may replace it; build the "
        "head (fabrique submit --head) or set the tag by hand"
    )
    assert code_repo.head() == head and code_repo.show(KUSTOMIZATION) == hand
    adopted = _writeback(values, head, DIGEST_B, verbose=True)
    assert adopted.exit_code == 0, adopted.stderr
    assert adopted.stdout.startswith("changed:")
    assert "the branch head" in adopted.stderr
    assert _images(code_repo)[-1] == {
        "name": "citation-dagster",
        "newTag": head[:12],
        "newName": "registry:80/citation-dagster",
        "digest": DIGEST_B,
    }


def test_argocd_application_target_in_the_apps_repo(
    tmp_path: Path, gitea: GiteaDouble, code_repo: Repo, apps_repo: Repo
) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.url": gitea.url,
            "apps": [APPLICATION_APP],
        },
    )
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    result = _writeback(values, revision, DIGEST_A)
    assert result.exit_code == 0, result.stderr
    app = yaml.safe_load(apps_repo.show(APPLICATION))
    assert app["spec"]["sources"][1]["kustomize"]["images"] == [
        f"citation-dagster=registry:80/citation-dagster:{revision[:12]}@{DIGEST_A}"
    ]
    assert "ref" in app["spec"]["sources"][0] and "kustomize" not in app["spec"]["sources"][0]
    assert apps_repo.show(APPLICATION).startswith("# citation in prod")
    assert _writeback(values, revision, DIGEST_A).stdout.startswith("unchanged:")


def test_a_missing_file_is_created_only_when_asked(
    tmp_path: Path, gitea: GiteaDouble, code_repo: Repo
) -> None:
    def site(create: bool) -> Path:
        return write_values(
            tmp_path / "site.yaml",
            **{
                "gitea.url": gitea.url,
                "apps": [
                    {
                        "name": "citation",
                        "image": "citation-dagster",
                        "context": "dataops/citation-dagster",
                        "writeback": {
                            "repo": "atlas/atlas",
                            "path": "deploy/new/kustomization.yaml",
                            "create": create,
                        },
                    }
                ],
            },
        )

    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    head = code_repo.head()
    refused = _writeback(site(False), revision, DIGEST_A)
    assert refused.exit_code == 2
    assert (
        "atlas/atlas@main:deploy/new/kustomization.yaml: file not found "
        "(set apps[].writeback.create" in refused.stderr
    )
    assert code_repo.head() == head
    created = _writeback(site(True), revision, DIGEST_A)
    assert created.exit_code == 0, created.stderr
    assert _images(code_repo, "deploy/new/kustomization.yaml")[0]["digest"] == DIGEST_A


def _site_with_apps(gitea_url: str, count: int, **writeback: Any) -> Any:
    values = merge(
        default_values(),
        {
            "gitea": {"url": gitea_url},
            "network": {"backoffSeconds": 0.01},
            "writeback": {"attempts": 60, **writeback},
            "apps": [
                {
                    "name": f"app-{i:02d}",
                    "image": f"image-{i:02d}",
                    "context": "dataops/citation-dagster",
                    "writeback": {"repo": "atlas/atlas", "path": KUSTOMIZATION},
                }
                for i in range(count)
            ],
        },
    )
    return parse_site(values)


def _race(site: Any, revision: str, token: str | None, count: int) -> list[Any]:
    outcomes: list[Any] = [None] * count
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            with open_transport(site, token) as transport:
                outcomes[index] = write_back(
                    site, transport, f"app-{index:02d}", revision, f"sha256:{index:064x}"
                )
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return outcomes


def test_sixteen_concurrent_writers_on_one_file_lose_nothing(
    code_repo: Repo, gitea: GiteaDouble
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    before = _commits(code_repo)
    gitea.race_rate = 0.25
    outcomes = _race(_site_with_apps(gitea.url, 16), revision, GITEA_TOKEN, 16)
    assert [o.state for o in outcomes] == ["changed"] * 16
    pins = {e["name"]: e.get("digest") for e in _images(code_repo)}
    assert pins == {"postgres": None, **{f"image-{i:02d}": f"sha256:{i:064x}" for i in range(16)}}
    assert _commits(code_repo) == before + 16, "each writer made exactly one commit"
    authors = code_repo.git("log", f"-{16}", "--format=%s", "main").splitlines()
    assert sorted(authors) == sorted(
        f"fabrique: deploy image-{i:02d} {revision[:12]} for app-{i:02d}" for i in range(16)
    )
    assert gitea.races > 0, "the double injected 422 races"
    stale = [r for r in gitea.requests if r.method == "PUT"]
    assert len(stale) > 16, "some writers had to re-read and retry"


def test_a_writer_that_keeps_losing_gives_up_transiently(
    code_repo: Repo, tmp_path: Path, gitea: GiteaDouble
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "writeback.attempts": 3}
    )
    gitea.race_rate = 1.0
    head = code_repo.head()
    result = _writeback(values, revision, DIGEST_A)
    assert result.exit_code == 75
    assert "still losing the write race after 3 attempt(s)" in result.stderr
    assert code_repo.head() == head


@pytest.mark.parametrize("fault", [500, "drop", ("slow", 0.6)])
def test_transient_server_faults_are_retried(
    code_repo: Repo, tmp_path: Path, gitea: GiteaDouble, fault: Any
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "network.timeoutSeconds": 0.4}
    )
    gitea.faults = [("GET", fault), ("PUT", fault)]
    result = _writeback(values, revision, DIGEST_A)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("changed:")
    assert gitea.faults == []
    assert _images(code_repo)[-1]["digest"] == DIGEST_A


# -------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (
            ["--digest", "sha256:abc"],
            2,
            "digest 'sha256:abc': must match sha256:<64 lowercase hex>",
        ),
        (["--digest", "latest"], 2, "must match sha256:<64 lowercase hex>"),
        (["--app", "nope"], 2, "app 'nope': not in the site config"),
        (["--revision", "abc"], 2, "revision 'abc': must be a full lowercase hex commit id"),
    ],
)
def test_bad_arguments(
    code_repo: Repo, values: Path, args: list[str], code: int, expected: str
) -> None:
    merged = {"--app": "citation", "--revision": code_repo.head(), "--digest": DIGEST_A}
    merged.update(dict(zip(args[::2], args[1::2], strict=True)))
    head = code_repo.head()
    result = run_cli(
        "--values",
        str(values),
        "writeback",
        *[x for kv in merged.items() for x in kv],
        env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN},
    )
    assert result.exit_code == code
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert code_repo.head() == head


def test_missing_branch_is_named(tmp_path: Path, gitea: GiteaDouble, code_repo: Repo) -> None:
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "gitea.branch": "release"}
    )
    result = _writeback(values, code_repo.head(), DIGEST_A)
    assert result.exit_code == 3
    assert "branch 'release' of atlas/atlas: not found in Gitea" in result.stderr


def test_a_target_that_is_not_yaml(code_repo: Repo, values: Path) -> None:
    revision = code_repo.commit({KUSTOMIZATION: "images: [\n  - {broken\n"})
    head = code_repo.head()
    result = _writeback(values, revision, DIGEST_A)
    assert result.exit_code == 2
    assert (
        f"atlas/atlas@main:{KUSTOMIZATION}: line" in result.stderr
        and "not valid YAML" in result.stderr
    )
    assert code_repo.head() == head


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind: Kustomization\nimages:\n", "images has no value (null)"),
        (
            "x: &pin {newTag: old}\nimages:\n- <<: *pin\n  name: citation-dagster\n",
            "uses a YAML merge key",
        ),
        (
            "images:\n- name: citation-dagster\n- name: registry:80/citation-dagster\n",
            "2 entries name the image citation-dagster",
        ),
        (
            "metadata:\n  labels:\n    ? {owner: data}\n    : team\nimages:\n- name: x\n",
            "line 3: a key that is a mapping or a list",
        ),
    ],
)
def test_an_odd_target_exits_2_on_one_line_and_writes_nothing(
    code_repo: Repo, values: Path, text: str, expected: str
) -> None:
    revision = code_repo.commit({KUSTOMIZATION: text})
    head = code_repo.head()
    result = _writeback(values, revision, DIGEST_A)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"error: atlas/atlas@main:{KUSTOMIZATION}: {expected}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert code_repo.head() == head


def test_one_unreadable_target_is_its_apps_error_and_the_pass_goes_on(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],  # noqa: F811  (test_reconcile's fixture)
) -> None:
    """The safety net reads every app's target: a file its readers cannot read (a key that
    is a mapping, valid YAML) is that app's error, named, not a traceback that ends the
    pass for every app."""
    apps = [
        {
            "name": name,
            "image": f"{name}-image",
            "context": f"dataops/{name}",
            "writeback": {"repo": "atlas/atlas", "path": f"dataops/{name}/kustomization.yaml"},
        }
        for name in ("citation", "odd")
    ]
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "registry.host": registry.host}
    )
    values.write_text(values.read_text() + yaml.safe_dump({"apps": apps}))
    odd = "kind: Kustomization\n? {owner: data}\n: team\nimages:\n- name: odd-image\n"
    code_repo.commit(
        {
            "dataops/citation/kustomization.yaml": "images:\n- name: citation-image\n",
            "dataops/citation/src.txt": "v2\n",
            "dataops/odd/kustomization.yaml": odd,
            "dataops/odd/src.txt": "v2\n",
        }
    )
    result = _reconcile(values, env)
    lines = {line.split(":")[0]: line for line in result.stdout.splitlines()}
    assert lines["citation"].startswith("citation: submitted: "), result.stdout
    assert lines["odd"] == (
        "odd: error: atlas/atlas:dataops/odd/kustomization.yaml: line 2: a key that is "
        "a mapping or a list, which Kubernetes and kustomize do not take; write the key as a "
        "string"
    )
    assert result.exit_code != 0


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ("wrong-token-5e2b", "Gitea refused the token (HTTP 401)"),
        # Gitea hides a private repository from a request without a token: a 404
        ("", "HTTP 404 to a request without a token; set FABRIQUE_GITEA_TOKEN"),
    ],
)
def test_a_wrong_token_is_refused_and_never_shown(
    code_repo: Repo, values: Path, token: str, said: str
) -> None:
    head = code_repo.head()
    result = _writeback(values, head, DIGEST_A, verbose=True, token=token)
    assert result.exit_code == 3
    assert said in result.stderr
    if token:
        assert token not in result.stdout + result.stderr
    assert code_repo.head() == head


def test_the_right_token_never_reaches_the_output(
    code_repo: Repo, values: Path, caplog: pytest.LogCaptureFixture
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    result = _writeback(values, revision, DIGEST_A, verbose=True, token=GITEA_TOKEN)
    assert result.exit_code == 0, result.stderr
    assert GITEA_TOKEN not in result.stdout + result.stderr + caplog.text
    assert GITEA_TOKEN not in code_repo.git("log", "--format=%B%an%ae", "main")


def test_gitea_down(tmp_path: Path) -> None:
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": f"http://127.0.0.1:{closed_port()}"}
    )
    result = _writeback(values, "a" * 40, DIGEST_A)
    assert result.exit_code == 75
    assert "Gitea at http://127.0.0.1:" in result.stderr and "unreachable" in result.stderr
    assert GITEA_TOKEN not in result.stderr


# ------------------------------------------------------------------- git transport


@pytest.fixture()
def git_values(tmp_path: Path, git_daemon: GitDaemon) -> Path:
    return write_values(
        tmp_path / "site.yaml",
        **{"writeback.transport": "git", "writeback.gitUrl": f"git://127.0.0.1:{git_daemon.port}"},
    )


def test_git_transport_changed_then_unchanged(code_repo: Repo, git_values: Path) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    before = _commits(code_repo)
    first = _writeback(git_values, revision, DIGEST_A)
    assert first.exit_code == 0, first.stderr
    assert first.stdout.startswith("changed:") and code_repo.head() in first.stdout
    assert _images(code_repo)[-1]["digest"] == DIGEST_A
    assert code_repo.show(KUSTOMIZATION).startswith("# prod overlay of citation-dagster\n")
    again = _writeback(git_values, revision, DIGEST_A)
    assert again.stdout.startswith("unchanged:")
    assert _commits(code_repo) == before + 1
    assert code_repo.git("diff", "--stat", "main~1", "main").count("|") == 1


def test_git_transport_push_race_is_retried(
    code_repo: Repo, git_values: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    real_push = GitRemote.push
    raced: list[str] = []

    def push_after_a_rival(self: GitRemote, commit: str, expected_tip: str) -> None:
        if not raced:  # someone else pushes between our read and our push, once
            raced.append(code_repo.commit({"README.md": "a rival commit\n"}, "rival"))
        real_push(self, commit, expected_tip)

    monkeypatch.setattr(GitRemote, "push", push_after_a_rival)
    result = _writeback(git_values, revision, DIGEST_A, verbose=True)
    assert result.exit_code == 0, result.stderr
    assert "someone wrote first" in result.stderr
    log = code_repo.git("log", "--format=%s", "-2", "main").splitlines()
    assert log[0].startswith("fabrique: deploy") and log[1] == "rival", (
        "re-applied on top of the rival"
    )
    assert code_repo.show("README.md") == "a rival commit\n"


def test_git_transport_never_rolls_back(code_repo: Repo, git_values: Path) -> None:
    parent = code_repo.commit({"dataops/citation-dagster/app.txt": "A\n"})
    child = code_repo.commit({"dataops/citation-dagster/app.txt": "B\n"})
    args = ["--values", str(git_values), "writeback", "--app", "citation"]
    assert run_cli(*args, "--revision", child, "--digest", DIGEST_B).stdout.startswith("changed:")
    late = run_cli(*args, "--revision", parent, "--digest", DIGEST_A)
    assert late.exit_code == 0, late.stderr
    assert late.stdout.startswith("superseded:")
    assert _images(code_repo)[-1]["digest"] == DIGEST_B


def test_git_transport_concurrent_writers(code_repo: Repo, git_daemon: GitDaemon) -> None:
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    before = _commits(code_repo)
    site = _site_with_apps(
        "http://unused.invalid", 4, transport="git", gitUrl=f"git://127.0.0.1:{git_daemon.port}"
    )
    outcomes = _race(site, revision, None, 4)
    assert [o.state for o in outcomes] == ["changed"] * 4
    pins = {e["name"]: e.get("digest") for e in _images(code_repo)}
    assert pins == {"postgres": None, **{f"image-{i:02d}": f"sha256:{i:064x}" for i in range(4)}}
    assert _commits(code_repo) == before + 4


def test_git_transport_server_down(tmp_path: Path) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{"writeback.transport": "git", "writeback.gitUrl": f"git://127.0.0.1:{closed_port()}"},
    )
    result = _writeback(values, "a" * 40, DIGEST_A)
    assert result.exit_code == 75
    assert "git fetch failed" in result.stderr


def test_stale_write_is_transient() -> None:
    assert StaleWrite("x").exit_code == 75
    assert load_site(env={}).writeback.transport == "gitea"
    assert os.environ.get("FABRIQUE_GITEA_TOKEN") is None


def test_git_transport_keeps_the_token_out_of_argv_and_messages(
    code_repo: Repo, git_values: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess as sp

    token = "git-token-91c4"
    seen: list[list[str]] = []
    real_run = sp.run

    def recording_run(args: Any, *rest: Any, **kwargs: Any) -> Any:
        seen.append([str(a) for a in args])
        return real_run(args, *rest, **kwargs)

    monkeypatch.setattr("fabrique.clients.git.subprocess.run", recording_run)
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    result = _writeback(git_values, revision, DIGEST_A, verbose=True, token=token)
    assert result.exit_code == 0, result.stderr
    assert seen, "git was run"
    assert not [argv for argv in seen if any(token in a for a in argv)]
    assert token not in result.stdout + result.stderr
    assert token not in code_repo.git("log", "--format=%B", "main")


def test_the_double_lists_commits_by_path_as_gitea_does(
    code_repo: Repo, gitea: GiteaDouble
) -> None:
    import httpx

    seed = code_repo.head()
    touching = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    code_repo.commit({"README.md": "elsewhere\n"})
    response = httpx.get(
        f"{gitea.url}/api/v1/repos/atlas/atlas/commits",
        params={"sha": "main", "path": "dataops/citation-dagster", "limit": "1"},
        headers={"Authorization": f"token {GITEA_TOKEN}"},
    )
    assert response.status_code == 200
    # like Gitea, `limit` is ignored with `path`; each commit lists its files
    assert [c["sha"] for c in response.json()] == [touching, seed]
    assert response.json()[0]["files"] == [
        {"filename": "dataops/citation-dagster/app.txt", "status": "modified"}
    ]
    # and the paging headers count pages of `limit` all the same (GetAllCommits)
    assert response.headers["X-PerPage"] == "1"
    assert response.headers["X-PageCount"] == "2"
    assert response.headers["X-HasMore"] == "true"
    since = httpx.get(
        f"{gitea.url}/api/v1/repos/atlas/atlas/commits",
        params={"sha": "main", "path": "dataops/citation-dagster", "not": seed},
        headers={"Authorization": f"token {GITEA_TOKEN}"},
    )
    assert [c["sha"] for c in since.json()] == [touching]


def test_git_transport_lost_race_never_rolls_back(
    code_repo: Repo, git_daemon: GitDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow build of ``old`` loses its push to a rival deploying the newer ``new``, which
    was pushed after this transport fetched the history. The re-read must see ``new`` as
    deployed and refuse, as the Gitea transport does; it used to re-shallow the repository,
    miss ``new`` and write ``old`` over it."""
    site = _site_with_apps("http://unused.invalid", 1, gitUrl=f"git://127.0.0.1:{git_daemon.port}")
    site = site.model_copy(
        update={"writeback": site.writeback.model_copy(update={"transport": "git"})}
    )
    deployed = code_repo.commit({"dataops/citation-dagster/app.txt": "deployed\n"})
    old = code_repo.commit({"dataops/citation-dagster/app.txt": "old\n"})
    real_push = GitRemote.push
    rival: list[str] = []

    def push_after_a_rival(self: GitRemote, commit: str, expected_tip: str) -> None:
        if len(rival) == 1:  # the slow build's push: a newer deploy lands just before
            rival.append(code_repo.commit({"dataops/citation-dagster/app.txt": "new\n"}, "new"))
            with open_transport(site, None) as other:
                assert write_back(site, other, "app-00", rival[1], DIGEST_B).state == "changed"
        real_push(self, commit, expected_tip)

    monkeypatch.setattr(GitRemote, "push", push_after_a_rival)
    with open_transport(site, None) as transport:
        assert write_back(site, transport, "app-00", deployed, DIGEST_A).state == "changed"
        rival.append("armed")
        outcome = write_back(site, transport, "app-00", old, DIGEST_A)
    assert len(rival) == 2, "the race happened"
    assert outcome.state == "superseded", outcome
    assert f"deployed revision {rival[1]} is not an ancestor of {old}" in outcome.detail
    entry = next(e for e in _images(code_repo) if e["name"] == "image-00")
    assert entry["newTag"] == rival[1][:12] and entry["digest"] == DIGEST_B


def test_git_transport_writes_back_in_a_sha256_repository(
    tmp_path: Path, repos_root: Path, git_daemon: GitDaemon
) -> None:
    """The tag stays the sha12; the guard resolves it in the SHA-256 history."""
    repo = Repo(repos_root, "atlas/atlas256", object_format="sha256")
    first = repo.commit(
        {"dataops/citation-dagster/app.txt": "1\n", KUSTOMIZATION: SEED_KUSTOMIZATION}
    )
    second = repo.commit({"dataops/citation-dagster/app.txt": "2\n"})
    values = write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.codeRepo": "atlas/atlas256",
            "writeback.transport": "git",
            "writeback.gitUrl": f"git://127.0.0.1:{git_daemon.port}",
            "apps": [
                {
                    "name": "citation",
                    "image": "citation-dagster",
                    "context": "dataops/citation-dagster",
                    "writeback": {"repo": "atlas/atlas256", "path": KUSTOMIZATION},
                }
            ],
        },
    )
    assert len(second) == 64
    assert _writeback(values, second, DIGEST_B).stdout.startswith("changed:")
    assert _images(repo)[-1]["newTag"] == second[:12]
    late = _writeback(values, first, DIGEST_A)
    assert late.exit_code == 0, late.stderr
    assert late.stdout.startswith(f"superseded: citation deployed revision {second}")


@pytest.mark.parametrize("transport", ["gitea", "git"])
def test_a_lost_race_in_another_repository_never_rolls_back(
    gitea: GiteaDouble,
    code_repo: Repo,
    apps_repo: Repo,
    git_daemon: GitDaemon,
    transport: str,
) -> None:
    """The safety net's pass asked the code repository's head at its start (its want),
    and writes an Application in `cluster/apps`. A newer push's write-back lands there
    first: the net's write loses, it re-reads the newer deploy, and the head it compares
    with must be the code repository's head now, not the one its pass remembered."""
    from fabrique.decisions.survey import PassTransport

    site = parse_site(
        merge(
            default_values(),
            {
                "gitea": {"url": gitea.url},
                "network": {"backoffSeconds": 0.01},
                "writeback": {
                    "transport": transport,
                    "gitUrl": f"git://127.0.0.1:{git_daemon.port}",
                },
                "apps": [APPLICATION_APP],
            },
        )
    )
    token = GITEA_TOKEN if transport == "gitea" else None
    deployed = code_repo.commit({"dataops/citation-dagster/app.txt": "v1\n"})
    with open_transport(site, token) as first:
        assert write_back(site, first, "citation", deployed, DIGEST_A).state == "changed"
    want = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    with open_transport(site, token) as inner:
        net = PassTransport(inner)
        assert net.head("atlas/atlas", "main") == want  # the survey's question
        net.read("cluster/apps", "main", APPLICATION)  # and its read of the target
        newer = code_repo.commit({"dataops/citation-dagster/app.txt": "v3\n"})
        with open_transport(site, token) as sensor:
            assert write_back(site, sensor, "citation", newer, DIGEST_B).state == "changed"
        outcome = write_back(site, net, "citation", want, DIGEST_A)
    assert outcome.state == "superseded", outcome
    app = yaml.safe_load(apps_repo.show(APPLICATION))
    assert app["spec"]["sources"][1]["kustomize"]["images"] == [
        f"citation-dagster=registry:80/citation-dagster:{newer[:12]}@{DIGEST_B}"
    ]


@pytest.mark.parametrize("transport", ["gitea", "git"])
def test_a_merge_both_sides_of_which_touched_the_app_is_its_last_change(
    gitea: GiteaDouble, code_repo: Repo, git_daemon: GitDaemon, transport: str
) -> None:
    """Gitea lists a merge's files against its first parent (GetCommitFileStatus: `git log
    --name-status -m --first-parent`), so the merge is the newest commit that changed the
    app; a listing without the merge's files picked an older one."""
    merge = code_repo.merge(
        {"dataops/citation-dagster/app.txt": "ours\n"},
        {"dataops/citation-dagster/other.txt": "theirs\n"},
    )
    site = _site_with_apps(
        gitea.url, 1, transport=transport, gitUrl=f"git://127.0.0.1:{git_daemon.port}"
    )
    with open_transport(site, GITEA_TOKEN if transport == "gitea" else None) as opened:
        found = opened.last_change("atlas/atlas", "main", "dataops/citation-dagster", frozenset())
    assert found == merge


def test_git_transport_a_push_the_server_declines_is_no_race(
    code_repo: Repo, git_values: Path
) -> None:
    """A pre-receive hook (a protected branch) declines the push: that is the server's
    answer, not a lost race. It exits 3 with the server's words, at once, instead of
    re-reading and retrying into exit 75."""
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    head = code_repo.head()
    hook = code_repo.bare / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'main is protected: merge a pull request' >&2\nexit 1\n")
    hook.chmod(0o755)
    result = _writeback(git_values, revision, DIGEST_A)
    assert result.exit_code == 3, result.stdout + result.stderr
    assert "main is protected: merge a pull request" in result.stderr
    assert "pre-receive hook declined" in result.stderr
    assert "losing the write race" not in result.stderr
    assert code_repo.head() == head


def test_git_transport_a_target_that_is_not_utf8_fails_with_its_name(
    code_repo: Repo, git_values: Path
) -> None:
    """A target file in another encoding is no target fabrique can edit: one line naming
    it, exit 3, no traceback (the Gitea transport says the same)."""
    work = code_repo.work
    (work / KUSTOMIZATION).parent.mkdir(parents=True, exist_ok=True)
    code_repo.commit({"README.md": "before\n"})
    (work / KUSTOMIZATION).write_bytes("# déployé\nimages: []\n".encode("latin-1"))
    code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    revision = code_repo.head()
    result = _writeback(git_values, revision, DIGEST_A)
    assert result.exit_code == 3, result.stdout + result.stderr
    assert f"{KUSTOMIZATION} is not UTF-8 text" in result.stderr
    assert "Traceback" not in result.stderr
