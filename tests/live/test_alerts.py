"""The factory's alerts judged by the real promtool (``tests/peers/promtool``, Prometheus
3.16.0): the rules ``fabrique alerts`` prints pass ``promtool check rules``, and each
alert fires on the series it is for and stays silent on healthy ones (``promtool test
rules`` of ``tests/data/alerts/``, one file per alert)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fabrique.decisions.alerts import ALERTS, check_rules

from ..conftest import ROOT, run_cli, write_values
from . import controlplane
from .fixtures import need_go

CASES = ROOT / "tests" / "data" / "alerts"


@pytest.fixture(scope="module")
def promtool() -> str:
    need_go()
    return str(controlplane.binaries(("promtool",))["promtool"])


def _promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _rules(tmp_path: Path, *values: str) -> Path:
    result = run_cli(*values, "alerts", "--out", str(tmp_path / "rules.yaml"))
    assert result.exit_code == 0, result.output
    return tmp_path / "rules.yaml"


def test_promtool_is_the_pinned_release(promtool: str, tmp_path: Path) -> None:
    done = _promtool(promtool, "--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "promtool, version 3.16.0 " in done.stdout


def test_the_rules_pass_promtool_check_rules(promtool: str, tmp_path: Path) -> None:
    rules = _rules(tmp_path)
    done = _promtool(promtool, "check", "rules", str(rules), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_a_site_s_thresholds_and_labels_pass_promtool_too(promtool: str, tmp_path: Path) -> None:
    values = write_values(
        tmp_path / "site.yaml",
        **{
            "reconcile.schedule": "*/2 * * * *",
            "monitoring.labels": {"team": "platform"},
            "monitoring.alerts": {"window": "30m", "failingShare": 0.25, "heldFor": "2d"},
        },
    )
    rules = _rules(tmp_path, "--values", str(values))
    done = _promtool(promtool, "check", "rules", str(rules), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    text = rules.read_text()
    assert "[30m]" in text and ">= 0.25" in text and "[2d:2m]" in text and "offset 6m" in text


def test_each_alert_has_its_promtool_cases() -> None:
    """A file per alert, with a case where it fires and one where it stays silent."""
    assert sorted(p.stem for p in CASES.glob("*.yaml")) == sorted(a.name for a in ALERTS)
    for alert in ALERTS:
        tests = yaml.safe_load((CASES / f"{alert.name}.yaml").read_text())["tests"]
        verdicts = [
            bool(case["exp_alerts"])
            for test in tests
            for case in test["alert_rule_test"]
            if case["alertname"] == alert.name
        ]
        assert True in verdicts and False in verdicts, alert.name


@pytest.mark.parametrize("alert", [a.name for a in ALERTS])
def test_each_alert_fires_on_its_series_and_is_silent_on_healthy_ones(
    promtool: str, tmp_path: Path, alert: str
) -> None:
    _rules(tmp_path)
    shutil.copyfile(CASES / f"{alert}.yaml", tmp_path / f"{alert}.yaml")
    done = _promtool(promtool, "test", "rules", f"{alert}.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_and_validate_refuse_the_same_broken_rule(promtool: str, tmp_path: Path) -> None:
    """A ``for`` that is no duration: promtool refuses it, and so does fabrique's check."""
    rules = _rules(tmp_path)
    spec = yaml.safe_load(rules.read_text())
    spec["groups"][0]["rules"][0]["for"] = "5 minutes"
    rules.write_text(yaml.safe_dump(spec))
    done = _promtool(promtool, "check", "rules", str(rules), cwd=tmp_path)
    assert done.returncode != 0 and "5 minutes" in done.stdout + done.stderr
    assert check_rules(spec) == [("groups[0].rules[0].for", "not a duration: '5 minutes'")]
