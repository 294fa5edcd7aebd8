"""bench/object_sizes.py as a person runs it, on small catalogues: the CLI renders, every
object is sized, validate judges the tree, and the Sensor's growth per app is said: none."""

from __future__ import annotations

from .conftest import run_bench


def test_the_object_sizes_bench_sizes_the_sensor_and_runs_validate() -> None:
    done = run_bench("object_sizes.py", "--apps", "1,3", timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| 1 |") or line.startswith("| 3 |")]
    assert len(rows) == 2, done.stdout
    for row in rows:
        assert row.endswith("| exit 0: the tree: valid |"), row
    one, three = (int(row.split("|")[3]) for row in rows)
    assert three == one  # one dependency and one trigger, whatever the apps
    assert [row.split("|")[2].strip() for row in rows] == ["1", "1"]  # one Sensor each
    assert lines[-1].startswith("the Sensors grow 0 bytes per app")
