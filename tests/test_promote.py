"""`fabrique promote`: bench before prod, by the same digest.

Against the Gitea double (a real bare repository), the real loopback registry and the
Kubernetes API double holding bench's Argo CD Application, its status as Argo CD writes
it. Each refusal is one line, exit 8, and nothing is written: no commit, no status.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from fabrique.decisions.holds import read_hold
from fabrique.site.config import load_site

from .conftest import GITEA_TOKEN, KUSTOMIZATION, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .oci import push_image
from .servers import Registry
from .test_rollback import _built, fab

APP_FILE = "dataops/citation-dagster/app.txt"
BENCH = "dataops/citation-dagster/deploy/overlays/bench/kustomization.yaml"
PROD = KUSTOMIZATION
CHECK = "bench/scenario-34"


@pytest.fixture()
def values(tmp_path: Path, gitea: GiteaDouble, registry: Registry) -> Path:
    """The site with citation on bench (the build's target) then prod."""
    app = load_site(env={}).to_values()["apps"][0]
    app["writeback"] = {**app["writeback"], "path": BENCH, "create": True}
    app["environments"] = [
        {"name": "bench", "target": "bench", "checks": [CHECK]},
        {"name": "prod", "target": "prod", "writeback": {"repo": "atlas/atlas", "path": PROD}},
    ]
    return write_values(
        tmp_path / "site.yaml",
        **{
            "gitea.url": gitea.url,
            "registry.host": registry.host,
            "targets": {"bench": {"context": "bench"}, "prod": {"context": "cluster-prod"}},
            "apps": [app],
        },
    )


@pytest.fixture()
def env(tmp_path: Path, kube: KubeApiDouble) -> dict[str, str]:
    return {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig", context="bench")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }


def _pin(code_repo: Repo, path: str) -> dict[str, Any]:
    images = yaml.safe_load(code_repo.show(path))["images"]
    return next(e for e in images if e["name"] == "citation-dagster")


def _application(
    kube: KubeApiDouble, sync: str, health: str, images: list[str], name: str = "citation"
) -> None:
    kube.applications[("argocd", name)] = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd"},
        "status": {
            "sync": {"status": sync, "revision": "0" * 40},
            "health": {"status": health},
            "summary": {"images": images},
        },
    }


def _statuses(gitea: GiteaDouble, revision: str) -> list[dict[str, Any]]:
    """Every status posted on ``revision``, oldest first, ``state`` as posted."""
    return [{**s, "state": s["status"]} for s in gitea.statuses.get(("atlas/atlas", revision), [])]


def _post(
    gitea: GiteaDouble, revision: str, context: str, state: str, description: str = ""
) -> None:
    """What the bench's own checks post."""
    body = {"context": context, "state": state, "description": description}
    made = gitea._create_status("atlas/atlas", revision, body)
    assert made[0] == 201


def _passed(gitea: GiteaDouble, revision: str, digest: str) -> None:
    """Bench's checks, and its verification after the deploy (``fabrique verify``)."""
    _post(gitea, revision, CHECK, "success")
    verified = f"verified in bench: {digest}"
    _post(gitea, revision, "fabrique/citation/bench/verified", "success", verified)


def test_promote_gives_prod_the_digest_that_passed_on_the_bench_and_refuses_until_then(
    values: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
) -> None:
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    reference = f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"
    prod_before = code_repo.show(PROD)
    head = code_repo.head()

    def refused(expected: str, *more: str) -> None:
        result = fab(values, env, "promote", "--app", "citation", "--to", "prod", *more)
        assert result.exit_code == 8, result.stdout + result.stderr
        assert result.stderr.strip() == f"error: {expected}", result.stderr
        assert result.stdout == ""
        assert code_repo.head() == head and code_repo.show(PROD) == prod_before
        assert not any(s["context"] == "fabrique/citation/prod" for s in _statuses(gitea, revision))

    application = "bench: Application argocd/citation (context bench)"
    refused(f"{application}: not found")
    _application(kube, "OutOfSync", "Healthy", [reference])
    refused(f"{application} is OutOfSync, not Synced")
    _application(kube, "Synced", "Progressing", [reference])
    refused(f"{application} is Progressing, not Healthy")
    _application(kube, "Synced", "Healthy", ["registry:80/citation-dagster:old@sha256:" + "a" * 64])
    refused(
        f"{application} runs no pod of {reference} (its pods' images: "
        f"registry:80/citation-dagster:old@sha256:{'a' * 64})"
    )
    _application(kube, "Synced", "Healthy", [reference, "docker.io/library/postgres:16.4"])
    on = f"atlas/atlas@{revision[:12]}"
    refused(f"bench: commit status {CHECK} on {on}: none posted")
    _post(gitea, revision, CHECK, "failure")
    refused(f"bench: commit status {CHECK} on {on} is failure")
    _post(gitea, revision, CHECK, "success")
    verified = "fabrique/citation/bench/verified"
    refused(
        f"bench: {digest} is not verified there ({verified} on {on}: none posted); "
        "fabrique verify --app citation --env bench looks"
    )
    _post(gitea, revision, verified, "failure", f"failed in bench: {digest}: crash loop")
    refused(
        f"bench: {digest} is not verified there ({verified} on {on}: failure: failed in "
        f"bench: {digest}: crash loop); fabrique verify --app citation --env bench looks"
    )
    _passed(gitea, revision, digest)
    refused(
        f"--revision {'f' * 12}: bench deploys {revision[:12]} ({digest}), not {'f' * 12}: "
        "only what runs there may be promoted",
        "--revision",
        "f" * 12,
    )

    # status: what each environment deploys, and what waits for prod
    shown = fab(values, env, "status", "--app", "citation")
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == (
        f"citation: bench {revision[:12]} ({digest[:19]}, verified), prod - (-); "
        f"waiting for promotion to prod: {revision[:12]}"
    )

    # a dry run checks and shows; it writes nothing
    dry = fab(values, env, "promote", "--app", "citation", "--to", "prod", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert any(line.startswith("+") and digest in line for line in dry.stdout.splitlines())
    assert dry.stdout.rstrip().endswith("(dry run)")
    assert code_repo.head() == head

    result = fab(
        values, env, "promote", "--app", "citation", "--to", "prod", "--revision", revision[:12]
    )
    assert result.exit_code == 0, result.stderr
    promoted = code_repo.head()
    assert result.stdout.strip() == (
        f"promoted: citation {reference} -> prod atlas/atlas@main:{PROD} (commit {promoted})"
    )
    # byte for byte the bench's pin: tag and digest, the other images as they were
    assert _pin(code_repo, PROD) == _pin(code_repo, BENCH)
    assert {"name": "postgres", "newTag": "16.4"} in yaml.safe_load(code_repo.show(PROD))["images"]
    message = code_repo.git("log", "-1", "--format=%B", "main")
    assert message.startswith(
        f"fabrique: promote citation-dagster {revision[:12]} for citation to prod"
    )
    assert f"Digest: {digest}" in message and "Promoted-From: bench" in message
    assert code_repo.git("diff", "--stat", "main~1", "main").count("|") == 1, "one file"
    posted = [s for s in _statuses(gitea, revision) if s["context"] == "fabrique/citation/prod"]
    assert [(s["state"], s["description"]) for s in posted] == [
        ("success", f"promoted to prod: {digest}")
    ]

    shown = fab(values, env, "status", "--app", "citation", "--output", "json")
    assert shown.exit_code == 0, shown.stderr
    (entry,) = json.loads(shown.stdout)
    # prod's file lies under the app's context: a promotion changes no source, so the
    # wanted commit is still the one built, not the promotion's (no rebuild, ever)
    assert (entry["state"], entry["facts"]["want"]) == ("ok", revision), entry["detail"]
    # bench verified it (its checks' job said so); prod runs it, not looked at yet
    assert entry["environments"] == [
        {"environment": env_name, "tag": revision[:12], "digest": digest, "waiting": None,
         "verified": verified}
        for env_name, verified in (("bench", "verified"), ("prod", "not verified"))
    ]  # fmt: skip

    # an operator holds prod: a promotion says held and writes nothing, until released
    held = fab(
        values, env, "hold", "--app", "citation", "--env", "prod", "--reason", "freeze",
        "--by", "alice",
    )  # fmt: skip
    assert held.exit_code == 0, held.stderr
    assert held.stdout.startswith("held: citation held by alice"), held.stdout
    assert f"atlas/atlas@main:{PROD}" in held.stdout
    assert read_hold(code_repo.show(BENCH), BENCH, "citation") is None  # bench moves on
    newer, newer_digest = _built(code_repo, registry, gitea.url, "v2\n", values, env)
    _passed(gitea, newer, newer_digest)
    newer_ref = f"{registry.host}/citation-dagster:{newer[:12]}@{newer_digest}"
    _application(kube, "Synced", "Healthy", [newer_ref])
    frozen = code_repo.head()
    result = fab(values, env, "promote", "--app", "citation", "--to", "prod")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("held: citation is held by alice"), result.stdout
    assert code_repo.head() == frozen and _pin(code_repo, PROD)["digest"] == digest
    released = fab(values, env, "release", "--app", "citation", "--env", "prod", "--by", "alice")
    assert released.exit_code == 0 and released.stdout.startswith("released: citation"), (
        released.stdout
    )
    result = fab(values, env, "promote", "--app", "citation", "--to", "prod")
    assert result.exit_code == 0 and result.stdout.startswith("promoted: "), (
        result.stdout + result.stderr
    )
    assert _pin(code_repo, PROD)["digest"] == newer_digest
    revision, digest, promoted = newer, newer_digest, code_repo.head()

    # a replay changes nothing: no commit, no new status
    again = fab(values, env, "promote", "--app", "citation", "--to", "prod")
    assert again.exit_code == 0, again.stderr
    assert again.stdout.startswith("unchanged: citation already deploys ")
    assert code_repo.head() == promoted
    assert (
        len([s for s in _statuses(gitea, revision) if s["context"] == "fabrique/citation/prod"])
        == 1
    )


def test_an_older_digest_never_replaces_a_newer_one_in_prod(
    values: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
) -> None:
    old, old_digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    new, new_digest = _built(code_repo, registry, gitea.url, "v2\n", values, env)
    for revision in (old, new):
        _passed(gitea, revision, old_digest if revision == old else new_digest)
    ref = f"{registry.host}/citation-dagster:{new[:12]}@{new_digest}"
    _application(kube, "Synced", "Healthy", [ref])
    assert fab(values, env, "promote", "--app", "citation", "--to", "prod").exit_code == 0
    head = code_repo.head()
    # the bench is rolled back to the old image (and held): promoting it is superseded
    back = fab(values, env, "rollback", "--app", "citation", "--to", old, "--by", "alice")
    assert back.exit_code == 0, back.stderr
    _application(
        kube, "Synced", "Healthy", [f"{registry.host}/citation-dagster:{old[:12]}@{old_digest}"]
    )
    result = fab(values, env, "promote", "--app", "citation", "--to", "prod")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"superseded: citation deployed revision {new}"), result.stdout
    assert _pin(code_repo, PROD)["digest"] == new_digest
    assert code_repo.head() != head  # the rollback's commit, on bench
    assert code_repo.git("log", "-1", "--format=%s", "main").startswith(
        "fabrique: roll citation back"
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--to", "bench"), "--to bench: the first environment of citation; the build writes it"),
        (("--to", "staging"), "--to 'staging': not an environment of citation (its: bench, prod)"),
        (("--to", "prod", "--revision", "HEAD"), "--revision 'HEAD': must be a commit id"),
    ],
)
def test_a_bad_promotion_is_refused_with_what_is_wrong(
    values: Path,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
    args: tuple[str, ...],
    expected: str,
) -> None:
    result = fab(values, env, "promote", "--app", "citation", *args)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {expected}"), result.stderr


def test_an_app_without_environments_has_nothing_to_promote(
    gitea: GiteaDouble, registry: Registry, env: dict[str, str], tmp_path: Path
) -> None:
    values = write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url})
    result = fab(values, env, "promote", "--app", "citation", "--to", "prod")
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "error: --to 'prod': not an environment of citation (its: none)"
    )


@pytest.mark.parametrize(
    ("environments", "expected"),
    [
        (
            [{"name": "bench", "target": "prod", "writeback": {"repo": "a/b", "path": "k.yaml"}}],
            "environments[0].writeback: the first environment's target is the app's writeback",
        ),
        (
            [{"name": "bench", "target": "prod"}, {"name": "prod", "target": "prod"}],
            "environments[1].writeback: required",
        ),
        (
            [
                {"name": "bench", "target": "prod"},
                {"name": "bench", "target": "prod", "writeback": {"repo": "a/b", "path": "k.yaml"}},
            ],
            "environments[1].name: duplicate environment 'bench'",
        ),
        (
            [
                {"name": "bench", "target": "prod"},
                {
                    "name": "prod",
                    "target": "prod",
                    "writeback": {"repo": "atlas/atlas", "path": KUSTOMIZATION},
                },
            ],
            f"environments[1].writeback: atlas/atlas:{KUSTOMIZATION} is already another",
        ),
        (
            [{"name": "bench", "target": "prod", "promote": "auto"}],
            "environments[0].promote: nothing comes before the first environment",
        ),
        (
            [
                {"name": "bench", "target": "prod"},
                {
                    "name": "prod",
                    "target": "prod",
                    "promote": "auto",
                    "application": "argocd/citation-prod",
                    "namespace": "dagster-prod",
                    "writeback": {"repo": "a/b", "path": "k.yaml"},
                },
            ],
            "apps[0].environments[1].promote: auto needs targets.prod.inCluster: true: the "
            "safety net reads bench's Application in the cluster it runs in",
        ),
        (
            [
                {"name": "bench", "target": "prod"},
                {"name": "prod", "target": "prod", "writeback": {"repo": "a/b", "path": "k.yaml"}},
            ],
            "apps[0].environments[1].application: argocd/citation is already bench's, in the "
            "same cluster (context cluster-prod): name another",
        ),
        (
            [
                {"name": "bench", "target": "prod"},
                {
                    "name": "prod",
                    "target": "prod",
                    "application": "argocd/citation-prod",
                    "writeback": {"repo": "a/b", "path": "k.yaml"},
                },
            ],
            "apps[0].environments[1].namespace: dagster is already where bench runs, in the "
            "same cluster (context cluster-prod): name another",
        ),
        (
            [{"name": "bench", "target": "staging"}],
            "apps[0].environments[0].target: 'staging' is not a key of targets (its: prod)",
        ),
    ],
)
def test_environments_are_checked_in_the_config(
    tmp_path: Path, environments: list[dict[str, Any]], expected: str
) -> None:
    app = load_site(env={}).to_values()["apps"][0]
    app["environments"] = environments
    values = write_values(tmp_path / "site.yaml", apps=[app])
    result = run_cli("--values", str(values), "render", "--out", str(tmp_path / "m"))
    assert result.exit_code == 2, result.stdout
    assert expected in result.stderr.splitlines()[0], result.stderr


def test_an_image_that_does_not_say_it_was_built_here_is_not_promoted(
    values: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
) -> None:
    """A pin in Git is no proof: bench's digest, Healthy there, whose labels name no
    commit of this factory, goes no further."""
    revision = code_repo.commit({APP_FILE: "unlabelled\n"})
    digest = push_image(registry.url, "citation-dagster", revision[:12], {"app.txt": b"x"})
    step = fab(
        values, env, "writeback", "--app", "citation", "--revision", revision, "--digest", digest
    )
    assert step.stdout.startswith("changed: "), step.stdout + step.stderr
    _passed(gitea, revision, digest)
    _application(kube, "Synced", "Healthy", [f"{registry.host}/citation-dagster:x@{digest}"])
    head = code_repo.head()
    result = fab(values, env, "promote", "--app", "citation", "--to", "prod")
    assert result.exit_code == 8, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and "label" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert code_repo.head() == head


def _auto(values: Path) -> None:
    """The site of ``values`` with prod promoted by the safety net, bench's Argo CD in
    the cluster fabrique runs in."""
    site = yaml.safe_load(values.read_text())
    site["targets"]["bench"]["inCluster"] = True
    site["apps"][0]["environments"][1]["promote"] = "auto"
    values.write_text(yaml.safe_dump(site))


def _lines(result: Any, name: str) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith(f"{name}: ")]


def test_the_safety_net_promotes_into_an_auto_environment_what_passed_before_it(
    values: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
) -> None:
    _auto(values)
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    reference = f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"
    prod_before, head = code_repo.show(PROD), code_repo.head()
    application = "bench: Application argocd/citation (context bench)"

    def waits(expected: str) -> None:
        result = fab(values, env, "reconcile")
        assert result.exit_code == 0, result.stdout + result.stderr
        assert _lines(result, "citation/prod") == [
            f"citation/prod: waiting: {revision[:12]} from bench: {expected}"
        ]
        assert code_repo.head() == head and code_repo.show(PROD) == prod_before

    waits(f"{application}: not found")
    _application(kube, "Synced", "Progressing", [reference])
    waits(f"{application} is Progressing, not Healthy")
    _application(kube, "Synced", "Healthy", [reference])
    waits(f"bench: commit status {CHECK} on atlas/atlas@{revision[:12]}: none posted")
    _passed(gitea, revision, digest)

    dry = fab(values, env, "reconcile", "--dry-run")
    assert _lines(dry, "citation/prod") == [
        f"citation/prod: would-promote: {reference} from bench -> atlas/atlas@main:{PROD}"
    ]
    assert code_repo.head() == head

    counts = values.parent / "counts"
    result = fab(values, env, "reconcile", "--counts", str(counts))
    assert result.exit_code == 0, result.stdout + result.stderr
    promoted = code_repo.head()
    assert _lines(result, "citation/prod") == [
        f"citation/prod: promoted: {reference} from bench -> atlas/atlas@main:{PROD} "
        f"(commit {promoted})"
    ]
    assert _lines(result, "citation") == [f"citation: ok: deploys {revision[:12]} (want "
                                           f"{revision[:12]})"]  # fmt: skip
    assert result.stdout.splitlines()[-1] == "reconcile: 2 app(s): 1 ok, 1 promoted"
    assert (counts / "promoted").read_text() == "1" and (counts / "waiting").read_text() == "0"
    assert _pin(code_repo, PROD) == _pin(code_repo, BENCH)
    assert "Promoted-From: bench" in code_repo.git("log", "-1", "--format=%B", "main")
    posted = [s for s in _statuses(gitea, revision) if s["context"] == "fabrique/citation/prod"]
    assert [s["state"] for s in posted] == ["success"]

    # a replay: prod deploys what bench does, nothing is asked of the cluster or written
    del kube.applications[("argocd", "citation")]
    again = fab(values, env, "reconcile")
    assert again.exit_code == 0, again.stderr
    assert _lines(again, "citation/prod") == []
    assert code_repo.head() == promoted


def test_an_auto_promotion_reads_its_application_by_name_and_nothing_else(
    values: Path, tmp_path: Path
) -> None:
    _auto(values)
    out = tmp_path / "tree"
    assert run_cli("--values", str(values), "render", "--out", str(out)).exit_code == 0
    docs = list(yaml.safe_load_all((out / "reconcile/rbac.yaml").read_text()))
    role = next(d for d in docs if d["metadata"]["name"] == "fabrique-reconciler-read-applications")
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "argocd"
    assert role["rules"] == [
        {
            "apiGroups": ["argoproj.io"],
            "resources": ["applications"],
            "resourceNames": ["citation"],
            "verbs": ["get"],
        }
    ]
    assert run_cli("validate", str(out)).exit_code == 0


def test_seed_gives_each_environment_of_its_cluster_an_application_and_prod_none_before_a_promotion(
    values: Path,
    code_repo: Repo,
    apps_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    site = yaml.safe_load(values.read_text())
    site["apps"][0]["application"] |= {
        "path": "apps/citation-seeded.yaml",
        "sourcePath": BENCH.rsplit("/", 1)[0],
    }
    values.write_text(yaml.safe_dump(site))
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    seeding = {**env, "FABRIQUE_WEBHOOK_TOKEN": "bearer-seed-19ab"}
    prod = {
        **seeding,
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "prod", context="cluster-prod")),
    }

    def seed(where: dict[str, str], target: str) -> list[str]:
        result = fab(values, where, "seed", "--app", "citation", "--target", target, "--yes")
        assert result.exit_code == 0, result.stdout + result.stderr
        return [line.split(" (")[0] for line in result.stdout.splitlines() if ": " in line]

    assert seed(env | seeding, "bench")[-7:] == [
        "registry-name: skipped",
        "image: unchanged",
        "write-back bench: unchanged",
        "secrets: skipped",
        "webhook: changed",
        "argo-cd-webhook: missing",
        "application bench: changed",
    ]
    bench_app = yaml.safe_load(apps_repo.show("apps/citation-seeded.yaml"))
    assert (bench_app["metadata"], bench_app["spec"]["source"]["path"]) == (
        {"name": "citation", "namespace": "argocd",
         "finalizers": ["resources-finalizer.argocd.argoproj.io"]},
        BENCH.rsplit("/", 1)[0],
    )  # fmt: skip

    # prod deploys nothing promote wrote: seed there writes nothing and says what to do
    head = apps_repo.head()
    refused = fab(values, prod, "seed", "--app", "citation", "--target", "prod", "--yes")
    assert refused.exit_code == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().endswith(
        "promote into it first (fabrique promote --app citation --to prod); nothing was written"
    ), refused.stderr
    assert apps_repo.head() == head

    reference = f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"
    _application(kube, "Synced", "Healthy", [reference])
    _passed(gitea, revision, digest)
    assert fab(values, env, "promote", "--app", "citation", "--to", "prod").exit_code == 0
    assert seed(prod, "prod")[-6:] == [
        "registry-name: skipped",
        "promoted prod: unchanged",
        "secrets: skipped",
        "webhook: unchanged",
        "argo-cd-webhook: missing",
        "application prod: changed",
    ]
    prod_app = yaml.safe_load(apps_repo.show("apps/citation-seeded-prod.yaml"))
    assert prod_app["metadata"]["name"] == "citation"
    assert prod_app["spec"]["source"]["path"] == PROD.rsplit("/", 1)[0]
    assert prod_app["spec"]["destination"]["namespace"] == "dagster"

    # a replay, on each cluster: nothing changes
    heads = (code_repo.head(), apps_repo.head())
    assert {line.split(": ")[1] for line in seed(env | seeding, "bench")[-7:]} <= {
        "unchanged", "skipped", "missing"
    }  # fmt: skip
    assert {line.split(": ")[1] for line in seed(prod, "prod")[-6:]} <= {
        "unchanged", "skipped", "missing"
    }  # fmt: skip
    assert (code_repo.head(), apps_repo.head()) == heads


def test_seed_of_a_cluster_holding_bench_and_prod_seeds_bench_and_skips_prod_until_promoted(
    values: Path,
    code_repo: Repo,
    apps_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    env: dict[str, str],
) -> None:
    site = yaml.safe_load(values.read_text())
    site["apps"][0]["application"]["path"] = "apps/citation-seeded.yaml"
    site["apps"][0]["environments"][1] |= {
        "target": "bench",
        "application": "argocd/citation-prod",
        "namespace": "dagster-prod",
    }
    values.write_text(yaml.safe_dump(site))
    _built(code_repo, registry, gitea.url, "v1\n", values, env)
    result = fab(
        values, {**env, "FABRIQUE_WEBHOOK_TOKEN": "bearer-seed-19ab"},
        "seed", "--app", "citation", "--target", "bench", "--yes",
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert (
        "application bench: changed (created cluster/apps@main:apps/citation-seeded.yaml)" in lines
    )
    assert "application prod: skipped (no promotion yet)" in lines
    skipped = next(line for line in lines if line.startswith("promoted prod: "))
    assert skipped.startswith("promoted prod: skipped (prod: ") and skipped.endswith(
        "promote into it first (fabrique promote --app citation --to prod))"
    ), skipped
    assert "apps/citation-seeded-prod.yaml" not in apps_repo.git(
        "ls-tree", "-r", "--name-only", "main"
    )


def _through_review(values: Path, gitea: GiteaDouble) -> None:
    """The site of ``values`` with prod's target taking pins through pull requests that
    Gitea merges once ``ci/lint`` is green on their head (bench's still by commit)."""
    site = yaml.safe_load(values.read_text())
    site["apps"][0]["environments"][1]["writeback"]["mode"] = "pull-request"
    site.setdefault("writeback", {})["pullRequest"] = {"autoMerge": True}
    values.write_text(yaml.safe_dump(site))
    gitea.protect("atlas/atlas", "main", checks=["ci/lint"])
    gitea.protected.pop(("atlas/atlas", "main"))  # the required check only: fabrique may push


def _lint(gitea: GiteaDouble, pull: dict[str, Any]) -> None:
    """CI passes on the pull request's head: Gitea merges it if it is scheduled."""
    head = gitea._resolve("atlas/atlas", f"refs/heads/{pull['head']}") or pull["head_sha"]
    made = gitea._create_status("atlas/atlas", head, {"context": "ci/lint", "state": "success"})
    assert made[0] == 201


class _ProdProposal(NamedTuple):
    old: str
    old_digest: str
    new: str
    new_digest: str
    prod_before: str  # prod's target before the promotion
    pull: dict[str, Any]  # prod's pull request, in the double


def _prod_proposes_v2(
    values: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
) -> _ProdProposal:
    """prod through review; v1 then v2 built, v2 passed on the bench, and ``fabrique
    promote`` proposes it to prod."""
    _through_review(values, gitea)
    old, old_digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    new, new_digest = _built(code_repo, registry, gitea.url, "v2\n", values, env)
    _passed(gitea, new, new_digest)
    _application(
        kube, "Synced", "Healthy", [f"{registry.host}/citation-dagster:{new[:12]}@{new_digest}"]
    )
    prod_before = code_repo.show(PROD)
    proposed = fab(values, env, "promote", "--app", "citation", "--to", "prod")
    assert proposed.stdout.startswith("proposed: citation "), proposed.stdout + proposed.stderr
    (pull,) = gitea.pulls["atlas/atlas"]
    return _ProdProposal(old, old_digest, new, new_digest, prod_before, pull)


@pytest.mark.parametrize("gesture", ["rollback", "revert-and-hold"])
def test_a_bench_rolled_back_cancels_prods_pending_proposal_of_what_it_left(
    values: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
    gesture: str,
) -> None:
    """prod's pull request proposes the bench's digest, its merge scheduled until CI
    passes; the bench is then taken back from that digest (a rollback, or a revert by hand
    and a hold). prod's proposal is closed and its merge cancelled: CI passing later merges
    nothing, and prod never gets the digest the bench left."""
    old, old_digest, new, new_digest, prod_before, pull = _prod_proposes_v2(
        values, code_repo, gitea, registry, kube, env
    )
    assert pull["head"] == "fabrique/citation.prod" and pull["scheduled"] == "merge"

    if gesture == "rollback":
        back = fab(values, env, "rollback", "--app", "citation", "--env", "bench", "--to", old)
        assert back.exit_code == 0 and back.stdout.startswith("rolled back: "), (
            back.stdout + back.stderr
        )
    else:
        text = code_repo.show(BENCH).replace(new[:12], old[:12]).replace(new_digest, old_digest)
        code_repo.commit({BENCH: text}, "revert the bench to v1 by hand")
        held = fab(values, env, "hold", "--app", "citation", "--env", "bench", "--by", "alice")
        assert held.exit_code == 0 and held.stdout.startswith("held: "), held.stdout + held.stderr
    assert _pin(code_repo, BENCH)["digest"] == old_digest
    assert (pull["state"], pull["scheduled"]) == ("closed", None), "prod's proposal withdrawn"
    assert pull["body"].startswith("**Closed by fabrique: citation is held in bench ")
    assert new_digest in pull["body"].split("\n")[0]

    _lint(gitea, pull)
    assert not pull["merged"] and code_repo.show(PROD) == prod_before


def test_a_held_bench_keeps_prods_pending_proposal_of_what_it_still_deploys(
    values: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
) -> None:
    """A hold says "stay on this one": prod's proposal of the very digest the bench is
    held on stays open, its merge scheduled."""
    _through_review(values, gitea)
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    _passed(gitea, revision, digest)
    _application(
        kube, "Synced", "Healthy", [f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"]
    )
    assert fab(values, env, "promote", "--app", "citation", "--to", "prod").stdout.startswith(
        "proposed: "
    )
    held = fab(values, env, "hold", "--app", "citation", "--env", "bench", "--by", "alice")
    assert held.exit_code == 0, held.stderr
    (pull,) = gitea.pulls["atlas/atlas"]
    assert (pull["state"], pull["scheduled"]) == ("open", "merge")
    _lint(gitea, pull)
    assert pull["merged"] and _pin(code_repo, PROD)["digest"] == digest


def test_an_auto_promotion_through_a_pull_request_says_promoted_once_it_merged(
    values: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
) -> None:
    """The pass proposes prod's pin; Gitea merges it once CI is green. The next pass sees
    prod deploy the bench's digest and posts ``promoted to prod`` on the built commit,
    once: a pass after it posts nothing and says nothing."""
    _auto(values)
    _through_review(values, gitea)
    revision, digest = _built(code_repo, registry, gitea.url, "v1\n", values, env)
    reference = f"{registry.host}/citation-dagster:{revision[:12]}@{digest}"
    _application(kube, "Synced", "Healthy", [reference])
    _passed(gitea, revision, digest)

    def promoted() -> list[tuple[str, str]]:
        posted = [s for s in _statuses(gitea, revision) if s["context"] == "fabrique/citation/prod"]
        return [(s["state"], s["description"]) for s in posted]

    result = fab(values, env, "reconcile")
    assert result.exit_code == 0, result.stdout + result.stderr
    (line,) = _lines(result, "citation/prod")
    assert line.startswith(f"citation/prod: proposed: {reference} from bench -> "), line
    assert promoted() == [], "proposed, not promoted yet"
    (pull,) = gitea.pulls["atlas/atlas"]
    _lint(gitea, pull)
    assert pull["merged"] and _pin(code_repo, PROD)["digest"] == digest

    counts = values.parent / "counts"
    result = fab(values, env, "reconcile", "--counts", str(counts))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert _lines(result, "citation/prod") == [
        f"citation/prod: promoted: {reference} from bench -> atlas/atlas@main:{PROD} "
        f"(its pull request merged)"
    ]
    assert (counts / "promoted").read_text() == "1"
    assert promoted() == [("success", f"promoted to prod: {digest}")]

    again = fab(values, env, "reconcile")
    assert again.exit_code == 0, again.stdout + again.stderr
    assert _lines(again, "citation/prod") == []
    assert promoted() == [("success", f"promoted to prod: {digest}")], "once"


@pytest.mark.parametrize("reverted", [True, False])
def test_a_hold_written_by_hand_withdraws_at_the_next_pass_what_the_bench_left(
    values: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    registry: Registry,
    kube: KubeApiDouble,
    env: dict[str, str],
    reverted: bool,
) -> None:
    """A person holds the bench by writing the annotation into its target (reverting it
    to v1 in the same commit, or not). The next reconcile pass withdraws prod's pending
    proposal of the digest the bench left, its merge cancelled, as ``fabrique hold``
    does; a proposal of the very digest held stays. A pass after it writes nothing more."""
    old, old_digest, new, new_digest, prod_before, pull = _prod_proposes_v2(
        values, code_repo, gitea, registry, kube, env
    )
    assert pull["scheduled"] == "merge"
    before = len(gitea.requests)
    assert fab(values, env, "reconcile").exit_code == 0
    assert [r.path for r in gitea.requests[before:] if "/pulls" in r.path] == [], "not held"

    text = code_repo.show(BENCH)
    if reverted:
        text = text.replace(new[:12], old[:12]).replace(new_digest, old_digest)
    bench = yaml.safe_load(text)
    bench.setdefault("metadata", {})["annotations"] = {"hold.fabrique.io/citation": "INC-42"}
    code_repo.commit({BENCH: yaml.safe_dump(bench, sort_keys=False)}, "hold the bench by hand")

    result = fab(values, env, "reconcile")
    assert result.exit_code == 0, result.stdout + result.stderr
    (line,) = _lines(result, "citation")
    assert line.startswith("citation: held: held by unknown since unknown: INC-42"), line
    if reverted:
        assert line.endswith(f"; closed prod's pull request #{pull['number']}"), line
        assert (pull["state"], pull["scheduled"]) == ("closed", None), "prod's proposal withdrawn"
        first = pull["body"].split("\n")[0]
        assert first.startswith("**Closed by fabrique: citation is held in bench (held by ")
        assert new_digest in first
    else:
        assert "pull request" not in line, line
        assert (pull["state"], pull["scheduled"]) == ("open", "merge")

    before = len(gitea.requests)
    again = fab(values, env, "reconcile")
    assert again.exit_code == 0, again.stdout + again.stderr
    assert "pull request" not in _lines(again, "citation")[0]
    writes = [r for r in gitea.requests[before:] if r.method != "GET"]
    assert [r.path for r in writes if "/pulls" in r.path or "/branches" in r.path] == []

    _lint(gitea, pull)
    assert pull["merged"] != reverted
    assert (code_repo.show(PROD) == prod_before) == reverted
