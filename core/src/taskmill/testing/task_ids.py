"""Contract: the duplicate-id rule of an enqueue (``TaskStorage.enqueue``): a task whose
id is already stored for the same type, app and params is a no-op that returns the
stored task; the same id for a different task is refused, and nothing is stored."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import pytest

from taskmill.errors import DuplicateTaskId, InvalidTaskSpec
from taskmill.model import EventKind, TaskFilter, TaskStatus
from taskmill.serialization import dumps
from taskmill.storage import NewTask, TaskStorage
from taskmill.testing.capabilities import requires
from taskmill.testing.events import read_all_events
from taskmill.testing.fixtures import StorageFactory
from taskmill.testing.helpers import claim, finish, new_task

__all__ = ["TaskIdContract"]

_RACE_DEADLINE = 60.0


def _same(new: NewTask, **changes: Any) -> NewTask:
    """``new`` again (same id), with ``changes``; params kept in step with their JSON."""
    again: NewTask = attrs.evolve(new, **changes)
    if "params" in changes:
        again = attrs.evolve(again, params_json=dumps(again.params))
    return again


class TaskIdContract:
    """One stored task per id, decided by the store."""

    async def test_enqueueing_a_stored_id_again_returns_the_stored_task(
        self, storage: TaskStorage
    ) -> None:
        spec = new_task("t", {"n": 1}, app_id="a")
        (first,) = await storage.enqueue([spec])
        # Other priority, retries or run_at do not matter: the stored task wins.
        (again,) = await storage.enqueue([_same(spec, priority=99, max_retries=0)])
        assert again == first
        assert await storage.query(TaskFilter(), limit=10) == [first]

    async def test_a_stored_id_is_returned_whatever_its_status(self, storage: TaskStorage) -> None:
        spec = new_task("t", {"n": 1})
        await storage.enqueue([spec])
        (running,) = await storage.claim_batch(claim("t"))
        (done,) = await storage.finish_batch([finish(running, result=7)])
        assert done is not None and done.status is TaskStatus.COMPLETED
        (again,) = await storage.enqueue([spec])
        assert again == done
        assert await storage.claim_batch(claim("t")) == []

    async def test_a_no_op_enqueue_writes_no_event(self, storage: TaskStorage) -> None:
        _, start = await storage.read_events(None)
        spec = new_task("t")
        await storage.enqueue([spec])
        await storage.enqueue([spec])
        await storage.enqueue([spec, spec])
        events = await read_all_events(storage, start)
        assert [(e.kind, e.task.id) for e in events] == [(EventKind.ENQUEUED, spec.id)]

    async def test_a_repeated_id_in_one_call_is_stored_once(self, storage: TaskStorage) -> None:
        spec = new_task("t", {"n": 1})
        other = new_task("t")
        stored = await storage.enqueue([spec, other, _same(spec)])
        assert [t.id for t in stored] == [spec.id, other.id, spec.id]
        assert stored[0] == stored[2]
        assert len(await storage.query(TaskFilter(), limit=10)) == 2

    @pytest.mark.parametrize(
        "change",
        [{"task_type": "u"}, {"app_id": "other"}, {"params": {"n": 2}}],
        ids=["type", "app", "params"],
    )
    async def test_a_stored_id_for_a_different_task_is_refused(
        self, storage: TaskStorage, change: dict[str, Any]
    ) -> None:
        spec = new_task("t", {"n": 1})
        (first,) = await storage.enqueue([spec])
        bystander = new_task("t")
        with pytest.raises(DuplicateTaskId, match=spec.id):
            await storage.enqueue([bystander, _same(spec, **change)])
        # all or none: the bystander was not stored, the first task is unchanged
        assert await storage.get(bystander.id) is None
        assert await storage.get(spec.id) == first

    async def test_a_repeated_id_for_different_tasks_in_one_call_is_refused(
        self, storage: TaskStorage
    ) -> None:
        spec = new_task("t", {"n": 1})
        with pytest.raises(DuplicateTaskId):
            await storage.enqueue([spec, _same(spec, params={"n": 2})])
        assert await storage.get(spec.id) is None

    async def test_the_refusal_is_an_invalid_task_spec(self) -> None:
        assert issubclass(DuplicateTaskId, InvalidTaskSpec)

    async def test_a_no_op_takes_no_part_in_dedupe(self, storage: TaskStorage) -> None:
        spec = new_task("t", dedupe_key="k")
        (leader,) = await storage.enqueue([spec])
        (again,) = await storage.enqueue([spec])
        assert again == leader and again.alias_of is None

    @requires("shared_between_processes")
    async def test_two_store_objects_racing_one_id_store_it_once(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        for round_ in range(10):
            spec = new_task("t", {"round": round_})
            async with asyncio.timeout(_RACE_DEADLINE):
                results = await asyncio.gather(
                    *((storage, other)[i % 2].enqueue([spec]) for i in range(8))
                )
            tasks = [t for batch in results for t in batch]
            assert {t.id for t in tasks} == {spec.id}
            assert all(t == tasks[0] for t in tasks)
        assert len(await storage.query(TaskFilter(), limit=100)) == 10
