"""taskmill-mysql against its peers on the same MariaDB/MySQL server: the raw ceiling of
a minimal aiomysql claim/complete loop, and huey's ``SqlHuey`` (peewee over PyMySQL),
the Python task queue users would pick on MySQL, and taskmill itself at several worker
settings, in one invocation of alternating rounds (the machine is shared: the ratios
within a round are the figure, absolute rates move with the load).

- ``raw``: ``--tasks`` rows are inserted into a minimal table; one loop then claims 100
  (``SELECT ... ORDER BY priority DESC, id LIMIT 100 FOR UPDATE SKIP LOCKED`` +
  ``UPDATE`` in one READ COMMITTED transaction) and completes those 100 (one
  ``UPDATE``) per round, until none is left: no framework, no events, no leases.
- ``huey``: ``--tasks`` no-op tasks are enqueued into ``SqlHuey`` (results off), then a
  huey consumer with ``--concurrency`` thread workers runs them; the clock stops when
  the handler has run ``--tasks`` times.
- ``taskmill``: for every ``--setting`` (``concurrency:prefetch:finish_window``), a child
  process enqueues ``--tasks`` no-op tasks with ``enqueue_many`` (batches of 1,000, the
  bulk enqueue figure), then drains them with one worker in that process, and counts
  the round trips (statements, BEGIN and COMMIT) of each phase. With ``--variant
  NAME=DIR`` (repeatable) each setting also runs with ``DIR`` first on ``PYTHONPATH``
  (a ``taskmill_mysql`` package from another commit, e.g. ``git archive BASE
  backends/mysql/src | tar -x -C /tmp/base`` and ``DIR=/tmp/base/backends/mysql/src``):
  a before/after in the same rounds. ``current`` is the installed package.
- ``latency``: ``bench/mysql_latency.py`` per variant (``--latency-tasks`` tasks, an
  idle polling worker process, enqueue→start p50/p99).

Each round records the load average before and after it. The invocation is one record of
``bench/results/mysql-peers.jsonl`` (bench/harness.py).

    uv run --group bench python bench/mysql_peers.py \\
        --url mysql://taskmill:taskmill@127.0.0.1:3306/tm_peers --tasks 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiomysql
from harness import Recorder, load_1min, now_iso, redact
from taskmill import Context, TaskFilter, Taskmill
from taskmill_mysql.options import parse_url

BENCH = Path(__file__).resolve().parent
DEFAULT_SETTINGS = ["10:0:0", "10:1000:0.002", "100:0:0", "100:1000:0.002"]


async def _connect(url: str, database: str | None) -> aiomysql.Connection:
    p = parse_url(url, {})
    return await aiomysql.connect(
        host=p.host, port=p.port, user=p.user, password=p.password, db=database, autocommit=True
    )


async def raw_ceiling(url: str, tasks: int) -> dict[str, float]:
    """Bulk insert, then claim 100 / complete 100 per round until the queue is empty."""
    database = parse_url(url, {}).database
    admin = await _connect(url, None)
    async with admin.cursor() as c:
        await c.execute(f"DROP DATABASE IF EXISTS `{database}`")
        await c.execute(f"CREATE DATABASE `{database}`")
    admin.close()
    conn = await _connect(url, database)
    async with conn.cursor() as c:
        await c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        await c.execute(
            "CREATE TABLE jobs (id BIGINT AUTO_INCREMENT PRIMARY KEY, status VARCHAR(16) NOT"
            " NULL, priority INT NOT NULL, rank_ BIGINT AS (-priority) STORED,"
            " KEY claim (status, rank_, id)) ENGINE = InnoDB"
        )
        started = time.perf_counter()
        for start in range(0, tasks, 1000):
            n = min(1000, tasks - start)
            await c.execute(
                "INSERT INTO jobs (status, priority) VALUES " + ", ".join(["('pending', 100)"] * n)
            )
        enqueue_s = time.perf_counter() - started
        done = 0
        started = time.perf_counter()
        while True:
            await conn.begin()
            await c.execute(
                "SELECT id FROM jobs WHERE status = 'pending' ORDER BY rank_, id LIMIT 100"
                " FOR UPDATE SKIP LOCKED"
            )
            ids = [r[0] for r in await c.fetchall()]
            if not ids:
                await conn.commit()
                break
            marks = ", ".join(["%s"] * len(ids))
            await c.execute(f"UPDATE jobs SET status = 'running' WHERE id IN ({marks})", ids)
            await conn.commit()
            await c.execute(f"UPDATE jobs SET status = 'done' WHERE id IN ({marks})", ids)
            done += len(ids)
        process_s = time.perf_counter() - started
        await c.execute(f"DROP DATABASE `{database}`")
    conn.close()
    assert done == tasks
    return {"enqueue_per_s": tasks / enqueue_s, "process_per_s": tasks / process_s}


def huey_peer(url: str, tasks: int, concurrency: int) -> dict[str, float]:
    """SqlHuey: enqueue ``tasks`` no-op tasks, then a consumer with ``concurrency``
    thread workers runs them all."""
    from huey.contrib.sql_huey import SqlHuey

    p = parse_url(url, {})
    asyncio.run(_recreate(url, p.database))
    db_url = f"mysql://{p.user}:{p.password}@{p.host}:{p.port}/{p.database}"
    huey = SqlHuey(name="bench", database=db_url, results=False)
    ran = 0
    lock = threading.Lock()
    all_ran = threading.Event()

    def count_run() -> None:
        nonlocal ran
        with lock:
            ran += 1
            if ran == tasks:
                all_ran.set()

    noop = huey.task()(count_run)

    started = time.perf_counter()
    for _ in range(tasks):
        noop()
    enqueue_s = time.perf_counter() - started
    consumer = huey.create_consumer(workers=concurrency, worker_type="thread", periodic=False)
    started = time.perf_counter()
    consumer.start()  # the workers' threads; returns at once
    if not all_ran.wait(timeout=3600):
        raise AssertionError(f"huey ran {ran} of {tasks} tasks within an hour")
    process_s = time.perf_counter() - started
    consumer.stop(graceful=True)
    asyncio.run(_drop(url, p.database))
    return {"enqueue_per_s": tasks / enqueue_s, "process_per_s": tasks / process_s}


async def _recreate(url: str, database: str) -> None:
    conn = await _connect(url, None)
    async with conn.cursor() as c:
        await c.execute(f"DROP DATABASE IF EXISTS `{database}`")
        await c.execute(f"CREATE DATABASE `{database}`")
    conn.close()


async def _drop(url: str, database: str) -> None:
    conn = await _connect(url, None)
    async with conn.cursor() as c:
        await c.execute(f"DROP DATABASE IF EXISTS `{database}`")
    conn.close()


class RoundTrips:
    """Counts what aiomysql sends to the server: statements, BEGIN, COMMIT, ROLLBACK."""

    def __init__(self) -> None:
        self.count = 0
        for name in ("query", "begin", "commit", "rollback"):
            original = getattr(aiomysql.Connection, name)
            setattr(aiomysql.Connection, name, self._counted(original))

    def _counted(self, original: Any) -> Any:
        async def counted(conn: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await original(conn, *args, **kwargs)

        return counted


async def noop(ctx: Context, params: dict[str, Any]) -> None:
    """The benchmarked handler: does nothing, so the figures are the framework's cost."""
    return None


def with_database(url: str, database: str) -> str:
    head, _, query = url.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{database}" + (f"?{query}" if query else "")


async def taskmill_child(
    url: str, tasks: int, concurrency: int, prefetch: int, window: float
) -> None:
    """One taskmill run (in a child process): enqueue, drain, print a JSON line."""
    import taskmill_mysql

    trips = RoundTrips()
    database = parse_url(url, {}).database
    await _recreate(url, database)
    tm = Taskmill(url, plugins=False)
    tm.register("noop", noop)
    try:
        async with tm:
            trips.count = 0
            started = time.perf_counter()
            for first in range(0, tasks, 1000):
                await tm.enqueue_many(
                    [
                        {"task_type": "noop", "params": {"i": i}}
                        for i in range(first, min(tasks, first + 1000))
                    ]
                )
            enqueue_s = time.perf_counter() - started
            enqueue_trips = trips.count
            worker = tm.worker(
                concurrency=concurrency,
                prefetch=prefetch,
                finish_window=window,
                handle_signals=False,
            )
            trips.count = 0
            started = time.perf_counter()
            await worker.run_until_idle()
            process_s = time.perf_counter() - started
            process_trips = trips.count
            summary = await tm.progress_summary(TaskFilter(task_types=("noop",)))
            if summary.completed != tasks or worker.processed != tasks:
                raise RuntimeError(f"{summary.completed} of {tasks} completed")
    finally:
        await _drop(url, database)
    print(
        json.dumps(
            {
                "enqueue_per_s": tasks / enqueue_s,
                "process_per_s": tasks / process_s,
                "enqueue_round_trips": enqueue_trips,
                "process_round_trips_per_task": process_trips / tasks,
                "package": str(Path(taskmill_mysql.__file__).parent),
            }
        )
    )


def _child_env(source: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    return env


def taskmill_peer(url: str, tasks: int, setting: str, source: str | None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--url", url, "--child", setting, "--tasks", str(tasks)],
        env=_child_env(source),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"taskmill {setting} failed ({done.returncode}):\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def latency_peer(url: str, tasks: int, source: str | None) -> dict[str, Any]:
    database = parse_url(url, {}).database
    asyncio.run(_recreate(url, database))
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH / "mysql_latency.py"), "--url", url, "--tasks",
             str(tasks), "--no-record"],
            env=_child_env(source),
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
    finally:
        asyncio.run(_drop(url, database))
    if done.returncode != 0:
        raise RuntimeError(f"latency failed ({done.returncode}):\n{done.stderr}")
    report = json.loads(done.stdout)
    return {k: report[k] for k in ("p50_ms", "p99_ms", "max_ms")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="mysql://... of a scratch database")
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--huey-tasks", type=int, default=5000)
    parser.add_argument(
        "--concurrency",
        type=int,
        action="append",
        default=None,
        help="huey's consumer threads (repeatable; default 10 and 100)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=None,
        help="taskmill concurrency:prefetch:finish_window (repeatable; "
        f"default {', '.join(DEFAULT_SETTINGS)})",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run taskmill with DIR first on PYTHONPATH (repeatable)",
    )
    parser.add_argument("--no-huey", action="store_true", help="leave huey out")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--latency-tasks", type=int, default=200, help="0: no latency runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()  # fmt: skip
    if args.child:
        concurrency, prefetch, window = args.child.split(":")
        asyncio.run(
            taskmill_child(args.url, args.tasks, int(concurrency), int(prefetch), float(window))
        )
        return
    concurrencies = [] if args.no_huey else args.concurrency or [10, 100]
    settings = args.setting or DEFAULT_SETTINGS
    variants: dict[str, str | None] = {"current": None}
    for given in args.variant:
        name, _, source = given.partition("=")
        variants[name] = str(Path(source).resolve())
    database = parse_url(args.url, {}).database
    tm_url = with_database(args.url, f"{database}_tm")
    recorder = Recorder("mysql-peers", enabled=not args.no_record)
    load, date = load_1min(), now_iso()
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        row: dict[str, Any] = {"load_before": load_1min()}
        row["raw"] = asyncio.run(raw_ceiling(args.url, args.tasks))
        row["huey"] = {str(c): huey_peer(args.url, args.huey_tasks, c) for c in concurrencies}
        row["taskmill"] = {
            name: {s: taskmill_peer(tm_url, args.tasks, s, source) for s in settings}
            for name, source in variants.items()
        }
        if args.latency_tasks:
            row["latency"] = {
                name: latency_peer(tm_url, args.latency_tasks, source)
                for name, source in variants.items()
            }
        row["load_after"] = load_1min()
        rounds.append(row)
        raw = row["raw"]["process_per_s"]
        print(
            f"round {number + 1} (load {row['load_before']:.2f}-{row['load_after']:.2f}): "
            f"raw {raw:.0f}/s; huey "
            + ", ".join(f"c{c} {h['process_per_s']:.0f}/s" for c, h in row["huey"].items())
            + "; "
            + "; ".join(
                f"{name} {s} {r['process_per_s']:.0f}/s ({r['process_per_s'] / raw:.0%} of raw, "
                f"{r['process_round_trips_per_task']:.2f} trips/task, "
                f"enqueue {r['enqueue_per_s']:.0f}/s)"
                for name, by_setting in row["taskmill"].items()
                for s, r in by_setting.items()
            )
            + "".join(
                f"; latency {name} p50 {x['p50_ms']:.1f} ms p99 {x['p99_ms']:.1f} ms"
                for name, x in row.get("latency", {}).items()
            ),
            flush=True,
        )

    def median_of(name: str, setting: str, measure: Any) -> float:
        return float(statistics.median(measure(r, r["taskmill"][name][setting]) for r in rounds))

    def versus_huey(r: dict[str, Any], run: dict[str, Any], setting: str) -> float:
        huey = r["huey"].get(setting.split(":")[0])
        return float("nan") if huey is None else run["process_per_s"] / huey["process_per_s"]

    summary: dict[str, Any] = {
        "raw_process_per_s": statistics.median(r["raw"]["process_per_s"] for r in rounds),
        "huey_process_per_s": {
            c: statistics.median(r["huey"][c]["process_per_s"] for r in rounds)
            for c in rounds[0]["huey"]
        },
        "taskmill": {
            name: {
                s: {
                    "process_per_s": median_of(name, s, lambda r, t: t["process_per_s"]),
                    "enqueue_per_s": median_of(name, s, lambda r, t: t["enqueue_per_s"]),
                    "ratio_to_raw": median_of(
                        name, s, lambda r, t: t["process_per_s"] / r["raw"]["process_per_s"]
                    ),
                    "ratio_to_huey_same_concurrency": (
                        median_of(name, s, lambda r, t, s=s: versus_huey(r, t, s))
                        if s.split(":")[0] in rounds[0]["huey"]
                        else None
                    ),
                    "round_trips_per_task": median_of(
                        name, s, lambda r, t: t["process_round_trips_per_task"]
                    ),
                }
                for s in settings
            }
            for name in variants
        },
    }
    params = {
        "tasks": args.tasks,
        "huey_tasks": args.huey_tasks,
        "settings": settings,
        "variants": variants,
        "url": redact(args.url),
    }
    print(json.dumps(summary, indent=2))
    recorder.record("peers", {"rounds": rounds, "summary": summary}, params=params, load=load,
                    date=date)  # fmt: skip
    recorder.done()


if __name__ == "__main__":
    main()
