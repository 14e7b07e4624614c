"""The storage and deployment contracts on ``postgresql://``, plus what only PostgreSQL
must do: options, a statement timeout, versioned migrations, the claim statement and its
index, dedupe and the event log under concurrency, and LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime

import asyncpg
import pytest
from attrs import evolve
from taskmill.cursors import position_token
from taskmill.discovery import storage_for_url
from taskmill.errors import InvalidTaskSpec, StorageUnavailable
from taskmill.model import (
    AttemptOutcome,
    SuspensionScope,
    Task,
    TaskFilter,
    TaskStatus,
)
from taskmill.storage import (
    FinishKind,
    StoreChange,
    TaskStorage,
    utcnow,
)
from taskmill.testing import (
    BadURL,
    DeploymentContract,
    Place,
    SchemaMigrations,
    StorageContract,
    lease_of,
    new_task,
    wait_until,
)
from taskmill.testing import claim as claim_request
from taskmill.testing import finish as finish_of
from taskmill_postgres import PostgresChangeListener, PostgresStorage, latest_version
from taskmill_postgres import schema as pg_schema

from tests.conftest import POSTGRES_URL, drop_schema, new_schema_name
from tests.process_support import run_together
from tests.reliability.fault_proxy import FaultProxy
from tests.reliability.network import server_address, through


class PostgresMigrations(SchemaMigrations):
    """The schema's migrations, applied in two fresh schemas of the test database."""

    def __init__(self) -> None:
        self.schemas: dict[Place, str] = {"fresh": new_schema_name(), "stepwise": new_schema_name()}

    def versions(self) -> list[int]:
        return [m.version for m in pg_schema.migrations()]

    async def create_fresh(self) -> None:
        store = PostgresStorage.from_url(POSTGRES_URL, schema=self.schemas["fresh"])
        await store.open()
        await store.close()

    async def apply_one(self, version: int) -> None:
        conn = await raw()
        try:
            stepwise = self.schemas["stepwise"]
            assert await pg_schema.apply_pending(conn, stepwise, "test", up_to=version) == version
        finally:
            await conn.close()

    async def stored_version(self, place: Place) -> int | None:
        conn = await raw()
        try:
            return await pg_schema.stored_version(conn, self.schemas[place])
        finally:
            await conn.close()

    async def describe(self, place: Place) -> object:
        return await dump(self.schemas[place])

    def drop(self) -> None:
        for name in self.schemas.values():
            drop_schema(name)


class TestPostgresStorage(StorageContract):
    @pytest.fixture
    async def storage(self, postgres_url: str) -> AsyncIterator[TaskStorage]:
        store = PostgresStorage.from_url(postgres_url)
        await store.open()
        yield store
        await store.close()

    @pytest.fixture
    def schema_migrations(self) -> Iterator[SchemaMigrations]:
        migrations = PostgresMigrations()
        yield migrations
        migrations.drop()


class TestPostgresDeployment(DeploymentContract):
    """Every deployment scenario, on a schema of the test server of each test's own."""

    storage_class = PostgresStorage
    distribution = "taskmill-postgres"
    unreachable_options = {"connect_timeout": 3}
    unique_violation = (asyncpg.exceptions.UniqueViolationError, "tasks_dedupe_leader")
    bad_urls = [
        BadURL("postgresql://h/db?bogus=1", "valid options are: schema"),
        BadURL("postgresql://app:s3cret@h/db?bogus=1", "valid options are: schema"),
        BadURL("postgresql://h/db", "unknown postgresql:// option", {"busy_timeout": 3}),
        BadURL("postgresql://h/db?schema=1abc", "plain identifier"),
        BadURL("postgresql://h/db", "plain identifier", {"schema": "pg_temp"}),
        BadURL("postgresql://h/db", "plain identifier", {"schema": 'a"; drop'}),
        BadURL("postgresql://h/db?pool_max_size=0", "whole number >= 1"),
        BadURL("postgresql://h/db?pool_min_size=5&pool_max_size=2", "larger than"),
        BadURL("postgresql://h/db?statement_timeout=soon", "number of seconds"),
        BadURL("postgresql://h:99999/db", "malformed"),
        BadURL("mysql://h/db", "not a PostgreSQL URL"),
    ]

    @pytest.fixture
    def deployment_url(self, postgres_url: str) -> str:
        return postgres_url

    def unreachable_url(self) -> str:
        return "postgresql://app:s3cret@127.0.0.1:1/app"

    async def set_schema_version(self, url: str, version: int) -> None:
        schema = PostgresStorage.from_url(url).schema
        conn = await raw()
        try:
            await conn.execute(
                f'UPDATE "{schema}".taskmill_meta SET value = $1 WHERE key = $2',
                str(version),
                "schema_version",
            )
        finally:
            await conn.close()

    async def footprint(self, url: str) -> object:
        """Every table of the schema with a digest of all its rows."""
        schema = PostgresStorage.from_url(url).schema
        conn = await raw()
        try:
            return {
                table: await conn.fetchval(
                    "SELECT md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), ''))"
                    f' FROM "{schema}"."{table}" AS t'
                )
                for table in await pg_schema.schema_tables(conn, schema)
            }
        finally:
            await conn.close()

    async def plant_foreign_data(self, url: str) -> str:
        schema = PostgresStorage.from_url(url).schema
        conn = await raw()
        try:
            await conn.execute(f'CREATE SCHEMA "{schema}"')
            await conn.execute(f'CREATE TABLE "{schema}".invoices (id int)')
            await conn.execute(f'INSERT INTO "{schema}".invoices VALUES (1), (2)')
        finally:
            await conn.close()
        return "invoices"

    async def insert_active_task(
        self, storage: TaskStorage, leader: Task, *, dedupe_key: str
    ) -> None:
        assert isinstance(storage, PostgresStorage)
        conn = await raw()
        try:
            await conn.execute(
                f"INSERT INTO {storage.sql.quoted}.tasks (id, task_type, status, created_at,"
                " run_at, updated_at, app_id, params, priority, max_retries, dedupe_key)"
                " VALUES ($1, $2, 'pending', now(), now(), now(), $3, '{}', 0, 0, $4)",
                str(uuid.uuid4()),
                leader.task_type,
                leader.app_id,
                dedupe_key,
            )
        finally:
            await conn.close()


async def test_the_schema_has_the_tables_and_the_functions_the_statements_use(
    postgres_url: str,
):
    store = PostgresStorage.from_url(postgres_url)
    await store.open()
    await store.close()
    catalog = await dump(store.schema)
    assert {r[0] for r in catalog["tables"]} >= {
        "tasks", "attempts", "events", "suspensions", "taskmill_meta", "tasks_claim",
        "task_dependencies", "tombstones", "tombstones_id_key", "tombstones_age",
        "workers", "workers_pkey",
    }  # fmt: skip
    assert sorted((r[0], r[1]) for r in catalog["functions"]) == [
        ("forget_tasks", "task_seqs bigint[]"),
        ("settle_aliases", "leader_seqs bigint[]"),
        ("settle_aliases_of_deleted", "leader_seqs bigint[]"),
        ("settle_dependents", "ended_seqs bigint[], events_lock bigint, channel text"),
        (
            "settle_dependents",
            "ended_seqs bigint[], events_lock bigint, channel text, completed_ids text[]",
        ),
    ]


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[PostgresStorage]:
    s = PostgresStorage.from_url(postgres_url)
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def other(postgres_url: str) -> AsyncIterator[PostgresStorage]:
    """A second storage on the same schema: another process, as far as the database
    can tell (its own pool of connections)."""
    s = PostgresStorage.from_url(postgres_url)
    await s.open()
    yield s
    await s.close()


async def raw(url: str = POSTGRES_URL) -> asyncpg.Connection:
    return await asyncpg.connect(url)


# -- URLs and options -----------------------------------------------------------------


def test_the_entry_points_serve_postgresql_and_postgres_urls():
    for scheme in ("postgresql", "postgres"):
        store = storage_for_url(f"{scheme}://user@localhost/db")
        assert isinstance(store, PostgresStorage)
        assert store.capabilities.notifications is True


def test_options_from_the_query_string_and_keywords():
    store = PostgresStorage.from_url(
        "postgresql://u:p@h:6543/db?schema=jobs&pool_max_size=20&sslmode=disable",
        pool_min_size=2,
    )
    assert store.schema == "jobs"
    assert (store.options.pool_min_size, store.options.pool_max_size) == (2, 20)
    assert "sslmode=disable" in store._parsed.dsn
    assert "schema" not in store._parsed.dsn and "pool_max_size" not in store._parsed.dsn
    assert store.where == "PostgreSQL at h:6543/db as user u"
    keyword_wins = PostgresStorage.from_url("postgresql://h/db?schema=a", schema="b")
    assert keyword_wins.schema == "b"
    default = PostgresStorage.from_url("postgres://h/db")
    assert default.schema == "taskmill" and default.options.statement_timeout == 0


async def test_a_statement_timeout_is_reported_as_unavailable(postgres_url: str):
    store = PostgresStorage.from_url(postgres_url, statement_timeout=0.2)
    await store.open()
    try:
        (task,) = await store.enqueue([new_task()])
        conn = await raw()
        try:
            await conn.execute("BEGIN")
            await conn.execute(f'LOCK TABLE "{store.schema}".tasks IN ACCESS EXCLUSIVE MODE')
            with pytest.raises(StorageUnavailable, match="statement_timeout"):
                await store.get(task.id)
            await conn.execute("ROLLBACK")
        finally:
            await conn.close()
        assert await store.get(task.id) == task
    finally:
        await store.close()


# -- schema and migrations ---------------------------------------------------------------

_DUMP = {
    "columns": (
        "SELECT table_name, column_name, ordinal_position, data_type, is_nullable,"
        " column_default, is_identity, identity_generation FROM information_schema.columns"
        " WHERE table_schema = $1 ORDER BY 1, 3"
    ),
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
    "constraints": (
        "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)"
        " FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
        " WHERE n.nspname = $1 ORDER BY 1, 2"
    ),
    "sequences": (
        "SELECT sequencename, data_type::text, start_value, increment_by, cache_size"
        " FROM pg_sequences WHERE schemaname = $1 ORDER BY 1"
    ),
    "functions": (
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid),"
        " pg_get_function_result(p.oid), p.provolatile::text, p.prosrc, p.proconfig"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = $1 ORDER BY 1, 2"
    ),
    "tables": (
        "SELECT c.relname, c.relkind::text, c.reloptions FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY 1"
    ),
}


async def dump(name: str) -> dict[str, list[tuple]]:
    """The schema's catalog: columns, indexes, constraints, sequences, relations, with
    the schema's own name replaced so that two schemas compare."""
    conn = await raw()
    try:
        out: dict[str, list[tuple]] = {}
        for key, sql in _DUMP.items():
            rows = await conn.fetch(sql, name)
            out[key] = [tuple(str(v).replace(name, "S") for v in r) for r in rows]
        return out
    finally:
        await conn.close()


async def test_migrate_creates_the_schema_and_is_idempotent(postgres_url: str):
    store = PostgresStorage.from_url(postgres_url)
    assert await store.migrate() == latest_version()
    assert await store.migrate() == latest_version()
    await store.open()
    try:
        (task,) = await store.enqueue([new_task()])
        assert await store.migrate() == latest_version()
        assert await store.get(task.id) == task
        conn = await raw()
        try:
            assert await conn.fetchval(
                f'SELECT value FROM "{store.schema}".taskmill_meta WHERE key = $1',
                "schema_version",
            ) == str(latest_version())
        finally:
            await conn.close()
    finally:
        await store.close()


def test_the_current_schema_is_version_9_with_the_workers():
    assert latest_version() == 9
    assert [m.name for m in pg_schema.migrations()] == [
        "0001_initial.sql",
        "0002_handler_registrations.sql",
        "0003_dependencies.sql",
        "0004_rate_limits.sql",
        "0005_settle_dependents_fast_path.sql",
        "0006_bytewise_keys.sql",
        "0007_dependents_settle_aliases.sql",
        "0008_tombstones.sql",
        "0009_workers.sql",
    ]


async def test_an_older_schema_migrates_to_the_worker_registry(postgres_url: str):
    """``migrate()`` takes a schema at version 8 to 9, and the registry then works."""
    store = PostgresStorage.from_url(postgres_url)
    conn = await raw()
    try:
        assert await pg_schema.apply_pending(conn, store.schema, "test", up_to=8) == 8
    finally:
        await conn.close()
    assert await store.migrate() == 9
    await store.open()
    try:
        await store.put_worker("w", '{"a":1}')
        assert [(w.id, w.record) for w in await store.workers()] == [("w", '{"a":1}')]
    finally:
        await store.close()


async def test_the_indexed_key_columns_compare_bytewise(store: PostgresStorage):
    """Schema 6: the text columns of ``tasks`` that an index holds take the "C"
    collation (memcmp instead of strcoll in every btree descent). That keys differing
    in any byte stay apart is the shared contract's (DedupeContract), on every backend."""
    conn = await raw()
    try:
        rows = await conn.fetch(
            "SELECT a.attname, c.collname FROM pg_attribute a"
            " JOIN pg_collation c ON c.oid = a.attcollation"
            " WHERE a.attrelid = $1::regclass AND a.attnum > 0",
            f"{store.sql.quoted}.tasks",
        )
        collations = {str(r[0]): str(r[1]) for r in rows}
    finally:
        await conn.close()
    keys = ("id", "task_type", "app_id", "dedupe_key", "alias_of", "parent_id")
    assert {k: collations[k] for k in keys} == dict.fromkeys(keys, "C")


async def test_schemas_of_one_database_are_separate_stores(postgres_url: str):
    second = new_schema_name()
    a = PostgresStorage.from_url(postgres_url)
    b = PostgresStorage.from_url(POSTGRES_URL, schema=second)
    await a.open()
    await b.open()
    try:
        (task,) = await a.enqueue([new_task()])
        assert await b.get(task.id) is None
        assert await b.claim_batch(claim_request()) == []
        assert [t.id for t in await a.claim_batch(claim_request())] == [task.id]
        assert a.channel != b.channel
    finally:
        await a.close()
        await b.close()
        drop_schema(second)


async def test_large_batches_are_one_statement_each(store: PostgresStorage):
    await store.enqueue([new_task(params={"i": i}) for i in range(2000)])
    claimed = await store.claim_batch(claim_request(limit=2000))
    assert len(claimed) == 2000
    results = await store.finish_batch([finish_of(t, result=i) for i, t in enumerate(claimed)])
    assert [t.result if t else None for t in results] == list(range(2000))
    assert (await store.summary(TaskFilter())).completed == 2000


# -- leases never wait for a row lock ------------------------------------------------------

_DEADLINE = 10.0
"""Seconds the lease checks get while a row is held: they must return, however fast."""


async def _expire(store: PostgresStorage, *tasks: Task) -> None:
    conn = await raw()
    try:
        await conn.execute(
            f"UPDATE {store.sql.quoted}.tasks SET lease_expires_at = now() - interval '1 minute'"
            " WHERE id = ANY($1::text[])",
            [t.id for t in tasks],
        )
    finally:
        await conn.close()


async def _lease_expires_at(store: PostgresStorage, task: Task) -> datetime:
    """The committed expiry, read without waiting for any lock."""
    conn = await raw()
    try:
        expires: datetime = await conn.fetchval(
            f"SELECT lease_expires_at FROM {store.sql.quoted}.tasks WHERE id = $1", task.id
        )
        return expires
    finally:
        await conn.close()


async def test_lease_checks_and_rescue_pass_over_a_row_another_transaction_holds(
    store: PostgresStorage,
):
    await store.enqueue([new_task() for _ in range(3)])
    busy, free, abandoned = await store.claim_batch(claim_request(limit=3))
    await _expire(store, busy, free, abandoned)
    leases = [lease_of(busy), lease_of(free)]
    holder = await raw()
    try:
        await holder.execute("BEGIN")
        await holder.execute(
            f"SELECT 1 FROM {store.sql.quoted}.tasks WHERE id = $1 FOR UPDATE", busy.id
        )
        async with asyncio.timeout(_DEADLINE):
            renewed = await store.renew_leases(leases, 30)
            watched = await store.watch_leases(leases)
            rescued = await store.rescue_expired()
        # Held, as its committed row shows, but not extended: its row is busy.
        assert renewed == {busy.id: None, free.id: None}
        assert watched == {busy.id: None, free.id: None}
        assert await _lease_expires_at(store, free) > utcnow()
        assert await _lease_expires_at(store, busy) < utcnow()
        # Expired too, but held by someone: not rescued this round.
        assert [t.id for t in rescued] == [abandoned.id]
    finally:
        await holder.execute("ROLLBACK")
        await holder.close()
    (current,) = await store.rescue_expired()
    assert current.id == busy.id and current.status is TaskStatus.PENDING


async def test_a_finish_stalled_mid_write_is_neither_waited_for_nor_rescued(
    store: PostgresStorage,
):
    """Issue 14: a finish holds the rows it has updated while it waits for another one
    (here held by another connection). The worker's lease checks return meanwhile,
    reporting both tasks held, and a rescue passes over them though their leases
    expired; once the row is free, the finish completes both, and neither ran twice."""
    await store.enqueue([new_task() for _ in range(3)])
    writing, blocked, abandoned = await store.claim_batch(claim_request(limit=3))
    await _expire(store, writing, blocked, abandoned)
    leases = [lease_of(writing), lease_of(blocked)]
    holder, probe = await raw(), await raw()

    async def row_locked() -> bool:
        lockable = await probe.fetchval(
            f"SELECT count(*) FROM (SELECT 1 FROM {store.sql.quoted}.tasks WHERE id = $1"
            " FOR UPDATE SKIP LOCKED) AS x",
            writing.id,
        )
        return lockable == 0

    finishing: asyncio.Task[list[Task | None]] | None = None
    try:
        await holder.execute("BEGIN")
        await holder.execute(
            f"SELECT 1 FROM {store.sql.quoted}.tasks WHERE id = $1 FOR UPDATE", blocked.id
        )
        finishing = asyncio.create_task(
            store.finish_batch([finish_of(writing, result="w"), finish_of(blocked, result="b")])
        )
        await wait_until(row_locked)  # the finish holds the first row, waits for the second
        async with asyncio.timeout(_DEADLINE):
            renewed = await store.renew_leases(leases, 30)
            watched = await store.watch_leases(leases)
            rescued = await store.rescue_expired()
        assert renewed == {writing.id: None, blocked.id: None}
        assert watched == {writing.id: None, blocked.id: None}
        assert [t.id for t in rescued] == [abandoned.id]
        assert not finishing.done()
    finally:
        await holder.execute("ROLLBACK")
        await holder.close()
        await probe.close()
        if finishing is not None:
            async with asyncio.timeout(_DEADLINE):
                finished = await finishing
    assert [(t.status, t.result) if t else None for t in finished] == [
        (TaskStatus.COMPLETED, "w"),
        (TaskStatus.COMPLETED, "b"),
    ]
    for task in (writing, blocked):
        assert [a.outcome for a in await store.attempts(task.id)] == [AttemptOutcome.COMPLETED]


# -- dedupe ------------------------------------------------------------------------------


_ENQUEUER = """
import asyncio, sys
from taskmill_postgres import PostgresStorage
from taskmill.testing import new_task

async def main():
    store = PostgresStorage.from_url(sys.argv[1])
    await store.open()
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    for _ in range(25):
        await store.enqueue([new_task("render", {"page": 1}, dedupe_key="page-1")])
    await store.close()
    print("done")

asyncio.run(main())
"""


async def test_concurrent_enqueues_with_one_key_from_several_processes_yield_one_leader(
    store: PostgresStorage,
):
    await asyncio.to_thread(run_together, _ENQUEUER, store.url, processes=4)
    tasks = await store.query(TaskFilter(), limit=1000)
    leaders = [t for t in tasks if t.alias_of is None]
    assert len(tasks) == 100
    assert len(leaders) == 1
    assert all(t.alias_of == leaders[0].id for t in tasks if t is not leaders[0])


# -- LISTEN/NOTIFY --------------------------------------------------------------------------


async def _notify(store: PostgresStorage, *kinds: str) -> None:
    """NOTIFY changes of ``kinds`` from a connection of its own, in one transaction."""
    conn = await raw()
    try:
        async with conn.transaction():
            for kind in kinds:
                await conn.execute("SELECT pg_notify($1, '')", store.channel + kind)
    finally:
        await conn.close()


async def wait_begun(
    listener: PostgresChangeListener, kinds: frozenset[StoreChange], waiting: asyncio.Task[bool]
) -> None:
    """Return once ``waiting``, a ``wait`` for ``kinds``, has begun: its waiter is
    registered and the listener LISTENs on every channel of ``kinds`` (a notification
    counts from then). Fails at once if the wait ended first (woken by a notification
    of an earlier change: see :func:`delivered`)."""

    async def begun() -> bool:
        if waiting.done():
            raise AssertionError(f"the wait ended ({waiting.result()}) before it began")
        return all(listener._waiters.waiting(k) for k in kinds) and kinds <= listener._listening

    await wait_until(begun, interval=0.001)


async def delivered(store: PostgresStorage, listener: PostgresChangeListener) -> None:
    """Return once every notification committed so far has reached ``listener``: a
    marker notified after them arrives after them (one connection, commit order)."""
    marker = frozenset({StoreChange.CONTROL})
    waiting = asyncio.create_task(listener.wait(marker, 10))
    await wait_begun(listener, marker, waiting)
    await _notify(store, "control")
    assert await waiting is True


@pytest.fixture
async def listener(store: PostgresStorage) -> AsyncIterator[PostgresChangeListener]:
    listening = await store.change_listener()
    assert isinstance(listening, PostgresChangeListener)
    yield listening
    await listening.close()


async def test_a_notify_from_another_connection_wakes_a_waiting_listener(
    store: PostgresStorage, listener: PostgresChangeListener
):
    waiting = asyncio.create_task(listener.wait(frozenset({StoreChange.WORK}), 10))
    await wait_begun(listener, frozenset({StoreChange.WORK}), waiting)
    await _notify(store, "work")
    assert await waiting is True  # notified, not timed out


@contextlib.asynccontextmanager
async def delayed_listener(
    store: PostgresStorage, latency: float
) -> AsyncIterator[PostgresChangeListener]:
    """A listener on ``store``'s channels whose connection runs through a fault proxy
    that delays every chunk by ``latency`` seconds, both ways (LISTENs and
    notifications), once it is open."""
    host, port = server_address(POSTGRES_URL)
    async with FaultProxy(host, port) as proxy:
        slow_url = through(POSTGRES_URL, proxy.port)
        listening = await PostgresChangeListener.open(lambda: raw(slow_url), store.channel)
        proxy.latency = latency
        try:
            yield listening
        finally:
            proxy.latency = 0.0
            await listening.close()


async def test_a_kind_counts_as_listened_to_only_once_the_server_ran_the_listen(
    store: PostgresStorage,
):
    """With 300 ms between the listener and the server, a notification committed as
    soon as the wait has begun (``wait_begun``) still reaches it: the kind is not
    marked as listened to while its LISTEN is on the way."""
    async with delayed_listener(store, 0.3) as listener:
        waiting = asyncio.create_task(listener.wait(frozenset({StoreChange.WORK}), 5))
        await wait_begun(listener, frozenset({StoreChange.WORK}), waiting)
        await _notify(store, "work")  # straight to the server, not through the proxy
        assert await waiting is True


async def test_a_listener_wakes_only_for_the_kinds_it_waits_for(
    store: PostgresStorage, listener: PostgresChangeListener
):
    waiting = asyncio.create_task(listener.wait(frozenset({StoreChange.CONTROL}), 0.5))
    await wait_begun(listener, frozenset({StoreChange.CONTROL}), waiting)
    await _notify(store, "work", "events")
    assert await waiting is False
    waiting = asyncio.create_task(listener.wait(frozenset({StoreChange.CONTROL}), 10))
    await wait_begun(listener, frozenset({StoreChange.CONTROL}), waiting)
    await _notify(store, "events", "control")
    assert await waiting is True


async def test_only_notifications_after_the_wait_began_count(
    store: PostgresStorage, listener: PostgresChangeListener
):
    await listener.wait(frozenset({StoreChange.WORK}), 0.01)  # listening on WORK now
    await _notify(store, "work")
    await delivered(store, listener)  # before the wait below begins
    assert await listener.wait(frozenset({StoreChange.WORK}), 0.3) is False


@pytest.fixture
async def late_listener(store: PostgresStorage) -> AsyncIterator[PostgresChangeListener]:
    """A listener whose notifications arrive 50 ms late, as under load: the
    notification of a change reaches it after the change returned."""
    async with delayed_listener(store, 0.05) as listening:
        yield listening


async def test_storage_operations_notify_their_kinds_on_commit(
    other: PostgresStorage, late_listener: PostgresChangeListener
):
    listener = late_listener

    async def notified(kind: StoreChange, action, timeout: float = 5) -> bool:
        # The changes before this one notified too (a claim notifies EVENTS, say), and
        # the listener hears of them late: let every one arrive first, so that only
        # this action's notification can wake the wait.
        await delivered(other, listener)
        waiting = asyncio.create_task(listener.wait(frozenset({kind}), timeout))
        await wait_begun(listener, frozenset({kind}), waiting)
        await action
        return await waiting

    assert await notified(StoreChange.WORK, other.enqueue([new_task()]))
    assert await notified(StoreChange.EVENTS, other.enqueue([new_task()]))
    (running,) = await other.claim_batch(claim_request(limit=1))
    assert await notified(StoreChange.EVENTS, other.finish_batch([finish_of(running)]))
    (again,) = await other.claim_batch(claim_request())
    assert await notified(
        StoreChange.WORK, other.finish_batch([finish_of(again, FinishKind.RETRY, error="x")])
    )
    (again,) = await other.claim_batch(claim_request())
    assert await notified(StoreChange.CONTROL, other.cancel(task_ids=[again.id]))
    assert await notified(StoreChange.CONTROL, other.suspend(SuspensionScope("job")))
    assert await notified(StoreChange.WORK, other.resume(SuspensionScope("job")))
    # Nothing changes, nothing is notified:
    assert not await notified(StoreChange.EVENTS, other.claim_batch(claim_request("none")), 0.5)


async def test_a_rolled_back_change_notifies_nothing(
    store: PostgresStorage, listener: PostgresChangeListener
):
    (task,) = await store.enqueue([new_task()])
    await delivered(store, listener)  # its own notifications arrive before the wait begins
    waiting = asyncio.create_task(listener.wait(frozenset(StoreChange), 0.5))
    await wait_begun(listener, frozenset(StoreChange), waiting)
    with pytest.raises(InvalidTaskSpec, match="already stored"):
        await store.enqueue([new_task(), evolve(new_task("other"), id=task.id)])  # all or none
    assert await waiting is False


async def test_a_listener_reconnects_after_its_connection_is_killed_and_reports_it(
    store: PostgresStorage, listener: PostgresChangeListener
):
    assert listener._conn is not None
    pid = listener._conn.get_server_pid()
    waiting = asyncio.create_task(listener.wait(frozenset({StoreChange.WORK}), 15))
    conn = await raw()
    try:
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await conn.close()
    assert await waiting is True  # "look for yourself": notifications may have been lost
    assert listener.reconnects == 1 and listener.connected
    waiting = asyncio.create_task(listener.wait(frozenset({StoreChange.WORK}), 10))
    await wait_begun(listener, frozenset({StoreChange.WORK}), waiting)
    await _notify(store, "work")
    assert await waiting is True


async def test_a_notify_from_another_process_wakes_the_listener(
    store: PostgresStorage, listener: PostgresChangeListener
):
    script = (
        "import asyncio, sys\n"
        "from taskmill_postgres import PostgresStorage\n"
        "from taskmill.testing import new_task\n"
        "async def main():\n"
        "    store = PostgresStorage.from_url(sys.argv[1])\n"
        "    await store.open()\n"
        "    await store.enqueue([new_task()])\n"
        "    await store.close()\n"
        "asyncio.run(main())\n"
    )
    waiting = asyncio.create_task(listener.wait(frozenset({StoreChange.WORK}), 30))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, store.url)
    assert await proc.wait() == 0
    assert await waiting is True


async def test_closing_a_listener_releases_its_waiters(listener: PostgresChangeListener):
    waiting = asyncio.create_task(listener.wait(frozenset(StoreChange), 30))
    await wait_begun(listener, frozenset(StoreChange), waiting)
    await listener.close()
    assert await asyncio.wait_for(waiting, 5) is False
    await listener.close()


async def test_a_listener_cannot_open_on_an_unreachable_server():
    store = PostgresStorage.from_url("postgresql://u:pw@127.0.0.1:1/db", connect_timeout=2)
    with pytest.raises(StorageUnavailable, match=r"127\.0\.0\.1:1/db"):
        await store.change_listener()


async def test_pooled_connections_keep_no_session_state_between_operations(
    store: PostgresStorage,
):
    """The pool does not reset a released connection (that was a round trip per
    operation): this holds only because no operation leaves session state behind. After
    every kind of hot-path and control operation, each pooled connection has no open
    transaction, no advisory lock, no LISTEN, no open cursor and its default
    search_path."""
    (task,) = await store.enqueue([new_task()])
    await store.enqueue([new_task("keyed", dedupe_key="k"), new_task("keyed", dedupe_key="k")])
    claimed = await store.claim_batch(claim_request(limit=10))
    await store.renew_leases([lease_of(t) for t in claimed], 60)
    await store.finish_batch_applied([finish_of(t) for t in claimed])
    await store.cancel(task_ids=[task.id])
    await store.suspend(SuspensionScope("job"))
    await store.resume(SuspensionScope("job"))
    await store.read_events(position_token(0), limit=100)
    assert store._pool is not None
    default_path = await store._pool.fetchval(
        "SELECT reset_val FROM pg_settings WHERE name = 'search_path'"
    )
    seen: set[int] = set()
    for _ in range(store._pool.get_size() * 2):
        async with store._pool.acquire() as conn:
            seen.add(conn.get_server_pid())
            assert not conn.is_in_transaction()
            state = await conn.fetchrow(
                "SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid()) AS locks,"
                " (SELECT count(*) FROM pg_listening_channels()) AS channels,"
                " (SELECT count(*) FROM pg_cursors WHERE name <> '') AS cursors,"
                " current_setting('search_path') AS path"
            )
            assert state is not None
            assert (state["locks"], state["channels"], state["cursors"]) == (0, 0, 0)
            assert state["path"] == default_path
    assert seen, "no pooled connection was checked"
