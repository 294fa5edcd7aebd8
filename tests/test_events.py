"""The event path's manifests: EventSource, EventBus, Sensor, and what a push does."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from eventsources.eventbus import event_bus
from eventsources.sensor import sensor
from fabrique.site.config import load_site, parse_site
from fabrique.site.errors import RenderError
from fabrique.site.limits import POD_ENV_LIMIT, pod_env_size
from fabrique.validate import validate_tree

from . import payloads, sensor_cases
from .conftest import GITEA_TOKEN, KUSTOMIZATION, ROOT, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .doubles.sensor import dependency_passes, filters_pass, fire
from .doubles.swagger import Swagger
from .manifests import documents, find, walk

TREE = ROOT / "manifests"
SITE = load_site(env={})


@pytest.fixture(scope="module")
def rendered_sensor() -> dict[str, Any]:
    return find(TREE, "Sensor", "fabrique-build")


def test_event_kinds_validate_strictly_and_typos_are_caught(tmp_path: Path, specs: Path) -> None:
    tree = tmp_path / "m"
    shutil.copytree(TREE, tree)
    assert [p for p in validate_tree(tree, specs) if "events/" in str(p)] == []
    path = tree / "events" / "sensor.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["triggers"][0]["atLeastOnse"] = True
    doc["spec"]["dependencies"][0]["filters"]["data"][0]["valu"] = ["^push$"]
    path.write_text(yaml.safe_dump(doc))
    problems = [str(p) for p in validate_tree(tree, specs)]
    assert any("spec.triggers[0]" in p and "'atLeastOnse' was unexpected" in p for p in problems)
    assert any("filters.data[0]" in p and "'valu' was unexpected" in p for p in problems)


def test_event_source_is_the_authenticated_push_webhook() -> None:
    source = find(TREE, "EventSource", "gitea")
    assert source["metadata"]["namespace"] == "fabrique"
    push = source["spec"]["webhook"]["push"]
    assert (push["port"], push["endpoint"], push["method"]) == ("12000", "/push", "POST")
    assert push["authSecret"] == {"name": "fabrique-webhook-token", "key": "token"}
    assert push["maxPayloadSize"] == 1048576
    assert source["spec"]["service"]["ports"] == [
        {"name": "webhook", "port": 12000, "targetPort": 12000}
    ]
    assert "clusterIP" not in source["spec"]["service"], "a plain ClusterIP Service"
    assert source["spec"]["eventBusName"] == "default"


def test_event_bus_is_persistent_jetstream_with_bounded_retention() -> None:
    bus = find(TREE, "EventBus", "default")["spec"]["jetstream"]
    lock = yaml.safe_load((ROOT / "vendor" / "lock.yaml").read_text())
    assert bus["version"] == lock["components"]["jetstream"]["version"], "the lock's image set"
    assert bus["replicas"] == 1
    assert yaml.safe_load(bus["streamConfig"]) == {"maxAge": "72h", "replicas": 1}
    assert bus["persistence"] == {"accessMode": "ReadWriteOnce", "volumeSize": "1Gi"}


def test_three_replicas_move_the_stream_replicas_too() -> None:
    site = load_site(env={"FABRIQUE_EVENTS__JETSTREAM__REPLICAS": "3"})
    bus = event_bus(site, "2.10.29")["spec"]["jetstream"]
    assert bus["replicas"] == 3
    assert yaml.safe_load(bus["streamConfig"])["replicas"] == 3


PIN = "@sha256:" + "0" * 64


def _events_vendor(root: Path, listed: list[str] | None, pinned: tuple[str, ...] = ()) -> Path:
    """A vendor/ whose lock pins JetStream 2.10.29; ``listed``: a vendored Argo Events
    bundle whose controller config lists those versions (None: not vendored yet), by tag
    except the ``pinned`` ones, whose images are by digest as `fabrique vendor` pins them."""
    lock = {
        "components": {
            "jetstream": {"version": "2.10.29", "images": {"nats:2.10.29": {}}},
            "argo-events": {"version": "v1.9.11", "url": "https://example.invalid/e.yaml"},
        }
    }
    root.mkdir(parents=True)
    (root / "lock.yaml").write_text(yaml.safe_dump(lock))
    if listed is not None:
        versions = [
            {
                "version": v,
                **{
                    key: f"{image}:{v}{PIN if v in pinned else ''}"
                    for key, image in (
                        ("natsImage", "nats"),
                        ("metricsExporterImage", "natsio/prometheus-nats-exporter"),
                        ("configReloaderImage", "natsio/nats-server-config-reloader"),
                    )
                },
            }
            for v in listed
        ]
        config = {"eventBus": {"jetstream": {"versions": versions}}}
        bundle = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "argo-events-controller-config"},
            "data": {"controller-config.yaml": yaml.safe_dump(config)},
        }
        (root / "argo-events" / "v1.9.11").mkdir(parents=True)
        (root / "argo-events" / "v1.9.11" / "bundle.yaml").write_text(yaml.safe_dump(bundle))
    return root


def test_the_default_jetstream_version_is_the_locks(tmp_path: Path) -> None:
    from fabrique.render import jetstream_version

    assert jetstream_version(SITE, _events_vendor(tmp_path / "v", None)) == "2.10.29"


def test_a_jetstream_version_the_vendored_argo_events_does_not_list_fails_render(
    tmp_path: Path,
) -> None:
    from fabrique.render import jetstream_version

    old = load_site(env={"FABRIQUE_EVENTS__JETSTREAM__VERSION": "2.10.10"})
    with pytest.raises(RenderError, match=r"^events\.jetstream\.version: 2\.10\.10 is not listed"):
        jetstream_version(old, _events_vendor(tmp_path / "a", None))
    vendored = _events_vendor(
        tmp_path / "b", ["latest", "2.9.16", "2.10.29"], pinned=("2.9.16", "2.10.29")
    )
    with pytest.raises(RenderError, match=r"2\.10\.10 is not listed by .*bundle\.yaml"):
        jetstream_version(old, vendored)
    older = load_site(env={"FABRIQUE_EVENTS__JETSTREAM__VERSION": "2.9.16"})
    assert jetstream_version(older, vendored) == "2.9.16", "a version the bundle pins"


@pytest.mark.parametrize("version", ["2.9.16", "2.9.16-alpine"])
def test_a_version_the_controller_would_run_by_tag_fails_render(
    tmp_path: Path, version: str
) -> None:
    """Upstream's controller config lists nine versions by tag; `fabrique vendor` pins
    the lock's. Any other would run NATS by a mutable tag, from outside the air-gap
    (`latest` the config itself refuses)."""
    from fabrique.render import jetstream_version

    vendored = _events_vendor(
        tmp_path / "v", ["latest", "2.9.16", "2.9.16-alpine", "2.10.29"], pinned=("2.10.29",)
    )
    site = load_site(env={"FABRIQUE_EVENTS__JETSTREAM__VERSION": version})
    with pytest.raises(
        RenderError, match=rf"^events\.jetstream\.version: {version} is listed .* by tag"
    ):
        jetstream_version(site, vendored)
    assert jetstream_version(SITE, vendored) == "2.10.29"


def test_render_fails_whole_on_an_unlisted_jetstream_version(tmp_path: Path) -> None:
    out = tmp_path / "m"
    result = run_cli(
        "render", "--out", str(out), env={"FABRIQUE_EVENTS__JETSTREAM__VERSION": "2.10.10"}
    )
    assert result.exit_code == 5, result.output
    assert "events.jetstream.version: 2.10.10 is not listed" in result.stderr
    assert not out.exists(), "nothing half-written"


def test_two_replicas_are_refused() -> None:
    from fabrique.site.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^events\.jetstream\.replicas: "):
        load_site(env={"FABRIQUE_EVENTS__JETSTREAM__REPLICAS": "2"})


def test_every_string_filter_is_anchored(rendered_sensor: dict[str, Any]) -> None:
    for dependency in rendered_sensor["spec"]["dependencies"]:
        for data_filter in dependency["filters"]["data"]:
            for value in data_filter["value"]:
                assert value.startswith("^") and value.endswith("$"), (data_filter["path"], value)
    paths = [f["path"] for f in rendered_sensor["spec"]["dependencies"][0]["filters"]["data"]]
    assert paths == [
        "header.X-Gitea-Event.0",
        "body.ref",
        "body.repository.full_name",
        "body.after",
        "body.after",
        "body.before",
    ]


def test_trigger_creates_the_push_workflow_once(rendered_sensor: dict[str, Any]) -> None:
    (trigger,) = rendered_sensor["spec"]["triggers"]
    assert trigger["atLeastOnce"] is True
    assert trigger["retryStrategy"]["steps"] > 1
    assert trigger["rateLimit"] == {"unit": "Second", "requestsPerUnit": 10}
    k8s = trigger["template"]["k8s"]
    # get, then create if there is none, else a merge patch of the same body: a
    # redelivered push finds its Workflow and is settled at once (no minute of 409s)
    assert k8s["operation"] == "patch"
    resource = k8s["source"]["resource"]
    assert isinstance(resource, dict) and "value" not in resource, "raw object, not base64"
    assert resource["kind"] == "Workflow"
    assert resource["spec"]["workflowTemplateRef"] == {"name": "fabrique-push"}
    assert resource["metadata"]["namespace"] == "fabrique"


def _waits(backoff: dict[str, Any], jitter: bool) -> list[float]:
    """The waits between a trigger's tries, as Argo Events' DoWithRetry makes them
    (pkg/shared/util/retry.go, Convert2WaitBackoff then wait.ExponentialBackoff): `steps`
    tries, so steps - 1 waits, each `duration` times `factor` to the try's rank, each
    stretched by at most `jitter` of itself."""
    duration = float(backoff["duration"].removesuffix("s"))
    waits = [duration * float(backoff["factor"]) ** i for i in range(int(backoff["steps"]) - 1)]
    return [w * (1 + float(backoff["jitter"])) for w in waits] if jitter else waits


def test_the_trigger_rides_out_a_minute_without_the_api(rendered_sensor: dict[str, Any]) -> None:
    """Its last try comes a minute or more after the first: an API server restarting, a
    control-plane upgrade's blip, loses no event. And less than the safety net's period
    after it, so the net still catches what the Sensor gives up on within one period."""
    (trigger,) = rendered_sensor["spec"]["triggers"]
    backoff = trigger["retryStrategy"]
    assert sum(_waits(backoff, jitter=False)) >= 60
    site = load_site(env={})
    assert site.reconcile.schedule == "*/5 * * * *"
    assert sum(_waits(backoff, jitter=True)) < 5 * 60


def test_a_push_becomes_one_push_workflow_of_its_two_commits(
    rendered_sensor: dict[str, Any],
) -> None:
    """Same push, same name, same object: a redelivery finds it as it is (the trigger
    patches it with this very body, which changes nothing)."""
    after, before = "4e1d9c0b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d", "9" * 40
    event = payloads.push(after=after, before=before, files=["dataops/citation-dagster/a"])
    created = fire(rendered_sensor["spec"]["triggers"][0], event)
    assert created == {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": f"fabrique-push-{after[:12]}-{before[:12]}",
            "namespace": "fabrique",
            "labels": {
                "app.kubernetes.io/part-of": "fabrique",
                "app.kubernetes.io/managed-by": "fabrique",
            },
        },
        "spec": {
            "workflowTemplateRef": {"name": "fabrique-push"},
            "arguments": {
                "parameters": [
                    {"name": "before", "value": before},
                    {"name": "after", "value": after},
                ]
            },
        },
    }


def test_the_name_and_the_commits_come_from_the_same_fields(
    rendered_sensor: dict[str, Any],
) -> None:
    """A body with `after` twice: gjson (a dataKey, the filters) reads the first, the Go
    template over the decoded body the last. The push's Workflow must plan the commit it
    is named after, whichever the Sensor reads."""

    named, other = "4e1d9c0b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d", "9" * 40
    event = payloads.push(after=named, files=["dataops/citation-dagster/app.txt"])
    raw = json.dumps(event["body"]).replace(
        f'"after": "{named}"', f'"after": "{other}", "after": "{named}"'
    )

    def first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            out.setdefault(key, value)
        return out

    last = {**event, "body": json.loads(raw)}
    first = {**event, "body": json.loads(raw, object_pairs_hook=first_wins)}
    assert (first["body"]["after"], last["body"]["after"]) == (other, named)
    created = fire(rendered_sensor["spec"]["triggers"][0], last, first=first)
    after = created["spec"]["arguments"]["parameters"][1]["value"]
    assert created["metadata"]["name"].startswith(f"fabrique-push-{after[:12]}-")
    for parameter in rendered_sensor["spec"]["triggers"][0]["template"]["k8s"]["parameters"]:
        assert "dataKey" not in parameter["src"], parameter["dest"]


def test_sensor_rbac_allows_creating_getting_and_patching_workflows_only() -> None:
    """Get and patch for the trigger's patch operation, in the control namespace; what
    the patch may do, admission says (nothing: tests/test_least_privilege.py)."""
    role = find(TREE, "Role", "fabrique-sensor-workflows")
    assert role["metadata"]["namespace"] == "fabrique"
    assert role["rules"] == [
        {
            "apiGroups": ["argoproj.io"],
            "resources": ["workflows"],
            "verbs": ["create", "get", "patch"],
        }
    ]
    binding = find(TREE, "RoleBinding", "fabrique-sensor-workflows")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fabrique-sensor", "namespace": "fabrique"}
    ]
    assert (
        find(TREE, "Sensor", "fabrique-build")["spec"]["template"]["serviceAccountName"]
        == "fabrique-sensor"
    )


def test_control_namespace_pods_are_restricted() -> None:
    for kind, name in (("EventSource", "gitea"), ("Sensor", "fabrique-build")):
        template = find(TREE, kind, name)["spec"]["template"]
        assert template["securityContext"]["runAsNonRoot"] is True
        assert template["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        container = template["container"]["securityContext"]
        assert container["allowPrivilegeEscalation"] is False and container["capabilities"] == {
            "drop": ["ALL"]
        }
    bus = find(TREE, "EventBus", "default")["spec"]["jetstream"]
    for key in ("containerTemplate", "reloaderContainerTemplate", "metricsContainerTemplate"):
        assert bus[key]["securityContext"]["allowPrivilegeEscalation"] is False, key


def _apps_site(count: int) -> Any:
    from bench.render import values_with

    return parse_site(values_with(count))


def test_the_sensor_is_the_same_whatever_the_apps() -> None:
    """One dependency, one trigger, one consumer and one NATS connection on the bus,
    and the same bytes in its pod's variable, at one app or ten thousand."""
    one, many = sensor(_apps_site(1)), sensor(_apps_site(10_000))
    assert one == many
    assert [d["name"] for d in many["spec"]["dependencies"]] == ["push"]
    assert [t["template"]["name"] for t in many["spec"]["triggers"]] == ["plan-push"]
    assert pod_env_size(many) < POD_ENV_LIMIT // 20


# ------------------------------------------------------------ what a push does


@pytest.mark.parametrize(
    ("event", "passes"),
    [
        (payloads.push(after="a" * 40), True),
        (payloads.push(after="a" * 40, ref="refs/heads/feature"), False),
        (payloads.push(after="a" * 40, ref="refs/heads/main-backup"), False),
        (payloads.push(after="a" * 40, ref="refs/tags/v1.0.0"), False),
        (payloads.push(after=payloads.ZERO), False),
        (payloads.push(after="a" * 40, repo="atlas/atlas-fork"), False),
        (payloads.push(after="a" * 40, repo="x-atlas/atlas"), False),
        (payloads.push(after="a" * 40, event="pull_request"), False),
        (payloads.push(after="a" * 40, event="push-like"), False),
        (payloads.push(after="b" * 64), True),
        (payloads.push(after="0" * 64), False),
        (payloads.push(after="a" * 41), False),
        (payloads.push(after="a" * 63), False),
        (payloads.push(after="a" * 40 + "\n"), False),
    ],
    ids=[
        "main",
        "other-branch",
        "prefix-branch",
        "tag",
        "deletion",
        "fork",
        "nested",
        "other-event",
        "prefix-event",
        "sha256-repository",
        "sha256-deletion",
        "41-hex",
        "63-hex",
        "trailing-newline",
    ],
)
def test_sensor_filters_on_realistic_payloads(
    rendered_sensor: dict[str, Any], gitea_swagger: Swagger, event: dict[str, Any], passes: bool
) -> None:
    for definition, value in payloads.parts(event):
        gitea_swagger.check_definition(definition, value)
    (dependency,) = rendered_sensor["spec"]["dependencies"]
    assert dependency_passes(event, dependency) is passes


def _plan(values: Path, revision: str, tmp_path: Path) -> dict[str, str]:
    out = tmp_path / f"plan-{revision[:7]}"
    result = run_cli(
        "--values",
        str(values),
        "plan",
        "--app",
        "citation",
        "--revision",
        revision,
        "--out",
        str(out),
        env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN},
    )
    assert result.exit_code == 0, result.stderr
    return {p.name: p.read_text() for p in out.iterdir()}


def test_pushes_drive_the_skip_when_unchanged_step(
    tmp_path: Path, code_repo: Repo, gitea: GiteaDouble, rendered_sensor: dict[str, Any]
) -> None:
    values = write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url})
    filters = rendered_sensor["spec"]["dependencies"][0]["filters"]["data"]
    trigger = rendered_sensor["spec"]["triggers"][0]

    def deliver(revision: str, files: list[str]) -> dict[str, str]:
        event = payloads.push(after=revision, files=files)
        assert filters_pass(event, filters)
        workflow = fire(trigger, event)
        assert workflow["spec"]["arguments"]["parameters"][1]["value"] == revision
        return _plan(values, revision, tmp_path)

    # nothing deployed yet: build
    first = code_repo.commit({"dataops/citation-dagster/app.txt": "v1\n"})
    assert deliver(first, ["dataops/citation-dagster/app.txt"])["build"] == "true"
    written = run_cli(
        "--values",
        str(values),
        "writeback",
        "--app",
        "citation",
        "--revision",
        first,
        "--digest",
        "sha256:" + "1" * 64,
        env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN},
    )
    assert written.stdout.startswith("changed:")
    writeback_commit = code_repo.head()

    # the write-back commit itself lands inside the context: it must not rebuild
    skipped = deliver(
        writeback_commit, ["dataops/citation-dagster/deploy/overlays/prod/kustomization.yaml"]
    )
    assert skipped["build"] == "false", skipped["reason"]

    # a push touching only another app: the Sensor lets it through, the plan skips it
    other = code_repo.commit({"dataops/other-app/Dockerfile": "FROM scratch\nLABEL v=2\n"})
    decision = deliver(other, ["dataops/other-app/Dockerfile"])
    assert decision["build"] == "false"
    assert "nothing under dataops/citation-dagster changed" in decision["reason"]

    # a push touching the app: build, naming what changed
    touching = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"})
    decision = deliver(touching, ["dataops/citation-dagster/app.txt"])
    assert decision["build"] == "true"
    assert "dataops/citation-dagster/app.txt" in decision["reason"]

    # the already deployed revision: nothing to do
    assert _plan(values, first, tmp_path)["build"] == "false"


def test_plan_builds_when_the_deployed_tag_is_not_a_commit(
    tmp_path: Path, code_repo: Repo, gitea: GiteaDouble
) -> None:
    values = write_values(tmp_path / "site.yaml", **{"gitea.url": gitea.url})
    code_repo.commit({KUSTOMIZATION: "images:\n- name: citation-dagster\n  newTag: 1.4.2\n"})
    revision = code_repo.commit({"README.md": "x\n"})
    decision = _plan(values, revision, tmp_path)
    assert decision["build"] == "true"
    assert "deployed tag '1.4.2' is not a commit" in decision["reason"]


def test_no_wide_nets_or_literal_secrets_in_the_event_unit() -> None:
    for doc in documents(TREE):
        if doc["apiVersion"].startswith("argoproj.io") and doc["kind"] in (
            "EventSource",
            "Sensor",
            "EventBus",
        ):
            for path, key, value in walk(doc):
                assert not (
                    isinstance(key, str)
                    and re.search(r"token|password", key, re.I)
                    and isinstance(value, str)
                ), path


# ------------------------------------------------------- which pushes are planned


@pytest.mark.parametrize("case", sensor_cases.CASES, ids=[c.name for c in sensor_cases.CASES])
def test_a_delivery_passes_the_dependency_as_the_contract_table_says(
    case: sensor_cases.Case, gitea_swagger: Swagger
) -> None:
    """The contract table the real Sensor is held to (tests/live/test_events.py)."""
    for definition, value in payloads.parts(case.event):
        gitea_swagger.check_definition(definition, value)
    (dependency,) = sensor(sensor_cases.site())["spec"]["dependencies"]
    assert dependency_passes(case.event, dependency) is case.passes
