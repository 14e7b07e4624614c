"""PostgreSQL bulk enqueue: taskmill's ``enqueue_many`` beside graphile-worker's
``addJobs``, and (with ``--before``) a second version of taskmill, in one invocation.

Every run is a process of its own that enqueues ``--tasks`` no-op tasks (params
``{"i": n}``) in batches of ``--batch`` into a fresh PostgreSQL schema, dropped
afterwards; only the enqueue calls are timed (building the specs included, as in
``postgres_prefetch_ab.py``), nothing drains the tasks. The systems of a round run one
after the other, in an order rotated from round to round, and the load average is
recorded before each run: the machine is shared, so the figure is the ratio within a
round, not the absolute rate.

- ``taskmill``: the code this script imports.
- ``before`` (with ``--before DIR``): another taskmill, exported with
  ``git archive <commit> core/src backends/postgres/src | tar -x -C DIR`` and put first
  on ``PYTHONPATH``; each run checks which ``taskmill`` it imported.
- ``graphile-worker``: ``addJobs`` of the version pinned in ``bench/graphile_worker``
  (``cd bench/graphile_worker && npm ci`` first), ``node bench.mjs ... enqueue``.

Recorded in ``bench/results/postgres-enqueue-ab-<date>.json``; see docs/benchmarks.md
(issue 15). ``--profile FILE`` instead runs the current taskmill once under cProfile
(only the enqueue calls) and writes the 25 functions with the most own time to FILE.

    uv run python bench/postgres_enqueue_ab.py --url "$TASKMILL_TEST_POSTGRES_URL" \\
        --before /tmp/before --batch 1000 --batch 100 --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent))

import postgres_prefetch_ab as ab

BENCH_DIR = Path(__file__).resolve().parent
GRAPHILE = "graphile-worker"


async def enqueue_run(
    url: str, tasks: int, batch: int, profile: cProfile.Profile | None = None
) -> dict[str, Any]:
    """One timed bulk enqueue with the ``taskmill`` this process imports (under
    ``profile`` when given)."""
    import taskmill
    from taskmill import Taskmill

    schema = f"bench_enq_{uuid.uuid4().hex[:8]}"
    tm = Taskmill(ab.with_schema(url, schema), plugins=False)
    try:
        async with tm:
            if profile is not None:
                profile.enable()
            started = time.perf_counter()
            for first in range(0, tasks, batch):
                await tm.enqueue_many(
                    [
                        {"task_type": "noop", "params": {"i": i}}
                        for i in range(first, min(tasks, first + batch))
                    ]
                )
            seconds = time.perf_counter() - started
            if profile is not None:
                profile.disable()
            stored = await tm.progress_summary()
            if stored.pending != tasks:
                raise RuntimeError(f"{stored.pending} of {tasks} tasks stored")
    finally:
        await ab.drop_schema(url, schema)
    return {"enqueue_per_s": tasks / seconds, "taskmill_file": taskmill.__file__}


def run_taskmill(url: str, tasks: int, batch: int, before: str | None) -> dict[str, Any]:
    """A taskmill run in a child process (``before``: that tree first on PYTHONPATH)."""
    env = dict(os.environ)
    if before is not None:
        paths = [f"{before}/core/src", f"{before}/backends/postgres/src"]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, __file__, "--url", url, "--one", str(tasks), str(batch)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"a taskmill run failed ({done.returncode}):\n{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    imported_before = before is not None and report["taskmill_file"].startswith(before)
    if imported_before != (before is not None):
        raise RuntimeError(f"the run imported {report['taskmill_file']}")
    return report


def run_graphile(url: str, tasks: int, batch: int) -> dict[str, Any]:
    schema = f"bench_gw_enq_{uuid.uuid4().hex[:8]}"
    try:
        report = ab.run_graphile_bench(url, schema, tasks, 1, "enqueue", batch)
    finally:
        asyncio.run(ab.drop_schema(url, schema))
    return {"enqueue_per_s": tasks / float(report["enqueueSeconds"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("TASKMILL_TEST_POSTGRES_URL"))
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--batch", type=int, action="append", help="tasks per call (repeatable; 1000)"
    )
    parser.add_argument("--before", help="a taskmill source tree to compare with")
    parser.add_argument("--no-graphile", action="store_true")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--profile", type=Path, help="profile one run into this file")
    parser.add_argument("--one", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.url:
        parser.error("--url or $TASKMILL_TEST_POSTGRES_URL is needed")
    if args.one:
        print(json.dumps(asyncio.run(enqueue_run(args.url, *args.one))), flush=True)
        return
    batches = args.batch or [1000]
    if args.profile:
        profile = cProfile.Profile()
        result = asyncio.run(enqueue_run(args.url, args.tasks, batches[0], profile))
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        header = (
            f"# {args.tasks} tasks in enqueue_many calls of {batches[0]} under cProfile:"
            f" {result['enqueue_per_s']:,.0f}/s, load {os.getloadavg()[0]:.2f},"
            f" taskmill from {result['taskmill_file']}"
            f" (this script at {ab._git('rev-parse', '--short', 'HEAD')})\n"
        )
        args.profile.write_text(header + text.getvalue())
        return
    systems = ["taskmill"]
    if args.before:
        systems.append("before")
    if not args.no_graphile:
        systems.append(GRAPHILE)
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        shift = number % len(systems)
        order = systems[shift:] + systems[:shift]
        for batch in batches:
            row: dict[str, Any] = {"round": number + 1, "batch": batch, "order": order}
            for system in order:
                load = os.getloadavg()[0]
                if system == GRAPHILE:
                    result = run_graphile(args.url, args.tasks, batch)
                else:
                    before = args.before if system == "before" else None
                    result = run_taskmill(args.url, args.tasks, batch, before)
                row[system] = {**result, "load_before": load}
            rounds.append(row)
            print(
                f"round {number + 1}, batch {batch}: "
                + "; ".join(
                    f"{s} {row[s]['enqueue_per_s']:,.0f}/s (load {row[s]['load_before']:.1f})"
                    for s in order
                ),
                flush=True,
            )
    summary = {str(batch): summarize(rounds, batch, systems) for batch in batches}
    print(json.dumps(summary, indent=2))
    if args.no_record:
        return
    settings = {
        "tasks": args.tasks,
        "rounds": args.rounds,
        "batches": batches,
        "systems": systems,
        "before": args.before,
    }
    ab.record("postgres-enqueue-ab", settings, rounds, summary)


def summarize(rounds: list[dict[str, Any]], batch: int, systems: list[str]) -> dict[str, Any]:
    """Medians over the rounds of ``batch``: rates, and the ratios within each round."""
    mine = [r for r in rounds if r["batch"] == batch]
    out: dict[str, Any] = {
        f"median_{s}_per_s": statistics.median(r[s]["enqueue_per_s"] for r in mine) for s in systems
    }
    for a, b in (("taskmill", GRAPHILE), ("before", GRAPHILE), ("taskmill", "before")):
        if a in systems and b in systems:
            ratios = [r[a]["enqueue_per_s"] / r[b]["enqueue_per_s"] for r in mine]
            out[f"{a}/{b}"] = {"per_round": ratios, "median": statistics.median(ratios)}
    loads = [r[s]["load_before"] for r in mine for s in systems]
    out["load_min_max"] = [min(loads), max(loads)]
    return out


if __name__ == "__main__":
    main()
