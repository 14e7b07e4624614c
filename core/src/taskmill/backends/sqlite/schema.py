"""Versioned schema migrations of the SQLite backend.

Migrations are the files ``migrations/NNNN_name.sql`` shipped inside this package,
numbered from 0001 without gaps. Version N of the schema is what applying files 1..N in
order produces; the version in place is stored as ``schema_version`` in the
``taskmill_meta`` table.

Reading and applying them is :class:`taskmill.migrations.MigrationRunner`'s; this module
gives it the SQLite database (:class:`SQLiteTarget`: ``BEGIN IMMEDIATE`` is the
migration lock) and the SQLite wording of its errors (:class:`SQLiteMessages`). Every
function here is synchronous and takes an open :class:`sqlite3.Connection` in autocommit
mode (``isolation_level=None``); the storage calls them on its database thread.
"""

from __future__ import annotations

import re
import sqlite3
from functools import cache
from typing import Any, Final

import attrs

from taskmill.errors import SchemaVersionError, StorageUnavailable
from taskmill.migrations import (
    META_TABLE,
    VERSION_KEY,
    Migration,
    MigrationRunner,
    load_migrations,
    run_sync,
    shown_tables,
)

__all__ = [
    "META_TABLE",
    "SQLiteMessages",
    "SQLiteTarget",
    "apply_pending",
    "check",
    "latest_version",
    "migrations",
    "split_statements",
    "statements",
    "stored_version",
    "user_tables",
]


def migrations() -> tuple[Migration, ...]:
    """Every shipped migration, in version order."""
    return _migrations()


@cache
def _migrations() -> tuple[Migration, ...]:
    return load_migrations("taskmill.backends.sqlite", owner="taskmill's SQLite")


def statements(migration: Migration) -> list[str]:
    """A migration's SQL statements, in order (comments and blank text dropped)."""
    return split_statements(migration.sql)


def latest_version() -> int:
    """The schema version this code expects (the number of the last migration)."""
    return migrations()[-1].version


def split_statements(script: str) -> list[str]:
    """Split an SQL script into complete statements.

    Uses :func:`sqlite3.complete_statement`, so semicolons inside string literals,
    comments and trigger bodies do not split a statement.
    """
    statements: list[str] = []
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            text = _strip_comments(pending)
            if text.strip(" \t\r\n;"):
                statements.append(pending.strip())
            pending = ""
    if _strip_comments(pending).strip(" \t\r\n;"):
        raise ValueError(f"incomplete SQL statement at the end of the script: {pending!r}")
    return statements


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def user_tables(conn: sqlite3.Connection) -> list[str]:
    """Names of the tables in the database, SQLite's internal ones excluded."""
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "ORDER BY name"
    ).fetchall()
    return [str(row[0]) for row in rows]


@attrs.frozen
class SQLiteMessages:
    """The schema errors of the database file ``path``."""

    path: str

    def foreign(self, tables: list[str]) -> StorageUnavailable:
        """A SQLite file that holds someone else's tables."""
        return StorageUnavailable(
            f"{self.path} is a SQLite database but not a taskmill one (it has the tables "
            f"{shown_tables(tables)} and no {META_TABLE} table); taskmill will not modify it. "
            "Point the URL at a new file, e.g. sqlite:///taskmill.db"
        )

    def newer(self, stored: int, expected: int) -> SchemaVersionError:
        """A database written by a newer taskmill."""
        return SchemaVersionError(
            f"the database {self.path} has taskmill schema version {stored}, newer than the "
            f"version {expected} this taskmill understands; upgrade taskmill "
            "(pip install --upgrade taskmill) to use it"
        )

    def older(self, url: str, stored: int, expected: int) -> SchemaVersionError:
        """A database that needs migrating."""
        return SchemaVersionError(
            f"the database {self.path} has taskmill schema version {stored} but this "
            f"taskmill expects version {expected}; migrate it with: taskmill migrate --url {url}"
        )

    def damaged(self, value: Any) -> SchemaVersionError:
        """A stored version that is not a number."""
        return SchemaVersionError(
            f"the taskmill schema version stored in {self.path} is not a number ({value!r}); "
            "the database is damaged"
        )


@attrs.frozen
class SQLiteTarget:
    """The database behind ``conn`` for the migration runner. Its lock is the
    transaction itself: the caller has opened it with ``BEGIN IMMEDIATE``, which holds
    SQLite's writer lock to the commit."""

    conn: sqlite3.Connection

    async def lock(self) -> None:
        """Nothing more to take: ``BEGIN IMMEDIATE`` holds the writer lock."""

    async def tables(self) -> list[str]:
        """The database's tables."""
        return user_tables(self.conn)

    async def read_version(self) -> Any:
        """The stored schema version's text, or None."""
        row = self.conn.execute(
            f"SELECT value FROM {META_TABLE} WHERE key = ?", (VERSION_KEY,)
        ).fetchone()
        return None if row is None else row[0]

    async def prepare(self) -> None:
        """Nothing to prepare: a SQLite file is its own schema."""

    async def apply(self, migration: Migration) -> None:
        """Run the file's statements in order.

        SQLite has no ``ADD COLUMN IF NOT EXISTS``: an ``ALTER TABLE t ADD COLUMN c``
        whose column ``t`` already has is skipped, so that a file re-run on a database
        whose recorded version was lost stays harmless, as the ``IF NOT EXISTS``
        clauses make the rest of it."""
        for statement in statements(migration):
            added = _ADD_COLUMN.match(statement)
            if added is not None and added["column"] in _columns(self.conn, added["table"]):
                continue
            self.conn.execute(statement)

    async def record(self, version: int) -> None:
        """Store ``version`` in the meta table."""
        self.conn.execute(
            f"INSERT INTO {META_TABLE} (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (VERSION_KEY, str(version)),
        )


_ADD_COLUMN: Final = re.compile(
    r"(?:\s*--[^\n]*\n)*\s*ALTER\s+TABLE\s+(?P<table>\w+)\s+ADD\s+COLUMN\s+(?P<column>\w+)",
    re.IGNORECASE,
)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM pragma_table_info(?)", (table,))}


def runner(path: str) -> MigrationRunner:
    """The migration runner of the database file ``path``."""
    return MigrationRunner(migrations(), SQLiteMessages(path))


def stored_version(conn: sqlite3.Connection, path: str) -> int | None:
    """The schema version recorded in the database.

    :returns: the version; 0 for an empty database (no tables at all); None when the
        database holds tables but no taskmill schema (a foreign database).
    :raises SchemaVersionError: ``taskmill_meta`` exists but holds no usable version.
    """
    return run_sync(runner(path).stored_version(SQLiteTarget(conn)))


def check(conn: sqlite3.Connection, path: str, url: str, *, auto_migrate: bool) -> int:
    """The stored version, as opening a store may accept it (see
    :meth:`MigrationRunner.check`)."""
    return run_sync(runner(path).check(SQLiteTarget(conn), url=url, auto_migrate=auto_migrate))


def apply_pending(conn: sqlite3.Connection, path: str) -> int:
    """Apply every migration newer than the stored version, in one transaction.

    Takes the write lock up front (``BEGIN IMMEDIATE``) and reads the version inside
    the transaction, so two processes migrating at once apply each file once: the
    second waits for the first and then finds nothing to do.

    :returns: the schema version now in place.
    :raises SchemaVersionError: the stored version is newer than this code.
    :raises StorageUnavailable: the database is not a taskmill database.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = run_sync(runner(path).apply_pending(SQLiteTarget(conn)))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return version
