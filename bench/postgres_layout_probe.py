"""What a different ``tasks`` layout would save the server per task: a design probe.

Issue 15's profiles put most of the PostgreSQL server's time per task in the claim and
the finish writing the 27-column task row anew with an entry in every index (neither
update can be HOT: each changes ``status``, which the partial indexes' predicates read,
and the finish also ``finished_at`` and ``lease_expires_at``). This script measures, on
raw statements (no taskmill worker, no event or execution-log rows, which both layouts
would write alike), what the server spends per task to enqueue, claim and finish in:

- ``shipped``: the ``tasks`` table as taskmill-postgres creates it (every index);
- ``split-ff<N>``: the same table without the indexes that read ``status``, ``finished_at``
  or ``lease_expires_at`` (claim, lease, finished, alias and dedupe-leader), and with
  fillfactor N (``--fillfactor``, repeatable; 70 and 30 by default), so that the claim
  and the finish can be HOT updates; the claimable tasks in a narrow ``queue`` table of
  their own (the claim deletes from it) and the running ones in a ``leases`` table (the
  claim inserts, the finish deletes). What the dropped indexes served (finding expired leases,
  cleaning up by finish time, one leader per dedupe key) would move to those tables
  or to others; the probe leaves it out, so it is the best case for the split.

Each round enqueues ``--tasks`` tasks in statements of ``--batch``, claims them all in
claims of ``--batch`` and finishes them all in finishes of ``--batch``, one statement
at a time, in a schema of its own, and reads the server's CPU time from ``/proc`` (run
as root or as the server's user, on its machine), the WAL written and the share of HOT
updates. Layouts alternate round by round. Not a product path: the statements are
written here for the probe.

    uv run python bench/postgres_layout_probe.py --url "$TASKMILL_TEST_POSTGRES_URL" \\
        --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from taskmill import Taskmill

sys.path.insert(1, str(Path(__file__).resolve().parent))

import postgres_prefetch_ab as ab
from postgres_cpu_split import ServerClock

BENCH_DIR = Path(__file__).resolve().parent
LAYOUTS = ("shipped", "split")

ENQUEUE = (
    "INSERT INTO {s}.tasks (id, task_type, status, created_at, run_at, updated_at,"
    " params, priority, max_retries)"
    " SELECT gen_random_uuid()::text, 'noop', 'pending', now(), now(), now(),"
    " json_build_object('i', g), 0, 3 FROM generate_series(1, $1) AS g"
)
ENQUEUE_SPLIT = (
    "WITH added AS (" + ENQUEUE + " RETURNING seq, task_type, priority, run_at, app_id)"
    " INSERT INTO {s}.queue (seq, task_type, priority, run_at, app_id)"
    " SELECT seq, task_type, priority, run_at, app_id FROM added"
)
CLAIMED = (
    "UPDATE {s}.tasks AS t SET status = 'running', attempts = t.attempts + 1,"
    " worker_id = 'probe', started_at = now(), updated_at = now(),"
    " lease_expires_at = now() + interval '600 seconds'"
)
CLAIM = (
    "WITH picked AS (SELECT seq FROM {s}.tasks WHERE status = 'pending' AND alias_of IS NULL"
    " AND waiting_on = 0 AND task_type = 'noop' AND run_at <= now()"
    " ORDER BY priority DESC, seq LIMIT $1 FOR UPDATE SKIP LOCKED) "
    + CLAIMED
    + " FROM picked WHERE t.seq = picked.seq RETURNING t.id, t.attempts"
)
CLAIM_SPLIT = (
    "WITH picked AS (DELETE FROM {s}.queue WHERE seq IN (SELECT seq FROM {s}.queue"
    " WHERE task_type = 'noop' AND run_at <= now() ORDER BY priority DESC, seq"
    " LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING seq),"
    " leased AS (INSERT INTO {s}.leases (seq, lease_expires_at)"
    " SELECT seq, now() + interval '600 seconds' FROM picked) "
    + CLAIMED
    + " FROM picked WHERE t.seq = picked.seq RETURNING t.id, t.attempts"
)
FINISHED = (
    "UPDATE {s}.tasks AS t SET status = 'completed', finished_at = now(),"
    " result = 'null'::json, updated_at = now(), worker_id = NULL, lease_expires_at = NULL"
    " FROM unnest($1::text[], $2::integer[]) AS v(id, attempt)"
    " WHERE t.id = v.id AND t.status = 'running' AND t.worker_id = 'probe'"
    " AND t.attempts = v.attempt"
)
FINISH_SPLIT = (
    "WITH done AS (" + FINISHED + " RETURNING t.seq)"
    " DELETE FROM {s}.leases AS l USING done WHERE l.seq = done.seq"
)
SPLIT_DDL = (
    "DROP INDEX {s}.tasks_claim, {s}.tasks_lease, {s}.tasks_finished, {s}.tasks_alias,"
    " {s}.tasks_dedupe_leader;"
    " CREATE INDEX tasks_alias ON {s}.tasks (alias_of) WHERE alias_of IS NOT NULL;"
    " ALTER TABLE {s}.tasks SET (fillfactor = {fillfactor});"
    ' CREATE TABLE {s}.queue (seq bigint PRIMARY KEY, task_type text COLLATE "C" NOT NULL,'
    ' priority bigint NOT NULL, run_at timestamptz NOT NULL, app_id text COLLATE "C");'
    " CREATE INDEX queue_claim ON {s}.queue (task_type, priority DESC, seq, run_at, app_id);"
    " CREATE TABLE {s}.leases (seq bigint PRIMARY KEY, lease_expires_at timestamptz NOT NULL);"
    " CREATE INDEX leases_expiry ON {s}.leases (lease_expires_at);"
)


async def _wal(admin: asyncpg.Connection[Any]) -> Any:
    return await admin.fetchval("SELECT pg_current_wal_insert_lsn()")


async def one_round(
    url: str, data_directory: str, layout: str, tasks: int, batch: int, fillfactor: int
) -> dict[str, Any]:
    schema = f"bench_layout_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ab.plain_dsn(url))
    # As taskmill's pool does: plans that do not depend on a batch's size or the table's
    # statistics of the moment (the finish reaches each row by its id).
    conn = await asyncpg.connect(
        ab.plain_dsn(url), server_settings={"plan_cache_mode": "force_generic_plan"}
    )
    clock = ServerClock(data_directory)
    figures: dict[str, Any] = {"layout": layout}
    try:
        async with Taskmill(ab.with_schema(url, schema), plugins=False):
            pass  # creates the schema, migrated to the latest version
        split = layout.startswith("split")
        if split:
            await admin.execute(SPLIT_DDL.format(s=schema, fillfactor=fillfactor))
        enqueue = (ENQUEUE_SPLIT if split else ENQUEUE).format(s=schema)
        claim = (CLAIM_SPLIT if split else CLAIM).format(s=schema)
        finish = (FINISH_SPLIT if split else FINISHED).format(s=schema)

        async def phase(name: str, body: Any) -> Any:
            wal = await _wal(admin)
            clock.begin()
            started = time.perf_counter()
            out = await body()
            figures[f"{name}_wall_us"] = (time.perf_counter() - started) * 1e6 / tasks
            figures[f"{name}_server_cpu_us"] = clock.seconds() * 1e6 / tasks
            written = await admin.fetchval("SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", wal)
            figures[f"{name}_wal_bytes"] = float(written) / tasks
            return out

        async def enqueue_all() -> None:
            for first in range(0, tasks, batch):
                await conn.execute(enqueue, min(batch, tasks - first))

        async def claim_all() -> list[Any]:
            claimed: list[Any] = []
            while len(claimed) < tasks:
                rows = await conn.fetch(claim, batch)
                if not rows:
                    raise RuntimeError("nothing left to claim")
                claimed += rows
            return claimed

        await phase("enqueue", enqueue_all)
        claimed = await phase("claim", claim_all)

        async def finish_all() -> None:
            for first in range(0, tasks, batch):
                part = claimed[first : first + batch]
                await conn.execute(finish, [r[0] for r in part], [r[1] for r in part])

        await phase("finish", finish_all)
        done = await admin.fetchval(
            f"SELECT count(*) FROM {schema}.tasks WHERE status = 'completed'"
        )
        if done != tasks:
            raise RuntimeError(f"{done} of {tasks} tasks completed")
        await admin.execute("SELECT pg_stat_force_next_flush()")
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await asyncio.sleep(0.6)  # the statistics collector's flush
        stats = await admin.fetchrow(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE schemaname = $1 AND relname = 'tasks'",
            schema,
        )
        if stats is not None and stats["n_tup_upd"]:
            figures["hot_update_share"] = stats["n_tup_hot_upd"] / stats["n_tup_upd"]
        figures["load"] = os.getloadavg()[0]
    finally:
        await conn.close()
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", required=True, help="a PostgreSQL URL (schemas are made here)")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--fillfactor",
        type=int,
        action="append",
        help="the split layout's fillfactor for tasks (repeatable: one split layout each;"
        " default 70 and 30)",
    )
    parser.add_argument("--layout", action="append", choices=LAYOUTS)
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    fillfactors = args.fillfactor or [70, 30]
    layouts: list[tuple[str, int]] = []
    for layout in args.layout or list(LAYOUTS):
        if layout == "split":
            layouts += [(f"split-ff{f}", f) for f in fillfactors]
        else:
            layouts.append((layout, 100))
    admin = await asyncpg.connect(ab.plain_dsn(args.url))
    try:
        data_directory = await admin.fetchval("SHOW data_directory")
        server = await admin.fetchval("SHOW server_version")
    finally:
        await admin.close()
    runs = []
    for number in range(1, args.rounds + 1):
        for layout, fillfactor in layouts:
            run = await one_round(
                args.url, data_directory, layout, args.tasks, args.batch, fillfactor
            )
            run["round"] = number
            runs.append(run)
            print(
                f"round {number} {layout:12s} server CPU per task: enqueue"
                f" {run['enqueue_server_cpu_us']:5.1f}, claim {run['claim_server_cpu_us']:5.1f},"
                f" finish {run['finish_server_cpu_us']:5.1f} us; WAL: enqueue"
                f" {run['enqueue_wal_bytes']:.0f}, claim {run['claim_wal_bytes']:.0f},"
                f" finish {run['finish_wal_bytes']:.0f} B; HOT"
                f" {100 * run.get('hot_update_share', 0):.0f} %; load {run['load']:.1f}",
                flush=True,
            )
    medians = ab.medians_by(runs, "layout", skip=("load", "round"))
    for layout, values in medians.items():
        print(layout, "median:", json.dumps({k: round(v, 1) for k, v in values.items()}))
    if not args.no_record:
        ab.write_record(
            args.results_dir,
            "postgres-layout-probe",
            {
                "benchmark": "postgres_layout_probe",
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "tasks": args.tasks,
                "batch": args.batch,
                "layouts": [name for name, _ in layouts],
                "runs": runs,
                "medians": medians,
                "machine": ab.machine_line(),
                "server": server,
            },
        )


if __name__ == "__main__":
    asyncio.run(main())
