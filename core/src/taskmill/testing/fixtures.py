"""The fixtures every contract test draws on, and the capability gate.

A backend's contract class overrides :meth:`StoreFixtures.storage` (always) and, where
the defaults do not fit, :meth:`StoreFixtures.storage_factory` and
:meth:`StoreFixtures.schema_migrations`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeAlias

import pytest

from taskmill.storage import TaskStorage
from taskmill.testing.capabilities import missing_capabilities
from taskmill.testing.migrations import SchemaMigrations

__all__ = ["StorageFactory", "StoreFixtures"]

StorageFactory: TypeAlias = Callable[[], Awaitable[TaskStorage]]
"""Opens another, independent store object on the database of ``storage``."""


class StoreFixtures:
    """``storage``, ``storage_factory``, ``schema_migrations`` and the gate that skips a
    test marked :func:`~taskmill.testing.requires` on a store lacking what it needs."""

    @pytest.fixture
    def storage(self) -> TaskStorage:
        """An opened, empty store of the backend under test (a backend must override it)."""
        raise NotImplementedError("a backend's contract test class provides `storage`")

    @pytest.fixture
    async def storage_factory(self, storage: TaskStorage) -> AsyncIterator[StorageFactory]:
        """Opens a second store object on the same database as ``storage``: its own
        connection or pool, as another process would have, so that tests racing two
        stores race for real. Each one opened is closed after the test.

        The default builds it with ``type(storage).from_url(storage.url)``; a backend
        whose ``url`` does not carry all it needs (keyword options) overrides it. Tests
        using it need ``shared_between_processes``.
        """
        opened: list[TaskStorage] = []

        async def open_another() -> TaskStorage:
            other = type(storage).from_url(storage.url)
            await other.open()
            opened.append(other)
            return other

        yield open_another
        for other in opened:
            await other.close()

    @pytest.fixture
    def schema_migrations(self) -> SchemaMigrations | None:
        """The backend's versioned schema as the migration tests inspect it, or None
        (the default) for a backend without SQL-style migrations: those tests are then
        skipped, saying so."""
        return None

    @pytest.fixture(autouse=True)
    def _skip_without_required_capabilities(
        self, request: pytest.FixtureRequest, storage: TaskStorage
    ) -> None:
        reason = missing_capabilities(storage, request.function)
        if reason is not None:
            pytest.skip(reason)
