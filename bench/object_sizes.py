"""The rendered objects' sizes against the apps, beside what a default cluster stores.

    python bench/object_sizes.py [--apps 10,200,1000]

For each catalogue size it writes a values file of that many apps (``bench/render.py``'s
``values_with``), renders it with the CLI (``fabrique --values FILE render``), sizes every
rendered object as its compact JSON (what the API server stores for a custom resource),
and runs ``fabrique validate`` over the tree, as a platform team would. It prints how
many Sensors render made, the largest one's size, the environment variable that hands
it to its pod (``SENSOR_OBJECT``) against Linux's limit for one variable (128 KiB,
``POD_ENV_LIMIT``, the bound that matters: etcd's 1.5 MiB is twelve times higher), the
largest object of the tree, and validate's verdict; then what an app adds to the Sensor
(nothing since the Sensor holds one dependency and one trigger, whatever the apps).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.render import values_with
from fabrique.site.limits import POD_ENV_LIMIT, pod_env_size

FABRIQUE = [sys.executable, "-m", "fabrique"]


def documents(tree: Path) -> dict[str, dict[str, Any]]:
    """Each rendered object, by Kind/name."""
    found = {}
    for path in sorted(tree.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "kind" in doc:
                found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def size(doc: dict[str, Any]) -> int:
    """Its compact JSON size: what the API server stores for a custom resource."""
    return len(json.dumps(doc, separators=(",", ":")).encode())


@dataclass(frozen=True)
class Row:
    apps: int
    sensors: int  # how many
    sensor: int  # the largest one's bytes
    env: int  # the largest one's SENSOR_OBJECT variable, bytes
    total: int  # all of them
    largest: str
    largest_bytes: int
    validate: str  # validate's exit status and its first line

    @property
    def share(self) -> str:
        return f"{100 * self.env / POD_ENV_LIMIT:.0f} %"


def measure(apps: int, work: Path) -> Row:
    values = work / f"values-{apps}.yaml"
    values.write_text(yaml.safe_dump(values_with(apps)))
    tree = work / f"tree-{apps}"
    subprocess.run([*FABRIQUE, "--values", str(values), "render", "--out", str(tree)],
                   check=True, capture_output=True)  # fmt: skip
    docs = documents(tree)
    found = {key: size(doc) for key, doc in docs.items()}
    largest = max(found, key=found.__getitem__)
    checked = subprocess.run(
        [*FABRIQUE, "validate", str(tree)], capture_output=True, text=True, check=False
    )
    said = (checked.stdout + checked.stderr).splitlines()
    verdict = f"exit {checked.returncode}: {said[0].replace(str(tree), 'the tree') if said else ''}"
    sensors = [doc for key, doc in docs.items() if key.startswith("Sensor/")]
    sized = [size(doc) for doc in sensors]
    env = max(pod_env_size(doc) for doc in sensors)
    return Row(apps, len(sensors), max(sized), env, sum(sized), largest, found[largest], verdict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", default="10,200,1000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        rows = [measure(int(n), Path(work)) for n in args.apps.split(",")]
    print(f"Linux's limit for one environment variable: {POD_ENV_LIMIT} bytes")
    print("| apps | Sensors | largest Sensor (bytes) | its SENSOR_OBJECT (bytes) | of the limit "
          "| largest object (bytes) | fabrique validate |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for row in rows:
        print(
            f"| {row.apps} | {row.sensors} | {row.sensor} | {row.env} | {row.share} "
            f"| {row.largest} ({row.largest_bytes}) | {row.validate} |"
        )
    first, last = rows[0], rows[-1]
    per_app = (last.total - first.total) / max(last.apps - first.apps, 1)
    print(f"the Sensors grow {per_app:.0f} bytes per app, from {first.total} bytes "
          f"at {first.apps} app(s)")  # fmt: skip


if __name__ == "__main__":
    main()
