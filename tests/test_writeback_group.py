"""The write-backs of a push that touches many apps land together (``writeback.batch``):
one commit per repository and branch, every per-app guard still held inside the group,
the push's Workflow waiting for its builds within bounds."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from fabrique.clients.kube import WorkflowState
from fabrique.decisions.holds import Hold, apply_hold
from fabrique.decisions.push import meeting
from fabrique.decisions.workflow import build_workflow
from fabrique.decisions.writeback import (
    Deploy,
    Outcome,
    open_transport,
    set_hold,
    write_back,
    write_back_many,
)
from fabrique.gestures.group import Landed, wait_and_write, write_batch
from fabrique.site.config import Site, load_site, parse_site
from fabrique.site.errors import ConfigError, TargetError

from .conftest import GITEA_TOKEN, Repo, run_cli
from .doubles.gitea import GiteaDouble
from .test_commit_signing import ssh_key, verify_commit

DIGESTS = ["sha256:" + c * 64 for c in "abcdef0123"]
SEED = """\
# {app}: deployed by digest
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
images:
  - name: {app}-image
    newTag: "0.1"
"""


def _target(app: str) -> str:
    return f"deploy/{app}/kustomization.yaml"


def _site(gitea_url: str, names: list[str], **writeback: Any) -> Site:
    values = load_site(env={}).to_values()
    values["gitea"]["url"] = gitea_url
    values["writeback"] |= writeback
    values["apps"] = [
        {
            "name": name,
            "image": f"{name}-image",
            "context": f"src/{name}",
            "writeback": {"kind": "kustomize-images", "repo": "atlas/atlas", "path": _target(name)},
        }
        for name in names
    ]
    return parse_site(values)


NAMES = ["alpha", "beta", "gamma"]


@pytest.fixture()
def seeded(code_repo: Repo) -> str:
    """Three apps, each its own kustomization in atlas/atlas; a commit touching all."""
    code_repo.commit({_target(a): SEED.format(app=a) for a in NAMES}, "the apps' targets")
    return code_repo.commit({f"src/{a}/Dockerfile": "FROM scratch\n" for a in NAMES}, "all")


@pytest.fixture(params=["gitea", "git"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture()
def site(gitea: GiteaDouble, transport_kind: str, git_daemon: Any) -> Site:
    if transport_kind == "git":
        return _site(gitea.url, NAMES, transport="git", gitUrl=f"git://127.0.0.1:{git_daemon.port}")
    return _site(gitea.url, NAMES)


def _deploys(revision: str, names: list[str] = NAMES) -> list[Deploy]:
    return [
        Deploy(n, revision, DIGESTS[i], f"fabrique-{n}-{revision[:12]}")
        for i, n in enumerate(names)
    ]


def _commits_since(repo: Repo, base: str) -> list[str]:
    return repo.git("rev-list", f"{base}..main").split()


def test_the_apps_of_one_repository_and_branch_land_as_one_commit(
    site: Site, code_repo: Repo, seeded: str
) -> None:
    before = code_repo.head()
    with open_transport(site, GITEA_TOKEN) as transport:
        outcomes = write_back_many(site, transport, _deploys(seeded))
    assert [getattr(o, "state", o) for o in outcomes] == ["changed"] * 3
    commits = _commits_since(code_repo, before)
    assert len(commits) == 1
    assert {o.commit for o in outcomes if isinstance(o, Outcome)} == {commits[0]}
    message = code_repo.git("log", "-1", "--format=%B", commits[0])
    assert message.startswith("fabrique: deploy 3 images into 3 files of atlas/atlas")
    for i, name in enumerate(NAMES):
        assert f"App: {name}\n" in message
        assert f"Image: registry:80/{name}-image:{seeded[:12]}\n" in message
        assert f"Digest: {DIGESTS[i]}\n" in message
        text = code_repo.show(_target(name))
        assert f"digest: {DIGESTS[i]}" in text and text.startswith(f"# {name}: deployed")
    # a replay writes nothing
    with open_transport(site, GITEA_TOKEN) as transport:
        again = write_back_many(site, transport, _deploys(seeded))
    assert [getattr(o, "state", o) for o in again] == ["unchanged"] * 3
    assert len(_commits_since(code_repo, before)) == 1


def test_one_app_alone_gets_the_commit_a_single_write_back_makes(
    gitea: GiteaDouble, code_repo: Repo, seeded: str, tmp_path: Path
) -> None:
    site = _site(gitea.url, NAMES)
    before = code_repo.head()
    with open_transport(site, GITEA_TOKEN) as transport:
        (outcome,) = write_back_many(site, transport, _deploys(seeded, ["beta"]))
    assert isinstance(outcome, Outcome) and outcome.state == "changed"
    message = code_repo.git("log", "-1", "--format=%B", "main")
    assert message.startswith(f"fabrique: deploy beta-image {seeded[:12]} for beta\n")
    assert len(_commits_since(code_repo, before)) == 1


def test_held_superseded_and_refused_apps_are_left_out_and_the_others_land(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    site = _site(gitea.url, [*NAMES, "delta"])
    # alpha is held; beta deploys a newer commit; gamma deploys an older one; delta's
    # deployed tag names no commit, and the push is no longer the branch's head
    older = code_repo.git("rev-parse", f"{seeded}~1").strip()[:12]
    code_repo.commit(
        {
            _target("delta"): SEED.format(app="delta"),
            _target("gamma"): SEED.format(app="gamma").replace('"0.1"', older),
        },
        "delta's target; gamma deploys an older build",
    )
    with open_transport(site, GITEA_TOKEN) as transport:
        set_hold(site, transport, "alpha", Hold("ops", "2026-12-06T10:00:00Z", "INC-1"), by="ops")
        newer = code_repo.commit({"src/beta/app.txt": "v3\n"}, "beta again")
        write_back(site, transport, "beta", newer, DIGESTS[9])
        before = code_repo.head()
        outcomes = write_back_many(site, transport, _deploys(seeded, [*NAMES, "delta"]))
    held, superseded, changed, refused = outcomes
    assert isinstance(held, Outcome) and held.state == "held"
    assert isinstance(superseded, Outcome) and superseded.state == "superseded"
    assert isinstance(changed, Outcome) and changed.state == "changed"
    # delta's deployed tag "0.1" is no commit, and the push's commit is not the head
    assert isinstance(refused, TargetError) and "'0.1'" in str(refused)
    assert _commits_since(code_repo, before) == [changed.commit]
    assert DIGESTS[9] in code_repo.show(_target("beta"))
    assert "digest:" not in code_repo.show(_target("alpha"))


def test_a_rival_edit_is_read_again_and_the_group_retried(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    site = _site(gitea.url, NAMES, attempts=10)
    gitea.race_rate = 0.5  # Gitea answers "sha does not match" to half the writes
    with open_transport(site, GITEA_TOKEN) as transport:
        outcomes = write_back_many(site, transport, _deploys(seeded), sleep=lambda _: None)
    assert [getattr(o, "state", o) for o in outcomes] == ["changed"] * 3
    for i, name in enumerate(NAMES):
        assert DIGESTS[i] in code_repo.show(_target(name))


def test_a_dry_run_says_the_one_diff_and_writes_nothing(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    site = _site(gitea.url, NAMES)
    before = code_repo.head()
    with open_transport(site, GITEA_TOKEN, writes=False) as transport:
        outcomes = write_back_many(site, transport, _deploys(seeded), dry_run=True)
    states = {o.state for o in outcomes if isinstance(o, Outcome)}
    assert states == {"would-change"}
    first = outcomes[0]
    assert isinstance(first, Outcome)
    assert all(f"b/{_target(n)}" in first.diff for n in NAMES)
    assert code_repo.head() == before


# ------------------------------------------------------------------- pull requests

GROUP_HEAD = "fabrique/push.{rev}.main"


def _pulls(gitea: GiteaDouble) -> list[dict[str, Any]]:
    return gitea.pulls.get("atlas/atlas", [])


def _records(site: Site, transport: Any, revision: str) -> dict[str, str]:
    """Each app's proposal record on the built commit: the pull request it names."""
    found = transport.reviews.latest_statuses(site.gitea.code_repo, revision)
    return {c: s.target_url for c, s in found.items() if c.startswith("proposal: ")}


def test_a_push_s_apps_that_take_pull_requests_are_proposed_in_one(
    gitea: GiteaDouble, code_repo: Repo, seeded: str, transport_kind: str, git_daemon: Any
) -> None:
    more = {"transport": "git", "gitUrl": f"git://127.0.0.1:{git_daemon.port}"}
    site = _site(gitea.url, NAMES, mode="pull-request", **(more if transport_kind == "git" else {}))
    before = code_repo.head()
    with open_transport(site, GITEA_TOKEN) as transport:
        outcomes = write_back_many(site, transport, _deploys(seeded))
        records = _records(site, transport, seeded)
    assert [getattr(o, "state", o) for o in outcomes] == ["proposed"] * 3
    (pull,) = _pulls(gitea)
    head = GROUP_HEAD.format(rev=seeded[:12])
    assert (pull["head"], pull["state"]) == (head, "open")
    assert pull["title"].startswith("fabrique: deploy 3 images into 3 files of atlas/atlas")
    assert code_repo.head() == before, "the base waits for the merge"
    proposed = code_repo.git("rev-parse", head).strip()
    assert {o.commit for o in outcomes if isinstance(o, Outcome)} == {proposed}
    assert code_repo.git("rev-parse", f"{proposed}~1").strip() == before, "one commit on base"
    for i, name in enumerate(NAMES):
        assert DIGESTS[i] in code_repo.show(_target(name), ref=head)
        # each app's record, under its own branch's name, names the push's pull request
        assert records[f"proposal: fabrique/{name}"].endswith(f"/pulls/{pull['number']}")
    # a replay proposes nothing again: every app is in review in that pull request
    with open_transport(site, GITEA_TOKEN) as transport:
        again = write_back_many(site, transport, _deploys(seeded))
    assert [getattr(o, "state", o) for o in again] == ["in-review"] * 3
    assert code_repo.git("rev-parse", head).strip() == proposed
    assert len(_pulls(gitea)) == 1


def _deploying_older(code_repo: Repo, seeded: str) -> None:
    """Each app deploys a build older than the push: a hold's commit, since, leaves the
    push no longer the branch's head, and its pins still replace theirs."""
    older = code_repo.git("rev-parse", f"{seeded}~1").strip()[:12]
    targets = {_target(a): SEED.format(app=a).replace('"0.1"', older) for a in NAMES}
    code_repo.commit(targets, "the apps deploy an older build")


def test_a_held_app_is_left_out_of_its_push_s_pull_request(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    _deploying_older(code_repo, seeded)
    site = _site(gitea.url, NAMES, mode="pull-request")
    with open_transport(site, GITEA_TOKEN) as transport:
        set_hold(site, transport, "alpha", Hold("ops", "2026-12-06T10:00:00Z", "INC-1"), by="ops")
        outcomes = write_back_many(site, transport, _deploys(seeded))
    assert [getattr(o, "state", o) for o in outcomes] == ["held", "proposed", "proposed"]
    (pull,) = _pulls(gitea)
    assert "alpha" not in pull["title"] and "App: alpha" not in pull["body"]
    head = GROUP_HEAD.format(rev=seeded[:12])
    assert "digest:" not in code_repo.show(_target("alpha"), ref=head)


def test_a_hold_closes_its_push_s_pull_request_and_the_others_are_proposed_again(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    _deploying_older(code_repo, seeded)
    site = _site(gitea.url, NAMES, mode="pull-request")
    hold = Hold("ops", "2026-12-06T10:00:00Z", "INC-1")
    with open_transport(site, GITEA_TOKEN) as transport:
        write_back_many(site, transport, _deploys(seeded))
        set_hold(site, transport, "alpha", hold, by="ops")
        (first,) = _pulls(gitea)
        # closed by fabrique, saying why: no person refused the others' pins
        assert first["state"] == "closed" and "alpha is held" in first["body"]
        again = write_back_many(site, transport, _deploys(seeded))
    assert [getattr(o, "state", o) for o in again] == ["held", "proposed", "proposed"]
    second = _pulls(gitea)[1]
    assert second["state"] == "open" and second["head"] == first["head"]
    assert "App: alpha" not in second["body"] and "App: beta" in second["body"]


def test_a_push_s_pull_request_a_person_closed_is_not_proposed_again(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    site = _site(gitea.url, NAMES, mode="pull-request")
    with open_transport(site, GITEA_TOKEN) as transport:
        write_back_many(site, transport, _deploys(seeded))
        (pull,) = _pulls(gitea)
        transport.reviews.edit_pull("atlas/atlas", pull["number"], state="closed")
        again = write_back_many(site, transport, _deploys(seeded))
    assert [getattr(o, "state", o) for o in again] == ["rejected"] * 3
    assert len(_pulls(gitea)) == 1


def test_a_push_s_pull_request_is_made_again_once_the_base_leaves_it_behind(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    _deploying_older(code_repo, seeded)
    site = _site(gitea.url, NAMES, mode="pull-request")
    with open_transport(site, GITEA_TOKEN) as transport:
        write_back_many(site, transport, _deploys(seeded))
        moved = code_repo.commit({"README.md": "moved\n"}, "the base moves")
        again = write_back_many(site, transport, _deploys(seeded))
    assert [getattr(o, "state", o) for o in again] == ["proposed"] * 3
    head = GROUP_HEAD.format(rev=seeded[:12])
    assert code_repo.git("rev-parse", f"{head}~1").strip() == moved
    assert len(_pulls(gitea)) == 1, "the one pull request, updated in place"


def test_the_pass_finds_an_app_in_review_in_its_push_s_pull_request(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    """The safety net reads the app's record: in review in its push's pull request, it
    is neither built nor proposed again alone; closed by a person, it is rejected."""
    from fabrique.decisions.reconcile import Reconciler

    site = _site(gitea.url, NAMES, mode="pull-request")
    with open_transport(site, GITEA_TOKEN) as transport:
        write_back_many(site, transport, _deploys(seeded))
        (pull,) = _pulls(gitea)
        pass_ = Reconciler(site, transport, None, None)  # type: ignore[arg-type]
        found = pass_._proposed(site.app("beta"), seeded)
        assert found is not None and found[1:] == (pull["number"], False, True), "its push's"
        assert found[0].endswith(f"/pulls/{pull['number']}")
        newer = code_repo.commit({"src/beta/app.txt": "v3\n"}, "beta again")
        assert pass_._proposed(site.app("beta"), newer) is None, "another build: not it"
        transport.reviews.edit_pull("atlas/atlas", pull["number"], state="closed")
        closed = pass_._proposed(site.app("beta"), seeded)
        assert closed is not None and closed[1:3] == (pull["number"], True)


def test_a_push_s_pull_request_is_merged_once_for_all_its_apps(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    """With autoMerge, Gitea is asked to merge the push's pull request: one merge, once
    its checks pass, for every app in it."""
    site = _site(gitea.url, NAMES, mode="pull-request", pullRequest={"autoMerge": True})
    with open_transport(site, GITEA_TOKEN) as transport:
        outcomes = write_back_many(site, transport, _deploys(seeded))
    said = {getattr(o, "detail", "").split(", ")[-1] for o in outcomes}
    assert said == {"merges once its checks pass"}
    (pull,) = _pulls(gitea)
    assert pull["scheduled"] == "merge" and pull["merged"], "no check is required here"
    merges = [r for r in gitea.requests if r.method == "POST" and r.path.endswith("/merge")]
    assert len(merges) == 1, "asked once for the push, not once per app"
    for i, name in enumerate(NAMES):
        assert DIGESTS[i] in code_repo.show(_target(name))


def test_no_merge_of_a_push_s_pull_request_falls_into_a_freeze(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    """A freeze that opens before the next pass: the push's pull request gets no merge
    asked, and one already scheduled is cancelled by the pass (``pause_merges``)."""
    from fabrique.decisions.review import pause_merges

    auto = {"autoMerge": True}
    required = {"checks": ["ci/test"]}
    gitea.protect("atlas/atlas", "main", **required)  # the merge waits for a check
    site = _site(gitea.url, NAMES, mode="pull-request", pullRequest=auto)
    with open_transport(site, GITEA_TOKEN) as transport:
        write_back_many(site, transport, _deploys(seeded))
        (pull,) = _pulls(gitea)
        assert pull["scheduled"] == "merge" and not pull["merged"]
        values = site.to_values()
        soon = datetime.now(UTC) + timedelta(minutes=1)
        window = {"start": soon.isoformat(), "duration": "1h", "reason": "release"}
        values["freeze"] = [window]
        frozen = parse_site(values)
        paused = pause_merges(frozen, transport, list(frozen.apps))
    assert pull["scheduled"] is None, "the push's scheduled merge is cancelled"
    assert any(f"pulls/{pull['number']}" in said for _, said in paused), paused


def test_an_app_left_alone_of_its_push_is_proposed_in_the_push_s_pull_request(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    """The safety net proposing one app of a push whose pull request holds it: the push's
    pull request is made again (without the others it no longer wants), never a second
    pull request from the app's own branch."""
    _deploying_older(code_repo, seeded)
    site = _site(gitea.url, NAMES, mode="pull-request")
    with open_transport(site, GITEA_TOKEN) as transport:
        write_back_many(site, transport, _deploys(seeded))
        code_repo.commit({"README.md": "moved\n"}, "the base moves: the proposal is behind")
        (alone,) = write_back_many(site, transport, _deploys(seeded, ["beta"]))
    assert isinstance(alone, Outcome) and alone.state == "proposed"
    open_pulls = [p for p in _pulls(gitea) if p["state"] == "open"]
    assert [p["head"] for p in open_pulls] == [GROUP_HEAD.format(rev=seeded[:12])]


def test_a_held_app_s_pin_does_not_stay_in_its_push_s_pull_request(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    """Held by hand after the proposal (the hold found by the push's write-back run again,
    every other app unchanged): its push's pull request closes, whatever else is done."""
    _deploying_older(code_repo, seeded)
    site = _site(gitea.url, ["alpha", "beta"], mode="pull-request")
    with open_transport(site, GITEA_TOKEN) as transport:
        write_back_many(site, transport, _deploys(seeded, ["alpha", "beta"]))
        text = code_repo.show(_target("alpha"))
        hold = Hold("ops", "2026-12-06T10:00:00Z", "INC-2")
        code_repo.commit({_target("alpha"): apply_hold(text, hold, where="t", app="alpha")})
        # beta deployed meanwhile (its pin merged by hand): only alpha's hold is left
        code_repo.commit(
            {
                _target("beta"): code_repo.show(
                    _target("beta"), ref=GROUP_HEAD.format(rev=seeded[:12])
                )
            }
        )
        again = write_back_many(site, transport, _deploys(seeded, ["alpha", "beta"]))
    assert [getattr(o, "state", o) for o in again] == ["held", "unchanged"]
    (pull,) = _pulls(gitea)
    assert pull["state"] == "closed" and "alpha is held" in pull["body"]


def test_a_base_whose_push_branch_gitea_would_refuse_is_said_when_the_site_loads(
    gitea: GiteaDouble,
) -> None:
    values = _site(gitea.url, NAMES, mode="pull-request").to_values()
    values["gitea"]["branch"] = "release/" + "x" * 80
    with pytest.raises(ConfigError, match=r"gitea\.branch.*100"):
        parse_site(values)


def test_a_dry_run_of_a_push_s_proposal_writes_nothing(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    site = _site(gitea.url, NAMES, mode="pull-request")
    with open_transport(site, GITEA_TOKEN, writes=False) as transport:
        outcomes = write_back_many(site, transport, _deploys(seeded), dry_run=True)
    assert {getattr(o, "state", o) for o in outcomes} == {"would-change"}
    assert _pulls(gitea) == []


# ----------------------------------------------------------------------- who meets


def test_a_push_s_apps_meet_when_they_write_into_one_repository_and_branch(
    gitea: GiteaDouble,
) -> None:
    site = _site(gitea.url, [*NAMES, "solo"])
    values = site.to_values()
    values["apps"][3]["writeback"]["repo"] = "cluster/apps"
    values["apps"][2]["writeback"]["mode"] = "pull-request"
    site = parse_site(values)
    # gamma proposes a pull request of its own; solo is alone in cluster/apps
    assert meeting(site, [*NAMES, "solo"]) == {"alpha", "beta"}
    assert meeting(site, ["alpha"]) == frozenset()
    # two apps that propose into one repository and branch meet: one pull request
    values["apps"][1]["writeback"]["mode"] = "pull-request"
    assert meeting(parse_site(values), [*NAMES, "solo"]) == {"beta", "gamma"}
    values["writeback"]["batch"] = {"enabled": False}
    assert meeting(parse_site(values), NAMES) == frozenset()


def test_a_build_that_meets_carries_the_push_s_name(gitea: GiteaDouble, seeded: str) -> None:
    site = _site(gitea.url, NAMES)
    body = build_workflow(site, "alpha", seeded, submitted_by="push", group="fabrique-push-x")
    assert body["metadata"]["labels"]["fabrique.io/push"] == "fabrique-push-x"
    assert {"name": "group", "value": "fabrique-push-x"} in body["spec"]["arguments"]["parameters"]
    alone = build_workflow(site, "alpha", seeded, submitted_by="push")
    assert "fabrique.io/push" not in alone["metadata"]["labels"]


@pytest.mark.parametrize(
    ("batch", "said"),
    [
        ({"window": "2h"}, r"writeback\.batch\.window: '2h': a wait is a whole number"),
        ({"window": "10m", "maxWait": "5m"}, r"window: 10m is longer than maxWait \(5m\)"),
        ({"maxWait": "soon"}, r"writeback\.batch\.maxWait: 'soon'"),
    ],
)
def test_a_bad_batch_setting_is_refused_naming_it(
    gitea: GiteaDouble, batch: dict[str, str], said: str
) -> None:
    values = _site(gitea.url, NAMES).to_values()
    values["writeback"]["batch"] = batch
    with pytest.raises(ConfigError, match=said):
        parse_site(values)


# ----------------------------------------------------------------------- the wait


class _Builds:
    """The push's builds as the API server lists them, phases moved by the test's clock."""

    def __init__(self, ends: dict[str, float | None], clock: list[float]) -> None:
        self.ends, self.clock, self.asked = ends, clock, 0

    def workflows(self, namespace: str, selector: str) -> list[WorkflowState]:
        assert selector == "fabrique.io/push=fabrique-push-p"
        self.asked += 1
        now = self.clock[0]
        return [
            WorkflowState(
                f"fabrique-{app}-x",
                "Succeeded" if end is not None and end <= now else "Running",
                "a" * 40,
                DIGESTS[0],
                "",
                app=app,
            )
            for app, end in self.ends.items()
        ]


def _wait(
    site: Site, ends: dict[str, float | None]
) -> tuple[list[tuple[float, list[str]]], list[str]]:
    clock = [0.0]
    batches: list[tuple[float, list[str]]] = []

    def write(builds: Any) -> list[Landed]:
        batches.append((clock[0], sorted(b.app for b in builds)))
        return [Landed(b.app, b.name, left="test") for b in builds]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    _, running = wait_and_write(
        site, _Builds(ends, clock), "fabrique-push-p", write, clock=lambda: clock[0], sleep=sleep
    )
    return batches, running


def test_the_group_is_written_once_every_build_of_the_push_has_ended(gitea: GiteaDouble) -> None:
    site = _site(gitea.url, NAMES)
    batches, running = _wait(site, {"alpha": 3, "beta": 40, "gamma": 12})
    assert batches == [(40, ["alpha", "beta", "gamma"])] and running == []


def test_past_max_wait_what_ended_lands_and_the_late_builds_land_together(
    gitea: GiteaDouble,
) -> None:
    values = _site(gitea.url, NAMES).to_values()
    values["writeback"]["batch"] = {"window": "5s", "maxWait": "1m"}
    site = parse_site(values)
    batches, running = _wait(site, {"alpha": 10, "beta": 100, "gamma": 103, "delta": 200})
    # alpha waited a minute from its end; then beta and gamma, a window after the last
    # of them, and delta once it ended, the last (no window when nothing runs)
    assert batches == [(70, ["alpha"]), (108, ["beta", "gamma"]), (200, ["delta"])]
    assert running == []


def test_a_build_that_never_ends_is_left_to_the_safety_net(gitea: GiteaDouble) -> None:
    values = _site(gitea.url, NAMES).to_values()
    values["build"]["activeDeadlineSeconds"] = 600
    site = parse_site(values)
    batches, running = _wait(site, {"alpha": 1, "beta": None})
    assert batches[0] == (301, ["alpha"])
    assert running == ["fabrique-beta-x"]


# ----------------------------------------------------------------------- the command


def _command(gitea: GiteaDouble, tmp_path: Path, deploys: str) -> Result:
    """``fabrique writeback-group --from`` a file holding ``deploys``."""
    values = tmp_path / "values.json"
    values.write_text(json.dumps(_site(gitea.url, NAMES).to_values()))
    listed = tmp_path / "deploys.json"
    listed.write_text(deploys)
    return run_cli(
        "--values", str(values), "writeback-group", "--from", str(listed),
        env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN},
    )  # fmt: skip


def test_the_command_writes_a_list_of_deploys_in_one_commit(
    gitea: GiteaDouble, code_repo: Repo, seeded: str, tmp_path: Path
) -> None:
    before = code_repo.head()
    listed = [{"app": d.app, "revision": d.revision, "digest": d.digest} for d in _deploys(seeded)]
    result = _command(gitea, tmp_path, json.dumps(listed))
    assert result.exit_code == 0, result.output
    assert len(_commits_since(code_repo, before)) == 1
    assert result.output.count("changed: ") == 3
    assert "3 build(s) of the push: 3 changed" in result.output
    # each app's status, as its build's main would have posted it
    statuses = gitea.statuses[("atlas/atlas", seeded)]
    assert {s["context"] for s in statuses} == {f"fabrique/{n}" for n in NAMES}
    assert all(s["status"] == "success" for s in statuses)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{", "not JSON"),
        ("{}", "must be a JSON list of deploys"),
        ('[{"app": "alpha"}]', r"\[0\]\.revision: missing"),
        ('[{"app": "alpha", "revision": "' + "a" * 40 + '", "digest": "latest"}]', "digest"),
        ('[{"app": "alpha", "tag": "x"}]', r"\[0\]: an object of app, revision, digest"),
    ],
)
def test_a_bad_list_of_deploys_is_one_line_naming_the_entry(
    gitea: GiteaDouble, tmp_path: Path, content: str, said: str
) -> None:
    result = _command(gitea, tmp_path, content)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert re.search(said, lines[0]), lines[0]


def test_the_command_wants_one_source(gitea: GiteaDouble, tmp_path: Path) -> None:
    values = tmp_path / "values.json"
    values.write_text(json.dumps(_site(gitea.url, NAMES).to_values()))
    result = run_cli("--values", str(values), "writeback-group")
    assert result.exit_code == 2 and "give --push or --from" in result.output


def test_the_push_s_write_back_starts_the_look_a_build_of_its_own_would_have_made(
    gitea: GiteaDouble, code_repo: Repo, seeded: str
) -> None:
    """Builds that meet have no verify-deploy step: what the push's write-back wrote into
    a first environment deployed in this cluster is looked at (fabrique-verify); what it
    did not write, or wrote elsewhere, is not."""
    values = _site(gitea.url, NAMES).to_values()
    values["targets"]["bench"] = {"context": "cluster-bench", "inCluster": True}
    values["targets"]["far"] = {"context": "cluster-far"}
    values["apps"][0]["environments"] = [{"name": "bench", "target": "bench"}]
    values["apps"][1]["environments"] = [{"name": "far", "target": "far"}]
    site = parse_site(values)
    looked: list[tuple[str, str, str]] = []
    builds = [
        WorkflowState(f"fabrique-{n}-x", "Succeeded", seeded, DIGESTS[i], "", app=n)
        for i, n in enumerate(NAMES)
    ]
    with open_transport(site, GITEA_TOKEN) as transport:
        landed = write_batch(
            site,
            transport,
            None,
            builds,
            look=lambda app, env, outcome: (
                looked.append((app.name, env.name, outcome.state)) or f"verifying in {env.name}"
            ),
        )
        assert looked == [("alpha", "bench", "changed")]
        again = write_batch(site, transport, None, builds, look=lambda *_: "looked again")
    assert [one.line() for one in again if "looked" in one.line()] == []  # unchanged
    lines = {one.app: one.line() for one in landed}
    assert lines["alpha"].endswith("; verifying in bench")
    assert "verifying" not in lines["gamma"]


def test_a_group_over_git_is_one_commit_signed_with_the_site_s_key(
    gitea: GiteaDouble, code_repo: Repo, seeded: str, git_daemon: Any, tmp_path: Path
) -> None:
    """Signed write-back commits hold inside a group: one commit of every file, signed
    with fabrique's SSH key, which git verifies."""
    key = ssh_key(tmp_path / "keys")
    values = _site(
        gitea.url,
        NAMES,
        transport="git",
        gitUrl=f"git://127.0.0.1:{git_daemon.port}",
        signing={"keySecret": {"name": "fabrique-writeback-signing", "key": "key"}},
    ).to_values()
    (tmp_path / "values.json").write_text(json.dumps(values))
    listed = [{"app": d.app, "revision": d.revision, "digest": d.digest} for d in _deploys(seeded)]
    (tmp_path / "deploys.json").write_text(json.dumps(listed))
    before = code_repo.head()
    result = run_cli(
        "--values", str(tmp_path / "values.json"), "writeback-group",
        "--from", str(tmp_path / "deploys.json"),
        env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN, "FABRIQUE_WRITEBACK_SIGNING_KEY": str(key)},
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    assert len(_commits_since(code_repo, before)) == 1
    verified = verify_commit(code_repo, key, tmp_path)
    assert verified.returncode == 0, verified.stderr
    for i, name in enumerate(NAMES):
        assert f"digest: {DIGESTS[i]}" in code_repo.show(_target(name))


# ----------------------------------------------------------------------- the safety net


def test_the_pass_leaves_a_grouped_build_to_its_push_while_it_may_wait(
    gitea: GiteaDouble,
) -> None:
    """A build that meets its push's others is written by the push's Workflow: the pass
    writes it only once the push had maxWait and a margin to do so, so one push stays one
    commit, and a push whose write-back died is still written."""
    from datetime import UTC, datetime

    from fabrique.decisions.reconcile import Reconciler, decide

    from .test_reconcile import VERIFIED, _facts

    site = _site(gitea.url, NAMES)  # maxWait 5m
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    pass_ = Reconciler(site, None, None, None, clock=lambda: now)  # type: ignore[arg-type]

    def build(finished: str, group: str = "fabrique-push-x") -> WorkflowState:
        return WorkflowState(
            "fabrique-alpha-x", "Succeeded", "b" * 40, DIGESTS[0], "", "alpha", group, finished
        )

    assert pass_._grouped(build("2026-12-06T11:59:00Z")) == "fabrique-push-x"
    assert pass_._grouped(build("2026-12-06T11:53:30Z")) == "fabrique-push-x"
    assert pass_._grouped(build("2026-12-06T11:52:00Z")) == "", "past maxWait and a margin"
    assert pass_._grouped(build("2026-12-06T11:59:00Z", group="")) == "", "a build of its own"
    assert pass_._grouped(build("")) == "", "no end said: the pass writes it"
    action, detail = decide(_facts(**VERIFIED, grouped="fabrique-push-x"))
    assert action == "in-flight"
    assert "the push's Workflow fabrique-push-x writes it" in detail
    assert decide(_facts(**VERIFIED))[0] == "write-back"


def test_the_pass_reads_a_build_s_group_and_its_end_from_its_workflow() -> None:
    from fabrique.clients.kube import workflow_state

    body = {
        "spec": {
            "arguments": {
                "parameters": [
                    {"name": "app", "value": "alpha"},
                    {"name": "revision", "value": "b" * 40},
                    {"name": "group", "value": "fabrique-push-x"},
                ]
            }
        },
        "status": {"phase": "Succeeded", "finishedAt": "2026-12-06T11:59:00Z"},
    }
    state = workflow_state("fabrique-alpha-x", body)
    assert (state.group, state.finished_at) == ("fabrique-push-x", "2026-12-06T11:59:00Z")
    alone = workflow_state("fabrique-alpha-y", {"spec": {}, "status": {"phase": "Running"}})
    assert (alone.group, alone.finished_at) == ("", "")
