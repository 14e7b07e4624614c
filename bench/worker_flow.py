"""How a worker's claims and finishes overlap: the time each storage call is in flight.

One worker in this process drains ``--tasks`` no-op tasks (enqueued first) on the store
``--url`` names (a PostgreSQL URL is given a schema of its own, dropped afterwards;
``sqlite://`` is a fresh file; any other URL is used as it is), at each
``--setting concurrency:prefetch:finish_window`` (``throughput.py``'s ``:delete`` and
``:batch=N`` suffixes too). The script wraps the store's
``claim_batch`` and ``finish_batch_applied`` (timing only: the real calls run) and
reports, over the drain, the share of the wall time in which a claim was in flight, a
finish was, both were at once, and neither; the calls' count and mean size; and the
machine's busy share of its cores (``/proc/stat``). This is the measurement that found
the claim loop waiting for every backlog of outcomes (docs/benchmarks.md, "Issue 15:
flow between claims and finishes"). Every run is one record of
``bench/results/worker-flow.jsonl``.

    uv run python bench/worker_flow.py --url "$TASKMILL_TEST_POSTGRES_URL" \\
        --setting 100:1000:0.002 --setting 10:1000:0.002 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from harness import PostgresSchemas, Recorder, load_1min, now_iso
from throughput import Setting, enqueue_all, open_taskmill


def _cpu_ticks() -> tuple[int, int]:
    """(all, idle + iowait) jiffies of the machine so far."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return sum(values), values[3] + values[4]


async def one_run(url: str, tasks: int, setting: Setting) -> dict[str, Any]:
    schemas: PostgresSchemas | None = None
    schema = None
    run_url = url
    if harness.is_postgres(url):
        schemas = PostgresSchemas(url, "bench_flow")
        run_url, schema = schemas.url()
    elif url == "sqlite://":
        run_url = f"sqlite:///{tempfile.mkdtemp(prefix='taskmill-flow-')}/tasks.db"
    tm = open_taskmill(run_url, "noop", setting.batch)
    spans: dict[str, list[tuple[float, float, int]]] = {"claim": [], "finish": []}
    try:
        async with tm:
            await enqueue_all(tm, "noop", tasks, 1000)
            store = tm.storage
            claim_batch, finish_batch_applied = store.claim_batch, store.finish_batch_applied

            async def claim(request: Any) -> Any:
                began = time.perf_counter()
                claimed = await claim_batch(request)
                spans["claim"].append((began, time.perf_counter(), len(claimed)))
                return claimed

            async def finish(finishes: Any) -> Any:
                began = time.perf_counter()
                applied = await finish_batch_applied(finishes)
                spans["finish"].append((began, time.perf_counter(), len(finishes)))
                return applied

            store.claim_batch = claim  # type: ignore[method-assign]
            store.finish_batch_applied = finish  # type: ignore[method-assign]
            worker = tm.worker(**setting.worker_args(), handle_signals=False)
            ticks = _cpu_ticks()
            started = time.perf_counter()
            await worker.run_until_idle()
            ended = time.perf_counter()
            after = _cpu_ticks()
            if worker.processed != tasks:
                raise RuntimeError(f"{worker.processed} of {tasks} processed")
    finally:
        if schemas is not None and schema is not None:
            await schemas.drop(schema)
    wall = ended - started
    # Sweep the calls' starts and ends: how long each (claim?, finish?) state lasted.
    edges = sorted(
        [(a, 1, kind) for kind, calls in spans.items() for a, _, _ in calls]
        + [(b, -1, kind) for kind, calls in spans.items() for _, b, _ in calls]
    )
    open_calls = {"claim": 0, "finish": 0}
    states = {"both": 0.0, "claim only": 0.0, "finish only": 0.0, "neither": 0.0}
    last = started
    for at, step, kind in edges:
        claiming, finishing = open_calls["claim"] > 0, open_calls["finish"] > 0
        state = (
            "both"
            if claiming and finishing
            else "claim only"
            if claiming
            else "finish only"
            if finishing
            else "neither"
        )
        states[state] += max(0.0, min(at, ended) - last)
        last = max(last, min(at, ended))
        open_calls[kind] += step
    states["neither"] += max(0.0, ended - last)
    all_ticks, idle_ticks = after[0] - ticks[0], after[1] - ticks[1]
    out: dict[str, Any] = {
        "tasks_per_s": tasks / wall,
        "machine_busy": 1 - idle_ticks / max(all_ticks, 1),
    }
    for kind, calls in spans.items():
        busy = sum(b - a for a, b, _ in calls)
        out[f"{kind}_calls"] = len(calls)
        out[f"{kind}_mean_size"] = sum(n for _, _, n in calls) / max(len(calls), 1)
        out[f"{kind}_in_flight"] = busy / wall
    out.update({f"share_{k.replace(' ', '_')}": v / wall for k, v in states.items()})
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a store URL (sqlite:// for a fresh file)")
    parser.add_argument("--tasks", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--setting", action="append",
        help="concurrency:prefetch:finish_window (P or W `default`: the worker's own)",
    )  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    settings = [Setting.parse(s) for s in args.setting or ["100:1000:0.002"]]
    recorder = Recorder("worker-flow", results_dir=args.results_dir, enabled=not args.no_record)
    for number in range(1, args.rounds + 1):
        for setting in settings:
            load, date = load_1min(), now_iso()
            run = await one_run(args.url, args.tasks, setting)
            params = {
                "backend": harness.backend_of(args.url),
                "url": harness.redact(args.url),
                "tasks": args.tasks,
                **setting.params(),
            }
            recorder.record(setting.label, run, params=params, round=number, load=load, date=date)
            print(
                f"round {number} {setting.label}: {run['tasks_per_s']:,.0f} tasks/s; in flight:"
                f" claim {run['claim_in_flight']:.0%}, finish {run['finish_in_flight']:.0%},"
                f" both {run['share_both']:.0%}, neither {run['share_neither']:.0%};"
                f" machine busy {run['machine_busy']:.0%}, load {load:.2f}",
                flush=True,
            )
    recorder.done()


if __name__ == "__main__":
    asyncio.run(main())
