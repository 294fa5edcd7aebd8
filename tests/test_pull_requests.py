"""`writeback.mode: pull-request` on the Gitea double: what a replay, a dry run, a person
who closes the pull request, a hold and the safety net do to the proposal. The contract
suite (tests/test_gitea_contract.py) holds the double's pull requests to a real Gitea."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fabrique.decisions.holds import Hold, apply_hold
from fabrique.decisions.review import review_branch
from fabrique.site.config import default_values, load_site

from .conftest import GITEA_TOKEN, KUSTOMIZATION, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .oci import push_image
from .servers import Registry
from .test_reconcile import _line, _phase, _reconcile

REPO = "atlas/atlas"
HEAD = "fabrique/citation"
APP_FILE = "dataops/citation-dagster/app.txt"


@pytest.fixture()
def env(tmp_path: Path, kube: KubeApiDouble) -> dict[str, str]:
    return {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }


def _values(tmp_path: Path, gitea: GiteaDouble, registry: Registry, **more: Any) -> Path:
    settings = {"gitea.url": gitea.url, "registry.host": registry.host}
    return write_values(
        tmp_path / "site.yaml", **settings, **{"writeback.mode": "pull-request"}, **more
    )


def _fab(values: Path, env: dict[str, str], *args: str) -> Any:
    result = run_cli("--values", str(values), *args, env=env)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.stdout


def _writeback(values: Path, env: dict[str, str], revision: str, digest: str, *more: str) -> str:
    return str(
        _fab(
            values,
            env,
            *("writeback", "--app", "citation", "--revision", revision, "--digest", digest),
            *more,
        )
    )


def _api(gitea: GiteaDouble) -> httpx.Client:
    return httpx.Client(
        base_url=f"{gitea.url}/api/v1", headers={"Authorization": f"token {GITEA_TOKEN}"}
    )


def _built(code_repo: Repo, registry: Registry, content: str = "v2\n") -> tuple[str, str]:
    """A commit of the app, and the digest of the image pushed for it."""
    revision = code_repo.commit({APP_FILE: content})
    return revision, push_image(registry.url, "citation-dagster", revision[:12])


def _close(gitea: GiteaDouble, number: int) -> None:
    """A person closes pull request ``number`` unmerged."""
    with _api(gitea) as api:
        closed = api.patch(f"/repos/{REPO}/pulls/{number}", json={"state": "closed"})
    assert closed.status_code == 201, closed.text


def test_a_replay_is_in_review_whatever_name_the_target_gives_the_image(
    code_repo: Repo, tmp_path: Path, gitea: GiteaDouble, registry: Registry, env: dict[str, str]
) -> None:
    """A kustomization that names the image by its registry path: the pin read back is
    under that name, and the replay still finds its own pin proposed."""
    target = yaml.safe_load(code_repo.show(KUSTOMIZATION))
    target["images"] = [{"name": f"{registry.host}/citation-dagster", "newTag": "old"}]
    code_repo.commit({KUSTOMIZATION: yaml.safe_dump(target)})
    values = _values(tmp_path, gitea, registry)
    revision = code_repo.commit({APP_FILE: "v2\n"})
    digest = "sha256:" + "a" * 64
    assert _writeback(values, env, revision, digest).startswith("proposed: citation ")
    head = code_repo.git("rev-parse", HEAD).strip()
    again = _writeback(values, env, revision, digest)
    assert again.startswith("in review: citation "), again
    assert code_repo.git("rev-parse", HEAD).strip() == head, "a replay writes nothing"


def test_a_dry_run_closes_nothing_and_asks_no_merge(
    code_repo: Repo, tmp_path: Path, gitea: GiteaDouble, registry: Registry, env: dict[str, str]
) -> None:
    values = _values(tmp_path, gitea, registry)
    revision = code_repo.commit({APP_FILE: "v2\n"})
    digest = "sha256:" + "a" * 64
    _writeback(values, env, revision, digest)
    auto = _values(tmp_path, gitea, registry, **{"writeback.pullRequest.autoMerge": True})
    dry = _writeback(auto, env, revision, digest, "--dry-run")
    assert dry.startswith("in review: citation "), dry
    (pull,) = gitea.pulls[REPO]
    assert pull["scheduled"] is None, "a dry run asks no merge"

    text = code_repo.show(KUSTOMIZATION)
    held = apply_hold(
        text, Hold("alice", "2026-12-05T10:00:00Z", "incident"), where="k", app="citation"
    )
    code_repo.commit({KUSTOMIZATION: held})
    dry = _writeback(values, env, revision, digest, "--dry-run")
    assert dry.startswith("held: citation is held by alice"), dry
    assert pull["state"] == "open", "a dry run closes nothing"


def test_a_pull_request_a_person_closed_is_not_proposed_again_until_a_newer_build(
    code_repo: Repo,
    tmp_path: Path,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    kube: KubeApiDouble,
) -> None:
    values = _values(tmp_path, gitea, registry)
    revision, digest = _built(code_repo, registry)
    _writeback(values, env, revision, digest)
    (pull,) = gitea.pulls[REPO]
    _close(gitea, pull["number"])

    again = _writeback(values, env, revision, digest)
    assert again.startswith("rejected: citation "), again
    assert f"/{REPO}/pulls/1, closed unmerged" in again and len(gitea.pulls[REPO]) == 1
    _phase(kube, revision, "Succeeded", values=values, verified=digest)
    line = _line(_reconcile(values, env, "--app", "citation"))
    assert line.startswith("citation: rejected: ") and "/pulls/1" in line, line
    assert len(gitea.pulls[REPO]) == 1, "the safety net proposes it no more"

    newer = code_repo.commit({APP_FILE: "v3\n"})
    proposed = _writeback(values, env, newer, "sha256:" + "b" * 64)
    assert proposed.startswith("proposed: citation "), proposed
    assert [p["state"] for p in gitea.pulls[REPO]] == ["closed", "open"]


def test_a_hold_cancels_the_scheduled_merge_before_it_commits(
    code_repo: Repo, tmp_path: Path, gitea: GiteaDouble, registry: Registry, env: dict[str, str]
) -> None:
    gitea.protect(REPO, "main", checks=["ci/lint"])
    gitea.protected.pop((REPO, "main"))  # fabrique's user may push: the hold commits
    values = _values(tmp_path, gitea, registry, **{"writeback.pullRequest.autoMerge": True})
    revision = code_repo.commit({APP_FILE: "v2\n"})
    _writeback(values, env, revision, "sha256:" + "a" * 64)
    (pull,) = gitea.pulls[REPO]
    assert pull["scheduled"] == "merge"
    _fab(values, env, "hold", "--app", "citation", "--reason", "incident", "--by", "alice")
    assert pull["scheduled"] is None and pull["state"] == "closed" and not pull["merged"]


def test_the_safety_net_asks_the_merge_of_a_pull_request_in_review_and_closes_a_held_ones(
    code_repo: Repo,
    tmp_path: Path,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    kube: KubeApiDouble,
) -> None:
    """A proposal whose merge was never asked (autoMerge set since, or Gitea kept saying
    'try again later'): the next pass asks it. A hold written by hand: the next pass
    closes the open pull request."""
    values = _values(tmp_path, gitea, registry)
    revision, digest = _built(code_repo, registry)
    _writeback(values, env, revision, digest)
    (pull,) = gitea.pulls[REPO]
    auto = _values(tmp_path, gitea, registry, **{"writeback.pullRequest.autoMerge": True})
    gitea.protect(REPO, "main", checks=["ci/lint"])
    line = _line(_reconcile(auto, env, "--app", "citation"))
    assert line.startswith("citation: in-review: ") and "merges once its checks pass" in line
    assert pull["scheduled"] == "merge"

    gitea.protected.pop((REPO, "main"))
    text = code_repo.show(KUSTOMIZATION)
    hold = Hold("alice", "2026-12-05T10:00:00Z", "incident")
    code_repo.commit({KUSTOMIZATION: apply_hold(text, hold, where="k", app="citation")})
    before = len(gitea.requests)
    line = _line(_reconcile(auto, env, "--app", "citation"))
    assert line.startswith("citation: held: ") and line.endswith("closed pull request #1"), line
    assert pull["state"] == "closed" and pull["scheduled"] is None
    lookups = [r for r in gitea.requests[before:] if "/pulls/main/" in r.path]
    assert len(lookups) == 1, "a held app's pull request is looked up once, to close it"


@pytest.mark.parametrize(
    ("app", "environment", "branch"),
    [("citation", None, "fabrique/citation"), ("citation", "prod", "fabrique/citation.prod")],
)
def test_a_later_environment_proposes_from_a_branch_no_app_name_can_take(
    tmp_path: Path, app: str, environment: str | None, branch: str
) -> None:
    envs = [
        {"name": "bench", "target": "bench"},
        {
            "name": "prod",
            "target": "bench",
            "namespace": "prod",
            "application": "argocd/citation-prod",
            "writeback": {"repo": "atlas/atlas", "path": "prod/kustomization.yaml"},
        },
    ]
    citation = {**default_values()["apps"][0], "environments": envs}
    values = write_values(
        tmp_path / "site.yaml", targets={"bench": {"context": "bench"}}, apps=[citation]
    )
    site = load_site(values, env={})
    stage = site.app(app).environment(environment)[0] if environment else None
    assert review_branch(site, app, stage) == branch


def test_a_pass_that_loses_its_proposal_race_reads_the_target_again(
    code_repo: Repo,
    tmp_path: Path,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    kube: KubeApiDouble,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Someone writes the target between the pass's read and its proposal: Gitea refuses
    the stale sha (422), and the next attempt must read the target again, not the pass's
    answer of before."""
    values = _values(tmp_path, gitea, registry)
    revision, digest = _built(code_repo, registry)
    _phase(kube, revision, "Succeeded", values=values, verified=digest)
    write = gitea._write_contents
    rivals: list[str] = []

    def rival_first(repo: str, file_path: str, body: dict[str, Any], *, create: bool) -> Any:
        if not rivals:  # a person's edit of the target lands first
            text = code_repo.show(KUSTOMIZATION) + "# a person's comment\n"
            rivals.append(code_repo.commit({KUSTOMIZATION: text}, "a rival edit"))
        return write(repo, file_path, body, create=create)

    monkeypatch.setattr(gitea, "_write_contents", rival_first)
    result = _reconcile(values, env, "--app", "citation")
    assert _line(result).startswith("citation: proposed: "), result.stdout + result.stderr
    proposal = code_repo.show(KUSTOMIZATION, ref=HEAD)
    assert "# a person's comment" in proposal and revision[:12] in proposal


def test_the_proposal_branch_is_spelt_one_way_wherever_it_is_told() -> None:
    """The code's spelling of a later environment's branch, ``<prefix><app>.<env>``, is
    the one the site config's comment, the PullRequests docstring, the review module and
    the write-back page give (the config reference is generated from the first two)."""
    import fabrique.decisions.review as review_module
    from fabrique.site.config import PullRequests

    root = Path(__file__).resolve().parents[1]
    told = {
        "site.default.yaml": (root / "fabrique/site/site.default.yaml").read_text(),
        "PullRequests": PullRequests.__doc__ or "",
        "review.py": review_module.__doc__ or "",
        "write-back.md": (root / "docs/operate/write-back.md").read_text(),
    }
    for where, text in told.items():
        assert "<app>-<env" not in text and "(``-<environment>``" not in text, where
        assert re.search(r"<(branch)?[pP]refix>?<app>\.<env", text), where


def test_a_merge_asked_while_gitea_checks_the_pushed_head_is_asked_again(
    code_repo: Repo, tmp_path: Path, gitea: GiteaDouble, registry: Registry, env: dict[str, str]
) -> None:
    """Gitea answers 405 "Please try again later" while it checks a pull request's new
    head: the write-back asks again after a pause, and says so when Gitea kept checking."""
    gitea.protect(REPO, "main", checks=["ci/lint"])
    gitea.check_answers = 1
    values = _values(tmp_path, gitea, registry, **{"writeback.pullRequest.autoMerge": True})
    revision = code_repo.commit({APP_FILE: "v2\n"})
    said = _writeback(values, env, revision, "sha256:" + "a" * 64)
    assert said.startswith("proposed: citation ") and "merges once its checks pass" in said, said
    merges = [r for r in gitea.requests if r.method == "POST" and r.path.endswith("/merge")]
    assert len(merges) == 2, "asked once while Gitea checked, once after"
    (pull,) = gitea.pulls[REPO]
    assert pull["scheduled"] == "merge"

    gitea.check_answers = 100
    newer = code_repo.commit({APP_FILE: "v3\n"})
    gitea._cancel_merge(REPO, pull["number"])
    said = _writeback(values, env, newer, "sha256:" + "b" * 64)
    assert said.startswith("proposed: citation ") and "its merge not asked yet" in said, said
    assert pull["scheduled"] is None


@pytest.mark.parametrize("style", ["fast-forward-only", "merge"])
def test_a_proposal_the_base_left_behind_is_made_again_on_its_head(
    code_repo: Repo,
    tmp_path: Path,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    kube: KubeApiDouble,
    style: str,
) -> None:
    """The base moves under an open proposal: fast-forward-only can no longer merge it,
    and an edit of the same lines conflicts (Gitea's 405 for ever). A replay and a pass
    make it again, one commit on the base's new head; the pass asks the merge once."""
    gitea.protect(REPO, "main", checks=["ci/lint"])
    gitea.protected.pop((REPO, "main"))
    more = {"writeback.pullRequest.autoMerge": True, "writeback.pullRequest.mergeStyle": style}
    values = _values(tmp_path, gitea, registry, **more)
    revision, digest = _built(code_repo, registry)
    assert _writeback(values, env, revision, digest).startswith("proposed: citation ")
    (pull,) = gitea.pulls[REPO]
    first = code_repo.git("rev-parse", HEAD).strip()
    if style == "merge":  # another entry appended where the proposal appends its own
        text = code_repo.show(KUSTOMIZATION) + '  - name: redis\n    newTag: "7"\n'
        moved = code_repo.commit({KUSTOMIZATION: text}, "another app's entry")
        status = gitea._pull_status(REPO, pull)
        assert status == "conflict" and not gitea._pull_view(REPO, pull)["mergeable"]
    else:
        moved = code_repo.commit({"README.md": "moved\n"}, "the base moves on")

    again = _writeback(values, env, revision, digest)
    assert again.startswith("proposed: citation "), again
    remade = code_repo.git("rev-parse", HEAD).strip()
    assert code_repo.git("rev-parse", f"{HEAD}^").strip() == moved and remade != first
    assert [p["number"] for p in gitea.pulls[REPO]] == [pull["number"]], "the same one"

    code_repo.commit({"README.md": "moved again\n"}, "the base moves on again")
    _phase(kube, revision, "Succeeded", values=values, verified=digest)
    before = len(gitea.requests)
    line = _line(_reconcile(values, env, "--app", "citation"))
    assert line.startswith("citation: proposed: "), line
    merges = [r for r in gitea.requests[before:] if r.path.endswith("/merge")]
    assert len(merges) == 1, "a pass asks the merge once"
    replay = _writeback(values, env, revision, digest)
    assert replay.startswith("in review: citation "), replay


def test_a_rejection_is_found_however_many_pull_requests_closed_since(
    code_repo: Repo,
    tmp_path: Path,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    kube: KubeApiDouble,
) -> None:
    """A person closes the proposal unmerged; then 120 other pull requests into the base
    close. The safety net still finds the refusal, and lists no pull requests to do so."""
    values = _values(tmp_path, gitea, registry)
    revision, digest = _built(code_repo, registry)
    _writeback(values, env, revision, digest)
    (pull,) = gitea.pulls[REPO]
    _close(gitea, pull["number"])
    with _api(gitea) as api:
        for n in range(120):
            code_repo.git("branch", f"other-{n}", "main")
            made = api.post(
                f"/repos/{REPO}/pulls",
                json={"base": "main", "head": f"other-{n}", "title": "t", "body": ""},
            )
            number = made.json()["number"]
            api.patch(f"/repos/{REPO}/pulls/{number}", json={"state": "closed"})
    _phase(kube, revision, "Succeeded", values=values, verified=digest)
    before = len(gitea.requests)
    line = _line(_reconcile(values, env, "--app", "citation"))
    assert line.startswith("citation: rejected: ") and "/pulls/1" in line, line
    listings = [r.query.get("state") for r in gitea.requests[before:] if r.path.endswith("/pulls")]
    assert set(listings) <= {"open"}, "a refusal is read where it is recorded, not in the history"
    assert _writeback(values, env, revision, digest).startswith("rejected: citation ")


def test_a_rejected_pin_stays_rejected_after_an_older_build_proposes(
    code_repo: Repo,
    tmp_path: Path,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    kube: KubeApiDouble,
) -> None:
    """The newer build's pull request is closed unmerged; a slower older build then
    opens a pull request of its own. The pass does not put the newer pin back into it."""
    values = _values(tmp_path, gitea, registry)
    older = code_repo.commit({APP_FILE: "v2\n"})
    newer = code_repo.commit({APP_FILE: "v3\n"})
    digest = push_image(registry.url, "citation-dagster", newer[:12])
    assert _writeback(values, env, newer, digest).startswith("proposed: citation ")
    _close(gitea, 1)
    late = _writeback(values, env, older, "sha256:" + "a" * 64)
    assert late.startswith("proposed: citation "), late
    _phase(kube, newer, "Succeeded", values=values, verified=digest)
    line = _line(_reconcile(values, env, "--app", "citation"))
    assert line.startswith("citation: rejected: ") and "/pulls/1" in line, line
    assert older[:12] in code_repo.show(KUSTOMIZATION, ref=HEAD), "the older pin stays proposed"
    again = _writeback(values, env, newer, digest)
    assert again.startswith("rejected: citation "), again
    assert newer[:12] not in code_repo.show(KUSTOMIZATION, ref=HEAD)


def test_no_merge_gitea_makes_on_its_own_falls_into_a_freeze_window(
    code_repo: Repo,
    tmp_path: Path,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    kube: KubeApiDouble,
) -> None:
    """A proposal whose merge was scheduled before the window: Gitea would make it once
    the checks pass, in the window. The pass before it cancels the schedule, a replay
    asks none, and the first pass after the window asks it again."""
    gitea.protect(REPO, "main", checks=["ci/lint"])
    auto = {"writeback.pullRequest.autoMerge": True}
    values = _values(tmp_path, gitea, registry, **auto)
    revision, digest = _built(code_repo, registry)
    _writeback(values, env, revision, digest)
    (pull,) = gitea.pulls[REPO]
    assert pull["scheduled"] == "merge"

    # a window opens before the next pass (the schedule's period: 5 minutes)
    soon = (datetime.now(UTC) + timedelta(minutes=2)).replace(microsecond=0)
    window = {"start": soon.isoformat(), "duration": "1h", "reason": "release night"}
    (tmp_path / "frozen").mkdir()
    frozen = _values(tmp_path / "frozen", gitea, registry, **auto, freeze=[window])
    result = _reconcile(frozen, env, "--app", "citation")
    said = [line for line in result.stdout.splitlines() if line.startswith("citation: frozen: ")]
    assert said == [
        f"citation: frozen: the merge of {gitea.url}/{REPO}/pulls/{pull['number']} waits: "
        f"frozen until "
        f"{soon + timedelta(hours=1):%Y-%m-%dT%H:%MZ}: release night"
    ], result.stdout
    assert pull["scheduled"] is None and pull["state"] == "open"
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("citation: in-review: ")]
    assert "its merge waits: frozen until" in line, line
    assert pull["scheduled"] is None, "the pass asks no merge either"
    head = gitea._resolve(REPO, f"refs/heads/{pull['head']}") or pull["head_sha"]
    gitea._create_status(REPO, head, {"context": "ci/lint", "state": "success"})
    assert not pull["merged"], "the checks pass: nothing is merged"

    # after the window: the first pass asks the merge again, and Gitea makes it
    after = _line(_reconcile(values, env, "--app", "citation"))
    assert "merges once its checks pass" in after or "merged" in after, after
