"""A push that touches twenty apps of one repository, on the live plane: one write-back
commit (``writeback.batch``), or one pull request where the apps take pull requests.

The real programs judge what this path adds: the push's Workflow from the rendered
template, run by the real Argo controller (its ``plan-push`` step's ``grouped`` output,
and the ``when`` of its ``write-back`` step); the builds created with the planner's own
token under the real RBAC and admission (a ``group`` parameter, the ``fabrique.io/push``
label), listed with it; a real Gitea taking the one commit through its Contents API
(``POST /contents``) and each app's status. kwok plays the builds' pods (their digests
reported as Argo's executor reports a pod's outputs) and the planner plays the push's
pods (``planner.py``): the same commands, run here with the pod's account's token.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.site.config import load_site, merge
from fabrique.site.names import PUSH_PREFIX, PUSH_TEMPLATE

from .cluster import ARGO, Cluster
from .gitea import Gitea
from .gitea import binary as gitea_binary
from .planner import Planner
from .test_workflows import BUILD_NS, RUN, phase, walk

CONTROL = "fabrique"
CODE_REPO, BRANCH = "atlas/atlas", "main"
APPS = 20
SEED = """\
# {app}: deployed by digest, written by fabrique
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
images:
  - name: {app}
    newTag: "0.1"
"""


def _target(app: str) -> str:
    return f"deploy/{app}/kustomization.yaml"


def _digest(app: str, sha: str) -> str:
    return "sha256:" + (uuid.uuid5(uuid.NAMESPACE_URL, app + sha).hex * 2)


class Monorepo:
    """A real Gitea holding twenty apps in one code repository, each its own folder and
    its own kustomization, and the site's values naming them."""

    def __init__(self, gitea: Gitea, folder: Path, prefix: str) -> None:
        self.gitea = gitea
        self.apps = [f"{prefix}-{i:02d}" for i in range(APPS)]
        values = merge(
            load_site(env={}).to_values(),
            {"gitea": {"url": gitea.url}},
        )
        values["apps"] = [
            {
                "name": app,
                "image": app,
                "context": f"apps/{app}",
                "writeback": {"kind": "kustomize-images", "repo": CODE_REPO, "path": _target(app)},
            }
            for app in self.apps
        ]
        self.values = folder / "site.yaml"
        self.values.write_text(yaml.safe_dump(values))

    def push(self, message: str) -> tuple[str, str]:
        """A commit touching every app's folder; the branch before it, and it."""
        before = self.head()
        after = self.gitea.commit(
            CODE_REPO,
            BRANCH,
            {f"apps/{app}/Dockerfile": f"FROM scratch\n# {message}\n" for app in self.apps},
            message,
        )
        return before, after

    def head(self) -> str:
        with self.gitea.admin() as admin:
            return str(admin.get(f"/repos/{CODE_REPO}/branches/{BRANCH}").json()["commit"]["id"])

    def commits_after(self, sha: str) -> list[dict[str, Any]]:
        with self.gitea.admin() as admin:
            listed = admin.get(
                f"/repos/{CODE_REPO}/commits",
                params={"sha": BRANCH, "not": sha, "limit": 50, "stat": "false"},
            )
        assert listed.status_code == 200, listed.text
        return list(listed.json())

    def show(self, path: str) -> str:
        with self.gitea.admin() as admin:
            return str(admin.get(f"/repos/{CODE_REPO}/raw/{path}", params={"ref": BRANCH}).text)

    @contextmanager
    def proposing(self) -> Iterator[None]:
        """The apps take pull requests meanwhile (the planner's commands read the file)."""
        kept = self.values.read_text()
        values = yaml.safe_load(kept)
        values["writeback"]["mode"] = "pull-request"
        self.values.write_text(yaml.safe_dump(values))
        try:
            yield
        finally:
            self.values.write_text(kept)

    def open_pulls(self) -> list[dict[str, Any]]:
        with self.gitea.admin() as admin:
            listed = admin.get(f"/repos/{CODE_REPO}/pulls", params={"state": "open"})
        assert listed.status_code == 200, listed.text
        return list(listed.json())

    def show_at(self, path: str, ref: str) -> str:
        with self.gitea.admin() as admin:
            return str(admin.get(f"/repos/{CODE_REPO}/raw/{path}", params={"ref": ref}).text)

    def statuses(self, sha: str) -> dict[str, dict[str, Any]]:
        with self.gitea.admin() as admin:
            listed = admin.get(f"/repos/{CODE_REPO}/commits/{sha}/status", params={"limit": 50})
        return {s["context"]: s for s in listed.json()["statuses"] or []}


@pytest.fixture(scope="module")
def monorepo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monorepo]:
    folder = tmp_path_factory.mktemp("group")
    gitea = Gitea(folder / "gitea", gitea_binary()).start()
    try:
        gitea.repository(CODE_REPO, BRANCH)
        repo = Monorepo(gitea, folder, f"g{uuid.uuid4().hex[:4]}")
        gitea.commit(
            CODE_REPO,
            BRANCH,
            {_target(app): SEED.format(app=app) for app in repo.apps},
            "the apps' deployments",
        )
        yield repo
    finally:
        gitea.stop()


@pytest.fixture(scope="module")
def planner(
    cluster: Cluster, applied: Path, monorepo: Monorepo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Planner]:
    """The push Workflows' pods, each played as it comes, in the background."""
    played = Planner(
        cluster,
        CONTROL,
        monorepo.values,
        {"FABRIQUE_GITEA_TOKEN": monorepo.gitea.token},
        tmp_path_factory.mktemp("planner"),
    ).start()
    try:
        yield played
    finally:
        played.stop()


def _push_workflow(cluster: Cluster, before: str, after: str) -> str:
    """The push's Workflow, as the Sensor's trigger makes it."""
    name = f"{PUSH_PREFIX}{after[:12]}-{before[:12]}"
    body = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name, "namespace": CONTROL},
        "spec": {
            "workflowTemplateRef": {"name": PUSH_TEMPLATE},
            "arguments": {
                "parameters": [
                    {"name": "before", "value": before},
                    {"name": "after", "value": after},
                ]
            },
        },
    }
    answer = cluster.create(f"{ARGO}/namespaces/{CONTROL}/workflows", body)
    assert answer.status == 201, answer.message
    return name


def _builds(cluster: Cluster, push: str) -> list[dict[str, Any]]:
    return cluster.items(f"{ARGO}/namespaces/{BUILD_NS}/workflows", f"fabrique.io/push={push}")


def _run_builds(
    cluster: Cluster, monorepo: Monorepo, push: str, after: str, failing: str | None = None
) -> dict[str, str]:
    """Each build of the push, its pod played: its digest verified and reported, or
    (``failing``) its build failing and the failure reported. The digests reported."""

    def all_made() -> list[dict[str, Any]] | None:
        found = _builds(cluster, push)
        return found if len(found) == APPS else None

    builds = cluster.wait(f"the {APPS} builds of {push}", all_made, timeout=90)
    digests = {}
    for build in builds:
        name = build["metadata"]["name"]
        app = build["metadata"]["labels"]["fabrique.io/app"]
        parameters = {p["name"]: p["value"] for p in build["spec"]["arguments"]["parameters"]}
        assert parameters["group"] == push and parameters["revision"] == after
        if app == failing:
            walk(cluster, name, [(RUN, 1), ("report-failure", 0)], {"outcome": "none"})
            continue
        digests[app] = _digest(app, after)
        outputs = {"outcome": "grouped", "commit": "", "verify": "", "digest": digests[app]}
        walk(cluster, name, [(RUN, 0)], outputs | {"reason": "changed"})
    return digests


def _written(cluster: Cluster, planner: Planner, push: str) -> str:
    """The push's Workflow Succeeded; what its write-back step printed."""
    cluster.wait(
        f"{push} Succeeded", lambda: phase(cluster, CONTROL, push) == "Succeeded" or None, 180
    )
    (write,) = [
        done
        for pod, done in planner.played.items()
        if pod.startswith(push) and "writeback-group" in done.args
    ]
    assert write.returncode == 0, write.stderr
    return write.stdout


def test_a_push_touching_twenty_apps_writes_one_commit_naming_them_all(
    cluster: Cluster, monorepo: Monorepo, planner: Planner
) -> None:
    before, after = monorepo.push("a shared base image, under every app")
    push = _push_workflow(cluster, before, after)
    digests = _run_builds(cluster, monorepo, push, after)
    said = _written(cluster, planner, push)
    assert f"{APPS} build(s) of the push: {APPS} changed" in said, said
    (commit,) = monorepo.commits_after(after)
    message = commit["commit"]["message"]
    assert message.startswith(f"fabrique: deploy {APPS} images into {APPS} files of {CODE_REPO}")
    for app, digest in digests.items():
        assert f"App: {app}\n" in message and f"Digest: {digest}\n" in message
        assert f"digest: {digest}" in monorepo.show(_target(app))
    statuses = monorepo.statuses(after)
    for app in monorepo.apps:
        status = statuses[f"fabrique/{app}"]
        assert status["status"] == "success", status
        assert status["description"].startswith(f"deployed {digests[app]}; changed, commit ")


def test_a_push_whose_one_build_fails_writes_the_other_nineteen(
    cluster: Cluster, monorepo: Monorepo, planner: Planner
) -> None:
    before, after = monorepo.push("the shared base again; one app's build breaks")
    failing = monorepo.apps[7]
    push = _push_workflow(cluster, before, after)
    digests = _run_builds(cluster, monorepo, push, after, failing=failing)
    said = _written(cluster, planner, push)
    assert f"left out: {failing}: build fabrique-{failing}-{after[:12]} failed" in said, said
    assert f"{APPS} build(s) of the push: {APPS - 1} changed, 1 left out" in said, said
    (commit,) = monorepo.commits_after(after)
    message = commit["commit"]["message"]
    assert message.startswith(f"fabrique: deploy {APPS - 1} images")
    assert f"App: {failing}\n" not in message
    assert after[:12] not in monorepo.show(_target(failing))
    for app, digest in digests.items():
        assert f"digest: {digest}" in monorepo.show(_target(app))
    # the others' success; the failed one's is its exit handler's to post (kwok runs none)
    statuses = monorepo.statuses(after)
    assert json.dumps(sorted(s for s in statuses if statuses[s]["status"] == "success")) == (
        json.dumps(sorted(f"fabrique/{a}" for a in digests))
    )


def test_a_push_touching_twenty_apps_that_take_pull_requests_opens_one(
    cluster: Cluster, monorepo: Monorepo, planner: Planner
) -> None:
    with monorepo.proposing():
        before, after = monorepo.push("the shared base, proposed for review")
        push = _push_workflow(cluster, before, after)
        digests = _run_builds(cluster, monorepo, push, after)
        said = _written(cluster, planner, push)
    assert f"{APPS} build(s) of the push: {APPS} proposed" in said, said
    assert monorepo.commits_after(after) == [], "the base waits for the merge"
    (pull,) = monorepo.open_pulls()
    head = f"fabrique/push.{after[:12]}.{BRANCH}"
    assert pull["head"]["ref"] == head and pull["base"]["ref"] == BRANCH
    assert pull["title"].startswith(f"fabrique: deploy {APPS} images into {APPS} files")
    statuses = monorepo.statuses(after)
    for app, digest in digests.items():
        assert f"App: {app}\n" in pull["body"] and f"Digest: {digest}\n" in pull["body"]
        assert f"digest: {digest}" in monorepo.show_at(_target(app), head)
        # its status says so, and its record names the one pull request
        assert statuses[f"fabrique/{app}"]["description"].startswith(f"built {digest}; proposed")
        assert statuses[f"proposal: fabrique/{app}"]["target_url"] == pull["html_url"]
