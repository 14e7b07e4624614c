"""Plot processing throughput against concurrency, every backend, beside its references.

One panel per backend, each from the newest run in ``bench/results/`` that has what the
panel needs (records of any age: those converted from the per-run files of before
2026-12-04 carry the old document as their ``figures``):

- memory and SQLite: ``throughput.jsonl`` (a run with its reference: the task-per-item
  floor and the strict floors, the raw sqlite3 ceiling);
- PostgreSQL: ``headline.jsonl`` (or an older ``postgres-prefetch-ab.jsonl`` record),
  with graphile-worker, plus procrastinate from ``postgres-vs-procrastinate.jsonl``;
- MariaDB: ``mysql-peers.jsonl`` (raw aiomysql ceiling, huey);
- MongoDB (the nx-27017 stand-in): ``mongo-peers.jsonl`` (raw PyMongo ceiling, Celery).

Lines are taskmill at its settings (medians of the rounds); the reference is a band from
its lowest to its highest round, with issue 15's target share of it dotted; the
percentage beside a point is taskmill's share of the reference (the median of the
rounds' ratios). Each panel names its run(s) and load. Figures from different runs were
not measured together: compare within a panel's main run. Writes
``bench/results/throughput-vs-concurrency.png`` (or ``--out``).

    uv run --group bench python bench/plot_throughput.py
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import harness
import matplotlib.pyplot as plt

Series = dict[str, dict[int, float]]
"""``{label: {concurrency: tasks/s}}``."""
Record = dict[str, Any]


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


def setting_label(prefetch: Any, window: Any, delete: bool = False) -> str:
    """A line's label from a setting's prefetch and finish window."""
    mode = ", delete mode" if delete else ""
    if prefetch in (None, "auto", "default") and window in (None, "default"):
        return "taskmill, defaults" + mode
    if str(prefetch) == "0" and float(window or 0) == 0:
        return "taskmill, prefetch 0, no finish window" + mode
    return f"taskmill, prefetch {prefetch}, finish_window {float(window) * 1000:g} ms" + mode


def _legacy_label(text: str) -> tuple[int, str]:
    """(concurrency, label) of an old ``C:P:W`` setting (then ``C:0:0`` was the default)."""
    concurrency, prefetch, window = text.split(":")[:3]
    if prefetch == "0" and float(window) == 0:
        return int(concurrency), "taskmill, defaults before issue 27 (no prefetch)"
    return int(concurrency), setting_label(prefetch, window)


def _load_text(loads: list[float]) -> str:
    return f"load {min(loads):.1f}-{max(loads):.1f}" if loads else "load not recorded"


def documents(series: str, results: Path) -> Iterator[tuple[Record, Record]]:
    """(record, document) of every whole-run record of a series, newest first: a legacy
    record's old document, or a new record's params and figures merged."""
    for record in reversed(harness.read_series(series, results)):
        if record["name"] == "legacy":
            yield record, record["figures"]
        elif record["round"] is None:
            yield record, {**record["params"], **record["figures"]}


def runs(series: str, results: Path) -> list[list[Record]]:
    """The new per-measurement records of a series, grouped by invocation, newest first."""
    grouped: dict[str, list[Record]] = defaultdict(list)
    for record in harness.read_series(series, results):
        if record["name"] != "legacy" and record["round"] is not None:
            grouped[record["run"]].append(record)
    return sorted(grouped.values(), key=lambda rs: rs[0]["date"], reverse=True)


def _by_name(records: list[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if "skipped" not in record["figures"]:
            out[record["name"]].append(record)
    return out


def _median(records: list[Record], key: str = "process_per_s") -> float:
    return float(statistics.median(r["figures"][key] for r in records))


def _from_new_run(panel: Panel, records: list[Record], reference_name: str) -> None:
    """taskmill lines, the reference band and the ratios from one invocation's records."""
    names = _by_name(records)
    reference = names.get(reference_name, [])
    panel.reference = [r["figures"]["process_per_s"] for r in reference]
    for mine in names.values():
        params = mine[0]["params"]
        if params.get("system") != "taskmill" or "concurrency" not in params:
            continue
        label = setting_label(
            params["prefetch"], params["finish_window"], params.get("delete_completed", False)
        )
        concurrency = int(params["concurrency"])
        panel.taskmill.setdefault(label, {})[concurrency] = _median(mine)
        ratios = harness.ratios(mine, reference)
        if ratios:
            panel.ratios.setdefault(label, {})[concurrency] = statistics.median(ratios)
    loads = [r["load_1min"] for r in records]
    panel.sources.append(
        f"{records[0]['series']} run {records[0]['run']}: {records[0]['params']['tasks']:,} "
        f"tasks, {max(r['round'] for r in records)} rounds, {_load_text(loads)}"
    )


def throughput_panel(results: Path, backend: str, title: str) -> Panel | None:
    reference_name = {"memory": "task-per-item floor", "sqlite": "raw sqlite3 ceiling"}[backend]
    new = next(
        (rs for rs in runs("throughput", results) if any(r["name"] == reference_name for r in rs)),
        None,
    )
    old = next(
        (
            (rec, doc)
            for rec, doc in documents("throughput", results)
            if doc.get("backend") == backend and "reference" in doc
        ),
        None,
    )
    target = {"memory": 0.5, "sqlite": 0.25}[backend]
    panel = Panel(title, reference_label=reference_name, target=target)
    if new is not None and (old is None or new[0]["date"] >= old[0]["date"]):
        mine = [r for r in new if r["params"].get("backend") == backend]
        _from_new_run(panel, mine, reference_name)
        floors = _by_name([r for r in mine if r["name"].startswith("strict floor c")])
        if floors:
            panel.reference_lines["strict floor: at most `concurrency` tasks at once (median)"] = {
                int(name.removeprefix("strict floor c")): _median(rs) for name, rs in floors.items()
            }
        return panel
    if old is None:
        return None
    record, doc = old
    reference = doc["reference"]
    panel.reference_label = reference["name"]
    for figure in doc["figures"]:
        concurrency, label = _legacy_label(
            f"{figure['concurrency']}:{figure['prefetch']}:{figure['finish_window']}"
        )
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
    loads = [r["load_1min"] for f in doc["figures"] for r in f["runs"]]
    panel.sources.append(
        f"{record['source_file']}: {doc['settings']['tasks']:,} tasks, "
        f"{doc['settings']['repeat']} rounds, {_load_text(loads)}"
    )
    return panel


def postgres_panel(results: Path) -> Panel | None:
    panel = Panel(
        "PostgreSQL", reference_label="raw asyncpg loop, claim 100 / complete 100", target=0.5
    )
    new = next(iter(runs("headline", results)), None)
    old = next(
        (
            (rec, doc)
            for rec, doc in documents("postgres-prefetch-ab", results)
            if any(k.startswith("graphile-worker") for k in doc["rounds"][0])
        ),
        None,
    )
    if new is not None and (old is None or new[0]["date"] >= old[0]["date"]):
        _from_new_run(panel, new, "raw ceiling")
        for mine in _by_name(new).values():
            params = mine[0]["params"]
            if params.get("system") == "graphile-worker" and "concurrency" in params:
                label = f"graphile-worker {params['version']}, best"
                panel.peers.setdefault(label, {})[int(params["concurrency"])] = _median(mine)
    elif old is not None:
        record, doc = old
        for name in (k for k, v in doc["rounds"][0].items() if isinstance(v, dict)):
            median = statistics.median(r[name]["process_per_s"] for r in doc["rounds"])
            if name.startswith("graphile-worker "):
                concurrency, mode = name.removeprefix("graphile-worker ").split(":")
                panel.peers.setdefault(f"graphile-worker 0.17.3, {mode}", {})[int(concurrency)] = (
                    median
                )
            else:
                concurrency_, label = _legacy_label(name)
                panel.taskmill.setdefault(label, {})[concurrency_] = median
                panel.ratios.setdefault(label, {})[concurrency_] = statistics.median(
                    r[name]["process_per_s"] / r["ceiling_per_s"] for r in doc["rounds"]
                )
        panel.reference = [r["ceiling_per_s"] for r in doc["rounds"]]
        panel.sources.append(
            f"{record['source_file']}: {doc['settings']['tasks']:,} tasks, "
            f"{len(doc['rounds'])} rounds, {_load_text([r['load_before'] for r in doc['rounds']])}"
        )
    else:
        return None
    procrastinate: dict[int, tuple[float, str]] = {}  # the newest run per concurrency
    for record, doc in documents("postgres-vs-procrastinate", results):
        for key, figure in doc["results"]["procrastinate"].items():
            if key.startswith("concurrency_") and figure["concurrency"] not in procrastinate:
                procrastinate[figure["concurrency"]] = (
                    figure["processed_per_s"],
                    f"procrastinate c{figure['concurrency']}: "
                    f"{record.get('source_file') or record['run']}, load {record['load_1min']}",
                )
    if procrastinate:
        panel.peers["procrastinate (another run)"] = {c: v for c, (v, _) in procrastinate.items()}
        panel.sources += [source for _, source in procrastinate.values()]
    return panel


def mysql_panel(results: Path) -> Panel | None:
    found = next(((r, d) for r, d in documents("mysql-peers", results) if d.get("rounds")), None)
    if found is None:
        return None
    record, doc = found
    panel = Panel("MariaDB", reference_label="raw aiomysql loop, claim 100 / complete 100")
    rounds = doc["rounds"]
    panel.reference = [r["raw"]["process_per_s"] for r in rounds]
    for setting in doc["settings"]:
        concurrency, label = _legacy_label(setting)
        panel.taskmill.setdefault(label, {})[concurrency] = statistics.median(
            r["taskmill"]["current"][setting]["process_per_s"] for r in rounds
        )
        panel.ratios.setdefault(label, {})[concurrency] = statistics.median(
            r["taskmill"]["current"][setting]["process_per_s"] / r["raw"]["process_per_s"]
            for r in rounds
        )
    huey = {
        int(c): statistics.median(r["huey"][c]["process_per_s"] for r in rounds)
        for c in rounds[0].get("huey", {})
    }
    if huey:
        panel.peers["huey SqlHuey (threads)"] = huey
    panel.sources.append(
        f"{record.get('source_file') or record['run']}: {doc['tasks']:,} tasks, "
        f"{len(rounds)} rounds, {_load_text([r['load_before'] for r in rounds])}"
    )
    return panel


def mongo_panel(results: Path) -> Panel | None:
    found = next(
        (
            (r, d)
            for r, d in documents("mongo-peers", results)
            if d.get("rounds") and d.get("settings")
        ),
        None,
    )
    if found is None:
        return None
    record, doc = found
    rounds = doc["rounds"]
    panel = Panel(
        "MongoDB wire protocol (the nx-27017 stand-in)",
        reference_label="raw PyMongo loop, claim 100 / complete 100",
    )
    panel.reference = [r["raw_update_many"]["process_per_s"] for r in rounds]
    for name in (k for k in rounds[0] if k.startswith("taskmill ")):
        concurrency, label = _legacy_label(name.removeprefix("taskmill "))
        panel.taskmill.setdefault(label, {})[concurrency] = statistics.median(
            r[name]["process_per_s"] for r in rounds
        )
        panel.ratios.setdefault(label, {})[concurrency] = statistics.median(
            r[name]["process_per_s"] / r["raw_update_many"]["process_per_s"] for r in rounds
        )
    panel.sources.append(
        f"{record.get('source_file') or record['run']}: {doc['settings']['tasks']:,} tasks, "
        f"{len(rounds)} rounds, {_load_text([r['load_before'] for r in rounds])}"
    )
    celery = next(
        (
            d
            for _, d in documents("mongo-peers", results)
            if any(k.startswith("celery c") for k in (d.get("rounds") or [{}])[0])
        ),
        None,
    )
    if celery is not None:
        panel.peers["Celery, kombu MongoDB transport (another run)"] = {
            int(k.removeprefix("celery c")): statistics.median(
                r[k]["process_per_s"] for r in celery["rounds"]
            )
            for k in celery["rounds"][0]
            if k.startswith("celery c")
        }
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
                f"{ratio:.0%}", (x, points[x]), textcoords="offset points", xytext=(6, -3),
                fontsize=6.5,
            )  # fmt: skip
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
    parser.add_argument("--summary", action="store_true", help="(the only mode; accepted)")
    parser.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    summary(args.results_dir, args.out or args.results_dir / "throughput-vs-concurrency.png")


if __name__ == "__main__":
    main()
