"""Batch handlers: the attempts of one handler's tasks, gathered into one call.

Every task of a batch handler is claimed, leased, renewed, cancelled and finished on
its own, exactly as any task: it holds a slot, has its own :class:`~taskmill.Context`
(progress, ``ctx.cancelled``) and its own outcome. Only the call is shared. An attempt
that starts waits in its handler's open batch; the batch is called when it holds
``max_size`` attempts (or as many as the worker's slots allow for the handler), or
``max_wait`` seconds after its first attempt joined. The call runs as a task of its own,
so that one member's cancellation never interrupts the others: that member leaves (its
outcome is then ignored), and a batch every member has left is cancelled.

The call returns one outcome per context, in order: a JSON value is that task's
result; an exception instance (``Fail``, ``Retry``, any error) is raised for that task
alone. Raising fails every task of the batch with that exception. Claims and finishes
are batched as for every task (one claim round trip for the free slots, the finish
writer's one ``finish_batch`` for the outcomes).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from taskmill.context import Context
from taskmill.handler_threads import run_in_thread
from taskmill.registry import BatchHandlerFunc, Handler
from taskmill.storage import HandlerKey
from taskmill.waiting import cancel_and_wait, within

__all__ = ["Batcher", "check_outcomes", "invoke"]


class _Batch:
    """One handler's batch while it gathers members and while its call runs."""

    __slots__ = ("call", "futures", "members", "timer")

    def __init__(self) -> None:
        self.members: list[Context] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.call: asyncio.Task[None] | None = None

    def left(self) -> bool:
        """Whether every member has left (cancelled) the batch."""
        return all(f.done() for f in self.futures)


class Batcher:
    """The open batches of one worker, by handler key."""

    def __init__(self, slots: int) -> None:
        self._slots = slots
        self._open: dict[HandlerKey, _Batch] = {}
        self._running: set[asyncio.Task[None]] = set()

    def size(self, handler: Handler) -> int:
        """How many attempts a batch of ``handler`` gathers before it is called: its
        ``max_size``, bounded by the slots a worker can give the handler (a waiting
        attempt holds one; the slots reserved for high priority are not counted)."""
        assert handler.batch is not None
        cap = self._slots if handler.concurrency is None else min(self._slots, handler.concurrency)
        return max(1, min(handler.batch.max_size, cap))

    async def run(self, handler: Handler, ctx: Context) -> Any:
        """Join ``handler``'s open batch with ``ctx`` and return this task's outcome
        (raise it, for an exception) once the batch has been called."""
        options = handler.batch
        assert options is not None
        key = (handler.app_id, handler.task_type)
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch()
            loop = asyncio.get_running_loop()
            batch.timer = loop.call_later(options.max_wait, self._dispatch, key, batch, handler)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        batch.members.append(ctx)
        batch.futures.append(future)
        if len(batch.members) >= self.size(handler):
            self._dispatch(key, batch, handler)
        try:
            return await future
        except asyncio.CancelledError:
            future.cancel()
            if batch.call is None:  # not called yet: leave it
                index = batch.futures.index(future)
                del batch.members[index], batch.futures[index]
                if not batch.members:
                    self._close(key, batch)
            elif batch.left():  # called, and nobody waits for it any more
                batch.call.cancel()
            raise

    def _close(self, key: HandlerKey, batch: _Batch) -> None:
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if self._open.get(key) is batch:
            del self._open[key]

    def _dispatch(self, key: HandlerKey, batch: _Batch, handler: Handler) -> None:
        self._close(key, batch)
        if batch.call is not None or not batch.members:
            return
        call = asyncio.get_running_loop().create_task(
            self._call(handler, batch), name=f"taskmill batch {handler.task_type}"
        )
        batch.call = call
        self._running.add(call)
        call.add_done_callback(self._running.discard)

    async def _call(self, handler: Handler, batch: _Batch) -> None:
        members, futures = list(batch.members), list(batch.futures)
        try:
            outcomes = check_outcomes(handler, await invoke(handler, members), len(members))
        except asyncio.CancelledError:
            for future in futures:
                if not future.done():
                    future.cancel()
            raise
        except BaseException as exc:  # every member fails with it
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        for future, outcome in zip(futures, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def close(self) -> None:
        """Cancel the batch calls still running (the worker is going down; their
        members were given back)."""
        for key, batch in list(self._open.items()):
            self._close(key, batch)
        await cancel_and_wait(list(self._running))


def check_outcomes(handler: Handler, outcomes: Any, members: int) -> Sequence[Any]:
    """``outcomes`` if it is one outcome per member; raises TypeError (failing every
    member) otherwise."""
    if isinstance(outcomes, str | bytes) or not isinstance(outcomes, Sequence):
        raise TypeError(
            f"batch handler {handler.task_type!r} returned {type(outcomes).__name__}"
            f" instead of a list of {members} outcomes, one per task"
        )
    if len(outcomes) != members:
        raise TypeError(
            f"batch handler {handler.task_type!r} returned {len(outcomes)} outcomes"
            f" for {members} tasks; return one per task, in order"
        )
    return outcomes


async def invoke(handler: Handler, members: list[Context]) -> Any:
    """Call the batch handler on the loop (``async def``) or a handler thread."""
    func = cast(BatchHandlerFunc, handler.func)
    timeout = handler.timeout
    if handler.is_async:
        coroutine = cast(Awaitable[Sequence[Any]], func(members))
        return await (coroutine if timeout is None else within(coroutine, timeout))
    loop = asyncio.get_running_loop()
    call: Callable[[], Any] = functools.partial(contextvars.copy_context().run, func, members)
    future = run_in_thread(loop, call)
    return await (future if timeout is None else within(future, timeout))
