"""Every figure bench/RESULTS.md quotes comes from one of its own tables.

A figure is a number with the unit of something measured: a time (s, ms, min), a size
(kB, KiB, MB, GB), a ratio (a times sign), requests. Quoted in the prose, or in the result column of
the targets' table, it must be a value of one of the tables (or charts) the benches
printed, as printed or rounded to the digits quoted. A figure carried over from an
earlier run, from another machine or from a sum done by hand has no table, and fails
here: update the table from the bench's output, or quote what it holds.

The sections listed in ``BY_HAND`` report runs that no bench prints as a table (the
peers' builds, the scenario on a cluster, the fault bench's phases); they are not checked.
"""

from __future__ import annotations

import re

from .conftest import ROOT

RESULTS = ROOT / "bench" / "RESULTS.md"
BY_HAND = (
    "Scenario 34",
    "Fault bench",
    "The live tier",
    "The build step with the real BuildKit",
)
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


def _split(lines: list[str]) -> tuple[list[str], list[str]]:
    """The lines of tables and code blocks (what a bench printed), and the others."""
    printed, prose = [], []
    in_code = False
    for line in lines:
        if line.startswith("```"):
            in_code = not in_code
            continue
        (printed if in_code or line.startswith("|") else prose).append(line)
    return printed, prose


def quoted_and_printed(text: str) -> tuple[list[tuple[str, str]], set[float]]:
    """The figures quoted (section, figure as written) and every number printed."""
    quoted: list[tuple[str, str]] = []
    printed_numbers: set[float] = set()
    for title, lines in _sections(text):
        if title.startswith(BY_HAND):
            continue
        printed, prose = _split(lines)
        if title == "Targets":
            # its result column quotes the tables above; the target column is the goal
            for row in printed:
                cells = [c.strip() for c in row.strip("|").split("|")]
                if len(cells) > 1 and not set(cells[1]) <= set("-: "):
                    prose.append(cells[1])
            printed = []
        for line in printed:
            printed_numbers.update(_value(n) for n in SOURCE.findall(line))
        # one text: a figure may be cut from its unit at a line's end
        quoted.extend((title, m.group(0)) for m in FIGURE.finditer(" ".join(prose)))
    return quoted, printed_numbers


def _printed(figure: str, numbers: set[float]) -> bool:
    match = FIGURE.match(figure)
    assert match is not None
    value, digits = _value(match.group("value")), _decimals(match.group("value"))
    return any(abs(round(n, digits) - value) < 1e-9 for n in numbers)


def test_every_figure_quoted_is_in_a_table() -> None:
    quoted, numbers = quoted_and_printed(RESULTS.read_text())
    assert len(quoted) > 20, "the figures of the prose are found"
    missing = [
        f"{section or '(top)'}: {figure}"
        for section, figure in quoted
        if not _printed(figure, numbers)
    ]
    assert missing == [], "figures that no table of RESULTS holds:\n" + "\n".join(missing)


def test_a_figure_from_no_table_is_found() -> None:
    text = (
        "# Results\n\n## Reconcile\n\n| apps | cold |\n| ---: | ---: |\n"
        "| 1 000 | 135.35 s, 3054 req |\n\n"
        "The cold pass takes 135 s (135.35 s), 3 054 requests; 73.2 s on 2026-12-03 with v1.27.3.\n"
        "\n## Targets\n\n| target | result |\n| --- | --- |\n"
        "| a pass under 10 s | 40.4 s |\n"
    )
    quoted, numbers = quoted_and_printed(text)
    missing = [figure for _, figure in quoted if not _printed(figure, numbers)]
    assert missing == ["73.2 s", "40.4 s"]


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
