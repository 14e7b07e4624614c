"""Plot processing throughput against concurrency, with the ceilings and the peers.

Two modes:

- ``plot_throughput.py RECORD``: one ``postgres_prefetch_ab.py`` record. One line per
  system (taskmill without and with the local queue, graphile-worker at its defaults and
  at its best settings), the median over the record's rounds at each concurrency, and
  the raw asyncpg ceiling as a horizontal band (its lowest to highest round). Writes a
  PNG next to the record (or ``--out``).
- ``plot_throughput.py --summary``: one panel per backend, each from the newest record
  in ``--results-dir`` that has what the panel needs: memory and SQLite from
  ``throughput-*-<backend>.json`` (with its reference: the task-per-item floor, the raw
  sqlite3 ceiling), PostgreSQL from ``postgres-prefetch-ab-*.json`` (with
  graphile-worker) plus procrastinate from ``postgres-vs-procrastinate-*.json``, MySQL
  from ``mysql-peers-*.json`` (raw aiomysql ceiling, huey), MongoDB from
  ``mongo-peers-*.json`` (raw PyMongo ceiling, Celery). Lines are taskmill at its
  defaults and at the throughput settings (``prefetch``, ``finish_window``); the
  reference is a band from its lowest to its highest round, with issue 15's target
  share of it dotted. Each panel names its file(s) and load. Figures from different
  files were not measured together: compare within a panel's main file.
  Writes ``bench/results/throughput-vs-concurrency.png`` (or ``--out``).

    uv run --group bench python bench/plot_throughput.py \\
        bench/results/postgres-prefetch-ab-<date>.json
    uv run --group bench python bench/plot_throughput.py --summary
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
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


RESULTS_DIR = Path(__file__).resolve().parent / "results"
Series = dict[str, dict[int, float]]
"""``{label: {concurrency: tasks/s}}``."""


@dataclass
class Panel:
    """What one backend's panel shows."""

    title: str
    taskmill: Series = field(default_factory=dict)
    peers: Series = field(default_factory=dict)
    reference_label: str = ""
    reference: list[float] = field(default_factory=list)
    """Every round's reference figure (a band from the lowest to the highest)."""
    ratios: Series = field(default_factory=dict)
    """taskmill's share of the reference: the median of the rounds' ratios, per line."""
    reference_lines: Series = field(default_factory=dict)
    """Further references measured per concurrency (the strict floor): grey lines."""
    target: float | None = None
    sources: list[str] = field(default_factory=list)


def setting_label(concurrency_prefetch_window: str) -> tuple[int, str]:
    concurrency, prefetch, window = concurrency_prefetch_window.split(":")
    if prefetch == "0" and float(window) == 0:
        return int(concurrency), "taskmill, defaults"
    return int(concurrency), (
        f"taskmill, prefetch {prefetch}, finish_window {float(window) * 1000:g} ms"
    )


def _newest(pattern: str, results: Path, wanted: Callable[[dict[str, Any]], bool]) -> Any:
    for path in sorted(results.glob(pattern), reverse=True):
        record = json.loads(path.read_text())
        if wanted(record):
            return path, record
    return None, None


def _load_text(loads: list[float]) -> str:
    return f"load {min(loads):.1f}-{max(loads):.1f}"


def throughput_panel(results: Path, backend: str, title: str) -> Panel | None:
    path, record = _newest(f"throughput-*-{backend}.json", results, lambda r: "reference" in r)
    if record is None:
        return None
    reference = record["reference"]
    panel = Panel(title, reference_label=reference["name"], target=reference["target_ratio"])
    for figure in record["figures"]:
        setting = f"{figure['concurrency']}:{figure['prefetch']}:{figure['finish_window']}"
        concurrency, label = setting_label(setting)
        panel.taskmill.setdefault(label, {})[concurrency] = figure["process_per_s_median"]
        panel.ratios.setdefault(label, {})[concurrency] = figure["ratio_to_reference_median"]
    panel.reference = [run["process_per_s"] for run in reference["runs"]]
    strict: dict[int, list[float]] = defaultdict(list)
    for run in reference.get("strict_floor_runs", []):
        strict[run["concurrency"]].append(run["process_per_s"])
    if strict:
        panel.reference_lines["strict floor: at most `concurrency` tasks at once (median)"] = {
            c: statistics.median(v) for c, v in strict.items()
        }
    loads = [r["load_1min"] for f in record["figures"] for r in f["runs"]]
    panel.sources.append(
        f"{path.name}: {record['settings']['tasks']:,} tasks, {record['settings']['repeat']} "
        f"rounds, {_load_text(loads)}"
    )
    return panel


def postgres_panel(results: Path) -> Panel | None:
    path, record = _newest(
        "postgres-prefetch-ab-*.json",
        results,
        lambda r: any(k.startswith("graphile-worker") for k in r["rounds"][0]),
    )
    if record is None:
        return None
    panel = Panel(
        "PostgreSQL 15", reference_label="raw asyncpg loop, claim 100 / complete 100", target=0.5
    )
    for name in (k for k, v in record["rounds"][0].items() if isinstance(v, dict)):
        median = statistics.median(r[name]["process_per_s"] for r in record["rounds"])
        if name.startswith("graphile-worker "):
            concurrency, mode = name.removeprefix("graphile-worker ").split(":")
            panel.peers.setdefault(f"graphile-worker 0.17.3, {mode}", {})[int(concurrency)] = median
        else:
            concurrency_, label = setting_label(name)
            panel.taskmill.setdefault(label, {})[concurrency_] = median
            panel.ratios.setdefault(label, {})[concurrency_] = statistics.median(
                r[name]["process_per_s"] / r["ceiling_per_s"] for r in record["rounds"]
            )
    panel.reference = [r["ceiling_per_s"] for r in record["rounds"]]
    panel.sources.append(
        f"{path.name}: {record['settings']['tasks']:,} tasks, {len(record['rounds'])} rounds, "
        f"{_load_text([r['load_before'] for r in record['rounds']])}"
    )
    procrastinate: dict[int, tuple[float, str]] = {}  # the newest file per concurrency
    for path in sorted(results.glob("postgres-vs-procrastinate-*.json")):
        other = json.loads(path.read_text())
        load = other["machine"]["load_average_1_5_15"][0]
        for key, figure in other["results"]["procrastinate"].items():
            if key.startswith("concurrency_"):
                procrastinate[figure["concurrency"]] = (
                    figure["processed_per_s"],
                    f"procrastinate c{figure['concurrency']}: {path.name}, load {load:.1f}",
                )
    if procrastinate:
        panel.peers["procrastinate 3.10 (another run)"] = {
            c: v for c, (v, _) in procrastinate.items()
        }
        panel.sources += [source for _, source in procrastinate.values()]
    return panel


def mysql_panel(results: Path) -> Panel | None:
    candidates = []
    for path in results.glob("mysql-peers-*.json"):
        record = json.loads(path.read_text())
        if record.get("rounds"):
            candidates.append((len(record["settings"]), path.name, path, record))
    if not candidates:
        return None
    _, _, path, record = max(candidates)
    panel = Panel(
        "MariaDB", reference_label="raw aiomysql loop, claim 100 / complete 100", target=None
    )
    rounds = record["rounds"]
    panel.reference = [r["raw"]["process_per_s"] for r in rounds]
    for setting in record["settings"]:
        concurrency, label = setting_label(setting)
        panel.taskmill.setdefault(label, {})[concurrency] = statistics.median(
            r["taskmill"]["current"][setting]["process_per_s"] for r in rounds
        )
        panel.ratios.setdefault(label, {})[concurrency] = statistics.median(
            r["taskmill"]["current"][setting]["process_per_s"] / r["raw"]["process_per_s"]
            for r in rounds
        )
    huey: dict[int, float] = {}
    for concurrency in rounds[0].get("huey", {}):
        huey[int(concurrency)] = statistics.median(
            r["huey"][concurrency]["process_per_s"] for r in rounds
        )
    if huey:
        panel.peers["huey SqlHuey (threads)"] = huey
    panel.sources.append(
        f"{path.name}: {record['tasks']:,} tasks, {len(rounds)} rounds, "
        f"{_load_text([r['load_before'] for r in rounds])}"
    )
    return panel


def mongo_panel(results: Path) -> Panel | None:
    candidates = []
    for path in results.glob("mongo-peers-*.json"):
        record = json.loads(path.read_text())
        rounds = record.get("rounds") or []
        settings = [k for k in (rounds[0] if rounds else {}) if k.startswith("taskmill ")]
        if rounds and record.get("settings"):
            candidates.append((len(settings), path.name, path, record))
    if not candidates:
        return None
    _, _, path, record = max(candidates)
    rounds = record["rounds"]
    panel = Panel(
        "MongoDB wire protocol (the nx-27017 stand-in)",
        reference_label="raw PyMongo loop, claim 100 / complete 100",
        target=None,
    )
    panel.reference = [r["raw_update_many"]["process_per_s"] for r in rounds]
    for name in (k for k in rounds[0] if k.startswith("taskmill ")):
        concurrency, label = setting_label(name.removeprefix("taskmill "))
        panel.taskmill.setdefault(label, {})[concurrency] = statistics.median(
            r[name]["process_per_s"] for r in rounds
        )
        panel.ratios.setdefault(label, {})[concurrency] = statistics.median(
            r[name]["process_per_s"] / r["raw_update_many"]["process_per_s"] for r in rounds
        )
    panel.sources.append(
        f"{path.name}: {record['settings']['tasks']:,} tasks, {len(rounds)} rounds, "
        f"{_load_text([r['load_before'] for r in rounds])}"
        + (f" ({record['label']})" if record.get("label") else "")
    )
    _, celery_record = _newest(
        "mongo-peers-*.json",
        results,
        lambda r: any(k.startswith("celery c") for k in (r.get("rounds") or [{}])[0]),
    )
    if celery_record is not None:
        celery = {
            int(k.removeprefix("celery c")): statistics.median(
                r[k]["process_per_s"] for r in celery_record["rounds"]
            )
            for k in celery_record["rounds"][0]
            if k.startswith("celery c")
        }
        panel.peers["Celery, kombu MongoDB transport (another run)"] = celery
        panel.sources.append(f"Celery: mongo-peers of {celery_record['date']}")
    return panel


def draw_panel(axes: Any, panel: Panel) -> None:
    lines = (*panel.taskmill.values(), *panel.peers.values(), *panel.reference_lines.values())
    concurrencies = sorted({c for points in lines for c in points})
    if panel.reference:
        axes.axhspan(
            min(panel.reference),
            max(panel.reference),
            color="0.85",
            label=f"{panel.reference_label} (range of rounds)",
        )
        if panel.target:
            axes.axhline(
                statistics.median(panel.reference) * panel.target,
                color="0.4",
                linestyle=":",
                label=f"target: {panel.target:.0%} of its median",
            )
    for label, points in sorted(panel.reference_lines.items()):
        xs = sorted(points)
        axes.plot(xs, [points[x] for x in xs], color="0.5", linestyle="--", marker="s", label=label)
    for label, points in sorted(panel.taskmill.items()):
        xs = sorted(points)
        axes.plot(xs, [points[x] for x in xs], marker="o", linewidth=2, label=label)
        for x, ratio in panel.ratios.get(label, {}).items():
            axes.annotate(
                f"{ratio:.0%}",
                (x, points[x]),
                textcoords="offset points",
                xytext=(6, -3),
                fontsize=6.5,
            )
    for label, points in sorted(panel.peers.items()):
        xs = sorted(points)
        axes.plot(xs, [points[x] for x in xs], marker="^", linestyle="-.", label=label)
    axes.set_xscale("log")
    axes.set_xticks(concurrencies)
    axes.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.set_yscale("log")
    axes.set_xlabel("concurrency (one worker process)", fontsize=8)
    axes.set_ylabel("no-op tasks processed / s (median, log scale)", fontsize=8)
    axes.set_title(panel.title + "\n" + "\n".join(panel.sources), fontsize=7)
    axes.legend(fontsize=6.5, loc="best")
    axes.grid(True, alpha=0.3)
    axes.tick_params(labelsize=7)


def summary(results: Path, out: Path) -> None:
    panels = [
        throughput_panel(results, "memory", "memory (worker in-process)"),
        throughput_panel(results, "sqlite", "SQLite (worker in its own process)"),
        postgres_panel(results),
        mysql_panel(results),
        mongo_panel(results),
    ]
    shown = [p for p in panels if p is not None]
    columns = 2 if len(shown) > 1 else 1
    rows = (len(shown) + columns - 1) // columns
    figure, grid = plt.subplots(rows, columns, figsize=(7 * columns, 5 * rows), squeeze=False)
    for axes, panel in zip(grid.flat, shown, strict=False):
        draw_panel(axes, panel)
    for axes in list(grid.flat)[len(shown) :]:
        axes.axis("off")
    figure.suptitle(
        "taskmill throughput against concurrency, beside each backend's raw ceiling (memory: "
        "the task-per-item floor) and peers; 2 shared vCPUs.\nThe percentages are taskmill's "
        "share of the reference: the median of the rounds' ratios.",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    print(f"written {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("record", type=Path, nargs="?")
    parser.add_argument("--summary", action="store_true", help="every backend, newest records")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.summary:
        summary(args.results_dir, args.out or args.results_dir / "throughput-vs-concurrency.png")
        return
    if args.record is None:
        parser.error("a postgres_prefetch_ab.py record, or --summary")
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
