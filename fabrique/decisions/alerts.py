"""The factory's alerts as code: Prometheus alerting rules over the metrics fabrique and
Argo emit, thresholds from the site (``monitoring.alerts``).

Every series is named as Prometheus sees it. The Workflow controller serves the template
metrics of ``pipelines/`` prefixed ``argo_workflows_``, its OpenTelemetry exporter told
to add no ``_total`` and no unit (``WithoutCounterSuffixes``, ``WithoutUnits``:
``util/telemetry/exporter_prometheus.go``), so a counter keeps the name it was given:

- ``argo_workflows_fabrique_build_duration_seconds_{bucket,sum,count}{app,status}``: one
  build per run, ``status`` its Steps template's phase (``Succeeded``, ``Failed``: a
  stage failed for the commit's sake, ``Error``: the infrastructure's kind, a pod lost,
  a deadline);
- ``argo_workflows_fabrique_writeback_total{app,outcome}`` (``WRITEBACK_OUTCOMES``,
  ``failed``);
- ``argo_workflows_fabrique_reconcile_decisions_total{decision}``: every pass adds its
  counts of every decision (``DECISIONS``), zeros included, so a pass that ran moves the
  sum by its number of apps;

and the Sensor's own, ``argo_events_action_retries_failed_total{namespace,sensor_name,
trigger_name}`` (Argo Events' ``pkg/metrics``), a push the Sensor gave up on.

A counter series of Argo's template metrics is born at its first increment (an app's
first failed build makes ``status="Failed"``): ``increase()`` needs two samples and
misses that one, so every count here is ``grown()``: the whole value of a series born in
the window, else its increase.

``check_rules`` holds a rules file (or a PrometheusRule's spec) to what ``promtool check
rules`` checks of its structure, and to what fabrique asks of an alert; it cannot parse
PromQL or Go templates: ``promtool check rules`` and ``promtool test rules`` judge those
(tests/live/test_alerts.py, with the real promtool).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fabrique.decisions.reconcile import DECISIONS
from fabrique.site.config import AlertThresholds, Site
from fabrique.site.names import SENSOR
from fabrique.site.objects import Document, object_meta

GROUP = "fabrique"
RULE_NAME = "fabrique"
# where each runbook lives in the documentation site: one section per alert
RUNBOOK_PAGE = "operate/troubleshooting/"

BUILDS = "argo_workflows_fabrique_build_duration_seconds_count"
WRITEBACKS = "argo_workflows_fabrique_writeback_total"
DECIDED = "argo_workflows_fabrique_reconcile_decisions_total"
SENSOR_GAVE_UP = "argo_events_action_retries_failed_total"
SEVERITIES = ("critical", "warning", "info")
# a count in a summary: increase() extrapolates to the window's ends (3.05 for three)
COUNT = '{{ $value | printf "%.0f" }}'


def grown(selector: str, window: str) -> str:
    """What the counter ``selector`` grew by over ``window``, per series: all of a series
    born within it (``increase`` misses a series' first sample), else its increase
    (which a counter reset does not fool)."""
    return f"({selector} unless {selector} offset {window}) or increase({selector}[{window}])"


def _decided(decisions: str | None, window: str) -> str:
    """The decisions of every pass in ``window`` (``a|b``: any of them; None: all)."""
    if decisions is None:
        return f"sum({grown(DECIDED, window)})"
    assert all(d in DECISIONS for d in decisions.split("|")), decisions
    return f"sum({grown(selector(DECIDED, decision=decisions), window)})"


@dataclass(frozen=True)
class Alert:
    """One alerting rule: ``expr`` made from the site, the rest fixed."""

    name: str
    severity: str
    summary: str
    description: str
    # no ``for``: each condition is already a count over a window
    expr: Callable[[Site], str]

    @property
    def anchor(self) -> str:
        """Its section in docs/operate/troubleshooting.md (MkDocs' slug of the heading)."""
        return self.name.lower()


def selector(metric: str, **matchers: str) -> str:
    """``metric{label="value", …}``; a value with ``|`` is a regex match."""
    inner = ", ".join(
        f'{label}{"=~" if "|" in value else "="}"{value}"' for label, value in matchers.items()
    )
    return f"{metric}{{{inner}}}" if inner else metric


def _span(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 3600 else f"{seconds // 3600}h"


def _builds(by: str, t: AlertThresholds, **matchers: str) -> str:
    return f"sum{by} ({grown(selector(BUILDS, **matchers), t.window)})"


def _builds_failing(site: Site) -> str:
    t = site.monitoring.alerts
    return (
        f"{_builds(' by (app)', t, status='Failed')} >= {t.build_failures}\n"
        f"unless on (app)\n"
        f"{_builds(' by (app)', t, status='Succeeded')} > 0"
    )


def _builds_erroring(site: Site) -> str:
    t = site.monitoring.alerts
    return f"{_builds('', t, status='Error')} >= {t.build_errors}"


def _builds_failing_everywhere(site: Site) -> str:
    t = site.monitoring.alerts
    return (
        f"{_builds('', t, status='Failed|Error')}\n/ {_builds('', t)} >= {t.failing_share}\n"
        f"and {_builds('', t)} >= {t.build_failures}"
    )


def _events_lost(site: Site) -> str:
    t = site.monitoring.alerts
    return f"{_decided('submitted|written-back', t.window)} >= {t.lost_events}"


def _sensor_dropped(site: Site) -> str:
    t = site.monitoring.alerts
    counted = selector(SENSOR_GAVE_UP, namespace=site.namespaces.control, sensor_name=SENSOR)
    return f"sum({grown(counted, t.window)}) > 0"


def _safety_net_down(site: Site) -> str:
    t = site.monitoring.alerts
    window = _span(t.missed_passes * site.reconcile.period_seconds())
    # no series at all (the controller not scraped, the pass never ran) is no pass too
    return f"({_decided(None, window)} or vector(0)) == 0"


def _writeback_refused(site: Site) -> str:
    t = site.monitoring.alerts
    counted = selector(WRITEBACKS, outcome="failed|rejected")
    return f"sum by (app) ({grown(counted, t.window)}) >= {t.writeback_refusals}"


def _verify_failed(site: Site) -> str:
    t = site.monitoring.alerts
    return f"{_decided('verify-failed', t.window)} >= {t.verify_failures}"


def _rolled_back(site: Site) -> str:
    return f"{_decided('rolled-back', site.monitoring.alerts.window)} > 0"


def _hold_forgotten(site: Site) -> str:
    """Some app held at every pass for ``heldFor``: each step of the subquery (one period)
    asks whether a pass of the two periods before it counted a hold."""
    period = site.reconcile.period_seconds()
    held = f"({_decided('held', _span(2 * period))} or vector(0))"
    return f"min_over_time({held}[{site.monitoring.alerts.held_for}:{_span(period)}]) > 0"


ALERTS: tuple[Alert, ...] = (
    Alert(
        "FabriqueBuildsFailing",
        "warning",
        "{{ $labels.app }}: " + COUNT + " failed builds, none succeeded",
        "Every build of {{ $labels.app }} in the window failed (a stage failed for the "
        "commit's sake): nothing of it deploys until a commit builds.",
        _builds_failing,
    ),
    Alert(
        "FabriqueBuildsErroring",
        "warning",
        COUNT + " builds ended in Error",
        "Builds ended in Error, the infrastructure's kind (a pod lost or evicted, a "
        "deadline, the controller): not the apps' code.",
        _builds_erroring,
    ),
    Alert(
        "FabriqueBuildsFailingEverywhere",
        "critical",
        "{{ $value | humanizePercentage }} of all builds did not succeed",
        "Most builds of every app fail or err: something they share is down (the "
        "registry, Gitea, the build nodes, the allowlist).",
        _builds_failing_everywhere,
    ),
    Alert(
        "FabriqueEventsLost",
        "warning",
        "the safety net caught up " + COUNT + " lost events",
        "The safety net built or wrote back commits that the event path never did: "
        "pushes are being dropped between Gitea and the build.",
        _events_lost,
    ),
    Alert(
        "FabriqueSensorDroppedPushes",
        "warning",
        "the Sensor gave up on " + COUNT + " pushes",
        "The Sensor's trigger failed past its retries and acked the push anyway: no "
        "build came of it until the safety net's next pass.",
        _sensor_dropped,
    ),
    Alert(
        "FabriqueSafetyNetNotRunning",
        "critical",
        "no reconcile pass counted for several periods",
        "The CronWorkflow fabrique-reconcile ran no pass that counted its decisions: "
        "a lost event stays lost, a failed status unrepaired.",
        _safety_net_down,
    ),
    Alert(
        "FabriqueWriteBackRefused",
        "warning",
        "{{ $labels.app }}: " + COUNT + " write-backs refused or rejected",
        "A build of {{ $labels.app }} was made and verified, but its digest did not "
        "reach Git: every attempt failed, or its pull request was closed unmerged.",
        _writeback_refused,
    ),
    Alert(
        "FabriqueVerificationFailed",
        "warning",
        COUNT + " verifications failed after a deploy",
        "A digest deployed into an environment did not become Synced, Healthy and Ready "
        "in time: it was rolled back or held, as verify.onFailure says.",
        _verify_failed,
    ),
    Alert(
        "FabriqueRolledBack",
        "warning",
        "the safety net rolled back " + COUNT + " environments",
        "A failed verification rolled an environment back to its last verified digest "
        "and held it: the failed build waits for a person.",
        _rolled_back,
    ),
    Alert(
        "FabriqueHoldForgotten",
        "info",
        "an app has been held at every pass for days",
        "Every reconcile pass over the span counted a held app: a hold (fabrique hold, "
        "or a rollback's) is likely forgotten, and that app deploys nothing.",
        _hold_forgotten,
    ),
)


def runbook_url(site: Site, alert: Alert) -> str:
    return f"{site.monitoring.docs_url}{RUNBOOK_PAGE}#{alert.anchor}"


def rule_groups(site: Site) -> list[dict[str, Any]]:
    """The site's alerting rules, one group."""
    rules = [
        {
            "alert": alert.name,
            "expr": alert.expr(site),
            "labels": {**site.monitoring.labels, "severity": alert.severity},
            "annotations": {
                "summary": alert.summary,
                "description": alert.description,
                "runbook_url": runbook_url(site, alert),
            },
        }
        for alert in ALERTS
    ]
    return [{"name": GROUP, "rules": rules}]


def rules_file(site: Site) -> dict[str, Any]:
    """A Prometheus rules file (``rule_files:``)."""
    return {"groups": rule_groups(site)}


def prometheus_rule(site: Site) -> Document:
    """The same rules as the Prometheus Operator's PrometheusRule, in the control namespace."""
    meta = object_meta(RULE_NAME, site.namespaces.control, **site.monitoring.rule_labels)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": meta,
        "spec": {"groups": rule_groups(site)},
    }


# ------------------------------------------------------------------------ checking

# Prometheus' model.ParseDuration: units from years to milliseconds, each at most once,
# in that order ("0" alone is zero)
_DURATION = re.compile(r"^(0|(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?)$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
# a rules file's group; a PrometheusRule's adds the operator's (and Thanos') own fields
_GROUP_KEYS = frozenset({"name", "interval", "query_offset", "limit", "labels", "rules"})
_OPERATOR_GROUP_KEYS = _GROUP_KEYS | {"partial_response_strategy"}
_RULE_KEYS = frozenset(
    {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
)
ANNOTATIONS = ("summary", "description", "runbook_url")


def check_rules(spec: Any, *, operator: bool = False) -> list[tuple[str, str]]:
    """(place, problem) of every problem in a rules file (``{groups: […]}``), or in a
    PrometheusRule's ``spec`` with ``operator``.

    What ``promtool check rules`` checks of the structure: known fields only, a group's
    name present and unique, every rule a ``record`` or an ``alert`` with an ``expr``,
    ``for`` and ``keep_firing_for`` on alerts only and Prometheus durations, label names
    Prometheus', a record a metric name, no two rules alike. And what fabrique asks of an
    alert: a name unique in its group, a ``severity`` of critical, warning or info, a
    summary, a description and a runbook_url that names a section of the troubleshooting
    page (``ALERTS``' anchors).

    Not checked, and why: the PromQL of ``expr`` (Prometheus' parser is Go; a half
    parser here would pass what the real one refuses) and the Go templates of the
    annotations: ``promtool check rules`` and ``promtool test rules`` judge both.
    """
    if not isinstance(spec, dict):
        return [("", "must be a mapping with groups")]
    problems = [(key, "unknown field") for key in spec if key != "groups"]
    groups = spec.get("groups")
    if not isinstance(groups, list):
        return [*problems, ("groups", "required: a list of rule groups")]
    names: set[str] = set()
    for index, group in enumerate(groups):
        at = f"groups[{index}]"
        if not isinstance(group, dict):
            problems.append((at, "must be a mapping"))
            continue
        known = _OPERATOR_GROUP_KEYS if operator else _GROUP_KEYS
        problems += [(f"{at}.{key}", "unknown field") for key in group if key not in known]
        name = group.get("name")
        if not isinstance(name, str) or not name:
            problems.append((f"{at}.name", "required: the group's name"))
        elif name in names:
            problems.append((f"{at}.name", f"group {name!r} is repeated"))
        else:
            names.add(name)
        for key in ("interval", "query_offset"):
            if key in group and not _is_duration(group[key]):
                problems.append((f"{at}.{key}", f"not a duration: {group[key]!r}"))
        problems += _check_labels(group.get("labels"), f"{at}.labels")
        rules = group.get("rules")
        if not isinstance(rules, list):
            problems.append((f"{at}.rules", "required: a list of rules"))
            continue
        problems += _check_group_rules(rules, at)
    return problems


def _check_group_rules(rules: list[Any], at: str) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    alerts: dict[str, int] = {}
    seen: dict[str, int] = {}
    for index, rule in enumerate(rules):
        where = f"{at}.rules[{index}]"
        if not isinstance(rule, dict):
            problems.append((where, "must be a mapping"))
            continue
        problems += [(f"{where}.{key}", "unknown field") for key in rule if key not in _RULE_KEYS]
        problems += [(where + place, why) for place, why in _check_rule(rule)]
        name = rule.get("alert")
        if isinstance(name, str) and name:
            if name in alerts:
                problems.append((f"{where}.alert", f"{name} is already rules[{alerts[name]}]'s"))
            alerts.setdefault(name, index)
        same = repr(sorted((k, repr(v)) for k, v in rule.items()))
        if same in seen:
            problems.append((where, f"the same rule as rules[{seen[same]}]"))
        seen.setdefault(same, index)
    return problems


def _check_rule(rule: dict[str, Any]) -> Iterator[tuple[str, str]]:
    record, alert = rule.get("record"), rule.get("alert")
    if (record is None) == (alert is None):
        yield "", "one of record or alert, not both"
        return
    expr = rule.get("expr")
    if not isinstance(expr, str) or not expr.strip():
        yield ".expr", "required: a PromQL expression"
    if record is not None:
        if not isinstance(record, str) or not _METRIC_NAME.match(record):
            yield ".record", f"not a metric name: {record!r}"
        for key in ("for", "keep_firing_for", "annotations"):
            if key in rule:
                yield f".{key}", "an alert's field, on a recording rule"
        yield from _check_labels(rule.get("labels"), ".labels")
        return
    if not isinstance(alert, str) or not alert:
        yield ".alert", "required: the alert's name"
    for key in ("for", "keep_firing_for"):
        if key in rule and not _is_duration(rule[key]):
            yield f".{key}", f"not a duration: {rule[key]!r}"
    labels = rule.get("labels")
    yield from _check_labels(labels, ".labels")
    severity = labels.get("severity") if isinstance(labels, dict) else None
    if severity not in SEVERITIES:
        yield ".labels.severity", f"must be one of {', '.join(SEVERITIES)} (got {severity!r})"
    annotations = rule.get("annotations")
    if not isinstance(annotations, dict):
        yield ".annotations", f"required: {', '.join(ANNOTATIONS)}"
        return
    for key in ANNOTATIONS:
        value = annotations.get(key)
        if not isinstance(value, str) or not value.strip():
            yield f".annotations.{key}", "required"
    url = annotations.get("runbook_url")
    if isinstance(url, str) and url.strip():
        why = _runbook_problem(url)
        if why:
            yield ".annotations.runbook_url", why


def _check_labels(labels: Any, at: str) -> Iterator[tuple[str, str]]:
    if labels is None:
        return
    if not isinstance(labels, dict):
        yield at, "must be a mapping of label names to strings"
        return
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_NAME.match(key) or key.startswith("__"):
            yield f"{at}.{key}", "not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"
        elif not isinstance(value, str):
            yield f"{at}.{key}", f"must be a string (got {value!r})"


def _is_duration(value: Any) -> bool:
    return isinstance(value, str) and value != "" and bool(_DURATION.match(value))


def _runbook_problem(url: str) -> str | None:
    """Why ``url`` is no runbook of the troubleshooting page, or None."""
    parts = urlsplit(url)
    anchors = {alert.anchor for alert in ALERTS}
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"must be an http(s) URL (got {url!r})"
    if not parts.path.endswith("/" + RUNBOOK_PAGE):
        return f"must point into …/{RUNBOOK_PAGE} (got {url!r})"
    if parts.fragment not in anchors:
        return f"#{parts.fragment} is no section of the troubleshooting page (its: one per alert)"
    return None
