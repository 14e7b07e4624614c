"""The MongoDB store under the server's largest document (issue 25): the store reads
``maxBsonObjectSize`` from the ``hello`` it sends when it opens and keeps every JSON
value of a task within ``max_value_bytes``, and a document the driver or the server
refuses as too large is the caller's ``InvalidParams`` with the driver's error as its
cause, never ``StorageUnavailable`` or the driver's own exception.

The tests run on the MongoDB test server (nx-27017 unless ``$TASKMILL_TEST_MONGO_URL``
names another). nx-27017 reports MongoDB's 16 MiB in ``hello`` but stores larger
documents, so the refusal is reached through the driver's own check, which needs no
server (see :func:`test_a_document_the_driver_refuses_is_invalid_params_caused_by_it`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import bson
import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import DocumentTooLarge
from taskmill import Context, Taskmill, TaskStatus
from taskmill.errors import InvalidParams
from taskmill.model import Progress
from taskmill.serialization import dumps
from taskmill.worker_options import WorkerArgs
from taskmill_mongo.documents import MARGIN
from taskmill_mongo.options import parse_url
from taskmill_mongo.storage import MongoStorage

MIB = 1024 * 1024


def worker_args() -> WorkerArgs:
    return WorkerArgs(handle_signals=False, min_poll_interval=0.01, poll_interval=0.05)


MESSAGE_SIZE: int = 48_000_000
"""MongoDB's ``maxMessageSizeBytes``: PyMongo refuses, before sending anything, a
write whose first document alone is larger."""


def json_size(value: Any) -> int:
    return len(dumps(value).encode())


async def server_hello(url: str) -> dict[str, Any]:
    """The server's ``hello`` response, on a client of its own."""
    client = raw_client(url)
    try:
        return await client.admin.command("hello")
    finally:
        await client.close()


def raw_client(url: str) -> AsyncMongoClient[dict[str, Any]]:
    """A client of the store's server and database, outside taskmill."""
    return AsyncMongoClient(parse_url(url, {}).driver_url, serverSelectionTimeoutMS=5000)


@pytest.fixture
async def store(mongo_url: str) -> AsyncIterator[MongoStorage]:
    store = MongoStorage.from_url(mongo_url)
    await store.open()
    yield store
    await store.close()


async def test_a_store_reports_max_value_bytes_below_the_largest_document(
    store: MongoStorage,
):
    largest = int((await server_hello(store.url))["maxBsonObjectSize"])
    ceiling = store.capabilities.max_value_bytes
    assert ceiling is not None
    # A task document holds its params and its result together, beside the rest.
    assert 0 < 2 * ceiling + MARGIN <= largest
    assert ceiling > largest // 2 - MARGIN


async def test_params_and_a_result_of_max_value_bytes_fit_in_one_document(mongo_url: str):
    """Params and a result of ``max_value_bytes`` each, beside keys and a progress
    message of the longest kind (4-byte characters), make a document the server
    takes: its BSON size is at most ``maxBsonObjectSize``."""
    async with Taskmill(mongo_url, plugins=False, max_params_bytes=64 * MIB) as tm:
        ceiling = tm.storage.capabilities.max_value_bytes
        assert ceiling is not None
        wide = "😀"
        task_type = wide * 255
        result = "r" * (ceiling - json_size(""))

        @tm.handler(task_type, max_retries=0)
        async def echo(ctx: Context, params: dict[str, Any]) -> str:
            await ctx.progress(1, 1, wide * 4096)
            return result

        params = {"p": "p" * (ceiling - json_size({"p": ""}))}
        task = await tm.enqueue(task_type, params, dedupe_key=wide * 1024, user_id=wide * 255)
        await tm.run_worker(until_idle=True, **worker_args())
        done = await tm.get(task.id)
        assert done is not None
        assert done.status is TaskStatus.COMPLETED, done.error
        assert (done.params, done.result) == (params, result)
        assert done.progress == Progress(1.0, 1.0, wide * 4096)

        hello = await server_hello(mongo_url)
        client = raw_client(mongo_url)
        try:
            stored = await client.get_default_database().tasks.find_one({"_id": task.id})
        finally:
            await client.close()
        assert stored is not None
        assert len(bson.encode(stored)) <= int(hello["maxBsonObjectSize"])


async def test_a_document_the_driver_refuses_is_invalid_params_caused_by_it(
    store: MongoStorage,
):
    """PyMongo refuses a write whose first document alone exceeds the server's largest
    message (``DocumentTooLarge``, raised before anything is sent, so the test server
    does no work for it). The store's ``max_value_bytes`` keeps such values out, so this
    store's is widened past it after it opened (the core then lets the params
    through): the refusal is InvalidParams naming the limit, with the driver's error
    as its cause, nothing is stored, and the store goes on working."""
    vars(store)["capabilities"] = attrs.evolve(store.capabilities, max_value_bytes=64 * MIB)
    async with Taskmill(storage=store, plugins=False, max_params_bytes=64 * MIB) as tm:
        with pytest.raises(InvalidParams) as refused:
            await tm.enqueue("big", {"b": "x" * MESSAGE_SIZE})
        assert isinstance(refused.value.__cause__, DocumentTooLarge)
        assert "maxBsonObjectSize" in str(refused.value)
        assert await tm.query() == []
        small = await tm.enqueue("small", {"n": 1})
        assert [t.id for t in await tm.query()] == [small.id]
