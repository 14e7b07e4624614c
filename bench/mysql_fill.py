"""Fill a ``mysql://`` store with finished tasks, for measuring taskmill-mysql with a
large table (``bench/throughput.py --url`` on the same URL afterwards).

    uv run python bench/mysql_fill.py --url mysql://taskmill:taskmill@127.0.0.1/tm_1m \\
        --finished 1000000

Rows are inserted by the server itself (``INSERT ... SELECT`` from MariaDB's sequence
engine, ``seq_1_to_N``), 100,000 per statement, as COMPLETED tasks of type ``old``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiomysql
from taskmill_mysql import MySQLStorage
from taskmill_mysql.options import parse_url


async def fill(url: str, finished: int) -> None:
    store = MySQLStorage.from_url(url)
    await store.open()
    await store.close()
    p = parse_url(url, {})
    conn = await aiomysql.connect(
        host=p.host, port=p.port, user=p.user, password=p.password, db=p.database, autocommit=True
    )
    started = time.perf_counter()
    try:
        async with conn.cursor() as cursor:
            for start in range(0, finished, 100_000):
                n = min(100_000, finished - start)
                await cursor.execute(
                    "INSERT INTO tasks (id, task_type, status, created_at, run_at, updated_at,"
                    " params, data, priority, max_retries, attempts, result, started_at,"
                    " finished_at) SELECT UUID(), 'old', 'completed', NOW(6), NOW(6), NOW(6),"
                    " '{}', '{}', 100, 3, 1, 'null', NOW(6), NOW(6)"
                    f" FROM seq_1_to_{n}"
                )
            await cursor.execute("ANALYZE TABLE tasks")
            await cursor.fetchall()
            await cursor.execute("SELECT COUNT(*) FROM tasks WHERE status = 'completed'")
            (count,) = await cursor.fetchone()
    finally:
        conn.close()
    print(f"{count:,} finished tasks in {p.database} ({time.perf_counter() - started:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--finished", type=int, default=1_000_000)
    args = parser.parse_args()
    asyncio.run(fill(args.url, args.finished))


if __name__ == "__main__":
    main()
