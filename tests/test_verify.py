"""Verification after a deploy (``fabrique.decisions.verify``): the verdict on one look at
an environment, and the containers read from the pods as the API lists them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fabrique.decisions.verify import Container, Seen, containers_of, judge
from fabrique.site.config import load_site, parse_site
from fabrique.site.errors import ConfigError

DIGEST = "sha256:" + "2" * 64
OLD = "sha256:" + "1" * 64
REPO = "registry:80/citation-dagster"
WRITTEN = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
TIMEOUT = timedelta(minutes=5)


def running(pod: str = "citation-1", digest: str = DIGEST, **more: Any) -> Container:
    fields: dict[str, Any] = dict(
        pod=pod,
        name="app",
        image=f"{REPO}:2a2a2a2a2a2a@{digest}",
        image_id=f"{REPO}@{digest}",
        ready=True,
        restarts=0,
        ready_since=WRITTEN + timedelta(seconds=20),
    )
    return Container(**(fields | more))


def seen(**more: Any) -> Seen:
    fields: dict[str, Any] = dict(
        digest=DIGEST,
        written_at=WRITTEN,
        sync="Synced",
        health="Healthy",
        health_message="",
        containers=[running()],
        checks={},
    )
    return Seen(**(fields | more))


def at(seconds: float) -> datetime:
    return WRITTEN + timedelta(seconds=seconds)


def test_synced_healthy_and_every_pod_on_the_digest_is_verified() -> None:
    found = judge(seen(), at(30), timeout=TIMEOUT)
    assert (found.verdict, found.reason) == ("success", "Synced and Healthy, 1 pod(s) run it")


@pytest.mark.parametrize(
    ("look", "reason"),
    [
        ({"sync": "OutOfSync"}, "the Application is OutOfSync, not Synced"),
        (
            {"health": "Progressing", "health_message": "Waiting for rollout"},
            "the Application is Progressing, not Healthy (Waiting for rollout)",
        ),
        ({"containers": []}, "no pod runs it yet"),
        (
            {"containers": [running(), running("citation-0", OLD)]},
            "pod(s) citation-0 still run another digest",
        ),
        ({"containers": [running(ready=False)]}, "pod(s) citation-1 not Ready"),
        ({"checks": {"bench/smoke": ""}}, "check bench/smoke is not posted"),
        ({"checks": {"bench/smoke": "pending"}}, "check bench/smoke is pending"),
    ],
)
def test_what_is_missing_is_pending_until_the_timeout_then_a_failure(
    look: dict[str, Any], reason: str
) -> None:
    assert judge(seen(**look), at(60), timeout=TIMEOUT) == ("pending", reason)
    late = judge(seen(**look), at(300), timeout=TIMEOUT)
    assert (late.verdict, late.reason) == ("failure", f"not verified within 5m: {reason}")


@pytest.mark.parametrize(
    ("container", "reason"),
    [
        (
            {"waiting": "CrashLoopBackOff", "restarts": 3, "ready": False,
             "message": "back-off 40s restarting failed container"},
            "pod citation-1 (app) is CrashLoopBackOff, 3 restart(s): back-off 40s restarting "
            "failed container",
        ),
        (
            {"exit_code": 1, "restarts": 1, "ready": False},
            "pod citation-1 (app) exited 1, 1 restart(s)",
        ),
    ],
)  # fmt: skip
def test_a_pod_of_the_digest_that_cannot_run_fails_at_once(
    container: dict[str, Any], reason: str
) -> None:
    """Argo CD calls a crash-looping Deployment Progressing until its progress deadline
    (ten minutes by default): the pods say it first."""
    look = seen(health="Progressing", containers=[running(**container)])
    assert judge(look, at(20), timeout=TIMEOUT) == ("failure", reason)


def test_an_image_that_cannot_be_pulled_fails_before_it_ever_started() -> None:
    never = running(image_id="", ready=False, waiting="ImagePullBackOff", ready_since=None)
    found = judge(seen(health="Progressing", containers=[never]), at(20), timeout=TIMEOUT)
    assert found.verdict == "failure" and "ImagePullBackOff" in found.reason


def test_a_degraded_application_fails_and_a_failed_check_too() -> None:
    degraded = seen(health="Degraded", health_message="Deployment exceeded its progress deadline")
    assert judge(degraded, at(20), timeout=TIMEOUT) == (
        "failure",
        "the Application is Degraded: Deployment exceeded its progress deadline",
    )
    checked = seen(checks={"bench/smoke": "success", "bench/scenario": "failure"})
    assert judge(checked, at(20), timeout=TIMEOUT) == (
        "failure",
        "check bench/scenario is failure",
    )


def test_an_old_pod_in_a_crash_loop_is_not_the_digests_failure() -> None:
    """The previous digest's pods are not this one's to judge: only what runs it."""
    old = running("citation-0", OLD, waiting="CrashLoopBackOff", restarts=5, ready=False)
    look = seen(health="Progressing", containers=[running(), old])
    assert judge(look, at(20), timeout=TIMEOUT).verdict == "pending"


def test_the_soak_counts_from_the_pods_ready_time_with_no_restart() -> None:
    soak = timedelta(minutes=2)
    ready_at = WRITTEN + timedelta(seconds=20)
    pending = judge(seen(), at(100), timeout=TIMEOUT, soak=soak)
    assert pending == ("pending", f"Healthy; soaking until {ready_at + soak:%Y-%m-%dT%H:%M:%SZ}")
    assert judge(seen(), at(140), timeout=TIMEOUT, soak=soak).verdict == "success"
    restarted = seen(containers=[running(restarts=1)])
    assert judge(restarted, at(140), timeout=TIMEOUT, soak=soak) == (
        "pending",
        "pod(s) citation-1 restarted",
    )


def test_the_containers_are_read_from_the_pods_as_the_api_lists_them() -> None:
    pods = [
        {
            "metadata": {"name": "citation-1"},
            "spec": {
                "containers": [
                    {"name": "app", "image": f"{REPO}:2a2a2a2a2a2a@{DIGEST}"},
                    {"name": "sidecar", "image": "registry:80/envoy:1"},
                ]
            },
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastTransitionTime": "2026-12-06T10:00:20Z",
                    }
                ],
                "containerStatuses": [
                    {
                        "name": "app",
                        "imageID": f"{REPO}@{DIGEST}",
                        "ready": True,
                        "restartCount": 2,
                        "state": {"running": {}},
                        "lastState": {"terminated": {"exitCode": 137}},
                    }
                ],
            },
        },
        {
            "metadata": {"name": "citation-0", "deletionTimestamp": "2026-12-06T10:00:25Z"},
            "spec": {"containers": [{"name": "app", "image": f"{REPO}@{OLD}"}]},
        },
        {"metadata": {"name": "other"}, "spec": {"containers": [{"image": f"{REPO}-x:1"}]}},
    ]
    assert containers_of(pods, REPO) == [
        Container(
            pod="citation-1",
            name="app",
            image=f"{REPO}:2a2a2a2a2a2a@{DIGEST}",
            image_id=f"{REPO}@{DIGEST}",
            ready=True,
            restarts=2,
            exit_code=137,
            ready_since=WRITTEN + timedelta(seconds=20),
        )
    ]


# -- the site config: verify, and environments[].verify field by field over it ----------


def _environments(**prod: Any) -> dict[str, Any]:
    values = load_site(env={}).to_values()
    app = values["apps"][0]
    app["environments"] = [
        {"name": "bench", "target": "prod"},
        {
            "name": "prod",
            "target": "prod",
            "application": "argocd/citation-prod",
            "namespace": "dagster-prod",
            "writeback": {**app["writeback"], "path": "deploy/prod/kustomization.yaml"},
            **prod,
        },
    ]
    return values


def test_a_failure_rolls_back_after_the_first_environment_and_holds_in_it() -> None:
    values = _environments()
    values["verify"] = {"timeout": "3m"}
    site = parse_site(values)
    app = site.app("citation")
    bench, prod = app.environments
    assert site.verify_of(app, bench).on_failure == "hold"
    assert site.verify_of(app, prod).on_failure == "rollback"
    assert site.verify_of(app, prod).timeout == "3m"


def test_an_environment_overrides_the_sites_verify_field_by_field() -> None:
    values = _environments(verify={"soak": "2m", "onFailure": "none"})
    values["verify"] = {"timeout": "3m", "checks": ["smoke"]}
    site = parse_site(values)
    app = site.app("citation")
    found = site.verify_of(app, app.environments[1])
    assert (found.timeout, found.soak, found.checks, found.on_failure) == (
        "3m", "2m", ["smoke"], "none",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("verify", "said"),
    [
        ({"timeout": "0m"}, "verify.timeout: '0m': must last more than nothing"),
        ({"soak": "5s"}, "verify.soak: '5s': a duration is days, hours and minutes"),
        ({"onFailure": "revert"}, "verify.onFailure: Input should be 'rollback', 'hold' or 'none'"),
    ],
)
def test_a_bad_verify_is_one_line_naming_its_field(verify: dict[str, Any], said: str) -> None:
    values = _environments()
    values["verify"] = verify
    with pytest.raises(ConfigError) as refused:
        parse_site(values)
    assert said in str(refused.value) and "\n" not in str(refused.value)
