"""The storage and deployment contracts on ``mongodb://`` (nx-27017 in CI, or
``$TASKMILL_TEST_MONGO_URL``), plus what only this backend must do: params keys MongoDB
restricts, collections created before the first write, concurrent migrations and the
upgrade of a version-1 database."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import DuplicateKeyError
from taskmill.discovery import storage_for_url
from taskmill.errors import SchemaVersionError
from taskmill.model import Task
from taskmill.storage import TaskStorage
from taskmill.testing import BadURL, DeploymentContract, StorageContract, new_task
from taskmill_mongo import SCHEMA_VERSION, MongoStorage
from taskmill_mongo.documents import leader_key

from tests import mongo_server


class TestMongoStorage(StorageContract):
    @pytest.fixture
    async def storage(self, mongo_url: str) -> AsyncIterator[TaskStorage]:
        store = MongoStorage.from_url(mongo_url)
        await store.open()
        yield store
        await store.close()


class TestMongoDeployment(DeploymentContract):
    """Every deployment scenario, on a database of the test server of each test's own."""

    storage_class = MongoStorage
    distribution = "taskmill-mongo"
    unreachable_options = {"connect_timeout": 1}
    unique_violation = (DuplicateKeyError, "leader_key")
    bad_urls = [
        BadURL("mongodb://h/db", "valid options are: connect_timeout", {"bogus": 1}),
        BadURL("mongodb://app:s3cret@db:27017/app", "valid options are", {"nope": 1}),
        BadURL("mongodb://h/", "names no database"),
        BadURL("mongodb://h/a.b", "plain name"),
        BadURL("mongodb://h/db", "> 0", {"connect_timeout": 0}),
        BadURL("mongodb://h:99999/db", "malformed"),
        BadURL("postgresql://h/db", "not a MongoDB URL"),
    ]

    @pytest.fixture
    def deployment_url(self, mongo_url: str) -> str:
        return mongo_url

    def unreachable_url(self) -> str:
        return "mongodb://app:s3cret@127.0.0.1:1/app"

    async def set_schema_version(self, url: str, version: int) -> None:
        client, db = await _raw(MongoStorage.from_url(url).database)
        try:
            await db.taskmill_meta.update_one({"_id": "schema"}, {"$set": {"version": version}})
        finally:
            await client.close()

    async def footprint(self, url: str) -> object:
        """Every collection of the database with all its documents, but the lock of
        the test server's stand-in (``serializeWrites``): any opener takes and releases
        it, a refused one too, and it holds no data."""
        client, db = await _raw(MongoStorage.from_url(url).database)
        try:
            lock = {"counters": {"_id": {"$ne": "writer"}}}
            return {
                name: await db[name].find(lock.get(name, {})).sort("_id").to_list()
                for name in sorted(await db.list_collection_names())
            }
        finally:
            await client.close()

    async def plant_foreign_data(self, url: str) -> str:
        client, db = await _raw(MongoStorage.from_url(url).database)
        try:
            await db.invoices.insert_many([{"_id": 1}, {"_id": 2}])
        finally:
            await client.close()
        return "invoices"

    async def insert_active_task(
        self, storage: TaskStorage, leader: Task, *, dedupe_key: str
    ) -> None:
        """A copy of the leader's document with an id, a place and a key of its own."""
        assert isinstance(storage, MongoStorage)
        client, db = await _raw(storage.database)
        try:
            doc = await db.tasks.find_one({"_id": leader.id})
            assert doc is not None
            doc.update(
                _id=str(uuid.uuid4()),
                seq=doc["seq"] + 1_000_000,
                dedupe_key=dedupe_key,
                leader_key=leader_key(leader.app_id, leader.task_type, dedupe_key),
            )
            await db.tasks.insert_one(doc)
        finally:
            await client.close()


async def _raw(database: str) -> tuple[AsyncMongoClient[dict[str, Any]], Any]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_server.driver_url(), serverSelectionTimeoutMS=5000
    )
    return client, client[database]


# -- URLs and options -----------------------------------------------------------------


def test_the_entry_points_serve_mongodb_and_srv_urls():
    for url in ("mongodb://user@localhost/db", "mongodb+srv://user@cluster.example.org/db"):
        store = storage_for_url(url)
        assert isinstance(store, MongoStorage)
        assert store.database == "db"


@pytest.mark.parametrize(
    "params",
    [
        {"$set": 1, "a.b": {"$inc": [1, "x.y"]}},
        {"": "empty key", ".": ".", "$": "$"},
    ],
)
async def test_params_keys_mongodb_restricts_are_stored_faithfully(mongo_url: str, params: dict):
    from taskmill import Taskmill

    tm = Taskmill(mongo_url)
    await tm.open()
    try:
        task = await tm.enqueue("echo", params)
        assert task.params == params
        again = await tm.get(task.id)
        assert again is not None and again.params == params
    finally:
        await tm.close()


async def test_a_new_database_has_every_collection_before_its_first_write(
    mongo_url: str, mongo_database: str
):
    """Opening a new database creates every collection outside any transaction, so
    that no transaction (a suspend, a claim under a rate limit) creates one: refused by
    MongoDB before 4.4 and in cross-shard write transactions, and raced in the test server."""
    from taskmill_mongo.storage import _COLLECTIONS

    store = MongoStorage.from_url(mongo_url)
    await store.open()
    await store.close()
    client, db = await _raw(mongo_database)
    try:
        names = set(await db.list_collection_names())
    finally:
        await client.close()
    assert set(_COLLECTIONS) <= names, sorted(set(_COLLECTIONS) - names)


async def test_concurrent_migrations_leave_one_schema(mongo_url: str):
    import asyncio

    stores = [MongoStorage.from_url(mongo_url) for _ in range(4)]
    versions = await asyncio.gather(*(s.migrate() for s in stores))
    assert versions == [SCHEMA_VERSION] * 4
    await stores[0].open()
    try:
        (task,) = await stores[0].enqueue([new_task()])
        assert await stores[0].get(task.id) == task
    finally:
        await stores[0].close()


async def test_migrate_upgrades_a_version_1_database_keeping_its_tasks(
    mongo_url: str, mongo_database: str
):
    """A database as version 1 left it (no ``dependencies``, ``buckets``,
    ``tombstones`` or ``workers`` collection, no dependency fields on tasks) is refused
    until ``migrate`` upgrades it in place; its tasks survive, and can then be depended
    on and claimed under global limits."""
    from taskmill.limits import TypeLimit, parse_rate
    from taskmill.model import TaskFilter, TaskStatus
    from taskmill.testing import claim, finish

    store = MongoStorage.from_url(mongo_url)
    await store.open()
    old = await store.enqueue([new_task("a"), new_task("b")])
    await store.close()
    client, db = await _raw(mongo_database)
    try:
        await db.dependencies.drop()
        await db.buckets.drop()
        await db.tombstones.drop()
        await db.workers.drop()
        await db.tasks.update_many({}, {"$unset": {"waiting_on": "", "dependents": ""}})
        await db.taskmill_meta.update_one({"_id": "schema"}, {"$set": {"version": 1}})
    finally:
        await client.close()
    with pytest.raises(SchemaVersionError, match="taskmill migrate"):
        await MongoStorage.from_url(mongo_url).open()
    assert await store.migrate() == SCHEMA_VERSION == 5
    await store.open()
    try:
        assert [await store.get(t.id) for t in old] == old
        (dependent,) = await store.enqueue([new_task("c", after=(old[0].id,))])
        assert (await store.summary(TaskFilter())).waiting == 1
        capped = attrs.evolve(
            claim("a", "b", "c", limit=10),
            limits={(None, "a"): TypeLimit(rate=parse_rate("1/h"), max_running=1)},
        )
        got = await store.claim_batch(capped)
        assert sorted(t.task_type for t in got) == ["a", "b"]
        await store.finish_batch([finish(t) for t in got])
        (ran,) = await store.claim_batch(claim("c"))
        assert ran.id == dependent.id and ran.status is TaskStatus.RUNNING
    finally:
        await store.close()
