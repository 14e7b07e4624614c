"""Versioned schema migrations of the SQLite backend.

Migrations are the files ``migrations/NNNN_name.sql`` shipped inside this package,
numbered from 0001 without gaps. Version N of the schema is what applying files 1..N in
order produces; the version in place is stored as ``schema_version`` in the
``taskmill_meta`` table.

Every function here is synchronous and takes an open :class:`sqlite3.Connection` in
autocommit mode (``isolation_level=None``); the storage calls them on its database
thread.
"""

from __future__ import annotations

import sqlite3
from functools import cache

from taskmill.errors import SchemaVersionError, StorageUnavailable
from taskmill.migrations import Migration, load_migrations

META_TABLE = "taskmill_meta"
VERSION_KEY = "schema_version"


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


def stored_version(conn: sqlite3.Connection, path: str) -> int | None:
    """The schema version recorded in the database.

    :returns: the version; 0 for an empty database (no tables at all); None when the
        database holds tables but no taskmill schema (a foreign database).
    :raises SchemaVersionError: ``taskmill_meta`` exists but holds no usable version.
    """
    tables = user_tables(conn)
    if not tables:
        return 0
    if META_TABLE not in tables:
        return None
    row = conn.execute(f"SELECT value FROM {META_TABLE} WHERE key = ?", (VERSION_KEY,)).fetchone()
    if row is None:
        return 0
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise SchemaVersionError(
            f"the taskmill schema version stored in {path} is not a number ({row[0]!r}); "
            "the database is damaged"
        ) from None


def foreign_database_error(path: str, tables: list[str]) -> StorageUnavailable:
    """The error for a SQLite file that holds someone else's tables."""
    shown = ", ".join(tables[:8]) + (", ..." if len(tables) > 8 else "")
    return StorageUnavailable(
        f"{path} is a SQLite database but not a taskmill one (it has the tables {shown} "
        f"and no {META_TABLE} table); taskmill will not modify it. Point the URL at a new "
        "file, e.g. sqlite:///taskmill.db"
    )


def newer_version_error(path: str, stored: int, expected: int) -> SchemaVersionError:
    """The error for a database written by a newer taskmill."""
    return SchemaVersionError(
        f"the database {path} has taskmill schema version {stored}, newer than the "
        f"version {expected} this taskmill understands; upgrade taskmill "
        "(pip install --upgrade taskmill) to use it"
    )


def older_version_error(path: str, url: str, stored: int, expected: int) -> SchemaVersionError:
    """The error for a database that needs migrating."""
    return SchemaVersionError(
        f"the database {path} has taskmill schema version {stored} but this taskmill "
        f"expects version {expected}; migrate it with: taskmill migrate --url {url}"
    )


def apply_pending(conn: sqlite3.Connection, path: str) -> int:
    """Apply every migration newer than the stored version, in one transaction.

    Takes the write lock up front (``BEGIN IMMEDIATE``) and reads the version inside
    the transaction, so two processes migrating at once apply each file once: the
    second waits for the first and then finds nothing to do.

    :returns: the schema version now in place.
    :raises SchemaVersionError: the stored version is newer than this code.
    :raises StorageUnavailable: the database is not a taskmill database.
    """
    expected = latest_version()
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = stored_version(conn, path)
        if version is None:
            raise foreign_database_error(path, user_tables(conn))
        if version > expected:
            raise newer_version_error(path, version, expected)
        for migration in migrations()[version:]:
            for statement in statements(migration):
                conn.execute(statement)
            conn.execute(
                f"INSERT INTO {META_TABLE} (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (VERSION_KEY, str(migration.version)),
            )
            version = migration.version
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return version
