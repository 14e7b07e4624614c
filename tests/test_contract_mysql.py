"""The storage and deployment contracts on ``mysql://`` (MariaDB in CI), plus what only
this backend must do: snapshots read as JSON, the seqs of a bulk enqueue, the event
cursor's commit order, lost connections and deadlocks."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import aiomysql
import attrs
import pymysql
import pytest
from taskmill.cursors import position_token, token_position
from taskmill.discovery import storage_for_url
from taskmill.errors import StorageUnavailable
from taskmill.model import EventKind, Progress, Task
from taskmill.sql.rows import TASK_COLUMN_NAMES
from taskmill.storage import ClaimRequest, FinishKind, NewTask, TaskStorage
from taskmill.testing import (
    BadURL,
    DeploymentContract,
    Place,
    SchemaMigrations,
    StorageContract,
    finish,
    new_task,
    wait_until,
)
from taskmill.validation import storable_error
from taskmill_mysql import MySQLStorage, latest_version
from taskmill_mysql import operations as my_operations
from taskmill_mysql import schema as my_schema
from taskmill_mysql import statements as my_sql
from taskmill_mysql.connection import Session
from taskmill_mysql.operations import _snapshots, append_events
from taskmill_mysql.options import parse_url
from taskmill_mysql.rows import TASK_COLUMNS
from taskmill_mysql.rows import task as row_task

from tests.conftest import MYSQL_URL, drop_database, mysql_url_for, new_schema_name


async def raw(url: str = MYSQL_URL) -> aiomysql.Connection:
    p = parse_url(url, {})
    return await aiomysql.connect(
        host=p.host, port=p.port, user=p.user, password=p.password, autocommit=True
    )


async def fetch(sql: str, *args: object) -> list[tuple[Any, ...]]:
    conn = await raw()
    try:
        async with conn.cursor() as cursor:
            await cursor.execute(sql, args or None)
            return list(await cursor.fetchall())
    finally:
        conn.close()


async def dump(database: str) -> dict[str, list[tuple[object, ...]]]:
    """The database's catalog (columns, indexes), comparable between two databases."""
    columns = await fetch(
        "SELECT table_name, column_name, ordinal_position, column_type, is_nullable,"
        " column_default, extra, generation_expression, collation_name"
        " FROM information_schema.columns WHERE table_schema = %s ORDER BY 1, 3",
        database,
    )
    indexes = await fetch(
        "SELECT table_name, index_name, seq_in_index, column_name, non_unique"
        " FROM information_schema.statistics WHERE table_schema = %s ORDER BY 1, 2, 3",
        database,
    )
    return {"columns": columns, "indexes": indexes}


class MySQLMigrations(SchemaMigrations):
    """The schema's migrations, applied in two fresh databases of the test server."""

    def __init__(self) -> None:
        self.names: dict[Place, str] = {"fresh": new_schema_name(), "stepwise": new_schema_name()}

    def versions(self) -> list[int]:
        return [m.version for m in my_schema.migrations()]

    async def create_fresh(self) -> None:
        store = MySQLStorage.from_url(mysql_url_for(self.names["fresh"]))
        await store.open()
        await store.close()

    async def apply_one(self, version: int) -> None:
        conn = await raw()
        try:
            applied = await my_schema.apply_pending(
                conn, self.names["stepwise"], "test", mariadb=True, up_to=version
            )
            assert applied == version
        finally:
            conn.close()

    async def stored_version(self, place: Place) -> int | None:
        conn = await raw()
        try:
            return await my_schema.stored_version(conn, self.names[place])
        finally:
            conn.close()

    async def describe(self, place: Place) -> object:
        return await dump(self.names[place])

    def drop(self) -> None:
        for name in self.names.values():
            drop_database(name)


class TestMySQLStorage(StorageContract):
    @pytest.fixture
    async def storage(self, mysql_url: str) -> AsyncIterator[TaskStorage]:
        store = MySQLStorage.from_url(mysql_url)
        await store.open()
        yield store
        await store.close()

    @pytest.fixture
    def schema_migrations(self) -> Iterator[SchemaMigrations]:
        migrations = MySQLMigrations()
        yield migrations
        migrations.drop()


class TestMySQLDeployment(DeploymentContract):
    """Every deployment scenario, on a database of the test server of each test's own."""

    storage_class = MySQLStorage
    distribution = "taskmill-mysql"
    unreachable_options = {"connect_timeout": 3}
    unique_violation = (pymysql.err.IntegrityError, "tasks_dedupe_leader")
    bad_urls = [
        BadURL("mysql://h/db?bogus=1", "valid options are: pool_min_size"),
        BadURL("mysql://app:s3cret@db:3306/app?nope=1", "valid options are: pool_min_size"),
        BadURL("mysql://h/db", "unknown mysql:// option", {"schema": "x"}),
        BadURL("mysql://h/1db", "plain identifier"),
        BadURL("mysql://h/db?pool_max_size=0", "whole number >= 1"),
        BadURL("mysql://h/db?pool_min_size=5&pool_max_size=2", "larger than"),
        BadURL("mysql://h:99999/db", "malformed"),
        BadURL("postgresql://h/db", "not a MySQL URL"),
    ]

    @pytest.fixture
    def deployment_url(self, mysql_url: str) -> str:
        return mysql_url

    def unreachable_url(self) -> str:
        return "mysql://app:s3cret@127.0.0.1:1/app"

    async def set_schema_version(self, url: str, version: int) -> None:
        database = MySQLStorage.from_url(url).database
        await fetch(
            f"UPDATE `{database}`.taskmill_meta SET `value` = %s WHERE `key` = %s",
            str(version),
            "schema_version",
        )

    async def footprint(self, url: str) -> object:
        """Every table of the database with the checksum of all its rows."""
        database = MySQLStorage.from_url(url).database
        tables = await fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
            database,
        )
        if not tables:
            return {}
        names = ", ".join(f"`{database}`.`{name}`" for (name,) in tables)
        return await fetch(f"CHECKSUM TABLE {names} EXTENDED")

    async def plant_foreign_data(self, url: str) -> str:
        database = MySQLStorage.from_url(url).database
        await fetch(f"CREATE DATABASE `{database}`")
        await fetch(f"CREATE TABLE `{database}`.invoices (id INT)")
        await fetch(f"INSERT INTO `{database}`.invoices VALUES (1), (2)")
        return "invoices"

    async def insert_active_task(
        self, storage: TaskStorage, leader: Task, *, dedupe_key: str
    ) -> None:
        assert isinstance(storage, MySQLStorage)
        now = datetime.now(UTC).replace(tzinfo=None)
        await fetch(
            f"INSERT INTO `{storage.database}`.tasks (id, task_type, status, created_at,"
            " run_at, updated_at, app_id, params, data, priority, max_retries, dedupe_key)"
            " VALUES (%s, %s, 'pending', %s, %s, %s, %s, '{}', '{}', 0, 0, %s)",
            str(uuid.uuid4()),
            leader.task_type,
            now,
            now,
            now,
            leader.app_id,
            dedupe_key,
        )


# -- URLs and options -----------------------------------------------------------------


def test_the_entry_points_serve_mysql_and_mariadb_urls():
    for scheme in ("mysql", "mariadb"):
        store = storage_for_url(f"{scheme}://user@localhost/db")
        assert isinstance(store, MySQLStorage)
        assert store.capabilities.notifications is False


async def test_migrate_is_idempotent_and_keeps_tasks(mysql_url: str):
    store = MySQLStorage.from_url(mysql_url)
    assert await store.migrate() == latest_version()
    assert await store.migrate() == latest_version()
    await store.open()
    try:
        (task,) = await store.enqueue([new_task()])
        assert await store.migrate() == latest_version()
        assert await store.get(task.id) == task
    finally:
        await store.close()


# -- snapshots read as one JSON column ------------------------------------------------------

_AWKWARD = "quote\" back\\ tab\t nl\n nul\x00 é 😀 \u2028 '; DROP"


async def test_a_snapshot_read_as_json_equals_the_one_read_column_by_column(mysql_url: str):
    store = MySQLStorage.from_url(mysql_url)
    await store.open()
    try:
        new = new_task(
            params={"s": _AWKWARD, "f": 0.1 + 0.2, "big": 2**62, "none": None},
            app_id=f"app {_AWKWARD}",
            priority=-(2**40),
            max_retries=7,
            dedupe_key=_AWKWARD,
            user_id=_AWKWARD,
        )
        await store.enqueue([new])
        request = ClaimRequest(
            worker_id=_AWKWARD, handlers={(new.app_id, "job"): None}, limit=5, lease_seconds=30
        )
        (first,) = await store.claim_batch(request)
        assert first == await store.get(new.id)
        (retried,) = await store.finish_batch(
            [finish(first, FinishKind.RETRY, error=_AWKWARD, data={"d": _AWKWARD})]
        )
        assert retried == await store.get(new.id)
        (again,) = await store.claim_batch(request)  # now with an error, data and attempts
        assert again == await store.get(new.id)
        # The core keeps an error storable (NUL written as an escape): Finish does it.
        assert (again.error, again.data, again.attempts) == (
            storable_error(_AWKWARD),
            {"d": _AWKWARD},
            2,
        )
        (done,) = await store.finish_batch(
            [finish(again, result=[_AWKWARD, 1.5], progress=Progress(1 / 3, 7.25, _AWKWARD))]
        )
        assert done == await store.get(new.id)
        assert done is not None and done.progress == Progress(1 / 3, 7.25, _AWKWARD)
    finally:
        await store.close()


async def test_a_row_the_server_gives_no_json_for_is_read_by_its_seq(mysql_url: str):
    # The server returns NULL for a JSON value longer than max_allowed_packet.
    store = MySQLStorage.from_url(mysql_url)
    await store.open()
    try:
        (stored,) = await store.enqueue([new_task(params={"s": _AWKWARD})])
        text = (
            f"SELECT IF(id = %s, NULL, JSON_ARRAY({TASK_COLUMNS})), seq, 7 FROM tasks "
            "WHERE id IN (%s, %s) ORDER BY seq"
        )
        (other,) = await store.enqueue([new_task()])

        async def read(s: Session) -> list[tuple[Any, ...]]:
            return await _snapshots(s, text, [stored.id, stored.id, other.id])

        rows = await store._db.run(read, transaction=False)
        assert [row_task(r) for r in rows] == [stored, other]
        assert [r[len(TASK_COLUMN_NAMES) :] for r in rows] == [(7,), (7,)]
    finally:
        await store.close()


# -- the seqs of a bulk enqueue ----------------------------------------------------------------


@pytest.mark.parametrize("case", ["step 1", "step 3", "seqs not as reserved"])
async def test_a_bulk_enqueue_numbers_its_tasks_and_events_as_stored(
    mysql_url: str, case: str, monkeypatch: pytest.MonkeyPatch
):
    """A multi-row INSERT's seqs are computed from its first one and the server's step
    (InnoDB reserves them at once, in row order), checked against the last row's; when
    the check fails they are read by id. Either way, every ENQUEUED event names its
    task's seq, in the order given."""
    if case == "seqs not as reserved":
        monkeypatch.setattr(
            my_sql,
            "INSERTED_SEQS",
            "SELECT LAST_INSERT_ID(), @@auto_increment_increment, -1 FROM tasks WHERE id = %s",
        )
    store = MySQLStorage.from_url(mysql_url, pool_max_size=1)
    await store.open()
    try:
        if case == "step 3":
            await store._db.run(
                lambda s: s.execute("SET SESSION auto_increment_increment = 3"),
                transaction=False,
            )
        await store.enqueue([new_task()])
        _, start = await store.read_events(None)
        news = [new_task(params={"i": i}) for i in range(700)]  # two INSERTs of 500 and 200
        stored = await store.enqueue(news)
        assert [t.id for t in stored] == [n.id for n in news]
        events, _ = await store.read_events(start, limit=1000)
        assert [e.task for e in events] == stored
        assert {e.kind for e in events} == {EventKind.ENQUEUED}
        db = store.database
        pairs = await fetch(
            f"SELECT e.task_seq, t.seq, t.id FROM `{db}`.events AS e JOIN `{db}`.tasks AS t"
            " ON t.id = e.task_id WHERE e.seq > %s ORDER BY e.seq",
            token_position(start),
        )
        assert [(a, i) for a, _, i in pairs] == [(b, i) for _, b, i in pairs]
        assert [i for _, _, i in pairs] == [n.id for n in news]
        seqs = [b for _, b, _ in pairs]
        assert seqs == sorted(seqs)
        if case == "step 3":
            assert {b - a for a, b in itertools.pairwise(seqs)} == {3}
    finally:
        await store.close()


@pytest.mark.parametrize(
    "message",
    [
        "Duplicate entry 'x' for key 'tasks_id'",  # MariaDB
        "Duplicate entry 'for key 'tasks_id'' for key 'tasks.tasks_id'",  # MySQL 8
    ],
)
async def test_an_id_the_unique_index_refuses_is_looked_up_in_the_run_again(
    mysql_url: str, message: str, monkeypatch: pytest.MonkeyPatch
):
    """A bulk enqueue of distinct ids reads no stored task first; the unique ``tasks_id``
    index refuses a stored id, named as MariaDB or MySQL 8 names it, and the run again
    looks the ids up (the duplicate-id rule)."""
    store = MySQLStorage.from_url(mysql_url)
    await store.open()
    looked_up: list[bool] = []
    real = my_operations.enqueue

    async def refused_once(s: Session, args: tuple[Any, bool]) -> Any:
        looked_up.append(args[1])
        if len(looked_up) == 1:
            raise pymysql.err.IntegrityError(1062, message)
        return await real(s, args)

    try:
        (stored,) = await store.enqueue([new_task()])
        monkeypatch.setattr(my_operations, "enqueue", refused_once)
        again = new_task()
        assert await store.enqueue([again]) == [await store.get(again.id)]
        assert looked_up == [False, True]
        monkeypatch.setattr(my_operations, "enqueue", real)
        same = NewTask(**{**attrs.asdict(again, recurse=False)})
        assert await store.enqueue([same]) == [await store.get(again.id)]
        assert stored == await store.get(stored.id)
    finally:
        await store.close()


# -- the event cursor follows commit order ------------------------------------------------


async def test_an_event_writer_waits_for_the_one_before_it_to_commit(mysql_url: str):
    """AUTO_INCREMENT is not commit order: a transaction that drew seq N and commits
    after one that drew N+1 would appear behind a reader's cursor. Event writers draw
    their seqs under the ``event_cursor`` row lock held to their commit, so a second
    writer waits for the first, and a reader never passes an uncommitted event."""
    store = MySQLStorage.from_url(mysql_url)
    await store.open()
    held = await raw(mysql_url)
    try:
        (first,) = await store.enqueue([new_task()])
        _, start = await store.read_events(None)
        seq = (await fetch(f"SELECT seq FROM `{store.database}`.tasks WHERE id = %s", first.id))[0][
            0
        ]
        await held.select_db(store.database)
        await held.begin()
        async with held.cursor() as cursor:
            session = Session(held, cursor)
            await append_events(
                session, [(int(seq), first.id, "progress", "running", datetime(2026, 1, 1))]
            )
            await session.flush()  # its draw and INSERT are deferred to the commit
            second = asyncio.create_task(store.enqueue([new_task()]))

            async def second_waits_for_a_lock() -> bool:
                if second.done():
                    second.result()  # its error, if it failed
                    raise AssertionError("the second event writer did not wait")
                rows = await fetch(
                    "SELECT COUNT(*) FROM information_schema.processlist"
                    " WHERE info LIKE 'UPDATE event_cursor%'"
                )
                return int(rows[0][0]) >= 1

            await wait_until(second_waits_for_a_lock, timeout=15)
            assert not second.done()
            assert await store.read_events(start) == ([], start)
        await held.commit()
        (later,) = await asyncio.wait_for(second, 15)
        events, cursor_now = await store.read_events(start)
        assert [(e.task.id, e.kind.value) for e in events] == [
            (first.id, "progress"),
            (later.id, "enqueued"),
        ]
        first_seq = token_position(start)
        assert [e.cursor for e in events] == [
            position_token(first_seq + 1),
            position_token(first_seq + 2),
        ]
        assert cursor_now == position_token(first_seq + 2)
    finally:
        held.close()
        await store.close()


# -- errors: lost connections, deadlocks ----------------------------------------------------


async def test_a_connection_lost_mid_operation_is_unavailable_and_the_pool_recovers(
    mysql_url: str,
):
    store = MySQLStorage.from_url(mysql_url, pool_min_size=1, pool_max_size=1)
    await store.open()
    try:
        (task,) = await store.enqueue([new_task()])

        async def slow(s: Session) -> None:
            await s.execute("SELECT SLEEP(30)")

        running = asyncio.create_task(store._db.run(slow))

        async def sleeping() -> list[tuple[Any, ...]]:
            return await fetch(
                "SELECT id FROM information_schema.processlist WHERE info = 'SELECT SLEEP(30)'"
            )

        await wait_until(sleeping, timeout=15)
        ((server_side,),) = await sleeping()
        await fetch(f"KILL {server_side}")
        with pytest.raises(StorageUnavailable, match=r"Lost connection|gone away"):
            await asyncio.wait_for(running, 15)
        assert await store.get(task.id) == task  # a new connection, the same store

        idle = await fetch(
            "SELECT id FROM information_schema.processlist WHERE db = %s", store.database
        )
        for (connection,) in idle:
            await fetch(f"KILL {connection}")
        # An idle connection the server dropped is noticed by the pool and replaced.
        assert await store.get(task.id) == task
    finally:
        await store.close()


async def test_a_deadlock_is_run_again_and_a_lasting_one_is_unavailable(mysql_url: str):
    store = MySQLStorage.from_url(mysql_url)
    await store.open()
    calls = 0

    async def deadlocks_once(s: Session) -> int:
        nonlocal calls
        calls += 1
        await s.execute("SELECT 1")
        if calls == 1:
            raise pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
        return calls

    async def always_deadlocks(s: Session) -> int:
        raise pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")

    try:
        assert await store._db.run(deadlocks_once) == 2
        with pytest.raises(StorageUnavailable, match="Deadlock"):
            await store._db.run(always_deadlocks)
        assert await store.get("nothing") is None  # the pool is fine afterwards
    finally:
        await store.close()
