"""The storage contract suite, shipped with the core: the executable definition of a
correct :class:`taskmill.TaskStorage`.

A backend, first-party or third-party, proves itself by subclassing one class,
:class:`StorageContract`, and providing a ``storage`` fixture that yields an opened,
empty store::

    import pytest
    from taskmill.testing import StorageContract

    class TestMyBackend(StorageContract):
        @pytest.fixture
        async def storage(self):
            store = MyStorage.from_url("my://...")
            await store.open()
            yield store
            await store.close()

It then runs every test of every topic module: :mod:`~taskmill.testing.tasks`,
:mod:`~taskmill.testing.task_ids`, :mod:`~taskmill.testing.claims`, :mod:`~taskmill.testing.finish`,
:mod:`~taskmill.testing.leases`, :mod:`~taskmill.testing.dedupe`,
:mod:`~taskmill.testing.dependencies`,
:mod:`~taskmill.testing.control`, :mod:`~taskmill.testing.events`,
:mod:`~taskmill.testing.migrations`, :mod:`~taskmill.testing.concurrency`,
:mod:`~taskmill.testing.reference`, :mod:`~taskmill.testing.registrations`,
:mod:`~taskmill.testing.retention` (delete on finish),
:mod:`~taskmill.testing.workers` (the worker registry) and
:mod:`~taskmill.testing.edges` (unusual input through a ``Taskmill`` on the store: the
``edge_taskmill`` fixture, which a backend whose store cannot be rebuilt from its
``url`` overrides).

Two more fixtures have defaults a backend may override (:class:`StoreFixtures`):

- ``storage_factory`` opens a second, independent store object on the same database
  (by default ``type(storage).from_url(storage.url)``), so that the tests of
  :mod:`~taskmill.testing.concurrency` race two connections for real;
- ``schema_migrations`` returns a :class:`SchemaMigrations` for a backend with
  versioned SQL migrations (default None: those tests are skipped, saying so).

A second class, :class:`DeploymentContract` (:mod:`~taskmill.testing.deployment`),
proves how the store meets the place it is deployed in: schemas of older and newer
releases refused and left as they were, another application's data never touched, an
unreachable server and a wrong password reported without the password, bad URLs
refused, worker processes never sharing a task, and the database itself refusing a
second active dedupe leader. Its hooks (:class:`DeploymentHooks`) reach behind the
store's back; a scenario that does not apply is named in ``not_applicable`` with the
reason, and its tests skip saying so.

The tests need pytest-asyncio. A test that needs a capability some stores lack is
marked ``@requires(name)``; on a backend whose ``capabilities``
(:class:`~taskmill.storage.StorageCapabilities`) declares it lacks that capability the
test is skipped with a reason naming both, never silently. Every other test runs on
every backend.
"""

from __future__ import annotations

import pytest

from taskmill.testing.canvas import CanvasContract
from taskmill.testing.capabilities import requires
from taskmill.testing.claims import ClaimContract
from taskmill.testing.concurrency import ConcurrencyContract
from taskmill.testing.control import ControlContract
from taskmill.testing.dedupe import DedupeContract
from taskmill.testing.dependencies import DependencyContract
from taskmill.testing.deployment import (
    SCENARIOS,
    BadURL,
    DeploymentContract,
    DeploymentHooks,
    ForeignDataContract,
    Scenario,
    SchemaVersionContract,
    ServerContract,
    StoreEnforcedDedupeContract,
    URLContract,
    WorkerProcessContract,
)
from taskmill.testing.edges import EdgeContract
from taskmill.testing.events import EventContract
from taskmill.testing.finish import FinishContract
from taskmill.testing.fixtures import StorageFactory, StoreFixtures
from taskmill.testing.helpers import claim, finish, lease_of, moment_after, new_task, wait_until
from taskmill.testing.leases import LeaseContract
from taskmill.testing.lifecycle import LifecycleContract
from taskmill.testing.limits import LimitContract
from taskmill.testing.migrations import MigrationContract, Place, SchemaMigrations
from taskmill.testing.reference import ReferenceContract
from taskmill.testing.registrations import HandlerRegistrationContract
from taskmill.testing.retention import RetentionContract
from taskmill.testing.task_ids import TaskIdContract
from taskmill.testing.tasks import TaskContract
from taskmill.testing.workers import WorkerRegistryContract

__all__ = [
    "SCENARIOS",
    "BadURL",
    "DeploymentContract",
    "DeploymentHooks",
    "ForeignDataContract",
    "Place",
    "Scenario",
    "SchemaMigrations",
    "SchemaVersionContract",
    "ServerContract",
    "StorageContract",
    "StorageFactory",
    "StoreEnforcedDedupeContract",
    "URLContract",
    "WorkerProcessContract",
    "claim",
    "finish",
    "lease_of",
    "moment_after",
    "new_task",
    "requires",
    "wait_until",
]


class StorageContract(
    StoreFixtures,
    TaskContract,
    TaskIdContract,
    ClaimContract,
    FinishContract,
    LeaseContract,
    DedupeContract,
    DependencyContract,
    ControlContract,
    EventContract,
    MigrationContract,
    ConcurrencyContract,
    ReferenceContract,
    HandlerRegistrationContract,
    LifecycleContract,
    LimitContract,
    EdgeContract,
    RetentionContract,
    WorkerRegistryContract,
    CanvasContract,
):
    """The semantics every :class:`~taskmill.TaskStorage` must have: every topic's tests.

    Subclass it and provide an async ``storage`` fixture yielding an opened, empty store.
    """

    pytestmark = pytest.mark.asyncio
