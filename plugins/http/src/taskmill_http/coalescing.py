"""Group commit for ``POST /v1/tasks``: single-task creates that arrive together share
one ``enqueue_many`` call.

Each create on its own is one store transaction, and on PostgreSQL every enqueue
transaction takes the schema's event-log lock, so concurrent creates queue on commit
latency one by one. :class:`CreateCoalescer` keeps at most one ``enqueue_many`` call in
flight per app: while it runs, the creates that arrive wait together and go into the
next call. A lone create is stored at once (nothing waits for company).

Every create still gets its own answer. ``enqueue_many`` is all or none, so a call
refused because of one spec stored nothing: the coalescer then splits the batch in
halves and stores each half again, down to the one spec at fault, which alone gets the
error. Specs keep their arrival order through every split, so dedupe decides exactly as
for creates made one after another in that order.
"""

from __future__ import annotations

import asyncio

import attrs
from taskmill.errors import StorageUnavailable, TaskmillError
from taskmill.model import Task, TaskSpec
from taskmill.operations import TaskOperations


@attrs.define
class _Create:
    spec: TaskSpec
    answer: asyncio.Future[Task]


@attrs.define
class _AppQueue:
    """The creates of one app waiting for the next ``enqueue_many`` call."""

    operations: TaskOperations
    waiting: list[_Create] = attrs.Factory(list)
    storing: asyncio.Task[None] | None = None


class CreateCoalescer:
    """Stores single-task creates, coalescing the ones that arrive while a store call
    is in flight into one ``enqueue_many`` (at most ``max_batch`` specs) per app."""

    def __init__(self, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.max_batch = max_batch
        self._queues: dict[str | None, _AppQueue] = {}

    async def enqueue(self, operations: TaskOperations, spec: TaskSpec) -> Task:
        """Store ``spec`` with ``operations`` (``tm.for_app(app_id)``, or ``tm`` for an
        admin) and return its task; creates of the same app share store calls.

        Raises what ``operations.enqueue(spec)`` would raise for this spec alone; a
        store that is unavailable fails every create of the call with
        :class:`~taskmill.errors.StorageUnavailable`.
        """
        app_id = operations.app_id
        queue = self._queues.get(app_id)
        if queue is None:
            queue = self._queues[app_id] = _AppQueue(operations)
        answer: asyncio.Future[Task] = asyncio.get_running_loop().create_future()
        queue.waiting.append(_Create(spec, answer))
        if queue.storing is None:
            queue.storing = asyncio.create_task(self._store_waiting(app_id, queue))
        return await answer

    async def close(self) -> None:
        """Wait for the store calls in flight (every waiting create gets its answer)."""
        storing = [q.storing for q in self._queues.values() if q.storing is not None]
        await asyncio.gather(*storing, return_exceptions=True)

    async def _store_waiting(self, app_id: str | None, queue: _AppQueue) -> None:
        try:
            while queue.waiting:
                batch = queue.waiting[: self.max_batch]
                del queue.waiting[: self.max_batch]
                await self._store(queue.operations, batch)
        finally:
            queue.storing = None
            if queue.waiting:  # cancelled mid-way: nobody is left to answer them
                for create in queue.waiting:
                    _answer_error(create, StorageUnavailable("the service is stopping"))
                queue.waiting.clear()
            if self._queues.get(app_id) is queue:
                del self._queues[app_id]

    async def _store(self, operations: TaskOperations, batch: list[_Create]) -> None:
        try:
            tasks = await operations.enqueue_many([c.spec for c in batch])
        except StorageUnavailable as exc:
            for create in batch:
                _answer_error(create, exc)
        except TaskmillError as exc:
            if len(batch) == 1:
                _answer_error(batch[0], exc)
                return
            # Nothing was stored (all or none): find the spec at fault by halves.
            middle = len(batch) // 2
            await self._store(operations, batch[:middle])
            await self._store(operations, batch[middle:])
        except Exception as exc:
            for create in batch:
                _answer_error(create, exc)
        except BaseException as exc:  # cancelled: the waiters are cancelled with it
            for create in batch:
                _answer_error(create, exc)
            raise
        else:
            for create, task in zip(batch, tasks, strict=True):
                if not create.answer.done():
                    create.answer.set_result(task)


def _answer_error(create: _Create, exc: BaseException) -> None:
    if create.answer.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        create.answer.cancel()
    else:
        create.answer.set_exception(exc)
