"""The factory's Grafana dashboard as code: what the platform team looks at, over the
series the alerts read (``alerts``), so that a panel and the alert it explains never
count differently.

Each panel's query is PromQL with Grafana's own variables: ``$__range`` (the time
range shown) and ``$__rate_interval``. Every count is ``alerts.grown`` of its counter:
a series born within the range (Argo makes a template metric's series at its first
increment) counts whole. ``queries`` gives each panel's query with those variables
replaced by values, as Grafana sends them to Prometheus: the live tier asks a real
Prometheus each of them, scraping the real Argo controller (tests/live/test_dashboard.py).

Not on it, since fabrique emits no series for them: the age of a pending commit status,
and the time from a push to its digest in Git (the build's duration, its write-back
included, is: the event path's seconds before it are not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fabrique.site.config import Site

from .alerts import BUILDS, DECIDED, WRITEBACKS, grown, selector

UID = "fabrique"
TITLE = "fabrique: the image factory"
BUCKETS = BUILDS.removesuffix("_count") + "_bucket"
# what the safety net decides when the event path lost a push: it built or wrote it
LOST = "submitted|written-back"
WIDTH, HEIGHT = 12, 8  # a panel: half of Grafana's 24 columns


@dataclass(frozen=True)
class Panel:
    """One panel: its title, what it shows, its query and each series' legend."""

    title: str
    description: str
    expr: str
    legend: str
    kind: str = "timeseries"  # or barchart, stat
    unit: str = "short"


def _sum(by: str, metric: str, **matchers: str) -> str:
    """What ``metric`` grew by over the range shown, summed (``by``: per those labels)."""
    counted = grown(selector(metric, **matchers), "$__range")
    return f"sum{f' by ({by})' if by else ''} ({counted})"


def panels(site: Site) -> list[Panel]:
    """The dashboard's panels, in their order on it."""
    del site  # the same panels for every site; the site says where its series come from
    return [
        Panel(
            "Builds by outcome, per app",
            "Builds over the range, by app and phase: Succeeded, Failed (a stage failed "
            "for the commit's sake), Error (the infrastructure's kind).",
            _sum("app, status", BUILDS),
            "{{app}} {{status}}",
            kind="barchart",
        ),
        Panel(
            "Build time, 90th percentile per app",
            "From the build's start to its digest in Git (build, verification and "
            "write-back), over the range's builds.",
            f"histogram_quantile(0.9, {_sum('app, le', BUCKETS)})",
            "{{app}}",
            kind="barchart",
            unit="s",
        ),
        Panel(
            "Write-backs by outcome",
            "What each build's write-back made of its digest: changed, unchanged, held, "
            "frozen, superseded, proposed, grouped (the push's step writes it), failed.",
            _sum("outcome", WRITEBACKS),
            "{{outcome}}",
            kind="barchart",
        ),
        Panel(
            "Safety-net decisions",
            "Every reconcile pass's decisions, summed over the range: ok is an app "
            "current; anything else is work the pass did or found.",
            _sum("decision", DECIDED),
            "{{decision}}",
            kind="barchart",
        ),
        Panel(
            "Lost events repaired",
            "Commits the safety net built or wrote back because the event path did not: "
            "pushes dropped between Gitea and the build.",
            _sum("", DECIDED, decision=LOST),
            "repaired",
            kind="stat",
        ),
        Panel(
            "Holds seen by the safety net",
            "Held apps counted by the passes over the range (an app held at every pass "
            "counts once a pass): what FabriqueHoldForgotten watches.",
            _sum("", DECIDED, decision="held"),
            "held",
            kind="stat",
        ),
    ]


def dashboard(site: Site) -> dict[str, Any]:
    """The Grafana dashboard (its JSON model), its data source chosen when imported."""
    source = {"type": "prometheus", "uid": "${datasource}"}
    shown = []
    for i, panel in enumerate(panels(site)):
        shown.append(
            {
                "id": i + 1,
                "type": panel.kind,
                "title": panel.title,
                "description": panel.description,
                "datasource": source,
                "gridPos": {"x": (i % 2) * WIDTH, "y": (i // 2) * HEIGHT, "w": WIDTH, "h": HEIGHT},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "options": {},
                "targets": [
                    {
                        "refId": "A",
                        "datasource": source,
                        "expr": panel.expr,
                        "legendFormat": panel.legend,
                        "instant": panel.kind != "timeseries",
                        "range": panel.kind == "timeseries",
                    }
                ],
            }
        )
    return {
        "uid": UID,
        "title": TITLE,
        "tags": ["fabrique"],
        "timezone": "utc",
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-24h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                }
            ]
        },
        "panels": shown,
    }


def queries(site: Site, span: str = "1h", step: str = "1m") -> list[tuple[str, str]]:
    """Each panel's title and query as Grafana sends it to Prometheus for a range of
    ``span`` (``$__range``) and a ``step`` (``$__rate_interval``)."""
    return [
        (p.title, p.expr.replace("$__range", span).replace("$__rate_interval", step))
        for p in panels(site)
    ]
