"""``fabrique plan-push``: the builds one push asks for, from what Gitea lists of it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fabrique.clients.gitea import Commit
from fabrique.decisions.push import apps_under, touched
from fabrique.site.config import default_values, merge, parse_site

from .conftest import KUSTOMIZATION, CodeRepo, run_cli, unreachable_kubeconfig, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble

NS = "fabrique-build"
ZEROS = "0" * 40
OTHER = {
    "name": "other",
    "image": "other",
    "context": "dataops/other-app",
    "writeback": {"repo": "cluster/apps", "path": "apps/other/kustomization.yaml"},
}


@pytest.fixture()
def env(tmp_path: Path, gitea: GiteaDouble, kube: KubeApiDouble) -> dict[str, str]:
    values = write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url})
    text = values.read_text() + "apps:\n"
    site = default_values()
    for app in (site["apps"][0], OTHER):
        text += "  - " + repr(app).replace("'", '"') + "\n"
    values.write_text(text)
    return {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": gitea.token or "",
        "FABRIQUE_VALUES": str(values),
    }


def plan(env: dict[str, str], before: str, after: str, *more: str) -> tuple[int, str, str]:
    result = run_cli("plan-push", "--before", before, "--after", after, *more, env=env)
    return result.exit_code, result.stdout, result.stderr


def built(kube: KubeApiDouble) -> dict[str, str]:
    """The builds asked for: app -> who asked."""
    return {
        body["spec"]["arguments"]["parameters"][0]["value"]: body["metadata"]["labels"][
            "fabrique.io/submitted-by"
        ]
        for (ns, _), body in kube.objects.items()
        if ns == NS
    }


def test_a_push_touching_one_app_asks_for_its_build_alone(
    env: dict[str, str], code_repo: CodeRepo, kube: KubeApiDouble
) -> None:
    before = code_repo.head()
    after = code_repo.commit({"dataops/citation-dagster/app.txt": "new\n"})
    code, out, err = plan(env, before, after)
    assert code == 0, err
    assert built(kube) == {"citation": "push"}
    assert f"citation: created: workflow {NS}/fabrique-citation-{after[:12]}" in out
    assert out.splitlines()[-1] == "1 of 2 app(s): 1 commit(s) pushed, 1 file(s) changed"


def test_a_redelivered_push_finds_its_build_and_is_done(
    env: dict[str, str], code_repo: CodeRepo, kube: KubeApiDouble
) -> None:
    before = code_repo.head()
    after = code_repo.commit({"dataops/citation-dagster/app.txt": "new\n"})
    assert plan(env, before, after)[0] == 0
    code, out, err = plan(env, before, after)
    assert code == 0, err
    assert f"citation: already exists: workflow {NS}/fabrique-citation-{after[:12]}" in out
    assert len(kube.objects) == 1


@pytest.mark.parametrize(
    "files",
    [
        pytest.param({KUSTOMIZATION: "images: []\n"}, id="fabrique's own write-back"),
        pytest.param({"docs/notes.md": "x\n"}, id="beside every app"),
        pytest.param({"dataops/citation-dagster-old/x": "x\n"}, id="a sibling named alike"),
    ],
)
def test_a_push_touching_no_app_asks_for_nothing(
    env: dict[str, str], code_repo: CodeRepo, kube: KubeApiDouble, files: dict[str, str]
) -> None:
    before = code_repo.head()
    after = code_repo.commit(files)
    code, out, err = plan(env, before, after)
    assert code == 0, err
    assert kube.objects == {}
    assert out.splitlines() == ["0 of 2 app(s): 1 commit(s) pushed, 1 file(s) changed"]


def test_every_listed_commit_counts_not_only_five(
    env: dict[str, str], code_repo: CodeRepo, kube: KubeApiDouble
) -> None:
    """Gitea's payload lists five commits at most; the listing has them all."""
    before = code_repo.head()
    code_repo.commit({"dataops/other-app/a": "1\n"})
    for n in range(6):
        after = code_repo.commit({"docs/notes.md": f"{n}\n"})
    assert plan(env, before, after)[0] == 0
    assert built(kube) == {"other": "push"}


def test_gitea_s_test_delivery_asks_nothing_of_gitea(
    env: dict[str, str], code_repo: CodeRepo, gitea: GiteaDouble, kube: KubeApiDouble
) -> None:
    head = code_repo.head()
    code, out, _ = plan(env, head, head)
    assert code == 0
    assert kube.objects == {} and gitea.requests == []
    assert "nothing was pushed" in out


def test_a_new_branch_asks_for_every_app(
    env: dict[str, str], code_repo: CodeRepo, kube: KubeApiDouble
) -> None:
    code, out, _ = plan(env, ZEROS, code_repo.head())
    assert code == 0
    assert built(kube) == {"citation": "push", "other": "push"}
    assert "a new branch" in out


def _reset(code_repo: CodeRepo, to: str) -> None:
    subprocess.run(
        ["git", "-C", str(code_repo.bare), "update-ref", "refs/heads/main", to], check=True
    )


def test_a_reset_asks_for_the_apps_its_dropped_commits_changed(
    env: dict[str, str], code_repo: CodeRepo, kube: KubeApiDouble
) -> None:
    older = code_repo.head()
    newer = code_repo.commit({"dataops/other-app/a": "1\n"})
    _reset(code_repo, older)
    assert plan(env, newer, older)[0] == 0
    assert built(kube) == {"other": "push"}


def test_a_forced_push_asks_for_what_it_dropped_and_what_it_brought(
    env: dict[str, str], code_repo: CodeRepo, kube: KubeApiDouble
) -> None:
    base = code_repo.head()
    dropped = code_repo.commit({"dataops/other-app/a": "1\n"})
    _reset(code_repo, base)
    subprocess.run(["git", "-C", str(code_repo.work), "reset", "-q", "--hard", base], check=True)
    brought = code_repo.commit({"dataops/citation-dagster/app.txt": "2\n"})
    assert plan(env, dropped, brought)[0] == 0
    assert built(kube) == {"citation": "push", "other": "push"}


def test_a_push_too_long_to_list_asks_for_every_app() -> None:
    class Endless:
        def commits_since(self, *args: object, **kwargs: object) -> list[Commit] | None:
            return None

    site = parse_site(merge(default_values(), {"apps": [*default_values()["apps"], OTHER]}))
    found = touched(site, Endless(), "1" * 40, "2" * 40)
    assert found.apps == ("citation", "other")
    assert "more than 1000 commits" in found.reason


def test_contexts_are_matched_by_folder_whatever_their_number() -> None:
    apps = [
        {**OTHER, "name": n, "image": n, "context": c}
        for n, c in (("a", "apps/a"), ("ab", "apps/ab"), ("nested", "apps/a/inner"))
    ]
    site = parse_site(merge(default_values(), {"apps": apps}))
    assert [a.name for a in apps_under(site, ["apps/a/inner/x"])] == ["a", "nested"]
    assert [a.name for a in apps_under(site, ["apps/ab/x", "apps/a"])] == ["ab"]
    assert apps_under(site, ["apps/abc/x", "apps"]) == []


@pytest.mark.parametrize(
    ("before", "after", "said"),
    [
        ("main", "a" * 40, "--before 'main': not a commit id"),
        ("a" * 40, "A" * 40, "--after 'AAAA"),
        ("a" * 40, "0" * 40, "--after '0000"),
    ],
)
def test_what_the_sensor_passed_is_checked_first(
    env: dict[str, str], gitea: GiteaDouble, before: str, after: str, said: str
) -> None:
    code, _, err = plan(env, before, after)
    assert code == 2
    assert err.startswith("error: ") and said in err and len(err.splitlines()) == 1
    assert gitea.requests == []


def test_an_api_server_away_is_worth_a_retry(
    env: dict[str, str], code_repo: CodeRepo, tmp_path: Path
) -> None:
    before = code_repo.head()
    after = code_repo.commit({"dataops/citation-dagster/app.txt": "new\n"})
    away = {**env, "KUBECONFIG": str(unreachable_kubeconfig(tmp_path / "away"))}
    code, out, err = plan(away, before, after)
    assert code == 75, err
    assert "citation: failed" in out
    assert "transient, worth retrying" in err


@pytest.mark.parametrize("caller", ["reconciler", "cli"])
def test_a_push_whose_build_another_caller_made_finds_it_as_it_is(
    env: dict[str, str], code_repo: CodeRepo, kube: KubeApiDouble, caller: str
) -> None:
    """The safety net or a person (``submit --force`` too) made the commit's build before
    its push was planned (a late delivery, a replay): the step finds it, changes
    nothing in it (its ``force`` stays), and succeeds at once."""
    from fabrique.decisions.workflow import build_workflow
    from fabrique.site.config import load_site

    before = code_repo.head()
    after = code_repo.commit({"dataops/citation-dagster/app.txt": "new\n"})
    made = build_workflow(load_site(env={}), "citation", after, submitted_by=caller, force=True)
    kube.objects[(NS, made["metadata"]["name"])] = made
    code, out, err = plan(env, before, after)
    assert code == 0, err
    assert f"citation: already exists: workflow {NS}/fabrique-citation-{after[:12]}" in out
    assert kube.objects[(NS, made["metadata"]["name"])] == made
