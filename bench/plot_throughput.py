"""Plot processing throughput against concurrency from a ``postgres_prefetch_ab.py`` record.

One line per system (taskmill without and with the local queue, graphile-worker at its
defaults and at its best settings), the median over the record's rounds at each
concurrency, and the raw asyncpg ceiling as a horizontal band (its lowest to highest
round). Writes a PNG next to the record (or ``--out``).

    uv run --group bench python bench/plot_throughput.py \\
        bench/results/postgres-prefetch-ab-<date>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def series(record: dict[str, Any]) -> dict[str, dict[int, float]]:
    """``{label: {concurrency: median tasks/s}}`` from a record's rounds."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    names = [k for k in record["rounds"][0] if isinstance(record["rounds"][0][k], dict)]
    for name in names:
        median = statistics.median(r[name]["process_per_s"] for r in record["rounds"])
        if name.startswith("graphile-worker "):
            concurrency, mode = name.removeprefix("graphile-worker ").split(":")
            label = f"graphile-worker ({mode})"
        else:
            concurrency, prefetch, window = name.split(":")
            label = (
                "taskmill (no prefetch)"
                if prefetch == "0"
                else f"taskmill (prefetch {prefetch}, window {float(window) * 1000:g} ms)"
            )
        out[label][int(concurrency)] = median
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("record", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    record = json.loads(args.record.read_text())
    ceilings = [r["ceiling_per_s"] for r in record["rounds"]]
    loads = [r["load_before"] for r in record["rounds"]]
    figure, axes = plt.subplots(figsize=(8, 5))
    axes.axhspan(
        min(ceilings),
        max(ceilings),
        color="0.85",
        label="raw asyncpg loop, claim 100 / complete 100 (range of rounds)",
    )
    for label, points in sorted(series(record).items()):
        xs = sorted(points)
        axes.plot(xs, [points[x] for x in xs], marker="o", label=label)
    axes.set_xscale("log")
    axes.set_xticks(sorted({c for p in series(record).values() for c in p}))
    axes.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.set_xlabel("concurrency (one worker process)")
    axes.set_ylabel("no-op tasks processed per second (median of rounds)")
    axes.set_title(
        f"PostgreSQL 15, 2 shared cores, {record['settings']['tasks']:,} tasks per run, "
        f"{len(ceilings)} rounds, load {min(loads):.1f}-{max(loads):.1f}",
        fontsize=9,
    )
    axes.legend(fontsize=8)
    axes.grid(True, alpha=0.3)
    out = args.out or args.record.with_suffix(".png")
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    print(f"written {out}")


if __name__ == "__main__":
    main()
