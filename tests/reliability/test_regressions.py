"""The counterexamples the reliability suite's fuzzing found, kept as regression tests.

Each crashed (an exception that was not a TaskmillError) or stored a task no backend
could read back before the fix in core/src/taskmill/serialization.py or
core/src/taskmill/discovery.py; the MongoDB ones held every client up after a
``kill -9`` before the fix in taskmill_mongo's writer lock.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

import pytest
from taskmill import InvalidParams, InvalidTaskSpec, InvalidURL, Taskmill, TaskNotFound
from taskmill.discovery import storage_for_url
from taskmill.serialization import MAX_PARAMS_DEPTH
from taskmill_mongo.storage import _LOCK_SECONDS


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


async def test_a_lone_surrogate_in_params_is_refused_clearly(tm: Taskmill) -> None:
    # Was: UnicodeEncodeError from the size check.
    with pytest.raises(InvalidParams, match="lone surrogate"):
        await tm.enqueue("t", {"name": "a\ud800b"})
    with pytest.raises(InvalidParams, match="lone surrogate"):
        await tm.enqueue("t", {"\udfff": 1})
    assert await tm.query() == []


async def test_params_nested_deeper_than_the_limit_are_refused_and_the_limit_is_stored(
    tm: Taskmill,
) -> None:
    # Was: stored, then every read of the store failed with RecursionError (SQLite) or
    # the encoder's RecursionError escaped the enqueue.
    with pytest.raises(InvalidParams, match=f"more than {MAX_PARAMS_DEPTH} levels"):
        await tm.enqueue("t", nested(MAX_PARAMS_DEPTH + 1))
    with pytest.raises(InvalidParams, match="nest"):
        await tm.enqueue("t", nested(5000))
    task = await tm.enqueue("t", nested(MAX_PARAMS_DEPTH))
    [stored] = await tm.query()
    assert stored.id == task.id and stored.params == nested(MAX_PARAMS_DEPTH)


async def test_a_lone_surrogate_in_a_task_type_key_or_id_is_refused_and_an_id_is_not_found(
    tm: Taskmill,
) -> None:
    # Was: UnicodeEncodeError from the store (SQLite's driver) on enqueue, and on get()
    # of such an id (`taskmill show` printed a traceback).
    kept = await tm.enqueue("t", {"n": 1}, dedupe_key="k")
    for spec in (
        {"task_type": "t\ud800"},
        {"task_type": "t", "dedupe_key": "\udfff"},
        {"task_type": "t", "app_id": "a\ud800"},
        {"task_type": "t", "user_id": "\ud800"},
    ):
        with pytest.raises(InvalidTaskSpec, match="not valid Unicode text"):
            await tm.enqueue_many([spec, {"task_type": "t", "params": {"n": 2}}])
    # Nothing of a refused batch is stored, and what was stored before is intact.
    assert [(t.id, t.params, t.dedupe_key) for t in await tm.query()] == [(kept.id, {"n": 1}, "k")]
    assert await tm.get("\ud800") is None
    with pytest.raises(TaskNotFound):
        await tm.retry("x\ud800")


def test_a_path_like_url_with_a_nul_byte_is_refused_clearly() -> None:
    # Was: ValueError("embedded null byte") from os.path.expanduser("~\x00").
    with pytest.raises(InvalidURL, match="not a storage URL"):
        storage_for_url("~\x00")


def test_a_url_with_an_unbalanced_bracket_is_refused_clearly() -> None:
    # Was: ValueError("Invalid IPv6 URL") from urllib.
    with pytest.raises(InvalidURL, match="malformed storage URL"):
        storage_for_url("postgresql://[::1/db")
    with pytest.raises(InvalidURL, match="malformed storage URL"):
        storage_for_url("sqlite://[")


# -- MongoDB's writer lock (serialize_writes), found by the chaos run -----------------------

HOLD_THE_WRITER_LOCK = """
import asyncio, sys
from taskmill_mongo import MongoStorage

async def main() -> None:
    store = MongoStorage.from_url(sys.argv[1])
    await store.open()
    await store._lock(store._database())
    print("locked", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_mongo_writer_lock_holder_killed_with_sigkill_frees_it_within_its_lease(
    mongo_url: str,
) -> None:
    # Was: the lock held a fixed 30 s expiry, so every `kill -9` of a worker holding it
    # stopped every other client for 30 s (the chaos run crawled). Now the holder renews a
    # short lease (_LOCK_SECONDS) while it holds it; a dead holder frees it within that.
    async with Taskmill(mongo_url, plugins=False) as tm:
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLD_THE_WRITER_LOCK, mongo_url, stdout=asyncio.subprocess.PIPE
        )
        try:
            assert holder.stdout is not None
            line = await asyncio.wait_for(holder.stdout.readline(), 60)
            assert line.strip() == b"locked"
            # The holder renews its lease: a wait of twice the lease is still blocked.
            blocked = asyncio.create_task(tm.enqueue("t", {"n": 1}))
            await asyncio.sleep(2 * _LOCK_SECONDS)
            assert not blocked.done(), "the lock lapsed while its holder was alive"
            holder.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            await asyncio.wait_for(holder.wait(), 10)
            await asyncio.wait_for(blocked, 30)
            freed_after = time.monotonic() - killed_at
        finally:
            if holder.returncode is None:
                holder.kill()
                await asyncio.wait_for(holder.wait(), 10)
        # (10 s, not a bound derived from _LOCK_SECONDS: the old 30 s expiry must fail it.)
        assert freed_after < 10, f"the lock was freed {freed_after:.1f} s after the kill"
        assert [t.params for t in await tm.query()] == [{"n": 1}]
