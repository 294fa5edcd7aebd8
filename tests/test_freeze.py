"""Freeze windows (``freeze[]`` of the site and of each environment): the windows as
python-dateutil's rrule gives them, the site config's errors, and whether a moment is
frozen, until when."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fabrique.decisions.holds import Hold
from fabrique.decisions.reconcile import DECISIONS, STATUS, decide
from fabrique.decisions.writeback import (
    Deploy,
    Outcome,
    open_transport,
    write_back,
    write_back_many,
)
from fabrique.site.config import load_site, parse_site
from fabrique.site.errors import ConfigError
from fabrique.site.freeze import Frozen, Window, frozen_at, parse_duration

from .conftest import GITEA_TOKEN, Repo, run_cli, write_values
from .doubles.gitea import GiteaDouble
from .test_reconcile import VERIFIED, _facts
from .test_verify import _environments

DIGEST = "sha256:" + "a" * 64

WEEKEND = Window(
    datetime(2026, 12, 4, 18, tzinfo=UTC), timedelta(hours=62), "weekend", "FREQ=WEEKLY;BYDAY=FR"
)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30m", timedelta(minutes=30)),
        ("64h", timedelta(hours=64)),
        ("3d", timedelta(days=3)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("1h30m", timedelta(hours=1, minutes=30)),
    ],
)
def test_a_duration_is_days_hours_and_minutes(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "0m", "1w", "90s", "1.5h", "h", "400d", "2h1d"])
def test_any_other_duration_is_refused_saying_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text)):
        parse_duration(text)


def test_a_recurring_window_holds_from_its_start_for_its_duration() -> None:
    assert frozen_at([WEEKEND], at("2026-12-11T17:59:00+00:00")) is None
    inside = frozen_at([WEEKEND], at("2026-12-11T18:00:00+00:00"))
    assert inside == Frozen(at("2026-12-14T08:00:00+00:00"), "weekend")
    assert frozen_at([WEEKEND], at("2026-12-14T07:59:00+00:00")) == inside
    assert frozen_at([WEEKEND], at("2026-12-14T08:00:00+00:00")) is None
    # the first window is start's, and nothing before it
    assert frozen_at([WEEKEND], at("2026-12-01T20:00:00+00:00")) is None
    assert inside.describe() == "frozen until 2026-12-14T08:00Z: weekend"


def test_a_window_without_a_rule_opens_once() -> None:
    once = Window(at("2026-12-24T00:00:00+00:00"), timedelta(days=3), "Christmas")
    assert frozen_at([once], at("2026-12-25T12:00:00+00:00")) is not None
    assert frozen_at([once], at("2027-12-25T12:00:00+00:00")) is None


def test_a_time_zone_keeps_the_windows_clock_time_across_daylight_saving() -> None:
    """Fridays at 18:00 in Paris: 17:00 UTC in winter, 16:00 UTC in summer. Without the
    zone, start's offset (+01:00) would open the summer's an hour late."""
    paris = Window(
        at("2026-12-04T18:00:00+01:00"),
        timedelta(hours=1),
        "end of week",
        "FREQ=WEEKLY;BYDAY=FR",
        "Europe/Paris",
    )
    assert frozen_at([paris], at("2027-01-08T17:30:00+00:00")) is not None
    assert frozen_at([paris], at("2027-07-02T16:30:00+00:00")) is not None
    fixed = Window(paris.start, paris.duration, paris.reason, paris.rule)
    assert frozen_at([fixed], at("2027-07-02T16:30:00+00:00")) is None


def test_windows_that_overlap_or_touch_make_one_freeze_until_the_last_ends() -> None:
    first = Window(at("2026-12-20T00:00:00+00:00"), timedelta(days=2), "release week")
    second = Window(at("2026-12-22T00:00:00+00:00"), timedelta(days=3), "Christmas")
    found = frozen_at([first, second], at("2026-12-21T00:00:00+00:00"))
    assert found == Frozen(at("2026-12-25T00:00:00+00:00"), "release week; Christmas")


def test_a_naive_moment_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        frozen_at([WEEKEND], datetime(2026, 12, 11, 19))


def _site(**freeze: Any) -> dict[str, Any]:
    values = load_site(env={}).to_values()
    values["freeze"] = [{"start": "2026-12-04T18:00:00Z", "duration": "62h", "reason": "weekend"}]
    values["freeze"][0].update(freeze)
    return values


@pytest.mark.parametrize(
    ("freeze", "said"),
    [
        ({"rrule": "FREQ=FORTNIGHTLY"}, "freeze[0].rrule: 'FREQ=FORTNIGHTLY': not an RFC 5545"),
        ({"rrule": "FREQ=MINUTELY"}, "FREQ=MINUTELY is finer than a calendar's window"),
        ({"rrule": "DTSTART:20261204T180000Z\nRRULE:FREQ=DAILY"}, "the rule alone"),
        ({"duration": "2w"}, "freeze[0].duration: '2w'"),
        ({"start": "2026-12-04T18:00:00"}, "freeze[0].start: Input should have timezone info"),
        ({"timezone": "Mars/Olympus"}, "'Mars/Olympus': no such time zone"),
        ({"reason": ""}, "freeze[0].reason"),
    ],
)
def test_a_bad_window_is_one_line_naming_its_field(freeze: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_site(_site(**freeze))
    assert said in str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_environment_is_frozen_by_its_own_windows_and_the_sites() -> None:
    christmas_window = {"start": "2026-12-24T00:00:00Z", "duration": "3d", "reason": "Christmas"}
    values = _environments(freeze=[christmas_window])
    site = parse_site(values)
    citation = site.app("citation")
    bench, prod = citation.environments
    christmas = at("2026-12-25T00:00:00+00:00")
    assert site.frozen(citation, bench, christmas) is None
    assert site.frozen(citation, None, christmas) is None  # the build's: the first's
    assert site.frozen(citation, prod, christmas) == Frozen(
        at("2026-12-27T00:00:00+00:00"), "Christmas"
    )
    weekend = parse_site(_site(rrule="FREQ=WEEKLY;BYDAY=FR") | {"apps": values["apps"]})
    friday = at("2026-12-11T20:00:00+00:00")
    assert weekend.frozen(citation, bench, friday) is not None
    assert weekend.frozen(citation, prod, friday) is not None


# -- every write into a frozen environment stops, and says until when --------------------


def _now_window(**more: Any) -> dict[str, Any]:
    """A window that holds now: opened an hour ago, for two hours."""
    start = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=0)
    return {"start": start.isoformat(), "duration": "2h", "reason": "INC-7 freeze"} | more


def test_a_build_in_a_freeze_writes_nothing_and_says_until_when(
    code_repo: Repo, gitea: GiteaDouble, tmp_path: Path
) -> None:
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "freeze": [_now_window()]}
    )
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"}, "v2")
    head = code_repo.head()
    out = tmp_path / "out"
    done = run_cli(
        *("--values", str(values), "writeback", "--app", "citation"),
        *("--revision", revision, "--digest", DIGEST, "--out", str(out)),
        env={"FABRIQUE_GITEA_TOKEN": GITEA_TOKEN},
    )
    assert done.exit_code == 0, done.stderr
    said = done.stdout.strip().splitlines()[-1]
    assert said.startswith(f"frozen: citation registry:80/citation-dagster:{revision[:12]}@")
    assert re.search(r"frozen until \d{4}-\d\d-\d\dT\d\d:\d\dZ: INC-7 freeze", said), said
    assert code_repo.head() == head, "nothing committed"
    assert (out / "outcome").read_text() == "frozen"


def test_a_rollback_is_written_in_a_freeze(
    code_repo: Repo, gitea: GiteaDouble, tmp_path: Path
) -> None:
    """It undoes: a freeze stops what deploys something new, never the way back."""
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "freeze": [_now_window()]}
    )
    site = load_site(values, env={})
    revision = code_repo.commit({"dataops/citation-dagster/app.txt": "v2\n"}, "v2")
    hold = Hold(by="alice", at="2026-12-06T10:00:00Z", reason="2.3 loses uploads")
    with open_transport(site, GITEA_TOKEN) as transport:
        frozen = write_back(site, transport, "citation", revision, DIGEST)
        assert frozen.state == "frozen" and frozen.commit is None
        rolled = write_back(site, transport, "citation", revision, DIGEST, rollback=hold)
    assert rolled.state == "changed" and rolled.commit == code_repo.head()


def test_the_pass_leaves_a_verified_build_unwritten_in_a_freeze() -> None:
    frozen = "frozen until 2026-12-14T08:00Z: weekend"
    action, detail = decide(_facts(**VERIFIED, frozen=frozen))
    assert action == "frozen"
    assert detail == (
        f"{'b' * 12} was verified ({VERIFIED['verified_digest']}) but is not deployed: "
        f"{frozen}; the first pass after the window writes it"
    )
    # the build still runs: a freeze stops writes, not builds
    assert decide(_facts(frozen=frozen))[0] == "submit"
    assert STATUS["frozen"] == "frozen" and "frozen" in DECISIONS


def test_one_app_frozen_in_a_shared_file_leaves_the_others_written(
    code_repo: Repo, gitea: GiteaDouble, tmp_path: Path
) -> None:
    """Two apps pin their images in one file; prod's freeze is the second's alone."""
    values = load_site(env={}).to_values()
    values["gitea"]["url"] = gitea.url
    second = dict(values["apps"][0], name="other", image="other-app", context="dataops/other-app")
    second.pop("application", None)
    second["environments"] = [{"name": "bench", "target": "prod", "freeze": [_now_window()]}]
    values["apps"].append(second)
    site = parse_site(values)
    revision = code_repo.commit(
        {"dataops/citation-dagster/app.txt": "v2\n", "dataops/other-app/Dockerfile": "FROM x\n"},
        "both",
    )
    deploys = [Deploy("citation", revision, DIGEST), Deploy("other", revision, DIGEST)]
    with open_transport(site, GITEA_TOKEN) as transport:
        citation, other = write_back_many(site, transport, deploys)
    assert isinstance(citation, Outcome) and isinstance(other, Outcome)
    assert citation.state == "changed"
    assert other.state == "frozen" and "INC-7 freeze" in other.detail
