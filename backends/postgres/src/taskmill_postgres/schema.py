"""Versioned schema migrations of the PostgreSQL backend.

Migrations are the files ``migrations/NNNN_name.sql`` shipped inside this package,
numbered from 0001 without gaps. Version N of the schema is what applying files 1..N in
order produces; the version in place is stored as ``schema_version`` in the schema's
own ``taskmill_meta`` table, so every schema of a database has its own version.

The files use unqualified names: they run with ``search_path`` set to the taskmill
schema alone. Reading and applying them is :class:`taskmill.migrations.MigrationRunner`'s;
this module gives it the schema (:class:`PostgresTarget`, whose lock is
``pg_advisory_xact_lock`` keyed by the schema) and the PostgreSQL wording of its errors
(:class:`PostgresMessages`). Every function here takes an open asyncpg connection.
"""

from __future__ import annotations

from functools import cache
from typing import Any, TypeAlias

import asyncpg
import attrs
from asyncpg.pool import PoolConnectionProxy
from taskmill.errors import SchemaVersionError, StorageUnavailable
from taskmill.migrations import (
    META_TABLE,
    VERSION_KEY,
    Migration,
    MigrationRunner,
    load_migrations,
    shown_tables,
)

from taskmill_postgres.options import lock_key, quote_ident

Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
"""A connection of its own or one borrowed from the pool."""

__all__ = [
    "META_TABLE",
    "PostgresMessages",
    "PostgresTarget",
    "apply_pending",
    "check",
    "latest_version",
    "migrations",
    "schema_tables",
    "stored_version",
]


@cache
def migrations() -> tuple[Migration, ...]:
    """Every shipped migration, in version order."""
    return load_migrations("taskmill_postgres", owner="taskmill-postgres")


def latest_version() -> int:
    """The schema version this code expects (the number of the last migration)."""
    return migrations()[-1].version


async def schema_tables(conn: Conn, schema: str) -> list[str]:
    """Names of the tables (and views) in ``schema``, sorted; empty when the schema
    does not exist."""
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY 1",
        schema,
    )
    return [str(r[0]) for r in rows]


@attrs.frozen
class PostgresMessages:
    """The schema errors of ``schema`` on the server ``where`` (never a password)."""

    where: str
    schema: str

    def foreign(self, tables: list[str]) -> StorageUnavailable:
        """A schema that holds someone else's tables."""
        return StorageUnavailable(
            f"the schema {self.schema} of {self.where} holds tables ({shown_tables(tables)}) "
            f"but no {META_TABLE} table: it is not a taskmill schema, and taskmill will not "
            "modify it. Choose another schema with ?schema=NAME"
        )

    def newer(self, stored: int, expected: int) -> SchemaVersionError:
        """A schema written by a newer taskmill-postgres."""
        return SchemaVersionError(
            f"the schema {self.schema} of {self.where} has taskmill schema version {stored}, "
            f"newer than the version {expected} this taskmill-postgres understands; upgrade "
            "it (pip install --upgrade taskmill-postgres) to use it"
        )

    def older(self, url: str, stored: int, expected: int) -> SchemaVersionError:
        """A schema that needs migrating; names the command (``url`` is shown as given:
        pass it with its password replaced by ``***``)."""
        hint = " (with the password in place of ***)" if ":***@" in url else ""
        return SchemaVersionError(
            f"the schema {self.schema} of {self.where} has taskmill schema version {stored} "
            f"but this taskmill-postgres expects version {expected}; migrate it with: "
            f"taskmill migrate --url {url}{hint}"
        )

    def damaged(self, value: Any) -> SchemaVersionError:
        """A stored version that is not a number."""
        return SchemaVersionError(
            f"the taskmill schema version stored in schema {self.schema} is not a number "
            f"({value!r}); the schema is damaged"
        )


@attrs.frozen
class PostgresTarget:
    """``schema`` through ``conn`` for the migration runner."""

    conn: Conn
    schema: str

    async def lock(self) -> None:
        """``pg_advisory_xact_lock`` keyed by the schema, held to the commit."""
        await self.conn.execute(
            "SELECT pg_advisory_xact_lock($1)", lock_key("migrate", self.schema)
        )

    async def tables(self) -> list[str]:
        """The schema's tables (none when it does not exist)."""
        return await schema_tables(self.conn, self.schema)

    async def read_version(self) -> Any:
        """The stored schema version's text, or None."""
        return await self.conn.fetchval(
            f"SELECT value FROM {quote_ident(self.schema)}.{META_TABLE} WHERE key = $1",
            VERSION_KEY,
        )

    async def prepare(self) -> None:
        """Create the schema when missing and make it the transaction's search path."""
        quoted = quote_ident(self.schema)
        await self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        await self.conn.execute(f"SET LOCAL search_path TO {quoted}")

    async def apply(self, migration: Migration) -> None:
        """Run one file (unqualified names resolve in the schema)."""
        await self.conn.execute(migration.sql)

    async def record(self, version: int) -> None:
        """Store ``version`` in the schema's meta table."""
        await self.conn.execute(
            f"INSERT INTO {quote_ident(self.schema)}.{META_TABLE} (key, value) VALUES ($1, $2) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            VERSION_KEY,
            str(version),
        )


def runner(where: str, schema: str) -> MigrationRunner:
    """The migration runner of ``schema`` on ``where``."""
    return MigrationRunner(migrations(), PostgresMessages(where, schema))


async def stored_version(conn: Conn, schema: str, where: str = "the server") -> int | None:
    """The schema version recorded in ``schema``.

    :returns: the version; 0 for a missing or empty schema; None when the schema holds
        tables but no taskmill schema (someone else's).
    :raises SchemaVersionError: ``taskmill_meta`` exists but holds no usable version.
    """
    return await runner(where, schema).stored_version(PostgresTarget(conn, schema))


async def check(conn: Conn, schema: str, where: str, url: str, *, auto_migrate: bool) -> int:
    """The stored version, as opening a store may accept it (see
    :meth:`MigrationRunner.check`; ``url`` with its password redacted)."""
    target = PostgresTarget(conn, schema)
    return await runner(where, schema).check(target, url=url, auto_migrate=auto_migrate)


async def apply_pending(conn: Conn, schema: str, where: str, *, up_to: int | None = None) -> int:
    """Apply every migration newer than the stored version (up to ``up_to``, default
    all) in one transaction, creating the schema when it does not exist.

    Takes ``pg_advisory_xact_lock`` keyed by the schema before reading the version, so
    two processes migrating at once apply each file once: the second waits for the
    first's commit and then finds nothing to do.

    :returns: the schema version now in place.
    :raises SchemaVersionError: the stored version is newer than this code.
    :raises StorageUnavailable: the schema holds someone else's tables.
    """
    async with conn.transaction():
        return await runner(where, schema).apply_pending(PostgresTarget(conn, schema), up_to=up_to)
