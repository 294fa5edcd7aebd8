"""Scenario 34 for real: ``bench/scenarios/build-gitops-digest.sh`` with ``STRICT=1``,
run as the README tells a platform team to run it on their bench, against the live
tier's plane with a real node.

The bench is what a platform team's would be, made of the real programs: the plane's
API server, controllers and Argo Workflows controller; a real node (containerd, the
kubelet, kube-proxy, CoreDNS) that runs the build's pods and the app's; the images of
its pods made from Debian packages and the peers, in the plane's registry; the default
site's tree, rendered and applied, with its Secrets; the event path (Argo Events'
controller, JetStream, the EventSource and the Sensor); a real Gitea holding the code
repository (the app's build context and its kustomize overlay) and the apps
repository; Argo CD v3.6.2, whose root Application deploys the apps repository's
Applications. Then the script: webhook #2, a push, the Workflow's pods for real (plan,
checkout, rootless BuildKit, verify-digest, write-back, the onExit status), ``fabrique
seed``, Argo CD syncing the written-back digest, a second push timed from the push to
the pod, and its five gates.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from fabrique.site.config import load_site

from ..conftest import ROOT
from ..waits import until
from . import images
from .argocd import ArgoCD
from .buildkit import builder
from .cluster import Cluster
from .controlplane import (
    ControlPlane,
    app_files,
    hosts_file,
    render,
    resolving,
    scenario,
    serve_site,
    site_names,
    site_values,
)
from .events import CONTROL, SOURCE, ArgoEvents, ServiceProxy, start_event_path
from .fixtures import apply_site
from .forge import SERVICE_HOST
from .gitea import USER, Gitea
from .gitea import binary as gitea_binary

pytestmark = pytest.mark.xdist_group("real-node")

APP = "citation"
CODE_REPO, APPS_REPO, BRANCH = "atlas/atlas", "cluster/apps", "main"
CONTEXT = "dataops/citation-dagster"
GITEA_PORT = 3000  # the default site's Gitea URL's port, on the plane's address
# what a platform team's own secret tooling made, which seed derives the app's from
SOURCE_SECRET = ("postgres", "pg-role-pgvector")
DERIVED = ("dagster", "pgvector-pg-auth")


@dataclass
class Bench:
    plane: ControlPlane
    gitea: Gitea
    values: Path
    bearer: str
    hosts: Path
    folder: Path
    argocd: ArgoCD


@pytest.fixture(scope="module")
def bench(node_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    plane = node_plane
    folder = tmp_path_factory.mktemp("scenario")
    cluster = Cluster(plane)
    site = load_site(env={})
    # the default site's names, as the plane's pods resolve them (CoreDNS) and as the
    # bench's workstation and Argo CD resolve them here (a hosts file)
    names = site_names(site, plane)
    hosts = hosts_file(folder / "hosts", names)
    pushed = images.push_node_images(plane.registry)
    base = images.pinned(images.APP_BASE, pushed)

    proxy = ServiceProxy().start()
    gitea = Gitea(
        folder / "gitea",
        gitea_binary(),
        # and argocd-server's /api/webhook, on loopback (Argo CD's hooks)
        allowed_hosts=f"external, {SERVICE_HOST}, loopback",
        webhook={"PROXY_URL": proxy.url, "PROXY_HOSTS": "*.svc.cluster.local:*"},
        host=plane.address,
        fixed_port=urlsplit(site.gitea.url).port,
        root_url=site.gitea.url,
    ).start()
    events = ArgoEvents(cluster, folder / "argo-events")
    argocd: ArgoCD | None = None
    try:
        for repo in (CODE_REPO, APPS_REPO):
            gitea.repository(repo, BRANCH)
        gitea.commit(
            CODE_REPO, BRANCH, app_files(site, base), f"{APP}: its build context and deployment"
        )
        gitea.commit(
            APPS_REPO, BRANCH, {"apps/README.md": "Argo CD Applications\n"}, "the apps repository"
        )
        argocd = ArgoCD(folder / "argocd", plane, hosts=names).start()
        values = folder / "site.yaml"
        values.write_text(
            yaml.safe_dump(
                # under the node's NetworkPolicy engine, the plane's services by address
                site_values(
                    plane,
                    # seed's hooks to Argo CD: its server on loopback
                    targets={
                        "prod": {"context": "fabrique-live", "argoCdWebhook": argocd.webhook_url}
                    },
                    derivedSecrets=[
                        {
                            "app": APP,
                            "from": "/".join(SOURCE_SECRET),
                            "to": "/".join(DERIVED),
                            "keys": {"username": "username"},
                        }
                    ],
                )
            )
        )
        apply_site(cluster, render(values, folder / "manifests"))
        serve_site(site, plane, gitea)
        bearer = secrets.token_urlsafe(32)
        events.start_controller()
        start_event_path(cluster, events, site, bearer)
        proxy.route(cluster, CONTROL, f"{SOURCE}-eventsource-svc", events.webhook_port)
        for namespace in (SOURCE_SECRET[0], DERIVED[0]):
            cluster.kubectl("create", "namespace", namespace, check=False)
        cluster.kubectl(
            "create", "secret", "generic", SOURCE_SECRET[1], "-n", SOURCE_SECRET[0],
            "--from-literal=username=pgvector", "--from-literal=password=unused",
        )  # fmt: skip
        argocd.repository(site.gitea.url, USER, gitea.token)
        argocd.root_application(f"{site.gitea.url}/{APPS_REPO}.git", BRANCH, "apps")
        yield Bench(plane, gitea, values, bearer, hosts, folder, argocd)
    finally:
        if argocd is not None:
            argocd.stop()
        events.stop()
        gitea.stop()
        proxy.stop()
        cluster.http.close()


def test_scenario_34_passes_every_gate_on_the_real_node(bench: Bench) -> None:
    timings = bench.folder / "timings.json"
    argv, env = scenario(
        load_site(env={}), bench.plane, bench.hosts, bench.values, bench.gitea.token,
        bench.bearer,
        {"PATH": os.environ["PATH"], "HOME": str(bench.folder), "TIMEOUT": "600",
         "TIMINGS": str(timings)},
    )  # fmt: skip
    started = time.monotonic()
    ran = subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    said = ran.stdout + ran.stderr
    print(said)
    print(f"scenario 34: {time.monotonic() - started:.0f} s")
    assert ran.returncode == 0, said[-4000:]
    assert ran.stdout.rstrip().endswith("PASS: build-gitops-digest"), said[-2000:]
    for gate in (
        "deployed-by-digest",
        "application-synced-healthy",
        "pods-ready-by-digest",
        "seed-replay-unchanged",
        "status-success",
    ):
        assert f"PASS {gate}" in said, gate
    stages = json.loads(timings.read_text())
    assert list(stages) == [
        "workflow_created", "build_started", "build_done", "workflow_done", "digest_in_git",
        "synced", "pod_ready",
    ]  # fmt: skip
    # beside it, the same build bare: buildctl on the host, the same context, BuildKit's
    # state fresh as the build pod's is, the image pushed to the same registry
    bare = bare_build(bench, said)
    print(
        f"scenario 34, push to pod by digest: {stages['pod_ready']:.0f} s ({json.dumps(stages)}); "
        f"the same build by buildctl alone: {bare:.1f} s; "
        f"push to pod / bare build: {stages['pod_ready'] / bare:.1f}"
    )


def bare_build(bench: Bench, said: str) -> float:
    """Seconds of ``buildctl-daemonless.sh build`` of the second push's context, as the
    build step runs it but with nothing of the factory around it."""
    revision = re.findall(r"^   pushed ([0-9a-f]{40})$", said, re.M)
    checkout = bench.folder / "bare"
    subprocess.run(
        ["git", "clone", "-q", f"{bench.gitea.url}/{CODE_REPO}.git", str(checkout)],
        check=True,
        env={**os.environ, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
             "GIT_CONFIG_VALUE_0": f"Authorization: token {bench.gitea.token}"},
    )  # fmt: skip
    assert revision, said[-2000:]
    subprocess.run(["git", "-C", str(checkout), "checkout", "-q", revision[-1]], check=True)
    with builder() as running:
        context = running.folder("context")
        shutil.copytree(checkout / CONTEXT, context, dirs_exist_ok=True)
        for path in [context, *context.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        registry = bench.plane.registry
        image = f"{registry}/citation-dagster-bare:{revision[-1][:12]}"
        started = time.monotonic()
        done = running.buildctl(
            context, registry, ["--output", f"type=image,name={image},push=true"], timeout=600
        )
        seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:]
    print(f"the bare build ({running.mode}), its last lines:\n{done.stdout[-1500:]}")
    return seconds


# -- a freeze window ---------------------------------------------------------------------------


def test_a_push_in_a_freeze_window_builds_and_the_first_pass_after_it_writes_it(
    bench: Bench,
) -> None:
    """The site's tree applied with a freeze window open now: a push builds on the real
    node, and its write-back writes nothing (the build's status says frozen); once the
    window has ended, the safety net's pass (``fabrique reconcile``, the CronWorkflow's
    command) writes the digest. The window's end is not waited for: the pass is given
    the window lifted early (a person shortening it to a minute, ended before the push):
    the pass reads nothing else of it. The tree without the window is applied again
    after."""
    plane, cluster = bench.plane, Cluster(bench.plane)
    site = load_site(env={})
    # open since a minute, for two more: a build on the node takes some twenty seconds
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=60)
    ends = started + timedelta(minutes=3)
    values = yaml.safe_load(bench.values.read_text())
    values["freeze"] = [{"start": started.isoformat(), "duration": "3m", "reason": "CHG-1"}]
    frozen = bench.folder / "frozen.yaml"
    frozen.write_text(yaml.safe_dump(values))
    values["freeze"][0]["duration"] = "1m"  # ended when the push came
    lifted = bench.folder / "lifted.yaml"
    lifted.write_text(yaml.safe_dump(values))
    target = site.apps[0].writeback.path

    def read(path: str) -> str:
        with bench.gitea.admin() as gitea:
            answer = gitea.get(f"/repos/{CODE_REPO}/raw/{path}", params={"ref": BRANCH})
        assert answer.status_code == 200, answer.text
        return answer.text

    def status(revision: str) -> str:
        with bench.gitea.admin() as gitea:
            answer = gitea.get(f"/repos/{CODE_REPO}/commits/{revision}/status")
        found = [
            s for s in answer.json().get("statuses") or [] if s["context"] == "fabrique/citation"
        ]
        return f"{found[0]['status']}: {found[0]['description']}" if found else ""

    try:
        cluster.apply_tree(render(frozen, bench.folder / "frozen-manifests"))
        revision = bench.gitea.commit(
            CODE_REPO, BRANCH, {f"{CONTEXT}/frozen.txt": "built in a freeze\n"},
            "citation: a change in a freeze window",
        )  # fmt: skip
        _built(bench, cluster, revision)
        built = datetime.now(UTC)
        assert built < ends, f"the build ended at {built}, after the window ({ends})"
        assert revision[:12] not in read(target), "nothing written in the window"
        said = status(revision)
        assert said.startswith("success: built sha256:") and "; frozen, deployed once the " in (
            said
        ), said

        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig),
               "FABRIQUE_GITEA_TOKEN": bench.gitea.token}  # fmt: skip
        argv = [str(ROOT / ".venv" / "bin" / "fabrique"), "--values", str(lifted),
                "reconcile", "--app", APP]  # fmt: skip
        done = subprocess.run(
            resolving(bench.hosts, argv), env=env, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        # written back by this pass (or by the CronWorkflow's, if one ran since the end)
        assert (
            f"{APP}: written-back: " in done.stdout
            or f"{APP}: ok: deploys {revision[:12]}" in done.stdout
        ), done.stdout
        assert f"newTag: {revision[:12]}" in read(target)
    finally:
        cluster.apply_tree(render(bench.values, bench.folder / "manifests"))
        cluster.http.close()


# -- bench before prod ------------------------------------------------------------------------

# outside the app's build context: adding it builds nothing
PROD_OVERLAY = "deploy/citation/production/kustomization.yaml"
DOCKERFILE = f"{CONTEXT}/Dockerfile"


def _built(bench: Bench, cluster: Cluster, revision: str) -> None:
    name = f"fabrique-{APP}-{revision[:12]}"

    def phase() -> str | None:
        path = f"/apis/argoproj.io/v1alpha1/namespaces/fabrique-build/workflows/{name}"
        found = cluster.get(path) if cluster.exists(path) else {}
        got = (found.get("status") or {}).get("phase")
        assert got not in ("Failed", "Error"), f"Workflow {name}: {found.get('status')}"
        return got if got == "Succeeded" else None

    cluster.wait(f"the push's Workflow {name} to succeed", phase, timeout=300)


def test_prod_gets_what_bench_verified_and_a_bench_build_that_crashes_is_rolled_back(
    bench: Bench,
) -> None:
    """Two Applications of the same app, bench and prod, each made by ``fabrique seed``;
    builds reach bench only, whose Argo CD runs in fabrique's cluster: the tree applied
    with bench ``inCluster``, each build's Workflow verifies bench after its write-back
    (its ``verify-deploy`` step: every pod on the digest, by the kubelet's imageID). A
    good build is verified there by its own Workflow, and only then does ``fabrique
    promote --to prod`` give prod its pin, whose pod then runs by it. A later build
    whose container never starts is written into bench, fails its verification in its
    own Workflow (its pod in a crash loop), and is rolled back, in Git, to the verified
    digest, held with the reason; bench's pod is Ready on it again, no person involved,
    and prod is never touched. The tree as it was is applied again after."""
    plane, argocd = bench.plane, bench.argocd
    cluster = Cluster(plane)
    site = load_site(env={})
    app = site.to_values()["apps"][0]
    app["application"]["path"] = "apps/citation-staged.yaml"  # prod's: …-staged-prod.yaml
    app["environments"] = [
        {"name": "bench", "target": "bench", "application": "argocd/citation-bench",
         "namespace": "citation-bench", "verify": {"onFailure": "rollback"}},
        {"name": "prod", "target": "prod", "application": "argocd/citation-prod",
         "namespace": "citation-prod", "writeback": {"repo": CODE_REPO, "path": PROD_OVERLAY}},
    ]  # fmt: skip
    bench_target = app["writeback"]["path"]
    hook = argocd.webhook_url
    values = bench.folder / "environments.yaml"
    values.write_text(
        yaml.safe_dump(
            site_values(
                plane,
                # seed's hooks tell the plane's Argo CD of each write-back at once
                targets={
                    "bench": {"context": "fabrique-live", "inCluster": True, "argoCdWebhook": hook},
                    "prod": {"context": "fabrique-live", "inCluster": True, "argoCdWebhook": hook},
                },
                apps=[app],
            )
        )
    )

    def fabrique(*args: str) -> subprocess.CompletedProcess[str]:
        return _fabrique(bench, values, *args)

    def promote() -> subprocess.CompletedProcess[str]:
        return fabrique("promote", "--app", APP, "--to", "prod")

    def verdict(revision: str, where: str = "bench") -> tuple[str, str]:
        """The ``fabrique/citation/<where>/verified`` status on ``revision``."""
        with bench.gitea.admin() as gitea:
            answer = gitea.get(f"/repos/{CODE_REPO}/commits/{revision}/status")
        found = [
            s for s in answer.json().get("statuses") or []
            if s["context"] == f"fabrique/{APP}/{where}/verified"
        ]  # fmt: skip
        return (found[0]["status"], found[0]["description"]) if found else ("", "")

    def target(path: str) -> str:
        return _read(bench, path)

    def seed(target: str, name: str) -> None:
        _seed(bench, cluster, values, APP, target, name)

    try:
        # the tree of this site: its Roles and NetworkPolicies go into the environments'
        # namespaces, which Argo CD would make only at their first sync
        for namespace in ("citation-bench", "citation-prod"):
            cluster.kubectl("create", "namespace", namespace, check=False)
        cluster.apply_tree(render(values, bench.folder / "environments-manifests"))
        cluster.wait_templates_seen()
        bench.gitea.commit(
            CODE_REPO, BRANCH,
            {PROD_OVERLAY: "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                           f"resources:\n  - ../../../{CONTEXT}/deploy/base\n"},
            "citation: a prod overlay, written by promote only",
        )  # fmt: skip
        dockerfile = app_files(site, images.pinned(images.APP_BASE, plane.images))[DOCKERFILE]
        # prod deploys nothing a promotion wrote: seed gives it no Application yet
        early = fabrique("seed", "--app", APP, "--target", "prod", "--yes")
        assert early.returncode == 2 and "promote into it first" in early.stderr, (
            early.stdout + early.stderr
        )
        # bench deploys a build (seed writes its Application for what its target holds,
        # built): the first one's Workflow waits for the Application seed makes
        first = bench.gitea.commit(
            CODE_REPO, BRANCH, {DOCKERFILE: dockerfile + "LABEL stage=first\n"}, "citation: v1"
        )
        cluster.wait(
            "the first build's digest in bench's target",
            lambda: f"newTag: {first[:12]}" in target(bench_target) or None,
            timeout=300,
        )
        seed("bench", "citation-bench")
        _built(bench, cluster, first)
        assert verdict(first)[0] == "success", (verdict(first), _looked(cluster, first))

        # a good build: its own Workflow sees bench run it, and says verified; only then
        # does prod get exactly its pin
        good = bench.gitea.commit(
            CODE_REPO, BRANCH, {DOCKERFILE: dockerfile + "LABEL stage=bench\n"}, "citation: v2"
        )
        _built(bench, cluster, good)
        state, said = verdict(good)
        assert state == "success" and said.startswith("verified in bench: sha256:"), (
            state, said, _looked(cluster, good),
        )  # fmt: skip
        digest = said.removeprefix("verified in bench: ")
        done = promote()
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith(
            f"promoted: {APP} registry:80/citation-dagster:{good[:12]}@{digest} "
        ), done.stdout
        # prod's Argo CD runs here too: the promotion starts a Workflow that looks at it
        assert re.search(
            r"^verifying in prod: Workflow fabrique/fabrique-verify-[0-9a-f]{12}$",
            done.stdout,
            re.M,
        ), done.stdout
        again = promote()
        assert again.returncode == 0 and again.stdout.startswith("unchanged: "), (
            again.stdout + again.stderr
        )
        seed("prod", "citation-prod")
        argocd.refresh("citation-prod")
        cluster.wait(
            "prod Synced and Healthy on the promoted digest",
            lambda: _runs(argocd.application("citation-prod"), good),
            timeout=180,
        )
        pods = cluster.items("/api/v1/namespaces/citation-prod/pods")
        running = [c["image"] for p in pods for c in p["spec"]["containers"]]
        assert running and all(image.endswith(f"@{digest}") for image in running), running
        # the promotion's Workflow, waiting for the Application seed made, says verified
        cluster.wait(
            "prod verified by the promotion's Workflow",
            lambda: verdict(good, "prod") == ("success", f"verified in prod: {digest}") or None,
            timeout=120,
        )
        prod_pin = target(PROD_OVERLAY)

        # a build whose container never starts: bench takes it, its pod crash-loops, its
        # Workflow's look fails it and rolls bench back; nobody runs anything
        crashing = dockerfile.replace('CMD ["httpd"', 'CMD ["false", "httpd"')
        broken = bench.gitea.commit(
            CODE_REPO, BRANCH, {DOCKERFILE: crashing}, "citation: a broken start"
        )
        crashed = cluster.wait(
            "a bench pod of the broken build to fail",
            lambda: _crashed(cluster, "citation-bench", broken[:12]) or None,
            timeout=300,
        )
        back = cluster.wait(
            "bench Synced and Healthy on the verified build again, every pod on it",
            lambda: (
                _runs(argocd.application("citation-bench"), good)
                and _on(cluster, "citation-bench", digest)
                and time.monotonic()
            ),
            timeout=180,
        )
        _built(bench, cluster, broken)
        state, said = verdict(broken)
        assert state == "failure" and said.startswith("failed in bench: sha256:"), (
            state, said, _looked(cluster, broken),
        )  # fmt: skip
        held = target(bench_target)
        assert f"digest: {digest}" in held and "hold.fabrique.io/citation" in held, held
        assert "failed verification in bench" in held, held
        assert target(PROD_OVERLAY) == prod_pin, "prod is never touched"
        # a replay of the look: the verified digest runs there, nothing more to say
        after = fabrique("verify", "--app", APP, "--env", "bench")
        assert after.returncode == 0 and after.stdout.startswith(f"{APP}/bench: judged: "), (
            after.stdout + after.stderr
        )
        print(
            f"bench: the broken build's pod failing ({crashed[1]}) to the verified pod "
            f"Ready again: {back - crashed[0]:.1f} s"
        )
    finally:
        cluster.apply_tree(render(bench.values, bench.folder / "manifests"))
        cluster.http.close()


def _fabrique(bench: Bench, values: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``fabrique --values VALUES …`` as the bench's workstation runs it: the site's
    names through the hosts file, the plane's kubeconfig, the site's tokens."""
    env = {
        **os.environ,
        "KUBECONFIG": str(bench.plane.kubeconfig),
        "FABRIQUE_GITEA_TOKEN": bench.gitea.token,
        "FABRIQUE_WEBHOOK_TOKEN": bench.bearer,
    }
    argv = [str(ROOT / ".venv" / "bin" / "fabrique"), "--values", str(values), *args]
    return subprocess.run(
        resolving(bench.hosts, argv),
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _seed(bench: Bench, cluster: Cluster, values: Path, app: str, target: str, name: str) -> None:
    """``fabrique seed`` of ``app`` there, then Argo CD's root Application takes its
    file (Application ``name``)."""
    done = _fabrique(bench, values, "seed", "--app", app, "--target", target, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    # "application <env>:" for an app of environments, "application:" for one of none
    assert re.search(r"^application( \S+)?: changed \(created ", done.stdout, re.M), done.stdout
    bench.argocd.refresh("root")
    cluster.wait(
        f"Argo CD to take Application {name} from the apps repository",
        lambda: bench.argocd.application(name),
        timeout=60,
    )


def _read(bench: Bench, path: str) -> str:
    with bench.gitea.admin() as gitea:
        answer = gitea.get(f"/repos/{CODE_REPO}/raw/{path}", params={"ref": BRANCH})
    assert answer.status_code == 200, answer.text
    return answer.text


# -- one push, one commit ---------------------------------------------------------------------

SHELF = ("shelf-1", "shelf-2", "shelf-3")  # apps of one repository, built by one push


def test_a_push_touching_several_apps_lands_as_one_commit_each_application_on_its_digest(
    bench: Bench,
) -> None:
    """Three apps of the code repository, each its own context, kustomization and
    Application; one push touches all three (``writeback.batch``). Their builds run on
    the real node and write nothing; the push's Workflow, once the three have ended,
    writes the three digests in one commit naming them all, and posts each app's
    status; Argo CD, told by Gitea's hook, syncs each Application to its own digest, its
    pod Ready on it. A second push whose one build fails writes the other two, in one
    commit, and says which was left out."""
    plane, argocd = bench.plane, bench.argocd
    cluster = Cluster(plane)
    site = load_site(env={})
    base = images.pinned(images.APP_BASE, plane.images)
    apps = [
        {
            "name": name,
            "image": name,
            "context": f"apps/{name}",
            "writeback": {
                "kind": "kustomize-images",
                "repo": CODE_REPO,
                "path": f"apps/{name}/deploy/overlays/prod/kustomization.yaml",
            },
            "application": {
                "path": f"apps/{name}.yaml",
                "namespace": DERIVED[0],
                "sourcePath": f"apps/{name}/deploy/overlays/prod",
            },
        }
        for name in SHELF
    ]
    values = bench.folder / "shelf.yaml"
    values.write_text(
        yaml.safe_dump(
            site_values(
                plane,
                targets={"prod": {"context": "fabrique-live", "argoCdWebhook": argocd.webhook_url}},
                apps=[site.to_values()["apps"][0], *apps],
            )
        )
    )
    shelf = load_site(values, env={})
    files: dict[str, str] = {}
    for name in SHELF:
        one = SimpleNamespace(apps=[shelf.app(name)])
        made = app_files(one, base)  # type: ignore[arg-type]
        deployment = f"apps/{name}/deploy/base/deployment.yaml"
        made[deployment] = made[deployment].replace("citation-dagster", name)
        files |= made
    try:
        cluster.apply_tree(render(values, bench.folder / "shelf-manifests"))
        cluster.wait_templates_seen()
        # webhook #2 (scenario 34's script seeds it; a replay changes nothing)
        hooked = _fabrique(bench, values, "seed-webhook")
        assert hooked.returncode == 0, hooked.stdout + hooked.stderr
        first = bench.gitea.commit(CODE_REPO, BRANCH, files, "three apps of one repository")
        message, said = _landed(bench, cluster, first)
        assert message.startswith("fabrique: deploy 3 images into 3 files of atlas/atlas"), message
        digests = {}
        for name in SHELF:
            found = re.search(
                rf"App: {name}\nImage: [^\n]+\nDigest: (sha256:[0-9a-f]{{64}})", message
            )
            assert found, message
            digests[name] = found[1]
            assert f"digest: {digests[name]}" in _read(
                bench, apps[SHELF.index(name)]["writeback"]["path"]
            )
        for name in SHELF:
            state, description = said[f"fabrique/{name}"]
            assert state == "success" and description.startswith(f"deployed {digests[name]}"), said
        for name in SHELF:
            _seed(bench, cluster, values, name, "prod", name)
        for name in SHELF:
            cluster.wait(
                f"{name} Synced and Healthy on its digest",
                lambda name=name: _runs(argocd.application(name), first),
                timeout=180,
            )
            pods = [
                p for p in cluster.items(f"/api/v1/namespaces/{DERIVED[0]}/pods")
                if any(c["image"].endswith(f"@{digests[name]}") for c in p["spec"]["containers"])
            ]  # fmt: skip
            assert pods and all(
                s.get("ready") for p in pods for s in p["status"].get("containerStatuses") or []
            ), pods

        # one build breaks: the other two land, in one commit; the push says which
        broken = SHELF[1]
        second = bench.gitea.commit(
            CODE_REPO,
            BRANCH,
            {
                f"apps/{name}/Dockerfile": files[f"apps/{name}/Dockerfile"]
                + ("RUN exit 3\n" if name == broken else "LABEL stage=second\n")
                for name in SHELF
            },
            "the three again; one build breaks",
        )
        message, said = _landed(bench, cluster, second)
        assert message.startswith("fabrique: deploy 2 images into 2 files"), message
        assert f"App: {broken}\n" not in message
        assert f"newTag: {second[:12]}" not in _read(bench, apps[1]["writeback"]["path"])
        # the broken build reported its failure itself (its exit handler); the others
        # are reported by the push's write-back
        assert said[f"fabrique/{broken}"][0] == "failure", said
        for name in SHELF:
            if name != broken:
                assert said[f"fabrique/{name}"][0] == "success", said
    finally:
        cluster.apply_tree(render(bench.values, bench.folder / "manifests"))
        cluster.http.close()


def _landed(bench: Bench, cluster: Cluster, after: str) -> tuple[str, dict[str, tuple[str, str]]]:
    """Once the push of ``after`` has ended, Succeeded: the message of the one commit
    written after it, and each context's state and description on it."""
    push = until(
        f"the push of {after[:12]} and its write-back to end",
        lambda: _pushed(cluster, after),
        420,
        every=0.5,
        detail=lambda: _pushing(cluster, after),
    )
    assert push["status"]["phase"] == "Succeeded", push["status"]
    with bench.gitea.admin() as gitea:
        (commit,) = gitea.get(
            f"/repos/{CODE_REPO}/commits", params={"sha": BRANCH, "not": after, "stat": "false"}
        ).json()
        statuses = gitea.get(f"/repos/{CODE_REPO}/commits/{after}/status").json()["statuses"]
    said = {s["context"]: (s["status"], s["description"]) for s in statuses}
    return str(commit["commit"]["message"]), said


def _pushing(cluster: Cluster, after: str) -> str:
    """Where the push of ``after`` is: its Workflow's nodes, and its builds' phases."""
    said = []
    for found in cluster.items(f"/apis/argoproj.io/v1alpha1/namespaces/{CONTROL}/workflows"):
        if found["metadata"]["name"].startswith(f"fabrique-push-{after[:12]}-"):
            status = found.get("status") or {}
            said.append(
                f"{found['metadata']['name']}: {status.get('phase')} {status.get('message')}"
            )
            said += [
                f"  {n.get('displayName')}: {n.get('phase')} {n.get('message', '')}"
                for n in (status.get("nodes") or {}).values()
            ]
    for found in cluster.items(
        "/apis/argoproj.io/v1alpha1/namespaces/fabrique-build/workflows",
        f"fabrique.io/revision={after[:12]}",
    ):
        status = found.get("status") or {}
        said.append(f"{found['metadata']['name']}: {status.get('phase')} {status.get('message')}")
    return "; ".join(said) or "no push Workflow, no build"


def _pushed(cluster: Cluster, after: str) -> dict[str, Any] | None:
    """The push Workflow of ``after`` once it has ended."""
    for found in cluster.items(f"/apis/argoproj.io/v1alpha1/namespaces/{CONTROL}/workflows"):
        if found["metadata"]["name"].startswith(f"fabrique-push-{after[:12]}-"):
            if (found.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Error"):
                return found
    return None


def _looked(cluster: Cluster, revision: str) -> list[str]:
    """What the build Workflow's ``verify-deploy`` nodes of ``revision`` say."""
    name = f"fabrique-{APP}-{revision[:12]}"
    found = cluster.get(f"/apis/argoproj.io/v1alpha1/namespaces/fabrique-build/workflows/{name}")
    return [
        f"{node.get('displayName')}: {node.get('phase')} {node.get('message', '')}"
        for node in ((found.get("status") or {}).get("nodes") or {}).values()
        if node.get("templateName") == "verify-deploy"
    ]


def _crashed(cluster: Cluster, namespace: str, tag: str) -> tuple[float, str] | None:
    """When a pod of ``namespace`` of the image tagged ``tag`` (the broken build's) has a
    container that cannot run (waiting in CrashLoopBackOff, or ended in error), and how;
    the pods of other builds, ended as a rollout replaces them, are not its."""
    for pod in cluster.items(f"/api/v1/namespaces/{namespace}/pods"):
        images = [c.get("image", "") for c in (pod.get("spec") or {}).get("containers") or []]
        if not any(f":{tag}@" in image for image in images):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            state = status.get("state") or {}
            waiting = (state.get("waiting") or {}).get("reason", "")
            ended = state.get("terminated") or (status.get("lastState") or {}).get("terminated")
            if waiting == "CrashLoopBackOff" or (ended and ended.get("exitCode")):
                return time.monotonic(), waiting or f"exit {ended['exitCode']}"
    return None


def _on(cluster: Cluster, namespace: str, digest: str) -> bool:
    """Every live pod of ``namespace`` runs ``digest`` (the kubelet's imageID), Ready."""
    pods = [
        p for p in cluster.items(f"/api/v1/namespaces/{namespace}/pods")
        if not (p.get("metadata") or {}).get("deletionTimestamp")
    ]  # fmt: skip
    statuses = [s for p in pods for s in (p.get("status") or {}).get("containerStatuses") or []]
    return bool(statuses) and all(
        s.get("imageID", "").endswith(f"@{digest}") and s.get("ready") for s in statuses
    )


def _runs(found: dict[str, Any] | None, revision: str) -> bool:
    """The Application is Synced and Healthy, its pods on the image built for ``revision``."""
    status = (found or {}).get("status") or {}
    images_run = (status.get("summary") or {}).get("images") or []
    return (
        (status.get("sync") or {}).get("status") == "Synced"
        and (status.get("health") or {}).get("status") == "Healthy"
        and bool(images_run)
        and all(f":{revision[:12]}@" in image for image in images_run)
    )
