"""Contract: versioned schemas and migrations.

Every store: ``migrate()`` is idempotent, reports the version in place and keeps what is
stored. A backend with versioned SQL migrations also provides a ``schema_migrations``
fixture (a :class:`SchemaMigrations`), and the suite proves that its migrations are
numbered from one without gaps and that a schema created fresh equals one built by
applying every migration in order, one release at a time, as a database upgraded over
the years was.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Literal, TypeAlias

import pytest

from taskmill.storage import TaskStorage
from taskmill.testing.helpers import new_task

__all__ = ["MigrationContract", "Place", "SchemaMigrations"]

Place: TypeAlias = Literal["fresh", "stepwise"]
"""One of the two empty places (files, schemas, databases) a :class:`SchemaMigrations`
builds a schema in."""


class SchemaMigrations(abc.ABC):
    """A SQL backend's versioned schema, as the migration tests inspect it.

    It owns two empty places on the test database, "fresh" and "stepwise", and removes
    them when the test ends (the fixture that returns it arranges that).
    """

    @abc.abstractmethod
    def versions(self) -> Sequence[int]:
        """The version of every migration the backend ships, in the order applied."""

    @abc.abstractmethod
    async def create_fresh(self) -> None:
        """Create the current schema in "fresh" the way :meth:`TaskStorage.open` does
        on an empty database."""

    @abc.abstractmethod
    async def apply_one(self, version: int) -> None:
        """Apply migration ``version`` alone to "stepwise" and record that version
        there, as an upgrade by one release does."""

    @abc.abstractmethod
    async def stored_version(self, place: Place) -> int | None:
        """The schema version recorded in ``place`` (None when none is)."""

    @abc.abstractmethod
    async def describe(self, place: Place) -> object:
        """Everything the catalog says about the schema in ``place`` (tables, columns,
        types, defaults, indexes, constraints, triggers, functions), with the place's
        own name replaced, as a value that compares with ``==``."""


def _harness(schema_migrations: SchemaMigrations | None, storage: TaskStorage) -> SchemaMigrations:
    if schema_migrations is None:
        pytest.skip(
            f"{type(storage).__name__} has no versioned migrations to check "
            "(its contract class provides no `schema_migrations` fixture)"
        )
    return schema_migrations


class MigrationContract:
    """What ``migrate()`` guarantees, and the migrations of a SQL backend."""

    async def test_migrate_is_idempotent_and_keeps_what_is_stored(
        self, storage: TaskStorage
    ) -> None:
        (task,) = await storage.enqueue([new_task()])
        version = await storage.migrate()
        assert version >= 1
        assert await storage.migrate() == version
        assert await storage.get(task.id) == task

    async def test_migrations_are_numbered_from_one_without_gaps(
        self, storage: TaskStorage, schema_migrations: SchemaMigrations | None
    ) -> None:
        harness = _harness(schema_migrations, storage)
        versions = list(harness.versions())
        assert versions == list(range(1, len(versions) + 1))
        assert await storage.migrate() == versions[-1]

    async def test_a_fresh_schema_equals_all_migrations_applied_in_order(
        self, storage: TaskStorage, schema_migrations: SchemaMigrations | None
    ) -> None:
        harness = _harness(schema_migrations, storage)
        await harness.create_fresh()
        for version in harness.versions():
            await harness.apply_one(version)
            assert await harness.stored_version("stepwise") == version
        latest = harness.versions()[-1]
        assert await harness.stored_version("fresh") == latest
        assert await harness.describe("stepwise") == await harness.describe("fresh")
