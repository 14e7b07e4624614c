"""The worker: claims tasks in batches, runs their handlers, writes outcomes in batches.

One worker is one asyncio loop in one process. It keeps ``concurrency`` slots, of which
``reserved_high_priority_slots`` only take tasks at or above ``Priority.USER_ACTION``.
Around the claim loop run four background duties: writing finished attempts (group
commit: whatever finished while the previous write was in flight goes in the next one),
saving coalesced progress, renewing leases (and learning of lost leases), and rescuing
other workers' expired leases.

A handler that raises :class:`~taskmill.Detached` hands its attempt over to another owner
(an HTTP receiver that answered 202): the worker frees the slot and forgets the attempt;
the owner reports its progress and outcome through the store, fenced by the lease.

Why one long module: the claim loop, the slots and the background duties (renewal,
watch, rescue, flushing outcomes) share one worker's state, and the stop path must reach
all of it at once; the options (worker_options.py), the host protocol (worker_host.py),
tracebacks and the waiting helpers live in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import heapq
import itertools
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from taskmill import tracebacks
from taskmill.backoff import RetryPolicy
from taskmill.context import Context
from taskmill.errors import (
    Cancelled,
    ConfigurationError,
    Detached,
    Fail,
    Retry,
    TaskmillError,
    log_retried_failure,
)
from taskmill.handler_threads import THREADS as HANDLER_THREADS
from taskmill.lifecycle import FINISHES, attempt_kind, finish_kind
from taskmill.limits import TypeLimit
from taskmill.model import AttemptOutcome, CancelReason, Priority, Task, TaskStatus
from taskmill.periodic import Scheduler
from taskmill.registry import Handler
from taskmill.serialization import dumps
from taskmill.storage import (
    ChangeListener,
    ClaimRequest,
    Finish,
    FinishKind,
    HandlerKey,
    Lease,
    ProgressUpdate,
    StoreChange,
    utcnow,
)
from taskmill.validation import is_text
from taskmill.waiting import cancel_and_wait, wait_event, within
from taskmill.worker_host import WorkerHost
from taskmill.worker_options import WorkerOptions

if TYPE_CHECKING:
    from taskmill.app import Taskmill

log = logging.getLogger("taskmill.worker")

_NULL = dumps(None)
_HIGH_PRIORITY = int(Priority.USER_ACTION)  # an int compares faster than the enum member
_FAILED_OUTCOMES = frozenset({AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT})
MAX_FINISH_BATCH = 500
"""The most outcomes one write carries; a backlog is written in several."""
SLOW_WRITE_SECONDS = 2.0
"""A write of outcomes that takes this long is logged: the store is slowing the worker."""


@attrs.define(eq=False)
class _Execution:
    task: Task
    handler: Handler
    key: HandlerKey
    lease: Lease
    ctx: Context
    started_at: datetime
    high: bool
    future: asyncio.Future[None] | None = None
    abandoned: bool = False
    """True once its outcome must not be written (lease lost, or given up at shutdown)."""


def _cancel_soon(future: asyncio.Future[None]) -> None:
    """Cancel a running async handler (from any thread)."""
    if not future.done():
        future.get_loop().call_soon_threadsafe(future.cancel)


# The first pause before waiting on the change listener again after a failed wait (and
# before claiming again after a failed claim).
_LISTEN_RETRY = 0.05
# The longest pause between claims while claiming fails (a store outage).
_CLAIM_RETRY_CAP = 5.0


def _run_in_thread(loop: asyncio.AbstractEventLoop, call: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run a sync handler on a handler thread (reused, never bounded: see
    :mod:`taskmill.handler_threads`), without blocking the loop."""
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def target() -> None:
        try:
            result, error = call(), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    HANDLER_THREADS.submit(target)
    return future


def _log_failed_attempt(
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


def default_worker_id() -> str:
    """``host:pid:random`` — unique per worker, readable in ``taskmill ls``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    """Runs the handlers of a :class:`~taskmill.Taskmill` against its storage.

    Build one with ``tm.worker(...)`` (its keyword arguments are the fields of
    :class:`~taskmill.WorkerOptions`). Use :meth:`run` (until :meth:`stop` or
    SIGTERM/SIGINT), :meth:`run_until_idle`, or :meth:`tick` from a loop you own. The
    worker uses its ``Taskmill`` only through :class:`~taskmill.WorkerHost`.
    """

    def __init__(self, taskmill: Taskmill, options: WorkerOptions | None = None) -> None:
        options = options or WorkerOptions()
        self._taskmill = taskmill
        self._host: WorkerHost = taskmill
        self.options = options
        """What the worker was built with (the attributes below resolve its defaults)."""
        concurrency = options.concurrency
        reserved_high_priority_slots = options.reserved_high_priority_slots
        if reserved_high_priority_slots is None:
            # One slot kept for urgent work, except in a one-slot worker: reserving its
            # only slot would leave nothing for normal tasks.
            reserved_high_priority_slots = 1 if concurrency > 1 else 0
        self.worker_id = options.worker_id or default_worker_id()
        self.concurrency = concurrency
        self.reserved_high_priority_slots = reserved_high_priority_slots
        self.task_types: frozenset[str] | None = options.task_types
        """Only these task types are claimed (None: every type with a handler)."""
        self.app_ids: frozenset[str | None] | None = options.app_ids
        """Only tasks of these apps are claimed (None for the host's own; None: all)."""
        self.lease_seconds = options.lease_seconds
        self.poll_interval = max(options.poll_interval, options.min_poll_interval)
        self.min_poll_interval = options.min_poll_interval
        self.rescue_interval = options.rescue_interval or max(0.05, options.lease_seconds / 3)
        self.progress_interval = options.progress_interval
        self.shutdown_grace = options.shutdown_grace
        self.retry_policy = options.retry_policy or RetryPolicy()
        self.handle_signals = options.handle_signals
        self.idle_horizon = options.idle_horizon
        self.cancel_check_interval = options.cancel_check_interval
        self.event_retention = options.event_retention
        self.cleanup_older_than = options.cleanup_older_than
        self.cleanup_interval = options.cleanup_interval
        self._last_cleanup = float("-inf")
        self.run_schedules = True
        """Run the scheduler loop (the periodic tasks of ``tm.schedules``) while serving
        with :meth:`run`; set False before :meth:`run` to leave firing to other
        workers. :meth:`run_until_idle` and :meth:`tick` never fire schedules."""
        self.scheduler: Scheduler | None = None
        """The scheduler loop of the current :meth:`run`, when it has one."""
        self.prefetch = options.prefetch
        """Tasks claimed ahead of the free slots into the local queue (0: none)."""
        self.finish_window = options.finish_window

        # The local queue of prefetched tasks: claimed (RUNNING in the store, leases
        # renewed) but not started; highest priority first, then in claim order.
        self._queued: list[tuple[int, int, Task, Handler]] = []
        self._queue_seq = itertools.count()

        self._running: dict[str, _Execution] = {}
        self._running_normal = 0
        self._per_key: dict[HandlerKey, int] = {}
        # Each outcome waits with the claimed snapshot only, so the execution behind it
        # (context, future, lease) is freed as soon as its handler returns.
        self._finishes: list[tuple[Finish, Task | None]] = []
        # The batch being written now: its tasks are still held (RUNNING in the store),
        # so they count against ``concurrency`` and their leases are renewed.
        self._in_flight: list[tuple[Finish, Task | None]] = []
        self._slow_store_since: float | None = None
        self._finish_ready: asyncio.Event | None = None
        self._flushed: asyncio.Event | None = None
        self._flushing = False
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._grace: float | None = None
        self._stopped: asyncio.Event | None = None
        self._active = False
        self._background: list[asyncio.Task[None]] = []
        self._last_rescue = 0.0
        self._flush_deadline: float | None = None
        self._listener: ChangeListener | None = None
        self._check_leases_now = asyncio.Event()
        self._signals = 0
        self._force_exit: threading.Timer | None = None
        self.stop_signal: signal.Signals | None = None
        """The signal that stopped the worker (None: stopped by :meth:`stop` or idle)."""
        self.forced = False
        """True when a second signal cut the grace period short."""
        self.processed = 0
        """Attempts this worker finished (any outcome)."""
        self.detached = 0
        """Attempts this worker handed over to another owner (the handler raised
        :class:`~taskmill.Detached`); not counted in :attr:`processed`."""

    # -- public API -------------------------------------------------------------------

    @property
    def taskmill(self) -> Taskmill:
        """The :class:`~taskmill.Taskmill` whose handlers and storage this worker uses."""
        return self._taskmill

    @property
    def running(self) -> int:
        """Handlers running now."""
        return len(self._running)

    @property
    def held(self) -> int:
        """Tasks this worker holds in the store: running handlers plus outcomes not yet
        written, plus prefetched tasks. Never more than ``concurrency + prefetch``: claims
        wait for the writes. An attempt
        handed over to another owner (:class:`~taskmill.Detached`) is no longer held."""
        return len(self._running) + len(self._queued) + len(self._finishes) + len(self._in_flight)

    @property
    def queued(self) -> int:
        """Prefetched tasks waiting in the local queue for a slot (see ``prefetch``)."""
        return len(self._queued)

    async def run(self) -> None:
        """Claim and run tasks until :meth:`stop` is called or SIGTERM/SIGINT arrives.

        On stop, the worker takes no new tasks, lets running ones finish for the grace
        period, then interrupts the rest with SHUTDOWN (back to PENDING without spending
        an attempt) and writes every outcome before returning.
        """
        await self._serve(until_idle=False)

    async def run_until_idle(self) -> None:
        """Run until nothing is running and no task of this worker's types is due
        within ``idle_horizon`` seconds (retries waiting out a backoff are due soon, so
        they are run, not abandoned). Returns after writing every outcome."""
        await self._serve(until_idle=True)

    async def tick(self) -> int:
        """Claim one batch (up to the free slots), run it to the end, write the outcomes,
        and return how many tasks were run. For a loop the caller owns; also rescues
        expired leases when ``rescue_interval`` has passed."""
        self._prepare()
        duties = [
            asyncio.create_task(self._renew_leases_loop()),
            asyncio.create_task(self._watch_leases_loop()),
            asyncio.create_task(self._save_progress_loop()),
            asyncio.create_task(self._flush_loop()),
        ]
        try:
            if time.monotonic() - self._last_rescue >= self.rescue_interval:
                await self._rescue_once()
            claimed, _ = await self._fill_slots(prefetch=False)
            futures = [e.future for e in list(self._running.values()) if e.future]
            if futures:
                await asyncio.gather(*futures, return_exceptions=True)
            await self._flush_all()
            return claimed
        finally:
            await cancel_and_wait(duties)
            self._release_resources()

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking tasks and return once the worker has shut down.

        :param grace: seconds running handlers get to finish before they are
            interrupted with SHUTDOWN (default: ``shutdown_grace``). 0 interrupts at once.
        """
        self._stopping = True
        if grace is not None:
            self._grace = grace if self._grace is None else min(self._grace, grace)
        if self._wake is not None:
            self._wake.set()
        if self._active and self._stopped is not None:
            await self._stopped.wait()

    def notify(self) -> None:
        """Wake the claim loop: new work may be available (in-process enqueue)."""
        if self._wake is not None:
            self._wake.set()

    # -- serving ----------------------------------------------------------------------

    def _prepare(self) -> None:
        self._wake = asyncio.Event()
        self._finish_ready = asyncio.Event()
        self._flushed = asyncio.Event()
        self._flushed.set()
        self._stopped = asyncio.Event()

    def _release_resources(self) -> None:
        self._flush_deadline = None

    async def _serve(self, *, until_idle: bool) -> None:
        if self._active:
            raise RuntimeError("this worker is already running")
        if self.run_schedules and not until_idle:
            self._check_schedules_against_cleanup()
        self._check_limits_supported()
        self._prepare()
        assert self._stopped is not None
        self._host.attach_worker(self)
        self._active = True
        self._stopping = False
        self._grace = None
        self._signals = 0
        self.stop_signal = None
        self.forced = False
        leave_signals = self._take_signals()
        try:
            self._background = [
                asyncio.create_task(self._flush_loop(), name="taskmill-flush"),
                asyncio.create_task(self._renew_leases_loop(), name="taskmill-leases"),
                asyncio.create_task(self._watch_leases_loop(), name="taskmill-watch"),
                asyncio.create_task(self._save_progress_loop(), name="taskmill-progress"),
                asyncio.create_task(self._rescue_loop(), name="taskmill-rescue"),
            ]
            schedules = self._taskmill.schedules
            if self.run_schedules and schedules and not until_idle:
                self.scheduler = Scheduler(self._taskmill, interval=self.poll_interval)
                self._background.append(
                    asyncio.create_task(
                        self.scheduler.run(on_enqueued=[lambda _: self.notify()]),
                        name="taskmill-scheduler",
                    )
                )
            self._listener = await self._open_listener()
            if self._listener is not None:
                self._background.append(
                    asyncio.create_task(self._listen_loop(self._listener), name="taskmill-listen")
                )
            if self._host.plugins.observes_workers:
                await self._host.plugins.worker_started(self)
            await self._claim_loop(until_idle=until_idle)
        finally:
            try:
                await self._shutdown()
            finally:
                leave_signals()
                if self._force_exit is not None:
                    self._force_exit.cancel()
                    self._force_exit = None
                self._host.detach_worker(self)
                self._active = False
                self._stopped.set()

    def _check_limits_supported(self) -> None:
        """Refuse to serve handlers with global limits from a store that cannot enforce
        them in its claims (they would silently not hold)."""
        storage = self._host.storage
        if storage.capabilities.global_limits:
            return
        limited = sorted(h.task_type for h in self._host.registry if h.limit is not None)
        if limited:
            raise ConfigurationError(
                f"handlers {', '.join(map(repr, limited))} have rate_limit or"
                f" global_concurrency, but {type(storage).__name__} cannot enforce global"
                " limits in its claims (docs/backends.md lists each backend's gaps);"
                " remove those options or use another store"
            )

    def _check_schedules_against_cleanup(self) -> None:
        """Refuse a ``cleanup_older_than`` that could delete a fire a starting
        scheduler would enqueue again (a double fire; see docs/scheduling.md)."""
        older_than = self.cleanup_older_than
        if older_than is None:
            return
        for schedule in self._taskmill.schedules:
            if schedule.lookback >= older_than:
                raise ConfigurationError(
                    f"schedule {schedule.name!r} may enqueue fires from the last"
                    f" {schedule.lookback} but this worker deletes finished tasks"
                    f" after {older_than}, so a fire could run twice; make"
                    " cleanup_older_than longer than the schedule's catch_up_window, or"
                    " the window shorter"
                )

    async def _claim_loop(self, *, until_idle: bool) -> None:
        assert self._wake is not None
        poll = self.min_poll_interval
        retry = _LISTEN_RETRY
        while not self._stopping:
            self._wake.clear()
            failed = False
            try:
                claimed, drained = await self._fill_slots(coalesce=True)
            except Exception:
                log_retried_failure(log, "claiming failed; retrying in %.2f s", retry)
                claimed, drained, failed = 0, True, True
            if claimed:
                poll = self.min_poll_interval
            has_free = self.held < self.concurrency + self.prefetch
            if claimed and has_free and not drained:
                continue  # a full batch came back: there may be more
            timeout: float | None = poll if has_free else None
            if failed:
                # A failed claim (the store is down or restarting) is retried from a
                # short pause, doubling up to 5 s (or poll_interval if shorter): not at
                # the poll pace, which a worker relying on notifications sets long. Its
                # listener may have reported the store's return while this claim failed.
                timeout = retry
                retry = min(self.poll_interval, _CLAIM_RETRY_CAP, retry * 2)
            else:
                retry = _LISTEN_RETRY
            # Only a claim that found nothing can mean idle: asking the store when work
            # is next due is a query of its own (on SQLite a scan of pending tasks).
            if (
                until_idle
                and drained
                and not claimed
                and not failed  # a claim that failed says nothing about idleness
                and not self._running
                and not self._queued
                and (not self._finishes)
            ):
                try:
                    await self._flush_all()
                    if await self._rescue_once():
                        continue  # expired leases of dead workers are work, not idleness
                    due_in = await self._seconds_until_due()
                except Exception:
                    # The store is unreachable (a server restart): not idle, retry.
                    log_retried_failure(
                        log, "checking for due work failed; retrying in %.1f s", poll
                    )
                    due_in = poll
                    poll = min(self.poll_interval, poll * 2)
                if due_in is None or due_in > self.idle_horizon:
                    return
                timeout = max(self.min_poll_interval, min(due_in, self.poll_interval))
            if await wait_event(self._wake, timeout):
                continue
            if not failed:
                poll = min(self.poll_interval, poll * 2)

    def served_handlers(self) -> list[Handler]:
        """The handlers this worker claims for: the registry's, narrowed by
        ``task_types`` and ``app_ids``."""
        return [
            h
            for h in self._host.registry
            if (self.task_types is None or h.task_type in self.task_types)
            and (self.app_ids is None or h.app_id in self.app_ids)
        ]

    async def _seconds_until_due(self) -> float | None:
        keys = [h.key for h in self.served_handlers()]
        if not keys:
            return None
        due = await self._host.storage.next_run_at(keys)
        if due is None:
            return None
        return max(0.0, (due - utcnow()).total_seconds())

    def _claim_handlers(self) -> dict[HandlerKey, int | None]:
        handlers: dict[HandlerKey, int | None] = {}
        served = {h.key for h in self.served_handlers()}
        for handler in self._host.registry:
            if handler.key not in served:
                # Filtered out, but kept in the request with room 0, like a full handler:
                # left out, its app's tasks would be claimed through the host's key.
                handlers[handler.key] = 0
            elif handler.concurrency is None:
                handlers[handler.key] = None
            else:
                # A full handler stays in the request with room 0: left out, its app's
                # tasks would be claimed through the host handler's key instead.
                room = handler.concurrency - self._per_key.get(handler.key, 0)
                handlers[handler.key] = max(0, room)
        return handlers

    def _claim_limits(self, handlers: dict[HandlerKey, int | None]) -> dict[HandlerKey, TypeLimit]:
        """The global limits of the handlers this claim may take for."""
        limits: dict[HandlerKey, TypeLimit] = {}
        for handler in self._host.registry:
            limit = handler.limit
            if limit is not None and handlers.get(handler.key, 0) != 0:
                limits[handler.key] = limit
        return limits

    async def _fill_slots(
        self, *, prefetch: bool = True, coalesce: bool = False
    ) -> tuple[int, bool]:
        """Claim into free slots (and the local queue, with ``prefetch``); returns
        (claimed, drained) where drained means nothing more is claimable into the free
        slots right now. :meth:`tick` claims one batch into free slots only.

        ``coalesce`` (the claim loop): while outcomes are being written, a claim for
        fewer than half the general slots waits for that write, whose end wakes the
        claim loop, and then claims for every slot it freed as well. Claiming each freed
        slot at once splits a busy worker's tasks into trains that never merge again
        (at concurrency 10: claims and writes of 1 and 8 tasks, alternating), each
        paying a claim and a write of its own (docs/benchmarks.md, "Claims that wait
        for the write in flight")."""
        if self._stopping:
            return 0, False
        if self.prefetch and prefetch:
            return await self._fill_queue()
        general = self.concurrency - self.reserved_high_priority_slots
        claimed = 0
        for min_priority in (None, _HIGH_PRIORITY):
            # A slot is free once its outcome is written, not when its handler returns:
            # a slow store then slows claiming down instead of piling up RUNNING tasks.
            free = self.concurrency - self.held
            if min_priority is None:
                free = min(free, general - self._running_normal)
                if coalesce and 0 < free < general // 2 and (self._finishes or self._in_flight):
                    return claimed, False  # not drained: the write's end wakes the loop
            if free <= 0:
                continue
            handlers = self._claim_handlers()
            if not any(room is None or room > 0 for room in handlers.values()):
                return claimed, True
            batch = await self._claim(free, min_priority, handlers)
            for task in batch:
                self._start(task)
            claimed += len(batch)
            if len(batch) < free:
                return claimed, True
            if min_priority is None and batch[-1].priority < _HIGH_PRIORITY:
                # A claim takes the highest priorities first, so nothing the reserved
                # slots may take was left behind: claiming for them would find nothing.
                return claimed, True
        return claimed, False

    async def _claim(
        self,
        limit: int,
        min_priority: int | None,
        handlers: dict[HandlerKey, int | None] | None = None,
    ) -> list[Task]:
        if handlers is None:
            handlers = self._claim_handlers()
        return await self._host.storage.claim_batch(
            ClaimRequest(
                worker_id=self.worker_id,
                handlers=handlers,
                limit=limit,
                lease_seconds=self.lease_seconds,
                min_priority=min_priority,
                limits=self._claim_limits(handlers),
            )
        )

    async def _fill_queue(self) -> tuple[int, bool]:
        """With ``prefetch``: claim up to ``concurrency + prefetch`` held tasks into the
        local queue, then start what the free slots take.

        Claims are adaptive: while the queue still feeds every slot, the worker waits
        until a quarter of its capacity is free, so claims come in batches instead of
        one row per finished task; with the queue empty it claims whatever is free.
        """
        capacity = self.concurrency + self.prefetch
        free = capacity - self.held
        starving = len(self._queued) < self.concurrency - len(self._running)
        if free <= 0 or (not starving and free < max(1, capacity // 4)):
            self._start_queued()
            return 0, False
        handlers = self._claim_handlers()
        if not any(room is None or room > 0 for room in handlers.values()):
            self._start_queued()
            return 0, True
        batch = await self._claim(free, None, handlers)
        for task in batch:
            self._enqueue_local(task)
        self._start_queued()
        return len(batch), len(batch) < free

    def _enqueue_local(self, task: Task) -> None:
        handler = self._host.registry.lookup(task.app_id, task.task_type)
        if handler is None:
            self._start(task)  # gives it back untouched
            return
        self._per_key[handler.key] = self._per_key.get(handler.key, 0) + 1
        heapq.heappush(self._queued, (-task.priority, next(self._queue_seq), task, handler))

    def _start_queued(self) -> None:
        """Start prefetched tasks while slots are free (normal ones only in the slots
        not reserved for high priority)."""
        general = self.concurrency - self.reserved_high_priority_slots
        queued = self._queued
        while queued and not self._stopping and len(self._running) < self.concurrency:
            task = queued[0][2]
            if task.priority < _HIGH_PRIORITY and self._running_normal >= general:
                return  # the head is the highest priority queued: nothing else fits
            _, _, task, handler = heapq.heappop(queued)
            self._start(task, handler, started_at=utcnow())

    def _drop_queued(self, task_ids: set[str]) -> list[tuple[Task, Handler]]:
        """Take these tasks out of the local queue (their counts too)."""
        kept: list[tuple[int, int, Task, Handler]] = []
        dropped: list[tuple[int, int, Task, Handler]] = []
        for item in self._queued:
            (dropped if item[2].id in task_ids else kept).append(item)
        if dropped:
            heapq.heapify(kept)
            self._queued = kept
            for _, _, _, handler in dropped:
                self._per_key[handler.key] -= 1
        return [(task, handler) for _, _, task, handler in dropped]

    def _release_queued(self, error: str) -> None:
        """Give every prefetched task back (PENDING, the attempt not spent)."""
        queued, self._queued = self._queued, []
        now = utcnow()
        for _, _, task, handler in queued:
            self._per_key[handler.key] -= 1
            self._queue_finish(
                Finish(
                    lease=Lease(task_id=task.id, worker_id=self.worker_id, attempt=task.attempts),
                    kind=FinishKind.RELEASE,
                    outcome=AttemptOutcome.INTERRUPTED,
                    started_at=task.started_at or now,
                    finished_at=now,
                    error=error,
                ),
                None,
            )

    def _start(
        self, task: Task, handler: Handler | None = None, started_at: datetime | None = None
    ) -> None:
        """Run a claimed task; ``handler`` given: it comes from the local queue, where it
        was counted against its handler's concurrency already."""
        counted = handler is not None
        if handler is None:
            handler = self._host.registry.lookup(task.app_id, task.task_type)
        lease = Lease(task_id=task.id, worker_id=self.worker_id, attempt=task.attempts)
        now = started_at or task.started_at or utcnow()
        if handler is None:  # unregistered since the claim: give it back untouched
            self._queue_finish(
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
        execution = _Execution(
            task=task,
            handler=handler,
            key=key,
            lease=lease,
            ctx=Context(
                task,
                spawner=self._host.spawn_child,
                max_data_bytes=self._host.storage.capabilities.max_value_bytes,
            ),
            started_at=now,
            high=task.priority >= _HIGH_PRIORITY,
        )
        self._running[task.id] = execution
        if not execution.high:
            self._running_normal += 1
        if not counted:
            self._per_key[key] = self._per_key.get(key, 0) + 1
        future = execution.future = asyncio.create_task(self._execute(execution))
        if handler.is_async:
            # Bound to the future, not the execution: no reference cycle outlives the
            # attempt, so a finished execution is freed at once instead of by the GC.
            execution.ctx._on_cancel = functools.partial(_cancel_soon, future)

    def _free_slot(self, execution: _Execution) -> None:
        if self._running.pop(execution.task.id, None) is None:
            return
        if not execution.high:
            self._running_normal -= 1
        self._per_key[execution.key] -= 1
        if self._queued:
            self._start_queued()
        if self._wake is not None:
            self._wake.set()

    # -- running one attempt ------------------------------------------------------------

    async def _call_handler(self, execution: _Execution) -> Any:
        handler, ctx, params = execution.handler, execution.ctx, execution.task.params
        if handler.is_async:
            coroutine = handler.func(ctx, params)
            assert asyncio.iscoroutine(coroutine) or isinstance(coroutine, Awaitable)
            if handler.timeout is None:
                return await coroutine
            async with asyncio.timeout(handler.timeout):
                return await coroutine
        loop = asyncio.get_running_loop()
        # Copied here, on the loop: the thread sees the context variables set around
        # the call (by a plugin's handler context, say); a new thread has none.
        call = functools.partial(contextvars.copy_context().run, handler.func, ctx, params)
        future = _run_in_thread(loop, call)
        if handler.timeout is None:
            return await future
        try:
            return await within(future, handler.timeout)
        except TimeoutError:
            ctx._expire()  # the thread cannot be killed: tell it to stop
            raise

    async def _execute(self, execution: _Execution) -> None:
        task, ctx = execution.task, execution.ctx
        kind, outcome = FinishKind.COMPLETE, AttemptOutcome.COMPLETED
        result_json: str | None = None
        error: str | None = None
        retry_delay: float | None = None
        failure: BaseException | None = None
        where: str | None = None  # the traceback excerpt of an unexpected exception
        try:
            plugins = self._host.plugins
            if plugins.intercepts_handlers:  # started hooks, handler contexts
                result = await plugins.run_handler(
                    task, ctx, self.worker_id, functools.partial(self._call_handler, execution)
                )
            else:
                result = await self._call_handler(execution)
            try:
                result_json = _NULL if result is None else dumps(result)
            except (TypeError, ValueError) as exc:
                kind, outcome = FinishKind.FAIL, AttemptOutcome.FAILED
                error = f"handler result is not JSON-serializable: {exc}"
            else:
                error = self._oversize_result(result_json)
                if error is not None:
                    kind, outcome, result_json = FinishKind.FAIL, AttemptOutcome.FAILED, None
        except Detached as exc:
            await self._hand_over(execution, exc)
            return
        except Retry as exc:
            kind, outcome, error, retry_delay = (
                FinishKind.RETRY,
                AttemptOutcome.FAILED,
                str(exc),
                exc.delay,
            )
        except Fail as exc:
            kind, outcome, error = FinishKind.FAIL, AttemptOutcome.FAILED, str(exc)
        except (Cancelled, asyncio.CancelledError) as exc:
            reason = ctx.cancel_reason
            current = asyncio.current_task()
            external = current is not None and current.cancelling() > 0
            if reason is None and isinstance(exc, asyncio.CancelledError):
                if external:  # the loop itself is going down: not the task's outcome
                    self._free_slot(execution)
                    raise
                reason = CancelReason.USER  # the handler raised CancelledError itself
            elif reason is None:
                reason = CancelReason.USER
            if external and current is not None:
                current.uncancel()
            if reason.terminal:
                kind, outcome = FinishKind.CANCEL, AttemptOutcome.CANCELLED
            else:
                kind, outcome = FinishKind.RELEASE, AttemptOutcome.INTERRUPTED
            error = f"cancelled ({reason.value})"
        except TimeoutError as exc:
            timeout = execution.handler.timeout
            kind, outcome = FinishKind.RETRY, AttemptOutcome.TIMED_OUT
            error = f"timed out after {timeout} s" if timeout else f"TimeoutError: {exc}"
        except Exception as exc:
            kind, outcome = FinishKind.RETRY, AttemptOutcome.FAILED
            error = f"{type(exc).__name__}: {exc}"
            failure = exc
            if not isinstance(exc, TaskmillError):  # taskmill's own frames say nothing
                where = tracebacks.excerpt(exc)
        interrupted = ctx.cancel_reason
        if interrupted is not None and not interrupted.terminal:
            # A handler that turned SHUTDOWN/SUSPENDED into another error is still
            # interrupted: it goes back without spending the attempt.
            kind = finish_kind(kind, stop_requested=True)
            outcome = FINISHES[kind].outcome or outcome
        if kind is FinishKind.RETRY:
            kind = attempt_kind(kind, attempts=task.attempts, max_retries=task.max_retries)
            if kind is FinishKind.FAIL:
                error = f"{error} (gave up after {task.attempts} attempts)"
            elif retry_delay is None:
                retry_delay = self.retry_policy.delay(task.attempts)
        if outcome in _FAILED_OUTCOMES:
            _log_failed_attempt(task, outcome, kind, error, retry_delay, failure)
        progress, data = ctx._final_state()
        finish = Finish(
            lease=execution.lease,
            kind=kind,
            outcome=outcome,
            started_at=execution.started_at,
            finished_at=utcnow(),
            result_json=result_json,
            error=error if where is None else f"{error}\n{where}",
            retry_in=retry_delay or 0.0,
            cancel_reason=ctx.cancel_reason if kind is FinishKind.CANCEL else None,
            data=data,
            progress=progress,
        )
        if not execution.abandoned:
            self._queue_finish(finish, task)
        self._free_slot(execution)

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
        ceiling = self._host.storage.capabilities.max_value_bytes
        if ceiling is None or len(result_json) * 4 <= ceiling:
            return None
        size = len(result_json.encode("utf-8", "surrogatepass"))
        if size <= ceiling:
            return None
        return (
            f"handler result is {size} bytes as JSON, over the {ceiling} bytes"
            f" {type(self._host.storage).__name__} keeps in one value; store large outputs"
            " elsewhere and return a reference"
        )

    async def _hand_over(self, execution: _Execution, detached: Detached) -> None:
        """The handler gave its attempt to another owner: free the slot at once, and
        from now on write nothing for the attempt (no outcome, no progress, no lease
        renewal), so the task stays RUNNING under its lease until the new owner
        reports, or the lease expires and any worker rescues it."""
        self._free_slot(execution)
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
            if self._host.plugins.observes_detaches:
                await self._host.plugins.attempt_detached(task, self.worker_id)
        except Exception:
            log.exception("detached notification for task %s failed", task.id)

    # -- writing outcomes ---------------------------------------------------------------

    def _queue_finish(self, finish: Finish, claimed: Task | None) -> None:
        self._finishes.append((finish, claimed))
        if self._flushed is not None:
            self._flushed.clear()
        if self._finish_ready is not None:
            self._finish_ready.set()

    async def _flush_loop(self) -> None:
        assert self._finish_ready is not None
        while True:
            await self._finish_ready.wait()
            if self.finish_window and not self._stopping:
                # Gather more outcomes into this write. A stop does not wait for it:
                # its flush writes directly while this loop sleeps.
                await asyncio.sleep(self.finish_window)
            self._finish_ready.clear()
            await self._flush_pending()

    async def _flush_pending(self) -> None:
        assert self._flushed is not None
        delay = 0.05
        while self._finishes:
            batch = self._finishes[:MAX_FINISH_BATCH]
            del self._finishes[:MAX_FINISH_BATCH]
            self._in_flight = batch
            self._flushing = True
            began = time.monotonic()
            finishes = [f for f, _ in batch]
            # The snapshots are for the plugins observing finishes; without any, a
            # store need not build them.
            results: list[Task | None] | None = None
            try:
                if self._host.plugins.observes_finishes:
                    results = await self._host.storage.finish_batch(finishes)
                    applied = [stored is not None for stored in results]
                else:
                    applied = await self._host.storage.finish_batch_applied(finishes)
            except Exception:
                self._in_flight = []
                self._flushing = False
                if self._flush_deadline is not None and time.monotonic() > self._flush_deadline:
                    log.exception(
                        "giving up on writing %d outcomes at shutdown; their tasks stay "
                        "RUNNING until their leases expire, then run again",
                        len(batch),
                    )
                    break
                log_retried_failure(
                    log, "writing %d outcomes failed; retrying in %.2f s", len(batch), delay
                )
                self._finishes[:0] = batch
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
                continue
            self._in_flight = []
            self._note_write_time(time.monotonic() - began, len(batch))
            self.processed += len(batch)
            for index, ((finish, claimed), written) in enumerate(zip(batch, applied, strict=True)):
                if not written:
                    log.info(
                        "task %s: lease lost before its outcome was written; the "
                        "store kept the other writer's state",
                        finish.lease.task_id,
                    )
                if results is None:
                    continue
                try:
                    await self._notify_finished(finish, results[index], claimed)
                except Exception:
                    log.exception(
                        "after-finish notification for task %s failed", finish.lease.task_id
                    )
            # Only now: a shutdown waiting for the flush also waits for the
            # notifications, so that no plugin hears of a worker stop before its tasks.
            self._flushing = False
            if self.prefetch and self._wake is not None:
                # The written batch freed its slots: with a local queue, claim into them
                # now, while the next batch is written, not after the whole backlog (a
                # backlog of several writes only builds up with a local queue, and its
                # claims wait for a quarter of the capacity, so they stay large).
                # Without one, the claim waits for the backlog: claiming each freed slot
                # at once made more, smaller claims, which CPU-bound sync handlers paid
                # for in GIL hand-overs (docs/benchmarks.md, "Issue 15: flow between
                # claims and finishes").
                self._wake.set()
        self._flushed.set()
        if self._wake is not None:
            self._wake.set()

    async def _notify_finished(
        self, finish: Finish, stored: Task | None, claimed: Task | None
    ) -> None:
        """The lifecycle hooks of one written outcome (``stored`` None: the lease was
        lost, and the attempt ended the way the other writer ended it)."""
        plugins = self._host.plugins
        # No claimed task: nothing ran (the handler vanished before the task started).
        if claimed is None or not plugins.observes_finishes:
            return
        if stored is None:
            current = await self._host.storage.get(finish.lease.task_id)
            await plugins.attempt_taken(claimed, current, finish.started_at, finish.finished_at)
        else:
            await plugins.attempt_finished(finish, stored)

    def _note_write_time(self, seconds: float, count: int) -> None:
        """Say so in the log when the store is slow to take outcomes (claims wait)."""
        now = time.monotonic()
        if seconds >= SLOW_WRITE_SECONDS:
            if self._slow_store_since is None:
                self._slow_store_since = now - seconds
                log.warning(
                    "the store took %.1f s to write %d outcomes; claiming waits for the "
                    "writes (%d of %d slots hold unwritten outcomes)",
                    seconds,
                    count,
                    len(self._finishes) + count,
                    self.concurrency,
                )
        elif self._slow_store_since is not None and not self._finishes:
            log.warning(
                "the store caught up after %.1f s; claiming at full speed again",
                now - self._slow_store_since,
            )
            self._slow_store_since = None

    async def _flush_all(self) -> None:
        """Write every queued outcome (waiting for an in-flight write too)."""
        assert self._flushed is not None
        if self._finishes and not self._flushing:
            await self._flush_pending()
        while self._finishes or self._flushing:
            if self._finish_ready is not None:
                self._finish_ready.set()
            await self._flushed.wait()
            if self._finishes and not self._flushing:
                await self._flush_pending()

    # -- background duties ----------------------------------------------------------

    def _held_leases(self) -> list[Lease]:
        leases = [e.lease for e in self._running.values() if not e.abandoned]
        leases.extend(
            Lease(task_id=task.id, worker_id=self.worker_id, attempt=task.attempts)
            for _, _, task, _ in self._queued
        )
        leases.extend(f.lease for f, _ in self._finishes)
        leases.extend(f.lease for f, _ in self._in_flight)
        return leases

    async def _renew_leases_loop(self) -> None:
        interval = self.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            leases = self._held_leases()
            if not leases:
                continue
            try:
                held = await self._host.storage.renew_leases(leases, self.lease_seconds)
            except Exception:
                log_retried_failure(log, "renewing %d leases failed", len(leases))
                continue
            await self._apply_lease_state(leases, held)

    async def _open_listener(self) -> ChangeListener | None:
        try:
            return await self._host.storage.change_listener()
        except Exception:
            log.exception("the store's change notifications are unavailable; polling only")
            return None

    async def _listen_loop(self, listener: ChangeListener) -> None:
        """Wake at once on work or control changes committed by any process (the
        store's push channel); polling stays as the fallback."""
        kinds = frozenset({StoreChange.WORK, StoreChange.CONTROL})
        pause = _LISTEN_RETRY
        while True:
            try:
                notified = await listener.wait(kinds, self.poll_interval)
            except Exception:
                # Back off from a short pause, not from poll_interval: a worker set to
                # rely on notifications (a long poll_interval) must not go deaf for a
                # whole poll_interval after one failed wait.
                log_retried_failure(
                    log, "waiting for change notifications failed; again in %.2f s", pause
                )
                await asyncio.sleep(pause)
                pause = min(self.poll_interval, pause * 2)
                if self._wake is not None:
                    self._wake.set()  # a notification may have been missed: look once
                continue
            pause = _LISTEN_RETRY
            if notified:
                # Hand off instead of checking here: this loop must be back listening
                # before the next notification arrives.
                if self._wake is not None:
                    self._wake.set()
                self._check_leases_now.set()

    async def _watch_leases_loop(self) -> None:
        """Learn of cancellations and suspensions of running tasks within
        ``cancel_check_interval``, whichever process asked for them."""
        while True:
            await wait_event(self._check_leases_now, self.cancel_check_interval)
            self._check_leases_now.clear()
            leases = [e.lease for e in self._running.values() if not e.abandoned]
            if not leases:
                continue
            try:
                held = await self._host.storage.watch_leases(leases)
            except Exception:
                log_retried_failure(log, "checking %d leases failed", len(leases))
                continue
            await self._apply_lease_state(leases, held)

    async def _apply_lease_state(
        self, asked: list[Lease], held: dict[str, CancelReason | None]
    ) -> None:
        # Only the leases asked about: tasks claimed meanwhile are not in ``held``.
        if self._queued:
            lost = {lease.task_id for lease in asked if lease.task_id not in held}
            for task, _ in self._drop_queued(lost):
                log.warning("task %s: lease lost while prefetched; dropping it", task.id)
        for lease in asked:
            execution = self._running.get(lease.task_id)
            if execution is None or execution.lease != lease or execution.abandoned:
                continue
            if lease.task_id not in held:
                await self._lease_lost(execution)
            else:
                reason = held[lease.task_id]
                if reason is not None:
                    execution.ctx._interrupt(reason)

    async def _lease_lost(self, execution: _Execution) -> None:
        """Another writer owns the task now (it was cancelled, or rescued after this
        worker stalled): stop the handler and never write its outcome."""
        execution.abandoned = True
        current = await self._host.storage.get(execution.task.id)
        reason = (current.cancel_reason if current is not None else None) or (CancelReason.USER)
        if current is not None and current.status is TaskStatus.CANCELLED:
            log.info(
                "task %s was cancelled (%s); stopping its handler", execution.task.id, reason.value
            )
        else:
            log.warning(
                "task %s: lease lost (%s); stopping its handler",
                execution.task.id,
                current.status.value if current else "deleted",
            )
        execution.ctx._interrupt(reason)
        if self._host.plugins.observes_finishes:
            await self._host.plugins.attempt_taken(
                execution.task, current, execution.started_at, utcnow()
            )

    async def _save_progress_loop(self) -> None:
        while True:
            await asyncio.sleep(self.progress_interval)
            updates = []
            for execution in self._running.values():
                progress, data = execution.ctx._take_changes()
                if progress is not None or data is not None:
                    updates.append(
                        ProgressUpdate(lease=execution.lease, progress=progress, data=data)
                    )
            if updates:
                try:
                    await self._host.storage.save_progress(updates)
                except Exception:
                    log_retried_failure(log, "saving progress of %d tasks failed", len(updates))

    async def _housekeeping_once(self) -> None:
        """Rescue expired leases, prune the event log, and run the periodic cleanup."""
        await self._rescue_once()
        storage = self._host.storage
        await storage.prune_events(self.event_retention)
        now = time.monotonic()
        if self.cleanup_older_than is not None and now - self._last_cleanup >= (
            self.cleanup_interval
        ):
            self._last_cleanup = now
            deleted = await storage.cleanup(self.cleanup_older_than)
            if deleted:
                log.info("cleanup deleted %d finished tasks", deleted)

    async def _rescue_once(self) -> int:
        self._last_rescue = time.monotonic()
        # Renew first: after a stall longer than a lease, this worker's own leases have
        # expired too, and it must not rescue a task whose outcome it is still writing.
        leases = self._held_leases()
        if leases:
            held = await self._host.storage.renew_leases(leases, self.lease_seconds)
            await self._apply_lease_state(leases, held)
        rescued = await self._host.storage.rescue_expired()
        if rescued:
            log.warning(
                "rescued %d tasks whose worker lost its lease: %s",
                len(rescued),
                ", ".join(t.id for t in rescued[:10]),
            )
            if self._wake is not None:
                self._wake.set()
            if self._host.plugins.observes_finishes:
                await self._host.plugins.tasks_rescued(rescued)
        return len(rescued)

    async def _rescue_loop(self) -> None:
        while True:
            try:
                await self._housekeeping_once()
            except Exception:
                log_retried_failure(log, "housekeeping (rescue, event pruning, cleanup) failed")
            await asyncio.sleep(self.rescue_interval)

    # -- shutdown -----------------------------------------------------------------------

    async def _shutdown(self) -> None:
        started = time.monotonic()
        if self._queued:
            log.info("stopping: giving back %d prefetched tasks", len(self._queued))
            self._release_queued("not started (shutdown)")
        if self._running:
            log.info(
                "stopping: waiting up to %.1f s for %d running tasks",
                self._current_grace(),
                len(self._running),
            )
        while self._running:
            # Re-read the grace each round: a second signal shortens it to zero.
            remaining = started + self._current_grace() - time.monotonic()
            if remaining <= 0:
                break
            futures = [e.future for e in self._running.values() if e.future is not None]
            await asyncio.wait(futures, timeout=min(remaining, 0.1))
        leftover = list(self._running.values())
        for execution in leftover:
            execution.ctx._interrupt(CancelReason.SHUTDOWN)
        if leftover:
            log.warning(
                "stopping: interrupting %d tasks still running; they go back to "
                "pending without spending an attempt",
                len(leftover),
            )
            waiting = [e.future for e in leftover if e.future is not None and e.handler.is_async]
            if waiting:
                # A forced stop has about a second in all: give handlers less of it.
                await asyncio.wait(waiting, timeout=0.2 if self.forced else 1.0)
            for execution in list(self._running.values()):
                # A thread cannot be killed: give its task back and ignore its outcome.
                execution.abandoned = True
                self._queue_finish(
                    Finish(
                        lease=execution.lease,
                        kind=FinishKind.RELEASE,
                        outcome=AttemptOutcome.INTERRUPTED,
                        started_at=execution.started_at,
                        finished_at=utcnow(),
                        error="cancelled (shutdown)",
                    ),
                    execution.task,
                )
                self._free_slot(execution)
        # Outcomes that cannot be written (database down) are retried for a while, then
        # left to lease expiry: stop() must return.
        flush_for = min(30.0, max(5.0, self._current_grace()))
        self._flush_deadline = time.monotonic() + flush_for
        try:
            # Bounded even when a write hangs (a lock held elsewhere), not only when it
            # fails: the deadline above covers failures, this covers silence.
            await within(self._flush_all(), flush_for + 1.0)
        except TimeoutError:
            log.error(
                "stopping: the store did not answer within %.0f s; %d outcomes are not "
                "written and their tasks run again once their leases expire",
                flush_for + 1.0,
                len(self._finishes) + len(self._in_flight),
            )
        finally:
            await cancel_and_wait(self._background)
            self._background = []
            if self._listener is not None:
                listener, self._listener = self._listener, None
                try:
                    await within(listener.close(), 5.0)
                except Exception:
                    log.exception("closing the store's change listener failed")
            self._release_resources()
            if self._host.plugins.observes_workers:
                await self._host.plugins.worker_stopped(self)

    def _current_grace(self) -> float:
        return self.shutdown_grace if self._grace is None else self._grace

    def _take_signals(self) -> Callable[[], None]:
        """Have SIGTERM and SIGINT stop this worker, unless the host process manages them
        itself (see :class:`_SignalRouter`); returns what undoes it."""
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return _nothing
        return _SignalRouter.join(asyncio.get_running_loop(), self)

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self.stop_signal is None:
            self.stop_signal = sig
        if self._signals == 1:
            log.warning(
                "%s received: stopping gracefully (running tasks get %.1f s; a second "
                "signal stops at once)",
                sig.name,
                self._current_grace(),
            )
        else:
            log.warning("%s received again: stopping now", sig.name)
            self.forced = True
            self._grace = 0.0
            if self._force_exit is None:
                # Whatever the worker is doing (a store that does not answer, a stuck
                # handler), the process ends about a second after the second signal.
                # What it held is rescued once its leases expire.
                self._force_exit = threading.Timer(
                    _FORCED_EXIT_AFTER, _exit_now, (self.worker_id, sig)
                )
                self._force_exit.daemon = True
                self._force_exit.start()
        self._stopping = True
        if self._wake is not None:
            self._wake.set()


_FORCED_EXIT_AFTER = 1.0


def _signal_is_free(handler: object) -> bool:
    """Whether a signal whose Python-level handler is ``handler`` belongs to nobody."""
    if handler in (signal.SIG_DFL, signal.default_int_handler):
        return True
    # asyncio.run()'s SIGINT handler (a bound Runner.on_sigint in a partial) is the
    # default Ctrl-C behaviour of a plain asyncio program, not a host's choice.
    owner = getattr(getattr(handler, "func", None), "__self__", None)
    return isinstance(owner, asyncio.Runner)


def _nothing() -> None:
    return None


class _SignalRouter:
    """SIGTERM and SIGINT for every worker running on one event loop.

    The first worker to start on a loop takes each signal that is free (its handler is
    the default, or ``asyncio.run()``'s own Ctrl-C handler); a host that installed its
    own handler (uvicorn, Django, ``loop.add_signal_handler``) keeps it and stops the
    workers from its own shutdown path. A signal then reaches every worker of the loop,
    so one Ctrl-C stops two workers run side by side. When the last worker leaves, the
    handlers found at the start are put back.
    """

    _by_loop: ClassVar[dict[asyncio.AbstractEventLoop, _SignalRouter]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.workers: list[Worker] = []
        self.previous: dict[signal.Signals, object] = {}

    @classmethod
    def join(cls, loop: asyncio.AbstractEventLoop, worker: Worker) -> Callable[[], None]:
        router = cls._by_loop.get(loop)
        if router is None:
            router = cls._by_loop[loop] = cls(loop)
            router._install()
        router.workers.append(worker)
        return functools.partial(router._leave, worker)

    def _install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            if not _signal_is_free(previous):
                log.debug("%s is handled by the host process; not taking it", sig.name)
                continue
            try:
                self.loop.add_signal_handler(sig, self._deliver, sig)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
                continue
            self.previous[sig] = previous

    def _deliver(self, sig: signal.Signals) -> None:
        for worker in list(self.workers):
            worker._on_signal(sig)

    def _leave(self, worker: Worker) -> None:
        with contextlib.suppress(ValueError):
            self.workers.remove(worker)
        if self.workers:
            return
        del self._by_loop[self.loop]
        for sig, previous in self.previous.items():
            self.loop.remove_signal_handler(sig)
            with contextlib.suppress(TypeError, ValueError, OSError):
                signal.signal(sig, previous)  # type: ignore[arg-type]


def _exit_now(worker_id: str, sig: signal.Signals) -> None:
    """End the process at once (from a timer thread): the second signal's promise."""
    log.error(
        "worker %s did not stop within %.1f s of a second %s: exiting now; the tasks it "
        "held run again once their leases expire",
        worker_id,
        _FORCED_EXIT_AFTER,
        sig.name,
    )
    logging.shutdown()
    os._exit(128 + int(sig))
