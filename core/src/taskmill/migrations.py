"""Versioned SQL migrations, for backends that keep a schema: the files and the runner.

A backend ships ``NNNN_name.sql`` files in a ``migrations`` folder of its package,
numbered from 0001 without gaps; version N of its schema is what applying files 1..N in
order produces (:func:`load_migrations`). The version in place is stored as
``schema_version`` in the backend's ``taskmill_meta`` table.

:class:`MigrationRunner` is the one algorithm every SQL backend uses: inside one
transaction, take the backend's migration lock, read the stored version, refuse a
foreign or newer schema, apply each pending file and record its version. The backend
supplies what only it knows as a :class:`MigrationTarget` (its lock primitive, how it
lists tables, runs a file and records a version) and its wording as
:class:`SchemaMessages`. The runner is async; a synchronous backend (SQLite, on its own
thread) drives it with :func:`run_sync`.
"""

from __future__ import annotations

import re
from collections.abc import Coroutine, Sequence
from importlib.resources import files
from typing import Any, Final, Protocol, TypeVar

import attrs

from taskmill.errors import SchemaVersionError, StorageUnavailable

T = TypeVar("T")

META_TABLE: Final = "taskmill_meta"
"""The table (key, value) where a SQL backend records its schema version."""
VERSION_KEY: Final = "schema_version"

_FILE_NAME = re.compile(r"^(\d{4})_([A-Za-z0-9_]+)\.sql$")


@attrs.frozen
class Migration:
    """One migration file: the schema ``version`` it produces and its SQL text."""

    version: int
    name: str
    sql: str


def load_migrations(package: str, *, owner: str) -> tuple[Migration, ...]:
    """The migration files in ``package``'s ``migrations`` folder, in version order.

    :param owner: who ships them, named in the error (e.g. "taskmill-postgres").
    :raises RuntimeError: the files are not numbered 1..N without gaps (a packaging
        error, not a user error).
    """
    folder = files(package) / "migrations"
    found = [
        Migration(
            version=int(match.group(1)),
            name=entry.name,
            sql=entry.read_text(encoding="utf-8"),
        )
        for entry in folder.iterdir()
        if (match := _FILE_NAME.match(entry.name)) is not None
    ]
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(
            f"{owner} migrations must be numbered 0001, 0002, ... without gaps; "
            f"found {[m.name for m in found]}"
        )
    return tuple(found)


class MigrationTarget(Protocol):
    """One backend's database as the runner sees it, inside the transaction the backend
    opened around :meth:`MigrationRunner.apply_pending`."""

    async def lock(self) -> None:
        """Take the migration lock (held to the end of the transaction), so that two
        processes migrating at once apply each file once."""

    async def tables(self) -> list[str]:
        """The names of the tables where taskmill's would be, sorted."""

    async def read_version(self) -> Any:
        """The stored ``schema_version`` value of :data:`META_TABLE` (None when absent);
        only called when :meth:`tables` lists that table."""

    async def prepare(self) -> None:
        """Ready the database for the first pending file (create the schema, set a
        search path); called only when there is something to apply."""

    async def apply(self, migration: Migration) -> None:
        """Run one migration file."""

    async def record(self, version: int) -> None:
        """Record ``version`` as the schema version in :data:`META_TABLE`."""


class SchemaMessages(Protocol):
    """The errors a backend gives about its schema, in its own words."""

    def foreign(self, tables: list[str]) -> StorageUnavailable:
        """Tables are there but no :data:`META_TABLE`: someone else's database."""

    def newer(self, stored: int, expected: int) -> SchemaVersionError:
        """The schema was written by newer code."""

    def older(self, url: str, stored: int, expected: int) -> SchemaVersionError:
        """The schema needs migrating (the message names the command, with ``url``)."""

    def damaged(self, value: Any) -> SchemaVersionError:
        """The stored version is not a number."""


def shown_tables(tables: Sequence[str]) -> str:
    """The first few of ``tables``, for a message."""
    return ", ".join(tables[:8]) + (", ..." if len(tables) > 8 else "")


@attrs.frozen
class MigrationRunner:
    """Reads and advances one backend's schema version (see the module docstring)."""

    migrations: tuple[Migration, ...]
    messages: SchemaMessages

    @property
    def latest(self) -> int:
        """The schema version this code expects (the number of the last migration)."""
        return self.migrations[-1].version

    async def stored_version(self, target: MigrationTarget) -> int | None:
        """The schema version recorded in ``target``.

        :returns: the version; 0 for an empty database (no tables); None when it holds
            tables but no :data:`META_TABLE` (someone else's).
        :raises SchemaVersionError: the stored version is not a number.
        """
        tables = await target.tables()
        if not tables:
            return 0
        if META_TABLE not in tables:
            return None
        value = await target.read_version()
        if value is None:
            return 0
        try:
            return int(value)
        except (TypeError, ValueError):
            raise self.messages.damaged(value) from None

    async def check(self, target: MigrationTarget, *, url: str, auto_migrate: bool) -> int:
        """What opening a store finds: the stored version, which may be older than
        :attr:`latest` only for an empty database or with ``auto_migrate``.

        :param url: shown in the migrate command (with any password redacted).
        :raises StorageUnavailable: someone else's database.
        :raises SchemaVersionError: a newer schema; an older one without ``auto_migrate``.
        """
        tables = await target.tables()
        version = await self.stored_version(target)
        if version is None:
            raise self.messages.foreign(tables)
        if version > self.latest:
            raise self.messages.newer(version, self.latest)
        if version < self.latest and tables and not auto_migrate:
            raise self.messages.older(url, version, self.latest)
        return version

    async def apply_pending(self, target: MigrationTarget, *, up_to: int | None = None) -> int:
        """Take the lock, then apply every migration newer than the stored version (up
        to ``up_to``, default all), recording each version; the caller runs this inside
        one transaction.

        :returns: the schema version now in place.
        :raises SchemaVersionError: the stored version is newer than this code.
        :raises StorageUnavailable: someone else's database.
        """
        await target.lock()
        version = await self.stored_version(target)
        if version is None:
            raise self.messages.foreign(await target.tables())
        if version > self.latest:
            raise self.messages.newer(version, self.latest)
        pending = self.migrations[version : self.latest if up_to is None else up_to]
        if not pending:
            return version
        await target.prepare()
        for migration in pending:
            await target.apply(migration)
            await target.record(migration.version)
            version = migration.version
        return version


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of ``coroutine``, which must never suspend (a runner over a
    synchronous target): it is run to its end in one step, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("run_sync: the coroutine suspended; its target must be synchronous")
