"""The PostgreSQL backend's hot-path statements are planned to cost the same per row
whatever the size of their batch (issue 14).

Nothing here is timed. Each statement is EXPLAINed (without running it) for a batch of
10,000 on a store holding 10,000 RUNNING tasks, as the backend's connections plan it
(``force_generic_plan``, the plan asyncpg's prepared statements reuse) and as a plan
made for the values (``force_custom_plan``), first with the table's statistics taken
while the tasks were still PENDING -- the state right after a bulk enqueue, in which a
finish of 1,000 rows ran for a minute -- then with fresh ones.

A plan passes when the only thing a nested loop reads once per outer row is a keyed
lookup in an index of ``tasks`` (an index condition that is neither missing nor a whole
array), unless its outer side is one row by construction; when no index of ``tasks`` is
read from end to end; and when the generic plan reads no table sequentially.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from taskmill.model import AttemptOutcome
from taskmill.storage import ClaimRequest, Finish, FinishKind, Lease, utcnow
from taskmill.testing import new_task
from taskmill_postgres import PostgresStorage
from taskmill_postgres.arguments import delete_flags
from taskmill_postgres.options import channel_prefix, lock_key
from taskmill_postgres.schema import Conn
from taskmill_postgres.storage import _finish_arrays

from tests.conftest import POSTGRES_URL, drop_schema, new_schema_name, require_postgres, run_sync

BATCH = 10_000
WORKER = "planner"
STATEMENTS = (
    "finish",
    "finish_applied",
    "finish_deleting",
    "finish_deleting_applied",
    "claim_batch",
    "renew_leases",
    "watch_leases",
    "rescue_expired",
    "save_progress",
)
SCANS_OF_TABLES = ("tasks", "attempts", "events", "tombstones")
"""Tables a batch must never scan once per row (``suspensions`` holds a few scopes)."""


async def _running_store(schema: str) -> list[Lease]:
    """BATCH tasks RUNNING in ``schema``, with statistics taken while they were PENDING
    and autovacuum off, so that the statistics stay that way."""
    store = PostgresStorage.from_url(POSTGRES_URL, schema=schema)
    await store.open()
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        for table in ("tasks", "attempts", "events"):
            await conn.execute(f'ALTER TABLE "{schema}".{table} SET (autovacuum_enabled = off)')
        for _ in range(BATCH // 5000):
            await store.enqueue([new_task("job") for _ in range(5000)])
        await conn.execute(f'ANALYZE "{schema}".tasks')
        leases: list[Lease] = []
        while len(leases) < BATCH:
            request = ClaimRequest(
                worker_id=WORKER, handlers={(None, "job"): None}, limit=5000, lease_seconds=3600
            )
            leases += [Lease(t.id, WORKER, t.attempts) for t in await store.claim_batch(request)]
        return leases
    finally:
        await conn.close()
        await store.close()


@pytest.fixture(scope="module")
def running_store() -> Iterator[tuple[str, list[Lease]]]:
    """A schema with BATCH RUNNING tasks and stale statistics (shared by the module:
    the tests only EXPLAIN, and roll back what they change)."""
    require_postgres()
    schema = new_schema_name()
    try:
        yield schema, run_sync(_running_store(schema))
    finally:
        drop_schema(schema)


def statement(name: str, schema: str, leases: list[Lease]) -> tuple[str, list[Any]]:
    """The SQL of ``name`` and its arguments for a batch of ``leases``, as the backend
    sends them."""
    sql = PostgresStorage.from_url(POSTGRES_URL, schema=schema).sql
    lock, channel = lock_key("events", schema), channel_prefix(schema)
    ids = [x.task_id for x in leases]
    workers = [x.worker_id for x in leases]
    attempts = [x.attempt for x in leases]
    n = len(leases)
    if name in ("finish", "finish_applied"):
        now = utcnow()
        finishes = [
            Finish(x, FinishKind.COMPLETE, AttemptOutcome.COMPLETED, now, now, result_json="1")
            for x in leases
        ]
        finish_sql = sql.finish if name == "finish" else sql.finish_applied
        return finish_sql, [*_finish_arrays(finishes, list(range(n))), lock, channel]
    if name in ("finish_deleting", "finish_deleting_applied"):
        # Every fourth finish keeps its task, every fourth deletes a failed one (updated,
        # then forgotten), the others delete completed ones (deleted without an update).
        now = utcnow()
        kinds = [FinishKind.COMPLETE, FinishKind.COMPLETE, FinishKind.FAIL, FinishKind.COMPLETE]
        finishes = []
        for i, x in enumerate(leases):
            kind = kinds[i % 4]
            failed = kind is FinishKind.FAIL
            outcome = AttemptOutcome.FAILED if failed else AttemptOutcome.COMPLETED
            error = "x" if failed else None
            finishes.append(
                Finish(x, kind, outcome, now, now, result_json="1", error=error, delete=i % 4 != 3)
            )
        finish_sql = sql.finish_deleting
        if name == "finish_deleting_applied":
            finish_sql = sql.finish_deleting_applied
        flags = delete_flags(finishes, list(range(n)))
        return finish_sql, [*_finish_arrays(finishes, list(range(n))), lock, channel, flags]
    if name == "renew_leases":
        return sql.renew, [ids, workers, attempts, 30.0]
    if name == "watch_leases":
        return sql.watch, [ids, workers, attempts]
    if name == "save_progress":
        progress = [[True] * n, [1.0] * n, [2.0] * n, ["half"] * n, [None] * n]
        return sql.save_progress, [ids, workers, attempts, *progress, lock, channel]
    if name == "rescue_expired":
        return sql.rescue, [n, lock, channel]
    if name == "claim_batch":
        request = ClaimRequest(
            worker_id="other", handlers={(None, "job"): None}, limit=n, lease_seconds=30.0
        )
        built = sql.claim_arguments(request, lock, channel)
        assert built is not None
        return built
    raise ValueError(name)


async def explain(
    conn: asyncpg.Connection[asyncpg.Record], sql: str, args: list[Any], mode: str
) -> dict[str, Any]:
    """The plan of ``sql`` prepared with ``PREPARE`` and run with ``EXECUTE`` under
    ``plan_cache_mode = mode`` (EXECUTE takes its arguments as SQL literals)."""
    prepared = await conn.prepare(sql)
    types: list[str] = []
    literals: list[str] = []
    for param, value in zip(prepared.get_parameters(), args, strict=True):
        sql_type = await conn.fetchval("SELECT format_type($1, NULL)", param.oid)
        literal = await conn.fetchval(f"SELECT quote_nullable($1::{sql_type}::text)", value)
        types.append(sql_type)
        literals.append(f"{literal}::{sql_type}")
    name = f"planned_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
    await conn.execute(f"PREPARE {name}({', '.join(types)}) AS {sql}")
    try:
        found = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({', '.join(literals)})")
    finally:
        await conn.execute(f"DEALLOCATE {name}")
    (explained,) = json.loads(found)
    plan: dict[str, Any] = explained["Plan"]
    return plan


# -- what a linear plan looks like -------------------------------------------------------


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def _describe(node: dict[str, Any]) -> str:
    target = (
        node.get("Index Name")
        or node.get("Relation Name")
        or node.get("CTE Name")
        or node.get("Function Name")
        or ""
    )
    condition = node.get("Index Cond")
    return f"{node['Node Type']} {target}".strip() + (f" [{condition}]" if condition else "")


def _one_row(node: dict[str, Any]) -> bool:
    """Whether ``node`` yields at most one row whatever the data: an aggregate without
    grouping, the events gate, or a join of such."""
    kind = node["Node Type"]
    if kind == "Aggregate" and node.get("Strategy") == "Plain":
        return True
    if kind == "CTE Scan" and node.get("CTE Name") == "gate":
        return True
    if kind == "Nested Loop":
        return all(
            _one_row(child)
            for child in node["Plans"]
            if child.get("Parent Relationship") in ("Outer", "Inner")
        )
    return False


def _keyed_lookup(node: dict[str, Any]) -> bool:
    """An index scan of ``tasks`` that looks up the outer row's key."""
    if node["Node Type"] not in ("Index Scan", "Index Only Scan", "Bitmap Index Scan"):
        return False
    condition = node.get("Index Cond")
    return condition is not None and "ANY (" not in condition


def plan_problems(plan: dict[str, Any], *, generic: bool) -> list[str]:
    """Why ``plan`` would not cost the same per row at any batch size (empty if none)."""
    problems: list[str] = []
    for node in _nodes(plan):
        relation = node.get("Relation Name")
        if node["Node Type"] == "Nested Loop":
            sides = {child.get("Parent Relationship"): child for child in node["Plans"]}
            outer, inner = sides["Outer"], sides["Inner"]
            if _one_row(outer):
                continue
            for scan in _nodes(inner):
                if "Scan" not in scan["Node Type"] or scan["Node Type"] == "Bitmap Heap Scan":
                    continue
                if scan.get("Relation Name") not in (*SCANS_OF_TABLES, None):
                    continue  # a small table of its own (suspensions)
                if scan.get("Relation Name") == "tasks" and _keyed_lookup(scan):
                    continue
                problems.append(
                    f"a nested loop reads {_describe(scan)} once per row of {_describe(outer)}"
                )
        if (
            relation == "tasks"
            and node["Node Type"] in ("Index Scan", "Index Only Scan")
            and "Index Cond" not in node
        ):
            problems.append(f"{_describe(node)} reads the whole index")
        if generic and node["Node Type"] == "Seq Scan" and relation in SCANS_OF_TABLES:
            problems.append(f"the generic plan reads {relation} sequentially")
    return problems


# -- the plans -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("name", STATEMENTS)
async def test_a_batch_of_10000_is_planned_to_cost_the_same_per_row(
    running_store: tuple[str, list[Lease]], name: str, mode: str
):
    schema, leases = running_store
    sql, args = statement(name, schema, leases)
    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"jit": "off"})
    transaction = conn.transaction()
    await transaction.start()
    try:
        stale = await explain(conn, sql, args, mode)
        # Fresh statistics, for this transaction only: rolled back with it.
        await conn.execute(f'ANALYZE "{schema}".tasks')
        fresh = await explain(conn, sql, args, mode)
    finally:
        await transaction.rollback()
        await conn.close()
    generic = mode == "force_generic_plan"
    for statistics, plan in (("stale", stale), ("fresh", fresh)):
        problems = plan_problems(plan, generic=generic)
        assert not problems, f"with {statistics} statistics: {problems}"


def test_the_checks_reject_a_nested_loop_over_every_running_task():
    """The shape the finish statement had (issue 14) is refused: a full read of the
    partial ``tasks_lease`` index, with the batch read once per row of it."""
    old_plan = {
        "Node Type": "Nested Loop",
        "Plans": [
            {
                "Node Type": "Index Scan",
                "Parent Relationship": "Outer",
                "Index Name": "tasks_lease",
                "Relation Name": "tasks",
            },
            {"Node Type": "CTE Scan", "Parent Relationship": "Inner", "CTE Name": "v"},
        ],
    }
    assert plan_problems(old_plan, generic=True) == [
        "a nested loop reads CTE Scan v once per row of Index Scan tasks_lease",
        "Index Scan tasks_lease reads the whole index",
    ]
    keyed = {
        "Node Type": "Nested Loop",
        "Plans": [
            {"Node Type": "CTE Scan", "Parent Relationship": "Outer", "CTE Name": "v"},
            {
                "Node Type": "Index Scan",
                "Parent Relationship": "Inner",
                "Index Name": "tasks_id_key",
                "Relation Name": "tasks",
                "Index Cond": "(id = v.id)",
            },
        ],
    }
    assert plan_problems(keyed, generic=True) == []


# -- plans made while the store is new ---------------------------------------------------


async def _new_store_plans(schema: str) -> dict[str, dict[str, Any]]:
    """The generic plan of every statement, made on one of the backend's own pooled
    connections (its session settings) while ``schema`` is new: ten tasks, never
    analyzed, autovacuum off. A plan made then is the one a connection keeps for the
    statement (``force_generic_plan``) however large the table grows."""
    store = PostgresStorage.from_url(POSTGRES_URL, schema=schema)
    await store.open()
    try:
        admin = await asyncpg.connect(POSTGRES_URL)
        try:
            for table in ("tasks", "attempts", "events"):
                await admin.execute(
                    f'ALTER TABLE "{schema}".{table} SET (autovacuum_enabled = off)'
                )
        finally:
            await admin.close()
        await store.enqueue([new_task("job") for _ in range(10)])
        request = ClaimRequest(
            worker_id=WORKER, handlers={(None, "job"): None}, limit=10, lease_seconds=3600
        )
        leases = [Lease(t.id, WORKER, t.attempts) for t in await store.claim_batch(request)]
        assert len(leases) == 10

        async def plan_all(conn: Conn) -> dict[str, dict[str, Any]]:
            plans: dict[str, dict[str, Any]] = {}
            for name in STATEMENTS:
                sql, args = statement(name, schema, leases)
                plans[name] = await explain(conn, sql, args, "force_generic_plan")  # type: ignore[arg-type]
            return plans

        plans: dict[str, dict[str, Any]] = await store._db.run(plan_all, transaction=True)
        return plans
    finally:
        await store.close()


def test_plans_made_while_the_store_is_new_read_no_table_sequentially():
    """A connection plans each statement once, at its first use: on a new store (a
    table never analyzed, ten rows) PostgreSQL would plan the finish and the claim as a
    scan of the whole ``tasks`` table, and keep doing that scan per call as the table
    grows (measured: a finish of 10 tasks reading 10,476 rows, 4.3 ms). The backend's
    sessions turn seq scans off, so those plans take the indexes."""
    require_postgres()
    schema = new_schema_name()
    try:
        plans = run_sync(_new_store_plans(schema))
    finally:
        drop_schema(schema)
    problems = {
        name: [
            f"{_describe(node)} reads {node['Relation Name']} sequentially"
            for node in _nodes(plan)
            if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in SCANS_OF_TABLES
        ]
        for name, plan in plans.items()
    }
    assert not {name: found for name, found in problems.items() if found}, problems
    assert set(plans) == set(STATEMENTS)
