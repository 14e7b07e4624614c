"""The worker registry on MongoDB, beyond the shipped contract (WorkerRegistryContract):
the schema version that adds ``workers``, the documents it holds, and the store clock
(the server's, through ``hello``) as the heartbeat and the pruning cutoff."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from taskmill.errors import SchemaVersionError
from taskmill_mongo import SCHEMA_VERSION
from taskmill_mongo.storage import MongoStorage

from tests import mongo_server

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


async def test_a_version_4_database_is_refused_until_migrate_adds_the_workers(
    mongo_url: str, raw: Any
) -> None:
    store = MongoStorage.from_url(mongo_url)
    await store.open()
    await store.close()
    await raw.workers.drop()
    await raw.taskmill_meta.update_one({"_id": "schema"}, {"$set": {"version": 4}})
    with pytest.raises(SchemaVersionError, match="taskmill migrate"):
        await MongoStorage.from_url(mongo_url).open()
    assert await store.migrate() == SCHEMA_VERSION == 5
    assert "workers" in await raw.list_collection_names()
    await store.open()
    try:
        await store.put_worker("w", '{"a":1}')
        assert [(w.id, w.record) for w in await store.workers()] == [("w", '{"a":1}')]
    finally:
        await store.close()


async def test_a_registration_is_one_document_keyed_by_the_worker_id(
    store: MongoStorage, raw: Any
) -> None:
    record = '{"note":"caf\u00e9 \u2603"}'
    await store.put_worker("w-1", record)
    await store.put_worker("w-1", record)
    (doc,) = await raw.workers.find({}).to_list()
    assert doc["_id"] == "w-1" and doc["record"] == record
    assert isinstance(doc["heartbeat_at"], int)  # microseconds, like every timestamp


async def test_the_heartbeat_and_the_prune_cutoff_are_the_store_clock(store: MongoStorage) -> None:
    """A server clock an hour ahead of this process's (as ``hello`` would measure it):
    the heartbeat is an hour ahead, a prune by that clock keeps it, and one when the
    server clock has moved on two hours deletes it."""
    store._conn.offset += 3600.0
    store._conn.clock_at = time.monotonic() + 3600  # no re-measuring during the test
    await store.put_worker("w", "{}")
    (found,) = await store.workers()
    ahead = found.heartbeat_at - datetime.now(UTC)
    assert timedelta(minutes=59) < ahead < timedelta(minutes=61)
    assert await store.prune_workers(timedelta(minutes=30)) == 0
    store._conn.offset += 7200.0  # three hours ahead now: the heartbeat is two hours old
    assert await store.prune_workers(timedelta(minutes=90)) == 1
    assert await store.workers() == []
