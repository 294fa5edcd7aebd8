"""bench/render_cli.py as a person runs it, on a small catalogue: render and validate each
a process of their own, this checkout beside an older commit's CLI in the same run."""

from __future__ import annotations

from .conftest import run_bench


def test_the_render_cli_bench_times_render_and_validate_beside_an_older_commit() -> None:
    done = run_bench(
        "render_cli.py", "--apps", "3", "--before", "HEAD", "--repeat", "1", timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("validate's `kubectl kustomize`: ")
    assert lines[1] == ("| apps | commit | render (s) | validate (s) | both (s) | validate says |")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[3:]]
    assert [row[0] for row in rows] == ["3", "3"], done.stdout
    assert rows[1][1].endswith("(before)") and not rows[0][1].endswith("(before)")
    for _, _, render, validate, both, says in rows:
        assert 0 < float(render) and 0 < float(validate), done.stdout
        assert abs(float(both) - float(render) - float(validate)) <= 0.011  # each rounded
        assert says.startswith("exit 0: ") and says.endswith("valid"), says
