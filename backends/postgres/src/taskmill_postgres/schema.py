"""Versioned schema migrations of the PostgreSQL backend.

Migrations are the files ``migrations/NNNN_name.sql`` shipped inside this package,
numbered from 0001 without gaps. Version N of the schema is what applying files 1..N in
order produces; the version in place is stored as ``schema_version`` in the schema's
own ``taskmill_meta`` table, so every schema of a database has its own version.

The files use unqualified names: they run with ``search_path`` set to the taskmill
schema alone. Every function here takes an open asyncpg connection.
"""

from __future__ import annotations

from functools import cache
from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from taskmill.errors import SchemaVersionError, StorageUnavailable
from taskmill.migrations import Migration, load_migrations

from taskmill_postgres.options import lock_key, quote_ident

Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
"""A connection of its own or one borrowed from the pool."""

META_TABLE = "taskmill_meta"
VERSION_KEY = "schema_version"


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


async def stored_version(conn: Conn, schema: str) -> int | None:
    """The schema version recorded in ``schema``.

    :returns: the version; 0 for a missing or empty schema; None when the schema holds
        tables but no taskmill schema (someone else's).
    :raises SchemaVersionError: ``taskmill_meta`` exists but holds no usable version.
    """
    tables = await schema_tables(conn, schema)
    if not tables:
        return 0
    if META_TABLE not in tables:
        return None
    value = await conn.fetchval(
        f"SELECT value FROM {quote_ident(schema)}.{META_TABLE} WHERE key = $1", VERSION_KEY
    )
    if value is None:
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SchemaVersionError(
            f"the taskmill schema version stored in schema {schema} is not a number "
            f"({value!r}); the schema is damaged"
        ) from None


def foreign_schema_error(where: str, schema: str, tables: list[str]) -> StorageUnavailable:
    """The error for a schema that holds someone else's tables."""
    shown = ", ".join(tables[:8]) + (", ..." if len(tables) > 8 else "")
    return StorageUnavailable(
        f"the schema {schema} of {where} holds tables ({shown}) but no {META_TABLE} table: "
        "it is not a taskmill schema, and taskmill will not modify it. Choose another "
        "schema with ?schema=NAME"
    )


def newer_version_error(where: str, schema: str, stored: int, expected: int) -> SchemaVersionError:
    """The error for a schema written by a newer taskmill-postgres."""
    return SchemaVersionError(
        f"the schema {schema} of {where} has taskmill schema version {stored}, newer than "
        f"the version {expected} this taskmill-postgres understands; upgrade it "
        "(pip install --upgrade taskmill-postgres) to use it"
    )


def older_version_error(
    where: str, schema: str, url: str, stored: int, expected: int
) -> SchemaVersionError:
    """The error for a schema that needs migrating; names the command (``url`` is
    shown as given: pass it with its password replaced by ``***``)."""
    hint = " (with the password in place of ***)" if ":***@" in url else ""
    return SchemaVersionError(
        f"the schema {schema} of {where} has taskmill schema version {stored} but this "
        f"taskmill-postgres expects version {expected}; migrate it with: "
        f"taskmill migrate --url {url}{hint}"
    )


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
    expected = latest_version() if up_to is None else up_to
    quoted = quote_ident(schema)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key("migrate", schema))
        version = await stored_version(conn, schema)
        if version is None:
            raise foreign_schema_error(where, schema, await schema_tables(conn, schema))
        if version > latest_version():
            raise newer_version_error(where, schema, version, latest_version())
        pending = migrations()[version:expected]
        if not pending:
            return version
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        await conn.execute(f"SET LOCAL search_path TO {quoted}")
        for migration in pending:
            await conn.execute(migration.sql)
            await conn.execute(
                f"INSERT INTO {quoted}.{META_TABLE} (key, value) VALUES ($1, $2) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                VERSION_KEY,
                str(migration.version),
            )
            version = migration.version
    return version
