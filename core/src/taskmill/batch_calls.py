"""Batch calls as one unit: the attempts of a batch handler's tasks run as one asyncio
task, not one each.

The general path (:class:`~taskmill.batching.Batcher`) runs every member's attempt as a
task of its own that joins the batch and waits for its outcome; that is what plugins
wrapping each handler call (``taskmill_task_started``, ``taskmill_handler_context``)
and canvas members (whose input is read before the call) need. Without either, the
worker starts a member by adding its execution to the handler's open batch here: the
batch's one task waits for the batch to fill (or ``max_wait``), calls the handler, and
settles each member's outcome through :meth:`AttemptRunner.settle`, which writes its
``Finish`` and frees its slot. The semantics are those of the general path
(docs/batches.md): each member keeps its slot, lease, progress and cancellation; a
member that is cancelled leaves at once (its outcome is then ignored), and a call every
member has left is cancelled.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from taskmill.batching import check_outcomes, invoke
from taskmill.errors import Detached
from taskmill.execution import AttemptRunner, Execution
from taskmill.model import CancelReason
from taskmill.registry import Handler
from taskmill.storage import HandlerKey
from taskmill.waiting import cancel_and_wait

__all__ = ["BatchCalls"]


class _Call:
    """One batch: its members while it gathers, then its call."""

    __slots__ = ("called", "members", "pending", "ready", "task", "timer")

    def __init__(self, ready: asyncio.Future[None]) -> None:
        self.members: list[Execution] = []
        """Who the call is for, in join order (a member leaving before the call is
        removed)."""
        self.pending: dict[str, Execution] = {}
        """The members whose outcome is not settled yet, by task id."""
        self.ready = ready
        """Done when the batch is full, or its ``max_wait`` has passed."""
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.called = False


class BatchCalls:
    """The batches of one worker's batch handlers, run as one task per batch."""

    def __init__(self, runner: AttemptRunner, size: Callable[[Handler], int]) -> None:
        self._runner = runner
        self._size = size
        self._open: dict[HandlerKey, _Call] = {}
        self._running: set[asyncio.Task[None]] = set()

    def join(self, execution: Execution) -> asyncio.Task[None]:
        """Add a started attempt to its handler's open batch; returns the task that
        runs the batch (done once every member's outcome is settled)."""
        handler, key = execution.handler, execution.key
        loop = asyncio.get_running_loop()
        call = self._open.get(key)
        if call is None:
            assert handler.batch is not None
            call = self._open[key] = _Call(loop.create_future())
            call.timer = loop.call_later(handler.batch.max_wait, self._start, key, call)
            task = call.task = loop.create_task(
                self._run(handler, call), name=f"taskmill batch {handler.task_type}"
            )
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        assert call.task is not None
        call.members.append(execution)
        call.pending[execution.task.id] = execution
        # From any thread (a handler thread cancels too); applied on the loop.
        # By task id: no reference cycle through the execution outlives the batch.
        execution.control.on_cancel(
            functools.partial(self._leave_soon, loop, key, call, execution.task.id)
        )
        if len(call.members) >= self._size(handler):
            self._start(key, call)
        return call.task

    def _start(self, key: HandlerKey, call: _Call) -> None:
        """Stop gathering: the batch is full, or its wait is over."""
        if self._open.get(key) is call:
            del self._open[key]
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if not call.ready.done():
            call.ready.set_result(None)

    def _leave_soon(
        self, loop: asyncio.AbstractEventLoop, key: HandlerKey, call: _Call, task_id: str
    ) -> None:
        loop.call_soon_threadsafe(self._leave, key, call, task_id)

    def _leave(self, key: HandlerKey, call: _Call, task_id: str) -> None:
        """A member was interrupted (cancelled, suspended, the worker stopping, its
        lease lost): it ends now; the call goes on for the others."""
        execution = call.pending.pop(task_id, None)
        if execution is None:
            return  # settled already
        if not call.called:
            call.members.remove(execution)
            if not call.members:  # nobody left to call it for
                self._start(key, call)
                assert call.task is not None
                call.task.cancel()
        elif not call.pending:
            assert call.task is not None
            call.task.cancel()
        self._runner.settle(execution, None, asyncio.CancelledError())

    async def _run(self, handler: Handler, call: _Call) -> None:
        settle = self._runner.settle
        try:
            await call.ready
            members = call.members
            if not members:
                return
            call.called = True
            outcomes = check_outcomes(
                handler, await invoke(handler, [m.ctx for m in members]), len(members)
            )
        except asyncio.CancelledError as exc:
            # Every member left, or the worker is going down: whoever is still waiting
            # goes back (PENDING, the attempt not spent).
            for execution in list(call.pending.values()):
                execution.control.interrupt(CancelReason.SHUTDOWN)
                del call.pending[execution.task.id]
                settle(execution, None, exc)
            raise
        except BaseException as exc:  # every member fails with it
            for execution in list(call.pending.values()):
                del call.pending[execution.task.id]
                settle(execution, None, exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            call.members = []  # no cycle through the members' cancel callbacks
        pending = call.pending
        for execution, outcome in zip(members, outcomes, strict=True):
            if pending.pop(execution.task.id, None) is None:
                continue  # it left: its outcome is ignored
            if isinstance(outcome, Detached):
                await self._runner.hand_over(execution, outcome)
            elif isinstance(outcome, BaseException):
                settle(execution, None, outcome)
            else:
                settle(execution, outcome, None)

    async def close(self) -> None:
        """Cancel the batches still gathering or running (the worker is going down;
        their members were given back)."""
        for key, call in list(self._open.items()):
            self._start(key, call)
        await cancel_and_wait(list(self._running))
