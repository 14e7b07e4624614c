"""taskmill-postgres beside procrastinate: the same work on the same PostgreSQL, one run.

Both frameworks get no-op tasks, bulk-enqueued, then drained by **one worker process
each** at the same concurrency. Measured, for each:

- **bulk enqueue**: tasks/s of batched enqueues (taskmill ``enqueue_many``, procrastinate
  ``batch_defer_async``), batches of ``--batch-size``;
- **processing**: tasks/s of one worker process draining the queue, timed inside that
  process from the worker's start until it returns (taskmill ``run_until_idle()``,
  procrastinate ``run_worker_async(wait=False)``); start-up and connecting are not
  counted;
- **enqueue-to-start latency** with an idle worker: one task at a time, from just
  before the enqueue call until the handler starts (the handler writes its start time
  to the worker process's stdout, a pipe the measuring process waits on), with a pause
  between tasks. Polling is pushed out to 30 s on both
  sides, so only their LISTEN/NOTIFY wakeup can start a task quickly;
- **processing with a history**: the same drain after a million finished tasks (with
  their execution-log rows) were added to the table and the table was analyzed.

Each framework has its own place: taskmill a fresh schema (``?schema=``), procrastinate
a fresh database (its schema lives in ``public``), both created and dropped by the
script. The invocation is one record of ``bench/results/postgres-vs-procrastinate.jsonl``
(bench/harness.py), with the server's settings.

    uv run python bench/postgres_vs_procrastinate.py \\
        --url postgresql://taskmill:taskmill@127.0.0.1:5432/taskmill

The role needs CREATEDB (for procrastinate's database). procrastinate is in the
workspace's dev dependencies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import procrastinate
from harness import Recorder, load_1min, now_iso, redact
from procrastinate.types import JSONDict
from taskmill import Context, Taskmill

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_URL = os.environ.get(
    "TASKMILL_TEST_POSTGRES_URL", "postgresql://taskmill:taskmill@127.0.0.1:5432/taskmill"
)
TASK = "noop"
STAMP = "stamp"
IDLE_POLL = 30.0
"""Polling interval while measuring latency: long enough that only a notification can
start a task quickly."""


# -- the work ---------------------------------------------------------------------------


def stamp(marker: object) -> None:
    """Report that task ``marker`` started, with the wall-clock time, on stdout (the
    measuring process reads the pipe: no polling on either side)."""
    sys.stdout.write(f"{marker} {time.time():.6f}\n")
    sys.stdout.flush()


def taskmill_app(url: str) -> Taskmill:
    tm = Taskmill(url, plugins=False)

    async def noop(ctx: Context, params: dict[str, Any]) -> None:
        return None

    async def started(ctx: Context, params: dict[str, Any]) -> None:
        stamp(params["n"])

    tm.register(TASK, noop)
    tm.register(STAMP, started)
    return tm


def procrastinate_app(conninfo: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name=TASK)
    async def noop(i: int) -> None:
        return None

    @app.task(name=STAMP)
    async def started(n: int) -> None:
        stamp(n)

    return app


# -- places: a schema for taskmill, a database for procrastinate ---------------------------


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}", query=""))


@contextmanager
def places(url: str) -> Iterator[tuple[str, str]]:
    """(taskmill URL with a fresh schema, procrastinate conninfo of a fresh database);
    both are dropped afterwards."""
    suffix = uuid.uuid4().hex[:8]
    schema = f"bench_{suffix}"
    database = f"bench_procrastinate_{suffix}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{database}"'))
    try:
        tm_url = f"{url}{'&' if '?' in url else '?'}schema={schema}"
        yield tm_url, with_database(url, database)
    finally:
        asyncio.run(admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


# -- phases -------------------------------------------------------------------------------


async def taskmill_enqueue(url: str, tasks: int, batch_size: int) -> float:
    async with taskmill_app(url) as tm:
        started = time.perf_counter()
        for first in range(0, tasks, batch_size):
            await tm.enqueue_many(
                [
                    {"task_type": TASK, "params": {"i": i}}
                    for i in range(first, min(tasks, first + batch_size))
                ]
            )
        return time.perf_counter() - started


async def procrastinate_enqueue(conninfo: str, tasks: int, batch_size: int) -> float:
    app = procrastinate_app(conninfo)
    async with app.open_async():
        task = app.tasks[TASK]
        started = time.perf_counter()
        for first in range(0, tasks, batch_size):
            jobs: list[JSONDict] = [{"i": i} for i in range(first, min(tasks, first + batch_size))]
            await task.batch_defer_async(*jobs)
        return time.perf_counter() - started


async def drain(framework: str, where: str, concurrency: int) -> dict[str, float]:
    """Run one worker until the queue is empty (in the worker process)."""
    if framework == "taskmill":
        async with taskmill_app(where) as tm:
            worker = tm.worker(concurrency=concurrency, handle_signals=False)
            started = time.perf_counter()
            await worker.run_until_idle()
            return {"seconds": time.perf_counter() - started, "processed": worker.processed}
    app = procrastinate_app(where)
    async with app.open_async():
        started = time.perf_counter()
        await app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False
        )
        return {"seconds": time.perf_counter() - started, "processed": -1}


async def serve(framework: str, where: str, concurrency: int) -> None:
    """Run an idle worker until SIGTERM (in the worker process), for the latency phase."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if framework == "taskmill":
        async with taskmill_app(where) as tm:
            worker = tm.worker(
                concurrency=concurrency,
                handle_signals=False,
                poll_interval=IDLE_POLL,
                min_poll_interval=IDLE_POLL,
            )
            running = asyncio.create_task(worker.run())
            print("ready", flush=True)
            await stop.wait()
            await worker.stop()
            await running
        return
    app = procrastinate_app(where)
    async with app.open_async():
        running = asyncio.create_task(
            app.run_worker_async(
                concurrency=concurrency,
                fetch_job_polling_interval=IDLE_POLL,
                install_signal_handlers=False,
            )
        )
        print("ready", flush=True)
        await stop.wait()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


def worker_process(
    mode: str, framework: str, where: str, concurrency: int, *extra: str
) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        f"--{mode}",
        framework,
        "--where",
        where,
        "--concurrency",
        str(concurrency),
        *extra,
    ]


def timed_drain(framework: str, where: str, concurrency: int) -> dict[str, float]:
    done = subprocess.run(
        worker_process("drain", framework, where, concurrency),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{framework} worker failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def latencies(
    framework: str,
    where: str,
    concurrency: int,
    samples: int,
    enqueue: Callable[[int], Awaitable[None]],
) -> list[float]:
    """Enqueue one task at a time to an idle worker process; milliseconds from just
    before each enqueue call until its handler started."""
    proc = await asyncio.create_subprocess_exec(
        *worker_process("serve", framework, where, concurrency),
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        if (await proc.stdout.readline()).strip() != b"ready":
            raise SystemExit(f"the {framework} worker did not start")
        await asyncio.sleep(1.0)  # connected, listening, idle
        rng = random.Random(7)
        measured: list[float] = []
        for n in range(samples):
            began = time.time()
            await enqueue(n)
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            marker, at = line.decode().split()
            if marker != str(n):
                raise SystemExit(f"{framework}: expected task {n} to start, got {line!r}")
            measured.append((float(at) - began) * 1000)
            await asyncio.sleep(rng.uniform(0.05, 0.15))  # the worker is idle again
        return measured
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def add_taskmill_history(url: str, count: int) -> float:
    """Add ``count`` COMPLETED tasks and their execution-log rows, then VACUUM ANALYZE."""
    schema = url.rsplit("schema=", 1)[1]
    conn = await asyncpg.connect(url.split("?")[0])
    started = time.perf_counter()
    try:
        await conn.execute(
            f'INSERT INTO "{schema}".tasks (id, task_type, status, created_at, run_at,'
            " updated_at, params, priority, max_retries, attempts, result, started_at,"
            " finished_at) SELECT gen_random_uuid()::text, $1, 'completed', now(), now(),"
            " now(), json_build_object('i', g), 100, 3, 1, 'null', now(), now()"
            " FROM generate_series(1, $2::int) AS g",
            TASK,
            count,
        )
        await conn.execute(
            f'INSERT INTO "{schema}".attempts (task_seq, number, worker_id, started_at,'
            " finished_at, outcome) SELECT seq, 1, 'history', now(), now(), 'completed'"
            f' FROM "{schema}".tasks WHERE status = $1',
            "completed",
        )
        await conn.execute(f'VACUUM ANALYZE "{schema}".tasks')
        await conn.execute(f'VACUUM ANALYZE "{schema}".attempts')
    finally:
        await conn.close()
    return time.perf_counter() - started


async def add_procrastinate_history(conninfo: str, count: int) -> float:
    conn = await asyncpg.connect(conninfo)
    started = time.perf_counter()
    try:
        await conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args, status, attempts)"
            " SELECT 'default', $1, json_build_object('i', g)::jsonb, 'succeeded', 1"
            " FROM generate_series(1, $2::int) AS g",
            TASK,
            count,
        )
        await conn.execute("VACUUM ANALYZE procrastinate_jobs")
    finally:
        await conn.close()
    return time.perf_counter() - started


async def server_settings(url: str) -> dict[str, str]:
    conn = await asyncpg.connect(url.split("?")[0])
    try:
        names = (
            "server_version", "shared_buffers", "synchronous_commit", "fsync",
            "max_connections", "work_mem", "autovacuum",
        )  # fmt: skip
        rows = await conn.fetch(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY($1::text[])",
            list(names),
        )
        return {r[0]: r[1] for r in rows}
    finally:
        await conn.close()


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def summarize_latency(values: list[float]) -> dict[str, float]:
    return {
        "samples": len(values),
        "p50_ms": round(percentile(values, 50), 2),
        "p90_ms": round(percentile(values, 90), 2),
        "p99_ms": round(percentile(values, 99), 2),
        "max_ms": round(max(values), 2),
        "mean_ms": round(statistics.fmean(values), 2),
    }


# -- the run ------------------------------------------------------------------------------


FRAMEWORKS = ("taskmill", "procrastinate")


async def finished(framework: str, where: str) -> int:
    """How many no-op tasks ended successfully (every run checks all did)."""
    if framework == "taskmill":
        schema = where.rsplit("schema=", 1)[1]
        sql = f'SELECT count(*) FROM "{schema}".tasks WHERE task_type = $1 AND status = $2'
        args: tuple[str, ...] = (TASK, "completed")
        where = where.split("?")[0]
    else:
        sql = "SELECT count(*) FROM procrastinate_jobs WHERE task_name = $1 AND status = $2"
        args = (TASK, "succeeded")
    conn = await asyncpg.connect(where)
    try:
        count: int = await conn.fetchval(sql, *args)
        return count
    finally:
        await conn.close()


async def processing(
    framework: str, where: str, tasks: int, batch_size: int, concurrency: int
) -> dict[str, Any]:
    """Bulk-enqueue ``tasks`` no-op tasks, then drain them with one worker process."""
    before = await finished(framework, where)
    enqueue = taskmill_enqueue if framework == "taskmill" else procrastinate_enqueue
    seconds = await enqueue(where, tasks, batch_size)
    drained = await asyncio.to_thread(timed_drain, framework, where, concurrency)
    done = await finished(framework, where) - before
    if done != tasks:
        raise SystemExit(f"{framework}: {done} of {tasks} tasks completed")
    figures = {
        "tasks": tasks,
        "concurrency": concurrency,
        "enqueue_per_s": round(tasks / seconds),
        "processed_per_s": round(tasks / drained["seconds"]),
        "drain_seconds": round(drained["seconds"], 3),
    }
    print(f"{framework:<13}", figures, flush=True)
    return figures


async def bench(args: argparse.Namespace, tm_url: str, pc_conninfo: str) -> dict[str, Any]:
    where = {"taskmill": tm_url, "procrastinate": pc_conninfo}
    tasks = {"taskmill": args.tasks, "procrastinate": args.procrastinate_tasks}
    out: dict[str, dict[str, Any]] = {name: {} for name in FRAMEWORKS}
    async with taskmill_app(tm_url):  # creates the schema
        pass
    pc = procrastinate_app(pc_conninfo)
    async with pc.open_async():
        await pc.schema_manager.apply_schema_async()

    for concurrency in args.concurrency:
        for name in FRAMEWORKS:
            out[name][f"concurrency_{concurrency}"] = await processing(
                name, where[name], tasks[name], args.batch_size, concurrency
            )

    # One task at a time to an idle worker.
    first = args.concurrency[0]
    async with taskmill_app(tm_url) as tm:

        async def tm_one(n: int) -> None:
            await tm.enqueue(STAMP, {"n": n})

        values = await latencies("taskmill", tm_url, first, args.latency_samples, tm_one)
    out["taskmill"]["latency"] = summarize_latency(values)
    pc = procrastinate_app(pc_conninfo)
    async with pc.open_async():
        stamp_task = pc.tasks[STAMP]

        async def pc_one(n: int) -> None:
            await stamp_task.defer_async(n=n)

        values = await latencies("procrastinate", pc_conninfo, first, args.latency_samples, pc_one)
    out["procrastinate"]["latency"] = summarize_latency(values)
    for name in FRAMEWORKS:
        print(f"{name:<13} latency", out[name]["latency"], flush=True)

    # The same drain with a history of finished tasks in the table.
    if args.history:
        for name in FRAMEWORKS:
            add = add_taskmill_history if name == "taskmill" else add_procrastinate_history
            seconds = await add(where[name], args.history)
            figures = await processing(name, where[name], tasks[name], args.batch_size, first)
            figures["finished_rows_added"] = args.history
            figures["seconds_to_add_them"] = round(seconds, 1)
            out[name]["with_history"] = figures
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL server to use")
    parser.add_argument("--tasks", type=int, default=50_000, help="taskmill tasks per drain")
    parser.add_argument(
        "--procrastinate-tasks", type=int, default=3_000, help="procrastinate jobs per drain"
    )
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument(
        "--concurrency", type=int, action="append", default=None,
        help="worker concurrency (repeatable; default 10 and 100; the first is used for "
        "latency and history)",
    )  # fmt: skip
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument(
        "--history", type=int, default=1_000_000, help="finished tasks to add (0: skip)"
    )
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    parser.add_argument("--no-record", action="store_true")
    # Worker-process modes (the script runs itself).
    parser.add_argument("--drain", choices=("taskmill", "procrastinate"))
    parser.add_argument("--serve", choices=("taskmill", "procrastinate"))
    parser.add_argument("--where")
    args = parser.parse_args(argv)
    args.concurrency = args.concurrency or [10, 100]
    return args


def main() -> None:
    # procrastinate warns that its App lives in the main module: intended here.
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    args = parse_args()
    if args.drain:
        result = asyncio.run(drain(args.drain, args.where, args.concurrency[0]))
        print(json.dumps(result))
        return
    if args.serve:
        asyncio.run(serve(args.serve, args.where, args.concurrency[0]))
        return
    recorder = Recorder(
        "postgres-vs-procrastinate", results_dir=args.results_dir, enabled=not args.no_record
    )
    load, date = load_1min(), now_iso()
    params: dict[str, Any] = {
        "url": redact(args.url),
        "tasks": args.tasks,
        "procrastinate_tasks": args.procrastinate_tasks,
        "batch_size": args.batch_size,
        "concurrency": args.concurrency,
        "latency_samples": args.latency_samples,
        "history": args.history,
        "procrastinate_version": procrastinate.__version__,
        "asyncpg_version": asyncpg.__version__,
        "server": asyncio.run(server_settings(args.url)),
    }
    with places(args.url) as (tm_url, pc_conninfo):
        results = asyncio.run(bench(args, tm_url, pc_conninfo))
    tm_c = results["taskmill"][f"concurrency_{args.concurrency[0]}"]
    pc_c = results["procrastinate"][f"concurrency_{args.concurrency[0]}"]
    ratio = round(tm_c["processed_per_s"] / pc_c["processed_per_s"], 1)
    print(f"taskmill / procrastinate processing at c={args.concurrency[0]}: {ratio}x")
    figures = {"results": results, "ratio_processed": ratio}
    recorder.record("taskmill and procrastinate", figures, params=params, load=load, date=date)
    recorder.done()


if __name__ == "__main__":
    main()
