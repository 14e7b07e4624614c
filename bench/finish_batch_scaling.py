"""Cost per row of the store's hot-path statements as their batch grows.

The statements a worker runs in batches -- finish, claim, lease renewal, lease watch,
rescue and progress -- must cost the same per row whatever the batch size (issue 14: a
finish batch of thousands ran for minutes). This script measures each at growing batch
sizes, on a store that holds ``--running`` RUNNING tasks (plus as many PENDING ones for
claims), and records the time per row.

**PostgreSQL** (``--postgres-url``, a fresh schema created and dropped by the script):
every statement runs under ``EXPLAIN (ANALYZE, BUFFERS)`` inside a transaction that is
rolled back, so each measurement sees the same store. It is prepared with ``PREPARE``
and run with ``EXECUTE`` twice over: with ``plan_cache_mode = force_generic_plan``
(what the backend's asyncpg connections use) and ``force_custom_plan`` (a plan made for
the values). The figure is the server's execution time; the plan's shape is recorded
too (the nodes, their rows and loops). Then ``finish_batch`` itself is timed through the
storage API (committed, asyncpg, generic plans), as a worker calls it.

The table's statistics matter, so every measurement is made twice:

- ``stale``: analyzed while one task was RUNNING, then the others were claimed
  (autovacuum is off for the schema's tables), which is what a store looks like right
  after a bulk enqueue, when a worker has just started: the planner believes almost
  nothing is RUNNING;
- ``fresh``: analyzed again with the tasks RUNNING.

**SQLite** (a fresh database file in a temporary directory): each operation is timed
through the storage API (committed), with the same RUNNING population, without
statistics (taskmill never runs ``ANALYZE``, but an application may) and with stale
ones; the statements it ran are recorded with their ``EXPLAIN QUERY PLAN``.

A measurement that exceeds ``--timeout`` is cancelled and recorded as such; the larger
sizes of that series are then skipped. Results go to
``bench/results/finish-batch-scaling-<date>.json`` with the machine, and
``bench/results/finish-batch-scaling.md`` is regenerated from every recorded file.

    uv run python bench/finish_batch_scaling.py --label "after" \\
        --postgres-url postgresql://taskmill:taskmill@127.0.0.1:5432/taskmill
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from taskmill.backends.sqlite import SQLiteStorage
from taskmill.model import AttemptOutcome, Progress
from taskmill.storage import (
    ClaimRequest,
    Finish,
    FinishKind,
    Lease,
    ProgressUpdate,
    TaskStorage,
    utcnow,
)
from taskmill.testing import new_task
from taskmill_postgres import PostgresStorage
from taskmill_postgres.options import channel_prefix, lock_key

# The backend's own conversion of finishes to its statement's arrays, so that the
# measured arguments are exactly those a worker sends.
from taskmill_postgres.storage import _finish_arrays
from throughput import machine_details, redact

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_POSTGRES_URL = os.environ.get(
    "TASKMILL_TEST_POSTGRES_URL", "postgresql://taskmill:taskmill@127.0.0.1:5432/taskmill"
)
STATEMENTS = (
    "finish",
    "claim_batch",
    "renew_leases",
    "watch_leases",
    "rescue_expired",
    "save_progress",
)
MODES = ("force_generic_plan", "force_custom_plan")
POOL_TYPE = "pool"
"""Task type of the RUNNING and PENDING population."""
WORKER = "bench"
POOL_LEASE = 86400.0
"""The population's leases outlive any run, so only the tasks a rescue measurement
expires on purpose are rescued."""
ENQUEUE_CHUNK = 5000
STALE_STATISTICS = "analyzed while one task was RUNNING"


# -- shared ---------------------------------------------------------------------------


def finishes_for(leases: Sequence[Lease]) -> list[Finish]:
    """COMPLETE finishes of ``leases``: the common case."""
    now = utcnow()
    return [
        Finish(
            lease=lease,
            kind=FinishKind.COMPLETE,
            outcome=AttemptOutcome.COMPLETED,
            started_at=now,
            finished_at=now,
            result_json='{"ok": true}',
        )
        for lease in leases
    ]


def progress_for(leases: Sequence[Lease]) -> list[ProgressUpdate]:
    return [ProgressUpdate(lease=lease, progress=Progress(1, 2, "half")) for lease in leases]


async def enqueue_pool(store: TaskStorage, task_type: str, count: int) -> None:
    for first in range(0, count, ENQUEUE_CHUNK):
        size = min(ENQUEUE_CHUNK, count - first)
        await store.enqueue([new_task(task_type) for _ in range(size)])


async def claim_all(
    store: TaskStorage, task_type: str, count: int, lease: float = POOL_LEASE
) -> list[Lease]:
    """Claim ``count`` PENDING tasks of ``task_type``; their leases."""
    leases: list[Lease] = []
    while len(leases) < count:
        request = ClaimRequest(
            worker_id=WORKER,
            handlers={(None, task_type): None},
            limit=min(ENQUEUE_CHUNK, count - len(leases)),
            lease_seconds=lease,
        )
        claimed = await store.claim_batch(request)
        if not claimed:
            raise RuntimeError(f"only {len(leases)} of {count} {task_type} tasks claimable")
        leases += [Lease(t.id, WORKER, t.attempts) for t in claimed]
    return leases


def per_row(ms: float, rows: int) -> float:
    return ms * 1000 / rows


# -- PostgreSQL: EXPLAIN ANALYZE of the statements ----------------------------------------


def plan_lines(node: dict[str, Any], depth: int = 0) -> list[str]:
    """One line per plan node: type, what it reads, actual rows x loops, time."""
    target = (
        node.get("Index Name")
        or node.get("Relation Name")
        or node.get("CTE Name")
        or node.get("Function Name")
        or node.get("Subplan Name")
        or ""
    )
    line = (
        f"{'  ' * depth}{node['Node Type']}{' ' + target if target else ''}"
        f" (est {node.get('Plan Rows')}) rows={node.get('Actual Rows')}"
        f" loops={node.get('Actual Loops')} ms={node.get('Actual Total Time')}"
    )
    lines = [line]
    for child in node.get("Plans", []):
        lines += plan_lines(child, depth + 1)
    return lines


def hottest(node: dict[str, Any]) -> str:
    """The scan that produced the most rows over all its loops: where the time goes."""
    best: tuple[float, str] = (-1.0, "")

    def visit(n: dict[str, Any]) -> None:
        nonlocal best
        if "Scan" in n["Node Type"]:
            loops = n.get("Actual Loops") or 0
            rows = (n.get("Actual Rows") or 0) + (n.get("Rows Removed by Filter") or 0)
            total = rows * loops
            if total > best[0]:
                target = n.get("Index Name") or n.get("Relation Name") or n.get("CTE Name") or ""
                best = (total, f"{n['Node Type']} {target} {rows:,.0f} rows x {loops:,} loops")
        for child in n.get("Plans", []):
            visit(child)

    visit(node)
    return best[1]


class PostgresBench:
    """The statements of one PostgresStorage, measured on a schema of their own."""

    def __init__(self, url: str, schema: str, timeout: float) -> None:
        self.url = url
        self.schema = schema
        self.timeout = timeout
        self.store = PostgresStorage.from_url(url, schema=schema, statement_timeout=timeout)
        self.lock = lock_key("events", schema)
        self.channel = channel_prefix(schema)
        self.conn: asyncpg.Connection[asyncpg.Record] | None = None
        self.leases: list[Lease] = []

    @property
    def tasks(self) -> str:
        return f'"{self.schema}".tasks'

    async def setup(self, running: int, pending: int) -> None:
        """Create the schema, enqueue, claim one task, analyze (stale statistics), then
        claim the others of ``running``."""
        self.conn = await asyncpg.connect(self.url, server_settings={"jit": "off"})
        await self.store.open()
        for table in ("tasks", "attempts", "events"):
            await self.conn.execute(
                f'ALTER TABLE "{self.schema}".{table} SET (autovacuum_enabled = off)'
            )
        await enqueue_pool(self.store, POOL_TYPE, running + pending)
        first = await claim_all(self.store, POOL_TYPE, 1)
        await self.conn.execute(f"ANALYZE {self.tasks}")
        self.leases = first + await claim_all(self.store, POOL_TYPE, running - 1)

    async def analyze(self) -> None:
        assert self.conn is not None
        await self.conn.execute(f"ANALYZE {self.tasks}")

    async def vacuum(self) -> None:
        """Reclaim what the rolled-back measurements left, without new statistics."""
        assert self.conn is not None
        for table in ("tasks", "attempts", "events"):
            await self.conn.execute(f'VACUUM "{self.schema}".{table}')

    async def close(self) -> None:
        await self.store.close()
        if self.conn is not None:
            await self.conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            await self.conn.close()

    def statement(self, name: str, size: int) -> tuple[str, list[Any], str | None]:
        """(SQL, arguments, SQL to run first in the same transaction) of ``name`` for a
        batch of ``size``."""
        sql = self.store.sql
        leases = self.leases[:size]
        ids = [x.task_id for x in leases]
        workers = [x.worker_id for x in leases]
        attempts = [x.attempt for x in leases]
        if name == "finish":
            arrays = _finish_arrays(finishes_for(leases), list(range(len(leases))))
            return sql.finish, [*arrays, self.lock, self.channel], None
        if name == "renew_leases":
            return sql.renew, [ids, workers, attempts, 30.0], None
        if name == "watch_leases":
            return sql.watch, [ids, workers, attempts], None
        if name == "save_progress":
            n = len(leases)
            data = [None] * n
            args = [ids, workers, attempts, [True] * n, [1.0] * n, [2.0] * n, ["half"] * n, data]
            return sql.save_progress, [*args, self.lock, self.channel], None
        if name == "rescue_expired":
            expire = (
                f"UPDATE {self.tasks} SET lease_expires_at = now() - interval '1 hour'"
                f" WHERE id = ANY('{{{','.join(ids)}}}'::text[])"
            )
            return sql.rescue, [size, self.lock, self.channel], expire
        if name == "claim_batch":
            request = ClaimRequest(
                worker_id="claimer",
                handlers={(None, POOL_TYPE): None},
                limit=size,
                lease_seconds=30.0,
            )
            built = sql.claim_arguments(request, self.lock, self.channel)
            assert built is not None
            return built[0], built[1], None
        raise ValueError(f"unknown statement {name}")

    async def literals(self, sql: str, args: list[Any]) -> tuple[list[str], list[str]]:
        """The parameter types of ``sql`` and ``args`` as typed SQL literals (EXECUTE
        takes its parameters as SQL text)."""
        conn = self.conn
        assert conn is not None
        prepared = await conn.prepare(sql)
        types: list[str] = []
        values: list[str] = []
        for param, value in zip(prepared.get_parameters(), args, strict=True):
            sql_type = await conn.fetchval("SELECT format_type($1, NULL)", param.oid)
            types.append(sql_type)
            literal = await conn.fetchval(f"SELECT quote_nullable($1::{sql_type}::text)", value)
            values.append(f"{literal}::{sql_type}")
        return types, values

    async def explain(self, name: str, size: int, mode: str) -> dict[str, Any]:
        """EXPLAIN ANALYZE one statement in a rolled-back transaction."""
        conn = self.conn
        assert conn is not None
        sql, args, first = self.statement(name, size)
        types, values = await self.literals(sql, args)
        figure: dict[str, Any] = {"statement": name, "size": size, "mode": mode}
        transaction = conn.transaction()
        await transaction.start()
        try:
            await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
            if first is not None:
                await conn.execute(first)
            await conn.execute(f"PREPARE measured({', '.join(types)}) AS {sql}")
            await conn.execute(f"SET LOCAL statement_timeout = {round(self.timeout * 1000)}")
            started = time.perf_counter()
            try:
                found = await conn.fetchval(
                    f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE measured({', '.join(values)})"
                )
            except asyncpg.QueryCanceledError:
                figure.update(timed_out=True, ms=self.timeout * 1000)
                return figure
            wall = (time.perf_counter() - started) * 1000
            (explained,) = json.loads(found)
            plan = explained["Plan"]
            ms = float(explained["Execution Time"])
            figure.update(
                timed_out=False,
                ms=round(ms, 3),
                us_per_row=round(per_row(ms, size), 2),
                planning_ms=round(float(explained["Planning Time"]), 3),
                round_trip_ms=round(wall, 3),
                rows=plan.get("Actual Rows"),
                shared_buffers_hit=plan.get("Shared Hit Blocks"),
                shared_buffers_read=plan.get("Shared Read Blocks"),
                hottest=hottest(plan),
                plan=plan_lines(plan),
            )
            return figure
        finally:
            await transaction.rollback()
            await conn.execute("DEALLOCATE measured")

    async def finish_through_api(self, size: int) -> dict[str, Any]:
        """Time ``finish_batch`` of ``size`` fresh RUNNING tasks, committed."""
        task_type = f"api-{uuid.uuid4().hex[:8]}"
        await enqueue_pool(self.store, task_type, size)
        leases = await claim_all(self.store, task_type, size, lease=30.0)
        figure: dict[str, Any] = {"statement": "finish_batch (API)", "size": size}
        started = time.perf_counter()
        try:
            done = await self.store.finish_batch(finishes_for(leases))
        except Exception as exc:  # the statement_timeout, reported as unavailable
            figure.update(timed_out=True, ms=self.timeout * 1000, error=str(exc)[:200])
            return figure
        ms = (time.perf_counter() - started) * 1000
        assert all(t is not None for t in done)
        figure.update(timed_out=False, ms=round(ms, 3), us_per_row=round(per_row(ms, size), 2))
        return figure


async def server_details(url: str) -> dict[str, Any]:
    conn = await asyncpg.connect(url)
    try:
        details: dict[str, Any] = {"version": await conn.fetchval("SHOW server_version")}
        for name in ("shared_buffers", "work_mem", "random_page_cost", "jit"):
            details[name] = await conn.fetchval(f"SHOW {name}")
        return details
    finally:
        await conn.close()


async def bench_postgres(args: argparse.Namespace, report: Callable[[str], None]) -> dict[str, Any]:
    schema = f"bench_scaling_{uuid.uuid4().hex[:8]}"
    bench = PostgresBench(args.postgres_url, schema, args.timeout)
    sizes: list[int] = args.sizes
    figures: list[dict[str, Any]] = []
    try:
        started = time.perf_counter()
        await bench.setup(args.running, max(sizes))
        report(f"postgres: {args.running:,} RUNNING ready in {time.perf_counter() - started:.0f} s")
        for stats in ("stale", "fresh"):
            if stats == "fresh":
                await bench.analyze()
            for name in args.statements:
                for mode in MODES:
                    skip = False
                    for size in sizes:
                        if skip:
                            figures.append(
                                {"statement": name, "size": size, "mode": mode, "skipped": True}
                            )
                            figures[-1]["stats"] = stats
                            continue
                        figure = await bench.explain(name, size, mode)
                        figure["stats"] = stats
                        figures.append(figure)
                        report(f"postgres {stats} {name} {mode} {size:,}: {describe(figure)}")
                        skip = bool(figure.get("timed_out"))
                await bench.vacuum()
            if args.api:
                for size in sizes:
                    figure = await bench.finish_through_api(size)
                    figure.update(stats=stats, mode="force_generic_plan")
                    figures.append(figure)
                    report(f"postgres {stats} finish_batch API {size:,}: {describe(figure)}")
                    if figure.get("timed_out"):
                        break
                await bench.vacuum()
        return {
            "url": redact(args.postgres_url),
            "server": await server_details(args.postgres_url),
            "figures": figures,
        }
    finally:
        await bench.close()


def describe(figure: dict[str, Any]) -> str:
    if figure.get("timed_out"):
        return f"cancelled after {figure['ms'] / 1000:.0f} s"
    hot = f" [{figure['hottest']}]" if figure.get("hottest") else ""
    return f"{figure['ms']:,.1f} ms, {figure['us_per_row']:,.1f} us/row{hot}"


# -- SQLite: the storage API, timed -------------------------------------------------------


def _shape(sql: str) -> str:
    """A statement with its literals taken out, to tell statements apart."""
    return re.sub(r"'[^']*'|\b\d+(\.\d+)?\b|x'[0-9a-fA-F]*'", "?", sql)[:4000]


class SQLiteBench:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "bench.db"
        self.store = SQLiteStorage.from_url(f"sqlite:///{self.path}")
        self.conn: sqlite3.Connection | None = None
        self.traced: list[str] = []

    async def setup(self, running: int, pending: int, stats: str) -> None:
        """Enqueue, claim one task, analyze when ``stats`` is 'stale', then claim the
        others of ``running``."""
        await self.store.open()
        await enqueue_pool(self.store, POOL_TYPE, running + pending)
        self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=60)
        await claim_all(self.store, POOL_TYPE, 1)
        if stats == "stale":
            self.conn.execute("ANALYZE")
        await claim_all(self.store, POOL_TYPE, running - 1)

    async def trace(self, on: bool) -> None:
        """Record (or stop recording) the SQL the storage's own connection runs."""

        def set_trace() -> None:
            # The storage's connection lives on its database thread: set it there.
            conn = self.store._conn
            assert conn is not None
            conn.set_trace_callback(self.traced.append if on else None)

        await self.store._run(set_trace)

    def query_plans(self) -> dict[str, list[str]]:
        """EXPLAIN QUERY PLAN of each distinct statement traced since the last call."""
        assert self.conn is not None
        plans: dict[str, list[str]] = {}
        for sql in self.traced:
            head = sql.split(None, 1)[0].upper() if sql.strip() else ""
            if head not in ("SELECT", "UPDATE", "INSERT", "DELETE", "WITH"):
                continue
            shape = _shape(sql)
            if shape in plans:
                continue
            try:
                rows = self.conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
            except sqlite3.Error as exc:
                plans[shape] = [f"(not explainable: {exc})"]
                continue
            plans[shape] = [str(r[3]) for r in rows]
        self.traced.clear()
        return {_abbreviate(k): v for k, v in plans.items()}

    async def prepared(self, name: str, size: int) -> tuple[Callable[[], Awaitable[Any]], str]:
        """Fresh tasks for one timed call of ``name``; the call, and their task type."""
        store = self.store
        task_type = f"m-{uuid.uuid4().hex[:8]}"
        await enqueue_pool(store, task_type, size)
        if name == "claim_batch":
            request = ClaimRequest(
                worker_id="claimer",
                handlers={(None, task_type): None},
                limit=size,
                lease_seconds=30.0,
            )
            return lambda: store.claim_batch(request), task_type
        leases = await claim_all(store, task_type, size, lease=30.0)
        if name == "finish":
            finishes = finishes_for(leases)
            return lambda: store.finish_batch(finishes), task_type
        if name == "renew_leases":
            return lambda: store.renew_leases(leases, 30.0), task_type
        if name == "watch_leases":
            return lambda: store.watch_leases(leases), task_type
        if name == "save_progress":
            updates = progress_for(leases)
            return lambda: store.save_progress(updates), task_type
        if name == "rescue_expired":
            assert self.conn is not None
            self.conn.execute(
                "UPDATE tasks SET lease_expires_at = 0 WHERE task_type = ?", (task_type,)
            )
            return lambda: store.rescue_expired(limit=size), task_type
        raise ValueError(f"unknown statement {name}")

    def forget(self, task_type: str) -> None:
        """Delete a measurement's tasks, so the table stays the same size."""
        assert self.conn is not None
        seqs = "SELECT seq FROM tasks WHERE task_type = ?"
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(f"DELETE FROM attempts WHERE task_seq IN ({seqs})", (task_type,))
        self.conn.execute(f"DELETE FROM events WHERE task_seq IN ({seqs})", (task_type,))
        self.conn.execute("DELETE FROM tasks WHERE task_type = ?", (task_type,))
        self.conn.execute("COMMIT")

    async def measure(self, name: str, size: int, repeat: int) -> dict[str, Any]:
        runs: list[float] = []
        for attempt in range(repeat):
            call, task_type = await self.prepared(name, size)
            traced = attempt == 0
            if traced:
                await self.trace(True)
            started = time.perf_counter()
            await call()
            runs.append((time.perf_counter() - started) * 1000)
            if traced:
                await self.trace(False)
            self.forget(task_type)
        ms = min(runs)
        return {
            "statement": name,
            "size": size,
            "timed_out": False,
            "ms": round(ms, 3),
            "us_per_row": round(per_row(ms, size), 2),
            "runs_ms": [round(r, 3) for r in runs],
            "query_plans": self.query_plans(),
        }

    async def close(self) -> None:
        await self.store.close()
        if self.conn is not None:
            self.conn.close()


def _abbreviate(shape: str) -> str:
    """A traced statement, short enough to read: a long VALUES list is cut."""
    shape = re.sub(r"(\(\?(, \?)*\))(, \(\?(, \?)*\))+", r"\1, ...", shape)
    return shape if len(shape) <= 600 else shape[:600] + " ..."


async def bench_sqlite(args: argparse.Namespace, report: Callable[[str], None]) -> dict[str, Any]:
    figures: list[dict[str, Any]] = []
    for stats in ("none", "stale"):
        directory = Path(tempfile.mkdtemp(prefix="taskmill-scaling-"))
        bench = SQLiteBench(directory)
        try:
            started = time.perf_counter()
            await bench.setup(args.running, max(args.sizes), stats)
            elapsed = time.perf_counter() - started
            report(f"sqlite {stats}: {args.running:,} RUNNING ready in {elapsed:.0f} s")
            for name in args.statements:
                slow = False
                for size in args.sizes:
                    if slow:
                        figures.append(
                            {"statement": name, "size": size, "stats": stats, "skipped": True}
                        )
                        continue
                    figure = await bench.measure(name, size, args.repeat)
                    figure["stats"] = stats
                    figures.append(figure)
                    report(f"sqlite {stats} {name} {size:,}: {describe(figure)}")
                    # A call cannot be cancelled here: skip the larger sizes instead.
                    slow = figure["ms"] > args.timeout * 1000
        finally:
            await bench.close()
            shutil.rmtree(directory, ignore_errors=True)
    return {"library": sqlite3.sqlite_version, "figures": figures}


# -- results -------------------------------------------------------------------------------


def write_results(results_dir: Path, record: dict[str, Any]) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = record["date"].replace("-", "").replace(":", "")[:15] + "Z"
    path = results_dir / f"finish-batch-scaling-{stamp}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _cell(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return ""
    if figure.get("skipped"):
        return "skipped"
    if figure.get("timed_out"):
        return f"> {figure['ms'] / 1000:,.0f} s"
    return f"{figure['ms']:,.1f} ms ({figure['us_per_row']:,.1f})"


def _table(figures: list[dict[str, Any]], sizes: list[int], with_mode: bool) -> list[str]:
    keyed: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for f in figures:
        key = (f["statement"], f.get("stats", ""), f.get("mode", ""))
        keyed.setdefault(key, {})[f["size"]] = f
    head = "| statement | statistics |" + (" plan |" if with_mode else "")
    head += "".join(f" {s:,} |" for s in sizes)
    lines = [head, "|---|---|" + ("---|" if with_mode else "") + "---:|" * len(sizes)]
    for (statement, stats, mode), by_size in keyed.items():
        plan = f" {mode.removeprefix('force_').removesuffix('_plan')} |" if with_mode else ""
        cells = "".join(f" {_cell(by_size.get(s))} |" for s in sizes)
        lines.append(f"| {statement} | {stats} |{plan}{cells}")
    return lines


def write_summary(results_dir: Path) -> Path:
    """Regenerate the markdown summary of every recorded run, newest first."""
    sections: list[str] = []
    for path in sorted(results_dir.glob("finish-batch-scaling-*.json"), reverse=True):
        record = json.loads(path.read_text())
        machine = record["machine"]
        settings = record["settings"]
        sizes = settings["sizes"]
        title = record["date"][:16].replace("T", " ")
        label = f": {record['label']}" if record.get("label") else ""
        lines = [
            f"## {title} UTC{label}",
            "",
            f"[json]({path.name}) · commit `{machine['git_commit'][:10]}`"
            f"{'+' if machine['git_dirty'] else ''} · {machine['cores']} cores "
            f"{machine['cpu_model']}, load {machine['load_average_1_5_15']} · "
            f"{settings['running']:,} tasks RUNNING · timeout {settings['timeout']:g} s · "
            "stale statistics: "
            f"{settings.get('stale_statistics', 'analyzed while every task was PENDING')}",
            "",
        ]
        if "postgres" in record:
            server = record["postgres"]["server"]
            lines += [
                f"PostgreSQL {server['version']}, `EXPLAIN ANALYZE` execution time of the "
                "statement, ms (µs per row); `finish_batch (API)` is the storage call, "
                "timed by the client:",
                "",
                *_table(record["postgres"]["figures"], sizes, with_mode=True),
                "",
            ]
        if "sqlite" in record:
            lines += [
                f"SQLite {record['sqlite']['library']}, the storage call timed by the client "
                f"(best of {settings['repeat']}), ms (µs per row):",
                "",
                *_table(record["sqlite"]["figures"], sizes, with_mode=False),
                "",
            ]
        sections.append("\n".join(lines))
    summary = results_dir / "finish-batch-scaling.md"
    summary.write_text(
        "# Recorded batch-scaling runs\n\n"
        "Generated by `bench/finish_batch_scaling.py` from the JSON files in this directory "
        "(do not edit by hand). Each cell is the time of one batch of that many rows, then "
        "the time per row in µs; a flat time per row across a line is the goal. The plans "
        "behind each figure are in the JSON files. How to read these: "
        "[docs/backends.md](../../docs/backends.md#finish-batch-cost).\n\n" + "\n".join(sections)
    )
    return summary


# -- command line ------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time per row of the hot-path store statements at growing batch sizes."
    )
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--no-sqlite", action="store_true", help="skip SQLite")
    parser.add_argument(
        "--sizes",
        type=lambda s: sorted(int(x) for x in s.split(",")),
        default=[10, 100, 1000, 10000, 50000],
        help="batch sizes, comma-separated (default 10,100,1000,10000,50000)",
    )
    parser.add_argument(
        "--running",
        type=int,
        default=50000,
        help="RUNNING tasks in the store while measuring (at least the largest size)",
    )
    parser.add_argument(
        "--statement",
        dest="statements",
        action="append",
        choices=STATEMENTS,
        help="measure only these (repeatable; default all)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds one measurement may take before it is cancelled (default 120)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="SQLite runs per figure (best)")
    parser.add_argument(
        "--no-api", dest="api", action="store_false", help="skip PostgreSQL's API timing"
    )
    parser.add_argument("--label", default="", help="what this run measures, e.g. 'before'")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    args.statements = args.statements or list(STATEMENTS)
    if args.running < max(args.sizes):
        parser.error("--running must be at least the largest batch size")
    return args


async def main(args: argparse.Namespace) -> None:
    def report(line: str) -> None:
        print(line, flush=True)

    record: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "label": args.label,
        "settings": {
            "sizes": args.sizes,
            "running": args.running,
            "statements": args.statements,
            "timeout": args.timeout,
            "repeat": args.repeat,
            "stale_statistics": STALE_STATISTICS,
        },
        "machine": machine_details(),
    }
    if not args.no_postgres:
        record["postgres"] = await bench_postgres(args, report)
    if not args.no_sqlite:
        record["sqlite"] = await bench_sqlite(args, report)
    if args.no_record:
        return
    path = write_results(args.results_dir, record)
    summary = write_summary(args.results_dir)
    print(f"recorded {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    print(f"summary {summary}")


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
