"""A reconcile pass asks each question once: request counts, counted where they arrive.

20 apps over 3 target files in the code repository, each app changed by a commit of its
own and deployed at it. The counts are the design's (fabrique/decisions/survey.py):

- a pass with no memory: the branch head, one listing per app, one read per file; the
  memory ConfigMap looked for and created; each deployed commit's status read and, since
  none says so yet, its success posted (once: the memory keeps it);
- a pass where nothing changed: the branch head and one read per file; the memory read;
- one app changed: that, plus one listing of the new commits, the registry, the
  Workflow and the commit status of that app, its submission, the memory written;
- its build verified: the write-back's requests and its commit status (read, posted) on
  top of the nothing-changed count.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.clients.gitea import GiteaClient
from fabrique.decisions.workflow import build_workflow
from fabrique.site.config import load_site

from .conftest import GITEA_TOKEN, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble, argo_status
from .doubles.proxy import FaultProxy
from .oci import push_image
from .payloads import kustomization
from .servers import GitDaemon, Registry

NS = "fabrique-build"
CONTROL_NS = "fabrique"
APPS = 20
FILES = 3


def _target(i: int) -> str:
    return f"deploy/group-{i % FILES}/kustomization.yaml"


@dataclass
class World:
    code_repo: Repo
    gitea: GiteaDouble
    kube: KubeApiDouble
    registry: Registry
    registry_host: str
    values: Path
    env: dict[str, str]
    wants: dict[str, str] = field(default_factory=dict)
    registry_requests: list[str] = field(default_factory=list)

    def counts(self) -> tuple[int, int, int]:
        return len(self.gitea.requests), len(self.kube.requests), len(self.registry_requests)

    def reconcile(self) -> tuple[dict[str, str], tuple[int, int, int]]:
        """One pass through the CLI: each app's state, and the requests it made
        (Gitea, Kubernetes, registry)."""
        before = self.counts()
        result = run_cli("--values", str(self.values), "reconcile", env=self.env)
        assert result.exit_code == 0, result.stdout + result.stderr
        after = self.counts()
        states = {}
        for line in result.stdout.splitlines():
            app, _, rest = line.partition(": ")
            if app.startswith("app-"):
                states[app] = rest.split(":")[0]
        return states, (after[0] - before[0], after[1] - before[1], after[2] - before[2])

    def verified(self, app: str, revision: str) -> str:
        """A Succeeded Workflow of ``app`` at ``revision`` that verified a real image."""
        digest = push_image(self.registry.url, app, revision[:12])
        name = f"fabrique-{app}-{revision[:12]}"
        body = build_workflow(load_site(self.values, env={}), app, revision, submitted_by="sensor")
        self.kube.objects[(NS, name)] = {
            **body,
            "status": argo_status(body, "Succeeded", verified=digest),
        }
        return digest


def _pins(host: str, wants: dict[str, str], group: int) -> str:
    images = [
        {
            "name": app,
            "newName": f"{host}/{app}",
            "newTag": want[:12],
            "digest": "sha256:" + f"{i:02d}" * 32,
        }
        for i, (app, want) in enumerate(wants.items())
        if i % FILES == group
    ]
    return kustomization(images)


@pytest.fixture()
def world(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    kube: KubeApiDouble,
    registry: Registry,
) -> Iterator[World]:
    seen: list[str] = []

    def count(method: str, path: str, headers: dict[str, str]) -> None:
        seen.append(f"{method} {path}")

    proxy = FaultProxy(registry.url, count).start()
    try:
        apps = [
            {
                "name": f"app-{i:02d}",
                "image": f"app-{i:02d}",
                "context": f"apps/app-{i:02d}",
                "writeback": {"repo": "atlas/atlas", "path": _target(i)},
            }
            for i in range(APPS)
        ]
        values = write_values(
            tmp_path / "site.yaml",
            **{"gitea.url": gitea.url, "registry.host": proxy.host, "apps": apps},
        )
        env = {
            "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
            "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
        }
        wants = {
            f"app-{i:02d}": code_repo.commit(
                {f"apps/app-{i:02d}/Dockerfile": f"FROM scratch\n# {i}\n"}
            )
            for i in range(APPS)
        }
        code_repo.commit({_target(g): _pins(proxy.host, wants, g) for g in range(FILES)}, "deploy")
        yield World(code_repo, gitea, kube, registry, proxy.host, values, env, wants, seen)
    finally:
        proxy.stop()


def _all(state: str) -> dict[str, str]:
    return {f"app-{i:02d}": state for i in range(APPS)}


def test_requests_grow_with_the_files_not_the_apps(world: World) -> None:
    states, first = world.reconcile()
    assert states == _all("ok")
    # no memory yet: head, 20 listings by path, 3 reads, each app's commit status read and
    # its success posted | memory: looked for, created; the build Workflows listed once
    assert first == (1 + APPS + FILES + 2 * APPS, 3, 0)

    states, again = world.reconcile()
    assert states == _all("ok")
    # head, 3 reads | memory read (unchanged, so not written); the Workflows listed
    assert again == (1 + FILES, 2, 0)
    assert sum(again) / APPS <= 1.2


def test_one_app_changed_costs_its_own_questions_and_its_write_back(world: World) -> None:
    world.reconcile()
    nothing_changed = (1 + FILES, 2, 0)
    assert world.reconcile()[1] == nothing_changed

    revision = world.code_repo.commit({"apps/app-05/src.txt": "v2\n"})
    states, counts = world.reconcile()
    assert states == _all("ok") | {"app-05": "submitted"}
    # + one listing of the new commits, its commit status | + its Workflow read and
    # created, memory written | + its tag asked of the registry
    assert counts == (nothing_changed[0] + 2, nothing_changed[1] + 3, 1)
    assert (NS, f"fabrique-app-05-{revision[:12]}") in world.kube.objects

    digest = world.verified("app-05", revision)
    head = world.code_repo.head()
    states, counts = world.reconcile()
    assert states == _all("ok") | {"app-05": "written-back"}
    # the write-back: the deployed tag resolved, compared with the new one both ways (a
    # compare of 0 commits is no proof of ancestry: unrelated histories answer 0 too),
    # the file PUT; its commit status read, and its success posted
    write_back = 4 + 2
    # | its Workflow read, the memory written (it keeps the success seen) | its tag and
    # its verified digest asked of the registry
    assert counts == (nothing_changed[0] + write_back, nothing_changed[1] + 2, 2)
    assert world.code_repo.git("rev-list", "--count", f"{head}..main").strip() == "1"
    pins = yaml.safe_load(world.code_repo.show(_target(5)))["images"]
    assert next(p for p in pins if p["name"] == "app-05")["digest"] == digest

    states, counts = world.reconcile()
    assert states == _all("ok")
    # the write-back moved the head: one listing, and the memory written
    assert counts == (nothing_changed[0] + 1, nothing_changed[1] + 1, 0)


def test_apps_of_one_repository_written_back_in_one_commit(world: World) -> None:
    world.reconcile()
    changed = ["app-00", "app-03", "app-06", "app-01"]  # three share group 0; one is group 1
    revisions = {app: world.code_repo.commit({f"apps/{app}/src.txt": "v2\n"}) for app in changed}
    digests = {app: world.verified(app, revision) for app, revision in revisions.items()}
    head = world.code_repo.head()
    states, _ = world.reconcile()
    assert states == _all("ok") | {app: "written-back" for app in changed}
    commits = world.code_repo.git("rev-list", "--reverse", f"{head}..main").split()
    assert len(commits) == 1, "one commit per repository and branch, whatever the files"
    touched = world.code_repo.git("show", "--format=", "--name-only", commits[0]).split()
    assert sorted(touched) == [_target(0), _target(1)]
    message = world.code_repo.git("log", "-1", "--format=%B", commits[0])
    assert message.splitlines()[0] == (
        "fabrique: deploy 4 images into 2 files of atlas/atlas (app-00, app-01, app-03 and 1 more)"
    )
    for app in changed:
        assert f"App: {app}\n" in message
        assert f"Source-Revision: {revisions[app]}\n" in message
    pins = {p["name"]: p for p in yaml.safe_load(world.code_repo.show(_target(0)))["images"]}
    for app in ("app-00", "app-03", "app-06"):
        assert pins[app]["digest"] == digests[app]
        assert pins[app]["newTag"] == revisions[app][:12]
    pins = {p["name"]: p for p in yaml.safe_load(world.code_repo.show(_target(1)))["images"]}
    assert pins["app-01"]["digest"] == digests["app-01"]


def _rewind(repo: Repo, commit: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo.bare), "update-ref", "refs/heads/main", commit], check=True
    )


def test_a_branch_that_went_back_is_asked_app_by_app(world: World) -> None:
    """The memory is dropped when the branch no longer descends from its head."""
    world.reconcile()
    before = world.code_repo.head()
    revision = world.code_repo.commit({"apps/app-07/src.txt": "v2\n"})
    states, _ = world.reconcile()
    assert states["app-07"] == "submitted"
    _rewind(world.code_repo, before)  # the commit that moved app-07 is gone
    states, counts = world.reconcile()
    assert states == _all("ok"), "app-07 wants its old commit again, which is deployed"
    # head, the listing, then each app by path; app-07's status, not seen since it moved
    assert counts[0] == 1 + 1 + APPS + FILES + 1
    assert revision not in world.code_repo.git("rev-list", "main")


def test_a_merge_in_the_new_commits_is_asked_app_by_app(world: World) -> None:
    world.reconcile()
    work = world.code_repo.work

    def git(*args: str) -> None:
        subprocess.run(
            [
                "git",
                "-C",
                str(work),
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.invalid",
                *args,
            ],
            check=True,
            capture_output=True,
        )

    git("fetch", "-q", "origin")
    git("checkout", "-q", "-B", "side", "origin/main")
    (work / "apps/app-02/src.txt").write_text("side\n")
    git("add", "-A")
    git("commit", "-qm", "side")
    git("checkout", "-q", "-B", "main", "origin/main")
    (work / "apps/app-09").mkdir(parents=True, exist_ok=True)
    (work / "apps/app-09/src.txt").write_text("main\n")
    git("add", "-A")
    git("commit", "-qm", "main")
    git("merge", "-q", "--no-ff", "-m", "merge", "side")
    git("push", "-q", "origin", "main")
    states, counts = world.reconcile()
    # head, the listing, each app by path, reads; the two changed apps' deployed tags
    # resolved and compared with their wants, as nothing is remembered of them; their
    # commit statuses
    assert counts[0] == 1 + 1 + APPS + FILES + 2 * 2 + 2
    assert states == _all("ok") | {"app-02": "submitted", "app-09": "submitted"}


def _memory(kube: KubeApiDouble) -> dict[str, Any]:
    stored = kube.configmaps[(CONTROL_NS, "fabrique-reconcile-memory")]
    return dict(json.loads(stored["data"]["memory.json"]))


def test_a_changed_context_is_asked_again(world: World, tmp_path: Path) -> None:
    world.reconcile()
    assert _memory(world.kube)["apps"]["app-04"]["want"] == world.wants["app-04"]
    values = yaml.safe_load(world.values.read_text())
    values["apps"][4]["context"] = "apps/app-04/src"
    world.values.write_text(yaml.safe_dump(values))
    states, counts = world.reconcile()
    # head; app-04 by path: no commit there is a 404, and its start checked; reads
    assert counts[0] == 1 + 2 + FILES
    assert states["app-04"] == "ok"
    assert _memory(world.kube)["apps"]["app-04"]["want"] is None


def test_the_git_transport_moves_the_memory_with_one_log(
    world: World, git_daemon: GitDaemon
) -> None:
    values = yaml.safe_load(world.values.read_text())
    values["writeback"] = {"transport": "git", "gitUrl": f"git://127.0.0.1:{git_daemon.port}"}
    world.values.write_text(yaml.safe_dump(values))
    assert world.reconcile()[0] == _all("ok")
    revision = world.code_repo.commit({"apps/app-05/src.txt": "v2\n"})
    states, counts = world.reconcile()
    assert states == _all("ok") | {"app-05": "submitted"}
    assert counts[0] == 1, "git, not the Gitea API, but for the changed app's commit status"
    assert _memory(world.kube)["head"] == revision
    assert _memory(world.kube)["apps"]["app-05"]["want"] == revision


def test_no_commit_on_a_path_is_a_404_in_gitea_and_means_none(gitea: GiteaDouble) -> None:
    """Gitea answers 404, not 200 [], to commits?path= when no commit touches the path
    (FileCommitsCount == 0 in routers/api/v1/repo/commits.go)."""
    with GiteaClient(gitea.url, GITEA_TOKEN) as client:
        gitea.faults.append(("GET", 404))
        assert client.last_change("atlas/atlas", "main", "apps/none", frozenset()) is None
        head = client.branch_head("atlas/atlas", "main")
        gitea.faults.append(("GET", 404))
        assert client.files_changed("atlas/atlas", head, head, "apps/none") == []
        # and the double's own answer for such a path
        assert client.last_change("atlas/atlas", "main", "apps/none", frozenset()) is None


def test_a_remembered_head_gone_from_the_server_is_a_pass_without_memory(world: World) -> None:
    world.reconcile()
    stored = world.kube.configmaps[(CONTROL_NS, "fabrique-reconcile-memory")]
    memory = _memory(world.kube)
    memory["head"] = "0123456789abcdef" * 2 + "01234567"  # no such commit
    stored["data"]["memory.json"] = json.dumps(memory)
    revision = world.code_repo.commit({"apps/app-11/src.txt": "v2\n"})
    states, _ = world.reconcile()
    assert states == _all("ok") | {"app-11": "submitted"}
    assert _memory(world.kube)["head"] == revision
