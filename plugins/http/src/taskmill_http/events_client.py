"""Reading ``GET /v1/events`` from Python: a Server-Sent Events parser and the
reconnecting iterator behind :meth:`taskmill_http.Client.events`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
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
                    elif message.event == READY and position is None:
                        position = str(message.data["position"])
        except (httpx.TransportError, httpx.StreamError) as exc:
            failures += 1
            if failures > 5:
                raise StorageUnavailable(
                    f"the event stream of {base_url} keeps failing: {exc}"
                ) from exc
            await asyncio.sleep(min(2.0, 0.05 * 2**failures))
