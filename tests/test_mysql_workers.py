"""The worker registry on ``mysql://``, beyond the shared WorkerRegistryContract: the
schema is version 5 with the ``workers`` table, a record beyond what ``TEXT`` holds
(65,535 bytes) with 4-byte characters is kept byte for byte, ids sort by their bytes,
and the heartbeat is the server clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from taskmill_mysql import MySQLStorage, latest_version
from taskmill_mysql import schema as my_schema
from taskmill_mysql.readback import now
from taskmill_mysql.rows import as_datetime


@pytest.fixture
async def store(mysql_url: str) -> AsyncIterator[MySQLStorage]:
    storage = MySQLStorage.from_url(mysql_url)
    await storage.open()
    yield storage
    await storage.close()


def test_the_current_schema_is_version_5_with_the_workers():
    assert latest_version() == 5
    assert [m.name for m in my_schema.migrations()] == [
        "0001_initial.sql",
        "0002_dependencies.sql",
        "0003_rate_limits.sql",
        "0004_tombstones.sql",
        "0005_workers.sql",
    ]


async def test_a_record_beyond_text_with_four_byte_characters_is_kept(
    store: MySQLStorage,
) -> None:
    record = '{"pad":"' + "😀é'\\\"\t" * 9_000 + '"}'
    assert len(record.encode()) > 65_535
    await store.put_worker("w", record)
    (found,) = await store.workers()
    assert found.record == record


async def test_ids_sort_by_their_bytes_and_the_heartbeat_is_the_server_clock(
    store: MySQLStorage,
) -> None:
    ids = ["b", "a ", "a", "B", "é", "z"]
    for worker_id in ids:
        await store.put_worker(worker_id, "{}")
    found = await store.workers()
    assert [w.id for w in found] == sorted(ids, key=str.encode)
    server = as_datetime(await store._db.run(now, transaction=False))
    for one in found:
        assert timedelta(0) <= server - one.heartbeat_at < timedelta(seconds=5)
    assert await store.prune_workers(timedelta(days=1)) == 0
    assert await store.remove_worker("a ") is True
    assert "a " not in [w.id for w in await store.workers()]
