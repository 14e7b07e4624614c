"""Running one attempt: call its handler and turn what happened into a ``Finish``.

An ``async def`` handler is awaited on the worker's loop; a plain ``def`` handler runs on
a handler thread (:mod:`taskmill.handler_threads`). The handler's return or exception
decides the outcome through :mod:`taskmill.lifecycle` (retry budget, interrupted
attempts); the handler's timeout, a result no store keeps and a handover to another
owner (:class:`~taskmill.Detached`) are decided here.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, cast

import attrs

from taskmill import tracebacks
from taskmill.attempt_hooks import AttemptHooks
from taskmill.backoff import RetryPolicy
from taskmill.batching import Batcher
from taskmill.canvas import CANVAS_KEY
from taskmill.canvas_inputs import ErrbackSkipped, member_params
from taskmill.context import Context
from taskmill.errors import Cancelled, Detached, Fail, Retry, TaskmillError
from taskmill.handler_threads import run_in_thread
from taskmill.headers import HEADERS_KEY
from taskmill.hosts import HandlerControl
from taskmill.lifecycle import FINISHES, decide_retry, finish_kind
from taskmill.model import AttemptOutcome, CancelReason, Task
from taskmill.registry import Handler, HandlerFunc, Retention
from taskmill.serialization import dumps
from taskmill.storage import Finish, FinishKind, HandlerKey, Lease, TaskStorage, utcnow
from taskmill.validation import is_text
from taskmill.waiting import within

log = logging.getLogger("taskmill.worker")

_NULL = dumps(None)
_FAILED_OUTCOMES = frozenset({AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT})


@attrs.define(eq=False)
class Execution:
    """One attempt running in a worker's slot."""

    task: Task
    handler: Handler
    key: HandlerKey
    lease: Lease
    ctx: Context
    """What the handler sees."""
    control: HandlerControl
    """The worker's side of ``ctx``: interrupt the handler, read back its reports."""
    started_at: datetime
    high: bool
    """Taken by a high-priority task (it may use a reserved slot)."""
    future: asyncio.Future[None] | None = None
    abandoned: bool = False
    """True once its outcome must not be written (lease lost, or given up at shutdown)."""


def cancel_soon(future: asyncio.Future[None]) -> None:
    """Cancel a running async handler (from any thread)."""
    if not future.done():
        future.get_loop().call_soon_threadsafe(future.cancel)


def log_failed_attempt(
    task: Task,
    outcome: AttemptOutcome,
    kind: FinishKind,
    error: str | None,
    retry_delay: float | None,
    failure: BaseException | None,
) -> None:
    """One log line per failed attempt, whatever failed it (an exception, a timeout, a
    result that is not JSON, ``Retry`` or ``Fail``), saying what happens next."""
    if kind is FinishKind.RETRY:
        next_step = f"retrying in {retry_delay or 0.0:.1f} s"
    else:
        next_step = "not retrying: the task is FAILED (dead letter; `taskmill retry` redrives it)"
    log.warning(
        "task %s (%s) attempt %d of %d %s: %s; %s",
        task.id,
        task.task_type,
        task.attempts,
        task.max_retries + 1,
        "timed out" if outcome is AttemptOutcome.TIMED_OUT else "failed",
        error,
        next_step,
        exc_info=failure,
    )


class AttemptRunner:
    """Runs attempts to their end for one worker.

    Each attempt ends in one of two ways: its ``Finish`` goes to ``finished`` (unless
    the execution was abandoned meanwhile) and its slot to ``free``; or its handler
    hands it over to another owner, and only the slot is freed.
    """

    def __init__(
        self,
        *,
        worker_id: str,
        storage: TaskStorage,
        plugins: AttemptHooks,
        retry_policy: RetryPolicy,
        retention: Retention,
        batcher: Batcher,
        finished: Callable[[Finish, Task | None], None],
        free: Callable[[Execution], None],
    ) -> None:
        self._worker_id = worker_id
        self._storage = storage
        self._plugins = plugins
        self._retry_policy = retry_policy
        self.retention = retention
        """The worker's defaults for what a finish deletes."""
        self.batcher = batcher
        """Where the attempts of batch handlers wait for their batch's call."""
        self._finished = finished
        self._free = free
        self.detached = 0
        """Attempts handed over to another owner."""

    async def run(self, execution: Execution) -> None:
        """Run ``execution``'s handler and settle its outcome."""
        try:
            plugins = self._plugins
            if plugins.intercepts_handlers:  # started hooks, handler contexts
                result = await plugins.run_handler(
                    execution.task,
                    execution.ctx,
                    self._worker_id,
                    functools.partial(self._call_handler, execution),
                )
            else:
                result = await self._call_handler(execution)
        except Detached as exc:
            await self.hand_over(execution, exc)
            return
        except (Cancelled, asyncio.CancelledError) as exc:
            current = asyncio.current_task()
            if current is not None and current.cancelling() > 0:
                if execution.ctx.cancel_reason is None and isinstance(exc, asyncio.CancelledError):
                    # The loop itself is going down: not the task's outcome.
                    self._free(execution)
                    raise
                current.uncancel()
            self.settle(execution, None, exc)
            return
        except Exception as exc:
            self.settle(execution, None, exc)
            return
        self.settle(execution, result, None)

    def settle(self, execution: Execution, result: Any, failure: BaseException | None) -> None:
        """Turn the handler's return (``failure`` None) or exception into the attempt's
        ``Finish``, hand it to the finish writer (unless the execution was abandoned)
        and free the slot."""
        task, ctx = execution.task, execution.ctx
        kind, outcome = FinishKind.COMPLETE, AttemptOutcome.COMPLETED
        result_json: str | None = None
        error: str | None = None
        retry_delay: float | None = None
        logged: BaseException | None = None  # an unexpected exception, logged with its trace
        where: str | None = None  # the traceback excerpt of an unexpected exception
        stopped_for: CancelReason | None = None  # why a Cancelled ended it
        if failure is None:
            try:
                result_json = _NULL if result is None else dumps(result)
            except (TypeError, ValueError) as exc:
                kind, outcome = FinishKind.FAIL, AttemptOutcome.FAILED
                error = f"handler result is not JSON-serializable: {exc}"
            else:
                error = self._oversize_result(result_json)
                if error is not None:
                    kind, outcome, result_json = FinishKind.FAIL, AttemptOutcome.FAILED, None
        elif isinstance(failure, Retry):
            kind, outcome, error = FinishKind.RETRY, AttemptOutcome.FAILED, str(failure)
            retry_delay = failure.delay
        elif isinstance(failure, Fail):
            kind, outcome, error = FinishKind.FAIL, AttemptOutcome.FAILED, str(failure)
        elif isinstance(failure, Cancelled | asyncio.CancelledError):
            reason = ctx.cancel_reason
            if reason is None and isinstance(failure, ErrbackSkipped):
                reason = CancelReason.PREEMPTED  # its canvas did not fail (docs/canvas.md)
            elif reason is None:
                reason = CancelReason.USER  # the handler raised it itself
            stopped_for = reason
            if reason.terminal:
                kind, outcome = FinishKind.CANCEL, AttemptOutcome.CANCELLED
            else:
                kind, outcome = FinishKind.RELEASE, AttemptOutcome.INTERRUPTED
            error = f"cancelled ({reason.value})"
        elif isinstance(failure, TimeoutError):
            timeout = execution.handler.timeout
            kind, outcome = FinishKind.RETRY, AttemptOutcome.TIMED_OUT
            error = f"timed out after {timeout} s" if timeout else f"TimeoutError: {failure}"
        else:
            kind, outcome = FinishKind.RETRY, AttemptOutcome.FAILED
            error = f"{type(failure).__name__}: {failure}"
            logged = failure
            if not isinstance(failure, TaskmillError):  # taskmill's own frames say nothing
                where = tracebacks.excerpt(failure)
        interrupted = ctx.cancel_reason
        if interrupted is not None and not interrupted.terminal:
            # A handler that turned SHUTDOWN/SUSPENDED into another error is still
            # interrupted: it goes back without spending the attempt.
            kind = finish_kind(kind, stop_requested=True)
            outcome = FINISHES[kind].outcome or outcome
        if kind is FinishKind.RETRY:
            decision = decide_retry(
                error or "",
                attempts=task.attempts,
                max_retries=task.max_retries,
                delay=retry_delay,
                backoff=self._retry_policy.delay,
            )
            kind, error = decision.kind, decision.error
            if kind is FinishKind.RETRY:
                retry_delay = decision.retry_in
        if outcome in _FAILED_OUTCOMES:
            log_failed_attempt(task, outcome, kind, error, retry_delay, logged)
        progress, data = execution.control.final_state()
        finish = Finish(
            lease=execution.lease,
            kind=kind,
            outcome=outcome,
            started_at=execution.started_at,
            finished_at=utcnow(),
            result_json=result_json,
            error=error if where is None else f"{error}\n{where}",
            retry_in=retry_delay or 0.0,
            cancel_reason=(ctx.cancel_reason or stopped_for) if kind is FinishKind.CANCEL else None,
            data=data,
            progress=progress,
            delete=execution.handler.deletes(kind, self.retention),
        )
        if not execution.abandoned:
            self._finished(finish, task)
        self._free(execution)

    async def _call_handler(self, execution: Execution) -> Any:
        handler, ctx, params = execution.handler, execution.ctx, execution.task.params
        if CANVAS_KEY in params:  # a chain's, group's or chord's task (docs/canvas.md)
            params = await member_params(
                self._storage, execution.task, batch=handler.batch is not None
            )
        if HEADERS_KEY in params:  # stored for the plugins (taskmill_task_headers)
            params = {key: value for key, value in params.items() if key != HEADERS_KEY}
        if handler.batch is not None:
            return await self.batcher.run(handler, ctx)
        func = cast(HandlerFunc, handler.func)
        if handler.is_async:
            coroutine = func(ctx, params)
            assert asyncio.iscoroutine(coroutine) or isinstance(coroutine, Awaitable)
            if handler.timeout is None:
                return await coroutine
            async with asyncio.timeout(handler.timeout):
                return await coroutine
        loop = asyncio.get_running_loop()
        # Copied here, on the loop: the thread sees the context variables set around
        # the call (by a plugin's handler context, say); a new thread has none.
        call = functools.partial(contextvars.copy_context().run, func, ctx, params)
        future = run_in_thread(loop, call)
        if handler.timeout is None:
            return await future
        try:
            return await within(future, handler.timeout)
        except TimeoutError:
            execution.control.expire()  # the thread cannot be killed: tell it to stop
            raise

    def _oversize_result(self, result_json: str) -> str | None:
        """The error of a result no store keeps (a lone surrogate) or larger than this
        store keeps in one value, or None. Retrying would give the same result, so the
        task fails at once."""
        if not result_json.isascii() and not is_text(result_json):
            return (
                "handler result is not valid Unicode text (a string in it holds a lone"
                " surrogate, often bytes decoded with errors='surrogateescape'); decode"
                " it properly, or return bytes as base64"
            )
        ceiling = self._storage.capabilities.max_value_bytes
        if ceiling is None or len(result_json) * 4 <= ceiling:
            return None
        size = len(result_json.encode("utf-8", "surrogatepass"))
        if size <= ceiling:
            return None
        return (
            f"handler result is {size} bytes as JSON, over the {ceiling} bytes"
            f" {type(self._storage).__name__} keeps in one value; store large outputs"
            " elsewhere and return a reference"
        )

    async def hand_over(self, execution: Execution, detached: Detached) -> None:
        """The handler gave its attempt to another owner: free the slot at once, and
        from now on write nothing for the attempt (no outcome, no progress, no lease
        renewal), so the task stays RUNNING under its lease until the new owner
        reports, or the lease expires and any worker rescues it."""
        self._free(execution)
        task = execution.task
        if execution.abandoned:
            # The lease was lost first (cancelled, rescued): there is nothing to hand
            # over, and the attempt was reported as taken.
            log.info("task %s: handed over after its lease was lost (%s)", task.id, detached)
            return
        self.detached += 1
        log.info(
            "task %s (%s) attempt %d detached (%s): the new owner reports it",
            task.id,
            task.task_type,
            task.attempts,
            detached,
        )
        try:
            if self._plugins.observes_detaches:
                await self._plugins.attempt_detached(task, self._worker_id)
        except Exception:
            log.exception("detached notification for task %s failed", task.id)
