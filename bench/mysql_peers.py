"""taskmill-mysql against its peers on the same MariaDB/MySQL server: the raw ceiling of
a minimal aiomysql claim/complete loop, and huey's ``SqlHuey`` (peewee over PyMySQL),
the Python task queue users would pick on MySQL. taskmill's own figures come from
``bench/throughput.py --url mysql://...`` and ``bench/mysql_latency.py``, run in the
same session.

- ``raw``: ``--tasks`` rows are inserted into a minimal table; one loop then claims 100
  (``SELECT ... ORDER BY priority DESC, id LIMIT 100 FOR UPDATE SKIP LOCKED`` +
  ``UPDATE`` in one READ COMMITTED transaction) and completes those 100 (one
  ``UPDATE``) per round, until none is left: no framework, no events, no leases.
- ``huey``: ``--tasks`` no-op tasks are enqueued into ``SqlHuey`` (results off), then a
  huey consumer with ``--concurrency`` thread workers runs them; the clock stops when
  the handler has run ``--tasks`` times.

Every run is recorded with the machine in ``bench/results/mysql-peers-<date>.json``.

    uv run --group bench python bench/mysql_peers.py \\
        --url mysql://taskmill:taskmill@127.0.0.1:3306/tm_peers --tasks 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiomysql
from taskmill_mysql.options import parse_url

RESULTS = Path(__file__).resolve().parent / "results"


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


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="mysql://... of a scratch database")
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--huey-tasks", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, action="append", default=None)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    concurrencies = args.concurrency or [10, 100]
    result: dict[str, Any] = {
        "machine": machine(),
        "at": datetime.now(UTC).isoformat(),
        "tasks": args.tasks,
        "huey_tasks": args.huey_tasks,
        "raw": asyncio.run(raw_ceiling(args.url, args.tasks)),
        "huey": {str(c): huey_peer(args.url, args.huey_tasks, c) for c in concurrencies},
    }
    print(json.dumps(result, indent=2))
    if not args.no_record:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        (RESULTS / f"mysql-peers-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
