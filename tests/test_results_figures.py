"""Every figure bench/RESULTS.md quotes is tied to the one cell of a table it comes from.

A figure is a number with the unit of something measured: a time (s, ms, min), a size
(kB, KiB, MB, GB), a ratio (a times sign), requests. Quoted in the prose, or in a column
of a table that quotes the others (``QUOTING``: the targets' results, the scenario's
account of its stages), it is tied here (``TIES``, section by section, in the order the
page quotes them) to its table, column and row, and must be a value of that cell, as
printed or rounded to the digits quoted; or to the difference of two cells; or it is one
of the bench's settings (``SETTING``: a latency it adds, the data it makes) or a
constant of a peer's code the prose names (``UPSTREAM``). A figure changed in the prose,
or a table re-measured without its prose, fails here, and so does a figure quoted
without a tie.

Runs that no bench prints (the peers' builds, the scenario on a cluster, the fault
bench's phases) are tables of the page too, written from what was measured, and their
prose is held to them the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from .conftest import ROOT

RESULTS = ROOT / "bench" / "RESULTS.md"
NUMBER = r"\d{1,3}(?: \d{3})+(?![\d.])|\d+(?:\.\d+)?"
# a number, not part of a date, a version or a name, followed by a measured unit
FIGURE = re.compile(
    rf"(?<![\w.:/-])(?P<value>{NUMBER})\s?"
    r"(?P<unit>ms|s|min|kB|KiB|MB|GB|\u00d7|requests|request|req)(?![\w-])"
)
SOURCE = re.compile(rf"(?<![\w.:/-])(?:{NUMBER})(?![\w.-]*\d)")


def _value(text: str) -> float:
    return float(text.replace(" ", ""))


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """The document cut at its ``## `` headings (a ``###`` stays in its section)."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append((line[3:], []))
        else:
            sections[-1][1].append(line)
    return sections


def _prose(lines: list[str], quoting: str | None) -> list[str]:
    """The lines of prose, with the cells of the tables' ``quoting`` column: not the
    code blocks nor the other cells (what a bench printed, or what was measured)."""
    prose: list[str] = []
    header: list[str] = []
    in_code = False
    for line in lines:
        if line.startswith("```"):
            in_code = not in_code
        elif in_code:
            continue
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not header:
                header = cells
            elif quoting in header and not set(cells[0]) <= set("-: "):
                prose.append(cells[header.index(quoting)])
        else:
            header = []
            prose.append(line)
    return prose


@dataclass(frozen=True)
class Cell:
    """The cell of ``column`` in the one row whose cells ``row`` names (header: value),
    in a table of the section whose title starts with ``section``."""

    section: str
    column: str
    row: dict[str, str]


@dataclass(frozen=True)
class Difference:
    """One cell's number less another's (a figure the prose works out)."""

    of: Cell
    less: Cell


SETTING = "a setting of the bench"
UPSTREAM = "a constant of a peer's code, named where it is quoted"
TIMES = "\u00d7"  # a ratio's sign
Tie = Cell | Difference | str

SCALE = "Reconcile at scale"
WRITEBACK = "Write-back cost against repository size"
EVENTS = "What a push costs on the event path"
GITEA = "The Gitea double beside a real Gitea"
MODES = "A write-back through a pull request beside a direct one"


def _scale(column: str, apps: str, latency: str = "10") -> Cell:
    return Cell(SCALE, column, {"apps": apps, "files": "50", "latency (ms)": latency})


def _contents(column: str, commits: str, latency: str) -> Cell:
    return Cell(WRITEBACK, column, {"commits": commits, "latency (ms)": latency})


def _mode(column: str, transport: str, mode: str) -> Cell:
    return Cell(MODES, column, {"transport": transport, "mode": mode})


PUSH_TO_WORKFLOW = Cell(EVENTS, "push → Workflow (s)", {"apps": "1 000", "push": "one app"})
VS_CLONE = "Contents API vs clone: time / bytes"
CONTENTS = "Contents API s / requests / bytes"
GITEA_COLD = Cell(GITEA, "cold", {"apps / files": "1 000 / 50", "server": "gitea"})
NEXT_S, NEXT_REQUESTS = "next (median / max s)", "next requests"
SCENARIO = "Scenario 34"
FAULTS = "Fault bench"
LIVE = "The live tier"


def _stage(stage: str) -> Cell:
    return Cell(SCENARIO, "run 1", {"stage (seconds after the push)": stage})


def _fault(column: str, figure: str) -> Cell:
    return Cell(FAULTS, column, {"figure": figure})


def _modules(peer: str) -> Cell:
    return Cell(LIVE, "modules", {"peer": peer})


ARGO_EVENTS = (
    "argo-events (v1.9.11): one `argo-events` command "
    "(controller, eventsource-service, sensor-service)"
)
IN_THE_POD = Difference(_stage("the build step done"), _stage("the build step's pod started"))
# the scenario asks Argo CD to look once the Workflow is done, not once the digest is in Git
ARGO_CD_WAITS = Difference(_stage("the Workflow done"), _stage("the digest in Git"))
IN_ALL, BEFORE_FILTERS = "time in all", "real, before the triggers filtered"

# section (the start of its title) -> the column of its tables that quotes the others
QUOTING = {"Targets": "result", SCENARIO: "what takes the time"}

FLAT = "The event path, flat"
CHAIN = "The chain at the speed of its build"


def _chain(stage: str, column: str) -> Cell:
    return Cell(CHAIN, column, {"stage (seconds after the push)": stage})


def _flat(column: str, apps: str, code: str = "after", push: str | None = None) -> Cell:
    return Cell(FLAT, column, {"apps": apps, "code": code, **({"push": push} if push else {})})


UNDONE = "A deploy that breaks undoes itself"


def _undone(stage: str, column: str) -> Cell:
    return Cell(UNDONE, column, {"from the broken build's pod failing (seconds)": stage})


VERDICT = "the verdict posted (`fabrique/citation/bench/verified`, success)"
POD_READY = "the app's pod Ready by the digest"


def _good(stage: str) -> Cell:
    return Cell(UNDONE, "run 1", {"stage (seconds after the good push)": stage})


RENDER_CLI = "Render and validate at ten thousand apps"


def _render(apps: str, commit: str = "f261fa7") -> Cell:
    return Cell(RENDER_CLI, "both (s)", {"apps": apps, "commit": commit})


GROUP = "One push, one commit"
PULLS = "One push, one pull request"


def _group(column: str, apps: str, variant: str) -> Cell:
    return Cell(GROUP, column, {"apps": apps, "variant": variant})


def _group_ratio(column: str) -> Cell:
    return Cell(GROUP, f"{column}, per app / grouped", {"apps": "200"})


def _pulls(column: str, apps: str, variant: str) -> Cell:
    return Cell(PULLS, column, {"apps": apps, "variant": variant})


def _group_run(column: str, run: str) -> Cell:
    return Cell(GROUP, column, {"run (200 apps)": run})


# section (the start of its title) -> its figures in the order quoted, each tied
TIES: dict[str, list[tuple[str, Tie]]] = {
    RENDER_CLI: [
        ("11.23 s", _render("10 000")),
        ("2.66 s", _render("1 000")),
        ("32.89 s", _render("1 000", "d4dfd22 (before, this run)")),
        ("0.8 s", SETTING),  # the import a change saved, measured by -X importtime
        ("1.40 s", _render("10", "6063b4e")),
        ("2.11 s", _render("10", "f261fa7 (before)")),
        ("3.11 s", _render("1 000", "6063b4e")),
        ("3.21 s", _render("1 000", "f261fa7 (before)")),
        ("11.50 s", _render("10 000", "6063b4e")),
    ],
    FLAT: [
        ("60 s", SETTING),  # the idle run
        ("61.6 s", _flat("ready (s)", "1 000", "before d4dfd22")),
        ("6.7 s", _flat("ready (s)", "10 000", "after, beside a test run")),
        ("2.67 s", _flat("push → build p50 (s)", "10 000", "after, alone")),
        ("3.64 s", _flat("push → build p50 (s)", "10 000", "after, beside a test run")),
        ("1.52 s", _flat("push → build p50 (s)", "1 000")),
        ("1.75 s", _flat("push → build p50 (s)", "10")),
        ("0.96 s", _flat("push → build (s)", "10", "before d4dfd22", "one app")),
        ("1.40 s", _flat("push → build (s)", "1 000", "before d4dfd22", "one app")),
    ],
    # the controller's requeue time, as fabrique installs it
    "The chain at the speed of its build": [
        ("2 s", SETTING),
        ("0.7 s", SETTING),  # the bare builds of the two later runs (printed, not tabled)
        ("1.9 s", _chain("the build's Workflow created", "run 1 p50")),
        ("11.3 s", _chain("the digest in Git", "run 1 p50")),
        ("6.3 s", _chain("the digest in Git (the write-back's commit)", "one pod p50")),
        ("14.3 s", _chain("the app's pod Ready by the digest", "run 1 p50")),
        ("8.3 s", _chain("the app's pod Ready by the digest", "one pod p50")),
    ],
    "A deploy that breaks undoes itself": [
        ("5 s", SETTING),  # the look's period (VERIFY_EVERY)
        ("0.3 s", SETTING),  # the poll of the pods
        ("60 s", SETTING),  # the target
        ("6.7 s", _undone("every pod of the app Ready on it again", "p50")),
        ("7.1 s", _undone("every pod of the app Ready on it again", "max")),
        ("5 s", SETTING),
        ("4.0 s", Difference(_good(VERDICT), _good(POD_READY))),
        ("9.0 s", Difference(_good("the build's Workflow done"), _good(POD_READY))),
    ],
    "": [
        ("200 MB", SETTING),
        ("10 ms", SETTING),
        ("10 ms", SETTING),
        ("10 ms", SETTING),
        ("3.054 requests", _scale("cold", "1 000", "0")),
    ],
    EVENTS: [
        ("1.35 s", PUSH_TO_WORKFLOW),
        ("1.6 s", Cell(EVENTS, "Sensors CPU (s)", {"apps": "1 000", "push": "one app"})),
    ],
    WRITEBACK: [
        ("10 ms", SETTING),
        (f"12.4{TIMES}", _contents(VS_CLONE, "50 000", "10")),
        ("232.6 MB", _contents("full clone s / bytes", "50 000", "10")),
        ("0 ms", SETTING),
        ("10 ms", SETTING),
        ("0 ms", SETTING),
        ("2 requests", _contents(CONTENTS, "1 000", "0")),
        ("10 ms", SETTING),
        ("200 MB", SETTING),
    ],
    SCALE: [
        ("10 s", SETTING),  # the load average's sampling
        ("0.79 s", _scale("idle", "200")),
        ("0.97 s", _scale("idle", "1 000")),
        ("10 ms", SETTING),
        ("53 requests", _scale("idle", "1 000")),
        ("10 ms", SETTING),
        ("3.054 requests", _scale("cold", "1 000")),
        ("0 ms", SETTING),
        ("10 ms", SETTING),
    ],
    GITEA: [
        ("0 ms", SETTING),
        ("135.35 s", GITEA_COLD),
        ("52.40 s", Cell(GITEA, "cold", {"apps / files": "1 000 / 50", "server": "double"})),
        ("213.59 s", GITEA_COLD),
        ("3.56 s", Cell(GITEA, "idle", {"apps / files": "1 000 / 50", "server": "double"})),
    ],
    "Reconcile with one target file per app": [
        (
            "4 requests",
            Cell(
                "Reconcile with one target file per app",
                "0 ms",
                {"figure": "`fabrique reconcile` of 200 apps, concurrency 1"},
            ),
        ),
    ],
    "Targets": [
        ("630.1 ms", Cell("Render", "wall (ms)", {"apps": "200"})),
        (
            "3 requests",
            Difference(_contents(CONTENTS, "1 000", "10"), _contents(CONTENTS, "1 000", "0")),
        ),
        (f"20 576{TIMES}", _contents(VS_CLONE, "50 000", "10")),
        (f"12.4{TIMES}", _contents(VS_CLONE, "50 000", "10")),
        ("10 ms", SETTING),
        (f"7.5{TIMES}", _contents(VS_CLONE, "50 000", "0")),
        ("0 ms", SETTING),
        ("0.97 s", _scale("idle", "1 000")),
        ("1.35 s", _scale("one", "1 000")),
        ("37.38 s", _scale("cold", "1 000")),
        ("135.35 s", GITEA_COLD),
        ("0 ms", SETTING),
        ("0.79 s", _scale("idle", "200")),
        ("0.97 s", _scale("idle", "1 000")),
        ("10 ms", SETTING),
        ("0.97 s", _scale("idle", "1 000")),
        (
            "231.6 ms",
            Cell(SCALE, "median (ms)", {"command": "`fabrique --version`, 5 processes"}),
        ),
        ("13 requests", Cell(SCALE, "idle", {"apps": "10", "files": "10"})),
        ("63.3 MB", _scale("peak memory, idle (MB)", "1 000")),
        ("1.35 s", PUSH_TO_WORKFLOW),
    ],
    "The build step with the real BuildKit": [
        (
            "0.4 s",
            Difference(
                Cell(
                    "The build step",
                    "wall (s)",
                    {"build": "cold: nothing in `<image>:buildcache`"},
                ),
                Cell("The build step", "wall (s)", {"build": "again, `build.cache` off"}),
            ),
        ),
    ],
    SCENARIO: [
        ("2 s", UPSTREAM),  # the Argo controller's requeue
        ("7 s", IN_THE_POD),
        ("11 s", ARGO_CD_WAITS),
        ("7 s", IN_THE_POD),
        ("51 s", _stage("**the pod Ready by digest**")),
        ("5 MB", SETTING),  # the toy app's base image
        ("11 s", ARGO_CD_WAITS),
    ],
    FAULTS: [
        ("16 s", _fault("doubles", IN_ALL)),
        ("1 min", _fault("real", IN_ALL)),
        ("22 s", _fault("real", IN_ALL)),
        (
            "30.3 s",
            _fault(
                "real",
                "starting the plane, the site, the Argo Events controller, its pods and Gitea",
            ),
        ),
        ("3 min", _fault(BEFORE_FILTERS, IN_ALL)),
        ("30 s", _fault(BEFORE_FILTERS, IN_ALL)),
        ("2 s", _fault("real", "the Sensor back on the bus after it went")),
        ("5 s", UPSTREAM),  # the EventSource's connection daemon's tick
    ],
    LIVE: [
        ("1.4 GB", _modules("gitea (v1.27.3)")),
        ("2.7 GB", _modules(ARGO_EVENTS)),
    ],
    MODES: [
        ("8 requests", _mode(NEXT_REQUESTS, "gitea", "pull-request")),
        ("1.66 s", _mode(NEXT_S, "gitea", "pull-request")),
        ("1.13 s", _mode(NEXT_S, "gitea", "commit")),
        ("10 requests", _mode(NEXT_REQUESTS, "gitea", "pull-request, autoMerge")),
        ("2.29 s", _mode(NEXT_S, "gitea", "pull-request, autoMerge")),
        ("4 requests", _mode(NEXT_REQUESTS, "git", "pull-request, autoMerge")),
        ("0.86 s", _mode("replay: outcome, s, requests", "git", "pull-request, autoMerge")),
    ],
    GROUP: [
        ("15.51 s", _group("seconds", "200", "grouped")),
        ("153.43 s", _group("seconds", "200", "per-app")),
        ("164.6 s", _group("fabrique CPU (s)", "200", "per-app")),
        ("126.0 s", _group("Gitea CPU (s)", "200", "per-app")),
        ("4.6 s", _group("Gitea CPU (s)", "200", "grouped")),
        (f"156.8{TIMES}", _group_ratio("write-back requests")),
        (f"11.4{TIMES}", _group_ratio("all requests")),
        ("201 requests", _group("status requests", "200", "grouped")),
    ],
    PULLS: [
        ("28.76 s", _pulls("seconds", "200", "grouped")),
        ("235.20 s", _pulls("seconds", "200", "per-app")),
        (f"114.6{TIMES}", Cell(PULLS, "write-back requests, per app / grouped", {"apps": "200"})),
        (f"9.0{TIMES}", Cell(PULLS, "all requests, per app / grouped", {"apps": "200"})),
        ("405 requests", _pulls("status requests", "200", "grouped")),
        (f"4.8{TIMES}", Cell(PULLS, "all requests, per app / grouped", {"apps": "20"})),
    ],
}


Table = tuple[list[str], list[list[str]]]


def _tables(lines: list[str]) -> list[Table]:
    """The Markdown tables of a section: each its header cells and its rows' cells."""
    tables: list[Table] = []
    block: list[list[str]] = []
    for line in [*lines, ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(block) > 2:
            tables.append((block[0], block[2:]))
        block = []
    return tables


def quoted(text: str) -> tuple[dict[str, list[str]], dict[str, list[Table]]]:
    """The figures each section quotes, in order, and each section's tables."""
    figures: dict[str, list[str]] = {}
    tables: dict[str, list[Table]] = {}
    for title, lines in _sections(text):
        tables[title] = _tables(lines)
        quoting = next((c for key, c in QUOTING.items() if title.startswith(key)), None)
        prose = _prose(lines, quoting)
        # one text: a figure may be cut from its unit at a line's end
        figures[title] = [m.group(0) for m in FIGURE.finditer(" ".join(prose))]
    return figures, tables


def _cell(cell: Cell, tables: dict[str, list[Table]]) -> str:
    found = [
        row[header.index(cell.column)]
        for title, section in tables.items()
        if title.startswith(cell.section)
        for header, rows in section
        if cell.column in header and set(cell.row) <= set(header)
        for row in rows
        if all(row[header.index(key)] == value for key, value in cell.row.items())
    ]
    assert len(found) == 1, f"{cell}: {len(found)} cells, not one"
    return found[0]


def _numbers(text: str) -> list[float]:
    return [_value(n) for n in SOURCE.findall(text)]


def _holds(figure: str, tie: Tie, tables: dict[str, list[Table]]) -> bool:
    match = FIGURE.match(figure)
    assert match is not None
    value, digits = _value(match.group("value")), _decimals(match.group("value"))
    if isinstance(tie, Cell):
        candidates = _numbers(_cell(tie, tables))
    elif isinstance(tie, Difference):
        # the numbers of one place in both cells (a time, a count, a size)
        of, less = _numbers(_cell(tie.of, tables)), _numbers(_cell(tie.less, tables))
        candidates = [a - b for a, b in zip(of, less, strict=True)]
    else:
        return True
    return any(abs(round(n, digits) - value) < 1e-9 for n in candidates)


def problems(text: str, ties: dict[str, list[tuple[str, Tie]]]) -> list[str]:
    """What is wrong: a section whose figures are not those tied, in that order, or a
    figure its cell does not hold."""
    figures, tables = quoted(text)
    found = []
    for title, quotes in figures.items():
        tied = next((t for key, t in ties.items() if key and title.startswith(key)), None)
        tied = ties.get("", []) if tied is None and not title else (tied or [])
        if [figure for figure, _ in tied] != quotes:
            found.append(
                f"{title or '(top)'}: quotes {quotes}, tied {[f for f, _ in tied]}: tie each "
                "figure to its cell in tests/test_results_figures.py's TIES"
            )
            continue
        found += [
            f"{title or '(top)'}: {figure} is not what its cell holds ({tie})"
            for figure, tie in tied
            if not _holds(figure, tie, tables)
        ]
    return found


def test_every_figure_quoted_is_its_cells() -> None:
    assert problems(RESULTS.read_text(), TIES) == []


@pytest.mark.parametrize(
    ("quoted", "changed"),
    [
        ("push → Workflow is 1.35 s", "push → Workflow is 0.63 s"),  # a number of another table
        ("costs 8 requests", "costs 3 requests"),  # a number of another cell of its table
        (f"12.4{TIMES} faster", f"7.5{TIMES} faster"),  # another row's
        ("7 s of 51 s", "7 s of 47 s"),  # the scenario's stages
        ("30.3 s of it", "42.3 s of it"),  # the fault bench's phases: another row's
        ("Gitea's 1.4 GB", "Gitea's 1.3 GB"),  # a peer's modules: its build cache
        ("7 s in the pod", "6 s in the pod"),  # a column that quotes the others
    ],
)
def test_a_figure_changed_in_the_prose_is_found(quoted: str, changed: str) -> None:
    text = " ".join(RESULTS.read_text().split(" "))
    assert quoted in " ".join(text.split()), quoted
    moved = re.sub(r"\s+".join(map(re.escape, quoted.split())), changed, text, count=1)
    assert problems(moved, TIES) != []


def test_a_table_measured_again_without_its_prose_is_found() -> None:
    text = RESULTS.read_text()
    row = "| 1 000 | 40 | 72 348 | 64.3 | one app | 1 | 1 | 1.35 |"
    assert row in text
    found = problems(text.replace(row, row.replace("1.35", "1.41")), TIES)
    assert any("1.35 s is not what its cell holds" in line for line in found), found


def test_the_safety_net_page_counts_an_idle_pass_as_results_measured_it() -> None:
    """The safety net page's requests of a pass where nothing changed (1 000 apps over 50 files)
    are those of RESULTS' table at that size."""
    readme = " ".join((ROOT / "docs" / "operate" / "safety-net.md").read_text().split())
    quoted = re.findall(r"1 000 apps over 50 files: (\d+) requests", readme)
    row = re.search(
        r"^\| 1 000 \| 50 \| 10 \| [^|]+ \| [\d.]+ s, (\d+) ", RESULTS.read_text(), re.M
    )
    assert quoted, "the safety net's page quotes it"
    assert row is not None, "RESULTS' table of the passes at scale has the row"
    assert set(quoted) == {row.group(1)}
