"""``Slots``: the tasks one worker runs now, and the ones it claimed ahead of its slots.

A worker keeps ``concurrency`` slots, of which ``reserved_high_priority_slots`` only take
tasks at or above ``Priority.USER_ACTION``. With ``prefetch``, claimed tasks wait in a
local queue (RUNNING in the store, their leases renewed) until a slot is free, highest
priority first, then in claim order. Both count against each handler's ``concurrency``.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
from collections.abc import Callable, Iterator
from datetime import datetime

from taskmill.attempt_hooks import AttemptHooks
from taskmill.backoff import RetryPolicy
from taskmill.batch_calls import BatchCalls
from taskmill.batching import Batcher
from taskmill.canvas import CANVAS_KEY
from taskmill.context import Context, Spawner
from taskmill.errors import log_retried_failure
from taskmill.execution import AttemptRunner, Execution, cancel_soon
from taskmill.model import AttemptOutcome, Priority, Task
from taskmill.registry import Handler, HandlerRegistry, Retention
from taskmill.storage import (
    Finish,
    FinishKind,
    HandlerKey,
    Lease,
    ProgressUpdate,
    TaskStorage,
    utcnow,
)

log = logging.getLogger("taskmill.worker")

HIGH_PRIORITY = int(Priority.USER_ACTION)  # an int compares faster than the enum member
"""The lowest priority the reserved slots take."""

QueuedTask = tuple[int, int, Task, Handler]
"""A prefetched task in the local queue's heap: (-priority, claim order, task, handler)."""


class Slots:
    """What one worker runs and what it has claimed ahead, counted per handler key.

    :meth:`start` runs a claimed task through the :class:`AttemptRunner`, which frees
    the slot when the attempt ends; a freed slot starts the next prefetched task and
    calls ``wake``. Outcomes (and tasks given back unstarted) go to ``finished``.
    ``stopping`` true: prefetched tasks are no longer started.
    """

    def __init__(
        self,
        *,
        worker_id: str,
        concurrency: int,
        reserved_high_priority_slots: int,
        retry_policy: RetryPolicy,
        retention: Retention,
        storage: TaskStorage,
        registry: HandlerRegistry,
        plugins: AttemptHooks,
        spawner: Spawner,
        finished: Callable[[Finish, Task | None], None],
        wake: Callable[[], None],
        stopping: Callable[[], bool],
    ) -> None:
        self._worker_id = worker_id
        self._concurrency = concurrency
        self._general = concurrency - reserved_high_priority_slots
        self._storage = storage
        self._registry = registry
        self._spawner = spawner
        self._finished = finished
        self._wake = wake
        self._stopping = stopping
        self.running: dict[str, Execution] = {}
        """The attempts running now, by task id."""
        self.running_normal = 0
        """How many of them are below high priority (they may not use reserved slots)."""
        self.per_key: dict[HandlerKey, int] = {}
        """Tasks running or queued, per handler key (against each handler's cap)."""
        self.queued: list[QueuedTask] = []
        """The local queue of prefetched tasks (a heap)."""
        self.started = 0
        """Attempts started so far (the pace ``prefetch`` auto follows)."""
        self._queue_seq = itertools.count()
        batcher = Batcher(self._general)
        self.runner = AttemptRunner(
            worker_id=worker_id,
            storage=storage,
            plugins=plugins,
            retry_policy=retry_policy,
            retention=retention,
            batcher=batcher,
            finished=finished,
            free=self.free,
        )
        self._run = self.runner.run
        self._plugins = plugins
        self._batch_calls = BatchCalls(self.runner, batcher.size)

    def leases(self) -> Iterator[Lease]:
        """The leases of every running attempt not abandoned, then of every prefetched
        task."""
        for execution in self.running.values():
            if not execution.abandoned:
                yield execution.lease
        worker_id = self._worker_id
        for _, _, task, _ in self.queued:
            yield Lease(task_id=task.id, worker_id=worker_id, attempt=task.attempts)

    def start(
        self, task: Task, handler: Handler | None = None, started_at: datetime | None = None
    ) -> None:
        """Run a claimed task; ``handler`` given: it comes from the local queue, where it
        was counted against its handler's concurrency already."""
        counted = handler is not None
        if handler is None:
            handler = self._registry.lookup(task.app_id, task.task_type)
        lease = Lease(task_id=task.id, worker_id=self._worker_id, attempt=task.attempts)
        now = started_at or task.started_at or utcnow()
        if handler is None:  # unregistered since the claim: give it back untouched
            self._finished(
                Finish(
                    lease=lease,
                    kind=FinishKind.RELEASE,
                    outcome=AttemptOutcome.INTERRUPTED,
                    started_at=now,
                    finished_at=utcnow(),
                    error="no handler in this worker",
                ),
                None,
            )
            return
        key = handler.key
        ctx, control = Context.with_control(
            task, spawner=self._spawner, max_data_bytes=self._storage.capabilities.max_value_bytes
        )
        execution = Execution(
            task=task,
            handler=handler,
            key=key,
            lease=lease,
            ctx=ctx,
            control=control,
            started_at=now,
            high=task.priority >= HIGH_PRIORITY,
        )
        self.running[task.id] = execution
        self.started += 1
        if not execution.high:
            self.running_normal += 1
        if not counted:
            self.per_key[key] = self.per_key.get(key, 0) + 1
        if (
            handler.batch is not None
            and not self._plugins.intercepts_handlers
            and CANVAS_KEY not in task.params
        ):
            # One task runs the whole batch (taskmill.batch_calls); the general path
            # (a task per member) is for plugins wrapping each call and canvas members.
            execution.future = self._batch_calls.join(execution)
            return
        future = execution.future = asyncio.create_task(self._run(execution))
        if handler.is_async:
            # Bound to the future, not the execution: no reference cycle outlives the
            # attempt, so a finished execution is freed at once instead of by the GC.
            control.on_cancel(functools.partial(cancel_soon, future))

    def free(self, execution: Execution) -> None:
        """The attempt ended (or was given up): its slot takes the next task."""
        if self.running.pop(execution.task.id, None) is None:
            return
        if not execution.high:
            self.running_normal -= 1
        self.per_key[execution.key] -= 1
        if self.queued:
            self.start_queued()
        self._wake()

    async def close_batches(self) -> None:
        """Cancel the batch calls still gathering or running (the worker is going down;
        their members were given back)."""
        await self._batch_calls.close()
        await self.runner.batcher.close()

    def enqueue_local(self, task: Task) -> None:
        """Put a claimed task in the local queue (counted against its handler)."""
        handler = self._registry.lookup(task.app_id, task.task_type)
        if handler is None:
            self.start(task)  # gives it back untouched
            return
        self.per_key[handler.key] = self.per_key.get(handler.key, 0) + 1
        heapq.heappush(self.queued, (-task.priority, next(self._queue_seq), task, handler))

    def start_queued(self) -> None:
        """Start prefetched tasks while slots are free (normal ones only in the slots
        not reserved for high priority)."""
        general = self._general
        queued = self.queued
        while queued and not self._stopping() and len(self.running) < self._concurrency:
            task = queued[0][2]
            if task.priority < HIGH_PRIORITY and self.running_normal >= general:
                return  # the head is the highest priority queued: nothing else fits
            _, _, task, handler = heapq.heappop(queued)
            self.start(task, handler, started_at=utcnow())

    def drop_queued(self, task_ids: set[str]) -> list[tuple[Task, Handler]]:
        """Take these tasks out of the local queue (their counts too)."""
        kept: list[QueuedTask] = []
        dropped: list[QueuedTask] = []
        for item in self.queued:
            (dropped if item[2].id in task_ids else kept).append(item)
        if dropped:
            heapq.heapify(kept)
            self.queued = kept
            for _, _, _, handler in dropped:
                self.per_key[handler.key] -= 1
        return [(task, handler) for _, _, task, handler in dropped]

    def release_queued(self, error: str) -> None:
        """Give every prefetched task back (PENDING, the attempt not spent)."""
        queued, self.queued = self.queued, []
        now = utcnow()
        for _, _, task, handler in queued:
            self.per_key[handler.key] -= 1
            self._finished(
                Finish(
                    lease=Lease(task_id=task.id, worker_id=self._worker_id, attempt=task.attempts),
                    kind=FinishKind.RELEASE,
                    outcome=AttemptOutcome.INTERRUPTED,
                    started_at=task.started_at or now,
                    finished_at=now,
                    error=error,
                ),
                None,
            )

    async def save_progress(self, interval: float) -> None:
        """The progress duty: every ``interval`` seconds, write what the running
        handlers reported since the last round, in one call; forever."""
        while True:
            await asyncio.sleep(interval)
            updates = []
            for execution in self.running.values():
                progress, data = execution.control.take_changes()
                if progress is not None or data is not None:
                    updates.append(
                        ProgressUpdate(lease=execution.lease, progress=progress, data=data)
                    )
            if updates:
                try:
                    await self._storage.save_progress(updates)
                except Exception:
                    log_retried_failure(log, "saving progress of %d tasks failed", len(updates))
