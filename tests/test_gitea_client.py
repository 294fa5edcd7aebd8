"""fabrique's write-back against the Gitea double where only the double can stage what
Gitea does: a protected branch or path, a push racing Gitea's own, a small
DEFAULT_MAX_BLOB_SIZE; and a hook edit, as Gitea's editHook makes it. What both servers
can show is held in ``tests/test_gitea_contract.py``, against the double and a real
Gitea."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest
from click.testing import Result

from fabrique.clients.gitea import FILES_PAGE, FileContent, GiteaClient

from .conftest import GITEA_TOKEN, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble

CONTEXT = "dataops/citation-dagster"


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


@pytest.mark.parametrize("answer", ["out-of-date", "lock"])
def test_a_write_racing_gitea_s_own_push_is_read_again_until_it_lands(
    code_repo: Repo, gitea: GiteaDouble, tmp_path: Path, answer: str
) -> None:
    """Gitea's push of its commit lost the branch to another: a 500 (ErrPushOutOfDate),
    or a 403 whose message is the ref lock's (ErrPushRejected), which is no refused
    token: both are read again and retried."""
    gitea.push_race_answer = answer
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


def test_a_fork_s_pull_request_of_the_same_branch_name_is_not_fabrique_s() -> None:
    """Once one pull request merged, the open one is found by listing: a fork's branch of
    the same name, into the same base, is someone else's proposal, never fabrique's."""

    def pull(number: int, owner: str) -> dict[str, object]:
        return {
            "number": number,
            "html_url": f"http://gitea/atlas/apps/pulls/{number}",
            "state": "open" if number > 1 else "closed",
            "head": {"ref": "fabrique/citation", "sha": "a" * 40,
                     "repo": {"full_name": f"{owner}/apps"}},
            "base": {"ref": "main"},
        }  # fmt: skip

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.raw_path.endswith(b"/pulls/main/fabrique%2Fcitation"):
            return httpx.Response(200, json=pull(1, "atlas"))  # an earlier one, merged
        assert request.url.path.endswith("/pulls"), request.url
        return httpx.Response(200, json=[pull(2, "mallory")], headers={"X-Total-Count": "1"})

    with GiteaClient("http://gitea", "t", transport=httpx.MockTransport(answer)) as client:
        assert client.open_pull("atlas/apps", "main", "fabrique/citation") is None


# ------------------------------------------------------------------ file-contents paging


def _entry(path: str) -> dict[str, object]:
    """A file's ContentsResponse, as far as fabrique reads it: its text is its path."""
    content = base64.b64encode(path.encode()).decode()
    return {"type": "file", "path": path, "sha": "b" * 40, "encoding": "base64",
            "content": content, "size": len(path)}  # fmt: skip


def _paged(most: int, asked: list[list[str]]) -> httpx.MockTransport:
    """Gitea's file-contents answering at most ``most`` entries, recording what is asked."""

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/repos/atlas/apps/file-contents", request.url
        assert request.url.params["ref"] == "main"
        paths = json.loads(request.content)["files"]
        asked.append(paths)
        return httpx.Response(200, json=[_entry(path) for path in paths[:most]])

    return httpx.MockTransport(answer)


def test_more_files_than_gitea_lists_at_once_are_asked_for_in_pages() -> None:
    paths = [f"apps/{n}.yaml" for n in range(35)]
    asked: list[list[str]] = []
    with GiteaClient("http://gitea", "t", transport=_paged(FILES_PAGE, asked)) as client:
        found = client.get_files("atlas/apps", [*paths, *paths[:3]], "main")
    assert asked == [paths[:30], paths[30:]], "each path asked once, 30 at a time"
    assert found == {path: FileContent(path, path, "b" * 40) for path in paths}


def test_files_gitea_cut_from_a_large_answer_are_asked_for_again() -> None:
    """GetContentsListFromTreePaths stops before the file that takes the answer past
    [api] DEFAULT_MAX_RESPONSE_SIZE: fewer entries than asked, the rest asked again."""
    paths = [f"apps/{n}.yaml" for n in range(35)]
    asked: list[list[str]] = []
    with GiteaClient("http://gitea", "t", transport=_paged(12, asked)) as client:
        found = client.get_files("atlas/apps", paths, "main")
    assert asked == [paths[:30], paths[12:35], paths[24:35]]
    assert list(found) == paths and None not in found.values()


def test_the_double_cuts_a_large_answer_as_gitea_does(code_repo: Repo, gitea: GiteaDouble) -> None:
    files = {f"deploy/{n}.yaml": f"file {n}\n" for n in range(3)}
    code_repo.commit(files)
    gitea.max_response_size = 30  # room for two of the files' base64 (12 bytes each)
    with GiteaClient(gitea.url, GITEA_TOKEN) as client:
        found = client.get_files("atlas/atlas", [*files, "deploy/gone.yaml"], "main")
    assert {path: read.text if read else None for path, read in found.items()} == {
        **files,
        "deploy/gone.yaml": None,
    }
    batches = [r for r in gitea.requests if r.path.endswith("/file-contents")]
    assert [len(r.json()["files"]) for r in batches] == [4, 2]
