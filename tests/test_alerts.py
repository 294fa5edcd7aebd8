"""The factory's alerts as code: what the site sets, what render writes, and what
``fabrique validate`` refuses of a rules file or a PrometheusRule (the structure
``promtool check rules`` checks; tests/live/test_alerts.py runs the real promtool)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.decisions.alerts import ALERTS, check_rules, prometheus_rule, rules_file
from fabrique.decisions.reconcile import DECISIONS
from fabrique.render import render_tree
from fabrique.site.config import load_site
from fabrique.site.errors import FabriqueError
from fabrique.site.names import WRITEBACK_OUTCOMES

from .conftest import ROOT, run_cli, write_values

TROUBLESHOOTING = ROOT / "docs" / "operate" / "troubleshooting.md"
WATCHING = ROOT / "docs" / "operate" / "watching.md"


def _site(tmp_path: Path, **overrides: Any):  # type: ignore[no-untyped-def]
    return load_site(write_values(tmp_path / "site.yaml", **overrides), env={})


def test_every_series_is_one_fabrique_or_argo_emits() -> None:
    """Argo's exporter adds no _total and no unit: the names are the templates' own,
    prefixed; the decisions and outcomes named are the ones the code counts."""
    text = yaml.safe_dump(rules_file(load_site(env={})))
    metrics = set(re.findall(r"\b(argo_\w+)\{?", text))
    assert metrics == {
        "argo_workflows_fabrique_build_duration_seconds_count",
        "argo_workflows_fabrique_writeback_total",
        "argo_workflows_fabrique_reconcile_decisions_total",
        "argo_events_action_retries_failed_total",
    }
    for decision in re.findall(r'decision=~"([^"]+)"', text):
        assert set(decision.split("|")) <= set(DECISIONS), decision
    for outcome in re.findall(r'outcome=~"([^"]+)"', text):
        assert set(outcome.split("|")) <= {*WRITEBACK_OUTCOMES, "failed"}, outcome
    build = (ROOT / "pipelines" / "build.py").read_text()
    assert 'name="fabrique_build_duration_seconds"' in build
    assert 'name="fabrique_writeback_total"' in build


def test_the_thresholds_come_from_the_site(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        **{
            "reconcile.schedule": "*/10 * * * *",
            "monitoring.labels": {"team": "platform"},
            "monitoring.docsUrl": "https://docs.example.org/fabrique/",
            "monitoring.alerts": {"buildFailures": 5, "missedPasses": 4, "window": "2h"},
        },
    )
    rules = {r["alert"]: r for r in rules_file(site)["groups"][0]["rules"]}
    assert ">= 5\nunless on (app)" in rules["FabriqueBuildsFailing"]["expr"]
    assert "[2h]" in rules["FabriqueBuildsFailing"]["expr"]
    assert "[40m]" in rules["FabriqueSafetyNetNotRunning"]["expr"]  # 4 periods of 10 minutes
    assert rules["FabriqueRolledBack"]["labels"] == {"team": "platform", "severity": "warning"}
    assert rules["FabriqueRolledBack"]["annotations"]["runbook_url"] == (
        "https://docs.example.org/fabrique/operate/troubleshooting/#fabriquerolledback"
    )
    assert check_rules(rules_file(site)) == []


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            {"monitoring.alerts": {"window": "1 hour"}},
            "monitoring.alerts.window: String should match",
        ),
        (
            {"monitoring.alerts": {"failingShare": 2}},
            "monitoring.alerts.failingShare: Input should be less",
        ),
        (
            {"monitoring.alerts": {"missedPasses": 1}},
            "monitoring.alerts.missedPasses: Input should be greater",
        ),
        (
            {"monitoring.labels": {"severity": "page"}},
            "monitoring.labels: label 'severity': each alert",
        ),
        (
            {"monitoring.labels": {"a-b": "x"}},
            "monitoring.labels: label 'a-b' must be a Prometheus",
        ),
        ({"monitoring.docsUrl": "https://docs"}, "monitoring.docsUrl: String should match"),
    ],
)
def test_a_bad_threshold_is_one_line_naming_its_field(
    tmp_path: Path, overrides: dict[str, Any], said: str
) -> None:
    with pytest.raises(FabriqueError) as caught:
        _site(tmp_path, **overrides)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_the_default_tree_holds_no_prometheus_rule_and_the_switch_adds_one(
    tmp_path: Path,
) -> None:
    assert not [p for p in render_tree(load_site(env={})) if p.startswith("monitoring/")]
    site = _site(
        tmp_path,
        **{"monitoring.prometheusRule": True, "monitoring.ruleLabels": {"release": "prom"}},
    )
    tree = render_tree(site)
    (rule,) = tree["monitoring/prometheusrule.yaml"]
    assert tree["monitoring/kustomization.yaml"][0]["resources"] == ["prometheusrule.yaml"]
    assert rule["metadata"]["namespace"] == "fabrique"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == rules_file(site)


def test_validate_checks_the_rendered_prometheus_rule(tmp_path: Path) -> None:
    values = write_values(tmp_path / "site.yaml", **{"monitoring.prometheusRule": True})
    out = tmp_path / "manifests"
    assert run_cli("--values", str(values), "render", "--out", str(out)).exit_code == 0
    assert run_cli("validate", str(out)).exit_code == 0
    path = out / "monitoring" / "prometheusrule.yaml"
    rule = yaml.safe_load(path.read_text())
    rule["spec"]["groups"][0]["rules"][1]["alert"] = "FabriqueBuildsFailing"
    del rule["spec"]["groups"][0]["rules"][2]["labels"]["severity"]
    path.write_text(yaml.safe_dump(rule))
    result = run_cli("validate", str(out))
    assert result.exit_code != 0
    assert (
        "monitoring/prometheusrule.yaml: document 0 (PrometheusRule/fabrique): "
        "spec.groups[0].rules[1].alert: FabriqueBuildsFailing is already rules[0]'s"
    ) in result.stderr
    assert "spec.groups[0].rules[2].labels.severity: must be one of critical" in result.stderr


def test_validate_checks_a_rules_file(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    assert run_cli("alerts", "--out", str(rules)).exit_code == 0
    assert run_cli("validate", str(ROOT / "manifests"), "--rules", str(rules)).exit_code == 0
    spec = yaml.safe_load(rules.read_text())
    spec["groups"][0]["rules"][0]["annotations"]["runbook_url"] += "-typo"
    rules.write_text(yaml.safe_dump(spec))
    result = run_cli("validate", str(ROOT / "manifests"), "--rules", str(rules))
    assert result.exit_code != 0
    assert (
        f"{rules}: document 0 (rules): groups[0].rules[0].annotations.runbook_url: "
        "#fabriquebuildsfailing-typo is no section of the troubleshooting page"
    ) in result.stderr


def test_fabrique_alerts_prints_the_rules_file() -> None:
    result = run_cli("alerts")
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout) == rules_file(load_site(env={}))


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda s: s.update(extra=1), ("extra", "unknown field")),
        (lambda s: s["groups"].append({"name": "fabrique", "rules": []}),
         ("groups[1].name", "group 'fabrique' is repeated")),
        (lambda s: s["groups"][0].update(interval="1 m"), ("groups[0].interval", "not a duration: '1 m'")),
        (lambda s: s["groups"][0]["rules"][0].update(record="x"),
         ("groups[0].rules[0]", "one of record or alert, not both")),
        (lambda s: s["groups"][0]["rules"][0].update(expr=""),
         ("groups[0].rules[0].expr", "required: a PromQL expression")),
        (lambda s: s["groups"][0]["rules"][0].update(keep_firing_for="5mm"),
         ("groups[0].rules[0].keep_firing_for", "not a duration: '5mm'")),
        (lambda s: s["groups"][0]["rules"][0]["labels"].update({"team-a": "x"}),
         ("groups[0].rules[0].labels.team-a", "not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")),
        (lambda s: s["groups"][0]["rules"][0]["annotations"].pop("summary"),
         ("groups[0].rules[0].annotations.summary", "required")),
        (lambda s: s["groups"][0]["rules"].append(dict(s["groups"][0]["rules"][0], alert="Other")),
         None),
        (lambda s: s["groups"][0]["rules"].append({"record": "a b", "expr": "1"}),
         ("groups[0].rules[10].record", "not a metric name: 'a b'")),
        (lambda s: s["groups"][0]["rules"].append({"record": "fabrique:x", "expr": "1", "for": "1m"}),
         ("groups[0].rules[10].for", "an alert's field, on a recording rule")),
    ],
)  # fmt: skip
def test_check_rules_names_each_problem_with_its_place(edit, problem) -> None:  # type: ignore[no-untyped-def]
    spec = rules_file(load_site(env={}))
    edit(spec)
    problems = check_rules(spec)
    if problem is None:
        assert problems == []
    else:
        assert problem in problems, problems


def test_two_rules_alike_are_refused() -> None:
    spec = rules_file(load_site(env={}))
    spec["groups"][0]["rules"].append(dict(spec["groups"][0]["rules"][0]))
    assert ("groups[0].rules[10]", "the same rule as rules[0]") in check_rules(spec)


def test_each_runbook_is_a_section_of_the_troubleshooting_page_and_listed_on_watching() -> None:
    """MkDocs' slug of a heading ``### FabriqueX`` is ``fabriquex``, the runbook's anchor;
    ``mkdocs build --strict`` holds the watching page's links to them."""
    headings = re.findall(r"^### (\w+)$", TROUBLESHOOTING.read_text(), re.M)
    watching = WATCHING.read_text()
    for alert in ALERTS:
        assert alert.name in headings, alert.name
        assert f"troubleshooting.md#{alert.anchor})" in watching, alert.name


def test_the_prometheus_rule_is_a_kubernetes_object_of_the_control_namespace() -> None:
    rule = prometheus_rule(load_site(env={}))
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["labels"]["app.kubernetes.io/part-of"] == "fabrique"
