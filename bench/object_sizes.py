"""The rendered objects' sizes against the apps, beside what a default cluster stores.

    python bench/object_sizes.py [--apps 10,200,1000]

For each catalogue size it writes a values file of that many apps (``bench/render.py``'s
``values_with``), renders it with the CLI (``fabrique --values FILE render``), sizes every
rendered object as its compact JSON (what the API server stores for a custom resource),
and runs ``fabrique validate`` over the tree, as a platform team would. It prints the
Sensor's size, the largest object, their share of etcd's default request limit
(1.5 MiB, ``fabrique.validate.ETCD_REQUEST_LIMIT``), and validate's verdict.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.render import values_with
from fabrique.validate import ETCD_REQUEST_LIMIT

FABRIQUE = [sys.executable, "-m", "fabrique"]


def sizes(tree: Path) -> dict[str, int]:
    """Each rendered object's compact JSON size, by Kind/name."""
    found = {}
    for path in sorted(tree.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "kind" in doc:
                key = f"{doc['kind']}/{doc['metadata']['name']}"
                found[key] = len(json.dumps(doc, separators=(",", ":")).encode())
    return found


@dataclass(frozen=True)
class Row:
    apps: int
    sensor: int
    largest: str
    largest_bytes: int
    validate: str  # validate's exit status and its first line

    @property
    def share(self) -> str:
        return f"{100 * self.sensor / ETCD_REQUEST_LIMIT:.0f} %"


def measure(apps: int, work: Path) -> Row:
    values = work / f"values-{apps}.yaml"
    values.write_text(yaml.safe_dump(values_with(apps)))
    tree = work / f"tree-{apps}"
    subprocess.run([*FABRIQUE, "--values", str(values), "render", "--out", str(tree)],
                   check=True, capture_output=True)  # fmt: skip
    found = sizes(tree)
    largest = max(found, key=found.__getitem__)
    checked = subprocess.run(
        [*FABRIQUE, "validate", str(tree)], capture_output=True, text=True, check=False
    )
    said = (checked.stdout + checked.stderr).splitlines()
    verdict = f"exit {checked.returncode}: {said[0].replace(str(tree), 'the tree') if said else ''}"
    return Row(apps, found["Sensor/fabrique-build"], largest, found[largest], verdict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", default="10,200,1000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        rows = [measure(int(n), Path(work)) for n in args.apps.split(",")]
    print(f"etcd's default request limit: {ETCD_REQUEST_LIMIT} bytes")
    print("| apps | Sensor (bytes) | of the limit | largest object (bytes) | fabrique validate |")
    print("| ---: | ---: | ---: | --- | --- |")
    for row in rows:
        print(
            f"| {row.apps} | {row.sensor} | {row.share} | {row.largest} ({row.largest_bytes}) "
            f"| {row.validate} |"
        )
    # the Sensor grows by the same bytes per app: where it crosses the limit
    first, last = rows[0], rows[-1]
    per_app = (last.sensor - first.sensor) / (last.apps - first.apps)
    print(f"the Sensor grows {per_app:.0f} bytes per app: the limit at about "
          f"{(ETCD_REQUEST_LIMIT - first.sensor) / per_app + first.apps:.0f} apps")  # fmt: skip


if __name__ == "__main__":
    main()
