"""Where a taskmill-postgres task's time goes: the worker's Python against the server.

For each ``--setting concurrency:prefetch:finish_window`` (with ``throughput.py``'s
``:delete`` and ``:batch=N`` suffixes), one worker in this process
drains ``--tasks`` no-op tasks (enqueued first, in a schema of the run's own, dropped
afterwards), and the script measures over the drain alone:

- the worker process's CPU time (``getrusage``: the event loop, asyncpg, the worker);
- the PostgreSQL server's CPU time: the postmaster and every process it forked, read
  from ``/proc`` (so the server must run on this machine, its data directory readable:
  run as root or as the server's user);
- with the ``pg_stat_statements`` extension installed and loaded
  (``shared_preload_libraries``), the execution time of the claim and finish
  statements and the WAL they wrote, per task;
- the CPU share of a core of the two busiest server processes (the claiming and the
  finishing backends). With ``worker_flow.py``'s share of the drain in which each call
  is in flight, this says who waits.

Rounds alternate the settings. Every run is one record of
``bench/results/postgres-cpu-split.jsonl``.
See docs/benchmarks.md (issue 15, "Where the time goes").

    uv run python bench/postgres_cpu_split.py --url "$TASKMILL_TEST_POSTGRES_URL"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import asyncpg
import harness
from harness import PostgresSchemas, Recorder, load_1min, now_iso
from throughput import Setting, enqueue_all, open_taskmill

_TICK = os.sysconf("SC_CLK_TCK")


def _server_processes(data_directory: str) -> list[int]:
    """The postmaster's pid and those of its children (the backends, WAL writer...)."""
    master = int(Path(data_directory, "postmaster.pid").read_text().split()[0])
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [master, *(int(pid) for pid in children)]


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0  # ended meanwhile (its time went with it: a small undercount)
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


class ServerClock:
    """The server's CPU time, summed over its processes (new backends included)."""

    def __init__(self, data_directory: str) -> None:
        self.data_directory = data_directory
        self.start: dict[int, float] = {}
        self.per_process: dict[int, float] = {}

    def begin(self) -> None:
        self.start = {p: _cpu_seconds(p) for p in _server_processes(self.data_directory)}

    def seconds(self) -> float:
        now = {p: _cpu_seconds(p) for p in _server_processes(self.data_directory)}
        self.per_process = {p: now[p] - self.start.get(p, 0.0) for p in now}
        return sum(self.per_process.values())


async def _statements(admin: asyncpg.Connection[Any]) -> list[dict[str, Any]]:
    # Only this run's statements since the reset (the text is cut at
    # track_activity_query_size, 1 kB by default, so it may not name the schema).
    rows = await admin.fetch(
        "SELECT calls, total_exec_time, rows, wal_bytes, query FROM pg_stat_statements"
        " ORDER BY total_exec_time DESC LIMIT 5"
    )
    out = []
    for row in rows:
        query = " ".join(row["query"].split())
        if query.startswith("WITH picked"):
            kind = "claim"
        elif "u(id, worker_id, attempt, kind, result" in query:
            kind = "finish"
        else:
            kind = "other"
        out.append(
            {
                "kind": kind,
                "calls": row["calls"],
                "exec_ms": row["total_exec_time"],
                "rows": row["rows"],
                "wal_bytes": int(row["wal_bytes"]),
                "query": query[:120],
            }
        )
    return out


async def one_run(
    url: str,
    admin: asyncpg.Connection[Any],
    clock: ServerClock,
    tasks: int,
    setting: Setting,
    statements: bool,
) -> dict[str, Any]:
    schemas = PostgresSchemas(url, "bench_split")
    run_url, schema = schemas.url()
    tm = open_taskmill(run_url, "noop", setting.batch)
    try:
        async with tm:
            await enqueue_all(tm, "noop", tasks, 1000)
            worker = tm.worker(**setting.worker_args(), handle_signals=False)
            if statements:
                await admin.execute("SELECT pg_stat_statements_reset()")
            before = resource.getrusage(resource.RUSAGE_SELF)
            clock.begin()
            started = time.perf_counter()
            await worker.run_until_idle()
            seconds = time.perf_counter() - started
            server = clock.seconds()
            after = resource.getrusage(resource.RUSAGE_SELF)
            if worker.processed != tasks:
                raise RuntimeError(f"{worker.processed} of {tasks} processed")
            found = await _statements(admin) if statements else []
    finally:
        await schemas.drop(schema)
    python = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {
        "tasks_per_s": tasks / seconds,
        "python_cpu_us_per_task": python / tasks * 1e6,
        "server_cpu_us_per_task": server / tasks * 1e6,
        "wall_us_per_task": seconds / tasks * 1e6,
        "busiest_server_processes_share": [
            round(cpu / seconds, 3) for cpu in sorted(clock.per_process.values(), reverse=True)[:2]
        ],
        "statements": [
            {
                **s,
                "exec_us_per_task": s["exec_ms"] * 1000 / tasks,
                "wal_bytes_per_task": s["wal_bytes"] / tasks,
            }
            for s in found
        ],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--setting", action="append", help="concurrency:prefetch:finish_window")
    parser.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    settings = [Setting.parse(s) for s in args.setting or ["10:1000:0.002", "100:1000:0.002"]]
    recorder = Recorder(
        "postgres-cpu-split", results_dir=args.results_dir, enabled=not args.no_record
    )
    admin = await asyncpg.connect(harness.plain_dsn(args.url))
    try:
        data_directory = await admin.fetchval("SHOW data_directory")
        server = str(await admin.fetchval("SHOW server_version"))
        statements = bool(
            await admin.fetchval(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
            )
        ) and "pg_stat_statements" in str(await admin.fetchval("SHOW shared_preload_libraries"))
        clock = ServerClock(data_directory)
        clock.begin()  # fails here, before any run, if the server is not readable
        runs: dict[str, list[dict[str, Any]]] = {s.label: [] for s in settings}
        for round_ in range(args.rounds):
            for setting in settings:
                load, date = load_1min(), now_iso()
                run = await one_run(args.url, admin, clock, args.tasks, setting, statements)
                runs[setting.label].append(run)
                params = {
                    "url": harness.redact(args.url),
                    "tasks": args.tasks,
                    "server_version": server,
                    "pg_stat_statements": statements,
                    **setting.params(),
                }
                recorder.record(
                    setting.label, run, params=params, round=round_ + 1, load=load, date=date
                )
                by_kind = {s["kind"]: s["exec_us_per_task"] for s in run["statements"]}
                print(
                    f"round {round_ + 1} {setting.label}: {run['tasks_per_s']:,.0f} tasks/s, "
                    f"python {run['python_cpu_us_per_task']:.1f} us/task, server "
                    f"{run['server_cpu_us_per_task']:.1f} us/task, wall "
                    f"{run['wall_us_per_task']:.1f} us/task"
                    + (
                        f" (claim {by_kind.get('claim', 0):.1f}, finish "
                        f"{by_kind.get('finish', 0):.1f} us/task executing)"
                        if by_kind
                        else ""
                    )
                    + f", busiest server processes {run['busiest_server_processes_share']}"
                    f" of a core, load {load:.1f}",
                    flush=True,
                )
    finally:
        await admin.close()
    for label, mine in runs.items():
        medians = {
            key: round(statistics.median(r[key] for r in mine), 1)
            for key in (
                "tasks_per_s",
                "python_cpu_us_per_task",
                "server_cpu_us_per_task",
                "wall_us_per_task",
            )
        }
        print(label, "median:", json.dumps(medians))
    recorder.done()


if __name__ == "__main__":
    asyncio.run(main())
