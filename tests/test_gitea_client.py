"""The Gitea client against the double, where the double answers as Gitea's source does:
listings by path (404 when no commit matches, pages of 50, the paging headers), and the
answers of the Contents API that are not a stale sha."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from fabrique.clients.gitea import GiteaClient
from fabrique.site.errors import GiteaError
from fabrique.site.retry import RetryPolicy

from .conftest import GITEA_TOKEN, Repo
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
