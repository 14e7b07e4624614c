"""The server's CPU and WAL per task of the two hot statements, claim and finish, alone.

No worker runs: each round enqueues ``--tasks`` tasks in a schema of its own, claims
them all with ``claim_batch`` in calls of ``--batch``, then finishes them all
(COMPLETE) with ``finish_batch_applied`` in calls of ``--batch``, one call at a time.
Over each phase it reads the server's CPU time from ``/proc`` (the postmaster and every
process it forked, as ``postgres_cpu_split.py`` does: run as root or as the server's
user, on the server's machine) and the WAL it wrote (``pg_current_wal_insert_lsn``).

``--variant`` (repeatable; rounds alternate them) changes what the statements do, to
price their parts. These are diagnostic edits of the statement text, never a setting:

- ``base``: the statements as shipped;
- ``no-dependents``: the finish without its ``settle_dependents`` call;
- ``no-attempts``: the finish without its execution-log insert;
- ``no-events``: the claim and the finish without their event inserts;
- ``default-collation``: the key columns of ``tasks`` back to the database's default
  collation (what schema 6 changed to "C");
- ``lean-complete``: the finish written for COMPLETEs only: fixed values instead of a
  ``CASE`` per column, events without the window that copies a leader's kind to its
  aliases;
- ``delete-finished``: ``lean-complete`` deleting the finished rows instead of updating
  them: the price of keeping the finished task in ``tasks`` (graphile-worker deletes a
  completed job).

Recorded in ``bench/results/postgres-statement-cpu-<date>.json``. See
docs/benchmarks.md ("Issue 15: flow between claims and finishes").

    uv run python bench/postgres_statement_cpu.py --url "$TASKMILL_TEST_POSTGRES_URL" \\
        --variant base --variant no-events --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from taskmill import Taskmill
from taskmill.model import Task
from taskmill.storage import ClaimRequest
from taskmill.testing import finish
from taskmill_postgres import PostgresStorage
from taskmill_postgres.statements import ClaimShape

sys.path.insert(1, str(Path(__file__).resolve().parent))

import postgres_prefetch_ab as ab
from postgres_cpu_split import ServerClock

BENCH_DIR = Path(__file__).resolve().parent
VARIANTS = (
    "base", "no-dependents", "no-attempts", "no-events", "default-collation",
    "lean-complete", "delete-finished",
)  # fmt: skip
KEY_COLUMNS = ("id", "task_type", "app_id", "dedupe_key", "alias_of", "parent_id")


def _edit_finish(sql: str, variant: str) -> str:
    if variant == "no-dependents":
        sql = sql.replace(" WHERE (SELECT count(*) FROM dp) >= 0", "")
        sql = re.sub(r" dp AS MATERIALIZED \(.*?\) AS x\),", " ", sql)
    elif variant == "no-attempts":
        sql = re.sub(r" log AS \(INSERT INTO .*?ORDER BY d\.ord\),", " ", sql)
    elif variant == "no-events":
        sql = sql[: sql.index(" ev AS (INSERT")].rstrip(",") + " SELECT ord FROM done"
    elif variant in ("lean-complete", "delete-finished"):
        sql = _lean_complete(sql, delete=variant == "delete-finished")
    return sql


def _lean_complete(sql: str, *, delete: bool) -> str:
    """The finish written for a batch of COMPLETEs only (no progress, data, retry or
    cancel to decide: no CASE per column, no window over the events), and with
    ``delete``, the finished rows deleted instead of updated (what a queue that keeps no
    history does, graphile-worker's completion)."""
    head, _, rest = sql.partition(" SET ")
    _, _, rest = rest.partition(" FROM v WHERE ")
    if delete:
        table = head[head.index("UPDATE ") + len("UPDATE ") : head.index(" AS t")]
        head = head[: head.index("UPDATE ")] + f"DELETE FROM {table} AS t"
        rest = rest.replace(
            " RETURNING t.seq, t.status,", " RETURNING t.seq, 'completed' AS status,"
        )
        sql = f"{head} USING v WHERE {rest}"
    else:
        sets = (
            "status = 'completed', finished_at = now(), result = v.result::json,"
            " error = NULL, cancel_reason = NULL, updated_at = now(), worker_id = NULL,"
            " lease_expires_at = NULL"
        )
        sql = f"{head} SET {sets} FROM v WHERE {rest}"
    sql = sql.replace(
        ", (SELECT pg_notify($18 || 'work', '') FROM done WHERE status = 'pending' LIMIT 1) AS n1",
        "",
    )
    head, _, rest = sql.partition(" ev AS (INSERT")
    tail = rest[rest.index(" SELECT ord FROM done WHERE") :]
    found = re.search(r'INSERT INTO ("[^"]+")\.attempts', sql)
    assert found is not None
    events = (
        f" ev AS (INSERT INTO {found.group(1)}.events (task_seq, kind, status, at)"
        " SELECT e.seq, 'completed', 'completed', now() FROM gate, ("
        " SELECT d.seq, d.ord AS pos, 0::bigint AS o2 FROM done AS d UNION ALL"
        " SELECT al.alias_seq, d.ord, al.alias_seq FROM al JOIN done AS d"
        " ON d.seq = al.leader_seq) AS e ORDER BY e.pos, e.o2)"
    )
    return head + events + tail


def _edit_claim(build: Callable[[ClaimShape], str], variant: str) -> Callable[[ClaimShape], str]:
    if variant != "no-events":
        return build

    def edited(shape: ClaimShape) -> str:
        sql = build(shape)
        head, _, _ = sql.partition(" ev AS (INSERT")
        return head.rstrip(",") + " SELECT * FROM claimed"

    return edited


async def one_round(url: str, data_directory: str, variant: str, tasks: int, batch: int) -> Any:
    schema = f"bench_stmt_{uuid.uuid4().hex[:8]}"
    tm = Taskmill(ab.with_schema(url, schema), plugins=False)
    admin = await asyncpg.connect(ab.plain_dsn(url))
    clock = ServerClock(data_directory)
    try:
        async with tm:
            store = tm.storage
            assert isinstance(store, PostgresStorage)
            sql = store.sql
            sql.finish_applied = _edit_finish(sql.finish_applied, variant)
            sql._build_claim = _edit_claim(sql._build_claim, variant)  # type: ignore[method-assign,assignment]
            sql._claim_cache.clear()
            if variant == "default-collation":
                await admin.execute(
                    f"ALTER TABLE {schema}.tasks "
                    + ", ".join(
                        f'ALTER COLUMN {c} TYPE text COLLATE "default"' for c in KEY_COLUMNS
                    )
                )
            await ab.enqueue_noops(tm, tasks)
            request = ClaimRequest(
                worker_id="bench", handlers={(None, "noop"): None}, limit=batch, lease_seconds=600
            )
            claimed: list[Task] = []
            wal = await admin.fetchval("SELECT pg_current_wal_insert_lsn()")
            clock.begin()
            started = time.perf_counter()
            while len(claimed) < tasks:
                claimed += await store.claim_batch(request)
            claim_wall = time.perf_counter() - started
            claim_cpu = clock.seconds()
            claim_wal = await admin.fetchval("SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", wal)
            finishes = [finish(t) for t in claimed]
            wal = await admin.fetchval("SELECT pg_current_wal_insert_lsn()")
            clock.begin()
            started = time.perf_counter()
            for first in range(0, tasks, batch):
                applied = await store.finish_batch_applied(finishes[first : first + batch])
                if not all(applied):
                    raise RuntimeError("a finish was not applied")
            finish_wall = time.perf_counter() - started
            finish_cpu = clock.seconds()
            finish_wal = await admin.fetchval(
                "SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", wal
            )
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()
    per_task = 1e6 / tasks
    return {
        "variant": variant,
        "claim_server_cpu_us": claim_cpu * per_task,
        "finish_server_cpu_us": finish_cpu * per_task,
        "claim_wall_us": claim_wall * per_task,
        "finish_wall_us": finish_wall * per_task,
        "claim_wal_bytes": float(claim_wal) / tasks,
        "finish_wal_bytes": float(finish_wal) / tasks,
        "load": os.getloadavg()[0],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("TASKMILL_TEST_POSTGRES_URL"))
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variant", action="append", choices=VARIANTS)
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if not args.url:
        parser.error("give --url or set TASKMILL_TEST_POSTGRES_URL")
    variants = args.variant or ["base"]
    admin = await asyncpg.connect(ab.plain_dsn(args.url))
    try:
        data_directory = str(await admin.fetchval("SHOW data_directory"))
        server = str(await admin.fetchval("SHOW server_version"))
        collation = str(
            await admin.fetchval(
                "SELECT datcollate FROM pg_database WHERE datname = current_database()"
            )
        )
    finally:
        await admin.close()
    runs: list[dict[str, Any]] = []
    for number in range(1, args.rounds + 1):
        for variant in variants:
            run = await one_round(args.url, data_directory, variant, args.tasks, args.batch)
            runs.append({"round": number, **run})
            print(
                f"round {number} {variant:18s} server CPU per task:"
                f" claim {run['claim_server_cpu_us']:5.1f} us,"
                f" finish {run['finish_server_cpu_us']:5.1f} us;"
                f" WAL per task: claim {run['claim_wal_bytes']:.0f} B,"
                f" finish {run['finish_wal_bytes']:.0f} B; load {run['load']:.1f}",
                flush=True,
            )
    medians = ab.medians_by(runs, "variant", skip=("load",))
    for variant, values in medians.items():
        print(variant, "median:", json.dumps({k: round(v, 1) for k, v in values.items()}))
    if not args.no_record:
        record = {
            "benchmark": "postgres-statement-cpu",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "tasks": args.tasks,
            "batch": args.batch,
            "variants": variants,
            "database_collation": collation,
            "runs": runs,
            "medians": medians,
            "machine": ab.machine_line(),
            "server": server,
        }
        ab.write_record(args.results_dir, "postgres-statement-cpu", record)


if __name__ == "__main__":
    asyncio.run(main())
