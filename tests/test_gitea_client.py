"""The Gitea client against the double, where the double answers as Gitea's source does:
listings by path (404 when no commit matches, pages of 50, the paging headers), and the
answers of the Contents API that are not a stale sha."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import Result

from fabrique.clients.gitea import GiteaClient, Identity
from fabrique.site.errors import GiteaError
from fabrique.site.names import REVISION_RE
from fabrique.site.retry import RetryPolicy

from .conftest import GITEA_TOKEN, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble

CONTEXT = "dataops/citation-dagster"


@pytest.fixture()
def client(gitea: GiteaDouble) -> Iterator[GiteaClient]:
    retry = RetryPolicy(attempts=2, base_delay=0.01)
    with GiteaClient(gitea.url, GITEA_TOKEN, retry=retry) as opened:
        yield opened


def _list(gitea: GiteaDouble, **params: str) -> httpx.Response:
    return httpx.get(
        f"{gitea.url}/api/v1/repos/atlas/atlas/commits",
        params=params,
        headers={"Authorization": f"token {GITEA_TOKEN}"},
    )


def test_a_listing_by_path_that_matches_no_commit_is_a_404(
    code_repo: Repo, gitea: GiteaDouble
) -> None:
    head = code_repo.head()
    assert _list(gitea, sha="main", path="nowhere").status_code == 404
    assert _list(gitea, sha="main", path=CONTEXT, **{"not": head}).status_code == 404
    assert _list(gitea, sha="main", path=CONTEXT).status_code == 200


def test_no_commit_touching_the_path_is_no_change_not_an_error(
    code_repo: Repo, gitea: GiteaDouble, client: GiteaClient
) -> None:
    deployed = code_repo.head()
    elsewhere = code_repo.commit({"README.md": "elsewhere\n"})
    assert client.files_changed("atlas/atlas", deployed, elsewhere, CONTEXT) == []
    assert client.last_change("atlas/atlas", "main", "nowhere", frozenset()) is None
    assert client.last_change("atlas/atlas", "main", CONTEXT, frozenset()) == deployed


def test_a_missing_start_is_still_an_error(code_repo: Repo, client: GiteaClient) -> None:
    # with `path`, Gitea hands the revision to git, which fails: a 500, not "no change"
    with pytest.raises(GiteaError, match="HTTP 500"):
        client.files_changed("atlas/atlas", code_repo.head(), "f" * 40, CONTEXT)
    with pytest.raises(GiteaError, match="HTTP 500"):
        client.last_change("atlas/atlas", "gone", CONTEXT, frozenset())


def test_commits_by_path_come_in_pages_of_50_with_gitea_s_headers(
    code_repo: Repo, gitea: GiteaDouble, client: GiteaClient
) -> None:
    first = code_repo.head()
    made = [code_repo.commit({f"{CONTEXT}/app.txt": f"v{n}\n"}) for n in range(60)]
    page = _list(gitea, sha="main", path=CONTEXT, limit="50")
    assert len(page.json()) == 50
    assert page.headers["X-Total-Count"] == "61"
    assert (page.headers["X-Page"], page.headers["X-PerPage"]) == ("1", "50")
    assert (page.headers["X-PageCount"], page.headers["X-HasMore"]) == ("2", "true")
    assert 'rel="next"' in page.headers["Link"] and "page=2" in page.headers["Link"]
    last = _list(gitea, sha="main", path=CONTEXT, limit="50", page="2")
    assert len(last.json()) == 11 and last.headers["X-HasMore"] == "false"
    assert 'rel="prev"' in last.headers["Link"]
    listed = [sha for sha, _ in client.commits_touching("atlas/atlas", CONTEXT, start="main")]
    assert listed == [*reversed(made), first], "every page read, newest first"


# ------------------------------------------------------------------ Contents API writes

DIGEST = "sha256:" + "c" * 64


def _writeback(gitea: GiteaDouble, revision: str, tmp_path: Path, **env: str) -> Result:
    values = write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url})
    return run_cli(
        *("--values", str(values), "writeback", "--app", "citation"),
        *("--revision", revision, "--digest", DIGEST),
        env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN, **env},
    )


def _writes(gitea: GiteaDouble) -> int:
    return sum(1 for r in gitea.requests if r.method in ("PUT", "POST") and "/contents/" in r.path)


def test_a_path_gitea_cannot_write_fails_at_once_with_its_reason(
    code_repo: Repo, gitea: GiteaDouble, tmp_path: Path
) -> None:
    revision = code_repo.commit({f"{CONTEXT}/app.txt": "v2\n"})
    result = _writeback(
        gitea,
        revision,
        tmp_path,
        FABRIQUE_APPS__0__WRITEBACK__PATH="README.md/kustomization.yaml",
        FABRIQUE_APPS__0__WRITEBACK__CREATE="true",
    )
    assert result.exit_code == 2, result.output
    assert "Gitea refused the write (HTTP 422): a file exists where you" in result.stderr
    assert "[path: README.md]" in result.stderr
    assert _writes(gitea) == 1, "an invalid path is not a lost race: no retry"
    assert code_repo.head() == revision


def test_a_protected_branch_or_path_is_named_not_blamed_on_the_token(
    code_repo: Repo, gitea: GiteaDouble, tmp_path: Path
) -> None:
    revision = code_repo.commit({f"{CONTEXT}/app.txt": "v2\n"})
    gitea.protect("atlas/atlas", "main")
    whole = _writeback(gitea, revision, tmp_path)
    assert whole.exit_code == 3, whole.output
    assert "branch protection refused the write" in whole.stderr
    assert "user should have a permission to write to the target branch" in whole.stderr
    assert "refused the token" not in whole.stderr
    gitea.protect("atlas/atlas", "main", files="dataops/*/deploy/**")
    path = _writeback(gitea, revision, tmp_path)
    assert path.exit_code == 3, path.output
    assert "branch protection refused the write (path is protected" in path.stderr
    assert code_repo.head() == revision, "nothing written"


def test_a_write_racing_gitea_s_own_push_is_read_again_until_it_lands(
    code_repo: Repo, gitea: GiteaDouble, tmp_path: Path
) -> None:
    revision = code_repo.commit({f"{CONTEXT}/app.txt": "v2\n"})
    rivals = iter(range(6))  # more than the HTTP retries of one request

    def rival(repo: str, branch: str) -> None:
        number = next(rivals, None)
        if number is not None:  # another file of the branch moves under Gitea's push
            code_repo.commit({"README.md": f"rival {number}\n"}, f"rival {number}")

    gitea.before_push = rival
    result = _writeback(gitea, revision, tmp_path)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("changed:")
    assert gitea.push_races == 6
    log = code_repo.git("log", "--format=%s", "-8", "main").splitlines()
    assert log[0].startswith("fabrique: deploy") and log[1:7] == [
        f"rival {n}" for n in reversed(range(6))
    ], "every rival's commit kept, ours on top"


def test_a_target_above_gitea_s_max_blob_size_is_refused_by_name(
    code_repo: Repo, gitea: GiteaDouble, tmp_path: Path
) -> None:
    revision = code_repo.commit({f"{CONTEXT}/app.txt": "v2\n"})
    gitea.max_blob_size = 64
    result = _writeback(gitea, revision, tmp_path)
    assert result.exit_code == 2, result.output
    assert "more than Gitea sends through the Contents API" in result.stderr
    assert code_repo.head() == revision


def test_editing_a_hook_resets_what_the_patch_omits(gitea: GiteaDouble) -> None:
    auth = {"Authorization": f"token {GITEA_TOKEN}"}
    hooks = f"{gitea.url}/api/v1/repos/atlas/atlas/hooks"
    created = httpx.post(
        hooks,
        json={
            "type": "gitea",
            "config": {"url": "http://es:12000/push", "content_type": "json"},
            "events": ["push", "create"],
            "branch_filter": "main",
            "authorization_header": "Bearer t",
            "active": True,
        },
        headers=auth,
    ).json()
    edited = httpx.patch(f"{hooks}/{created['id']}", json={"active": False}, headers=auth).json()
    assert (edited["events"], edited["branch_filter"], edited["authorization_header"]) == (
        ["push"],
        "",
        "",
    )
    assert edited["active"] is False and edited["config"]["url"] == "http://es:12000/push"


def _orphan(code_repo: Repo, text: str) -> str:
    """A commit sharing no history with main (an orphan branch, a rewritten history),
    pushed to the server under refs/heads/orphan."""
    tree = code_repo.git("mktree", input_text=f"100644 blob {_blob(code_repo, text)}\tREADME.md\n")
    sha = code_repo.git("commit-tree", tree.strip(), "-m", "orphan").strip()
    code_repo.git("update-ref", "refs/heads/orphan", sha)
    return sha


def _blob(code_repo: Repo, text: str) -> str:
    return code_repo.git("hash-object", "-w", "--stdin", input_text=text).strip()


def test_compare_of_unrelated_histories_answers_as_gitea_does(
    code_repo: Repo, gitea: GiteaDouble
) -> None:
    """GetCompareInfo: when `git merge-base` fails, no commit is listed and the answer is
    still 200, so `total_commits: 0` does not say the head is in the base."""
    orphan = _orphan(code_repo, "another history\n")
    answer = httpx.get(
        f"{gitea.url}/api/v1/repos/atlas/atlas/compare/{code_repo.head()}...{orphan}",
        headers={"Authorization": f"token {GITEA_TOKEN}"},
    )
    assert answer.status_code == 200
    assert answer.json()["total_commits"] == 0


def test_ancestry_fails_closed_on_unrelated_histories(code_repo: Repo, client: GiteaClient) -> None:
    """After an orphan or rewritten force-push, the deployed commit is no ancestor of the
    new one: the never-roll-back guard must not take a compare of 0 commits for one."""
    head = code_repo.head()
    orphan = _orphan(code_repo, "another history\n")
    assert client.is_ancestor("atlas/atlas", orphan, head) is False
    assert client.is_ancestor("atlas/atlas", head, orphan) is False
    older = code_repo.head()
    newer = code_repo.commit({"README.md": "next\n"})
    assert client.is_ancestor("atlas/atlas", older, newer) is True
    assert client.is_ancestor("atlas/atlas", newer, older) is False
    assert client.is_ancestor("atlas/atlas", newer, newer) is True


def test_a_file_deleted_since_it_was_read_is_a_stale_write(
    code_repo: Repo, client: GiteaClient
) -> None:
    """Gitea answers 404 to the update of a file that is gone: the write is stale (a
    re-read decides), not a missing branch."""
    from fabrique.clients.gitea import Identity
    from fabrique.site.errors import StaleWrite

    code_repo.commit({"deploy/k.yaml": "images: []\n"})
    current = client.get_file("atlas/atlas", "deploy/k.yaml", "main")
    assert current is not None
    (code_repo.work / "deploy/k.yaml").unlink()
    code_repo.commit({}, "deleted meanwhile")
    with pytest.raises(StaleWrite, match="gone since it was read"):
        client.update_file(
            "atlas/atlas", "main", current, "images: [x]\n", "m", Identity("fabrique", "f@x")
        )


@pytest.mark.parametrize(
    ("path", "kind"), [("dataops/citation-dagster", "directory"), ("link.yaml", "symlink")]
)
def test_a_target_that_is_no_file_is_named_as_gitea_shows_it(
    code_repo: Repo, client: GiteaClient, path: str, kind: str
) -> None:
    """Gitea answers a directory with 200 and a list, a symlink with 200 and `type:
    symlink`: neither is a target fabrique can edit, and neither is a missing file."""
    import os

    from fabrique.site.errors import TargetError

    os.symlink("README.md", code_repo.work / "link.yaml")
    code_repo.commit({}, "a symlink")
    with pytest.raises(TargetError, match=f"is a {kind}, not a file"):
        client.get_file("atlas/atlas", path, "main")


def test_a_bearer_token_is_a_token_as_gitea_reads_it(gitea: GiteaDouble) -> None:
    for scheme in ("token", "Bearer", "bearer"):
        answer = httpx.get(
            f"{gitea.url}/api/v1/repos/atlas/atlas/branches/main",
            headers={"Authorization": f"{scheme} {GITEA_TOKEN}"},
        )
        assert answer.status_code == 200, scheme
    answer = httpx.get(
        f"{gitea.url}/api/v1/repos/atlas/atlas/branches/main",
        headers={"Authorization": f"Basic {GITEA_TOKEN}"},
    )
    assert answer.status_code == 404, "no token: anonymous, and the repository is private"


def test_a_token_without_the_scope_is_named_with_the_scope_it_lacks(
    gitea: GiteaDouble, client: GiteaClient
) -> None:
    gitea.scopes = {"read:repository", "read:user"}
    assert REVISION_RE.fullmatch(client.branch_head("atlas/atlas", "main"))
    with pytest.raises(GiteaError) as caught:
        client.create_file("cluster/apps", "new.yaml", "main", "a: 1\n", "m", Identity("f", "f@x"))
    assert "lacks the scope write:repository" in str(caught.value)
    assert "read:repository,read:user" in str(caught.value)
    assert GITEA_TOKEN not in str(caught.value)


def test_a_private_repository_the_token_cannot_see_is_a_404_that_says_so(
    gitea: GiteaDouble, client: GiteaClient
) -> None:
    gitea.hidden = {"atlas/atlas"}
    with pytest.raises(GiteaError, match="private repository that the token's user may not"):
        client.branch_head("atlas/atlas", "main")
