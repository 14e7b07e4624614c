"""The storage and deployment contracts on ``sqlite:///``, plus what only a file-backed
store must do."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from taskmill.backends.sqlite import SQLiteStorage, claim_statement, schema
from taskmill.backends.sqlite.schema import migrations, statements
from taskmill.discovery import storage_for_url
from taskmill.errors import StorageUnavailable
from taskmill.model import Task
from taskmill.storage import ClaimRequest, TaskStorage, utcnow
from taskmill.testing import (
    BadURL,
    DeploymentContract,
    Place,
    SchemaMigrations,
    StorageContract,
    new_task,
    wait_until,
)
from taskmill.testing import claim as claim_request
from taskmill.testing import finish as finish_of


def url_of(path: Path, query: str = "") -> str:
    return f"sqlite:///{path}{query}"


class SQLiteMigrations(SchemaMigrations):
    """The schema's migrations, applied in two database files of the test's directory."""

    def __init__(self, directory: Path) -> None:
        self.paths: dict[Place, Path] = {
            "fresh": directory / "fresh.db",
            "stepwise": directory / "stepwise.db",
        }

    def versions(self) -> list[int]:
        return [m.version for m in migrations()]

    async def create_fresh(self) -> None:
        store = SQLiteStorage.from_url(url_of(self.paths["fresh"]))
        await store.open()
        await store.close()

    async def apply_one(self, version: int) -> None:
        (migration,) = [m for m in migrations() if m.version == version]
        conn = sqlite3.connect(self.paths["stepwise"], isolation_level=None)
        try:
            conn.execute("BEGIN")
            for statement in statements(migration):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO taskmill_meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(version),),
            )
            conn.execute("COMMIT")
        finally:
            conn.close()

    async def stored_version(self, place: Place) -> int | None:
        path = self.paths[place]
        conn = sqlite3.connect(path)
        try:
            return schema.stored_version(conn, str(path))
        finally:
            conn.close()

    async def describe(self, place: Place) -> object:
        """Everything sqlite_master describes, except where pages happen to live."""
        conn = sqlite3.connect(self.paths[place])
        try:
            return conn.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
            ).fetchall()
        finally:
            conn.close()


class TestSQLiteStorage(StorageContract):
    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[TaskStorage]:
        store = SQLiteStorage.from_url(url_of(tmp_path / "tasks.db"))
        await store.open()
        yield store
        await store.close()

    @pytest.fixture
    def schema_migrations(self, tmp_path: Path) -> SchemaMigrations:
        return SQLiteMigrations(tmp_path)


def path_of(url: str) -> Path:
    return Path(SQLiteStorage.from_url(url).path)


class TestSQLiteDeployment(DeploymentContract):
    """Every deployment scenario that a file can meet, on a file of each test's own."""

    storage_class = SQLiteStorage
    distribution = "taskmill"
    not_applicable = {
        "server": "a sqlite:/// store is a file: there is no server to reach, no password"
    }
    unique_violation = (sqlite3.IntegrityError, "tasks_dedupe_leader")
    bad_urls = [
        BadURL("sqlite://", "sqlite:////absolute/path.db"),
        BadURL("sqlite:///", "sqlite:///relative/path.db"),
        BadURL("sqlite://host/tasks.db", "no host"),
        BadURL("sqlite:///:memory:", "memory://"),
        BadURL("sqlite:///t.db?bogus=1", "busy_timeout"),
        BadURL("sqlite:///t.db", "valid options are: busy_timeout", {"pool_size": 3}),
        BadURL("sqlite:///t.db?busy_timeout=soon", "number of seconds"),
        BadURL("sqlite:///t.db", "number of seconds", {"busy_timeout": -1}),
        BadURL("sqlite:///t.db?synchronous=sometimes", "NORMAL"),
    ]

    @pytest.fixture
    def deployment_url(self, tmp_path: Path) -> str:
        return url_of(tmp_path / "tasks.db")

    async def set_schema_version(self, url: str, version: int) -> None:
        with contextlib.closing(sqlite3.connect(path_of(url))) as conn, conn:
            conn.execute(
                "UPDATE taskmill_meta SET value = ? WHERE key = 'schema_version'", (str(version),)
            )

    async def footprint(self, url: str) -> object:
        """The file's bytes, and the names of the files beside it (no -wal, -shm or
        journal file appears)."""
        path = path_of(url)
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
        return digest, sorted(p.name for p in path.parent.iterdir())

    async def plant_foreign_data(self, url: str) -> str:
        with contextlib.closing(sqlite3.connect(path_of(url))) as conn, conn:
            conn.execute("CREATE TABLE users (name TEXT)")
            conn.execute("INSERT INTO users VALUES ('alice')")
        return "users"

    async def insert_active_task(
        self, storage: TaskStorage, leader: Task, *, dedupe_key: str
    ) -> None:
        assert isinstance(storage, SQLiteStorage)
        with contextlib.closing(raw(storage)) as conn:
            conn.execute(
                "INSERT INTO tasks (id, task_type, status, created_at, run_at, updated_at,"
                " app_id, params, priority, max_retries, dedupe_key)"
                " VALUES (?, ?, 'pending', 0, 0, 0, ?, '{}', 0, 0, ?)",
                (str(uuid.uuid4()), leader.task_type, leader.app_id, dedupe_key),
            )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStorage]:
    s = SQLiteStorage.from_url(url_of(tmp_path / "tasks.db"))
    await s.open()
    yield s
    await s.close()


def raw(store: SQLiteStorage) -> sqlite3.Connection:
    """A second, plain connection to the store's file (autocommit)."""
    return sqlite3.connect(store.path, isolation_level=None, timeout=30)


# -- URLs and options -----------------------------------------------------------------


def test_the_entry_point_serves_sqlite_urls(tmp_path: Path):
    store = storage_for_url(url_of(tmp_path / "x.db"))
    assert isinstance(store, SQLiteStorage)
    assert not (tmp_path / "x.db").exists(), "from_url must not touch the file"


def test_relative_and_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    relative = SQLiteStorage.from_url("sqlite:///data/tasks.db")
    assert relative.path == str(tmp_path / "data" / "tasks.db")
    assert relative.url == "sqlite:///data/tasks.db"
    absolute = SQLiteStorage.from_url("sqlite:////var/lib/tasks.db")
    assert absolute.path == "/var/lib/tasks.db"


def test_options_from_the_query_string_and_keywords(tmp_path: Path):
    store = SQLiteStorage.from_url(url_of(tmp_path / "t.db", "?busy_timeout=10"))
    assert store.busy_timeout == 10.0
    assert store.path == str(tmp_path / "t.db")
    store = SQLiteStorage.from_url(
        url_of(tmp_path / "t.db", "?busy_timeout=10&synchronous=full"), busy_timeout=2
    )
    assert (store.busy_timeout, store.synchronous) == (2.0, "FULL")
    assert SQLiteStorage.from_url(url_of(tmp_path / "t.db")).busy_timeout == 30.0


async def test_the_database_runs_in_wal_mode_with_integer_timestamps(store: SQLiteStorage):
    (task,) = await store.enqueue([new_task(run_at=utcnow() + timedelta(seconds=1))])
    with raw(store) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        row = conn.execute(
            "SELECT typeof(created_at), typeof(run_at), run_at, params FROM tasks WHERE id = ?",
            (task.id,),
        ).fetchone()
    assert row[:2] == ("integer", "integer")
    assert row[2] == (task.run_at - task.run_at.fromtimestamp(0, task.run_at.tzinfo)) // (
        timedelta(microseconds=1)
    )
    assert json.loads(row[3]) == task.params


# -- the claim statement ------------------------------------------------------------------


def _plan(conn: sqlite3.Connection, sql: str, params: list) -> str:
    return "\n".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


@pytest.mark.parametrize(
    "request_",
    [
        ClaimRequest(worker_id="w", handlers={(None, "job"): None}, limit=100, lease_seconds=30),
        ClaimRequest(
            worker_id="w",
            handlers={(None, "job"): 3, ("app", "job"): None, (None, "other"): None},
            limit=100,
            lease_seconds=30,
            min_priority=1000,
        ),
    ],
    ids=["one-type", "caps-apps-priority"],
)
async def test_a_claim_uses_the_partial_claim_index(store: SQLiteStorage, request_: ClaimRequest):
    await store.enqueue([new_task(t) for t in ("job", "other") for _ in range(50)])
    statement = claim_statement(request_, 0)
    assert statement is not None
    sql, params = statement
    with raw(store) as conn:
        plans = [_plan(conn, sql, params)]
        conn.execute("ANALYZE")  # with table statistics too
        plans.append(_plan(conn, sql, params))
    for plan in plans:
        assert "USING INDEX tasks_claim" in plan, plan
        assert "SCAN tasks" not in plan, plan  # never a full table scan
        assert "TEMP B-TREE" not in plan or len(request_.handlers) > 1, plan


async def test_the_lookups_by_id_lease_and_finish_time_use_indexes(store: SQLiteStorage):
    with raw(store) as conn:
        assert "sqlite_autoindex_tasks" in _plan(conn, "SELECT * FROM tasks WHERE id = ?", ["x"])
        assert "tasks_lease" in _plan(
            conn,
            "SELECT id FROM tasks WHERE status = 'running' AND lease_expires_at <= ?",
            [0],
        )
        assert "tasks_finished" in _plan(
            conn, "SELECT id FROM tasks WHERE finished_at < ? AND status IN ('completed')", [0]
        )
        assert "tasks_parent" in _plan(conn, "SELECT id FROM tasks WHERE parent_id = ?", ["p"])


# -- reading and retention ------------------------------------------------------------------


async def test_cleanup_removes_the_execution_log_rows(store: SQLiteStorage):
    await store.enqueue([new_task() for _ in range(3)])
    claimed = await store.claim_batch(claim_request(limit=3))
    await store.finish_batch([finish_of(t) for t in claimed])
    # cleanup(0) takes what finished strictly before now: wait for the clock to move.
    assert await wait_until(lambda: store.cleanup(timedelta(0))) == 3
    with raw(store) as conn:
        assert conn.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0


async def test_a_busy_database_is_reported_as_unavailable(tmp_path: Path):
    store = SQLiteStorage.from_url(url_of(tmp_path / "busy.db"), busy_timeout=0.1)
    await store.open()
    blocker = sqlite3.connect(store.path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        # It gives up after busy_timeout (were it to hang, the test's timeout ends it).
        with pytest.raises(StorageUnavailable, match="busy_timeout"):
            await store.enqueue([new_task()])
        blocker.execute("ROLLBACK")
        (task,) = await store.enqueue([new_task()])
        assert await store.get(task.id) == task
    finally:
        blocker.close()
        await store.close()


def test_no_file_is_left_open_after_close(tmp_path: Path):
    async def scenario() -> None:
        store = SQLiteStorage.from_url(url_of(tmp_path / "t.db"))
        await store.open()
        await store.enqueue([new_task()])
        await store.close()

    asyncio.run(scenario())
    if os.path.isdir("/proc/self/fd"):
        open_files = {os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")}
        assert str(tmp_path / "t.db") not in open_files
