"""``GET /v1/events``: live changes as Server-Sent Events, resumable without a gap.

One :class:`EventHub` per service process reads the store's event log once (woken by
the store's change listener where it has one, polling otherwise) and fans each event
out to every subscriber whose app may see it, so a hundred subscribers cost one read
per change, not a hundred. Events that live in the service's memory (external job
updates, app entities) go through the same hub.

Positions: an event's SSE ``id`` is ``T.L`` — ``T`` the store's event cursor (an
opaque token without ``"."``, see :meth:`~taskmill.storage.TaskStorage.read_events`),
``L`` the hub's own sequence number for in-memory events — the position *after* that
event. Store tokens are compared only with ``<``, never as numbers. A client that
reconnects with ``Last-Event-ID: T.L`` (or ``?since=T.L``) gets every task event after
``T`` from the store (within the workers' ``event_retention``) and every
in-memory event after ``L`` that this process still holds (the last
``local_buffer`` of them), then the live stream: nothing is lost or repeated.

Each subscriber has a bounded queue. The hub never waits for a subscriber: when one's
queue is full it is dropped, and the stream tells it ``event: overflow`` with the
position to resume from before closing, so a stalled client costs a bounded amount of
memory and holds up nobody.

Besides the streams, the hub feeds its *taps* (:meth:`EventHub.tap`): callbacks in this
process that see every task event the hub reads, such as the service's metrics
collector (:mod:`taskmill_http.metrics`), so they need no reader of their own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
from taskmill.app import Taskmill
from taskmill.errors import InvalidCursor
from taskmill.model import TaskEvent, TaskFilter
from taskmill.operations import event_matches
from taskmill.serialization import dumps, to_dict
from taskmill.storage import StoreChange

from taskmill_http.errors import ServiceError

log = logging.getLogger("taskmill.http.events")

JOB_UPDATE = "job_update"
"""A task changed: the data is a ``TaskEvent`` (``kind``, ``status``, ``at``, ``cursor``,
``task``)."""
EXTERNAL_JOB_UPDATE = "external_job_update"
"""An external job was upserted, progressed or completed: the data is its snapshot."""
APP_ENTITY = "app_entity"
"""An app published an entity change: ``{"app_id", "kind", "scope", "payload"}``."""
READY = "ready"
"""The first message of every stream: its ``id`` is where the stream starts."""
OVERFLOW = "overflow"
"""The subscriber fell too far behind and is dropped: reconnect with ``resume_from``."""

_POSITION = re.compile(r"^([^.\s]{1,200})(?:\.(\d{1,22}))?$")
_WAKE = frozenset({StoreChange.EVENTS})


@attrs.frozen
class Position:
    """Where a subscriber is: after store cursor ``task`` (the store's token) and
    in-memory seq ``local``."""

    task: str
    local: int

    def __str__(self) -> str:
        return f"{self.task}.{self.local}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """``T.L`` or ``T`` (then: in-memory events from now on), by its shape only:
        :meth:`EventHub.resume_position` also asks the store whether ``T`` is its own.

        :raises ServiceError: 422 for anything else.
        """
        match = _POSITION.match(text.strip())
        if match is None:
            raise ServiceError(
                422,
                "invalid_query",
                "a position is T.L or T (a store cursor, then an integer), as sent in an id",
            )
        local = match.group(2)
        return cls(match.group(1), -1 if local is None else int(local))


@attrs.define(eq=False)
class Subscriber:
    """One open stream: what it may see and the events waiting for it."""

    app_id: str | None
    filter: TaskFilter | None
    queue: asyncio.Queue[tuple[Position, str, bool] | None]
    """(position, frame, whether it is an in-memory event); None ends the stream."""
    overflowed: bool = False

    def may_see(self, app_id: str | None) -> bool:
        return self.app_id is None or app_id == self.app_id

    def offer(self, position: Position, frame: str, local: bool) -> bool:
        """Queue a frame without waiting. A full queue drops the subscriber: its
        queue is emptied and ends with None (then False is returned)."""
        try:
            self.queue.put_nowait((position, frame, local))
        except asyncio.QueueFull:
            self.overflowed = True
            while not self.queue.empty():  # free the memory at once
                self.queue.get_nowait()
            self.queue.put_nowait(None)
            return False
        return True


def sse_frame(event: str, data: Any, position: Position | None = None) -> str:
    """One Server-Sent Events message (``data`` as one line of JSON)."""
    head = f"id: {position}\n" if position is not None else ""
    return f"{head}event: {event}\ndata: {dumps(data)}\n\n"


class EventHub:
    """Reads the store's event log once per process and fans it out (see the module
    docstring). Started by the first subscriber or in-memory event (:meth:`start`);
    :meth:`close` stops it."""

    def __init__(
        self,
        tm: Taskmill,
        *,
        queue_size: int = 1000,
        local_buffer: int = 10_000,
        poll_interval: float = 0.2,
    ) -> None:
        self.tm = tm
        self.queue_size = queue_size
        self.poll_interval = poll_interval
        self._subscribers: set[Subscriber] = set()
        # In-memory events: (seq, app_id, event name, data) of the last ``local_buffer``.
        self._local: collections.deque[tuple[int, str | None, str, Any]] = collections.deque(
            maxlen=local_buffer
        )
        # Sequence numbers go on from a restart: a client's old position is below them.
        self._local_seq = time.time_ns() // 1000
        self._cursor: str | None = None
        self._reader: asyncio.Task[None] | None = None
        self._started = asyncio.Lock()
        self._taps: list[Callable[[list[TaskEvent]], None]] = []

    @property
    def subscribers(self) -> int:
        """Open streams now."""
        return len(self._subscribers)

    @property
    def position(self) -> Position:
        """Where a stream that starts now starts (after :meth:`start`)."""
        assert self._cursor is not None
        return Position(self._cursor, self._local_seq)

    def tap(self, callback: Callable[[list[TaskEvent]], None]) -> Callable[[], None]:
        """Call ``callback`` with every batch of task events the hub reads (from where
        it started reading: tap it before :meth:`start` to see every event from there),
        in commit order, whatever the streams. It runs in the hub's reader and must not
        block; an exception it raises is logged and the hub goes on. Returns the
        function that removes the tap."""
        self._taps.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._taps.remove(callback)

        return remove

    async def start(self) -> None:
        """Find the log's current cursor and start reading it (once)."""
        async with self._started:
            if self._reader is not None:
                return
            _, self._cursor = await self.tm.storage.read_events(None)
            self._reader = asyncio.create_task(self._read_loop(), name="taskmill-http-events")

    async def resume_position(self, text: str) -> Position:
        """The position a client sent (``Last-Event-ID`` or ``?since=``), checked.

        :raises ServiceError: 422 ``invalid_query`` for a malformed position.
        :raises InvalidCursor: (422 ``invalid_cursor``) for a ``T`` this store did not
            write, or one ahead of the store's current cursor (a store restored from a
            backup, another store): a stream from there would stay silent.
        """
        position = Position.parse(text)
        storage = self.tm.storage
        try:
            await storage.read_events(position.task, limit=0)
        except InvalidCursor as exc:
            raise InvalidCursor(
                f"{exc} (the T of a position T.L, as sent in an event id)"
            ) from None
        _, current = await storage.read_events(None)
        if current < position.task:  # store tokens compare with < only
            raise InvalidCursor(
                f"{position.task!r} is ahead of this store's event log (at {current!r}):"
                " the store was restored or replaced; reconnect without Last-Event-ID"
                " or since (the T of a position T.L, as sent in an event id)"
            )
        return position

    async def close(self) -> None:
        """Stop reading and end every stream."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        for subscriber in list(self._subscribers):
            self._subscribers.discard(subscriber)
            with contextlib.suppress(asyncio.QueueFull):
                subscriber.queue.put_nowait(None)

    # -- producing ------------------------------------------------------------------

    def publish(self, event: str, app_id: str | None, data: Any) -> Position:
        """Send an in-memory event (external job, app entity) to the subscribers that
        may see ``app_id``'s events; kept for resumes. Returns its position. The hub
        must be started (:meth:`start`): a position names the store's cursor."""
        if self._cursor is None:
            raise RuntimeError("EventHub.publish before EventHub.start")
        self._local_seq += 1
        seq = self._local_seq
        self._local.append((seq, app_id, event, data))
        position = Position(self._cursor, seq)
        frame: str | None = None
        for subscriber in list(self._subscribers):
            if subscriber.may_see(app_id):
                frame = frame or sse_frame(event, data, position)
                if not subscriber.offer(position, frame, True):
                    self._subscribers.discard(subscriber)
        return position

    async def _read_loop(self) -> None:
        storage = self.tm.storage
        listener = None
        try:
            listener = await storage.change_listener()
        except Exception:
            log.exception("the store's change notifications are unavailable; polling")
        delay = 0.01
        try:
            while True:
                assert self._cursor is not None
                try:
                    batch, cursor = await storage.read_events(self._cursor)
                except Exception:
                    log.exception("reading the event log failed; retrying")
                    await asyncio.sleep(1.0)
                    continue
                self._fan_out(batch)
                if cursor != self._cursor:
                    self._cursor = cursor
                    delay = 0.01
                    continue
                if listener is None:
                    await asyncio.sleep(delay)
                else:
                    await listener.wait(_WAKE, delay)
                delay = min(self.poll_interval, delay * 2)
        finally:
            if listener is not None:
                await listener.close()

    def _fan_out(self, batch: list[TaskEvent]) -> None:
        for tap in list(self._taps):
            if batch:
                try:
                    tap(batch)
                except Exception:
                    log.exception("an event tap failed")
        for event in batch:
            position = Position(event.cursor, self._local_seq)
            frame: str | None = None
            for subscriber in list(self._subscribers):
                if subscriber.may_see(event.task.app_id) and event_matches(
                    subscriber.filter, event
                ):
                    frame = frame or sse_frame(JOB_UPDATE, to_dict(event), position)
                    if not subscriber.offer(position, frame, False):
                        self._subscribers.discard(subscriber)

    # -- consuming ------------------------------------------------------------------

    async def stream(
        self,
        app_id: str | None,
        filter: TaskFilter | None,
        since: Position | None,
        *,
        heartbeat: float,
    ) -> AsyncIterator[str]:
        """The frames of one subscriber: ``ready``, the events after ``since`` (a gap-
        free catch-up), then live events, with a comment line every ``heartbeat``
        seconds of silence; ends with ``overflow`` when the subscriber falls behind."""
        await self.start()
        subscriber = Subscriber(app_id, filter, asyncio.Queue(self.queue_size))
        start = self.position
        self._subscribers.add(subscriber)
        try:
            if since is None:
                since = start
            elif since.local < 0:
                since = Position(since.task, start.local)
            position = since
            yield sse_frame(READY, {"position": str(position)}, position)
            async for frame, reached in self._catch_up(subscriber, since, start):
                position = reached
                yield frame
            position = Position(max(position.task, start.task), max(position.local, start.local))
            while True:
                item: tuple[Position, str, bool] | None
                try:
                    async with asyncio.timeout(heartbeat):
                        item = await subscriber.queue.get()
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if item is None:
                    if subscriber.overflowed and self._reader is not None:
                        yield sse_frame(OVERFLOW, {"resume_from": str(position)})
                    return
                at, frame, local = item
                # Already delivered by the catch-up (or by the replica the client
                # came from, when it is ahead of this one).
                if (at.local <= position.local) if local else (at.task <= position.task):
                    continue
                position = Position(max(at.task, position.task), max(at.local, position.local))
                yield frame
        finally:
            self._subscribers.discard(subscriber)

    async def _catch_up(
        self, subscriber: Subscriber, since: Position, start: Position
    ) -> AsyncIterator[tuple[str, Position]]:
        """Events between ``since`` and ``start`` (where live delivery began)."""
        storage = self.tm.storage
        task, local = since.task, since.local
        while task < start.task:
            batch, cursor = await storage.read_events(task)
            if cursor == task:
                break
            for event in batch:
                if event.cursor > start.task:
                    break
                if subscriber.may_see(event.task.app_id) and event_matches(
                    subscriber.filter, event
                ):
                    position = Position(event.cursor, local)
                    yield sse_frame(JOB_UPDATE, to_dict(event), position), position
            task = min(cursor, start.task)
        for seq, app_id, name, data in list(self._local):
            if local < seq <= start.local and subscriber.may_see(app_id):
                position = Position(start.task, seq)
                yield sse_frame(name, data, position), position
