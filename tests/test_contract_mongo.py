"""The storage contract on ``mongodb://`` (nx-27017 in CI, or
``$TASKMILL_TEST_MONGO_URL``), plus what only this backend must do: URLs and options,
bad input (an unreachable server, a schema version mismatch, params keys MongoDB
restricts), and the server check."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from pymongo import AsyncMongoClient
from taskmill.discovery import storage_for_url
from taskmill.errors import InvalidURL, SchemaVersionError, StorageUnavailable
from taskmill.storage import TaskStorage
from taskmill.testing import StorageContract, new_task
from taskmill_mongo import SCHEMA_VERSION, MongoStorage

from tests import mongo_server


class TestMongoStorage(StorageContract):
    @pytest.fixture
    async def storage(self, mongo_url: str) -> AsyncIterator[TaskStorage]:
        store = MongoStorage.from_url(mongo_url)
        await store.open()
        yield store
        await store.close()


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
    ("url", "options", "message"),
    [
        ("mongodb://h/db", {"bogus": 1}, "valid options are: connect_timeout"),
        ("mongodb://h/", {}, "names no database"),
        ("mongodb://h/a.b", {}, "plain name"),
        ("mongodb://h/db", {"connect_timeout": 0}, "> 0"),
        ("mongodb://h:99999/db", {}, "malformed"),
        ("postgresql://h/db", {}, "not a MongoDB URL"),
    ],
)
def test_bad_urls_and_options_are_invalid(url: str, options: dict, message: str):
    with pytest.raises(InvalidURL, match=message):
        MongoStorage.from_url(url, **options)


def test_an_invalid_url_never_shows_the_password():
    with pytest.raises(InvalidURL) as excinfo:
        MongoStorage.from_url("mongodb://app:s3cret@db:27017/app", nope=1)
    assert "s3cret" not in str(excinfo.value)
    assert "s3cret" not in repr(MongoStorage.from_url("mongodb://app:s3cret@db/app"))


# -- bad input ------------------------------------------------------------------------


async def test_an_unreachable_server_is_unavailable_naming_the_url_without_password():
    store = MongoStorage.from_url("mongodb://app:s3cret@127.0.0.1:1/app", connect_timeout=1)
    with pytest.raises(StorageUnavailable) as excinfo:
        await store.open()
    message = str(excinfo.value)
    assert "127.0.0.1:1/app" in message and "s3cret" not in message
    with pytest.raises(StorageUnavailable, match="not open"):
        await store.get("x")


async def _set_version(database: str, version: int) -> None:
    client, db = await _raw(database)
    try:
        await db.taskmill_meta.update_one({"_id": "schema"}, {"$set": {"version": version}})
    finally:
        await client.close()


async def test_an_older_schema_is_refused_with_the_migrate_command(
    mongo_url: str, mongo_database: str
):
    store = MongoStorage.from_url(mongo_url)
    await store.open()
    (task,) = await store.enqueue([new_task()])
    await store.close()
    await _set_version(mongo_database, 0)
    with pytest.raises(SchemaVersionError) as excinfo:
        await MongoStorage.from_url(mongo_url).open()
    assert f"taskmill migrate --url {mongo_url}" in str(excinfo.value)
    assert await store.migrate() == SCHEMA_VERSION
    await store.open()
    try:
        assert await store.get(task.id) == task  # nothing was lost
    finally:
        await store.close()


async def test_a_newer_schema_is_refused_with_upgrade_advice(mongo_url: str, mongo_database: str):
    store = MongoStorage.from_url(mongo_url)
    await store.open()
    await store.close()
    await _set_version(mongo_database, SCHEMA_VERSION + 1)
    for attempt in (store.open(), store.migrate()):
        with pytest.raises(SchemaVersionError, match="pip install --upgrade taskmill-mongo"):
            await attempt


async def test_another_applications_database_is_left_untouched(mongo_url: str, mongo_database: str):
    client, db = await _raw(mongo_database)
    try:
        await db.invoices.insert_one({"_id": 1})
        store = MongoStorage.from_url(mongo_url)
        for attempt in (store.open(), store.migrate()):
            with pytest.raises(StorageUnavailable, match="not a taskmill database"):
                await attempt
        assert await db.list_collection_names() == ["invoices"]
    finally:
        await client.close()


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
    """A database as version 1 left it (no ``dependencies`` or ``buckets`` collection,
    no dependency fields on tasks) is refused until ``migrate`` upgrades it in place;
    its tasks survive, and can then be depended on and claimed under global limits."""
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
        await db.tasks.update_many({}, {"$unset": {"waiting_on": "", "dependents": ""}})
        await db.taskmill_meta.update_one({"_id": "schema"}, {"$set": {"version": 1}})
    finally:
        await client.close()
    with pytest.raises(SchemaVersionError, match="taskmill migrate"):
        await MongoStorage.from_url(mongo_url).open()
    assert await store.migrate() == SCHEMA_VERSION == 2
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
