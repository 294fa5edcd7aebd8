"""Render cost against the size of the app catalogue, measured side by side in one run.

    python bench/render.py [--apps 1,50,200] [--repeat 3]

For each catalogue size it renders the whole tree in memory (no disk) and prints the best
wall time of --repeat runs, the peak Python memory (tracemalloc) and the time per app
relative to the smallest catalogue. Per-app cost that stays flat means linear growth.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from typing import Any

from fabrique.render import dump_documents, render_tree
from fabrique.site.config import default_values, parse_site


def site_with(apps: int) -> Any:
    return parse_site(values_with(apps))


def values_with(apps: int) -> dict[str, Any]:
    """The default site's values with ``apps`` apps, each its own context and overlay."""
    values = default_values()
    template = values["apps"][0]
    values["apps"] = [
        {
            **template,
            "name": f"app-{index:03d}",
            "image": f"app-{index:03d}",
            "context": f"apps/app-{index:03d}",
            "writeback": {
                **template["writeback"],
                "path": f"apps/app-{index:03d}/deploy/kustomization.yaml",
            },
        }
        for index in range(apps)
    ]
    return values


def measure(apps: int, repeat: int) -> tuple[float, int]:
    site = site_with(apps)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for documents in render_tree(site).values():
            dump_documents(documents)
        best = min(best, time.perf_counter() - start)
    tracemalloc.start()
    for documents in render_tree(site).values():
        dump_documents(documents)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return best, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", default="1,50,200")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(n) for n in args.apps.split(",")]
    rows = [(n, *measure(n, args.repeat)) for n in sizes]
    base_per_app = rows[0][1] / rows[0][0]
    baseline = f"per-app vs {sizes[0]}"
    print(f"{'apps':>6} {'wall (ms)':>10} {'peak (KiB)':>11} {'ms/app':>8} {baseline:>16}")
    for apps, wall, peak in rows:
        per_app = wall / apps
        ratio = per_app / base_per_app
        print(
            f"{apps:>6} {wall * 1000:>10.1f} {peak / 1024:>11.0f} "
            f"{per_app * 1000:>8.2f} {ratio:>15.2f}x"
        )


if __name__ == "__main__":
    main()
