"""Past fifty apps on one commit, the safety net still finds each app's status: Gitea
answers the combined status fifty contexts a page, the most recently updated first.

Against the Gitea double (which pages as Gitea does) and the Kubernetes API double, with
`fabrique reconcile` run in-process.
"""

from __future__ import annotations

from pathlib import Path

from fabrique.clients.gitea import CommitStatus, GiteaClient

from .conftest import GITEA_TOKEN, Repo
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .test_reconcile import _phase, _reconcile, env, values  # noqa: F401
from .test_status_repair import CONTEXT, REPO, _history


def test_an_older_commits_pending_status_past_fifty_apps_is_closed(
    code_repo: Repo,
    values: Path,  # noqa: F811
    env: dict[str, str],  # noqa: F811
    kube: KubeApiDouble,
    gitea: GiteaDouble,
) -> None:
    """One push built sixty apps before this one and sixty after: its `pending` is on no
    first page of the commit's statuses. Its build was terminated (no report), and a newer commit is
    now wanted: the net closes that `pending`, as it does on a commit of fewer apps."""
    old = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    with GiteaClient(gitea.url, GITEA_TOKEN) as client:
        for n in range(120):  # sixty apps reported before this one, sixty after
            if n == 60:
                client.create_status(REPO, old, CommitStatus(CONTEXT, "pending", "building"))
            other = CommitStatus(f"fabrique/app-{n:03d}", "pending", "building")
            client.create_status(REPO, old, other)
    _phase(kube, old, "Failed", failed_step="build", message="Stopped with strategy 'Terminate'")
    code_repo.commit({"dataops/citation-dagster/app.txt": "v3\n"})
    result = _reconcile(values, env)
    assert result.exit_code == 0, result.stderr
    assert _history(gitea, old) == [
        ("pending", "building"),
        ("error", "safety net: build: Stopped with strategy 'Terminate'"),
    ]
