"""The MySQL store under the server's ``max_allowed_packet`` (issue 25): the store reads
it when it opens and keeps every JSON value of a task within ``max_value_bytes``,
bulk writes are cut into packets that fit, and a statement the server still refuses as
too large is the caller's ``InvalidParams`` with the driver's error as its cause, never
``StorageUnavailable`` or the driver's own exception.

Every test runs against the MariaDB test server at its default ``max_allowed_packet``
(16 MiB). MariaDB refuses ``SET SESSION max_allowed_packet`` and the global value is
shared with other runs, so the refusal itself is reached by widening one store's
``max_value_bytes`` past the packet (see
:func:`test_a_statement_over_max_allowed_packet_is_invalid_params_caused_by_the_driver`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiomysql
import attrs
import pymysql
import pytest
from taskmill import Context, TaskFilter, Taskmill, TaskStatus
from taskmill.errors import InvalidParams
from taskmill.model import Progress
from taskmill.serialization import dumps
from taskmill.storage import ProgressUpdate
from taskmill.testing import claim, finish, lease_of, new_task
from taskmill.worker_options import WorkerArgs
from taskmill_mysql import MySQLStorage
from taskmill_mysql.options import parse_url
from taskmill_mysql.packets import MARGIN

MIB = 1024 * 1024


def worker_args() -> WorkerArgs:
    return WorkerArgs(handle_signals=False, min_poll_interval=0.01, poll_interval=0.05)


async def server_packet(url: str) -> int:
    """The server's global ``max_allowed_packet``, read on a connection of its own."""
    p = parse_url(url, {})
    conn = await aiomysql.connect(host=p.host, port=p.port, user=p.user, password=p.password)
    try:
        async with conn.cursor() as cursor:
            await cursor.execute("SELECT @@global.max_allowed_packet")
            (packet,) = await cursor.fetchone()
            return int(packet)
    finally:
        conn.close()


def quotes(size: int, overhead: int) -> str:
    """A string whose JSON (in a value of ``overhead`` more bytes) is exactly ``size``
    bytes, nearly all of it quotes: the JSON whose SQL string literal is largest
    (each quote escaped by JSON, and that and the backslash again by SQL)."""
    count, odd = divmod(size - overhead, 2)
    return '"' * count + "x" * odd


def json_size(value: Any) -> int:
    return len(dumps(value).encode())


def one_megabyte(i: int) -> dict[str, Any]:
    """Params of exactly 1,000,000 bytes as JSON, distinct per ``i``, full of characters
    that SQL escapes."""
    params: dict[str, Any] = {"i": i, "blob": ""}
    unit = "ab'c\\d\"e"  # 8 characters, 10 bytes as JSON
    count, rest = divmod(1_000_000 - json_size(params), json_size(unit) - 2)
    params["blob"] = unit * count + "x" * rest
    return params


@pytest.fixture
async def store(mysql_url: str) -> AsyncIterator[MySQLStorage]:
    store = MySQLStorage.from_url(mysql_url)
    await store.open()
    yield store
    await store.close()


async def test_a_store_reports_max_value_bytes_below_max_allowed_packet(store: MySQLStorage):
    packet = await server_packet(store.url)
    ceiling = store.capabilities.max_value_bytes
    assert ceiling is not None
    # A value may take twice its size as an SQL literal, beside the rest of its row.
    assert 0 < 2 * ceiling + MARGIN <= packet
    assert ceiling > packet // 2 - MARGIN


async def test_enqueue_many_of_30_one_megabyte_params_stores_and_reads_back_all_30(
    mysql_url: str,
):
    specs = [{"task_type": "big", "params": one_megabyte(i)} for i in range(30)]
    assert all(json_size(spec["params"]) == 1_000_000 for spec in specs)
    async with Taskmill(mysql_url, plugins=False) as tm:  # max_params_bytes: 1 MiB
        tasks = await tm.enqueue_many(specs)
        assert [t.params for t in tasks] == [spec["params"] for spec in specs]
        for stored, spec in zip(tasks, specs, strict=True):
            again = await tm.get(stored.id)
            assert again is not None and again.params == spec["params"]
        assert len(await tm.query(TaskFilter(statuses=[TaskStatus.PENDING]))) == 30


async def test_a_finish_batch_and_progress_of_30_one_megabyte_values_are_written(
    store: MySQLStorage,
):
    """Deferred statements that together exceed the packet are sent as several packets
    of one transaction: a progress batch and a finish batch of 30 tasks with 1 MB of
    data or result each."""
    await store.enqueue([new_task() for _ in range(30)])
    claimed = await store.claim_batch(claim(limit=30))
    assert len(claimed) == 30
    data = [one_megabyte(i) for i in range(30)]
    written = await store.save_progress(
        [ProgressUpdate(lease=lease_of(t), data=d) for t, d in zip(claimed, data, strict=True)]
    )
    assert written == {t.id for t in claimed}
    results = [one_megabyte(100 + i) for i in range(30)]
    done = await store.finish_batch(
        [finish(t, result=r) for t, r in zip(claimed, results, strict=True)]
    )
    assert [t.status if t else None for t in done] == [TaskStatus.COMPLETED] * 30
    for task, d, r in zip(claimed, data, results, strict=True):
        again = await store.get(task.id)
        assert again is not None
        assert (again.status, again.data, again.result) == (TaskStatus.COMPLETED, d, r)


async def test_params_and_a_result_of_max_value_bytes_of_quotes_are_kept(mysql_url: str):
    """The ceiling holds for the worst JSON: params and a result of nothing but quotes
    (an SQL literal twice their size), beside keys and a progress message of the
    longest kind (4-byte characters)."""
    async with Taskmill(mysql_url, plugins=False, max_params_bytes=64 * MIB) as tm:
        ceiling = tm.storage.capabilities.max_value_bytes
        assert ceiling is not None
        wide = "😀"
        task_type = wide * 255
        result = quotes(ceiling, json_size(""))
        assert json_size(result) == ceiling

        @tm.handler(task_type, max_retries=0)
        async def echo(ctx: Context, params: dict[str, Any]) -> str:
            await ctx.progress(1, 1, wide * 4096)
            return result

        params = {"q": quotes(ceiling, json_size({"q": ""}))}
        assert json_size(params) == ceiling
        task = await tm.enqueue(task_type, params, dedupe_key=wide * 1024, user_id=wide * 255)
        await tm.run_worker(until_idle=True, **worker_args())
        done = await tm.get(task.id)
        assert done is not None
        assert done.status is TaskStatus.COMPLETED, done.error
        assert done.params == params
        assert done.result == result
        assert done.progress == Progress(1.0, 1.0, wide * 4096)


@pytest.mark.parametrize("megabytes", [17, 40])
async def test_a_statement_over_max_allowed_packet_is_invalid_params_caused_by_the_driver(
    store: MySQLStorage, megabytes: int
):
    """The server refuses a packet over ``max_allowed_packet`` (error 1153; past 16 MiB
    the driver may see the connection's packet sequence break instead). The store's
    ``max_value_bytes`` keeps such values out, so this store's is widened past the
    packet after it opened (the core then lets the params through): what the server
    refuses is InvalidParams naming the limit, with the driver's error as its cause,
    nothing is stored, and the store goes on working."""
    packet = await server_packet(store.url)
    assert megabytes * MIB > packet
    vars(store)["capabilities"] = attrs.evolve(store.capabilities, max_value_bytes=64 * MIB)
    async with Taskmill(storage=store, plugins=False, max_params_bytes=64 * MIB) as tm:
        with pytest.raises(InvalidParams) as refused:
            await tm.enqueue("big", {"b": "x" * (megabytes * MIB)})
        assert isinstance(refused.value.__cause__, pymysql.err.MySQLError)
        assert "max_allowed_packet" in str(refused.value)
        assert str(packet) in str(refused.value)
        assert await tm.query() == []
        small = await tm.enqueue("small", {"n": 1})
        assert [t.id for t in await tm.query()] == [small.id]
