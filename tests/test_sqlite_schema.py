"""The SQLite backend's versioned schema: creation, migration, and refusing what is not
ours, without ever damaging what is stored. A schema of an older or a newer version
and another application's database are the shared deployment contract's
(``TestSQLiteDeployment`` in test_contract_sqlite.py)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from taskmill.backends.sqlite import SQLiteStorage, latest_version
from taskmill.backends.sqlite.schema import migrations, split_statements, statements
from taskmill.cli import main as cli_main
from taskmill.cursors import position_token
from taskmill.errors import SchemaVersionError, StorageUnavailable
from taskmill.model import CancelReason, EventKind, TaskFilter, TaskStatus
from taskmill.testing import claim, finish, new_task


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


def schema_of(path: Path) -> list[tuple[str, str, str, str | None]]:
    """Everything sqlite_master describes, except where pages happen to live."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
    return [tuple(row) for row in rows]


def stored_version(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        (value,) = conn.execute(
            "SELECT value FROM taskmill_meta WHERE key = 'schema_version'"
        ).fetchone()
    return str(value)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def siblings(path: Path) -> set[str]:
    return {p.name for p in path.parent.iterdir()}


async def make_store(path: Path, n: int = 3) -> list[tuple[str, dict]]:
    """A taskmill database at ``path`` holding ``n`` tasks; their (id, params)."""
    store = SQLiteStorage.from_url(url_of(path))
    await store.open()
    tasks = await store.enqueue([new_task(params={"i": i}) for i in range(n)])
    await store.close()
    return [(t.id, t.params) for t in tasks]


async def read_back(path: Path) -> list[tuple[str, dict]]:
    store = SQLiteStorage.from_url(url_of(path))
    await store.open()
    try:
        return [(t.id, t.params) for t in await store.query(TaskFilter(), limit=10_000)]
    finally:
        await store.close()


# -- the migrations themselves ------------------------------------------------------------


def test_statements_are_split_on_real_semicolons_only():
    script = """
    -- a comment; with a semicolon
    CREATE TABLE a (x TEXT DEFAULT 'semi;colon');
    CREATE TRIGGER t AFTER INSERT ON a BEGIN
        UPDATE a SET x = 'y;z'; DELETE FROM a WHERE 0;
    END;
    /* block; comment */
    """
    statements = split_statements(script)
    assert len(statements) == 3
    assert "'semi;colon'" in statements[0]
    assert statements[1].startswith("CREATE TRIGGER") and statements[1].endswith("END;")
    conn = sqlite3.connect(":memory:")
    for statement in statements:
        conn.execute(statement)


async def test_migrate_is_idempotent_and_keeps_tasks(tmp_path: Path):
    path = tmp_path / "t.db"
    stored = await make_store(path)
    before = schema_of(path)
    store = SQLiteStorage.from_url(url_of(path))
    assert await store.migrate() == latest_version()  # on a closed store
    await store.open()
    assert await store.migrate() == latest_version()  # and on an open one
    assert await store.migrate() == latest_version()
    await store.close()
    assert schema_of(path) == before
    assert await read_back(path) == stored


async def test_migrate_creates_a_missing_database(tmp_path: Path):
    path = tmp_path / "new.db"
    assert await SQLiteStorage.from_url(url_of(path)).migrate() == latest_version()
    assert stored_version(path) == str(latest_version())


async def test_the_schema_version_is_stored(tmp_path: Path):
    path = tmp_path / "t.db"
    await make_store(path, 0)
    assert stored_version(path) == str(latest_version())


def test_the_current_schema_is_version_7_with_the_workers():
    assert latest_version() == 7
    assert [m.name for m in migrations()] == [
        "0001_initial.sql",
        "0002_control.sql",
        "0003_handler_registrations.sql",
        "0004_dependencies.sql",
        "0005_rate_limits.sql",
        "0006_tombstones.sql",
        "0007_workers.sql",
    ]


async def test_the_control_tables_and_indexes_exist(tmp_path: Path):
    path = tmp_path / "t.db"
    await make_store(path, 0)
    names = {row[1] for row in schema_of(path)}
    assert {"suspensions", "suspensions_scope", "events", "tombstones", "tombstones_id"} <= names
    assert {"handler_registrations", "handler_registrations_key"} <= names
    assert {"task_dependencies", "task_dependencies_dependent"} <= names
    assert "rate_buckets" in names


def stepwise_database(path: Path, version: int) -> None:
    """A database built by applying migrations 1..``version`` by hand."""
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in migrations()[:version]:
        conn.execute("BEGIN")
        for statement in statements(migration):
            conn.execute(statement)
        conn.execute(
            "INSERT INTO taskmill_meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(migration.version),),
        )
        conn.execute("COMMIT")
    conn.close()


def downgrade(path: Path, reference: Path, version: int) -> None:
    """Make the database at ``path`` what a taskmill at schema ``version`` would have
    written: drop every table and index that ``reference`` (a database at that version)
    does not have, and record the version."""
    keep = {(row[0], row[1]) for row in schema_of(reference)}
    extra = [(kind, name) for kind, name, _, _ in schema_of(path) if (kind, name) not in keep]
    conn = sqlite3.connect(path, isolation_level=None)
    old = sqlite3.connect(reference)
    columns = {row[1] for row in old.execute("PRAGMA table_info(tasks)")}
    old.close()
    for (column,) in conn.execute("SELECT name FROM pragma_table_info('tasks')").fetchall():
        if column not in columns:  # added by a later migration (ALTER TABLE ADD COLUMN)
            conn.execute(f"ALTER TABLE tasks DROP COLUMN {column}")
    for kind, name in extra:  # (dropping a table drops its indexes too)
        assert kind in ("table", "index"), (kind, name)
        conn.execute(f"DROP {kind.upper()} IF EXISTS {name}")
        conn.execute("DELETE FROM sqlite_sequence WHERE name = ?", (name,))
    conn.execute("UPDATE taskmill_meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    conn.close()


async def test_a_version_1_database_migrates_to_the_current_schema_with_its_tasks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    reference = tmp_path / "v1.db"
    stepwise_database(reference, 1)
    path = tmp_path / "old.db"
    url = url_of(path)
    store = SQLiteStorage.from_url(url)
    await store.open()
    done, running, pending = await store.enqueue(
        [new_task("a", {"i": 0}), new_task("a", {"i": 1}), new_task("b", dedupe_key="k")]
    )
    (claimed,) = await store.claim_batch(claim("a", limit=1))
    assert claimed.id == done.id
    await store.finish_batch([finish(claimed, result={"ok": True})])
    (running,) = await store.claim_batch(claim("a", worker="w9"))
    before = [await store.get(t.id) for t in (done, running, pending)]
    log = [await store.attempts(t.id) for t in (done, running, pending)]
    await store.close()
    downgrade(path, reference, 1)
    assert schema_of(path) == schema_of(reference), "not a faithful version-1 database"

    # Opening it before migrating is refused, names the command, and writes nothing.
    snapshot = digest(path)
    with pytest.raises(SchemaVersionError) as excinfo:
        await SQLiteStorage.from_url(url).open()
    message = str(excinfo.value)
    assert f"taskmill migrate --url {url}" in message
    assert "version 1" in message and f"version {latest_version()}" in message
    assert digest(path) == snapshot

    # `taskmill migrate` brings it to the current version.
    assert await asyncio.to_thread(cli_main, ["--url", url, "migrate"]) == 0
    assert f"schema version {latest_version()}" in capsys.readouterr().out
    assert stored_version(path) == str(latest_version())
    fresh = tmp_path / "fresh.db"
    await make_store(fresh, 0)
    assert schema_of(path) == schema_of(fresh)

    store = SQLiteStorage.from_url(url)
    await store.open()
    try:
        assert [await store.get(t.id) for t in (done, running, pending)] == before
        assert [await store.attempts(t.id) for t in (done, running, pending)] == log
        # The control features work on the migrated data.
        assert await store.read_events(None) == ([], position_token(0))
        assert await store.suspensions() == []
        (stopped,) = await store.cancel(task_ids=[running.id], reason=CancelReason.USER)
        assert stopped.status is TaskStatus.CANCELLED
        (follower,) = await store.enqueue([new_task("b", dedupe_key="k")])
        assert follower.alias_of == pending.id
        events, _ = await store.read_events(position_token(0))
        assert [(e.task.id, e.kind) for e in events] == [
            (running.id, EventKind.CANCELLED),
            (follower.id, EventKind.ENQUEUED),
        ]
    finally:
        await store.close()


# -- files that are not ours ------------------------------------------------------------------


@pytest.fixture
def not_a_database(tmp_path: Path) -> Path:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    return path


async def test_a_file_that_is_not_a_database_is_left_untouched(not_a_database: Path):
    before = digest(not_a_database)
    listing = siblings(not_a_database)
    store = SQLiteStorage.from_url(url_of(not_a_database))
    with pytest.raises(StorageUnavailable, match="not a SQLite database"):
        await store.open()
    with pytest.raises(StorageUnavailable, match="not a SQLite database"):
        await store.open(auto_migrate=True)
    with pytest.raises(StorageUnavailable, match="not a SQLite database"):
        await store.migrate()
    assert digest(not_a_database) == before
    assert siblings(not_a_database) == listing  # no -wal, -shm or journal files either


async def test_a_damaged_file_with_a_sqlite_header_is_left_untouched(tmp_path: Path):
    path = tmp_path / "damaged.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    before = digest(path)
    with pytest.raises(StorageUnavailable, match=str(path)):
        await SQLiteStorage.from_url(url_of(path)).open()
    assert digest(path) == before


async def test_a_missing_directory_is_unavailable_and_not_created(tmp_path: Path):
    path = tmp_path / "missing" / "dir" / "tasks.db"
    store = SQLiteStorage.from_url(url_of(path))
    with pytest.raises(StorageUnavailable, match="does not exist"):
        await store.open()
    with pytest.raises(StorageUnavailable, match="does not exist"):
        await store.migrate()
    assert not (tmp_path / "missing").exists()


async def test_a_directory_in_place_of_the_file_is_unavailable(tmp_path: Path):
    (tmp_path / "tasks.db").mkdir()
    with pytest.raises(StorageUnavailable, match="not a regular file"):
        await SQLiteStorage.from_url(url_of(tmp_path / "tasks.db")).open()


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores permissions"
)
async def test_a_read_only_directory_is_unavailable(tmp_path: Path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(StorageUnavailable, match="not writable"):
            await SQLiteStorage.from_url(url_of(locked / "tasks.db")).open()
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


async def test_a_directory_reported_unwritable_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The same check as above, runnable as root: the permission test is os.access."""
    real_access = os.access

    def access(path: str | os.PathLike[str], mode: int, **kwargs: object) -> bool:
        if os.fspath(path) == str(tmp_path) and mode & os.W_OK:
            return False
        return real_access(path, mode)

    monkeypatch.setattr(os, "access", access)
    with pytest.raises(StorageUnavailable, match="not writable"):
        await SQLiteStorage.from_url(url_of(tmp_path / "tasks.db")).open()
    assert not (tmp_path / "tasks.db").exists()


async def test_an_empty_file_becomes_a_taskmill_database(tmp_path: Path):
    path = tmp_path / "empty.db"
    path.touch()
    assert await make_store(path, 1)
    assert stored_version(path) == str(latest_version())


# -- several processes ------------------------------------------------------------------------

_MIGRATOR = """
import asyncio, sys, time
from taskmill.backends.sqlite import SQLiteStorage

async def main():
    store = SQLiteStorage.from_url(sys.argv[1])
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    if sys.argv[2] == "migrate":
        print(await store.migrate())
    else:
        await store.open()
        await store.close()
        print("opened")

asyncio.run(main())
"""


def _race(url: str, actions: list[str]) -> list[str]:
    """Run ``actions`` in separate processes released at the same moment."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MIGRATOR, url, action],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for action in actions
    ]
    try:
        for proc in procs:  # all imported and waiting before any starts
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    return [out.strip() for out, _ in results]


@pytest.mark.slow
async def test_concurrent_migrations_of_one_fresh_file_both_succeed(tmp_path: Path):
    path = tmp_path / "race.db"
    outputs = _race(url_of(path), ["migrate", "migrate", "open", "open"])
    assert outputs == [str(latest_version())] * 2 + ["opened"] * 2
    assert stored_version(path) == str(latest_version())
    reference = tmp_path / "reference.db"
    await make_store(reference, 0)
    assert schema_of(path) == schema_of(reference)
    assert await read_back(path) == []
