"""Group commit of ``POST /v1/tasks`` (taskmill_http.coalescing), on SQLite and
PostgreSQL: creates that arrive together share one store call, and each still gets its
own task or its own error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from taskmill import InvalidParams, TaskFilter, Taskmill, TaskNotFound
from taskmill.errors import StorageUnavailable
from taskmill.model import Task, TaskSpec
from taskmill.storage import NewTask
from taskmill_http import create_app
from taskmill_http.coalescing import CreateCoalescer

from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def tm(store_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(store_url, plugins=False, max_params_bytes=1000) as taskmill:
        yield taskmill


@pytest.fixture
def store_calls(tm: Taskmill, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every ``enqueue`` call that reaches the store, in order."""
    calls: list[int] = []
    enqueue = tm.storage.enqueue

    async def counted(tasks: Sequence[NewTask]) -> list[Task]:
        calls.append(len(tasks))
        return await enqueue(tasks)

    monkeypatch.setattr(tm.storage, "enqueue", counted)
    return calls


async def settle(coalescer: CreateCoalescer, creates: list[tuple[Any, TaskSpec]]) -> list[Any]:
    """Send ``creates`` (operations, spec) together; each one's task or exception."""
    return await asyncio.gather(
        *(coalescer.enqueue(ops, spec) for ops, spec in creates), return_exceptions=True
    )


async def test_creates_that_arrive_together_share_one_store_call(
    tm: Taskmill, store_calls: list[int]
):
    photos = tm.for_app("photos")
    outcomes = await settle(
        CreateCoalescer(max_batch=100),
        [(photos, TaskSpec(task_type="t", params={"i": i})) for i in range(20)],
    )
    assert store_calls == [20]
    assert [t.params["i"] for t in outcomes] == list(range(20))
    assert len({t.id for t in outcomes}) == 20
    stored = await tm.query(TaskFilter(app_id="photos"), limit=100)
    assert sorted(t.id for t in stored) == sorted(t.id for t in outcomes)


async def test_a_store_call_holds_at_most_max_batch_creates(tm: Taskmill, store_calls: list[int]):
    music = tm.for_app("music")
    outcomes = await settle(
        CreateCoalescer(max_batch=8), [(music, TaskSpec(task_type="t")) for _ in range(20)]
    )
    assert store_calls == [8, 8, 4]
    assert all(t.app_id == "music" for t in outcomes)


async def test_a_bad_spec_among_coalesced_creates_fails_only_its_own(
    tm: Taskmill, store_calls: list[int]
):
    music_task = await tm.for_app("music").enqueue("t")
    store_calls.clear()
    photos = tm.for_app("photos")
    specs = [TaskSpec(task_type="t", params={"i": i}) for i in range(16)]
    specs[3] = TaskSpec(task_type="t", params={"i": 3}, parent_id=music_task.id)  # foreign
    specs[11] = TaskSpec(task_type="t", params={"big": "x" * 2000})  # past max_params_bytes
    outcomes = await settle(CreateCoalescer(max_batch=100), [(photos, s) for s in specs])

    assert isinstance(outcomes[3], TaskNotFound)
    assert isinstance(outcomes[11], InvalidParams)
    good = [o for i, o in enumerate(outcomes) if i not in (3, 11)]
    assert all(isinstance(t, Task) for t in good)
    assert [t.params["i"] for t in good] == [i for i in range(16) if i not in (3, 11)]
    stored = await tm.query(TaskFilter(app_id="photos"), limit=100)
    assert sorted(t.id for t in stored) == sorted(t.id for t in good)
    # The refused specs never reached the store; the halves that did were stored with
    # fewer calls than creates.
    assert sum(store_calls) == 14 and len(store_calls) < 14


async def test_dedupe_under_coalescing_decides_as_creates_in_arrival_order(
    tm: Taskmill, store_calls: list[int]
):
    photos = tm.for_app("photos")
    specs = [TaskSpec(task_type="t", params={"big": "x" * 2000}, dedupe_key="k")]  # refused
    specs += [TaskSpec(task_type="t", params={"i": i}, dedupe_key="k") for i in range(5)]
    outcomes = await settle(CreateCoalescer(max_batch=100), [(photos, s) for s in specs])

    assert isinstance(outcomes[0], InvalidParams)
    leader, *aliases = outcomes[1:]
    assert leader.alias_of is None and leader.params == {"i": 0}
    assert [a.alias_of for a in aliases] == [leader.id] * 4
    # A later create with the key, coalesced or not, is an alias of the same leader.
    (later,) = await settle(CreateCoalescer(max_batch=100), [(photos, specs[1])])
    assert later.alias_of == leader.id


async def test_each_app_gets_its_own_store_calls_and_only_its_tasks(
    tm: Taskmill, store_calls: list[int]
):
    photos, music = tm.for_app("photos"), tm.for_app("music")
    creates = [
        (photos if i % 2 else music, TaskSpec(task_type="t", params={"i": i})) for i in range(10)
    ]
    outcomes = await settle(CreateCoalescer(max_batch=100), creates)

    assert sorted(store_calls) == [5, 5]
    assert [t.app_id for t in outcomes] == ["photos" if i % 2 else "music" for i in range(10)]
    assert (await photos.progress_summary()).total == 5
    assert (await music.progress_summary()).total == 5


async def test_a_foreign_parent_cannot_be_reached_by_joining_an_admins_call(
    tm: Taskmill, store_calls: list[int]
):
    music_task = await tm.for_app("music").enqueue("t")
    store_calls.clear()
    creates = [
        (tm, TaskSpec(task_type="t", app_id="music", parent_id=music_task.id)),  # admin: fine
        (tm.for_app("photos"), TaskSpec(task_type="t", parent_id=music_task.id)),
    ]
    admin_child, photos_child = await settle(CreateCoalescer(max_batch=100), creates)

    assert isinstance(admin_child, Task) and admin_child.parent_id == music_task.id
    assert isinstance(photos_child, TaskNotFound)
    assert (await tm.for_app("photos").progress_summary()).total == 0


async def test_an_unavailable_store_fails_every_waiting_create_at_once(
    tm: Taskmill, store_calls: list[int]
):
    photos = tm.for_app("photos")
    await tm.storage.close()
    try:
        outcomes = await settle(
            CreateCoalescer(max_batch=100), [(photos, TaskSpec(task_type="t")) for _ in range(8)]
        )
    finally:
        await tm.storage.open()
    assert all(isinstance(o, StorageUnavailable) for o in outcomes)
    assert store_calls == [8]  # not split: the store, not a spec, is at fault
    assert (await photos.progress_summary()).total == 0


async def test_concurrent_posts_with_one_bad_spec_through_the_server(tm: Taskmill):
    music_task = await tm.for_app("music").enqueue("t")
    headers = {"Authorization": "Bearer tok-photos"}
    bodies: list[dict[str, Any]] = [{"task_type": "t", "params": {"i": i}} for i in range(50)]
    bodies[17]["parent_id"] = music_task.id
    bodies[30]["params"] = {"big": "x" * 2000}
    async with serve(create_app(tm, TOKENS)) as base_url:
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(base_url=base_url, timeout=10, limits=limits) as http:
            responses = await asyncio.gather(
                *(http.post("/v1/tasks", json=body, headers=headers) for body in bodies)
            )
    assert responses[17].status_code == 404
    assert responses[30].status_code == 422
    assert responses[30].json()["error"]["code"] == "invalid_params"
    created = [r for i, r in enumerate(responses) if i not in (17, 30)]
    assert [r.status_code for r in created] == [201] * 48
    assert [r.json()["params"]["i"] for r in created] == [i for i in range(50) if i not in (17, 30)]
    assert (await tm.for_app("photos").progress_summary()).total == 48


async def test_a_create_whose_caller_went_away_holds_up_no_other(tm: Taskmill):
    photos = tm.for_app("photos")
    coalescer = CreateCoalescer(max_batch=100)
    creates = [
        asyncio.create_task(coalescer.enqueue(photos, TaskSpec(task_type="t", params={"i": i})))
        for i in range(6)
    ]
    await asyncio.sleep(0)  # every create is waiting in the queue
    creates[2].cancel()  # as uvicorn does when a client disconnects
    outcomes = await asyncio.gather(*creates, return_exceptions=True)

    assert isinstance(outcomes[2], asyncio.CancelledError)
    answered = [t for i, t in enumerate(outcomes) if i != 2]
    assert [t.params["i"] for t in answered if isinstance(t, Task)] == [0, 1, 3, 4, 5]
    later = await coalescer.enqueue(photos, TaskSpec(task_type="t", params={"i": 6}))
    assert later.params == {"i": 6}


async def test_close_waits_for_the_creates_in_flight(tm: Taskmill):
    photos = tm.for_app("photos")
    coalescer = CreateCoalescer(max_batch=4)
    creates = [
        asyncio.create_task(coalescer.enqueue(photos, TaskSpec(task_type="t"))) for _ in range(10)
    ]
    await asyncio.sleep(0)
    await coalescer.close()
    assert all(c.done() and not c.cancelled() for c in creates)
    assert (await photos.progress_summary()).total == 10


async def test_a_lone_create_goes_to_the_store_alone_and_at_once(
    tm: Taskmill, monkeypatch: pytest.MonkeyPatch
):
    # No batch window: a lone create's store call starts with nothing else queued (it
    # does not wait for company), and the creates that arrive while it is in flight
    # wait together for the next call. The held store call is the only wait here.
    calls: list[int] = []
    entered, release = asyncio.Event(), asyncio.Event()
    enqueue = tm.storage.enqueue

    async def held(tasks: Sequence[NewTask]) -> list[Task]:
        calls.append(len(tasks))
        if len(calls) == 1:
            entered.set()
            await release.wait()
        return await enqueue(tasks)

    monkeypatch.setattr(tm.storage, "enqueue", held)
    photos = tm.for_app("photos")
    coalescer = CreateCoalescer(max_batch=100)
    lone = asyncio.create_task(coalescer.enqueue(photos, TaskSpec(task_type="t")))
    await entered.wait()
    assert calls == [1]
    queue = coalescer._queues["photos"]
    assert queue.waiting == [] and queue.storing is not None

    later = [
        asyncio.create_task(coalescer.enqueue(photos, TaskSpec(task_type="t", params={"i": i})))
        for i in range(5)
    ]
    await asyncio.sleep(0)
    assert len(queue.waiting) == 5 and calls == [1]  # queued behind the call in flight
    release.set()
    tasks = await asyncio.gather(lone, *later)

    assert calls == [1, 5]
    assert [t.params.get("i") for t in tasks] == [None, 0, 1, 2, 3, 4]
    assert coalescer._queues == {}  # nothing left waiting or in flight
