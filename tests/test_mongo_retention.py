"""Delete on complete on MongoDB, beyond the shipped contract (RetentionContract): the
schema version that adds ``tombstones``, what a deleting finish leaves in the
collections, the ``unlogged`` mark that spares first attempts an attempt delete, the
commands a finish sends (keep mode unchanged), a rerun after a write conflict, an id
deleted twice, an alias deleted with its own dependency, and pruning by age."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring
from taskmill.errors import SchemaVersionError
from taskmill.model import EventKind, TaskStatus
from taskmill.storage import FinishKind
from taskmill.testing import claim, finish, new_task
from taskmill.testing.events import read_all_events
from taskmill_mongo import SCHEMA_VERSION
from taskmill_mongo.connection import Stage
from taskmill_mongo.documents import tombstone_task
from taskmill_mongo.storage import MongoStorage

from tests import mongo_server
from tests.test_mongo_transactions import Faults, inject, write_conflict

Doc = dict[str, Any]


@pytest.fixture
async def store(mongo_url: str) -> AsyncIterator[MongoStorage]:
    store = MongoStorage.from_url(mongo_url)
    await store.open()
    yield store
    await store.close()


@pytest.fixture
async def raw(mongo_database: str) -> AsyncIterator[Any]:
    """The test's database through a plain PyMongo client."""
    client: AsyncMongoClient[Doc] = AsyncMongoClient(
        mongo_server.driver_url(), serverSelectionTimeoutMS=5000
    )
    yield client[mongo_database]
    await client.close()


async def test_a_version_3_database_is_refused_until_migrate_adds_the_tombstones(
    mongo_url: str, raw: Any
) -> None:
    store = MongoStorage.from_url(mongo_url)
    await store.open()
    (kept,) = await store.enqueue([new_task()])
    await store.close()
    await raw.tombstones.drop()
    await raw.taskmill_meta.update_one({"_id": "schema"}, {"$set": {"version": 3}})
    with pytest.raises(SchemaVersionError, match="taskmill migrate"):
        await MongoStorage.from_url(mongo_url).open()
    assert await store.migrate() == SCHEMA_VERSION == 5
    assert "tombstones" in await raw.list_collection_names()
    indexes = await raw.tombstones.index_information()
    # Keyed on the age that pruning deletes by (the stand-in names indexes its own way).
    assert [("deleted_at", 1)] in [index["key"] for index in indexes.values()]
    await store.open()
    try:
        assert await store.get(kept.id) == kept
        (running,) = await store.claim_batch(claim())
        await store.finish_batch([finish(running, result=7, delete=True)])
        gone = await store.deleted_task(kept.id)
        assert gone is not None and gone.result == 7
    finally:
        await store.close()


async def test_deleting_finishes_remove_every_attempt_row_of_their_tasks_and_only_theirs(
    store: MongoStorage, raw: Any
) -> None:
    tasks = await store.enqueue([new_task(params={"i": i}) for i in range(4)])
    first = await store.claim_batch(claim())
    await store.finish_batch([finish(t, FinishKind.RETRY, error="again") for t in first])
    again = {t.id: t for t in await store.claim_batch(claim())}
    assert len(again) == 4
    deleting = {t.id for t in tasks[:3]}
    await store.finish_batch(
        [finish(again[t.id], result=t.params["i"], delete=t.id in deleting) for t in tasks]
    )
    assert await raw.attempts.count_documents({"task_id": {"$in": sorted(deleting)}}) == 0
    assert await raw.attempts.count_documents({"task_id": {"$eq": tasks[3].id}}) == 2
    assert [d["_id"] async for d in raw.tasks.find({})] == [tasks[3].id]
    tombstones = await raw.tombstones.find({}).to_list()
    assert {d["_id"] for d in tombstones} == deleting
    assert all(d["deleted_at"] > 0 for d in tombstones)
    assert {tombstone_task(d).status for d in tombstones} == {TaskStatus.COMPLETED}
    for t in tasks[:3]:
        gone = await store.deleted_task(t.id)
        assert gone is not None and (gone.result, gone.attempts) == (t.params["i"], 2)


async def test_a_task_written_without_the_unlogged_mark_has_its_rows_deleted(
    store: MongoStorage, raw: Any
) -> None:
    """A document without ``unlogged`` (inserted before schema version 4, or by an
    older process) may have attempt rows: a deleting finish deletes them."""
    (task,) = await store.enqueue([new_task()])
    assert (await raw.tasks.find_one({"_id": task.id}))["unlogged"] is True
    (running,) = await store.claim_batch(claim())
    assert (await raw.tasks.find_one({"_id": task.id}))["unlogged"] is True  # kept by claims
    await raw.tasks.update_one({"_id": task.id}, {"$unset": {"unlogged": ""}})
    await raw.attempts.insert_one({"task_id": task.id, "number": 0, "seq": 0})
    await store.finish_batch([finish(running, result=1, delete=True)])
    assert await raw.attempts.count_documents({"task_id": {"$eq": task.id}}) == 0
    assert await store.attempts(task.id) == []


async def test_a_keep_finish_sends_what_it_sent_before_and_a_deleting_one_writes_tombstones(
    mongo_url: str,
) -> None:
    """A finish batch without delete sends the commands it sent before this feature; a
    deleting batch of first attempts deletes in place of replacing and upserts the
    tombstones in place of inserting attempt rows: as many commands."""

    class Commands(monitoring.CommandListener):
        def __init__(self) -> None:
            self.sent: list[tuple[str, str]] = []

        def started(self, event: monitoring.CommandStartedEvent) -> None:
            target = event.command.get(event.command_name)
            if target in ("tasks", "tombstones", "attempts", "events"):
                self.sent.append((event.command_name, target))

        def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
            pass

        def failed(self, event: monitoring.CommandFailedEvent) -> None:
            pass

    store = MongoStorage.from_url(mongo_url)
    commands = Commands()

    def listened() -> AsyncMongoClient[Doc]:
        """The store's client, with the listener."""
        return AsyncMongoClient(
            store._conn.options.driver_url,
            serverSelectionTimeoutMS=5000,
            tz_aware=True,
            event_listeners=[commands],
        )

    store._conn.new_client = listened  # type: ignore[method-assign]
    await store.open()
    try:
        sent: dict[str, list[tuple[str, str]]] = {}
        for mode in ("keep", "delete", "mixed"):
            await store.enqueue([new_task() for _ in range(4)])
            running = await store.claim_batch(claim())
            commands.sent.clear()
            await store.finish_batch(
                [
                    finish(t, result=1, delete=mode == "delete" or (mode == "mixed" and i % 2 == 0))
                    for i, t in enumerate(running)
                ]
            )
            sent[mode] = list(commands.sent)
    finally:
        await store.close()
    assert sent["keep"] == [
        ("find", "tasks"),
        ("update", "tasks"),
        ("insert", "events"),
        ("insert", "attempts"),
    ]
    # First attempts: their documents still say no attempt row was written.
    assert sent["delete"] == [
        ("find", "tasks"),
        ("delete", "tasks"),
        ("update", "tombstones"),
        ("insert", "events"),
    ]
    assert sent["mixed"] == [
        ("find", "tasks"),
        ("update", "tasks"),
        ("delete", "tasks"),
        ("update", "tombstones"),
        ("insert", "events"),
        ("insert", "attempts"),
    ]


async def test_a_write_conflict_at_commit_reruns_a_deleting_finish_and_it_is_applied_once(
    store: MongoStorage, raw: Any
) -> None:
    _, start = await store.read_events(None)
    (leader,) = await store.enqueue([new_task(dedupe_key="k")])
    (alias,) = await store.enqueue([new_task(dedupe_key="k")])
    (running,) = await store.claim_batch(claim())
    faults = inject(store, Faults(queued={Stage.COMMIT: [write_conflict()]}))
    (done,) = await store.finish_batch([finish(running, result={"n": 1}, delete=True)])
    assert faults.reached == {Stage.BODY: 2, Stage.COMMIT: 2}
    store._conn.fault = None
    assert done is not None and done.status is TaskStatus.COMPLETED
    assert await raw.tasks.count_documents({}) == 0
    tombstones = await raw.tombstones.find({}).to_list()
    assert sorted(d["_id"] for d in tombstones) == sorted([leader.id, alias.id])
    events = await read_all_events(store, start)
    assert [(e.kind, e.task.id) for e in events if e.kind is EventKind.COMPLETED] == [
        (EventKind.COMPLETED, leader.id),
        (EventKind.COMPLETED, alias.id),
    ]


async def test_a_task_id_deleted_again_keeps_its_latest_tombstone(store: MongoStorage) -> None:
    """The duplicate-id rule looks at the tasks only, so an id whose task was deleted
    can be enqueued again; deleting that task too replaces the tombstone."""
    new = new_task()
    for result in (1, 2):
        (task,) = await store.enqueue([new])
        assert task.status is TaskStatus.PENDING
        (running,) = await store.claim_batch(claim())
        (done,) = await store.finish_batch([finish(running, result=result, delete=True)])
        assert done is not None
        gone = await store.deleted_task(new.id)
        assert gone is not None and gone.result == result


async def test_an_alias_deleted_with_its_leader_leaves_its_own_dependency_harmless(
    store: MongoStorage,
) -> None:
    """An alias that waits on a dependency of its own is settled and deleted with its
    leader; that dependency's end then finds no dependent to release (as after a
    cleanup) and completes as usual."""
    (blocker,) = await store.enqueue([new_task("b")])
    (leader,) = await store.enqueue([new_task("a", dedupe_key="k")])
    (alias,) = await store.enqueue([new_task("a", dedupe_key="k", after=(blocker.id,))])
    assert alias.alias_of == leader.id
    (running,) = await store.claim_batch(claim("a"))
    await store.finish_batch([finish(running, result=1, delete=True)])
    assert await store.get(alias.id) is None
    (b,) = await store.claim_batch(claim("b"))
    (ended,) = await store.finish_batch([finish(b, result=2)])
    assert ended is not None and ended.status is TaskStatus.COMPLETED


async def test_pruning_removes_the_tombstones_as_old_as_the_events_it_prunes(
    store: MongoStorage, raw: Any
) -> None:
    old, young = await store.enqueue([new_task(), new_task()])
    running = await store.claim_batch(claim())
    await store.finish_batch([finish(t, result=1, delete=True) for t in running])
    hour_ago = (await store._conn.now()) - 3_600_000_000
    await raw.tombstones.update_one({"_id": old.id}, {"$set": {"deleted_at": hour_ago}})
    await store.prune_events(timedelta(minutes=1))
    assert await store.deleted_task(old.id) is None
    kept = await store.deleted_task(young.id)
    assert kept is not None and kept.status is TaskStatus.COMPLETED
