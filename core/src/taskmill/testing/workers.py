"""Contract: the worker registry (docs/workers.md, capability ``worker_registry``):
registrations kept as the core wrote them, each with the store's clock as its
heartbeat, replaced, removed and pruned by age, seen by every store object, and a
running worker listed by ``tm.workers()`` until it stops."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from taskmill.app import Taskmill
from taskmill.context import Context
from taskmill.storage import TaskStorage
from taskmill.testing.capabilities import requires
from taskmill.testing.fixtures import StorageFactory
from taskmill.testing.helpers import wait_until

__all__ = ["WorkerRegistryContract"]

# Unicode, quotes and a 64 KiB body: kept byte for byte.
_RECORD = '{"id":"w","note":"caf\u00e9 \u2603 \\"q\\"","pad":"' + "x" * 65_000 + '"}'


class WorkerRegistryContract:
    """What a store keeps of the workers' registrations."""

    @requires("worker_registry")
    async def test_a_worker_record_is_kept_as_written_with_the_stores_clock(
        self, storage: TaskStorage
    ) -> None:
        before = datetime.now(UTC) - timedelta(seconds=5)
        await storage.put_worker("w-1", _RECORD)
        await storage.put_worker("w-2", "{}")
        found = await storage.workers()
        assert [w.id for w in found] == ["w-1", "w-2"]
        assert found[0].record == _RECORD
        for one in found:
            assert one.heartbeat_at.tzinfo is not None
            assert before < one.heartbeat_at < datetime.now(UTC) + timedelta(seconds=5)

    @requires("worker_registry")
    async def test_a_heartbeat_replaces_the_record_and_moves_the_clock(
        self, storage: TaskStorage
    ) -> None:
        await storage.put_worker("w", '{"n":1}')
        (first,) = await storage.workers()

        async def later() -> bool:
            await storage.put_worker("w", '{"n":2}')
            (again,) = await storage.workers()
            return again.heartbeat_at > first.heartbeat_at

        await wait_until(later, timeout=10)
        (now,) = await storage.workers()
        assert now.record == '{"n":2}'

    @requires("worker_registry")
    async def test_remove_and_prune(self, storage: TaskStorage) -> None:
        await storage.put_worker("gone", "{}")
        await storage.put_worker("kept", "{}")
        assert await storage.remove_worker("gone") is True
        assert await storage.remove_worker("gone") is False
        assert await storage.prune_workers(timedelta(hours=1)) == 0
        assert [w.id for w in await storage.workers()] == ["kept"]

        async def pruned() -> bool:
            await storage.prune_workers(timedelta(0))
            return not await storage.workers()

        await wait_until(pruned, timeout=10)

    @requires("worker_registry", "shared_between_processes")
    async def test_another_store_object_sees_the_worker_records(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        await storage.put_worker("here", '{"a":1}')
        found = await other.workers()
        assert [(w.id, w.record) for w in found] == [("here", '{"a":1}')]
        assert await other.remove_worker("here") is True
        assert await storage.workers() == []

    @requires("worker_registry")
    async def test_a_running_worker_is_listed_until_it_stops(self, edge_taskmill: Taskmill) -> None:
        tm = edge_taskmill
        release = asyncio.Event()

        @tm.handler("wait", max_retries=1, timeout=30)
        async def wait(ctx: Context, params: dict[str, Any]) -> None:
            await release.wait()

        task = await tm.enqueue("wait")
        worker = tm.worker(concurrency=2, handle_signals=False, rescue_interval=0.05)
        running = asyncio.create_task(worker.run())

        async def listed() -> bool:
            found = await tm.workers()
            return bool(found) and task.id in found[0].record.running

        try:
            await wait_until(listed, timeout=20)
            (status,) = await tm.workers()
            record = status.record
            assert status.alive and status.id == worker.worker_id
            assert (record.concurrency, record.busy) == (2, 1)
            served = {(h.app_id, h.task_type): h for h in record.handlers}
            assert served[(None, "wait")].max_retries == 1
            assert served[(None, "wait")].timeout == 30
        finally:
            release.set()
            await worker.stop()
            await running
        assert await tm.workers() == []
