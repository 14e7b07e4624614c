"""Versioned schema migrations of the MySQL backend.

Migrations are the files ``migrations/NNNN_name.sql`` shipped inside this package,
numbered from 0001 without gaps; the version in place is stored as ``schema_version``
in the database's own ``taskmill_meta`` table. Reading and applying them is
:class:`taskmill.migrations.MigrationRunner`'s; this module gives it the database
(:class:`MySQLTarget`) and the MySQL wording of its errors (:class:`MySQLMessages`).

DDL commits implicitly in MySQL, so a migration cannot be one transaction. Instead the
runner's lock is ``GET_LOCK`` keyed by the database (a session lock, released when the
migration ends or its connection drops), every statement of a file is idempotent, and a
version is recorded only after its whole file ran: a migration cut short is run again
from its start, and two processes migrating at once apply each file once.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any, Final

import aiomysql
import attrs
from taskmill.errors import SchemaVersionError, StorageUnavailable
from taskmill.migrations import (
    META_TABLE,
    VERSION_KEY,
    Migration,
    MigrationRunner,
    load_migrations,
    shown_tables,
)

from taskmill_mysql.options import quote_ident

__all__ = [
    "META_TABLE",
    "MySQLMessages",
    "MySQLTarget",
    "apply_pending",
    "check",
    "latest_version",
    "migrations",
    "schema_tables",
    "statements_of",
    "stored_version",
]

LOCK_TIMEOUT: Final = 60
"""Seconds a migration waits for another process's migration to finish."""
_COMMENT: Final = re.compile(r"^\s*--.*$", re.MULTILINE)


@cache
def migrations() -> tuple[Migration, ...]:
    """Every shipped migration, in version order."""
    return load_migrations("taskmill_mysql", owner="taskmill-mysql")


def latest_version() -> int:
    """The schema version this code expects (the number of the last migration)."""
    return migrations()[-1].version


def statements_of(migration: Migration, *, mariadb: bool) -> list[str]:
    """The statements of one migration file, comments removed, with the server's
    binary no-pad collation in place of ``@COLLATION@``."""
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    text = _COMMENT.sub("", migration.sql).replace("@COLLATION@", collation)
    return [s.strip() for s in text.split(";") if s.strip()]


async def schema_tables(conn: aiomysql.Connection, database: str) -> list[str]:
    """Names of the tables (and views) in ``database``, sorted; empty when it does not
    exist."""
    async with conn.cursor() as cursor:
        await cursor.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (database,),
        )
        rows = await cursor.fetchall()
    return sorted(str(r[0]) for r in rows)


@attrs.frozen
class MySQLMessages:
    """The schema errors of ``database`` on the server ``where`` (never a password)."""

    where: str
    database: str

    def foreign(self, tables: list[str]) -> StorageUnavailable:
        """A database that holds someone else's tables."""
        return StorageUnavailable(
            f"the database {self.database} of {self.where} holds tables "
            f"({shown_tables(tables)}) but no {META_TABLE} table: it is not a taskmill "
            "database, and taskmill will not modify it. Choose another database in the URL"
        )

    def newer(self, stored: int, expected: int) -> SchemaVersionError:
        """A schema written by a newer taskmill-mysql."""
        return SchemaVersionError(
            f"the database {self.database} of {self.where} has taskmill schema version "
            f"{stored}, newer than the version {expected} this taskmill-mysql understands; "
            "upgrade it (pip install --upgrade taskmill-mysql) to use it"
        )

    def older(self, url: str, stored: int, expected: int) -> SchemaVersionError:
        """A schema that needs migrating; names the command (``url`` has its password
        replaced by ``***``)."""
        hint = " (with the password in place of ***)" if ":***@" in url else ""
        return SchemaVersionError(
            f"the database {self.database} of {self.where} has taskmill schema version "
            f"{stored} but this taskmill-mysql expects version {expected}; migrate it with: "
            f"taskmill migrate --url {url}{hint}"
        )

    def damaged(self, value: Any) -> SchemaVersionError:
        """A stored version that is not a number."""
        return SchemaVersionError(
            f"the taskmill schema version stored in database {self.database} is not a "
            f"number ({value!r}); the database is damaged"
        )


@attrs.frozen
class MySQLTarget:
    """``database`` through ``conn`` for the migration runner."""

    conn: aiomysql.Connection
    database: str
    mariadb: bool

    async def lock(self) -> None:
        """``GET_LOCK`` keyed by the database, held until :meth:`unlock`."""
        async with self.conn.cursor() as cursor:
            await cursor.execute("SELECT GET_LOCK(%s, %s)", (self.lock_name, LOCK_TIMEOUT))
            (got,) = await cursor.fetchone()
        if got != 1:
            raise StorageUnavailable(
                f"another process has been migrating the database {self.database} for "
                f"{LOCK_TIMEOUT} s (GET_LOCK {self.lock_name!r}); try again once it is done"
            )

    @property
    def lock_name(self) -> str:
        return f"taskmill.migrate.{self.database}"[:64]

    async def unlock(self) -> None:
        async with self.conn.cursor() as cursor:
            await cursor.execute("SELECT RELEASE_LOCK(%s)", (self.lock_name,))

    async def tables(self) -> list[str]:
        """The database's tables (none when it does not exist)."""
        return await schema_tables(self.conn, self.database)

    async def read_version(self) -> Any:
        """The stored schema version's text, or None."""
        async with self.conn.cursor() as cursor:
            await cursor.execute(
                f"SELECT `value` FROM {quote_ident(self.database)}.{META_TABLE} WHERE `key` = %s",
                (VERSION_KEY,),
            )
            row = await cursor.fetchone()
        return None if row is None else row[0]

    async def prepare(self) -> None:
        """Create the database when missing and make it the connection's default."""
        quoted = quote_ident(self.database)
        async with self.conn.cursor() as cursor:
            await cursor.execute(f"CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4")
            await cursor.execute(f"USE {quoted}")

    async def apply(self, migration: Migration) -> None:
        """Run one file, statement by statement (each idempotent; an ``ALTER TABLE t
        ADD COLUMN c`` whose column exists is skipped, MySQL 8 having no ``IF NOT
        EXISTS`` for it)."""
        async with self.conn.cursor() as cursor:
            for statement in statements_of(migration, mariadb=self.mariadb):
                added = _ADD_COLUMN.match(statement)
                if added is not None:
                    await cursor.execute(
                        "SELECT 1 FROM information_schema.columns WHERE table_schema = %s "
                        "AND table_name = %s AND column_name = %s",
                        (self.database, added["table"], added["column"]),
                    )
                    if await cursor.fetchone() is not None:
                        continue
                await cursor.execute(statement)

    async def record(self, version: int) -> None:
        """Store ``version`` in the database's meta table."""
        async with self.conn.cursor() as cursor:
            await cursor.execute(
                f"INSERT INTO {quote_ident(self.database)}.{META_TABLE} (`key`, `value`) "
                "VALUES (%s, %s) ON DUPLICATE KEY UPDATE `value` = VALUES(`value`)",
                (VERSION_KEY, str(version)),
            )


_ADD_COLUMN: Final = re.compile(
    r"ALTER\s+TABLE\s+(?P<table>\w+)\s+ADD\s+COLUMN\s+(?P<column>\w+)", re.IGNORECASE
)


def runner(where: str, database: str) -> MigrationRunner:
    """The migration runner of ``database`` on ``where``."""
    return MigrationRunner(migrations(), MySQLMessages(where, database))


async def stored_version(
    conn: aiomysql.Connection, database: str, where: str = "the server", *, mariadb: bool = True
) -> int | None:
    """The schema version recorded in ``database``: 0 for a missing or empty one, None
    for someone else's.

    :raises SchemaVersionError: ``taskmill_meta`` exists but holds no usable version.
    """
    return await runner(where, database).stored_version(MySQLTarget(conn, database, mariadb))


async def check(
    conn: aiomysql.Connection,
    database: str,
    where: str,
    url: str,
    *,
    auto_migrate: bool,
    mariadb: bool,
) -> int:
    """The stored version, as opening a store may accept it (see
    :meth:`MigrationRunner.check`; ``url`` with its password redacted)."""
    target = MySQLTarget(conn, database, mariadb)
    return await runner(where, database).check(target, url=url, auto_migrate=auto_migrate)


async def apply_pending(
    conn: aiomysql.Connection,
    database: str,
    where: str,
    *,
    mariadb: bool,
    up_to: int | None = None,
) -> int:
    """Apply every migration newer than the stored version (up to ``up_to``, default
    all) under ``GET_LOCK`` keyed by the database, creating the database when missing.

    :returns: the schema version now in place.
    :raises SchemaVersionError: the stored version is newer than this code.
    :raises StorageUnavailable: the database holds someone else's tables.
    """
    target = MySQLTarget(conn, database, mariadb)
    try:
        return await runner(where, database).apply_pending(target, up_to=up_to)
    finally:
        await target.unlock()
