"""The worker: claims tasks in batches, runs their handlers, writes outcomes in batches.

One worker is one asyncio loop in one process. This module holds its claim loop and its
start and stop; each concern it drives has a module of its own:

- :mod:`taskmill.claiming`: how much to claim and for which handlers;
- :mod:`taskmill.slots`: the running attempts and the local queue of prefetched tasks;
- :mod:`taskmill.execution`: running one attempt to its ``Finish``;
- :mod:`taskmill.batch_calls` and :mod:`taskmill.batching`: batch handlers' calls;
- :mod:`taskmill.finish_writer`: writing finished attempts (group commit: whatever
  finished while the previous write was in flight goes in the next one);
- :mod:`taskmill.leases`: renewing leases, learning of lost ones, rescuing other
  workers' expired leases;
- :mod:`taskmill.signals`: SIGTERM and SIGINT.

A handler that raises :class:`~taskmill.Detached` hands its attempt over to another owner
(an HTTP receiver that answered 202): the worker frees the slot and forgets the attempt;
the owner reports its progress and outcome through the store, fenced by the lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
import typing
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic

from taskmill.backoff import RetryPolicy
from taskmill.claiming import AUTO_PREFETCH_MAX, Claimer
from taskmill.errors import ConfigurationError, log_retried_failure
from taskmill.finish_writer import MAX_FINISH_BATCH, SLOW_WRITE_SECONDS, FinishWriter
from taskmill.hosts import ServingHost
from taskmill.leases import LeaseKeeper
from taskmill.model import AttemptOutcome, CancelReason
from taskmill.periodic import Schedule, Scheduler
from taskmill.registry import Handler, Retention
from taskmill.signals import SignalRouter, exit_after_second_signal
from taskmill.slots import Slots
from taskmill.storage import ChangeListener, Finish, FinishKind, StoreChange, utcnow
from taskmill.waiting import cancel_and_wait, wait_event, within
from taskmill.worker_options import WorkerOptions
from taskmill.workers import PRUNE_AFTER_LEASES, handlers_of, new_record, record_json

if TYPE_CHECKING:
    # A default (PEP 696) lets ``Worker`` alone, as plugins annotate hook arguments,
    # mean ``Worker[Any]``; Python 3.11's TypeVar takes no default at run time.
    from typing_extensions import TypeVar

    HostT = TypeVar("HostT", bound=ServingHost[Schedule], default=Any)
else:
    HostT = typing.TypeVar("HostT", bound=ServingHost[Schedule])

__all__ = ["MAX_FINISH_BATCH", "SLOW_WRITE_SECONDS", "Worker", "default_worker_id"]

log = logging.getLogger("taskmill.worker")

# The first pause before waiting on the change listener again after a failed wait (and
# before claiming again after a failed claim).
_LISTEN_RETRY = 0.05
# The longest pause between claims while claiming fails (a store outage).
_CLAIM_RETRY_CAP = 5.0


def _nothing() -> None:
    return None


def default_worker_id() -> str:
    """``host:pid:random`` — unique per worker, readable in ``taskmill ls``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker(Generic[HostT]):
    """Runs the handlers of a :class:`~taskmill.Taskmill` against its storage.

    Build one with ``tm.worker(...)`` (its keyword arguments are the fields of
    :class:`~taskmill.WorkerOptions`). Use :meth:`run` (until :meth:`stop` or
    SIGTERM/SIGINT), :meth:`run_until_idle`, or :meth:`tick` from a loop you own. The
    worker uses its ``Taskmill`` only through :class:`~taskmill.WorkerHost` (and fires
    its schedules through a :class:`~taskmill.periodic.Scheduler`): see
    :mod:`taskmill.hosts`.

    ``Worker[H]`` serves a host of type ``H``: ``tm.worker()`` returns a
    ``Worker[Taskmill]``, whose :attr:`taskmill` is typed ``Taskmill``. ``Worker`` alone
    is ``Worker[Any]``.
    """

    def __init__(self, taskmill: HostT, options: WorkerOptions | None = None) -> None:
        options = options or WorkerOptions()
        self._host: HostT = taskmill
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
        self._registered_at: datetime | None = None
        """When this worker first registered in the store (None: not registered)."""
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
        """Tasks claimed ahead of the free slots into the local queue (0: none; None:
        auto, sized from the worker's pace, at most ``AUTO_PREFETCH_MAX``)."""
        self.finish_window = options.finish_window

        host = self._host
        self._writer = FinishWriter(
            storage=host.storage,
            plugins=host.plugins,
            concurrency=concurrency,
            prefetch=AUTO_PREFETCH_MAX if self.prefetch is None else self.prefetch,
            finish_window=self.finish_window,
            wake=self.notify,
            stopping=self._is_stopping,
        )
        self._slots = Slots(
            worker_id=self.worker_id,
            concurrency=concurrency,
            reserved_high_priority_slots=reserved_high_priority_slots,
            retry_policy=self.retry_policy,
            retention=Retention(options.delete_completed, options.delete_failed),
            storage=host.storage,
            registry=host.registry,
            plugins=host.plugins,
            spawner=host.spawn_child,
            finished=self._writer.queue,
            wake=self.notify,
            stopping=self._is_stopping,
        )
        self._claimer = Claimer(
            worker_id=self.worker_id,
            concurrency=concurrency,
            reserved_high_priority_slots=reserved_high_priority_slots,
            prefetch=self.prefetch,
            lease_seconds=self.lease_seconds,
            task_types=self.task_types,
            app_ids=self.app_ids,
            storage=host.storage,
            registry=host.registry,
            slots=self._slots,
            writer=self._writer,
            stopping=self._is_stopping,
        )
        self._leases = LeaseKeeper(
            lease_seconds=self.lease_seconds,
            cancel_check_interval=self.cancel_check_interval,
            storage=host.storage,
            plugins=host.plugins,
            slots=self._slots,
            writer=self._writer,
            wake=self.notify,
        )
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._grace: float | None = None
        self._stopped: asyncio.Event | None = None
        self._active = False
        self._background: list[asyncio.Task[None]] = []
        self._listener: ChangeListener | None = None
        self._signals = 0
        self._force_exit: threading.Timer | None = None
        self.stop_signal: signal.Signals | None = None
        """The signal that stopped the worker (None: stopped by :meth:`stop` or idle)."""
        self.forced = False
        """True when a second signal cut the grace period short."""

    # -- public API -------------------------------------------------------------------

    @property
    def taskmill(self) -> HostT:
        """The :class:`~taskmill.Taskmill` whose handlers and storage this worker uses."""
        return self._host

    @property
    def running(self) -> int:
        """Handlers running now."""
        return len(self._slots.running)

    @property
    def held(self) -> int:
        """Tasks this worker holds in the store: running handlers plus outcomes not yet
        written, plus prefetched tasks. Never more than ``concurrency + prefetch`` (auto:
        ``concurrency + AUTO_PREFETCH_MAX``): claims
        wait for the writes. An attempt
        handed over to another owner (:class:`~taskmill.Detached`) is no longer held."""
        return self._claimer.held

    @property
    def queued(self) -> int:
        """Prefetched tasks waiting in the local queue for a slot (see ``prefetch``)."""
        return len(self._slots.queued)

    @property
    def processed(self) -> int:
        """Attempts this worker finished (any outcome)."""
        return self._writer.written

    @property
    def detached(self) -> int:
        """Attempts this worker handed over to another owner (the handler raised
        :class:`~taskmill.Detached`); not counted in :attr:`processed`."""
        return self._slots.runner.detached

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
            asyncio.create_task(self._leases.renew()),
            asyncio.create_task(self._leases.watch()),
            asyncio.create_task(self._slots.save_progress(self.progress_interval)),
            asyncio.create_task(self._writer.run()),
        ]
        try:
            if time.monotonic() - self._leases.last_rescue >= self.rescue_interval:
                await self._leases.rescue_once()
            claimed, _ = await self._claimer.fill_slots(prefetch=False)
            futures = [e.future for e in list(self._slots.running.values()) if e.future]
            if futures:
                await asyncio.gather(*futures, return_exceptions=True)
            await self._writer.flush_all()
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

    def served_handlers(self) -> list[Handler]:
        """The handlers this worker claims for: the registry's, narrowed by
        ``task_types`` and ``app_ids``."""
        return self._claimer.served_handlers()

    # -- serving ----------------------------------------------------------------------

    def _is_stopping(self) -> bool:
        return self._stopping

    def _prepare(self) -> None:
        self._wake = asyncio.Event()
        self._writer.prepare()
        self._stopped = asyncio.Event()

    def _release_resources(self) -> None:
        self._writer.deadline = None

    async def _serve(self, *, until_idle: bool) -> None:
        if self._active:
            raise RuntimeError("this worker is already running")
        scheduler = None
        if self.run_schedules and not until_idle:
            scheduler = Scheduler(self._host, interval=self.poll_interval)
            scheduler.check_against_cleanup(self.cleanup_older_than)
        self._check_limits_supported()
        self._check_deletes_supported()
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
                asyncio.create_task(self._writer.run(), name="taskmill-flush"),
                asyncio.create_task(self._leases.renew(), name="taskmill-leases"),
                asyncio.create_task(self._leases.watch(), name="taskmill-watch"),
                asyncio.create_task(
                    self._slots.save_progress(self.progress_interval), name="taskmill-progress"
                ),
                asyncio.create_task(self._housekeeping_loop(), name="taskmill-rescue"),
            ]
            if scheduler is not None and scheduler.has_schedules():
                self.scheduler = scheduler
                self._background.append(
                    asyncio.create_task(
                        scheduler.run(on_enqueued=[lambda _: self.notify()]),
                        name="taskmill-scheduler",
                    )
                )
            self._listener = await self._open_listener()
            if self._listener is not None:
                self._background.extend(
                    asyncio.create_task(
                        self._listen_loop(self._listener, kind),
                        name=f"taskmill-listen-{kind.value}",
                    )
                    for kind in (StoreChange.WORK, StoreChange.CONTROL)
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

    def _check_deletes_supported(self) -> None:
        """Refuse delete-on-finish options on a store that cannot delete in a finish
        (they would silently keep every task)."""
        storage = self._host.storage
        if storage.capabilities.delete_on_finish:
            return
        retention = self._slots.runner.retention
        deleting = sorted(
            h.task_type
            for h in self._host.registry
            if h.deletes(FinishKind.COMPLETE, retention) or h.deletes(FinishKind.FAIL, retention)
        )
        if deleting:
            raise ConfigurationError(
                f"tasks of {', '.join(map(repr, deleting))} are to be deleted when they"
                f" finish (delete_completed or delete_failed), but {type(storage).__name__}"
                " cannot delete in a finish (docs/backends.md lists each backend's gaps);"
                " keep them (and run cleanup) or use another store"
            )

    async def _claim_loop(self, *, until_idle: bool) -> None:
        assert self._wake is not None
        claimer, slots = self._claimer, self._slots
        poll = self.min_poll_interval
        retry = _LISTEN_RETRY
        while not self._stopping:
            self._wake.clear()
            failed = False
            try:
                claimed, drained = await claimer.fill_slots(coalesce=True)
            except Exception:
                log_retried_failure(log, "claiming failed; retrying in %.2f s", retry)
                claimed, drained, failed = 0, True, True
            if claimed:
                poll = self.min_poll_interval
            has_free = claimer.held < self.concurrency + claimer.prefetch
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
                and not slots.running
                and not slots.queued
                and (not self._writer.pending)
            ):
                try:
                    await self._writer.flush_all()
                    if await self._leases.rescue_once():
                        continue  # expired leases of dead workers are work, not idleness
                    due_in = await claimer.seconds_until_due()
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

    # -- background duties ----------------------------------------------------------

    async def _open_listener(self) -> ChangeListener | None:
        try:
            return await self._host.storage.change_listener()
        except Exception:
            log.exception("the store's change notifications are unavailable; polling only")
            return None

    async def _listen_loop(self, listener: ChangeListener, kind: StoreChange) -> None:
        """Wake at once on changes of ``kind`` committed by any process (the store's
        push channel); polling stays as the fallback. One loop per kind: new work wakes
        the claim loop only, and only a control change (a cancel or a suspension of
        running tasks) makes the leases check ask the store about the running tasks;
        under a steady stream of enqueues that check would otherwise run once per
        notification."""
        kinds = frozenset({kind})
        control = kind is StoreChange.CONTROL
        pause = _LISTEN_RETRY
        while True:
            try:
                notified = await listener.wait(kinds, self.poll_interval)
            except Exception:
                # Back off from a short pause, not from poll_interval: a worker set to
                # rely on notifications (a long poll_interval) must not go deaf for a
                # whole poll_interval after one failed wait. The work loop reports it:
                # both loops wait on the same listener.
                if not control:
                    log_retried_failure(
                        log, "waiting for change notifications failed; again in %.2f s", pause
                    )
                await asyncio.sleep(pause)
                pause = min(self.poll_interval, pause * 2)
                if self._wake is not None:
                    self._wake.set()  # a notification may have been missed: look once
                if control:
                    self._leases.check_soon()
                continue
            pause = _LISTEN_RETRY
            if notified:
                # Hand off instead of checking here: this loop must be back listening
                # before the next notification arrives.
                if self._wake is not None:
                    self._wake.set()
                if control:
                    self._leases.check_soon()

    async def _housekeeping_once(self) -> None:
        """Rescue expired leases, prune the event log, run the periodic cleanup, and
        heartbeat in the worker registry."""
        await self._leases.rescue_once()
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
        await self._heartbeat()

    async def _heartbeat(self) -> None:
        """Write this worker's registration (docs/workers.md), and prune those of
        workers dead for :data:`~taskmill.workers.PRUNE_AFTER_LEASES` leases."""
        storage = self._host.storage
        if not storage.capabilities.worker_registry:
            return
        slots = self._slots
        record = new_record(
            self.worker_id,
            started_at=self._registered_at or utcnow(),
            lease_seconds=self.lease_seconds,
            concurrency=self.concurrency,
            handlers=handlers_of(self._claimer.served_handlers()),
            running=list(slots.running),
            queued=len(slots.queued),
            processed=self.processed,
        )
        self._registered_at = record.started_at
        await storage.put_worker(self.worker_id, record_json(record))
        await storage.prune_workers(timedelta(seconds=PRUNE_AFTER_LEASES * self.lease_seconds))

    async def _unregister(self) -> None:
        """Remove this worker's registration as it stops (a failure only leaves it to
        be listed dead, then pruned)."""
        if self._registered_at is None:
            return
        self._registered_at = None
        try:
            await within(self._host.storage.remove_worker(self.worker_id), 5.0)
        except Exception:
            log.warning("stopping: removing this worker's registration failed", exc_info=True)

    async def _housekeeping_loop(self) -> None:
        while True:
            try:
                await self._housekeeping_once()
            except Exception:
                log_retried_failure(
                    log, "housekeeping (rescue, event pruning, cleanup, heartbeat) failed"
                )
            await asyncio.sleep(self.rescue_interval)

    # -- shutdown -----------------------------------------------------------------------

    async def _shutdown(self) -> None:
        started = time.monotonic()
        slots, writer = self._slots, self._writer
        if slots.queued:
            log.info("stopping: giving back %d prefetched tasks", len(slots.queued))
            slots.release_queued("not started (shutdown)")
        if slots.running:
            log.info(
                "stopping: waiting up to %.1f s for %d running tasks",
                self._current_grace(),
                len(slots.running),
            )
        while slots.running:
            # Re-read the grace each round: a second signal shortens it to zero.
            remaining = started + self._current_grace() - time.monotonic()
            if remaining <= 0:
                break
            futures = [e.future for e in slots.running.values() if e.future is not None]
            await asyncio.wait(futures, timeout=min(remaining, 0.1))
        leftover = list(slots.running.values())
        for execution in leftover:
            execution.control.interrupt(CancelReason.SHUTDOWN)
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
            for execution in list(slots.running.values()):
                # A thread cannot be killed: give its task back and ignore its outcome.
                execution.abandoned = True
                writer.queue(
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
                slots.free(execution)
        await slots.close_batches()  # batch calls whose members all left
        # Outcomes that cannot be written (database down) are retried for a while, then
        # left to lease expiry: stop() must return.
        flush_for = min(30.0, max(5.0, self._current_grace()))
        writer.deadline = time.monotonic() + flush_for
        try:
            # Bounded even when a write hangs (a lock held elsewhere), not only when it
            # fails: the deadline above covers failures, this covers silence.
            await within(writer.flush_all(), flush_for + 1.0)
        except TimeoutError:
            log.error(
                "stopping: the store did not answer within %.0f s; %d outcomes are not "
                "written and their tasks run again once their leases expire",
                flush_for + 1.0,
                writer.held,
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
            await self._unregister()
            if self._host.plugins.observes_workers:
                await self._host.plugins.worker_stopped(self)

    def _current_grace(self) -> float:
        return self.shutdown_grace if self._grace is None else self._grace

    # -- signals ------------------------------------------------------------------------

    def _take_signals(self) -> Callable[[], None]:
        """Have SIGTERM and SIGINT stop this worker, unless the host process manages them
        itself (see :class:`~taskmill.signals.SignalRouter`); returns what undoes it."""
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return _nothing
        return SignalRouter.join(asyncio.get_running_loop(), self._on_signal)

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
                self._force_exit = exit_after_second_signal(self.worker_id, sig)
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
