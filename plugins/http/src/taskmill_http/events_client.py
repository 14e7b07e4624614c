"""Reading ``GET /v1/events`` from Python: a Server-Sent Events parser and the
reconnecting iterator behind :meth:`taskmill_http.Client.events`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType
from typing import Any

import attrs
import httpx
from taskmill.errors import StorageUnavailable
from taskmill.model import TaskEvent, TaskFilter
from taskmill.serialization import converter

from taskmill_http.events import JOB_UPDATE, OVERFLOW, READY
from taskmill_http.wire import filter_params, raise_for_error


@attrs.frozen
class ServerEvent:
    """One message of an event stream."""

    event: str
    data: Any
    """The ``data`` field, parsed as JSON."""
    id: str | None = None


async def server_events(response: httpx.Response) -> AsyncIterator[ServerEvent]:
    """The messages of an open ``text/event-stream`` response (comments skipped)."""
    event, event_id = "message", None
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield ServerEvent(event, json.loads("\n".join(data)), event_id)
            event, data, event_id = "message", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            event_id = value


async def task_events(
    http: httpx.AsyncClient, base_url: str, filter: TaskFilter | None, since: str | None
) -> AsyncIterator[TaskEvent]:
    """``TaskEvent`` after ``since`` (default: from now), forever, read with ``http``
    (a client's connections to the service at ``base_url``); reconnects after a
    dropped connection or an overflow from the last position it saw."""
    async with contextlib.aclosing(_stream(http, base_url, filter, since)) as stream:
        async for item in stream:
            if item is not None:
                yield item


async def _stream(
    http: httpx.AsyncClient, base_url: str, filter: TaskFilter | None, since: str | None
) -> AsyncGenerator[TaskEvent | None, None]:
    """What :func:`task_events` yields, and None each time the stream is open (the
    service's ``ready`` read: it delivers every event from there on)."""
    position = since
    failures = 0
    while True:
        headers = {} if position is None else {"Last-Event-ID": position}
        try:
            async with http.stream(
                "GET",
                "/v1/events",
                params=filter_params(filter),
                headers=headers,
                timeout=httpx.Timeout(10.0, read=None),
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise_for_error(response)
                async for message in server_events(response):
                    failures = 0
                    if message.id is not None:
                        position = message.id
                    if message.event == JOB_UPDATE:
                        yield converter.structure(message.data, TaskEvent)
                    elif message.event == OVERFLOW:
                        position = str(message.data["resume_from"])
                        break
                    elif message.event == READY:
                        if position is None:
                            position = str(message.data["position"])
                        yield None
        except (httpx.TransportError, httpx.StreamError) as exc:
            failures += 1
            if failures > 5:
                raise StorageUnavailable(
                    f"the event stream of {base_url} keeps failing: {exc}"
                ) from exc
            await asyncio.sleep(min(2.0, 0.05 * 2**failures))


class Subscription:
    """An event stream that is open before the block it guards starts (see
    :meth:`taskmill_http.Client.subscribe`): an async iterator of ``TaskEvent``, which
    reconnects as :meth:`~taskmill_http.Client.events` does, closed when the block
    ends."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        filter: TaskFilter | None,
        since: str | None,
    ) -> None:
        self._stream = _stream(http, base_url, filter, since)

    async def open(self) -> Subscription:
        """Connect and wait until the service has the subscriber: every event from now
        on will be delivered.

        :raises InvalidCursor: ``since`` names a position the store did not write.
        """
        try:
            while await anext(self._stream) is not None:
                pass  # events before ready: none (ready is the first message)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def aclose(self) -> None:
        """Close the stream (its connection goes back to the client's pool)."""
        await self._stream.aclose()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> TaskEvent:
        while True:
            item = await anext(self._stream)
            if item is not None:
                return item

    async def __aenter__(self) -> Subscription:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
