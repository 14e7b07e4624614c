"""``GET /v1/events`` through a real uvicorn server on SQLite and PostgreSQL: scoping,
gap-free resume, a hundred subscribers, a stalled subscriber, heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from taskmill import EventKind, InvalidCursor, TaskEvent, Taskmill, TaskStatus
from taskmill_http import Client, Limits, create_app
from taskmill_http.events_client import ServerEvent, server_events

from tests.http_support import TOKENS, serve, wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def tm(store_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(store_url, plugins=False) as taskmill:
        yield taskmill


@pytest.fixture
def app(tm: Taskmill) -> Any:
    return create_app(tm, TOKENS, limits=Limits(subscriber_queue=40, heartbeat_seconds=0.3))


@pytest.fixture
async def base_url(app: Any) -> AsyncIterator[str]:
    async with serve(app) as url:
        yield url


class Subscription:
    """One open event stream, its messages collected in the background."""

    def __init__(
        self,
        base_url: str,
        token: str,
        headers: dict[str, str] | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.messages: list[ServerEvent] = []
        self.ended = False
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            base_url=base_url, timeout=httpx.Timeout(10, read=None)
        )
        self._headers = {"Authorization": f"Bearer {token}", **(headers or {})}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Subscription:
        self._task = asyncio.create_task(self._read())
        async with asyncio.timeout(10):
            await self._ready.wait()
        return self

    async def _read(self) -> None:
        try:
            async with self._client.stream("GET", "/v1/events", headers=self._headers) as r:
                assert r.status_code == 200, await r.aread()
                assert r.headers["content-type"].startswith("text/event-stream")
                async for message in server_events(r):
                    self.messages.append(message)
                    self._ready.set()
        finally:
            self.ended = True
            self._ready.set()

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self._owns_client:
            await self._client.aclose()

    def of(self, event: str) -> list[ServerEvent]:
        return [m for m in self.messages if m.event == event]

    @property
    def last_id(self) -> str:
        ids = [m.id for m in self.messages if m.id is not None]
        return ids[-1]


async def test_job_updates_reach_only_the_apps_subscribers_and_every_admin(
    base_url: str, tm: Taskmill
):
    async with (
        Subscription(base_url, "tok-photos") as photos,
        Subscription(base_url, "tok-music") as music,
        Subscription(base_url, "tok-admin") as admin,
    ):
        assert photos.of("ready") and photos.messages[0].id is not None
        mine = await tm.for_app("photos").enqueue("resize", {"n": 1})
        theirs = await tm.for_app("music").enqueue("play")
        await tm.cancel(mine.id)
        await wait_for(lambda: len(admin.of("job_update")) == 3)
        await wait_for(lambda: len(photos.of("job_update")) == 2)
        kinds = [(m.data["kind"], m.data["task"]["id"]) for m in photos.of("job_update")]
        assert kinds == [("enqueued", mine.id), ("cancelled", mine.id)]
        assert [m.data["task"]["id"] for m in music.of("job_update")] == [theirs.id]
        assert photos.of("job_update")[1].data["status"] == "cancelled"


async def test_a_filter_naming_another_app_is_refused(base_url: str):
    async with httpx.AsyncClient(base_url=base_url) as http:
        response = await http.get(
            "/v1/events", params={"app_id": "music"}, headers={"Authorization": "Bearer tok-photos"}
        )
        assert response.status_code == 403
        bad = await http.get(
            "/v1/events",
            params={"since": "yesterday"},
            headers={"Authorization": "Bearer tok-photos"},
        )
        assert bad.status_code == 422


async def test_a_position_the_store_did_not_write_is_refused_with_a_json_422(
    base_url: str, tm: Taskmill
):
    await tm.enqueue("t")
    _, mine = await tm.storage.read_events(None)
    auth = {"Authorization": "Bearer tok-photos"}
    async with httpx.AsyncClient(base_url=base_url) as http:
        async with http.stream(
            "GET", "/v1/events", params={"since": f"{mine}.1"}, headers=auth
        ) as good:
            assert good.status_code == 200  # the store's own token is accepted
        for position in ("7", "12.5", "yesterday", f"x{mine}"):
            for resume in ({"Last-Event-ID": position}, {}):
                params = {} if resume else {"since": position}
                bad = await http.get("/v1/events", params=params, headers={**auth, **resume})
                assert bad.status_code == 422, position
                error = bad.json()["error"]
                assert error["code"] == "invalid_cursor"
                assert "event id" in error["message"]
        malformed = await http.get("/v1/events", params={"since": f"{mine}.x"}, headers=auth)
        assert malformed.status_code == 422
        assert malformed.json()["error"]["code"] == "invalid_query"


async def test_the_client_raises_invalid_cursor_for_a_token_the_store_did_not_write(
    base_url: str,
):
    async with Client(base_url, "tok-photos") as client:
        stream = client.events(since="not-a-cursor")
        with pytest.raises(InvalidCursor, match="event id"):
            await anext(stream)


async def test_a_dropped_connection_resumes_without_losing_or_repeating_events(
    base_url: str, tm: Taskmill
):
    photos = tm.for_app("photos")
    async with httpx.AsyncClient(base_url=base_url) as http:

        async def publish(n: int) -> None:
            await http.post(
                "/v1/app-events",
                json={"kind": "album", "scope": "a", "payload": {"n": n}},
                headers={"Authorization": "Bearer tok-photos"},
            )

        async with Subscription(base_url, "tok-photos") as first:
            for i in range(5):
                await photos.enqueue("t", {"i": i})
                await publish(i)
            await wait_for(lambda: len(first.of("job_update")) + len(first.of("app_entity")) == 10)
            resume_from = first.last_id
        # While nobody listens: more of both kinds.
        for i in range(5, 12):
            await photos.enqueue("t", {"i": i})
            await publish(i)
        async with Subscription(base_url, "tok-photos", {"Last-Event-ID": resume_from}) as second:
            await photos.enqueue("t", {"i": 12})
            await publish(12)
            await wait_for(
                lambda: len(second.of("job_update")) + len(second.of("app_entity")) == 16
            )
            await asyncio.sleep(0.3)  # anything repeated would arrive by now
            seen = first.messages + second.messages
    tasks = [m.data["task"]["params"]["i"] for m in seen if m.event == "job_update"]
    entities = [m.data["payload"]["n"] for m in seen if m.event == "app_entity"]
    assert tasks == list(range(13))
    assert entities == list(range(13))
    ids = [m.id for m in seen if m.event != "ready"]
    assert len(ids) == len(set(ids))


async def test_a_hundred_subscribers_each_get_every_event(base_url: str, tm: Taskmill):
    async with contextlib.AsyncExitStack() as stack:
        shared = await stack.enter_async_context(
            httpx.AsyncClient(
                base_url=base_url,
                timeout=httpx.Timeout(10, read=None),
                limits=httpx.Limits(max_connections=None),
            )
        )
        subscribers = await asyncio.gather(
            *(
                stack.enter_async_context(Subscription(base_url, "tok-music", client=shared))
                for _ in range(100)
            )
        )
        music = tm.for_app("music")
        tasks = await music.enqueue_many(
            [{"task_type": "t", "params": {"i": i}} for i in range(20)]
        )
        await wait_for(lambda: all(len(s.of("job_update")) == 20 for s in subscribers), timeout=30)
        expected = [t.id for t in tasks]
        for subscriber in subscribers:
            assert [m.data["task"]["id"] for m in subscriber.of("job_update")] == expected


async def test_a_stalled_subscriber_is_dropped_without_holding_up_the_others(
    base_url: str, app: Any
):
    host, port = base_url.removeprefix("http://").split(":")
    stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((host, int(port)))
    try:
        stalled.sendall(
            b"GET /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-photos\r\n\r\n"
        )
        async with Subscription(base_url, "tok-photos") as healthy:
            # Enough to fill the kernel's buffers between the server and the stalled
            # socket (which keeps its receive window small), then its queue.
            payload = {"blob": "x" * 200_000}
            async with httpx.AsyncClient(base_url=base_url) as http:
                for n in range(60):
                    response = await http.post(
                        "/v1/app-events",
                        json={"kind": "big", "payload": {**payload, "n": n}},
                        headers={"Authorization": "Bearer tok-photos"},
                    )
                    assert response.status_code == 202
            await wait_for(lambda: len(healthy.of("app_entity")) == 60)
            assert [m.data["payload"]["n"] for m in healthy.of("app_entity")] == list(range(60))
            # The stalled stream overflowed and was dropped; the healthy one remains.
            await wait_for(lambda: app.state.service.hub.subscribers == 1)
        # The stalled one was told where to resume from, then closed.
        stalled.settimeout(10)
        received = b""
        while b"event: overflow" not in received:
            chunk = await asyncio.to_thread(stalled.recv, 65536)
            assert chunk, "the stream ended without saying overflow"
            received += chunk
        assert b'"resume_from"' in received
    finally:
        stalled.close()


async def test_idle_streams_get_heartbeats(base_url: str):
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(5, read=5)) as http:
        headers = {"Authorization": "Bearer tok-photos"}
        async with http.stream("GET", "/v1/events", headers=headers) as response:
            lines: list[str] = []
            async for line in response.aiter_lines():
                lines.append(line)
                if line.startswith(": keep-alive"):
                    break
    assert lines[0].startswith("id: ")


async def _next(stream: AsyncIterator[TaskEvent]) -> TaskEvent:
    return await anext(stream)


async def test_the_client_yields_task_events_and_resumes_from_a_cursor(base_url: str, tm: Taskmill):
    async with Client(base_url, "tok-photos") as client:
        stream = client.events()
        first: asyncio.Task[TaskEvent] = asyncio.create_task(_next(stream))
        await asyncio.sleep(0.2)
        task = await client.enqueue("t")
        async with asyncio.timeout(10):
            event = await first
        assert event.kind is EventKind.ENQUEUED and event.task.id == task.id
        assert event.status is TaskStatus.PENDING
        await client.cancel(task.id)
        async with asyncio.timeout(10):
            later = await anext(stream)
        assert later.kind is EventKind.CANCELLED
        await stream.aclose()  # type: ignore[attr-defined]
        replay = client.events(since=event.cursor)
        async with asyncio.timeout(10):
            again = await anext(replay)
        assert again.cursor == later.cursor and again.kind is EventKind.CANCELLED
        await replay.aclose()  # type: ignore[attr-defined]
